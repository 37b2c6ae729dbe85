//! A JWT issuer for tests: an ECDSA P-256 key, its JSON Web Key Set, and ES256 tokens signed
//! with it, so tests can give Envoy's `jwt_authn` real tokens to verify.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum JwtIssuerError {
    #[error("generating the P-256 key: {0}")]
    Key(String),
    #[error("signing a token: {0}")]
    Sign(String),
    #[error("the claims must be a JSON object, got {0}")]
    Claims(Value),
}

/// Signs tokens for one issuer with a key of its own.
pub struct JwtIssuer {
    issuer: String,
    kid: String,
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

impl std::fmt::Debug for JwtIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtIssuer")
            .field("issuer", &self.issuer)
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl JwtIssuer {
    /// A new key for `issuer` (the `iss` of its tokens).
    pub fn new(issuer: &str) -> Result<JwtIssuer, JwtIssuerError> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|e| JwtIssuerError::Key(e.to_string()))?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|e| JwtIssuerError::Key(e.to_string()))?;
        let kid = URL_SAFE_NO_PAD.encode(&key.public_key().as_ref()[1..9]);
        Ok(JwtIssuer {
            issuer: issuer.to_string(),
            kid,
            key,
            rng,
        })
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The JSON Web Key Set holding the public key (for `jwtRules[].jwks`).
    pub fn jwks(&self) -> String {
        // An uncompressed point: 0x04, then x and y (32 bytes each).
        let point = self.key.public_key().as_ref();
        json!({"keys": [{
            "kty": "EC",
            "crv": "P-256",
            "alg": "ES256",
            "use": "sig",
            "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        }]})
        .to_string()
    }

    /// A token for `sub`, valid for an hour, with `claims` (an object) added to the payload.
    pub fn token(&self, sub: &str, claims: Value) -> Result<String, JwtIssuerError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let Value::Object(extra) = claims else {
            return Err(JwtIssuerError::Claims(claims));
        };
        let mut payload = json!({
            "iss": self.issuer,
            "sub": sub,
            "iat": now,
            "exp": now + 3600,
        });
        if let Value::Object(p) = &mut payload {
            p.extend(extra);
        }
        self.sign(&payload)
    }

    /// Signs `payload` as it is (for expired or otherwise odd tokens).
    pub fn sign(&self, payload: &Value) -> Result<String, JwtIssuerError> {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(payload.to_string())
        );
        let signature = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|e| JwtIssuerError::Sign(e.to_string()))?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        ))
    }
}
