//! Errors about the cluster state read from files: where (file, line, document) and what.

use std::fmt;
use std::path::PathBuf;

use mesh_api::{ApiError, ObjectKey};

/// One problem found in the source, with as much of its location as is known.
///
/// Displays like `examples/bad.yaml:12: Pod default/x: invalid field spec.nodeName: ...`; in a
/// file with several documents the document (and `List` item) index follows the line.
#[derive(Debug, thiserror::Error)]
#[error("{}{}{problem}", Location(self), Subject(self.key.as_ref()))]
pub struct SourceError {
    /// The file (or directory) the problem is in.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known (YAML/JSON syntax errors).
    pub column: Option<usize>,
    /// 1-based document index, set for files holding more than one document.
    pub document: Option<usize>,
    /// 1-based item index inside a `kind: List` document.
    pub item: Option<usize>,
    /// The object the problem is about, when its kind/namespace/name could be read.
    pub key: Option<ObjectKey>,
    /// What is wrong.
    pub problem: Problem,
}

impl SourceError {
    /// An error about a whole file (no line, document or key).
    pub fn file(file: impl Into<PathBuf>, problem: Problem) -> Self {
        SourceError {
            file: file.into(),
            line: None,
            column: None,
            document: None,
            item: None,
            key: None,
            problem,
        }
    }

    /// Short label value for metrics.
    pub fn reason(&self) -> &'static str {
        self.problem.reason()
    }

    /// The field path from the object decoder (e.g. `spec.ports[0].port`), if the problem is a
    /// field with a wrong type or value.
    pub fn field_path(&self) -> Option<&str> {
        match &self.problem {
            Problem::InvalidObject(ApiError::InvalidField { path, .. }) => Some(path),
            _ => None,
        }
    }
}

/// What is wrong with a file or a document.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// The file or directory could not be read.
    #[error("cannot read: {0}; check that it exists and that istiod may read it")]
    Read(#[source] std::io::Error),
    /// The file is not well-formed YAML or JSON; nothing in it was applied.
    #[error(
        "malformed {format}: {message}; fix the syntax (objects loaded earlier from this file are kept)"
    )]
    Syntax {
        format: &'static str,
        message: String,
    },
    /// A document that is not a mapping (e.g. a bare string or a sequence).
    #[error("document is not an object: each document must be a mapping with apiVersion, kind and metadata")]
    NotAnObject,
    /// A `List` document without an `items` sequence.
    #[error("{kind} has no items sequence: a List must hold its objects under items")]
    ListWithoutItems { kind: String },
    /// The object decoder rejected the document.
    #[error("{}", api_message(.0))]
    InvalidObject(#[source] ApiError),
    /// The same object is defined in two files (or twice in one file).
    #[error("also defined in {}{}: this definition is ignored while that one exists; remove one of them", .first.display(), line_suffix(*.line))]
    Duplicate { first: PathBuf, line: Option<usize> },
    /// The directory could not be watched at all.
    #[error("cannot watch: {0}; changes are picked up by polling instead")]
    Watch(String),
}

impl Problem {
    /// Short label value for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::Read(_) => "read",
            Problem::Syntax { .. } => "syntax",
            Problem::NotAnObject => "not_an_object",
            Problem::ListWithoutItems { .. } => "list_without_items",
            Problem::InvalidObject(e) => e.reason(),
            Problem::Duplicate { .. } => "duplicate",
            Problem::Watch(_) => "watch",
        }
    }
}

/// The decoder's message without the `Kind name:` prefix (the error shows the key already).
fn api_message(err: &ApiError) -> String {
    match err {
        ApiError::InvalidField { path, message, .. } => {
            format!("invalid field {path}: {message}")
        }
        other => other.to_string(),
    }
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

/// `file:line:column (document 2, item 3): `
struct Location<'a>(&'a SourceError);

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0;
        write!(f, "{}", e.file.display())?;
        if let Some(line) = e.line {
            write!(f, ":{line}")?;
            if let Some(column) = e.column {
                write!(f, ":{column}")?;
            }
        }
        match (e.document, e.item) {
            (Some(d), Some(i)) => write!(f, " (document {d}, item {i})")?,
            (Some(d), None) => write!(f, " (document {d})")?,
            (None, Some(i)) => write!(f, " (item {i})")?,
            (None, None) => {}
        }
        f.write_str(": ")
    }
}

/// `Pod default/x: ` (or `Namespace x: `), empty when the key is unknown.
struct Subject<'a>(Option<&'a ObjectKey>);

impl fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(key) if key.namespace.is_empty() => write!(f, "{} {}: ", key.kind, key.name),
            Some(key) => write!(f, "{} {}/{}: ", key.kind, key.namespace, key.name),
            None => Ok(()),
        }
    }
}
