//! The daemon's real drain, one leg at a time as the lifecycle routes it: the wait for the
//! apiserver's connection, the cluster engine, the kubelet-like CRI fallback.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::cluster::client::{client_for, Clients, ReloadingClient, Role, Timeouts};
use crate::cluster::eviction_request;
use crate::cluster::identity::{self, CredentialError};
use crate::cluster::{AfterBoot, Engine, EngineError, EngineOptions};
use crate::config::{CompletionPolicy, Settings};
use crate::cri::Runtime;
use crate::daemon::Drainer;
use crate::fallback::{Fallback, FallbackOptions, FallbackReport, KubeletControl, PodOutcome};
use crate::metrics::{Metrics, TerminationMethod};
use crate::nodeview::{PodsOnNode, RuntimeAndMounts};
use crate::shutdown::{CancelCause, ShutdownRequest};
use crate::state::{BootIdSource, OfflineDrain, PodCache, ShutdownState};
use crate::staticpods::StaticPodGate;

use crate::plan::wiring::Wiring;

mod paths;
use crate::plan::backoff::Backoff;
use crate::plan::lifecycle::{RouteEvent, Way};
use crate::plan::reachability::retry_delay;
use paths::start_wired;
use rand::Rng as _;

const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
const RETRY_MAX_UNREACHABLE: Duration = Duration::from_secs(4);

/// The pieces the drainer works with; tests and the simulator pass fakes.
pub struct NodeParts {
    pub settings: Settings,
    pub node: String,
    pub runtime: Arc<dyn Runtime>,
    pub kubelet: Option<Arc<dyn KubeletControl>>,
    pub gate: Arc<dyn StaticPodGate>,
    pub metrics: Metrics,
    pub boot_id: BootIdSource,
}

impl NodeParts {
    pub fn boot_id(&self) -> Result<String> {
        self.boot_id.read()
    }
}

/// Keeps `offline-drain.json` current with the fallback run under way: written when the
/// run starts and again when this guard goes (run finished, the cluster path took over, or
/// the drain was dropped at the end of the budget), so that the boot after the shutdown can
/// record what was done even when the apiserver never came back.
struct OfflineRecorder {
    state_dir: PathBuf,
    record: OfflineDrain,
    fallback: Arc<Fallback>,
}

impl OfflineRecorder {
    fn start(state_dir: &std::path::Path, req: &ShutdownRequest, fallback: Arc<Fallback>) -> Self {
        // Runs earlier in this same shutdown stay in the record.
        let earlier = match OfflineDrain::load_or_set_aside(state_dir) {
            Ok(Some(r)) if r.boot_id != req.boot_id => {
                // Only one shutdown is kept: the apiserver never saw that one either.
                tracing::warn!(boot_id = %r.boot_id, "replacing the offline drain record of an earlier shutdown that no NodeMaintenance recorded yet");
                None
            }
            Ok(r) => r,
            Err(err) => {
                tracing::warn!(
                    error = crate::cluster::error_text(&err),
                    "the offline drain record is unreadable; starting a new one"
                );
                None
            }
        };
        let mut record = earlier.unwrap_or_else(|| OfflineDrain {
            boot_id: req.boot_id.clone(),
            kind: req.kind,
            reports: Vec::new(),
        });
        record.reports.push(fallback.report());
        let recorder = OfflineRecorder {
            state_dir: state_dir.to_path_buf(),
            record,
            fallback,
        };
        recorder.save();
        recorder
    }

    fn save(&self) {
        let mut record = self.record.clone();
        if let Some(last) = record.reports.last_mut() {
            *last = self.fallback.report();
        }
        if let Err(err) = record.store(&self.state_dir) {
            tracing::error!(error = crate::cluster::error_text(&err), "writing the offline drain record failed; the boot after this shutdown cannot report it");
        }
    }
}

impl Drop for OfflineRecorder {
    fn drop(&mut self) {
        self.save();
    }
}

/// [`Drainer`] for a real node. The engine starts once the apiserver client could be built
/// and the apiserver answered discovery; until then every drain is offline.
pub struct NodeDrainer {
    parts: NodeParts,
    /// The settings in force: `parts.settings` until a reload replaces them (the engine
    /// follows them too).
    settings: watch::Sender<Arc<Settings>>,
    engine: watch::Receiver<Option<Arc<Engine>>>,
    /// The fallback of the shutdown under way, so a cancel can restart the kubelet.
    fallback: Mutex<Option<Arc<Fallback>>>,
    stop: CancellationToken,
    /// When connecting began: a shutdown after the apiserver has been unreachable for
    /// `fallback.apiserver_timeout` since then does not wait that long again.
    connecting_since: tokio::time::Instant,
    /// Rung when a shutdown begins: a connection still being tried is tried at once, then
    /// at most about a second apart.
    hurry: Arc<Notify>,
}

impl Drop for NodeDrainer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl NodeDrainer {
    /// Starts connecting in the background with `connect` (retried with back-off) and
    /// returns at once.
    pub fn start<F, Fut, C>(parts: NodeParts, connect: F) -> NodeDrainer
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<C>> + Send,
        C: Into<Clients>,
    {
        let (tx, rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let (settings_tx, mut settings_rx) = watch::channel(Arc::new(parts.settings.clone()));
        let settings = parts.settings.clone();
        let node = parts.node.clone();
        let gate = parts.gate.clone();
        let metrics = parts.metrics.clone();
        let task_stop = stop.clone();
        let hurry = Arc::new(Notify::new());
        let hurried = hurry.clone();
        let runtime = parts.runtime.clone();
        let boot_id = parts.boot_id.clone();
        tokio::spawn(async move {
            let connecting = connect_engine(
                connect,
                settings,
                node,
                gate,
                metrics,
                task_stop.clone(),
                hurried,
            );
            let started = tokio::select! {
                _ = task_stop.cancelled() => return,
                engine = connecting => engine,
            };
            let engine = Arc::new(started);
            tx.send_replace(Some(engine.clone()));
            match boot_id.read() {
                Ok(id) => {
                    tokio::spawn(crate::daemon::wave::run(
                        engine.clone(),
                        id,
                        task_stop.clone(),
                    ));
                }
                Err(err) => tracing::warn!(
                    error = format!("{err:#}"),
                    "no boot id: this node takes no part in reboot waves"
                ),
            }
            // Keep the engine (and its watches) alive until the drainer goes, and give it
            // every reloaded configuration (one may have come while it was connecting).
            loop {
                let settings = settings_rx.borrow_and_update().clone();
                engine.look_at_node(node_view(&runtime, &settings));
                engine.reload(settings);
                tokio::select! {
                    _ = task_stop.cancelled() => return,
                    r = settings_rx.changed() => if r.is_err() { return },
                }
            }
        });
        NodeDrainer {
            parts,
            settings: settings_tx,
            engine: rx,
            fallback: Mutex::new(None),
            stop,
            connecting_since: tokio::time::Instant::now(),
            hurry,
        }
    }

    /// A token cancelled when the drainer goes, for tasks that live as long as it.
    pub(crate) fn stop_token(&self) -> CancellationToken {
        self.stop.child_token()
    }

    /// The settings in force.
    fn settings(&self) -> Arc<Settings> {
        self.settings.borrow().clone()
    }

    fn engine_now(&self) -> Option<Arc<Engine>> {
        self.engine.borrow().clone()
    }

    /// The engine, waiting at most `limit` for it to come up.
    async fn engine_within(&self, limit: Duration) -> Option<Arc<Engine>> {
        let mut rx = self.engine.clone();
        let wait = async move {
            rx.wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|e| e.clone())
        };
        tokio::time::timeout(limit, wait).await.ok().flatten()
    }

    /// Waits until the apiserver answers again: through the engine when there is one,
    /// else until the engine comes up.
    async fn apiserver_back(&self, engine: Option<Arc<Engine>>) -> Arc<Engine> {
        if let Some(engine) = engine {
            engine.wait_reachable().await;
            return engine;
        }
        let mut rx = self.engine.clone();
        loop {
            let current = rx.borrow_and_update().clone();
            if let Some(engine) = current {
                engine.wait_reachable().await;
                return engine;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    fn new_fallback(&self) -> Arc<Fallback> {
        let p = &self.parts;
        let settings = self.settings();
        let fallback = Arc::new(Fallback::new(
            p.runtime.clone(),
            if settings.fallback.stop_kubelet {
                p.kubelet.clone()
            } else {
                None
            },
            Some(p.gate.clone()),
            FallbackOptions::from_settings(&settings, &p.node),
        ));
        if let Ok(mut slot) = self.fallback.lock() {
            *slot = Some(fallback.clone());
        }
        fallback
    }

    fn load_cache(&self) -> PodCache {
        PodCache::load_or_set_aside(&self.settings().state_dir).unwrap_or_else(|err| {
            tracing::error!(
                error = crate::cluster::error_text(&err),
                "the pod cache is unreadable; every pod goes to the lowest band"
            );
            PodCache::default()
        })
    }

    /// The fallback's pods stopped and its bands' durations, each band named by
    /// [`crate::fallback::band_name`].
    fn count_cri_terminations(&self, report: &FallbackReport) {
        let metrics = &self.parts.metrics;
        for pod in &report.pods {
            let method = match pod.outcome {
                PodOutcome::Stopped => TerminationMethod::Cri,
                PodOutcome::Gated => TerminationMethod::StaticGate,
                _ => continue,
            };
            metrics.pod_terminated(method, &crate::fallback::band_name(pod.band));
        }
        for band in &report.bands {
            if let Some(ended) = band.ended_after {
                metrics.band_finished(
                    &crate::fallback::band_name(band.priority),
                    ended.saturating_sub(band.started_after),
                );
            }
        }
    }

    async fn restart_kubelet_if_stopped(&self) {
        let fallback = self.fallback.lock().ok().and_then(|mut f| f.take());
        if let Some(fallback) = fallback {
            match fallback.restart_kubelet().await {
                Ok(true) => tracing::info!(node = %self.parts.node, "kubelet started again"),
                Ok(false) => {}
                Err(err) => {
                    tracing::error!(node = %self.parts.node, error = crate::cluster::error_text(&err), "starting the kubelet again failed")
                }
            }
        }
    }

    async fn restore_static_pods(&self) {
        let gate = self.parts.gate.clone();
        match tokio::task::spawn_blocking(move || gate.restore_all()).await {
            Ok(Ok(kept)) if kept.is_empty() => {}
            Ok(Ok(kept)) => {
                tracing::warn!(node = %self.parts.node, kept_aside = ?kept, "static pod manifests kept gated: a file of the same name is back in the manifest directory")
            }
            Ok(Err(err)) => {
                tracing::error!(node = %self.parts.node, error = crate::cluster::error_text(&err), "restoring static pods failed")
            }
            Err(err) => {
                tracing::error!(node = %self.parts.node, error = %err, "restoring static pods panicked")
            }
        }
    }

    /// Drains locally through the CRI runtime until that is done or, with `switch_back`,
    /// until the apiserver answers again.
    async fn drain_offline(&self, req: &ShutdownRequest, switch_back: bool) -> RouteEvent {
        self.parts.metrics.fallback_used();
        let _offline = self.parts.metrics.offline_fallback();
        let fallback = self.new_fallback();
        let cache = self.load_cache();
        let _record = OfflineRecorder::start(&self.settings().state_dir, req, fallback.clone());
        tokio::select! {
            report = fallback.run(&cache) => {
                self.count_cri_terminations(&report);
                if let Some(online) = self.engine_now() {
                    online.record_fallback(&report);
                }
                tracing::info!(node = %self.parts.node, pods = report.pods.len(), errors = report.errors.len(), "offline drain finished");
                RouteEvent::OfflineFinished
            }
            back = self.apiserver_back(self.engine_now()), if switch_back => {
                let report = fallback.report();
                self.count_cri_terminations(&report);
                tracing::info!(node = %self.parts.node, "apiserver reachable again: continuing through the NodeMaintenance");
                self.restart_kubelet_if_stopped().await;
                back.record_fallback(&report);
                RouteEvent::ApiserverBack
            }
        }
    }

    async fn has_gated_static_pods(&self) -> bool {
        let gate = self.parts.gate.clone();
        matches!(
            tokio::task::spawn_blocking(move || gate.has_gated()).await,
            Ok(Ok(true))
        )
    }
}

#[async_trait]
impl Drainer for NodeDrainer {
    async fn drain(&self, req: &ShutdownRequest, way: Way) -> Result<RouteEvent> {
        match way {
            Way::Connecting => {
                self.hurry.notify_one();
                let timeout = self.settings().fallback.apiserver_timeout;
                let engine = self
                    .engine_within(timeout.saturating_sub(self.connecting_since.elapsed()))
                    .await;
                if engine.is_none() {
                    tracing::warn!(node = %self.parts.node, "no apiserver connection: draining locally through the CRI runtime");
                }
                Ok(RouteEvent::Begin {
                    engine: engine.is_some(),
                })
            }
            Way::Online => {
                let Some(online) = self.engine_now() else {
                    anyhow::bail!("no cluster engine to drain through");
                };
                Ok(match online.shutdown_drain(req).await {
                    Ok(_timings) => RouteEvent::OnlineDrained,
                    Err(EngineError::ApiserverUnreachable(given_up)) => {
                        tracing::warn!(node = %self.parts.node, unusable_for = ?given_up.unusable_for, last_error = %given_up.last_error, "the apiserver cannot be used: draining locally through the CRI runtime");
                        RouteEvent::OnlineUnreachable
                    }
                    // Without the CRDs or with a rejected request the cluster path cannot
                    // drain; stopping pods locally still beats releasing at once.
                    Err(EngineError::Other(err)) => {
                        tracing::error!(node = %self.parts.node, error = crate::cluster::error_text(&err), "the cluster drain failed: draining locally through the CRI runtime");
                        RouteEvent::OnlineFailed
                    }
                })
            }
            Way::Offline { switch_back } => Ok(self.drain_offline(req, switch_back).await),
        }
    }

    async fn cancel(&self, req: &ShutdownRequest, cause: CancelCause) -> Result<()> {
        self.restart_kubelet_if_stopped().await;
        // No shutdown happened: nothing for the next boot to record.
        if let Err(err) = OfflineDrain::remove_if_boot(&self.settings().state_dir, &req.boot_id) {
            tracing::warn!(node = %self.parts.node, error = crate::cluster::error_text(&err), "removing the offline drain record failed");
        }
        let policy = self.settings().shutdown.on_cancel;
        match self.engine_now() {
            Some(engine) => engine.cancel_shutdown(policy, cause).await,
            None => {
                if policy == CompletionPolicy::Complete {
                    self.restore_static_pods().await;
                }
                if cause == CancelCause::Lost {
                    tracing::error!(node = %self.parts.node, "{}", crate::plan::lifecycle::LOST);
                }
                tracing::warn!(node = %self.parts.node, "shutdown cancelled while the apiserver is unreachable: the node stays cordoned until the maintenance is completed");
                Ok(())
            }
        }
    }

    fn reload(&self, settings: &Settings) {
        self.settings.send_replace(Arc::new(settings.clone()));
    }

    async fn after_boot(&self) -> Result<()> {
        let boot_id = self.parts.boot_id()?;
        let state_dir = &self.settings().state_dir;
        let offline = OfflineDrain::load_or_set_aside(state_dir).unwrap_or_else(|err| {
            tracing::error!(node = %self.parts.node, error = crate::cluster::error_text(&err), "the offline drain record is unreadable; it is left in place and not reported");
            None
        });
        // The kernel keeps its boot id through a soft reboot: what the state says tells.
        let soft_rebooted = ShutdownState::load(state_dir)
            .ok()
            .flatten()
            .is_some_and(|s| s.boot_id == boot_id && s.soft_rebooted());
        if soft_rebooted {
            tracing::info!(node = %self.parts.node, "the boot after a soft reboot");
        }
        let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
        let engine = self.apiserver_back(None).await;
        loop {
            // Read when used: the apiserver may have been awaited across a reload.
            let policy = self.settings().shutdown.after_boot;
            match engine
                .after_boot_of(&boot_id, soft_rebooted, policy, offline.as_ref())
                .await
            {
                Ok(outcome) => {
                    let recorded = outcome != AfterBoot::Unrecorded;
                    let earlier = offline
                        .as_ref()
                        .filter(|o| o.boot_id != boot_id || soft_rebooted);
                    if let Some(done) = earlier.filter(|_| recorded) {
                        // Only that record: a shutdown of this boot may have written its own
                        // while the apiserver was awaited.
                        if let Err(err) = OfflineDrain::remove_if_boot(state_dir, &done.boot_id) {
                            tracing::warn!(node = %self.parts.node, error = crate::cluster::error_text(&err), "removing the recorded offline drain record failed");
                        }
                    }
                    // Gated offline without a record to turn into a maintenance: the API
                    // has no NodeMaintenances, so none other holds them. (With no shutdown
                    // maintenance the engine has put them back already, unless another
                    // maintenance active on the node keeps them gated.)
                    if outcome == AfterBoot::Unrecorded && self.has_gated_static_pods().await {
                        match policy {
                            CompletionPolicy::Complete => self.restore_static_pods().await,
                            CompletionPolicy::Keep => {
                                tracing::warn!(node = %self.parts.node, "static pods stay gated from an offline shutdown; `nodegrace complete` restores them")
                            }
                        }
                    }
                    tracing::info!(node = %self.parts.node, ?outcome, "after-boot reconcile done");
                    return Ok(());
                }
                Err(err) => {
                    let delay = backoff.next();
                    tracing::warn!(node = %self.parts.node, error = crate::cluster::error_text(&err), retry_in = ?delay, "after-boot reconcile failed");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

/// The node's view the engine asks when a band ends: the runtime and the mounts under the
/// kubelet's root directory.
fn node_view(runtime: &Arc<dyn Runtime>, settings: &Settings) -> Option<Arc<dyn PodsOnNode>> {
    let root = settings.drain.kubelet_root_dir.clone()?;
    Some(Arc::new(RuntimeAndMounts::new(runtime.clone(), root)))
}

/// Builds the clients (retrying), checks that both credentials are what the identity
/// model needs and what the cluster serves, which decides once what to start
/// ([`Wiring`]), then starts the engine and what the wiring puts beside it
/// ([`start_wired`]). Until then every shutdown drains offline.
async fn connect_engine<F, Fut, C>(
    connect: F,
    settings: Settings,
    node: String,
    gate: Arc<dyn StaticPodGate>,
    metrics: Metrics,
    stop: CancellationToken,
    hurry: Arc<Notify>,
) -> Engine
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<C>>,
    C: Into<Clients>,
{
    let endpoint = crate::cluster::client::endpoint(&settings);
    let paths = [
        Role::Nodegrace.path(&settings).map(Path::to_owned),
        Role::Kubelet.path(&settings).map(Path::to_owned),
    ];
    let (clients, wiring, verified) = connect_verified(
        &connect,
        &endpoint,
        [paths[0].as_deref(), paths[1].as_deref()],
        &node,
        &metrics,
        &hurry,
    )
    .await;
    for warning in &verified.warnings {
        tracing::warn!(node = %node, "{warning}");
    }
    let unknown = |who: &str| {
        if who.is_empty() {
            "unknown".to_string()
        } else {
            who.to_string()
        }
    };
    tracing::info!(node = %node, apiserver = %endpoint, user = %unknown(&verified.nodegrace), pods_as = %unknown(&verified.kubelet), "connected to the apiserver");
    let options = EngineOptions {
        client: clients.nodegrace.clone(),
        endpoint: format!("{endpoint} as {}", unknown(&verified.nodegrace)),
        settings,
        node,
        gate,
        metrics,
        terminator: None,
    };
    start_wired(wiring, &clients, options, &stop)
}

/// Connects until the apiserver answers and both credentials pass `identity::verify`:
/// whether the in-tree EvictionRequest API is served, and who each client is. Failures are logged (a refused credential loudly, an absent apiserver now
/// and then) and retried.
async fn connect_verified<F, Fut, C>(
    connect: &F,
    endpoint: &str,
    paths: [Option<&Path>; 2],
    node: &str,
    metrics: &Metrics,
    hurry: &Notify,
) -> (Clients, Wiring, identity::Verified)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<C>>,
    C: Into<Clients>,
{
    let mut failures = 0u32;
    let mut said: Option<String> = None;
    // A shutdown began: it waits for this connection.
    let mut hurried = false;
    loop {
        let attempt = async {
            let clients: Clients = connect().await?.into();
            let in_tree = eviction_request::is_served(&clients.nodegrace).await?;
            let wiring = Wiring::new(in_tree, node);
            let verified = identity::verify(&clients, paths, node).await?;
            // Only the path taken needs its permissions.
            if wiring.requester {
                identity::verify_in_tree(&clients, &verified).await?;
            }
            anyhow::Ok((clients, wiring, verified))
        };
        match attempt.await {
            Ok(ready) => return ready,
            Err(err) => {
                metrics.api_error("connect");
                let text = crate::cluster::error_text(&err);
                let credential = err
                    .chain()
                    .any(|c| c.downcast_ref::<CredentialError>().is_some());
                // An apiserver that is away is looked for often (a shutdown waits at most
                // fallback.apiserver_timeout for it); one that refuses the credential less so.
                let cap = if credential {
                    RETRY_MAX
                } else {
                    RETRY_MAX_UNREACHABLE
                };
                let delay = Backoff::after(RETRY_MIN, cap, failures);
                // The first failure, a new reason, and then about every few minutes.
                let remind = failures.is_power_of_two() || failures == 0;
                if credential && (said.as_deref() != Some(text.as_str()) || remind) {
                    tracing::error!(node = %node, apiserver = %endpoint, error = %text, retry_in = ?delay, "nodegrace cannot act through the apiserver with these credentials; until it can, a shutdown drains through the CRI runtime");
                } else if !credential && remind {
                    tracing::warn!(node = %node, apiserver = %endpoint, error = %text, retry_in = ?delay, "cannot reach the apiserver yet");
                }
                said = Some(text);
                // During a shutdown an apiserver that is away is looked for at most about a
                // second apart (a refused credential does not mend itself meanwhile).
                let wait = if hurried && !credential {
                    retry_delay(failures, true, rand::rng().random::<f64>())
                } else {
                    delay
                };
                failures += 1;
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    () = hurry.notified(), if !hurried => hurried = true,
                }
            }
        }
    }
}

/// The daemon's clients: nodegrace's identity and the kubelet's (the same client when
/// `node.kubelet_kubeconfig` is empty), each following its kubeconfig file. A file that
/// cannot be used is a `CredentialError`.
pub async fn daemon_clients(settings: &Settings, connect_timeout: Duration) -> Result<Clients> {
    let node = settings.node_name()?;
    let timeouts = Timeouts {
        connect: connect_timeout,
        read: None,
        answer: None,
    };
    let build = |role: Role| {
        let node = node.clone();
        async move {
            let Some(path) = role.path(settings) else {
                return client_for(None, role, timeouts).await;
            };
            // A changed file is used only if the apiserver accepts it as the right identity.
            let accept = move |client: kube::Client| {
                let node = node.clone();
                async move {
                    let (user, groups) = crate::cluster::client::identity(&client).await?;
                    match identity::judge(role, &node, &user, &groups) {
                        identity::Finding::Unusable(e) => Err(anyhow::anyhow!(e)),
                        _ => Ok(()),
                    }
                }
            };
            ReloadingClient::new(path, role, timeouts, accept)
                .await
                .map(|r| r.client())
        }
    };
    let nodegrace = build(Role::Nodegrace)
        .await
        .map_err(|e| CredentialError(crate::cluster::error_text(&e)))?;
    if settings.node.kubelet_kubeconfig.is_none() {
        return Ok(Clients::from(nodegrace));
    }
    let kubelet = build(Role::Kubelet)
        .await
        .map_err(|e| CredentialError(crate::cluster::error_text(&e)))?;
    Ok(Clients {
        nodegrace,
        kubelet,
        shared: false,
    })
}

/// The drainer `nodegrace run` uses on a real node.
pub(crate) fn real_node_drainer(settings: &Settings, metrics: Metrics) -> Result<NodeDrainer> {
    let node = settings.node_name().context("determining the node name")?;
    let gate = crate::staticpods::FsGate::new(&settings.static_pods, &settings.state_dir)
        .context("opening the static pod gate")?;
    // Any move a crash interrupted is settled before anything else touches the manifests.
    let gate = crate::staticpods::RecoveredFirst::new(gate);
    let runtime = crate::cri::CriClient::new(
        &settings.fallback.cri_endpoint,
        crate::cri::CriTimeouts::default(),
    )
    .with_context(|| format!("CRI endpoint {}", settings.fallback.cri_endpoint))?;
    let connect_settings = settings.clone();
    let connect_timeout = settings
        .fallback
        .apiserver_timeout
        .min(Duration::from_secs(5));
    let renewal_metrics = metrics.clone();
    let drainer = NodeDrainer::start(
        NodeParts {
            settings: settings.clone(),
            node: node.clone(),
            runtime: Arc::new(runtime),
            kubelet: Some(Arc::new(crate::systemd::SystemdKubelet::default())),
            gate: Arc::new(gate),
            metrics,
            boot_id: BootIdSource::System,
        },
        move || {
            let settings = connect_settings.clone();
            async move { daemon_clients(&settings, connect_timeout).await }
        },
    );
    tokio::spawn(crate::credentials::renew::run(
        settings.clone(),
        node,
        renewal_metrics,
        drainer.stop_token(),
    ));
    Ok(drainer)
}
