use super::*;
use crate::plan::budget::{plan_steps, split_budget, BudgetReserves};
use crate::plan::drainplan::normalize_drain_plan;
use crate::plan::targets::NodeReport;
use crate::plan::testutil::pod;
use crate::plan::PodType;
use proptest::prelude::*;

const S: fn(u64) -> Duration = Duration::from_secs;
const SHUTDOWN: &str = "shutdown-n1";

fn facts(name: &str, active: bool, ending: bool) -> MaintenanceFacts<'_> {
    MaintenanceFacts {
        name,
        active,
        ending,
        has_finalizer: active,
        completed_here: false,
    }
}

/// A node under its shutdown maintenance (default plan) and, optionally, an admin's.
#[derive(Debug)]
struct World {
    plan: Vec<DrainPlanEntry>,
    pods: Vec<NodePod>,
    tracks: HashMap<String, PodTrack>,
    step_targets: Vec<DrainTargets>,
    schedule: Vec<StepSchedule>,
    terminated: HashMap<String, String>,
    /// The shutdown maintenance was moved to Complete (or deleted) under the drain.
    ending: bool,
    admin: bool,
    planned: std::collections::HashSet<String>,
}

impl World {
    fn new(pods: Vec<PodInfo>, budget: Duration) -> World {
        let pods_planned = pods.iter().map(|p| p.uid.clone()).collect();
        let plan = normalize_drain_plan(&[]).unwrap();
        let steps = plan_steps(&plan, &pods).unwrap();
        let schedule = split_budget(
            budget,
            &steps,
            &BudgetReserves {
                daemonset: S(10),
                static_pods: S(10),
                critical: S(10),
                critical_priority: 2_000_000_000,
            },
        );
        let step_targets = (0..plan.len())
            .map(|i| DrainTargets::for_plan(&plan, i).unwrap())
            .collect();
        World {
            plan,
            pods: pods
                .into_iter()
                .map(|info| NodePod {
                    info,
                    deletion_due: None,
                    tolerant_daemonset: None,
                    created: Some(1_000),
                })
                .collect(),
            tracks: HashMap::new(),
            step_targets,
            schedule,
            terminated: HashMap::new(),
            ending: false,
            admin: false,
            planned: pods_planned,
        }
    }

    fn decide(&self, now: Duration) -> PassDecisions {
        let mut maintenances = vec![facts("admin", self.admin, false)];
        maintenances.push(facts(SHUTDOWN, !self.ending, self.ending));
        let input = |name| MaintenanceInput {
            name,
            plan: &self.plan,
            reports: vec![None::<NodeReport>],
            own: 0,
        };
        let mut draining = Vec::new();
        if self.admin {
            draining.push(input("admin"));
        }
        if !self.ending {
            draining.push(input(SHUTDOWN));
        }
        decide(&PassSnapshot {
            now,
            maintenances: &maintenances,
            draining: &draining,
            shutdown: Some(ShutdownFacts {
                name: SHUTDOWN,
                step_targets: &self.step_targets,
                schedule: &self.schedule,
                start: Duration::ZERO,
                holds: true,
                planned: &self.planned,
            }),
            previous: None,
            pods: &self.pods,
            tracks: &self.tracks,
            backoff_cap: S(900),
            backoff_cap_shutdown: S(5),
            drain_began: Some(1_000),
            daemonset_terminated: &self.terminated,
            budgets: &HashMap::new(),
            node_view: None,
        })
        .unwrap()
    }

    fn accept(&mut self, name: &str) {
        let t = self.tracks.entry(format!("uid-{name}")).or_default();
        t.asked = true;
        t.accepted = true;
    }
}

fn requested(d: &PassDecisions) -> Vec<(String, Action)> {
    d.requests
        .iter()
        .map(|r| (r.pod.name.clone(), r.action))
        .collect()
}

#[test]
fn hold_cordons_once_and_adds_missing_finalizers_of_active_maintenances() {
    let mut fresh = facts("a", true, false);
    fresh.has_finalizer = false;
    let ms = [fresh, facts("b", true, false), facts("c", false, true)];
    let bare = NodeMarks::default();
    assert_eq!(
        hold(&ms, bare, false),
        Hold {
            cordon: true,
            shutdown_marks: false,
            add_finalizers: vec!["a".into()]
        }
    );
    let cordoned = NodeMarks {
        cordoned: true,
        shutdown_marked: false,
    };
    assert!(!hold(&ms, cordoned, false).cordon);
    assert!(!hold(&ms, cordoned, false).marks());
    assert_eq!(hold(&ms[2..], bare, false), Hold::default());
}

#[test]
fn a_shutdown_holds_the_node_with_its_marks_before_any_maintenance_exists() {
    let bare = NodeMarks::default();
    let begun = hold(&[], bare, true);
    assert!(begun.cordon && begun.shutdown_marks && begun.marks());
    // What is already there is not written again: a node kubectl cordoned gets only the marks.
    let cordoned = NodeMarks {
        cordoned: true,
        shutdown_marked: false,
    };
    let h = hold(&[], cordoned, true);
    assert!(!h.cordon && h.shutdown_marks);
    let marked = NodeMarks {
        cordoned: true,
        shutdown_marked: true,
    };
    assert!(!hold(&[], marked, true).marks());
    // An administrator's maintenance cordons; it does not mark the node for a shutdown.
    let admin = [facts("a", true, false)];
    let h = hold(&admin, bare, false);
    assert!(h.cordon && !h.shutdown_marks);
    // A maintenance that is over holds nothing, a shutdown still does.
    let over = [facts("c", false, true)];
    assert!(hold(&over, bare, true).cordon);
    assert!(!hold(&over, bare, false).marks());
}

#[test]
fn a_pass_asks_the_first_band_for_its_holder_and_is_not_done() {
    let mut w = World::new(
        vec![
            pod("web", PodType::Default, 0),
            pod("ds", PodType::DaemonSet, 0),
        ],
        S(120),
    );
    w.admin = true;
    let d = w.decide(S(0));
    assert_eq!(requested(&d), [("web".to_string(), Action::Evict)]);
    // Both maintenances target the pod: it is asked for the older one.
    assert_eq!(d.requests[0].maintenance, "admin");
    assert_eq!(d.backoff_cap, S(5), "the shutdown drains: its shorter cap");
    assert!(!d.taint && d.gates.is_empty() && !d.node_empty && !d.drain_over);
    assert_eq!(d.done, Done::NotYet);
    assert_eq!(
        d.statuses,
        [
            StatusWrite {
                name: "admin".into(),
                force: false
            },
            StatusWrite {
                name: SHUTDOWN.into(),
                force: false
            }
        ]
    );
}

#[test]
fn daemonset_pods_are_deleted_after_the_taint_and_tolerate_all_ones_are_remembered() {
    let mut w = World::new(vec![pod("ds", PodType::DaemonSet, 0)], S(120));
    w.pods[0].tolerant_daemonset = Some("ds-uid".into());
    let d = w.decide(S(0));
    assert!(d.taint);
    assert_eq!(
        requested(&d),
        [("ds".to_string(), Action::Delete { grace_seconds: 30 })]
    );
    assert_eq!(d.requests[0].tolerant_daemonset.as_deref(), Some("ds-uid"));
}

#[test]
fn static_pods_are_gated_not_requested() {
    let w = World::new(vec![pod("etcd", PodType::Static, 0)], S(120));
    let d = w.decide(S(0));
    assert!(d.requests.is_empty());
    assert_eq!(d.gates.len(), 1);
}

#[test]
fn the_node_is_done_once_empty_and_written_or_when_the_shutdown_maintenance_ends() {
    let mut w = World::new(vec![pod("web", PodType::Default, 0)], S(120));
    w.accept("web");
    let d = w.decide(S(1));
    assert_eq!(d.done, Done::NotYet, "accepted but still running");
    w.pods.clear();
    let d = w.decide(S(2));
    assert!(d.node_empty);
    assert_eq!(d.done, Done::OnceWritten);
    assert!(!d.done.reached(false) && d.done.reached(true));
    assert_eq!(
        d.statuses
            .iter()
            .find(|s| s.name == SHUTDOWN)
            .map(|s| s.force),
        Some(true)
    );

    let mut w = World::new(vec![pod("web", PodType::Default, 0)], S(120));
    w.ending = true;
    let d = w.decide(S(1));
    assert_eq!(d.done, Done::Now);
    assert!(d.done.reached(false));
    assert!(d.drain_over && d.requests.is_empty());
    assert_eq!(d.complete, [SHUTDOWN]);
    assert_eq!(d.backoff_cap, S(900), "no shutdown drains: the usual cap");
}

#[test]
fn a_maintenance_this_node_completed_is_not_completed_again() {
    let mut done = facts("old", false, true);
    done.has_finalizer = false;
    done.completed_here = true;
    let mut finalized = facts("held", false, true);
    finalized.has_finalizer = true;
    finalized.completed_here = true;
    let mut unseen = facts("unseen", false, true);
    unseen.has_finalizer = false;
    let ms = [done, finalized, unseen];
    let d = decide(&PassSnapshot {
        now: S(0),
        maintenances: &ms,
        draining: &[],
        shutdown: None,
        previous: None,
        pods: &[],
        tracks: &HashMap::new(),
        backoff_cap: S(900),
        backoff_cap_shutdown: S(5),
        drain_began: None,
        daemonset_terminated: &HashMap::new(),
        budgets: &HashMap::new(),
        node_view: None,
    })
    .unwrap();
    assert_eq!(d.complete, ["held", "unseen"]);
    assert!(d.statuses.is_empty() && d.drain_over);
    assert_eq!(d.done, Done::NotYet);
}

#[test]
fn answers_update_the_track_and_say_when_to_try_again() {
    let now = S(100);
    let err = S(1);
    let mut t = PodTrack::default();
    let n = note_answer(&mut t, &Answer::Accepted, true, now, S(5), err, 0.0);
    assert!(t.asked && t.accepted && t.escalated && n.escalated && n.retry.is_none());

    let mut t = PodTrack::default();
    let by = Answer::Blocked {
        by: "pdb".into(),
        budget: None,
    };
    let n = note_answer(&mut t, &by, false, now, S(5), err, 0.0);
    assert_eq!(n.retry, Some(now + S(1)));
    assert!(n.newly_blocked && t.asked && !t.accepted);
    let n = note_answer(&mut t, &by, false, now, S(5), err, 0.0);
    assert_eq!(n.retry, Some(now + S(2)), "doubling");
    assert!(!n.newly_blocked, "told once per blocker");
    t.attempts = 10;
    let n = note_answer(&mut t, &by, false, now, S(5), err, 0.0);
    assert_eq!(n.retry, Some(now + S(5)), "capped");

    let mut t = PodTrack::default();
    let n = note_answer(&mut t, &Answer::Gone, true, now, S(5), err, 0.0);
    assert_eq!(n.retry, Some(now + err));
    assert!(t.asked && !t.accepted && t.escalated && !n.escalated);

    let mut t = PodTrack::default();
    let slow = Answer::Throttled { wait: S(2) };
    let n = note_answer(&mut t, &slow, false, now, S(5), err, 0.5);
    assert_eq!(n.retry, Some(now + S(3)));
    assert!(n.first_throttle && !t.asked && t.attempts == 0);
    let n = note_answer(&mut t, &slow, false, now, S(5), err, 0.0);
    assert!(!n.first_throttle);

    let mut t = PodTrack::default();
    let n = note_answer(
        &mut t,
        &Answer::Failed { answered: false },
        false,
        now,
        S(5),
        err,
        0.0,
    );
    assert!(!t.asked, "no answer: not asked");
    assert_eq!(n.retry, Some(now + err));
    note_answer(
        &mut t,
        &Answer::Failed { answered: true },
        false,
        now,
        S(5),
        err,
        0.0,
    );
    assert!(t.asked, "a refusal counts as asked");
}

#[test]
fn the_budget_blocking_longest_is_the_one_that_first_refused_a_pod_still_waiting() {
    let err = S(1);
    let blocked = |budget: &str| Answer::Blocked {
        by: format!("PodDisruptionBudget {budget}"),
        budget: Some(budget.into()),
    };
    let (mut a, mut b, mut c) = (
        PodTrack::default(),
        PodTrack::default(),
        PodTrack::default(),
    );
    note_answer(&mut a, &blocked("ns/web"), false, S(10), S(5), err, 0.0);
    note_answer(&mut b, &blocked("ns/db"), false, S(20), S(5), err, 0.0);
    // Refused again by the same budget: still blocked since the first refusal.
    note_answer(&mut b, &blocked("ns/db"), false, S(30), S(5), err, 0.0);
    assert_eq!(b.budget_since, Some(S(20)));
    assert_eq!(
        drain::longest_blocking([&a, &b, &c]),
        Some(("ns/web", S(10)))
    );
    // web's pod leaves: db blocks longest; a message without a budget names none.
    note_answer(&mut a, &Answer::Accepted, false, S(40), S(5), err, 0.0);
    let unnamed = Answer::Blocked {
        by: "too many requests".into(),
        budget: None,
    };
    note_answer(&mut c, &unnamed, false, S(1), S(5), err, 0.0);
    assert_eq!(a.budget_since, None);
    assert_eq!(
        drain::longest_blocking([&a, &b, &c]),
        Some(("ns/db", S(20)))
    );
    // Another budget refusing the same pod starts its own time.
    note_answer(&mut b, &blocked("ns/cache"), false, S(50), S(5), err, 0.0);
    assert_eq!(
        drain::longest_blocking([&a, &b, &c]),
        Some(("ns/cache", S(50)))
    );
    assert_eq!(drain::longest_blocking([&a, &c]), None);
}

#[test]
fn the_entry_counts_the_targeted_pods_and_names_the_blockers() {
    let plan = normalize_drain_plan(&[]).unwrap();
    let all = DrainTargets::for_plan(&plan, plan.len() - 1).unwrap();
    let first = DrainTargets::for_plan(&plan, 0).unwrap();
    let mut going = pod("going", PodType::Default, 0);
    going.terminating = true;
    let pods = vec![
        going,
        pod("asked", PodType::Default, 0),
        pod("held", PodType::Default, 0),
    ];
    let mut tracks = HashMap::new();
    tracks.insert(
        "uid-held".to_string(),
        PodTrack {
            asked: true,
            blocked_by: Some("PodDisruptionBudget ns/db".into()),
            ..PodTrack::default()
        },
    );
    let view = EntryView {
        drained: false,
        targets: &first,
    };
    let e = node_entry("m", &first, &tracks, &pods, Some(view), None, None);
    assert_eq!(e.pods_remaining, 3);
    assert_eq!(e.active_eviction_requests, 1);
    assert_eq!(e.pods_pending_eviction_request, 2);
    assert_eq!(
        e.drain_message,
        "Draining: eviction blocked for ns/held by PodDisruptionBudget ns/db"
    );
    assert_eq!(e.drain_targets, first.to_entries());

    let wide = EntryView {
        drained: false,
        targets: &all,
    };
    let e = node_entry(
        "m",
        &first,
        &HashMap::new(),
        &[],
        Some(wide),
        None,
        Some("planned again"),
    );
    assert_eq!(
        e.drain_message,
        "Waiting for another maintenance.; planned again"
    );
    let done = EntryView {
        drained: true,
        targets: &first,
    };
    let e = node_entry("m", &first, &HashMap::new(), &[], Some(done), None, None);
    assert_eq!(e.drain_message, "Drained");

    let e = node_entry("m", &first, &tracks, &pods, None, Some("bad"), None);
    assert_eq!(e.drain_message, "Invalid drainPlan, not drained: bad");
    assert_eq!((e.pods_remaining, e.pods_not_targeted), (0, 3));
    let e = node_entry("m", &first, &tracks, &pods, None, None, None);
    assert_eq!(e.drain_message, "Cordoned");
}

#[test]
fn more_than_five_blocked_pods_are_counted_not_listed() {
    let plan = normalize_drain_plan(&[]).unwrap();
    let first = DrainTargets::for_plan(&plan, 0).unwrap();
    let pods: Vec<PodInfo> = (0..7)
        .map(|i| pod(&format!("p{i}"), PodType::Default, 0))
        .collect();
    let tracks: HashMap<String, PodTrack> = pods
        .iter()
        .map(|p| {
            let t = PodTrack {
                blocked_by: Some("b".into()),
                ..PodTrack::default()
            };
            (p.uid.clone(), t)
        })
        .collect();
    let view = EntryView {
        drained: false,
        targets: &first,
    };
    let e = node_entry("m", &first, &tracks, &pods, Some(view), None, None);
    assert!(
        e.drain_message.ends_with("ns/p4 by b; and 2 more"),
        "{}",
        e.drain_message
    );
}

fn arb_pod(i: usize) -> impl Strategy<Value = (PodInfo, u8)> {
    (
        prop_oneof![
            3 => Just(PodType::Default),
            1 => Just(PodType::DaemonSet),
            1 => Just(PodType::Static)
        ],
        prop_oneof![Just(0), Just(1000), Just(2_000_000_000)],
        any::<bool>(),
        0u8..4,
    )
        .prop_map(move |(t, prio, terminating, track)| {
            let mut p = pod(&format!("p{i}"), t, prio);
            p.terminating = terminating;
            (p, track)
        })
}

fn arb_world() -> impl Strategy<Value = (World, Duration)> {
    (0usize..7)
        .prop_flat_map(|n| {
            let pods: Vec<_> = (0..n).map(arb_pod).collect();
            (pods, 30u64..600, 0u64..700, any::<bool>(), any::<bool>())
        })
        .prop_map(|(pods, budget, now, admin, ending)| {
            let infos: Vec<PodInfo> = pods.iter().map(|(p, _)| p.clone()).collect();
            let mut w = World::new(infos, S(budget));
            w.admin = admin;
            w.ending = ending;
            for (p, track) in &pods {
                // 0: never asked; 1: asked, blocked; 2: accepted; 3: accepted, escalated.
                if *track > 0 {
                    let t = w.tracks.entry(p.uid.clone()).or_default();
                    t.asked = true;
                    t.accepted = *track >= 2;
                    t.escalated = *track == 3;
                    t.blocked_by = (*track == 1).then(|| "pdb".into());
                }
            }
            (w, S(now))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// An accepted pod is never escalated while its step's escalation time (what the later
    /// bands' reserves leave it) has not come; a pod is escalated at most once, and only
    /// one that was asked or is terminating.
    #[test]
    fn escalations_wait_for_their_step_and_need_a_held_pod((w, now) in arb_world()) {
        let d = w.decide(now);
        for r in &d.requests {
            if let Action::Escalate { .. } = r.action {
                let track = w.tracks.get(&r.pod.uid).cloned().unwrap_or_default();
                prop_assert!(track.asked || r.pod.terminating);
                prop_assert!(!track.escalated);
                let index = w.step_targets.iter().position(|t| t.targets(&r.pod)).unwrap();
                let step = w.schedule.iter().find(|s| s.index == index).unwrap();
                prop_assert!(now >= step.escalate_at, "{} escalated at {now:?} before {:?}", r.pod.name, step.escalate_at);
            }
        }
    }

    /// Done iff no pod the shutdown targets is left (or its maintenance ended); the
    /// shutdown's status is forced out exactly then.
    #[test]
    fn done_iff_no_pod_left((w, now) in arb_world()) {
        let d = w.decide(now);
        let left = w
            .pods
            .iter()
            .any(|p| p.info.is_active() && w.step_targets.last().unwrap().targets(&p.info));
        let expected = if w.ending {
            Done::Now
        } else if left {
            Done::NotYet
        } else {
            Done::OnceWritten
        };
        prop_assert_eq!(d.done, expected);
        prop_assert_eq!(d.node_empty, !w.ending && !left);
        let forced: Vec<&str> = d.statuses.iter().filter(|s| s.force).map(|s| s.name.as_str()).collect();
        prop_assert_eq!(forced, if d.node_empty { vec![SHUTDOWN] } else { vec![] });
    }

    /// Every request is for a pod its maintenance targets, in a maintenance that drains;
    /// static pods are gated, never requested; an accepted pod is asked again only as an
    /// escalation.
    #[test]
    fn requests_are_for_targeted_pods_of_draining_maintenances((w, now) in arb_world()) {
        let d = w.decide(now);
        let draining: Vec<&str> = [("admin", w.admin), (SHUTDOWN, !w.ending)]
            .iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect();
        for r in &d.requests {
            prop_assert!(draining.contains(&r.maintenance.as_str()));
            prop_assert!(r.pod.pod_type != PodType::Static);
            let accepted = w.tracks.get(&r.pod.uid).is_some_and(|t| t.accepted);
            let escalation = matches!(r.action, Action::Escalate { .. });
            prop_assert!(!accepted || escalation);
        }
        prop_assert!(d.gates.iter().all(|p| p.pod_type == PodType::Static));
        prop_assert_eq!(d.drain_over, draining.is_empty());
    }
}

#[test]
fn backoff_doubles_to_the_cap() {
    let cap = Duration::from_secs(15 * 60);
    assert_eq!(backoff(0, cap), Duration::from_secs(1));
    assert_eq!(backoff(3, cap), Duration::from_secs(8));
    assert_eq!(backoff(20, cap), cap);
    assert_eq!(backoff(u32::MAX, cap), cap);
    assert_eq!(backoff(5, Duration::from_secs(5)), Duration::from_secs(5));
}
