//! The HTTP probe: one GET per hop over HTTP/1.1 (TLS without verification for HTTPS), the
//! kubelet's headers passed on, same-host redirects followed.

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::{AppProbes, ProbeAnswer, MAX_BODY};

/// Redirects followed on the same host before the probe fails (the kubelet's limit).
const MAX_REDIRECTS: usize = 10;

/// Headers that belong to the kubelet's connection, not to the app's.
const HOP_BY_HOP: [header::HeaderName; 6] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
];

/// The `Host` the app sees: the kubelet's, with the status port swapped for the app's.
fn host_header(probes: &AppProbes, incoming: &HeaderMap, port: u16) -> String {
    let default = format!("{}:{port}", probes.target.host());
    let Some(host) = incoming.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return default;
    };
    match host.rsplit_once(':') {
        Some((name, p)) if p == probes.status_port.to_string() => format!("{name}:{port}"),
        _ => host.to_string(),
    }
}

pub(super) async fn get(
    probes: &AppProbes,
    path: &str,
    port: u16,
    https: bool,
    incoming: &HeaderMap,
) -> Result<ProbeAnswer, String> {
    let host = host_header(probes, incoming, port);
    let mut target = path.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let (status, headers, body) = once(probes, &target, port, https, incoming, &host).await?;
        if !status.is_redirection() {
            return Ok(ProbeAnswer {
                status,
                body: body.to_vec(),
            });
        }
        // Followed only on the same host; elsewhere the redirect itself is the answer.
        let next = headers
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .and_then(|l| l.parse::<Uri>().ok());
        match next {
            Some(uri) if uri.host().is_none() => {
                target = uri
                    .path_and_query()
                    .map_or("/".to_string(), |p| p.to_string());
            }
            Some(uri) if uri.host() == Some(probes.target.host().trim_matches(['[', ']'])) => {
                target = uri
                    .path_and_query()
                    .map_or("/".to_string(), |p| p.to_string());
            }
            _ => return Ok(ProbeAnswer::status(StatusCode::OK)),
        }
    }
    Err(format!("more than {MAX_REDIRECTS} redirects"))
}

async fn once(
    probes: &AppProbes,
    path: &str,
    port: u16,
    https: bool,
    incoming: &HeaderMap,
    host: &str,
) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    let addr = probes.target.addr(port);
    let stream = probes
        .target
        .connect(port)
        .await
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(path)
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("probe path {path:?}: {e}"))?;
    let headers = request.headers_mut();
    for (name, value) in incoming {
        if !HOP_BY_HOP.contains(name) && name != header::HOST {
            headers.append(name.clone(), value.clone());
        }
    }
    let host = HeaderValue::from_str(host).map_err(|e| format!("Host {host:?}: {e}"))?;
    headers.insert(header::HOST, host);
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    let response = match https {
        false => send(TokioIo::new(stream), request).await?,
        true => {
            let connector = tokio_rustls::TlsConnector::from(Arc::new(insecure_client()));
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let tls = connector
                .connect(name, stream)
                .await
                .map_err(|e| format!("TLS to {addr}: {e}"))?;
            send(TokioIo::new(tls), request).await?
        }
    };
    let (parts, body) = response.into_parts();
    // The body is only read up to the limit (a larger one is cut, not an error).
    let mut body = body;
    let mut bytes = Vec::new();
    while bytes.len() < MAX_BODY {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    bytes.truncate(MAX_BODY);
    Ok((parts.status, parts.headers, Bytes::from(bytes)))
}

async fn send<I>(
    io: I,
    request: Request<Empty<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(target: "probes", error = %e, "probe connection");
        }
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("HTTP request: {e}"))
}

/// TLS that accepts any server certificate: the kubelet does not verify HTTPS probes either.
fn insecure_client() -> rustls::ClientConfig {
    rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate))
        .with_no_client_auth()
}

#[derive(Debug)]
struct AnyCertificate;

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
