//! DirectorySource against real directories and real inotify (and polling).
//!
//! Waits are generous (up to 5 s per event) but nothing asserts on timing: "no event" is proven
//! by writing a marker object afterwards and checking that the marker is the next event.

use std::fs;
use std::path::Path;
use std::time::Duration;

use mesh_api::{Kind, Object, ObjectKey};
use mesh_source::{
    load_directory, ClusterSource, DirectoryOptions, DirectorySource, SourceError, SourceEvent,
};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(5);

fn pod(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: ns\nspec:\n  nodeName: {node}\n  containers: []\n"
    )
}

fn namespace(name: &str) -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n")
}

fn pod_key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Pod, "ns", name)
}

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create dirs");
    }
    fs::write(path, text).expect("write file");
}

struct Watched {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    rx: mpsc::Receiver<SourceEvent>,
    task: tokio::task::JoinHandle<()>,
    markers: usize,
}

impl Watched {
    /// Starts a source on a directory prepared by `setup`; returns it with the initial events
    /// (everything before `Synced`).
    async fn start(
        setup: impl FnOnce(&Path),
        options: DirectoryOptions,
    ) -> (Self, Vec<SourceEvent>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("config");
        fs::create_dir(&root).expect("mkdir");
        setup(&root);
        let source: Box<dyn ClusterSource> = Box::new(DirectorySource::new(&root, options));
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(source.run(tx));
        let mut watched = Watched {
            _dir: dir,
            root,
            rx,
            task,
            markers: 0,
        };
        let mut initial = Vec::new();
        loop {
            match watched.next().await {
                SourceEvent::Synced => break,
                event => initial.push(event),
            }
        }
        (watched, initial)
    }

    async fn next(&mut self) -> SourceEvent {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("no source event within 5 s")
            .expect("source stopped")
    }

    async fn applied(&mut self) -> Object {
        match self.next().await {
            SourceEvent::Applied(object) => Object::clone(&object),
            other => panic!("expected Applied, got {other:?}"),
        }
    }

    async fn deleted(&mut self) -> ObjectKey {
        match self.next().await {
            SourceEvent::Deleted(key) => key,
            other => panic!("expected Deleted, got {other:?}"),
        }
    }

    async fn invalid(&mut self) -> SourceError {
        match self.next().await {
            SourceEvent::Invalid(err) => err,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    /// Writes a new object and checks that it is the next event: nothing came before it.
    async fn expect_nothing_pending(&mut self) {
        self.markers += 1;
        let name = format!("marker-{}", self.markers);
        write(&self.root, &format!("{name}.yaml"), &namespace(&name));
        let object = self.applied().await;
        assert_eq!(object.key(), ObjectKey::new(Kind::Namespace, "", name));
    }
}

fn node_of(object: &Object) -> Option<String> {
    match object {
        Object::Pod(p) => p.spec.as_ref().and_then(|s| s.node_name.clone()),
        _ => None,
    }
}

fn applied_keys(events: &[SourceEvent]) -> Vec<String> {
    let mut keys: Vec<String> = events
        .iter()
        .map(|e| match e {
            SourceEvent::Applied(o) => o.key().to_string(),
            other => panic!("unexpected initial event {other:?}"),
        })
        .collect();
    keys.sort();
    keys
}

fn fast() -> DirectoryOptions {
    DirectoryOptions::default()
}

#[tokio::test]
async fn initial_scan_reads_nested_multi_document_and_list_files() {
    let (_w, initial) = Watched::start(
        |root| {
            write(
                root,
                "a.yaml",
                &format!("{}---\n{}", pod("a1", "n"), pod("a2", "n")),
            );
            write(root, "sub/deeper/b.yml", &namespace("b"));
            write(
                root,
                "c.json",
                r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "c"}}"#,
            );
            let list = format!(
                "apiVersion: v1\nkind: List\nitems:\n- {}\n- {}\n",
                r#"{apiVersion: v1, kind: Namespace, metadata: {name: l1}}"#,
                r#"{apiVersion: v1, kind: Namespace, metadata: {name: l2}}"#
            );
            write(root, "list.yaml", &list);
            write(root, "empty.yaml", "---\n# nothing\n---\n");
            write(root, ".hidden/x.yaml", &namespace("hidden1"));
            write(root, ".x.yaml", &namespace("hidden2"));
            write(root, "backup.yaml~", &namespace("backup"));
            write(root, ".a.yaml.swp", "binary");
            write(root, "notes.txt", "not yaml: [");
        },
        fast(),
    )
    .await;
    assert_eq!(
        applied_keys(&initial),
        [
            "Namespace/b",
            "Namespace/c",
            "Namespace/l1",
            "Namespace/l2",
            "Pod/ns/a1",
            "Pod/ns/a2"
        ]
    );
}

#[tokio::test]
async fn editing_one_object_emits_exactly_one_applied() {
    let both = |n2: &str| format!("{}---\n{}", pod("x", "n1"), pod("y", n2));
    let (mut w, initial) = Watched::start(|root| write(root, "a.yaml", &both("n1")), fast()).await;
    assert_eq!(initial.len(), 2);
    write(&w.root, "a.yaml", &both("n2"));
    let object = w.applied().await;
    assert_eq!(object.key(), pod_key("y"));
    assert_eq!(node_of(&object).as_deref(), Some("n2"));
    w.expect_nothing_pending().await;
}

#[tokio::test]
async fn removing_a_document_emits_deleted() {
    let (mut w, _) = Watched::start(
        |root| {
            write(
                root,
                "a.yaml",
                &format!("{}---\n{}", pod("x", "n"), pod("y", "n")),
            )
        },
        fast(),
    )
    .await;
    write(&w.root, "a.yaml", &pod("x", "n"));
    assert_eq!(w.deleted().await, pod_key("y"));
    w.expect_nothing_pending().await;
}

#[tokio::test]
async fn deleting_or_renaming_away_a_file_deletes_its_objects() {
    let (mut w, _) = Watched::start(
        |root| {
            write(
                root,
                "a.yaml",
                &format!("{}---\n{}", pod("x", "n"), pod("y", "n")),
            );
            write(root, "b.yaml", &pod("z", "n"));
        },
        fast(),
    )
    .await;
    fs::remove_file(w.root.join("a.yaml")).expect("remove");
    let mut gone = vec![w.deleted().await, w.deleted().await];
    gone.sort();
    assert_eq!(gone, [pod_key("x"), pod_key("y")]);
    fs::rename(w.root.join("b.yaml"), w.root.join("b.yaml.bak")).expect("rename");
    assert_eq!(w.deleted().await, pod_key("z"));
    w.expect_nothing_pending().await;
}

#[tokio::test]
async fn atomic_write_by_rename_applies() {
    let (mut w, _) = Watched::start(|root| write(root, "a.yaml", &pod("x", "n1")), fast()).await;
    // Replace an existing file the way editors and kubectl-like tools do.
    write(&w.root, ".a.yaml.tmp", &pod("x", "n2"));
    fs::rename(w.root.join(".a.yaml.tmp"), w.root.join("a.yaml")).expect("rename");
    let object = w.applied().await;
    assert_eq!(node_of(&object).as_deref(), Some("n2"));
    // And create a new file the same way.
    write(&w.root, ".new.tmp", &pod("y", "n1"));
    fs::rename(w.root.join(".new.tmp"), w.root.join("b.yaml")).expect("rename");
    assert_eq!(w.applied().await.key(), pod_key("y"));
    w.expect_nothing_pending().await;
}

#[tokio::test]
async fn malformed_yaml_keeps_objects_and_reports_the_line() {
    let (mut w, _) = Watched::start(
        |root| {
            write(
                root,
                "a.yaml",
                &format!("{}---\n{}", pod("x", "n"), pod("y", "n")),
            )
        },
        fast(),
    )
    .await;
    write(
        &w.root,
        "a.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [x\n",
    );
    let err = w.invalid().await;
    assert_eq!(err.reason(), "syntax");
    assert!(err.file.ends_with("a.yaml"));
    assert!(err.line.is_some_and(|l| l >= 4), "{err}");
    assert!(err.to_string().contains("a.yaml:"), "{err}");
    // No Deleted: the marker is next. Fixing the file then applies only the change.
    w.expect_nothing_pending().await;
    write(
        &w.root,
        "a.yaml",
        &format!("{}---\n{}", pod("x", "n"), pod("y", "n2")),
    );
    assert_eq!(w.applied().await.key(), pod_key("y"));
    w.expect_nothing_pending().await;
}

#[tokio::test]
async fn one_invalid_document_among_valid_ones() {
    let (mut w, _) = Watched::start(
        |root| {
            write(
                root,
                "a.yaml",
                &format!("{}---\n{}", pod("x", "n"), pod("y", "n")),
            )
        },
        fast(),
    )
    .await;
    let text = format!(
        "{}---\n{}---\n{}",
        pod("x", "[1, 2]"),
        pod("y", "n2"),
        pod("z", "n")
    );
    write(&w.root, "a.yaml", &text);
    let err = w.invalid().await;
    assert_eq!(err.key, Some(pod_key("x")));
    assert_eq!(err.document, Some(1));
    assert_eq!(err.line, Some(7));
    assert_eq!(err.field_path(), Some("spec.nodeName"));
    assert!(
        err.to_string()
            .contains("a.yaml:7 (document 1): Pod ns/x: invalid field spec.nodeName"),
        "{err}"
    );
    let mut applied = vec![w.applied().await.key(), w.applied().await.key()];
    applied.sort();
    assert_eq!(applied, [pod_key("y"), pod_key("z")]);
    // x keeps its earlier version: no Deleted for it.
    w.expect_nothing_pending().await;
}

#[tokio::test]
async fn duplicate_key_across_files_keeps_the_first_until_it_goes() {
    let (mut w, _) = Watched::start(|root| write(root, "a.yaml", &pod("x", "n1")), fast()).await;
    write(&w.root, "b.yaml", &pod("x", "n2"));
    let err = w.invalid().await;
    assert_eq!(err.reason(), "duplicate");
    let shown = err.to_string();
    assert!(
        shown.contains("b.yaml:1: Pod ns/x: also defined in "),
        "{shown}"
    );
    assert!(shown.contains("a.yaml:1"), "{shown}");
    w.expect_nothing_pending().await;
    fs::remove_file(w.root.join("a.yaml")).expect("remove");
    let object = w.applied().await;
    assert_eq!(node_of(&object).as_deref(), Some("n2"));
    w.expect_nothing_pending().await;
}

#[tokio::test]
async fn new_subdirectories_are_watched() {
    let (mut w, _) = Watched::start(|_| {}, fast()).await;
    write(&w.root, "new/deeper/a.yaml", &pod("x", "n1"));
    assert_eq!(w.applied().await.key(), pod_key("x"));
    // Files written later into the new directory are seen too.
    write(&w.root, "new/deeper/a.yaml", &pod("x", "n2"));
    assert_eq!(node_of(&w.applied().await).as_deref(), Some("n2"));
    // A directory moved in from elsewhere is read in full; moved out, its objects go.
    let outside = w.root.parent().expect("parent").join("staging");
    write(&outside, "b.yaml", &pod("y", "n1"));
    fs::rename(&outside, w.root.join("moved")).expect("move in");
    assert_eq!(w.applied().await.key(), pod_key("y"));
    fs::rename(w.root.join("moved"), &outside).expect("move out");
    assert_eq!(w.deleted().await, pod_key("y"));
    w.expect_nothing_pending().await;
}

#[tokio::test]
async fn unchanged_rewrite_emits_nothing() {
    let text = format!("{}---\n{}", pod("x", "n"), pod("y", "n"));
    let (mut w, _) = Watched::start(|root| write(root, "a.yaml", &text), fast()).await;
    write(&w.root, "a.yaml", &format!("# reformatted\n{text}"));
    w.expect_nothing_pending().await;
}

#[tokio::test]
async fn polling_follows_changes() {
    let options = DirectoryOptions {
        poll: true,
        poll_interval: Duration::from_millis(50),
        ..DirectoryOptions::default()
    };
    let (mut w, initial) =
        Watched::start(|root| write(root, "a.yaml", &pod("x", "n1")), options).await;
    assert_eq!(initial.len(), 1);
    write(&w.root, "sub/b.yaml", &pod("y", "n1"));
    assert_eq!(w.applied().await.key(), pod_key("y"));
    fs::remove_file(w.root.join("a.yaml")).expect("remove");
    assert_eq!(w.deleted().await, pod_key("x"));
}

#[tokio::test]
async fn missing_directory_is_reported_then_picked_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("later");
    let options = DirectoryOptions {
        poll_interval: Duration::from_millis(50),
        ..DirectoryOptions::default()
    };
    let source: Box<dyn ClusterSource> = Box::new(DirectorySource::new(&root, options));
    let (tx, mut rx) = mpsc::channel(8);
    tokio::spawn(source.run(tx));
    let first = tokio::time::timeout(WAIT, rx.recv()).await.expect("event");
    assert!(
        matches!(first, Some(SourceEvent::Invalid(ref e)) if e.reason() == "read"),
        "{first:?}"
    );
    let second = tokio::time::timeout(WAIT, rx.recv()).await.expect("event");
    assert!(matches!(second, Some(SourceEvent::Synced)), "{second:?}");
    write(&root, "a.yaml", &pod("x", "n"));
    let third = tokio::time::timeout(WAIT, rx.recv()).await.expect("event");
    assert!(
        matches!(third, Some(SourceEvent::Applied(ref o)) if o.key() == pod_key("x")),
        "{third:?}"
    );
}

#[tokio::test]
async fn dropping_the_receiver_stops_the_source() {
    let (w, _) = Watched::start(|root| write(root, "a.yaml", &pod("x", "n")), fast()).await;
    let Watched { rx, task, .. } = w;
    drop(rx);
    tokio::time::timeout(WAIT, task)
        .await
        .expect("source did not stop")
        .expect("source panicked");
}

#[test]
fn load_directory_reads_once_with_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(
        root,
        "a.yaml",
        &format!("{}---\n{}", pod("x", "n"), pod("y", "n")),
    );
    write(
        root,
        "b/c.yaml",
        &format!("{}---\n{}", pod("x", "other"), namespace("ns")),
    );
    write(root, "bad.yaml", "kind: [\n");
    let (objects, errors) = load_directory(root);
    let keys: Vec<String> = objects.iter().map(|(_, o)| o.key().to_string()).collect();
    assert_eq!(keys, ["Pod/ns/x", "Pod/ns/y", "Namespace/ns"]);
    assert!(objects[0].0.ends_with("a.yaml"));
    let mut reasons: Vec<&str> = errors.iter().map(SourceError::reason).collect();
    reasons.sort();
    assert_eq!(reasons, ["duplicate", "syntax"]);
}
