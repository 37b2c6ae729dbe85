//! The certificate authority in use, and its replacement when a plugged-in CA changes.
//!
//! On Kubernetes the `cacerts` Secret is mounted as a directory that the kubelet updates in
//! place. istiod looks at the four files every few seconds; when their contents change it loads
//! them as a new CA and, only if that succeeds, swaps it in: new certificates are signed by it,
//! istiod's serving certificate is re-issued, and the roots (`root-cert.pem`, which holds the
//! old and the new root while a root is rotated) go to everything that publishes them (the
//! `istio-ca-root-cert` ConfigMaps, the webhooks' `caBundle`, the root file in the state
//! directory). A directory that does not load (half written, a key that does not match) is
//! logged and counted, and the last good CA stays in use.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mesh_identity::ca::{CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE};
use mesh_identity::{CaOptions, CertificateAuthority};
use tokio::sync::watch;

/// The CA in use; cheap to read for every request.
#[derive(Debug)]
pub struct LiveCa {
    ca: watch::Sender<Arc<CertificateAuthority>>,
    roots: watch::Sender<String>,
}

impl LiveCa {
    pub fn new(ca: Arc<CertificateAuthority>) -> Arc<LiveCa> {
        let roots = watch::Sender::new(ca.root_cert_pem().to_string());
        Arc::new(LiveCa {
            ca: watch::Sender::new(ca),
            roots,
        })
    }

    /// The CA to sign with now.
    pub fn current(&self) -> Arc<CertificateAuthority> {
        self.ca.borrow().clone()
    }

    /// The roots workloads must trust now.
    pub fn root_cert_pem(&self) -> String {
        self.roots.borrow().clone()
    }

    /// Told of every new CA (a new intermediate as well as a new root).
    pub fn changes(&self) -> watch::Receiver<Arc<CertificateAuthority>> {
        self.ca.subscribe()
    }

    /// Told only when the roots change.
    pub fn roots(&self) -> watch::Receiver<String> {
        self.roots.subscribe()
    }

    /// Puts `ca` in use.
    pub fn replace(&self, ca: Arc<CertificateAuthority>) {
        let pem = ca.root_cert_pem().to_string();
        self.ca.send_replace(ca);
        let changed = self.roots.send_if_modified(|current| {
            if *current == pem {
                return false;
            }
            *current = pem;
            true
        });
        tracing::info!(
            roots_changed = changed,
            "the certificate authority was replaced"
        );
    }
}

/// Reloads of the plugged-in CA, for the metrics.
#[derive(Debug, Default)]
pub struct ReloadStats {
    reloaded: AtomicU64,
    failed: AtomicU64,
}

impl ReloadStats {
    pub fn reloaded(&self) -> u64 {
        self.reloaded.load(Ordering::Relaxed)
    }
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// The plugged-in CA's files as last read (a missing file reads as empty).
fn read_files(dir: &std::path::Path) -> Vec<Vec<u8>> {
    [CA_CERT_FILE, CA_KEY_FILE, ROOT_CERT_FILE, CERT_CHAIN_FILE]
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap_or_default())
        .collect()
}

/// Runs until dropped: looks at `dir` every `every` and swaps in the CA it holds when its
/// contents change and load.
pub async fn watch_cacerts(
    live: Arc<LiveCa>,
    dir: PathBuf,
    options: CaOptions,
    every: Duration,
    stats: Arc<ReloadStats>,
) {
    let mut seen = read_files(&dir);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now = read_files(&dir);
        if now == seen {
            continue;
        }
        seen = now;
        match CertificateAuthority::plugged_in(&dir, options.clone()) {
            Ok(ca) => {
                stats.reloaded.fetch_add(1, Ordering::Relaxed);
                tracing::info!(dir = %dir.display(), "the plugged-in CA changed; using the new one");
                live.replace(Arc::new(ca));
            }
            Err(e) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(dir = %dir.display(), error = %e, reason = e.reason(), "the plugged-in CA changed but does not load; still signing with the previous one");
            }
        }
    }
}
