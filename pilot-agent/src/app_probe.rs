//! The app's health probes on the status port: the injector rewrites the kubelet's HTTP, TCP
//! and gRPC probes to `GET /app-health/<container>/livez|readyz|startupz` on 15020, and the
//! agent runs the original probe against the app ([`config`] reads them), as Istio's agent:
//!
//! - to the pod's IP (`INSTANCE_IP`; `localhost` with
//!   `REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION=true`), from `127.0.0.6` (`::6` for an IPv6
//!   pod): the capture lets that source through to the app instead of sending it to the
//!   proxy's inbound side;
//! - HTTP: a GET of the probe's path with the kubelet's headers (its `Host`, on the app's port
//!   when it named the status port), `Connection: close`, redirects followed on the same host
//!   (up to 10), TLS unverified for `scheme: HTTPS`. A 3xx answer is 200, any other status
//!   is passed on with up to 10 KiB of the body; a failure to connect or a timeout is 500;
//! - TCP: 200 when a connection opens, else 500;
//! - gRPC: `grpc.health.v1.Health/Check`: 200 for `SERVING`, else 500.
//!
//! A path under `/app-health/` without a prober is 400.

pub mod config;
mod grpc;
mod http;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use tokio::net::{TcpSocket, TcpStream};

pub use config::{parse, Action, Prober, ProberError, Probers};

/// The longest body passed back to the kubelet.
const MAX_BODY: usize = 10 * 1024;

/// Where probes go and come from.
#[derive(Clone, Debug)]
pub struct ProbeTarget {
    /// The pod's IP, or `None` for `localhost`.
    pub destination: Option<IpAddr>,
    /// `127.0.0.6` or `::6`.
    pub source: IpAddr,
}

impl ProbeTarget {
    /// Istio's choice: the pod's IP (unless `localhost` is asked for), from the inbound
    /// passthrough address of the pod's family.
    pub fn new(instance_ip: IpAddr, localhost: bool) -> ProbeTarget {
        let v6 = match instance_ip {
            IpAddr::V6(v6) => !v6.is_unicast_link_local(),
            IpAddr::V4(_) => false,
        };
        ProbeTarget {
            destination: (!localhost).then_some(instance_ip),
            source: match v6 {
                true => Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6).into(),
                false => Ipv4Addr::new(127, 0, 0, 6).into(),
            },
        }
    }

    fn addr(&self, port: u16) -> SocketAddr {
        let ip = self.destination.unwrap_or(match self.source {
            IpAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
            IpAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
        });
        SocketAddr::new(ip, port)
    }

    /// The host part of the URL (`localhost`, an IPv4 address or a bracketed IPv6 one).
    fn host(&self) -> String {
        match self.destination {
            None => "localhost".to_string(),
            Some(IpAddr::V4(v4)) => v4.to_string(),
            Some(IpAddr::V6(v6)) => format!("[{v6}]"),
        }
    }

    /// A TCP connection to the app's `port` from the passthrough source.
    async fn connect(&self, port: u16) -> std::io::Result<TcpStream> {
        let to = self.addr(port);
        let socket = match to {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        // A loopback destination keeps its own source: 127.0.0.6 cannot reach ::1.
        if to.ip().is_ipv4() == self.source.is_ipv4() {
            socket.bind(SocketAddr::new(self.source, 0))?;
        }
        socket.connect(to).await
    }
}

/// The probes and where they go.
#[derive(Clone, Debug)]
pub struct AppProbes {
    pub probers: Arc<Probers>,
    pub target: ProbeTarget,
    /// The status port (a kubelet `Host` naming it is rewritten to the app's port).
    pub status_port: u16,
}

/// What the kubelet gets back.
#[derive(Debug, PartialEq, Eq)]
pub struct ProbeAnswer {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

impl ProbeAnswer {
    fn status(status: StatusCode) -> ProbeAnswer {
        ProbeAnswer {
            status,
            body: Vec::new(),
        }
    }
}

impl AppProbes {
    /// Runs the probe of `path` with the kubelet's `headers`.
    pub async fn probe(&self, path: &str, headers: &HeaderMap) -> ProbeAnswer {
        let Some(prober) = self.probers.get(path) else {
            return ProbeAnswer {
                status: StatusCode::BAD_REQUEST,
                body: format!("app prober config does not exist for {path}\n").into_bytes(),
            };
        };
        let run = self.run(prober, headers);
        let answer = match prober.timeout {
            Some(limit) => tokio::time::timeout(limit, run)
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {limit:?}"))),
            None => run.await,
        };
        match answer {
            Ok(answer) => answer,
            Err(why) => {
                tracing::debug!(target: "probes", path, %why, "app probe failed");
                ProbeAnswer::status(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    async fn run(&self, prober: &Prober, headers: &HeaderMap) -> Result<ProbeAnswer, String> {
        match &prober.action {
            Action::Http { path, port, https } => {
                http::get(self, path, *port, *https, headers).await
            }
            Action::Tcp { port } => {
                self.target
                    .connect(*port)
                    .await
                    .map_err(|e| format!("connect to {}: {e}", self.target.addr(*port)))?;
                Ok(ProbeAnswer::status(StatusCode::OK))
            }
            Action::Grpc { port, service } => {
                let serving = grpc::check(&self.target, *port, service, headers).await?;
                Ok(ProbeAnswer::status(match serving {
                    true => StatusCode::OK,
                    false => StatusCode::INTERNAL_SERVER_ERROR,
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests;
