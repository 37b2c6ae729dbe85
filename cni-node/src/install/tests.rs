//! The installer on real files: choice of the primary configuration, `.conf` to `.conflist`,
//! replacing an old entry, modes kept, the kubeconfig from the service account, clean
//! uninstall, and the repair loop.

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
    let sa = dir.path().join("serviceaccount");
    fs::create_dir_all(&sa).expect("sa");
    fs::write(sa.join("token"), "token-1\n").expect("token");
    fs::write(
        sa.join("ca.crt"),
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .expect("ca");
    let opts = InstallOptions {
        net_dir,
        bin_dir: dir.path().join("bin"),
        plugin_binary,
        conf_name: None,
        entry: json!({"type": "istio-cni", "name": "istio-cni", "cniVersion": "0.3.1",
                      "plugin_log_level": "info", "kubernetes": {"kubeconfig": "/etc/cni/net.d/istio-cni-kubeconfig"}}),
        kubeconfig: Some((
            dir.path().join("run/istio-cni-kubeconfig"),
            ServiceAccount {
                dir: sa,
                host: "10.96.0.1".into(),
                port: "443".into(),
            },
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

#[test]
fn the_kubeconfig_names_the_api_server_the_ca_and_the_token() {
    let h = host();
    write(&h, "10-flannel.conflist", &flannel(), 0o644);
    install(&h.opts).expect("install");
    let (path, account) = h.opts.kubeconfig.as_ref().expect("kubeconfig");
    let mode = fs::metadata(path).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "it holds a token");
    let text = fs::read_to_string(path).expect("read");
    let config = kube::config::Kubeconfig::from_yaml(&text).expect("a kubeconfig kube reads");
    let cluster = config.clusters[0].cluster.as_ref().expect("cluster");
    assert_eq!(cluster.server.as_deref(), Some("https://10.96.0.1:443"));
    let ca = cluster
        .certificate_authority_data
        .as_deref()
        .expect("CA data");
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(ca)
        .expect("base64");
    assert!(String::from_utf8_lossy(&ca).contains("BEGIN CERTIFICATE"));
    let user = config.auth_infos[0].auth_info.as_ref().expect("user");
    assert!(user.token.is_some(), "a token user");
    assert!(text.contains("\"token\": \"token-1\""), "{text}");
    let v6 = ServiceAccount {
        host: "fd00::1".into(),
        ..account.clone()
    };
    assert!(v6
        .kubeconfig()
        .expect("v6")
        .contains("https://[fd00::1]:443"));
    fs::write(account.dir.join("token"), "").expect("empty token");
    let err = account.kubeconfig().expect_err("empty token");
    assert!(err.to_string().contains("token"), "{err}");
}

/// Polls `f` every 20 ms for up to 5 s.
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    mesh_testutil::eventually(std::time::Duration::from_secs(5), &mut f).await
}

#[tokio::test]
async fn the_repair_loop_waits_for_the_primary_and_puts_back_what_is_undone() {
    use repair::{keep_installed, Cleanup};
    let h = host();
    let opts = h.opts.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (kept_tx, kept_rx) = tokio::sync::oneshot::channel::<Cleanup>();
    let task = tokio::spawn(async move {
        let stop = async {
            let _ = stop_rx.await;
        };
        let cleanup = || async { kept_rx.await.unwrap_or(Cleanup::Remove) };
        keep_installed(&opts, std::time::Duration::from_millis(20), stop, cleanup).await
    });
    let chained = |h: &Host, name: &str| {
        fs::read(h.opts.net_dir.join(name))
            .ok()
            .and_then(|t| serde_json::from_slice::<Value>(&t).ok())
            .is_some_and(|v| types(&v) == ["flannel", "portmap", "istio-cni"])
    };
    // Nothing to chain into yet: it waits.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(fs::read_dir(&h.opts.net_dir).expect("dir").count(), 0);
    write(&h, "10-flannel.conflist", &flannel(), 0o640);
    assert!(
        eventually(|| chained(&h, "10-flannel.conflist")).await,
        "installed once the primary appears"
    );

    // The primary plugin rewrites its file: the entry is put back, the mode kept.
    write(&h, "10-flannel.conflist", &flannel(), 0o640);
    assert!(
        eventually(|| chained(&h, "10-flannel.conflist")).await,
        "re-chained"
    );
    let mode = fs::metadata(h.opts.net_dir.join("10-flannel.conflist")).expect("meta");
    assert_eq!(mode.permissions().mode() & 0o777, 0o640);

    // The binary goes, the token rotates: both are put back.
    fs::remove_file(h.opts.bin_dir.join("istio-cni")).expect("rm");
    let (kubeconfig, account) = h.opts.kubeconfig.clone().expect("kubeconfig");
    fs::write(account.dir.join("token"), "token-2\n").expect("rotate");
    assert!(
        eventually(|| h.opts.bin_dir.join("istio-cni").exists()
            && fs::read_to_string(&kubeconfig).is_ok_and(|k| k.contains("token-2")))
        .await,
        "binary and kubeconfig repaired"
    );

    // A file that now sorts first becomes the primary.
    write(&h, "05-calico.conflist", &flannel(), 0o644);
    assert!(
        eventually(|| chained(&h, "05-calico.conflist")).await,
        "follows the new primary"
    );

    // Stopped during an upgrade: left in place.
    kept_tx.send(Cleanup::Keep).expect("send");
    stop_tx.send(()).expect("stop");
    task.await.expect("join").expect("keep_installed");
    assert!(chained(&h, "05-calico.conflist"));
    assert!(h.opts.bin_dir.join("istio-cni").exists());
}

#[tokio::test]
async fn the_repair_loop_removes_its_work_when_the_daemonset_is_gone() {
    use repair::{keep_installed, Cleanup};
    let h = host();
    write(&h, "10-flannel.conflist", &flannel(), 0o640);
    let opts = h.opts.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let stop = async {
            let _ = stop_rx.await;
        };
        keep_installed(
            &opts,
            std::time::Duration::from_millis(20),
            stop,
            || async { Cleanup::Remove },
        )
        .await
    });
    assert!(eventually(|| h.opts.bin_dir.join("istio-cni").exists()).await);
    stop_tx.send(()).expect("stop");
    task.await.expect("join").expect("keep_installed");
    assert_eq!(
        read(&h, "10-flannel.conflist"),
        flannel(),
        "the original, exactly"
    );
    assert!(!h.opts.bin_dir.join("istio-cni").exists());
}
