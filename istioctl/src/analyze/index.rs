//! Where each object of a manifest directory starts (file and 1-based line), and the Gateway
//! API Gateways in it (the loader does not read that kind yet; waypoints are Gateways).
//!
//! Walks the directory with the loader's rules (visible `.yaml`/`.yml`/`.json` files, hidden
//! entries and directory symlinks skipped) and splits YAML at `---`/`...` lines as the loader
//! does, so an object's line is the first content line of its document (or its `items` entry).
//! Files that do not parse are skipped here: the loader reports them.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// `(kind, namespace, name)`; namespace empty for cluster-scoped kinds.
pub type Key = (String, String, String);

/// Object locations and Gateways of one directory.
#[derive(Debug, Default)]
pub struct Index {
    lines: HashMap<(PathBuf, Key), usize>,
    /// `(namespace, name)` of each `gateway.networking.k8s.io` Gateway.
    pub gateways: BTreeSet<(String, String)>,
    /// Where each Gateway is defined.
    pub gateway_files: Vec<(PathBuf, usize)>,
}

const GATEWAY_GROUP: &str = "gateway.networking.k8s.io/";
const CLUSTER_SCOPED: [&str; 2] = ["Namespace", "GatewayClass"];

impl Index {
    /// Indexes every manifest under `root`.
    pub fn build(root: &Path) -> Index {
        let mut index = Index::default();
        let mut files = Vec::new();
        walk(root, &mut files);
        for file in files {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            for (value, line) in documents(&file, &text) {
                index.add(&file, &value, line);
            }
        }
        index
    }

    /// The line of an object in `file`, if found.
    pub fn line(&self, file: &Path, kind: &str, namespace: &str, name: &str) -> Option<usize> {
        let key = (kind.to_string(), namespace.to_string(), name.to_string());
        self.lines.get(&(file.to_path_buf(), key)).copied()
    }

    /// Whether `value` is a Gateway API Gateway.
    pub fn is_gateway(api_version: &str, kind: &str) -> bool {
        kind == "Gateway" && api_version.starts_with(GATEWAY_GROUP)
    }

    fn add(&mut self, file: &Path, value: &Value, line: usize) {
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let namespace = if CLUSTER_SCOPED.contains(&kind) {
            ""
        } else {
            value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .filter(|ns| !ns.is_empty())
                .unwrap_or("default")
        };
        let api_version = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if Index::is_gateway(api_version, kind) {
            self.gateways
                .insert((namespace.to_string(), name.to_string()));
            self.gateway_files.push((file.to_path_buf(), line));
        }
        let key = (kind.to_string(), namespace.to_string(), name.to_string());
        self.lines.entry((file.to_path_buf(), key)).or_insert(line);
    }
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

pub(crate) fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    if dir.is_file() {
        files.push(dir.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if is_hidden(&entry.file_name()) {
            continue;
        }
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        if file_type.is_dir() {
            walk(&path, files);
        } else if path
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        {
            files.push(path);
        }
    }
}

/// The objects of a file with their 1-based lines (`List` documents expanded).
fn documents(file: &Path, text: &str) -> Vec<(Value, usize)> {
    let chunks = if file.extension().is_some_and(|e| e == "json") {
        json_chunks(text)
    } else {
        yaml_chunks(text)
    };
    let mut out = Vec::new();
    for (value, start, body) in chunks {
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match value.get("items").and_then(Value::as_array) {
            Some(items) if kind.ends_with("List") => {
                let lines = item_lines(&body);
                for (i, item) in items.iter().enumerate() {
                    let line = lines.get(i).map_or(start, |l| start + l);
                    out.push((item.clone(), line + 1));
                }
            }
            _ => out.push((value, start + 1)),
        }
    }
    out
}

/// YAML documents: value, 0-based first content line, and the document's text from there.
fn yaml_chunks(text: &str) -> Vec<(Value, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut start = 0;
    for i in 0..=lines.len() {
        let marker = lines.get(i).is_none_or(|l| {
            ["---", "..."]
                .iter()
                .any(|m| *l == *m || l.starts_with(&format!("{m} ")))
        });
        if !marker {
            continue;
        }
        let first = (start..i).find(|&j| {
            let t = lines[j].trim();
            !t.is_empty() && !t.starts_with('#') && !lines[j].starts_with('%')
        });
        if let Some(first) = first {
            let body = lines[first..i].join("\n");
            if let Ok(value) = serde_yaml::from_str::<Value>(&body) {
                if value.is_object() {
                    out.push((value, first, body));
                }
            }
        }
        start = i + 1;
    }
    out
}

fn json_chunks(text: &str) -> Vec<(Value, usize, String)> {
    let mut out = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let mut offset = 0;
    while let Some(Ok(value)) = stream.next() {
        let skipped = text[offset..].len() - text[offset..].trim_start().len();
        let start = text[..offset + skipped].matches('\n').count();
        let end = stream.byte_offset();
        let body = text[offset + skipped..end].to_string();
        offset = end;
        out.push((value, start, body));
    }
    out
}

/// 0-based lines (relative to the document) where each `items` entry starts, for block-style
/// YAML (`- ` entries under `items:`) or pretty JSON (`{` lines under `"items"`).
fn item_lines(body: &str) -> Vec<usize> {
    let lines: Vec<&str> = body.lines().collect();
    let Some(items_at) = lines.iter().position(|l| {
        let t = l.trim_start().trim_start_matches('"');
        t.starts_with("items")
            && t.trim_start_matches("items")
                .trim_start_matches('"')
                .starts_with(':')
    }) else {
        return Vec::new();
    };
    let mut indent = None;
    let mut starts = Vec::new();
    for (j, line) in lines.iter().enumerate().skip(items_at + 1) {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let col = line.len() - t.len();
        let is_entry = t.starts_with("- ") || t == "-" || t.starts_with('{');
        match indent {
            None if is_entry => {
                indent = Some(col);
                starts.push(j);
            }
            Some(c) if col == c && is_entry => starts.push(j),
            Some(c) if col < c => break,
            _ => {}
        }
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_documents_and_list_items() {
        let yaml = "# comment\napiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n---\n\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata:\n    name: s1\n    namespace: x\n- apiVersion: v1\n  kind: Service\n  metadata: {name: s2}\n";
        let docs = documents(Path::new("f.yaml"), yaml);
        let found: Vec<(String, usize)> = docs
            .iter()
            .map(|(v, l)| (v["metadata"]["name"].as_str().unwrap_or("").to_string(), *l))
            .collect();
        assert_eq!(
            found,
            vec![("a".into(), 2), ("s1".into(), 11), ("s2".into(), 16)]
        );
    }

    #[test]
    fn json_documents_start_where_they_begin() {
        let json = "\n{\"kind\": \"Pod\", \"metadata\": {\"name\": \"p\"}}\n{\"kind\": \"Namespace\",\n \"metadata\": {\"name\": \"n\"}}\n";
        let docs = documents(Path::new("f.json"), json);
        let lines: Vec<usize> = docs.iter().map(|(_, l)| *l).collect();
        assert_eq!(lines, vec![2, 3]);
    }
}
