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

/// What is wrong with an event a watch delivered, when that is what `err` says: kube reads a
/// line of an unknown type as an empty Status (code 0), and refuses an object without a
/// resourceVersion (its watcher then lists again).
pub(crate) fn unusable_watch_event(err: &kube::runtime::watcher::Error) -> Option<&'static str> {
    use kube::runtime::watcher::Error;
    match err {
        Error::NoResourceVersion => Some(
            "the watch sent an object without a resourceVersion: nothing can resume from it, so the view is listed again",
        ),
        Error::WatchFailed(kube::Error::Api(status)) if status.code == 0 => Some(
            "the watch sent an event nodegrace cannot read (of a type no apiserver sends): skipped",
        ),
        Error::WatchFailed(kube::Error::SerdeError(_)) => {
            Some("the watch sent an event nodegrace cannot read: skipped")
        }
        _ => None,
    }
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
