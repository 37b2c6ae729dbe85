//! Each sidecar's Envoy configuration.
//!
//! A sidecar is a pod whose `sidecar.istio.io/status` annotation says it was injected. Its
//! outbound side (the services its `Sidecar` resource imports, every one by default, with the
//! DestinationRules its namespace sees) is generated once per namespace and Sidecar and shared; its inbound side (its ports, PeerAuthentication mode,
//! AuthorizationPolicies and RequestAuthentications selecting it) per pod. Any change marks the
//! sidecars for regeneration (while there are any); a sidecar whose resources come out the same
//! keeps its previous value, so its proxies get no push.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use mesh_api::{selector_matches, Kind, MtlsMode, Object, ObjectKey, PeerAuthentication};
use mesh_proto::workload::{address, Address};
use mesh_xds::ResourceMap;
use prost::Message;

use super::peer_auth::{oldest, pa_selector};
use super::state::{meta_labels, State};
use super::waypoints::{pick_authn, pick_authz, WaypointIndex};
use super::workload::pod_uid;
use super::{sidecar_scope, ModelConfig};
use crate::envoy::sidecar::{
    generate_outbound, generate_sidecar, InboundEndpoint, InboundPort, IngressEndpoint,
    IngressPort, PeerMode, SidecarError, SidecarInputs, SidecarKey, SidecarScope,
};
use crate::envoy::{
    Attached, BoundService, Flavor, Protocol, ProxyResources, RouteError, WaypointInputs,
    WaypointKey,
};

/// The annotation the injector writes on every pod it gives a sidecar.
pub(crate) const SIDECAR_STATUS_ANNOTATION: &str = "sidecar.istio.io/status";

/// Sidecar configuration by pod, shared by every snapshot until it changes.
pub(crate) type SidecarViews = imbl::OrdMap<SidecarKey, Arc<ProxyResources>>;

#[derive(Debug, Default)]
pub(crate) struct SidecarIndex {
    /// Pods with a sidecar.
    pods: BTreeSet<SidecarKey>,
    dirty: bool,
    /// The outbound side by namespace and Sidecar resource, as last generated.
    outbound: HashMap<OutboundKey, Arc<ProxyResources>>,
    pub views: SidecarViews,
}

impl SidecarIndex {
    /// Follows an object change: pods gain or lose sidecars; anything may change what they are
    /// served.
    pub fn on_object(&mut self, key: &ObjectKey, new: Option<&Object>) {
        if key.kind == Kind::Pod {
            let sk = SidecarKey {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
            };
            // A pod injected with the gateway template is a gateway proxy, not a sidecar.
            let injected = new.is_some_and(|o| {
                o.metadata().annotations.as_ref().is_some_and(|a| {
                    a.contains_key(SIDECAR_STATUS_ANNOTATION)
                        && !super::routers::gateway_template(a)
                })
            });
            if injected {
                self.pods.insert(sk);
            } else {
                self.pods.remove(&sk);
            }
        }
        self.touch();
    }

    /// Marks the sidecars for regeneration (a WDS resource or the settings changed).
    pub fn touch(&mut self) {
        self.dirty = !self.pods.is_empty() || !self.views.is_empty();
    }

    /// Regenerates every sidecar against the committed state, if anything changed.
    pub fn rebuild(
        &mut self,
        cfg: &ModelConfig,
        state: &State,
        waypoints: &WaypointIndex,
        addresses: &ResourceMap,
        version: u64,
    ) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        // The Sidecar resource in force for each pod; pods under the same one share their
        // outbound side.
        let mut scopes: BTreeMap<OutboundKey, (SidecarScope, Vec<SidecarError>)> = BTreeMap::new();
        let mut pods: Vec<(&SidecarKey, OutboundKey, BTreeMap<String, String>)> = Vec::new();
        for key in &self.pods {
            let labels = state
                .get(&ObjectKey::new(Kind::Pod, &key.namespace, &key.name))
                .map(|p| meta_labels(p.metadata()).clone())
                .unwrap_or_default();
            let (scope, errors) = sidecar_scope::for_workload(cfg, state, &key.namespace, &labels);
            let okey = (key.namespace.clone(), scope.from.clone());
            scopes.entry(okey.clone()).or_insert((scope, errors));
            pods.push((key, okey, labels));
        }
        let mut by_namespace: HashMap<&str, Vec<BoundService>> = HashMap::new();
        let mut outbound = HashMap::new();
        for (okey, (scope, scope_errors)) in &scopes {
            let ns = okey.0.as_str();
            let all = by_namespace
                .entry(ns)
                .or_insert_with(|| waypoints.services_for_sidecars(cfg, state, addresses, ns));
            let services = sidecar_scope::scoped(all, scope);
            let inputs = outbound_inputs(cfg, ns, scope.registry_only, services);
            let mut fresh = generate_outbound(&inputs, version);
            fresh
                .errors
                .extend(scope_errors.iter().cloned().map(RouteError::Sidecar));
            let kept = match self.outbound.remove(okey) {
                Some(old) if old.same_content(&fresh) => old,
                _ => {
                    for e in scope_errors {
                        tracing::warn!(namespace = ns, reason = "sidecar", "{e}");
                    }
                    Arc::new(fresh)
                }
            };
            outbound.insert(okey.clone(), kept);
        }
        self.outbound = outbound;
        let pods_now = &self.pods;
        retire_views(&mut self.views, |k| pods_now.contains(k), state, version);
        for (key, okey, labels) in pods {
            let (Some(out), Some((scope, _))) = (self.outbound.get(&okey), scopes.get(&okey))
            else {
                continue;
            };
            let inputs = inbound_inputs(cfg, state, (waypoints, addresses), (key, &labels), scope);
            let fresh = generate_sidecar(out, &inputs, version);
            for e in fresh.errors.iter().skip(out.errors.len()) {
                tracing::warn!(sidecar = %key, reason = e.reason(), "{e}");
            }
            let keep = self
                .views
                .get(key)
                .is_some_and(|old| old.same_content(&fresh));
            if !keep {
                self.views.insert(key.clone(), Arc::new(fresh));
            }
        }
    }
}

/// What the outbound side of proxies in `ns` (sidecars, gateways) is generated from:
/// `services`, with unknown destinations black-holed when `registry_only`.
pub(crate) fn outbound_inputs(
    cfg: &ModelConfig,
    ns: &str,
    registry_only: bool,
    services: Vec<BoundService>,
) -> WaypointInputs {
    WaypointInputs {
        key: WaypointKey {
            namespace: ns.to_string(),
            name: String::new(),
        },
        flavor: Flavor::Sidecar {
            send_hbone: cfg.sending_hbone,
            registry_only,
        },
        trust_domain: cfg.trust_domain.clone(),
        domain_suffix: cfg.domain_suffix.clone(),
        access_log_file: cfg.access_log_file.clone(),
        services,
    }
}

/// Views of proxies that `keep` no longer wants: while the pod exists its proxy may still be
/// connected and must see everything go, so it gets an empty configuration of `version`
/// (once); a pod that is gone is forgotten.
pub(crate) fn retire_views(
    views: &mut SidecarViews,
    keep: impl Fn(&SidecarKey) -> bool,
    state: &State,
    version: u64,
) {
    let gone: Vec<SidecarKey> = views.keys().filter(|k| !keep(k)).cloned().collect();
    for k in gone {
        let pod = ObjectKey::new(Kind::Pod, &k.namespace, &k.name);
        let emptied = (views.get(&k)).is_some_and(|v| v.by_type.values().all(|m| m.is_empty()));
        if state.get(&pod).is_none() {
            views.remove(&k);
        } else if !emptied {
            let mut empty = crate::envoy::sidecar::empty();
            empty.changed_in = version;
            views.insert(k, Arc::new(empty));
        }
    }
}

/// What an outbound side is generated for: the pods' namespace and the Sidecar in force
/// (`namespace/name`; `None` for the default).
type OutboundKey = (String, Option<String>);

/// The inbound side of one sidecar: the ports of a Sidecar's ingress listeners, or else those
/// of the services selecting it.
fn inbound_inputs(
    cfg: &ModelConfig,
    state: &State,
    (waypoints, addresses): (&WaypointIndex, &ResourceMap),
    (key, labels): (&SidecarKey, &BTreeMap<String, String>),
    scope: &SidecarScope,
) -> SidecarInputs {
    let uid = pod_uid(&cfg.cluster_id, &key.namespace, &key.name);
    let (mode, port_modes, port_modes_from) = peer_modes(cfg, state, &key.namespace, labels);
    let mut ports = inbound_ports(state, waypoints, addresses, &uid);
    if !scope.ingress.is_empty() {
        let pod_ip = state
            .get(&ObjectKey::new(Kind::Pod, &key.namespace, &key.name))
            .and_then(|p| match p {
                Object::Pod(p) => p.status.as_ref()?.pod_ip.as_deref()?.parse::<IpAddr>().ok(),
                _ => None,
            });
        ports = ingress_ports(&scope.ingress, &ports, pod_ip);
    }
    SidecarInputs {
        key: key.clone(),
        trust_domain: cfg.trust_domain.clone(),
        ports,
        mode,
        port_modes,
        port_modes_from,
        hbone: cfg.sidecar_listening_hbone && super::workload::native_tunnel(labels),
        access_log_file: cfg.access_log_file.clone(),
        policies: selecting_as(
            cfg,
            state,
            (&key.namespace, labels),
            (Kind::AuthorizationPolicy, pick_authz),
        ),
        request_authns: selecting_as(
            cfg,
            state,
            (&key.namespace, labels),
            (Kind::RequestAuthentication, pick_authn),
        ),
    }
}

/// A Sidecar's ingress ports in place of the services' (whose hostname, where one serves the
/// port, names it in telemetry). `0.0.0.0:<port>` endpoints are the pod's address; a pod
/// without one yet gets the port once it has it.
fn ingress_ports(
    ingress: &[IngressPort],
    from_services: &[InboundPort],
    pod_ip: Option<IpAddr>,
) -> Vec<InboundPort> {
    let mut ports: Vec<InboundPort> = ingress
        .iter()
        .filter_map(|p| {
            let endpoint = match &p.endpoint {
                IngressEndpoint::OriginalDestination => InboundEndpoint::OriginalDestination,
                IngressEndpoint::Loopback(ip, port) => {
                    InboundEndpoint::Socket(SocketAddr::new(*ip, *port))
                }
                IngressEndpoint::PodAddress(port) => {
                    InboundEndpoint::Socket(SocketAddr::new(pod_ip?, *port))
                }
                IngressEndpoint::Unix(path) => InboundEndpoint::Unix(path.clone()),
            };
            Some(InboundPort {
                port: p.port,
                protocol: p.protocol,
                service: (from_services.iter())
                    .find(|s| s.port == p.port)
                    .and_then(|s| s.service.clone()),
                endpoint,
            })
        })
        .collect();
    ports.sort_by_key(|p| p.port);
    ports
}

/// The target ports of the services that select the workload, with their protocols.
fn inbound_ports(
    state: &State,
    waypoints: &WaypointIndex,
    addresses: &ResourceMap,
    uid: &str,
) -> Vec<InboundPort> {
    let Some(address::Type::Workload(w)) = addresses
        .get(uid)
        .and_then(|r| Address::decode(r.body.value.as_slice()).ok())
        .and_then(|a| a.r#type)
    else {
        return Vec::new();
    };
    let mut ports: BTreeMap<u16, (Protocol, String)> = BTreeMap::new();
    for (svc_key, list) in &w.services {
        for p in &list.ports {
            let (Ok(service_port), Ok(target)) =
                (u16::try_from(p.service_port), u16::try_from(p.target_port))
            else {
                continue;
            };
            let target = if target == 0 { service_port } else { target };
            let protocol = waypoints
                .port_protocol(state, addresses, svc_key, service_port)
                .unwrap_or(Protocol::Http);
            let hostname = svc_key.split_once('/').map_or(svc_key.as_str(), |(_, h)| h);
            ports
                .entry(target)
                .or_insert_with(|| (protocol, hostname.to_string()));
        }
    }
    ports
        .into_iter()
        .map(|(port, (protocol, service))| InboundPort {
            port,
            protocol,
            service: Some(service),
            endpoint: InboundEndpoint::OriginalDestination,
        })
        .collect()
}

/// The workload's PeerAuthentication mode as Istio resolves it: the mesh policy (root
/// namespace, no selector), overridden by the namespace's, overridden by the oldest workload
/// policy selecting it (whose `portLevelMtls` set single ports); PERMISSIVE when none says.
fn peer_modes(
    cfg: &ModelConfig,
    state: &State,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> (PeerMode, BTreeMap<u16, PeerMode>, Option<String>) {
    let all = |n: &str| -> Vec<&PeerAuthentication> {
        state
            .objects_in(Kind::PeerAuthentication, n)
            .filter_map(|o| match o {
                Object::PeerAuthentication(p) => Some(&**p),
                _ => None,
            })
            .collect()
    };
    let root = cfg.root_namespace.as_str();
    let mesh = oldest(all(root).into_iter().filter(|p| pa_selector(p).is_none()));
    let local = all(ns);
    let namespace = (ns != root)
        .then(|| oldest(local.iter().copied().filter(|p| pa_selector(p).is_none())))
        .flatten();
    let workload = oldest(
        local
            .iter()
            .copied()
            .filter(|p| pa_selector(p).is_some_and(|s| selector_matches(s, Some(labels)))),
    );
    let mut mode = PeerMode::Permissive;
    for pa in [mesh, namespace, workload].into_iter().flatten() {
        if let Some(m) = convert(pa.spec.mtls.as_ref().map(|m| m.mode)) {
            mode = m;
        }
    }
    let mut ports = BTreeMap::new();
    let mut from = None;
    if let Some(w) = workload {
        for (port, m) in &w.spec.port_level_mtls {
            let (Ok(port), Some(m)) = (port.parse::<u16>(), convert(Some(m.mode))) else {
                continue;
            };
            ports.insert(port, m);
        }
        if !ports.is_empty() {
            from = Some(format!(
                "{}/{}",
                w.metadata.namespace.as_deref().unwrap_or(ns),
                w.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    (mode, ports, from)
}

/// A PeerAuthentication mode; `None` for UNSET (inherit).
fn convert(mode: Option<MtlsMode>) -> Option<PeerMode> {
    match mode? {
        MtlsMode::Unset => None,
        MtlsMode::Strict => Some(PeerMode::Strict),
        MtlsMode::Permissive => Some(PeerMode::Permissive),
        MtlsMode::Disable => Some(PeerMode::Disable),
    }
}

/// [`selecting`] policies of `T` (`pick` tells them and their kind) as attached policies.
fn selecting_as<T: Clone>(
    cfg: &ModelConfig,
    state: &State,
    (ns, labels): (&str, &BTreeMap<String, String>),
    (kind, pick): (Kind, fn(&Object) -> Option<&T>),
) -> Vec<Attached<T>> {
    selecting(cfg, state, kind, ns, labels)
        .into_iter()
        .filter_map(|(key, o)| {
            pick(o).map(|p| Attached {
                key,
                policy: Arc::new(p.clone()),
            })
        })
        .collect()
}

/// The policies of `kind` in force for a workload with `labels` in `ns`, by `namespace/name`:
/// those of its namespace whose selector matches (or that have none), and the root
/// namespace's without a selector (mesh-wide). Policies with `targetRef(s)` are for waypoints
/// and gateways.
fn selecting<'s>(
    cfg: &ModelConfig,
    state: &'s State,
    kind: Kind,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<(String, &'s Object)> {
    let mut out = BTreeMap::new();
    let root = cfg.root_namespace.as_str();
    for pns in if ns == root { vec![ns] } else { vec![ns, root] } {
        for obj in state.objects_in(kind, pns) {
            let (selector, targeted) = match obj {
                Object::AuthorizationPolicy(p) => (
                    p.spec.selector.as_ref().map(|s| &s.match_labels),
                    p.spec.target_ref.is_some() || !p.spec.target_refs.is_empty(),
                ),
                Object::RequestAuthentication(p) => (
                    p.spec.selector.as_ref().map(|s| &s.match_labels),
                    p.spec.targets().next().is_some(),
                ),
                _ => continue,
            };
            // A selector in the root namespace selects workloads of every namespace.
            let applies = match selector.filter(|s| !s.is_empty()) {
                Some(s) => selector_matches(s, Some(labels)),
                None => true,
            };
            if applies && !targeted {
                let name = obj.metadata().name.as_deref().unwrap_or_default();
                out.insert(format!("{pns}/{name}"), obj);
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests;
