//! mesh-identity: SPIFFE identities, the mesh certificate authority, client CSRs and rustls
//! builders that authenticate peers by SPIFFE id.

pub mod ca;
pub mod csr;
mod identity;
pub mod tls;

pub use ca::{CaError, CaOptions, CaSource, CertificateAuthority, ServingCert};
pub use csr::{generate_csr, CsrAndKey, CsrError};
pub use identity::{Identity, IdentityError, SPIFFE_PREFIX};
pub use tls::{CertKey, ClientAuth, TlsError};
