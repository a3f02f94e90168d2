//! The drain engine's [`PodTerminator`] when the EvictionRequest CRD is installed: a
//! cooperative termination creates or joins the pod's EvictionRequest (the controller then
//! takes it through interceptors and the Eviction API); DELETE stays a DELETE.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use tracing::warn;

use super::{PodKey, Requested, Requester};
use crate::cluster::evict::{self, Outcome};
use crate::cluster::terminate::{PodTerminator, Request};
use crate::metrics::TerminationMethod;
use crate::plan::PodInfo;

/// Pod UID -> (pod, maintenances that requested it).
type Wanted = Arc<Mutex<HashMap<String, (PodKey, BTreeSet<String>)>>>;

/// Terminates pods through EvictionRequests, remembering which maintenance asked for
/// which pod so that a completed maintenance withdraws only what no other one still wants.
pub struct EvictionRequestTerminator {
    /// DELETEs, and evictions of pods whose request another node's identity made: the
    /// kubelet's credential in the daemon.
    client: Client,
    requester: Requester,
    wanted: Wanted,
    /// Maintenances seen asking since this daemon started.
    seen: Mutex<BTreeSet<String>>,
}

impl EvictionRequestTerminator {
    pub fn new(client: Client, requester: Requester) -> Self {
        Self {
            client,
            requester,
            wanted: Wanted::default(),
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// What this node's maintenances still want evicted, for the eviction-request
    /// controller to put this requester back on a request someone else took it off.
    pub fn intent(&self) -> Intent {
        Intent {
            requester: self.requester.clone(),
            wanted: self.wanted.clone(),
        }
    }

    fn record(&self, pod: PodKey, maintenance: &str) {
        let mut wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner());
        let entry = wanted
            .entry(pod.uid.clone())
            .or_insert_with(|| (pod, BTreeSet::new()));
        entry.1.insert(maintenance.to_owned());
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(maintenance.to_owned());
    }

    /// Pods `maintenance` asked for that no other maintenance wants; forgets them.
    fn release(&self, maintenance: &str) -> Vec<PodKey> {
        let mut wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner());
        let mut released = Vec::new();
        wanted.retain(|_, (pod, by)| {
            if by.remove(maintenance) && by.is_empty() {
                released.push(pod.clone());
                return false;
            }
            true
        });
        released
    }
}

/// The pods this node's requester asked to evict on behalf of maintenances that still want
/// them (see [`EvictionRequestTerminator::intent`]).
#[derive(Clone)]
pub struct Intent {
    requester: Requester,
    wanted: Wanted,
}

impl Intent {
    /// `pod` of `request` when a maintenance still wants it evicted and this requester is no
    /// longer on the request.
    pub fn removed(&self, request: &crate::api::EvictionRequest) -> Option<PodKey> {
        if request.has_requester(self.requester.name()) {
            return None;
        }
        let uid = &request.pod_ref()?.uid;
        let wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner());
        wanted.get(uid).map(|(pod, _)| pod.clone())
    }

    /// Asks for `pod` again (joins its request, or replaces a cancelled one).
    pub(crate) async fn reassert(&self, pod: &PodKey) -> Result<Requested> {
        self.requester.request(pod).await
    }
}

#[async_trait]
impl PodTerminator for EvictionRequestTerminator {
    async fn connect(&self) {
        crate::cluster::terminate::open_connection(&self.client).await;
    }

    async fn terminate(
        &self,
        pod: &PodInfo,
        object: Option<&Pod>,
        request: Request,
        maintenance: &str,
    ) -> Result<Outcome> {
        match request {
            Request::Delete { grace_seconds } => {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
                evict::delete(&api, &pod.name, &pod.uid, grace_seconds, maintenance).await
            }
            Request::Cooperative => {
                let key = PodKey::from(pod);
                let requested = match object.filter(|o| o.metadata.uid.as_deref() == Some(&pod.uid))
                {
                    Some(o) => self.requester.request_pod(o).await?,
                    None => self.requester.request(&key).await?,
                };
                match requested {
                    Requested::PodGone => Ok(Outcome::Gone),
                    Requested::Foreign { node } => {
                        warn!(pod = %key, labelled_for = %node, "the pod's EvictionRequest is labelled for another node (made with that node's identity): ignored; evicting through the Eviction API");
                        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
                        evict::evict(&api, &pod.name, &pod.uid, None).await
                    }
                    Requested::Created
                    | Requested::Joined
                    | Requested::AlreadyRequested
                    | Requested::Uncancellable => {
                        self.record(key, maintenance);
                        Ok(Outcome::Accepted)
                    }
                }
            }
        }
    }

    async fn withdraw(&self, maintenance: &str) -> Result<()> {
        let mut pods = self.release(maintenance);
        let known = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(maintenance);
        if !known {
            // Requested before this daemon (re)started: withdraw every request of this
            // node that no maintenance has asked for since.
            let wanted: BTreeSet<String> = self
                .wanted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .cloned()
                .collect();
            pods.extend(
                self.requester
                    .own_requests()
                    .await?
                    .into_iter()
                    .filter(|p| !wanted.contains(&p.uid)),
            );
        }
        let mut first_error = None;
        for pod in pods {
            if let Err(err) = self.requester.withdraw(&pod).await {
                warn!(pod = %pod, maintenance, error = crate::cluster::error_text(&err), "withdrawing an eviction request failed");
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn method(&self, request: Request) -> TerminationMethod {
        match request {
            Request::Cooperative => TerminationMethod::EvictionRequest,
            Request::Delete { .. } => TerminationMethod::Delete,
        }
    }
}
