//! HBONE request headers (docs/compatibility.md, HBONE): `baggage` describing the source workload, and the
//! original source in `forwarded: for="ip:port"[;host=<service>]`.

use std::net::{IpAddr, SocketAddr};

use mesh_proto::workload::WorkloadType;

use crate::state::Workload;

/// W3C baggage for `w`: `k8s.cluster.name`, `k8s.namespace.name`, `k8s.<type>.name`,
/// `service.name`, `service.version`, and `cloud.region` / `cloud.availability_zone` when known.
/// Empty attributes are left out.
pub fn baggage(w: &Workload) -> String {
    let kind = match w.workload_type {
        WorkloadType::Deployment => "deployment",
        WorkloadType::Cronjob => "cronjob",
        WorkloadType::Pod => "pod",
        WorkloadType::Job => "job",
    };
    let workload_name = if w.workload_name.is_empty() {
        &w.name
    } else {
        &w.workload_name
    };
    let kind_key = format!("k8s.{kind}.name");
    let mut pairs: Vec<(&str, &str)> = vec![
        ("k8s.cluster.name", &w.cluster_id),
        ("k8s.namespace.name", &w.namespace),
        (&kind_key, workload_name),
        ("service.name", &w.canonical_name),
        ("service.version", &w.canonical_revision),
    ];
    if let Some(l) = &w.locality {
        pairs.push(("cloud.region", &l.region));
        pairs.push(("cloud.availability_zone", &l.zone));
    }
    pairs
        .into_iter()
        .filter(|(_, v)| !v.is_empty() && v.bytes().all(is_baggage_value_byte))
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Bytes allowed unencoded in a baggage value (W3C `baggage-octet`).
fn is_baggage_value_byte(b: u8) -> bool {
    matches!(b, 0x21 | 0x23..=0x2b | 0x2d..=0x3a | 0x3c..=0x5b | 0x5d..=0x7e)
}

/// The source IP in a `forwarded` header: the first `for=` of the first element, with or
/// without quotes and brackets, port optional. `None` if there is none or it is not an IP.
pub fn forwarded_for(value: &str) -> Option<IpAddr> {
    let element = value.split(',').next()?;
    let raw = element.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
    })?;
    let raw = raw.trim_matches('"');
    if let Ok(addr) = raw.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    raw.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok()
}
