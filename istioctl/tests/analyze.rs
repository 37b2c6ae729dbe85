//! The built `istioctl analyze` on directories: exit codes and output shapes as upstream.

use std::process::{Command, Output};

fn analyze(dir: &std::path::Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_istioctl"))
        .arg("analyze")
        .arg(dir)
        .args(extra)
        .output()
        .expect("run istioctl")
}

const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: demo\n  labels:\n    app: p\n    istio.io/use-waypoint: missing\n";

#[test]
fn errors_exit_79_with_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("pod.yaml"), POD).expect("write");
    let out = analyze(dir.path(), &[]);
    assert_eq!(out.status.code(), Some(79));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout,
        format!(
            "Error [IST0101] (Pod demo/p {}:1) Referenced gateway not found: \"demo/missing\"\n",
            dir.path().join("pod.yaml").display()
        )
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("Error: Analyzers found issues when analyzing"),
        "{stderr}"
    );
    // Like upstream, structured output does not set the exit code.
    let out = analyze(dir.path(), &["-o", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json[0]["code"], "IST0101");
    // Warnings fail only when asked.
    let svc =
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\nspec:\n  selector:\n    app: none\n";
    let warn_dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(warn_dir.path().join("svc.yaml"), svc).expect("write");
    assert_eq!(analyze(warn_dir.path(), &[]).status.code(), Some(0));
    assert_eq!(
        analyze(warn_dir.path(), &["--failure-threshold", "Warning"])
            .status
            .code(),
        Some(79)
    );
}

#[test]
fn clean_directory_exits_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ok = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n  labels:\n    istio.io/dataplane-mode: ambient\n";
    std::fs::write(dir.path().join("ns.yaml"), ok).expect("write");
    let out = analyze(dir.path(), &["-o", "text"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("\u{2714} No validation issues found when analyzing"),
        "{stderr}"
    );
}

#[test]
fn missing_directory_is_an_error() {
    let out = analyze(std::path::Path::new("/nonexistent/manifests"), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/manifests"));
}
