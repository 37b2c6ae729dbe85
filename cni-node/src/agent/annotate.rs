//! The `ambient.istio.io/redirection` annotation on the Pod, as istio-cni writes it: a merge
//! patch through `pods/status` (which may change a pod's annotations), `pending` while the
//! capture is applied, `enabled` once ztunnel has the pod, removed when it leaves the mesh.
//!
//! Writes go through one background task: the agent never waits on the API server while it
//! holds its lock. The latest wanted value per pod wins; a failed write is retried with
//! exponential backoff (5 ms to 5 s, as istio-cni's queue), and a pod that is gone is dropped.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::cluster::PodKey;
use crate::state::Redirection;

/// The annotation istio-cni keeps on enrolled pods.
pub const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";

const FIRST_RETRY: Duration = Duration::from_millis(5);
const LAST_RETRY: Duration = Duration::from_secs(5);

/// Hands wanted annotation values to the writer task; cheap to clone.
#[derive(Clone, Debug)]
pub struct PodAnnotator {
    tx: mpsc::UnboundedSender<(PodKey, Option<Redirection>)>,
}

impl PodAnnotator {
    /// Starts the writer task on `client` (it ends when every annotator is dropped).
    pub fn spawn(client: kube::Client) -> PodAnnotator {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_annotations(client, rx));
        PodAnnotator { tx }
    }

    /// Asks for `value` on the pod `key` (`None` removes the annotation).
    pub(crate) fn set(&self, key: PodKey, value: Option<Redirection>) {
        let _ = self.tx.send((key, value));
    }
}

/// The annotation's value on `pod`, if any.
pub(crate) fn current(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REDIRECTION_ANNOTATION))
        .map(String::as_str)
}

/// Whether `pod` already shows `value`.
pub(crate) fn shows(pod: &Pod, value: Option<Redirection>) -> bool {
    current(pod) == value.map(annotation_value)
}

fn annotation_value(r: Redirection) -> &'static str {
    match r {
        Redirection::Pending => "pending",
        Redirection::Enabled => "enabled",
    }
}

async fn write_annotations(
    client: kube::Client,
    mut rx: mpsc::UnboundedReceiver<(PodKey, Option<Redirection>)>,
) {
    let mut wanted: BTreeMap<PodKey, Option<Redirection>> = BTreeMap::new();
    let mut retry = FIRST_RETRY;
    loop {
        if wanted.is_empty() {
            let Some((key, value)) = rx.recv().await else {
                return;
            };
            wanted.insert(key, value);
        }
        while let Ok((key, value)) = rx.try_recv() {
            wanted.insert(key, value);
        }
        let mut failed = false;
        for (key, value) in std::mem::take(&mut wanted) {
            match patch(&client, &key, value).await {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    debug!(pod = %format!("{}/{}", key.0, key.1), "pod gone; its annotation with it");
                }
                Err(e) => {
                    warn!(pod = %format!("{}/{}", key.0, key.1), annotation = REDIRECTION_ANNOTATION, error = %e, "cannot annotate pod; retrying");
                    failed = true;
                    // A newer value that arrived meanwhile wins over the retry.
                    wanted.entry(key).or_insert(value);
                }
            }
        }
        if failed {
            // Wait, but take new values as they come.
            let wait = tokio::time::sleep(retry);
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    _ = &mut wait => break,
                    next = rx.recv() => match next {
                        Some((key, value)) => { wanted.insert(key, value); }
                        None => return,
                    },
                }
            }
            retry = (retry * 2).min(LAST_RETRY);
        } else {
            retry = FIRST_RETRY;
        }
    }
}

async fn patch(
    client: &kube::Client,
    (namespace, name): &PodKey,
    value: Option<Redirection>,
) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let body =
        json!({"metadata": {"annotations": {REDIRECTION_ANNOTATION: value.map(annotation_value)}}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map(drop)
}
