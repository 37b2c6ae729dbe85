//! `pilot-agent wait`: the `postStart` hook the injector adds with
//! `holdApplicationUntilProxyStarts`, so the app's containers start only once the proxy is
//! ready. It polls the proxy's readiness URL (15021 `/healthz/ready`) until it answers 200,
//! with Istio's flags and defaults.

use std::time::Duration;

use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Istio's `pilot-agent wait` command line.
#[derive(Args, Debug, Clone)]
pub struct WaitArgs {
    /// The longest wait for the proxy, in seconds.
    #[arg(long = "timeoutSeconds", default_value_t = 60)]
    pub timeout_seconds: u64,
    /// How long one readiness request may take, in milliseconds.
    #[arg(long = "requestTimeoutMillis", default_value_t = 500)]
    pub request_timeout_millis: u64,
    /// The pause between requests, in milliseconds.
    #[arg(long = "periodMillis", default_value_t = 500)]
    pub period_millis: u64,
    /// The readiness URL (plain HTTP).
    #[arg(long = "url", default_value = "http://localhost:15021/healthz/ready")]
    pub url: String,
}

/// Why the wait ended without a ready proxy.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("--url {url:?} is not an http:// URL: {why}")]
    Url { url: String, why: String },
    #[error("timeout waiting for the proxy to become ready after {timeout:?}; last error: {last}")]
    Timeout { timeout: Duration, last: String },
}

/// Polls until the URL answers 200 or the time is up.
pub async fn run(args: &WaitArgs) -> Result<(), WaitError> {
    let uri: hyper::Uri = args
        .url
        .parse()
        .map_err(|e: http::uri::InvalidUri| WaitError::Url {
            url: args.url.clone(),
            why: e.to_string(),
        })?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(WaitError::Url {
            url: args.url.clone(),
            why: "want http://host[:port]/path".into(),
        });
    }
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let timeout = Duration::from_secs(args.timeout_seconds);
    let period = Duration::from_millis(args.period_millis);
    let request_timeout = Duration::from_millis(args.request_timeout_millis);
    tracing::info!(?timeout, url = %args.url, "waiting for the proxy to be ready");
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("no attempt yet");
    loop {
        tokio::time::sleep(period).await;
        if tokio::time::Instant::now() >= deadline {
            return Err(WaitError::Timeout { timeout, last });
        }
        let attempt = tokio::time::timeout(request_timeout, async {
            let response = client.get(uri.clone()).await.map_err(|e| e.to_string())?;
            let status = response.status();
            // The body is read to the end, as Istio's does.
            let _ = response.into_body().collect().await;
            match status.as_u16() {
                200 => Ok(()),
                code => Err(format!("HTTP status code {code}")),
            }
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {request_timeout:?}")));
        match attempt {
            Ok(()) => {
                tracing::info!("the proxy is ready");
                return Ok(());
            }
            Err(e) => {
                tracing::debug!(error = %e, "not ready yet");
                last = e;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::Router;

    use super::*;

    /// A readiness endpoint that answers 503 `not_ready_for` times, then 200.
    async fn endpoint(not_ready_for: usize) -> (String, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let app = Router::new().route(
            "/healthz/ready",
            get(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n < not_ready_for {
                        true => StatusCode::SERVICE_UNAVAILABLE,
                        false => StatusCode::OK,
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}/healthz/ready"), calls)
    }

    fn args(url: String, timeout_seconds: u64) -> WaitArgs {
        WaitArgs {
            timeout_seconds,
            request_timeout_millis: 500,
            period_millis: 20,
            url,
        }
    }

    #[tokio::test]
    async fn returns_once_the_proxy_answers_200() {
        let (url, calls) = endpoint(3).await;
        run(&args(url, 10)).await.expect("ready");
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn gives_up_after_the_timeout_with_the_last_error() {
        let (url, _) = endpoint(usize::MAX).await;
        let err = run(&args(url, 1)).await.expect_err("never ready");
        assert!(err.to_string().contains("HTTP status code 503"), "{err}");
        let refused = run(&args("http://127.0.0.1:1/healthz/ready".into(), 1))
            .await
            .expect_err("nothing listens");
        assert!(matches!(refused, WaitError::Timeout { .. }), "{refused}");
        let bad = run(&args("localhost:15021".into(), 1))
            .await
            .expect_err("bad url");
        assert!(bad.to_string().contains("--url"), "{bad}");
    }
}
