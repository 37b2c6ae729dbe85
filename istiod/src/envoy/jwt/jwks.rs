//! Inline JSON Web Key Sets: what Envoy will load, and a key set no token verifies against.

use std::sync::LazyLock;

/// A JSON Web Key Set Envoy will load: an object whose `keys` is a non-empty list, each key
/// complete for its type. Envoy refuses a whole listener over one bad key, so anything it
/// might refuse is caught here and reported instead.
pub(super) fn check_jwks(jwks: &str) -> Result<(), String> {
    let value: serde_json::Value =
        serde_json::from_str(jwks).map_err(|e| format!("not JSON: {e}"))?;
    let keys = value
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or("not a key set (no \"keys\" list)")?;
    if keys.is_empty() {
        return Err("the key set has no keys".into());
    }
    for (i, k) in keys.iter().enumerate() {
        check_jwk(k).map_err(|e| format!("keys[{i}]: {e}"))?;
    }
    Ok(())
}

fn check_jwk(key: &serde_json::Value) -> Result<(), String> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let field = |name: &str| -> Result<Vec<u8>, String> {
        let text = key
            .get(name)
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("no \"{name}\""))?;
        let bytes = URL_SAFE_NO_PAD
            .decode(text.trim_end_matches('='))
            .map_err(|e| format!("\"{name}\" is not base64url: {e}"))?;
        if bytes.is_empty() {
            return Err(format!("\"{name}\" is empty"));
        }
        Ok(bytes)
    };
    for name in ["kid", "alg", "use", "crv"] {
        if key.get(name).is_some_and(|v| !v.is_string()) {
            return Err(format!("\"{name}\" is not a string"));
        }
    }
    let alg = key.get("alg").and_then(|a| a.as_str());
    let alg_fits = |allowed: &[&str]| match alg {
        Some(a) if !allowed.contains(&a) => Err(format!(
            "\"alg\" {a:?} does not fit the key (one of {})",
            allowed.join(", ")
        )),
        _ => Ok(()),
    };
    match key.get("kty").and_then(|t| t.as_str()) {
        Some("RSA") => {
            alg_fits(&["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"])?;
            let n = field("n")?;
            let e = field("e")?;
            if n.iter().skip_while(|b| **b == 0).count() < 128 {
                return Err("\"n\" is shorter than 1024 bits".into());
            }
            // Only the exponents 3 and 65537 are accepted.
            let e: Vec<u8> = e.into_iter().skip_while(|b| *b == 0).collect();
            if e != [3] && e != [1, 0, 1] {
                return Err("\"e\" must be 3 or 65537 (AQAB)".into());
            }
            Ok(())
        }
        Some("EC") => {
            // The curve is named by `crv`, else by `alg`.
            let crv = match (key.get("crv").and_then(|c| c.as_str()), alg) {
                (Some(c), _) => c,
                (None, Some("ES384")) => "P-384",
                (None, Some("ES512")) => "P-521",
                (None, _) => "P-256",
            };
            let (agreement, size, fits) = match crv {
                "P-256" => (&ring::agreement::ECDH_P256, 32, "ES256"),
                "P-384" => (&ring::agreement::ECDH_P384, 48, "ES384"),
                other => return Err(format!("curve {other:?} is not supported (P-256, P-384)")),
            };
            alg_fits(&[fits])?;
            let (x, y) = (field("x")?, field("y")?);
            if x.len() != size || y.len() != size {
                return Err(format!("\"x\" and \"y\" must be {size} bytes for {crv}"));
            }
            let mut point = Vec::with_capacity(1 + 2 * size);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            on_curve(agreement, &point)
                .then_some(())
                .ok_or_else(|| format!("the point is not on {crv}"))
        }
        Some("OKP") => {
            match alg_fits(&["EdDSA"]).map(|()| key.get("crv").and_then(|c| c.as_str()))? {
                Some("Ed25519") if field("x")?.len() == 32 => Ok(()),
                Some("Ed25519") => Err("\"x\" must be 32 bytes for Ed25519".into()),
                other => Err(format!("OKP curve {other:?} is not supported (Ed25519)")),
            }
        }
        Some("oct") => {
            alg_fits(&["HS256", "HS384", "HS512"])?;
            field("k").map(|_| ())
        }
        Some(other) => Err(format!("key type {other:?} is not supported")),
        None => Err("no \"kty\"".into()),
    }
}

/// Whether `point` (uncompressed) is a valid public key on the curve of `alg`: an ECDH
/// agreement with it succeeds only then.
fn on_curve(alg: &'static ring::agreement::Algorithm, point: &[u8]) -> bool {
    let rng = ring::rand::SystemRandom::new();
    let Ok(ours) = ring::agreement::EphemeralPrivateKey::generate(alg, &rng) else {
        return false;
    };
    let peer = ring::agreement::UnparsedPublicKey::new(alg, point);
    ring::agreement::agree_ephemeral(ours, &peer, |_| ()).is_ok()
}

/// A key set no token verifies against: the public half of a P-256 key drawn when istiod
/// starts, whose private half was dropped at once. `None` if no key could be drawn.
pub(super) fn unusable_jwks() -> Option<String> {
    static KEY_SET: LazyLock<Option<String>> = LazyLock::new(|| {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine as _;
        use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).ok()?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .ok()?;
        // An uncompressed point: 0x04, x, y.
        let point = key.public_key().as_ref();
        let (x, y) = (point.get(1..33)?, point.get(33..65)?);
        Some(
            serde_json::json!({"keys": [{
                "kty": "EC", "crv": "P-256", "kid": "unusable",
                "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
            }]})
            .to_string(),
        )
    });
    KEY_SET.clone()
}
