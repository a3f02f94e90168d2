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
    /// nodegrace's `evictionrequests.nodegrace.dev` CRD (and its own controller unless an
    /// external one is configured).
    Crd,
    /// The Eviction API directly.
    EvictionApi,
}

/// The path for what discovery found. The in-tree API wins over the CRD when both are
/// served: it is what workloads written for 1.37 respond to.
pub(crate) fn choose_path(
    in_tree_served: bool,
    crd_served: bool,
    crd_requester_ok: bool,
) -> EvictionPath {
    if in_tree_served {
        EvictionPath::InTree
    } else if crd_served && crd_requester_ok {
        EvictionPath::Crd
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
            let text = match message {
                Some(m) if responder == IMPERATIVE_EVICTOR => without_retry_count(m),
                Some(m) => format!("responder {responder}: {m}"),
                None if responder == IMPERATIVE_EVICTOR => return Response::Report(None),
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

/// The imperative evictor's message without its retry count, so that the blocker the drain
/// names stays the same from one retry to the next.
fn without_retry_count(message: &str) -> String {
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

/// The responders a pod declares, and what is wrong with them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResponderCheck {
    /// From `spec.evictionResponders`.
    pub responders: Vec<DeclaredResponder>,
    /// One sentence per problem, for a log line or an event.
    pub problems: Vec<String>,
}

/// Checks, for the in-tree path, a pod's `spec.evictionResponders` (`field`) against the
/// in-tree rules (at most [`MAX_POD_RESPONDERS`], unique domain-prefixed names outside the
/// reserved domains, priority 0..=100000 with 0..=999 only for `*.k8s.io`) and its old
/// `<annotation_prefix><name>: <priority>[/<role>]` annotations against the field: the
/// in-tree controllers never read them.
pub(crate) fn check_responders(
    field: Option<&[EvictionResponder]>,
    annotations: Option<&BTreeMap<String, String>>,
    annotation_prefix: &str,
) -> ResponderCheck {
    let from_field: Vec<DeclaredResponder> = field
        .into_iter()
        .flatten()
        .map(|r| DeclaredResponder {
            name: r.name.clone(),
            priority: i64::from(r.priority),
        })
        .collect();
    let mut problems = Vec::new();
    let mut from_annotations = Vec::new();
    for (key, value) in annotations.into_iter().flatten() {
        let Some(name) = key.strip_prefix(annotation_prefix) else {
            continue;
        };
        match value
            .split('/')
            .next()
            .unwrap_or_default()
            .trim()
            .parse::<i64>()
        {
            Ok(priority) => from_annotations.push(DeclaredResponder {
                name: name.to_owned(),
                priority,
            }),
            Err(_) => problems.push(format!(
                "annotation {key}: priority {value:?} is not a number"
            )),
        }
    }
    let field_set = field.is_some_and(|f| !f.is_empty());
    if !from_annotations.is_empty() {
        if field_set {
            let mut a = from_field.clone();
            let mut b = from_annotations.clone();
            a.sort();
            b.sort();
            if a != b {
                problems.push(format!(
                    "spec.evictionResponders ({}) and the {annotation_prefix}* annotations ({}) disagree; the in-tree API uses spec.evictionResponders",
                    describe(&a),
                    describe(&b)
                ));
            }
        } else {
            problems.push(format!(
                "the {annotation_prefix}* annotations ({}) are not read by the in-tree API; declare spec.evictionResponders",
                describe(&from_annotations)
            ));
        }
    }
    let responders = from_field;
    let source = "spec.evictionResponders";
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
        problems,
    }
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
    fn the_in_tree_api_wins_over_the_crd_and_the_eviction_api_is_the_last_resort() {
        assert_eq!(choose_path(true, true, true), EvictionPath::InTree);
        assert_eq!(choose_path(true, false, false), EvictionPath::InTree);
        assert_eq!(choose_path(false, true, true), EvictionPath::Crd);
        assert_eq!(choose_path(false, true, false), EvictionPath::EvictionApi);
        assert_eq!(choose_path(false, false, true), EvictionPath::EvictionApi);
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

    #[test]
    fn valid_responders_raise_no_problem() {
        let f = field(&[
            ("db.example.com/operator", 10000),
            ("backup.example.com/x", 2000),
        ]);
        let check = check_responders(Some(&f), None, PREFIX);
        assert!(check.problems.is_empty(), "{:?}", check.problems);
        assert_eq!(check.responders.len(), 2);
        assert!(check_responders(None, None, PREFIX).problems.is_empty());
    }

    #[test]
    fn too_many_invalid_and_reserved_responders_are_named() {
        let many: Vec<(String, i32)> = (0..11)
            .map(|i| (format!("r{i}.example.com/x"), 5000))
            .collect();
        let refs: Vec<(&str, i32)> = many.iter().map(|(n, p)| (n.as_str(), *p)).collect();
        let check = check_responders(Some(&field(&refs)), None, PREFIX);
        assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
        assert!(check.problems[0].contains("11 responders"));

        let bad = field(&[
            ("no-prefix", 5000),
            ("x.k8s.io/mine", 5000),
            ("low.example.com/x", 500),
            ("high.example.com/x", 100_001),
        ]);
        let problems = check_responders(Some(&bad), None, PREFIX).problems;
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("no domain prefix"));
        assert!(problems[1].contains("reserved for Kubernetes"));
        assert!(problems[2].contains("reserved for *.k8s.io"));
        assert!(problems[3].contains("outside 0..=100000"));
    }

    #[test]
    fn the_old_annotation_disagreeing_with_the_field_is_named_and_the_field_wins() {
        let annotations: BTreeMap<String, String> = [(
            format!("{PREFIX}db.example.com"),
            "20000/knowledgeable".to_owned(),
        )]
        .into();
        let f = field(&[("db.example.com/operator", 10000)]);
        let check = check_responders(Some(&f), Some(&annotations), PREFIX);
        assert_eq!(check.responders[0].name, "db.example.com/operator");
        assert!(
            check.problems.iter().any(|p| p.contains("disagree")),
            "{:?}",
            check.problems
        );
        // The annotation alone is ignored by the in-tree controllers: said so.
        let alone = check_responders(None, Some(&annotations), PREFIX);
        assert!(alone.responders.is_empty());
        assert_eq!(alone.problems.len(), 1);
        assert!(alone.problems[0].contains("not read by the in-tree API"));
    }
}
