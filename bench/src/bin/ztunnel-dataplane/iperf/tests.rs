use super::*;

#[test]
fn parses_receiver_total() {
    let json = r#"{"start":{},"end":{"sum_sent":{"bits_per_second":2.5e9,"retransmits":7},
        "sum_received":{"bits_per_second":2.4e9}}}"#;
    let t = parse(json).expect("parses");
    assert_eq!(t.bits_per_second, 2.4e9);
    assert_eq!(t.retransmits, 7);
    assert!((t.gbps() - 2.4).abs() < 1e-9);
}

#[test]
fn reports_iperf_errors() {
    let err =
        parse(r#"{"start":{},"end":{},"error":"unable to connect to server"}"#).expect_err("error");
    assert!(err.to_string().contains("unable to connect"), "{err}");
    assert!(parse("not json").is_err());
}
