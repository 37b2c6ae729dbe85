//! Unit tests of the netlink encoding, the rule set, and batch atomicity (root, real netns).

use std::net::{IpAddr, Ipv4Addr};

use mesh_testutil::netns::{have_root, TestNet};

use super::netlink::{attrs, replies, Msg};
use super::nft::{self, Batch, Expr};
use super::nftables::{enroll_batch, pod_tables, Capture};
use super::{NftablesRedirector, PodNetwork, RedirectError, Redirector};

#[test]
fn attributes_are_aligned_and_nested_lengths_cover_their_children() {
    let mut msg = Msg::new(0x0a06, 0, &[1, 0, 0, 10]);
    msg.put_str(1, "abc"); // 4 + 4 bytes, no padding needed
    let nest = msg.begin_nest(4);
    msg.put(1, &[7]); // 5 bytes, padded to 8
    msg.put_be32(2, 0x0102_0304);
    msg.end_nest(nest);
    let batch_bytes = msg.into_bytes_for_test(9);
    let parsed: Vec<_> = replies(&batch_bytes).collect();
    assert_eq!(parsed.len(), 1);
    assert_eq!((parsed[0].ty, parsed[0].seq), (0x0a06, 9));
    let top: Vec<_> = attrs(parsed[0].payload, 4).collect();
    assert_eq!(top.len(), 2);
    assert_eq!(top[0], (1, &b"abc\0"[..]));
    let inner: Vec<_> = attrs(top[1].1, 0).collect();
    assert_eq!(inner, vec![(1, &[7u8][..]), (2, &[1u8, 2, 3, 4][..])]);
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
    let exprs = nft::port(6, false, libc::NFT_CMP_NEQ, 15008);
    assert_eq!(
        exprs.last(),
        Some(&nft::cmp(libc::NFT_CMP_NEQ, &[0x3a, 0xa0]))
    );
    let mark = nft::mark(false, 0xfff, libc::NFT_CMP_EQ, 0x539);
    assert_eq!(mark[2], nft::cmp(libc::NFT_CMP_EQ, &0x539u32.to_ne_bytes()));
    let probe = nft::addr(
        true,
        libc::NFT_CMP_EQ,
        IpAddr::V4(Ipv4Addr::new(169, 254, 7, 127)),
    );
    assert_eq!(
        probe[2],
        Expr::Payload {
            base: libc::NFT_PAYLOAD_NETWORK_HEADER,
            offset: 12,
            len: 4
        }
    );
    assert_eq!(probe[3], nft::cmp(libc::NFT_CMP_EQ, &[169, 254, 7, 127]));
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
