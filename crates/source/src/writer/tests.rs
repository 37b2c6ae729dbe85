use std::time::Duration;

use mesh_api::{Kind, Object, ObjectKey};
use serde_json::json;

use super::*;
use crate::{load_directory, ClusterSource, DirectoryOptions, DirectorySource, SourceEvent};

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: waypoint\n  namespace: demo\nspec:\n  gatewayClassName: istio-waypoint\n";

fn gateway_key() -> ObjectKey {
    ObjectKey::new(Kind::Gateway, "demo", "waypoint")
}

fn addresses(objects: &[(PathBuf, std::sync::Arc<Object>)]) -> Vec<String> {
    objects
        .iter()
        .find_map(|(_, o)| match &**o {
            Object::Gateway(g) => Some(g.status.clone().unwrap_or_default()),
            _ => None,
        })
        .map(|s| s.addresses.into_iter().map(|a| a.value).collect())
        .unwrap_or_default()
}

#[test]
fn owned_objects_are_read_back_and_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let writer = DirectoryWriter::new(dir.path(), "controller");
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "waypoint", "namespace": "demo"}});
    writer.apply(&sa).expect("apply");
    let (objects, errors) = load_directory(dir.path());
    assert!(errors.is_empty(), "{errors:?}");
    let keys: Vec<ObjectKey> = objects.iter().map(|(_, o)| o.key()).collect();
    assert_eq!(
        keys,
        [ObjectKey::new(Kind::ServiceAccount, "demo", "waypoint")]
    );
    writer.delete(&keys[0]).expect("delete");
    writer.delete(&keys[0]).expect("deleting twice is fine");
    assert!(load_directory(dir.path()).0.is_empty());
}

#[test]
fn an_object_the_mesh_cannot_read_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let writer = DirectoryWriter::new(dir.path(), "controller");
    let err = writer
        .apply(&json!({"apiVersion": "v9", "kind": "Thing", "metadata": {"name": "x"}}))
        .expect_err("unknown kind");
    assert!(err.to_string().contains("Thing"), "{err}");
    assert!(load_directory(dir.path()).0.is_empty());
}

#[test]
fn status_overlays_the_object_defined_elsewhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("gw.yaml"), GATEWAY).expect("write");
    let writer = DirectoryWriter::new(dir.path(), "controller");
    let status = json!({"addresses": [{"type": "IPAddress", "value": "10.96.0.20"}]});
    writer
        .write_status(&gateway_key(), Some(&status))
        .expect("status");
    // Status for an object that does not exist is kept but applies to nothing.
    writer
        .write_status(
            &ObjectKey::new(Kind::Gateway, "demo", "gone"),
            Some(&status),
        )
        .expect("status");
    let (objects, errors) = load_directory(dir.path());
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(addresses(&objects), ["10.96.0.20"]);
    // The user's file is untouched.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("gw.yaml")).expect("read"),
        GATEWAY
    );
    writer.write_status(&gateway_key(), None).expect("clear");
    assert!(addresses(&load_directory(dir.path()).0).is_empty());
}

#[tokio::test]
async fn a_watcher_sees_status_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("gw.yaml"), GATEWAY).expect("write");
    let source = DirectorySource::new(dir.path(), DirectoryOptions::default());
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(Box::new(source).run(tx));
    loop {
        match rx.recv().await.expect("event") {
            SourceEvent::Synced => break,
            SourceEvent::Invalid(e) => panic!("{e}"),
            _ => {}
        }
    }
    let writer = DirectoryWriter::new(dir.path(), "controller");
    let status =
        json!({"addresses": [{"type": "Hostname", "value": "waypoint.demo.svc.cluster.local"}]});
    writer
        .write_status(&gateway_key(), Some(&status))
        .expect("status");
    let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event within 10 s")
        .expect("event");
    match event {
        SourceEvent::Applied(o) => match &*o {
            Object::Gateway(g) => assert_eq!(
                g.status.as_ref().map(|s| s.addresses.len()),
                Some(1),
                "{g:?}"
            ),
            other => panic!("unexpected object {other:?}"),
        },
        other => panic!("unexpected event {other:?}"),
    }
}
