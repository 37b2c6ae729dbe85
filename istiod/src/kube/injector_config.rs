//! istiod's own MutatingWebhookConfigurations (the sidecar injector's), kept as Istio keeps
//! them: every configuration labelled `istio.io/rev=<revision>` gets the root certificate as
//! the `caBundle` of each webhook whose name ends in `sidecar-injector.istio.io`, written again
//! whenever the root rotates or the configuration is (re)created. Writes are updates at the
//! resource version read; a failed one is retried on the next event.

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::watch;

use super::validation_config::REVISION_LABEL;

/// The suffix of the injector's webhook names.
pub const INJECTOR_WEBHOOK_SUFFIX: &str = "sidecar-injector.istio.io";

/// Runs until dropped (or until `roots` closes).
pub async fn run(client: Client, revision: String, mut roots: watch::Receiver<String>) {
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client);
    let selector = format!("{REVISION_LABEL}={revision}");
    let mut events = watcher(
        configs.clone(),
        watcher::Config::default().labels(&selector),
    )
    .default_backoff()
    .boxed();
    let mut ca_bundle = ByteString(roots.borrow_and_update().clone().into_bytes());
    let mut known: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))) => {
                    if let Some(name) = c.metadata.name {
                        if !known.contains(&name) {
                            known.push(name);
                        }
                    }
                }
                Some(Ok(watcher::Event::Delete(c))) => {
                    known.retain(|n| Some(n) != c.metadata.name.as_ref());
                    continue;
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "injector webhook configuration watch failed; retrying");
                    continue;
                }
                None => return,
            },
            changed = roots.changed() => match changed {
                Ok(()) => ca_bundle = ByteString(roots.borrow_and_update().clone().into_bytes()),
                Err(_) => return,
            },
        }
        for name in &known {
            if let Err(e) = patch(&configs, name, &ca_bundle).await {
                tracing::warn!(config = %name, error = %e, "cannot update the injector webhook configuration; retrying");
            }
        }
    }
}

/// Sets the injector webhooks' caBundle, unless it already is.
async fn patch(
    configs: &Api<MutatingWebhookConfiguration>,
    name: &str,
    ca_bundle: &ByteString,
) -> Result<(), kube::Error> {
    let Some(mut current) = configs.get_opt(name).await? else {
        return Ok(());
    };
    let mut changed = false;
    for hook in current.webhooks.iter_mut().flatten() {
        if hook.name.ends_with(INJECTOR_WEBHOOK_SUFFIX)
            && hook.client_config.ca_bundle.as_ref() != Some(ca_bundle)
        {
            hook.client_config.ca_bundle = Some(ca_bundle.clone());
            changed = true;
        }
    }
    if changed {
        configs
            .replace(name, &PostParams::default(), &current)
            .await?;
        tracing::info!(config = %name, "updated the injector webhook configuration's caBundle");
    }
    Ok(())
}
