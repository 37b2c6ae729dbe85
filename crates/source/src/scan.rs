//! Which files are manifests, walking a directory tree, and reading files (blocking I/O).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use tracing::debug;

use crate::error::{Problem, SourceError};
use crate::parse::{parse_file, ParsedFile};

/// Extensions of the files the source reads.
const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];
/// Suffixes of editor backup and swap files, never read.
const TEMP_SUFFIXES: [&str; 4] = ["~", ".swp", ".swo", ".swx"];

/// The authoritative contents of `prefix` (a file or a directory) as read from disk.
#[derive(Debug)]
pub(crate) struct Scan {
    pub prefix: PathBuf,
    /// Every manifest under `prefix` that still exists, sorted by path.
    pub found: Vec<(PathBuf, ParsedFile)>,
    /// Directories that could not be listed.
    pub errors: Vec<SourceError>,
}

/// The directory under the root that holds written status (see [`crate::DirectoryWriter`]): its
/// documents set the `status` of the objects defined elsewhere, as a status subresource does.
pub const STATUS_DIR: &str = ".status";

/// Whether `path` (under `root`) has a hidden component below `root`; the status directory
/// itself does not count (its hidden files do).
pub(crate) fn is_hidden(root: &Path, path: &Path) -> bool {
    let relative = path.strip_prefix(root).unwrap_or(path);
    let mut components = relative.components().peekable();
    if components
        .peek()
        .is_some_and(|c| c.as_os_str() == STATUS_DIR)
    {
        components.next();
    }
    components.any(|c| match c {
        Component::Normal(name) => name.to_string_lossy().starts_with('.'),
        _ => false,
    })
}

/// Whether `path` lies in the status directory of `root`.
pub(crate) fn is_status(root: &Path, path: &Path) -> bool {
    path.strip_prefix(root)
        .ok()
        .and_then(|r| r.components().next())
        .is_some_and(|c| c.as_os_str() == STATUS_DIR)
}

/// Whether `path` names a file the source reads: a visible `.yaml`, `.yml` or `.json` file that
/// is not an editor temporary file.
pub(crate) fn is_manifest(root: &Path, path: &Path) -> bool {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy()) else {
        return false;
    };
    let ext_ok = path
        .extension()
        .is_some_and(|e| EXTENSIONS.iter().any(|x| e == *x));
    ext_ok && !TEMP_SUFFIXES.iter().any(|s| name.ends_with(s)) && !is_hidden(root, path)
}

/// Manifest files under `prefix` (itself a file or a directory), sorted; a missing `prefix`
/// yields nothing. Symlinks to files are followed, symlinks to directories are not.
pub(crate) fn walk(root: &Path, prefix: &Path, errors: &mut Vec<SourceError>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    match fs::metadata(prefix) {
        Ok(meta) if meta.is_dir() => walk_dir(root, prefix, &mut files, errors),
        Ok(meta) if meta.is_file() && is_manifest(root, prefix) => files.push(prefix.to_path_buf()),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => errors.push(SourceError::file(prefix, Problem::Read(e))),
    }
    files.sort();
    files
}

fn walk_dir(root: &Path, dir: &Path, files: &mut Vec<PathBuf>, errors: &mut Vec<SourceError>) {
    if dir != root && is_hidden(root, dir) {
        return;
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return,
        Err(e) => {
            errors.push(SourceError::file(dir, Problem::Read(e)));
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if is_hidden(root, &path) {
            continue;
        }
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        if file_type.is_dir() {
            walk_dir(root, &path, files, errors);
        } else if file_type.is_symlink() && fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            debug!(path = %path.display(), "not following symlink to a directory");
        } else if is_manifest(root, &path) {
            files.push(path);
        }
    }
}

/// Reads and parses one file; `None` if it no longer exists.
pub(crate) fn read(path: &Path) -> Option<ParsedFile> {
    match fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => Some(parse_file(path, &text)),
            Err(e) => {
                let problem = Problem::Syntax {
                    format: "text",
                    message: format!("not UTF-8 at byte {}", e.utf8_error().valid_up_to()),
                };
                Some(ParsedFile::fatal(SourceError::file(path, problem)))
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => Some(ParsedFile::fatal(SourceError::file(path, Problem::Read(e)))),
    }
}

/// Reads every manifest under `prefix`.
pub(crate) fn scan(root: &Path, prefix: &Path) -> Scan {
    let mut errors = Vec::new();
    let found = walk(root, prefix, &mut errors)
        .into_iter()
        .filter_map(|path| read(&path).map(|parsed| (path, parsed)))
        .collect();
    Scan {
        prefix: prefix.to_path_buf(),
        found,
        errors,
    }
}

/// Reads every prefix, dropping prefixes that lie under another one of the set.
pub(crate) fn scan_all(root: &Path, mut prefixes: Vec<PathBuf>) -> Vec<Scan> {
    prefixes.sort();
    prefixes.dedup();
    let mut kept: Vec<PathBuf> = Vec::new();
    for prefix in prefixes {
        if !kept.iter().any(|k| prefix.starts_with(k)) {
            kept.push(prefix);
        }
    }
    kept.iter().map(|prefix| scan(root, prefix)).collect()
}

/// Modification time and size of one file, for polling.
pub(crate) type Stamp = (Option<SystemTime>, u64);

/// Stamps of every manifest under `root`.
pub(crate) fn stamps(root: &Path) -> BTreeMap<PathBuf, Stamp> {
    let mut ignored = Vec::new();
    walk(root, root, &mut ignored)
        .into_iter()
        .filter_map(|path| {
            let meta = fs::metadata(&path).ok()?;
            Some((path, (meta.modified().ok(), meta.len())))
        })
        .collect()
}

/// An error if `root` does not exist (it is then watched for by polling).
pub(crate) fn missing_root(root: &Path) -> Option<SourceError> {
    match fs::metadata(root) {
        Ok(_) => None,
        Err(e) => Some(SourceError::file(root, Problem::Read(e))),
    }
}
