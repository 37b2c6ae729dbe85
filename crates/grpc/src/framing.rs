//! gRPC's length-prefixed messages: a flag byte (compressed or not), a 4-byte big-endian length,
//! then the protobuf bytes.
//!
//! Received messages are cut out of the DATA chunks as they arrived, without copying them into
//! one contiguous buffer: a client that once read a 20 MB message does not keep a 20 MB buffer
//! for the rest of the stream's life, and the message is decoded straight from the chunks.

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::status::{Code, Status};

const PREFIX: usize = 5;

/// One message, framed and uncompressed.
pub fn encode<M: prost::Message>(message: &M) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len).map_err(|_| {
        Status::new(
            Code::ResourceExhausted,
            format!("a {len}-byte message is too large for gRPC's length prefix"),
        )
    })?;
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(prefix);
    message
        .encode(&mut buf)
        .map_err(|e| Status::new(Code::Internal, format!("encoding the request: {e}")))?;
    Ok(buf.freeze())
}

/// Received bytes not yet decoded, kept as the chunks they came in.
#[derive(Debug)]
pub struct Frames {
    parts: VecDeque<Bytes>,
    len: usize,
    limit: usize,
}

impl Frames {
    /// Refuses messages longer than `limit` bytes.
    pub fn new(limit: usize) -> Frames {
        Frames {
            parts: VecDeque::new(),
            len: 0,
            limit,
        }
    }

    pub fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.len += chunk.len();
            self.parts.push_back(chunk);
        }
    }

    /// Bytes received and not yet taken.
    pub fn buffered(&self) -> usize {
        self.len
    }

    /// The body of the next message once all of it has arrived.
    pub fn next_message(&mut self) -> Result<Option<Chunks>, Status> {
        if self.len < PREFIX {
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX];
        self.peek(&mut prefix);
        if prefix[0] != 0 {
            return Err(Status::new(
                Code::Internal,
                "the server sent a compressed message; this client asks for none",
            ));
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > self.limit {
            return Err(Status::new(
                Code::ResourceExhausted,
                format!(
                    "a {len}-byte message is over this client's {}-byte limit",
                    self.limit
                ),
            ));
        }
        if self.len < PREFIX + len {
            return Ok(None);
        }
        self.take(PREFIX);
        Ok(Some(self.take(len)))
    }

    /// Copies the first `out.len()` bytes (there are at least that many).
    fn peek(&self, out: &mut [u8]) {
        let mut filled = 0;
        for part in &self.parts {
            let n = part.len().min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&part[..n]);
            filled += n;
            if filled == out.len() {
                return;
            }
        }
    }

    /// Removes the first `n` bytes (there are at least that many), without copying.
    fn take(&mut self, mut n: usize) -> Chunks {
        let mut taken = Chunks {
            parts: VecDeque::new(),
            remaining: n,
        };
        self.len -= n;
        while n > 0 {
            let Some(front) = self.parts.front_mut() else {
                break;
            };
            if front.len() <= n {
                n -= front.len();
                if let Some(part) = self.parts.pop_front() {
                    taken.parts.push_back(part);
                }
            } else {
                taken.parts.push_back(front.split_to(n));
                n = 0;
            }
        }
        taken
    }
}

/// A message body spread over several chunks, read as one buffer.
#[derive(Debug)]
pub struct Chunks {
    parts: VecDeque<Bytes>,
    remaining: usize,
}

impl Buf for Chunks {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |b| &b[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let Some(front) = self.parts.front_mut() else {
                return;
            };
            if front.len() <= cnt {
                cnt -= front.len();
                self.remaining -= front.len();
                self.parts.pop_front();
            } else {
                front.advance(cnt);
                self.remaining -= cnt;
                cnt = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// A message with a repeated field, so that sizes vary.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Names {
        #[prost(string, tag = "1")]
        label: String,
        #[prost(string, repeated, tag = "2")]
        names: Vec<String>,
    }

    fn names(label: &str, n: usize) -> Names {
        Names {
            label: label.to_string(),
            names: (0..n).map(|i| format!("name-{i}")).collect(),
        }
    }

    #[test]
    fn decodes_messages_split_across_any_chunks() {
        let sent = [names("a", 3), names("b", 0), names("c", 400)];
        let mut wire = Vec::new();
        for m in &sent {
            wire.extend_from_slice(&encode(m).expect("encodes"));
        }
        for chunk in [1, 2, 5, 7, 64, 1000, wire.len()] {
            let mut frames = Frames::new(1 << 20);
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                frames.push(Bytes::copy_from_slice(piece));
                while let Some(body) = frames.next_message().expect("valid") {
                    got.push(Names::decode(body).expect("decodes"));
                }
            }
            assert_eq!(got, sent, "chunk size {chunk}");
            assert_eq!(frames.buffered(), 0);
        }
    }

    #[test]
    fn refuses_compressed_and_oversized_messages() {
        let mut frames = Frames::new(1 << 20);
        frames.push(Bytes::from_static(&[1, 0, 0, 0, 1, 0]));
        assert_eq!(
            frames.next_message().expect_err("compressed").code(),
            Code::Internal
        );
        let mut frames = Frames::new(100);
        frames.push(Bytes::from_static(&[0, 0, 0, 0, 101]));
        let err = frames.next_message().expect_err("too large");
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(err.message().contains("101-byte"), "{err}");
        // At the limit is fine, and waits for the rest.
        let mut frames = Frames::new(100);
        frames.push(Bytes::from_static(&[0, 0, 0, 0, 100, 7]));
        assert!(frames.next_message().expect("at the limit").is_none());
    }
}
