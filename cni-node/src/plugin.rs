//! The `istio-cni` chained CNI plugin (CNI spec 0.3.0 .. 1.1.0), ambient mode.
//!
//! On ADD it sends the pod's netns and `prevResult` IPs to the node agent
//! ([`crate::event::post_add`] on `<cni_agent_run_dir>/pluginevent.sock`) and succeeds, passing
//! `prevResult` through, only when the agent answered 200 (the pod is captured and ztunnel
//! acked it). Pods that are not Kubernetes pods, in an excluded namespace (`kube-system` by
//! default) or the agent's own pods pass through without contacting the agent. DEL, CHECK,
//! STATUS and GC succeed without contacting it, as upstream's plugin does. Errors are the
//! spec's JSON on stdout (see [`PluginError::code`]); logs go to stderr.
//!
//! Unlike upstream, the plugin does not ask the Kubernetes API whether the pod is ambient: the
//! agent decides (it answers 200 for pods it does not enroll), and it also writes the sidecar
//! capture of injected pods that leave it to the CNI ([`crate::sidecar`]).

mod config;
mod env;

use std::time::Duration;

use serde_json::{json, Value};

pub use config::{
    at_least, check_version, parse as parse_config, requested_version, NetConf, CURRENT_VERSION,
    DEFAULT_AGENT_RUN_DIR, DEFAULT_EXCLUDE_NAMESPACES, SUPPORTED_VERSIONS,
};
pub use env::{
    command as parse_command, parse as parse_env, parse_args, CniEnv, Command, K8sArgs, CNI_ARGS,
    CNI_COMMAND, CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS, CNI_PATH,
};

use crate::event::{post_add, CniAddEvent, EventError};

/// How long ADD waits for the agent (capture and ztunnel's ack included). Upstream waits 1 s;
/// a timeout makes the kubelet recreate the whole sandbox, so we allow more.
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Name prefix of the istio-cni agent's own pods (never held up, like upstream).
pub const AGENT_POD_PREFIX: &str = "istio-cni-node-";

/// Why a CNI command failed; [`PluginError::code`] is the spec's error code.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot read the network configuration from stdin: {0}")]
    Stdin(#[source] std::io::Error),
    #[error(
        "{CNI_COMMAND}={0:?} is not a CNI command: use ADD, DEL, CHECK, VERSION, STATUS or GC"
    )]
    UnknownCommand(String),
    #[error("{var} is required for {command} but not set; the container runtime must set it")]
    MissingEnv {
        var: &'static str,
        command: &'static str,
    },
    #[error("{var}={value:?} is not valid: {why}")]
    InvalidEnv {
        var: &'static str,
        value: String,
        why: String,
    },
    #[error("{CNI_ARGS} has {present} but not {missing}; pass both or neither")]
    PartialK8sArgs {
        present: &'static str,
        missing: &'static str,
    },
    #[error("the network configuration on stdin is not JSON: {0}")]
    Decode(#[source] serde_json::Error),
    #[error("invalid network configuration, field {field}: {why}")]
    InvalidConfig { field: String, why: String },
    #[error(
        "prevResult is missing: istio-cni is a chained plugin, list it after the pod network \
         plugin in the conflist"
    )]
    MissingPrevResult,
    #[error(
        "cniVersion {0:?} is not supported: use one of {supported}",
        supported = SUPPORTED_VERSIONS.join(", ")
    )]
    IncompatibleVersion(String),
    #[error("{command} needs cniVersion {minimum} or later, the configuration has {version}")]
    CommandNotInVersion {
        command: &'static str,
        version: String,
        minimum: &'static str,
    },
    #[error("unsupported field {field}={value}: {why}")]
    UnsupportedField {
        field: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("istio-cni cmdAdd failed to contact the node istio-cni agent: {0}")]
    Agent(#[source] EventError),
}

impl PluginError {
    /// The CNI spec's error code: 1 incompatible version, 2 unsupported field, 4 invalid
    /// environment, 5 I/O, 6 undecodable, 7 invalid configuration, 11 try again later, and 100
    /// for an agent that rejected the event (plugin/agent mismatch).
    pub fn code(&self) -> u32 {
        match self {
            PluginError::IncompatibleVersion(_) | PluginError::CommandNotInVersion { .. } => 1,
            PluginError::UnsupportedField { .. } => 2,
            PluginError::UnknownCommand(_)
            | PluginError::MissingEnv { .. }
            | PluginError::InvalidEnv { .. }
            | PluginError::PartialK8sArgs { .. } => 4,
            PluginError::Stdin(_) => 5,
            PluginError::Decode(_) => 6,
            PluginError::InvalidConfig { .. } | PluginError::MissingPrevResult => 7,
            PluginError::Agent(error) if error.is_retryable() => 11,
            PluginError::Agent(_) => 100,
        }
    }

    /// The short `msg` of the error JSON (the `details` are the full text).
    pub fn msg(&self) -> &'static str {
        match self.code() {
            1 => "incompatible CNI version",
            2 => "unsupported field in network configuration",
            4 => "invalid necessary environment variables",
            5 => "I/O failure",
            6 => "failed to decode content",
            7 => "invalid network configuration",
            11 => "istio-cni agent not ready, try again later",
            _ => "istio-cni agent rejected the pod",
        }
    }

    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PluginError::Stdin(_) => "stdin",
            PluginError::UnknownCommand(_) => "unknown_command",
            PluginError::MissingEnv { .. } => "missing_env",
            PluginError::InvalidEnv { .. } => "invalid_env",
            PluginError::PartialK8sArgs { .. } => "partial_k8s_args",
            PluginError::Decode(_) => "decode",
            PluginError::InvalidConfig { .. } => "invalid_config",
            PluginError::MissingPrevResult => "missing_prev_result",
            PluginError::IncompatibleVersion(_) => "incompatible_version",
            PluginError::CommandNotInVersion { .. } => "command_not_in_version",
            PluginError::UnsupportedField { .. } => "unsupported_field",
            PluginError::Agent(error) => error.reason(),
        }
    }

    /// The spec's error JSON: `{"cniVersion", "code", "msg", "details"}`.
    pub fn to_json(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": cni_version,
            "code": self.code(),
            "msg": self.msg(),
            "details": self.to_string(),
        })
    }
}

/// A failed command and the version to report it in.
#[derive(Debug)]
pub struct Failure {
    pub error: PluginError,
    pub cni_version: String,
}

impl Failure {
    fn new(error: PluginError, cni_version: &str) -> Failure {
        Failure {
            error,
            cni_version: cni_version.to_owned(),
        }
    }
}

/// What the binary prints and its exit status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub exit_code: i32,
}

impl Output {
    pub fn failure(failure: &Failure) -> Output {
        Output {
            stdout: failure.error.to_json(&failure.cni_version).to_string(),
            exit_code: 1,
        }
    }
}

/// Runs one CNI command: `lookup` reads the environment, `stdin` is the configuration.
pub fn execute(lookup: &dyn Fn(&str) -> Option<String>, stdin: &[u8]) -> Output {
    match run(lookup, stdin, AGENT_TIMEOUT) {
        Ok(Some(result)) => Output {
            stdout: result.to_string(),
            exit_code: 0,
        },
        Ok(None) => Output {
            stdout: String::new(),
            exit_code: 0,
        },
        Err(failure) => {
            tracing::error!(error = %failure.error, code = failure.error.code(), "istio-cni failed");
            Output::failure(&failure)
        }
    }
}

/// Runs one CNI command; `Ok(Some(_))` is the result to print (ADD, VERSION).
pub fn run(
    lookup: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
    agent_timeout: Duration,
) -> Result<Option<Value>, Failure> {
    let fallback = requested_version(stdin).unwrap_or_else(|| CURRENT_VERSION.to_owned());
    let command = env::command(lookup).map_err(|error| Failure::new(error, &fallback))?;
    if command == Command::Version {
        return Ok(Some(json!({
            "cniVersion": fallback,
            "supportedVersions": SUPPORTED_VERSIONS,
        })));
    }
    let conf = config::parse(stdin).map_err(|error| Failure::new(error, &fallback))?;
    let version = conf.cni_version.clone();
    let fail = |error| Failure::new(error, &version);
    let cni_env = env::parse(command, lookup).map_err(fail)?;
    match command {
        Command::Add => add(&conf, &cni_env, agent_timeout).map(Some).map_err(fail),
        Command::Check => needs_version(command, &conf, "0.4.0")
            .map(|()| None)
            .map_err(fail),
        Command::Status | Command::Gc => needs_version(command, &conf, "1.1.0")
            .map(|()| None)
            .map_err(fail),
        Command::Del | Command::Version => Ok(None),
    }
}

fn needs_version(
    command: Command,
    conf: &NetConf,
    minimum: &'static str,
) -> Result<(), PluginError> {
    if at_least(&conf.cni_version, minimum) {
        return Ok(());
    }
    Err(PluginError::CommandNotInVersion {
        command: command.as_str(),
        version: conf.cni_version.clone(),
        minimum,
    })
}

/// What ADD does with a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddDecision {
    /// Pass `prevResult` through without contacting the agent, for this reason.
    PassThrough(&'static str),
    /// Tell the agent.
    Send(CniAddEvent),
}

/// Decides ADD from the configuration and environment (no I/O).
pub fn decide_add(conf: &NetConf, cni_env: &CniEnv) -> Result<AddDecision, PluginError> {
    let ips = conf.prev_result_ips()?;
    if !conf.ambient_enabled {
        return Err(PluginError::UnsupportedField {
            field: "ambient_enabled",
            value: "false".to_owned(),
            why: "this istio-cni implements ambient mode only (sidecar traffic capture is not \
                  supported); set \"ambient_enabled\": true in the conflist",
        });
    }
    let args = &cni_env.args;
    match (args.pod_name.is_empty(), args.pod_namespace.is_empty()) {
        (true, true) => return Ok(AddDecision::PassThrough("not a Kubernetes pod")),
        (true, false) => return Err(partial("K8S_POD_NAMESPACE", "K8S_POD_NAME")),
        (false, true) => return Err(partial("K8S_POD_NAME", "K8S_POD_NAMESPACE")),
        (false, false) => {}
    }
    if conf.exclude_namespaces.contains(&args.pod_namespace) {
        return Ok(AddDecision::PassThrough("pod namespace excluded"));
    }
    if args.pod_name.starts_with(AGENT_POD_PREFIX)
        && conf.pod_namespace.as_deref() == Some(args.pod_namespace.as_str())
    {
        return Ok(AddDecision::PassThrough("the istio-cni agent's own pod"));
    }
    Ok(AddDecision::Send(CniAddEvent {
        netns: cni_env.netns.clone(),
        pod_name: args.pod_name.clone(),
        pod_namespace: args.pod_namespace.clone(),
        pod_uid: args.pod_uid.clone(),
        ips,
    }))
}

fn partial(present: &'static str, missing: &'static str) -> PluginError {
    PluginError::PartialK8sArgs { present, missing }
}

/// ADD: decide, maybe tell the agent, then pass `prevResult` through.
fn add(conf: &NetConf, cni_env: &CniEnv, agent_timeout: Duration) -> Result<Value, PluginError> {
    let pod = format!("{}/{}", cni_env.args.pod_namespace, cni_env.args.pod_name);
    match decide_add(conf, cni_env)? {
        AddDecision::PassThrough(reason) => {
            tracing::info!(%pod, reason, "istio-cni ADD: passing through");
        }
        AddDecision::Send(event) => {
            let socket = conf.agent_socket();
            tracing::debug!(%pod, socket = %socket.display(), ?event, "istio-cni ADD: sending");
            post_add(&socket, &event, agent_timeout).map_err(PluginError::Agent)?;
            tracing::info!(%pod, ips = ?event.ips, "istio-cni ADD: agent accepted the pod");
        }
    }
    pass_through(conf)
}

/// `prevResult` unchanged except `cniVersion`, which becomes the configuration's.
pub fn pass_through(conf: &NetConf) -> Result<Value, PluginError> {
    let mut result = conf
        .prev_result
        .clone()
        .ok_or(PluginError::MissingPrevResult)?;
    result.insert(
        "cniVersion".to_owned(),
        Value::String(conf.cni_version.clone()),
    );
    Ok(Value::Object(result))
}

#[cfg(test)]
mod tests;
