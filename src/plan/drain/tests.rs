use super::*;
use crate::plan::bandend::OnNode;
use crate::plan::budget::{plan_steps, split_budget, BudgetReserves};
use crate::plan::drainplan::normalize_drain_plan;
use crate::plan::targets::NodeReport;
use crate::plan::testutil::pod;
use proptest::prelude::*;

const S: fn(u64) -> Duration = Duration::from_secs;

fn node_pod(info: PodInfo) -> NodePod {
    NodePod {
        info,
        deletion_due: None,
        tolerant_daemonset: None,
        created: Some(1_000),
    }
}

struct World {
    plan: Vec<crate::plan::DrainPlanEntry>,
    pods: Vec<NodePod>,
    tracks: HashMap<String, PodTrack>,
    step_targets: Vec<DrainTargets>,
    schedule: Vec<StepSchedule>,
    terminated: HashMap<String, String>,
    /// What the engine passes as [`Deadlines::holds`].
    holds: bool,
    budgets: HashMap<String, BudgetStatus>,
    view: Option<NodeView>,
    /// The pods the schedule was split over.
    planned: HashSet<String>,
}

const RESERVES: BudgetReserves = BudgetReserves {
    daemonset: Duration::from_secs(10),
    static_pods: Duration::from_secs(10),
    critical: Duration::from_secs(10),
    critical_priority: 2_000_000_000,
};

impl World {
    fn new(pods: Vec<PodInfo>, budget: Duration) -> World {
        World::with_reserves(pods, budget, &RESERVES)
    }

    fn with_reserves(pods: Vec<PodInfo>, budget: Duration, reserves: &BudgetReserves) -> World {
        let plan = normalize_drain_plan(&[]).unwrap();
        let steps = plan_steps(&plan, &pods).unwrap();
        let schedule = split_budget(budget, &steps, reserves);
        let step_targets = (0..plan.len())
            .map(|i| DrainTargets::for_plan(&plan, i).unwrap())
            .collect();
        let planned = pods.iter().map(|p| p.uid.clone()).collect();
        World {
            planned,
            plan,
            pods: pods.into_iter().map(node_pod).collect(),
            tracks: HashMap::new(),
            step_targets,
            schedule,
            terminated: HashMap::new(),
            holds: true,
            budgets: HashMap::new(),
            view: None,
        }
    }

    fn decide(&self, now: Duration, shutdown: bool) -> Decision {
        let inputs = [MaintenanceInput {
            name: "m",
            plan: &self.plan,
            reports: vec![None::<NodeReport>],
            own: 0,
        }];
        decide(&Snapshot {
            now,
            maintenances: &inputs,
            previous: None,
            pods: &self.pods,
            tracks: &self.tracks,
            deadlines: shutdown.then_some(Deadlines {
                step_targets: &self.step_targets,
                schedule: &self.schedule,
                start: Duration::ZERO,
                holds: self.holds,
                planned: &self.planned,
            }),
            backoff_cap: S(5),
            drain_began: Some(1_000),
            daemonset_terminated: &self.terminated,
            budgets: &self.budgets,
            node_view: self.view.as_ref(),
        })
        .unwrap()
    }
}

fn names(d: &Decision) -> Vec<(String, Action)> {
    d.actions
        .iter()
        .map(|(p, a)| (p.name.clone(), *a))
        .collect()
}

#[test]
fn a_band_is_asked_at_once_in_priority_order() {
    let w = World::new(
        vec![
            pod("b", PodType::Default, 100),
            pod("a", PodType::Default, 0),
            pod("c", PodType::Default, 5),
            pod("crit", PodType::Default, 2_000_000_000),
        ],
        S(100),
    );
    assert_eq!(
        names(&w.decide(S(0), true)),
        [
            ("a".into(), Action::Evict),
            ("c".into(), Action::Evict),
            ("b".into(), Action::Evict)
        ]
    );
}

/// Issue 33: a clock step (or the apiserver's skew) while the apiserver was away makes a
/// pod that is going in time read an hour late by its `deletionTimestamp`; it is not
/// escalated, its grace not cut.
#[test]
fn a_pod_going_in_time_is_not_escalated_whatever_the_clocks_say() {
    let mut w = World::new(vec![pod("web", PodType::Default, 0)], S(100));
    let (escalate_at, end) = (w.schedule[0].escalate_at, w.schedule[0].end);
    w.tracks.insert(
        "uid-web".into(),
        PodTrack {
            asked: true,
            accepted: true,
            ..PodTrack::default()
        },
    );
    w.pods[0].info.terminating = true;
    // Seen terminating at 60 s with 30 s of grace: due by 90 s, before its step ends.
    assert!(
        S(90) <= end && escalate_at < S(90),
        "{escalate_at:?} {end:?}"
    );
    let hour = S(3600);
    for by_timestamp in [S(90), S(90) + hour, S(61)] {
        w.pods[0].deletion_due = deletion_due(Some(by_timestamp), S(60), Some(S(30)));
        assert!(
            names(&w.decide(escalate_at, true)).is_empty(),
            "escalated with its deletionTimestamp read as due at {by_timestamp:?}"
        );
    }
    // What the node's wall clock alone says, an hour behind: the grace would be cut.
    w.pods[0].deletion_due = Some(S(90) + hour);
    assert!(!names(&w.decide(escalate_at, true)).is_empty());
}

#[test]
fn a_deletion_is_due_no_later_than_seen_plus_its_grace() {
    assert_eq!(deletion_due(Some(S(40)), S(5), Some(S(30))), Some(S(35)));
    assert_eq!(deletion_due(Some(S(20)), S(5), Some(S(30))), Some(S(20)));
    assert_eq!(deletion_due(None, S(5), Some(S(30))), Some(S(35)));
    assert_eq!(deletion_due(Some(S(40)), S(5), None), Some(S(40)));
    assert_eq!(deletion_due(None, S(5), None), None);
}

#[test]
fn only_a_pod_something_holds_is_escalated() {
    let mut w = World::new(
        vec![
            pod("blocked", PodType::Default, 0),
            pod("never-asked", PodType::Default, 0),
            pod("accepted", PodType::Default, 0),
        ],
        S(100),
    );
    w.tracks.insert(
        "uid-blocked".into(),
        PodTrack {
            asked: true,
            attempts: 3,
            // Its next try would come after its escalation time.
            last_try: Some((S(68), S(5))),
            blocked_by: Some("ns/pdb".into()),
            ..PodTrack::default()
        },
    );
    w.tracks.insert(
        "uid-accepted".into(),
        PodTrack {
            asked: true,
            accepted: true,
            ..PodTrack::default()
        },
    );
    let escalate_at = w.schedule[0].escalate_at;
    let before = w.decide(escalate_at - Duration::from_millis(1), true);
    assert_eq!(names(&before), [("never-asked".into(), Action::Evict)]);
    assert_eq!(before.wake_at, Some(escalate_at));
    let at = w.decide(escalate_at, true);
    let grace = (w.schedule[0].end - escalate_at).as_secs() as i64;
    assert_eq!(
        names(&at),
        [
            (
                "blocked".into(),
                Action::Escalate {
                    grace_seconds: grace
                }
            ),
            ("never-asked".into(), Action::Evict),
            (
                "accepted".into(),
                Action::Escalate {
                    grace_seconds: grace
                }
            ),
        ]
    );
    // Without a shutdown nothing is ever escalated.
    assert_eq!(
        names(&w.decide(escalate_at, false)),
        [("never-asked".into(), Action::Evict)]
    );
}

/// What one shutdown with an outage came to ([`shutdown_with_outage`]).
#[derive(Debug, Default)]
struct OutageRun {
    /// (when, pod) of each escalation decided.
    escalations: Vec<(Duration, String)>,
    evictions: HashMap<String, u32>,
    /// When the last pod was seen gone.
    emptied: Option<Duration>,
}

/// A shutdown of `pods` (budget 20 s, critical reserve 2 s, so the regular band's
/// cooperative drain ends at 9 s as planned at the start) with the apiserver away for
/// `[outage.0, outage.0 + outage.1)`. A pass decides every 100 ms. A request reaches the
/// apiserver only while it answers; an evicted pod's containers exit `exit` later, and the
/// API shows it gone once the apiserver answers. When the outage ends the budget is split
/// again over the pods left and the reachability says from when that schedule holds, as
/// the engine does (`cluster/engine/reach.rs`). Each escalation decided is checked against
/// the schedule in force: due by it, and decided while that schedule held.
fn shutdown_with_outage(
    pods: Vec<PodInfo>,
    outage: (Duration, Duration),
    exit: Duration,
) -> OutageRun {
    use crate::plan::budget::split_remaining;
    use crate::plan::reachability::{worth_acting_on, Change, Reachability};
    let budget = S(20);
    let reserves = BudgetReserves {
        critical: S(2),
        ..RESERVES
    };
    let mut w = World::with_reserves(pods, budget, &reserves);
    let (mut reach, mut planned_at) = (Reachability::default(), Duration::ZERO);
    let mut exits: HashMap<String, Duration> = HashMap::new();
    let mut run = OutageRun::default();
    let tick = Duration::from_millis(100);
    let mut now = Duration::ZERO;
    while now <= budget {
        let answers = now < outage.0 || now >= outage.0 + outage.1;
        if answers {
            w.pods
                .retain(|p| exits.get(&p.info.uid).is_none_or(|at| *at > now));
            if let Change::CameBack { lost, .. } = reach.answered(now) {
                if worth_acting_on(lost) {
                    let infos: Vec<PodInfo> = w.pods.iter().map(|p| p.info.clone()).collect();
                    let steps = plan_steps(&w.plan, &infos).unwrap();
                    w.schedule = split_remaining(budget, now, &steps, &reserves);
                    planned_at = now;
                }
            }
        } else {
            reach.failed(now, "connection refused".into());
        }
        if w.pods.is_empty() {
            run.emptied.get_or_insert(now);
        }
        w.holds = reach.schedule_holds(planned_at);
        let d = w.decide(now, true);
        for (pod, action) in d.actions {
            if let Action::Escalate { .. } = action {
                let index = w.step_targets.iter().position(|t| t.targets(&pod)).unwrap();
                let step = w.schedule.iter().find(|s| s.index == index).unwrap();
                assert!(
                    now >= step.escalate_at,
                    "{} escalated at {now:?}, before {:?}",
                    pod.name,
                    step.escalate_at
                );
                assert!(
                    answers && planned_at >= outage.0 + outage.1 || now < outage.0,
                    "{} escalated at {now:?} from a schedule the outage {outage:?} moved",
                    pod.name
                );
                run.escalations.push((now, pod.name.clone()));
            }
            if !answers {
                continue;
            }
            let track = w.tracks.entry(pod.uid.clone()).or_default();
            track.asked = true;
            track.accepted = true;
            track.escalated |= matches!(action, Action::Escalate { .. });
            if action == Action::Evict {
                *run.evictions.entry(pod.name.clone()).or_default() += 1;
            }
            let gone = exits.entry(pod.uid.clone()).or_insert(now + exit);
            if let Action::Escalate { grace_seconds } = action {
                *gone = (*gone).min(now + S(grace_seconds as u64));
            }
            if let Some(p) = w.pods.iter_mut().find(|p| p.info.uid == pod.uid) {
                p.info.terminating = true;
                p.deletion_due = Some(now + S(pod.termination_grace_period_seconds as u64));
            }
        }
        now += tick;
    }
    run
}

fn band_pods() -> Vec<PodInfo> {
    vec![
        pod("web-1", PodType::Default, 0),
        pod("web-2", PodType::Default, 0),
        pod("web-3", PodType::Default, 0),
        pod("crit", PodType::Default, 2_000_000_000),
    ]
}

/// Issue 33: the apiserver away for 9.8 s (less than the fallback's 10 s) from a moment of
/// the first band: before its evictions, just after they were accepted, while its pods
/// terminate, after they went. Planned at the start, the band's cooperative drain ends at
/// 9 s, inside the outage; planned again when the apiserver answers, every pod (3 s to
/// exit) has time, so none is escalated, each is evicted once and the node empties.
#[test]
fn an_outage_at_any_moment_of_a_band_escalates_nothing_that_has_time() {
    let ms = Duration::from_millis;
    for start in [ms(0), ms(100), ms(200), ms(1500), ms(3500)] {
        let run = shutdown_with_outage(band_pods(), (start, ms(9800)), S(3));
        assert!(
            run.escalations.is_empty(),
            "outage from {start:?}: {:?}",
            run.escalations
        );
        assert!(
            run.evictions.values().all(|n| *n == 1) && run.evictions.len() == 4,
            "outage from {start:?}: {:?}",
            run.evictions
        );
        assert!(run.emptied.is_some(), "outage from {start:?}: pods left");
    }
}

/// The rule itself: a schedule that does not hold (the apiserver away, or back but not
/// planned again yet) has no deadline acted on; the same pass on a schedule that holds
/// escalates the band whose time is up.
#[test]
fn no_deadline_of_a_schedule_that_does_not_hold_is_acted_on() {
    let reserves = BudgetReserves {
        critical: S(2),
        ..RESERVES
    };
    let mut w = World::with_reserves(band_pods(), S(20), &reserves);
    for p in w
        .pods
        .iter_mut()
        .filter(|p| p.info.name.starts_with("web-"))
    {
        p.info.terminating = true;
        p.deletion_due = Some(S(30));
        w.tracks.insert(
            p.info.uid.clone(),
            PodTrack {
                asked: true,
                accepted: true,
                ..PodTrack::default()
            },
        );
    }
    let at = Duration::from_millis(9500);
    w.holds = false;
    let away = w.decide(at, true);
    assert!(away.actions.is_empty(), "{:?}", names(&away));
    assert_eq!(away.wake_at, None);
    w.holds = true;
    let escalated = w
        .decide(at, true)
        .actions
        .iter()
        .filter(|(_, a)| matches!(a, Action::Escalate { .. }))
        .count();
    assert_eq!(escalated, 3);
}

/// Issue 28: pods a budget refused are asked again when its watch shows it allows a
/// disruption, as many as it allows, in plan order; never on a status seen before the
/// refusal or one the disruption controller computed for an older spec.
#[test]
fn a_budget_that_opens_lets_as_many_refused_pods_be_asked_as_it_allows() {
    let mut w = World::new(
        vec![
            pod("api-1", PodType::Default, 0),
            pod("api-2", PodType::Default, 0),
            pod("api-3", PodType::Default, 0),
        ],
        S(100),
    );
    for name in ["api-1", "api-2", "api-3"] {
        w.tracks.insert(
            format!("uid-{name}"),
            PodTrack {
                asked: true,
                attempts: 1,
                last_try: Some((S(10), S(5))),
                blocked_by: Some("PodDisruptionBudget ns/api".into()),
                budget: Some("ns/api".into()),
                ..PodTrack::default()
            },
        );
    }
    let at = S(11);
    let asked = |w: &World| {
        w.decide(at, true)
            .actions
            .iter()
            .map(|(p, _)| p.name.clone())
            .collect::<Vec<_>>()
    };
    // No status yet: the back-off (until 15 s) holds them.
    assert!(asked(&w).is_empty());
    let status = |allowed, current, seen_at| BudgetStatus {
        allowed,
        current,
        seen_at,
    };
    // Seen before the refusals, or not yet computed for its spec: not believed.
    w.budgets.insert("ns/api".into(), status(1, true, S(9)));
    assert!(asked(&w).is_empty());
    w.budgets
        .insert("ns/api".into(), status(1, false, S(10) + S(1) / 2));
    assert!(asked(&w).is_empty());
    // Allows one: the first in plan order.
    w.budgets
        .insert("ns/api".into(), status(1, true, S(10) + S(1) / 2));
    assert_eq!(asked(&w), ["api-1"]);
    w.budgets
        .insert("ns/api".into(), status(2, true, S(10) + S(1) / 2));
    assert_eq!(asked(&w), ["api-1", "api-2"]);
    // Another budget's status opens nothing here.
    w.budgets.clear();
    w.budgets.insert("ns/other".into(), status(5, true, S(11)));
    assert!(asked(&w).is_empty());
    // The back-off still ends by itself.
    assert_eq!(w.decide(S(15), true).actions.len(), 3);
}

#[test]
fn daemonset_pods_are_deleted_and_static_pods_gated_in_their_bands() {
    let w = World::new(
        vec![
            pod("ds", PodType::DaemonSet, 0),
            pod("etcd", PodType::Static, 2_000_001_000),
        ],
        S(100),
    );
    let d = w.decide(S(0), true);
    assert_eq!(
        names(&d),
        [("ds".into(), Action::Delete { grace_seconds: 30 })]
    );
    assert!(d.deletes_daemonset_pods());
}

#[test]
fn a_tolerate_all_daemonset_pod_is_terminated_once_and_its_replacement_left() {
    let mut w = World::new(vec![pod("cni-1", PodType::DaemonSet, 0)], S(100));
    w.pods[0].tolerant_daemonset = Some("ds-uid".into());
    assert_eq!(names(&w.decide(S(0), true)).len(), 1);
    w.terminated.insert("ds-uid".into(), "uid-cni-1".into());
    w.pods[0].info.terminating = true;
    let mut replacement = node_pod(pod("cni-2", PodType::DaemonSet, 0));
    replacement.tolerant_daemonset = Some("ds-uid".into());
    w.pods.push(replacement);
    let d = w.decide(S(1), true);
    assert!(d.actions.is_empty(), "{:?}", names(&d));
    assert_eq!(d.replacements, ["uid-cni-2"]);
    assert!(!d.pods.iter().any(|p| p.name == "cni-2"));
    // One created after the drain began is a replacement too, after a restart.
    w.terminated.clear();
    w.pods[1].created = Some(1_001);
    assert_eq!(w.decide(S(1), true).replacements, ["uid-cni-2"]);
}

#[test]
fn a_back_off_delays_the_next_ask_and_a_shutdown_cap_shortens_it() {
    let mut w = World::new(vec![pod("db", PodType::Default, 0)], S(1000));
    w.tracks.insert(
        "uid-db".into(),
        PodTrack {
            asked: true,
            attempts: 6,
            last_try: Some((S(10), S(60))),
            ..PodTrack::default()
        },
    );
    let d = w.decide(S(12), false);
    assert!(d.actions.is_empty());
    assert_eq!(d.wake_at, Some(S(15)), "capped at 5 s");
    assert_eq!(
        names(&w.decide(S(15), false)),
        [("db".into(), Action::Evict)]
    );
}

fn arb_pods() -> impl Strategy<Value = Vec<PodInfo>> {
    let types = prop_oneof![
        Just(PodType::Default),
        Just(PodType::DaemonSet),
        Just(PodType::Static)
    ];
    let prios = prop_oneof![
        Just(0),
        Just(1000),
        Just(1_000_000_000),
        Just(2_000_000_000),
        Just(2_000_001_000)
    ];
    prop::collection::vec((types, prios, 0i64..120, any::<bool>()), 0..12).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (t, p, grace, terminating))| {
                let mut info = pod(&format!("p{i}"), t, p);
                info.termination_grace_period_seconds = grace;
                info.terminating = terminating;
                info
            })
            .collect()
    })
}

fn arb_track() -> impl Strategy<Value = Option<PodTrack>> {
    prop::option::of(
        (
            any::<bool>(),
            any::<bool>(),
            0u32..8,
            0u64..200,
            0u64..60,
            any::<bool>(),
        )
            .prop_map(
                |(asked, accepted, attempts, at, delay, escalated)| PodTrack {
                    asked,
                    accepted,
                    attempts,
                    last_try: (attempts > 0).then_some((S(at), S(delay))),
                    blocked_by: None,
                    budget: None,
                    budget_since: None,
                    throttled: 0,
                    escalated,
                    node: Default::default(),
                },
            ),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Issue 33, at random moments: an outage of any start and length short of the
    /// fallback, pods of any exit time. Every escalation is due by the schedule in force
    /// and was decided from one made after the outage (checked inside the run); a pod is
    /// evicted at most once.
    #[test]
    fn escalations_after_an_outage_come_from_the_new_schedule(
        start_ms in 0u64..12_000,
        length_ms in 1_000u64..9_900,
        exit_ms in 100u64..8_000,
    ) {
        let ms = Duration::from_millis;
        let run = shutdown_with_outage(band_pods(), (ms(start_ms), ms(length_ms)), ms(exit_ms));
        prop_assert!(run.evictions.values().all(|n| *n == 1), "{:?}", run.evictions);
    }
}

proptest! {
    #[test]
    fn decisions_keep_the_drain_rules(
        pods in arb_pods(),
        tracks in prop::collection::vec(arb_track(), 12),
        now in 0u64..200,
        budget in 1u64..400,
        shutdown in any::<bool>(),
    ) {
        let mut w = World::new(pods, S(budget));
        for (p, t) in w.pods.iter().zip(tracks) {
            if let Some(t) = t {
                w.tracks.insert(p.info.uid.clone(), t);
            }
        }
        let d = w.decide(S(now), shutdown);
        let targets = &d.evaluation.node.targets;
        let mut last = None;
        for (pod, action) in &d.actions {
            // Only targeted, active pods, in plan order, each at most once.
            prop_assert!(targets.targets(pod) && pod.is_active());
            let key = (pod.pod_type, pod.priority);
            prop_assert!(last.is_none_or(|l| l <= key), "out of order");
            last = Some(key);
            prop_assert_eq!(d.actions.iter().filter(|(p, _)| p.uid == pod.uid).count(), 1);
            let track = w.tracks.get(&pod.uid).cloned().unwrap_or_default();
            match action {
                Action::Escalate { grace_seconds } => {
                    // Only under a deadline, only what something holds, never beyond
                    // the pod's own grace.
                    prop_assert!(shutdown);
                    prop_assert!(track.asked || pod.terminating);
                    prop_assert!(!track.escalated);
                    prop_assert!(pod.pod_type != PodType::Static);
                    prop_assert!(*grace_seconds <= pod.termination_grace_period_seconds);
                }
                Action::Evict => {
                    prop_assert_eq!(pod.pod_type, PodType::Default);
                    prop_assert!(!pod.terminating && !track.accepted);
                }
                Action::Delete { grace_seconds } => {
                    prop_assert_eq!(pod.pod_type, PodType::DaemonSet);
                    prop_assert_eq!(*grace_seconds, pod.termination_grace_period_seconds);
                    prop_assert!(!pod.terminating && !track.accepted);
                }
                Action::Gate => {
                    prop_assert_eq!(pod.pod_type, PodType::Static);
                    prop_assert!(!pod.terminating && !track.accepted);
                }
            }
            // A pod in back-off is not asked again before it ends.
            if let (Some((at, delay)), false) = (track.last_try, matches!(action, Action::Escalate { .. })) {
                prop_assert!(at + delay.min(S(5)) <= S(now));
            }
        }
        if let Some(wake) = d.wake_at {
            prop_assert!(wake > S(now));
        }
    }
}

fn on_node(running: bool, mounted: bool) -> OnNode {
    OnNode {
        running: Some(running),
        mounted: Some(mounted),
    }
}

fn daemonset_asked(d: &Decision) -> bool {
    d.actions
        .iter()
        .any(|(p, _)| p.pod_type == PodType::DaemonSet)
}

/// Issue 28: the kubelet writes a pod's terminal phase before it unmounts its volumes; the
/// DaemonSet band (which may run the storage plugin the unmount needs) waits for the unmount.
#[test]
fn the_daemonset_band_waits_for_a_terminal_pods_volumes() {
    let mut w = World::new(
        vec![
            pod("web", PodType::Default, 0),
            pod("csi", PodType::DaemonSet, 0),
        ],
        S(100),
    );
    w.pods[0].info.terminating = true;
    w.pods[0].info.terminal = true;
    assert!(
        daemonset_asked(&w.decide(S(1), true)),
        "the API alone ends the band"
    );
    w.view = Some([("uid-web".to_owned(), on_node(false, true))].into());
    let d = w.decide(S(1), true);
    assert!(!daemonset_asked(&d), "{:?}", names(&d));
    let end = w.schedule[0].end;
    assert_eq!(d.wake_at, Some(end), "the hold lapses with the band's step");
    assert!(daemonset_asked(&w.decide(end, true)));
    w.view = Some([("uid-web".to_owned(), on_node(false, false))].into());
    assert!(daemonset_asked(&w.decide(S(1), true)));
}

#[test]
fn a_band_ends_when_the_node_shows_its_pods_gone() {
    let mut w = World::new(
        vec![
            pod("web", PodType::Default, 0),
            pod("agent", PodType::DaemonSet, 0),
        ],
        S(100),
    );
    w.pods[0].info.terminating = true;
    assert!(!daemonset_asked(&w.decide(S(1), true)));
    for (running, mounted) in [(true, false), (false, true)] {
        w.view = Some([("uid-web".to_owned(), on_node(running, mounted))].into());
        assert!(!daemonset_asked(&w.decide(S(1), true)));
    }
    w.view = Some([("uid-web".to_owned(), on_node(false, false))].into());
    let d = w.decide(S(1), true);
    assert_eq!(
        names(&d),
        [("agent".into(), Action::Delete { grace_seconds: 30 })]
    );
}

/// Issue 44: a pod bound to the node after the schedule was split (here in the first band,
/// which is long over) is asked as its band's pods were and never escalated by that band's
/// deadline; the drain asks for a new schedule, and once made for it, the pod's deadline is
/// the new one.
#[test]
fn a_pod_that_arrives_after_its_band_is_asked_and_its_schedule_made_again() {
    let mut w = World::new(
        vec![
            pod("web-1", PodType::Default, 1000),
            pod("crit", PodType::Default, 2_000_000_000),
            pod("agent", PodType::DaemonSet, 0),
        ],
        S(120),
    );
    let first = w.schedule[0].clone();
    let now = first.escalate_at + S(1);
    w.pods
        .push(node_pod(pod("web-late", PodType::Default, 1000)));
    w.tracks.insert(
        "uid-web-late".into(),
        PodTrack {
            asked: true,
            accepted: true,
            ..PodTrack::default()
        },
    );
    let d = w.decide(now, true);
    assert!(
        !d.actions.iter().any(|(p, _)| p.name == "web-late"),
        "escalated by a band that is over: {:?}",
        names(&d)
    );
    let unplanned: Vec<&str> = d.unplanned.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(unplanned, ["web-late"]);
    // Not asked yet: asked at once, the Eviction API as for its band.
    w.tracks.clear();
    let d = w.decide(now, true);
    assert!(
        names(&d).contains(&("web-late".into(), Action::Evict)),
        "{:?}",
        names(&d)
    );
    // Planned again over what is left: its deadline comes from the budget left.
    let steps = plan_steps(
        &w.plan,
        &w.pods.iter().map(|p| p.info.clone()).collect::<Vec<_>>(),
    )
    .unwrap();
    w.schedule = crate::plan::budget::split_remaining(S(120), now, &steps, &RESERVES);
    w.planned.insert("uid-web-late".into());
    w.tracks.insert(
        "uid-web-late".into(),
        PodTrack {
            asked: true,
            accepted: true,
            ..PodTrack::default()
        },
    );
    let d = w.decide(now + S(1), true);
    assert!(d.unplanned.is_empty());
    assert!(
        !d.actions.iter().any(|(p, _)| p.name == "web-late"),
        "{:?}",
        names(&d)
    );
    let step = w
        .schedule
        .iter()
        .find(|s| s.pods.contains(&"ns/web-late".to_string()));
    let step = step.unwrap_or_else(|| panic!("{:?}", w.schedule));
    assert!(step.escalate_at > now + S(10), "{step:?}");
}
