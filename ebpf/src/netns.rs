//! Running work on a thread inside another network namespace.

use std::fs::File;
use std::path::Path;

use nix::sched::CloneFlags;

use crate::CaptureError;

/// Runs `f` on a fresh thread that entered the network namespace at `path` (`setns(2)`); sockets
/// it opens (netlink included) and `/proc/sys/net` it reads belong to that namespace.
pub(crate) fn run_in<R, F>(path: &Path, f: F) -> Result<R, CaptureError>
where
    F: FnOnce() -> Result<R, CaptureError> + Send,
    R: Send,
{
    let file = File::open(path).map_err(|source| CaptureError::Netns {
        path: path.to_owned(),
        source,
    })?;
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("ebpf-netns".to_owned())
            .spawn_scoped(scope, move || {
                nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|errno| {
                    CaptureError::NotNetns {
                        path: path.to_owned(),
                        source: errno.into(),
                    }
                })?;
                f()
            })
            .map_err(CaptureError::Thread)?;
        match handle.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
