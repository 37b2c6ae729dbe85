//! Turns WDS resources into tables shaped like `istioctl ztunnel-config`'s.

use std::net::IpAddr;

use mesh_proto::security::{self, StringMatch};
use mesh_proto::workload::{self, address, Address};
use prost::Message;

/// Why a resource could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("resource {name} ({type_url}) does not decode: {source}")]
    Decode {
        name: String,
        type_url: String,
        source: prost::DecodeError,
    },
}

/// Decoded resources by kind, each as (name, message).
#[derive(Debug, Default)]
pub struct Dump {
    pub workloads: Vec<workload::Workload>,
    pub services: Vec<workload::Service>,
    pub policies: Vec<security::Authorization>,
}

impl Dump {
    /// Adds one resource body of the Address or Authorization type.
    pub fn add(&mut self, name: &str, type_url: &str, value: &[u8]) -> Result<(), RenderError> {
        let err = |source| RenderError::Decode {
            name: name.to_string(),
            type_url: type_url.to_string(),
            source,
        };
        if type_url == mesh_proto::type_url::AUTHORIZATION {
            self.policies
                .push(security::Authorization::decode(value).map_err(err)?);
        } else {
            match Address::decode(value).map_err(err)?.r#type {
                Some(address::Type::Workload(w)) => self.workloads.push(w),
                Some(address::Type::Service(s)) => self.services.push(s),
                None => {}
            }
        }
        Ok(())
    }

    pub fn sort(&mut self) {
        self.workloads
            .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        self.services
            .sort_by(|a, b| (&a.namespace, &a.hostname).cmp(&(&b.namespace, &b.hostname)));
        self.policies
            .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    }
}

/// Formats an IP carried as 4 or 16 bytes.
pub fn ip(bytes: &[u8]) -> String {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes)
            .map(|b| IpAddr::from(b).to_string())
            .unwrap_or_default(),
        16 => <[u8; 16]>::try_from(bytes)
            .map(|b| IpAddr::from(b).to_string())
            .unwrap_or_default(),
        0 => "None".to_string(),
        n => format!("<{n} bytes>"),
    }
}

fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{:<w$}", c, w = widths[i]))
            .collect();
        out.push_str(s.join(" ").trim_end());
        out.push('\n');
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r);
    }
    out
}

/// NAMESPACE POD NAME ADDRESS NODE WAYPOINT PROTOCOL IDENTITY.
pub fn workloads(dump: &Dump) -> String {
    let rows = dump
        .workloads
        .iter()
        .map(|w| {
            let protocol = workload::TunnelProtocol::try_from(w.tunnel_protocol)
                .map(|p| p.as_str_name().to_string())
                .unwrap_or_else(|_| w.tunnel_protocol.to_string());
            let addr = w
                .addresses
                .first()
                .map(|a| ip(a))
                .unwrap_or_else(|| "None".into());
            let td = if w.trust_domain.is_empty() {
                "cluster.local"
            } else {
                &w.trust_domain
            };
            let sa = if w.service_account.is_empty() {
                "default"
            } else {
                &w.service_account
            };
            vec![
                w.namespace.clone(),
                w.name.clone(),
                addr,
                w.node.clone(),
                waypoint_name(w.waypoint.as_ref()),
                protocol,
                format!("spiffe://{td}/ns/{}/sa/{sa}", w.namespace),
            ]
        })
        .collect();
    table(
        &[
            "NAMESPACE",
            "POD NAME",
            "ADDRESS",
            "NODE",
            "WAYPOINT",
            "PROTOCOL",
            "IDENTITY",
        ],
        rows,
    )
}

fn waypoint_name(w: Option<&workload::GatewayAddress>) -> String {
    use workload::gateway_address::Destination;
    match w.and_then(|w| w.destination.as_ref()) {
        Some(Destination::Hostname(h)) => h.hostname.split('.').next().unwrap_or("").to_string(),
        Some(Destination::Address(a)) => ip(&a.address),
        None => "None".to_string(),
    }
}

/// NAMESPACE SERVICE NAME SERVICE VIP WAYPOINT PORTS.
pub fn services(dump: &Dump) -> String {
    let rows = dump
        .services
        .iter()
        .map(|s| {
            let vips: Vec<String> = s.addresses.iter().map(|a| ip(&a.address)).collect();
            let ports: Vec<String> = s
                .ports
                .iter()
                .map(|p| match p.target_port {
                    0 => p.service_port.to_string(),
                    t => format!("{}->{t}", p.service_port),
                })
                .collect();
            vec![
                s.namespace.clone(),
                s.hostname.clone(),
                if vips.is_empty() {
                    "None".into()
                } else {
                    vips.join(",")
                },
                waypoint_name(s.waypoint.as_ref()),
                ports.join(","),
            ]
        })
        .collect();
    table(
        &[
            "NAMESPACE",
            "SERVICE NAME",
            "SERVICE VIP",
            "WAYPOINT",
            "PORTS",
        ],
        rows,
    )
}

fn string_match(m: &StringMatch) -> String {
    use security::string_match::MatchType;
    match &m.match_type {
        Some(MatchType::Exact(s)) => s.clone(),
        Some(MatchType::Prefix(s)) => format!("{s}*"),
        Some(MatchType::Suffix(s)) => format!("*{s}"),
        Some(MatchType::Presence(_)) => "*".into(),
        None => String::new(),
    }
}

fn summarize_match(m: &security::Match) -> Vec<String> {
    let mut parts = Vec::new();
    let list = |v: &[StringMatch]| v.iter().map(string_match).collect::<Vec<_>>().join("|");
    let ips = |v: &[security::Address]| {
        v.iter()
            .map(|a| format!("{}/{}", ip(&a.address), a.length))
            .collect::<Vec<_>>()
            .join("|")
    };
    let fields: [(&str, String); 8] = [
        ("principal", list(&m.principals)),
        ("!principal", list(&m.not_principals)),
        ("ns", list(&m.namespaces)),
        ("!ns", list(&m.not_namespaces)),
        ("src", ips(&m.source_ips)),
        ("!src", ips(&m.not_source_ips)),
        ("dst", ips(&m.destination_ips)),
        (
            "port",
            m.destination_ports
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join("|"),
        ),
    ];
    for (k, v) in fields {
        if !v.is_empty() {
            parts.push(format!("{k}={v}"));
        }
    }
    parts
}

/// NAMESPACE POLICY NAME ACTION SCOPE RULES.
pub fn policies(dump: &Dump) -> String {
    let rows = dump
        .policies
        .iter()
        .map(|p| {
            let action = security::Action::try_from(p.action)
                .map(|a| a.as_str_name().to_string())
                .unwrap_or_default();
            let scope = security::Scope::try_from(p.scope)
                .map(|s| s.as_str_name().to_string())
                .unwrap_or_default();
            let rules: Vec<String> = p
                .groups
                .iter()
                .map(|g| {
                    g.rules
                        .iter()
                        .map(|r| {
                            r.matches
                                .iter()
                                .map(|m| summarize_match(m).join(","))
                                .collect::<Vec<_>>()
                                .join(" OR ")
                        })
                        .collect::<Vec<_>>()
                        .join(" AND ")
                })
                .collect();
            let rules = if rules.is_empty() {
                "(matches nothing)".to_string()
            } else {
                rules.join(" ; ")
            };
            vec![p.namespace.clone(), p.name.clone(), action, scope, rules]
        })
        .collect();
    table(
        &["NAMESPACE", "POLICY NAME", "ACTION", "SCOPE", "RULES"],
        rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_ips() {
        assert_eq!(ip(&[10, 0, 0, 1]), "10.0.0.1");
        assert_eq!(ip(&[]), "None");
        assert_eq!(ip(&[0u8; 16]), "::");
        assert_eq!(ip(&[1, 2, 3]), "<3 bytes>");
    }

    #[test]
    fn renders_a_workload_row() {
        let mut d = Dump::default();
        let w = workload::Workload {
            name: "client".into(),
            namespace: "demo".into(),
            addresses: vec![vec![10, 244, 1, 11]],
            node: "node1".into(),
            tunnel_protocol: workload::TunnelProtocol::Hbone as i32,
            service_account: "client".into(),
            ..Default::default()
        };
        let a = Address {
            r#type: Some(address::Type::Workload(w)),
        };
        d.add("x", mesh_proto::type_url::ADDRESS, &a.encode_to_vec())
            .expect("decodes");
        let t = workloads(&d);
        assert!(t.contains("demo      client   10.244.1.11 node1 None     HBONE    spiffe://cluster.local/ns/demo/sa/client"), "{t}");
    }

    #[test]
    fn garbage_resource_names_itself() {
        let mut d = Dump::default();
        let err = d
            .add("bad", mesh_proto::type_url::ADDRESS, &[0xff, 0xff, 0xff])
            .expect_err("garbage");
        assert!(err.to_string().contains("resource bad"), "{err}");
    }
}
