//! Proxy node ids: `<type>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>`, as ztunnel
//! (`ztunnel~...`) and Envoy (`sidecar~...`, `router~...`, `waypoint~...`) send them in
//! `Node.id`.

use std::fmt;
use std::net::IpAddr;

/// A node id that does not follow Istio's format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIdError {
    #[error(
        "node id {id:?} has {parts} '~'-separated parts, expected 4 \
         (<type>~<ip>~<pod>.<namespace>~<namespace>.svc.cluster.local)"
    )]
    Parts { id: String, parts: usize },
    #[error(
        "node id {id:?} has proxy type {kind:?}; expected ztunnel, sidecar, router or waypoint"
    )]
    Kind { id: String, kind: String },
    #[error("node id {id:?} has IP {ip:?} that does not parse; is the proxy's INSTANCE_IP set?")]
    Ip { id: String, ip: String },
    #[error("node id {id:?} has workload {workload:?}, expected <pod>.<namespace>")]
    Workload { id: String, workload: String },
}

impl NodeIdError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            NodeIdError::Parts { .. } => "parts",
            NodeIdError::Kind { .. } => "kind",
            NodeIdError::Ip { .. } => "ip",
            NodeIdError::Workload { .. } => "workload",
        }
    }
}

/// The kind of proxy, the first field of the node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    Ztunnel,
    Sidecar,
    Router,
    Waypoint,
}

impl fmt::Display for ProxyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxyKind::Ztunnel => "ztunnel",
            ProxyKind::Sidecar => "sidecar",
            ProxyKind::Router => "router",
            ProxyKind::Waypoint => "waypoint",
        })
    }
}

/// A parsed node id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeId {
    pub kind: ProxyKind,
    pub ip: IpAddr,
    pub pod: String,
    pub namespace: String,
    /// The DNS domain, e.g. `istio-system.svc.cluster.local`.
    pub domain: String,
}

impl NodeId {
    /// Parses `id`. Pod names may contain dots; namespaces may not, so the workload part is
    /// split at its last dot.
    pub fn parse(id: &str) -> Result<NodeId, NodeIdError> {
        let parts: Vec<&str> = id.split('~').collect();
        let [kind, ip, workload, domain] = parts[..] else {
            return Err(NodeIdError::Parts {
                id: id.to_string(),
                parts: parts.len(),
            });
        };
        let kind = match kind {
            "ztunnel" => ProxyKind::Ztunnel,
            "sidecar" => ProxyKind::Sidecar,
            "router" => ProxyKind::Router,
            "waypoint" => ProxyKind::Waypoint,
            other => {
                return Err(NodeIdError::Kind {
                    id: id.to_string(),
                    kind: other.to_string(),
                })
            }
        };
        let ip = ip.parse().map_err(|_| NodeIdError::Ip {
            id: id.to_string(),
            ip: ip.to_string(),
        })?;
        let (pod, namespace) = workload
            .rsplit_once('.')
            .filter(|(pod, ns)| !pod.is_empty() && !ns.is_empty())
            .ok_or_else(|| NodeIdError::Workload {
                id: id.to_string(),
                workload: workload.to_string(),
            })?;
        Ok(NodeId {
            kind,
            ip,
            pod: pod.to_string(),
            namespace: namespace.to_string(),
            domain: domain.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ztunnel_and_envoy_ids() {
        let n = NodeId::parse(
            "ztunnel~10.244.0.5~ztunnel-abc.istio-system~istio-system.svc.cluster.local",
        )
        .expect("valid");
        assert_eq!(n.kind, ProxyKind::Ztunnel);
        assert_eq!(n.ip.to_string(), "10.244.0.5");
        assert_eq!(
            (n.pod.as_str(), n.namespace.as_str()),
            ("ztunnel-abc", "istio-system")
        );
        assert_eq!(n.domain, "istio-system.svc.cluster.local");
        let s = NodeId::parse("sidecar~fd00::1~web.v1.x.default~default.svc.cluster.local")
            .expect("v6");
        assert_eq!(
            (s.kind, s.pod.as_str(), s.namespace.as_str()),
            (ProxyKind::Sidecar, "web.v1.x", "default")
        );
        let r = NodeId::parse("router~10.0.0.1~gw.ns~ns.svc.cluster.local").expect("router");
        assert_eq!(r.kind, ProxyKind::Router);
        let w = NodeId::parse("waypoint~10.0.0.2~waypoint-5d9f.shop~shop.svc.cluster.local")
            .expect("waypoint");
        assert_eq!(
            (w.kind, w.namespace.as_str()),
            (ProxyKind::Waypoint, "shop")
        );
    }

    #[test]
    fn rejects_malformed_ids() {
        let cases = [
            ("garbage", "parts"),
            ("gateway~10.0.0.1~a.b~b.svc", "kind"),
            ("ztunnel~not-ip~a.b~b.svc", "ip"),
            ("ztunnel~10.0.0.1~nodot~b.svc", "workload"),
        ];
        for (id, reason) in cases {
            let err = NodeId::parse(id).expect_err(id);
            assert_eq!(err.reason(), reason, "{id}: {err}");
        }
    }
}
