//! A small client of Envoy's admin API on 127.0.0.1:15000 (hyper, HTTP/1.1).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("Envoy's admin API at {url} is unreachable: {detail}; is Envoy running?")]
    Unreachable { url: String, detail: String },
    #[error("Envoy's admin API at {url} did not answer within {TIMEOUT:?}")]
    Timeout { url: String },
}

impl AdminError {
    pub fn reason(&self) -> &'static str {
        match self {
            AdminError::Unreachable { .. } => "unreachable",
            AdminError::Timeout { .. } => "timeout",
        }
    }
}

#[derive(Clone, Debug)]
pub struct EnvoyAdmin {
    base: String,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl EnvoyAdmin {
    pub fn new(port: u16) -> EnvoyAdmin {
        EnvoyAdmin {
            base: format!("http://127.0.0.1:{port}"),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// `GET path`: the status and body.
    pub async fn get(&self, path: &str) -> Result<(u16, String), AdminError> {
        self.call(http::Method::GET, path).await
    }

    /// `POST path` (admin mutations such as `/drain_listeners`).
    pub async fn post(&self, path: &str) -> Result<(u16, String), AdminError> {
        self.call(http::Method::POST, path).await
    }

    async fn call(&self, method: http::Method, path: &str) -> Result<(u16, String), AdminError> {
        let url = format!("{}{path}", self.base);
        let unreachable = |detail: String| AdminError::Unreachable {
            url: url.clone(),
            detail,
        };
        let req = http::Request::builder()
            .method(method)
            .uri(&url)
            .body(Empty::new())
            .map_err(|e| unreachable(e.to_string()))?;
        let fut = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        };
        tokio::time::timeout(TIMEOUT, fut)
            .await
            .map_err(|_| AdminError::Timeout { url: url.clone() })?
    }
}
