//! Errors from decoding objects.

/// Why a document could not become a typed object.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The document has no `kind` or `apiVersion` string.
    #[error("document has no {field}: every Kubernetes object needs apiVersion and kind")]
    MissingTypeField { field: &'static str },
    /// A kind/apiVersion pair that the mesh does not read.
    #[error(
        "unsupported object {api_version}/{kind}: the mesh reads {}",
        crate::Kind::names()
    )]
    UnsupportedKind { api_version: String, kind: String },
    /// The object has no `metadata.name`.
    #[error("{kind} has no metadata.name")]
    MissingName { kind: Kind },
    /// A field has the wrong type or value; `path` names it (e.g. `spec.ports[0].port`).
    #[error("{kind} {name}: invalid field {path}: {message}")]
    InvalidField {
        kind: Kind,
        name: String,
        path: String,
        message: String,
    },
}

impl ApiError {
    /// Short label value for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::MissingTypeField { .. } => "missing_type",
            ApiError::UnsupportedKind { .. } => "unsupported_kind",
            ApiError::MissingName { .. } => "missing_name",
            ApiError::InvalidField { .. } => "invalid_field",
        }
    }
}

use crate::Kind;
