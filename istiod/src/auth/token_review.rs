//! Kubernetes service-account tokens, checked by a TokenReview (`authentication.k8s.io/v1`).
//!
//! The review asks for the CA's audiences (Istio's `TOKEN_AUDIENCES`, default `istio-ca`). A
//! caller is accepted only when the API server authenticated the token, the user is
//! `system:serviceaccount:<ns>:<sa>` in the group `system:serviceaccounts`, and one of the
//! requested audiences was granted. Bound tokens name their pod in the review's extra fields;
//! the CA uses it to find a node agent's node.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};
use mesh_identity::Identity;
use tonic::metadata::MetadataMap;

use super::{bearer_token, AuthError, Authenticator, BoundPod, Caller};

/// The audience Istio's CA asks for when `TOKEN_AUDIENCES` is unset.
pub const DEFAULT_TOKEN_AUDIENCE: &str = "istio-ca";

const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";
const USER_PREFIX: &str = "system:serviceaccount:";
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// Authenticates callers by asking the API server about their token.
#[derive(Clone)]
pub struct TokenReviewAuthenticator {
    reviews: Api<TokenReview>,
    audiences: Vec<String>,
    trust_domain: String,
}

impl std::fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuthenticator")
            .field("audiences", &self.audiences)
            .field("trust_domain", &self.trust_domain)
            .finish_non_exhaustive()
    }
}

impl TokenReviewAuthenticator {
    pub fn new(client: kube::Client, audiences: Vec<String>, trust_domain: &str) -> Self {
        TokenReviewAuthenticator {
            reviews: Api::all(client),
            audiences,
            trust_domain: trust_domain.to_string(),
        }
    }

    async fn review(&self, token: &str) -> Result<TokenReviewStatus, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(self.audiences.clone()),
            },
            ..TokenReview::default()
        };
        let done = self
            .reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::TokenReviewUnavailable {
                detail: e.to_string(),
            })?;
        done.status
            .ok_or_else(|| AuthError::TokenReviewUnavailable {
                detail: "the TokenReview came back without a status".into(),
            })
    }

    /// The caller a successful review describes.
    fn caller(&self, status: TokenReviewStatus) -> Result<Caller, AuthError> {
        if status.authenticated != Some(true) {
            return Err(AuthError::NotAuthenticated {
                error: status
                    .error
                    .unwrap_or_else(|| "not authenticated".to_string()),
            });
        }
        let granted = status.audiences.unwrap_or_default();
        // An API server that ignores spec.audiences reports none; it then validated the
        // token for its own audience, which is not ours.
        if !granted.iter().any(|a| self.audiences.contains(a)) {
            return Err(AuthError::WrongAudience {
                got: granted,
                want: self.audiences.clone(),
            });
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        let not_sa = || AuthError::NotServiceAccount {
            username: username.clone(),
        };
        let in_group = user
            .groups
            .as_ref()
            .is_some_and(|g| g.iter().any(|g| g == SERVICE_ACCOUNTS_GROUP));
        let (namespace, service_account) = username
            .strip_prefix(USER_PREFIX)
            .and_then(|rest| rest.split_once(':'))
            .filter(|_| in_group)
            .ok_or_else(not_sa)?;
        let identity =
            Identity::new(&self.trust_domain, namespace, service_account).map_err(|_| not_sa())?;
        let extra = user.extra.unwrap_or_default();
        let first = |key: &str| extra.get(key).and_then(|v| v.first()).cloned();
        let pod = match (first(POD_NAME_EXTRA), first(POD_UID_EXTRA)) {
            (Some(name), Some(uid)) => Some(BoundPod { name, uid }),
            _ => None,
        };
        Ok(Caller {
            identity,
            node: None,
            pod,
        })
    }
}

#[tonic::async_trait]
impl Authenticator for TokenReviewAuthenticator {
    async fn authenticate(&self, md: &MetadataMap) -> Result<Caller, AuthError> {
        let token = bearer_token(md)?;
        let status = self.review(token).await?;
        self.caller(status)
    }
}
