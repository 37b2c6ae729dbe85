use super::*;

#[test]
fn privileges_need_both_capabilities() {
    let root = "Name:\tx\nUid:\t0\t0\t0\t0\nCapEff:\t000001ffffffffff\n";
    assert_eq!(
        privileges(root),
        Ok("running as root with CAP_NET_ADMIN and CAP_SYS_ADMIN".to_string())
    );
    // NET_ADMIN (bit 12) only.
    let partial = "Uid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000001000\n";
    let err = privileges(partial).expect_err("SYS_ADMIN missing");
    assert_eq!(err.0, "running as uid 1000 without CAP_SYS_ADMIN");
    let none = "Uid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\n";
    let err = privileges(none).expect_err("both missing");
    assert!(
        err.0.ends_with("without CAP_NET_ADMIN and CAP_SYS_ADMIN"),
        "{}",
        err.0
    );
    assert!(err.1.contains("root"), "the fix says what to do: {}", err.1);
}

#[test]
fn kernel_must_be_5_10_or_newer() {
    assert!(kernel("6.18.44-fc-v669").is_ok());
    assert!(kernel("5.10.0-28-amd64").is_ok());
    assert!(kernel("5.4.0-150-generic").is_err());
    assert!(kernel("4.19.0").is_err());
    assert!(kernel("").is_err());
}

#[test]
fn cni_plugins_are_looked_up_in_the_given_dir() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let bridge = dir.path().join("bridge");
    std::fs::write(&bridge, "#!/bin/sh\n").expect("write");
    std::fs::set_permissions(&bridge, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // host-local missing (unless /opt/cni/bin has it).
    let result = cni_plugins(dir.path());
    if !Path::new("/opt/cni/bin/host-local").exists() {
        let (problem, fix) = result.expect_err("host-local missing");
        assert!(problem.starts_with("host-local not found"), "{problem}");
        assert!(fix.contains("containernetworking-plugins"), "{fix}");
    }
    let host_local = dir.path().join("host-local");
    std::fs::write(&host_local, "#!/bin/sh\n").expect("write");
    std::fs::set_permissions(&host_local, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let found = cni_plugins(dir.path()).expect("both present");
    assert!(
        found.contains("bridge") && found.contains("host-local"),
        "{found}"
    );
}

#[test]
fn lines_show_pass_fail_and_optional() {
    let pass = Check::new("kernel", true, Ok("6.1 (5.10 or newer)".into()));
    assert_eq!(pass.line(), "\u{2714} kernel: 6.1 (5.10 or newer)");
    let fail = Check::new(
        "nftables",
        true,
        Err(("nft missing".into(), "install it".into())),
    );
    assert_eq!(
        fail.line(),
        "\u{2718} nftables: nft missing. Fix: install it"
    );
    assert!(fail.failed_required());
    let optional = Check::new(
        "envoy",
        false,
        Err(("no envoy".into(), "pip install".into())),
    );
    assert_eq!(
        optional.line(),
        "! envoy (optional): no envoy. Fix: pip install"
    );
    assert!(!optional.failed_required());
}
