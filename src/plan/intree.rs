//! Decisions for the in-tree EvictionRequest API of Kubernetes 1.37 (`lifecycle.k8s.io/v1alpha1`,
//! KEP-4563 as shipped): nodegrace's requester key, what a pod's `Eviction` says about its
//! progress, and what is wrong with the responders a pod declares (which API a drain asks
//! through is `plan::wiring`'s). No I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EvictionResponder;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};

use super::evictions::{recorded_attempts, Refusal};
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
    let attempts = recorded_attempts(Some(message)).max(retries_counted(message));
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

/// The in-tree imperative evictor or nodegrace's, on its CRDs: what they say is the Eviction
/// API's answer, not a responder's own work.
fn is_imperative_evictor(responder: &str) -> bool {
    responder == IMPERATIVE_EVICTOR || responder == crate::plan::evictions::NODEGRACE_EVICTOR
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

/// The annotation a pod declares its responders in where the cluster's pod API has no
/// `spec.evictionResponders`: a JSON list in the field's shape,
/// `[{"name":"example.com/db","priority":10000}]`.
pub(crate) const RESPONDERS_ANNOTATION: &str = "nodegrace.dev/eviction-responders";

/// An example of the declaration, for the problem sentences.
const DECLARATION_EXAMPLE: &str = r#"[{"name":"example.com/db","priority":10000}]"#;

/// Where a pod's responders were taken from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum ResponderSource {
    /// `spec.evictionResponders`.
    Field,
    /// [`RESPONDERS_ANNOTATION`] (a malformed one declares nothing; its problems say why).
    Annotation,
    /// Nothing declared that the path reads: the default imperative evictor alone.
    #[default]
    Undeclared,
}

impl ResponderSource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Field => "spec.evictionResponders",
            Self::Annotation => "annotation nodegrace.dev/eviction-responders",
            Self::Undeclared => "none declared",
        }
    }
}

impl std::fmt::Display for ResponderSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The responders a pod declares, and what is wrong with them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResponderCheck {
    /// The responders in force, from `source`.
    pub responders: Vec<DeclaredResponder>,
    pub source: ResponderSource,
    /// One sentence per problem, for a log line or an event.
    pub problems: Vec<String>,
}

/// Reads [`RESPONDERS_ANNOTATION`]'s `value`: the responders it declares, in its order, and
/// what is wrong with it. An entry without a usable name or priority is left out.
pub(crate) fn parse_responders_annotation(value: &str) -> (Vec<DeclaredResponder>, Vec<String>) {
    let what = format!("annotation {RESPONDERS_ANNOTATION}");
    let parsed: serde_json::Value = match serde_json::from_str(value) {
        Ok(v) => v,
        Err(err) => {
            return (
                Vec::new(),
                vec![format!(
                    "{what} is not JSON ({err}); write a list such as {DECLARATION_EXAMPLE}"
                )],
            )
        }
    };
    let Some(entries) = parsed.as_array() else {
        return (
            Vec::new(),
            vec![format!(
                "{what} must be a JSON list such as {DECLARATION_EXAMPLE}"
            )],
        );
    };
    let mut responders = Vec::new();
    let mut problems = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let n = i + 1;
        let Some(object) = entry.as_object() else {
            problems.push(format!(
                "{what}: entry {n} is not an object with a name and a priority"
            ));
            continue;
        };
        for field in object.keys() {
            if field != "name" && field != "priority" {
                problems.push(format!(
                    "{what}: entry {n} has an unknown field {field:?} (only name and priority)"
                ));
            }
        }
        let name = object.get("name").and_then(serde_json::Value::as_str);
        let priority = object.get("priority");
        match (name, priority) {
            (None, _) => problems.push(format!("{what}: entry {n} has no name (a string)")),
            (Some(name), None) => {
                problems.push(format!("{what}: entry {n} ({name}) has no priority"));
            }
            (Some(name), Some(p)) => match p.as_i64() {
                Some(priority) => responders.push(DeclaredResponder {
                    name: name.to_owned(),
                    priority,
                }),
                None => problems.push(format!(
                    "{what}: the priority {p} of entry {n} ({name}) is not a whole number"
                )),
            },
        }
    }
    (responders, problems)
}

/// Checks the responders a pod declares. They come from `spec.evictionResponders`
/// (`field`) when it is set, else from the [`RESPONDERS_ANNOTATION`] annotation — unless
/// the cluster's pod API has the field (`field_served`, the in-tree path of 1.37), where the
/// in-tree controllers read the field alone and the annotation is only compared with it.
/// The responders in force are checked against the in-tree rules (at most
/// [`MAX_POD_RESPONDERS`], unique domain-prefixed names outside the reserved domains,
/// priority 0..=100000 with 0..=999 only for `*.k8s.io`). The field and the annotation
/// disagreeing is a problem (the field wins); the old
/// `<old_annotation_prefix><name>: <priority>[/<role>]` annotations are deprecated and read by
/// nothing on this path: each use is a problem naming what to declare instead.
pub(crate) fn check_responders(
    field: Option<&[EvictionResponder]>,
    annotations: Option<&BTreeMap<String, String>>,
    old_annotation_prefix: &str,
    field_served: bool,
) -> ResponderCheck {
    let from_field: Option<Vec<DeclaredResponder>> = field.filter(|f| !f.is_empty()).map(|f| {
        f.iter()
            .map(|r| DeclaredResponder {
                name: r.name.clone(),
                priority: i64::from(r.priority),
            })
            .collect()
    });
    let mut problems = Vec::new();
    let from_annotation = annotations
        .and_then(|a| a.get(RESPONDERS_ANNOTATION))
        .map(|value| {
            let (list, bad) = parse_responders_annotation(value);
            let clean = bad.is_empty();
            problems.extend(bad);
            (list, clean)
        });
    let from_old = old_annotations(annotations, old_annotation_prefix, &mut problems);
    let (source, responders) = match (from_field, from_annotation) {
        (Some(field), annotation) => {
            if let Some((annotation, true)) = annotation {
                if sorted(&field) != sorted(&annotation) {
                    problems.push(format!(
                        "spec.evictionResponders ({}) and annotation {RESPONDERS_ANNOTATION} ({}) disagree; spec.evictionResponders is used",
                        describe(&field),
                        describe(&annotation)
                    ));
                }
            }
            (ResponderSource::Field, field)
        }
        (None, Some((annotation, _))) if field_served => {
            problems.push(format!(
                "annotation {RESPONDERS_ANNOTATION} ({}) is not read where the pod API has spec.evictionResponders (the in-tree EvictionRequest API): declare them in spec.evictionResponders",
                describe(&annotation)
            ));
            (ResponderSource::Undeclared, Vec::new())
        }
        (None, Some((annotation, _))) => (ResponderSource::Annotation, annotation),
        (None, None) => (ResponderSource::Undeclared, Vec::new()),
    };
    if !from_old.is_empty() {
        problems.push(old_annotations_problem(
            &from_old,
            old_annotation_prefix,
            &responders,
            source,
            field_served,
        ));
    }
    problems.extend(rule_problems(&responders, source));
    ResponderCheck {
        responders,
        source,
        problems,
    }
}

/// The responders the deprecated `<prefix><name>: <priority>[/<role>]` annotations declare;
/// an unreadable priority is a problem.
fn old_annotations(
    annotations: Option<&BTreeMap<String, String>>,
    prefix: &str,
    problems: &mut Vec<String>,
) -> Vec<DeclaredResponder> {
    let mut from_old = Vec::new();
    for (key, value) in annotations.into_iter().flatten() {
        let Some(name) = key.strip_prefix(prefix) else {
            continue;
        };
        match value
            .split('/')
            .next()
            .unwrap_or_default()
            .trim()
            .parse::<i64>()
        {
            Ok(priority) => from_old.push(DeclaredResponder {
                name: name.to_owned(),
                priority,
            }),
            Err(_) => problems.push(format!(
                "annotation {key} (deprecated): priority {value:?} is not a number"
            )),
        }
    }
    from_old
}

/// What to tell of deprecated annotations beside the `responders` in force.
fn old_annotations_problem(
    from_old: &[DeclaredResponder],
    prefix: &str,
    responders: &[DeclaredResponder],
    source: ResponderSource,
    field_served: bool,
) -> String {
    let old = format!(
        "the {prefix}* annotations ({}) are deprecated and read by nothing on this path",
        describe(from_old)
    );
    if responders.is_empty() {
        let instead = if field_served {
            "spec.evictionResponders".to_owned()
        } else {
            format!("annotation {RESPONDERS_ANNOTATION}")
        };
        format!("{old}; declare the responders in {instead} instead, e.g. {DECLARATION_EXAMPLE}")
    } else if sorted(responders) != sorted(from_old) {
        format!(
            "{old}, and they disagree with {source} ({}), which is used: remove them",
            describe(responders)
        )
    } else {
        format!("{old}; {source} declares the same: remove them")
    }
}

/// The in-tree rules the declared `responders` break.
fn rule_problems(responders: &[DeclaredResponder], source: ResponderSource) -> Vec<String> {
    let mut problems = Vec::new();
    if responders.len() > MAX_POD_RESPONDERS {
        problems.push(format!(
            "{} responders declared ({source}); the in-tree API allows at most {MAX_POD_RESPONDERS}",
            responders.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in responders {
        if !seen.insert(r.name.as_str()) {
            problems.push(format!("responder {} is declared twice ({source})", r.name));
        }
        if let Some(why) = domain_prefixed_key_problem(&r.name) {
            problems.push(format!("responder name invalid ({source}): {why}"));
        } else if is_reserved_domain(&r.name) {
            problems.push(format!(
                "responder {} ({source}) uses a domain reserved for Kubernetes",
                r.name
            ));
        }
        if !(0..=i64::from(MAX_RESPONDER_PRIORITY)).contains(&r.priority) {
            problems.push(format!(
                "responder {} ({source}): priority {} is outside 0..={MAX_RESPONDER_PRIORITY}",
                r.name, r.priority
            ));
        } else if r.priority <= i64::from(RESERVED_PRIORITY_MAX) && !is_reserved_domain(&r.name) {
            problems.push(format!(
                "responder {} ({source}): priorities 0..={RESERVED_PRIORITY_MAX} are reserved for *.k8s.io responders",
                r.name
            ));
        }
    }
    problems
}

fn sorted(list: &[DeclaredResponder]) -> Vec<DeclaredResponder> {
    let mut list = list.to_vec();
    list.sort();
    list
}

fn describe(list: &[DeclaredResponder]) -> String {
    list.iter()
        .map(|r| format!("{}={}", r.name, r.priority))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
