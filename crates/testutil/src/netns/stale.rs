//! Ownership of topology prefixes (state files under [`STATE_DIR`]), and tearing topologies
//! down: kill the processes inside the namespaces, delete the namespaces, drop the claim.

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{cmd, NetnsError, NETNS_DIR};

/// Where each live topology records its owner and namespaces (`<prefix>` files).
pub const STATE_DIR: &str = "/run/mesh-testnet";

/// How long teardown waits for killed processes to leave the namespaces.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// A process identified across pid reuse: pid plus its start time (clock ticks since boot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Owner {
    pub pid: u32,
    pub start: u64,
}

impl Owner {
    pub fn current() -> Option<Owner> {
        let pid = std::process::id();
        Some(Owner {
            pid,
            start: start_time(pid)?,
        })
    }

    pub fn is_alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`.
fn start_time(pid: u32) -> Option<u64> {
    parse_start_time(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `starttime` from a `/proc/<pid>/stat` line (the command name may contain spaces and `)`).
pub(super) fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // After the comm come field 3 (state) .. field 22 (starttime).
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// The claim on one prefix: the file `<STATE_DIR>/<prefix>`.
#[derive(Debug)]
pub(super) struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// Claims `prefix` for `owner`, atomically (a complete temporary file hard-linked into
    /// place); `None` when it is already taken.
    pub fn claim(dir: &Path, prefix: &str, owner: Owner) -> Result<Option<StateFile>, NetnsError> {
        let state_error = |path: &Path| {
            let path = path.to_owned();
            move |source| NetnsError::State { path, source }
        };
        fs::create_dir_all(dir).map_err(state_error(dir))?;
        let path = dir.join(prefix);
        let tmp = dir.join(format!(".{prefix}.tmp{}", owner.pid));
        fs::write(&tmp, format!("owner {} {}\n", owner.pid, owner.start))
            .map_err(state_error(&tmp))?;
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(Some(StateFile { path })),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(state_error(&path)(e)),
        }
    }

    /// Records a namespace before it is created, so that a crash cannot leak it unrecorded.
    pub fn record_netns(&self, name: &str) -> Result<(), NetnsError> {
        let state_error = |source| NetnsError::State {
            path: self.path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(state_error)?;
        file.write_all(format!("netns {name}\n").as_bytes())
            .map_err(state_error)
    }

    pub fn remove(&self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// A parsed state file: its owner (if the owner line is intact) and recorded namespaces.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct State {
    pub owner: Option<Owner>,
    pub netns: Vec<String>,
}

pub(super) fn parse_state(text: &str) -> State {
    let mut state = State::default();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["owner", pid, start] => {
                if let (Ok(pid), Ok(start)) = (pid.parse(), start.parse()) {
                    state.owner = Some(Owner { pid, start });
                }
            }
            ["netns", name] => state.netns.push((*name).to_owned()),
            _ => {}
        }
    }
    state
}

/// The pid that names a temporary claim file `.<prefix>.tmp<pid>` ([`StateFile::claim`]).
pub(super) fn claim_in_progress_by(name: &str) -> Option<u32> {
    name.strip_prefix('.')?.rsplit_once(".tmp")?.1.parse().ok()
}

/// Tears down every topology in `dir` whose owner is gone; returns their prefixes.
pub(super) fn cleanup_stale_in(dir: &Path) -> Result<Vec<String>, NetnsError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(NetnsError::State {
                path: dir.to_owned(),
                source,
            })
        }
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with('.') {
            // A claim in progress, or an interrupted one (nothing was created under it). Its
            // content may be half written by a live claimant right now, so only the pid in its
            // name tells whether it is abandoned.
            if claim_in_progress_by(&name)
                .is_none_or(|pid| !Path::new(&format!("/proc/{pid}")).exists())
            {
                let _ = fs::remove_file(&path);
            }
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let state = parse_state(&text);
        if state.owner.is_some_and(|owner| owner.is_alive()) {
            continue;
        }
        tracing::info!(prefix = %name, owner = ?state.owner, "removing a stale test topology");
        teardown(&name, &state.netns)?;
        let _ = fs::remove_file(&path);
        removed.push(name);
    }
    Ok(removed)
}

/// Kills every process inside the namespaces of `prefix` (recorded ones and any named
/// `<prefix>-*`) and deletes them.
pub(super) fn teardown(prefix: &str, recorded: &[String]) -> Result<(), NetnsError> {
    let mut names: Vec<String> = recorded.to_vec();
    if let Ok(entries) = fs::read_dir(NETNS_DIR) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{prefix}-")) && !names.contains(&name) {
                names.push(name);
            }
        }
    }
    let existing: Vec<String> = names
        .into_iter()
        .filter(|name| Path::new(NETNS_DIR).join(name).exists())
        .collect();
    kill_processes_in(&existing);
    let lines: Vec<String> = existing
        .iter()
        .map(|name| format!("netns del {name}"))
        .collect();
    cmd::ip_batch(None, &lines)
}

/// SIGKILLs every process (other than this one) whose network namespace is one of `netns`
/// and waits up to [`KILL_WAIT`] for them to be gone.
fn kill_processes_in(netns: &[String]) {
    let ids: HashSet<(u64, u64)> = netns
        .iter()
        .filter_map(|name| fs::metadata(Path::new(NETNS_DIR).join(name)).ok())
        .map(|meta| (meta.dev(), meta.ino()))
        .collect();
    if ids.is_empty() {
        return;
    }
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let pids = pids_in(&ids);
        if pids.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            tracing::warn!(?pids, "processes in test namespaces survived SIGKILL");
            return;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Live (not zombie) processes whose main thread is in one of the namespaces `ids`
/// (device, inode), excluding this process.
pub(super) fn pids_in(ids: &HashSet<(u64, u64)>) -> Vec<i32> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            // Zombies have no namespaces any more: the stat fails.
            fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|meta| ids.contains(&(meta.dev(), meta.ino())))
        })
        .filter_map(|pid| i32::try_from(pid).ok())
        .collect()
}

/// The processes inside the namespace at `path`, for tests.
pub(super) fn pids_in_netns(path: &Path) -> Vec<i32> {
    match fs::metadata(path) {
        Ok(meta) => pids_in(&HashSet::from([(meta.dev(), meta.ino())])),
        Err(_) => Vec::new(),
    }
}
