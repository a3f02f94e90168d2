//! The Kubernetes side: the node's own object, its pods, NodeMaintenances and
//! EvictionRequests, through kube. Every request follows the real apiserver's semantics:
//! optimistic concurrency on resourceVersion, UID preconditions, 429 back-off.

pub(crate) mod backoff;
pub(crate) mod bounded;
pub(crate) mod client;
pub(crate) mod engine;
pub(crate) mod evict;
pub(crate) mod eviction_request;
pub(crate) mod identity;
pub(crate) mod kubeconfig;
pub(crate) mod node;
pub(crate) mod nodesel;
mod slim;
pub(crate) mod terminate;

pub(crate) use engine::{
    complete_shutdown_maintenance, AfterBoot, Engine, EngineError, EngineOptions,
};
pub(crate) use engine::{list_maintenances_for, other_active_maintenances, FallbackSummary};
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

/// An error and its causes on one line, as `{:#}` writes them (each clipped to a few hundred
/// characters: one may quote a whole value of a file), except that an apiserver's
/// Status reads `HTTP 500 (InternalError): message` rather than kube's text for it (which
/// repeats the Status as a Rust debug dump, and is `: InternalError` for an empty message).
pub(crate) fn error_text(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut causes = err.chain();
    while let Some(cause) = causes.next() {
        if let Some(kube::Error::Api(status)) = cause.downcast_ref::<kube::Error>() {
            parts.push(status_text(status));
            // Its source is the same Status.
            causes.next();
        } else {
            parts.push(crate::text::clip(&cause.to_string()).into_owned());
        }
    }
    parts.join(": ").replace('\n', " ")
}

fn status_text(status: &kube::core::Status) -> String {
    let mut text = format!("HTTP {}", status.code);
    if !status.reason.is_empty() {
        text.push_str(&format!(" ({})", status.reason));
    }
    if !status.message.is_empty() {
        text.push_str(&format!(": {}", status.message));
    }
    text
}

/// Status code of a kube API error, if it is one.
pub(crate) fn api_error_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> anyhow::Error {
        anyhow::Error::new(kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..kube::core::Status::default()
        })))
    }

    #[test]
    fn an_apiserver_status_reads_as_http_code_reason_and_message() {
        let empty = api_error(500, "InternalError", "").context("listing the pods of node-a");
        assert_eq!(
            error_text(&empty),
            "listing the pods of node-a: HTTP 500 (InternalError)"
        );
        let forbidden = api_error(
            403,
            "Forbidden",
            "pods is forbidden: User \"x\" cannot list",
        );
        assert_eq!(
            error_text(&forbidden),
            "HTTP 403 (Forbidden): pods is forbidden: User \"x\" cannot list"
        );
        assert_eq!(error_text(&api_error(502, "", "")), "HTTP 502");
        let other = anyhow::anyhow!("refused").context("connecting");
        assert_eq!(error_text(&other), format!("{other:#}"));
    }
}
