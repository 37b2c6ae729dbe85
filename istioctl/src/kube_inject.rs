//! `istioctl kube-inject -f <file>`: the sidecar injection of istiod's webhook applied to
//! manifests offline, as Istio's istioctl does: the pod template of each Pod, Deployment,
//! DaemonSet, ReplicaSet, ReplicationController, StatefulSet, Job and CronJob (and of the items
//! of a List) is injected; other objects pass through unchanged. The configuration is the
//! istiod chart's values (`--valuesFile`, YAML or JSON) and the mesh config
//! (`--meshConfigFile`: its `trustDomain` and `defaultConfig`), with Istio's defaults for
//! anything they leave out.

use std::path::PathBuf;

use clap::Args;
use mesh_inject::{decide, Decision, InjectConfig, Workload};
use serde::Deserialize;
use serde_json::Value;

/// Flags of `istioctl kube-inject`.
#[derive(Debug, Args)]
pub struct KubeInjectArgs {
    /// The manifests to inject (`-` for standard input).
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// Where to write the result [default: standard output].
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// The istiod chart's values (what the `istio-sidecar-injector` ConfigMap holds).
    #[arg(long = "valuesFile")]
    pub values_file: Option<PathBuf>,
    /// A mesh config file (its `trustDomain` and `defaultConfig` are used).
    #[arg(long = "meshConfigFile")]
    pub mesh_config_file: Option<PathBuf>,
    /// The control plane revision the pods are injected for.
    #[arg(short = 'r', long)]
    pub revision: Option<String>,
}

/// Why nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum KubeInjectError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not YAML: {detail}")]
    Yaml { path: PathBuf, detail: String },
    #[error("{kind} {name}: {source}")]
    Inject {
        kind: String,
        name: String,
        source: mesh_inject::InjectError,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn read(path: &std::path::Path) -> Result<String, KubeInjectError> {
    crate::input::read_path_or_stdin(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|source| KubeInjectError::Read {
            path: path.to_path_buf(),
            source,
        })
}

fn yaml(path: &std::path::Path, text: &str) -> Result<Value, KubeInjectError> {
    serde_yaml::from_str(text).map_err(|e| KubeInjectError::Yaml {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

/// The injector's configuration from the flags.
pub fn config(args: &KubeInjectArgs) -> Result<InjectConfig, KubeInjectError> {
    let mut values = match &args.values_file {
        Some(p) => yaml(p, &read(p)?)?,
        None => Value::Object(Default::default()),
    };
    if !values.is_object() {
        values = Value::Object(Default::default());
    }
    if !values["meshConfig"].is_object() {
        values["meshConfig"] = Value::Object(Default::default());
    }
    if let Some(p) = &args.mesh_config_file {
        let mesh = yaml(p, &read(p)?)?;
        for key in ["trustDomain", "defaultConfig"] {
            if !mesh[key].is_null() {
                values["meshConfig"][key] = mesh[key].clone();
            }
        }
    }
    if let Some(r) = &args.revision {
        values["revision"] = Value::String(r.clone());
    }
    let mut cfg = InjectConfig::from_values(&values);
    // As Istio's kube-inject: the files given are injected whatever the cluster's policy.
    cfg.policy = mesh_inject::Policy::Enabled;
    Ok(cfg)
}

/// Where a kind keeps its pod template.
fn template_path(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "Pod" => &[],
        "Deployment"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "StatefulSet"
        | "Job" => &["spec", "template"],
        "CronJob" => &["spec", "jobTemplate", "spec", "template"],
        _ => return None,
    })
}

/// Injects one object (a List's items one by one); `skipped` hears why an object was not.
fn inject_object(
    object: &mut Value,
    cfg: &InjectConfig,
    skipped: &mut Vec<String>,
) -> Result<(), KubeInjectError> {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    if kind == "List" {
        if let Some(items) = object["items"].as_array_mut() {
            for item in items {
                inject_object(item, cfg, skipped)?;
            }
        }
        return Ok(());
    }
    let Some(path) = template_path(&kind) else {
        return Ok(());
    };
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let api_version = object["apiVersion"].as_str().unwrap_or("v1").to_string();
    let mut template = &mut *object;
    for key in path {
        match template.get_mut(*key) {
            Some(next) => template = next,
            None => {
                skipped.push(format!(
                    "{kind} {namespace}/{name}: it has no {}",
                    path.join(".")
                ));
                return Ok(());
            }
        }
    }
    if let Decision::Skip(why) = decide(template, &namespace, cfg) {
        skipped.push(format!("{kind} {namespace}/{name}: {why}"));
        return Ok(());
    }
    let workload = Workload::new(&namespace, &kind, &api_version, &name);
    let injected = mesh_inject::inject(template, &workload, cfg).map_err(|source| {
        KubeInjectError::Inject {
            kind: kind.clone(),
            name: name.clone(),
            source,
        }
    })?;
    *template = injected;
    Ok(())
}

/// The injected manifests as YAML documents, and the objects skipped (with why).
pub fn inject_text(
    path: &std::path::Path,
    text: &str,
    cfg: &InjectConfig,
) -> Result<(String, Vec<String>), KubeInjectError> {
    let mut out = String::new();
    let mut skipped = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let mut object = Value::deserialize(doc).map_err(|e| KubeInjectError::Yaml {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        if object.is_null() {
            continue;
        }
        inject_object(&mut object, cfg, &mut skipped)?;
        out.push_str(
            &serde_yaml::to_string(&object).map_err(|e| KubeInjectError::Yaml {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?,
        );
        out.push_str("---\n");
    }
    Ok((out, skipped))
}

/// Runs `istioctl kube-inject`.
pub fn run(args: &KubeInjectArgs) -> Result<(), KubeInjectError> {
    let cfg = config(args)?;
    let text = read(&args.file)?;
    let (out, skipped) = inject_text(&args.file, &text, &cfg)?;
    for s in skipped {
        eprintln!("===> Skipping injection of {s}");
    }
    match &args.output {
        Some(path) => std::fs::write(path, out).map_err(|source| KubeInjectError::Write {
            path: path.clone(),
            source,
        }),
        None => {
            print!("{out}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_injected_and_other_objects_pass_through() {
        let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  template:\n    metadata:\n      labels:\n        app: web\n    spec:\n      containers:\n      - name: web\n        image: nginx\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n---\napiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: nightly\nspec:\n  jobTemplate:\n    spec:\n      template:\n        metadata:\n          labels:\n            sidecar.istio.io/inject: \"false\"\n        spec:\n          containers:\n          - name: job\n            image: busybox\n";
        let (out, skipped) = inject_text(
            std::path::Path::new("in.yaml"),
            text,
            &InjectConfig::default(),
        )
        .expect("inject");
        let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&out)
            .map(|d| Value::deserialize(d).expect("yaml"))
            .filter(|v| !v.is_null())
            .collect();
        assert_eq!(docs.len(), 3);
        let containers = &docs[0]["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers[1]["name"], "istio-proxy");
        let owner = containers[1]["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == "ISTIO_META_OWNER"))
            .map(|v| v["value"].clone());
        assert_eq!(
            owner,
            Some(Value::from(
                "kubernetes://apis/apps/v1/namespaces/shop/deployments/web"
            ))
        );
        assert_eq!(docs[1]["kind"], "Service");
        assert_eq!(
            docs[2]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(
            skipped[0].contains("CronJob default/nightly"),
            "{skipped:?}"
        );
        let err = inject_text(
            std::path::Path::new("in.yaml"),
            "kind: Pod\nmetadata:\n  name: p\nspec:\n  containers: []\n",
            &InjectConfig::default(),
        )
        .expect_err("no containers");
        assert_eq!(err.to_string(), "Pod p: the pod spec has no containers");
    }
}
