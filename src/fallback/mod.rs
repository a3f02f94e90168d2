//! Offline fallback: drain the node locally through the CRI runtime with the kubelet's
//! Graceful Node Shutdown semantics (`shutdownGracePeriodByPodPriority`), for when the
//! apiserver cannot be reached.
//!
//! Pods are the runtime's sandboxes joined with the cached pod list; a pod goes to the highest
//! band whose priority is at most its own (unknown pods to the lowest); bands run in ascending
//! priority; a pod's grace is min(band grace, its terminationGracePeriodSeconds).
//!
//! When a band ends: when the containers of all its pods have stopped (the workload is
//! gone; the sandboxes, i.e. pause containers and network, are torn down while the next band
//! already runs), or when its time is up. Every container is stopped with
//! `StopContainer(timeout = grace)`, so the runtime itself sends SIGKILL once the grace ends
//! and a container can never outlive the band's grace because of its own, longer one. The
//! band's time is therefore `band grace + band_slack` from its start, the slack covering the
//! kill and its reaping. A pod whose containers are still not confirmed stopped then means
//! the runtime is stuck: it is reported as timed out and the next band starts, while the
//! stuck calls keep running beside it (as the kubelet's do) until the whole run ends.
//!
//! Grace periods are used as configured: unlike the kubelet's killContainer, no 2 s floor
//! is applied, so a band or pod grace of 0 means SIGKILL at once.
//!
//! Cancel safety: everything runs inside the future returned by [`Fallback::run`]; dropping
//! it drops every outstanding call. Progress is kept in a shared report so that
//! [`Fallback::report`] shows what was done even after the future was dropped.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;
use tracing::{info, warn, Instrument};

use crate::config::{PriorityGracePeriod, Settings};
use crate::cri::{Container, ContainerState, CriError, PodSandbox, Runtime, SandboxState};
use crate::plan::{GnsBands, PodInfo, PodType};
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
    /// After the last band, how long sandboxes still being torn down are waited for.
    pub sandbox_wait: Duration,
    /// After the last band, how long containers a kubelet that did not stop starts again
    /// are stopped again while its unit's stop job is still under way.
    pub restart_watch: Duration,
}

impl FallbackOptions {
    pub(crate) fn from_settings(settings: &Settings, node: &str) -> Self {
        let f = &settings.fallback;
        FallbackOptions {
            node: node.to_string(),
            bands: f.shutdown_grace_period_by_pod_priority.clone(),
            stop_kubelet: f.stop_kubelet,
            kubelet_unit: f.kubelet_unit.clone(),
            kubelet_timeout: Duration::from_secs(20),
            band_slack: Duration::from_secs(2),
            list_retry: Duration::from_secs(2),
            sandbox_wait: Duration::from_secs(5),
            // systemd's DefaultTimeoutStopSec: a stop job normally ends (SIGKILL) by then.
            restart_watch: Duration::from_secs(90),
        }
    }
}

pub(crate) use crate::state::report::{BandReport, FallbackReport, PodOutcome, PodReport};

/// The name of the band of priority `priority` (its `shutdownGracePeriodByPodPriority`
/// entry: the pods of at least that priority, below the next entry's):
/// `priority>=1000 (offline)`, in the `band` label of `nodegrace_band_duration_seconds` and
/// `nodegrace_pods_terminated_total`, next to the online drain's bands
/// (`Default<=1000`, see the engine's `describe_targets`).
pub(crate) fn band_name(priority: i32) -> String {
    format!("priority>={priority} (offline)")
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
    gns: GnsBands,
    report: Arc<Mutex<FallbackReport>>,
}

type StepFuture = Pin<Box<dyn Future<Output = Step> + Send>>;

/// The kubelet unit's stop job, still under way after `kubelet_timeout`.
type PendingStop = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// How often containers a kubelet that did not stop starts again are looked for (the
/// kubelet notices an exited container within its 1 s relist).
const RESTART_POLL: Duration = Duration::from_secs(1);

/// A pod's termination goes Waiting -> Containers -> Sandbox -> Done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    Waiting,
    Containers,
    Sandbox,
    Done,
}

enum Step {
    Containers(usize, ContainersDone),
    Sandbox(usize, Result<(), String>),
}

struct ContainersDone {
    errors: Vec<String>,
    /// The manifest file, when it was gated.
    gated: Option<String>,
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
        let gns = GnsBands::new(&opts.bands).unwrap_or_else(|err| {
            tracing::error!(error = %err, "invalid fallback bands; every pod will be stopped at once");
            GnsBands::immediate()
        });
        Fallback {
            runtime,
            kubelet,
            gate,
            opts,
            gns,
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
        let span = tracing::info_span!("offline_fallback", node = %self.opts.node);
        self.run_bands(cache).instrument(span).await
    }

    async fn run_bands(&self, cache: &PodCache) -> FallbackReport {
        let t0 = Instant::now();
        self.lock().started_at = Some(Utc::now());
        info!(endpoint = %self.runtime.endpoint(), "offline fallback: draining through the CRI runtime");

        let pending_stop = if self.opts.stop_kubelet {
            self.stop_kubelet().await
        } else {
            None
        };

        let (targets, listing_error) = self.collect_targets(cache).await;
        let sorted = self.gns.bands();
        {
            let mut r = self.lock();
            r.pods = targets.iter().map(|t| pod_report(t, sorted)).collect();
            r.pods
                .extend(unreached(cache, &targets, listing_error.as_deref()));
        }

        let mut targets = targets;
        let mut running: FuturesUnordered<StepFuture> = FuturesUnordered::new();
        let mut progress = vec![Progress::Waiting; targets.len()];
        // One look past the last band: a pod that arrived meanwhile is stopped too.
        for next in 0..=sorted.len() {
            if next > 0 {
                self.take_arrivals(cache, &mut targets, &mut progress).await;
            }
            let band_idx = next.min(sorted.len().saturating_sub(1));
            let Some(band) = sorted.get(band_idx) else {
                break;
            };
            // A pod that arrived after its band (the runtime shows a sandbox the first look
            // did not) goes with the band under way, with its own band's grace.
            let members: Vec<usize> = (0..targets.len())
                .filter(|&i| progress[i] == Progress::Waiting && targets[i].band <= band_idx)
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
                progress[i] = Progress::Containers;
                running.push(self.stop_containers(i, &targets[i]));
            }
            let grace = members
                .iter()
                .map(|&i| targets[i].grace)
                .fold(band.shutdown_grace_period, Duration::max);
            let deadline = band_start + grace + self.opts.band_slack;
            let mut timed_out = false;
            while members.iter().any(|&i| progress[i] == Progress::Containers) {
                tokio::select! {
                    step = running.next() => match step {
                        Some(step) => self.advance(step, &targets, &mut progress, &mut running, t0),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(deadline) => {
                        timed_out = true;
                        break;
                    }
                }
            }
            if timed_out {
                self.band_timed_out(band, &members, &progress);
            }
            let ended = Instant::now() - t0;
            let mut r = self.lock();
            r.bands[report_idx].ended_after = Some(ended);
            r.bands[report_idx].timed_out = timed_out;
            info!(band = band.priority, elapsed = ?ended, timed_out, "band ends");
        }

        // Sandboxes still being torn down; containers a stuck runtime never stopped are not
        // waited for again.
        let final_deadline = Instant::now() + self.opts.sandbox_wait;
        while progress.contains(&Progress::Sandbox) {
            tokio::select! {
                step = running.next() => match step {
                    Some(step) => self.advance(step, &targets, &mut progress, &mut running, t0),
                    None => break,
                },
                _ = tokio::time::sleep_until(final_deadline) => {
                    let mut r = self.lock();
                    for (i, _) in progress.iter().enumerate().filter(|(_, p)| **p == Progress::Sandbox) {
                        r.pods[i].errors.push(format!(
                            "sandbox not stopped within {:?} after the last band",
                            self.opts.sandbox_wait
                        ));
                        r.pods[i].outcome = PodOutcome::Failed;
                    }
                    break;
                }
            }
        }

        self.stop_restarted(&targets, t0, pending_stop).await;
        self.gate_unreadable_manifests().await;

        let mut r = self.lock();
        r.finished_at = Some(Utc::now());
        info!(pods = r.pods.len(), elapsed = ?(Instant::now() - t0), "offline fallback done");
        r.clone()
    }

    fn band_timed_out(&self, band: &PriorityGracePeriod, members: &[usize], progress: &[Progress]) {
        let mut r = self.lock();
        for &i in members
            .iter()
            .filter(|&&i| progress[i] == Progress::Containers)
        {
            let p = &mut r.pods[i];
            warn!(pod = %format!("{}/{}", p.namespace, p.name), band = band.priority, "band time is up before the pod stopped");
            p.outcome = PodOutcome::TimedOut;
            p.errors.push(format!(
                "not stopped when band {} ended ({:?} grace + {:?} slack)",
                band.priority, band.shutdown_grace_period, self.opts.band_slack
            ));
        }
    }

    /// Stops the kubelet unit; its stop job when that has not finished in time.
    async fn stop_kubelet(&self) -> Option<PendingStop> {
        let Some(kubelet) = self.kubelet.clone() else {
            self.global_error("stop_kubelet is set but no kubelet control was given".into());
            return None;
        };
        let unit = self.opts.kubelet_unit.clone();
        // Recorded before the call: if this future is dropped mid-stop, a cancel still
        // starts the unit again (starting a running unit is harmless).
        self.lock().kubelet_stopped = true;
        let mut stop: PendingStop = {
            let unit = unit.clone();
            Box::pin(async move { kubelet.stop(&unit).await })
        };
        let (why, pending) = match tokio::time::timeout(self.opts.kubelet_timeout, &mut stop).await
        {
            Ok(Ok(())) => {
                info!(unit = %unit, "kubelet stopped");
                return None;
            }
            Ok(Err(e)) => (format!("stopping {unit} failed: {e:#}"), None),
            Err(_) => (
                format!("{unit} did not stop within {:?}", self.opts.kubelet_timeout),
                Some(stop),
            ),
        };
        tracing::error!(unit = %unit, error = %why, "the kubelet did not stop: stopping its containers through the CRI anyway, and again any it starts meanwhile");
        let mut r = self.lock();
        r.errors.push(why.clone());
        r.kubelet_not_stopped = Some(why);
        pending
    }

    /// A kubelet that did not stop starts the containers of stopped pods again (their
    /// restart policy; in a new sandbox when the old one was stopped, after a back-off
    /// once it has done so): after the last band, every container running again is
    /// stopped once more, with its pod's grace, every [`RESTART_POLL`] while the kubelet's
    /// stop job is under way (the poweroff waits for that job anyway) and once more when it
    /// ends, at most `restart_watch`. When the stop job failed outright, until a look finds
    /// nothing running.
    async fn stop_restarted(
        &self,
        targets: &[Target],
        t0: Instant,
        mut pending: Option<PendingStop>,
    ) {
        if self.lock().kubelet_not_stopped.is_none() {
            return;
        }
        let deadline = Instant::now() + self.opts.restart_watch;
        let mut last = false;
        loop {
            let Some(found) = self.stop_restarted_once(targets, t0).await else {
                return;
            };
            if last {
                return;
            }
            if Instant::now() >= deadline {
                break;
            }
            match pending.as_mut() {
                Some(stop) => tokio::select! {
                    result = stop => {
                        pending = None;
                        last = true;
                        let unit = &self.opts.kubelet_unit;
                        match result {
                            Ok(()) => info!(unit = %unit, "the kubelet unit's stop job finished late"),
                            Err(e) => warn!(unit = %unit, error = %format!("{e:#}"), "the kubelet unit's stop job failed late"),
                        }
                    }
                    _ = tokio::time::sleep(RESTART_POLL) => {}
                },
                None if found == 0 => return,
                None => tokio::time::sleep(RESTART_POLL).await,
            }
        }
        self.global_error(format!(
            "{} still not stopped {:?} after the last band: containers it starts from then on are not stopped again",
            self.opts.kubelet_unit, self.opts.restart_watch
        ));
    }

    /// Stops every container running again; how many there were (None: not listed).
    async fn stop_restarted_once(&self, targets: &[Target], t0: Instant) -> Option<usize> {
        let (sandboxes, containers) = tokio::join!(
            self.runtime.list_pod_sandboxes(),
            self.runtime.list_containers(None)
        );
        let (sandboxes, containers) = match (sandboxes, containers) {
            (Ok(s), Ok(c)) => (s, c),
            (Err(e), _) | (_, Err(e)) => {
                self.global_error(format!("listing containers again: {e}"));
                return None;
            }
        };
        let target_of = |c: &Container| {
            let s = sandboxes.iter().find(|s| s.id == c.sandbox_id)?;
            targets.iter().position(|t| {
                (!t.uid.is_empty() && t.uid == s.uid)
                    || (t.namespace == s.namespace && t.name == s.name)
            })
        };
        let unknown_grace = self.gns.pod_grace(self.gns.band_for_unknown(), None);
        let again: Vec<(Option<usize>, Container)> = containers
            .into_iter()
            .filter(|c| c.state != ContainerState::Exited)
            .map(|c| (target_of(&c), c))
            .collect();
        let found = again.len();
        let stops = again.iter().map(|(i, c)| {
            let grace = i.map_or(unknown_grace, |i| targets[i].grace);
            async move { (*i, c, self.runtime.stop_container(&c.id, grace).await) }
        });
        for (i, c, result) in futures::future::join_all(stops).await {
            let outcome = match result {
                Ok(()) => format!("stopped again at {:?}", Instant::now() - t0),
                Err(e) if e.is_not_found() => "gone when stopped again".to_string(),
                Err(e) => format!("stopping it again failed: {e}"),
            };
            let Some(i) = i else {
                self.global_error(format!(
                    "container {} ({}) running after the last band, the kubelet not stopped: {outcome}",
                    c.name, c.id
                ));
                continue;
            };
            let mut r = self.lock();
            let p = &mut r.pods[i];
            warn!(pod = %format!("{}/{}", p.namespace, p.name), container = %c.name, %outcome, "the kubelet, still running, started a stopped container again");
            p.containers.push(c.id.clone());
            p.errors.push(format!(
                "container {} started again by the kubelet (not stopped): {outcome}",
                c.name
            ));
        }
        Some(found)
    }

    /// Files in the manifest directory the kubelet refuses run no pod and carry no
    /// priority: they go last, once the bands are done.
    async fn gate_unreadable_manifests(&self) {
        let Some(gate) = self.gate.clone() else {
            return;
        };
        let outcome = tokio::task::spawn_blocking(move || gate.gate_unreadable()).await;
        let results = match outcome {
            Ok(Ok(results)) => results,
            Ok(Err(e)) => return self.global_error(format!("reading static pod manifests: {e:#}")),
            Err(e) => return self.global_error(format!("reading static pod manifests: {e}")),
        };
        for (file, r) in results {
            match r {
                Ok(()) => {
                    info!(manifest = %file, "gated a file the kubelet refuses as a static pod manifest (last)");
                    self.lock().gated_unreadable.push(file);
                }
                Err(e) => self.global_error(format!("gating {file}: {e:#}")),
            }
        }
    }

    /// Sandboxes and containers, retried briefly while the runtime is unreachable.
    async fn list_runtime(&self) -> Result<(Vec<PodSandbox>, Vec<Container>), String> {
        let give_up = Instant::now() + self.opts.list_retry;
        loop {
            let (sandboxes, containers) = tokio::join!(
                self.runtime.list_pod_sandboxes(),
                self.runtime.list_containers(None)
            );
            match (sandboxes, containers) {
                (Ok(s), Ok(c)) => return Ok((s, c)),
                (Err(e), _) | (_, Err(e)) => {
                    if e.is_unreachable() && Instant::now() < give_up {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                    let why = match e {
                        CriError::Timeout { .. } => format!(
                            "the CRI runtime at {} accepts connections but does not answer ({e}): no pod could be stopped through it",
                            self.runtime.endpoint()
                        ),
                        _ => format!("listing pods: {e}"),
                    };
                    tracing::error!(endpoint = %self.runtime.endpoint(), error = %why, "offline fallback: the CRI runtime cannot be used");
                    let mut r = self.lock();
                    r.errors.push(why.clone());
                    r.runtime_unusable = Some(why.clone());
                    return Err(why);
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

    /// The pods the runtime lists (and static manifests with nothing running), and why the
    /// runtime could not be listed when it could not.
    async fn collect_targets(&self, cache: &PodCache) -> (Vec<Target>, Option<String>) {
        let (listed, manifests, version) = tokio::join!(
            self.list_runtime(),
            self.active_manifests(),
            self.runtime.version()
        );
        if let Ok(v) = version {
            info!(runtime = %v.runtime_name, version = %v.runtime_version, "CRI runtime");
            self.lock().runtime = Some(format!("{} {}", v.runtime_name, v.runtime_version));
        }
        let (listing_error, (sandboxes, containers)) = match listed {
            Ok(listed) => (None, listed),
            Err(e) => (Some(e), Default::default()),
        };
        let mut targets = self.sandbox_targets(sandboxes, containers, &manifests, cache);
        let used: HashSet<&str> = targets
            .iter()
            .filter_map(|t| t.manifest.as_deref())
            .collect();
        let unused: Vec<&StaticManifest> = manifests
            .iter()
            .filter(|m| !used.contains(m.file_name.as_str()))
            .collect();
        for m in unused {
            let band = self.gns.band_for(m.priority);
            targets.push(Target {
                namespace: m.namespace.clone(),
                name: mirror_name(m, &self.opts.node),
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
        (targets, listing_error)
    }

    /// Pods the runtime shows that no look found before, joined to the drain with their own
    /// band. A known pod in a new sandbox is a restart ([`Fallback::stop_restarted`]); a
    /// runtime the first look could not use is not asked again.
    async fn take_arrivals(
        &self,
        cache: &PodCache,
        targets: &mut Vec<Target>,
        progress: &mut Vec<Progress>,
    ) {
        if self.lock().runtime_unusable.is_some() {
            return;
        }
        let (sandboxes, containers) = tokio::join!(
            self.runtime.list_pod_sandboxes(),
            self.runtime.list_containers(None)
        );
        let (Ok(sandboxes), Ok(containers)) = (sandboxes, containers) else {
            return;
        };
        let known: HashSet<&str> = targets.iter().map(|t| t.uid.as_str()).collect();
        let fresh: Vec<PodSandbox> = sandboxes
            .into_iter()
            .filter(|s| !known.contains(s.uid.as_str()))
            .collect();
        if fresh.is_empty() {
            return;
        }
        let manifests = self.active_manifests().await;
        let sorted = self.gns.bands();
        for t in self.sandbox_targets(fresh, containers, &manifests, cache) {
            warn!(pod = %format!("{}/{}", t.namespace, t.name), band = sorted.get(t.band).map(|b| b.priority), "a pod arrived on the node during the offline drain: stopping it with its band's grace");
            let mut r = self.lock();
            r.pods.insert(targets.len(), pod_report(&t, sorted));
            targets.push(t);
            progress.push(Progress::Waiting);
        }
    }

    /// The targets of running sandboxes (and of stopped ones whose containers still run).
    fn sandbox_targets(
        &self,
        sandboxes: Vec<PodSandbox>,
        containers: Vec<Container>,
        manifests: &[StaticManifest],
        cache: &PodCache,
    ) -> Vec<Target> {
        let gns = &self.gns;
        let node = &self.opts.node;
        let mut by_sandbox: HashMap<String, Vec<Container>> = HashMap::new();
        for c in containers {
            if c.state != ContainerState::Exited {
                by_sandbox.entry(c.sandbox_id.clone()).or_default().push(c);
            }
        }
        let mut targets = Vec::new();
        for s in sandboxes {
            let live = by_sandbox.remove(&s.id).unwrap_or_default();
            if s.state == SandboxState::NotReady && live.is_empty() {
                continue;
            }
            let pod = cached_pod(cache, &s);
            let manifest = manifests
                .iter()
                .position(|m| m.namespace == s.namespace && mirror_name(m, node) == s.name);
            let priority = pod
                .map(|p| p.priority)
                .or_else(|| manifest.map(|m| manifests[m].priority));
            let static_by_annotation = s
                .annotations
                .get(crate::plan::classify::SOURCE_ANNOTATION)
                .is_some_and(|v| crate::plan::classify::is_static_source(v));
            let pod_type = pod
                .map(|p| p.pod_type)
                .or((manifest.is_some() || static_by_annotation).then_some(PodType::Static));
            let band = priority.map_or(gns.band_for_unknown(), |p| gns.band_for(p));
            let grace = gns.pod_grace(band, pod.map(PodInfo::grace_period));
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
        targets
    }

    fn mark_stopping(&self, i: usize, t0: Instant) {
        let mut r = self.lock();
        let p = &mut r.pods[i];
        p.outcome = PodOutcome::Stopping;
        p.stop_started_at = Some(Utc::now());
        p.stop_started_after = Some(Instant::now() - t0);
    }

    fn advance(
        &self,
        step: Step,
        targets: &[Target],
        progress: &mut [Progress],
        running: &mut FuturesUnordered<StepFuture>,
        t0: Instant,
    ) {
        match step {
            Step::Containers(i, done) => {
                {
                    let mut r = self.lock();
                    let p = &mut r.pods[i];
                    p.containers_stopped_after = Some(Instant::now() - t0);
                    p.gated_manifest = done.gated;
                    p.errors.extend(done.errors);
                }
                match &targets[i].sandbox {
                    Some(s) => {
                        progress[i] = Progress::Sandbox;
                        running.push(self.stop_sandbox(i, s.id.clone()));
                    }
                    None => {
                        progress[i] = Progress::Done;
                        self.finish(i, false, t0);
                    }
                }
            }
            Step::Sandbox(i, result) => {
                progress[i] = Progress::Done;
                let stopped = match result {
                    Ok(()) => true,
                    Err(e) => {
                        self.lock().pods[i].errors.push(e);
                        false
                    }
                };
                self.finish(i, stopped, t0);
            }
        }
    }

    fn finish(&self, i: usize, sandbox_stopped: bool, t0: Instant) {
        let mut r = self.lock();
        let p = &mut r.pods[i];
        p.stopped_at = Some(Utc::now());
        p.stopped_after = Some(Instant::now() - t0);
        p.outcome = if p.outcome == PodOutcome::TimedOut {
            PodOutcome::TimedOut
        } else if !p.errors.is_empty() {
            PodOutcome::Failed
        } else if sandbox_stopped {
            PodOutcome::Stopped
        } else if p.gated_manifest.is_some() {
            PodOutcome::Gated
        } else {
            PodOutcome::Failed
        };
        info!(pod = %format!("{}/{}", p.namespace, p.name), band = p.band, outcome = ?p.outcome, "pod done");
    }

    /// Gates the pod's manifest (static pods) and stops its containers concurrently, each
    /// with the pod's grace.
    fn stop_containers(&self, i: usize, t: &Target) -> StepFuture {
        let runtime = self.runtime.clone();
        let gate = self.gate.clone();
        let pod = format!("{}/{}", t.namespace, t.name);
        let manifest = t.manifest.clone();
        let containers = t.containers.clone();
        let grace = t.grace;
        Box::pin(async move {
            let gating = async {
                match (gate, manifest) {
                    (Some(gate), Some(file)) => {
                        let name = file.clone();
                        match tokio::task::spawn_blocking(move || gate.gate(&name)).await {
                            Ok(Ok(())) => Ok(Some(file)),
                            Ok(Err(e)) => Err(format!("gating manifest {file}: {e:#}")),
                            Err(e) => Err(format!("gating manifest {file}: {e}")),
                        }
                    }
                    _ => Ok(None),
                }
            };
            let stops = futures::future::join_all(containers.iter().map(|c| {
                let (runtime, pod) = (&runtime, &pod);
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
            let mut errors = Vec::new();
            let gated = gated.unwrap_or_else(|e| {
                warn!(pod = %pod, error = %e, "static pod manifest stays in place");
                errors.push(e);
                None
            });
            errors.extend(stopped.into_iter().filter_map(Result::err));
            Step::Containers(i, ContainersDone { errors, gated })
        })
    }

    fn stop_sandbox(&self, i: usize, id: String) -> StepFuture {
        let runtime = self.runtime.clone();
        Box::pin(async move {
            let result = match runtime.stop_pod_sandbox(&id).await {
                Ok(()) => Ok(()),
                Err(e) if e.is_not_found() => Ok(()),
                Err(e) => {
                    warn!(sandbox = %id, error = %e, "stopping sandbox failed");
                    Err(e.to_string())
                }
            };
            Step::Sandbox(i, result)
        })
    }
}

fn mirror_name(m: &StaticManifest, node: &str) -> String {
    crate::staticpods::mirror_pod_name(&m.pod_name, node)
}

/// The cached pod for a sandbox: by UID (a static pod's UID is its config hash), else by
/// namespace/name.
fn cached_pod<'a>(cache: &'a PodCache, s: &PodSandbox) -> Option<&'a PodInfo> {
    let by_uid = cache.pods.iter().find(|p| {
        !s.uid.is_empty() && (p.uid == s.uid || p.static_hash.as_deref() == Some(&s.uid))
    });
    by_uid.or_else(|| {
        cache
            .pods
            .iter()
            .find(|p| p.namespace == s.namespace && p.name == s.name)
    })
}

/// The cached pods no target stands for: the fallback cannot stop them, and says why.
fn unreached(cache: &PodCache, targets: &[Target], listing_error: Option<&str>) -> Vec<PodReport> {
    cache
        .pods
        .iter()
        .filter(|p| p.is_active())
        .filter(|p| {
            !targets.iter().any(|t| {
                (!p.uid.is_empty()
                    && (t.uid == p.uid || p.static_hash.as_deref() == Some(t.uid.as_str())))
                    || (t.namespace == p.namespace && t.name == p.name)
            })
        })
        .map(|p| {
            let why = match listing_error {
                Some(e) => format!("the CRI runtime could not be listed: {e}"),
                None => "the CRI runtime does not list it (not running, or run by another runtime)"
                    .to_string(),
            };
            PodReport {
                uid: p.uid.clone(),
                priority: Some(p.priority),
                pod_type: Some(p.pod_type),
                errors: vec![why],
                ..PodReport::new(&p.namespace, &p.name, PodOutcome::NotReached)
            }
        })
        .collect()
}

fn pod_report(t: &Target, sorted: &[PriorityGracePeriod]) -> PodReport {
    PodReport {
        uid: t.uid.clone(),
        priority: t.priority,
        pod_type: t.pod_type,
        band: sorted[t.band].priority,
        grace: t.grace,
        sandbox_id: t.sandbox.as_ref().map(|s| s.id.clone()),
        containers: t.containers.iter().map(|c| c.id.clone()).collect(),
        ..PodReport::new(&t.namespace, &t.name, PodOutcome::Pending)
    }
}
