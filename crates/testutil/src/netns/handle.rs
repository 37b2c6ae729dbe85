//! A handle on a named network namespace (`/var/run/netns/<name>`): enter it on a thread, run
//! commands in it, spawn processes killed on drop.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output};

use super::{cmd, NetnsError};

/// Where `ip netns` keeps its namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";

/// A named network namespace. Cheap to clone; it does not own the namespace (the
/// [`TestNet`](super::TestNet) that created it does).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// A handle on the existing namespace `/var/run/netns/<name>`.
    pub fn from_name(name: impl Into<String>) -> Self {
        Netns { name: name.into() }
    }

    /// The `ip netns` name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/var/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// Deletes the namespace now (`ip netns del`), as when a pod's sandbox dies; its
    /// topology's teardown skips what is already gone.
    pub fn delete(&self) -> Result<(), NetnsError> {
        cmd::ip(None, &["netns", "del", &self.name]).map(|_| ())
    }

    /// Opens the namespace (e.g. to hand it over to ztunnel as a ZDS `AddWorkload` fd).
    pub fn open_fd(&self) -> Result<OwnedFd, NetnsError> {
        let path = self.path();
        File::open(&path)
            .map(OwnedFd::from)
            .map_err(|source| NetnsError::Open { path, source })
    }

    /// Runs `f` on a fresh thread that entered this namespace with `setns(2)` and returns its
    /// result; a panic in `f` is propagated. Sockets created by `f` stay in this namespace
    /// wherever they are used later. Only the network namespace is switched.
    pub fn run<F, R>(&self, f: F) -> Result<R, NetnsError>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        // A thread of its own: `f` may build a runtime or block, which the caller's thread (a
        // tokio worker, say) may not.
        let path = self.path();
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new()
                .name("netns".to_owned())
                .spawn_scoped(scope, || mesh_capture::netns::run_in(&path, f))
                .map_err(|source| NetnsError::Thread {
                    path: path.clone(),
                    source,
                })?;
            match thread.join() {
                Ok(result) => Ok(result?),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// `ip netns exec <name> <program> <args>`: the output whatever the exit status (check
    /// `output.status`); an error only when `ip` cannot be started.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<Output, NetnsError> {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.name, program])
            .args(args);
        cmd::run(&mut command, None)
    }

    /// Like [`Netns::exec`] but a non-zero status is an error; returns stdout.
    pub fn exec_ok(&self, program: &str, args: &[&str]) -> Result<String, NetnsError> {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.name, program])
            .args(args);
        let output = cmd::run_checked(&mut command, None)?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `nft list ruleset` in this namespace without counter values and comments (what
    /// golden files and comparisons between namespaces want).
    pub fn nft_ruleset(&self) -> Result<String, NetnsError> {
        let text = self.exec_ok("nft", &["list", "ruleset"])?;
        Ok(normalize_nft(&text))
    }

    /// `ip -n <name> <args>`, failing on a non-zero status; returns stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String, NetnsError> {
        cmd::ip(Some(&self.name), args)
    }

    /// Spawns `command` inside this namespace (from a thread that entered it, so the caller's
    /// environment, working directory and stdio settings are kept). The process is killed
    /// when the guard drops, and in any case when the owning `TestNet` drops.
    pub fn spawn(&self, command: &mut Command) -> Result<ChildGuard, NetnsError> {
        let program = command.get_program().to_string_lossy().into_owned();
        let child = self
            .run(|| command.spawn())?
            .map_err(|source| NetnsError::Spawn { program, source })?;
        Ok(ChildGuard {
            child,
            netns: self.name.clone(),
        })
    }

    /// Writes a sysctl of this namespace, e.g. `("net.ipv4.ip_forward", "1")`.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), NetnsError> {
        let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
        self.run(|| std::fs::write(&path, value))?
            .map_err(|source| NetnsError::Sysctl { path, source })
    }

    /// The processes (other than this one) whose main thread is in this namespace.
    pub fn pids(&self) -> Vec<i32> {
        super::stale::pids_in_netns(&self.path())
    }

    /// Reads a sysctl of this namespace, trimmed.
    pub fn sysctl_get(&self, key: &str) -> Result<String, NetnsError> {
        let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
        self.run(|| std::fs::read_to_string(&path))?
            .map(|value| value.trim().to_owned())
            .map_err(|source| NetnsError::Sysctl { path, source })
    }
}

/// A process started by [`Netns::spawn`]; killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    netns: String,
}

impl ChildGuard {
    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The namespace it was started in.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The child, e.g. to take its piped stdout.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether it has exited, without blocking.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // Already exited is fine: kill then fails and wait reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Drops `packets N bytes N` and `# ...` comments from `nft` output, keeping the layout.
fn normalize_nft(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let indent = &line[..line.len() - line.trim_start().len()];
        let mut words = Vec::new();
        let mut tokens = line.split_whitespace().peekable();
        while let Some(token) = tokens.next() {
            let numeric = tokens.peek().is_some_and(|n| n.parse::<u64>().is_ok());
            match token {
                "#" => break,
                "packets" | "bytes" if numeric => {
                    tokens.next();
                }
                _ => words.push(token),
            }
        }
        out.push_str(indent);
        out.push_str(&words.join(" "));
        out.push('\n');
    }
    out
}
