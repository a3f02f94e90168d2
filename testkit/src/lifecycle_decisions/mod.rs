//! The decisions of Kubernetes 1.37's `evictionrequest-controller` and
//! `imperative-eviction-responder-controller` (`lifecycle.k8s.io/v1alpha1`, KEP-4563) for one
//! target pod, for the test kit's stand-in of the cluster's controllers on a real apiserver
//! that does not run them (the real-control-plane tier). No I/O. Moved here from nodegrace,
//! which ran them as its own controller of its `lifecycle.nodegrace.dev` CRDs until it became
//! a requester only; the default responder is now the in-tree one, [`IMPERATIVE_EVICTOR`].
//!
//! - [`decide`]: from the EvictionRequests naming the pod, the pod's facts and the Evictions of
//!   its name, the Eviction to create, the statuses and metadata to write, when to look again.
//! - [`decide_evictor`] and [`evictor_attempted`]: the imperative evictor, which calls the
//!   Eviction API with back-off when it is Active.
//!
//! Written to the upstream controllers (kubernetes/kubernetes `pkg/controller/evictionrequest`,
//! `pkg/controller/imperativeevictionresponder`, 1.37) and to the API's doc comments. Every
//! returned write is the whole desired value: applying it twice changes nothing, and deciding
//! again on the world it produced returns nothing to write.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::lifecycle::v1alpha1::{
    Eviction, EvictionPodReference, EvictionRequest, EvictionRequestStatus, EvictionSpec,
    EvictionStatus, EvictionTarget, Requester, ResponderStatus, TargetResponder,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

mod names;

pub use names::{
    domain_prefixed_key_problem, DeclaredResponder, INTENT_EVICTION, INTENT_WITHDRAWN,
    MAX_POD_RESPONDERS, MAX_RESPONDER_PRIORITY,
};

/// The default responder of every pod's Eviction; it calls the Eviction API.
pub const IMPERATIVE_EVICTOR: &str = "imperative-eviction.k8s.io/evictor";
/// The default responder's priority, as upstream's.
pub const EVICTOR_PRIORITY: i32 = 100;
/// `apiVersion` of EvictionRequests, for the owner references of Evictions.
pub const API_VERSION: &str = "lifecycle.k8s.io/v1alpha1";

/// Upstream `ResponderHeartbeatTimeout`: an Active responder silent for this long is Interrupted.
pub const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(20 * 60);
/// Upstream `GracefulCompletionDelay`: once a deleted pod is terminal, the Active responder
/// has this long after the deletion timestamp to report completion before it is Interrupted.
pub const GRACEFUL_COMPLETION_DELAY: Duration = Duration::from_secs(5);
/// `status.targetResponders` and `status.responders` hold at most this many entries.
pub const MAX_TARGET_RESPONDERS: usize = 11;
/// `status.requesters` holds at most this many entries (Withdrawn ones dropped first).
pub const MAX_REQUESTERS: usize = 100;

/// The evictor's first back-off (upstream `heartbeatMinDurationBetweenUpdates`), doubled per
/// failed attempt.
pub const EVICTOR_BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Upstream's back-off cap (`maxImperativeEvictionBackoff`; the KEP says "approx. 15 minutes",
/// the code has 10). A shutdown passes a shorter one.
pub const EVICTOR_BACKOFF_CAP: Duration = Duration::from_secs(10 * 60);
/// The evictor heartbeats at least this often (upstream `heartbeatMaxDurationBetweenUpdates`),
/// far inside [`HEARTBEAT_DEADLINE`].
pub const EVICTOR_HEARTBEAT: Duration = Duration::from_secs(3 * 60);

/// Why an eviction was refused, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A PodDisruptionBudget (or another reason the apiserver gave for a 429).
    Budget,
    /// The apiserver throttled the request without looking at it.
    Throttled,
    /// Any other failure.
    Error,
}

/// `TargetResponder.state` values.
pub const INACTIVE: &str = "Inactive";
pub const ACTIVE: &str = "Active";
pub const INTERRUPTED: &str = "Interrupted";
pub const CANCELED: &str = "Canceled";
pub const COMPLETED: &str = "Completed";

/// Condition types and reasons of Evictions and EvictionRequests (upstream names).
pub const FAILED: &str = "Failed";
pub const TARGET_EVICTED: &str = "TargetEvicted";
pub const AWAITING_EVICTION: &str = "AwaitingEviction";
pub const EVICTION_INVALID: &str = "EvictionInvalid";
pub const CANCELED_DUE_TO_NO_REQUESTERS: &str = "CanceledDueToNoRequesters";
pub const SUCCEEDED: &str = "Succeeded";
pub const NO_FURTHER_RESPONDER: &str = "NoFurtherResponder";
pub const POD_DELETED: &str = "PodDeleted";
pub const POD_TERMINAL: &str = "PodTerminal";
pub const EVICTION_FAILED: &str = "EvictionFailed";

/// `EvictionParticipantRole` label values on an Eviction, keyed by participant name.
pub const ROLE_REQUESTER: &str = "requester";
pub const ROLE_RESPONDER: &str = "responder";
pub const ROLE_REQUESTER_RESPONDER: &str = "requester-responder";

/// The pod an eviction is about, as the requests name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRef {
    pub name: String,
    pub uid: String,
}

/// Where the target pod (this UID) stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// No pod of that name.
    Absent,
    /// A pod of that name with another UID: the target was deleted and replaced.
    Replaced {
        uid: String,
    },
    Running,
    /// `metadata.deletionTimestamp` set, not yet terminal.
    Terminating {
        deletion_timestamp: Timestamp,
        /// `metadata.deletionGracePeriodSeconds` is 0 (the kubelet's final DELETE, or a forced
        /// one): the apiserver removes the pod at once, unless finalizers hold it.
        removed_at_once: bool,
    },
    /// Phase Succeeded or Failed.
    Terminal {
        deletion_timestamp: Option<Timestamp>,
    },
}

impl Presence {
    fn gone(&self) -> bool {
        matches!(self, Presence::Absent | Presence::Replaced { .. })
    }

    /// Gone, or about to be: terminated while being deleted (the kubelet's final DELETE
    /// comes next) or deleted with no grace left. Its requests and Evictions are collected
    /// with it moments later (owner references).
    pub fn leaving(&self) -> bool {
        self.gone()
            || matches!(
                self,
                Presence::Terminal {
                    deletion_timestamp: Some(_)
                } | Presence::Terminating {
                    removed_at_once: true,
                    ..
                }
            )
    }
}

/// Pods the Eviction API must not be asked about (the KEP: "API-initiated eviction of
/// DaemonSet pods and mirror pods is not supported"); the node's drain handles them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodKind {
    Regular,
    DaemonSet,
    Mirror,
}

/// What the decisions need to know of the target pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub presence: Presence,
    pub kind: PodKind,
    /// `spec.schedulingGroup` is set: pods of a PodGroup are not supported (EvictionInvalid).
    pub in_pod_group: bool,
    /// The responders the pod declares (`spec.evictionResponders`).
    pub responders: Vec<DeclaredResponder>,
}

/// What the controller decided for one target pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// An Eviction to create, its status included: create it, then write the status through
    /// the status subresource (which a create ignores).
    pub create: Option<Eviction>,
    /// Eviction statuses to write (by Eviction name), only where they changed.
    pub eviction_statuses: Vec<(String, EvictionStatus)>,
    /// Labels and owner references to set on an existing Eviction, where they changed.
    pub eviction_metadata: Vec<(String, EvictionMetadata)>,
    /// EvictionRequest statuses to write (by request name), only where they changed.
    pub request_statuses: Vec<(String, EvictionRequestStatus)>,
    /// When to decide again if nothing else changes first.
    pub wake_at: Option<Timestamp>,
    /// Bad input, one sentence each, for a log line or an event.
    pub problems: Vec<String>,
}

impl Decision {
    /// Whether there is nothing to write.
    pub fn is_quiet(&self) -> bool {
        self.create.is_none()
            && self.eviction_statuses.is_empty()
            && self.eviction_metadata.is_empty()
            && self.request_statuses.is_empty()
    }
}

/// The metadata the controller manages on an Eviction: the whole label map and the owner
/// references to hold (existing ones are never removed; garbage collection does that).
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionMetadata {
    pub labels: BTreeMap<String, String>,
    pub owner_references: Vec<OwnerReference>,
}

fn ts(t: &Time) -> Timestamp {
    t.0
}

fn after(t: Timestamp, d: Duration) -> Timestamp {
    let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

fn elapsed(now: Timestamp, since: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}

fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn find<'a>(conditions: Option<&'a Vec<Condition>>, kind: &str) -> Option<&'a Condition> {
    conditions?.iter().find(|c| c.type_ == kind)
}

fn is_true(conditions: Option<&Vec<Condition>>, kind: &str) -> bool {
    find(conditions, kind).is_some_and(|c| c.status == "True")
}

fn eviction_conditions(e: &Eviction) -> Option<&Vec<Condition>> {
    e.status.as_ref().and_then(|s| s.conditions.as_ref())
}

/// `TargetEvicted=True` or `Failed=True`: an Eviction is never changed again.
pub fn eviction_is_final(e: &Eviction) -> bool {
    is_true(eviction_conditions(e), TARGET_EVICTED) || is_true(eviction_conditions(e), FAILED)
}

/// A condition as upstream's `setCondition` writes it: the transition time kept while the
/// status stays the same.
fn condition(
    existing: Option<&Vec<Condition>>,
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Condition {
    let since = find(existing, kind)
        .filter(|c| c.status == status && c.last_transition_time.0 != Timestamp::UNIX_EPOCH)
        .map_or(now, |c| ts(&c.last_transition_time));
    Condition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: Time(since),
        observed_generation: None,
    }
}

/// Replaces the `Failed` and `TargetEvicted` conditions, keeping any other type as it is.
fn with_conditions(existing: Option<&Vec<Condition>>, pair: [Condition; 2]) -> Vec<Condition> {
    let mut out: Vec<Condition> = existing
        .into_iter()
        .flatten()
        .filter(|c| c.type_ != FAILED && c.type_ != TARGET_EVICTED)
        .cloned()
        .collect();
    out.extend(pair);
    out
}

fn target_of(e: &Eviction) -> Option<(&str, &str)> {
    e.spec
        .target
        .pod
        .as_ref()
        .map(|p| (p.name.as_str(), p.uid.as_str()))
}

fn request_target(r: &EvictionRequest) -> Option<(&str, &str)> {
    r.spec
        .target
        .pod
        .as_ref()
        .map(|p| (p.name.as_str(), p.uid.as_str()))
}

fn name_of(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

fn deleted(r: &EvictionRequest) -> bool {
    r.metadata.deletion_timestamp.is_some()
}

/// A request counts for eviction while it exists, is not being deleted and says `Eviction`.
fn wants_eviction(r: &EvictionRequest) -> bool {
    !deleted(r) && r.spec.intent == INTENT_EVICTION
}

/// The name of a new Eviction of pod `pod_name` (upstream `newEvictionName`): `pod-<n>-<name>`
/// with `n` one above the highest counter among `existing` names of the same pod name, cut to
/// 253 characters (a cut name shares its counters with pod names of the same prefix).
pub fn eviction_name<'a>(pod_name: &str, existing: impl IntoIterator<Item = &'a str>) -> String {
    const MAX: usize = 253;
    let highest = existing
        .into_iter()
        .filter_map(|name| {
            let rest = name.strip_prefix("pod-")?;
            let (counter, named) = rest.split_once('-')?;
            if counter.is_empty() || !counter.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let same = named == pod_name || (name.len() == MAX && pod_name.starts_with(named));
            same.then(|| counter.parse::<u64>().ok()).flatten()
        })
        .max()
        .unwrap_or(0);
    let mut name = format!("pod-{}-{pod_name}", highest.saturating_add(1));
    name.truncate(MAX);
    name
}

/// Upstream's responder order: higher priority first; among equal priorities, the name whose
/// domain labels compare first from the top-level label down, then the key.
pub fn responder_order(a: (&str, i32), b: (&str, i32)) -> Ordering {
    fn parts(name: &str) -> (Vec<&str>, &str) {
        let (domain, key) = name.split_once('/').unwrap_or((name, ""));
        (domain.rsplit('.').collect(), key)
    }
    b.1.cmp(&a.1).then_with(|| parts(a.0).cmp(&parts(b.0)))
}

fn sort_target_responders(list: &mut [TargetResponder]) {
    list.sort_by(|a, b| responder_order((&a.name, a.priority), (&b.name, b.priority)));
}

/// The first `status.targetResponders` of a pod: its declared responders (invalid and
/// duplicate ones dropped, the highest [`MAX_POD_RESPONDERS`] kept) and [`IMPERATIVE_EVICTOR`]
/// at [`EVICTOR_PRIORITY`], all Inactive, in selection order.
pub fn initial_target_responders(
    declared: &[DeclaredResponder],
    problems: &mut Vec<String>,
) -> Vec<TargetResponder> {
    let mut seen = BTreeSet::from([IMPERATIVE_EVICTOR]);
    let mut list = Vec::new();
    for r in declared {
        if let Some(why) = domain_prefixed_key_problem(&r.name) {
            problems.push(format!("responder {:?} skipped: {why}", r.name));
            continue;
        }
        let Some(priority) = i32::try_from(r.priority)
            .ok()
            .filter(|p| (0..=MAX_RESPONDER_PRIORITY).contains(p))
        else {
            problems.push(format!(
                "responder {} skipped: priority {} is outside 0..={MAX_RESPONDER_PRIORITY}",
                r.name, r.priority
            ));
            continue;
        };
        if !seen.insert(r.name.as_str()) {
            problems.push(format!(
                "responder {} is declared more than once; the first declaration counts",
                r.name
            ));
            continue;
        }
        list.push(TargetResponder {
            name: r.name.clone(),
            priority,
            state: INACTIVE.to_owned(),
        });
    }
    sort_target_responders(&mut list);
    if list.len() > MAX_POD_RESPONDERS {
        let dropped: Vec<String> = list
            .drain(MAX_POD_RESPONDERS..)
            .map(|r| format!("{}={}", r.name, r.priority))
            .collect();
        problems.push(format!(
            "more than {MAX_POD_RESPONDERS} responders declared; the lowest-priority ones never run: {}",
            dropped.join(", ")
        ));
    }
    list.push(TargetResponder {
        name: IMPERATIVE_EVICTOR.to_owned(),
        priority: EVICTOR_PRIORITY,
        state: INACTIVE.to_owned(),
    });
    sort_target_responders(&mut list);
    list
}

/// `status.requesters` merged as upstream does: one entry per requester name, requests that
/// exist before names only the status remembers (as Withdrawn), then those with the Eviction
/// intent, older first; cut to [`MAX_REQUESTERS`], so Withdrawn ones are dropped first.
fn merge_requesters(previous: &[Requester], requests: &[&EvictionRequest]) -> Vec<Requester> {
    let mut current: Vec<&EvictionRequest> = requests.to_vec();
    current.sort_by(|a, b| {
        deleted(a)
            .cmp(&deleted(b))
            .then_with(|| wants_eviction(b).cmp(&wants_eviction(a)))
            .then_with(|| {
                let t = |r: &EvictionRequest| r.metadata.creation_timestamp.as_ref().map(ts);
                t(a).cmp(&t(b))
            })
            .then_with(|| a.spec.requester.cmp(&b.spec.requester))
    });
    let mut out: Vec<Requester> = Vec::new();
    let mut seen = BTreeSet::new();
    let from_requests = current.iter().map(|r| Requester {
        name: r.spec.requester.clone(),
        intent: if deleted(r) {
            INTENT_WITHDRAWN.to_owned()
        } else {
            r.spec.intent.clone()
        },
    });
    let remembered = previous.iter().map(|p| Requester {
        name: p.name.clone(),
        intent: INTENT_WITHDRAWN.to_owned(),
    });
    for r in from_requests.chain(remembered) {
        if out.len() >= MAX_REQUESTERS {
            break;
        }
        if seen.insert(r.name.clone()) {
            out.push(r);
        }
    }
    out
}

/// What becomes of the responders (upstream `computeResponderProgression`): the states after
/// this pass, whether no responder is left to try, and when to look again.
fn progress_responders(
    targets: &mut [TargetResponder],
    statuses: &[ResponderStatus],
    pod: &Presence,
    canceled: bool,
    now: Timestamp,
) -> (bool, Option<Timestamp>) {
    let Some(last) = targets.last() else {
        return (false, None);
    };
    if matches!(last.state.as_str(), INTERRUPTED | CANCELED | COMPLETED) {
        return (true, None);
    }
    let status_of = |name: &str| statuses.iter().find(|s| s.name == name);
    let active = targets.iter().position(|t| t.state == ACTIVE);
    if pod.gone() || matches!(pod, Presence::Terminal { .. }) {
        let Some(i) = active else {
            return (false, None);
        };
        let status = status_of(&targets[i].name);
        if status.is_some_and(|s| s.completion_time.is_some()) {
            targets[i].state = COMPLETED.to_owned();
            return (false, None);
        }
        if let Some(at) = completion_deferred_until(status, pod, now) {
            return (false, Some(at));
        }
        targets[i].state = INTERRUPTED.to_owned();
        return (false, None);
    }
    if canceled {
        if let Some(i) = active {
            targets[i].state = CANCELED.to_owned();
        }
        return (false, None);
    }
    let Some(mut i) = active.or_else(|| targets.iter().position(|t| t.state == INACTIVE)) else {
        return (false, None);
    };
    // Upstream hands over one responder per pass and sees the next one's state on the next
    // pass (the same instant when nothing else happens); going on here until a responder
    // stays Active reaches the same states in one write.
    loop {
        let state = match status_of(&targets[i].name) {
            None => ACTIVE,
            Some(s) if s.completion_time.is_some() => COMPLETED,
            Some(s) => {
                if elapsed(now, last_word(s, now)) >= HEARTBEAT_DEADLINE {
                    INTERRUPTED
                } else {
                    ACTIVE
                }
            }
        };
        targets[i].state = state.to_owned();
        if state == ACTIVE {
            let since = status_of(&targets[i].name).map_or(now, |s| last_word(s, now));
            return (false, Some(after(since, HEARTBEAT_DEADLINE)));
        }
        if i + 1 == targets.len() {
            return (true, None);
        }
        i += 1;
    }
}

/// What the heartbeat deadline counts from: the heartbeat, else the start (upstream reads
/// the heartbeat first even when it is older than the start), else now.
fn last_word(s: &ResponderStatus, now: Timestamp) -> Timestamp {
    s.heartbeat_time
        .as_ref()
        .or(s.start_time.as_ref())
        .map_or(now, ts)
}

/// Upstream `shouldDeferCompletion`: the Active responder of a pod that was deleted and is
/// now terminal gets until [`GRACEFUL_COMPLETION_DELAY`] after the deletion timestamp to set
/// its completion time. A pod no longer there defers nothing.
fn completion_deferred_until(
    status: Option<&ResponderStatus>,
    pod: &Presence,
    now: Timestamp,
) -> Option<Timestamp> {
    let status = status?;
    if status.completion_time.is_some() {
        return None;
    }
    let Presence::Terminal {
        deletion_timestamp: Some(deleted_at),
    } = pod
    else {
        return None;
    };
    let until = after(*deleted_at, GRACEFUL_COMPLETION_DELAY);
    (until > now).then_some(until)
}

/// The status the controller wants for `eviction` (not final, of this target), and when to
/// look again.
fn eviction_status(
    eviction: &Eviction,
    pod: &PodFacts,
    requests: &[&EvictionRequest],
    now: Timestamp,
    problems: &mut Vec<String>,
) -> (EvictionStatus, Option<Timestamp>) {
    let old = eviction.status.clone().unwrap_or_default();
    let existing = old.conditions.as_ref();
    let requesters = merge_requesters(old.requesters.as_deref().unwrap_or_default(), requests);
    let gone = pod.presence.gone();
    let terminal = matches!(pod.presence, Presence::Terminal { .. });
    let canceled = !gone && !terminal && !requests.iter().any(|r| wants_eviction(r));

    let mut targets = match old.target_responders.as_deref() {
        Some(list) if !list.is_empty() => list.to_vec(),
        _ if gone => Vec::new(),
        _ => initial_target_responders(&pod.responders, problems),
    };
    sort_target_responders(&mut targets);
    let old_statuses = old.responders.as_deref().unwrap_or_default();
    let (no_further, mut wake) =
        progress_responders(&mut targets, old_statuses, &pod.presence, canceled, now);

    let responders: Vec<ResponderStatus> = targets
        .iter()
        .map(|t| {
            let mut s = old_statuses
                .iter()
                .find(|s| s.name == t.name)
                .cloned()
                .unwrap_or_else(|| ResponderStatus {
                    name: t.name.clone(),
                    ..ResponderStatus::default()
                });
            // Every responder that has been Active has a start time.
            if s.start_time.is_none() && t.state != INACTIVE {
                s.start_time = Some(Time(now));
            }
            s
        })
        .collect();

    let active_status = targets
        .iter()
        .find(|t| t.state == ACTIVE)
        .and_then(|t| old_statuses.iter().find(|s| s.name == t.name));
    let waiting_for_responder = if gone || terminal {
        wake = completion_deferred_until(active_status, &pod.presence, now);
        wake.is_some()
    } else {
        false
    };
    let c = |kind: &str, status: &str, reason: &str, message: &str| {
        condition(existing, kind, status, reason, message, now)
    };
    let pair = if gone && !waiting_for_responder {
        [
            c(FAILED, "False", SUCCEEDED, ""),
            c(
                TARGET_EVICTED,
                "True",
                POD_DELETED,
                "Target pod has been deleted",
            ),
        ]
    } else if terminal && !waiting_for_responder {
        [
            c(FAILED, "False", SUCCEEDED, ""),
            c(
                TARGET_EVICTED,
                "True",
                POD_TERMINAL,
                "Pod has reached terminal state",
            ),
        ]
    } else if canceled {
        [
            c(
                FAILED,
                "True",
                CANCELED_DUE_TO_NO_REQUESTERS,
                "No active requesters with eviction intent",
            ),
            c(TARGET_EVICTED, "False", EVICTION_FAILED, ""),
        ]
    } else if no_further {
        [
            c(
                FAILED,
                "True",
                NO_FURTHER_RESPONDER,
                "All responders have completed without evicting the target",
            ),
            c(TARGET_EVICTED, "False", EVICTION_FAILED, ""),
        ]
    } else {
        [
            c(FAILED, "False", AWAITING_EVICTION, ""),
            c(TARGET_EVICTED, "False", AWAITING_EVICTION, ""),
        ]
    };
    if pair.iter().any(|c| c.status == "True") {
        wake = None;
    }
    let status = EvictionStatus {
        conditions: Some(with_conditions(existing, pair)),
        observed_generation: Some(eviction.metadata.generation.unwrap_or(1)),
        requesters: (!requesters.is_empty()).then_some(requesters),
        target_responders: (!targets.is_empty()).then_some(targets),
        responders: (!responders.is_empty()).then_some(responders),
    };
    (status, wake)
}

/// `Failed=True` (`EvictionInvalid`, `message`) and `TargetEvicted=False` (`EvictionFailed`).
fn invalid_pair(
    existing: Option<&Vec<Condition>>,
    message: &str,
    now: Timestamp,
) -> [Condition; 2] {
    [
        condition(existing, FAILED, "True", EVICTION_INVALID, message, now),
        condition(existing, TARGET_EVICTED, "False", EVICTION_FAILED, "", now),
    ]
}

/// The labels (upstream's refresh loop): each requester with a request, each target
/// responder, as `requester`, `responder` or `requester-responder`; labels with other values
/// (not the controller's) kept.
fn desired_labels(
    existing: Option<&BTreeMap<String, String>>,
    requests: &[&EvictionRequest],
    responders: &[TargetResponder],
) -> BTreeMap<String, String> {
    let role = |v: &str| {
        matches!(
            v,
            ROLE_REQUESTER | ROLE_RESPONDER | ROLE_REQUESTER_RESPONDER
        )
    };
    let mut labels: BTreeMap<String, String> = existing
        .into_iter()
        .flatten()
        .filter(|(_, v)| !role(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for r in requests {
        labels.insert(r.spec.requester.clone(), ROLE_REQUESTER.to_owned());
    }
    for t in responders {
        let value = if labels.get(&t.name).map(String::as_str) == Some(ROLE_REQUESTER) {
            ROLE_REQUESTER_RESPONDER
        } else {
            ROLE_RESPONDER
        };
        labels.insert(t.name.clone(), value.to_owned());
    }
    labels
}

fn owner_reference(r: &EvictionRequest) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: "EvictionRequest".to_owned(),
        name: r.metadata.name.clone()?,
        uid: r.metadata.uid.clone()?,
        ..OwnerReference::default()
    })
}

/// Existing EvictionRequest owner references kept (garbage collection removes them), one
/// added for each request not being deleted.
fn desired_owners(
    existing: &[OwnerReference],
    requests: &[&EvictionRequest],
) -> Vec<OwnerReference> {
    let mut out = existing.to_vec();
    for r in requests.iter().filter(|r| !deleted(r)) {
        if let Some(o) = owner_reference(r) {
            if !out.iter().any(|x| x.kind == o.kind && x.uid == o.uid) {
                out.push(o);
            }
        }
    }
    out
}

/// An EvictionRequest status with `conditions` (whole value: other types kept).
fn request_status(r: &EvictionRequest, pair: [Condition; 2]) -> EvictionRequestStatus {
    let existing = r.status.as_ref().and_then(|s| s.conditions.as_ref());
    EvictionRequestStatus {
        conditions: Some(with_conditions(existing, pair)),
        observed_generation: Some(r.metadata.generation.unwrap_or(1)),
    }
}

/// A request upstream stops syncing: `TargetEvicted=True` or `Failed=True` for `EvictionInvalid`.
fn request_is_final(r: &EvictionRequest) -> bool {
    let conditions = r.status.as_ref().and_then(|s| s.conditions.as_ref());
    is_true(conditions, TARGET_EVICTED)
        || find(conditions, FAILED)
            .is_some_and(|c| c.status == "True" && c.reason == EVICTION_INVALID)
}

/// Upstream `findRelevantEviction`: the latest `TargetEvicted`, else the oldest active, else
/// the latest `Failed` one; and whether a new Eviction may be made (no evicted or active one).
fn relevant_eviction<'a>(mine: &[&'a Eviction]) -> (Option<&'a Eviction>, bool) {
    let when = |e: &Eviction, kind: &str| {
        find(eviction_conditions(e), kind).map(|c| ts(&c.last_transition_time))
    };
    let created = |e: &Eviction| e.metadata.creation_timestamp.as_ref().map(ts);
    let evicted = mine
        .iter()
        .filter(|e| is_true(eviction_conditions(e), TARGET_EVICTED))
        .max_by_key(|e| when(e, TARGET_EVICTED));
    if let Some(e) = evicted {
        return (Some(*e), false);
    }
    let active = mine
        .iter()
        .filter(|e| !eviction_is_final(e))
        .min_by_key(|e| (created(e), name_of(&e.metadata).to_owned()));
    if let Some(e) = active {
        return (Some(*e), false);
    }
    let failed = mine.iter().max_by_key(|e| when(e, FAILED));
    (failed.copied(), true)
}

mod decide;
pub use decide::decide;
mod evictor;
#[cfg(test)]
use evictor::evictor_backoff;
pub use evictor::{
    activated_eviction, decide_evictor, evictor_attempted, recorded_attempts, with_evictor_entry,
    EvictionOutcome, EvictorDecision,
};

#[cfg(test)]
mod tests;
