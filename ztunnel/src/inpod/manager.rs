//! The workload manager: keeps a ZDS connection to the node agent (reconnecting with backoff),
//! applies its requests to the pod table and acks each one in order.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use mesh_runtime::metrics::Metrics;
use tokio::time::Instant;

use super::pods::Pods;
use super::protocol::{ZdsConnection, ZdsError};
use super::status::{InPodMetrics, InPodStatus};
use crate::config::Config;
use crate::proxy::PodProxyStarter;

/// First reconnect delay; doubled per failure up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(10);
/// Longest reconnect delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(15);
/// How often a pod proxy that failed to start is retried.
pub const RETRY_PENDING: Duration = Duration::from_secs(5);

/// Runs ztunnel's in-pod mode: the pods the node agent hands over get a proxy in their netns.
pub struct InPodManager {
    config: Arc<Config>,
    pods: Pods,
    status: InPodStatus,
    backoff: Duration,
}

impl std::fmt::Debug for InPodManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InPodManager")
            .field("uds", &self.config.inpod_uds)
            .finish_non_exhaustive()
    }
}

impl InPodManager {
    /// A manager connecting to `config.inpod_uds`; its metrics go to `metrics`.
    pub fn new(
        config: Arc<Config>,
        starter: Arc<dyn PodProxyStarter>,
        metrics: &Metrics,
    ) -> InPodManager {
        let status = InPodStatus::new();
        let metrics = InPodMetrics::register(metrics);
        let pods = Pods::new(Arc::clone(&config), starter, metrics, status.clone());
        InPodManager {
            config,
            pods,
            status,
            backoff: INITIAL_BACKOFF,
        }
    }

    /// Readiness and pod states.
    pub fn status(&self) -> InPodStatus {
        self.status.clone()
    }

    /// Serves the node agent until `shutdown` resolves, then drains every pod proxy
    /// (concurrently, each with `termination_deadline`) and returns.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let conn = tokio::select! {
                biased;
                () = &mut shutdown => break,
                conn = self.connect() => conn,
            };
            tracing::info!(uds = %self.config.inpod_uds.display(), "connected to the node agent");
            let result = tokio::select! {
                biased;
                () = &mut shutdown => break,
                r = self.serve(&conn) => r,
            };
            self.status.set_ready(false);
            match result {
                Ok(()) => tracing::info!("the node agent closed the ZDS connection; reconnecting"),
                Err(e) => {
                    tracing::warn!(error = %e, reason = e.reason(), "ZDS connection failed; reconnecting")
                }
            }
            if self.pods.snapshot_received() {
                self.backoff = INITIAL_BACKOFF;
            } else {
                // It hung up before the snapshot: do not hammer it.
                self.sleep_backoff().await;
            }
        }
        self.status.set_ready(false);
        tracing::info!("in-pod manager shutting down");
        self.pods.drain_all().await;
    }

    /// Connects, retrying with backoff.
    async fn connect(&mut self) -> ZdsConnection {
        loop {
            match ZdsConnection::connect(&self.config.inpod_uds) {
                Ok(conn) => return conn,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?self.backoff, "cannot reach the node agent");
                    self.sleep_backoff().await;
                }
            }
        }
    }

    async fn sleep_backoff(&mut self) {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// One connection: hello, then a request/ack loop until it closes.
    async fn serve(&mut self, conn: &ZdsConnection) -> Result<(), ZdsError> {
        self.pods.new_connection();
        conn.send_hello().await?;
        let mut retry_at: Option<Instant> = None;
        loop {
            let received = tokio::select! {
                r = conn.recv() => r?,
                () = sleep_until(retry_at) => {
                    self.pods.retry_pending();
                    retry_at = self.pods.has_pending().then(|| Instant::now() + RETRY_PENDING);
                    self.update_ready();
                    continue;
                }
            };
            let Some(received) = received else {
                return Ok(());
            };
            let result = match received {
                Ok(msg) => {
                    tracing::debug!(?msg, "ZDS request");
                    self.pods.handle(msg).map_err(|e| {
                        tracing::warn!(error = %e, reason = e.reason(), "NACK");
                        e.to_string()
                    })
                }
                Err(invalid) => {
                    tracing::warn!(error = %invalid, reason = invalid.reason(), "invalid ZDS message; NACK");
                    Err(invalid.to_string())
                }
            };
            if self.pods.has_pending() && retry_at.is_none() {
                retry_at = Some(Instant::now() + RETRY_PENDING);
            }
            self.update_ready();
            conn.send_ack(result.err()).await?;
        }
    }

    fn update_ready(&self) {
        self.status
            .set_ready(self.pods.snapshot_received() && !self.pods.has_pending());
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
