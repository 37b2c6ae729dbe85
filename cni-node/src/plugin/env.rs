//! The CNI environment (`CNI_COMMAND`, `CNI_CONTAINERID`, ...) and `CNI_ARGS`.

use super::PluginError;

pub const CNI_COMMAND: &str = "CNI_COMMAND";
pub const CNI_CONTAINERID: &str = "CNI_CONTAINERID";
pub const CNI_NETNS: &str = "CNI_NETNS";
pub const CNI_IFNAME: &str = "CNI_IFNAME";
pub const CNI_ARGS: &str = "CNI_ARGS";
pub const CNI_PATH: &str = "CNI_PATH";

/// The CNI operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn parse(value: &str) -> Option<Command> {
        Some(match value {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }

    /// The variables this command cannot do without (as libcni's `skel` requires them).
    fn required(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => &[CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH],
            Command::Del => &[CNI_CONTAINERID, CNI_IFNAME, CNI_PATH],
            Command::Version | Command::Status | Command::Gc => &[],
        }
    }
}

/// What the runtime passed in the environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniEnv {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: K8sArgs,
    pub path: String,
}

/// The Kubernetes keys of `CNI_ARGS` (containerd and CRI-O pass these); other keys are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct K8sArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub infra_container_id: String,
}

/// Reads `CNI_COMMAND`.
pub fn command(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Command, PluginError> {
    let value = lookup(CNI_COMMAND).unwrap_or_default();
    if value.is_empty() {
        return Err(PluginError::MissingEnv {
            var: CNI_COMMAND,
            command: "any",
        });
    }
    Command::parse(&value).ok_or(PluginError::UnknownCommand(value))
}

/// Reads and checks the variables `command` uses.
pub fn parse(
    command: Command,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<CniEnv, PluginError> {
    let get = |var: &'static str| -> Result<String, PluginError> {
        let value = lookup(var).unwrap_or_default();
        if value.is_empty() && command.required().contains(&var) {
            return Err(PluginError::MissingEnv {
                var,
                command: command.as_str(),
            });
        }
        Ok(value)
    };
    let env = CniEnv {
        container_id: get(CNI_CONTAINERID)?,
        netns: get(CNI_NETNS)?,
        ifname: get(CNI_IFNAME)?,
        args: parse_args(&get(CNI_ARGS)?)?,
        path: get(CNI_PATH)?,
    };
    if !env.container_id.is_empty() {
        check_container_id(&env.container_id)?;
    }
    if !env.ifname.is_empty() {
        check_ifname(&env.ifname)?;
    }
    Ok(env)
}

/// Parses `KEY=VALUE;KEY=VALUE` (empty segments are skipped, unknown keys ignored).
pub fn parse_args(args: &str) -> Result<K8sArgs, PluginError> {
    let mut parsed = K8sArgs::default();
    for pair in args.split(';').filter(|pair| !pair.trim().is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .filter(|(key, _)| !key.trim().is_empty())
            .ok_or_else(|| PluginError::InvalidEnv {
                var: CNI_ARGS,
                value: args.to_owned(),
                why: format!("{pair:?} is not KEY=VALUE"),
            })?;
        let value = value.trim().to_owned();
        match key.trim() {
            "K8S_POD_NAME" => parsed.pod_name = value,
            "K8S_POD_NAMESPACE" => parsed.pod_namespace = value,
            "K8S_POD_UID" => parsed.pod_uid = value,
            "K8S_POD_INFRA_CONTAINER_ID" => parsed.infra_container_id = value,
            _ => {}
        }
    }
    Ok(parsed)
}

/// The spec: starts with an alphanumeric, then alphanumerics, `_`, `.` or `-`.
fn check_container_id(id: &str) -> Result<(), PluginError> {
    let mut chars = id.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if valid {
        return Ok(());
    }
    Err(PluginError::InvalidEnv {
        var: CNI_CONTAINERID,
        value: id.to_owned(),
        why: "use an alphanumeric first, then alphanumerics, '_', '.' or '-'".to_owned(),
    })
}

/// The spec: a Linux interface name (under 16 bytes, not `.`/`..`, no `/`, `:` or spaces).
fn check_ifname(name: &str) -> Result<(), PluginError> {
    let why = if name.len() > 15 {
        Some("must be shorter than 16 characters")
    } else if name == "." || name == ".." {
        Some("must not be . or ..")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("must not contain '/', ':' or whitespace")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(PluginError::InvalidEnv {
            var: CNI_IFNAME,
            value: name.to_owned(),
            why: why.to_owned(),
        }),
    }
}
