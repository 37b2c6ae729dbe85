//! Authentication of CA callers.
//!
//! [`Authenticator`] turns request metadata into a [`Caller`]. Local mode uses
//! [`TokenFileAuthenticator`], a YAML file of bearer tokens re-read whenever it changes; on
//! Kubernetes, [`TokenReviewAuthenticator`] asks the API server about the service-account
//! token. [`RequireAuth`] puts either in front of a gRPC service.

mod grpc;
mod token_file;
mod token_review;

pub use grpc::RequireAuth;
pub use token_file::TokenFileAuthenticator;
pub use token_review::{TokenReviewAuthenticator, DEFAULT_TOKEN_AUDIENCE};

use std::path::PathBuf;

use mesh_identity::Identity;
use tonic::metadata::MetadataMap;

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The caller's own identity.
    pub identity: Identity,
    /// The node a node agent runs on, when the credential itself says so (the local token
    /// file); `None` otherwise.
    pub node: Option<String>,
    /// The pod a bound service-account token belongs to (Kubernetes); the CA derives a node
    /// agent's node from it.
    pub pod: Option<BoundPod>,
}

/// The pod named in a bound service-account token (`authentication.kubernetes.io/pod-name`
/// and `pod-uid` in the TokenReview's extra fields); its namespace is the caller's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundPod {
    pub name: String,
    pub uid: String,
}

/// Errors authenticating a caller. Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no `authorization` header; send `authorization: Bearer <token>`")]
    MissingAuthorization,
    #[error("the `authorization` header is not of the form `Bearer <token>`")]
    NotBearer,
    #[error("unknown bearer token; is it listed in {path}?")]
    UnknownToken { path: PathBuf },
    #[error("the bearer token for {identity} expired at {expired_at}; issue a new token")]
    Expired {
        identity: String,
        expired_at: String,
    },
    #[error("cannot read token file {path}: {detail}")]
    TokenFileUnreadable { path: PathBuf, detail: String },
    #[error("token file {path} is malformed: {detail}")]
    TokenFileMalformed { path: PathBuf, detail: String },
    #[error("cannot review the token with the Kubernetes API server: {detail}")]
    TokenReviewUnavailable { detail: String },
    #[error("the Kubernetes API server rejected the token: {error}")]
    NotAuthenticated { error: String },
    #[error("the token's audiences {got:?} include none of {want:?}")]
    WrongAudience { got: Vec<String>, want: Vec<String> },
    #[error("caller {username:?} is not a Kubernetes service account (user system:serviceaccount:<ns>:<sa> in group system:serviceaccounts)")]
    NotServiceAccount { username: String },
}

impl AuthError {
    /// What the refused caller is told: what is wrong with its credential, and nothing of the
    /// server (no file paths, no API server errors); the full error is logged.
    pub fn caller_message(&self) -> String {
        match self {
            AuthError::UnknownToken { .. } => "unknown bearer token".into(),
            AuthError::TokenFileUnreadable { .. }
            | AuthError::TokenFileMalformed { .. }
            | AuthError::TokenReviewUnavailable { .. } => {
                "the token cannot be checked right now; retry later".into()
            }
            other => other.to_string(),
        }
    }

    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::MissingAuthorization => "missing_authorization",
            AuthError::NotBearer => "not_bearer",
            AuthError::UnknownToken { .. } => "unknown_token",
            AuthError::Expired { .. } => "expired_token",
            AuthError::TokenFileUnreadable { .. } => "token_file_unreadable",
            AuthError::TokenFileMalformed { .. } => "token_file_malformed",
            AuthError::TokenReviewUnavailable { .. } => "token_review_unavailable",
            AuthError::NotAuthenticated { .. } => "token_rejected",
            AuthError::WrongAudience { .. } => "wrong_audience",
            AuthError::NotServiceAccount { .. } => "not_service_account",
        }
    }
}

/// Authenticates a gRPC caller from its request metadata.
#[tonic::async_trait]
pub trait Authenticator: Send + Sync {
    async fn authenticate(&self, md: &MetadataMap) -> Result<Caller, AuthError>;
}

/// Extracts the bearer token from the `authorization` header.
pub fn bearer_token(md: &MetadataMap) -> Result<&str, AuthError> {
    let value = md
        .get("authorization")
        .ok_or(AuthError::MissingAuthorization)?;
    let value = value.to_str().map_err(|_| AuthError::NotBearer)?;
    let (scheme, token) = value.trim().split_once(' ').ok_or(AuthError::NotBearer)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(AuthError::NotBearer);
    }
    Ok(token)
}
