//! Keeping istio-cni installed: the installer's long-running mode, as Istio's install-cni
//! container runs. It waits for the primary CNI plugin to write its configuration, installs, and
//! then looks again every interval, reinstalling when any part is off:
//! - the primary configuration (chosen afresh each time) does not end with our entry. This
//!   happens when the primary plugin rewrote its file, or when a new file now sorts first;
//! - the plugin binary is missing or is not the one copied;
//! - the kubeconfig is missing or stale, for example after the token rotated.
//!
//! On stop, what was installed is taken out unless an upgrade is under way (see
//! [`Cleanup`]).

use std::future::Future;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::conflist::PLUGIN_TYPE;
use super::{choose_primary, install, uninstall, InstallError, InstallOptions};

/// What to do with the installation on stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// Take out what was installed (the DaemonSet is gone, or being deleted).
    Remove,
    /// Leave it: a new pod of the same DaemonSet takes over (an upgrade or a restart).
    Keep,
}

/// The length and modification time of a file, to notice it being replaced.
fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// Why the installation needs repair, if it does.
pub fn needs_repair(
    opts: &InstallOptions,
    binary_stamp: Option<(u64, SystemTime)>,
) -> Result<Option<String>, InstallError> {
    let installed_binary = opts.bin_dir.join(PLUGIN_TYPE);
    if binary_stamp.is_none() || stamp(&installed_binary) != binary_stamp {
        return Ok(Some(format!(
            "{} is missing or was replaced",
            installed_binary.display()
        )));
    }
    if let Some((path, account)) = &opts.kubeconfig {
        let wanted = account.kubeconfig()?;
        if !super::kubeconfig::holds(path, &wanted) {
            return Ok(Some(format!("{} is missing or stale", path.display())));
        }
    }
    let Some(primary) = choose_primary(&opts.net_dir, opts.conf_name.as_deref())? else {
        return Ok(Some("no primary CNI configuration".into()));
    };
    let current: Option<Value> = std::fs::read(&primary)
        .ok()
        .and_then(|t| serde_json::from_slice(&t).ok());
    let last = current
        .as_ref()
        .and_then(|c| c.get("plugins"))
        .and_then(Value::as_array)
        .and_then(|p| p.last());
    if last != Some(&super::conflist::typed_entry(&opts.entry)) {
        return Ok(Some(format!(
            "{} does not end with the istio-cni entry",
            primary.display()
        )));
    }
    Ok(None)
}

/// Installs and keeps the installation repaired, looking every `every`, until `stop`; then
/// cleans up as `cleanup` decides.
pub async fn keep_installed<C, F>(
    opts: &InstallOptions,
    every: Duration,
    stop: impl Future<Output = ()>,
    cleanup: C,
) -> Result<(), InstallError>
where
    C: FnOnce() -> F,
    F: Future<Output = Cleanup>,
{
    tokio::pin!(stop);
    let mut binary_stamp = None;
    let mut waiting_logged = false;
    loop {
        match needs_repair(opts, binary_stamp) {
            Ok(None) => {}
            Ok(Some(why)) => {
                tracing::info!(reason = %why, "installing istio-cni");
                match install(opts) {
                    Ok(file) => {
                        binary_stamp = stamp(&opts.bin_dir.join(PLUGIN_TYPE));
                        waiting_logged = false;
                        tracing::info!(file = %file.display(), "istio-cni installed");
                    }
                    Err(InstallError::NoPrimary { dir }) => {
                        // The binary and kubeconfig are in; only the chaining waits.
                        binary_stamp = stamp(&opts.bin_dir.join(PLUGIN_TYPE));
                        if !waiting_logged {
                            tracing::info!(dir = %dir.display(), "waiting for the primary CNI plugin to write its configuration");
                            waiting_logged = true;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot install istio-cni; retrying"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the istio-cni installation; retrying")
            }
        }
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
    match cleanup().await {
        Cleanup::Keep => {
            tracing::info!("leaving istio-cni installed for the next pod of the DaemonSet");
            Ok(())
        }
        Cleanup::Remove => {
            tracing::info!("removing istio-cni");
            uninstall(opts)
        }
    }
}

/// Istio's rule on stop. If the DaemonSet `name` in `namespace` still exists, is not being
/// deleted, and its pods' required node affinity still matches `node`, this is an upgrade or a
/// restart: keep the plugin in place. The nodeSelector is not looked at, as in Istio. If the
/// DaemonSet is gone, no longer wants this node, or the API cannot tell, remove the plugin.
pub async fn cleanup_unless_upgrading(
    client: kube::Client,
    namespace: &str,
    name: &str,
    node: Option<&str>,
) -> Cleanup {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Node;
    let ds_name = format!("{namespace}/{name}");
    let daemonsets: kube::Api<DaemonSet> = kube::Api::namespaced(client.clone(), namespace);
    let ds = match daemonsets.get_opt(name).await {
        Ok(Some(ds)) if ds.metadata.deletion_timestamp.is_none() => ds,
        Ok(_) => return Cleanup::Remove,
        Err(e) => {
            tracing::warn!(daemonset = %ds_name, error = %e, "cannot tell whether this is an upgrade; removing istio-cni");
            return Cleanup::Remove;
        }
    };
    let terms = ds
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.affinity)
        .and_then(|a| a.node_affinity)
        .and_then(|a| a.required_during_scheduling_ignored_during_execution)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    if terms.is_empty() {
        return Cleanup::Keep;
    }
    let Some(node) = node else {
        return Cleanup::Keep;
    };
    let nodes: kube::Api<Node> = kube::Api::all(client);
    let labels = match nodes.get_opt(node).await {
        Ok(Some(n)) => n.metadata.labels.unwrap_or_default(),
        Ok(None) => return Cleanup::Remove,
        Err(e) => {
            tracing::warn!(%node, error = %e, "cannot read this node to match the DaemonSet's affinity; removing istio-cni");
            return Cleanup::Remove;
        }
    };
    if terms.iter().any(|t| term_matches(t, &labels)) {
        Cleanup::Keep
    } else {
        tracing::info!(daemonset = %ds_name, %node, "the DaemonSet no longer runs on this node");
        Cleanup::Remove
    }
}

/// A node selector term: every expression holds for the node's labels (fields are not read).
fn term_matches(
    term: &k8s_openapi::api::core::v1::NodeSelectorTerm,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    if exprs.is_empty() && term.match_fields.as_deref().unwrap_or_default().is_empty() {
        // An empty term matches nothing, as the scheduler has it.
        return false;
    }
    exprs.iter().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        let number = |v: &str| v.parse::<i64>().ok();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            "Gt" => matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a > b),
            "Lt" => matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a < b),
            _ => false,
        }
    })
}
