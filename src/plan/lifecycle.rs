//! The shutdown lifecycle as one transition function: `(state, event) -> (state, effects)`.
//!
//! [`step`] decides everything the daemon does about a shutdown: arming (taking the delay
//! inhibitor), starting the drain, the way it goes (through the cluster, offline through the
//! CRI runtime, back to the cluster: [`Way`], decided by [`route`]), resuming after a crash,
//! releasing the inhibitor, a cancelled shutdown and stopping. The state machine
//! (`daemon::machine`) and the drainer (`daemon::node`) only carry the effects out and feed
//! the events back. An event that means nothing in a state is [`Outcome::Ignored`], with the
//! reason, and changes nothing.

use serde::{Deserialize, Serialize};

use crate::shutdown::{CancelCause, ShutdownKind};

/// Where the daemon is in the lifecycle; written to the status file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Connecting to the bus, establishing the budget, taking the first inhibitor.
    Starting,
    /// Inhibitor held, no shutdown in progress.
    Armed,
    Draining,
    /// The inhibitor was released for this shutdown.
    Released,
    Stopping,
}

impl Phase {
    pub fn describe(self) -> &'static str {
        match self {
            Phase::Starting => "starting: waiting for logind",
            Phase::Armed => "armed: holding the shutdown delay inhibitor",
            Phase::Draining => "draining the node for shutdown",
            Phase::Released => "released: shutdown may proceed",
            Phase::Stopping => "stopping",
        }
    }
}

/// The lifecycle's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lifecycle {
    pub phase: Phase,
    /// SIGTERM came: exit once the shutdown under way is released.
    pub terminating: bool,
    /// The delay inhibitor is held.
    pub inhibitor: bool,
    /// The shutdown under way bypassed logind, so logind's `PreparingForShutdown` does not
    /// tell whether it is still on.
    pub bypass: bool,
    /// The way the drain goes: set while the phase is [`Phase::Draining`].
    pub way: Option<Way>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            phase: Phase::Starting,
            terminating: false,
            inhibitor: false,
            bypass: false,
            way: None,
        }
    }
}

/// The way a shutdown's drain goes, one leg at a time; [`route`] decides the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Way {
    /// Waiting for the apiserver's connection, `fallback.apiserver_timeout` at most since
    /// the daemon began connecting.
    Connecting,
    /// Through the cluster: the NodeMaintenance.
    Online,
    /// Locally through the CRI runtime; `switch_back`: back to the cluster once the
    /// apiserver answers again.
    Offline { switch_back: bool },
}

impl Way {
    pub fn describe(self) -> &'static str {
        match self {
            Way::Connecting => "waiting for the apiserver",
            Way::Online => "through the cluster",
            Way::Offline { switch_back: true } => {
                "offline through the CRI runtime, until the apiserver answers"
            }
            Way::Offline { switch_back: false } => "offline through the CRI runtime",
        }
    }
}

impl Lifecycle {
    /// Whether [`Event::Connected`] needs the shutdown persisted by an earlier process: only
    /// the first connection of a process can resume one.
    pub(crate) fn wants_persisted(&self) -> bool {
        self.phase == Phase::Starting
    }
}

/// The shutdown an earlier process of this boot persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Persisted {
    pub kind: ShutdownKind,
    pub cancelled: bool,
}

/// How a shutdown ended: a fixed set, persisted with it and exported as a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShutdownOutcome {
    /// The drain finished and the inhibitor was released.
    Drained,
    /// The drain ended with an error and the inhibitor was released.
    Failed,
    /// The budget ran out before the drain finished.
    BudgetEnded,
    /// logind cancelled the shutdown.
    Cancelled,
    /// logind restarted and lost the shutdown: nobody cancelled it, the drain stopped.
    Lost,
    /// The node went down while the drain still ran (found at the next boot).
    Interrupted,
}

impl ShutdownOutcome {
    pub const ALL: [ShutdownOutcome; 6] = [
        ShutdownOutcome::Drained,
        ShutdownOutcome::Failed,
        ShutdownOutcome::BudgetEnded,
        ShutdownOutcome::Cancelled,
        ShutdownOutcome::Lost,
        ShutdownOutcome::Interrupted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ShutdownOutcome::Drained => "drained",
            ShutdownOutcome::Failed => "failed",
            ShutdownOutcome::BudgetEnded => "budget_ended",
            ShutdownOutcome::Cancelled => "cancelled",
            ShutdownOutcome::Lost => "lost",
            ShutdownOutcome::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// Connected to the bus (first time or again); `preparing`: logind's
    /// `PreparingForShutdown` now; `persisted`: see [`Lifecycle::wants_persisted`].
    Connected {
        preparing: bool,
        persisted: Option<Persisted>,
    },
    /// logind's `PrepareForShutdown`; `kind` when the signal said it.
    PrepareForShutdown {
        start: bool,
        kind: Option<ShutdownKind>,
    },
    /// A leg of the drain ended as `ended` says; `fallback_enabled`: `fallback.enabled`.
    Route {
        ended: RouteEvent,
        fallback_enabled: bool,
    },
    /// A leg of the drain failed or panicked; `reason` says which.
    DrainFailed { reason: String },
    /// The shutdown's budget is used up.
    BudgetEnded,
    /// SIGTERM (or the control channel closed).
    Terminate,
    /// The answer to [`Effect::AskSystemStopping`]; None: it could not be told.
    SystemStopping(Option<bool>),
}

/// Where a drain's shutdown kind comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KindFrom {
    Given(ShutdownKind),
    /// Ask logind (and systemd) which shutdown is under way.
    AskLogind,
    /// The persisted shutdown being resumed.
    Persisted,
}

/// Where a drain's budget comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BudgetFrom {
    /// The budget established with logind.
    Logind,
    /// `shutdown.stop_drain_timeout`: systemd is stopping nodegrace.
    StopTimeout,
}

/// What the daemon does, in order. A failing effect (only taking the inhibitor can fail)
/// skips the ones after it, except [`Effect::Exit`], and the state stays as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Take a delay inhibitor (replacing one held).
    TakeInhibitor,
    /// Persist the shutdown and start the budget's deadline.
    StartDrain {
        kind: KindFrom,
        budget: BudgetFrom,
        resume: bool,
    },
    /// Start the drain's leg `way` (stopping none: the one before it ended); `resumed`: the
    /// cluster drained this shutdown before it (its maintenance and schedule stand).
    Drain { way: Way, resumed: bool },
    /// End the budget at `shutdown.stop_drain_timeout` from now at the latest.
    CapDeadline,
    /// Release the inhibitor; stop the drain's leg and the deadline; persist `Released`.
    Release {
        reason: String,
        outcome: ShutdownOutcome,
    },
    /// Stop the drain's leg and the deadline, persist `Cancelled`, take a new inhibitor when
    /// `rearm`, and ask the drainer to stop the drain where it is and undo the shutdown.
    CancelShutdown { rearm: bool, cause: CancelCause },
    /// The persisted shutdown was cancelled while no process ran: record it and undo it.
    CancelPersisted,
    /// No shutdown: reconcile after a boot.
    AfterBoot,
    /// Tell systemd the daemon is stopping.
    NotifyStopping,
    /// Ask systemd whether the system is going down; the answer comes back as
    /// [`Event::SystemStopping`].
    AskSystemStopping,
    /// The phase changes (status file, systemd status line).
    Enter { phase: Phase, reason: String },
    /// End the daemon.
    Exit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Applied,
    /// The event means nothing in this state: nothing changes.
    Ignored(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    pub next: Lifecycle,
    pub effects: Vec<Effect>,
    pub outcome: Outcome,
}

fn ignored(state: Lifecycle, why: &'static str) -> Transition {
    Transition {
        next: state,
        effects: Vec::new(),
        outcome: Outcome::Ignored(why),
    }
}

fn enter(phase: Phase, reason: impl Into<String>) -> Effect {
    Effect::Enter {
        phase,
        reason: reason.into(),
    }
}

/// The lifecycle's one transition function.
pub(crate) fn step(state: Lifecycle, event: Event) -> Transition {
    let mut next = state;
    let mut effects = Vec::new();
    let ends_a_leg = matches!(
        event,
        Event::Route { .. } | Event::DrainFailed { .. } | Event::BudgetEnded
    );
    if ends_a_leg && state.phase != Phase::Draining {
        return ignored(state, "no drain under way");
    }
    match event {
        Event::Connected {
            preparing,
            persisted,
        } => {
            if state.phase == Phase::Stopping {
                return ignored(state, "the daemon stops");
            }
            connected(state, preparing, persisted, &mut next, &mut effects)
        }
        Event::PrepareForShutdown { start: true, kind } => {
            // Before the first connection, the connection reads `PreparingForShutdown`.
            if state.phase != Phase::Armed {
                return ignored(
                    state,
                    "a shutdown is already under way or the daemon is not armed",
                );
            }
            let kind = kind.map_or(KindFrom::AskLogind, KindFrom::Given);
            start_drain(&mut next, &mut effects, kind, BudgetFrom::Logind, false);
            effects.push(enter(Phase::Draining, "PrepareForShutdown(true)"));
        }
        Event::PrepareForShutdown { start: false, .. } => {
            if !matches!(state.phase, Phase::Draining | Phase::Released) {
                return ignored(state, "no shutdown to cancel");
            }
            cancel(
                state,
                &mut next,
                &mut effects,
                CancelCause::Cancelled,
                "PrepareForShutdown(false)",
            );
            if state.terminating {
                effects.push(Effect::Exit);
            }
        }
        Event::Route {
            ended,
            fallback_enabled,
        } => leg_ended(state, ended, fallback_enabled, &mut next, &mut effects),
        Event::DrainFailed { reason } => release(
            state,
            &mut next,
            &mut effects,
            reason,
            ShutdownOutcome::Failed,
        ),
        Event::BudgetEnded => release(
            state,
            &mut next,
            &mut effects,
            "shutdown budget ended".into(),
            ShutdownOutcome::BudgetEnded,
        ),
        Event::Terminate => {
            if !state.terminating {
                effects.push(Effect::NotifyStopping);
            }
            next.terminating = true;
            match state.phase {
                Phase::Draining => effects.push(Effect::CapDeadline),
                Phase::Armed => effects.push(Effect::AskSystemStopping),
                // Not connected yet: systemd cannot be asked.
                Phase::Starting | Phase::Released | Phase::Stopping => effects.push(Effect::Exit),
            }
        }
        Event::SystemStopping(answer) => {
            if !state.terminating || state.phase != Phase::Armed {
                return ignored(state, "nothing asked whether the system stops");
            }
            if answer == Some(true) {
                let kind = KindFrom::Given(ShutdownKind::Bypass);
                start_drain(
                    &mut next,
                    &mut effects,
                    kind,
                    BudgetFrom::StopTimeout,
                    false,
                );
                effects.push(enter(
                    Phase::Draining,
                    "systemd is stopping nodegrace during a shutdown that bypassed logind",
                ));
            } else {
                effects.push(Effect::Exit);
            }
        }
    }
    Transition {
        next,
        effects,
        outcome: Outcome::Applied,
    }
}

/// A leg of the drain ended: the next leg, or the release.
fn leg_ended(
    state: Lifecycle,
    ended: RouteEvent,
    fallback_enabled: bool,
    next: &mut Lifecycle,
    effects: &mut Vec<Effect>,
) {
    let (reason, outcome) = match route(ended, fallback_enabled) {
        Route::Go(way) => {
            next.way = Some(way);
            let resumed = ended == RouteEvent::ApiserverBack;
            effects.push(Effect::Drain { way, resumed });
            return;
        }
        Route::Done => ("drain finished", ShutdownOutcome::Drained),
        Route::Fail => (
            "drain failed: the apiserver cannot be reached and the offline fallback is disabled",
            ShutdownOutcome::Failed,
        ),
    };
    release(state, next, effects, reason.into(), outcome);
}

/// On every connection the inhibitor and the shutdown are brought in line with what logind
/// says now, which also catches a shutdown that began or was cancelled while disconnected.
fn connected(
    state: Lifecycle,
    preparing: bool,
    persisted: Option<Persisted>,
    next: &mut Lifecycle,
    effects: &mut Vec<Effect>,
) {
    match state.phase {
        Phase::Starting => {
            take_inhibitor(next, effects);
            // A bypass shutdown never comes back to a running daemon: only logind's count.
            let resume = persisted.filter(|p| !p.cancelled && p.kind != ShutdownKind::Bypass);
            if preparing {
                let kind = match resume {
                    Some(_) => KindFrom::Persisted,
                    None => KindFrom::AskLogind,
                };
                start_drain(next, effects, kind, BudgetFrom::Logind, resume.is_some());
                effects.push(enter(
                    Phase::Draining,
                    "logind was already preparing for shutdown at start",
                ));
            } else {
                effects.push(match resume {
                    Some(_) => Effect::CancelPersisted,
                    None => Effect::AfterBoot,
                });
                next.phase = Phase::Armed;
                effects.push(enter(Phase::Armed, "inhibitor held"));
            }
        }
        Phase::Armed => {
            take_inhibitor(next, effects);
            if preparing {
                start_drain(
                    next,
                    effects,
                    KindFrom::AskLogind,
                    BudgetFrom::Logind,
                    false,
                );
                effects.push(enter(Phase::Draining, "shutdown began while disconnected"));
            }
        }
        Phase::Draining => {
            take_inhibitor(next, effects);
            if !preparing && !state.bypass {
                cancel(*next, next, effects, CancelCause::Lost, LOST);
            }
        }
        Phase::Released => {
            if !preparing {
                cancel(state, next, effects, CancelCause::Lost, LOST);
            }
        }
        Phase::Stopping => {}
    }
}

fn take_inhibitor(next: &mut Lifecycle, effects: &mut Vec<Effect>) {
    effects.push(Effect::TakeInhibitor);
    next.inhibitor = true;
}

fn start_drain(
    next: &mut Lifecycle,
    effects: &mut Vec<Effect>,
    kind: KindFrom,
    budget: BudgetFrom,
    resume: bool,
) {
    effects.push(Effect::StartDrain {
        kind,
        budget,
        resume,
    });
    effects.push(Effect::Drain {
        way: Way::Connecting,
        resumed: false,
    });
    next.phase = Phase::Draining;
    next.way = Some(Way::Connecting);
    next.bypass = kind == KindFrom::Given(ShutdownKind::Bypass);
}

/// The one place the inhibitor is released for a shutdown: its drain ended or its budget did.
fn release(
    state: Lifecycle,
    next: &mut Lifecycle,
    effects: &mut Vec<Effect>,
    reason: String,
    outcome: ShutdownOutcome,
) {
    effects.push(Effect::Release {
        reason: reason.clone(),
        outcome,
    });
    next.inhibitor = false;
    next.phase = Phase::Released;
    next.way = None;
    effects.push(enter(Phase::Released, reason));
    if state.terminating {
        effects.push(Effect::Exit);
    }
}

/// The phase's reason when logind came back without the shutdown under way.
pub(crate) const LOST: &str =
    "logind restarted and lost the shutdown: the drain stopped; ask for the shutdown again";

/// A cancelled shutdown always ends armed: with the inhibitor held again.
fn cancel(
    state: Lifecycle,
    next: &mut Lifecycle,
    effects: &mut Vec<Effect>,
    cause: CancelCause,
    reason: &str,
) {
    effects.push(Effect::CancelShutdown {
        rearm: !state.inhibitor,
        cause,
    });
    next.inhibitor = true;
    next.bypass = false;
    next.way = None;
    next.phase = Phase::Armed;
    effects.push(enter(Phase::Armed, reason));
}

/// Which way a shutdown's drain goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Go(Way),
    /// The drain is over.
    Done,
    /// The apiserver cannot be used and the fallback is disabled: the drain fails (and the
    /// inhibitor is released).
    Fail,
}

/// How a leg of the drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteEvent {
    /// [`Way::Connecting`] ended; `engine`: the cluster engine is up.
    Begin { engine: bool },
    /// The cluster path drained the node.
    OnlineDrained,
    /// The apiserver has been unusable for `fallback.apiserver_timeout`.
    OnlineUnreachable,
    /// The cluster path failed while the apiserver answered (no CRDs, a rejected request).
    OnlineFailed,
    /// The offline drain stopped every pod it could.
    OfflineFinished,
    /// The apiserver answers again during the offline drain.
    ApiserverBack,
}

/// The one place the node falls back offline, and back.
pub fn route(event: RouteEvent, fallback_enabled: bool) -> Route {
    let offline = |switch_back| {
        if fallback_enabled {
            Route::Go(Way::Offline { switch_back })
        } else {
            Route::Fail
        }
    };
    match event {
        RouteEvent::Begin { engine: true } | RouteEvent::ApiserverBack => Route::Go(Way::Online),
        RouteEvent::Begin { engine: false } | RouteEvent::OnlineUnreachable => offline(true),
        // Going back to a cluster path that fails while answering would fail again at once.
        RouteEvent::OnlineFailed => offline(false),
        RouteEvent::OnlineDrained | RouteEvent::OfflineFinished => Route::Done,
    }
}

#[cfg(test)]
mod tests;
