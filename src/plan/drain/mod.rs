//! The drain decision for the node: from a snapshot the engine builds of its maintenances,
//! pods and what it asked of them so far, which pods are targeted now, in which order, what
//! is asked of each (evict, delete, gate) and which are escalated. One pure function,
//! [`decide`]; the engine carries its answer out and records the outcomes in [`PodTrack`]s.
//!
//! Rules:
//! - Targets come from the maintenances ([`evaluate_node`]): never backtracking, the least
//!   powerful maintenance wins. Pods go in plan order: by pod type, then ascending priority.
//! - Every targeted pod not yet asked (or whose back-off ended) is asked at once: Default
//!   pods cooperatively (EvictionRequest / Eviction API), DaemonSet pods by DELETE with their
//!   own grace (after the maintenance taint), static pods by gating their manifest.
//! - Under a shutdown deadline, a pod is escalated to DELETE at its step's escalation time
//!   only when something holds it: it was asked (an answer came: blocked by a budget, or
//!   accepted and still running, an interceptor possibly working on it) or it is
//!   terminating. A pod nodegrace had not asked yet is asked, never escalated.
//! - A DaemonSet pod that tolerates every taint is terminated once; another pod of that
//!   DaemonSet is its replacement (its controller ignores cordon and taints): neither asked
//!   nor waited for.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::bandend::{BandEnd, NodeTrack, NodeView};
use super::budget::{escalation_grace, StepSchedule};
use super::targets::{evaluate_node, DrainTargets, MaintenanceInput, NodeEvaluation};
use super::{PlanError, PodInfo, PodType};

/// A pod of the node as the drain sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodePod {
    pub info: PodInfo,
    /// When its deletion is due (`deletionTimestamp`), on the drain clock; None when it is
    /// not being deleted.
    pub deletion_due: Option<Duration>,
    /// A DaemonSet pod that tolerates every taint: its DaemonSet's UID.
    pub tolerant_daemonset: Option<String>,
    /// `creationTimestamp`, whole seconds since the Unix epoch.
    pub created: Option<i64>,
}

/// When a terminating pod's deletion is due, on the drain clock. `by_timestamp` reads its
/// `deletionTimestamp` against this node's wall clock, which a clock step or the apiserver's
/// skew can move by hours; `seen_at` is when this node first saw it terminating and `grace` its
/// `deletionGracePeriodSeconds`. Its deletion began before it was seen, so it is due no later
/// than `seen_at + grace` whatever the clocks say: a clock behind never makes a pod that is
/// going in time look late (and escalated, its grace cut); a clock ahead can only make it look
/// due sooner, which holds an escalation back, never brings one on.
pub(crate) fn deletion_due(
    by_timestamp: Option<Duration>,
    seen_at: Duration,
    grace: Option<Duration>,
) -> Option<Duration> {
    let bound = grace.map(|g| seen_at.saturating_add(g));
    match (by_timestamp, bound) {
        (Some(t), Some(b)) => Some(t.min(b)),
        (t, b) => t.or(b),
    }
}

/// What the drain remembers of one pod between passes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PodTrack {
    /// A request for it was answered: it has been asked.
    pub asked: bool,
    /// A request was accepted (or the pod turned out gone): wait for it to go.
    pub accepted: bool,
    /// Refused or failed attempts so far.
    pub attempts: u32,
    /// When the last refused or failed attempt was made and the back-off it earned.
    pub last_try: Option<(Duration, Duration)>,
    /// `namespace/pdb` (or the apiserver's message) of the last refusal.
    pub blocked_by: Option<String>,
    /// `namespace/name` of the PodDisruptionBudget that refused the last eviction.
    pub budget: Option<String>,
    /// When that budget first refused this pod (drain clock), kept while it refuses.
    pub budget_since: Option<Duration>,
    /// Requests the apiserver throttled (429, not a budget's): not an answer to them.
    pub throttled: u32,
    pub escalated: bool,
    /// What the node's view needs (`plan::bandend`).
    pub node: NodeTrack,
}

/// What the drain remembers of `pod` for the node's view (nothing yet: the default).
pub(crate) fn node_track(tracks: &HashMap<String, PodTrack>, pod: &PodInfo) -> NodeTrack {
    tracks.get(&pod.uid).map(|t| t.node).unwrap_or_default()
}

/// The PodDisruptionBudget (`namespace/name`) that has refused a pod still waiting for the
/// longest, and since when (drain clock); ties go to the first name.
pub(crate) fn longest_blocking<'a>(
    tracks: impl IntoIterator<Item = &'a PodTrack>,
) -> Option<(&'a str, Duration)> {
    tracks
        .into_iter()
        .filter(|t| !t.accepted)
        .filter_map(|t| Some((t.budget.as_deref()?, t.budget_since?)))
        .min_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(b.0)))
}

/// The deadline schedule of a shutdown drain (`budget::split_budget`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines<'a> {
    /// The targets of each prefix of the shutdown maintenance's plan.
    pub step_targets: &'a [DrainTargets],
    pub schedule: &'a [StepSchedule],
    /// When the shutdown began, on the drain clock.
    pub start: Duration,
    /// The schedule may be acted on now
    /// ([`crate::plan::reachability::Reachability::schedule_holds`]): false while the
    /// apiserver cannot be used, and after an outage until the schedule is made again.
    pub holds: bool,
    /// The UIDs of the pods the schedule was split over.
    pub planned: &'a HashSet<String>,
}

impl Deadlines<'_> {
    fn step_of(&self, pod: &PodInfo) -> Option<&StepSchedule> {
        let index = self.step_targets.iter().position(|t| t.targets(pod))?;
        self.schedule.iter().find(|s| s.index == index)
    }
}

/// A PodDisruptionBudget that refused an eviction of this drain, as its watch last showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BudgetStatus {
    /// `status.disruptionsAllowed`.
    pub allowed: i32,
    /// `status.observedGeneration` is the budget's `metadata.generation`: the disruption
    /// controller has seen its spec, so `allowed` can be believed.
    pub current: bool,
    /// When the watch showed it, on the drain clock.
    pub seen_at: Duration,
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshot<'a> {
    /// Now, on the drain clock (any monotonic origin; every time here uses it).
    pub now: Duration,
    /// Draining maintenances selecting the node, oldest first.
    pub maintenances: &'a [MaintenanceInput<'a>],
    /// The node's targets so far (from its status entries and earlier passes).
    pub previous: Option<&'a DrainTargets>,
    pub pods: &'a [NodePod],
    /// By pod UID.
    pub tracks: &'a HashMap<String, PodTrack>,
    /// A shutdown deadline runs.
    pub deadlines: Option<Deadlines<'a>>,
    /// Cap of the back-off after refused evictions (shorter under a shutdown deadline).
    pub backoff_cap: Duration,
    /// When the node's drain began (earliest Drain stage start), whole Unix seconds.
    pub drain_began: Option<i64>,
    /// DaemonSet UID -> the UID of its tolerate-all pod this drain terminated.
    pub daemonset_terminated: &'a HashMap<String, String>,
    /// The budgets that refused evictions, by `namespace/name`, as last watched.
    pub budgets: &'a HashMap<String, BudgetStatus>,
    /// What the node itself shows of its terminating pods; None: it was not asked.
    pub node_view: Option<&'a NodeView>,
}

/// What to do to one pod now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Ask it to leave, honouring disruption budgets (EvictionRequest or Eviction API).
    Evict,
    /// DELETE with this grace period: DaemonSet pods, which the Eviction API refuses.
    Delete { grace_seconds: i64 },
    /// Move its static manifest out of the kubelet's manifest directory.
    Gate,
    /// DELETE a held pod at its step's escalation time with the grace that is left.
    Escalate { grace_seconds: i64 },
}

/// [`decide`]'s answer.
#[derive(Debug, Clone)]
pub(crate) struct Decision {
    /// Targets, each maintenance's position and this node's reports for them.
    pub evaluation: NodeEvaluation,
    /// The pods that count for the drain (replacements left out), for status and messages.
    pub pods: Vec<PodInfo>,
    /// UIDs of tolerate-all DaemonSet replacements, left alone.
    pub replacements: Vec<String>,
    /// In plan order.
    pub actions: Vec<(PodInfo, Action)>,
    /// Decide again then even if nothing changes (a back-off ends, an escalation is due).
    pub wake_at: Option<Duration>,
    /// Pods of the shutdown's plan that its schedule was not made for (bound to the node
    /// after it was split, their band possibly over): the schedule is to be made again
    /// over what is left of the budget, as after time lost to a fault. Until then nothing
    /// escalates them.
    pub unplanned: Vec<PodInfo>,
}

impl Decision {
    /// A DaemonSet pod is deleted now: the node must carry the maintenance taint first.
    pub(crate) fn deletes_daemonset_pods(&self) -> bool {
        self.actions
            .iter()
            .any(|(p, a)| p.pod_type == PodType::DaemonSet && matches!(a, Action::Delete { .. }))
    }
}

fn min_wake(wake: &mut Option<Duration>, at: Duration) {
    *wake = Some(wake.map_or(at, |w| w.min(at)));
}

/// The UIDs of tolerate-all DaemonSet pods that are replacements: created after the second
/// in which the drain began (so it holds across restarts of the daemon), or another pod of
/// a DaemonSet whose pod this drain already terminated.
pub(crate) fn daemonset_replacements(
    pods: &[NodePod],
    drain_began: Option<i64>,
    terminated: &HashMap<String, String>,
) -> Vec<String> {
    let Some(began) = drain_began else {
        return Vec::new();
    };
    pods.iter()
        .filter(|p| {
            let Some(owner) = &p.tolerant_daemonset else {
                return false;
            };
            let later = p.created.is_some_and(|c| c > began);
            let another = terminated.get(owner).is_some_and(|uid| *uid != p.info.uid);
            later || another
        })
        .map(|p| p.info.uid.clone())
        .collect()
}

/// The drain decision for the node (see the module documentation).
pub(crate) fn decide(s: &Snapshot<'_>) -> Result<Decision, PlanError> {
    let replacements = daemonset_replacements(s.pods, s.drain_began, s.daemonset_terminated);
    let counted: Vec<&NodePod> = s
        .pods
        .iter()
        .filter(|p| !replacements.contains(&p.info.uid))
        .collect();
    let pods: Vec<PodInfo> = counted.iter().map(|p| p.info.clone()).collect();
    // A hold of the node's view ends with its step under a shutdown's schedule in force.
    let hold_ends = |pod: &PodInfo| {
        let d = s.deadlines.filter(|d| d.holds)?;
        Some(d.start + d.step_of(pod)?.end)
    };
    let track_of = |pod: &PodInfo| node_track(s.tracks, pod);
    let band = BandEnd::decide(&pods, &track_of, s.node_view, &hold_ends, s.now);
    let evaluation = evaluate_node(s.previous, s.maintenances, &pods, &band)?;
    let by_uid: HashMap<&str, &NodePod> =
        counted.iter().map(|p| (p.info.uid.as_str(), *p)).collect();
    let none = PodTrack::default();
    let mut actions = Vec::new();
    let mut wake_at = band.wake_at;
    let mut opened = BudgetsOpened::new(s.budgets);
    if !s.maintenances.is_empty() {
        for pod in &evaluation.to_terminate {
            let Some(node_pod) = by_uid.get(pod.uid.as_str()) else {
                continue;
            };
            let track = s.tracks.get(&pod.uid).unwrap_or(&none);
            if let Some(action) = escalation(s, node_pod, track, &mut wake_at) {
                actions.push((pod.clone(), action));
                continue;
            }
            if pod.terminating || track.accepted {
                continue;
            }
            if let Some((at, delay)) = track.last_try {
                // The cap in force now: a shutdown starting mid back-off shortens it.
                let retry = at + delay.min(s.backoff_cap);
                if retry > s.now && !opened.take(track.budget.as_deref(), at) {
                    min_wake(&mut wake_at, retry);
                    continue;
                }
            }
            let action = match pod.pod_type {
                PodType::Default => Action::Evict,
                PodType::DaemonSet => Action::Delete {
                    grace_seconds: pod.termination_grace_period_seconds,
                },
                PodType::Static => Action::Gate,
            };
            actions.push((pod.clone(), action));
        }
    }
    let unplanned = s
        .deadlines
        .map(|d| {
            counted
                .iter()
                .map(|p| &p.info)
                .filter(|p| p.is_active() && !d.planned.contains(&p.uid) && d.step_of(p).is_some())
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    Ok(Decision {
        evaluation,
        pods,
        replacements,
        actions,
        wake_at,
        unplanned,
    })
}

/// The disruptions each refusing budget allows now, handed out in plan order: a pod its
/// budget refused is asked again before its back-off ends when the budget's watch shows,
/// after the refusal, a status the disruption controller computed for its current spec
/// that allows a disruption — no more pods at once than it allows. The back-off stays
/// for a budget whose status never changes, or whose watch fails.
struct BudgetsOpened<'a> {
    budgets: &'a HashMap<String, BudgetStatus>,
    taken: HashMap<&'a str, i32>,
}

impl<'a> BudgetsOpened<'a> {
    fn new(budgets: &'a HashMap<String, BudgetStatus>) -> Self {
        Self {
            budgets,
            taken: HashMap::new(),
        }
    }

    /// Whether the pod refused at `refused_at` by `budget` may be asked again now.
    fn take(&mut self, budget: Option<&str>, refused_at: Duration) -> bool {
        let Some((name, status)) = budget.and_then(|b| self.budgets.get_key_value(b)) else {
            return false;
        };
        if !status.current || status.seen_at <= refused_at {
            return false;
        }
        let taken = self.taken.entry(name.as_str()).or_insert(0);
        if *taken >= status.allowed {
            return false;
        }
        *taken += 1;
        true
    }
}

/// The escalation of `pod` if one is due now; otherwise notes when one would be.
fn escalation(
    s: &Snapshot<'_>,
    pod: &NodePod,
    track: &PodTrack,
    wake_at: &mut Option<Duration>,
) -> Option<Action> {
    let deadlines = s.deadlines?;
    if !deadlines.holds {
        return None;
    }
    let info = &pod.info;
    if info.pod_type == PodType::Static || track.escalated {
        return None;
    }
    let held = track.asked || info.terminating;
    if !held || !deadlines.planned.contains(&info.uid) {
        return None;
    }
    let step = deadlines.step_of(info)?;
    let escalate_at = deadlines.start + step.escalate_at;
    if s.now < escalate_at {
        min_wake(wake_at, escalate_at);
        return None;
    }
    let end = deadlines.start + step.end;
    // Already going, and gone before its step ends: nothing to gain.
    if pod.deletion_due.is_some_and(|due| due <= end) {
        return None;
    }
    let grace = escalation_grace(info.grace_period(), s.now - deadlines.start, step.end);
    Some(Action::Escalate {
        grace_seconds: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
    })
}

#[cfg(test)]
mod tests;
