//! Which services each waypoint serves, and each waypoint's Envoy configuration.
//!
//! The index follows the WDS resources the model commits (a Service's `waypoint`, a workload's
//! `services`) and the Gateway / HTTPRoute objects, and marks the waypoints a change touches.
//! After each build only those waypoints are regenerated; a waypoint whose generated resources
//! are unchanged keeps its previous value (and `changed_in`), so its proxies get no push.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use mesh_api::{Kind, Object, ObjectKey, WAYPOINT_CLASS};
use mesh_proto::workload::{address, gateway_address, Address, Service as WdsService, Workload};
use mesh_xds::ResourceMap;
use prost::Message;

use super::state::{meta_labels, State};
use super::workload::bytes_ip;
use super::ModelConfig;
use crate::envoy::Attached;
use crate::envoy::{
    generate_waypoint, BoundService, Endpoint, Protocol, ProxyResources, ServicePort,
    WaypointInputs, WaypointKey,
};

/// Waypoint configuration by waypoint, shared by every snapshot until it changes.
pub(crate) type WaypointViews = imbl::OrdMap<WaypointKey, Arc<ProxyResources>>;

/// What the index remembers of a service.
#[derive(Debug, Clone)]
struct ServiceInfo {
    namespace: String,
    name: String,
    waypoint: Option<WaypointKey>,
}

#[derive(Debug, Default)]
pub(crate) struct WaypointIndex {
    /// WDS service key (`ns/hostname`) -> what it is bound to.
    services: HashMap<String, ServiceInfo>,
    /// WDS service key -> workload uids selected by it.
    endpoints: HashMap<String, BTreeSet<String>>,
    /// Workload uid -> the service keys it belongs to.
    workload_services: HashMap<String, Vec<String>>,
    /// Waypoint -> its service keys.
    bound: BTreeMap<WaypointKey, BTreeSet<String>>,
    dirty: BTreeSet<WaypointKey>,
    pub views: WaypointViews,
}

impl WaypointIndex {
    /// Follows one committed (or removed, `None`) WDS address resource.
    pub fn on_address(&mut self, name: &str, body: Option<&[u8]>, state: &State) {
        let decoded = body.and_then(|b| Address::decode(b).ok());
        match decoded.and_then(|a| a.r#type) {
            Some(address::Type::Service(svc)) => self.on_service(name, Some(&svc), state),
            Some(address::Type::Workload(w)) => self.on_workload(name, Some(&w)),
            None => {
                if self.services.contains_key(name) {
                    self.on_service(name, None, state);
                } else {
                    self.on_workload(name, None);
                }
            }
        }
    }

    fn on_service(&mut self, key: &str, svc: Option<&WdsService>, state: &State) {
        if let Some(old) = self.services.remove(key) {
            if let Some(wp) = old.waypoint {
                self.dirty.insert(wp.clone());
                if let Some(set) = self.bound.get_mut(&wp) {
                    set.remove(key);
                }
            }
        }
        let Some(svc) = svc else { return };
        let waypoint = svc.waypoint.as_ref().and_then(|g| match &g.destination {
            Some(gateway_address::Destination::Hostname(h)) => Some(WaypointKey {
                namespace: h.namespace.clone(),
                name: gateway_of_hostname(state, &h.namespace, &h.hostname),
            }),
            _ => None,
        });
        if let Some(wp) = &waypoint {
            self.dirty.insert(wp.clone());
            self.bound
                .entry(wp.clone())
                .or_default()
                .insert(key.to_string());
        }
        self.services.insert(
            key.to_string(),
            ServiceInfo {
                namespace: svc.namespace.clone(),
                name: svc.name.clone(),
                waypoint,
            },
        );
    }

    fn on_workload(&mut self, uid: &str, w: Option<&Workload>) {
        let old = self.workload_services.remove(uid).unwrap_or_default();
        let new: Vec<String> = w
            .map(|w| w.services.keys().cloned().collect())
            .unwrap_or_default();
        for key in &old {
            if let Some(set) = self.endpoints.get_mut(key) {
                set.remove(uid);
            }
        }
        for key in &new {
            self.endpoints
                .entry(key.clone())
                .or_default()
                .insert(uid.to_string());
        }
        for key in old.iter().chain(&new) {
            if let Some(wp) = self.services.get(key).and_then(|s| s.waypoint.clone()) {
                self.dirty.insert(wp);
            }
        }
        if !new.is_empty() {
            self.workload_services.insert(uid.to_string(), new);
        }
    }

    /// Follows a Gateway or HTTPRoute change (`old` and current versions of the object).
    pub fn on_object(&mut self, key: &ObjectKey, old: Option<&Object>, new: Option<&Object>) {
        match key.kind {
            Kind::Gateway => {
                self.dirty.insert(WaypointKey {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                });
            }
            Kind::HttpRoute | Kind::GrpcRoute | Kind::TcpRoute => {
                for obj in [old, new].into_iter().flatten() {
                    let refs = match obj {
                        Object::HttpRoute(r) => &r.spec.parent_refs,
                        Object::GrpcRoute(r) => &r.spec.parent_refs,
                        Object::TcpRoute(r) => &r.spec.parent_refs,
                        _ => continue,
                    };
                    for p in refs.iter().filter(|p| p.is_service()) {
                        let ns = p.namespace.as_deref().unwrap_or(&key.namespace);
                        self.mark_service(ns, &p.name);
                    }
                }
            }
            Kind::VirtualService | Kind::DestinationRule => {
                for obj in [old, new].into_iter().flatten() {
                    let hosts: &[String] = match obj {
                        Object::VirtualService(vs) => &vs.spec.hosts,
                        Object::DestinationRule(dr) => std::slice::from_ref(&dr.spec.host),
                        _ => continue,
                    };
                    // By Kubernetes name, or by hostname (a ServiceEntry's).
                    let marked: Vec<WaypointKey> = (self.services.iter())
                        .filter(|(wds_key, s)| {
                            hosts.iter().any(|h| {
                                crate::envoy::vs_host_names(
                                    h,
                                    &key.namespace,
                                    &s.namespace,
                                    &s.name,
                                ) || wds_key.rsplit_once('/').is_some_and(|(_, host)| host == h)
                            })
                        })
                        .filter_map(|(_, s)| s.waypoint.clone())
                        .collect();
                    self.dirty.extend(marked);
                }
            }
            // Port names and appProtocol decide HTTP or TCP chains but are not all in WDS.
            Kind::Service | Kind::ServiceEntry => self.mark_service(&key.namespace, &key.name),
            Kind::AuthorizationPolicy | Kind::RequestAuthentication => {
                for obj in [old, new].into_iter().flatten() {
                    for r in policy_target_refs(obj) {
                        match r.kind.as_str() {
                            "Gateway" => {
                                self.dirty.insert(WaypointKey {
                                    namespace: key.namespace.clone(),
                                    name: r.name.clone(),
                                });
                            }
                            "Service" | "ServiceEntry" => {
                                self.mark_service(&key.namespace, &r.name)
                            }
                            "GatewayClass" => self.mark_all(),
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn mark_service(&mut self, ns: &str, name: &str) {
        let wps: Vec<WaypointKey> = self
            .services
            .values()
            .filter(|s| s.namespace == ns && s.name == name)
            .filter_map(|s| s.waypoint.clone())
            .collect();
        self.dirty.extend(wps);
    }

    /// Marks every known waypoint for regeneration (the model's settings changed).
    pub fn mark_all(&mut self) {
        let known: Vec<WaypointKey> = self
            .bound
            .keys()
            .chain(self.views.keys())
            .cloned()
            .collect();
        self.dirty.extend(known);
    }

    /// Regenerates every marked waypoint against the committed state.
    pub fn rebuild(
        &mut self,
        cfg: &ModelConfig,
        state: &State,
        addresses: &ResourceMap,
        version: u64,
    ) {
        for wp in std::mem::take(&mut self.dirty) {
            let known = self.bound.get(&wp).is_some_and(|s| !s.is_empty())
                || is_waypoint_gateway(state, &wp);
            if !known {
                self.bound.remove(&wp);
                if !self.views.contains_key(&wp) {
                    continue;
                }
                // Served before: its proxies must see that everything is gone.
            }
            let inputs = self.inputs(cfg, state, addresses, &wp);
            let fresh = generate_waypoint(&inputs, version);
            for e in &fresh.errors {
                tracing::warn!(waypoint = %wp, reason = e.reason(), "{e}");
            }
            let keep = self
                .views
                .get(&wp)
                .is_some_and(|old| old.same_content(&fresh));
            if !keep {
                self.views.insert(wp, Arc::new(fresh));
            }
        }
    }

    fn inputs(
        &self,
        cfg: &ModelConfig,
        state: &State,
        addresses: &ResourceMap,
        wp: &WaypointKey,
    ) -> WaypointInputs {
        let mut services: Vec<BoundService> = self
            .bound
            .get(wp)
            .into_iter()
            .flatten()
            .filter_map(|key| {
                self.bound_service(cfg, state, addresses, (&wp.namespace, Some(wp)), key)
            })
            .collect();
        services.sort_by(|a, b| a.hostname.cmp(&b.hostname));
        WaypointInputs {
            key: wp.clone(),
            flavor: crate::envoy::Flavor::Waypoint,
            trust_domain: cfg.trust_domain.clone(),
            domain_suffix: cfg.domain_suffix.clone(),
            access_log_file: cfg.access_log_file.clone(),
            services,
        }
    }

    /// Every service, as the sidecars of namespace `client_ns` call them (no policies: those
    /// apply where the traffic arrives), sorted by hostname.
    pub fn services_for_sidecars(
        &self,
        cfg: &ModelConfig,
        state: &State,
        addresses: &ResourceMap,
        client_ns: &str,
    ) -> Vec<BoundService> {
        let mut keys: Vec<&String> = self.services.keys().collect();
        keys.sort();
        let mut services: Vec<BoundService> = keys
            .into_iter()
            .filter_map(|key| self.bound_service(cfg, state, addresses, (client_ns, None), key))
            .collect();
        services.sort_by(|a, b| a.hostname.cmp(&b.hostname));
        services
    }

    /// The protocol of one port of the service `key` (WDS `ns/hostname`).
    pub fn port_protocol(
        &self,
        state: &State,
        addresses: &ResourceMap,
        key: &str,
        port: u16,
    ) -> Option<Protocol> {
        let address::Type::Service(svc) = decode(addresses, key)? else {
            return None;
        };
        let p = svc
            .ports
            .iter()
            .find(|p| p.service_port == u32::from(port))?;
        Some(port_protocol(state, &svc, p))
    }

    /// One service as the waypoint `wp` serves it, or (`wp` `None`) as a sidecar in
    /// `client_ns` calls it: routes, VirtualServices and the DestinationRule `client_ns` sees,
    /// and for a waypoint the policies attached to it.
    fn bound_service(
        &self,
        cfg: &ModelConfig,
        state: &State,
        addresses: &ResourceMap,
        (client_ns, wp): (&str, Option<&WaypointKey>),
        key: &str,
    ) -> Option<BoundService> {
        let svc = match decode(addresses, key)? {
            address::Type::Service(s) => s,
            address::Type::Workload(_) => return None,
        };
        let ports = svc
            .ports
            .iter()
            .filter_map(|p| {
                let port = u16::try_from(p.service_port).ok()?;
                Some(ServicePort {
                    port,
                    name: raw_port(state, &svc, port).and_then(|s| s.name.clone()),
                    protocol: port_protocol(state, &svc, p),
                })
            })
            .collect();
        let endpoints = self
            .endpoints
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|uid| endpoint(state, addresses, uid, key))
            .collect();
        let names_svc = |refs: &[mesh_api::ParentReference]| {
            refs.iter().any(|p| p.is_service() && p.name == svc.name)
        };
        let in_ns = |kind| state.objects_in(kind, &svc.namespace);
        let routes = in_ns(Kind::HttpRoute)
            .filter_map(|o| match o {
                Object::HttpRoute(r) if names_svc(&r.spec.parent_refs) => {
                    Some(Arc::new((**r).clone()))
                }
                _ => None,
            })
            .collect();
        let grpc_routes = in_ns(Kind::GrpcRoute)
            .filter_map(|o| match o {
                Object::GrpcRoute(r) if names_svc(&r.spec.parent_refs) => {
                    Some(Arc::new((**r).clone()))
                }
                _ => None,
            })
            .collect();
        let tcp_routes = in_ns(Kind::TcpRoute)
            .filter_map(|o| match o {
                Object::TcpRoute(r) if names_svc(&r.spec.parent_refs) => {
                    Some(Arc::new((**r).clone()))
                }
                _ => None,
            })
            .collect();
        let virtual_services = virtual_services_for(state, cfg, &svc.namespace, &svc.name);
        let destination_rule = destination_rule_for(
            state,
            cfg,
            client_ns,
            &svc.namespace,
            &svc.name,
            &svc.hostname,
        );
        Some(BoundService {
            namespace: svc.namespace.clone(),
            name: svc.name.clone(),
            hostname: svc.hostname.clone(),
            vips: svc
                .addresses
                .iter()
                .filter_map(|a| bytes_ip(&a.address))
                .collect(),
            ports,
            endpoints,
            routes,
            grpc_routes,
            tcp_routes,
            virtual_services,
            destination_rule,
            policies: wp
                .map(|wp| {
                    attached_as(
                        cfg,
                        state,
                        (Kind::AuthorizationPolicy, pick_authz),
                        (wp, (&svc.namespace, &svc.name, &svc.hostname)),
                    )
                })
                .unwrap_or_default(),
            request_authns: wp
                .map(|wp| {
                    attached_as(
                        cfg,
                        state,
                        (Kind::RequestAuthentication, pick_authn),
                        (wp, (&svc.namespace, &svc.name, &svc.hostname)),
                    )
                })
                .unwrap_or_default(),
        })
    }
}

/// VirtualServices (without `gateways`, or with `mesh`) whose hosts name `namespace/name`, in
/// creation order as Istio merges them (then by namespace and name).
fn virtual_services_for(
    state: &State,
    cfg: &ModelConfig,
    namespace: &str,
    name: &str,
) -> Vec<Arc<mesh_api::VirtualService>> {
    let hostname = format!("{name}.{namespace}.svc.{}", cfg.domain_suffix);
    let applies = |v: &mesh_api::VirtualService| {
        let vs_ns = v.metadata.namespace.as_deref().unwrap_or("default");
        let mesh = v.spec.gateways.is_empty() || v.spec.gateways.iter().any(|g| g == "mesh");
        mesh && (v.spec.hosts.iter())
            .any(|h| h == &hostname || crate::envoy::vs_host_names(h, vs_ns, namespace, name))
    };
    // Only the VirtualServices that apply are copied.
    let mut found: Vec<Arc<mesh_api::VirtualService>> = Vec::new();
    for ns in state.namespaces_with(Kind::VirtualService) {
        for o in state.objects_in(Kind::VirtualService, &ns) {
            if let Object::VirtualService(v) = o {
                if applies(v) {
                    found.push(Arc::new((**v).clone()));
                }
            }
        }
    }
    found.sort_by(|a, b| {
        let key = |v: &mesh_api::VirtualService| {
            (
                v.metadata.creation_timestamp.clone().map(|t| t.0),
                v.metadata.namespace.clone(),
                v.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    found
}

/// The DestinationRule for `namespace/name` as the waypoint in `wp_ns` sees it: rules in the
/// waypoint's namespace win, then the service's, then the root namespace's. Within that
/// namespace several rules for the host merge as Istio merges them: oldest first, its traffic
/// policy (or the first one that has any), subsets of all of them (the first of a name wins).
/// Rules with a `workloadSelector` are for sidecars and do not apply; `exportTo` is honoured.
fn destination_rule_for(
    state: &State,
    cfg: &ModelConfig,
    wp_ns: &str,
    namespace: &str,
    name: &str,
    hostname: &str,
) -> Option<Arc<mesh_api::DestinationRule>> {
    let visible = |dr: &mesh_api::DestinationRule, dr_ns: &str| {
        let to = &dr.spec.export_to;
        to.is_empty()
            || to
                .iter()
                .any(|e| e == "*" || e == wp_ns || (e == "." && dr_ns == wp_ns))
    };
    let names_host = |dr: &mesh_api::DestinationRule, dr_ns: &str| {
        dr.spec.host == hostname
            || crate::envoy::vs_host_names(&dr.spec.host, dr_ns, namespace, name)
    };
    let mut order = vec![wp_ns, namespace, cfg.root_namespace.as_str()];
    order.dedup();
    for ns in order {
        let mut found: Vec<&mesh_api::DestinationRule> = state
            .objects_in(Kind::DestinationRule, ns)
            .filter_map(|o| match o {
                Object::DestinationRule(d) => Some(&**d),
                _ => None,
            })
            .filter(|d| d.spec.workload_selector.is_none())
            .filter(|d| visible(d, ns) && names_host(d, ns))
            .collect();
        if found.is_empty() {
            continue;
        }
        found.sort_by(|a, b| {
            let key = |d: &mesh_api::DestinationRule| {
                (
                    d.metadata.creation_timestamp.clone().map(|t| t.0),
                    d.metadata.name.clone(),
                )
            };
            key(a).cmp(&key(b))
        });
        let mut merged = found[0].clone();
        for other in &found[1..] {
            if merged.spec.traffic_policy.is_none() {
                merged.spec.traffic_policy = other.spec.traffic_policy.clone();
            }
            for s in &other.spec.subsets {
                if !merged.spec.subsets.iter().any(|m| m.name == s.name) {
                    merged.spec.subsets.push(s.clone());
                }
            }
        }
        return Some(Arc::new(merged));
    }
    None
}

/// `targetRef` and `targetRefs` of an AuthorizationPolicy or RequestAuthentication (none for
/// other objects).
fn policy_target_refs(obj: &Object) -> Vec<&mesh_api::PolicyTargetReference> {
    match obj {
        Object::AuthorizationPolicy(p) => p.spec.targets().collect(),
        Object::RequestAuthentication(p) => p.spec.targets().collect(),
        _ => Vec::new(),
    }
}

/// The policies of `kind` (AuthorizationPolicy or RequestAuthentication) in force for one
/// service on one waypoint, by `namespace/name`: those targeting the Service or ServiceEntry,
/// the waypoint's Gateway, or (from the root namespace) the `istio-waypoint` GatewayClass.
/// Policies with a selector are for workloads, not waypoints.
fn attached<'s>(
    cfg: &ModelConfig,
    state: &'s State,
    kind: Kind,
    wp: &WaypointKey,
    (svc_ns, svc_name, hostname): (&str, &str, &str),
) -> Vec<(String, &'s Object)> {
    let mut out: BTreeMap<String, &'s Object> = BTreeMap::new();
    let mut scan = |ns: &str, wanted: &dyn Fn(&mesh_api::PolicyTargetReference) -> bool| {
        for obj in state.objects_in(kind, ns) {
            if policy_target_refs(obj).into_iter().any(wanted) {
                let name = obj.metadata().name.as_deref().unwrap_or_default();
                out.insert(format!("{ns}/{name}"), obj);
            }
        }
    };
    let group_ok =
        |r: &mesh_api::PolicyTargetReference, group: &str| r.group.is_empty() || r.group == group;
    // A Kubernetes Service and a ServiceEntry may share a name: each targets only its own.
    let kubernetes = hostname == format!("{svc_name}.{svc_ns}.svc.{}", cfg.domain_suffix);
    scan(svc_ns, &|r| {
        r.name == svc_name
            && if kubernetes {
                r.kind == "Service" && group_ok(r, "")
            } else {
                r.kind == "ServiceEntry" && r.group == "networking.istio.io"
            }
    });
    scan(&wp.namespace, &|r| {
        r.kind == "Gateway" && r.name == wp.name && group_ok(r, "gateway.networking.k8s.io")
    });
    scan(&cfg.root_namespace, &|r| {
        r.kind == "GatewayClass" && r.name == WAYPOINT_CLASS
    });
    out.into_iter().collect()
}

/// [`attached`] objects as typed policies, `pick` telling the type's objects.
fn attached_as<T: Clone>(
    cfg: &ModelConfig,
    state: &State,
    (kind, pick): (Kind, fn(&Object) -> Option<&T>),
    (wp, svc): (&WaypointKey, (&str, &str, &str)),
) -> Vec<Attached<T>> {
    attached(cfg, state, kind, wp, svc)
        .into_iter()
        .filter_map(|(key, obj)| {
            pick(obj).map(|p| Attached {
                key,
                policy: Arc::new(p.clone()),
            })
        })
        .collect()
}

pub(crate) fn pick_authz(o: &Object) -> Option<&mesh_api::AuthorizationPolicy> {
    match o {
        Object::AuthorizationPolicy(p) => Some(p),
        _ => None,
    }
}

pub(crate) fn pick_authn(o: &Object) -> Option<&mesh_api::RequestAuthentication> {
    match o {
        Object::RequestAuthentication(p) => Some(p),
        _ => None,
    }
}

fn decode(addresses: &ResourceMap, key: &str) -> Option<address::Type> {
    let r = addresses.get(key)?;
    Address::decode(r.body.value.as_slice()).ok()?.r#type
}

fn endpoint(state: &State, addresses: &ResourceMap, uid: &str, svc_key: &str) -> Option<Endpoint> {
    let address::Type::Workload(w) = decode(addresses, uid)? else {
        return None;
    };
    let ip: IpAddr = w.addresses.first().and_then(|a| bytes_ip(a))?;
    let ports = w.services.get(svc_key)?;
    let target_ports = ports
        .ports
        .iter()
        .filter_map(|p| {
            Some((
                u16::try_from(p.service_port).ok()?,
                u16::try_from(p.target_port).ok()?,
            ))
        })
        .collect();
    let labels = match state.get(&ObjectKey::new(Kind::Pod, &w.namespace, &w.name)) {
        Some(o) => meta_labels(o.metadata()).clone(),
        None => BTreeMap::new(),
    };
    let workload = format!(
        "{};{};{};{};{}",
        w.workload_name, w.namespace, w.canonical_name, w.canonical_revision, w.cluster_id
    );
    let principal = format!(
        "spiffe://{}/ns/{}/sa/{}",
        w.trust_domain, w.namespace, w.service_account
    );
    let sidecar = labels
        .get(crate::envoy::names::TLS_MODE_LABEL)
        .is_some_and(|m| m == crate::envoy::names::TLS_MODE_ISTIO);
    Some(Endpoint {
        ip,
        target_ports,
        healthy: w.status == mesh_proto::workload::WorkloadStatus::Healthy as i32,
        sidecar,
        hbone: w.tunnel_protocol == mesh_proto::workload::TunnelProtocol::Hbone as i32,
        labels,
        workload,
        principal,
    })
}

/// The Kubernetes Service's spec of one port of `svc` (none for a ServiceEntry).
fn raw_port<'s>(
    state: &'s State,
    svc: &WdsService,
    port: u16,
) -> Option<&'s mesh_api::k8s_openapi::api::core::v1::ServicePort> {
    match state.get(&ObjectKey::new(Kind::Service, &svc.namespace, &svc.name)) {
        Some(Object::Service(s)) => (s.spec.as_ref())
            .and_then(|s| s.ports.as_ref())
            .and_then(|ps| ps.iter().find(|sp| i64::from(sp.port) == i64::from(port))),
        _ => None,
    }
}

/// How a service port is proxied: from the Kubernetes Service's `appProtocol` or port name,
/// else (a ServiceEntry) from WDS.
fn port_protocol(state: &State, svc: &WdsService, p: &mesh_proto::workload::Port) -> Protocol {
    let spec = u16::try_from(p.service_port)
        .ok()
        .and_then(|port| raw_port(state, svc, port));
    match spec {
        Some(s) => Protocol::detect(s.app_protocol.as_deref(), s.name.as_deref()),
        None => wds_protocol(p.app_protocol),
    }
}

/// A ServiceEntry's port protocol as WDS carries it; unknown is sniffed as HTTP.
fn wds_protocol(app_protocol: i32) -> Protocol {
    use mesh_proto::workload::AppProtocol;
    match AppProtocol::try_from(app_protocol) {
        Ok(AppProtocol::Http2) => Protocol::Http2,
        Ok(AppProtocol::Grpc) => Protocol::Grpc,
        Ok(AppProtocol::Tcp | AppProtocol::Tls) => Protocol::Tcp,
        _ => Protocol::Http,
    }
}

/// The Gateway a waypoint hostname belongs to: the one in `namespace` whose status lists it
/// (a Gateway renamed with `gateway.istio.io/name-override` has a Service of another name),
/// else the hostname's first label.
fn gateway_of_hostname(state: &State, namespace: &str, hostname: &str) -> String {
    let listed = state
        .objects_in(Kind::Gateway, namespace)
        .find_map(|o| match o {
            Object::Gateway(g) if status_hostname(g) == Some(hostname) => g.metadata.name.clone(),
            _ => None,
        });
    listed.unwrap_or_else(|| hostname.split('.').next().unwrap_or_default().to_string())
}

/// The `Hostname` address in a Gateway's status.
pub(crate) fn status_hostname(g: &mesh_api::Gateway) -> Option<&str> {
    (g.status.as_ref())?
        .addresses
        .iter()
        .find(|a| a.type_.as_deref() == Some("Hostname"))
        .map(|a| a.value.as_str())
}

/// Whether a Gateway of class `istio-waypoint` with this key exists.
fn is_waypoint_gateway(state: &State, wp: &WaypointKey) -> bool {
    matches!(
        state.get(&ObjectKey::new(Kind::Gateway, &wp.namespace, &wp.name)),
        Some(Object::Gateway(g)) if g.spec.gateway_class_name == WAYPOINT_CLASS
    )
}

/// The waypoint a proxy belongs to: the Gateway named by its pod's
/// `gateway.networking.k8s.io/gateway-name` label (sent in the node metadata `LABELS`).
pub(crate) fn waypoint_of(
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Option<WaypointKey> {
    let name = labels.get(mesh_api::GATEWAY_NAME_LABEL)?;
    (!name.is_empty()).then(|| WaypointKey {
        namespace: namespace.to_string(),
        name: name.clone(),
    })
}

#[cfg(test)]
mod tests;
