//! `pilot-agent istio-iptables`: the sidecar's init step (the `istio-init` container) and its
//! validation (`istio-validation`, with `--run-validation --skip-rule-apply` when cni-node
//! writes the rules). Istio's flags, short and long, and their environment variables; the
//! rules are always native nftables written over netlink (there is no iptables binary to
//! call), in the pod's network namespace.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use mesh_capture::{HBONE_PORT, INBOUND_CAPTURE_PORT, OUTBOUND_CAPTURE_PORT};
use mesh_sidecar_capture::config::{self, CaptureConfig, ConfigError};
use mesh_sidecar_capture::validation::{self, Validation, ValidationError};
use mesh_sidecar_capture::CaptureError;

/// Istio's `istio-iptables` command line.
#[derive(Args, Debug, Clone)]
pub struct IptablesArgs {
    /// Port outbound TCP is redirected to (the proxy's outbound listener).
    #[arg(short = 'p', long = "envoy-port", default_value_t = OUTBOUND_CAPTURE_PORT)]
    pub envoy_port: u16,
    /// Port inbound TCP is redirected to.
    #[arg(short = 'z', long = "inbound-capture-port", env = "INBOUND_CAPTURE_PORT", default_value_t = INBOUND_CAPTURE_PORT)]
    pub inbound_capture_port: u16,
    /// The HBONE port, never redirected.
    #[arg(short = 'e', long = "inbound-tunnel-port", env = "INBOUND_TUNNEL_PORT", default_value_t = HBONE_PORT)]
    pub inbound_tunnel_port: u16,
    /// Uids whose traffic is not redirected (comma-separated).
    #[arg(
        short = 'u',
        long = "proxy-uid",
        env = "PROXY_UID",
        default_value = "1337"
    )]
    pub proxy_uid: String,
    /// Gids whose traffic is not redirected (comma-separated; defaults to the uids).
    #[arg(short = 'g', long = "proxy-gid", env = "PROXY_GID")]
    pub proxy_gid: Option<String>,
    /// REDIRECT (TPROXY is not supported).
    #[arg(
        short = 'm',
        long = "istio-inbound-interception-mode",
        env = "ISTIO_INBOUND_INTERCEPTION_MODE",
        default_value = "REDIRECT"
    )]
    pub mode: String,
    /// Inbound ports redirected to the proxy: a list, `*` for all, empty for none.
    #[arg(
        short = 'b',
        long = "istio-inbound-ports",
        env = "ISTIO_INBOUND_PORTS",
        default_value = ""
    )]
    pub inbound_ports: String,
    /// Inbound ports not redirected when `-b` is `*`.
    #[arg(
        short = 'd',
        long = "istio-local-exclude-ports",
        env = "ISTIO_LOCAL_EXCLUDE_PORTS",
        default_value = ""
    )]
    pub local_exclude_ports: String,
    /// Interfaces whose traffic is never redirected.
    #[arg(
        short = 'c',
        long = "istio-exclude-interfaces",
        env = "ISTIO_EXCLUDE_INTERFACES",
        default_value = ""
    )]
    pub exclude_interfaces: String,
    /// Outbound destinations redirected: CIDRs, `*` for all, empty for none.
    #[arg(
        short = 'i',
        long = "istio-service-cidr",
        env = "ISTIO_SERVICE_CIDR",
        default_value = ""
    )]
    pub service_cidr: String,
    /// Outbound destinations not redirected.
    #[arg(
        short = 'x',
        long = "istio-service-exclude-cidr",
        env = "ISTIO_SERVICE_EXCLUDE_CIDR",
        default_value = ""
    )]
    pub service_exclude_cidr: String,
    /// Outbound ports redirected whatever the destination.
    #[arg(
        short = 'q',
        long = "istio-outbound-ports",
        env = "ISTIO_OUTBOUND_PORTS",
        default_value = ""
    )]
    pub outbound_ports: String,
    /// Outbound ports never redirected.
    #[arg(
        short = 'o',
        long = "istio-local-outbound-ports-exclude",
        env = "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE",
        default_value = ""
    )]
    pub local_outbound_ports_exclude: String,
    /// Interfaces rerouted to the proxy (KubeVirt); not supported.
    #[arg(
        short = 'k',
        long = "kube-virt-interfaces",
        env = "KUBE_VIRT_INTERFACES",
        default_value = ""
    )]
    pub kube_virt_interfaces: String,
    /// Print the nftables transaction (each operation, with a rule's expressions) instead of
    /// applying it.
    #[arg(short = 'n', long = "dry-run", env = "DRY_RUN")]
    pub dry_run: bool,
    /// Redirect DNS to the agent's DNS proxy; not supported (the agent has none yet).
    #[arg(long = "redirect-dns", env = "ISTIO_META_DNS_CAPTURE")]
    pub redirect_dns: bool,
    #[arg(long = "capture-all-dns", env = "CAPTURE_ALL_DNS")]
    pub capture_all_dns: bool,
    /// Drop packets of invalid connections; not supported.
    #[arg(long = "drop-invalid", env = "INVALID_DROP")]
    pub drop_invalid: bool,
    /// Also write the IPv6 rules whatever the pod's addresses.
    #[arg(long = "dual-stack", env = "ISTIO_DUAL_STACK")]
    pub dual_stack: bool,
    /// Remove the rules instead of writing them.
    #[arg(long = "cleanup-only", env = "CLEANUP_ONLY")]
    pub cleanup_only: bool,
    /// Write the rules in this network namespace (a path) instead of the current one.
    #[arg(long = "network-namespace", env = "NETWORK_NAMESPACE")]
    pub network_namespace: Option<PathBuf>,
    /// Check that capture works (the `istio-validation` container).
    #[arg(long = "run-validation", env = "RUN_VALIDATION")]
    pub run_validation: bool,
    /// Write no rules (with `--run-validation`: cni-node wrote them).
    #[arg(long = "skip-rule-apply", env = "SKIP_RULE_APPLY")]
    pub skip_rule_apply: bool,
    /// The port the validation probe dials.
    #[arg(long = "iptables-probe-port", env = "IPTABLES_PROBE_PORT", default_value_t = validation::PROBE_PORT)]
    pub probe_port: u16,
    /// How long validation may take (`5s`).
    #[arg(long = "probe-timeout", env = "PROBE_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub probe_timeout: Duration,
    /// Accepted for compatibility: the rules are always native nftables.
    #[arg(long = "native-nftables", env = "NATIVE_NFTABLES")]
    pub native_nftables: bool,
    /// Accepted for compatibility; rules are always replaced atomically.
    #[arg(long = "reconcile", env = "RECONCILE")]
    pub reconcile: bool,
    #[arg(long = "force-apply", env = "FORCE_APPLY")]
    pub force_apply: bool,
    #[arg(long = "cni-mode", env = "CNI_MODE")]
    pub cni_mode: bool,
}

/// Why `istio-iptables` failed.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    #[error("{flag}: {source}")]
    Flag {
        flag: &'static str,
        #[source]
        source: ConfigError,
    },
    #[error("{0} is not supported by this agent")]
    Unsupported(&'static str),
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error(transparent)]
    Netns(#[from] mesh_capture::netns::EnterError),
    #[error(transparent)]
    Validation(#[from] ValidationError),
}

impl IptablesError {
    pub fn reason(&self) -> &'static str {
        match self {
            IptablesError::Flag { .. } => "flag",
            IptablesError::Unsupported(_) => "unsupported",
            IptablesError::Capture(e) => e.reason(),
            IptablesError::Netns(e) => e.reason(),
            IptablesError::Validation(_) => "validation",
        }
    }

    /// The process's exit code: Istio's 126 for a failed validation, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            IptablesError::Validation(_) => validation::EXIT_CODE,
            _ => 1,
        }
    }
}

fn flag<T>(name: &'static str, parsed: Result<T, ConfigError>) -> Result<T, IptablesError> {
    parsed.map_err(|source| IptablesError::Flag { flag: name, source })
}

impl IptablesArgs {
    /// The capture settings these flags describe (`ipv6` from `--dual-stack` or the caller).
    pub fn capture_config(&self, ipv6: bool) -> Result<CaptureConfig, IptablesError> {
        if self.drop_invalid {
            return Err(IptablesError::Unsupported("--drop-invalid (INVALID_DROP)"));
        }
        if !self.kube_virt_interfaces.trim().is_empty() {
            return Err(IptablesError::Unsupported("-k/--kube-virt-interfaces"));
        }
        let proxy_uids = flag("-u/--proxy-uid", config::parse_ids(&self.proxy_uid))?;
        if proxy_uids.is_empty() {
            return Err(IptablesError::Flag {
                flag: "-u/--proxy-uid",
                source: ConfigError::Id(self.proxy_uid.clone()),
            });
        }
        // A blank `-g` (or PROXY_GID) means the uids, as Istio's.
        let proxy_gids = match self.proxy_gid.as_deref().map(str::trim) {
            Some(gids) if !gids.is_empty() => flag("-g/--proxy-gid", config::parse_ids(gids))?,
            _ => proxy_uids.clone(),
        };
        Ok(CaptureConfig {
            proxy_port: self.envoy_port,
            inbound_capture_port: self.inbound_capture_port,
            inbound_tunnel_port: self.inbound_tunnel_port,
            proxy_uids,
            proxy_gids,
            mode: flag("-m", self.mode.parse())?,
            include_outbound_cidrs: flag("-i", config::parse_cidr_selection(&self.service_cidr))?,
            exclude_outbound_cidrs: flag(
                "-x",
                config::parse_exclude_cidrs(&self.service_exclude_cidr, "-x"),
            )?,
            include_inbound_ports: flag("-b", config::parse_port_selection(&self.inbound_ports))?,
            exclude_inbound_ports: flag("-d", config::parse_ports(&self.local_exclude_ports))?,
            include_outbound_ports: flag("-q", config::parse_ports(&self.outbound_ports))?,
            exclude_outbound_ports: flag(
                "-o",
                config::parse_ports(&self.local_outbound_ports_exclude),
            )?,
            exclude_interfaces: flag("-c", config::parse_interfaces(&self.exclude_interfaces))?,
            ipv6: ipv6 || self.dual_stack,
        })
    }
}

/// Whether the namespace's first global address is IPv6 (Istio's rule for writing the IPv6
/// rules of a single-stack pod).
fn first_address_is_v6() -> bool {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return false;
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|a| {
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .find(|ip| match ip {
            IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
            IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local(),
        })
        .is_some_and(|ip| ip.is_ipv6())
}

/// Runs the command in the calling thread's netns (or `--network-namespace`).
pub fn run(args: &IptablesArgs) -> Result<(), IptablesError> {
    match &args.network_namespace {
        Some(path) => mesh_capture::netns::run_in(path, || run_here(args))?,
        None => run_here(args),
    }
}

fn run_here(args: &IptablesArgs) -> Result<(), IptablesError> {
    let ipv6 = first_address_is_v6();
    if args.cleanup_only {
        if args.dry_run {
            print_operations(mesh_sidecar_capture::rules::cleanup_batch());
            return Ok(());
        }
        mesh_sidecar_capture::cleanup()?;
        tracing::info!("sidecar capture removed");
        return Ok(());
    }
    let cfg = args.capture_config(ipv6)?;
    if !args.skip_rule_apply {
        if args.dry_run {
            print_operations(mesh_sidecar_capture::rules::apply_batch(&cfg));
        } else {
            let rules = mesh_sidecar_capture::apply(&cfg)?;
            tracing::info!(
                rules,
                ipv6 = cfg.ipv6,
                "sidecar capture applied (nftables table inet istio-proxy-nat)"
            );
        }
    }
    if args.run_validation {
        Validation {
            proxy_port: cfg.proxy_port,
            inbound_capture_port: cfg.inbound_capture_port,
            probe_port: args.probe_port,
            timeout: args.probe_timeout,
            ipv6,
        }
        .run()?;
    }
    Ok(())
}

/// The transaction, one operation per line; a rule's expressions follow it.
fn print_operations(batch: mesh_nft::Batch) {
    for op in &batch.operations {
        match op {
            mesh_nft::Operation::AddRule { exprs, .. } => println!("{} {exprs:?}", op.describe()),
            _ => println!("{}", op.describe()),
        }
    }
}
