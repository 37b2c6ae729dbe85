//! Where the workspace's binaries are.

use std::path::PathBuf;

/// The path of binary `name` of this workspace build (`MESH_BIN_DIR` overrides the directory).
/// Panics with what to run when it is missing.
pub fn binary(name: &str) -> PathBuf {
    let dir = match std::env::var_os("MESH_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let exe = std::env::current_exe().expect("path of the test executable");
            let dir = exe.parent().expect("test executable has a directory");
            if dir.ends_with("deps") {
                dir.parent()
                    .expect("target profile directory")
                    .to_path_buf()
            } else {
                dir.to_path_buf()
            }
        }
    };
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{name} is not built at {}: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
}
