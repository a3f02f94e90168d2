//! The eviction-request controller's decision for one target pod (upstream's
//! `evictionrequest-controller` sync of a pod's requests and Evictions).

use super::*;

const POD_GROUP_MESSAGE: &str =
    "Target pod references a SchedulingGroup. Eviction is currently not supported.";

/// The controller's decision for the pod `target` names.
///
/// `requests` are the EvictionRequests naming the pod (by name; those naming another UID are
/// left alone and reported). `evictions` are the namespace's Evictions of that pod name (any
/// UID: they decide the next name; only those of `target.uid` are acted on). `pod` says what
/// is known of the pod with `target.uid`.
pub fn decide(
    target: &TargetRef,
    pod: &PodFacts,
    requests: &[EvictionRequest],
    evictions: &[Eviction],
    now: Timestamp,
) -> Decision {
    let mut d = Decision::default();
    let (ours, mine) = of_the_target(target, requests, evictions, &mut d.problems);

    let relevant_active = relevant_eviction(&mine).0.filter(|e| !eviction_is_final(e));

    let updated = carry_on(&mine, relevant_active, pod, &ours, now, &mut d);
    // The Evictions as this decision leaves them: one failing now is replaced in this pass.
    let after: Vec<&Eviction> = mine
        .iter()
        .map(|e| {
            updated
                .iter()
                .find(|u| u.metadata.name == e.metadata.name)
                .unwrap_or(e)
        })
        .collect();
    let (relevant, may_create) = relevant_eviction(&after);
    let mut relevant_status: Option<EvictionStatus> = relevant.and_then(|e| e.status.clone());

    // Requests: refused while no Eviction exists for a pod not found (or always for a pod
    // of a PodGroup); the others mirror the relevant Eviction.
    let invalid = match (&pod.presence, mine.is_empty()) {
        _ if pod.in_pod_group => Some(POD_GROUP_MESSAGE.to_owned()),
        (Presence::Absent, true) => Some("Target pod not found.".to_owned()),
        (Presence::Replaced { uid }, true) => Some(format!(
            "Target pod UID mismatch: expected {}, got {uid}.",
            target.uid
        )),
        _ => None,
    };
    // Only a request still being processed makes an Eviction (upstream creates them while
    // syncing a request, and stops syncing refused or evicted ones).
    let wanted = ours
        .iter()
        .any(|r| wants_eviction(r) && !request_is_final(r));
    if invalid.is_none() && may_create && wanted {
        let mut new = Eviction {
            metadata: ObjectMeta {
                name: Some(eviction_name(
                    &target.name,
                    evictions.iter().map(|e| name_of(&e.metadata)),
                )),
                owner_references: Some(desired_owners(&[], &ours)),
                ..ObjectMeta::default()
            },
            spec: EvictionSpec {
                target: EvictionTarget {
                    pod: Some(EvictionPodReference {
                        name: target.name.clone(),
                        uid: target.uid.clone(),
                    }),
                },
            },
            status: None,
        };
        let (status, wake) = eviction_status(&new, pod, &ours, now, &mut d.problems);
        d.wake_at = earliest(d.wake_at, wake);
        let responders = status.target_responders.as_deref().unwrap_or_default();
        new.metadata.labels = Some(desired_labels(None, &ours, responders));
        new.status = Some(status.clone());
        relevant_status = Some(status);
        d.create = Some(new);
    }
    d.request_statuses = request_statuses(&ours, invalid.as_deref(), relevant_status.as_ref(), now);
    d
}

/// The requests and Evictions of `target` (its name and UID); those of its name with another
/// UID are left alone and reported in `problems`.
fn of_the_target<'a>(
    target: &TargetRef,
    requests: &'a [EvictionRequest],
    evictions: &'a [Eviction],
    problems: &mut Vec<String>,
) -> (Vec<&'a EvictionRequest>, Vec<&'a Eviction>) {
    let mut ours = Vec::new();
    for r in requests {
        match request_target(r) {
            Some((name, uid)) if name == target.name && uid == target.uid => ours.push(r),
            Some((name, uid)) if name == target.name => problems.push(format!(
                "EvictionRequest {} names pod {name} with UID {uid}, not {}: left alone",
                name_of(&r.metadata),
                target.uid
            )),
            _ => {}
        }
    }
    let mut mine = Vec::new();
    for e in evictions {
        match target_of(e) {
            Some((name, uid)) if name == target.name && uid == target.uid => mine.push(e),
            Some((name, uid)) if name == target.name && !eviction_is_final(e) => {
                problems.push(format!(
                    "Eviction {} targets pod UID {uid}, not {}: not acted on",
                    name_of(&e.metadata),
                    target.uid
                ));
            }
            _ => {}
        }
    }
    (ours, mine)
}

/// The open Evictions of the target as this decision carries them on (a second active one
/// refused); their status and metadata writes go into `d`. Returns those whose status changed.
fn carry_on(
    mine: &[&Eviction],
    relevant_active: Option<&Eviction>,
    pod: &PodFacts,
    ours: &[&EvictionRequest],
    now: Timestamp,
    d: &mut Decision,
) -> Vec<Eviction> {
    let mut updated: Vec<Eviction> = Vec::new();
    for e in mine {
        if eviction_is_final(e) {
            continue;
        }
        let name = name_of(&e.metadata).to_owned();
        let existing = eviction_conditions(e);
        let refuse = |message: &str| EvictionStatus {
            conditions: Some(with_conditions(
                existing,
                invalid_pair(existing, message, now),
            )),
            observed_generation: Some(e.metadata.generation.unwrap_or(1)),
            ..e.status.clone().unwrap_or_default()
        };
        let status = if relevant_active.is_some_and(|r| !std::ptr::eq(r, *e)) {
            refuse("Active Eviction already exists for the same target.")
        } else if pod.in_pod_group {
            refuse(POD_GROUP_MESSAGE)
        } else {
            let (status, wake) = eviction_status(e, pod, ours, now, &mut d.problems);
            d.wake_at = earliest(d.wake_at, wake);
            let metadata = EvictionMetadata {
                labels: desired_labels(
                    e.metadata.labels.as_ref(),
                    ours,
                    status.target_responders.as_deref().unwrap_or_default(),
                ),
                owner_references: desired_owners(
                    e.metadata.owner_references.as_deref().unwrap_or_default(),
                    ours,
                ),
            };
            if e.metadata.labels.clone().unwrap_or_default() != metadata.labels
                || e.metadata.owner_references.clone().unwrap_or_default()
                    != metadata.owner_references
            {
                d.eviction_metadata.push((name.clone(), metadata));
            }
            status
        };
        if e.status.as_ref() != Some(&status) {
            d.eviction_statuses.push((name, status.clone()));
            updated.push(Eviction {
                status: Some(status),
                ..(*e).clone()
            });
        }
    }
    updated
}

/// The statuses of the target's requests still being processed, where they change: refused
/// (`invalid`), or mirroring the relevant Eviction's conditions.
fn request_statuses(
    ours: &[&EvictionRequest],
    invalid: Option<&str>,
    relevant_status: Option<&EvictionStatus>,
    now: Timestamp,
) -> Vec<(String, EvictionRequestStatus)> {
    let mut out = Vec::new();
    for r in ours {
        if request_is_final(r) {
            continue;
        }
        let existing = r.status.as_ref().and_then(|s| s.conditions.as_ref());
        let pair = match invalid {
            Some(message) => invalid_pair(existing, message, now),
            None => {
                let from = relevant_status.and_then(|s| s.conditions.as_ref());
                [FAILED, TARGET_EVICTED].map(|kind| match find(from, kind) {
                    Some(c) => condition(existing, kind, &c.status, &c.reason, &c.message, now),
                    None => condition(
                        existing,
                        kind,
                        "False",
                        AWAITING_EVICTION,
                        "waiting for an Eviction to report on progress",
                        now,
                    ),
                })
            }
        };
        let status = request_status(r, pair);
        if r.status.as_ref() != Some(&status) {
            out.push((name_of(&r.metadata).to_owned(), status));
        }
    }
    out
}
