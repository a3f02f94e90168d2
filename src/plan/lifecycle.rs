//! The shutdown lifecycle as one transition function: `(state, event) -> (state, effects)`.
//!
//! [`step`] decides everything the daemon does about a shutdown: arming (taking the delay
//! inhibitor), starting the drain, resuming after a crash, releasing the inhibitor, a
//! cancelled shutdown and stopping. [`route`] decides which way the drain goes: through the
//! cluster, offline through the CRI runtime, or back to the cluster. The state machine
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
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            phase: Phase::Starting,
            terminating: false,
            inhibitor: false,
            bypass: false,
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
    /// The drain task ended (drained, failed or panicked); `reason` says which.
    DrainEnded { reason: String, failed: bool },
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
    /// Persist the shutdown, start the drain task and the budget's deadline.
    StartDrain {
        kind: KindFrom,
        budget: BudgetFrom,
        resume: bool,
    },
    /// End the budget at `shutdown.stop_drain_timeout` from now at the latest.
    CapDeadline,
    /// Release the inhibitor; stop the drain task and the deadline; persist `Released`.
    Release {
        reason: String,
        outcome: ShutdownOutcome,
    },
    /// Stop the drain task and the deadline, persist `Cancelled`, take a new inhibitor when
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
        Event::DrainEnded { reason, failed } => {
            if state.phase != Phase::Draining {
                return ignored(state, "no drain under way");
            }
            let outcome = if failed {
                ShutdownOutcome::Failed
            } else {
                ShutdownOutcome::Drained
            };
            release(state, &mut next, &mut effects, reason, outcome);
        }
        Event::BudgetEnded => {
            if state.phase != Phase::Draining {
                return ignored(state, "no drain under way");
            }
            release(
                state,
                &mut next,
                &mut effects,
                "shutdown budget ended".into(),
                ShutdownOutcome::BudgetEnded,
            );
        }
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
    next.phase = Phase::Draining;
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
    next.phase = Phase::Armed;
    effects.push(enter(Phase::Armed, reason));
}

/// Which way a shutdown's drain goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Through the cluster: the NodeMaintenance.
    Online,
    /// Locally through the CRI runtime; `switch_back`: back to the cluster path once the
    /// apiserver answers again.
    Offline { switch_back: bool },
    /// The drain is over.
    Done,
    /// The apiserver cannot be used and the fallback is disabled: the drain fails (and the
    /// inhibitor is released).
    Fail,
}

/// What happened to the drain's current route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouteEvent {
    /// The drain begins; `engine`: the cluster engine is up.
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
pub(crate) fn route(event: RouteEvent, fallback_enabled: bool) -> Route {
    let offline = |switch_back| {
        if fallback_enabled {
            Route::Offline { switch_back }
        } else {
            Route::Fail
        }
    };
    match event {
        RouteEvent::Begin { engine: true } | RouteEvent::ApiserverBack => Route::Online,
        RouteEvent::Begin { engine: false } | RouteEvent::OnlineUnreachable => offline(true),
        // Going back to a cluster path that fails while answering would fail again at once.
        RouteEvent::OnlineFailed => offline(false),
        RouteEvent::OnlineDrained | RouteEvent::OfflineFinished => Route::Done,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn at(phase: Phase) -> Lifecycle {
        Lifecycle {
            phase,
            inhibitor: matches!(phase, Phase::Armed | Phase::Draining),
            ..Lifecycle::default()
        }
    }

    fn connected(preparing: bool, persisted: Option<Persisted>) -> Event {
        Event::Connected {
            preparing,
            persisted,
        }
    }

    #[test]
    fn first_connection_arms_and_reconciles_after_boot() {
        let t = step(Lifecycle::default(), connected(false, None));
        assert_eq!(
            t.effects,
            vec![
                Effect::TakeInhibitor,
                Effect::AfterBoot,
                enter(Phase::Armed, "inhibitor held")
            ]
        );
        assert_eq!(t.next, at(Phase::Armed));
    }

    #[test]
    fn a_crash_mid_shutdown_resumes_the_persisted_drain() {
        let p = Persisted {
            kind: ShutdownKind::Reboot,
            cancelled: false,
        };
        let t = step(Lifecycle::default(), connected(true, Some(p)));
        assert_eq!(
            t.effects[..2],
            [
                Effect::TakeInhibitor,
                Effect::StartDrain {
                    kind: KindFrom::Persisted,
                    budget: BudgetFrom::Logind,
                    resume: true
                }
            ]
        );
        assert_eq!(t.next.phase, Phase::Draining);
    }

    #[test]
    fn a_persisted_shutdown_not_under_way_any_more_is_cancelled() {
        let p = Persisted {
            kind: ShutdownKind::Poweroff,
            cancelled: false,
        };
        let t = step(Lifecycle::default(), connected(false, Some(p)));
        assert!(t.effects.contains(&Effect::CancelPersisted));
        // A cancelled or bypass shutdown is not resumed: logind's signal starts a new one.
        for p in [
            Persisted {
                cancelled: true,
                ..p
            },
            Persisted {
                kind: ShutdownKind::Bypass,
                ..p
            },
        ] {
            let t = step(Lifecycle::default(), connected(true, Some(p)));
            assert!(t.effects.contains(&Effect::StartDrain {
                kind: KindFrom::AskLogind,
                budget: BudgetFrom::Logind,
                resume: false
            }));
        }
    }

    #[test]
    fn the_signal_starts_the_drain_with_its_kind() {
        let t = step(
            at(Phase::Armed),
            Event::PrepareForShutdown {
                start: true,
                kind: Some(ShutdownKind::Poweroff),
            },
        );
        assert_eq!(
            t.effects[0],
            Effect::StartDrain {
                kind: KindFrom::Given(ShutdownKind::Poweroff),
                budget: BudgetFrom::Logind,
                resume: false
            }
        );
        let again = step(
            t.next,
            Event::PrepareForShutdown {
                start: true,
                kind: None,
            },
        );
        assert!(matches!(again.outcome, Outcome::Ignored(_)));
        assert_eq!(again.next, t.next);
    }

    #[test]
    fn the_drain_ending_or_the_budget_releases() {
        for event in [
            Event::DrainEnded {
                reason: "drain finished".into(),
                failed: false,
            },
            Event::BudgetEnded,
        ] {
            let t = step(at(Phase::Draining), event);
            assert!(matches!(t.effects[0], Effect::Release { .. }));
            assert_eq!(t.next.phase, Phase::Released);
            assert!(!t.next.inhibitor);
            assert!(!t.effects.contains(&Effect::Exit));
        }
        let terminating = Lifecycle {
            terminating: true,
            ..at(Phase::Draining)
        };
        let t = step(terminating, Event::BudgetEnded);
        assert_eq!(t.effects.last(), Some(&Effect::Exit));
    }

    #[test]
    fn a_cancel_after_the_release_takes_a_new_inhibitor() {
        let cancel = Event::PrepareForShutdown {
            start: false,
            kind: None,
        };
        let t = step(at(Phase::Released), cancel.clone());
        let cancelled = |rearm| Effect::CancelShutdown {
            rearm,
            cause: CancelCause::Cancelled,
        };
        assert_eq!(t.effects[0], cancelled(true));
        let t = step(at(Phase::Draining), cancel);
        assert_eq!(t.effects[0], cancelled(false));
        assert_eq!(t.next, at(Phase::Armed));
    }

    #[test]
    fn a_reconnect_during_a_bypass_shutdown_does_not_cancel_it() {
        let bypass = Lifecycle {
            bypass: true,
            ..at(Phase::Draining)
        };
        assert_eq!(
            step(bypass, connected(false, None)).effects,
            vec![Effect::TakeInhibitor]
        );
        let t = step(at(Phase::Draining), connected(false, None));
        assert_eq!(t.next.phase, Phase::Armed);
    }

    #[test]
    fn logind_back_without_the_shutdown_stops_the_drain_as_lost() {
        for phase in [Phase::Draining, Phase::Released] {
            let t = step(at(phase), connected(false, None));
            let lost = t.effects.iter().find_map(|e| match e {
                Effect::CancelShutdown { cause, .. } => Some(*cause),
                _ => None,
            });
            assert_eq!(lost, Some(CancelCause::Lost), "{phase:?}");
            assert!(t.effects.contains(&enter(Phase::Armed, LOST)), "{phase:?}");
            assert_eq!(t.next.phase, Phase::Armed);
            assert!(t.next.inhibitor);
        }
        // A restart that keeps the shutdown pending goes on with the drain.
        let t = step(at(Phase::Draining), connected(true, None));
        assert_eq!(t.effects, vec![Effect::TakeInhibitor]);
        assert_eq!(t.next.phase, Phase::Draining);
    }

    #[test]
    fn sigterm_drains_only_when_the_system_is_going_down() {
        let t = step(at(Phase::Armed), Event::Terminate);
        assert_eq!(
            t.effects,
            vec![Effect::NotifyStopping, Effect::AskSystemStopping]
        );
        let down = step(t.next, Event::SystemStopping(Some(true)));
        assert_eq!(
            down.effects[0],
            Effect::StartDrain {
                kind: KindFrom::Given(ShutdownKind::Bypass),
                budget: BudgetFrom::StopTimeout,
                resume: false
            }
        );
        assert!(down.next.bypass);
        for answer in [Some(false), None] {
            let t = step(t.next, Event::SystemStopping(answer));
            assert_eq!(t.effects, vec![Effect::Exit]);
        }
        let draining = step(at(Phase::Draining), Event::Terminate);
        assert_eq!(
            draining.effects,
            vec![Effect::NotifyStopping, Effect::CapDeadline]
        );
        let twice = step(draining.next, Event::Terminate);
        assert_eq!(twice.effects, vec![Effect::CapDeadline]);
    }

    #[test]
    fn the_route_falls_back_and_comes_back() {
        assert_eq!(
            route(RouteEvent::Begin { engine: true }, true),
            Route::Online
        );
        assert_eq!(
            route(RouteEvent::Begin { engine: false }, true),
            Route::Offline { switch_back: true }
        );
        assert_eq!(
            route(RouteEvent::OnlineUnreachable, true),
            Route::Offline { switch_back: true }
        );
        assert_eq!(
            route(RouteEvent::OnlineFailed, true),
            Route::Offline { switch_back: false }
        );
        assert_eq!(route(RouteEvent::ApiserverBack, true), Route::Online);
        assert_eq!(route(RouteEvent::OfflineFinished, true), Route::Done);
        assert_eq!(route(RouteEvent::OnlineDrained, false), Route::Done);
        for e in [
            RouteEvent::Begin { engine: false },
            RouteEvent::OnlineUnreachable,
            RouteEvent::OnlineFailed,
        ] {
            assert_eq!(route(e, false), Route::Fail);
        }
    }

    fn arb_kind() -> impl Strategy<Value = ShutdownKind> {
        prop_oneof![
            Just(ShutdownKind::Poweroff),
            Just(ShutdownKind::Reboot),
            Just(ShutdownKind::Bypass),
            Just(ShutdownKind::Unknown),
        ]
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (
                any::<bool>(),
                proptest::option::of((arb_kind(), any::<bool>()))
            )
                .prop_map(|(preparing, p)| Event::Connected {
                    preparing,
                    persisted: p.map(|(kind, cancelled)| Persisted { kind, cancelled }),
                }),
            (any::<bool>(), proptest::option::of(arb_kind()))
                .prop_map(|(start, kind)| Event::PrepareForShutdown { start, kind }),
            Just(Event::DrainEnded {
                reason: "drain finished".into(),
                failed: false,
            }),
            Just(Event::DrainEnded {
                reason: "drain failed".into(),
                failed: true,
            }),
            Just(Event::BudgetEnded),
            Just(Event::Terminate),
            proptest::option::of(any::<bool>()).prop_map(Event::SystemStopping),
        ]
    }

    proptest! {
        #[test]
        fn the_lifecycle_keeps_its_promises(events in proptest::collection::vec(arb_event(), 1..40)) {
            let mut state = Lifecycle::default();
            // Releases since the drain under way started; None: no drain started yet.
            let mut releases: Option<u32> = None;
            for event in events {
                let t = step(state, event.clone());
                if let Outcome::Ignored(_) = t.outcome {
                    prop_assert_eq!(t.next, state);
                    prop_assert!(t.effects.is_empty());
                    continue;
                }
                for e in &t.effects {
                    match e {
                        Effect::StartDrain { .. } => {
                            prop_assert!(state.phase != Phase::Draining, "two drains at once");
                            releases = Some(0);
                        }
                        Effect::Release { .. } => {
                            // Never while the drain runs, unless its budget is out.
                            prop_assert!(
                                matches!(event, Event::DrainEnded { .. } | Event::BudgetEnded),
                                "released on {:?}", event
                            );
                            prop_assert!(state.inhibitor);
                            let n = releases.get_or_insert(0);
                            *n += 1;
                            prop_assert_eq!(*n, 1, "released twice in one shutdown");
                        }
                        Effect::CancelShutdown { rearm, .. } => {
                            prop_assert_eq!(*rearm, !state.inhibitor);
                        }
                        Effect::Exit => prop_assert!(t.next.terminating),
                        _ => {}
                    }
                }
                if t.effects.iter().any(|e| matches!(e, Effect::CancelShutdown { .. })) {
                    prop_assert!(t.next.inhibitor, "a cancel must end re-armed");
                    prop_assert_eq!(t.next.phase, Phase::Armed);
                }
                if t.next.phase == Phase::Released {
                    prop_assert_eq!(releases, Some(1));
                    prop_assert!(!t.next.inhibitor);
                }
                if t.next.phase == Phase::Armed {
                    prop_assert!(t.next.inhibitor);
                }
                // The phase a transition announces is the phase it reaches.
                if let Some(Effect::Enter { phase, .. }) =
                    t.effects.iter().rev().find(|e| matches!(e, Effect::Enter { .. }))
                {
                    prop_assert_eq!(*phase, t.next.phase);
                }
                state = t.next;
            }
        }
    }
}
