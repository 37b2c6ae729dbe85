//! `istioctl analyze` with a cluster: the live objects of every kind the mesh reads, with the
//! user's files laid over them (a file's object replaces the live one of the same kind,
//! namespace and name), analyzed together as one set, as Istio's istioctl does.
//!
//! The objects are written to a scratch directory (`live/<Kind>.yaml`, and the user's files
//! copied under `files/`, lines unchanged), which the same loader and analyzers read; message
//! origins are then put back: a live object is named without a file, a file's by its own path.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use mesh_api::Kind;
use serde_json::Value;

use super::message::{Message, Origin};
use super::AnalyzeError;
use crate::cluster::Cluster;

/// The scratch directory and where its copies came from.
pub struct Workspace {
    dir: tempfile::TempDir,
    /// (copy, original) of every user file.
    copies: Vec<(PathBuf, PathBuf)>,
}

impl Workspace {
    /// The directory to analyze.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Puts message origins back on the cluster or the user's files.
    pub fn relocate(&self, messages: &mut [Message]) {
        let live = self.dir.path().join("live");
        for m in messages {
            let Some(origin) = &mut m.origin else {
                continue;
            };
            if origin.file.starts_with(&live) {
                *origin = Origin::live(origin.resource.clone().unwrap_or_else(|| "Cluster".into()));
            } else if let Some((_, original)) = self.copies.iter().find(|(c, _)| *c == origin.file)
            {
                origin.file = original.clone();
            }
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AnalyzeError + '_ {
    move |source| AnalyzeError::Path {
        path: path.to_path_buf(),
        source,
    }
}

/// Copies the user's files and writes the live objects they do not replace.
pub async fn prepare(cluster: &mut Cluster, paths: &[PathBuf]) -> Result<Workspace, AnalyzeError> {
    let dir = tempfile::tempdir().map_err(io(Path::new("a scratch directory")))?;
    let files_dir = dir.path().join("files");
    let live_dir = dir.path().join("live");
    for d in [&files_dir, &live_dir] {
        std::fs::create_dir(d).map_err(io(d))?;
    }
    let mut copies = Vec::new();
    for path in paths {
        std::fs::metadata(path).map_err(io(path))?;
        let mut found = Vec::new();
        super::index::walk(path, &mut found);
        for file in found {
            let ext = file
                .extension()
                .map(|e| e.to_string_lossy().into_owned())
                .unwrap_or_else(|| "yaml".into());
            let copy = files_dir.join(format!("{}.{ext}", copies.len()));
            std::fs::copy(&file, &copy).map_err(io(&file))?;
            copies.push((copy, file));
        }
    }
    let (objects, _) = mesh_source::load_directory(&files_dir);
    let replaced: HashSet<(String, String, String)> = objects
        .iter()
        .map(|(_, o)| {
            let k = o.key();
            (k.kind.as_str().to_string(), k.namespace, k.name)
        })
        .collect();
    for kind in Kind::ALL {
        let api_version = kind.api_version();
        let mut docs = String::new();
        for mut object in cluster
            .list(&api_version, kind.as_str(), "")
            .await
            .map_err(AnalyzeError::Cluster)?
        {
            let meta = &object["metadata"];
            let key = (
                kind.as_str().to_string(),
                meta["namespace"].as_str().unwrap_or_default().to_string(),
                meta["name"].as_str().unwrap_or_default().to_string(),
            );
            if replaced.contains(&key) {
                continue;
            }
            if let Some(m) = object["metadata"].as_object_mut() {
                m.remove("managedFields");
            }
            object["apiVersion"] = Value::String(api_version.clone());
            object["kind"] = Value::String(kind.as_str().to_string());
            docs.push_str("---\n");
            docs.push_str(
                &serde_yaml::to_string(&object).map_err(|e| AnalyzeError::Print {
                    format: "yaml",
                    message: format!("a live {}: {e}", kind.as_str()),
                })?,
            );
        }
        if !docs.is_empty() {
            let file = live_dir.join(format!("{}.yaml", kind.as_str()));
            std::fs::write(&file, docs).map_err(io(&file))?;
        }
    }
    Ok(Workspace { dir, copies })
}

/// The namespace a message is about (`Kind ns/name`), or `None` for cluster-scoped objects
/// and messages about no object.
pub fn message_namespace(m: &Message) -> Option<&str> {
    let resource = m.origin.as_ref()?.resource.as_deref()?;
    let (_, name) = resource.split_once(' ')?;
    name.split_once('/').map(|(ns, _)| ns)
}
