//! Real-control-plane tier: a fleet reboots in turns (issue 43, item 7). Six nspawn nodes
//! (real systemd-logind, nodegrace as packaged) in three zones make one RebootWave of
//! `maxUnavailable: 2`, one a zone, `healthySeconds: 5`; beside them a spare node a zone
//! that the wave does not select (a kubelet stand-in only) and a Deployment spread over all
//! nine under a PodDisruptionBudget (tests/realk8s/fleet/). Every wave node is told it needs
//! a reboot while the wave's window is closed; once all have joined the wave and tainted
//! themselves the window opens.
//!
//! Two waves on the same fleet. The first goes undisturbed. In the second every node needs a
//! reboot again, and on the way the daemon of a node that holds a slot and drains is
//! SIGKILLed (the packaged unit restarts it) and, once a node of the second batch holds a
//! slot, the apiserver is stopped for 30 s and started again as the outage tests do.
//!
//! Sampled every second: never more than 2 wave nodes unavailable (container down or Node
//! cordoned), never more than 1 a zone, no node down without a slot (a reboot while the
//! apiserver is away is judged by the first read of the wave after it: the node's slot,
//! taken before it went down). At the end of each wave every wave node rebooted exactly
//! once, no slot is left and no pod was evicted twice (no pod made during the wave was
//! evicted in its turn). Each wave's times, its evictions and each node's requests to the
//! apiserver are printed.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

#[path = "realk8s/fleet/mod.rs"]
mod fleet;
mod real;
mod realk8s;

use std::collections::BTreeMap;
use std::time::Duration;

use fleet::wave::{self, run_wave, Faults, WaveRun, WAVE_TIMEOUT};
use fleet::{pods_by_node, Finished, Fleet, Reboot, Sample};
use fleet::{HEALTHY_SECONDS, MAX_PER_ZONE, MAX_UNAVAILABLE, MIN_AVAILABLE, WAVE_NODES};
use realk8s::audit::Request;

/// How long the second wave's apiserver is away.
const OUTAGE: Duration = Duration::from_secs(30);

/// Six nodes in three zones need a reboot at once, twice: they reboot two at a time, never
/// two of a zone, each once a wave, each wave leaves no slot, and no pod is evicted twice;
/// in the second wave too, with a draining node's daemon killed and the apiserver away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_reboots_two_at_a_time_one_a_zone_and_no_pod_is_evicted_twice() {
    if !realk8s::enabled(
        "realk8s_wave_fleet::a_fleet_reboots_two_at_a_time_one_a_zone_and_no_pod_is_evicted_twice",
    ) {
        return;
    }
    real::require_prerequisites();
    let prefix = realk8s::unique("ng-wf");
    fleet::with_fleet(&prefix, reboot_twice).await;
}

async fn reboot_twice(mut f: Fleet) {
    let spread = pods_by_node(&f.admin, &f.ns).await;
    println!(
        "pods before the wave: {:?}",
        spread.iter().map(|(n, p)| (n, p.len())).collect::<Vec<_>>()
    );
    for node in &f.wave_nodes {
        assert!(
            spread.get(node).is_some_and(|p| !p.is_empty()),
            "the scheduler put no pod on wave node {node}: {spread:?}"
        );
    }

    let clean = run_wave(&mut f, Faults::default()).await;
    let mut failures = judge(&f, &clean, "wave").await;
    failures.extend(judge_rounds(&f, &clean).await);
    if !failures.is_empty() {
        fail(f.finish(), failures);
    }

    let faults = Faults {
        kill_a_holder: true,
        outage: Some(OUTAGE),
    };
    let faulted = run_wave(&mut f, faults).await;
    let mut failures = judge(
        &f,
        &faulted,
        "second wave (a daemon killed, the apiserver away)",
    )
    .await;
    failures.extend(judge_faults(&f, &faulted));
    let finished = f.finish();
    if let Some(killed) = &faulted.killed {
        let journal: String = finished
            .iter()
            .filter(|d| d.name == killed.node)
            .flat_map(Finished::all_boots)
            .map(|c| c.journal_text())
            .collect();
        // A kill that did not happen must not pass for one that did; the unit restarts the
        // daemon, which finishes the drain.
        for (what, needle) in [
            ("nodegrace killed by SIGKILL", "status=9/KILL"),
            ("nodegrace restarted", "Scheduled restart job"),
        ] {
            if !journal
                .lines()
                .any(|l| l.contains("nodegrace.service") && l.contains(needle))
            {
                failures.push(format!("{}'s journal shows no {what}", killed.node));
            }
        }
    }
    if !failures.is_empty() {
        fail(finished, failures);
    }
    for done in finished {
        done.shut();
    }
}

fn fail(finished: Vec<Finished>, failures: Vec<String>) -> ! {
    let journals: String = finished.iter().map(Finished::journal).collect();
    panic!(
        "{}\n\nthe daemons' journals:\n{journals}",
        failures.join("\n")
    );
}

/// Without faults the wave takes as few turns one after another as its limits allow: six
/// nodes, two slots, so three (issue 43's ⌈N/k⌉), where first come, first served may leave
/// one zone's two nodes for last, one after the other. Beside it, the bound on the
/// wave's duration: ⌈N/k⌉ × (the longest turn + 5 s).
async fn judge_rounds(f: &Fleet, run: &WaveRun) -> Vec<String> {
    let end = run.ended.unwrap_or_else(realk8s::now_unix);
    let requests = f.daemon_requests(run.touched, end).await;
    let turns = turns(run, &requests, &run.reboots(f));
    let ideal = WAVE_NODES.div_ceil(MAX_UNAVAILABLE);
    let longest = turns
        .iter()
        .map(|t| t.freed.unwrap_or(end) - t.took)
        .fold(0.0, f64::max);
    let bound = ideal as f64 * (longest + 5.0);
    let took = end - run.opened.unwrap_or(end);
    let rounds = rounds(&turns, end);
    println!("wave: {rounds} turns one after another (ideal {ideal}); {took:.1} s against the bound {ideal} × ({longest:.1} s + 5 s) = {bound:.1} s");
    let mut failures = Vec::new();
    if rounds != ideal {
        failures.push(format!(
            "wave: {rounds} turns one after another, not {ideal}: the free slots did not go first to the zones where most nodes waited"
        ));
    }
    if took > bound {
        failures.push(format!("wave: took {took:.1} s, over {bound:.1} s"));
    }
    failures
}

/// The longest chain of turns each taken after the one before it was freed.
fn rounds(turns: &[Turn], end: f64) -> usize {
    let mut depth: Vec<usize> = Vec::new();
    for (i, t) in turns.iter().enumerate() {
        let before = turns[..i]
            .iter()
            .zip(&depth)
            .filter(|(o, _)| o.freed.unwrap_or(end) <= t.took + 0.5)
            .map(|(_, d)| *d)
            .max()
            .unwrap_or(0);
        depth.push(before + 1);
    }
    depth.into_iter().max().unwrap_or(0)
}

/// The faults of the second wave happened, each at its time, and the control plane is whole.
fn judge_faults(f: &Fleet, run: &WaveRun) -> Vec<String> {
    let opened = run.opened.unwrap_or(run.touched);
    let rel = |t: f64| t - opened;
    let mut failures = Vec::new();
    match &run.killed {
        Some(k) => println!(
            "nodegrace SIGKILLed on {} ({}) {:.1} s after the window opened, {:.1} s after its slot was taken (whole seconds)",
            k.node,
            f.zone_of(&k.node),
            rel(k.at),
            k.at - k.taken
        ),
        None => failures.push("no daemon was killed: no node with pods was seen holding a slot".into()),
    }
    if let Some(k) = &run.killed {
        let reboots = run.reboots(f);
        let down = reboots
            .iter()
            .find(|(n, _)| *n == k.node)
            .and_then(|(_, rs)| rs.first().map(|r| r.down));
        if down.is_none_or(|d| d <= k.at) {
            failures.push(format!(
                "{}'s daemon was killed at {:.1} s, not before the node went down ({down:?})",
                k.node,
                rel(k.at)
            ));
        }
    }
    let Some(o) = &run.outage else {
        failures.push(
            "the apiserver was never stopped: no sample saw a second batch hold a slot".into(),
        );
        return failures;
    };
    let answered = o.answered.map_or("-".into(), |t| format!("{:.1}", rel(t)));
    let healed = o.healed.map_or("-".into(), |t| format!("{:.1}", rel(t)));
    println!(
        "apiserver stopped at {:.1} s, the wave read again at {answered} s, control plane whole at {healed} s",
        rel(o.stopped)
    );
    let end = o.answered.unwrap_or(f64::INFINITY);
    let during: Vec<String> = run
        .reboots(f)
        .iter()
        .filter(|(_, rs)| rs.iter().any(|r| r.down >= o.stopped && r.down <= end))
        .map(|(n, _)| n.clone())
        .collect();
    println!("nodes that went down while the apiserver was away: {during:?}");
    if o.healed.is_none() {
        failures.push("the control plane was not whole again by the wave's end".into());
    }
    failures
}

/// One node's turn in the wave (Unix seconds).
struct Turn {
    node: String,
    took: f64,
    down: Option<f64>,
    up: Option<f64>,
    freed: Option<f64>,
}

/// When `node`'s daemon took and freed its slot, as the apiserver completed its writes of
/// the wave's status: the first (after joining, when `joins`), and the last.
fn slot_writes(requests: &[Request], node: &str, joins: bool) -> (Option<f64>, Option<f64>) {
    let user = format!("nodegrace:node:{node}");
    let writes: Vec<f64> = requests
        .iter()
        .filter(|r| r.user == user && r.resource == "rebootwaves" && r.subresource == "status")
        .filter(|r| r.verb == "update" && r.code == 200)
        .map(|r| r.completed)
        .collect();
    let take = usize::from(joins);
    (
        writes.get(take).copied(),
        writes.last().copied().filter(|_| writes.len() > take + 1),
    )
}

/// The nodes' slots over time, from the samples: (node, first seen, first seen gone).
fn slot_spans(samples: &[Sample]) -> Vec<(String, f64, Option<f64>)> {
    let mut spans: Vec<(String, f64, Option<f64>)> = Vec::new();
    for s in samples {
        let Some(slots) = &s.slots else { continue };
        for slot in slots {
            if !spans
                .iter()
                .any(|(n, _, end)| *n == slot.node && end.is_none())
            {
                spans.push((slot.node.clone(), s.at, None));
            }
        }
        for (node, _, end) in spans.iter_mut() {
            if end.is_none() && !slots.iter().any(|slot| slot.node == *node) {
                *end = Some(s.at);
            }
        }
    }
    spans.sort_by(|a, b| a.1.total_cmp(&b.1));
    spans
}

/// Prints one wave's figures; returns what it broke.
async fn judge(f: &Fleet, run: &WaveRun, title: &str) -> Vec<String> {
    let end = run.ended.unwrap_or_else(realk8s::now_unix);
    let requests = f.daemon_requests(run.touched, end).await;
    let mut evicted: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests.iter().filter(|r| fleet::disruption(r, &f.ns)) {
        *evicted.entry(r.name.clone()).or_default() += 1;
    }
    let twice: Vec<&String> = evicted
        .iter()
        .filter(|(pod, n)| **n > 1 || !run.originals.contains(*pod))
        .map(|(pod, _)| pod)
        .collect();
    // A node watches its own Node and pods only (issue 43: no cluster-wide watch of either).
    let unscoped: Vec<String> = requests
        .iter()
        .filter(|r| r.is_watch() && (r.resource == "nodes" || r.resource == "pods"))
        .filter(|r| !r.uri.contains("fieldSelector="))
        .map(|r| format!("{} {}", r.user, r.uri))
        .collect();
    let reboots = run.reboots(f);
    print_wave(f, run, title, &requests, &evicted, twice.len(), &reboots);

    let opened = run.opened.unwrap_or(end);
    let mut failures: Vec<String> = run
        .broken
        .iter()
        .map(|(at, v)| format!("{title}: at {:.1} s: {v}", at - opened))
        .collect();
    if run.all_waiting.is_none() {
        failures.push(format!(
            "{title}: not every wave node joined the wave and was tainted within {:?} of its sentinel",
            fleet::JOIN_TIMEOUT
        ));
    } else if run.ended.is_none() {
        failures.push(format!("{title}: the wave did not end in time"));
    }
    for (node, rs) in &reboots {
        if rs.len() != 1 {
            failures.push(format!("{title}: {node} rebooted {} times", rs.len()));
        }
    }
    failures.extend(
        wave::reboots_without_a_slot(run, &reboots)
            .into_iter()
            .map(|v| format!("{title}: {v}")),
    );
    if let Some(left) = run.samples.iter().rev().find_map(|s| s.slots.as_ref()) {
        if !left.is_empty() {
            failures.push(format!("{title}: slots left at the end: {left:?}"));
        }
    }
    if !twice.is_empty() {
        failures.push(format!("{title}: pods evicted twice: {twice:?}"));
    }
    if evicted.is_empty() {
        failures.push(format!(
            "{title}: no pod was evicted: the drains did nothing"
        ));
    }
    if !unscoped.is_empty() {
        failures.push(format!(
            "{title}: cluster-wide watches of Nodes or pods: {unscoped:?}"
        ));
    }
    failures
}

/// Each node's turn: its slot taken and freed as the apiserver completed the writes (the
/// samples when there were none), its container down and booted again as the harness saw.
fn turns(run: &WaveRun, requests: &[Request], reboots: &[(String, Vec<Reboot>)]) -> Vec<Turn> {
    let mut turns: Vec<Turn> = slot_spans(&run.samples)
        .iter()
        .map(|(node, from, to)| {
            let joins = !run.waiting_before.contains(node);
            let (took, freed) = slot_writes(requests, node, joins);
            let reboot = reboots
                .iter()
                .find(|(n, _)| n == node)
                .and_then(|(_, r)| r.first().cloned());
            Turn {
                node: node.clone(),
                took: took.unwrap_or(*from),
                down: reboot.as_ref().map(|r| r.down),
                up: reboot.as_ref().and_then(|r| r.up),
                freed: freed.or(*to),
            }
        })
        .collect();
    turns.sort_by(|a, b| a.took.total_cmp(&b.took));
    turns
}

fn print_wave(
    f: &Fleet,
    run: &WaveRun,
    title: &str,
    requests: &[Request],
    evicted: &BTreeMap<String, usize>,
    twice: usize,
    reboots: &[(String, Vec<Reboot>)],
) {
    println!(
        "--- {title} of {WAVE_NODES} nodes, maxUnavailable {MAX_UNAVAILABLE}, {MAX_PER_ZONE} a zone, healthy {HEALTHY_SECONDS} s"
    );
    if let Some(all) = run.all_waiting {
        println!(
            "every node a member and tainted {:.1} s after the sentinels",
            all - run.touched
        );
    }
    let end = run.ended.unwrap_or_else(realk8s::now_unix);
    let opened = run.opened.unwrap_or(end);
    match run.ended {
        Some(end) => println!(
            "{title} duration (window opened to no slot left): {:.1} s",
            end - opened
        ),
        None => println!("the {title} did not end within {WAVE_TIMEOUT:?} (and its outage)"),
    }
    let turns = turns(run, requests, reboots);
    let rel = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{:.1}", t - opened));
    println!(
        "node (zone): slot taken, container down, booted, slot freed (s after the window opened)"
    );
    for t in &turns {
        println!(
            "  {} ({}): {}, {}, {}, {}",
            t.node,
            f.zone_of(&t.node),
            rel(Some(t.took)),
            rel(t.down),
            rel(t.up),
            rel(t.freed)
        );
    }
    for (i, batch) in turns.chunks(MAX_UNAVAILABLE).enumerate() {
        let from = batch.iter().map(|t| t.took).fold(f64::INFINITY, f64::min);
        let to = batch
            .iter()
            .map(|t| t.freed.unwrap_or(end))
            .fold(f64::NEG_INFINITY, f64::max);
        let nodes: Vec<&str> = batch.iter().map(|t| t.node.as_str()).collect();
        println!("batch {}: {nodes:?} {:.1} s", i + 1, to - from);
    }
    // How long a waiting node took to take a slot after the last one freed before its take.
    let handovers: Vec<String> = turns
        .iter()
        .filter_map(|t| {
            let freed = turns
                .iter()
                .filter_map(|o| o.freed)
                .filter(|f| *f < t.took)
                .max_by(f64::total_cmp)?;
            Some(format!("{:.2}", t.took - freed))
        })
        .collect();
    println!("{title}: from a slot freed to the next taken (s): {handovers:?}");
    let refused = requests
        .iter()
        .filter(|r| r.namespace == f.ns && r.subresource == "eviction" && r.code == 429)
        .count();
    println!(
        "{title}: evictions: {} of {} pods ({refused} refused by the budget); pods evicted twice: {twice}",
        evicted.values().sum::<usize>(),
        evicted.len(),
    );
    let least_healthy = run.samples.iter().filter_map(|s| s.healthy).min();
    println!(
        "the budget's healthy pods, fewest seen: {least_healthy:?} (minAvailable {MIN_AVAILABLE})"
    );
    print_requests(f, requests);
    let codes: Vec<(&String, usize, Vec<Option<i32>>)> = reboots
        .iter()
        .map(|(n, r)| (n, r.len(), r.iter().map(|r| r.code).collect()))
        .collect();
    println!("reboots in the {title} (node, reboots, systemd-nspawn exit codes): {codes:?}");
}

fn print_requests(f: &Fleet, requests: &[Request]) {
    println!("requests to the apiserver per wave node (its identity + the kubelet's):");
    for node in &f.wave_nodes {
        let own = format!("nodegrace:node:{node}");
        let kubelet = format!("system:node:{node}");
        let mine: Vec<&Request> = requests
            .iter()
            .filter(|r| r.user == own || r.user == kubelet)
            .collect();
        println!(
            "  {node}: {} ({} + {}), {} of them on the wave",
            mine.len(),
            mine.iter().filter(|r| r.user == own).count(),
            mine.iter().filter(|r| r.user == kubelet).count(),
            mine.iter().filter(|r| r.resource == "rebootwaves").count(),
        );
    }
    println!(
        "  mean {:.1} a wave node, from the sentinels to the wave's end",
        requests.len() as f64 / WAVE_NODES as f64
    );
}
