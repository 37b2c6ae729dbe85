//! Where the API flows run: the fake API server by default, or a real kube-apiserver when
//! `MESH_KUBE_CONFORMANCE` names a kubeconfig (`scripts/kube-conformance.sh`). The same flows
//! against both are what keeps the fake honest.
//!
//! On a real server each test works in a namespace of its own (`mesh-conformance-<test>-<n>`),
//! deleted when the test ends, and its objects are named so that no kubelet or controller acts
//! on them (pods are bound to nodes that do not exist).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use mesh_testutil::kube_api::{core_types, FakeApiServer, FakeToken};
use serde_json::json;

/// The environment variable naming the kubeconfig of a real API server to run against.
pub const KUBECONFIG_ENV: &str = "MESH_KUBE_CONFORMANCE";

pub struct Target {
    /// The fake, when the flows run against it (its test controls are used then).
    pub fake: Option<FakeApiServer>,
    pub client: Client,
    /// The namespace the test works in.
    pub ns: String,
}

impl Target {
    /// Starts the fake, or connects to the real server and makes a fresh namespace for `test`.
    pub async fn start(test: &str) -> Target {
        let Some(kubeconfig) = std::env::var_os(KUBECONFIG_ENV) else {
            let server = FakeApiServer::start(core_types()).await.expect("start");
            server
                .seed(
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
                )
                .expect("namespace");
            let client = server.client();
            return Target {
                fake: Some(server),
                client,
                ns: "shop".into(),
            };
        };
        let client = real_client(&kubeconfig).await;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let ns = format!("mesh-conformance-{test}-{nanos}").replace('_', "-");
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("create the test namespace");
        // Pods need the namespace's default service account, which a controller adds.
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while accounts.get_opt("default").await.expect("read").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "no default service account in {ns} after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Target {
            fake: None,
            client,
            ns,
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Makes the server send bookmarks often and says how long to wait for one: the fake
    /// every 100 ms; a real server sends them about once a minute.
    pub fn bookmarks_soon(&self) -> Duration {
        match &self.fake {
            Some(fake) => {
                fake.set_bookmark_interval(Duration::from_millis(100));
                Duration::from_secs(3)
            }
            None => Duration::from_secs(90),
        }
    }

    /// A resource version the server has forgotten: on the fake, `rv` after compacting the
    /// history; on a real server, version 1 (long compacted on any server older than a few
    /// minutes).
    pub fn forgotten_version(&self, rv: &str) -> String {
        match &self.fake {
            Some(fake) => {
                fake.compact();
                rv.to_string()
            }
            None => "1".to_string(),
        }
    }

    /// A token of `service_account` for `audience`, bound to the pod `pod` (`uid`): registered
    /// on the fake; asked of a real server through the TokenRequest API.
    pub async fn pod_token(
        &self,
        service_account: &str,
        pod: &str,
        uid: &str,
        audience: &str,
    ) -> String {
        if let Some(fake) = &self.fake {
            let token = format!("{service_account}-{pod}-token");
            fake.add_token(
                &token,
                FakeToken {
                    namespace: self.ns.clone(),
                    service_account: service_account.into(),
                    audiences: vec![audience.into()],
                    pod: Some((pod.into(), uid.into())),
                    user: None,
                },
            );
            return token;
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.into()],
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.into()),
                    uid: Some(uid.into()),
                }),
                expiration_seconds: Some(600),
            },
            ..TokenRequest::default()
        };
        self.api::<ServiceAccount>()
            .create_token_request(service_account, &PostParams::default(), &request)
            .await
            .expect("token request")
            .status
            .expect("token status")
            .token
    }

    /// Makes `service_account` exist (a real server refuses pods of a missing one).
    pub async fn service_account(&self, name: &str) {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("account");
        match self
            .api::<ServiceAccount>()
            .create(&PostParams::default(), &account)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("service account {name}: {e}"),
        }
    }
}

async fn real_client(kubeconfig: &std::ffi::OsStr) -> Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("{KUBECONFIG_ENV}={kubeconfig:?}: {e}"));
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("{KUBECONFIG_ENV}={kubeconfig:?}: {e}"));
    Client::try_from(config).expect("client")
}

/// Deletes at once (grace period 0): no kubelet will ever confirm these pods gone.
pub fn now() -> DeleteParams {
    DeleteParams::default().grace_period(0)
}

impl Drop for Target {
    fn drop(&mut self) {
        if self.fake.is_some() {
            return;
        }
        let ns = self.ns.clone();
        // Drop cannot await: delete the namespace from a runtime (and client) of its own, as
        // the test's runtime is blocked here.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let Some(kubeconfig) = std::env::var_os(KUBECONFIG_ENV) else {
                    return;
                };
                let namespaces: Api<Namespace> = Api::all(real_client(&kubeconfig).await);
                if let Err(e) = namespaces.delete(&ns, &DeleteParams::background()).await {
                    eprintln!("could not delete the test namespace {ns}: {e}");
                }
            });
        });
        let _ = cleanup.join();
    }
}
