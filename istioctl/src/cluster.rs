//! istioctl's view of a cluster: the kubeconfig flags every cluster command takes, and the
//! untyped object operations install, uninstall and precheck need (server-side apply, get,
//! list by labels, delete), with each kind's resource found by discovery.

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Args;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{GroupVersionKind, ObjectList};
use kube::discovery::{ApiResource, Scope};
use serde_json::Value;

/// `--kubeconfig` and `--context`, as istioctl's global flags.
#[derive(Debug, Clone, Default, Args)]
pub struct KubeArgs {
    /// Kubernetes configuration file [default: $KUBECONFIG, else ~/.kube/config, else the
    /// in-cluster configuration].
    #[arg(short = 'c', long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
    /// The name of the kubeconfig context to use [default: the file's current context].
    #[arg(long)]
    pub context: Option<String>,
}

/// What went wrong talking to the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Client(#[from] mesh_kube::ClientError),
    #[error("{id}: the cluster does not serve {api_version} {kind} (is its CRD installed?)")]
    NotServed {
        id: String,
        api_version: String,
        kind: String,
    },
    #[error("{0}")]
    NoPod(String),
    #[error("{id} has no apiVersion, kind or metadata.name")]
    NotAnObject { id: String },
    #[error("{action} {id}: {source}")]
    Api {
        action: &'static str,
        id: String,
        #[source]
        source: kube::Error,
    },
}

impl KubeArgs {
    /// Whether a cluster was named on the command line (`--kubeconfig` or `--context`): the
    /// commands that also work without one (precheck, ztunnel-config, analyze) switch to the
    /// cluster only then, so an exported `KUBECONFIG` never changes what they look at.
    pub fn given(&self) -> bool {
        self.kubeconfig.is_some() || self.context.is_some()
    }

    /// Connects (lazily: nothing is sent yet).
    pub async fn cluster(&self) -> Result<Cluster, ClusterError> {
        let client =
            mesh_kube::client_for_user(self.kubeconfig.as_deref(), self.context.as_deref()).await?;
        Ok(Cluster::new(client))
    }
}

/// `Kind/namespace/name` or `Kind/name`, as istioctl names objects in its output.
pub fn object_id(kind: &str, namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        format!("{kind}/{name}")
    } else {
        format!("{kind}/{namespace}/{name}")
    }
}

/// A cluster, with the resources of the kinds used so far.
pub struct Cluster {
    client: kube::Client,
    resources: HashMap<(String, String), (ApiResource, Scope)>,
}

fn gvk(api_version: &str, kind: &str) -> GroupVersionKind {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl Cluster {
    pub fn new(client: kube::Client) -> Self {
        Cluster {
            client,
            resources: HashMap::new(),
        }
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The resource serving `kind`, or `None` when the cluster does not serve it. Only found
    /// kinds are remembered, so a CRD established later is found on the next call.
    pub async fn resource(
        &mut self,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<(ApiResource, Scope)>, ClusterError> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(found) = self.resources.get(&key) {
            return Ok(Some(found.clone()));
        }
        match kube::discovery::pinned_kind(&self.client, &gvk(api_version, kind)).await {
            Ok((resource, caps)) => {
                let found = (resource, caps.scope);
                self.resources.insert(key, found.clone());
                Ok(Some(found))
            }
            Err(e) if is_not_found(&e) || matches!(e, kube::Error::Discovery(_)) => Ok(None),
            Err(source) => Err(ClusterError::Api {
                action: "discover",
                id: format!("{api_version} {kind}"),
                source,
            }),
        }
    }

    async fn api(
        &mut self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        id: &str,
    ) -> Result<(Api<DynamicObject>, Scope), ClusterError> {
        let Some((resource, scope)) = self.resource(api_version, kind).await? else {
            return Err(ClusterError::NotServed {
                id: id.to_string(),
                api_version: api_version.to_string(),
                kind: kind.to_string(),
            });
        };
        let api = match scope {
            Scope::Namespaced if !namespace.is_empty() => {
                Api::namespaced_with(self.client.clone(), namespace, &resource)
            }
            _ => Api::all_with(self.client.clone(), &resource),
        };
        Ok((api, scope))
    }

    /// Where `object` lives: its namespace, or `default_namespace` for a namespaced kind that
    /// names none; `""` for cluster-scoped kinds.
    pub async fn namespace_of(
        &mut self,
        object: &Value,
        default_namespace: &str,
    ) -> Result<String, ClusterError> {
        let (api_version, kind, name) = identity(object)?;
        let id = object_id(kind, "", name);
        let (_, scope) = self.api(api_version, kind, "", &id).await?;
        Ok(match scope {
            Scope::Cluster => String::new(),
            Scope::Namespaced => object["metadata"]["namespace"]
                .as_str()
                .filter(|ns| !ns.is_empty())
                .unwrap_or(default_namespace)
                .to_string(),
        })
    }

    /// Server-side apply of `object` by `manager`, taking over conflicting fields.
    pub async fn apply(
        &mut self,
        object: &Value,
        namespace: &str,
        manager: &str,
    ) -> Result<(), ClusterError> {
        let (api_version, kind, name) = identity(object)?;
        let id = object_id(kind, namespace, name);
        let (api, _) = self.api(api_version, kind, namespace, &id).await?;
        let mut body = object.clone();
        if !namespace.is_empty() {
            body["metadata"]["namespace"] = Value::String(namespace.to_string());
        }
        api.patch(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| ClusterError::Api {
            action: "server-side apply",
            id,
            source,
        })?;
        Ok(())
    }

    /// A JSON merge patch of an existing object.
    pub async fn merge_patch(
        &mut self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<(), ClusterError> {
        let id = object_id(kind, namespace, name);
        let (api, _) = self.api(api_version, kind, namespace, &id).await?;
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|source| ClusterError::Api {
                action: "patch",
                id,
                source,
            })?;
        Ok(())
    }

    /// The object, or `None` when it does not exist (or its kind is not served).
    pub async fn get(
        &mut self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, ClusterError> {
        let id = object_id(kind, namespace, name);
        if self.resource(api_version, kind).await?.is_none() {
            return Ok(None);
        }
        let (api, _) = self.api(api_version, kind, namespace, &id).await?;
        match api.get_opt(name).await {
            Ok(found) => Ok(found.map(to_value)),
            Err(source) => Err(ClusterError::Api {
                action: "get",
                id,
                source,
            }),
        }
    }

    /// Every object of the kind in every namespace matching `labels` (a label selector);
    /// nothing when the kind is not served.
    pub async fn list(
        &mut self,
        api_version: &str,
        kind: &str,
        labels: &str,
    ) -> Result<Vec<Value>, ClusterError> {
        let id = format!("{api_version} {kind}");
        if self.resource(api_version, kind).await?.is_none() {
            return Ok(Vec::new());
        }
        let (api, _) = self.api(api_version, kind, "", &id).await?;
        let list: ObjectList<DynamicObject> = api
            .list(&ListParams::default().labels(labels))
            .await
            .map_err(|source| ClusterError::Api {
                action: "list",
                id,
                source,
            })?;
        // Lists of built-in kinds leave each item's apiVersion and kind out.
        Ok(list
            .items
            .into_iter()
            .map(|o| {
                let mut v = to_value(o);
                v["apiVersion"] = Value::String(api_version.to_string());
                v["kind"] = Value::String(kind.to_string());
                v
            })
            .collect())
    }

    /// Deletes with foreground propagation; false when it was already gone.
    pub async fn delete(
        &mut self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<bool, ClusterError> {
        let id = object_id(kind, namespace, name);
        let (api, _) = self.api(api_version, kind, namespace, &id).await?;
        match api.delete(name, &DeleteParams::foreground()).await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(source) => Err(ClusterError::Api {
                action: "delete",
                id,
                source,
            }),
        }
    }

    /// Creates the namespace unless it exists (a plain create: an existing one is left as it
    /// is, labels included).
    pub async fn ensure_namespace(
        &mut self,
        name: &str,
        labels: &serde_json::Map<String, Value>,
    ) -> Result<bool, ClusterError> {
        if self.get("v1", "Namespace", "", name).await?.is_some() {
            return Ok(false);
        }
        let id = object_id("Namespace", "", name);
        let (api, _) = self.api("v1", "Namespace", "", &id).await?;
        let namespace: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        }))
        .map_err(|e| ClusterError::Api {
            action: "create",
            id: id.clone(),
            source: kube::Error::SerdeError(e),
        })?;
        match api.create(&PostParams::default(), &namespace).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(source) => Err(ClusterError::Api {
                action: "create",
                id,
                source,
            }),
        }
    }
}

/// `(namespace, name)` of a pod as istioctl names one: `[pod/]<name>[.<namespace>]`.
pub fn pod_ref(arg: &str, default_namespace: &str) -> (String, String) {
    let name = arg.strip_prefix("pod/").unwrap_or(arg);
    // Pod names may hold dots; a namespace cannot, so the last dot separates them.
    match name.rsplit_once('.') {
        Some((name, namespace)) if !namespace.is_empty() => {
            (namespace.to_string(), name.to_string())
        }
        _ => (default_namespace.to_string(), name.to_string()),
    }
}

impl Cluster {
    /// The ztunnel pod to ask: `pod` when given; else the running one on `node`, else the
    /// first running one (by name) of the `app=ztunnel` pods in `istio_namespace`.
    pub async fn ztunnel_pod(
        &mut self,
        pod: Option<&str>,
        istio_namespace: &str,
        node: Option<&str>,
    ) -> Result<(String, String), ClusterError> {
        if let Some(pod) = pod {
            return Ok(pod_ref(pod, istio_namespace));
        }
        let mut pods: Vec<Value> = self
            .list("v1", "Pod", "app=ztunnel")
            .await?
            .into_iter()
            .filter(|p| p["metadata"]["namespace"] == istio_namespace)
            .filter(|p| p["status"]["phase"] == "Running")
            .filter(|p| node.is_none_or(|n| p["spec"]["nodeName"] == n))
            .collect();
        pods.sort_by_key(|p| {
            p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        });
        let name = pods
            .first()
            .and_then(|p| p["metadata"]["name"].as_str())
            .ok_or_else(|| {
                ClusterError::NoPod(match node {
                    Some(n) => format!(
                        "no running ztunnel pod (app=ztunnel) in {istio_namespace} on node {n}"
                    ),
                    None => format!("no running ztunnel pod (app=ztunnel) in {istio_namespace}"),
                })
            })?;
        Ok((istio_namespace.to_string(), name.to_string()))
    }
}

fn to_value(o: DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

/// `apiVersion`, `kind` and `metadata.name` of an object.
pub fn identity(object: &Value) -> Result<(&str, &str, &str), ClusterError> {
    fn field(v: &Value) -> Option<&str> {
        v.as_str().filter(|s| !s.is_empty())
    }
    match (
        field(&object["apiVersion"]),
        field(&object["kind"]),
        field(&object["metadata"]["name"]),
    ) {
        (Some(a), Some(k), Some(n)) => Ok((a, k, n)),
        _ => Err(ClusterError::NotAnObject {
            id: object.to_string().chars().take(80).collect(),
        }),
    }
}
