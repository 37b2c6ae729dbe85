//! Entering a pod's network namespace: the calling thread enters it with `setns(2)`, does the
//! work and goes back into the namespace it came from ([`Inside`], which ztunnel also uses for
//! its in-pod sockets: two syscalls, where a thread per pod cost a thread's creation and
//! teardown on every enrollment). The way back runs even when the work panics; a thread that cannot get back
//! aborts the process, so no pooled (tokio or rayon) thread is ever left inside a pod. Sockets
//! the work opens (netlink included) and the `/proc/sys/net` it reads belong to the pod's
//! namespace, wherever they are used later.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
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
    #[error("cannot note this thread's own network namespace before entering {path}: {source}; is /proc mounted?")]
    Home {
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
            EnterError::Home { .. } => "home_netns",
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
            | EnterError::Home { path, .. } => path,
        }
    }
}

/// Runs `f` in the network namespace at `path` on the calling thread and returns what it
/// returned; a panic in `f` is propagated (after the thread is back in its own namespace).
/// Nothing runs when `path` cannot be opened or is not a network namespace.
pub fn run_in<R, F>(path: &Path, f: F) -> Result<R, EnterError>
where
    F: FnOnce() -> R,
{
    let file = File::open(path).map_err(|source| EnterError::Open {
        path: path.to_owned(),
        source,
    })?;
    // Where this thread is now, to come back to (opened before leaving it).
    let home = File::open("/proc/thread-self/ns/net").map_err(|source| EnterError::Home {
        path: path.to_owned(),
        source,
    })?;
    let _back = Inside::enter(&file, home).map_err(|errno| {
        let (path, source) = (path.to_owned(), errno.into());
        match errno {
            // EINVAL: the file is not a namespace (or not a network one).
            nix::errno::Errno::EPERM => EnterError::Setns { path, source },
            _ => EnterError::NotNetns { path, source },
        }
    })?;
    Ok(f())
}

/// While alive, the calling thread is inside another network namespace; dropping it (also
/// while a panic unwinds) puts the thread back into `home`. A thread that cannot get back
/// aborts the process: whatever it ran next would run inside the other namespace.
pub struct Inside<H: AsFd> {
    home: H,
}

impl<H: AsFd> Inside<H> {
    /// Moves the calling thread into `netns`, to come back to `home` when dropped. `EINVAL`:
    /// `netns` is not a network namespace; `EPERM`: no CAP_SYS_ADMIN.
    pub fn enter(netns: impl AsFd, home: H) -> nix::Result<Self> {
        nix::sched::setns(netns, CloneFlags::CLONE_NEWNET)?;
        Ok(Inside { home })
    }
}

impl<H: AsFd> Drop for Inside<H> {
    fn drop(&mut self) {
        if let Err(errno) = nix::sched::setns(&self.home, CloneFlags::CLONE_NEWNET) {
            tracing::error!(error = %errno, "cannot return to the thread's own network namespace; aborting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

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

    fn netns_inode(path: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).expect("netns").ino()
    }

    #[test]
    fn the_thread_goes_back_to_its_own_namespace_after_the_work_and_after_a_panic() {
        // A namespace of our own: a helper thread unshares one and hands over its fd.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let made = nix::sched::unshare(CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)
                .and_then(|()| File::open("/proc/thread-self/ns/net"));
            let _ = tx.send(made);
        });
        let other = match rx.recv().expect("helper thread") {
            Ok(file) => file,
            Err(error) if std::env::var_os("CI").is_none() => {
                eprintln!("skipped: cannot make a network namespace, not root ({error})");
                return;
            }
            Err(error) => panic!("cannot make a network namespace: {error}"),
        };
        let path = PathBuf::from(format!("/proc/self/fd/{}", other.as_raw_fd()));
        let own = netns_inode("/proc/thread-self/ns/net");
        let inside = run_in(&path, || netns_inode("/proc/thread-self/ns/net")).expect("enter");
        assert_eq!(inside, netns_inode(&path.display().to_string()));
        assert_ne!(inside, own);
        assert_eq!(netns_inode("/proc/thread-self/ns/net"), own, "back home");

        let panicked = std::panic::catch_unwind(|| run_in(&path, || panic!("work failed")));
        assert!(panicked.is_err(), "the panic is propagated");
        assert_eq!(
            netns_inode("/proc/thread-self/ns/net"),
            own,
            "back home after a panic"
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
