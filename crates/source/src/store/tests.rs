use std::path::{Path, PathBuf};

use mesh_api::{Kind, ObjectKey};

use super::*;
use crate::parse::parse_file;

fn pod(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n  containers: []\n---\n"
    )
}

fn load(path: &str, text: &str) -> Change {
    Change::Loaded(PathBuf::from(path), parse_file(Path::new(path), text))
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Pod, "default", name)
}

/// Events as short strings: `applied Pod/default/a`, `deleted ...`, `invalid <reason>`.
fn summary(events: &[SourceEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            SourceEvent::Applied(o) => format!("applied {}", o.key()),
            SourceEvent::Deleted(k) => format!("deleted {k}"),
            SourceEvent::Synced => "synced".into(),
            SourceEvent::Invalid(err) => format!("invalid {}", err.reason()),
        })
        .collect()
}

#[test]
fn diff_emits_only_changed_objects() {
    let mut store = Store::default();
    let first = store.apply(vec![load("a.yaml", &(pod("x", "n1") + &pod("y", "n1")))]);
    assert_eq!(
        summary(&first),
        ["applied Pod/default/x", "applied Pod/default/y"]
    );
    let second = store.apply(vec![load("a.yaml", &(pod("x", "n2") + &pod("y", "n1")))]);
    assert_eq!(summary(&second), ["applied Pod/default/x"]);
    let third = store.apply(vec![load("a.yaml", &pod("x", "n2"))]);
    assert_eq!(summary(&third), ["deleted Pod/default/y"]);
    let same = store.apply(vec![load("a.yaml", &pod("x", "n2"))]);
    assert!(same.is_empty());
    let gone = store.apply(vec![Change::Removed("a.yaml".into())]);
    assert_eq!(summary(&gone), ["deleted Pod/default/x"]);
    assert!(store.tracked_under(Path::new("")).is_empty());
}

#[test]
fn rename_within_one_batch_emits_nothing() {
    let mut store = Store::default();
    store.apply(vec![load("a.yaml", &pod("x", "n1"))]);
    let events = store.apply(vec![
        load("b.yaml", &pod("x", "n1")),
        Change::Removed("a.yaml".into()),
    ]);
    assert!(events.is_empty(), "{:?}", summary(&events));
    assert_eq!(
        store.tracked_under(Path::new("")),
        [PathBuf::from("b.yaml")]
    );
}

#[test]
fn first_file_wins_until_it_goes_away() {
    let mut store = Store::default();
    store.apply(vec![load("a.yaml", &pod("x", "n1"))]);
    let dup = store.apply(vec![load("b.yaml", &pod("x", "n2"))]);
    assert_eq!(summary(&dup), ["invalid duplicate"]);
    let SourceEvent::Invalid(err) = &dup[0] else {
        panic!("not invalid")
    };
    let shown = err.to_string();
    assert!(
        shown.starts_with("b.yaml:1: Pod default/x: also defined in a.yaml:1"),
        "{shown}"
    );
    // Editing the winner does not repeat the report.
    let edit = store.apply(vec![load("a.yaml", &pod("x", "n3"))]);
    assert_eq!(summary(&edit), ["applied Pod/default/x"]);
    let takeover = store.apply(vec![Change::Removed("a.yaml".into())]);
    assert_eq!(summary(&takeover), ["applied Pod/default/x"]);
    let SourceEvent::Applied(obj) = &takeover[0] else {
        panic!("not applied")
    };
    let mesh_api::Object::Pod(p) = &**obj else {
        panic!("not a pod")
    };
    assert_eq!(
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("n2")
    );
    let objects = store.objects();
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0].0, PathBuf::from("b.yaml"));
}

#[test]
fn duplicate_within_one_file_keeps_the_first() {
    let mut store = Store::default();
    let events = store.apply(vec![load("a.yaml", &(pod("x", "n1") + &pod("x", "n2")))]);
    assert_eq!(
        summary(&events),
        ["invalid duplicate", "applied Pod/default/x"]
    );
    let SourceEvent::Invalid(err) = &events[0] else {
        panic!("not invalid")
    };
    assert_eq!(err.line, Some(9));
}

#[test]
fn invalid_document_keeps_its_previous_version() {
    let mut store = Store::default();
    store.apply(vec![load("a.yaml", &(pod("x", "n1") + &pod("y", "n1")))]);
    let broken = pod("x", "[1]") + &pod("y", "n2");
    let events = store.apply(vec![load("a.yaml", &broken)]);
    assert_eq!(
        summary(&events),
        ["invalid invalid_field", "applied Pod/default/y"]
    );
    assert_eq!(store.objects().len(), 2);
    // Fixing it applies the new version.
    let fixed = store.apply(vec![load("a.yaml", &(pod("x", "n3") + &pod("y", "n2")))]);
    assert_eq!(summary(&fixed), ["applied Pod/default/x"]);
    assert!(store.winner(&key("x")).is_some());
}

#[test]
fn unreadable_file_keeps_everything() {
    let mut store = Store::default();
    store.apply(vec![load("a.yaml", &(pod("x", "n1") + &pod("y", "n1")))]);
    let events = store.apply(vec![load("a.yaml", "kind: [oops\n")]);
    assert_eq!(summary(&events), ["invalid syntax"]);
    assert_eq!(store.objects().len(), 2);
}
