//! Which `Sidecar` resource is in force for a sidecar proxy, and the services it leaves the
//! proxy.
//!
//! As Istio picks: in the pod's namespace the oldest Sidecar whose `workloadSelector` matches
//! the pod's labels (a selector with no labels matches every pod), else the namespace's oldest
//! Sidecar without a selector, else the root namespace's oldest one without a selector (its
//! `.` then stands for the pod's namespace), else the default: every service, unknown
//! destinations as the mesh config says.

use std::collections::BTreeMap;

use mesh_api::{Kind, Object, Sidecar};

use super::state::State;
use super::ModelConfig;
use crate::envoy::sidecar::{SidecarError, SidecarScope};
use crate::envoy::BoundService;

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
/// dropped) and the VirtualServices whose namespace it imports for the host.
pub(crate) fn scoped(services: &[BoundService], scope: &SidecarScope) -> Vec<BoundService> {
    services
        .iter()
        .filter_map(|svc| {
            let mut svc = svc.clone();
            svc.ports
                .retain(|p| scope.imports(&svc.namespace, &svc.hostname, p.port));
            if svc.ports.is_empty() {
                return None;
            }
            svc.virtual_services.retain(|vs| {
                let vs_ns = vs.metadata.namespace.as_deref().unwrap_or("default");
                scope.imports_virtual_service(vs_ns, &svc.hostname)
            });
            Some(svc)
        })
        .collect()
}
