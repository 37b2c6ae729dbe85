//! Analysis messages shaped like upstream's `diag.Message`: `Level [CODE] (Kind ns/name
//! file:line) text` in text form; code, documentationUrl, level, message, origin and reference
//! in JSON/YAML.

use std::fmt;
use std::path::{Path, PathBuf};

use mesh_api::ObjectKey;
use serde::Serialize;

/// Severity, most severe first (so sorting puts errors on top).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
pub enum Level {
    Error,
    Warning,
    Info,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Error => "Error",
            Level::Warning => "Warning",
            Level::Info => "Info",
        })
    }
}

/// A kind of message: code, name and level.
#[derive(Debug, PartialEq, Eq)]
pub struct MessageType {
    pub code: &'static str,
    pub name: &'static str,
    pub level: Level,
}

/// The message types this istioctl emits. Codes below IST0900 are upstream's, with upstream's
/// level and meaning; IST09xx are ambient checks upstream does not have.
pub mod codes {
    use super::{Level, MessageType};

    pub const REFERENCED_RESOURCE_NOT_FOUND: MessageType = MessageType {
        code: "IST0101",
        name: "ReferencedResourceNotFound",
        level: Level::Error,
    };
    pub const SCHEMA_VALIDATION_ERROR: MessageType = MessageType {
        code: "IST0106",
        name: "SchemaValidationError",
        level: Level::Error,
    };
    pub const CONFLICTING_SIDECAR_WORKLOAD_SELECTORS: MessageType = MessageType {
        code: "IST0110",
        name: "ConflictingSidecarWorkloadSelectors",
        level: Level::Error,
    };
    pub const MULTIPLE_SIDECARS_WITHOUT_WORKLOAD_SELECTORS: MessageType = MessageType {
        code: "IST0111",
        name: "MultipleSidecarsWithoutWorkloadSelectors",
        level: Level::Error,
    };
    pub const NAMESPACE_MULTIPLE_INJECTION_LABELS: MessageType = MessageType {
        code: "IST0123",
        name: "NamespaceMultipleInjectionLabels",
        level: Level::Warning,
    };
    pub const NO_MATCHING_WORKLOADS: MessageType = MessageType {
        code: "IST0127",
        name: "NoMatchingWorkloadsFound",
        level: Level::Warning,
    };
    pub const SCHEMA_WARNING: MessageType = MessageType {
        code: "IST0133",
        name: "SchemaWarning",
        level: Level::Warning,
    };
    pub const INSUFFICIENT_PERMISSIONS: MessageType = MessageType {
        code: "IST0141",
        name: "InsufficientPermissions",
        level: Level::Error,
    };
    pub const UNSUPPORTED_KUBERNETES_VERSION: MessageType = MessageType {
        code: "IST0142",
        name: "UnsupportedKubernetesVersion",
        level: Level::Error,
    };
    pub const UNSUPPORTED_GATEWAY_API_VERSION: MessageType = MessageType {
        code: "IST0156",
        name: "UnsupportedGatewayAPIVersion",
        level: Level::Error,
    };
    pub const AMBIENT_POD_WITH_SIDECAR: MessageType = MessageType {
        code: "IST0901",
        name: "AmbientPodWithSidecar",
        level: Level::Warning,
    };
}

/// What a message is about and where it is defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `Kind namespace/name` (`Namespace name` for namespaces), when known.
    pub resource: Option<String>,
    pub file: PathBuf,
    pub line: Option<usize>,
}

impl Origin {
    /// The origin of an object defined in `file`.
    pub fn object(key: &ObjectKey, file: &Path, line: Option<usize>) -> Origin {
        Origin {
            resource: Some(friendly_name(key)),
            file: file.to_path_buf(),
            line,
        }
    }

    /// Something in a live cluster (`Cluster`, or `Kind name`): no file.
    pub fn live(resource: impl Into<String>) -> Origin {
        Origin {
            resource: Some(resource.into()),
            file: PathBuf::new(),
            line: None,
        }
    }

    /// `file:line` (or `file`; empty for live objects).
    pub fn reference(&self) -> String {
        match self.line {
            Some(line) => format!("{}:{line}", self.file.display()),
            None => self.file.display().to_string(),
        }
    }
}

/// `Kind namespace/name`, or `Kind name` for cluster-scoped objects.
pub fn friendly_name(key: &ObjectKey) -> String {
    if key.namespace.is_empty() {
        format!("{} {}", key.kind, key.name)
    } else {
        format!("{} {}/{}", key.kind, key.namespace, key.name)
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub code: &'static str,
    pub level: Level,
    pub origin: Option<Origin>,
    pub text: String,
}

impl MessageType {
    /// A message of this type.
    pub fn message(&self, origin: Option<Origin>, text: String) -> Message {
        Message {
            code: self.code,
            level: self.level,
            origin,
            text,
        }
    }
}

/// Upstream's documentation base for analysis messages.
const DOC_BASE: &str = "https://istio.io/latest/docs/reference/config/analysis";

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.level, self.code)?;
        if let Some(o) = &self.origin {
            match (&o.resource, o.reference()) {
                (Some(r), reference) if reference.is_empty() => write!(f, " ({r})")?,
                (Some(r), reference) => write!(f, " ({r} {reference})")?,
                (None, reference) => write!(f, " ({reference})")?,
            }
        }
        write!(f, " {}", self.text)
    }
}

/// The JSON/YAML form (keys in upstream's alphabetical order).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Structured {
    code: &'static str,
    documentation_url: String,
    level: String,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reference: Option<String>,
}

impl Message {
    pub fn structured(&self) -> Structured {
        Structured {
            code: self.code,
            documentation_url: format!(
                "{DOC_BASE}/{}/?ref=istioctl-analyze",
                self.code.to_ascii_lowercase()
            ),
            level: self.level.to_string(),
            message: self.text.clone(),
            origin: self.origin.as_ref().and_then(|o| o.resource.clone()),
            reference: self
                .origin
                .as_ref()
                .map(Origin::reference)
                .filter(|r| !r.is_empty()),
        }
    }

    /// Sort key: file, line, then code.
    pub fn sort_key(&self) -> (PathBuf, usize, &'static str, String) {
        let (file, line) = self
            .origin
            .as_ref()
            .map(|o| (o.file.clone(), o.line.unwrap_or(0)))
            .unwrap_or_default();
        (file, line, self.code, self.text.clone())
    }
}
