//! A GET for admin endpoints on plain `http://` (ztunnel's 15000, Envoy's admin): hyper's
//! HTTP/1.1 client, one request per connection, the whole body read.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_util::rt::TokioIo;

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
    #[error("the exchange with {addr} failed: {source}")]
    Exchange {
        addr: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot port-forward to {target}: {detail}")]
    PortForward { target: String, detail: String },
    #[error("{addr} answered with something that is not HTTP; is it the admin port?")]
    NotHttp { addr: String },
    #[error("{addr} closed the connection without answering; is it the admin port?")]
    ClosedEarly { addr: String },
    #[error("the answer of {addr}{path} is larger than {} MiB", MAX_BODY >> 20)]
    TooLarge { addr: String, path: String },
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
            HttpError::Exchange { .. } => "exchange",
            HttpError::NotHttp { .. } => "not_http",
            HttpError::ClosedEarly { .. } => "closed_early",
            HttpError::PortForward { .. } => "port_forward",
            HttpError::TooLarge { .. } => "too_large",
            HttpError::Status { .. } => "status",
        }
    }
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// Most bytes of an answer we read (a config dump of a large mesh is tens of MiB).
const MAX_BODY: usize = 512 << 20;

/// `host:port` of an `http://host:port[/...]` URL (port 80 when absent).
pub fn authority(url: &str) -> Result<String, HttpError> {
    let bad = || HttpError::BadUrl {
        url: url.to_string(),
    };
    let uri: Uri = url.parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some("http") {
        return Err(bad());
    }
    let authority = uri.authority().ok_or_else(bad)?;
    if authority.host().is_empty() {
        return Err(bad());
    }
    // `Uri` accepts any text after the colon; a port must be a number that fits.
    let has_port = authority.as_str().len() > authority.host().len();
    let port = match authority.port_u16() {
        Some(port) => port,
        None if has_port => return Err(bad()),
        None => 80,
    };
    Ok(format!("{}:{port}", authority.host()))
}

/// GETs `path` from the server at `url` and returns the body of a 200 answer.
pub async fn get(url: &str, path: &str) -> Result<Vec<u8>, HttpError> {
    let addr = authority(url)?;
    match tokio::time::timeout(TIMEOUT, fetch(&addr, path)).await {
        Ok(result) => result,
        Err(_) => Err(HttpError::Timeout { addr }),
    }
}

/// GETs `path` from `port` of a pod through the API server's port-forward, as Istio's istioctl
/// reaches admin ports, and returns the body of a 200 answer.
pub async fn get_from_pod(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    port: u16,
    path: &str,
) -> Result<Vec<u8>, HttpError> {
    let target = format!("pod {namespace}/{pod} port {port}");
    let forwarded = async {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client.clone(), namespace);
        let mut forwarder =
            pods.portforward(pod, &[port])
                .await
                .map_err(|e| HttpError::PortForward {
                    target: target.clone(),
                    detail: e.to_string(),
                })?;
        let stream = forwarder
            .take_stream(port)
            .ok_or_else(|| HttpError::PortForward {
                target: target.clone(),
                detail: "no stream for the port".into(),
            })?;
        let refused = forwarder.take_error(port);
        let host = format!("localhost:{port}");
        let exchanged = exchange(stream, &target, &host, path);
        // The kubelet says on the error channel why the pod's port could not be reached; that
        // reason beats the exchange's own failure (which is then only "closed early").
        // Resolves only with a reason: a closed error channel without one never does.
        let refusal = async {
            if let Some(refused) = refused {
                if let Some(detail) = refused.await {
                    return detail;
                }
            }
            std::future::pending::<String>().await
        };
        tokio::pin!(exchanged, refusal);
        let answer = tokio::select! {
            answer = &mut exchanged => match answer {
                Ok(body) => Ok(body),
                Err(e) => match tokio::time::timeout(Duration::from_secs(1), &mut refusal).await {
                    Ok(detail) => Err(HttpError::PortForward { target: target.clone(), detail }),
                    // kube's forwarder drops the kubelet's reason when the API server closes
                    // the tunnel before our request went out: a tunnel closed without any
                    // answer is then all we know.
                    Err(_) if matches!(e, HttpError::ClosedEarly { .. }) => Err(HttpError::PortForward {
                        target: target.clone(),
                        detail: "the tunnel closed before the pod's port answered, and no reason came back; is anything listening on that port in the pod?".into(),
                    }),
                    Err(_) => Err(e),
                },
            },
            detail = &mut refusal => Err(HttpError::PortForward { target: target.clone(), detail }),
        };
        forwarder.abort();
        answer
    };
    match tokio::time::timeout(TIMEOUT, forwarded).await {
        Ok(result) => result,
        Err(_) => Err(HttpError::Timeout { addr: target }),
    }
}

async fn fetch(addr: &str, path: &str) -> Result<Vec<u8>, HttpError> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| HttpError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    exchange(stream, addr, addr, path).await
}

/// One GET over `stream`; `addr` names the peer in errors, `host` is the Host header.
async fn exchange<S>(stream: S, addr: &str, host: &str, path: &str) -> Result<Vec<u8>, HttpError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // A head that does not parse, or a server that closes before answering, is not an HTTP
    // server; a head too large is one that answered something we will not read.
    let failed = |source: hyper::Error| {
        let addr = addr.to_string();
        if source.is_incomplete_message() {
            HttpError::ClosedEarly { addr }
        } else if source.is_parse() && !source.is_parse_too_large() {
            HttpError::NotHttp { addr }
        } else {
            HttpError::Exchange {
                addr,
                source: Box::new(source),
            }
        }
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(failed)?;
    let connection = tokio::spawn(connection);
    let request = Request::get(path)
        .header(header::HOST, host)
        .header(header::ACCEPT, "*/*")
        .body(Empty::<Bytes>::new())
        .map_err(|_| HttpError::BadUrl {
            url: format!("http://{addr}{path}"),
        })?;
    let response = sender.send_request(request).await.map_err(failed)?;
    let status = response.status();
    // The server's own reason phrase when it sent one, else the standard one.
    let reason = response
        .extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .map(|phrase| String::from_utf8_lossy(phrase.as_bytes()).into_owned())
        .or_else(|| status.canonical_reason().map(str::to_owned))
        .unwrap_or_default();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|error| {
            if error.is::<LengthLimitError>() {
                return HttpError::TooLarge {
                    addr: addr.to_string(),
                    path: path.to_string(),
                };
            }
            match error.downcast::<hyper::Error>() {
                Ok(error) => failed(*error),
                Err(other) => HttpError::Exchange {
                    addr: addr.to_string(),
                    source: other,
                },
            }
        })?
        .to_bytes();
    connection.abort();
    if status != http::StatusCode::OK {
        return Err(HttpError::Status {
            addr: addr.to_string(),
            path: path.to_string(),
            status: format!("{} {reason}", status.as_u16())
                .trim_end()
                .to_owned(),
            body: String::from_utf8_lossy(&body).trim().to_string(),
        });
    }
    Ok(body.to_vec())
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
        assert!(authority("http://localhost:99999").is_err());
        assert!(authority("http://localhost:1500O").is_err());
        assert!(authority("http://[::1]:x").is_err());
    }

    /// Serves one connection with `answer` (raw bytes, to test what a server may send).
    async fn server(answer: &'static [u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut head = vec![0u8; 4096];
            let _ = stream.read(&mut head).await;
            let _ = stream.write_all(answer).await;
        });
        url
    }

    #[tokio::test]
    async fn reads_chunked_bodies_and_names_bad_answers() {
        let url = server(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        )
        .await;
        assert_eq!(get(&url, "/config_dump").await.expect("200"), b"abcde");

        let url = server(b"HTTP/1.1 404 No Such Dump\r\nContent-Length: 4\r\n\r\nnope").await;
        let error = get(&url, "/config_dump").await.expect_err("404");
        assert!(
            matches!(&error, HttpError::Status { status, body, .. } if status == "404 No Such Dump" && body == "nope"),
            "{error}"
        );

        let url = server(b"").await;
        let error = get(&url, "/config_dump").await.expect_err("closed");
        assert_eq!(error.reason(), "closed_early", "{error}");

        let url = server(b"SSH-2.0-OpenSSH_9.2\r\n").await;
        let error = get(&url, "/config_dump").await.expect_err("not HTTP");
        assert_eq!(error.reason(), "not_http", "{error}");

        let url = server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc").await;
        let error = get(&url, "/config_dump").await.expect_err("truncated");
        assert_eq!(error.reason(), "exchange", "{error}");
    }
}
