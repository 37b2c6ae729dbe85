//! Settings parsing and the rule set's shape (no privileges needed; the traffic tests run the
//! real init step: `pilot-agent/tests/istio_iptables.rs`).

use mesh_nft::{Expr, Verdict};

use crate::config::*;
use crate::rules::{self, nat_chains, IN_REDIRECT, REDIRECT};

fn istio_default() -> CaptureConfig {
    CaptureConfig {
        include_outbound_cidrs: Selection::All,
        include_inbound_ports: Selection::All,
        exclude_inbound_ports: vec![15090, 15021, 15020],
        ..CaptureConfig::default()
    }
}

fn chain<'a>(chains: &'a [(&'static str, Vec<Vec<Expr>>)], name: &str) -> &'a [Vec<Expr>] {
    &chains.iter().find(|(n, _)| *n == name).expect(name).1
}

fn verdict(rule: &[Expr]) -> Option<&Verdict> {
    rule.iter().find_map(|e| match e {
        Expr::Verdict(v) => Some(v),
        _ => None,
    })
}

#[test]
fn lists_parse_like_istio_iptables_and_bad_values_are_named() {
    assert_eq!(
        parse_ports(" 15090, 15021,,15020 "),
        Ok(vec![15090, 15021, 15020])
    );
    assert_eq!(parse_port_selection("*"), Ok(Selection::All));
    assert_eq!(parse_port_selection(""), Ok(Selection::Only(vec![])));
    assert_eq!(
        parse_ports("80,http"),
        Err(ConfigError::Port("http".into()))
    );
    assert_eq!(parse_ports("0"), Err(ConfigError::Port("0".into())));
    assert_eq!(parse_ports("65536"), Err(ConfigError::Port("65536".into())));
    let cidrs = parse_cidrs("10.0.0.0/8,192.168.1.1,fd00::/8").expect("valid");
    assert_eq!(cidrs[1].prefix_len, 32);
    assert_eq!(cidrs[2].to_string(), "fd00::/8");
    assert_eq!(
        parse_cidrs("10.0.0.0/33"),
        Err(ConfigError::Cidr("10.0.0.0/33".into()))
    );
    assert_eq!(
        parse_cidrs("10.0.0/8"),
        Err(ConfigError::Cidr("10.0.0/8".into()))
    );
    assert_eq!(
        parse_exclude_cidrs("*", "-x"),
        Err(ConfigError::WildcardExclude("-x"))
    );
    assert_eq!(parse_ids("1337,1338"), Ok(vec![1337, 1338]));
    assert_eq!(parse_ids("root"), Err(ConfigError::Id("root".into())));
    assert_eq!(
        "TPROXY".parse::<InterceptionMode>(),
        Err(ConfigError::Tproxy)
    );
    assert_eq!(
        "redirect".parse::<InterceptionMode>(),
        Err(ConfigError::Mode("redirect".into()))
    );
    assert!(parse_interfaces("eth0,net1").is_ok());
    assert!(parse_interfaces("a/b").is_err());
    assert!(parse_interfaces("averyveryverylongname").is_err());
}

#[test]
fn the_default_sidecar_rules_follow_istio_order() {
    let chains = nat_chains(&istio_default());
    let names: Vec<&str> = chains.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "prerouting",
            "output",
            "istio-inbound",
            "istio-redirect",
            "istio-in-redirect",
            "istio-output"
        ]
    );
    let inbound = chain(&chains, "istio-inbound");
    // 15008, the three excluded ports, then everything else to the inbound redirect.
    assert_eq!(inbound.len(), 5);
    assert_eq!(verdict(&inbound[0]), Some(&Verdict::Return));
    assert_eq!(verdict(&inbound[4]), Some(&Verdict::Jump(IN_REDIRECT)));
    let output = chain(&chains, "istio-output");
    // passthrough, 3 per uid, 3 per gid, loopback, everything else.
    assert_eq!(output.len(), 1 + 3 + 3 + 1 + 1);
    assert_eq!(verdict(&output[1]), Some(&Verdict::Jump(IN_REDIRECT)));
    assert_eq!(
        verdict(output.last().expect("rules")),
        Some(&Verdict::Jump(REDIRECT))
    );
    assert_eq!(rules::rule_count(&istio_default()), 1 + 1 + 5 + 1 + 1 + 9);
}

#[test]
fn empty_includes_capture_nothing_and_ipv6_adds_twins() {
    let none = CaptureConfig::default();
    let chains = nat_chains(&none);
    assert!(
        chain(&chains, "prerouting").is_empty(),
        "no inbound ports: no inbound jump"
    );
    assert!(chain(&chains, "istio-output")
        .iter()
        .all(|r| verdict(r) != Some(&Verdict::Jump(REDIRECT))));
    let v6 = CaptureConfig {
        ipv6: true,
        ..istio_default()
    };
    let output = nat_chains(&v6);
    // passthrough and loopback twice, and the uid/gid in-redirect rules twice.
    assert_eq!(chain(&output, "istio-output").len(), 2 + 4 + 4 + 2 + 1);
}

#[test]
fn a_loopback_include_keeps_loopback_app_traffic_captured() {
    let cfg = CaptureConfig {
        include_outbound_cidrs: Selection::Only(parse_cidrs("127.0.0.0/8").expect("valid")),
        ..istio_default()
    };
    let output = nat_chains(&cfg);
    // No `oifname lo skuid != 1337 return` rules: 2 per owner instead of 3.
    assert_eq!(chain(&output, "istio-output").len(), 1 + 2 + 2 + 1 + 1);
}
