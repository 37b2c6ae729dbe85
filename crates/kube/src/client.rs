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
        Some(path) => from_file(path, &Default::default()).await?,
        None => kube::Config::incluster().map_err(|e| ClientError::InCluster(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| ClientError::Client(e.to_string()))
}

/// A client as kubectl and istioctl find their cluster: the `kubeconfig` given, else
/// `$KUBECONFIG`, else `~/.kube/config`, in `context` or the file's current context; with
/// none of them (and no context asked for), the in-cluster configuration.
pub async fn client_for_user(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Client, ClientError> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => from_file(path, &options).await?,
        None => match kube::Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            Err(file_error) if context.is_none() => kube::Config::incluster().map_err(|e| {
                ClientError::InCluster(format!("{e}; and no kubeconfig: {file_error}"))
            })?,
            Err(e) => {
                return Err(ClientError::Kubeconfig {
                    path: std::env::var("KUBECONFIG").unwrap_or_else(|_| "~/.kube/config".into()),
                    detail: e.to_string(),
                })
            }
        },
    };
    kube::Client::try_from(config).map_err(|e| ClientError::Client(e.to_string()))
}

async fn from_file(
    path: &Path,
    options: &kube::config::KubeConfigOptions,
) -> Result<kube::Config, ClientError> {
    let bad = |e: &dyn std::fmt::Display| ClientError::Kubeconfig {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    let file = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
    kube::Config::from_custom_kubeconfig(file, options)
        .await
        .map_err(|e| bad(&e))
}
