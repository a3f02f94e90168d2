//! The deadline budget of a shutdown drain, split over the drain-plan steps.
//!
//! The rule (what `nodegrace plan` prints):
//! 1. Each step is in one class: Regular (Default pods, entry priority below
//!    `critical_priority`), Critical (Default, at or above it), DaemonSet, Static. Steps run in
//!    plan order, so the classes come in that order.
//! 2. Only classes with pods count. Critical, DaemonSet and Static each reserve their configured
//!    time at the end of the budget; whatever is left (the surplus) goes to the earliest class
//!    with pods (Regular when it has pods). Later classes therefore keep their configured time.
//! 3. When the budget is smaller than the sum of those reserves, every reserve is scaled by
//!    budget / sum (the class windows keep their proportions) and Regular gets nothing: its
//!    pods are escalated at once.
//! 4. Inside a class window each step with pods gets a share proportional to the longest grace
//!    period among its pods (at least one second); steps without pods get nothing.
//! 5. A step's window is `[start, end)`: `start` is the latest time it starts (it starts earlier
//!    when the step before finishes early). Its cooperative drain (EvictionRequest / Eviction
//!    API) must be done by `escalate_at = end - min(longest grace, share / 2)`; pods still
//!    there are then deleted with grace `min(pod grace, end - now)`
//!    ([`escalation_grace`]).
//!
//! Times are offsets from the start of the drain, computed in whole milliseconds with
//! cumulative boundaries, so every time is monotone in the budget and nothing passes it.

use std::time::Duration;

use super::drainplan::{compile_plan, PlanError};
use super::targets::DrainTargets;
use super::{DrainPlanEntry, PodInfo, PodType};

/// The drain reserves (`[drain] reserve_*`, `critical_priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BudgetReserves {
    pub daemonset: Duration,
    pub static_pods: Duration,
    pub critical: Duration,
    pub critical_priority: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum StepClass {
    Regular,
    Critical,
    DaemonSet,
    Static,
}

impl StepClass {
    pub(crate) fn of(entry: &DrainPlanEntry, critical_priority: i32) -> StepClass {
        match entry.pod_type {
            PodType::DaemonSet => StepClass::DaemonSet,
            PodType::Static => StepClass::Static,
            PodType::Default if entry.pod_priority >= critical_priority => StepClass::Critical,
            PodType::Default => StepClass::Regular,
        }
    }

    fn reserve(self, r: &BudgetReserves) -> Duration {
        match self {
            StepClass::Regular => Duration::ZERO,
            StepClass::Critical => r.critical,
            StepClass::DaemonSet => r.daemonset,
            StepClass::Static => r.static_pods,
        }
    }

    fn label(self) -> &'static str {
        match self {
            StepClass::Regular => "regular",
            StepClass::Critical => "critical",
            StepClass::DaemonSet => "DaemonSet",
            StepClass::Static => "static",
        }
    }
}

/// One entry of the (normalized) plan with the active pods it adds to the targets.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanStep {
    pub index: usize,
    pub entry: DrainPlanEntry,
    pub pods: Vec<PodInfo>,
}

/// Splits the node's active pods over the plan: each pod goes to the first entry that targets
/// it. This is the order in which a drain terminates them. A plan's targets only grow from one
/// entry to the next (drain targets never go back), so that entry is found by bisection: a
/// handful of target checks a pod rather than two for every entry.
pub fn plan_steps(plan: &[DrainPlanEntry], pods: &[PodInfo]) -> Result<Vec<PlanStep>, PlanError> {
    let compiled = compile_plan(plan)?;
    let targets: Vec<DrainTargets> = (0..plan.len())
        .map(|index| DrainTargets::for_compiled_plan(&compiled, index))
        .collect();
    let mut steps: Vec<PlanStep> = plan
        .iter()
        .enumerate()
        .map(|(index, entry)| PlanStep {
            index,
            entry: entry.clone(),
            pods: Vec::new(),
        })
        .collect();
    for pod in pods.iter().filter(|p| p.is_active()) {
        let first = targets.partition_point(|t| !t.targets(pod));
        if let Some(step) = steps.get_mut(first) {
            step.pods.push(pod.clone());
        }
    }
    Ok(steps)
}

/// The schedule of one step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepSchedule {
    pub index: usize,
    pub entry: DrainPlanEntry,
    pub class: StepClass,
    /// `namespace/name` of the step's pods.
    pub pods: Vec<String>,
    pub longest_grace: Duration,
    /// Latest start (offset from the start of the drain).
    pub start: Duration,
    /// The cooperative drain must be done by then; afterwards DELETE.
    pub escalate_at: Duration,
    /// End of the step's share: escalated pods must be gone by then.
    pub end: Duration,
    pub explanation: String,
}

/// The time the reserves of the classes that have pods take out of a budget. A budget below
/// it scales every reserve down and leaves regular pods no time at all (rule 3): the plan
/// needs at least this much.
pub(crate) fn reserves_needed(schedule: &[StepSchedule], reserves: &BudgetReserves) -> Duration {
    let has = |class: StepClass| {
        schedule
            .iter()
            .any(|s| s.class == class && !s.pods.is_empty())
    };
    [
        (StepClass::Critical, reserves.critical),
        (StepClass::DaemonSet, reserves.daemonset),
        (StepClass::Static, reserves.static_pods),
    ]
    .into_iter()
    .filter(|(c, _)| has(*c))
    .map(|(_, d)| d)
    .sum()
}

/// Grace period for a pod deleted on escalation at `now`: what is left of its step's share,
/// never more than its own.
pub(crate) fn escalation_grace(pod_grace: Duration, now: Duration, step_end: Duration) -> Duration {
    pod_grace.min(step_end.saturating_sub(now))
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

fn from_ms(v: u128) -> Duration {
    Duration::from_millis(u64::try_from(v).unwrap_or(u64::MAX))
}

/// `floor(total * part / whole)`, 0 when `whole` is 0.
fn scale(total: u128, part: u128, whole: u128) -> u128 {
    (total * part).checked_div(whole).unwrap_or(0)
}

/// Splits `budget` over `steps` (see the module documentation for the rule).
pub(crate) fn split_budget(
    budget: Duration,
    steps: &[PlanStep],
    reserves: &BudgetReserves,
) -> Vec<StepSchedule> {
    split_remaining(budget, Duration::ZERO, steps, reserves)
}

/// The schedule of a drain that could not go on until `elapsed` into its `budget` (time lost
/// to an unusable apiserver, or a daemon restarted mid-drain): what is left of the budget is
/// split over `steps` (the pods still there) by the same rule, starting at `elapsed`. Later
/// classes keep their reserves whenever what is left covers them; the lost time comes out of
/// the earliest class's surplus first. Times stay offsets from the start of the drain.
pub(crate) fn split_remaining(
    budget: Duration,
    elapsed: Duration,
    steps: &[PlanStep],
    reserves: &BudgetReserves,
) -> Vec<StepSchedule> {
    let origin = ms(elapsed.min(budget));
    split_ms(origin, ms(budget) - origin, steps, reserves)
}

/// The split of `b` ms that start `origin` ms into the drain.
fn split_ms(
    origin: u128,
    b: u128,
    steps: &[PlanStep],
    reserves: &BudgetReserves,
) -> Vec<StepSchedule> {
    const CLASSES: [StepClass; 4] = [
        StepClass::Regular,
        StepClass::Critical,
        StepClass::DaemonSet,
        StepClass::Static,
    ];
    let classes: Vec<StepClass> = steps
        .iter()
        .map(|s| StepClass::of(&s.entry, reserves.critical_priority))
        .collect();
    let active: Vec<StepClass> = CLASSES
        .into_iter()
        .filter(|c| {
            steps
                .iter()
                .zip(&classes)
                .any(|(s, sc)| sc == c && !s.pods.is_empty())
        })
        .collect();
    let reserve_sum: u128 = active.iter().map(|c| ms(c.reserve(reserves))).sum();
    let scaled = b < reserve_sum;

    // Class windows by cumulative boundaries; the surplus goes to the earliest active class.
    let mut windows: Vec<(StepClass, u128, u128)> = Vec::new();
    let mut cumulative = 0u128;
    for c in &active {
        let start = windows.last().map_or(origin, |w| w.2);
        cumulative += ms(c.reserve(reserves));
        let end = origin
            + if scaled {
                scale(b, cumulative, reserve_sum)
            } else {
                b - reserve_sum + cumulative
            };
        windows.push((*c, start, end));
    }

    let grace_ms = |s: &PlanStep| {
        s.pods
            .iter()
            .map(|p| ms(p.grace_period()))
            .max()
            .unwrap_or(0)
    };
    let mut out = Vec::with_capacity(steps.len());
    for (class, w_start, w_end) in &windows {
        let members: Vec<usize> = (0..steps.len()).filter(|&i| classes[i] == *class).collect();
        let weight = |i: usize| {
            if steps[i].pods.is_empty() {
                0
            } else {
                grace_ms(&steps[i]).max(1000)
            }
        };
        let total: u128 = members.iter().map(|&i| weight(i)).sum();
        let (mut acc, mut start) = (0u128, *w_start);
        for &i in &members {
            acc += weight(i);
            let end = w_start + scale(w_end - w_start, acc, total);
            out.push(schedule(
                &steps[i],
                classes[i],
                start,
                end,
                grace_ms(&steps[i]),
                Split {
                    origin,
                    budget: b,
                    reserve_sum,
                    scaled,
                },
            ));
            start = end;
        }
    }
    // Steps of classes without pods reserve nothing; place them where they fall in plan order.
    for (step, class) in steps.iter().zip(&classes) {
        if !active.contains(class) {
            let at = out
                .iter()
                .filter(|s| s.index < step.index)
                .map(|s| ms(s.end))
                .max()
                .unwrap_or(origin);
            let split = Split {
                origin,
                budget: b,
                reserve_sum,
                scaled,
            };
            out.push(schedule(step, *class, at, at, 0, split));
        }
    }
    out.sort_by_key(|s| s.index);
    out
}

/// What a step's window was cut from.
#[derive(Clone, Copy)]
struct Split {
    /// When the split starts: 0, or the time lost before the drain could go on.
    origin: u128,
    /// What was split: the budget, less `origin`.
    budget: u128,
    reserve_sum: u128,
    scaled: bool,
}

fn schedule(
    step: &PlanStep,
    class: StepClass,
    start: u128,
    end: u128,
    grace: u128,
    split: Split,
) -> StepSchedule {
    let end = end.max(start);
    let share = end - start;
    let escalate_at = end - grace.min(share / 2);
    let fmt = |v: u128| humantime::format_duration(from_ms(v)).to_string();
    let explanation = if step.pods.is_empty() {
        format!("{}: no pods, reserves nothing", step.entry)
    } else {
        let mut text = format!(
            "{}: {} {} pod(s), longest grace {}; starts by {}, cooperative drain until {}, then DELETE with grace cut to what is left before {}",
            step.entry,
            step.pods.len(),
            class.label(),
            fmt(grace),
            fmt(start),
            fmt(escalate_at),
            fmt(end),
        );
        if split.scaled {
            text.push_str(&format!(
                " (budget {} is below the reserves {}: reserves scaled down)",
                fmt(split.budget),
                fmt(split.reserve_sum)
            ));
        }
        if split.origin > 0 {
            text.push_str(&format!(
                " (planned again at {}: the {} left of the budget split over the pods left)",
                fmt(split.origin),
                fmt(split.budget)
            ));
        }
        text
    };
    StepSchedule {
        index: step.index,
        entry: step.entry.clone(),
        class,
        pods: step.pods.iter().map(PodInfo::key).collect(),
        longest_grace: from_ms(grace),
        start: from_ms(start),
        escalate_at: from_ms(escalate_at),
        end: from_ms(end),
        explanation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::drainplan::normalize_drain_plan;
    use crate::plan::testutil::{entry, pod};
    use proptest::prelude::*;

    fn reserves() -> BudgetReserves {
        BudgetReserves {
            daemonset: Duration::from_secs(30),
            static_pods: Duration::from_secs(20),
            critical: Duration::from_secs(40),
            critical_priority: 2_000_000_000,
        }
    }

    fn node_pods() -> Vec<PodInfo> {
        let mut db = pod("db", PodType::Default, 100);
        db.termination_grace_period_seconds = 120;
        vec![
            db,
            pod("web", PodType::Default, 0),
            pod("dns", PodType::Default, 2_000_000_000),
            pod("proxy", PodType::DaemonSet, 2_000_001_000),
            pod("etcd", PodType::Static, 2_000_001_000),
        ]
    }

    fn steps(user: &[DrainPlanEntry], pods: &[PodInfo]) -> Vec<PlanStep> {
        plan_steps(&normalize_drain_plan(user).unwrap(), pods).unwrap()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn plan_steps_put_each_active_pod_in_its_first_step() {
        let mut pods = node_pods();
        let mut gone = pod("gone", PodType::Default, 0);
        gone.terminal = true;
        pods.push(gone);
        let s = steps(&[entry(PodType::Default, 50)], &pods);
        let names: Vec<Vec<String>> = s
            .iter()
            .map(|s| s.pods.iter().map(|p| p.name.clone()).collect())
            .collect();
        assert_eq!(names[0], ["web"]);
        assert_eq!(names[1], ["db"]);
        assert_eq!(names[2], ["dns"]);
        assert_eq!(names[7], ["proxy"]);
        assert_eq!(names[11], ["etcd"]);
        assert_eq!(
            names.iter().map(Vec::len).sum::<usize>(),
            5,
            "terminal pods are not scheduled"
        );
    }

    #[test]
    fn later_classes_keep_their_reserves() {
        let s = steps(&[entry(PodType::Default, 50)], &node_pods());
        let plan = split_budget(secs(300), &s, &reserves());
        let by_index = |i: usize| &plan[i];
        // Regular: web (30 s grace) and db (120 s) share 300 - 40 - 30 - 20 = 210 s by grace.
        assert_eq!((by_index(0).start, by_index(0).end), (secs(0), secs(42)));
        assert_eq!((by_index(1).start, by_index(1).end), (secs(42), secs(210)));
        // db's 168 s share: half for cooperation, then at most 84 s of its 120 s grace.
        assert_eq!(by_index(1).escalate_at, secs(126));
        assert_eq!(by_index(0).escalate_at, secs(21));
        // critical (dns, 30 s grace) gets 40 s: 20 s cooperative, then at most 20 s of grace.
        assert_eq!(by_index(2).escalate_at, secs(230));
        assert_eq!((by_index(2).start, by_index(2).end), (secs(210), secs(250)));
        assert_eq!((by_index(7).start, by_index(7).end), (secs(250), secs(280)));
        assert_eq!(
            (by_index(11).start, by_index(11).end),
            (secs(280), secs(300))
        );
        // Empty steps reserve nothing.
        for i in [3, 4, 5, 6, 8, 9, 10, 12] {
            assert_eq!(by_index(i).start, by_index(i).end, "step {i}");
            assert!(by_index(i)
                .explanation
                .contains("no pods, reserves nothing"));
        }
        assert!(
            by_index(1)
                .explanation
                .contains("1 regular pod(s), longest grace 2m"),
            "{}",
            by_index(1).explanation
        );
    }

    #[test]
    fn short_share_halves_between_cooperation_and_grace() {
        let s = steps(&[], &[pod("web", PodType::Default, 0)]);
        let plan = split_budget(secs(20), &s, &reserves());
        assert_eq!(
            (plan[0].start, plan[0].escalate_at, plan[0].end),
            (secs(0), secs(10), secs(20))
        );
        assert_eq!(escalation_grace(secs(30), secs(10), plan[0].end), secs(10));
        assert_eq!(escalation_grace(secs(5), secs(10), plan[0].end), secs(5));
        assert_eq!(
            escalation_grace(secs(5), secs(25), plan[0].end),
            Duration::ZERO
        );
    }

    #[test]
    fn small_budget_scales_reserves_and_leaves_regular_nothing() {
        let s = steps(&[], &node_pods());
        let plan = split_budget(secs(9), &s, &reserves());
        let regular: Vec<_> = plan
            .iter()
            .filter(|p| p.class == StepClass::Regular && !p.pods.is_empty())
            .collect();
        assert!(regular.iter().all(|p| p.end == Duration::ZERO));
        let crit = plan.iter().find(|p| p.pods == ["ns/dns"]).unwrap();
        let ds = plan.iter().find(|p| p.pods == ["ns/proxy"]).unwrap();
        let st = plan.iter().find(|p| p.pods == ["ns/etcd"]).unwrap();
        assert_eq!((crit.start, crit.end), (secs(0), secs(4)));
        assert_eq!((ds.start, ds.end), (secs(4), secs(7)));
        assert_eq!((st.start, st.end), (secs(7), secs(9)));
        assert!(st.explanation.contains("reserves scaled down"));
    }

    #[test]
    fn surplus_goes_to_the_first_class_with_pods() {
        let pods = vec![
            pod("proxy", PodType::DaemonSet, 0),
            pod("etcd", PodType::Static, 0),
        ];
        let plan = split_budget(secs(100), &steps(&[], &pods), &reserves());
        let ds = plan.iter().find(|p| p.pods == ["ns/proxy"]).unwrap();
        let st = plan.iter().find(|p| p.pods == ["ns/etcd"]).unwrap();
        assert_eq!((ds.start, ds.end), (secs(0), secs(80)));
        assert_eq!((st.start, st.end), (secs(80), secs(100)));
    }

    fn arb_pods() -> impl Strategy<Value = Vec<PodInfo>> {
        let types = prop_oneof![
            Just(PodType::Default),
            Just(PodType::DaemonSet),
            Just(PodType::Static)
        ];
        let prios = prop_oneof![
            -10i32..3000,
            Just(1_000_000_000),
            Just(2_000_000_000),
            Just(2_000_001_000),
            Just(i32::MAX)
        ];
        proptest::collection::vec((types, prios, 0i64..400), 0..12).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (t, p, g))| {
                    let mut pd = pod(&format!("p{i}"), t, p);
                    pd.termination_grace_period_seconds = g;
                    pd
                })
                .collect()
        })
    }

    fn arb_reserves() -> impl Strategy<Value = BudgetReserves> {
        (
            0u64..100_000,
            0u64..100_000,
            0u64..100_000,
            prop_oneof![Just(2_000_000_000), 0i32..3000],
        )
            .prop_map(|(d, s, c, cp)| BudgetReserves {
                daemonset: Duration::from_millis(d),
                static_pods: Duration::from_millis(s),
                critical: Duration::from_millis(c),
                critical_priority: cp,
            })
    }

    /// The scenario of an apiserver that came back 20 s into a 60 s shutdown: the first band
    /// gets a window after the outage (not one that ended during it), and the later classes
    /// keep their reserves.
    #[test]
    fn time_lost_before_the_drain_comes_out_of_the_surplus_not_out_of_the_first_band() {
        let mut web = pod("web", PodType::Default, 0);
        web.termination_grace_period_seconds = 10;
        let pods = vec![
            web,
            pod("dns", PodType::Default, 2_000_000_000),
            pod("proxy", PodType::DaemonSet, 2_000_001_000),
        ];
        let r = BudgetReserves {
            daemonset: secs(5),
            static_pods: secs(5),
            critical: secs(10),
            critical_priority: 2_000_000_000,
        };
        let s = steps(&[], &pods);
        let first = split_budget(secs(60), &s, &r);
        assert_eq!((first[0].escalate_at, first[0].end), (secs(35), secs(45)));
        let again = split_remaining(secs(60), secs(50), &s, &r);
        // 10 s left cannot cover the 15 s of reserves: scaled, regular pods get nothing.
        assert_eq!(again[0].end, secs(50));
        let again = split_remaining(secs(60), secs(20), &s, &r);
        // 40 s left: regular gets 40 - 15 = 25 s from 20 s on, half of it cooperative.
        assert_eq!(
            (again[0].start, again[0].escalate_at, again[0].end),
            (secs(20), secs(35), secs(45))
        );
        let critical = again
            .iter()
            .find(|x| x.class == StepClass::Critical && !x.pods.is_empty())
            .unwrap();
        assert_eq!((critical.start, critical.end), (secs(45), secs(55)));
        let ds = again
            .iter()
            .find(|x| x.class == StepClass::DaemonSet && !x.pods.is_empty())
            .unwrap();
        assert_eq!((ds.start, ds.end), (secs(55), secs(60)));
        assert!(
            again[0]
                .explanation
                .contains("planned again at 20s: the 40s left of the budget"),
            "{}",
            again[0].explanation
        );
        assert!(!first[0].explanation.contains("planned again"));
    }

    #[test]
    fn nothing_lost_is_the_plain_split() {
        let s = steps(&[entry(PodType::Default, 50)], &node_pods());
        assert_eq!(
            split_remaining(secs(300), Duration::ZERO, &s, &reserves()),
            split_budget(secs(300), &s, &reserves())
        );
        // More lost than the budget: every step at the end of the budget.
        for x in split_remaining(secs(300), secs(400), &s, &reserves()) {
            assert_eq!(
                (x.start, x.escalate_at, x.end),
                (secs(300), secs(300), secs(300))
            );
        }
    }

    proptest! {
        #[test]
        fn split_is_bounded_ordered_monotone_and_keeps_reserves(
            pods in arb_pods(),
            user in proptest::collection::vec(0i32..3000, 0..3),
            r in arb_reserves(),
            b1 in 0u64..600_000,
            extra in 0u64..600_000,
        ) {
            let mut user: Vec<_> = user.into_iter().map(|p| entry(PodType::Default, p)).collect();
            user.sort_by_key(|e| e.pod_priority);
            user.dedup();
            let s = steps(&user, &pods);
            let (budget, bigger) = (Duration::from_millis(b1), Duration::from_millis(b1 + extra));
            let small = split_budget(budget, &s, &r);
            let large = split_budget(bigger, &s, &r);
            prop_assert_eq!(small.len(), s.len());
            let mut previous_end = Duration::ZERO;
            for (x, y) in small.iter().zip(&large) {
                prop_assert!(x.start <= x.escalate_at && x.escalate_at <= x.end && x.end <= budget);
                prop_assert!(previous_end <= x.start);
                previous_end = x.end;
                if x.pods.is_empty() {
                    prop_assert_eq!(x.start, x.end);
                }
                prop_assert!(x.start <= y.start && x.escalate_at <= y.escalate_at && x.end <= y.end);
            }
            let reserve_of = |c: StepClass| c.reserve(&r);
            let active: Vec<StepClass> = [StepClass::Regular, StepClass::Critical, StepClass::DaemonSet, StepClass::Static]
                .into_iter()
                .filter(|c| small.iter().any(|x| x.class == *c && !x.pods.is_empty()))
                .collect();
            let sum: Duration = active.iter().map(|c| reserve_of(*c)).sum();
            if budget >= sum {
                for c in active {
                    let window: Duration = small.iter().filter(|x| x.class == c).map(|x| x.end - x.start).sum();
                    prop_assert!(window >= reserve_of(c), "{:?} got {:?} < {:?}", c, window, reserve_of(c));
                }
            }
        }

        /// A split after time was lost is the split of what is left, shifted to start then:
        /// nothing before the moment of the new plan, nothing past the budget.
        #[test]
        fn a_new_plan_is_the_split_of_what_is_left(
            pods in arb_pods(),
            r in arb_reserves(),
            b in 0u64..600_000,
            lost in 0u64..700_000,
        ) {
            let s = steps(&[], &pods);
            let (budget, lost) = (Duration::from_millis(b), Duration::from_millis(lost));
            let again = split_remaining(budget, lost, &s, &r);
            let at = lost.min(budget);
            let plain = split_budget(budget - at, &s, &r);
            prop_assert_eq!(again.len(), plain.len());
            for (x, y) in again.iter().zip(&plain) {
                prop_assert!(at <= x.start && x.start <= x.escalate_at && x.escalate_at <= x.end && x.end <= budget);
                prop_assert_eq!((x.start, x.escalate_at, x.end), (y.start + at, y.escalate_at + at, y.end + at));
            }
        }
    }
}
