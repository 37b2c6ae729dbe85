//! The floor of any pair of user-space proxies on this machine: two plain TCP relays, one per
//! node, in place of the ztunnels (this executable with `--relay-to`). They do the least a
//! proxy can do per connection and per byte: accept, connect to the next hop, copy both ways
//! with half-close. No TLS, no HTTP/2, no capture, no policy, no metrics. What they add over
//! the direct path is what the kernel, the three TCP legs and the thread wake-ups of two
//! proxy processes cost here, whatever the proxy does itself.
//!
//! ```text
//! relays: dclient -> relay on node1 (node1's IP) -> relay on node2 -> dserver
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use mesh_testutil::netns::ChildGuard;
use mesh_testutil::Netns;
use tokio::net::{TcpListener, TcpStream};

/// Each direction's copy buffer. Large enough for few syscalls per byte in bulk transfers,
/// small enough to stay clear of glibc's mmap threshold (128 KiB), which would add an
/// `mmap` and a `munmap` to every new connection.
const COPY_BUFFER: usize = 64 * 1024;

/// One relay process; killed when dropped.
pub struct Relay {
    child: ChildGuard,
}

impl Relay {
    /// Starts a relay in `netns` that forwards every connection to one of `ports` (on any
    /// address of `netns`) to the same port of `to`, and waits until it listens.
    pub fn start(netns: &Netns, to: Ipv4Addr, ports: &[u16]) -> anyhow::Result<Relay> {
        let list: Vec<String> = ports.iter().map(u16::to_string).collect();
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg(format!("--relay-to={to}"))
            .arg(format!("--relay-ports={}", list.join(",")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = netns.spawn(&mut cmd).context("starting a relay")?;
        for &port in ports {
            crate::load::wait_listening(netns, port)?;
        }
        Ok(Relay { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// `--relay-to`: relays `ports` to `to` until killed, on as many runtime worker threads as
/// ztunnel would use here (its default, or `ZTUNNEL_WORKER_THREADS` when the caller set it).
pub fn serve(to: Ipv4Addr, ports: &[u16]) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let workers = match std::env::var("ZTUNNEL_WORKER_THREADS") {
        Ok(n) => n
            .parse()
            .with_context(|| format!("ZTUNNEL_WORKER_THREADS={n:?} is not a thread count"))?,
        Err(_) => cores.div_ceil(4).max(2),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut loops = tokio::task::JoinSet::new();
        for &port in ports {
            let listener = TcpListener::bind(("0.0.0.0", port))
                .await
                .with_context(|| format!("relay: listening on {port}"))?;
            loops.spawn(accept_loop(listener, SocketAddr::from((to, port))));
        }
        loops.join_next().await;
        Ok(())
    })
}

async fn accept_loop(listener: TcpListener, to: SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(relay(stream, to));
            }
            Err(error) => {
                eprintln!("relay: accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn relay(mut downstream: TcpStream, to: SocketAddr) {
    let mut upstream = match TcpStream::connect(to).await {
        Ok(upstream) => upstream,
        Err(error) => {
            eprintln!("relay: connecting to {to}: {error}");
            return;
        }
    };
    let _ = downstream.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional_with_sizes(
        &mut downstream,
        &mut upstream,
        COPY_BUFFER,
        COPY_BUFFER,
    )
    .await;
}
