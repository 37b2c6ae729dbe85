//! A minimal HTTP/1.0 GET for admin endpoints on plain `http://` (ztunnel's 15000): one
//! request per connection, body read to the end (chunked bodies decoded).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why a GET failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{url:?} is not an http://host:port URL (admin endpoints are plain HTTP)")]
    BadUrl { url: String },
    #[error("cannot connect to {addr}: {source}; is the process running and listening there?")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error(
        "{addr} did not answer within {0:?}; is it the right address?",
        TIMEOUT
    )]
    Timeout { addr: String },
    #[error("reading from {addr} failed: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("{addr} answered with something that is not HTTP; is it the admin port?")]
    NotHttp { addr: String },
    #[error("{addr}{path} answered {status}: {body}")]
    Status {
        addr: String,
        path: String,
        status: String,
        body: String,
    },
}

impl HttpError {
    /// Short label for the error kind.
    pub fn reason(&self) -> &'static str {
        match self {
            HttpError::BadUrl { .. } => "bad_url",
            HttpError::Connect { .. } => "connect",
            HttpError::Timeout { .. } => "timeout",
            HttpError::Io { .. } => "io",
            HttpError::NotHttp { .. } => "not_http",
            HttpError::Status { .. } => "status",
        }
    }
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// `host:port` of an `http://host:port[/...]` URL (port 80 when absent).
pub fn authority(url: &str) -> Result<String, HttpError> {
    let bad = || HttpError::BadUrl {
        url: url.to_string(),
    };
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(bad());
    }
    let has_port = if host.starts_with('[') {
        host.contains("]:")
    } else {
        host.contains(':')
    };
    Ok(if has_port {
        host.to_string()
    } else {
        format!("{host}:80")
    })
}

/// GETs `path` from the server at `url` and returns the body of a 200 answer.
pub async fn get(url: &str, path: &str) -> Result<Vec<u8>, HttpError> {
    let addr = authority(url)?;
    match tokio::time::timeout(TIMEOUT, fetch(&addr, path)).await {
        Ok(result) => result,
        Err(_) => Err(HttpError::Timeout { addr }),
    }
}

async fn fetch(addr: &str, path: &str) -> Result<Vec<u8>, HttpError> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| HttpError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    let io = |source| HttpError::Io {
        addr: addr.to_string(),
        source,
    };
    // HTTP/1.1 (Envoy refuses 1.0 with 426) and one request per connection.
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(io)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.map_err(io)?;
    let not_http = || HttpError::NotHttp {
        addr: addr.to_string(),
    };
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(not_http)?;
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let body = &response[split + 4..];
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next().unwrap_or_default().starts_with("HTTP/") {
        return Err(not_http());
    }
    let code = parts.next().unwrap_or_default();
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body).ok_or_else(not_http)?
    } else {
        body.to_vec()
    };
    if code != "200" {
        return Err(HttpError::Status {
            addr: addr.to_string(),
            path: path.to_string(),
            status: status_line.trim().to_string(),
            body: String::from_utf8_lossy(&body).trim().to_string(),
        });
    }
    Ok(body)
}

/// Decodes a chunked body; `None` if it is malformed.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size_text = size_text.split(';').next()?.trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        assert_eq!(
            authority("http://localhost:15000").expect("ok"),
            "localhost:15000"
        );
        assert_eq!(
            authority("http://127.0.0.1:15000/").expect("ok"),
            "127.0.0.1:15000"
        );
        assert_eq!(authority("http://host").expect("ok"), "host:80");
        assert_eq!(authority("http://[::1]:15000").expect("ok"), "[::1]:15000");
        assert!(authority("https://host:15000").is_err());
        assert!(authority("localhost:15000").is_err());
    }

    #[test]
    fn dechunks() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").as_deref(),
            Some(&b"abcde"[..])
        );
        assert!(dechunk(b"5\r\nab").is_none());
    }
}
