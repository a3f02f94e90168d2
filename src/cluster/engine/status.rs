//! This node's entry in each maintenance's status, the aggregate fields, the finalizer, and
//! the Complete stage on this node.

use std::sync::Arc;

use anyhow::{Context as _, Result};

use k8s_openapi::api::core::v1::Node;
use kube::api::Patch;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::api::{
    node_status_apply_patch, node_status_patch_params, NodeMaintenance, NodeMaintenanceNodeStatus,
    Stage, CONDITION_DRAINED, FINALIZER_MAINTENANCE_COMPLETION,
};
use crate::cluster::gateway::{self, Kind};
use crate::cluster::node::{lb_exclusion_patch, maintenance_taint_patch, uncordon_patch};

use crate::plan::pass::{self, EntryView};
use crate::plan::{reached_drain_targets, DrainTargets, PodInfo};

use super::{
    describe_targets, has_finalizer, merge_params, min_wake, now_rfc3339, strip_empty, DrainState,
    MaintView, Shared, COMPLETED_MESSAGE, STATUS_DEBOUNCE,
};

impl Shared {
    /// This node's entry in `m`'s status and the aggregate fields. Returns whether the
    /// entry on the apiserver is up to date.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn write_status(
        &self,
        st: &mut DrainState,
        node: &Node,
        m: &Arc<NodeMaintenance>,
        view: Option<&MaintView>,
        pods: &[PodInfo],
        force: bool,
        wake: &mut Option<Instant>,
    ) -> Result<bool> {
        let name = m.name_any();
        let replan = st
            .shutdown_replan
            .as_ref()
            .filter(|(n, _)| *n == name)
            .map(|(_, r)| r.summary());
        let figures = pass::node_entry(
            &name,
            &st.targets,
            &st.tracks,
            pods,
            view.map(|v| EntryView {
                drained: v.drained,
                targets: &v.targets,
            }),
            st.invalid_plans.get(&name).map(String::as_str),
            replan.as_deref(),
        );
        let mut entry = NodeMaintenanceNodeStatus::for_node(&self.node);
        entry.drain_targets = figures.drain_targets;
        entry.pods_remaining = figures.pods_remaining;
        entry.active_eviction_requests = figures.active_eviction_requests;
        entry.pods_pending_eviction_request = figures.pods_pending_eviction_request;
        entry.pods_not_targeted = figures.pods_not_targeted;
        entry.drain_message = figures.drain_message;

        let mut current = m.node_status(&self.node).cloned();
        if let Some(c) = current.as_mut() {
            c.last_update_time = None;
        }
        let mut up_to_date = current.as_ref() == Some(&entry);
        let mut latest = m.clone();
        if !up_to_date {
            let counts_only = current.as_ref().is_some_and(|c| {
                c.drain_targets == entry.drain_targets
                    && c.drain_message == entry.drain_message
                    && (c.pods_remaining == 0) == (entry.pods_remaining == 0)
            });
            let due = st.last_entry_write.get(&name).map(|t| *t + STATUS_DEBOUNCE);
            match due {
                Some(due) if counts_only && !force && Instant::now() < due => min_wake(wake, due),
                _ => {
                    let mut e = entry.clone();
                    e.last_update_time =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            k8s_openapi::jiff::Timestamp::now(),
                        ));
                    latest = Arc::new(self.apply_entry(&name, &e).await?);
                    st.nm_overlay
                        .insert(name.clone(), st.watch_log.written(latest.clone()));
                    st.last_entry_write.insert(name.clone(), Instant::now());
                    up_to_date = true;
                }
            }
        }

        if let Some(v) = view {
            if v.drained
                && st
                    .announced
                    .insert(format!("drained/{}", m.uid().unwrap_or_default()))
            {
                self.event_both(
                    node,
                    Some(m),
                    false,
                    "Drained",
                    format!("node {} drained for {name}", self.node),
                );
            }
            let key = format!("targets/{name}/{}", describe_targets(&st.targets));
            if st.announced.insert(key) {
                self.event_both(
                    node,
                    Some(m),
                    false,
                    "DrainTargets",
                    format!(
                        "node {} drains {}",
                        self.node,
                        describe_targets(&st.targets)
                    ),
                );
            }
        }
        self.write_aggregate(st, &latest, view).await?;
        Ok(up_to_date)
    }

    pub(super) async fn apply_entry(
        &self,
        name: &str,
        entry: &NodeMaintenanceNodeStatus,
    ) -> Result<NodeMaintenance> {
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let body = node_status_apply_patch(name, entry)?;
        let r = api
            .patch_status(
                name,
                &node_status_patch_params(&self.node),
                &Patch::Apply(&body),
            )
            .await
            .with_context(|| {
                format!(
                    "writing node {}'s status to NodeMaintenance {name}",
                    self.node
                )
            });
        let r = gateway::answer(self, r);
        if r.is_err() {
            self.metrics.api_error("maintenance_status");
        }
        Ok(r?)
    }

    pub(super) async fn write_aggregate(
        &self,
        st: &mut DrainState,
        m: &Arc<NodeMaintenance>,
        view: Option<&MaintView>,
    ) -> Result<()> {
        let name = m.name_any();
        let status = m.status.clone().unwrap_or_default();
        let now = now_rfc3339();
        let mut stages = serde_json::to_value(&status.stage_statuses)?;
        let mut wanted = vec![m.spec.stage];
        if m.spec.stage == Stage::Drain {
            wanted.insert(0, Stage::Cordon);
        }
        if let Some(list) = stages.as_array_mut() {
            for s in wanted {
                if !status.stage_statuses.iter().any(|x| x.name == s) {
                    list.push(json!({"name": s.as_str(), "startTimestamp": now}));
                }
            }
        }
        let mut patch = serde_json::Map::new();
        if stages != serde_json::to_value(&status.stage_statuses)? {
            patch.insert("stageStatuses".into(), stages);
        }
        // On a maintenance of other nodes too, the admission policy lets a node write no
        // drainStatus and only the Drained condition the entries of every node call for
        // (packaging/rbac/README.md).
        let pinned = crate::api::is_pinned_to(&m.spec.node_selector, &self.node);
        let drained = if pinned {
            view.map(|v| v.drained)
        } else {
            view.map(|_| crate::api::entries_drained(m.status.as_ref()))
        };
        if let Some(v) = view.filter(|_| pinned) {
            let entries = &status.node_statuses;
            let reached = reached_drain_targets(
                entries
                    .iter()
                    .filter_map(|e| DrainTargets::from_entries(&e.drain_targets).ok())
                    .collect::<Vec<_>>()
                    .iter(),
            );
            let message = if v.drained {
                "Drained".to_string()
            } else if entries.iter().any(|e| e.pods_remaining > 0) {
                "Draining".to_string()
            } else {
                format!("Waiting for {name}.")
            };
            let drain_status = json!({
                "reachedDrainTargets": serde_json::to_value(reached.to_entries())?,
                "podsPendingEvictionRequest": entries.iter().map(|e| e.pods_pending_eviction_request).sum::<i32>(),
                "activeEvictionRequests": entries.iter().map(|e| e.active_eviction_requests).sum::<i32>(),
                "drainMessage": message,
            });
            let current_ds = serde_json::to_value(status.drain_status.clone().unwrap_or_default())?;
            if strip_empty(&current_ds) != strip_empty(&drain_status) {
                patch.insert("drainStatus".into(), drain_status);
            }
        }
        if let (Some(v), Some(drained)) = (view, drained) {
            let want = if drained { "True" } else { "False" };
            let existing = status
                .conditions
                .iter()
                .find(|c| c.type_ == CONDITION_DRAINED);
            if existing.is_none_or(|c| c.status != want) {
                let mut conds: Vec<Value> = status
                    .conditions
                    .iter()
                    .filter(|c| c.type_ != CONDITION_DRAINED)
                    .filter_map(|c| serde_json::to_value(c).ok())
                    .collect();
                conds.push(json!({
                    "type": CONDITION_DRAINED,
                    "status": want,
                    "reason": if drained { "Drained" } else { "Draining" },
                    "message": if drained { "every targeted pod terminated on every selected node".to_string() } else { format!("at drain plan entry {} of {}", v.index + 1, v.plan_len) },
                    "lastTransitionTime": now,
                    "observedGeneration": m.metadata.generation.unwrap_or(0),
                }));
                patch.insert("conditions".into(), Value::Array(conds));
            }
        }
        if patch.is_empty() {
            return Ok(());
        }
        // Every selected node writes the aggregate from the entries it read: the
        // resourceVersion precondition makes a write computed from an older read fail (409)
        // instead of overwriting a newer one; the watch then brings the newer object and the
        // next pass computes again from it.
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let body = json!({
            "metadata": {"resourceVersion": m.resource_version()},
            "status": patch,
        });
        let r = api
            .patch_status(&name, &merge_params(), &Patch::Merge(body))
            .await;
        let updated = match gateway::answer(self, r) {
            Ok(updated) => updated,
            Err(f) if f.is(Kind::Conflict) => {
                tracing::debug!(node = %self.node, maintenance = %name, "the maintenance changed since it was read; its aggregate status is written from the newer one");
                st.nm_overlay.remove(&name);
                return Ok(());
            }
            Err(f) => {
                return Err(f
                    .context(format!("writing the status of NodeMaintenance {name}"))
                    .into())
            }
        };
        st.nm_overlay
            .insert(name, st.watch_log.written(Arc::new(updated)));
        Ok(())
    }

    pub(super) async fn update_finalizer(
        &self,
        st: &mut DrainState,
        m: &NodeMaintenance,
        present: bool,
    ) -> Result<()> {
        let name = m.name_any();
        let mut list: Vec<String> = m.finalizers().to_vec();
        list.retain(|f| f != FINALIZER_MAINTENANCE_COMPLETION);
        if present {
            list.push(FINALIZER_MAINTENANCE_COMPLETION.into());
        }
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let patch = json!({"metadata": {
            "finalizers": list,
            "resourceVersion": m.metadata.resource_version,
        }});
        let r = api
            .patch(&name, &merge_params(), &Patch::Merge(&patch))
            .await;
        match gateway::answer(self, r) {
            Ok(updated) => {
                st.nm_overlay
                    .insert(name, st.watch_log.written(Arc::new(updated)));
                Ok(())
            }
            // Someone changed it meanwhile: the watch brings the new version and a new pass.
            Err(f) if f.is(Kind::Conflict) || f.is(Kind::NotFound) => Ok(()),
            Err(f) => Err(f
                .context(format!("updating the finalizer of NodeMaintenance {name}"))
                .into()),
        }
    }

    /// The Complete stage (or deletion) of `m` on this node.
    pub(super) async fn complete(
        &self,
        st: &mut DrainState,
        node: &Node,
        m: &Arc<NodeMaintenance>,
        active: &[Arc<NodeMaintenance>],
    ) -> Result<()> {
        let name = m.name_any();
        let others = active.iter().any(|o| o.name_any() != name);
        if !others {
            if uncordon_patch(node).is_some() {
                self.patch_node(st, "uncordon", uncordon_patch).await?;
            }
            if maintenance_taint_patch(node, false).is_some() {
                self.patch_node(st, "remove the maintenance taint", |n| {
                    maintenance_taint_patch(n, false)
                })
                .await?;
            }
            if lb_exclusion_patch(node, false).is_some() {
                self.patch_node(st, "remove the load-balancer exclusion", |n| {
                    lb_exclusion_patch(n, false)
                })
                .await?;
            }
            let gate = self.gate.clone();
            let kept = tokio::task::spawn_blocking(move || -> Result<Vec<String>> {
                if !gate.has_gated()? {
                    Ok(Vec::new())
                } else {
                    gate.restore_all()
                }
            })
            .await
            .context("the static pod restore task failed")??;
            if !kept.is_empty() {
                self.event_both(
                    node,
                    Some(m),
                    true,
                    "StaticPodsKeptAside",
                    format!(
                        "gated manifests not restored (a file of that name exists): {}",
                        kept.join(", ")
                    ),
                );
            }
        }
        if let Err(err) = self.terminator.withdraw(&name).await {
            tracing::warn!(node = %self.node, maintenance = %name, error = crate::cluster::error_text(&err), "withdrawing eviction requests failed");
        }
        let mut entry = NodeMaintenanceNodeStatus::for_node(&self.node);
        entry.drain_message = COMPLETED_MESSAGE.into();
        let mut latest = m.clone();
        let current_msg = m.node_status(&self.node).map(|e| e.drain_message.as_str());
        if current_msg != Some(COMPLETED_MESSAGE) {
            entry.last_update_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
            latest = Arc::new(self.apply_entry(&name, &entry).await?);
            st.nm_overlay
                .insert(name.clone(), st.watch_log.written(latest.clone()));
        }
        self.write_aggregate(st, &latest, None).await?;
        let everyone_done = latest
            .status
            .as_ref()
            .map(|s| {
                s.node_statuses
                    .iter()
                    .all(|e| e.drain_message == COMPLETED_MESSAGE)
            })
            .unwrap_or(true);
        if has_finalizer(&latest) && everyone_done {
            self.update_finalizer(st, &latest, false).await?;
        }
        if st
            .announced
            .insert(format!("completed/{}", m.uid().unwrap_or_default()))
        {
            let note = if others {
                format!(
                    "{name} completed on node {}; it stays cordoned for another maintenance",
                    self.node
                )
            } else {
                format!("{name} completed on node {}", self.node)
            };
            self.event_both(node, Some(m), false, "Completed", note);
            tracing::info!(node = %self.node, maintenance = %name, others, "maintenance completed");
        }
        Ok(())
    }
}
