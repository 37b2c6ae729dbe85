//! Entering a pod's network namespace: a fresh thread enters it with `setns(2)`, does the work
//! and ends, so no pooled (tokio or rayon) thread is ever left inside a pod. Sockets the work
//! opens (netlink included) and the `/proc/sys/net` it reads belong to that namespace, wherever
//! they are used later.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;

/// Why the namespace could not be entered (the work did not run).
#[derive(Debug, thiserror::Error)]
pub enum EnterError {
    #[error("cannot open the network namespace {path}: {source}; is the pod still running?")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a network namespace (setns: {source}); pass /var/run/netns/<name> or /proc/<pid>/ns/net")]
    NotNetns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot enter the network namespace {path} (setns: {source}); that needs CAP_SYS_ADMIN: run as root")]
    Setns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start a thread to enter the network namespace {path}: {source}; is the process out of threads or memory?")]
    Thread {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl EnterError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            EnterError::Open { .. } => "netns",
            EnterError::NotNetns { .. } => "not_netns",
            EnterError::Setns { .. } => "setns",
            EnterError::Thread { .. } => "thread",
        }
    }

    /// Whether the namespace does not exist (any more): its path is gone.
    pub fn is_gone(&self) -> bool {
        matches!(self, EnterError::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// The namespace the error is about.
    pub fn path(&self) -> &Path {
        match self {
            EnterError::Open { path, .. }
            | EnterError::NotNetns { path, .. }
            | EnterError::Setns { path, .. }
            | EnterError::Thread { path, .. } => path,
        }
    }
}

/// Runs `f` on a new thread that entered the network namespace at `path` and returns what it
/// returned; a panic in `f` is propagated. Nothing runs when `path` cannot be opened or is not
/// a network namespace.
pub fn run_in<R, F>(path: &Path, f: F) -> Result<R, EnterError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let file = File::open(path).map_err(|source| EnterError::Open {
        path: path.to_owned(),
        source,
    })?;
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("netns".to_owned())
            .spawn_scoped(scope, move || {
                nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|errno| {
                    let (path, source) = (path.to_owned(), errno.into());
                    match errno {
                        // EINVAL: the file is not a namespace (or not a network one).
                        nix::errno::Errno::EPERM => EnterError::Setns { path, source },
                        _ => EnterError::NotNetns { path, source },
                    }
                })?;
                Ok(f())
            })
            .map_err(|source| EnterError::Thread {
                path: path.to_owned(),
                source,
            })?;
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_namespace_is_gone_and_nothing_runs() {
        let path = Path::new("/proc/self/ns/no-such-namespace");
        let error = run_in(path, || panic!("must not run")).unwrap_err();
        assert!(error.is_gone(), "{error}");
        assert_eq!(error.path(), path);
        assert_eq!(error.reason(), "netns");
    }

    #[test]
    fn a_file_that_is_no_namespace_is_refused_before_the_work_runs() {
        let file = std::env::current_exe().expect("test binary");
        let error = run_in(&file, || panic!("must not run")).unwrap_err();
        assert!(matches!(error, EnterError::NotNetns { .. }), "{error}");
        assert!(!error.is_gone());
        assert!(
            error.to_string().contains("is not a network namespace"),
            "{error}"
        );
    }

    #[test]
    fn the_work_runs_in_the_namespace_and_its_result_comes_back() {
        // Our own namespace; setns needs CAP_SYS_ADMIN even for that. Without it the error
        // says so, and the test is skipped out loud (a failure in CI, where we are root).
        match run_in(Path::new("/proc/self/ns/net"), || 41 + 1) {
            Ok(value) => assert_eq!(value, 42),
            Err(error @ EnterError::Setns { .. }) if std::env::var_os("CI").is_none() => {
                assert!(error.to_string().contains("CAP_SYS_ADMIN"), "{error}");
                eprintln!("skipped: not root ({error})");
            }
            Err(error) => panic!("{error}"),
        }
    }
}
