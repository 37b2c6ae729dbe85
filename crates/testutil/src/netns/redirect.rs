//! The in-pod capture rules istio-cni writes in ambient mode (docs/compatibility.md, in-pod capture; the nftables flavour:
//! tables `inet istio-ambient-{nat,mangle,raw}`), written into a test pod with `nft -f -`, plus
//! the policy routing that goes with them.

use std::fmt::Write;

use mesh_capture::{
    CAPTURE_MARK, DNS_CAPTURE_PORT, HBONE_PORT, INBOUND_CAPTURE_PORT, MARK_MASK, NFT_ROUTE_TABLE,
    NFT_RULE_PREF, OUTBOUND_CAPTURE_PORT, POD_TABLES, PROBE_SNAT_IPV4, PROXY_MARK,
};

use super::{cmd, Netns, NetnsError};

/// What [`pod_redirect_rules`] captures besides TCP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedirectOptions {
    /// Redirect DNS (UDP and TCP port 53, not to loopback) to [`DNS_CAPTURE_PORT`]. Off by
    /// default here, although Istio's chart default (`ambient.dnsCapture`) is on: a test that
    /// runs no DNS proxy would lose name resolution.
    pub dns_capture: bool,
}

const PRE: &str = "istio-prerouting";
const OUT: &str = "istio-output";

/// The `nft -f` script of the in-pod rules: re-running it replaces the previous rules.
pub fn redirect_rules_script(options: RedirectOptions) -> String {
    let mut s = String::new();
    table(
        &mut s,
        POD_TABLES[0],
        ("nat", "nat"),
        -100,
        &nat_rules(options),
    );
    table(
        &mut s,
        POD_TABLES[1],
        ("filter", "route"),
        -150,
        &mangle_rules(),
    );
    table(
        &mut s,
        POD_TABLES[2],
        ("filter", "filter"),
        -300,
        &raw_rules(options),
    );
    s
}

/// `meta mark and 0xfff`.
fn mark() -> String {
    format!("meta mark and {MARK_MASK:#x}")
}

fn nat_rules(options: RedirectOptions) -> Vec<(&'static str, String)> {
    let (mark, proxy) = (mark(), format!("{PROXY_MARK:#x}"));
    let not_local = "ip daddr != 127.0.0.1/32";
    let mut rules = vec![
        (PRE, format!("meta l4proto tcp ip saddr {PROBE_SNAT_IPV4} counter accept")),
        (OUT, format!("meta l4proto tcp ip daddr {PROBE_SNAT_IPV4} counter accept")),
        (PRE, format!("{not_local} tcp dport != {HBONE_PORT} {mark} != {proxy} counter redirect to :{INBOUND_CAPTURE_PORT}")),
    ];
    if options.dns_capture {
        rules.extend([
            (OUT, format!("oifname != lo {mark} != {proxy} udp dport 53 counter redirect to :{DNS_CAPTURE_PORT}")),
            (OUT, format!("{not_local} tcp dport 53 {mark} != {proxy} counter redirect to :{DNS_CAPTURE_PORT}")),
        ]);
    }
    rules.extend([
        (OUT, format!("meta l4proto tcp {mark} == {CAPTURE_MARK:#x} counter accept")),
        (OUT, format!("oifname lo {not_local} counter accept")),
        (OUT, format!("meta l4proto tcp {not_local} {mark} != {proxy} counter redirect to :{OUTBOUND_CAPTURE_PORT}")),
    ]);
    rules
}

fn mangle_rules() -> Vec<(&'static str, String)> {
    let (mark, keep) = (mark(), !MARK_MASK);
    vec![
        (PRE, format!("{mark} == {PROXY_MARK:#x} counter ct mark set ct mark and {keep:#x} or {CAPTURE_MARK:#x}")),
        (OUT, format!("ct mark and {MARK_MASK:#x} == {CAPTURE_MARK:#x} counter meta mark set ct mark")),
    ]
}

fn raw_rules(options: RedirectOptions) -> Vec<(&'static str, String)> {
    if !options.dns_capture {
        return Vec::new();
    }
    let mark = mark();
    vec![
        (
            OUT,
            format!("udp dport 53 {mark} == {PROXY_MARK:#x} counter ct zone set 1"),
        ),
        (
            PRE,
            format!("udp sport 53 {mark} != {PROXY_MARK:#x} counter ct zone set 1"),
        ),
    ]
}

/// `add table` + `flush table`, the two base chains (of the given types) jumping to the
/// `istio-prerouting` / `istio-output` chains, then `rules` in those chains.
fn table(
    s: &mut String,
    table: &str,
    (pre_type, out_type): (&str, &str),
    priority: i32,
    rules: &[(&str, String)],
) {
    let _ = writeln!(s, "add table inet {table}");
    let _ = writeln!(s, "flush table inet {table}");
    let _ = writeln!(s, "add chain inet {table} prerouting {{ type {pre_type} hook prerouting priority {priority} ; }}");
    let _ = writeln!(
        s,
        "add chain inet {table} output {{ type {out_type} hook output priority {priority} ; }}"
    );
    let _ = writeln!(s, "add chain inet {table} {PRE}");
    let _ = writeln!(s, "add chain inet {table} {OUT}");
    let _ = writeln!(s, "add rule inet {table} prerouting jump {PRE}");
    let _ = writeln!(s, "add rule inet {table} output jump {OUT}");
    for (chain, rule) in rules {
        let _ = writeln!(s, "add rule inet {table} {chain} {rule}");
    }
}

/// Writes the in-pod capture rules into `pod` (replacing earlier ones) and the policy routing
/// `ip rule fwmark 0x111/0xfff pref 32764 lookup 100` + `local 0.0.0.0/0 dev lo table 100`.
pub fn pod_redirect_rules(
    pod: impl AsRef<Netns>,
    options: RedirectOptions,
) -> Result<(), NetnsError> {
    let pod = pod.as_ref();
    cmd::nft(pod.name(), &redirect_rules_script(options))?;
    let table = NFT_ROUTE_TABLE.to_string();
    pod.ip(&[
        "route",
        "replace",
        "local",
        "0.0.0.0/0",
        "dev",
        "lo",
        "table",
        &table,
    ])?;
    if capture_rule_present(pod)? {
        return Ok(());
    }
    let fwmark = format!("{CAPTURE_MARK:#x}/{MARK_MASK:#x}");
    let pref = NFT_RULE_PREF.to_string();
    pod.ip(&[
        "rule", "add", "fwmark", &fwmark, "pref", &pref, "lookup", &table,
    ])?;
    Ok(())
}

/// Removes what [`pod_redirect_rules`] wrote; a no-op for what is already gone.
pub fn remove_redirect_rules(pod: impl AsRef<Netns>) -> Result<(), NetnsError> {
    let pod = pod.as_ref();
    let mut script = String::new();
    for table in POD_TABLES {
        // `add` first so that `delete` cannot fail on a missing table.
        let _ = writeln!(script, "add table inet {table}");
        let _ = writeln!(script, "delete table inet {table}");
    }
    cmd::nft(pod.name(), &script)?;
    let pref = NFT_RULE_PREF.to_string();
    while capture_rule_present(pod)? {
        pod.ip(&["rule", "del", "pref", &pref])?;
    }
    let table = NFT_ROUTE_TABLE.to_string();
    // `ip route show table N` fails when the table does not exist: nothing to remove then.
    let routes = pod
        .ip(&["route", "show", "table", &table])
        .unwrap_or_default();
    if routes.contains("local default dev lo") {
        pod.ip(&[
            "route",
            "del",
            "local",
            "0.0.0.0/0",
            "dev",
            "lo",
            "table",
            &table,
        ])?;
    }
    Ok(())
}

fn capture_rule_present(pod: &Netns) -> Result<bool, NetnsError> {
    let pref = NFT_RULE_PREF.to_string();
    Ok(!pod.ip(&["rule", "show", "pref", &pref])?.trim().is_empty())
}
