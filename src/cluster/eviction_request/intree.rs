//! nodegrace as a requester of the in-tree EvictionRequest API (`lifecycle.k8s.io/v1alpha1`,
//! Kubernetes 1.37, gate `EvictionRequestAPI`). One EvictionRequest per pod
//! (`nodegrace-<pod UID>`, requester [`crate::plan::intree::requester_key`], intent
//! `Eviction`; `Withdrawn` when the maintenance ends); the in-tree eviction-request controller
//! makes the pod's `Eviction`, picks its responders and its imperative evictor calls the
//! Eviction API. nodegrace follows the Evictions labelled with its key and tells the drain
//! what holds each pod; the deadline escalation (DELETE) is the drain's, as on every path.
//! DaemonSet and mirror pods never go this way (the in-tree evictor skips them).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::lifecycle::v1alpha1::{
    Eviction, EvictionRequest, EvictionRequestPodReference, EvictionRequestSpec,
    EvictionRequestTarget,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{BlockSink, PodKey, PodState, NODE_LABEL};
use crate::cluster::backoff::backed_off;
use crate::cluster::evict::{self, Outcome};
use crate::cluster::gateway::{self, Kind};
use crate::cluster::terminate::{EvictionApi, PodTerminator, Request};
use crate::cluster::FIELD_MANAGER;
use crate::metrics::{Metrics, TerminationMethod};
use crate::plan::intree::{
    check_responders, evictor_refusals, read_eviction, read_request, request_name, respond,
    Progress as EvictionProgress, Response, INTENT_EVICTION, INTENT_WITHDRAWN,
};
use crate::plan::PodInfo;

const GROUP_VERSION: &str = "lifecycle.k8s.io/v1alpha1";

/// Whether the apiserver serves both `evictionrequests` and `evictions` of
/// `lifecycle.k8s.io/v1alpha1`.
pub(crate) async fn is_served(client: &Client) -> Result<bool> {
    match gateway::reply(client.list_api_group_resources(GROUP_VERSION).await) {
        Ok(list) => {
            let has = |n: &str| list.resources.iter().any(|r| r.name == n);
            Ok(has("evictionrequests") && has("evictions"))
        }
        Err(f) if f.is(Kind::NotFound) => Ok(false),
        Err(f) => Err(f
            .context(format!("discovering the {GROUP_VERSION} API group"))
            .into()),
    }
}

/// The EvictionRequests (of `namespace`, or all), read as objects that may not decode: one
/// that does not is skipped where it is met, not a failed list or watch.
fn requests(client: &Client, namespace: Option<&str>) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<EvictionRequest>(&());
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

fn evictions(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<Eviction>(&()))
}

/// A lifecycle object as its type.
fn typed<T: serde::de::DeserializeOwned>(object: &DynamicObject) -> Result<T> {
    let value = serde_json::to_value(object).context("serializing a lifecycle object")?;
    serde_json::from_value(value).with_context(|| {
        format!(
            "reading {} {} as a lifecycle object",
            object.types.as_ref().map_or("", |t| t.kind.as_str()),
            object.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

/// What this requester asked, shared by the drain's requests and the watch of their
/// progress.
#[derive(Default)]
struct Asked {
    /// Pod UID -> (pod, maintenances that asked for it).
    wanted: HashMap<String, (PodKey, BTreeSet<String>)>,
    /// Maintenances seen asking since this daemon started.
    seen: BTreeSet<String>,
    /// Pods whose responder declarations were already complained about.
    checked: HashSet<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The drain's [`PodTerminator`] on a cluster serving the in-tree API.
pub(crate) struct InTreeTerminator {
    /// Writes the EvictionRequests (nodegrace's identity).
    client: Client,
    /// Evictions and DELETEs (the kubelet's credential in the daemon): every pod that is not
    /// asked through a request, every escalation and mirror pod.
    direct: EvictionApi,
    /// The same credential, for the evictions after a refused request.
    evictor: Client,
    node: String,
    key: String,
    asked: Arc<Mutex<Asked>>,
    /// Warning events on pods (nodegrace's identity).
    recorder: Recorder,
}

impl InTreeTerminator {
    pub(crate) fn new(client: Client, evictor: Client, node: &str) -> Self {
        Self {
            direct: EvictionApi::new(evictor.clone()),
            evictor,
            node: node.to_owned(),
            key: crate::plan::intree::requester_key(node),
            asked: Arc::default(),
            recorder: crate::cluster::event_recorder(client.clone(), node),
            client,
        }
    }

    /// The requester key (`spec.requester`).
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The watch of this requester's Evictions, reporting to the drain through `blocks`.
    pub(crate) fn progress(&self, blocks: BlockSink, metrics: Metrics) -> Progress {
        Progress {
            metrics,
            client: self.client.clone(),
            evictor: self.evictor.clone(),
            key: self.key.clone(),
            own_selector: crate::plan::own::own_selector(&self.node),
            asked: self.asked.clone(),
            blocks,
            recorder: self.recorder.clone(),
        }
    }

    fn requests(&self, namespace: &str) -> Api<DynamicObject> {
        requests(&self.client, Some(namespace))
    }

    /// Whether `pod` declares eviction responders (`spec.evictionResponders`); what is wrong
    /// with its declaration is said once per pod.
    fn declares_responders(&self, key: &PodKey, pod: &Pod) -> bool {
        let field = pod
            .spec
            .as_ref()
            .and_then(|s| s.eviction_responders.as_deref());
        let check = check_responders(field);
        if lock(&self.asked).checked.insert(key.uid.clone()) {
            for problem in &check.problems {
                warn!(node = %self.node, pod = %key, "eviction responders: {problem}");
                warn_on_pod(
                    &self.recorder,
                    key,
                    "EvictionResponderInvalid",
                    "RequestEviction",
                    problem,
                );
            }
        }
        !check.responders.is_empty()
    }

    /// Creates the pod's EvictionRequest, or turns an existing one back to intent Eviction.
    async fn request(&self, key: &PodKey) -> Result<()> {
        let api = self.requests(&key.namespace);
        let name = request_name(&key.uid);
        let mut labels = std::collections::BTreeMap::new();
        if let Some(value) = crate::plan::own::node_label_value(&self.node) {
            labels.insert(NODE_LABEL.to_owned(), value.to_owned());
        }
        let request = EvictionRequest {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(key.namespace.clone()),
                labels: Some(labels),
                // Garbage collected with the pod.
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Pod".to_owned(),
                    name: key.name.clone(),
                    uid: key.uid.clone(),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            spec: EvictionRequestSpec {
                intent: INTENT_EVICTION.to_owned(),
                requester: self.key.clone(),
                target: EvictionRequestTarget {
                    pod: Some(EvictionRequestPodReference {
                        name: key.name.clone(),
                        uid: key.uid.clone(),
                    }),
                },
            },
            status: None,
        };
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let request: DynamicObject = serde_json::to_value(&request)
            .and_then(serde_json::from_value)
            .context("serializing an EvictionRequest")?;
        match gateway::reply(api.create(&params, &request).await) {
            Ok(_) => {
                info!(node = %self.node, pod = %key, requester = %self.key, "created the pod's EvictionRequest");
                return Ok(());
            }
            Err(f) if f.is(Kind::Conflict) => {}
            Err(f) => {
                return Err(f
                    .context(format!("creating the EvictionRequest of pod {key}"))
                    .into())
            }
        }
        self.set_intent(&api, &name, key, INTENT_EVICTION).await
    }

    async fn set_intent(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        key: &PodKey,
        intent: &str,
    ) -> Result<()> {
        let patch = json!({"spec": {"intent": intent}});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match gateway::reply(api.patch(name, &params, &Patch::Merge(&patch)).await) {
            Ok(_) => {
                info!(node = %self.node, pod = %key, intent, "set the intent of the pod's EvictionRequest");
                Ok(())
            }
            Err(f) if f.is(Kind::NotFound) && intent == INTENT_WITHDRAWN => Ok(()),
            Err(f) => Err(f
                .context(format!(
                    "setting intent {intent} on the EvictionRequest of pod {key}"
                ))
                .into()),
        }
    }

    fn record(&self, key: PodKey, maintenance: &str) {
        let mut asked = lock(&self.asked);
        asked
            .wanted
            .entry(key.uid.clone())
            .or_insert_with(|| (key, BTreeSet::new()))
            .1
            .insert(maintenance.to_owned());
        asked.seen.insert(maintenance.to_owned());
    }

    fn release(&self, maintenance: &str) -> Vec<PodKey> {
        let mut released = Vec::new();
        lock(&self.asked).wanted.retain(|_, (pod, by)| {
            if by.remove(maintenance) && by.is_empty() {
                released.push(pod.clone());
                return false;
            }
            true
        });
        released
    }

    /// This node's requests with intent Eviction (what a restarted daemon may have left).
    async fn own_requests(&self) -> Result<Vec<PodKey>> {
        let Some(mine) = crate::plan::own::own_selector(&self.node) else {
            return Ok(Vec::new());
        };
        let list = requests(&self.client, None)
            .list(&ListParams::default().labels(&mine))
            .await
            .context("listing this node's EvictionRequests")?;
        let requests: Vec<EvictionRequest> =
            list.items.iter().filter_map(|r| typed(r).ok()).collect();
        Ok(requests
            .iter()
            .filter(|r| r.spec.requester == self.key && r.spec.intent == INTENT_EVICTION)
            .filter_map(|r| {
                let pod = r.spec.target.pod.as_ref()?;
                Some(PodKey::new(
                    r.metadata.namespace.as_deref()?,
                    &pod.name,
                    &pod.uid,
                ))
            })
            .collect())
    }
}

#[async_trait]
impl PodTerminator for InTreeTerminator {
    async fn connect(&self) {
        self.direct.connect().await;
    }

    async fn terminate(
        &self,
        pod: &PodInfo,
        object: Option<&Pod>,
        request: Request,
        maintenance: &str,
    ) -> Result<Outcome> {
        if request == Request::Cooperative {
            let key = PodKey::from(pod);
            let object = object.filter(|o| o.metadata.uid.as_deref() == Some(&pod.uid));
            match PodState::of(object, &pod.uid) {
                PodState::Absent | PodState::Terminal => return Ok(Outcome::Gone),
                // A pod no responder answers for is what the imperative evictor would evict
                // at once: the Eviction API directly, without the objects. The in-tree
                // evictor skips DaemonSet and mirror pods: they stay nodegrace's.
                PodState::Terminating | PodState::Present { evictable: true }
                    if object.is_some_and(|o| self.declares_responders(&key, o)) =>
                {
                    self.request(&key).await?;
                    self.record(key, maintenance);
                    return Ok(Outcome::Accepted);
                }
                _ => {}
            }
        }
        self.direct
            .terminate(pod, object, request, maintenance)
            .await
    }

    async fn withdraw(&self, maintenance: &str) -> Result<()> {
        let mut pods = self.release(maintenance);
        let seen = lock(&self.asked).seen.remove(maintenance);
        if !seen {
            // Asked before this daemon (re)started: withdraw what no maintenance wants since.
            let wanted: BTreeSet<String> = lock(&self.asked).wanted.keys().cloned().collect();
            pods.extend(
                self.own_requests()
                    .await?
                    .into_iter()
                    .filter(|p| !wanted.contains(&p.uid)),
            );
        }
        let mut first_error = None;
        for pod in pods {
            let api = self.requests(&pod.namespace);
            let name = request_name(&pod.uid);
            if let Err(err) = self.set_intent(&api, &name, &pod, INTENT_WITHDRAWN).await {
                warn!(node = %self.node, pod = %pod, maintenance, error = crate::cluster::error_text(&err), "withdrawing an eviction request failed");
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn delete_mirror(&self, pod: &PodInfo) -> Result<Outcome> {
        self.direct.delete_mirror(pod).await
    }

    /// A pod without responders was evicted through the Eviction API directly: only the pods
    /// asked for through a request are counted as such.
    fn method(&self, pod: &PodInfo, request: Request) -> TerminationMethod {
        match request {
            Request::Cooperative if lock(&self.asked).wanted.contains_key(&pod.uid) => {
                TerminationMethod::EvictionRequest
            }
            Request::Cooperative => TerminationMethod::Eviction,
            Request::Delete { .. } => TerminationMethod::Delete,
        }
    }
}

/// Follows the Evictions labelled with this requester's key (the in-tree controller labels
/// each Eviction with its requesters' keys) and tells the drain what holds each pod.
pub(crate) struct Progress {
    client: Client,
    evictor: Client,
    key: String,
    /// The label selector of this node's requests (none for a node name too long for a label).
    own_selector: Option<String>,
    asked: Arc<Mutex<Asked>>,
    blocks: BlockSink,
    recorder: Recorder,
    /// Counts the refusals the Evictions report and those of nodegrace's own direct
    /// evictions (`nodegrace_evictions_refused_total`).
    metrics: Metrics,
}

impl Progress {
    /// Runs until `stop`. `under_way` shortens the watch's retry delays during a shutdown.
    pub(crate) async fn run(self, stop: CancellationToken, under_way: watch::Receiver<bool>) {
        let eviction_events = backed_off(
            watcher(
                evictions(&self.client),
                watcher::Config::default().labels(&self.key),
            ),
            under_way.clone(),
        )
        .map(Watched::Eviction);
        // Its own requests too: a request the in-tree controller refuses (EvictionInvalid)
        // gets no Eviction at all.
        let request_events = match &self.own_selector {
            Some(mine) => backed_off(
                watcher(
                    requests(&self.client, None),
                    watcher::Config::default().labels(mine),
                ),
                under_way,
            )
            .map(Watched::Request)
            .boxed(),
            None => futures::stream::pending().boxed(),
        };
        let mut events = futures::stream::select(eviction_events.boxed(), request_events);
        let mut seen = Seen::default();
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                e = events.next() => e,
            };
            match event {
                Some(Watched::Eviction(Ok(
                    watcher::Event::Apply(e) | watcher::Event::InitApply(e),
                ))) => {
                    if let Some(e) = self.read::<Eviction>(&e) {
                        self.observed(&e, &mut seen).await;
                    }
                }
                // Collected with its request and pod: forget the pod.
                Some(Watched::Eviction(Ok(watcher::Event::Delete(e)))) => {
                    if let Some(e) = self.read::<Eviction>(&e) {
                        if let Some(uid) = e.spec.target.pod.as_ref().map(|p| &p.uid) {
                            seen.reported.remove(uid);
                            seen.evicted.remove(uid);
                            seen.refusals.remove(uid);
                        }
                    }
                }
                Some(Watched::Request(Ok(
                    watcher::Event::Apply(r) | watcher::Event::InitApply(r),
                ))) => {
                    if let Some(r) = self.read::<EvictionRequest>(&r) {
                        self.request_observed(&r, &mut seen).await;
                    }
                }
                Some(Watched::Eviction(Err(err)) | Watched::Request(Err(err))) => {
                    tracing::debug!(error = %err, "watching EvictionRequests and Evictions");
                }
                Some(_) => {}
                None => return,
            }
        }
    }

    /// A watched object as the in-tree type; one that does not parse is logged and skipped.
    fn read<T: serde::de::DeserializeOwned>(&self, object: &DynamicObject) -> Option<T> {
        typed(object)
            .map_err(|err| {
                warn!(
                    error = crate::cluster::error_text(&err),
                    "ignoring a lifecycle object that does not parse"
                );
            })
            .ok()
    }

    async fn request_observed(&self, request: &EvictionRequest, seen: &mut Seen) {
        if request.spec.requester != self.key {
            return;
        }
        let Some(target) = request.spec.target.pod.as_ref() else {
            return;
        };
        let pod = lock(&self.asked)
            .wanted
            .get(&target.uid)
            .map(|(p, _)| p.clone());
        let Some(pod) = pod else {
            return;
        };
        let Some(progress) = read_request(request) else {
            return;
        };
        let name = request.metadata.name.as_deref().unwrap_or_default();
        self.act(&pod, name, respond(&progress), seen).await;
    }

    /// The pod nodegrace asked about that `eviction` belongs to: through the owner reference
    /// to nodegrace's request (named after the pod UID), else by the target's name.
    fn asked_for(&self, eviction: &Eviction) -> Option<PodKey> {
        let namespace = eviction.metadata.namespace.as_deref()?;
        let asked = lock(&self.asked);
        let wanted = &asked.wanted;
        let by_owner = eviction
            .metadata
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.kind == "EvictionRequest")
            .find_map(|o| o.name.strip_prefix("nodegrace-"))
            .and_then(|uid| wanted.get(uid));
        if let Some((pod, _)) = by_owner {
            return Some(pod.clone());
        }
        let target = eviction.spec.target.pod.as_ref()?;
        wanted
            .values()
            .find(|(p, _)| p.namespace == namespace && p.name == target.name)
            .map(|(p, _)| p.clone())
    }

    async fn observed(&self, eviction: &Eviction, seen: &mut Seen) {
        let Some(pod) = self.asked_for(eviction) else {
            return;
        };
        let name = eviction.metadata.name.as_deref().unwrap_or_default();
        let progress = read_eviction(eviction, &pod.uid);
        self.count_refusals(&pod, &progress, seen);
        self.act(&pod, name, respond(&progress), seen).await;
    }

    /// Each attempt an evictor reports refused, once: the attempts beyond those already
    /// counted for the pod.
    fn count_refusals(&self, pod: &PodKey, progress: &EvictionProgress, seen: &mut Seen) {
        let Some(r) = evictor_refusals(progress) else {
            return;
        };
        let counted = seen.refusals.entry(pod.uid.clone()).or_default();
        let new = r.attempts.saturating_sub(*counted);
        self.metrics.evictions_refused(r.reason, u64::from(new));
        *counted = (*counted).max(r.attempts);
    }

    async fn act(&self, pod: &PodKey, object: &str, response: Response, seen: &mut Seen) {
        match response {
            Response::Nothing => {}
            Response::Report(by) => {
                if seen.reported.get(&pod.uid) != Some(&by) {
                    seen.reported.insert(pod.uid.clone(), by.clone());
                    (self.blocks)(&pod.uid, by);
                }
            }
            Response::Refuse { named_uid } => {
                if seen.refused.insert(format!("{object}/{named_uid}")) {
                    warn!(pod = %pod, pod_uid = %pod.uid, eviction = %object, eviction_target_uid = %named_uid, "an Eviction (lifecycle.k8s.io) about this pod names another pod's UID: ignored, nothing is evicted for it");
                    warn_on_pod(
                        &self.recorder,
                        pod,
                        "EvictionTargetMismatch",
                        "IgnoreEviction",
                        &format!("Eviction {object} (lifecycle.k8s.io) about this pod (UID {}) names another pod's UID {named_uid}: ignored, nothing is evicted for it", pod.uid),
                    );
                }
            }
            Response::EvictDirectly { why } => {
                if !seen.evicted.insert(pod.uid.clone()) {
                    return;
                }
                warn!(pod = %pod, object, reason = %why, "the in-tree eviction ended without evicting the pod: evicting it through the Eviction API");
                let api: Api<Pod> = Api::namespaced(self.evictor.clone(), &pod.namespace);
                let reply = gateway::reply(evict::evict(&api, &pod.name, &pod.uid, None).await);
                if let Some(why) = evict::refusal(&reply) {
                    self.metrics.eviction_refused(why);
                }
                let by = match reply {
                    Ok(Outcome::Blocked { budget, message }) => Some(budget.unwrap_or(message)),
                    Ok(Outcome::Accepted | Outcome::Gone) => None,
                    Err(err) => {
                        // Tried again on the next change.
                        seen.evicted.remove(&pod.uid);
                        Some(err.text())
                    }
                };
                seen.reported.insert(pod.uid.clone(), by.clone());
                (self.blocks)(&pod.uid, by);
            }
        }
    }
}

/// A Warning event on `pod`, written in the background: an event that cannot be written is
/// a debug line, never an error of the drain.
pub(super) fn warn_on_pod(
    recorder: &Recorder,
    pod: &PodKey,
    reason: &str,
    action: &str,
    note: &str,
) {
    let reference = ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: reason.to_owned(),
        note: Some(crate::text::clip(note).into_owned()),
        action: action.to_owned(),
        secondary: None,
    };
    let recorder = recorder.clone();
    let pod = pod.to_string();
    tokio::spawn(async move {
        if let Err(err) = recorder.publish(&event, &reference).await {
            debug!(pod = %pod, reason = %event.reason, error = %err, "could not record an event");
        }
    });
}

/// What the watch already did, per pod UID.
#[derive(Default)]
struct Seen {
    /// The last report to the drain.
    reported: HashMap<String, Option<String>>,
    /// Evicted through the Eviction API by nodegrace itself.
    evicted: HashSet<String>,
    /// Evictions of another UID already warned about (`<eviction>/<uid>`).
    refused: HashSet<String>,
    /// The evictor's refused attempts already counted.
    refusals: HashMap<String, u32>,
}

enum Watched {
    Eviction(Result<watcher::Event<DynamicObject>, watcher::Error>),
    Request(Result<watcher::Event<DynamicObject>, watcher::Error>),
}
