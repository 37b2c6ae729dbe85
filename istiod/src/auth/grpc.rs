//! [`RequireAuth`]: a gRPC service that answers `UNAUTHENTICATED` unless the caller's
//! credential passes an [`Authenticator`] (which may have to ask the API server, so the check
//! is asynchronous, unlike a tonic interceptor).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;

use super::Authenticator;

/// Wraps `inner` so that every call is authenticated first.
#[derive(Clone)]
pub struct RequireAuth<S> {
    inner: S,
    authenticator: Arc<dyn Authenticator>,
}

impl<S> RequireAuth<S> {
    pub fn new(inner: S, authenticator: Arc<dyn Authenticator>) -> Self {
        RequireAuth {
            inner,
            authenticator,
        }
    }
}

impl<S: NamedService> NamedService for RequireAuth<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for RequireAuth<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The ready service goes with this call; a fresh clone waits for the next one.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let authenticator = self.authenticator.clone();
        Box::pin(async move {
            let md = MetadataMap::from_headers(req.headers().clone());
            match authenticator.authenticate(&md).await {
                Ok(caller) => {
                    // The service sees who called (xDS serves gateway credentials only to
                    // their own namespace's workloads).
                    let mut req = req;
                    req.extensions_mut().insert(caller);
                    inner.call(req).await
                }
                Err(e) => {
                    tracing::warn!(path = %req.uri().path(), reason = e.reason(), error = %e, "gRPC caller refused");
                    Ok(tonic::Status::unauthenticated(e.caller_message()).into_http())
                }
            }
        })
    }
}
