//! The Kubernetes side: the node's own object, its pods, NodeMaintenances and
//! EvictionRequests, through kube. Every request follows the real apiserver's semantics:
//! optimistic concurrency on resourceVersion, UID preconditions, 429 back-off.

pub(crate) mod backoff;
pub(crate) mod bounded;
pub(crate) mod client;
pub(crate) mod engine;
pub(crate) mod evict;
pub(crate) mod eviction_request;
pub(crate) mod gateway;
pub(crate) mod identity;
pub(crate) mod kubeconfig;
pub(crate) mod listing;
pub(crate) mod node;
pub(crate) mod nodesel;
mod slim;
pub(crate) mod terminate;

pub(crate) use engine::{
    complete_shutdown_maintenance, AfterBoot, Engine, EngineError, EngineOptions,
};
pub(crate) use engine::{list_maintenances_for, other_active_maintenances, FallbackSummary};
pub(crate) use gateway::error_text;
pub(crate) use slim::Slim;
pub use terminate::{EvictionApi, PodTerminator, Request};

/// Field manager for writes that are not per-node server-side applies.
pub(crate) const FIELD_MANAGER: &str = "nodegrace";

/// The recorder of nodegrace's events on `node`: every event names the same reporting
/// controller and the node as its instance, whichever part of the daemon writes it.
pub(crate) fn event_recorder(client: kube::Client, node: &str) -> kube::runtime::events::Recorder {
    kube::runtime::events::Recorder::new(
        client,
        kube::runtime::events::Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: Some(node.to_owned()),
        },
    )
}
