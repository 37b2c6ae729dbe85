//! Link options of the `ztunnel` binary.
//!
//! `-z pack-relative-relocs` stores the PIE's ~11,000 relative relocations as DT_RELR (a few
//! KiB) instead of `.rela.dyn` (~270 KiB that the loader reads at start and that then stays
//! resident): about a quarter MiB less idle RSS per node. Needs binutils >= 2.38 and glibc >=
//! 2.36 (Debian 12); without a linker that knows it, the option is left out.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if linux && linker_knows_pack_relative_relocs() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the system linker (through `cc`) accepts the option.
fn linker_knows_pack_relative_relocs() -> bool {
    Command::new("ld")
        .arg("--help")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("pack-relative-relocs"))
}
