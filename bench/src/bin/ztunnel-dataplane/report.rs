//! The results of one run and the printed table: direct | mesh | ratio, with the targets of
//! the issue beside them (PASS/MISS, informational).

use mesh_bench::print_table;

use crate::iperf::Throughput;
use crate::load::Churn;
use crate::Args;

/// One measurement on both paths, with the CPU both proxies (the ztunnels, or the floor's
/// relays) used during each.
#[derive(Debug, Default, Clone)]
pub struct Pair<T> {
    pub direct: T,
    /// Through the proxies: the mesh, or the floor's relays.
    pub mesh: T,
    /// CPU seconds of both proxies while the direct run went on: should be ~0.
    pub cpu_direct: f64,
    pub cpu_mesh: f64,
    /// Of `cpu_mesh`, system time.
    pub system_mesh: f64,
    /// Busy CPU seconds of the whole machine during each run.
    pub machine_direct: f64,
    pub machine_mesh: f64,
}

/// A figure per ztunnel (node1, node2), MiB.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rss(pub [f64; 2]);

impl Rss {
    pub fn read(pids: &[u32; 2], f: fn(u32) -> anyhow::Result<f64>) -> anyhow::Result<Rss> {
        Ok(Rss([f(pids[0])?, f(pids[1])?]))
    }

    fn max(&self) -> f64 {
        self.0[0].max(self.0[1])
    }
}

impl std::fmt::Display for Rss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} / {:.1}", self.0[0], self.0[1])
    }
}

#[derive(Debug, Default)]
pub struct Results {
    pub single: Pair<Throughput>,
    pub multi: Pair<Throughput>,
    /// mesh/direct of every round, in run order (the median round is reported).
    pub single_ratios: Vec<f64>,
    pub multi_ratios: Vec<f64>,
    /// p50, p99 in microseconds (the round with the median added p50).
    pub latency: Pair<[f64; 2]>,
    /// Microseconds the mesh added at p50, each round in run order.
    pub added_p50s: Vec<f64>,
    pub churn: Pair<Churn>,
    pub rss_idle: Rss,
    pub rss_peak: Rss,
    /// Right before the idle connections open (after the traffic phases).
    pub rss_before_idle: Rss,
    pub rss_idle_conns: Rss,
    pub rss_after_close: Rss,
    pub fds_before: [usize; 2],
    pub fds_open: [usize; 2],
    pub fds_after: [usize; 2],
    pub idle_open_secs: f64,
    pub close_secs: f64,
    /// The sockmap programs' counters over the whole run, with `--sockmap`.
    pub sockmap: Option<mesh_ebpf::SockmapStats>,
    /// The same tests through two plain TCP relays, unless `--no-floor`.
    pub floor: Option<Floor>,
}

/// The 1-stream, ping-pong and churn tests, direct and through two plain TCP relays.
#[derive(Debug, Default)]
pub struct Floor {
    pub single: Pair<Throughput>,
    pub single_ratios: Vec<f64>,
    pub latency: Pair<[f64; 2]>,
    pub added_p50s: Vec<f64>,
    pub churn: Pair<Churn>,
}

/// Targets of the issue.
const MAX_IDLE_CONN_KIB: f64 = 6.0;
const MAX_RELEASE_SECS: f64 = 0.5;
const MIN_SINGLE_STREAM_RATIO: f64 = 0.33;
const MAX_ADDED_P50_US: f64 = 55.0;
const MIN_CONNECTIONS_PER_SEC: f64 = 2_800.0;
const MAX_ADDED_P99_US: f64 = 300.0;
const MAX_IDLE_RSS_BYTES: f64 = 10e6;
const MAX_CORES_PER_GBPS: f64 = 0.16;

fn verdict(ok: bool) -> String {
    if ok { "PASS" } else { "MISS" }.to_string()
}

fn row(cells: [&str; 6]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

fn ratio(direct: f64, mesh: f64) -> String {
    format!("{:.2}x", mesh / direct)
}

fn ratios(all: &[f64]) -> String {
    all.iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Each round's added microseconds, signed.
fn added_rounds(all: &[f64]) -> String {
    all.iter()
        .map(|a| format!("{a:+.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The proxies' CPU (both) per wall second, per Gbit/s received.
fn cores_per_gbps(p: &Pair<Throughput>) -> f64 {
    per_gbps(p.cpu_mesh, &p.mesh)
}

/// Of [`cores_per_gbps`], system time.
fn system_per_gbps(p: &Pair<Throughput>) -> f64 {
    per_gbps(p.system_mesh, &p.mesh)
}

/// CPU seconds as cores (per wall second of the run) per Gbit/s it carried.
fn per_gbps(cpu_secs: f64, t: &Throughput) -> f64 {
    cpu_secs / t.wall.as_secs_f64() / t.gbps()
}

fn throughput_rows(args: &Args, r: &Results) -> Vec<Vec<String>> {
    let t = |p: &Pair<Throughput>| (p.direct.gbps(), p.mesh.gbps());
    let (d1, m1) = t(&r.single);
    let (dn, mn) = t(&r.multi);
    let (c1, cn) = (cores_per_gbps(&r.single), cores_per_gbps(&r.multi));
    let n = args.streams;
    let retr = |p: &Pair<Throughput>| (p.direct.retransmits, p.mesh.retransmits);
    let (rd1, rm1) = retr(&r.single);
    let (rdn, rmn) = retr(&r.multi);
    vec![
        row([
            "throughput, 1 stream (Gbit/s)",
            &format!("{d1:.2}"),
            &format!("{m1:.2}"),
            &ratio(d1, m1),
            ">= 0.33x direct",
            &verdict(m1 / d1 >= MIN_SINGLE_STREAM_RATIO),
        ]),
        row([
            &format!("throughput, {n} streams (Gbit/s)"),
            &format!("{dn:.2}"),
            &format!("{mn:.2}"),
            &ratio(dn, mn),
            "",
            "",
        ]),
        row([
            &format!("mesh/direct of each round, 1 / {n} streams"),
            "",
            "",
            &format!("{} / {}", ratios(&r.single_ratios), ratios(&r.multi_ratios)),
            "median round above",
            "",
        ]),
        row([
            &format!("iperf3 retransmits, 1 / {n} streams"),
            &format!("{rd1} / {rdn}"),
            &format!("{rm1} / {rmn}"),
            "",
            "",
            "",
        ]),
        row([
            "ztunnel CPU cores per Gbit/s (both), 1 stream",
            "-",
            &format!("{c1:.3}"),
            "",
            "<= 0.16",
            &verdict(c1 <= MAX_CORES_PER_GBPS),
        ]),
        row([
            &format!("ztunnel CPU cores per Gbit/s (both), {n} streams"),
            "-",
            &format!("{cn:.3}"),
            "",
            "<= 0.16",
            &verdict(cn <= MAX_CORES_PER_GBPS),
        ]),
        row([
            "  of which kernel (system time), 1 stream",
            "-",
            &format!("{:.3}", system_per_gbps(&r.single)),
            "",
            "",
            "",
        ]),
        row([
            "whole machine CPU cores per Gbit/s, 1 stream",
            &format!("{:.3}", per_gbps(r.single.machine_direct, &r.single.direct)),
            &format!("{:.3}", per_gbps(r.single.machine_mesh, &r.single.mesh)),
            "",
            "",
            "",
        ]),
    ]
}

fn latency_rows(args: &Args, r: &Results) -> Vec<Vec<String>> {
    let [dp50, dp99] = r.latency.direct;
    let [mp50, mp99] = r.latency.mesh;
    let size = args.payload;
    let (d, m) = (r.churn.direct, r.churn.mesh);
    vec![
        row([
            &format!("{size} B round trip p50 (us)"),
            &format!("{dp50:.1}"),
            &format!("{mp50:.1} ({:+.1})", mp50 - dp50),
            &ratio(dp50, mp50),
            "+<= 55 us",
            &verdict(mp50 - dp50 <= MAX_ADDED_P50_US),
        ]),
        row([
            "added p50 of each round (us)",
            "",
            &added_rounds(&r.added_p50s),
            "",
            "median round above",
            "",
        ]),
        row([
            &format!("{size} B round trip p99 (us)"),
            &format!("{dp99:.1}"),
            &format!("{mp99:.1} ({:+.1})", mp99 - dp99),
            &ratio(dp99, mp99),
            "+<= 300 us",
            &verdict(mp99 - dp99 <= MAX_ADDED_P99_US),
        ]),
        row([
            "new connections per second",
            &format!("{:.0}", d.per_second),
            &format!("{:.0}", m.per_second),
            &ratio(d.per_second, m.per_second),
            ">= 2,800",
            &verdict(m.per_second >= MIN_CONNECTIONS_PER_SEC),
        ]),
        row([
            "  (failed connections)",
            &d.failed.to_string(),
            &m.failed.to_string(),
            "",
            "",
            "",
        ]),
        row([
            "connect + 64 B exchange + close p50 / p99 (us)",
            &format!("{:.0} / {:.0}", d.setup_us[0], d.setup_us[1]),
            &format!("{:.0} / {:.0}", m.setup_us[0], m.setup_us[1]),
            &ratio(d.setup_us[0], m.setup_us[0]),
            "",
            "",
        ]),
        row([
            "  of which connect() p50 (us)",
            &format!("{:.0}", d.connect_p50_us),
            &format!("{:.0}", m.connect_p50_us),
            "",
            "",
            "",
        ]),
    ]
}

fn cpu_rows(args: &Args, r: &Results) -> Vec<Vec<String>> {
    let cpu = |what: String, cd: f64, cm: f64| {
        row([&what, &format!("{cd:.2}"), &format!("{cm:.2}"), "", "", ""])
    };
    vec![
        cpu(
            "ztunnel CPU s (both): iperf3 1 stream".into(),
            r.single.cpu_direct,
            r.single.cpu_mesh,
        ),
        cpu(
            format!("ztunnel CPU s (both): iperf3 {} streams", args.streams),
            r.multi.cpu_direct,
            r.multi.cpu_mesh,
        ),
        cpu(
            "ztunnel CPU s (both): ping-pong".into(),
            r.latency.cpu_direct,
            r.latency.cpu_mesh,
        ),
        cpu(
            "ztunnel CPU s (both): connection churn".into(),
            r.churn.cpu_direct,
            r.churn.cpu_mesh,
        ),
    ]
}

fn memory_rows(args: &Args, r: &Results) -> Vec<Vec<String>> {
    let idle_ok = r.rss_idle.max() * 1024.0 * 1024.0 <= MAX_IDLE_RSS_BYTES;
    let fds = |f: [usize; 2]| format!("{} / {}", f[0], f[1]);
    let n = args.idle_conns;
    // RSS the idle connections added, over the reading taken right before they opened.
    let per_conn: [f64; 2] = std::array::from_fn(|i| {
        (r.rss_idle_conns.0[i] - r.rss_before_idle.0[i]) * 1024.0 / n.max(1) as f64
    });
    vec![
        row([
            "ztunnel RSS idle after start, node1 / node2 (MiB)",
            "-",
            &r.rss_idle.to_string(),
            "",
            "<= 10 MB (9.54 MiB)",
            &verdict(idle_ok),
        ]),
        row([
            "ztunnel peak RSS (VmHWM) after traffic (MiB)",
            "-",
            &r.rss_peak.to_string(),
            "",
            "",
            "",
        ]),
        row([
            &format!("ztunnel RSS with {n} idle mesh conns (MiB)"),
            "-",
            &r.rss_idle_conns.to_string(),
            "",
            "",
            "",
        ]),
        row([
            "ztunnel RSS per idle mesh conn, node1 / node2 (KiB)",
            "-",
            &format!("{:.1} / {:.1}", per_conn[0], per_conn[1]),
            "",
            &format!("<= {MAX_IDLE_CONN_KIB} KiB"),
            &verdict(per_conn.iter().all(|k| *k <= MAX_IDLE_CONN_KIB)),
        ]),
        row([
            "ztunnel RSS after they close (MiB)",
            "-",
            &r.rss_after_close.to_string(),
            "",
            "",
            "",
        ]),
        row([
            &format!("ztunnel fds: before / {n} open / after close"),
            "-",
            &format!(
                "{} | {} | {}",
                fds(r.fds_before),
                fds(r.fds_open),
                fds(r.fds_after)
            ),
            "",
            "before (+ 1 pooled HBONE)",
            &verdict(no_fd_leak(r)),
        ]),
        row([
            &format!("time to open {n} / release them (s)"),
            "-",
            &format!("{:.1} / {:.2}", r.idle_open_secs, r.close_secs),
            "",
            &format!("release <= {MAX_RELEASE_SECS} s"),
            &verdict(r.close_secs <= MAX_RELEASE_SECS),
        ]),
    ]
}

/// Microseconds of both proxies' CPU (all, then system time) per completed connection of
/// the churn.
fn cpu_per_connection(p: &Pair<Churn>) -> [f64; 2] {
    [p.cpu_mesh, p.system_mesh].map(|secs| secs / p.mesh.completed.max(1) as f64 * 1e6)
}

/// The floor beside the mesh: what two proxies that only accept, connect and copy add on this
/// machine, next to what the ztunnels add in the same run.
fn floor_rows(r: &Results, f: &Floor) -> Vec<Vec<String>> {
    let gbps = |p: &Pair<Throughput>| {
        format!(
            "{:.2} ({})",
            p.mesh.gbps(),
            ratio(p.direct.gbps(), p.mesh.gbps())
        )
    };
    let added = |p: &Pair<[f64; 2]>, q: usize| format!("{:+.1}", p.mesh[q] - p.direct[q]);
    let per_connection = |p: &Pair<Churn>| {
        let [all, system] = cpu_per_connection(p);
        format!("{all:.0}, {system:.0}")
    };
    vec![
        row([
            "throughput, 1 stream (Gbit/s, x direct)",
            &format!("{:.2}", f.single.direct.gbps()),
            &gbps(&f.single),
            &gbps(&r.single),
            ">= 0.33x direct",
            &format!("rounds {}", ratios(&f.single_ratios)),
        ]),
        row([
            "CPU cores per Gbit/s of both proxies, 1 stream",
            "-",
            &format!("{:.3}", cores_per_gbps(&f.single)),
            &format!("{:.3}", cores_per_gbps(&r.single)),
            "<= 0.16",
            "",
        ]),
        row([
            "  of which kernel (system time)",
            "-",
            &format!("{:.3}", system_per_gbps(&f.single)),
            &format!("{:.3}", system_per_gbps(&r.single)),
            "",
            "",
        ]),
        row([
            "round trip p50 (us): direct, added",
            &format!("{:.1}", f.latency.direct[0]),
            &added(&f.latency, 0),
            &added(&r.latency, 0),
            "+<= 55 us",
            &format!("rounds {}", added_rounds(&f.added_p50s)),
        ]),
        row([
            "round trip p99 (us): direct, added",
            &format!("{:.1}", f.latency.direct[1]),
            &added(&f.latency, 1),
            &added(&r.latency, 1),
            "+<= 300 us",
            "",
        ]),
        row([
            "new connections per second",
            &format!("{:.0}", f.churn.direct.per_second),
            &format!("{:.0}", f.churn.mesh.per_second),
            &format!("{:.0}", r.churn.mesh.per_second),
            ">= 2,800",
            "",
        ]),
        row([
            "  (failed connections)",
            &f.churn.direct.failed.to_string(),
            &f.churn.mesh.failed.to_string(),
            &r.churn.mesh.failed.to_string(),
            "",
            "",
        ]),
        row([
            "  CPU of both proxies per connection (us), of which kernel",
            "-",
            &per_connection(&f.churn),
            &per_connection(&r.churn),
            "",
            "",
        ]),
    ]
}

/// After the idle connections close, each ztunnel is back to its earlier fd count, but for
/// the one idle HBONE connection per destination its pool may keep (when the earlier phases
/// left none) and its peer's end of it.
fn no_fd_leak(r: &Results) -> bool {
    r.fds_after
        .iter()
        .zip(&r.fds_before)
        .all(|(after, before)| *after <= before + 1)
}

/// Prints the table (stdout).
pub fn print(args: &Args, r: &Results) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let workers = std::env::var("ZTUNNEL_WORKER_THREADS").unwrap_or_else(|_| "default".to_string());
    println!(
        "\nztunnel data plane: direct = unenrolled pods node1 -> node2; mesh = client -> ztunnel \
         -> HBONE -> ztunnel -> server.\n{cores} cores shared by everything (2 ztunnels with \
         {workers} ZTUNNEL_WORKER_THREADS, istiod, iperf3, this process). iperf3 {} s runs; \
         {} alternating direct/mesh rounds of each iperf3 and ping-pong test; {} round trips after {} warm-up; {} s of churn; \
         {} idle connections. Capture: {:?}{}.\n",
        args.iperf_secs,
        args.rounds,
        args.round_trips,
        args.warmup,
        args.churn_secs,
        args.idle_conns,
        args.capture,
        if args.sockmap { ", sockmap on" } else { "" }
    );
    let mut rows = throughput_rows(args, r);
    rows.extend(latency_rows(args, r));
    rows.extend(cpu_rows(args, r));
    rows.extend(memory_rows(args, r));
    print_table(
        &[
            "metric",
            "direct",
            "mesh",
            "mesh/direct",
            "target",
            "result",
        ],
        &rows,
    );
    if let Some(floor) = &r.floor {
        println!(
            "\nFloor: the same tests between the unenrolled pods through two plain TCP relays \
             (one process in each pod, where ztunnel's in-pod socket would be: accept + connect \
             + copy; no TLS, HTTP/2, capture, policy or metrics), each round beside its own \
             direct run. A target the relays miss is out of reach of a proxy pair that does \
             anything more on this machine.\n"
        );
        print_table(
            &[
                "metric",
                "direct",
                "two relays",
                "mesh (above)",
                "target",
                "",
            ],
            &floor_rows(r, floor),
        );
    }
    if let Some(stats) = &r.sockmap {
        println!(
            "\nsockmap (in-pod legs socket to socket): {} app and {} ztunnel sockets paired, \
             {} sends / {:.1} MiB redirected, {} sockets kept TCP (no partner at their first \
             send), {} could not be added.",
            stats.app_sockets,
            stats.proxy_sockets,
            stats.redirected_msgs,
            stats.redirected_bytes as f64 / (1 << 20) as f64,
            stats.tcp_streams,
            stats.insert_failed
        );
    }
    println!("\nPASS/MISS is informational; nothing is asserted.");
}
