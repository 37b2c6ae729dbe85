//! The built `istioctl x precheck`: one line per check; as root (CI) the privileged checks pass.

use std::process::Command;

const CHECKS: [&str; 8] = [
    "privileges",
    "network namespaces",
    "nftables",
    "ebpf",
    "cni plugins",
    "istio-cni",
    "envoy",
    "kernel",
];

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

#[test]
fn every_check_prints_a_pass_or_fail_line() {
    if !is_root() && std::env::var_os("CI").is_some() {
        panic!("precheck test must run as root in CI");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_istioctl"))
        .args(["x", "precheck"])
        .output()
        .expect("run istioctl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), CHECKS.len() + 1, "{stdout}");
    for (line, name) in lines.iter().zip(CHECKS) {
        let ok = line.starts_with(&format!("\u{2714} {name}: "))
            || line.starts_with(&format!("\u{2718} {name}: ")) && line.contains(". Fix: ")
            || line.starts_with(&format!("! {name} (optional): ")) && line.contains(". Fix: ");
        assert!(ok, "line for {name}: {line:?}\n{stdout}");
    }
    let failed_required = lines.iter().any(|l| l.starts_with('\u{2718}'));
    assert_eq!(out.status.success(), !failed_required, "{stdout}");
    let summary = lines.last().copied().unwrap_or_default();
    if failed_required {
        assert!(summary.starts_with("Error: "), "{summary}");
    } else {
        assert!(summary.starts_with("\u{2714} No issues found"), "{summary}");
    }
    if is_root() {
        for name in ["privileges", "network namespaces", "nftables", "kernel"] {
            assert!(
                stdout.contains(&format!("\u{2714} {name}: ")),
                "{name} passes as root: {stdout}"
            );
        }
        // The throwaway namespace is gone.
        let netns = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip");
        assert!(!String::from_utf8_lossy(&netns.stdout).contains("istioctl-precheck"));
    }
}
