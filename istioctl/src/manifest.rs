//! `istioctl manifest generate`: the objects an install of the mesh writes, from the charts.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use mesh_charts::manifest::{default_charts_dir, generate, ManifestError};
use mesh_charts::operator::{OperatorSpec, SpecError};
use mesh_charts::Helm;

#[derive(Debug, Subcommand)]
pub enum ManifestCommand {
    /// Print the Kubernetes objects an install would write (YAML), without a cluster.
    Generate(GenerateArgs),
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// An IstioOperator file; several are laid over each other in order.
    #[arg(short = 'f', long = "filename")]
    pub files: Vec<PathBuf>,
    /// An IstioOperator spec field, as `profile=ambient` or `values.global.hub=x`; applied
    /// after the files, in order.
    #[arg(short = 's', long = "set")]
    pub sets: Vec<String>,
    /// The charts to render [default: $MESH_CHARTS_DIR, else this build's charts/].
    #[arg(short = 'd', long = "manifests")]
    pub manifests: Option<PathBuf>,
}

/// Why no manifest was printed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("cannot write the objects as YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

/// Merges the files and flags into one spec, as istioctl does.
pub fn spec(args: &GenerateArgs) -> Result<OperatorSpec, SpecError> {
    let mut spec = OperatorSpec::default();
    for file in &args.files {
        spec.merge_file(file)?;
    }
    for flag in &args.sets {
        spec.set(flag)?;
    }
    Ok(spec)
}

/// The manifest as YAML, and notes for standard error.
pub fn run(command: ManifestCommand) -> Result<(String, Vec<String>), GenerateError> {
    let ManifestCommand::Generate(args) = command;
    let spec = spec(&args)?;
    let charts = args.manifests.clone().unwrap_or_else(default_charts_dir);
    let manifest = generate(&Helm::default(), &charts, &spec)?;
    Ok((manifest.to_yaml()?, manifest.notes))
}
