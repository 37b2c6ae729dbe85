//! Which `Sidecar` resource is in force for a sidecar proxy, and the services it leaves the
//! proxy.
//!
//! As Istio picks: in the pod's namespace the oldest Sidecar whose `workloadSelector` matches
//! the pod's labels (a selector with no labels matches every pod), else the namespace's oldest
//! Sidecar without a selector, else the root namespace's oldest one without a selector (its
//! `.` then stands for the pod's namespace), else the default: every service, unknown
//! destinations as the mesh config says.

use std::collections::{BTreeMap, BTreeSet};

use mesh_api::{Kind, Object, Sidecar};

use super::state::State;
use super::ModelConfig;
use crate::envoy::sidecar::{SidecarError, SidecarScope};
use crate::envoy::{vs_resolve_host, BoundService};

/// The scope in force for a pod in `ns` with `labels`, and the parts of its Sidecar that could
/// not be applied.
pub(crate) fn for_workload(
    cfg: &ModelConfig,
    state: &State,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> (SidecarScope, Vec<SidecarError>) {
    let mut errors = Vec::new();
    let picked = pick(state, ns, labels).or_else(|| {
        (ns != cfg.root_namespace)
            .then(|| oldest(sidecars(state, &cfg.root_namespace).filter(|s| selector(s).is_none())))
            .flatten()
    });
    let scope = match picked {
        Some(sidecar) => {
            let from = format!(
                "{}/{}",
                sidecar.metadata.namespace.as_deref().unwrap_or(ns),
                sidecar.metadata.name.as_deref().unwrap_or_default()
            );
            SidecarScope::from_resource(sidecar, &from, ns, cfg.outbound_registry_only, &mut errors)
        }
        None => SidecarScope::default_for(ns, cfg.outbound_registry_only),
    };
    (scope, errors)
}

/// The namespace's Sidecar for a pod: the oldest selecting it, else the oldest without a
/// selector.
fn pick<'s>(state: &'s State, ns: &str, labels: &BTreeMap<String, String>) -> Option<&'s Sidecar> {
    let selecting = oldest(sidecars(state, ns).filter(|s| {
        selector(s).is_some_and(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
    }));
    selecting.or_else(|| oldest(sidecars(state, ns).filter(|s| selector(s).is_none())))
}

fn sidecars<'s>(state: &'s State, ns: &str) -> impl Iterator<Item = &'s Sidecar> {
    state.objects_in(Kind::Sidecar, ns).filter_map(|o| match o {
        Object::Sidecar(s) => Some(&**s),
        _ => None,
    })
}

fn selector(s: &Sidecar) -> Option<&BTreeMap<String, String>> {
    s.spec.workload_selector.as_ref().map(|w| &w.labels)
}

/// The oldest (creation time, then name), as Istio orders Sidecars.
fn oldest<'s>(it: impl Iterator<Item = &'s Sidecar>) -> Option<&'s Sidecar> {
    it.min_by(|a, b| {
        let key = |s: &'s Sidecar| {
            (
                s.metadata.creation_timestamp.clone(),
                s.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    })
}

/// `services` as `scope` leaves them: the ports it imports (a service without any is
/// dropped) and the VirtualServices whose namespace it imports for the host; then, as Istio
/// infers them, the services those VirtualServices route or mirror to (see
/// [`add_destinations`]). Sorted by hostname.
pub(crate) fn scoped(services: &[BoundService], scope: &SidecarScope) -> Vec<BoundService> {
    let mut out: Vec<BoundService> = services
        .iter()
        .filter_map(|svc| {
            let mut svc = svc.clone();
            svc.ports
                .retain(|p| scope.imports(&svc.namespace, &svc.hostname, p.port));
            (!svc.ports.is_empty()).then(|| visible_virtual_services(svc, scope))
        })
        .collect();
    add_destinations(services, scope, &mut out);
    out.sort_by(|a, b| a.hostname.cmp(&b.hostname));
    out
}

/// `svc` with only the VirtualServices `scope` imports for its host.
fn visible_virtual_services(mut svc: BoundService, scope: &SidecarScope) -> BoundService {
    svc.virtual_services.retain(|vs| {
        let vs_ns = vs.metadata.namespace.as_deref().unwrap_or("default");
        scope.imports_virtual_service(vs_ns, &svc.hostname)
    });
    svc
}

/// Adds to `out` the services that the VirtualServices an egress listener imports send
/// requests to (route destinations and mirrors), so that a Sidecar importing a VirtualService
/// does not also have to import its destinations, as in Istio: on a listener with a port,
/// that port of the destination; on the catch-all, the destination's port, or every port when
/// the destination names none. A destination host is the service of that name (short names
/// relative to the VirtualService's namespace), else a service with that hostname, preferring
/// the proxy's namespace, then the first namespace by name. Ports already imported stay as
/// they are.
fn add_destinations(all: &[BoundService], scope: &SidecarScope, out: &mut Vec<BoundService>) {
    // Index in `all` -> the ports wanted.
    let mut wanted: BTreeMap<usize, BTreeSet<u16>> = BTreeMap::new();
    for svc in all {
        for vs in &svc.virtual_services {
            let vs_ns = vs.metadata.namespace.as_deref().unwrap_or("default");
            let listeners = scope.virtual_service_listeners(vs_ns, &svc.hostname);
            if listeners.is_empty() {
                continue;
            }
            let destinations = (vs.spec.http.iter())
                .flat_map(|h| (h.route.iter().map(|r| &r.destination)).chain(h.mirror.as_ref()));
            for d in destinations {
                let Some(target) = destination_service(all, &d.host, vs_ns, scope.namespace())
                else {
                    continue;
                };
                let port = d.port.as_ref().map(|p| p.number).filter(|p| *p != 0);
                for listener in &listeners {
                    let want = listener.or(port);
                    let ports =
                        (all[target].ports.iter()).filter(|p| want.is_none_or(|w| w == p.port));
                    wanted
                        .entry(target)
                        .or_default()
                        .extend(ports.map(|p| p.port));
                }
            }
        }
    }
    // The service's ports in its own order: those imported already and those wanted.
    for (target, ports) in wanted.into_iter().filter(|(_, p)| !p.is_empty()) {
        let full = &all[target];
        match (out.iter_mut())
            .find(|s| s.namespace == full.namespace && s.hostname == full.hostname)
        {
            Some(svc) => {
                let have: BTreeSet<u16> = svc.ports.iter().map(|p| p.port).collect();
                svc.ports = (full.ports.iter())
                    .filter(|p| have.contains(&p.port) || ports.contains(&p.port))
                    .cloned()
                    .collect();
            }
            None => {
                let mut svc = visible_virtual_services(full.clone(), scope);
                svc.ports.retain(|p| ports.contains(&p.port));
                out.push(svc);
            }
        }
    }
}

/// The index in `all` of the service a VirtualService destination `host` names.
fn destination_service(
    all: &[BoundService],
    host: &str,
    vs_ns: &str,
    proxy_ns: &str,
) -> Option<usize> {
    let (ns, name) = vs_resolve_host(host, vs_ns);
    if let Some(i) = all.iter().position(|s| s.namespace == ns && s.name == name) {
        return Some(i);
    }
    let named = || (all.iter().enumerate()).filter(|(_, s)| s.hostname.eq_ignore_ascii_case(host));
    named()
        .find(|(_, s)| s.namespace == proxy_ns)
        .or_else(|| named().min_by(|a, b| a.1.namespace.cmp(&b.1.namespace)))
        .map(|(i, _)| i)
}
