//! Decisions for the in-tree EvictionRequest API of Kubernetes 1.37 (`lifecycle.k8s.io/v1alpha1`,
//! KEP-4563 as shipped): nodegrace's requester key, what a pod's `Eviction` says about its
//! progress, and what is wrong with the responders a pod declares (which API a drain asks
//! through is `plan::wiring`'s). No I/O.

use k8s_openapi::api::core::v1::EvictionResponder;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};

use super::names;

/// The domain of nodegrace's requester keys.
pub(crate) const REQUESTER_DOMAIN: &str = "nodegrace.dev";

/// The default responder the in-tree controller adds to every pod: it calls the Eviction API.
pub(crate) const IMPERATIVE_EVICTOR: &str = "imperative-eviction.k8s.io/evictor";

/// Responders a pod may declare in `spec.evictionResponders` (the default one comes on top).
pub(crate) const MAX_POD_RESPONDERS: usize = 10;

/// Highest responder priority; 0..=999 are reserved for `*.k8s.io` responders.
pub(crate) const MAX_RESPONDER_PRIORITY: i32 = 100_000;
pub(crate) const RESERVED_PRIORITY_MAX: i32 = 999;

/// What is wrong with `key` as a domain-prefixed key (`example.com/name`, the form of
/// requester and responder names), if anything.
pub(crate) fn domain_prefixed_key_problem(key: &str) -> Option<String> {
    let Some((prefix, name)) = key.split_once('/') else {
        return Some(format!("{key:?} has no domain prefix (example.com/{key})"));
    };
    if !names::is_dns_subdomain(prefix) {
        return Some(format!("the prefix of {key:?} is not a DNS subdomain"));
    }
    if !names::is_label_name(name) {
        return Some(format!(
            "the name part of {key:?} must be 1-63 alphanumeric characters, '-', '_' or '.', alphanumeric at both ends"
        ));
    }
    None
}

/// Whether `key`'s domain is reserved for the Kubernetes project (`*.k8s.io`, `*.kubernetes.io`).
pub(crate) fn is_reserved_domain(key: &str) -> bool {
    let domain = key.split_once('/').map_or(key, |(d, _)| d);
    ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|r| domain == *r || domain.ends_with(&format!(".{r}")))
}

/// FNV-1a: stable across releases (the key must not change when the daemon is upgraded).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// nodegrace's requester key on `node`: `nodegrace.dev/<node>`. A node name longer than a
/// key's name part allows (63) keeps its first 46 characters and gains a hash of the whole.
pub fn requester_key(node: &str) -> String {
    if names::is_label_name(node) {
        return format!("{REQUESTER_DOMAIN}/{node}");
    }
    let head: String = node
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(46)
        .collect();
    let head = head.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let hash = format!("{:016x}", fnv1a(node));
    if head.is_empty() {
        format!("{REQUESTER_DOMAIN}/{hash}")
    } else {
        format!("{REQUESTER_DOMAIN}/{head}-{hash}")
    }
}

/// The name of nodegrace's EvictionRequest for the pod with `uid`. Upstream leaves names to
/// the requester; one requester per pod (the pod's node) makes `nodegrace-<pod UID>` unique
/// and predictable, so a restarted daemon finds its request with a GET.
pub(crate) fn request_name(pod_uid: &str) -> String {
    format!("nodegrace-{pod_uid}")
}

/// `spec.intent` values of an EvictionRequest.
pub(crate) const INTENT_EVICTION: &str = "Eviction";
pub(crate) const INTENT_WITHDRAWN: &str = "Withdrawn";

/// Where a pod's eviction stands, as its `Eviction` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Progress {
    /// No responder active yet.
    Pending,
    /// A responder works on it (`message` is its latest word, e.g. a PodDisruptionBudget
    /// refusing the imperative evictor).
    Responding {
        responder: String,
        message: Option<String>,
    },
    /// `TargetEvicted=True`.
    Evicted,
    /// `Failed=True` with this reason and message.
    Failed { reason: String, message: String },
    /// The Eviction targets another pod (UID) than the one nodegrace asked about.
    WrongTarget { uid: String },
}

type Condition = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

fn condition_true<'a>(conditions: Option<&'a Vec<Condition>>, kind: &str) -> Option<&'a Condition> {
    conditions?
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")
}

/// What the final conditions (`TargetEvicted`, `Failed`) of an Eviction or an EvictionRequest
/// say, if they are final.
fn final_conditions(conditions: Option<&Vec<Condition>>) -> Option<Progress> {
    if condition_true(conditions, "TargetEvicted").is_some() {
        return Some(Progress::Evicted);
    }
    condition_true(conditions, "Failed").map(|c| Progress::Failed {
        reason: c.reason.clone(),
        message: c.message.clone(),
    })
}

/// Reads nodegrace's own EvictionRequest: its conditions are the Eviction's, copied by the
/// in-tree controller, or its own `Failed` (`EvictionInvalid`: no Eviction is made, e.g. for a
/// pod of a PodGroup). `None` while nothing is final.
pub(crate) fn read_request(request: &EvictionRequest) -> Option<Progress> {
    final_conditions(request.status.as_ref().and_then(|s| s.conditions.as_ref()))
}

/// Reads `eviction` for the pod with `uid`.
pub(crate) fn read_eviction(eviction: &Eviction, uid: &str) -> Progress {
    let target = eviction.spec.target.pod.as_ref().map(|p| p.uid.as_str());
    if target != Some(uid) {
        return Progress::WrongTarget {
            uid: target.unwrap_or_default().to_owned(),
        };
    }
    let status = eviction.status.as_ref();
    if let Some(done) = final_conditions(status.and_then(|s| s.conditions.as_ref())) {
        return done;
    }
    let active = status
        .and_then(|s| s.target_responders.as_ref())
        .into_iter()
        .flatten()
        .find(|r| r.state == "Active");
    match active {
        Some(r) => Progress::Responding {
            responder: r.name.clone(),
            message: status
                .and_then(|s| s.responders.as_ref())
                .into_iter()
                .flatten()
                .find(|s| s.name == r.name)
                .and_then(|s| s.message.clone())
                .filter(|m| !m.trim().is_empty()),
        },
        None => Progress::Pending,
    }
}

/// What nodegrace does about a pod's progress while it still wants the pod gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Response {
    /// Nothing to tell the drain.
    Nothing,
    /// Tell the drain what holds the pod (`None`: nothing any more).
    Report(Option<String>),
    /// The in-tree controllers gave up without evicting the pod: nodegrace evicts it through
    /// the Eviction API itself (budgets still honoured), so that the drain goes on before the
    /// deadline escalation.
    EvictDirectly { why: String },
    /// The Eviction is about another pod: never act on it; say so.
    Refuse { named_uid: String },
}

/// What `progress` calls for.
pub(crate) fn respond(progress: &Progress) -> Response {
    match progress {
        Progress::Pending => Response::Nothing,
        Progress::Responding { responder, message } => {
            let evictor = is_imperative_evictor(responder);
            let text = match message {
                // The evictor's other messages (evicted, terminating) hold nothing.
                Some(m) if evictor && !is_refusal(m) => return Response::Report(None),
                Some(m) if evictor => without_retry_count(m),
                Some(m) => format!("responder {responder}: {m}"),
                None if evictor => return Response::Report(None),
                None => format!("responder {responder}"),
            };
            Response::Report(Some(text))
        }
        Progress::Evicted => Response::Report(None),
        // The requester withdrew (or deleted) its request: nothing left to do for it.
        Progress::Failed { reason, .. } if reason == "CanceledDueToNoRequesters" => {
            Response::Nothing
        }
        Progress::Failed { reason, message } => Response::EvictDirectly {
            why: if message.is_empty() {
                reason.clone()
            } else {
                format!("{reason}: {message}")
            },
        },
        Progress::WrongTarget { uid } => Response::Refuse {
            named_uid: uid.clone(),
        },
    }
}

/// Why an eviction was refused, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A PodDisruptionBudget (or another reason the apiserver gave for a 429).
    Budget,
    /// The apiserver throttled the request without looking at it.
    Throttled,
    /// Any other failure.
    Error,
}

/// What an imperative evictor's message says of its refused evictions of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EvictorRefusals {
    /// The evictor (responder name).
    pub evictor: String,
    /// Refused attempts so far, as the message counts them.
    pub attempts: u32,
    /// Why the last one was refused.
    pub reason: Refusal,
}

/// The refusals an imperative evictor reports in `progress`, if it reports any. The reason
/// is read from the Eviction API's words the message carries: a disruption budget, the
/// apiserver's throttling ("Too many requests"), else an error.
pub(crate) fn evictor_refusals(progress: &Progress) -> Option<EvictorRefusals> {
    let Progress::Responding {
        responder,
        message: Some(message),
    } = progress
    else {
        return None;
    };
    if !is_imperative_evictor(responder) || !is_refusal(message) {
        return None;
    }
    let attempts = recorded_attempts(message).max(retries_counted(message));
    let words = message.to_ascii_lowercase();
    let reason = if words.contains("disruption budget") || words.contains("poddisruptionbudget") {
        Refusal::Budget
    } else if words.contains("too many requests") {
        Refusal::Throttled
    } else {
        Refusal::Error
    };
    (attempts > 0).then(|| EvictorRefusals {
        evictor: responder.clone(),
        attempts,
        reason,
    })
}

/// Failed attempts so far as upstream's evictor words them in its message: `(attempts=N)`.
fn recorded_attempts(message: &str) -> u32 {
    const MARK: &str = "(attempts=";
    let Some(i) = message.find(MARK) else {
        return 0;
    };
    let rest = &message[i + MARK.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    match rest[digits.len()..].starts_with(')') {
        true => digits.parse().unwrap_or(0),
        false => 0,
    }
}

/// How the KEP's imperative evictor words its retry count: `number of retries: N`.
const KEP_RETRIES: &str = "number of retries";

/// The count of the KEP's wording, `number of retries: N`; 0 without one.
fn retries_counted(message: &str) -> u32 {
    let Some(i) = message.find(KEP_RETRIES) else {
        return 0;
    };
    let digits: String = message[i + KEP_RETRIES.len()..]
        .trim_start_matches(|c: char| c == ':' || c.is_whitespace())
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// The in-tree imperative evictor: what it says is the Eviction API's answer, not a
/// responder's own work.
fn is_imperative_evictor(responder: &str) -> bool {
    responder == IMPERATIVE_EVICTOR
}

/// An imperative evictor's message about a refused eviction: it counts its attempts.
fn is_refusal(message: &str) -> bool {
    message.contains("(attempts=") || message.contains(KEP_RETRIES)
}

/// The imperative evictor's message without its retry count (`(attempts=N)`, as upstream's
/// code writes it, or the KEP's `number of retries: N`), so that the blocker the drain names
/// stays the same from one retry to the next.
fn without_retry_count(message: &str) -> String {
    if let Some(i) = message.find(" (attempts=") {
        if let Some(end) = message[i..].find(')') {
            return format!("{}{}", &message[..i], &message[i + end + 1..]);
        }
    }
    match message.find(KEP_RETRIES) {
        Some(i) => message[..i]
            .trim_end_matches(|c: char| c == ',' || c == ';' || c.is_whitespace())
            .to_owned(),
        None => message.to_owned(),
    }
}

/// A responder as a pod declares it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DeclaredResponder {
    pub name: String,
    pub priority: i64,
}

/// The responders a pod declares, and what is wrong with them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResponderCheck {
    /// The responders in force, from `spec.evictionResponders`.
    pub responders: Vec<DeclaredResponder>,
    /// One sentence per problem, for a log line or an event.
    pub problems: Vec<String>,
}

/// Checks the responders a pod declares in `spec.evictionResponders` (`field`) against the
/// in-tree rules (at most [`MAX_POD_RESPONDERS`], unique domain-prefixed names outside the
/// reserved domains, priority 0..=100000 with 0..=999 only for `*.k8s.io`).
pub(crate) fn check_responders(field: Option<&[EvictionResponder]>) -> ResponderCheck {
    let responders: Vec<DeclaredResponder> = field
        .unwrap_or_default()
        .iter()
        .map(|r| DeclaredResponder {
            name: r.name.clone(),
            priority: i64::from(r.priority),
        })
        .collect();
    ResponderCheck {
        problems: rule_problems(&responders),
        responders,
    }
}

/// The in-tree rules the declared `responders` break.
fn rule_problems(responders: &[DeclaredResponder]) -> Vec<String> {
    let mut problems = Vec::new();
    if responders.len() > MAX_POD_RESPONDERS {
        problems.push(format!(
            "{} responders declared; the in-tree API allows at most {MAX_POD_RESPONDERS}",
            responders.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in responders {
        if !seen.insert(r.name.as_str()) {
            problems.push(format!("responder {} is declared twice", r.name));
        }
        if let Some(why) = domain_prefixed_key_problem(&r.name) {
            problems.push(format!("responder name invalid: {why}"));
        } else if is_reserved_domain(&r.name) {
            problems.push(format!(
                "responder {} uses a domain reserved for Kubernetes",
                r.name
            ));
        }
        if !(0..=i64::from(MAX_RESPONDER_PRIORITY)).contains(&r.priority) {
            problems.push(format!(
                "responder {}: priority {} is outside 0..={MAX_RESPONDER_PRIORITY}",
                r.name, r.priority
            ));
        } else if r.priority <= i64::from(RESERVED_PRIORITY_MAX) && !is_reserved_domain(&r.name) {
            problems.push(format!(
                "responder {}: priorities 0..={RESERVED_PRIORITY_MAX} are reserved for *.k8s.io responders",
                r.name
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests;
