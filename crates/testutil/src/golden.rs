//! Golden files: a test compares its output with a file in the repository, and
//! `UPDATE_GOLDEN=1` rewrites the file instead (then review and commit the change).

use std::path::Path;

/// Compares `actual` with the file at `path` (panics naming the file when they differ);
/// with `UPDATE_GOLDEN` set, writes `actual` there first.
pub fn golden(path: &Path, actual: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, actual)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with UPDATE_GOLDEN=1", path.display()));
    assert_eq!(actual, expected, "output differs from {}", path.display());
}
