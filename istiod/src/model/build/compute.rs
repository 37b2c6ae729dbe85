//! Recomputing one source object's resources from the current state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use mesh_api::{
    selector_matches, Kind, Object, ObjectKey, PeerAuthentication, Service, ServiceEntry,
    WorkloadEntrySpec,
};
use mesh_proto::type_url;
use mesh_proto::workload::{
    address, Address, GatewayAddress, NetworkMode, Service as WdsService, Workload,
};
use mesh_xds::Resource;

use super::{Model, Output};
use crate::model::authz::{convert_authorization_policy, workload_selector};
use crate::model::endpoint_slice::{slice_service, slice_to_workloads};
use crate::model::peer_auth::{
    convert_peer_authentication, effective_keys, oldest, pa_selector, static_strict_policy,
    STATIC_STRICT_POLICY_NAME,
};
use crate::model::service::{
    service_entry_selector, service_entry_to_services, service_selector, service_to_service,
};
use crate::model::state::meta_labels;
use crate::model::workload::{
    add_service_entry_ports, bytes_ip, entry_services, entry_to_workload, pod_to_workload,
    service_entry_endpoint_uid, workload_entry_uid, WorkloadInputs,
};

type Labels = BTreeMap<String, String>;

impl Model {
    pub(super) fn compute(&self, key: &ObjectKey) -> Output {
        match (key.kind, self.state.get(key)) {
            (Kind::Pod, Some(Object::Pod(_))) => self.compute_pod(key),
            (Kind::WorkloadEntry, Some(Object::WorkloadEntry(we))) => {
                let uid = workload_entry_uid(&self.cfg.cluster_id, &key.namespace, &key.name);
                self.compute_entry(key, uid, &we.spec, None)
            }
            (Kind::Service, Some(Object::Service(svc))) => self.compute_service(key, svc),
            (Kind::ServiceEntry, Some(Object::ServiceEntry(se))) => {
                self.compute_service_entry(key, se)
            }
            (Kind::AuthorizationPolicy, Some(Object::AuthorizationPolicy(p))) => {
                let conv = convert_authorization_policy(&self.cfg.root_namespace, p);
                let authorizations = conv.authorization.iter().map(authz_resource).collect();
                Output {
                    authorizations,
                    errors: conv.errors,
                    ..Output::default()
                }
            }
            (Kind::PeerAuthentication, found) => self.compute_peer_auth(key, found),
            (Kind::EndpointSlice, Some(Object::EndpointSlice(es))) => self.compute_slice(key, es),
            _ => Output::default(),
        }
    }

    /// The non-pod endpoints of an EndpointSlice whose Service exists.
    fn compute_slice(&self, key: &ObjectKey, slice: &mesh_api::EndpointSlice) -> Output {
        let Some(svc_name) = slice_service(slice) else {
            return Output::default();
        };
        let Some(Object::Service(svc)) =
            self.state
                .get(&ObjectKey::new(Kind::Service, &key.namespace, svc_name))
        else {
            return Output::default();
        };
        let (workloads, errors) = slice_to_workloads(&self.cfg, svc, slice);
        let mut out = Output {
            errors,
            ..Output::default()
        };
        for w in workloads {
            out.addresses
                .extend(self.workload_output(w, false).addresses);
        }
        out
    }

    fn compute_pod(&self, key: &ObjectKey) -> Output {
        let Some(Object::Pod(pod)) = self.state.get(key) else {
            return Output::default();
        };
        let labels = meta_labels(&pod.metadata);
        let services = self.selecting_services(&key.namespace, labels);
        let entries = self.selecting_entries(&key.namespace, labels);
        let policies = self.policy_keys(&key.namespace, labels);
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(
                |n| match self.state.get(&ObjectKey::new(Kind::Node, "", n)) {
                    Some(Object::Node(node)) => Some(&**node),
                    _ => None,
                },
            );
        let inputs = WorkloadInputs {
            cfg: &self.cfg,
            namespace: self.state.namespace(&key.namespace),
            services: &services,
            service_entries: &entries,
            policies: &policies,
            node,
        };
        match pod_to_workload(&inputs, pod) {
            Ok(Some(w)) => self.workload_output(w, true),
            Ok(None) => Output::default(),
            Err(e) => Output {
                errors: vec![e],
                ..Output::default()
            },
        }
    }

    /// A WorkloadEntry, or (with `se`) one inline endpoint of a ServiceEntry.
    fn compute_entry(
        &self,
        key: &ObjectKey,
        uid: String,
        spec: &WorkloadEntrySpec,
        se: Option<&ServiceEntry>,
    ) -> Output {
        let labels = &spec.labels;
        let (services, entries) = match se {
            None => (
                self.selecting_services(&key.namespace, labels),
                self.selecting_entries(&key.namespace, labels),
            ),
            Some(_) => (Vec::new(), Vec::new()),
        };
        let policies = self.policy_keys(&key.namespace, labels);
        let inputs = WorkloadInputs {
            cfg: &self.cfg,
            namespace: self.state.namespace(&key.namespace),
            services: &services,
            service_entries: &entries,
            policies: &policies,
            node: None,
        };
        let svc_ports = match se {
            None => entry_services(&inputs, &spec.ports),
            Some(se) => {
                let mut out = BTreeMap::new();
                add_service_entry_ports(&mut out, se, |n| spec.ports.get(n).copied());
                out
            }
        };
        match entry_to_workload(&inputs, uid, &key.namespace, &key.name, spec, svc_ports) {
            Ok(Some(w)) => self.workload_output(w, se.is_none()),
            Ok(None) => Output::default(),
            Err(e) => Output {
                errors: vec![e],
                ..Output::default()
            },
        }
    }

    fn compute_service(&self, key: &ObjectKey, svc: &Service) -> Output {
        let ns = self.state.namespace(&key.namespace);
        match service_to_service(&self.cfg, ns, svc) {
            Ok(mut s) => Output {
                addresses: vec![{
                    self.bind_waypoint(&mut s.waypoint, "service");
                    service_resource(s)
                }],
                ..Output::default()
            },
            Err(e) => Output {
                errors: vec![e],
                ..Output::default()
            },
        }
    }

    fn compute_service_entry(&self, key: &ObjectKey, se: &ServiceEntry) -> Output {
        let ns = self.state.namespace(&key.namespace);
        let (services, errors) = service_entry_to_services(&self.cfg, ns, se);
        let mut out = Output {
            addresses: (services.into_iter())
                .map(|mut s| {
                    self.bind_waypoint(&mut s.waypoint, "service");
                    service_resource(s)
                })
                .collect(),
            errors,
            ..Output::default()
        };
        for ep in &se.spec.endpoints {
            let uid = service_entry_endpoint_uid(
                &self.cfg.cluster_id,
                &key.namespace,
                &key.name,
                &ep.address,
            );
            let ep_out = self.compute_entry(key, uid, ep, Some(se));
            out.addresses.extend(ep_out.addresses);
            out.errors.extend(ep_out.errors);
        }
        out
    }

    fn compute_peer_auth(&self, key: &ObjectKey, found: Option<&Object>) -> Output {
        let root = &self.cfg.root_namespace;
        let policy = if key.name == STATIC_STRICT_POLICY_NAME && key.namespace == *root {
            self.state
                .any_of(Kind::PeerAuthentication)
                .then(|| static_strict_policy(root))
        } else if let Some(Object::PeerAuthentication(pa)) = found {
            let ns_pa = self.namespace_peer_auth(&key.namespace);
            let root_pa = self.namespace_peer_auth(root);
            convert_peer_authentication(root, pa, ns_pa, root_pa)
        } else {
            None
        };
        Output {
            authorizations: policy.iter().map(authz_resource).collect(),
            ..Output::default()
        }
    }

    /// Kubernetes Services of `ns` whose selector selects `labels`.
    fn selecting_services(&self, ns: &str, labels: &Labels) -> Vec<&Service> {
        (self.state.objects_in(Kind::Service, ns))
            .filter_map(|o| match o {
                Object::Service(s) => Some(s.as_ref()),
                _ => None,
            })
            .filter(|s| service_selector(s).is_some_and(|sel| selector_matches(sel, Some(labels))))
            .collect()
    }

    /// ServiceEntries of `ns` whose workloadSelector selects `labels`.
    fn selecting_entries(&self, ns: &str, labels: &Labels) -> Vec<&ServiceEntry> {
        (self.state.objects_in(Kind::ServiceEntry, ns))
            .filter_map(|o| match o {
                Object::ServiceEntry(s) => Some(s.as_ref()),
                _ => None,
            })
            .filter(|s| {
                service_entry_selector(s).is_some_and(|sel| selector_matches(sel, Some(labels)))
            })
            .collect()
    }

    /// `ns/name` of the selector policies (its namespace and the root's) and PeerAuthentication
    /// derived policies that apply to a workload, sorted.
    fn policy_keys(&self, ns: &str, labels: &Labels) -> Vec<String> {
        let root = self.cfg.root_namespace.as_str();
        let mut keys = BTreeSet::new();
        let namespaces: &[&str] = if ns == root { &[ns] } else { &[ns, root] };
        for pns in namespaces {
            for obj in self.state.objects_in(Kind::AuthorizationPolicy, pns) {
                let Object::AuthorizationPolicy(p) = obj else {
                    continue;
                };
                if workload_selector(p).is_some_and(|s| selector_matches(s, Some(labels))) {
                    keys.insert(format!(
                        "{pns}/{}",
                        p.metadata.name.as_deref().unwrap_or_default()
                    ));
                }
            }
        }
        let mesh = self.namespace_peer_auth(root);
        let (namespace, workload) = if ns == root {
            (None, None)
        } else {
            let selected = (self.state.objects_in(Kind::PeerAuthentication, ns))
                .filter_map(as_peer_auth)
                .filter(|p| pa_selector(p).is_some_and(|s| selector_matches(s, Some(labels))));
            (self.namespace_peer_auth(ns), oldest(selected))
        };
        keys.extend(effective_keys(root, mesh, namespace, workload));
        keys.into_iter().collect()
    }

    /// The oldest PeerAuthentication without a selector in `ns`.
    fn namespace_peer_auth(&self, ns: &str) -> Option<&PeerAuthentication> {
        let all = self.state.objects_in(Kind::PeerAuthentication, ns);
        oldest(
            all.filter_map(as_peer_auth)
                .filter(|p| pa_selector(p).is_none()),
        )
    }

    /// Keeps `waypoint` only if it names a Gateway of class `istio-waypoint` that is ready
    /// (its controller wrote `status.addresses`) and serves `traffic` (`service` or
    /// `workload`): `istio.io/waypoint-for` on the Gateway, else on its GatewayClass, else
    /// `service`; `workload`, `all` or `none`. Otherwise traffic bypasses it, as Istio does.
    fn bind_waypoint(&self, waypoint: &mut Option<GatewayAddress>, traffic: &str) {
        use mesh_proto::workload::gateway_address::Destination;
        let Some(Destination::Hostname(h)) = waypoint.as_mut().and_then(|g| g.destination.as_mut())
        else {
            return;
        };
        let name = h.hostname.split('.').next().unwrap_or_default();
        let key = ObjectKey::new(Kind::Gateway, &h.namespace, name);
        match self.state.get(&key) {
            Some(Object::Gateway(g)) if self.serves(g, traffic) => {
                // The Service the controller made may be renamed
                // (`gateway.istio.io/name-override`): its hostname is the one in the status.
                if let Some(listed) = crate::model::waypoints::status_hostname(g) {
                    h.hostname = listed.to_string();
                }
            }
            _ => *waypoint = None,
        }
    }

    /// Whether `g` is a ready waypoint for `traffic`.
    fn serves(&self, g: &mesh_api::Gateway, traffic: &str) -> bool {
        let ready = g.spec.gateway_class_name == mesh_api::WAYPOINT_CLASS
            && g.status.as_ref().is_some_and(|s| !s.addresses.is_empty());
        let class_key = ObjectKey::new(Kind::GatewayClass, "", &g.spec.gateway_class_name);
        let class_default = match self.state.get(&class_key) {
            Some(Object::GatewayClass(c)) => {
                meta_labels(&c.metadata).get(mesh_api::label::WAYPOINT_FOR)
            }
            _ => None,
        };
        let serves = (meta_labels(&g.metadata).get(mesh_api::label::WAYPOINT_FOR))
            .or(class_default)
            .map_or("service", String::as_str);
        ready && (serves == traffic || serves == "all")
    }

    /// The resource of a workload; `exclusive` workloads must own their IPs.
    fn workload_output(&self, mut w: Workload, exclusive: bool) -> Output {
        self.bind_waypoint(&mut w.waypoint, "workload");
        let aliases: Vec<String> = (w.addresses.iter())
            .filter_map(|a| bytes_ip(a))
            .map(|ip| format!("{}/{ip}", w.network))
            .collect();
        let host_network = w.network_mode == NetworkMode::HostNetwork as i32;
        let ips = if exclusive && !host_network {
            aliases.iter().cloned().collect()
        } else {
            BTreeSet::new()
        };
        let uid = w.uid.clone();
        let msg = Address {
            r#type: Some(address::Type::Workload(w)),
        };
        Output {
            addresses: vec![Arc::new(Resource::new(
                type_url::ADDRESS,
                uid,
                aliases,
                &msg,
            ))],
            ips,
            ..Output::default()
        }
    }
}

fn as_peer_auth(o: &Object) -> Option<&PeerAuthentication> {
    match o {
        Object::PeerAuthentication(p) => Some(p),
        _ => None,
    }
}

fn service_resource(s: WdsService) -> Arc<Resource> {
    let name = format!("{}/{}", s.namespace, s.hostname);
    let aliases = (s.addresses.iter())
        .filter(|a| a.length.is_none())
        .filter_map(|a| bytes_ip(&a.address).map(|ip| format!("{}/{ip}", a.network)))
        .collect();
    let msg = Address {
        r#type: Some(address::Type::Service(s)),
    };
    Arc::new(Resource::new(type_url::ADDRESS, name, aliases, &msg))
}

fn authz_resource(a: &mesh_proto::security::Authorization) -> Arc<Resource> {
    let name = format!("{}/{}", a.namespace, a.name);
    Arc::new(Resource::new(type_url::AUTHORIZATION, name, Vec::new(), a))
}
