//! `cni-node install-cni --watch` as a process: it waits for the primary configuration,
//! chains into it, puts the entry back when the primary plugin rewrites its file, and takes
//! out exactly what it installed on SIGTERM (outside a cluster there is no DaemonSet to
//! suggest an upgrade).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

fn types(path: &Path) -> Vec<String> {
    std::fs::read(path)
        .ok()
        .and_then(|t| serde_json::from_slice::<Value>(&t).ok())
        .and_then(|v| {
            v["plugins"].as_array().map(|ps| {
                ps.iter()
                    .filter_map(|p| p["type"].as_str().map(str::to_string))
                    .collect()
            })
        })
        .unwrap_or_default()
}

#[test]
fn install_cni_watch_repairs_and_cleans_up_on_sigterm() {
    let dir = tempfile::tempdir().expect("dir");
    let net_dir = dir.path().join("net.d");
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir_all(&net_dir).expect("net.d");
    let plugin = dir.path().join("istio-cni");
    std::fs::write(&plugin, b"#!/bin/sh\n").expect("plugin");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cni-node"))
        .args(["install-cni", "--watch", "--net-dir"])
        .arg(&net_dir)
        .arg("--bin-dir")
        .arg(&bin_dir)
        .arg("--plugin")
        .arg(&plugin)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cni-node");
    let primary = net_dir.join("10-flannel.conflist");
    let original = json!({"name": "cbr0", "cniVersion": "0.3.1", "plugins": [{"type": "flannel"}]});
    let wait = |f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&primary, serde_json::to_vec(&original).expect("json")).expect("write");
    wait(&|| types(&primary) == ["flannel", "istio-cni"]);
    assert!(bin_dir.join("istio-cni").exists());
    // The primary plugin rewrites its file: chained again within the repair interval.
    std::fs::write(&primary, serde_json::to_vec(&original).expect("json")).expect("write");
    wait(&|| types(&primary) == ["flannel", "istio-cni"]);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    assert_eq!(types(&primary), ["flannel"]);
    assert!(!bin_dir.join("istio-cni").exists());
}
