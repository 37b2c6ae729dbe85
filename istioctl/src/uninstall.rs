//! `istioctl uninstall`: deletes what installs left, found by their labels, as Istio's does.
//!
//! - `--revision r` (or `--set revision=r`, or `-f` with a file naming one): the control plane
//!   of that revision (istiod, CNI, ztunnel; not the base component, whose CRDs and validation
//!   other revisions share), and waypoints labelled for that revision.
//! - `-f file` without a revision: the control plane components of every revision (no
//!   waypoints).
//! - `--purge`: everything any install labelled, CRDs included (and with them every Istio
//!   object users wrote), and every waypoint. The `istio-system` namespace stays.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use mesh_charts::manifest::COMPONENT_LABEL;
use mesh_charts::operator::{OperatorSpec, SpecError};

use crate::cluster::{ClusterError, KubeArgs};
use crate::install::{confirm, owned, valid_revision};
use owned::Owned;

/// Flags of `istioctl uninstall`.
#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// Delete every Istio resource of every revision, CRDs included.
    #[arg(long)]
    pub purge: bool,
    /// The control plane revision to remove.
    #[arg(short = 'r', long)]
    pub revision: Option<String>,
    /// The IstioOperator file of the install to remove (its revision is used).
    #[arg(short = 'f', long = "filename")]
    pub file: Option<PathBuf>,
    /// An IstioOperator spec field, as for install (`revision=canary`).
    #[arg(short = 's', long = "set")]
    pub sets: Vec<String>,
    /// Remove without asking for confirmation.
    #[arg(short = 'y', long = "skip-confirmation")]
    pub yes: bool,
    /// Console output only: list what would be removed, remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// List every resource that will be removed.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Why nothing (or not everything) was removed.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error("at least one of the --revision (or --set revision=<revision>), --filename or --purge flags must be set")]
    NothingChosen,
    #[error("invalid revision specified: {0:?} must be a DNS label")]
    Revision(String),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("cannot uninstall: {0}")]
    Cluster(#[from] ClusterError),
}

/// The components an uninstall without `--purge` removes (Istio's list; base stays).
const CONTROL_PLANE: &str = "Pilot,IngressGateways,EgressGateways,Cni,IstiodRemote,Ztunnel";

/// What to select: the revision asked for, if any.
fn revision(args: &UninstallArgs) -> Result<Option<String>, UninstallError> {
    let mut spec = OperatorSpec::default();
    if let Some(file) = &args.file {
        spec.merge_file(file)?;
    }
    for flag in &args.sets {
        spec.set(flag)?;
    }
    let revision = args.revision.clone().or_else(|| spec.string("revision"));
    if let Some(r) = &revision {
        if !valid_revision(r) {
            return Err(UninstallError::Revision(r.clone()));
        }
    }
    Ok(revision)
}

/// Runs `istioctl uninstall`.
pub async fn run(args: &UninstallArgs) -> Result<ExitCode, UninstallError> {
    let revision = revision(args)?;
    if !args.purge && revision.is_none() && args.file.is_none() {
        return Err(UninstallError::NothingChosen);
    }
    if args.purge && (revision.is_some() || args.file.is_some()) {
        println!("Purge uninstall will remove all Istio resources, ignoring the specified revision or operator file");
    }
    let mut cluster = args.kube.cluster().await?;
    let (selector, mut kinds) = if args.purge {
        (
            COMPONENT_LABEL.to_string(),
            owned::NAMESPACED_KINDS.to_vec(),
        )
    } else {
        let mut selector = format!("{COMPONENT_LABEL} in ({CONTROL_PLANE})");
        if let Some(r) = &revision {
            selector.push_str(&format!(",istio.io/rev={r}"));
        }
        (selector, owned::NAMESPACED_KINDS.to_vec())
    };
    kinds.extend(owned::CLUSTER_KINDS);
    if args.purge {
        kinds.extend(owned::PURGE_KINDS);
    }
    let mut objects = owned::find(&mut cluster, &kinds, &selector).await?;
    // Waypoints go with --purge (all of them) or with their revision's control plane.
    let waypoint_selector = match (&revision, args.purge) {
        (_, true) => Some(String::new()),
        (Some(r), false) => Some(format!("istio.io/rev={r}")),
        (None, false) => None,
    };
    if let Some(selector) = waypoint_selector {
        objects.extend(waypoints(&mut cluster, &selector).await?);
    }
    if objects.is_empty() {
        println!(
            "No resources will be pruned from the cluster. Please double check the input configs"
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut message = String::new();
    if args.purge {
        message.push_str("All Istio resources will be pruned from the cluster\n");
    }
    if args.verbose {
        message.push_str(&summary(&objects));
    }
    if args.yes || args.dry_run {
        print!("{message}");
    } else if !confirm(&format!("{message}Proceed?")) {
        println!("Cancelled.");
        return Ok(ExitCode::FAILURE);
    }
    owned::delete(&mut cluster, &objects, args.dry_run).await?;
    println!("\u{2714} Uninstall complete");
    Ok(ExitCode::SUCCESS)
}

/// The waypoints matching `selector`, as objects to delete.
async fn waypoints(
    cluster: &mut crate::cluster::Cluster,
    selector: &str,
) -> Result<Vec<Owned>, ClusterError> {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    Ok(crate::waypoint::in_cluster(cluster, selector)
        .await?
        .iter()
        .map(|g| Owned {
            api_version: crate::waypoint::GATEWAY_API.to_string(),
            kind: "Gateway".to_string(),
            namespace: s(&g["metadata"]["namespace"]),
            name: s(&g["metadata"]["name"]),
            component: String::new(),
        })
        .collect())
}

/// `The following resources will be pruned from the cluster: Kind: a, b. Kind: c.`
fn summary(objects: &[Owned]) -> String {
    let mut by_kind: Vec<(String, Vec<String>)> = Vec::new();
    for o in objects {
        let name = if o.namespace.is_empty() {
            o.name.clone()
        } else {
            format!("{}/{}", o.namespace, o.name)
        };
        match by_kind.iter_mut().find(|(k, _)| *k == o.kind) {
            Some((_, names)) => names.push(name),
            None => by_kind.push((o.kind.clone(), vec![name])),
        }
    }
    let parts: Vec<String> = by_kind
        .into_iter()
        .map(|(kind, names)| format!("{kind}: {}. ", names.join(", ")))
        .collect();
    format!(
        "The following resources will be pruned from the cluster: {}\n",
        parts.concat().trim_end()
    )
}
