//! Decisions for the in-tree EvictionRequest API of Kubernetes 1.37 (`lifecycle.k8s.io/v1alpha1`,
//! KEP-4563 as shipped): which path a drain asks pods to leave through, nodegrace's requester
//! key, what a pod's `Eviction` says about its progress, and what is wrong with the responders
//! a pod declares. No I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EvictionResponder;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};

/// The domain of nodegrace's requester keys.
pub(crate) const REQUESTER_DOMAIN: &str = "nodegrace.dev";

/// The default responder the in-tree controller adds to every pod: it calls the Eviction API.
pub(crate) const IMPERATIVE_EVICTOR: &str = "imperative-eviction.k8s.io/evictor";

/// Responders a pod may declare in `spec.evictionResponders` (the default one comes on top).
pub(crate) const MAX_POD_RESPONDERS: usize = 10;

/// Highest responder priority; 0..=999 are reserved for `*.k8s.io` responders.
pub(crate) const MAX_RESPONDER_PRIORITY: i32 = 100_000;
pub(crate) const RESERVED_PRIORITY_MAX: i32 = 999;

/// How the drain asks a Default pod to leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvictionPath {
    /// The cluster's own EvictionRequest API: nodegrace is a requester; responder selection
    /// and the eviction belong to the in-tree controllers.
    InTree,
    /// nodegrace's `lifecycle.nodegrace.dev` CRDs, the in-tree shapes: nodegrace is a
    /// requester, and (unless an external one is configured) the eviction-request controller
    /// and imperative evictor for its node's pods.
    LifecycleCrds,
    /// The deprecated `evictionrequests.nodegrace.dev` CRD of the 2025 draft (and its own
    /// controller unless an external one is configured): still served for one release.
    LegacyCrd,
    /// The Eviction API directly.
    EvictionApi,
}

/// What discovery found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Served {
    /// `lifecycle.k8s.io/v1alpha1` evictionrequests and evictions.
    pub in_tree: bool,
    /// `lifecycle.nodegrace.dev/v1alpha1` evictionrequests and evictions.
    pub lifecycle_crds: bool,
    /// `evictionrequests.nodegrace.dev`.
    pub legacy_crd: bool,
}

/// The path for what discovery found: the in-tree API first (what workloads written for 1.37
/// respond to), then nodegrace's CRDs of the same shapes, then the deprecated CRD.
/// `legacy_requester_ok` is false when the node name is too long for the deprecated CRD's
/// requester name.
pub(crate) fn choose_path(served: Served, legacy_requester_ok: bool) -> EvictionPath {
    if served.in_tree {
        EvictionPath::InTree
    } else if served.lifecycle_crds {
        EvictionPath::LifecycleCrds
    } else if served.legacy_crd && legacy_requester_ok {
        EvictionPath::LegacyCrd
    } else {
        EvictionPath::EvictionApi
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// An RFC 1123 subdomain (what Kubernetes calls a DNS subdomain).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.starts_with(is_alnum)
                && label.ends_with(is_alnum)
                && label.chars().all(|c| is_alnum(c) || c == '-')
        })
}

/// The name part of a qualified name: 1..=63 characters, alphanumeric at both ends,
/// `-`, `_`, `.` inside.
fn is_qualified_name_part(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

/// What is wrong with `key` as a domain-prefixed key (`example.com/name`, the form of
/// requester and responder names), if anything.
pub(crate) fn domain_prefixed_key_problem(key: &str) -> Option<String> {
    let Some((prefix, name)) = key.split_once('/') else {
        return Some(format!("{key:?} has no domain prefix (example.com/{key})"));
    };
    if !is_dns_subdomain(prefix) {
        return Some(format!("the prefix of {key:?} is not a DNS subdomain"));
    }
    if !is_qualified_name_part(name) {
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
    if is_qualified_name_part(node) {
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

/// The in-tree imperative evictor or nodegrace's, on its CRDs: what they say is the Eviction
/// API's answer, not a responder's own work.
fn is_imperative_evictor(responder: &str) -> bool {
    responder == IMPERATIVE_EVICTOR || responder == crate::plan::evictions::NODEGRACE_EVICTOR
}

/// An imperative evictor's message about a refused eviction: it counts its attempts.
fn is_refusal(message: &str) -> bool {
    message.contains("(attempts=") || message.contains("number of retries")
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
    match message.find("number of retries") {
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
    let mut from_old = Vec::new();
    for (key, value) in annotations.into_iter().flatten() {
        let Some(name) = key.strip_prefix(old_annotation_prefix) else {
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
        let old = format!(
            "the {old_annotation_prefix}* annotations ({}) are deprecated and read by nothing on this path",
            describe(&from_old)
        );
        problems.push(if responders.is_empty() {
            let instead = if field_served {
                "spec.evictionResponders".to_owned()
            } else {
                format!("annotation {RESPONDERS_ANNOTATION}")
            };
            format!(
                "{old}; declare the responders in {instead} instead, e.g. {DECLARATION_EXAMPLE}"
            )
        } else if sorted(&responders) != sorted(&from_old) {
            format!(
                "{old}, and they disagree with {source} ({}), which is used: remove them",
                describe(&responders)
            )
        } else {
            format!("{old}; {source} declares the same: remove them")
        });
    }
    if responders.len() > MAX_POD_RESPONDERS {
        problems.push(format!(
            "{} responders declared ({source}); the in-tree API allows at most {MAX_POD_RESPONDERS}",
            responders.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in &responders {
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
    ResponderCheck {
        responders,
        source,
        problems,
    }
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
mod tests {
    use super::*;
    use serde_json::json;

    fn eviction(v: serde_json::Value) -> Eviction {
        serde_json::from_value(v).unwrap()
    }

    fn with_status(status: serde_json::Value) -> Eviction {
        eviction(json!({
            "metadata": {"name": "e", "namespace": "ns"},
            "spec": {"target": {"pod": {"name": "p", "uid": "u1"}}},
            "status": status,
        }))
    }

    #[test]
    fn the_in_tree_api_wins_then_our_crds_of_its_shape_then_the_deprecated_crd() {
        let served = |in_tree, lifecycle_crds, legacy_crd| Served {
            in_tree,
            lifecycle_crds,
            legacy_crd,
        };
        use EvictionPath::*;
        assert_eq!(choose_path(served(true, true, true), true), InTree);
        assert_eq!(choose_path(served(true, false, false), false), InTree);
        assert_eq!(choose_path(served(false, true, true), true), LifecycleCrds);
        assert_eq!(
            choose_path(served(false, true, false), false),
            LifecycleCrds
        );
        assert_eq!(choose_path(served(false, false, true), true), LegacyCrd);
        assert_eq!(choose_path(served(false, false, true), false), EvictionApi);
        assert_eq!(choose_path(served(false, false, false), true), EvictionApi);
    }

    #[test]
    fn requester_keys_are_valid_and_never_reserved() {
        assert_eq!(requester_key("worker-1"), "nodegrace.dev/worker-1");
        assert_eq!(
            requester_key("ip-10-0-0-1.eu-west-1.compute.internal"),
            "nodegrace.dev/ip-10-0-0-1.eu-west-1.compute.internal"
        );
        let long = format!("{}.example.internal", "n".repeat(70));
        let key = requester_key(&long);
        assert!(domain_prefixed_key_problem(&key).is_none(), "{key}");
        assert!(key.len() <= REQUESTER_DOMAIN.len() + 1 + 63);
        // Two long names sharing their first 46 characters still differ.
        let other = format!("{}.example.other", "n".repeat(70));
        assert_ne!(key, requester_key(&other));
        assert_eq!(key, requester_key(&long), "stable");
        for node in ["a", "worker-1", &long, "x".repeat(253).as_str()] {
            let key = requester_key(node);
            assert!(domain_prefixed_key_problem(&key).is_none(), "{key}");
            assert!(!is_reserved_domain(&key));
        }
    }

    proptest::proptest! {
        #[test]
        fn every_node_name_yields_a_valid_unreserved_key(
            node in "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?){0,4}"
        ) {
            let key = requester_key(&node);
            proptest::prop_assert!(domain_prefixed_key_problem(&key).is_none(), "{}", key);
            proptest::prop_assert!(!is_reserved_domain(&key));
        }
    }

    #[test]
    fn the_old_crd_requester_name_is_not_a_valid_key() {
        assert!(domain_prefixed_key_problem("worker-1.nodemaintenance.nodegrace.dev").is_some());
        assert!(domain_prefixed_key_problem("example.com/ok_name.1").is_none());
        assert!(domain_prefixed_key_problem("Example.com/x").is_some());
        assert!(domain_prefixed_key_problem("example.com/-x").is_some());
        assert!(domain_prefixed_key_problem("example.com/").is_some());
        assert!(domain_prefixed_key_problem(&format!("example.com/{}", "x".repeat(64))).is_some());
        assert!(is_reserved_domain("imperative-eviction.k8s.io/evictor"));
        assert!(is_reserved_domain("k8s.io/x"));
        assert!(is_reserved_domain("apps.kubernetes.io/x"));
        assert!(!is_reserved_domain("notk8s.io/x"));
    }

    #[test]
    fn request_names_are_dns_subdomains_per_pod() {
        let name = request_name("6f1c5a52-5d43-4b52-9a3e-0a9b8f1d2c3e");
        assert_eq!(name, "nodegrace-6f1c5a52-5d43-4b52-9a3e-0a9b8f1d2c3e");
        assert!(is_dns_subdomain(&name));
    }

    #[test]
    fn an_eviction_reads_as_pending_responding_evicted_or_failed() {
        assert_eq!(
            read_eviction(&with_status(json!({})), "u1"),
            Progress::Pending
        );
        let active = with_status(json!({
            "targetResponders": [
                {"name": "db.example.com/operator", "priority": 10000, "state": "Completed"},
                {"name": IMPERATIVE_EVICTOR, "priority": 100, "state": "Active"}],
            "responders": [
                {"name": "db.example.com/operator", "message": "done"},
                {"name": IMPERATIVE_EVICTOR, "message": "Cannot evict pod as it would violate the pod's disruption budget. number of retries: 3"}],
        }));
        let progress = read_eviction(&active, "u1");
        assert_eq!(
            respond(&progress),
            Response::Report(Some(
                "Cannot evict pod as it would violate the pod's disruption budget.".into()
            ))
        );
        // nodegrace's own evictor, on its CRDs, words its refusals as upstream's code does.
        let ours = with_status(json!({
            "targetResponders": [{"name": crate::plan::evictions::NODEGRACE_EVICTOR, "priority": 100, "state": "Active"}],
            "responders": [{"name": crate::plan::evictions::NODEGRACE_EVICTOR,
                "message": "evicting pod \"pg\" through the Eviction API failed (attempts=4): PodDisruptionBudget pg-pdb: refused"}],
        }));
        assert_eq!(
            respond(&read_eviction(&ours, "u1")),
            Response::Report(Some(
                "evicting pod \"pg\" through the Eviction API failed: PodDisruptionBudget pg-pdb: refused".into()
            ))
        );
        let evicted_by_ours = with_status(json!({
            "targetResponders": [{"name": crate::plan::evictions::NODEGRACE_EVICTOR, "priority": 100, "state": "Active"}],
            "responders": [{"name": crate::plan::evictions::NODEGRACE_EVICTOR,
                "message": "pod \"pg\" was evicted through the Eviction API and terminates gracefully"}],
        }));
        assert_eq!(
            respond(&read_eviction(&evicted_by_ours, "u1")),
            Response::Report(None),
            "an eviction carried out holds nothing"
        );
        let custom = with_status(json!({
            "targetResponders": [{"name": "db.example.com/operator", "priority": 10000, "state": "Active"}],
            "responders": [{"name": "db.example.com/operator", "message": "draining replicas"}],
        }));
        assert_eq!(
            respond(&read_eviction(&custom, "u1")),
            Response::Report(Some(
                "responder db.example.com/operator: draining replicas".into()
            ))
        );
        let evicted = with_status(json!({"conditions": [
            {"type": "TargetEvicted", "status": "True", "reason": "PodDeleted", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"},
            {"type": "Failed", "status": "False", "reason": "Succeeded", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
        assert_eq!(read_eviction(&evicted, "u1"), Progress::Evicted);
        assert_eq!(respond(&Progress::Evicted), Response::Report(None));
        let failed = with_status(json!({"conditions": [
            {"type": "Failed", "status": "True", "reason": "NoFurtherResponder", "message": "All responders have completed without evicting the target", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
        assert!(matches!(
            respond(&read_eviction(&failed, "u1")),
            Response::EvictDirectly { why } if why.starts_with("NoFurtherResponder")
        ));
        let canceled = with_status(json!({"conditions": [
            {"type": "Failed", "status": "True", "reason": "CanceledDueToNoRequesters", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
        assert_eq!(respond(&read_eviction(&canceled, "u1")), Response::Nothing);
    }

    #[test]
    fn a_refused_request_is_evicted_directly_and_a_pending_one_waits() {
        let request = |status: serde_json::Value| -> EvictionRequest {
            serde_json::from_value(json!({
                "metadata": {"name": "nodegrace-u1", "namespace": "ns"},
                "spec": {"intent": "Eviction", "requester": "nodegrace.dev/n1",
                    "target": {"pod": {"name": "p", "uid": "u1"}}},
                "status": status,
            }))
            .unwrap()
        };
        let invalid = request(json!({"conditions": [
            {"type": "Failed", "status": "True", "reason": "EvictionInvalid", "message": "Target pod references a SchedulingGroup. Eviction is currently not supported.", "lastTransitionTime": "2026-11-24T10:00:00Z"},
            {"type": "TargetEvicted", "status": "False", "reason": "EvictionFailed", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
        assert!(matches!(
            read_request(&invalid).as_ref().map(respond),
            Some(Response::EvictDirectly { why }) if why.contains("SchedulingGroup")
        ));
        let waiting = request(json!({"conditions": [
            {"type": "Failed", "status": "False", "reason": "AwaitingEviction", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
        assert_eq!(read_request(&waiting), None);
        assert_eq!(read_request(&request(json!({}))), None);
    }

    #[test]
    fn an_eviction_of_another_pod_is_refused() {
        let e = with_status(json!({"conditions": [
            {"type": "Failed", "status": "True", "reason": "NoFurtherResponder", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}));
        assert_eq!(
            respond(&read_eviction(&e, "u2")),
            Response::Refuse {
                named_uid: "u1".into()
            }
        );
    }

    const PREFIX: &str = "interceptor.evictionrequest.coordination.k8s.io/priority_";

    fn field(list: &[(&str, i32)]) -> Vec<EvictionResponder> {
        list.iter()
            .map(|(n, p)| EvictionResponder {
                name: (*n).into(),
                priority: *p,
            })
            .collect()
    }

    fn annotated(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn declared(list: &[(&str, i64)]) -> Vec<DeclaredResponder> {
        list.iter()
            .map(|(n, p)| DeclaredResponder {
                name: (*n).into(),
                priority: *p,
            })
            .collect()
    }

    #[test]
    fn valid_responders_raise_no_problem() {
        let f = field(&[
            ("db.example.com/operator", 10000),
            ("backup.example.com/x", 2000),
        ]);
        let check = check_responders(Some(&f), None, PREFIX, true);
        assert!(check.problems.is_empty(), "{:?}", check.problems);
        assert_eq!(check.responders.len(), 2);
        assert_eq!(check.source, ResponderSource::Field);
        let none = check_responders(None, None, PREFIX, true);
        assert!(none.problems.is_empty());
        assert_eq!(none.source, ResponderSource::Undeclared);
        assert!(check_responders(Some(&[]), None, PREFIX, false)
            .problems
            .is_empty());
    }

    #[test]
    fn too_many_invalid_and_reserved_responders_are_named() {
        let many: Vec<(String, i32)> = (0..11)
            .map(|i| (format!("r{i}.example.com/x"), 5000))
            .collect();
        let refs: Vec<(&str, i32)> = many.iter().map(|(n, p)| (n.as_str(), *p)).collect();
        let check = check_responders(Some(&field(&refs)), None, PREFIX, true);
        assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
        assert!(check.problems[0].contains("11 responders"));

        let bad = field(&[
            ("no-prefix", 5000),
            ("x.k8s.io/mine", 5000),
            ("low.example.com/x", 500),
            ("high.example.com/x", 100_001),
        ]);
        let problems = check_responders(Some(&bad), None, PREFIX, true).problems;
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("no domain prefix"));
        assert!(problems[1].contains("reserved for Kubernetes"));
        assert!(problems[2].contains("reserved for *.k8s.io"));
        assert!(problems[3].contains("outside 0..=100000"));
    }

    #[test]
    fn the_old_annotation_is_deprecated_and_the_field_wins_over_it() {
        let annotations = annotated(&[(
            "interceptor.evictionrequest.coordination.k8s.io/priority_db.example.com",
            "20000/knowledgeable",
        )]);
        let f = field(&[("db.example.com/operator", 10000)]);
        let check = check_responders(Some(&f), Some(&annotations), PREFIX, true);
        assert_eq!(check.responders[0].name, "db.example.com/operator");
        assert_eq!(check.source, ResponderSource::Field);
        assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
        assert!(check.problems[0].contains("deprecated and read by nothing"));
        assert!(check.problems[0].contains("disagree with spec.evictionResponders"));
        // Alone: nothing reads it; the sentence names what to declare instead.
        let alone = check_responders(None, Some(&annotations), PREFIX, true);
        assert!(alone.responders.is_empty());
        assert_eq!(alone.source, ResponderSource::Undeclared);
        assert_eq!(alone.problems.len(), 1);
        assert!(alone.problems[0].contains("deprecated and read by nothing"));
        assert!(alone.problems[0].contains("declare the responders in spec.evictionResponders"));
        let crd = check_responders(None, Some(&annotations), PREFIX, false);
        assert!(crd.problems[0].contains(&format!(
            "declare the responders in annotation {RESPONDERS_ANNOTATION}"
        )));
        let garbled = annotated(&[(
            "interceptor.evictionrequest.coordination.k8s.io/priority_x.example.com",
            "high",
        )]);
        let check = check_responders(None, Some(&garbled), PREFIX, true);
        assert!(check.problems[0].contains("not a number"), "{check:?}");
    }

    #[test]
    fn the_annotation_declares_responders_where_the_pod_api_lacks_the_field() {
        let annotations = annotated(&[(
            RESPONDERS_ANNOTATION,
            r#"[{"name":"db.example.com/operator","priority":10000},{"name":"b.example.com/x","priority":2000}]"#,
        )]);
        let check = check_responders(None, Some(&annotations), PREFIX, false);
        assert!(check.problems.is_empty(), "{:?}", check.problems);
        assert_eq!(check.source, ResponderSource::Annotation);
        assert_eq!(
            check.responders,
            declared(&[
                ("db.example.com/operator", 10000),
                ("b.example.com/x", 2000)
            ])
        );
        // The same annotation where the pod API has the field: not read; said so.
        let in_tree = check_responders(None, Some(&annotations), PREFIX, true);
        assert_eq!(in_tree.source, ResponderSource::Undeclared);
        assert!(in_tree.responders.is_empty());
        assert_eq!(in_tree.problems.len(), 1, "{:?}", in_tree.problems);
        assert!(in_tree.problems[0].contains("declare them in spec.evictionResponders"));
    }

    #[test]
    fn the_field_and_the_annotation_disagreeing_is_named_and_the_field_wins() {
        let f = field(&[("db.example.com/operator", 10000)]);
        let same = annotated(&[(
            RESPONDERS_ANNOTATION,
            r#"[{"name":"db.example.com/operator","priority":10000}]"#,
        )]);
        for served in [true, false] {
            let check = check_responders(Some(&f), Some(&same), PREFIX, served);
            assert!(check.problems.is_empty(), "{:?}", check.problems);
            assert_eq!(check.source, ResponderSource::Field);
        }
        let other = annotated(&[(
            RESPONDERS_ANNOTATION,
            r#"[{"name":"db.example.com/operator","priority":20000}]"#,
        )]);
        for served in [true, false] {
            let check = check_responders(Some(&f), Some(&other), PREFIX, served);
            assert_eq!(check.source, ResponderSource::Field);
            assert_eq!(
                check.responders,
                declared(&[("db.example.com/operator", 10000)])
            );
            assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
            assert!(check.problems[0].contains("disagree; spec.evictionResponders is used"));
            assert!(check.problems[0].contains("db.example.com/operator=20000"));
        }
    }

    #[test]
    fn a_malformed_annotation_is_named_entry_by_entry() {
        let problems = |value: &str| {
            let a = annotated(&[(RESPONDERS_ANNOTATION, value)]);
            check_responders(None, Some(&a), PREFIX, false)
        };
        let not_json = problems("[{name: db}]");
        assert!(not_json.responders.is_empty());
        assert_eq!(not_json.source, ResponderSource::Annotation);
        assert!(not_json.problems[0].contains("is not JSON"), "{not_json:?}");
        assert!(
            problems(r#"{"name":"a.example.com/x","priority":5000}"#).problems[0]
                .contains("must be a JSON list")
        );
        let check = problems(
            r#"[{"priority":5000},{"name":"a.example.com/x"},{"name":"b.example.com/x","priority":"high"},
                {"name":"c.example.com/x","priority":2.5},"d.example.com/x",
                {"name":"e.example.com/x","priority":5000,"role":"x"}]"#,
        );
        assert_eq!(check.responders, declared(&[("e.example.com/x", 5000)]));
        let p = &check.problems;
        assert_eq!(p.len(), 6, "{p:?}");
        assert!(p[0].contains("entry 1 has no name"), "{p:?}");
        assert!(
            p[1].contains("entry 2 (a.example.com/x) has no priority"),
            "{p:?}"
        );
        assert!(p[2].contains("\"high\" of entry 3"), "{p:?}");
        assert!(p[3].contains("2.5 of entry 4"), "{p:?}");
        assert!(p[4].contains("entry 5 is not an object"), "{p:?}");
        assert!(p[5].contains("unknown field \"role\""), "{p:?}");
        // What it declares is checked like the field.
        let eleven: Vec<String> = (0..11)
            .map(|i| format!(r#"{{"name":"r{i}.example.com/x","priority":5000}}"#))
            .collect();
        let check = problems(&format!("[{}]", eleven.join(",")));
        assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
        assert!(check.problems[0]
            .contains("11 responders declared (annotation nodegrace.dev/eviction-responders)"));
        let check = problems(
            r#"[{"name":"x.k8s.io/mine","priority":5000},{"name":"low.example.com/x","priority":500},
                {"name":"no-prefix","priority":-1},{"name":"low.example.com/x","priority":500}]"#,
        );
        let p = &check.problems;
        assert!(
            p.iter().any(|s| s.contains("reserved for Kubernetes")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|s| s.contains("reserved for *.k8s.io")),
            "{p:?}"
        );
        assert!(p.iter().any(|s| s.contains("no domain prefix")), "{p:?}");
        assert!(p.iter().any(|s| s.contains("outside 0..=100000")), "{p:?}");
        assert!(p.iter().any(|s| s.contains("declared twice")), "{p:?}");
        // A malformed annotation beside the field: its problems, no disagreement on top.
        let f = field(&[("db.example.com/operator", 10000)]);
        let a = annotated(&[(RESPONDERS_ANNOTATION, "not json")]);
        let check = check_responders(Some(&f), Some(&a), PREFIX, true);
        assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
        assert!(check.problems[0].contains("is not JSON"));
    }

    fn valid_responders() -> impl proptest::strategy::Strategy<Value = Vec<DeclaredResponder>> {
        use proptest::strategy::Strategy;
        let name = "[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?){0,3}/[A-Za-z0-9]([-A-Za-z0-9_.]{0,30}[A-Za-z0-9])?"
            .prop_filter("not a reserved domain", |n| !is_reserved_domain(n));
        proptest::collection::btree_map(
            name,
            i64::from(RESERVED_PRIORITY_MAX) + 1..=i64::from(MAX_RESPONDER_PRIORITY),
            0..=MAX_POD_RESPONDERS,
        )
        .prop_map(|m| {
            m.into_iter()
                .map(|(name, priority)| DeclaredResponder { name, priority })
                .collect()
        })
        .prop_shuffle()
    }

    proptest::proptest! {
        #[test]
        fn valid_responders_written_as_the_annotation_read_back_the_same(list in valid_responders()) {
            let value = serde_json::to_string(
                &list.iter().map(|r| json!({"name": r.name, "priority": r.priority})).collect::<Vec<_>>(),
            ).unwrap();
            let (parsed, problems) = parse_responders_annotation(&value);
            proptest::prop_assert!(problems.is_empty(), "{:?}", problems);
            proptest::prop_assert_eq!(&parsed, &list);
            let a = annotated(&[(RESPONDERS_ANNOTATION, value.as_str())]);
            let check = check_responders(None, Some(&a), PREFIX, false);
            proptest::prop_assert!(check.problems.is_empty(), "{:?}", check.problems);
            proptest::prop_assert_eq!(check.source, ResponderSource::Annotation);
            proptest::prop_assert_eq!(check.responders, list);
        }

        #[test]
        fn any_annotation_value_is_read_without_panicking(value in ".{0,200}") {
            let _ = parse_responders_annotation(&value);
        }
    }
}
