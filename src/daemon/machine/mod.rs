//! The daemon's state machine: one task, fed by the logind signal stream, the drain's legs,
//! the budget deadline, control messages (signals) and the watchdog timer.

mod connection;
mod persist;
mod reload;

use connection::shutdown_kind_now;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::{Instant, Interval};

use crate::config::Settings;
use crate::daemon::bus::{Bus, Connector};
use crate::daemon::status::{LastShutdown, Phase, ShutdownStatus, Status, DEFAULT_STATUS_FILE};
use crate::daemon::{CancelCause, Drainer, ShutdownKind, ShutdownRequest};
use crate::logind::budget::{self, BudgetReport};
use crate::logind::{InhibitorInfo, InhibitorLock, LogindError, LogindEvent};
use crate::plan::backoff::Backoff;
use crate::plan::lifecycle::{
    self, BudgetFrom, Effect, Event, KindFrom, Lifecycle, Outcome, RouteEvent, Way,
};
use crate::state::{current_boot_id, ShutdownOutcome, ShutdownPhase, ShutdownState};
use crate::systemd::{self, Notifier, Notify, INHIBITOR_FDNAME};

const INHIBITOR_WHO: &str = "nodegrace";
const INHIBITOR_WHY: &str = "Draining Kubernetes workloads from this node before shutdown";
const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// logind's built-in `InhibitDelayMaxSec`, used before the real value could be read.
const LOGIND_DEFAULT_DELAY: Duration = Duration::from_secs(5);
/// How long a configuration reload may take before the running settings are kept.
const RELOAD_TIMEOUT: Duration = crate::config::READ_LIMIT;
/// How often logind's inhibitors are read again for a kubelet delay lock: the kubelet takes
/// its lock once its runtime is up, often after nodegrace has connected.
const KUBELET_INHIBITOR_CHECK: Duration = Duration::from_secs(30);

/// Files the daemon writes besides the state directory of its settings.
#[derive(Debug, Clone)]
pub struct DaemonPaths {
    pub status_file: PathBuf,
    /// logind.conf.d directories to scan, highest priority first.
    pub logind_search_dirs: Vec<PathBuf>,
}

impl DaemonPaths {
    /// The standard paths; `$NODEGRACE_STATUS_FILE` overrides the status file.
    pub(crate) fn from_env() -> Self {
        DaemonPaths {
            status_file: std::env::var_os("NODEGRACE_STATUS_FILE")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATUS_FILE)),
            logind_search_dirs: budget::default_search_dirs(),
        }
    }
}

/// What signals (or tests) ask of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// SIGTERM: drain first if the system is going down, then exit.
    Terminate,
    /// SIGHUP: reload the configuration.
    Reload,
}

/// Reads the configuration again (on SIGHUP). It runs on a blocking thread, never on the
/// state machine's: a file on a hung filesystem must not stop the drain or the watchdog.
pub(crate) type Reloader = Box<dyn Fn() -> Result<Settings> + Send + Sync>;

/// The daemon with its adapters injected; [`Daemon::run`] runs it until it is terminated.
pub struct Daemon {
    settings: Settings,
    paths: DaemonPaths,
    connector: Arc<dyn Connector>,
    drainer: Arc<dyn Drainer>,
    notifier: Arc<dyn Notifier>,
    reloader: Option<Reloader>,
    adopted: Option<OwnedFd>,
    control_tx: mpsc::UnboundedSender<Control>,
    control_rx: mpsc::UnboundedReceiver<Control>,
    status_tx: watch::Sender<Status>,
}

type SharedReloader = Arc<dyn Fn() -> Result<Settings> + Send + Sync>;

/// Controls a running [`Daemon`] and watches its status.
#[derive(Clone)]
pub struct DaemonHandle {
    control: mpsc::UnboundedSender<Control>,
    status: watch::Receiver<Status>,
}

impl DaemonHandle {
    pub fn terminate(&self) {
        let _ = self.control.send(Control::Terminate);
    }

    pub fn reload(&self) {
        let _ = self.control.send(Control::Reload);
    }

    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Waits until the status satisfies `pred`; None once the daemon is gone.
    pub async fn wait_for(&self, pred: impl FnMut(&Status) -> bool) -> Option<Status> {
        let mut rx = self.status.clone();
        let r = rx.wait_for(pred).await.ok().map(|s| s.clone());
        r
    }
}

impl Daemon {
    pub fn new(
        settings: Settings,
        paths: DaemonPaths,
        connector: Arc<dyn Connector>,
        drainer: Arc<dyn Drainer>,
        notifier: Arc<dyn Notifier>,
    ) -> Self {
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (status_tx, _) = watch::channel(Status::new());
        Daemon {
            settings,
            paths,
            connector,
            drainer,
            notifier,
            reloader: None,
            adopted: None,
            control_tx,
            control_rx,
            status_tx,
        }
    }

    /// Where SIGHUP gets the new settings from.
    pub fn with_reloader(mut self, reloader: Reloader) -> Self {
        self.reloader = Some(reloader);
        self
    }

    /// An inhibitor fd that systemd passed back from the unit's fd store: the previous
    /// process died holding it, and it is used instead of taking a second lock.
    pub fn with_adopted_inhibitor(mut self, fd: Option<OwnedFd>) -> Self {
        self.adopted = fd;
        self
    }

    pub fn handle(&self) -> DaemonHandle {
        DaemonHandle {
            control: self.control_tx.clone(),
            status: self.status_tx.subscribe(),
        }
    }

    /// Runs until terminated. Errors only where retrying cannot help (not a logind).
    pub async fn run(self) -> Result<()> {
        let watchdog = self.notifier.watchdog_interval().map(|period| {
            let mut i = tokio::time::interval_at(Instant::now() + period, period);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        });
        let mut m = Machine {
            settings: self.settings,
            paths: self.paths,
            connector: self.connector,
            drainer: self.drainer,
            notifier: self.notifier,
            reloader: self.reloader.map(SharedReloader::from),
            reloading: None,
            reload_give_up: None,
            reload_abandoned: None,
            adopted: self.adopted,
            _control_tx: self.control_tx,
            control_rx: self.control_rx,
            status_tx: self.status_tx,
            status: Status::new(),
            boot_id: current_boot_id(),
            bus: None,
            events: None,
            connecting: None,
            reconnect_at: None,
            backoff: Backoff::new(BACKOFF_INITIAL, BACKOFF_MAX),
            lock: None,
            budget: None,
            shutdown: None,
            drain: None,
            deadline: None,
            life: Lifecycle::default(),
            ready_sent: false,
            side_tasks: Vec::new(),
            watchdog,
            kubelet_check: {
                let mut i = tokio::time::interval_at(
                    Instant::now() + KUBELET_INHIBITOR_CHECK,
                    KUBELET_INHIBITOR_CHECK,
                );
                i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                i
            },
            kubelet_listing: None,
        };
        m.status.last_shutdown = m.last_shutdown_recorded();
        let result = m.run().await;
        m.stop(result.as_ref().err().map(crate::cluster::error_text));
        result
    }
}

struct Connected {
    bus: Bus,
    events: BoxStream<'static, LogindEvent>,
    budget: BudgetReport,
}

enum Step {
    Control(Option<Control>),
    Connected(Result<Result<Connected, LogindError>, JoinError>),
    Reconnect,
    Event(Option<LogindEvent>),
    DrainDone(Result<Result<RouteEvent>, JoinError>),
    Reloaded(Box<Result<Result<Settings>, JoinError>>),
    ReloadTimedOut,
    Deadline,
    Watchdog,
    KubeletCheck,
    KubeletListed(Result<Result<Vec<InhibitorInfo>>, JoinError>),
}

#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Exit,
}

struct Machine {
    settings: Settings,
    paths: DaemonPaths,
    connector: Arc<dyn Connector>,
    drainer: Arc<dyn Drainer>,
    notifier: Arc<dyn Notifier>,
    reloader: Option<SharedReloader>,
    /// A reload in progress: control messages wait for it, so that they keep their order.
    reloading: Option<JoinHandle<Result<Settings>>>,
    reload_give_up: Option<Instant>,
    /// A reload given up on whose read has not ended (its thread cannot be stopped): no
    /// other read starts until it does, so SIGHUPs cannot pile up stuck threads.
    reload_abandoned: Option<JoinHandle<Result<Settings>>>,
    /// The inhibitor fd systemd passed back at start, until the first connection uses it.
    adopted: Option<OwnedFd>,
    _control_tx: mpsc::UnboundedSender<Control>,
    control_rx: mpsc::UnboundedReceiver<Control>,
    status_tx: watch::Sender<Status>,
    status: Status,
    boot_id: String,
    bus: Option<Bus>,
    events: Option<BoxStream<'static, LogindEvent>>,
    connecting: Option<JoinHandle<Result<Connected, LogindError>>>,
    reconnect_at: Option<Instant>,
    backoff: Backoff,
    lock: Option<InhibitorLock>,
    budget: Option<BudgetReport>,
    shutdown: Option<ShutdownRequest>,
    /// The drain's leg under way (`lifecycle::Way`).
    drain: Option<JoinHandle<Result<RouteEvent>>>,
    deadline: Option<Instant>,
    /// Where the shutdown lifecycle is; changed by `dispatch` only.
    life: Lifecycle,
    ready_sent: bool,
    side_tasks: Vec<JoinHandle<()>>,
    watchdog: Option<Interval>,
    kubelet_check: Interval,
    /// The periodic read of logind's inhibitors, off the loop: a logind slow to answer must
    /// not hold back a PrepareForShutdown or the budget's end.
    kubelet_listing: Option<JoinHandle<Result<Vec<InhibitorInfo>>>>,
}

async fn join_opt<T>(h: &mut Option<JoinHandle<T>>) -> Result<T, JoinError> {
    match h {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

async fn next_opt(s: &mut Option<BoxStream<'static, LogindEvent>>) -> Option<LogindEvent> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

async fn tick_opt(i: &mut Option<Interval>) {
    match i {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

impl Machine {
    async fn run(&mut self) -> Result<()> {
        self.publish();
        self.notifier
            .notify(Notify::Status(Phase::Starting.describe().into()));
        self.start_connecting();
        loop {
            let step = tokio::select! {
                c = self.control_rx.recv(), if self.reloading.is_none() => Step::Control(c),
                r = join_opt(&mut self.reloading) => Step::Reloaded(Box::new(r)),
                () = crate::timer::sleep_until(self.reload_give_up) => Step::ReloadTimedOut,
                r = join_opt(&mut self.connecting) => Step::Connected(r),
                () = crate::timer::sleep_until(self.reconnect_at) => Step::Reconnect,
                e = next_opt(&mut self.events) => Step::Event(e),
                r = join_opt(&mut self.drain) => Step::DrainDone(r),
                () = crate::timer::sleep_until(self.deadline) => Step::Deadline,
                () = tick_opt(&mut self.watchdog) => Step::Watchdog,
                _ = self.kubelet_check.tick(), if self.bus.is_some() => Step::KubeletCheck,
                r = join_opt(&mut self.kubelet_listing) => Step::KubeletListed(r),
            };
            let flow = match step {
                Step::Control(Some(Control::Terminate)) | Step::Control(None) => {
                    self.dispatch_now(Event::Terminate).await
                }
                Step::Control(Some(Control::Reload)) => {
                    self.start_reload();
                    Flow::Continue
                }
                Step::Reloaded(r) => {
                    self.reloading = None;
                    self.reload_give_up = None;
                    self.on_reloaded(*r);
                    Flow::Continue
                }
                Step::ReloadTimedOut => {
                    // The blocking thread is left to finish on its own; its result is dropped.
                    self.reload_abandoned = self.reloading.take();
                    self.reload_give_up = None;
                    tracing::error!(
                        timeout = ?RELOAD_TIMEOUT,
                        "reading the configuration did not finish in time (a file on a hung filesystem?): abandoned, keeping the running one; no other reload starts until that read ends"
                    );
                    Flow::Continue
                }
                Step::Connected(r) => {
                    self.connecting = None;
                    self.on_connected(r).await?;
                    Flow::Continue
                }
                Step::Reconnect => {
                    self.start_connecting();
                    Flow::Continue
                }
                Step::Event(e) => self.on_event(e).await,
                Step::DrainDone(r) => {
                    self.drain = None;
                    let event = match r {
                        Ok(Ok(ended)) => Event::Route {
                            ended,
                            fallback_enabled: self.settings.fallback.enabled,
                        },
                        Ok(Err(e)) => {
                            tracing::error!(error = %crate::cluster::error_text(&e), "drain failed");
                            Event::DrainFailed {
                                reason: format!("drain failed: {e:#}"),
                            }
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "drain task ended abnormally");
                            Event::DrainFailed {
                                reason: "drain task ended abnormally".to_string(),
                            }
                        }
                    };
                    self.dispatch_now(event).await
                }
                Step::Deadline => {
                    tracing::warn!("shutdown budget ended before the drain finished");
                    self.deadline = None;
                    self.dispatch_now(Event::BudgetEnded).await
                }
                Step::Watchdog => {
                    self.notifier.notify(Notify::Watchdog);
                    Flow::Continue
                }
                Step::KubeletCheck => {
                    if let Some(bus) = self.bus.clone() {
                        if self.kubelet_listing.is_none()
                            && self.settings.shutdown.warn_kubelet_inhibitor
                        {
                            self.kubelet_listing =
                                Some(tokio::spawn(
                                    async move { bus.logind.list_inhibitors().await },
                                ));
                        }
                    }
                    Flow::Continue
                }
                Step::KubeletListed(r) => {
                    self.kubelet_listing = None;
                    if let Ok(listed) = r {
                        let before = self.status.kubelet_inhibitor.clone();
                        self.note_kubelet_inhibitor(listed);
                        if self.status.kubelet_inhibitor != before {
                            self.publish();
                        }
                    }
                    Flow::Continue
                }
            };
            if flow == Flow::Exit {
                return Ok(());
            }
        }
    }

    fn publish(&mut self) {
        self.status.updated_at = chrono::Utc::now();
        self.status.write(&self.paths.status_file);
        self.status_tx.send_replace(self.status.clone());
    }

    fn enter(&mut self, phase: Phase, reason: &str) {
        tracing::info!(phase = ?phase, reason, "phase change");
        self.status.enter(phase, reason);
        self.notifier.notify(Notify::Status(format!(
            "{}{}",
            phase.describe(),
            if reason.is_empty() {
                String::new()
            } else {
                format!(" ({reason})")
            }
        )));
        self.publish();
    }

    fn spawn_side<F, Fut>(&mut self, what: &'static str, f: F)
    where
        F: FnOnce(Arc<dyn Drainer>) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        self.side_tasks.retain(|t| !t.is_finished());
        let fut = f(self.drainer.clone());
        self.side_tasks.push(tokio::spawn(async move {
            if let Err(e) = fut.await {
                tracing::error!(task = what, error = %crate::cluster::error_text(&e), "drainer task failed");
            }
        }));
    }

    /// Persists the shutdown, then starts the drain and the budget deadline.
    fn begin_shutdown(
        &mut self,
        kind: ShutdownKind,
        budget_override: Option<Duration>,
        resume: Option<&ShutdownState>,
    ) {
        let now = chrono::Utc::now();
        let req = match resume {
            Some(p) => self.request_from(p, true),
            None => ShutdownRequest {
                kind,
                started_at: now,
                budget: budget_override.unwrap_or_else(|| {
                    self.budget
                        .as_ref()
                        .map(|b| b.budget)
                        .unwrap_or(LOGIND_DEFAULT_DELAY)
                }),
                resumed: false,
                boot_id: self.boot_id.clone(),
                started_since_boot: crate::shutdown::since_boot(),
            },
        };
        let remaining = req.remaining(now);
        tracing::info!(
            kind = %req.kind,
            started_at = %req.started_at,
            budget = %humantime::format_duration(req.budget),
            remaining = %humantime::format_duration(remaining),
            resumed = req.resumed,
            "shutdown: draining the node"
        );
        self.shutdown = Some(req.clone());
        self.persist_with(ShutdownPhase::Draining, None, true);
        self.deadline = Some(instant_after(remaining));
        self.status.shutdown = Some(ShutdownStatus {
            kind: req.kind,
            started_at: req.started_at,
            deadline: chrono::TimeDelta::from_std(req.budget)
                .ok()
                .and_then(|b| req.started_at.checked_add_signed(b))
                .unwrap_or(req.started_at),
            resumed: req.resumed,
            way: None,
        });
    }

    /// Starts the drain's leg `way`; `resumed`: the cluster drained this shutdown before.
    fn start_leg(&mut self, way: Way, resumed: bool) {
        let Some(req) = &self.shutdown else {
            tracing::error!(way = ?way, "no shutdown to drain");
            return;
        };
        let mut req = req.clone();
        req.resumed |= resumed;
        if way != Way::Connecting {
            tracing::info!(
                way = way.describe(),
                resumed = req.resumed,
                "the drain goes {}",
                way.describe()
            );
        }
        let drainer = self.drainer.clone();
        self.drain = Some(tokio::spawn(async move { drainer.drain(&req, way).await }));
    }

    /// Holds a delay inhibitor: the one systemd passed back from the fd store if logind
    /// still honours it, else a new one, kept in the fd store so that a crash does not
    /// release it.
    async fn take_inhibitor(&mut self, bus: &Bus) -> Result<()> {
        let adopted = self.adopted.take().and_then(|fd| {
            InhibitorLock::adopt(fd)
                .map_err(|e| {
                    tracing::warn!(error = %crate::cluster::error_text(&e), "not adopting the stored inhibitor; taking a new one");
                })
                .ok()
        });
        match adopted {
            // systemd keeps its copy: nothing to store again.
            Some(lock) => self.lock = Some(lock),
            None => {
                let lock = bus
                    .logind
                    .inhibit_shutdown_delay(INHIBITOR_WHO, INHIBITOR_WHY)
                    .await?;
                // Removal goes by name, so the old copy leaves the store before the new
                // one enters; the new lock is held by this process meanwhile.
                self.notifier.remove_stored_fd(INHIBITOR_FDNAME);
                if let Some(fd) = lock.as_fd() {
                    self.notifier.store_fd(INHIBITOR_FDNAME, fd);
                }
                if let Some(old) = self.lock.replace(lock) {
                    old.release("replaced by the inhibitor taken after reconnecting");
                }
            }
        }
        self.status.inhibitor_held = true;
        if !self.ready_sent {
            self.notifier.notify(Notify::Ready);
            self.ready_sent = true;
        }
        self.publish();
        Ok(())
    }

    /// Releases the inhibitor: systemd's copy leaves the fd store first, then ours closes.
    fn drop_lock(&mut self, reason: &str) {
        if let Some(lock) = self.lock.take() {
            self.notifier.remove_stored_fd(INHIBITOR_FDNAME);
            lock.release(reason);
        }
    }

    fn release(&mut self, reason: &str, outcome: ShutdownOutcome) {
        self.drop_lock(reason);
        self.status.inhibitor_held = false;
        self.deadline = None;
        if let Some(d) = self.drain.take() {
            d.abort();
        }
        self.persist_end(ShutdownPhase::Released, outcome);
    }

    async fn cancel_shutdown(&mut self, rearm: bool, cause: CancelCause) -> Result<()> {
        if let Some(d) = self.drain.take() {
            d.abort();
        }
        self.deadline = None;
        let outcome = match cause {
            CancelCause::Cancelled => ShutdownOutcome::Cancelled,
            CancelCause::Lost => {
                tracing::error!(kind = ?self.shutdown.as_ref().map(|r| r.kind), "{}", lifecycle::LOST);
                ShutdownOutcome::Lost
            }
        };
        self.persist_end(ShutdownPhase::Cancelled, outcome);
        let req = self.shutdown.take();
        self.status.shutdown = None;
        if rearm {
            self.take_inhibitor_now().await?;
        }
        if let Some(req) = req {
            self.spawn_side(
                "cancel",
                move |d| async move { d.cancel(&req, cause).await },
            );
        }
        Ok(())
    }

    async fn take_inhibitor_now(&mut self) -> Result<()> {
        let bus = self.bus.clone().context("not connected to the bus")?;
        self.take_inhibitor(&bus).await
    }

    async fn on_event(&mut self, e: Option<LogindEvent>) -> Flow {
        if self.bus.is_none() {
            return Flow::Continue;
        }
        let event = match e {
            Some(LogindEvent::PrepareForShutdown { start, kind }) => {
                Event::PrepareForShutdown { start, kind }
            }
            Some(LogindEvent::Gone) => {
                self.disconnect("logind left the bus");
                return Flow::Continue;
            }
            None => {
                self.disconnect("the bus connection closed");
                return Flow::Continue;
            }
        };
        self.dispatch_now(event).await
    }

    /// [`Self::dispatch`] where a failure loses the bus connection.
    async fn dispatch_now(&mut self, event: Event) -> Flow {
        let (flow, failed) = self.dispatch(event, None).await;
        if let Some(e) = failed {
            self.disconnect(&crate::cluster::error_text(&e));
        }
        flow
    }

    /// Feeds `event` to the lifecycle and carries out its effects, in order, feeding back
    /// the events they produce. The state changes only when every effect succeeded; after a
    /// failure the remaining effects are skipped, except an exit.
    async fn dispatch(
        &mut self,
        event: Event,
        persisted: Option<&ShutdownState>,
    ) -> (Flow, Option<anyhow::Error>) {
        let mut flow = Flow::Continue;
        let mut pending = Some(event);
        while let Some(event) = pending.take() {
            let t = lifecycle::step(self.life, event.clone());
            if let Outcome::Ignored(why) = t.outcome {
                tracing::debug!(event = ?event, phase = ?self.life.phase, why, "event ignored");
                continue;
            }
            let mut failed = None;
            for effect in t.effects {
                if effect == Effect::Exit {
                    flow = Flow::Exit;
                } else if failed.is_none() {
                    match self.carry_out(effect, persisted).await {
                        Ok(fed) => pending = fed.or(pending),
                        Err(e) => failed = Some(e),
                    }
                }
            }
            if failed.is_some() {
                return (flow, failed);
            }
            self.life = t.next;
            if let Some(status) = &mut self.status.shutdown {
                if status.way != self.life.way {
                    status.way = self.life.way;
                    self.publish();
                }
            }
        }
        (flow, None)
    }

    /// Carries out one effect of the lifecycle; returns the event it produced, if any.
    async fn carry_out(
        &mut self,
        effect: Effect,
        persisted: Option<&ShutdownState>,
    ) -> Result<Option<Event>> {
        match effect {
            Effect::TakeInhibitor => self.take_inhibitor_now().await?,
            Effect::StartDrain {
                kind,
                budget,
                resume,
            } => {
                let kind = match (kind, &self.bus, persisted) {
                    (KindFrom::Given(k), _, _) => k,
                    (KindFrom::Persisted, _, Some(p)) => p.kind,
                    // logind 255+ says in the signal; older ones only in a property.
                    (_, Some(bus), _) => shutdown_kind_now(bus).await,
                    (_, None, _) => ShutdownKind::Unknown,
                };
                let budget = match budget {
                    BudgetFrom::Logind => None,
                    BudgetFrom::StopTimeout => Some(self.settings.shutdown.stop_drain_timeout),
                };
                self.begin_shutdown(kind, budget, persisted.filter(|_| resume));
            }
            Effect::Drain { way, resumed } => self.start_leg(way, resumed),
            Effect::CapDeadline => {
                tracing::info!("stop requested while draining: finishing the drain first");
                let cap = instant_after(self.settings.shutdown.stop_drain_timeout);
                self.deadline = Some(self.deadline.map_or(cap, |d| d.min(cap)));
            }
            Effect::Release { reason, outcome } => self.release(&reason, outcome),
            Effect::CancelShutdown { rearm, cause } => self.cancel_shutdown(rearm, cause).await?,
            Effect::CancelPersisted => {
                if let Some(p) = persisted {
                    tracing::info!("the shutdown was cancelled while nodegrace was not running");
                    let req = self.request_from(p, true);
                    self.shutdown = Some(req.clone());
                    self.persist_end(ShutdownPhase::Cancelled, ShutdownOutcome::Cancelled);
                    self.shutdown = None;
                    self.spawn_side("cancel", move |d| async move {
                        d.cancel(&req, CancelCause::Cancelled).await
                    });
                }
            }
            Effect::AfterBoot => {
                self.spawn_side("after_boot", |d| async move { d.after_boot().await })
            }
            Effect::NotifyStopping => self.notifier.notify(Notify::Stopping),
            Effect::AskSystemStopping => {
                let Some(bus) = self.bus.clone() else {
                    return Ok(Some(Event::SystemStopping(Some(false))));
                };
                let answer = match systemd::is_system_stopping(bus.systemd.as_ref()).await {
                    Ok(stopping) => Some(stopping),
                    Err(e) => {
                        tracing::warn!(error = %crate::cluster::error_text(&e), "cannot tell whether the system is stopping; exiting without draining");
                        None
                    }
                };
                return Ok(Some(Event::SystemStopping(answer)));
            }
            Effect::Enter { phase, reason } => self.enter(phase, &reason),
            Effect::Exit => {}
        }
        Ok(None)
    }

    /// Leaves nothing running behind: tasks aborted, inhibitor closed, status written.
    fn stop(&mut self, error: Option<String>) {
        if let Some(c) = self.connecting.take() {
            c.abort();
        }
        self.reloading = None;
        if let Some(d) = self.drain.take() {
            d.abort();
        }
        for t in self.side_tasks.drain(..) {
            t.abort();
        }
        self.events = None;
        self.bus = None;
        self.drop_lock("daemon stopping");
        // A stored inhibitor that was never used must not outlive this process either.
        if self.adopted.take().is_some() {
            self.notifier.remove_stored_fd(INHIBITOR_FDNAME);
        }
        self.status.inhibitor_held = false;
        self.status.bus_connected = false;
        if error.is_some() {
            self.status.last_error = error;
        }
        self.life.phase = Phase::Stopping;
        self.enter(Phase::Stopping, "daemon stopping");
    }
}

impl Drop for Machine {
    /// A dropped daemon (a test's "kill") must not leave its tasks running.
    fn drop(&mut self) {
        if let Some(c) = self.connecting.take() {
            c.abort();
        }
        if let Some(d) = self.drain.take() {
            d.abort();
        }
        for t in self.side_tasks.drain(..) {
            t.abort();
        }
    }
}

/// `now + d`, or a time that never comes when that is beyond what the clock can hold.
fn instant_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}
