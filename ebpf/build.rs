//! With the `bpf` feature: compiles every `bpf/*.c` into `$OUT_DIR/<name>.o` with
//! `clang -O2 -g -target bpf` (override the compiler with `CLANG`). Needs only clang and the
//! kernel uapi headers (linux-libc-dev), no libbpf. The capture contract's numbers come from
//! the mesh-capture crate, as `$OUT_DIR/capture_contract.h`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=CLANG");
    if std::env::var_os("CARGO_FEATURE_BPF").is_none() {
        return;
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    // The capture contract's numbers, from their one home.
    std::fs::write(
        out_dir.join("capture_contract.h"),
        mesh_capture::contract::c_header(),
    )
    .expect("write capture_contract.h");
    let mut sources: Vec<PathBuf> = std::fs::read_dir("bpf")
        .expect("read ebpf/bpf")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "c"))
        .collect();
    sources.sort();
    for source in sources {
        println!("cargo:rerun-if-changed={}", source.display());
        compile(&clang, &source, &out_dir);
    }
}

fn compile(clang: &str, source: &Path, out_dir: &Path) {
    let stem = source
        .file_stem()
        .and_then(|stem| stem.to_str())
        .expect("UTF-8 source name");
    let stem = stem.strip_suffix(".bpf").unwrap_or(stem);
    let object = out_dir.join(format!("{stem}.bpf.o"));
    let mut command = Command::new(clang);
    command.args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"]);
    // `-target bpf` does not search the multiarch directory that holds <asm/types.h>.
    if let Some(dir) = multiarch_include() {
        command.arg("-I").arg(dir);
    }
    command.arg("-I").arg(out_dir);
    command.arg("-c").arg(source).arg("-o").arg(&object);
    let status = command.status().unwrap_or_else(|error| {
        panic!(
            "cannot run `{clang}` ({error}): the `bpf` feature of mesh-ebpf compiles {} with \
             clang -target bpf; install it (apt-get install clang) or build without the feature \
             (cni-node: --no-default-features)",
            source.display()
        )
    });
    assert!(
        status.success(),
        "`{command:?}` failed ({status}); see the compiler output above"
    );
}

/// `/usr/include/<arch>-linux-gnu` of the host, when it exists.
fn multiarch_include() -> Option<PathBuf> {
    let host = std::env::var("HOST").ok()?;
    let arch = host.split('-').next()?;
    let dir = PathBuf::from(format!("/usr/include/{arch}-linux-gnu"));
    dir.is_dir().then_some(dir)
}
