//! nf_tables over netlink: expressions, rules, chains, sets and the batch (transaction) that
//! carries them, encoded the way `nft` encodes the same rules (so `nft list ruleset` prints
//! them identically).

use std::io;
use std::net::IpAddr;

use nix::errno::Errno;
use nix::sys::socket::SockProtocol;

use super::netlink::{self, Msg, Socket, APPEND, CREATE, REQUEST};

// Attribute numbers of include/uapi/linux/netfilter/nf_tables.h (not in the libc crate).
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
/// nft's datatype ids of `ipv4_addr` / `ipv6_addr` (set key types).
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`: `redirect to :port`.
const NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
/// The register every expression here loads into (`NFT_REG_1`).
const REG: u32 = libc::NFT_REG_1 as u32;

/// The family of every table here: `inet` (IPv4 and IPv6).
const FAMILY: u8 = libc::NFPROTO_INET as u8;

fn msg_type(msg: i32) -> u16 {
    ((libc::NFNL_SUBSYS_NFTABLES as u16) << 8) | msg as u16
}

/// `nfgenmsg` for `family` with the nftables subsystem as resource id.
fn nfgenmsg(family: u8) -> [u8; 4] {
    let res = (libc::NFNL_SUBSYS_NFTABLES as u16).to_be_bytes();
    [family, libc::NFNETLINK_V0 as u8, res[0], res[1]]
}

/// A rule's final decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Accept,
    Jump(&'static str),
}

/// One nf_tables expression, always working on register 1 (`NFT_REG_1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Expr {
    /// `meta load <key> => reg 1`.
    MetaLoad(i32),
    /// `meta set <key> with reg 1`.
    MetaSet(i32),
    /// `ct load <key> => reg 1`.
    CtLoad(i32),
    /// `ct set <key> with reg 1`.
    CtSet(i32),
    /// `payload load <len>b @ <base> + <offset> => reg 1`.
    Payload {
        base: i32,
        offset: u32,
        len: u32,
    },
    /// `cmp <op> reg 1 <data>`.
    Cmp {
        op: i32,
        data: Vec<u8>,
    },
    /// `bitwise reg 1 = (reg 1 & mask) ^ xor`.
    Bitwise {
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// `immediate reg 1 <data>`.
    Immediate(Vec<u8>),
    /// `immediate reg 0 <verdict>`.
    Verdict(Verdict),
    Counter,
    /// `redir proto_min reg 1`.
    Redirect,
    /// `nat snat <family> addr_min reg 1`.
    Snat {
        family: i32,
    },
    /// `lookup reg 1 set <name>`.
    Lookup(&'static str),
}

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::MetaLoad(_) | Expr::MetaSet(_) => "meta",
            Expr::CtLoad(_) | Expr::CtSet(_) => "ct",
            Expr::Payload { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Immediate(_) | Expr::Verdict(_) => "immediate",
            Expr::Counter => "counter",
            Expr::Redirect => "redir",
            Expr::Snat { .. } => "nat",
            Expr::Lookup(_) => "lookup",
        }
    }

    /// Writes `NFTA_EXPR_DATA`'s attributes (numbers from nf_tables.h, per expression).
    fn encode(&self, m: &mut Msg) {
        match self {
            Expr::MetaLoad(key) | Expr::CtLoad(key) => {
                m.put_be32(1, REG).put_be32(2, *key as u32); // DREG, KEY
            }
            Expr::MetaSet(key) => {
                m.put_be32(2, *key as u32).put_be32(3, REG); // KEY, SREG
            }
            Expr::CtSet(key) => {
                m.put_be32(2, *key as u32).put_be32(4, REG); // KEY, SREG
            }
            Expr::Payload { base, offset, len } => {
                m.put_be32(1, REG).put_be32(2, *base as u32); // DREG, BASE
                m.put_be32(3, *offset).put_be32(4, *len); // OFFSET, LEN
            }
            Expr::Cmp { op, data } => {
                m.put_be32(1, REG).put_be32(2, *op as u32); // SREG, OP
                put_value(m, 3, data); // DATA
            }
            Expr::Bitwise { mask, xor } => {
                m.put_be32(1, REG).put_be32(2, REG); // SREG, DREG
                m.put_be32(3, mask.len() as u32); // LEN
                put_value(m, 4, mask); // MASK
                put_value(m, 5, xor); // XOR
            }
            Expr::Immediate(data) => {
                m.put_be32(1, REG); // DREG
                put_value(m, 2, data); // DATA
            }
            Expr::Verdict(verdict) => {
                m.put_be32(1, libc::NFT_REG_VERDICT as u32); // DREG
                let data = m.begin_nest(2); // DATA
                let inner = m.begin_nest(NFTA_DATA_VERDICT);
                match verdict {
                    Verdict::Accept => m.put_be32(NFTA_VERDICT_CODE, libc::NF_ACCEPT as u32),
                    Verdict::Jump(chain) => m
                        .put_be32(NFTA_VERDICT_CODE, libc::NFT_JUMP as u32)
                        .put_str(NFTA_VERDICT_CHAIN, chain),
                };
                m.end_nest(inner);
                m.end_nest(data);
            }
            Expr::Counter => {
                m.put(1, &0u64.to_be_bytes()).put(2, &0u64.to_be_bytes()); // BYTES, PACKETS
            }
            Expr::Redirect => {
                m.put_be32(1, REG).put_be32(3, NAT_RANGE_PROTO_SPECIFIED); // PROTO_MIN, FLAGS
            }
            Expr::Snat { family } => {
                m.put_be32(1, libc::NFT_NAT_SNAT as u32); // TYPE
                m.put_be32(2, *family as u32).put_be32(3, REG); // FAMILY, REG_ADDR_MIN
            }
            Expr::Lookup(set) => {
                m.put_str(1, set).put_be32(2, REG); // SET, SREG
            }
        }
    }
}

/// A nested `NFTA_DATA_VALUE` in attribute `ty`.
fn put_value(m: &mut Msg, ty: u16, data: &[u8]) {
    let nest = m.begin_nest(ty);
    m.put(NFTA_DATA_VALUE, data);
    m.end_nest(nest);
}

/// A base chain's hook: `type <kind> hook <hook> priority <priority>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hook {
    pub(super) kind: &'static str,
    pub(super) hook: i32,
    pub(super) priority: i32,
}

/// Something nftables holds, for error messages.
fn describe(op: &str, table: &str, what: &str) -> String {
    if what.is_empty() {
        format!("{op} inet {table}")
    } else {
        format!("{op} inet {table} {what}")
    }
}

/// An nf_tables transaction: every message between `BATCH_BEGIN` and `BATCH_END` is applied
/// atomically, or none is.
#[derive(Debug, Default)]
pub(super) struct Batch {
    msgs: Vec<Msg>,
    /// What each message in `msgs` does (`add rule inet t c`), for errors.
    ops: Vec<String>,
}

impl Batch {
    fn push(&mut self, msg: Msg, op: String) {
        self.msgs.push(msg);
        self.ops.push(op);
    }

    /// Number of operations so far.
    pub(super) fn len(&self) -> usize {
        self.msgs.len()
    }

    /// `add table inet <table>` (no error when it exists).
    pub(super) fn add_table(&mut self, table: &str) {
        let mut m = Msg::new(
            msg_type(libc::NFT_MSG_NEWTABLE),
            REQUEST | CREATE,
            &nfgenmsg(FAMILY),
        );
        m.put_str(NFTA_TABLE_NAME, table)
            .put_be32(NFTA_TABLE_FLAGS, 0);
        self.push(m, describe("add table", table, ""));
    }

    /// `delete table inet <table>` (an error when it does not exist: add it first).
    pub(super) fn delete_table(&mut self, table: &str) {
        let mut m = Msg::new(msg_type(libc::NFT_MSG_DELTABLE), REQUEST, &nfgenmsg(FAMILY));
        m.put_str(NFTA_TABLE_NAME, table);
        self.push(m, describe("delete table", table, ""));
    }

    /// `flush table inet <table>`: deletes the rules of all its chains (chains and sets stay).
    pub(super) fn flush_table(&mut self, table: &str) {
        let mut m = Msg::new(msg_type(libc::NFT_MSG_DELRULE), REQUEST, &nfgenmsg(FAMILY));
        m.put_str(NFTA_RULE_TABLE, table);
        self.push(m, describe("flush table", table, ""));
    }

    /// `add chain inet <table> <chain> [{ type .. hook .. priority .. ; }]`.
    pub(super) fn add_chain(&mut self, table: &str, chain: &str, hook: Option<Hook>) {
        let mut m = Msg::new(
            msg_type(libc::NFT_MSG_NEWCHAIN),
            REQUEST | CREATE,
            &nfgenmsg(FAMILY),
        );
        m.put_str(NFTA_CHAIN_TABLE, table)
            .put_str(NFTA_CHAIN_NAME, chain);
        if let Some(hook) = hook {
            let nest = m.begin_nest(NFTA_CHAIN_HOOK);
            m.put_be32(NFTA_HOOK_HOOKNUM, hook.hook as u32)
                .put_be32(NFTA_HOOK_PRIORITY, hook.priority as u32);
            m.end_nest(nest);
            m.put_str(NFTA_CHAIN_TYPE, hook.kind);
        }
        self.push(m, describe("add chain", table, chain));
    }

    /// `flush chain inet <table> <chain>`: deletes its rules.
    pub(super) fn flush_chain(&mut self, table: &str, chain: &str) {
        let mut m = Msg::new(msg_type(libc::NFT_MSG_DELRULE), REQUEST, &nfgenmsg(FAMILY));
        m.put_str(NFTA_RULE_TABLE, table)
            .put_str(NFTA_RULE_CHAIN, chain);
        self.push(m, describe("flush chain", table, chain));
    }

    /// `add rule inet <table> <chain> <exprs>` (appended).
    pub(super) fn add_rule(&mut self, table: &str, chain: &str, exprs: &[Expr]) {
        let flags = REQUEST | CREATE | APPEND;
        let mut m = Msg::new(msg_type(libc::NFT_MSG_NEWRULE), flags, &nfgenmsg(FAMILY));
        m.put_str(NFTA_RULE_TABLE, table)
            .put_str(NFTA_RULE_CHAIN, chain);
        let list = m.begin_nest(NFTA_RULE_EXPRESSIONS);
        for expr in exprs {
            let elem = m.begin_nest(NFTA_LIST_ELEM);
            m.put_str(NFTA_EXPR_NAME, expr.name());
            let data = m.begin_nest(NFTA_EXPR_DATA);
            expr.encode(&mut m);
            m.end_nest(data);
            m.end_nest(elem);
        }
        m.end_nest(list);
        self.push(m, describe("add rule", table, chain));
    }

    /// `add set inet <table> <set> { type ipv4_addr|ipv6_addr ; }` (no error when it exists).
    pub(super) fn add_addr_set(&mut self, table: &str, set: &str, ipv6: bool, id: u32) {
        let mut m = Msg::new(
            msg_type(libc::NFT_MSG_NEWSET),
            REQUEST | CREATE,
            &nfgenmsg(FAMILY),
        );
        let (key_type, key_len) = if ipv6 {
            (TYPE_IP6ADDR, 16)
        } else {
            (TYPE_IPADDR, 4)
        };
        m.put_str(NFTA_SET_TABLE, table).put_str(NFTA_SET_NAME, set);
        m.put_be32(NFTA_SET_FLAGS, 0)
            .put_be32(NFTA_SET_KEY_TYPE, key_type);
        m.put_be32(NFTA_SET_KEY_LEN, key_len)
            .put_be32(NFTA_SET_ID, id);
        self.push(m, describe("add set", table, set));
    }

    /// `add element` (`delete: false`) or `delete element` of `addr` in `set`.
    pub(super) fn set_element(&mut self, table: &str, set: &str, addr: IpAddr, delete: bool) {
        let (ty, flags, op) = match delete {
            false => (libc::NFT_MSG_NEWSETELEM, REQUEST | CREATE, "add element"),
            true => (libc::NFT_MSG_DELSETELEM, REQUEST, "delete element"),
        };
        let mut m = Msg::new(msg_type(ty), flags, &nfgenmsg(FAMILY));
        m.put_str(NFTA_SET_ELEM_LIST_TABLE, table);
        m.put_str(NFTA_SET_ELEM_LIST_SET, set);
        let list = m.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
        let elem = m.begin_nest(NFTA_LIST_ELEM);
        put_value(&mut m, NFTA_SET_ELEM_KEY, &addr_bytes(addr));
        m.end_nest(elem);
        m.end_nest(list);
        self.push(m, describe(op, table, &format!("{set} {{ {addr} }}")));
    }

    /// Sends the batch on a new nftables socket of the calling thread's netns. On failure
    /// nothing was applied; the error names the first operation the kernel refused.
    pub(super) fn commit(self) -> Result<(), BatchError> {
        let begin = Msg::new(
            libc::NFNL_MSG_BATCH_BEGIN as u16,
            libc::NLM_F_REQUEST as u16,
            &nfgenmsg(0),
        );
        let end = Msg::new(
            libc::NFNL_MSG_BATCH_END as u16,
            libc::NLM_F_REQUEST as u16,
            &nfgenmsg(0),
        );
        let mut msgs = Vec::with_capacity(self.msgs.len() + 2);
        msgs.push(begin);
        msgs.extend(self.msgs);
        msgs.push(end);
        let io = |source| BatchError {
            op: "send the nftables batch".to_owned(),
            errno: None,
            source,
        };
        let mut socket = Socket::open(SockProtocol::NetlinkNetFilter).map_err(io)?;
        let failures = socket.request(&mut msgs).map_err(io)?;
        match failures.into_iter().min_by_key(|(index, _)| *index) {
            None => Ok(()),
            Some((index, errno)) => {
                let op = match index.checked_sub(1).and_then(|i| self.ops.get(i)) {
                    Some(op) => op.clone(),
                    None => "the nftables batch".to_owned(),
                };
                Err(BatchError {
                    op,
                    errno: Some(errno),
                    source: io::Error::from(errno),
                })
            }
        }
    }
}

/// Why a batch was refused (nothing of it was applied).
#[derive(Debug)]
pub(super) struct BatchError {
    /// The operation refused (`add rule inet istio-ambient-nat istio-output`).
    pub(super) op: String,
    /// The kernel's errno for it, when the kernel answered.
    pub(super) errno: Option<Errno>,
    pub(super) source: io::Error,
}

/// Address bytes in network order.
pub(super) fn addr_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// Number of rules per table (of family inet) in the calling thread's netns.
pub(super) fn rule_counts() -> io::Result<std::collections::HashMap<String, usize>> {
    let mut socket = Socket::open(SockProtocol::NetlinkNetFilter)?;
    let msg = Msg::new(msg_type(libc::NFT_MSG_GETRULE), 0, &nfgenmsg(FAMILY));
    let mut counts = std::collections::HashMap::new();
    socket.dump(msg, |payload| {
        let table = netlink::attrs(payload, 4)
            .find(|(ty, _)| *ty == NFTA_RULE_TABLE)
            .map(|(_, value)| netlink::attr_str(value).to_owned());
        if let Some(table) = table {
            *counts.entry(table).or_insert(0) += 1;
        }
    })?;
    Ok(counts)
}

// Building blocks, one per `nft` match, expanded exactly as `nft` expands them.

/// `meta l4proto <proto>`.
pub(super) fn l4proto(proto: u8) -> Vec<Expr> {
    vec![
        Expr::MetaLoad(libc::NFT_META_L4PROTO),
        cmp(libc::NFT_CMP_EQ, &[proto]),
    ]
}

/// `ip saddr|daddr <op> <addr>` (`ip6` for an IPv6 address): `source` picks saddr.
pub(super) fn addr(source: bool, op: i32, addr: IpAddr) -> Vec<Expr> {
    let (nfproto, offset) = match (addr, source) {
        (IpAddr::V4(_), true) => (libc::NFPROTO_IPV4, 12),
        (IpAddr::V4(_), false) => (libc::NFPROTO_IPV4, 16),
        (IpAddr::V6(_), true) => (libc::NFPROTO_IPV6, 8),
        (IpAddr::V6(_), false) => (libc::NFPROTO_IPV6, 24),
    };
    let bytes = addr_bytes(addr);
    vec![
        Expr::MetaLoad(libc::NFT_META_NFPROTO),
        cmp(libc::NFT_CMP_EQ, &[nfproto as u8]),
        Expr::Payload {
            base: libc::NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            len: bytes.len() as u32,
        },
        cmp(op, &bytes),
    ]
}

/// `ip daddr @<set>` (`ip6` when `ipv6`).
pub(super) fn daddr_in(set: &'static str, ipv6: bool) -> Vec<Expr> {
    let (nfproto, offset, len) = match ipv6 {
        false => (libc::NFPROTO_IPV4, 16, 4),
        true => (libc::NFPROTO_IPV6, 24, 16),
    };
    vec![
        Expr::MetaLoad(libc::NFT_META_NFPROTO),
        cmp(libc::NFT_CMP_EQ, &[nfproto as u8]),
        Expr::Payload {
            base: libc::NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            len,
        },
        Expr::Lookup(set),
    ]
}

/// `tcp|udp sport|dport <op> <port>`.
pub(super) fn port(proto: u8, source: bool, op: i32, port: u16) -> Vec<Expr> {
    let mut exprs = l4proto(proto);
    exprs.push(Expr::Payload {
        base: libc::NFT_PAYLOAD_TRANSPORT_HEADER,
        offset: if source { 0 } else { 2 },
        len: 2,
    });
    exprs.push(cmp(op, &port.to_be_bytes()));
    exprs
}

/// `meta mark and <mask> <op> <value>` (`ct mark` when `ct`).
pub(super) fn mark(ct: bool, mask: u32, op: i32, value: u32) -> Vec<Expr> {
    let load = match ct {
        true => Expr::CtLoad(libc::NFT_CT_MARK),
        false => Expr::MetaLoad(libc::NFT_META_MARK),
    };
    vec![load, and_or(mask, 0), cmp(op, &value.to_ne_bytes())]
}

/// `oifname <op> <name>`.
pub(super) fn oifname(op: i32, name: &str) -> Vec<Expr> {
    let mut bytes = [0u8; libc::IFNAMSIZ];
    let len = name.len().min(libc::IFNAMSIZ - 1);
    bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
    vec![Expr::MetaLoad(libc::NFT_META_OIFNAME), cmp(op, &bytes)]
}

/// `reg 1 = (reg 1 & mask) ^ xor` on a 32-bit host-order value.
pub(super) fn and_or(mask: u32, xor: u32) -> Expr {
    Expr::Bitwise {
        mask: mask.to_ne_bytes().to_vec(),
        xor: xor.to_ne_bytes().to_vec(),
    }
}

pub(super) fn cmp(op: i32, data: &[u8]) -> Expr {
    Expr::Cmp {
        op,
        data: data.to_vec(),
    }
}

/// `counter redirect to :<port>`.
pub(super) fn redirect(to: u16) -> Vec<Expr> {
    vec![
        Expr::Counter,
        Expr::Immediate(to.to_be_bytes().to_vec()),
        Expr::Redirect,
    ]
}

/// `counter accept`.
pub(super) fn accept() -> Vec<Expr> {
    vec![Expr::Counter, Expr::Verdict(Verdict::Accept)]
}
