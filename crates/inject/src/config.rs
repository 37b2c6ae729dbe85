//! What injection is configured with: the istiod chart's values (the `values` key of the
//! `istio-sidecar-injector` ConfigMap, or a values file for `istioctl kube-inject`), read with
//! Istio's names and defaults.

use serde_json::{json, Value};

/// The injection policy (`global.proxy.autoInject`): whether pods that say nothing are
/// injected in a namespace the webhook selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Enabled,
    Disabled,
}

/// Everything the injected parts depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct InjectConfig {
    pub hub: String,
    pub tag: String,
    /// `global.proxy.image` (a full reference when it contains `/`).
    pub proxy_image: String,
    pub revision: String,
    pub istio_namespace: String,
    pub ca_address: String,
    pub pilot_cert_provider: String,
    pub cluster_id: String,
    pub network: Option<String>,
    pub trust_domain: String,
    pub mesh_id: String,
    pub cluster_domain: String,
    pub status_port: u16,
    pub log_level: String,
    pub component_log_level: String,
    pub agent_log_level: String,
    /// `pilot.cni.enabled` (or the older `istio_cni.enabled`): capture is set up by cni-node,
    /// so the init step only validates it.
    pub cni: bool,
    pub policy: Policy,
    /// `sidecarInjectorWebhook.neverInjectSelector`: pods they select are not injected unless
    /// the pod says so itself.
    pub never_inject: Vec<crate::selector::LabelSelector>,
    /// `sidecarInjectorWebhook.alwaysInjectSelector`: pods they select are injected unless
    /// the pod says otherwise (the never list wins).
    pub always_inject: Vec<crate::selector::LabelSelector>,
    pub rewrite_probes: bool,
    pub hold_application: bool,
    pub token_audience: String,
    pub resources: Value,
    /// `meshConfig.defaultConfig`, passed to the agent as `PROXY_CONFIG`.
    pub proxy_config: Value,
}

impl Default for InjectConfig {
    fn default() -> Self {
        InjectConfig::from_values(&Value::Null)
    }
}

fn text(v: &Value, default: &str) -> String {
    match v {
        Value::String(s) if !s.is_empty() => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => default.to_string(),
    }
}

fn flag(v: &Value, default: bool) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => matches!(s.as_str(), "true" | "True" | "1"),
        _ => default,
    }
}

impl InjectConfig {
    /// From the istiod chart's values (missing fields take Istio's defaults).
    pub fn from_values(values: &Value) -> InjectConfig {
        let g = &values["global"];
        let revision = text(&values["revision"], "");
        let istio_namespace = text(&g["istioNamespace"], "istio-system");
        let istiod = if revision.is_empty() || revision == "default" {
            "istiod".to_string()
        } else {
            format!("istiod-{revision}")
        };
        let trust_domain = text(&values["meshConfig"]["trustDomain"], "cluster.local");
        let cni = flag(&values["pilot"]["cni"]["enabled"], false)
            || flag(&values["istio_cni"]["enabled"], false);
        let default_resources = json!({"requests": {"cpu": "100m", "memory": "128Mi"},
                                       "limits": {"cpu": "2000m", "memory": "1024Mi"}});
        InjectConfig {
            hub: text(&g["hub"], "docker.io/istio"),
            tag: text(&g["tag"], env!("CARGO_PKG_VERSION")),
            proxy_image: text(&g["proxy"]["image"], "proxyv2"),
            revision,
            ca_address: text(
                &g["caAddress"],
                &format!("{istiod}.{istio_namespace}.svc:15012"),
            ),
            istio_namespace,
            pilot_cert_provider: text(&g["pilotCertProvider"], "istiod"),
            cluster_id: text(&g["multiCluster"]["clusterName"], "Kubernetes"),
            network: Some(text(&g["network"], "")).filter(|n| !n.is_empty()),
            mesh_id: text(&g["meshID"], &trust_domain),
            trust_domain,
            cluster_domain: text(&g["proxy"]["clusterDomain"], "cluster.local"),
            status_port: g["proxy"]["statusPort"]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(15020),
            log_level: text(&g["proxy"]["logLevel"], "warning"),
            component_log_level: text(&g["proxy"]["componentLogLevel"], "misc:error"),
            agent_log_level: text(&g["logging"]["level"], "default:info"),
            cni,
            policy: match g["proxy"]["autoInject"].as_str() {
                Some("disabled") => Policy::Disabled,
                _ => Policy::Enabled,
            },
            never_inject: crate::selector::parse_list(
                &values["sidecarInjectorWebhook"]["neverInjectSelector"],
                "sidecarInjectorWebhook.neverInjectSelector",
            ),
            always_inject: crate::selector::parse_list(
                &values["sidecarInjectorWebhook"]["alwaysInjectSelector"],
                "sidecarInjectorWebhook.alwaysInjectSelector",
            ),
            rewrite_probes: flag(
                &values["sidecarInjectorWebhook"]["rewriteAppHTTPProbe"],
                true,
            ),
            hold_application: flag(&g["proxy"]["holdApplicationUntilProxyStarts"], false),
            token_audience: text(&g["sds"]["token"]["aud"], "istio-ca"),
            resources: match &g["proxy"]["resources"] {
                Value::Object(r) if !r.is_empty() => Value::Object(r.clone()),
                _ => default_resources,
            },
            proxy_config: match &values["meshConfig"]["defaultConfig"] {
                Value::Object(c) => Value::Object(c.clone()),
                _ => json!({}),
            },
        }
    }

    /// The proxy image: `proxy_image` itself when it names a registry path, else
    /// `<hub>/<proxy_image>:<tag>`.
    pub fn image(&self) -> String {
        if self.proxy_image.contains('/') {
            self.proxy_image.clone()
        } else {
            format!("{}/{}:{}", self.hub, self.proxy_image, self.tag)
        }
    }

    /// `istio.io/rev` as injection records it.
    pub fn revision_name(&self) -> &str {
        if self.revision.is_empty() {
            "default"
        } else {
            &self.revision
        }
    }
}
