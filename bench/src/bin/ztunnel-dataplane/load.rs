//! The application side: a TCP echo server in a pod (this executable in `--serve-echo` mode)
//! and the clients that drive it from another pod's netns --
//! 1 KB ping-pong on one persistent connection, connection churn, idle connections held open.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use mesh_bench::percentile;
use mesh_testutil::netns::ChildGuard;
use mesh_testutil::Netns;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IO_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The echo server: this executable with `--serve-echo`, as its own process inside a pod's
/// netns (like a real app; it also keeps the server ends of the idle connections out of this
/// process's fd limit). Killed when dropped.
pub struct EchoServer {
    _child: ChildGuard,
}

impl EchoServer {
    /// Starts it in `netns`, echoing on `ports`, and waits until it listens.
    pub fn start(netns: &Netns, ports: &[u16]) -> anyhow::Result<EchoServer> {
        let list: Vec<String> = ports.iter().map(u16::to_string).collect();
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg(format!("--serve-echo={}", list.join(",")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = netns.spawn(&mut cmd).context("starting the echo server")?;
        for &port in ports {
            wait_listening(netns, port)?;
        }
        Ok(EchoServer { _child: child })
    }
}

/// `--serve-echo`: echoes every byte back on every connection to `ports` (all addresses of
/// the current netns), on one thread, until killed.
pub fn serve(ports: &[u16]) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut loops = tokio::task::JoinSet::new();
        for &port in ports {
            let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
                .await
                .with_context(|| format!("echo server: listening on {port}"))?;
            loops.spawn(accept_loop(listener));
        }
        loops.join_next().await;
        Ok(())
    })
}

/// Waits until something listens on TCP `port` in `netns`.
pub fn wait_listening(netns: &Netns, port: u16) -> anyhow::Result<()> {
    let start = Instant::now();
    let filter = format!("sport = :{port}");
    while start.elapsed() < Duration::from_secs(5) {
        let out = netns.exec("ss", &["-Htln", &filter])?;
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::bail!("nothing listens on {port} in {} after 5 s", netns.name())
}

async fn accept_loop(listener: tokio::net::TcpListener) {
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tasks.spawn(echo(stream));
                }
                Err(error) => {
                    // EMFILE and the like: back off instead of spinning.
                    eprintln!("echo server: accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

async fn echo(mut stream: tokio::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(stream)
}

/// Sends `payload` and reads the same number of bytes back.
fn exchange(stream: &mut TcpStream, payload: &[u8], reply: &mut [u8]) -> std::io::Result<()> {
    stream.write_all(payload)?;
    stream.read_exact(&mut reply[..payload.len()])
}

/// Round-trip times in microseconds of `count` `size`-byte exchanges over one connection
/// from `netns` to `addr`, after `warmup` unmeasured ones.
pub fn round_trips(
    netns: &Netns,
    addr: SocketAddr,
    size: usize,
    warmup: usize,
    count: usize,
) -> anyhow::Result<Vec<f64>> {
    netns
        .run(|| -> std::io::Result<Vec<f64>> {
            let mut stream = connect(addr)?;
            let payload = vec![0x5a_u8; size];
            let mut reply = vec![0u8; size];
            let mut samples = Vec::with_capacity(count);
            for i in 0..warmup + count {
                let start = Instant::now();
                exchange(&mut stream, &payload, &mut reply)?;
                if i >= warmup {
                    samples.push(start.elapsed().as_secs_f64() * 1e6);
                }
            }
            Ok(samples)
        })?
        .with_context(|| format!("ping-pong to {addr} from {}", netns.name()))
}

/// Result of [`connection_churn`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Churn {
    pub per_second: f64,
    pub completed: u64,
    pub failed: u64,
    /// Connect plus the exchange, microseconds: p50, p99.
    pub setup_us: [f64; 2],
    /// `connect()` alone (to ztunnel's local listener on the mesh path), microseconds, p50.
    pub connect_p50_us: f64,
}

/// One connection: connect, exchange, close. Returns (connect, total) durations in us.
fn one_connection(
    addr: SocketAddr,
    payload: &[u8],
    reply: &mut [u8],
) -> std::io::Result<(f64, f64)> {
    let start = Instant::now();
    let mut stream = connect(addr)?;
    let connected = start.elapsed();
    exchange(&mut stream, payload, reply)?;
    drop(stream);
    Ok((
        connected.as_secs_f64() * 1e6,
        start.elapsed().as_secs_f64() * 1e6,
    ))
}

/// For `duration`, back to back: connect from `netns` to `addr`, one `size`-byte exchange,
/// close.
pub fn connection_churn(
    netns: &Netns,
    addr: SocketAddr,
    size: usize,
    duration: Duration,
) -> anyhow::Result<Churn> {
    let churn = netns.run(|| {
        let payload = vec![0x5a_u8; size];
        let mut reply = vec![0u8; size];
        let (mut connects, mut totals, mut failed) = (Vec::new(), Vec::new(), 0u64);
        let start = Instant::now();
        while start.elapsed() < duration {
            match one_connection(addr, &payload, &mut reply) {
                Ok((connect, total)) => {
                    connects.push(connect);
                    totals.push(total);
                }
                Err(error) => {
                    failed += 1;
                    if failed <= 3 {
                        eprintln!("connection churn to {addr}: {error}");
                    }
                }
            }
        }
        Churn {
            per_second: totals.len() as f64 / start.elapsed().as_secs_f64(),
            completed: totals.len() as u64,
            failed,
            setup_us: [50.0, 99.0].map(|q| percentile(&mut totals, q)),
            connect_p50_us: percentile(&mut connects, 50.0),
        }
    })?;
    anyhow::ensure!(
        churn.completed > 0,
        "no connection from {} to {addr} completed",
        netns.name()
    );
    Ok(churn)
}

/// Opens `count` connections from `netns` to `addr`, each checked end to end with a one-byte
/// exchange, and returns them open (idle).
pub fn open_idle(netns: &Netns, addr: SocketAddr, count: usize) -> anyhow::Result<Vec<TcpStream>> {
    let opened = netns.run(|| {
        let mut reply = [0u8; 1];
        let mut open = Vec::with_capacity(count);
        for _ in 0..count {
            match connect(addr).and_then(|mut s| exchange(&mut s, b"i", &mut reply).map(|_| s)) {
                Ok(stream) => open.push(stream),
                Err(error) => return Err((open.len(), error)),
            }
        }
        Ok(open)
    })?;
    opened.map_err(|(n, error)| {
        anyhow::anyhow!(
            "idle connection {} of {count} to {addr} failed: {error} (RLIMIT_NOFILE? ztunnel log?)",
            n + 1
        )
    })
}
