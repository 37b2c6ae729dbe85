//! A throwaway PKI for tests: a self-signed CA in a temp dir that mints SPIFFE certificates and
//! builds the mesh's rustls configurations from them.

use std::sync::Arc;

use mesh_identity::tls::{client_config, parse_certs, server_config, CertKey, ClientAuth};
use mesh_identity::{generate_csr, CaOptions, CertificateAuthority, Identity};
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::CertificateDer;

/// A CA and its temp directory (removed on drop).
#[derive(Debug)]
pub struct TestPki {
    _dir: tempfile::TempDir,
    pub ca: CertificateAuthority,
}

impl TestPki {
    pub fn new() -> TestPki {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = CertificateAuthority::self_signed(dir.path(), CaOptions::default()).expect("ca");
        TestPki { _dir: dir, ca }
    }

    /// The root certificate(s) to trust.
    pub fn roots(&self) -> Vec<CertificateDer<'static>> {
        parse_certs(self.ca.root_cert_pem(), "root").expect("roots")
    }

    /// A fresh key and certificate for `identity`.
    pub fn cert_for(&self, identity: &Identity) -> CertKey {
        let csr = generate_csr(identity).expect("csr");
        let chain = self
            .ca
            .sign_csr(&csr.csr_pem, identity, None)
            .expect("sign");
        CertKey::from_pem(&chain, &csr.key_pem).expect("cert key")
    }

    /// A server that presents `identity` and requires a SPIFFE client certificate.
    pub fn server_tls(&self, identity: &Identity) -> Arc<ServerConfig> {
        let config = server_config(
            self.cert_for(identity),
            &self.roots(),
            ClientAuth::RequireSpiffe,
        );
        Arc::new(config.expect("server config"))
    }

    /// A client that presents `src` (if any) and accepts only `expected` server identities.
    pub fn client_tls(&self, src: Option<&Identity>, expected: Vec<Identity>) -> Arc<ClientConfig> {
        let cert = src.map(|id| self.cert_for(id));
        Arc::new(client_config(cert, &self.roots(), expected).expect("client config"))
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}
