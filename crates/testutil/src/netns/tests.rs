use std::net::Ipv4Addr;

use super::redirect::redirect_rules_script;
use super::stale::{
    claim_in_progress_by, cleanup_stale_in, parse_start_time, parse_state, Owner, State, StateFile,
};
use super::topology::{base36, in_cidr, make_prefix, sanitize_hint};
use super::RedirectOptions;

#[test]
fn prefixes_leave_room_for_interface_suffixes() {
    assert_eq!(base36(0), "0");
    assert_eq!(base36(35), "z");
    assert_eq!(base36(36), "10");
    assert_eq!(sanitize_hint("Mesh-Test"), "mes");
    assert_eq!(sanitize_hint("--"), "mt");
    assert_eq!(make_prefix("mt", 1234, 5), "mtya05");
    // The longest pid (pid_max 2^22) and counter: 10 bytes, so `<prefix>p9999` fits in 15.
    let longest = make_prefix("abc", 4_194_304, 36 * 36 - 1);
    assert_eq!(longest.len(), 10, "{longest}");
    assert!(format!("{longest}p9999").len() <= 15);
}

#[test]
fn cidr_membership() {
    let underlay = (Ipv4Addr::new(172, 30, 0, 0), 24);
    assert!(in_cidr(Ipv4Addr::new(172, 30, 0, 9), underlay));
    assert!(!in_cidr(Ipv4Addr::new(172, 30, 1, 9), underlay));
    assert!(in_cidr(
        Ipv4Addr::new(1, 2, 3, 4),
        (Ipv4Addr::UNSPECIFIED, 0)
    ));
}

#[test]
fn start_time_is_field_22_even_with_odd_command_names() {
    let stat =
        "4242 (a b) c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
    assert_eq!(parse_start_time(stat), Some(987_654));
    assert_eq!(parse_start_time("garbage"), None);
}

#[test]
fn state_file_round_trip_and_exclusive_claim() {
    let dir = tempfile::tempdir().expect("tempdir");
    let owner = Owner::current().expect("this process has a start time");
    assert!(owner.is_alive());
    let claim = StateFile::claim(dir.path(), "mtx00", owner).expect("claim");
    let claim = claim.expect("a fresh prefix can be claimed");
    assert!(
        StateFile::claim(dir.path(), "mtx00", owner)
            .expect("claim")
            .is_none(),
        "a claimed prefix cannot be claimed twice"
    );
    claim.record_netns("mtx00-underlay").expect("record");
    claim.record_netns("mtx00-node1").expect("record");
    let text = std::fs::read_to_string(dir.path().join("mtx00")).expect("state file");
    assert_eq!(
        parse_state(&text),
        State {
            owner: Some(owner),
            netns: vec!["mtx00-underlay".into(), "mtx00-node1".into()],
        }
    );
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    claim.remove();
    assert!(!dir.path().join("mtx00").exists());
}

#[test]
fn a_claim_being_written_survives_a_concurrent_cleanup_and_an_abandoned_one_does_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A live claimant has created its temporary file and not written it yet: empty content,
    // no owner line. Another test thread cleaning up stale topologies must leave it alone.
    let live = format!(".mtx01.tmp{}", std::process::id());
    // Beyond the kernel's largest pid (2^22): nobody can be writing this one.
    let abandoned = ".mtx02.tmp99999999";
    for name in [live.as_str(), abandoned] {
        std::fs::write(dir.path().join(name), "").expect("write");
    }
    assert_eq!(claim_in_progress_by(&live), Some(std::process::id()));
    assert_eq!(claim_in_progress_by(".mtx03.tmp"), None);
    assert_eq!(
        cleanup_stale_in(dir.path()).expect("cleanup"),
        Vec::<String>::new()
    );
    assert!(dir.path().join(&live).exists(), "a live claim was removed");
    assert!(
        !dir.path().join(abandoned).exists(),
        "an abandoned claim was kept"
    );
}

#[test]
fn a_reused_pid_is_not_the_owner() {
    let owner = Owner::current().expect("start time");
    let impostor = Owner {
        pid: owner.pid,
        start: owner.start + 1,
    };
    assert!(!impostor.is_alive());
}

#[test]
fn redirect_script_matches_istio_cni() {
    let script = redirect_rules_script(RedirectOptions::default());
    for expected in [
        "add table inet istio-ambient-nat",
        "flush table inet istio-ambient-nat",
        "add chain inet istio-ambient-nat prerouting { type nat hook prerouting priority -100 ; }",
        "add rule inet istio-ambient-nat istio-prerouting meta l4proto tcp ip saddr 169.254.7.127 counter accept",
        "add rule inet istio-ambient-nat istio-prerouting ip daddr != 127.0.0.1/32 tcp dport != 15008 meta mark and 0xfff != 0x539 counter redirect to :15006",
        "add rule inet istio-ambient-nat istio-output meta l4proto tcp meta mark and 0xfff == 0x111 counter accept",
        "add rule inet istio-ambient-nat istio-output oifname lo ip daddr != 127.0.0.1/32 counter accept",
        "add rule inet istio-ambient-nat istio-output meta l4proto tcp ip daddr != 127.0.0.1/32 meta mark and 0xfff != 0x539 counter redirect to :15001",
        "add chain inet istio-ambient-mangle output { type route hook output priority -150 ; }",
        "add rule inet istio-ambient-mangle istio-prerouting meta mark and 0xfff == 0x539 counter ct mark set ct mark and 0xfffff000 or 0x111",
        "add rule inet istio-ambient-mangle istio-output ct mark and 0xfff == 0x111 counter meta mark set ct mark",
        "add chain inet istio-ambient-raw prerouting { type filter hook prerouting priority -300 ; }",
    ] {
        assert!(script.lines().any(|line| line == expected), "missing {expected:?} in\n{script}");
    }
    assert!(!script.contains("15053"), "DNS capture is opt-in");
    assert!(
        !script.contains("ct zone"),
        "DNS conntrack zones go with DNS capture"
    );

    let dns = redirect_rules_script(RedirectOptions { dns_capture: true });
    assert!(dns.lines().any(|l| l
        == "add rule inet istio-ambient-nat istio-output oifname != lo meta mark and 0xfff != 0x539 udp dport 53 counter redirect to :15053"));
    assert!(dns.lines().any(|l| l
        == "add rule inet istio-ambient-raw istio-output udp dport 53 meta mark and 0xfff == 0x539 counter ct zone set 1"));
    // The outbound catch-all comes after the DNS rules, as in istio-cni.
    let dns_at = dns.find("redirect to :15053").expect("dns rule");
    let outbound_at = dns.find("redirect to :15001").expect("outbound rule");
    assert!(dns_at < outbound_at);
}
