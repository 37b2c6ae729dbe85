//! Finding a running pod's network namespace by its UID, as istio-cni does at start
//! (is:cni/pkg/nodeagent/podcgroupns_linux.go): every process whose `/proc/<pid>/cgroup`
//! names `pod<uid>` (the kubelet's cgroup layout, cgroupfs or systemd) belongs to that pod,
//! and its `/proc/<pid>/ns/net` is the pod's netns. The oldest such process wins; the host's
//! own netns is never returned. Unlike upstream, the pod IPs are not checked inside the netns.
//!
//! Pods that are only network namespaces (the local e2e mode, no cgroups) are never found
//! here; they are known from their CNI ADD.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `uid -> /proc/<pid>/ns/net` for each of `uids` that has a process under `proc`.
pub fn find_pod_netns(proc: &Path, uids: &HashSet<String>) -> HashMap<String, PathBuf> {
    let mut found: HashMap<String, (u64, PathBuf)> = HashMap::new();
    if uids.is_empty() {
        return HashMap::new();
    }
    let host = std::fs::metadata(proc.join("self/ns/net"))
        .ok()
        .map(|m| (m.dev(), m.ino()));
    let Ok(entries) = std::fs::read_dir(proc) else {
        return HashMap::new();
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let dir = proc.join(pid);
        let Ok(cgroup) = std::fs::read_to_string(dir.join("cgroup")) else {
            continue;
        };
        let Some(uid) = pod_uid_from_cgroup(&cgroup).filter(|u| uids.contains(u)) else {
            continue;
        };
        let netns = dir.join("ns/net");
        let Ok(meta) = std::fs::metadata(&netns) else {
            continue;
        };
        if host == Some((meta.dev(), meta.ino())) {
            continue;
        }
        let start = start_time(&dir).unwrap_or(u64::MAX);
        match found.get(&uid) {
            Some((older, _)) if *older <= start => {}
            _ => {
                found.insert(uid, (start, netns));
            }
        }
    }
    found.into_iter().map(|(u, (_, p))| (u, p)).collect()
}

/// The pod UID in a `/proc/<pid>/cgroup` file, with `_` (systemd) turned into `-`.
pub fn pod_uid_from_cgroup(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let mut rest = path;
        while let Some(i) = rest.find("pod") {
            let before = rest[..i].chars().last();
            let candidate = &rest[i + 3..];
            if before.is_some_and(|c| c.is_ascii_punctuation()) {
                if let Some(uid) = parse_uid(candidate) {
                    return Some(uid);
                }
            }
            rest = candidate;
        }
        None
    })
}

/// A 36-character UID (8-4-4-4-12 hex, separated by `-` or `_`) at the start of `s`,
/// followed by punctuation or the end.
fn parse_uid(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    if bytes.len() < 36 {
        return None;
    }
    let mut uid = String::with_capacity(36);
    for (i, b) in bytes[..36].iter().enumerate() {
        match i {
            8 | 13 | 18 | 23 if *b == b'-' || *b == b'_' => uid.push('-'),
            8 | 13 | 18 | 23 => return None,
            _ if b.is_ascii_hexdigit() => uid.push(char::from(*b)),
            _ => return None,
        }
    }
    match bytes.get(36) {
        None => Some(uid),
        Some(b) if b.is_ascii_punctuation() => Some(uid),
        Some(_) => None,
    }
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`.
fn start_time(dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}
