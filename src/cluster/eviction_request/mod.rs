//! Terminating a pod through its EvictionRequest (KEP-4563), for the node's own pods.
//!
//! Two roles:
//! - **Requester** ([`Requester`]): the drain asks for a pod's eviction by creating the
//!   pod's EvictionRequest (named after the pod UID) or by joining an existing one, and
//!   withdraws when its maintenance ends.
//! - **Eviction-request controller** ([`Controller`]), unless an external one runs: picks
//!   the active interceptor (highest index first), hands over when an interceptor completes
//!   or misses its heartbeat deadline, falls back to the Eviction API (PodDisruptionBudgets
//!   honoured, failures counted and backed off) and sets `Complete` once the pod is gone.
//!
//! The decisions are pure ([`decide`]); the adapters around them only read and write.
//!
//! On a cluster serving the in-tree API of Kubernetes 1.37 (`lifecycle.k8s.io/v1alpha1`,
//! [`is_served`]) nodegrace is only a requester of it ([`InTreeTerminator`]); the CRD
//! and this controller stand down.
//!
//! Wiring in the daemon:
//! - [`is_crd_installed`] picks the path. With the CRD, the drain engine terminates pods
//!   through [`EvictionRequestTerminator`] (its `PodTerminator`), without it through the
//!   Eviction API directly.
//! - Unless `drain.external_eviction_request_controller` is set, run [`Controller`]: either
//!   [`Controller::new`] with the engine's pod cache (its pod reflector's store) and a call to
//!   [`ControllerHandle::pod_changed`] for every pod event, or
//!   [`Controller::run_with_own_pod_watch`]. Under a shutdown deadline,
//!   [`ControllerHandle::set_backoff_max`] shortens the eviction back-off.
//!
//! Where this deviates from the KEP because the API is a CRD without an admission plugin:
//! `spec.interceptors` is resolved by the requester on creation from the pod's
//! `interceptor.evictionrequest.coordination.k8s.io/priority_<name>` annotations (the
//! stand-in for `pod.spec.evictionInterceptors`; the CRD makes the field immutable, so a
//! request created without them runs straight to the Eviction API), and EvictionRequests
//! nodegrace creates carry an owner reference to the pod (garbage collected with it) and
//! the label [`NODE_LABEL`].

mod controller;
pub(crate) mod decide;
mod gate;
mod intree;
mod lifecycle_api;
mod lifecycle_controller;
mod requester;
mod terminator;
mod work;

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;

use crate::api::{Interceptor, INTERCEPTOR_ANNOTATION_PREFIX};

pub(crate) use controller::BlockSink;
pub use controller::{Controller, ControllerConfig, ControllerHandle, Reconciler};
pub(crate) use intree::{is_served, InTreeTerminator};
pub(crate) use lifecycle_api::LifecycleApi;
pub(crate) use lifecycle_controller::LifecycleController;
pub use requester::{Requested, Requester, Withdrawn};
pub use terminator::{EvictionRequestTerminator, Intent};

/// Label on the EvictionRequests nodegrace creates or joins: the node whose daemon acts
/// as their controller. It lets a restarted daemon recognise its requests after the pod
/// has left its pod cache.
pub const NODE_LABEL: &str = "nodegrace.dev/node";

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

/// Whether the apiserver serves `evictionrequests.nodegrace.dev` (discovery of
/// `nodegrace.dev/v1alpha1`). The drain uses EvictionRequests when it does and the
/// Eviction API directly when it does not.
pub async fn is_crd_installed(client: &Client) -> Result<bool> {
    match client
        .list_api_group_resources(crate::api::API_VERSION)
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "evictionrequests")),
        Err(err) if crate::cluster::api_error_code(&err) == Some(404) => Ok(false),
        Err(err) => Err(err).context("discovering the nodegrace.dev/v1alpha1 API group"),
    }
}

/// The pod's interceptors in `spec.interceptors` order: ascending priority, so that the
/// highest priority sits at the highest index and runs first (KEP-4563). Annotation values
/// are `<priority>` or `<priority>/<role>`; entries with an unparsable priority or a name
/// that is not a DNS subdomain are skipped (the CRD would reject the whole request). Equal
/// priorities run in name order. At most [`crate::api::MAX_INTERCEPTORS`], the highest
/// priorities kept.
pub(crate) fn interceptors_from_annotations(
    annotations: Option<&BTreeMap<String, String>>,
) -> Vec<Interceptor> {
    let mut found: Vec<(i64, &str)> = annotations
        .into_iter()
        .flatten()
        .filter_map(|(key, value)| {
            let name = key.strip_prefix(INTERCEPTOR_ANNOTATION_PREFIX)?;
            let priority = value.split('/').next()?.trim().parse::<i64>().ok()?;
            crate::api::is_dns_subdomain(name).then_some((priority, name))
        })
        .collect();
    // Highest priority first, ties by name; then reversed into list order.
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    found.truncate(crate::api::MAX_INTERCEPTORS);
    found
        .into_iter()
        .rev()
        .map(|(_, name)| Interceptor {
            name: name.to_owned(),
        })
        .collect()
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
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return PodState::Terminal;
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return PodState::Terminating;
        }
        PodState::Present {
            evictable: !is_mirror(pod) && !is_daemonset_pod(pod),
        }
    }
}

/// A static pod's mirror on the apiserver.
pub(crate) fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
}

/// A pod a DaemonSet controls.
pub(crate) fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "DaemonSet" && o.api_version == "apps/v1")
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

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{INTERCEPTOR_ANNOTATION_PREFIX}{k}"), v.to_string()))
            .collect()
    }

    fn names(list: &[Interceptor]) -> Vec<&str> {
        list.iter().map(|i| i.name.as_str()).collect()
    }

    #[test]
    fn interceptors_are_listed_lowest_priority_first_so_the_highest_runs_first() {
        let mut a = annotations(&[
            ("replicaset.apps.k8s.io", "100/controller"),
            ("db-operator.example.com", "20000/knowledgeable"),
            ("deployment.apps.k8s.io", "10000"),
            ("rescue.example.com", "-5/fallback"),
        ]);
        a.insert("app.kubernetes.io/name".into(), "db".into());
        let list = interceptors_from_annotations(Some(&a));
        assert_eq!(
            names(&list),
            [
                "rescue.example.com",
                "replicaset.apps.k8s.io",
                "deployment.apps.k8s.io",
                "db-operator.example.com"
            ]
        );
    }

    #[test]
    fn bad_interceptor_annotations_are_skipped() {
        let a = annotations(&[
            ("Upper.example.com", "10"),
            ("ok.example.com", "ten"),
            ("-dash.example.com", "10"),
            ("good.example.com", " 7 /partial"),
            ("", "1"),
        ]);
        assert_eq!(
            names(&interceptors_from_annotations(Some(&a))),
            ["good.example.com"]
        );
        assert!(interceptors_from_annotations(None).is_empty());
    }

    #[test]
    fn equal_priorities_run_in_name_order_and_only_the_top_hundred_are_kept() {
        let a = annotations(&[("b.example.com", "5"), ("a.example.com", "5")]);
        // The last entry runs first.
        assert_eq!(
            names(&interceptors_from_annotations(Some(&a))),
            ["b.example.com", "a.example.com"]
        );
        let many: Vec<(String, String)> = (0..150)
            .map(|i| (format!("i{i}.example.com"), i.to_string()))
            .collect();
        let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let list = interceptors_from_annotations(Some(&annotations(&refs)));
        assert_eq!(list.len(), 100);
        assert_eq!(list[0].name, "i50.example.com");
        assert_eq!(list[99].name, "i149.example.com");
    }

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
    }
}
