use std::collections::BTreeSet;
use std::path::Path;

use mesh_api::{GatewayStatus, Kind, Object, ObjectKey};
use mesh_source::{load_directory, DirectoryWriter, SourceEvent};
use serde_json::json;

use super::*;

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: waypoint\n  namespace: shop\n  uid: 5f0e\nspec:\n  gatewayClassName: istio-waypoint\n  listeners:\n  - name: mesh\n    port: 15008\n    protocol: HBONE\n";

/// A controller fed from a directory the way the watcher feeds it.
struct Harness {
    dir: tempfile::TempDir,
    controller: Controller<DirectoryWriter>,
    seen: BTreeSet<ObjectKey>,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let writer = DirectoryWriter::new(dir.path(), "waypoint-controller");
        let opts = ControllerOptions {
            service_cidr: Some("10.96.0.0/16".parse().expect("cidr")),
            ..ControllerOptions::default()
        };
        Harness {
            dir,
            controller: Controller::new(writer, opts),
            seen: BTreeSet::new(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.path().join(file), text).expect("write");
    }

    /// Feeds the directory's current state, then reconciles (twice: what the first pass
    /// wrote is read back as the watcher would deliver it).
    async fn reconcile(&mut self) -> Report {
        let report = self.pass().await;
        let second = self.pass().await;
        Report {
            applied: [report.applied, second.applied].concat(),
            deleted: [report.deleted, second.deleted].concat(),
            statuses: [report.statuses, second.statuses].concat(),
            skipped: second.skipped,
            errors: report.errors.into_iter().chain(second.errors).collect(),
        }
    }

    async fn pass(&mut self) -> Report {
        let (objects, errors) = load_directory(self.path());
        assert!(errors.is_empty(), "{errors:?}");
        let now: BTreeSet<ObjectKey> = objects.iter().map(|(_, o)| o.key()).collect();
        for gone in self.seen.difference(&now) {
            self.controller.observe(SourceEvent::Deleted(gone.clone()));
        }
        for (_, o) in objects {
            self.controller.observe(SourceEvent::Applied(o));
        }
        self.controller.observe(SourceEvent::Synced);
        self.seen = now;
        self.controller.reconcile("2026-12-01T12:00:00Z").await
    }

    fn object(&self, kind: Kind, name: &str) -> Option<Object> {
        let key = ObjectKey::new(kind, "shop", name);
        load_directory(self.path())
            .0
            .into_iter()
            .find(|(_, o)| o.key() == key)
            .map(|(_, o)| (*o).clone())
    }

    fn status(&self) -> GatewayStatus {
        match self.object(Kind::Gateway, "waypoint") {
            Some(Object::Gateway(g)) => g.status.unwrap_or_default(),
            other => panic!("no gateway: {other:?}"),
        }
    }

    fn set_ready(&self, ready: i32) {
        let writer = DirectoryWriter::new(self.path(), "kubelet");
        let key = ObjectKey::new(Kind::Deployment, "shop", "waypoint");
        let status = json!({"replicas": 1, "readyReplicas": ready, "availableReplicas": ready});
        writer.write_status(&key, Some(&status)).expect("status");
    }
}

fn condition<'a>(s: &'a GatewayStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
    let c = (s.conditions.iter())
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {s:?}"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn labels(o: &Object) -> std::collections::BTreeMap<String, String> {
    o.metadata().labels.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_waypoint_gateway_becomes_its_objects_and_is_programmed_once_ready() {
    let mut h = Harness::new();
    h.write("gw.yaml", GATEWAY);
    let report = h.reconcile().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let sa = h
        .object(Kind::ServiceAccount, "waypoint")
        .expect("ServiceAccount");
    let dep = h.object(Kind::Deployment, "waypoint").expect("Deployment");
    let svc = h.object(Kind::Service, "waypoint").expect("Service");
    for o in [&sa, &dep, &svc] {
        let l = labels(o);
        assert_eq!(l["gateway.networking.k8s.io/gateway-name"], "waypoint");
        assert_eq!(
            l["gateway.networking.k8s.io/gateway-class-name"],
            "istio-waypoint"
        );
        assert_eq!(l["gateway.istio.io/managed"], "istio.io-mesh-controller");
        let owner = &o.metadata().owner_references.clone().unwrap_or_default()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Gateway", "waypoint", "5f0e")
        );
    }
    let Object::Deployment(d) = &dep else {
        panic!("not a Deployment")
    };
    let pod = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some("waypoint"));
    let c = &pod.containers[0];
    assert_eq!(c.name, "istio-proxy");
    assert_eq!(
        c.args.clone().unwrap_or_default()[..2],
        ["proxy".to_string(), "waypoint".to_string()]
    );
    let template_labels = d
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.clone())
        .and_then(|m| m.labels)
        .unwrap_or_default();
    assert_eq!(template_labels["istio.io/dataplane-mode"], "none");
    assert_eq!(template_labels["sidecar.istio.io/inject"], "false");
    let Object::Service(s) = &svc else {
        panic!("not a Service")
    };
    let spec = s.spec.clone().expect("spec");
    let ports: Vec<(String, i32, Option<String>)> = (spec.ports.unwrap_or_default().into_iter())
        .map(|p| (p.name.unwrap_or_default(), p.port, p.app_protocol))
        .collect();
    assert_eq!(
        ports,
        [
            ("status-port".to_string(), 15021, Some("tcp".to_string())),
            ("mesh".to_string(), 15008, Some("hbone".to_string())),
        ],
        "15020 is not a Service port"
    );
    let ip: std::net::Ipv4Addr = spec
        .cluster_ip
        .expect("a ClusterIP")
        .parse()
        .expect("an IPv4 ClusterIP");
    assert!("10.96.0.0/16"
        .parse::<Ipv4Net>()
        .expect("cidr")
        .contains(&ip));
    // Only these three: no HPA or PDB without an overlay.
    let files = std::fs::read_dir(h.path().join("waypoint-controller/shop"))
        .expect("dir")
        .count();
    assert_eq!(files, 3);

    let status = h.status();
    assert!(
        status.addresses.is_empty(),
        "no addresses before the pod is ready"
    );
    assert_eq!(condition(&status, "Accepted").0, "True");
    assert_eq!(condition(&status, "Programmed").0, "False");
    assert_eq!(condition(&status, "Programmed").1, "Pending");

    h.set_ready(1);
    h.reconcile().await;
    let status = h.status();
    let values: Vec<&str> = status.addresses.iter().map(|a| a.value.as_str()).collect();
    assert_eq!(
        values,
        [ip.to_string().as_str(), "waypoint.shop.svc.cluster.local"]
    );
    let (state, reason, message) = condition(&status, "Programmed");
    assert_eq!((state, reason), ("True", "Programmed"));
    assert!(
        message.contains("waypoint.shop.svc.cluster.local:15008"),
        "{message}"
    );

    // Readiness lost: Programmed goes false, addresses stay.
    h.set_ready(0);
    h.reconcile().await;
    let status = h.status();
    assert_eq!(condition(&status, "Programmed").0, "False");
    assert_eq!(status.addresses.len(), 2);
    // The ClusterIP is kept across passes.
    let Some(Object::Service(s)) = h.object(Kind::Service, "waypoint") else {
        panic!("Service gone")
    };
    assert_eq!(s.spec.and_then(|s| s.cluster_ip), Some(ip.to_string()));
}

#[tokio::test]
async fn an_unmanaged_object_is_never_touched_and_named_in_status() {
    let mut h = Harness::new();
    let mine = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: waypoint\n  namespace: shop\nspec:\n  selector:\n    matchLabels: {app: mine}\n  template:\n    metadata:\n      labels: {app: mine}\n    spec:\n      containers:\n      - name: app\n        image: mine\n";
    h.write("mine.yaml", mine);
    h.write("gw.yaml", GATEWAY);
    let report = h.reconcile().await;
    assert_eq!(
        report.skipped,
        [ObjectKey::new(Kind::Deployment, "shop", "waypoint")]
    );
    assert_eq!(
        std::fs::read_to_string(h.path().join("mine.yaml")).expect("read"),
        mine
    );
    assert!(!h
        .path()
        .join("waypoint-controller/shop/deployment-waypoint.yaml")
        .exists());
    let status = h.status();
    let (state, reason, message) = condition(&status, "Programmed");
    assert_eq!((state, reason), ("False", "Invalid"));
    assert!(message.contains("Deployment/shop/waypoint"), "{message}");
    assert!(status.addresses.is_empty());
}

#[tokio::test]
async fn objects_of_a_deleted_gateway_go_and_other_classes_are_ignored() {
    let mut h = Harness::new();
    h.write("gw.yaml", GATEWAY);
    h.reconcile().await;
    assert!(h.object(Kind::Deployment, "waypoint").is_some());
    std::fs::remove_file(h.path().join("gw.yaml")).expect("rm");
    let report = h.reconcile().await;
    assert_eq!(report.deleted.len(), 3, "{report:?}");
    assert!(h.object(Kind::Deployment, "waypoint").is_none());
    assert!(h.object(Kind::Service, "waypoint").is_none());
    assert!(
        !h.path().join(".status/gateway/shop/waypoint.yaml").exists(),
        "status cleared"
    );

    h.write("gw.yaml", &GATEWAY.replace("istio-waypoint", "istio"));
    let report = h.reconcile().await;
    assert!(
        report.applied.is_empty() && report.statuses.is_empty(),
        "{report:?}"
    );
}

#[tokio::test]
async fn overrides_rename_what_is_made() {
    let mut h = Harness::new();
    h.write(
        "gw.yaml",
        &GATEWAY.replace(
            "  uid: 5f0e\n",
            "  uid: 5f0e\n  annotations:\n    gateway.istio.io/name-override: wp\n    gateway.istio.io/service-account: wp-sa\n",
        ),
    );
    h.reconcile().await;
    assert!(h.object(Kind::Deployment, "wp").is_some());
    assert!(h.object(Kind::Service, "wp").is_some());
    assert!(h.object(Kind::ServiceAccount, "wp-sa").is_some());
}

#[tokio::test]
async fn allocation_is_stable_and_skips_used_addresses() {
    let cidr: Ipv4Net = "10.96.0.0/30".parse().expect("cidr");
    let mut used = BTreeSet::new();
    let first = allocate(cidr, "shop/waypoint", &used).expect("one free");
    assert_eq!(first, std::net::Ipv4Addr::new(10, 96, 0, 2));
    used.insert(first);
    assert_eq!(
        allocate(cidr, "shop/waypoint", &used),
        None,
        "/30 has one usable address"
    );
    let wide: Ipv4Net = "10.96.0.0/16".parse().expect("cidr");
    assert_eq!(
        allocate(wide, "a/b", &BTreeSet::new()),
        allocate(wide, "a/b", &BTreeSet::new())
    );
}

#[tokio::test]
async fn two_gateways_claiming_one_service_the_second_is_refused() {
    let mut h = Harness::new();
    h.write("gw.yaml", GATEWAY);
    let second = GATEWAY
        .replace("name: waypoint\n", "name: other\n")
        .replace(
            "  uid: 5f0e\n",
            "  uid: 7a1b\n  annotations:\n    gateway.istio.io/name-override: waypoint\n",
        );
    h.write("other.yaml", &second);
    let report = h.reconcile().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    // The Gateway first by key (shop/other) keeps the name; shop/waypoint is refused.
    let Some(Object::Service(s)) = h.object(Kind::Service, "waypoint") else {
        panic!("no Service")
    };
    let owner = s.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owner[0].name, "other");
    let status = h.status();
    let (state, reason, message) = condition(&status, "Programmed");
    assert_eq!((state, reason), ("False", "Invalid"));
    assert!(
        message.contains("already made for Gateway/shop/other"),
        "{message}"
    );
}
