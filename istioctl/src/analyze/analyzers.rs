//! The analyzers: pure functions from the loaded objects to messages.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use mesh_api::{label, selector_matches, Object, Pod};

use super::index::Index;
use super::message::{codes, Message, Origin};

/// What the analyzers look at.
#[derive(Debug)]
pub struct Snapshot<'a> {
    pub objects: &'a [(PathBuf, Arc<Object>)],
    pub index: &'a Index,
    /// Namespace whose selector-less AuthorizationPolicies apply mesh-wide.
    pub root_namespace: &'a str,
}

type Labels = BTreeMap<String, String>;

const EMPTY: &Labels = &BTreeMap::new();

impl Snapshot<'_> {
    /// Runs every analyzer.
    pub fn analyze(&self) -> Vec<Message> {
        let mut out = Vec::new();
        self.authorization_policies(&mut out);
        self.service_selectors(&mut out);
        self.ambient_pods_with_sidecars(&mut out);
        self.namespaces_with_both_modes(&mut out);
        self.missing_waypoints(&mut out);
        self.sidecar_selectors(&mut out);
        out
    }

    fn origin(&self, file: &std::path::Path, object: &Object) -> Origin {
        let key = object.key();
        Origin::object(
            &key,
            file,
            self.index
                .line(file, key.kind.as_str(), &key.namespace, &key.name),
        )
    }

    fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.objects.iter().filter_map(|(_, o)| match &**o {
            Object::Pod(p) => Some(&**p),
            _ => None,
        })
    }

    fn namespace_labels(&self, ns: &str) -> &Labels {
        self.objects
            .iter()
            .find_map(|(_, o)| match &**o {
                Object::Namespace(n) if n.metadata.name.as_deref() == Some(ns) => {
                    n.metadata.labels.as_ref()
                }
                _ => None,
            })
            .unwrap_or(EMPTY)
    }

    /// Whether the pod is in the mesh: enrolled in ambient or given a sidecar.
    fn in_mesh(&self, pod: &Pod) -> bool {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let ns_labels = self.namespace_labels(ns);
        let injected_by_ns = ns_labels.get(label::ISTIO_INJECTION).map(String::as_str)
            == Some("enabled")
            && flag(pod, label::SIDECAR_INJECT) != Some("false");
        ambient(pod, ns_labels) || sidecar(pod).is_some() || injected_by_ns
    }

    /// IST0127 for AuthorizationPolicies that select no workload in the mesh (upstream's
    /// `auth.AuthorizationPoliciesAnalyzer`); policies attached by `targetRef(s)` are for
    /// waypoints and skipped.
    fn authorization_policies(&self, out: &mut Vec<Message>) {
        for (file, object) in self.objects {
            let Object::AuthorizationPolicy(ap) = &**object else {
                continue;
            };
            if ap.spec.target_ref.is_some() || !ap.spec.target_refs.is_empty() {
                continue;
            }
            let ns = ap.metadata.namespace.as_deref().unwrap_or("default");
            let selector = ap.spec.selector.as_ref().map(|s| &s.match_labels);
            let mesh_wide = ns == self.root_namespace;
            if mesh_wide && selector.is_none() {
                continue;
            }
            let found = self.pods().any(|p| {
                (mesh_wide || p.metadata.namespace.as_deref() == Some(ns))
                    && selector.is_none_or(|s| selector_matches(s, p.metadata.labels.as_ref()))
                    && self.in_mesh(p)
            });
            if !found {
                let labels = selector.map(selector_string).unwrap_or_default();
                out.push(codes::NO_MATCHING_WORKLOADS.message(
                    Some(self.origin(file, object)),
                    format!("No matching workloads for this resource with the following labels: {labels}"),
                ));
            }
        }
    }

    /// IST0127 for Services whose selector matches no Pod of their namespace.
    fn service_selectors(&self, out: &mut Vec<Message>) {
        for (file, object) in self.objects {
            let Object::Service(svc) = &**object else {
                continue;
            };
            let Some(selector) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
                continue;
            };
            if selector.is_empty() {
                continue;
            }
            let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
            let found = self.pods().any(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && selector_matches(selector, p.metadata.labels.as_ref())
            });
            if !found {
                out.push(codes::NO_MATCHING_WORKLOADS.message(
                    Some(self.origin(file, object)),
                    format!(
                        "No matching workloads for this resource with the following labels: {}",
                        selector_string(selector)
                    ),
                ));
            }
        }
    }

    /// IST0901 for pods labeled `istio.io/dataplane-mode=ambient` that also get a sidecar:
    /// ztunnel never captures sidecar pods, so one of the two is a mistake.
    fn ambient_pods_with_sidecars(&self, out: &mut Vec<Message>) {
        for (file, object) in self.objects {
            let Object::Pod(pod) = &**object else {
                continue;
            };
            let labels = pod.metadata.labels.as_ref().unwrap_or(EMPTY);
            if labels.get(label::DATAPLANE_MODE).map(String::as_str)
                != Some(label::DATAPLANE_MODE_AMBIENT)
            {
                continue;
            }
            let Some(why) = sidecar(pod) else {
                continue;
            };
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            out.push(codes::AMBIENT_POD_WITH_SIDECAR.message(
                Some(self.origin(file, object)),
                format!(
                    "The pod is labeled {}={} but {why}; ztunnel does not capture pods with a sidecar. Run 'kubectl label pod {name} -n {ns} {}-' or disable the sidecar.",
                    label::DATAPLANE_MODE,
                    label::DATAPLANE_MODE_AMBIENT,
                    label::DATAPLANE_MODE
                ),
            ));
        }
    }

    /// IST0123 for namespaces labeled for both sidecar injection and ambient.
    fn namespaces_with_both_modes(&self, out: &mut Vec<Message>) {
        for (file, object) in self.objects {
            let Object::Namespace(ns) = &**object else {
                continue;
            };
            let labels = ns.metadata.labels.as_ref().unwrap_or(EMPTY);
            let injection =
                labels.get(label::ISTIO_INJECTION).map(String::as_str) == Some("enabled");
            let ambient = labels.get(label::DATAPLANE_MODE).map(String::as_str)
                == Some(label::DATAPLANE_MODE_AMBIENT);
            if injection && ambient {
                let name = ns.metadata.name.as_deref().unwrap_or_default();
                out.push(codes::NAMESPACE_MULTIPLE_INJECTION_LABELS.message(
                    Some(self.origin(file, object)),
                    format!(
                        "The namespace has both {}=enabled and {}={}: new pods get sidecars, which ambient then skips. Run 'kubectl label namespace {name} {}-' or 'kubectl label namespace {name} {}-'.",
                        label::ISTIO_INJECTION,
                        label::DATAPLANE_MODE,
                        label::DATAPLANE_MODE_AMBIENT,
                        label::ISTIO_INJECTION,
                        label::DATAPLANE_MODE
                    ),
                ));
            }
        }
    }

    /// IST0101 for `istio.io/use-waypoint` labels naming a Gateway that is not defined.
    fn missing_waypoints(&self, out: &mut Vec<Message>) {
        for (file, object) in self.objects {
            let meta = object.metadata();
            let Some(labels) = meta.labels.as_ref() else {
                continue;
            };
            let Some(waypoint) = labels.get(label::USE_WAYPOINT) else {
                continue;
            };
            if waypoint.is_empty() || waypoint == "none" {
                continue;
            }
            let own_ns = match &**object {
                Object::Namespace(_) => meta.name.clone().unwrap_or_default(),
                _ => meta.namespace.clone().unwrap_or_else(|| "default".into()),
            };
            let wp_ns = labels
                .get(label::USE_WAYPOINT_NAMESPACE)
                .filter(|n| !n.is_empty())
                .cloned()
                .unwrap_or(own_ns);
            if !self
                .index
                .gateways
                .contains(&(wp_ns.clone(), waypoint.clone()))
            {
                out.push(codes::REFERENCED_RESOURCE_NOT_FOUND.message(
                    Some(self.origin(file, object)),
                    format!("Referenced gateway not found: \"{wp_ns}/{waypoint}\""),
                ));
            }
        }
    }
}

/// An object, its file and its name.
type Named<'a> = (&'a PathBuf, &'a Object, &'a str);

impl Snapshot<'_> {
    /// Sidecar resources as upstream's `sidecar.SelectorAnalyzer` checks them: IST0101 for a
    /// `workloadSelector` matching no pod of the namespace, IST0111 for several Sidecars
    /// without a selector in one namespace, IST0110 for several selecting the same pod (istiod
    /// then takes the oldest).
    fn sidecar_selectors(&self, out: &mut Vec<Message>) {
        let mut selectorless: BTreeMap<&str, Vec<Named<'_>>> = BTreeMap::new();
        // Pod (namespace, name) -> the Sidecars selecting it.
        let mut by_pod: BTreeMap<(&str, &str), Vec<Named<'_>>> = BTreeMap::new();
        for (file, object) in self.objects {
            let Object::Sidecar(sc) = &**object else {
                continue;
            };
            let ns = sc.metadata.namespace.as_deref().unwrap_or("default");
            let name = sc.metadata.name.as_deref().unwrap_or_default();
            let Some(selector) = sc.spec.workload_selector.as_ref().map(|w| &w.labels) else {
                selectorless
                    .entry(ns)
                    .or_default()
                    .push((file, object, name));
                continue;
            };
            let mut found = false;
            for p in self.pods() {
                if p.metadata.namespace.as_deref().unwrap_or("default") == ns
                    && selector_matches(selector, p.metadata.labels.as_ref())
                {
                    found = true;
                    let pod = p.metadata.name.as_deref().unwrap_or_default();
                    by_pod
                        .entry((ns, pod))
                        .or_default()
                        .push((file, object, name));
                }
            }
            if !found {
                out.push(codes::REFERENCED_RESOURCE_NOT_FOUND.message(
                    Some(self.origin(file, object)),
                    format!(
                        "Referenced selector not found: \"{}\"",
                        selector_string(selector)
                    ),
                ));
            }
        }
        for (ns, list) in selectorless.into_iter().filter(|(_, l)| l.len() > 1) {
            let names: Vec<&str> = list.iter().map(|(_, _, n)| *n).collect();
            for (file, object, _) in &list {
                out.push(codes::MULTIPLE_SIDECARS_WITHOUT_WORKLOAD_SELECTORS.message(
                    Some(self.origin(file, object)),
                    format!("The Sidecars [{}] in namespace \"{ns}\" have no workload selector, which can lead to undefined behavior.", names.join(" ")),
                ));
            }
        }
        for ((ns, pod), list) in by_pod.into_iter().filter(|(_, l)| l.len() > 1) {
            let names: Vec<&str> = list.iter().map(|(_, _, n)| *n).collect();
            for (file, object, _) in &list {
                out.push(codes::CONFLICTING_SIDECAR_WORKLOAD_SELECTORS.message(
                    Some(self.origin(file, object)),
                    format!("The Sidecars [{}] in namespace \"{ns}\" select the same workload pod \"{pod}\", which can lead to undefined behavior.", names.join(" ")),
                ));
            }
        }
    }
}

/// A label or annotation of the pod (label first, as upstream).
fn flag<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    let meta = &pod.metadata;
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .or_else(|| meta.annotations.as_ref().and_then(|a| a.get(key)))
        .map(String::as_str)
}

/// Why the pod has (or will get) a sidecar, if it does.
fn sidecar(pod: &Pod) -> Option<String> {
    let has_proxy = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.containers.iter().any(|c| c.name == "istio-proxy"));
    if has_proxy {
        return Some("it has an istio-proxy container".into());
    }
    let annotations = pod.metadata.annotations.as_ref();
    if annotations.is_some_and(|a| a.contains_key(label::SIDECAR_STATUS)) {
        return Some(format!(
            "it is sidecar-injected ({})",
            label::SIDECAR_STATUS
        ));
    }
    if flag(pod, label::SIDECAR_INJECT) == Some("true") {
        return Some(format!(
            "it asks for a sidecar ({}=true)",
            label::SIDECAR_INJECT
        ));
    }
    None
}

/// Whether the pod is enrolled in ambient by its own or its namespace's label.
fn ambient(pod: &Pod, ns_labels: &Labels) -> bool {
    let own = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(label::DATAPLANE_MODE))
        .map(String::as_str);
    match own {
        Some(mode) => mode == label::DATAPLANE_MODE_AMBIENT,
        None => {
            ns_labels.get(label::DATAPLANE_MODE).map(String::as_str)
                == Some(label::DATAPLANE_MODE_AMBIENT)
                && sidecar(pod).is_none()
        }
    }
}

/// `k1=v1,k2=v2` in key order, as Kubernetes prints a selector.
fn selector_string(selector: &Labels) -> String {
    selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
