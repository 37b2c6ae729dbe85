//! Threads of their own, at a lower CPU priority, for the CA's signing work.
//!
//! Parsing and verifying a CSR and signing its certificate take CPU time. A storm of them
//! (every ztunnel restarting, a node pool scaled up) must not delay pushes: on the runtime's
//! threads, or on tokio's blocking pool (whose threads compete with the runtime's as equals),
//! 1,000 concurrent signings hold a change back from every proxy for as long as they run. The
//! pool's threads run at a higher nice value, so the kernel gives the runtime's threads (xDS
//! pushes, the CA's own I/O) the CPU first and signing takes what is left; when nothing else
//! runs, signing gets all of it.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

/// How much lower the signing threads' priority is (a nice value; the runtime's threads keep
/// the process's own, normally 0). At +10 the scheduler gives a busy runtime thread about ten
/// times the CPU of a busy signing thread.
pub const SIGNING_NICE: i32 = 10;

/// Queued signings beyond those running. A caller past this waits for room (its call is not
/// refused): the bound only keeps the queue's memory in check.
const QUEUE: usize = 4096;

type Job = Box<dyn FnOnce() + Send>;

/// Why a job gave no result.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The pool's threads are gone; only seen during shutdown.
    #[error("the CA's signing threads have stopped")]
    Stopped,
    /// The job panicked (its thread carries on with the next one).
    #[error("a CA signing job panicked")]
    Panicked,
}

/// A fixed set of low-priority threads that run closures and hand back their results.
#[derive(Debug, Clone)]
pub struct SigningPool {
    tx: mpsc::Sender<Job>,
}

impl SigningPool {
    /// Starts `threads` threads (at least one) at nice value `nice` above the process's. A
    /// priority that cannot be lowered (a seccomp profile, say) is logged and the threads run
    /// at the process's own.
    pub fn start(threads: usize, nice: i32) -> std::io::Result<SigningPool> {
        let (tx, rx) = mpsc::channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("ca-signer-{i}"))
                .spawn(move || {
                    lower_priority(nice);
                    while let Some(job) = next(&rx) {
                        // The caller sees the panic as a dropped answer; the thread lives on.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })?;
        }
        Ok(SigningPool { tx })
    }

    /// Runs `f` on one of the pool's threads and returns its result.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolError> {
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            // A caller that gave up (its call timed out or was cancelled) costs no signing.
            if !done.is_closed() {
                let _ = done.send(f());
            }
        });
        self.tx.send(job).await.map_err(|_| PoolError::Stopped)?;
        result.await.map_err(|_| PoolError::Panicked)
    }
}

/// The next job; `None` once every [`SigningPool`] handle is dropped.
fn next(rx: &Mutex<mpsc::Receiver<Job>>) -> Option<Job> {
    // A thread that panicked inside a job never holds the lock (jobs run after it is
    // released), so a poisoned lock still guards a sound receiver.
    let mut rx = rx.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    rx.blocking_recv()
}

/// Raises this thread's nice value by `nice` (on Linux a thread's priority is its own).
fn lower_priority(nice: i32) {
    let tid = rustix::thread::gettid();
    let current = match rustix::process::getpriority_process(Some(tid)) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "CA signing thread: cannot read its priority");
            return;
        }
    };
    if let Err(e) = rustix::process::setpriority_process(Some(tid), current + nice) {
        tracing::warn!(error = %e, nice, "CA signing thread: cannot lower its priority; it runs at the process's");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_on_lower_priority_threads() {
        let pool = SigningPool::start(2, SIGNING_NICE).expect("pool");
        let process = rustix::process::getpriority_process(None).expect("priority");
        let (name, nice) = pool
            .run(|| {
                let tid = rustix::thread::gettid();
                (
                    std::thread::current().name().map(str::to_string),
                    rustix::process::getpriority_process(Some(tid)).expect("priority"),
                )
            })
            .await
            .expect("ran");
        assert!(name.is_some_and(|n| n.starts_with("ca-signer-")));
        assert_eq!(nice, (process + SIGNING_NICE).min(19));
    }

    #[tokio::test]
    async fn many_concurrent_jobs_all_answer() {
        let pool = SigningPool::start(2, SIGNING_NICE).expect("pool");
        let calls = (0..QUEUE * 2).map(|i| {
            let pool = pool.clone();
            async move { pool.run(move || i * 2).await }
        });
        let results = futures::future::join_all(calls).await;
        for (i, r) in results.into_iter().enumerate() {
            assert_eq!(r.expect("answered"), i * 2);
        }
    }

    #[tokio::test]
    async fn a_panicking_job_leaves_the_pool_working() {
        let pool = SigningPool::start(1, 0).expect("pool");
        let failed = pool.run(|| -> u32 { panic!("job fails") }).await;
        assert!(matches!(failed, Err(PoolError::Panicked)), "{failed:?}");
        // The pool's only thread carries on.
        assert_eq!(pool.run(|| 1).await.expect("answered"), 1);
    }
}
