//! The `-o short` tables of `istioctl ztunnel-config`, with upstream istioctl's columns,
//! sorting and `NA`/`None` conventions.

use std::collections::HashMap;

use super::dump::{CertInfo, Certificate, ConfigDump, Workload};
use crate::table;

/// Which entries to show.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Namespace of workloads, services and policies (case-insensitive).
    pub namespace: Option<String>,
    /// Node of workloads (case-insensitive).
    pub node: Option<String>,
    /// One of a workload's IPs.
    pub address: Option<String>,
}

fn same(want: Option<&String>, have: &str) -> bool {
    want.is_none_or(|w| w.eq_ignore_ascii_case(have))
}

impl Filter {
    pub fn workload(&self, w: &Workload) -> bool {
        same(self.namespace.as_ref(), &w.namespace)
            && same(self.node.as_ref(), &w.node)
            && self
                .address
                .as_ref()
                .is_none_or(|a| w.workload_ips.iter().any(|ip| ip.eq_ignore_ascii_case(a)))
    }

    pub fn namespace(&self, ns: &str) -> bool {
        same(self.namespace.as_ref(), ns)
    }
}

/// NAMESPACE POD NAME ADDRESS NODE WAYPOINT PROTOCOL, sorted by `namespace.name`, then node.
pub fn workloads(dump: &ConfigDump, filter: &Filter) -> String {
    let mut list: Vec<&Workload> = dump
        .workloads
        .iter()
        .map(|e| &e.view)
        .filter(|w| filter.workload(w))
        .collect();
    list.sort_by(|a, b| {
        (format!("{}.{}", a.namespace, a.name), &a.node)
            .cmp(&(format!("{}.{}", b.namespace, b.name), &b.node))
    });
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|w| {
            let address = if w.workload_ips.is_empty() {
                w.hostname.clone()
            } else {
                w.workload_ips.join(",")
            };
            vec![
                w.namespace.clone(),
                w.name.clone(),
                address,
                w.node.clone(),
                dump.waypoint_name(w.waypoint.as_ref()),
                w.protocol.clone(),
            ]
        })
        .collect();
    table::render(
        &[
            "NAMESPACE",
            "POD NAME",
            "ADDRESS",
            "NODE",
            "WAYPOINT",
            "PROTOCOL",
        ],
        &rows,
        1,
    )
}

/// NAMESPACE SERVICE NAME SERVICE VIP WAYPOINT ENDPOINTS (healthy/total), sorted by
/// namespace, name, hostname.
pub fn services(dump: &ConfigDump, filter: &Filter) -> String {
    let by_uid: HashMap<&str, &Workload> = dump
        .workloads
        .iter()
        .map(|e| (e.view.uid.as_str(), &e.view))
        .collect();
    let mut list: Vec<_> = dump
        .services
        .iter()
        .map(|e| &e.view)
        .filter(|s| filter.namespace(&s.namespace))
        .collect();
    list.sort_by(|a, b| {
        (&a.namespace, &a.name, &a.hostname).cmp(&(&b.namespace, &b.name, &b.hostname))
    });
    let rows = list
        .iter()
        .map(|s| {
            let key = format!("{}/{}", s.namespace, s.hostname);
            // Upstream ztunnel lists endpoints; ours lists each workload's services.
            let members: Vec<Option<&Workload>> = match &s.endpoints {
                Some(eps) => eps
                    .values()
                    .map(|e| by_uid.get(e.workload_uid.as_str()).copied())
                    .collect(),
                None => dump
                    .workloads
                    .iter()
                    .filter(|w| w.view.in_service(&key))
                    .map(|w| Some(&w.view))
                    .collect(),
            };
            let healthy = members
                .iter()
                .filter(|w| w.is_some_and(|w| w.status.eq_ignore_ascii_case("healthy")))
                .count();
            let vips: Vec<String> = s.vips.iter().map(super::dump::vip_ip).collect();
            vec![
                s.namespace.clone(),
                s.name.clone(),
                vips.join(","),
                dump.waypoint_name(s.waypoint.as_ref()),
                format!("{healthy}/{}", members.len()),
            ]
        })
        .collect::<Vec<_>>();
    table::render(
        &[
            "NAMESPACE",
            "SERVICE NAME",
            "SERVICE VIP",
            "WAYPOINT",
            "ENDPOINTS",
        ],
        &rows,
        1,
    )
}

/// NAMESPACE POLICY NAME ACTION SCOPE, sorted by namespace and name.
pub fn policies(dump: &ConfigDump, filter: &Filter) -> String {
    let mut list: Vec<_> = dump
        .policies
        .iter()
        .map(|e| &e.view)
        .filter(|p| filter.namespace(&p.namespace))
        .collect();
    list.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|p| {
            vec![
                p.namespace.clone(),
                p.name.clone(),
                p.action.clone(),
                p.scope.clone(),
            ]
        })
        .collect();
    table::render(&["NAMESPACE", "POLICY NAME", "ACTION", "SCOPE"], &rows, 1)
}

/// CERTIFICATE NAME TYPE STATUS VALID CERT SERIAL NUMBER NOT AFTER NOT BEFORE: one row per
/// certificate of each identity (Leaf, Intermediate..., Root), or one `NA` row for an identity
/// without certificates. `now` is seconds since the Unix epoch.
pub fn certificates(dump: &ConfigDump, now: i64) -> String {
    let rows: Vec<Vec<String>> = dump
        .certificates
        .iter()
        .flat_map(|e| certificate_rows(&e.view, now))
        .collect();
    table::render(
        &[
            "CERTIFICATE NAME",
            "TYPE",
            "STATUS",
            "VALID CERT",
            "SERIAL NUMBER",
            "NOT AFTER",
            "NOT BEFORE",
        ],
        &rows,
        5,
    )
}

fn certificate_rows(c: &Certificate, now: i64) -> Vec<Vec<String>> {
    let state = if c.state.contains("Unavailable") {
        "Unavailable".to_string()
    } else {
        c.state.clone()
    };
    if c.cert_chain.is_empty() {
        let na = || "NA".to_string();
        return vec![vec![
            c.identity.clone(),
            na(),
            state,
            "false".into(),
            na(),
            na(),
            na(),
        ]];
    }
    // Without a separate root list, the last certificate of the chain is the root.
    let legacy = c.root_certs.is_empty();
    let last = c.cert_chain.len() - 1;
    let chain = c.cert_chain.iter().enumerate().map(|(i, cert)| {
        let kind = match i {
            0 => "Leaf",
            i if i == last && legacy => "Root",
            _ => "Intermediate",
        };
        (kind, cert)
    });
    let roots = c.root_certs.iter().map(|cert| ("Root", cert));
    chain
        .chain(roots)
        .map(|(kind, cert)| {
            vec![
                c.identity.clone(),
                kind.into(),
                state.clone(),
                valid(cert, now).to_string(),
                serial_hex(&cert.serial_number),
                na(&cert.expiration_time),
                na(&cert.valid_from),
            ]
        })
        .collect()
}

/// Every table, each preceded by a blank line (as `istioctl ztunnel-config all`, without the
/// connections table).
pub fn all(dump: &ConfigDump, filter: &Filter, now: i64) -> String {
    [
        workloads(dump, filter),
        services(dump, filter),
        policies(dump, filter),
        certificates(dump, now),
    ]
    .iter()
    .map(|t| format!("\n{t}"))
    .collect()
}

fn na(v: &str) -> String {
    if v.is_empty() {
        "NA".to_string()
    } else {
        v.to_string()
    }
}

/// Whether `now` lies inside the certificate's validity.
fn valid(cert: &CertInfo, now: i64) -> bool {
    match (rfc3339(&cert.valid_from), rfc3339(&cert.expiration_time)) {
        (Some(from), Some(to)) => from < now && now < to,
        _ => false,
    }
}

/// The serial in lowercase hex: upstream ztunnel dumps it in decimal, ours in hex already.
pub fn serial_hex(serial: &str) -> String {
    if serial.is_empty() {
        return "NA".to_string();
    }
    if !serial.bytes().all(|b| b.is_ascii_digit()) {
        // Printed like Go's `%x` of the number: no leading zeros.
        let hex = serial.to_ascii_lowercase();
        let trimmed = hex.trim_start_matches('0');
        return if trimmed.is_empty() {
            "0".into()
        } else {
            trimmed.into()
        };
    }
    // Decimal to hex on 32-bit limbs, least significant first.
    let mut limbs: Vec<u32> = vec![0];
    for d in serial.bytes().map(|b| u64::from(b - b'0')) {
        let mut carry = d;
        for limb in &mut limbs {
            let v = u64::from(*limb) * 10 + carry;
            *limb = (v & 0xffff_ffff) as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            limbs.push(carry as u32);
        }
    }
    let mut hex = String::new();
    for (i, limb) in limbs.iter().rev().enumerate() {
        if i == 0 {
            hex.push_str(&format!("{limb:x}"));
        } else {
            hex.push_str(&format!("{limb:08x}"));
        }
    }
    hex
}

/// Seconds since the epoch of an RFC 3339 time (`2026-11-30T23:10:24Z`, fractions and
/// offsets allowed); `None` if it does not parse.
pub fn rfc3339(s: &str) -> Option<i64> {
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !matches!(s.as_bytes().get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let rest = s.get(19..)?;
    let rest = rest.trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let h = rest.get(1..3)?.parse::<i64>().ok()?;
            let m = rest.get(4..6)?.parse::<i64>().ok()?;
            sign * (h * 3600 + m * 60)
        }
    };
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + min * 60 + sec - offset)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
