//! Running Helm's engine (`scripts/helm.py` over the helm-python-sdk wheel).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;
use serde_json::Value;

use crate::objects::{ManifestError, Rendered};

/// Why Helm could not render or lint a chart.
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    #[error("cannot run {program}: {source}; is python3 installed (scripts/install-deps.sh)?")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("Helm's engine is not installed: {0}")]
    NotInstalled(String),
    /// Helm refused: a template's `fail`, a value of the wrong type, a broken template.
    #[error("helm {action} {chart}: {message}")]
    Refused {
        action: &'static str,
        chart: String,
        message: String,
    },
    #[error("helm {action} {chart}: unreadable answer from scripts/helm.py: {source}")]
    BadAnswer {
        action: &'static str,
        chart: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

impl HelmError {
    /// A short label for metrics and test output.
    pub fn reason(&self) -> &'static str {
        match self {
            HelmError::Spawn { .. } => "spawn",
            HelmError::NotInstalled(_) => "not_installed",
            HelmError::Refused { .. } => "refused",
            HelmError::BadAnswer { .. } => "bad_answer",
            HelmError::Manifest(_) => "manifest",
        }
    }
}

/// How serious a lint finding is (Helm's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(from = "u8")]
pub enum Severity {
    Unknown,
    Info,
    Warning,
    Error,
}

impl From<u8> for Severity {
    fn from(n: u8) -> Self {
        match n {
            1 => Severity::Info,
            2 => Severity::Warning,
            3 => Severity::Error,
            _ => Severity::Unknown,
        }
    }
}

/// One finding of `helm lint`.
#[derive(Debug, Clone, Deserialize)]
pub struct LintMessage {
    pub severity: Severity,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub error: String,
}

/// What `helm lint` reported.
#[derive(Debug, Clone, Deserialize)]
pub struct LintReport {
    #[serde(default)]
    pub total_charts_linted: u32,
    #[serde(default)]
    pub messages: Vec<LintMessage>,
    #[serde(default, deserialize_with = "nullable_list")]
    pub errors: Vec<String>,
}

fn nullable_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

impl LintReport {
    /// Findings at `at_least` or worse.
    pub fn findings(&self, at_least: Severity) -> Vec<&LintMessage> {
        self.messages
            .iter()
            .filter(|m| m.severity >= at_least)
            .collect()
    }
}

/// Helm's engine, reached through `scripts/helm.py`.
#[derive(Debug, Clone)]
pub struct Helm {
    python: PathBuf,
    script: PathBuf,
    engine_dir: Option<PathBuf>,
}

impl Default for Helm {
    fn default() -> Self {
        Helm {
            python: PathBuf::from("python3"),
            script: crate::repo_root().join("scripts/helm.py"),
            engine_dir: std::env::var_os("HELM_PYTHON_DIR").map(PathBuf::from),
        }
    }
}

impl Helm {
    /// Helm's engine through the front end at `script` (see [`crate::embedded`]).
    pub fn with_script(script: PathBuf) -> Self {
        Helm {
            script,
            ..Helm::default()
        }
    }

    /// Renders `chart` as `helm install <release> <chart> -n <namespace>` would, offline.
    pub fn render(
        &self,
        chart: &Path,
        release: &str,
        namespace: &str,
        values: &Value,
    ) -> Result<Rendered, HelmError> {
        #[derive(Deserialize)]
        struct Answer {
            manifests: std::collections::BTreeMap<String, String>,
        }
        let args = ["--name", release, "--namespace", namespace];
        let out = self.run("render", chart, &args, values)?;
        let answer: Answer =
            serde_json::from_slice(&out).map_err(|source| HelmError::BadAnswer {
                action: "render",
                chart: chart.display().to_string(),
                source,
            })?;
        Ok(Rendered::parse(answer.manifests)?)
    }

    /// `helm lint [--strict]` with the given values, as for Kubernetes `kube_version`.
    pub fn lint(
        &self,
        chart: &Path,
        values: &Value,
        strict: bool,
        kube_version: &str,
    ) -> Result<LintReport, HelmError> {
        let mut args = vec!["--kube-version", kube_version];
        if strict {
            args.push("--strict");
        }
        let out = self.run("lint", chart, &args, values)?;
        serde_json::from_slice(&out).map_err(|source| HelmError::BadAnswer {
            action: "lint",
            chart: chart.display().to_string(),
            source,
        })
    }

    fn run(
        &self,
        action: &'static str,
        chart: &Path,
        args: &[&str],
        values: &Value,
    ) -> Result<Vec<u8>, HelmError> {
        let spawn_error = |source| HelmError::Spawn {
            program: self.python.display().to_string(),
            source,
        };
        let mut command = Command::new(&self.python);
        command
            .arg(&self.script)
            .arg(action)
            .arg(chart)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &self.engine_dir {
            command.env("HELM_PYTHON_DIR", dir);
        }
        let mut child = command.spawn().map_err(spawn_error)?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(values.to_string().as_bytes())
                .map_err(spawn_error)?;
        }
        let out = child.wait_with_output().map_err(spawn_error)?;
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        match out.status.code() {
            Some(0) => Ok(out.stdout),
            Some(3) => Err(HelmError::NotInstalled(stderr)),
            _ => Err(HelmError::Refused {
                action,
                chart: chart.display().to_string(),
                message: stderr,
            }),
        }
    }
}
