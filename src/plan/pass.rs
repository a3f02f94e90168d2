//! One pass of the node's drain engine as pure functions: the engine
//! (`cluster/engine/reconcile.rs::Shared::reconcile`) takes a snapshot of what its watches
//! hold and what the drain remembers, asks [`hold`] and [`decide`] what to do, and applies
//! the answers (the applier does I/O only). [`note_answer`] says what one pod's answer means
//! for the next pass; [`node_entry`] is the node's entry in a maintenance's status.
//!
//! "The node is done" (the shutdown's drain returns, and the state machine releases the
//! inhibitor: `plan::lifecycle`) is decided here, in [`decide`]'s [`Done`].

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::bandend::{self, NodeView};
use super::drain::{self, Action, BudgetStatus, Deadlines, Decision, NodePod, PodTrack};
use super::targets::{DrainTargets, MaintenanceInput};
use super::{DrainPlanEntry, PlanError, PodInfo, StepSchedule};

/// A NodeMaintenance that selects the node, as a pass reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MaintenanceFacts<'a> {
    pub(crate) name: &'a str,
    /// Stage Cordon or Drain, not being deleted.
    pub(crate) active: bool,
    /// Stage Complete, or being deleted.
    pub(crate) ending: bool,
    pub(crate) has_finalizer: bool,
    /// The node's entry in its status says the node carried its Complete stage out.
    pub(crate) completed_here: bool,
}

/// nodegrace's marks on the node, as a pass reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct NodeMarks {
    /// Cordoned by nodegrace (unschedulable, with the annotation its cordon sets).
    pub(crate) cordoned: bool,
    /// The shutdown's marks: the load-balancer exclusion label and the maintenance taint.
    pub(crate) shutdown_marked: bool,
}

/// What [`hold`] decides: a maintenance that selects the node, or a shutdown drain under
/// way, holds it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Hold {
    pub(crate) cordon: bool,
    /// Add the shutdown's marks, in the cordon's patch.
    pub(crate) shutdown_marks: bool,
    /// The active maintenances that lack the completion finalizer.
    pub(crate) add_finalizers: Vec<String>,
}

impl Hold {
    /// Whether the node is to be patched.
    pub(crate) fn marks(&self) -> bool {
        self.cordon || self.shutdown_marks
    }
}

/// Cordon, the shutdown's marks and finalizers, first in a pass: before anything is asked of
/// a pod. The one place the node is cordoned: for the shutdown's drain it comes before its
/// maintenance exists (nothing new lands on the node while that is set up).
pub(crate) fn hold(
    maintenances: &[MaintenanceFacts<'_>],
    node: NodeMarks,
    shutting_down: bool,
) -> Hold {
    let active = || maintenances.iter().filter(|m| m.active);
    let held = shutting_down || active().next().is_some();
    Hold {
        cordon: held && !node.cordoned,
        shutdown_marks: shutting_down && !node.shutdown_marked,
        add_finalizers: active()
            .filter(|m| !m.has_finalizer)
            .map(|m| m.name.to_owned())
            .collect(),
    }
}

/// The shutdown under way, as the engine planned it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShutdownFacts<'a> {
    /// `shutdown-<node>`.
    pub(crate) name: &'a str,
    /// The targets of each prefix of its plan; the last one empties the node.
    pub(crate) step_targets: &'a [DrainTargets],
    pub(crate) schedule: &'a [StepSchedule],
    /// When it began, on the drain clock.
    pub(crate) start: Duration,
    /// Its schedule may be acted on now (see [`Deadlines::holds`]).
    pub(crate) holds: bool,
    /// The UIDs of the pods its schedule was split over.
    pub(crate) planned: &'a HashSet<String>,
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PassSnapshot<'a> {
    /// Now, on the drain clock.
    pub(crate) now: Duration,
    /// The maintenances that select the node, oldest first.
    pub(crate) maintenances: &'a [MaintenanceFacts<'a>],
    /// The draining ones whose plan can be used, oldest first.
    pub(crate) draining: &'a [MaintenanceInput<'a>],
    pub(crate) shutdown: Option<ShutdownFacts<'a>>,
    /// The node's targets so far (its status entries and earlier passes).
    pub(crate) previous: Option<&'a DrainTargets>,
    pub(crate) pods: &'a [NodePod],
    /// By pod UID.
    pub(crate) tracks: &'a HashMap<String, PodTrack>,
    /// The eviction back-off cap outside a shutdown, and under one.
    pub(crate) backoff_cap: Duration,
    pub(crate) backoff_cap_shutdown: Duration,
    /// When the node's drain began, whole Unix seconds.
    pub(crate) drain_began: Option<i64>,
    /// DaemonSet UID -> the UID of its tolerate-all pod this drain terminated.
    pub(crate) daemonset_terminated: &'a HashMap<String, String>,
    /// The budgets that refused evictions, by `namespace/name`, as last watched.
    pub(crate) budgets: &'a HashMap<String, BudgetStatus>,
    /// What the node itself shows of its terminating pods; None: it was not asked.
    pub(crate) node_view: Option<&'a NodeView>,
}

/// One request for a pod (gates aside): what, and for which maintenance.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PodRequest {
    pub(crate) pod: PodInfo,
    /// Evict, Delete or Escalate.
    pub(crate) action: Action,
    /// The first draining maintenance whose targets take the pod (the one it is asked for).
    pub(crate) maintenance: String,
    /// A tolerate-all DaemonSet pod deleted now: its DaemonSet's UID (its later pods are
    /// replacements, left alone).
    pub(crate) tolerant_daemonset: Option<String>,
}

/// One maintenance's status entry to write this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatusWrite {
    pub(crate) name: String,
    /// Written now, past the debounce: the node is empty under this shutdown maintenance.
    pub(crate) force: bool,
}

/// When the shutdown's drain is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Done {
    NotYet,
    /// The node is empty under the shutdown maintenance: done once its status is written.
    OnceWritten,
    /// The shutdown maintenance was completed or deleted under the drain.
    Now,
}

impl Done {
    pub(crate) fn reached(self, statuses_written: bool) -> bool {
        match self {
            Done::NotYet => false,
            Done::OnceWritten => statuses_written,
            Done::Now => true,
        }
    }
}

/// [`decide`]'s answer.
#[derive(Debug, Clone)]
pub(crate) struct PassDecisions {
    pub(crate) drain: Decision,
    /// The eviction back-off cap in force (shorter while the shutdown drains).
    pub(crate) backoff_cap: Duration,
    /// The maintenance taint goes on before the requests: a DaemonSet pod is deleted.
    pub(crate) taint: bool,
    /// In plan order.
    pub(crate) requests: Vec<PodRequest>,
    /// Static pods whose manifests are gated.
    pub(crate) gates: Vec<PodInfo>,
    /// Mirror pods of gated static pods the node shows gone (`bandend::mirrors_to_delete`).
    pub(crate) mirrors: Vec<PodInfo>,
    /// The shutdown drains and no pod its plan targets is left.
    pub(crate) node_empty: bool,
    /// One per active maintenance, in their order.
    pub(crate) statuses: Vec<StatusWrite>,
    /// Maintenances whose Complete stage (or deletion) the node carries out.
    pub(crate) complete: Vec<String>,
    /// No maintenance drains the node: the drain forgets its targets and tracks.
    pub(crate) drain_over: bool,
    pub(crate) done: Done,
}

/// The pass's decisions (see the module documentation).
pub(crate) fn decide(s: &PassSnapshot<'_>) -> Result<PassDecisions, PlanError> {
    let shutdown = s
        .shutdown
        .filter(|c| s.draining.iter().any(|m| m.name == c.name));
    let backoff_cap = if shutdown.is_some() {
        s.backoff_cap_shutdown
    } else {
        s.backoff_cap
    };
    let decision = drain::decide(&drain::Snapshot {
        now: s.now,
        maintenances: s.draining,
        previous: s.previous,
        pods: s.pods,
        tracks: s.tracks,
        deadlines: shutdown.map(|c| Deadlines {
            step_targets: c.step_targets,
            schedule: c.schedule,
            start: c.start,
            holds: c.holds,
            planned: c.planned,
        }),
        backoff_cap,
        drain_began: s.drain_began,
        daemonset_terminated: s.daemonset_terminated,
        budgets: s.budgets,
        node_view: s.node_view,
    })?;

    let holder = |pod: &PodInfo| {
        let targets = &decision.evaluation.maintenance_targets;
        let i = targets.iter().position(|t| t.targets(pod)).unwrap_or(0);
        s.draining
            .get(i)
            .map(|m| m.name.to_owned())
            .unwrap_or_default()
    };
    let tolerant: HashMap<&str, &str> = s
        .pods
        .iter()
        .filter_map(|p| Some((p.info.uid.as_str(), p.tolerant_daemonset.as_deref()?)))
        .collect();
    let mut requests = Vec::new();
    let mut gates = Vec::new();
    for (pod, action) in &decision.actions {
        if *action == Action::Gate {
            gates.push(pod.clone());
            continue;
        }
        let tolerant_daemonset = matches!(action, Action::Delete { .. })
            .then(|| tolerant.get(pod.uid.as_str()).map(|o| (*o).to_owned()))
            .flatten();
        requests.push(PodRequest {
            pod: pod.clone(),
            action: *action,
            maintenance: holder(pod),
            tolerant_daemonset,
        });
    }

    let track_of = |pod: &PodInfo| drain::node_track(s.tracks, pod);
    let mirrors = bandend::mirrors_to_delete(&decision.pods, &track_of, s.node_view)
        .into_iter()
        .cloned()
        .collect();
    let node_empty = shutdown.is_some_and(|c| {
        c.step_targets
            .last()
            .is_none_or(|t| t.is_finished(&decision.pods))
    });
    let shutdown_name = shutdown.map(|c| c.name);
    let statuses = s
        .maintenances
        .iter()
        .filter(|m| m.active)
        .map(|m| StatusWrite {
            name: m.name.to_owned(),
            force: node_empty && shutdown_name == Some(m.name),
        })
        .collect();
    // Also one created at Complete, or moved there from Idle, which this node never saw
    // active: its entry says the node carried the stage out.
    let complete = s
        .maintenances
        .iter()
        .filter(|m| m.ending && (m.has_finalizer || !m.completed_here))
        .map(|m| m.name.to_owned())
        .collect();
    let shutdown_ended = s
        .shutdown
        .is_some_and(|c| s.maintenances.iter().any(|m| m.name == c.name && m.ending));
    let done = if shutdown_ended {
        Done::Now
    } else if node_empty {
        Done::OnceWritten
    } else {
        Done::NotYet
    };
    Ok(PassDecisions {
        taint: decision.deletes_daemonset_pods(),
        backoff_cap,
        requests,
        gates,
        mirrors,
        node_empty,
        statuses,
        complete,
        drain_over: s.draining.is_empty(),
        done,
        drain: decision,
    })
}

/// Delay before eviction attempt `attempt` (0-based) after refusals: 1 s doubling, capped.
pub(crate) fn backoff(attempt: u32, cap: Duration) -> Duration {
    super::backoff::Backoff::after(Duration::from_secs(1), cap, attempt)
}

/// What the apiserver (or the terminator) answered to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Accepted,
    /// 404: taken as gone only once the watch drops it.
    Gone,
    /// Refused, by this budget or for this reason; `budget`: the PodDisruptionBudget's
    /// `namespace/name` when the apiserver named it.
    Blocked {
        by: String,
        budget: Option<String>,
    },
    /// 429 that is not a budget's: the apiserver did not look at the request.
    Throttled {
        wait: Duration,
    },
    /// Failed; `answered`: the apiserver answered (and refused) rather than not being
    /// reached.
    Failed {
        answered: bool,
    },
}

/// What [`note_answer`] found worth telling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Noted {
    /// Ask again then (drain clock), whatever the watches say.
    pub(crate) retry: Option<Duration>,
    /// An escalation the apiserver took.
    pub(crate) escalated: bool,
    /// Blocked by something else than last time.
    pub(crate) newly_blocked: bool,
    /// The first 429 for this pod.
    pub(crate) first_throttle: bool,
}

/// Records `answer` for a pod in its track. `retry_after_error` is the pause after an
/// answer that says nothing of the pod; `jitter` in [0, 1) spreads a throttled band's
/// retries over the wait instead of sending them at once into the same throttle.
pub(crate) fn note_answer(
    track: &mut PodTrack,
    answer: &Answer,
    escalated: bool,
    now: Duration,
    cap: Duration,
    retry_after_error: Duration,
    jitter: f64,
) -> Noted {
    let mut noted = Noted::default();
    let mut retry_in = |track: &mut PodTrack, delay: Duration| {
        track.last_try = Some((now, delay));
        noted.retry = Some(now + delay);
    };
    match answer {
        Answer::Accepted => {
            track.asked = true;
            track.accepted = true;
            track.blocked_by = None;
            track.budget = None;
            track.budget_since = None;
            if escalated {
                track.escalated = true;
                noted.escalated = true;
            }
        }
        Answer::Gone => {
            // Not taken as done: an apiserver that just restarted answers 404 for a pod it
            // still has. Gone, the watch drops it before the retry; still there and not
            // terminating, it is asked again.
            track.asked = true;
            track.escalated |= escalated;
            retry_in(track, retry_after_error);
        }
        Answer::Blocked { by, budget } => {
            track.asked = true;
            let delay = backoff(track.attempts, cap);
            track.attempts += 1;
            retry_in(track, delay);
            noted.newly_blocked = track.blocked_by.as_deref() != Some(by.as_str());
            track.blocked_by = Some(by.clone());
            if track.budget != *budget || track.budget_since.is_none() {
                track.budget_since = budget.as_ref().map(|_| now);
            }
            track.budget = budget.clone();
        }
        Answer::Throttled { wait } => {
            // Not asked (so not escalated for it), and no back-off earned.
            retry_in(track, wait.mul_f64(1.0 + jitter.clamp(0.0, 1.0)));
            noted.first_throttle = track.throttled == 0;
            track.throttled = track.throttled.saturating_add(1);
        }
        Answer::Failed { answered } => {
            track.asked |= answered;
            retry_in(track, retry_after_error);
        }
    }
    noted
}

/// The node's entry in a maintenance's status, without its update time.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct NodeEntry {
    pub(crate) drain_targets: Vec<DrainPlanEntry>,
    pub(crate) pods_remaining: i32,
    pub(crate) active_eviction_requests: i32,
    pub(crate) pods_pending_eviction_request: i32,
    pub(crate) pods_not_targeted: i32,
    pub(crate) drain_message: String,
}

/// A draining maintenance's place in the pass, for its status entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EntryView<'a> {
    pub(crate) drained: bool,
    /// What the maintenance targets now.
    pub(crate) targets: &'a DrainTargets,
}

/// Blocked pods named in a drain message; the count of the others follows.
const MESSAGE_BLOCKED_MAX: usize = 5;

/// The node's entry in maintenance `name`'s status. `view`: None when the maintenance does
/// not drain the node (cordon only, or an invalid plan: `invalid_plan`). `replan`: the
/// shutdown's last re-plan, said after the drain message (the schema has no field for it:
/// a field a CRD installed earlier lacks would fail every status write).
pub(crate) fn node_entry(
    name: &str,
    node_targets: &DrainTargets,
    tracks: &HashMap<String, PodTrack>,
    pods: &[PodInfo],
    view: Option<EntryView<'_>>,
    invalid_plan: Option<&str>,
    replan: Option<&str>,
) -> NodeEntry {
    let mut entry = NodeEntry::default();
    let track = |p: &PodInfo| tracks.get(&p.uid);
    if let Some(v) = view {
        let targeted: Vec<&PodInfo> = node_targets.active_targeted(pods).collect();
        let requested = targeted
            .iter()
            .filter(|p| p.terminating || track(p).is_some_and(|t| t.accepted))
            .count();
        // Blocked: refused by the Eviction API (the direct path, or the eviction-request
        // controller on the EvictionRequest path) and not yet going.
        let blocked: Vec<String> = targeted
            .iter()
            .filter(|p| !p.terminating)
            .filter_map(|p| {
                let by = track(p)?.blocked_by.as_ref()?;
                Some(format!("{} by {by}", p.key()))
            })
            .collect();
        entry.drain_targets = node_targets.to_entries();
        entry.pods_remaining = count(targeted.len());
        entry.active_eviction_requests = count(requested);
        entry.pods_pending_eviction_request = count(targeted.len() - requested);
        entry.pods_not_targeted = count(
            pods.iter()
                .filter(|p| p.is_active() && !node_targets.targets(p))
                .count(),
        );
        let limited = !node_targets.covers(v.targets);
        entry.drain_message = if !targeted.is_empty() {
            if !blocked.is_empty() {
                let shown = blocked[..blocked.len().min(MESSAGE_BLOCKED_MAX)].join("; ");
                match blocked.len().saturating_sub(MESSAGE_BLOCKED_MAX) {
                    0 => format!("Draining: eviction blocked for {shown}"),
                    more => format!("Draining: eviction blocked for {shown}; and {more} more"),
                }
            } else if limited {
                "Draining (limited by another maintenance)".into()
            } else {
                "Draining".into()
            }
        } else if v.drained {
            "Drained".into()
        } else if limited {
            "Waiting for another maintenance.".into()
        } else {
            format!("Waiting for {name}.")
        };
    } else {
        entry.drain_message = match invalid_plan {
            Some(err) => format!("Invalid drainPlan, not drained: {err}"),
            None => "Cordoned".into(),
        };
        entry.pods_not_targeted = count(pods.iter().filter(|p| p.is_active()).count());
    }
    if let Some(replan) = replan {
        entry.drain_message = format!("{}; {replan}", entry.drain_message);
    }
    entry
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests;
