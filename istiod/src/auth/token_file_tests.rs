use std::io::Write;

use tonic::metadata::MetadataValue;

use super::*;

const FILE: &str = r#"
tokens:
- token: "s3cr3t-node1"
  identity: spiffe://cluster.local/ns/istio-system/sa/ztunnel
  node: node1
- token: "app-token"
  identity: spiffe://cluster.local/ns/default/sa/app
  expires: 2999-01-01T00:00:00Z
- token: "old-token"
  identity: spiffe://cluster.local/ns/default/sa/old
  expires: 2001-01-01T00:00:00Z
"#;

fn md(value: Option<&str>) -> MetadataMap {
    let mut md = MetadataMap::new();
    if let Some(v) = value {
        md.insert("authorization", MetadataValue::try_from(v).expect("ascii"));
    }
    md
}

fn write(path: &Path, text: &str) {
    let mut f = std::fs::File::create(path).expect("create");
    f.write_all(text.as_bytes()).expect("write");
}

#[tokio::test]
async fn authenticates_known_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokens.yaml");
    write(&path, FILE);
    let auth = TokenFileAuthenticator::new(&path).expect("load");
    let node = auth
        .authenticate(&md(Some("Bearer s3cr3t-node1")))
        .await
        .expect("node agent");
    assert_eq!(node.identity.service_account(), "ztunnel");
    assert_eq!(node.node.as_deref(), Some("node1"));
    let app = auth
        .authenticate(&md(Some("bearer app-token")))
        .await
        .expect("app");
    assert_eq!(app.node, None);
}

#[tokio::test]
async fn refusals_are_distinct_and_never_show_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokens.yaml");
    write(&path, FILE);
    let auth = TokenFileAuthenticator::new(&path).expect("load");
    let cases = [
        (None, "missing_authorization"),
        (Some("s3cr3t-node1"), "not_bearer"),
        (Some("Basic s3cr3t-node1"), "not_bearer"),
        (Some("Bearer "), "not_bearer"),
        (Some("Bearer nope-not-a-token"), "unknown_token"),
        (Some("Bearer old-token"), "expired_token"),
    ];
    for (header, reason) in cases {
        let err = auth.authenticate(&md(header)).await.expect_err(reason);
        assert_eq!(err.reason(), reason, "{header:?}: {err}");
        let msg = err.to_string();
        for secret in ["s3cr3t", "nope-not", "old-token"] {
            assert!(!msg.contains(secret), "{msg}");
        }
    }
    let err = auth
        .authenticate(&md(Some("Bearer old-token")))
        .await
        .expect_err("expired");
    assert!(err.to_string().contains("sa/old") && err.to_string().contains("2001-01-01"));
}

#[tokio::test]
async fn reloads_when_the_file_changes_and_reports_a_broken_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokens.yaml");
    write(&path, FILE);
    let auth = TokenFileAuthenticator::new(&path).expect("load");
    let new = "tokens:\n- token: fresh-token-value\n  identity: spiffe://cluster.local/ns/a/sa/b\n";
    write(&path, new);
    let caller = auth
        .authenticate(&md(Some("Bearer fresh-token-value")))
        .await
        .expect("reloaded");
    assert_eq!(caller.identity.namespace(), "a");
    let err = auth
        .authenticate(&md(Some("Bearer app-token")))
        .await
        .expect_err("gone");
    assert_eq!(err.reason(), "unknown_token");

    write(&path, "tokens: [ {token: x, identity: not-a-spiffe-id} ]");
    let err = auth
        .authenticate(&md(Some("Bearer x")))
        .await
        .expect_err("broken");
    assert_eq!(err.reason(), "token_file_malformed");
    let msg = err.to_string();
    assert!(
        msg.contains("tokens.yaml") && msg.contains("spiffe://"),
        "{msg}"
    );

    std::fs::remove_file(&path).expect("rm");
    let err = auth
        .authenticate(&md(Some("Bearer x")))
        .await
        .expect_err("missing");
    assert_eq!(err.reason(), "token_file_unreadable");
    assert!(err.to_string().contains("tokens.yaml"));
}

#[tokio::test]
async fn malformed_files_name_the_problem() {
    let cases = [
        ("tokens: 3", "invalid type"),
        ("tokens:\n- token: a\n  identity: spiffe://cluster.local/ns/a/sa/b\n  nod: n1\n", "nod"),
        ("tokens:\n- token: ''\n  identity: spiffe://cluster.local/ns/a/sa/b\n", "`token` is empty"),
        ("tokens:\n- token: a\n  identity: spiffe://cluster.local/ns/a/sa/b\n  expires: tomorrow\n", "RFC 3339"),
        ("tokens:\n- {token: a, identity: 'spiffe://cluster.local/ns/a/sa/b'}\n- {token: a, identity: 'spiffe://cluster.local/ns/a/sa/c'}\n", "twice"),
    ];
    for (text, needle) in cases {
        let err = parse_tokens(text)
            .err()
            .unwrap_or_else(|| panic!("{text} must fail"));
        assert!(err.contains(needle), "{text}: {err}");
    }
    assert!(parse_tokens("").expect("empty file").is_empty());
    let dir = tempfile::tempdir().expect("tempdir");
    let err = TokenFileAuthenticator::new(dir.path().join("absent.yaml")).expect_err("absent");
    assert_eq!(err.reason(), "token_file_unreadable");
}
