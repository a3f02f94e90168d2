//! The drain engine for the daemon's own node.
//!
//! Reflectors of the Node, its pods and the NodeMaintenances that may concern it (those
//! labelled for it, and the unlabelled ones: an admin's, selecting nodes by a nodeSelector the
//! engine evaluates) feed one reconcile loop that wakes on a watch event or on a timer it set itself (eviction
//! back-off, escalation deadline, debounced status): there is no polling. Each pass computes
//! everything from the reflected state (plus the objects our own writes returned, so a write
//! is never repeated before its watch event arrives) and issues only the requests that
//! change something.
//!
//! Restart safety comes from that statelessness: the node's drain targets are read back from
//! its entry in each maintenance's `status.nodeStatuses` (never backtracking), pods already
//! terminating are not asked again, and the shutdown maintenance is adopted by name.

mod offline;
mod reconcile;
mod reflect;
mod shutdown;
mod status;
mod terminate;

pub use offline::FallbackSummary;
use reflect::spawn_reflector;
pub use shutdown::{complete_shutdown_maintenance, other_active_maintenances};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::eviction_request::ControllerHandle;
use super::node::patch_node_with;
use super::terminate::{EvictionApi, PodTerminator};
use super::FIELD_MANAGER;
use crate::api::{NodeMaintenance, Stage, FINALIZER_MAINTENANCE_COMPLETION};
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::plan::budget::{BudgetReserves, StepSchedule};
use crate::plan::reachability::{self, Change, Reachability};
use crate::plan::{DrainPlanEntry, DrainTargets, PodInfo};
use crate::shutdown::ShutdownKind;
use crate::staticpods::StaticPodGate;

/// The boot that created the shutdown maintenance (`/proc/sys/kernel/random/boot_id`).
pub(crate) const BOOT_ID_ANNOTATION: &str = "nodegrace.dev/boot-id";
/// poweroff | reboot | halt | kexec | soft-reboot | bypass | unknown.
pub(crate) const SHUTDOWN_KIND_ANNOTATION: &str = "nodegrace.dev/shutdown-kind";
/// A summary of the offline (CRI) drain, written once the apiserver is back.
pub(crate) const FALLBACK_ANNOTATION: &str = "nodegrace.dev/fallback-report";
/// `drainMessage` of a node that carried out a maintenance's Complete stage.
pub const COMPLETED_MESSAGE: &str = "Completed";

const STATUS_DEBOUNCE: Duration = Duration::from_millis(200);
const POD_CACHE_DEBOUNCE: Duration = Duration::from_secs(1);
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);
const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// How long the shutdown maintenance from its create's answer stands in for the watch's copy.
const CREATED_KEPT: Duration = Duration::from_secs(5);
/// Between tries of a shutdown step the apiserver did not take.
const RETRY_IN_SHUTDOWN: Duration = Duration::from_millis(200);

/// `d` to whole milliseconds, for messages.
fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

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
#[derive(Debug, Clone, Default)]
struct Progress {
    /// Set once the node is empty under the shutdown maintenance and its status is written.
    shutdown_done: bool,
}

#[derive(Default)]
struct Ready {
    node: bool,
    pods: bool,
    /// Both maintenance watches below have listed.
    maintenances: bool,
    own_maintenances: bool,
    shared_maintenances: bool,
}

impl Ready {
    fn settle(&mut self) {
        self.maintenances = self.own_maintenances && self.shared_maintenances;
    }
}

/// The NodeMaintenances the node watches: those labelled for it ([`crate::api::NODE_LABEL`]:
/// its shutdown maintenance) and the unlabelled ones. Maintenances labelled for other nodes
/// (their shutdown maintenances, pinned to them, with their status churn) never reach it.
struct Maintenances {
    own: Store<NodeMaintenance>,
    shared: Store<NodeMaintenance>,
}

impl Maintenances {
    /// Both caches, one object per name (the later version where both hold it: a
    /// maintenance that was relabelled).
    fn state(&self) -> Vec<Arc<NodeMaintenance>> {
        let mut by_name: HashMap<String, Arc<NodeMaintenance>> = HashMap::new();
        for m in self.shared.state().into_iter().chain(self.own.state()) {
            let name = m.name_any();
            let m = fresher(m, by_name.get(&name));
            by_name.insert(name, m);
        }
        by_name.into_values().collect()
    }
}

/// The label selectors of the two maintenance watches of `node`.
fn maintenance_selectors(node: &str) -> Vec<String> {
    let unlabelled = format!("!{}", crate::api::NODE_LABEL);
    match crate::api::node_label_value(node) {
        Some(value) => vec![format!("{}={value}", crate::api::NODE_LABEL), unlabelled],
        None => vec![unlabelled],
    }
}

/// The NodeMaintenances that may select `node`, as the engine watches them (one list per
/// selector of [`maintenance_selectors`]), for the CLI. One object per name: a maintenance
/// relabelled between the two lists is in both, and the later version counts.
pub(crate) async fn list_maintenances_for(
    client: &Client,
    node: &str,
) -> Result<Vec<NodeMaintenance>> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let mut all: Vec<NodeMaintenance> = Vec::new();
    for selector in maintenance_selectors(node) {
        let params = kube::api::ListParams::default().labels(&selector);
        let list = api
            .list(&params)
            .await
            .with_context(|| format!("listing NodeMaintenances ({selector})"))?;
        for m in list.items {
            match all
                .iter_mut()
                .find(|known| known.name_any() == m.name_any())
            {
                Some(known) if rv_number(&m) > rv_number(known) => *known = m,
                Some(_) => {}
                None => all.push(m),
            }
        }
    }
    Ok(all)
}

struct Shared {
    client: Client,
    node: String,
    /// Replaced on SIGHUP (`Engine::reload`); read through `settings()`.
    settings: std::sync::RwLock<Arc<Settings>>,
    gate: Arc<dyn StaticPodGate>,
    metrics: Metrics,
    terminator: Arc<dyn PodTerminator>,
    nodes: Store<Node>,
    pods: Store<Pod>,
    maintenances: Maintenances,
    ready: Mutex<Ready>,
    wake: watch::Sender<u64>,
    /// Origin of the drain clock (`plan::drain` works on offsets from it).
    epoch: Instant,
    endpoint: String,
    /// Whether the apiserver can be used (see [`is_unusable`]), on the drain clock.
    reach: Mutex<Reachability>,
    /// Bumped when the apiserver answers again after an outage, and when a shutdown starts:
    /// the watches waiting out a back-off try again at once.
    reconnect: watch::Sender<u64>,
    /// A shutdown drain runs (from its first request, before its schedule exists): failed
    /// watches try again at most about a second apart.
    shutting_down: Arc<std::sync::atomic::AtomicBool>,
    shutdown: Mutex<Option<Arc<ShutdownCtx>>>,
    /// The shutdown maintenance as its create (or adoption) returned it, and when.
    created_maintenance: Mutex<Option<(Arc<NodeMaintenance>, Instant)>>,
    progress: watch::Sender<Progress>,
    recorder: Recorder,
    fallback: Mutex<Option<FallbackSummary>>,
    timings: Mutex<ShutdownTimings>,
    /// This node's eviction-request controller, when nodegrace is it: fed the engine's pod
    /// events and the eviction back-off cap in force.
    eviction_requests: Mutex<Option<ControllerHandle>>,
    /// What the eviction-request controller found blocking each pod (by UID); None: no
    /// longer blocked. Taken into the drain's tracks at the next pass.
    eviction_blocks: Mutex<HashMap<String, Option<String>>>,
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
/// about the request itself (404, 409, 422, ...): no answer at all, an answer that fails or
/// refuses this client whatever it asks, or one that cannot be read (a proxy's HTML page, a
/// truncated body: nothing is decided on what could not be read). An apiserver that is
/// starting answers 403 to everything until its RBAC caches are loaded, and 5xx while its
/// storage is not ready; such answers are retried, and only their persistence past
/// `fallback.apiserver_timeout` sends a shutdown to the offline fallback
/// ([`crate::plan::reachability`]).
fn is_unusable(err: &kube::Error) -> bool {
    match err {
        // A server-side apply the schema refuses (a CRD older than this nodegrace): an answer
        // about the request, however its code reads.
        kube::Error::Api(status)
            if status.code == 500 && status.message.starts_with(TYPED_PATCH_REFUSED) =>
        {
            false
        }
        kube::Error::Api(status) => matches!(status.code, 401 | 403 | 429 | 500..=599),
        kube::Error::BuildRequest(_) => false,
        _ => true,
    }
}

/// How kube-apiserver begins the 500 it answers to an apply its schema refuses.
const TYPED_PATCH_REFUSED: &str = "failed to create typed patch object";

fn anyhow_is_unusable(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|c| c.downcast_ref::<kube::Error>().is_some_and(is_unusable))
}

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
    kind.as_str()
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn min_wake(wake: &mut Option<Instant>, at: Instant) {
    *wake = Some(wake.map_or(at, |w| w.min(at)));
}

/// The volumes the Node says are attached to it or in use by its kubelet, by name.
fn node_volumes(node: &Node) -> Vec<String> {
    let Some(status) = node.status.as_ref() else {
        return Vec::new();
    };
    let attached = status.volumes_attached.iter().flatten().map(|v| &v.name);
    let in_use = status.volumes_in_use.iter().flatten();
    let mut names: Vec<String> = attached.chain(in_use).cloned().collect();
    names.sort();
    names.dedup();
    names
}

fn daemonset_owner(pod: &Pod) -> Option<&str> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "DaemonSet")
        .map(|o| o.uid.as_str())
}

/// Whether the apiserver answered (and refused) rather than not being reached.
fn is_api_answer(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|c| matches!(c.downcast_ref::<kube::Error>(), Some(kube::Error::Api(_))))
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

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
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
                        shared.mark_unreachable(&crate::cluster::error_text(&err));
                        tracing::debug!(node = %shared.node, error = crate::cluster::error_text(&err), "reconcile failed; retrying");
                    } else {
                        tracing::warn!(node = %shared.node, error = crate::cluster::error_text(&err), "reconcile failed; retrying");
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

impl Replan {
    /// For the node's entry in the maintenance's status (after its drain message) and the
    /// event: what was lost, to what, and what was left.
    fn summary(&self) -> String {
        let secs = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
        format!(
            "planned again at {}: {} ({} lost); the {} left of the shutdown budget split over the pods left",
            secs(self.at),
            self.cause,
            secs(self.lost),
            secs(self.left)
        )
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

#[derive(Default)]
struct DrainState {
    targets: DrainTargets,
    targets_since: Option<Instant>,
    tracks: HashMap<String, crate::plan::drain::PodTrack>,
    node_overlay: Option<Arc<Node>>,
    nm_overlay: HashMap<String, Arc<NodeMaintenance>>,
    last_entry_write: HashMap<String, Instant>,
    announced: HashSet<String>,
    cache_written: Option<Vec<PodInfo>>,
    cache_due: Option<Instant>,
    /// Per label-selected maintenance (UID): when its nodes were listed, and their names.
    selected_nodes: HashMap<String, (Instant, Vec<String>)>,
    /// Maintenances whose drain plan cannot be used, and why (reported in their status).
    invalid_plans: HashMap<String, String>,
    /// DaemonSet UID -> the UID of its tolerate-all pod this drain terminated.
    daemonset_terminated: HashMap<String, String>,
    /// The eviction back-off cap and concurrency last given to the eviction-request
    /// controller.
    eviction_requests_tuned: Option<(Duration, usize)>,
    /// The shutdown maintenance's name and its latest re-plan, for its status entry.
    shutdown_replan: Option<(String, Replan)>,
    /// The re-plan last told in an event.
    replan_announced: Option<Replan>,
    /// Files the kubelet refuses that could not be gated, told once each.
    unreadable_not_gated: HashSet<String>,
    /// Requests in flight at once for a band, narrowed while the apiserver throttles.
    window: Option<crate::plan::reachability::Window>,
}

struct MaintView {
    m: Arc<NodeMaintenance>,
    name: String,
    plan_len: usize,
    index: usize,
    drained: bool,
    targets: DrainTargets,
}

#[derive(Clone)]
struct ShutdownCtx {
    name: String,
    plan: Vec<DrainPlanEntry>,
    step_targets: Vec<DrainTargets>,
    budget: Duration,
    reserves: BudgetReserves,
    schedule: Vec<StepSchedule>,
    /// Tokio instant of `ShutdownRequest::started_at`.
    start: Instant,
    /// The last time the schedule was split again over what was left of the budget.
    replanned: Option<Replan>,
}

/// A new split of a shutdown's budget after time was lost.
#[derive(Debug, Clone, PartialEq)]
struct Replan {
    /// Since the start of the shutdown.
    at: Duration,
    lost: Duration,
    /// What was left of the budget, split again.
    left: Duration,
    /// What was lost to, for the log, the status and the event.
    cause: String,
}

impl Engine {
    /// Starts the watches and the reconcile loop. Returns at once; the loop acts as soon as
    /// the first lists arrive.
    pub fn start(opts: EngineOptions) -> Engine {
        let (nodes_r, nodes_w) = reflector::store::<Node>();
        let (pods_r, pods_w) = reflector::store::<Pod>();
        let (own_nms_r, own_nms_w) = reflector::store::<NodeMaintenance>();
        let (shared_nms_r, shared_nms_w) = reflector::store::<NodeMaintenance>();
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
            settings: std::sync::RwLock::new(Arc::new(opts.settings)),
            gate: opts.gate,
            metrics: opts.metrics,
            terminator,
            nodes: nodes_r,
            pods: pods_r,
            maintenances: Maintenances {
                own: own_nms_r,
                shared: shared_nms_r,
            },
            ready: Mutex::new(Ready::default()),
            wake,
            epoch: Instant::now(),
            endpoint: opts.endpoint,
            reach: Mutex::new(Reachability::default()),
            reconnect: watch::channel(0u64).0,
            shutting_down: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            shutdown: Mutex::new(None),
            created_maintenance: Mutex::new(None),
            progress,
            recorder,
            fallback: Mutex::new(None),
            timings: Mutex::new(ShutdownTimings::default()),
            eviction_requests: Mutex::new(None),
            eviction_blocks: Mutex::new(HashMap::new()),
        });
        let c = &opts.client;
        let node = &opts.node;
        let mut tasks = vec![
            spawn_reflector(
                shared.clone(),
                Api::<Node>::all(c.clone()),
                watcher::Config::default().fields(&format!("metadata.name={node}")),
                nodes_w,
                |r| &mut r.node,
                |_, _| {},
            ),
            spawn_reflector(
                shared.clone(),
                Api::<Pod>::all(c.clone()),
                watcher::Config::default().fields(&format!("spec.nodeName={node}")),
                pods_w,
                |r| &mut r.pods,
                Shared::pod_changed,
            ),
            spawn_reflector(
                shared.clone(),
                Api::<NodeMaintenance>::all(c.clone()),
                watcher::Config::default().labels(&format!("!{}", crate::api::NODE_LABEL)),
                shared_nms_w,
                |r| &mut r.shared_maintenances,
                |_, _| {},
            ),
            tokio::spawn(run_loop(shared.clone())),
        ];
        match crate::api::node_label_value(node) {
            Some(value) => tasks.push(spawn_reflector(
                shared.clone(),
                Api::<NodeMaintenance>::all(c.clone()),
                watcher::Config::default().labels(&format!("{}={value}", crate::api::NODE_LABEL)),
                own_nms_w,
                |r| &mut r.own_maintenances,
                |_, _| {},
            )),
            // A node name too long for a label value: its shutdown maintenance is
            // unlabelled, in the shared watch.
            None => {
                let mut ready = lock(&shared.ready);
                ready.own_maintenances = true;
                ready.settle();
            }
        }
        Engine { shared, tasks }
    }

    pub fn node(&self) -> &str {
        &self.shared.node
    }

    /// The node's pods as the engine's watch holds them (the eviction-request controller's
    /// pod cache: one watch of the node's pods serves both).
    pub(crate) fn pod_store(&self) -> Store<Pod> {
        self.shared.pods.clone()
    }

    /// True while a shutdown drain runs (the eviction-request controller's watches retry
    /// faster then).
    pub(crate) fn shutting_down(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.shared.shutting_down.clone()
    }

    /// New settings (SIGHUP): the next decision uses them. A shutdown drain already under
    /// way keeps the deadline schedule it started with.
    pub fn reload(&self, settings: Arc<Settings>) {
        match self.shared.settings.write() {
            Ok(mut s) => *s = settings,
            Err(p) => *p.into_inner() = settings,
        }
        self.shared.bump();
    }

    /// Where this node's eviction-request controller reports what blocks a pod's eviction.
    pub(crate) fn eviction_block_sink(&self) -> crate::cluster::eviction_request::BlockSink {
        let shared = Arc::downgrade(&self.shared);
        Arc::new(move |uid: &str, by: Option<String>| {
            if let Some(shared) = shared.upgrade() {
                lock(&shared.eviction_blocks).insert(uid.to_owned(), by);
                shared.bump();
            }
        })
    }

    /// Feeds this node's eviction-request controller: pod events, and the shorter eviction
    /// back-off cap while a shutdown runs.
    pub(crate) fn attach_eviction_request_controller(&self, handle: ControllerHandle) {
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

    /// Records what the offline fallback did; written to the shutdown maintenance (an
    /// annotation and an Event) once the apiserver answers again.
    pub fn record_fallback(&self, report: &crate::fallback::FallbackReport) {
        *lock(&self.shared.fallback) = Some(FallbackSummary::from(report));
        self.shared.bump();
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
        lock(&self.shared.reach).usable()
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
            if ready && lock(&sh.reach).usable() {
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(PROBE_INTERVAL) => sh.probe().await,
            }
        }
    }
}

impl Shared {
    fn settings(&self) -> Arc<Settings> {
        self.settings
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

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

    /// Now on the drain clock.
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// A usable answer. The first after an outage of a second or more wakes the watches (no
    /// back-off inherited from the outage) and has a shutdown under way plan the time it lost.
    fn mark_reachable(&self) {
        let change = lock(&self.reach).answered(self.now());
        if let Change::CameBack { lost, said } = change {
            if said {
                tracing::info!(node = %self.node, apiserver = %self.endpoint, after = ?lost, "the apiserver answers again");
            } else {
                tracing::debug!(node = %self.node, apiserver = %self.endpoint, after = ?lost, "the apiserver answers again");
            }
            if reachability::worth_acting_on(lost) {
                self.reconnect.send_modify(|g| *g = g.wrapping_add(1));
                self.replan_shutdown(
                    lost,
                    format!(
                        "the apiserver could not be used for {}",
                        humantime::format_duration(round_ms(lost))
                    ),
                );
            }
            self.bump();
        }
    }

    /// An unusable answer, or none (see [`is_unusable`]).
    fn mark_unreachable(&self, error: &dyn std::fmt::Display) {
        let error = error.to_string();
        let change = lock(&self.reach).failed(self.now(), error.clone());
        match change {
            Change::WentAway { for_ } => {
                tracing::warn!(node = %self.node, apiserver = %self.endpoint, error = %error, unusable_for = ?for_, "the apiserver cannot be used; retrying");
            }
            Change::StillAway { for_, remind: true } => {
                tracing::warn!(node = %self.node, apiserver = %self.endpoint, error = %error, unusable_for = ?for_, "the apiserver still cannot be used");
            }
            _ => {}
        }
    }

    /// When a shutdown must go to the offline fallback, if the apiserver cannot be used.
    fn unreachable_deadline(&self) -> Option<Instant> {
        let timeout = self.settings().fallback.apiserver_timeout;
        lock(&self.reach)
            .fallback_at(timeout)
            .map(|at| self.epoch + at)
    }

    fn unusable_error(&self) -> EngineError {
        let reach = lock(&self.reach);
        let last = reach
            .last_error()
            .map_or_else(|| "no answer yet".to_string(), str::to_owned);
        let unusable_for = reach
            .unusable_for(self.now())
            .max(self.settings().fallback.apiserver_timeout);
        EngineError::ApiserverUnreachable(round_ms(unusable_for), last)
    }

    /// Splits what is left of the shutdown's budget again over the pods left, after `lost`
    /// (see [`crate::plan::budget::split_remaining`]). No shutdown under way: nothing to do.
    fn replan_shutdown(&self, lost: Duration, cause: String) {
        let mut slot = lock(&self.shutdown);
        let Some(ctx) = slot.as_ref() else {
            return;
        };
        let at = ctx.start.elapsed();
        let steps = match crate::plan::plan_steps(&ctx.plan, &self.pod_infos()) {
            Ok(steps) => steps,
            Err(err) => {
                tracing::warn!(node = %self.node, maintenance = %ctx.name, error = %err, "cannot plan the shutdown again; keeping its schedule");
                return;
            }
        };
        let schedule = crate::plan::budget::split_remaining(ctx.budget, at, &steps, &ctx.reserves);
        let left = ctx.budget.saturating_sub(at);
        tracing::info!(node = %self.node, maintenance = %ctx.name, lost = ?lost, at = ?at, left = ?left, cause = %cause, "time lost: the rest of the shutdown budget is split again over the pods left");
        let mut next = (**ctx).clone();
        next.schedule = schedule;
        next.replanned = Some(Replan {
            at,
            lost,
            left,
            cause,
        });
        *slot = Some(Arc::new(next));
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
            Err(e) if anyhow_is_unusable(e) => {
                self.mark_unreachable(&crate::cluster::error_text(e))
            }
            Err(_) => self.mark_reachable(),
        }
    }

    /// After an unusable answer (already noted): waits a moment to try again, or gives up
    /// once the apiserver has not been usable for `fallback.apiserver_timeout`.
    async fn retry_or_unreachable(&self, started: Instant) -> Result<(), EngineError> {
        let timeout = self.settings().fallback.apiserver_timeout;
        if started.elapsed() >= timeout || lock(&self.reach).must_fall_back(self.now(), timeout) {
            return Err(self.unusable_error());
        }
        tokio::time::sleep(RETRY_IN_SHUTDOWN).await;
        Ok(())
    }

    /// Waits until the watches named by `which` have listed, or the apiserver has not been
    /// usable for `fallback.apiserver_timeout` (counted from the last good answer, so a
    /// node whose apiserver went away long ago does not wait the whole timeout again).
    async fn wait_ready(&self, which: fn(&Ready) -> bool) -> Result<(), EngineError> {
        let mut rx = self.wake.subscribe();
        let started = Instant::now();
        let timeout = self.settings().fallback.apiserver_timeout;
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
        let mut stored = self.maintenances.state();
        let mut names: HashSet<String> = stored.iter().map(|m| m.name_any()).collect();
        {
            // The shutdown maintenance from its create's answer, until the watch has it: the
            // drain does not wait for a watch that may still be reconnecting.
            let mut created = lock(&self.created_maintenance);
            match created.as_ref() {
                Some((m, at)) if !names.contains(&m.name_any()) && at.elapsed() < CREATED_KEPT => {
                    names.insert(m.name_any());
                    stored.push(m.clone());
                }
                Some(_) => *created = None,
                None => {}
            }
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(json!({"code": code, "message": "m"})).unwrap(),
        ))
    }

    #[test]
    fn answers_about_the_request_leave_the_apiserver_usable() {
        for code in [400, 404, 409, 410, 422] {
            assert!(!is_unusable(&api(code)), "{code}");
        }
        // What kube-apiserver v1.28 answered to a status apply with a field an older CRD
        // lacks.
        let older_crd = kube::Error::Api(Box::new(
            serde_json::from_value(json!({"code": 500, "message":
                "failed to create typed patch object (/shutdown-n1; nodegrace.dev/v1alpha1, Kind=NodeMaintenance): .status.nodeStatuses[nodeName=\"n1\"].deadlineReplan: field not declared in schema"}))
            .unwrap(),
        ));
        assert!(!is_unusable(&older_crd));
    }

    #[test]
    fn refusals_of_everything_no_answer_and_unreadable_answers_make_it_unusable() {
        // 401/403 while its RBAC caches load, 429 throttling, 5xx while its storage is away.
        for code in [401, 403, 429, 500, 502, 503, 504] {
            assert!(is_unusable(&api(code)), "{code}");
        }
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(is_unusable(&kube::Error::Service(Box::new(refused))));
        // A 200 whose body is a proxy's HTML page, or cut short.
        for body in [
            "<html><body>502 Bad Gateway</body></html>",
            "{\"kind\":\"Node\",\"meta",
        ] {
            let garbage = serde_json::from_str::<Node>(body).unwrap_err();
            assert!(is_unusable(&kube::Error::SerdeError(garbage)), "{body}");
        }
        let through_context = anyhow::Error::from(api(503)).context("patching node n1");
        assert!(anyhow_is_unusable(&through_context));
        assert!(!anyhow_is_unusable(&anyhow::anyhow!(
            "no kube error at all"
        )));
    }

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
    fn node_volumes_are_those_attached_or_in_use() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {
                "volumesAttached": [{"name": "kubernetes.io/csi/d^a", "devicePath": ""}],
                "volumesInUse": ["kubernetes.io/csi/d^a", "kubernetes.io/csi/d^b"],
            },
        }))
        .unwrap();
        assert_eq!(
            node_volumes(&node),
            ["kubernetes.io/csi/d^a", "kubernetes.io/csi/d^b"]
        );
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        assert!(node_volumes(&bare).is_empty());
    }
}
