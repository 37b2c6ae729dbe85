//! Looking at a running mesh from outside: bounded waits, metric sums, what ztunnel's
//! `/config_dump` says (pods handed over by ZDS, WDS workloads, certificates), and nftables
//! state of a netns. Checks return `Err(what is wrong)` so [`wait_for`] can report the last one.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mesh_testutil::Netns;

use crate::probe::{echo, Echo};
use crate::ztunnel::Ztunnel;

/// Polls `check` every 20 ms until it passes or `limit` is over: the time it took, or the last
/// complaint.
pub fn wait_for(
    limit: Duration,
    mut check: impl FnMut() -> Result<(), String>,
) -> Result<Duration, String> {
    let start = Instant::now();
    loop {
        match check() {
            Ok(()) => return Ok(start.elapsed()),
            Err(why) if start.elapsed() > limit => return Err(why),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One echo round trip over a new connection from `netns` to `addr` works.
pub fn echo_ok(netns: &Netns, addr: SocketAddr) -> Result<(), String> {
    match echo(netns, addr) {
        Echo::Ok => Ok(()),
        other => Err(format!("{} -> {addr}: {other:?}", netns.name())),
    }
}

/// A new connection from `netns` to `addr` is accepted, then closed (a policy denial).
pub fn echo_denied(netns: &Netns, addr: SocketAddr) -> Result<(), String> {
    match echo(netns, addr) {
        Echo::Closed(_) => Ok(()),
        other => Err(format!("{} -> {addr} not denied: {other:?}", netns.name())),
    }
}

/// The sum of the samples of metric `name` in Prometheus `text` whose line contains every one
/// of `filters` (e.g. `reporter="destination"`); 0 when there is none.
pub fn metric_sum(text: &str, name: &str, filters: &[&str]) -> f64 {
    let samples = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    samples.fold(0.0, |sum, v| sum + v)
}

/// `workloadState` of a ztunnel as (uid, state: `Up`, `Pending` or `Draining`); empty when
/// the admin port does not answer. Reads upstream's shape (an object keyed by uid, each
/// `{state, info}`) and the list of `{uid, state, ...}` older builds of ours wrote.
pub fn workload_state(z: &Ztunnel) -> Vec<(String, String)> {
    let Some(dump) = z.try_config_dump() else {
        return Vec::new();
    };
    let state = |p: &serde_json::Value| p["state"].as_str().unwrap_or_default().to_string();
    match &dump["workloadState"] {
        serde_json::Value::Object(pods) => pods
            .iter()
            .map(|(uid, p)| (uid.clone(), state(p)))
            .collect(),
        serde_json::Value::Array(pods) => pods
            .iter()
            .map(|p| (p["uid"].as_str().unwrap_or_default().to_string(), state(p)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The uids ztunnel serves are exactly `want`, all `Up`.
pub fn expect_pods_up(z: &Ztunnel, want: &BTreeSet<String>) -> Result<(), String> {
    let state = workload_state(z);
    let other: Vec<_> = state.iter().filter(|(_, s)| s != "Up").collect();
    if !other.is_empty() {
        return Err(format!(
            "workloadState of {} not all Up: {other:?}",
            z.node()
        ));
    }
    let got: BTreeSet<String> = state.into_iter().map(|(uid, _)| uid).collect();
    if &got == want {
        Ok(())
    } else {
        Err(format!(
            "workloadState of {}: {got:?}, want {want:?}",
            z.node()
        ))
    }
}

/// `namespace/name` of every workload (WDS) a ztunnel knows.
pub fn wds_workloads(z: &Ztunnel) -> BTreeSet<String> {
    let Some(dump) = z.try_config_dump() else {
        return BTreeSet::new();
    };
    dump["workloads"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .map(|w| {
                    let f = |k: &str| w[k].as_str().unwrap_or_default().to_string();
                    format!("{}/{}", f("namespace"), f("name"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Serial number of the leaf certificate ztunnel holds for the identity ending in `suffix`
/// (e.g. `/ns/demo/sa/client`).
pub fn cert_serial(z: &Ztunnel, suffix: &str) -> Option<String> {
    let dump = z.try_config_dump()?;
    let cert = dump["certificates"]
        .as_array()?
        .iter()
        .find(|c| c["identity"].as_str().is_some_and(|i| i.ends_with(suffix)))?
        .clone();
    cert["certChain"][0]["serialNumber"]
        .as_str()
        .map(str::to_string)
}

/// The istio nftables tables of a netns (`nft list tables` lines).
pub fn istio_tables(netns: &Netns) -> Vec<String> {
    let out = netns
        .exec_ok("nft", &["list", "tables"])
        .expect("nft list tables");
    out.lines()
        .filter(|l| l.contains("istio"))
        .map(str::to_string)
        .collect()
}

/// The whole ruleset of a netns, stateless (`nft -s list ruleset`), to compare over time.
pub fn ruleset(netns: &Netns) -> String {
    netns
        .exec_ok("nft", &["-s", "list", "ruleset"])
        .expect("nft list ruleset")
}

/// Established HBONE connections dialed from a pod's netns (in-pod ztunnel dials from there).
pub fn hbone_connections(netns: &Netns) -> usize {
    let port = format!(":{}", mesh_capture::HBONE_PORT);
    netns
        .exec_ok("ss", &["-Htn", "state", "established", "dport", "=", &port])
        .expect("ss")
        .lines()
        .count()
}
