use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::*;

fn prev_result() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "mac": "0a:58:0a:01:00:05", "sandbox": "/var/run/netns/p"}],
        "ips": [
            {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0},
            {"address": "fd00::5/64", "interface": 0},
        ],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.96.0.10"]},
        "custom": {"kept": [1, 2, 3]},
    })
}

fn conf(agent_dir: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "istio-cni",
        "plugin_log_level": "debug",
        "cni_agent_run_dir": agent_dir,
        "ambient_enabled": true,
        "exclude_namespaces": ["kube-system", "istio-system"],
        "pod_namespace": "istio-system",
        "prevResult": prev_result(),
    })
}

fn env(command: &str) -> HashMap<String, String> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "c0ffee"),
        ("CNI_NETNS", "/var/run/netns/p"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=app-1;\
             K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID=uid-1;FOO=bar",
        ),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value.to_owned()))
    .collect()
}

fn run_with(vars: &HashMap<String, String>, stdin: &Value) -> Result<Option<Value>, Failure> {
    let bytes = serde_json::to_vec(stdin).expect("encode");
    run(
        &|var| vars.get(var).cloned(),
        &bytes,
        Duration::from_millis(500),
    )
}

fn code_of(vars: &HashMap<String, String>, stdin: &[u8]) -> (u32, String) {
    let failure = run(
        &|var| vars.get(var).cloned(),
        stdin,
        Duration::from_millis(500),
    )
    .expect_err("must fail");
    (failure.error.code(), failure.error.to_string())
}

fn parsed(value: &Value) -> NetConf {
    parse_config(&serde_json::to_vec(value).expect("encode")).expect("parse")
}

#[test]
fn netconf_fields_and_defaults() {
    let conf = parsed(&conf("/run/agent"));
    assert_eq!(conf.cni_version, "1.0.0");
    assert_eq!(conf.name, "k8s-pod-network");
    assert_eq!(conf.plugin_type, "istio-cni");
    assert_eq!(conf.plugin_log_level.as_deref(), Some("debug"));
    assert_eq!(
        conf.agent_socket(),
        std::path::Path::new("/run/agent/pluginevent.sock")
    );
    assert!(conf.ambient_enabled);
    assert_eq!(conf.exclude_namespaces, vec!["kube-system", "istio-system"]);
    assert_eq!(conf.pod_namespace.as_deref(), Some("istio-system"));
    assert_eq!(
        conf.prev_result_ips().expect("ips"),
        vec!["10.1.0.5/24", "fd00::5/64"]
    );

    let minimal = parsed(&json!({"cniVersion": "0.3.1", "name": "n", "type": "istio-cni"}));
    assert_eq!(
        minimal.agent_socket(),
        std::path::Path::new(crate::event::PLUGIN_EVENT_SOCKET)
    );
    assert_eq!(minimal.exclude_namespaces, vec!["kube-system"]);
    assert!(!minimal.ambient_enabled, "upstream's default");
    assert!(matches!(
        minimal.prev_result_ips(),
        Err(PluginError::MissingPrevResult)
    ));
}

#[test]
fn netconf_errors_name_the_field() {
    let cases = [
        (
            json!({"cniVersion": "1.0.0", "ambient_enabled": "yes"}),
            "ambient_enabled",
        ),
        (
            json!({"cniVersion": "1.0.0", "exclude_namespaces": "kube-system"}),
            "exclude_namespaces",
        ),
        (
            json!({"cniVersion": "1.0.0", "exclude_namespaces": ["a", 1]}),
            "exclude_namespaces[1]",
        ),
        (
            json!({"cniVersion": "1.0.0", "prevResult": []}),
            "prevResult",
        ),
        (json!({"cniVersion": "1.0.0", "name": 3}), "name"),
        (json!([1]), "(config)"),
    ];
    for (value, field) in cases {
        match parse_config(value.to_string().as_bytes()) {
            Err(PluginError::InvalidConfig { field: got, .. }) => assert_eq!(got, field),
            other => panic!("{value}: unexpected {other:?}"),
        }
    }
    let mut bad_ip = conf("/x");
    bad_ip["prevResult"]["ips"][1]["address"] = json!("fd00::5");
    match parsed(&bad_ip).prev_result_ips() {
        Err(PluginError::InvalidConfig { field, .. }) => {
            assert_eq!(field, "prevResult.ips[1].address");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn cni_args_parsing() {
    let args = parse_args(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc;\
         K8S_POD_UID=u-1;UNKNOWN=x=y;",
    )
    .expect("parse");
    assert_eq!(
        args,
        K8sArgs {
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: "u-1".into(),
            infra_container_id: "abc".into(),
        }
    );
    assert_eq!(parse_args("").expect("empty"), K8sArgs::default());
    for bad in ["K8S_POD_NAME", "=x", "a=b;oops"] {
        assert!(
            matches!(
                parse_args(bad),
                Err(PluginError::InvalidEnv { var: CNI_ARGS, .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn env_parsing_and_validation() {
    let vars = env("ADD");
    let lookup = |var: &str| vars.get(var).cloned();
    let parsed = parse_env(Command::Add, &lookup).expect("env");
    assert_eq!(parsed.netns, "/var/run/netns/p");
    assert_eq!(parsed.args.pod_uid, "uid-1");
    assert_eq!(parse_command(&lookup).expect("command"), Command::Add);

    // DEL does without CNI_NETNS; ADD and CHECK do not.
    let mut no_netns = env("DEL");
    no_netns.remove("CNI_NETNS");
    let lookup = |var: &str| no_netns.get(var).cloned();
    assert!(parse_env(Command::Del, &lookup).is_ok());
    for command in [Command::Add, Command::Check] {
        assert!(matches!(
            parse_env(command, &lookup),
            Err(PluginError::MissingEnv { var: CNI_NETNS, .. })
        ));
    }
    for (var, value) in [
        ("CNI_CONTAINERID", "-bad"),
        ("CNI_CONTAINERID", "a b"),
        ("CNI_IFNAME", "averyveryverylongname"),
        ("CNI_IFNAME", "eth/0"),
        ("CNI_IFNAME", ".."),
    ] {
        let mut vars = env("ADD");
        vars.insert(var.to_owned(), value.to_owned());
        let lookup = |name: &str| vars.get(name).cloned();
        match parse_env(Command::Add, &lookup) {
            Err(PluginError::InvalidEnv { var: got, .. }) => assert_eq!(got, var),
            other => panic!("{var}={value}: unexpected {other:?}"),
        }
    }
}

/// The error code table of the spec, one row per failure.
#[test]
fn error_code_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agent_dir = dir.path().to_str().expect("utf-8").to_owned();
    let good = serde_json::to_vec(&conf(&agent_dir)).expect("encode");
    let with = |change: &dyn Fn(&mut Value)| {
        let mut value = conf(&agent_dir);
        change(&mut value);
        serde_json::to_vec(&value).expect("encode")
    };
    let without = |var: &str| {
        let mut vars = env("ADD");
        vars.remove(var);
        vars
    };
    let mut partial_args = env("ADD");
    partial_args.insert("CNI_ARGS".into(), "K8S_POD_NAMESPACE=default".into());
    // (case, environment, stdin, expected code, text the details must contain)
    type Row<'a> = (&'a str, HashMap<String, String>, Vec<u8>, u32, &'a str);
    let rows: Vec<Row<'_>> = vec![
        (
            "invalid JSON",
            env("ADD"),
            b"{not json".to_vec(),
            6,
            "not JSON",
        ),
        (
            "missing prevResult",
            env("ADD"),
            with(&|v| v["prevResult"] = Value::Null),
            7,
            "prevResult",
        ),
        (
            "unsupported cniVersion",
            env("ADD"),
            with(&|v| v["cniVersion"] = json!("0.2.0")),
            1,
            "0.2.0",
        ),
        (
            "missing cniVersion",
            env("ADD"),
            with(&|v| v["cniVersion"] = Value::Null),
            1,
            "cniVersion",
        ),
        (
            "missing CNI_NETNS on ADD",
            without("CNI_NETNS"),
            good.clone(),
            4,
            "CNI_NETNS",
        ),
        (
            "missing CNI_CONTAINERID",
            without("CNI_CONTAINERID"),
            good.clone(),
            4,
            "CNI_CONTAINERID",
        ),
        (
            "missing K8S_POD_NAME",
            partial_args,
            good.clone(),
            4,
            "K8S_POD_NAME",
        ),
        ("unknown command", env("FROB"), good.clone(), 4, "FROB"),
        (
            "missing command",
            without("CNI_COMMAND"),
            good.clone(),
            4,
            "CNI_COMMAND",
        ),
        (
            "ambient disabled",
            env("ADD"),
            with(&|v| v["ambient_enabled"] = json!(false)),
            2,
            "ambient_enabled",
        ),
        (
            "bad field type",
            env("ADD"),
            with(&|v| v["exclude_namespaces"] = json!(1)),
            7,
            "exclude_namespaces",
        ),
        (
            "CHECK before 0.4.0",
            env("CHECK"),
            with(&|v| v["cniVersion"] = json!("0.3.1")),
            1,
            "CHECK",
        ),
        (
            "STATUS before 1.1.0",
            env("STATUS"),
            good.clone(),
            1,
            "STATUS",
        ),
        (
            "agent unreachable",
            env("ADD"),
            good.clone(),
            11,
            "pluginevent.sock",
        ),
    ];
    for (name, vars, stdin, code, needle) in rows {
        let (got, text) = code_of(&vars, &stdin);
        assert_eq!(got, code, "{name}: {text}");
        assert!(text.contains(needle), "{name}: {text:?} lacks {needle:?}");
    }
}

#[test]
fn error_json_has_the_spec_fields() {
    let failure = run_with(&env("FROB"), &conf("/x")).expect_err("must fail");
    let value = failure.error.to_json(&failure.cni_version);
    assert_eq!(value["cniVersion"], "1.0.0");
    assert_eq!(value["code"], 4);
    assert_eq!(value["msg"], "invalid necessary environment variables");
    assert!(value["details"].as_str().expect("details").contains("FROB"));
    let output = Output::failure(&failure);
    assert_eq!(output.exit_code, 1);
    assert_eq!(
        serde_json::from_str::<Value>(&output.stdout).expect("json"),
        value
    );
}

#[test]
fn add_passes_prev_result_through_with_the_config_version() {
    // Excluded namespace: no agent needed.
    let mut vars = env("ADD");
    vars.insert(
        "CNI_ARGS".into(),
        "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns".into(),
    );
    for version in ["0.4.0", "1.0.0", "1.1.0"] {
        let mut stdin = conf("/nonexistent");
        stdin["cniVersion"] = json!(version);
        let result = run_with(&vars, &stdin).expect("add").expect("result");
        let mut expected = prev_result();
        expected["cniVersion"] = json!(version);
        assert_eq!(result, expected, "{version}");
    }
}

#[test]
fn add_decisions() {
    let conf = parsed(&conf("/x"));
    let lookup_env = |vars: HashMap<String, String>| {
        parse_env(Command::Add, &|var| vars.get(var).cloned()).expect("env")
    };
    match decide_add(&conf, &lookup_env(env("ADD"))).expect("decide") {
        AddDecision::Send(event) => assert_eq!(
            event,
            CniAddEvent {
                netns: "/var/run/netns/p".into(),
                pod_name: "app-1".into(),
                pod_namespace: "default".into(),
                pod_uid: "uid-1".into(),
                ips: vec!["10.1.0.5/24".into(), "fd00::5/64".into()],
            }
        ),
        other => panic!("unexpected {other:?}"),
    }
    for (args, reason) in [
        ("", "not a Kubernetes pod"),
        (
            "K8S_POD_NAMESPACE=istio-system;K8S_POD_NAME=x",
            "pod namespace excluded",
        ),
    ] {
        let mut vars = env("ADD");
        vars.insert("CNI_ARGS".into(), args.into());
        assert_eq!(
            decide_add(&conf, &lookup_env(vars)).expect("decide"),
            AddDecision::PassThrough(reason)
        );
    }
    let mut own = conf.clone();
    own.exclude_namespaces.clear();
    let mut vars = env("ADD");
    vars.insert(
        "CNI_ARGS".into(),
        "K8S_POD_NAMESPACE=istio-system;K8S_POD_NAME=istio-cni-node-abcde".into(),
    );
    assert_eq!(
        decide_add(&own, &lookup_env(vars)).expect("decide"),
        AddDecision::PassThrough("the istio-cni agent's own pod")
    );
}

#[test]
fn other_commands_succeed_without_the_agent() {
    let stdin = conf("/nonexistent");
    for command in ["DEL", "CHECK"] {
        assert_eq!(run_with(&env(command), &stdin).expect(command), None);
    }
    let mut del = env("DEL");
    del.remove("CNI_NETNS");
    let mut no_prev = stdin.clone();
    no_prev["prevResult"] = Value::Null;
    assert_eq!(run_with(&del, &no_prev).expect("DEL without netns"), None);
    let mut v11 = stdin.clone();
    v11["cniVersion"] = json!("1.1.0");
    for command in ["STATUS", "GC"] {
        let vars: HashMap<String, String> = [("CNI_COMMAND".to_owned(), command.to_owned())].into();
        assert_eq!(run_with(&vars, &v11).expect(command), None);
    }
}

#[test]
fn version_answers_in_the_requested_version() {
    let vars: HashMap<String, String> = [("CNI_COMMAND".to_owned(), "VERSION".to_owned())].into();
    let lookup = |var: &str| vars.get(var).cloned();
    let answer = run(
        &lookup,
        br#"{"cniVersion":"0.4.0"}"#,
        Duration::from_secs(1),
    )
    .expect("version")
    .expect("answer");
    assert_eq!(
        answer,
        json!({"cniVersion": "0.4.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
    let answer = run(&lookup, b"", Duration::from_secs(1))
        .expect("version")
        .expect("answer");
    assert_eq!(answer["cniVersion"], CURRENT_VERSION);
}
