//! A shutdown through the node's own NodeMaintenance: cordon, `shutdown-<node>` created or
//! adopted, the deadline schedule, waiting for the node to be empty; cancel and the boot after.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};

use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, Patch, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::{
    node_selector_for, NodeMaintenance, NodeMaintenanceSpec, Stage,
    FINALIZER_MAINTENANCE_COMPLETION,
};
use crate::cluster::gateway::{self, Kind};
use crate::cluster::node::{
    lb_exclusion_patch, maintenance_taint_patch, patch_node_with, set_lifecycle_conditions,
    uncordon_patch, Lifecycle, REASON_SHUTDOWN_CANCELLED, REASON_SHUTDOWN_ENDED,
};
use crate::cluster::FIELD_MANAGER;
use crate::config::CompletionPolicy;
use crate::plan::budget::{plan_steps, split_remaining, BudgetReserves};
use crate::plan::reachability;
use crate::plan::{normalize_drain_plan, DrainPlanEntry, DrainTargets};
use crate::shutdown::{CancelCause, ShutdownKind, ShutdownRequest};
use crate::state::OfflineDrain;

use super::{
    is_deleting, kind_str, lock, merge_params, merge_values, shutdown_maintenance_name, AfterBoot,
    Engine, EngineError, Progress, Replan, Shared, ShutdownCtx, ShutdownTimings, ToLoop,
    BOOT_ID_ANNOTATION, DRAIN_STOPPED_ANNOTATION, FALLBACK_ANNOTATION, PROBE_INTERVAL,
    QUIET_PROBE_INTERVAL, SHUTDOWN_KIND_ANNOTATION,
};

/// How long the drain waits, beside the cordon, for the evicting identity's connection.
const CONNECT_AHEAD_MAX: Duration = Duration::from_secs(2);
/// How long the shutdown conditions' write is tried again while the apiserver cannot be
/// used (the cordon beside it keeps trying; a drain that resumes writes them again).
const CONDITION_RETRY_MAX: Duration = Duration::from_secs(2);

impl Engine {
    /// Drains the node for a shutdown through `shutdown-<node>` and returns once the node is
    /// empty, its volumes are detached (bounded) and the last status update reached
    /// the apiserver. Cancel-safe: dropping the future leaves the maintenance in place.
    pub async fn shutdown_drain(
        &self,
        req: &ShutdownRequest,
    ) -> Result<ShutdownTimings, EngineError> {
        let sh = &self.shared;
        let t0 = Instant::now();
        let mut timings = ShutdownTimings::default();
        // Told before the watches are ready: once the loop takes it, a watch waiting out a
        // long back-off tries again now, then at most a second apart.
        let (progress, mut told) = watch::channel(Progress::default());
        sh.tell_loop(ToLoop::ShutdownBegun { progress });
        sh.wait_ready(|r| r.node && r.pods && r.maintenances)
            .await?;

        let plan =
            crate::plan::shutdown_drain_plan(&sh.settings()).context("normalizing drain.plan")?;
        let name = shutdown_maintenance_name(&sh.node);
        // The loop cordons first: nothing new lands on the node while the maintenance is set
        // up. Meanwhile the evicting identity's connection opens, so that the first band's
        // requests share it (`PodTerminator::connect`); a slow apiserver does not hold the
        // drain for it.
        let connect = tokio::time::timeout(CONNECT_AHEAD_MAX, sh.terminator.connect());
        // The conditions go beside the cordon, and before the maintenance exists: no pod
        // is asked to go before the cluster can read that the node is shutting down.
        let (cordoned, _, condition) = tokio::join!(
            self.wait_progress(&mut told, |p| p.cordoned),
            connect,
            sh.set_condition_for_shutdown(req)
        );
        cordoned?;
        timings.cordoned = Some(t0.elapsed());
        if let Err(e) = condition {
            tracing::warn!(node = %sh.node, error = crate::cluster::error_text(&e), "setting the shutdown conditions failed");
        }
        let adopted = sh.ensure_shutdown_maintenance(req, &plan).await;
        timings.maintenance_ready = Some(t0.elapsed());
        let maintenance = adopted?;
        sh.tell_loop(ToLoop::Created(
            Arc::new(maintenance.clone()),
            Instant::now(),
        ));

        let plan = normalize_drain_plan(&maintenance.spec.drain_plan).unwrap_or(plan);
        let pods = sh.pod_infos();
        let steps = plan_steps(&plan, &pods).context("splitting the pods over the drain plan")?;
        let reserves = BudgetReserves::from(&sh.settings().drain);
        let step_targets = (0..plan.len())
            .map(|i| DrainTargets::for_plan(&plan, i))
            .collect::<Result<Vec<_>, _>>()
            .context("computing the shutdown drain targets")?;
        let elapsed = req.elapsed(chrono::Utc::now());
        let start = Instant::now()
            .checked_sub(elapsed)
            .unwrap_or_else(Instant::now);
        // Time already gone (an apiserver that answered late, a restart, the offline
        // fallback) comes out of what is left, split over the pods still there; it is not
        // charged to the first band. An outage that ends after this is the loop's to plan
        // again (`ToLoop::Replan`, taken after this schedule).
        let schedule = split_remaining(req.budget, elapsed, &steps, &reserves);
        let replanned = reachability::worth_acting_on(elapsed).then(|| Replan {
            at: elapsed,
            lost: elapsed,
            left: req.budget.saturating_sub(elapsed),
            cause: if req.resumed {
                "the drain went on after the offline fallback or a restart".into()
            } else {
                "the drain could not start earlier (the apiserver answered late)".into()
            },
        });
        if let Some(r) = &replanned {
            tracing::info!(node = %sh.node, maintenance = %name, lost = ?r.lost, left = ?req.budget.saturating_sub(elapsed), cause = %r.cause, "time lost: the rest of the shutdown budget is split over the pods left");
        }
        sh.tell_loop(ToLoop::ShutdownPlanned(Arc::new(ShutdownCtx {
            name: name.clone(),
            plan: plan.clone(),
            step_targets,
            budget: req.budget,
            reserves,
            schedule,
            planned: pods.iter().map(|p| p.uid.clone()).collect(),
            start,
            // The loop's to set: planned when it takes the schedule.
            planned_at: Duration::ZERO,
            replanned,
        })));
        tracing::info!(node = %sh.node, maintenance = %name, kind = %req.kind, resumed = req.resumed, "shutdown drain started");

        self.wait_progress(&mut told, |p| p.shutdown_done).await?;
        timings.node_empty = Some(t0.elapsed());
        sh.wait_volumes_detached().await;
        timings.volumes_detached = Some(t0.elapsed());
        tracing::info!(node = %sh.node, maintenance = %name, took = ?t0.elapsed(), cordoned = ?timings.cordoned, maintenance_ready = ?timings.maintenance_ready, node_empty = ?timings.node_empty, "node drained for shutdown");
        Ok(timings)
    }

    /// Waits until the loop reports `reached` on this shutdown's channel, asking the
    /// apiserver directly while it fails or all is quiet; an error when the engine stops,
    /// the apiserver refused the cordon, or has been unusable past the fallback's timeout.
    async fn wait_progress(
        &self,
        progress: &mut watch::Receiver<Progress>,
        reached: fn(&Progress) -> bool,
    ) -> Result<(), EngineError> {
        let sh = &self.shared;
        let mut events = sh.wake.subscribe();
        loop {
            {
                let now = progress.borrow_and_update();
                if let Some(refused) = &now.cordon_refused {
                    return Err(anyhow::anyhow!("cordoning the node: {refused}").into());
                }
                if reached(&now) {
                    break;
                }
            }
            events.borrow_and_update();
            let deadline = sh.unreachable_deadline();
            // A watch that reconnected quietly says nothing: while failing, ask directly. While
            // all is quiet ask too, less often: an apiserver whose etcd is away still streams
            // its watch cache and answers nothing else, and only a read that reaches etcd
            // tells the drain that its schedule is losing time (issue 33).
            let probe_at = Instant::now()
                + if deadline.is_some() {
                    PROBE_INTERVAL
                } else {
                    QUIET_PROBE_INTERVAL
                };
            tokio::select! {
                () = tokio::time::sleep_until(probe_at) => sh.probe().await,
                r = progress.changed() => if r.is_err() {
                    return Err(anyhow::anyhow!("the engine stopped").into());
                },
                // A watch event may have changed the apiserver's reachability.
                _ = events.changed() => {},
                _ = crate::timer::sleep_until(deadline) => {
                    let timeout = sh.settings().fallback.apiserver_timeout;
                    if let Some(given_up) = lock(&sh.reach).give_up(sh.now(), Duration::ZERO, timeout) {
                        return Err(given_up.into());
                    }
                }
            }
        }
        Ok(())
    }

    /// The shutdown will not happen: its drain stops where it is (the loop asks no pod
    /// more for it), the Node says why, and its maintenance is completed or kept as
    /// `policy` says. A kept one holds the node cordoned and drains nothing more until the
    /// next shutdown adopts it ([`DRAIN_STOPPED_ANNOTATION`]).
    pub async fn cancel_shutdown(
        &self,
        policy: CompletionPolicy,
        cause: CancelCause,
    ) -> Result<()> {
        let sh = &self.shared;
        sh.tell_loop(ToLoop::ShutdownEnded);
        let name = shutdown_maintenance_name(&sh.node);
        let (warning, reason, note) = match cause {
            CancelCause::Cancelled => (
                false,
                "ShutdownCancelled",
                "the shutdown was cancelled (PrepareForShutdown(false)): the drain stopped",
            ),
            CancelCause::Lost => (true, "ShutdownLost", crate::plan::lifecycle::LOST),
        };
        let kept = match policy {
            CompletionPolicy::Complete => format!("{name} is completed"),
            CompletionPolicy::Keep => {
                format!("{name} is kept: the node stays cordoned until `nodegrace complete`")
            }
        };
        let node = sh.node_watched();
        let maintenance = sh.maintenances.named(&name);
        match node {
            Some(node) => sh.event_both(
                &node,
                maintenance.as_deref(),
                warning,
                reason,
                format!("{note}; {kept}"),
            ),
            None => tracing::warn!(node = %sh.node, "no Node to tell of the cancelled shutdown"),
        }
        tracing::warn!(node = %sh.node, maintenance = %name, cause = ?cause, "{note}; {kept}");
        sh.clear_shutdown_marks(REASON_SHUTDOWN_CANCELLED).await?;
        match policy {
            CompletionPolicy::Complete => sh.set_stage(&name, Stage::Complete).await?,
            CompletionPolicy::Keep => sh.mark_drain_stopped(&name, note).await?,
        }
        Ok(())
    }

    /// After a boot: a shutdown maintenance left by an earlier boot is completed or kept as
    /// `policy` says; the shutdown marks on the Node are cleared. `offline` is what the
    /// local fallback recorded in an earlier boot's shutdown: it is written to that
    /// shutdown's maintenance, which is created (Complete or Drain, as `policy` says) when
    /// the apiserver never saw the shutdown at all.
    pub async fn after_boot(
        &self,
        boot_id: &str,
        policy: CompletionPolicy,
        offline: Option<&OfflineDrain>,
    ) -> Result<AfterBoot> {
        self.after_boot_of(boot_id, false, policy, offline).await
    }

    /// [`Engine::after_boot`]; `soft_rebooted`: the boot id is the one the shutdown had,
    /// but a soft reboot took place since (what that boot id recorded is an earlier boot's).
    pub async fn after_boot_of(
        &self,
        boot_id: &str,
        soft_rebooted: bool,
        policy: CompletionPolicy,
        offline: Option<&OfflineDrain>,
    ) -> Result<AfterBoot> {
        let sh = &self.shared;
        sh.wait_ready(|r| r.node && r.maintenances)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        // No shutdown is in progress (the daemon is told so by logind): a True left by a
        // crash or the boot before is cleared before anything else.
        sh.clear_stale_shutdown_conditions().await?;
        let offline = offline.filter(|o| o.boot_id != boot_id || soft_rebooted);
        if let Some(record) = offline {
            if sh.wait_ready(|r| r.pods).await.is_ok() {
                sh.report_offline_stopped(record).await;
            }
        }
        let name = shutdown_maintenance_name(&sh.node);
        let api: Api<NodeMaintenance> = Api::all(sh.client.clone());
        let found = api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading NodeMaintenance {name}"))?;
        let m = match (found, offline) {
            (Some(m), _) => m,
            (None, None) => {
                sh.undo_shutdown_marks(
                    &name,
                    "the shutdown maintenance was deleted before the boot after it completed it",
                )
                .await?;
                return Ok(AfterBoot::NoMaintenance);
            }
            (None, Some(record)) => match sh.create_offline_record(record, policy).await? {
                Some(outcome) => return Ok(outcome),
                // Someone created it meanwhile: go on with theirs.
                None => api
                    .get(&name)
                    .await
                    .with_context(|| format!("reading NodeMaintenance {name}"))?,
            },
        };
        let m_boot = m.annotations().get(BOOT_ID_ANNOTATION).map(String::as_str);
        if m_boot == Some(boot_id) && !soft_rebooted {
            return Ok(AfterBoot::SameBoot);
        }
        if let Some(record) = offline.filter(|o| m_boot == Some(o.boot_id.as_str())) {
            if !m.annotations().contains_key(FALLBACK_ANNOTATION) {
                sh.annotate_offline_record(&m, record).await?;
            }
        }
        sh.clear_shutdown_marks(REASON_SHUTDOWN_ENDED).await?;
        if m.spec.stage == Stage::Complete || is_deleting(&m) {
            // A shutdown cordons before it writes its maintenance: the apiserver gone between
            // the two leaves the node cordoned under an earlier shutdown's completed one.
            if m.spec.stage == Stage::Complete && !is_deleting(&m) {
                sh.undo_shutdown_marks(&name, "the last shutdown cordoned the node but could not write its maintenance (the apiserver went away)")
                    .await?;
            }
            return Ok(AfterBoot::AlreadyComplete);
        }
        match policy {
            CompletionPolicy::Complete => {
                sh.set_stage(&name, Stage::Complete).await?;
                Ok(AfterBoot::Completed)
            }
            CompletionPolicy::Keep => {
                tracing::info!(node = %sh.node, maintenance = %name, "keeping the shutdown maintenance of an earlier boot; `nodegrace complete` ends it");
                Ok(AfterBoot::Kept)
            }
        }
    }
}

/// `nodegrace complete` without a running engine: moves `shutdown-<node>` to stage
/// Complete; the daemon's engine then carries the stage out. False when there is none.
pub(crate) async fn complete_shutdown_maintenance(client: &Client, node: &str) -> Result<bool> {
    let name = shutdown_maintenance_name(node);
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let Some(m) = api
        .get_opt(&name)
        .await
        .with_context(|| format!("reading NodeMaintenance {name}"))?
    else {
        return Ok(false);
    };
    if m.spec.stage != Stage::Complete {
        api.patch(
            &name,
            &merge_params(),
            &Patch::Merge(json!({"spec": {"stage": "Complete"}})),
        )
        .await
        .with_context(|| format!("moving NodeMaintenance {name} to stage Complete"))?;
    }
    Ok(true)
}

/// The active maintenances (Cordon or Drain, not being deleted) other than `shutdown-<node>`
/// that select `node`: while one is, the node stays cordoned and its static pods gated.
pub(crate) async fn other_active_maintenances(client: &Client, node: &str) -> Result<Vec<String>> {
    let own = shutdown_maintenance_name(node);
    let the_node = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .with_context(|| format!("reading Node {node}"))?;
    let list = super::list_maintenances_for(client, node).await?;
    Ok(list
        .into_iter()
        .filter(|m| {
            m.name_any() != own
                && super::is_active(m)
                && crate::cluster::nodesel::selects(&m.spec.node_selector, &the_node)
        })
        .map(|m| m.name_any())
        .collect())
}

impl Shared {
    /// Cordon, the load-balancer exclusion label and the maintenance taint in one patch of
    /// the Node. The taint goes on now rather than before the DaemonSet band: in a shutdown
    /// nothing new should start on the node, and the band then starts without a round trip.
    /// `DrainInProgress` and (unless the kubelet's own GNS is on) `GracefulNodeShutdownInProgress`,
    /// True with reason `NodeShutdown`, in one status write. Best effort: tried again while
    /// the apiserver cannot be used, for at most [`CONDITION_RETRY_MAX`], as the drain must
    /// not wait for it.
    pub(super) async fn set_condition_for_shutdown(&self, req: &ShutdownRequest) -> Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        let message = format!("nodegrace drains the node for a {}", kind_str(req.kind));
        let want = Lifecycle::Shutdown {
            gns: self.writes_gns(),
        };
        let node = self.node_watched();
        let node = node.map(|n| (*n).clone()).unwrap_or_else(|| {
            let mut n = Node::default();
            n.metadata.name = Some(self.node.clone());
            n
        });
        let started = Instant::now();
        loop {
            let r = set_lifecycle_conditions(&api, &node, want, &message).await;
            match gateway::answer(self, r) {
                Err(f) if f.apiserver_unusable() && started.elapsed() < CONDITION_RETRY_MAX => {
                    tokio::time::sleep(super::RETRY_IN_SHUTDOWN).await;
                }
                r => return Ok(r.map(|_| ())?),
            }
        }
    }

    /// Whether nodegrace writes `GracefulNodeShutdownInProgress`: not when the kubelet's
    /// own Graceful Node Shutdown is configured (then it is the kubelet's to say).
    pub(super) fn writes_gns(&self) -> bool {
        !self.settings().fallback.kubelet_gns
    }

    /// Keeps the cancelled shutdown's maintenance and stops its drain, for a daemon started
    /// again too. None to mark (the cancel came before it was created) is nothing to do.
    async fn mark_drain_stopped(&self, name: &str, why: &str) -> Result<()> {
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let stopped = format!(
            "{}: {why}",
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        let patch = json!({"metadata": {"annotations": {DRAIN_STOPPED_ANNOTATION: stopped}}});
        let r = api
            .patch(name, &merge_params(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("marking NodeMaintenance {name}'s drain stopped"));
        match gateway::answer(self, r.map(|_| ())) {
            Ok(()) => Ok(()),
            Err(f) if f.is(Kind::NotFound) => Ok(()),
            Err(f) => Err(f.into()),
        }
    }

    /// The shutdown conditions back to False (`reason`), where they say `NodeShutdown`;
    /// the load-balancer exclusion removed.
    pub(super) async fn clear_shutdown_marks(&self, reason: &'static str) -> Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        let node = api
            .get(&self.node)
            .await
            .with_context(|| format!("reading node {}", self.node))?;
        let want = Lifecycle::ShutdownOver {
            gns: self.writes_gns(),
            reason,
        };
        let message = if reason == REASON_SHUTDOWN_CANCELLED {
            "the shutdown was cancelled"
        } else {
            "no shutdown is in progress"
        };
        if set_lifecycle_conditions(&api, &node, want, message)
            .await?
            .is_some()
        {
            tracing::info!(node = %self.node, reason, "shutdown conditions cleared");
        }
        patch_node_with(
            &api,
            &self.node,
            "remove the load-balancer exclusion",
            |n| lb_exclusion_patch(n, false),
        )
        .await?;
        self.bump();
        Ok(())
    }

    /// `shutdown-<node>` is gone or complete but the node still carries what a shutdown did
    /// to it (`cause`: its maintenance deleted, finalizer and all, before a boot completed it,
    /// or never written). With no other maintenance active on the node, what its Complete
    /// stage would have undone is undone: cordon, taint, load-balancer exclusion, gated
    /// static pod manifests.
    async fn undo_shutdown_marks(&self, name: &str, cause: &str) -> Result<()> {
        let gate = self.gate.clone();
        let gated = tokio::task::spawn_blocking(move || gate.has_gated())
            .await
            .context("the static pod gate task failed")??;
        let api: Api<Node> = Api::all(self.client.clone());
        let node = api
            .get(&self.node)
            .await
            .with_context(|| format!("reading node {}", self.node))?;
        let marks = |n: &Node| {
            merge_values(
                merge_values(uncordon_patch(n), maintenance_taint_patch(n, false)),
                lb_exclusion_patch(n, false),
            )
        };
        if marks(&node).is_none() && !gated {
            return Ok(());
        }
        let others = other_active_maintenances(&self.client, &self.node).await?;
        if !others.is_empty() {
            tracing::info!(node = %self.node, maintenance = %name, ?others, "the shutdown maintenance is gone or complete; the node stays cordoned for the others");
            return Ok(());
        }
        tracing::warn!(node = %self.node, maintenance = %name, gated, "{cause}: uncordoning the node and putting gated static pod manifests back");
        patch_node_with(&api, &self.node, "undo the shutdown's cordon", marks).await?;
        if gated {
            let gate = self.gate.clone();
            let kept = tokio::task::spawn_blocking(move || gate.restore_all())
                .await
                .context("the static pod restore task failed")??;
            if !kept.is_empty() {
                tracing::warn!(node = %self.node, ?kept, "gated manifests not restored (a file of that name exists)");
            }
        }
        self.bump();
        Ok(())
    }

    async fn clear_stale_shutdown_conditions(&self) -> Result<()> {
        let Some(node) = self.node_watched() else {
            return Ok(());
        };
        let api: Api<Node> = Api::all(self.client.clone());
        let want = Lifecycle::ShutdownOver {
            gns: self.writes_gns(),
            reason: REASON_SHUTDOWN_ENDED,
        };
        let r = set_lifecycle_conditions(&api, &node, want, "no shutdown is in progress").await;
        if gateway::answer(self, r)?.is_some() {
            tracing::info!(node = %self.node, "cleared the shutdown conditions a shutdown of an earlier boot (or a crash) left True");
        }
        Ok(())
    }

    /// `shutdown-<node>` as nodegrace creates it, for the shutdown of boot `boot_id`.
    pub(super) fn shutdown_maintenance(
        &self,
        stage: Stage,
        drain_plan: Vec<DrainPlanEntry>,
        boot_id: &str,
        kind: ShutdownKind,
        what: &str,
    ) -> NodeMaintenance {
        let kind = kind_str(kind);
        let mut m = NodeMaintenance::new(
            &shutdown_maintenance_name(&self.node),
            NodeMaintenanceSpec {
                node_selector: node_selector_for(&self.node),
                stage,
                drain_plan,
                reason: Some(format!("Node {kind}: {what} (boot id {boot_id})")),
            },
        );
        m.metadata.annotations = Some(BTreeMap::from([
            (BOOT_ID_ANNOTATION.to_string(), boot_id.to_string()),
            (SHUTDOWN_KIND_ANNOTATION.to_string(), kind.to_string()),
        ]));
        m.metadata.finalizers = Some(vec![FINALIZER_MAINTENANCE_COMPLETION.into()]);
        // Only this node's daemon watches it, and its status churn.
        if let Some(value) = crate::plan::own::node_label_value(&self.node) {
            m.metadata.labels = Some(BTreeMap::from([(
                crate::api::NODE_LABEL.to_string(),
                value.to_string(),
            )]));
        }
        m
    }

    pub(super) async fn ensure_shutdown_maintenance(
        &self,
        req: &ShutdownRequest,
        plan: &[DrainPlanEntry],
    ) -> Result<NodeMaintenance, EngineError> {
        let name = shutdown_maintenance_name(&self.node);
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let kind = kind_str(req.kind);
        let desired = self.shutdown_maintenance(
            Stage::Drain,
            plan.to_vec(),
            &req.boot_id,
            req.kind,
            "graceful shutdown by nodegrace",
        );
        let started = Instant::now();
        let mut known = self.maintenances.named(&name).map(|m| (*m).clone());
        loop {
            let existing = match known.take() {
                Some(m) => m,
                None => {
                    let params = PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    let created = api.create(&params, &desired).await;
                    let creating = format!("creating NodeMaintenance {name}");
                    match gateway::answer(self, created.with_context(|| creating.clone())) {
                        Ok(m) => {
                            tracing::info!(node = %self.node, maintenance = %name, "created the shutdown maintenance");
                            return Ok(m);
                        }
                        Err(f) if f.is(Kind::Conflict) => {
                            let read = api.get_opt(&name).await;
                            let reading = format!("reading NodeMaintenance {name}");
                            match gateway::answer(self, read.context(reading)) {
                                Ok(Some(m)) => m,
                                Ok(None) => continue,
                                Err(f) if f.apiserver_unusable() => {
                                    self.retry_or_unreachable(started).await?;
                                    continue;
                                }
                                Err(f) => return Err(f.into()),
                            }
                        }
                        Err(f) if f.apiserver_unusable() => {
                            self.retry_or_unreachable(started).await?;
                            continue;
                        }
                        Err(f) => return Err(f.into()),
                    }
                }
            };
            if is_deleting(&existing) || existing.spec.stage == Stage::Complete {
                // A finished maintenance cannot go back to Drain: replace it.
                if !is_deleting(&existing)
                    && !self.delete_completed(&api, &existing, started).await?
                {
                    continue;
                }
                self.wait_maintenance_gone(&name).await?;
                continue;
            }
            let same = existing.annotations().get(BOOT_ID_ANNOTATION) == Some(&req.boot_id)
                && existing
                    .annotations()
                    .get(SHUTDOWN_KIND_ANNOTATION)
                    .map(String::as_str)
                    == Some(kind)
                && existing.spec.stage == Stage::Drain
                && !existing
                    .annotations()
                    .contains_key(DRAIN_STOPPED_ANNOTATION);
            if same {
                tracing::info!(node = %self.node, maintenance = %name, "adopted the shutdown maintenance");
                return Ok(existing);
            }
            let mut patch = json!({"metadata": {"annotations": {
                BOOT_ID_ANNOTATION: req.boot_id,
                SHUTDOWN_KIND_ANNOTATION: kind,
                DRAIN_STOPPED_ANNOTATION: null,
            }}});
            if existing.spec.stage != Stage::Drain {
                patch["spec"] = json!({"stage": "Drain"});
            }
            let adopted = api
                .patch(&name, &merge_params(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("adopting NodeMaintenance {name}"));
            match gateway::answer(self, adopted) {
                Ok(m) => {
                    tracing::info!(node = %self.node, maintenance = %name, "adopted the shutdown maintenance");
                    return Ok(m);
                }
                Err(f) if f.apiserver_unusable() => self.retry_or_unreachable(started).await?,
                Err(f) if f.is(Kind::NotFound) => continue,
                Err(f) => return Err(f.into()),
            }
        }
    }

    /// Deletes the completed maintenance `existing`, that object exactly (uid and
    /// resourceVersion preconditions), so that it can be created anew. False when it changed
    /// or the apiserver did not answer: read it again.
    pub(super) async fn delete_completed(
        &self,
        api: &Api<NodeMaintenance>,
        existing: &NodeMaintenance,
        started: Instant,
    ) -> Result<bool, EngineError> {
        let name = existing.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: existing.uid(),
                resource_version: existing.resource_version(),
            }),
            ..DeleteParams::default()
        };
        let deleted = api
            .delete(&name, &params)
            .await
            .with_context(|| format!("replacing the completed NodeMaintenance {name} (delete)"));
        match gateway::answer(self, deleted) {
            Ok(_) => Ok(true),
            Err(f) if f.is(Kind::NotFound) => Ok(true),
            Err(f) if f.is(Kind::Conflict) => Ok(false),
            Err(f) if f.apiserver_unusable() => {
                self.retry_or_unreachable(started).await?;
                Ok(false)
            }
            Err(f) => Err(f.into()),
        }
    }

    pub(super) async fn wait_maintenance_gone(&self, name: &str) -> Result<(), EngineError> {
        let mut rx = self.wake.subscribe();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            rx.borrow_and_update();
            if self.maintenances.named(name).is_none() {
                return Ok(());
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return Err(anyhow::anyhow!("the engine stopped").into()) },
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(anyhow::anyhow!("NodeMaintenance {name} is still being deleted").into());
                }
            }
        }
    }

    /// Waits (bounded by `drain.volume_detach_timeout`) until the Node reports no volume in
    /// use by the kubelet (`status.volumesInUse`) and none attached (`status.volumesAttached`):
    /// the attach-detach controller drops a volume from the latter as it starts to detach
    /// it, once the kubelet has unmounted it. The Node is watched by name already, so this
    /// costs no watch of the cluster's VolumeAttachments.
    pub(super) async fn wait_volumes_detached(&self) {
        let timeout = self.settings().drain.volume_detach_timeout;
        let deadline = Instant::now() + timeout;
        let mut rx = self.wake.subscribe();
        loop {
            rx.borrow_and_update();
            let left = self
                .nodes
                .state()
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(self.node.as_str()))
                .map(|n| super::node_volumes(n))
                .unwrap_or_default();
            if left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(node = %self.node, volumes = ?left, "volumes still attached or in use after {timeout:?}; releasing anyway");
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}
