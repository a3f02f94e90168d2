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
use crate::cluster::evict::{self, Outcome};
use crate::cluster::gateway::{self, Reply};
use crate::cluster::node::maintenance_taint_patch;
use crate::cluster::terminate::Request;
use crate::metrics::TerminationMethod;
use crate::plan::drain::Action;
use crate::plan::pass::{self, Answer, Noted, PassDecisions, PodRequest};
use crate::plan::reachability::Window;
use crate::plan::{PodInfo, PodType};

use super::{describe_targets, DrainState, MaintView, Shared, RETRY_AFTER_ERROR};

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

/// What the answers of a pass call for telling, by maintenance.
#[derive(Default)]
struct Told {
    escalated: BTreeMap<String, Vec<String>>,
    blocked: BTreeMap<(String, String), Vec<String>>,
    throttled: BTreeMap<(String, Duration), Vec<String>>,
}

impl Shared {
    /// Sends the pass's requests (a band at once, as many in flight as the window allows),
    /// gates its static pods, and records each answer in the pod's track. Returns the
    /// earliest retry the answers call for.
    pub(super) async fn terminate(
        &self,
        st: &mut DrainState,
        node: &Node,
        classified: &[(Arc<Pod>, PodInfo)],
        d: &PassDecisions,
        views: &[MaintView],
    ) -> Result<Option<Duration>> {
        let raw: HashMap<&str, &Arc<Pod>> = classified
            .iter()
            .map(|(p, i)| (i.uid.as_str(), p))
            .collect();
        st.tracks.retain(|uid, _| raw.contains_key(uid.as_str()));
        if views.is_empty() || (d.requests.is_empty() && d.gates.is_empty()) {
            return Ok(None);
        }
        if d.taint {
            self.taint_for_daemonsets(st, node, &views[0]).await?;
        }
        let mut tolerant = Vec::new();
        for r in &d.requests {
            if let Some(owner) = &r.tolerant_daemonset {
                st.daemonset_terminated
                    .insert(owner.clone(), r.pod.uid.clone());
                tolerant.push(r.pod.key());
            }
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
        let results: Vec<_> = futures::stream::iter(d.requests.iter().cloned())
            .map(|r| {
                let terminator = terminator.clone();
                let object = raw.get(r.pod.uid.as_str()).map(|p| (*p).clone());
                let request = match r.action {
                    Action::Delete { grace_seconds } | Action::Escalate { grace_seconds } => {
                        Request::Delete { grace_seconds }
                    }
                    Action::Evict | Action::Gate => Request::Cooperative,
                };
                async move {
                    let result = terminator
                        .terminate(&r.pod, object.as_deref(), request, &r.maintenance)
                        .await;
                    (r, request, result)
                }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let now = self.epoch.elapsed();
        let band = describe_targets(&st.targets);
        let mut retry: Option<Duration> = None;
        let mut told = Told::default();
        let (mut taken, mut any_throttled) = (0, false);
        for (r, request, result) in results {
            let result = gateway::answer_paced(self, result);
            if let Some(why) = evict::refusal(&result) {
                self.metrics.eviction_refused(why);
            }
            match &result {
                Err(f) if f.throttled().is_some() => any_throttled = true,
                Err(f) if !f.answered() => {}
                _ => taken += 1,
            }
            let answer = self.answer(&r, result);
            let track = st.tracks.entry(r.pod.uid.clone()).or_default();
            let escalated = matches!(r.action, Action::Escalate { .. });
            let noted = pass::note_answer(
                track,
                &answer,
                escalated,
                now,
                d.backoff_cap,
                RETRY_AFTER_ERROR,
                rand::random::<f64>(),
            );
            if let Some(at) = noted.retry {
                retry = Some(retry.map_or(at, |r| r.min(at)));
            }
            self.told(&mut told, &r, request, &answer, noted, &band);
        }
        if let Some(window) = st.window.as_mut() {
            if any_throttled {
                window.throttled();
            } else {
                window.taken(taken);
            }
        }
        self.tell(node, views, told);
        if !d.gates.is_empty() {
            self.gate_static_pods(st, node, &d.gates, views, &band)
                .await?;
        }
        Ok(retry)
    }

    /// Deletes the mirror pods `plan::bandend` says to (once each; the kubelet deletes any
    /// left).
    pub(super) async fn delete_mirrors(&self, st: &mut DrainState, mirrors: &[PodInfo]) {
        for pod in mirrors {
            if let Some(track) = st.tracks.get_mut(&pod.uid) {
                track.node.mirror_deleted = true;
            }
            let result = self.terminator.delete_mirror(pod).await;
            match gateway::answer_paced(self, result) {
                Ok(outcome) => {
                    tracing::info!(node = %self.node, pod = %pod.key(), ?outcome, "the static pod left the node: its mirror pod deleted");
                }
                Err(f) => {
                    tracing::info!(node = %self.node, pod = %pod.key(), error = f.text(), "deleting the mirror pod of a static pod that left the node failed: the kubelet deletes it");
                }
            }
        }
    }

    /// The terminator's answer as `plan::pass` reads it.
    fn answer(&self, r: &PodRequest, result: Reply<Outcome>) -> Answer {
        match result {
            Ok(outcome) => match outcome {
                Outcome::Accepted => Answer::Accepted,
                Outcome::Gone => Answer::Gone,
                Outcome::Blocked { budget, message } => {
                    let budget = budget.map(|b| format!("{}/{b}", r.pod.namespace));
                    Answer::Blocked {
                        by: budget
                            .as_ref()
                            .map(|b| format!("PodDisruptionBudget {b}"))
                            .unwrap_or(message),
                        budget,
                    }
                }
            },
            Err(f) => match f.throttled() {
                Some(wait) => Answer::Throttled { wait },
                None => {
                    self.metrics.api_error("terminate");
                    tracing::warn!(node = %self.node, pod = %r.pod.key(), error = f.text(), "terminating a pod failed");
                    // An answer refusing the request counts as asked; no answer does not.
                    Answer::Failed {
                        answered: f.answered(),
                    }
                }
            },
        }
    }

    /// Metrics and logs of one answer; what is worth an event goes into `told`.
    fn told(
        &self,
        told: &mut Told,
        r: &PodRequest,
        request: Request,
        answer: &Answer,
        noted: Noted,
        band: &str,
    ) {
        let m = r.maintenance.clone();
        match answer {
            Answer::Accepted => {
                self.metrics
                    .pod_terminated(self.terminator.method(&r.pod, request), band);
                if noted.escalated {
                    self.metrics.escalated();
                    tracing::warn!(node = %self.node, maintenance = %m, pod = %r.pod.key(), ?request, "escalated to DELETE at the shutdown deadline");
                    told.escalated.entry(m).or_default().push(r.pod.key());
                }
            }
            Answer::Blocked { by, .. } if noted.newly_blocked => {
                tracing::info!(node = %self.node, maintenance = %m, pod = %r.pod.key(), blocked_by = %by, "eviction blocked");
                told.blocked
                    .entry((m, by.clone()))
                    .or_default()
                    .push(r.pod.key());
            }
            Answer::Throttled { wait } => {
                self.metrics.api_error("throttled");
                if noted.first_throttle {
                    told.throttled
                        .entry((m, *wait))
                        .or_default()
                        .push(r.pod.key());
                }
            }
            _ => {}
        }
    }

    /// One event per maintenance and kind of news.
    fn tell(&self, node: &Node, views: &[MaintView], told: Told) {
        let maintenance = |name: &str| views.iter().find(|v| v.name == name).map(|v| v.m.clone());
        for (m, pods) in told.escalated {
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
        for ((m, by), pods) in told.blocked {
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
        for ((m, wait), pods) in told.throttled {
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
        band: &str,
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
                    track.node.gated = true;
                    self.metrics
                        .pod_terminated(TerminationMethod::StaticGate, band);
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
