//! Compiles the Istio protos with a pure-Rust protobuf compiler (protox), so building needs no
//! system `protoc`.

fn main() -> anyhow::Result<()> {
    let files = [
        "istio/workload.proto",
        "istio/authorization.proto",
        "istio/ca.proto",
        "istio/zds.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["istio"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
