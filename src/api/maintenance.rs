//! `NodeMaintenance` (KEP-4212) as a cluster-scoped CRD in `nodegrace.dev/v1alpha1`.

use std::fmt;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::plan::DrainPlanEntry;

/// KEP-4212 `NodeMaintenanceStage`. Declaration order is the only allowed direction of
/// travel (skips allowed, no way back); the CRD enforces it with a transition rule.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum Stage {
    /// Planned: nodegrace does not touch the selected nodes or their pods.
    #[default]
    Idle,
    /// The selected nodes are made unschedulable.
    Cordon,
    /// Cordon, then terminate pods in drain-plan order.
    Drain,
    /// Uncordon (unless another maintenance is active), withdraw eviction requests,
    /// restore static pods.
    Complete,
}

impl Stage {
    #[cfg(test)]
    pub(crate) const ALL: [Stage; 4] = [Stage::Idle, Stage::Cordon, Stage::Drain, Stage::Complete];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Idle => "Idle",
            Stage::Cordon => "Cordon",
            Stage::Drain => "Drain",
            Stage::Complete => "Complete",
        }
    }

    /// Whether the CRD admits a change of `spec.stage` from `self` to `next`.
    #[cfg(test)]
    pub(crate) fn may_become(self, next: Stage) -> bool {
        next >= self
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Intent to cordon and drain the nodes matching `nodeSelector` (KEP-4212 NodeMaintenanceSpec).
// Repeated `type_ = "string"` inside the printcolumns reads as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nodegrace.dev",
    version = "v1alpha1",
    kind = "NodeMaintenance",
    plural = "nodemaintenances",
    singular = "nodemaintenance",
    shortname = "nm",
    category = "nodegrace",
    status = "NodeMaintenanceStatus",
    derive = "PartialEq",
    doc = "Declarative maintenance of a set of nodes (KEP-4212): cordon, drain in drain-plan order, complete.",
    printcolumn(name = "Stage", type_ = "string", json_path = ".spec.stage"),
    printcolumn(
        name = "Drained",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Drained\")].status"
    ),
    printcolumn(name = "Reason", type_ = "string", json_path = ".spec.reason"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceSpec {
    /// Selects the nodes under maintenance. Cannot be changed by a node's nodegrace identity
    /// unless the maintenance selects only that node (see packaging/rbac).
    pub node_selector: NodeSelector,

    /// Idle -> Cordon -> Drain -> Complete; stages may be skipped, never revisited.
    #[serde(default)]
    pub stage: Stage,

    /// Executed from the first to the last entry during the Drain stage. Normalized by
    /// nodegrace (defaults injected, Default -> DaemonSet -> Static, ascending priority).
    /// Duplicate entries are rejected; immutable once set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_plan: Vec<DrainPlanEntry>,

    /// Why the nodes are under maintenance (e.g. `reboot (boot id ...)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
}

/// KEP-4212 NodeMaintenanceStatus, plus `nodeStatuses`, which stands in for the KEP's
/// Node `.status.maintenanceStatus` (nodegrace cannot add fields to Node).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    /// One entry per started stage (map-list keyed by `name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub stage_statuses: Vec<StageStatus>,

    /// The drain across all selected nodes: the lowest targets any node has reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_status: Option<DrainStatus>,

    /// One entry per selected node (map-list keyed by `nodeName`). Each node's daemon owns
    /// its entry through server-side apply with its own field manager; see
    /// [`crate::api::node_status_apply_patch`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_statuses: Vec<NodeMaintenanceNodeStatus>,

    /// `Drained`: True once every targeted pod terminated on every selected node; map-list keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub conditions: Vec<Condition>,
}

/// KEP-4212 StageStatus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    pub name: Stage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Time>,
}

/// KEP-4212 DrainStatus (aggregate over the selected nodes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    /// The least powerful drain targets reached by every selected node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub reached_drain_targets: Vec<DrainPlanEntry>,
    /// Pods that have not been requested to terminate yet.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub pods_pending_eviction_request: i32,
    /// Active EvictionRequests (or evictions in flight) for targeted pods.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub active_eviction_requests: i32,
    /// Human-readable state, e.g. `Draining (limited by maintenance-a)`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 4096))]
    pub drain_message: String,
}

/// Reference to a Node by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeReference {
    #[schemars(length(max = 253))]
    pub name: String,
}

/// One node's drain under this maintenance (KEP-4212 Node `MaintenanceStatus`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceNodeStatus {
    /// Map-list key; always equal to `nodeRef.name`.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
    pub node_ref: NodeReference,
    /// The pods this node currently targets; they never backtrack.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub drain_targets: Vec<DrainPlanEntry>,
    /// Why the targets are what they are, e.g. `Draining` or `Blocked by PodDisruptionBudget db/pdb`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 4096))]
    pub drain_message: String,
    /// Targeted pods that have not been requested to terminate yet.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub pods_pending_eviction_request: i32,
    /// Targeted pods with an active EvictionRequest or eviction in flight.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub active_eviction_requests: i32,
    /// Targeted pods still present (running or terminating). Zero means this node has
    /// finished its current drain targets.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub pods_remaining: i32,
    /// Non-terminal pods on the node not yet covered by the drain targets.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub pods_not_targeted: i32,
    /// When this node's daemon last wrote the entry; lets readers spot a silent node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
}

impl NodeMaintenanceNodeStatus {
    /// An empty entry for `node` with the key and `nodeRef` filled in consistently.
    pub fn for_node(node: &str) -> Self {
        Self {
            node_name: node.to_owned(),
            node_ref: NodeReference {
                name: node.to_owned(),
            },
            ..Self::default()
        }
    }
}

/// A selector matching exactly the node named `node` (by `metadata.name`, not by a label
/// the node could change). The admission policy in packaging/rbac lets a node's identity
/// create and drive only maintenances whose every term is pinned like this.
pub fn node_selector_for(node: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".to_owned(),
                operator: "In".to_owned(),
                values: Some(vec![node.to_owned()]),
            }]),
            match_expressions: None,
        }],
    }
}

/// Whether `selector` selects `node` alone, as the admission policy judges it: every
/// nodeSelectorTerm pins `metadata.name In [<node>]`. Such a maintenance is the node's own to
/// drive: spec, metadata and the aggregate status; on any other a node's identity writes
/// only its `status.nodeStatuses` entry and what follows from the entries.
pub(crate) fn is_pinned_to(selector: &NodeSelector, node: &str) -> bool {
    !selector.node_selector_terms.is_empty()
        && selector.node_selector_terms.iter().all(|t| {
            t.match_fields.iter().flatten().any(|f| {
                f.key == "metadata.name"
                    && f.operator == "In"
                    && f.values.as_deref() == Some(&[node.to_owned()][..])
            })
        })
}

/// Whether every node that reported to a maintenance says it is drained (or has completed
/// it): the only `Drained` condition a node may write on a maintenance not pinned to it.
pub(crate) fn entries_drained(status: Option<&NodeMaintenanceStatus>) -> bool {
    status.is_some_and(|s| {
        !s.node_statuses.is_empty()
            && s.node_statuses.iter().all(|e| {
                e.pods_remaining == 0 && matches!(e.drain_message.as_str(), "Drained" | "Completed")
            })
    })
}

impl NodeMaintenance {
    pub fn stage(&self) -> Stage {
        self.spec.stage
    }

    /// This node's entry in `status.nodeStatuses`, if any.
    pub fn node_status(&self, node: &str) -> Option<&NodeMaintenanceNodeStatus> {
        self.status
            .as_ref()?
            .node_statuses
            .iter()
            .find(|s| s.node_name == node)
    }

    /// The `Drained` condition's status (`True`/`False`/`Unknown`), if set.
    pub fn drained(&self) -> Option<&str> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == super::CONDITION_DRAINED)
            .map(|c| c.status.as_str())
    }
}
