//! A client for the API server of a kubeconfig, or the in-cluster one.

use std::path::Path;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {path}: {detail}")]
    Kubeconfig { path: String, detail: String },
    #[error("in-cluster configuration (is KUBERNETES_SERVICE_HOST set and the service-account token mounted?): {0}")]
    InCluster(String),
    #[error("API client: {0}")]
    Client(String),
}

/// A client for the API server `kubeconfig` names (its current context), or the in-cluster
/// one (service-account token, `KUBERNETES_SERVICE_HOST`). Nothing is sent yet.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let bad = |e: &dyn std::fmt::Display| ClientError::Kubeconfig {
                path: path.display().to_string(),
                detail: e.to_string(),
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|e| bad(&e))?
        }
        None => kube::Config::incluster().map_err(|e| ClientError::InCluster(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| ClientError::Client(e.to_string()))
}
