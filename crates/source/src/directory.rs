//! [`DirectorySource`]: cluster state from a directory of Kubernetes YAML, watched with inotify
//! (through `notify`) or, when that is unavailable, polled.
//!
//! Filesystem events are coalesced until the directory has been quiet for
//! [`DirectoryOptions::debounce`]; then only the changed paths are read again (a changed
//! directory is read in full, which picks up new subdirectories and whatever they already hold).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::scan::{self, Scan, Stamp};
use crate::store::{Change, Store};
use crate::{ClusterSource, SourceEvent, SourceFuture};

/// How a [`DirectorySource`] watches.
#[derive(Debug, Clone)]
pub struct DirectoryOptions {
    /// Quiet time after the last filesystem event before files are read again.
    pub debounce: Duration,
    /// Longest time events are coalesced while the directory keeps changing.
    pub max_delay: Duration,
    /// Interval between scans when polling.
    pub poll_interval: Duration,
    /// Poll instead of watching (for filesystems where inotify sees no changes, e.g. NFS).
    pub poll: bool,
}

impl Default for DirectoryOptions {
    fn default() -> Self {
        DirectoryOptions {
            debounce: Duration::from_millis(20),
            max_delay: Duration::from_secs(1),
            poll_interval: Duration::from_secs(1),
            poll: false,
        }
    }
}

/// Reads every manifest under a directory, then follows its changes.
#[derive(Debug, Clone)]
pub struct DirectorySource {
    root: PathBuf,
    options: DirectoryOptions,
}

impl DirectorySource {
    /// A source for the directory `root` (which may not exist yet: it is then polled for).
    pub fn new(root: impl Into<PathBuf>, options: DirectoryOptions) -> Self {
        DirectorySource {
            root: root.into(),
            options,
        }
    }
}

impl ClusterSource for DirectorySource {
    fn run(self: Box<Self>, tx: mpsc::Sender<SourceEvent>) -> SourceFuture {
        Box::pin(async move {
            let store = Store::new(&self.root);
            let mut runner = Runner {
                root: self.root,
                options: self.options,
                store,
                tx,
            };
            runner.run().await;
        })
    }
}

/// The receiver is gone: stop.
struct Closed;

type FsEvent = notify::Result<notify::Event>;

struct Runner {
    root: PathBuf,
    options: DirectoryOptions,
    store: Store,
    tx: mpsc::Sender<SourceEvent>,
}

impl Runner {
    async fn run(&mut self) {
        let (fs_tx, fs_rx) = mpsc::unbounded_channel();
        // Watch (or stamp) before the first scan so no change falls between the two.
        let watcher = if self.options.poll {
            Err("polling was requested".to_string())
        } else {
            start_watcher(&self.root, fs_tx)
        };
        let stamps = match &watcher {
            Ok(_) => BTreeMap::new(),
            Err(_) => self.stamps().await,
        };
        if let Some(err) = scan::missing_root(&self.root) {
            if self.send(SourceEvent::Invalid(err)).await.is_err() {
                return;
            }
        }
        let root = self.root.clone();
        if self.sync(vec![root]).await.is_err() || self.send(SourceEvent::Synced).await.is_err() {
            return;
        }
        info!(root = %self.root.display(), "initial directory scan complete");
        let _ = match watcher {
            Ok(watcher) => self.watch(watcher, fs_rx).await,
            Err(reason) => {
                warn!(root = %self.root.display(), %reason,
                    interval = ?self.options.poll_interval, "not watching the directory: polling it instead");
                self.poll(stamps).await
            }
        };
        debug!(root = %self.root.display(), "directory source stopped: receiver dropped");
    }

    /// Follows filesystem events until the receiver is dropped.
    async fn watch(
        &mut self,
        watcher: notify::RecommendedWatcher,
        mut fs_rx: mpsc::UnboundedReceiver<FsEvent>,
    ) -> Result<(), Closed> {
        let _watcher = watcher;
        loop {
            let first = tokio::select! {
                _ = self.tx.closed() => return Err(Closed),
                event = fs_rx.recv() => event,
            };
            let Some(first) = first else {
                warn!("directory watcher stopped: polling instead");
                let stamps = self.stamps().await;
                return self.poll(stamps).await;
            };
            let mut batch = Batch::default();
            batch.add(&self.root, first);
            let deadline = Instant::now() + self.options.max_delay;
            // Wait for quiet, and for files being written to be closed (bounded by max_delay).
            while Instant::now() < deadline {
                match tokio::time::timeout(self.options.debounce, fs_rx.recv()).await {
                    Ok(Some(event)) => batch.add(&self.root, event),
                    Err(_) if !batch.writing.is_empty() => {}
                    Ok(None) | Err(_) => break,
                }
            }
            let prefixes = batch.into_prefixes(&self.root);
            if !prefixes.is_empty() {
                self.sync(prefixes).await?;
            }
        }
    }

    /// Compares file stamps every interval until the receiver is dropped.
    async fn poll(&mut self, mut last: BTreeMap<PathBuf, Stamp>) -> Result<(), Closed> {
        loop {
            tokio::select! {
                _ = self.tx.closed() => return Err(Closed),
                _ = tokio::time::sleep(self.options.poll_interval) => {}
            }
            let now = self.stamps().await;
            let mut changed: Vec<PathBuf> = now
                .iter()
                .filter(|(path, stamp)| last.get(*path) != Some(stamp))
                .map(|(path, _)| path.clone())
                .collect();
            changed.extend(last.keys().filter(|p| !now.contains_key(*p)).cloned());
            last = now;
            if !changed.is_empty() {
                self.sync(changed).await?;
            }
        }
    }

    async fn stamps(&self) -> BTreeMap<PathBuf, Stamp> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || scan::stamps(&root))
            .await
            .unwrap_or_default()
    }

    /// Reads `prefixes` again (off the async threads) and sends the resulting events.
    async fn sync(&mut self, prefixes: Vec<PathBuf>) -> Result<(), Closed> {
        let root = self.root.clone();
        let scans = match tokio::task::spawn_blocking(move || scan::scan_all(&root, prefixes)).await
        {
            Ok(scans) => scans,
            Err(e) => {
                warn!(error = %e, "directory scan task failed; will retry on the next change");
                return Ok(());
            }
        };
        let mut events = Vec::new();
        let mut changes = Vec::new();
        for scan in scans {
            let Scan {
                prefix,
                found,
                errors,
            } = scan;
            events.extend(errors.into_iter().map(SourceEvent::Invalid));
            for gone in self.store.tracked_under(&prefix) {
                if !found.iter().any(|(path, _)| *path == gone) {
                    changes.push(Change::Removed(gone));
                }
            }
            changes.extend(
                found
                    .into_iter()
                    .map(|(p, parsed)| Change::Loaded(p, parsed)),
            );
        }
        events.extend(self.store.apply(changes));
        for event in events {
            self.send(event).await?;
        }
        Ok(())
    }

    async fn send(&self, event: SourceEvent) -> Result<(), Closed> {
        if let SourceEvent::Invalid(err) = &event {
            warn!(reason = err.reason(), "{err}");
        }
        self.tx.send(event).await.map_err(|_| Closed)
    }
}

fn start_watcher(
    root: &Path,
    fs_tx: mpsc::UnboundedSender<FsEvent>,
) -> Result<notify::RecommendedWatcher, String> {
    let mut watcher = notify::recommended_watcher(move |event: FsEvent| {
        let _ = fs_tx.send(event);
    })
    .map_err(|e| e.to_string())?;
    watcher
        .watch(root, RecursiveMode::Recursive)
        .map_err(|e| e.to_string())?;
    Ok(watcher)
}

/// Paths touched by a burst of filesystem events.
#[derive(Debug, Default)]
struct Batch {
    paths: BTreeSet<PathBuf>,
    /// Files created or modified in place and not closed yet: reading them now could see half
    /// a write.
    writing: BTreeSet<PathBuf>,
    rescan: bool,
}

impl Batch {
    fn add(&mut self, root: &Path, event: FsEvent) {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                warn!(error = %e, "directory watcher error: reading the whole directory again");
                self.rescan = true;
                return;
            }
        };
        if event.need_rescan() {
            self.rescan = true;
        }
        let finished = match event.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
            EventKind::Access(_) => return,
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_)) => true,
            _ => false,
        };
        let opened = matches!(
            event.kind,
            EventKind::Create(CreateKind::File) | EventKind::Modify(ModifyKind::Data(_))
        );
        for path in event.paths {
            if !scan::is_hidden(root, &path) {
                if opened {
                    self.writing.insert(path.clone());
                } else if finished {
                    self.writing.remove(&path);
                }
                self.paths.insert(path);
            } else if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".."))
            {
                // Kubernetes volumes (ConfigMap, Secret) swap a hidden `..data` symlink.
                self.rescan = true;
            }
        }
    }

    fn into_prefixes(self, root: &Path) -> Vec<PathBuf> {
        if self.rescan {
            vec![root.to_path_buf()]
        } else {
            self.paths.into_iter().collect()
        }
    }
}
