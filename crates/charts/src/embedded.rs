//! The charts and Helm front end this build was made with, embedded in the binary: a built
//! istioctl renders them wherever it runs, with no source tree (as Istio's istioctl embeds its
//! charts). Rendering still runs Helm's engine through `python3` and the helm-python-sdk wheel
//! (`scripts/install-deps.sh`, or `HELM_PYTHON_DIR`).

use std::path::{Path, PathBuf};

use crate::Helm;

mod files {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

/// The embedded charts written out to a scratch directory, removed when dropped.
#[derive(Debug)]
pub struct Extracted {
    dir: tempfile::TempDir,
}

impl Extracted {
    /// The charts directory (`base`, `istiod`, `cni`, `ztunnel`).
    pub fn charts_dir(&self) -> PathBuf {
        self.dir.path().join("charts")
    }

    /// Helm's engine through the embedded front end.
    pub fn helm(&self) -> Helm {
        Helm::with_script(self.dir.path().join("helm.py"))
    }
}

/// How many files are embedded (a build from a tree without `charts/` has none).
pub fn file_count() -> usize {
    files::CHARTS.len()
}

/// Writes the embedded charts and `helm.py` to a new scratch directory.
pub fn extract() -> std::io::Result<Extracted> {
    let dir = tempfile::Builder::new().prefix("mesh-charts-").tempdir()?;
    let root = dir.path().join("charts");
    for (rel, bytes) in files::CHARTS {
        let path = root.join(Path::new(rel));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes)?;
    }
    std::fs::write(dir.path().join("helm.py"), files::HELM_SCRIPT)?;
    Ok(Extracted { dir })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extracted_charts_are_the_repositorys() {
        let extracted = extract().expect("extract");
        let mut count = 0;
        let mut stack = vec![crate::charts_dir()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read").flatten() {
                let path = entry.path();
                if std::fs::metadata(&path).expect("meta").is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path
                    .strip_prefix(crate::charts_dir())
                    .expect("under charts");
                let copy = extracted.charts_dir().join(rel);
                assert_eq!(
                    std::fs::read(&path).expect("ours"),
                    std::fs::read(&copy).unwrap_or_else(|e| panic!("{}: {e}", copy.display())),
                    "{}",
                    rel.display()
                );
                count += 1;
            }
        }
        assert_eq!(count, file_count(), "every embedded file is a chart file");
    }
}
