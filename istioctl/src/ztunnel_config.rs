//! `istioctl ztunnel-config workload|service|policy|certificate|all`: ztunnel's `/config_dump`
//! as upstream istioctl shows it. In a cluster (`--kubeconfig`, `--context`, `KUBECONFIG`, or a
//! pod named) a ztunnel pod's admin port 15000 is reached by port-forward through the API
//! server, as Istio's istioctl does; in the local mode the admin address is a flag
//! (`--ztunnel-admin`); or a saved dump is read (`--ztunnel-config-dump`).

mod dump;
mod tables;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

pub use dump::{ConfigDump, DumpError};
pub use tables::Filter;

/// What to show.
#[derive(Debug, Subcommand)]
pub enum ZtunnelConfig {
    /// Workloads ztunnel knows (NAMESPACE POD NAME ADDRESS NODE WAYPOINT PROTOCOL).
    #[command(visible_aliases = ["workloads", "w"])]
    Workload(CommonArgs),
    /// Services (NAMESPACE SERVICE NAME SERVICE VIP WAYPOINT ENDPOINTS).
    #[command(visible_aliases = ["services", "s", "svc"])]
    Service(CommonArgs),
    /// Authorization policies (NAMESPACE POLICY NAME ACTION SCOPE).
    #[command(visible_aliases = ["policies", "p", "pol"])]
    Policy(CommonArgs),
    /// Certificates of the node's identities (leaf, intermediates, root).
    #[command(visible_aliases = ["certificates", "certs", "cert"])]
    Certificate(CommonArgs),
    /// Every table (-o json|yaml: the whole dump).
    All(CommonArgs),
}

/// Output format, as upstream: `short` tables or the raw dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Short,
    Json,
    Yaml,
}

/// Flags shared by every `ztunnel-config` command.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// In a cluster, the ztunnel pod to ask (`[pod/]<name>[.<namespace>]`) [default: the one
    /// on --node, else the first running one].
    #[arg(value_name = "POD")]
    pub pod: Option<String>,
    /// The cluster (its ztunnel pods are reached by port-forward to 15000); used when
    /// `--kubeconfig` or `--context` is given, or a pod is named.
    #[command(flatten)]
    pub kube: crate::cluster::KubeArgs,
    /// The namespace ztunnel runs in.
    #[arg(short = 'i', long = "istioNamespace", default_value = "istio-system")]
    pub istio_namespace: String,
    /// ztunnel's admin address (it listens on localhost:15000 in its own network namespace).
    #[arg(long, env = "ZTUNNEL_ADMIN", default_value = "http://localhost:15000")]
    pub ztunnel_admin: String,
    /// Read a saved `/config_dump` JSON file instead of the admin endpoint ('-' for stdin).
    #[arg(long, short = 'f', visible_alias = "file")]
    pub ztunnel_config_dump: Option<PathBuf>,
    /// Output format: short (tables), json or yaml.
    #[arg(long, short = 'o', value_enum, default_value = "short")]
    pub output: Output,
    /// Only workloads on this node.
    #[arg(long, visible_alias = "workload-node")]
    pub node: Option<String>,
    /// Only workloads, services and policies of this namespace.
    #[arg(long, visible_aliases = ["service-namespace", "policy-namespace"])]
    pub workload_namespace: Option<String>,
    /// Only workloads with this IP.
    #[arg(long)]
    pub address: Option<String>,
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum ZtunnelConfigError {
    #[error("cannot read the config dump from ztunnel's admin endpoint: {0}")]
    Fetch(#[from] crate::http::HttpError),
    #[error("cannot read config dump file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error(transparent)]
    Dump(#[from] DumpError),
    #[error("cannot print {format}: {message}")]
    Print {
        format: &'static str,
        message: String,
    },
}

impl ZtunnelConfigError {
    /// Short label for the error kind.
    pub fn reason(&self) -> &'static str {
        match self {
            ZtunnelConfigError::Fetch(e) => e.reason(),
            ZtunnelConfigError::File { .. } => "file",
            ZtunnelConfigError::Cluster(_) => "cluster",
            ZtunnelConfigError::Dump(e) => e.reason(),
            ZtunnelConfigError::Print { .. } => "print",
        }
    }
}

/// Which table or section a command shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Workloads,
    Services,
    Policies,
    Certificates,
    All,
}

impl ZtunnelConfig {
    fn parts(&self) -> (Section, &CommonArgs) {
        match self {
            ZtunnelConfig::Workload(a) => (Section::Workloads, a),
            ZtunnelConfig::Service(a) => (Section::Services, a),
            ZtunnelConfig::Policy(a) => (Section::Policies, a),
            ZtunnelConfig::Certificate(a) => (Section::Certificates, a),
            ZtunnelConfig::All(a) => (Section::All, a),
        }
    }
}

pub async fn run(cmd: ZtunnelConfig) -> Result<(), ZtunnelConfigError> {
    let (section, args) = cmd.parts();
    let bytes = match &args.ztunnel_config_dump {
        Some(path) => read_file(path)?,
        None if args.pod.is_some() || args.kube.given() => {
            let mut cluster = args.kube.cluster().await?;
            let (namespace, pod) = cluster
                .ztunnel_pod(
                    args.pod.as_deref(),
                    &args.istio_namespace,
                    args.node.as_deref(),
                )
                .await?;
            crate::http::get_from_pod(cluster.client(), &namespace, &pod, 15000, "/config_dump")
                .await?
        }
        None => crate::http::get(&args.ztunnel_admin, "/config_dump").await?,
    };
    let dump = ConfigDump::parse(&bytes)?;
    let filter = Filter {
        namespace: args.workload_namespace.clone(),
        node: args.node.clone(),
        address: args.address.clone(),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    print!("{}", render(&dump, section, args.output, &filter, now)?);
    Ok(())
}

fn read_file(path: &std::path::Path) -> Result<Vec<u8>, ZtunnelConfigError> {
    crate::input::read_path_or_stdin(path).map_err(|source| ZtunnelConfigError::File {
        path: path.to_path_buf(),
        source,
    })
}

/// The command's output for a parsed dump.
pub fn render(
    dump: &ConfigDump,
    section: Section,
    output: Output,
    filter: &Filter,
    now: i64,
) -> Result<String, ZtunnelConfigError> {
    if output == Output::Short {
        return Ok(match section {
            Section::Workloads => tables::workloads(dump, filter),
            Section::Services => tables::services(dump, filter),
            Section::Policies => tables::policies(dump, filter),
            Section::Certificates => tables::certificates(dump, now),
            Section::All => tables::all(dump, filter, now),
        });
    }
    let value = raw_section(dump, section, filter);
    match output {
        Output::Yaml => serde_yaml::to_string(&value).map_err(|e| ZtunnelConfigError::Print {
            format: "yaml",
            message: e.to_string(),
        }),
        _ => json_4_spaces(&value).map(|s| s + "\n"),
    }
}

/// The raw entries a section shows with `-o json|yaml` (filtered and sorted like the table).
fn raw_section(dump: &ConfigDump, section: Section, filter: &Filter) -> Value {
    let by_ns_name =
        |ns: &str, name: &str, extra: &str| (ns.to_string(), name.to_string(), extra.to_string());
    match section {
        Section::All => dump.raw.clone(),
        Section::Workloads => dump
            .workloads
            .iter()
            .filter(|e| filter.workload(&e.view))
            .map(|e| e.raw.clone())
            .collect(),
        Section::Services => {
            let mut list: Vec<_> = dump
                .services
                .iter()
                .filter(|e| filter.namespace(&e.view.namespace))
                .collect();
            list.sort_by_key(|e| by_ns_name(&e.view.namespace, &e.view.name, &e.view.hostname));
            list.into_iter().map(|e| e.raw.clone()).collect()
        }
        Section::Policies => {
            let mut list: Vec<_> = dump
                .policies
                .iter()
                .filter(|e| filter.namespace(&e.view.namespace))
                .collect();
            list.sort_by_key(|e| by_ns_name(&e.view.namespace, &e.view.name, ""));
            list.into_iter().map(|e| e.raw.clone()).collect()
        }
        Section::Certificates => dump.certificates.iter().map(|e| e.raw.clone()).collect(),
    }
}

/// JSON indented by four spaces, as istioctl's `json.MarshalIndent(v, "", "    ")`.
fn json_4_spaces(value: &Value) -> Result<String, ZtunnelConfigError> {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    serde::Serialize::serialize(value, &mut ser).map_err(|e| ZtunnelConfigError::Print {
        format: "json",
        message: e.to_string(),
    })?;
    String::from_utf8(out).map_err(|e| ZtunnelConfigError::Print {
        format: "json",
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
