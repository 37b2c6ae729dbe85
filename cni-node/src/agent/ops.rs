//! The agent's operations on pods. Every function that changes a pod takes the records
//! lock for its whole duration.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mesh_api::{pod_service_account, Pod};
use mesh_proto::workload::zds::WorkloadInfo;
use tracing::{debug, info, warn};

use super::cluster::PodKey;
use super::{parse_ips, AgentError, Inner, Records, RestoreSummary};
use crate::event::CniAddEvent;
use crate::redirect::PodNetwork;
use crate::selection::{decide, is_terminated, Decision};
use crate::sidecar;
use crate::state::{netns_inode, netns_still_the_pods, procscan, PodRecord, Redirection};

fn key_of(record: &PodRecord) -> PodKey {
    (record.namespace.clone(), record.name.clone())
}

fn pod_name(record: &PodRecord) -> String {
    format!("{}/{}", record.namespace, record.name)
}

fn network(record: &PodRecord) -> PodNetwork {
    PodNetwork {
        netns: record.netns.clone(),
        ips: record.ips.clone(),
        dns_capture: record.dns_capture,
        bypass_inbound: record.bypass_inbound,
    }
}

fn workload_info(record: &PodRecord) -> WorkloadInfo {
    WorkloadInfo {
        name: record.name.clone(),
        namespace: record.namespace.clone(),
        service_account: record.service_account.clone(),
    }
}

/// The pod's IPs from its status.
fn status_ips(pod: &Pod) -> Vec<IpAddr> {
    let status = pod.status.as_ref();
    let listed = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten();
    let mut ips: Vec<IpAddr> = listed.filter_map(|p| p.ip.parse().ok()).collect();
    if ips.is_empty() {
        ips.extend(status.and_then(|s| s.pod_ip.as_deref()?.parse::<IpAddr>().ok()));
    }
    ips
}

/// Writes the records; a failure is logged (the operation itself stands).
fn save(inner: &Inner, records: &Records) {
    if let Err(e) = inner.store.save(records.values()) {
        warn!(error = %e, reason = e.reason(), "cannot write the agent state");
    }
}

fn put(inner: &Inner, records: &mut Records, record: &PodRecord) {
    records.insert(key_of(record), record.clone());
    save(inner, records);
    annotate(inner, key_of(record), record.redirection);
}

/// Shows `value` on the pod `key` (Kubernetes), unless it already does.
fn annotate(inner: &Inner, key: PodKey, value: Option<Redirection>) {
    let Some(annotator) = &inner.options.annotator else {
        return;
    };
    match inner.cluster.pod(&key) {
        Some(pod) if !super::annotate::shows(&pod, value) => annotator.set(key, value),
        _ => {}
    }
}

/// Every pod in the cluster view shows what its record says (after a restart, a pod may
/// carry an annotation from before, or miss one).
fn sync_annotations(inner: &Inner, records: &Records) {
    if inner.options.annotator.is_none() {
        return;
    }
    for key in inner.cluster.pod_keys() {
        let value = records.get(&key).and_then(|r| r.redirection);
        annotate(inner, key, value);
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Enroll,
    Unenroll,
}

/// Runs the (blocking) redirector off the async threads.
async fn redirect(inner: &Inner, op: Op, record: &PodRecord) -> Result<(), AgentError> {
    let redirector = Arc::clone(&inner.redirector);
    let net = network(record);
    let pod = pod_name(record);
    let joined = tokio::task::spawn_blocking(move || match op {
        Op::Enroll => redirector.enroll(&net),
        Op::Unenroll => redirector.unenroll(&net),
    })
    .await;
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(AgentError::Redirect { pod, source }),
        Err(e) => Err(AgentError::Task {
            pod,
            detail: e.to_string(),
        }),
    }
}

/// `pending` -> capture and ZDS add together -> `enabled`. On failure everything done is
/// undone, the record is left not enrolled, and the error returned.
///
/// The capture and the ZDS add do not depend on each other: ztunnel only opens its listeners in
/// the pod's netns, and the capture only points the pod's packets at them. Both are done before
/// the ADD returns (the pod's containers start after it), so running them together takes the
/// ZDS round trip off the ADD's latency without a moment where captured traffic finds no
/// listener that the sequential order did not also have (for a running pod enrolled by a
/// reconcile, that moment only gets shorter).
async fn enroll(
    inner: &Inner,
    records: &mut Records,
    mut record: PodRecord,
) -> Result<(), AgentError> {
    let pod = pod_name(&record);
    record.redirection = Some(Redirection::Pending);
    record.redirector = Some(inner.redirector.name().to_string());
    put(inner, records, &record);
    let (captured, added) = tokio::join!(
        redirect(inner, Op::Enroll, &record),
        inner
            .zds
            .add(&record.uid, workload_info(&record), &record.netns),
    );
    // The error to return, and which half succeeded and must be undone. A netns that vanished
    // while both ran (the sandbox was torn down) fails the ADD as well: ztunnel may have got
    // its fd first, and the capture went into a namespace nobody will use.
    let failure = match (captured, added) {
        (Ok(()), Ok(())) if netns_still_the_pods(&record) => None,
        (Ok(()), Ok(())) => Some((
            AgentError::NetnsGone {
                pod: pod.clone(),
                netns: record.netns.clone(),
            },
            true,
            true,
        )),
        (Err(error), added) => Some((error, false, added.is_ok())),
        (Ok(()), Err(source)) => Some((
            AgentError::Zds {
                pod: pod.clone(),
                source,
            },
            true,
            false,
        )),
    };
    let result = match failure {
        None => Ok(()),
        Some((error, captured, added)) => {
            undo_enroll(inner, &record, captured, added).await;
            Err(error)
        }
    };
    match &result {
        Ok(()) => {
            record.redirection = Some(Redirection::Enabled);
            info!(%pod, uid = record.uid, netns = %record.netns.display(), "pod enrolled");
        }
        Err(_) => {
            record.redirection = None;
            record.redirector = None;
        }
    }
    put(inner, records, &record);
    result
}

/// Undoes the half of a failed enrollment that succeeded (a failed capture has already undone
/// its own partial work). ztunnel is told to drop the pod either way: an add that failed may
/// still have reached it.
async fn undo_enroll(inner: &Inner, record: &PodRecord, captured: bool, added: bool) {
    let pod = pod_name(record);
    if captured {
        if let Err(e) = redirect(inner, Op::Unenroll, record).await {
            warn!(%pod, error = %e, "cannot remove the capture of a failed enrollment");
        }
    }
    match inner.zds.del(&record.uid).await {
        Err(e) if added => {
            warn!(%pod, error = %e, "cannot tell ztunnel to drop the pod of a failed enrollment");
        }
        Err(e) => debug!(%pod, error = %e, "ZDS del after a failed add"),
        Ok(()) => {}
    }
}

/// Removes the capture and tells ztunnel; errors are logged (the pod is gone or leaving).
async fn teardown(inner: &Inner, record: &mut PodRecord) {
    if record.redirection.is_none() {
        return;
    }
    let pod = pod_name(record);
    if let Err(e) = redirect(inner, Op::Unenroll, record).await {
        warn!(%pod, error = %e, reason = e.reason(), "cannot remove the pod's capture");
    }
    if let Err(e) = inner.zds.del(&record.uid).await {
        warn!(%pod, error = %e, reason = e.reason(), "cannot tell ztunnel the pod left");
    }
    record.redirection = None;
    record.redirector = None;
    info!(%pod, uid = record.uid, "pod unenrolled");
}

/// The CNI ADD path.
pub(super) async fn cni_add(inner: &Inner, event: CniAddEvent) -> Result<(), AgentError> {
    let key: PodKey = (event.pod_namespace.clone(), event.pod_name.clone());
    let uid = Some(event.pod_uid.as_str()).filter(|u| !u.is_empty());
    let pod = inner
        .cluster
        .wait_pod(&key, uid, inner.options.pod_wait)
        .await
        .ok_or_else(|| AgentError::PodNotFound {
            namespace: key.0.clone(),
            name: key.1.clone(),
            waited: inner.options.pod_wait,
        })?;
    let name = format!("{}/{}", key.0, key.1);
    let mut ips = parse_ips(&name, &event.ips)?;
    if ips.is_empty() {
        ips = status_ips(&pod);
    }
    let uid = uid
        .map(str::to_string)
        .or_else(|| pod.metadata.uid.clone().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| name.clone());
    let netns = host_netns(&inner.options.host_proc, &event.netns);
    let mut records = inner.records.lock().await;
    if let Some(mut old) = records.remove(&key) {
        if old.uid == uid && old.netns == netns && old.redirection == Some(Redirection::Enabled) {
            debug!(pod = %name, "CNI ADD for a pod already enrolled in this netns");
            records.insert(key, old);
            return Ok(());
        }
        teardown(inner, &mut old).await;
    }
    sidecar_capture(&name, &pod, &ips, &netns).await?;
    let namespace = inner.cluster.namespace(&key.0);
    let decision = decide(&pod, namespace.as_deref(), &inner.options.selection);
    let record = PodRecord {
        uid,
        namespace: key.0.clone(),
        name: key.1.clone(),
        service_account: pod_service_account(&pod),
        netns_inode: netns_inode(&netns),
        netns,
        ips,
        dns_capture: match decision {
            Decision::Enroll { dns_capture, .. } => dns_capture,
            Decision::Skip(_) => inner.options.selection.dns_capture,
        },
        bypass_inbound: matches!(
            decision,
            Decision::Enroll {
                bypass_inbound: true,
                ..
            }
        ),
        redirection: None,
        redirector: None,
    };
    match decision {
        Decision::Skip(reason) => {
            info!(pod = %name, reason = reason.as_str(), "pod not enrolled in ambient");
            put(inner, &mut records, &record);
            Ok(())
        }
        Decision::Enroll { .. } => match enroll(inner, &mut records, record).await {
            Ok(()) => Ok(()),
            Err(e) => {
                // Nothing half-done stays behind: the kubelet retries the ADD.
                records.remove(&key);
                save(inner, &records);
                Err(e)
            }
        },
    }
}

/// istio-cni's sidecar path: writes an injected pod's `istio-iptables` rules when its
/// injection left them to cni-node (see [`crate::sidecar`]). The rules go with the netns.
async fn sidecar_capture(
    name: &str,
    pod: &Pod,
    ips: &[IpAddr],
    netns: &Path,
) -> Result<(), AgentError> {
    let cfg = match sidecar::decide(pod, ips) {
        Ok(Ok(capture)) => {
            if capture.dns_requested {
                warn!(pod = %name, "istio-proxy asks for DNS capture (ISTIO_META_DNS_CAPTURE), which sidecars do not support yet; DNS stays uncaptured");
            }
            capture.config
        }
        Ok(Err(skip)) => {
            if skip != sidecar::Skip::NotInjected {
                debug!(pod = %name, reason = skip.as_str(), "no sidecar capture from cni-node");
            }
            return Ok(());
        }
        Err(source) => {
            return Err(AgentError::SidecarConfig {
                pod: name.to_string(),
                source,
            })
        }
    };
    let path = netns.to_owned();
    let joined = tokio::task::spawn_blocking(move || sidecar::apply(&path, &cfg)).await;
    match joined {
        Ok(Ok(rules)) => {
            info!(pod = %name, rules, "sidecar capture written");
            Ok(())
        }
        Ok(Err(source)) => Err(AgentError::SidecarCapture {
            pod: name.to_string(),
            netns: netns.to_owned(),
            source,
        }),
        Err(e) => Err(AgentError::Task {
            pod: name.to_string(),
            detail: e.to_string(),
        }),
    }
}

/// Loads the state file, drops pods whose netns is gone, re-applies enrolled pods.
pub(super) async fn restore(inner: &Inner) -> Result<RestoreSummary, AgentError> {
    let loaded = inner.store.load()?;
    let mut records = inner.records.lock().await;
    let mut summary = RestoreSummary::default();
    for mut record in loaded {
        let pod = pod_name(&record);
        if !netns_still_the_pods(&record) {
            info!(%pod, netns = %record.netns.display(), "pod's netns is gone (or is another namespace now); forgetting it");
            summary.dropped += 1;
            continue;
        }
        summary.kept += 1;
        if record.redirection.is_some() {
            let reapplied = match inner.options.reconcile_on_start {
                true => redirect(inner, Op::Enroll, &record).await,
                false => {
                    inner.redirector.adopt(&network(&record));
                    Ok(())
                }
            };
            match reapplied {
                Ok(()) => {
                    inner
                        .zds
                        .remember(&record.uid, workload_info(&record), &record.netns);
                    record.redirection = Some(Redirection::Enabled);
                    record.redirector = Some(inner.redirector.name().to_string());
                    summary.reenrolled += 1;
                }
                Err(e) => {
                    warn!(%pod, error = %e, "cannot re-apply the pod's capture; will retry");
                    record.redirection = None;
                    record.redirector = None;
                    summary.failed += 1;
                }
            }
        }
        records.insert(key_of(&record), record);
    }
    save(inner, &records);
    info!(
        kept = summary.kept,
        dropped = summary.dropped,
        reenrolled = summary.reenrolled,
        failed = summary.failed,
        "agent state restored"
    );
    Ok(summary)
}

/// Reconciles every recorded pod (and, with a node name, every pod on this node).
pub(super) async fn reconcile_all(inner: &Inner) {
    let mut keys: BTreeSet<PodKey> = inner.records.lock().await.keys().cloned().collect();
    if let Some(node) = &inner.options.node_name {
        keys.extend(inner.cluster.pods_on(node));
    }
    reconcile_keys(inner, keys.into_iter().collect()).await;
    sync_annotations(inner, &*inner.records.lock().await);
}

/// Reconciles the pods of a namespace whose labels changed.
pub(super) async fn reconcile_namespace(inner: &Inner, namespace: &str) {
    let mut keys: BTreeSet<PodKey> = inner
        .records
        .lock()
        .await
        .keys()
        .filter(|(ns, _)| ns == namespace)
        .cloned()
        .collect();
    keys.extend(inner.cluster.pods_in(namespace));
    reconcile_keys(inner, keys.into_iter().collect()).await;
}

/// Brings each pod's capture in line with its labels.
pub(super) async fn reconcile_keys(inner: &Inner, keys: Vec<PodKey>) {
    let mut records = inner.records.lock().await;
    let mut unrecorded = Vec::new();
    for key in keys {
        match records.remove(&key) {
            Some(record) => reconcile_record(inner, &mut records, record).await,
            None => unrecorded.push(key),
        }
    }
    if inner.options.node_name.is_some() && !unrecorded.is_empty() {
        adopt(inner, &mut records, unrecorded).await;
    }
}

/// One recorded pod (removed from `records` by the caller; put back unless it is gone).
async fn reconcile_record(inner: &Inner, records: &mut Records, mut record: PodRecord) {
    let key = key_of(&record);
    let pod_label = pod_name(&record);
    let pod = inner.cluster.pod(&key);
    let gone = match &pod {
        None => Some("deleted"),
        Some(p)
            if p.metadata
                .uid
                .as_deref()
                .is_some_and(|u| !u.is_empty() && u != record.uid) =>
        {
            Some("replaced by a new pod")
        }
        Some(p) if is_terminated(p) => Some("terminated"),
        Some(_) => None,
    };
    if let Some(why) = gone {
        debug!(pod = %pod_label, why, "forgetting pod");
        teardown(inner, &mut record).await;
        save(inner, records);
        return;
    }
    let Some(pod) = pod else { return };
    let namespace = inner.cluster.namespace(&key.0);
    match decide(&pod, namespace.as_deref(), &inner.options.selection) {
        Decision::Enroll {
            dns_capture,
            bypass_inbound,
        } if record.redirection != Some(Redirection::Enabled) => {
            record.dns_capture = dns_capture;
            record.bypass_inbound = bypass_inbound;
            if let Err(e) = enroll(inner, records, record).await {
                warn!(pod = %pod_label, error = %e, reason = e.reason(), "cannot enroll pod; will retry on its next change or when ztunnel reconnects");
            }
        }
        Decision::Skip(reason) if record.redirection.is_some() => {
            info!(pod = %pod_label, reason = reason.as_str(), "pod no longer selected");
            teardown(inner, &mut record).await;
            put(inner, records, &record);
        }
        _ => {
            records.insert(key, record);
        }
    }
}

/// Selected pods on this node that the agent has no record of: find their netns in `/proc`
/// and enroll them.
async fn adopt(inner: &Inner, records: &mut Records, keys: Vec<PodKey>) {
    let node = inner.options.node_name.as_deref();
    let mut wanted = Vec::new();
    for key in keys {
        let Some(pod) = inner.cluster.pod(&key) else {
            continue;
        };
        // As upstream: only pods that already have an IP (their CNI ADD is over); a pod
        // still starting is enrolled by its own CNI ADD.
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == node
            && running
            && !status_ips(&pod).is_empty();
        let uid = pod.metadata.uid.clone().filter(|u| !u.is_empty());
        let namespace = inner.cluster.namespace(&key.0);
        let decision = decide(&pod, namespace.as_deref(), &inner.options.selection);
        if let (true, Some(uid), Decision::Enroll { .. }) = (on_node, uid, &decision) {
            wanted.push((key, pod, uid, decision));
        }
    }
    if wanted.is_empty() {
        return;
    }
    let uids: HashSet<String> = wanted.iter().map(|(_, _, uid, _)| uid.clone()).collect();
    let proc = inner.options.host_proc.clone();
    let found = tokio::task::spawn_blocking(move || procscan::find_pod_netns(&proc, &uids))
        .await
        .unwrap_or_default();
    for (key, pod, uid, decision) in wanted {
        let Decision::Enroll {
            dns_capture,
            bypass_inbound,
        } = decision
        else {
            continue;
        };
        let Some(netns) = found.get(&uid) else {
            debug!(pod = %format!("{}/{}", key.0, key.1), "selected pod without a record or a process on this node; waiting for its CNI ADD");
            continue;
        };
        let record = PodRecord {
            uid,
            namespace: key.0.clone(),
            name: key.1.clone(),
            service_account: pod_service_account(&pod),
            netns: netns.clone(),
            netns_inode: netns_inode(netns),
            ips: status_ips(&pod),
            dns_capture,
            bypass_inbound,
            redirection: None,
            redirector: None,
        };
        if let Err(e) = enroll(inner, records, record).await {
            warn!(error = %e, reason = e.reason(), "cannot enroll a running pod found in /proc");
        }
    }
}

/// The pod's netns as this agent sees it. The runtime names it as the host does; a
/// `/proc/<pid>/ns/net` path is the host's procfs, which a containerised agent mounts at
/// `HOST_PROC` (named netns directories are mounted at their host path).
fn host_netns(host_proc: &Path, netns: &str) -> PathBuf {
    match netns.strip_prefix("/proc/") {
        Some(rest) if host_proc != Path::new("/proc") => host_proc.join(rest),
        _ => PathBuf::from(netns),
    }
}

#[cfg(test)]
mod host_netns_tests {
    use super::*;

    #[test]
    fn proc_paths_go_through_the_hosts_procfs() {
        let host = Path::new("/host/proc");
        assert_eq!(
            host_netns(host, "/proc/4242/ns/net"),
            PathBuf::from("/host/proc/4242/ns/net")
        );
        assert_eq!(
            host_netns(host, "/var/run/netns/cni-1234"),
            PathBuf::from("/var/run/netns/cni-1234")
        );
        assert_eq!(
            host_netns(Path::new("/proc"), "/proc/4242/ns/net"),
            PathBuf::from("/proc/4242/ns/net")
        );
    }
}
