//! Loading CA material: a plugged-in `cacerts` directory, or a self-signed root persisted in a
//! state directory (generated on first start).

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
    PublicKeyData,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;

use super::{random_serial, CaError, CaOptions, BACKDATE};

/// The signing CA certificate (plugged-in or self-signed).
pub const CA_CERT_FILE: &str = "ca-cert.pem";
/// The signing CA private key (unencrypted PKCS#8).
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The mesh root certificate (plugged-in CA only).
pub const ROOT_CERT_FILE: &str = "root-cert.pem";
/// The chain from `ca-cert.pem` up to the root (plugged-in CA only).
pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";

const BEGIN_CERT: &str = "-----BEGIN CERTIFICATE-----";
const END_CERT: &str = "-----END CERTIFICATE-----";

/// What a CA needs to sign.
pub(crate) struct Material {
    pub key: KeyPair,
    pub ca_cert_pem: String,
    pub intermediates_pem: Vec<String>,
    pub root_pem: String,
    pub ca_not_after: OffsetDateTime,
}

/// One PEM certificate block: its text and DER.
#[derive(Clone)]
struct PemCert {
    pem: String,
    der: CertificateDer<'static>,
}

pub(crate) fn plugged_in(dir: &Path) -> Result<Material, CaError> {
    let ca_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    let root_path = dir.join(ROOT_CERT_FILE);
    let chain_path = dir.join(CERT_CHAIN_FILE);

    let ca = first_cert(&ca_path)?;
    let key = read_key(&key_path)?;
    let ca_not_after = check_signing_cert(&ca, &ca_path, &key, &key_path)?;
    // During a root rotation root-cert.pem holds the old and the new root: workloads must trust
    // both, and the chain may end at either.
    let roots = read_certs(&root_path)?;
    if roots.is_empty() {
        return Err(CaError::BadPem {
            path: root_path,
            what: "certificate",
        });
    }

    let mut intermediates = if chain_path.exists() {
        read_certs(&chain_path)?
    } else {
        Vec::new()
    };
    intermediates.retain(|c| roots.iter().all(|r| r.der != c.der));
    let ca_is_root = roots.iter().any(|r| r.der == ca.der);
    if !ca_is_root && intermediates.first().map(|c| &c.der) != Some(&ca.der) {
        intermediates.insert(0, ca.clone());
    }
    verify_chain_to_any(&intermediates, &roots)?;
    Ok(Material {
        key,
        ca_cert_pem: ca.pem,
        intermediates_pem: intermediates.into_iter().map(|c| c.pem).collect(),
        root_pem: roots.into_iter().map(|r| r.pem).collect(),
        ca_not_after,
    })
}

pub(crate) fn self_signed(dir: &Path, options: &CaOptions) -> Result<Material, CaError> {
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {
            let ca = first_cert(&cert_path)?;
            let key = read_key(&key_path)?;
            let ca_not_after = check_signing_cert(&ca, &cert_path, &key, &key_path)?;
            tracing::info!(dir = %dir.display(), "reloaded self-signed root CA");
            Ok(Material {
                key,
                ca_cert_pem: ca.pem.clone(),
                intermediates_pem: Vec::new(),
                root_pem: ca.pem,
                ca_not_after,
            })
        }
        (false, false) => generate_root(dir, options),
        (true, false) => Err(CaError::PartialState {
            dir: dir.into(),
            present: CA_CERT_FILE,
            missing: CA_KEY_FILE,
        }),
        (false, true) => Err(CaError::PartialState {
            dir: dir.into(),
            present: CA_KEY_FILE,
            missing: CA_CERT_FILE,
        }),
    }
}

fn generate_root(dir: &Path, options: &CaOptions) -> Result<Material, CaError> {
    let build = |source| CaError::Build {
        what: "self-signed root",
        source,
    };
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(build)?;
    let now = OffsetDateTime::now_utc();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, options.trust_domain.as_str());
    params.distinguished_name = dn;
    params.not_before = now - BACKDATE;
    params.not_after = now + options.root_ttl;
    params.serial_number = Some(random_serial());
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).map_err(build)?;
    let cert_pem = cert.pem();

    std::fs::create_dir_all(dir).map_err(|source| io_err(dir, source))?;
    write_file(
        &dir.join(CA_KEY_FILE),
        key.serialize_pem().as_bytes(),
        0o600,
    )?;
    write_file(&dir.join(CA_CERT_FILE), cert_pem.as_bytes(), 0o644)?;
    tracing::info!(dir = %dir.display(), trust_domain = %options.trust_domain, "generated self-signed root CA");
    Ok(Material {
        key,
        ca_cert_pem: cert_pem.clone(),
        intermediates_pem: Vec::new(),
        root_pem: cert_pem,
        ca_not_after: params.not_after,
    })
}

/// Writes through a temporary file and renames, so a crash never leaves half a key.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), CaError> {
    let tmp = path.with_extension("pem.tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = opts.open(&tmp).map_err(|source| io_err(&tmp, source))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|source| io_err(&tmp, source))?;
    std::fs::rename(&tmp, path).map_err(|source| io_err(path, source))
}

fn io_err(path: &Path, source: std::io::Error) -> CaError {
    CaError::Io {
        path: path.into(),
        source,
    }
}

fn read_text(path: &Path) -> Result<String, CaError> {
    std::fs::read_to_string(path).map_err(|source| io_err(path, source))
}

fn read_key(path: &Path) -> Result<KeyPair, CaError> {
    let text = read_text(path)?;
    KeyPair::from_pem(&text).map_err(|e| CaError::BadCaKey {
        path: path.into(),
        detail: e.to_string(),
    })
}

fn first_cert(path: &Path) -> Result<PemCert, CaError> {
    read_certs(path)?
        .into_iter()
        .next()
        .ok_or_else(|| CaError::BadPem {
            path: path.into(),
            what: "certificate",
        })
}

/// Every certificate block of a PEM file, in order.
fn read_certs(path: &Path) -> Result<Vec<PemCert>, CaError> {
    let text = read_text(path)?;
    let mut certs = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find(BEGIN_CERT) {
        let after = &rest[start..];
        let Some(end) = after.find(END_CERT) else {
            return Err(CaError::BadPem {
                path: path.into(),
                what: "certificate (missing END line)",
            });
        };
        let block = &after[..end + END_CERT.len()];
        let der =
            CertificateDer::from_pem_slice(block.as_bytes()).map_err(|e| CaError::BadCaCert {
                path: path.into(),
                detail: e.to_string(),
            })?;
        certs.push(PemCert {
            pem: format!("{block}\n"),
            der,
        });
        rest = &after[end + END_CERT.len()..];
    }
    Ok(certs)
}

fn parse<'a>(cert: &'a PemCert, path: &Path) -> Result<X509Certificate<'a>, CaError> {
    x509_parser::parse_x509_certificate(cert.der.as_ref())
        .map(|(_, c)| c)
        .map_err(|e| CaError::BadCaCert {
            path: path.into(),
            detail: e.to_string(),
        })
}

/// The signing certificate must be a CA whose public key is `key`'s. Returns its expiry.
fn check_signing_cert(
    cert: &PemCert,
    cert_path: &Path,
    key: &KeyPair,
    key_path: &Path,
) -> Result<OffsetDateTime, CaError> {
    let x509 = parse(cert, cert_path)?;
    if x509.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(CaError::KeyMismatch {
            cert: cert_path.into(),
            key: key_path.into(),
        });
    }
    if !x509.is_ca() {
        return Err(CaError::NotCa {
            path: cert_path.into(),
        });
    }
    let not_after = x509.validity().not_after.to_datetime();
    if not_after <= OffsetDateTime::now_utc() {
        tracing::warn!(path = %cert_path.display(), %not_after, "CA certificate has expired; issued certificates will not validate");
    }
    Ok(not_after)
}

/// The chain must end at one of `roots` (the first error is reported when it ends at none).
fn verify_chain_to_any(chain: &[PemCert], roots: &[PemCert]) -> Result<(), CaError> {
    let mut first_error = None;
    for root in roots {
        match verify_chain(chain, root) {
            Ok(()) => return Ok(()),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Each certificate must be signed by the next; the last by the root.
fn verify_chain(chain: &[PemCert], root: &PemCert) -> Result<(), CaError> {
    let path = PathBuf::from(CERT_CHAIN_FILE);
    let mut all: Vec<X509Certificate<'_>> = Vec::with_capacity(chain.len() + 1);
    for cert in chain {
        all.push(parse(cert, &path)?);
    }
    all.push(parse(root, Path::new(ROOT_CERT_FILE))?);
    for pair in all.windows(2) {
        let (child, parent) = (&pair[0], &pair[1]);
        child
            .verify_signature(Some(parent.public_key()))
            .map_err(|e| CaError::ChainBroken {
                detail: format!(
                    "\"{}\" is not signed by \"{}\" ({e})",
                    child.subject(),
                    parent.subject()
                ),
            })?;
    }
    Ok(())
}
