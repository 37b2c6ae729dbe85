//! Checks a certificate signing request before the CA signs it: PEM framing, DER structure, key
//! type and size, self-signature, and the URI SANs it asks for.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateSigningRequestDer;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_DSA, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384,
    OID_PKCS1_RSAENCRYPTION, OID_SIG_ED25519, OID_SIG_ED448,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::CaError;
use crate::Identity;

/// The smallest RSA modulus we sign for.
pub const MIN_RSA_BITS: usize = 2048;

/// A CSR that passed every check: its public key (SubjectPublicKeyInfo DER) may be certified.
#[derive(Debug)]
pub(crate) struct CheckedCsr {
    pub spki_der: Vec<u8>,
    pub key_type: String,
}

/// Parses and checks `csr_pem` for `identity`.
pub(crate) fn check_csr(csr_pem: &str, identity: &Identity) -> Result<CheckedCsr, CaError> {
    let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes()).map_err(|e| {
        CaError::CsrNotPem {
            detail: e.to_string(),
        }
    })?;
    let (rest, csr) =
        X509CertificationRequest::from_der(der.as_ref()).map_err(|e| CaError::CsrMalformed {
            detail: e.to_string(),
        })?;
    if !rest.is_empty() {
        return Err(CaError::CsrMalformed {
            detail: format!("{} trailing bytes after the request", rest.len()),
        });
    }
    let spki = &csr.certification_request_info.subject_pki;
    let key_type = accepted_key_type(spki)?;
    csr.verify_signature()
        .map_err(|e| CaError::CsrBadSignature {
            detail: e.to_string(),
        })?;
    check_uri_sans(&csr, identity)?;
    Ok(CheckedCsr {
        spki_der: spki.raw.to_vec(),
        key_type,
    })
}

/// Names the key type, or refuses keys we do not certify.
fn accepted_key_type(spki: &SubjectPublicKeyInfo<'_>) -> Result<String, CaError> {
    let alg = &spki.algorithm.algorithm;
    if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        return match curve {
            Some(c) if c == OID_EC_P256 => Ok("ECDSA P-256".to_string()),
            Some(c) if c == OID_NIST_EC_P384 => Ok("ECDSA P-384".to_string()),
            Some(c) => Err(unsupported(format!("ECDSA on curve {c}"))),
            None => Err(unsupported("ECDSA without a named curve".to_string())),
        };
    }
    if *alg == OID_PKCS1_RSAENCRYPTION {
        let bits = match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => modulus_bits(rsa.modulus),
            _ => 0,
        };
        if bits < MIN_RSA_BITS {
            return Err(unsupported(format!("RSA {bits}-bit")));
        }
        return Ok(format!("RSA {bits}-bit"));
    }
    let name = if *alg == OID_SIG_ED25519 {
        "Ed25519".to_string()
    } else if *alg == OID_SIG_ED448 {
        "Ed448".to_string()
    } else if *alg == OID_KEY_TYPE_DSA {
        "DSA".to_string()
    } else {
        format!("key algorithm {alg}")
    };
    Err(unsupported(name))
}

fn unsupported(key_type: String) -> CaError {
    CaError::UnsupportedKey { key_type }
}

/// Bit length of a big-endian unsigned integer (leading zero bytes ignored).
fn modulus_bits(modulus: &[u8]) -> usize {
    let trimmed: Vec<u8> = modulus.iter().copied().skip_while(|b| *b == 0).collect();
    match trimmed.first() {
        Some(first) => (trimmed.len() - 1) * 8 + (8 - first.leading_zeros() as usize),
        None => 0,
    }
}

/// Every URI SAN the CSR asks for must be the authorised identity.
fn check_uri_sans(csr: &X509CertificationRequest<'_>, identity: &Identity) -> Result<(), CaError> {
    let Some(extensions) = csr.requested_extensions() else {
        return Ok(());
    };
    for ext in extensions {
        let ParsedExtension::SubjectAlternativeName(san) = ext else {
            continue;
        };
        for name in &san.general_names {
            let GeneralName::URI(uri) = name else {
                continue;
            };
            let same = Identity::parse(uri).is_ok_and(|requested| requested == *identity);
            if !same {
                return Err(CaError::ForeignIdentity {
                    requested: (*uri).to_string(),
                    authorized: identity.to_string(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::modulus_bits;

    #[test]
    fn counts_modulus_bits() {
        assert_eq!(modulus_bits(&[0x00, 0x80, 0x00]), 16);
        assert_eq!(modulus_bits(&[0x01, 0xff]), 9);
        assert_eq!(modulus_bits(&[0x00]), 0);
        let mut m = vec![0u8; 257];
        m[1] = 0xc1;
        assert_eq!(modulus_bits(&m), 2048);
    }
}
