//! `istioctl manifest generate`: the objects an install writes, rendered by the same charts a
//! Helm user installs, with the same values.
//!
//! The profile chooses the components (istioctl's profiles) and is passed on to every chart,
//! whose own profile file sets the values. The spec's `values` go to every chart as they are;
//! `hub`, `tag`, `revision`, `namespace` and `meshConfig` land where the charts read them.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::operator::{merge, OperatorSpec};
use crate::{Helm, HelmError, Object};

/// One installable part, in install order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Base,
    Pilot,
    Cni,
    Ztunnel,
}

impl Component {
    pub const ALL: [Component; 4] = [
        Component::Base,
        Component::Pilot,
        Component::Cni,
        Component::Ztunnel,
    ];

    /// The name in `spec.components` and in `operator.istio.io/component`.
    pub fn name(self) -> &'static str {
        match self {
            Component::Base => "Base",
            Component::Pilot => "Pilot",
            Component::Cni => "Cni",
            Component::Ztunnel => "Ztunnel",
        }
    }

    /// The component an `operator.istio.io/component` value names.
    pub fn from_name(name: &str) -> Option<Component> {
        Component::ALL.into_iter().find(|c| c.name() == name)
    }

    fn spec_key(self) -> &'static str {
        match self {
            Component::Base => "base",
            Component::Pilot => "pilot",
            Component::Cni => "cni",
            Component::Ztunnel => "ztunnel",
        }
    }

    /// The chart under `charts/` and its release name.
    pub fn chart(self) -> (&'static str, &'static str) {
        match self {
            Component::Base => ("base", "istio-base"),
            Component::Pilot => ("istiod", "istiod"),
            Component::Cni => ("cni", "istio-cni"),
            Component::Ztunnel => ("ztunnel", "ztunnel"),
        }
    }
}

/// The profiles istioctl knows.
pub const OPERATOR_PROFILES: [&str; 5] = ["default", "ambient", "demo", "minimal", "empty"];

/// Why a manifest cannot be generated.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("unknown profile {0:?}: choose one of default, ambient, demo, minimal, empty")]
    UnknownProfile(String),
    #[error("spec.components.{component}.enabled must be true or false, not {value}")]
    BadEnabled {
        component: &'static str,
        value: Value,
    },
    #[error("spec.{field} must be a mapping")]
    NotMapping { field: &'static str },
    #[error(
        "unknown component spec.components.{0}: this mesh installs base, pilot, cni and ztunnel"
    )]
    UnknownComponent(String),
    #[error("spec.components.{component}.{field} is not supported: set the chart's values under spec.values instead")]
    UnsupportedSetting { component: String, field: String },
    #[error("spec.components.{0}: there is no gateway chart yet, so no gateway can be enabled")]
    Gateway(String),
    #[error("component {component}: {source}")]
    Render {
        component: &'static str,
        #[source]
        source: HelmError,
    },
}

/// The components a profile installs (istioctl's profiles; a chart cannot choose them).
pub fn profile_components(profile: &str) -> Result<Vec<Component>, ManifestError> {
    use Component::*;
    Ok(match profile {
        "default" | "demo" | "minimal" => vec![Base, Pilot],
        "ambient" => vec![Base, Pilot, Cni, Ztunnel],
        "empty" => vec![],
        other => return Err(ManifestError::UnknownProfile(other.to_string())),
    })
}

/// What `manifest generate` produced.
#[derive(Debug, Clone, Default)]
pub struct Manifest {
    /// Each component with its objects, in install order.
    pub components: Vec<(Component, Vec<Object>)>,
    /// What was asked for and is not installed (the ingress gateways of some profiles).
    pub notes: Vec<String>,
    /// The profile the spec chose (`default` when it chose none).
    pub profile: String,
    /// The revision (`default` when the spec names none), as in the `istio.io/rev` label.
    pub revision: String,
    /// The namespace the control plane goes to (`values.global.istioNamespace`).
    pub namespace: String,
    /// `values.global.network`, which labels the namespace an install creates.
    pub network: Option<String>,
}

impl Manifest {
    /// Every object as YAML documents, in install order.
    pub fn to_yaml(&self) -> Result<String, serde_yaml::Error> {
        let mut out = String::new();
        for object in self.components.iter().flat_map(|(_, objects)| objects) {
            out.push_str("---\n");
            out.push_str(&serde_yaml::to_string(&object.value)?);
        }
        Ok(out)
    }
}

/// Renders what `spec` installs from the charts in `charts`.
pub fn generate(
    helm: &Helm,
    charts: &Path,
    spec: &OperatorSpec,
) -> Result<Manifest, ManifestError> {
    let profile = spec
        .string("profile")
        .unwrap_or_else(|| "default".to_string());
    let mut enabled = profile_components(&profile)?;
    let components = match spec.0.get("components") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => {
            return Err(ManifestError::NotMapping {
                field: "components",
            })
        }
    };
    for (key, settings) in &components {
        let known = Component::ALL.iter().any(|c| c.spec_key() == key);
        let gateways = matches!(key.as_str(), "ingressGateways" | "egressGateways");
        if !known && !gateways {
            return Err(ManifestError::UnknownComponent(key.clone()));
        }
        if gateways {
            check_gateways(key, settings)?;
            continue;
        }
        let Value::Object(fields) = settings else {
            return Err(ManifestError::NotMapping {
                field: "components.<component>",
            });
        };
        if let Some(field) = fields.keys().find(|f| f.as_str() != "enabled") {
            return Err(ManifestError::UnsupportedSetting {
                component: key.clone(),
                field: field.clone(),
            });
        }
    }
    for component in Component::ALL {
        match &components.get(component.spec_key()).map(|c| &c["enabled"]) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(true)) if !enabled.contains(&component) => enabled.push(component),
            Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => enabled.retain(|c| *c != component),
            Some(other) => {
                return Err(ManifestError::BadEnabled {
                    component: component.spec_key(),
                    value: (*other).clone(),
                })
            }
        }
    }
    let mut manifest = Manifest {
        profile: profile.clone(),
        ..Manifest::default()
    };
    if matches!(profile.as_str(), "default" | "demo") {
        manifest.notes.push(format!(
            "profile {profile} also has Istio's ingress gateway{}; it is not installed (there is no gateway chart yet)",
            if profile == "demo" { " and egress gateway" } else { "" }
        ));
    }
    let values = chart_values(spec, &profile)?;
    let revision = spec
        .string("revision")
        .unwrap_or_else(|| "default".to_string());
    let namespace = values["global"]["istioNamespace"]
        .as_str()
        .unwrap_or("istio-system")
        .to_string();
    manifest.network = values["global"]["network"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    for component in Component::ALL.into_iter().filter(|c| enabled.contains(c)) {
        let (chart, release) = component.chart();
        let rendered = helm
            .render(&charts.join(chart), release, &namespace, &values)
            .map_err(|source| ManifestError::Render {
                component: component.name(),
                source,
            })?;
        let objects = rendered
            .objects
            .into_iter()
            .map(|mut object| {
                label(&mut object.value, component, &revision);
                object
            })
            .collect();
        manifest.components.push((component, objects));
    }
    manifest.revision = revision;
    manifest.namespace = namespace;
    Ok(manifest)
}

/// Gateways cannot be installed: only a list of disabled ones is accepted.
fn check_gateways(key: &str, settings: &Value) -> Result<(), ManifestError> {
    let enabled = settings
        .as_array()
        .into_iter()
        .flatten()
        .any(|g| g["enabled"] != Value::Bool(false));
    if enabled || !settings.is_array() {
        return Err(ManifestError::Gateway(key.to_string()));
    }
    Ok(())
}

/// The values every chart gets: the spec's own fields, with the spec's values over them.
pub fn chart_values(spec: &OperatorSpec, profile: &str) -> Result<Value, ManifestError> {
    let values = match spec.0.get("values") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(ManifestError::NotMapping { field: "values" }),
    };
    let mut global = Map::new();
    for (field, key) in [
        ("hub", "hub"),
        ("tag", "tag"),
        ("namespace", "istioNamespace"),
    ] {
        if let Some(value) = spec.string(field) {
            global.insert(key.to_string(), Value::String(value));
        }
    }
    let mut top = Map::new();
    top.insert("global".to_string(), Value::Object(global));
    if let Some(revision) = spec.string("revision") {
        top.insert("revision".to_string(), Value::String(revision));
    }
    match spec.0.get("meshConfig") {
        None | Some(Value::Null) => {}
        Some(Value::Object(mesh)) => {
            top.insert("meshConfig".to_string(), Value::Object(mesh.clone()));
        }
        Some(_) => {
            return Err(ManifestError::NotMapping {
                field: "meshConfig",
            })
        }
    }
    // The spec's own fields become values first; what the user wrote under `values` wins, as
    // in Istio's istioctl.
    merge(&mut top, values);
    // The profile that chose the components is the one the charts apply.
    top.insert("profile".to_string(), Value::String(profile.to_string()));
    Ok(Value::Object(top))
}

/// The label naming the component an object belongs to.
pub const COMPONENT_LABEL: &str = "operator.istio.io/component";
/// The label an object keeps to be left alone by pruning.
pub const NOT_PRUNED_LABEL: &str = "install.operator.istio.io/owning-resource-not-pruned";
/// The version in `operator.istio.io/version`.
pub const OPERATOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The labels istioctl puts on everything it installs for `revision`, the component's own
/// last. Pruning selects on the same labels.
pub fn owner_labels(component: Option<Component>, revision: &str) -> Vec<(&'static str, String)> {
    let mut labels = vec![
        ("operator.istio.io/managed", "Reconcile".to_string()),
        ("operator.istio.io/version", OPERATOR_VERSION.to_string()),
        ("istio.io/rev", revision.to_string()),
    ];
    if let Some(c) = component {
        labels.push((COMPONENT_LABEL, c.name().to_string()));
    }
    labels
}

/// Puts the owner labels on an object (a chart's own win).
fn label(object: &mut Value, component: Component, revision: &str) {
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let existing = metadata.entry("labels").or_insert_with(|| json!({}));
    if let Some(map) = existing.as_object_mut() {
        for (key, value) in owner_labels(Some(component), revision) {
            map.entry(key.to_string()).or_insert(Value::String(value));
        }
    }
}
