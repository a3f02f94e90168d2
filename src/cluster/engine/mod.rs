//! The drain engine for the daemon's own node.
//!
//! One reconcile loop watches the Node, its pods and the NodeMaintenances that may concern it
//! (those labelled for it, and the unlabelled ones: an admin's, selecting nodes by a
//! nodeSelector the engine evaluates) and wakes on a watch event, on what the engine's callers
//! tell it, or on a timer it set itself (eviction back-off, escalation deadline, debounced
//! status): there is no polling. Each pass computes
//! everything from the reflected state (plus the objects our own writes returned, so a write
//! is never repeated before its watch event arrives) and issues only the requests that
//! change something.
//!
//! Restart safety comes from that statelessness: the node's drain targets are read back from
//! its entry in each maintenance's `status.nodeStatuses` (never backtracking), pods already
//! terminating are not asked again, and the shutdown maintenance is adopted by name.

mod budgets;
mod lenient;
mod offline;
mod reach;
mod reconcile;
mod reflect;
mod shutdown;
mod status;
mod terminate;
mod view;
mod wave;

pub(crate) use offline::FallbackSummary;
use reflect::{Watch, Watches};
pub(crate) use shutdown::{complete_shutdown_maintenance, other_active_maintenances};
pub(crate) use view::list_maintenances_for;
use view::{
    drain_stopped, has_finalizer, is_active, is_deleting, is_draining, node_volumes,
    tolerates_everything, Maintenances,
};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::gateway::{self, Failure};
use super::node::patch_node_with;
use super::terminate::{EvictionApi, PodTerminator};
use super::FIELD_MANAGER;
use crate::api::{NodeMaintenance, Stage};
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::nodeview::PodsOnNode;
use crate::plan::budget::{BudgetReserves, StepSchedule};
use crate::plan::freshness::{WatchLog, Written};
use crate::plan::reachability::{GivenUp, Reachability};
use crate::plan::{own, DrainPlanEntry, DrainTargets, PodInfo};
use crate::shutdown::ShutdownKind;
use crate::staticpods::StaticPodGate;

/// The boot that created the shutdown maintenance (`/proc/sys/kernel/random/boot_id`).
pub(crate) const BOOT_ID_ANNOTATION: &str = "nodegrace.dev/boot-id";
/// poweroff | reboot | halt | kexec | soft-reboot | bypass | unknown.
pub(crate) const SHUTDOWN_KIND_ANNOTATION: &str = "nodegrace.dev/shutdown-kind";
/// A summary of the offline (CRI) drain, written once the apiserver is back.
pub(crate) const FALLBACK_ANNOTATION: &str = "nodegrace.dev/fallback-report";
/// When and why the drain of a cancelled shutdown's kept maintenance stopped: it holds the
/// node cordoned and asks no pod more, until the next shutdown adopts it.
pub(crate) const DRAIN_STOPPED_ANNOTATION: &str = "nodegrace.dev/drain-stopped";
/// `drainMessage` of a node that carried out a maintenance's Complete stage.
pub const COMPLETED_MESSAGE: &str = "Completed";

const STATUS_DEBOUNCE: Duration = Duration::from_millis(200);
const POD_CACHE_DEBOUNCE: Duration = Duration::from_secs(1);
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);
const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// How often a shutdown drain asks while the apiserver seems well ([`Shared::probe`]).
const QUIET_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// A probe not answered by then found the apiserver unusable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Between tries of a shutdown step the apiserver did not take.
/// How often the node is asked again about its terminating pods while a maintenance drains.
const NODE_LOOK_INTERVAL: Duration = Duration::from_millis(200);
const RETRY_IN_SHUTDOWN: Duration = Duration::from_millis(200);

pub(crate) use crate::api::shutdown_maintenance_name;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The apiserver could not be used (no answer, or answers that refuse or fail every
    /// request: 401, 403, 429, 5xx) for longer than `fallback.apiserver_timeout` since the
    /// last good answer: switch to the local (CRI) fallback.
    #[error(transparent)]
    ApiserverUnreachable(#[from] GivenUp),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl From<Failure> for EngineError {
    fn from(f: Failure) -> Self {
        EngineError::Other(f.error)
    }
}

/// How long the steps of a `shutdown_drain` took, from its call (logged, and for benchmarks).
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
/// What the loop reports to the drain task of one shutdown, on the channel that drain gave it.
#[derive(Debug, Clone, Default, PartialEq)]
struct Progress {
    /// The node is cordoned and marked for the shutdown (the load-balancer exclusion, the
    /// maintenance taint).
    cordoned: bool,
    /// The apiserver refused the cordon (not an outage): the drain cannot go on through it.
    cordon_refused: Option<String>,
    /// Set once the node is empty under the shutdown maintenance and its status is written.
    shutdown_done: bool,
}

/// What the engine's other tasks tell its loop, which alone keeps the drain's state
/// ([`DrainState`]): the drain task, the gateway's record of an outage's end, the
/// eviction-request controller and the budgets' watches.
enum ToLoop {
    /// A shutdown drain began: the loop cordons and marks the node and reports on `progress`
    /// (this shutdown's own channel, kept until the next one begins).
    ShutdownBegun { progress: watch::Sender<Progress> },
    /// The shutdown's maintenance exists and its deadline schedule is made.
    ShutdownPlanned(Arc<ShutdownCtx>),
    /// The shutdown was cancelled, or its maintenance completed by hand.
    ShutdownEnded,
    /// The apiserver answers again after `lost`: the shutdown under way splits what is left
    /// of its budget again.
    Replan { lost: Duration, cause: String },
    /// The shutdown maintenance as its create (or adoption) returned it, and when.
    Created(Arc<NodeMaintenance>, Instant),
    /// What the eviction-request controller found blocking a pod (by UID); None: no longer.
    Blocked { uid: String, by: Option<String> },
    /// What the offline fallback did, to write to the shutdown maintenance once it can.
    Fallback(FallbackSummary),
    /// Where to ask the node about its terminating pods; None: the API alone decides.
    NodeView(Option<Arc<dyn PodsOnNode>>),
    /// What a watched budget's watch showed (`namespace/name`); None: no status, or gone.
    Budget {
        key: String,
        status: Option<crate::plan::drain::BudgetStatus>,
    },
}

/// Whether a shutdown is under way: held here only, by the loop, and published to the
/// watches on [`Shared::under_way`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum RunState {
    #[default]
    None,
    /// From `ShutdownBegun` to `ShutdownEnded`: the node is held for it.
    On,
    /// From `ShutdownEnded` to the next `ShutdownBegun`: the shutdown maintenance drains
    /// nothing more (until its [`DRAIN_STOPPED_ANNOTATION`] or completion is watched, and
    /// after).
    Stopped,
}

/// The shutdown drain under way, as the loop knows it.
#[derive(Default)]
struct ShutdownRun {
    state: RunState,
    /// Its drain waits for the cordon, and is told when the apiserver refuses it.
    cordon_awaited: bool,
    /// Its schedule once made; kept over a drain that resumes, until that one's comes.
    ctx: Option<Arc<ShutdownCtx>>,
    /// Where the loop reports to the latest shutdown's drain.
    progress: Option<watch::Sender<Progress>>,
}

impl ShutdownRun {
    fn on(&self) -> bool {
        self.state == RunState::On
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
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

    fn all(&self) -> bool {
        self.node && self.pods && self.maintenances
    }
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
    /// Which views have listed, as the loop (which alone polls the watches) publishes it.
    ready: watch::Sender<Ready>,
    wake: watch::Sender<u64>,
    /// Origin of the drain clock (`plan::drain` works on offsets from it).
    epoch: Instant,
    /// The wall clock at `epoch`: a time on the drain clock shown as a date is the same date
    /// each time it is shown.
    epoch_wall: chrono::DateTime<chrono::Utc>,
    endpoint: String,
    /// Whether the apiserver can be used (as `cluster::gateway` records it), on the drain clock.
    reach: Mutex<Reachability>,
    /// Bumped when the apiserver answers again after an outage: the watches waiting out a
    /// back-off try again at once.
    reconnect: watch::Sender<u64>,
    /// The loop's [`ShutdownRun`] is on, as the watches read it: failed watches try again
    /// at most about a second apart, and at once when it begins. Written by the loop only.
    under_way: watch::Sender<bool>,
    /// To the loop ([`ToLoop`]).
    to_loop: mpsc::UnboundedSender<ToLoop>,
    recorder: Recorder,
}

/// The node's drain engine. Dropping it stops its watches and its loop.
pub struct Engine {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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

async fn run_loop(
    shared: Arc<Shared>,
    mut inbox: mpsc::UnboundedReceiver<ToLoop>,
    mut watches: Watches,
) {
    let mut rx = shared.wake.subscribe();
    let mut st = DrainState::default();
    let mut ready = *shared.ready.borrow();
    let mut reconnects = *shared.reconnect.borrow();
    loop {
        while let Ok(msg) = inbox.try_recv() {
            shared.take(&mut st, msg);
        }
        watches.take_ready(&mut ready, &mut st.watch_log);
        // What woke the loop so far is in what the pass reads; the watches' own bumps are
        // for the tasks outside it.
        rx.borrow_and_update();
        let on = st.shutdown.on();
        let began_or_ended = shared
            .under_way
            .send_if_modified(|u| std::mem::replace(u, on) != on);
        let came_back = *shared.reconnect.borrow() != reconnects;
        reconnects = *shared.reconnect.borrow();
        if began_or_ended || came_back {
            watches.woken(on);
        }
        shared
            .ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
        let next = if ready.all() {
            let pass = Instant::now();
            let result = shared.reconcile(&mut st).await;
            tracing::trace!(node = %shared.node, took = ?pass.elapsed(), "reconcile pass");
            match result {
                Ok(next) => next,
                Err(err) => {
                    let f = gateway::passed_up(&*shared, err);
                    if f.apiserver_unusable() {
                        // Logged once by the reachability record, not at every retry.
                        tracing::debug!(node = %shared.node, error = f.text(), "reconcile failed; retrying");
                    } else {
                        tracing::warn!(node = %shared.node, error = f.text(), "reconcile failed; retrying");
                    }
                    Some(Instant::now() + RETRY_AFTER_ERROR)
                }
            }
        } else {
            None
        };
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            msg = inbox.recv() => match msg {
                Some(msg) => shared.take(&mut st, msg),
                None => return,
            },
            seen = watches.next() => seen.record(&mut ready, &mut st.watch_log),
            _ = crate::timer::sleep_until(next) => {}
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

/// The band a drain is in, by its targets (`Default<=1000, DaemonSet<=2000 (selector)`): the
/// one name of a band in logs, the DrainTargets events and the `band` label of both
/// `nodegrace_band_duration_seconds` and `nodegrace_pods_terminated_total`.
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
    /// The versions the watches delivered, in order: what says whether our own write's
    /// answer is still fresher than a watch's copy.
    watch_log: WatchLog,
    targets: DrainTargets,
    targets_since: Option<Instant>,
    tracks: HashMap<String, crate::plan::drain::PodTrack>,
    /// Terminating pods (UID) and when this engine first saw them so, on the drain clock.
    terminating_seen: HashMap<String, Duration>,
    /// Our last write's answer for the Node and each NodeMaintenance (by name), acted on
    /// until the watch has delivered it.
    node_overlay: Option<Written<Arc<Node>>>,
    nm_overlay: HashMap<String, Written<Arc<NodeMaintenance>>>,
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
    /// The shutdown maintenance's name and its latest re-plan, for its status entry.
    shutdown_replan: Option<(String, Replan)>,
    /// The re-plan last told in an event.
    replan_announced: Option<Replan>,
    /// Files the kubelet refuses that could not be gated, told once each.
    unreadable_not_gated: HashSet<String>,
    /// Requests in flight at once for a band, narrowed while the apiserver throttles.
    window: Option<crate::plan::reachability::Window>,
    shutdown: ShutdownRun,
    /// The shutdown maintenance as its create (or adoption) returned it, and when.
    created_maintenance: Option<(Arc<NodeMaintenance>, Instant)>,
    /// What the eviction-request controller found blocking each pod (by UID) since the last
    /// pass; None: no longer blocked. Taken into the drain's tracks at the next pass.
    eviction_blocks: HashMap<String, Option<String>>,
    /// The PodDisruptionBudgets that refused this drain's evictions, watched.
    budgets: budgets::Budgets,
    /// What the offline fallback did, until it is written to the shutdown maintenance.
    fallback: Option<FallbackSummary>,
    /// Asked what the node shows of its terminating pods, for when their band ends; None:
    /// the API alone decides.
    node_view: Option<Arc<dyn PodsOnNode>>,
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
    /// The UIDs of the pods `schedule` was split over.
    planned: HashSet<String>,
    /// Tokio instant of `ShutdownRequest::started_at`.
    start: Instant,
    /// When `schedule` was made, on the drain clock.
    planned_at: Duration,
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
        let (to_loop, inbox) = mpsc::unbounded_channel();
        let terminator = opts
            .terminator
            .unwrap_or_else(|| Arc::new(EvictionApi::new(opts.client.clone())));
        let recorder = crate::cluster::event_recorder(opts.client.clone(), &opts.node);
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
            ready: watch::channel(Ready::default()).0,
            wake,
            epoch: Instant::now(),
            epoch_wall: chrono::Utc::now(),
            endpoint: opts.endpoint,
            reach: Mutex::new(Reachability::default()),
            reconnect: watch::channel(0u64).0,
            under_way: watch::channel(false).0,
            to_loop,
            recorder,
        });
        let node = &opts.node;
        let own = own::own_selector(node).map(|mine| {
            Watch::new(
                shared.clone(),
                watcher::Config::default().labels(&mine),
                own_nms_w,
                |r| &mut r.own_maintenances,
            )
        });
        if own.is_none() {
            // A node name too long for a label value: its shutdown maintenance is
            // unlabelled, in the shared watch.
            shared.ready.send_modify(|r| {
                r.own_maintenances = true;
                r.settle();
            });
        }
        let watches = Watches {
            node: Watch::new(
                shared.clone(),
                watcher::Config::default().fields(&format!("metadata.name={node}")),
                nodes_w,
                |r| &mut r.node,
            ),
            pods: Watch::new(
                shared.clone(),
                watcher::Config::default().fields(&own::pods_field_selector(node)),
                pods_w,
                |r| &mut r.pods,
            ),
            own,
            shared: Watch::new(
                shared.clone(),
                watcher::Config::default().labels(&own::unlabelled_selector()),
                shared_nms_w,
                |r| &mut r.shared_maintenances,
            ),
        };
        let task = tokio::spawn(run_loop(shared.clone(), inbox, watches));
        Engine { shared, task }
    }

    pub fn node(&self) -> &str {
        &self.shared.node
    }

    /// Whether a shutdown drain runs (the requester's watch retries faster then).
    pub(crate) fn under_way(&self) -> watch::Receiver<bool> {
        self.shared.under_way.subscribe()
    }

    /// Changes each time the apiserver answers again after an outage of a second or more.
    pub(crate) fn reconnects(&self) -> watch::Receiver<u64> {
        self.shared.reconnect.subscribe()
    }

    /// Where the engine asks the node about its terminating pods (`plan::bandend`); None: the
    /// API alone says when a band ends.
    pub fn look_at_node(&self, view: Option<Arc<dyn PodsOnNode>>) {
        self.shared.tell_loop(ToLoop::NodeView(view));
    }

    /// New settings (SIGHUP): the next decision uses them. A shutdown drain already under
    /// way keeps the deadline schedule it started with.
    pub fn reload(&self, settings: Arc<Settings>) {
        // The reserves may have changed; the pods have not.
        self.shared
            .metrics
            .set_budget_needed(settings.reserves_needed(&self.shared.pod_infos()));
        match self.shared.settings.write() {
            Ok(mut s) => *s = settings,
            Err(p) => *p.into_inner() = settings,
        }
        self.shared.bump();
    }

    /// Where the requester's watch reports what blocks a pod's eviction.
    pub(crate) fn eviction_block_sink(&self) -> crate::cluster::eviction_request::BlockSink {
        let tell = self.shared.to_loop.clone();
        Arc::new(move |uid: &str, by: Option<String>| {
            let _ = tell.send(ToLoop::Blocked {
                uid: uid.to_owned(),
                by,
            });
        })
    }

    /// The settings in force (replaced on SIGHUP).
    pub(crate) fn settings(&self) -> Arc<Settings> {
        self.shared.settings()
    }

    pub(crate) fn metrics(&self) -> Metrics {
        self.shared.metrics.clone()
    }

    /// An Event on the Node (a reboot wave's steps), sent in the background.
    pub(crate) fn node_event(&self, node: &Node, warning: bool, reason: &str, note: String) {
        self.shared
            .event(node.object_ref(&()), warning, reason, note);
    }

    /// The apiserver client the engine uses (nodegrace's identity).
    pub(crate) fn client(&self) -> Client {
        self.shared.client.clone()
    }

    /// The Node from the engine's watch (its labels and taints for the reboot wave). None
    /// until the node was listed.
    pub(crate) fn own_node(&self) -> Option<Arc<Node>> {
        self.shared
            .nodes
            .state()
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(self.shared.node.as_str()))
    }

    /// The node's current pods as the engine sees them (for the pod cache and `status`).
    pub fn pods(&self) -> Vec<PodInfo> {
        self.shared.pod_infos()
    }

    /// Records what the offline fallback did; written to the shutdown maintenance (an
    /// annotation and an Event) once the apiserver answers again.
    pub fn record_fallback(&self, report: &crate::fallback::FallbackReport) {
        self.shared
            .tell_loop(ToLoop::Fallback(FallbackSummary::from(report)));
    }

    /// `nodegrace complete`: moves `shutdown-<node>` to stage Complete. False when there is
    /// none.
    pub async fn complete_shutdown_maintenance(&self) -> Result<bool> {
        let sh = &self.shared;
        sh.tell_loop(ToLoop::ShutdownEnded);
        let done = complete_shutdown_maintenance(&sh.client, &sh.node).await?;
        sh.bump();
        Ok(done)
    }
}

impl Shared {
    fn settings(&self) -> Arc<Settings> {
        self.settings
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    fn bump(&self) {
        self.wake.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Tells the loop; it runs a pass. Nothing is lost but to a loop that stopped.
    fn tell_loop(&self, msg: ToLoop) {
        let _ = self.to_loop.send(msg);
    }

    /// The loop takes what it was told into its state.
    fn take(&self, st: &mut DrainState, msg: ToLoop) {
        match msg {
            ToLoop::ShutdownBegun { progress } => {
                st.shutdown.state = RunState::On;
                st.shutdown.cordon_awaited = true;
                st.shutdown.progress = Some(progress);
            }
            ToLoop::ShutdownPlanned(ctx) => {
                // Planned when the loop takes it: an outage that ended before is behind it.
                let mut ctx = (*ctx).clone();
                ctx.planned_at = self.now();
                st.shutdown.ctx = Some(Arc::new(ctx));
            }
            ToLoop::ShutdownEnded => {
                st.shutdown.state = RunState::Stopped;
                st.shutdown.cordon_awaited = false;
                st.shutdown.ctx = None;
            }
            ToLoop::Replan { lost, cause } => {
                if let Some(ctx) = &st.shutdown.ctx {
                    st.shutdown.ctx = Some(Arc::new(self.replanned(ctx, lost, cause)));
                }
            }
            ToLoop::Created(m, at) => st.created_maintenance = Some((m, at)),
            ToLoop::Blocked { uid, by } => {
                st.eviction_blocks.insert(uid, by);
            }
            ToLoop::Fallback(summary) => st.fallback = Some(summary),
            ToLoop::NodeView(view) => st.node_view = view,
            ToLoop::Budget { key, status } => st.budgets.saw(key, status),
        }
    }

    /// Now on the drain clock.
    fn now(&self) -> Duration {
        self.epoch.elapsed()
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
        Ok(self.patch_node_answer(st, what, compute).await?)
    }

    async fn patch_node_answer(
        &self,
        st: &mut DrainState,
        what: &str,
        compute: impl Fn(&Node) -> Option<Value>,
    ) -> Result<bool, Failure> {
        let api: Api<Node> = Api::all(self.client.clone());
        let r = gateway::answer(self, patch_node_with(&api, &self.node, what, compute).await);
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
        let r = gateway::answer(self, r.map(|_| ()));
        self.bump();
        Ok(r?)
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
}
