//! Pure decision logic: no I/O, no clocks, no async. Everything here is a function of its
//! inputs so it can be unit- and property-tested exhaustively.
//!
//! - [`PodInfo::from_pod`]: Default / DaemonSet / Static classification of a live pod.
//! - [`normalize_drain_plan`] (the KEP-4212 admission step), [`validate_drain_plan`],
//!   [`drain_plan_changed`], [`shutdown_drain_plan`].
//! - [`targets`]: drain targets. The node engine calls [`evaluate_node`] for its node, writes
//!   the returned reports, targets and holders into each maintenance's status, and renders
//!   messages with [`maintenance_blockers`], [`node_message`] and [`maintenance_message`].
//!   [`model::ClusterModel`] runs all nodes together (tests, simulations).
//! - [`gns`]: the kubelet's priority bands for the offline fallback.
//! - [`budget`]: the shutdown deadline split over plan steps (`nodegrace plan` prints it).
//! - [`drain`]: the drain decision for the node ([`drain::decide`]): targets, what is asked
//!   of each pod and which are escalated, from a snapshot the engine builds.
//! - [`bandend`]: when a band ends: the API's answer, or the node's own view of its pods
//!   (containers exited, volumes unmounted) where it is sure.
//! - [`pass`]: one pass of the node's engine ([`pass::decide`]): around the drain decision,
//!   cordon and finalizers, the statuses to write, the maintenances to complete and whether
//!   the node is done; what each answer means for the next pass.
//! - [`reachability`]: whether the apiserver can be used, the back-off between tries, when a
//!   shutdown falls back offline and when time lost to an outage is planned again.
//! - [`intree`]: the EvictionRequest API of Kubernetes 1.37 as nodegrace requests through
//!   it: its requester key, what a pod's `Eviction` says, what is wrong with declared
//!   responders.
//! - [`wave`]: a fleet's reboots in turns: a node's turn, its slot's fate, a slot taken back,
//!   a wave's windows.
//! - [`wiring`]: what the daemon starts at connect ([`wiring::Wiring`]): the eviction path
//!   and what is warned about.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub(crate) mod backoff;
pub(crate) mod bandend;
pub(crate) mod budget;
pub(crate) mod classify;
pub(crate) mod drain;
pub(crate) mod drainplan;
pub(crate) mod freshness;
pub(crate) mod gns;
pub(crate) mod intree;
pub(crate) mod lifecycle;
#[cfg(test)]
pub(crate) mod model;
pub(crate) mod names;
pub(crate) mod own;
pub(crate) mod pass;
#[cfg(test)]
mod proptests;
pub(crate) mod reachability;
pub(crate) mod selector;
pub(crate) mod targets;
#[cfg(test)]
pub(crate) mod testutil;
pub(crate) mod wave;
pub(crate) mod wiring;

pub use budget::plan_steps;
pub(crate) use budget::{
    escalation_grace, reserves_needed, split_budget, split_remaining, BudgetReserves, StepSchedule,
};
pub(crate) use drainplan::PlanError;
pub(crate) use drainplan::{
    normalize_drain_plan, shutdown_drain_plan, DrainPlanEntrySetting, ShutdownPlanSettings,
};
pub(crate) use gns::GnsCandidate;
pub(crate) use gns::{GnsBands, PriorityGracePeriod};
pub(crate) use targets::{reached_drain_targets, DrainTargets, NodeReport};

/// KEP-4212 `podType`: which kind of pod a drain plan entry targets. The declaration order
/// is the drain order.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum PodType {
    Default,
    DaemonSet,
    Static,
}

/// What nodegrace knows of one pod on its node: enough to classify, order and terminate it,
/// and to persist in the offline cache (`/var/lib/nodegrace/pods.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.priority`; pods without one have priority 0, as in the apiserver.
    pub priority: i32,
    pub pod_type: PodType,
    /// `spec.terminationGracePeriodSeconds` (default 30).
    pub termination_grace_period_seconds: i64,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp` is set: still running, counts as active.
    #[serde(default)]
    pub terminating: bool,
    /// Phase Succeeded or Failed: ignored by every drain.
    #[serde(default)]
    pub terminal: bool,
    /// Static pods only: the `kubernetes.io/config.hash` / mirror annotation value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_hash: Option<String>,
}

impl PodInfo {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn grace_period(&self) -> Duration {
        Duration::from_secs(self.termination_grace_period_seconds.max(0) as u64)
    }
}

/// KEP-4212 `DrainPlanEntry`; also the shape of a drain target. Shared by the CRD types in
/// `api` and by the pure planning code here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainPlanEntry {
    /// Selects pods by label among those of this type and priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Pods with a priority less than or equal to this value are selected.
    pub pod_priority: i32,
    pub pod_type: PodType,
}
