//! `istioctl waypoint generate|apply|list|delete|status`, against a cluster (as Istio's
//! istioctl: the Gateway is server-side applied by `istioctl`, the namespace labelled with a
//! merge patch) or, given `--config-dir` / `ISTIOD_CONFIG_DIR`, the local mode's objects
//! directory (the directory istiod watches).
//!
//! `generate` prints the Gateway as Istio's istioctl does (class `istio-waypoint`, listener
//! `mesh` on 15008/HBONE, `istio.io/waypoint-for` from `--for`); `apply` writes it to
//! `waypoint-<namespace>-<name>.yaml` and, with `--enroll-namespace`, labels the namespace
//! `istio.io/use-waypoint=<name>`; `list` shows the waypoints; `delete` removes the files
//! `apply` wrote.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mesh_api::{label, Gateway, Object, WAYPOINT_CLASS};

use crate::cluster::Cluster;
use crate::table;

#[derive(Debug, clap::Subcommand)]
pub enum WaypointCommand {
    /// Print a waypoint Gateway.
    Generate(GenerateArgs),
    /// Create or update a waypoint Gateway in the objects directory.
    Apply(ApplyArgs),
    /// List the waypoints.
    List(ListArgs),
    /// Delete waypoints written by `apply`.
    Delete(DeleteArgs),
    /// Show whether waypoints are programmed (waits for them by default).
    Status(StatusArgs),
}

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    #[arg(long, default_value = "waypoint")]
    pub name: String,
    /// Traffic the waypoint handles: service, workload, all or none.
    #[arg(long = "for")]
    pub for_: Option<String>,
    /// The control-plane revision (`istio.io/rev`).
    #[arg(short = 'r', long)]
    pub revision: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub gateway: GenerateArgs,
    /// Label the namespace `istio.io/use-waypoint=<name>`.
    #[arg(long)]
    pub enroll_namespace: bool,
    /// Replace an existing `istio.io/use-waypoint` label of the namespace.
    #[arg(long)]
    pub overwrite: bool,
    /// Wait for the waypoint to be programmed (up to --timeout).
    #[arg(long)]
    pub wait: bool,
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub place: Place,
}

/// Where the waypoints live: the local mode's objects directory, else a cluster.
#[derive(Debug, Clone, clap::Args)]
pub struct Place {
    /// The local mode's objects directory [default: the cluster of the kubeconfig].
    #[arg(long, env = "ISTIOD_CONFIG_DIR")]
    pub config_dir: Option<PathBuf>,
    #[command(flatten)]
    pub kube: crate::cluster::KubeArgs,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    #[command(flatten)]
    pub place: Place,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// One waypoint (all of the namespace when absent).
    #[arg(long)]
    pub name: Option<String>,
    /// Wait until every waypoint shown is programmed.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub wait: bool,
    /// How long to wait.
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub place: Place,
}

#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    pub names: Vec<String>,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub place: Place,
}

#[derive(Debug, thiserror::Error)]
pub enum WaypointError {
    #[error("invalid --for {0:?}: expected service, workload, all or none")]
    BadFor(String),
    #[error("the waypoint name \"none\" is reserved (istio.io/use-waypoint: none opts out)")]
    ReservedName,
    #[error(
        "namespace {namespace} already uses waypoint {current:?}; pass --overwrite to replace it"
    )]
    LabelExists { namespace: String, current: String },
    #[error("namespace {namespace} is defined in {file} together with other objects; add the label istio.io/use-waypoint: {name} there")]
    SharedFile {
        namespace: String,
        file: String,
        name: String,
    },
    #[error("waypoint {namespace}/{name} is not programmed after {waited:?}: {why}; is the waypoint controller running, and is the waypoint pod ready on 15021?")]
    NotProgrammed {
        namespace: String,
        name: String,
        waited: Duration,
        why: String,
    },
    #[error("waypoint {namespace}/{name} was not written by `istioctl waypoint apply` ({file}); remove it from that file")]
    NotOurs {
        namespace: String,
        name: String,
        file: String,
    },
    #[error("no waypoint {namespace}/{name}")]
    NotFound { namespace: String, name: String },
    #[error("give waypoint names or --all")]
    NothingToDelete,
    #[error("cannot write {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode {what}: {detail}")]
    Encode { what: String, detail: String },
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error("namespace {0} does not exist")]
    NoNamespace(String),
    #[error("cannot read Gateway {what}: {detail}")]
    BadGateway { what: String, detail: String },
}

impl WaypointError {
    pub fn reason(&self) -> &'static str {
        match self {
            WaypointError::BadFor(_) => "bad_for",
            WaypointError::ReservedName => "reserved_name",
            WaypointError::LabelExists { .. } => "label_exists",
            WaypointError::SharedFile { .. } => "shared_file",
            WaypointError::NotProgrammed { .. } => "not_programmed",
            WaypointError::NotOurs { .. } => "not_ours",
            WaypointError::NotFound { .. } => "not_found",
            WaypointError::NothingToDelete => "nothing_to_delete",
            WaypointError::Io { .. } => "io",
            WaypointError::Encode { .. } => "encode",
            WaypointError::Cluster(_) => "cluster",
            WaypointError::NoNamespace(_) => "no_namespace",
            WaypointError::BadGateway { .. } => "bad_gateway",
        }
    }
}

/// The Gateway `generate` prints and `apply` writes.
pub fn gateway_yaml(args: &GenerateArgs) -> Result<String, WaypointError> {
    if args.name == "none" {
        return Err(WaypointError::ReservedName);
    }
    let mut labels = BTreeMap::new();
    if let Some(f) = &args.for_ {
        if !["service", "workload", "all", "none"].contains(&f.as_str()) {
            return Err(WaypointError::BadFor(f.clone()));
        }
        labels.insert(label::WAYPOINT_FOR.to_string(), f.clone());
    }
    if let Some(rev) = &args.revision {
        labels.insert(label::REV.to_string(), rev.clone());
    }
    let mut metadata = serde_json::json!({"name": args.name, "namespace": args.namespace});
    if !labels.is_empty() {
        metadata["labels"] = serde_json::json!(labels);
    }
    let gw = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": metadata,
        "spec": {
            "gatewayClassName": WAYPOINT_CLASS,
            "listeners": [{"name": "mesh", "port": mesh_capture::HBONE_PORT, "protocol": "HBONE"}],
        },
    });
    serde_yaml::to_string(&gw).map_err(|e| WaypointError::Encode {
        what: "the Gateway".into(),
        detail: e.to_string(),
    })
}

fn file_name(namespace: &str, name: &str) -> String {
    format!("waypoint-{namespace}-{name}.yaml")
}

/// Writes `text` to `path` through a temporary file and a rename (istiod never reads half).
fn write_atomic(path: &Path, text: &str) -> Result<(), WaypointError> {
    let io = |source| WaypointError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("yaml.tmp");
    std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Where a command reads and writes waypoints.
enum Backend {
    Dir(PathBuf),
    Cluster(Box<Cluster>),
}

impl Place {
    async fn open(&self) -> Result<Backend, WaypointError> {
        // Cluster flags on the command line win over an exported ISTIOD_CONFIG_DIR.
        Ok(match &self.config_dir {
            Some(dir) if !self.kube.given() => Backend::Dir(dir.clone()),
            _ => Backend::Cluster(Box::new(self.kube.cluster().await?)),
        })
    }
}

/// The Gateway API version waypoints are read and written at.
pub const GATEWAY_API: &str = "gateway.networking.k8s.io/v1";

/// The cluster's waypoint Gateways (class `istio-waypoint`) matching the label `selector`, as
/// stored; none when the cluster has no Gateway API.
pub async fn in_cluster(
    cluster: &mut Cluster,
    selector: &str,
) -> Result<Vec<serde_json::Value>, crate::cluster::ClusterError> {
    Ok(cluster
        .list(GATEWAY_API, "Gateway", selector)
        .await?
        .into_iter()
        .filter(|g| g["spec"]["gatewayClassName"] == WAYPOINT_CLASS)
        .collect())
}
/// The field manager of istioctl's writes to a cluster.
const FIELD_MANAGER: &str = "istioctl";

impl Backend {
    /// Every waypoint Gateway, with the file it is defined in (none in a cluster).
    async fn waypoints(&mut self) -> Result<Vec<(Option<PathBuf>, Gateway)>, WaypointError> {
        match self {
            Backend::Dir(dir) => Ok(waypoints(dir)
                .into_iter()
                .map(|(path, g)| (Some(path), g))
                .collect()),
            Backend::Cluster(cluster) => in_cluster(cluster, "")
                .await?
                .into_iter()
                .map(|g| {
                    let what = format!(
                        "{}/{}",
                        g["metadata"]["namespace"].as_str().unwrap_or_default(),
                        g["metadata"]["name"].as_str().unwrap_or_default()
                    );
                    serde_json::from_value::<Gateway>(g)
                        .map(|g| (None, g))
                        .map_err(|e| WaypointError::BadGateway {
                            what,
                            detail: e.to_string(),
                        })
                })
                .collect(),
        }
    }

    /// The waypoints of `namespace` (and `name`, if given).
    async fn selected(
        &mut self,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<Vec<Gateway>, WaypointError> {
        Ok(self
            .waypoints()
            .await?
            .into_iter()
            .map(|(_, g)| g)
            .filter(|g| g.metadata.namespace.as_deref().unwrap_or("default") == namespace)
            .filter(|g| name.is_none() || g.metadata.name.as_deref() == name)
            .collect())
    }
}

pub async fn apply(args: &ApplyArgs) -> Result<String, WaypointError> {
    let g = &args.gateway;
    let yaml = gateway_yaml(g)?;
    let mut backend = args.place.open().await?;
    let mut out = String::new();
    // In a cluster the namespace is checked first and labelled only once the Gateway exists,
    // so a failed apply never leaves the namespace pointing at no waypoint.
    let labels = match (&mut backend, args.enroll_namespace) {
        (Backend::Cluster(cluster), true) => {
            let labels = namespace_labels(cluster, &g.namespace).await?;
            out.push_str(&enroll_checks(args, &labels)?);
            Some(labels)
        }
        _ => None,
    };
    match &mut backend {
        Backend::Dir(dir) => write_atomic(&dir.join(file_name(&g.namespace, &g.name)), &yaml)?,
        Backend::Cluster(cluster) => {
            let value: serde_json::Value =
                serde_yaml::from_str(&yaml).map_err(|e| WaypointError::Encode {
                    what: "the Gateway".into(),
                    detail: e.to_string(),
                })?;
            cluster.apply(&value, &g.namespace, FIELD_MANAGER).await?;
        }
    }
    match (&mut backend, args.enroll_namespace) {
        (Backend::Dir(dir), true) => out.push_str(&enroll(args, dir)?),
        (Backend::Cluster(cluster), true) if labels.is_some() => {
            label_namespace(cluster, args).await?;
            out.push_str(&labeled(args));
        }
        _ => {}
    }
    out.push_str(&format!("waypoint {}/{} applied\n", g.namespace, g.name));
    if args.wait {
        wait_programmed(&mut backend, &g.namespace, &g.name, args.timeout).await?;
        out.push_str(&format!(
            "waypoint {}/{} is programmed\n",
            g.namespace, g.name
        ));
    }
    Ok(out)
}

/// The Gateway's `Programmed` condition: (status, reason, message), `None` before any.
fn programmed(g: &Gateway) -> Option<(String, String, String)> {
    let c = (g.status.as_ref())?
        .conditions
        .iter()
        .find(|c| c.type_ == "Programmed")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Reads the waypoint every second until `namespace/name` is `Programmed=True`.
async fn wait_programmed(
    backend: &mut Backend,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), WaypointError> {
    let start = Instant::now();
    loop {
        let found = backend.selected(namespace, Some(name)).await?;
        let why = match found.first().map(programmed) {
            None => "the Gateway does not exist".to_string(),
            Some(None) => "no status yet".to_string(),
            Some(Some((status, _, _))) if status == "True" => return Ok(()),
            Some(Some((_, reason, message))) => format!("{reason}: {message}"),
        };
        if start.elapsed() >= timeout {
            return Err(WaypointError::NotProgrammed {
                namespace: namespace.into(),
                name: name.into(),
                waited: timeout,
                why,
            });
        }
        tokio::time::sleep(Duration::from_secs(1).min(timeout)).await;
    }
}

/// `NAME STATUS TYPE REASON MESSAGE` for the waypoints of a namespace (or one), after waiting
/// for them to be programmed when asked.
pub async fn status(args: &StatusArgs) -> Result<String, WaypointError> {
    let mut backend = args.place.open().await?;
    let found = backend
        .selected(&args.namespace, args.name.as_deref())
        .await?;
    if found.is_empty() {
        return Err(WaypointError::NotFound {
            namespace: args.namespace.clone(),
            name: args.name.clone().unwrap_or_else(|| "*".into()),
        });
    }
    if args.wait {
        for g in &found {
            let name = g.metadata.name.clone().unwrap_or_default();
            wait_programmed(&mut backend, &args.namespace, &name, args.timeout).await?;
        }
    }
    let rows: Vec<Vec<String>> = backend
        .selected(&args.namespace, args.name.as_deref())
        .await?
        .iter()
        .map(|g| {
            let (status, reason, message) = programmed(g)
                .unwrap_or_else(|| ("False".into(), "Pending".into(), "no status yet".into()));
            vec![
                g.metadata.name.clone().unwrap_or_default(),
                status,
                "Programmed".into(),
                reason,
                message,
            ]
        })
        .collect();
    Ok(table::render(
        &["NAME", "STATUS", "TYPE", "REASON", "MESSAGE"],
        &rows,
        1,
    ))
}

/// The label checks enrolling makes: an existing different waypoint needs `--overwrite`; a
/// namespace outside ambient gets a warning.
fn enroll_checks(
    args: &ApplyArgs,
    labels: &BTreeMap<String, String>,
) -> Result<String, WaypointError> {
    let g = &args.gateway;
    if let Some(current) = labels.get(label::USE_WAYPOINT) {
        if current != &g.name && !args.overwrite {
            return Err(WaypointError::LabelExists {
                namespace: g.namespace.clone(),
                current: current.clone(),
            });
        }
    }
    let mut note = String::new();
    if labels.get(label::DATAPLANE_MODE).map(String::as_str) != Some(label::DATAPLANE_MODE_AMBIENT)
    {
        note.push_str(&format!(
            "warning: namespace {} is not enrolled in ambient (label {}={}); its pods' traffic does not reach the waypoint until it is\n",
            g.namespace,
            label::DATAPLANE_MODE,
            label::DATAPLANE_MODE_AMBIENT
        ));
    }
    Ok(note)
}

fn labeled(args: &ApplyArgs) -> String {
    format!(
        "namespace {} labeled with \"{}: {}\"\n",
        args.gateway.namespace,
        label::USE_WAYPOINT,
        args.gateway.name
    )
}

/// The labels of the cluster's namespace (an error when it does not exist).
async fn namespace_labels(
    cluster: &mut Cluster,
    namespace: &str,
) -> Result<BTreeMap<String, String>, WaypointError> {
    let ns = cluster
        .get("v1", "Namespace", "", namespace)
        .await?
        .ok_or_else(|| WaypointError::NoNamespace(namespace.to_string()))?;
    Ok(serde_json::from_value(ns["metadata"]["labels"].clone()).unwrap_or_default())
}

/// Labels the cluster's namespace `istio.io/use-waypoint=<name>` (a merge patch).
async fn label_namespace(cluster: &mut Cluster, args: &ApplyArgs) -> Result<(), WaypointError> {
    let g = &args.gateway;
    let patch = serde_json::json!({"metadata": {"labels": {label::USE_WAYPOINT: g.name}}});
    cluster
        .merge_patch("v1", "Namespace", "", &g.namespace, &patch)
        .await?;
    Ok(())
}

/// Labels the namespace `istio.io/use-waypoint=<name>`, writing its file back.
fn enroll(args: &ApplyArgs, dir: &Path) -> Result<String, WaypointError> {
    let g = &args.gateway;
    let (objects, _) = mesh_source::load_directory(dir);
    let found = objects.iter().find_map(|(path, o)| match &**o {
        Object::Namespace(ns) if ns.metadata.name.as_deref() == Some(g.namespace.as_str()) => {
            Some((path.clone(), (**ns).clone()))
        }
        _ => None,
    });
    let (path, mut ns) = match found {
        Some((path, ns)) => {
            let shared = objects.iter().filter(|(p, _)| *p == path).count() > 1;
            if shared {
                return Err(WaypointError::SharedFile {
                    namespace: g.namespace.clone(),
                    file: path.display().to_string(),
                    name: g.name.clone(),
                });
            }
            (path, ns)
        }
        None => {
            let mut ns = mesh_api::Namespace::default();
            ns.metadata.name = Some(g.namespace.clone());
            (dir.join(format!("namespace-{}.yaml", g.namespace)), ns)
        }
    };
    let labels = ns.metadata.labels.get_or_insert_with(BTreeMap::new);
    let mut note = enroll_checks(args, labels)?;
    labels.insert(label::USE_WAYPOINT.to_string(), g.name.clone());
    let mut value = serde_json::to_value(&ns).map_err(|e| WaypointError::Encode {
        what: format!("namespace {}", g.namespace),
        detail: e.to_string(),
    })?;
    value["apiVersion"] = "v1".into();
    value["kind"] = "Namespace".into();
    let yaml = serde_yaml::to_string(&value).map_err(|e| WaypointError::Encode {
        what: format!("namespace {}", g.namespace),
        detail: e.to_string(),
    })?;
    write_atomic(&path, &yaml)?;
    note.push_str(&labeled(args));
    Ok(note)
}

fn waypoints(dir: &Path) -> Vec<(PathBuf, Gateway)> {
    let (objects, _) = mesh_source::load_directory(dir);
    objects
        .into_iter()
        .filter_map(|(path, o)| match &*o {
            Object::Gateway(g) if g.spec.gateway_class_name == WAYPOINT_CLASS => {
                Some((path, (**g).clone()))
            }
            _ => None,
        })
        .collect()
}

pub async fn list(args: &ListArgs) -> Result<String, WaypointError> {
    let mut backend = args.place.open().await?;
    let mut rows = Vec::new();
    for (_, g) in backend.waypoints().await? {
        let ns = g
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        if !args.all_namespaces && ns != args.namespace {
            continue;
        }
        let labels = g.metadata.labels.clone().unwrap_or_default();
        let programmed = g
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Programmed"))
            .map_or("False".to_string(), |c| c.status.clone());
        let mut row = vec![
            g.metadata.name.clone().unwrap_or_default(),
            labels
                .get(label::REV)
                .cloned()
                .unwrap_or_else(|| "default".into()),
            labels
                .get(label::WAYPOINT_FOR)
                .cloned()
                .unwrap_or_else(|| "service".into()),
            programmed,
        ];
        if args.all_namespaces {
            row.insert(0, ns);
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Ok(if args.all_namespaces {
            "No waypoints found.\n".to_string()
        } else {
            format!("No waypoints found in namespace {}.\n", args.namespace)
        });
    }
    let header: &[&str] = if args.all_namespaces {
        &[
            "NAMESPACE",
            "NAME",
            "REVISION",
            "TRAFFIC TYPE",
            "PROGRAMMED",
        ]
    } else {
        &["NAME", "REVISION", "TRAFFIC TYPE", "PROGRAMMED"]
    };
    Ok(table::render(header, &rows, 1))
}

pub async fn delete(args: &DeleteArgs) -> Result<String, WaypointError> {
    let mut backend = args.place.open().await?;
    let found: Vec<(Option<PathBuf>, Gateway)> = backend
        .waypoints()
        .await?
        .into_iter()
        .filter(|(_, g)| g.metadata.namespace.as_deref().unwrap_or("default") == args.namespace)
        .collect();
    let names: Vec<String> = if args.all {
        found
            .iter()
            .filter_map(|(_, g)| g.metadata.name.clone())
            .collect()
    } else if args.names.is_empty() {
        return Err(WaypointError::NothingToDelete);
    } else {
        args.names.clone()
    };
    let mut out = String::new();
    for name in names {
        let Some((path, _)) = found
            .iter()
            .find(|(_, g)| g.metadata.name.as_deref() == Some(name.as_str()))
        else {
            return Err(WaypointError::NotFound {
                namespace: args.namespace.clone(),
                name,
            });
        };
        match (&mut backend, path) {
            (Backend::Dir(_), Some(path)) => {
                if path.file_name().and_then(|f| f.to_str())
                    != Some(file_name(&args.namespace, &name).as_str())
                {
                    return Err(WaypointError::NotOurs {
                        namespace: args.namespace.clone(),
                        name,
                        file: path.display().to_string(),
                    });
                }
                std::fs::remove_file(path).map_err(|source| WaypointError::Io {
                    path: path.display().to_string(),
                    source,
                })?;
            }
            (Backend::Cluster(cluster), _) => {
                cluster
                    .delete(GATEWAY_API, "Gateway", &args.namespace, &name)
                    .await?;
            }
            (Backend::Dir(_), None) => {}
        }
        out.push_str(&format!("waypoint {}/{name} deleted\n", args.namespace));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(ns: &str, name: &str, for_: Option<&str>) -> GenerateArgs {
        GenerateArgs {
            namespace: ns.into(),
            name: name.into(),
            for_: for_.map(str::to_string),
            revision: None,
        }
    }

    #[test]
    fn generates_istios_waypoint_gateway() {
        let y = gateway_yaml(&gen("shop", "waypoint", Some("all"))).expect("yaml");
        let v: serde_json::Value = serde_yaml::from_str(&y).expect("parses");
        assert_eq!(v["spec"]["gatewayClassName"], "istio-waypoint");
        assert_eq!(
            v["spec"]["listeners"][0],
            serde_json::json!({"name": "mesh", "port": 15008, "protocol": "HBONE"})
        );
        assert_eq!(v["metadata"]["labels"]["istio.io/waypoint-for"], "all");
        assert!(matches!(
            gateway_yaml(&gen("shop", "none", None)),
            Err(WaypointError::ReservedName)
        ));
        assert!(matches!(
            gateway_yaml(&gen("shop", "w", Some("pods"))),
            Err(WaypointError::BadFor(_))
        ));
    }

    fn place(dir: &Path) -> Place {
        Place {
            config_dir: Some(dir.to_path_buf()),
            kube: Default::default(),
        }
    }

    #[tokio::test]
    async fn apply_enroll_list_delete_in_a_directory() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(
            dir.path().join("ns.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n  labels:\n    istio.io/dataplane-mode: ambient\n",
        )
        .expect("ns");
        let apply_args = |overwrite: bool, name: &str| ApplyArgs {
            gateway: gen("shop", name, None),
            enroll_namespace: true,
            overwrite,
            wait: false,
            timeout: Duration::from_secs(1),
            place: place(dir.path()),
        };
        let out = apply(&apply_args(false, "waypoint")).await.expect("apply");
        assert!(out.contains("labeled") && !out.contains("warning"), "{out}");
        let ns = std::fs::read_to_string(dir.path().join("ns.yaml")).expect("ns");
        assert!(
            ns.contains("istio.io/use-waypoint: waypoint")
                && ns.contains("dataplane-mode: ambient"),
            "{ns}"
        );
        // The result decodes as the objects istiod reads.
        let (objects, errors) = mesh_source::load_directory(dir.path());
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(objects.len(), 2);
        let listing = list(&ListArgs {
            namespace: "shop".into(),
            all_namespaces: false,
            place: place(dir.path()),
        })
        .await
        .expect("list");
        assert_eq!(
            listing,
            "NAME     REVISION TRAFFIC TYPE PROGRAMMED\nwaypoint default  service      False\n"
        );
        // A second waypoint needs --overwrite to take over the namespace.
        let err = apply(&apply_args(false, "other"))
            .await
            .expect_err("label exists");
        assert_eq!(err.reason(), "label_exists");
        apply(&apply_args(true, "other")).await.expect("overwrite");
        let del = delete(&DeleteArgs {
            names: vec![],
            namespace: "shop".into(),
            all: true,
            place: place(dir.path()),
        })
        .await
        .expect("delete");
        assert_eq!(del.lines().count(), 2, "{del}");
        assert_eq!(waypoints(dir.path()).len(), 0);
    }

    #[tokio::test]
    async fn wait_and_status_follow_the_programmed_condition() {
        let dir = tempfile::tempdir().expect("dir");
        let args = ApplyArgs {
            gateway: gen("shop", "waypoint", None),
            enroll_namespace: false,
            overwrite: false,
            wait: true,
            timeout: Duration::from_millis(1500),
            place: place(dir.path()),
        };
        let err = apply(&args).await.expect_err("nobody programs it");
        assert_eq!(err.reason(), "not_programmed");
        assert!(err.to_string().contains("no status yet"), "{err}");
        let status_args = |wait: bool| StatusArgs {
            namespace: "shop".into(),
            name: None,
            wait,
            timeout: Duration::from_millis(1500),
            place: place(dir.path()),
        };
        let table = status(&status_args(false)).await.expect("status");
        assert!(
            table.contains("waypoint False  Programmed Pending"),
            "{table}"
        );
        let writer = mesh_source::DirectoryWriter::new(dir.path(), "controller");
        let key = mesh_api::ObjectKey::new(mesh_api::Kind::Gateway, "shop", "waypoint");
        let programmed = serde_json::json!({"conditions": [{"type": "Programmed", "status": "True",
            "reason": "Programmed", "message": "Resource programmed"}]});
        writer
            .write_status(&key, Some(&programmed))
            .expect("status");
        let table = status(&status_args(true)).await.expect("programmed");
        assert_eq!(
            table,
            "NAME     STATUS TYPE       REASON     MESSAGE\nwaypoint True   Programmed Programmed Resource programmed\n"
        );
        assert!(apply(&args)
            .await
            .expect("programmed")
            .contains("is programmed"));
    }
}
