//! Web-PKI style TLS material as files, for TLS a proxy originates (DestinationRule `SIMPLE` /
//! `MUTUAL`): a CA, a server certificate for a DNS name and a client certificate, as PEM files
//! every uid can read (a proxy runs as 1337), and the server's rustls configuration.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The files and PEM of one CA, its server certificate and its client certificate.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    ca_pem: String,
    server_cert_pem: String,
    server_key_pem: String,
}

impl TlsFiles {
    /// A fresh CA named `ca_name` and certificates for `server_name` (DNS SAN) and a client,
    /// written to `dir` (created, mode 0755; files 0644).
    pub fn generate(dir: &Path, ca_name: &str, server_name: &str) -> TlsFiles {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).expect("tls dir");
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
        let mut ca = CertificateParams::new(Vec::new()).expect("ca params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, ca_name);
        let ca_key = KeyPair::generate().expect("ca key");
        let ca_pem = ca.self_signed(&ca_key).expect("ca cert").pem();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |name: &str| {
            let key = KeyPair::generate().expect("key");
            let params = CertificateParams::new(vec![name.to_string()]).expect("params");
            let cert = params.signed_by(&key, &issuer).expect("signed");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert_pem, server_key_pem) = leaf(server_name);
        let (client_pem, client_key_pem) = leaf("client.example");
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write tls file");
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644));
            path
        };
        TlsFiles {
            ca: write("ca.pem", &ca_pem),
            client_cert: write("client.pem", &client_pem),
            client_key: write("client-key.pem", &client_key_pem),
            ca_pem,
            server_cert_pem,
            server_key_pem,
        }
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server certificate and key (PEM), e.g. for a Kubernetes TLS Secret.
    pub fn server_pem(&self) -> (&str, &str) {
        (&self.server_cert_pem, &self.server_key_pem)
    }

    /// A client trusting this CA only, presenting the client certificate when `with_cert`.
    pub fn client_config(&self, with_cert: bool) -> Arc<rustls::ClientConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(c.expect("ca pem")).expect("root");
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
        let mut config = if with_cert {
            let read = |p: &Path| std::fs::read(p).expect("client pem");
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(&read(&self.client_cert))
                    .map(|c| c.expect("client cert"))
                    .collect();
            let key = PrivateKeyDer::from_pem_slice(&read(&self.client_key)).expect("client key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client config")
        } else {
            builder.with_no_client_auth()
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A server presenting the server certificate; with `require_client_cert`, clients must
    /// present a certificate of this CA.
    pub fn server_config(&self, require_client_cert: bool) -> Arc<ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("protocol versions");
        let builder = if require_client_cert {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
                roots.add(c.expect("ca pem")).expect("root");
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.server_cert_pem.as_bytes())
                .map(|c| c.expect("server pem"))
                .collect();
        let key = PrivateKeyDer::from_pem_slice(self.server_key_pem.as_bytes()).expect("key pem");
        let mut config = builder.with_single_cert(chain, key).expect("server config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}
