//! The requester side: create or join a pod's EvictionRequest, and withdraw from it.
//!
//! Every write is guarded by the resourceVersion it was computed from; a 409 means
//! someone else changed the request meanwhile, so it is read again and the change
//! recomputed. No requester is ever lost to a concurrent update.

use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;
use tracing::{debug, info};

use super::{interceptors_from_annotations, ControllerHandle, PodKey, PodState, NODE_LABEL};
use crate::api::{
    EvictionRequest, EvictionRequestCancellationPolicy, Requester as RequesterRef,
    HEARTBEAT_DEADLINE_DEFAULT_SECONDS, REQUESTER_SUFFIX,
};
use crate::cluster::{api_error_code, FIELD_MANAGER};

/// Attempts before giving up on a request that keeps changing under us.
const MAX_CONFLICTS: usize = 16;

/// What [`Requester::request`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requested {
    /// Created the pod's EvictionRequest.
    Created,
    /// Added this requester to an existing EvictionRequest.
    Joined,
    /// This requester was already on it.
    AlreadyRequested,
    /// An existing request forbids changes to its requesters (cancellation policy
    /// `Forbid`): the pod's eviction is under way and cannot be stopped, so there is
    /// nothing to join.
    Uncancellable,
    /// The pod no longer exists (or has terminated): nothing to request.
    PodGone,
    /// The pod's EvictionRequest is labelled for another node (`NODE_LABEL`): only a
    /// compromised or misconfigured node's identity makes such a request for this node's
    /// pod. It is not joined (the admission policy would refuse it); the pod goes through
    /// the Eviction API instead.
    Foreign { node: String },
}

/// What [`Requester::withdraw`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawn {
    /// Removed this requester; others remain, the eviction goes on for them.
    Removed,
    /// Removed the last requester: the request is cancelled (its controller marks it
    /// `Complete`; it is garbage collected with the pod).
    Cancelled,
    /// The request was already complete and only this requester held it: deleted.
    Deleted,
    /// Complete, and other requesters still hold it: left for them.
    LeftToOthers,
    /// The cancellation policy is `Forbid`: the requester stays until the interceptor
    /// finishes the eviction.
    Forbidden,
    /// No request for the pod, or this requester is not on it.
    NotRequested,
}

/// The node `request` is labelled for ([`NODE_LABEL`]), when that is not `node`.
pub(crate) fn labelled_for_another<'a>(
    request: &'a EvictionRequest,
    node: &str,
) -> Option<&'a str> {
    request
        .metadata
        .labels
        .as_ref()?
        .get(NODE_LABEL)
        .map(String::as_str)
        .filter(|n| *n != node)
}

/// Requests pod evictions on behalf of this node's maintenances.
#[derive(Clone)]
pub struct Requester {
    client: Client,
    node: String,
    name: String,
    /// A node's daemon (not [`Requester::named`]): it keeps off requests labelled for
    /// another node.
    node_bound: bool,
    heartbeat_deadline_seconds: i32,
    /// This node's eviction-request controller, once it runs: told of every request created
    /// here, it acts on it without waiting for its watch to bring it.
    announce: Arc<OnceLock<ControllerHandle>>,
}

impl Requester {
    /// The requester `<node>.nodemaintenance.nodegrace.dev` of the daemon on `node`
    /// ([`crate::api::node_requester`]; the bare suffix for a node name too long for it).
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            client,
            node: node.to_owned(),
            name: crate::api::node_requester(node).unwrap_or_else(|| REQUESTER_SUFFIX.to_owned()),
            node_bound: true,
            heartbeat_deadline_seconds: HEARTBEAT_DEADLINE_DEFAULT_SECONDS,
            announce: Arc::default(),
        }
    }

    /// The node `request` is labelled for, when this node's daemon must keep off it.
    fn foreign<'a>(&self, request: &'a EvictionRequest) -> Option<&'a str> {
        labelled_for_another(request, &self.node).filter(|_| self.node_bound)
    }

    /// The same, under another requester name (a DNS subdomain).
    pub fn named(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self.node_bound = false;
        self
    }

    /// `spec.heartbeatDeadlineSeconds` of the requests this requester creates (the CRD
    /// accepts 600..=86400).
    pub fn heartbeat_deadline_seconds(mut self, seconds: i32) -> Self {
        self.heartbeat_deadline_seconds = seconds;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tells `controller` of every request this requester (and its clones) creates from
    /// now on; the first controller set stays.
    pub fn announce_to(&self, controller: ControllerHandle) {
        let _ = self.announce.set(controller);
    }

    fn requests(&self, namespace: &str) -> Api<EvictionRequest> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Asks for `pod`'s eviction: creates its EvictionRequest (named after the pod UID,
    /// interceptors resolved from the pod's annotations) or joins the existing one. Reads
    /// the pod first; see [`Requester::request_pod`] to pass it from a cache.
    pub async fn request(&self, pod: &PodKey) -> Result<Requested> {
        self.request_with(pod, None).await
    }

    /// [`Requester::request`] for a pod as the caller's pod cache has it: a fresh request
    /// then costs a single create.
    pub async fn request_pod(&self, pod: &Pod) -> Result<Requested> {
        let key = PodKey::new(
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default(),
        );
        if key.namespace.is_empty() || key.name.is_empty() || key.uid.is_empty() {
            bail!("pod {key} has no namespace, name or UID");
        }
        self.request_with(&key, Some(pod)).await
    }

    async fn request_with(&self, pod: &PodKey, cached: Option<&Pod>) -> Result<Requested> {
        let api = self.requests(&pod.namespace);
        // Creating first: a drain mostly asks for pods nobody asked for yet.
        let mut try_create = true;
        let mut cached = cached;
        for _ in 0..MAX_CONFLICTS {
            if try_create {
                match self.create(&api, pod, cached).await? {
                    Some(done) => return Ok(done),
                    None => try_create = false,
                }
            }
            let existing = api
                .get_opt(&pod.uid)
                .await
                .with_context(|| format!("reading the EvictionRequest of pod {pod}"))?;
            let Some(request) = existing else {
                try_create = true;
                continue;
            };
            if let Some(other) = self.foreign(&request) {
                return Ok(Requested::Foreign {
                    node: other.to_owned(),
                });
            }
            if request.is_complete() {
                // Complete while the pod lives means cancelled; its requesters are frozen,
                // so a new request replaces it.
                match self.pod_state(pod).await? {
                    PodState::Absent | PodState::Terminal => return Ok(Requested::PodGone),
                    PodState::Terminating | PodState::Present { .. } => {
                        self.delete_exact(&api, &request, pod).await?;
                        // The cached pod may predate the cancellation; read it again.
                        cached = None;
                        try_create = true;
                        continue;
                    }
                }
            }
            if request.has_requester(&self.name) {
                return Ok(Requested::AlreadyRequested);
            }
            if request.cancellation_policy() == EvictionRequestCancellationPolicy::Forbid {
                return Ok(Requested::Uncancellable);
            }
            let mut requesters = request.spec.requesters.clone();
            requesters.push(RequesterRef {
                name: self.name.clone(),
            });
            match self.patch_requesters(&api, &request, &requesters).await {
                Ok(()) => {
                    info!(pod = %pod, requester = %self.name, "joined the pod's EvictionRequest");
                    return Ok(Requested::Joined);
                }
                Err(err) if matches!(api_error_code(&err), Some(409 | 404)) => {
                    debug!(pod = %pod, "EvictionRequest changed while joining; reading it again");
                }
                Err(err) => {
                    return Err(err)
                        .with_context(|| format!("joining the EvictionRequest of pod {pod}"))
                }
            }
        }
        bail!("the EvictionRequest of pod {pod} kept changing; gave up after {MAX_CONFLICTS} attempts")
    }

    /// Creates the request; `None` when another requester created it first.
    async fn create(
        &self,
        api: &Api<EvictionRequest>,
        pod: &PodKey,
        cached: Option<&Pod>,
    ) -> Result<Option<Requested>> {
        let read;
        let live = match cached {
            Some(live) => Some(live),
            None => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
                read = pods
                    .get_opt(&pod.name)
                    .await
                    .with_context(|| format!("reading pod {pod}"))?;
                read.as_ref()
            }
        };
        match PodState::of(live, &pod.uid) {
            PodState::Absent | PodState::Terminal => return Ok(Some(Requested::PodGone)),
            PodState::Terminating | PodState::Present { .. } => {}
        }
        let Some(live) = live else {
            return Ok(Some(Requested::PodGone));
        };
        let interceptors = interceptors_from_annotations(live.metadata.annotations.as_ref());
        let mut request = EvictionRequest::for_pod(
            &pod.namespace,
            &pod.name,
            &pod.uid,
            &self.name,
            interceptors,
        );
        request.spec.heartbeat_deadline_seconds = self.heartbeat_deadline_seconds;
        // KEP-4563 merges the pod's labels into the request's.
        let mut labels = live.metadata.labels.clone().unwrap_or_default();
        labels.insert(NODE_LABEL.to_owned(), self.node.clone());
        request.metadata.labels = Some(labels);
        request.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Pod".to_owned(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            controller: None,
            block_owner_deletion: None,
        }]);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        match api.create(&params, &request).await {
            Ok(created) => {
                if let Some(controller) = self.announce.get() {
                    controller.created(created);
                }
                info!(
                    pod = %pod,
                    requester = %self.name,
                    interceptors = request.spec.interceptors.len(),
                    "created the pod's EvictionRequest"
                );
                Ok(Some(Requested::Created))
            }
            Err(err) if api_error_code(&err) == Some(409) => Ok(None),
            Err(err) => {
                Err(err).with_context(|| format!("creating the EvictionRequest of pod {pod}"))
            }
        }
    }

    /// Withdraws this requester from `pod`'s EvictionRequest (KEP-4563 cancellation: the
    /// last requester leaving cancels the request, unless its policy is `Forbid`).
    pub async fn withdraw(&self, pod: &PodKey) -> Result<Withdrawn> {
        let api = self.requests(&pod.namespace);
        for _ in 0..MAX_CONFLICTS {
            let existing = api
                .get_opt(&pod.uid)
                .await
                .with_context(|| format!("reading the EvictionRequest of pod {pod}"))?;
            let Some(request) = existing else {
                return Ok(Withdrawn::NotRequested);
            };
            if !request.has_requester(&self.name) || self.foreign(&request).is_some() {
                return Ok(Withdrawn::NotRequested);
            }
            if request.is_complete() {
                if request.spec.requesters.iter().any(|r| r.name != self.name) {
                    return Ok(Withdrawn::LeftToOthers);
                }
                if self.delete_exact(&api, &request, pod).await? {
                    info!(pod = %pod, "deleted the completed EvictionRequest");
                    return Ok(Withdrawn::Deleted);
                }
                continue;
            }
            if request.cancellation_policy() == EvictionRequestCancellationPolicy::Forbid {
                info!(pod = %pod, "EvictionRequest cannot be cancelled (policy Forbid); requester stays");
                return Ok(Withdrawn::Forbidden);
            }
            let remaining: Vec<RequesterRef> = request
                .spec
                .requesters
                .iter()
                .filter(|r| r.name != self.name)
                .cloned()
                .collect();
            match self.patch_requesters(&api, &request, &remaining).await {
                Ok(()) if remaining.is_empty() => {
                    info!(pod = %pod, requester = %self.name, "withdrew the last requester; EvictionRequest cancelled");
                    return Ok(Withdrawn::Cancelled);
                }
                Ok(()) => {
                    info!(pod = %pod, requester = %self.name, "withdrew from the EvictionRequest");
                    return Ok(Withdrawn::Removed);
                }
                Err(err) if api_error_code(&err) == Some(404) => {
                    return Ok(Withdrawn::NotRequested)
                }
                Err(err) if api_error_code(&err) == Some(409) => {
                    debug!(pod = %pod, "EvictionRequest changed while withdrawing; reading it again");
                }
                Err(err) => {
                    return Err(err).with_context(|| {
                        format!("withdrawing from the EvictionRequest of pod {pod}")
                    })
                }
            }
        }
        bail!("the EvictionRequest of pod {pod} kept changing; gave up after {MAX_CONFLICTS} attempts")
    }

    /// The pods of the requests this requester holds on this node (labelled
    /// [`NODE_LABEL`]), complete ones included: what a restarted daemon may still have to
    /// withdraw.
    pub(crate) async fn own_requests(&self) -> Result<Vec<PodKey>> {
        let api: Api<EvictionRequest> = Api::all(self.client.clone());
        let params = ListParams::default().labels(&format!("{NODE_LABEL}={}", self.node));
        let list = api
            .list(&params)
            .await
            .context("listing this node's EvictionRequests")?;
        Ok(list
            .items
            .iter()
            .filter(|r| r.has_requester(&self.name))
            .filter_map(|r| {
                let pod = r.pod_ref()?;
                Some(PodKey::new(
                    r.metadata.namespace.as_deref()?,
                    &pod.name,
                    &pod.uid,
                ))
            })
            .collect())
    }

    /// Sets `spec.requesters` only if the request is still at the version it was read at
    /// (merge patch with `metadata.resourceVersion`: 409 otherwise). The node label
    /// marks the request as this node's to control.
    async fn patch_requesters(
        &self,
        api: &Api<EvictionRequest>,
        request: &EvictionRequest,
        requesters: &[RequesterRef],
    ) -> kube::Result<()> {
        let mut patch = json!({
            "metadata": { "resourceVersion": request.metadata.resource_version },
            "spec": { "requesters": requesters },
        });
        if self.node_bound {
            patch["metadata"]["labels"] = json!({ NODE_LABEL: self.node });
        }
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let name = request.metadata.name.as_deref().unwrap_or_default();
        api.patch(name, &params, &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    /// Deletes exactly this version of the request. False when it changed meanwhile.
    async fn delete_exact(
        &self,
        api: &Api<EvictionRequest>,
        request: &EvictionRequest,
        pod: &PodKey,
    ) -> Result<bool> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: request.metadata.uid.clone(),
                resource_version: request.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        let name = request.metadata.name.as_deref().unwrap_or_default();
        match api.delete(name, &params).await {
            Ok(_) => Ok(true),
            Err(err) if api_error_code(&err) == Some(404) => Ok(true),
            Err(err) if api_error_code(&err) == Some(409) => Ok(false),
            Err(err) => {
                Err(err).with_context(|| format!("deleting the EvictionRequest of pod {pod}"))
            }
        }
    }

    async fn pod_state(&self, pod: &PodKey) -> Result<PodState> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let live = pods
            .get_opt(&pod.name)
            .await
            .with_context(|| format!("reading pod {pod}"))?;
        Ok(PodState::of(live.as_ref(), &pod.uid))
    }
}
