//! `istioctl analyze <dir>`: loads a directory of manifests with the loader istiod uses
//! (`mesh_source::load_directory`), turns its problems into IST0106/IST0133 messages with file
//! and line, and runs the ambient analyzers. Like upstream, the text output exits 79 when a
//! message reaches `--failure-threshold` (Error by default); json/yaml output exits 0.

mod analyzers;
mod index;
mod live;
pub mod message;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use mesh_api::ApiError;
use mesh_source::{Problem, SourceError};

pub use message::{Level, Message};

/// Exit code upstream istioctl uses when analyzers found issues.
pub const EXIT_ANALYZER_FOUND_ISSUES: u8 = 79;

/// Flags of `istioctl analyze`.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// Directories (or files) of Kubernetes YAML/JSON to analyze (with a cluster, laid over
    /// its live objects).
    pub paths: Vec<PathBuf>,
    /// Analyze the live cluster too [default: when --kubeconfig or --context names one;
    /// `-k` alone uses $KUBECONFIG, ~/.kube/config or the in-cluster configuration];
    /// `--use-kube=false` analyzes the files only.
    #[arg(short = 'k', long, num_args = 0..=1, default_missing_value = "true")]
    pub use_kube: Option<bool>,
    #[command(flatten)]
    pub kube: crate::cluster::KubeArgs,
    /// With a cluster, the namespace whose messages are shown.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// With a cluster, show the messages of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output format: log (text), json or yaml.
    #[arg(long, short = 'o', value_enum, default_value = "log")]
    pub output: Format,
    /// The lowest level of message that makes the command exit 79 (text output only).
    #[arg(long, value_enum, ignore_case = true, default_value = "error")]
    pub failure_threshold: Level,
    /// The lowest level of message printed.
    #[arg(long, value_enum, ignore_case = true, default_value = "info")]
    pub output_threshold: Level,
    /// Namespace whose selector-less AuthorizationPolicies apply mesh-wide.
    #[arg(long, env = "ROOT_NAMESPACE", default_value = "istio-system")]
    pub istio_namespace: String,
}

/// Message output format (upstream's `log` is also accepted as `text`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[value(alias = "text")]
    Log,
    Json,
    Yaml,
}

/// Why analysis could not run.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("cannot read {path}: {source}; pass a directory or file of manifests")]
    Path {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("pass directories or files of manifests to analyze, or a cluster (--kubeconfig, --context or -k)")]
    NothingToAnalyze,
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error("cannot print the messages as {format}: {message}")]
    Print {
        format: &'static str,
        message: String,
    },
}

impl AnalyzeError {
    /// Short label for the error kind.
    pub fn reason(&self) -> &'static str {
        match self {
            AnalyzeError::Path { .. } => "path",
            AnalyzeError::NothingToAnalyze => "nothing_to_analyze",
            AnalyzeError::Cluster(_) => "cluster",
            AnalyzeError::Print { .. } => "print",
        }
    }
}

/// Every message for the manifests under `path`, sorted by file, line and code.
pub fn analyze(path: &Path, root_namespace: &str) -> Vec<Message> {
    let (objects, errors) = mesh_source::load_directory(path);
    let index = index::Index::build(path);
    let mut messages: Vec<Message> = errors.iter().filter_map(loader_message).collect();
    let snapshot = analyzers::Snapshot {
        objects: &objects,
        index: &index,
        root_namespace,
    };
    messages.extend(snapshot.analyze());
    messages.sort_by_key(Message::sort_key);
    messages.dedup();
    messages
}

/// The message for a loader problem; `None` for Gateway API Gateways, which the loader does
/// not read but analyze does (waypoints).
fn loader_message(err: &SourceError) -> Option<Message> {
    let origin = message::Origin {
        resource: err.key.as_ref().map(message::friendly_name),
        file: err.file.clone(),
        line: err.line,
    };
    let (kind, text) = match &err.problem {
        Problem::InvalidObject(ApiError::UnsupportedKind { api_version, kind }) => {
            if index::Index::is_gateway(api_version, kind) {
                return None;
            }
            (&message::codes::SCHEMA_WARNING, "Schema validation warning")
        }
        Problem::Duplicate { .. } => (&message::codes::SCHEMA_WARNING, "Schema validation warning"),
        _ => (
            &message::codes::SCHEMA_VALIDATION_ERROR,
            "Schema validation error",
        ),
    };
    Some(kind.message(Some(origin), format!("{text}: {}", err.problem)))
}

impl AnalyzeArgs {
    /// Whether the live cluster is analyzed.
    pub fn uses_cluster(&self) -> bool {
        self.use_kube.unwrap_or_else(|| self.kube.given())
    }
}

/// Runs the command: prints messages, returns 79 when text output found issues.
pub async fn run(args: &AnalyzeArgs) -> Result<ExitCode, AnalyzeError> {
    let files = args
        .paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if args.uses_cluster() {
        let mut cluster = args.kube.cluster().await?;
        let workspace = live::prepare(&mut cluster, &args.paths).await?;
        let mut all = analyze(workspace.root(), &args.istio_namespace);
        workspace.relocate(&mut all);
        if !args.all_namespaces {
            all.retain(|m| live::message_namespace(m).is_none_or(|ns| ns == args.namespace));
        }
        all.sort_by_key(Message::sort_key);
        let mut targets = if args.all_namespaces {
            "all namespaces".to_string()
        } else {
            format!("namespace: {}", args.namespace)
        };
        if !files.is_empty() {
            targets.push_str(&format!(" with {files}"));
        }
        return report(args, &all, &targets);
    }
    if args.paths.is_empty() {
        return Err(AnalyzeError::NothingToAnalyze);
    }
    let mut all = Vec::new();
    for path in &args.paths {
        std::fs::metadata(path).map_err(|source| AnalyzeError::Path {
            path: path.clone(),
            source,
        })?;
        all.extend(analyze(path, &args.istio_namespace));
    }
    report(args, &all, &files)
}

/// Prints the messages as the flags ask and says how the command ends.
fn report(args: &AnalyzeArgs, all: &[Message], targets: &str) -> Result<ExitCode, AnalyzeError> {
    let shown: Vec<&Message> = all
        .iter()
        .filter(|m| m.level <= args.output_threshold)
        .collect();
    match args.output {
        Format::Log => {
            for m in &shown {
                println!("{m}");
            }
        }
        Format::Json => println!("{}", to_json(&shown)?),
        Format::Yaml => print!("{}", to_yaml(&shown)?),
    }
    if shown.is_empty() {
        eprintln!("\u{2714} No validation issues found when analyzing {targets}.");
    }
    let failed = all.iter().any(|m| m.level <= args.failure_threshold);
    if args.output == Format::Log && failed {
        eprintln!(
            "Error: Analyzers found issues when analyzing {targets}.\nSee https://istio.io/latest/docs/reference/config/analysis for more information about causes and resolutions."
        );
        return Ok(ExitCode::from(EXIT_ANALYZER_FOUND_ISSUES));
    }
    Ok(ExitCode::SUCCESS)
}

fn to_json(messages: &[&Message]) -> Result<String, AnalyzeError> {
    let list: Vec<_> = messages.iter().map(|m| m.structured()).collect();
    serde_json::to_string_pretty(&list).map_err(|e| AnalyzeError::Print {
        format: "json",
        message: e.to_string(),
    })
}

fn to_yaml(messages: &[&Message]) -> Result<String, AnalyzeError> {
    let list: Vec<_> = messages.iter().map(|m| m.structured()).collect();
    serde_yaml::to_string(&list).map_err(|e| AnalyzeError::Print {
        format: "yaml",
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
