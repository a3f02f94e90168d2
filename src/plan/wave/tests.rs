use std::collections::BTreeMap;
use std::time::Duration;

use jiff::civil::{time, Weekday};
use jiff::tz::TimeZone;
use jiff::Timestamp;
use proptest::prelude::*;

use super::*;

fn rules(limit: Limit, per_domain: Option<u32>) -> Rules {
    Rules {
        limit,
        per_domain,
        healthy_for: Duration::from_secs(300),
        reboot_budget: Duration::from_secs(900),
    }
}

fn held(node: &str, domain: &str) -> Held {
    Held {
        node: node.to_owned(),
        domain: domain.to_owned(),
    }
}

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

/// Central European time with its summer time, without the system's zone database.
fn berlin() -> TimeZone {
    TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap()
}

#[test]
fn a_limit_is_a_count_or_a_percentage_of_the_members_never_below_one() {
    assert_eq!(Limit::parse("2"), Ok(Limit::Count(2)));
    assert_eq!(Limit::parse("25%"), Ok(Limit::Percent(25)));
    assert_eq!(Limit::parse("100%"), Ok(Limit::Percent(100)));
    for bad in ["0", "0%", "101%", "-1", "two", "", "%", "1.5"] {
        let err = Limit::parse(bad).unwrap_err();
        assert!(err.contains("maxUnavailable"), "{bad}: {err}");
    }
    assert_eq!(Limit::Percent(25).slots(10), 2);
    assert_eq!(Limit::Percent(25).slots(3), 1);
    assert_eq!(Limit::Percent(100).slots(6), 6);
    assert_eq!(Limit::Count(3).slots(1), 3);
}

#[test]
fn a_node_waits_for_a_full_wave_then_for_a_full_domain() {
    let r = rules(Limit::Count(2), Some(1));
    let open = Opening::Open;
    let one = [held("a", "z1")];
    assert_eq!(turn(&r, "b", "z2", &one, 6, open, None), Turn::Take);
    assert_eq!(
        turn(&r, "c", "z1", &one, 6, open, None),
        Turn::Wait(Why::DomainFull {
            domain: "z1".into(),
            held: 1,
            slots: 1
        })
    );
    let two = [held("a", "z1"), held("b", "z2")];
    assert_eq!(
        turn(&r, "e", "z3", &two, 6, open, None),
        Turn::Wait(Why::WaveFull { held: 2, slots: 2 })
    );
    assert_eq!(turn(&r, "a", "z1", &two, 6, open, None), Turn::Holding);
}

#[test]
fn a_stuck_wave_and_a_closed_window_stop_every_new_turn() {
    let r = rules(Limit::Count(3), None);
    assert_eq!(
        turn(&r, "b", "z", &[held("a", "z")], 6, Opening::Open, Some("a")),
        Turn::Wait(Why::Stuck { node: "a".into() })
    );
    let opens = Some(at("2026-12-01T21:00:00Z"));
    assert_eq!(
        turn(&r, "b", "z", &[], 6, Opening::Closed { opens }, None),
        Turn::Wait(Why::WindowClosed { opens })
    );
    assert_eq!(
        Why::WindowClosed { opens }.to_string(),
        "window closed, opens at 2026-12-01T21:00:00Z"
    );
}

#[test]
fn a_window_is_read_in_its_own_time_zone_and_may_run_past_midnight() {
    let night = Window {
        days: vec![Weekday::Tuesday],
        start: time(22, 0, 0, 0),
        end: time(4, 0, 0, 0),
        zone: berlin(),
    };
    let windows = [night];
    // Tuesday 2026-12-01 22:30 in Berlin (CET, +01:00) is 21:30 UTC.
    assert_eq!(opening(&windows, at("2026-12-01T21:30:00Z")), Opening::Open);
    // Wednesday 03:59 Berlin: still Tuesday's window.
    assert_eq!(opening(&windows, at("2026-12-02T02:59:00Z")), Opening::Open);
    // Wednesday 04:00 Berlin: closed until next Tuesday 22:00.
    assert_eq!(
        opening(&windows, at("2026-12-02T03:00:00Z")),
        Opening::Closed {
            opens: Some(at("2026-12-08T21:00:00Z"))
        }
    );
    // Tuesday 21:59 Berlin: closed, opens in a minute.
    assert_eq!(
        opening(&windows, at("2026-12-01T20:59:00Z")),
        Opening::Closed {
            opens: Some(at("2026-12-01T21:00:00Z"))
        }
    );
}

#[test]
fn a_window_follows_summer_time() {
    let mornings = [Window {
        days: vec![],
        start: time(2, 0, 0, 0),
        end: time(5, 0, 0, 0),
        zone: berlin(),
    }];
    // In July Berlin is +02:00: 02:30 there is 00:30 UTC.
    assert_eq!(
        opening(&mornings, at("2026-07-01T00:30:00Z")),
        Opening::Open
    );
    assert!(matches!(
        opening(&mornings, at("2026-07-01T03:30:00Z")),
        Opening::Closed { .. }
    ));
    // In January +01:00: 03:30 UTC is 04:30 there.
    assert_eq!(
        opening(&mornings, at("2026-01-07T03:30:00Z")),
        Opening::Open
    );
}

#[test]
fn no_windows_is_always_open_and_a_window_of_no_day_never_opens() {
    assert_eq!(opening(&[], at("2026-12-01T12:00:00Z")), Opening::Open);
    let never = [Window {
        days: vec![Weekday::Monday],
        start: time(1, 0, 0, 0),
        end: time(1, 0, 0, 0),
        zone: TimeZone::UTC,
    }];
    // start == end: the whole day from 01:00, Monday 01:00 to Tuesday 01:00.
    assert_eq!(opening(&never, at("2026-11-30T23:00:00Z")), Opening::Open);
    assert_eq!(opening(&never, at("2026-12-01T00:59:00Z")), Opening::Open);
    assert!(matches!(
        opening(&never, at("2026-12-01T01:00:00Z")),
        Opening::Closed { opens: Some(_) }
    ));
}

fn mine(phase: Phase, boot: &str, healthy_since: Option<&str>) -> Mine {
    Mine {
        phase,
        boot_id: boot.to_owned(),
        taken: at("2026-12-01T21:00:00Z"),
        healthy_since: healthy_since.map(at),
    }
}

static NONE_WAITING: BTreeMap<String, usize> = BTreeMap::new();

fn member(domain: &str, waiting: bool) -> Option<Member<'_>> {
    Some(Member { domain, waiting })
}

fn seen<'a>(r: &'a Rules, held: &'a [Held], mine: Option<&'a Mine>, now: &str) -> Seen<'a> {
    Seen {
        me: "one",
        boot_id: "boot-2",
        needs_reboot: true,
        rules: r,
        domain: "z1",
        member: Some(Member {
            domain: "z1",
            waiting: true,
        }),
        members: 6,
        waiting: &NONE_WAITING,
        given_way_for: Duration::ZERO,
        held,
        mine,
        opening: Opening::Open,
        stuck: None,
        take_back: None,
        healthy: None,
        renew_due: false,
        now: at(now),
    }
}

#[test]
fn a_node_joins_then_takes_its_turn_and_reboots_in_the_boot_it_took_the_slot() {
    let r = rules(Limit::Count(2), Some(1));
    let mut s = seen(&r, &[], None, "2026-12-01T21:00:00Z");
    s.member = None;
    assert_eq!(next(&s), Step::Join);
    // A node that moved to another zone joins again in it, and one that rebooted before
    // says it waits again.
    s.member = member("z2", true);
    assert_eq!(next(&s), Step::Join);
    s.member = member("z1", false);
    assert_eq!(next(&s), Step::Join);
    s.member = member("z1", true);
    assert_eq!(next(&s), Step::Take);
    // The sentinel went before its turn: it stops waiting, so no domain gives way to it.
    s.needs_reboot = false;
    assert_eq!(next(&s), Step::StopWaiting);
    s.member = member("z1", false);
    assert_eq!(next(&s), Step::Idle);
    let taken = mine(Phase::Down, "boot-2", None);
    let held = [held("one", "z1")];
    let s = seen(&r, &held, Some(&taken), "2026-12-01T21:00:05Z");
    assert_eq!(next(&s), Step::Reboot);
    let before = mine(Phase::Down, "boot-1", None);
    let s = seen(&r, &held, Some(&before), "2026-12-01T21:03:00Z");
    assert_eq!(next(&s), Step::Returning);
}

#[test]
fn a_free_slot_goes_first_to_the_domain_with_room_where_most_nodes_wait() {
    let r = rules(Limit::Count(2), Some(1));
    let waiting: BTreeMap<String, usize> = [("z0", 2), ("z1", 2), ("z2", 1)]
        .map(|(d, n)| (d.to_owned(), n))
        .into();
    let zero = Duration::ZERO;
    assert_eq!(
        give_way(&r, "z2", &[], &waiting, zero),
        Some(Why::GiveWay {
            domain: "z0".into(),
            there: 2,
            here: 1
        })
    );
    assert_eq!(
        give_way(&r, "z2", &[held("a", "z0")], &waiting, zero),
        Some(Why::GiveWay {
            domain: "z1".into(),
            there: 2,
            here: 1
        })
    );
    // Those with more waiting are full, or wait no more than here: its turn.
    let full = [held("a", "z0"), held("b", "z1")];
    assert_eq!(give_way(&r, "z2", &full, &waiting, zero), None);
    assert_eq!(give_way(&r, "z1", &[], &waiting, zero), None);
    // The nodes given way to do not take the slot: after a while it is this node's.
    let long = GIVE_WAY_AT_MOST;
    assert_eq!(give_way(&r, "z2", &[], &waiting, long), None);
    // Without a limit per domain, the order of the domains cannot lengthen the wave.
    assert_eq!(
        give_way(&rules(Limit::Count(2), None), "z2", &[], &waiting, zero),
        None
    );
    let mut s = seen(&r, &[], None, "2026-12-01T21:00:00Z");
    let waiting: BTreeMap<String, usize> = [("z0", 2), ("z1", 1)]
        .map(|(d, n)| (d.to_owned(), n))
        .into();
    s.waiting = &waiting;
    let why = Why::GiveWay {
        domain: "z0".into(),
        there: 2,
        here: 1,
    };
    assert_eq!(
        why.to_string(),
        "domain \"z0\" goes first: 2 nodes wait there, 1 in this node's domain"
    );
    assert_eq!(next(&s), Step::Wait(why));
    s.given_way_for = GIVE_WAY_AT_MOST;
    assert_eq!(next(&s), Step::Take);
}

#[test]
fn a_waiting_node_takes_back_a_slot_before_its_turn() {
    let r = rules(Limit::Count(1), None);
    let held = [held("gone", "z2")];
    let mut s = seen(&r, &held, None, "2026-12-01T21:00:00Z");
    assert_eq!(next(&s), Step::Wait(Why::WaveFull { held: 1, slots: 1 }));
    s.take_back = Some("gone");
    assert_eq!(next(&s), Step::TakeBack("gone".into()));
}

#[test]
fn a_slot_is_freed_after_the_healthy_time_without_a_break() {
    let r = rules(Limit::Count(1), None);
    let held = [held("one", "z1")];
    let back = mine(Phase::Returning, "boot-1", None);
    let mut s = seen(&r, &held, Some(&back), "2026-12-01T21:06:00Z");
    assert_eq!(next(&s), Step::Idle);
    s.renew_due = true;
    assert_eq!(next(&s), Step::Renew);
    s.healthy = Some(at("2026-12-01T21:05:30Z"));
    assert_eq!(next(&s), Step::Healthy(at("2026-12-01T21:05:30Z")));
    let healthy = mine(Phase::Returning, "boot-1", Some("2026-12-01T21:05:30Z"));
    let mut s = seen(&r, &held, Some(&healthy), "2026-12-01T21:10:29Z");
    s.healthy = Some(at("2026-12-01T21:05:30Z"));
    assert_eq!(next(&s), Step::Idle);
    s.now = at("2026-12-01T21:10:30Z");
    assert_eq!(next(&s), Step::Free);
    // Not healthy any more: the count starts again.
    s.healthy = None;
    assert_eq!(next(&s), Step::Unhealthy);
}

#[test]
fn a_node_not_healthy_within_its_budget_sticks_the_wave_and_keeps_its_slot() {
    let r = rules(Limit::Count(1), None);
    let held = [held("one", "z1")];
    let back = mine(Phase::Returning, "boot-1", None);
    let s = seen(&r, &held, Some(&back), "2026-12-01T21:14:59Z");
    assert_eq!(next(&s), Step::Idle);
    let s = seen(&r, &held, Some(&back), "2026-12-01T21:15:00Z");
    assert_eq!(next(&s), Step::Stuck);
    // Stuck, then healthy after all: it frees its slot the usual way.
    let stuck = mine(Phase::Stuck, "boot-1", None);
    let mut s = seen(&r, &held, Some(&stuck), "2026-12-01T21:20:00Z");
    assert_eq!(next(&s), Step::Idle);
    s.healthy = Some(at("2026-12-01T21:19:00Z"));
    assert_eq!(next(&s), Step::Healthy(at("2026-12-01T21:19:00Z")));
    // A clock behind the slot's stamps is no negative time.
    let s = seen(&r, &held, Some(&back), "2026-12-01T20:00:00Z");
    assert_eq!(next(&s), Step::Idle);
}

#[test]
fn a_node_is_healthy_when_ready_by_this_boots_kubelet_uncordoned_and_its_node_pods_ready() {
    assert_eq!(health(true, true, false, &[]), Ok(()));
    assert_eq!(
        health(false, true, true, &["kube-system/proxy-x".into()]),
        Err("the Node is not Ready; the Node is cordoned; not Ready: kube-system/proxy-x".into())
    );
    // Ready, as the kubelet of the boot before the reboot left it.
    assert_eq!(
        health(true, false, false, &[]),
        Err(
            "the kubelet has not reported since the reboot (the Node's Ready is from before it)"
                .into()
        )
    );
}

#[test]
fn a_fleet_wide_request_asks_every_node_booted_before_it_once() {
    let asked = Some(at("2026-12-01T21:00:00Z"));
    assert!(requested(asked, Some(at("2026-11-20T08:00:00Z"))));
    // Rebooted since: not asked again.
    assert!(!requested(asked, Some(at("2026-12-01T21:04:00Z"))));
    assert!(!requested(None, Some(at("2026-11-20T08:00:00Z"))));
    // A boot time it cannot read: no reboot on a guess.
    assert!(!requested(asked, None));
}

#[test]
fn the_taint_stays_from_the_need_until_the_slot_is_free() {
    assert!(pending_taint(true, false));
    assert!(pending_taint(false, true));
    assert!(!pending_taint(false, false));
}

#[test]
fn a_node_takes_part_in_the_wave_selecting_it_else_one_at_a_time_if_configured_and_none_of_two() {
    assert_eq!(choose(&[], false, "alone"), Ok(None));
    assert_eq!(choose(&[], true, "alone"), Ok(Some("alone")));
    assert_eq!(choose(&["a".into()], false, "alone"), Ok(Some("a")));
    assert_eq!(choose(&["a".into()], true, "alone"), Ok(Some("a")));
    let err = choose(&["a".into(), "b".into()], true, "alone").unwrap_err();
    assert_eq!(
        err.to_string(),
        "selected by more than one wave (a, b): the node takes part in none until an operator changes their nodeSelectors"
    );
}

#[test]
fn a_slot_is_taken_back_only_from_a_node_gone_or_silent_past_its_budget() {
    let r = rules(Limit::Count(1), None);
    assert!(!take_back(&r, false, Duration::from_secs(900)));
    assert!(take_back(&r, false, Duration::from_secs(901)));
    assert!(take_back(&r, true, Duration::ZERO));
}

proptest! {
    /// Nodes of random domains ask in a random order, slots are freed at random, and
    /// every take is written one at a time (the apiserver orders them): the limits hold
    /// after every write, and a node that is told to wait is told why truthfully.
    #[test]
    fn takes_never_exceed_the_wave_or_a_domain(
        limit in prop_oneof![(1u32..5).prop_map(Limit::Count), (1u32..101).prop_map(Limit::Percent)],
        per_domain in proptest::option::of(1u32..3),
        domains in proptest::collection::vec(0usize..3, 1..12),
        steps in proptest::collection::vec((0usize..12, any::<bool>()), 1..80),
    ) {
        let r = rules(limit, per_domain);
        let members = domains.len();
        let name = |i: usize| format!("n{i}");
        let mut slots: Vec<Held> = Vec::new();
        for (who, free) in steps {
            let who = who % members;
            let domain = format!("z{}", domains[who]);
            if free {
                slots.retain(|h| h.node != name(who));
                continue;
            }
            match turn(&r, &name(who), &domain, &slots, members, Opening::Open, None) {
                Turn::Take => slots.push(held(&name(who), &domain)),
                Turn::Holding => prop_assert!(slots.iter().any(|h| h.node == name(who))),
                Turn::Wait(Why::WaveFull { held, slots: n }) => {
                    prop_assert_eq!(held, slots.len());
                    prop_assert!(held >= n);
                }
                Turn::Wait(Why::DomainFull { domain: d, held, slots: n }) => {
                    prop_assert_eq!(&d, &domain);
                    prop_assert_eq!(held, slots.iter().filter(|h| h.domain == domain).count());
                    prop_assert!(held >= n as usize);
                }
                other => prop_assert!(false, "unexpected {other:?}"),
            }
            prop_assert!(slots.len() <= limit.slots(members));
            if let Some(per) = per_domain {
                for z in 0..3 {
                    let zone = format!("z{z}");
                    prop_assert!(slots.iter().filter(|h| h.domain == zone).count() <= per as usize);
                }
            }
        }
    }
}

proptest! {
    /// A fleet whose nodes all need a reboot, in domains of any sizes: in each turn every
    /// slot is free and the waiting nodes ask one after another from a random one on, each
    /// take written one at a time. With the longest queue first the wave takes as few turns as its limits allow:
    /// ⌈N/k⌉, or more only where one domain holds more than its share.
    #[test]
    fn a_wave_ends_in_as_few_turns_as_its_limits_allow(
        k in 1u32..5,
        per in 1u32..3,
        domains in proptest::collection::vec(0usize..4, 1..16),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 64),
    ) {
        let r = rules(Limit::Count(k), Some(per));
        let n = domains.len();
        let mut left: Vec<usize> = (0..n).collect();
        let mut turns = 0;
        while !left.is_empty() {
            turns += 1;
            prop_assert!(turns <= n, "a turn took no slot");
            let mut slots: Vec<Held> = Vec::new();
            let mut asked = 0;
            loop {
                let mut took = false;
                for i in 0..left.len() {
                    let start = order[asked % order.len()].index(left.len());
                    let pick = (start + i) % left.len();
                    let who = left[pick];
                    let domain = format!("z{}", domains[who]);
                    let mut waiting = BTreeMap::new();
                    for w in &left {
                        *waiting.entry(format!("z{}", domains[*w])).or_insert(0) += 1;
                    }
                    let me = format!("n{who}");
                    if turn(&r, &me, &domain, &slots, n, Opening::Open, None) == Turn::Take
                        && give_way(&r, &domain, &slots, &waiting, Duration::ZERO).is_none()
                    {
                        slots.push(held(&me, &domain));
                        left.remove(pick);
                        took = true;
                        break;
                    }
                }
                asked += 1;
                if !took || left.is_empty() {
                    break;
                }
            }
        }
        let mut per_domain = BTreeMap::new();
        for d in &domains {
            *per_domain.entry(*d).or_insert(0usize) += 1;
        }
        let widest = per_domain.values().map(|c| c.div_ceil(per as usize)).max().unwrap_or(0);
        let ideal = n.div_ceil(k as usize).max(widest);
        prop_assert_eq!(turns, ideal);
    }
}
