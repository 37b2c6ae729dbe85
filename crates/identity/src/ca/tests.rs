use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer, UnixTime};
use x509_parser::extensions::{GeneralName, ParsedExtension};

use super::*;
use crate::csr::generate_csr;

const RSA1024_CSR: &str = include_str!("testdata/rsa1024.csr");
const RSA2048_KEY: &str = include_str!("testdata/rsa2048.key.pem");

fn id(s: &str) -> Identity {
    Identity::parse(s).expect("valid identity")
}

fn app() -> Identity {
    id("spiffe://cluster.local/ns/default/sa/app")
}

fn new_ca(dir: &Path) -> CertificateAuthority {
    CertificateAuthority::self_signed(dir, CaOptions::default()).expect("self-signed CA")
}

fn csr_with_key(key: &KeyPair, uri: Option<&str>) -> String {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    if let Some(uri) = uri {
        params.subject_alt_names = vec![SanType::URI(uri.try_into().expect("ia5"))];
    }
    params
        .serialize_request(key)
        .expect("csr")
        .pem()
        .expect("pem")
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("certificate PEM")
}

/// Verifies the chain with webpki to its last element (one or more roots) and returns the
/// leaf's DER.
fn verify_chain(chain: &[String]) -> CertificateDer<'static> {
    assert!(chain.len() >= 2, "chain has leaf and root: {chain:?}");
    let roots: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(chain.last().expect("root").as_bytes())
            .collect::<Result<_, _>>()
            .expect("root PEM");
    let anchors: Vec<_> = roots
        .iter()
        .map(|r| {
            webpki::anchor_from_trusted_cert(r)
                .expect("anchor")
                .to_owned()
        })
        .collect();
    let intermediates: Vec<_> = chain[1..chain.len() - 1].iter().map(|p| der(p)).collect();
    let leaf = der(&chain[0]);
    let ee = webpki::EndEntityCert::try_from(&leaf).expect("leaf parses");
    let provider = rustls::crypto::ring::default_provider();
    for usage in [
        webpki::KeyUsage::server_auth(),
        webpki::KeyUsage::client_auth(),
    ] {
        ee.verify_for_usage(
            provider.signature_verification_algorithms.all,
            &anchors,
            &intermediates,
            UnixTime::now(),
            usage,
            None,
            None,
        )
        .expect("chain verifies to the root");
    }
    leaf
}

fn uri_sans(leaf: &CertificateDer<'_>) -> Vec<String> {
    let (_, x509) = x509_parser::parse_x509_certificate(leaf.as_ref()).expect("x509");
    let san = x509
        .subject_alternative_name()
        .expect("san ok")
        .expect("san");
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some((*u).to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn self_signed_root_is_persisted_and_reloaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca(dir.path());
    assert_eq!(
        ca.source(),
        &CaSource::SelfSigned {
            dir: dir.path().into()
        }
    );
    let key_meta = std::fs::metadata(dir.path().join(CA_KEY_FILE)).expect("key written");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(key_meta.permissions().mode() & 0o777, 0o600);
    }
    let root = der(ca.root_cert_pem());
    let (_, x509) = x509_parser::parse_x509_certificate(root.as_ref()).expect("root");
    assert!(x509.is_ca());
    let org: Vec<_> = x509.subject().iter_organization().collect();
    assert_eq!(org[0].as_str().expect("utf8"), "cluster.local");

    let first = ca.sign_csr(&generate_csr(&app()).expect("csr").csr_pem, &app(), None);
    let first = first.expect("signed");
    drop(ca);
    let again = new_ca(dir.path());
    assert_eq!(again.root_cert_pem(), first.last().expect("root").as_str());
    let second = again
        .sign_csr(&generate_csr(&app()).expect("csr").csr_pem, &app(), None)
        .expect("signed after reload");
    verify_chain(&first);
    verify_chain(&second);
}

#[test]
fn partial_self_signed_state_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    new_ca(dir.path());
    std::fs::remove_file(dir.path().join(CA_KEY_FILE)).expect("rm key");
    let err = CertificateAuthority::self_signed(dir.path(), CaOptions::default())
        .expect_err("partial state");
    assert_eq!(err.reason(), "partial_state");
    assert!(err.to_string().contains("ca-key.pem"), "{err}");
}

#[test]
fn leaf_has_identity_usages_and_lifetime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca(dir.path());
    let csr = generate_csr(&app()).expect("csr");
    let chain = ca.sign_csr(&csr.csr_pem, &app(), None).expect("signed");
    assert_eq!(chain.len(), 2);
    let leaf = verify_chain(&chain);
    assert_eq!(uri_sans(&leaf), vec![app().to_string()]);

    let (_, x509) = x509_parser::parse_x509_certificate(leaf.as_ref()).expect("x509");
    assert!(!x509.is_ca());
    let ku = x509.key_usage().expect("ku ok").expect("ku").value;
    assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
    let eku = x509
        .extended_key_usage()
        .expect("eku ok")
        .expect("eku")
        .value;
    assert!(eku.server_auth && eku.client_auth);
    let validity = x509.validity();
    let now = time::OffsetDateTime::now_utc();
    let back = now - validity.not_before.to_datetime();
    assert!(
        back >= time::Duration::seconds(55) && back <= time::Duration::seconds(70),
        "{back}"
    );
    let life = validity.not_after.to_datetime() - validity.not_before.to_datetime();
    assert_eq!(
        life.whole_seconds(),
        (DEFAULT_MAX_TTL + BACKDATE).as_secs() as i64
    );

    let other = ca
        .sign_csr(&csr.csr_pem, &app(), None)
        .expect("signed twice");
    let other_leaf = der(&other[0]);
    let (_, x2) = x509_parser::parse_x509_certificate(other_leaf.as_ref()).expect("x509");
    assert_ne!(x509.raw_serial(), x2.raw_serial(), "serials are random");
}

#[test]
fn ttl_is_requested_but_capped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = CaOptions {
        max_ttl: Duration::from_secs(7200),
        ..CaOptions::default()
    };
    let ca = CertificateAuthority::self_signed(dir.path(), options).expect("ca");
    let lifetime = |ttl: Option<Duration>| {
        let chain = ca
            .sign_csr(&generate_csr(&app()).expect("csr").csr_pem, &app(), ttl)
            .expect("signed");
        let leaf = der(&chain[0]);
        let (_, x509) = x509_parser::parse_x509_certificate(leaf.as_ref()).expect("x509");
        let v = x509.validity();
        (v.not_after.to_datetime() - v.not_before.to_datetime()).whole_seconds() - 60
    };
    assert_eq!(lifetime(Some(Duration::from_secs(600))), 600);
    assert_eq!(lifetime(Some(Duration::from_secs(48 * 3600))), 7200);
    assert_eq!(lifetime(None), 7200);
    assert_eq!(lifetime(Some(Duration::ZERO)), 7200);
}

#[test]
fn accepts_p384_and_rsa2048_without_san() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca(dir.path());
    let p384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).expect("p384");
    let chain = ca
        .sign_csr(&csr_with_key(&p384, Some(&app().to_string())), &app(), None)
        .expect("P-384 accepted");
    verify_chain(&chain);
    let rsa = KeyPair::from_pkcs8_pem_and_sign_algo(RSA2048_KEY, &rcgen::PKCS_RSA_SHA256)
        .expect("rsa key");
    let chain = ca
        .sign_csr(&csr_with_key(&rsa, None), &app(), None)
        .expect("RSA 2048 without SAN accepted");
    let leaf = verify_chain(&chain);
    assert_eq!(uri_sans(&leaf), vec![app().to_string()]);
}

#[test]
fn refuses_weak_and_unsupported_keys_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca(dir.path());
    let legacy = id("spiffe://cluster.local/ns/default/sa/legacy");
    let err = ca
        .sign_csr(RSA1024_CSR, &legacy, None)
        .expect_err("RSA 1024");
    assert_eq!(err.reason(), "unsupported_key");
    assert!(err.to_string().contains("RSA 1024-bit"), "{err}");
    assert!(err.is_bad_request());

    let ed = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519");
    let err = ca
        .sign_csr(&csr_with_key(&ed, Some(&app().to_string())), &app(), None)
        .expect_err("Ed25519");
    assert!(err.to_string().contains("Ed25519"), "{err}");
}

#[test]
fn refuses_a_csr_for_another_identity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca(dir.path());
    let other = id("spiffe://cluster.local/ns/kube-system/sa/admin");
    let csr = generate_csr(&other).expect("csr");
    let err = ca
        .sign_csr(&csr.csr_pem, &app(), None)
        .expect_err("foreign");
    assert!(err.is_permission_denied());
    let msg = err.to_string();
    assert!(
        msg.contains(&other.to_string()) && msg.contains(&app().to_string()),
        "{msg}"
    );

    let foreign_td = id("spiffe://evil.example/ns/default/sa/app");
    let csr = generate_csr(&foreign_td).expect("csr");
    let err = ca
        .sign_csr(&csr.csr_pem, &foreign_td, None)
        .expect_err("td");
    assert_eq!(err.reason(), "wrong_trust_domain");
}

#[test]
fn refuses_garbage_and_tampered_csrs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca(dir.path());
    let err = ca
        .sign_csr("hello world", &app(), None)
        .expect_err("garbage");
    assert_eq!(err.reason(), "csr_not_pem", "{err}");
    let framed = "-----BEGIN CERTIFICATE REQUEST-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE REQUEST-----\n";
    let err = ca.sign_csr(framed, &app(), None).expect_err("not der");
    assert_eq!(err.reason(), "csr_malformed", "{err}");

    let csr = generate_csr(&app()).expect("csr");
    let mut bytes = CertificateSigningRequestDer::from_pem_slice(csr.csr_pem.as_bytes())
        .expect("der")
        .as_ref()
        .to_vec();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x55;
    let tampered = to_pem("CERTIFICATE REQUEST", &bytes);
    let err = ca.sign_csr(&tampered, &app(), None).expect_err("tampered");
    assert!(
        matches!(err.reason(), "csr_bad_signature" | "csr_malformed"),
        "{err}"
    );
}

fn to_pem(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("ascii"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// Writes a root, and an intermediate signed by it, as a `cacerts` directory.
fn write_plugged_dir(dir: &Path) -> (String, String) {
    let ca_params = |cn: &str| {
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "cluster.local");
        dn.push(DnType::CommonName, cn);
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p
    };
    let root_key = KeyPair::generate().expect("root key");
    let root_params = ca_params("Root CA");
    let root = root_params.self_signed(&root_key).expect("root");
    let int_key = KeyPair::generate().expect("int key");
    let root_issuer = Issuer::new(root_params, root_key);
    let int = ca_params("Intermediate CA")
        .signed_by(&int_key, &root_issuer)
        .expect("intermediate");
    std::fs::write(dir.join(ROOT_CERT_FILE), root.pem()).expect("write");
    std::fs::write(dir.join(CA_CERT_FILE), int.pem()).expect("write");
    std::fs::write(dir.join(CA_KEY_FILE), int_key.serialize_pem()).expect("write");
    std::fs::write(
        dir.join(CERT_CHAIN_FILE),
        format!("{}{}", int.pem(), root.pem()),
    )
    .expect("write");
    (root.pem(), int.pem())
}

#[test]
fn plugged_in_intermediate_signs_and_chains_to_root() {
    let cacerts = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let (root_pem, int_pem) = write_plugged_dir(cacerts.path());
    let ca = CertificateAuthority::load(Some(cacerts.path()), state.path(), CaOptions::default())
        .expect("plugged-in CA");
    assert_eq!(
        ca.source(),
        &CaSource::PluggedIn {
            dir: cacerts.path().into()
        }
    );
    assert_eq!(ca.root_cert_pem(), root_pem);
    let chain = ca
        .sign_csr(&generate_csr(&app()).expect("csr").csr_pem, &app(), None)
        .expect("signed");
    assert_eq!(
        chain.len(),
        3,
        "leaf, intermediate, root (no duplicate root)"
    );
    assert_eq!(chain[1], int_pem);
    assert_eq!(chain[2], root_pem);
    verify_chain(&chain);
    assert!(
        !state.path().join(CA_KEY_FILE).exists(),
        "no self-signed root made"
    );

    // cert-chain.pem is optional.
    std::fs::remove_file(cacerts.path().join(CERT_CHAIN_FILE)).expect("rm");
    let ca = CertificateAuthority::plugged_in(cacerts.path(), CaOptions::default()).expect("ca");
    let chain = ca
        .sign_csr(&generate_csr(&app()).expect("csr").csr_pem, &app(), None)
        .expect("signed");
    assert_eq!(chain.len(), 3);
    verify_chain(&chain);
}

#[test]
fn a_root_cert_file_with_two_roots_is_the_trust_bundle() {
    // Rotating a root: the new root is added beside the old one, which still signs.
    let cacerts = tempfile::tempdir().expect("tempdir");
    let (old_root, _) = write_plugged_dir(cacerts.path());
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let (new_root, _) = write_plugged_dir(elsewhere.path());
    let bundle = format!("{new_root}{old_root}");
    std::fs::write(cacerts.path().join(ROOT_CERT_FILE), &bundle).expect("write");
    std::fs::write(
        cacerts.path().join(CERT_CHAIN_FILE),
        std::fs::read_to_string(cacerts.path().join(CA_CERT_FILE)).expect("read"),
    )
    .expect("write");
    let ca = CertificateAuthority::plugged_in(cacerts.path(), CaOptions::default()).expect("ca");
    assert_eq!(
        ca.root_cert_pem(),
        bundle,
        "both roots, in the file's order"
    );
    let chain = ca
        .sign_csr(&generate_csr(&app()).expect("csr").csr_pem, &app(), None)
        .expect("signed");
    assert_eq!(chain.len(), 3, "leaf, intermediate, the roots");
    assert_eq!(chain[2], bundle);
    verify_chain(&chain);
}

#[test]
fn plugged_in_mistakes_are_reported() {
    let cacerts = tempfile::tempdir().expect("tempdir");
    write_plugged_dir(cacerts.path());
    let other = KeyPair::generate().expect("key");
    std::fs::write(cacerts.path().join(CA_KEY_FILE), other.serialize_pem()).expect("write");
    let err = CertificateAuthority::plugged_in(cacerts.path(), CaOptions::default())
        .expect_err("mismatch");
    assert_eq!(err.reason(), "key_mismatch", "{err}");

    let cacerts = tempfile::tempdir().expect("tempdir");
    write_plugged_dir(cacerts.path());
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let (foreign_root, _) = write_plugged_dir(elsewhere.path());
    std::fs::write(cacerts.path().join(ROOT_CERT_FILE), foreign_root).expect("write");
    std::fs::remove_file(cacerts.path().join(CERT_CHAIN_FILE)).expect("rm");
    let err = CertificateAuthority::plugged_in(cacerts.path(), CaOptions::default())
        .expect_err("broken chain");
    assert_eq!(err.reason(), "chain_broken", "{err}");

    let empty = tempfile::tempdir().expect("tempdir");
    std::fs::write(empty.path().join(CA_KEY_FILE), "junk").expect("write");
    let err = CertificateAuthority::plugged_in(empty.path(), CaOptions::default())
        .expect_err("missing cert");
    assert_eq!(err.reason(), "io", "{err}");
    assert!(err.to_string().contains("ca-cert.pem"), "{err}");
}

#[test]
fn serving_cert_and_root_publication() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca(dir.path());
    let ips = ["127.0.0.1".parse().expect("ip")];
    let serving = ca
        .serving_cert(&["istiod.istio-system.svc", "localhost"], &ips)
        .expect("serving cert");
    let leaf = verify_chain(&serving.chain_pem);
    let ee = webpki::EndEntityCert::try_from(&leaf).expect("ee");
    for name in ["istiod.istio-system.svc", "localhost", "127.0.0.1"] {
        let server_name = rustls_pki_types::ServerName::try_from(name).expect("name");
        ee.verify_is_valid_for_subject_name(&server_name)
            .expect(name);
    }
    assert!(serving.key_pem.contains("PRIVATE KEY"));
    let (_, x509) = x509_parser::parse_x509_certificate(leaf.as_ref()).expect("x509");
    assert!(x509.extensions().iter().all(|e| !matches!(
        e.parsed_extension(),
        ParsedExtension::UnsupportedExtension { .. }
    )));

    let out = dir.path().join("pub/root-cert.pem");
    ca.write_root_cert(&out).expect("write root");
    assert_eq!(
        std::fs::read_to_string(out).expect("read"),
        ca.root_cert_pem()
    );
}
