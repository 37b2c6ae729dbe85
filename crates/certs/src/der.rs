//! Just enough DER to read an X.509 certificate's serial number and validity, and to print
//! times as RFC 3339 for `/config_dump`. (Chain and SAN checks use `mesh_identity::tls`.)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The fields of a certificate the certificate manager needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// The serial number in decimal, as upstream ztunnel's `/config_dump` shows it (istioctl
    /// converts it to hex for display).
    pub serial: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// Reads the serial number and validity of a DER certificate; `Err` says what was malformed.
pub fn cert_info(der: &[u8]) -> Result<CertInfo, &'static str> {
    let (cert, _) = expect(der, SEQUENCE, "certificate")?;
    let (tbs, _) = expect(cert, SEQUENCE, "tbsCertificate")?;
    let mut rest = tbs;
    if rest.first() == Some(&VERSION) {
        rest = tlv(rest)?.2;
    }
    let (serial, rest) = expect(rest, INTEGER, "serialNumber")?;
    let (_signature, rest) = expect(rest, SEQUENCE, "signature algorithm")?;
    let (_issuer, rest) = expect(rest, SEQUENCE, "issuer")?;
    let (validity, _) = expect(rest, SEQUENCE, "validity")?;
    let (tag, not_before, rest) = tlv(validity)?;
    let not_before = parse_time(tag, not_before)?;
    let (tag, not_after, _) = tlv(rest)?;
    let not_after = parse_time(tag, not_after)?;
    Ok(CertInfo {
        serial: decimal(serial),
        not_before,
        not_after,
    })
}

/// One tag-length-value: (tag, content, rest).
fn tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), &'static str> {
    let (&tag, rest) = input.split_first().ok_or("truncated tag")?;
    let (&first, rest) = rest.split_first().ok_or("truncated length")?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err("bad length");
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err("truncated value");
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

fn expect<'a>(
    input: &'a [u8],
    want: u8,
    what: &'static str,
) -> Result<(&'a [u8], &'a [u8]), &'static str> {
    let (tag, content, rest) = tlv(input)?;
    if tag != want {
        return Err(what);
    }
    Ok((content, rest))
}

/// A big-endian unsigned integer (an X.509 serial: up to 20 bytes) in decimal.
fn decimal(bytes: &[u8]) -> String {
    // Repeated division by 10 of the base-256 digits; serials are short, so O(n^2) is fine.
    let mut digits: Vec<u8> = bytes.iter().copied().skip_while(|b| *b == 0).collect();
    let mut out = Vec::new();
    while !digits.is_empty() {
        let mut remainder = 0u32;
        for d in digits.iter_mut() {
            let acc = remainder * 256 + u32::from(*d);
            *d = (acc / 10) as u8;
            remainder = acc % 10;
        }
        out.push(b'0' + remainder as u8);
        let lead = digits.iter().position(|b| *b != 0).unwrap_or(digits.len());
        digits.drain(..lead);
    }
    if out.is_empty() {
        return "0".to_string();
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

fn digits(s: &[u8]) -> Result<i64, &'static str> {
    s.iter().try_fold(0i64, |acc, b| {
        if b.is_ascii_digit() {
            Ok(acc * 10 + i64::from(b - b'0'))
        } else {
            Err("time is not digits")
        }
    })
}

/// UTCTime `YYMMDDHHMMSSZ` (years 1950-2049) or GeneralizedTime `YYYYMMDDHHMMSSZ`.
fn parse_time(tag: u8, value: &[u8]) -> Result<SystemTime, &'static str> {
    let (year, rest) = match (tag, value.len()) {
        (UTC_TIME, 13) => {
            let yy = digits(&value[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &value[2..])
        }
        (GENERALIZED_TIME, 15) => (digits(&value[..4])?, &value[4..]),
        _ => return Err("unsupported time encoding"),
    };
    if rest.last() != Some(&b'Z') {
        return Err("time is not UTC");
    }
    let field = |i: usize| digits(&rest[i..i + 2]);
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return Err("time out of range");
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second;
    Ok(from_unix(secs))
}

fn from_unix(secs: i64) -> SystemTime {
    match u64::try_from(secs) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()),
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (eras of 400 years).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let shifted_month = (month + 9) % 12; // March = 0
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `YYYY-MM-DDTHH:MM:SSZ` (whole seconds, UTC).
pub fn rfc3339(time: SystemTime) -> String {
    let secs = match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX / 2),
    };
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_in_decimal() {
        assert_eq!(decimal(&[]), "0");
        assert_eq!(decimal(&[0, 0]), "0");
        assert_eq!(decimal(&[0x01, 0x00]), "256");
        assert_eq!(decimal(&[0xff; 8]), u64::MAX.to_string());
        let mut big = [0xffu8; 16];
        big[0] = 0x7f;
        assert_eq!(decimal(&big), i128::MAX.to_string());
    }

    #[test]
    fn dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        for days in [-1000, 0, 59, 11_016, 11_017, 20_000, 50_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661)),
            "2000-02-29T01:01:01Z"
        );
    }

    #[test]
    fn parses_both_time_encodings() {
        let utc = parse_time(UTC_TIME, b"491231235959Z").expect("utc");
        assert_eq!(rfc3339(utc), "2049-12-31T23:59:59Z");
        let old = parse_time(UTC_TIME, b"500101000000Z").expect("1950");
        assert_eq!(rfc3339(old), "1950-01-01T00:00:00Z");
        let gen = parse_time(GENERALIZED_TIME, b"20500101000000Z").expect("generalized");
        assert_eq!(rfc3339(gen), "2050-01-01T00:00:00Z");
        assert!(parse_time(UTC_TIME, b"491231235959+").is_err());
        assert!(parse_time(UTC_TIME, b"4912312359Z").is_err());
        assert!(cert_info(&[0x30, 0x05, 0x30]).is_err());
        assert_eq!(decimal(&[0, 0x7f, 0x01]), "32513");
    }
}
