//! rustls configurations for the mesh: TLS 1.3 only, ring provider, ALPN `h2`.
//!
//! Mesh peers (HBONE) verify each other by SPIFFE identity, not by DNS name: HBONE sends no SNI,
//! so the client checks the chain against the mesh roots and then requires the server's SPIFFE
//! URI SAN to be one of the identities it expects. Talking to istiod on 15012 uses ordinary
//! DNS-name verification ([`client_config_for_server_name`]).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::extensions::GeneralName;

use crate::Identity;

mod verify;

pub use verify::{SpiffeClientVerifier, SpiffeServerVerifier};

/// The ALPN protocol of HBONE and of istiod's gRPC.
pub const ALPN_H2: &[u8] = b"h2";

/// Errors building TLS configurations or reading peer identities.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no PEM certificate found in the {what}; pass the PEM chain returned by the CA")]
    NoCertificates { what: &'static str },
    #[error("cannot parse the PEM {what}: {detail}")]
    BadPem { what: &'static str, detail: String },
    #[error("no usable root certificate: {detail}; pass the mesh root-cert.pem")]
    NoRoots { detail: String },
    #[error("rustls refused the configuration: {0}; does the private key belong to the first certificate?")]
    Rustls(#[from] rustls::Error),
    #[error("cannot build the client-certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("cannot parse the peer certificate: {detail}")]
    BadPeerCert { detail: String },
    #[error("the peer certificate carries no spiffe:// URI SAN; it is not a mesh identity")]
    NoSpiffeId,
    #[error(
        "the peer certificate carries {count} SPIFFE URI SANs; a mesh certificate has exactly one"
    )]
    MultipleSpiffeIds { count: usize },
    #[error("the peer certificate's SPIFFE id is invalid: {0}")]
    BadSpiffeId(#[from] crate::IdentityError),
    #[error("peer identity {actual} is not one of the expected identities [{expected}]; is traffic reaching the wrong workload, or is the destination's service account different?")]
    UnexpectedIdentity { actual: String, expected: String },
}

impl TlsError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            TlsError::NoCertificates { .. } => "no_certificates",
            TlsError::BadPem { .. } => "bad_pem",
            TlsError::NoRoots { .. } => "no_roots",
            TlsError::Rustls(_) => "rustls",
            TlsError::Verifier(_) => "verifier",
            TlsError::BadPeerCert { .. } => "bad_peer_cert",
            TlsError::NoSpiffeId => "no_spiffe_id",
            TlsError::MultipleSpiffeIds { .. } => "multiple_spiffe_ids",
            TlsError::BadSpiffeId(_) => "bad_spiffe_id",
            TlsError::UnexpectedIdentity { .. } => "unexpected_identity",
        }
    }
}

/// A certificate chain (leaf first) and its private key.
#[derive(Debug)]
pub struct CertKey {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for CertKey {
    fn clone(&self) -> Self {
        CertKey {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl CertKey {
    /// From the CA's PEM chain (one or more certificates per element) and a PEM private key.
    pub fn from_pem<S: AsRef<str>>(chain_pem: &[S], key_pem: &str) -> Result<Self, TlsError> {
        let mut chain = Vec::new();
        for pem in chain_pem {
            chain.extend(parse_certs(pem.as_ref(), "certificate chain")?);
        }
        if chain.is_empty() {
            return Err(TlsError::NoCertificates {
                what: "certificate chain",
            });
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::BadPem {
                what: "private key",
                detail: e.to_string(),
            })?;
        Ok(CertKey { chain, key })
    }
}

/// Whether a server asks for client certificates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate (istiod's 15012: callers authenticate with tokens).
    None,
    /// A client certificate chaining to the roots and carrying a SPIFFE id is mandatory (HBONE).
    RequireSpiffe,
}

/// The crypto provider used everywhere: ring, restricted to the suites Istio's ztunnel offers
/// (docs/compatibility.md, TLS: TLS 1.3 with AES-256-GCM, then AES-128-GCM; no ChaCha20, which FIPS excludes).
pub fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::{cipher_suite, default_provider};
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_AES_128_GCM_SHA256,
        ],
        ..default_provider()
    })
}

/// Parses every PEM certificate in `pem`.
pub fn parse_certs(
    pem: &str,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem {
            what,
            detail: e.to_string(),
        })
}

/// A root store from DER roots; fails if none is usable.
pub fn root_store(roots: &[CertificateDer<'_>]) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    let (_, ignored) =
        store.add_parsable_certificates(roots.iter().map(|c| c.clone().into_owned()));
    if store.is_empty() {
        return Err(TlsError::NoRoots {
            detail: format!("{} given, {ignored} unparsable", roots.len()),
        });
    }
    Ok(store)
}

/// Server configuration: TLS 1.3, ALPN h2, optional mandatory SPIFFE client certificates.
pub fn server_config(
    cert: CertKey,
    roots: &[CertificateDer<'_>],
    client_auth: ClientAuth,
) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::RequireSpiffe => {
            let verifier = SpiffeClientVerifier::new(Arc::new(root_store(roots)?), provider)?;
            builder.with_client_cert_verifier(Arc::new(verifier))
        }
    };
    let mut config = builder.with_single_cert(cert.chain, cert.key)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// Mesh client configuration: verifies the server chain to `roots` and requires its SPIFFE id
/// to be one of `expected` (no DNS or SNI check). `cert` is presented when given.
pub fn client_config(
    cert: Option<CertKey>,
    roots: &[CertificateDer<'_>],
    expected: Vec<Identity>,
) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let verifier = SpiffeServerVerifier::new(root_store(roots)?, expected, provider.clone());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match cert {
        Some(cert) => builder.with_client_auth_cert(cert.chain, cert.key)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.enable_sni = false;
    Ok(config)
}

/// Client configuration with ordinary DNS-name verification against `roots` (istiod 15012).
pub fn client_config_for_server_name(
    roots: &[CertificateDer<'_>],
) -> Result<ClientConfig, TlsError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(root_store(roots)?)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// The SPIFFE identity in a (peer) certificate's URI SAN.
pub fn peer_identity(cert: &CertificateDer<'_>) -> Result<Identity, TlsError> {
    let (_, x509) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| TlsError::BadPeerCert {
            detail: e.to_string(),
        })?;
    let san = x509
        .subject_alternative_name()
        .map_err(|e| TlsError::BadPeerCert {
            detail: e.to_string(),
        })?;
    let uris: Vec<&str> = san
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri)
                if uri.len() >= 9 && uri[..9].eq_ignore_ascii_case("spiffe://") =>
            {
                Some(*uri)
            }
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [] => Err(TlsError::NoSpiffeId),
        [one] => Ok(Identity::parse(one)?),
        many => Err(TlsError::MultipleSpiffeIds { count: many.len() }),
    }
}

/// The identity of the peer of an established connection (first certificate presented).
pub fn peer_identity_of(peer_certs: Option<&[CertificateDer<'_>]>) -> Result<Identity, TlsError> {
    let leaf = peer_certs
        .and_then(|c| c.first())
        .ok_or(TlsError::NoCertificates {
            what: "peer's handshake",
        })?;
    peer_identity(leaf)
}

#[cfg(test)]
mod tests;
