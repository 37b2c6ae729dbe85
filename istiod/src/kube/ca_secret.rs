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
use mesh_identity::ca::{CaOptions, CertificateAuthority, CA_CERT_FILE, CA_KEY_FILE};

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
    #[error("cannot read or create Secret {namespace}/{CA_SECRET} (gave up after {PATIENCE:?}): {source}; does istiod's Role allow get and create on secrets?")]
    Api {
        namespace: String,
        #[source]
        source: kube::Error,
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
            CaSecretError::Api { .. } => "api",
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
    let api_error = |source| CaSecretError::Api {
        namespace: namespace.to_string(),
        source,
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut delay = Duration::from_millis(250);
    loop {
        let error = match secrets.get_opt(CA_SECRET).await {
            Ok(Some(secret)) => {
                write_state(&secret, namespace, state_dir)?;
                return Ok(Outcome::Loaded);
            }
            Ok(None) => {
                // The root this directory holds, or a new one, becomes the cluster's.
                CertificateAuthority::self_signed(state_dir, options.clone())?;
                match secrets
                    .create(&PostParams::default(), &secret(state_dir)?)
                    .await
                {
                    Ok(_) => return Ok(Outcome::Created),
                    // Another replica stored its root first: take that one.
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        // A refusal (403, 422, ...) will not change by asking again.
        if let kube::Error::Api(e) = &error {
            if (400..500).contains(&e.code) && e.code != 429 {
                return Err(api_error(error));
            }
        }
        let e = error;
        if tokio::time::Instant::now() + delay > deadline {
            return Err(api_error(e));
        }
        tracing::warn!(error = %e, secret = CA_SECRET, namespace, "cannot reach the CA Secret; retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(8));
    }
}

fn write_state(secret: &Secret, namespace: &str, state_dir: &Path) -> Result<(), CaSecretError> {
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
        files.push((state_dir.join(key), value.0.clone(), mode));
    }
    for (path, bytes, mode) in files {
        write_file(&path, &bytes, mode)?;
    }
    tracing::info!(
        secret = CA_SECRET,
        namespace,
        "using the cluster's self-signed root"
    );
    Ok(())
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), CaSecretError> {
    use std::os::unix::fs::OpenOptionsExt;
    let write = |source| CaSecretError::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(write)?;
    std::io::Write::write_all(&mut file, data).map_err(write)?;
    std::fs::rename(&tmp, path).map_err(write)
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
