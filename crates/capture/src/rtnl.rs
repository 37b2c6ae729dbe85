//! A small synchronous rtnetlink client on `netlink-packet-route`: requests with an ack and
//! dumps, in the calling thread's network namespace (open it inside [`crate::netns::run_in`]).
//!
//! Synchronous on purpose: the node layer programs a pod from a thread that entered the pod's
//! namespace, and the kernel answers rtnetlink requests while we are inside `send(2)`.

use std::io;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLMSG_OVERRUN, NLM_F_ACK,
    NLM_F_DUMP, NLM_F_MULTIPART, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};
use nix::errno::Errno;

use crate::framing::{self, BadMessage};

pub use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};

/// How long an answer may take before we give up (the kernel answers at once).
const RECV_TIMEOUT: Duration = Duration::from_secs(10);
/// Larger than any datagram the kernel sends for a dump (it fills about a page per datagram).
const RECV_BUFFER: usize = 64 * 1024;

/// What went wrong talking rtnetlink; `operation` says what we were doing.
#[derive(Debug, thiserror::Error)]
pub enum RtnlError {
    #[error("cannot open a NETLINK_ROUTE socket: {0}")]
    Open(#[source] io::Error),
    #[error("{operation}: the kernel refused it: {source}")]
    Refused {
        operation: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{operation}: {source}")]
    Io {
        operation: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{operation}: unreadable netlink answer: {source}")]
    Malformed {
        operation: &'static str,
        #[source]
        source: BadMessage,
    },
}

impl RtnlError {
    /// The errno the kernel answered with, for a refused request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            RtnlError::Refused { source, .. } => source.raw_os_error().map(Errno::from_raw),
            _ => None,
        }
    }

    /// Whether the kernel refused because the object is absent (`ENOENT`, `ESRCH`).
    pub fn is_absent(&self) -> bool {
        matches!(self.errno(), Some(Errno::ENOENT | Errno::ESRCH))
    }

    /// Whether the kernel refused because the object exists (`EEXIST`).
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(Errno::EEXIST)
    }

    /// What we were doing.
    pub fn operation(&self) -> &'static str {
        match self {
            RtnlError::Open(_) => "open a NETLINK_ROUTE socket",
            RtnlError::Refused { operation, .. }
            | RtnlError::Io { operation, .. }
            | RtnlError::Malformed { operation, .. } => operation,
        }
    }

    /// The error as an `io::Error` (for callers whose own error type holds one).
    pub fn into_io(self) -> io::Error {
        match self {
            RtnlError::Open(source)
            | RtnlError::Refused { source, .. }
            | RtnlError::Io { source, .. } => source,
            RtnlError::Malformed { .. } => io::Error::new(io::ErrorKind::InvalidData, self),
        }
    }
}

/// One message of a received datagram, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// A message of the request's family (a dump entry, an echo).
    Message(RouteNetlinkMessage),
    /// `NLMSG_ERROR` with code 0.
    Ack,
    /// `NLMSG_ERROR` with a negative errno.
    Error(Errno),
    /// `NLMSG_DONE`: the end of a dump.
    Done,
    /// A well-framed message of the request's family that `netlink-packet-route` cannot parse
    /// (an attribute layout it does not know yet).
    Unparsed(Unparsed),
    /// `NLMSG_NOOP`, `NLMSG_OVERRUN`.
    Other,
}

/// A dump entry `netlink-packet-route` could not parse: its type and payload (after the
/// netlink header), for callers that read the few fields they need themselves.
#[derive(Debug, PartialEq, Eq)]
pub struct Unparsed {
    pub message_type: u16,
    pub payload: Vec<u8>,
    pub reason: String,
}

/// The answer to a dump: the entries that parsed and those that did not.
#[derive(Debug, Default)]
pub struct Dump {
    pub entries: Vec<RouteNetlinkMessage>,
    pub unparsed: Vec<Unparsed>,
}

/// A decoded message with the header fields the client needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Received {
    pub seq: u32,
    pub multipart: bool,
    pub answer: Answer,
}

/// Decodes every message of one datagram from the kernel. Anything that does not parse is an
/// error naming the offset; nothing panics on hostile bytes.
pub fn decode(datagram: &[u8]) -> Result<Vec<Received>, BadMessage> {
    let mut out = Vec::new();
    for message in framing::messages(datagram) {
        let (offset, buffer) = message?;
        let seq = buffer.sequence_number();
        let multipart = buffer.flags() & NLM_F_MULTIPART != 0;
        let message_type = buffer.message_type();
        let bytes = buffer.into_inner();
        let answer = match NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes) {
            Ok(message) => match message.payload {
                NetlinkPayload::InnerMessage(inner) => Answer::Message(inner),
                NetlinkPayload::Error(error) => match error.code {
                    None => Answer::Ack,
                    Some(code) => Answer::Error(Errno::from_raw(code.get().saturating_abs())),
                },
                NetlinkPayload::Done(_) => Answer::Done,
                _ => Answer::Other,
            },
            // Acks, errors and the end of a dump must parse; an entry the crate does not know
            // how to read is handed over as bytes.
            Err(error) if message_type > NLMSG_OVERRUN => Answer::Unparsed(Unparsed {
                message_type,
                payload: NetlinkBuffer::new(bytes).payload().to_vec(),
                reason: error.to_string(),
            }),
            Err(error) => {
                return Err(BadMessage {
                    offset,
                    reason: error.to_string(),
                })
            }
        };
        out.push(Received {
            seq,
            multipart,
            answer,
        });
    }
    Ok(out)
}

/// A `NETLINK_ROUTE` socket in the namespace of the thread that opened it.
pub struct Rtnl {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Rtnl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rtnl").field("seq", &self.seq).finish()
    }
}

impl Rtnl {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Rtnl, RtnlError> {
        // A lost answer must not hang enrollment forever.
        let socket = framing::socket(NETLINK_ROUTE, RECV_TIMEOUT).map_err(RtnlError::Open)?;
        Ok(Rtnl {
            socket,
            seq: 0,
            buf: vec![0; RECV_BUFFER],
        })
    }

    /// Sends `message` with `flags` (`NLM_F_CREATE`, ...) and waits for the kernel's ack.
    pub fn request(
        &mut self,
        operation: &'static str,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<(), RtnlError> {
        self.exchange(operation, message, NLM_F_REQUEST | NLM_F_ACK | flags)
            .map(drop)
    }

    /// Sends `message` as a dump request and returns every entry.
    pub fn dump(
        &mut self,
        operation: &'static str,
        message: RouteNetlinkMessage,
    ) -> Result<Dump, RtnlError> {
        self.exchange(operation, message, NLM_F_REQUEST | NLM_F_DUMP)
    }

    fn exchange(
        &mut self,
        operation: &'static str,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Dump, RtnlError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        packet.finalize();
        let mut bytes = vec![0; packet.buffer_len()];
        packet.serialize(&mut bytes);
        self.socket
            .send(&bytes, 0)
            .map_err(|source| RtnlError::Io { operation, source })?;
        let mut dump = Dump::default();
        loop {
            let len = self
                .socket
                .recv(&mut &mut self.buf[..], 0)
                .map_err(|source| RtnlError::Io { operation, source })?;
            let datagram = self.buf.get(..len).unwrap_or(&self.buf);
            let received =
                decode(datagram).map_err(|source| RtnlError::Malformed { operation, source })?;
            for Received {
                seq: msg_seq,
                multipart,
                answer,
            } in received
            {
                if msg_seq != seq {
                    continue; // a late answer to an earlier request
                }
                match answer {
                    Answer::Ack | Answer::Done => return Ok(dump),
                    Answer::Error(errno) => {
                        return Err(RtnlError::Refused {
                            operation,
                            source: errno.into(),
                        })
                    }
                    Answer::Message(entry) => {
                        dump.entries.push(entry);
                        if !multipart && flags & NLM_F_ACK == 0 {
                            return Ok(dump); // a single answer to a get
                        }
                    }
                    Answer::Unparsed(entry) => dump.unparsed.push(entry),
                    Answer::Other => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{DoneMessage, ErrorMessage};
    use netlink_packet_route::link::LinkMessage;
    use std::num::NonZeroI32;

    fn encode(seq: u32, flags: u16, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        header.flags = flags;
        let mut message = NetlinkMessage::new(header, payload);
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        bytes
    }

    #[test]
    fn decodes_a_dump_datagram_with_entries_and_done() {
        let mut datagram = encode(
            7,
            NLM_F_MULTIPART,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(LinkMessage::default())),
        );
        datagram.extend(encode(
            7,
            NLM_F_MULTIPART,
            NetlinkPayload::Done(DoneMessage::default()),
        ));
        let received = decode(&datagram).expect("decodes");
        assert_eq!(received.len(), 2);
        assert!(received[0].multipart);
        assert!(matches!(received[0].answer, Answer::Message(_)));
        assert_eq!(received[1].answer, Answer::Done);
    }

    #[test]
    fn decodes_acks_and_errors() {
        let mut nack = ErrorMessage::default();
        nack.code = NonZeroI32::new(-(Errno::EEXIST as i32));
        let received = decode(&encode(3, 0, NetlinkPayload::Error(nack))).expect("decodes");
        assert_eq!(received[0].answer, Answer::Error(Errno::EEXIST));
        let ack = ErrorMessage::default();
        let received = decode(&encode(3, 0, NetlinkPayload::Error(ack))).expect("decodes");
        assert_eq!(received[0].answer, Answer::Ack);
    }

    #[test]
    fn an_entry_the_crate_cannot_parse_is_handed_over_as_bytes() {
        // RTM_NEWLINK whose payload is shorter than an ifinfomsg.
        let mut datagram = Vec::new();
        datagram.extend_from_slice(&20u32.to_ne_bytes());
        datagram.extend_from_slice(&16u16.to_ne_bytes());
        datagram.extend_from_slice(&NLM_F_MULTIPART.to_ne_bytes());
        datagram.extend_from_slice(&4u32.to_ne_bytes());
        datagram.extend_from_slice(&0u32.to_ne_bytes());
        datagram.extend_from_slice(&[1, 2, 3, 4]);
        let received = decode(&datagram).expect("well framed");
        match &received[0].answer {
            Answer::Unparsed(entry) => {
                assert_eq!(
                    (entry.message_type, entry.payload.as_slice()),
                    (16, &[1, 2, 3, 4][..])
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn truncated_and_oversized_lengths_are_errors_naming_the_offset() {
        let datagram = encode(
            1,
            0,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(LinkMessage::default())),
        );
        let error = decode(&datagram[..datagram.len() - 3]).expect_err("truncated");
        assert!(error.to_string().contains("byte 0"), "{error}");
        let mut lying = datagram.clone();
        lying[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(decode(&lying).is_err());
        let mut two = datagram.clone();
        two.extend_from_slice(&[1, 2, 3]);
        let error = decode(&two).expect_err("trailing garbage");
        assert!(
            error
                .to_string()
                .contains(&format!("byte {}", datagram.len())),
            "{error}"
        );
    }
}
