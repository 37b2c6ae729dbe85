//! Client side of certificate issuance: a fresh ECDSA P-256 key and a CSR carrying the
//! identity's SPIFFE URI SAN, as ztunnel sends to the CA.

use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType};

use crate::Identity;

/// Errors generating a CSR.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error(
        "cannot generate an ECDSA P-256 key: {0}; is the system random number generator available?"
    )]
    KeyGeneration(#[source] rcgen::Error),
    #[error("cannot encode a CSR for {identity}: {source}")]
    Encode {
        identity: String,
        #[source]
        source: rcgen::Error,
    },
}

impl CsrError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CsrError::KeyGeneration(_) => "key_generation",
            CsrError::Encode { .. } => "encode",
        }
    }
}

/// A PEM CSR and the PEM (PKCS#8) private key it was signed with.
#[derive(Clone)]
pub struct CsrAndKey {
    /// `-----BEGIN CERTIFICATE REQUEST-----`
    pub csr_pem: String,
    /// `-----BEGIN PRIVATE KEY-----` (PKCS#8); never log it.
    pub key_pem: String,
}

impl std::fmt::Debug for CsrAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsrAndKey")
            .field("csr_pem", &self.csr_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Generates an ECDSA P-256 key and a CSR for `identity` (URI SAN only, empty subject).
pub fn generate_csr(identity: &Identity) -> Result<CsrAndKey, CsrError> {
    let key =
        KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(CsrError::KeyGeneration)?;
    let encode = |source| CsrError::Encode {
        identity: identity.to_string(),
        source,
    };
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(
        identity.to_string().try_into().map_err(encode)?,
    )];
    let csr = params.serialize_request(&key).map_err(encode)?;
    Ok(CsrAndKey {
        csr_pem: csr.pem().map_err(encode)?,
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer;

    #[test]
    fn csr_carries_the_identity_and_a_p256_key() {
        let id = Identity::parse("spiffe://cluster.local/ns/default/sa/app").expect("id");
        let out = generate_csr(&id).expect("csr");
        assert!(out
            .csr_pem
            .starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        assert!(out.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(!format!("{out:?}").contains("PRIVATE KEY"));
        let params = rcgen::CertificateSigningRequestParams::from_pem(&out.csr_pem)
            .expect("parse and verify");
        assert_eq!(
            params.params.subject_alt_names,
            vec![SanType::URI(id.to_string().try_into().expect("ia5"))]
        );
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(out.csr_pem.as_bytes())
            .map(|d: rustls_pki_types::CertificateSigningRequestDer<'_>| d.as_ref().to_vec())
            .expect("pem");
        let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(&der)
            .expect("der");
        assert_eq!(
            csr.certification_request_info
                .subject_pki
                .algorithm
                .algorithm,
            x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
        );
    }
}
