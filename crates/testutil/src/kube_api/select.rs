//! Label and field selectors as the API server parses and applies them.

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` (`a=b,c!=d,e in (x,y),f notin (z),g,!h`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for ch in s.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    out.push(cur);
    out.into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn set_values(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                let vals = set_values(rest).ok_or_else(|| format!("bad set in {part:?}"))?;
                LabelReq::NotIn(k.trim().into(), vals)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                let vals = set_values(rest).ok_or_else(|| format!("bad set in {part:?}"))?;
                LabelReq::In(k.trim().into(), vals)
            } else if part.contains(' ') || part.contains('(') {
                return Err(format!("unable to parse requirement {part:?}"));
            } else {
                LabelReq::Exists(part)
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector` (`a=b`, `a==b`, `a!=b`, comma-separated).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// Fields every kind supports, and the extra ones Pods do (as the real server's field label
/// conversion allows; any other field is refused with 400).
const COMMON_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];
const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

impl FieldSelector {
    pub fn parse(s: &str, kind: &str) -> Result<FieldSelector, String> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, eq, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid field selector {part:?}"));
            };
            let key = key.trim();
            let known = COMMON_FIELDS.contains(&key)
                || (kind == "Pod" && POD_FIELDS.contains(&key))
                || (kind == "Secret" && key == "type");
            if !known {
                return Err(format!("field label not supported: {key}"));
            }
            reqs.push((key.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let mut v = obj;
            for p in path.split('.') {
                v = &v[p];
            }
            let got = match v {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (got == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let m = |s: &str| LabelSelector::parse(s).expect("parses").matches(&o);
        assert!(m("app=web"));
        assert!(m("app==web,tier"));
        assert!(m("app in (db, web),!missing"));
        assert!(!m("app notin (web)"));
        assert!(!m("app!=web"));
        assert!(m(""));
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "p", "namespace": "ns"},
                       "spec": {"nodeName": "node1"}, "status": {"phase": "Running"}});
        let m = |s: &str| FieldSelector::parse(s, "Pod").expect("parses").matches(&o);
        assert!(m("spec.nodeName=node1"));
        assert!(m("status.phase!=Failed,metadata.namespace=ns"));
        assert!(!m("spec.nodeName=node2"));
        assert!(FieldSelector::parse("spec.nodeName=x", "Service").is_err());
    }
}
