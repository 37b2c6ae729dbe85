//! The nf_tables model of the capture rules: expressions, rules, chains, sets and the
//! transaction that carries them, built the way `nft` builds the same rules (so `nft list
//! ruleset` prints them identically). [`crate::batch`] turns a transaction into libnftnl
//! objects and sends it; [`crate::dump`] reads rules back.

use std::io;
use std::net::IpAddr;

use nix::errno::Errno;

/// A rule's final decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    /// Back to the calling chain (or the base chain's policy).
    Return,
    Jump(&'static str),
}

/// `meta` keys the rules read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaKey {
    L4Proto,
    NfProto,
    Mark,
    IifName,
    OifName,
    SkUid,
    SkGid,
}

/// `ct` keys the rules read or set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtKey {
    Mark,
    Zone,
}

/// Where a payload load starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    Network,
    Transport,
}

/// Comparison operators the rules use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Neq,
}

/// One nf_tables expression, always working on register 1 (`NFT_REG_1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// `meta load <key> => reg 1`.
    MetaLoad(MetaKey),
    /// `meta set mark with reg 1`.
    MetaSetMark,
    /// `ct load <key> => reg 1`.
    CtLoad(CtKey),
    /// `ct set <key> with reg 1`.
    CtSet(CtKey),
    /// `payload load <len>b @ <base> + <offset> => reg 1`.
    Payload {
        base: Base,
        offset: u32,
        len: u32,
    },
    /// `cmp <op> reg 1 <data>`.
    Cmp {
        op: Op,
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
    /// `nat snat ip|ip6 addr_min reg 1`.
    Snat {
        ipv6: bool,
    },
    /// `lookup reg 1 set <name>`.
    Lookup(&'static str),
}

/// A base chain's hook: `type <kind> hook <hook> priority <priority>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hook {
    pub kind: ChainKind,
    pub hook: HookPoint,
    pub priority: i32,
}

/// A base chain's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainKind {
    Filter,
    Nat,
    Route,
}

/// Where a base chain hooks in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookPoint {
    Prerouting,
    Output,
    Postrouting,
}

/// One operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    AddTable(&'static str),
    DeleteTable(&'static str),
    /// Deletes the rules of every chain of the table.
    FlushTable(&'static str),
    AddChain {
        table: &'static str,
        chain: &'static str,
        hook: Option<Hook>,
    },
    FlushChain {
        table: &'static str,
        chain: &'static str,
    },
    AddRule {
        table: &'static str,
        chain: &'static str,
        exprs: Vec<Expr>,
    },
    /// A named set of addresses, with the id the transaction refers to it by.
    AddAddrSet {
        table: &'static str,
        set: &'static str,
        ipv6: bool,
        id: u32,
    },
    Element {
        table: &'static str,
        set: &'static str,
        addr: IpAddr,
        delete: bool,
    },
}

impl Operation {
    /// What `nft` would call it, for errors (`add rule inet istio-ambient-nat istio-output`).
    pub fn describe(&self) -> String {
        match self {
            Operation::AddTable(table) => format!("add table inet {table}"),
            Operation::DeleteTable(table) => format!("delete table inet {table}"),
            Operation::FlushTable(table) => format!("flush table inet {table}"),
            Operation::AddChain { table, chain, .. } => format!("add chain inet {table} {chain}"),
            Operation::FlushChain { table, chain } => format!("flush chain inet {table} {chain}"),
            Operation::AddRule { table, chain, .. } => format!("add rule inet {table} {chain}"),
            Operation::AddAddrSet { table, set, .. } => format!("add set inet {table} {set}"),
            Operation::Element {
                table,
                set,
                addr,
                delete,
            } => {
                let op = if *delete { "delete" } else { "add" };
                format!("{op} element inet {table} {set} {{ {addr} }}")
            }
        }
    }
}

/// An nf_tables transaction: every operation is applied atomically, or none is
/// ([`crate::batch::commit`] sends it through libnftnl).
#[derive(Debug, Default)]
pub struct Batch {
    pub operations: Vec<Operation>,
}

impl Batch {
    /// Number of operations so far.
    pub fn len(&self) -> usize {
        self.operations.len()
    }

    /// Whether the batch has no operation yet.
    pub fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }

    /// `add table inet <table>` (no error when it exists).
    pub fn add_table(&mut self, table: &'static str) {
        self.operations.push(Operation::AddTable(table));
    }

    /// `delete table inet <table>` (an error when it does not exist: add it first).
    pub fn delete_table(&mut self, table: &'static str) {
        self.operations.push(Operation::DeleteTable(table));
    }

    /// `flush table inet <table>`: deletes the rules of all its chains (chains and sets stay).
    pub fn flush_table(&mut self, table: &'static str) {
        self.operations.push(Operation::FlushTable(table));
    }

    /// `add chain inet <table> <chain> [{ type .. hook .. priority .. ; }]`.
    pub fn add_chain(&mut self, table: &'static str, chain: &'static str, hook: Option<Hook>) {
        self.operations
            .push(Operation::AddChain { table, chain, hook });
    }

    /// `flush chain inet <table> <chain>`: deletes its rules.
    pub fn flush_chain(&mut self, table: &'static str, chain: &'static str) {
        self.operations.push(Operation::FlushChain { table, chain });
    }

    /// `add rule inet <table> <chain> <exprs>` (appended).
    pub fn add_rule(&mut self, table: &'static str, chain: &'static str, exprs: &[Expr]) {
        self.operations.push(Operation::AddRule {
            table,
            chain,
            exprs: exprs.to_vec(),
        });
    }

    /// `add set inet <table> <set> { type ipv4_addr|ipv6_addr ; }` (no error when it exists).
    pub fn add_addr_set(&mut self, table: &'static str, set: &'static str, ipv6: bool, id: u32) {
        self.operations.push(Operation::AddAddrSet {
            table,
            set,
            ipv6,
            id,
        });
    }

    /// `add element` (`delete: false`, an error when present) or `delete element` (an error
    /// when absent) of `addr` in `set`.
    pub fn set_element(
        &mut self,
        table: &'static str,
        set: &'static str,
        addr: IpAddr,
        delete: bool,
    ) {
        self.operations.push(Operation::Element {
            table,
            set,
            addr,
            delete,
        });
    }

    /// Sends the batch on a new nftables socket of the calling thread's netns. On failure
    /// nothing was applied; the error names the first operation the kernel refused.
    pub fn commit(self) -> Result<(), BatchError> {
        crate::batch::commit(&self.operations)
    }
}

/// Why a batch was refused (nothing of it was applied).
#[derive(Debug, thiserror::Error)]
#[error("nftables refused `{op}`: {source}")]
pub struct BatchError {
    /// The operation refused (`add rule inet istio-ambient-nat istio-output`).
    pub op: String,
    /// The kernel's errno for it, when the kernel answered.
    pub errno: Option<Errno>,
    #[source]
    pub source: io::Error,
}

/// Address bytes in network order.
pub fn addr_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

// Building blocks, one per `nft` match, expanded exactly as `nft` expands them.

/// `meta l4proto <proto>`.
pub fn l4proto(proto: u8) -> Vec<Expr> {
    vec![Expr::MetaLoad(MetaKey::L4Proto), cmp(Op::Eq, &[proto])]
}

/// `ip saddr|daddr <op> <addr>` (`ip6` for an IPv6 address): `source` picks saddr.
pub fn addr(source: bool, op: Op, addr: IpAddr) -> Vec<Expr> {
    let (nfproto, offset, _) = family_field(addr, source);
    let bytes = addr_bytes(addr);
    vec![
        Expr::MetaLoad(MetaKey::NfProto),
        cmp(Op::Eq, &[nfproto]),
        Expr::Payload {
            base: Base::Network,
            offset,
            len: bytes.len() as u32,
        },
        cmp(op, &bytes),
    ]
}

/// `ip daddr @<set>` (`ip6` when `ipv6`).
pub fn daddr_in(set: &'static str, ipv6: bool) -> Vec<Expr> {
    let (nfproto, offset, len) = match ipv6 {
        false => (libc::NFPROTO_IPV4, 16, 4),
        true => (libc::NFPROTO_IPV6, 24, 16),
    };
    vec![
        Expr::MetaLoad(MetaKey::NfProto),
        cmp(Op::Eq, &[nfproto as u8]),
        Expr::Payload {
            base: Base::Network,
            offset,
            len,
        },
        Expr::Lookup(set),
    ]
}

/// `tcp|udp sport|dport <op> <port>`.
pub fn port(proto: u8, source: bool, op: Op, port: u16) -> Vec<Expr> {
    let mut exprs = l4proto(proto);
    exprs.push(Expr::Payload {
        base: Base::Transport,
        offset: if source { 0 } else { 2 },
        len: 2,
    });
    exprs.push(cmp(op, &port.to_be_bytes()));
    exprs
}

/// `meta mark and <mask> <op> <value>` (`ct mark` when `ct`).
pub fn mark(ct: bool, mask: u32, op: Op, value: u32) -> Vec<Expr> {
    let load = match ct {
        true => Expr::CtLoad(CtKey::Mark),
        false => Expr::MetaLoad(MetaKey::Mark),
    };
    vec![load, and_or(mask, 0), cmp(op, &value.to_ne_bytes())]
}

/// `oifname <op> <name>`.
pub fn oifname(op: Op, name: &str) -> Vec<Expr> {
    ifname(MetaKey::OifName, op, name)
}

/// `iifname <op> <name>`.
pub fn iifname(op: Op, name: &str) -> Vec<Expr> {
    ifname(MetaKey::IifName, op, name)
}

fn ifname(key: MetaKey, op: Op, name: &str) -> Vec<Expr> {
    let mut bytes = [0u8; libc::IFNAMSIZ];
    let len = name.len().min(libc::IFNAMSIZ - 1);
    bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
    vec![Expr::MetaLoad(key), cmp(op, &bytes)]
}

/// `meta skuid <op> <uid>`, or `meta skgid` when `group`.
pub fn owner(group: bool, op: Op, id: u32) -> Vec<Expr> {
    let key = if group {
        MetaKey::SkGid
    } else {
        MetaKey::SkUid
    };
    vec![Expr::MetaLoad(key), cmp(op, &id.to_ne_bytes())]
}

/// `ip saddr|daddr <op> <net>/<prefix_len>` (`ip6` for an IPv6 network), expanded as `nft`
/// expands it: a whole-address compare for a host prefix, a load of the covered bytes for a
/// prefix that ends on a byte, otherwise the whole address masked (`/0` included, whose mask
/// is all zeros: every address of the family, `!=` none). A prefix longer than the address
/// is clamped to a host prefix.
pub fn prefix(source: bool, op: Op, net: IpAddr, prefix_len: u8) -> Vec<Expr> {
    let (nfproto, offset, bits) = family_field(net, source);
    let prefix_len = u32::from(prefix_len).min(bits);
    if prefix_len == bits {
        return addr(source, op, net);
    }
    let bytes = addr_bytes(net);
    let mask: Vec<u8> = (0..bytes.len() as u32)
        .map(|i| {
            let on = prefix_len.saturating_sub(i * 8).min(8);
            (0xffu16 << (8 - on)) as u8
        })
        .collect();
    let masked: Vec<u8> = bytes.iter().zip(&mask).map(|(b, m)| b & m).collect();
    let byte_aligned = prefix_len % 8 == 0 && prefix_len > 0;
    let len = match byte_aligned {
        true => (prefix_len / 8) as usize,
        false => bytes.len(),
    };
    let mut exprs = vec![
        Expr::MetaLoad(MetaKey::NfProto),
        cmp(Op::Eq, &[nfproto]),
        Expr::Payload {
            base: Base::Network,
            offset,
            len: len as u32,
        },
    ];
    if !byte_aligned {
        exprs.push(Expr::Bitwise {
            mask: mask.clone(),
            xor: vec![0; len],
        });
    }
    exprs.push(cmp(op, &masked[..len]));
    exprs
}

/// The family number, the address field's offset and the address width of `addr`'s family.
fn family_field(addr: IpAddr, source: bool) -> (u8, u32, u32) {
    match (addr, source) {
        (IpAddr::V4(_), true) => (libc::NFPROTO_IPV4 as u8, 12, 32),
        (IpAddr::V4(_), false) => (libc::NFPROTO_IPV4 as u8, 16, 32),
        (IpAddr::V6(_), true) => (libc::NFPROTO_IPV6 as u8, 8, 128),
        (IpAddr::V6(_), false) => (libc::NFPROTO_IPV6 as u8, 24, 128),
    }
}

/// `reg 1 = (reg 1 & mask) ^ xor` on a 32-bit host-order value.
pub fn and_or(mask: u32, xor: u32) -> Expr {
    Expr::Bitwise {
        mask: mask.to_ne_bytes().to_vec(),
        xor: xor.to_ne_bytes().to_vec(),
    }
}

pub fn cmp(op: Op, data: &[u8]) -> Expr {
    Expr::Cmp {
        op,
        data: data.to_vec(),
    }
}

/// `counter redirect to :<port>`.
pub fn redirect(to: u16) -> Vec<Expr> {
    vec![
        Expr::Counter,
        Expr::Immediate(to.to_be_bytes().to_vec()),
        Expr::Redirect,
    ]
}

/// `counter accept`.
pub fn accept() -> Vec<Expr> {
    vec![Expr::Counter, Expr::Verdict(Verdict::Accept)]
}

/// `counter return`.
pub fn ret() -> Vec<Expr> {
    vec![Expr::Counter, Expr::Verdict(Verdict::Return)]
}

/// `counter jump <chain>`.
pub fn jump(chain: &'static str) -> Vec<Expr> {
    vec![Expr::Counter, Expr::Verdict(Verdict::Jump(chain))]
}
