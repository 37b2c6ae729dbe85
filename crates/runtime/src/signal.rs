//! Shutdown signals: SIGTERM and SIGINT become one broadcast every task can wait on.

use tokio::sync::watch;

/// A cloneable handle that resolves once shutdown has been requested.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// The trigger side of [`Shutdown`] (held by the signal task, or by tests).
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

/// Creates a trigger and its handle.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    /// Requests shutdown; every waiting [`Shutdown::wait`] returns.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }
}

impl Shutdown {
    /// Waits until shutdown is requested (returns at once if it already was).
    pub async fn wait(mut self) {
        // An error means the trigger is gone: treat as shutdown.
        let _ = self.rx.wait_for(|v| *v).await;
    }

    /// Whether shutdown has been requested.
    pub fn requested(&self) -> bool {
        *self.rx.borrow()
    }
}

/// Installs SIGTERM/SIGINT handlers that trigger shutdown, and returns the handle.
pub fn on_signals() -> std::io::Result<Shutdown> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (trigger, shutdown) = channel();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutdown requested; draining");
        trigger.trigger();
    });
    Ok(shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trigger_releases_waiters() {
        let (trigger, shutdown) = channel();
        let waiter = tokio::spawn(shutdown.clone().wait());
        assert!(!shutdown.requested());
        trigger.trigger();
        waiter.await.expect("waiter");
        assert!(shutdown.requested());
    }
}
