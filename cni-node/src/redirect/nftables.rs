//! [`NftablesRedirector`]: istio-cni's in-pod nftables capture (docs/compatibility.md, in-pod capture; tables
//! `inet istio-ambient-{nat,mangle,raw}`), programmed over netlink from a thread inside the
//! pod's netns: one nftables transaction (libnftnl) for the three tables, then the fwmark rule
//! and the table-100 route over rtnetlink.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Instant;

use mesh_capture::{
    CAPTURE_MARK, DNS_CAPTURE_PORT, HBONE_PORT, INBOUND_CAPTURE_PORT, MARK_MASK,
    OUTBOUND_CAPTURE_PORT, POD_TABLES, PROBE_SNAT_IPV4, PROBE_SNAT_IPV6, PROXY_MARK,
};

use super::netns::{run_in, Entered};
use super::routes;
use super::{PodNetwork, RedirectError, Redirector};
use mesh_capture::routing::Family;
use mesh_capture::rtnl::RtnlError;
use mesh_nft::dump as nft_dump;
use mesh_nft::{self as nft, Batch, ChainKind, CtKey, Expr, Hook, HookPoint, Op};

/// The conntrack zone of DNS traffic between ztunnel and upstream resolvers.
const DNS_CT_ZONE: u16 = 1;

const NAT: &str = POD_TABLES[0];
const MANGLE: &str = POD_TABLES[1];
const RAW: &str = POD_TABLES[2];
const PRE: &str = "istio-prerouting";
const OUT: &str = "istio-output";
const TCP: u8 = libc::IPPROTO_TCP as u8;
const UDP: u8 = libc::IPPROTO_UDP as u8;
const EQ: Op = Op::Eq;
const NE: Op = Op::Neq;

/// What the rules of one pod capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Capture {
    pub(super) dns: bool,
    /// Redirect inbound TCP to 15006 (off for `bypass-inbound-capture` pods).
    pub(super) inbound: bool,
    /// Add the `ip6` twin of every address rule (the pod has an IPv6 address).
    pub(super) ipv6: bool,
}

impl Capture {
    pub(super) fn of(pod: &PodNetwork) -> Capture {
        Capture {
            dns: pod.dns_capture,
            inbound: !pod.bypass_inbound,
            ipv6: pod.ips.iter().any(|ip| ip.to_canonical().is_ipv6()),
        }
    }

    fn families(self) -> Vec<Family> {
        match self.ipv6 {
            true => vec![Family::V4, Family::V6],
            false => vec![Family::V4],
        }
    }
}

/// One in-pod table: its base chains' hooks and its rules `(chain, expressions)`.
#[derive(Debug)]
pub(super) struct Table {
    pub(super) name: &'static str,
    pub(super) prerouting: Hook,
    pub(super) output: Hook,
    pub(super) rules: Vec<(&'static str, Vec<Expr>)>,
}

impl Table {
    /// Rules in the table once written (the two jumps included).
    pub(super) fn rule_count(&self) -> usize {
        self.rules.len() + 2
    }
}

fn hook(kind: ChainKind, hook: HookPoint, priority: i32) -> Hook {
    Hook {
        kind,
        hook,
        priority,
    }
}

/// Concatenates rule fragments.
fn rule(parts: &[Vec<Expr>]) -> Vec<Expr> {
    parts.concat()
}

/// `meta mark and 0xfff <op> 0x539`.
fn proxy_mark(op: Op) -> Vec<Expr> {
    nft::mark(false, MARK_MASK, op, PROXY_MARK)
}

/// The address-family twins of a rule over `loopback` / `probe` addresses.
fn per_family(
    capture: Capture,
    mut make: impl FnMut(IpAddr, IpAddr) -> Vec<Expr>,
) -> Vec<Vec<Expr>> {
    let mut rules = vec![make(Ipv4Addr::LOCALHOST.into(), PROBE_SNAT_IPV4.into())];
    if capture.ipv6 {
        rules.push(make(Ipv6Addr::LOCALHOST.into(), PROBE_SNAT_IPV6.into()));
    }
    rules
}

fn nat_rules(capture: Capture) -> Vec<(&'static str, Vec<Expr>)> {
    let mut rules = Vec::new();
    let mut add = |chain, list: Vec<Vec<Expr>>| rules.extend(list.into_iter().map(|r| (chain, r)));
    let tcp = || nft::l4proto(TCP);
    add(
        PRE,
        per_family(capture, |_, probe| {
            rule(&[tcp(), nft::addr(true, EQ, probe), nft::accept()])
        }),
    );
    add(
        OUT,
        per_family(capture, |_, probe| {
            rule(&[tcp(), nft::addr(false, EQ, probe), nft::accept()])
        }),
    );
    if capture.inbound {
        add(
            PRE,
            per_family(capture, |lo, _| {
                let dport = nft::port(TCP, false, NE, HBONE_PORT);
                rule(&[
                    nft::addr(false, NE, lo),
                    dport,
                    proxy_mark(NE),
                    nft::redirect(INBOUND_CAPTURE_PORT),
                ])
            }),
        );
    }
    if capture.dns {
        let udp53 = nft::port(UDP, false, EQ, 53);
        let not_lo = nft::oifname(NE, "lo");
        add(
            OUT,
            vec![rule(&[
                not_lo,
                proxy_mark(NE),
                udp53,
                nft::redirect(DNS_CAPTURE_PORT),
            ])],
        );
        add(
            OUT,
            per_family(capture, |lo, _| {
                let tcp53 = nft::port(TCP, false, EQ, 53);
                rule(&[
                    nft::addr(false, NE, lo),
                    tcp53,
                    proxy_mark(NE),
                    nft::redirect(DNS_CAPTURE_PORT),
                ])
            }),
        );
    }
    let conn_mark = nft::mark(false, MARK_MASK, EQ, CAPTURE_MARK);
    add(OUT, vec![rule(&[tcp(), conn_mark, nft::accept()])]);
    add(
        OUT,
        per_family(capture, |lo, _| {
            rule(&[
                nft::oifname(EQ, "lo"),
                nft::addr(false, NE, lo),
                nft::accept(),
            ])
        }),
    );
    add(
        OUT,
        per_family(capture, |lo, _| {
            rule(&[
                tcp(),
                nft::addr(false, NE, lo),
                proxy_mark(NE),
                nft::redirect(OUTBOUND_CAPTURE_PORT),
            ])
        }),
    );
    rules
}

fn mangle_rules() -> Vec<(&'static str, Vec<Expr>)> {
    let set_conn_mark = vec![
        Expr::Counter,
        Expr::CtLoad(CtKey::Mark),
        nft::and_or(!MARK_MASK, CAPTURE_MARK),
        Expr::CtSet(CtKey::Mark),
    ];
    let restore_mark = vec![Expr::Counter, Expr::CtLoad(CtKey::Mark), Expr::MetaSetMark];
    let conn_marked = nft::mark(true, MARK_MASK, EQ, CAPTURE_MARK);
    vec![
        (PRE, rule(&[proxy_mark(EQ), set_conn_mark])),
        (OUT, rule(&[conn_marked, restore_mark])),
    ]
}

fn raw_rules(capture: Capture) -> Vec<(&'static str, Vec<Expr>)> {
    if !capture.dns {
        return Vec::new();
    }
    let zone = || {
        vec![
            Expr::Counter,
            Expr::Immediate(DNS_CT_ZONE.to_ne_bytes().to_vec()),
            Expr::CtSet(CtKey::Zone),
        ]
    };
    vec![
        (
            OUT,
            rule(&[nft::port(UDP, false, EQ, 53), proxy_mark(EQ), zone()]),
        ),
        (
            PRE,
            rule(&[nft::port(UDP, true, EQ, 53), proxy_mark(NE), zone()]),
        ),
    ]
}

/// The three in-pod tables for `capture`.
pub(super) fn pod_tables(capture: Capture) -> Vec<Table> {
    let (pre, out) = (HookPoint::Prerouting, HookPoint::Output);
    vec![
        Table {
            name: NAT,
            prerouting: hook(ChainKind::Nat, pre, -100),
            output: hook(ChainKind::Nat, out, -100),
            rules: nat_rules(capture),
        },
        Table {
            name: MANGLE,
            prerouting: hook(ChainKind::Filter, pre, -150),
            output: hook(ChainKind::Route, out, -150),
            rules: mangle_rules(),
        },
        Table {
            name: RAW,
            prerouting: hook(ChainKind::Filter, pre, -300),
            output: hook(ChainKind::Filter, out, -300),
            rules: raw_rules(capture),
        },
    ]
}

/// The enroll transaction, as istio-cni writes it: each table is created if missing and
/// flushed, its chains added (no-ops when present) and its rules appended, so re-enrolling
/// replaces the rules (never duplicates them) atomically. Flushing rather than deleting the
/// tables keeps their base chains registered: deleting hooked chains makes the kernel wait
/// for RCU grace periods (~5-15 ms), flushing a fresh netns costs well under 1 ms.
pub(super) fn enroll_batch(capture: Capture) -> Batch {
    let mut batch = Batch::default();
    for table in pod_tables(capture) {
        batch.add_table(table.name);
        batch.flush_table(table.name);
        batch.add_chain(table.name, "prerouting", Some(table.prerouting));
        batch.add_chain(table.name, "output", Some(table.output));
        batch.add_chain(table.name, PRE, None);
        batch.add_chain(table.name, OUT, None);
        let jump = |chain| vec![Expr::Verdict(nft::Verdict::Jump(chain))];
        batch.add_rule(table.name, "prerouting", &jump(PRE));
        batch.add_rule(table.name, "output", &jump(OUT));
        for (chain, exprs) in &table.rules {
            batch.add_rule(table.name, chain, exprs);
        }
    }
    batch
}

/// The unenroll transaction: `add` then `delete` each table, so absent tables are no error.
fn unenroll_batch() -> Batch {
    let mut batch = Batch::default();
    for table in POD_TABLES {
        batch.add_table(table);
        batch.delete_table(table);
    }
    batch
}

fn nft_error(path: &Path, error: nft::BatchError) -> RedirectError {
    RedirectError::Nftables {
        op: error.op,
        path: path.to_owned(),
        source: error.source,
    }
}

fn netlink_error(path: &Path, (what, source): (&'static str, std::io::Error)) -> RedirectError {
    RedirectError::Netlink {
        what,
        path: path.to_owned(),
        source,
    }
}

/// An rtnetlink failure of the policy routing, naming the operation.
fn routing_error(path: &Path, error: RtnlError) -> RedirectError {
    netlink_error(path, (error.operation(), error.into_io()))
}

/// Programs a pod's capture with nftables (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct NftablesRedirector {}

impl NftablesRedirector {
    pub fn new() -> Self {
        NftablesRedirector {}
    }

    /// Enrolls `pod` with `tweak` applied to the nftables batch before it is sent (tests use
    /// it to make the batch fail).
    pub(super) fn enroll_with(
        &self,
        pod: &PodNetwork,
        tweak: impl FnOnce(&mut Batch) + Send,
    ) -> Result<(), RedirectError> {
        let started = Instant::now();
        let capture = Capture::of(pod);
        let path = pod.netns.as_path();
        let entered = run_in(path, || {
            let mut batch = enroll_batch(capture);
            tweak(&mut batch);
            let operations = batch.len();
            batch.commit().map_err(|e| nft_error(path, e))?;
            if let Err(error) = routes::install(&capture.families()) {
                // All or nothing: a pod without its routes must not keep half a capture.
                let _ = unenroll_batch().commit();
                let _ = routes::remove(&capture.families());
                return Err(routing_error(path, error));
            }
            Ok(operations)
        })?;
        match entered {
            Entered::Ran(operations) => {
                tracing::debug!(netns = %path.display(), dns = capture.dns, ipv6 = capture.ipv6,
                    operations, elapsed = ?started.elapsed(), "in-pod nftables capture enrolled");
                Ok(())
            }
            Entered::Gone => Err(RedirectError::Netns {
                path: path.to_owned(),
                source: std::io::ErrorKind::NotFound.into(),
            }),
        }
    }
}

impl Redirector for NftablesRedirector {
    fn enroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        self.enroll_with(pod, |_| {})
    }

    fn unenroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        let path = pod.netns.as_path();
        // Remove IPv6 routing too even if the pod's IPs no longer say so.
        let families = [Family::V4, Family::V6];
        let entered = run_in(path, || {
            unenroll_batch().commit().map_err(|e| nft_error(path, e))?;
            routes::remove(&families).map_err(|e| routing_error(path, e))
        })?;
        if let Entered::Gone = entered {
            tracing::debug!(netns = %path.display(), "netns gone: nothing to unenroll");
        }
        Ok(())
    }

    fn is_enrolled(&self, pod: &PodNetwork) -> Result<bool, RedirectError> {
        let path = pod.netns.as_path();
        let capture = Capture::of(pod);
        let entered = run_in(path, || {
            let counts = nft_dump::rule_counts()
                .map_err(|e| netlink_error(path, ("list nftables rules", e)))?;
            if !counts_match(&counts, capture) {
                return Ok(false);
            }
            routes::present(&capture.families()).map_err(|e| routing_error(path, e))
        })?;
        Ok(matches!(entered, Entered::Ran(true)))
    }

    fn name(&self) -> &'static str {
        "nftables"
    }
}

/// Whether every in-pod table holds exactly the rules `capture` writes.
fn counts_match(counts: &HashMap<String, usize>, capture: Capture) -> bool {
    pod_tables(capture)
        .iter()
        .all(|table| counts.get(table.name) == Some(&table.rule_count()))
}
