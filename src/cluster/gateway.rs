//! The one place the apiserver's answers are read. Every request and watch of the engine
//! and the controllers hands what came back to this module, which reads it once into a
//! [`Reply`] (the object, or a [`Failure`] of one [`Kind`]: unusable, throttled, conflict,
//! not found, refused) through `plan::reachability`, and, for a caller that keeps a record of
//! the apiserver's reachability (the engine, through [`Reach`]), records it: no caller marks
//! the apiserver reachable or unreachable by hand, and none looks inside kube's errors.

use std::time::Duration;

use kube::core::Status;
use kube::runtime::watcher;

use crate::plan::reachability::{self, Answer};

/// An answer of the apiserver as callers act on it: the object asked for, or what else
/// came back.
pub(crate) type Reply<T> = Result<T, Failure>;

/// What an answer that is not the object asked for says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Not reached, no answer that can be read (a proxy's HTML page, a body cut short), or
    /// an answer that refuses whatever is asked (401, 403, 5xx): see
    /// [`reachability::unusable`].
    Unusable,
    /// 429 that is not a disruption budget's: the apiserver did not look at the request,
    /// and asks to wait `retry_after` (at least 1 s, at most [`MAX_RETRY_AFTER`]).
    Throttled { retry_after: Duration },
    /// 409: the object changed since it was read, or already exists.
    Conflict,
    /// 404.
    NotFound,
    /// Any other answer about the request (400, 410, 422, a budget's 429, a code no
    /// apiserver sends), with its code; `None`: the request was never sent (it could not be
    /// built), or the error is not the apiserver's.
    Refused { code: Option<u16> },
}

/// An answer that is not the object asked for: what it says, and the error with its
/// context.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) kind: Kind,
    pub(crate) error: anyhow::Error,
}

impl Failure {
    pub(crate) fn new(error: impl Into<anyhow::Error>) -> Self {
        let error = error.into();
        Failure {
            kind: classify(&error),
            error,
        }
    }

    pub(crate) fn context(self, context: impl std::fmt::Display + Send + Sync + 'static) -> Self {
        Failure {
            kind: self.kind,
            error: self.error.context(context),
        }
    }

    /// The Status the apiserver answered with, if it answered.
    pub(crate) fn status(&self) -> Option<&Status> {
        match kube_error(&self.error) {
            Some(kube::Error::Api(status)) => Some(status),
            _ => None,
        }
    }

    pub(crate) fn code(&self) -> Option<u16> {
        self.status().map(|s| s.code)
    }

    /// Whether the apiserver does not serve the API asked (404, or 405 for a verb the
    /// resource does not take): it cannot say, rather than refusing.
    pub(crate) fn not_served(&self) -> bool {
        matches!(self.code(), Some(404 | 405))
    }

    /// Whether the apiserver answered (and refused) rather than not being reached.
    pub(crate) fn answered(&self) -> bool {
        self.status().is_some()
    }

    pub(crate) fn is(&self, kind: Kind) -> bool {
        self.kind == kind
    }

    pub(crate) fn apiserver_unusable(&self) -> bool {
        self.kind == Kind::Unusable
    }

    pub(crate) fn throttled(&self) -> Option<Duration> {
        match self.kind {
            Kind::Throttled { retry_after } => Some(retry_after),
            _ => None,
        }
    }

    /// The error on one line (see [`error_text`]).
    pub(crate) fn text(&self) -> String {
        error_text(&self.error)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text())
    }
}

impl From<Failure> for anyhow::Error {
    fn from(f: Failure) -> Self {
        f.error
    }
}

/// `r` read as a [`Reply`], nothing recorded: for the callers that keep no record of the
/// apiserver's reachability.
pub(crate) fn reply<T, E: Into<anyhow::Error>>(r: Result<T, E>) -> Reply<T> {
    r.map_err(Failure::new)
}

/// The record of the apiserver's reachability a caller keeps (the engine's): told of every
/// answer by this module alone.
pub(crate) trait Reach {
    /// A usable answer: the apiserver answered, about the request.
    fn usable_answer(&self);
    /// An unusable answer, or none; `error` says which.
    fn unusable_answer(&self, error: &str);
}

/// `r` read as a [`Reply`] and recorded in `reach`: unusable and throttled answers as
/// unusable ([`reachability::unusable`]), every other answer as usable.
pub(crate) fn answer<T, E: Into<anyhow::Error>>(
    reach: &(impl Reach + ?Sized),
    r: Result<T, E>,
) -> Reply<T> {
    let r = reply(r);
    record(reach, r.as_ref().err(), true);
    r
}

/// [`answer`] for requests sent a window at a time (the drain's pod terminations): a
/// throttled one records nothing, as the window's pace is the answer to it
/// ([`reachability::Window`]); the apiserver is not unusable because it paces one kind of
/// request.
pub(crate) fn answer_paced<T, E: Into<anyhow::Error>>(
    reach: &(impl Reach + ?Sized),
    r: Result<T, E>,
) -> Reply<T> {
    let r = reply(r);
    record(reach, r.as_ref().err(), false);
    r
}

fn record(reach: &(impl Reach + ?Sized), failure: Option<&Failure>, throttled_counts: bool) {
    match failure.map(|f| f.kind) {
        Some(Kind::Unusable) => {
            reach.unusable_answer(&failure.map(Failure::text).unwrap_or_default())
        }
        Some(Kind::Throttled { .. }) if throttled_counts => {
            reach.unusable_answer(&failure.map(Failure::text).unwrap_or_default())
        }
        Some(Kind::Throttled { .. }) => {}
        _ => reach.usable_answer(),
    }
}

/// An error passed up from requests below (a whole pass of the engine), read: recorded
/// when it says the apiserver cannot be used (its request may have been made by a helper
/// that keeps no record), never as a usable answer (it may not be the apiserver's).
pub(crate) fn passed_up(reach: &(impl Reach + ?Sized), err: anyhow::Error) -> Failure {
    let f = Failure::new(err);
    if f.apiserver_unusable() {
        reach.unusable_answer(&f.text());
    }
    f
}

/// A request or a list that got no answer in time (`what` says which and how long).
pub(crate) fn no_answer(reach: &(impl Reach + ?Sized), what: &dyn std::fmt::Display) {
    reach.unusable_answer(&what.to_string());
}

/// A watch's list came in, or an object of it: the apiserver answered.
pub(crate) fn listed(reach: &(impl Reach + ?Sized)) {
    reach.usable_answer();
}

/// A watch of `kind` failed with `err`: what it says of the apiserver is recorded, and an
/// event nodegrace cannot use is said once in the log (see [`unusable_watch_event`]).
pub(crate) fn watch_failed(reach: &(impl Reach + ?Sized), kind: &str, err: &watcher::Error) {
    if let Some(what) = unusable_watch_event(err) {
        tracing::warn!(kind = %kind, error = %err, "{kind}: {what}");
    }
    let inner = match err {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => Some(e),
        _ => None,
    };
    match inner.map(kind_of) {
        // A resource the apiserver does not serve: every pass would wait on its view.
        Some(Kind::NotFound) => reach.unusable_answer(&format!(
            "the apiserver does not serve {kind} (is its CRD installed? see /usr/share/nodegrace/crds): {err}"
        )),
        Some(Kind::Unusable | Kind::Throttled { .. }) => {
            reach.unusable_answer(&format!("watching {kind}: {err}"));
        }
        _ => reach.usable_answer(),
    }
    tracing::debug!(kind = %kind, error = %err, "watch error; retrying with back-off");
}

/// The first kube error in `err`'s chain: the only place one is looked for.
fn kube_error(err: &anyhow::Error) -> Option<&kube::Error> {
    err.chain().find_map(|c| c.downcast_ref::<kube::Error>())
}

/// What `err` says (an error that is not kube's: [`Kind::Refused`] without a code).
pub(crate) fn classify(err: &anyhow::Error) -> Kind {
    kube_error(err).map_or(Kind::Refused { code: None }, kind_of)
}

/// What a kube error says.
pub(crate) fn kind_of(err: &kube::Error) -> Kind {
    let answer = match err {
        kube::Error::Api(status) => {
            if let Some(retry_after) = throttled(status) {
                return Kind::Throttled { retry_after };
            }
            if status.code == 429 {
                // A disruption budget's refusal: an answer about this pod alone.
                return Kind::Refused { code: Some(429) };
            }
            Answer::Status {
                code: status.code,
                message: &status.message,
            }
        }
        kube::Error::BuildRequest(_) => Answer::NotSent,
        _ => Answer::NothingReadable,
    };
    if reachability::unusable(answer) {
        return Kind::Unusable;
    }
    match answer {
        Answer::Status { code: 409, .. } => Kind::Conflict,
        Answer::Status { code: 404, .. } => Kind::NotFound,
        Answer::Status { code, .. } => Kind::Refused { code: Some(code) },
        Answer::NotSent | Answer::NothingReadable => Kind::Refused { code: None },
    }
}

/// The longest wait a throttling apiserver's 429 is taken to ask for.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// How long to wait when `status` is the apiserver throttling the request (a 429 that is
/// not a disruption budget's: API Priority and Fairness, max-in-flight): the apiserver did
/// not look at the request, so nothing was asked. Its wait is in a Retry-After header, which
/// kube's client does not pass on, and in `details.retryAfterSeconds` when the body is a
/// Status (API Priority and Fairness answers plain text): at least 1 s.
fn throttled(status: &Status) -> Option<Duration> {
    if status.code != 429 || is_budget_refusal(status) {
        return None;
    }
    let secs = status.details.as_ref().map_or(0, |d| d.retry_after_seconds);
    Some(Duration::from_secs(u64::from(secs.max(1))).min(MAX_RETRY_AFTER))
}

/// The Eviction API's 429 for a disruption budget: "Cannot evict pod as it would violate
/// the pod's disruption budget.", with a cause of reason `DisruptionBudget`.
fn is_budget_refusal(status: &Status) -> bool {
    status.message.starts_with("Cannot evict pod")
        || status
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.reason == "DisruptionBudget"))
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

/// Clipped as the other causes are: an apiserver (or what answers in its place) can send a
/// message of megabytes, and this text is printed and logged at every retry.
fn status_text(status: &Status) -> String {
    let mut text = format!("HTTP {}", status.code);
    if !status.reason.is_empty() {
        text.push_str(&format!(" ({})", crate::text::clip(&status.reason)));
    }
    if !status.message.is_empty() {
        text.push_str(&format!(": {}", crate::text::clip(&status.message)));
    }
    text
}

/// What is wrong with an event a watch delivered, when that is what `err` says: kube reads a
/// line of an unknown type as an empty Status (code 0), and refuses an object without a
/// resourceVersion (its watcher then lists again).
pub(crate) fn unusable_watch_event(err: &watcher::Error) -> Option<&'static str> {
    use watcher::Error;
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

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;
