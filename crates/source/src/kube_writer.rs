//! [`KubeWriter`]: a controller's writes to the Kubernetes API, as server-side apply with the
//! controller's field manager (forced: the controller owns what it renders), status through
//! the `/status` subresource, and deletes limited to objects carrying the controller's
//! managed-by label.

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::Client;
use mesh_api::ObjectKey;
use serde_json::Value;

use crate::kube_source::api_resource;
use crate::writer::{key_of, reference, ObjectWriter, WriteError};

/// Writes through the API server as `field_manager`.
#[derive(Clone)]
pub struct KubeWriter {
    client: Client,
    field_manager: String,
    /// (label, value) an object must carry for [`ObjectWriter::delete`] to remove it.
    managed: (String, String),
}

impl std::fmt::Debug for KubeWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeWriter")
            .field("field_manager", &self.field_manager)
            .field("managed", &self.managed)
            .finish_non_exhaustive()
    }
}

impl KubeWriter {
    pub fn new(client: Client, field_manager: &str, managed_label: (&str, &str)) -> Self {
        KubeWriter {
            client,
            field_manager: field_manager.to_string(),
            managed: (managed_label.0.to_string(), managed_label.1.to_string()),
        }
    }

    fn api(&self, key: &ObjectKey) -> Api<DynamicObject> {
        let ar = api_resource(key.kind);
        if key.kind.namespaced() {
            Api::namespaced_with(self.client.clone(), &key.namespace, &ar)
        } else {
            Api::all_with(self.client.clone(), &ar)
        }
    }

    fn failed(&self, key: &ObjectKey, what: &str, e: kube::Error) -> WriteError {
        WriteError::Api {
            key: Box::new(key.clone()),
            detail: format!("{what} as {}: {e}", self.field_manager),
        }
    }
}

fn resource_version(o: &DynamicObject) -> Option<&str> {
    o.metadata.resource_version.as_deref()
}

impl ObjectWriter for KubeWriter {
    async fn apply(&self, object: &Value) -> Result<bool, WriteError> {
        let key = key_of(object)?;
        let api = self.api(&key);
        let before = api
            .get_opt(&key.name)
            .await
            .map_err(|e| self.failed(&key, "read", e))?;
        let params = PatchParams::apply(&self.field_manager).force();
        let after = api
            .patch(&key.name, &params, &Patch::Apply(object))
            .await
            .map_err(|e| self.failed(&key, "server-side apply", e))?;
        // An apply that changes nothing keeps the resource version.
        Ok(before.as_ref().and_then(resource_version) != resource_version(&after))
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), WriteError> {
        let api = self.api(key);
        let Some(current) = api
            .get_opt(&key.name)
            .await
            .map_err(|e| self.failed(key, "read", e))?
        else {
            return Ok(());
        };
        let (label, value) = &self.managed;
        let ours = current
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(label))
            .is_some_and(|v| v == value);
        if !ours {
            tracing::warn!(object = %key, %label, "not deleting an object without the managed-by label");
            return Ok(());
        }
        match api.delete(&key.name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.failed(key, "delete", e)),
        }
    }

    async fn write_status(
        &self,
        key: &ObjectKey,
        status: Option<&Value>,
    ) -> Result<(), WriteError> {
        // Applying no status gives up every status field this manager owned.
        let mut doc = reference(key);
        if let Some(status) = status {
            doc["status"] = status.clone();
        }
        let params = PatchParams::apply(&self.field_manager).force();
        match self
            .api(key)
            .patch_status(&key.name, &params, &Patch::Apply(&doc))
            .await
        {
            Ok(_) => Ok(()),
            // The object is gone: it has no status to set or clear.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                tracing::debug!(object = %key, "no status written: the object is gone");
                Ok(())
            }
            Err(e) => Err(self.failed(key, "status apply", e)),
        }
    }
}
