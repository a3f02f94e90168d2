//! `EvictionRequest` and `Eviction` as CRDs in `lifecycle.nodegrace.dev/v1alpha1`: the shapes
//! Kubernetes 1.37 shipped in-tree as `lifecycle.k8s.io/v1alpha1` (KEP-4563), for clusters
//! that do not serve that API. Spec and status are k8s-openapi's in-tree types, so an object
//! of ours and an in-tree one differ only in `apiVersion`; [`From`] converts both ways, and
//! one requester serves both APIs.
//!
//! A requester writes one `EvictionRequest` per target (`spec.requester`, a domain-prefixed
//! key; `spec.intent` `Eviction` or `Withdrawn`); the eviction-request controller keeps one
//! `Eviction` per target pod with the requesters' intents, the pod's responders in priority
//! order with their states, each responder's progress, and the `Failed` / `TargetEvicted`
//! conditions.

use k8s_openapi::api::lifecycle::v1alpha1 as intree;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group and version of these CRDs.
pub const LIFECYCLE_API_VERSION: &str = crate::plan::evictions::CRD_API_VERSION;
pub const LIFECYCLE_GROUP: &str = "lifecycle.nodegrace.dev";
pub const EVICTION_REQUESTS_CRD_NAME: &str = "evictionrequests.lifecycle.nodegrace.dev";
pub const EVICTIONS_CRD_NAME: &str = "evictions.lifecycle.nodegrace.dev";

/// One requester's wish about one pod (in-tree `EvictionRequestSpec`).
// Repeated `type_ = "string"` inside the printcolumns reads as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lifecycle.nodegrace.dev",
    version = "v1alpha1",
    kind = "EvictionRequest",
    plural = "evictionrequests",
    singular = "evictionrequest",
    category = "nodegrace",
    namespaced,
    status = "intree::EvictionRequestStatus",
    derive = "PartialEq",
    doc = "One requester's request to evict a pod gracefully, through the responders the pod declares and then the Eviction API: the in-tree lifecycle.k8s.io/v1alpha1 EvictionRequest of Kubernetes 1.37, for clusters that do not serve it.",
    printcolumn(name = "Pod", type_ = "string", json_path = ".spec.target.pod.name"),
    printcolumn(name = "Requester", type_ = "string", json_path = ".spec.requester"),
    printcolumn(name = "Intent", type_ = "string", json_path = ".spec.intent"),
    printcolumn(
        name = "Evicted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"TargetEvicted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct EvictionRequestSpec {
    /// `Eviction`: the requester wants the target evicted. `Withdrawn`: it no longer does;
    /// when every requester of a target has withdrawn, its eviction is cancelled (inactive
    /// responders never run, the active one is expected to stop).
    pub intent: String,

    /// Who asks: a domain-prefixed key such as `example.com/name`; `*.k8s.io` and
    /// `*.kubernetes.io` are reserved. Immutable.
    pub requester: String,

    /// The pod to evict, by name and UID. Immutable.
    pub target: intree::EvictionRequestTarget,
}

/// The eviction of one pod as the eviction-request controller runs it (in-tree
/// `EvictionSpec`).
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lifecycle.nodegrace.dev",
    version = "v1alpha1",
    kind = "Eviction",
    plural = "evictions",
    singular = "eviction",
    category = "nodegrace",
    namespaced,
    status = "intree::EvictionStatus",
    derive = "PartialEq",
    doc = "The eviction of one pod: its requesters' intents, its responders in priority order with their states and progress, and whether it was evicted or failed. The in-tree lifecycle.k8s.io/v1alpha1 Eviction of Kubernetes 1.37, for clusters that do not serve it.",
    printcolumn(name = "Pod", type_ = "string", json_path = ".spec.target.pod.name"),
    printcolumn(
        name = "Responder",
        type_ = "string",
        json_path = ".status.targetResponders[?(@.state==\"Active\")].name"
    ),
    printcolumn(
        name = "Evicted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"TargetEvicted\")].status"
    ),
    printcolumn(
        name = "Failed",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Failed\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct EvictionSpec {
    /// The pod being evicted, by name and UID. Immutable.
    pub target: intree::EvictionTarget,
}

impl From<EvictionRequest> for intree::EvictionRequest {
    fn from(r: EvictionRequest) -> Self {
        intree::EvictionRequest {
            metadata: r.metadata,
            spec: intree::EvictionRequestSpec {
                intent: r.spec.intent,
                requester: r.spec.requester,
                target: r.spec.target,
            },
            status: r.status,
        }
    }
}

impl From<intree::EvictionRequest> for EvictionRequest {
    fn from(r: intree::EvictionRequest) -> Self {
        EvictionRequest {
            metadata: r.metadata,
            spec: EvictionRequestSpec {
                intent: r.spec.intent,
                requester: r.spec.requester,
                target: r.spec.target,
            },
            status: r.status,
        }
    }
}

impl From<Eviction> for intree::Eviction {
    fn from(e: Eviction) -> Self {
        intree::Eviction {
            metadata: e.metadata,
            spec: intree::EvictionSpec {
                target: e.spec.target,
            },
            status: e.status,
        }
    }
}

impl From<intree::Eviction> for Eviction {
    fn from(e: intree::Eviction) -> Self {
        Eviction {
            metadata: e.metadata,
            spec: EvictionSpec {
                target: e.spec.target,
            },
            status: e.status,
        }
    }
}
