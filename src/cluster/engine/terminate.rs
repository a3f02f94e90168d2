//! Carrying out what the drain decided for each pod: evictions, DELETEs, static pod gates.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};

use tokio::time::Instant;

use crate::cluster::evict::{backoff, Outcome};
use crate::cluster::node::maintenance_taint_patch;
use crate::cluster::terminate::Request;
use crate::metrics::TerminationMethod;
use crate::plan::budget::escalation_grace;
use crate::plan::{PodInfo, PodType};

use super::{
    anyhow_is_unusable, daemonset_owner, lock, min_wake, tolerates_everything, DrainState, Job,
    MaintView, Shared, ShutdownCtx, CONCURRENT_REQUESTS, RETRY_AFTER_ERROR,
};

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn terminate_targeted(
        &self,
        st: &mut DrainState,
        node: &Node,
        raw_pods: &[Arc<Pod>],
        pods: &[PodInfo],
        views: &[MaintView],
        ctx: Option<&ShutdownCtx>,
        wake: &mut Option<Instant>,
    ) -> Result<()> {
        let now = Instant::now();
        let present: HashSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
        st.tracks.retain(|uid, _| present.contains(uid.as_str()));
        if views.is_empty() {
            return Ok(());
        }
        let cap = if ctx.is_some() {
            self.settings.drain.eviction_backoff_max_shutdown
        } else {
            self.settings.drain.eviction_backoff_max
        };
        if st.backoff_cap != Some(cap) {
            if let Some(handle) = lock(&self.eviction_requests).as_ref() {
                handle.set_backoff_max(cap);
                st.backoff_cap = Some(cap);
            }
        }
        let raw: HashMap<&str, &Arc<Pod>> = raw_pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, p)))
            .collect();
        let first_holder = |pod: &PodInfo| {
            views
                .iter()
                .find(|v| v.targets.targets(pod))
                .map(|v| v.name.clone())
                .unwrap_or_else(|| views[0].name.clone())
        };
        let mut jobs = Vec::new();
        let mut statics = Vec::new();
        let mut daemonsets = Vec::new();
        // In plan order (type, then ascending priority), so requests go out in that order.
        let mut targeted: Vec<&PodInfo> = pods
            .iter()
            .filter(|p| p.is_active() && st.targets.targets(p))
            .collect();
        targeted.sort_by_key(|p| (p.pod_type, p.priority));
        for pod in targeted {
            let track = st.tracks.entry(pod.uid.clone()).or_default();
            if let (Some(c), true) = (ctx, pod.pod_type != PodType::Static) {
                if let Some(step) = c
                    .step_of(pod)
                    .and_then(|i| c.schedule.iter().find(|s| s.index == i))
                {
                    let escalate_at = c.start + step.escalate_at;
                    if c.escalate && !track.escalated {
                        if now >= escalate_at {
                            let end = c.start + step.end;
                            let outlasts = |p: &Pod| {
                                let deadline = p
                                    .metadata
                                    .deletion_timestamp
                                    .as_ref()
                                    .map(|t| t.0.as_millisecond());
                                let left =
                                    i64::try_from(end.saturating_duration_since(now).as_millis())
                                        .unwrap_or(i64::MAX);
                                deadline.is_none_or(|d| {
                                    d > chrono::Utc::now().timestamp_millis().saturating_add(left)
                                })
                            };
                            if raw.get(pod.uid.as_str()).is_some_and(|p| outlasts(p)) {
                                let grace =
                                    escalation_grace(pod.grace_period(), now - c.start, step.end);
                                jobs.push(Job::Terminate(
                                    pod.clone(),
                                    Request::Delete {
                                        grace_seconds: i64::try_from(grace.as_secs())
                                            .unwrap_or(i64::MAX),
                                    },
                                    c.name.clone(),
                                    true,
                                ));
                                continue;
                            }
                        } else {
                            min_wake(wake, escalate_at);
                        }
                    }
                }
            }
            if pod.terminating || track.accepted {
                continue;
            }
            if let Some((at, delay)) = track.last_try {
                // The cap in force now: a shutdown starting mid back-off shortens it.
                let t = at + delay.min(cap);
                if t > now {
                    min_wake(wake, t);
                    continue;
                }
            }
            match pod.pod_type {
                PodType::Default => jobs.push(Job::Terminate(
                    pod.clone(),
                    Request::Cooperative,
                    first_holder(pod),
                    false,
                )),
                PodType::DaemonSet => daemonsets.push(pod.clone()),
                PodType::Static => statics.push(pod.clone()),
            }
        }

        if !daemonsets.is_empty() {
            let first = views.first().map(|v| v.m.as_ref());
            if maintenance_taint_patch(node, true).is_some() {
                self.patch_node(st, "taint for DaemonSet pods", |n| {
                    maintenance_taint_patch(n, true)
                })
                .await?;
                self.event_both(
                    node,
                    first,
                    false,
                    "Tainted",
                    "node tainted nodegrace.dev/maintenance:NoSchedule before deleting DaemonSet pods".into(),
                );
            }
            let tolerant: Vec<String> = daemonsets
                .iter()
                .filter(|p| {
                    raw.get(p.uid.as_str())
                        .is_some_and(|r| tolerates_everything(r))
                })
                .filter(|p| st.announced.insert(format!("tolerant/{}", p.uid)))
                .map(PodInfo::key)
                .collect();
            if !tolerant.is_empty() {
                tracing::warn!(node = %self.node, pods = ?tolerant, "DaemonSet pods tolerate every taint: terminated once; the replacements their controller creates are left running");
                self.event_both(
                    node,
                    first,
                    true,
                    "TolerateEverything",
                    format!(
                        "DaemonSet pods tolerating every taint are terminated once; their controller recreates them on the node and the replacements are left running: {}",
                        tolerant.join(", ")
                    ),
                );
            }
            for pod in daemonsets {
                if let Some(owner) = raw
                    .get(pod.uid.as_str())
                    .filter(|r| tolerates_everything(r))
                    .and_then(|r| daemonset_owner(r))
                {
                    st.daemonset_terminated
                        .insert(owner.to_string(), pod.uid.clone());
                }
                let m = first_holder(&pod);
                let grace = pod.termination_grace_period_seconds;
                jobs.push(Job::Terminate(
                    pod,
                    Request::Delete {
                        grace_seconds: grace,
                    },
                    m,
                    false,
                ));
            }
        }

        let terminator = self.terminator.clone();
        let results: Vec<(PodInfo, Request, String, bool, Result<Outcome>)> =
            futures::stream::iter(jobs)
                .map(|Job::Terminate(pod, req, m, esc)| {
                    let terminator = terminator.clone();
                    async move {
                        let r = terminator.terminate(&pod, req, &m).await;
                        (pod, req, m, esc, r)
                    }
                })
                .buffer_unordered(CONCURRENT_REQUESTS)
                .collect()
                .await;
        for (pod, req, m, escalated, result) in results {
            let track = st.tracks.entry(pod.uid.clone()).or_default();
            let mobj = views.iter().find(|v| v.name == m).map(|v| v.m.clone());
            match result {
                Ok(Outcome::Accepted) => {
                    self.mark_reachable();
                    track.accepted = true;
                    track.blocked_by = None;
                    self.metrics.pod_terminated(self.terminator.method(req));
                    if escalated {
                        track.escalated = true;
                        self.metrics.escalated();
                        tracing::warn!(node = %self.node, pod = %pod.key(), ?req, "escalated to DELETE at the shutdown deadline");
                        self.event_both(
                            node,
                            mobj.as_deref(),
                            true,
                            "Escalated",
                            format!(
                                "pod {} still running at its shutdown deadline: deleted ({req:?})",
                                pod.key()
                            ),
                        );
                    }
                }
                Ok(Outcome::Gone) => {
                    self.mark_reachable();
                    track.accepted = true;
                    track.escalated |= escalated;
                }
                Ok(Outcome::Blocked { budget, message }) => {
                    self.mark_reachable();
                    let delay = backoff(track.attempts, cap);
                    track.attempts += 1;
                    track.last_try = Some((now, delay));
                    min_wake(wake, now + delay);
                    let by = budget
                        .map(|b| format!("PodDisruptionBudget {}/{b}", pod.namespace))
                        .unwrap_or(message);
                    if track.blocked_by.as_deref() != Some(by.as_str()) {
                        tracing::info!(node = %self.node, pod = %pod.key(), blocked_by = %by, "eviction blocked");
                        self.event_both(
                            node,
                            mobj.as_deref(),
                            true,
                            "EvictionBlocked",
                            format!(
                                "eviction of pod {} blocked by {by}; retrying with back-off",
                                pod.key()
                            ),
                        );
                    }
                    track.blocked_by = Some(by);
                }
                Err(err) => {
                    if anyhow_is_unusable(&err) {
                        self.mark_unreachable(&format_args!("{err:#}"));
                    }
                    self.metrics.api_error("terminate");
                    tracing::warn!(node = %self.node, pod = %pod.key(), error = format!("{err:#}"), "terminating a pod failed");
                    track.last_try = Some((now, RETRY_AFTER_ERROR));
                    min_wake(wake, now + RETRY_AFTER_ERROR);
                }
            }
        }

        if !statics.is_empty() {
            let gate = self.gate.clone();
            let node_name = self.node.clone();
            let wanted: Vec<(String, String)> = statics
                .iter()
                .map(|p| (p.namespace.clone(), p.name.clone()))
                .collect();
            let outcome =
                tokio::task::spawn_blocking(move || -> Result<Vec<(usize, Result<String>)>> {
                    let manifests = gate.active()?;
                    Ok(wanted
                        .iter()
                        .enumerate()
                        .map(|(i, (ns, name))| {
                            let r = manifests
                                .iter()
                                .find(|m| m.is_mirrored_by(ns, name, &node_name))
                                .map(|m| m.file_name.clone())
                                .with_context(|| {
                                    format!("no static pod manifest mirrors pod {ns}/{name}")
                                })
                                .and_then(|file| gate.gate(&file).map(|()| file));
                            (i, r)
                        })
                        .collect())
                })
                .await
                .context("the static pod gate task failed")??;
            for (i, r) in outcome {
                let pod = &statics[i];
                let track = st.tracks.entry(pod.uid.clone()).or_default();
                match r {
                    Ok(file) => {
                        track.accepted = true;
                        self.metrics.pod_terminated(TerminationMethod::StaticGate);
                        tracing::info!(node = %self.node, pod = %pod.key(), manifest = %file, "static pod manifest gated");
                    }
                    Err(err) => {
                        track.accepted = true;
                        tracing::warn!(node = %self.node, pod = %pod.key(), error = format!("{err:#}"), "cannot gate a static pod");
                        self.event_both(
                            node,
                            views.first().map(|v| v.m.as_ref()),
                            true,
                            "StaticPodNotGated",
                            format!("{err:#}"),
                        );
                    }
                }
            }
        }
        Ok(())
    }
}
