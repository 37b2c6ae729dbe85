//! gRPC status: the code and message a call ended with, read from `grpc-status` /
//! `grpc-message`, or derived from what went wrong below gRPC (HTTP status, HTTP/2 errors).

/// The gRPC status codes (numbered as on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    /// The code of a `grpc-status` value; anything but a known number is `Unknown`.
    pub fn from_wire(value: &[u8]) -> Code {
        const CODES: [Code; 17] = [
            Code::Ok,
            Code::Cancelled,
            Code::Unknown,
            Code::InvalidArgument,
            Code::DeadlineExceeded,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::DataLoss,
            Code::Unauthenticated,
        ];
        std::str::from_utf8(value)
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .and_then(|n| CODES.get(n).copied())
            .unwrap_or(Code::Unknown)
    }
}

/// How a call ended when it did not end well.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct Status {
    code: Code,
    message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
        }
    }

    pub fn code(&self) -> Code {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The status in a trailers block (or the headers of a trailers-only answer): `None` when
    /// there is no `grpc-status` at all. `grpc-message` is percent-decoded, as the protocol
    /// encodes it.
    pub fn from_fields(fields: &http::HeaderMap) -> Option<Status> {
        let code = Code::from_wire(fields.get("grpc-status")?.as_bytes());
        let message = fields
            .get("grpc-message")
            .map(|v| percent_decode(v.as_bytes()))
            .unwrap_or_default();
        Some(Status { code, message })
    }

    /// A response that is not gRPC's `200`: the code the gRPC protocol maps its HTTP status to.
    pub fn from_http(status: http::StatusCode) -> Status {
        let code = match status.as_u16() {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        };
        Status::new(code, format!("the server answered HTTP {status}, not gRPC"))
    }

    /// An HTTP/2 failure: a stream the server reset maps as the gRPC protocol says; the rest
    /// (the connection went away, broke or could not be used) is `Unavailable`.
    pub fn from_h2(error: &h2::Error) -> Status {
        let code = match error.reason() {
            _ if !error.is_reset() => Code::Unavailable,
            Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
            Some(h2::Reason::CANCEL) => Code::Cancelled,
            Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
            Some(h2::Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
            _ => Code::Internal,
        };
        Status::new(code, format!("HTTP/2: {error}"))
    }
}

/// `grpc-message` is percent-encoded (`%XX` for bytes outside printable ASCII and for `%`);
/// a malformed escape is kept as it is.
fn percent_decode(raw: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_read_from_the_wire() {
        assert_eq!(Code::from_wire(b"0"), Code::Ok);
        assert_eq!(Code::from_wire(b"16"), Code::Unauthenticated);
        assert_eq!(Code::from_wire(b"17"), Code::Unknown);
        assert_eq!(Code::from_wire(b"-1"), Code::Unknown);
        assert_eq!(Code::from_wire(b"x"), Code::Unknown);
    }

    #[test]
    fn messages_are_percent_decoded_and_bad_escapes_kept() {
        assert_eq!(percent_decode(b"no %E2%9C%93 here"), "no \u{2713} here");
        assert_eq!(percent_decode(b"100%25"), "100%");
        assert_eq!(percent_decode(b"50% off %zz %4"), "50% off %zz %4");
        assert_eq!(percent_decode(b"%"), "%");
    }

    #[test]
    fn trailers_and_http_statuses_map_to_codes() {
        let mut fields = http::HeaderMap::new();
        assert_eq!(Status::from_fields(&fields), None);
        fields.insert("grpc-status", http::HeaderValue::from_static("7"));
        fields.insert("grpc-message", http::HeaderValue::from_static("denied%21"));
        let status = Status::from_fields(&fields).expect("status");
        assert_eq!(status.code(), Code::PermissionDenied);
        assert_eq!(status.message(), "denied!");
        assert_eq!(
            Status::from_http(http::StatusCode::SERVICE_UNAVAILABLE).code(),
            Code::Unavailable
        );
        assert_eq!(
            Status::from_http(http::StatusCode::NOT_FOUND).code(),
            Code::Unimplemented
        );
        assert_eq!(
            Status::from_http(http::StatusCode::IM_A_TEAPOT).code(),
            Code::Unknown
        );
    }
}
