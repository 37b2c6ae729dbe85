//! The Istio CRDs of the base chart (`charts/base/files/crd-all.gen.yaml`), generated from the
//! project's own API types.
//!
//! The mesh's types model the fields it reads, not every field Istio defines, so each object
//! in a schema keeps the fields it does not list (`x-kubernetes-preserve-unknown-fields`): the
//! API server checks the types of the fields the mesh reads and prunes nothing a user wrote.
//! Kinds the mesh does not read keep their whole spec as written. Defaults and required
//! fields are left out, so the API server neither adds fields nor refuses an object Istio's
//! own CRDs accept for a field the mesh merely has a default for.

mod catalog;

pub use catalog::{Column, Crd, AGE, CRDS};

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::generate::SchemaSettings;
use serde_json::{json, Map, Value};

/// Where the generated CRDs live, relative to the repository root.
pub const GENERATED_FILE: &str = "charts/base/files/crd-all.gen.yaml";

const HEADER: &str = "# Generated from the mesh's API types by mesh-charts (crates/charts/src/crds.rs); do not edit.\n# Regenerate: UPDATE_GOLDEN=1 cargo test -p mesh-charts --test crds\n";

/// A schema that cannot be a Kubernetes structural schema.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("the schema of {kind} is not a valid CRD schema: {source}")]
    Schema {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the schema of {kind} still refers to {reference}: make the type non-recursive")]
    Reference {
        kind: &'static str,
        reference: String,
    },
    #[error("cannot write the CRDs as YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

/// Every CRD, as the API server will receive it.
pub fn crds() -> Result<Vec<CustomResourceDefinition>, CrdError> {
    let mut settings = SchemaSettings::openapi3();
    settings.inline_subschemas = true;
    let mut generator = settings.into_generator();
    CRDS.iter()
        .map(|crd| definition(crd, &mut generator))
        .collect()
}

/// The text of [`GENERATED_FILE`]: the CRDs as YAML documents separated by `---`.
pub fn generate() -> Result<String, CrdError> {
    let mut out = String::from(HEADER);
    for (i, crd) in crds()?.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_yaml::to_string(crd)?);
    }
    Ok(out)
}

fn definition(
    crd: &Crd,
    generator: &mut schemars::SchemaGenerator,
) -> Result<CustomResourceDefinition, CrdError> {
    let spec = match crd.spec {
        Some(schema_of) => {
            let mut spec = schema_of(generator).to_value();
            structural(&mut spec);
            if let Some(reference) = find_reference(&spec) {
                return Err(CrdError::Reference {
                    kind: crd.kind,
                    reference,
                });
            }
            spec
        }
        None => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
    };
    let mut spec = spec;
    if let Some(fields) = spec.as_object_mut() {
        fields.insert("description".into(), Value::from(crd.description));
    }
    let mut root = json!({
        "type": "object",
        "properties": {
            "spec": spec,
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        },
    });
    if crd.spec_required {
        root["required"] = json!(["spec"]);
    }
    let schema: JSONSchemaProps =
        serde_json::from_value(root).map_err(|source| CrdError::Schema {
            kind: crd.kind,
            source,
        })?;
    Ok(CustomResourceDefinition {
        metadata: metadata(crd),
        spec: CustomResourceDefinitionSpec {
            group: crd.group.to_string(),
            names: CustomResourceDefinitionNames {
                kind: crd.kind.to_string(),
                list_kind: Some(format!("{}List", crd.kind)),
                plural: crd.plural.to_string(),
                singular: Some(crd.singular()),
                short_names: (!crd.short_names.is_empty())
                    .then(|| crd.short_names.iter().map(|s| s.to_string()).collect()),
                categories: Some(vec!["istio-io".to_string(), crd.group.replace('.', "-")]),
            },
            scope: "Namespaced".to_string(),
            versions: crd
                .versions
                .iter()
                .map(|version| CustomResourceDefinitionVersion {
                    name: version.to_string(),
                    served: true,
                    storage: *version == crd.storage,
                    additional_printer_columns: (!crd.columns.is_empty())
                        .then(|| crd.columns.iter().map(column).collect()),
                    schema: Some(CustomResourceValidation {
                        open_api_v3_schema: Some(schema.clone()),
                    }),
                    subresources: Some(CustomResourceSubresources {
                        status: Some(CustomResourceSubresourceStatus(Value::Object(Map::new()))),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
        status: None,
    })
}

/// The labels Istio's generated file carries (the chart replaces them when it renders).
fn metadata(crd: &Crd) -> ObjectMeta {
    let mut labels = BTreeMap::from(
        [
            ("app", "istio-pilot"),
            ("chart", "istio"),
            ("heritage", "Tiller"),
            ("release", "istio"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    match crd.group {
        "security.istio.io" => labels.insert("istio".into(), "security".into()),
        "telemetry.istio.io" => labels.insert("istio".into(), "telemetry".into()),
        _ => None,
    };
    ObjectMeta {
        name: Some(crd.name()),
        labels: Some(labels),
        annotations: crd
            .keep
            .then(|| BTreeMap::from([("helm.sh/resource-policy".to_string(), "keep".to_string())])),
        ..Default::default()
    }
}

fn column(c: &Column) -> CustomResourceColumnDefinition {
    CustomResourceColumnDefinition {
        name: c.name.to_string(),
        type_: if c.name == "Age" { "date" } else { "string" }.to_string(),
        json_path: c.json_path.to_string(),
        description: Some(c.description.to_string()),
        ..Default::default()
    }
}

/// Turns a schemars schema into a Kubernetes structural schema that types the fields the mesh
/// reads and keeps every other field.
fn structural(schema: &mut Value) {
    let Some(fields) = schema.as_object_mut() else {
        // `true`: any value (a `serde_json::Value` field).
        *schema = json!({"x-kubernetes-preserve-unknown-fields": true});
        return;
    };
    for key in [
        "$schema",
        "title",
        "default",
        "required",
        "examples",
        "description",
    ] {
        fields.remove(key);
    }
    if fields.is_empty() {
        fields.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
        return;
    }
    // `Option<T>`: schemars writes `type: [T, "null"]` (and a `null` among enum values);
    // Kubernetes wants one type and `nullable`.
    if let Some(Value::Array(types)) = fields.get("type") {
        let types: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        if let [only] = types.as_slice() {
            fields.insert("type".into(), only.clone());
            fields.insert("nullable".into(), true.into());
        }
    }
    if let Some(Value::Array(values)) = fields.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    // Kubernetes knows int32 / int64 / float / double; schemars also writes uint16 and the like.
    if let Some(Value::String(format)) = fields.get("format") {
        if !matches!(format.as_str(), "int32" | "int64" | "float" | "double") {
            fields.remove("format");
        }
    }
    if let Some(Value::Object(properties)) = fields.get_mut("properties") {
        for property in properties.values_mut() {
            structural(property);
        }
        fields.remove("additionalProperties");
        fields.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
    }
    for key in ["items", "additionalProperties"] {
        if let Some(inner) = fields.get_mut(key) {
            structural(inner);
        }
    }
}

/// The first `$ref` left in a schema, if any (Kubernetes schemas cannot refer).
fn find_reference(schema: &Value) -> Option<String> {
    match schema {
        Value::Object(fields) => fields
            .get("$ref")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| fields.values().find_map(find_reference)),
        Value::Array(items) => items.iter().find_map(find_reference),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
