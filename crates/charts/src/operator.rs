//! What a user asks istioctl to install: an IstioOperator's `spec`, built from `-f` files and
//! `--set` flags in order, as Istio's istioctl merges them.
//!
//! `--set` paths are relative to `spec` (`profile=ambient`, `values.global.hub=x`,
//! `meshConfig.accessLogFile=/dev/stdout`, `components.cni.enabled=true`); a value that reads
//! as a boolean or a number is one, anything else is a string.

use std::path::Path;

use serde_json::{Map, Value};

/// The fields of an IstioOperator `spec` this mesh reads.
pub const SPEC_FIELDS: [&str; 8] = [
    "profile",
    "hub",
    "tag",
    "namespace",
    "revision",
    "values",
    "meshConfig",
    "components",
];

/// A `-f` file or `--set` flag that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("--set {0}: expected <path>=<value>, as in --set values.global.hub=docker.io/istio")]
    NotAssignment(String),
    #[error("--set {flag}: {problem}")]
    BadPath { flag: String, problem: String },
    #[error("{file}: cannot read it: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not YAML: {source}")]
    Yaml {
        file: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{file}: {problem}")]
    NotOperator { file: String, problem: String },
    #[error("{origin}: unknown field spec.{field}; IstioOperator's spec has {known}")]
    UnknownField {
        origin: String,
        field: String,
        known: String,
    },
}

impl SpecError {
    /// A short label for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SpecError::NotAssignment(_) => "not_assignment",
            SpecError::BadPath { .. } => "bad_path",
            SpecError::Read { .. } => "read",
            SpecError::Yaml { .. } => "yaml",
            SpecError::NotOperator { .. } => "not_operator",
            SpecError::UnknownField { .. } => "unknown_field",
        }
    }
}

/// The merged `spec`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorSpec(pub Map<String, Value>);

impl OperatorSpec {
    /// Lays an IstioOperator file over the spec (`-f`).
    pub fn merge_file(&mut self, path: &Path) -> Result<(), SpecError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            file: file.clone(),
            source,
        })?;
        self.merge_text(&file, &text)
    }

    /// Lays the text of an IstioOperator over the spec; `origin` names it in errors.
    pub fn merge_text(&mut self, origin: &str, text: &str) -> Result<(), SpecError> {
        let not_operator = |problem: &str| SpecError::NotOperator {
            file: origin.to_string(),
            problem: problem.to_string(),
        };
        let doc: Value = serde_yaml::from_str(text).map_err(|source| SpecError::Yaml {
            file: origin.to_string(),
            source,
        })?;
        if doc["kind"] != "IstioOperator" {
            return Err(not_operator(
                "not an IstioOperator (kind: IstioOperator, apiVersion: install.istio.io/v1alpha1)",
            ));
        }
        let spec = match &doc["spec"] {
            Value::Null => Map::new(),
            Value::Object(spec) => spec.clone(),
            _ => return Err(not_operator("spec is not a mapping")),
        };
        for field in spec.keys() {
            check_field(origin, field)?;
        }
        merge(&mut self.0, spec);
        Ok(())
    }

    /// Applies one `--set path=value`.
    pub fn set(&mut self, flag: &str) -> Result<(), SpecError> {
        let (path, raw) = flag
            .split_once('=')
            .ok_or_else(|| SpecError::NotAssignment(flag.to_string()))?;
        let keys = segments(path);
        let bad = |problem: String| SpecError::BadPath {
            flag: flag.to_string(),
            problem,
        };
        if keys.iter().any(|k| k.is_empty()) {
            return Err(bad(format!("'{path}' has an empty segment")));
        }
        if keys.iter().any(|k| k.contains('[')) {
            return Err(bad(format!(
                "'{path}' selects a list item; list selectors are not supported: use -f with an IstioOperator file"
            )));
        }
        check_field(&format!("--set {flag}"), &keys[0])?;
        let value = if is_string_path(&keys) {
            Value::String(raw.to_string())
        } else {
            scalar(raw)
        };
        let mut at = &mut self.0;
        for (depth, key) in keys.iter().enumerate() {
            if depth + 1 == keys.len() {
                at.insert(key.clone(), value);
                break;
            }
            let next = at
                .entry(key.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            at = match next {
                Value::Object(map) => map,
                other => {
                    return Err(SpecError::BadPath {
                        flag: flag.to_string(),
                        problem: format!(
                            "{} is {other}, not a mapping, so it has no field {}",
                            keys[..=depth].join("."),
                            keys[depth + 1]
                        ),
                    })
                }
            };
        }
        Ok(())
    }

    /// A string field of the spec (`profile`, `hub`, ...), if set.
    pub fn string(&self, field: &str) -> Option<String> {
        match self.0.get(field)? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

fn check_field(origin: &str, field: &str) -> Result<(), SpecError> {
    if SPEC_FIELDS.contains(&field) {
        return Ok(());
    }
    Err(SpecError::UnknownField {
        origin: origin.to_string(),
        field: field.to_string(),
        known: SPEC_FIELDS.join(", "),
    })
}

/// A `--set` path split at its dots; `\.` is a dot inside a key
/// (`values.pilot.podAnnotations.sidecar\.istio\.io/inject`).
fn segments(path: &str) -> Vec<String> {
    let mut keys = vec![String::new()];
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'.') => {
                chars.next();
                if let Some(key) = keys.last_mut() {
                    key.push('.');
                }
            }
            '.' => keys.push(String::new()),
            c => {
                if let Some(key) = keys.last_mut() {
                    key.push(c);
                }
            }
        }
    }
    keys
}

/// Paths Istio always keeps as strings: image tags (`1.20` is no number) and proxy metadata.
fn is_string_path(keys: &[String]) -> bool {
    let path: Vec<&str> = keys.iter().map(String::as_str).collect();
    let in_proxy_metadata = path.len() > 1 && path[path.len() - 2] == "proxyMetadata";
    in_proxy_metadata
        || matches!(
            path.as_slice(),
            ["tag"] | ["values", "global", "tag"] | ["values", "compatibilityVersion"]
        )
}

/// Booleans (Go's spellings) and numbers as such; everything else a string (Istio's --set).
fn scalar(raw: &str) -> Value {
    match raw {
        "true" | "True" | "TRUE" | "t" | "T" => Value::Bool(true),
        "false" | "False" | "FALSE" | "f" | "F" => Value::Bool(false),
        _ => raw
            .parse::<i64>()
            .map(Value::from)
            .ok()
            .or_else(|| {
                raw.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite() && raw.contains(['.', 'e', 'E']))
                    .and_then(|f| serde_json::Number::from_f64(f).map(Value::Number))
            })
            .unwrap_or_else(|| Value::String(raw.to_string())),
    }
}

/// Lays `over` onto `base`: mappings merge key by key, anything else replaces.
pub fn merge(base: &mut Map<String, Value>, over: Map<String, Value>) {
    for (key, value) in over {
        let value = match (base.get_mut(&key), value) {
            (Some(Value::Object(into)), Value::Object(from)) => {
                merge(into, from);
                continue;
            }
            (_, value) => value,
        };
        base.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sets_and_files_merge_in_order() {
        let mut spec = OperatorSpec::default();
        spec.merge_text(
            "f.yaml",
            "apiVersion: install.istio.io/v1alpha1\nkind: IstioOperator\nspec:\n  profile: demo\n  values:\n    global:\n      hub: a\n      tag: \"1.0\"\n",
        )
        .expect("file");
        spec.set("profile=ambient").expect("profile");
        spec.set("values.global.hub=b").expect("hub");
        spec.set("values.pilot.autoscaleEnabled=false")
            .expect("bool");
        spec.set("values.pilot.replicaCount=2").expect("int");
        spec.set("values.pilot.traceSampling=0.5").expect("float");
        spec.set("meshConfig.accessLogFile=/dev/stdout")
            .expect("mesh");
        assert_eq!(
            Value::Object(spec.0.clone()),
            json!({
                "profile": "ambient",
                "values": {
                    "global": {"hub": "b", "tag": "1.0"},
                    "pilot": {"autoscaleEnabled": false, "replicaCount": 2, "traceSampling": 0.5}
                },
                "meshConfig": {"accessLogFile": "/dev/stdout"}
            })
        );
        assert_eq!(spec.string("profile").as_deref(), Some("ambient"));
    }

    #[test]
    fn tags_and_proxy_metadata_stay_strings_and_escaped_dots_stay_in_keys() {
        let mut spec = OperatorSpec::default();
        for flag in [
            "tag=1.20",
            "values.global.tag=1.20",
            "meshConfig.defaultConfig.proxyMetadata.ISTIO_META_DNS_CAPTURE=true",
            r"values.pilot.podAnnotations.sidecar\.istio\.io/inject=false",
            "components.cni.enabled=True",
            "values.pilot.traceSampling=1e2",
        ] {
            spec.set(flag).expect(flag);
        }
        assert_eq!(
            Value::Object(spec.0.clone()),
            json!({
                "tag": "1.20",
                "values": {
                    "global": {"tag": "1.20"},
                    "pilot": {"podAnnotations": {"sidecar.istio.io/inject": false}, "traceSampling": 100.0}
                },
                "meshConfig": {"defaultConfig": {"proxyMetadata": {"ISTIO_META_DNS_CAPTURE": "true"}}},
                "components": {"cni": {"enabled": true}}
            })
        );
        let err = spec
            .set("components.ingressGateways[0].enabled=false")
            .expect_err("list selector");
        assert!(
            err.to_string().contains("list selectors are not supported"),
            "{err}"
        );
    }

    #[test]
    fn bad_paths_and_files_are_named() {
        let mut spec = OperatorSpec::default();
        let err = spec.set("valuse.global.hub=x").expect_err("typo");
        assert!(
            err.to_string()
                .starts_with("--set valuse.global.hub=x: unknown field spec.valuse;"),
            "{err}"
        );
        let err = spec.set("profile").expect_err("no value");
        assert!(matches!(err, SpecError::NotAssignment(_)), "{err}");
        spec.set("values.global=flat").expect("a string");
        let err = spec
            .set("values.global.hub=x")
            .expect_err("through a string");
        assert_eq!(
            err.to_string(),
            "--set values.global.hub=x: values.global is \"flat\", not a mapping, so it has no field hub"
        );
        let err = spec.set("values..hub=x").expect_err("empty segment");
        assert!(err.to_string().contains("empty segment"), "{err}");

        let err = spec
            .merge_text(
                "typo.yaml",
                "kind: IstioOperator\nspec:\n  profle: ambient\n",
            )
            .expect_err("typo");
        assert!(
            err.to_string()
                .starts_with("typo.yaml: unknown field spec.profle"),
            "{err}"
        );
        let err = spec
            .merge_text("cm.yaml", "kind: ConfigMap\n")
            .expect_err("not an operator");
        assert!(err.to_string().contains("not an IstioOperator"), "{err}");
    }
}
