use std::collections::HashSet;

use super::procscan::{find_pod_netns, pod_uid_from_cgroup};
use super::*;

fn record(name: &str, redirection: Option<Redirection>) -> PodRecord {
    PodRecord {
        uid: format!("uid-{name}"),
        namespace: "ns".to_string(),
        name: name.to_string(),
        service_account: "sa".to_string(),
        netns: PathBuf::from(format!("/var/run/netns/{name}")),
        netns_inode: None,
        ips: vec!["10.1.0.5".parse().expect("ip")],
        dns_capture: true,
        bypass_inbound: false,
        redirection,
        redirector: redirection.map(|_| "nftables".to_string()),
    }
}

#[test]
fn missing_file_is_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = StateStore::new(dir.path().join("not-yet"));
    assert_eq!(store.load().expect("load"), Vec::new());
}

#[test]
fn save_then_load_round_trips_and_leaves_no_temp_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = StateStore::new(dir.path().join("state"));
    let pods = vec![
        record("a", Some(Redirection::Enabled)),
        record("b", Some(Redirection::Pending)),
        record("c", None),
    ];
    store.save(&pods).expect("save");
    assert_eq!(store.load().expect("load"), pods);
    let names: Vec<String> = std::fs::read_dir(dir.path().join("state"))
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![STATE_FILE.to_string()]);
    let text = std::fs::read_to_string(store.path()).expect("read");
    assert!(text.contains(r#""redirection": "enabled""#), "{text}");
    assert!(text.contains(r#""netns": "/var/run/netns/a""#), "{text}");
}

#[test]
fn bad_file_and_version_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = StateStore::new(dir.path());
    std::fs::write(store.path(), "{not json").expect("write");
    let err = store.load().expect_err("bad json");
    assert_eq!(err.reason(), "parse");
    assert!(err.to_string().contains("move it away"), "{err}");
    std::fs::write(store.path(), r#"{"version":7,"pods":[]}"#).expect("write");
    assert_eq!(store.load().expect_err("version").reason(), "version");
}

#[test]
fn pod_uid_from_cgroup_layouts() {
    let cases = [
        ("0::/kubepods/burstable/pod2c48913c-b29f-11e7-9350-020968147796/9bca8d63d5fa", Some("2c48913c-b29f-11e7-9350-020968147796")),
        ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c48913c_b29f_11e7_9350_020968147796.slice/cri-containerd-9bca.scope", Some("2c48913c-b29f-11e7-9350-020968147796")),
        ("12:memory:/docker/8d46/kubepods/besteffort/poddaa5c7ee-3484-4533-af39-3591564fd03e/aff3", Some("daa5c7ee-3484-4533-af39-3591564fd03e")),
        ("0::/user.slice/user-0.slice/session-1.scope", None),
        ("0::/system.slice/podman.service", None),
        ("garbage", None),
    ];
    for (cgroup, want) in cases {
        assert_eq!(
            pod_uid_from_cgroup(cgroup).as_deref(),
            want,
            "cgroup {cgroup}"
        );
    }
}

#[test]
fn find_pod_netns_picks_the_oldest_process_of_wanted_pods() {
    let proc = tempfile::tempdir().expect("tempdir");
    let uid = "2c48913c-b29f-11e7-9350-020968147796";
    let other = "daa5c7ee-3484-4533-af39-3591564fd03e";
    // (pid, pod uid in cgroup, starttime)
    for (pid, pod, start) in [("10", uid, 500), ("11", uid, 100), ("12", other, 50)] {
        let dir = proc.path().join(pid);
        std::fs::create_dir_all(dir.join("ns")).expect("mkdir");
        std::fs::write(dir.join("ns/net"), "").expect("netns");
        std::fs::write(
            dir.join("cgroup"),
            format!("0::/kubepods/besteffort/pod{pod}/abc\n"),
        )
        .expect("cgroup");
        let fields: Vec<String> = (0..18).map(|i| i.to_string()).collect();
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (app) S {} {start} 0\n", fields.join(" ")),
        )
        .expect("stat");
    }
    let wanted: HashSet<String> = [uid.to_string()].into();
    let found = find_pod_netns(proc.path(), &wanted);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[uid], proc.path().join("11/ns/net"));
}

#[test]
fn status_table_lists_every_pod() {
    let table = render_table(&[record("a", Some(Redirection::Enabled)), record("b", None)]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("NAMESPACE  NAME  UID    IPS       REDIRECTION  REDIRECTOR  NETNS"),
        "{table}"
    );
    assert!(
        lines[1].contains("enabled") && lines[1].contains("nftables"),
        "{table}"
    );
    assert!(
        lines[2].contains(" - ") && !lines[2].contains("enabled"),
        "{table}"
    );
}

#[test]
fn a_netns_path_that_names_another_namespace_now_is_not_the_pods() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("netns");
    std::fs::write(&path, "").expect("file");
    let mut r = record("a", None);
    r.netns = path.clone();
    r.netns_inode = netns_inode(&path);
    assert!(netns_still_the_pods(&r));
    // The same path, another inode: a reused pid's /proc/<pid>/ns/net.
    let other = dir.path().join("other");
    std::fs::write(&other, "").expect("another file");
    std::fs::rename(&other, &path).expect("now the path names it");
    assert_ne!(netns_inode(&path), r.netns_inode);
    assert!(!netns_still_the_pods(&r));
    // Records written before inodes were kept are judged by the path alone.
    r.netns_inode = None;
    assert!(netns_still_the_pods(&r));
    std::fs::remove_file(&path).expect("remove");
    assert!(!netns_still_the_pods(&r));
}
