//! Fixtures for the engine scenarios: a fake cluster with one node, pods of every kind, a
//! static-pod gate double, and readers of what the apiserver received.
#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nodegrace::{
    node_maintenance_crd, Engine, EngineOptions, Metrics, NodeMaintenance, Settings, ShutdownKind,
    ShutdownRequest, StaticManifest, StaticPodGate,
};
use nodegrace_testkit::fake_apiserver::{DeleteOpts, FakeCluster, RecordedRequest, Store};
use nodegrace_testkit::fake_kubelet::{FakeKubelet, KubeletConfig};
use nodegrace_testkit::LogBuffer;
use serde_json::{json, Value};

#[path = "rbac.rs"]
mod rbac;
pub use rbac::assert_cluster_role_allows;

pub const NODE: &str = "node-a";

pub enum Kind {
    Default,
    DaemonSet,
    Static,
}

pub struct Env {
    pub cluster: FakeCluster,
    pub kubelet: FakeKubelet,
    pub gate: Arc<FakeGate>,
    pub dir: tempfile::TempDir,
    pub metrics: Metrics,
}

pub fn settings(dir: &Path) -> Settings {
    let mut s = Settings::default();
    s.node.name = NODE.into();
    s.state_dir = dir.to_path_buf();
    s.drain.reserve_daemonset = Duration::from_secs(1);
    s.drain.reserve_static = Duration::from_secs(1);
    s.drain.reserve_critical = Duration::from_secs(1);
    s.drain.eviction_backoff_max_shutdown = Duration::from_secs(1);
    s.drain.volume_detach_timeout = Duration::from_secs(1);
    s.fallback.apiserver_timeout = Duration::from_secs(2);
    s
}

impl Drop for Env {
    /// Every scenario also checks that the shipped ClusterRole allows what the daemon asked.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert_cluster_role_allows(&self.requests());
        }
    }
}

impl Env {
    pub async fn new(kubelet: KubeletConfig) -> Env {
        let cluster = FakeCluster::start().await.unwrap();
        cluster
            .install_crd(&node_maintenance_crd().unwrap())
            .unwrap();
        cluster
            .insert(&json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
                "spec": {},
            }))
            .unwrap();
        cluster
            .store
            .update_in_process("", "nodes", "", NODE, |n| {
                n["status"] = json!({"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]})
            })
            .unwrap();
        let kubelet = cluster.kubelet(kubelet);
        let gate = Arc::new(FakeGate::new(cluster.store.clone()));
        Env {
            cluster,
            kubelet,
            gate,
            dir: tempfile::tempdir().unwrap(),
            metrics: Metrics::new(),
        }
    }

    pub fn engine(&self, settings: Settings) -> Engine {
        Engine::start(EngineOptions {
            endpoint: "fake apiserver".into(),
            client: self.cluster.client().unwrap(),
            settings,
            node: NODE.into(),
            gate: self.gate.clone(),
            metrics: self.metrics.clone(),
            terminator: Some(Arc::new(nodegrace::EvictionApi::new(
                self.cluster.kubelet_client().unwrap(),
            ))),
        })
    }

    pub fn settings(&self) -> Settings {
        settings(self.dir.path())
    }

    /// A running pod on the node.
    pub fn pod(&self, name: &str, kind: Kind, priority: i32, grace: i64, labels: Value) -> String {
        self.pod_on(NODE, name, kind, priority, grace, labels)
    }

    pub fn pod_on(
        &self,
        node: &str,
        name: &str,
        kind: Kind,
        priority: i32,
        grace: i64,
        labels: Value,
    ) -> String {
        let ns = "work";
        self.cluster.ensure_namespace(ns).unwrap();
        let mut meta = json!({"name": name, "namespace": ns, "labels": labels});
        let name = match kind {
            Kind::Default => name.to_string(),
            Kind::DaemonSet => {
                meta["ownerReferences"] = json!([{
                    "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "ds-uid", "controller": true
                }]);
                name.to_string()
            }
            Kind::Static => {
                let mirror = format!("{name}-{node}");
                meta["name"] = json!(mirror);
                meta["annotations"] = json!({
                    "kubernetes.io/config.mirror": format!("hash-{name}"),
                    "kubernetes.io/config.source": "file",
                });
                self.gate.add(StaticManifest {
                    file_name: format!("{name}.yaml"),
                    namespace: ns.into(),
                    pod_name: name.into(),
                    priority,
                    labels: Default::default(),
                });
                mirror
            }
        };
        let now = self.cluster.store.now_str();
        self.cluster
            .insert(&json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": meta,
                "spec": {
                    "nodeName": node, "priority": priority, "terminationGracePeriodSeconds": grace,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
                "status": nodegrace_testkit::fake_apiserver::running_status(&now),
            }))
            .unwrap();
        name
    }

    pub fn pdb(&self, name: &str, app: &str, min_available: i32) {
        self.cluster
            .insert(&json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": "work"},
                "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
            }))
            .unwrap();
    }

    /// An admin-created maintenance selecting the node by label.
    pub fn admin_maintenance(&self, name: &str, stage: &str, plan: Value) {
        self.cluster
            .insert(&json!({
                "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
                "metadata": {"name": name},
                "spec": {
                    "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}
                    ]}]},
                    "stage": stage,
                    "drainPlan": plan,
                    "reason": "admin maintenance",
                },
            }))
            .unwrap();
    }

    pub fn maintenance(&self, name: &str) -> Option<NodeMaintenance> {
        self.cluster
            .store
            .get_obj("nodegrace.dev", "nodemaintenances", "", name)
            .map(|v| serde_json::from_value(v).unwrap())
    }

    pub fn node(&self) -> Value {
        self.cluster.store.get_obj("", "nodes", "", NODE).unwrap()
    }

    pub fn pod_exists(&self, name: &str) -> bool {
        self.cluster
            .store
            .get_obj("", "pods", "work", name)
            .is_some()
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.cluster.api.requests()
    }

    /// `nodegrace_evictions_refused_total{reason}` as a scrape shows it; 0 before any.
    pub fn refused(&self, reason: &str) -> u64 {
        let series = format!("nodegrace_evictions_refused_total{{reason=\"{reason}\"}} ");
        let text = self.metrics.render().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map_or(0, |n| n.parse().unwrap())
    }

    /// Pod names, in order, of the evictions POSTed.
    pub fn evictions(&self) -> Vec<String> {
        pod_requests(&self.requests(), "POST", "/eviction")
    }

    /// Pod names, in order, of the DELETEs of pods.
    pub fn deletes(&self) -> Vec<String> {
        pod_requests(&self.requests(), "DELETE", "")
    }

    pub fn events(&self, reason: &str) -> Vec<Value> {
        let ri = self
            .cluster
            .store
            .find_resource("events.k8s.io", "v1", "events")
            .unwrap();
        let (all, _) = self
            .cluster
            .store
            .list(&nodegrace_testkit::fake_apiserver::Filter::all(
                &ri.group, &ri.plural,
            ));
        all.into_iter().filter(|e| e["reason"] == reason).collect()
    }
}

pub fn pod_requests(reqs: &[RecordedRequest], method: &str, suffix: &str) -> Vec<String> {
    reqs.iter()
        .filter(|r| r.method == method && r.path.contains("/pods/"))
        .filter(|r| {
            if suffix.is_empty() {
                !r.path.ends_with("/eviction")
            } else {
                r.path.ends_with(suffix)
            }
        })
        .map(|r| {
            let rest = r.path.split("/pods/").nth(1).unwrap_or_default();
            rest.split('/').next().unwrap_or_default().to_string()
        })
        .collect()
}

/// A fake kubelet of the node whose pods take `finish_ms` to exit.
pub fn kubelet(finish_ms: u64) -> KubeletConfig {
    KubeletConfig {
        default_finish: Duration::from_millis(finish_ms),
        ..KubeletConfig::node(NODE)
    }
}

/// `pod` is gone, evicted once and never DELETEd or escalated: its grace was not cut.
pub fn assert_went_once_with_its_grace(env: &Env, pod: &str) {
    assert!(!env.pod_exists(pod));
    assert_eq!(env.evictions(), [pod], "evicted once");
    assert!(
        env.deletes().is_empty(),
        "{pod} deleted, its grace cut: {:?}",
        env.deletes()
    );
    assert!(env.events("Escalated").is_empty());
}

pub fn request(kind: ShutdownKind, budget: Duration) -> ShutdownRequest {
    ShutdownRequest {
        kind,
        started_at: chrono::Utc::now(),
        budget,
        resumed: false,
        boot_id: "boot-1".into(),
        started_since_boot: None,
    }
}

/// Drains for a reboot with a 60 s budget; the drain must end within 30 s.
pub async fn drain_a_reboot(drainer: &impl nodegrace::Drainer) {
    tokio::time::timeout(
        Duration::from_secs(30),
        nodegrace_testkit::drain_through(
            drainer,
            &request(ShutdownKind::Reboot, Duration::from_secs(60)),
            true,
        ),
    )
    .await
    .expect("the drain ends")
    .unwrap();
}

/// The decoded `nodegrace.dev/fallback-report` annotation of a maintenance.
pub fn fallback_annotation(m: &NodeMaintenance) -> Option<Value> {
    m.metadata
        .annotations
        .as_ref()?
        .get("nodegrace.dev/fallback-report")
        .map(|text| serde_json::from_str(text).unwrap())
}

/// A shutdown drain that must succeed; how long it took (real time).
pub async fn drain_timed(engine: &Engine, kind: ShutdownKind, budget: Duration) -> Duration {
    let started = std::time::Instant::now();
    engine.shutdown_drain(&request(kind, budget)).await.unwrap();
    started.elapsed()
}

/// The writes to `plural` the apiserver refused (409) for a resourceVersion that was no
/// longer the object's: each one a decision made on a stale copy.
pub fn refused_as_stale(env: &Env, plural: &str) -> Vec<String> {
    let prefix = format!("{plural}/");
    env.cluster
        .store
        .conflicts()
        .into_iter()
        .filter(|c| c.starts_with(&prefix))
        .collect()
}

/// Waits (real time) until `f` holds, failing after `secs`.
pub async fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A static-pod gate double: gating a manifest makes the kubelet stop the mirror pod.
pub struct FakeGate {
    store: Arc<Store>,
    active: Mutex<Vec<StaticManifest>>,
    gated: Mutex<Vec<StaticManifest>>,
    /// Files the kubelet refuses as manifests, in the manifest directory and gated.
    unreadable: Mutex<Vec<String>>,
    unreadable_gated: Mutex<Vec<String>>,
    pub log: Mutex<Vec<String>>,
    /// The kubelet deletes a gated pod's mirror this long after the gate (its housekeeping)
    /// instead of at once.
    pub housekeeping: Mutex<Option<Duration>>,
}

impl FakeGate {
    fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            active: Mutex::new(Vec::new()),
            gated: Mutex::new(Vec::new()),
            unreadable: Mutex::new(Vec::new()),
            unreadable_gated: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            housekeeping: Mutex::new(None),
        }
    }

    /// A file in the manifest directory that the kubelet refuses.
    pub fn add_unreadable(&self, file_name: &str) {
        self.unreadable.lock().unwrap().push(file_name.into());
    }

    pub fn unreadable_in_place(&self) -> Vec<String> {
        self.unreadable.lock().unwrap().clone()
    }

    fn add(&self, m: StaticManifest) {
        self.active.lock().unwrap().push(m);
    }

    pub fn gated_files(&self) -> Vec<String> {
        self.gated
            .lock()
            .unwrap()
            .iter()
            .map(|m| m.file_name.clone())
            .collect()
    }
}

impl StaticPodGate for FakeGate {
    fn recover(&self) -> anyhow::Result<()> {
        Ok(())
    }
    fn active(&self) -> anyhow::Result<Vec<StaticManifest>> {
        Ok(self.active.lock().unwrap().clone())
    }
    fn gated(&self) -> anyhow::Result<Vec<StaticManifest>> {
        Ok(self.gated.lock().unwrap().clone())
    }
    fn unreadable_active(&self) -> anyhow::Result<Vec<nodegrace::Problem>> {
        Ok(self
            .unreadable
            .lock()
            .unwrap()
            .iter()
            .map(|f| nodegrace::Problem {
                file_name: f.clone(),
                reason: "not YAML".into(),
            })
            .collect())
    }
    fn has_gated(&self) -> anyhow::Result<bool> {
        Ok(!self.gated.lock().unwrap().is_empty()
            || !self.unreadable_gated.lock().unwrap().is_empty())
    }
    fn gate(&self, file_name: &str) -> anyhow::Result<()> {
        {
            let mut unreadable = self.unreadable.lock().unwrap();
            if let Some(i) = unreadable.iter().position(|f| f == file_name) {
                let f = unreadable.remove(i);
                self.log.lock().unwrap().push(format!("gate {file_name}"));
                self.unreadable_gated.lock().unwrap().push(f);
                return Ok(());
            }
        }
        let mut active = self.active.lock().unwrap();
        let i = active
            .iter()
            .position(|m| m.file_name == file_name)
            .ok_or_else(|| anyhow::anyhow!("{file_name} is not active"))?;
        let m = active.remove(i);
        self.log.lock().unwrap().push(format!("gate {file_name}"));
        let pods = self.store.find_resource("", "v1", "pods").unwrap();
        let mirror = format!("{}-{NODE}", m.pod_name);
        let (store, ns) = (self.store.clone(), m.namespace.clone());
        let delete = move || {
            let _ = store.delete(&pods, &ns, &mirror, &DeleteOpts::default());
        };
        match *self.housekeeping.lock().unwrap() {
            None => delete(),
            Some(after) => {
                tokio::runtime::Handle::current().spawn(async move {
                    tokio::time::sleep(after).await;
                    delete();
                });
            }
        }
        self.gated.lock().unwrap().push(m);
        Ok(())
    }
    fn restore_all(&self) -> anyhow::Result<Vec<String>> {
        let mut gated = self.gated.lock().unwrap();
        self.log.lock().unwrap().push("restore".into());
        self.active.lock().unwrap().extend(gated.drain(..));
        let mut unreadable = self.unreadable_gated.lock().unwrap();
        self.unreadable.lock().unwrap().extend(unreadable.drain(..));
        Ok(Vec::new())
    }
}

/// A kubelet unit control that does nothing (the drains here never reach the fallback).
pub struct NoKubelet;

#[async_trait::async_trait]
impl nodegrace::KubeletControl for NoKubelet {
    async fn stop(&self, _unit: &str) -> anyhow::Result<()> {
        Ok(())
    }
    async fn start(&self, _unit: &str) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The daemon's drainer for `env`'s node, connecting to its fake apiserver as the daemon does.
pub fn start_drainer(env: &Env) -> nodegrace::NodeDrainer {
    let parts = nodegrace::NodeParts {
        settings: env.settings(),
        node: NODE.into(),
        runtime: Arc::new(nodegrace_testkit::fake_cri::FakeRuntime::new()),
        kubelet: Some(Arc::new(NoKubelet)),
        gate: env.gate.clone(),
        metrics: env.metrics.clone(),
        boot_id: nodegrace::BootIdSource::File(env.dir.path().join("boot_id")),
    };
    let cluster = env.cluster.clone();
    nodegrace::NodeDrainer::start(parts, move || {
        let cluster = cluster.clone();
        async move { cluster.clients() }
    })
}

/// Warnings and infos of every test in the binary (one global subscriber: a thread-local one
/// can miss events whose callsite another thread registered first). Tests look for their own
/// pod (or object) names.
pub fn logs() -> LogBuffer {
    static LINES: OnceLock<LogBuffer> = OnceLock::new();
    LINES
        .get_or_init(|| {
            let lines = LogBuffer::default();
            let sink = lines.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .with_writer(move || sink.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber).unwrap();
            lines
        })
        .clone()
}

pub fn log_lines(containing: &str) -> Vec<String> {
    logs()
        .text()
        .lines()
        .filter(|l| l.contains(containing))
        .map(String::from)
        .collect()
}
