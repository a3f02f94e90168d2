//! Carrying out what the drain decided for each pod (`plan::drain::decide`): the
//! maintenance taint before DaemonSet pods go, the requests (a band at once, bounded
//! concurrency), static pod gates, and what each answer means for the next decision.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::api::NodeMaintenance;
use crate::cluster::evict::{anyhow_throttled, backoff, Outcome};
use crate::cluster::node::maintenance_taint_patch;
use crate::cluster::terminate::Request;
use crate::metrics::TerminationMethod;
use crate::plan::drain::{Action, Decision};
use crate::plan::reachability::Window;
use crate::plan::{PodInfo, PodType};

use super::{
    anyhow_is_unusable, daemonset_owner, is_api_answer, tolerates_everything, DrainState,
    MaintView, Shared, RETRY_AFTER_ERROR,
};

/// Names listed in one event; the count stays exact beyond it.
const EVENT_MAX_NAMES: usize = 20;

fn listed(names: &[String]) -> String {
    let mut text = names
        .iter()
        .take(EVENT_MAX_NAMES)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > EVENT_MAX_NAMES {
        text.push_str(&format!(" and {} more", names.len() - EVENT_MAX_NAMES));
    }
    text
}

impl Shared {
    pub(super) async fn terminate(
        &self,
        st: &mut DrainState,
        node: &Node,
        classified: &[(Arc<Pod>, PodInfo)],
        decision: &Decision,
        views: &[MaintView],
        cap: Duration,
    ) -> Result<Option<Duration>> {
        let raw: HashMap<&str, &Arc<Pod>> = classified
            .iter()
            .map(|(p, i)| (i.uid.as_str(), p))
            .collect();
        st.tracks.retain(|uid, _| raw.contains_key(uid.as_str()));
        if views.is_empty() || decision.actions.is_empty() {
            return Ok(None);
        }
        let first_holder = |pod: &PodInfo| {
            views
                .iter()
                .find(|v| v.targets.targets(pod))
                .unwrap_or(&views[0])
        };

        if decision.deletes_daemonset_pods() {
            self.taint_for_daemonsets(st, node, &views[0]).await?;
        }

        let mut jobs = Vec::new();
        let mut statics = Vec::new();
        let mut tolerant = Vec::new();
        for (pod, action) in &decision.actions {
            let request = match *action {
                Action::Evict => Request::Cooperative,
                Action::Delete { grace_seconds } | Action::Escalate { grace_seconds } => {
                    Request::Delete { grace_seconds }
                }
                Action::Gate => {
                    statics.push(pod.clone());
                    continue;
                }
            };
            let object = raw.get(pod.uid.as_str()).map(|p| (*p).clone());
            if matches!(action, Action::Delete { .. }) {
                if let Some(owner) = object
                    .as_ref()
                    .filter(|o| tolerates_everything(o))
                    .and_then(|o| daemonset_owner(o))
                {
                    st.daemonset_terminated
                        .insert(owner.to_string(), pod.uid.clone());
                    tolerant.push(pod.key());
                }
            }
            let escalated = matches!(action, Action::Escalate { .. });
            jobs.push((
                pod.clone(),
                object,
                request,
                first_holder(pod).name.clone(),
                escalated,
            ));
        }
        if !tolerant.is_empty() {
            tracing::warn!(node = %self.node, pods = ?tolerant, "DaemonSet pods tolerate every taint: terminated once; the replacements their controller creates are left running");
            self.event_both(
                node,
                Some(&views[0].m),
                true,
                "TolerateEverything",
                format!(
                    "DaemonSet pods tolerating every taint are terminated once; their controller recreates them on the node and the replacements are left running: {}",
                    listed(&tolerant)
                ),
            );
        }

        let terminator = self.terminator.clone();
        let max = self.settings().drain.max_concurrent_requests;
        let window = st.window.get_or_insert_with(|| Window::new(max));
        window.set_max(max);
        let concurrency = window.limit();
        let results: Vec<_> = futures::stream::iter(jobs)
            .map(|(pod, object, request, m, escalated)| {
                let terminator = terminator.clone();
                async move {
                    let r = terminator
                        .terminate(&pod, object.as_deref(), request, &m)
                        .await;
                    (pod, request, m, escalated, r)
                }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let now = self.epoch.elapsed();
        // The earliest retry the answers call for (the next decision waits for it).
        let mut retry: Option<Duration> = None;
        let mut retry_at = |at: Duration| retry = Some(retry.map_or(at, |r| r.min(at)));
        let mut escalations: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut blocked: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        let mut throttled: BTreeMap<(String, Duration), Vec<String>> = BTreeMap::new();
        let (mut taken, mut any_throttled) = (0, false);
        for (pod, request, m, escalated, result) in results {
            match &result {
                Err(err) if anyhow_throttled(err).is_some() => any_throttled = true,
                Err(err) if !is_api_answer(err) => {}
                _ => taken += 1,
            }
            let track = st.tracks.entry(pod.uid.clone()).or_default();
            match result {
                Ok(Outcome::Accepted) => {
                    self.mark_reachable();
                    track.asked = true;
                    track.accepted = true;
                    track.blocked_by = None;
                    self.metrics.pod_terminated(self.terminator.method(request));
                    if escalated {
                        track.escalated = true;
                        self.metrics.escalated();
                        tracing::warn!(node = %self.node, maintenance = %m, pod = %pod.key(), ?request, "escalated to DELETE at the shutdown deadline");
                        escalations.entry(m).or_default().push(pod.key());
                    }
                }
                Ok(Outcome::Gone) => {
                    self.mark_reachable();
                    track.asked = true;
                    track.escalated |= escalated;
                    // Not taken as done: an apiserver that just restarted answers 404 for a
                    // pod it still has. Gone, the watch drops it before the retry; still
                    // there and not terminating, it is asked again.
                    track.last_try = Some((now, RETRY_AFTER_ERROR));
                    retry_at(now + RETRY_AFTER_ERROR);
                }
                Ok(Outcome::Blocked { budget, message }) => {
                    self.mark_reachable();
                    track.asked = true;
                    let delay = backoff(track.attempts, cap);
                    track.attempts += 1;
                    track.last_try = Some((now, delay));
                    retry_at(now + delay);
                    let by = budget
                        .map(|b| format!("PodDisruptionBudget {}/{b}", pod.namespace))
                        .unwrap_or(message);
                    if track.blocked_by.as_deref() != Some(by.as_str()) {
                        tracing::info!(node = %self.node, maintenance = %m, pod = %pod.key(), blocked_by = %by, "eviction blocked");
                        blocked.entry((m, by.clone())).or_default().push(pod.key());
                    }
                    track.blocked_by = Some(by);
                }
                Err(err) if anyhow_throttled(&err).is_some() => {
                    // The apiserver did not look at the request: the pod is not asked (so
                    // not escalated for it) and no back-off is earned. The band's retries are
                    // spread over the wait again, not sent at once into the same throttle.
                    let wait = anyhow_throttled(&err).unwrap_or(RETRY_AFTER_ERROR);
                    let delay = wait.mul_f64(1.0 + rand::random::<f64>());
                    track.last_try = Some((now, delay));
                    retry_at(now + delay);
                    self.metrics.api_error("throttled");
                    if track.throttled == 0 {
                        throttled.entry((m, wait)).or_default().push(pod.key());
                    }
                    track.throttled = track.throttled.saturating_add(1);
                }
                Err(err) => {
                    // An answer refusing the request counts as asked; no answer does not.
                    track.asked |= is_api_answer(&err);
                    if anyhow_is_unusable(&err) {
                        self.mark_unreachable(&crate::cluster::error_text(&err));
                    }
                    self.metrics.api_error("terminate");
                    tracing::warn!(node = %self.node, pod = %pod.key(), error = crate::cluster::error_text(&err), "terminating a pod failed");
                    track.last_try = Some((now, RETRY_AFTER_ERROR));
                    retry_at(now + RETRY_AFTER_ERROR);
                }
            }
        }
        if let Some(window) = st.window.as_mut() {
            if any_throttled {
                window.throttled();
            } else {
                window.taken(taken);
            }
        }
        let maintenance = |name: &str| views.iter().find(|v| v.name == name).map(|v| v.m.clone());
        for (m, pods) in escalations {
            self.event_both(
                node,
                maintenance(&m).as_deref(),
                true,
                "Escalated",
                format!(
                    "{} pod(s) still running at their shutdown deadline: deleted with the grace left: {}",
                    pods.len(),
                    listed(&pods)
                ),
            );
        }
        for ((m, by), pods) in blocked {
            self.event_both(
                node,
                maintenance(&m).as_deref(),
                true,
                "EvictionBlocked",
                format!(
                    "eviction of {} pod(s) blocked by {by}; retrying with back-off: {}",
                    pods.len(),
                    listed(&pods)
                ),
            );
        }

        for ((m, wait), pods) in throttled {
            tracing::warn!(node = %self.node, maintenance = %m, pods = pods.len(), retry_after = ?wait, "the apiserver throttles the drain's requests (429); asking again after its wait");
            self.event_both(
                node,
                maintenance(&m).as_deref(),
                true,
                "Throttled",
                format!(
                    "the apiserver throttled the requests for {} pod(s) (429 Too Many Requests); asking again after {}: {}",
                    pods.len(),
                    humantime::format_duration(wait),
                    listed(&pods)
                ),
            );
        }

        if !statics.is_empty() {
            self.gate_static_pods(st, node, &statics, views).await?;
        }
        Ok(retry)
    }

    /// The `nodegrace.dev/maintenance:NoSchedule` taint, so that the DaemonSet controller
    /// does not recreate the pods about to be deleted.
    async fn taint_for_daemonsets(
        &self,
        st: &mut DrainState,
        node: &Node,
        first: &MaintView,
    ) -> Result<()> {
        if maintenance_taint_patch(node, true).is_none() {
            return Ok(());
        }
        self.patch_node(st, "taint for DaemonSet pods", |n| {
            maintenance_taint_patch(n, true)
        })
        .await?;
        self.event_both(
            node,
            Some(&first.m),
            false,
            "Tainted",
            "node tainted nodegrace.dev/maintenance:NoSchedule before deleting DaemonSet pods"
                .into(),
        );
        Ok(())
    }

    /// Moves the files of the kubelet's manifest directory that it refuses (no pod, so no
    /// priority to order them by) out with the static pods, last: once the node is empty.
    pub(super) async fn gate_unreadable_manifests(
        &self,
        st: &mut DrainState,
        node: &Node,
        maintenance: Option<&NodeMaintenance>,
    ) {
        let gate = self.gate.clone();
        let outcome = tokio::task::spawn_blocking(move || gate.gate_unreadable())
            .await
            .context("the static pod gate task failed")
            .and_then(|r| r);
        let results = match outcome {
            Ok(results) => results,
            Err(err) => {
                tracing::warn!(node = %self.node, error = format!("{err:#}"), "cannot read the static pod manifest directory");
                return;
            }
        };
        for (file, r) in results {
            match r {
                Ok(()) => {
                    tracing::info!(node = %self.node, manifest = %file, "gated a file the kubelet refuses as a static pod manifest (no priority to read: last)")
                }
                Err(_) if st.unreadable_not_gated.contains(&file) => {}
                Err(err) => {
                    st.unreadable_not_gated.insert(file.clone());
                    tracing::warn!(node = %self.node, manifest = %file, error = format!("{err:#}"), "cannot gate a file the kubelet refuses as a static pod manifest");
                    self.event_both(
                        node,
                        maintenance,
                        true,
                        "StaticPodNotGated",
                        format!("{file}: {err:#}"),
                    );
                }
            }
        }
    }

    /// Moves the manifests of `statics` out of the kubelet's manifest directory.
    async fn gate_static_pods(
        &self,
        st: &mut DrainState,
        node: &Node,
        statics: &[PodInfo],
        views: &[MaintView],
    ) -> Result<()> {
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
            debug_assert_eq!(pod.pod_type, PodType::Static);
            let track = st.tracks.entry(pod.uid.clone()).or_default();
            track.asked = true;
            track.accepted = true;
            match r {
                Ok(file) => {
                    self.metrics.pod_terminated(TerminationMethod::StaticGate);
                    tracing::info!(node = %self.node, pod = %pod.key(), manifest = %file, "static pod manifest gated");
                }
                Err(err) => {
                    tracing::warn!(node = %self.node, pod = %pod.key(), error = crate::cluster::error_text(&err), "cannot gate a static pod");
                    self.event_both(
                        node,
                        views.first().map(|v| v.m.as_ref()),
                        true,
                        "StaticPodNotGated",
                        crate::cluster::error_text(&err),
                    );
                }
            }
        }
        Ok(())
    }
}
