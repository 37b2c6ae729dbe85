//! ztunnel's configuration, read from environment variables with Istio's names and defaults
//! (upstream ztunnel `src/config.rs`, docs/compatibility.md, process model and defaults).
//!
//! [`Config::from_env`] reads the process environment; [`Config::from_vars`] reads any list of
//! `(name, value)` pairs so that tests never touch the process environment. Every bad value is
//! collected and reported at once in one [`ConfigError`]. The result is `Serialize` (camelCase)
//! for the admin `/config_dump`.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Serialize, Serializer};

#[cfg(test)]
mod tests;

/// xDS server address; an empty value disables xDS. Without a scheme (`istiod.istio-system.svc:15012`,
/// as Istio's values files write it) it is `https://`.
pub const XDS_ADDRESS: &str = "XDS_ADDRESS";
/// CA (certificate service) address; without a scheme, `https://`.
pub const CA_ADDRESS: &str = "CA_ADDRESS";
/// Cluster id sent to the CA and in xDS metadata.
pub const CLUSTER_ID: &str = "CLUSTER_ID";
/// Fallback name of [`CLUSTER_ID`], as set by istio-agent style deployments.
pub const ISTIO_META_CLUSTER_ID: &str = "ISTIO_META_CLUSTER_ID";
/// DNS domain of the cluster.
pub const CLUSTER_DOMAIN: &str = "CLUSTER_DOMAIN";
/// Requested lifetime of workload certificates.
pub const SECRET_TTL: &str = "SECRET_TTL";
/// Streams per pooled HBONE connection before a new one is opened.
pub const POOL_MAX_STREAMS_PER_CONNECTION: &str = "POOL_MAX_STREAMS_PER_CONNECTION";
/// Idle time after which a pooled HBONE connection is closed.
pub const POOL_UNUSED_RELEASE_TIMEOUT: &str = "POOL_UNUSED_RELEASE_TIMEOUT";
/// HTTP/2 per-stream flow-control window.
pub const HTTP2_STREAM_WINDOW_SIZE: &str = "HTTP2_STREAM_WINDOW_SIZE";
/// HTTP/2 per-connection flow-control window.
pub const HTTP2_CONNECTION_WINDOW_SIZE: &str = "HTTP2_CONNECTION_WINDOW_SIZE";
/// HTTP/2 maximum frame size.
pub const HTTP2_FRAME_SIZE: &str = "HTTP2_FRAME_SIZE";
/// TCP keepalive idle time.
pub const KEEPALIVE_TIME: &str = "KEEPALIVE_TIME";
/// TCP keepalive probe interval.
pub const KEEPALIVE_INTERVAL: &str = "KEEPALIVE_INTERVAL";
/// TCP keepalive probe count.
pub const KEEPALIVE_RETRIES: &str = "KEEPALIVE_RETRIES";
/// Whether TCP keepalive is enabled.
pub const KEEPALIVE_ENABLED: &str = "KEEPALIVE_ENABLED";
/// Path of the ZDS unix socket served by the CNI node agent.
pub const INPOD_UDS: &str = "INPOD_UDS";
/// Whether in-pod listeners set `SO_REUSEPORT`.
pub const INPOD_PORT_REUSE: &str = "INPOD_PORT_REUSE";
/// `shared` (one ztunnel per node, in-pod mode) or `dedicated` (one workload).
pub const PROXY_MODE: &str = "PROXY_MODE";
/// `SO_MARK` put on every ztunnel socket.
pub const PACKET_MARK: &str = "PACKET_MARK";
/// Static YAML workloads/services/policies, used instead of (or beside) xDS.
pub const LOCAL_XDS_PATH: &str = "LOCAL_XDS_PATH";
/// Whether workloads are fetched on demand instead of all at once.
pub const XDS_ON_DEMAND: &str = "XDS_ON_DEMAND";
/// Explicit drain deadline after SIGTERM.
pub const CONNECTION_TERMINATION_DEADLINE: &str = "CONNECTION_TERMINATION_DEADLINE";
/// The pod's `terminationGracePeriodSeconds` (downward API), used to derive the drain deadline.
pub const TERMINATION_GRACE_PERIOD_SECONDS: &str = "TERMINATION_GRACE_PERIOD_SECONDS";
/// Root certificate file used to verify the xDS server.
pub const XDS_ROOT_CA: &str = "XDS_ROOT_CA";
/// Root certificate file used to verify the CA.
pub const CA_ROOT_CA: &str = "CA_ROOT_CA";
/// Kubernetes service-account token file presented to istiod.
pub const AUTH_TOKEN: &str = "AUTH_TOKEN";
/// Network of this node.
pub const NETWORK: &str = "NETWORK";
/// Node this ztunnel runs on.
pub const NODE_NAME: &str = "NODE_NAME";
/// ztunnel's own pod name.
pub const POD_NAME: &str = "POD_NAME";
/// ztunnel's own namespace.
pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
/// ztunnel's own pod IP.
pub const INSTANCE_IP: &str = "INSTANCE_IP";
/// Dial the application from the client's IP (`IP_TRANSPARENT`) on inbound: `true` requires
/// it, `false` dials from the pod's own address; unset (the default) spoofs when the kernel
/// allows it, as upstream.
pub const ENABLE_ORIG_SRC: &str = "ENABLE_ORIG_SRC";
/// Data-plane worker threads (default: max(ceil(cores / 4), 2), as upstream without a CPU limit).
pub const ZTUNNEL_WORKER_THREADS: &str = "ZTUNNEL_WORKER_THREADS";
/// Set inside Kubernetes; selects the in-cluster istiod default.
pub const KUBERNETES_SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";

/// istiod's address inside Kubernetes.
pub const DEFAULT_ISTIOD_ADDRESS: &str = "https://istiod.istio-system.svc:15012";
/// istiod's address outside Kubernetes.
pub const DEFAULT_LOCAL_ISTIOD_ADDRESS: &str = "https://localhost:15012";
/// Default [`CLUSTER_ID`].
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";
/// Default [`CLUSTER_DOMAIN`].
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// Default [`SECRET_TTL`]: 24 h.
pub const DEFAULT_SECRET_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default [`POOL_MAX_STREAMS_PER_CONNECTION`].
pub const DEFAULT_POOL_MAX_STREAMS: u16 = 100;
/// Default [`POOL_UNUSED_RELEASE_TIMEOUT`]: 5 min.
pub const DEFAULT_POOL_UNUSED_RELEASE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Default [`HTTP2_STREAM_WINDOW_SIZE`]: 4 MiB.
pub const DEFAULT_HTTP2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// Default [`HTTP2_CONNECTION_WINDOW_SIZE`]: 16 MiB.
pub const DEFAULT_HTTP2_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// Default [`HTTP2_FRAME_SIZE`]: 1 MiB.
pub const DEFAULT_HTTP2_FRAME_SIZE: u32 = 1024 * 1024;
/// Default [`KEEPALIVE_TIME`] and [`KEEPALIVE_INTERVAL`]: 180 s.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(180);
/// Default [`KEEPALIVE_RETRIES`].
pub const DEFAULT_KEEPALIVE_RETRIES: u32 = 9;
/// Default [`INPOD_UDS`].
pub const DEFAULT_INPOD_UDS: &str = "/var/run/ztunnel/ztunnel.sock";
/// Default [`PACKET_MARK`] in shared mode: the mark capture lets through.
pub const DEFAULT_INPOD_MARK: u32 = mesh_capture::PROXY_MARK;
/// Default drain deadline when neither drain variable is set.
pub const DEFAULT_TERMINATION_DEADLINE: Duration = Duration::from_secs(5);
/// Default root certificate file (relative, as upstream).
pub const DEFAULT_ROOT_CERT: &str = "./var/run/secrets/istio/root-cert.pem";
/// Default service-account token file (audience `istio-ca`).
pub const DEFAULT_TOKEN: &str = "./var/run/secrets/tokens/istio-token";

/// One environment variable with a bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VarError {
    /// The value does not parse as the expected type.
    #[error("{var}={value:?} is not {expected}")]
    Parse {
        /// Variable name.
        var: &'static str,
        /// The value found.
        value: String,
        /// What was expected, e.g. "a duration such as 30s or 5m".
        expected: &'static str,
    },
    /// The value parses but is outside what ztunnel accepts.
    #[error("{var}={value:?} is out of range: {why}")]
    OutOfRange {
        /// Variable name.
        var: &'static str,
        /// The value found.
        value: String,
        /// Why it is refused and what to set instead.
        why: &'static str,
    },
}

impl VarError {
    /// The variable this error is about.
    pub fn var(&self) -> &'static str {
        match self {
            VarError::Parse { var, .. } | VarError::OutOfRange { var, .. } => var,
        }
    }

    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            VarError::Parse { .. } => "parse",
            VarError::OutOfRange { .. } => "out_of_range",
        }
    }
}

/// The configuration could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// One or more environment variables hold bad values; all of them are listed.
    #[error("invalid ztunnel environment, fix these variables: {}", ListDisplay(.0))]
    InvalidVars(Vec<VarError>),
}

impl ConfigError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ConfigError::InvalidVars(_) => "invalid_env",
        }
    }
}

struct ListDisplay<'a>(&'a [VarError]);

impl fmt::Display for ListDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Whether this ztunnel serves a whole node or one workload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ProxyMode {
    /// One ztunnel per node serving every enrolled pod (in-pod redirection).
    #[default]
    Shared,
    /// One ztunnel for one workload.
    Dedicated,
}

impl FromStr for ProxyMode {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "shared" => Ok(ProxyMode::Shared),
            "dedicated" => Ok(ProxyMode::Dedicated),
            _ => Err(()),
        }
    }
}

/// TCP keepalive settings of proxied sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Keepalive {
    /// Idle time before the first probe.
    #[serde(serialize_with = "ser_duration")]
    pub time: Duration,
    /// Time between probes.
    #[serde(serialize_with = "ser_duration")]
    pub interval: Duration,
    /// Probes before the connection is dropped.
    pub retries: u32,
    /// Whether keepalive is set at all.
    pub enabled: bool,
}

/// HTTP/2 and pooling settings of HBONE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Http2 {
    /// Per-stream flow-control window (bytes).
    pub stream_window_size: u32,
    /// Per-connection flow-control window (bytes).
    pub connection_window_size: u32,
    /// Maximum frame size (bytes).
    pub frame_size: u32,
    /// Streams per pooled connection before another connection is opened.
    pub pool_max_streams_per_conn: u16,
    /// Idle pooled connections are closed after this long.
    #[serde(serialize_with = "ser_duration")]
    pub pool_unused_release_timeout: Duration,
}

/// Well-known ports (fixed, as in Istio).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ports {
    /// Outbound capture, in each pod's netns.
    pub outbound: u16,
    /// Inbound plaintext capture, in each pod's netns.
    pub inbound_plaintext: u16,
    /// HBONE, in each pod's netns.
    pub inbound: u16,
    /// DNS proxy (UDP and TCP), in each pod's netns.
    pub dns: u16,
    /// SOCKS5 (opt-in, 127.0.0.1).
    pub socks5: u16,
    /// Admin (localhost).
    pub admin: u16,
    /// Prometheus metrics.
    pub stats: u16,
    /// `/healthz/ready`.
    pub readiness: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            outbound: mesh_capture::OUTBOUND_CAPTURE_PORT,
            inbound_plaintext: mesh_capture::INBOUND_CAPTURE_PORT,
            inbound: mesh_capture::HBONE_PORT,
            dns: mesh_capture::DNS_CAPTURE_PORT,
            socks5: 15080,
            admin: 15000,
            stats: 15020,
            readiness: 15021,
        }
    }
}

/// Who this ztunnel is (downward API).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SelfInfo {
    /// [`NODE_NAME`].
    pub node_name: Option<String>,
    /// [`POD_NAME`].
    pub pod_name: Option<String>,
    /// [`POD_NAMESPACE`].
    pub pod_namespace: Option<String>,
    /// [`INSTANCE_IP`].
    pub instance_ip: Option<IpAddr>,
}

/// The validated configuration of ztunnel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// istiod's xDS address; `None` when [`XDS_ADDRESS`] is set to the empty string.
    pub xds_address: Option<String>,
    /// The CA address.
    pub ca_address: String,
    /// Root certificate file verifying istiod's xDS server.
    pub xds_root_cert: PathBuf,
    /// Root certificate file verifying the CA.
    pub ca_root_cert: PathBuf,
    /// Service-account token file.
    pub auth_token: PathBuf,
    /// Cluster id.
    pub cluster_id: String,
    /// Cluster DNS domain.
    pub cluster_domain: String,
    /// Network of this node ("" = default network).
    pub network: String,
    /// Requested certificate lifetime.
    #[serde(serialize_with = "ser_duration")]
    pub secret_ttl: Duration,
    /// HTTP/2 and pooling.
    pub http2: Http2,
    /// TCP keepalive.
    pub keepalive: Keepalive,
    /// ZDS socket path.
    pub inpod_uds: PathBuf,
    /// `SO_REUSEPORT` on in-pod listeners.
    pub inpod_port_reuse: bool,
    /// Shared or dedicated.
    pub proxy_mode: ProxyMode,
    /// `SO_MARK` of ztunnel sockets (always set in shared mode unless overridden).
    pub packet_mark: Option<u32>,
    /// Static configuration file.
    pub local_xds_path: Option<PathBuf>,
    /// On-demand xDS.
    pub xds_on_demand: bool,
    /// How long connections may drain after SIGTERM.
    #[serde(serialize_with = "ser_duration")]
    pub termination_deadline: Duration,
    /// Threads of the data-plane runtime.
    pub worker_threads: usize,
    /// `ENABLE_ORIG_SRC`: `None` spoofs the client's IP towards applications when possible.
    pub enable_original_source: Option<bool>,
    /// Identity of this ztunnel pod.
    pub self_info: SelfInfo,
    /// Well-known ports.
    pub ports: Ports,
}

fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_duration(*d))
}

/// Reads variables, collecting every error instead of stopping at the first.
struct Vars {
    vars: HashMap<String, String>,
    errors: Vec<VarError>,
}

impl Vars {
    fn get(&self, var: &str) -> Option<&str> {
        self.vars.get(var).map(String::as_str)
    }

    fn string(&self, var: &str, default: &str) -> String {
        self.get(var).unwrap_or(default).to_string()
    }

    fn non_empty(&self, var: &str) -> Option<String> {
        self.get(var).filter(|v| !v.is_empty()).map(str::to_string)
    }

    fn parse<T: FromStr>(&mut self, var: &'static str, expected: &'static str) -> Option<T> {
        let value = self.get(var)?.to_string();
        match value.trim().parse() {
            Ok(v) => Some(v),
            Err(_) => {
                self.errors.push(VarError::Parse {
                    var,
                    value,
                    expected,
                });
                None
            }
        }
    }

    fn bool(&mut self, var: &'static str, default: bool) -> bool {
        self.parse(var, "a boolean (true or false)")
            .unwrap_or(default)
    }

    fn duration(&mut self, var: &'static str) -> Option<Duration> {
        let value = self.get(var)?.to_string();
        match humantime::parse_duration(value.trim()) {
            Ok(d) => Some(d),
            Err(_) => {
                self.errors.push(VarError::Parse {
                    var,
                    value,
                    expected: "a duration such as 30s, 5m or 24h",
                });
                None
            }
        }
    }

    /// A positive number no larger than `max`.
    fn bounded_u32(&mut self, var: &'static str, max: u32, default: u32) -> u32 {
        let Some(v) = self.parse::<u32>(var, "a whole number of bytes") else {
            return default;
        };
        if v == 0 || v > max {
            self.errors.push(VarError::OutOfRange {
                var,
                value: v.to_string(),
                why: "HTTP/2 allows 1 to 2^31-1 for windows and 16384 to 16777215 for frames",
            });
            return default;
        }
        v
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_vars(std::env::vars())
    }

    /// Reads the given `(name, value)` pairs as if they were the environment.
    pub fn from_vars<I>(vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut v = Vars {
            vars: vars.into_iter().collect(),
            errors: Vec::new(),
        };
        let config = Config::read(&mut v);
        if v.errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::InvalidVars(v.errors))
        }
    }

    fn read(v: &mut Vars) -> Config {
        let istiod = if v.get(KUBERNETES_SERVICE_HOST).is_some() {
            DEFAULT_ISTIOD_ADDRESS
        } else {
            DEFAULT_LOCAL_ISTIOD_ADDRESS
        };
        let proxy_mode = v
            .parse(PROXY_MODE, "a proxy mode (shared or dedicated)")
            .unwrap_or_default();
        let packet_mark = v
            .parse::<u32>(PACKET_MARK, "a 32-bit mark, in decimal")
            .or((proxy_mode == ProxyMode::Shared).then_some(DEFAULT_INPOD_MARK));
        let root_cert = PathBuf::from(DEFAULT_ROOT_CERT);
        Config {
            xds_address: v
                .non_empty(XDS_ADDRESS)
                .map(|a| mesh_certs::istiod_url(&a))
                .or_else(|| {
                    // Present but empty disables xDS.
                    v.get(XDS_ADDRESS).is_none().then(|| istiod.to_string())
                }),
            ca_address: v
                .non_empty(CA_ADDRESS)
                .map_or_else(|| istiod.to_string(), |a| mesh_certs::istiod_url(&a)),
            xds_root_cert: v
                .non_empty(XDS_ROOT_CA)
                .map_or(root_cert.clone(), PathBuf::from),
            ca_root_cert: v.non_empty(CA_ROOT_CA).map_or(root_cert, PathBuf::from),
            auth_token: PathBuf::from(v.string(AUTH_TOKEN, DEFAULT_TOKEN)),
            cluster_id: v
                .non_empty(CLUSTER_ID)
                .or_else(|| v.non_empty(ISTIO_META_CLUSTER_ID))
                .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_string()),
            cluster_domain: v.string(CLUSTER_DOMAIN, DEFAULT_CLUSTER_DOMAIN),
            network: v.string(NETWORK, ""),
            secret_ttl: v.duration(SECRET_TTL).unwrap_or(DEFAULT_SECRET_TTL),
            http2: read_http2(v),
            keepalive: read_keepalive(v),
            inpod_uds: PathBuf::from(v.string(INPOD_UDS, DEFAULT_INPOD_UDS)),
            inpod_port_reuse: v.bool(INPOD_PORT_REUSE, true),
            proxy_mode,
            packet_mark,
            local_xds_path: v.non_empty(LOCAL_XDS_PATH).map(PathBuf::from),
            xds_on_demand: v.bool(XDS_ON_DEMAND, false),
            termination_deadline: read_termination_deadline(v),
            worker_threads: read_worker_threads(v),
            enable_original_source: v.parse(ENABLE_ORIG_SRC, "a boolean (true or false)"),
            self_info: SelfInfo {
                node_name: v.non_empty(NODE_NAME),
                pod_name: v.non_empty(POD_NAME),
                pod_namespace: v.non_empty(POD_NAMESPACE),
                instance_ip: v.parse(INSTANCE_IP, "an IP address"),
            },
            ports: Ports::default(),
        }
    }
}

fn read_http2(v: &mut Vars) -> Http2 {
    const MAX_WINDOW: u32 = (1 << 31) - 1;
    const MAX_FRAME: u32 = (1 << 24) - 1;
    let frame_size = v.bounded_u32(HTTP2_FRAME_SIZE, MAX_FRAME, DEFAULT_HTTP2_FRAME_SIZE);
    let frame_size = if frame_size < 16_384 {
        v.errors.push(VarError::OutOfRange {
            var: HTTP2_FRAME_SIZE,
            value: frame_size.to_string(),
            why: "HTTP/2 frames are at least 16384 bytes",
        });
        DEFAULT_HTTP2_FRAME_SIZE
    } else {
        frame_size
    };
    let pool_max_streams_per_conn = match v.parse::<u16>(
        POOL_MAX_STREAMS_PER_CONNECTION,
        "a stream count between 1 and 65535",
    ) {
        Some(0) => {
            v.errors.push(VarError::OutOfRange {
                var: POOL_MAX_STREAMS_PER_CONNECTION,
                value: "0".to_string(),
                why: "a connection must carry at least one stream; the default is 100",
            });
            DEFAULT_POOL_MAX_STREAMS
        }
        Some(n) => n,
        None => DEFAULT_POOL_MAX_STREAMS,
    };
    Http2 {
        stream_window_size: v.bounded_u32(
            HTTP2_STREAM_WINDOW_SIZE,
            MAX_WINDOW,
            DEFAULT_HTTP2_STREAM_WINDOW,
        ),
        connection_window_size: v.bounded_u32(
            HTTP2_CONNECTION_WINDOW_SIZE,
            MAX_WINDOW,
            DEFAULT_HTTP2_CONNECTION_WINDOW,
        ),
        frame_size,
        pool_max_streams_per_conn,
        pool_unused_release_timeout: v
            .duration(POOL_UNUSED_RELEASE_TIMEOUT)
            .unwrap_or(DEFAULT_POOL_UNUSED_RELEASE_TIMEOUT),
    }
}

fn read_keepalive(v: &mut Vars) -> Keepalive {
    Keepalive {
        time: v.duration(KEEPALIVE_TIME).unwrap_or(DEFAULT_KEEPALIVE),
        interval: v.duration(KEEPALIVE_INTERVAL).unwrap_or(DEFAULT_KEEPALIVE),
        retries: v
            .parse(KEEPALIVE_RETRIES, "a whole number of probes")
            .unwrap_or(DEFAULT_KEEPALIVE_RETRIES),
        enabled: v.bool(KEEPALIVE_ENABLED, true),
    }
}

/// [`ZTUNNEL_WORKER_THREADS`] if set (at least 1); else a quarter of the cores, at least 2.
fn read_worker_threads(v: &mut Vars) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let default = cores.div_ceil(4).max(2);
    match v.parse::<usize>(ZTUNNEL_WORKER_THREADS, "a positive number of threads") {
        Some(0) => {
            v.errors.push(VarError::OutOfRange {
                var: ZTUNNEL_WORKER_THREADS,
                value: "0".to_string(),
                why: "at least one worker thread is needed",
            });
            default
        }
        Some(n) => n,
        None => default,
    }
}

/// [`CONNECTION_TERMINATION_DEADLINE`] if set; else [`TERMINATION_GRACE_PERIOD_SECONDS`] minus
/// 5 s (minus 1 s when the grace period is 10 s or less), leaving time before Kubernetes'
/// SIGKILL; else [`DEFAULT_TERMINATION_DEADLINE`].
fn read_termination_deadline(v: &mut Vars) -> Duration {
    if let Some(d) = v.duration(CONNECTION_TERMINATION_DEADLINE) {
        return d;
    }
    match v.parse::<u64>(
        TERMINATION_GRACE_PERIOD_SECONDS,
        "a whole number of seconds",
    ) {
        Some(grace) => Duration::from_secs(termination_from_grace(grace)),
        None => DEFAULT_TERMINATION_DEADLINE,
    }
}

/// The drain deadline (seconds) derived from a grace period (seconds).
pub fn termination_from_grace(grace: u64) -> u64 {
    if grace > 10 {
        grace - 5
    } else {
        grace.saturating_sub(1)
    }
}
