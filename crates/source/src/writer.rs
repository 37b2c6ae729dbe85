//! The write side of a source: what controllers (the waypoint controller, later istiod's status
//! writers) use to create the objects they own and to set the status of others.
//!
//! [`DirectoryWriter`] writes into a watched directory, so a [`crate::DirectorySource`] on the
//! same directory reads back what was written: owned objects go to a subdirectory of their own
//! (one file per object), status goes to the root's status directory, where each document sets
//! the `status` of the object with the same key (the user's own file is never rewritten). A
//! [`crate::KubeWriter`] implements the same trait with server-side apply.

use std::future::Future;
use std::path::{Path, PathBuf};

use mesh_api::{ApiError, Object, ObjectKey};
use serde_json::{json, Value};

use crate::scan::STATUS_DIR;

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The object to write is not one the mesh knows how to read back.
    #[error("cannot write object: {0}")]
    Invalid(#[source] Box<ApiError>),
    /// The object could not be encoded.
    #[error("cannot encode {key}: {source}")]
    Encode {
        key: ObjectKey,
        #[source]
        source: serde_yaml::Error,
    },
    /// The file system refused.
    #[error("cannot write {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The API server refused or could not be reached.
    #[error("{key}: {detail}")]
    Api { key: Box<ObjectKey>, detail: String },
}

/// Where a controller writes (asynchronously: the Kubernetes writer talks to the API server).
pub trait ObjectWriter: Send + Sync + 'static {
    /// Creates or replaces a whole object (`apiVersion`, `kind`, `metadata`, ...), as the
    /// controller's field manager would with a forced server-side apply. Returns whether
    /// anything changed.
    fn apply(&self, object: &Value) -> impl Future<Output = Result<bool, WriteError>> + Send;
    /// Deletes an object this writer created; one it did not create is left alone.
    fn delete(&self, key: &ObjectKey) -> impl Future<Output = Result<(), WriteError>> + Send;
    /// Sets the `status` of the object `key` (`None` clears what this writer set).
    fn write_status(
        &self,
        key: &ObjectKey,
        status: Option<&Value>,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;
}

/// Writes into a directory watched by a [`crate::DirectorySource`].
#[derive(Debug, Clone)]
pub struct DirectoryWriter {
    root: PathBuf,
    owned: PathBuf,
}

impl DirectoryWriter {
    /// A writer for the directory `root` whose objects go under `root/<subdir>`.
    pub fn new(root: impl Into<PathBuf>, subdir: &str) -> DirectoryWriter {
        let root = root.into();
        let owned = root.join(subdir);
        DirectoryWriter { root, owned }
    }

    /// The file an owned object is written to.
    pub fn object_path(&self, key: &ObjectKey) -> PathBuf {
        self.owned.join(namespace_dir(key)).join(format!(
            "{}-{}.yaml",
            key.kind.as_str().to_ascii_lowercase(),
            key.name
        ))
    }

    /// The file the status of `key` is written to.
    pub fn status_path(&self, key: &ObjectKey) -> PathBuf {
        self.root
            .join(STATUS_DIR)
            .join(key.kind.as_str().to_ascii_lowercase())
            .join(namespace_dir(key))
            .join(format!("{}.yaml", key.name))
    }
}

impl ObjectWriter for DirectoryWriter {
    async fn apply(&self, object: &Value) -> Result<bool, WriteError> {
        DirectoryWriter::apply(self, object)
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), WriteError> {
        DirectoryWriter::delete(self, key)
    }

    async fn write_status(
        &self,
        key: &ObjectKey,
        status: Option<&Value>,
    ) -> Result<(), WriteError> {
        DirectoryWriter::write_status(self, key, status)
    }
}

/// The same writes, synchronously (a file write does not wait on anything).
impl DirectoryWriter {
    /// See [`ObjectWriter::apply`].
    pub fn apply(&self, object: &Value) -> Result<bool, WriteError> {
        let key = key_of(object)?;
        let text = serde_yaml::to_string(object).map_err(|source| WriteError::Encode {
            key: key.clone(),
            source,
        })?;
        write_if_changed(&self.object_path(&key), &text)
    }

    /// See [`ObjectWriter::delete`].
    pub fn delete(&self, key: &ObjectKey) -> Result<(), WriteError> {
        remove(&self.object_path(key))
    }

    /// See [`ObjectWriter::write_status`].
    pub fn write_status(&self, key: &ObjectKey, status: Option<&Value>) -> Result<(), WriteError> {
        let path = self.status_path(key);
        let Some(status) = status else {
            return remove(&path);
        };
        let mut doc = reference(key);
        doc["status"] = status.clone();
        let text = serde_yaml::to_string(&doc).map_err(|source| WriteError::Encode {
            key: key.clone(),
            source,
        })?;
        write_if_changed(&path, &text).map(|_| ())
    }
}

/// The key of an object a controller writes, if the mesh can read it back.
pub(crate) fn key_of(object: &Value) -> Result<ObjectKey, WriteError> {
    Object::from_value(object.clone())
        .map(|o| o.key())
        .map_err(|e| WriteError::Invalid(Box::new(e)))
}

/// `apiVersion`, `kind` and the name (and namespace) of `key`: what a status write names.
pub(crate) fn reference(key: &ObjectKey) -> Value {
    let mut metadata = json!({ "name": key.name });
    if !key.namespace.is_empty() {
        metadata["namespace"] = json!(key.namespace);
    }
    json!({
        "apiVersion": key.kind.api_version(),
        "kind": key.kind.as_str(),
        "metadata": metadata,
    })
}

/// The directory of `key`'s namespace (`_cluster` for cluster-scoped objects).
fn namespace_dir(key: &ObjectKey) -> &str {
    if key.namespace.is_empty() {
        "_cluster"
    } else {
        &key.namespace
    }
}

/// Writes `text` to `path` through a hidden temporary file and a rename (a watcher never reads
/// half a file); an unchanged file is not touched (and `false` returned).
fn write_if_changed(path: &Path, text: &str) -> Result<bool, WriteError> {
    let io = |source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    };
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(true)
}

fn remove(path: &Path) -> Result<(), WriteError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(WriteError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests;
