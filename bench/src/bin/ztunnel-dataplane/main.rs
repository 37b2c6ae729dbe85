//! Data-plane cost of ztunnel: the same client/server traffic direct (unenrolled pods) and
//! through the mesh (client -> ztunnel node1 -> HBONE mTLS -> ztunnel node2 -> server), in
//! network namespaces, in one run, with the real istiod and ztunnel processes of the e2e
//! harness. Measures iperf3 throughput (1 and N streams), 1 KB ping-pong latency, connection
//! churn, ztunnel CPU per phase, RSS idle / peak / with many idle connections, fds after they
//! close; prints a table with the targets beside each figure (PASS/MISS, never asserted).
//! Then the floor: the throughput, latency and churn tests through two plain TCP relays in
//! the places of the ztunnels' in-pod sockets ([`relay`]): what a proxy pair that does nothing
//! but copy costs on this machine.
//!
//! Needs root and iperf3. Usage (bench/ztunnel-dataplane.sh builds release binaries and sets
//! MESH_BIN_DIR): ztunnel-dataplane [--quick] [--iperf-secs 10 --streams 8
//! --round-trips 20000 --churn-secs 5 --idle-conns 10000]

mod iperf;
mod load;
mod mesh;
mod procfs;
mod relay;
mod report;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use clap::Parser;

use crate::mesh::{Cluster, Path};
use crate::report::{Floor, Pair, Results, Rss};

#[derive(Parser, Debug, Clone)]
pub struct Args {
    /// Smoke mode: 1 s iperf3 runs, 1,000 round trips, 1 s of churn, 1,000 idle connections
    /// (overrides the sizes below).
    #[arg(long)]
    quick: bool,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 10)]
    iperf_secs: u64,
    /// Alternating direct / mesh rounds of each iperf3 and ping-pong test; the round with the
    /// median mesh/direct ratio (or added p50) is reported (direct throughput alone varies by
    /// ~20% and direct p50 by ~30% run to run here).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Parallel streams of the multi-stream iperf3 run.
    #[arg(long, default_value_t = 8)]
    streams: u32,
    /// Measured ping-pong round trips.
    #[arg(long, default_value_t = 20_000)]
    round_trips: usize,
    /// Unmeasured round trips first.
    #[arg(long, default_value_t = 2_000)]
    warmup: usize,
    /// Ping-pong message size, bytes.
    #[arg(long, default_value_t = 1024)]
    payload: usize,
    /// Seconds of connect / exchange / close.
    #[arg(long, default_value_t = 5)]
    churn_secs: u64,
    /// Idle connections held open through the mesh.
    #[arg(long, default_value_t = 10_000)]
    idle_conns: usize,
    /// In-pod capture of the enrolled pods: `nftables` (istio-cni's REDIRECT rules) or `ebpf`
    /// (tc programs, no NAT).
    #[arg(long, value_enum, default_value_t = CaptureMode::Nftables)]
    capture: CaptureMode,
    /// Pair the in-pod legs socket to socket (sockmap / sk_msg). With nftables capture only
    /// the server pod's leg can pair (the outbound REDIRECT is a NAT).
    #[arg(long)]
    sockmap: bool,
    /// Skip the floor: the same 1-stream iperf3, ping-pong and churn tests through two plain
    /// TCP relays in the places of the ztunnels' in-pod sockets (no TLS, no HTTP/2), what a
    /// proxy pair that only copies costs on this machine.
    #[arg(long)]
    no_floor: bool,
    /// Internal: run as the echo server on these ports (started inside the server pods).
    #[arg(long, hide = true, value_delimiter = ',')]
    serve_echo: Vec<u16>,
    /// Internal: run as a plain TCP relay of `--relay-ports` to this address (started inside
    /// the unenrolled pods for the floor).
    #[arg(long, hide = true)]
    relay_to: Option<Ipv4Addr>,
    /// Internal: the relay's ports, `LISTEN:TARGET` each.
    #[arg(long, hide = true, value_delimiter = ',')]
    relay_ports: Vec<relay::PortMap>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureMode {
    Nftables,
    Ebpf,
}

impl Args {
    fn effective(mut self) -> Args {
        if self.quick {
            self.iperf_secs = 1;
            self.rounds = 1;
            self.round_trips = 1_000;
            self.warmup = 100;
            self.churn_secs = 1;
            self.idle_conns = 1_000;
        }
        self
    }
}

/// The echo server's port for ping-pong and churn, and a second one for idle connections (so
/// they never meet the churn phase's TIME_WAIT tuples).
const ECHO_PORT: u16 = 9000;
const IDLE_PORT: u16 = 9001;
/// Bytes of the churn phase's one exchange.
const CHURN_PAYLOAD: usize = 64;

fn main() -> anyhow::Result<()> {
    let args = Args::parse().effective();
    if !args.serve_echo.is_empty() {
        return load::serve(&args.serve_echo);
    }
    if let Some(to) = args.relay_to {
        return relay::serve(to, &args.relay_ports);
    }
    if !mesh_testutil::netns::have_root("ztunnel-dataplane") {
        bail!("the benchmark needs root (network namespaces, nftables)");
    }
    // This process holds the client end of every idle connection; both ztunnels and the echo
    // server (which inherit the limit) one socket each.
    let need = args.idle_conns as u64 + 1024;
    if let Some(limit) = procfs::nofile_limit()? {
        ensure!(
            limit >= need,
            "RLIMIT_NOFILE {limit} is too low for {} idle connections: `ulimit -n {need}` \
             (bench/ztunnel-dataplane.sh raises it to the hard limit) or pass --idle-conns",
            args.idle_conns
        );
    }
    // The fake node agent runs on it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let _enter = runtime.enter();
    let results = run(&args)?;
    report::print(&args, &results);
    Ok(())
}

/// Servers in both server pods, kept until dropped.
struct Servers {
    _echo: Vec<load::EchoServer>,
    _iperf: Vec<iperf::Server>,
}

fn start_servers(c: &Cluster, scratch: &std::path::Path) -> anyhow::Result<Servers> {
    let mut echo = Vec::new();
    let mut iperf = Vec::new();
    for (what, path) in [("direct", &c.direct), ("mesh", &c.mesh)] {
        echo.push(load::EchoServer::start(
            &path.server,
            &[ECHO_PORT, IDLE_PORT],
        )?);
        let log = scratch.join(format!("iperf3-server-{what}.log"));
        iperf.push(iperf::Server::start(&path.server, &log)?);
    }
    Ok(Servers {
        _echo: echo,
        _iperf: iperf,
    })
}

fn run(args: &Args) -> anyhow::Result<Results> {
    let scratch = tempfile::tempdir()?;
    eprintln!("starting the cluster (istiod, 2 ztunnels, 4 pods)");
    let cluster = Cluster::start(args.capture, args.sockmap)?;
    let _servers = start_servers(&cluster, scratch.path())?;
    cluster.wait_paths(ECHO_PORT)?;
    // Let start-up work (certificates, xDS) settle before the idle figures.
    std::thread::sleep(Duration::from_secs(2));
    let pids = cluster.ztunnel_pids;
    let idle = Rss::read(&pids, procfs::rss_mib)?;
    let mut results = traffic(args, &cluster, scratch.path())
        .map_err(|e| e.context(format!("traffic phases failed; logs:\n{}", cluster.logs())))?;
    results.rss_idle = idle;
    results.rss_peak = Rss::read(&pids, procfs::peak_rss_mib)?;
    idle_connections(args, &cluster, &mut results)
        .map_err(|e| e.context(format!("idle phase failed; logs:\n{}", cluster.logs())))?;
    results.sockmap = cluster.sockmap_stats()?;
    Ok(results)
}

/// CPU seconds used while one measurement ran.
struct CpuUse {
    /// Both ztunnels, user + system.
    ztunnel: f64,
    /// Both ztunnels, system only (the kernel's TCP and netfilter work done in their syscalls).
    ztunnel_system: f64,
    /// Every process and interrupt of the machine.
    machine: f64,
}

/// Runs `f` and returns its result with the CPU time used meanwhile.
fn with_cpu<T>(pids: &[u32], f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, CpuUse)> {
    let (all_before, sys_before) = procfs::cpu_totals(pids)?;
    let machine_before = procfs::machine_busy()?;
    let out = f()?;
    let (all, sys) = procfs::cpu_totals(pids)?;
    let used = CpuUse {
        ztunnel: all.saturating_sub(all_before).as_secs_f64(),
        ztunnel_system: sys.saturating_sub(sys_before).as_secs_f64(),
        machine: procfs::machine_busy()?
            .saturating_sub(machine_before)
            .as_secs_f64(),
    };
    Ok((out, used))
}

/// Runs `f` on the direct path, then on the mesh path.
fn both<T>(
    c: &Cluster,
    what: &str,
    f: impl Fn(&Path) -> anyhow::Result<T>,
) -> anyhow::Result<Pair<T>> {
    compare(what, &c.direct, ("mesh", &c.mesh), &c.ztunnel_pids, f)
}

/// Runs `f` on the `direct` path, then on the `proxied` one, with the CPU of the proxies
/// (`pids`) during each.
fn compare<T>(
    what: &str,
    direct: &Path,
    (name, proxied): (&str, &Path),
    pids: &[u32],
    f: impl Fn(&Path) -> anyhow::Result<T>,
) -> anyhow::Result<Pair<T>> {
    eprintln!("{what}: direct");
    let (direct, cpu_direct) = with_cpu(pids, || f(direct))?;
    eprintln!("{what}: {name}");
    let (mesh, cpu_mesh) = with_cpu(pids, || f(proxied))?;
    Ok(Pair {
        direct,
        mesh,
        cpu_direct: cpu_direct.ztunnel,
        cpu_mesh: cpu_mesh.ztunnel,
        system_mesh: cpu_mesh.ztunnel_system,
        machine_direct: cpu_direct.machine,
        machine_mesh: cpu_mesh.machine,
    })
}

/// Runs `round` `rounds` times; returns the round with the median `key` (mesh compared with
/// direct) and every round's key in run order.
fn median_round<T>(
    rounds: usize,
    key: impl Fn(&Pair<T>) -> f64,
    mut round: impl FnMut() -> anyhow::Result<Pair<T>>,
) -> anyhow::Result<(Pair<T>, Vec<f64>)> {
    let mut all = (0..rounds.max(1))
        .map(|_| round())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let keys: Vec<f64> = all.iter().map(&key).collect();
    all.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let median = all.swap_remove(all.len() / 2);
    Ok((median, keys))
}

/// mesh/direct throughput.
fn throughput_ratio(p: &Pair<iperf::Throughput>) -> f64 {
    p.mesh.gbps() / p.direct.gbps()
}

/// Microseconds the mesh adds at p50.
fn added_p50(p: &Pair<[f64; 2]>) -> f64 {
    p.mesh[0] - p.direct[0]
}

/// iperf3 with `streams` from a path's client to its server.
fn iperf<'a>(
    args: &'a Args,
    scratch: &'a std::path::Path,
    streams: u32,
) -> impl Fn(&Path) -> anyhow::Result<iperf::Throughput> + 'a {
    move |p: &Path| iperf::run_client(&p.client, p.server_ip, args.iperf_secs, streams, scratch)
}

/// Ping-pong p50 and p99, microseconds.
fn ping_pong(args: &Args) -> impl Fn(&Path) -> anyhow::Result<[f64; 2]> + '_ {
    move |p: &Path| {
        let mut samples = load::round_trips(
            &p.client,
            p.server_addr(ECHO_PORT),
            args.payload,
            args.warmup,
            args.round_trips,
        )?;
        Ok([50.0, 99.0].map(|q| mesh_bench::percentile(&mut samples, q)))
    }
}

fn churn(args: &Args) -> impl Fn(&Path) -> anyhow::Result<load::Churn> + '_ {
    move |p: &Path| {
        load::connection_churn(
            &p.client,
            p.server_addr(ECHO_PORT),
            CHURN_PAYLOAD,
            Duration::from_secs(args.churn_secs),
        )
    }
}

fn traffic(args: &Args, c: &Cluster, scratch: &std::path::Path) -> anyhow::Result<Results> {
    let (single, single_ratios) = median_round(args.rounds, throughput_ratio, || {
        both(c, "iperf3 1 stream", iperf(args, scratch, 1))
    })?;
    let (multi, multi_ratios) = median_round(args.rounds, throughput_ratio, || {
        both(
            c,
            &format!("iperf3 {} streams", args.streams),
            iperf(args, scratch, args.streams),
        )
    })?;
    let (latency, added_p50s) = median_round(args.rounds, added_p50, || {
        both(c, "ping-pong", ping_pong(args))
    })?;
    let churn = both(c, "connection churn", churn(args))?;
    let floor = if args.no_floor {
        None
    } else {
        Some(floor(args, c, scratch)?)
    };
    Ok(Results {
        single,
        multi,
        single_ratios,
        multi_ratios,
        latency,
        added_p50s,
        churn,
        floor,
        ..Results::default()
    })
}

/// The 1-stream iperf3, ping-pong and churn tests again, direct and through two plain TCP
/// relays in the unenrolled pods, where the ztunnels' in-pod sockets would be ([`relay`]).
fn floor(args: &Args, c: &Cluster, scratch: &std::path::Path) -> anyhow::Result<Floor> {
    eprintln!("floor: starting a plain TCP relay in each unenrolled pod");
    let ports = [ECHO_PORT, iperf::PORT];
    let hop = |listen: u16, target: u16| relay::PortMap { listen, target };
    let relays = [
        relay::Relay::start(
            &c.direct.client,
            c.direct.server_ip,
            &ports.map(|p| hop(p, p + relay::PORT_OFFSET)),
        )?,
        relay::Relay::start(
            &c.direct.server,
            Ipv4Addr::LOCALHOST,
            &ports.map(|p| hop(p + relay::PORT_OFFSET, p)),
        )?,
    ];
    let pids = relays.each_ref().map(relay::Relay::pid);
    // The client reaches its pod's relay over loopback, as an enrolled app reaches ztunnel's
    // in-pod socket; the server pod's relay reaches the server over loopback.
    let relayed = Path {
        client: c.direct.client.clone(),
        server: c.direct.server.clone(),
        server_ip: Ipv4Addr::LOCALHOST,
    };
    let proxied = ("relays", &relayed);
    let (single, single_ratios) = median_round(args.rounds, throughput_ratio, || {
        compare(
            "floor: iperf3 1 stream",
            &c.direct,
            proxied,
            &pids,
            iperf(args, scratch, 1),
        )
    })?;
    let (latency, added_p50s) = median_round(args.rounds, added_p50, || {
        compare(
            "floor: ping-pong",
            &c.direct,
            proxied,
            &pids,
            ping_pong(args),
        )
    })?;
    let churn = compare(
        "floor: connection churn",
        &c.direct,
        proxied,
        &pids,
        churn(args),
    )?;
    Ok(Floor {
        single,
        single_ratios,
        latency,
        added_p50s,
        churn,
    })
}

/// Holds `args.idle_conns` idle connections open through the mesh: RSS and fds of both
/// ztunnels before, while open and after they close.
fn idle_connections(args: &Args, c: &Cluster, results: &mut Results) -> anyhow::Result<()> {
    let pids = c.ztunnel_pids;
    results.fds_before = pids.map(|p| procfs::fd_count(p).unwrap_or(0));
    results.rss_before_idle = Rss::read(&pids, procfs::rss_mib)?;
    eprintln!(
        "opening {} idle connections through the mesh",
        args.idle_conns
    );
    let start = Instant::now();
    let open = load::open_idle(
        &c.mesh.client,
        c.mesh.server_addr(IDLE_PORT),
        args.idle_conns,
    )?;
    results.idle_open_secs = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(1));
    results.rss_idle_conns = Rss::read(&pids, procfs::rss_mib)?;
    results.fds_open = pids.map(|p| procfs::fd_count(p).unwrap_or(0));
    drop(open);
    // Wait for both ztunnels to let go of them: back to the earlier count, or no change for
    // 2 s, or 20 s. The release time is when the count last changed (polled every 20 ms).
    let start = Instant::now();
    let (mut last, mut changed_at) = ([usize::MAX; 2], Duration::ZERO);
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = pids.map(|p| procfs::fd_count(p).unwrap_or(0));
        if now != last {
            (last, changed_at) = (now, start.elapsed());
        }
        let back = now.iter().zip(&results.fds_before).all(|(n, b)| n <= b);
        if back
            || start.elapsed() - changed_at > Duration::from_secs(2)
            || start.elapsed().as_secs() > 20
        {
            results.fds_after = now;
            results.close_secs = changed_at.as_secs_f64();
            break;
        }
    }
    results.rss_after_close = Rss::read(&pids, procfs::rss_mib).context("RSS after close")?;
    Ok(())
}
