//! Offline fallback: drain the node locally through the CRI runtime with the kubelet's
//! Graceful Node Shutdown semantics (`shutdownGracePeriodByPodPriority`), for when the
//! apiserver cannot be reached.
//!
//! Pods are the runtime's sandboxes joined with the cached pod list; a pod goes to the highest
//! band whose priority is at most its own (unknown pods to the lowest); bands run in ascending
//! priority; a pod's grace is min(band grace, its terminationGracePeriodSeconds).
//!
//! When a band's time is up: every container of a band is stopped with
//! `StopContainer(timeout = grace)`, so the runtime itself sends SIGKILL once the grace ends
//! and a container can never outlive the band's grace because of its own (longer) grace.
//! The band therefore waits for its pods until `band grace + band_slack` after it started;
//! the slack covers the kill, its reaping and `StopPodSandbox`. A pod still not stopped then
//! means the runtime is stuck: it is reported as timed out and the next band starts, while
//! the stuck calls keep running beside it (as the kubelet's do) until the whole run ends.
//!
//! Cancel safety: everything runs inside the future returned by [`Fallback::run`]; dropping
//! it drops every outstanding call. Progress is kept in a shared report so that
//! [`Fallback::report`] shows what was done even after the future was dropped.

mod bands;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::{PriorityGracePeriod, Settings};
use crate::cri::{Container, ContainerState, PodSandbox, Runtime, SandboxState};
use crate::plan::{PodInfo, PodType};
use crate::state::PodCache;
use crate::staticpods::{StaticManifest, StaticPodGate};

/// Stops and starts the kubelet's systemd unit; the systemd adapter implements it.
#[async_trait]
pub trait KubeletControl: Send + Sync + 'static {
    /// Stops `unit` and returns once it is stopped.
    async fn stop(&self, unit: &str) -> anyhow::Result<()>;
    async fn start(&self, unit: &str) -> anyhow::Result<()>;
}

#[derive(Debug, Clone, PartialEq)]
pub struct FallbackOptions {
    /// The node's name: static pods' mirror names are `<manifest name>-<node>`.
    pub node: String,
    /// `shutdown_grace_period_by_pod_priority`; any order.
    pub bands: Vec<PriorityGracePeriod>,
    pub stop_kubelet: bool,
    pub kubelet_unit: String,
    /// Longest wait for the kubelet unit to stop or start.
    pub kubelet_timeout: Duration,
    /// Time after a band's grace for kills and sandbox teardown before the next band starts.
    pub band_slack: Duration,
    /// Listing pods is retried this long while the runtime is unreachable.
    pub list_retry: Duration,
}

impl FallbackOptions {
    pub fn from_settings(settings: &Settings, node: &str) -> Self {
        let f = &settings.fallback;
        FallbackOptions {
            node: node.to_string(),
            bands: f.shutdown_grace_period_by_pod_priority.clone(),
            stop_kubelet: f.stop_kubelet,
            kubelet_unit: f.kubelet_unit.clone(),
            kubelet_timeout: Duration::from_secs(20),
            band_slack: Duration::from_secs(2),
            list_retry: Duration::from_secs(2),
        }
    }
}

/// How a pod was terminated. Only the CRI today; kept explicit for the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Cri,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PodOutcome {
    /// Its band has not started (or the run was dropped before it did).
    Pending,
    /// Its band started; stop calls are outstanding.
    Stopping,
    /// Every container and the sandbox stopped.
    Stopped,
    /// A static pod with nothing running: only its manifest was gated.
    Gated,
    /// Finished, but some call failed (see `errors`).
    Failed,
    /// Its band's time ran out before the runtime confirmed the stop.
    TimedOut,
}

/// What the fallback did to one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// None when the pod cache did not know the pod.
    pub priority: Option<i32>,
    pub pod_type: Option<PodType>,
    /// The band's `priority` value.
    pub band: i32,
    pub grace: Duration,
    pub method: Method,
    pub sandbox_id: Option<String>,
    pub containers: Vec<String>,
    /// Manifest file gated for a static pod.
    pub gated_manifest: Option<String>,
    pub outcome: PodOutcome,
    pub stop_started_at: Option<DateTime<Utc>>,
    pub stopped_at: Option<DateTime<Utc>>,
    /// Offsets from the start of the run on tokio's clock (what tests and benchmarks read).
    pub stop_started_after: Option<Duration>,
    pub stopped_after: Option<Duration>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BandReport {
    pub priority: i32,
    pub grace: Duration,
    pub pods: usize,
    pub started_after: Duration,
    pub ended_after: Option<Duration>,
    /// The band ended because its time was up, not because its pods were gone.
    pub timed_out: bool,
}

/// The record of a fallback run, for the NodeMaintenance once the apiserver is back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FallbackReport {
    pub endpoint: String,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The kubelet unit was (asked to be) stopped and not started again yet.
    pub kubelet_stopped: bool,
    pub bands: Vec<BandReport>,
    pub pods: Vec<PodReport>,
    /// Failures not tied to one pod (kubelet unit, listing, manifests).
    pub errors: Vec<String>,
}

impl FallbackReport {
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodReport> {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }
}

/// One thing to terminate: a running sandbox, or a static manifest with no sandbox.
#[derive(Debug, Clone)]
struct Target {
    namespace: String,
    name: String,
    uid: String,
    priority: Option<i32>,
    pod_type: Option<PodType>,
    sandbox: Option<PodSandbox>,
    containers: Vec<Container>,
    manifest: Option<String>,
    band: usize,
    grace: Duration,
}

/// The local drain. Build one per shutdown; `run` it once.
pub struct Fallback {
    runtime: Arc<dyn Runtime>,
    kubelet: Option<Arc<dyn KubeletControl>>,
    gate: Option<Arc<dyn StaticPodGate>>,
    opts: FallbackOptions,
    report: Arc<Mutex<FallbackReport>>,
}

type PodFuture = Pin<Box<dyn Future<Output = (usize, PodResult)> + Send>>;

struct PodResult {
    errors: Vec<String>,
    /// The manifest file, when it was gated.
    gated: Option<String>,
    sandbox_stopped: bool,
}

impl Fallback {
    pub fn new(
        runtime: Arc<dyn Runtime>,
        kubelet: Option<Arc<dyn KubeletControl>>,
        gate: Option<Arc<dyn StaticPodGate>>,
        opts: FallbackOptions,
    ) -> Self {
        let report = FallbackReport {
            endpoint: runtime.endpoint().to_string(),
            ..Default::default()
        };
        Fallback {
            runtime,
            kubelet,
            gate,
            opts,
            report: Arc::new(Mutex::new(report)),
        }
    }

    /// What has been done so far; complete once `run` returned, partial if it was dropped.
    pub fn report(&self) -> FallbackReport {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FallbackReport> {
        self.report.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn global_error(&self, msg: String) {
        warn!(error = %msg, "offline fallback");
        self.lock().errors.push(msg);
    }

    /// Starts the kubelet again if the fallback stopped it (shutdown cancelled, or the
    /// apiserver is back and the cluster path takes over). Returns whether it did.
    pub async fn restart_kubelet(&self) -> anyhow::Result<bool> {
        let Some(kubelet) = &self.kubelet else {
            return Ok(false);
        };
        if !self.lock().kubelet_stopped {
            return Ok(false);
        }
        let unit = &self.opts.kubelet_unit;
        match tokio::time::timeout(self.opts.kubelet_timeout, kubelet.start(unit)).await {
            Ok(Ok(())) => {
                info!(unit = %unit, "kubelet started again");
                self.lock().kubelet_stopped = false;
                Ok(true)
            }
            Ok(Err(e)) => Err(e.context(format!("starting {unit}"))),
            Err(_) => anyhow::bail!(
                "starting {unit}: no answer within {:?}",
                self.opts.kubelet_timeout
            ),
        }
    }

    /// Drains the node locally. Never fails as a whole: every failure is in the report and
    /// the rest goes on.
    pub async fn run(&self, cache: &PodCache) -> FallbackReport {
        let t0 = Instant::now();
        self.lock().started_at = Some(Utc::now());
        info!(endpoint = %self.runtime.endpoint(), "offline fallback: draining through the CRI runtime");

        if self.opts.stop_kubelet {
            self.stop_kubelet().await;
        }

        let targets = self.collect_targets(cache).await;
        let sorted = bands::sorted_bands(&self.opts.bands);
        {
            let mut r = self.lock();
            r.pods = targets
                .iter()
                .map(|t| pod_report(t, &sorted))
                .collect();
        }

        let mut running: FuturesUnordered<PodFuture> = FuturesUnordered::new();
        let mut unfinished = vec![true; targets.len()];
        for (band_idx, band) in sorted.iter().enumerate() {
            let members: Vec<usize> = (0..targets.len())
                .filter(|&i| targets[i].band == band_idx)
                .collect();
            if members.is_empty() {
                continue;
            }
            let band_start = Instant::now();
            let report_idx = {
                let mut r = self.lock();
                r.bands.push(BandReport {
                    priority: band.priority,
                    grace: band.shutdown_grace_period,
                    pods: members.len(),
                    started_after: band_start - t0,
                    ended_after: None,
                    timed_out: false,
                });
                r.bands.len() - 1
            };
            info!(band = band.priority, pods = members.len(), grace = ?band.shutdown_grace_period, "band starts");
            for &i in &members {
                self.mark_stopping(i, t0);
                running.push(self.terminate(i, targets[i].clone()));
            }
            let deadline = band_start + band.shutdown_grace_period + self.opts.band_slack;
            let mut timed_out = false;
            while members.iter().any(|&i| unfinished[i]) {
                tokio::select! {
                    done = running.next() => match done {
                        Some((i, res)) => {
                            unfinished[i] = false;
                            self.record(i, res, t0);
                        }
                        None => break,
                    },
                    _ = tokio::time::sleep_until(deadline) => {
                        timed_out = true;
                        break;
                    }
                }
            }
            if timed_out {
                let mut r = self.lock();
                for &i in members.iter().filter(|&&i| unfinished[i]) {
                    let p = &mut r.pods[i];
                    warn!(pod = %format!("{}/{}", p.namespace, p.name), band = band.priority, "band time is up before the pod stopped");
                    p.outcome = PodOutcome::TimedOut;
                    p.errors.push(format!(
                        "not stopped when band {} ended ({:?} grace + {:?} slack)",
                        band.priority, band.shutdown_grace_period, self.opts.band_slack
                    ));
                }
            }
            let ended = Instant::now() - t0;
            let mut r = self.lock();
            r.bands[report_idx].ended_after = Some(ended);
            r.bands[report_idx].timed_out = timed_out;
            info!(band = band.priority, elapsed = ?ended, timed_out, "band ends");
        }

        let mut r = self.lock();
        r.finished_at = Some(Utc::now());
        info!(pods = r.pods.len(), elapsed = ?(Instant::now() - t0), "offline fallback done");
        r.clone()
    }

    async fn stop_kubelet(&self) {
        let Some(kubelet) = &self.kubelet else {
            self.global_error("stop_kubelet is set but no kubelet control was given".into());
            return;
        };
        let unit = &self.opts.kubelet_unit;
        // Recorded before the call: if this future is dropped mid-stop, a cancel still
        // starts the unit again (starting a running unit is harmless).
        self.lock().kubelet_stopped = true;
        match tokio::time::timeout(self.opts.kubelet_timeout, kubelet.stop(unit)).await {
            Ok(Ok(())) => info!(unit = %unit, "kubelet stopped"),
            Ok(Err(e)) => self.global_error(format!("stopping {unit}: {e:#}")),
            Err(_) => self.global_error(format!(
                "stopping {unit}: no answer within {:?}; going on",
                self.opts.kubelet_timeout
            )),
        }
    }

    /// Sandboxes and containers, retried briefly while the runtime is unreachable.
    async fn list_runtime(&self) -> Option<(Vec<PodSandbox>, Vec<Container>)> {
        let give_up = Instant::now() + self.opts.list_retry;
        loop {
            let (sandboxes, containers) = tokio::join!(
                self.runtime.list_pod_sandboxes(),
                self.runtime.list_containers(None)
            );
            match (sandboxes, containers) {
                (Ok(s), Ok(c)) => return Some((s, c)),
                (Err(e), _) | (_, Err(e)) => {
                    if e.is_unreachable() && Instant::now() < give_up {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                    self.global_error(format!("listing pods: {e}"));
                    return None;
                }
            }
        }
    }

    async fn active_manifests(&self) -> Vec<StaticManifest> {
        let Some(gate) = self.gate.clone() else {
            return Vec::new();
        };
        match tokio::task::spawn_blocking(move || gate.active()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                self.global_error(format!("reading static pod manifests: {e:#}"));
                Vec::new()
            }
            Err(e) => {
                self.global_error(format!("reading static pod manifests: {e}"));
                Vec::new()
            }
        }
    }

    async fn collect_targets(&self, cache: &PodCache) -> Vec<Target> {
        let (listed, manifests) = tokio::join!(self.list_runtime(), self.active_manifests());
        let (sandboxes, containers) = listed.unwrap_or_default();
        let sorted = bands::sorted_bands(&self.opts.bands);
        let node = &self.opts.node;

        let mut by_sandbox: HashMap<&str, Vec<Container>> = HashMap::new();
        for c in &containers {
            if c.state != ContainerState::Exited {
                by_sandbox.entry(&c.sandbox_id).or_default().push(c.clone());
            }
        }
        let mut used_manifests = vec![false; manifests.len()];
        let mut targets = Vec::new();
        for s in sandboxes {
            let live = by_sandbox.remove(s.id.as_str()).unwrap_or_default();
            if s.state == SandboxState::NotReady && live.is_empty() {
                continue;
            }
            let pod = cached_pod(cache, &s);
            let manifest = manifests
                .iter()
                .position(|m| m.namespace == s.namespace && mirror_name(m, node) == s.name);
            if let Some(m) = manifest {
                used_manifests[m] = true;
            }
            let priority = pod
                .map(|p| p.priority)
                .or_else(|| manifest.map(|m| manifests[m].priority));
            let static_by_annotation = s
                .annotations
                .get(crate::cri::ANNOTATION_CONFIG_SOURCE)
                .is_some_and(|v| v == "file");
            let pod_type = pod
                .map(|p| p.pod_type)
                .or((manifest.is_some() || static_by_annotation).then_some(PodType::Static));
            let band = bands::band_index(&sorted, priority);
            let grace = bands::pod_grace(&sorted[band], pod.map(PodInfo::grace_period));
            targets.push(Target {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                uid: s.uid.clone(),
                priority,
                pod_type,
                manifest: manifest.map(|m| manifests[m].file_name.clone()),
                sandbox: Some(s),
                containers: live,
                band,
                grace,
            });
        }
        for (m, used) in manifests.iter().zip(used_manifests) {
            if !used {
                let band = bands::band_index(&sorted, Some(m.priority));
                targets.push(Target {
                    namespace: m.namespace.clone(),
                    name: mirror_name(m, node),
                    uid: String::new(),
                    priority: Some(m.priority),
                    pod_type: Some(PodType::Static),
                    sandbox: None,
                    containers: Vec::new(),
                    manifest: Some(m.file_name.clone()),
                    band,
                    grace: Duration::ZERO,
                });
            }
        }
        targets
    }

    fn mark_stopping(&self, i: usize, t0: Instant) {
        let mut r = self.lock();
        let p = &mut r.pods[i];
        p.outcome = PodOutcome::Stopping;
        p.stop_started_at = Some(Utc::now());
        p.stop_started_after = Some(Instant::now() - t0);
    }

    fn record(&self, i: usize, res: PodResult, t0: Instant) {
        let mut r = self.lock();
        let p = &mut r.pods[i];
        let late = p.outcome == PodOutcome::TimedOut;
        p.stopped_at = Some(Utc::now());
        p.stopped_after = Some(Instant::now() - t0);
        let gated = res.gated.is_some();
        p.gated_manifest = res.gated;
        p.errors.extend(res.errors);
        p.outcome = if late {
            PodOutcome::TimedOut
        } else if !p.errors.is_empty() {
            PodOutcome::Failed
        } else if res.sandbox_stopped {
            PodOutcome::Stopped
        } else if gated {
            PodOutcome::Gated
        } else {
            PodOutcome::Failed
        };
        info!(pod = %format!("{}/{}", p.namespace, p.name), band = p.band, outcome = ?p.outcome, "pod done");
    }

    /// Gates the pod's manifest (static pods), stops its containers concurrently with its
    /// grace, then stops its sandbox.
    fn terminate(&self, i: usize, t: Target) -> PodFuture {
        let runtime = self.runtime.clone();
        let gate = self.gate.clone();
        let pod = format!("{}/{}", t.namespace, t.name);
        Box::pin(async move {
            let mut errors = Vec::new();
            let gating = async {
                match (&gate, &t.manifest) {
                    (Some(gate), Some(file)) => {
                        let (gate, file) = (gate.clone(), file.clone());
                        match tokio::task::spawn_blocking(move || gate.gate(&file)).await {
                            Ok(Ok(())) => Ok(Some(file_name_of(&t))),
                            Ok(Err(e)) => Err(format!("gating manifest: {e:#}")),
                            Err(e) => Err(format!("gating manifest: {e}")),
                        }
                    }
                    _ => Ok(None),
                }
            };
            let stops = futures::future::join_all(t.containers.iter().map(|c| {
                let runtime = runtime.clone();
                let (pod, grace) = (&pod, t.grace);
                async move {
                    match runtime.stop_container(&c.id, grace).await {
                        Ok(()) => Ok(()),
                        Err(e) if e.is_not_found() => Ok(()),
                        Err(e) => {
                            warn!(pod = %pod, container = %c.name, error = %e, "stopping container failed");
                            Err(e.to_string())
                        }
                    }
                }
            }));
            let (gated, stopped) = tokio::join!(gating, stops);
            let gated = gated.unwrap_or_else(|e| {
                warn!(pod = %pod, error = %e, "static pod manifest stays in place");
                errors.push(e);
                None
            });
            errors.extend(stopped.into_iter().filter_map(Result::err));
            let mut sandbox_stopped = false;
            if let Some(s) = &t.sandbox {
                match runtime.stop_pod_sandbox(&s.id).await {
                    Ok(()) => sandbox_stopped = true,
                    Err(e) if e.is_not_found() => sandbox_stopped = true,
                    Err(e) => {
                        warn!(pod = %pod, error = %e, "stopping sandbox failed");
                        errors.push(e.to_string());
                    }
                }
            }
            (
                i,
                PodResult {
                    errors,
                    gated,
                    sandbox_stopped,
                },
            )
        })
    }
}

fn mirror_name(m: &StaticManifest, node: &str) -> String {
    format!("{}-{}", m.pod_name, node)
}

/// The cached pod for a sandbox: by UID (a static pod's UID is its config hash), else by
/// namespace/name.
fn cached_pod<'a>(cache: &'a PodCache, s: &PodSandbox) -> Option<&'a PodInfo> {
    let by_uid = cache
        .pods
        .iter()
        .find(|p| !s.uid.is_empty() && (p.uid == s.uid || p.static_hash.as_deref() == Some(&s.uid)));
    by_uid.or_else(|| {
        cache
            .pods
            .iter()
            .find(|p| p.namespace == s.namespace && p.name == s.name)
    })
}

fn file_name_of(t: &Target) -> String {
    t.manifest.clone().unwrap_or_default()
}

fn pod_report(t: &Target, sorted: &[PriorityGracePeriod]) -> PodReport {
    PodReport {
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        uid: t.uid.clone(),
        priority: t.priority,
        pod_type: t.pod_type,
        band: sorted[t.band].priority,
        grace: t.grace,
        method: Method::Cri,
        sandbox_id: t.sandbox.as_ref().map(|s| s.id.clone()),
        containers: t.containers.iter().map(|c| c.id.clone()).collect(),
        gated_manifest: None,
        outcome: PodOutcome::Pending,
        stop_started_at: None,
        stopped_at: None,
        stop_started_after: None,
        stopped_after: None,
        errors: Vec::new(),
    }
}
