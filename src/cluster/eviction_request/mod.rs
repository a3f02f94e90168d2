//! Terminating a pod through its EvictionRequest (KEP-4563 as Kubernetes 1.37 shipped it,
//! `lifecycle.k8s.io/v1alpha1`), for the node's own pods. Where the cluster serves that API
//! ([`is_served`]), nodegrace is the requester of its node's pods that declare eviction
//! responders ([`InTreeTerminator`], the drain engine's `PodTerminator`) and the cluster's
//! controllers do the rest; every other pod, and every pod where the API is not served, goes
//! through the Eviction API.

mod intree;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::plan::classify;

pub(crate) use intree::{is_served, InTreeTerminator};

pub use crate::plan::own::NODE_LABEL;

/// Told what blocks the eviction of a pod (by UID): `Some` with the budget or the
/// apiserver's message after a refusal, `None` once it is evicted or gone. The drain engine
/// names the blocker on the NodeMaintenance, as it does for its own evictions.
pub(crate) type BlockSink = Arc<dyn Fn(&str, Option<String>) + Send + Sync>;

/// The pod a request is about: UID included, so a pod recreated under the same name is
/// never targeted by its predecessor's request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PodKey {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
}

impl PodKey {
    pub(crate) fn new(namespace: &str, name: &str, uid: &str) -> Self {
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
            evictable: classify::kind(pod) == crate::plan::PodType::Default,
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
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
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
