//! Netlink plumbing of the nftables code: building messages with nested
//! attributes, a socket in the calling thread's network namespace, acks, dumps and parsing.
//!
//! Everything here is byte-level and synchronous: the kernel handles a request while we are
//! inside `send(2)`, so its acks are queued on the socket by the time `send` returns.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{self, sockopt, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType};
use nix::sys::time::{TimeVal, TimeValLike};

const NLMSG_HDRLEN: usize = 16;
const NLA_HDRLEN: usize = 4;
const NLA_F_NESTED: u16 = 0x8000;
/// Flags of a request that wants an ack.
pub(super) const REQUEST: u16 = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
pub(super) const CREATE: u16 = libc::NLM_F_CREATE as u16;
pub(super) const APPEND: u16 = libc::NLM_F_APPEND as u16;
const DUMP: u16 = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
/// How long a dump or an ack may take before we give up (the kernel answers at once).
const RECV_TIMEOUT: Duration = Duration::from_secs(5);
const RECV_BUF: usize = 64 * 1024;

fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// One netlink message under construction: header, family header, attributes.
#[derive(Clone, Debug)]
pub(super) struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    /// A message of type `ty` with `flags` (the sequence number is set when sent) and the
    /// fixed family header `header` (`nfgenmsg`, `rtmsg`, `fib_rule_hdr`).
    pub(super) fn new(ty: u16, flags: u16, header: &[u8]) -> Msg {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&[0; 4]); // length, set by `finish`
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&[0; 8]); // seq, pid
        buf.extend_from_slice(header);
        buf.resize(align(buf.len()), 0);
        Msg { buf }
    }

    /// Appends attribute `ty` with payload `data`.
    pub(super) fn put(&mut self, ty: u16, data: &[u8]) -> &mut Self {
        let len = u16::try_from(NLA_HDRLEN + data.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    /// A NUL-terminated string attribute.
    pub(super) fn put_str(&mut self, ty: u16, value: &str) -> &mut Self {
        let mut data = Vec::with_capacity(value.len() + 1);
        data.extend_from_slice(value.as_bytes());
        data.push(0);
        self.put(ty, &data)
    }

    /// A big-endian u32 (nf_tables' integer attributes).
    pub(super) fn put_be32(&mut self, ty: u16, value: u32) -> &mut Self {
        self.put(ty, &value.to_be_bytes())
    }

    /// Opens nested attribute `ty`; close it with [`Msg::end_nest`].
    pub(super) fn begin_nest(&mut self, ty: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        start
    }

    pub(super) fn end_nest(&mut self, start: usize) {
        let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// The finished bytes with sequence number `seq`.
    fn finish(&mut self, seq: u32) -> &[u8] {
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        &self.buf
    }

    #[cfg(test)]
    pub(super) fn into_bytes_for_test(mut self, seq: u32) -> Vec<u8> {
        self.finish(seq).to_vec()
    }

    fn wants_ack(&self) -> bool {
        u16::from_ne_bytes([self.buf[6], self.buf[7]]) & libc::NLM_F_ACK as u16 != 0
    }
}

/// A received message: its type, sequence number and payload (after the netlink header).
#[derive(Debug)]
pub(super) struct Reply<'a> {
    pub(super) ty: u16,
    pub(super) seq: u32,
    pub(super) payload: &'a [u8],
}

/// Splits a datagram into messages.
pub(super) fn replies(mut data: &[u8]) -> impl Iterator<Item = Reply<'_>> {
    std::iter::from_fn(move || {
        if data.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if len < NLMSG_HDRLEN || len > data.len() {
            return None;
        }
        let reply = Reply {
            ty: u16::from_ne_bytes([data[4], data[5]]),
            seq: u32::from_ne_bytes([data[8], data[9], data[10], data[11]]),
            payload: &data[NLMSG_HDRLEN..len],
        };
        data = &data[align(len).min(data.len())..];
        Some(reply)
    })
}

/// The errno of an `NLMSG_ERROR` payload (0 for an ack).
fn error_code(payload: &[u8]) -> i32 {
    match payload.get(0..4) {
        Some(bytes) => -i32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        None => libc::EPROTO,
    }
}

/// Attributes `(type without flags, payload)` of a message payload after `skip` header bytes.
pub(super) fn attrs(data: &[u8], skip: usize) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = data.get(align(skip)..).unwrap_or(&[]);
    std::iter::from_fn(move || {
        if rest.len() < NLA_HDRLEN {
            return None;
        }
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let ty = u16::from_ne_bytes([rest[2], rest[3]]) & 0x3fff;
        if len < NLA_HDRLEN || len > rest.len() {
            return None;
        }
        let payload = &rest[NLA_HDRLEN..len];
        rest = &rest[align(len).min(rest.len())..];
        Some((ty, payload))
    })
}

/// A NUL-terminated string attribute's value.
pub(super) fn attr_str(data: &[u8]) -> &str {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    std::str::from_utf8(&data[..end]).unwrap_or("")
}

/// A host-endian u32 attribute's value.
/// A netlink socket of one protocol, opened in the calling thread's network namespace.
#[derive(Debug)]
pub(super) struct Socket {
    fd: OwnedFd,
    seq: u32,
}

/// The errors of a request: the index of the failing message and its errno.
pub(super) type Failures = Vec<(usize, Errno)>;

impl Socket {
    pub(super) fn open(protocol: SockProtocol) -> io::Result<Socket> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            protocol,
        )?;
        let timeout = TimeVal::milliseconds(RECV_TIMEOUT.as_millis() as i64);
        socket::setsockopt(&fd, sockopt::ReceiveTimeout, &timeout)?;
        socket::bind(fd.as_raw_fd(), &socket::NetlinkAddr::new(0, 0))?;
        Ok(Socket { fd, seq: 1 })
    }

    /// Sends `msgs` in one datagram and returns the failures the kernel reported, by index in
    /// `msgs`, once every message sent with `NLM_F_ACK` was answered (or a failure came).
    pub(super) fn request(&mut self, msgs: &mut [Msg]) -> io::Result<Failures> {
        let first = self.seq;
        let mut out = Vec::with_capacity(msgs.iter().map(|m| m.buf.len()).sum());
        for msg in msgs.iter_mut() {
            out.extend_from_slice(msg.finish(self.seq));
            self.seq = self.seq.wrapping_add(1);
        }
        self.send(&out)?;
        let expected = msgs.iter().filter(|m| m.wants_ack()).count();
        let mut acked = 0;
        let mut failures = Vec::new();
        let mut buf = vec![0u8; RECV_BUF];
        while acked < expected {
            let n = self.recv(&mut buf)?;
            for reply in replies(&buf[..n]) {
                if reply.ty != libc::NLMSG_ERROR as u16 {
                    continue;
                }
                let index = reply.seq.wrapping_sub(first) as usize;
                if index >= msgs.len() {
                    continue;
                }
                acked += 1;
                let code = error_code(reply.payload);
                if code != 0 {
                    failures.push((index, Errno::from_raw(code)));
                }
            }
            // A failed nftables batch is answered with its errors only; once every message
            // sent is accounted for or an error came and nothing more is queued, stop.
            if !failures.is_empty() && !self.pending()? {
                break;
            }
        }
        Ok(failures)
    }

    /// Runs a dump request and calls `each` with the payload of every message.
    pub(super) fn dump(&mut self, mut msg: Msg, mut each: impl FnMut(&[u8])) -> io::Result<()> {
        msg.buf[6..8].copy_from_slice(&DUMP.to_ne_bytes());
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let bytes = msg.finish(seq).to_vec();
        self.send(&bytes)?;
        let mut buf = vec![0u8; RECV_BUF];
        loop {
            let n = self.recv(&mut buf)?;
            for reply in replies(&buf[..n]) {
                if reply.seq != seq {
                    continue;
                }
                match i32::from(reply.ty) {
                    libc::NLMSG_DONE => return Ok(()),
                    libc::NLMSG_ERROR => {
                        let code = error_code(reply.payload);
                        return match code {
                            0 => Ok(()),
                            code => Err(io::Error::from_raw_os_error(code)),
                        };
                    }
                    _ => each(reply.payload),
                }
            }
        }
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let sent = socket::send(self.fd.as_raw_fd(), bytes, MsgFlags::empty())?;
        if sent != bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("netlink sent {sent} of {} bytes", bytes.len()),
            ));
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match socket::recv(self.fd.as_raw_fd(), buf, MsgFlags::empty()) {
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no netlink answer within {RECV_TIMEOUT:?}"),
                    ))
                }
                other => return Ok(other?),
            }
        }
    }

    /// Whether a reply is waiting on the socket.
    fn pending(&self) -> io::Result<bool> {
        let mut byte = [0u8; 1];
        match socket::recv(
            self.fd.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(_) => Ok(true),
            Err(Errno::EAGAIN) => Ok(false),
            Err(errno) => Err(errno.into()),
        }
    }
}
