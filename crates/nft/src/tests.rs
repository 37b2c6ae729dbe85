//! Rule building blocks expand as `nft` expands them (`nft --debug=netlink`).

use std::net::IpAddr;

use crate::model::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

#[test]
fn prefixes_load_only_the_covered_bytes_and_mask_a_partial_byte() {
    // ip daddr 10.0.0.0/8: 1 byte, no mask.
    let p8 = prefix(false, Op::Eq, ip("10.0.0.0"), 8);
    assert_eq!(
        p8[2..],
        [
            Expr::Payload {
                base: Base::Network,
                offset: 16,
                len: 1
            },
            cmp(Op::Eq, &[10]),
        ]
    );
    // ip daddr 10.96.0.0/12: the whole address, & ff.f0.00.00 (as nft 1.0 writes it).
    let p12 = prefix(false, Op::Eq, ip("10.96.0.0"), 12);
    assert_eq!(
        p12[2..],
        [
            Expr::Payload {
                base: Base::Network,
                offset: 16,
                len: 4
            },
            Expr::Bitwise {
                mask: vec![0xff, 0xf0, 0, 0],
                xor: vec![0; 4]
            },
            cmp(Op::Eq, &[10, 96, 0, 0]),
        ]
    );
    // ip saddr 192.168.1.77/24: the host bits are dropped from the compared value.
    let p24 = prefix(true, Op::Neq, ip("192.168.1.77"), 24);
    assert_eq!(p24.last(), Some(&cmp(Op::Neq, &[192, 168, 1])));
    assert!(matches!(
        p24[2],
        Expr::Payload {
            offset: 12,
            len: 3,
            ..
        }
    ));
    // ip6 daddr fd00:10::/32.
    let v6 = prefix(false, Op::Eq, ip("fd00:10::"), 32);
    assert_eq!(v6[1], cmp(Op::Eq, &[libc::NFPROTO_IPV6 as u8]));
    assert!(matches!(
        v6[2],
        Expr::Payload {
            offset: 24,
            len: 4,
            ..
        }
    ));
    // A host prefix is the plain address compare; a longer one is clamped to it.
    assert_eq!(
        prefix(false, Op::Eq, ip("10.0.0.1"), 32),
        addr(false, Op::Eq, ip("10.0.0.1"))
    );
    assert_eq!(
        prefix(false, Op::Eq, ip("10.0.0.1"), 40),
        addr(false, Op::Eq, ip("10.0.0.1"))
    );
}

#[test]
fn a_zero_prefix_masks_everything_away() {
    let all = prefix(false, Op::Eq, ip("0.0.0.0"), 0);
    assert_eq!(
        all[2..],
        [
            Expr::Payload {
                base: Base::Network,
                offset: 16,
                len: 4
            },
            Expr::Bitwise {
                mask: vec![0; 4],
                xor: vec![0; 4]
            },
            cmp(Op::Eq, &[0; 4]),
        ]
    );
    let none = prefix(false, Op::Neq, ip("::"), 0);
    assert_eq!(none[1], cmp(Op::Eq, &[libc::NFPROTO_IPV6 as u8]));
    assert_eq!(none.last(), Some(&cmp(Op::Neq, &[0; 16])));
}

#[test]
fn owners_interfaces_and_verdicts() {
    assert_eq!(
        owner(true, Op::Neq, 1337),
        [
            Expr::MetaLoad(MetaKey::SkGid),
            cmp(Op::Neq, &1337u32.to_ne_bytes())
        ]
    );
    let lo = iifname(Op::Eq, "lo");
    assert_eq!(lo[0], Expr::MetaLoad(MetaKey::IifName));
    assert!(
        matches!(&lo[1], Expr::Cmp { data, .. } if data.len() == libc::IFNAMSIZ && data[..2] == *b"lo")
    );
    assert_eq!(ret(), [Expr::Counter, Expr::Verdict(Verdict::Return)]);
    assert_eq!(
        jump("x"),
        [Expr::Counter, Expr::Verdict(Verdict::Jump("x"))]
    );
}
