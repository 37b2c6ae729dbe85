//! Tasks tied to the lifetime of whoever started them.

/// Aborts the task when dropped: a helper task that must not outlive its owner.
#[derive(Debug)]
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
