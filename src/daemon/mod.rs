//! The one state machine: start, steady, draining, fallback, released, cancelled.
//! The Kubernetes drain and the offline fallback plug in behind [`Drainer`].

mod bus;
mod machine;
pub(crate) mod node;
pub(crate) mod status;
pub(crate) mod wave;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;

use crate::config::Settings;

pub use bus::{Bus, Connector, ZbusConnector};
pub use machine::{Daemon, DaemonHandle, DaemonPaths};
pub use status::{Phase, Status};

pub use crate::plan::lifecycle::{RouteEvent, Way};
pub use crate::shutdown::{CancelCause, ShutdownKind, ShutdownRequest};

/// The node's drain, as seen by the state machine: one leg at a time, the way the
/// lifecycle says (`plan::lifecycle::route`). The daemon releases the inhibitor when the
/// drain is over or when the budget ends, whichever is first; at the budget end the `drain`
/// future is dropped, so implementations must be cancel-safe.
#[async_trait]
pub trait Drainer: Send + Sync + 'static {
    /// Drains the node for `req` the way `way` says; returns how that leg ended.
    async fn drain(&self, req: &ShutdownRequest, way: Way) -> anyhow::Result<RouteEvent>;
    /// The shutdown will not happen (`cause`): stop the drain where it is and undo what
    /// must be undone.
    async fn cancel(&self, req: &ShutdownRequest, cause: CancelCause) -> anyhow::Result<()>;
    /// The daemon started and no shutdown is in progress: reconcile after a boot.
    async fn after_boot(&self) -> anyhow::Result<()>;
    /// The configuration was reloaded (SIGHUP): use `settings` from now on. Keys that need a
    /// restart keep their running values (`config::restart_required`).
    fn reload(&self, _settings: &Settings) {}
}

/// The drainer the daemon uses: the cluster engine with the CRI fallback. With the
/// `test-hooks` feature, `NODEGRACE_TEST_DRAIN_SECONDS=N` replaces it by a drain that takes
/// N seconds, for tests against a real logind without a cluster.
pub(crate) fn build_drainer(
    settings: &Settings,
    metrics: crate::metrics::Metrics,
) -> anyhow::Result<Arc<dyn Drainer>> {
    #[cfg(feature = "test-hooks")]
    if let Some(secs) = std::env::var("NODEGRACE_TEST_DRAIN_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        tracing::warn!(secs, "test hook: every drain takes {secs} s");
        return Ok(Arc::new(SleepDrainer(Duration::from_secs(secs))));
    }
    Ok(Arc::new(node::real_node_drainer(settings, metrics)?))
}

/// Where the fallback's bands come from, and why the kubelet's configuration was set aside.
fn log_kubelet_settings(settings: &Settings) {
    let fb = &settings.fallback;
    if let Some(why) = &fb.kubelet_set_aside {
        tracing::warn!(why = %why, "the kubelet's configuration is set aside");
    }
    tracing::info!(bands_from = %fb.bands_from, kubelet_gns = fb.kubelet_gns, "offline fallback bands");
    if fb.kubelet_gns {
        tracing::warn!("the kubelet's own Graceful Node Shutdown is configured: it kills pods at a shutdown beside nodegrace's drain; nodegrace leaves the GracefulNodeShutdownInProgress condition to it");
    }
}

/// A drain that takes a fixed time (test hook).
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, Copy)]
struct SleepDrainer(Duration);

#[cfg(feature = "test-hooks")]
#[async_trait]
impl Drainer for SleepDrainer {
    async fn drain(&self, _req: &ShutdownRequest, way: Way) -> anyhow::Result<RouteEvent> {
        if way == Way::Connecting {
            return Ok(RouteEvent::Begin { engine: true });
        }
        tokio::time::sleep(self.0).await;
        Ok(RouteEvent::OnlineDrained)
    }
    async fn cancel(&self, _req: &ShutdownRequest, _cause: CancelCause) -> anyhow::Result<()> {
        Ok(())
    }
    async fn after_boot(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// `nodegrace run` with a valid configuration (the CLI loads and checks it): runs until
/// SIGTERM. Only a service that is not logind ends it with an error; an unreachable bus is
/// retried. `stored_inhibitor` is the fd systemd kept for the previous process.
pub(crate) fn run(
    settings: Settings,
    config: &Path,
    stored_inhibitor: Option<std::os::fd::OwnedFd>,
) -> anyhow::Result<()> {
    // One thread keeps RSS and wake-ups down; blocking helpers (zbus uses a few while
    // connecting) must not linger.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .thread_keep_alive(Duration::from_secs(1))
        .build()
        .context("building the async runtime")?;
    let config_path: PathBuf = config.to_path_buf();
    let result = runtime.block_on(async move {
        // `run` has set logging up and said it is starting before reading anything.
        crate::telemetry::init();
        log_kubelet_settings(&settings);
        let metrics = crate::metrics::Metrics::new();
        let stop_metrics = tokio_util::sync::CancellationToken::new();
        if let Some(addr) = settings.metrics.listen {
            // The node is protected without metrics: a taken port is reported, not fatal.
            match crate::metrics::serve(addr, metrics.clone(), stop_metrics.clone()).await {
                Ok(_) => tracing::info!(%addr, "serving Prometheus metrics on /metrics"),
                Err(err) => tracing::error!(
                    error = format!("{err:#}"),
                    "metrics are not served until nodegrace is restarted with metrics.listen free or changed; the node is protected all the same"
                ),
            }
        }
        let drainer = build_drainer(&settings, metrics.clone())?;
        let daemon = Daemon::new(
            settings,
            DaemonPaths::from_env(),
            Arc::new(ZbusConnector::system()),
            drainer,
            Arc::new(crate::systemd::SdNotifier),
        )
        .with_reloader(Box::new(move || {
            let s = crate::config::load(&config_path).map_err(anyhow::Error::from)?;
            log_kubelet_settings(&s);
            Ok(s)
        }))
        .with_adopted_inhibitor(stored_inhibitor);
        forward_signals(daemon.handle()).context("installing signal handlers")?;
        tokio::spawn(mirror_status_into_metrics(daemon.handle(), metrics));
        let result = daemon.run().await;
        stop_metrics.cancel();
        result
    });
    // A configuration read stuck on a hung filesystem must not keep the process from exiting.
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// Keeps the inhibitor, budget and shutdown-time gauges equal to the daemon's status; wakes
/// only when the status changes.
async fn mirror_status_into_metrics(handle: DaemonHandle, metrics: crate::metrics::Metrics) {
    type Key = (
        bool,
        Option<Duration>,
        Option<chrono::DateTime<chrono::Utc>>,
        Phase,
        bool,
        Option<status::LastShutdown>,
    );
    let key = |s: &Status| -> Key {
        (
            s.inhibitor_held,
            s.budget.as_ref().map(|b| b.budget),
            s.shutdown.as_ref().map(|d| d.started_at),
            s.phase,
            s.bus_connected,
            s.last_shutdown,
        )
    };
    let mut last: Option<Key> = None;
    while let Some(status) = handle.wait_for(|s| Some(key(s)) != last).await {
        let now = key(&status);
        metrics.set_inhibitor_held(status.inhibitor_held);
        metrics.set_bus_connected(status.bus_connected);
        metrics.set_phase(
            status.phase == Phase::Armed,
            status.phase == Phase::Draining,
        );
        if let Some(budget) = now.1 {
            metrics.set_effective_budget(budget);
        }
        if let Some(ended) = now.5 {
            if last.as_ref().and_then(|l| l.5) != Some(ended) {
                // Its start too, for a shutdown of an earlier process; one under way now is
                // newer and is set next.
                metrics.shutdown_started(ended.started_at);
                metrics.shutdown_ended(ended.outcome, ended.ended_at);
                if let Some(took) = ended.duration_to_count {
                    metrics.shutdown_took(ended.kind.as_str(), took);
                }
            }
        }
        if let Some(started) = now.2 {
            if last.as_ref().and_then(|l| l.2) != Some(started) {
                metrics.shutdown_started(started);
            }
        }
        last = Some(now);
    }
}

fn forward_signals(handle: DaemonHandle) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => handle.terminate(),
                _ = int.recv() => handle.terminate(),
                _ = hup.recv() => handle.reload(),
            }
        }
    });
    Ok(())
}
