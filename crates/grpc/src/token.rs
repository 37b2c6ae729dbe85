//! The `authorization` metadata the proxies send istiod: `Bearer <token>`, the token read from
//! its file at each use, since projected service-account tokens rotate.

use std::path::Path;

/// Why no header could be made from a token file.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the token {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the token in {path} is not a valid HTTP header value")]
    NotAHeader { path: String },
}

/// `Bearer <token>` from the file at `path` (surrounding whitespace dropped).
pub async fn bearer_token(path: &Path) -> Result<http::HeaderValue, TokenError> {
    let display = || path.display().to_string();
    let token = tokio::fs::read_to_string(path)
        .await
        .map_err(|source| TokenError::Read {
            path: display(),
            source,
        })?;
    http::HeaderValue::try_from(format!("Bearer {}", token.trim()))
        .map_err(|_| TokenError::NotAHeader { path: display() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tokens_are_trimmed_and_bad_ones_named() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("istio-token");
        std::fs::write(&good, "eyJhbGciOi.abc.def\n").unwrap();
        assert_eq!(
            bearer_token(&good).await.unwrap(),
            "Bearer eyJhbGciOi.abc.def"
        );

        let bad = dir.path().join("bad-token");
        std::fs::write(&bad, "two\nlines").unwrap();
        let err = bearer_token(&bad).await.unwrap_err();
        assert!(matches!(err, TokenError::NotAHeader { .. }), "{err}");
        assert!(err.to_string().contains("bad-token"), "{err}");

        let missing = dir.path().join("missing");
        let err = bearer_token(&missing).await.unwrap_err();
        assert!(matches!(err, TokenError::Read { .. }), "{err}");
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
