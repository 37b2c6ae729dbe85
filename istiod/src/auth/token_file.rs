//! The local mode's credentials: a YAML file of bearer tokens, re-read whenever it changes.
//!
//! ```yaml
//! tokens:
//! - token: "s3cr3t-node1"
//!   identity: spiffe://cluster.local/ns/istio-system/sa/ztunnel
//!   node: node1                     # node agents (ztunnel) only
//!   expires: 2027-01-01T00:00:00Z   # optional, RFC 3339 UTC
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use mesh_identity::Identity;
use serde::Deserialize;
use tonic::metadata::MetadataMap;

use super::{bearer_token, AuthError, Authenticator, Caller};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tokens: Vec<RawToken>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    token: String,
    identity: String,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    expires: Option<String>,
}

#[derive(Clone, Debug)]
struct TokenEntry {
    caller: Caller,
    expires: Option<SystemTime>,
}

/// What the file looked like when last read.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

struct Loaded {
    stamp: Option<Stamp>,
    tokens: Result<HashMap<String, TokenEntry>, AuthError>,
}

/// Bearer tokens from a YAML file, re-read when its modification time or size changes.
pub struct TokenFileAuthenticator {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for TokenFileAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFileAuthenticator")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TokenFileAuthenticator {
    /// Reads `path` now, failing if it is unreadable or malformed.
    pub fn new(path: impl Into<PathBuf>) -> Result<Self, AuthError> {
        let path = path.into();
        let stamp = stamp(&path)?;
        let tokens = parse_file(&path)?;
        tracing::info!(path = %path.display(), tokens = tokens.len(), "loaded CA token file");
        Ok(TokenFileAuthenticator {
            path,
            loaded: Mutex::new(Loaded {
                stamp: Some(stamp),
                tokens: Ok(tokens),
            }),
        })
    }

    /// The token file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lookup(&self, token: &str) -> Result<TokenEntry, AuthError> {
        let current = stamp(&self.path)?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.stamp != Some(current) {
            loaded.tokens = parse_file(&self.path);
            loaded.stamp = Some(current);
            match &loaded.tokens {
                Ok(t) => {
                    tracing::info!(path = %self.path.display(), tokens = t.len(), "reloaded CA token file")
                }
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "CA token file is broken")
                }
            }
        }
        let tokens = loaded.tokens.as_ref().map_err(Clone::clone)?;
        tokens
            .get(token)
            .cloned()
            .ok_or_else(|| AuthError::UnknownToken {
                path: self.path.clone(),
            })
    }
}

#[tonic::async_trait]
impl Authenticator for TokenFileAuthenticator {
    async fn authenticate(&self, md: &MetadataMap) -> Result<Caller, AuthError> {
        let token = bearer_token(md)?;
        let entry = self.lookup(token)?;
        if let Some(expires) = entry.expires {
            if expires <= SystemTime::now() {
                return Err(AuthError::Expired {
                    identity: entry.caller.identity.to_string(),
                    expired_at: humantime::format_rfc3339_seconds(expires).to_string(),
                });
            }
        }
        Ok(entry.caller)
    }
}

fn stamp(path: &Path) -> Result<Stamp, AuthError> {
    let meta = std::fs::metadata(path).map_err(|e| AuthError::TokenFileUnreadable {
        path: path.into(),
        detail: e.to_string(),
    })?;
    Ok(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
    })
}

fn parse_file(path: &Path) -> Result<HashMap<String, TokenEntry>, AuthError> {
    let text = std::fs::read_to_string(path).map_err(|e| AuthError::TokenFileUnreadable {
        path: path.into(),
        detail: e.to_string(),
    })?;
    parse_tokens(&text).map_err(|detail| AuthError::TokenFileMalformed {
        path: path.into(),
        detail,
    })
}

/// Parses the YAML document; errors name the entry by position and identity, never by token.
fn parse_tokens(text: &str) -> Result<HashMap<String, TokenEntry>, String> {
    let raw: RawFile = if text.trim().is_empty() {
        RawFile { tokens: Vec::new() }
    } else {
        serde_yaml::from_str(text).map_err(|e| e.to_string())?
    };
    let mut tokens = HashMap::with_capacity(raw.tokens.len());
    for (i, t) in raw.tokens.into_iter().enumerate() {
        let at = format!("tokens[{i}] ({})", t.identity);
        if t.token.trim().is_empty() {
            return Err(format!("{at}: `token` is empty"));
        }
        let identity = Identity::parse(&t.identity).map_err(|e| format!("{at}: {e}"))?;
        let node = match t.node {
            Some(n) if n.trim().is_empty() => return Err(format!("{at}: `node` is empty")),
            other => other,
        };
        let expires = t
            .expires
            .map(|e| humantime::parse_rfc3339_weak(&e).map_err(|err| {
                format!("{at}: `expires` {e:?} is not an RFC 3339 UTC time like 2027-01-01T00:00:00Z ({err})")
            }))
            .transpose()?;
        let entry = TokenEntry {
            caller: Caller {
                identity,
                node,
                pod: None,
            },
            expires,
        };
        if tokens.insert(t.token, entry).is_some() {
            return Err(format!("{at}: the same token is listed twice"));
        }
    }
    Ok(tokens)
}

#[cfg(test)]
#[path = "token_file_tests.rs"]
mod tests;
