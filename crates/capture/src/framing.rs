//! What every netlink protocol shares, whoever parses the payloads: the socket (bound, with a
//! receive timeout, in the calling thread's netns), the walk over the messages of one
//! datagram, and NUL-terminated string attributes. The rtnetlink client (`rtnl`) and
//! cni-node's nf_tables code both build on it.

use std::io;
use std::time::Duration;

use netlink_packet_core::NetlinkBuffer;
use netlink_sys::Socket;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};

/// A bound netlink socket of `protocol` (`netlink_sys::protocols::*`) in the calling
/// thread's network namespace; a receive that waits longer than `timeout` fails, so a lost
/// answer cannot hang the caller.
pub fn socket(protocol: isize, timeout: Duration) -> io::Result<Socket> {
    let mut socket = Socket::new(protocol)?;
    socket.bind_auto()?;
    let millis = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    setsockopt(
        &socket,
        sockopt::ReceiveTimeout,
        &TimeVal::milliseconds(millis),
    )?;
    Ok(socket)
}

/// A message that does not parse: where it starts and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message at byte {offset}: {reason}")]
pub struct BadMessage {
    pub offset: usize,
    pub reason: String,
}

/// The messages of one datagram with the byte offset each starts at. The walk stops at the
/// first message whose length field is shorter than a header or longer than what is left,
/// yielding it as an error; nothing panics on hostile bytes.
pub fn messages(
    datagram: &[u8],
) -> impl Iterator<Item = Result<(usize, NetlinkBuffer<&[u8]>), BadMessage>> + '_ {
    let mut offset = 0;
    std::iter::from_fn(move || {
        if offset >= datagram.len() {
            return None;
        }
        let start = offset;
        match NetlinkBuffer::new_checked(&datagram[start..]) {
            Ok(message) => {
                let length = message.length() as usize;
                // Messages are 4-byte aligned within a datagram.
                offset += length.div_ceil(4) * 4;
                let message = NetlinkBuffer::new(&datagram[start..start + length]);
                Some(Ok((start, message)))
            }
            Err(error) => {
                offset = datagram.len();
                Some(Err(BadMessage {
                    offset: start,
                    reason: error.to_string(),
                }))
            }
        }
    })
}

/// A NUL-terminated string attribute's value (lossy UTF-8, up to the first NUL).
pub fn attr_string(value: &[u8]) -> String {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}
