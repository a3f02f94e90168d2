//! `BENCH_ENGINES=1` of `bench_fleet_watches`: the other nodes of the fleet run the daemon's
//! cluster code in this process, each with its own identities (`nodegrace:node:<node>` and
//! `system:node:<node>`, minted from the cluster CA), its own state directory, static pod
//! gate and boot id: [`NodeDrainer`], as `nodegrace run` builds it (identity check, engine,
//! EvictionRequest requester where `lifecycle.k8s.io` is served), over clients built as
//! the daemon builds them (HTTP/2). Only the CRI runtime is a fake: the apiserver always
//! answers, so the offline fallback never runs.
//!
//! A stand-in plays the rest of each node: registers its Node (Ready), renews its Lease every
//! 10 s as a kubelet does, binds `BENCH_PODS` pods to it, marks them Running, and removes a
//! pod with grace 0 once it is being deleted (evicted). One watch of the fleet's pods serves
//! every node, with the admin identity, so its cost is not the fleet's.
//!
//! The rolling reboot: `BENCH_WAVE` nodes at a time drain for a reboot
//! ([`Drainer::drain`]), then "reboot": the daemon is dropped (its watches close), the boot
//! id changes, a new daemon starts with new connections and reconciles after boot
//! ([`Drainer::after_boot`]: completes the shutdown maintenance, uncordons).
//!
//! What each node receives is counted on its clients: every response byte, and the lines of
//! its watch responses (watch events; bookmarks apart). Its requests come from the audit log.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use hyper::body::{Bytes, Frame, SizeHint};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nodegrace::{
    build_clients as build, shutdown_maintenance_name, BootIdSource, Clients, Drainer, FsGate,
    Metrics, NodeDrainer, NodeMaintenance, NodeParts, Settings, ShutdownKind, ShutdownRequest,
    Timeouts, FINALIZER_MAINTENANCE_COMPLETION,
};
use nodegrace_testkit::fake_cri::FakeRuntime;
use serde_json::{json, Value};

use crate::realk8s::{self, ControlPlane};

/// On the fleet's pods, for the stand-in's watch.
const FLEET_LABEL: &str = "bench.nodegrace.dev/fleet";
const LEASE_EVERY: Duration = Duration::from_secs(10);

/// What one node's clients received.
#[derive(Default)]
pub struct Tally {
    requests: AtomicU64,
    bytes: AtomicU64,
    events: AtomicU64,
    bookmarks: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub requests: u64,
    pub bytes: u64,
    pub events: u64,
    pub bookmarks: u64,
}

impl Tally {
    fn get(&self) -> Counts {
        Counts {
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            bookmarks: self.bookmarks.load(Ordering::Relaxed),
        }
    }
}

impl Counts {
    fn since(self, earlier: Counts) -> Counts {
        Counts {
            requests: self.requests - earlier.requests,
            bytes: self.bytes - earlier.bytes,
            events: self.events - earlier.events,
            bookmarks: self.bookmarks - earlier.bookmarks,
        }
    }

    fn add(&mut self, other: Counts) {
        self.requests += other.requests;
        self.bytes += other.bytes;
        self.events += other.events;
        self.bookmarks += other.bookmarks;
    }
}

/// A kube client in front of another, counting what the other receives.
#[derive(Clone)]
struct Counted {
    inner: Client,
    tally: Arc<Tally>,
}

impl tower::Service<http::Request<kube::client::Body>> for Counted {
    type Response = http::Response<CountedBody>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let (inner, tally) = (self.inner.clone(), self.tally.clone());
        Box::pin(async move {
            tally.requests.fetch_add(1, Ordering::Relaxed);
            let resp = inner.send(req).await?;
            Ok(resp.map(|body| CountedBody {
                body,
                tally,
                watch,
                head: Vec::new(),
            }))
        })
    }
}

struct CountedBody {
    body: kube::client::Body,
    tally: Arc<Tally>,
    watch: bool,
    /// The first bytes of the watch event being received (one JSON object a line).
    head: Vec<u8>,
}

const HEAD: usize = 24;

impl CountedBody {
    fn scan(&mut self, mut data: &[u8]) {
        while let Some(end) = data.iter().position(|b| *b == b'\n') {
            self.take(&data[..end]);
            if !self.head.is_empty() {
                let counter = if self.head.starts_with(br#"{"type":"BOOKMARK""#) {
                    &self.tally.bookmarks
                } else {
                    &self.tally.events
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            self.head.clear();
            data = &data[end + 1..];
        }
        self.take(data);
    }

    fn take(&mut self, part: &[u8]) {
        let room = HEAD.saturating_sub(self.head.len()).min(part.len());
        self.head.extend_from_slice(&part[..room]);
    }
}

impl hyper::body::Body for CountedBody {
    type Data = Bytes;
    type Error = kube::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, kube::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                this.tally
                    .bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                if this.watch {
                    let data = data.clone();
                    this.scan(&data);
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The daemon's client for the kubeconfig at `path`, counted into `tally`.
async fn counted(path: &Path, tally: &Arc<Tally>) -> anyhow::Result<Client> {
    let timeouts = Timeouts {
        connect: Duration::from_secs(5),
        read: None,
        answer: None,
    };
    let inner = build(Some(path), "bench identity", timeouts).await?;
    let namespace = inner.default_namespace().to_owned();
    Ok(Client::new(
        Counted {
            inner,
            tally: tally.clone(),
        },
        namespace,
    ))
}

/// One node of the fleet: its identities, state and the daemon running for it.
struct FleetNode {
    name: String,
    dir: tempfile::TempDir,
    nodegrace_kubeconfig: PathBuf,
    kubelet_kubeconfig: PathBuf,
    tally: Arc<Tally>,
    boot: u32,
    drainer: Option<NodeDrainer>,
}

impl FleetNode {
    fn settings(&self) -> Settings {
        let mut s = Settings::default();
        s.node.name = self.name.clone();
        s.node.kubeconfig = Some(self.nodegrace_kubeconfig.clone());
        s.node.kubelet_kubeconfig = Some(self.kubelet_kubeconfig.clone());
        s.state_dir = self.dir.path().join("state");
        s.static_pods.manifest_dir = self.dir.path().join("manifests");
        s.static_pods.gate_dir = self.dir.path().join("gated-manifests");
        s
    }

    fn boot_id_file(&self) -> PathBuf {
        self.dir.path().join("boot_id")
    }

    fn boot_id(&self) -> String {
        format!("{}-boot-{}", self.name, self.boot)
    }

    /// Starts the daemon's cluster side for this boot (as `nodegrace run` at boot).
    fn start(&mut self) {
        let settings = self.settings();
        for dir in [
            &settings.state_dir,
            &settings.static_pods.manifest_dir,
            &settings.static_pods.gate_dir,
        ] {
            std::fs::create_dir_all(dir).expect("node directories");
        }
        std::fs::write(self.boot_id_file(), self.boot_id()).expect("boot id");
        let gate =
            FsGate::new(&settings.static_pods, &settings.state_dir).expect("static pod gate");
        let parts = NodeParts {
            settings,
            node: self.name.clone(),
            runtime: Arc::new(FakeRuntime::new()),
            kubelet: None,
            gate: Arc::new(gate),
            metrics: Metrics::new(),
            boot_id: BootIdSource::File(self.boot_id_file()),
        };
        let (ng, kl, tally) = (
            self.nodegrace_kubeconfig.clone(),
            self.kubelet_kubeconfig.clone(),
            self.tally.clone(),
        );
        self.drainer = Some(NodeDrainer::start(parts, move || {
            let (ng, kl, tally) = (ng.clone(), kl.clone(), tally.clone());
            async move {
                Ok::<_, anyhow::Error>(Clients {
                    nodegrace: counted(&ng, &tally).await?,
                    kubelet: counted(&kl, &tally).await?,
                    shared: false,
                })
            }
        }));
    }

    fn drainer(&self) -> &NodeDrainer {
        self.drainer.as_ref().expect("the node's daemon runs")
    }

    /// The drain for a reboot, then the reboot: the daemon goes, a new boot starts it again
    /// and it reconciles. Returns the drain's seconds and when it ended (Unix seconds).
    async fn reboot(&mut self, admin: &Client) -> (f64, f64) {
        let started = realk8s::now_unix();
        let request = ShutdownRequest {
            kind: ShutdownKind::Reboot,
            started_at: chrono::Utc::now(),
            budget: Settings::default().shutdown.max_delay,
            resumed: false,
            boot_id: self.boot_id(),
            started_since_boot: None,
        };
        if let Err(e) = nodegrace_testkit::drain_through(self.drainer(), &request, true).await {
            eprintln!("{}: drain: {e:#}", self.name);
        }
        let drained = realk8s::now_unix();
        self.drainer = None;
        self.boot += 1;
        self.start();
        if let Err(e) = self.drainer().after_boot().await {
            eprintln!("{}: after boot: {e:#}", self.name);
        }
        completed(admin, &self.name).await;
        (drained - started, drained)
    }
}

/// Waits until the daemon carried out its maintenance's Complete stage: the node
/// uncordoned, the maintenance's completion finalizer gone.
async fn completed(admin: &Client, node: &str) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let maintenances: Api<NodeMaintenance> = Api::all(admin.clone());
    let name = shutdown_maintenance_name(node);
    for _ in 0..300 {
        let uncordoned = nodes
            .get(node)
            .await
            .is_ok_and(|n| n.spec.and_then(|s| s.unschedulable) != Some(true));
        let finished = maintenances.get_opt(&name).await.is_ok_and(|m| {
            m.is_none_or(|m| {
                !m.finalizers()
                    .iter()
                    .any(|f| f == FINALIZER_MAINTENANCE_COMPLETION)
            })
        });
        if uncordoned && finished {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("{node}: its maintenance did not complete within 60 s");
}

fn node_object(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", FLEET_LABEL: "fleet",
        }},
        "spec": {},
    }))
    .expect("node object")
}

fn ready_status(name: &str) -> Value {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": "",
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let resources = json!({"cpu": "32", "memory": "128Gi", "pods": "110"});
    json!({"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            condition("Ready", "True", "KubeletReady"),
        ],
        "addresses": [{"type": "Hostname", "address": name}],
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                     "osImage": "Debian GNU/Linux 12", "containerRuntimeVersion": "fake://1",
                     "kubeletVersion": "v1.28.4", "kubeProxyVersion": "v1.28.4",
                     "operatingSystem": "linux", "architecture": "amd64"},
    }})
}

async fn register(admin: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(admin.clone());
    match nodes
        .create(&PostParams::default(), &node_object(name))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("registering node {name}: {e}"),
    }
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(ready_status(name)),
        )
        .await
        .unwrap_or_else(|e| panic!("node {name} status: {e}"));
    renew_lease(admin, name).await;
}

async fn renew_lease(admin: &Client, node: &str) {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now},
    });
    let params = PatchParams::apply("bench-fleet-kubelet").force();
    if let Err(e) = leases.patch(node, &params, &Patch::Apply(&lease)).await {
        eprintln!("lease of {node}: {e}");
    }
}

/// The fleet's kubelets, as far as the apiserver sees them.
fn spawn_stand_in(
    admin: Client,
    ns: String,
    nodes: Vec<String>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let leases = {
        let admin = admin.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_EVERY).await;
                futures::stream::iter(&nodes)
                    .for_each_concurrent(8, |n| renew_lease(&admin, n))
                    .await;
            }
        })
    };
    let pods = tokio::spawn(async move {
        let api: Api<Pod> = Api::namespaced(admin.clone(), &ns);
        let config = watcher::Config::default().labels(FLEET_LABEL);
        let seen: Arc<Mutex<HashSet<(String, bool)>>> = Arc::default();
        let limit = Arc::new(tokio::sync::Semaphore::new(16));
        let mut events = watcher(api.clone(), config).boxed();
        while let Some(event) = events.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                _ => continue,
            };
            let uid = pod.uid().unwrap_or_default();
            let deleting = pod.metadata.deletion_timestamp.is_some();
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            if !deleting && phase.as_deref() == Some("Running") {
                continue;
            }
            if !seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((uid.clone(), deleting))
            {
                continue;
            }
            let (api, limit) = (api.clone(), limit.clone());
            tokio::spawn(async move {
                let _permit = limit.acquire().await;
                let name = pod.name_any();
                if deleting {
                    let params = DeleteParams {
                        grace_period_seconds: Some(0),
                        preconditions: Some(Preconditions {
                            uid: Some(uid),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    let _ = api.delete(&name, &params).await;
                } else {
                    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                    let condition =
                        |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
                    let status = json!({"status": {
                        "phase": "Running", "hostIP": "127.0.0.1", "podIP": "10.244.0.10",
                        "startTime": now,
                        "conditions": [condition("Initialized"), condition("Ready"),
                                       condition("ContainersReady"), condition("PodScheduled")],
                    }});
                    if let Err(e) = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(status))
                        .await
                    {
                        eprintln!("marking {name} Running: {e}");
                    }
                }
            });
        }
    });
    vec![leases, pods]
}

async fn create_pods(admin: &Client, ns: &str, node: &str, pods: usize) {
    let api: Api<Pod> = Api::namespaced(admin.clone(), ns);
    for j in 0..pods {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-p{j}"), "labels": {"app": "fleet", FLEET_LABEL: "fleet"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 5,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        }))
        .expect("pod");
        for attempt in 0..20 {
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => break,
                Err(kube::Error::Api(e)) if e.code == 409 => break,
                // The namespace's default ServiceAccount may not exist yet.
                Err(e) if attempt < 19 => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("creating pod on {node}: {e}"),
            }
        }
    }
}

async fn wait_running(admin: &Client, ns: &str, want: usize) {
    let api: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let params = ListParams::default().labels(FLEET_LABEL);
    for _ in 0..600 {
        let running = api.list(&params).await.map_or(0, |l| {
            l.items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count()
        });
        if running >= want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("not every fleet pod runs after 5 min");
}

/// One request of the audit log, its latest stage.
struct Audited {
    verb: String,
    stage: String,
    received: f64,
}

/// The fleet's requests by node: made with `nodegrace:node:<node>`, or with
/// `system:node:<node>` by nodegrace's user agent, received at or after `since`.
fn audited(log: &Path, marker: &str, since: f64) -> HashMap<String, Vec<Audited>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut by_id: HashMap<String, (String, Audited)> = HashMap::new();
    for line in text.lines().filter(|l| l.contains(marker)) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let s = |ptr: &str| v.pointer(ptr).and_then(Value::as_str).unwrap_or_default();
        let user = s("/user/username");
        let node = match (
            user.strip_prefix("nodegrace:node:"),
            user.strip_prefix("system:node:"),
        ) {
            (Some(node), _) => node,
            (_, Some(node)) if s("/userAgent").starts_with("nodegrace/") => node,
            _ => continue,
        };
        let Ok(received) = chrono::DateTime::parse_from_rfc3339(s("/requestReceivedTimestamp"))
        else {
            continue;
        };
        let received = received.timestamp_micros() as f64 / 1e6;
        if received < since {
            continue;
        }
        by_id.insert(
            s("/auditID").to_owned(),
            (
                node.to_owned(),
                Audited {
                    verb: s("/verb").to_owned(),
                    stage: s("/stage").to_owned(),
                    received,
                },
            ),
        );
    }
    let mut by_node: HashMap<String, Vec<Audited>> = HashMap::new();
    for (node, r) in by_id.into_values() {
        by_node.entry(node).or_default().push(r);
    }
    by_node
}

fn process_usage(pid: i32) -> Option<crate::real::ProcUsage> {
    crate::real::proc_usage(pid)
}

fn apiserver_pid(cp: &ControlPlane) -> Option<i32> {
    std::fs::read_to_string(cp.run.join("kube-apiserver.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// Per node, what it received and asked.
#[derive(Default)]
struct Row {
    idle: Counts,
    others: Counts,
    own: Counts,
    drain_secs: f64,
    drain_window: (f64, f64),
    reboot_window: (f64, f64),
}

/// The observer node: the real daemon in its own nspawn node, and the admin identity's
/// two sets of watches (the ones a node holds now, the ones it held before issue 20) as
/// counted events and bytes.
pub struct Observer<'a> {
    pub fixture: &'a crate::realk8s::fixture::Fixture,
    pub pid: i32,
    pub watches: &'a dyn Fn() -> [(u64, u64); 2],
}

/// Runs the fleet: `nodes` in-process daemons, `pods` each, rebooting `wave` at a time.
pub async fn run(observer: Observer<'_>, nodes: usize, wave: usize, pods: usize) {
    let f = observer.fixture;
    let cp = f.cp;
    let admin = f.admin.clone();
    let ns = f.name.clone();
    let names: Vec<String> = (0..nodes).map(|i| format!("{}-e{i}", f.name)).collect();
    let began = realk8s::now_unix();
    let bench_pid = std::process::id() as i32;
    let api_pid = apiserver_pid(cp);

    // Minting is serial (openssl's serial file), and slow: a few minutes at N=100.
    let mint_names = names.clone();
    let identities = tokio::task::spawn_blocking(move || {
        let cp = crate::realk8s::control_plane();
        mint_names
            .iter()
            .map(|n| (cp.nodegrace_identity(n), cp.kubelet_identity(n)))
            .collect::<Vec<_>>()
    })
    .await
    .expect("minting identities");
    println!(
        "minted {} identities in {:.0} s",
        2 * nodes,
        realk8s::now_unix() - began
    );

    futures::stream::iter(&names)
        .for_each_concurrent(8, |n| {
            let admin = admin.clone();
            async move { register(&admin, n).await }
        })
        .await;
    let stand_in = spawn_stand_in(admin.clone(), ns.clone(), names.clone());
    futures::stream::iter(&names)
        .for_each_concurrent(8, |n| create_pods(&admin, &ns, n, pods))
        .await;
    wait_running(&admin, &ns, nodes * pods).await;
    println!("{nodes} nodes registered, {} pods running", nodes * pods);

    let bench_before = process_usage(bench_pid);
    let mut fleet: Vec<FleetNode> = names
        .iter()
        .zip(identities)
        .map(|(name, (ng, kl))| FleetNode {
            name: name.clone(),
            dir: tempfile::Builder::new()
                .prefix("nodegrace-fleet-")
                .tempdir()
                .expect("node directory"),
            nodegrace_kubeconfig: ng,
            kubelet_kubeconfig: kl,
            tally: Arc::default(),
            boot: 1,
            drainer: None,
        })
        .collect();
    let started = realk8s::now_unix();
    for node in &mut fleet {
        node.start();
    }
    futures::future::join_all(fleet.iter().map(|n| async move {
        if let Err(e) = n.drainer().after_boot().await {
            eprintln!("{}: after boot: {e:#}", n.name);
        }
    }))
    .await;
    println!(
        "{nodes} daemons connected and listed in {:.1} s",
        realk8s::now_unix() - started
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let bench_up = process_usage(bench_pid);
    let api_idle0 = api_pid.and_then(process_usage);
    let daemon_idle0 = process_usage(observer.pid);

    let idle_secs = 20.0;
    let idle_from = realk8s::now_unix();
    let watches_idle0 = (observer.watches)();
    let snap = |fleet: &[FleetNode]| fleet.iter().map(|n| n.tally.get()).collect::<Vec<_>>();
    let before_idle = snap(&fleet);
    tokio::time::sleep(Duration::from_secs_f64(idle_secs)).await;
    let after_idle = snap(&fleet);
    let idle_to = realk8s::now_unix();
    let watches_idle1 = (observer.watches)();
    let api_idle1 = api_pid.and_then(process_usage);
    let mut rows: Vec<Row> = before_idle
        .iter()
        .zip(&after_idle)
        .map(|(a, b)| Row {
            idle: b.since(*a),
            ..Row::default()
        })
        .collect();

    let waves_from = realk8s::now_unix();
    let mut wave_secs = Vec::new();
    let count = fleet.len();
    for start in (0..count).step_by(wave) {
        let members = start..(start + wave).min(count);
        let before = snap(&fleet);
        let t0 = realk8s::now_unix();
        let results =
            futures::future::join_all(fleet[members.clone()].iter_mut().map(|n| n.reboot(&admin)))
                .await;
        let t1 = realk8s::now_unix();
        wave_secs.push(t1 - t0);
        let after = snap(&fleet);
        for (i, row) in rows.iter_mut().enumerate() {
            let delta = after[i].since(before[i]);
            if members.contains(&i) {
                let (secs, drained) = results[i - members.start];
                row.own = delta;
                row.drain_secs = secs;
                row.drain_window = (t0, drained);
                row.reboot_window = (drained, t1);
            } else {
                row.others.add(delta);
            }
        }
    }
    let waves_to = realk8s::now_unix();
    let api_waves = api_pid.and_then(process_usage);
    let daemon_waves = process_usage(observer.pid);
    let watches_waves = (observer.watches)();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let marker = format!("node:{}-e", f.name);
    let audit = audited(&cp.audit_log(), &marker, began);
    let observer_requests = f.requests();

    println!();
    println!(
        "rolling reboot of {nodes} in-process daemons, {wave} at a time, {pods} pods each: {:.1} s ({} waves: {:.1} s median)",
        waves_to - waves_from,
        wave_secs.len(),
        median(wave_secs.clone()).1
    );
    println!(
        "per node: watches held now; idle {idle_secs:.0} s and while the other nodes drain \
         and reboot: watch events (bookmarks), bytes received, requests; own drain: seconds, \
         requests (audit), per pod; own reboot: requests, bytes (relists)"
    );
    println!(
        "{:<28} {:>5} | {:>9} {:>8} {:>4} | {:>9} {:>9} {:>5} | {:>5} {:>5} {:>7} | {:>5} {:>9}",
        "node",
        "watch",
        "idle ev",
        "B",
        "req",
        "others ev",
        "B",
        "req",
        "s",
        "req",
        "req/pod",
        "req",
        "own B"
    );
    let mut summary: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (node, row) in fleet.iter().zip(&rows) {
        let reqs = audit.get(&node.name).map(Vec::as_slice).unwrap_or_default();
        let held = reqs
            .iter()
            .filter(|r| r.verb == "watch" && r.stage == "ResponseStarted")
            .count();
        let within = |(from, to): (f64, f64)| {
            reqs.iter()
                .filter(|r| r.verb != "watch" && r.received >= from && r.received < to)
                .count()
        };
        let drain_reqs = within(row.drain_window);
        let reboot_reqs = within(row.reboot_window);
        let per_pod = drain_reqs as f64 / pods.max(1) as f64;
        let ev = |c: &Counts| format!("{}({})", c.events, c.bookmarks);
        println!(
            "{:<28} {:>5} | {:>9} {:>8} {:>4} | {:>9} {:>9} {:>5} | {:>5.1} {:>5} {:>7.1} | {:>5} {:>9}",
            node.name,
            held,
            ev(&row.idle),
            row.idle.bytes,
            row.idle.requests,
            ev(&row.others),
            row.others.bytes,
            row.others.requests,
            row.drain_secs,
            drain_reqs,
            per_pod,
            reboot_reqs,
            row.own.bytes,
        );
        for (key, value) in [
            ("watches held", held as f64),
            ("idle events", row.idle.events as f64),
            ("idle requests", row.idle.requests as f64),
            ("others-drain events", row.others.events as f64),
            ("others-drain bytes", row.others.bytes as f64),
            ("others-drain requests", row.others.requests as f64),
            ("own drain seconds", row.drain_secs),
            ("own drain requests per pod", per_pod),
            ("own reboot requests", reboot_reqs as f64),
        ] {
            summary.entry(key).or_default().push(value);
        }
    }
    println!("over the {nodes} nodes (min / median / max):");
    for (key, values) in summary {
        let (lo, mid, hi) = median(values);
        println!("  {key}: {lo:.1} / {mid:.1} / {hi:.1}");
    }
    let idle_requests = audit
        .values()
        .flatten()
        .filter(|r| r.verb != "watch" && r.received >= idle_from && r.received < idle_to)
        .count();
    println!("fleet requests in the idle window (audit, every node): {idle_requests}");
    if let (Some(a), Some(b)) = (bench_before, bench_up) {
        println!(
            "memory: this process grew {:.1} MiB with {nodes} daemons: {:.2} MiB a node (RSS {:.0} -> {:.0} MiB)",
            mib(b.rss_kib.saturating_sub(a.rss_kib)),
            mib(b.rss_kib.saturating_sub(a.rss_kib)) / nodes as f64,
            mib(a.rss_kib),
            mib(b.rss_kib)
        );
    }
    if let (Some(a), Some(b)) = (daemon_idle0, daemon_waves) {
        let reqs = |from: f64, to: f64| {
            observer_requests
                .iter()
                .filter(|r| !r.is_watch() && r.received >= from && r.received < to)
                .count()
        };
        println!(
            "observer (real daemon, own process): RSS {:.1} -> {:.1} MiB, CPU {:.2} s over the reboots; requests idle {}, during the reboots {}; watches opened since boot {}",
            mib(a.rss_kib),
            mib(b.rss_kib),
            b.cpu_seconds - a.cpu_seconds,
            reqs(idle_from, idle_to),
            reqs(waves_from, waves_to),
            observer_requests.iter().filter(|r| r.is_watch()).count()
        );
    }
    for (i, set) in [
        "now (label-selected maintenances and requests)",
        "before (every maintenance, request, VolumeAttachment)",
    ]
    .iter()
    .enumerate()
    {
        println!(
            "observer's watch set {set}: idle {} events, {} B | during the reboots {} events, {} B",
            watches_idle1[i].0 - watches_idle0[i].0,
            watches_idle1[i].1 - watches_idle0[i].1,
            watches_waves[i].0 - watches_idle1[i].0,
            watches_waves[i].1 - watches_idle1[i].1,
        );
    }
    if let (Some(a), Some(b), Some(c)) = (api_idle0, api_idle1, api_waves) {
        println!(
            "kube-apiserver: idle {:.0} % of a core, during the reboots {:.0} % ({:.1} s CPU over {:.1} s); RSS {:.0} MiB idle, {:.0} MiB after",
            100.0 * (b.cpu_seconds - a.cpu_seconds) / (idle_to - idle_from),
            100.0 * (c.cpu_seconds - b.cpu_seconds) / (waves_to - waves_from),
            c.cpu_seconds - b.cpu_seconds,
            waves_to - waves_from,
            mib(b.rss_kib),
            mib(c.rss_kib)
        );
    }

    if apiserver_pid(cp) != api_pid {
        println!(
            "the apiserver was restarted during the run (another test's outage?): these figures include reconnections"
        );
    }

    for node in &mut fleet {
        node.drainer = None;
    }
    for task in stand_in {
        task.abort();
    }
    let nodes_api: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    for name in &names {
        let _ = nodes_api.delete(name, &DeleteParams::default()).await;
        let _ = leases.delete(name, &DeleteParams::default()).await;
    }
}
