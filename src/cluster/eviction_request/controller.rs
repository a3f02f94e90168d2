//! The eviction-request controller for this node's pods: [`Reconciler`] carries out
//! [`decide`](super::decide::decide) for one request, [`Controller`] drives it from two
//! watches of EvictionRequests (those labelled for this node, and the unlabelled ones that
//! another requester made, until their pod's node labels them), pod changes reported by the
//! drain engine, and tokio timers for heartbeat deadlines and eviction back-off. Nothing
//! polls. Requests labelled for other nodes, and their status writes, never reach this
//! node.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::decide::{self, Action, EvictionResult, Inputs, Release, Transition};
use super::gate::EvictorGate;
use super::work::{Caches, Key, Owned, Queue, Ready, Watch, Work};
use super::{Intent, PodState, WallClock, NODE_LABEL};
use crate::api::EvictionRequest;
use crate::cluster::backoff::WatchBackoff;
use crate::cluster::{api_error_code, evict, Slim, FIELD_MANAGER};
use crate::config::Settings;
use crate::plan::reachability::Window;

/// Decide-and-write rounds in one reconcile (each write is followed by a fresh decision).
const MAX_ROUNDS: usize = 8;

#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// This node: requests labelled for it, or whose pod is in its pod cache, are its own.
    pub node: String,
    /// Cap of the exponential back-off after failed evictions.
    pub backoff_max: Duration,
    pub clock: WallClock,
    /// Requests reconciled at once.
    pub concurrency: usize,
}

impl ControllerConfig {
    /// `node` is the resolved node name (`Settings::node_name`): `node.name` is empty by
    /// default and must never be used as it is.
    pub(crate) fn from_settings(settings: &Settings, node: &str) -> Self {
        Self {
            node: node.to_owned(),
            backoff_max: settings.drain.eviction_backoff_max,
            clock: WallClock::System,
            concurrency: settings.drain.max_concurrent_requests,
        }
    }
}

/// Told what blocks the eviction of a pod (by UID): `Some` with the budget or the
/// apiserver's message after a refusal, `None` once it is evicted or gone. The drain engine
/// names the blocker on the NodeMaintenance, as it does for its own evictions.
pub(crate) type BlockSink = Arc<dyn Fn(&str, Option<String>) + Send + Sync>;

/// Carries out the decisions for one EvictionRequest at a time.
pub struct Reconciler {
    client: Client,
    /// Evictions go through this one: the kubelet's credential in the daemon, which
    /// NodeRestriction confines to the node's own pods.
    evictor: Client,
    clock: WallClock,
    recorder: Recorder,
    backoff_max: Mutex<Duration>,
    /// Per request (`namespace/name`): no eviction attempt before this.
    not_before: Mutex<HashMap<String, Timestamp>>,
    /// Per request: the pod UID whose eviction the apiserver accepted. The pod watch may
    /// show its deletionTimestamp a moment later; until then it is not evicted again.
    evicted: Mutex<HashMap<String, String>>,
    blocks: Option<BlockSink>,
    intent: Option<Intent>,
    gate: EvictorGate,
}

/// What one reconcile left behind.
#[derive(Debug, Clone, Default)]
pub struct Reconciled {
    /// The request as last written, when a status write happened.
    pub written: Option<EvictionRequest>,
    /// Reconcile again after this long (a heartbeat deadline, the end of a back-off),
    /// even if nothing changes.
    pub recheck_after: Option<Duration>,
}

fn key_of(request: &EvictionRequest) -> String {
    format!(
        "{}/{}",
        request.metadata.namespace.as_deref().unwrap_or_default(),
        request.metadata.name.as_deref().unwrap_or_default()
    )
}

fn until(now: Timestamp, then: Timestamp) -> Duration {
    then.duration_since(now)
        .max(k8s_openapi::jiff::SignedDuration::ZERO)
        .unsigned_abs()
}

impl Reconciler {
    pub fn new(client: Client, config: &ControllerConfig) -> Self {
        let recorder = crate::cluster::event_recorder(client.clone(), &config.node);
        let (backoff_max, clock) = (config.backoff_max, config.clock);
        Self {
            evictor: client.clone(),
            client,
            clock,
            recorder,
            backoff_max: Mutex::new(backoff_max),
            not_before: Mutex::new(HashMap::new()),
            evicted: Mutex::new(HashMap::new()),
            blocks: None,
            intent: None,
            gate: EvictorGate::default(),
        }
    }

    /// Evicts with `client` (the kubelet's) instead of the client that writes requests.
    pub(crate) fn evicting_with(mut self, client: Client) -> Self {
        self.evictor = client;
        self
    }

    /// Labels an unlabelled request for `node` (its pod is in `node`'s pod cache) before
    /// this node acts on it: the admission policy lets a node write the status only of
    /// requests labelled for it. `None` when the request changed meanwhile.
    pub(crate) async fn claim(
        &self,
        request: &EvictionRequest,
        node: &str,
    ) -> Result<Option<EvictionRequest>> {
        let api: Api<EvictionRequest> = Api::namespaced(
            self.client.clone(),
            request.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": request.metadata.resource_version,
            "labels": {NODE_LABEL: node},
        }});
        let params = kube::api::PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..Default::default()
        };
        let name = request.metadata.name.as_deref().unwrap_or_default();
        match api
            .patch(name, &params, &kube::api::Patch::Merge(&patch))
            .await
        {
            Ok(claimed) => {
                info!(request = %key_of(request), node, "labelled an EvictionRequest of this node's pod for this node");
                Ok(Some(claimed))
            }
            Err(err) if matches!(api_error_code(&err), Some(409 | 404)) => Ok(None),
            Err(err) => {
                Err(err).with_context(|| format!("labelling EvictionRequest {}", key_of(request)))
            }
        }
    }

    /// A shorter cap under a shutdown deadline, the configured one otherwise.
    pub fn set_backoff_max(&self, cap: Duration) {
        *self.backoff_max.lock().unwrap_or_else(|p| p.into_inner()) = cap;
        // Pending back-offs longer than the new cap are cut short.
        let now = self.clock.now();
        let mut nb = self.not_before.lock().unwrap_or_else(|p| p.into_inner());
        for t in nb.values_mut() {
            let limit = now + cap;
            if *t > limit {
                *t = limit;
            }
        }
    }

    fn backoff_max(&self) -> Duration {
        *self.backoff_max.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn not_before(&self, key: &str) -> Option<Timestamp> {
        self.not_before
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
    }

    /// The status to write after an eviction answer (None: nothing to write), keeping the
    /// back-off it asks for.
    fn status_after_eviction(
        &self,
        key: &str,
        current: &EvictionRequest,
        released: Option<&(String, Release)>,
        result: &EvictionResult,
        now: Timestamp,
    ) -> Option<crate::api::EvictionRequestStatus> {
        let (status, retry) =
            decide::after_eviction(current, released, result, now, self.backoff_max());
        self.set_not_before(key, retry.map(|d| now + d));
        status
    }

    fn set_not_before(&self, key: &str, at: Option<Timestamp>) {
        let mut nb = self.not_before.lock().unwrap_or_else(|p| p.into_inner());
        match at {
            Some(at) => nb.insert(key.to_owned(), at),
            None => nb.remove(key),
        };
    }

    /// Forgets a deleted request.
    pub(crate) fn forget(&self, request: &EvictionRequest) {
        let key = key_of(request);
        self.set_not_before(&key, None);
        self.evicted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
    }

    /// Brings `request` one step further given its pod (`None` when the pod is not in the
    /// node's pod cache, a synced watch of the node's pods: it is gone).
    pub async fn reconcile(
        &self,
        request: &EvictionRequest,
        pod: Option<&Pod>,
    ) -> Result<Reconciled> {
        let key = key_of(request);
        let Some(pod_ref) = request.pod_ref().cloned() else {
            return Ok(Reconciled::default());
        };
        if request.is_complete() {
            self.set_not_before(&key, None);
            self.gate.forget(&pod_ref.uid);
            return Ok(Reconciled::default());
        }
        let namespace = request.metadata.namespace.clone().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.evictor.clone(), &namespace);
        let mut state = PodState::of(pod, &pod_ref.uid);
        if self.was_evicted(&key, &pod_ref.uid) && matches!(state, PodState::Present { .. }) {
            state = PodState::Terminating;
        }
        let pod_key = format!("{namespace}/{}", pod_ref.name);
        if matches!(state, PodState::Present { .. }) && self.reassert(request, &pod_key).await? {
            return Ok(Reconciled::default());
        }
        let mut current = request.clone();
        let mut written = None;
        // An eviction answer whose status write lost a race: recorded again on the fresh
        // request, never by evicting twice.
        let mut unrecorded: Option<(Option<(String, Release)>, EvictionResult)> = None;
        for _ in 0..MAX_ROUNDS {
            let now = self.clock.now();
            let mut event = None;
            let status = if let Some((released, result)) = unrecorded.take() {
                match self.status_after_eviction(&key, &current, released.as_ref(), &result, now) {
                    Some(status) => {
                        unrecorded = Some((released, result));
                        status
                    }
                    None => continue,
                }
            } else {
                let inputs = Inputs {
                    pod: state,
                    now,
                    eviction_not_before: self.not_before(&key),
                };
                match decide::decide(&current, &inputs) {
                    Action::Wait { recheck_at } => {
                        return Ok(Reconciled {
                            written,
                            recheck_after: recheck_at.map(|t| until(now, t)),
                        });
                    }
                    Action::WriteStatus { status, transition } => {
                        log_transition(&pod_key, &transition);
                        if matches!(transition, Transition::Completed(_)) {
                            self.set_not_before(&key, None);
                        }
                        event = transition_event(&transition, &status.message);
                        *status
                    }
                    Action::Evict { released } => {
                        let Some(_sending) = self.gate.sending(&pod_ref.uid) else {
                            // The drain deletes it at its deadline; the watch shows that soon.
                            return Ok(Reconciled {
                                written,
                                recheck_after: Some(Duration::from_secs(1)),
                            });
                        };
                        let result = self.evict(&pods, &pod_ref.name, &pod_ref.uid).await?;
                        log_eviction(&pod_key, released.as_ref(), &result, &current);
                        state = self.note_eviction(&key, &namespace, &pod_ref.uid, &result, state);
                        let status = self.status_after_eviction(
                            &key,
                            &current,
                            released.as_ref(),
                            &result,
                            now,
                        );
                        let Some(status) = status else {
                            continue;
                        };
                        event = eviction_event(&result, &status.message, &namespace);
                        unrecorded = Some((released, result));
                        status
                    }
                }
            };
            let mut next = current.clone();
            next.status = Some(status);
            match self.write_status(&next).await? {
                Some(stored) => {
                    unrecorded = None;
                    if let Some(event) = event {
                        self.publish(&stored, &event).await;
                    }
                    written = Some(stored.clone());
                    current = stored;
                }
                // Changed or deleted meanwhile: decide again on what is there now.
                None => match self.reread(&current, &key).await? {
                    Some(fresh) => current = fresh,
                    None => {
                        return Ok(Reconciled {
                            written,
                            recheck_after: None,
                        })
                    }
                },
            }
        }
        Ok(Reconciled {
            written,
            recheck_after: Some(Duration::from_secs(1)),
        })
    }

    /// When someone took this node's requester off the pod's request while a maintenance
    /// still wants the pod gone, asks again (the watch brings the request back here) and
    /// says so.
    async fn reassert(&self, request: &EvictionRequest, pod_key: &str) -> Result<bool> {
        let Some((intent, pod)) = self
            .intent
            .as_ref()
            .and_then(|i| Some((i, i.removed(request)?)))
        else {
            return Ok(false);
        };
        let again = intent.reassert(&pod).await?;
        tracing::info!(pod = %pod_key, outcome = ?again, "this node's requester was removed from the pod's EvictionRequest while a maintenance still targets the pod; requested again");
        Ok(true)
    }

    /// Passes an eviction's answer on to the engine (what blocks the pod) and returns the
    /// pod's state after it.
    fn note_eviction(
        &self,
        key: &str,
        namespace: &str,
        uid: &str,
        result: &EvictionResult,
        state: PodState,
    ) -> PodState {
        if let Some(sink) = &self.blocks {
            let by = match result {
                EvictionResult::Blocked {
                    budget: Some(b), ..
                } => Some(format!("PodDisruptionBudget {namespace}/{b}")),
                EvictionResult::Blocked { message, .. } | EvictionResult::Refused { message } => {
                    Some(message.clone())
                }
                EvictionResult::Accepted | EvictionResult::Gone => None,
            };
            sink(uid, by);
        }
        match result {
            EvictionResult::Accepted => {
                self.evicted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.to_owned(), uid.to_owned());
                PodState::Terminating
            }
            EvictionResult::Gone => PodState::Absent,
            _ => state,
        }
    }

    /// The request as stored now (None: deleted).
    async fn reread(
        &self,
        current: &EvictionRequest,
        key: &str,
    ) -> Result<Option<EvictionRequest>> {
        let namespace = current.metadata.namespace.clone().unwrap_or_default();
        let api: Api<EvictionRequest> = Api::namespaced(self.client.clone(), &namespace);
        let name = current.metadata.name.clone().unwrap_or_default();
        api.get_opt(&name)
            .await
            .with_context(|| format!("reading EvictionRequest {key}"))
    }

    /// Whether this controller's eviction of the pod `uid` (of request `key`) was accepted.
    fn was_evicted(&self, key: &str, uid: &str) -> bool {
        self.evicted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .is_some_and(|evicted| evicted == uid)
    }

    /// The Eviction API with the pod's UID as precondition; an apiserver refusal other
    /// than a budget's 429 (e.g. two budgets select the pod) is a failed attempt, not an
    /// error. Throttling is an error: no attempt was made.
    async fn evict(&self, pods: &Api<Pod>, name: &str, uid: &str) -> Result<EvictionResult> {
        match evict::evict(pods, name, uid, None).await {
            Ok(outcome) => Ok(outcome.into()),
            Err(err) if evict::anyhow_throttled(&err).is_some() => Err(err),
            Err(err) => match err.downcast_ref::<kube::Error>() {
                Some(kube::Error::Api(status)) => Ok(EvictionResult::Refused {
                    message: format!("{} ({})", status.message, status.code),
                }),
                _ => Err(err),
            },
        }
    }

    /// PUT /status guarded by the resourceVersion; `None` on 409 or 404.
    async fn write_status(&self, request: &EvictionRequest) -> Result<Option<EvictionRequest>> {
        let api: Api<EvictionRequest> = Api::namespaced(
            self.client.clone(),
            request.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let name = request.metadata.name.as_deref().unwrap_or_default();
        match api.replace_status(name, &params, request).await {
            Ok(stored) => Ok(Some(stored)),
            Err(err) if matches!(api_error_code(&err), Some(409 | 404)) => {
                debug!(request = %key_of(request), "EvictionRequest changed before its status write");
                Ok(None)
            }
            Err(err) => Err(err).with_context(|| {
                format!("writing the status of EvictionRequest {}", key_of(request))
            }),
        }
    }
}

impl Reconciler {
    /// Best effort: an event that cannot be written is logged, never fatal.
    async fn publish(&self, request: &EvictionRequest, event: &Event) {
        let reference = request.object_ref(&());
        if let Err(err) = self.recorder.publish(event, &reference).await {
            warn!(request = %key_of(request), reason = %event.reason, error = %err, "could not record an event");
        }
    }
}

fn transition_event(transition: &Transition, message: &str) -> Option<Event> {
    let (type_, reason, action) = match transition {
        Transition::HandedOver { .. } => (EventType::Normal, "InterceptorHandedOver", "HandOver"),
        Transition::NotEvictable => (EventType::Warning, "EvictionNotSupported", "Evict"),
        Transition::Selected { .. } | Transition::Completed(_) => return None,
    };
    Some(Event {
        type_,
        reason: reason.to_owned(),
        note: Some(message.to_owned()),
        action: action.to_owned(),
        secondary: None,
    })
}

/// Events for what went wrong; a successful eviction is no event (one per pod would be
/// hundreds per drain; the NodeMaintenance reports progress).
fn eviction_event(result: &EvictionResult, message: &str, namespace: &str) -> Option<Event> {
    let (type_, reason, secondary) = match result {
        EvictionResult::Accepted => return None,
        EvictionResult::Blocked { budget, .. } => (
            EventType::Warning,
            "EvictionBlocked",
            budget.as_ref().map(|name| ObjectReference {
                api_version: Some("policy/v1".to_owned()),
                kind: Some("PodDisruptionBudget".to_owned()),
                name: Some(name.clone()),
                namespace: Some(namespace.to_owned()),
                ..ObjectReference::default()
            }),
        ),
        EvictionResult::Refused { .. } => (EventType::Warning, "EvictionFailed", None),
        EvictionResult::Gone => return None,
    };
    Some(Event {
        type_,
        reason: reason.to_owned(),
        note: Some(message.chars().take(1024).collect()),
        action: "Evict".to_owned(),
        secondary,
    })
}

fn log_transition(pod: &str, transition: &Transition) {
    match transition {
        Transition::Selected { interceptor } => {
            info!(pod, interceptor = %interceptor, "interceptor selected")
        }
        Transition::HandedOver { from, to, why } => info!(
            pod,
            interceptor = %to,
            previous = %from,
            reason = ?why,
            "handed over to the next interceptor"
        ),
        Transition::Completed(why) => info!(pod, reason = ?why, "EvictionRequest complete"),
        Transition::NotEvictable => info!(
            pod,
            "no interceptor left; the Eviction API is not used for DaemonSet and mirror pods"
        ),
    }
}

fn log_eviction(
    pod: &str,
    released: Option<&(String, Release)>,
    result: &EvictionResult,
    request: &EvictionRequest,
) {
    let interceptor = released.map(|(name, _)| name.as_str()).unwrap_or("");
    match result {
        EvictionResult::Accepted => info!(pod, interceptor, "evicted through the Eviction API"),
        EvictionResult::Gone => info!(pod, "pod gone before its eviction"),
        EvictionResult::Blocked { budget, message } => warn!(
            pod,
            interceptor,
            budget = budget.as_deref().unwrap_or(""),
            failed = request.failed_api_evictions() + 1,
            "eviction blocked: {message}"
        ),
        EvictionResult::Refused { message } => warn!(
            pod,
            interceptor,
            failed = request.failed_api_evictions() + 1,
            "eviction refused: {message}"
        ),
    }
}

pub(super) enum Message {
    PodChanged {
        namespace: String,
        uid: String,
    },
    Created(Box<EvictionRequest>),
    /// This node's requester wrote a request of the `lifecycle` API (the write's answer).
    LifecycleRequested(Box<k8s_openapi::api::lifecycle::v1alpha1::EvictionRequest>),
    BackoffMax(Duration),
    Concurrency(usize),
}

/// Lets the drain engine feed the controller.
#[derive(Clone)]
pub struct ControllerHandle {
    tx: mpsc::UnboundedSender<Message>,
    gate: EvictorGate,
}

impl ControllerHandle {
    pub(super) fn from_sender(tx: mpsc::UnboundedSender<Message>, gate: EvictorGate) -> Self {
        Self { tx, gate }
    }

    /// The drain is about to DELETE the pod `uid` at its deadline: the controller's evictor
    /// leaves it from now on (returns once an eviction already sent is answered).
    pub(crate) async fn escalating(&self, uid: &str) {
        self.gate.escalating(uid).await;
    }

    /// A pod of this node changed or was deleted (call from the pod watch).
    pub fn pod_changed(&self, namespace: &str, uid: &str) {
        let _ = self.tx.send(Message::PodChanged {
            namespace: namespace.to_owned(),
            uid: uid.to_owned(),
        });
    }

    /// This node's requester created `request` (the create's answer): reconciled at once.
    pub(crate) fn created(&self, request: EvictionRequest) {
        let _ = self.tx.send(Message::Created(Box::new(request)));
    }

    /// This node's requester wrote `request` on the `lifecycle` API: looked at at once, not
    /// when the watch shows it (after an apiserver restart that can be seconds later).
    pub(crate) fn lifecycle_requested(
        &self,
        request: k8s_openapi::api::lifecycle::v1alpha1::EvictionRequest,
    ) {
        let _ = self.tx.send(Message::LifecycleRequested(Box::new(request)));
    }

    /// Changes the eviction back-off cap (shorter under a shutdown deadline).
    pub fn set_backoff_max(&self, cap: Duration) {
        let _ = self.tx.send(Message::BackoffMax(cap));
    }

    /// Changes how many requests are reconciled at once (a reloaded configuration).
    pub(crate) fn set_concurrency(&self, n: usize) {
        let _ = self.tx.send(Message::Concurrency(n.max(1)));
    }
}

/// Runs the eviction-request controller for this node's pods.
pub struct Controller {
    client: Client,
    node: String,
    pods: Store<Pod>,
    reconciler: Reconciler,
    concurrency: usize,
    rx: mpsc::UnboundedReceiver<Message>,
    /// The engine's: true while a shutdown drain runs (watches retry faster then).
    shutting_down: Arc<AtomicBool>,
}

impl Controller {
    /// Evicts with `client` (the kubelet's credential in the daemon).
    pub(crate) fn evicting_with(mut self, client: Client) -> Self {
        self.reconciler = self.reconciler.evicting_with(client);
        self
    }

    /// Puts this node's requester back on requests someone took it off while the drain
    /// still wants their pods evicted.
    pub fn reasserting(mut self, intent: Intent) -> Self {
        self.reconciler.intent = Some(intent);
        self
    }

    /// Retries its watches as the engine does while `shutting_down` (the engine's flag).
    pub(crate) fn retrying_as_in_shutdown_when(mut self, shutting_down: Arc<AtomicBool>) -> Self {
        self.shutting_down = shutting_down;
        self
    }

    /// Reports what blocks each pod's eviction to `sink` (the drain engine).
    pub(crate) fn reporting_blocks_to(mut self, sink: BlockSink) -> Self {
        self.reconciler.blocks = Some(sink);
        self
    }

    /// A controller for `config.node`'s pods; `pods` is the node's pod cache (a reflector of
    /// the pods bound to the node). Feed pod changes through the returned handle.
    pub fn new(
        client: Client,
        pods: Store<Pod>,
        config: ControllerConfig,
    ) -> (Self, ControllerHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let reconciler = Reconciler::new(client.clone(), &config);
        let gate = reconciler.gate.clone();
        (
            Self {
                client,
                node: config.node,
                pods,
                reconciler,
                concurrency: config.concurrency.max(1),
                rx,
                shutting_down: Arc::new(AtomicBool::new(false)),
            },
            ControllerHandle { tx, gate },
        )
    }
}

impl Controller {
    /// Runs a controller that watches this node's pods itself (field selector
    /// `spec.nodeName`), for a caller with no pod cache to share.
    pub async fn run_with_own_pod_watch(
        client: Client,
        config: ControllerConfig,
        shutdown: CancellationToken,
    ) -> Result<()> {
        let (pods, writer) = reflector::store::<Pod>();
        let selector = format!("spec.nodeName={}", config.node);
        let (controller, handle) = Controller::new(client.clone(), pods, config);
        let pod_events = reflector::reflector(
            writer,
            watcher(
                Api::<Pod>::all(client),
                watcher::Config::default().fields(&selector),
            ),
        )
        .default_backoff();
        let feed = async move {
            let mut pod_events = std::pin::pin!(pod_events);
            while let Some(event) = pod_events.next().await {
                match event {
                    Ok(
                        watcher::Event::Apply(p)
                        | watcher::Event::InitApply(p)
                        | watcher::Event::Delete(p),
                    ) => handle.pod_changed(
                        p.metadata.namespace.as_deref().unwrap_or_default(),
                        p.metadata.uid.as_deref().unwrap_or_default(),
                    ),
                    Ok(_) => {}
                    Err(err) => warn!(error = %err, "pod watch failed; retrying"),
                }
            }
        };
        tokio::select! {
            result = controller.run(shutdown) => result,
            () = feed => anyhow::bail!("the pod watch ended"),
        }
    }
}

impl Controller {
    /// Watches the EvictionRequests labelled for this node and the unlabelled ones, and
    /// reconciles this node's until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let Controller {
            client,
            node,
            pods,
            reconciler,
            concurrency,
            rx,
            shutting_down,
        } = self;
        // A request whose pod is not in a synced cache is complete: wait for the sync.
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            r = pods.wait_until_ready() => r.context("the node's pod watch ended")?,
        }
        let mut rx = Some(rx);
        let api: Api<EvictionRequest> = Api::all(client);
        let watch = |selector: String| {
            let (cache, writer) = reflector::store();
            let events = reflector::reflector(
                writer,
                watcher(api.clone(), watcher::Config::default().labels(&selector))
                    .modify(EvictionRequest::slim),
            )
            .backoff(WatchBackoff::new(shutting_down.clone()));
            (cache, events)
        };
        let (ours, ours_events) = watch(format!("{NODE_LABEL}={node}"));
        let (unclaimed, unclaimed_events) = watch(format!("!{NODE_LABEL}"));
        let mut events = futures::stream::select(
            ours_events.map(|e| (Watch::Ours, e)),
            unclaimed_events.map(|e| (Watch::Unclaimed, e)),
        )
        .boxed();
        info!(node = %node, "eviction-request controller started");
        let mut work = Work {
            this: Owned { node, pods },
            cache: Caches { ours, unclaimed },
            queue: Queue::default(),
            written: HashMap::new(),
            in_flight: HashSet::new(),
            again: HashSet::new(),
            awaiting_collector: HashMap::new(),
            window: Window::new(concurrency),
            shutting_down,
        };
        let mut running = futures::stream::FuturesUnordered::new();
        loop {
            while running.len() < work.window.limit() {
                let Some(ready) = work.next_ready() else {
                    break;
                };
                running.push(reconcile_one(&reconciler, work.this.node.clone(), ready));
            }
            let next_timer = work.queue.next_timer();
            tokio::select! {
                () = shutdown.cancelled() => {
                    info!("eviction-request controller stopped");
                    return Ok(());
                }
                Some((key, result)) = running.next(), if !running.is_empty() => {
                    work.finished(key, result);
                }
                event = events.next() => work.watched(&reconciler, event)?,
                message = recv_opt(&mut rx) => match message {
                    Some(Message::PodChanged { namespace, uid }) => {
                        let key = (namespace, uid);
                        if work.cache.get(&key).is_some() {
                            work.queue.push(key);
                        }
                    }
                    Some(Message::Created(request)) => work.created(*request),
                    Some(Message::LifecycleRequested(_)) => {}
                    Some(Message::Concurrency(n)) => work.window.set_max(n),
                    Some(Message::BackoffMax(cap)) => {
                        reconciler.set_backoff_max(cap);
                        work.requeue_all();
                    }
                    // Every handle dropped: no more pod changes, keep watching requests.
                    None => rx = None,
                },
                () = sleep_until_opt(next_timer) => work.queue.fire_due(Instant::now()),
            }
        }
    }
}

/// Reconciles one request, labelling it for this node first when it is unclaimed.
async fn reconcile_one(
    reconciler: &Reconciler,
    node: String,
    ready: Ready,
) -> (Key, Result<Reconciled>) {
    let Ready {
        key,
        request,
        pod,
        claim,
    } = ready;
    let result = async {
        if !claim {
            return reconciler.reconcile(&request, pod.as_deref()).await;
        }
        let Some(claimed) = reconciler.claim(&request, &node).await? else {
            return Ok(Reconciled {
                written: None,
                recheck_after: Some(Duration::from_secs(1)),
            });
        };
        let mut done = reconciler.reconcile(&claimed, pod.as_deref()).await?;
        done.written.get_or_insert(claimed);
        Ok(done)
    }
    .await;
    (key, result)
}

async fn recv_opt(rx: &mut Option<mpsc::UnboundedReceiver<Message>>) -> Option<Message> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
