//! Readable JSON of a snapshot for `/debug/configz`: IPs as strings, enums by name.

use mesh_proto::security::{self, Authorization};
use mesh_proto::workload::{
    self, address, gateway_address, Address, GatewayAddress, NetworkAddress, PortList,
};
use prost::Message;
use serde_json::{json, Value};

use super::snapshot::Snapshot;
use super::workload::bytes_ip;

pub(crate) fn render(s: &Snapshot) -> Value {
    let mut workloads = Vec::new();
    let mut services = Vec::new();
    for res in s.addresses.values() {
        match Address::decode(res.body.value.as_slice()).map(|a| a.r#type) {
            Ok(Some(address::Type::Workload(w))) => workloads.push(render_workload(&w)),
            Ok(Some(address::Type::Service(svc))) => services.push(render_service(&svc)),
            _ => {}
        }
    }
    let policies: Vec<Value> = s
        .authorizations
        .values()
        .filter_map(|r| Authorization::decode(r.body.value.as_slice()).ok())
        .map(|a| render_policy(&a))
        .collect();
    // Problems in what a waypoint or sidecar is served (the offending part left out), by proxy.
    let mut proxy_errors = serde_json::Map::new();
    let proxies = (s.waypoints().map(|(k, r)| (format!("waypoint:{k}"), r)))
        .chain(s.sidecars().map(|(k, r)| (format!("sidecar:{k}"), r)))
        .chain(s.routers().map(|(k, r)| (format!("router:{k}"), r)));
    for (name, res) in proxies.filter(|(_, r)| !r.errors.is_empty()) {
        let list = res.errors.iter();
        let list = list.map(|e| json!({"reason": e.reason(), "message": e.to_string()}));
        proxy_errors.insert(name, Value::Array(list.collect()));
    }
    json!({
        "version": s.version,
        "workloads": workloads,
        "services": services,
        "policies": policies,
        "errors": s.errors.iter().map(|e| json!({"reason": e.reason(), "message": e.to_string()})).collect::<Vec<_>>(),
        "proxyErrors": proxy_errors,
    })
}

fn ip_string(b: &[u8]) -> String {
    bytes_ip(b).map_or_else(
        || format!("invalid({} bytes)", b.len()),
        |ip| ip.to_string(),
    )
}

fn enum_name<E: TryFrom<i32>>(v: i32, name: fn(&E) -> &'static str) -> String {
    E::try_from(v).map_or_else(|_| v.to_string(), |e| name(&e).to_string())
}

fn render_workload(w: &workload::Workload) -> Value {
    let services: serde_json::Map<String, Value> = w
        .services
        .iter()
        .map(|(k, v)| (k.clone(), render_ports(v)))
        .collect();
    json!({
        "uid": w.uid,
        "name": w.name,
        "namespace": w.namespace,
        "addresses": w.addresses.iter().map(|a| ip_string(a)).collect::<Vec<_>>(),
        "hostname": w.hostname,
        "network": w.network,
        "tunnelProtocol": enum_name(w.tunnel_protocol, workload::TunnelProtocol::as_str_name),
        "trustDomain": w.trust_domain,
        "serviceAccount": w.service_account,
        "waypoint": w.waypoint.as_ref().map(render_gateway),
        "node": w.node,
        "canonicalName": w.canonical_name,
        "canonicalRevision": w.canonical_revision,
        "workloadType": enum_name(w.workload_type, workload::WorkloadType::as_str_name),
        "workloadName": w.workload_name,
        "services": services,
        "authorizationPolicies": w.authorization_policies,
        "status": enum_name(w.status, workload::WorkloadStatus::as_str_name),
        "clusterId": w.cluster_id,
        "networkMode": enum_name(w.network_mode, workload::NetworkMode::as_str_name),
    })
}

fn render_ports(p: &PortList) -> Value {
    Value::Array(p.ports.iter().map(render_port).collect())
}

fn render_port(p: &workload::Port) -> Value {
    json!({
        "servicePort": p.service_port,
        "targetPort": p.target_port,
        "appProtocol": enum_name(p.app_protocol, workload::AppProtocol::as_str_name),
    })
}

fn render_network_address(a: &NetworkAddress) -> Value {
    let ip = ip_string(&a.address);
    let addr = match a.length {
        Some(len) => format!("{ip}/{len}"),
        None => ip,
    };
    json!({"network": a.network, "address": addr})
}

fn render_gateway(g: &GatewayAddress) -> Value {
    let dest = match &g.destination {
        Some(gateway_address::Destination::Hostname(h)) => {
            json!({"namespace": h.namespace, "hostname": h.hostname})
        }
        Some(gateway_address::Destination::Address(a)) => render_network_address(a),
        None => Value::Null,
    };
    json!({"destination": dest, "hboneMtlsPort": g.hbone_mtls_port})
}

fn render_service(s: &workload::Service) -> Value {
    json!({
        "name": s.name,
        "namespace": s.namespace,
        "hostname": s.hostname,
        "addresses": s.addresses.iter().map(render_network_address).collect::<Vec<_>>(),
        "ports": s.ports.iter().map(render_port).collect::<Vec<_>>(),
        "subjectAltNames": s.subject_alt_names,
        "waypoint": s.waypoint.as_ref().map(render_gateway),
        "ipFamilies": enum_name(s.ip_families, workload::IpFamilies::as_str_name),
    })
}

fn render_policy(a: &Authorization) -> Value {
    let groups: Vec<Value> = a
        .groups
        .iter()
        .map(|g| {
            let rules: Vec<Value> = g
                .rules
                .iter()
                .map(|r| Value::Array(r.matches.iter().map(render_match).collect()))
                .collect();
            json!({"rules": rules})
        })
        .collect();
    json!({
        "name": a.name,
        "namespace": a.namespace,
        "scope": enum_name(a.scope, security::Scope::as_str_name),
        "action": enum_name(a.action, security::Action::as_str_name),
        "dryRun": a.dry_run,
        "groups": groups,
    })
}

fn render_match(m: &security::Match) -> Value {
    let strings = |v: &[security::StringMatch]| -> Vec<String> {
        v.iter()
            .map(|s| match &s.match_type {
                Some(security::string_match::MatchType::Exact(x)) => x.clone(),
                Some(security::string_match::MatchType::Prefix(x)) => format!("{x}*"),
                Some(security::string_match::MatchType::Suffix(x)) => format!("*{x}"),
                Some(security::string_match::MatchType::Presence(())) => "*".into(),
                None => String::new(),
            })
            .collect()
    };
    let addrs = |v: &[security::Address]| -> Vec<String> {
        v.iter()
            .map(|a| format!("{}/{}", ip_string(&a.address), a.length))
            .collect()
    };
    let sas = |v: &[security::ServiceAccountMatch]| -> Vec<String> {
        v.iter()
            .map(|s| format!("{}/{}", s.namespace, s.service_account))
            .collect()
    };
    let mut out = serde_json::Map::new();
    let mut put = |k: &str, v: Value| {
        if v.as_array().is_some_and(|a| !a.is_empty()) {
            out.insert(k.to_string(), v);
        }
    };
    put("namespaces", json!(strings(&m.namespaces)));
    put("notNamespaces", json!(strings(&m.not_namespaces)));
    put("principals", json!(strings(&m.principals)));
    put("notPrincipals", json!(strings(&m.not_principals)));
    put("sourceIps", json!(addrs(&m.source_ips)));
    put("notSourceIps", json!(addrs(&m.not_source_ips)));
    put("destinationIps", json!(addrs(&m.destination_ips)));
    put("notDestinationIps", json!(addrs(&m.not_destination_ips)));
    put("destinationPorts", json!(m.destination_ports));
    put("notDestinationPorts", json!(m.not_destination_ports));
    put("serviceAccounts", json!(sas(&m.service_accounts)));
    put("notServiceAccounts", json!(sas(&m.not_service_accounts)));
    Value::Object(out)
}
