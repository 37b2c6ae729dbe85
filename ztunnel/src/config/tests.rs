use super::*;

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn config(pairs: &[(&str, &str)]) -> Config {
    Config::from_vars(vars(pairs)).expect("valid config")
}

#[test]
fn defaults_match_istio() {
    let c = config(&[(KUBERNETES_SERVICE_HOST, "10.96.0.1")]);
    assert_eq!(
        c.xds_address.as_deref(),
        Some("https://istiod.istio-system.svc:15012")
    );
    assert_eq!(c.ca_address, "https://istiod.istio-system.svc:15012");
    assert_eq!(c.cluster_id, "Kubernetes");
    assert_eq!(c.cluster_domain, "cluster.local");
    assert_eq!(c.secret_ttl, Duration::from_secs(86_400));
    assert_eq!(c.http2.pool_max_streams_per_conn, 100);
    assert_eq!(
        c.http2.pool_unused_release_timeout,
        Duration::from_secs(300)
    );
    assert_eq!(c.http2.stream_window_size, 4_194_304);
    assert_eq!(c.http2.connection_window_size, 16_777_216);
    assert_eq!(c.http2.frame_size, 1_048_576);
    assert_eq!(
        c.keepalive,
        Keepalive {
            time: Duration::from_secs(180),
            interval: Duration::from_secs(180),
            retries: 9,
            enabled: true,
        }
    );
    assert_eq!(c.inpod_uds, PathBuf::from("/var/run/ztunnel/ztunnel.sock"));
    assert!(c.inpod_port_reuse);
    assert_eq!(c.proxy_mode, ProxyMode::Shared);
    assert_eq!(c.packet_mark, Some(1337));
    assert_eq!(c.local_xds_path, None);
    assert!(!c.xds_on_demand);
    assert_eq!(c.termination_deadline, Duration::from_secs(5));
    assert_eq!(
        c.ca_root_cert,
        PathBuf::from("./var/run/secrets/istio/root-cert.pem")
    );
    assert_eq!(c.xds_root_cert, c.ca_root_cert);
    assert_eq!(
        c.auth_token,
        PathBuf::from("./var/run/secrets/tokens/istio-token")
    );
    let p = c.ports;
    assert_eq!(
        [
            p.outbound,
            p.inbound_plaintext,
            p.inbound,
            p.dns,
            p.socks5,
            p.admin,
            p.stats,
            p.readiness
        ],
        [15001, 15006, 15008, 15053, 15080, 15000, 15020, 15021]
    );
    assert_eq!(c.self_info, SelfInfo::default());
}

#[test]
fn off_kubernetes_defaults_to_localhost() {
    let c = config(&[]);
    assert_eq!(c.xds_address.as_deref(), Some("https://localhost:15012"));
    assert_eq!(c.ca_address, "https://localhost:15012");
}

#[test]
fn empty_xds_address_disables_xds() {
    let c = config(&[(XDS_ADDRESS, ""), (KUBERNETES_SERVICE_HOST, "x")]);
    assert_eq!(c.xds_address, None);
    assert_eq!(c.ca_address, DEFAULT_ISTIOD_ADDRESS);
}

#[test]
fn overrides_are_read() {
    let c = config(&[
        (XDS_ADDRESS, "https://istiod.custom:15012"),
        (ISTIO_META_CLUSTER_ID, "meta"),
        (SECRET_TTL, "12h"),
        (POOL_MAX_STREAMS_PER_CONNECTION, "50"),
        (KEEPALIVE_ENABLED, "false"),
        (PROXY_MODE, "dedicated"),
        (LOCAL_XDS_PATH, "/etc/ztunnel/local.yaml"),
        (NODE_NAME, "node-1"),
        (POD_NAME, "ztunnel-abc"),
        (POD_NAMESPACE, "istio-system"),
        (INSTANCE_IP, "10.0.0.5"),
    ]);
    assert_eq!(
        c.xds_address.as_deref(),
        Some("https://istiod.custom:15012")
    );
    assert_eq!(c.cluster_id, "meta");
    assert_eq!(c.secret_ttl, Duration::from_secs(12 * 3600));
    assert_eq!(c.http2.pool_max_streams_per_conn, 50);
    assert!(!c.keepalive.enabled);
    assert_eq!(c.proxy_mode, ProxyMode::Dedicated);
    assert_eq!(c.packet_mark, None, "no default mark in dedicated mode");
    assert_eq!(
        c.local_xds_path,
        Some(PathBuf::from("/etc/ztunnel/local.yaml"))
    );
    assert_eq!(c.self_info.node_name.as_deref(), Some("node-1"));
    assert_eq!(
        c.self_info.instance_ip,
        Some("10.0.0.5".parse().expect("ip"))
    );
    let c = config(&[(CLUSTER_ID, "c1"), (ISTIO_META_CLUSTER_ID, "meta")]);
    assert_eq!(
        c.cluster_id, "c1",
        "CLUSTER_ID wins over ISTIO_META_CLUSTER_ID"
    );
}

#[test]
fn termination_deadline_rule() {
    let c = config(&[(CONNECTION_TERMINATION_DEADLINE, "20s")]);
    assert_eq!(c.termination_deadline, Duration::from_secs(20));
    let c = config(&[(TERMINATION_GRACE_PERIOD_SECONDS, "30")]);
    assert_eq!(c.termination_deadline, Duration::from_secs(25));
    let c = config(&[(TERMINATION_GRACE_PERIOD_SECONDS, "10")]);
    assert_eq!(c.termination_deadline, Duration::from_secs(9));
    assert_eq!(termination_from_grace(0), 0);
    let c = config(&[
        (CONNECTION_TERMINATION_DEADLINE, "2s"),
        (TERMINATION_GRACE_PERIOD_SECONDS, "30"),
    ]);
    assert_eq!(c.termination_deadline, Duration::from_secs(2));
}

#[test]
fn every_bad_value_is_reported_together() {
    let err = Config::from_vars(vars(&[
        (SECRET_TTL, "a day"),
        (POOL_MAX_STREAMS_PER_CONNECTION, "0"),
        (HTTP2_FRAME_SIZE, "1024"),
        (HTTP2_STREAM_WINDOW_SIZE, "big"),
        (KEEPALIVE_ENABLED, "yes"),
        (KEEPALIVE_RETRIES, "-1"),
        (PROXY_MODE, "sidecar"),
        (PACKET_MARK, "0x539"),
        (INSTANCE_IP, "10.0.0"),
        (TERMINATION_GRACE_PERIOD_SECONDS, "thirty"),
    ]))
    .expect_err("bad values must fail");
    let ConfigError::InvalidVars(errors) = &err;
    let mut vars: Vec<&str> = errors.iter().map(VarError::var).collect();
    vars.sort_unstable();
    assert_eq!(
        vars,
        [
            HTTP2_FRAME_SIZE,
            HTTP2_STREAM_WINDOW_SIZE,
            INSTANCE_IP,
            KEEPALIVE_ENABLED,
            KEEPALIVE_RETRIES,
            PACKET_MARK,
            POOL_MAX_STREAMS_PER_CONNECTION,
            PROXY_MODE,
            SECRET_TTL,
            TERMINATION_GRACE_PERIOD_SECONDS,
        ]
    );
    let msg = err.to_string();
    assert!(
        msg.contains("SECRET_TTL=\"a day\" is not a duration"),
        "{msg}"
    );
    assert!(msg.contains("PROXY_MODE=\"sidecar\""), "{msg}");
    assert_eq!(err.reason(), "invalid_env");
}

#[test]
fn serializes_camel_case_for_config_dump() {
    let c = config(&[(KUBERNETES_SERVICE_HOST, "x")]);
    let json = serde_json::to_value(&c).expect("serialize");
    assert_eq!(json["xdsAddress"], "https://istiod.istio-system.svc:15012");
    assert_eq!(json["secretTtl"], "1day");
    assert_eq!(json["http2"]["poolUnusedReleaseTimeout"], "5m");
    assert_eq!(json["keepalive"]["time"], "3m");
    assert_eq!(json["proxyMode"], "shared");
    assert_eq!(json["packetMark"], 1337);
    assert_eq!(json["ports"]["inboundPlaintext"], 15006);
}

#[test]
fn worker_threads_default_and_override() {
    let c = Config::from_vars(Vec::<(String, String)>::new()).expect("defaults");
    assert!(c.worker_threads >= 2);
    let c = Config::from_vars([(ZTUNNEL_WORKER_THREADS.to_string(), "3".to_string())])
        .expect("override");
    assert_eq!(c.worker_threads, 3);
    let err = Config::from_vars([(ZTUNNEL_WORKER_THREADS.to_string(), "0".to_string())])
        .expect_err("zero");
    assert!(err.to_string().contains(ZTUNNEL_WORKER_THREADS), "{err}");
}

#[test]
fn original_source_is_automatic_unless_set() {
    let c = Config::from_vars(Vec::<(String, String)>::new()).expect("defaults");
    assert_eq!(c.enable_original_source, None);
    for (value, want) in [("true", Some(true)), ("false", Some(false))] {
        let c =
            Config::from_vars([(ENABLE_ORIG_SRC.to_string(), value.to_string())]).expect("boolean");
        assert_eq!(c.enable_original_source, want, "{value}");
    }
    let err = Config::from_vars([(ENABLE_ORIG_SRC.to_string(), "sometimes".to_string())])
        .expect_err("not a boolean");
    assert!(
        err.to_string().contains(ENABLE_ORIG_SRC) && err.to_string().contains("sometimes"),
        "{err}"
    );
}

#[test]
fn addresses_without_a_scheme_are_https() {
    let c = config(&[
        (XDS_ADDRESS, "istiod-canary.istio-system.svc:15012"),
        (CA_ADDRESS, "istiod.istio-system.svc:15012"),
        (KUBERNETES_SERVICE_HOST, "x"),
    ]);
    assert_eq!(
        c.xds_address.as_deref(),
        Some("https://istiod-canary.istio-system.svc:15012")
    );
    assert_eq!(c.ca_address, "https://istiod.istio-system.svc:15012");
    let plain = config(&[
        (XDS_ADDRESS, "http://127.0.0.1:15010"),
        (KUBERNETES_SERVICE_HOST, "x"),
    ]);
    assert_eq!(plain.xds_address.as_deref(), Some("http://127.0.0.1:15010"));
}
