//! The objects a chart renders, parsed from Helm's per-template manifests.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

/// A rendered template that is not a list of Kubernetes objects.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{template}: document {index} is not YAML: {source}")]
    Yaml {
        template: String,
        index: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{template}: document {index} has no apiVersion, kind or metadata.name")]
    NotAnObject { template: String, index: usize },
}

/// One rendered object, with the template it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub template: String,
    pub value: Value,
}

impl Object {
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    pub fn api_version(&self) -> &str {
        self.value["apiVersion"].as_str().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// `metadata.namespace`, if the chart set one.
    pub fn namespace(&self) -> Option<&str> {
        self.value["metadata"]["namespace"].as_str()
    }

    /// `Kind/name`, as kubectl names objects.
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind(), self.name())
    }

    /// The object as a typed Kubernetes object.
    pub fn typed<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.value)
    }
}

/// Everything one chart rendered, in template order then document order.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    pub objects: Vec<Object>,
}

impl Rendered {
    /// Splits Helm's `{template: text}` answer into objects. Empty documents (templates whose
    /// conditions rendered nothing) are dropped; NOTES.txt is not a manifest.
    pub fn parse(manifests: BTreeMap<String, String>) -> Result<Self, ManifestError> {
        let mut objects = Vec::new();
        for (template, text) in manifests {
            if template.ends_with("NOTES.txt") {
                continue;
            }
            for (index, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
                let value = Value::deserialize(doc).map_err(|source| ManifestError::Yaml {
                    template: template.clone(),
                    index,
                    source,
                })?;
                if value.is_null() {
                    continue;
                }
                let object = Object {
                    template: template.clone(),
                    value,
                };
                if object.kind().is_empty()
                    || object.api_version().is_empty()
                    || object.name().is_empty()
                {
                    return Err(ManifestError::NotAnObject { template, index });
                }
                objects.push(object);
            }
        }
        Ok(Rendered { objects })
    }

    /// The object of this kind and name.
    pub fn get(&self, kind: &str, name: &str) -> Option<&Object> {
        self.objects
            .iter()
            .find(|o| o.kind() == kind && o.name() == name)
    }

    /// Every object of this kind.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Object> + 'a {
        self.objects.iter().filter(move |o| o.kind() == kind)
    }

    /// `Kind/name` of every object, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.objects.iter().map(Object::id).collect();
        ids.sort();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_split_into_objects_and_empty_documents_are_dropped() {
        let manifests = BTreeMap::from([
            (
                "c/templates/a.yaml".to_string(),
                "---\n# nothing\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n".to_string(),
            ),
            ("c/templates/NOTES.txt".to_string(), "hello".to_string()),
        ]);
        let rendered = Rendered::parse(manifests).expect("parses");
        assert_eq!(rendered.ids(), vec!["ConfigMap/b", "ServiceAccount/a"]);
        assert_eq!(
            rendered.get("ConfigMap", "b").map(|o| o.template.as_str()),
            Some("c/templates/a.yaml")
        );
    }

    #[test]
    fn a_document_that_is_not_an_object_is_named() {
        let manifests = BTreeMap::from([(
            "c/templates/bad.yaml".to_string(),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n---\nfoo: bar\n".to_string(),
        )]);
        let err = Rendered::parse(manifests).expect_err("second document is no object");
        assert_eq!(
            err.to_string(),
            "c/templates/bad.yaml: document 1 has no apiVersion, kind or metadata.name"
        );
    }
}
