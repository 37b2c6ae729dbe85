//! The self-signed root on a cluster: kept in the Secret `istio-ca-secret` (type
//! `istio.io/ca-root`, keys `ca-cert.pem` and `ca-key.pem`) in istiod's namespace, as Istio
//! keeps it, so every replica and every restart signs with the same root.
//!
//! At start, before the CA loads its state directory: a Secret that exists is written into the
//! directory; without one, the root the directory holds (or a new one) is stored as the Secret.
//! When two replicas race to create it, the loser takes the winner's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use mesh_identity::ca::{write_file, CaOptions, CertificateAuthority, CA_CERT_FILE, CA_KEY_FILE};

/// The Secret's name and type.
pub const CA_SECRET: &str = "istio-ca-secret";
pub const CA_SECRET_TYPE: &str = "istio.io/ca-root";
/// The keys Istio writes besides the two it fills (left empty for a self-signed root).
const EMPTY_KEYS: [&str; 3] = ["cert-chain.pem", "key.pem", "root-cert.pem"];
/// How long start-up keeps trying an API server that does not answer.
const PATIENCE: Duration = Duration::from_secs(60);

/// Why the cluster's root could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CaSecretError {
    #[error("Secret {namespace}/{CA_SECRET} has no {key}: add it, or delete the Secret to have istiod make a new root")]
    MissingKey {
        namespace: String,
        key: &'static str,
    },
    #[error("the API server refused to read or create Secret {namespace}/{CA_SECRET}: {source}; does istiod's Role allow get and create on secrets?")]
    Refused {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read or create Secret {namespace}/{CA_SECRET} within {PATIENCE:?} (last: {last}); is the API server reachable?")]
    TimedOut { namespace: String, last: String },
    #[error("Secret {namespace}/{CA_SECRET} does not hold a usable CA: {source}; an RSA key must be PKCS#8 (openssl pkcs8 -topk8 -nocrypt)")]
    Unusable {
        namespace: String,
        #[source]
        source: mesh_identity::ca::CaError,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Ca(#[from] mesh_identity::ca::CaError),
}

impl CaSecretError {
    pub fn reason(&self) -> &'static str {
        match self {
            CaSecretError::MissingKey { .. } => "missing_key",
            CaSecretError::Refused { .. } => "refused",
            CaSecretError::TimedOut { .. } => "timed_out",
            CaSecretError::Unusable { .. } => "unusable",
            CaSecretError::Write { .. } | CaSecretError::Read { .. } => "state_dir",
            CaSecretError::Ca(_) => "ca",
        }
    }
}

/// What start-up did with the Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The Secret existed: its root is now in the state directory.
    Loaded,
    /// There was none: this istiod's root is now the Secret.
    Created,
}

/// Leaves `state_dir` holding the cluster's self-signed root.
pub async fn sync(
    client: &Client,
    namespace: &str,
    state_dir: &Path,
    options: &CaOptions,
) -> Result<Outcome, CaSecretError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut delay = Duration::from_millis(250);
    loop {
        let error = match attempt(&secrets, namespace, state_dir, options, deadline).await? {
            Ok(outcome) => return Ok(outcome),
            Err(error) => error,
        };
        // A refusal (403, 422, ...) will not change by asking again; a 409 is another
        // replica's Secret, read on the next round.
        if let Attempt::Api(kube::Error::Api(e)) = &error {
            if (400..500).contains(&e.code) && e.code != 409 && e.code != 429 {
                return Err(error.refused(namespace));
            }
        }
        if tokio::time::Instant::now() + delay > deadline {
            return Err(error.timed_out(namespace));
        }
        tracing::warn!(error = %error, secret = CA_SECRET, namespace, "cannot have the CA Secret yet; retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(8));
    }
}

/// Why one round failed, to be retried or not.
#[derive(Debug, thiserror::Error)]
enum Attempt {
    #[error("{0}")]
    Api(kube::Error),
    #[error("no answer")]
    NoAnswer,
}

impl Attempt {
    fn refused(self, namespace: &str) -> CaSecretError {
        match self {
            Attempt::Api(source) => CaSecretError::Refused {
                namespace: namespace.to_string(),
                source,
            },
            Attempt::NoAnswer => self.timed_out(namespace),
        }
    }

    fn timed_out(self, namespace: &str) -> CaSecretError {
        CaSecretError::TimedOut {
            namespace: namespace.to_string(),
            last: self.to_string(),
        }
    }
}

/// One round: read the Secret, or store this istiod's root as it. The outer `Err` ends
/// start-up; the inner one may be retried.
async fn attempt(
    secrets: &Api<Secret>,
    namespace: &str,
    state_dir: &Path,
    options: &CaOptions,
    deadline: tokio::time::Instant,
) -> Result<Result<Outcome, Attempt>, CaSecretError> {
    // The client has no read timeout of its own: an API server that never answers must not
    // hold start-up past the deadline.
    let found = match tokio::time::timeout_at(deadline, secrets.get_opt(CA_SECRET)).await {
        Err(_) => return Ok(Err(Attempt::NoAnswer)),
        Ok(Err(e)) => return Ok(Err(Attempt::Api(e))),
        Ok(Ok(found)) => found,
    };
    if let Some(secret) = found {
        write_state(&secret, namespace, state_dir, options)?;
        return Ok(Ok(Outcome::Loaded));
    }
    // The root this directory holds, or a new one, becomes the cluster's.
    CertificateAuthority::self_signed(state_dir, options.clone())?;
    let new = secret(state_dir)?;
    Ok(
        match tokio::time::timeout_at(deadline, secrets.create(&PostParams::default(), &new)).await
        {
            Err(_) => Err(Attempt::NoAnswer),
            Ok(Err(e)) => Err(Attempt::Api(e)),
            Ok(Ok(_)) => Ok(Outcome::Created),
        },
    )
}

fn write_state(
    secret: &Secret,
    namespace: &str,
    state_dir: &Path,
    options: &CaOptions,
) -> Result<(), CaSecretError> {
    let data = secret.data.clone().unwrap_or_default();
    let mut files = Vec::new();
    for (key, mode) in [(CA_CERT_FILE, 0o644), (CA_KEY_FILE, 0o600)] {
        let value =
            data.get(key)
                .filter(|v| !v.0.is_empty())
                .ok_or_else(|| CaSecretError::MissingKey {
                    namespace: namespace.to_string(),
                    key,
                })?;
        files.push((key, value.0.clone(), mode));
    }
    // Loaded in a scratch directory first: a Secret that does not make a CA leaves the state
    // directory as it was.
    let scratch = state_dir.join(".ca-secret");
    std::fs::create_dir_all(&scratch).map_err(|source| CaSecretError::Write {
        path: scratch.clone(),
        source,
    })?;
    for (key, bytes, mode) in &files {
        write_file(&scratch.join(key), bytes, *mode)?;
    }
    let loaded = CertificateAuthority::self_signed(&scratch, options.clone());
    if let Err(source) = loaded {
        let _ = std::fs::remove_dir_all(&scratch);
        return Err(CaSecretError::Unusable {
            namespace: namespace.to_string(),
            source,
        });
    }
    for (key, _, _) in &files {
        let (from, to) = (scratch.join(key), state_dir.join(key));
        std::fs::rename(&from, &to).map_err(|source| CaSecretError::Write { path: to, source })?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    tracing::info!(
        secret = CA_SECRET,
        namespace,
        "using the cluster's self-signed root"
    );
    Ok(())
}

fn secret(state_dir: &Path) -> Result<Secret, CaSecretError> {
    let mut data = BTreeMap::new();
    for key in [CA_CERT_FILE, CA_KEY_FILE] {
        let path = state_dir.join(key);
        let bytes = std::fs::read(&path).map_err(|source| CaSecretError::Read { path, source })?;
        data.insert(key.to_string(), ByteString(bytes));
    }
    for key in EMPTY_KEYS {
        data.insert(key.to_string(), ByteString(Vec::new()));
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.to_string()),
            ..Default::default()
        },
        type_: Some(CA_SECRET_TYPE.to_string()),
        data: Some(data),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
