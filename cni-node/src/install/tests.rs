//! The installer on real files: choice of the primary configuration, `.conf` to `.conflist`,
//! replacing an old entry, modes kept, clean uninstall.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use serde_json::{json, Value};

use super::*;

struct Host {
    _dir: tempfile::TempDir,
    opts: InstallOptions,
}

fn host() -> Host {
    let dir = tempfile::tempdir().expect("dir");
    let net_dir = dir.path().join("net.d");
    fs::create_dir_all(&net_dir).expect("net.d");
    let plugin_binary = dir.path().join("istio-cni-build");
    fs::write(&plugin_binary, b"#!/bin/sh\n").expect("binary");
    let opts = InstallOptions {
        net_dir,
        bin_dir: dir.path().join("bin"),
        plugin_binary,
        conf_name: None,
        entry: json!({"type": "istio-cni", "name": "istio-cni", "cniVersion": "0.3.1",
                      "plugin_log_level": "info", "kubernetes": {"kubeconfig": "/etc/cni/net.d/istio-cni-kubeconfig"}}),
        kubeconfig: Some((
            dir.path().join("istio-cni-kubeconfig"),
            "apiVersion: v1\n".into(),
        )),
    };
    Host { _dir: dir, opts }
}

fn write(h: &Host, name: &str, v: &Value, mode: u32) {
    let p = h.opts.net_dir.join(name);
    fs::write(&p, serde_json::to_vec(v).expect("json")).expect("write");
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn read(h: &Host, name: &str) -> Value {
    serde_json::from_slice(&fs::read(h.opts.net_dir.join(name)).expect("read")).expect("json")
}

fn types(v: &Value) -> Vec<String> {
    v["plugins"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["type"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn flannel() -> Value {
    json!({"name": "cbr0", "cniVersion": "0.3.1", "plugins": [{"type": "flannel"}, {"type": "portmap"}]})
}

#[test]
fn the_first_valid_file_in_lexical_order_is_the_primary() {
    let h = host();
    assert!(
        choose_primary(&h.opts.net_dir, None).expect("ok").is_none(),
        "none yet"
    );
    assert!(matches!(
        install(&h.opts),
        Err(InstallError::NoPrimary { .. })
    ));
    write(
        &h,
        "05-broken.conflist",
        &json!({"name": "x", "plugins": []}),
        0o644,
    );
    write(&h, "10-flannel.conflist", &flannel(), 0o644);
    write(&h, "20-other.conflist", &flannel(), 0o644);
    fs::write(h.opts.net_dir.join("00-notes.txt"), "x").expect("write");
    let chosen = choose_primary(&h.opts.net_dir, None)
        .expect("ok")
        .expect("found");
    assert!(chosen.ends_with("10-flannel.conflist"), "{chosen:?}");
    let by_name = choose_primary(&h.opts.net_dir, Some("20-other.conflist")).expect("ok");
    assert!(by_name.expect("found").ends_with("20-other.conflist"));
}

#[test]
fn a_conflist_gets_the_entry_last_once_and_keeps_its_mode() {
    let h = host();
    write(&h, "10-flannel.conflist", &flannel(), 0o600);
    let target = install(&h.opts).expect("install");
    assert!(target.ends_with("10-flannel.conflist"));
    assert_eq!(
        types(&read(&h, "10-flannel.conflist")),
        ["flannel", "portmap", "istio-cni"]
    );
    let mode = fs::metadata(&target).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "mode kept");
    // Installing again (an upgrade with new settings) replaces the old entry.
    let mut again = h.opts.clone();
    again.entry["plugin_log_level"] = json!("debug");
    install(&again).expect("reinstall");
    let v = read(&h, "10-flannel.conflist");
    assert_eq!(types(&v), ["flannel", "portmap", "istio-cni"]);
    assert_eq!(v["plugins"][2]["plugin_log_level"], "debug");
    // The binary and kubeconfig are in place.
    let bin = h.opts.bin_dir.join("istio-cni");
    assert_eq!(
        fs::metadata(&bin).expect("bin").permissions().mode() & 0o777,
        0o755
    );
    assert!(h.opts.kubeconfig.as_ref().is_some_and(|(p, _)| p.is_file()));
}

#[test]
fn a_conf_becomes_a_conflist() {
    let h = host();
    let conf = json!({"cniVersion": "0.3.1", "name": "bridge", "type": "bridge", "bridge": "cni0"});
    write(&h, "10-bridge.conf", &conf, 0o644);
    let target = install(&h.opts).expect("install");
    assert!(target.ends_with("10-bridge.conflist"));
    assert!(
        !h.opts.net_dir.join("10-bridge.conf").exists(),
        "the .conf is replaced"
    );
    let v = read(&h, "10-bridge.conflist");
    assert_eq!(v["name"], CHAINED_NAME);
    assert_eq!(v["plugins"][0], conf);
    assert_eq!(types(&v), ["bridge", "istio-cni"]);
}

#[test]
fn uninstall_takes_out_only_what_install_put_in() {
    let h = host();
    write(&h, "10-flannel.conflist", &flannel(), 0o640);
    write(&h, "99-unrelated.conflist", &flannel(), 0o644);
    install(&h.opts).expect("install");
    uninstall(&h.opts).expect("uninstall");
    assert_eq!(
        read(&h, "10-flannel.conflist"),
        flannel(),
        "the original, exactly"
    );
    let mode = fs::metadata(h.opts.net_dir.join("10-flannel.conflist")).expect("meta");
    assert_eq!(mode.permissions().mode() & 0o777, 0o640);
    assert_eq!(read(&h, "99-unrelated.conflist"), flannel());
    assert!(!h.opts.bin_dir.join("istio-cni").exists());
    assert!(h.opts.kubeconfig.as_ref().is_some_and(|(p, _)| !p.exists()));
    // Twice is fine.
    uninstall(&h.opts).expect("uninstall again");
}

#[test]
fn a_named_file_that_is_not_a_cni_configuration_is_refused() {
    let mut h = host();
    write(&h, "10-x.conflist", &json!({"name": "x"}), 0o644);
    h.opts.conf_name = Some("10-x.conflist".into());
    let err = install(&h.opts).expect_err("refused");
    assert!(err.to_string().contains("10-x.conflist"), "{err}");
}
