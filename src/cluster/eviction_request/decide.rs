//! The eviction-request controller's decisions for one EvictionRequest, without I/O.
//!
//! Given the request, where its pod stands and the time, [`decide`] says what to do next:
//! nothing until a deadline, write a new status (select or hand over an interceptor,
//! complete, cancel), or call the Eviction API. [`after_eviction`] turns the Eviction API's
//! answer into the status to write and the back-off before the next attempt.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::PodState;
use crate::api::{
    EvictionRequest, EvictionRequestCancellationPolicy, EvictionRequestStatus, PodEvictionStatus,
    CONDITION_COMPLETE,
};
use crate::cluster::evict;

/// What the controller knows besides the request itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inputs {
    pub pod: PodState,
    pub now: Timestamp,
    /// After a failed eviction: no new attempt before this.
    pub eviction_not_before: Option<Timestamp>,
}

/// Why an interceptor lost control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// It set `activeInterceptorCompleted`.
    Completed,
    /// `heartbeatTime` is older than `heartbeatDeadlineSeconds`.
    MissedHeartbeat,
}

/// Why a request is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    PodDeleted,
    PodTerminal,
    /// No requester left and cancellation allowed.
    Cancelled,
}

impl Completion {
    fn reason(self) -> &'static str {
        match self {
            Completion::PodDeleted => "PodDeleted",
            Completion::PodTerminal => "PodTerminated",
            Completion::Cancelled => "Cancelled",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Completion::PodDeleted => "The pod has been deleted.",
            Completion::PodTerminal => "The pod has terminated.",
            Completion::Cancelled => {
                "Cancelled: no requester is left and the cancellation policy allows it."
            }
        }
    }
}

/// A status change, for logs and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transition {
    Selected {
        interceptor: String,
    },
    HandedOver {
        from: String,
        to: String,
        why: Release,
    },
    Completed(Completion),
    /// The Eviction API will not be used for this pod (DaemonSet or mirror pod).
    NotEvictable,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Nothing to write. Look again at `recheck_at` (a heartbeat deadline, the end of a
    /// back-off) or when the request or the pod changes.
    Wait { recheck_at: Option<Timestamp> },
    /// Replace the status (with the request's resourceVersion).
    WriteStatus {
        status: Box<EvictionRequestStatus>,
        transition: Transition,
    },
    /// Call the Eviction API for the pod; `released` says why no interceptor holds it.
    Evict { released: Option<(String, Release)> },
}

/// The next step for `request`.
pub(crate) fn decide(request: &EvictionRequest, inputs: &Inputs) -> Action {
    if request.is_complete() {
        return Action::Wait { recheck_at: None };
    }
    let status = request.status.clone().unwrap_or_default();
    match inputs.pod {
        PodState::Absent => return complete(request, status, Completion::PodDeleted, inputs.now),
        PodState::Terminal => {
            return complete(request, status, Completion::PodTerminal, inputs.now)
        }
        PodState::Terminating | PodState::Present { .. } => {}
    }
    if request.spec.requesters.is_empty()
        && request.cancellation_policy() == EvictionRequestCancellationPolicy::Allow
    {
        return complete(request, status, Completion::Cancelled, inputs.now);
    }

    let interceptors = &request.spec.interceptors;
    let Some(active) = status.active_interceptor_name.clone() else {
        let Some(first) = interceptors.last() else {
            return eviction(&status, inputs, None);
        };
        let mut next = status;
        next.active_interceptor_name = Some(first.name.clone());
        next.active_interceptor_completed = false;
        next.heartbeat_time = Some(Time(inputs.now));
        next.expected_interceptor_finish_time = None;
        next.eviction_request_cancellation_policy
            .get_or_insert(EvictionRequestCancellationPolicy::Allow);
        next.message = format!("Interceptor {} is active.", first.name);
        return Action::WriteStatus {
            status: Box::new(next),
            transition: Transition::Selected {
                interceptor: first.name.clone(),
            },
        };
    };

    let deadline = heartbeat_deadline(request, &status);
    let released = if status.active_interceptor_completed {
        Some(Release::Completed)
    } else if deadline.is_none_or(|d| inputs.now >= d) {
        Some(Release::MissedHeartbeat)
    } else {
        None
    };
    let Some(why) = released else {
        return Action::Wait {
            recheck_at: deadline,
        };
    };
    // An unknown name (the CRD forbids it) counts as the last one.
    let index = interceptors.iter().position(|i| i.name == active);
    match index.filter(|i| *i > 0).map(|i| &interceptors[i - 1]) {
        Some(to) => {
            let mut next = status;
            next.active_interceptor_name = Some(to.name.clone());
            next.active_interceptor_completed = false;
            next.heartbeat_time = Some(Time(inputs.now));
            next.expected_interceptor_finish_time = None;
            next.message = format!(
                "Interceptor {active} {}; interceptor {} is active.",
                released_phrase(why, request),
                to.name
            );
            Action::WriteStatus {
                status: Box::new(next),
                transition: Transition::HandedOver {
                    from: active,
                    to: to.name.clone(),
                    why,
                },
            }
        }
        None => eviction(&status, inputs, Some((active, why))),
    }
}

/// When the active interceptor's heartbeat runs out: `heartbeatDeadlineSeconds` after
/// `heartbeatTime`, or after the creation when no heartbeat was ever written.
pub(crate) fn heartbeat_deadline(
    request: &EvictionRequest,
    status: &EvictionRequestStatus,
) -> Option<Timestamp> {
    let since = status
        .heartbeat_time
        .as_ref()
        .or(request.metadata.creation_timestamp.as_ref())?
        .0;
    let window =
        SignedDuration::from_secs(i64::from(request.spec.heartbeat_deadline_seconds.max(0)));
    since.checked_add(window).ok()
}

fn released_phrase(why: Release, request: &EvictionRequest) -> String {
    match why {
        Release::Completed => "completed".to_owned(),
        Release::MissedHeartbeat => format!(
            "sent no heartbeat within {}s",
            request.spec.heartbeat_deadline_seconds
        ),
    }
}

fn eviction(
    status: &EvictionRequestStatus,
    inputs: &Inputs,
    released: Option<(String, Release)>,
) -> Action {
    match inputs.pod {
        // KEP-4563: no eviction of a pod that is already terminating.
        PodState::Terminating => Action::Wait { recheck_at: None },
        PodState::Present { evictable: false } => {
            let message = "The Eviction API is not used for DaemonSet and mirror pods; waiting for the pod to be terminated by other means.";
            if status.message == message {
                return Action::Wait { recheck_at: None };
            }
            let mut next = status.clone();
            next.message = message.to_owned();
            Action::WriteStatus {
                status: Box::new(next),
                transition: Transition::NotEvictable,
            }
        }
        _ => match inputs.eviction_not_before.filter(|t| *t > inputs.now) {
            Some(t) => Action::Wait {
                recheck_at: Some(t),
            },
            None => Action::Evict { released },
        },
    }
}

fn complete(
    request: &EvictionRequest,
    mut status: EvictionRequestStatus,
    why: Completion,
    now: Timestamp,
) -> Action {
    status.conditions.retain(|c| c.type_ != CONDITION_COMPLETE);
    status.conditions.push(Condition {
        type_: CONDITION_COMPLETE.to_owned(),
        status: "True".to_owned(),
        reason: why.reason().to_owned(),
        message: why.message().to_owned(),
        last_transition_time: Time(now),
        observed_generation: request.metadata.generation,
    });
    status.active_interceptor_name = None;
    status.active_interceptor_completed = false;
    status.heartbeat_time = None;
    status.expected_interceptor_finish_time = None;
    status.message = why.message().to_owned();
    Action::WriteStatus {
        status: Box::new(status),
        transition: Transition::Completed(why),
    }
}

/// The Eviction API's answer for the request's pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EvictionResult {
    /// The pod is now terminating.
    Accepted,
    /// 404, or the UID precondition failed: the pod is gone.
    Gone,
    /// 429: a PodDisruptionBudget (named when the apiserver says which) or throttling.
    Blocked {
        budget: Option<String>,
        message: String,
    },
    /// Any other refusal by the apiserver (e.g. several budgets select the pod).
    Refused { message: String },
}

impl From<evict::Outcome> for EvictionResult {
    fn from(outcome: evict::Outcome) -> Self {
        match outcome {
            evict::Outcome::Accepted => EvictionResult::Accepted,
            evict::Outcome::Gone => EvictionResult::Gone,
            evict::Outcome::Blocked { budget, message } => {
                EvictionResult::Blocked { budget, message }
            }
        }
    }
}

/// The status to write after an eviction attempt, and how long to wait before the next
/// attempt (failed attempts only: 1 s doubling up to `backoff_cap`, counted from the
/// persisted `failedAPIEvictionCounter`, so a restarted daemon keeps backing off).
pub(crate) fn after_eviction(
    request: &EvictionRequest,
    released: Option<&(String, Release)>,
    result: &EvictionResult,
    now: Timestamp,
    backoff_cap: Duration,
) -> (Option<EvictionRequestStatus>, Option<Duration>) {
    let status = request.status.clone().unwrap_or_default();
    let why = match released {
        None => "No interceptor".to_owned(),
        Some((name, r)) => format!("Interceptor {name} {}", released_phrase(*r, request)),
    };
    let (message, failed) = match result {
        EvictionResult::Gone => {
            return match complete(request, status, Completion::PodDeleted, now) {
                Action::WriteStatus { status, .. } => (Some(*status), None),
                _ => (None, None),
            };
        }
        // Without an interceptor to record, the pod's deletionTimestamp says it all; the
        // Complete write follows once it is gone (one status write per request, not two).
        EvictionResult::Accepted if released.is_none() => return (None, None),
        EvictionResult::Accepted => (
            format!("{why}; evicted through the Eviction API, waiting for the pod to terminate."),
            false,
        ),
        EvictionResult::Blocked {
            budget: Some(budget),
            message,
        } => (
            format!("{why}; the Eviction API refused: PodDisruptionBudget {budget} blocks the eviction ({message})"),
            true,
        ),
        EvictionResult::Blocked {
            budget: None,
            message,
        } => (
            format!("{why}; the Eviction API refused (429): {message}"),
            true,
        ),
        EvictionResult::Refused { message } => {
            (format!("{why}; the Eviction API refused: {message}"), true)
        }
    };
    let mut next = status;
    let mut retry = None;
    if failed {
        let counter = request.failed_api_evictions().saturating_add(1);
        next.pod_eviction_status = Some(PodEvictionStatus {
            failed_api_eviction_counter: counter,
        });
        let delay = evict::backoff(counter.saturating_sub(1).max(0) as u32, backoff_cap);
        next.message = format!(
            "{message} Failed attempts: {counter}; next attempt in {}s.",
            delay.as_secs()
        );
        retry = Some(delay);
    } else {
        next.message = message;
    }
    let changed = request.status.as_ref() != Some(&next);
    (changed.then_some(next), retry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Interceptor;

    const T0: i64 = 1_800_000_000;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(T0 + secs).unwrap()
    }

    fn request(interceptors: &[&str]) -> EvictionRequest {
        let mut r = EvictionRequest::for_pod(
            "ns",
            "db-0",
            "uid-1",
            "nodemaintenance.nodegrace.dev",
            interceptors
                .iter()
                .map(|n| Interceptor {
                    name: n.to_string(),
                })
                .collect(),
        );
        r.metadata.creation_timestamp = Some(Time(at(0)));
        r.metadata.generation = Some(1);
        r
    }

    fn running(now: i64) -> Inputs {
        Inputs {
            pod: PodState::Present { evictable: true },
            now: at(now),
            eviction_not_before: None,
        }
    }

    fn with(mut r: EvictionRequest, f: impl FnOnce(&mut EvictionRequestStatus)) -> EvictionRequest {
        let mut s = r.status.take().unwrap_or_default();
        f(&mut s);
        r.status = Some(s);
        r
    }

    fn written(action: Action) -> (EvictionRequestStatus, Transition) {
        match action {
            Action::WriteStatus { status, transition } => (*status, transition),
            other => panic!("expected a status write, got {other:?}"),
        }
    }

    #[test]
    fn the_highest_index_interceptor_is_selected_first() {
        let r = request(&["low.example.com", "high.example.com"]);
        let (status, transition) = written(decide(&r, &running(5)));
        assert_eq!(
            status.active_interceptor_name.as_deref(),
            Some("high.example.com")
        );
        assert!(!status.active_interceptor_completed);
        assert_eq!(status.heartbeat_time, Some(Time(at(5))));
        assert_eq!(
            status.eviction_request_cancellation_policy,
            Some(EvictionRequestCancellationPolicy::Allow)
        );
        assert_eq!(
            transition,
            Transition::Selected {
                interceptor: "high.example.com".into()
            }
        );
    }

    #[test]
    fn a_fresh_heartbeat_waits_until_its_deadline() {
        let r = with(request(&["a.example.com", "b.example.com"]), |s| {
            s.active_interceptor_name = Some("b.example.com".into());
            s.heartbeat_time = Some(Time(at(100)));
        });
        assert_eq!(
            decide(&r, &running(1899)),
            Action::Wait {
                recheck_at: Some(at(1900))
            }
        );
    }

    #[test]
    fn a_missed_heartbeat_hands_over_to_the_next_lower_index() {
        let r = with(request(&["a.example.com", "b.example.com"]), |s| {
            s.active_interceptor_name = Some("b.example.com".into());
            s.heartbeat_time = Some(Time(at(100)));
            s.expected_interceptor_finish_time = Some(Time(at(5000)));
            s.eviction_request_cancellation_policy =
                Some(EvictionRequestCancellationPolicy::Forbid);
        });
        let (status, transition) = written(decide(&r, &running(1900)));
        assert_eq!(
            status.active_interceptor_name.as_deref(),
            Some("a.example.com")
        );
        assert_eq!(status.heartbeat_time, Some(Time(at(1900))));
        assert_eq!(status.expected_interceptor_finish_time, None);
        // Not reset on hand-over (KEP-4563).
        assert_eq!(
            status.eviction_request_cancellation_policy,
            Some(EvictionRequestCancellationPolicy::Forbid)
        );
        assert!(status
            .message
            .contains("b.example.com sent no heartbeat within 1800s"));
        assert_eq!(
            transition,
            Transition::HandedOver {
                from: "b.example.com".into(),
                to: "a.example.com".into(),
                why: Release::MissedHeartbeat
            }
        );
    }

    #[test]
    fn without_a_heartbeat_the_deadline_runs_from_creation() {
        let r = with(request(&["a.example.com", "b.example.com"]), |s| {
            s.active_interceptor_name = Some("b.example.com".into());
        });
        assert_eq!(
            decide(&r, &running(10)),
            Action::Wait {
                recheck_at: Some(at(1800))
            }
        );
        assert!(matches!(
            decide(&r, &running(1800)),
            Action::WriteStatus { .. }
        ));
    }

    #[test]
    fn a_completed_interceptor_hands_over_at_once() {
        let r = with(request(&["a.example.com", "b.example.com"]), |s| {
            s.active_interceptor_name = Some("b.example.com".into());
            s.active_interceptor_completed = true;
            s.heartbeat_time = Some(Time(at(100)));
        });
        let (status, transition) = written(decide(&r, &running(101)));
        assert_eq!(
            status.active_interceptor_name.as_deref(),
            Some("a.example.com")
        );
        assert!(!status.active_interceptor_completed);
        assert!(matches!(
            transition,
            Transition::HandedOver {
                why: Release::Completed,
                ..
            }
        ));
    }

    #[test]
    fn after_the_last_interceptor_the_eviction_api_is_used() {
        let r = with(request(&["a.example.com"]), |s| {
            s.active_interceptor_name = Some("a.example.com".into());
            s.active_interceptor_completed = true;
        });
        assert_eq!(
            decide(&r, &running(1)),
            Action::Evict {
                released: Some(("a.example.com".into(), Release::Completed))
            }
        );
        // No interceptors at all: straight to the Eviction API.
        assert_eq!(
            decide(&request(&[]), &running(0)),
            Action::Evict { released: None }
        );
    }

    #[test]
    fn a_renewed_heartbeat_stops_the_fallback_eviction() {
        let r = with(request(&["a.example.com"]), |s| {
            s.active_interceptor_name = Some("a.example.com".into());
            s.heartbeat_time = Some(Time(at(2000)));
        });
        assert_eq!(
            decide(&r, &running(2100)),
            Action::Wait {
                recheck_at: Some(at(3800))
            }
        );
    }

    #[test]
    fn terminating_pods_are_not_evicted_and_backoff_is_respected() {
        let r = request(&[]);
        let terminating = Inputs {
            pod: PodState::Terminating,
            ..running(0)
        };
        assert_eq!(decide(&r, &terminating), Action::Wait { recheck_at: None });
        let backing_off = Inputs {
            eviction_not_before: Some(at(30)),
            ..running(10)
        };
        assert_eq!(
            decide(&r, &backing_off),
            Action::Wait {
                recheck_at: Some(at(30))
            }
        );
        let over = Inputs {
            eviction_not_before: Some(at(30)),
            ..running(30)
        };
        assert_eq!(decide(&r, &over), Action::Evict { released: None });
    }

    #[test]
    fn daemonset_and_mirror_pods_are_never_evicted() {
        let r = request(&[]);
        let inputs = Inputs {
            pod: PodState::Present { evictable: false },
            ..running(0)
        };
        let (status, transition) = written(decide(&r, &inputs));
        assert_eq!(transition, Transition::NotEvictable);
        let r = with(r, |s| *s = status);
        assert_eq!(decide(&r, &inputs), Action::Wait { recheck_at: None });
    }

    #[test]
    fn a_gone_or_finished_pod_completes_the_request_and_clears_the_interceptor() {
        let r = with(request(&["a.example.com"]), |s| {
            s.active_interceptor_name = Some("a.example.com".into());
            s.heartbeat_time = Some(Time(at(1)));
        });
        for (pod, reason) in [
            (PodState::Absent, "PodDeleted"),
            (PodState::Terminal, "PodTerminated"),
        ] {
            let inputs = Inputs { pod, ..running(9) };
            let (status, _) = written(decide(&r, &inputs));
            let c = &status.conditions[0];
            assert_eq!((c.type_.as_str(), c.status.as_str()), ("Complete", "True"));
            assert_eq!(c.reason, reason);
            assert_eq!(c.observed_generation, Some(1));
            assert_eq!(status.active_interceptor_name, None);
            assert_eq!(status.heartbeat_time, None);
            let done = with(r.clone(), |s| *s = status);
            assert!(done.is_complete());
            assert_eq!(decide(&done, &inputs), Action::Wait { recheck_at: None });
        }
    }

    #[test]
    fn no_requesters_cancels_unless_forbidden() {
        let mut r = with(request(&["a.example.com"]), |s| {
            s.active_interceptor_name = Some("a.example.com".into());
            s.heartbeat_time = Some(Time(at(1)));
        });
        r.spec.requesters.clear();
        let (status, transition) = written(decide(&r, &running(2)));
        assert_eq!(transition, Transition::Completed(Completion::Cancelled));
        assert_eq!(status.conditions[0].reason, "Cancelled");
        assert_eq!(status.active_interceptor_name, None);

        let forbidden = with(r, |s| {
            s.eviction_request_cancellation_policy = Some(EvictionRequestCancellationPolicy::Forbid)
        });
        assert_eq!(
            decide(&forbidden, &running(2)),
            Action::Wait {
                recheck_at: Some(at(1801))
            }
        );
    }

    #[test]
    fn a_blocked_eviction_counts_names_the_budget_and_backs_off() {
        let cap = Duration::from_secs(900);
        let released = ("a.example.com".to_owned(), Release::MissedHeartbeat);
        let blocked = EvictionResult::Blocked {
            budget: Some("db-pdb".into()),
            message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        };
        let mut r = request(&["a.example.com"]);
        let mut delays = Vec::new();
        for _ in 0..12 {
            let (status, retry) = after_eviction(&r, Some(&released), &blocked, at(0), cap);
            let status = status.expect("a failed attempt is recorded");
            assert!(
                status.message.contains("PodDisruptionBudget db-pdb"),
                "{}",
                status.message
            );
            assert!(status.message.contains("a.example.com sent no heartbeat"));
            delays.push(retry.unwrap().as_secs());
            r.status = Some(status);
        }
        assert_eq!(r.failed_api_evictions(), 12);
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]);
    }

    #[test]
    fn an_accepted_eviction_is_recorded_once_after_an_interceptor_and_a_gone_pod_completes() {
        let r = request(&[]);
        // No interceptor: nothing to record; the Complete write follows the pod's exit.
        let (nothing, retry) = after_eviction(
            &r,
            None,
            &EvictionResult::Accepted,
            at(0),
            Duration::from_secs(9),
        );
        assert_eq!((nothing, retry), (None, None));
        let released = ("db-operator.example.com".to_string(), Release::Completed);
        let (status, retry) = after_eviction(
            &r,
            Some(&released),
            &EvictionResult::Accepted,
            at(0),
            Duration::from_secs(9),
        );
        let status = status.unwrap();
        assert!(status.message.contains("evicted through the Eviction API"));
        assert_eq!(retry, None);
        let again = with(r.clone(), |s| *s = status);
        let (unchanged, _) = after_eviction(
            &again,
            Some(&released),
            &EvictionResult::Accepted,
            at(1),
            Duration::from_secs(9),
        );
        assert_eq!(unchanged, None);
        let (gone, _) = after_eviction(
            &r,
            None,
            &EvictionResult::Gone,
            at(1),
            Duration::from_secs(9),
        );
        assert_eq!(gone.unwrap().conditions[0].reason, "PodDeleted");
    }

    /// The CRD's CEL rules (what a real apiserver enforces, the fake does not) accept
    /// every status the controller writes, in order.
    #[test]
    fn every_status_write_passes_the_crds_validation_rules() {
        let crd = serde_json::to_value(crate::api::eviction_request_crd().unwrap()).unwrap();
        let schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
        let validate = |old: &EvictionRequest, new: &EvictionRequest| {
            let (old, new) = (
                serde_json::to_value(old).unwrap(),
                serde_json::to_value(new).unwrap(),
            );
            if let Err(errors) = kube_cel::Validator::new().validate(&schema, &new, Some(&old)) {
                let messages: Vec<String> = errors
                    .as_slice()
                    .iter()
                    .map(|e| e.message.clone())
                    .collect();
                panic!("rejected: {messages:?}\nold: {old:#}\nnew: {new:#}");
            }
        };
        let mut r = request(&["a.example.com", "b.example.com"]);
        let step = |r: &mut EvictionRequest, status: EvictionRequestStatus| {
            let mut next = r.clone();
            next.status = Some(status);
            validate(r, &next);
            *r = next;
        };
        let (s, _) = written(decide(&r, &running(0)));
        step(&mut r, s);
        let (s, _) = written(decide(&r, &running(1800)));
        step(&mut r, s);
        let mut done = r.clone();
        done.status.as_mut().unwrap().active_interceptor_completed = true;
        r = done;
        let released = match decide(&r, &running(1801)) {
            Action::Evict { released } => released,
            other => panic!("expected an eviction, got {other:?}"),
        };
        let blocked = EvictionResult::Blocked {
            budget: Some("db-pdb".into()),
            message: "Cannot evict pod".into(),
        };
        for t in 0..3 {
            let (s, _) = after_eviction(
                &r,
                released.as_ref(),
                &blocked,
                at(1802 + t),
                Duration::from_secs(60),
            );
            step(&mut r, s.unwrap());
        }
        let (s, _) = after_eviction(
            &r,
            released.as_ref(),
            &EvictionResult::Accepted,
            at(1900),
            Duration::from_secs(60),
        );
        step(&mut r, s.unwrap());
        let gone = Inputs {
            pod: PodState::Absent,
            ..running(1901)
        };
        let (s, _) = written(decide(&r, &gone));
        step(&mut r, s);
        assert!(r.is_complete());

        // The rules do bite: an interceptor the request does not list is refused.
        let mut bogus = r.clone();
        bogus.status.as_mut().unwrap().active_interceptor_name = Some("x.example.com".into());
        let refused = kube_cel::Validator::new().validate(
            &schema,
            &serde_json::to_value(&bogus).unwrap(),
            Some(&serde_json::to_value(&r).unwrap()),
        );
        assert!(refused.is_err());

        // Cancellation: the last requester leaves, then the controller completes it.
        let mut c = request(&["a.example.com"]);
        let (s, _) = written(decide(&c, &running(0)));
        step(&mut c, s);
        let mut withdrawn = c.clone();
        withdrawn.spec.requesters.clear();
        validate(&c, &withdrawn);
        let (s, transition) = written(decide(&withdrawn, &running(1)));
        assert_eq!(transition, Transition::Completed(Completion::Cancelled));
        step(&mut withdrawn, s);
    }
}
