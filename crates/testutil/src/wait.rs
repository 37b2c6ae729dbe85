//! Waiting in tests for something another task or process makes true.

use std::time::{Duration, Instant};

/// How often a condition is checked.
const POLL: Duration = Duration::from_millis(50);

/// Polls `f` until it holds or `within` has passed; whether it held.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() >= within {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The same with an asynchronous condition (one that has to ask a server).
pub async fn eventually_async<F>(within: Duration, mut f: impl FnMut() -> F) -> bool
where
    F: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return true;
        }
        if start.elapsed() >= within {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The blocking form for tests that run on plain threads: polls `f` every `poll` until it
/// holds or `within` has passed, then checks once more; whether it held.
pub fn eventually_blocking(within: Duration, poll: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if f() {
            return true;
        }
        std::thread::sleep(poll);
    }
    f()
}
