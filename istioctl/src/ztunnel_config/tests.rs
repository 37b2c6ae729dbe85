//! Tables from a real dump: `tests/fixtures/ztunnel-config-dump.json` was taken from our
//! ztunnel's `/config_dump` (istiod serving examples/local/cluster, ztunnel as node1), then
//! given a waypoint (service + pod, used by server-v1 and the server service), an unhealthy
//! workload, an Initializing and an Unavailable certificate and a workloadState entry, all in
//! ztunnel's own shapes.

use super::tables::{rfc3339, serial_hex};
use super::*;

const FIXTURE: &str = include_str!("../../tests/fixtures/ztunnel-config-dump.json");

fn dump() -> ConfigDump {
    ConfigDump::parse(FIXTURE.as_bytes()).expect("fixture parses")
}

fn now() -> i64 {
    rfc3339("2026-11-30T12:00:00Z").expect("time")
}

fn short(section: Section, filter: &Filter) -> String {
    render(&dump(), section, Output::Short, filter, now()).expect("renders")
}

const WORKLOADS: &str = "\
NAMESPACE POD NAME                  ADDRESS     NODE  WAYPOINT PROTOCOL
demo      billing-vm                10.10.0.5         None     HBONE
demo      client                    10.244.1.11 node1 None     HBONE
demo      server-v1-7d9c6b5f4-abcde 10.244.1.10 node1 waypoint HBONE
demo      server-v2-5f8d7c9b6-fghij 10.244.2.10 node2 None     HBONE
demo      waypoint-6d8f9c7b5-xyz12  10.244.1.30 node1 None     NONE
legacy    legacy-client             10.244.2.20 node2 None     NONE
";

const SERVICES: &str = "\
NAMESPACE SERVICE NAME SERVICE VIP WAYPOINT ENDPOINTS
demo      billing      240.240.0.5 None     1/1
demo      server       10.96.0.10  waypoint 1/2
demo      waypoint     10.96.0.20  None     1/1
";

const POLICIES: &str = "\
NAMESPACE    POLICY NAME                   ACTION SCOPE
demo         server-allow-client           Allow  WorkloadSelector
istio-system deny-doc-range                Deny   Global
istio-system istio_converted_static_strict Deny   WorkloadSelector
";

const CERTIFICATES: &str = "\
CERTIFICATE NAME                                TYPE     STATUS           VALID CERT     SERIAL NUMBER                        NOT AFTER                NOT BEFORE
spiffe://cluster.local/ns/demo/sa/client        Leaf     Available        true           692618d8d9203dc531e13e4e0e377292     2026-11-30T23:10:24Z     2026-11-29T23:09:24Z
spiffe://cluster.local/ns/demo/sa/client        Root     Available        true           1d00606d68a040148869e2bb203493e8     2036-11-26T23:10:19Z     2026-11-29T23:09:19Z
spiffe://cluster.local/ns/demo/sa/server        Leaf     Available        true           37bfb0df80479b096c85bef2fac18d48     2026-11-30T23:10:24Z     2026-11-29T23:09:24Z
spiffe://cluster.local/ns/demo/sa/server        Root     Available        true           1d00606d68a040148869e2bb203493e8     2036-11-26T23:10:19Z     2026-11-29T23:09:19Z
spiffe://cluster.local/ns/demo/sa/waypoint      NA       Initializing     false          NA                                   NA                       NA
spiffe://cluster.local/ns/legacy/sa/default     NA       Unavailable      false          NA                                   NA                       NA
";

#[test]
fn workload_table() {
    assert_eq!(short(Section::Workloads, &Filter::default()), WORKLOADS);
}

#[test]
fn service_table_counts_healthy_endpoints_and_names_waypoints() {
    assert_eq!(short(Section::Services, &Filter::default()), SERVICES);
}

#[test]
fn policy_table() {
    assert_eq!(short(Section::Policies, &Filter::default()), POLICIES);
}

#[test]
fn certificate_table() {
    assert_eq!(
        short(Section::Certificates, &Filter::default()),
        CERTIFICATES
    );
    // After the leaves expire they are shown as not valid.
    let later = rfc3339("2026-12-01T00:00:00Z").expect("time");
    let t = render(
        &dump(),
        Section::Certificates,
        Output::Short,
        &Filter::default(),
        later,
    )
    .expect("renders");
    let leaf = t.lines().nth(1).expect("leaf row");
    assert!(
        leaf.contains(" Leaf ") && leaf.contains(" false "),
        "{leaf}"
    );
}

#[test]
fn all_is_every_table_after_a_blank_line() {
    let all = short(Section::All, &Filter::default());
    assert_eq!(
        all,
        format!("\n{WORKLOADS}\n{SERVICES}\n{POLICIES}\n{CERTIFICATES}")
    );
    assert!(!all.contains("workloadState") && !all.contains("DIRECTION"));
}

#[test]
fn filters_by_node_namespace_and_address() {
    let node1 = Filter {
        node: Some("NODE1".into()),
        ..Filter::default()
    };
    let t = short(Section::Workloads, &node1);
    assert_eq!(t.lines().count(), 4, "{t}");
    assert!(t.lines().skip(1).all(|l| l.contains(" node1 ")), "{t}");
    let legacy = Filter {
        namespace: Some("legacy".into()),
        ..Filter::default()
    };
    assert_eq!(
        short(Section::Workloads, &legacy),
        "NAMESPACE POD NAME      ADDRESS     NODE  WAYPOINT PROTOCOL\nlegacy    legacy-client 10.244.2.20 node2 None     NONE\n"
    );
    assert_eq!(
        short(Section::Policies, &legacy),
        "NAMESPACE POLICY NAME ACTION SCOPE\n"
    );
    let by_ip = Filter {
        address: Some("10.244.1.11".into()),
        ..Filter::default()
    };
    let t = short(Section::Workloads, &by_ip);
    assert!(t.lines().count() == 2 && t.contains("client"), "{t}");
}

#[test]
fn json_and_yaml_print_the_raw_sections() {
    let d = dump();
    let filter = Filter {
        node: Some("node2".into()),
        ..Filter::default()
    };
    let json = render(&d, Section::Workloads, Output::Json, &filter, now()).expect("json");
    assert!(
        json.starts_with("[\n    {\n        \"applicationTunnel\": null,"),
        "4-space indent: {json}"
    );
    let back: Value = serde_json::from_str(&json).expect("valid json");
    let names: Vec<&str> = back
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    assert_eq!(names, ["server-v2-5f8d7c9b6-fghij", "legacy-client"]);
    // Raw fields the tables do not use are kept.
    assert_eq!(back[0]["canonicalRevision"], "v2");

    let yaml = render(&d, Section::Certificates, Output::Yaml, &filter, now()).expect("yaml");
    let back: Value = serde_yaml::from_str(&yaml).expect("valid yaml");
    assert_eq!(
        back[0]["identity"],
        "spiffe://cluster.local/ns/demo/sa/client"
    );
    assert!(back[0]["certChain"][0]["pem"]
        .as_str()
        .is_some_and(|p| p.starts_with("-----BEGIN CERTIFICATE-----")));

    let all = render(&d, Section::All, Output::Json, &filter, now()).expect("json");
    let back: Value = serde_json::from_str(&all).expect("valid json");
    assert_eq!(back, d.raw, "all -o json is the whole dump");
}

/// Upstream ztunnel's shapes: sections as maps, VIPs and waypoint destinations as strings,
/// endpoints on services, decimal serials and a separate root list.
#[test]
fn reads_upstream_ztunnel_dumps() {
    let upstream = r#"{
      "workloads": {"k1": {"uid": "c//Pod/bookinfo/details", "name": "details-v1", "namespace": "bookinfo",
        "workloadIps": ["10.244.2.51"], "node": "worker2", "protocol": "HBONE", "status": "Healthy",
        "waypoint": {"destination": "bookinfo/namespace-istio-waypoint.bookinfo.svc.cluster.local"}}},
      "services": [
        {"name": "details", "namespace": "bookinfo", "hostname": "details.bookinfo.svc.cluster.local",
         "vips": ["/10.96.200.228"], "endpoints": {"e": {"workloadUid": "c//Pod/bookinfo/details"}},
         "waypoint": {"destination": "/10.96.65.117"}},
        {"name": "namespace-istio-waypoint", "namespace": "bookinfo",
         "hostname": "namespace-istio-waypoint.bookinfo.svc.cluster.local", "vips": ["/10.96.65.117"]}],
      "policies": [],
      "certificates": [{"identity": "spiffe://cluster.local/ns/bookinfo/sa/details", "state": "Available",
        "certChain": [{"serialNumber": "305419896", "validFrom": "2023-03-21T13:02:57Z", "expirationTime": "2033-03-22T13:04:57Z"}],
        "rootCerts": [{"serialNumber": "4660", "validFrom": "2022-03-21T13:04:49Z", "expirationTime": "2022-03-18T13:04:49Z"}]}]
    }"#;
    let d = ConfigDump::parse(upstream.as_bytes()).expect("parses");
    let f = Filter::default();
    let w = render(&d, Section::Workloads, Output::Short, &f, now()).expect("renders");
    assert!(
        w.contains("details-v1 10.244.2.51 worker2 namespace-istio-waypoint HBONE"),
        "{w}"
    );
    let s = render(&d, Section::Services, Output::Short, &f, now()).expect("renders");
    assert!(
        s.contains("details                  10.96.200.228 namespace-istio-waypoint 1/1"),
        "{s}"
    );
    assert!(
        s.contains("namespace-istio-waypoint 10.96.65.117  None                     0/0"),
        "{s}"
    );
    let c = render(&d, Section::Certificates, Output::Short, &f, now()).expect("renders");
    assert!(
        c.contains("Leaf     Available     true           12345678"),
        "{c}"
    );
    assert!(
        c.contains("Root     Available     false          1234"),
        "{c}"
    );
}

#[test]
fn serials_and_times() {
    assert_eq!(serial_hex("305419896"), "12345678");
    assert_eq!(
        serial_hex("340282366920938463463374607431768211455"),
        "ffffffffffffffffffffffffffffffff"
    );
    assert_eq!(serial_hex("1D00606D"), "1d00606d");
    assert_eq!(serial_hex("032590d6754c"), "32590d6754c");
    assert_eq!(serial_hex(""), "NA");
    assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800));
    assert_eq!(rfc3339("2000-03-01T01:30:00.5+01:30"), Some(951_868_800));
    assert_eq!(rfc3339("not a time"), None);
}

#[test]
fn bad_dumps_say_what_is_wrong() {
    let err = ConfigDump::parse(b"<html>").expect_err("not json");
    assert!(err.to_string().contains("ztunnel admin endpoint"), "{err}");
    assert_eq!(err.reason(), "not_json");
    let err = ConfigDump::parse(br#"{"workloads": [{"name": 5}]}"#).expect_err("bad entry");
    assert!(err.to_string().contains("workloads[0]"), "{err}");
    let empty = ConfigDump::parse(b"{}").expect("empty dump");
    let t = render(
        &empty,
        Section::Workloads,
        Output::Short,
        &Filter::default(),
        0,
    )
    .expect("renders");
    assert_eq!(t, "NAMESPACE POD NAME ADDRESS NODE WAYPOINT PROTOCOL\n");
}
