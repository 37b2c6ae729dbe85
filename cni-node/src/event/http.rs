//! The little HTTP/1.1 both ends need: one request per connection (`Connection: close`),
//! bodies framed by `Content-Length` (chunked bodies are decoded on the client side only, for
//! an agent written in Go).

/// Most bytes of a request or response head (start line and headers).
pub(crate) const MAX_HEAD: usize = 16 * 1024;

/// The start line and headers of a request or response.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) start_line: String,
    headers: Vec<(String, String)>,
}

impl Head {
    /// The value of header `name` (case-insensitive), trimmed.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// `Content-Length`, if present.
    pub(crate) fn content_length(&self) -> Result<Option<usize>, String> {
        self.header("content-length")
            .map(|value| {
                value
                    .parse()
                    .map_err(|_| format!("bad Content-Length {value:?}"))
            })
            .transpose()
    }

    /// Whether the body is `Transfer-Encoding: chunked`.
    pub(crate) fn is_chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|value| value.to_ascii_lowercase().contains("chunked"))
    }
}

/// Where the head ends (the index just past `\r\n\r\n`), if it is complete.
pub(crate) fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// Parses a complete head (`head_end` bytes).
pub(crate) fn parse_head(bytes: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "head is not UTF-8".to_owned())?;
    let mut lines = text.split("\r\n");
    let start_line = lines
        .next()
        .filter(|line| !line.is_empty())
        .ok_or("empty start line")?
        .to_owned();
    let mut headers = Vec::new();
    for line in lines.filter(|line| !line.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("bad header line {line:?}"))?;
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    Ok(Head {
        start_line,
        headers,
    })
}

/// Decodes a chunked body; `Ok(None)` while it is incomplete.
pub(crate) fn decode_chunked(mut rest: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let size_text = std::str::from_utf8(&rest[..line_end]).map_err(|_| "bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(Some(body));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// The reason phrase of the status codes we send.
pub(crate) fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Unknown",
    }
}

/// A complete `Connection: close` response with a plain-text body.
pub(crate) fn response(status: u16, extra_headers: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n{extra_headers}\r\n{body}",
        reason_phrase(status),
        body.len()
    )
    .into_bytes()
}
