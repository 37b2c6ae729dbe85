//! A TCP relay in front of a server that can fall silent: it then swallows what either side
//! sends and keeps both connections open, as a network partition or a node that lost power
//! would. Neither side's TCP sees anything wrong; only an application-level keepalive (HTTP/2
//! PINGs) can tell.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// A running relay; it stops accepting when dropped (connections already relayed go on).
pub struct SilentRelay {
    addr: SocketAddr,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct State {
    silent: AtomicBool,
    accepted: AtomicUsize,
    closed_by_server: AtomicUsize,
}

impl SilentRelay {
    /// Listens on a loopback port and relays each connection to `server`.
    pub async fn to(server: SocketAddr) -> std::io::Result<SilentRelay> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                let Ok(upstream) = TcpStream::connect(server).await else {
                    continue;
                };
                let (client_in, client_out) = client.into_split();
                let (server_in, server_out) = upstream.into_split();
                tokio::spawn(pass(client_in, server_out, shared.clone(), false));
                tokio::spawn(pass(server_in, client_out, shared.clone(), true));
            }
        });
        Ok(SilentRelay {
            addr,
            state,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Silent: bytes in either direction are read and dropped. Not silent: relayed again.
    pub fn silence(&self, silent: bool) {
        self.state.silent.store(silent, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Connections whose server side ended (EOF or an error): closed by the server, or by the
    /// server after the client closed its end.
    pub fn closed_by_server(&self) -> usize {
        self.state.closed_by_server.load(Ordering::SeqCst)
    }
}

impl Drop for SilentRelay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pass(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, state: Arc<State>, server: bool) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                if server {
                    state.closed_by_server.fetch_add(1, Ordering::SeqCst);
                }
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if state.silent.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
