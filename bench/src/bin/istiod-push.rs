//! Control-plane push convergence: istiod with N Pods and M Services and C concurrent delta-xDS
//! clients (as ztunnels). The cluster is generated YAML in a directory (`--source dir`) or the
//! same objects in the fake Kubernetes API server (`--source kube`, run on its own thread).
//! Measures the time from one Pod change (a file renamed in place, or an update through the
//! API) until every client has it, and istiod's RSS. Prints a table.
//!
//! With `--csr-storm N` (default 1,000) it then sends N concurrent CreateCertificate calls to
//! the CA and changes one Pod while they run, to show how much the storm delays a push.
//!
//! Usage: istiod-push --istiod <path-to-istiod-binary> [--source dir|kube --pods 10000
//!        --services 1000 --clients 500 --changes 20 --csr-storm 1000]
//!
//! The clients are `mesh_bench::ads_client`'s lean ones, so that a thousand fit in one process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use mesh_bench::ads_client::DeltaAds;
use mesh_bench::{percentile, print_table};
use mesh_proto::discovery::DeltaDiscoveryRequest;
use mesh_proto::envoy::pb::envoy::config::core::v3::Node;
use mesh_proto::type_url;
use mesh_testutil::kube_api::{core_types, FakeApiServer};
use serde::Deserialize;
use tokio::sync::{mpsc, Barrier};

/// Set once every figure is taken: clients' streams may end from then on.
static MEASURED: AtomicBool = AtomicBool::new(false);

#[derive(Parser, Debug)]
struct Args {
    /// The istiod binary to run.
    #[arg(long)]
    istiod: PathBuf,
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    #[arg(long, default_value_t = 1_000)]
    services: usize,
    #[arg(long, default_value_t = 500)]
    clients: usize,
    /// Pod changes to measure.
    #[arg(long, default_value_t = 20)]
    changes: usize,
    /// Unmeasured changes first. The first change after 500 clients absorbed the full state is
    /// received late *inside this benchmark process* (its client tasks are still digesting the
    /// multi-megabyte initial responses); a separate watcher process sees it as fast as the rest.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Pause between the initial sync and the first change.
    #[arg(long, default_value_t = 0)]
    settle_ms: u64,
    /// Keep istiod's log (at info level) in this file.
    #[arg(long)]
    istiod_log: Option<PathBuf>,
    /// Base port: xDS on +10, debug HTTP on +80.
    #[arg(long, default_value_t = 25000)]
    base_port: u16,
    /// Where istiod reads the cluster: `dir` (YAML files) or `kube` (the fake API server).
    #[arg(long, default_value = "dir")]
    source: SourceKind,
    /// Concurrent CreateCertificate calls during the storm phase (0: no storm).
    #[arg(long, default_value_t = 1_000)]
    csr_storm: usize,
}

impl Args {
    fn services_per_ns(&self) -> usize {
        self.services.div_ceil(NAMESPACES)
    }

    /// Pods per namespace, at most [`MAX_PODS_PER_NS`].
    fn pods_per_ns(&self) -> usize {
        self.pods.div_ceil(NAMESPACES).min(MAX_PODS_PER_NS)
    }
}

/// The bearer token the storm's CSRs carry, and the identity istiod's token file gives it.
const STORM_TOKEN: &str = "bench-storm-token";
const STORM_IDENTITY: &str = "spiffe://cluster.local/ns/ns-0/sa/default";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum SourceKind {
    Dir,
    Kube,
}

/// Where the generated cluster lives, and how one Pod is changed.
enum Cluster {
    Dir(PathBuf),
    Api {
        api: FakeApiServer,
        kubeconfig: PathBuf,
    },
}

impl Cluster {
    /// The istiod flag that names the source.
    fn flag(&self) -> String {
        match self {
            Cluster::Dir(dir) => format!("--config-dir={}", dir.display()),
            Cluster::Api { kubeconfig, .. } => format!("--kubeconfig={}", kubeconfig.display()),
        }
    }

    /// Writes the new revision of pod `i` in namespace `ns`; returns when it was written.
    fn change_pod(
        &self,
        ns: usize,
        i: usize,
        revision: usize,
        services_per_ns: usize,
    ) -> anyhow::Result<Instant> {
        match self {
            Cluster::Dir(dir) => {
                let path = dir.join(format!("ns-{ns}/pod-{i}.yaml"));
                let tmp = dir.join(format!("ns-{ns}/.pod-{i}.yaml.tmp"));
                std::fs::write(&tmp, pod_yaml(ns, i, revision, services_per_ns))?;
                let t0 = Instant::now();
                std::fs::rename(&tmp, &path)?;
                Ok(t0)
            }
            Cluster::Api { api, .. } => {
                let pod: serde_json::Value =
                    serde_yaml::from_str(&pod_yaml(ns, i, revision, services_per_ns))?;
                let t0 = Instant::now();
                api.seed(pod)
                    .map_err(|e| anyhow::anyhow!("update pod: {e:?}"))?;
                Ok(t0)
            }
        }
    }
}

/// The fake API server on a thread and runtime of its own, so that serving watches never
/// waits behind the benchmark's 500 clients.
fn start_fake_api() -> anyhow::Result<FakeApiServer> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                let _ = tx.send(Err(anyhow::anyhow!("runtime: {e}")));
                return;
            }
        };
        rt.block_on(async move {
            let started = FakeApiServer::start(core_types())
                .await
                .map_err(|e| anyhow::anyhow!("fake API server: {e}"));
            let _ = tx.send(started);
            std::future::pending::<()>().await;
        });
    });
    rx.recv().context("fake API server thread")?
}

/// Every document of the generated directory, seeded into `api`.
fn seed_from(dir: &Path, api: &FakeApiServer) -> anyhow::Result<usize> {
    let mut n = 0;
    for entry in walk(dir)? {
        let text = std::fs::read_to_string(&entry)?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(doc)?;
            api.seed(value)
                .map_err(|e| anyhow::anyhow!("seed {}: {e:?}", entry.display()))?;
            n += 1;
        }
    }
    Ok(n)
}

fn walk(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

const NAMESPACES: usize = 100;
/// Pods of one namespace; also the stride of the cluster-wide Pod numbering behind Pod IPs.
const MAX_PODS_PER_NS: usize = 1_000;
/// HTTP/2 receive windows of the clients (ztunnel's `HTTP2_CONNECTION_WINDOW_SIZE` is 16 MiB).
const WINDOW: u32 = 16 << 20;

/// Pod `i` of namespace `ns`, selected by Service `svc-<i mod services_per_ns>`. Pod IPs are
/// numbered across the whole cluster (10.1.0.1 upwards), so they stay unique beyond 250 Pods a
/// namespace.
fn pod_yaml(ns: usize, i: usize, revision: usize, services_per_ns: usize) -> String {
    let svc = i % services_per_ns.max(1);
    let n = ns * MAX_PODS_PER_NS + i + 1;
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-{i}\n  namespace: ns-{ns}\n  labels:\n    app: svc-{svc}\n    version: v{revision}\nspec:\n  nodeName: node-{node}\n  serviceAccountName: sa-{svc}\n  containers:\n  - name: app\n    image: app\n    ports:\n    - name: http\n      containerPort: 8080\nstatus:\n  phase: Running\n  podIP: 10.{a}.{b}.{c}\n  conditions:\n  - type: Ready\n    status: \"True\"\n",
        node = i % 50,
        a = 1 + n / 65_536,
        b = (n / 256) % 256,
        c = n % 256,
    )
}

fn write_cluster(dir: &Path, args: &Args) -> anyhow::Result<Vec<(usize, usize)>> {
    let per_ns_svcs = args.services_per_ns();
    let mut pod_ids = Vec::new();
    for ns in 0..NAMESPACES {
        let nsdir = dir.join(format!("ns-{ns}"));
        std::fs::create_dir_all(&nsdir)?;
        let mut head = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns-{ns}\n  labels:\n    istio.io/dataplane-mode: ambient\n"
        );
        for s in 0..per_ns_svcs {
            head.push_str(&format!(
                "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{s}\n  namespace: ns-{ns}\nspec:\n  clusterIP: 10.96.{ns}.{ip}\n  selector:\n    app: svc-{s}\n  ports:\n  - name: http\n    port: 80\n    targetPort: http\n",
                ip = s + 1
            ));
        }
        std::fs::write(nsdir.join("namespace.yaml"), head)?;
        for i in 0..args.pods_per_ns() {
            std::fs::write(
                nsdir.join(format!("pod-{i}.yaml")),
                pod_yaml(ns, i, 0, per_ns_svcs),
            )?;
            pod_ids.push((ns, i));
        }
    }
    Ok(pod_ids)
}

/// `VmRSS` (now) or `VmHWM` (the peak so far) of `pid`, in MiB.
fn status_mib(pid: u32, field: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .with_context(|| format!("no {field}"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb / 1024.0)
}

fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    status_mib(pid, "VmRSS")
}

fn start_istiod(
    args: &Args,
    cluster: &Cluster,
    state: &Path,
    tokens: &Path,
) -> anyhow::Result<Child> {
    let p = args.base_port;
    Command::new(&args.istiod)
        .arg(cluster.flag())
        .arg(format!("--state-dir={}", state.display()))
        .arg(format!("--tokens-file={}", tokens.display()))
        .arg(format!("--grpc-addr=127.0.0.1:{}", p + 10))
        .arg(format!("--secure-grpc-addr=127.0.0.1:{}", p + 12))
        .arg(format!("--monitoring-addr=127.0.0.1:{}", p + 14))
        .arg(format!("--webhook-addr=127.0.0.1:{}", p + 17))
        .arg(format!("--http-addr=127.0.0.1:{}", p + 80))
        .env(
            "RUST_LOG",
            std::env::var("ISTIOD_RUST_LOG").unwrap_or_else(|_| {
                if args.istiod_log.is_some() {
                    "info"
                } else {
                    "warn"
                }
                .to_string()
            }),
        )
        .stdout(Stdio::null())
        .stderr(match &args.istiod_log {
            Some(p) => Stdio::from(std::fs::File::create(p).context("creating the istiod log")?),
            None => Stdio::inherit(),
        })
        .spawn()
        .context("starting istiod")
}

/// One client: wildcard-subscribes to Address and Authorization, ACKs everything, and reports
/// (client, resource name, receive time) for every resource it receives.
async fn client(
    id: usize,
    addr: std::net::SocketAddr,
    ready: Arc<Barrier>,
    seen: mpsc::UnboundedSender<(String, Instant)>,
) -> anyhow::Result<()> {
    let node = Node {
        id: format!(
            "ztunnel~10.255.{}.{}~ztunnel-{id}.istio-system~istio-system.svc.cluster.local",
            id / 250,
            id % 250
        ),
        ..Default::default()
    };
    let first: Vec<DeltaDiscoveryRequest> = [type_url::ADDRESS, type_url::AUTHORIZATION]
        .into_iter()
        .map(|t| DeltaDiscoveryRequest {
            node: Some(node.clone()),
            type_url: t.to_string(),
            ..Default::default()
        })
        .collect();
    let mut ads = DeltaAds::connect(addr, WINDOW, &first).await?;
    let mut initial = true;
    while let Some(resp) = ads.next().await? {
        let now = Instant::now();
        ads.send(&DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        })?;
        if resp.type_url == type_url::ADDRESS && initial {
            initial = false;
            ready.wait().await;
            continue;
        }
        for name in resp.names {
            let _ = seen.send((name, now));
        }
    }
    bail!("client {id}: stream ended")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let root = std::env::temp_dir().join(format!("istiod-push-bench-{}", std::process::id()));
    let dir = root.join("cluster");
    let state = root.join("state");
    std::fs::create_dir_all(&dir)?;
    std::fs::create_dir_all(&state)?;
    let tokens = root.join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!("tokens:\n- token: {STORM_TOKEN}\n  identity: {STORM_IDENTITY}\n"),
    )?;
    let t = Instant::now();
    let pod_ids = write_cluster(&dir, &args)?;
    eprintln!(
        "wrote {} pods / {} services in {:?}",
        pod_ids.len(),
        args.services,
        t.elapsed()
    );

    let cluster = match args.source {
        SourceKind::Dir => Cluster::Dir(dir.clone()),
        SourceKind::Kube => {
            let api = start_fake_api()?;
            let t = Instant::now();
            // istiod's own namespace, where its locks live.
            api.seed(serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "istio-system"}}))
                .map_err(|e| anyhow::anyhow!("seed istio-system: {e:?}"))?;
            let n = seed_from(&dir, &api)?;
            eprintln!(
                "seeded {n} objects into the fake API server in {:?}",
                t.elapsed()
            );
            let kubeconfig = root.join("kubeconfig");
            std::fs::write(&kubeconfig, api.kubeconfig())?;
            Cluster::Api { api, kubeconfig }
        }
    };
    let mut istiod = start_istiod(&args, &cluster, &state, &tokens)?;
    let result = run(&args, &cluster, &pod_ids, istiod.id(), &state).await;
    let _ = istiod.kill();
    let _ = istiod.wait();
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn wait_ready(port: u16) -> anyhow::Result<Duration> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let ready = mesh_testutil::http_get(addr, "/ready", Duration::from_secs(5)).await;
        if ready.is_ok_and(|response| response.status == 200) {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("istiod not ready after 120 s")
}

async fn run(
    args: &Args,
    cluster: &Cluster,
    pod_ids: &[(usize, usize)],
    pid: u32,
    state: &Path,
) -> anyhow::Result<()> {
    let ready_after = wait_ready(args.base_port + 80).await?;
    let rss_idle = rss_mib(pid)?;
    eprintln!(
        "istiod ready in {ready_after:?}, RSS {rss_idle:.1} MiB; connecting {} clients",
        args.clients
    );

    let barrier = Arc::new(Barrier::new(args.clients + 1));
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], args.base_port + 10));
    let t = Instant::now();
    for id in 0..args.clients {
        let (b, s) = (barrier.clone(), seen_tx.clone());
        tokio::spawn(async move {
            // Streams end with an error once istiod is stopped after the measurements.
            if let Err(e) = client(id, addr, b, s).await {
                if !MEASURED.load(Ordering::Relaxed) {
                    eprintln!("client {id}: {e:#}");
                }
            }
        });
    }
    barrier.wait().await;
    let initial_sync = t.elapsed();
    let rss_connected = rss_mib(pid)?;
    eprintln!("all clients synced in {initial_sync:?}; RSS {rss_connected:.1} MiB");

    tokio::time::sleep(Duration::from_millis(args.settle_ms)).await;
    let mut per_client = Vec::new();
    let mut all_clients = Vec::new();
    for change in 0..args.warmup + args.changes {
        let measured = change >= args.warmup;
        let (ns, i) = pod_ids[(change * 7919) % pod_ids.len()];
        let name = format!("Kubernetes//Pod/ns-{ns}/pod-{i}");
        let t0 = cluster.change_pod(ns, i, change + 1, args.services_per_ns())?;
        if std::env::var_os("BENCH_TRACE").is_some() {
            let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            eprintln!("change {change}: renamed at unix {:.3}", wall.as_secs_f64());
        }
        let mut got = 0;
        let mut this_change = Vec::new();
        let deadline = t0 + Duration::from_secs(30);
        while got < args.clients {
            let (n, at) = tokio::time::timeout_at(deadline.into(), seen_rx.recv())
                .await
                .with_context(|| {
                    format!(
                        "change {change}: only {got}/{} clients got {name}",
                        args.clients
                    )
                })?
                .context("clients gone")?;
            if n == name {
                got += 1;
                let ms = at.duration_since(t0).as_secs_f64() * 1e3;
                this_change.push(ms);
                if measured {
                    per_client.push(ms);
                }
                if got == args.clients {
                    eprintln!(
                        "change {change}{}: p50 {:.1} ms, p90 {:.1} ms, every client has it after {ms:.1} ms",
                        if measured { "" } else { " (warm-up)" },
                        percentile(&mut this_change, 50.0),
                        percentile(&mut this_change, 90.0)
                    );
                    if measured {
                        all_clients.push(ms);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let storm = match args.csr_storm {
        0 => None,
        n => {
            let (ns, i) = pod_ids[(args.warmup + args.changes) * 7919 % pod_ids.len()];
            let change = args.warmup + args.changes + 1;
            Some(csr_storm(args, cluster, state, n, (ns, i, change), &mut seen_rx).await?)
        }
    };
    let rss_after = rss_mib(pid)?;
    let rss_peak = status_mib(pid, "VmHWM")?;
    MEASURED.store(true, Ordering::Relaxed);
    print_table(
        &["measure", "value"],
        &[
            vec!["source".into(), format!("{:?}", args.source)],
            vec![
                "pods / services / clients".into(),
                format!("{} / {} / {}", pod_ids.len(), args.services, args.clients),
            ],
            vec![
                "measured changes (+ unmeasured warm-up)".into(),
                format!("{} (+{})", args.changes, args.warmup),
            ],
            vec![
                "istiod ready (initial load)".into(),
                format!("{:.0} ms", ready_after.as_secs_f64() * 1e3),
            ],
            vec![
                "all clients initial sync".into(),
                format!("{:.0} ms", initial_sync.as_secs_f64() * 1e3),
            ],
            vec![
                "one Pod change -> a client has it, p50".into(),
                format!("{:.1} ms", percentile(&mut per_client, 50.0)),
            ],
            vec![
                "one Pod change -> a client has it, p99".into(),
                format!("{:.1} ms", percentile(&mut per_client, 99.0)),
            ],
            vec![
                "one Pod change -> every client has it, p50".into(),
                format!("{:.1} ms", percentile(&mut all_clients, 50.0)),
            ],
            vec![
                "one Pod change -> every client has it, p99".into(),
                format!("{:.1} ms", percentile(&mut all_clients, 99.0)),
            ],
            vec!["(debounce quiet period included)".into(), "100 ms".into()],
            vec![
                "istiod RSS idle / connected / after".into(),
                format!("{rss_idle:.0} / {rss_connected:.0} / {rss_after:.0} MiB"),
            ],
            vec![
                "istiod RSS peak (VmHWM)".into(),
                format!("{rss_peak:.0} MiB"),
            ],
        ]
        .into_iter()
        .chain(
            storm
                .map(|s| s.rows(percentile(&mut all_clients, 50.0)))
                .into_iter()
                .flatten(),
        )
        .collect::<Vec<_>>(),
    );
    Ok(())
}

/// What the CSR storm phase measured.
struct Storm {
    calls: usize,
    signed: usize,
    duration: Duration,
    /// One Pod change made as the storm started, until every client had it.
    push_during: Duration,
}

impl Storm {
    fn rows(&self, quiet_p50_ms: f64) -> Vec<Vec<String>> {
        let during = self.push_during.as_secs_f64() * 1e3;
        vec![
            vec![
                "CSR storm: concurrent CreateCertificate calls / signed".into(),
                format!("{} / {}", self.calls, self.signed),
            ],
            vec![
                "CSR storm: all answered after".into(),
                format!("{:.0} ms", self.duration.as_secs_f64() * 1e3),
            ],
            vec![
                "one Pod change during the storm -> every client has it".into(),
                format!("{during:.1} ms"),
            ],
            vec![
                "push delay from the storm (target <= 50 ms)".into(),
                format!("{:+.1} ms against the quiet p50", during - quiet_p50_ms),
            ],
        ]
    }
}

/// Sends `calls` CreateCertificate requests at once (CSRs made beforehand) and changes one
/// Pod as they go out; returns when both the calls and the change are done.
async fn csr_storm(
    args: &Args,
    cluster: &Cluster,
    state: &Path,
    calls: usize,
    (ns, i, version): (usize, usize, usize),
    seen_rx: &mut mpsc::UnboundedReceiver<(String, Instant)>,
) -> anyhow::Result<Storm> {
    use mesh_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
    let identity: mesh_identity::Identity = STORM_IDENTITY.parse()?;
    let t = Instant::now();
    let csrs: Vec<String> = (0..calls)
        .map(|_| mesh_identity::generate_csr(&identity).map(|c| c.csr_pem))
        .collect::<Result<_, _>>()?;
    eprintln!("made {calls} CSRs in {:?}; the storm starts", t.elapsed());
    let root = state.join("root-cert.pem");
    let address = format!("https://127.0.0.1:{}", args.base_port + 12);
    // The CA client ztunnel uses: one HTTP/2 connection for every call.
    let channel = mesh_grpc::Endpoint::new(&address, &root, None)?.channel();
    let mut metadata = http::HeaderMap::new();
    metadata.insert(
        http::header::AUTHORIZATION,
        http::HeaderValue::try_from(format!("Bearer {STORM_TOKEN}"))?,
    );
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for csr in csrs {
        let (channel, metadata) = (channel.clone(), metadata.clone());
        tasks.spawn(async move {
            let request = IstioCertificateRequest {
                csr,
                validity_duration: 3600,
                metadata: None,
            };
            channel
                .unary::<_, IstioCertificateResponse>(
                    mesh_proto::CREATE_CERTIFICATE_PATH,
                    &metadata,
                    &request,
                    None,
                )
                .await
                .is_ok()
        });
    }
    // The change goes in while the calls are in flight.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let name = format!("Kubernetes//Pod/ns-{ns}/pod-{i}");
    let t0 = cluster.change_pod(ns, i, version, args.services_per_ns())?;
    let mut got = 0;
    let mut last = t0;
    let deadline = t0 + Duration::from_secs(60);
    while got < args.clients {
        let (n, at) = tokio::time::timeout_at(deadline.into(), seen_rx.recv())
            .await
            .with_context(|| {
                format!(
                    "storm change: only {got}/{} clients got {name}",
                    args.clients
                )
            })?
            .context("clients gone")?;
        if n == name {
            got += 1;
            last = at;
        }
    }
    let push_during = last.duration_since(t0);
    let mut signed = 0;
    while let Some(ok) = tasks.join_next().await {
        signed += usize::from(ok.unwrap_or(false));
    }
    let duration = started.elapsed();
    eprintln!(
        "storm: {signed}/{calls} signed in {duration:?}; the change reached every client after {push_during:?}"
    );
    Ok(Storm {
        calls,
        signed,
        duration,
        push_during,
    })
}
