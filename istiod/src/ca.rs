//! `istio.v1.auth.IstioCertificateService`: issues workload certificates.
//!
//! Every request is authenticated ([`Authenticator`]). A node agent (ztunnel) may ask for
//! another identity through the `ImpersonatedIdentity` metadata, but only for identities that
//! run on its own node ([`NodeLocator`]); everybody else gets their own identity. The CSR is
//! then checked and signed by [`CertificateAuthority`].
//!
//! Who is a node agent: in the local mode, a caller whose token-file entry names a node. On
//! Kubernetes, a caller whose service account is one of `CA_TRUSTED_NODE_ACCOUNTS` and whose
//! bound token names a pod that exists with the token's uid and service account; its node is
//! that pod's `spec.nodeName`.

use crate::signing_pool::SigningPool;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh_identity::{CaError, Identity, IdentityError};
use mesh_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use mesh_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use tonic::{Code, Request, Response, Status};

use crate::auth::{AuthError, Authenticator, BoundPod, Caller};
use crate::live_ca::LiveCa;
use crate::model::PodFacts;

/// Request metadata key through which node agents ask for a workload's identity.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";
/// Header carrying the caller's cluster id.
pub const CLUSTER_ID_HEADER: &str = "clusterid";

/// Answers whether a workload identity runs on a node (implemented from the model snapshot).
pub trait NodeLocator: Send + Sync {
    fn identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool;
    /// The pod `namespace`/`name`, if it exists (a caller's bound pod is looked up here).
    fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts>;
}

/// Why a certificate request was refused.
#[derive(Debug, thiserror::Error)]
pub enum CaServiceError {
    #[error("authentication failed: {0}")]
    Auth(#[from] AuthError),
    #[error("the caller is in cluster {got:?} but this istiod serves cluster {want:?}; set CLUSTER_ID to {want:?} on the caller")]
    ClusterMismatch { got: String, want: String },
    #[error("metadata {IMPERSONATED_IDENTITY} must be a string spiffe:// id")]
    ImpersonationNotString,
    #[error("metadata {IMPERSONATED_IDENTITY} is not a valid identity: {0}")]
    BadImpersonation(#[source] IdentityError),
    #[error("caller {caller} is not a node agent (not in CA_TRUSTED_NODE_ACCOUNTS, nor a token-file entry with a node) and may not impersonate {identity}")]
    NotNodeAgent { caller: String, identity: String },
    #[error("caller {caller} may not impersonate {identity}: its token is not bound to a pod, so its node is unknown")]
    UnboundToken { caller: String, identity: String },
    #[error("caller {caller} may not impersonate {identity}: its pod {pod} does not exist (or has another uid or service account)")]
    CallerPodUnknown {
        caller: String,
        pod: String,
        identity: String,
    },
    #[error(
        "caller {caller} may not impersonate {identity}: its pod {pod} is not scheduled to a node"
    )]
    CallerPodUnscheduled {
        caller: String,
        pod: String,
        identity: String,
    },
    #[error("caller {caller} on node {node} may not impersonate {identity}: no such workload runs on node {node}")]
    NotOnNode {
        caller: String,
        node: String,
        identity: String,
    },
    #[error("caller {caller} on node {node} may not impersonate {identity}: trust domain {got} is not this mesh's {want}")]
    ForeignTrustDomain {
        caller: String,
        node: String,
        identity: String,
        got: String,
        want: String,
    },
    #[error("{0}")]
    Ca(#[from] CaError),
    #[error("the signing task failed: {0}")]
    Signer(String),
}

impl CaServiceError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CaServiceError::Auth(e) => e.reason(),
            CaServiceError::ClusterMismatch { .. } => "cluster_mismatch",
            CaServiceError::ImpersonationNotString => "impersonation_not_string",
            CaServiceError::BadImpersonation(_) => "bad_impersonation",
            CaServiceError::NotNodeAgent { .. } => "impersonation_not_node_agent",
            CaServiceError::UnboundToken { .. } => "impersonation_unbound_token",
            CaServiceError::CallerPodUnknown { .. } => "impersonation_caller_pod_unknown",
            CaServiceError::CallerPodUnscheduled { .. } => "impersonation_caller_pod_unscheduled",
            CaServiceError::NotOnNode { .. } => "impersonation_not_on_node",
            CaServiceError::ForeignTrustDomain { .. } => "impersonation_foreign_trust_domain",
            CaServiceError::Ca(e) => e.reason(),
            CaServiceError::Signer(_) => "signer",
        }
    }

    /// The gRPC status code for this refusal.
    pub fn code(&self) -> Code {
        match self {
            CaServiceError::Auth(_) | CaServiceError::ClusterMismatch { .. } => {
                Code::Unauthenticated
            }
            CaServiceError::ImpersonationNotString | CaServiceError::BadImpersonation(_) => {
                Code::InvalidArgument
            }
            CaServiceError::NotNodeAgent { .. }
            | CaServiceError::UnboundToken { .. }
            | CaServiceError::CallerPodUnknown { .. }
            | CaServiceError::CallerPodUnscheduled { .. }
            | CaServiceError::NotOnNode { .. }
            | CaServiceError::ForeignTrustDomain { .. } => Code::PermissionDenied,
            CaServiceError::Ca(e) if e.is_bad_request() => Code::InvalidArgument,
            CaServiceError::Ca(e) if e.is_permission_denied() => Code::PermissionDenied,
            CaServiceError::Ca(_) | CaServiceError::Signer(_) => Code::Internal,
        }
    }
}

impl From<CaServiceError> for Status {
    fn from(e: CaServiceError) -> Self {
        let message = match &e {
            CaServiceError::Auth(a) => format!("authentication failed: {}", a.caller_message()),
            other => other.to_string(),
        };
        Status::new(e.code(), message)
    }
}

/// The identity a certificate was issued for and its PEM chain.
type Issued = (Identity, Vec<String>);

/// Counters for the integrator to export as metrics.
#[derive(Debug, Default)]
pub struct CaStats {
    issued: AtomicU64,
    authentication_failures: AtomicU64,
    refused: Mutex<BTreeMap<&'static str, u64>>,
}

impl CaStats {
    /// Certificates issued so far.
    pub fn issued(&self) -> u64 {
        self.issued.load(Ordering::Relaxed)
    }

    /// Refusals so far, by reason label.
    pub fn refused(&self) -> BTreeMap<&'static str, u64> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Refusals because the caller could not be authenticated.
    pub fn authentication_failures(&self) -> u64 {
        self.authentication_failures.load(Ordering::Relaxed)
    }

    /// Total refusals.
    pub fn refused_total(&self) -> u64 {
        self.refused().values().sum()
    }

    fn record_refusal(&self, reason: &'static str) {
        *self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason)
            .or_default() += 1;
    }
}

/// The certificate service.
#[derive(Clone)]
pub struct CaService {
    ca: Arc<LiveCa>,
    authenticator: Arc<dyn Authenticator>,
    locator: Arc<dyn NodeLocator>,
    cluster_id: String,
    /// `CA_TRUSTED_NODE_ACCOUNTS`: (namespace, service account) of node agents.
    trusted_node_accounts: Arc<Vec<(String, String)>>,
    stats: Arc<CaStats>,
    /// Where CSRs are checked and signed; tokio's blocking pool when unset.
    signer: Option<SigningPool>,
}

impl CaService {
    pub fn new(
        ca: Arc<LiveCa>,
        authenticator: Arc<dyn Authenticator>,
        locator: Arc<dyn NodeLocator>,
        cluster_id: impl Into<String>,
    ) -> Self {
        CaService {
            ca,
            authenticator,
            locator,
            cluster_id: cluster_id.into(),
            trusted_node_accounts: Arc::default(),
            stats: Arc::default(),
            signer: None,
        }
    }

    /// Checks and signs CSRs on `pool`'s low-priority threads instead of tokio's blocking pool.
    pub fn with_signing_pool(mut self, pool: SigningPool) -> Self {
        self.signer = Some(pool);
        self
    }

    /// Service accounts (namespace, name) whose pods may impersonate the workloads on their
    /// node (Istio's `CA_TRUSTED_NODE_ACCOUNTS`, e.g. `istio-system/ztunnel`).
    pub fn with_trusted_node_accounts(mut self, accounts: Vec<(String, String)>) -> Self {
        self.trusted_node_accounts = Arc::new(accounts);
        self
    }

    /// Shared counters of issued and refused requests.
    pub fn stats(&self) -> Arc<CaStats> {
        self.stats.clone()
    }

    /// The tonic service to add to a server.
    pub fn into_server(self) -> IstioCertificateServiceServer<CaService> {
        IstioCertificateServiceServer::new(self)
    }

    /// Authenticates, authorises and signs; the caller (if known) is returned for logging.
    async fn issue(
        &self,
        request: &Request<IstioCertificateRequest>,
    ) -> (Option<Caller>, Result<Issued, CaServiceError>) {
        let caller = match self.authenticate(request).await {
            Ok(c) => c,
            Err(e) => return (None, Err(e)),
        };
        let result = self.authorize_and_sign(&caller, request.get_ref()).await;
        (Some(caller), result)
    }

    async fn authenticate(
        &self,
        request: &Request<IstioCertificateRequest>,
    ) -> Result<Caller, CaServiceError> {
        let md = request.metadata();
        let caller = self.authenticator.authenticate(md).await?;
        if let Some(got) = md.get(CLUSTER_ID_HEADER) {
            let got = got.to_str().unwrap_or("<non-ASCII>");
            if got != self.cluster_id {
                return Err(CaServiceError::ClusterMismatch {
                    got: got.to_string(),
                    want: self.cluster_id.clone(),
                });
            }
        }
        Ok(caller)
    }

    /// Checks who the certificate is for, then signs it off the runtime's threads (on the
    /// signing pool's low-priority threads when there is one): parsing and verifying the CSR
    /// and signing take CPU time that must not hold up xDS pushes.
    async fn authorize_and_sign(
        &self,
        caller: &Caller,
        req: &IstioCertificateRequest,
    ) -> Result<Issued, CaServiceError> {
        let identity = match impersonated(req)? {
            Some(target) => self.check_impersonation(caller, target)?,
            None => caller.identity.clone(),
        };
        let ttl = u64::try_from(req.validity_duration)
            .ok()
            .filter(|s| *s > 0)
            .map(Duration::from_secs);
        let ca = self.ca.current();
        let csr = req.csr.clone();
        let signing = identity.clone();
        let sign = move || ca.sign_csr(&csr, &signing, ttl);
        let signed = match &self.signer {
            Some(pool) => pool.run(sign).await.map_err(|e| e.to_string()),
            None => tokio::task::spawn_blocking(sign)
                .await
                .map_err(|e| e.to_string()),
        };
        let chain = signed.map_err(CaServiceError::Signer)??;
        Ok((identity, chain))
    }

    fn check_impersonation(
        &self,
        caller: &Caller,
        target: Identity,
    ) -> Result<Identity, CaServiceError> {
        let node = self.caller_node(caller, &target)?;
        let node = node.as_str();
        let trust_domain = self.ca.current().trust_domain().to_string();
        if target.trust_domain() != trust_domain {
            return Err(CaServiceError::ForeignTrustDomain {
                caller: caller.identity.to_string(),
                node: node.to_string(),
                identity: target.to_string(),
                got: target.trust_domain().to_string(),
                want: trust_domain,
            });
        }
        if !self
            .locator
            .identity_on_node(node, target.namespace(), target.service_account())
        {
            return Err(CaServiceError::NotOnNode {
                caller: caller.identity.to_string(),
                node: node.to_string(),
                identity: target.to_string(),
            });
        }
        Ok(target)
    }

    /// The node of a node agent; an error for any other caller.
    fn caller_node(&self, caller: &Caller, target: &Identity) -> Result<String, CaServiceError> {
        if let Some(node) = &caller.node {
            return Ok(node.clone());
        }
        let (ns, sa) = (
            caller.identity.namespace(),
            caller.identity.service_account(),
        );
        let caller_id = || caller.identity.to_string();
        if !self
            .trusted_node_accounts
            .iter()
            .any(|(n, s)| n == ns && s == sa)
        {
            return Err(CaServiceError::NotNodeAgent {
                caller: caller_id(),
                identity: target.to_string(),
            });
        }
        let Some(BoundPod { name, uid }) = &caller.pod else {
            return Err(CaServiceError::UnboundToken {
                caller: caller_id(),
                identity: target.to_string(),
            });
        };
        let pod_ref = || format!("{ns}/{name}");
        let facts = self
            .locator
            .pod(ns, name)
            .filter(|p| &p.uid == uid && p.service_account == sa)
            .ok_or_else(|| CaServiceError::CallerPodUnknown {
                caller: caller_id(),
                pod: pod_ref(),
                identity: target.to_string(),
            })?;
        facts
            .node
            .ok_or_else(|| CaServiceError::CallerPodUnscheduled {
                caller: caller_id(),
                pod: pod_ref(),
                identity: target.to_string(),
            })
    }
}

/// Parses `CA_TRUSTED_NODE_ACCOUNTS` entries (`<namespace>/<service account>`).
pub fn parse_node_accounts(entries: &[String]) -> Result<Vec<(String, String)>, String> {
    entries
        .iter()
        .map(|e| e.trim())
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('/') {
            Some((ns, sa)) if !ns.is_empty() && !sa.is_empty() && !sa.contains('/') => {
                Ok((ns.to_string(), sa.to_string()))
            }
            _ => Err(format!(
                "CA_TRUSTED_NODE_ACCOUNTS entry {e:?} is not <namespace>/<service account>"
            )),
        })
        .collect()
}

/// The `ImpersonatedIdentity` metadata, if present.
fn impersonated(req: &IstioCertificateRequest) -> Result<Option<Identity>, CaServiceError> {
    use prost_types::value::Kind;
    let Some(value) = req
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get(IMPERSONATED_IDENTITY))
    else {
        return Ok(None);
    };
    match &value.kind {
        Some(Kind::StringValue(s)) if s.is_empty() => Ok(None),
        Some(Kind::StringValue(s)) => Identity::parse(s)
            .map(Some)
            .map_err(CaServiceError::BadImpersonation),
        _ => Err(CaServiceError::ImpersonationNotString),
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let (caller, result) = self.issue(&request).await;
        let caller_id = caller.as_ref().map(|c| c.identity.to_string());
        let node = caller.as_ref().and_then(|c| c.node.clone());
        match result {
            Ok((identity, cert_chain)) => {
                self.stats.issued.fetch_add(1, Ordering::Relaxed);
                tracing::info!(caller = ?caller_id, ?node, %identity, "issued workload certificate");
                Ok(Response::new(IstioCertificateResponse { cert_chain }))
            }
            Err(e) => {
                self.stats.record_refusal(e.reason());
                if matches!(e, CaServiceError::Auth(_)) {
                    self.stats
                        .authentication_failures
                        .fetch_add(1, Ordering::Relaxed);
                }
                let remote = request.remote_addr().map(|a| a.to_string());
                tracing::warn!(caller = ?caller_id, ?node, ?remote, reason = e.reason(), error = %e, "refused certificate request");
                Err(e.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::TokenFileAuthenticator;
    use mesh_identity::CertificateAuthority;

    /// One pod, `istio-system/ztunnel-a` (uid `u1`, service account ztunnel), on `node`.
    struct OnePod(Option<&'static str>);

    impl NodeLocator for OnePod {
        fn identity_on_node(&self, _: &str, _: &str, _: &str) -> bool {
            false
        }
        fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts> {
            (namespace == "istio-system" && name == "ztunnel-a").then(|| PodFacts {
                uid: "u1".into(),
                service_account: "ztunnel".into(),
                node: self.0.map(str::to_string),
            })
        }
    }

    fn service(node: Option<&'static str>) -> CaService {
        let dir = tempfile::tempdir().expect("dir");
        let ca = CertificateAuthority::self_signed(dir.path(), Default::default()).expect("ca");
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(&tokens, "tokens: []\n").expect("tokens");
        let auth = TokenFileAuthenticator::new(&tokens).expect("auth");
        CaService::new(
            LiveCa::new(Arc::new(ca)),
            Arc::new(auth),
            Arc::new(OnePod(node)),
            "c1",
        )
        .with_trusted_node_accounts(vec![("istio-system".into(), "ztunnel".into())])
    }

    fn caller(sa: &str, pod: Option<(&str, &str)>) -> Caller {
        Caller {
            identity: Identity::new("cluster.local", "istio-system", sa).expect("id"),
            node: None,
            pod: pod.map(|(name, uid)| BoundPod {
                name: name.into(),
                uid: uid.into(),
            }),
        }
    }

    #[test]
    fn a_node_agents_node_is_its_bound_pods() {
        let target = Identity::new("cluster.local", "default", "app").expect("id");
        let svc = service(Some("node1"));
        let node = svc.caller_node(&caller("ztunnel", Some(("ztunnel-a", "u1"))), &target);
        assert_eq!(node.expect("node"), "node1");
        let reason = |c: &Caller, svc: &CaService| {
            svc.caller_node(c, &target).expect_err("refused").reason()
        };
        // Another uid (the pod was recreated), another pod, no pod, an untrusted account.
        let cases = [
            (
                caller("ztunnel", Some(("ztunnel-a", "u2"))),
                "impersonation_caller_pod_unknown",
            ),
            (
                caller("ztunnel", Some(("ztunnel-b", "u1"))),
                "impersonation_caller_pod_unknown",
            ),
            (caller("ztunnel", None), "impersonation_unbound_token"),
            (
                caller("other", Some(("ztunnel-a", "u1"))),
                "impersonation_not_node_agent",
            ),
        ];
        for (c, want) in cases {
            assert_eq!(reason(&c, &svc), want, "{c:?}");
        }
        let unscheduled = service(None);
        let c = caller("ztunnel", Some(("ztunnel-a", "u1")));
        assert_eq!(
            reason(&c, &unscheduled),
            "impersonation_caller_pod_unscheduled"
        );
    }

    #[test]
    fn node_accounts_parse_as_namespace_slash_name() {
        let ok = parse_node_accounts(&["istio-system/ztunnel".into(), " ".into()]);
        assert_eq!(
            ok.expect("ok"),
            vec![("istio-system".into(), "ztunnel".into())]
        );
        for bad in ["ztunnel", "/ztunnel", "a/b/c", "ns/"] {
            let err = parse_node_accounts(&[bad.into()]).expect_err(bad);
            assert!(err.contains(bad), "{err}");
        }
    }
}
