//! istiod's own TLS on 15012: a serving certificate from istiod's CA that is renewed at half
//! its lifetime, and an accept loop that handshakes each connection in its own task.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use mesh_identity::tls::{provider, CertKey};
use mesh_identity::CertificateAuthority;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::live_ca::LiveCa;

/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle time before TCP keepalive probes a connection of istiod's servers.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(180);
/// Retry delay when issuing a new serving certificate fails.
const RETRY: Duration = Duration::from_secs(30);

/// Why a serving certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ServingTlsError {
    #[error("issuing istiod's serving certificate: {0}")]
    Issue(#[from] mesh_identity::CaError),
    #[error("loading istiod's serving certificate: {0}")]
    Load(#[from] mesh_identity::TlsError),
    #[error("istiod's serving key is not usable: {0}")]
    Key(rustls::Error),
    #[error("TLS configuration: {0}")]
    Config(rustls::Error),
}

impl ServingTlsError {
    pub fn reason(&self) -> &'static str {
        match self {
            ServingTlsError::Issue(_) => "issue",
            ServingTlsError::Load(_) => "load",
            ServingTlsError::Key(_) => "key",
            ServingTlsError::Config(_) => "config",
        }
    }
}

/// The current serving certificate, swapped in place on renewal.
#[derive(Debug)]
pub struct ServingCerts {
    ca: Arc<LiveCa>,
    dns_names: Vec<String>,
    ips: Vec<IpAddr>,
    current: ArcSwap<CertifiedKey>,
    not_after: ArcSwap<SystemTime>,
}

impl ServingCerts {
    /// Issues the first certificate.
    pub fn new(
        ca: Arc<LiveCa>,
        dns_names: Vec<String>,
        ips: Vec<IpAddr>,
    ) -> Result<Arc<ServingCerts>, ServingTlsError> {
        let (key, not_after) = issue(&ca.current(), &dns_names, &ips)?;
        Ok(Arc::new(ServingCerts {
            ca,
            dns_names,
            ips,
            current: ArcSwap::from_pointee(key),
            not_after: ArcSwap::from_pointee(not_after),
        }))
    }

    /// Issues a new certificate and serves it to new connections from now on.
    pub fn renew(&self) -> Result<SystemTime, ServingTlsError> {
        let (key, not_after) = issue(&self.ca.current(), &self.dns_names, &self.ips)?;
        self.current.store(Arc::new(key));
        self.not_after.store(Arc::new(not_after));
        tracing::info!(not_after = ?not_after, "renewed istiod's serving certificate");
        Ok(not_after)
    }

    /// When the current certificate expires.
    pub fn not_after(&self) -> SystemTime {
        **self.not_after.load()
    }

    /// Renews at half of the remaining lifetime, and at once when the CA is replaced, forever
    /// (until the task is dropped).
    pub async fn renew_forever(self: Arc<Self>) {
        let mut ca_changes = self.ca.changes();
        ca_changes.mark_unchanged();
        loop {
            let left = self
                .not_after()
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            tokio::select! {
                _ = tokio::time::sleep(left / 2) => {}
                changed = ca_changes.changed() => {
                    if changed.is_err() {
                        // The CA can no longer change: renew on the clock only.
                        tokio::time::sleep(left / 2).await;
                    }
                }
            }
            while let Err(e) = self.renew() {
                tracing::error!(error = %e, reason = e.reason(), "cannot renew istiod's serving certificate; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }

    /// A rustls server configuration (TLS 1.2 and 1.3, ALPN h2) serving the current certificate.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, ServingTlsError> {
        self.server_config_with_alpn(vec![b"h2".to_vec()])
    }

    /// The same with other ALPN protocols (the webhooks speak HTTP/1.1).
    pub fn server_config_with_alpn(
        self: &Arc<Self>,
        alpn: Vec<Vec<u8>>,
    ) -> Result<rustls::ServerConfig, ServingTlsError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(ServingTlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(Arc::clone(self))));
        cfg.alpn_protocols = alpn;
        Ok(cfg)
    }
}

fn issue(
    ca: &CertificateAuthority,
    dns_names: &[String],
    ips: &[IpAddr],
) -> Result<(CertifiedKey, SystemTime), ServingTlsError> {
    let names: Vec<&str> = dns_names.iter().map(String::as_str).collect();
    let serving = ca.serving_cert(&names, ips)?;
    let ck = CertKey::from_pem(&serving.chain_pem, &serving.key_pem)?;
    let key = provider()
        .key_provider
        .load_private_key(ck.key)
        .map_err(ServingTlsError::Key)?;
    Ok((CertifiedKey::new(ck.chain, key), serving.not_after))
}

#[derive(Debug)]
struct Resolver(Arc<ServingCerts>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current.load_full())
    }
}

/// Accepts TCP connections and completes each TLS handshake in its own task, so one slow or
/// broken client never holds up the others. Ends when the receiver is dropped.
pub fn tls_incoming(
    listener: TcpListener,
    config: rustls::ServerConfig,
) -> mpsc::Receiver<Result<TlsStream<TcpStream>, std::io::Error>> {
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed on the TLS port");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
            if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive) {
                tracing::debug!(%peer, error = %e, "cannot set TCP keepalive");
            }
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_identity::CaOptions;

    fn serial_served(certs: &Arc<ServingCerts>) -> Vec<u8> {
        let key = certs.current.load_full();
        key.cert[0].as_ref().to_vec()
    }

    #[test]
    fn renewal_swaps_the_served_certificate() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = CertificateAuthority::self_signed(dir.path(), CaOptions::default()).expect("ca");
        let certs = ServingCerts::new(LiveCa::new(Arc::new(ca)), vec!["localhost".into()], vec![])
            .expect("serving cert");
        let first = serial_served(&certs);
        let before = certs.not_after();
        certs.renew().expect("renew");
        assert_ne!(first, serial_served(&certs), "a new certificate is served");
        assert!(certs.not_after() >= before);
        certs.server_config().expect("rustls config");
    }
}
