//! Which names ztunnel answers itself, and with what (upstream `Store::find_server` semantics).
//!
//! A query name is expanded into *aliases* from the client pod's point of view: the name
//! itself; its Kubernetes FQDN forms (`svc` -> `svc.<ns>.svc.<domain>`, `svc.ns` ->
//! `svc.ns.svc.<domain>`, ...); and the name with each pod search domain (`<ns>.svc.<domain>`,
//! `svc.<domain>`, `<domain>`) stripped, plus that stripped name's FQDN forms. Each alias is
//! tried as is and then as wildcards of decreasing specificity (`a.b.c`, `*.b.c`, `*.c`)
//! against service hostnames (Kubernetes services and ServiceEntry hosts); a service in the
//! client's namespace wins over a `canonical` one, which wins over the rest. An alias of the
//! form `<pod>.<service>.<ns>.svc.<domain>` also matches a pod of a headless service. A name
//! found by stripping a search domain is answered with a CNAME to the stripped name.
//!
//! Everything here is synchronous and runs under the state's read lock.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use mesh_proto::workload::{load_balancing, IpFamilies, ServiceVisibility, WorkloadStatus};
use rand::seq::SliceRandom;

use crate::state::{Service, State, Workload};

/// TTL of the records ztunnel answers itself (upstream `DEFAULT_TTL_SECONDS`).
pub const TTL_SECONDS: u32 = 30;

/// The pod asking.
#[derive(Clone, Copy, Debug)]
pub struct Client<'a> {
    /// The pod's namespace (its search domains and preferred services).
    pub namespace: &'a str,
    /// The pod's network: only VIPs on this network are returned.
    pub network: &'a str,
}

/// The cluster domain and what ztunnel may answer.
#[derive(Clone, Debug)]
pub struct Names {
    /// Cluster domain, lower case, no trailing dot (`cluster.local`).
    domain: String,
    /// Whether AAAA records may be answered.
    ipv6_enabled: bool,
}

/// One spelling of the requested name to look up.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Alias {
    /// Lower-case name without trailing dot.
    name: String,
    /// Set when the alias came from stripping a search domain: the stripped name.
    stripped: Option<String>,
}

/// What the requested name resolved to.
enum Server<'s> {
    Service(&'s Service),
    Pods(Vec<&'s Workload>),
}

impl Names {
    /// `domain` is the cluster domain (`CLUSTER_DOMAIN`, usually `cluster.local`).
    pub fn new(domain: &str, ipv6_enabled: bool) -> Names {
        Names {
            domain: domain.trim_end_matches('.').to_ascii_lowercase(),
            ipv6_enabled,
        }
    }

    /// The answer records for an `A`/`AAAA` query of `qname`, or `None` when ztunnel does not
    /// know the name (the query is then forwarded). `Some(vec![])` means the name is known but
    /// has no address of that family (NOERROR, no answers).
    pub fn resolve(
        &self,
        state: &State,
        client: Client<'_>,
        qname: &Name,
        qtype: RecordType,
    ) -> Option<Vec<Record>> {
        if !matches!(qtype, RecordType::A | RecordType::AAAA) {
            return None;
        }
        let requested = name_key(qname);
        if requested.is_empty() {
            return None;
        }
        let aliases = self.aliases(client.namespace, &requested);
        let (alias, matched, server) = self.find(state, client, &aliases)?;
        let addrs = if self.family_allowed(&server, qtype) {
            self.addresses(state, client, &server, qtype)
        } else {
            Vec::new()
        };
        let mut records = Vec::new();
        if addrs.is_empty() {
            return Some(records);
        }
        let mut ip_name = qname.clone();
        if let Some(stripped) = alias
            .stripped
            .as_deref()
            .filter(|_| !matched.starts_with("*."))
        {
            // The name was found after stripping a search domain: point the requested name at
            // the stripped one and give the addresses there.
            if let Ok(target) = Name::from_ascii(format!("{stripped}.")) {
                records.push(Record::from_rdata(
                    qname.clone(),
                    TTL_SECONDS,
                    RData::CNAME(CNAME(target.clone())),
                ));
                ip_name = target;
            }
        }
        records.extend(addrs.into_iter().map(|ip| {
            let rdata = match ip {
                IpAddr::V4(v4) => RData::A(A(v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
            };
            Record::from_rdata(ip_name.clone(), TTL_SECONDS, rdata)
        }));
        Some(records)
    }

    /// The pod's search domains: `<ns>.svc.<domain>`, `svc.<domain>`, `<domain>`.
    fn search_domains(&self, namespace: &str) -> [String; 3] {
        let d = &self.domain;
        [
            format!("{namespace}.svc.{d}"),
            format!("svc.{d}"),
            d.clone(),
        ]
    }

    /// Aliases in lookup order, without duplicates.
    fn aliases(&self, namespace: &str, requested: &str) -> Vec<Alias> {
        let mut out: Vec<Alias> = Vec::new();
        let mut push = |alias: Alias| {
            if !out.iter().any(|a| a.name == alias.name) {
                out.push(alias);
            }
        };
        push(Alias {
            name: requested.to_string(),
            stripped: None,
        });
        for fqdn in self.kube_fqdns(namespace, requested) {
            push(Alias {
                name: fqdn,
                stripped: None,
            });
        }
        for domain in self.search_domains(namespace) {
            let Some(stripped) = strip_domain(requested, &domain) else {
                continue;
            };
            push(Alias {
                name: stripped.to_string(),
                stripped: Some(stripped.to_string()),
            });
            for fqdn in self.kube_fqdns(namespace, stripped) {
                push(Alias {
                    name: fqdn,
                    stripped: Some(stripped.to_string()),
                });
            }
        }
        out
    }

    /// The Kubernetes FQDNs a partial name may stand for: `svc`, `svc.ns`, `svc.ns.svc`, and
    /// the pod-host forms `pod.sub`, `pod.sub.ns`, `pod.sub.ns.svc`.
    fn kube_fqdns(&self, namespace: &str, name: &str) -> Vec<String> {
        let d = &self.domain;
        let labels = name.split('.').count();
        let ends_svc = name.rsplit('.').next() == Some("svc");
        match labels {
            1 => vec![format!("{name}.{namespace}.svc.{d}")],
            2 => vec![
                format!("{name}.svc.{d}"),
                format!("{name}.{namespace}.svc.{d}"),
            ],
            3 if ends_svc => vec![format!("{name}.{d}"), format!("{name}.svc.{d}")],
            3 => vec![format!("{name}.svc.{d}")],
            4 if ends_svc => vec![format!("{name}.{d}")],
            _ => Vec::new(),
        }
    }

    /// The first alias that names a service (or a headless-service pod) visible to `client`.
    fn find<'s, 'a>(
        &self,
        state: &'s State,
        client: Client<'_>,
        aliases: &'a [Alias],
    ) -> Option<(&'a Alias, String, Server<'s>)> {
        let candidates: Vec<Vec<String>> = aliases.iter().map(|a| wildcards(&a.name)).collect();
        let wanted: HashSet<&str> = candidates.iter().flatten().map(String::as_str).collect();
        let by_host = self.services_named(state, client, &wanted);
        for (alias, names) in aliases.iter().zip(&candidates) {
            for name in names {
                if let Some(svc) = by_host.get(name.as_str()).and_then(|s| best(s, client)) {
                    return Some((alias, name.clone(), Server::Service(svc)));
                }
            }
            if let Some(pods) = self.headless_pods(state, client, &alias.name) {
                return Some((alias, alias.name.clone(), Server::Pods(pods)));
            }
        }
        None
    }

    /// Services visible to `client` whose hostname is one of `wanted`, by hostname. Services
    /// without a VIP are kept only when they are Kubernetes headless services.
    // One pass over the services: the state has no hostname index (see the module report).
    fn services_named<'s>(
        &self,
        state: &'s State,
        client: Client<'_>,
        wanted: &HashSet<&str>,
    ) -> HashMap<String, Vec<&'s Service>> {
        let mut out: HashMap<String, Vec<&Service>> = HashMap::new();
        for svc in state.services() {
            let host = lower(&svc.hostname);
            if !wanted.contains(host.as_ref()) {
                continue;
            }
            if svc.visibility == ServiceVisibility::NamespaceLocal
                && svc.namespace != client.namespace
            {
                continue;
            }
            if svc.vips.is_empty() && !self.is_kube_headless(svc) {
                continue;
            }
            out.entry(host.into_owned()).or_default().push(svc);
        }
        out
    }

    fn is_kube_headless(&self, svc: &Service) -> bool {
        svc.vips.is_empty()
            && lower(&svc.hostname).ends_with(&format!(".{}.svc.{}", svc.namespace, self.domain))
    }

    /// `<pod>.<service>.<ns>.svc.<domain>`: the healthy pods named `<pod>` (or with that
    /// hostname) behind the headless service `<service>.<ns>.svc.<domain>`.
    fn headless_pods<'s>(
        &self,
        state: &'s State,
        client: Client<'_>,
        name: &str,
    ) -> Option<Vec<&'s Workload>> {
        let (pod, service_host) = name.split_once('.')?;
        let rest = service_host.strip_suffix(&format!(".svc.{}", self.domain))?;
        let (_, namespace) = rest.split_once('.')?;
        if namespace.contains('.') {
            return None;
        }
        let key = format!("{namespace}/{service_host}");
        let svc = state.service(&key)?;
        if !self.is_kube_headless(svc)
            || (svc.visibility == ServiceVisibility::NamespaceLocal
                && svc.namespace != client.namespace)
        {
            return None;
        }
        let pods: Vec<&Workload> = state
            .workloads_of_service(&key)
            .into_iter()
            .filter(|w| w.name.eq_ignore_ascii_case(pod) || w.hostname.eq_ignore_ascii_case(pod))
            .filter(|w| include_endpoint(svc, w))
            .collect();
        (!pods.is_empty()).then_some(pods)
    }

    /// Whether a record of `qtype` may be answered for `server` at all: a single-stack
    /// service answers the other family with no records (its pods may still be dual-stack).
    fn family_allowed(&self, server: &Server<'_>, qtype: RecordType) -> bool {
        if qtype == RecordType::AAAA && !self.ipv6_enabled {
            return false;
        }
        match server {
            Server::Service(svc) => !matches!(
                (svc.ip_families, qtype),
                (IpFamilies::Ipv4Only, RecordType::AAAA) | (IpFamilies::Ipv6Only, RecordType::A)
            ),
            Server::Pods(_) => true,
        }
    }

    /// The addresses of `qtype`'s family, in random order.
    fn addresses(
        &self,
        state: &State,
        client: Client<'_>,
        server: &Server<'_>,
        qtype: RecordType,
    ) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = match server {
            Server::Pods(pods) => pods
                .iter()
                .flat_map(|w| w.workload_ips.iter().copied())
                .filter(|ip| of_type(ip, qtype))
                .collect(),
            Server::Service(svc) if svc.vips.is_empty() => state
                .workloads_of_service(&svc.key())
                .into_iter()
                .filter(|w| include_endpoint(svc, w))
                .filter_map(|w| w.workload_ips.iter().copied().find(|ip| of_type(ip, qtype)))
                .collect(),
            Server::Service(svc) => svc
                .vips
                .iter()
                .filter(|v| v.network == client.network && of_type(&v.address, qtype))
                .filter(|v| v.length.is_none_or(|l| l == full_length(&v.address)))
                .map(|v| v.address)
                .collect(),
        };
        out.shuffle(&mut rand::rng());
        out
    }
}

/// The best of the services sharing a hostname: the client's namespace, then `canonical`,
/// then the first.
fn best<'s>(services: &[&'s Service], client: Client<'_>) -> Option<&'s Service> {
    services
        .iter()
        .find(|s| s.namespace == client.namespace)
        .or_else(|| services.iter().find(|s| s.canonical))
        .or_else(|| services.first())
        .copied()
}

fn include_endpoint(svc: &Service, w: &Workload) -> bool {
    w.status == WorkloadStatus::Healthy
        || svc
            .load_balancing
            .as_ref()
            .is_some_and(|lb| lb.health_policy == load_balancing::HealthPolicy::AllowAll)
}

/// `a.b.c`, `*.b.c`, `*.c`.
fn wildcards(name: &str) -> Vec<String> {
    let mut out = vec![name.to_string()];
    let mut rest = name;
    while let Some((_, parent)) = rest.split_once('.') {
        out.push(format!("*.{parent}"));
        rest = parent;
    }
    out
}

/// `name` without the suffix `.domain`, if it has that suffix and something before it.
fn strip_domain<'n>(name: &'n str, domain: &str) -> Option<&'n str> {
    name.strip_suffix(domain)?
        .strip_suffix('.')
        .filter(|s| !s.is_empty())
}

/// A query name as an index key: lower-case ASCII, no trailing dot.
fn name_key(name: &Name) -> String {
    let mut s = name.to_lowercase().to_ascii();
    if s.ends_with('.') {
        s.pop();
    }
    s
}

fn lower(s: &str) -> Cow<'_, str> {
    if s.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(s.to_ascii_lowercase())
    } else {
        Cow::Borrowed(s)
    }
}

fn of_type(ip: &IpAddr, qtype: RecordType) -> bool {
    match ip {
        IpAddr::V4(_) => qtype == RecordType::A,
        IpAddr::V6(_) => qtype == RecordType::AAAA,
    }
}

fn full_length(ip: &IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

#[cfg(test)]
pub(super) mod unit {
    use super::*;

    #[test]
    fn wildcards_decrease_in_specificity() {
        assert_eq!(
            wildcards("svc1.ns1.svc.cluster.local"),
            [
                "svc1.ns1.svc.cluster.local",
                "*.ns1.svc.cluster.local",
                "*.svc.cluster.local",
                "*.cluster.local",
                "*.local"
            ]
        );
        assert_eq!(wildcards("svc1"), ["svc1"]);
    }

    #[test]
    fn kube_fqdns_follow_the_label_count() {
        let n = Names::new("cluster.local.", true);
        assert_eq!(n.kube_fqdns("ns1", "name"), ["name.ns1.svc.cluster.local"]);
        assert_eq!(
            n.kube_fqdns("ns1", "name.ns2"),
            [
                "name.ns2.svc.cluster.local",
                "name.ns2.ns1.svc.cluster.local"
            ]
        );
        assert_eq!(
            n.kube_fqdns("ns1", "name.ns2.svc"),
            [
                "name.ns2.svc.cluster.local",
                "name.ns2.svc.svc.cluster.local"
            ]
        );
        assert_eq!(
            n.kube_fqdns("ns1", "pod.sub.ns.svc"),
            ["pod.sub.ns.svc.cluster.local"]
        );
        assert!(n.kube_fqdns("ns1", "name.ns2.svc.cluster.local").is_empty());
    }

    #[test]
    fn search_domains_are_stripped() {
        let n = Names::new("cluster.local", true);
        let aliases = n.aliases("ns1", "www.google.com.ns1.svc.cluster.local");
        assert!(aliases.contains(&Alias {
            name: "www.google.com".into(),
            stripped: Some("www.google.com".into()),
        }));
        assert_eq!(strip_domain("cluster.local", "cluster.local"), None);
        assert_eq!(strip_domain("xcluster.local", "cluster.local"), None);
    }
}
