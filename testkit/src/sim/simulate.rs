//! `nodegrace-sim`: the real daemon, drainer and fallback against an in-memory logind,
//! a fake apiserver, a fake kubelet and a fake CRI runtime, printing the shutdown's timeline.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::{json, Value};

use nodegrace::{
    commands::{self as cli, OutputFormat},
    mirror_pod_name, node_maintenance_crd, Daemon, DaemonPaths, GnsBands, NodeDrainer, NodeParts,
    Phase, PodCache, PodInfo, PodType, Settings, ShutdownKind, StaticManifest, StaticPodGate,
};
use nodegrace_testkit::fake_apiserver::{running_status, DeleteOpts, FakeCluster, Store};
use nodegrace_testkit::fake_cri::{CriEvent, FakeRuntime};
use nodegrace_testkit::fake_kubelet::KubeletConfig;
use nodegrace_testkit::memory_logind::MemoryLogind;
use nodegrace_testkit::{EventLog, RecordingNotifier};

const DEFAULT_NODE: &str = "node-a";
/// A pod exits after this much real time per second of its grace period, at most
/// [`EXIT_MAX`]: a shutdown of minutes plays in a few seconds.
const EXIT_PER_GRACE_SECOND: Duration = Duration::from_millis(10);
const EXIT_MAX: Duration = Duration::from_millis(400);
const SAMPLE_EVERY: Duration = Duration::from_millis(2);
const SCALE_NOTE: &str = "pods exit after 10 ms per second of their grace period (at most 400 ms); timestamps are the simulation's real time";

/// The upper bound of `shutdown.max_delay`, which the budget stands for.
const MAX_BUDGET: Duration = Duration::from_secs(24 * 3600);

/// `--budget`: a duration the daemon would accept as `shutdown.max_delay`.
pub fn parse_budget(text: &str) -> Result<Duration, String> {
    let budget = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if budget.is_zero() || budget > MAX_BUDGET {
        return Err(format!(
            "{text} is out of range: the budget stands for shutdown.max_delay, which is more than 0s and at most 24h"
        ));
    }
    Ok(budget)
}

#[derive(Debug, Clone)]
pub struct SimulateOptions {
    pub pods: Option<PathBuf>,
    pub budget: Duration,
    pub apiserver_down: bool,
    pub output: OutputFormat,
}

#[derive(Debug, Clone, Serialize)]
pub struct SimEvent {
    pub at_ms: u64,
    /// signal, draining, maintenance-created, cordon, evict, delete, gate, cri-stop,
    /// pod-gone, inhibitor-released.
    pub event: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub band: Option<String>,
    /// Drain plan step (apiserver up) or kubelet priority band (fallback) of the pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BandTotal {
    pub band: String,
    pub order: usize,
    pub pods: usize,
    pub started_ms: u64,
    pub ended_ms: u64,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SimTotals {
    pub pods: usize,
    pub pods_terminated: usize,
    pub bands: Vec<BandTotal>,
    pub api_requests: usize,
    pub api_writes: usize,
    pub cri_calls: usize,
    /// From the signal to the inhibitor's release.
    pub total_delay_ms: u64,
    pub budget_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    pub node: String,
    pub source: String,
    pub apiserver: &'static str,
    pub time_scale: &'static str,
    pub events: Vec<SimEvent>,
    pub totals: SimTotals,
}

/// `config` is used for the drain plan, reserves and fallback bands when it exists; the
/// paths, node and budget always come from the simulation.
pub fn simulate_command(config: &std::path::Path, opts: &SimulateOptions) -> Result<ExitCode> {
    let settings = if config.exists() {
        match cli::load_settings(config) {
            Ok(s) => s,
            Err(code) => return Ok(code),
        }
    } else {
        Settings::default()
    };
    let (source, pods) = match &opts.pods {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let pods = cli::parse_pod_list(&text, &cli::LabelKeys::All)
                .with_context(|| format!("{} is not a pod list", path.display()))?
                .iter()
                .map(listed_pod_object)
                .collect::<Result<Vec<Pod>>>()?;
            (path.display().to_string(), pods)
        }
        None => ("built-in sample node".to_string(), sample_pods()?),
    };
    let report = cli::runtime()?.block_on(simulate(opts, settings, source, pods))?;
    let text = match opts.output {
        OutputFormat::Json => format!("{}\n", serde_json::to_string_pretty(&report)?),
        OutputFormat::Table => render_table(&report),
    };
    cli::print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// One simulated pod: its object for the apiserver and what the drain knows of it.
struct SimPod {
    object: Value,
    info: PodInfo,
    order: usize,
    band: String,
}

impl SimPod {
    fn key(&self) -> String {
        self.info.key()
    }

    fn exit_after(&self) -> Duration {
        let grace =
            u32::try_from(self.info.termination_grace_period_seconds.max(0)).unwrap_or(u32::MAX);
        EXIT_PER_GRACE_SECOND.saturating_mul(grace).min(EXIT_MAX)
    }
}

fn node_of(pods: &[Pod]) -> Result<String> {
    let nodes: std::collections::BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    if nodes.len() > 1 {
        bail!(
            "the pods are on {} nodes; simulate one node's pods",
            nodes.len()
        );
    }
    Ok(nodes
        .into_iter()
        .next()
        .unwrap_or_else(|| DEFAULT_NODE.to_string()))
}

/// The pods as the fake apiserver will hold them: bound to the node, Running unless finished.
fn prepare_pods(
    pods: Vec<Pod>,
    node: &str,
    settings: &Settings,
    down: bool,
) -> Result<Vec<SimPod>> {
    let now = nodegrace_testkit::fake_apiserver::fmt_time(chrono::Utc::now());
    let mut out = Vec::new();
    for (i, pod) in pods.into_iter().enumerate() {
        let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if bound.is_some_and(|n| n != node) {
            continue;
        }
        let mut object = serde_json::to_value(&pod).context("serialising a pod")?;
        object["apiVersion"] = json!("v1");
        object["kind"] = json!("Pod");
        let meta = &mut object["metadata"];
        if meta["namespace"].is_null() {
            meta["namespace"] = json!("default");
        }
        if meta["uid"].is_null() {
            meta["uid"] = json!(format!("sim-uid-{i}"));
        }
        if let Some(m) = meta.as_object_mut() {
            for k in [
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
                "managedFields",
            ] {
                m.remove(k);
            }
        }
        object["spec"]["nodeName"] = json!(node);
        let phase = object["status"]["phase"].as_str().unwrap_or_default();
        if phase != "Succeeded" && phase != "Failed" {
            object["status"] = running_status(&now);
        }
        let pod: Pod = serde_json::from_value(object.clone()).context("re-reading a pod")?;
        let info = PodInfo::from_pod(&pod).map_err(|e| anyhow::anyhow!("{e}"))?;
        out.push(SimPod {
            object,
            info,
            order: 0,
            band: String::new(),
        });
    }
    let infos: Vec<PodInfo> = out.iter().map(|p| p.info.clone()).collect();
    if down {
        let bands = GnsBands::new(&settings.fallback.shutdown_grace_period_by_pod_priority)
            .unwrap_or_else(|_| GnsBands::immediate());
        for p in &mut out {
            let b = bands.band_for(p.info.priority);
            p.order = b;
            p.band = format!("kubelet band priority >= {}", bands.bands()[b].priority);
        }
    } else {
        let plan = nodegrace::shutdown_drain_plan(settings)?;
        let steps = nodegrace::plan_steps(&plan, &infos)?;
        for step in steps {
            for member in step.pods {
                if let Some(p) = out.iter_mut().find(|p| p.info == member) {
                    p.order = step.index;
                    p.band = format!(
                        "{:?} up to priority {}",
                        step.entry.pod_type, step.entry.pod_priority
                    );
                }
            }
        }
    }
    Ok(out)
}

/// The kubelet's static pod manifests, kept in memory: gating one removes its mirror pod
/// (as the kubelet stops the pod) and is put on the timeline.
struct SimGate {
    store: Arc<Store>,
    node: String,
    active: Mutex<Vec<StaticManifest>>,
    gated: Mutex<Vec<StaticManifest>>,
    timeline: Timeline,
}

impl StaticPodGate for SimGate {
    fn recover(&self) -> Result<()> {
        Ok(())
    }
    fn active(&self) -> Result<Vec<StaticManifest>> {
        Ok(lock(&self.active).clone())
    }
    fn gated(&self) -> Result<Vec<StaticManifest>> {
        Ok(lock(&self.gated).clone())
    }
    fn gate(&self, file_name: &str) -> Result<()> {
        let mut active = lock(&self.active);
        let Some(i) = active.iter().position(|m| m.file_name == file_name) else {
            bail!("no manifest {file_name}");
        };
        let m = active.remove(i);
        let key = format!(
            "{}/{}",
            m.namespace,
            mirror_pod_name(&m.pod_name, &self.node)
        );
        self.timeline
            .push("gate", Some(key), Some(file_name.to_string()));
        if let Some(pods) = self.store.find_resource("", "v1", "pods") {
            let mirror = mirror_pod_name(&m.pod_name, &self.node);
            let _ = self
                .store
                .delete(&pods, &m.namespace, &mirror, &DeleteOpts::default());
        }
        lock(&self.gated).push(m);
        Ok(())
    }
    fn restore_all(&self) -> Result<Vec<String>> {
        let mut gated = lock(&self.gated);
        lock(&self.active).extend(gated.drain(..));
        Ok(Vec::new())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One event as it was seen.
#[derive(Clone)]
struct Seen {
    at: Instant,
    event: String,
    pod: Option<String>,
    detail: Option<String>,
}

/// Events with the moment they happened, in any order.
#[derive(Clone, Default)]
struct Timeline {
    events: Arc<Mutex<Vec<Seen>>>,
}

impl Timeline {
    fn new() -> Self {
        Timeline::default()
    }

    fn push(&self, event: &str, pod: Option<String>, detail: Option<String>) {
        self.push_at(Instant::now(), event, pod, detail);
    }

    fn push_at(&self, at: Instant, event: &str, pod: Option<String>, detail: Option<String>) {
        lock(&self.events).push(Seen {
            at,
            event: event.to_string(),
            pod,
            detail,
        });
    }
}

/// The events an apiserver request means for a user, if any.
fn classify_request(
    method: &str,
    path: &str,
    body: Option<&Value>,
    node: &str,
) -> Option<(&'static str, Option<String>)> {
    let pod_of = |p: &str| -> Option<String> {
        let ns = p.split("/namespaces/").nth(1)?.split('/').next()?;
        let name = p.split("/pods/").nth(1)?.split('/').next()?;
        Some(format!("{ns}/{name}"))
    };
    if path.contains("/nodemaintenances")
        && !path.ends_with("/status")
        && (method == "POST" || method == "PATCH" || method == "PUT")
    {
        return Some(("maintenance-write", None));
    }
    if path.ends_with(&format!("/api/v1/nodes/{node}")) && (method == "PATCH" || method == "PUT") {
        let unschedulable = body
            .and_then(|b| b.pointer("/spec/unschedulable"))
            .and_then(Value::as_bool);
        return match unschedulable {
            Some(true) => Some(("cordon", None)),
            Some(false) => Some(("uncordon", None)),
            None => None,
        };
    }
    if path.contains("/pods/") {
        if method == "POST" && path.ends_with("/eviction") {
            return Some(("evict", pod_of(path)));
        }
        if method == "DELETE" && !path.ends_with("/eviction") {
            return Some(("delete", pod_of(path)));
        }
    }
    None
}

async fn simulate(
    opts: &SimulateOptions,
    mut settings: Settings,
    source: String,
    pods: Vec<Pod>,
) -> Result<SimReport> {
    let node = node_of(&pods)?;
    let dir = ScratchDir::create()?;
    settings.node.name = node.clone();
    settings.state_dir = dir.path().join("state");
    std::fs::create_dir_all(&settings.state_dir)?;
    settings.shutdown.max_delay = opts.budget;
    settings.shutdown.manage_logind_dropin = false;
    settings.fallback.apiserver_timeout = settings
        .fallback
        .apiserver_timeout
        .min(Duration::from_secs(1));
    // No real kubelet to stop, no metrics listener, no drop-ins: everything stays in here.
    settings.fallback.stop_kubelet = false;
    settings.metrics.listen = None;
    let pods = prepare_pods(pods, &node, &settings, opts.apiserver_down)?;
    if pods.is_empty() {
        bail!("no pods on node {node} to simulate");
    }

    let cluster = FakeCluster::start().await?;
    cluster.install_crd(&node_maintenance_crd()?)?;
    cluster.add_node(&node)?;
    let timeline = Timeline::new();
    let gate = Arc::new(SimGate {
        store: cluster.store.clone(),
        node: node.clone(),
        active: Mutex::new(Vec::new()),
        gated: Mutex::new(Vec::new()),
        timeline: timeline.clone(),
    });
    let runtime = FakeRuntime::new();
    let cri_timeline = timeline.clone();
    // Every StopContainer and the container's exit go on the timeline the moment they happen.
    runtime.observe(move |event| match event {
        CriEvent::StopRequested { pod, grace, .. } => cri_timeline.push(
            "cri-stop",
            Some(pod),
            Some(format!("grace {}", cli::human(grace))),
        ),
        CriEvent::ContainerStopped { pod, .. } => cri_timeline.push("pod-gone", Some(pod), None),
        CriEvent::SandboxStopped { .. } => {}
    });
    let mut finish_after = std::collections::HashMap::new();
    for p in &pods {
        let ns = p.info.namespace.as_str();
        cluster.ensure_namespace(ns)?;
        cluster.insert(&p.object)?;
        finish_after.insert(p.key(), p.exit_after());
        let uid = p
            .info
            .static_hash
            .clone()
            .unwrap_or_else(|| p.info.uid.clone());
        if !p.info.terminal {
            runtime.add_pod(ns, &p.info.name, &uid, p.exit_after());
        }
        if p.info.pod_type == PodType::Static {
            let pod_name = p
                .info
                .name
                .strip_suffix(&format!("-{node}"))
                .unwrap_or(&p.info.name)
                .to_string();
            lock(&gate.active).push(StaticManifest {
                file_name: format!("{pod_name}.yaml"),
                namespace: ns.to_string(),
                pod_name,
                priority: p.info.priority,
                labels: Default::default(),
            });
        }
    }
    let kubelet = cluster.kubelet(KubeletConfig {
        finish_after,
        ..KubeletConfig::node(&node)
    });
    if opts.apiserver_down {
        // What the daemon cached while the apiserver last answered.
        PodCache {
            node: node.clone(),
            written_at: None,
            pods: pods.iter().map(|p| p.info.clone()).collect(),
        }
        .store(&settings.state_dir)?;
        cluster.api.set_reachable(false).await?;
    }
    let boot_id = dir.path().join("boot_id");
    std::fs::write(&boot_id, "simulated-boot\n")?;
    let logind = MemoryLogind::new(opts.budget, EventLog::default());
    let sim_cluster = cluster.clone();
    let drainer = NodeDrainer::start(
        NodeParts {
            settings: settings.clone(),
            node: node.clone(),
            runtime: Arc::new(runtime.clone()),
            kubelet: None,
            gate: gate.clone(),
            metrics: nodegrace::Metrics::new(),
            boot_id: nodegrace::BootIdSource::File(boot_id),
        },
        move || {
            let cluster = sim_cluster.clone();
            async move { cluster.clients() }
        },
    );
    let daemon = Daemon::new(
        settings.clone(),
        DaemonPaths {
            status_file: dir.path().join("status.json"),
            logind_search_dirs: Vec::new(),
        },
        Arc::new(logind.clone()),
        Arc::new(drainer),
        Arc::new(RecordingNotifier::default()),
    );
    let handle = daemon.handle();
    let running = tokio::spawn(daemon.run());
    let armed = tokio::time::timeout(
        Duration::from_secs(10),
        handle.wait_for(|s| s.phase == Phase::Armed),
    )
    .await;
    if !matches!(armed, Ok(Some(_))) {
        bail!(
            "the daemon did not take its inhibitor: {:?}",
            handle.status().last_error
        );
    }
    if !opts.apiserver_down {
        // Let the engine list the node's pods, as a daemon up for a while would have.
        wait_until(Duration::from_secs(10), || {
            cluster
                .api
                .requests()
                .iter()
                .any(|r| r.method == "GET" && r.path.ends_with("/pods"))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let requests_before = cluster.api.requests().len();

    let t0 = Instant::now();
    timeline.push_at(t0, "signal", None, Some("PrepareForShutdown(true)".into()));
    logind.prepare_for_shutdown(true, Some(ShutdownKind::Poweroff));

    let limit = opts.budget.min(Duration::from_secs(120)) + Duration::from_secs(10);
    let mut seen_requests = requests_before;
    let mut gone: BTreeMap<String, bool> = pods
        .iter()
        .filter(|p| !p.info.terminal)
        .map(|p| (p.key(), false))
        .collect();
    let mut draining_seen = false;
    let mut maintenance_seen = false;
    let released_at = loop {
        let now = Instant::now();
        if now - t0 > limit {
            bail!("the inhibitor was not released within {limit:?}");
        }
        // Read before the scans, so that a last pass sees everything that led to the release.
        let released = logind
            .fakes()
            .state()
            .inhibitors
            .iter()
            .filter(|i| i.taken_at <= t0)
            .find_map(|i| i.closed_at);
        // Pods gone first: what the drain reacted to in this interval happened before it.
        let cri_running = runtime.running();
        let finished = kubelet.finished();
        for (key, done) in gone.iter_mut().filter(|(_, d)| !**d) {
            let (ns, name) = key.split_once('/').unwrap_or(("", key));
            let at = if opts.apiserver_down {
                // The runtime's observer puts the exit itself on the timeline.
                (!cri_running.contains(key)).then_some(None)
            } else if cluster.store.get_obj("", "pods", ns, name).is_none() {
                // The kubelet's own record of the moment, not when this loop noticed.
                let exact = finished
                    .iter()
                    .find(|f| f.namespace == ns && f.name == name)
                    .map(|f| f.finished_at.into_std());
                Some(Some(exact.unwrap_or_else(Instant::now)))
            } else {
                None
            };
            if let Some(at) = at {
                *done = true;
                if let Some(at) = at {
                    timeline.push_at(at, "pod-gone", Some(key.clone()), None);
                }
            }
        }
        let requests = cluster.api.requests();
        for r in &requests[seen_requests.min(requests.len())..] {
            match classify_request(&r.method, &r.path, r.body_json().as_ref(), &node) {
                Some(("maintenance-write", _)) if !maintenance_seen => {
                    maintenance_seen = true;
                    timeline.push(
                        "maintenance-created",
                        None,
                        Some(format!("shutdown-{node}")),
                    );
                }
                Some(("maintenance-write", _)) | None => {}
                Some((kind, pod)) => timeline.push(kind, pod, None),
            }
        }
        seen_requests = requests.len();
        let status = handle.status();
        if !draining_seen && status.phase == Phase::Draining {
            draining_seen = true;
            let detail = if opts.apiserver_down {
                format!(
                    "apiserver unreachable: the offline drain starts after fallback.apiserver_timeout ({})",
                    cli::human(settings.fallback.apiserver_timeout)
                )
            } else {
                format!("budget {}", cli::human(opts.budget))
            };
            timeline.push("draining", None, Some(detail));
        }
        if let Some(closed) = released {
            break closed;
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    };
    timeline.push_at(
        released_at,
        "inhibitor-released",
        None,
        Some("the shutdown may proceed".into()),
    );
    handle.terminate();
    let _ = tokio::time::timeout(Duration::from_secs(5), running).await;

    let requests = cluster.api.requests();
    let made = &requests[requests_before.min(requests.len())..];
    Ok(build_report(
        node,
        source,
        opts,
        &pods,
        &timeline,
        t0,
        made.len(),
        made.iter().filter(|r| r.method != "GET").count(),
        runtime.calls().len(),
        released_at,
    ))
}

/// A private directory under `$TMPDIR`, removed when the simulation ends.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn create() -> Result<Self> {
        let nanos = chrono::Utc::now().timestamp_subsec_nanos();
        let path =
            std::env::temp_dir().join(format!("nodegrace-simulate-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path)
            .with_context(|| format!("creating the scratch directory {}", path.display()))?;
        Ok(ScratchDir(path))
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[allow(clippy::too_many_arguments)]
fn build_report(
    node: String,
    source: String,
    opts: &SimulateOptions,
    pods: &[SimPod],
    timeline: &Timeline,
    t0: Instant,
    api_requests: usize,
    api_writes: usize,
    cri_calls: usize,
    released_at: Instant,
) -> SimReport {
    let ms = |at: Instant| {
        u64::try_from(at.saturating_duration_since(t0).as_millis()).unwrap_or(u64::MAX)
    };
    let mut raw = lock(&timeline.events).clone();
    raw.sort_by_key(|e| e.at);
    let by_key: BTreeMap<String, &SimPod> = pods.iter().map(|p| (p.key(), p)).collect();
    let events: Vec<SimEvent> = raw
        .into_iter()
        .map(
            |Seen {
                 at,
                 event,
                 pod,
                 detail,
             }| {
                let p = pod.as_ref().and_then(|k| by_key.get(k));
                SimEvent {
                    at_ms: ms(at),
                    event,
                    band: p.map(|p| p.band.clone()),
                    order: p.map(|p| p.order),
                    priority: p.map(|p| p.info.priority),
                    pod,
                    detail,
                }
            },
        )
        .collect();
    let mut bands: BTreeMap<usize, BandTotal> = BTreeMap::new();
    for e in events.iter().filter(|e| e.order.is_some()) {
        let (Some(order), Some(band)) = (e.order, &e.band) else {
            continue;
        };
        let b = bands.entry(order).or_insert_with(|| BandTotal {
            band: band.clone(),
            order,
            pods: 0,
            started_ms: e.at_ms,
            ended_ms: e.at_ms,
            duration_ms: 0,
        });
        b.started_ms = b.started_ms.min(e.at_ms);
        b.ended_ms = b.ended_ms.max(e.at_ms);
        if e.event == "pod-gone" {
            b.pods += 1;
        }
    }
    let bands: Vec<BandTotal> = bands
        .into_values()
        .map(|mut b| {
            b.duration_ms = b.ended_ms - b.started_ms;
            b
        })
        .collect();
    let pods_terminated = events.iter().filter(|e| e.event == "pod-gone").count();
    SimReport {
        node,
        source,
        apiserver: if opts.apiserver_down {
            "unreachable: offline fallback through the CRI runtime"
        } else {
            "reachable"
        },
        time_scale: SCALE_NOTE,
        totals: SimTotals {
            pods: pods.iter().filter(|p| !p.info.terminal).count(),
            pods_terminated,
            bands,
            api_requests,
            api_writes,
            cri_calls,
            total_delay_ms: ms(released_at),
            budget_ms: u64::try_from(opts.budget.as_millis()).unwrap_or(u64::MAX),
        },
        events,
    }
}

fn render_table(r: &SimReport) -> String {
    let mut out = format!(
        "Simulated shutdown of {} ({}), apiserver {}\nTimes: {}.\n\n",
        r.node, r.source, r.apiserver, r.time_scale
    );
    let mut rows = vec![vec![
        "TIME".to_string(),
        "EVENT".into(),
        "POD".into(),
        "BAND".into(),
        "DETAIL".into(),
    ]];
    for e in &r.events {
        rows.push(vec![
            format!("+{:.3}s", e.at_ms as f64 / 1000.0),
            e.event.clone(),
            e.pod.clone().unwrap_or_default(),
            e.band.clone().unwrap_or_default(),
            e.detail.clone().unwrap_or_default(),
        ]);
    }
    for line in cli::align(&rows) {
        out.push_str(&line);
        out.push('\n');
    }
    let t = &r.totals;
    out.push_str(&format!(
        "\nTotals: {} of {} pods terminated; inhibitor released {:.3}s after the signal (budget {}); {} apiserver requests ({} writes); {} CRI calls\n",
        t.pods_terminated,
        t.pods,
        t.total_delay_ms as f64 / 1000.0,
        cli::human(Duration::from_millis(t.budget_ms)),
        t.api_requests,
        t.api_writes,
        t.cri_calls
    ));
    let mut rows = vec![vec![
        "STEP".to_string(),
        "BAND".into(),
        "PODS".into(),
        "FROM".into(),
        "TO".into(),
        "DURATION".into(),
    ]];
    for b in &t.bands {
        rows.push(vec![
            b.order.to_string(),
            b.band.clone(),
            b.pods.to_string(),
            format!("+{:.3}s", b.started_ms as f64 / 1000.0),
            format!("+{:.3}s", b.ended_ms as f64 / 1000.0),
            format!("{:.3}s", b.duration_ms as f64 / 1000.0),
        ]);
    }
    for line in cli::align(&rows) {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn sample_pod(
    ns: &str,
    name: &str,
    priority: i32,
    grace: i64,
    owner: Option<(&str, &str)>,
) -> Value {
    let mut meta = json!({"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"), "labels": {"app": name}});
    match owner {
        Some(("Static", hash)) => {
            meta["annotations"] = json!({"kubernetes.io/config.mirror": hash, "kubernetes.io/config.source": "file", "kubernetes.io/config.hash": hash});
        }
        Some((kind, owner_name)) => {
            meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": owner_name, "uid": format!("uid-{owner_name}"), "controller": true}]);
        }
        None => {}
    }
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": DEFAULT_NODE, "priority": priority, "terminationGracePeriodSeconds": grace,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        "status": {"phase": "Running"},
    })
}

/// A pod of a list as the simulated apiserver holds it: what the drain reads of it (the
/// product reads no more of a pod list).
fn listed_pod_object(p: &cli::ListedPod) -> Result<Pod> {
    let info = &p.info;
    let mut meta = json!({"name": info.name, "namespace": info.namespace, "labels": info.labels});
    if !info.uid.is_empty() {
        meta["uid"] = json!(info.uid);
    }
    match info.pod_type {
        PodType::Static => {
            let hash = info.static_hash.clone().unwrap_or_default();
            meta["annotations"] = json!({"kubernetes.io/config.mirror": hash, "kubernetes.io/config.source": "file", "kubernetes.io/config.hash": hash});
        }
        PodType::DaemonSet => {
            meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "uid-ds", "controller": true}]);
        }
        PodType::Default => {}
    }
    let object = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": p.node_name, "priority": info.priority,
                 "terminationGracePeriodSeconds": info.termination_grace_period_seconds,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        "status": {"phase": p.phase},
    });
    serde_json::from_value(object).with_context(|| format!("pod {}", info.key()))
}

/// A small node: Default pods over several priorities, a critical one, DaemonSet pods and a
/// static pod.
fn sample_pods() -> Result<Vec<Pod>> {
    let rs = Some(("ReplicaSet", "rs"));
    let sts = Some(("StatefulSet", "sts"));
    let ds = Some(("DaemonSet", "ds"));
    [
        sample_pod("batch", "report-28f1", -100, 10, None),
        sample_pod("shop", "web-6d9f-a", 0, 30, rs),
        sample_pod("shop", "web-6d9f-b", 0, 30, rs),
        sample_pod("shop", "checkout-77c4-a", 100, 30, rs),
        sample_pod("shop", "cache-0", 1_000, 60, sts),
        sample_pod("data", "postgres-0", 10_000, 120, sts),
        sample_pod("monitoring", "prometheus-0", 1_000_000, 60, sts),
        sample_pod("kube-system", "coredns-5d78-a", 2_000_000_000, 30, rs),
        sample_pod("monitoring", "node-exporter-x7k2", 0, 30, ds),
        sample_pod("kube-system", "kube-proxy-q9z4", 2_000_001_000, 30, ds),
        sample_pod(
            "kube-system",
            &format!("etcd-{DEFAULT_NODE}"),
            2_000_001_000,
            30,
            Some(("Static", "etcd-hash")),
        ),
    ]
    .into_iter()
    .map(|v| serde_json::from_value(v).context("a sample pod"))
    .collect()
}
