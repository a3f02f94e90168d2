use super::*;

use k8s_openapi::api::lifecycle::v1alpha1::{
    EvictionRequestPodReference, EvictionRequestSpec, EvictionRequestTarget,
};

const POD: &str = "web";
const UID: &str = "6f1c5a52-5d43-4b52-9a3e-0a9b8f1d2c3e";
const DB: &str = "db.example.com/operator";
const BACKUP: &str = "backup.example.com/agent";

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_795_000_000 + secs).unwrap()
}

fn target() -> TargetRef {
    TargetRef {
        name: POD.into(),
        uid: UID.into(),
    }
}

fn facts(presence: Presence, responders: &[(&str, i64)]) -> PodFacts {
    PodFacts {
        presence,
        kind: PodKind::Regular,
        in_pod_group: false,
        responders: responders
            .iter()
            .map(|(n, p)| DeclaredResponder {
                name: (*n).into(),
                priority: *p,
            })
            .collect(),
    }
}

fn running(responders: &[(&str, i64)]) -> PodFacts {
    facts(Presence::Running, responders)
}

fn request(requester: &str, intent: &str, created: i64) -> EvictionRequest {
    request_for(requester, intent, created, UID)
}

fn request_for(requester: &str, intent: &str, created: i64, uid: &str) -> EvictionRequest {
    let name = format!("req-{}", requester.replace(['/', '.'], "-"));
    EvictionRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            uid: Some(format!("uid-{name}")),
            generation: Some(1),
            creation_timestamp: Some(Time(at(created))),
            ..ObjectMeta::default()
        },
        spec: EvictionRequestSpec {
            intent: intent.into(),
            requester: requester.into(),
            target: EvictionRequestTarget {
                pod: Some(EvictionRequestPodReference {
                    name: POD.into(),
                    uid: uid.into(),
                }),
            },
        },
        status: None,
    }
}

/// The objects the controller sees, and the writes of its decisions applied to them.
#[derive(Debug, Clone, Default)]
struct World {
    requests: Vec<EvictionRequest>,
    evictions: Vec<Eviction>,
}

impl World {
    fn with(requests: Vec<EvictionRequest>) -> Self {
        World {
            requests,
            evictions: Vec::new(),
        }
    }

    fn decide(&self, pod: &PodFacts, now: Timestamp) -> Decision {
        decide(&target(), pod, &self.requests, &self.evictions, now)
    }

    fn apply(&mut self, d: &Decision, now: Timestamp) {
        if let Some(new) = &d.create {
            let name = new.metadata.name.clone();
            if !self.evictions.iter().any(|e| e.metadata.name == name) {
                let mut e = new.clone();
                e.metadata.generation = Some(1);
                e.metadata.creation_timestamp = Some(Time(now));
                self.evictions.push(e);
            }
        }
        for (name, status) in &d.eviction_statuses {
            let e = self.eviction_mut(name);
            e.status = Some(status.clone());
        }
        for (name, m) in &d.eviction_metadata {
            let e = self.eviction_mut(name);
            e.metadata.labels = Some(m.labels.clone());
            e.metadata.owner_references = Some(m.owner_references.clone());
        }
        for (name, status) in &d.request_statuses {
            let r = self
                .requests
                .iter_mut()
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .unwrap();
            r.status = Some(status.clone());
        }
    }

    /// Decides and applies until nothing is left to write (at most a few rounds).
    fn settle(&mut self, pod: &PodFacts, now: Timestamp) -> Decision {
        for _ in 0..4 {
            let d = self.decide(pod, now);
            if d.is_quiet() {
                return d;
            }
            self.apply(&d, now);
        }
        panic!("no fixed point: {:#?}", self.decide(pod, now));
    }

    fn eviction_mut(&mut self, name: &str) -> &mut Eviction {
        self.evictions
            .iter_mut()
            .find(|e| e.metadata.name.as_deref() == Some(name))
            .unwrap()
    }

    fn eviction(&self) -> &Eviction {
        self.evictions.last().unwrap()
    }

    fn states(&self) -> Vec<(String, String)> {
        states(self.eviction())
    }

    fn responder_mut(&mut self, name: &str) -> &mut ResponderStatus {
        let e = self.evictions.last_mut().unwrap();
        e.status
            .as_mut()
            .unwrap()
            .responders
            .as_mut()
            .unwrap()
            .iter_mut()
            .find(|r| r.name == name)
            .unwrap()
    }

    fn request_mut(&mut self, requester: &str) -> &mut EvictionRequest {
        self.requests
            .iter_mut()
            .find(|r| r.spec.requester == requester)
            .unwrap()
    }
}

fn states(e: &Eviction) -> Vec<(String, String)> {
    e.status
        .as_ref()
        .and_then(|s| s.target_responders.as_ref())
        .into_iter()
        .flatten()
        .map(|t| (t.name.clone(), t.state.clone()))
        .collect()
}

fn st(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

fn cond<'a>(conditions: Option<&'a Vec<Condition>>, kind: &str) -> (&'a str, &'a str) {
    let c = find(conditions, kind).unwrap_or_else(|| panic!("no {kind} in {conditions:?}"));
    (c.status.as_str(), c.reason.as_str())
}

fn eviction_cond(e: &Eviction, kind: &str) -> (String, String) {
    let (s, r) = cond(eviction_conditions(e), kind);
    (s.to_owned(), r.to_owned())
}

fn request_cond(r: &EvictionRequest, kind: &str) -> (String, String) {
    let (s, r) = cond(r.status.as_ref().and_then(|s| s.conditions.as_ref()), kind);
    (s.to_owned(), r.to_owned())
}

fn pair(s: &str, r: &str) -> (String, String) {
    (s.to_owned(), r.to_owned())
}

#[test]
fn the_first_request_creates_an_eviction_named_after_the_pod_with_its_participants_as_labels() {
    let mut w = World::with(vec![request("nodegrace.dev/worker-1", INTENT_EVICTION, 0)]);
    let pod = running(&[(DB, 10_000)]);
    let d = w.decide(&pod, at(10));
    let new = d.create.clone().expect("an Eviction to create");
    assert_eq!(new.metadata.name.as_deref(), Some("pod-1-web"));
    assert_eq!(
        new.spec.target.pod,
        Some(EvictionPodReference {
            name: POD.into(),
            uid: UID.into()
        })
    );
    let labels = new.metadata.labels.clone().unwrap();
    assert_eq!(labels["nodegrace.dev/worker-1"], "requester");
    assert_eq!(labels[DB], "responder");
    assert_eq!(labels[IMPERATIVE_EVICTOR], "responder");
    let owners = new.metadata.owner_references.clone().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].api_version, API_VERSION);
    assert_eq!(owners[0].kind, "EvictionRequest");
    let status = new.status.clone().unwrap();
    assert_eq!(
        status.requesters,
        Some(vec![Requester {
            name: "nodegrace.dev/worker-1".into(),
            intent: "Eviction".into()
        }])
    );
    assert_eq!(
        states(&new),
        st(&[(DB, ACTIVE), (IMPERATIVE_EVICTOR, INACTIVE)])
    );
    let responders = status.responders.clone().unwrap();
    assert_eq!(responders[0].start_time, Some(Time(at(10))));
    assert_eq!(responders[1].start_time, None);
    assert_eq!(
        eviction_cond(&new, FAILED),
        pair("False", AWAITING_EVICTION)
    );
    assert_eq!(
        eviction_cond(&new, TARGET_EVICTED),
        pair("False", AWAITING_EVICTION)
    );
    assert_eq!(d.wake_at, Some(at(10 + 20 * 60)));
    // The request mirrors the new Eviction at once.
    assert_eq!(d.request_statuses.len(), 1);
    w.apply(&d, at(10));
    assert_eq!(
        request_cond(&w.requests[0], FAILED),
        pair("False", AWAITING_EVICTION)
    );
    assert_eq!(
        w.requests[0].status.as_ref().unwrap().observed_generation,
        Some(1)
    );
}

#[test]
fn deciding_again_on_an_unchanged_world_writes_nothing() {
    let mut w = World::with(vec![request("nodegrace.dev/worker-1", INTENT_EVICTION, 0)]);
    let pod = running(&[(DB, 10_000), (BACKUP, 2000)]);
    let d = w.decide(&pod, at(10));
    w.apply(&d, at(10));
    let again = w.decide(&pod, at(10));
    assert!(again.is_quiet(), "{again:#?}");
    // Later, before any deadline: still nothing, and the same wake time.
    let later = w.decide(&pod, at(600));
    assert!(later.is_quiet(), "{later:#?}");
    assert_eq!(later.wake_at, Some(at(10 + 20 * 60)));
    // Applying the same decision twice changes nothing.
    let before = format!("{:?}", w.evictions);
    w.apply(&d, at(10));
    assert_eq!(before, format!("{:?}", w.evictions));
}

#[test]
fn the_highest_priority_responder_is_active_first() {
    let mut w = World::with(vec![request("nodegrace.dev/n1", INTENT_EVICTION, 0)]);
    let pod = running(&[(BACKUP, 2000), (DB, 10_000), ("z.example.org/x", 50_000)]);
    w.settle(&pod, at(0));
    assert_eq!(
        w.states(),
        st(&[
            ("z.example.org/x", ACTIVE),
            (DB, INACTIVE),
            (BACKUP, INACTIVE),
            (IMPERATIVE_EVICTOR, INACTIVE)
        ])
    );
}

#[test]
fn equal_priorities_go_by_top_level_domain_first_then_lower_labels_then_key() {
    let mut names = [
        ("b.example.org/x", 5000),
        ("a.example.org/x", 5000),
        ("z.example.com/x", 5000),
        ("a.example.com/y", 5000),
        ("a.example.com/x", 5000),
    ];
    names.sort_by(|a, b| responder_order(*a, *b));
    let order: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        order,
        [
            "a.example.com/x",
            "a.example.com/y",
            "z.example.com/x",
            "a.example.org/x",
            "b.example.org/x"
        ]
    );
}

#[test]
fn a_completed_responder_hands_over_to_the_next() {
    let mut w = World::with(vec![request("nodegrace.dev/n1", INTENT_EVICTION, 0)]);
    let pod = running(&[(DB, 10_000), (BACKUP, 2000)]);
    w.settle(&pod, at(0));
    w.responder_mut(DB).completion_time = Some(Time(at(60)));
    let d = w.settle(&pod, at(61));
    assert_eq!(
        w.states(),
        st(&[
            (DB, COMPLETED),
            (BACKUP, ACTIVE),
            (IMPERATIVE_EVICTOR, INACTIVE)
        ])
    );
    let backup = w.responder_mut(BACKUP).clone();
    assert_eq!(backup.start_time, Some(Time(at(61))));
    assert_eq!(d.wake_at, Some(at(61 + 20 * 60)));
}

#[test]
fn a_responder_silent_for_twenty_minutes_is_interrupted_and_the_next_takes_over() {
    let mut w = World::with(vec![request("nodegrace.dev/n1", INTENT_EVICTION, 0)]);
    let pod = running(&[(DB, 10_000)]);
    w.settle(&pod, at(0));
    // Active since 0 with no heartbeat: the deadline counts from startTime.
    let d = w.settle(&pod, at(20 * 60 - 1));
    assert_eq!(
        w.states(),
        st(&[(DB, ACTIVE), (IMPERATIVE_EVICTOR, INACTIVE)])
    );
    assert_eq!(d.wake_at, Some(at(20 * 60)));
    w.settle(&pod, at(20 * 60));
    assert_eq!(
        w.states(),
        st(&[(DB, INTERRUPTED), (IMPERATIVE_EVICTOR, ACTIVE)])
    );
    assert_eq!(
        w.responder_mut(IMPERATIVE_EVICTOR).start_time,
        Some(Time(at(20 * 60)))
    );
}

#[test]
fn a_responder_that_reported_before_its_turn_is_passed_over_in_the_same_write() {
    let mut w = World::with(vec![request("nodegrace.dev/n1", INTENT_EVICTION, 0)]);
    let pod = running(&[(DB, 10_000), (BACKUP, 2000)]);
    w.settle(&pod, at(0));
    // The backup agent marks itself done while the operator still works, and its stale
    // heartbeat would not count: completion wins.
    w.responder_mut(BACKUP).completion_time = Some(Time(at(5)));
    w.responder_mut(DB).completion_time = Some(Time(at(60)));
    let d = w.decide(&pod, at(61));
    assert_eq!(d.eviction_statuses.len(), 1);
    w.apply(&d, at(61));
    assert_eq!(
        w.states(),
        st(&[
            (DB, COMPLETED),
            (BACKUP, COMPLETED),
            (IMPERATIVE_EVICTOR, ACTIVE)
        ])
    );
    assert_eq!(w.responder_mut(BACKUP).start_time, Some(Time(at(61))));
    assert_eq!(
        w.responder_mut(IMPERATIVE_EVICTOR).start_time,
        Some(Time(at(61)))
    );
    assert!(w.decide(&pod, at(61)).is_quiet());
}

#[test]
fn a_heartbeat_moves_the_deadline() {
    let mut w = World::with(vec![request("nodegrace.dev/n1", INTENT_EVICTION, 0)]);
    let pod = running(&[(DB, 10_000)]);
    w.settle(&pod, at(0));
    w.responder_mut(DB).heartbeat_time = Some(Time(at(900)));
    let d = w.settle(&pod, at(20 * 60 + 10));
    assert_eq!(w.states()[0], (DB.to_owned(), ACTIVE.to_owned()));
    assert_eq!(d.wake_at, Some(at(900 + 20 * 60)));
    w.settle(&pod, at(900 + 20 * 60));
    assert_eq!(w.states()[0], (DB.to_owned(), INTERRUPTED.to_owned()));
}

#[test]
fn when_every_requester_withdraws_the_active_responder_is_canceled_and_the_eviction_fails() {
    let mut w = World::with(vec![
        request("a.example.com/one", INTENT_EVICTION, 0),
        request("b.example.com/two", INTENT_EVICTION, 1),
    ]);
    let pod = running(&[(DB, 10_000)]);
    w.settle(&pod, at(2));
    w.request_mut("a.example.com/one").spec.intent = INTENT_WITHDRAWN.into();
    w.settle(&pod, at(3));
    assert_eq!(w.states()[0].1, ACTIVE, "one requester still wants it");
    w.request_mut("b.example.com/two").spec.intent = INTENT_WITHDRAWN.into();
    let d = w.settle(&pod, at(4));
    assert_eq!(
        w.states(),
        st(&[(DB, CANCELED), (IMPERATIVE_EVICTOR, INACTIVE)])
    );
    let e = w.eviction();
    assert_eq!(
        eviction_cond(e, FAILED),
        pair("True", CANCELED_DUE_TO_NO_REQUESTERS)
    );
    assert_eq!(
        eviction_cond(e, TARGET_EVICTED),
        pair("False", EVICTION_FAILED)
    );
    assert_eq!(d.wake_at, None);
    for r in &w.requests {
        assert_eq!(
            request_cond(r, FAILED),
            pair("True", CANCELED_DUE_TO_NO_REQUESTERS)
        );
    }
    let requesters = e.status.as_ref().unwrap().requesters.clone().unwrap();
    assert!(requesters.iter().all(|r| r.intent == INTENT_WITHDRAWN));
    assert_eq!(requesters.len(), 2);
}

#[test]
fn a_request_being_deleted_counts_as_withdrawn() {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    let pod = running(&[]);
    w.settle(&pod, at(1));
    w.requests[0].metadata.deletion_timestamp = Some(Time(at(2)));
    w.settle(&pod, at(2));
    let e = w.eviction();
    assert_eq!(
        eviction_cond(e, FAILED),
        pair("True", CANCELED_DUE_TO_NO_REQUESTERS)
    );
    assert_eq!(
        e.status.as_ref().unwrap().requesters.as_ref().unwrap()[0].intent,
        INTENT_WITHDRAWN
    );
}

#[test]
fn a_new_eviction_intent_after_a_cancellation_starts_a_second_eviction_and_resets_the_request() {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    let pod = running(&[(DB, 10_000)]);
    w.settle(&pod, at(1));
    w.requests[0].spec.intent = INTENT_WITHDRAWN.into();
    w.settle(&pod, at(2));
    assert_eq!(request_cond(&w.requests[0], FAILED).0, "True");
    w.requests[0].spec.intent = INTENT_EVICTION.into();
    let d = w.decide(&pod, at(3));
    let new = d.create.clone().expect("a second Eviction");
    assert_eq!(new.metadata.name.as_deref(), Some("pod-2-web"));
    w.apply(&d, at(3));
    assert_eq!(w.evictions.len(), 2);
    assert_eq!(
        eviction_cond(&w.evictions[0], FAILED),
        pair("True", CANCELED_DUE_TO_NO_REQUESTERS),
        "a final Eviction is never changed"
    );
    assert_eq!(
        w.states(),
        st(&[(DB, ACTIVE), (IMPERATIVE_EVICTOR, INACTIVE)])
    );
    assert_eq!(
        request_cond(&w.requests[0], FAILED),
        pair("False", AWAITING_EVICTION)
    );
    assert!(w.decide(&pod, at(3)).is_quiet());
}

#[test]
fn no_further_responder_fails_the_eviction_and_a_remaining_intent_starts_the_next() {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    let pod = running(&[(DB, 10_000)]);
    w.settle(&pod, at(0));
    w.responder_mut(DB).completion_time = Some(Time(at(10)));
    w.settle(&pod, at(10));
    w.responder_mut(IMPERATIVE_EVICTOR).completion_time = Some(Time(at(20)));
    let d = w.decide(&pod, at(20));
    let (name, status) = &d.eviction_statuses[0];
    assert_eq!(name, "pod-1-web");
    let failed = find(status.conditions.as_ref(), FAILED).unwrap();
    assert_eq!(
        (failed.status.as_str(), failed.reason.as_str()),
        ("True", NO_FURTHER_RESPONDER)
    );
    // Upstream makes a new Eviction while a requester still wants the pod gone (on its next
    // pass; here in the same decision).
    assert_eq!(
        d.create.as_ref().and_then(|e| e.metadata.name.as_deref()),
        Some("pod-2-web")
    );
    w.apply(&d, at(20));
    assert_eq!(
        request_cond(&w.requests[0], FAILED),
        pair("False", AWAITING_EVICTION)
    );
    assert!(w.decide(&pod, at(20)).is_quiet());
}

#[test]
fn a_deleted_pod_is_evicted_and_its_active_responder_completed_or_interrupted() {
    for (completed, expected) in [(true, COMPLETED), (false, INTERRUPTED)] {
        let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
        w.settle(&running(&[(DB, 10_000)]), at(0));
        if completed {
            w.responder_mut(DB).completion_time = Some(Time(at(5)));
        }
        let gone = facts(Presence::Absent, &[(DB, 10_000)]);
        let d = w.settle(&gone, at(6));
        assert_eq!(
            w.states(),
            st(&[(DB, expected), (IMPERATIVE_EVICTOR, INACTIVE)])
        );
        let e = w.eviction();
        assert_eq!(eviction_cond(e, TARGET_EVICTED), pair("True", POD_DELETED));
        assert_eq!(eviction_cond(e, FAILED), pair("False", SUCCEEDED));
        assert_eq!(
            request_cond(&w.requests[0], TARGET_EVICTED),
            pair("True", POD_DELETED)
        );
        assert_eq!(d.wake_at, None);
        // Final: nothing is written any more, whatever happens.
        assert!(w.decide(&running(&[]), at(99_999)).is_quiet());
    }
}

#[test]
fn a_pod_replaced_under_the_same_name_counts_as_deleted() {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    w.settle(&running(&[]), at(0));
    let replaced = facts(
        Presence::Replaced {
            uid: "other".into(),
        },
        &[],
    );
    w.settle(&replaced, at(1));
    assert_eq!(
        eviction_cond(w.eviction(), TARGET_EVICTED),
        pair("True", POD_DELETED)
    );
}

#[test]
fn a_terminal_pod_is_evicted_after_its_responder_had_five_seconds_to_report() {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    w.settle(&running(&[(DB, 10_000)]), at(0));
    // The responder has written its entry (heartbeat) but no completion yet.
    w.responder_mut(DB).heartbeat_time = Some(Time(at(50)));
    let terminal = facts(
        Presence::Terminal {
            deletion_timestamp: Some(at(100)),
        },
        &[(DB, 10_000)],
    );
    let d = w.settle(&terminal, at(102));
    assert_eq!(d.wake_at, Some(at(105)));
    assert_eq!(
        eviction_cond(w.eviction(), TARGET_EVICTED),
        pair("False", AWAITING_EVICTION)
    );
    w.settle(&terminal, at(105));
    assert_eq!(
        eviction_cond(w.eviction(), TARGET_EVICTED),
        pair("True", POD_TERMINAL)
    );
    assert_eq!(w.states()[0].1, INTERRUPTED);
    // Without a deletion (e.g. a Job's pod that finished) nothing waits.
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    w.settle(&running(&[]), at(0));
    let done = facts(
        Presence::Terminal {
            deletion_timestamp: None,
        },
        &[],
    );
    w.settle(&done, at(1));
    assert_eq!(
        eviction_cond(w.eviction(), TARGET_EVICTED),
        pair("True", POD_TERMINAL)
    );
}

#[test]
fn a_terminating_pod_is_not_yet_evicted() {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    w.settle(&running(&[]), at(0));
    let terminating = facts(
        Presence::Terminating {
            deletion_timestamp: at(30),
            removed_at_once: false,
        },
        &[],
    );
    w.settle(&terminating, at(1));
    assert_eq!(
        eviction_cond(w.eviction(), TARGET_EVICTED),
        pair("False", AWAITING_EVICTION)
    );
    assert_eq!(w.states(), st(&[(IMPERATIVE_EVICTOR, ACTIVE)]));
}

#[test]
fn requesters_are_merged_and_never_removed_and_withdrawn_ones_go_first_beyond_a_hundred() {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    let pod = running(&[]);
    w.settle(&pod, at(1));
    // The request disappears (deleted) but its requester stays, Withdrawn; a new one joins.
    w.requests = vec![request("b.example.com/two", INTENT_EVICTION, 2)];
    w.settle(&pod, at(3));
    let names: Vec<(String, String)> = w
        .eviction()
        .status
        .as_ref()
        .unwrap()
        .requesters
        .clone()
        .unwrap()
        .into_iter()
        .map(|r| (r.name, r.intent))
        .collect();
    assert_eq!(
        names,
        st(&[
            ("b.example.com/two", INTENT_EVICTION),
            ("a.example.com/one", INTENT_WITHDRAWN)
        ])
    );

    let previous: Vec<Requester> = (0..100)
        .map(|i| Requester {
            name: format!("old{i}.example.com/x"),
            intent: INTENT_WITHDRAWN.into(),
        })
        .collect();
    let fresh = request("new.example.com/x", INTENT_EVICTION, 5);
    let merged = merge_requesters(&previous, &[&fresh]);
    assert_eq!(merged.len(), MAX_REQUESTERS);
    assert_eq!(merged[0].name, "new.example.com/x");
    assert!(!merged.iter().any(|r| r.name == "old99.example.com/x"));
}

#[test]
fn a_request_naming_another_uid_is_left_alone_and_reported() {
    let mut w = World::with(vec![
        request("a.example.com/one", INTENT_EVICTION, 0),
        request_for("b.example.com/two", INTENT_EVICTION, 0, "someone-else"),
    ]);
    let d = w.decide(&running(&[]), at(1));
    assert!(
        d.problems.iter().any(|p| p.contains("someone-else")),
        "{:?}",
        d.problems
    );
    assert!(d
        .request_statuses
        .iter()
        .all(|(n, _)| n == "req-a-example-com-one"));
    w.apply(&d, at(1));
    let requesters = w
        .eviction()
        .status
        .as_ref()
        .unwrap()
        .requesters
        .clone()
        .unwrap();
    assert_eq!(requesters.len(), 1);
}

#[test]
fn an_eviction_naming_another_pods_uid_is_never_acted_on() {
    let mut w = World::with(vec![request_for(
        "a.example.com/one",
        INTENT_EVICTION,
        0,
        "old-uid",
    )]);
    // The old pod's Eviction, Active, with a silent responder: a decision for the pod now
    // under that name must not touch it, and reports it.
    let mut d_old = decide(
        &TargetRef {
            name: POD.into(),
            uid: "old-uid".into(),
        },
        &running(&[(DB, 10_000)]),
        &w.requests,
        &[],
        at(0),
    );
    let stranger = d_old.create.take().unwrap();
    w.evictions.push(stranger.clone());
    w.requests
        .push(request("b.example.com/two", INTENT_EVICTION, 1));
    let d = w.decide(&running(&[(DB, 10_000)]), at(3600));
    assert!(d.eviction_statuses.iter().all(|(n, _)| n != "pod-1-web"));
    assert!(d.eviction_metadata.iter().all(|(n, _)| n != "pod-1-web"));
    assert!(
        d.problems.iter().any(|p| p.contains("old-uid")),
        "{:?}",
        d.problems
    );
    // Its name is taken: the new pod's Eviction is the second of that name.
    assert_eq!(
        d.create.as_ref().and_then(|e| e.metadata.name.as_deref()),
        Some("pod-2-web")
    );
    assert_eq!(
        d.create
            .as_ref()
            .unwrap()
            .spec
            .target
            .pod
            .as_ref()
            .unwrap()
            .uid,
        UID
    );
}

#[test]
fn more_than_eleven_responders_keep_the_ten_highest_and_the_evictor() {
    let declared: Vec<(String, i64)> = (0..13)
        .map(|i| (format!("r{i:02}.example.com/x"), 1000 + i))
        .collect();
    let refs: Vec<(&str, i64)> = declared.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    let d = w.decide(&running(&refs), at(0));
    assert!(
        d.problems.iter().any(|p| p.contains("never run")),
        "{:?}",
        d.problems
    );
    w.apply(&d, at(0));
    let list = w.states();
    assert_eq!(list.len(), MAX_TARGET_RESPONDERS);
    assert_eq!(list[0].0, "r12.example.com/x");
    assert_eq!(list[9].0, "r03.example.com/x");
    assert_eq!(list[10].0, IMPERATIVE_EVICTOR);
}

#[test]
fn duplicate_and_invalid_responder_names_are_dropped_and_reported() {
    let mut problems = Vec::new();
    let list = initial_target_responders(
        &[
            DeclaredResponder {
                name: DB.into(),
                priority: 10_000,
            },
            DeclaredResponder {
                name: DB.into(),
                priority: 20_000,
            },
            DeclaredResponder {
                name: "no-prefix".into(),
                priority: 5000,
            },
            DeclaredResponder {
                name: "x.example.com/y".into(),
                priority: 100_001,
            },
            DeclaredResponder {
                name: IMPERATIVE_EVICTOR.into(),
                priority: 50_000,
            },
        ],
        &mut problems,
    );
    let names: Vec<(&str, i32)> = list.iter().map(|t| (t.name.as_str(), t.priority)).collect();
    assert_eq!(
        names,
        [(DB, 10_000), (IMPERATIVE_EVICTOR, EVICTOR_PRIORITY)]
    );
    assert_eq!(problems.len(), 4, "{problems:?}");
}

#[test]
fn a_request_for_a_pod_not_found_is_refused_without_an_eviction() {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    let d = w.decide(&facts(Presence::Absent, &[]), at(0));
    assert!(d.create.is_none());
    w.apply(&d, at(0));
    assert_eq!(
        request_cond(&w.requests[0], FAILED),
        pair("True", EVICTION_INVALID)
    );
    assert_eq!(
        request_cond(&w.requests[0], TARGET_EVICTED),
        pair("False", EVICTION_FAILED)
    );
    // Refused is final for the request: the pod appearing later changes nothing.
    assert!(w.decide(&running(&[]), at(5)).is_quiet());

    let w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    let d = w.decide(&facts(Presence::Replaced { uid: "new".into() }, &[]), at(0));
    assert!(d.create.is_none());
    let c = find(d.request_statuses[0].1.conditions.as_ref(), FAILED).unwrap();
    assert!(c.message.contains("UID mismatch"), "{}", c.message);
}

#[test]
fn a_pod_of_a_pod_group_is_refused() {
    let mut pod = running(&[]);
    pod.in_pod_group = true;
    let w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    let d = w.decide(&pod, at(0));
    assert!(d.create.is_none());
    let c = find(d.request_statuses[0].1.conditions.as_ref(), FAILED).unwrap();
    assert_eq!(c.reason, EVICTION_INVALID);
}

#[test]
fn a_second_active_eviction_of_the_same_pod_is_refused() {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    let pod = running(&[]);
    w.settle(&pod, at(0));
    let mut second = w.eviction().clone();
    second.metadata.name = Some("pod-2-web".into());
    second.metadata.creation_timestamp = Some(Time(at(5)));
    w.evictions.push(second);
    let d = w.settle(&pod, at(6));
    assert!(d.is_quiet());
    assert_eq!(
        eviction_cond(&w.evictions[1], FAILED),
        pair("True", EVICTION_INVALID)
    );
    assert_eq!(
        eviction_cond(&w.evictions[0], FAILED),
        pair("False", AWAITING_EVICTION)
    );
}

#[test]
fn labels_mark_a_requester_that_also_responds() {
    let mut w = World::with(vec![request(DB, INTENT_EVICTION, 0)]);
    w.settle(&running(&[(DB, 10_000)]), at(0));
    let labels = w.eviction().metadata.labels.clone().unwrap();
    assert_eq!(labels[DB], ROLE_REQUESTER_RESPONDER);
    // A second request adds its label and owner reference to the existing Eviction.
    w.requests
        .push(request("b.example.com/two", INTENT_EVICTION, 1));
    let d = w.decide(&running(&[(DB, 10_000)]), at(1));
    assert_eq!(d.eviction_metadata.len(), 1);
    w.apply(&d, at(1));
    let e = w.eviction();
    assert_eq!(
        e.metadata.labels.as_ref().unwrap()["b.example.com/two"],
        ROLE_REQUESTER
    );
    assert_eq!(e.metadata.owner_references.as_ref().unwrap().len(), 2);
}

#[test]
fn eviction_names_count_up_per_pod_name_and_stay_within_253_characters() {
    assert_eq!(eviction_name("web", []), "pod-1-web");
    assert_eq!(
        eviction_name(
            "web",
            ["pod-1-web", "pod-7-web", "pod-9-web-2", "pod-x-web"]
        ),
        "pod-8-web"
    );
    let long = "a".repeat(253);
    let first = eviction_name(&long, []);
    assert_eq!(first, format!("pod-1-{}", "a".repeat(247)));
    let other = format!("{}b", "a".repeat(252));
    assert_eq!(
        eviction_name(&other, [first.as_str()]),
        format!("pod-2-{}", "a".repeat(247))
    );
}

// ---- the evictor ----

/// An Eviction with the evictor Active and its entry set up by the controller.
fn evictor_active(message: Option<&str>) -> Eviction {
    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    w.settle(&running(&[]), at(0));
    w.responder_mut(IMPERATIVE_EVICTOR).message = message.map(str::to_owned);
    w.eviction().clone()
}

#[test]
fn the_evictor_evicts_only_when_it_is_the_active_responder() {
    let e = evictor_active(None);
    let d = decide_evictor(
        &e,
        &target(),
        &running(&[]),
        None,
        EVICTOR_BACKOFF_CAP,
        at(1),
    );
    assert!(d.evict_now);
    assert_eq!(d.status, None);

    let mut w = World::with(vec![request("a.example.com/one", INTENT_EVICTION, 0)]);
    w.settle(&running(&[(DB, 10_000)]), at(0));
    let d = decide_evictor(
        w.eviction(),
        &target(),
        &running(&[]),
        None,
        EVICTOR_BACKOFF_CAP,
        at(1),
    );
    assert_eq!(d, EvictorDecision::idle(), "another responder is Active");

    let other = TargetRef {
        name: POD.into(),
        uid: "another-pod".into(),
    };
    let d = decide_evictor(&e, &other, &running(&[]), None, EVICTOR_BACKOFF_CAP, at(1));
    assert_eq!(d, EvictorDecision::idle(), "an Eviction of another pod UID");
    let refused = EvictionOutcome::Refused {
        error: "x".into(),
        retry_after: None,
    };
    let d = evictor_attempted(&e, &other, &refused, EVICTOR_BACKOFF_CAP, at(1));
    assert_eq!(d, EvictorDecision::idle());
}

#[test]
fn a_refused_eviction_is_retried_with_exponential_back_off_and_counted_in_the_message() {
    let e = evictor_active(None);
    let refused = EvictionOutcome::Refused {
        error: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        retry_after: None,
    };
    let d = evictor_attempted(&e, &target(), &refused, EVICTOR_BACKOFF_CAP, at(10));
    let status = d.status.clone().unwrap();
    let message = status.message.clone().unwrap();
    assert!(message.contains("(attempts=1)"), "{message}");
    assert!(message.contains("disruption budget"));
    assert_eq!(status.heartbeat_time, Some(Time(at(10))));
    assert_eq!(d.wake_at, Some(at(15)));

    // Before the back-off ends: wait; after it: try again.
    let e = evictor_active(Some(&message));
    let wait = decide_evictor(
        &e,
        &target(),
        &running(&[]),
        Some(at(10)),
        EVICTOR_BACKOFF_CAP,
        at(12),
    );
    assert!(!wait.evict_now);
    assert_eq!(wait.wake_at, Some(at(15)));
    let go = decide_evictor(
        &e,
        &target(),
        &running(&[]),
        Some(at(10)),
        EVICTOR_BACKOFF_CAP,
        at(15),
    );
    assert!(go.evict_now);
    let second = evictor_attempted(&e, &target(), &refused, EVICTOR_BACKOFF_CAP, at(15));
    assert!(second
        .status
        .unwrap()
        .message
        .unwrap()
        .contains("(attempts=2)"));
    assert_eq!(second.wake_at, Some(at(25)));

    assert_eq!(
        evictor_backoff(1, EVICTOR_BACKOFF_CAP),
        Duration::from_secs(5)
    );
    assert_eq!(
        evictor_backoff(4, EVICTOR_BACKOFF_CAP),
        Duration::from_secs(40)
    );
    assert_eq!(
        evictor_backoff(30, EVICTOR_BACKOFF_CAP),
        EVICTOR_BACKOFF_CAP
    );
    assert_eq!(
        evictor_backoff(u32::MAX, EVICTOR_BACKOFF_CAP),
        EVICTOR_BACKOFF_CAP
    );
    assert_eq!(
        evictor_backoff(30, Duration::from_secs(20)),
        Duration::from_secs(20)
    );
    // After a restart the last attempt is unknown: try at once.
    assert!(
        decide_evictor(
            &e,
            &target(),
            &running(&[]),
            None,
            EVICTOR_BACKOFF_CAP,
            at(12)
        )
        .evict_now
    );
}

#[test]
fn a_long_back_off_still_heartbeats_every_three_minutes_and_honours_retry_after() {
    let e = evictor_active(Some("x (attempts=9): refused"));
    let d = evictor_attempted(
        &e,
        &target(),
        &EvictionOutcome::Refused {
            error: "too many requests".into(),
            retry_after: Some(Duration::from_secs(3600)),
        },
        EVICTOR_BACKOFF_CAP,
        at(0),
    );
    assert_eq!(d.wake_at, Some(at(180)));
    let mut e = e;
    let entry = d.status.unwrap();
    e.status.as_mut().unwrap().responders.as_mut().unwrap()[0] = entry.clone();
    let quiet = decide_evictor(
        &e,
        &target(),
        &running(&[]),
        Some(at(0)),
        EVICTOR_BACKOFF_CAP,
        at(100),
    );
    assert_eq!(quiet.status, None);
    let beat = decide_evictor(
        &e,
        &target(),
        &running(&[]),
        Some(at(0)),
        EVICTOR_BACKOFF_CAP,
        at(179),
    );
    let beat = beat.status.expect("a heartbeat");
    assert_eq!(beat.heartbeat_time, Some(Time(at(179))));
    assert_eq!(beat.message, entry.message, "the count is kept");
    assert_eq!(recorded_attempts(entry.message.as_deref()), 10);
    assert_eq!(recorded_attempts(Some("no count")), 0);
    assert_eq!(recorded_attempts(Some("(attempts=3")), 0);
}

#[test]
fn the_evictor_completes_when_the_pod_is_gone_or_terminal_and_waits_while_it_terminates() {
    let e = evictor_active(Some("x"));
    for presence in [
        Presence::Absent,
        Presence::Replaced { uid: "u".into() },
        Presence::Terminal {
            deletion_timestamp: None,
        },
    ] {
        let d = decide_evictor(
            &e,
            &target(),
            &facts(presence, &[]),
            None,
            EVICTOR_BACKOFF_CAP,
            at(7),
        );
        let s = d.status.unwrap();
        assert_eq!(s.completion_time, Some(Time(at(7))));
        assert!(!d.evict_now);
        assert_eq!(d.wake_at, None);
    }
    let terminating = facts(
        Presence::Terminating {
            deletion_timestamp: at(37),
            removed_at_once: false,
        },
        &[],
    );
    let d = decide_evictor(
        &e,
        &target(),
        &terminating,
        None,
        EVICTOR_BACKOFF_CAP,
        at(7),
    );
    assert!(!d.evict_now);
    let s = d.status.unwrap();
    assert_eq!(s.completion_time, None);
    assert_eq!(s.expected_completion_time, Some(Time(at(37))));
    assert_eq!(d.wake_at, Some(at(7 + 180)));
    // A completed evictor does nothing more.
    let mut done = e.clone();
    done.status.as_mut().unwrap().responders.as_mut().unwrap()[0].completion_time =
        Some(Time(at(8)));
    let d = decide_evictor(
        &done,
        &target(),
        &facts(Presence::Absent, &[]),
        None,
        EVICTOR_BACKOFF_CAP,
        at(9),
    );
    assert_eq!(d, EvictorDecision::idle());
}

#[test]
fn daemonset_and_mirror_pods_are_not_evicted_by_the_evictor_which_keeps_heartbeating() {
    let e = evictor_active(None);
    for kind in [PodKind::DaemonSet, PodKind::Mirror] {
        let mut pod = running(&[]);
        pod.kind = kind;
        let d = decide_evictor(&e, &target(), &pod, None, EVICTOR_BACKOFF_CAP, at(1));
        assert!(!d.evict_now);
        let s = d.status.unwrap();
        assert_eq!(s.completion_time, None);
        assert!(s.message.unwrap().contains("not called"));
        assert_eq!(d.wake_at, Some(at(181)));
    }
}

#[test]
fn the_evictor_acts_on_the_eviction_a_decision_activates_it_on_before_it_is_written() {
    // No responder of the pod's own: the Eviction is created with the evictor Active.
    let mut w = World::with(vec![request("nodegrace.dev/n1", INTENT_EVICTION, 0)]);
    let pod = running(&[]);
    let mut d = w.decide(&pod, at(0));
    let activated = activated_eviction(&d, &w.evictions, &target()).expect("the created one");
    assert_eq!(activated.metadata.name.as_deref(), Some("pod-1-web"));
    let tried = decide_evictor(
        &activated,
        &target(),
        &pod,
        None,
        EVICTOR_BACKOFF_CAP,
        at(0),
    );
    assert!(tried.evict_now);
    let after = evictor_attempted(
        &activated,
        &target(),
        &EvictionOutcome::Evicted,
        EVICTOR_BACKOFF_CAP,
        at(0),
    );
    with_evictor_entry(&mut d, "pod-1-web", after.status.expect("an entry"));
    w.apply(&d, at(0));
    // One write carries the activation and the evictor's report.
    assert_eq!(w.states(), st(&[(IMPERATIVE_EVICTOR, ACTIVE)]));
    let entry = w.responder_mut(IMPERATIVE_EVICTOR).clone();
    assert!(entry
        .message
        .is_some_and(|m| m.contains("was evicted through the Eviction API")));
    assert_eq!(entry.start_time, Some(Time(at(0))));
    // Once written, a decision activates nothing: the evictor reports on its own then, also
    // when the decision writes the Eviction again (a second requester joins).
    let again = w.decide(&pod, at(1));
    assert_eq!(activated_eviction(&again, &w.evictions, &target()), None);
    w.requests
        .push(request("example.com/descheduler", INTENT_EVICTION, 1));
    let joined = w.decide(&pod, at(2));
    assert_eq!(joined.eviction_statuses.len(), 1, "{joined:?}");
    assert_eq!(activated_eviction(&joined, &w.evictions, &target()), None);

    // A responder completing hands over to the evictor in a status write.
    let mut w = World::with(vec![request("nodegrace.dev/n1", INTENT_EVICTION, 0)]);
    let pod = running(&[(DB, 10_000)]);
    let d = w.settle(&pod, at(0));
    assert_eq!(
        activated_eviction(&d, &w.evictions, &target()),
        None,
        "{d:?}"
    );
    w.responder_mut(DB).completion_time = Some(Time(at(30)));
    let d = w.decide(&pod, at(31));
    assert!(d.create.is_none());
    let activated = activated_eviction(&d, &w.evictions, &target()).expect("the known one");
    assert_eq!(
        states(&activated),
        st(&[(DB, COMPLETED), (IMPERATIVE_EVICTOR, ACTIVE)])
    );
    // Another pod's Eviction is never the evictor's.
    let other = TargetRef {
        name: POD.into(),
        uid: "another-uid".into(),
    };
    assert_eq!(activated_eviction(&d, &w.evictions, &other), None);
}

#[test]
fn end_to_end_a_request_is_answered_by_the_evictor_and_ends_target_evicted() {
    let mut w = World::with(vec![request("nodegrace.dev/worker-1", INTENT_EVICTION, 0)]);
    let pod = running(&[]);
    w.settle(&pod, at(0));
    let d = decide_evictor(
        w.eviction(),
        &target(),
        &pod,
        None,
        EVICTOR_BACKOFF_CAP,
        at(1),
    );
    assert!(d.evict_now);
    let d = evictor_attempted(
        w.eviction(),
        &target(),
        &EvictionOutcome::Evicted,
        EVICTOR_BACKOFF_CAP,
        at(1),
    );
    *w.responder_mut(IMPERATIVE_EVICTOR) = d.status.unwrap();
    let terminating = facts(
        Presence::Terminating {
            deletion_timestamp: at(31),
            removed_at_once: false,
        },
        &[],
    );
    assert!(w.settle(&terminating, at(2)).is_quiet());
    let gone = facts(Presence::Absent, &[]);
    let d = decide_evictor(
        w.eviction(),
        &target(),
        &gone,
        None,
        EVICTOR_BACKOFF_CAP,
        at(33),
    );
    *w.responder_mut(IMPERATIVE_EVICTOR) = d.status.unwrap();
    w.settle(&gone, at(33));
    assert_eq!(w.states(), st(&[(IMPERATIVE_EVICTOR, COMPLETED)]));
    assert_eq!(
        request_cond(&w.requests[0], TARGET_EVICTED),
        pair("True", POD_DELETED)
    );
    assert_eq!(
        request_cond(&w.requests[0], FAILED),
        pair("False", SUCCEEDED)
    );
}

// ---- properties ----

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Event {
        Request(usize),
        Withdraw(usize),
        Delete(usize),
        Wait(i64),
        /// The Active responder (0) or, late or out of turn, the (k-1)-th one writes.
        Heartbeat(usize),
        Complete(usize),
        Evictor(bool),
        Terminating,
        Terminal,
        Gone,
    }

    const REQUESTERS: [&str; 4] = [
        "a.example.com/one",
        "b.example.com/two",
        "nodegrace.dev/worker-1",
        DB,
    ];

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            3 => (0..REQUESTERS.len()).prop_map(Event::Request),
            1 => (0..REQUESTERS.len()).prop_map(Event::Withdraw),
            1 => (0..REQUESTERS.len()).prop_map(Event::Delete),
            3 => prop_oneof![Just(1i64), Just(5), Just(300), Just(1199), Just(1200), Just(3000)].prop_map(Event::Wait),
            2 => (0..6usize).prop_map(|k| Event::Heartbeat(k.saturating_sub(2))),
            2 => (0..6usize).prop_map(|k| Event::Complete(k.saturating_sub(2))),
            2 => any::<bool>().prop_map(Event::Evictor),
            1 => Just(Event::Terminating),
            1 => Just(Event::Terminal),
            1 => Just(Event::Gone),
        ]
    }

    fn responders() -> impl Strategy<Value = Vec<(String, i64)>> {
        proptest::collection::vec(
            (
                prop_oneof![
                    Just(DB),
                    Just(BACKUP),
                    Just("z.example.org/x"),
                    Just("a.example.org/y")
                ],
                prop_oneof![Just(1000i64), Just(2000), Just(10_000)],
            ),
            0..4,
        )
        .prop_map(|v| v.into_iter().map(|(n, p)| (n.to_owned(), p)).collect())
    }

    fn final_state(s: &str) -> bool {
        matches!(s, COMPLETED | INTERRUPTED | CANCELED)
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Check {
        OneActive,
        FinalStaysFinal,
        RequestersKept,
        SettlesAtOnce,
    }

    /// Runs `events`, deciding and applying after each, and checks `check` on every step.
    fn run(
        declared: &[(String, i64)],
        events: &[Event],
        check: Check,
    ) -> Result<(), TestCaseError> {
        let refs: Vec<(&str, i64)> = declared.iter().map(|(n, p)| (n.as_str(), *p)).collect();
        let mut pod = running(&refs);
        let mut w = World::default();
        let mut now = 0i64;
        let mut last_attempt: Option<Timestamp> = None;
        let mut seen_states: BTreeMap<(String, String), String> = BTreeMap::new();
        let mut seen_requesters: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (i, ev) in events.iter().enumerate() {
            match ev {
                Event::Request(k) => {
                    let who = REQUESTERS[*k];
                    match w.requests.iter_mut().find(|r| r.spec.requester == who) {
                        Some(r) => r.spec.intent = INTENT_EVICTION.into(),
                        None => w.requests.push(request(who, INTENT_EVICTION, now)),
                    }
                }
                Event::Withdraw(k) => {
                    if let Some(r) = w
                        .requests
                        .iter_mut()
                        .find(|r| r.spec.requester == REQUESTERS[*k])
                    {
                        r.spec.intent = INTENT_WITHDRAWN.into();
                    }
                }
                Event::Delete(k) => w.requests.retain(|r| r.spec.requester != REQUESTERS[*k]),
                Event::Wait(s) => now += s,
                Event::Heartbeat(k) | Event::Complete(k) => {
                    let Some(e) = w.evictions.iter_mut().find(|e| !eviction_is_final(e)) else {
                        continue;
                    };
                    let Some(status) = e.status.as_mut() else {
                        continue;
                    };
                    let list = status.target_responders.clone().unwrap_or_default();
                    let who = match k {
                        0 => list.iter().find(|t| t.state == ACTIVE),
                        k => list.get((k - 1) % list.len().max(1)),
                    };
                    let Some(active) = who.map(|t| t.name.clone()) else {
                        continue;
                    };
                    if let Some(r) = status
                        .responders
                        .iter_mut()
                        .flatten()
                        .find(|r| r.name == active)
                    {
                        if matches!(ev, Event::Complete(_)) {
                            r.completion_time.get_or_insert(Time(at(now)));
                        } else {
                            r.heartbeat_time = Some(Time(at(now)));
                        }
                    }
                }
                Event::Evictor(allowed) => {
                    let Some(idx) = w.evictions.iter().position(|e| !eviction_is_final(e)) else {
                        continue;
                    };
                    let e = w.evictions[idx].clone();
                    let mut d = decide_evictor(
                        &e,
                        &target(),
                        &pod,
                        last_attempt,
                        EVICTOR_BACKOFF_CAP,
                        at(now),
                    );
                    if d.evict_now {
                        let outcome = if *allowed {
                            EvictionOutcome::Evicted
                        } else {
                            EvictionOutcome::Refused {
                                error: "PDB".into(),
                                retry_after: None,
                            }
                        };
                        d = evictor_attempted(
                            &e,
                            &target(),
                            &outcome,
                            EVICTOR_BACKOFF_CAP,
                            at(now),
                        );
                        last_attempt = (!*allowed).then_some(at(now));
                        if *allowed {
                            pod.presence = Presence::Terminating {
                                deletion_timestamp: at(now + 30),
                                removed_at_once: false,
                            };
                        }
                    }
                    if let Some(s) = d.status {
                        let list = w.evictions[idx]
                            .status
                            .as_mut()
                            .unwrap()
                            .responders
                            .as_mut()
                            .unwrap();
                        let slot = list.iter_mut().find(|r| r.name == s.name).unwrap();
                        prop_assert!(
                            slot.start_time == s.start_time,
                            "startTime is the controller's"
                        );
                        *slot = s;
                    }
                }
                Event::Terminating => {
                    if pod.presence == Presence::Running {
                        pod.presence = Presence::Terminating {
                            deletion_timestamp: at(now + 30),
                            removed_at_once: false,
                        };
                    }
                }
                Event::Terminal => {
                    if let Presence::Terminating {
                        deletion_timestamp, ..
                    } = pod.presence
                    {
                        pod.presence = Presence::Terminal {
                            deletion_timestamp: Some(deletion_timestamp),
                        };
                    }
                }
                Event::Gone => pod.presence = Presence::Absent,
            }
            let d = w.decide(&pod, at(now));
            w.apply(&d, at(now));
            if check == Check::SettlesAtOnce {
                let again = w.decide(&pod, at(now));
                prop_assert!(
                    again.is_quiet(),
                    "step {}: deciding on the result of a decision writes something: {:#?}",
                    i,
                    again
                );
            }
            for e in &w.evictions {
                let name = e.metadata.name.clone().unwrap_or_default();
                let active = states(e).iter().filter(|(_, s)| s == ACTIVE).count();
                if check == Check::OneActive {
                    prop_assert!(active <= 1, "{} has {} Active responders", name, active);
                }
                for (responder, state) in states(e) {
                    let key = (name.clone(), responder.clone());
                    if let Some(before) = seen_states
                        .get(&key)
                        .filter(|_| check == Check::FinalStaysFinal)
                    {
                        prop_assert!(
                            !final_state(before) || before == &state,
                            "{} went from {} to {}",
                            responder,
                            before,
                            state
                        );
                        prop_assert!(
                            !(before == ACTIVE && state == INACTIVE),
                            "{} went from Active back to Inactive",
                            responder
                        );
                    }
                    seen_states.insert(key, state);
                }
                let now_names: BTreeSet<String> = e
                    .status
                    .iter()
                    .flat_map(|s| s.requesters.iter().flatten())
                    .map(|r| r.name.clone())
                    .collect();
                let before = seen_requesters.entry(name.clone()).or_default();
                prop_assert!(
                    before.is_subset(&now_names),
                    "{} lost requesters: {:?} -> {:?}",
                    name,
                    before,
                    now_names
                );
                *before = now_names;
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn at_most_one_responder_is_ever_active(
            declared in responders(),
            events in proptest::collection::vec(event(), 1..40),
        ) {
            run(&declared, &events, Check::OneActive)?;
        }

        #[test]
        fn a_responder_never_leaves_completed_interrupted_or_canceled(
            declared in responders(),
            events in proptest::collection::vec(event(), 1..40),
        ) {
            run(&declared, &events, Check::FinalStaysFinal)?;
        }

        #[test]
        fn requesters_are_never_removed(
            declared in responders(),
            events in proptest::collection::vec(event(), 1..40),
        ) {
            run(&declared, &events, Check::RequestersKept)?;
        }

        #[test]
        fn deciding_on_the_result_of_a_decision_writes_nothing(
            declared in responders(),
            events in proptest::collection::vec(event(), 1..40),
        ) {
            run(&declared, &events, Check::SettlesAtOnce)?;
        }
    }
}

#[test]
fn a_pod_is_leaving_when_gone_terminated_while_being_deleted_or_deleted_at_once() {
    let leaving = |p: Presence| p.leaving();
    assert!(leaving(Presence::Absent));
    assert!(leaving(Presence::Replaced { uid: "u2".into() }));
    assert!(leaving(Presence::Terminal {
        deletion_timestamp: Some(at(5))
    }));
    // A Job's pod that ran to completion stays: its Eviction is closed at once.
    assert!(!leaving(Presence::Terminal {
        deletion_timestamp: None
    }));
    assert!(!leaving(Presence::Terminating {
        deletion_timestamp: at(5),
        removed_at_once: false,
    }));
    // Deleted with a grace period of 0 (the kubelet's final DELETE, or a forced one).
    assert!(leaving(Presence::Terminating {
        deletion_timestamp: at(5),
        removed_at_once: true,
    }));
    assert!(!leaving(Presence::Running));
}
