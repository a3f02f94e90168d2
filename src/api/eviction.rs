//! `EvictionRequest` (KEP-4563) as a namespaced CRD in `nodegrace.dev/v1alpha1`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// RFC 1123 DNS subdomain, as the KEP requires for requester and interceptor names.
pub const DNS1123_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

pub(crate) const HEARTBEAT_DEADLINE_DEFAULT_SECONDS: i32 = 1_800;
pub(crate) const MAX_INTERCEPTORS: usize = 100;

/// Request to evict one pod, named after the pod's UID (KEP-4563 EvictionRequestSpec).
// Repeated `type_ = "string"` inside the printcolumns reads as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nodegrace.dev",
    version = "v1alpha1",
    kind = "EvictionRequest",
    plural = "evictionrequests",
    singular = "evictionrequest",
    shortname = "evr",
    category = "nodegrace",
    namespaced,
    status = "EvictionRequestStatus",
    derive = "PartialEq",
    doc = "Request to evict a pod gracefully through its interceptors, then the Eviction API (KEP-4563). The name is the pod UID.",
    printcolumn(name = "Pod", type_ = "string", json_path = ".spec.target.podRef.name"),
    printcolumn(
        name = "Interceptor",
        type_ = "string",
        json_path = ".status.activeInterceptorName"
    ),
    printcolumn(
        name = "Complete",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Complete\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct EvictionRequestSpec {
    /// Only `Soft` exists. Immutable.
    #[serde(rename = "type", default)]
    pub type_: EvictionRequestType,

    /// The pod to evict. Immutable.
    pub target: EvictionTarget,

    /// Who asked for the eviction (map-list keyed by `name`). At least one on creation;
    /// empty means cancelled. Frozen while the cancellation policy is `Forbid` or once the
    /// request is `Complete`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub requesters: Vec<Requester>,

    /// Interceptors from the pod, chosen from the highest index down (map-list keyed by
    /// `name`, at most 100). Set once on creation; immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub interceptors: Vec<Interceptor>,

    /// How long an interceptor may go without updating `status.heartbeatTime` before
    /// control passes on. 600..=86400, default 1800. Immutable.
    #[serde(default = "default_heartbeat_deadline_seconds")]
    #[schemars(range(min = 600, max = 86400))]
    pub heartbeat_deadline_seconds: i32,
}

fn default_heartbeat_deadline_seconds() -> i32 {
    HEARTBEAT_DEADLINE_DEFAULT_SECONDS
}

/// KEP-4563 EvictionRequestType.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EvictionRequestType {
    /// Evict gracefully: interceptors first (each as long as it heartbeats), then the
    /// Eviction API, which honours PodDisruptionBudgets.
    #[default]
    Soft,
}

/// KEP-4563 EvictionTarget: exactly one target; only pods exist today.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvictionTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_ref: Option<LocalPodReference>,
}

/// KEP-4563 LocalPodReference: name and UID, so that a new pod with the same name is
/// never evicted by an old request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalPodReference {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 128))]
    pub uid: String,
}

/// KEP-4563 Requester.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Requester {
    /// DNS subdomain naming the requester, e.g. `nodemaintenance.nodegrace.dev`.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS1123_SUBDOMAIN_PATTERN))]
    pub name: String,
}

/// KEP-4563 Interceptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Interceptor {
    /// DNS subdomain naming the interceptor, e.g. `deployment.apps.k8s.io`.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS1123_SUBDOMAIN_PATTERN))]
    pub name: String,
}

/// KEP-4563 EvictionRequestStatus.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvictionRequestStatus {
    /// `Complete` (see [`crate::api::CONDITION_COMPLETE`]) and interceptor-defined ones;
    /// map-list keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub conditions: Vec<Condition>,

    /// Human-readable progress; may be empty.
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub message: String,

    /// The interceptor currently in charge; must be one of `spec.interceptors`. Cleared
    /// once the request completes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub active_interceptor_name: Option<String>,

    /// The active interceptor has finished (fully or partially) or given up.
    #[serde(default)]
    pub active_interceptor_completed: bool,

    /// When the active interceptor expects to finish, if it can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_interceptor_finish_time: Option<Time>,

    /// Last progress report of the active interceptor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<Time>,

    /// `Forbid` blocks cancellation (and deletion) while the pod exists; absent means
    /// `Allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_request_cancellation_policy: Option<EvictionRequestCancellationPolicy>,

    /// Set by the eviction-request controller once it falls back to the Eviction API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_eviction_status: Option<PodEvictionStatus>,
}

/// KEP-4563 EvictionRequestCancellationPolicy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EvictionRequestCancellationPolicy {
    #[default]
    Allow,
    Forbid,
}

/// KEP-4563 PodEvictionStatus.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodEvictionStatus {
    /// Failed Eviction API calls (e.g. 429 from a PodDisruptionBudget). Only increases.
    #[serde(rename = "failedAPIEvictionCounter")]
    #[schemars(range(min = 0))]
    pub failed_api_eviction_counter: i32,
}

impl EvictionRequest {
    /// A new request by `requester` for the pod `namespace/pod_name` with UID `pod_uid`,
    /// named after the UID as the KEP requires.
    pub fn for_pod(
        namespace: &str,
        pod_name: &str,
        pod_uid: &str,
        requester: &str,
        interceptors: Vec<Interceptor>,
    ) -> Self {
        let mut request = EvictionRequest::new(
            pod_uid,
            EvictionRequestSpec {
                type_: EvictionRequestType::Soft,
                target: EvictionTarget {
                    pod_ref: Some(LocalPodReference {
                        name: pod_name.to_owned(),
                        uid: pod_uid.to_owned(),
                    }),
                },
                requesters: vec![Requester {
                    name: requester.to_owned(),
                }],
                interceptors,
                heartbeat_deadline_seconds: HEARTBEAT_DEADLINE_DEFAULT_SECONDS,
            },
        );
        request.metadata = ObjectMeta {
            name: Some(pod_uid.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        };
        request
    }

    pub fn pod_ref(&self) -> Option<&LocalPodReference> {
        self.spec.target.pod_ref.as_ref()
    }

    pub(crate) fn has_requester(&self, requester: &str) -> bool {
        self.spec.requesters.iter().any(|r| r.name == requester)
    }

    /// `Complete=True`: no interceptor works on it any more (pod gone, terminal or cancelled).
    pub(crate) fn is_complete(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == super::CONDITION_COMPLETE && c.status == "True")
        })
    }

    /// The effective cancellation policy (absent means `Allow`).
    pub(crate) fn cancellation_policy(&self) -> EvictionRequestCancellationPolicy {
        self.status
            .as_ref()
            .and_then(|s| s.eviction_request_cancellation_policy)
            .unwrap_or_default()
    }

    pub fn failed_api_evictions(&self) -> i32 {
        self.status
            .as_ref()
            .and_then(|s| s.pod_eviction_status)
            .map_or(0, |p| p.failed_api_eviction_counter)
    }
}
