//! Which source objects a change touches, so that a rebuild is proportional to the change.

use std::collections::BTreeMap;

use mesh_api::{selector_matches, Kind, Object, ObjectKey};

use super::Model;
use crate::model::authz::workload_selector;
use crate::model::peer_auth::pa_selector;
use crate::model::service::{service_entry_selector, service_selector};
use crate::model::state::meta_labels;

type Labels = BTreeMap<String, String>;

/// What of a Gateway decides the waypoint binding: class, readiness, hostname, traffic type.
type Binding<'a> = (&'a str, bool, Option<&'a str>, Option<&'a String>);

fn waypoint_binding(o: Option<&Object>) -> Option<Binding<'_>> {
    match o {
        Some(Object::Gateway(g)) => Some((
            g.spec.gateway_class_name.as_str(),
            g.status.as_ref().is_some_and(|s| !s.addresses.is_empty()),
            crate::model::waypoints::status_hostname(g),
            g.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(mesh_api::label::WAYPOINT_FOR)),
        )),
        _ => None,
    }
}

/// Every object that may use a waypoint.
fn recompute_bindings(m: &Model, out: &mut Vec<ObjectKey>) {
    for kind in [
        Kind::Pod,
        Kind::WorkloadEntry,
        Kind::Service,
        Kind::ServiceEntry,
    ] {
        for ns in m.state.namespaces_with(kind) {
            out.extend(m.state.keys_in(kind, &ns));
        }
    }
}

/// Adds to `out` the objects to recompute because `key` changed from `old` to its current state.
pub(super) fn affected(m: &Model, key: &ObjectKey, old: Option<&Object>, out: &mut Vec<ObjectKey>) {
    let new = m.state.get(key);
    let ns = key.namespace.as_str();
    match key.kind {
        // Routes and request authentication change waypoint configuration only (see
        // `model::waypoints`); Sidecars change sidecars' only (`model::sidecars`).
        Kind::Pod
        | Kind::WorkloadEntry
        | Kind::HttpRoute
        | Kind::GrpcRoute
        | Kind::TcpRoute
        | Kind::VirtualService
        | Kind::DestinationRule
        | Kind::RequestAuthentication
        | Kind::Sidecar
        | Kind::IstioGateway
        | Kind::Secret => {}
        Kind::Deployment | Kind::ServiceAccount => {}
        // A Node's topology labels are its pods' locality; its status (heartbeats) is not read.
        Kind::Node => {
            let locality = |o: Option<&Object>| match o {
                Some(Object::Node(n)) => crate::model::workload::node_locality(n),
                _ => None,
            };
            if locality(old) != locality(new) {
                out.extend(
                    m.state
                        .pods
                        .iter()
                        .filter(|(_, facts)| facts.node.as_deref() == Some(key.name.as_str()))
                        .map(|((ns, name), _)| ObjectKey::new(Kind::Pod, ns.clone(), name.clone())),
                );
            }
        }
        // A class's traffic-type default: as a Gateway's change, for all of them (rare).
        Kind::GatewayClass => {
            if labels_of(old).and_then(|l| l.get(mesh_api::label::WAYPOINT_FOR))
                != labels_of(new).and_then(|l| l.get(mesh_api::label::WAYPOINT_FOR))
            {
                recompute_bindings(m, out);
            }
        }
        // Whether a Gateway is a usable waypoint (class, readiness, traffic type) decides
        // whether Services and workloads keep it: recompute them when that changes (rare).
        Kind::Gateway => {
            if waypoint_binding(old) != waypoint_binding(new) {
                recompute_bindings(m, out);
            }
        }
        Kind::Namespace => {
            if labels_of(old) != labels_of(new) {
                for kind in [
                    Kind::Pod,
                    Kind::WorkloadEntry,
                    Kind::Service,
                    Kind::ServiceEntry,
                ] {
                    out.extend(m.state.keys_in(kind, &key.name));
                }
            }
        }
        Kind::Service | Kind::ServiceEntry => {
            if service_deps(old) != service_deps(new) {
                let sels = [selector(old), selector(new)];
                workloads_matching(m, &[ns.to_string()], &sels, out);
            }
            if key.kind == Kind::Service {
                // Hand-made endpoints take their ports from the Service (and need it to exist).
                out.extend(
                    m.state
                        .objects_in(Kind::EndpointSlice, ns)
                        .filter(|o| match o {
                            Object::EndpointSlice(es) => {
                                crate::model::endpoint_slice::slice_service(es)
                                    == Some(key.name.as_str())
                            }
                            _ => false,
                        })
                        .map(Object::key),
                );
            }
        }
        Kind::EndpointSlice => {}
        Kind::AuthorizationPolicy => {
            if selector(old) != selector(new) {
                let sels = [selector(old), selector(new)];
                workloads_matching(m, &policy_namespaces(m, ns), &sels, out);
            }
        }
        Kind::PeerAuthentication => peer_auth_affected(m, key, old, new, out),
    }
}

/// A PeerAuthentication changes the static policy's presence, the workloads it selects (all of
/// its namespace, or of the mesh, without a selector) and, for namespace / mesh policies, the
/// converted workload policies that merge it.
fn peer_auth_affected(
    m: &Model,
    key: &ObjectKey,
    old: Option<&Object>,
    new: Option<&Object>,
    out: &mut Vec<ObjectKey>,
) {
    out.push(m.static_strict_key());
    if pa_spec(old) == pa_spec(new) {
        return;
    }
    let all = Labels::new();
    let sels = [selector(old), selector(new)];
    let namespaced = sels.iter().all(Option::is_none);
    let sels = if namespaced { [Some(&all), None] } else { sels };
    let namespaces = if namespaced {
        policy_namespaces(m, &key.namespace)
    } else {
        vec![key.namespace.clone()]
    };
    workloads_matching(m, &namespaces, &sels, out);
    if namespaced {
        for ns in &namespaces {
            out.extend(m.state.keys_in(Kind::PeerAuthentication, ns));
        }
    }
}

/// The namespaces whose workloads a policy in `ns` can select (all, for the root namespace).
fn policy_namespaces(m: &Model, ns: &str) -> Vec<String> {
    if ns != m.cfg.root_namespace {
        return vec![ns.to_string()];
    }
    let mut all = m.state.namespaces_with(Kind::Pod);
    all.extend(m.state.namespaces_with(Kind::WorkloadEntry));
    all.extend(m.state.namespaces_with(Kind::ServiceEntry));
    all.sort();
    all.dedup();
    all
}

/// Pods, WorkloadEntries and ServiceEntries (inline endpoints) in `namespaces` whose labels
/// one of `selectors` selects.
fn workloads_matching(
    m: &Model,
    namespaces: &[String],
    selectors: &[Option<&Labels>],
    out: &mut Vec<ObjectKey>,
) {
    let sels: Vec<&Labels> = selectors.iter().flatten().copied().collect();
    if sels.is_empty() {
        return;
    }
    for ns in namespaces {
        for kind in [Kind::Pod, Kind::WorkloadEntry] {
            for obj in m.state.objects_in(kind, ns) {
                let labels = workload_labels(obj);
                if sels.iter().any(|s| selector_matches(s, Some(labels))) {
                    out.push(obj.key());
                }
            }
        }
        // Inline endpoints carry their own labels; recompute the entry when any could match.
        for obj in m.state.objects_in(Kind::ServiceEntry, ns) {
            if let Object::ServiceEntry(se) = obj {
                let hit = se
                    .spec
                    .endpoints
                    .iter()
                    .any(|e| sels.iter().any(|s| selector_matches(s, Some(&e.labels))));
                if hit {
                    out.push(obj.key());
                }
            }
        }
    }
}

fn workload_labels(obj: &Object) -> &Labels {
    match obj {
        Object::WorkloadEntry(we) => &we.spec.labels,
        other => meta_labels(other.metadata()),
    }
}

fn labels_of(o: Option<&Object>) -> Option<&Labels> {
    o.and_then(|o| o.metadata().labels.as_ref())
}

/// The selector by which an object picks workloads.
fn selector(o: Option<&Object>) -> Option<&Labels> {
    match o? {
        Object::Service(s) => service_selector(s),
        Object::ServiceEntry(se) => service_entry_selector(se),
        Object::AuthorizationPolicy(p) => workload_selector(p),
        Object::PeerAuthentication(p) => pa_selector(p),
        _ => None,
    }
}

/// The parts of a Service / ServiceEntry that its selected workloads copy.
fn service_deps(o: Option<&Object>) -> Option<serde_json::Value> {
    match o? {
        Object::Service(s) => {
            let spec = s.spec.as_ref();
            Some(serde_json::json!([
                spec.and_then(|s| s.selector.clone()),
                spec.and_then(|s| s.ports.clone()),
            ]))
        }
        Object::ServiceEntry(se) => Some(serde_json::json!([
            se.spec.workload_selector,
            se.spec.ports,
            se.spec.hosts,
        ])),
        _ => None,
    }
}

fn pa_spec(o: Option<&Object>) -> Option<serde_json::Value> {
    match o? {
        Object::PeerAuthentication(p) => {
            Some(serde_json::json!([p.spec, p.metadata.creation_timestamp,]))
        }
        _ => None,
    }
}
