//! A temporary directory of Kubernetes YAML, as istiod's local mode reads it.

use std::path::{Path, PathBuf};

/// A temporary cluster directory, removed on drop.
#[derive(Debug)]
pub struct ClusterDir {
    dir: tempfile::TempDir,
}

impl ClusterDir {
    /// Creates an empty directory.
    pub fn new() -> ClusterDir {
        ClusterDir {
            dir: tempfile::tempdir().expect("create temp cluster dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `yaml` to `name` (relative; folders created) through a temporary file and a
    /// rename, so a watcher never sees a half-written file.
    pub fn write(&self, name: &str, yaml: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        let parent = path.parent().expect("file has a parent");
        std::fs::create_dir_all(parent).expect("create parent dirs");
        let file_name = path.file_name().expect("file name").to_string_lossy();
        let tmp = parent.join(format!(".{file_name}.tmp"));
        std::fs::write(&tmp, yaml).expect("write temp file");
        std::fs::rename(&tmp, &path).expect("rename into place");
        path
    }

    /// Removes `name`.
    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.dir.path().join(name)).expect("remove file");
    }
}

impl Default for ClusterDir {
    fn default() -> Self {
        Self::new()
    }
}
