//! A delta response that still holds the snapshot's shared resources, and its encoding as one
//! gRPC message a chunk at a time, straight from those resources.
//!
//! A full state is megabytes. Copying every resource into a `DeltaDiscoveryResponse` and
//! encoding it whole holds the copies and then the encoded bytes until the client's
//! flow-control window has taken them all. [`FrameChunks`] instead encodes the next chunk only
//! when asked: first the 5-byte gRPC prefix and every field but the resources, then the
//! resources, each as one occurrence of the repeated field. Protobuf lets fields come in any
//! order and concatenates the occurrences of a repeated field, so the message decodes to the
//! same `DeltaDiscoveryResponse`.

use std::sync::Arc;

use mesh_proto::discovery::{DeltaDiscoveryResponse, Resource as WireResource};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use crate::Resource;

/// `DeltaDiscoveryResponse.resources`.
const RESOURCES_FIELD: u32 = 2;
/// Fields of `envoy.service.discovery.v3.Resource` and `google.protobuf.Any`.
const VERSION_FIELD: u32 = 1;
const BODY_FIELD: u32 = 2;
const NAME_FIELD: u32 = 3;
const ALIASES_FIELD: u32 = 4;
const ANY_TYPE_URL_FIELD: u32 = 1;
const ANY_VALUE_FIELD: u32 = 2;

/// One delta response: every field of `DeltaDiscoveryResponse` this server sets, with the
/// resources shared with the snapshot instead of copied.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SharedResponse {
    pub system_version_info: String,
    pub type_url: String,
    pub removed_resources: Vec<String>,
    pub nonce: String,
    pub resources: Vec<Arc<Resource>>,
}

/// Why a response cannot be framed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("response of {0} bytes is too large for one gRPC message")]
    TooLarge(usize),
    #[error("encoding a response failed: {0}")]
    Encode(#[from] prost::EncodeError),
}

impl SharedResponse {
    /// The protobuf message, with each resource copied in.
    pub fn into_proto(self) -> DeltaDiscoveryResponse {
        let (mut msg, resources) = self.split();
        msg.resources = resources.iter().map(|r| to_wire(r)).collect();
        msg
    }

    /// Every field but the resources, and the resources.
    fn split(self) -> (DeltaDiscoveryResponse, Vec<Arc<Resource>>) {
        let head = DeltaDiscoveryResponse {
            system_version_info: self.system_version_info,
            type_url: self.type_url,
            removed_resources: self.removed_resources,
            nonce: self.nonce,
            ..DeltaDiscoveryResponse::default()
        };
        (head, self.resources)
    }

    /// The framed message (gRPC prefix, then the protobuf bytes) as chunks of at most `chunk`
    /// bytes (or one resource, when a single one is larger), each encoded when the iterator
    /// is advanced.
    pub fn frames(self, chunk: usize) -> Result<FrameChunks, FrameError> {
        let (head, resources) = self.split();
        let head_len = head.encoded_len();
        let len = head_len + resources.iter().map(resource_field_len).sum::<usize>();
        let prefix = u32::try_from(len).map_err(|_| FrameError::TooLarge(len))?;
        let chunk = chunk.max(1);
        let mut first = Vec::with_capacity((5 + len).min(chunk.max(5 + head_len)));
        first.push(0);
        first.extend_from_slice(&prefix.to_be_bytes());
        head.encode(&mut first)?;
        Ok(FrameChunks {
            first: Some(first),
            rest: resources.into_iter().peekable(),
            chunk,
        })
    }
}

/// The chunks of one framed message; see [`SharedResponse::frames`].
#[derive(Debug)]
pub struct FrameChunks {
    first: Option<Vec<u8>>,
    rest: std::iter::Peekable<std::vec::IntoIter<Arc<Resource>>>,
    chunk: usize,
}

impl Iterator for FrameChunks {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        let mut buf = match self.first.take() {
            Some(first) => first,
            // A resource larger than a chunk goes alone, in a buffer of its size.
            None => Vec::with_capacity(
                self.rest
                    .peek()
                    .map_or(self.chunk, |r| resource_field_len(r).max(self.chunk)),
            ),
        };
        // Fill up to the chunk size exactly, so the buffer never grows past its capacity
        // (a buffer sent as `Bytes` keeps its whole capacity until the client has it).
        while let Some(resource) = self.rest.peek() {
            let len = resource_field_len(resource);
            if !buf.is_empty() && buf.len() + len > self.chunk {
                break;
            }
            encode_resource(resource, &mut buf);
            self.rest.next();
        }
        (!buf.is_empty()).then_some(buf)
    }
}

/// The wire form of a resource, copied.
pub(crate) fn to_wire(resource: &Resource) -> WireResource {
    WireResource {
        name: resource.name.clone(),
        aliases: resource.aliases.clone(),
        version: resource.version.clone(),
        resource: Some(mesh_proto::envoy::pb::google::protobuf::Any {
            type_url: resource.body.type_url.clone(),
            value: resource.body.value.clone(),
        }),
        ..WireResource::default()
    }
}

/// One occurrence of `DeltaDiscoveryResponse.resources`, encoded.
fn resource_field_len(r: &Arc<Resource>) -> usize {
    field_len(RESOURCES_FIELD, resource_len(r))
}

/// A length-delimited field: key, length, body.
fn field_len(tag: u32, body: usize) -> usize {
    key_len(tag) + encoded_len_varint(body as u64) + body
}

/// A string or bytes field, omitted when empty (as proto3 encoders do).
fn bytes_len(tag: u32, bytes: &[u8]) -> usize {
    if bytes.is_empty() {
        0
    } else {
        field_len(tag, bytes.len())
    }
}

fn any_len(r: &Resource) -> usize {
    bytes_len(ANY_TYPE_URL_FIELD, r.body.type_url.as_bytes())
        + bytes_len(ANY_VALUE_FIELD, &r.body.value)
}

/// The encoded `Resource` message: version, body (always present), name, aliases.
fn resource_len(r: &Resource) -> usize {
    bytes_len(VERSION_FIELD, r.version.as_bytes())
        + field_len(BODY_FIELD, any_len(r))
        + bytes_len(NAME_FIELD, r.name.as_bytes())
        + r.aliases
            .iter()
            .map(|a| field_len(ALIASES_FIELD, a.len()))
            .sum::<usize>()
}

fn put_bytes(tag: u32, bytes: &[u8], buf: &mut Vec<u8>) {
    if !bytes.is_empty() {
        put_field(tag, bytes, buf);
    }
}

/// A length-delimited field, even when empty (repeated strings keep their empty entries).
fn put_field(tag: u32, bytes: &[u8], buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}

/// One occurrence of `DeltaDiscoveryResponse.resources`, encoded from the shared resource.
fn encode_resource(r: &Resource, buf: &mut Vec<u8>) {
    encode_key(RESOURCES_FIELD, WireType::LengthDelimited, buf);
    encode_varint(resource_len(r) as u64, buf);
    put_bytes(VERSION_FIELD, r.version.as_bytes(), buf);
    encode_key(BODY_FIELD, WireType::LengthDelimited, buf);
    encode_varint(any_len(r) as u64, buf);
    put_bytes(ANY_TYPE_URL_FIELD, r.body.type_url.as_bytes(), buf);
    put_bytes(ANY_VALUE_FIELD, &r.body.value, buf);
    put_bytes(NAME_FIELD, r.name.as_bytes(), buf);
    for alias in &r.aliases {
        put_field(ALIASES_FIELD, alias.as_bytes(), buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(i: usize) -> Arc<Resource> {
        let aliases = match i % 3 {
            0 => Vec::new(),
            1 => vec![format!("/10.0.{}.{}", i / 256, i % 256)],
            _ => vec![String::new(), format!("net/10.1.0.{}", i % 256)],
        };
        let body = vec![(i % 251) as u8; i % 700];
        Arc::new(Resource::from_encoded(
            "type.googleapis.com/istio.workload.Address",
            format!("workload-{i}"),
            aliases,
            body,
        ))
    }

    fn response(n: usize) -> SharedResponse {
        SharedResponse {
            system_version_info: "7".into(),
            type_url: "type.googleapis.com/istio.workload.Address".into(),
            removed_resources: vec!["gone".into(), "also-gone".into()],
            nonce: "7-1".into(),
            resources: (0..n).map(resource).collect(),
        }
    }

    /// The concatenated chunks and their number. A chunk never outgrows the chunk size (the
    /// resources here are smaller than the sizes tried, except 1 byte, where each chunk is one
    /// resource) nor its first allocation.
    fn wire(chunks: FrameChunks) -> (Vec<u8>, usize) {
        let limit = chunks.chunk;
        let mut out = Vec::new();
        let mut count = 0;
        for chunk in chunks {
            if limit > 1 {
                assert!(chunk.len() <= limit, "{} bytes, limit {limit}", chunk.len());
            }
            assert!(
                chunk.capacity() <= limit.max(chunk.len()),
                "capacity {} for {} bytes",
                chunk.capacity(),
                chunk.len()
            );
            out.extend_from_slice(&chunk);
            count += 1;
        }
        (out, count)
    }

    #[test]
    fn chunks_decode_to_the_copied_message() {
        for (n, chunk) in [(0, 1 << 10), (1, 1 << 10), (5_000, 64 << 10), (300, 1)] {
            let shared = response(n);
            let expected = shared.clone().into_proto();
            let (bytes, chunks) = wire(shared.frames(chunk).expect("frames"));
            assert_eq!(bytes[0], 0, "not compressed");
            let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
            assert_eq!(len, bytes.len() - 5, "the prefix counts every chunk");
            assert_eq!(len, expected.encoded_len(), "{n} resources");
            let decoded = DeltaDiscoveryResponse::decode(&bytes[5..]).expect("decode");
            assert_eq!(decoded, expected, "{n} resources in chunks of {chunk}");
            if n == 5_000 {
                assert!(chunks > 10, "{chunks} chunks");
            }
        }
    }

    #[test]
    fn a_small_message_is_one_chunk() {
        let (_, chunks) = wire(response(3).frames(256 << 10).expect("frames"));
        assert_eq!(chunks, 1);
    }
}
