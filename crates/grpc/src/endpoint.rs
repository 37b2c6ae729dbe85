//! Where a channel dials: `http://host:port` (HTTP/2 over TCP, h2c) or `https://host:port`
//! (TLS 1.3 with ALPN `h2`, the server's certificate verified by name against a PEM root file).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use mesh_identity::tls::{client_config_for_server_name, parse_certs};
use mesh_identity::TlsError;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::keepalive::{self, ConnectionEnd, OpenCalls};
use crate::status::{Code, Status};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long dialing (TCP and TLS) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// gRPC's usual limit on a received message.
pub const DEFAULT_MAX_MESSAGE: usize = 4 << 20;
/// HTTP/2 receive windows, per stream and per connection: large enough that a multi-megabyte
/// xDS response is not paced by round trips.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;

/// Errors in a channel's settings, found before anything is dialed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{address:?} is not a gRPC address ({detail}); use https://<host>:<port> (or http:// for plain text)")]
    BadAddress { address: String, detail: String },
    #[error("cannot read the root certificate {path}: {detail}")]
    RootCert { path: String, detail: String },
    #[error("cannot build the TLS client: {0}")]
    Tls(#[source] TlsError),
}

impl SetupError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SetupError::BadAddress { .. } => "bad_address",
            SetupError::RootCert { .. } => "root_cert",
            SetupError::Tls(_) => "tls",
        }
    }
}

/// TLS 1.3 (ALPN `h2`) to one server name, verified against the PEM roots of a file.
#[derive(Clone)]
pub struct TlsConnector {
    connector: tokio_rustls::TlsConnector,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsConnector {
    /// Reads the roots at `root_cert_path` now; the server must be `server_name` (brackets of
    /// an IPv6 literal are dropped). `address` only names the server in errors.
    pub fn from_root_file(
        address: &str,
        root_cert_path: &Path,
        server_name: &str,
    ) -> Result<TlsConnector, SetupError> {
        let path = root_cert_path.display().to_string();
        let pem = std::fs::read_to_string(root_cert_path).map_err(|e| SetupError::RootCert {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        let roots = parse_certs(&pem, "root certificate").map_err(|e| SetupError::RootCert {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        if roots.is_empty() {
            return Err(SetupError::RootCert {
                path,
                detail: "it holds no PEM certificate".to_string(),
            });
        }
        let config = client_config_for_server_name(&roots).map_err(SetupError::Tls)?;
        let name = server_name.trim_start_matches('[').trim_end_matches(']');
        let server_name =
            ServerName::try_from(name.to_string()).map_err(|e| SetupError::BadAddress {
                address: address.to_string(),
                detail: format!("server name {name:?}: {e}"),
            })?;
        Ok(TlsConnector {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }

    /// The TLS handshake over `tcp`.
    pub async fn connect(
        &self,
        tcp: TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        self.connector.connect(self.server_name.clone(), tcp).await
    }
}

/// A server's address and how to reach it. [`Endpoint::channel`] makes the (lazily dialing)
/// [`crate::Channel`].
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) address: String,
    pub(crate) scheme: Scheme,
    pub(crate) authority: Authority,
    host: String,
    port: u16,
    tls: Option<TlsConnector>,
    connect_timeout: Duration,
    pub(crate) max_message: usize,
    stream_window: u32,
    connection_window: u32,
    ping_interval: Option<Duration>,
    ping_timeout: Duration,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("address", &self.address)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Parses `address`. For `https` the PEM roots at `root_cert_path` are read now, and the
    /// server's certificate must name `server_name` (default: the address's host).
    pub fn new(
        address: &str,
        root_cert_path: &Path,
        server_name: Option<&str>,
    ) -> Result<Endpoint, SetupError> {
        let bad = |detail: String| SetupError::BadAddress {
            address: address.to_string(),
            detail,
        };
        let uri: http::Uri = address.parse().map_err(|e| bad(format!("{e}")))?;
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| bad("no host:port".to_string()))?;
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("a path is not allowed".to_string()));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let (scheme, default_port, tls) = match uri.scheme_str() {
            Some("http") => (Scheme::HTTP, 80, None),
            Some("https") => {
                let name = server_name.unwrap_or(&host);
                let tls = TlsConnector::from_root_file(address, root_cert_path, name)?;
                (Scheme::HTTPS, 443, Some(tls))
            }
            other => return Err(bad(format!("unsupported scheme {other:?}"))),
        };
        Ok(Endpoint {
            address: address.to_string(),
            scheme,
            port: authority.port_u16().unwrap_or(default_port),
            authority,
            host,
            tls,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_message: DEFAULT_MAX_MESSAGE,
            stream_window: STREAM_WINDOW,
            connection_window: CONNECTION_WINDOW,
            ping_interval: Some(keepalive::PING_INTERVAL),
            ping_timeout: keepalive::PING_TIMEOUT,
        })
    }

    /// The largest message a call on this endpoint accepts (default 4 MiB).
    pub fn max_message(mut self, bytes: usize) -> Endpoint {
        self.max_message = bytes;
        self
    }

    /// How long dialing may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Endpoint {
        self.connect_timeout = timeout;
        self
    }

    /// HTTP/2 receive windows, per stream and per connection (default 2 MiB and 5 MiB).
    pub fn http2_windows(mut self, stream: u32, connection: u32) -> Endpoint {
        self.stream_window = stream;
        self.connection_window = connection;
        self
    }

    /// HTTP/2 PINGs while a call is open: one every `interval` (`None` or zero: never), the
    /// connection closed when one goes unanswered for `timeout` (default 30 s and 10 s, as
    /// Istio's proxies; see [`crate::keepalive`]).
    pub fn keepalive(mut self, interval: Option<Duration>, timeout: Duration) -> Endpoint {
        self.ping_interval = interval.filter(|i| !i.is_zero());
        self.ping_timeout = timeout;
        self
    }

    /// A new HTTP/2 connection, its driver spawned on the runtime. Boxed: dialing is rare, and
    /// one shared copy of its code beats copies inlined at each use.
    pub(crate) fn dial(&self) -> BoxFuture<'_, Result<Dialed, Status>> {
        Box::pin(self.dial_now())
    }

    async fn dial_now(&self) -> Result<Dialed, Status> {
        let unavailable =
            |detail: String| Status::new(Code::Unavailable, format!("{}: {detail}", self.address));
        let dialing = async {
            let tcp = keepalive::dial_tcp(&self.host, self.port)
                .await
                .map_err(|e| unavailable(format!("cannot connect: {e}")))?;
            match &self.tls {
                None => handshake(tcp, self).await,
                Some(tls) => {
                    let stream = tls
                        .connect(tcp)
                        .await
                        .map_err(|e| unavailable(format!("TLS handshake failed: {e}")))?;
                    // gRPC is HTTP/2 only: a server that did not agree to `h2` is refused now,
                    // not misread later.
                    let alpn = stream.get_ref().1.alpn_protocol();
                    if alpn != Some(b"h2".as_slice()) {
                        return Err(unavailable(format!(
                            "the server did not agree to HTTP/2 in the TLS handshake (ALPN {:?})",
                            alpn.map(String::from_utf8_lossy)
                        )));
                    }
                    handshake(stream, self).await
                }
            }
        };
        tokio::time::timeout(self.connect_timeout, dialing)
            .await
            .unwrap_or_else(|_| {
                Err(unavailable(format!(
                    "no connection within {:?}",
                    self.connect_timeout
                )))
            })
    }
}

/// A dialed connection: the sender of its requests and the count of its open calls (which
/// the connection's PINGs follow).
pub(crate) type Dialed = (h2::client::SendRequest<Bytes>, OpenCalls);

async fn handshake<T>(io: T, endpoint: &Endpoint) -> Result<Dialed, Status>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let address = &endpoint.address;
    let (send, mut connection) = h2::client::Builder::new()
        .initial_window_size(endpoint.stream_window)
        .initial_connection_window_size(endpoint.connection_window)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(|e| {
            Status::new(
                Code::Unavailable,
                format!("{address}: HTTP/2 handshake failed: {e}"),
            )
        })?;
    let calls = OpenCalls::default();
    let busy = calls.clone();
    let timeout = endpoint.ping_timeout;
    let pings = keepalive::pings(
        connection.ping_pong(),
        endpoint.ping_interval,
        timeout,
        move || busy.any(),
    );
    let address = address.to_string();
    tokio::spawn(async move {
        match keepalive::drive(connection, pings).await {
            // The dropped connection failed its calls (Unavailable); the next call dials.
            ConnectionEnd::PingTimedOut => {
                tracing::warn!(address = %address, ?timeout, "no answer to an HTTP/2 PING; closed the gRPC connection");
            }
            // Every call on the connection sees the failure itself; this is the connection's.
            ConnectionEnd::Closed(Err(e)) => {
                tracing::debug!(address = %address, error = %e, "gRPC connection ended");
            }
            ConnectionEnd::Closed(Ok(())) => {}
        }
    });
    Ok((send, calls))
}
