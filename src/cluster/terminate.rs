//! How the drain asks a pod to go. The drain loop decides *when* and *which*; a
//! [`PodTerminator`] decides *how*: [`EvictionApi`] (the Eviction API, PodDisruptionBudgets
//! honoured, and DELETE), or the in-tree EvictionRequest API
//! (`eviction_request::intree::InTreeTerminator`), whose escalation is the same DELETE.

use anyhow::Result;
use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

use super::evict::{self, Outcome};
use crate::metrics::TerminationMethod;
use crate::plan::PodInfo;

/// What the drain wants done to one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Cooperative: respects disruption budgets (Eviction API or EvictionRequest); may be
    /// answered with [`Outcome::Blocked`].
    Cooperative,
    /// DELETE with this grace period (DaemonSet pods, escalation at a shutdown deadline).
    Delete { grace_seconds: i64 },
}

#[async_trait]
pub trait PodTerminator: Send + Sync + 'static {
    /// Asks `pod` (by UID: a pod recreated under the same name is never hit) to terminate
    /// on behalf of the NodeMaintenance `maintenance`. `object` is the pod as the caller's
    /// watch holds it, so that nothing needs to read it again.
    async fn terminate(
        &self,
        pod: &PodInfo,
        object: Option<&Pod>,
        request: Request,
        maintenance: &str,
    ) -> Result<Outcome>;

    /// Opens the connection the terminations go over, ahead of them. The apiserver closes a
    /// connection idle for 90 s, and the client that evicts carries no watch: at a shutdown
    /// after a quiet day, a band's requests would each open a connection of their own at
    /// once (nothing tells them the first will be HTTP/2 and shared).
    async fn connect(&self) {}

    /// Deletes the mirror pod of a static pod the node shows gone, as the kubelet's
    /// housekeeping would next: at once (grace 0), by UID.
    async fn delete_mirror(&self, pod: &PodInfo) -> Result<Outcome>;

    /// The maintenance completed: withdraw what was requested on its behalf and is still
    /// pending (EvictionRequests). Nothing to withdraw for a plain eviction.
    async fn withdraw(&self, _maintenance: &str) -> Result<()> {
        Ok(())
    }

    /// The method counted in metrics for an accepted `request` for `pod`.
    fn method(&self, _pod: &PodInfo, request: Request) -> TerminationMethod {
        match request {
            Request::Cooperative => TerminationMethod::Eviction,
            Request::Delete { .. } => TerminationMethod::Delete,
        }
    }
}

/// The Eviction API and DELETE, both with a UID precondition.
#[derive(Clone)]
pub struct EvictionApi {
    client: Client,
}

impl EvictionApi {
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

/// One cheap request (`GET /version`) over `client`, so that its connection is open.
pub(crate) async fn open_connection(client: &Client) {
    if let Err(err) = client.apiserver_version().await {
        tracing::debug!(error = %err, "opening the connection for evictions failed");
    }
}

#[async_trait]
impl PodTerminator for EvictionApi {
    async fn connect(&self) {
        open_connection(&self.client).await;
    }

    async fn terminate(
        &self,
        pod: &PodInfo,
        _object: Option<&Pod>,
        request: Request,
        maintenance: &str,
    ) -> Result<Outcome> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match request {
            Request::Cooperative => evict::evict(&api, &pod.name, &pod.uid, None).await,
            Request::Delete { grace_seconds } => {
                evict::delete(&api, &pod.name, &pod.uid, grace_seconds, maintenance).await
            }
        }
    }

    async fn delete_mirror(&self, pod: &PodInfo) -> Result<Outcome> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        evict::delete_mirror(&api, &pod.name, &pod.uid).await
    }
}
