//! istiod's own ValidatingWebhookConfigurations, kept as Istio keeps them: every configuration
//! labelled `istio.io/rev=<revision>` gets the root certificate as each webhook's `caBundle`,
//! and `failurePolicy: Ignore` until a dry-run create of an invalid `networking.istio.io`
//! Gateway comes back denied by the webhook (the API server reaches istiod's `/validate`) or
//! the Gateway CRD is not installed; from then on `Fail`. Until then the probe is retried,
//! after 1 s and then twice as long each time, up to every 30 s. Writes are updates at the
//! resource version read; a conflict is retried.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::ByteString;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;
use tokio::sync::watch;

use crate::webhook::WEBHOOK_NAME;

/// The label that ties a webhook configuration to a revision.
pub const REVISION_LABEL: &str = "istio.io/rev";
const PROBE_RETRY: Duration = Duration::from_secs(1);
const PROBE_RETRY_MAX: Duration = Duration::from_secs(30);
const DENIED: &str = "denied the request";
const MISSING_RESOURCE: &str = "the server could not find the requested resource";

/// Runs until dropped (or until `roots` closes); a new root is written to every configuration.
pub async fn run(
    client: Client,
    revision: String,
    namespace: String,
    mut roots: watch::Receiver<String>,
) {
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let selector = format!("{REVISION_LABEL}={revision}");
    let mut events = watcher(
        configs.clone(),
        watcher::Config::default().labels(&selector),
    )
    .default_backoff()
    .boxed();
    let mut ca_bundle = ByteString(roots.borrow_and_update().clone().into_bytes());
    let mut known: BTreeMap<String, ()> = BTreeMap::new();
    let mut fail_closed = false;
    let mut probe_wait = Duration::ZERO;
    let probe = tokio::time::sleep(probe_wait);
    tokio::pin!(probe);
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))) => {
                    if let Some(name) = c.metadata.name.clone() {
                        known.insert(name, ());
                    }
                }
                Some(Ok(watcher::Event::Delete(c))) => {
                    if let Some(name) = &c.metadata.name {
                        known.remove(name);
                    }
                    continue;
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "webhook configuration watch failed; retrying");
                    continue;
                }
                None => return,
            },
            changed = roots.changed() => match changed {
                Ok(()) => {
                    ca_bundle = ByteString(roots.borrow_and_update().clone().into_bytes());
                    tracing::info!("the roots changed; updating the webhooks' caBundle");
                }
                Err(_) => return,
            },
            _ = &mut probe, if !fail_closed => {
                fail_closed = invalid_config_rejected(&client, &namespace).await;
                if fail_closed {
                    tracing::info!("the webhook rejected invalid configuration; validation is now fail-closed");
                } else {
                    probe_wait = (probe_wait * 2).clamp(PROBE_RETRY, PROBE_RETRY_MAX);
                    probe.as_mut().reset(tokio::time::Instant::now() + probe_wait);
                }
            }
        }
        let policy = if fail_closed { "Fail" } else { "Ignore" };
        for name in known.keys() {
            if let Err(e) = patch(&configs, name, &ca_bundle, policy).await {
                tracing::warn!(config = %name, error = %e, "cannot update the validating webhook configuration; retrying");
            }
        }
    }
}

/// Sets every webhook's caBundle and failurePolicy, unless they already are.
async fn patch(
    configs: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    ca_bundle: &ByteString,
    policy: &str,
) -> Result<(), kube::Error> {
    let Some(mut current) = configs.get_opt(name).await? else {
        return Ok(());
    };
    let mut changed = false;
    for hook in current.webhooks.iter_mut().flatten() {
        if hook.client_config.ca_bundle.as_ref() != Some(ca_bundle) {
            hook.client_config.ca_bundle = Some(ca_bundle.clone());
            changed = true;
        }
        if hook.failure_policy.as_deref() != Some(policy) {
            hook.failure_policy = Some(policy.to_string());
            changed = true;
        }
    }
    if changed {
        configs
            .replace(name, &PostParams::default(), &current)
            .await?;
        tracing::info!(config = %name, failure_policy = policy, "updated the validating webhook configuration");
    }
    Ok(())
}

/// Whether a dry-run create of an invalid Gateway is denied by the webhook (or cannot be
/// tried because the Gateway CRD is not installed).
async fn invalid_config_rejected(client: &Client, namespace: &str) -> bool {
    let gvk = GroupVersionKind::gvk("networking.istio.io", "v1", "Gateway");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "gateways");
    let gateways: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    let mut invalid = DynamicObject::new("invalid-gateway", &ar).within(namespace);
    // A Gateway must have at least one server.
    invalid.data = json!({"spec": {}});
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match gateways.create(&dry_run, &invalid).await {
        Ok(_) => {
            tracing::info!("not yet fail-closed: a dry-run invalid Gateway was not rejected");
            false
        }
        Err(kube::Error::Api(s))
            if s.message.contains(WEBHOOK_NAME) && s.message.contains(DENIED) =>
        {
            true
        }
        Err(kube::Error::Api(s)) if s.code == 404 && s.message.contains(MISSING_RESOURCE) => {
            tracing::warn!("no networking.istio.io Gateway CRD: validation cannot be probed; assuming it works");
            true
        }
        Err(e) => {
            tracing::info!(error = %e, "not yet fail-closed: the dry-run invalid Gateway failed for another reason");
            false
        }
    }
}
