use std::path::Path;

use mesh_api::{Kind, ObjectKey};

use super::*;

fn parse(name: &str, text: &str) -> ParsedFile {
    parse_file(Path::new(name), text)
}

fn keys(parsed: &ParsedFile) -> Vec<String> {
    parsed
        .objects
        .iter()
        .map(|l| l.object.key().to_string())
        .collect()
}

#[test]
fn multi_document_yaml_skips_empty_documents() {
    let text = "\
---
# only a comment
---
apiVersion: v1
kind: Namespace
metadata: {name: a}
---

--- {apiVersion: v1, kind: Pod, metadata: {name: p, namespace: a}}
...
%YAML 1.2
---
apiVersion: v1
kind: Service
metadata:
  name: s
";
    let parsed = parse("m.yaml", text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert_eq!(
        keys(&parsed),
        ["Namespace/a", "Pod/a/p", "Service/default/s"]
    );
    let lines: Vec<usize> = parsed.objects.iter().map(|l| l.line).collect();
    assert_eq!(lines, [4, 9, 13]);
}

#[test]
fn lists_are_expanded_and_typed_lists_fill_in_kind() {
    let text = "\
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Namespace, metadata: {name: a}}
- apiVersion: v1
  kind: Pod
  metadata: {name: p}
---
apiVersion: v1
kind: PodList
items:
- metadata: {name: q, namespace: b}
";
    let parsed = parse("l.yaml", text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert_eq!(keys(&parsed), ["Namespace/a", "Pod/default/p", "Pod/b/q"]);
    assert_eq!(parsed.objects[1].line, 5);
}

#[test]
fn list_without_items_is_reported() {
    let parsed = parse("l.yaml", "apiVersion: v1\nkind: List\n");
    assert_eq!(parsed.errors.len(), 1);
    assert_eq!(parsed.errors[0].reason(), "list_without_items");
}

#[test]
fn syntax_error_is_fatal_and_located_in_the_file() {
    let text = "\
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: Pod
metadata:
  name: [unclosed
";
    let parsed = parse("dir/bad.yaml", text);
    assert!(parsed.fatal);
    assert!(parsed.objects.is_empty());
    let err = &parsed.errors[0];
    assert_eq!(err.reason(), "syntax");
    let line = err.line.expect("line");
    assert!((8..=9).contains(&line), "line {line}: {err}");
    assert!(err.column.is_some());
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("dir/bad.yaml:{line}:")),
        "{shown}"
    );
    assert!(!shown.contains(" at line "), "{shown}");
}

#[test]
fn invalid_document_is_reported_with_field_line_and_key() {
    let text = "\
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: Pod
metadata:
  name: x
spec:
  containers: []
  nodeName: 7
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: d}
";
    let parsed = parse("examples/bad.yaml", text);
    assert!(!parsed.fatal);
    assert_eq!(keys(&parsed), ["Namespace/a"]);
    assert_eq!(parsed.errors.len(), 2);
    let err = &parsed.errors[0];
    assert_eq!(err.line, Some(11));
    assert_eq!(err.document, Some(2));
    assert_eq!(err.field_path(), Some("spec.nodeName"));
    assert_eq!(err.key, Some(ObjectKey::new(Kind::Pod, "default", "x")));
    let shown = err.to_string();
    assert!(
        shown.starts_with(
            "examples/bad.yaml:11 (document 2): Pod default/x: invalid field spec.nodeName: "
        ),
        "{shown}"
    );
    assert_eq!(parsed.kept, [ObjectKey::new(Kind::Pod, "default", "x")]);
    let unsupported = &parsed.errors[1];
    assert_eq!(unsupported.reason(), "unsupported_kind");
    assert_eq!(unsupported.line, Some(14));
    assert_eq!(unsupported.key, None);
}

#[test]
fn single_document_errors_show_no_document_index() {
    let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  nodeName: [1]\n";
    let parsed = parse("bad.yaml", text);
    let shown = parsed.errors[0].to_string();
    assert!(
        shown.starts_with("bad.yaml:6: Pod default/x: invalid field spec.nodeName: "),
        "{shown}"
    );
}

#[test]
fn non_mapping_document_is_reported() {
    let parsed = parse("s.yaml", "just a string\n");
    assert_eq!(parsed.errors[0].reason(), "not_an_object");
    assert!(!parsed.fatal);
}

#[test]
fn json_files_hold_one_or_more_values() {
    let text = "{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"a\"}}\n\
                {\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"b\"}}\n";
    let parsed = parse("n.json", text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert_eq!(keys(&parsed), ["Namespace/a", "Namespace/b"]);
    assert_eq!(parsed.objects[1].line, 2);

    let bad = parse("n.json", "{\"kind\": \"Namespace\",\n \"metadata\": }\n");
    assert!(bad.fatal);
    assert_eq!(bad.errors[0].line, Some(2));
    assert!(bad.errors[0].to_string().contains("malformed JSON"));
}

#[test]
fn untyped_key_defaults_namespace_and_ignores_unknown_kinds() {
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    assert_eq!(
        untyped_key(&pod),
        Some(ObjectKey::new(Kind::Pod, "default", "p"))
    );
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "n", "namespace": "x"}});
    assert_eq!(
        untyped_key(&ns),
        Some(ObjectKey::new(Kind::Namespace, "", "n"))
    );
    let other = serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "d"}});
    assert_eq!(untyped_key(&other), None);
}
