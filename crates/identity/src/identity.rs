//! SPIFFE identities of the form `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The URI scheme prefix of every SPIFFE id.
pub const SPIFFE_PREFIX: &str = "spiffe://";

/// SPIFFE ids longer than this are refused (the SPIFFE spec's limit).
const MAX_URI_LEN: usize = 2048;

/// Why a string is not a mesh identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("identity {input:?} does not start with \"spiffe://\"; expected spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>")]
    NotSpiffe { input: String },
    #[error("identity {input:?} is longer than {MAX_URI_LEN} bytes")]
    TooLong { input: String },
    #[error("identity {input:?} has an empty trust domain; expected spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>")]
    EmptyTrustDomain { input: String },
    #[error("trust domain {trust_domain:?} may only contain lowercase letters, digits, '.', '-' and '_'")]
    BadTrustDomain { trust_domain: String },
    #[error("identity {input:?} does not have the path /ns/<namespace>/sa/<service-account>")]
    NotNamespaceServiceAccount { input: String },
    #[error("{what} {value:?} is not a valid SPIFFE path segment: use letters, digits, '.', '-' or '_', and not \".\" or \"..\"")]
    BadSegment { what: &'static str, value: String },
}

impl IdentityError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            IdentityError::NotSpiffe { .. } => "not_spiffe",
            IdentityError::TooLong { .. } => "too_long",
            IdentityError::EmptyTrustDomain { .. } => "empty_trust_domain",
            IdentityError::BadTrustDomain { .. } => "bad_trust_domain",
            IdentityError::NotNamespaceServiceAccount { .. } => "not_ns_sa",
            IdentityError::BadSegment { .. } => "bad_segment",
        }
    }
}

/// A workload identity: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

impl Identity {
    /// Builds an identity from its parts, validating each.
    pub fn new(
        trust_domain: impl Into<String>,
        namespace: impl Into<String>,
        service_account: impl Into<String>,
    ) -> Result<Self, IdentityError> {
        let id = Identity {
            trust_domain: trust_domain.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
        };
        check_trust_domain(&id.trust_domain)?;
        check_segment("namespace", &id.namespace)?;
        check_segment("service account", &id.service_account)?;
        Ok(id)
    }

    /// Parses `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
    pub fn parse(input: &str) -> Result<Self, IdentityError> {
        if input.len() > MAX_URI_LEN {
            return Err(IdentityError::TooLong {
                input: input.chars().take(64).collect(),
            });
        }
        let rest = strip_prefix_ignore_case(input, SPIFFE_PREFIX).ok_or_else(|| {
            IdentityError::NotSpiffe {
                input: input.to_string(),
            }
        })?;
        let (trust_domain, path) = rest.split_once('/').unwrap_or((rest, ""));
        if trust_domain.is_empty() {
            return Err(IdentityError::EmptyTrustDomain {
                input: input.to_string(),
            });
        }
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            ["ns", ns, "sa", sa] => Identity::new(trust_domain, *ns, *sa),
            _ => Err(IdentityError::NotNamespaceServiceAccount {
                input: input.to_string(),
            }),
        }
    }

    /// The trust domain, e.g. `cluster.local`.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The Kubernetes namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Kubernetes service account.
    pub fn service_account(&self) -> &str {
        &self.service_account
    }

    /// The id without the `spiffe://` scheme, as Istio's principal matchers use it.
    pub fn principal(&self) -> String {
        format!(
            "{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

fn strip_prefix_ignore_case<'a>(input: &'a str, prefix: &str) -> Option<&'a str> {
    let head = input.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &input[prefix.len()..])
}

fn check_trust_domain(td: &str) -> Result<(), IdentityError> {
    let ok = td
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_'));
    if td.is_empty() || !ok {
        return Err(IdentityError::BadTrustDomain {
            trust_domain: td.to_string(),
        });
    }
    Ok(())
}

fn check_segment(what: &'static str, value: &str) -> Result<(), IdentityError> {
    let ok = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if value.is_empty() || value == "." || value == ".." || !ok {
        return Err(IdentityError::BadSegment {
            what,
            value: value.to_string(),
        });
    }
    Ok(())
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SPIFFE_PREFIX}{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl FromStr for Identity {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Identity::parse(s)
    }
}

impl Serialize for Identity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Identity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Identity::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays() {
        let id = Identity::parse("spiffe://cluster.local/ns/default/sa/bookinfo-productpage")
            .expect("valid id");
        assert_eq!(id.trust_domain(), "cluster.local");
        assert_eq!(id.namespace(), "default");
        assert_eq!(id.service_account(), "bookinfo-productpage");
        assert_eq!(
            id.to_string(),
            "spiffe://cluster.local/ns/default/sa/bookinfo-productpage"
        );
        assert_eq!(
            id.principal(),
            "cluster.local/ns/default/sa/bookinfo-productpage"
        );
        let again: Identity = id.to_string().parse().expect("round trip");
        assert_eq!(again, id);
    }

    #[test]
    fn refuses_malformed_ids_with_clear_errors() {
        let cases = [
            ("http://cluster.local/ns/a/sa/b", "not_spiffe"),
            ("spiffe:///ns/a/sa/b", "empty_trust_domain"),
            ("spiffe://Cluster.Local/ns/a/sa/b", "bad_trust_domain"),
            ("spiffe://cluster.local/ns/a", "not_ns_sa"),
            ("spiffe://cluster.local/ns/a/sa/b/extra", "not_ns_sa"),
            ("spiffe://cluster.local/sa/b/ns/a", "not_ns_sa"),
            ("spiffe://cluster.local/ns//sa/b", "bad_segment"),
            ("spiffe://cluster.local/ns/a/sa/..", "bad_segment"),
            ("spiffe://cluster.local/ns/a b/sa/c", "bad_segment"),
        ];
        for (input, reason) in cases {
            let err = Identity::parse(input).expect_err(input);
            assert_eq!(err.reason(), reason, "{input}: {err}");
        }
        let err = Identity::parse("spiffe://cluster.local/ns/a").expect_err("no sa");
        assert!(err
            .to_string()
            .contains("/ns/<namespace>/sa/<service-account>"));
        let long = format!("spiffe://cluster.local/ns/{}/sa/b", "a".repeat(3000));
        assert_eq!(
            Identity::parse(&long).expect_err("long").reason(),
            "too_long"
        );
    }

    #[test]
    fn serde_uses_the_uri_string() {
        let id = Identity::new("cluster.local", "ns1", "sa1").expect("valid");
        let json = serde_yaml::to_string(&id).expect("serialize");
        assert_eq!(json.trim(), "spiffe://cluster.local/ns/ns1/sa/sa1");
        let back: Identity = serde_yaml::from_str(&json).expect("deserialize");
        assert_eq!(back, id);
        assert!(serde_yaml::from_str::<Identity>("spiffe://x/y").is_err());
    }
}
