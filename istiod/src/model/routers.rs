//! Each gateway proxy's Envoy configuration (Istio's ingress gateways, `router` nodes).
//!
//! A gateway proxy is a pod that some `networking.istio.io` Gateway selects: all of the
//! Gateway's `selector` labels are among the pod's, in any namespace (Istio's default, with
//! `PILOT_SCOPE_GATEWAY_TO_NAMESPACE` off). A Gateway without a selector applies to every pod
//! injected with the `gateway` template. A server's port becomes the `targetPort` of the port
//! with that number of a Service selecting the pod (a Service may map 80 to 8080 where the
//! proxy may not bind low ports), else stays as it is. Regenerated on any change while
//! Gateways or gateway proxies exist; a proxy whose resources come out the same keeps its
//! previous value, so it gets no push.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use mesh_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mesh_api::{
    selector_matches, IstioGateway, Kind, Object, ObjectKey, Pod, Secret, VirtualService,
};
use mesh_xds::ResourceMap;

use super::sidecars::{outbound_inputs, retire_views};
use super::state::{meta_labels, State};
use super::waypoints::WaypointIndex;
use super::ModelConfig;
use crate::envoy::sidecar::{
    generate_gateway, generate_outbound, vs_binds_gateway, BoundServer, Credential, GatewayInputs,
    SidecarKey,
};
use crate::envoy::{ProxyResources, WaypointInputs};

/// Whether a pod's annotations ask for the injector's `gateway` template.
pub(crate) fn gateway_template(annotations: &BTreeMap<String, String>) -> bool {
    (annotations.get(mesh_inject::TEMPLATES_ANNOTATION))
        .is_some_and(|t| t.split(',').any(|t| t.trim() == "gateway"))
}

/// Gateway proxy configuration by pod, shared by every snapshot until it changes.
pub(crate) type RouterViews = super::sidecars::SidecarViews;

#[derive(Debug, Default)]
pub(crate) struct RouterIndex {
    dirty: bool,
    pub views: RouterViews,
}

impl RouterIndex {
    /// Marks the gateway proxies for regeneration.
    pub fn touch(&mut self) {
        self.dirty = true;
    }

    /// Regenerates every gateway proxy against the committed state, if anything changed.
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
        let gateways = gateways(state);
        if gateways.is_empty() && self.views.is_empty() {
            return;
        }
        let selected = selected_pods(state, &gateways);
        // Pods no Gateway selects any more: an empty configuration while the pod lives.
        retire_views(
            &mut self.views,
            |k| selected.contains_key(k),
            state,
            version,
        );
        let bound: Vec<&VirtualService> = gateway_virtual_services(state);
        // The outbound side (clusters, endpoints) by the proxies' namespace.
        let mut outbound: HashMap<String, (WaypointInputs, ProxyResources)> = HashMap::new();
        for (key, (pod, picked)) in &selected {
            let (inputs, side) = outbound.entry(key.namespace.clone()).or_insert_with(|| {
                let services =
                    waypoints.services_for_sidecars(cfg, state, addresses, &key.namespace);
                let inputs = outbound_inputs(cfg, &key.namespace, false, services);
                let side = generate_outbound(&inputs, version);
                (inputs, side)
            });
            let servers = servers(state, pod, picked);
            let names: Vec<&str> = servers.iter().map(|s| s.gateway.as_str()).collect();
            let virtual_services = (bound.iter().copied())
                .filter(|vs| {
                    let vs_ns = vs.metadata.namespace.as_deref().unwrap_or("default");
                    names.iter().any(|g| vs_binds_gateway(vs, vs_ns, g))
                })
                .collect();
            let credentials = credentials(state, &key.namespace, &servers);
            let inputs = GatewayInputs {
                outbound: inputs,
                servers,
                virtual_services,
                credentials,
            };
            let fresh = generate_gateway(side, &inputs, version);
            let keep = (self.views.get(key)).is_some_and(|old| old.same_content(&fresh));
            if !keep {
                for e in &fresh.errors {
                    tracing::warn!(gateway_proxy = %key, reason = e.reason(), "{e}");
                }
                self.views.insert(key.clone(), Arc::new(fresh));
            }
        }
    }
}

/// A Gateway with its `namespace/name`.
type NamedGateway<'s> = (String, &'s IstioGateway);

/// Every Gateway with its `namespace/name`, oldest first (then by namespace and name).
fn gateways(state: &State) -> Vec<NamedGateway<'_>> {
    let mut out: Vec<NamedGateway<'_>> = Vec::new();
    for ns in state.namespaces_with(Kind::IstioGateway) {
        for o in state.objects_in(Kind::IstioGateway, &ns) {
            if let Object::IstioGateway(g) = o {
                let name = g.metadata.name.clone().unwrap_or_default();
                out.push((format!("{ns}/{name}"), g));
            }
        }
    }
    out.sort_by(|a, b| {
        let created = |g: &IstioGateway| g.metadata.creation_timestamp.clone().map(|t| t.0);
        (created(a.1), &a.0).cmp(&(created(b.1), &b.0))
    });
    out
}

/// The pods some Gateway selects, each with the indices (in `gateways`) of those selecting it.
fn selected_pods<'s>(
    state: &'s State,
    gateways: &[NamedGateway<'s>],
) -> BTreeMap<SidecarKey, (&'s Pod, Vec<NamedGateway<'s>>)> {
    let mut out = BTreeMap::new();
    if gateways.is_empty() {
        return out;
    }
    for ns in state.namespaces_with(Kind::Pod) {
        for o in state.objects_in(Kind::Pod, &ns) {
            let Object::Pod(pod) = o else { continue };
            let labels = meta_labels(&pod.metadata);
            let gateway_template =
                (pod.metadata.annotations.as_ref()).is_some_and(gateway_template);
            let picked: Vec<NamedGateway<'s>> = (gateways.iter())
                .filter(|(_, g)| {
                    if g.spec.selector.is_empty() {
                        gateway_template
                    } else {
                        (g.spec.selector.iter()).all(|(k, v)| labels.get(k) == Some(v))
                    }
                })
                .map(|(n, g)| (n.clone(), *g))
                .collect();
            if picked.is_empty() {
                continue;
            }
            let key = SidecarKey {
                namespace: ns.clone(),
                name: pod.metadata.name.clone().unwrap_or_default(),
            };
            out.insert(key, (&**pod, picked));
        }
    }
    out
}

/// The servers of `gateways` on `pod`, each with the port the pod listens on for it.
fn servers(state: &State, pod: &Pod, gateways: &[NamedGateway<'_>]) -> Vec<BoundServer> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let labels = meta_labels(&pod.metadata);
    let services: Vec<&mesh_api::Service> = (state.objects_in(Kind::Service, ns))
        .filter_map(|o| match o {
            Object::Service(s) => Some(&**s),
            _ => None,
        })
        .filter(|s| {
            (s.spec.as_ref().and_then(|spec| spec.selector.as_ref()))
                .is_some_and(|sel| !sel.is_empty() && selector_matches(sel, Some(labels)))
        })
        .collect();
    let mut out = Vec::new();
    for (name, gw) in gateways {
        for (index, server) in gw.spec.servers.iter().enumerate() {
            // Port 0 (or none) and numbers past 65535 cannot be listened on; the generator
            // reports them (listen port 0).
            let number = server.port.as_ref().map_or(0, |p| p.number);
            let number = u16::try_from(number).unwrap_or(0);
            out.push(BoundServer {
                gateway: name.clone(),
                index,
                server: server.clone(),
                listen_port: if number == 0 {
                    0
                } else {
                    target_port(&services, pod, number)
                },
            });
        }
    }
    out
}

/// The `targetPort` of the first Service port numbered `port` (a name: the pod's container port
/// of that name), else `port`.
fn target_port(services: &[&mesh_api::Service], pod: &Pod, port: u16) -> u16 {
    let ports = services
        .iter()
        .filter_map(|s| s.spec.as_ref()?.ports.as_ref())
        .flatten();
    for p in ports.filter(|p| p.port == i32::from(port)) {
        let target = match &p.target_port {
            None => Some(port),
            Some(IntOrString::Int(n)) => u16::try_from(*n).ok(),
            Some(IntOrString::String(name)) => (pod.spec.as_ref())
                .into_iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|cp| cp.name.as_deref() == Some(name))
                .and_then(|cp| u16::try_from(cp.container_port).ok()),
        };
        if let Some(t) = target {
            return t;
        }
    }
    port
}

/// The credentials the servers name (`credentialName`), from the Secrets of the gateway's
/// namespace `ns`, as Istio reads them: `tls.crt` / `tls.key` (`kubernetes.io/tls`) or `cert` /
/// `key`, the CA from `ca.crt` or `cacert`, else from the Secret `<name>-cacert`.
fn credentials(
    state: &State,
    ns: &str,
    servers: &[BoundServer],
) -> BTreeMap<String, Result<Credential, String>> {
    let mut out = BTreeMap::new();
    for s in servers {
        if let Some(name) = s
            .server
            .tls
            .as_ref()
            .and_then(|t| t.credential_name.as_deref())
        {
            out.entry(name.to_string())
                .or_insert_with(|| credential(state, ns, name));
        }
    }
    out
}

fn credential(state: &State, ns: &str, name: &str) -> Result<Credential, String> {
    let secret = |n: &str| match state.get(&ObjectKey::new(Kind::Secret, ns, n)) {
        Some(Object::Secret(s)) => Some(&**s),
        _ => None,
    };
    let Some(found) = secret(name) else {
        return Err(format!("no Secret {name} in the gateway's namespace {ns}"));
    };
    let cert = secret_data(found, &["tls.crt", "cert"]);
    let key = secret_data(found, &["tls.key", "key"]);
    let (Some(cert_chain), Some(key)) = (cert, key) else {
        return Err(format!(
            "Secret {ns}/{name} has neither tls.crt and tls.key nor cert and key"
        ));
    };
    let pem = |b: &[u8], what: &str| {
        String::from_utf8_lossy(b)
            .contains(&format!("{what}-----"))
            .then_some(())
            .ok_or_else(|| format!("Secret {ns}/{name}: the {} is not PEM", what.to_lowercase()))
    };
    pem(&cert_chain, "CERTIFICATE")?;
    pem(&key, "PRIVATE KEY")?;
    let ca = secret_data(found, &["ca.crt", "cacert"]).or_else(|| {
        secret(&format!("{name}-cacert")).and_then(|s| secret_data(s, &["ca.crt", "cacert"]))
    });
    Ok(Credential {
        cert_chain,
        key,
        ca,
    })
}

/// The first of `keys` the Secret holds, in `data` or (as written in a file) `stringData`.
fn secret_data(secret: &Secret, keys: &[&str]) -> Option<Vec<u8>> {
    keys.iter().find_map(|k| {
        (secret
            .data
            .as_ref()
            .and_then(|d| d.get(*k))
            .map(|b| b.0.clone()))
        .or_else(|| (secret.string_data.as_ref()?.get(*k)).map(|s| s.clone().into_bytes()))
    })
}

/// VirtualServices that name some gateway other than `mesh`, oldest first.
fn gateway_virtual_services(state: &State) -> Vec<&VirtualService> {
    let mut out: Vec<&VirtualService> = Vec::new();
    for ns in state.namespaces_with(Kind::VirtualService) {
        for o in state.objects_in(Kind::VirtualService, &ns) {
            if let Object::VirtualService(v) = o {
                if v.spec.gateways.iter().any(|g| g != "mesh") {
                    out.push(v);
                }
            }
        }
    }
    out.sort_by(|a, b| {
        let key = |v: &VirtualService| {
            (
                v.metadata.creation_timestamp.clone().map(|t| t.0),
                v.metadata.namespace.clone(),
                v.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    out
}

#[cfg(test)]
mod tests;
