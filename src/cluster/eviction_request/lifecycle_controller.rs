//! The eviction-request controller of nodegrace's `lifecycle.nodegrace.dev` CRDs for this
//! node's pods: on a cluster without the in-tree API of Kubernetes 1.37 it does what the
//! in-tree evictionrequest-controller and imperative eviction responder do there, as
//! [`crate::plan::evictions`] decides. Three watches (the EvictionRequests labelled for this
//! node, the unlabelled ones, the Evictions labelled for this node), the drain engine's pod
//! cache and timers mark a pod to look at; each look decides on the caches and writes what
//! changed, every status write guarded by the resourceVersion it was decided on, so a look on
//! a stale cache is refused by the apiserver and looked at again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest, ResponderStatus};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::gate::EvictorGate;
use super::handle::Message;
use super::intree::warn_on_pod;
use super::lifecycle_api::{typed, LifecycleApi};
use super::{ControllerHandle, PodKey, WallClock, NODE_LABEL};
use crate::cluster::backoff::backed_off;
use crate::cluster::evict::{self, Outcome};
use crate::cluster::gateway::{self, Kind};
use crate::cluster::FIELD_MANAGER;
use crate::metrics::Metrics;
use crate::plan::classify;
use crate::plan::evictions::{
    activated_eviction, decide, decide_evictor, evictor_attempted, with_evictor_entry, Decision,
    EvictionOutcome, EvictorDecision, PodFacts, PodKind, Presence, TargetRef, EVICTOR_BACKOFF_CAP,
};
use crate::plan::freshness::{Fresher, Version, WatchLog, Written};

mod evictor;
mod queue;

use queue::{Input, LoopState, WatchItem};

/// A pod by namespace and name, as EvictionRequests and Evictions name it.
type Target = (String, String);

/// The requests and Evictions about one pod name.
type Gathered = (Vec<EvictionRequest>, Vec<Eviction>);

/// How long the final writes about a pod that is gone wait for its objects to be collected.
const GONE_SETTLE: Duration = Duration::from_secs(5);

/// How soon a look refused for a stale cache is tried again.
const STALE_RETRY: Duration = Duration::from_millis(200);

pub(crate) struct LifecycleController {
    api: LifecycleApi,
    /// nodegrace's identity: requests, Evictions, events.
    client: Client,
    /// The kubelet's identity: the Eviction API, confined to the node's pods.
    evictor: Client,
    node: String,
    pods: Store<Pod>,
    recorder: Recorder,
    clock: WallClock,
    shutting_down: Arc<AtomicBool>,
    rx: Option<mpsc::UnboundedReceiver<Message>>,
    /// Pods looked at at once (`drain.max_concurrent_requests`).
    concurrency: usize,
    gate: EvictorGate,
    /// The versions its watches delivered, by object UID: whether its own last writes
    /// are still fresher than the caches.
    watch_log: std::sync::Mutex<WatchLog>,
    /// Counts its evictor's refusals (`nodegrace_evictions_refused_total`).
    metrics: Metrics,
}

/// What the controller remembers between looks at one pod (by namespace and name): looks at
/// different pods run at once, each with its own.
#[derive(Default)]
struct Memory {
    /// The evictor's cap on its back-off (shorter during a shutdown), as of this look.
    backoff_cap: Option<Duration>,
    /// Per pod UID: the evictor's last refused attempt.
    last_attempt: HashMap<String, Timestamp>,
    /// Per pod UID: the Eviction API accepted; not asked again until the cache shows it.
    evicted: BTreeSet<String>,
    /// Problems already told, `<uid>/<sentence>`.
    told: BTreeSet<String>,
    /// What is wrong with the responders the pod being looked at declares.
    problems: Vec<String>,
    /// Evictions as this controller last wrote them, by `namespace/name`, until the watch
    /// shows them: a look must not decide on a cache older than its own writes.
    written: HashMap<String, Written<Eviction>>,
    /// This node's requests as its requester last wrote them, the same way.
    requested: HashMap<String, Written<EvictionRequest>>,
    /// When to look again, collected by a look.
    wakes: Vec<Timestamp>,
    /// Per pod UID: when the pod was first seen gone.
    gone_at: HashMap<String, Timestamp>,
}

impl Memory {
    /// Nothing worth keeping once the look is over.
    fn is_idle(&self) -> bool {
        self.last_attempt.is_empty()
            && self.evicted.is_empty()
            && self.written.is_empty()
            && self.requested.is_empty()
            && self.told.is_empty()
            && self.gone_at.is_empty()
    }
}

/// The watched objects.
struct Caches {
    ours: Store<DynamicObject>,
    unclaimed: Store<DynamicObject>,
    evictions: Store<DynamicObject>,
}

impl LifecycleController {
    pub(crate) fn new(
        client: Client,
        evictor: Client,
        node: &str,
        pods: Store<Pod>,
        clock: WallClock,
        concurrency: usize,
        metrics: Metrics,
    ) -> (Self, ControllerHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let recorder = crate::cluster::event_recorder(client.clone(), node);
        let gate = EvictorGate::default();
        (
            Self {
                api: LifecycleApi::nodegrace(),
                client,
                evictor,
                node: node.to_owned(),
                pods,
                recorder,
                clock,
                shutting_down: Arc::new(AtomicBool::new(false)),
                rx: Some(rx),
                concurrency: concurrency.max(1),
                gate: gate.clone(),
                watch_log: std::sync::Mutex::new(WatchLog::default()),
                metrics,
            },
            ControllerHandle::from_sender(tx, gate),
        )
    }

    pub(crate) fn retrying_as_in_shutdown_when(mut self, flag: Arc<AtomicBool>) -> Self {
        self.shutting_down = flag;
        self
    }

    fn watch(
        &self,
        resource: &Api<DynamicObject>,
        writer: Writer<DynamicObject>,
        selector: String,
    ) -> impl futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>> {
        backed_off(
            reflector::reflector(
                writer,
                watcher(
                    resource.clone(),
                    watcher::Config::default().labels(&selector),
                ),
            ),
            self.shutting_down.clone(),
        )
    }

    /// Runs until `stop`.
    pub(crate) async fn run(mut self, stop: CancellationToken) -> Result<()> {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            r = self.pods.wait_until_ready() => r.context("the node's pod watch ended")?,
        }
        let requests = self.api.requests(&self.client, None);
        let evictions = self.api.evictions(&self.client, None);
        let request_type = self.api.request_resource();
        let eviction_type = self.api.eviction_resource();
        let (w_ours, w_unclaimed, w_evictions) = (
            Writer::new(request_type.clone()),
            Writer::new(request_type),
            Writer::new(eviction_type),
        );
        let caches = Caches {
            ours: w_ours.as_reader(),
            unclaimed: w_unclaimed.as_reader(),
            evictions: w_evictions.as_reader(),
        };
        let Some(mine) = crate::plan::own::own_selector(&self.node) else {
            anyhow::bail!(
                "the node name {:?} is not a label value: its EvictionRequests cannot be labelled for it",
                self.node
            );
        };
        let mut events = futures::stream::select_all([
            self.watch(&requests, w_ours, mine.clone()).boxed(),
            self.watch(
                &requests,
                w_unclaimed,
                crate::plan::own::unlabelled_selector(),
            )
            .boxed(),
            self.watch(&evictions, w_evictions, mine).boxed(),
        ]);
        info!(node = %self.node, api = %self.api.group(), "eviction-request controller started");
        let mut state = LoopState::default();
        let mut rx = self.rx.take();
        // Each look ends on its own: a slow one (an eviction answered late) holds only its
        // own place, and the loop goes on taking inputs meanwhile.
        let mut looks = futures::stream::FuturesUnordered::new();
        loop {
            while looks.len() < state.concurrency.unwrap_or(self.concurrency) {
                let Some((target, memory)) = state.next_look() else {
                    break;
                };
                looks.push(self.look_owned(&caches, target, memory));
            }
            let next = state.timers.keys().next().copied();
            let sleep = next.map(|at| {
                let now = self.clock.now();
                at.duration_since(now)
                    .max(k8s_openapi::jiff::SignedDuration::ZERO)
                    .unsigned_abs()
            });
            let mut input = tokio::select! {
                () = stop.cancelled() => {
                    while looks.next().await.is_some() {}
                    info!(node = %self.node, "eviction-request controller stopped");
                    return Ok(());
                }
                Some((target, memory)) = looks.next() => Input::Looked(target, Box::new(memory)),
                event = events.next() => self.watched(event),
                message = recv_opt(&mut rx) => Input::Told(message),
                () = crate::timer::sleep_until(sleep.map(|d| tokio::time::Instant::now() + d)) => Input::Timer,
            };
            // What else is ready is taken before looks start: pods asked together are looked
            // at together.
            loop {
                if let Input::Told(None) = input {
                    // Every handle dropped: no more pod changes; the watches go on.
                    rx = None;
                }
                self.take_input(input, &caches, &mut state)?;
                input = if let Some(event) = events.next().now_or_never() {
                    self.watched(event)
                } else if let Some(message) = rx.as_mut().and_then(|r| r.try_recv().ok()) {
                    Input::Told(Some(message))
                } else {
                    break;
                };
            }
        }
    }

    /// An event of the watches as an input, logged as it reaches the caches.
    fn watched(&self, event: Option<WatchItem>) -> Input {
        if let Some(Ok(event)) = &event {
            self.log_delivery(event);
        }
        Input::Watched(event.map(|e| e.map(Box::new)))
    }

    async fn look_owned(
        &self,
        caches: &Caches,
        target: Target,
        mut memory: Memory,
    ) -> (Target, Memory) {
        self.look(caches, &target, &mut memory).await;
        (target, memory)
    }

    fn pod_name(&self, namespace: &str, uid: &str) -> Option<String> {
        self.pods
            .state()
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.metadata.uid.as_deref() == Some(uid)
            })
            .and_then(|p| p.metadata.name.clone())
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.state().into_iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
    }

    /// Decides for one pod and writes what changed.
    async fn look(&self, caches: &Caches, target: &Target, memory: &mut Memory) {
        if let Err(err) = self.try_look(caches, target, memory).await {
            let now = self.clock.now();
            let failure = gateway::Failure::new(err);
            // The object is gone (collected with its pod): its Delete event brings the next look.
            if failure.is(Kind::NotFound) {
                return;
            }
            // Refused for a stale cache: decided again on a fresher view, quietly.
            let stale = failure.is(Kind::Conflict);
            if !stale {
                warn!(node = %self.node, pod = %format!("{}/{}", target.0, target.1), error = failure.text(), "eviction-request controller: a write failed; trying again");
            }
            let again = if stale {
                STALE_RETRY
            } else {
                crate::plan::reachability::request_retry(
                    self.shutting_down.load(Ordering::Relaxed),
                    rand::random::<f64>(),
                )
            };
            memory.wakes.push(now.checked_add(again).unwrap_or(now));
        }
    }

    async fn try_look(&self, caches: &Caches, target: &Target, memory: &mut Memory) -> Result<()> {
        let (namespace, name) = target;
        let pod = self.pod(namespace, name);
        let Some((requests, mut evictions)) = self.gather(caches, target, pod.is_some(), memory)?
        else {
            return Ok(());
        };
        let uids: BTreeSet<String> = requests
            .iter()
            .filter_map(|r| r.spec.target.pod.as_ref().map(|p| p.uid.clone()))
            .collect();
        for uid in uids {
            let facts = self.facts(pod.as_deref(), &uid, memory);
            // A pod leaving takes its requests and their Evictions with it moments later: the
            // final writes wait a while, so as not to spend the apiserver on objects being
            // collected while the next pods are to be evicted.
            if facts.presence.leaving() {
                let now = self.clock.now();
                let since = *memory.gone_at.entry(uid.clone()).or_insert(now);
                let settle = since.checked_add(GONE_SETTLE).unwrap_or(since);
                if now < settle {
                    memory.wakes.push(settle);
                    continue;
                }
            }
            // The evictor reports first: a pod it evicted that is now gone is its completion,
            // which the controller must see before it closes the Eviction.
            let mut wakes = Vec::new();
            if let Some(i) = evictions.iter().position(|e| is_open_for(e, &uid)) {
                let (written, wake) = self
                    .run_evictor(namespace, name, &uid, &facts, &evictions[i], memory)
                    .await?;
                wakes.push(wake);
                if let Some(written) = written {
                    evictions[i] = written;
                }
            }
            let target = TargetRef {
                name: name.clone(),
                uid: uid.clone(),
            };
            let decision = decide(&target, &facts, &requests, &evictions, self.clock.now());
            let responder_problems = std::mem::take(&mut memory.problems);
            self.tell(
                pod.as_deref(),
                &uid,
                "EvictionResponderInvalid",
                &responder_problems,
                memory,
            );
            self.tell(
                pod.as_deref(),
                &uid,
                "EvictionRequestInvalid",
                &decision.problems,
                memory,
            );
            wakes.push(decision.wake_at);
            if !decision.is_quiet() {
                let mut decision = decision;
                // The evictor acts at once when the decision makes it the active responder,
                // and its report joins the decision's write.
                if let Some(activated) = activated_eviction(&decision, &evictions, &target) {
                    let d = self
                        .evictor_step(namespace, name, &uid, &facts, &activated, memory)
                        .await;
                    if let (Some(entry), Some(at)) = (d.status, activated.metadata.name.as_deref())
                    {
                        with_evictor_entry(&mut decision, at, entry);
                    }
                    wakes.push(d.wake_at);
                }
                self.apply(namespace, &decision, &evictions, memory).await?;
            }
            memory.wakes.extend(wakes.into_iter().flatten());
        }
        Ok(())
    }

    /// The requests and Evictions about `target` (a pod name), the controller's own writes
    /// laid over the caches; `None` when nothing of this node's is about it any more.
    fn gather(
        &self,
        caches: &Caches,
        target: &Target,
        pod_cached: bool,
        memory: &mut Memory,
    ) -> Result<Option<Gathered>> {
        let (namespace, name) = target;
        let about = |o: &DynamicObject| {
            o.metadata.namespace.as_deref() == Some(namespace)
                && target_of(o).is_some_and(|(_, n)| &n == name)
        };
        let labelled: Vec<EvictionRequest> = caches
            .ours
            .state()
            .iter()
            .filter(|o| about(o))
            .map(|o| typed(o))
            .collect::<Result<_>>()?;
        let unclaimed: Vec<Arc<DynamicObject>> = caches
            .unclaimed
            .state()
            .into_iter()
            .filter(|o| about(o))
            .collect();
        // A pod not in this node's cache is another node's, unless this node labelled a
        // request about it (its own): then the pod is gone.
        let requested_here = memory.requested.values().map(|w| &w.copy).any(|r| {
            r.metadata.namespace.as_deref() == Some(namespace.as_str())
                && r.spec.target.pod.as_ref().map(|p| p.name.as_str()) == Some(name.as_str())
        });
        if !pod_cached && labelled.is_empty() && !requested_here {
            // Nothing of this node's about it any more.
            memory.gone_at.clear();
            memory.last_attempt.clear();
            memory.evicted.clear();
            return Ok(None);
        }
        let mut requests = labelled;
        for o in unclaimed {
            requests.push(typed(&o)?);
        }
        let log = self.lock_log();
        overlay(&log, &mut requests, &mut memory.requested, namespace, |r| {
            r.spec.target.pod.as_ref().map(|p| p.name.as_str()) == Some(name.as_str())
        });
        let mut evictions: Vec<Eviction> = caches
            .evictions
            .state()
            .iter()
            .filter(|o| about(o))
            .map(|o| typed(o))
            .collect::<Result<_>>()?;
        overlay(&log, &mut evictions, &mut memory.written, namespace, |e| {
            e.spec.target.pod.as_ref().map(|p| p.name.as_str()) == Some(name.as_str())
        });
        Ok(Some((requests, evictions)))
    }

    fn facts(&self, pod: Option<&Pod>, uid: &str, memory: &mut Memory) -> PodFacts {
        let Some(pod) = pod else {
            memory.evicted.remove(uid);
            self.gate.forget(uid);
            return PodFacts {
                presence: Presence::Absent,
                kind: PodKind::Regular,
                in_pod_group: false,
                responders: Vec::new(),
            };
        };
        if pod.metadata.uid.as_deref() != Some(uid) {
            return PodFacts {
                presence: Presence::Replaced {
                    uid: pod.metadata.uid.clone().unwrap_or_default(),
                },
                kind: PodKind::Regular,
                in_pod_group: false,
                responders: Vec::new(),
            };
        }
        let deletion = pod.metadata.deletion_timestamp.as_ref().map(|t| t.0);
        let presence = match (classify::is_terminal(pod), deletion) {
            (true, d) => Presence::Terminal {
                deletion_timestamp: d,
            },
            (false, Some(d)) => Presence::Terminating {
                deletion_timestamp: d,
                removed_at_once: pod.metadata.deletion_grace_period_seconds == Some(0),
            },
            _ => Presence::Running,
        };
        if !matches!(presence, Presence::Running) {
            memory.evicted.remove(uid);
        }
        let kind = if classify::is_static_mirror(pod) {
            PodKind::Mirror
        } else if classify::daemonset_controller(pod).is_some() {
            PodKind::DaemonSet
        } else {
            PodKind::Regular
        };
        let spec = pod.spec.as_ref();
        // Before 1.37 the pod API has no evictionResponders: the annotation stands in.
        let check = crate::plan::intree::check_responders(
            spec.and_then(|s| s.eviction_responders.as_deref()),
            pod.metadata.annotations.as_ref(),
            crate::api::INTERCEPTOR_ANNOTATION_PREFIX,
            false,
        );
        memory.problems = check.problems;
        PodFacts {
            presence,
            kind,
            in_pod_group: spec.is_some_and(|s| s.scheduling_group.is_some()),
            responders: check.responders,
        }
    }

    /// Writes `decision`.
    async fn apply(
        &self,
        namespace: &str,
        decision: &Decision,
        known: &[Eviction],
        memory: &mut Memory,
    ) -> Result<()> {
        let api = self.api.evictions(&self.client, Some(namespace));
        if let Some(new) = &decision.create {
            let mut new = new.clone();
            new.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(NODE_LABEL.to_owned(), self.node.clone());
            let status = new.status.take();
            let name = new.metadata.name.clone().unwrap_or_default();
            let created = api
                .create(&PostParams::default(), &self.api.to_dynamic(&new)?)
                .await
                .with_context(|| format!("creating Eviction {namespace}/{name}"))?;
            info!(node = %self.node, eviction = %format!("{namespace}/{name}"), "created an Eviction");
            let created: Eviction = typed(&created)?;
            self.remember(memory, &created);
            if let Some(status) = status {
                self.write_status(&api, &created, json!(status), memory)
                    .await?;
            }
        }
        for (name, metadata) in &decision.eviction_metadata {
            let mut labels = metadata.labels.clone();
            labels.insert(NODE_LABEL.to_owned(), self.node.clone());
            let patch = json!({"metadata": {"labels": labels, "ownerReferences": metadata.owner_references}});
            let written = api
                .patch(name, &params(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("labelling Eviction {namespace}/{name}"))?;
            self.remember(memory, &typed(&written)?);
        }
        for (name, status) in &decision.eviction_statuses {
            let Some(old) = known
                .iter()
                .find(|e| e.metadata.name.as_deref() == Some(name))
            else {
                continue;
            };
            self.write_status(&api, old, json!(status), memory).await?;
        }
        let request_api = self.api.requests(&self.client, Some(namespace));
        for (name, status) in &decision.request_statuses {
            // Only the controller writes a request's status: no precondition needed.
            let patch = json!({"status": status});
            let r = request_api
                .patch_status(name, &params(), &Patch::Merge(&patch))
                .await;
            match gateway::reply(r) {
                Ok(_) => {}
                Err(f) if f.is(Kind::NotFound) => {}
                Err(f) => {
                    return Err(f
                        .context(format!(
                            "writing the status of EvictionRequest {namespace}/{name}"
                        ))
                        .into())
                }
            }
        }
        Ok(())
    }

    /// Replaces the status of `eviction`, refused when it changed since it was read.
    async fn write_status(
        &self,
        api: &Api<DynamicObject>,
        eviction: &Eviction,
        status: serde_json::Value,
        memory: &mut Memory,
    ) -> Result<Eviction> {
        let name = eviction.metadata.name.clone().unwrap_or_default();
        let patch = json!({
            "metadata": {"resourceVersion": eviction.metadata.resource_version},
            "status": status,
        });
        let r = api
            .patch_status(&name, &params(), &Patch::Merge(&patch))
            .await;
        let written = match gateway::reply(r) {
            Ok(written) => written,
            Err(f) => {
                if f.is(Kind::NotFound) {
                    // Collected (with its requests and pod): forget what was written to it.
                    memory.written.remove(&object_key(&eviction.metadata));
                }
                return Err(f
                    .context(format!("writing the status of Eviction {name}"))
                    .into());
            }
        };
        let written: Eviction = typed(&written)?;
        self.remember(memory, &written);
        Ok(written)
    }

    fn remember(&self, memory: &mut Memory, eviction: &Eviction) {
        memory.written.insert(
            object_key(&eviction.metadata),
            self.written(eviction.clone()),
        );
    }

    fn lock_log(&self) -> std::sync::MutexGuard<'_, WatchLog> {
        // The log holds no invariant a panicking holder could break halfway.
        self.watch_log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn written<K>(&self, copy: K) -> Written<K> {
        self.lock_log().written(copy)
    }

    /// What a watch delivered, by UID (requests and Evictions in one log; UIDs are unique).
    /// An object without a resourceVersion is said, at debug: its Apply is still taken.
    fn log_delivery(&self, event: &watcher::Event<DynamicObject>) {
        let mut log = self.lock_log();
        let uid = |o: &DynamicObject| o.metadata.uid.clone().unwrap_or_default();
        match event {
            watcher::Event::Init => log.listing(LISTS),
            watcher::Event::InitApply(o) => {
                let rv = o.metadata.resource_version.as_deref();
                if rv.is_none() {
                    warn!(node = %self.node, object = %object_key(&o.metadata), "a lifecycle.nodegrace.dev object listed without a resourceVersion: this controller's own writes stand in for it until the watch delivers them");
                }
                log.listed(LISTS, &uid(o), rv);
            }
            watcher::Event::Apply(o) => {
                log.delivered(&uid(o), o.metadata.resource_version.as_deref())
            }
            watcher::Event::Delete(o) => log.deleted(&uid(o)),
            watcher::Event::InitDone => {}
        }
    }

    /// Logs each problem once, and records it as a Warning event on the pod (`reason`).
    fn tell(
        &self,
        pod: Option<&Pod>,
        uid: &str,
        reason: &str,
        problems: &[String],
        memory: &mut Memory,
    ) {
        for problem in problems {
            if !memory.told.insert(format!("{uid}/{problem}")) {
                continue;
            }
            let key = pod.map(|p| {
                PodKey::new(
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default(),
                    uid,
                )
            });
            warn!(node = %self.node, pod = %key.as_ref().map(ToString::to_string).unwrap_or_default(), pod_uid = %uid, "{reason}: {problem}");
            if let Some(key) =
                key.filter(|_| pod.and_then(|p| p.metadata.uid.as_deref()) == Some(uid))
            {
                warn_on_pod(&self.recorder, &key, reason, "Evict", problem);
            }
        }
    }
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// The controller's three watches share one count of lists in its log (an `Init` event names
/// no watch): an object listed after a list of any of them began is taken as listed after
/// the controller's write, though its own list may have begun before.
const LISTS: &str = "lifecycle";

/// Puts this node's own last writes (`written`, by `namespace/name`) over the watch cache's
/// older copies of the objects in `namespace` that `about` selects, and forgets those the
/// cache has caught up with.
fn overlay<K: kube::Resource + Clone>(
    log: &WatchLog,
    cached: &mut Vec<K>,
    written: &mut HashMap<String, Written<K>>,
    namespace: &str,
    about: impl Fn(&K) -> bool,
) {
    let prefix = format!("{namespace}/");
    written.retain(|key, w| {
        let mine = &w.copy;
        if !key.starts_with(&prefix) || !about(mine) {
            return true;
        }
        let uid = mine.meta().uid.clone().unwrap_or_default();
        match cached
            .iter_mut()
            .find(|o| o.meta().name == mine.meta().name)
        {
            // Another object of the same name: ours was deleted.
            Some(c) if c.meta().uid != mine.meta().uid => false,
            Some(c)
                if log.fresher(&uid, Version::of(c.meta()), w, Version::of(mine.meta()))
                    == Fresher::Watched =>
            {
                false
            }
            Some(c) => {
                *c = mine.clone();
                true
            }
            None => {
                cached.push(mine.clone());
                true
            }
        }
    });
}

fn object_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// An Eviction of the pod with `uid` that is still running.
fn is_open_for(eviction: &Eviction, uid: &str) -> bool {
    eviction
        .spec
        .target
        .pod
        .as_ref()
        .is_some_and(|p| p.uid == uid)
        && !crate::plan::evictions::eviction_is_final(eviction)
}

/// The pod an EvictionRequest or Eviction is about.
fn target_of(object: &DynamicObject) -> Option<Target> {
    let ns = object.metadata.namespace.clone()?;
    let name = object.data.pointer("/spec/target/pod/name")?.as_str()?;
    Some((ns, name.to_owned()))
}

/// The pod name a request about the pod `uid` gives (the pod may be gone from the cache).
fn requested_name(caches: &Caches, namespace: &str, uid: &str) -> Option<String> {
    [&caches.ours, &caches.unclaimed]
        .into_iter()
        .flat_map(|s| s.state())
        .find(|o| {
            o.metadata.namespace.as_deref() == Some(namespace)
                && o.data
                    .pointer("/spec/target/pod/uid")
                    .and_then(|v| v.as_str())
                    == Some(uid)
        })
        .and_then(|o| target_of(&o).map(|(_, name)| name))
}

async fn recv_opt(rx: &mut Option<mpsc::UnboundedReceiver<Message>>) -> Option<Message> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn all_targets(caches: &Caches) -> Vec<Target> {
    [&caches.ours, &caches.unclaimed, &caches.evictions]
        .into_iter()
        .flat_map(|s| s.state())
        .filter_map(|o| target_of(&o))
        .collect()
}
