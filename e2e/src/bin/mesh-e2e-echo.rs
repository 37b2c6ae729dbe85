//! A TCP echo server as its own process, for e2e tests that hold thousands of connections
//! (the server ends then count against this process's open-files limit, not the test's).
//!
//! `mesh-e2e-echo <port>`: echoes every byte back on every connection to `0.0.0.0:<port>` of
//! the current network namespace, on one thread, until killed. Prints `listening` once bound.

use std::io::Write;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| std::io::Error::other("usage: mesh-e2e-echo <port>"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(port))
}

async fn serve(port: u16) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await?;
    let mut out = std::io::stdout();
    writeln!(out, "listening")?;
    out.flush()?;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(echo(stream));
            }
            Err(error) => {
                // EMFILE and the like: back off instead of spinning.
                eprintln!("mesh-e2e-echo: accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn echo(mut stream: tokio::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = vec![0u8; 4096];
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
