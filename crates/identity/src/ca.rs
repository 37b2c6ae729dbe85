//! The mesh certificate authority: signs workload CSRs with SPIFFE URI SANs.
//!
//! Two sources of signing material, like Istio:
//! - a plugged-in CA directory (`cacerts`): `ca-cert.pem`, `ca-key.pem`, `root-cert.pem` and
//!   `cert-chain.pem`, where `ca-cert.pem` is usually an intermediate;
//! - otherwise a self-signed ECDSA P-256 root generated on first start and persisted in a state
//!   directory, so that issued identities stay valid across restarts.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber, SubjectPublicKeyInfo,
};
use time::OffsetDateTime;

use crate::Identity;

mod csr_check;
mod load;

pub use csr_check::MIN_RSA_BITS;
pub use load::{write_file, CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE};

/// Default and maximum workload certificate lifetime (Istio's `SECRET_TTL` / max TTL).
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Lifetime of a generated self-signed root (Istio: 10 years).
pub const DEFAULT_ROOT_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Certificates start this long in the past to tolerate clock skew.
pub const BACKDATE: Duration = Duration::from_secs(60);

/// Errors of the certificate authority.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read or write {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM {what}; check that the file is the right one and not empty")]
    BadPem { path: PathBuf, what: &'static str },
    #[error("cannot use the CA key in {path}: {detail}; keys must be unencrypted PKCS#8 (convert with `openssl pkcs8 -topk8 -nocrypt -in {path} -out {path}.pk8`)")]
    BadCaKey { path: PathBuf, detail: String },
    #[error("cannot parse the certificate in {path}: {detail}")]
    BadCaCert { path: PathBuf, detail: String },
    #[error(
        "the key in {key} does not belong to the certificate in {cert}; plug in the matching pair"
    )]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error(
        "{path} is not a CA certificate (basicConstraints CA:TRUE missing); plug in a signing CA"
    )]
    NotCa { path: PathBuf },
    #[error("the CA chain is broken: {detail}; cert-chain.pem must run from ca-cert.pem up to root-cert.pem")]
    ChainBroken { detail: String },
    #[error("self-signed CA state in {dir} is incomplete: {present} exists but {missing} does not; restore {missing} or remove {present} to generate a new root (certificates issued by the old root then stop validating)")]
    PartialState {
        dir: PathBuf,
        present: &'static str,
        missing: &'static str,
    },
    #[error("cannot build the {what} certificate: {source}")]
    Build {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("the CSR is not PEM ('-----BEGIN CERTIFICATE REQUEST-----'): {detail}")]
    CsrNotPem { detail: String },
    #[error("the CSR is not a valid PKCS#10 request: {detail}")]
    CsrMalformed { detail: String },
    #[error(
        "the CSR signature does not verify ({detail}); sign the request with the key it carries"
    )]
    CsrBadSignature { detail: String },
    #[error("unsupported key type {key_type} in the CSR; use ECDSA P-256 (preferred), ECDSA P-384 or RSA of at least 2048 bits")]
    UnsupportedKey { key_type: String },
    #[error("the CSR asks for identity {requested} but the caller is authorised for {authorized}")]
    ForeignIdentity {
        requested: String,
        authorized: String,
    },
    #[error("identity {identity} is outside this CA's trust domain {trust_domain}")]
    WrongTrustDomain {
        identity: String,
        trust_domain: String,
    },
}

impl CaError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CaError::Io { .. } => "io",
            CaError::BadPem { .. } => "bad_pem",
            CaError::BadCaKey { .. } => "bad_ca_key",
            CaError::BadCaCert { .. } => "bad_ca_cert",
            CaError::KeyMismatch { .. } => "key_mismatch",
            CaError::NotCa { .. } => "not_ca",
            CaError::ChainBroken { .. } => "chain_broken",
            CaError::PartialState { .. } => "partial_state",
            CaError::Build { .. } => "build",
            CaError::CsrNotPem { .. } => "csr_not_pem",
            CaError::CsrMalformed { .. } => "csr_malformed",
            CaError::CsrBadSignature { .. } => "csr_bad_signature",
            CaError::UnsupportedKey { .. } => "unsupported_key",
            CaError::ForeignIdentity { .. } => "foreign_identity",
            CaError::WrongTrustDomain { .. } => "wrong_trust_domain",
        }
    }

    /// True when the request itself is bad (the client must change its CSR).
    pub fn is_bad_request(&self) -> bool {
        matches!(
            self,
            CaError::CsrNotPem { .. }
                | CaError::CsrMalformed { .. }
                | CaError::CsrBadSignature { .. }
                | CaError::UnsupportedKey { .. }
        )
    }

    /// True when the caller asked for an identity it may not have.
    pub fn is_permission_denied(&self) -> bool {
        matches!(
            self,
            CaError::ForeignIdentity { .. } | CaError::WrongTrustDomain { .. }
        )
    }
}

/// CA settings.
#[derive(Clone, Debug)]
pub struct CaOptions {
    /// Trust domain of issued identities (and Organization of a generated root).
    pub trust_domain: String,
    /// Upper bound on workload certificate lifetime.
    pub max_ttl: Duration,
    /// Lifetime of a generated self-signed root.
    pub root_ttl: Duration,
}

impl Default for CaOptions {
    fn default() -> Self {
        CaOptions {
            trust_domain: "cluster.local".to_string(),
            max_ttl: DEFAULT_MAX_TTL,
            root_ttl: DEFAULT_ROOT_TTL,
        }
    }
}

/// Where the signing material came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaSource {
    /// A plugged-in `cacerts` directory.
    PluggedIn { dir: PathBuf },
    /// A self-signed root persisted in a state directory.
    SelfSigned { dir: PathBuf },
}

/// A certificate and key for istiod's own TLS listener.
#[derive(Clone, Debug)]
pub struct ServingCert {
    /// PEM certificates, leaf first, root last.
    pub chain_pem: Vec<String>,
    /// PKCS#8 PEM private key.
    pub key_pem: String,
    /// When the leaf expires (renew at half-life).
    pub not_after: SystemTime,
}

/// The signing CA.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    /// Certificates between a leaf and the root, issuing CA first (empty for a self-signed root).
    intermediates_pem: Vec<String>,
    /// The roots workloads trust (more than one while a root is being rotated).
    root_pem: String,
    issuer_not_after: OffsetDateTime,
    options: CaOptions,
    source: CaSource,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("source", &self.source)
            .field("trust_domain", &self.options.trust_domain)
            .field("max_ttl", &self.options.max_ttl)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Uses the plugged-in CA in `cacerts_dir` when it holds `ca-key.pem`, else the self-signed
    /// root in `state_dir` (created on first start).
    pub fn load(
        cacerts_dir: Option<&Path>,
        state_dir: &Path,
        options: CaOptions,
    ) -> Result<Self, CaError> {
        match cacerts_dir {
            Some(dir) if dir.join(CA_KEY_FILE).exists() => Self::plugged_in(dir, options),
            _ => Self::self_signed(state_dir, options),
        }
    }

    /// Loads a plugged-in CA directory (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`,
    /// optional `cert-chain.pem`).
    pub fn plugged_in(dir: &Path, options: CaOptions) -> Result<Self, CaError> {
        let material = load::plugged_in(dir)?;
        Self::from_material(material, options, CaSource::PluggedIn { dir: dir.into() })
    }

    /// Loads the self-signed root from `state_dir`, generating and persisting it (key 0600) if
    /// the directory holds none.
    pub fn self_signed(state_dir: &Path, options: CaOptions) -> Result<Self, CaError> {
        let material = load::self_signed(state_dir, &options)?;
        Self::from_material(
            material,
            options,
            CaSource::SelfSigned {
                dir: state_dir.into(),
            },
        )
    }

    fn from_material(
        m: load::Material,
        options: CaOptions,
        source: CaSource,
    ) -> Result<Self, CaError> {
        let issuer =
            Issuer::from_ca_cert_pem(&m.ca_cert_pem, m.key).map_err(|source| CaError::Build {
                what: "issuer",
                source,
            })?;
        tracing::info!(?source, trust_domain = %options.trust_domain, "certificate authority ready");
        Ok(CertificateAuthority {
            issuer,
            intermediates_pem: m.intermediates_pem,
            root_pem: m.root_pem,
            issuer_not_after: m.ca_not_after,
            options,
            source,
        })
    }

    /// The trust domain this CA issues for.
    pub fn trust_domain(&self) -> &str {
        &self.options.trust_domain
    }

    /// The maximum workload certificate lifetime.
    pub fn max_ttl(&self) -> Duration {
        self.options.max_ttl
    }

    /// Where the signing material came from.
    pub fn source(&self) -> &CaSource {
        &self.source
    }

    /// The root certificates (PEM) that workloads must trust: `root-cert.pem` of a plugged-in CA,
    /// which holds the old and the new root while a root is rotated.
    pub fn root_cert_pem(&self) -> &str {
        &self.root_pem
    }

    /// Writes the root certificate to `path` (e.g. for ztunnel's `root-cert.pem` in local mode).
    pub fn write_root_cert(&self, path: &Path) -> Result<(), CaError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| CaError::Io {
                path: parent.into(),
                source,
            })?;
        }
        std::fs::write(path, &self.root_pem).map_err(|source| CaError::Io {
            path: path.into(),
            source,
        })
    }

    /// Signs `csr_pem` for `identity`. `requested_ttl` of `None` (or zero) means the maximum.
    /// Returns PEM certificates: leaf first, root last.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        identity: &Identity,
        requested_ttl: Option<Duration>,
    ) -> Result<Vec<String>, CaError> {
        if identity.trust_domain() != self.options.trust_domain {
            return Err(CaError::WrongTrustDomain {
                identity: identity.to_string(),
                trust_domain: self.options.trust_domain.clone(),
            });
        }
        let checked = csr_check::check_csr(csr_pem, identity)?;
        let public_key = SubjectPublicKeyInfo::from_der(&checked.spki_der).map_err(|_| {
            CaError::UnsupportedKey {
                key_type: checked.key_type.clone(),
            }
        })?;
        let ttl = self.effective_ttl(requested_ttl);
        let mut params = self.leaf_params(ttl);
        let uri = identity
            .to_string()
            .try_into()
            .map_err(|source| CaError::Build {
                what: "workload",
                source,
            })?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        let leaf = params
            .signed_by(&public_key, &self.issuer)
            .map_err(|source| CaError::Build {
                what: "workload",
                source,
            })?;
        tracing::debug!(%identity, key_type = %checked.key_type, ttl_s = ttl.as_secs(), "signed workload certificate");
        Ok(self.chain_with(leaf.pem()))
    }

    /// Issues a certificate for istiod's own TLS (DNS and IP SANs), with a fresh P-256 key.
    pub fn serving_cert(&self, dns_names: &[&str], ips: &[IpAddr]) -> Result<ServingCert, CaError> {
        let build = |source| CaError::Build {
            what: "serving",
            source,
        };
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(build)?;
        let ttl = self.options.max_ttl;
        let mut params = self.leaf_params(ttl);
        if let Some(first) = dns_names.first() {
            params.distinguished_name.push(DnType::CommonName, *first);
        }
        for name in dns_names {
            let dns = (*name).to_string().try_into().map_err(build)?;
            params.subject_alt_names.push(SanType::DnsName(dns));
        }
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        let not_after = SystemTime::from(params.not_after);
        let cert = params.signed_by(&key, &self.issuer).map_err(build)?;
        Ok(ServingCert {
            chain_pem: self.chain_with(cert.pem()),
            key_pem: key.serialize_pem(),
            not_after,
        })
    }

    fn effective_ttl(&self, requested: Option<Duration>) -> Duration {
        match requested {
            Some(ttl) if !ttl.is_zero() => ttl.min(self.options.max_ttl),
            _ => self.options.max_ttl,
        }
    }

    /// Leaf parameters shared by workload and serving certificates.
    fn leaf_params(&self, ttl: Duration) -> CertificateParams {
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.not_before = now - BACKDATE;
        params.not_after = (now + ttl).min(self.issuer_not_after);
        params.serial_number = Some(random_serial());
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params
    }

    fn chain_with(&self, leaf_pem: String) -> Vec<String> {
        let mut chain = Vec::with_capacity(self.intermediates_pem.len() + 2);
        chain.push(leaf_pem);
        chain.extend(self.intermediates_pem.iter().cloned());
        chain.push(self.root_pem.clone());
        chain
    }
}

/// A random positive 128-bit serial number.
pub(crate) fn random_serial() -> SerialNumber {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        // The OS RNG failing is not recoverable in a meaningful way; fall back to time-derived
        // bytes so issuance continues (serial uniqueness is all that is required here).
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = nanos.to_be_bytes();
    }
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests;
