//! Label selectors of the injector's `neverInjectSelector` / `alwaysInjectSelector` (Kubernetes
//! `LabelSelector`s: `matchLabels` and `matchExpressions` with `In`, `NotIn`, `Exists` and
//! `DoesNotExist`, all of one selector ANDed). As Istio's injector reads them: an invalid
//! selector is left out with a warning, and an empty one (`{}`) matches no pod.

use std::collections::BTreeMap;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

/// One selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    match_labels: BTreeMap<String, String>,
    expressions: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses one selector; the error says what is wrong with it.
    pub fn parse(value: &Value) -> Result<LabelSelector, String> {
        let Value::Object(object) = value else {
            return Err(format!("{value} is not a label selector"));
        };
        let mut selector = LabelSelector::default();
        match object.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (k, v) in labels {
                    let v = v
                        .as_str()
                        .ok_or_else(|| format!("matchLabels.{k} is not a string"))?;
                    selector.match_labels.insert(k.clone(), v.to_string());
                }
            }
            Some(other) => return Err(format!("matchLabels {other} is not a map")),
        }
        let expressions = match object.get("matchExpressions") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => list.clone(),
            Some(other) => return Err(format!("matchExpressions {other} is not a list")),
        };
        for e in expressions {
            let key = e["key"].as_str().filter(|k| !k.is_empty());
            let key = key.ok_or_else(|| format!("{e} has no key"))?.to_string();
            let values: Vec<String> = match &e["values"] {
                Value::Null => Vec::new(),
                Value::Array(v) => v
                    .iter()
                    .map(|x| x.as_str().map(String::from))
                    .collect::<Option<_>>()
                    .ok_or_else(|| format!("{key}: values must be strings"))?,
                other => return Err(format!("{key}: values {other} is not a list")),
            };
            let operator = match e["operator"].as_str().unwrap_or_default() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(format!("{other:?} is not a valid pod selector operator")),
            };
            let needs_values = matches!(operator, Operator::In | Operator::NotIn);
            if needs_values == values.is_empty() {
                return Err(match needs_values {
                    true => format!("{key}: In and NotIn need values"),
                    false => format!("{key}: Exists and DoesNotExist take no values"),
                });
            }
            selector.expressions.push(Requirement {
                key,
                operator,
                values,
            });
        }
        Ok(selector)
    }

    /// Whether the selector has no requirement at all (it then selects nothing here).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.expressions.is_empty()
    }

    /// Whether `labels` meet every requirement.
    pub fn matches(&self, labels: &Value) -> bool {
        let label = |k: &str| labels[k].as_str();
        self.match_labels
            .iter()
            .all(|(k, v)| label(k) == Some(v.as_str()))
            && self.expressions.iter().all(|r| {
                let got = label(&r.key);
                match r.operator {
                    Operator::In => got.is_some_and(|g| r.values.iter().any(|v| v == g)),
                    Operator::NotIn => got.is_none_or(|g| r.values.iter().all(|v| v != g)),
                    Operator::Exists => got.is_some(),
                    Operator::DoesNotExist => got.is_none(),
                }
            })
    }
}

/// The selectors of a list value; invalid ones are left out with a warning naming `what`.
pub fn parse_list(value: &Value, what: &str) -> Vec<LabelSelector> {
    let Value::Array(list) = value else {
        if !value.is_null() {
            tracing::warn!(value = %value, "{what} is not a list of label selectors; ignored");
        }
        return Vec::new();
    };
    list.iter()
        .filter_map(|s| match LabelSelector::parse(s) {
            Ok(selector) => Some(selector),
            Err(why) => {
                tracing::warn!(selector = %s, "invalid selector for {what}: {why}; ignored");
                None
            }
        })
        .collect()
}

/// Whether a non-empty selector of `selectors` matches the pod's `labels`.
pub fn any_matches(selectors: &[LabelSelector], labels: &Value) -> bool {
    selectors.iter().any(|s| !s.is_empty() && s.matches(labels))
}
