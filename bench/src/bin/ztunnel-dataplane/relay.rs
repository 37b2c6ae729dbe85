//! The floor of a pair of user-space proxies on this machine: two plain TCP relays in the
//! places of the ztunnels' in-pod sockets (this executable with `--relay-to`), one in the
//! unenrolled client pod and one in the unenrolled server pod. They do the least a proxy can
//! do per connection and per byte: accept, connect to the next hop, copy both ways with
//! half-close. No TLS, no HTTP/2, no capture, no policy, no metrics. The path has the mesh
//! path's three TCP legs over the same links (loopback in each pod, the pods' veths and the
//! bridge between), so what the relays add over the direct path is what the kernel, the legs
//! and the thread wake-ups of two proxy processes cost here, whatever the proxy does itself.
//!
//! ```text
//! relays: dclient app -> lo -> relay (dclient) -> dserver:port+OFFSET -> relay (dserver) -> lo -> app
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use mesh_testutil::netns::ChildGuard;
use mesh_testutil::Netns;
use tokio::net::{TcpListener, TcpStream};

/// The relay in the server pod listens on each relayed port plus this.
pub const PORT_OFFSET: u16 = 10_000;

/// Each direction's copy buffer. Large enough for few syscalls per byte in bulk transfers,
/// small enough to stay clear of glibc's mmap threshold (128 KiB), which would add an
/// `mmap` and a `munmap` to every new connection.
const COPY_BUFFER: usize = 64 * 1024;

/// One relay process; killed when dropped.
pub struct Relay {
    child: ChildGuard,
}

impl Relay {
    /// Starts a relay in `netns` that forwards every connection to a listen port of `ports`
    /// (on any address of `netns`) to its target port at `to`, and waits until it listens.
    pub fn start(netns: &Netns, to: Ipv4Addr, ports: &[PortMap]) -> anyhow::Result<Relay> {
        let list: Vec<String> = ports.iter().map(PortMap::to_string).collect();
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg(format!("--relay-to={to}"))
            .arg(format!("--relay-ports={}", list.join(",")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = netns.spawn(&mut cmd).context("starting a relay")?;
        for port in ports {
            crate::load::wait_listening(netns, port.listen)?;
        }
        Ok(Relay { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// A relayed port: `LISTEN:TARGET` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortMap {
    pub listen: u16,
    pub target: u16,
}

impl std::fmt::Display for PortMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.listen, self.target)
    }
}

impl std::str::FromStr for PortMap {
    type Err = String;

    fn from_str(s: &str) -> Result<PortMap, String> {
        let port = |p: &str| {
            p.parse::<u16>()
                .map_err(|e| format!("{p:?} in {s:?} is not a port: {e}"))
        };
        let (listen, target) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?} is not LISTEN:TARGET"))?;
        Ok(PortMap {
            listen: port(listen)?,
            target: port(target)?,
        })
    }
}

/// `--relay-to`: relays `ports` to `to` until killed, on as many runtime worker threads as
/// ztunnel would use here: its default (a quarter of the cores, at least two; see
/// `read_worker_threads` in ztunnel's config), or `ZTUNNEL_WORKER_THREADS` when the caller
/// set it.
pub fn serve(to: Ipv4Addr, ports: &[PortMap]) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let workers = match std::env::var("ZTUNNEL_WORKER_THREADS") {
        Ok(n) => n
            .parse()
            .ok()
            .filter(|&n: &usize| n > 0)
            .with_context(|| format!("ZTUNNEL_WORKER_THREADS={n:?} is not a thread count"))?,
        Err(_) => cores.div_ceil(4).max(2),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut loops = tokio::task::JoinSet::new();
        for port in ports {
            let listener = TcpListener::bind(("0.0.0.0", port.listen))
                .await
                .with_context(|| format!("relay: listening on {}", port.listen))?;
            loops.spawn(accept_loop(listener, SocketAddr::from((to, port.target))));
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

#[cfg(test)]
mod tests {
    use super::PortMap;

    #[test]
    fn port_maps_read_back_what_they_write_and_name_what_is_wrong() {
        let map = PortMap {
            listen: 9000,
            target: 19000,
        };
        assert_eq!(map.to_string().parse::<PortMap>(), Ok(map));
        let err = |s: &str| s.parse::<PortMap>().err().unwrap_or_default();
        assert!(err("9000").contains("not LISTEN:TARGET"), "{}", err("9000"));
        assert!(err("x:1").contains("\"x\""), "{}", err("x:1"));
        assert!(err("1:70000").contains("\"70000\""), "{}", err("1:70000"));
    }
}
