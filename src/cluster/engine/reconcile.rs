//! One pass of the reconcile loop: read the reflected state, decide, carry it out.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anyhow::Result;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::time::Instant;

use crate::api::{NodeMaintenance, NodeMaintenanceNodeStatus, Stage};
use crate::cluster::node::cordon_patch;
use crate::cluster::nodesel;
use crate::plan::targets::{evaluate_node, MaintenanceInput};
use crate::plan::{normalize_drain_plan, DrainTargets, NodeReport, PodInfo};
use crate::state::PodCache;

use super::{
    describe_targets, has_finalizer, is_active, is_deleting, is_draining, lock, min_wake,
    tolerates_everything, DrainState, MaintView, Progress, Shared, COMPLETED_MESSAGE,
    POD_CACHE_DEBOUNCE,
};

/// When the node's drain began: the earliest Drain stage start (`status.stageStatuses`, else
/// the creation) among the draining maintenances that select it.
fn drain_began(active: &[Arc<NodeMaintenance>]) -> Option<chrono::DateTime<chrono::Utc>> {
    active
        .iter()
        .filter(|m| is_draining(m))
        .filter_map(|m| {
            let started = m
                .status
                .as_ref()
                .and_then(|s| s.stage_statuses.iter().find(|s| s.name == Stage::Drain))
                .and_then(|s| s.start_timestamp.as_ref())
                .or(m.metadata.creation_timestamp.as_ref())?;
            chrono::DateTime::from_timestamp(started.0.as_second(), 0)
        })
        .min()
}

pub(super) fn daemonset_owner(pod: &Pod) -> Option<&str> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "DaemonSet")
        .map(|o| o.uid.as_str())
}

/// DaemonSet pods that tolerate every taint are recreated by their controller at once, on a
/// cordoned and tainted node too: each is terminated once, and another pod of that
/// DaemonSet is its replacement, neither chased nor waited for (the kubelet stops it at
/// poweroff). A replacement is one created after the second in which the node's drain
/// began (which holds across restarts of the daemon), or one that is not the pod this
/// drain terminated for its DaemonSet (`terminated`: DaemonSet UID -> pod UID).
fn daemonset_replacements(
    raw_pods: &[Arc<Pod>],
    active: &[Arc<NodeMaintenance>],
    terminated: &HashMap<String, String>,
) -> HashSet<String> {
    let Some(began) = drain_began(active) else {
        return HashSet::new();
    };
    raw_pods
        .iter()
        .filter(|p| tolerates_everything(p))
        .filter(|p| {
            let Some(owner) = daemonset_owner(p) else {
                return false;
            };
            let later = p
                .metadata
                .creation_timestamp
                .as_ref()
                .and_then(|t| chrono::DateTime::from_timestamp(t.0.as_second(), 0))
                .is_some_and(|created| created > began);
            let another = terminated
                .get(owner)
                .is_some_and(|uid| p.metadata.uid.as_ref() != Some(uid));
            later || another
        })
        .filter_map(|p| p.uid())
        .collect()
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
        let cache = PodCache {
            node: self.node.clone(),
            written_at: Some(chrono::Utc::now()),
            pods: pods.to_vec(),
        };
        let dir = self.settings.state_dir.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(err) = cache.store(&dir) {
                tracing::warn!(error = format!("{err:#}"), "writing the pod cache failed");
            }
        });
    }

    /// One pass over the reflected state. Returns when the loop must run again without a
    /// watch event (a back-off or deadline).
    pub(super) async fn reconcile(&self, st: &mut DrainState) -> Result<Option<Instant>> {
        let mut wake = None;
        let Some(node) = self.node_obj(st) else {
            return Ok(None);
        };
        let raw_pods: Vec<Arc<Pod>> = self
            .pods
            .state()
            .into_iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.as_str())
            })
            .collect();
        let pods = self.pod_infos();
        self.maybe_write_cache(st, &pods, &mut wake);

        let selecting: Vec<Arc<NodeMaintenance>> = self
            .maintenance_objs(st)
            .into_iter()
            .filter(|m| nodesel::selects(&m.spec.node_selector, &node))
            .collect();
        let active: Vec<Arc<NodeMaintenance>> =
            selecting.iter().filter(|m| is_active(m)).cloned().collect();

        let replacements = daemonset_replacements(&raw_pods, &active, &st.daemonset_terminated);
        if !replacements.is_empty() {
            let fresh: Vec<String> = raw_pods
                .iter()
                .filter(|p| replacements.contains(p.uid().as_deref().unwrap_or_default()))
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
        let raw_pods: Vec<Arc<Pod>> = raw_pods
            .into_iter()
            .filter(|p| !replacements.contains(p.uid().as_deref().unwrap_or_default()))
            .collect();
        let pods: Vec<PodInfo> = pods
            .into_iter()
            .filter(|p| !replacements.contains(&p.uid))
            .collect();

        // Cordon and finalizer first: a maintenance that selects the node holds it.
        if !active.is_empty() && cordon_patch(&node).is_some() {
            self.patch_node(st, "cordon", cordon_patch).await?;
            let names: Vec<String> = active.iter().map(|m| m.name_any()).collect();
            self.event_both(
                &node,
                active.first().map(|m| m.as_ref()),
                false,
                "Cordoned",
                format!("node {} cordoned for {}", self.node, names.join(", ")),
            );
        }
        for m in &active {
            if !has_finalizer(m) {
                self.update_finalizer(st, m, true).await?;
            }
        }

        let views = self.drain_views(st, &active, &pods)?;
        let ctx_any = lock(&self.shutdown).clone();
        let ctx = ctx_any
            .clone()
            .filter(|c| views.iter().any(|v| v.name == c.name));
        // The shutdown maintenance was completed or deleted under the drain: nothing is
        // left to wait for.
        let shutdown_ended = ctx_any.as_ref().is_some_and(|c| {
            selecting.iter().any(|m| {
                m.name_any() == c.name && (m.spec.stage == Stage::Complete || is_deleting(m))
            })
        });

        self.terminate_targeted(
            st,
            &node,
            &raw_pods,
            &pods,
            &views,
            ctx.as_deref(),
            &mut wake,
        )
        .await?;

        let node_empty = ctx.as_ref().is_some_and(|c| c.node_empty(&pods));
        let mut all_written = true;
        for m in &active {
            let view = views.iter().find(|v| v.name == m.name_any());
            let force = node_empty && ctx.as_ref().is_some_and(|c| c.name == m.name_any());
            let written = self
                .write_status(st, &node, m, view, &pods, force, &mut wake)
                .await?;
            if force && !written {
                all_written = false;
            }
        }

        let completing: Vec<Arc<NodeMaintenance>> = selecting
            .iter()
            .filter(|m| {
                (m.spec.stage == Stage::Complete || is_deleting(m))
                    && (has_finalizer(m)
                        || m.node_status(&self.node)
                            .is_some_and(|e| e.drain_message != COMPLETED_MESSAGE))
            })
            .cloned()
            .collect();
        for m in &completing {
            self.complete(st, &node, m, &active).await?;
        }
        if views.is_empty() {
            st.targets = DrainTargets::none();
            st.targets_since = None;
            st.tracks.clear();
            st.daemonset_terminated.clear();
        }

        self.publish_fallback(st, &selecting).await;

        if ((node_empty && all_written) || shutdown_ended) && !self.progress.borrow().shutdown_done
        {
            self.progress.send_replace(Progress {
                shutdown_done: true,
            });
        }
        Ok(wake)
    }

    /// Each draining maintenance's position in its plan, and the node's effective targets.
    pub(super) fn drain_views(
        &self,
        st: &mut DrainState,
        active: &[Arc<NodeMaintenance>],
        pods: &[PodInfo],
    ) -> Result<Vec<MaintView>> {
        let draining: Vec<&Arc<NodeMaintenance>> =
            active.iter().filter(|m| is_draining(m)).collect();
        let mut previous: Option<DrainTargets> =
            (!st.targets.is_empty()).then(|| st.targets.clone());
        for m in &draining {
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
        let prev = previous.clone().unwrap_or_default();
        let mut plans = Vec::new();
        for m in draining {
            let name = m.name_any();
            match normalize_drain_plan(&m.spec.drain_plan) {
                Ok(p) => plans.push((m.clone(), name, p)),
                Err(err) => {
                    if st.announced.insert(format!("badplan/{name}")) {
                        tracing::warn!(node = %self.node, maintenance = %name, error = %err, "ignoring a maintenance with an invalid drain plan");
                    }
                }
            }
        }
        let mut inputs = Vec::new();
        for (m, name, plan) in &plans {
            let steps = (0..plan.len())
                .map(|i| DrainTargets::for_plan(plan, i))
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
            let (reports, own) = match nodesel::exact_nodes(&m.spec.node_selector) {
                Some(names) if names.contains(&self.node) => {
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
                _ => (
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
            inputs.push(MaintenanceInput {
                name: name.as_str(),
                plan: plan.as_slice(),
                reports,
                own,
            });
        }
        let eval = evaluate_node(previous.as_ref(), &inputs, pods)?;
        let views: Vec<MaintView> = plans
            .iter()
            .enumerate()
            .map(|(i, (m, name, plan))| MaintView {
                m: m.clone(),
                name: name.clone(),
                plan_len: plan.len(),
                index: eval.positions[i].index,
                drained: eval.positions[i].drained,
                targets: eval.maintenance_targets[i].clone(),
            })
            .collect();
        let nt = eval.node;
        if !views.is_empty() && (st.targets_since.is_none() || nt.targets != st.targets) {
            if let Some(since) = st.targets_since {
                self.metrics
                    .band_finished(&describe_targets(&st.targets), since.elapsed());
            }
            st.targets_since = Some(Instant::now());
            tracing::info!(node = %self.node, targets = %describe_targets(&nt.targets), holders = ?nt.holders, "drain targets");
            st.targets = nt.targets;
        }
        Ok(views)
    }
}
