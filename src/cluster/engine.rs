//! The drain engine for the daemon's own node.
//!
//! Four reflectors (the Node, its pods, every NodeMaintenance, VolumeAttachments) feed one
//! reconcile loop that wakes on a watch event or on a timer it set itself (eviction
//! back-off, escalation deadline, debounced status): there is no polling. Each pass computes
//! everything from the reflected state (plus the objects our own writes returned, so a write
//! is never repeated before its watch event arrives) and issues only the requests that
//! change something.
//!
//! Restart safety comes from that statelessness: the node's drain targets are read back from
//! its entry in each maintenance's `status.nodeStatuses` (never backtracking), pods already
//! terminating are not asked again, and the shutdown maintenance is adopted by name.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::evict::{backoff, Outcome};
use super::eviction_request::ControllerHandle;
use super::node::{
    cordon_patch, lb_exclusion_patch, maintenance_taint_patch, patch_node_with,
    set_shutdown_condition, uncordon_patch, SHUTDOWN_CONDITION,
};
use super::nodesel;
use super::terminate::{EvictionApi, PodTerminator, Request};
use super::{api_error_code, FIELD_MANAGER};
use crate::api::{
    node_selector_for, node_status_apply_patch, node_status_patch_params, NodeMaintenance,
    NodeMaintenanceNodeStatus, NodeMaintenanceSpec, Stage, CONDITION_DRAINED,
    FINALIZER_MAINTENANCE_COMPLETION,
};
use crate::config::{CompletionPolicy, Settings};
use crate::daemon::{ShutdownKind, ShutdownRequest};
use crate::metrics::{Metrics, TerminationMethod};
use crate::plan::budget::{
    escalation_grace, plan_steps, split_budget, BudgetReserves, StepSchedule,
};
use crate::plan::targets::{evaluate_node, MaintenanceInput};
use crate::plan::{
    normalize_drain_plan, reached_drain_targets, DrainPlanEntry, DrainTargets, NodeReport, PodInfo,
    PodType,
};
use crate::state::OfflineDrain;
use crate::state::PodCache;
use crate::staticpods::StaticPodGate;

/// The boot that created the shutdown maintenance (`/proc/sys/kernel/random/boot_id`).
pub const BOOT_ID_ANNOTATION: &str = "nodegrace.dev/boot-id";
/// poweroff | reboot | bypass | unknown.
pub const SHUTDOWN_KIND_ANNOTATION: &str = "nodegrace.dev/shutdown-kind";
/// A summary of the offline (CRI) drain, written once the apiserver is back.
pub const FALLBACK_ANNOTATION: &str = "nodegrace.dev/fallback-report";
/// `drainMessage` of a node that carried out a maintenance's Complete stage.
pub const COMPLETED_MESSAGE: &str = "Completed";

const STATUS_DEBOUNCE: Duration = Duration::from_millis(200);
const POD_CACHE_DEBOUNCE: Duration = Duration::from_secs(1);
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);
const CONCURRENT_REQUESTS: usize = 32;
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

pub use crate::api::shutdown_maintenance_name;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The apiserver could not be used (no answer, or answers that refuse or fail every
    /// request: 401, 403, 429, 5xx) for longer than `fallback.apiserver_timeout` since the
    /// last good answer: switch to the local (CRI) fallback.
    #[error("the apiserver has not been usable for {0:?} (last error: {1})")]
    ApiserverUnreachable(Duration, String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// What the offline fallback did, as the engine records it on the maintenance (the
/// `nodegrace.dev/fallback-report` annotation, JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FallbackSummary {
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    pub pods_stopped: usize,
    pub pods_not_stopped: usize,
    /// Pods whose band had not started when the fallback ended (handed to the cluster
    /// path, or the shutdown's time was up).
    pub pods_not_reached: usize,
    pub kubelet_stopped: bool,
    /// `namespace/name` of the pods stopped (or, static pods with nothing running, gated).
    pub stopped: Vec<String>,
    /// `namespace/name: what went wrong` for the pods it tried to stop and could not.
    pub not_stopped: Vec<String>,
    /// `namespace/name: why` for the pods it never got to: the runtime could not be
    /// listed or did not list them, or their band had not started.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_reached: Vec<String>,
}

/// Pods listed by name in the annotation; the counts stay exact beyond it.
const SUMMARY_MAX_NAMES: usize = 200;

impl FallbackSummary {
    /// One summary over every fallback run of a shutdown, in order.
    pub fn of_runs(runs: &[crate::fallback::FallbackReport]) -> Self {
        use crate::fallback::PodOutcome;
        let mut s = FallbackSummary {
            started_at: runs.iter().find_map(|r| r.started_at),
            finished_at: runs.iter().rev().find_map(|r| r.finished_at),
            kubelet_stopped: runs.last().is_some_and(|r| r.kubelet_stopped),
            ..Default::default()
        };
        for pod in runs.iter().flat_map(|r| &r.pods) {
            let key = format!("{}/{}", pod.namespace, pod.name);
            if matches!(pod.outcome, PodOutcome::Stopped | PodOutcome::Gated) {
                s.pods_stopped += 1;
                if s.stopped.len() < SUMMARY_MAX_NAMES {
                    s.stopped.push(key);
                }
            } else if matches!(pod.outcome, PodOutcome::Pending | PodOutcome::NotReached) {
                s.pods_not_reached += 1;
                if s.not_reached.len() < SUMMARY_MAX_NAMES {
                    let why = pod.errors.first().cloned().unwrap_or_else(|| {
                        "its band had not started when the fallback ended".to_string()
                    });
                    s.not_reached.push(format!("{key}: {why}"));
                }
            } else {
                s.pods_not_stopped += 1;
                if s.not_stopped.len() < SUMMARY_MAX_NAMES {
                    let why = pod.errors.first().cloned().unwrap_or_else(|| {
                        if pod.outcome == PodOutcome::Stopping {
                            "still stopping when the fallback ended".to_string()
                        } else {
                            format!("{:?}", pod.outcome).to_lowercase()
                        }
                    });
                    s.not_stopped.push(format!("{key}: {why}"));
                }
            }
        }
        s
    }

    /// The Event note.
    pub fn describe(&self) -> String {
        format!(
            "the apiserver was unreachable: the local fallback stopped {} pod(s), {} not stopped, {} not reached",
            self.pods_stopped, self.pods_not_stopped, self.pods_not_reached
        )
    }
}

impl From<&crate::fallback::FallbackReport> for FallbackSummary {
    fn from(r: &crate::fallback::FallbackReport) -> Self {
        Self::of_runs(std::slice::from_ref(r))
    }
}

/// How long the steps of the last `shutdown_drain` took, from its call (for benchmarks and
/// logs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ShutdownTimings {
    pub maintenance_ready: Option<Duration>,
    pub cordoned: Option<Duration>,
    pub node_empty: Option<Duration>,
    pub volumes_detached: Option<Duration>,
}

/// What `after_boot` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterBoot {
    NoMaintenance,
    /// The maintenance was created in this boot (a restart of the daemon, not a reboot).
    SameBoot,
    AlreadyComplete,
    Completed,
    Kept,
    /// An offline drain of an earlier boot could not be recorded: the NodeMaintenance API is
    /// not installed.
    Unrecorded,
}

pub struct EngineOptions {
    pub client: Client,
    /// The apiserver's URL and the identity the client has there, for logs.
    pub endpoint: String,
    pub settings: Settings,
    pub node: String,
    pub gate: Arc<dyn StaticPodGate>,
    pub metrics: Metrics,
    /// None: the Eviction API.
    pub terminator: Option<Arc<dyn PodTerminator>>,
}

struct ShutdownCtx {
    name: String,
    step_targets: Vec<DrainTargets>,
    schedule: Vec<StepSchedule>,
    /// Tokio instant of `ShutdownRequest::started_at`.
    start: Instant,
    escalate: bool,
}

impl ShutdownCtx {
    fn step_of(&self, pod: &PodInfo) -> Option<usize> {
        self.step_targets.iter().position(|t| t.targets(pod))
    }

    fn node_empty(&self, pods: &[PodInfo]) -> bool {
        self.step_targets.last().is_none_or(|t| t.is_finished(pods))
    }
}

#[derive(Debug, Clone, Default)]
struct Progress {
    /// Set once the node is empty under the shutdown maintenance and its status is written.
    shutdown_done: bool,
}

#[derive(Default)]
struct Ready {
    node: bool,
    pods: bool,
    maintenances: bool,
    volumes: bool,
}

struct Shared {
    client: Client,
    node: String,
    settings: Settings,
    gate: Arc<dyn StaticPodGate>,
    metrics: Metrics,
    terminator: Arc<dyn PodTerminator>,
    nodes: Store<Node>,
    pods: Store<Pod>,
    maintenances: Store<NodeMaintenance>,
    volumes: Store<VolumeAttachment>,
    ready: Mutex<Ready>,
    wake: watch::Sender<u64>,
    endpoint: String,
    /// Since when every request to the apiserver has failed (see [`is_unusable`]).
    failing: Mutex<Option<Failing>>,
    shutdown: Mutex<Option<Arc<ShutdownCtx>>>,
    progress: watch::Sender<Progress>,
    recorder: Recorder,
    fallback: Mutex<Option<FallbackSummary>>,
    timings: Mutex<ShutdownTimings>,
    /// This node's eviction-request controller, when nodegrace is it: fed the engine's pod
    /// events and the eviction back-off cap in force.
    eviction_requests: Mutex<Option<ControllerHandle>>,
}

/// The node's drain engine. Dropping it stops its watches and its loop.
pub struct Engine {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a kube error says the apiserver cannot be used now, as opposed to an answer
/// about the request itself (404, 409, 422, ...): no answer at all, or an answer that
/// fails or refuses this client whatever it asks. An apiserver that is starting answers
/// 403 to everything until its RBAC caches are loaded, and 5xx while its storage is not
/// ready; such answers are retried, and only their persistence past
/// `fallback.apiserver_timeout` sends a shutdown to the offline fallback.
fn is_unusable(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => matches!(status.code, 401 | 403 | 429 | 500..=599),
        kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) => false,
        _ => true,
    }
}

fn anyhow_is_unusable(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|c| c.downcast_ref::<kube::Error>().is_some_and(is_unusable))
}

/// Since when the apiserver cannot be used, and what it last said.
struct Failing {
    since: Instant,
    last_error: String,
    reminded: Instant,
}

/// How often a still unusable apiserver is mentioned in the log again.
const UNUSABLE_REMINDER: Duration = Duration::from_secs(60);

fn rv_number<K: Resource>(k: &K) -> u64 {
    k.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn fresher<K: Resource>(a: Arc<K>, b: Option<&Arc<K>>) -> Arc<K> {
    match b {
        Some(b) if rv_number(b.as_ref()) > rv_number(a.as_ref()) => b.clone(),
        _ => a,
    }
}

fn has_finalizer(m: &NodeMaintenance) -> bool {
    m.finalizers()
        .iter()
        .any(|f| f == FINALIZER_MAINTENANCE_COMPLETION)
}

fn is_deleting(m: &NodeMaintenance) -> bool {
    m.metadata.deletion_timestamp.is_some()
}

fn is_active(m: &NodeMaintenance) -> bool {
    !is_deleting(m) && matches!(m.spec.stage, Stage::Cordon | Stage::Drain)
}

fn is_draining(m: &NodeMaintenance) -> bool {
    !is_deleting(m) && m.spec.stage == Stage::Drain
}

fn kind_str(kind: ShutdownKind) -> &'static str {
    match kind {
        ShutdownKind::Poweroff => "poweroff",
        ShutdownKind::Reboot => "reboot",
        ShutdownKind::Bypass => "bypass",
        ShutdownKind::Unknown => "unknown",
    }
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn min_wake(wake: &mut Option<Instant>, at: Instant) {
    *wake = Some(wake.map_or(at, |w| w.min(at)));
}

fn tolerates_everything(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.operator.as_deref() == Some("Exists")
                    && t.key.as_deref().unwrap_or_default().is_empty()
                    && t.effect.as_deref().unwrap_or_default().is_empty()
            })
        })
}

/// When the node's drain began: the earliest Drain stage start (`status.stageStatuses`, else
/// the creation) among the draining maintenances that select it.
fn drain_began(active: &[Arc<NodeMaintenance>]) -> Option<chrono::DateTime<chrono::Utc>> {
    active
        .iter()
        .filter(|m| is_draining(m))
        .filter_map(|m| {
            let started = m
                .status
                .as_ref()
                .and_then(|s| s.stage_statuses.iter().find(|s| s.name == Stage::Drain))
                .and_then(|s| s.start_timestamp.as_ref())
                .or(m.metadata.creation_timestamp.as_ref())?;
            chrono::DateTime::from_timestamp(started.0.as_second(), 0)
        })
        .min()
}

fn daemonset_owner(pod: &Pod) -> Option<&str> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "DaemonSet")
        .map(|o| o.uid.as_str())
}

/// DaemonSet pods that tolerate every taint are recreated by their controller at once, on a
/// cordoned and tainted node too: each is terminated once, and another pod of that
/// DaemonSet is its replacement, neither chased nor waited for (the kubelet stops it at
/// poweroff). A replacement is one created after the second in which the node's drain
/// began (which holds across restarts of the daemon), or one that is not the pod this
/// drain terminated for its DaemonSet (`terminated`: DaemonSet UID -> pod UID).
fn daemonset_replacements(
    raw_pods: &[Arc<Pod>],
    active: &[Arc<NodeMaintenance>],
    terminated: &HashMap<String, String>,
) -> HashSet<String> {
    let Some(began) = drain_began(active) else {
        return HashSet::new();
    };
    raw_pods
        .iter()
        .filter(|p| tolerates_everything(p))
        .filter(|p| {
            let Some(owner) = daemonset_owner(p) else {
                return false;
            };
            let later = p
                .metadata
                .creation_timestamp
                .as_ref()
                .and_then(|t| chrono::DateTime::from_timestamp(t.0.as_second(), 0))
                .is_some_and(|created| created > began);
            let another = terminated
                .get(owner)
                .is_some_and(|uid| p.metadata.uid.as_ref() != Some(uid));
            later || another
        })
        .filter_map(|p| p.uid())
        .collect()
}

/// The shutdown drain plan from the configuration, normalized (defaults injected).
pub fn shutdown_plan(settings: &Settings) -> Result<Vec<DrainPlanEntry>> {
    let entries: Vec<DrainPlanEntry> = settings
        .drain
        .plan
        .iter()
        .map(DrainPlanEntry::from)
        .collect();
    normalize_drain_plan(&entries).context("normalizing drain.plan")
}

/// Per-pod bookkeeping of the drain, keyed by pod UID.
#[derive(Debug, Default, Clone)]
struct PodTrack {
    /// A request was accepted (or the pod turned out gone): wait for the watch.
    accepted: bool,
    attempts: u32,
    /// When the last failed attempt was made and the back-off it earned.
    last_try: Option<(Instant, Duration)>,
    /// `namespace/pdb` (or the apiserver's message) of the last 429.
    blocked_by: Option<String>,
    escalated: bool,
}

#[derive(Default)]
struct DrainState {
    targets: DrainTargets,
    targets_since: Option<Instant>,
    tracks: HashMap<String, PodTrack>,
    node_overlay: Option<Arc<Node>>,
    nm_overlay: HashMap<String, Arc<NodeMaintenance>>,
    last_entry_write: HashMap<String, Instant>,
    announced: HashSet<String>,
    cache_written: Option<Vec<PodInfo>>,
    cache_due: Option<Instant>,
    /// DaemonSet UID -> the UID of its tolerate-all pod this drain terminated.
    daemonset_terminated: HashMap<String, String>,
    /// The eviction back-off cap last given to the eviction-request controller.
    backoff_cap: Option<Duration>,
}

struct MaintView {
    m: Arc<NodeMaintenance>,
    name: String,
    plan_len: usize,
    index: usize,
    drained: bool,
    targets: DrainTargets,
}

enum Job {
    Terminate(PodInfo, Request, String, bool),
}

impl Engine {
    /// Starts the watches and the reconcile loop. Returns at once; the loop acts as soon as
    /// the first lists arrive.
    pub fn start(opts: EngineOptions) -> Engine {
        let (nodes_r, nodes_w) = reflector::store::<Node>();
        let (pods_r, pods_w) = reflector::store::<Pod>();
        let (nms_r, nms_w) = reflector::store::<NodeMaintenance>();
        let (vas_r, vas_w) = reflector::store::<VolumeAttachment>();
        let (wake, _) = watch::channel(0u64);
        let (progress, _) = watch::channel(Progress::default());
        let terminator = opts
            .terminator
            .unwrap_or_else(|| Arc::new(EvictionApi::new(opts.client.clone())));
        let recorder = Recorder::new(
            opts.client.clone(),
            Reporter {
                controller: "nodegrace".into(),
                instance: Some(opts.node.clone()),
            },
        );
        let shared = Arc::new(Shared {
            client: opts.client.clone(),
            node: opts.node.clone(),
            settings: opts.settings,
            gate: opts.gate,
            metrics: opts.metrics,
            terminator,
            nodes: nodes_r,
            pods: pods_r,
            maintenances: nms_r,
            volumes: vas_r,
            ready: Mutex::new(Ready::default()),
            wake,
            endpoint: opts.endpoint,
            failing: Mutex::new(None),
            shutdown: Mutex::new(None),
            progress,
            recorder,
            fallback: Mutex::new(None),
            timings: Mutex::new(ShutdownTimings::default()),
            eviction_requests: Mutex::new(None),
        });
        let c = &opts.client;
        let node = &opts.node;
        let tasks = vec![
            spawn_reflector(
                shared.clone(),
                Api::<Node>::all(c.clone()),
                watcher::Config::default().fields(&format!("metadata.name={node}")),
                nodes_w,
                |r| &mut r.node,
                false,
                |_, _| {},
            ),
            spawn_reflector(
                shared.clone(),
                Api::<Pod>::all(c.clone()),
                watcher::Config::default().fields(&format!("spec.nodeName={node}")),
                pods_w,
                |r| &mut r.pods,
                false,
                Shared::pod_changed,
            ),
            spawn_reflector(
                shared.clone(),
                Api::<NodeMaintenance>::all(c.clone()),
                watcher::Config::default(),
                nms_w,
                |r| &mut r.maintenances,
                false,
                |_, _| {},
            ),
            spawn_reflector(
                shared.clone(),
                Api::<VolumeAttachment>::all(c.clone()),
                watcher::Config::default(),
                vas_w,
                |r| &mut r.volumes,
                true,
                |_, _| {},
            ),
            tokio::spawn(run_loop(shared.clone())),
        ];
        Engine { shared, tasks }
    }

    pub fn node(&self) -> &str {
        &self.shared.node
    }

    /// The node's pods as the engine's watch holds them (the eviction-request controller's
    /// pod cache: one watch of the node's pods serves both).
    pub fn pod_store(&self) -> Store<Pod> {
        self.shared.pods.clone()
    }

    /// Feeds this node's eviction-request controller: pod events, and the shorter eviction
    /// back-off cap while a shutdown runs.
    pub fn attach_eviction_request_controller(&self, handle: ControllerHandle) {
        *lock(&self.shared.eviction_requests) = Some(handle);
        self.shared.bump();
    }

    pub fn timings(&self) -> ShutdownTimings {
        *lock(&self.shared.timings)
    }

    /// The node's current pods as the engine sees them (for the pod cache and `status`).
    pub fn pods(&self) -> Vec<PodInfo> {
        self.shared.pod_infos()
    }

    /// Drains the node for a shutdown through `shutdown-<node>` and returns once the node is
    /// empty, its VolumeAttachments are gone (bounded) and the last status update reached
    /// the apiserver. Cancel-safe: dropping the future leaves the maintenance in place.
    pub async fn shutdown_drain(&self, req: &ShutdownRequest) -> Result<(), EngineError> {
        let sh = &self.shared;
        let t0 = Instant::now();
        *lock(&sh.timings) = ShutdownTimings::default();
        sh.wait_ready(|r| r.node && r.pods && r.maintenances)
            .await?;

        let plan = shutdown_plan(&sh.settings)?;
        let name = shutdown_maintenance_name(&sh.node);
        // Cordon first: nothing new lands on the node while the maintenance is set up.
        sh.cordon_for_shutdown().await?;
        lock(&sh.timings).cordoned = Some(t0.elapsed());
        let (condition, adopted) = tokio::join!(sh.set_condition_for_shutdown(req), async {
            let r = sh.ensure_shutdown_maintenance(req, &plan).await;
            lock(&sh.timings).maintenance_ready = Some(t0.elapsed());
            r
        });
        let maintenance = adopted?;
        if let Err(e) = condition {
            tracing::warn!(node = %sh.node, error = format!("{e:#}"), "setting the shutdown condition failed");
        }

        let plan = normalize_drain_plan(&maintenance.spec.drain_plan).unwrap_or(plan);
        let pods = sh.pod_infos();
        let steps = plan_steps(&plan, &pods).context("splitting the pods over the drain plan")?;
        let schedule = split_budget(
            req.budget,
            &steps,
            &BudgetReserves::from(&sh.settings.drain),
        );
        let step_targets = (0..plan.len())
            .map(|i| DrainTargets::for_plan(&plan, i))
            .collect::<Result<Vec<_>, _>>()
            .context("computing the shutdown drain targets")?;
        let elapsed = (chrono::Utc::now() - req.started_at)
            .to_std()
            .unwrap_or(Duration::ZERO);
        let start = Instant::now()
            .checked_sub(elapsed)
            .unwrap_or_else(Instant::now);
        *lock(&sh.shutdown) = Some(Arc::new(ShutdownCtx {
            name: name.clone(),
            step_targets,
            schedule,
            start,
            escalate: true,
        }));
        sh.progress.send_replace(Progress::default());
        sh.bump();
        tracing::info!(node = %sh.node, maintenance = %name, kind = ?req.kind, resumed = req.resumed, "shutdown drain started");

        let mut progress = sh.progress.subscribe();
        let mut events = sh.wake.subscribe();
        loop {
            if progress.borrow_and_update().shutdown_done {
                break;
            }
            events.borrow_and_update();
            let deadline = sh.unreachable_deadline();
            // A watch that reconnected quietly says nothing: while failing, ask directly.
            let probe_at = deadline.map(|_| Instant::now() + PROBE_INTERVAL);
            tokio::select! {
                _ = sleep_until_opt(probe_at) => sh.probe().await,
                r = progress.changed() => if r.is_err() {
                    return Err(anyhow::anyhow!("the engine stopped").into());
                },
                // A watch event may have changed the apiserver's reachability.
                _ = events.changed() => {},
                _ = sleep_until_opt(deadline) => {
                    if sh.unreachable_for() >= sh.settings.fallback.apiserver_timeout {
                        return Err(sh.unusable_error());
                    }
                }
            }
        }
        lock(&sh.timings).node_empty = Some(t0.elapsed());
        sh.wait_volumes_detached().await;
        lock(&sh.timings).volumes_detached = Some(t0.elapsed());
        tracing::info!(node = %sh.node, maintenance = %name, took = ?t0.elapsed(), "node drained for shutdown");
        Ok(())
    }

    /// Continues the drain through the maintenance after the apiserver came back (the
    /// fallback ran meanwhile): the same as `shutdown_drain`, adopting the maintenance.
    pub async fn resume(&self, req: &ShutdownRequest) -> Result<(), EngineError> {
        let mut req = req.clone();
        req.resumed = true;
        self.shutdown_drain(&req).await
    }

    /// Records what the offline fallback did; written to the shutdown maintenance (an
    /// annotation and an Event) once the apiserver answers again.
    pub fn record_fallback(&self, report: &crate::fallback::FallbackReport) {
        *lock(&self.shared.fallback) = Some(FallbackSummary::from(report));
        self.shared.bump();
    }

    /// The shutdown was cancelled: stop escalating, clear the shutdown marks, and complete
    /// or keep the maintenance as `policy` says.
    pub async fn cancel_shutdown(&self, policy: CompletionPolicy) -> Result<()> {
        let sh = &self.shared;
        *lock(&sh.shutdown) = None;
        sh.bump();
        sh.clear_shutdown_marks().await?;
        if policy == CompletionPolicy::Complete {
            sh.set_stage(&shutdown_maintenance_name(&sh.node), Stage::Complete)
                .await?;
        }
        Ok(())
    }

    /// After a boot: a shutdown maintenance left by an earlier boot is completed or kept as
    /// `policy` says; the shutdown marks on the Node are cleared. `offline` is what the
    /// local fallback recorded in an earlier boot's shutdown: it is written to that
    /// shutdown's maintenance, which is created (Complete or Drain, as `policy` says) when
    /// the apiserver never saw the shutdown at all.
    pub async fn after_boot(
        &self,
        boot_id: &str,
        policy: CompletionPolicy,
        offline: Option<&OfflineDrain>,
    ) -> Result<AfterBoot> {
        let sh = &self.shared;
        sh.wait_ready(|r| r.node && r.maintenances)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let offline = offline.filter(|o| o.boot_id != boot_id);
        let name = shutdown_maintenance_name(&sh.node);
        let api: Api<NodeMaintenance> = Api::all(sh.client.clone());
        let found = api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading NodeMaintenance {name}"))?;
        let m = match (found, offline) {
            (Some(m), _) => m,
            (None, None) => return Ok(AfterBoot::NoMaintenance),
            (None, Some(record)) => match sh.create_offline_record(record, policy).await? {
                Some(outcome) => return Ok(outcome),
                // Someone created it meanwhile: go on with theirs.
                None => api
                    .get(&name)
                    .await
                    .with_context(|| format!("reading NodeMaintenance {name}"))?,
            },
        };
        let m_boot = m.annotations().get(BOOT_ID_ANNOTATION).map(String::as_str);
        if m_boot == Some(boot_id) {
            return Ok(AfterBoot::SameBoot);
        }
        if let Some(record) = offline.filter(|o| m_boot == Some(o.boot_id.as_str())) {
            if !m.annotations().contains_key(FALLBACK_ANNOTATION) {
                sh.annotate_offline_record(&m, record).await?;
            }
        }
        sh.clear_shutdown_marks().await?;
        if m.spec.stage == Stage::Complete || is_deleting(&m) {
            return Ok(AfterBoot::AlreadyComplete);
        }
        match policy {
            CompletionPolicy::Complete => {
                sh.set_stage(&name, Stage::Complete).await?;
                Ok(AfterBoot::Completed)
            }
            CompletionPolicy::Keep => {
                tracing::info!(node = %sh.node, maintenance = %name, "keeping the shutdown maintenance of an earlier boot; `nodegrace complete` ends it");
                Ok(AfterBoot::Kept)
            }
        }
    }

    /// `nodegrace complete`: moves `shutdown-<node>` to stage Complete. False when there is
    /// none.
    pub async fn complete_shutdown_maintenance(&self) -> Result<bool> {
        let sh = &self.shared;
        *lock(&sh.shutdown) = None;
        let done = complete_shutdown_maintenance(&sh.client, &sh.node).await?;
        sh.bump();
        Ok(done)
    }

    /// Whether the apiserver answers (the last request or watch event succeeded).
    pub fn reachable(&self) -> bool {
        self.shared.unreachable_for() == Duration::ZERO
    }

    /// Waits until the apiserver answers again and the watches have listed (after
    /// [`EngineError::ApiserverUnreachable`], before [`Engine::resume`]).
    pub async fn wait_reachable(&self) {
        let sh = &self.shared;
        let mut rx = sh.wake.subscribe();
        loop {
            rx.borrow_and_update();
            let ready = {
                let r = lock(&sh.ready);
                r.node && r.pods && r.maintenances
            };
            if ready && sh.unreachable_for() == Duration::ZERO {
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(PROBE_INTERVAL) => sh.probe().await,
            }
        }
    }
}

/// `nodegrace complete` without a running engine: moves `shutdown-<node>` to stage
/// Complete; the daemon's engine then carries the stage out. False when there is none.
pub async fn complete_shutdown_maintenance(client: &Client, node: &str) -> Result<bool> {
    let name = shutdown_maintenance_name(node);
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let Some(m) = api
        .get_opt(&name)
        .await
        .with_context(|| format!("reading NodeMaintenance {name}"))?
    else {
        return Ok(false);
    };
    if m.spec.stage != Stage::Complete {
        api.patch(
            &name,
            &merge_params(),
            &Patch::Merge(json!({"spec": {"stage": "Complete"}})),
        )
        .await
        .with_context(|| format!("moving NodeMaintenance {name} to stage Complete"))?;
    }
    Ok(true)
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn spawn_reflector<K>(
    shared: Arc<Shared>,
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    flag: fn(&mut Ready) -> &mut bool,
    optional: bool,
    on_object: fn(&Shared, &K),
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    tokio::spawn(async move {
        let kind = K::kind(&()).to_string();
        let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(watcher::Event::InitDone) => {
                    *flag(&mut lock(&shared.ready)) = true;
                    shared.mark_reachable();
                }
                Ok(
                    watcher::Event::Apply(obj)
                    | watcher::Event::InitApply(obj)
                    | watcher::Event::Delete(obj),
                ) => {
                    shared.mark_reachable();
                    on_object(&shared, &obj);
                }
                Ok(watcher::Event::Init) => shared.mark_reachable(),
                Err(err) => {
                    let inner = match &err {
                        watcher::Error::InitialListFailed(e)
                        | watcher::Error::WatchStartFailed(e)
                        | watcher::Error::WatchFailed(e) => Some(e),
                        _ => None,
                    };
                    let code = inner.and_then(api_error_code);
                    if optional && matches!(code, Some(403 | 404)) {
                        // Not allowed or not served: nothing to wait for.
                        *flag(&mut lock(&shared.ready)) = true;
                        shared.mark_reachable();
                    } else if code == Some(404) {
                        shared.mark_unreachable(&format_args!(
                            "the apiserver does not serve {kind} (is its CRD installed? see /usr/share/nodegrace/crds): {err}"
                        ));
                    } else if inner.is_some_and(is_unusable) {
                        shared.mark_unreachable(&format_args!("watching {kind}: {err}"));
                    } else {
                        shared.mark_reachable();
                    }
                    tracing::debug!(kind = %kind, error = %err, "watch error; retrying with back-off");
                }
            }
            shared.bump();
        }
    })
}

async fn run_loop(shared: Arc<Shared>) {
    let mut rx = shared.wake.subscribe();
    let mut st = DrainState::default();
    loop {
        rx.borrow_and_update();
        let ready = {
            let r = lock(&shared.ready);
            r.node && r.pods && r.maintenances
        };
        let next = if ready {
            let pass = Instant::now();
            let result = shared.reconcile(&mut st).await;
            tracing::trace!(node = %shared.node, took = ?pass.elapsed(), "reconcile pass");
            match result {
                Ok(next) => next,
                Err(err) => {
                    if anyhow_is_unusable(&err) {
                        // Logged once by the reachability tracking, not at every retry.
                        shared.mark_unreachable(&format_args!("{err:#}"));
                        tracing::debug!(node = %shared.node, error = format!("{err:#}"), "reconcile failed; retrying");
                    } else {
                        tracing::warn!(node = %shared.node, error = format!("{err:#}"), "reconcile failed; retrying");
                    }
                    Some(Instant::now() + RETRY_AFTER_ERROR)
                }
            }
        } else {
            None
        };
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = sleep_until_opt(next) => {}
        }
    }
}

impl Shared {
    fn pod_changed(&self, pod: &Pod) {
        if let Some(handle) = lock(&self.eviction_requests).as_ref() {
            handle.pod_changed(
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.uid.as_deref().unwrap_or_default(),
            );
        }
    }

    fn bump(&self) {
        self.wake.send_modify(|g| *g = g.wrapping_add(1));
    }

    fn mark_reachable(&self) {
        if let Some(was) = lock(&self.failing).take() {
            tracing::info!(node = %self.node, apiserver = %self.endpoint, after = ?was.since.elapsed(), "the apiserver answers again");
        }
    }

    /// Every request failed this way since the last good answer (see [`is_unusable`]).
    fn mark_unreachable(&self, error: &dyn std::fmt::Display) {
        let now = Instant::now();
        let error = error.to_string();
        let mut failing = lock(&self.failing);
        match failing.as_mut() {
            None => {
                tracing::warn!(node = %self.node, apiserver = %self.endpoint, error = %error, "the apiserver cannot be used; retrying");
                *failing = Some(Failing {
                    since: now,
                    last_error: error,
                    reminded: now,
                });
            }
            Some(f) => {
                if now.duration_since(f.reminded) >= UNUSABLE_REMINDER {
                    tracing::warn!(node = %self.node, apiserver = %self.endpoint, error = %error, unusable_for = ?f.since.elapsed(), "the apiserver still cannot be used");
                    f.reminded = now;
                }
                f.last_error = error;
            }
        }
    }

    fn unreachable_for(&self) -> Duration {
        lock(&self.failing)
            .as_ref()
            .map_or(Duration::ZERO, |f| f.since.elapsed())
    }

    fn unreachable_deadline(&self) -> Option<Instant> {
        lock(&self.failing)
            .as_ref()
            .map(|f| f.since + self.settings.fallback.apiserver_timeout)
    }

    fn unusable_error(&self) -> EngineError {
        let last = lock(&self.failing)
            .as_ref()
            .map_or_else(|| "no answer yet".to_string(), |f| f.last_error.clone());
        EngineError::ApiserverUnreachable(self.settings.fallback.apiserver_timeout, last)
    }

    /// One cheap request to learn whether the apiserver answers.
    async fn probe(&self) {
        let api: Api<Node> = Api::all(self.client.clone());
        let r = api
            .get_metadata_opt(&self.node)
            .await
            .map_err(anyhow::Error::from);
        self.note(&r);
        if r.is_ok() {
            self.bump();
        }
    }

    fn note<T>(&self, r: &Result<T>) {
        match r {
            Ok(_) => self.mark_reachable(),
            Err(e) if anyhow_is_unusable(e) => self.mark_unreachable(&format_args!("{e:#}")),
            Err(_) => self.mark_reachable(),
        }
    }

    /// Waits until the watches named by `which` have listed, or the apiserver has not been
    /// usable for `fallback.apiserver_timeout` (counted from the last good answer, so a
    /// node whose apiserver went away long ago does not wait the whole timeout again).
    async fn wait_ready(&self, which: fn(&Ready) -> bool) -> Result<(), EngineError> {
        let mut rx = self.wake.subscribe();
        let started = Instant::now();
        let timeout = self.settings.fallback.apiserver_timeout;
        loop {
            rx.borrow_and_update();
            if which(&lock(&self.ready)) {
                return Ok(());
            }
            let deadline = self
                .unreachable_deadline()
                .map_or(started + timeout, |d| d.min(started + timeout));
            if Instant::now() >= deadline {
                return Err(self.unusable_error());
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() {
                    return Err(anyhow::anyhow!("the engine stopped").into());
                },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    fn pod_infos(&self) -> Vec<PodInfo> {
        self.pods
            .state()
            .iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.as_str())
            })
            .filter_map(|p| match PodInfo::from_pod(p) {
                Ok(info) => Some(info),
                Err(err) => {
                    tracing::warn!(node = %self.node, error = %err, "ignoring a pod that cannot be classified");
                    None
                }
            })
            .collect()
    }

    fn node_obj(&self, st: &mut DrainState) -> Option<Arc<Node>> {
        let stored = self
            .nodes
            .state()
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(self.node.as_str()))?;
        let n = fresher(stored, st.node_overlay.as_ref());
        st.node_overlay = Some(n.clone());
        Some(n)
    }

    fn maintenance_objs(&self, st: &mut DrainState) -> Vec<Arc<NodeMaintenance>> {
        let stored = self.maintenances.state();
        let names: HashSet<String> = stored.iter().map(|m| m.name_any()).collect();
        st.nm_overlay.retain(|n, _| names.contains(n));
        let mut out: Vec<Arc<NodeMaintenance>> = stored
            .into_iter()
            .map(|m| {
                let name = m.name_any();
                let m = fresher(m, st.nm_overlay.get(&name));
                st.nm_overlay.insert(name, m.clone());
                m
            })
            .collect();
        out.sort_by(|a, b| {
            let ca = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let cb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
            ca.cmp(&cb).then_with(|| a.name_any().cmp(&b.name_any()))
        });
        out
    }

    fn event(
        &self,
        reference: k8s_openapi::api::core::v1::ObjectReference,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let recorder = self.recorder.clone();
        let metrics = self.metrics.clone();
        let ev = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(err) = recorder.publish(&ev, &reference).await {
                metrics.api_error("event");
                tracing::debug!(error = %err, "publishing an event failed");
            }
        });
    }

    fn event_both(
        &self,
        node: &Node,
        m: Option<&NodeMaintenance>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        if let Some(m) = m {
            self.event(m.object_ref(&()), warning, reason, note.clone());
        }
        self.event(node.object_ref(&()), warning, reason, note);
    }

    async fn patch_node(
        &self,
        st: &mut DrainState,
        what: &str,
        compute: impl Fn(&Node) -> Option<Value>,
    ) -> Result<bool> {
        let api: Api<Node> = Api::all(self.client.clone());
        let r = patch_node_with(&api, &self.node, what, compute).await;
        self.note(&r);
        if r.is_err() {
            self.metrics.api_error("node");
        }
        st.node_overlay = None;
        r
    }

    async fn set_stage(&self, name: &str, stage: Stage) -> Result<()> {
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let r = api
            .patch(
                name,
                &merge_params(),
                &Patch::Merge(json!({"spec": {"stage": stage.as_str()}})),
            )
            .await
            .with_context(|| format!("moving NodeMaintenance {name} to stage {stage}"));
        let r = r.map(|_| ());
        self.note(&r);
        self.bump();
        r
    }

    /// Cordon, the load-balancer exclusion label and the maintenance taint in one patch of
    /// the Node. The taint goes on now rather than before the DaemonSet band: in a shutdown
    /// nothing new should start on the node, and the band then starts without a round trip.
    async fn cordon_for_shutdown(&self) -> Result<(), EngineError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let started = Instant::now();
        loop {
            let r = patch_node_with(&api, &self.node, "cordon for shutdown", |n| {
                let marks = merge_values(cordon_patch(n), lb_exclusion_patch(n, true));
                merge_values(marks, maintenance_taint_patch(n, true))
            })
            .await;
            self.note(&r);
            match r {
                Ok(_) => return Ok(()),
                Err(e) if anyhow_is_unusable(&e) => self.retry_or_unreachable(started).await?,
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn set_condition_for_shutdown(&self, req: &ShutdownRequest) -> Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        let message = format!("nodegrace drains the node for {:?}", req.kind).to_lowercase();
        let r = set_shutdown_condition(&api, &self.node, true, &message).await;
        self.note(&r);
        r
    }

    /// After an unusable answer (already noted): waits a moment to try again, or gives up
    /// once the apiserver has not been usable for `fallback.apiserver_timeout`.
    async fn retry_or_unreachable(&self, started: Instant) -> Result<(), EngineError> {
        let timeout = self.settings.fallback.apiserver_timeout;
        if started.elapsed() >= timeout || self.unreachable_for() >= timeout {
            return Err(self.unusable_error());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(())
    }

    async fn clear_shutdown_marks(&self) -> Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        let has_condition = api
            .get(&self.node)
            .await
            .with_context(|| format!("reading node {}", self.node))?
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == SHUTDOWN_CONDITION && c.status == "True");
        if has_condition {
            set_shutdown_condition(&api, &self.node, false, "shutdown cancelled or finished")
                .await?;
        }
        patch_node_with(
            &api,
            &self.node,
            "remove the load-balancer exclusion",
            |n| lb_exclusion_patch(n, false),
        )
        .await?;
        self.bump();
        Ok(())
    }

    /// `shutdown-<node>` as nodegrace creates it, for the shutdown of boot `boot_id`.
    fn shutdown_maintenance(
        &self,
        stage: Stage,
        drain_plan: Vec<DrainPlanEntry>,
        boot_id: &str,
        kind: ShutdownKind,
        what: &str,
    ) -> NodeMaintenance {
        let kind = kind_str(kind);
        let mut m = NodeMaintenance::new(
            &shutdown_maintenance_name(&self.node),
            NodeMaintenanceSpec {
                node_selector: node_selector_for(&self.node),
                stage,
                drain_plan,
                reason: Some(format!("Node {kind}: {what} (boot id {boot_id})")),
            },
        );
        m.metadata.annotations = Some(BTreeMap::from([
            (BOOT_ID_ANNOTATION.to_string(), boot_id.to_string()),
            (SHUTDOWN_KIND_ANNOTATION.to_string(), kind.to_string()),
        ]));
        m.metadata.finalizers = Some(vec![FINALIZER_MAINTENANCE_COMPLETION.into()]);
        m
    }

    /// Creates `shutdown-<node>` for a shutdown the apiserver never saw, recording what the
    /// local fallback did: at stage Complete (the engine then carries the completion out:
    /// static pods restored, node entry written) or, to keep it, at Drain. None when it
    /// exists already.
    async fn create_offline_record(
        &self,
        record: &OfflineDrain,
        policy: CompletionPolicy,
    ) -> Result<Option<AfterBoot>> {
        let name = shutdown_maintenance_name(&self.node);
        let summary = FallbackSummary::of_runs(&record.reports);
        let stage = match policy {
            CompletionPolicy::Complete => Stage::Complete,
            CompletionPolicy::Keep => Stage::Drain,
        };
        let text = serde_json::to_string(&summary).context("encoding the fallback summary")?;
        let mut desired = self.shutdown_maintenance(
            stage,
            shutdown_plan(&self.settings)?,
            &record.boot_id,
            record.kind,
            "drained offline by nodegrace's local fallback, the apiserver being unreachable",
        );
        desired
            .annotations_mut()
            .insert(FALLBACK_ANNOTATION.to_string(), text);
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let created = match api.create(&params, &desired).await {
            Ok(m) => m,
            Err(e) if api_error_code(&e) == Some(409) => return Ok(None),
            Err(e) if api_error_code(&e) == Some(404) => {
                tracing::error!(node = %self.node, maintenance = %name, "the offline drain of the last shutdown cannot be recorded: the NodeMaintenance CRD is not installed (see /usr/share/nodegrace/crds)");
                return Ok(Some(AfterBoot::Unrecorded));
            }
            Err(e) => {
                return Err(anyhow::Error::from(e).context(format!(
                    "creating NodeMaintenance {name} for the offline drain"
                )))
            }
        };
        self.mark_reachable();
        self.bump();
        tracing::info!(node = %self.node, maintenance = %name, ?stage, stopped = summary.pods_stopped, not_stopped = summary.pods_not_stopped, "recorded the offline drain of the last shutdown");
        self.event_offline_record(&created, &summary);
        Ok(Some(match policy {
            CompletionPolicy::Complete => AfterBoot::Completed,
            CompletionPolicy::Keep => AfterBoot::Kept,
        }))
    }

    /// Writes the fallback summary onto the shutdown maintenance of the earlier boot (it
    /// went unreachable mid-drain and never came back before the poweroff).
    async fn annotate_offline_record(
        &self,
        m: &NodeMaintenance,
        record: &OfflineDrain,
    ) -> Result<()> {
        let name = m.name_any();
        let summary = FallbackSummary::of_runs(&record.reports);
        let text = serde_json::to_string(&summary).context("encoding the fallback summary")?;
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"annotations": {FALLBACK_ANNOTATION: text}}});
        let updated = api
            .patch(&name, &merge_params(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("recording the offline drain on NodeMaintenance {name}"))?;
        self.event_offline_record(&updated, &summary);
        Ok(())
    }

    fn event_offline_record(&self, m: &NodeMaintenance, summary: &FallbackSummary) {
        let note = format!("{} (shutdown of an earlier boot)", summary.describe());
        match self
            .nodes
            .state()
            .into_iter()
            .find(|n| n.name_any() == self.node)
        {
            Some(node) => self.event_both(&node, Some(m), true, "FallbackUsed", note),
            None => self.event(m.object_ref(&()), true, "FallbackUsed", note),
        }
    }

    async fn ensure_shutdown_maintenance(
        &self,
        req: &ShutdownRequest,
        plan: &[DrainPlanEntry],
    ) -> Result<NodeMaintenance, EngineError> {
        let name = shutdown_maintenance_name(&self.node);
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let kind = kind_str(req.kind);
        let desired = self.shutdown_maintenance(
            Stage::Drain,
            plan.to_vec(),
            &req.boot_id,
            req.kind,
            "graceful shutdown by nodegrace",
        );
        let started = Instant::now();
        let mut known = self
            .maintenances
            .state()
            .into_iter()
            .find(|m| m.name_any() == name)
            .map(|m| (*m).clone());
        loop {
            let existing = match known.take() {
                Some(m) => m,
                None => {
                    let params = PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    match api.create(&params, &desired).await {
                        Ok(m) => {
                            self.mark_reachable();
                            tracing::info!(node = %self.node, maintenance = %name, "created the shutdown maintenance");
                            return Ok(m);
                        }
                        Err(e) if api_error_code(&e) == Some(409) => {
                            self.mark_reachable();
                            match api.get_opt(&name).await {
                                Ok(Some(m)) => m,
                                Ok(None) => continue,
                                Err(e) if is_unusable(&e) => {
                                    self.mark_unreachable(&format_args!(
                                        "reading NodeMaintenance {name}: {e}"
                                    ));
                                    self.retry_or_unreachable(started).await?;
                                    continue;
                                }
                                Err(e) => {
                                    return Err(anyhow::Error::from(e)
                                        .context(format!("reading NodeMaintenance {name}"))
                                        .into())
                                }
                            }
                        }
                        Err(e) if is_unusable(&e) => {
                            self.mark_unreachable(&format_args!(
                                "creating NodeMaintenance {name}: {e}"
                            ));
                            self.retry_or_unreachable(started).await?;
                            continue;
                        }
                        Err(e) => {
                            return Err(anyhow::Error::from(e)
                                .context(format!("creating NodeMaintenance {name}"))
                                .into())
                        }
                    }
                }
            };
            if is_deleting(&existing) || existing.spec.stage == Stage::Complete {
                // A finished maintenance cannot go back to Drain: replace it.
                if !is_deleting(&existing)
                    && !self.delete_completed(&api, &existing, started).await?
                {
                    continue;
                }
                self.wait_maintenance_gone(&name).await?;
                continue;
            }
            let same = existing.annotations().get(BOOT_ID_ANNOTATION) == Some(&req.boot_id)
                && existing
                    .annotations()
                    .get(SHUTDOWN_KIND_ANNOTATION)
                    .map(String::as_str)
                    == Some(kind)
                && existing.spec.stage == Stage::Drain;
            if same {
                tracing::info!(node = %self.node, maintenance = %name, "adopted the shutdown maintenance");
                return Ok(existing);
            }
            let mut patch = json!({"metadata": {"annotations": {
                BOOT_ID_ANNOTATION: req.boot_id,
                SHUTDOWN_KIND_ANNOTATION: kind,
            }}});
            if existing.spec.stage != Stage::Drain {
                patch["spec"] = json!({"stage": "Drain"});
            }
            match api
                .patch(&name, &merge_params(), &Patch::Merge(&patch))
                .await
            {
                Ok(m) => {
                    tracing::info!(node = %self.node, maintenance = %name, "adopted the shutdown maintenance");
                    return Ok(m);
                }
                Err(e) if is_unusable(&e) => {
                    self.mark_unreachable(&format_args!("adopting NodeMaintenance {name}: {e}"));
                    self.retry_or_unreachable(started).await?;
                }
                Err(e) if api_error_code(&e) == Some(404) => continue,
                Err(e) => {
                    return Err(anyhow::Error::from(e)
                        .context(format!("adopting NodeMaintenance {name}"))
                        .into())
                }
            }
        }
    }

    /// Deletes the completed maintenance `existing`, that object exactly (uid and
    /// resourceVersion preconditions), so that it can be created anew. False when it changed
    /// or the apiserver did not answer: read it again.
    async fn delete_completed(
        &self,
        api: &Api<NodeMaintenance>,
        existing: &NodeMaintenance,
        started: Instant,
    ) -> Result<bool, EngineError> {
        let name = existing.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: existing.uid(),
                resource_version: existing.resource_version(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {
                self.mark_reachable();
                Ok(true)
            }
            Err(e) if api_error_code(&e) == Some(404) => Ok(true),
            Err(e) if api_error_code(&e) == Some(409) => Ok(false),
            Err(e) if is_unusable(&e) => {
                self.mark_unreachable(&format_args!(
                    "replacing the completed NodeMaintenance {name} (delete): {e}"
                ));
                self.retry_or_unreachable(started).await?;
                Ok(false)
            }
            Err(e) => Err(anyhow::Error::from(e)
                .context(format!(
                    "replacing the completed NodeMaintenance {name} (delete)"
                ))
                .into()),
        }
    }

    async fn wait_maintenance_gone(&self, name: &str) -> Result<(), EngineError> {
        let mut rx = self.wake.subscribe();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            rx.borrow_and_update();
            if !self
                .maintenances
                .state()
                .iter()
                .any(|m| m.name_any() == name)
            {
                return Ok(());
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return Err(anyhow::anyhow!("the engine stopped").into()) },
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(anyhow::anyhow!("NodeMaintenance {name} is still being deleted").into());
                }
            }
        }
    }

    async fn wait_volumes_detached(&self) {
        let timeout = self.settings.drain.volume_detach_timeout;
        let deadline = Instant::now() + timeout;
        let mut rx = self.wake.subscribe();
        loop {
            rx.borrow_and_update();
            let ready = lock(&self.ready).volumes;
            let left: Vec<String> = self
                .volumes
                .state()
                .iter()
                .filter(|va| va.spec.node_name == self.node)
                .map(|va| va.name_any())
                .collect();
            if ready && left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(node = %self.node, attachments = ?left, "VolumeAttachments still present after {timeout:?}; releasing anyway");
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    fn maybe_write_cache(&self, st: &mut DrainState, pods: &[PodInfo], wake: &mut Option<Instant>) {
        if st.cache_written.as_deref() == Some(pods) {
            st.cache_due = None;
            return;
        }
        let now = Instant::now();
        let due = *st.cache_due.get_or_insert(now + POD_CACHE_DEBOUNCE);
        if now < due {
            min_wake(wake, due);
            return;
        }
        st.cache_due = None;
        st.cache_written = Some(pods.to_vec());
        let cache = PodCache {
            node: self.node.clone(),
            written_at: Some(chrono::Utc::now()),
            pods: pods.to_vec(),
        };
        let dir = self.settings.state_dir.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(err) = cache.store(&dir) {
                tracing::warn!(error = format!("{err:#}"), "writing the pod cache failed");
            }
        });
    }

    /// One pass over the reflected state. Returns when the loop must run again without a
    /// watch event (a back-off or deadline).
    async fn reconcile(&self, st: &mut DrainState) -> Result<Option<Instant>> {
        let mut wake = None;
        let Some(node) = self.node_obj(st) else {
            return Ok(None);
        };
        let raw_pods: Vec<Arc<Pod>> = self
            .pods
            .state()
            .into_iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.as_str())
            })
            .collect();
        let pods = self.pod_infos();
        self.maybe_write_cache(st, &pods, &mut wake);

        let selecting: Vec<Arc<NodeMaintenance>> = self
            .maintenance_objs(st)
            .into_iter()
            .filter(|m| nodesel::selects(&m.spec.node_selector, &node))
            .collect();
        let active: Vec<Arc<NodeMaintenance>> =
            selecting.iter().filter(|m| is_active(m)).cloned().collect();

        let replacements = daemonset_replacements(&raw_pods, &active, &st.daemonset_terminated);
        if !replacements.is_empty() {
            let fresh: Vec<String> = raw_pods
                .iter()
                .filter(|p| replacements.contains(p.uid().as_deref().unwrap_or_default()))
                .filter(|p| {
                    st.announced
                        .insert(format!("replacement/{}", p.uid().unwrap_or_default()))
                })
                .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
                .collect();
            if !fresh.is_empty() {
                tracing::info!(node = %self.node, pods = ?fresh, "DaemonSet pods that tolerate every taint came back after their termination: left running, not waited for");
            }
        }
        let raw_pods: Vec<Arc<Pod>> = raw_pods
            .into_iter()
            .filter(|p| !replacements.contains(p.uid().as_deref().unwrap_or_default()))
            .collect();
        let pods: Vec<PodInfo> = pods
            .into_iter()
            .filter(|p| !replacements.contains(&p.uid))
            .collect();

        // Cordon and finalizer first: a maintenance that selects the node holds it.
        if !active.is_empty() && cordon_patch(&node).is_some() {
            self.patch_node(st, "cordon", cordon_patch).await?;
            let names: Vec<String> = active.iter().map(|m| m.name_any()).collect();
            self.event_both(
                &node,
                active.first().map(|m| m.as_ref()),
                false,
                "Cordoned",
                format!("node {} cordoned for {}", self.node, names.join(", ")),
            );
        }
        for m in &active {
            if !has_finalizer(m) {
                self.update_finalizer(st, m, true).await?;
            }
        }

        let views = self.drain_views(st, &active, &pods)?;
        let ctx_any = lock(&self.shutdown).clone();
        let ctx = ctx_any
            .clone()
            .filter(|c| views.iter().any(|v| v.name == c.name));
        // The shutdown maintenance was completed or deleted under the drain: nothing is
        // left to wait for.
        let shutdown_ended = ctx_any.as_ref().is_some_and(|c| {
            selecting.iter().any(|m| {
                m.name_any() == c.name && (m.spec.stage == Stage::Complete || is_deleting(m))
            })
        });

        self.terminate_targeted(
            st,
            &node,
            &raw_pods,
            &pods,
            &views,
            ctx.as_deref(),
            &mut wake,
        )
        .await?;

        let node_empty = ctx.as_ref().is_some_and(|c| c.node_empty(&pods));
        let mut all_written = true;
        for m in &active {
            let view = views.iter().find(|v| v.name == m.name_any());
            let force = node_empty && ctx.as_ref().is_some_and(|c| c.name == m.name_any());
            let written = self
                .write_status(st, &node, m, view, &pods, force, &mut wake)
                .await?;
            if force && !written {
                all_written = false;
            }
        }

        let completing: Vec<Arc<NodeMaintenance>> = selecting
            .iter()
            .filter(|m| {
                (m.spec.stage == Stage::Complete || is_deleting(m))
                    && (has_finalizer(m)
                        || m.node_status(&self.node)
                            .is_some_and(|e| e.drain_message != COMPLETED_MESSAGE))
            })
            .cloned()
            .collect();
        for m in &completing {
            self.complete(st, &node, m, &active).await?;
        }
        if views.is_empty() {
            st.targets = DrainTargets::none();
            st.targets_since = None;
            st.tracks.clear();
            st.daemonset_terminated.clear();
        }

        self.publish_fallback(st, &selecting).await;

        if ((node_empty && all_written) || shutdown_ended) && !self.progress.borrow().shutdown_done
        {
            self.progress.send_replace(Progress {
                shutdown_done: true,
            });
        }
        Ok(wake)
    }

    /// Each draining maintenance's position in its plan, and the node's effective targets.
    fn drain_views(
        &self,
        st: &mut DrainState,
        active: &[Arc<NodeMaintenance>],
        pods: &[PodInfo],
    ) -> Result<Vec<MaintView>> {
        let draining: Vec<&Arc<NodeMaintenance>> =
            active.iter().filter(|m| is_draining(m)).collect();
        let mut previous: Option<DrainTargets> =
            (!st.targets.is_empty()).then(|| st.targets.clone());
        for m in &draining {
            if let Some(t) = m
                .node_status(&self.node)
                .and_then(|e| DrainTargets::from_entries(&e.drain_targets).ok())
            {
                previous = Some(match previous {
                    Some(p) => p.join(&t),
                    None => t,
                });
            }
        }
        let prev = previous.clone().unwrap_or_default();
        let mut plans = Vec::new();
        for m in draining {
            let name = m.name_any();
            match normalize_drain_plan(&m.spec.drain_plan) {
                Ok(p) => plans.push((m.clone(), name, p)),
                Err(err) => {
                    if st.announced.insert(format!("badplan/{name}")) {
                        tracing::warn!(node = %self.node, maintenance = %name, error = %err, "ignoring a maintenance with an invalid drain plan");
                    }
                }
            }
        }
        let mut inputs = Vec::new();
        for (m, name, plan) in &plans {
            let steps = (0..plan.len())
                .map(|i| DrainTargets::for_plan(plan, i))
                .collect::<Result<Vec<_>, _>>()?;
            let entry_report = |e: &NodeMaintenanceNodeStatus| {
                let t = DrainTargets::from_entries(&e.drain_targets).unwrap_or_default();
                let index = steps.iter().rposition(|s| t.covers(s)).unwrap_or(0);
                NodeReport {
                    index,
                    finished: e.pods_remaining == 0 && t.covers(&steps[index]),
                }
            };
            let mine = m.node_status(&self.node).map(entry_report).or_else(|| {
                Some(NodeReport {
                    index: steps.iter().rposition(|s| prev.covers(s)).unwrap_or(0),
                    finished: false,
                })
            });
            let entries = m
                .status
                .as_ref()
                .map(|s| s.node_statuses.as_slice())
                .unwrap_or_default();
            let (reports, own) = match nodesel::exact_nodes(&m.spec.node_selector) {
                Some(names) if names.contains(&self.node) => {
                    let own = names.iter().position(|n| *n == self.node).unwrap_or(0);
                    let reports = names
                        .iter()
                        .map(|n| {
                            if *n == self.node {
                                mine
                            } else {
                                entries.iter().find(|e| e.node_name == *n).map(entry_report)
                            }
                        })
                        .collect();
                    (reports, own)
                }
                _ => (
                    std::iter::once(mine)
                        .chain(
                            entries
                                .iter()
                                .filter(|e| e.node_name != self.node)
                                .map(|e| Some(entry_report(e))),
                        )
                        .collect(),
                    0,
                ),
            };
            inputs.push(MaintenanceInput {
                name: name.as_str(),
                plan: plan.as_slice(),
                reports,
                own,
            });
        }
        let eval = evaluate_node(previous.as_ref(), &inputs, pods)?;
        let views: Vec<MaintView> = plans
            .iter()
            .enumerate()
            .map(|(i, (m, name, plan))| MaintView {
                m: m.clone(),
                name: name.clone(),
                plan_len: plan.len(),
                index: eval.positions[i].index,
                drained: eval.positions[i].drained,
                targets: eval.maintenance_targets[i].clone(),
            })
            .collect();
        let nt = eval.node;
        if !views.is_empty() && (st.targets_since.is_none() || nt.targets != st.targets) {
            if let Some(since) = st.targets_since {
                self.metrics
                    .band_finished(&describe_targets(&st.targets), since.elapsed());
            }
            st.targets_since = Some(Instant::now());
            tracing::info!(node = %self.node, targets = %describe_targets(&nt.targets), holders = ?nt.holders, "drain targets");
            st.targets = nt.targets;
        }
        Ok(views)
    }

    #[allow(clippy::too_many_arguments)]
    async fn terminate_targeted(
        &self,
        st: &mut DrainState,
        node: &Node,
        raw_pods: &[Arc<Pod>],
        pods: &[PodInfo],
        views: &[MaintView],
        ctx: Option<&ShutdownCtx>,
        wake: &mut Option<Instant>,
    ) -> Result<()> {
        let now = Instant::now();
        let present: HashSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
        st.tracks.retain(|uid, _| present.contains(uid.as_str()));
        if views.is_empty() {
            return Ok(());
        }
        let cap = if ctx.is_some() {
            self.settings.drain.eviction_backoff_max_shutdown
        } else {
            self.settings.drain.eviction_backoff_max
        };
        if st.backoff_cap != Some(cap) {
            if let Some(handle) = lock(&self.eviction_requests).as_ref() {
                handle.set_backoff_max(cap);
                st.backoff_cap = Some(cap);
            }
        }
        let raw: HashMap<&str, &Arc<Pod>> = raw_pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, p)))
            .collect();
        let first_holder = |pod: &PodInfo| {
            views
                .iter()
                .find(|v| v.targets.targets(pod))
                .map(|v| v.name.clone())
                .unwrap_or_else(|| views[0].name.clone())
        };
        let mut jobs = Vec::new();
        let mut statics = Vec::new();
        let mut daemonsets = Vec::new();
        // In plan order (type, then ascending priority), so requests go out in that order.
        let mut targeted: Vec<&PodInfo> = pods
            .iter()
            .filter(|p| p.is_active() && st.targets.targets(p))
            .collect();
        targeted.sort_by_key(|p| (p.pod_type, p.priority));
        for pod in targeted {
            let track = st.tracks.entry(pod.uid.clone()).or_default();
            if let (Some(c), true) = (ctx, pod.pod_type != PodType::Static) {
                if let Some(step) = c
                    .step_of(pod)
                    .and_then(|i| c.schedule.iter().find(|s| s.index == i))
                {
                    let escalate_at = c.start + step.escalate_at;
                    if c.escalate && !track.escalated {
                        if now >= escalate_at {
                            let end = c.start + step.end;
                            let outlasts = |p: &Pod| {
                                let deadline = p
                                    .metadata
                                    .deletion_timestamp
                                    .as_ref()
                                    .map(|t| t.0.as_millisecond());
                                let left =
                                    i64::try_from(end.saturating_duration_since(now).as_millis())
                                        .unwrap_or(i64::MAX);
                                deadline.is_none_or(|d| {
                                    d > chrono::Utc::now().timestamp_millis().saturating_add(left)
                                })
                            };
                            if raw.get(pod.uid.as_str()).is_some_and(|p| outlasts(p)) {
                                let grace =
                                    escalation_grace(pod.grace_period(), now - c.start, step.end);
                                jobs.push(Job::Terminate(
                                    pod.clone(),
                                    Request::Delete {
                                        grace_seconds: i64::try_from(grace.as_secs())
                                            .unwrap_or(i64::MAX),
                                    },
                                    c.name.clone(),
                                    true,
                                ));
                                continue;
                            }
                        } else {
                            min_wake(wake, escalate_at);
                        }
                    }
                }
            }
            if pod.terminating || track.accepted {
                continue;
            }
            if let Some((at, delay)) = track.last_try {
                // The cap in force now: a shutdown starting mid back-off shortens it.
                let t = at + delay.min(cap);
                if t > now {
                    min_wake(wake, t);
                    continue;
                }
            }
            match pod.pod_type {
                PodType::Default => jobs.push(Job::Terminate(
                    pod.clone(),
                    Request::Cooperative,
                    first_holder(pod),
                    false,
                )),
                PodType::DaemonSet => daemonsets.push(pod.clone()),
                PodType::Static => statics.push(pod.clone()),
            }
        }

        if !daemonsets.is_empty() {
            let first = views.first().map(|v| v.m.as_ref());
            if maintenance_taint_patch(node, true).is_some() {
                self.patch_node(st, "taint for DaemonSet pods", |n| {
                    maintenance_taint_patch(n, true)
                })
                .await?;
                self.event_both(
                    node,
                    first,
                    false,
                    "Tainted",
                    "node tainted nodegrace.dev/maintenance:NoSchedule before deleting DaemonSet pods".into(),
                );
            }
            let tolerant: Vec<String> = daemonsets
                .iter()
                .filter(|p| {
                    raw.get(p.uid.as_str())
                        .is_some_and(|r| tolerates_everything(r))
                })
                .filter(|p| st.announced.insert(format!("tolerant/{}", p.uid)))
                .map(PodInfo::key)
                .collect();
            if !tolerant.is_empty() {
                tracing::warn!(node = %self.node, pods = ?tolerant, "DaemonSet pods tolerate every taint: terminated once; the replacements their controller creates are left running");
                self.event_both(
                    node,
                    first,
                    true,
                    "TolerateEverything",
                    format!(
                        "DaemonSet pods tolerating every taint are terminated once; their controller recreates them on the node and the replacements are left running: {}",
                        tolerant.join(", ")
                    ),
                );
            }
            for pod in daemonsets {
                if let Some(owner) = raw
                    .get(pod.uid.as_str())
                    .filter(|r| tolerates_everything(r))
                    .and_then(|r| daemonset_owner(r))
                {
                    st.daemonset_terminated
                        .insert(owner.to_string(), pod.uid.clone());
                }
                let m = first_holder(&pod);
                let grace = pod.termination_grace_period_seconds;
                jobs.push(Job::Terminate(
                    pod,
                    Request::Delete {
                        grace_seconds: grace,
                    },
                    m,
                    false,
                ));
            }
        }

        let terminator = self.terminator.clone();
        let results: Vec<(PodInfo, Request, String, bool, Result<Outcome>)> =
            futures::stream::iter(jobs)
                .map(|Job::Terminate(pod, req, m, esc)| {
                    let terminator = terminator.clone();
                    async move {
                        let r = terminator.terminate(&pod, req, &m).await;
                        (pod, req, m, esc, r)
                    }
                })
                .buffer_unordered(CONCURRENT_REQUESTS)
                .collect()
                .await;
        for (pod, req, m, escalated, result) in results {
            let track = st.tracks.entry(pod.uid.clone()).or_default();
            let mobj = views.iter().find(|v| v.name == m).map(|v| v.m.clone());
            match result {
                Ok(Outcome::Accepted) => {
                    self.mark_reachable();
                    track.accepted = true;
                    track.blocked_by = None;
                    self.metrics.pod_terminated(self.terminator.method(req));
                    if escalated {
                        track.escalated = true;
                        self.metrics.escalated();
                        tracing::warn!(node = %self.node, pod = %pod.key(), ?req, "escalated to DELETE at the shutdown deadline");
                        self.event_both(
                            node,
                            mobj.as_deref(),
                            true,
                            "Escalated",
                            format!(
                                "pod {} still running at its shutdown deadline: deleted ({req:?})",
                                pod.key()
                            ),
                        );
                    }
                }
                Ok(Outcome::Gone) => {
                    self.mark_reachable();
                    track.accepted = true;
                    track.escalated |= escalated;
                }
                Ok(Outcome::Blocked { budget, message }) => {
                    self.mark_reachable();
                    let delay = backoff(track.attempts, cap);
                    track.attempts += 1;
                    track.last_try = Some((now, delay));
                    min_wake(wake, now + delay);
                    let by = budget
                        .map(|b| format!("PodDisruptionBudget {}/{b}", pod.namespace))
                        .unwrap_or(message);
                    if track.blocked_by.as_deref() != Some(by.as_str()) {
                        tracing::info!(node = %self.node, pod = %pod.key(), blocked_by = %by, "eviction blocked");
                        self.event_both(
                            node,
                            mobj.as_deref(),
                            true,
                            "EvictionBlocked",
                            format!(
                                "eviction of pod {} blocked by {by}; retrying with back-off",
                                pod.key()
                            ),
                        );
                    }
                    track.blocked_by = Some(by);
                }
                Err(err) => {
                    if anyhow_is_unusable(&err) {
                        self.mark_unreachable(&format_args!("{err:#}"));
                    }
                    self.metrics.api_error("terminate");
                    tracing::warn!(node = %self.node, pod = %pod.key(), error = format!("{err:#}"), "terminating a pod failed");
                    track.last_try = Some((now, RETRY_AFTER_ERROR));
                    min_wake(wake, now + RETRY_AFTER_ERROR);
                }
            }
        }

        if !statics.is_empty() {
            let gate = self.gate.clone();
            let node_name = self.node.clone();
            let wanted: Vec<(String, String)> = statics
                .iter()
                .map(|p| (p.namespace.clone(), p.name.clone()))
                .collect();
            let outcome =
                tokio::task::spawn_blocking(move || -> Result<Vec<(usize, Result<String>)>> {
                    let manifests = gate.active()?;
                    Ok(wanted
                        .iter()
                        .enumerate()
                        .map(|(i, (ns, name))| {
                            let r = manifests
                                .iter()
                                .find(|m| m.is_mirrored_by(ns, name, &node_name))
                                .map(|m| m.file_name.clone())
                                .with_context(|| {
                                    format!("no static pod manifest mirrors pod {ns}/{name}")
                                })
                                .and_then(|file| gate.gate(&file).map(|()| file));
                            (i, r)
                        })
                        .collect())
                })
                .await
                .context("the static pod gate task failed")??;
            for (i, r) in outcome {
                let pod = &statics[i];
                let track = st.tracks.entry(pod.uid.clone()).or_default();
                match r {
                    Ok(file) => {
                        track.accepted = true;
                        self.metrics.pod_terminated(TerminationMethod::StaticGate);
                        tracing::info!(node = %self.node, pod = %pod.key(), manifest = %file, "static pod manifest gated");
                    }
                    Err(err) => {
                        track.accepted = true;
                        tracing::warn!(node = %self.node, pod = %pod.key(), error = format!("{err:#}"), "cannot gate a static pod");
                        self.event_both(
                            node,
                            views.first().map(|v| v.m.as_ref()),
                            true,
                            "StaticPodNotGated",
                            format!("{err:#}"),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// This node's entry in `m`'s status and the aggregate fields. Returns whether the
    /// entry on the apiserver is up to date.
    #[allow(clippy::too_many_arguments)]
    async fn write_status(
        &self,
        st: &mut DrainState,
        node: &Node,
        m: &Arc<NodeMaintenance>,
        view: Option<&MaintView>,
        pods: &[PodInfo],
        force: bool,
        wake: &mut Option<Instant>,
    ) -> Result<bool> {
        let name = m.name_any();
        let mut entry = NodeMaintenanceNodeStatus::for_node(&self.node);
        if let Some(v) = view {
            let targeted: Vec<&PodInfo> = st.targets.active_targeted(pods).collect();
            let requested = targeted
                .iter()
                .filter(|p| p.terminating || st.tracks.get(&p.uid).is_some_and(|t| t.accepted))
                .count();
            let blocked: Vec<String> = targeted
                .iter()
                .filter_map(|p| {
                    st.tracks
                        .get(&p.uid)
                        .filter(|t| !t.accepted && !p.terminating)
                        .and_then(|t| t.blocked_by.as_ref())
                        .map(|b| format!("{} by {b}", p.key()))
                })
                .collect();
            entry.drain_targets = st.targets.to_entries();
            entry.pods_remaining = targeted.len() as i32;
            entry.active_eviction_requests = requested as i32;
            entry.pods_pending_eviction_request = (targeted.len() - requested) as i32;
            entry.pods_not_targeted = pods
                .iter()
                .filter(|p| p.is_active() && !st.targets.targets(p))
                .count() as i32;
            let limited = !st.targets.covers(&v.targets);
            entry.drain_message = if !targeted.is_empty() {
                if !blocked.is_empty() {
                    format!("Draining: eviction blocked for {}", blocked.join("; "))
                } else if limited {
                    "Draining (limited by another maintenance)".into()
                } else {
                    "Draining".into()
                }
            } else if v.drained {
                "Drained".into()
            } else if limited {
                "Waiting for another maintenance.".into()
            } else {
                format!("Waiting for {name}.")
            };
        } else {
            entry.drain_message = "Cordoned".into();
            entry.pods_not_targeted = pods.iter().filter(|p| p.is_active()).count() as i32;
        }

        let mut current = m.node_status(&self.node).cloned();
        if let Some(c) = current.as_mut() {
            c.last_update_time = None;
        }
        let mut up_to_date = current.as_ref() == Some(&entry);
        let mut latest = m.clone();
        if !up_to_date {
            let counts_only = current.as_ref().is_some_and(|c| {
                c.drain_targets == entry.drain_targets
                    && c.drain_message == entry.drain_message
                    && (c.pods_remaining == 0) == (entry.pods_remaining == 0)
            });
            let due = st.last_entry_write.get(&name).map(|t| *t + STATUS_DEBOUNCE);
            match due {
                Some(due) if counts_only && !force && Instant::now() < due => min_wake(wake, due),
                _ => {
                    let mut e = entry.clone();
                    e.last_update_time =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            k8s_openapi::jiff::Timestamp::now(),
                        ));
                    latest = Arc::new(self.apply_entry(&name, &e).await?);
                    st.nm_overlay.insert(name.clone(), latest.clone());
                    st.last_entry_write.insert(name.clone(), Instant::now());
                    up_to_date = true;
                }
            }
        }

        if let Some(v) = view {
            if v.drained
                && st
                    .announced
                    .insert(format!("drained/{}", m.uid().unwrap_or_default()))
            {
                self.event_both(
                    node,
                    Some(m),
                    false,
                    "Drained",
                    format!("node {} drained for {name}", self.node),
                );
            }
            let key = format!("targets/{name}/{}", describe_targets(&st.targets));
            if st.announced.insert(key) {
                self.event_both(
                    node,
                    Some(m),
                    false,
                    "DrainTargets",
                    format!(
                        "node {} drains {}",
                        self.node,
                        describe_targets(&st.targets)
                    ),
                );
            }
        }
        self.write_aggregate(st, &latest, view).await?;
        Ok(up_to_date)
    }

    async fn apply_entry(
        &self,
        name: &str,
        entry: &NodeMaintenanceNodeStatus,
    ) -> Result<NodeMaintenance> {
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let body = node_status_apply_patch(name, entry)?;
        let r = api
            .patch_status(
                name,
                &node_status_patch_params(&self.node),
                &Patch::Apply(&body),
            )
            .await
            .with_context(|| {
                format!(
                    "writing node {}'s status to NodeMaintenance {name}",
                    self.node
                )
            });
        self.note(&r);
        if r.is_err() {
            self.metrics.api_error("maintenance_status");
        }
        r
    }

    async fn write_aggregate(
        &self,
        st: &mut DrainState,
        m: &Arc<NodeMaintenance>,
        view: Option<&MaintView>,
    ) -> Result<()> {
        let name = m.name_any();
        let status = m.status.clone().unwrap_or_default();
        let now = now_rfc3339();
        let mut stages = serde_json::to_value(&status.stage_statuses)?;
        let mut wanted = vec![m.spec.stage];
        if m.spec.stage == Stage::Drain {
            wanted.insert(0, Stage::Cordon);
        }
        if let Some(list) = stages.as_array_mut() {
            for s in wanted {
                if !status.stage_statuses.iter().any(|x| x.name == s) {
                    list.push(json!({"name": s.as_str(), "startTimestamp": now}));
                }
            }
        }
        let mut patch = serde_json::Map::new();
        if stages != serde_json::to_value(&status.stage_statuses)? {
            patch.insert("stageStatuses".into(), stages);
        }
        if let Some(v) = view {
            let entries = &status.node_statuses;
            let reached = reached_drain_targets(
                entries
                    .iter()
                    .filter_map(|e| DrainTargets::from_entries(&e.drain_targets).ok())
                    .collect::<Vec<_>>()
                    .iter(),
            );
            let message = if v.drained {
                "Drained".to_string()
            } else if entries.iter().any(|e| e.pods_remaining > 0) {
                "Draining".to_string()
            } else {
                format!("Waiting for {name}.")
            };
            let drain_status = json!({
                "reachedDrainTargets": serde_json::to_value(reached.to_entries())?,
                "podsPendingEvictionRequest": entries.iter().map(|e| e.pods_pending_eviction_request).sum::<i32>(),
                "activeEvictionRequests": entries.iter().map(|e| e.active_eviction_requests).sum::<i32>(),
                "drainMessage": message,
            });
            let current_ds = serde_json::to_value(status.drain_status.clone().unwrap_or_default())?;
            if strip_empty(&current_ds) != strip_empty(&drain_status) {
                patch.insert("drainStatus".into(), drain_status);
            }
            let want = if v.drained { "True" } else { "False" };
            let existing = status
                .conditions
                .iter()
                .find(|c| c.type_ == CONDITION_DRAINED);
            if existing.is_none_or(|c| c.status != want) {
                let mut conds: Vec<Value> = status
                    .conditions
                    .iter()
                    .filter(|c| c.type_ != CONDITION_DRAINED)
                    .filter_map(|c| serde_json::to_value(c).ok())
                    .collect();
                conds.push(json!({
                    "type": CONDITION_DRAINED,
                    "status": want,
                    "reason": if v.drained { "Drained" } else { "Draining" },
                    "message": if v.drained { "every targeted pod terminated on every selected node".to_string() } else { format!("at drain plan entry {} of {}", v.index + 1, v.plan_len) },
                    "lastTransitionTime": now,
                    "observedGeneration": m.metadata.generation.unwrap_or(0),
                }));
                patch.insert("conditions".into(), Value::Array(conds));
            }
        }
        if patch.is_empty() {
            return Ok(());
        }
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let r = api
            .patch_status(
                &name,
                &merge_params(),
                &Patch::Merge(json!({"status": patch})),
            )
            .await
            .with_context(|| format!("writing the status of NodeMaintenance {name}"));
        self.note(&r);
        let updated = r?;
        st.nm_overlay.insert(name, Arc::new(updated));
        Ok(())
    }

    async fn update_finalizer(
        &self,
        st: &mut DrainState,
        m: &NodeMaintenance,
        present: bool,
    ) -> Result<()> {
        let name = m.name_any();
        let mut list: Vec<String> = m.finalizers().to_vec();
        list.retain(|f| f != FINALIZER_MAINTENANCE_COMPLETION);
        if present {
            list.push(FINALIZER_MAINTENANCE_COMPLETION.into());
        }
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let patch = json!({"metadata": {
            "finalizers": list,
            "resourceVersion": m.metadata.resource_version,
        }});
        match api
            .patch(&name, &merge_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => {
                self.mark_reachable();
                st.nm_overlay.insert(name, Arc::new(updated));
                Ok(())
            }
            // Someone changed it meanwhile: the watch brings the new version and a new pass.
            Err(e) if api_error_code(&e) == Some(409) => Ok(()),
            Err(e) if api_error_code(&e) == Some(404) => Ok(()),
            Err(e) => {
                let e = anyhow::Error::from(e)
                    .context(format!("updating the finalizer of NodeMaintenance {name}"));
                self.note::<()>(&Err(anyhow::anyhow!("{e:#}")));
                Err(e)
            }
        }
    }

    /// The Complete stage (or deletion) of `m` on this node.
    async fn complete(
        &self,
        st: &mut DrainState,
        node: &Node,
        m: &Arc<NodeMaintenance>,
        active: &[Arc<NodeMaintenance>],
    ) -> Result<()> {
        let name = m.name_any();
        let others = active.iter().any(|o| o.name_any() != name);
        if !others {
            if uncordon_patch(node).is_some() {
                self.patch_node(st, "uncordon", uncordon_patch).await?;
            }
            if maintenance_taint_patch(node, false).is_some() {
                self.patch_node(st, "remove the maintenance taint", |n| {
                    maintenance_taint_patch(n, false)
                })
                .await?;
            }
            if lb_exclusion_patch(node, false).is_some() {
                self.patch_node(st, "remove the load-balancer exclusion", |n| {
                    lb_exclusion_patch(n, false)
                })
                .await?;
            }
            let gate = self.gate.clone();
            let kept = tokio::task::spawn_blocking(move || -> Result<Vec<String>> {
                if gate.gated()?.is_empty() {
                    Ok(Vec::new())
                } else {
                    gate.restore_all()
                }
            })
            .await
            .context("the static pod restore task failed")??;
            if !kept.is_empty() {
                self.event_both(
                    node,
                    Some(m),
                    true,
                    "StaticPodsKeptAside",
                    format!(
                        "gated manifests not restored (a file of that name exists): {}",
                        kept.join(", ")
                    ),
                );
            }
        }
        if let Err(err) = self.terminator.withdraw(&name).await {
            tracing::warn!(node = %self.node, maintenance = %name, error = format!("{err:#}"), "withdrawing eviction requests failed");
        }
        let mut entry = NodeMaintenanceNodeStatus::for_node(&self.node);
        entry.drain_message = COMPLETED_MESSAGE.into();
        let mut latest = m.clone();
        let current_msg = m.node_status(&self.node).map(|e| e.drain_message.as_str());
        if current_msg != Some(COMPLETED_MESSAGE) {
            entry.last_update_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
            latest = Arc::new(self.apply_entry(&name, &entry).await?);
            st.nm_overlay.insert(name.clone(), latest.clone());
        }
        self.write_aggregate(st, &latest, None).await?;
        let everyone_done = latest
            .status
            .as_ref()
            .map(|s| {
                s.node_statuses
                    .iter()
                    .all(|e| e.drain_message == COMPLETED_MESSAGE)
            })
            .unwrap_or(true);
        if has_finalizer(&latest) && everyone_done {
            self.update_finalizer(st, &latest, false).await?;
        }
        if st
            .announced
            .insert(format!("completed/{}", m.uid().unwrap_or_default()))
        {
            let note = if others {
                format!(
                    "{name} completed on node {}; it stays cordoned for another maintenance",
                    self.node
                )
            } else {
                format!("{name} completed on node {}", self.node)
            };
            self.event_both(node, Some(m), false, "Completed", note);
            tracing::info!(node = %self.node, maintenance = %name, others, "maintenance completed");
        }
        Ok(())
    }

    async fn publish_fallback(&self, st: &mut DrainState, selecting: &[Arc<NodeMaintenance>]) {
        let Some(summary) = lock(&self.fallback).clone() else {
            return;
        };
        let name = shutdown_maintenance_name(&self.node);
        let Some(m) = selecting.iter().find(|m| m.name_any() == name) else {
            return;
        };
        let Ok(text) = serde_json::to_string(&summary) else {
            return;
        };
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"annotations": {FALLBACK_ANNOTATION: text}}});
        match api
            .patch(&name, &merge_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => {
                st.nm_overlay.insert(name.clone(), Arc::new(updated));
                *lock(&self.fallback) = None;
                if let Some(node) = st.node_overlay.clone() {
                    self.event_both(
                        &node,
                        Some(m),
                        true,
                        "FallbackUsed",
                        format!("{}; continuing through {name}", summary.describe()),
                    );
                }
            }
            Err(err) => {
                tracing::debug!(error = %err, "recording the fallback report failed; will retry")
            }
        }
    }
}

fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// Deep-merges two optional JSON merge patches.
fn merge_values(a: Option<Value>, b: Option<Value>) -> Option<Value> {
    fn merge(into: &mut Value, from: Value) {
        match (into, from) {
            (Value::Object(i), Value::Object(f)) => {
                for (k, v) in f {
                    merge(i.entry(k).or_insert(Value::Null), v);
                }
            }
            (slot, v) => *slot = v,
        }
    }
    match (a, b) {
        (Some(mut a), Some(b)) => {
            merge(&mut a, b);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

fn strip_empty(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| {
                    !matches!(v, Value::Null)
                        && v.as_array().is_none_or(|a| !a.is_empty())
                        && v.as_str().is_none_or(|s| !s.is_empty())
                })
                .map(|(k, v)| (k.clone(), strip_empty(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn describe_targets(t: &DrainTargets) -> String {
    let parts: Vec<String> = t
        .to_entries()
        .iter()
        .map(|e| {
            let sel = if e.pod_selector.is_some() {
                " (selector)"
            } else {
                ""
            };
            format!("{:?}<={}{sel}", e.pod_type, e.pod_priority)
        })
        .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}

/// [`crate::daemon::Drainer`] over the engine alone (no fallback): `drain` is
/// `shutdown_drain`; `cancel` and `after_boot` apply `shutdown.on_cancel` /
/// `shutdown.after_boot`. The daemon composes it with the CRI fallback on
/// [`EngineError::ApiserverUnreachable`].
pub struct EngineDrainer {
    pub engine: Arc<Engine>,
    pub boot_id_path: std::path::PathBuf,
}

impl EngineDrainer {
    pub fn new(engine: Arc<Engine>) -> Self {
        Self {
            engine,
            boot_id_path: "/proc/sys/kernel/random/boot_id".into(),
        }
    }
}

#[async_trait::async_trait]
impl crate::daemon::Drainer for EngineDrainer {
    async fn drain(&self, req: &ShutdownRequest) -> Result<()> {
        self.engine
            .shutdown_drain(req)
            .await
            .map_err(anyhow::Error::from)
    }

    async fn cancel(&self, _req: &ShutdownRequest) -> Result<()> {
        let policy = self.engine.shared.settings.shutdown.on_cancel;
        self.engine.cancel_shutdown(policy).await
    }

    async fn after_boot(&self) -> Result<()> {
        let boot_id = std::fs::read_to_string(&self.boot_id_path)
            .with_context(|| format!("reading {}", self.boot_id_path.display()))?;
        let policy = self.engine.shared.settings.shutdown.after_boot;
        let outcome = self.engine.after_boot(boot_id.trim(), policy, None).await?;
        tracing::info!(node = %self.engine.node(), ?outcome, "after-boot reconcile");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_patches_keep_both() {
        let a = json!({"metadata": {"annotations": {"a": "1"}}, "spec": {"unschedulable": true}});
        let b = json!({"metadata": {"labels": {"l": ""}, "annotations": {"b": "2"}}});
        let m = merge_values(Some(a), Some(b)).unwrap();
        assert_eq!(m["metadata"]["annotations"]["a"], "1");
        assert_eq!(m["metadata"]["annotations"]["b"], "2");
        assert_eq!(m["metadata"]["labels"]["l"], "");
        assert_eq!(m["spec"]["unschedulable"], true);
        assert_eq!(merge_values(None, None), None);
    }

    #[test]
    fn the_fallback_summary_spans_every_run_and_caps_the_names() {
        use crate::fallback::{FallbackReport, PodOutcome, PodReport};
        let pod = |name: String, outcome| PodReport::new("ns", &name, outcome);
        let t1 = chrono::Utc::now();
        let t2 = t1 + chrono::Duration::seconds(5);
        let first = FallbackReport {
            started_at: Some(t1),
            finished_at: Some(t1),
            kubelet_stopped: false,
            pods: (0..250)
                .map(|i| pod(format!("p{i}"), PodOutcome::Stopped))
                .chain([pod("stuck".into(), PodOutcome::TimedOut)])
                .collect(),
            ..Default::default()
        };
        let second = FallbackReport {
            started_at: Some(t2),
            finished_at: None,
            kubelet_stopped: true,
            pods: vec![
                pod("gated".into(), PodOutcome::Gated),
                pod("later".into(), PodOutcome::Pending),
                PodReport {
                    errors: vec!["the CRI runtime could not be listed: no socket".into()],
                    ..pod("unlisted".into(), PodOutcome::NotReached)
                },
            ],
            ..Default::default()
        };
        let s = FallbackSummary::of_runs(&[first, second]);
        assert_eq!(s.started_at, Some(t1));
        assert_eq!(s.finished_at, Some(t1));
        assert!(s.kubelet_stopped, "as the last run left it");
        assert_eq!(
            (s.pods_stopped, s.pods_not_stopped, s.pods_not_reached),
            (251, 1, 2)
        );
        assert_eq!(s.stopped.len(), SUMMARY_MAX_NAMES);
        assert_eq!(s.not_stopped, ["ns/stuck: timedout"]);
        assert_eq!(
            s.not_reached,
            [
                "ns/later: its band had not started when the fallback ended",
                "ns/unlisted: the CRI runtime could not be listed: no socket"
            ]
        );
        assert!(s
            .describe()
            .contains("stopped 251 pod(s), 1 not stopped, 2 not reached"));
    }

    #[test]
    fn shutdown_plan_injects_defaults() {
        let plan = shutdown_plan(&Settings::default()).unwrap();
        assert_eq!(plan.len(), 12);
        assert_eq!(plan.last().unwrap().pod_type, PodType::Static);
    }
}
