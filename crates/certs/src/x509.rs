//! The fields of an X.509 certificate the certificate manager and `/config_dump` show, read
//! with `x509-parser`. (Chain and SAN checks use `mesh_identity::tls`.)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use x509_parser::prelude::{FromDer, X509Certificate};

/// The fields of a certificate the certificate manager needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// The serial number in decimal, as upstream ztunnel's `/config_dump` shows it (istioctl
    /// converts it to hex for display).
    pub serial: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// Why a certificate's fields could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CertParseError {
    #[error("not an X.509 certificate: {0}")]
    NotX509(String),
    #[error("{0} bytes after the certificate")]
    TrailingBytes(usize),
}

/// Reads the serial number and validity of a DER certificate.
pub fn cert_info(der: &[u8]) -> Result<CertInfo, CertParseError> {
    let (rest, cert) =
        X509Certificate::from_der(der).map_err(|e| CertParseError::NotX509(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CertParseError::TrailingBytes(rest.len()));
    }
    let validity = cert.validity();
    Ok(CertInfo {
        serial: cert.tbs_certificate.serial.to_string(),
        not_before: from_unix(validity.not_before.timestamp()),
        not_after: from_unix(validity.not_after.timestamp()),
    })
}

fn from_unix(secs: i64) -> SystemTime {
    let magnitude = Duration::from_secs(secs.unsigned_abs());
    if secs >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` (whole seconds, UTC), as upstream ztunnel's `/config_dump`; years
/// before 1970 and after 9999 are written too (a certificate may carry them).
pub fn rfc3339(time: SystemTime) -> String {
    let t = time::OffsetDateTime::from(time);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(serial: &[u8], not_before: i64, self_signed: bool) -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(vec!["leaf.test".to_owned()]).expect("params");
        params.serial_number = Some(rcgen::SerialNumber::from_slice(serial));
        params.not_before = time::OffsetDateTime::from_unix_timestamp(not_before).expect("time");
        params.not_after =
            time::OffsetDateTime::from_unix_timestamp(not_before + 3661).expect("time");
        let key = rcgen::KeyPair::generate().expect("key");
        if self_signed {
            return params
                .self_signed(&key)
                .expect("self-signed")
                .der()
                .to_vec();
        }
        let mut ca = rcgen::CertificateParams::new(Vec::new()).expect("ca params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::OrganizationName, "root");
        let ca_key = rcgen::KeyPair::generate().expect("ca key");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        params
            .signed_by(&key, &issuer)
            .expect("signed")
            .der()
            .to_vec()
    }

    #[test]
    fn serial_validity_and_issuer_are_read() {
        let der = cert(&[0x01, 0x00], 951_782_400, false);
        let info = cert_info(&der).expect("info");
        assert_eq!(info.serial, "256");
        assert_eq!(rfc3339(info.not_before), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(info.not_after), "2000-02-29T01:01:01Z");
        let root = cert(&[0x7f; 16], 0, true);
        let info = cert_info(&root).expect("root");
        assert_eq!(info.serial, u128::from_be_bytes([0x7f; 16]).to_string());
        assert_eq!(rfc3339(info.not_before), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn malformed_certificates_say_what_is_wrong() {
        assert!(cert_info(&[0x30, 0x05, 0x30])
            .unwrap_err()
            .to_string()
            .contains("not an X.509"));
        let mut der = cert(&[1], 0, true);
        der.push(0);
        assert!(cert_info(&der)
            .unwrap_err()
            .to_string()
            .contains("1 bytes after"));
    }

    #[test]
    fn times_before_1970_are_kept() {
        assert_eq!(rfc3339(from_unix(0)), "1970-01-01T00:00:00Z");
        assert!(from_unix(-1) < UNIX_EPOCH);
        assert_eq!(rfc3339(from_unix(-1)), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(from_unix(-631_152_000)), "1950-01-01T00:00:00Z");
    }
}
