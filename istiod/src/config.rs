//! istiod's command line and environment (Istio's variable names where they exist).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;

/// The ambient control plane: serves workloads, services and L4 policies to ztunnels over delta
/// xDS, and certificates over Istio's CA API.
#[derive(Debug, Clone, Parser, Serialize)]
// A flag given twice takes its last value, as Go's flags do (a chart's argument and the user's
// extraContainerArgs may both name one).
#[command(name = "istiod", version, about, args_override_self = true)]
pub struct Config {
    /// Directory of Kubernetes YAML to read and watch (the local, embedded mode). Without it,
    /// istiod reads the Kubernetes API: `--kubeconfig`, else the in-cluster configuration.
    #[arg(long, env = "ISTIOD_CONFIG_DIR", conflicts_with = "kubeconfig")]
    pub config_dir: Option<PathBuf>,

    /// A kubeconfig file: read the cluster from the Kubernetes API it names.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Where istiod keeps its own state: the self-signed root CA and the published root cert.
    #[arg(long, env = "ISTIOD_STATE_DIR", default_value = "/var/lib/istiod")]
    pub state_dir: PathBuf,

    /// A plugged-in CA (ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem), like Istio's
    /// `cacerts` secret. Without it istiod generates a self-signed root in the state dir.
    #[arg(long, env = "ISTIOD_CACERTS_DIR")]
    pub cacerts_dir: Option<PathBuf>,

    /// How often the plugged-in CA's files are looked at for a new CA (a rotated root or
    /// intermediate), which is then used without a restart.
    #[arg(long, env = "ISTIOD_CACERTS_POLL", default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub cacerts_poll: Duration,

    /// Bearer tokens accepted from proxies in the local mode (YAML: tokens[].{token, identity,
    /// node, expires}); required with --config-dir. On Kubernetes, callers present
    /// service-account tokens, checked by TokenReview.
    #[arg(long, env = "ISTIOD_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,

    /// Audiences a service-account token must carry for the CA and xDS on 15012 (Kubernetes).
    #[arg(
        long,
        env = "TOKEN_AUDIENCES",
        value_delimiter = ',',
        default_value = "istio-ca"
    )]
    pub token_audiences: Vec<String>,

    /// Service accounts (`<namespace>/<name>`) of node agents that may ask for the
    /// certificates of workloads on their node (ztunnel: `istio-system/ztunnel`).
    #[arg(long, env = "CA_TRUSTED_NODE_ACCOUNTS", value_delimiter = ',')]
    pub ca_trusted_node_accounts: Vec<String>,

    /// This istiod's name among its replicas: the holder identity in leader-election locks.
    #[arg(long, env = "POD_NAME", default_value_t = default_pod_name())]
    pub pod_name: String,

    /// istiod's namespace: where its leader-election locks live.
    #[arg(long, env = "POD_NAMESPACE", default_value = "istio-system")]
    pub pod_namespace: String,

    /// The control-plane revision (`istio.io/rev`); the holder key of leader-election locks.
    #[arg(long, env = "REVISION", default_value = "default")]
    pub revision: String,

    /// Whether the controllers that write to the API run only in the elected leader.
    #[arg(long, env = "ENABLE_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_leader_election: bool,

    /// On Kubernetes, write status conditions: waypoint binding on Services and ServiceEntries,
    /// ztunnel and waypoint acceptance on AuthorizationPolicies (one writer, under the Lease
    /// `istio-status-leader`).
    #[arg(long, env = "AMBIENT_ENABLE_STATUS", default_value_t = true, action = clap::ArgAction::Set)]
    pub ambient_enable_status: bool,

    /// Plaintext xDS.
    #[arg(long, env = "ISTIOD_GRPC_ADDR", default_value = "0.0.0.0:15010")]
    pub grpc_addr: SocketAddr,

    /// xDS and CA over TLS (serving certificate from istiod's own CA).
    #[arg(long, env = "ISTIOD_SECURE_GRPC_ADDR", default_value = "0.0.0.0:15012")]
    pub secure_grpc_addr: SocketAddr,

    /// Prometheus metrics (`/metrics`).
    #[arg(long, env = "ISTIOD_MONITORING_ADDR", default_value = "0.0.0.0:15014")]
    pub monitoring_addr: SocketAddr,

    /// The validating admission webhook (`/validate`, TLS with the serving certificate).
    #[arg(long, env = "ISTIOD_WEBHOOK_ADDR", default_value = "0.0.0.0:15017")]
    pub webhook_addr: SocketAddr,

    /// Debug endpoints (`/debug/syncz`, `/debug/configz`) and `/ready`.
    #[arg(long, env = "ISTIOD_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,

    /// Quiet period before a push: changes closer together than this are merged.
    #[arg(long, env = "PILOT_DEBOUNCE_AFTER", default_value = "100ms", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub debounce_after: Duration,

    /// Upper bound on how long a push may be delayed by a stream of changes.
    #[arg(long, env = "PILOT_DEBOUNCE_MAX", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub debounce_max: Duration,

    /// Full-state pushes in flight at once; 0 means Istio's default `min(15 + 5 x cores, 100)`.
    #[arg(long, env = "PILOT_PUSH_THROTTLE", default_value_t = 0)]
    pub push_throttle: usize,

    /// Bytes of full-state responses in flight at once, whatever their number (about half of
    /// the transient memory they take); 0 means 32 MiB.
    #[arg(long, env = "PUSH_BYTES_IN_FLIGHT", default_value_t = 0)]
    pub push_bytes_in_flight: usize,

    /// Cluster id written into workload uids (`<cluster>//Pod/<ns>/<name>`).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,

    /// SPIFFE trust domain of issued identities.
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,

    /// DNS suffix of Kubernetes services (`<svc>.<ns>.svc.<suffix>`).
    #[arg(long, env = "DOMAIN_SUFFIX", default_value = "cluster.local")]
    pub domain_suffix: String,

    /// Where waypoints write one access log line per request, in Istio's default text format
    /// (mesh config `accessLogFile`: empty, Istio's default, writes none; its demo profile
    /// sets `/dev/stdout`).
    #[arg(long, env = "ACCESS_LOG_FILE", default_value = "")]
    pub access_log_file: String,

    /// Sidecars send destinations outside the registry to the black hole: set only by the mesh
    /// config's `outboundTrafficPolicy.mode: REGISTRY_ONLY` (ALLOW_ANY otherwise).
    #[arg(skip)]
    pub outbound_registry_only: bool,

    /// Sidecars reach endpoints that take HBONE (ambient pods) through HBONE with their own
    /// identity (Istio's flag of this name; on, as with ambient enabled).
    #[arg(long, env = "PILOT_ENABLE_SENDING_HBONE", default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_sending_hbone: bool,

    /// Sidecars of pods labelled `networking.istio.io/tunnel: http` (the injector's label when
    /// the proxy metadata says `ISTIO_META_ENABLE_HBONE`) accept HBONE on 15008 (Istio's flag of
    /// this name; on, as with ambient enabled).
    #[arg(long, env = "PILOT_ENABLE_SIDECAR_LISTENING_HBONE", default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_sidecar_listening_hbone: bool,

    /// Namespace whose selector-less policies apply mesh-wide.
    #[arg(long, env = "ROOT_NAMESPACE", default_value = "istio-system")]
    pub root_namespace: String,

    /// Network of workloads that do not name one.
    #[arg(long, env = "NETWORK", default_value = "")]
    pub network: String,

    /// HTTP/2 PING interval on the xDS and CA connections (Istio's flag of this name); a
    /// connection whose PING goes unanswered for `--keepaliveTimeout` is closed, so a proxy that
    /// vanished without closing its connection does not hold istiod's state for it.
    #[arg(long = "keepaliveInterval", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,

    /// How long a keepalive PING may go unanswered (Istio's flag of this name).
    #[arg(long = "keepaliveTimeout", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,

    /// Connections older than this are sent GOAWAY, then closed 10 s (plus up to a tenth of the
    /// age, at random) later, so that proxies spread again over istiod's replicas (Istio's flag
    /// of this name; unset or 0: never. Istio's chart passes `keepaliveMaxServerConnectionAge`,
    /// 30m).
    #[arg(long = "keepaliveMaxServerConnectionAge", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde::option")]
    pub keepalive_max_server_connection_age: Option<Duration>,

    /// Longest certificate lifetime the CA issues; longer requests are capped.
    #[arg(long, env = "MAX_WORKLOAD_CERT_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub max_workload_cert_ttl: Duration,

    /// The sidecar injector's configuration: `values` (the istiod chart's values, JSON) and
    /// `config` (`policy: enabled|disabled`), as the `istio-sidecar-injector` ConfigMap mounts
    /// them; missing files mean Istio's defaults.
    #[arg(
        long,
        env = "ISTIOD_INJECT_DIR",
        default_value = "/var/lib/istio/inject"
    )]
    pub inject_dir: std::path::PathBuf,

    /// DNS names on istiod's serving certificate (15012).
    #[arg(
        long,
        env = "ISTIOD_SERVING_DNS_NAMES",
        value_delimiter = ',',
        default_value = "istiod.istio-system.svc,istiod.istio-system.svc.cluster.local,localhost"
    )]
    pub serving_dns_names: Vec<String>,

    /// IP addresses on istiod's serving certificate (15012), for proxies that reach istiod by
    /// address (the local mode has no cluster DNS).
    #[arg(
        long,
        env = "ISTIOD_SERVING_IPS",
        value_delimiter = ',',
        default_value = "127.0.0.1"
    )]
    pub serving_ips: Vec<std::net::IpAddr>,
}

/// The host name, as a pod's name is its host name.
fn default_pod_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "istiod".to_string())
}

/// Serializes durations as humantime strings ("100ms") in `/debug/config_dump`-style output.
mod humantime_serde {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    /// An optional duration: the string, or null.
    pub mod option {
        use std::time::Duration;

        pub fn serialize<S: serde::Serializer>(
            d: &Option<Duration>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }
    }
}

/// A configuration that parses but cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Invalid(String),
}

impl ConfigError {
    pub fn reason(&self) -> &'static str {
        "invalid"
    }
}

impl Config {
    /// Checks every value and reports all problems at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        match (&self.config_dir, &self.kubeconfig) {
            (Some(dir), _) if !dir.is_dir() => problems.push(format!(
                "--config-dir / ISTIOD_CONFIG_DIR {} is not a directory",
                dir.display()
            )),
            (None, Some(file)) if !file.is_file() => problems.push(format!(
                "--kubeconfig / KUBECONFIG {} does not exist",
                file.display()
            )),
            (None, None) if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() => {
                problems.push(
                    "no cluster to read: give --config-dir (a YAML directory), --kubeconfig, or run in a pod (KUBERNETES_SERVICE_HOST)".into(),
                )
            }
            _ => {}
        }
        match &self.tokens_file {
            Some(file) if !file.is_file() => problems.push(format!(
                "--tokens-file / ISTIOD_TOKENS_FILE {} does not exist",
                file.display()
            )),
            None if self.config_dir.is_some() => problems.push(
                "--tokens-file / ISTIOD_TOKENS_FILE is required with --config-dir (the local mode has no TokenReview)".into(),
            ),
            _ => {}
        }
        if self.token_audiences.iter().all(|a| a.trim().is_empty()) {
            problems.push("TOKEN_AUDIENCES must name at least one audience".to_string());
        }
        if let Err(e) = crate::ca::parse_node_accounts(&self.ca_trusted_node_accounts) {
            problems.push(e);
        }
        for (flag, value) in [
            ("--keepaliveInterval", self.keepalive_interval),
            ("--keepaliveTimeout", self.keepalive_timeout),
        ] {
            if value.is_zero() {
                problems.push(format!("{flag} must be > 0"));
            }
        }
        if self.debounce_after.is_zero() || self.debounce_after > self.debounce_max {
            problems.push(format!(
                "PILOT_DEBOUNCE_AFTER ({:?}) must be > 0 and <= PILOT_DEBOUNCE_MAX ({:?})",
                self.debounce_after, self.debounce_max
            ));
        }
        if self.trust_domain.is_empty() || self.trust_domain.contains('/') {
            problems.push(format!(
                "TRUST_DOMAIN {:?} is not a valid trust domain",
                self.trust_domain
            ));
        }
        if self.max_workload_cert_ttl < Duration::from_secs(60) {
            problems.push("MAX_WORKLOAD_CERT_TTL must be at least 1m".to_string());
        }
        if self.cluster_id.is_empty() {
            problems.push("CLUSTER_ID must not be empty".to_string());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(format!(
                "invalid configuration:\n  - {}",
                problems.join("\n  - ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_every_problem_at_once() {
        let cfg = Config::try_parse_from([
            "istiod",
            "--config-dir=/nonexistent",
            "--tokens-file=/nonexistent",
            "--debounce-after=20s",
            "--trust-domain=a/b",
            "--keepaliveTimeout=0s",
        ])
        .expect("parses");
        let err = cfg.validate().expect_err("invalid").to_string();
        for needle in [
            "--keepaliveTimeout",
            "ISTIOD_CONFIG_DIR",
            "ISTIOD_TOKENS_FILE",
            "PILOT_DEBOUNCE_AFTER",
            "TRUST_DOMAIN",
        ] {
            assert!(err.contains(needle), "{needle} missing in {err}");
        }
    }

    #[test]
    fn defaults_match_istio() {
        let cfg = Config::try_parse_from(["istiod", "--config-dir=.", "--tokens-file=x"])
            .expect("parses");
        assert_eq!(cfg.grpc_addr.port(), 15010);
        assert_eq!(cfg.secure_grpc_addr.port(), 15012);
        assert_eq!(cfg.monitoring_addr.port(), 15014);
        assert_eq!(cfg.debounce_after, Duration::from_millis(100));
        assert_eq!(cfg.debounce_max, Duration::from_secs(10));
        assert_eq!(cfg.cluster_id, "Kubernetes");
        assert_eq!(cfg.keepalive_interval, Duration::from_secs(30));
        assert_eq!(cfg.keepalive_timeout, Duration::from_secs(10));
        assert_eq!(cfg.keepalive_max_server_connection_age, None);
        let cfg = Config::try_parse_from([
            "istiod",
            "--config-dir=.",
            "--keepaliveMaxServerConnectionAge",
            "30m",
        ])
        .expect("parses");
        assert_eq!(
            cfg.keepalive_max_server_connection_age,
            Some(Duration::from_secs(1800))
        );
        // Go's duration strings, as Istio's chart values are written.
        let cfg = Config::try_parse_from([
            "istiod",
            "--config-dir=.",
            "--keepaliveMaxServerConnectionAge=1h30m",
            "--keepaliveInterval=15s",
            "--keepaliveInterval=20s",
        ])
        .expect("a flag given twice takes its last value");
        assert_eq!(
            cfg.keepalive_max_server_connection_age,
            Some(Duration::from_secs(5400))
        );
        assert_eq!(cfg.keepalive_interval, Duration::from_secs(20));
        // Lists still gather every occurrence.
        let cfg = Config::try_parse_from([
            "istiod",
            "--config-dir=.",
            "--serving-dns-names=a.example",
            "--serving-dns-names=b.example,c.example",
        ])
        .expect("parses");
        assert_eq!(
            cfg.serving_dns_names,
            ["a.example", "b.example", "c.example"]
        );
    }
}
