//! Who may be served a gateway proxy's configuration.

use mesh_identity::Identity;

use super::*;
use crate::auth::Caller;

fn caller(ns: &str) -> Caller {
    Caller {
        identity: Identity::new("cluster.local", ns, "ingress").expect("identity"),
        node: None,
        pod: None,
    }
}

#[test]
fn a_gateway_proxy_is_served_only_to_a_workload_of_its_namespace() {
    let node =
        NodeId::parse("router~10.1.0.9~ingress-1.istio-system~istio-system.svc.cluster.local")
            .expect("node id");
    assert!(router_allowed(Some(&caller("istio-system")), &node));
    assert!(
        !router_allowed(Some(&caller("shop")), &node),
        "another namespace's token"
    );
    assert!(
        !router_allowed(None, &node),
        "an unauthenticated stream (15010)"
    );
}
