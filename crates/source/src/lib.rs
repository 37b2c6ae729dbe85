//! Cluster state for istiod (and the CNI node agent) behind one trait, [`ClusterSource`].
//!
//! A source emits [`SourceEvent`]s: every object once (`Applied`), then `Synced`, then changes.
//! [`DirectorySource`] reads a directory of Kubernetes YAML/JSON and watches it; [`KubeSource`]
//! watches the Kubernetes API (one `kube` runtime watcher per kind). Bad input never drops valid state: a malformed file
//! keeps what was loaded from it, an invalid document keeps its earlier version, and a key
//! defined twice keeps the first definition. Each problem is reported as
//! [`SourceEvent::Invalid`] with the file, line and object it is about.
//!
//! ```no_run
//! use mesh_source::{ClusterSource, DirectoryOptions, DirectorySource, SourceEvent};
//!
//! # async fn demo() {
//! let source: Box<dyn ClusterSource> =
//!     Box::new(DirectorySource::new("/etc/mesh/config", DirectoryOptions::default()));
//! let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
//! tokio::spawn(source.run(tx));
//! while let Some(event) = rx.recv().await {
//!     match event {
//!         SourceEvent::Applied(object) => println!("applied {}", object.key()),
//!         SourceEvent::Deleted(key) => println!("deleted {key}"),
//!         SourceEvent::Synced => println!("initial state complete"),
//!         SourceEvent::Invalid(err) => eprintln!("{err}"),
//!     }
//! }
//! # }
//! ```

mod directory;
mod error;
mod kube_source;
mod kube_writer;
mod parse;
mod scan;
mod store;
mod writer;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use std::sync::Arc;

use mesh_api::{Object, ObjectKey};

pub use directory::{DirectoryOptions, DirectorySource};
pub use error::{Problem, SourceError};
pub use kube_source::{plural, KubeOptions, KubeSource, KubeSourceStats};
pub use kube_writer::KubeWriter;
pub use scan::STATUS_DIR;
pub use writer::{DirectoryWriter, ObjectWriter, WriteError};

/// One change of cluster state.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "each event is moved once through a channel; unboxed variants keep consumers' matches plain"
)]
pub enum SourceEvent {
    /// An object was added or changed (unchanged objects are never re-sent).
    Applied(Arc<Object>),
    /// An object is gone.
    Deleted(ObjectKey),
    /// The initial listing is complete; sent once, after the initial `Applied` events.
    Synced,
    /// A problem in the input; the state is untouched by it.
    Invalid(SourceError),
}

/// The future a source runs as; spawn it on any Tokio runtime.
pub type SourceFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A producer of cluster state.
pub trait ClusterSource: Send + 'static {
    /// Returns a future that emits the current state on `tx`, then [`SourceEvent::Synced`],
    /// then every change. It completes when the receiver of `tx` is dropped. The caller decides
    /// where it runs: `tokio::spawn(source.run(tx))`. Blocking file I/O runs on Tokio's blocking
    /// pool, so the future suits a current-thread runtime.
    fn run(self: Box<Self>, tx: tokio::sync::mpsc::Sender<SourceEvent>) -> SourceFuture;
}

/// Parses one manifest file's text (YAML documents, or JSON) as the directory source does:
/// the objects it holds and an error for every document that is not a valid object (`path`
/// only names the file in errors).
pub fn parse_manifest(path: &Path, text: &str) -> (Vec<Arc<Object>>, Vec<SourceError>) {
    let parsed = parse::parse_file(path, text);
    (
        parsed
            .objects
            .into_iter()
            .map(|loaded| loaded.object)
            .collect(),
        parsed.errors,
    )
}

/// Reads every manifest under `path` once, synchronously (for `istioctl analyze`, tests and
/// benchmarks). Returns the objects with their files, in path and then line order, and every
/// problem found; the rules are the watcher's (a key defined twice keeps the first file's
/// definition, by path order).
pub fn load_directory(path: impl AsRef<Path>) -> (Vec<(PathBuf, Arc<Object>)>, Vec<SourceError>) {
    let root = path.as_ref();
    let scan = scan::scan(root, root);
    let mut errors = scan.errors;
    let mut store = store::Store::new(root);
    let changes = scan
        .found
        .into_iter()
        .map(|(path, parsed)| store::Change::Loaded(path, parsed))
        .collect();
    for event in store.apply(changes) {
        if let SourceEvent::Invalid(err) = event {
            errors.push(err);
        }
    }
    errors.extend(scan::missing_root(root));
    (store.objects(), errors)
}
