//! Unit tests of the netlink encoding, the rule set, and batch atomicity (root, real netns).

use std::net::{IpAddr, Ipv4Addr};

use mesh_testutil::netns::{have_root, TestNet};

use super::nftables::{enroll_batch, pod_tables, Capture};
use super::{NftablesRedirector, PodNetwork, RedirectError, Redirector};
use mesh_nft::{self as nft, Base, Batch, Expr, Op};
use mesh_nft::{batch as nft_batch, dump as nft_dump};

/// One netlink message: header (length, type, flags 0, seq, pid 0) and payload.
fn message(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(16 + payload.len() as u32).to_ne_bytes());
    bytes.extend_from_slice(&ty.to_ne_bytes());
    bytes.extend_from_slice(&0u16.to_ne_bytes());
    bytes.extend_from_slice(&seq.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(payload);
    bytes.resize(bytes.len().div_ceil(4) * 4, 0);
    bytes
}

/// An `NLMSG_ERROR` answer with `code` and the (truncated) request header it answers.
fn error(seq: u32, code: i32) -> Vec<u8> {
    let mut payload = code.to_ne_bytes().to_vec();
    payload.extend_from_slice(&[0; 16]);
    message(libc::NLMSG_ERROR as u16, seq, &payload)
}

#[test]
fn batch_answers_map_to_sequence_numbers_and_bad_bytes_are_errors() {
    let mut datagram = error(2, 0);
    datagram.extend(error(3, -libc::ENOENT));
    datagram.extend(message(0x0a06, 3, &[1, 2, 3, 4]));
    let acks = nft_batch::acks(&datagram).expect("decodes");
    assert_eq!(acks, vec![(2, None), (3, Some(nix::errno::Errno::ENOENT))]);
    let error = nft_batch::acks(&datagram[..datagram.len() - 6]).expect_err("truncated");
    assert!(error.to_string().contains("at byte 72"), "{error}");
}

#[test]
fn the_first_failing_operation_is_named_and_batch_level_errors_are_not_lost() {
    use nix::errno::Errno;
    // Operations are numbered 2..=4 (begin is 1 on kernels >= 6.10).
    let failures = [(4, Errno::ENOENT), (3, Errno::EEXIST)];
    assert_eq!(
        nft_batch::first_failure(&failures, 2, 3),
        Some((Some(1), Errno::EEXIST))
    );
    // Kernels < 6.10 answer a refused batch (EPERM) or a failed commit against the begin
    // message, number 0: still a failure, of the batch as a whole.
    assert_eq!(
        nft_batch::first_failure(&[(0, Errno::EPERM)], 1, 3),
        Some((None, Errno::EPERM))
    );
    assert_eq!(nft_batch::first_failure(&[], 1, 3), None);
}

#[test]
fn rule_dumps_count_rules_per_table() {
    // NFT_MSG_NEWRULE: nfgenmsg, then NFTA_RULE_TABLE "t1" and NFTA_RULE_CHAIN "c".
    let rule = |table: &str| {
        let mut payload = vec![1, 0, 0, 0];
        for (ty, value) in [(1u16, table), (2, "c")] {
            let value = format!("{value}\0");
            payload.extend_from_slice(&(4 + value.len() as u16).to_ne_bytes());
            payload.extend_from_slice(&ty.to_ne_bytes());
            payload.extend_from_slice(value.as_bytes());
            payload.resize(payload.len().div_ceil(4) * 4, 0);
        }
        message(0x0a06, 1, &payload)
    };
    let mut counts = std::collections::HashMap::new();
    let mut datagram = rule("t1");
    datagram.extend(rule("t2"));
    datagram.extend(rule("t1"));
    assert!(!nft_dump::count_rules(&datagram, &mut counts).expect("decodes"));
    assert!(
        nft_dump::count_rules(&message(libc::NLMSG_DONE as u16, 1, &[0; 4]), &mut counts)
            .expect("done")
    );
    assert_eq!(counts.get("t1"), Some(&2));
    assert_eq!(counts.get("t2"), Some(&1));
    let mut bad = rule("t1");
    bad[20..22].copy_from_slice(&200u16.to_ne_bytes()); // an attribute longer than the message
    assert!(nft_dump::count_rules(&bad, &mut counts).is_err());
}

#[test]
fn rule_set_matches_istio_cni_shape() {
    let counts =
        |capture| -> Vec<usize> { pod_tables(capture).iter().map(|t| t.rule_count()).collect() };
    let plain = Capture {
        dns: false,
        ipv6: false,
        inbound: true,
    };
    let dns = Capture { dns: true, ..plain };
    let dual = Capture { ipv6: true, ..dns };
    let bypass = Capture {
        inbound: false,
        ..dual
    };
    // nat: 2 jumps + probe accept x2, inbound, tcp conn mark, lo accept, outbound.
    assert_eq!(counts(plain), vec![8, 4, 2]);
    // + udp/tcp 53 redirects, + two ct zone rules.
    assert_eq!(counts(dns), vec![10, 4, 4]);
    // + the ip6 twins of the probe accepts, inbound, tcp 53, lo accept and outbound.
    assert_eq!(counts(dual), vec![16, 4, 4]);
    // bypass-inbound-capture: no inbound redirect (v4 and v6), everything else stays.
    assert_eq!(counts(bypass), vec![14, 4, 4]);
    // Each table: add, flush, 4 chains, then its rules.
    assert_eq!(enroll_batch(plain).len(), 3 * 6 + 8 + 4 + 2);
}

#[test]
fn ports_and_marks_use_nft_byte_orders() {
    let exprs = nft::port(6, false, Op::Neq, 15008);
    assert_eq!(exprs.last(), Some(&nft::cmp(Op::Neq, &[0x3a, 0xa0])));
    let mark = nft::mark(false, 0xfff, Op::Eq, 0x539);
    assert_eq!(mark[2], nft::cmp(Op::Eq, &0x539u32.to_ne_bytes()));
    let probe = nft::addr(true, Op::Eq, IpAddr::V4(Ipv4Addr::new(169, 254, 7, 127)));
    assert_eq!(
        probe[2],
        Expr::Payload {
            base: Base::Network,
            offset: 12,
            len: 4
        }
    );
    assert_eq!(probe[3], nft::cmp(Op::Eq, &[169, 254, 7, 127]));
}

#[test]
fn a_refused_batch_applies_nothing() {
    if !have_root("a_refused_batch_applies_nothing") {
        return;
    }
    let mut net = TestNet::new("nb").expect("test network");
    let node = net
        .add_node("node", Ipv4Addr::new(172, 30, 0, 11))
        .expect("node");
    let pod = net.add_pod(&node, "pod", node.pod_ip(2)).expect("pod");
    let network = PodNetwork {
        netns: pod.netns().path(),
        ips: vec![IpAddr::V4(pod.ip())],
        dns_capture: false,
        bypass_inbound: false,
    };
    let redirector = NftablesRedirector::new();
    let poison = |batch: &mut Batch| {
        batch.add_rule("istio-ambient-raw", "no-such-chain", &[Expr::Counter]);
    };
    let list = || {
        pod.netns()
            .exec_ok("nft", &["list", "ruleset"])
            .expect("nft list")
    };

    let error = redirector
        .enroll_with(&network, poison)
        .expect_err("poisoned batch");
    match &error {
        RedirectError::Nftables { op, .. } => {
            assert_eq!(
                op, "add rule inet istio-ambient-raw no-such-chain",
                "{error}"
            )
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(list().trim(), "", "a refused batch left tables behind");
    let rules = pod.netns().ip(&["rule", "show"]).expect("ip rule");
    assert!(!rules.contains("fwmark 0x111"), "{rules}");

    // Over an existing capture, a refused re-enroll leaves it exactly as it was.
    redirector.enroll(&network).expect("enroll");
    let before = list();
    redirector
        .enroll_with(&network, poison)
        .expect_err("poisoned batch");
    assert_eq!(list(), before);
    assert!(redirector.is_enrolled(&network).expect("is_enrolled"));
}
