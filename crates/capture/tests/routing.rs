//! The policy routing both capture modes program, in a real network namespace (root; CI runs
//! as root), checked against what iproute2 prints: installing is idempotent, removing takes
//! every copy and tolerates absence, and the links dump sees the pod's interfaces.
#![cfg(feature = "rtnl")]

use std::net::Ipv4Addr;

use mesh_capture::routing::{self, Family, LocalDelivery, EBPF_DELIVERY, NFT_DELIVERY};
use mesh_capture::rtnl::{Rtnl, NLM_F_CREATE};
use mesh_testutil::netns::{have_root, Netns, TestNet};
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::errno::Errno;

fn with_rtnl<R: Send>(netns: &Netns, f: impl FnOnce(&mut Rtnl) -> R + Send) -> R {
    netns
        .run(|| f(&mut Rtnl::open().expect("rtnetlink socket")))
        .expect("enter the namespace")
}

fn rules(netns: &Netns, family: &str) -> Vec<String> {
    let out = netns.ip(&[family, "rule", "show"]).expect("ip rule");
    out.lines()
        .filter(|line| line.contains("fwmark"))
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn routes(netns: &Netns, family: &str, delivery: &LocalDelivery) -> String {
    let table = delivery.table.to_string();
    let out = netns
        .ip(&[family, "route", "show", "table", &table])
        .unwrap_or_default();
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn both_deliveries_install_once_read_back_and_remove_cleanly() {
    if !have_root("both_deliveries_install_once_read_back_and_remove_cleanly") {
        return;
    }
    let mut net = TestNet::new("rtn").expect("test network");
    let node = net
        .add_node("node", Ipv4Addr::new(172, 30, 0, 11))
        .expect("node");
    let pod = net.add_pod(&node, "a", node.pod_ip(2)).expect("pod");
    let ns = pod.netns();

    for family in [Family::V4, Family::V6] {
        with_rtnl(ns, |nl| {
            assert!(!NFT_DELIVERY.present(nl, family).expect("dump"));
            NFT_DELIVERY.install(nl, family).expect("install");
            NFT_DELIVERY.install(nl, family).expect("install again");
            assert!(NFT_DELIVERY.present(nl, family).expect("dump"));
            assert!(!EBPF_DELIVERY.rule_present(nl, family).expect("dump"));
        });
    }
    with_rtnl(ns, |nl| EBPF_DELIVERY.install(nl, Family::V4)).expect("install ebpf");

    assert_eq!(
        rules(ns, "-4"),
        [
            "32763: from all fwmark 0x111/0xfff iif lo lookup 101",
            "32764: from all fwmark 0x111/0xfff lookup 100",
        ]
    );
    assert_eq!(
        rules(ns, "-6"),
        ["32764: from all fwmark 0x111/0xfff lookup 100"]
    );
    assert_eq!(
        routes(ns, "-4", &NFT_DELIVERY),
        "local default dev lo scope host"
    );
    assert_eq!(
        routes(ns, "-6", &NFT_DELIVERY),
        "local default dev lo metric 1024 pref medium"
    );
    assert_eq!(
        routes(ns, "-4", &EBPF_DELIVERY),
        "local default dev lo proto static scope host"
    );

    // A copy added by someone else goes too.
    // (iproute2 refuses duplicates; the kernel takes them without NLM_F_EXCL.)
    with_rtnl(ns, |nl| {
        let mut rule = RuleMessage::default();
        rule.header.family = AddressFamily::Inet;
        rule.header.action = RuleAction::ToTable;
        rule.attributes = vec![
            RuleAttribute::Priority(32764),
            RuleAttribute::FwMark(0x111),
            RuleAttribute::FwMask(0xfff),
            RuleAttribute::Table(100),
        ];
        nl.request(
            "add a duplicate",
            RouteNetlinkMessage::NewRule(rule),
            NLM_F_CREATE,
        )
    })
    .expect("duplicate rule");
    assert_eq!(rules(ns, "-4").len(), 3);
    with_rtnl(ns, |nl| {
        for family in [Family::V4, Family::V6] {
            NFT_DELIVERY.remove(nl, family).expect("remove");
            NFT_DELIVERY.remove(nl, family).expect("remove again");
            assert!(!NFT_DELIVERY.rule_present(nl, family).expect("dump"));
            assert!(!NFT_DELIVERY.route_present(nl, family).expect("dump"));
        }
        assert!(EBPF_DELIVERY.present(nl, Family::V4).expect("dump"));
        EBPF_DELIVERY.remove(nl, Family::V4).expect("remove ebpf");
    });
    assert!(rules(ns, "-4").is_empty() && rules(ns, "-6").is_empty());
    assert_eq!(routes(ns, "-4", &NFT_DELIVERY), "");
    assert_eq!(routes(ns, "-4", &EBPF_DELIVERY), "");

    let links = with_rtnl(ns, routing::links).expect("links");
    let names: Vec<_> = links
        .iter()
        .map(|link| (link.name.as_str(), link.loopback))
        .collect();
    assert_eq!(names, [("lo", true), (pod.iface(), false)]);
    assert_eq!(links[0].index, routing::LOOPBACK_IFINDEX);
}

#[test]
fn a_refused_request_names_the_operation_and_the_errno() {
    if !have_root("a_refused_request_names_the_operation_and_the_errno") {
        return;
    }
    let mut net = TestNet::new("rte").expect("test network");
    let node = net
        .add_node("node", Ipv4Addr::new(172, 30, 0, 12))
        .expect("node");
    let error = with_rtnl(node.netns(), |nl| {
        let mut link = LinkMessage::default();
        link.header.index = 9999;
        let result = nl.request(
            "delete interface 9999",
            RouteNetlinkMessage::DelLink(link),
            0,
        );
        // The socket stays usable after a refusal.
        assert!(!routing::links(nl).expect("links").is_empty());
        result
    })
    .expect_err("no such interface");
    assert_eq!(error.errno(), Some(Errno::ENODEV), "{error:?}");
    let text = error.to_string();
    assert!(
        text.starts_with("delete interface 9999: the kernel refused it"),
        "{text}"
    );
}
