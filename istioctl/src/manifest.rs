//! `istioctl manifest generate`: the objects an install of the mesh writes, from the charts.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use mesh_charts::embedded::Extracted;
use mesh_charts::manifest::{generate, ManifestError};
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
    /// The charts to render [default: the charts built into istioctl].
    #[arg(short = 'd', long = "manifests", env = "MESH_CHARTS_DIR")]
    pub manifests: Option<PathBuf>,
}

/// The charts a command renders and the engine that renders them.
pub struct Charts {
    pub dir: PathBuf,
    pub helm: Helm,
    /// The embedded charts' scratch copy, kept while in use.
    _extracted: Option<Extracted>,
}

impl Charts {
    /// `-d` / `MESH_CHARTS_DIR`, else the charts built into this istioctl (written to a
    /// scratch directory).
    pub fn open(manifests: Option<&std::path::Path>) -> Result<Charts, GenerateError> {
        // Helm's front end always comes from the binary, whichever charts are rendered.
        let extracted = mesh_charts::embedded::extract().map_err(GenerateError::Extract)?;
        Ok(Charts {
            dir: manifests.map_or_else(|| extracted.charts_dir(), std::path::Path::to_path_buf),
            helm: extracted.helm(),
            _extracted: Some(extracted),
        })
    }
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
    #[error("cannot write the built-in charts to a scratch directory: {0}")]
    Extract(std::io::Error),
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
    let charts = Charts::open(args.manifests.as_deref())?;
    let manifest = generate(&charts.helm, &charts.dir, &spec)?;
    Ok((manifest.to_yaml()?, manifest.notes))
}
