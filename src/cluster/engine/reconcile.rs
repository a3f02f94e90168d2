//! One pass of the reconcile loop: read the reflected state, decide, carry it out.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Resource, ResourceExt};
use tokio::time::Instant;

use crate::api::{NodeMaintenance, NodeMaintenanceNodeStatus, Stage};
use crate::cluster::gateway;
use crate::cluster::node::{
    cordon_patch, cordoned_by_nodegrace, lb_exclusion_patch, lifecycle_changes,
    maintenance_taint_patch, set_lifecycle_conditions, Lifecycle,
    PREVIOUS_UNSCHEDULABLE_ANNOTATION,
};
use crate::cluster::nodesel;
use crate::plan::bandend::{self, NodeView};
use crate::plan::drain::{self, deletion_due, NodePod};
use crate::plan::pass::{self, MaintenanceFacts, PassDecisions, PassSnapshot, ShutdownFacts};
use crate::plan::targets::MaintenanceInput;
use crate::plan::{normalize_drain_plan, DrainPlanEntry, DrainTargets, NodeReport, PodInfo};
use crate::state::PodCache;

use super::{
    describe_targets, drain_stopped, has_finalizer, is_active, is_deleting, is_draining, lock,
    merge_values, min_wake, shutdown_maintenance_name, tolerates_everything, DrainState, MaintView,
    Progress, Shared, COMPLETED_MESSAGE, NODE_LOOK_INTERVAL, POD_CACHE_DEBOUNCE,
};

/// Why the shutdown is planned again when pods arrive after its schedule was made.
fn arrived_cause(pods: &[PodInfo]) -> String {
    const NAMED: usize = 3;
    let mut names: Vec<String> = pods.iter().take(NAMED).map(PodInfo::key).collect();
    if pods.len() > NAMED {
        names.push(format!("{} more", pods.len() - NAMED));
    }
    format!(
        "{} pod(s) bound to the node after its schedule was made ({})",
        pods.len(),
        names.join(", ")
    )
}

/// When the node's drain began: the earliest Drain stage start (`status.stageStatuses`, else
/// the creation) among the draining maintenances that select it, in Unix seconds.
fn drain_began(draining: &[&Arc<NodeMaintenance>]) -> Option<i64> {
    draining
        .iter()
        .filter_map(|m| {
            let started = m
                .status
                .as_ref()
                .and_then(|s| s.stage_statuses.iter().find(|s| s.name == Stage::Drain))
                .and_then(|s| s.start_timestamp.as_ref())
                .or(m.metadata.creation_timestamp.as_ref())?;
            Some(started.0.as_second())
        })
        .min()
}

/// nodegrace's marks on the node, for [`pass::hold`].
fn node_marks(node: &Node) -> pass::NodeMarks {
    pass::NodeMarks {
        cordoned: cordon_patch(node).is_none(),
        shutdown_marked: lb_exclusion_patch(node, true).is_none()
            && maintenance_taint_patch(node, true).is_none(),
    }
}

/// How long the list of nodes a label-selected maintenance selects is used before it is read
/// again.
const SELECTED_NODES_TTL: Duration = Duration::from_secs(30);

/// What a pass read, for its applier.
struct Seen<'a> {
    node: &'a Arc<Node>,
    raw_pods: &'a [Arc<Pod>],
    classified: &'a [(Arc<Pod>, PodInfo)],
    prepared: &'a [Prepared],
    selecting: &'a [Arc<NodeMaintenance>],
    active: &'a [Arc<NodeMaintenance>],
    /// The shutdown maintenance's name, while one runs.
    shutdown: Option<&'a str>,
}

/// A draining maintenance as the drain decision reads it.
struct Prepared {
    m: Arc<NodeMaintenance>,
    name: String,
    plan: Vec<DrainPlanEntry>,
    reports: Vec<Option<NodeReport>>,
    own: usize,
}

impl Shared {
    pub(super) fn maybe_write_cache(
        &self,
        st: &mut DrainState,
        pods: &[PodInfo],
        wake: &mut Option<Instant>,
    ) {
        if st.cache_written.as_deref() == Some(pods) {
            st.cache_due = None;
            return;
        }
        let now = Instant::now();
        let due = *st.cache_due.get_or_insert(now + POD_CACHE_DEBOUNCE);
        if now < due {
            min_wake(wake, due);
            return;
        }
        st.cache_due = None;
        st.cache_written = Some(pods.to_vec());
        self.metrics
            .set_budget_needed(self.settings().reserves_needed(pods));
        let cache = PodCache {
            node: self.node.clone(),
            written_at: Some(chrono::Utc::now()),
            pods: pods.to_vec(),
        };
        let dir = self.settings().state_dir.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(err) = cache.store(&dir) {
                tracing::warn!(
                    error = crate::cluster::error_text(&err),
                    "writing the pod cache failed"
                );
            }
        });
    }

    /// One pass: a snapshot of the reflected state, the decisions of `plan::pass` on it,
    /// and their application. Returns when the loop must run again without a watch event
    /// (a back-off or deadline).
    pub(super) async fn reconcile(&self, st: &mut DrainState) -> Result<Option<Instant>> {
        let mut wake = None;
        let Some(node) = self.node_obj(st) else {
            if st.shutdown.cordon_awaited {
                let missing = format!("the Node {} does not exist", self.node);
                self.tell_progress(st, |p| p.cordon_refused = Some(missing));
            }
            return Ok(None);
        };
        let raw_pods: Vec<Arc<Pod>> = self
            .pods
            .state()
            .into_iter()
            .filter(|p| crate::plan::own::is_bound_to(p, &self.node))
            .collect();
        let classified = self.classify(&raw_pods);
        let all: Vec<PodInfo> = classified.iter().map(|(_, i)| i.clone()).collect();
        self.maybe_write_cache(st, &all, &mut wake);

        let selecting: Vec<Arc<NodeMaintenance>> = self
            .maintenance_objs(st)
            .into_iter()
            .filter(|m| nodesel::selects(&m.spec.node_selector, &node))
            .collect();
        let names: Vec<String> = selecting.iter().map(|m| m.name_any()).collect();
        let facts: Vec<MaintenanceFacts> = selecting
            .iter()
            .zip(&names)
            .map(|(m, name)| self.facts(m, name))
            .collect();
        let active: Vec<Arc<NodeMaintenance>> =
            selecting.iter().filter(|m| is_active(m)).cloned().collect();
        self.metrics
            .set_node_hold(cordoned_by_nodegrace(&node), active.len());
        let hold = pass::hold(&facts, node_marks(&node), st.shutdown.on());
        self.apply_hold(st, &node, &active, &hold).await?;

        let shutdown_name = shutdown_maintenance_name(&self.node);
        let draining: Vec<&Arc<NodeMaintenance>> = active
            .iter()
            .filter(|m| is_draining(m))
            .filter(|m| !drain_stopped(m, &shutdown_name, &st.shutdown))
            .collect();
        let previous = self.previous_targets(st, &draining);
        let prepared = self.prepare(st, &draining, previous.as_ref()).await?;
        let ctx_any = st.shutdown.ctx.clone();
        st.shutdown_replan = ctx_any
            .as_ref()
            .filter(|c| prepared.iter().any(|p| p.name == c.name))
            .and_then(|c| c.replanned.clone().map(|r| (c.name.clone(), r)));
        self.take_eviction_blocks(st, &node, &prepared);
        let now = self.epoch.elapsed();
        let node_pods = node_pods(&classified, now, &mut st.terminating_seen);
        let node_view = if !prepared.is_empty() {
            self.look_at_node(st, &all, &mut wake).await
        } else {
            None
        };
        let inputs: Vec<MaintenanceInput> = prepared
            .iter()
            .map(|p| MaintenanceInput {
                name: &p.name,
                plan: &p.plan,
                reports: p.reports.clone(),
                own: p.own,
            })
            .collect();
        let holds = ctx_any
            .as_ref()
            .is_some_and(|c| lock(&self.reach).schedule_holds(c.planned_at));
        let settings = self.settings();
        let decisions = pass::decide(&PassSnapshot {
            now,
            maintenances: &facts,
            draining: &inputs,
            shutdown: ctx_any.as_deref().map(|c| ShutdownFacts {
                name: &c.name,
                step_targets: &c.step_targets,
                schedule: &c.schedule,
                start: c.start.saturating_duration_since(self.epoch),
                holds,
                planned: &c.planned,
            }),
            previous: previous.as_ref(),
            pods: &node_pods,
            tracks: &st.tracks,
            backoff_cap: settings.drain.eviction_backoff_max,
            backoff_cap_shutdown: settings.drain.eviction_backoff_max_shutdown,
            drain_began: drain_began(&draining),
            daemonset_terminated: &st.daemonset_terminated,
            budgets: &st.budgets.statuses,
            node_view: node_view.as_ref(),
        })?;
        if let Some(ctx) = ctx_any.as_ref().filter(|_| holds) {
            if !decisions.drain.unplanned.is_empty() {
                let cause = arrived_cause(&decisions.drain.unplanned);
                st.shutdown.ctx = Some(Arc::new(self.replanned(ctx, Duration::ZERO, cause)));
                min_wake(&mut wake, Instant::now());
            }
        }
        let seen = Seen {
            node: &node,
            raw_pods: &raw_pods,
            classified: &classified,
            prepared: &prepared,
            selecting: &selecting,
            active: &active,
            shutdown: ctx_any.as_ref().map(|c| c.name.as_str()),
        };
        self.apply(st, &seen, decisions, &mut wake).await?;
        Ok(wake)
    }

    /// What the node shows of its terminating pods and gated static pods (`plan::bandend`),
    /// asked again [`NODE_LOOK_INTERVAL`] later while any is left: containers exit and volumes
    /// unmount without an event of the API's. Each tracked pod's track remembers what it saw.
    async fn look_at_node(
        &self,
        st: &mut DrainState,
        pods: &[PodInfo],
        wake: &mut Option<Instant>,
    ) -> Option<NodeView> {
        let view = st.node_view.clone()?;
        let looked: Vec<&PodInfo> = pods
            .iter()
            .filter(|p| bandend::worth_looking_at(p, drain::node_track(&st.tracks, p)))
            .collect();
        if looked.is_empty() {
            return None;
        }
        let uids: Vec<String> = looked
            .iter()
            .map(|p| bandend::node_uid(p).to_owned())
            .collect();
        let seen = view.look(&uids).await;
        tracing::trace!(node = %self.node, ?seen, "the node's view of its terminating pods");
        for pod in looked {
            if let Some(track) = st.tracks.get_mut(&pod.uid) {
                track.node.saw(seen.get(bandend::node_uid(pod)));
            }
        }
        min_wake(wake, Instant::now() + NODE_LOOK_INTERVAL);
        Some(seen)
    }

    /// A maintenance that selects the node, as `plan::pass` reads it.
    fn facts<'a>(&self, m: &NodeMaintenance, name: &'a str) -> MaintenanceFacts<'a> {
        MaintenanceFacts {
            name,
            active: is_active(m),
            ending: m.spec.stage == Stage::Complete || is_deleting(m),
            has_finalizer: has_finalizer(m),
            completed_here: m
                .node_status(&self.node)
                .is_some_and(|e| e.drain_message == COMPLETED_MESSAGE),
        }
    }

    /// Cordon, the shutdown's marks and finalizers: a maintenance that selects the node, or a
    /// shutdown under way, holds it. The shutdown's drain is told once the node is held, or
    /// that the apiserver refused it.
    async fn apply_hold(
        &self,
        st: &mut DrainState,
        node: &Node,
        active: &[Arc<NodeMaintenance>],
        hold: &pass::Hold,
    ) -> Result<()> {
        if hold.marks() {
            let again = node
                .annotations()
                .contains_key(PREVIOUS_UNSCHEDULABLE_ANNOTATION);
            let shutdown = hold.shutdown_marks;
            let what = if shutdown {
                "cordon for shutdown"
            } else {
                "cordon"
            };
            let written = self
                .patch_node_answer(st, what, |n| {
                    let cordon = cordon_patch(n);
                    if !shutdown {
                        return cordon;
                    }
                    let marks = merge_values(cordon, lb_exclusion_patch(n, true));
                    merge_values(marks, maintenance_taint_patch(n, true))
                })
                .await;
            if let Err(f) = written {
                // Only the cordon its drain waits for ends that drain through the cluster; one
                // refused later (the node uncordoned meanwhile) is tried again at each pass.
                if st.shutdown.cordon_awaited
                    && matches!(
                        f.kind,
                        gateway::Kind::Refused { .. } | gateway::Kind::NotFound
                    )
                {
                    self.tell_progress(st, |p| p.cordon_refused = Some(f.text()));
                }
                return Err(f.into());
            }
            if hold.cordon {
                let names: Vec<String> = active.iter().map(|m| m.name_any()).collect();
                let holder = if names.is_empty() {
                    "the shutdown".to_owned()
                } else {
                    names.join(", ")
                };
                let note = if again {
                    format!(
                        "node {} was uncordoned while {holder} is active: cordoned again",
                        self.node
                    )
                } else {
                    format!("node {} cordoned for {holder}", self.node)
                };
                self.event_both(
                    node,
                    active.first().map(|m| m.as_ref()),
                    again,
                    "Cordoned",
                    note,
                );
            }
        }
        if st.shutdown.on() {
            self.tell_progress(st, |p| p.cordoned = true);
            st.shutdown.cordon_awaited = false;
        }
        for m in active {
            if hold.add_finalizers.contains(&m.name_any()) {
                self.update_finalizer(st, m, true).await?;
            }
        }
        Ok(())
    }

    /// Reports to the shutdown's drain, once per change.
    fn tell_progress(&self, st: &DrainState, change: impl FnOnce(&mut Progress)) {
        if let Some(progress) = &st.shutdown.progress {
            progress.send_if_modified(|p| {
                let before = p.clone();
                change(p);
                before != *p
            });
        }
    }

    /// Carries a pass's decisions out, in order: requests, statuses, completions, and the
    /// end of the shutdown's drain.
    async fn apply(
        &self,
        st: &mut DrainState,
        seen: &Seen<'_>,
        d: PassDecisions,
        wake: &mut Option<Instant>,
    ) -> Result<()> {
        let node = seen.node;
        let by_name = |list: &[Arc<NodeMaintenance>], name: &str| {
            list.iter().find(|m| m.name_any() == name).cloned()
        };
        self.note_replacements(st, &d.drain.replacements, seen.raw_pods);
        let views = self.views(st, seen.prepared, &d.drain);
        self.admin_conditions(st, node, &views, &d.drain.pods)
            .await?;
        let retry = self
            .terminate(st, node, seen.classified, &d, &views)
            .await?;
        for at in d.drain.wake_at.into_iter().chain(retry) {
            min_wake(wake, self.epoch + at);
        }
        if !d.gates.is_empty() {
            // The node is looked at for the gated pods from the next pass on: no event of the
            // API's comes when the kubelet stops them.
            min_wake(wake, Instant::now() + NODE_LOOK_INTERVAL);
        }
        self.delete_mirrors(st, &d.mirrors).await;
        let pods = &d.drain.pods;

        if d.node_empty {
            let m = seen.shutdown.and_then(|n| by_name(seen.active, n));
            self.gate_unreadable_manifests(st, node, m.as_deref()).await;
        }
        let mut all_written = true;
        for w in &d.statuses {
            let Some(m) = by_name(seen.active, &w.name) else {
                continue;
            };
            let view = views.iter().find(|v| v.name == w.name);
            let written = self
                .write_status(st, node, &m, view, pods, w.force, wake)
                .await?;
            all_written &= written || !w.force;
        }

        if let Some((name, replan)) = st.shutdown_replan.clone() {
            if st.replan_announced.as_ref() != Some(&replan) {
                let m = by_name(seen.active, &name);
                self.event_both(node, m.as_deref(), true, "Replanned", replan.summary());
                st.replan_announced = Some(replan);
            }
        }

        for name in &d.complete {
            if let Some(m) = by_name(seen.selecting, name) {
                self.complete(st, node, &m, seen.active).await?;
            }
        }
        if d.drain_over {
            st.targets = DrainTargets::none();
            st.targets_since = None;
            st.tracks.clear();
            st.daemonset_terminated.clear();
            st.budgets.stop();
        } else {
            let wanted = st.tracks.values().filter_map(|t| t.budget.as_deref());
            self.watch_budgets(&mut st.budgets, wanted);
        }
        self.export_budget_blocking(st);

        self.publish_fallback(st, seen.selecting).await;

        if let Some(progress) = &st.shutdown.progress {
            if d.done.reached(all_written) && !progress.borrow().shutdown_done {
                progress.send_modify(|p| p.shutdown_done = true);
            }
        }
        Ok(())
    }

    /// The budget blocking longest, on the wall clock (none once the drain is over): the
    /// same date at every pass, not one read again from the clock each time.
    fn export_budget_blocking(&self, st: &DrainState) {
        let longest = drain::longest_blocking(st.tracks.values()).map(|(budget, since)| {
            let after_epoch = chrono::TimeDelta::from_std(since).unwrap_or_default();
            (budget, self.epoch_wall + after_epoch)
        });
        self.metrics.set_budget_blocking(longest);
    }

    /// The pods bound to the node with their classification; a pod that cannot be
    /// classified is left out (and said once).
    fn classify(&self, raw_pods: &[Arc<Pod>]) -> Vec<(Arc<Pod>, PodInfo)> {
        raw_pods
            .iter()
            .filter_map(|p| match PodInfo::from_pod(p) {
                Ok(info) => Some((p.clone(), info)),
                Err(err) => {
                    tracing::debug!(node = %self.node, error = %err, "ignoring a pod that cannot be classified");
                    None
                }
            })
            .collect()
    }

    /// The node's targets so far: what this engine reached, joined with its entry in every
    /// draining maintenance's status (a restarted daemon never backtracks).
    fn previous_targets(
        &self,
        st: &DrainState,
        draining: &[&Arc<NodeMaintenance>],
    ) -> Option<DrainTargets> {
        let mut previous: Option<DrainTargets> =
            (!st.targets.is_empty()).then(|| st.targets.clone());
        for m in draining {
            if let Some(t) = m
                .node_status(&self.node)
                .and_then(|e| DrainTargets::from_entries(&e.drain_targets).ok())
            {
                previous = Some(match previous {
                    Some(p) => p.join(&t),
                    None => t,
                });
            }
        }
        previous
    }

    /// Each draining maintenance's normalized plan and the reports of the nodes it selects.
    /// A maintenance whose plan is invalid is left out (and said once).
    async fn prepare(
        &self,
        st: &mut DrainState,
        draining: &[&Arc<NodeMaintenance>],
        previous: Option<&DrainTargets>,
    ) -> Result<Vec<Prepared>> {
        let prev = previous.cloned().unwrap_or_default();
        let mut out = Vec::new();
        // Node lists are kept only for maintenances still draining.
        st.selected_nodes
            .retain(|uid, _| draining.iter().any(|m| m.uid().as_deref() == Some(uid)));
        for m in draining {
            let name = m.name_any();
            let plan = match normalize_drain_plan(&m.spec.drain_plan) {
                Ok(p) => {
                    st.invalid_plans.remove(&name);
                    p
                }
                Err(err) => {
                    if st.announced.insert(format!("badplan/{name}")) {
                        tracing::warn!(node = %self.node, maintenance = %name, error = %err, "not draining for a maintenance with an invalid drain plan");
                        self.event(
                            m.object_ref(&()),
                            true,
                            "InvalidDrainPlan",
                            format!("node {} does not drain for {name}: {err}", self.node),
                        );
                    }
                    st.invalid_plans.insert(name, err.to_string());
                    continue;
                }
            };
            let steps = (0..plan.len())
                .map(|i| DrainTargets::for_plan(&plan, i))
                .collect::<Result<Vec<_>, _>>()?;
            let entry_report = |e: &NodeMaintenanceNodeStatus| {
                let t = DrainTargets::from_entries(&e.drain_targets).unwrap_or_default();
                let index = steps.iter().rposition(|s| t.covers(s)).unwrap_or(0);
                NodeReport {
                    index,
                    finished: e.pods_remaining == 0 && t.covers(&steps[index]),
                }
            };
            let mine = m.node_status(&self.node).map(entry_report).or_else(|| {
                Some(NodeReport {
                    index: steps.iter().rposition(|s| prev.covers(s)).unwrap_or(0),
                    finished: false,
                })
            });
            let entries = m
                .status
                .as_ref()
                .map(|s| s.node_statuses.as_slice())
                .unwrap_or_default();
            // Every node the maintenance selects reports before it advances: by name when
            // it pins them, else the nodes its labels select (read from the apiserver).
            let selected = match nodesel::exact_nodes(&m.spec.node_selector) {
                Some(names) => Some(names),
                None => self.selected_nodes(st, m).await,
            };
            let (reports, own) = match selected {
                Some(mut names) => {
                    if !names.contains(&self.node) {
                        names.push(self.node.clone());
                    }
                    let own = names.iter().position(|n| *n == self.node).unwrap_or(0);
                    let reports = names
                        .iter()
                        .map(|n| {
                            if *n == self.node {
                                mine
                            } else {
                                entries.iter().find(|e| e.node_name == *n).map(entry_report)
                            }
                        })
                        .collect();
                    (reports, own)
                }
                None => (
                    std::iter::once(mine)
                        .chain(
                            entries
                                .iter()
                                .filter(|e| e.node_name != self.node)
                                .map(|e| Some(entry_report(e))),
                        )
                        .collect(),
                    0,
                ),
            };
            out.push(Prepared {
                m: (*m).clone(),
                name,
                plan,
                reports,
                own,
            });
        }
        Ok(out)
    }

    /// The names of the nodes a label-selected maintenance selects, read from the apiserver
    /// at most every [`SELECTED_NODES_TTL`] (node labels change rarely). None when they
    /// cannot be read: the maintenance then advances on the nodes that reported.
    async fn selected_nodes(
        &self,
        st: &mut DrainState,
        m: &NodeMaintenance,
    ) -> Option<Vec<String>> {
        let key = m.uid().unwrap_or_default();
        if let Some((at, names)) = st.selected_nodes.get(&key) {
            if at.elapsed() < SELECTED_NODES_TTL {
                return Some(names.clone());
            }
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let mut params = ListParams::default();
        if let Some(q) = nodesel::label_query(&m.spec.node_selector) {
            params = params.labels(&q);
        }
        match api.list_metadata(&params).await {
            Ok(list) => {
                let mut names: Vec<String> = list
                    .items
                    .into_iter()
                    .filter_map(|meta| {
                        let node = Node {
                            metadata: meta.metadata,
                            ..Node::default()
                        };
                        nodesel::selects(&m.spec.node_selector, &node).then(|| node.name_any())
                    })
                    .collect();
                names.sort();
                st.selected_nodes
                    .insert(key, (Instant::now(), names.clone()));
                Some(names)
            }
            Err(err) => {
                tracing::debug!(node = %self.node, maintenance = %m.name_any(), error = %err, "listing the nodes a maintenance selects failed");
                st.selected_nodes.get(&key).map(|(_, n)| n.clone())
            }
        }
    }

    /// Each draining maintenance's position after the decision; the node's new targets are
    /// kept (and said when they change).
    fn views(
        &self,
        st: &mut DrainState,
        prepared: &[Prepared],
        decision: &drain::Decision,
    ) -> Vec<MaintView> {
        let eval = &decision.evaluation;
        let views: Vec<MaintView> = prepared
            .iter()
            .enumerate()
            .map(|(i, p)| MaintView {
                m: p.m.clone(),
                name: p.name.clone(),
                plan_len: p.plan.len(),
                index: eval.positions[i].index,
                drained: eval.positions[i].drained,
                targets: eval.maintenance_targets[i].clone(),
            })
            .collect();
        let nt = &eval.node;
        if !views.is_empty() && (st.targets_since.is_none() || nt.targets != st.targets) {
            if let Some(since) = st.targets_since {
                self.metrics
                    .band_finished(&describe_targets(&st.targets), since.elapsed());
            }
            st.targets_since = Some(Instant::now());
            tracing::info!(node = %self.node, targets = %describe_targets(&nt.targets), holders = ?nt.holders, "drain targets");
            st.targets = nt.targets.clone();
        }
        views
    }

    /// What the eviction-request controller found blocking pods since the last pass: into
    /// the tracks (the status names the blocker) and one event per new blocker.
    fn take_eviction_blocks(&self, st: &mut DrainState, node: &Node, prepared: &[Prepared]) {
        let reports: Vec<(String, Option<String>)> = st.eviction_blocks.drain().collect();
        let mut fresh: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (uid, by) in reports {
            let Some(track) = st.tracks.get_mut(&uid) else {
                continue;
            };
            if let Some(blocker) = by.as_ref().filter(|_| track.blocked_by != by) {
                let pod = self
                    .pods
                    .state()
                    .iter()
                    .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
                    .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
                    .unwrap_or_else(|| uid.clone());
                fresh.entry(blocker.clone()).or_default().push(pod);
            }
            track.blocked_by = by;
        }
        for (by, pods) in fresh {
            tracing::info!(node = %self.node, pods = ?pods, blocked_by = %by, "eviction blocked");
            self.event_both(
                node,
                prepared.first().map(|p| p.m.as_ref()),
                true,
                "EvictionBlocked",
                format!(
                    "eviction of {} pod(s) blocked by {by}; retrying with back-off: {}",
                    pods.len(),
                    pods.join(", ")
                ),
            );
        }
    }

    /// `DrainInProgress`, then `Drained`, while administrators' maintenances drain the node
    /// (before the first pod of a pass is asked to go); False again once none does. A
    /// shutdown's conditions are the shutdown's to write.
    async fn admin_conditions(
        &self,
        st: &mut DrainState,
        node: &Arc<Node>,
        views: &[MaintView],
        pods: &[PodInfo],
    ) -> Result<()> {
        if st.shutdown.on() {
            return Ok(());
        }
        let own = shutdown_maintenance_name(&self.node);
        let admin: Vec<&MaintView> = views.iter().filter(|v| v.name != own).collect();
        let names = admin
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let node_drained = st.targets.active_targeted(pods).next().is_none()
            && admin
                .iter()
                .all(|v| v.index + 1 >= v.plan_len && st.targets.covers(&v.targets));
        let (want, message) = if admin.is_empty() {
            (
                Lifecycle::AdminIdle,
                "no NodeMaintenance drains the node".to_string(),
            )
        } else if node_drained {
            (
                Lifecycle::AdminDrained,
                format!("nodegrace drained the node for NodeMaintenance {names}"),
            )
        } else {
            (
                Lifecycle::AdminDraining,
                format!("nodegrace drains the node for NodeMaintenance {names}"),
            )
        };
        if lifecycle_changes(node, want, &message).is_empty() {
            return Ok(());
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let r = set_lifecycle_conditions(&api, node, want, &message).await;
        match gateway::answer(self, r) {
            Ok(Some(written)) => {
                tracing::info!(node = %self.node, conditions = ?want, maintenances = %names, "node lifecycle conditions written");
                st.node_overlay = Some(st.watch_log.written(Arc::new(written)));
            }
            Ok(None) => {}
            Err(f) if f.apiserver_unusable() => return Err(f.into()),
            Err(f) => {
                if st.announced.insert(format!("conditions/{want:?}")) {
                    tracing::warn!(node = %self.node, error = f.text(), "writing the node's drain conditions failed");
                }
            }
        }
        Ok(())
    }

    /// Says once which tolerate-all DaemonSet pods came back and are left alone.
    fn note_replacements(&self, st: &mut DrainState, replacements: &[String], raw: &[Arc<Pod>]) {
        let fresh: Vec<String> = raw
            .iter()
            .filter(|p| {
                p.metadata
                    .uid
                    .as_ref()
                    .is_some_and(|u| replacements.contains(u))
            })
            .filter(|p| {
                st.announced
                    .insert(format!("replacement/{}", p.uid().unwrap_or_default()))
            })
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        if !fresh.is_empty() {
            tracing::info!(node = %self.node, pods = ?fresh, "DaemonSet pods that tolerate every taint came back after their termination: left running, not waited for");
        }
    }
}

/// The pods as the drain decision reads them, times on the drain clock (`now`). `seen` keeps
/// when each terminating pod (by UID) was first seen so, for [`deletion_due`].
fn node_pods(
    classified: &[(Arc<Pod>, PodInfo)],
    now: Duration,
    seen: &mut HashMap<String, Duration>,
) -> Vec<NodePod> {
    let wall = chrono::Utc::now().timestamp_millis();
    // Rebuilt each pass from the pods terminating now: a pod gone is forgotten.
    let mut before = std::mem::take(seen);
    classified
        .iter()
        .map(|(pod, info)| {
            let deletion_due = pod.metadata.deletion_timestamp.as_ref().and_then(|t| {
                let left = t.0.as_millisecond().saturating_sub(wall).max(0);
                let by_timestamp =
                    now + Duration::from_millis(u64::try_from(left).unwrap_or(u64::MAX));
                let seen_at = before.remove(&info.uid).unwrap_or(now);
                seen.insert(info.uid.clone(), seen_at);
                let grace = pod
                    .metadata
                    .deletion_grace_period_seconds
                    .map(|g| Duration::from_secs(u64::try_from(g).unwrap_or(0)));
                deletion_due(Some(by_timestamp), seen_at, grace)
            });
            let tolerant_daemonset = tolerates_everything(pod)
                .then(|| crate::plan::classify::daemonset_controller(pod).map(|o| o.uid.clone()))
                .flatten();
            NodePod {
                info: info.clone(),
                deletion_due,
                tolerant_daemonset,
                created: pod
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_second()),
            }
        })
        .collect()
}
