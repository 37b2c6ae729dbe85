//! The plugin's kubeconfig, written by install-cni from the pod's service account as Istio's
//! installer writes it: the API server from `KUBERNETES_SERVICE_HOST` /
//! `KUBERNETES_SERVICE_PORT`, its CA from the service account's `ca.crt`, and the account's
//! token. It is rewritten when the token rotates.

use std::path::{Path, PathBuf};

use super::InstallError;

/// Where Kubernetes mounts a pod's service account.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Where the plugin's kubeconfig goes on the host.
pub const DEFAULT_KUBECONFIG: &str = "/var/run/istio-cni/istio-cni-kubeconfig";

/// Where to read the service account and reach the API server.
#[derive(Debug, Clone)]
pub struct ServiceAccount {
    /// Holds `token` and `ca.crt`.
    pub dir: PathBuf,
    /// `KUBERNETES_SERVICE_HOST` (an IPv6 address is bracketed in the URL).
    pub host: String,
    /// `KUBERNETES_SERVICE_PORT`.
    pub port: String,
}

impl ServiceAccount {
    /// The pod's own, when running in a pod (`KUBERNETES_SERVICE_HOST` set).
    pub fn in_cluster() -> Option<ServiceAccount> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .ok()
            .filter(|h| !h.is_empty())?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "443".into());
        Some(ServiceAccount {
            dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
            host,
            port,
        })
    }

    /// The kubeconfig for the account as it is now.
    pub fn kubeconfig(&self) -> Result<String, InstallError> {
        let read = |name: &str| -> Result<String, InstallError> {
            let path = self.dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(|source| InstallError::Io {
                path: path.clone(),
                source,
            })?;
            let text = text.trim().to_string();
            if text.is_empty() {
                return Err(InstallError::Invalid {
                    path,
                    problem: "is empty".into(),
                });
            }
            Ok(text)
        };
        let token = read("token")?;
        let ca = read("ca.crt")?;
        Ok(render(&self.server(), &ca, &token))
    }

    fn server(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("https://[{}]:{}", self.host, self.port)
        } else {
            format!("https://{}:{}", self.host, self.port)
        }
    }
}

/// A kubeconfig with one cluster, user and context, all named `istio-cni`.
fn render(server: &str, ca_pem: &str, token: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(format!("{ca_pem}\n"));
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "istio-cni", "user": {"token": token}}],
        "contexts": [{"name": "istio-cni-context", "context": {"cluster": "local", "user": "istio-cni"}}],
        "current-context": "istio-cni-context",
    });
    // JSON is YAML; one line per field keeps it readable.
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

/// Whether `path` holds `contents`.
pub(crate) fn holds(path: &Path, contents: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|c| c == contents)
}
