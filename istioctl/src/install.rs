//! `istioctl install`: renders the same objects as `manifest generate`, applies them to the
//! cluster component by component (server-side apply as `istio-operator`, taking over
//! conflicting fields), waits for each component's CRDs and workloads, then prunes what an
//! earlier install by this istioctl left and this one no longer renders.
//!
//! Components go in Istio's dependency order: base, then istiod, then the CNI agent, then
//! ztunnel (which needs the CNI agent to enroll pods). A component that fails is reported and
//! the rest still go on, as with Istio; nothing is pruned unless every component succeeded.

pub mod owned;
pub mod ready;

use std::collections::BTreeSet;
use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use mesh_charts::manifest::{generate, Component, Manifest, ManifestError};
use mesh_charts::operator::SpecError;

use crate::cluster::{Cluster, ClusterError, KubeArgs};
use crate::manifest::{self, GenerateArgs};
use owned::Owned;
use ready::{Awaited, WaitError};

/// The field manager of every apply, as Istio's installer.
pub const FIELD_MANAGER: &str = "istio-operator";

/// Flags of `istioctl install`.
#[derive(Debug, Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub generate: GenerateArgs,
    /// The control plane revision (a DNS label); objects get `istio.io/rev=<revision>`.
    #[arg(short = 'r', long)]
    pub revision: Option<String>,
    /// Install without asking for confirmation.
    #[arg(short = 'y', long = "skip-confirmation")]
    pub yes: bool,
    /// How long to wait for each component's CRDs and workloads to be ready.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "300s")]
    pub readiness_timeout: Duration,
    /// Console output only: render and report, make no changes.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Why the install did not happen or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Generate(#[from] manifest::GenerateError),
    #[error("invalid revision specified: {0:?} must be a DNS label (lower-case letters, digits and '-', at most 63, starting and ending with a letter or digit)")]
    Revision(String),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("failed to install manifests: {}", .0.join("; "))]
    Components(Vec<String>),
}

/// Istio's name and emoji for a component in progress lines.
fn display(component: Component) -> (&'static str, &'static str) {
    match component {
        Component::Base => ("Istio core", "\u{26f5}\u{fe0f}"),
        Component::Pilot => ("Istiod", "\u{1f9e0}"),
        Component::Cni => ("CNI", "\u{1faa2}"),
        Component::Ztunnel => ("Ztunnel", "\u{1f512}"),
    }
}

/// A DNS-1123 label.
pub fn valid_revision(r: &str) -> bool {
    let b = r.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Asks `question` followed by ` (y/N)` until the answer is yes or no; an unreadable or
/// closed input is a no.
pub fn confirm(question: &str) -> bool {
    let stdin = std::io::stdin();
    loop {
        println!("{question} (y/N)");
        let mut line = String::new();
        match stdin.lock().read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        match line.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => return true,
            "n" | "no" | "" => return false,
            _ => {}
        }
    }
}

/// Renders what the flags ask for.
pub fn render(args: &InstallArgs) -> Result<Manifest, InstallError> {
    let mut spec = manifest::spec(&args.generate)?;
    if let Some(r) = &args.revision {
        spec.set(&format!("revision={r}"))?;
    }
    if let Some(r) = spec.string("revision") {
        if !valid_revision(&r) {
            return Err(InstallError::Revision(r));
        }
    }
    let charts = manifest::Charts::open(args.generate.manifests.as_deref())?;
    Ok(generate(&charts.helm, &charts.dir, &spec)?)
}

/// Runs `istioctl install`.
pub async fn run(args: &InstallArgs) -> Result<ExitCode, InstallError> {
    let manifest = render(args)?;
    for note in &manifest.notes {
        eprintln!("note: {note}");
    }
    if !args.yes && !args.dry_run {
        let question = format!(
            "This will install the Istio {} profile {:?} into the cluster. Proceed?",
            mesh_charts::manifest::OPERATOR_VERSION,
            manifest.profile
        );
        if !confirm(&question) {
            println!("Cancelled.");
            return Ok(ExitCode::FAILURE);
        }
    }
    let mut cluster = args.kube.cluster().await?;
    if !args.dry_run {
        let mut labels = serde_json::Map::new();
        if let Some(network) = &manifest.network {
            labels.insert("topology.istio.io/network".into(), network.clone().into());
        }
        cluster
            .ensure_namespace(&manifest.namespace, &labels)
            .await?;
    }
    let mut failures = Vec::new();
    let mut rendered: BTreeSet<(String, String, String)> = BTreeSet::new();
    for (component, objects) in &manifest.components {
        let (name, icon) = display(*component);
        match install_component(&mut cluster, &manifest, objects, args, name, &mut rendered).await {
            Ok(()) => println!("\u{2714} {name} installed {icon}"),
            Err(e) => {
                println!("\u{2718} {name} encountered an error: {e}");
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    if !failures.is_empty() {
        return Err(InstallError::Components(failures));
    }
    if !args.dry_run {
        println!("- Pruning removed resources");
        prune(&mut cluster, &manifest.revision, &rendered).await?;
    }
    println!("\u{2714} Installation complete");
    if manifest.profile == "ambient" {
        println!(
            "The ambient profile has been installed successfully, enjoy Istio without sidecars!"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Applies one component's objects in rendered order, then waits for them.
async fn install_component(
    cluster: &mut Cluster,
    manifest: &Manifest,
    objects: &[mesh_charts::Object],
    args: &InstallArgs,
    name: &str,
    rendered: &mut BTreeSet<(String, String, String)>,
) -> Result<(), ComponentError> {
    let mut awaited = Vec::new();
    for object in objects {
        let namespace = cluster
            .namespace_of(&object.value, &manifest.namespace)
            .await?;
        rendered.insert((
            object.kind().to_string(),
            namespace.clone(),
            object.name().to_string(),
        ));
        if !args.dry_run {
            cluster
                .apply(&object.value, &namespace, FIELD_MANAGER)
                .await?;
        }
        if ready::waits_for(object.kind()) {
            awaited.push(Awaited {
                api_version: object.api_version().to_string(),
                kind: object.kind().to_string(),
                namespace,
                name: object.name().to_string(),
            });
        }
    }
    if args.dry_run || awaited.is_empty() {
        return Ok(());
    }
    ready::wait(cluster, &awaited, args.readiness_timeout, |pending| {
        println!(
            "- Processing resources for {name}. Waiting for {}",
            pending.join(", ")
        );
    })
    .await?;
    Ok(())
}

/// What stopped one component.
#[derive(Debug, thiserror::Error)]
enum ComponentError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("failed to wait for resource: {0}")]
    Wait(#[from] WaitError),
}

/// Deletes what this istioctl installed for the revision earlier (of any component, enabled or
/// not) and did not render now. CRDs are never pruned: that would delete users' objects.
async fn prune(
    cluster: &mut Cluster,
    revision: &str,
    rendered: &BTreeSet<(String, String, String)>,
) -> Result<(), ClusterError> {
    let kinds: Vec<(&str, &str)> = owned::NAMESPACED_KINDS
        .into_iter()
        .chain(owned::CLUSTER_KINDS)
        .collect();
    let stale: Vec<Owned> = owned::find(cluster, &kinds, &owned::install_selector(revision))
        .await?
        .into_iter()
        .filter(|o| owned::ours(&o.component))
        .filter(|o| !rendered.contains(&(o.kind.clone(), o.namespace.clone(), o.name.clone())))
        .collect();
    owned::delete(cluster, &stale, false).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_are_dns_labels() {
        for good in ["default", "canary", "1-24-0", "a"] {
            assert!(valid_revision(good), "{good}");
        }
        for bad in ["", "Canary", "-a", "a-", "a.b", &"a".repeat(64)] {
            assert!(!valid_revision(bad), "{bad}");
        }
    }
}
