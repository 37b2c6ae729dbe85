//! pilot-agent's configuration: the command line (`proxy waypoint --domain ...`) plus the
//! environment the waypoint and sidecar templates set, with Istio's names and defaults.
//!
//! [`Config::from_vars`] is a pure function over `(name, value)` pairs; every bad value is
//! reported at once. Paths are relative to the working directory, as in Istio's images (which
//! run the agent in `/`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

pub const POD_NAME: &str = "POD_NAME";
pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
pub const INSTANCE_IP: &str = "INSTANCE_IP";
/// The app's rewritten probes (JSON, written by the injector).
pub const APP_PROBERS: &str = "ISTIO_KUBE_APP_PROBERS";
/// Probe the app on `localhost` rather than on the pod's IP.
pub const PROBE_LOCALHOST: &str = "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION";
/// The app's own Prometheus scrape settings, which the injector moved off the pod's
/// `prometheus.io/*` annotations (JSON `{"scrape": ..., "path": ..., "port": ...}`).
pub const PROMETHEUS_ANNOTATIONS: &str = "ISTIO_PROMETHEUS_ANNOTATIONS";
pub const SERVICE_ACCOUNT: &str = "SERVICE_ACCOUNT";
pub const TRUST_DOMAIN: &str = "TRUST_DOMAIN";
/// The CA address (`host:port` or a URL); defaults to the discovery address.
pub const CA_ADDR: &str = "CA_ADDR";
/// Mesh `defaultConfig` overrides as JSON or YAML (`discoveryAddress`, `drainDuration`, ...).
pub const PROXY_CONFIG: &str = "PROXY_CONFIG";
/// Root certificate verifying istiod's xDS and CA serving certificates.
pub const XDS_ROOT_CA: &str = "XDS_ROOT_CA";
pub const CA_ROOT_CA: &str = "CA_ROOT_CA";
/// The Envoy binary (else `envoy` on `PATH`).
pub const ENVOY_PATH: &str = "ENVOY_PATH";
/// How long in-flight requests get after SIGTERM before Envoy is stopped.
pub const TERMINATION_DRAIN_DURATION: &str = "TERMINATION_DRAIN_DURATION";
pub const SECRET_TTL: &str = "SECRET_TTL";
pub const ISTIO_META_CLUSTER_ID: &str = "ISTIO_META_CLUSTER_ID";
/// Prefix of node metadata entries (`ISTIO_META_FOO=bar` -> `FOO: "bar"`).
pub const ISTIO_META_PREFIX: &str = "ISTIO_META_";
/// Prefix of JSON node metadata entries (`ISTIO_METAJSON_LABELS={"app":"x"}`).
pub const ISTIO_METAJSON_PREFIX: &str = "ISTIO_METAJSON_";
pub const LOG_FORMAT: &str = "LOG_FORMAT";

/// Istio's default discovery (and CA) address.
pub const DEFAULT_DISCOVERY_ADDRESS: &str = "istiod.istio-system.svc:15012";
/// Files the agent reads and writes, relative to its working directory.
pub const TOKEN_PATH: &str = "var/run/secrets/tokens/istio-token";
pub const ROOT_CERT_PATH: &str = "var/run/secrets/istio/root-cert.pem";
pub const SDS_SOCKET: &str = "var/run/secrets/workload-spiffe-uds/socket";
pub const XDS_SOCKET: &str = "etc/istio/proxy/XDS";
/// The agent's access log service (request metrics), and the bootstrap cluster reaching it.
pub const TELEMETRY_SOCKET: &str = "etc/istio/proxy/telemetry";
pub const TELEMETRY_CLUSTER: &str = "agent-telemetry";
pub const BOOTSTRAP_PATH: &str = "etc/istio/proxy/envoy-rev.json";
pub const POD_LABELS_PATH: &str = "etc/istio/pod/labels";

/// Ports, as Istio's proxies use them.
pub const ADMIN_PORT: u16 = 15000;
pub const STATUS_PORT: u16 = 15020;
pub const READINESS_PORT: u16 = 15021;
pub const PROMETHEUS_PORT: u16 = 15090;

/// The proxy kind: the node id's first field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ProxyType {
    Waypoint,
    Sidecar,
    Router,
}

impl ProxyType {
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyType::Waypoint => "waypoint",
            ProxyType::Sidecar => "sidecar",
            ProxyType::Router => "router",
        }
    }
}

/// Flags of `pilot-agent proxy <type>`, with Istio's spellings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyArgs {
    /// `--domain`, e.g. `shop.svc.cluster.local`.
    pub domain: Option<String>,
    /// `--serviceCluster`, e.g. `waypoint.shop`.
    pub service_cluster: Option<String>,
    /// `--proxyLogLevel` (Envoy's log level).
    pub proxy_log_level: Option<String>,
    /// `--proxyComponentLogLevel` (Envoy's per-component levels, `misc:error,upstream:debug`).
    pub proxy_component_log_level: Option<String>,
    /// `--concurrency` (Envoy worker threads).
    pub concurrency: Option<u32>,
}

/// The `RUST_LOG` filter for Istio's `--log_output_level` (`scope:level` pairs, or a bare
/// level for every scope): the `default` scope's level (or the bare one) becomes the filter;
/// Istio's `none` is `off`. `None` when it names no level this agent knows.
pub fn rust_log_filter(levels: &str) -> Option<String> {
    let level = levels
        .split(',')
        .map(str::trim)
        .find_map(|entry| match entry.split_once(':') {
            Some(("default", level)) => Some(level.trim()),
            Some(_) => None,
            None => Some(entry),
        })?;
    match level {
        "none" => Some("off".into()),
        "debug" | "info" | "warn" | "error" => Some(level.into()),
        "fatal" => Some("error".into()),
        _ => None,
    }
}

/// Envoy's log levels (`warn` is accepted for `warning`).
const ENVOY_LEVELS: [&str; 8] = [
    "trace", "debug", "info", "warning", "warn", "error", "critical", "off",
];

/// The app's metrics endpoint, as Istio's agent reads it: path `/metrics` and port 80 unless
/// given; never the status port itself (the merge would call itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppMetrics {
    pub port: u16,
    pub path: String,
}

impl AppMetrics {
    /// Parses `ISTIO_PROMETHEUS_ANNOTATIONS`; `None` when it names nothing to scrape.
    pub fn parse(raw: &str) -> Result<Option<AppMetrics>, String> {
        #[derive(serde::Deserialize, Default)]
        struct Scrape {
            #[serde(default)]
            scrape: String,
            #[serde(default)]
            path: String,
            #[serde(default)]
            port: String,
        }
        let s: Scrape = serde_json::from_str(raw)
            .map_err(|e| format!("{PROMETHEUS_ANNOTATIONS}={raw:?} is not the injector's JSON ({{\"scrape\":..,\"path\":..,\"port\":..}}): {e}"))?;
        if s.scrape.is_empty() && s.path.is_empty() && s.port.is_empty() {
            return Ok(None);
        }
        let port_text = if s.port.is_empty() {
            "80"
        } else {
            s.port.as_str()
        };
        let port: u16 = port_text.parse().map_err(|_| {
            format!("{PROMETHEUS_ANNOTATIONS}: port {port_text:?} is not a port number")
        })?;
        if port == STATUS_PORT {
            return Err(format!("{PROMETHEUS_ANNOTATIONS}: the app's metrics port is the agent's status port {STATUS_PORT}, which would merge the metrics into themselves; remove prometheus.io/port={STATUS_PORT} from the pod or do not inject it twice"));
        }
        let path = if s.path.is_empty() {
            "/metrics".to_string()
        } else {
            s.path
        };
        Ok(Some(AppMetrics { port, path }))
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    pub proxy_type: ProxyType,
    pub pod_name: String,
    pub pod_namespace: String,
    pub instance_ip: IpAddr,
    pub service_account: String,
    pub trust_domain: String,
    pub cluster_id: String,
    /// `<namespace>.svc.<cluster domain>`.
    pub domain: String,
    pub service_cluster: String,
    /// `https://host:port` of istiod's xDS.
    pub discovery_address: String,
    /// `https://host:port` of the CA.
    pub ca_address: String,
    pub xds_root_ca: PathBuf,
    pub ca_root_ca: PathBuf,
    pub token_path: PathBuf,
    pub envoy_path: Option<PathBuf>,
    pub proxy_log_level: String,
    /// Envoy's `--component-log-level`, when given.
    pub proxy_component_log_level: Option<String>,
    pub concurrency: u32,
    #[serde(with = "humantime_serde_shim")]
    pub drain_duration: Duration,
    #[serde(with = "humantime_serde_shim")]
    pub termination_drain_duration: Duration,
    #[serde(with = "humantime_serde_shim")]
    pub secret_ttl: Duration,
    /// Node metadata from `ISTIO_META_*` / `ISTIO_METAJSON_*`.
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// The app's probes served on `/app-health/...` (`ISTIO_KUBE_APP_PROBERS`).
    #[serde(skip)]
    pub app_probers: crate::app_probe::Probers,
    /// Probe `localhost` instead of the pod's IP (`REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION`).
    pub probe_localhost: bool,
    /// Where the app serves its own metrics, merged into the status port's (sidecars only).
    pub app_metrics: Option<AppMetrics>,
    /// The working directory every relative path is under.
    pub root: PathBuf,
}

/// Every bad value, reported together.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  {}", .0.join("\n  "))]
pub struct ConfigError(pub Vec<String>);

impl ConfigError {
    pub fn reason(&self) -> &'static str {
        "invalid_config"
    }
}

/// `PROXY_CONFIG` fields the agent uses (others are accepted and ignored).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProxyConfigEnv {
    discovery_address: Option<String>,
    drain_duration: Option<String>,
    termination_drain_duration: Option<String>,
    concurrency: Option<u32>,
}

impl Config {
    /// Reads the configuration from `vars` (the environment) and the command line.
    pub fn from_vars<'a>(
        proxy_type: ProxyType,
        args: &ProxyArgs,
        vars: impl IntoIterator<Item = (&'a str, &'a str)>,
        root: PathBuf,
    ) -> Result<Config, ConfigError> {
        let vars: BTreeMap<&str, &str> = vars.into_iter().collect();
        let mut errors = Vec::new();
        let get = |k: &str| vars.get(k).copied().filter(|v| !v.is_empty());
        let required = |k: &str, errors: &mut Vec<String>| {
            get(k).map(str::to_string).unwrap_or_else(|| {
                errors.push(format!(
                    "{k} is not set (the pod template sets it from the downward API)"
                ));
                String::new()
            })
        };
        let pod_name = required(POD_NAME, &mut errors);
        let pod_namespace = required(POD_NAMESPACE, &mut errors);
        let instance_ip = match get(INSTANCE_IP).map(str::parse::<IpAddr>) {
            Some(Ok(ip)) => ip,
            Some(Err(e)) => {
                errors.push(format!(
                    "{INSTANCE_IP}={:?}: {e}",
                    get(INSTANCE_IP).unwrap_or_default()
                ));
                IpAddr::from([0, 0, 0, 0])
            }
            None => {
                errors.push(format!(
                    "{INSTANCE_IP} is not set (the pod IP, from status.podIP)"
                ));
                IpAddr::from([0, 0, 0, 0])
            }
        };
        let app_probers = crate::app_probe::parse(get(APP_PROBERS).unwrap_or_default())
            .unwrap_or_else(|e| {
                errors.push(e.to_string());
                Default::default()
            });
        let probe_localhost = get(PROBE_LOCALHOST).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let app_metrics = match (proxy_type, get(PROMETHEUS_ANNOTATIONS)) {
            (ProxyType::Sidecar, Some(raw)) => AppMetrics::parse(raw).unwrap_or_else(|e| {
                errors.push(e);
                None
            }),
            _ => None,
        };
        let proxy_config: ProxyConfigEnv = match get(PROXY_CONFIG) {
            Some(raw) => serde_yaml::from_str(raw).unwrap_or_else(|e| {
                errors.push(format!(
                    "{PROXY_CONFIG} is not valid JSON/YAML ProxyConfig: {e}"
                ));
                ProxyConfigEnv::default()
            }),
            None => ProxyConfigEnv::default(),
        };
        let discovery = proxy_config
            .discovery_address
            .clone()
            .unwrap_or_else(|| DEFAULT_DISCOVERY_ADDRESS.to_string());
        let discovery_address = mesh_certs::istiod_url(&discovery);
        let ca_address =
            get(CA_ADDR).map_or_else(|| discovery_address.clone(), mesh_certs::istiod_url);
        let mut duration = |name: &str, value: Option<&str>, default: Duration| match value {
            None => default,
            Some(v) => humantime::parse_duration(v).unwrap_or_else(|e| {
                errors.push(format!("{name}={v:?} is not a duration (e.g. 5s, 1m): {e}"));
                default
            }),
        };
        let drain_duration = duration(
            "PROXY_CONFIG.drainDuration",
            proxy_config.drain_duration.as_deref(),
            Duration::from_secs(45),
        );
        let termination_drain_duration = duration(
            TERMINATION_DRAIN_DURATION,
            get(TERMINATION_DRAIN_DURATION).or(proxy_config.termination_drain_duration.as_deref()),
            Duration::from_secs(5),
        );
        let secret_ttl = duration(SECRET_TTL, get(SECRET_TTL), Duration::from_secs(24 * 3600));
        let metadata = node_metadata(&vars, &mut errors);
        let trust_domain = get(TRUST_DOMAIN).unwrap_or("cluster.local").to_string();
        let service_account = get(SERVICE_ACCOUNT)
            .map(str::to_string)
            .or_else(|| {
                metadata
                    .get("SERVICE_ACCOUNT")
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "default".to_string());
        let cluster_domain = args
            .domain
            .clone()
            .unwrap_or_else(|| format!("{pod_namespace}.svc.cluster.local"));
        let log_level = args
            .proxy_log_level
            .clone()
            .unwrap_or_else(|| "warning".into());
        if !ENVOY_LEVELS.contains(&log_level.as_str()) {
            errors.push(format!("--proxyLogLevel {log_level:?}: expected trace, debug, info, warning, error, critical or off"));
        }
        let component_levels = args
            .proxy_component_log_level
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty());
        if let Some(levels) = component_levels {
            let valid = levels.split(',').all(|entry| {
                entry.split_once(':').is_some_and(|(component, level)| {
                    !component.trim().is_empty() && ENVOY_LEVELS.contains(&level.trim())
                })
            });
            if !valid {
                errors.push(format!("--proxyComponentLogLevel {levels:?}: expected component:level pairs separated by commas (misc:error,upstream:debug)"));
            }
        }
        if !errors.is_empty() {
            return Err(ConfigError(errors));
        }
        let abs = |p: &str| root.join(p);
        Ok(Config {
            proxy_type,
            service_cluster: args
                .service_cluster
                .clone()
                .unwrap_or_else(|| format!("{service_account}.{pod_namespace}")),
            pod_name,
            pod_namespace,
            instance_ip,
            service_account,
            trust_domain,
            cluster_id: get(ISTIO_META_CLUSTER_ID)
                .unwrap_or("Kubernetes")
                .to_string(),
            domain: cluster_domain,
            discovery_address,
            ca_address,
            xds_root_ca: get(XDS_ROOT_CA).map_or_else(|| abs(ROOT_CERT_PATH), PathBuf::from),
            ca_root_ca: get(CA_ROOT_CA).map_or_else(|| abs(ROOT_CERT_PATH), PathBuf::from),
            token_path: abs(TOKEN_PATH),
            envoy_path: get(ENVOY_PATH).map(PathBuf::from),
            proxy_log_level: if log_level == "warn" {
                "warning".into()
            } else {
                log_level
            },
            proxy_component_log_level: component_levels.map(str::to_string),
            concurrency: args.concurrency.or(proxy_config.concurrency).unwrap_or(2),
            drain_duration,
            termination_drain_duration,
            secret_ttl,
            metadata,
            app_probers,
            probe_localhost,
            app_metrics,
            root,
        })
    }

    /// `<type>~<ip>~<pod>.<namespace>~<domain>`.
    pub fn node_id(&self) -> String {
        format!(
            "{}~{}~{}.{}~{}",
            self.proxy_type.as_str(),
            self.instance_ip,
            self.pod_name,
            self.pod_namespace,
            self.domain
        )
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }
}

fn node_metadata(
    vars: &BTreeMap<&str, &str>,
    errors: &mut Vec<String>,
) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    for (k, v) in vars {
        if let Some(key) = k.strip_prefix(ISTIO_METAJSON_PREFIX) {
            match serde_json::from_str(v) {
                Ok(value) => {
                    out.insert(key.to_string(), value);
                }
                Err(e) => errors.push(format!("{k} is not JSON: {e}")),
            }
        } else if let Some(key) = k.strip_prefix(ISTIO_META_PREFIX) {
            out.insert(key.to_string(), serde_json::Value::String(v.to_string()));
        }
    }
    out
}

/// Durations serialized as `5s` in `/config_dump`-style output.
mod humantime_serde_shim {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}

/// Pod labels from the downward API file (`key="value"` per line).
pub fn parse_pod_labels(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let (k, v) = line.split_once('=')?;
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            Some((k.trim().to_string(), v.replace("\\\"", "\"")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vec<(&'static str, &'static str)> {
        vec![
            (POD_NAME, "waypoint-7d9f"),
            (POD_NAMESPACE, "shop"),
            (INSTANCE_IP, "10.1.0.9"),
            (SERVICE_ACCOUNT, "waypoint"),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
            (
                "ISTIO_METAJSON_LABELS",
                r#"{"gateway.networking.k8s.io/gateway-name":"waypoint"}"#,
            ),
            (
                PROXY_CONFIG,
                r#"{"discoveryAddress":"10.0.0.1:15012","drainDuration":"2s"}"#,
            ),
        ]
    }

    #[test]
    fn reads_istios_environment() {
        let args = ProxyArgs {
            domain: Some("shop.svc.cluster.local".into()),
            ..ProxyArgs::default()
        };
        let c = Config::from_vars(ProxyType::Waypoint, &args, vars(), "/w".into()).expect("valid");
        assert_eq!(
            c.node_id(),
            "waypoint~10.1.0.9~waypoint-7d9f.shop~shop.svc.cluster.local"
        );
        assert_eq!(c.discovery_address, "https://10.0.0.1:15012");
        assert_eq!(c.ca_address, c.discovery_address);
        assert_eq!(c.service_cluster, "waypoint.shop");
        assert_eq!(c.drain_duration, Duration::from_secs(2));
        assert_eq!(
            c.token_path,
            PathBuf::from("/w/var/run/secrets/tokens/istio-token")
        );
        assert_eq!(
            c.metadata["LABELS"]["gateway.networking.k8s.io/gateway-name"],
            "waypoint"
        );
    }

    #[test]
    fn reports_every_bad_value_at_once() {
        let bad = [
            (INSTANCE_IP, "10.1.0"),
            (PROXY_CONFIG, "{"),
            (TERMINATION_DRAIN_DURATION, "soon"),
            ("ISTIO_METAJSON_LABELS", "{x"),
        ];
        let args = ProxyArgs {
            proxy_log_level: Some("loud".into()),
            proxy_component_log_level: Some("misc=error".into()),
            ..ProxyArgs::default()
        };
        let err = Config::from_vars(ProxyType::Waypoint, &args, bad, "/".into()).expect_err("bad");
        let text = err.to_string();
        for needle in [
            POD_NAME,
            POD_NAMESPACE,
            INSTANCE_IP,
            PROXY_CONFIG,
            TERMINATION_DRAIN_DURATION,
            "ISTIO_METAJSON_LABELS",
            "loud",
            "--proxyComponentLogLevel \"misc=error\"",
        ] {
            assert!(text.contains(needle), "{needle} missing from {text}");
        }
    }

    #[test]
    fn istio_log_levels_become_a_rust_log_filter() {
        assert_eq!(rust_log_filter("default:debug").as_deref(), Some("debug"));
        assert_eq!(
            rust_log_filter("xds:debug,default:warn").as_deref(),
            Some("warn")
        );
        assert_eq!(rust_log_filter("info").as_deref(), Some("info"));
        assert_eq!(rust_log_filter("none").as_deref(), Some("off"));
        assert_eq!(rust_log_filter("xds:debug"), None);
        assert_eq!(rust_log_filter("loud"), None);
    }

    #[test]
    fn component_levels_reach_envoy() {
        let args = ProxyArgs {
            proxy_component_log_level: Some("misc:error,upstream:debug".into()),
            ..ProxyArgs::default()
        };
        let c = Config::from_vars(ProxyType::Sidecar, &args, vars(), "/w".into()).expect("valid");
        let envoy = crate::envoy::args(&c, std::path::Path::new("/b.json"));
        let at = envoy
            .iter()
            .position(|a| a == "--component-log-level")
            .expect("flag");
        assert_eq!(envoy[at + 1], "misc:error,upstream:debug");
    }

    #[test]
    fn downward_api_labels() {
        let l =
            parse_pod_labels("app=\"echo\"\ngateway.networking.k8s.io/gateway-name=\"waypoint\"\n");
        assert_eq!(l["gateway.networking.k8s.io/gateway-name"], "waypoint");
        assert_eq!(l["app"], "echo");
    }

    #[test]
    fn the_apps_metrics_endpoint_is_read_as_istios_agent_reads_it() {
        let parse = AppMetrics::parse;
        assert_eq!(
            parse(r#"{"scrape":"true","path":"/m","port":"9100"}"#),
            Ok(Some(AppMetrics {
                port: 9100,
                path: "/m".into()
            }))
        );
        assert_eq!(
            parse(r#"{"scrape":"true"}"#),
            Ok(Some(AppMetrics {
                port: 80,
                path: "/metrics".into()
            }))
        );
        assert_eq!(parse("{}"), Ok(None));
        let bad = parse(r#"{"port":"http"}"#).expect_err("not a port");
        assert!(bad.contains("\"http\""), "{bad}");
        let recursive = parse(r#"{"port":"15020"}"#).expect_err("the status port");
        assert!(recursive.contains("15020"), "{recursive}");
        assert!(parse("not json").is_err());
        // Only sidecars merge the app's metrics.
        let args = ProxyArgs::default();
        let mut v = vars();
        v.push((PROMETHEUS_ANNOTATIONS, r#"{"scrape":"true","port":"9100"}"#));
        let sidecar = Config::from_vars(ProxyType::Sidecar, &args, v.clone(), "/w".into());
        assert_eq!(
            sidecar.expect("valid").app_metrics.map(|m| m.port),
            Some(9100)
        );
        let waypoint = Config::from_vars(ProxyType::Waypoint, &args, v, "/w".into());
        assert_eq!(waypoint.expect("valid").app_metrics, None);
    }
}
