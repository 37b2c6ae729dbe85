//! Reading rules back: an `NFT_MSG_GETRULE` dump of family inet on a `NETLINK_NETFILTER`
//! socket of the calling thread's netns, framed and parsed with `netlink-packet-core`, counted
//! per table (what `is_enrolled` compares with the rule set).

use std::collections::HashMap;
use std::io;

use mesh_capture::framing;
use netlink_packet_core::{
    ErrorBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable, NlasIterator,
    NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP, NLM_F_REQUEST,
};

/// `NFTA_RULE_TABLE` (include/uapi/linux/netfilter/nf_tables.h).
const NFTA_RULE_TABLE: u16 = 1;
/// `sizeof(struct nfgenmsg)`.
const NFGENMSG_LEN: usize = 4;
const RECV_BUFFER: usize = 64 * 1024;

fn nftables_type(message: i32) -> u16 {
    ((libc::NFNL_SUBSYS_NFTABLES as u16) << 8) | message as u16
}

/// The dump request: an `nfgenmsg` for family inet.
#[derive(Debug)]
struct GetRules;

impl NetlinkSerializable for GetRules {
    fn message_type(&self) -> u16 {
        nftables_type(libc::NFT_MSG_GETRULE)
    }

    fn buffer_len(&self) -> usize {
        NFGENMSG_LEN
    }

    fn serialize(&self, buffer: &mut [u8]) {
        if let Some(header) = buffer.get_mut(..NFGENMSG_LEN) {
            header.copy_from_slice(&[libc::NFPROTO_INET as u8, libc::NFNETLINK_V0 as u8, 0, 0]);
        }
    }
}

/// Number of rules per table (of family inet) in the calling thread's netns.
pub fn rule_counts() -> io::Result<HashMap<String, usize>> {
    let socket = crate::batch::open()?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut request = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(GetRules));
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);
    socket.send(&bytes, 0)?;
    let mut counts = HashMap::new();
    let mut buf = vec![0u8; RECV_BUFFER];
    loop {
        let len = socket.recv(&mut &mut buf[..], 0)?;
        if count_rules(buf.get(..len).unwrap_or_default(), &mut counts)? {
            return Ok(counts);
        }
    }
}

/// Adds the rules of one dump datagram to `counts`; true at the end of the dump.
pub fn count_rules(datagram: &[u8], counts: &mut HashMap<String, usize>) -> io::Result<bool> {
    let malformed = |offset: usize, what: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("nftables rule dump at byte {offset}: {what}"),
        )
    };
    for message in framing::messages(datagram) {
        let (offset, message) = message.map_err(|bad| malformed(bad.offset, bad.reason))?;
        match message.message_type() {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let error = ErrorBuffer::new_checked(message.payload())
                    .map_err(|error| malformed(offset, error.to_string()))?;
                return match error.code() {
                    None => Ok(true),
                    Some(code) => Err(io::Error::from_raw_os_error(code.get().saturating_abs())),
                };
            }
            ty if ty == nftables_type(libc::NFT_MSG_NEWRULE) => {
                let attributes = message.payload().get(NFGENMSG_LEN..).unwrap_or_default();
                for attribute in NlasIterator::new(attributes) {
                    let attribute =
                        attribute.map_err(|error| malformed(offset, error.to_string()))?;
                    if attribute.kind() == NFTA_RULE_TABLE {
                        let table = framing::attr_string(attribute.value());
                        *counts.entry(table).or_insert(0) += 1;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(false)
}
