//! What the offline (CRI) fallback did, recorded on the shutdown maintenance once the
//! apiserver answers: during the shutdown, or after the boot when it never came back.

use std::sync::Arc;

use anyhow::{Context as _, Result};

use kube::api::{Patch, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::api::{NodeMaintenance, Stage};
use crate::cluster::gateway::{self, Kind};
use crate::cluster::FIELD_MANAGER;
use crate::config::CompletionPolicy;
use crate::state::OfflineDrain;

use super::{
    merge_params, shutdown_maintenance_name, AfterBoot, DrainState, Shared, FALLBACK_ANNOTATION,
};

/// What the offline fallback did, as the engine records it on the maintenance (the
/// `nodegrace.dev/fallback-report` annotation, JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FallbackSummary {
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    pub pods_stopped: usize,
    pub pods_not_stopped: usize,
    /// Pods whose band had not started when the fallback ended (handed to the cluster
    /// path, or the shutdown's time was up).
    pub pods_not_reached: usize,
    pub kubelet_stopped: bool,
    /// `namespace/name` of the pods stopped (or, static pods with nothing running, gated).
    pub stopped: Vec<String>,
    /// `namespace/name: what went wrong` for the pods it tried to stop and could not.
    pub not_stopped: Vec<String>,
    /// `namespace/name: why` for the pods it never got to: the runtime could not be
    /// listed or did not list them, or their band had not started.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_reached: Vec<String>,
    /// Why the kubelet was not confirmed stopped (the last run's), when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_not_stopped: Option<String>,
    /// Why the CRI runtime could not be used, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_unusable: Option<String>,
    /// Files the kubelet refuses as static pod manifests, gated after the last band.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gated_unreadable: Vec<String>,
}

/// The status the kubelet's graceful node shutdown gives the pods it stops (KEP-2000).
const GNS_REASON: &str = "Terminated";
const GNS_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// Pods listed by name in the annotation; the counts stay exact beyond it.
const SUMMARY_MAX_NAMES: usize = 200;

impl FallbackSummary {
    /// One summary over every fallback run of a shutdown, in order.
    pub(crate) fn of_runs(runs: &[crate::fallback::FallbackReport]) -> Self {
        use crate::fallback::PodOutcome;
        let mut s = FallbackSummary {
            started_at: runs.iter().find_map(|r| r.started_at),
            finished_at: runs.iter().rev().find_map(|r| r.finished_at),
            kubelet_stopped: runs.last().is_some_and(|r| r.kubelet_stopped),
            kubelet_not_stopped: runs
                .iter()
                .rev()
                .find_map(|r| r.kubelet_not_stopped.clone()),
            runtime_unusable: runs.iter().rev().find_map(|r| r.runtime_unusable.clone()),
            gated_unreadable: runs
                .iter()
                .flat_map(|r| r.gated_unreadable.iter().cloned())
                .collect(),
            ..Default::default()
        };
        for pod in runs.iter().flat_map(|r| &r.pods) {
            let key = format!("{}/{}", pod.namespace, pod.name);
            if matches!(pod.outcome, PodOutcome::Stopped | PodOutcome::Gated) {
                s.pods_stopped += 1;
                if s.stopped.len() < SUMMARY_MAX_NAMES {
                    s.stopped.push(key);
                }
            } else if matches!(pod.outcome, PodOutcome::Pending | PodOutcome::NotReached) {
                s.pods_not_reached += 1;
                if s.not_reached.len() < SUMMARY_MAX_NAMES {
                    let why = pod.errors.first().cloned().unwrap_or_else(|| {
                        "its band had not started when the fallback ended".to_string()
                    });
                    s.not_reached.push(format!("{key}: {why}"));
                }
            } else {
                s.pods_not_stopped += 1;
                if s.not_stopped.len() < SUMMARY_MAX_NAMES {
                    let why = pod.errors.first().cloned().unwrap_or_else(|| {
                        if pod.outcome == PodOutcome::Stopping {
                            "still stopping when the fallback ended".to_string()
                        } else {
                            format!("{:?}", pod.outcome).to_lowercase()
                        }
                    });
                    s.not_stopped.push(format!("{key}: {why}"));
                }
            }
        }
        s
    }

    /// The Event note.
    pub(crate) fn describe(&self) -> String {
        let mut note = format!(
            "the apiserver was unreachable: the local fallback stopped {} pod(s), {} not stopped, {} not reached",
            self.pods_stopped, self.pods_not_stopped, self.pods_not_reached
        );
        if let Some(why) = &self.runtime_unusable {
            note.push_str(&format!("; the CRI runtime could not be used: {why}"));
        }
        if let Some(why) = &self.kubelet_not_stopped {
            note.push_str(&format!("; the kubelet did not stop: {why}"));
        }
        note
    }
}

impl From<&crate::fallback::FallbackReport> for FallbackSummary {
    fn from(r: &crate::fallback::FallbackReport) -> Self {
        Self::of_runs(std::slice::from_ref(r))
    }
}

impl Shared {
    /// Creates `shutdown-<node>` for a shutdown the apiserver never saw, recording what the
    /// local fallback did: at stage Complete (the engine then carries the completion out:
    /// static pods restored, node entry written) or, to keep it, at Drain. None when it
    /// exists already.
    pub(super) async fn create_offline_record(
        &self,
        record: &OfflineDrain,
        policy: CompletionPolicy,
    ) -> Result<Option<AfterBoot>> {
        let name = shutdown_maintenance_name(&self.node);
        let summary = FallbackSummary::of_runs(&record.reports);
        let stage = match policy {
            CompletionPolicy::Complete => Stage::Complete,
            CompletionPolicy::Keep => Stage::Drain,
        };
        let text = serde_json::to_string(&summary).context("encoding the fallback summary")?;
        let mut desired = self.shutdown_maintenance(
            stage,
            crate::plan::shutdown_drain_plan(&self.settings()).context("normalizing drain.plan")?,
            &record.boot_id,
            record.kind,
            "drained offline by nodegrace's local fallback, the apiserver being unreachable",
        );
        desired
            .annotations_mut()
            .insert(FALLBACK_ANNOTATION.to_string(), text);
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let created = match gateway::answer(self, api.create(&params, &desired).await) {
            Ok(m) => m,
            Err(f) if f.is(Kind::Conflict) => return Ok(None),
            Err(f) if f.is(Kind::NotFound) => {
                tracing::error!(node = %self.node, maintenance = %name, "the offline drain of the last shutdown cannot be recorded: the NodeMaintenance CRD is not installed (see /usr/share/nodegrace/crds)");
                return Ok(Some(AfterBoot::Unrecorded));
            }
            Err(f) => {
                return Err(f
                    .context(format!(
                        "creating NodeMaintenance {name} for the offline drain"
                    ))
                    .into())
            }
        };
        self.bump();
        tracing::info!(node = %self.node, maintenance = %name, ?stage, stopped = summary.pods_stopped, not_stopped = summary.pods_not_stopped, "recorded the offline drain of the last shutdown");
        self.event_offline_record(&created, &summary);
        Ok(Some(match policy {
            CompletionPolicy::Complete => AfterBoot::Completed,
            CompletionPolicy::Keep => AfterBoot::Kept,
        }))
    }

    /// Writes the fallback summary onto the shutdown maintenance of the earlier boot (it
    /// went unreachable mid-drain and never came back before the poweroff).
    pub(super) async fn annotate_offline_record(
        &self,
        m: &NodeMaintenance,
        record: &OfflineDrain,
    ) -> Result<()> {
        let name = m.name_any();
        let summary = FallbackSummary::of_runs(&record.reports);
        let text = serde_json::to_string(&summary).context("encoding the fallback summary")?;
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"annotations": {FALLBACK_ANNOTATION: text}}});
        let updated = api
            .patch(&name, &merge_params(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("recording the offline drain on NodeMaintenance {name}"))?;
        self.event_offline_record(&updated, &summary);
        Ok(())
    }

    /// Gives the pods the fallback stopped through the CRI runtime the status the kubelet's
    /// graceful shutdown would have written (phase Failed unless Succeeded, reason
    /// Terminated, a DisruptionTarget condition), so that Job `podFailurePolicy` and
    /// disruption accounting read them as disruptions. Pods the kubelet already reported
    /// (terminal, or marked) and pods gone or replaced are left alone. Returns how many
    /// were written.
    pub(super) async fn report_offline_stopped(&self, record: &OfflineDrain) -> usize {
        use crate::cluster::evict::{disruption_condition, patch_pod_status, DISRUPTION_TARGET};
        use crate::fallback::PodOutcome;
        let pods = self.pods.state();
        let mut written = 0;
        let runs_pods: Vec<(
            Option<chrono::DateTime<chrono::Utc>>,
            &crate::fallback::PodReport,
        )> = record
            .reports
            .iter()
            .flat_map(|r| {
                r.pods
                    .iter()
                    .map(|p| (r.finished_at, p))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (finished_at, report) in runs_pods {
            if report.outcome != PodOutcome::Stopped {
                continue;
            }
            let Some(pod) = pods
                .iter()
                .find(|p| p.metadata.uid.as_deref() == Some(report.uid.as_str()))
            else {
                continue;
            };
            let status = pod.status.clone().unwrap_or_default();
            let marked = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == DISRUPTION_TARGET);
            if marked || crate::plan::classify::is_terminal_phase(status.phase.as_deref()) {
                continue;
            }
            // The kubelet starts at boot before nodegrace reaches the apiserver and runs again
            // what the apiserver still has as Running; once it reported that, a Failed
            // status would make it stop the pod a second time (or be overwritten).
            if let Some(stopped) = report.stop_started_at.or(finished_at) {
                if run_again_since(&status, stopped) {
                    tracing::info!(node = %self.node, pod = %format!("{}/{}", report.namespace, report.name), "the kubelet runs the pod again since the reboot; its status is left as the kubelet reported it");
                    continue;
                }
            }
            let body = json!({
                "phase": "Failed",
                "reason": GNS_REASON,
                "message": GNS_MESSAGE,
                "conditions": [disruption_condition(TERMINATION_BY_KUBELET, GNS_MESSAGE)],
            });
            let api: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(self.client.clone(), &report.namespace);
            match patch_pod_status(&api, &report.name, &report.uid, body).await {
                Ok(true) => written += 1,
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(node = %self.node, pod = %format!("{}/{}", report.namespace, report.name), error = %err, "could not record the offline stop in the pod's status");
                }
            }
        }
        if written > 0 {
            tracing::info!(node = %self.node, pods = written, "recorded the offline stops in the pods' status, as the kubelet's graceful shutdown does");
        }
        written
    }

    pub(super) fn event_offline_record(&self, m: &NodeMaintenance, summary: &FallbackSummary) {
        let note = format!("{} (shutdown of an earlier boot)", summary.describe());
        match self.node_watched() {
            Some(node) => self.event_both(&node, Some(m), true, "FallbackUsed", note),
            None => self.event(m.object_ref(&()), true, "FallbackUsed", note),
        }
    }

    pub(super) async fn publish_fallback(
        &self,
        st: &mut DrainState,
        selecting: &[Arc<NodeMaintenance>],
    ) {
        let Some(summary) = st.fallback.clone() else {
            return;
        };
        let name = shutdown_maintenance_name(&self.node);
        let Some(m) = selecting.iter().find(|m| m.name_any() == name) else {
            return;
        };
        let Ok(text) = serde_json::to_string(&summary) else {
            return;
        };
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"annotations": {FALLBACK_ANNOTATION: text}}});
        match api
            .patch(&name, &merge_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => {
                st.nm_overlay
                    .insert(name.clone(), st.watch_log.written(Arc::new(updated)));
                st.fallback = None;
                if let Some(node) = self.node_obj(st) {
                    self.event_both(
                        &node,
                        Some(m),
                        true,
                        "FallbackUsed",
                        format!("{}; continuing through {name}", summary.describe()),
                    );
                }
            }
            Err(err) => {
                tracing::debug!(error = %err, "recording the fallback report failed; will retry")
            }
        }
    }
}

/// Whether the pod's status shows a container started after `since` (the kubelet runs it
/// again).
fn run_again_since(
    status: &k8s_openapi::api::core::v1::PodStatus,
    since: chrono::DateTime<chrono::Utc>,
) -> bool {
    status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|cs| cs.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .any(|started| started.0.as_second() > since.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_started_after_the_offline_stop_is_a_pod_run_again() {
        let stopped = chrono::DateTime::parse_from_rfc3339("2026-11-24T10:39:12.5Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let status = |started: &str| -> k8s_openapi::api::core::v1::PodStatus {
            serde_json::from_value(serde_json::json!({
                "phase": "Running",
                "containerStatuses": [{
                    "name": "main", "image": "i", "imageID": "", "ready": true,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started}},
                }],
            }))
            .unwrap()
        };
        assert!(run_again_since(&status("2026-11-24T10:39:48Z"), stopped));
        // The container of the boot that was shut down, as the apiserver last heard of it.
        assert!(!run_again_since(&status("2026-11-24T10:38:02Z"), stopped));
        assert!(!run_again_since(&status("2026-11-24T10:39:12Z"), stopped));
        let no_containers: k8s_openapi::api::core::v1::PodStatus =
            serde_json::from_value(serde_json::json!({"phase": "Running"})).unwrap();
        assert!(!run_again_since(&no_containers, stopped));
    }

    #[test]
    fn the_fallback_summary_spans_every_run_and_caps_the_names() {
        use crate::fallback::{FallbackReport, PodOutcome, PodReport};
        let pod = |name: String, outcome| PodReport::new("ns", &name, outcome);
        let t1 = chrono::Utc::now();
        let t2 = t1 + chrono::Duration::seconds(5);
        let first = FallbackReport {
            started_at: Some(t1),
            finished_at: Some(t1),
            kubelet_stopped: false,
            pods: (0..250)
                .map(|i| pod(format!("p{i}"), PodOutcome::Stopped))
                .chain([pod("stuck".into(), PodOutcome::TimedOut)])
                .collect(),
            ..Default::default()
        };
        let second = FallbackReport {
            started_at: Some(t2),
            finished_at: None,
            kubelet_stopped: true,
            pods: vec![
                pod("gated".into(), PodOutcome::Gated),
                pod("later".into(), PodOutcome::Pending),
                PodReport {
                    errors: vec!["the CRI runtime could not be listed: no socket".into()],
                    ..pod("unlisted".into(), PodOutcome::NotReached)
                },
            ],
            ..Default::default()
        };
        let s = FallbackSummary::of_runs(&[first, second]);
        assert_eq!(s.started_at, Some(t1));
        assert_eq!(s.finished_at, Some(t1));
        assert!(s.kubelet_stopped, "as the last run left it");
        assert_eq!(
            (s.pods_stopped, s.pods_not_stopped, s.pods_not_reached),
            (251, 1, 2)
        );
        assert_eq!(s.stopped.len(), SUMMARY_MAX_NAMES);
        assert_eq!(s.not_stopped, ["ns/stuck: timedout"]);
        assert_eq!(
            s.not_reached,
            [
                "ns/later: its band had not started when the fallback ended",
                "ns/unlisted: the CRI runtime could not be listed: no socket"
            ]
        );
        assert!(s
            .describe()
            .contains("stopped 251 pod(s), 1 not stopped, 2 not reached"));
    }
}
