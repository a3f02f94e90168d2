//! The imperative evictor ([`IMPERATIVE_EVICTOR`]): when it is the Active responder of
//! an Eviction, it calls the Eviction API with back-off and reports in its responder entry, as
//! upstream's `imperative-eviction-responder-controller` does for `imperative-eviction.k8s.io`.

use super::*;

/// What the imperative evictor does about one Eviction.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictorDecision {
    /// Call the Eviction API for the pod now (with its UID as precondition), then hand the
    /// outcome to [`evictor_attempted`].
    pub evict_now: bool,
    /// The evictor's entry of `status.responders` to write, when it changed.
    pub status: Option<ResponderStatus>,
    /// When to look again if nothing else changes first.
    pub wake_at: Option<Timestamp>,
}

impl EvictorDecision {
    pub fn idle() -> Self {
        EvictorDecision {
            evict_now: false,
            status: None,
            wake_at: None,
        }
    }
}

/// The evictor's own entry, when `eviction` is of `target`, the evictor is Active on it, the
/// controller has set its entry up and it has not completed.
fn evictor_entry<'a>(eviction: &'a Eviction, target: &TargetRef) -> Option<&'a ResponderStatus> {
    if eviction_is_final(eviction)
        || target_of(eviction) != Some((target.name.as_str(), target.uid.as_str()))
    {
        return None;
    }
    let status = eviction.status.as_ref()?;
    status
        .target_responders
        .as_ref()?
        .iter()
        .find(|t| t.name == IMPERATIVE_EVICTOR && t.state == ACTIVE)?;
    status
        .responders
        .as_ref()?
        .iter()
        .find(|r| r.name == IMPERATIVE_EVICTOR)
        .filter(|r| r.completion_time.is_none())
}

/// Failed attempts so far, as the entry's message counts them (`(attempts=N)`, upstream's
/// wording, which upstream also reads back).
pub fn recorded_attempts(message: Option<&str>) -> u32 {
    let Some(message) = message else { return 0 };
    let Some(i) = message.find("(attempts=") else {
        return 0;
    };
    let digits: String = message[i + "(attempts=".len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    match message[i + "(attempts=".len() + digits.len()..].starts_with(')') {
        true => digits.parse().unwrap_or(0),
        false => 0,
    }
}

/// The wait after the `failures`-th failed attempt: [`EVICTOR_BACKOFF_BASE`] doubled per
/// earlier failure, at most `cap`.
pub fn evictor_backoff(failures: u32, cap: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(31);
    EVICTOR_BACKOFF_BASE
        .checked_mul(1u32 << exp)
        .map_or(cap, |d| d.min(cap))
}

/// The entry to write (message, heartbeat, completion), when anything in it changes or the
/// last heartbeat is about [`EVICTOR_HEARTBEAT`] old; `None` otherwise.
fn evictor_write(
    entry: &ResponderStatus,
    message: String,
    expected_completion: Option<Timestamp>,
    completed: bool,
    now: Timestamp,
) -> Option<ResponderStatus> {
    let mut message = message;
    if message.chars().count() > 4000 {
        message = message.chars().take(4000).collect();
    }
    let heartbeat_due = entry
        .heartbeat_time
        .as_ref()
        .is_none_or(|t| elapsed(now, ts(t)) + Duration::from_secs(1) >= EVICTOR_HEARTBEAT);
    let expected = expected_completion.map(|t| Time(t.max(now)));
    let expected_changed = expected.is_some() && expected != entry.expected_completion_time;
    let changed = entry.message.as_deref() != Some(message.as_str());
    if !(heartbeat_due || expected_changed || changed || completed) {
        return None;
    }
    let mut out = entry.clone();
    out.message = Some(message);
    out.heartbeat_time = Some(Time(now));
    if expected_changed {
        out.expected_completion_time = expected;
    }
    if completed {
        out.expected_completion_time = Some(Time(now));
        out.completion_time = Some(Time(now));
    }
    Some(out)
}

/// The evictor's decision for `eviction` of the pod `target` (with `facts`; the Eviction API
/// is called with `target.uid` as precondition). An Eviction of another pod is left alone.
/// `last_attempt` is when the evictor last called the Eviction API for this pod and failed
/// (kept in memory, as upstream does: after a restart it tries at once); `backoff_cap` is
/// [`EVICTOR_BACKOFF_CAP`], or shorter during a shutdown.
pub fn decide_evictor(
    eviction: &Eviction,
    target: &TargetRef,
    facts: &PodFacts,
    last_attempt: Option<Timestamp>,
    backoff_cap: Duration,
    now: Timestamp,
) -> EvictorDecision {
    let Some(entry) = evictor_entry(eviction, target) else {
        return EvictorDecision::idle();
    };
    let pod_name = target.name.as_str();
    let heartbeat = Some(after(now, EVICTOR_HEARTBEAT));
    let report = |message: String, expected: Option<Timestamp>, completed: bool| EvictorDecision {
        evict_now: false,
        status: evictor_write(entry, message, expected, completed, now),
        wake_at: (!completed).then_some(heartbeat).flatten(),
    };
    match &facts.presence {
        Presence::Absent | Presence::Replaced { .. } => {
            report(format!("pod {pod_name:?} has been deleted"), None, true)
        }
        Presence::Terminal { .. } => report(format!("pod {pod_name:?} has terminated"), None, true),
        Presence::Terminating {
            deletion_timestamp, ..
        } => report(
            format!("pod {pod_name:?} is being deleted and terminates gracefully"),
            Some(*deletion_timestamp),
            false,
        ),
        Presence::Running if facts.kind != PodKind::Regular => {
            let what = match facts.kind {
                PodKind::DaemonSet => "a DaemonSet pod",
                _ => "a mirror pod",
            };
            report(
                format!("pod {pod_name:?} is {what}: the Eviction API is not called for it"),
                None,
                false,
            )
        }
        Presence::Running => {
            let failures = recorded_attempts(entry.message.as_deref());
            let retry_at = last_attempt.map(|t| after(t, evictor_backoff(failures, backoff_cap)));
            match retry_at {
                Some(at) if at > now => EvictorDecision {
                    evict_now: false,
                    status: evictor_write(
                        entry,
                        entry.message.clone().unwrap_or_default(),
                        None,
                        false,
                        now,
                    ),
                    wake_at: earliest(Some(at), heartbeat),
                },
                _ => EvictorDecision {
                    evict_now: true,
                    status: None,
                    wake_at: None,
                },
            }
        }
    }
}

/// What the Eviction API answered the evictor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// The pod is being deleted.
    Evicted,
    /// Refused (e.g. 429 for a PodDisruptionBudget), with the error and the server's
    /// Retry-After, if any.
    Refused {
        error: String,
        retry_after: Option<Duration>,
    },
}

/// The evictor's entry after an attempt, and when to try again. The adapter remembers `now`
/// as the last attempt when the outcome is `Refused`, and forgets it on `Evicted`.
pub fn evictor_attempted(
    eviction: &Eviction,
    target: &TargetRef,
    outcome: &EvictionOutcome,
    backoff_cap: Duration,
    now: Timestamp,
) -> EvictorDecision {
    let Some(entry) = evictor_entry(eviction, target) else {
        return EvictorDecision::idle();
    };
    let pod_name = target.name.as_str();
    let heartbeat = after(now, EVICTOR_HEARTBEAT);
    match outcome {
        EvictionOutcome::Evicted => EvictorDecision {
            evict_now: false,
            status: evictor_write(
                entry,
                format!("pod {pod_name:?} was evicted through the Eviction API and terminates gracefully"),
                None,
                false,
                now,
            ),
            wake_at: Some(heartbeat),
        },
        EvictionOutcome::Refused { error, retry_after } => {
            let failures = recorded_attempts(entry.message.as_deref()).saturating_add(1);
            let mut wait = evictor_backoff(failures, backoff_cap);
            if let Some(server) = retry_after {
                wait = wait.max(*server);
            }
            EvictorDecision {
                evict_now: false,
                status: evictor_write(
                    entry,
                    format!("evicting pod {pod_name:?} through the Eviction API failed (attempts={failures}): {error}"),
                    None,
                    false,
                    now,
                ),
                wake_at: Some(after(now, wait).min(heartbeat)),
            }
        }
    }
}

/// The Eviction of `target` that `decision` makes the evictor Active on: the one it creates,
/// or a known one, on which it was not Active yet, with the status it writes. The evictor
/// acts on it before those writes go out — a status write is bookkeeping, and an apiserver
/// struggling to store it must not hold the pod's eviction back — and its entry joins the
/// same write ([`with_evictor_entry`]). Where it was Active already it has acted on the
/// known Eviction itself.
pub fn activated_eviction(
    decision: &Decision,
    known: &[Eviction],
    target: &TargetRef,
) -> Option<Eviction> {
    let written = decision
        .eviction_statuses
        .iter()
        .filter_map(|(name, status)| {
            let old = known
                .iter()
                .find(|e| e.metadata.name.as_deref() == Some(name))?;
            if evictor_entry(old, target).is_some() {
                return None;
            }
            let mut e = old.clone();
            e.status = Some(status.clone());
            Some(e)
        });
    decision
        .create
        .clone()
        .into_iter()
        .chain(written)
        .find(|e| evictor_entry(e, target).is_some())
}

/// `decision` with the evictor's `entry` in what it writes to the Eviction `name`.
pub fn with_evictor_entry(decision: &mut Decision, name: &str, entry: ResponderStatus) {
    let status = match decision.create.as_mut() {
        Some(e) if e.metadata.name.as_deref() == Some(name) => e.status.as_mut(),
        _ => decision
            .eviction_statuses
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s),
    };
    let slot = status
        .and_then(|s| s.responders.as_mut())
        .and_then(|all| all.iter_mut().find(|r| r.name == entry.name));
    if let Some(slot) = slot {
        *slot = entry;
    }
}
