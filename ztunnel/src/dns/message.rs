//! Parsing queries and building responses with hickory-proto.

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncodable, BinEncoder};

/// Largest UDP response to a client that did not send EDNS (RFC 1035).
pub const CLASSIC_UDP_SIZE: u16 = 512;

/// How the query arrived: bounds the response size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// What to do with the bytes a client sent.
#[derive(Debug)]
pub enum Parsed {
    /// A well-formed standard query with one question.
    Query(Message),
    /// Answer this right away (FORMERR, NOTIMP).
    Reply(Vec<u8>),
    /// Not answerable (no readable header, or a response): drop it.
    Drop(&'static str),
}

/// Parses a client's message.
pub fn parse(bytes: &[u8]) -> Parsed {
    let msg = match Message::from_vec(bytes) {
        Ok(msg) => msg,
        Err(e) => {
            tracing::debug!(error = %e, len = bytes.len(), "malformed DNS query");
            return match Header::read(&mut BinDecoder::new(bytes)) {
                Ok(h) if h.message_type() == MessageType::Query => {
                    Parsed::Reply(error_reply(&h, ResponseCode::FormErr))
                }
                Ok(_) => Parsed::Drop("malformed response"),
                Err(_) => Parsed::Drop("no readable header"),
            };
        }
    };
    if msg.message_type() != MessageType::Query {
        return Parsed::Drop("a response, not a query");
    }
    if msg.op_code() != OpCode::Query {
        return Parsed::Reply(error_reply(msg.header(), ResponseCode::NotImp));
    }
    if msg.queries().len() != 1 {
        return Parsed::Reply(error_reply(msg.header(), ResponseCode::FormErr));
    }
    Parsed::Query(msg)
}

/// A header-only error response to a query with header `h`.
pub fn error_reply(h: &Header, code: ResponseCode) -> Vec<u8> {
    let mut header = Header::response_from_request(h);
    header.set_recursion_available(true);
    header.set_response_code(code);
    let mut msg = Message::new();
    msg.set_header(header);
    encode(&msg, u16::MAX)
}

/// An error response to `request` that keeps its question (SERVFAIL on upstream failure).
pub fn error_response(request: &Message, code: ResponseCode, transport: Transport) -> Vec<u8> {
    let mut msg = response_to(request);
    msg.set_response_code(code);
    encode(&msg, max_size(request, transport))
}

/// The authoritative answer ztunnel gives for a name it knows.
pub fn local_answer(request: &Message, answers: Vec<Record>, transport: Transport) -> Vec<u8> {
    let mut msg = response_to(request);
    msg.set_authoritative(true);
    msg.insert_answers(answers);
    encode(&msg, max_size(request, transport))
}

/// A response skeleton: id, opcode, RD and CD copied, RA set, the question, and EDNS when the
/// query had it.
fn response_to(request: &Message) -> Message {
    let mut header = Header::response_from_request(request.header());
    header.set_recursion_available(true);
    let mut msg = Message::new();
    msg.set_header(header);
    msg.add_queries(request.queries().iter().cloned());
    if let Some(req) = request.extensions() {
        let mut edns = Edns::new();
        edns.set_max_payload(req.max_payload().max(CLASSIC_UDP_SIZE));
        edns.set_version(0);
        edns.set_dnssec_ok(req.flags().dnssec_ok);
        msg.set_edns(edns);
    }
    msg
}

/// The largest response the client accepts.
pub fn max_size(request: &Message, transport: Transport) -> u16 {
    match transport {
        Transport::Tcp => u16::MAX,
        Transport::Udp => request
            .extensions()
            .as_ref()
            .map_or(CLASSIC_UDP_SIZE, |e| e.max_payload().max(CLASSIC_UDP_SIZE)),
    }
}

/// Encodes `msg`, dropping records that do not fit `max` and setting TC if any were dropped.
fn encode(msg: &Message, max: u16) -> Vec<u8> {
    let mut buf = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut buf);
    encoder.set_max_size(max);
    if msg.emit(&mut encoder).is_ok() {
        return buf;
    }
    // Even the question does not fit (or a record cannot be encoded): header only, truncated.
    let mut header = *msg.header();
    header.set_truncated(true);
    let mut bare = Message::new();
    bare.set_header(header);
    let mut buf = Vec::with_capacity(12);
    let mut encoder = BinEncoder::new(&mut buf);
    match bare.emit(&mut encoder) {
        Ok(()) => buf,
        Err(_) => Vec::new(),
    }
}

/// Overwrites the id of an encoded message.
pub fn set_id(bytes: &mut [u8], id: u16) {
    if let Some(head) = bytes.get_mut(..2) {
        head.copy_from_slice(&id.to_be_bytes());
    }
}
