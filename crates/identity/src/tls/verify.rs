//! Certificate verifiers that authenticate mesh peers by SPIFFE identity.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, RootCertStore,
    SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::{peer_identity, TlsError};
use crate::Identity;

fn other(e: TlsError) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
}

fn pki_error(e: webpki::Error) -> rustls::Error {
    let cert_error = match e {
        webpki::Error::UnknownIssuer => CertificateError::UnknownIssuer,
        webpki::Error::CertExpired { .. } | webpki::Error::InvalidCertValidity => {
            CertificateError::Expired
        }
        webpki::Error::CertNotValidYet { .. } => CertificateError::NotValidYet,
        webpki::Error::InvalidSignatureForPublicKey => CertificateError::BadSignature,
        webpki::Error::BadDer | webpki::Error::BadDerTime => CertificateError::BadEncoding,
        other => CertificateError::Other(OtherError(Arc::new(other))),
    };
    rustls::Error::InvalidCertificate(cert_error)
}

/// Client-side: chain to the mesh roots, then SPIFFE id in the expected set. Ignores the
/// server name entirely (HBONE sends no SNI).
#[derive(Debug)]
pub struct SpiffeServerVerifier {
    roots: RootCertStore,
    expected: Vec<Identity>,
    provider: Arc<CryptoProvider>,
}

impl SpiffeServerVerifier {
    pub fn new(
        roots: RootCertStore,
        expected: Vec<Identity>,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        SpiffeServerVerifier {
            roots,
            expected,
            provider,
        }
    }

    fn expected_list(&self) -> String {
        self.expected
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(pki_error)?;
        cert.verify_for_usage(
            self.provider.signature_verification_algorithms.all,
            &self.roots.roots,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(pki_error)?;
        let actual = peer_identity(end_entity).map_err(other)?;
        if !self.expected.contains(&actual) {
            return Err(other(TlsError::UnexpectedIdentity {
                actual: actual.to_string(),
                expected: self.expected_list(),
            }));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Server-side: a client certificate chaining to the mesh roots and carrying exactly one SPIFFE
/// id is mandatory. Authorisation of that id is the caller's job (see `peer_identity_of`).
#[derive(Debug)]
pub struct SpiffeClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
}

impl SpiffeClientVerifier {
    pub fn new(roots: Arc<RootCertStore>, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let inner = WebPkiClientVerifier::builder_with_provider(roots, provider).build()?;
        Ok(SpiffeClientVerifier { inner })
    }
}

impl ClientCertVerifier for SpiffeClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        peer_identity(end_entity).map_err(other)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
