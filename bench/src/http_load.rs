//! HTTP/1.1 keep-alive load from a pod's network namespace (saturation and fixed-rate
//! latency) and a process's CPU and memory from `/proc`, shared by the HTTP benchmarks.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use mesh_testutil::{http_request, Netns};

/// The load flags both HTTP benchmarks take.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 8)]
    pub seconds: u64,
    /// Connections for the saturation run.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Requests per second for the latency run.
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Envoy worker threads of the proxies under test (proxy config `concurrency`).
    #[arg(long, default_value_t = 2)]
    pub envoy_concurrency: u32,
    /// Short run (2 s per measurement).
    #[arg(long)]
    pub quick: bool,
}

impl LoadArgs {
    /// How long each measurement runs.
    pub fn duration(&self) -> Duration {
        Duration::from_secs(if self.quick { 2 } else { self.seconds })
    }
}

/// One path's figures.
pub struct Row {
    pub name: &'static str,
    pub rps: f64,
    pub lat: Vec<Duration>,
}

/// Waits until every `(name, netns, addr)` path answers 200 (certificates, pooled
/// connections); an error names the first that never does.
pub fn warm_up(targets: &[(&'static str, &Netns, SocketAddr)]) -> anyhow::Result<()> {
    for (name, netns, addr) in targets {
        let ok = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            http_request(netns, *addr, "GET", "/", &[], Duration::from_secs(2))
                .is_some_and(|r| r.status == 200)
        });
        anyhow::ensure!(ok, "{name} path does not answer");
    }
    Ok(())
}

/// The rows as a Markdown table: saturated requests/s, p50 and p99 at `rate`.
pub fn print_rows(rows: &[Row], rate: u32) {
    println!("| path | requests/s (saturated) | p50 at {rate} rps | p99 at {rate} rps | samples |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {:.0} | {:.0} us | {:.0} us | {} |",
            r.name,
            r.rps,
            pct(&r.lat, 0.5).as_secs_f64() * 1e6,
            pct(&r.lat, 0.99).as_secs_f64() * 1e6,
            r.lat.len()
        );
    }
}

/// One HTTP/1.1 keep-alive connection from `netns`.
pub async fn connect(
    netns: &Netns,
    addr: SocketAddr,
) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let std = netns.tcp_connect(addr, Duration::from_secs(5))?;
    std.set_nonblocking(true)?;
    std.set_nodelay(true)?;
    let stream = tokio::net::TcpStream::from_std(std)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

pub async fn one(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    host: &str,
) -> anyhow::Result<()> {
    sender.ready().await?;
    let req = hyper::Request::get("/bench")
        .header("host", host)
        .body(Empty::new())?;
    let resp = sender.send_request(req).await?;
    anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
    resp.into_body().collect().await?;
    Ok(())
}

/// Requests/s with `conns` connections sending back to back.
pub async fn saturate(
    netns: &Netns,
    addr: SocketAddr,
    conns: usize,
    dur: Duration,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + dur;
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let mut sender = connect(netns, addr).await?;
        let host = addr.to_string();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                if one(&mut sender, &host).await.is_err() {
                    break;
                }
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await?;
    }
    Ok(total as f64 / dur.as_secs_f64())
}

/// Latencies at a fixed `rate`, spread over 10 connections (open loop per connection).
pub async fn paced(
    netns: &Netns,
    addr: SocketAddr,
    rate: u32,
    dur: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let conns = 10u32;
    let interval = Duration::from_secs_f64(f64::from(conns) / f64::from(rate));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..conns {
        let mut sender = connect(netns, addr).await?;
        let host = addr.to_string();
        let offset = interval.mul_f64(f64::from(i) / f64::from(conns));
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut next = start + offset;
            while next < start + dur {
                tokio::time::sleep_until(next.into()).await;
                let t = Instant::now();
                if one(&mut sender, &host).await.is_ok() {
                    lat.push(t.elapsed());
                }
                next += interval;
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    all.sort();
    Ok(all)
}

pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// utime + stime of `pid` in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// (RSS, private anonymous) in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("RssAnon:"))
}
