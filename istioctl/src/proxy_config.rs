//! `istioctl proxy-config listener|cluster|route|endpoint|secret|all`: an Envoy's
//! `/config_dump?include_eds` in upstream istioctl's table shapes, or the raw sections with
//! `-o json|yaml`. Given a pod (`istioctl proxy-config listeners <pod>[.<ns>]`), its Envoy admin
//! port 15000 is reached by port-forward through the API server, as Istio's istioctl does; in
//! the local mode the admin address is a flag (`--proxy-admin`, Envoy listens on
//! localhost:15000 in the proxy's network namespace); or a saved dump is read (`-f`).

mod tables;

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::Value;

use crate::ztunnel_config::Output;

/// What to show.
#[derive(Debug, Subcommand)]
pub enum ProxyConfig {
    /// Listeners and their filter chains (ADDRESSES PORT MATCH DESTINATION).
    #[command(visible_aliases = ["listeners", "l"])]
    Listener(ProxyArgs),
    /// Clusters (SERVICE FQDN PORT SUBSET DIRECTION TYPE DESTINATION RULE).
    #[command(visible_aliases = ["clusters", "c"])]
    Cluster(ProxyArgs),
    /// Routes (NAME VHOST NAME DOMAINS MATCH VIRTUAL SERVICE), RDS and inline.
    #[command(visible_aliases = ["routes", "r"])]
    Route(ProxyArgs),
    /// Endpoints (ENDPOINT STATUS OUTLIER CHECK CLUSTER).
    #[command(visible_aliases = ["endpoints", "ep"])]
    Endpoint(ProxyArgs),
    /// Secrets (RESOURCE NAME TYPE STATUS VALID CERT SERIAL NUMBER NOT AFTER NOT BEFORE).
    #[command(visible_aliases = ["secrets", "s"])]
    Secret(ProxyArgs),
    /// Every table (-o json|yaml: the whole dump).
    All(ProxyArgs),
}

/// Flags shared by every `proxy-config` command.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// In a cluster, the proxy's pod (`[pod/]<name>[.<namespace>]`), whose Envoy admin port
    /// 15000 is reached by port-forward through the API server.
    #[arg(value_name = "POD")]
    pub pod: Option<String>,
    /// The namespace of the pod when its name does not say.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub kube: crate::cluster::KubeArgs,
    /// Envoy's admin address.
    #[arg(long, env = "PROXY_ADMIN", default_value = "http://localhost:15000")]
    pub proxy_admin: String,
    /// Read a saved `/config_dump?include_eds` JSON file instead ('-' for stdin).
    #[arg(long, short = 'f', visible_alias = "file")]
    pub config_dump: Option<PathBuf>,
    /// Output format: short (tables), json or yaml.
    #[arg(long, short = 'o', value_enum, default_value = "short")]
    pub output: Output,
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyConfigError {
    #[error("cannot read the config dump from Envoy's admin endpoint: {0}")]
    Fetch(#[from] crate::http::HttpError),
    #[error("cannot read config dump file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error("the config dump is not Envoy's JSON (`configs` list): {0}")]
    NotADump(String),
    #[error("cannot print {format}: {message}")]
    Print {
        format: &'static str,
        message: String,
    },
}

impl ProxyConfigError {
    pub fn reason(&self) -> &'static str {
        match self {
            ProxyConfigError::Fetch(e) => e.reason(),
            ProxyConfigError::File { .. } => "file",
            ProxyConfigError::Cluster(_) => "cluster",
            ProxyConfigError::NotADump(_) => "not_a_dump",
            ProxyConfigError::Print { .. } => "print",
        }
    }
}

/// A section of the dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Listeners,
    Clusters,
    Routes,
    Endpoints,
    Secrets,
    All,
}

impl Section {
    /// The `@type` suffix of the dump entry holding this section.
    fn dump_type(self) -> Option<&'static str> {
        match self {
            Section::Listeners => Some("ListenersConfigDump"),
            Section::Clusters => Some("ClustersConfigDump"),
            Section::Routes => Some("RoutesConfigDump"),
            Section::Endpoints => Some("EndpointsConfigDump"),
            Section::Secrets => Some("SecretsConfigDump"),
            Section::All => None,
        }
    }
}

/// An Envoy config dump.
#[derive(Debug, Clone)]
pub struct EnvoyDump {
    configs: Vec<Value>,
}

impl EnvoyDump {
    pub fn parse(bytes: &[u8]) -> Result<EnvoyDump, ProxyConfigError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| ProxyConfigError::NotADump(e.to_string()))?;
        let configs = value["configs"]
            .as_array()
            .cloned()
            .ok_or_else(|| ProxyConfigError::NotADump("no `configs` array".into()))?;
        Ok(EnvoyDump { configs })
    }

    /// The dump entry whose `@type` ends with `suffix` (JSON null when absent).
    pub fn entry(&self, suffix: &str) -> &Value {
        static NULL: Value = Value::Null;
        self.configs
            .iter()
            .find(|c| c["@type"].as_str().is_some_and(|t| t.ends_with(suffix)))
            .unwrap_or(&NULL)
    }
}

impl ProxyConfig {
    fn parts(&self) -> (Section, &ProxyArgs) {
        match self {
            ProxyConfig::Listener(a) => (Section::Listeners, a),
            ProxyConfig::Cluster(a) => (Section::Clusters, a),
            ProxyConfig::Route(a) => (Section::Routes, a),
            ProxyConfig::Endpoint(a) => (Section::Endpoints, a),
            ProxyConfig::Secret(a) => (Section::Secrets, a),
            ProxyConfig::All(a) => (Section::All, a),
        }
    }
}

pub async fn run(cmd: ProxyConfig) -> Result<(), ProxyConfigError> {
    let (section, args) = cmd.parts();
    let bytes = match &args.config_dump {
        Some(path) => read_file(path)?,
        None if args.pod.is_some() => {
            let pod = args.pod.as_deref().unwrap_or_default();
            let (namespace, pod) = crate::cluster::pod_ref(pod, &args.namespace);
            let cluster = args.kube.cluster().await?;
            crate::http::get_from_pod(
                cluster.client(),
                &namespace,
                &pod,
                15000,
                "/config_dump?include_eds",
            )
            .await?
        }
        None => crate::http::get(&args.proxy_admin, "/config_dump?include_eds").await?,
    };
    let dump = EnvoyDump::parse(&bytes)?;
    print!("{}", render(&dump, section, args.output)?);
    Ok(())
}

fn read_file(path: &std::path::Path) -> Result<Vec<u8>, ProxyConfigError> {
    crate::input::read_path_or_stdin(path).map_err(|source| ProxyConfigError::File {
        path: path.to_path_buf(),
        source,
    })
}

/// The text `istioctl proxy-config <section>` prints.
pub fn render(
    dump: &EnvoyDump,
    section: Section,
    output: Output,
) -> Result<String, ProxyConfigError> {
    if output == Output::Short {
        return Ok(match section {
            Section::Listeners => tables::listeners(dump),
            Section::Clusters => tables::clusters(dump),
            Section::Routes => tables::routes(dump),
            Section::Endpoints => tables::endpoints(dump),
            Section::Secrets => tables::secrets(dump),
            Section::All => [
                tables::clusters(dump),
                tables::listeners(dump),
                tables::routes(dump),
                tables::endpoints(dump),
                tables::secrets(dump),
            ]
            .join("\n"),
        });
    }
    let value = match section.dump_type() {
        Some(t) => dump.entry(t).clone(),
        None => Value::Array(dump.configs.clone()),
    };
    let text = match output {
        Output::Yaml => serde_yaml::to_string(&value).map_err(|e| ProxyConfigError::Print {
            format: "yaml",
            message: e.to_string(),
        })?,
        _ => {
            let mut s =
                serde_json::to_string_pretty(&value).map_err(|e| ProxyConfigError::Print {
                    format: "json",
                    message: e.to_string(),
                })?;
            s.push('\n');
            s
        }
    };
    Ok(text)
}

#[cfg(test)]
mod tests;
