//! Embeds `charts/` and `scripts/helm.py` into the crate, so a built istioctl renders the charts
//! it was built with wherever it runs (`embedded::extract`). Symlinks (the shared profile
//! template and profile files) are embedded as the files they point at.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        // Follows symlinks: a linked file is embedded with the content it points at.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(root, &path, out);
        } else if let Ok(rel) = path.strip_prefix(root) {
            let canonical = std::fs::canonicalize(&path).unwrap_or(path.clone());
            out.push((rel.to_string_lossy().into_owned(), canonical));
        }
    }
}

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let repo = manifest_dir.join("../..");
    let charts = repo.join("charts");
    let script = repo.join("scripts/helm.py");
    println!("cargo:rerun-if-changed={}", charts.display());
    println!("cargo:rerun-if-changed={}", script.display());
    let mut files = Vec::new();
    walk(&charts, &charts, &mut files);
    let mut code = String::from("/// Every file of `charts/`, by its path under `charts/`.\npub static CHARTS: &[(&str, &[u8])] = &[\n");
    for (rel, path) in &files {
        let _ = writeln!(
            code,
            "    ({rel:?}, include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    code.push_str("];\n");
    let script = std::fs::canonicalize(&script).unwrap_or(script);
    let _ = writeln!(
        code,
        "/// `scripts/helm.py`.\npub static HELM_SCRIPT: &[u8] = include_bytes!({:?});",
        script.display().to_string()
    );
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("embedded.rs");
    if let Err(e) = std::fs::write(&out, code) {
        panic!("cannot write {}: {e}", out.display());
    }
}
