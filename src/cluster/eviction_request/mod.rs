//! Terminating a pod through its EvictionRequest (KEP-4563), for the node's own pods.
//!
//! Two APIs of one shape ([`LifecycleApi`]): the in-tree `lifecycle.k8s.io/v1alpha1` of
//! Kubernetes 1.37 when the cluster serves it ([`is_served`]), otherwise nodegrace's own
//! `lifecycle.nodegrace.dev` CRDs. On either, nodegrace is the requester of its node's pods
//! ([`InTreeTerminator`], the drain engine's `PodTerminator`). On its own CRDs it is also,
//! unless `drain.external_eviction_request_controller` is set, the eviction-request
//! controller and imperative evictor of the node's pods ([`LifecycleController`]), fed by the
//! engine through a [`ControllerHandle`]. Where neither API is served the drain uses the
//! Eviction API directly.

mod gate;
mod handle;
mod intree;
mod lifecycle_api;
mod lifecycle_controller;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::plan::classify;

pub(crate) use handle::BlockSink;
pub use handle::ControllerHandle;
pub(crate) use intree::{is_served, InTreeTerminator};
pub(crate) use lifecycle_api::LifecycleApi;
pub(crate) use lifecycle_controller::LifecycleController;

pub use crate::plan::own::NODE_LABEL;

/// The pod a request is about: UID included, so a pod recreated under the same name is
/// never targeted by its predecessor's request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodKey {
    pub fn new(namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
        }
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl From<&crate::plan::PodInfo> for PodKey {
    fn from(pod: &crate::plan::PodInfo) -> Self {
        Self::new(&pod.namespace, &pod.name, &pod.uid)
    }
}

/// Where a targeted pod stands, as far as an EvictionRequest cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PodState {
    /// Deleted, or the name now belongs to a pod with another UID.
    Absent,
    /// Phase Succeeded or Failed.
    Terminal,
    /// Has a deletionTimestamp: never evicted again.
    Terminating,
    /// Running or pending. `evictable` is false for DaemonSet and mirror pods, which the
    /// Eviction API is not used for (KEP-4563).
    Present { evictable: bool },
}

impl PodState {
    /// The state of `pod` for a request targeting `uid`.
    pub(crate) fn of(pod: Option<&Pod>, uid: &str) -> Self {
        let Some(pod) = pod.filter(|p| p.metadata.uid.as_deref() == Some(uid)) else {
            return PodState::Absent;
        };
        if classify::is_terminal(pod) {
            return PodState::Terminal;
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return PodState::Terminating;
        }
        PodState::Present {
            evictable: !classify::is_static_mirror(pod)
                && classify::daemonset_controller(pod).is_none(),
        }
    }
}

/// Wall-clock time for heartbeats and conditions. `System` in the daemon; `Tokio` derives
/// the wall clock from tokio's clock so that tests with paused time move it.
#[derive(Debug, Clone, Copy)]
pub enum WallClock {
    System,
    Tokio {
        wall: Timestamp,
        mono: tokio::time::Instant,
    },
}

impl WallClock {
    /// A clock anchored now that then advances with tokio time.
    pub fn tokio() -> Self {
        WallClock::Tokio {
            wall: Timestamp::now(),
            mono: tokio::time::Instant::now(),
        }
    }

    pub fn now(&self) -> Timestamp {
        match self {
            WallClock::System => Timestamp::now(),
            WallClock::Tokio { wall, mono } => {
                let elapsed = tokio::time::Instant::now().saturating_duration_since(*mono);
                wall.checked_add(elapsed).unwrap_or(*wall)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_state_follows_uid_phase_and_deletion() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "status": {"phase": "Running"},
        }))
        .unwrap();
        assert_eq!(
            PodState::of(Some(&pod), "u1"),
            PodState::Present { evictable: true }
        );
        assert_eq!(PodState::of(Some(&pod), "u2"), PodState::Absent);
        assert_eq!(PodState::of(None, "u1"), PodState::Absent);
        let mut deleting = pod.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        );
        assert_eq!(PodState::of(Some(&deleting), "u1"), PodState::Terminating);
        let mut done = pod.clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(PodState::of(Some(&done), "u1"), PodState::Terminal);
        let ds: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "d", "controller": true}]},
        }))
        .unwrap();
        assert_eq!(
            PodState::of(Some(&ds), "u1"),
            PodState::Present { evictable: false }
        );
        // An Advanced DaemonSet's pod and a static pod's mirror by its source alone, as the
        // drain plan classifies them.
        for meta in [
            serde_json::json!({"name": "p", "uid": "u1", "ownerReferences": [
                {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "DaemonSet", "name": "ds", "uid": "d", "controller": true}]}),
            serde_json::json!({"name": "p", "uid": "u1", "annotations": {"kubernetes.io/config.source": "file"}}),
        ] {
            let pod: Pod = serde_json::from_value(serde_json::json!({"metadata": meta})).unwrap();
            assert_eq!(
                PodState::of(Some(&pod), "u1"),
                PodState::Present { evictable: false }
            );
        }
    }
}
