//! What an offline (fallback) drain did, pod by pod: kept in `offline-drain.json` and
//! written to the NodeMaintenance once the apiserver answers again. Here, below both the
//! fallback that fills it and the state directory that keeps it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::plan::PodType;

/// How a pod was terminated. Only the CRI today; kept explicit for the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Cri,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PodOutcome {
    /// Its band has not started (or the run was dropped before it did).
    Pending,
    /// Its band started; stop calls are outstanding.
    Stopping,
    /// Every container and the sandbox stopped.
    Stopped,
    /// A static pod with nothing running: only its manifest was gated.
    Gated,
    /// Finished, but some call failed (see `errors`).
    Failed,
    /// Its band's time ran out before the runtime confirmed the stop.
    TimedOut,
    /// A pod the pod cache knew that the fallback could not act on: the runtime could not
    /// be listed, or did not list it (`errors` says which).
    NotReached,
}

/// What the fallback did to one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// None when the pod cache did not know the pod.
    pub priority: Option<i32>,
    pub pod_type: Option<PodType>,
    /// The band's `priority` value.
    pub band: i32,
    pub grace: Duration,
    pub method: Method,
    pub sandbox_id: Option<String>,
    pub containers: Vec<String>,
    /// Manifest file gated for a static pod.
    pub gated_manifest: Option<String>,
    pub outcome: PodOutcome,
    pub stop_started_at: Option<DateTime<Utc>>,
    pub stopped_at: Option<DateTime<Utc>>,
    /// Offsets from the start of the run on tokio's clock (what tests and benchmarks read).
    pub stop_started_after: Option<Duration>,
    /// Every container stopped: the pod's workload is gone and its band may end.
    pub containers_stopped_after: Option<Duration>,
    /// The sandbox stopped too.
    pub stopped_after: Option<Duration>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BandReport {
    pub priority: i32,
    pub grace: Duration,
    pub pods: usize,
    pub started_after: Duration,
    pub ended_after: Option<Duration>,
    /// The band ended because its time was up, not because its pods were gone.
    pub timed_out: bool,
}

/// The record of a fallback run, for the NodeMaintenance once the apiserver is back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FallbackReport {
    pub endpoint: String,
    /// Runtime name and version, when it answered.
    pub runtime: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The kubelet unit was (asked to be) stopped and not started again yet.
    pub kubelet_stopped: bool,
    /// Why the kubelet was not confirmed stopped (its stop failed or did not finish in
    /// time): it may start again what the fallback stops, so containers that run again
    /// are stopped again after the last band.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_not_stopped: Option<String>,
    /// Why the CRI runtime could not be used, when it could not (not reachable, or no
    /// answer within the call timeout): nothing was stopped through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_unusable: Option<String>,
    pub bands: Vec<BandReport>,
    pub pods: Vec<PodReport>,
    /// Failures not tied to one pod (kubelet unit, listing, manifests).
    pub errors: Vec<String>,
    /// Files of the kubelet's manifest directory it refuses (no pod, no priority), gated
    /// after the last band.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gated_unreadable: Vec<String>,
}

impl PodReport {
    /// A pod the fallback has not touched yet.
    pub fn new(namespace: &str, name: &str, outcome: PodOutcome) -> Self {
        PodReport {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: String::new(),
            priority: None,
            pod_type: None,
            band: 0,
            grace: Duration::ZERO,
            method: Method::Cri,
            sandbox_id: None,
            containers: Vec::new(),
            gated_manifest: None,
            outcome,
            stop_started_at: None,
            stopped_at: None,
            stop_started_after: None,
            containers_stopped_after: None,
            stopped_after: None,
            errors: Vec::new(),
        }
    }
}

impl FallbackReport {
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodReport> {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }
}
