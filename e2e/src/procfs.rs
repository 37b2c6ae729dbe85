//! What `/proc` says about the processes of a test: open file descriptors, the network
//! namespaces they pin, and the open-files limit.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// Open file descriptors of `pid` (`/proc/<pid>/fd`), `None` when it is gone.
pub fn fd_count(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// The namespaces `pid` holds open as file descriptors (inode numbers of the fds on nsfs),
/// e.g. the pod netns fds ztunnel received over ZDS. The link text of such an fd is the path it
/// was opened by (`/run/netns/<name>`) or `net:[<inode>]`, so the fds are told by their device.
pub fn netns_fds(pid: u32) -> BTreeSet<u64> {
    let Some(nsfs) = std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.dev()) else {
        return BTreeSet::new();
    };
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .filter(|m| m.dev() == nsfs)
        .map(|m| m.ino())
        .collect()
}

/// The network namespaces the threads of `pid` are in (inodes of `/proc/<pid>/task/*/ns/net`):
/// a thread left in a deleted pod's netns keeps that netns alive.
pub fn thread_netns(pid: u32) -> BTreeSet<u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return BTreeSet::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::metadata(t.path().join("ns/net")).ok())
        .map(|m| m.ino())
        .collect()
}

/// The inode of a network namespace file (`/var/run/netns/<name>`), as [`netns_fds`] shows it.
pub fn netns_inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// This process's `RLIMIT_NOFILE` as (soft, hard); `None` for "unlimited" or unreadable.
pub fn nofile_limit() -> (Option<u64>, Option<u64>) {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let mut fields = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .unwrap_or_default()
        .split_whitespace();
    let soft = fields.next().and_then(|v| v.parse().ok());
    let hard = fields.next().and_then(|v| v.parse().ok());
    (soft, hard)
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (with util-linux `prlimit`,
/// so no unsafe code here); the processes started afterwards inherit it. Returns the soft
/// limit now in force (`u64::MAX` for unlimited).
pub fn raise_nofile_limit() -> u64 {
    if let (_, Some(hard)) = nofile_limit() {
        let status = Command::new("prlimit")
            .arg(format!("--pid={}", std::process::id()))
            .arg(format!("--nofile={hard}:{hard}"))
            .status();
        assert!(
            status.as_ref().is_ok_and(|s| s.success()),
            "prlimit --nofile={hard}:{hard} failed ({status:?}); is util-linux installed?"
        );
    }
    nofile_limit().0.unwrap_or(u64::MAX)
}

/// The child processes of `pid` (from every thread's `children` list).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}
