//! The nftables rules of sidecar capture, in the order Istio's native nftables capture writes
//! them (`docs/sidecars.md`, capture): one table `inet istio-proxy-nat` whose `prerouting`
//! chain sends inbound TCP to the proxy's inbound port and whose `output` chain sends the
//! app's outbound TCP to the proxy's outbound port, leaving the proxy's own traffic (its uid
//! and gid), the inbound passthrough from `127.0.0.6`, loopback and the excluded ports,
//! addresses and interfaces alone.

use std::net::IpAddr;

use mesh_nft::{self as nft, Batch, ChainKind, Expr, Hook, HookPoint, Op};

use crate::config::{self, CaptureConfig, Cidr, Selection};

/// The tables sidecar capture may write (family `inet`). REDIRECT without DNS capture only
/// needs the first; cleanup removes all three, as Istio's does.
pub const TABLES: [&str; 3] = ["istio-proxy-nat", "istio-proxy-mangle", "istio-proxy-raw"];
pub const NAT: &str = TABLES[0];

pub const INBOUND: &str = "istio-inbound";
pub const REDIRECT: &str = "istio-redirect";
pub const IN_REDIRECT: &str = "istio-in-redirect";
pub const OUTPUT: &str = "istio-output";
const PREROUTING: &str = "prerouting";
const OUTPUT_BASE: &str = "output";

const TCP: u8 = libc::IPPROTO_TCP as u8;
const UDP: u8 = libc::IPPROTO_UDP as u8;

/// The chains of the nat table, in the order they are created, and their rules.
pub fn nat_chains(cfg: &CaptureConfig) -> Vec<(&'static str, Vec<Vec<Expr>>)> {
    let tcp = || nft::l4proto(TCP);
    let families = families(cfg);
    let mut prerouting = Vec::new();
    let mut output = Vec::new();
    for name in &cfg.exclude_interfaces {
        prerouting.push([nft::iifname(Op::Eq, name), nft::ret()].concat());
        output.push([nft::oifname(Op::Eq, name), nft::ret()].concat());
    }

    let mut inbound = vec![[
        nft::port(TCP, false, Op::Eq, cfg.inbound_tunnel_port),
        nft::ret(),
    ]
    .concat()];
    match &cfg.include_inbound_ports {
        Selection::All => {
            for port in &cfg.exclude_inbound_ports {
                inbound.push([nft::port(TCP, false, Op::Eq, *port), nft::ret()].concat());
            }
            inbound.push([tcp(), nft::jump(IN_REDIRECT)].concat());
        }
        Selection::Only(ports) => {
            for port in ports {
                inbound
                    .push([nft::port(TCP, false, Op::Eq, *port), nft::jump(IN_REDIRECT)].concat());
            }
        }
    }
    if !cfg.include_inbound_ports.is_empty() {
        prerouting.push([tcp(), nft::jump(INBOUND)].concat());
    }
    output.push(nft::jump(OUTPUT));

    let mut out = Vec::new();
    for port in &cfg.exclude_outbound_ports {
        out.push([nft::port(TCP, false, Op::Eq, *port), nft::ret()].concat());
        out.push([nft::port(UDP, false, Op::Eq, *port), nft::ret()].concat());
    }
    for (_, passthrough) in &families {
        out.push(
            [
                nft::oifname(Op::Eq, "lo"),
                nft::addr(true, Op::Eq, *passthrough),
                nft::ret(),
            ]
            .concat(),
        );
    }
    let loopback_included = match &cfg.include_outbound_cidrs {
        Selection::All => false,
        Selection::Only(cidrs) => cidrs.iter().any(Cidr::is_loopback),
    };
    let owners = cfg
        .proxy_uids
        .iter()
        .map(|id| (false, *id))
        .chain(cfg.proxy_gids.iter().map(|id| (true, *id)));
    for (group, id) in owners {
        for (lo, _) in &families {
            out.push(
                [
                    nft::oifname(Op::Eq, "lo"),
                    nft::addr(false, Op::Neq, *lo),
                    nft::port(TCP, false, Op::Neq, cfg.inbound_tunnel_port),
                    nft::owner(group, Op::Eq, id),
                    nft::jump(IN_REDIRECT),
                ]
                .concat(),
            );
        }
        if !loopback_included {
            out.push(
                [
                    nft::oifname(Op::Eq, "lo"),
                    nft::owner(group, Op::Neq, id),
                    nft::ret(),
                ]
                .concat(),
            );
        }
        out.push([nft::owner(group, Op::Eq, id), nft::ret()].concat());
    }
    for (lo, _) in &families {
        out.push([nft::addr(false, Op::Eq, *lo), nft::ret()].concat());
    }
    for cidr in cidrs_in(&cfg.exclude_outbound_cidrs, cfg.ipv6) {
        out.push(
            [
                nft::prefix(false, Op::Eq, cidr.addr, cidr.prefix_len),
                nft::ret(),
            ]
            .concat(),
        );
    }
    for port in &cfg.include_outbound_ports {
        out.push([nft::port(TCP, false, Op::Eq, *port), nft::jump(REDIRECT)].concat());
    }
    match &cfg.include_outbound_cidrs {
        Selection::All => out.push(nft::jump(REDIRECT)),
        Selection::Only(cidrs) => {
            for cidr in cidrs_in(cidrs, cfg.ipv6) {
                out.push(
                    [
                        nft::prefix(false, Op::Eq, cidr.addr, cidr.prefix_len),
                        nft::jump(REDIRECT),
                    ]
                    .concat(),
                );
            }
        }
    }

    vec![
        (PREROUTING, prerouting),
        (OUTPUT_BASE, output),
        (INBOUND, inbound),
        (
            REDIRECT,
            vec![[tcp(), nft::redirect(cfg.proxy_port)].concat()],
        ),
        (
            IN_REDIRECT,
            vec![[tcp(), nft::redirect(cfg.inbound_capture_port)].concat()],
        ),
        (OUTPUT, out),
    ]
}

/// `(loopback, inbound passthrough source)` of each address family the rules cover.
fn families(cfg: &CaptureConfig) -> Vec<(IpAddr, IpAddr)> {
    let mut families = vec![config::loopback_and_passthrough(false)];
    if cfg.ipv6 {
        families.push(config::loopback_and_passthrough(true));
    }
    families
}

/// The ranges of the families the rules cover (IPv6 ranges are left out of an IPv4 pod's rules).
fn cidrs_in(cidrs: &[Cidr], ipv6: bool) -> impl Iterator<Item = &Cidr> {
    cidrs.iter().filter(move |c| c.addr.is_ipv4() || ipv6)
}

fn nat_hook(hook: HookPoint) -> Hook {
    Hook {
        kind: ChainKind::Nat,
        hook,
        priority: -100,
    }
}

/// The transaction that installs capture: the table is created if missing and flushed, so
/// applying again replaces the rules atomically (never duplicates them).
pub fn apply_batch(cfg: &CaptureConfig) -> Batch {
    let mut batch = Batch::default();
    batch.add_table(NAT);
    batch.flush_table(NAT);
    let chains = nat_chains(cfg);
    for (chain, _) in &chains {
        let hook = match *chain {
            PREROUTING => Some(nat_hook(HookPoint::Prerouting)),
            OUTPUT_BASE => Some(nat_hook(HookPoint::Output)),
            _ => None,
        };
        batch.add_chain(NAT, chain, hook);
    }
    for (chain, rules) in &chains {
        for rule in rules {
            batch.add_rule(NAT, chain, rule);
        }
    }
    batch
}

/// The transaction that removes capture: `add` then `delete` each table, so absent tables are
/// no error.
pub fn cleanup_batch() -> Batch {
    let mut batch = Batch::default();
    for table in TABLES {
        batch.add_table(table);
        batch.delete_table(table);
    }
    batch
}

/// How many rules the nat table holds once `cfg` is applied.
pub fn rule_count(cfg: &CaptureConfig) -> usize {
    nat_chains(cfg).iter().map(|(_, rules)| rules.len()).sum()
}
