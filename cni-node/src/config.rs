//! The node agent's configuration, from environment variables (Istio's names where istio-cni
//! has one). [`Config::from_vars`] reads any `(name, value)` list so tests never touch the
//! process environment; every bad value is reported at once. The result is `Serialize`
//! (camelCase) and logged at start.
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `CLUSTER_CONFIG_DIR` (or `--cluster-config-dir`) | unset | directory of Kubernetes YAML (Pods, Namespaces) the agent watches; the same directory istiod reads as `ISTIOD_CONFIG_DIR` |
//! | `KUBECONFIG` | unset | without `CLUSTER_CONFIG_DIR`: the API server to watch (else the in-cluster configuration, when `KUBERNETES_SERVICE_HOST` is set); `NODE_NAME` is then required |
//! | `INPOD_UDS` | `/var/run/ztunnel/ztunnel.sock` | ZDS socket ztunnel connects to (ztunnel's variable of the same name) |
//! | `PLUGIN_EVENT_SOCKET` | `/var/run/istio-cni/pluginevent.sock` | where the CNI plugin posts ADD events |
//! | `AGENT_STATE_DIR` | `/var/run/istio-cni/state` | the agent's pod records (`pods.json`); under the chart's `/var/run/istio-cni` hostPath, cleared on reboot with the netns it names |
//! | `AGENT_READINESS_ADDR` | `0.0.0.0:8000` | `/readyz` (istio-cni's port 8000) |
//! | `AMBIENT_ENABLED` | `true` | enroll pods at all (chart `ambient.enabled`; the cni chart sets it, `true` under the ambient profile) |
//! | `EXCLUDE_NAMESPACES` (older name `EXCLUDED_NAMESPACES`) | `kube-system` | comma-separated namespaces never enrolled (chart `excludeNamespaces`) |
//! | `AMBIENT_DNS_CAPTURE` | `true` | capture DNS by default (chart `ambient.dnsCapture`) |
//! | `AMBIENT_SOCKMAP` | `false` | pair the in-pod legs of mesh connections socket to socket (sockmap / sk_msg, this project's option, no istio-cni equivalent); without kernel support the agent warns and runs without it |
//! | `AMBIENT_SOCKMAP_CGROUP` | the first cgroup v2 mount, else one mounted at `/run/mesh-cni/cgroup2` | with `AMBIENT_SOCKMAP`: the cgroup v2 directory whose sockets (and those of its descendants) are paired |
//! | `AMBIENT_RECONCILE_POD_RULES_ON_STARTUP` | `true` | re-apply the capture of recorded pods at start (chart `ambient.reconcileIptablesOnStartup`) |
//! | `NODE_NAME` | unset | this node; with it, selected pods on this node that the agent has no record of are looked up in `/proc` |
//! | `HOST_PROC` | `/proc` | the host's procfs (the chart mounts it at `/host/proc`) |

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Serialize;

use crate::selection::{SelectionConfig, DEFAULT_EXCLUDED_NAMESPACES};
use crate::zds_server::DEFAULT_ZDS_SOCKET;

pub const CLUSTER_CONFIG_DIR: &str = "CLUSTER_CONFIG_DIR";
pub const INPOD_UDS: &str = "INPOD_UDS";
pub const PLUGIN_EVENT_SOCKET: &str = "PLUGIN_EVENT_SOCKET";
pub const AGENT_STATE_DIR: &str = "AGENT_STATE_DIR";
pub const AGENT_READINESS_ADDR: &str = "AGENT_READINESS_ADDR";
pub const AMBIENT_ENABLED: &str = "AMBIENT_ENABLED";
pub const EXCLUDE_NAMESPACES: &str = "EXCLUDE_NAMESPACES";
/// The name istio-cni used for [`EXCLUDE_NAMESPACES`] before; still read when that is unset.
pub const EXCLUDED_NAMESPACES: &str = "EXCLUDED_NAMESPACES";
pub const AMBIENT_DNS_CAPTURE: &str = "AMBIENT_DNS_CAPTURE";
pub const AMBIENT_SOCKMAP: &str = "AMBIENT_SOCKMAP";
pub const AMBIENT_SOCKMAP_CGROUP: &str = "AMBIENT_SOCKMAP_CGROUP";
pub const AMBIENT_RECONCILE_POD_RULES_ON_STARTUP: &str = "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP";
pub const NODE_NAME: &str = "NODE_NAME";
pub const KUBECONFIG: &str = "KUBECONFIG";
pub const KUBERNETES_SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";
pub const HOST_PROC: &str = "HOST_PROC";
/// How pods are captured: `nftables` (default) or `ebpf`.
pub const REDIRECTION_MODE: &str = "REDIRECTION_MODE";

/// The capture implementation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RedirectionMode {
    #[default]
    Nftables,
    Ebpf,
}

/// Default of [`AGENT_STATE_DIR`].
pub const DEFAULT_STATE_DIR: &str = "/var/run/istio-cni/state";
/// Default of [`AGENT_READINESS_ADDR`].
pub const DEFAULT_READINESS_ADDR: &str = "0.0.0.0:8000";

/// The validated configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// The local mode's YAML directory; `None` on Kubernetes.
    pub cluster_config_dir: Option<PathBuf>,
    /// On Kubernetes: the kubeconfig (`None`: in-cluster).
    pub kubeconfig: Option<PathBuf>,
    pub zds_socket: PathBuf,
    pub plugin_event_socket: PathBuf,
    pub state_dir: PathBuf,
    pub readiness_addr: SocketAddr,
    pub selection: SelectionConfig,
    pub reconcile_on_start: bool,
    pub node_name: Option<String>,
    pub host_proc: PathBuf,
    pub redirection: RedirectionMode,
    /// Pair the in-pod legs socket to socket.
    pub sockmap: bool,
    /// The cgroup v2 directory of the sockmap's `sock_ops` program (`None`: discover or mount).
    pub sockmap_cgroup: Option<PathBuf>,
}

/// One bad variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarError {
    pub var: &'static str,
    pub problem: String,
}

impl fmt::Display for VarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.var, self.problem)
    }
}

/// Why the configuration is not usable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid cni-node environment, fix these variables: {}", list(.0))]
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

fn list(errors: &[VarError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

struct Vars {
    vars: HashMap<String, String>,
    errors: Vec<VarError>,
}

impl Vars {
    /// A set, non-empty (trimmed) value.
    fn get(&self, var: &str) -> Option<&str> {
        self.vars
            .get(var)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    fn path(&self, var: &str, default: &str) -> PathBuf {
        PathBuf::from(self.get(var).unwrap_or(default))
    }

    fn bool(&mut self, var: &'static str, default: bool) -> bool {
        match self.get(var).map(str::to_ascii_lowercase).as_deref() {
            None => default,
            Some("true" | "1" | "yes") => true,
            Some("false" | "0" | "no") => false,
            Some(other) => {
                let problem = format!("{other:?} is not a boolean; use true or false");
                self.errors.push(VarError { var, problem });
                default
            }
        }
    }

    fn addr(&mut self, var: &'static str, default: &str) -> SocketAddr {
        let fallback = SocketAddr::from(([0, 0, 0, 0], 8000));
        let value = self.get(var).unwrap_or(default).to_string();
        value.parse().unwrap_or_else(|_| {
            let problem = format!("{value:?} is not an address; use ip:port such as 0.0.0.0:8000");
            self.errors.push(VarError { var, problem });
            fallback
        })
    }
}

impl Vars {
    fn redirection_mode(&mut self) -> RedirectionMode {
        match self
            .get(REDIRECTION_MODE)
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("nftables") => RedirectionMode::Nftables,
            Some("ebpf") => RedirectionMode::Ebpf,
            Some(other) => {
                let problem = format!("{other:?} is not a redirection mode; use nftables or ebpf");
                self.errors.push(VarError {
                    var: REDIRECTION_MODE,
                    problem,
                });
                RedirectionMode::Nftables
            }
        }
    }
}

impl Config {
    /// Reads the process environment; `cluster_dir` (the `--cluster-config-dir` flag)
    /// overrides [`CLUSTER_CONFIG_DIR`].
    pub fn from_env(cluster_dir: Option<PathBuf>) -> Result<Config, ConfigError> {
        let mut vars: Vec<(String, String)> = std::env::vars().collect();
        if let Some(dir) = cluster_dir {
            vars.push((
                CLUSTER_CONFIG_DIR.to_string(),
                dir.to_string_lossy().into_owned(),
            ));
        }
        Config::from_vars(vars)
    }

    /// Reads `vars` (later pairs win).
    pub fn from_vars<I>(vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut v = Vars {
            vars: vars.into_iter().collect(),
            errors: Vec::new(),
        };
        let cluster_config_dir = v.get(CLUSTER_CONFIG_DIR).map(PathBuf::from);
        let kubeconfig = v.get(KUBECONFIG).map(PathBuf::from);
        let in_cluster = v.get(KUBERNETES_SERVICE_HOST).is_some();
        if cluster_config_dir.is_none() {
            if kubeconfig.is_none() && !in_cluster {
                v.errors.push(VarError {
                    var: CLUSTER_CONFIG_DIR,
                    problem: "not set, and there is no Kubernetes API to watch (KUBECONFIG or KUBERNETES_SERVICE_HOST); point it (or --cluster-config-dir) at the directory of cluster YAML".to_string(),
                });
            } else if v.get(NODE_NAME).is_none() {
                v.errors.push(VarError {
                    var: NODE_NAME,
                    problem: "required on Kubernetes: the agent watches the pods of its node (set it from spec.nodeName)".to_string(),
                });
            }
        }
        let ambient_enabled = v.bool(AMBIENT_ENABLED, true);
        // Present but empty (the chart's `excludeNamespaces: []`) excludes nothing.
        let excluded = [EXCLUDE_NAMESPACES, EXCLUDED_NAMESPACES]
            .into_iter()
            .find_map(|name| v.vars.get(name).map(|value| value.trim()));
        let excluded_namespaces: BTreeSet<String> = match excluded {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            None => DEFAULT_EXCLUDED_NAMESPACES
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        let dns_capture = v.bool(AMBIENT_DNS_CAPTURE, true);
        let reconcile_on_start = v.bool(AMBIENT_RECONCILE_POD_RULES_ON_STARTUP, true);
        let readiness_addr = v.addr(AGENT_READINESS_ADDR, DEFAULT_READINESS_ADDR);
        let config = Config {
            cluster_config_dir,
            kubeconfig,
            zds_socket: v.path(INPOD_UDS, DEFAULT_ZDS_SOCKET),
            plugin_event_socket: v.path(PLUGIN_EVENT_SOCKET, crate::event::PLUGIN_EVENT_SOCKET),
            state_dir: v.path(AGENT_STATE_DIR, DEFAULT_STATE_DIR),
            readiness_addr,
            selection: SelectionConfig {
                ambient_enabled,
                excluded_namespaces,
                dns_capture,
            },
            reconcile_on_start,
            node_name: v.get(NODE_NAME).map(str::to_string),
            host_proc: v.path(HOST_PROC, "/proc"),
            redirection: v.redirection_mode(),
            sockmap: v.bool(AMBIENT_SOCKMAP, false),
            sockmap_cgroup: v.get(AMBIENT_SOCKMAP_CGROUP).map(PathBuf::from),
        };
        match v.errors.is_empty() {
            true => Ok(config),
            false => Err(ConfigError::InvalidVars(v.errors)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults() {
        let config = Config::from_vars(vars(&[(CLUSTER_CONFIG_DIR, "/etc/mesh")])).expect("ok");
        assert_eq!(config.cluster_config_dir, Some(PathBuf::from("/etc/mesh")));
        assert_eq!(
            config.zds_socket,
            PathBuf::from("/var/run/ztunnel/ztunnel.sock")
        );
        assert_eq!(
            config.plugin_event_socket,
            PathBuf::from("/var/run/istio-cni/pluginevent.sock")
        );
        assert_eq!(config.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
        assert_eq!(config.readiness_addr.port(), 8000);
        assert_eq!(config.selection, SelectionConfig::default());
        assert!(config.reconcile_on_start);
        assert!(!config.sockmap, "sockmap is off by default");
        assert_eq!(config.sockmap_cgroup, None);
        assert_eq!(config.node_name, None);
        let json = serde_json::to_value(&config).expect("serialize");
        assert_eq!(json["zdsSocket"], "/var/run/ztunnel/ztunnel.sock");
        assert_eq!(json["selection"]["excludedNamespaces"][0], "kube-system");
    }

    #[test]
    fn overrides() {
        let config = Config::from_vars(vars(&[
            (CLUSTER_CONFIG_DIR, "/c"),
            (INPOD_UDS, "/tmp/z.sock"),
            (EXCLUDED_NAMESPACES, "kube-system, istio-system,,"),
            (AMBIENT_DNS_CAPTURE, "false"),
            (AMBIENT_RECONCILE_POD_RULES_ON_STARTUP, "0"),
            (AGENT_READINESS_ADDR, "127.0.0.1:0"),
            (NODE_NAME, "node1"),
            (AMBIENT_SOCKMAP, "true"),
            (AMBIENT_SOCKMAP_CGROUP, "/sys/fs/cgroup/kubepods"),
        ]))
        .expect("ok");
        assert!(config.sockmap);
        assert_eq!(
            config.sockmap_cgroup,
            Some(PathBuf::from("/sys/fs/cgroup/kubepods"))
        );
        assert_eq!(config.zds_socket, PathBuf::from("/tmp/z.sock"));
        assert_eq!(
            config.selection.excluded_namespaces,
            ["istio-system".to_string(), "kube-system".to_string()].into()
        );
        assert!(!config.selection.dns_capture);
        assert!(!config.reconcile_on_start);
        assert_eq!(config.readiness_addr.to_string(), "127.0.0.1:0");
        assert_eq!(config.node_name.as_deref(), Some("node1"));
        assert!(config.selection.ambient_enabled);
    }

    #[test]
    fn the_charts_names_for_ambient_and_excluded_namespaces() {
        let config = Config::from_vars(vars(&[
            (CLUSTER_CONFIG_DIR, "/c"),
            (AMBIENT_ENABLED, "false"),
            (EXCLUDE_NAMESPACES, "kube-system,infra"),
            (EXCLUDED_NAMESPACES, "ignored-when-the-new-name-is-set"),
        ]))
        .expect("ok");
        assert!(!config.selection.ambient_enabled);
        assert_eq!(
            config.selection.excluded_namespaces,
            ["infra".to_string(), "kube-system".to_string()].into()
        );
        let none = Config::from_vars(vars(&[
            (CLUSTER_CONFIG_DIR, "/c"),
            (EXCLUDE_NAMESPACES, ""),
        ]))
        .expect("ok");
        assert!(none.selection.excluded_namespaces.is_empty());
    }

    #[test]
    fn every_bad_value_is_reported() {
        let err = Config::from_vars(vars(&[
            (AMBIENT_DNS_CAPTURE, "maybe"),
            (AGENT_READINESS_ADDR, "port 8000"),
        ]))
        .expect_err("invalid");
        let ConfigError::InvalidVars(errors) = &err;
        let names: Vec<&str> = errors.iter().map(|e| e.var).collect();
        assert_eq!(
            names,
            vec![
                CLUSTER_CONFIG_DIR,
                AMBIENT_DNS_CAPTURE,
                AGENT_READINESS_ADDR
            ]
        );
        assert!(
            err.to_string().contains("\"maybe\" is not a boolean"),
            "{err}"
        );
    }

    #[test]
    fn kubernetes_mode_needs_the_node_name() {
        let err = Config::from_vars(vars(&[(KUBECONFIG, "/k")])).expect_err("no node");
        assert!(err.to_string().contains(NODE_NAME), "{err}");
        let config = Config::from_vars(vars(&[
            (KUBERNETES_SERVICE_HOST, "10.96.0.1"),
            (NODE_NAME, "n1"),
        ]))
        .expect("in-cluster");
        assert_eq!((config.cluster_config_dir, config.kubeconfig), (None, None));
        let config =
            Config::from_vars(vars(&[(KUBECONFIG, "/k"), (NODE_NAME, "n1")])).expect("kubeconfig");
        assert_eq!(config.kubeconfig, Some(PathBuf::from("/k")));
    }
}
