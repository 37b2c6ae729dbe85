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
    // BTreeMap for proto maps: deterministic encoding, so content-hash versions are stable
    // across processes (a reconnecting client is not resent unchanged resources).
    tonic_prost_build::configure()
        .btree_map(".")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
