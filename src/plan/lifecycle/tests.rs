use proptest::prelude::*;

use super::*;

fn at(phase: Phase) -> Lifecycle {
    Lifecycle {
        phase,
        inhibitor: matches!(phase, Phase::Armed | Phase::Draining),
        way: (phase == Phase::Draining).then_some(Way::Online),
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
        Event::Route {
            ended: RouteEvent::OnlineDrained,
            fallback_enabled: true,
        },
        Event::Route {
            ended: RouteEvent::OnlineFailed,
            fallback_enabled: false,
        },
        Event::DrainFailed {
            reason: "drain failed".into(),
        },
        Event::BudgetEnded,
    ] {
        let t = step(at(Phase::Draining), event);
        assert!(matches!(t.effects[0], Effect::Release { .. }));
        assert_eq!(t.next.phase, Phase::Released);
        assert_eq!(t.next.way, None);
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
fn the_way_goes_offline_and_back_as_a_state_of_the_drain() {
    let signal = Event::PrepareForShutdown {
        start: true,
        kind: Some(ShutdownKind::Reboot),
    };
    let t = step(at(Phase::Armed), signal);
    assert_eq!(t.next.way, Some(Way::Connecting));
    let leg = |way, resumed| vec![Effect::Drain { way, resumed }];
    assert_eq!(t.effects[1..2], leg(Way::Connecting, false)[..]);
    let ended = |ended| Event::Route {
        ended,
        fallback_enabled: true,
    };
    let offline = Way::Offline { switch_back: true };
    let t = step(t.next, ended(RouteEvent::Begin { engine: false }));
    assert_eq!(
        (t.next.way, t.effects),
        (Some(offline), leg(offline, false))
    );
    // Back through the cluster: its maintenance and schedule stand.
    let t = step(t.next, ended(RouteEvent::ApiserverBack));
    assert_eq!(
        (t.next.way, t.effects),
        (Some(Way::Online), leg(Way::Online, true))
    );
    let t = step(t.next, ended(RouteEvent::OnlineDrained));
    assert_eq!((t.next.phase, t.next.way), (Phase::Released, None));
    // A leg that ends after the cancel changes nothing.
    let cancelled = step(
        at(Phase::Draining),
        Event::PrepareForShutdown {
            start: false,
            kind: None,
        },
    );
    let late = step(cancelled.next, ended(RouteEvent::OnlineDrained));
    assert!(matches!(late.outcome, Outcome::Ignored(_)));
}

#[test]
fn the_route_falls_back_and_comes_back() {
    let online = Route::Go(Way::Online);
    let offline = |switch_back| Route::Go(Way::Offline { switch_back });
    assert_eq!(route(RouteEvent::Begin { engine: true }, true), online);
    assert_eq!(
        route(RouteEvent::Begin { engine: false }, true),
        offline(true)
    );
    assert_eq!(route(RouteEvent::OnlineUnreachable, true), offline(true));
    assert_eq!(route(RouteEvent::OnlineFailed, true), offline(false));
    assert_eq!(route(RouteEvent::ApiserverBack, true), online);
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

fn arb_route_event() -> impl Strategy<Value = RouteEvent> {
    prop_oneof![
        any::<bool>().prop_map(|engine| RouteEvent::Begin { engine }),
        Just(RouteEvent::OnlineDrained),
        Just(RouteEvent::OnlineUnreachable),
        Just(RouteEvent::OnlineFailed),
        Just(RouteEvent::OfflineFinished),
        Just(RouteEvent::ApiserverBack),
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
        (arb_route_event(), any::<bool>()).prop_map(|(ended, fallback_enabled)| Event::Route {
            ended,
            fallback_enabled
        }),
        Just(Event::DrainFailed {
            reason: "drain failed".into(),
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
                            matches!(event, Event::Route { .. } | Event::DrainFailed { .. } | Event::BudgetEnded),
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
                    // One leg at a time, the one the state says.
                    Effect::Drain { way, .. } => prop_assert_eq!(t.next.way, Some(*way)),
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
            prop_assert_eq!(t.next.way.is_some(), t.next.phase == Phase::Draining);
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
