//! The capture contract as named constants (docs/compatibility.md, in-pod capture).

use std::fmt::Write;
use std::net::{Ipv4Addr, Ipv6Addr};

/// ztunnel's outbound listener inside the pod: captured outbound TCP lands here.
pub const OUTBOUND_CAPTURE_PORT: u16 = 15001;
/// ztunnel's plaintext inbound listener inside the pod: captured inbound TCP lands here.
pub const INBOUND_CAPTURE_PORT: u16 = 15006;
/// The HBONE (mTLS + HTTP/2 CONNECT) port: ztunnel listens on it in the pod, it is never
/// captured, and istiod advertises it as the tunnel port of enrolled workloads.
pub const HBONE_PORT: u16 = 15008;
/// ztunnel's DNS proxy inside the pod (UDP and TCP), the target of DNS capture.
pub const DNS_CAPTURE_PORT: u16 = 15053;

/// `SO_MARK` of ztunnel's own sockets (1337): capture lets them through.
pub const PROXY_MARK: u32 = 0x539;
/// Mark of connections that went through ztunnel (nftables: the conntrack mark restored on
/// replies; eBPF: captured outbound packets on their way to `lo`).
pub const CAPTURE_MARK: u32 = 0x111;
/// The part of the packet and conntrack mark that capture looks at.
pub const MARK_MASK: u32 = 0xfff;

/// nftables capture: routing table of the `local default dev lo` route.
pub const NFT_ROUTE_TABLE: u32 = 100;
/// nftables capture: preference of the `fwmark 0x111/0xfff lookup 100` rule.
pub const NFT_RULE_PREF: u32 = 32764;
/// eBPF capture: routing table of its `local default dev lo` route (not nftables' 100, so both
/// can coexist in one namespace).
pub const EBPF_ROUTE_TABLE: u32 = 101;
/// eBPF capture: preference of the `iif lo fwmark 0x111/0xfff lookup 101` rule.
pub const EBPF_RULE_PREF: u32 = 32763;
/// eBPF capture: tc priority (`pref`) of the capture filters; their handle is 1.
pub const TC_FILTER_PRIORITY: u16 = 1337;

/// Source of kubelet's probes after the node's SNAT (`HOST_PROBE_SNAT_IP`): never captured.
pub const PROBE_SNAT_IPV4: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);
/// The IPv6 probe SNAT address (`HOST_PROBE_SNAT_IPV6`).
pub const PROBE_SNAT_IPV6: Ipv6Addr = Ipv6Addr::new(
    0xfd16, 0x9254, 0x7127, 0x1337, 0xffff, 0xffff, 0xffff, 0xffff,
);

/// The in-pod nftables tables (family `inet`), in the order they are written.
pub const POD_TABLES: [&str; 3] = [
    "istio-ambient-nat",
    "istio-ambient-mangle",
    "istio-ambient-raw",
];

/// The contract as C `#define`s, for the BPF programs (`ebpf/build.rs` writes it to
/// `capture_contract.h`). The probe address is in host byte order.
pub fn c_header() -> String {
    let defines: [(&str, u64); 7] = [
        ("OUTBOUND_CAPTURE_PORT", OUTBOUND_CAPTURE_PORT.into()),
        ("INBOUND_CAPTURE_PORT", INBOUND_CAPTURE_PORT.into()),
        ("HBONE_PORT", HBONE_PORT.into()),
        ("PROXY_MARK", PROXY_MARK.into()),
        ("CAPTURE_MARK", CAPTURE_MARK.into()),
        ("MARK_MASK", MARK_MASK.into()),
        ("PROBE_SNAT_IP", u32::from(PROBE_SNAT_IPV4).into()),
    ];
    let mut header = String::from(
        "// Generated from the mesh-capture crate by ebpf/build.rs; do not edit.\n\
         #pragma once\n",
    );
    for (name, value) in defines {
        let _ = writeln!(header, "#define {name} {value:#x}");
    }
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_header_defines_every_number_the_programs_use() {
        let header = c_header();
        for line in [
            "#define OUTBOUND_CAPTURE_PORT 0x3a99",
            "#define INBOUND_CAPTURE_PORT 0x3a9e",
            "#define HBONE_PORT 0x3aa0",
            "#define PROXY_MARK 0x539",
            "#define CAPTURE_MARK 0x111",
            "#define MARK_MASK 0xfff",
            "#define PROBE_SNAT_IP 0xa9fe077f",
        ] {
            assert!(
                header.lines().any(|l| l == line),
                "{line} missing in:\n{header}"
            );
        }
    }

    #[test]
    fn marks_fit_the_mask_and_the_proxy_mark_is_istios_1337() {
        const {
            assert!(PROXY_MARK == 1337);
            assert!(PROXY_MARK & MARK_MASK == PROXY_MARK);
            assert!(CAPTURE_MARK & MARK_MASK == CAPTURE_MARK);
            assert!(PROXY_MARK != CAPTURE_MARK);
        };
    }

    #[test]
    fn the_two_capture_flavours_route_through_different_tables() {
        const {
            assert!(NFT_ROUTE_TABLE != EBPF_ROUTE_TABLE);
            assert!(NFT_RULE_PREF != EBPF_RULE_PREF);
        };
        // Both before the main table's rule (32766).
        const { assert!(NFT_RULE_PREF < 32766 && EBPF_RULE_PREF < 32766) };
    }
}
