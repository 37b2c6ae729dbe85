//! Replays every fuzz seed and every input that once crashed a target (`fuzz/seeds/<target>/`,
//! `fuzz/regressions/<target>/`) through the same functions the fuzzers drive, so a fixed crash
//! stays fixed without running a fuzzer.

use std::fs;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(kind: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_dir().join(kind).join(target);
    let Ok(entries) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = fs::read(&p).expect("read input");
            (p, bytes)
        })
        .collect()
}

#[test]
fn every_seed_and_past_crash_runs_clean() {
    let mut ran = 0;
    for (name, target) in mesh_fuzz::TARGETS {
        for kind in ["seeds", "regressions"] {
            for (path, bytes) in inputs(kind, name) {
                let outcome = std::panic::catch_unwind(|| target(&bytes));
                assert!(outcome.is_ok(), "{name} panicked on {}", path.display());
                ran += 1;
            }
        }
    }
    assert!(ran >= mesh_fuzz::TARGETS.len(), "only {ran} inputs found");
}

#[test]
fn every_target_has_a_libfuzzer_binary_and_seeds() {
    let manifest = fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let bins = manifest.matches("[[bin]]").count();
    assert_eq!(
        bins,
        mesh_fuzz::TARGETS.len(),
        "a [[bin]] without a mesh_fuzz target, or the reverse"
    );
    for (name, _) in mesh_fuzz::TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml lacks a [[bin]] for {name}"
        );
        let source = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let text = fs::read_to_string(&source).expect("fuzz target source");
        assert!(
            text.contains(&format!("mesh_fuzz::{name}(")),
            "{}",
            source.display()
        );
        assert!(!inputs("seeds", name).is_empty(), "no seeds for {name}");
    }
}

/// The seeds are valid inputs: a fuzzer mutating them starts from the parsers' happy paths.
#[test]
fn the_seeds_are_accepted_by_their_parsers() {
    for (_, bytes) in inputs("seeds", "cni_stdin") {
        let conf = cni_node::plugin::parse_config(&bytes).expect("CNI seed parses");
        assert!(!conf.prev_result_ips().expect("prevResult").is_empty());
    }
    for (_, bytes) in inputs("seeds", "cni_event") {
        cni_node::event::decode_event(&bytes).expect("event seed decodes");
    }
    for (_, bytes) in inputs("seeds", "xds_address") {
        let mut state = ztunnel::state::State::new();
        state
            .apply_address("seed", Some(&bytes))
            .expect("WDS seed applies");
    }
    for (_, bytes) in inputs("seeds", "xds_authorization") {
        let mut state = ztunnel::state::State::new();
        state
            .apply_authorization("seed", Some(&bytes))
            .expect("authorization seed applies");
    }
    for (_, bytes) in inputs("seeds", "yaml_manifest") {
        let text = String::from_utf8(bytes).expect("utf-8");
        let (objects, errors) = mesh_source::parse_manifest(Path::new("seed.yaml"), &text);
        assert!(errors.is_empty() && objects.len() == 3, "{errors:?}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = mesh_identity::CertificateAuthority::self_signed(dir.path(), Default::default())
        .expect("CA");
    let identity = mesh_identity::Identity::new("cluster.local", "default", "fuzz").expect("id");
    for (_, bytes) in inputs("seeds", "ca_csr") {
        let pem = String::from_utf8(bytes).expect("utf-8");
        let chain = ca
            .sign_csr(&pem, &identity, None)
            .expect("CSR seed is signed");
        assert!(chain.len() >= 2);
    }
    for (_, bytes) in inputs("seeds", "dns_message") {
        assert!(matches!(
            ztunnel::dns::message::parse(&bytes),
            ztunnel::dns::message::Parsed::Query(_)
        ));
    }
    for (path, bytes) in inputs("seeds", "netlink_reply") {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("nft-") {
            let mut counts = std::collections::HashMap::new();
            cni_node::redirect::answers::nftables_rule_dump(&bytes, &mut counts)
                .expect("nftables seed decodes");
        } else {
            let messages = mesh_capture::rtnl::decode(&bytes).expect("rtnetlink seed decodes");
            assert!(!messages.is_empty(), "{name}");
        }
    }
    // A CONNECT reaches the connector, which refuses it with 503: `:status: 503` as h2's HPACK
    // encoder writes it (literal with indexing of name 8, the value Huffman-coded).
    let connect = fs::read(fuzz_dir().join("seeds/hbone_request/connect.bin")).expect("seed");
    let status_503 = [0x48, 0x83, 0x6c, 0x0c, 0xff];
    let has_503 = |answer: &[u8]| answer.windows(status_503.len()).any(|w| w == status_503);
    let answer = mesh_fuzz::hbone_exchange(&connect, Some(&has_503));
    assert!(
        answer.windows(status_503.len()).any(|w| w == status_503),
        "no 503 in the server's answer {answer:?}"
    );
}
