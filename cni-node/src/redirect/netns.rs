//! Running netlink work inside a pod's network namespace: a fresh thread enters it with
//! `setns(2)`, does the work and ends, so no pooled thread is ever left in a pod's netns.

use std::fs::File;
use std::io;
use std::path::Path;

use nix::sched::CloneFlags;

use super::RedirectError;

/// What entering `path` found.
#[derive(Debug)]
pub(super) enum Entered<R> {
    /// `f` ran inside the namespace and returned this.
    Ran(R),
    /// The namespace is gone (the path does not exist any more).
    Gone,
}

/// Runs `f` on a new thread that entered the network namespace at `path`. Nothing runs (and
/// the error names `path`) when `path` is not a network namespace.
pub(super) fn run_in<R, F>(path: &Path, f: F) -> Result<Entered<R>, RedirectError>
where
    F: FnOnce() -> Result<R, RedirectError> + Send,
    R: Send,
{
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Entered::Gone),
        Err(source) => {
            return Err(RedirectError::Netns {
                path: path.to_owned(),
                source,
            })
        }
    };
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("cni-netns".to_owned())
            .spawn_scoped(scope, move || {
                nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|errno| {
                    RedirectError::NotNetns {
                        path: path.to_owned(),
                        source: errno.into(),
                    }
                })?;
                f().map(Entered::Ran)
            })
            .map_err(|source| RedirectError::Thread {
                path: path.to_owned(),
                source,
            })?;
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
