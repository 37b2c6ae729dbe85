//! State-of-the-world ADS (`StreamAggregatedResources`) served by the same per-connection
//! machinery as delta: each SotW request becomes the delta request it means (the change of the
//! subscribed names, the nonce, any `error_detail`), and each delta response becomes the full
//! state of its type, which SotW clients expect. ACK/NACK, nonces, scopes, pushes and
//! `/debug/syncz` are therefore the same for both protocols.

use std::collections::{BTreeMap, BTreeSet};

use mesh_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mesh_proto::envoy::pb::google::protobuf::Any;

/// Turns one stream's SotW requests into delta requests.
#[derive(Debug, Default)]
pub struct RequestTranslator {
    /// Names last requested, per type (`None`: the type is not open yet).
    names: BTreeMap<String, BTreeSet<String>>,
}

impl RequestTranslator {
    pub fn translate(&mut self, req: DiscoveryRequest) -> DeltaDiscoveryRequest {
        let wanted: BTreeSet<String> = req.resource_names.iter().cloned().collect();
        let (subscribe, unsubscribe) = match self.names.get(&req.type_url) {
            None => (wanted.iter().cloned().collect(), Vec::new()),
            Some(old) => (
                wanted.difference(old).cloned().collect(),
                old.difference(&wanted).cloned().collect(),
            ),
        };
        self.names.insert(req.type_url.clone(), wanted);
        DeltaDiscoveryRequest {
            node: req.node,
            type_url: req.type_url,
            resource_names_subscribe: subscribe,
            resource_names_unsubscribe: unsubscribe,
            response_nonce: req.response_nonce,
            error_detail: req.error_detail,
            ..DeltaDiscoveryRequest::default()
        }
    }
}

/// Turns one stream's delta responses into SotW responses carrying everything the client
/// holds of that type.
#[derive(Debug, Default)]
pub struct ResponseTranslator {
    held: BTreeMap<String, BTreeMap<String, Any>>,
}

impl ResponseTranslator {
    pub fn translate(&mut self, resp: DeltaDiscoveryResponse) -> DiscoveryResponse {
        let held = self.held.entry(resp.type_url.clone()).or_default();
        for name in &resp.removed_resources {
            held.remove(name);
        }
        for r in resp.resources {
            if let Some(body) = r.resource {
                held.insert(r.name, body);
            }
        }
        DiscoveryResponse {
            version_info: resp.system_version_info,
            resources: held.values().cloned().collect(),
            type_url: resp.type_url,
            nonce: resp.nonce,
            ..DiscoveryResponse::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_proto::discovery::Resource;

    fn sotw(names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: "T".into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            ..DiscoveryRequest::default()
        }
    }

    #[test]
    fn requests_become_subscription_changes() {
        let mut t = RequestTranslator::default();
        let first = t.translate(sotw(&[], ""));
        assert!(first.resource_names_subscribe.is_empty(), "wildcard");
        let eds = t.translate(sotw(&["a", "b"], "n1"));
        assert_eq!(eds.resource_names_subscribe, ["a", "b"]);
        assert_eq!(eds.response_nonce, "n1");
        let next = t.translate(sotw(&["b", "c"], "n2"));
        assert_eq!(next.resource_names_subscribe, ["c"]);
        assert_eq!(next.resource_names_unsubscribe, ["a"]);
        let ack = t.translate(sotw(&["b", "c"], "n3"));
        assert!(
            ack.resource_names_subscribe.is_empty() && ack.resource_names_unsubscribe.is_empty()
        );
    }

    #[test]
    fn responses_carry_the_whole_state() {
        let res = |name: &str, v: u8| Resource {
            name: name.into(),
            resource: Some(Any {
                type_url: "T".into(),
                value: vec![v],
            }),
            ..Resource::default()
        };
        let mut t = ResponseTranslator::default();
        let r1 = t.translate(DeltaDiscoveryResponse {
            type_url: "T".into(),
            resources: vec![res("a", 1), res("b", 1)],
            nonce: "1".into(),
            ..DeltaDiscoveryResponse::default()
        });
        assert_eq!(r1.resources.len(), 2);
        let r2 = t.translate(DeltaDiscoveryResponse {
            type_url: "T".into(),
            resources: vec![res("b", 2)],
            removed_resources: vec!["a".into()],
            nonce: "2".into(),
            ..DeltaDiscoveryResponse::default()
        });
        assert_eq!(r2.resources.len(), 1);
        assert_eq!(r2.resources[0].value, vec![2]);
        assert_eq!(r2.nonce, "2");
    }
}
