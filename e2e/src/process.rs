//! Starting and stopping the harness's processes: output appended to a log file, SIGTERM and a
//! bounded wait for the exit.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesh_testutil::netns::ChildGuard;
use mesh_testutil::Netns;

/// Spawns `cmd` in `netns` with stdin closed and stdout/stderr appended to `log`.
pub fn spawn_logged(netns: &Netns, cmd: &mut Command, log: &Path) -> ChildGuard {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("log {}: {e}", log.display()));
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file);
    netns
        .spawn(cmd)
        .unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()))
}

/// Sends SIGTERM and waits up to `limit`; true if it exited with success (or was not running).
pub fn terminate(child: Option<ChildGuard>, limit: Duration) -> bool {
    let Some(mut child) = child else {
        return true;
    };
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(status)) = child.try_wait() {
            return status.success();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
