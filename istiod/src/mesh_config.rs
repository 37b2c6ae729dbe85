//! Istio's mesh config on Kubernetes: the ConfigMap `istio` (`istio-<revision>` for another
//! revision) in istiod's namespace, whose `mesh` key holds MeshConfig as YAML (the install
//! renders it from `meshConfig` values). istiod reads the fields its model uses —
//! `trustDomain`, `rootNamespace`, `accessLogFile`, `outboundTrafficPolicy.mode` — over its
//! flags, at start and whenever the
//! ConfigMap changes. A change is applied without a restart, except the trust domain, which
//! the CA signs for and which takes effect at the next start. A `mesh` that does not parse is
//! logged naming the ConfigMap and the problem, and the last good config stays.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::model::ModelConfig;
use crate::push::ModelEvent;

/// The ConfigMap key holding MeshConfig.
pub const MESH_KEY: &str = "mesh";

/// The fields of MeshConfig istiod uses (others are ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshConfig {
    #[serde(default)]
    pub trust_domain: Option<String>,
    #[serde(default)]
    pub root_namespace: Option<String>,
    #[serde(default)]
    pub access_log_file: Option<String>,
    #[serde(default)]
    pub outbound_traffic_policy: Option<MeshOutboundTrafficPolicy>,
}

/// `outboundTrafficPolicy` of MeshConfig: only its mode is read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshOutboundTrafficPolicy {
    /// `REGISTRY_ONLY` or `ALLOW_ANY` (unset: ALLOW_ANY, the mesh default).
    #[serde(default)]
    pub mode: Option<mesh_api::OutboundTrafficMode>,
}

#[derive(Debug, thiserror::Error)]
pub enum MeshConfigError {
    #[error("ConfigMap {configmap} key `mesh` is not a valid MeshConfig: {detail}")]
    Invalid { configmap: String, detail: String },
    #[error("cannot read ConfigMap {configmap}: {detail}")]
    Read { configmap: String, detail: String },
}

/// The mesh config ConfigMap's name for `revision`.
pub fn configmap_name(revision: &str) -> String {
    if revision.is_empty() || revision == "default" {
        "istio".into()
    } else {
        format!("istio-{revision}")
    }
}

impl MeshConfig {
    /// Parses a ConfigMap's data (no `mesh` key: an empty MeshConfig).
    pub fn from_configmap(cm: &ConfigMap, configmap: &str) -> Result<MeshConfig, MeshConfigError> {
        let Some(text) = cm.data.as_ref().and_then(|d| d.get(MESH_KEY)) else {
            return Ok(MeshConfig::default());
        };
        if text.trim().is_empty() {
            return Ok(MeshConfig::default());
        }
        serde_yaml::from_str(text).map_err(|e| MeshConfigError::Invalid {
            configmap: configmap.to_string(),
            detail: e.to_string(),
        })
    }

    /// `base` (istiod's flags) with this config's fields over it; an empty field keeps the
    /// flag's value.
    pub fn over(&self, base: &ModelConfig) -> ModelConfig {
        let pick = |v: &Option<String>, default: &String| {
            v.clone()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.clone())
        };
        ModelConfig {
            trust_domain: pick(&self.trust_domain, &base.trust_domain),
            root_namespace: pick(&self.root_namespace, &base.root_namespace),
            // An empty accessLogFile is meaningful (no access log) when it is given.
            access_log_file: self
                .access_log_file
                .clone()
                .unwrap_or_else(|| base.access_log_file.clone()),
            outbound_registry_only: match self.outbound_traffic_policy.as_ref().and_then(|p| p.mode)
            {
                Some(mode) => mode == mesh_api::OutboundTrafficMode::RegistryOnly,
                None => base.outbound_registry_only,
            },
            ..base.clone()
        }
    }
}

/// Reads the mesh config once (at start); `None` when the ConfigMap does not exist.
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<MeshConfig>, MeshConfigError> {
    let configmap = format!("{namespace}/{name}");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(cm)) => MeshConfig::from_configmap(&cm, &configmap).map(Some),
        Ok(None) => Ok(None),
        Err(e) => Err(MeshConfigError::Read {
            configmap,
            detail: e.to_string(),
        }),
    }
}

/// Follows the ConfigMap until `events` closes: every change that alters the model's settings
/// is sent as [`ModelEvent::Reconfigure`]. `base` is istiod's flags; `current` what the model
/// runs with (its trust domain stays).
pub async fn watch(
    client: kube::Client,
    namespace: String,
    name: String,
    base: ModelConfig,
    mut current: ModelConfig,
    events: mpsc::Sender<ModelEvent>,
) {
    let configmap = format!("{namespace}/{name}");
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let selector = format!("metadata.name={name}");
    let mut stream = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    while let Some(ev) = stream.next().await {
        let mesh = match ev {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                match MeshConfig::from_configmap(&cm, &configmap) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::error!(error = %e, "mesh config ignored; the last good one stays");
                        continue;
                    }
                }
            }
            Ok(watcher::Event::Delete(_)) => MeshConfig::default(),
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(configmap = %configmap, error = %e, "mesh config watch failed; retrying");
                continue;
            }
        };
        let mut next = mesh.over(&base);
        if next.trust_domain != current.trust_domain {
            tracing::warn!(configmap = %configmap, running = %current.trust_domain, configured = %next.trust_domain,
                "the mesh config's trustDomain changed; it takes effect when istiod restarts");
            next.trust_domain = current.trust_domain.clone();
        }
        if next != current {
            tracing::info!(configmap = %configmap, root_namespace = %next.root_namespace, access_log_file = %next.access_log_file, "mesh config changed");
            current = next.clone();
            if events
                .send(ModelEvent::Reconfigure(Box::new(next)))
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(mesh: &str) -> ConfigMap {
        ConfigMap {
            data: Some([(MESH_KEY.to_string(), mesh.to_string())].into()),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn the_fields_istiod_uses_override_its_flags() {
        let base = ModelConfig::default();
        let m = MeshConfig::from_configmap(
            &cm("trustDomain: example.org\naccessLogFile: /dev/stdout\ndefaultConfig:\n  concurrency: 2\n"),
            "istio-system/istio",
        )
        .expect("parses");
        let cfg = m.over(&base);
        assert_eq!(cfg.trust_domain, "example.org");
        assert_eq!(cfg.access_log_file, "/dev/stdout");
        assert_eq!(
            cfg.root_namespace, base.root_namespace,
            "not given: the flag"
        );
        assert!(!cfg.outbound_registry_only, "not given: ALLOW_ANY");
        let registry_only = MeshConfig::from_configmap(
            &cm("outboundTrafficPolicy:\n  mode: REGISTRY_ONLY\n"),
            "istio-system/istio",
        )
        .expect("parses");
        assert!(registry_only.over(&base).outbound_registry_only);
        let bad = MeshConfig::from_configmap(
            &cm("outboundTrafficPolicy:\n  mode: SOMETIMES\n"),
            "istio-system/istio",
        )
        .expect_err("not a mode");
        assert!(bad.to_string().contains("SOMETIMES"), "{bad}");
        let cfg = MeshConfig::from_configmap(&ConfigMap::default(), "x")
            .expect("no data")
            .over(&base);
        assert_eq!(cfg, base);
    }

    #[test]
    fn a_bad_mesh_config_names_the_configmap_and_the_field() {
        let err = MeshConfig::from_configmap(&cm("accessLogFile: [1, 2]\n"), "istio-system/istio")
            .expect_err("a list is not a path");
        let text = err.to_string();
        assert!(
            text.contains("istio-system/istio") && text.contains("accessLogFile"),
            "{text}"
        );
        assert_eq!(configmap_name("default"), "istio");
        assert_eq!(configmap_name("canary"), "istio-canary");
    }
}
