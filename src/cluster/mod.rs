//! The Kubernetes side: the node's own object, its pods, NodeMaintenances and
//! EvictionRequests, through kube. Every request follows the real apiserver's semantics:
//! optimistic concurrency on resourceVersion, UID preconditions, 429 back-off.

pub(crate) mod backoff;
pub mod client;
pub mod engine;
pub mod evict;
pub mod eviction_request;
pub mod identity;
pub mod node;
pub mod nodesel;
mod slim;
pub mod terminate;

pub use engine::{
    complete_shutdown_maintenance, shutdown_maintenance_name, AfterBoot, Engine, EngineError,
    EngineOptions,
};
pub(crate) use engine::{list_maintenances_for, other_active_maintenances, FallbackSummary};
pub(crate) use slim::Slim;
pub use terminate::{EvictionApi, PodTerminator, Request};

/// Field manager for writes that are not per-node server-side applies.
pub(crate) const FIELD_MANAGER: &str = "nodegrace";

/// Status code of a kube API error, if it is one.
pub(crate) fn api_error_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}
