use chrono::TimeZone;

use super::*;

fn t(ms: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 27, 14, 2, 3).unwrap() + chrono::Duration::milliseconds(ms)
}

fn ev(ms: i64, reason: &str, note: &str) -> Record {
    Record {
        at: t(ms),
        reason: reason.into(),
        note: note.into(),
    }
}

fn phase(ms: i64, phase: Phase, reason: &str) -> PhaseChange {
    PhaseChange {
        phase,
        at: t(ms),
        reason: reason.into(),
    }
}

/// A reboot whose apiserver was lost for 8 s, whose web pods waited on their budget and
/// were escalated at the band's deadline: the notes as the daemon writes them.
fn story() -> Story {
    let events = [
        ev(200, "Cordoned", "node node-a cordoned for shutdown-node-a"),
        ev(300, "DrainTargets", "node node-a drains Default<=1000"),
        // The same targets told again (events are written in the background, their order
        // not kept): the band goes on.
        ev(1_600, "DrainTargets", "node node-a drains Default<=1000"),
        ev(1_500, "EvictionBlocked", "eviction of 2 pod(s) blocked by PodDisruptionBudget shop/web-pdb; retrying with back-off: shop/web-1, shop/web-2"),
        ev(16_000, "Replanned", "planned again at 16s: the apiserver did not answer (8s lost); the 44s left of the shutdown budget split over the pods left"),
        ev(21_000, "Escalated", "2 pod(s) still running at their shutdown deadline: deleted with the grace left: shop/web-1, shop/web-2"),
        ev(23_000, "DrainTargets", "node node-a drains Default<=1000, System<=2000000000"),
        ev(24_000, "Throttled", "the apiserver throttled the requests for 1 pod(s) (429 Too Many Requests); asking again after 1s: kube-system/dns-0"),
        ev(29_400, "Drained", "node node-a drained for shutdown-node-a"),
    ];
    let phases = [
        phase(0, Phase::Armed, "inhibitor taken"),
        phase(100, Phase::Draining, "reboot requested"),
        phase(30_000, Phase::Released, "drain finished"),
    ];
    Story::tell("node-a", &phases, &events, t(60_000)).unwrap()
}

#[test]
fn a_story_is_read_from_the_daemons_notes() {
    let s = story();
    assert_eq!((s.start, s.end), (t(100), t(30_000)));
    assert_eq!(s.outcome, "released: drain finished");
    let bands: Vec<_> = s
        .bands
        .iter()
        .map(|b| (b.label.as_str(), b.from, b.to))
        .collect();
    assert_eq!(
        bands,
        [
            ("Default<=1000", t(300), t(23_000)),
            ("Default<=1000, System<=2000000000", t(23_000), t(29_400)),
        ]
    );
    let waits: Vec<_> = s
        .waits
        .iter()
        .map(|w| (w.pod.as_str(), w.on.as_str(), w.to))
        .collect();
    assert_eq!(
        waits,
        [
            ("shop/web-1", "PodDisruptionBudget shop/web-pdb", t(21_000)),
            ("shop/web-2", "PodDisruptionBudget shop/web-pdb", t(21_000)),
            (
                "kube-system/dns-0",
                "the apiserver (429 Too Many Requests)",
                t(29_400)
            ),
        ]
    );
    assert_eq!(s.outages.len(), 1);
    assert_eq!((s.outages[0].from, s.outages[0].to), (t(8_000), t(16_000)));
    assert_eq!(s.outages[0].label, "the apiserver did not answer");
    let letters: String = s.marks.iter().map(|m| m.letter).collect();
    assert_eq!(letters, "RE");
}

const GOLDEN_80: &str = "\
node-a: shutdown at 2026-11-27 14:02:03Z, 29.9s, released: drain finished
                           0s      5s       10s      15s     20s      25s
                           |-------|--------|--------|-------|--------|---------
band Default<=1000         ████████████████████████████████████████
band Default<=1000, Syste…                                        ████████████
apiserver lost                          ×××××××××××××××
shop/web-1                   ░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░
shop/web-2                   ░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░
kube-system/dns-0                                                   ░░░░░░░░░░
events                                                R        E
█ band  ░ pod waiting  × apiserver lost  R re-planned  E escalated  F fallback
Bands and outages:
  +0.2s 22.7s  band Default<=1000
  +22.9s 6.4s  band Default<=1000, System<=2000000000
  +7.9s 8.0s  apiserver lost: the apiserver did not answer
Waited:
  +1.4s 19.5s  shop/web-1 waited on PodDisruptionBudget shop/web-pdb
  +1.4s 19.5s  shop/web-2 waited on PodDisruptionBudget shop/web-pdb
  +23.9s 5.4s  kube-system/dns-0 waited on the apiserver (429 Too Many Requests)
Events:
  R +15.9s re-planned: planned again at 16s: the apiserver did not answer (8s l…
  E +20.9s escalated (deleted with the grace left): shop/web-1, shop/web-2
";

#[test]
fn the_drawing_holds_its_layout_at_80_columns() {
    let drawn = draw(&story(), 80, false).join("\n") + "\n";
    assert_eq!(drawn, GOLDEN_80, "drawn:\n{drawn}");
}

#[test]
fn narrow_terminals_get_lines_that_fit_never_wrapped() {
    for width in [20, 40, 47, 48, 60, 79, 80, 100, 200] {
        for line in draw(&story(), width, false) {
            assert!(line.chars().count() <= width, "{width}: {line:?}");
        }
    }
    let narrow = draw(&story(), 40, false);
    assert!(narrow.iter().all(|l| !l.contains('|')), "{narrow:#?}");
    assert!(
        narrow.iter().any(|l| l.contains("shop/web-1 waited on")),
        "{narrow:#?}"
    );
}

#[test]
fn colour_paints_the_bars_only_when_asked() {
    let plain = draw(&story(), 80, false);
    assert!(plain.iter().all(|l| !l.contains('\x1b')));
    let painted = draw(&story(), 80, true);
    assert!(
        painted.iter().any(|l| l.contains("\x1b[32m█")),
        "{painted:#?}"
    );
    assert!(
        painted.iter().any(|l| l.contains("\x1b[31m")),
        "{painted:#?}"
    );
}

#[test]
fn names_from_outside_are_escaped() {
    let events = [ev(
        1_000,
        "EvictionBlocked",
        "eviction of 1 pod(s) blocked by PodDisruptionBudget a/\x1b[2Jx; retrying with back-off: a/p",
    )];
    let s = Story::tell("node-a", &[], &events, t(9_000)).unwrap();
    let drawn = draw(&s, 80, false).join("\n");
    assert!(!drawn.contains('\x1b'), "{drawn}");
    assert!(drawn.contains("\\u001b[2Jx"), "{drawn}");
}

#[test]
fn nothing_told_is_no_story() {
    assert_eq!(Story::tell("node-a", &[], &[], t(0)), None);
}

#[test]
fn a_refusal_told_before_its_bands_first_event_waits_until_the_escalation() {
    let events = [
        ev(
            100,
            "EvictionBlocked",
            "eviction of 1 pod(s) blocked by PodDisruptionBudget a/b; retrying with back-off: a/p",
        ),
        ev(120, "DrainTargets", "node node-a drains Default<=1000"),
        ev(
            2_000,
            "Escalated",
            "1 pod(s) still running at their shutdown deadline: deleted with the grace left: a/p",
        ),
        ev(2_500, "Drained", "node node-a drained for shutdown-node-a"),
    ];
    let s = Story::tell("node-a", &[], &events, t(9_000)).unwrap();
    let waits: Vec<_> = s
        .waits
        .iter()
        .map(|w| (w.pod.as_str(), w.from, w.to))
        .collect();
    assert_eq!(waits, [("a/p", t(100), t(2_000))]);
    assert_eq!((s.end, s.outcome.as_str()), (t(2_500), "drained"));
}

#[test]
fn events_years_apart_draw_a_ruler_of_a_few_ticks() {
    let at = |y: i32| Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).unwrap();
    let events = [
        Record {
            at: at(0),
            reason: "DrainTargets".into(),
            note: "node node-a drains Default<=1000".into(),
        },
        Record {
            at: at(9999),
            reason: "Drained".into(),
            note: "node node-a drained for shutdown-node-a".into(),
        },
    ];
    let s = Story::tell("node-a", &[], &events, at(9999)).unwrap();
    let drawn = draw(&s, 80, false);
    let rule = drawn.iter().find(|l| l.contains('|')).unwrap();
    let ticks = rule.matches('|').count();
    assert!((2..=10).contains(&ticks), "{drawn:#?}");
    assert!(drawn[1].trim_start().starts_with("0s "), "{drawn:#?}");
    let second = drawn[1].split_whitespace().nth(1).unwrap();
    assert!(
        second.ends_with('d'),
        "ticks a whole number of days apart: {drawn:#?}"
    );
    for line in &drawn {
        assert!(line.chars().count() <= 80, "{line:?}");
    }
}

#[test]
fn thousands_of_pods_waiting_are_read_in_linear_time() {
    let pods = |from: usize| {
        (from..from + 20_000)
            .map(|i| format!("ns/pod-{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let events = [
        ev(100, "DrainTargets", "node node-a drains Default<=1000"),
        ev(
            200,
            "EvictionBlocked",
            &format!("eviction of 20000 pod(s) blocked by PodDisruptionBudget a/b; retrying with back-off: {}", pods(0)),
        ),
        ev(
            300,
            "Throttled",
            &format!("the apiserver throttled the requests (429 Too Many Requests); asking again after 1s: {}", pods(10_000)),
        ),
        ev(
            400,
            "Escalated",
            &format!("still running at their shutdown deadline: deleted with the grace left: {}", pods(5_000)),
        ),
        ev(500, "Drained", "node node-a drained for shutdown-node-a"),
    ];
    let started = std::time::Instant::now();
    let s = Story::tell("node-a", &[], &events, t(9_000)).unwrap();
    assert_eq!(s.waits.len(), 40_000);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
