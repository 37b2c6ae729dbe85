//! Sending an nf_tables transaction through libnftnl (the `nftnl` crate): every operation of
//! a [`Batch`](crate::model::Batch) becomes an `nftnl` table, chain, rule, set or set-element
//! message between the batch's begin and end, the finalized batch goes to the kernel in one
//! datagram on a `NETLINK_NETFILTER` socket of the calling thread's netns, and the kernel's
//! answers are matched to operations by sequence number.
//!
//! Two expressions `nft` uses have no `nftnl` type (`redir` and `ct zone set`), nor does
//! immediate data of any length or a whole-table flush: the small `unsafe` blocks below fill
//! libnftnl objects for those with the library's own setters.

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ptr::NonNull;
use std::time::Duration;

use mesh_capture::framing;
use netlink_packet_core::{ErrorBuffer, NLMSG_ERROR};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};
use nftnl::expr::{
    Bitwise, Cmp, CmpOp, Conntrack, Counter, Expression, Lookup, Meta, Nat, NatType,
    NetworkHeaderField, Payload, Register, TransportHeaderField,
};
use nftnl::nftnl_sys as sys;
use nftnl::set::{Set, SetKey};
use nftnl::{Chain, ChainType, FinalizedBatch, MsgType, NlMsg, ProtoFamily, Rule, Table};
use nix::errno::Errno;

use crate::model::{
    Base, BatchError, ChainKind, CtKey, Expr, HookPoint, MetaKey, Op, Operation, Verdict,
};

/// How long the kernel may take to answer a batch (it answers at once).
const RECV_TIMEOUT: Duration = Duration::from_secs(5);
const RECV_BUFFER: usize = 64 * 1024;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`: `redirect to :port`.
const NAT_RANGE_PROTO_SPECIFIED: u32 = 2;

/// Applies `operations` atomically in the calling thread's netns.
pub fn commit(operations: &[Operation]) -> Result<(), BatchError> {
    let batch = encode(operations)?;
    let mut datagram = Vec::new();
    for part in &batch {
        datagram.extend_from_slice(part);
    }
    let seqs = batch.sequence_numbers();
    // With acks for begin and end (kernels >= 6.10) the range has two more numbers; every
    // operation is exactly one message.
    debug_assert!(
        seqs.len() == operations.len() || seqs.len() == operations.len() + 2,
        "{} sequence numbers for {} operations",
        seqs.len(),
        operations.len()
    );
    let first = seqs.start + (seqs.len() as u32).saturating_sub(operations.len() as u32) / 2;
    let io = |source| BatchError {
        op: "send the nftables batch".to_owned(),
        errno: None,
        source,
    };
    let socket = open().map_err(io)?;
    socket.send(&datagram, 0).map_err(io)?;
    let failures = collect_answers(&socket, seqs).map_err(io)?;
    match first_failure(&failures, first, operations.len()) {
        None => Ok(()),
        Some((index, errno)) => {
            let op = index
                .and_then(|index| operations.get(index))
                .map_or_else(|| "the nftables batch".to_owned(), Operation::describe);
            Err(BatchError {
                op,
                errno: Some(errno),
                source: errno.into(),
            })
        }
    }
}

/// The failure to report: the first failing operation (its index) when one failed, else any
/// error outside the operations' numbers (the begin or end message, a failed commit), which
/// names the batch as a whole (`None`).
pub fn first_failure(
    failures: &[(u32, Errno)],
    first: u32,
    operations: usize,
) -> Option<(Option<usize>, Errno)> {
    let index = |seq: u32| {
        seq.checked_sub(first)
            .map(|index| index as usize)
            .filter(|&index| index < operations)
    };
    failures
        .iter()
        .filter_map(|&(seq, errno)| Some((index(seq)?, errno)))
        .min_by_key(|&(index, _)| index)
        .map(|(index, errno)| (Some(index), errno))
        .or_else(|| failures.first().map(|&(_, errno)| (None, errno)))
}

/// A `NETLINK_NETFILTER` socket with a receive timeout.
pub fn open() -> io::Result<Socket> {
    framing::socket(NETLINK_NETFILTER, RECV_TIMEOUT)
}

/// Reads answers until every message of `seqs` was answered, or an error came and nothing
/// more is queued (a refused batch may be answered with its errors only).
fn collect_answers(socket: &Socket, seqs: std::ops::Range<u32>) -> io::Result<Vec<(u32, Errno)>> {
    let mut answered = 0;
    let mut failures = Vec::new();
    let mut buf = vec![0u8; RECV_BUFFER];
    while answered < seqs.len() {
        let len = recv(socket, &mut buf, 0)?;
        for (seq, code) in acks(buf.get(..len).unwrap_or_default())? {
            // The socket is ours alone, so every error is this batch's, whatever its number:
            // kernels before 6.10 answer up-front refusals (EPERM, EOPNOTSUPP) and a failed
            // commit phase against the begin message, which has number 0 there.
            if let Some(errno) = code {
                failures.push((seq, errno));
            }
            if seqs.contains(&seq) {
                answered += 1;
            }
        }
        if !failures.is_empty()
            && recv(socket, &mut buf[..1], libc::MSG_PEEK | libc::MSG_DONTWAIT).is_err()
        {
            break;
        }
    }
    Ok(failures)
}

fn recv(socket: &Socket, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    loop {
        match socket.recv(&mut &mut buf[..], flags) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock && flags == 0 => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no nftables answer within {RECV_TIMEOUT:?}"),
                ))
            }
            other => return other,
        }
    }
}

/// The `NLMSG_ERROR` answers of a datagram: sequence number and errno (`None` for an ack).
/// Other messages are skipped; a malformed datagram is an error naming the offset.
pub fn acks(datagram: &[u8]) -> io::Result<Vec<(u32, Option<Errno>)>> {
    let malformed = |offset: usize, what: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("nftables answer at byte {offset}: {what}"),
        )
    };
    let mut out = Vec::new();
    for message in framing::messages(datagram) {
        let (offset, message) = message.map_err(|bad| malformed(bad.offset, bad.reason))?;
        if message.message_type() == NLMSG_ERROR {
            let error = ErrorBuffer::new_checked(message.payload())
                .map_err(|error| malformed(offset, error.to_string()))?;
            let code = error
                .code()
                .map(|code| Errno::from_raw(code.get().saturating_abs()));
            out.push((message.sequence_number(), code));
        }
    }
    Ok(out)
}

/// The libnftnl objects of one transaction, kept alive while the batch is built.
fn encode(operations: &[Operation]) -> Result<FinalizedBatch, BatchError> {
    let name = |value: &str| {
        CString::new(value).map_err(|_| BatchError {
            op: format!("name {value:?}"),
            errno: None,
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                "a NUL byte in an nftables name",
            ),
        })
    };
    // Tables and chains first: rules and sets borrow them.
    let mut tables = HashMap::new();
    let mut chains = HashMap::new();
    for operation in operations {
        let (table, chain) = match operation {
            Operation::AddTable(table)
            | Operation::DeleteTable(table)
            | Operation::FlushTable(table) => (*table, None),
            Operation::AddChain { table, chain, .. }
            | Operation::FlushChain { table, chain }
            | Operation::AddRule { table, chain, .. } => (*table, Some(*chain)),
            Operation::AddAddrSet { table, .. } | Operation::Element { table, .. } => {
                (*table, None)
            }
        };
        if !tables.contains_key(table) {
            tables.insert(table, Table::new(&name(table)?, ProtoFamily::Inet));
        }
        if let Some(chain) = chain {
            chains.entry((table, chain)).or_insert(name(chain)?);
        }
    }
    let chains: HashMap<_, _> = chains
        .into_iter()
        .map(|((table, chain), cname)| ((table, chain), Chain::new(&cname, &tables[table])))
        .collect();
    let mut set_ids = HashMap::new();
    for operation in operations {
        if let Operation::AddAddrSet { table, set, id, .. } = operation {
            set_ids.insert((*table, *set), *id);
        }
    }

    let mut batch = nftnl::Batch::new();
    for operation in operations {
        match operation {
            Operation::AddTable(table) => batch.add(&tables[table], MsgType::Add),
            Operation::DeleteTable(table) => batch.add(&tables[table], MsgType::Del),
            Operation::FlushTable(table) => batch.add(&TableRules(&tables[table]), MsgType::Del),
            Operation::AddChain { table, chain, hook } => {
                let mut added = Chain::new(chains[&(*table, *chain)].get_name(), &tables[table]);
                if let Some(hook) = hook {
                    added.set_hook(hook_point(hook.hook), hook.priority);
                    added.set_type(chain_type(hook.kind));
                }
                batch.add(&added, MsgType::Add);
            }
            Operation::FlushChain { table, chain } => {
                batch.add(&Rule::new(&chains[&(*table, *chain)]), MsgType::Del);
            }
            Operation::AddRule {
                table,
                chain,
                exprs,
            } => {
                let mut rule = Rule::new(&chains[&(*table, *chain)]);
                for expr in exprs {
                    add_expr(&mut rule, expr, &tables[table], &set_ids, &name)?;
                }
                batch.add(&rule, MsgType::Add);
            }
            Operation::AddAddrSet {
                table,
                set,
                ipv6,
                id,
            } => {
                let set_name = name(set)?;
                let table = &tables[table];
                if *ipv6 {
                    add_set::<Ipv6Addr>(&mut batch, &set_name, *id, table);
                } else {
                    add_set::<Ipv4Addr>(&mut batch, &set_name, *id, table);
                }
            }
            Operation::Element {
                table,
                set,
                addr,
                delete,
            } => {
                let set_name = name(set)?;
                let id = set_ids.get(&(*table, *set)).copied().unwrap_or(0);
                let kind = if *delete { MsgType::Del } else { MsgType::Add };
                let table = &tables[table];
                match addr {
                    IpAddr::V4(v4) => element(&mut batch, &set_name, id, table, v4, kind),
                    IpAddr::V6(v6) => element(&mut batch, &set_name, id, table, v6, kind),
                }
            }
        }
    }
    Ok(batch.finalize())
}

/// `add set` of the named address set `name` with key type `K` (no error when it exists).
fn add_set<K: SetKey>(batch: &mut nftnl::Batch, name: &CStr, id: u32, table: &Table) {
    let set = Set::<K>::new_named(name, id, table, ProtoFamily::Inet);
    batch.add(&set, MsgType::Add);
}

/// Adds (`MsgType::Add`) or deletes (`MsgType::Del`) the element `key` of set `name`.
fn element<K: SetKey>(
    batch: &mut nftnl::Batch,
    name: &CStr,
    id: u32,
    table: &Table,
    key: &K,
    kind: MsgType,
) {
    let mut elements = Set::new_named(name, id, table, ProtoFamily::Inet);
    elements.add(key);
    batch.add_iter(elements.elems_iter(), kind);
}

fn hook_point(point: HookPoint) -> nftnl::Hook {
    match point {
        HookPoint::Prerouting => nftnl::Hook::PreRouting,
        HookPoint::Output => nftnl::Hook::Out,
        HookPoint::Postrouting => nftnl::Hook::PostRouting,
    }
}

fn chain_type(kind: ChainKind) -> ChainType {
    match kind {
        ChainKind::Filter => ChainType::Filter,
        ChainKind::Nat => ChainType::Nat,
        ChainKind::Route => ChainType::Route,
    }
}

fn meta(key: MetaKey) -> Meta {
    match key {
        MetaKey::L4Proto => Meta::L4Proto,
        MetaKey::NfProto => Meta::NfProto,
        MetaKey::Mark => Meta::Mark { set: false },
        MetaKey::IifName => Meta::IifName,
        MetaKey::OifName => Meta::OifName,
        MetaKey::SkUid => Meta::SkUid,
        MetaKey::SkGid => Meta::SkGid,
    }
}

/// The longest value an expression may carry: one register (`NFT_REG_SIZE`). libnftnl copies
/// values into a fixed buffer, so nothing longer may reach it.
const MAX_VALUE: usize = 16;

fn check_value(data: &[u8]) -> Result<(), BatchError> {
    if data.len() > MAX_VALUE {
        return Err(BatchError {
            op: format!("an expression with a {}-byte value", data.len()),
            errno: None,
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("values are at most {MAX_VALUE} bytes (one register)"),
            ),
        });
    }
    Ok(())
}

fn add_expr(
    rule: &mut Rule<'_>,
    expr: &Expr,
    table: &Table,
    set_ids: &HashMap<(&str, &str), u32>,
    name: &impl Fn(&str) -> Result<CString, BatchError>,
) -> Result<(), BatchError> {
    match expr {
        Expr::Cmp { data, .. } | Expr::Immediate(data) => check_value(data)?,
        Expr::Bitwise { mask, xor } => {
            check_value(mask)?;
            check_value(xor)?;
            if mask.len() != xor.len() {
                return Err(BatchError {
                    op: "a bitwise expression".to_owned(),
                    errno: None,
                    source: io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "mask and xor differ in length",
                    ),
                });
            }
        }
        _ => {}
    }
    match expr {
        Expr::MetaLoad(key) => rule.add_expr(&meta(*key)),
        Expr::MetaSetMark => rule.add_expr(&Meta::Mark { set: true }),
        Expr::CtLoad(CtKey::Mark) => rule.add_expr(&Conntrack::Mark { set: false }),
        Expr::CtLoad(CtKey::Zone) => rule.add_expr(&CtZone { set: false }),
        Expr::CtSet(CtKey::Mark) => rule.add_expr(&Conntrack::Mark { set: true }),
        Expr::CtSet(CtKey::Zone) => rule.add_expr(&CtZone { set: true }),
        Expr::Payload { base, offset, len } => {
            // nftnl hands the `Raw` fields to the kernel unchanged, and the kernel's payload
            // offset and length are in bytes, whatever the field names say.
            let (offset_bits, length_bits) = (*offset, *len);
            rule.add_expr(&match base {
                Base::Network => Payload::Network(NetworkHeaderField::Raw {
                    offset_bits,
                    length_bits,
                }),
                Base::Transport => Payload::Transport(TransportHeaderField::Raw {
                    offset_bits,
                    length_bits,
                }),
            });
        }
        Expr::Cmp { op, data } => {
            let op = match op {
                Op::Eq => CmpOp::Eq,
                Op::Neq => CmpOp::Neq,
            };
            rule.add_expr(&Cmp::new(op, data.as_slice()));
        }
        Expr::Bitwise { mask, xor } => {
            rule.add_expr(&Bitwise::new(mask.as_slice(), xor.as_slice()))
        }
        Expr::Immediate(data) => rule.add_expr(&ImmediateData(data)),
        Expr::Verdict(Verdict::Accept) => rule.add_expr(&nftnl::expr::Verdict::Accept),
        Expr::Verdict(Verdict::Return) => rule.add_expr(&nftnl::expr::Verdict::Return),
        Expr::Verdict(Verdict::Jump(chain)) => rule.add_expr(&nftnl::expr::Verdict::Jump {
            chain: name(chain)?,
        }),
        Expr::Counter => rule.add_expr(&Counter),
        Expr::Redirect => rule.add_expr(&Redirect),
        Expr::Snat { ipv6 } => rule.add_expr(&Nat {
            nat_type: NatType::SNat,
            family: if *ipv6 {
                ProtoFamily::Ipv6
            } else {
                ProtoFamily::Ipv4
            },
            ip_register: Register::Reg1,
            port_register: None,
        }),
        Expr::Lookup(set) => {
            let id = set_ids
                .get(&(table_name(table), *set))
                .copied()
                .unwrap_or(0);
            // Only the set's name and id go into the lookup; the key type is irrelevant.
            let named = Set::<Ipv4Addr>::new_named(&name(set)?, id, table, ProtoFamily::Inet);
            rule.add_expr(&Lookup::new(&named));
        }
    }
    Ok(())
}

fn table_name(table: &Table) -> &str {
    table.get_name().to_str().unwrap_or_default()
}

/// Allocates a libnftnl expression named `name` (aborts on out-of-memory, as `nftnl` does).
fn alloc(name: &CStr) -> NonNull<sys::nftnl_expr> {
    #[allow(unsafe_code)]
    // SAFETY: `name` is a valid C string; libnftnl copies it.
    let expr = unsafe { sys::nftnl_expr_alloc(name.as_ptr()) };
    NonNull::new(expr).unwrap_or_else(|| std::process::abort())
}

/// Sets `attribute` of `expr` to `value`.
fn set_u32(expr: NonNull<sys::nftnl_expr>, attribute: u32, value: u32) {
    #[allow(unsafe_code)]
    // SAFETY: `expr` came from `nftnl_expr_alloc` and is not freed yet.
    unsafe {
        sys::nftnl_expr_set_u32(expr.as_ptr(), attribute as u16, value)
    };
}

/// `redir proto_min reg 1` (`redirect to :port`, the port loaded into register 1).
struct Redirect;

impl Expression for Redirect {
    fn to_expr(&self, _rule: &Rule) -> NonNull<sys::nftnl_expr> {
        let expr = alloc(c"redir");
        set_u32(
            expr,
            sys::NFTNL_EXPR_REDIR_REG_PROTO_MIN,
            libc::NFT_REG_1 as u32,
        );
        set_u32(expr, sys::NFTNL_EXPR_REDIR_FLAGS, NAT_RANGE_PROTO_SPECIFIED);
        expr
    }
}

/// `ct zone` load (`set: false`) or `ct zone set` from register 1.
struct CtZone {
    set: bool,
}

impl Expression for CtZone {
    fn to_expr(&self, _rule: &Rule) -> NonNull<sys::nftnl_expr> {
        let expr = alloc(c"ct");
        let register = if self.set {
            sys::NFTNL_EXPR_CT_SREG
        } else {
            sys::NFTNL_EXPR_CT_DREG
        };
        set_u32(expr, register, libc::NFT_REG_1 as u32);
        set_u32(expr, sys::NFTNL_EXPR_CT_KEY, libc::NFT_CT_ZONE as u32);
        expr
    }
}

/// `immediate reg 1 <data>` for data of any length (`nftnl`'s `Immediate` copies a value).
struct ImmediateData<'a>(&'a [u8]);

impl Expression for ImmediateData<'_> {
    fn to_expr(&self, _rule: &Rule) -> NonNull<sys::nftnl_expr> {
        let expr = alloc(c"immediate");
        set_u32(expr, sys::NFTNL_EXPR_IMM_DREG, libc::NFT_REG_1 as u32);
        let len = u32::try_from(self.0.len()).unwrap_or(u32::MAX);
        #[allow(unsafe_code)]
        // SAFETY: libnftnl copies `len` bytes from the slice, which outlives the call.
        unsafe {
            sys::nftnl_expr_set(
                expr.as_ptr(),
                sys::NFTNL_EXPR_IMM_DATA as u16,
                self.0.as_ptr().cast::<c_void>(),
                len,
            )
        };
        expr
    }
}

/// `flush table`: a rule deletion naming only the table removes the rules of all its chains.
struct TableRules<'a>(&'a Table);

#[allow(unsafe_code)]
// SAFETY: `write` is called by `nftnl::Batch` with a buffer of at least the largest message
// size; the rule object holds two attributes and is freed before returning.
unsafe impl NlMsg for TableRules<'_> {
    unsafe fn write(&self, buf: *mut c_void, seq: u32, _msg_type: MsgType) {
        let family = ProtoFamily::Inet as u16;
        unsafe {
            let rule = sys::nftnl_rule_alloc();
            if rule.is_null() {
                std::process::abort();
            }
            sys::nftnl_rule_set_u32(rule, sys::NFTNL_RULE_FAMILY as u16, u32::from(family));
            sys::nftnl_rule_set_str(
                rule,
                sys::NFTNL_RULE_TABLE as u16,
                self.0.get_name().as_ptr(),
            );
            let header = sys::nftnl_nlmsg_build_hdr(
                buf.cast(),
                libc::NFT_MSG_DELRULE as u16,
                family,
                libc::NLM_F_ACK as u16,
                seq,
            );
            sys::nftnl_rule_nlmsg_build_payload(header, rule);
            sys::nftnl_rule_free(rule);
        }
    }
}
