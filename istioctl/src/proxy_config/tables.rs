//! The `proxy-config` tables, as upstream istioctl lays them out, from Envoy's JSON dump.

use base64::Engine;
use serde_json::Value;

use super::EnvoyDump;
use crate::table;

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn dash(text: &str) -> String {
    if text.is_empty() {
        "-".into()
    } else {
        text.into()
    }
}

/// Every listener of the dump: static, then the active state of dynamic ones.
fn all_listeners(dump: &EnvoyDump) -> Vec<&Value> {
    let e = dump.entry("ListenersConfigDump");
    let statics = e["static_listeners"].as_array().into_iter().flatten();
    let dynamics = e["dynamic_listeners"].as_array().into_iter().flatten();
    statics
        .map(|l| &l["listener"])
        .chain(dynamics.map(|l| &l["active_state"]["listener"]))
        .filter(|l| l.is_object())
        .collect()
}

/// Every cluster: static, then dynamic active ones.
fn all_clusters(dump: &EnvoyDump) -> Vec<&Value> {
    let e = dump.entry("ClustersConfigDump");
    let statics = e["static_clusters"].as_array().into_iter().flatten();
    let dynamics = e["dynamic_active_clusters"]
        .as_array()
        .into_iter()
        .flatten();
    statics.chain(dynamics).map(|c| &c["cluster"]).collect()
}

/// `<direction>|<port>|<subset>|<fqdn>` as istioctl splits cluster names.
fn subset_key(name: &str) -> Option<(&str, &str, &str, &str)> {
    let parts: Vec<&str> = name.split('|').collect();
    match parts.as_slice() {
        [direction, port, subset, fqdn] => Some((direction, port, subset, fqdn)),
        _ => None,
    }
}

/// `name.namespace` of the Istio config a resource's metadata names, if any.
fn istio_config(metadata: &Value) -> String {
    let path = s(&metadata["filter_metadata"]["istio"]["config"]);
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        [.., "namespaces", ns, _kind, name] => format!("{name}.{ns}"),
        _ => String::new(),
    }
}

pub fn clusters(dump: &EnvoyDump) -> String {
    let mut rows: Vec<Vec<String>> = all_clusters(dump)
        .into_iter()
        .map(|c| {
            let name = s(&c["name"]);
            let kind = c["type"].as_str().unwrap_or("STATIC").to_string();
            let dr = dash(&istio_config(&c["metadata"]));
            match subset_key(name) {
                Some((direction, port, subset, fqdn)) => vec![
                    fqdn.into(),
                    dash(port),
                    dash(subset),
                    dash(direction),
                    kind,
                    dr,
                ],
                None => vec![name.into(), "-".into(), "-".into(), "-".into(), kind, dr],
            }
        })
        .collect();
    rows.sort();
    table::render(
        &[
            "SERVICE FQDN",
            "PORT",
            "SUBSET",
            "DIRECTION",
            "TYPE",
            "DESTINATION RULE",
        ],
        &rows,
        1,
    )
}

/// A listener's address column and port.
fn listener_address(l: &Value) -> (String, String) {
    let a = &l["address"];
    if let Some(sock) = a.get("socket_address") {
        let port = sock["port_value"]
            .as_u64()
            .map_or("-".into(), |p| p.to_string());
        return (s(&sock["address"]).to_string(), port);
    }
    if let Some(internal) = a.get("envoy_internal_address") {
        return (
            format!("envoy://{}", s(&internal["server_listener_name"])),
            "-".into(),
        );
    }
    if l.get("internal_listener").is_some() {
        return (format!("envoy://{}", s(&l["name"])), "-".into());
    }
    ("-".into(), "-".into())
}

/// What a filter chain matches on, as istioctl summarizes it.
fn chain_match(chain: &Value) -> String {
    let m = &chain["filter_chain_match"];
    let mut parts = Vec::new();
    if let Some(p) = m["destination_port"].as_u64() {
        parts.push(format!("port {p}"));
    }
    if let Some(t) = m["transport_protocol"].as_str() {
        parts.push(format!("Trans: {t}"));
    }
    if let Some(alpn) = m["application_protocols"].as_array() {
        let alpn: Vec<&str> = alpn.iter().filter_map(Value::as_str).collect();
        parts.push(format!("App: {}", alpn.join(",")));
    }
    if let Some(ranges) = m["prefix_ranges"].as_array() {
        let r: Vec<String> = ranges
            .iter()
            .map(|r| {
                format!(
                    "{}/{}",
                    s(&r["address_prefix"]),
                    r["prefix_len"].as_u64().unwrap_or(32)
                )
            })
            .collect();
        parts.push(format!("Addr: {}", r.join(",")));
    }
    if !parts.is_empty() {
        return parts.join("; ");
    }
    match chain["name"].as_str() {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => "ALL".into(),
    }
}

/// Where a filter chain sends traffic.
fn chain_destination(chain: &Value) -> String {
    let filters = chain["filters"].as_array().cloned().unwrap_or_default();
    for f in filters.iter().rev() {
        let config = &f["typed_config"];
        if let Some(rds) = config.get("rds") {
            return format!("Route: {}", s(&rds["route_config_name"]));
        }
        if let Some(rc) = config.get("route_config") {
            return format!("Inline Route: {}", dash(s(&rc["name"])));
        }
        if let Some(cluster) = config["cluster"].as_str() {
            return format!("Cluster: {cluster}");
        }
        if let Some(clusters) = config["weighted_clusters"]["clusters"].as_array() {
            let names: Vec<&str> = clusters.iter().map(|c| s(&c["name"])).collect();
            return format!("Clusters: {}", names.join(","));
        }
    }
    filters
        .last()
        .map_or("-".into(), |f| format!("Filter: {}", s(&f["name"])))
}

pub fn listeners(dump: &EnvoyDump) -> String {
    let mut rows = Vec::new();
    for l in all_listeners(dump) {
        let (address, port) = listener_address(l);
        let chains = l["filter_chains"].as_array().cloned().unwrap_or_default();
        if chains.is_empty() {
            rows.push(vec![
                address.clone(),
                port.clone(),
                "ALL".into(),
                "-".into(),
            ]);
        }
        for chain in chains.iter().chain(l.get("default_filter_chain")) {
            rows.push(vec![
                address.clone(),
                port.clone(),
                chain_match(chain),
                chain_destination(chain),
            ]);
        }
    }
    table::render(&["ADDRESSES", "PORT", "MATCH", "DESTINATION"], &rows, 1)
}

/// RDS route configurations, then those inline in listeners' HTTP connection managers.
fn all_route_configs(dump: &EnvoyDump) -> Vec<Value> {
    let e = dump.entry("RoutesConfigDump");
    let mut out: Vec<Value> = (e["static_route_configs"].as_array().into_iter().flatten())
        .chain(e["dynamic_route_configs"].as_array().into_iter().flatten())
        .map(|r| r["route_config"].clone())
        .collect();
    for l in all_listeners(dump) {
        for chain in l["filter_chains"].as_array().into_iter().flatten() {
            for f in chain["filters"].as_array().into_iter().flatten() {
                if let Some(rc) = f["typed_config"].get("route_config") {
                    out.push(rc.clone());
                }
            }
        }
    }
    out
}

/// A route's match as istioctl prints it (`/*` for a prefix, the path, or the regex).
fn route_match(m: &Value) -> String {
    if let Some(p) = m["prefix"].as_str() {
        return format!("{p}*");
    }
    if let Some(p) = m["path"].as_str() {
        return p.to_string();
    }
    if let Some(p) = m["path_separated_prefix"].as_str() {
        return format!("{p}/*");
    }
    if let Some(r) = m["safe_regex"]["regex"].as_str() {
        return r.to_string();
    }
    if m.get("connect_matcher").is_some() {
        return "CONNECT".into();
    }
    "-".into()
}

pub fn routes(dump: &EnvoyDump) -> String {
    let mut rows = Vec::new();
    for rc in all_route_configs(dump) {
        let name = dash(s(&rc["name"]));
        for vh in rc["virtual_hosts"].as_array().into_iter().flatten() {
            let domains: Vec<&str> = (vh["domains"].as_array().into_iter().flatten())
                .filter_map(Value::as_str)
                .collect();
            for route in vh["routes"].as_array().into_iter().flatten() {
                let source = istio_config(&route["metadata"]);
                let source = if source.is_empty() {
                    s(&route["name"]).to_string()
                } else {
                    source
                };
                rows.push(vec![
                    name.clone(),
                    dash(s(&vh["name"])),
                    dash(&domains.join(",")),
                    route_match(&route["match"]),
                    dash(&source),
                ]);
            }
        }
    }
    table::render(
        &["NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"],
        &rows,
        1,
    )
}

fn endpoint_address(a: &Value) -> String {
    if let Some(sock) = a.get("socket_address") {
        return format!(
            "{}:{}",
            s(&sock["address"]),
            sock["port_value"].as_u64().unwrap_or(0)
        );
    }
    if let Some(i) = a.get("envoy_internal_address") {
        return format!(
            "envoy://{}/{}",
            s(&i["server_listener_name"]),
            s(&i["endpoint_id"])
        );
    }
    if let Some(p) = a.get("pipe") {
        return format!("unix://{}", s(&p["path"]));
    }
    "-".into()
}

pub fn endpoints(dump: &EnvoyDump) -> String {
    let e = dump.entry("EndpointsConfigDump");
    let mut rows = Vec::new();
    let configs = (e["static_endpoint_configs"]
        .as_array()
        .into_iter()
        .flatten())
    .chain(
        e["dynamic_endpoint_configs"]
            .as_array()
            .into_iter()
            .flatten(),
    );
    for c in configs {
        let cla = &c["endpoint_config"];
        let cluster = s(&cla["cluster_name"]).to_string();
        for locality in cla["endpoints"].as_array().into_iter().flatten() {
            for lb in locality["lb_endpoints"].as_array().into_iter().flatten() {
                rows.push(vec![
                    endpoint_address(&lb["endpoint"]["address"]),
                    lb["health_status"]
                        .as_str()
                        .unwrap_or("HEALTHY")
                        .to_string(),
                    "OK".into(),
                    cluster.clone(),
                ]);
            }
        }
    }
    rows.sort();
    table::render(
        &["ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"],
        &rows,
        1,
    )
}

/// The first certificate of a base64 PEM (or DER) blob: serial (hex), not after, not before.
fn certificate(b64: &str) -> Option<(String, String, String)> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let der = match x509_parser::pem::parse_x509_pem(&bytes) {
        Ok((_, pem)) => pem.contents,
        Err(_) => bytes,
    };
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let time = |t: x509_parser::time::ASN1Time| {
        humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH
                + std::time::Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0)),
        )
        .to_string()
    };
    let v = cert.validity();
    Some((
        cert.raw_serial_as_string().replace(':', ""),
        time(v.not_after),
        time(v.not_before),
    ))
}

pub fn secrets(dump: &EnvoyDump) -> String {
    let e = dump.entry("SecretsConfigDump");
    let mut rows = Vec::new();
    let active = (e["static_secrets"].as_array().into_iter().flatten())
        .chain(e["dynamic_active_secrets"].as_array().into_iter().flatten());
    for secret in active {
        let name = s(&secret["name"]).to_string();
        let body = &secret["secret"];
        let (kind, blob) = if let Some(tls) = body.get("tls_certificate") {
            ("Cert Chain", &tls["certificate_chain"]["inline_bytes"])
        } else if let Some(vc) = body.get("validation_context") {
            ("CA", &vc["trusted_ca"]["inline_bytes"])
        } else {
            ("-", &Value::Null)
        };
        let (serial, not_after, not_before, valid) = match certificate(s(blob)) {
            Some((serial, after, before)) => (serial, after, before, "true"),
            None => ("-".into(), "-".into(), "-".into(), "false"),
        };
        rows.push(vec![
            name,
            kind.into(),
            "ACTIVE".into(),
            valid.into(),
            serial,
            not_after,
            not_before,
        ]);
    }
    for warming in e["dynamic_warming_secrets"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let row = [s(&warming["name"]), "-", "WARMING", "false", "-", "-", "-"];
        rows.push(row.iter().map(|c| c.to_string()).collect());
    }
    table::render(
        &[
            "RESOURCE NAME",
            "TYPE",
            "STATUS",
            "VALID CERT",
            "SERIAL NUMBER",
            "NOT AFTER",
            "NOT BEFORE",
        ],
        &rows,
        5,
    )
}
