//! KEP-4212 drain targets: which pods a maintenance (or a node) targets now, when a target is
//! finished, when a maintenance advances, how intersecting maintenances combine on a node
//! (least powerful wins, never backtracking) and the drain messages of the KEP's example.
//!
//! A drain target is the cumulative effect of a plan prefix. It holds at most one entry per
//! (pod type, selector): the plain entry of a type targets every pod of that type up to its
//! priority; a selector entry targets the matching pods up to its (never lower) priority. This
//! is the shape of the KEP's "PodTypes and Label Selectors Progression" example.

use std::collections::{BTreeMap, BTreeSet};

use super::bandend::BandEnd;
use super::drainplan::{compile_plan, CompiledEntry, PlanError};
use super::selector::Selector;
use super::{DrainPlanEntry, PodInfo, PodType};

type Key = (PodType, Option<Selector>);

/// A set of drain targets (the KEP's `drainTargets` / `reachedDrainTargets`). Equality is
/// semantic: two target sets are equal when each covers the other.
#[derive(Debug, Clone, Default)]
pub(crate) struct DrainTargets {
    entries: BTreeMap<Key, i32>,
}

impl PartialEq for DrainTargets {
    fn eq(&self, other: &Self) -> bool {
        self.covers(other) && other.covers(self)
    }
}

impl DrainTargets {
    /// Targets nothing (a node before its first drain target).
    pub(crate) fn none() -> DrainTargets {
        DrainTargets::default()
    }

    /// Reads targets from a status field. Several entries for the same (type, selector) merge
    /// to the highest priority.
    pub(crate) fn from_entries(entries: &[DrainPlanEntry]) -> Result<DrainTargets, PlanError> {
        let mut t = DrainTargets::none();
        for (i, e) in entries.iter().enumerate() {
            let c = CompiledEntry::compile(i, e)?;
            let p = t
                .entries
                .entry((c.pod_type, c.selector))
                .or_insert(c.priority);
            *p = (*p).max(c.priority);
        }
        t.raise_selectors_to_plain();
        Ok(t)
    }

    /// The targets of a maintenance whose current entry is `plan[index]`: everything targeted by
    /// `plan[..=index]`. Selector entries of a reached type appear at least at the type's plain
    /// priority, as in the KEP's progression example. `plan` should be normalized; an index past
    /// the end means the whole plan.
    pub(crate) fn for_plan(
        plan: &[DrainPlanEntry],
        index: usize,
    ) -> Result<DrainTargets, PlanError> {
        let compiled = compile_plan(plan)?;
        Ok(Self::for_compiled_plan(&compiled, index))
    }

    pub(crate) fn for_compiled_plan(plan: &[CompiledEntry], index: usize) -> DrainTargets {
        let reached = &plan[..plan.len().min(index.saturating_add(1))];
        let mut t = DrainTargets::none();
        for e in reached {
            let p = t
                .entries
                .entry((e.pod_type, e.selector.clone()))
                .or_insert(e.priority);
            *p = (*p).max(e.priority);
        }
        for e in plan {
            if let (Some(sel), Some(&plain)) = (&e.selector, t.entries.get(&(e.pod_type, None))) {
                t.entries
                    .entry((e.pod_type, Some(sel.clone())))
                    .or_insert(plain);
            }
        }
        t.raise_selectors_to_plain();
        t
    }

    fn raise_selectors_to_plain(&mut self) {
        let plains: BTreeMap<PodType, i32> = self
            .entries
            .iter()
            .filter(|((_, s), _)| s.is_none())
            .map(|((t, _), p)| (*t, *p))
            .collect();
        for ((t, _), p) in self.entries.iter_mut() {
            if let Some(&plain) = plains.get(t) {
                *p = (*p).max(plain);
            }
        }
    }

    /// The status form: by pod type, the plain entry first, then selector entries.
    pub(crate) fn to_entries(&self) -> Vec<DrainPlanEntry> {
        self.entries
            .iter()
            .map(|((t, s), p)| DrainPlanEntry {
                pod_selector: s.as_ref().map(|s| s.label_selector().clone()),
                pod_priority: *p,
                pod_type: *t,
            })
            .collect()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The highest priority targeted for (type, selector); None when nothing of it is targeted.
    fn level(&self, t: PodType, s: &Option<Selector>) -> Option<i32> {
        let plain = self.entries.get(&(t, None)).copied();
        let own = s
            .as_ref()
            .and_then(|_| self.entries.get(&(t, s.clone())).copied());
        plain.max(own)
    }

    fn keys_with<'a>(&'a self, other: &'a DrainTargets) -> BTreeSet<&'a Key> {
        self.entries.keys().chain(other.entries.keys()).collect()
    }

    /// Whether `pod` is targeted, whatever its phase.
    pub(crate) fn targets(&self, pod: &PodInfo) -> bool {
        self.entries.iter().any(|((t, s), p)| {
            *t == pod.pod_type
                && pod.priority <= *p
                && s.as_ref().is_none_or(|s| s.matches(&pod.labels))
        })
    }

    /// Active (non-terminal) pods targeted; terminating pods are active.
    pub(crate) fn active_targeted<'a>(
        &'a self,
        pods: &'a [PodInfo],
    ) -> impl Iterator<Item = &'a PodInfo> + 'a {
        pods.iter()
            .filter(move |p| p.is_active() && self.targets(p))
    }

    /// Finished on a node: no active targeted pod is left. Terminal pods are ignored.
    pub(crate) fn is_finished(&self, pods: &[PodInfo]) -> bool {
        self.active_targeted(pods).next().is_none()
    }

    /// Its band is over on a node: no targeted pod holds it ([`BandEnd`]).
    pub(crate) fn band_ended(&self, pods: &[PodInfo], band: &BandEnd) -> bool {
        !pods.iter().any(|p| band.holds(p) && self.targets(p))
    }

    /// Targets at least everything `other` targets.
    pub(crate) fn covers(&self, other: &DrainTargets) -> bool {
        self.keys_with(other)
            .into_iter()
            .all(|(t, s)| other.level(*t, s) <= self.level(*t, s))
    }

    fn combine(
        &self,
        other: &DrainTargets,
        f: fn(Option<i32>, Option<i32>) -> Option<i32>,
    ) -> DrainTargets {
        let entries = self
            .keys_with(other)
            .into_iter()
            .filter_map(|(t, s)| {
                f(self.level(*t, s), other.level(*t, s)).map(|p| ((*t, s.clone()), p))
            })
            .collect();
        DrainTargets { entries }
    }

    /// A total order on targets consistent with inclusion (if `a` covers `b`, `b` ranks at most
    /// `a`): the plain levels of Static, DaemonSet, Default in turn, then how far the selector
    /// entries reach above their type's plain level.
    fn rank(&self) -> ([Option<i32>; 3], i128) {
        let plain = |t| self.entries.get(&(t, None)).copied();
        let extras = self
            .entries
            .iter()
            .filter(|((_, s), _)| s.is_some())
            .map(|((t, _), p)| {
                let base = plain(*t).map_or(i128::from(i32::MIN) - 1, i128::from);
                i128::from(*p) - base
            })
            .sum();
        (
            [
                plain(PodType::Static),
                plain(PodType::DaemonSet),
                plain(PodType::Default),
            ],
            extras,
        )
    }

    /// A conservative combination: targets a pod only if both target it (possibly fewer pods
    /// than the exact intersection when the two use different selectors).
    pub(crate) fn meet(&self, other: &DrainTargets) -> DrainTargets {
        self.combine(other, |a, b| a.min(b))
    }

    /// Targets every pod either targets.
    pub(crate) fn join(&self, other: &DrainTargets) -> DrainTargets {
        self.combine(other, |a, b| a.max(b))
    }
}

/// Per-node drain targets as the node engine writes them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeTargets {
    pub targets: DrainTargets,
    /// The maintenances whose targets do not go beyond the node's: the node's targets rise only
    /// when these advance. Store them with the node's status; other nodes' messages need them.
    pub holders: Vec<String>,
}

/// The least powerful of several targets: the one every other covers when there is one (always
/// so for plans without selectors, whose targets form a chain); otherwise, for targets made
/// incomparable by different selectors, the lowest in a total order consistent with inclusion,
/// the first (oldest) on a tie. An exact intersection would deadlock there: each maintenance
/// would wait for pods only the other one targets.
pub(crate) fn least_powerful<'a>(
    targets: impl IntoIterator<Item = &'a DrainTargets>,
) -> Option<&'a DrainTargets> {
    targets.into_iter().min_by_key(|t| t.rank())
}

/// The node's effective targets: the least powerful ([`least_powerful`]) of the targets of
/// every active maintenance selecting the node, never below `previous` (drain targets never
/// backtrack). With no maintenance the previous targets stay (the caller drops the node status
/// then). `maintenances` is (name, targets), oldest first.
pub(crate) fn node_targets(
    previous: Option<&DrainTargets>,
    maintenances: &[(&str, &DrainTargets)],
) -> NodeTargets {
    let meet = least_powerful(maintenances.iter().map(|(_, t)| *t)).cloned();
    let targets = match (previous, meet) {
        (Some(p), Some(m)) => p.join(&m),
        (Some(p), None) => p.clone(),
        (None, Some(m)) => m,
        (None, None) => DrainTargets::none(),
    };
    let holders = maintenances
        .iter()
        .filter(|(_, t)| targets.covers(t))
        .map(|(n, _)| n.to_string())
        .collect();
    NodeTargets { targets, holders }
}

/// The lowest targets among a maintenance's nodes (`status.drainStatus.reachedDrainTargets`).
pub(crate) fn reached_drain_targets<'a>(
    nodes: impl IntoIterator<Item = &'a DrainTargets>,
) -> DrainTargets {
    nodes
        .into_iter()
        .cloned()
        .reduce(|a, b| a.meet(&b))
        .unwrap_or_default()
}

/// One node's report to a maintenance, kept in that maintenance's `status.nodeStatuses`
/// (serialized as `planIndex` and `finished`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub(crate) struct NodeReport {
    /// The plan entry of the maintenance the node evaluated.
    #[serde(rename = "planIndex")]
    pub index: usize,
    /// No active pod targeted by the maintenance's targets at `index` is left on the node.
    pub finished: bool,
}

/// Where a maintenance stands in its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanPosition {
    /// The current entry (targets = `DrainTargets::for_plan(plan, index)`).
    pub index: usize,
    /// Every node finished the last entry: the maintenance is drained.
    pub drained: bool,
}

/// The current entry of a maintenance from the reports of every node it selects (None: the
/// node has not reported yet). The base is the highest index reported, so it never goes back;
/// it moves to the next entry only when every node reports the base entry finished.
pub(crate) fn plan_position(plan_len: usize, reports: &[Option<NodeReport>]) -> PlanPosition {
    let last = plan_len.saturating_sub(1);
    let base = reports
        .iter()
        .flatten()
        .map(|r| r.index)
        .max()
        .unwrap_or(0)
        .min(last);
    let all_finished = !reports.is_empty()
        && reports
            .iter()
            .all(|r| r.is_some_and(|r| r.index >= base && r.finished));
    match (all_finished, base < last) {
        (true, true) => PlanPosition {
            index: base + 1,
            drained: false,
        },
        (true, false) => PlanPosition {
            index: base,
            drained: true,
        },
        (false, _) => PlanPosition {
            index: base,
            drained: false,
        },
    }
}

#[cfg(test)]
/// For a maintenance selecting only this node (the shutdown maintenance): skip every entry that
/// is already finished at once, instead of one status round trip per entry.
pub(crate) fn fast_forward(
    plan: &[DrainPlanEntry],
    index: usize,
    pods: &[PodInfo],
) -> Result<PlanPosition, PlanError> {
    let compiled = compile_plan(plan)?;
    let last = compiled.len().saturating_sub(1);
    let mut index = index.min(last);
    loop {
        if !DrainTargets::for_compiled_plan(&compiled, index).is_finished(pods) {
            return Ok(PlanPosition {
                index,
                drained: false,
            });
        }
        if index >= last {
            return Ok(PlanPosition {
                index,
                drained: true,
            });
        }
        index += 1;
    }
}

/// One active maintenance selecting this node, as the node engine reads it.
#[derive(Debug, Clone)]
pub(crate) struct MaintenanceInput<'a> {
    pub name: &'a str,
    /// `spec.drainPlan`, normalized.
    pub plan: &'a [DrainPlanEntry],
    /// The reports of every node the maintenance selects, from its status (None: no report yet).
    pub reports: Vec<Option<NodeReport>>,
    /// Which of `reports` is this node's.
    pub own: usize,
}

/// What the node engine decides for its node.
#[derive(Debug, Clone)]
pub(crate) struct NodeEvaluation {
    /// The node's effective targets and holders (write to the node's status entries).
    pub node: NodeTargets,
    /// Per maintenance, in input order: its position as far as this node can tell, its
    /// targets, and this node's new report for it.
    pub positions: Vec<PlanPosition>,
    pub maintenance_targets: Vec<DrainTargets>,
    // The engine writes its status entries itself; the multi-node model tests read these.
    #[cfg_attr(not(test), allow(dead_code))]
    pub reports: Vec<NodeReport>,
    /// Active pods to terminate now (targeted by the effective targets), in plan order: by pod
    /// type, then ascending priority.
    pub to_terminate: Vec<PodInfo>,
}

#[cfg(test)]
impl NodeEvaluation {
    /// The node still has active targeted pods.
    pub(crate) fn draining(&self) -> bool {
        !self.to_terminate.is_empty()
    }
}

/// The node engine's decision for its own node: every maintenance's position (advancing past
/// entries this node finishes whenever the other nodes' reports allow it, so a maintenance of
/// this node alone runs through finished entries at once), the effective targets (never below
/// `previous`) and this node's reports. `maintenances` oldest first.
pub(crate) fn evaluate_node(
    previous: Option<&DrainTargets>,
    maintenances: &[MaintenanceInput<'_>],
    pods: &[PodInfo],
    band: &BandEnd,
) -> Result<NodeEvaluation, PlanError> {
    let plans = maintenances
        .iter()
        .map(|m| compile_plan(m.plan))
        .collect::<Result<Vec<_>, _>>()?;
    let mut reports: Vec<Vec<Option<NodeReport>>> =
        maintenances.iter().map(|m| m.reports.clone()).collect();
    let mut previous = previous.cloned();
    // Each pass either advances a position or stops; positions are bounded by plan lengths.
    let bound = plans.iter().map(Vec::len).sum::<usize>() + 2;
    for _ in 0..bound {
        let positions: Vec<PlanPosition> = plans
            .iter()
            .zip(&reports)
            .map(|(p, r)| plan_position(p.len(), r))
            .collect();
        let targets: Vec<DrainTargets> = plans
            .iter()
            .zip(&positions)
            .map(|(p, pos)| DrainTargets::for_compiled_plan(p, pos.index))
            .collect();
        let named: Vec<(&str, &DrainTargets)> =
            maintenances.iter().map(|m| m.name).zip(&targets).collect();
        let node = node_targets(previous.as_ref(), &named);
        let own: Vec<NodeReport> = positions
            .iter()
            .zip(&targets)
            .map(|(pos, t)| NodeReport {
                index: pos.index,
                finished: t.band_ended(pods, band),
            })
            .collect();
        let mut changed = false;
        for ((m, r), new) in maintenances.iter().zip(reports.iter_mut()).zip(&own) {
            if let Some(slot) = r.get_mut(m.own) {
                if *slot != Some(*new) {
                    *slot = Some(*new);
                    changed = true;
                }
            }
        }
        let next_positions: Vec<PlanPosition> = plans
            .iter()
            .zip(&reports)
            .map(|(p, r)| plan_position(p.len(), r))
            .collect();
        if !changed || next_positions == positions {
            let mut to_terminate: Vec<PodInfo> =
                node.targets.active_targeted(pods).cloned().collect();
            to_terminate.sort_by_key(|p| (p.pod_type, p.priority));
            return Ok(NodeEvaluation {
                node,
                positions,
                maintenance_targets: targets,
                reports: own,
                to_terminate,
            });
        }
        previous = Some(node.targets);
    }
    Err(PlanError::NotNormalized(
        "node evaluation did not settle".into(),
    ))
}

#[cfg(test)]
/// How one node of a maintenance stands, as read from the maintenance's status.
#[derive(Debug, Clone)]
pub(crate) struct NodeProgress<'a> {
    /// The node's effective targets.
    pub targets: &'a DrainTargets,
    /// Finished the maintenance's current targets.
    pub finished: bool,
    /// Has active pods under its effective targets (pending + active eviction requests > 0).
    pub draining: bool,
    /// The node's holders (see [`NodeTargets::holders`]).
    pub holders: &'a [String],
}

#[cfg(test)]
/// Why a maintenance has not advanced yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Blockers {
    /// Some node still drains pods within the maintenance's own targets.
    pub draining_self: bool,
    /// Maintenances holding some node of this one below its targets.
    pub limited_by: Vec<String>,
    /// Some node of the maintenance is draining at all.
    pub any_node_draining: bool,
    /// Nothing left: at the last entry and every node finished.
    pub complete: bool,
}

#[cfg(test)]
impl Blockers {
    /// Who has to make progress before this maintenance can advance.
    pub(crate) fn waiting_for(&self, own_name: &str) -> Vec<String> {
        let mut names = self.limited_by.clone();
        if self.draining_self || names.is_empty() {
            push_unique(&mut names, own_name);
        }
        names
    }
}

#[cfg(test)]
fn push_unique(names: &mut Vec<String>, name: &str) {
    if !names.iter().any(|n| n == name) {
        names.push(name.to_string());
    }
}

#[cfg(test)]
/// Computes what holds a maintenance back: for each of its nodes not finished with its
/// targets, either the maintenance itself drains there, or the node's holders keep the node
/// below the maintenance's targets.
pub(crate) fn maintenance_blockers(
    targets: &DrainTargets,
    at_last_entry: bool,
    nodes: &[NodeProgress<'_>],
) -> Blockers {
    let mut b = Blockers {
        any_node_draining: nodes.iter().any(|n| n.draining),
        ..Blockers::default()
    };
    for n in nodes.iter().filter(|n| !n.finished) {
        if n.targets.covers(targets) {
            b.draining_self = true;
        } else {
            for h in n.holders {
                push_unique(&mut b.limited_by, h);
            }
        }
    }
    b.complete = at_last_entry && nodes.iter().all(|n| n.finished);
    b
}

#[cfg(test)]
/// `status.drainStatus.drainMessage` of a maintenance. `older` names the maintenances created
/// before it: as in the KEP's example, a maintenance reports being limited only by older ones
/// (a newer maintenance that holds it back shows on the node instead).
pub(crate) fn maintenance_message(name: &str, blockers: &Blockers, older: &[&str]) -> String {
    if blockers.complete {
        return "Drained".into();
    }
    if blockers.any_node_draining {
        let limited: Vec<&str> = blockers
            .limited_by
            .iter()
            .map(String::as_str)
            .filter(|n| older.contains(n))
            .collect();
        return draining_message(&limited);
    }
    waiting_message(&blockers.waiting_for(name))
}

#[cfg(test)]
/// The node's `drainMessage`. `oldest` is the targets of the oldest active maintenance on the
/// node: a draining node is "limited" when it is held below them (the KEP's example reads the
/// node from its oldest maintenance's point of view). `holder_blockers` has the blockers of
/// each of `node.holders`, in the same order.
pub(crate) fn node_message(
    node: &NodeTargets,
    draining: bool,
    oldest: Option<&DrainTargets>,
    holder_blockers: &[(&str, &Blockers)],
) -> String {
    if draining {
        let held = oldest.is_some_and(|o| !node.targets.covers(o));
        let limited: Vec<&str> = if held {
            node.holders.iter().map(String::as_str).collect()
        } else {
            Vec::new()
        };
        return draining_message(&limited);
    }
    if holder_blockers.iter().all(|(_, b)| b.complete) {
        return "Drained".into();
    }
    let mut waiting = Vec::new();
    for (name, b) in holder_blockers.iter().filter(|(_, b)| !b.complete) {
        for w in b.waiting_for(name) {
            push_unique(&mut waiting, &w);
        }
    }
    waiting_message(&waiting)
}

#[cfg(test)]
fn draining_message(limited_by: &[&str]) -> String {
    if limited_by.is_empty() {
        "Draining".into()
    } else {
        format!("Draining (limited by {})", limited_by.join(", "))
    }
}

#[cfg(test)]
fn waiting_message(names: &[String]) -> String {
    format!("Waiting for {}.", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::drainplan::normalize_drain_plan;
    use crate::plan::testutil::{entry, pod, pod_l, sel_entry};

    fn t(plan: &[DrainPlanEntry], i: usize) -> DrainTargets {
        DrainTargets::for_plan(plan, i).unwrap()
    }

    #[test]
    fn targets_match_type_priority_and_selector() {
        let targets = DrainTargets::from_entries(&[
            entry(PodType::Default, 100),
            sel_entry(PodType::Default, 500, "app", "db"),
        ])
        .unwrap();
        assert!(targets.targets(&pod("a", PodType::Default, 100)));
        assert!(!targets.targets(&pod("b", PodType::Default, 101)));
        assert!(targets.targets(&pod_l("c", PodType::Default, 500, "app", "db")));
        assert!(!targets.targets(&pod_l("d", PodType::Default, 501, "app", "db")));
        assert!(!targets.targets(&pod_l("e", PodType::Default, 300, "app", "web")));
        assert!(
            !targets.targets(&pod("f", PodType::DaemonSet, 0)),
            "type must match"
        );
    }

    #[test]
    fn finished_ignores_terminal_and_counts_terminating() {
        let targets = DrainTargets::from_entries(&[entry(PodType::Default, 100)]).unwrap();
        let mut done = pod("a", PodType::Default, 1);
        done.terminal = true;
        let untargeted = pod("b", PodType::Default, 1000);
        assert!(targets.is_finished(&[done.clone(), untargeted.clone()]));
        let mut leaving = pod("c", PodType::Default, 5);
        leaving.terminating = true;
        assert!(!targets.is_finished(&[done, untargeted, leaving]));
    }

    #[test]
    fn kep_selector_progression() {
        // The KEP's "PodTypes and Label Selectors Progression" example, entry by entry.
        let plan = vec![
            entry(PodType::Default, 1000),
            sel_entry(PodType::Default, 2000, "app", "postgres"),
            entry(PodType::Default, i32::MAX),
            entry(PodType::DaemonSet, 1000),
            entry(PodType::DaemonSet, i32::MAX),
            entry(PodType::Static, i32::MAX),
        ];
        let shown = |i: usize| -> Vec<(PodType, i32, bool)> {
            t(&plan, i)
                .to_entries()
                .iter()
                .map(|e| (e.pod_type, e.pod_priority, e.pod_selector.is_some()))
                .collect()
        };
        use PodType::*;
        let max = i32::MAX;
        assert_eq!(shown(0), [(Default, 1000, false), (Default, 1000, true)]);
        assert_eq!(shown(1), [(Default, 1000, false), (Default, 2000, true)]);
        assert_eq!(shown(2), [(Default, max, false), (Default, max, true)]);
        assert_eq!(
            shown(3),
            [
                (Default, max, false),
                (Default, max, true),
                (DaemonSet, 1000, false)
            ]
        );
        assert_eq!(
            shown(4),
            [
                (Default, max, false),
                (Default, max, true),
                (DaemonSet, max, false)
            ]
        );
        assert_eq!(
            shown(5),
            [
                (Default, max, false),
                (Default, max, true),
                (DaemonSet, max, false),
                (Static, max, false)
            ]
        );
        let pg = pod_l("pg", Default, 1500, "app", "postgres");
        assert!(!t(&plan, 0).targets(&pg));
        assert!(t(&plan, 1).targets(&pg));
    }

    #[test]
    fn selector_first_without_plain_entry() {
        let plan =
            normalize_drain_plan(&[sel_entry(PodType::Default, 50, "tier", "batch")]).unwrap();
        let first = t(&plan, 0);
        assert!(first.targets(&pod_l("b", PodType::Default, 50, "tier", "batch")));
        assert!(!first.targets(&pod("x", PodType::Default, 0)));
        assert!(t(&plan, 1).targets(&pod("x", PodType::Default, 0)));
    }

    #[test]
    fn meet_join_and_covers() {
        let low = DrainTargets::from_entries(&[entry(PodType::Default, 5000)]).unwrap();
        let high = DrainTargets::from_entries(&[entry(PodType::Default, 10000)]).unwrap();
        let ds = DrainTargets::from_entries(&[
            entry(PodType::Default, i32::MAX),
            entry(PodType::DaemonSet, 3),
        ])
        .unwrap();
        assert_eq!(low.meet(&high), low);
        assert_eq!(low.join(&high), high);
        assert!(high.covers(&low) && !low.covers(&high));
        assert_eq!(
            ds.meet(&high),
            high,
            "a type missing on one side is not targeted"
        );
        assert!(DrainTargets::none().covers(&DrainTargets::none()));
        assert!(!DrainTargets::none().covers(&low));
    }

    #[test]
    fn node_targets_take_the_least_and_never_backtrack() {
        let a = DrainTargets::from_entries(&[entry(PodType::Default, 15000)]).unwrap();
        let b = DrainTargets::from_entries(&[entry(PodType::Default, 10000)]).unwrap();
        let c = DrainTargets::from_entries(&[entry(PodType::Default, 2000)]).unwrap();
        let first = node_targets(None, &[("a", &a), ("b", &b)]);
        assert_eq!(first.targets, b);
        assert_eq!(first.holders, ["b"]);
        let with_c = node_targets(Some(&first.targets), &[("a", &a), ("b", &b), ("c", &c)]);
        assert_eq!(
            with_c.targets, b,
            "maintenance-c must not pull the node back"
        );
        assert_eq!(with_c.holders, ["b", "c"]);
    }

    #[test]
    fn plan_position_advances_only_when_every_node_finished() {
        let r = |index, finished| Some(NodeReport { index, finished });
        assert_eq!(
            plan_position(3, &[r(0, true), r(0, false)]),
            PlanPosition {
                index: 0,
                drained: false
            }
        );
        assert_eq!(
            plan_position(3, &[r(0, true), None]),
            PlanPosition {
                index: 0,
                drained: false
            }
        );
        assert_eq!(
            plan_position(3, &[r(0, true), r(0, true)]),
            PlanPosition {
                index: 1,
                drained: false
            }
        );
        // A stale report for an earlier entry says nothing about the current one.
        assert_eq!(
            plan_position(3, &[r(1, true), r(0, true)]),
            PlanPosition {
                index: 1,
                drained: false
            }
        );
        assert_eq!(
            plan_position(3, &[r(2, true), r(2, true)]),
            PlanPosition {
                index: 2,
                drained: true
            }
        );
        assert_eq!(
            plan_position(3, &[]),
            PlanPosition {
                index: 0,
                drained: false
            }
        );
    }

    #[test]
    fn fast_forward_skips_finished_entries() {
        let plan =
            normalize_drain_plan(&[entry(PodType::Default, 10), entry(PodType::Default, 20)])
                .unwrap();
        let pods = vec![pod("a", PodType::Default, 1_500_000_000)];
        assert_eq!(
            fast_forward(&plan, 0, &pods).unwrap(),
            PlanPosition {
                index: 3,
                drained: false
            }
        );
        assert_eq!(
            fast_forward(&plan, 0, &[]).unwrap(),
            PlanPosition {
                index: plan.len() - 1,
                drained: true
            }
        );
    }

    #[test]
    fn evaluate_node_runs_a_single_node_maintenance_through_finished_entries() {
        let plan = normalize_drain_plan(&[]).unwrap();
        let mut pods = vec![
            pod("critical", PodType::Default, 2_000_000_000),
            pod("web", PodType::Default, 0),
            pod("proxy", PodType::DaemonSet, 2_000_001_000),
            pod("etcd", PodType::Static, 2_000_001_000),
        ];
        let mut previous: Option<DrainTargets> = None;
        let mut report = None;
        let mut order = Vec::new();
        for _ in 0..6 {
            let input = MaintenanceInput {
                name: "shutdown-n1",
                plan: &plan,
                reports: vec![report],
                own: 0,
            };
            let eval =
                evaluate_node(previous.as_ref(), &[input], &pods, &BandEnd::by_api(&pods)).unwrap();
            report = Some(eval.reports[0]);
            previous = Some(eval.node.targets.clone());
            if !eval.draining() {
                assert!(eval.positions[0].drained);
                break;
            }
            let names: Vec<String> = eval.to_terminate.iter().map(|p| p.name.clone()).collect();
            order.push(names.join(","));
            pods.retain(|p| !eval.to_terminate.contains(p));
        }
        assert_eq!(order, ["web", "critical", "proxy", "etcd"]);
        assert!(pods.is_empty());
    }

    #[test]
    fn evaluate_node_waits_for_the_other_nodes() {
        let plan = normalize_drain_plan(&[entry(PodType::Default, 100)]).unwrap();
        let pods = vec![pod("late", PodType::Default, 500)];
        let other = Some(NodeReport {
            index: 0,
            finished: false,
        });
        let input = MaintenanceInput {
            name: "m",
            plan: &plan,
            reports: vec![other, None],
            own: 1,
        };
        let eval = evaluate_node(
            None,
            std::slice::from_ref(&input),
            &pods,
            &BandEnd::by_api(&pods),
        )
        .unwrap();
        assert_eq!(eval.positions[0].index, 0);
        assert_eq!(
            eval.reports[0],
            NodeReport {
                index: 0,
                finished: true
            }
        );
        assert!(!eval.draining(), "the pod at 500 waits for the other node");
        let done = MaintenanceInput {
            reports: vec![
                Some(NodeReport {
                    index: 0,
                    finished: true,
                }),
                None,
            ],
            ..input
        };
        let eval = evaluate_node(None, &[done], &pods, &BandEnd::by_api(&pods)).unwrap();
        assert_eq!(eval.positions[0].index, 1);
        assert_eq!(eval.to_terminate.len(), 1);
    }
}
