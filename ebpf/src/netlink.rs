//! A minimal synchronous rtnetlink client: build a request (fixed header + attributes), send
//! it, wait for its ack or collect a dump. Enough for links, qdiscs, filters, rules, routes.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    self, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};
use nix::sys::time::{TimeVal, TimeValLike};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
/// With `NLM_F_CREATE` on a new object: replace an existing one.
pub(crate) const NLM_F_REPLACE: u16 = 0x100;
/// Fail when the object exists.
pub(crate) const NLM_F_EXCL: u16 = 0x200;
/// Create the object when it does not exist.
pub(crate) const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
const RECV_BUFFER: usize = 64 * 1024;

/// A `NETLINK_ROUTE` socket in the calling thread's network namespace.
pub(crate) struct Netlink {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

/// One request: `nlmsghdr`, the family header, attributes.
pub(crate) struct Request {
    buf: Vec<u8>,
}

impl Request {
    /// A request of type `ty` (`RTM_*`) with `flags` besides `NLM_F_REQUEST`.
    pub(crate) fn new(ty: u16, flags: u16) -> Self {
        let mut buf = vec![0u8; NLMSG_HDRLEN];
        buf[4..6].copy_from_slice(&ty.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        Request { buf }
    }

    /// Appends a family header (`tcmsg`, `rtmsg`, ...) already in native byte order.
    pub(crate) fn header(mut self, bytes: &[u8]) -> Self {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    pub(crate) fn attr(mut self, ty: u16, data: &[u8]) -> Self {
        self.push_attr(ty, data);
        self
    }

    pub(crate) fn attr_u32(self, ty: u16, value: u32) -> Self {
        self.attr(ty, &value.to_ne_bytes())
    }

    /// A NUL-terminated string attribute.
    pub(crate) fn attr_str(self, ty: u16, value: &str) -> Self {
        let mut data = value.as_bytes().to_vec();
        data.push(0);
        self.attr(ty, &data)
    }

    /// A nested attribute holding what `build` appends.
    pub(crate) fn nested(mut self, ty: u16, build: impl FnOnce(Self) -> Self) -> Self {
        let start = self.buf.len();
        self.push_attr(ty | NLA_F_NESTED, &[]);
        let mut this = build(self);
        let len = u16::try_from(this.buf.len() - start).unwrap_or(u16::MAX);
        this.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        this
    }

    fn push_attr(&mut self, ty: u16, data: &[u8]) {
        let len = u16::try_from(4 + data.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn with_flags(mut self, flags: u16) -> Self {
        let flags = read_u16(&self.buf, 6) | flags;
        self.buf[6..8].copy_from_slice(&flags.to_ne_bytes());
        self
    }

    fn pad(&mut self) {
        self.buf.resize(align(self.buf.len()), 0);
    }

    fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

impl Netlink {
    pub(crate) fn open() -> io::Result<Self> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        // A lost answer must not hang enrollment forever.
        socket::setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::seconds(10))?;
        Ok(Netlink {
            fd,
            seq: 0,
            buf: vec![0; RECV_BUFFER],
        })
    }

    /// Sends `request` with `NLM_F_ACK` and waits for the kernel's answer.
    pub(crate) fn ack(&mut self, request: Request) -> io::Result<()> {
        self.exchange(request.with_flags(NLM_F_ACK), |_, _| {})
    }

    /// Sends `request` as a dump and returns the payload of every answer of type `ty`.
    pub(crate) fn dump(&mut self, request: Request, ty: u16) -> io::Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        self.exchange(request.with_flags(NLM_F_DUMP), |msg_ty, payload| {
            if msg_ty == ty {
                out.push(payload.to_vec());
            }
        })?;
        Ok(out)
    }

    /// Sends one request and reads answers until its ack, error or end of dump.
    fn exchange(&mut self, request: Request, mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = request.finish(seq);
        socket::send(self.fd.as_raw_fd(), &bytes, MsgFlags::empty())?;
        loop {
            let len = socket::recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty())?;
            let mut data = &self.buf[..len];
            while data.len() >= NLMSG_HDRLEN {
                let msg_len = read_u32(data, 0) as usize;
                if msg_len < NLMSG_HDRLEN || msg_len > data.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "truncated netlink message",
                    ));
                }
                let (ty, flags, msg_seq) =
                    (read_u16(data, 4), read_u16(data, 6), read_u32(data, 8));
                let payload = &data[NLMSG_HDRLEN..msg_len];
                data = &data[align(msg_len).min(data.len())..];
                if msg_seq != seq {
                    continue;
                }
                match ty {
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(
                            payload
                                .get(..4)
                                .and_then(|b| b.try_into().ok())
                                .unwrap_or([0; 4]),
                        );
                        return match errno {
                            0 => Ok(()),
                            errno => Err(io::Error::from_raw_os_error(-errno)),
                        };
                    }
                    NLMSG_DONE => return Ok(()),
                    _ => each(ty, payload),
                }
                if flags & NLM_F_MULTI == 0 {
                    // A single answer without ack (not requested): done.
                    return Ok(());
                }
            }
        }
    }
}

/// The attributes of a message body, after its `header_len`-byte family header.
pub(crate) fn attrs(payload: &[u8], header_len: usize) -> Attrs<'_> {
    Attrs {
        data: payload.get(align(header_len)..).unwrap_or_default(),
    }
}

/// Iterator over `(type without flags, data)`.
pub(crate) struct Attrs<'a> {
    data: &'a [u8],
}

impl<'a> Iterator for Attrs<'a> {
    type Item = (u16, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.data.len() < 4 {
            return None;
        }
        let len = usize::from(read_u16(self.data, 0));
        let ty = read_u16(self.data, 2) & !NLA_F_NESTED & 0x3fff;
        if len < 4 || len > self.data.len() {
            return None;
        }
        let value = &self.data[4..len];
        self.data = &self.data[align(len).min(self.data.len())..];
        Some((ty, value))
    }
}

/// A NUL-terminated string attribute.
pub(crate) fn attr_string(data: &[u8]) -> String {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

pub(crate) fn attr_u32(data: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(..4)?.try_into().ok()?))
}

pub(crate) fn read_u16(data: &[u8], at: usize) -> u16 {
    data.get(at..at + 2)
        .and_then(|b| b.try_into().ok())
        .map(u16::from_ne_bytes)
        .unwrap_or(0)
}

pub(crate) fn read_u32(data: &[u8], at: usize) -> u32 {
    data.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .unwrap_or(0)
}

fn align(len: usize) -> usize {
    (len + 3) & !3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_aligned_and_nested_lengths_cover_children() {
        let request = Request::new(44, NLM_F_CREATE)
            .header(&[1, 2, 3])
            .attr_str(1, "bpf")
            .nested(2, |r| r.attr_u32(6, 7).attr_str(7, "x"));
        let bytes = request.finish(9);
        assert_eq!(read_u32(&bytes, 0) as usize, bytes.len());
        assert_eq!(read_u16(&bytes, 6), NLM_F_CREATE | NLM_F_REQUEST);
        assert_eq!(read_u32(&bytes, 8), 9);
        let body = &bytes[NLMSG_HDRLEN..];
        let top: Vec<_> = attrs(body, 3).collect();
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].0, attr_string(top[0].1).as_str()), (1, "bpf"));
        assert_eq!(top[1].0, 2, "nested flag stripped");
        let inner: Vec<_> = attrs(top[1].1, 0).collect();
        assert_eq!(inner.len(), 2);
        assert_eq!(attr_u32(inner[0].1), Some(7));
        assert_eq!(attr_string(inner[1].1), "x");
    }
}
