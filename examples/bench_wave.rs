//! A fleet rebooted three ways (issue 43's targets): the fleet of the real-tier test
//! tests/realk8s_wave_fleet.rs (six nspawn nodes with real systemd-logind and nodegrace as
//! packaged, in three zones; a spare node a zone; a Deployment of 18 pods under a budget of
//! minAvailable 17, on the real control plane `../shared/realk8s/`, kube-apiserver v1.28.4)
//! reboots every wave node once:
//!
//! 1. **nodegrace's RebootWave**, `maxUnavailable: 2`, one a zone, healthy 5 s, as the test
//!    runs it: every node needs a reboot (`/run/reboot-required`), joins and taints itself,
//!    then the window opens.
//! 2. **every node at once**, as unattended-upgrades' automatic reboot does: `systemctl
//!    reboot` in every node in the same second. No wave selects the nodes (the wave object is
//!    deleted); nodegrace still drains each shutdown.
//! 3. **one node at a time without the reboot-pending taint**, kured's defaults: the nodes in
//!    order, each rebooted (`systemctl reboot`) once the one before is back (its Node Ready
//!    and uncordoned: kured frees its lock then). No wave, no taint on the waiting nodes.
//!
//! Each run starts from a settled Deployment (the second and third from its pods scheduled
//! anew: scaled to none and back). For each it prints: pods evicted more than once (a pod
//! made during the run, the replacement of an evicted one, evicted in its turn; or one pod
//! evicted twice), evictions in all (granted evictions and the daemons' DELETEs, from the
//! apiserver's audit log), most wave nodes unavailable at once (container down or Node
//! cordoned, sampled every second) and most in one zone, the fewest healthy pods of the
//! budget's, and the wall time from the start (the window opened, the first `systemctl
//! reboot`) to every node back: rebooted, running, Ready and uncordoned.
//!
//! As root, with the control plane's scripts at `../shared/realk8s` (or `$NODEGRACE_REALK8S`;
//! started if not running, never stopped):
//!
//! ```sh
//! cargo build --release --bin nodegrace    # or set NODEGRACE_TEST_BINARY
//! cargo run --release --example bench_wave
//! ```

#[path = "../tests/realk8s/fleet/mod.rs"]
mod fleet;
#[path = "../tests/real/mod.rs"]
mod real;
#[path = "../tests/realk8s/mod.rs"]
mod realk8s;

use std::collections::BTreeMap;
use std::time::Duration;

use fleet::wave::{run_wave, Faults};
use fleet::{pods_by_node, Fleet, Reboot, Sample, Sampler, MIN_AVAILABLE, REPLICAS, ZONES};
use kube::api::DeleteParams;
use kube::Api;
use nodegrace::RebootWave;
use realk8s::now_unix;

/// How long a run may take before the benchmark gives up on it.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// One run's figures.
struct Figures {
    way: &'static str,
    twice: usize,
    evictions: usize,
    most_down: usize,
    most_in_a_zone: usize,
    least_healthy: Option<i32>,
    /// From the start to every node back; none when that never came.
    wall: Option<f64>,
}

/// When every node has rebooted since `marks` and is back: the first such sample.
fn all_back(s: &Sample, reboots: &[(String, Vec<Reboot>)]) -> bool {
    reboots.iter().all(|(node, rs)| {
        rs.last()
            .and_then(|r| r.up)
            .is_some_and(|up| up <= s.at && s.back(node))
    })
}

/// What the samples from `start` on and the audit log from `since` say of one run.
async fn figures(
    f: &Fleet,
    way: &'static str,
    samples: &[Sample],
    since: f64,
    start: f64,
    marks: &[usize],
    originals: &[String],
) -> Figures {
    let reboots = f.reboots_since(marks);
    let samples: Vec<&Sample> = samples.iter().filter(|s| s.at >= start).collect();
    let end = samples.iter().find(|s| all_back(s, &reboots)).map(|s| s.at);
    let requests = f.daemon_requests(since, end.unwrap_or_else(now_unix)).await;
    let mut evicted: BTreeMap<&str, usize> = BTreeMap::new();
    for r in requests.iter().filter(|r| fleet::disruption(r, &f.ns)) {
        *evicted.entry(r.name.as_str()).or_default() += 1;
    }
    let twice = evicted
        .iter()
        .filter(|(pod, n)| **n > 1 || !originals.iter().any(|o| o == *pod))
        .count();
    let within = samples.iter().filter(|s| end.is_none_or(|e| s.at <= e));
    let most_in_a_zone = |s: &Sample| {
        let down = s.unavailable();
        ZONES
            .iter()
            .map(|z| down.iter().filter(|n| f.zone_of(n) == *z).count())
            .max()
            .unwrap_or(0)
    };
    Figures {
        way,
        twice,
        evictions: evicted.values().sum(),
        most_down: within
            .clone()
            .map(|s| s.unavailable().len())
            .max()
            .unwrap_or(0),
        most_in_a_zone: within.clone().map(|s| most_in_a_zone(s)).max().unwrap_or(0),
        least_healthy: within.filter_map(|s| s.healthy).min(),
        wall: end.map(|e| e - start),
    }
}

async fn originals(f: &Fleet) -> Vec<String> {
    pods_by_node(&f.admin, &f.ns)
        .await
        .into_values()
        .flatten()
        .collect()
}

/// (i) nodegrace's RebootWave.
async fn by_wave(f: &mut Fleet) -> Figures {
    let marks = f.reboot_marks();
    let run = run_wave(f, Faults::default()).await;
    let opened = run
        .opened
        .expect("every node joined the wave and the window opened");
    let originals: Vec<String> = run.originals.iter().cloned().collect();
    if let Some(end) = run.ended {
        println!(
            "(the wave: window opened to no slot left {:.1} s)",
            end - opened
        );
    }
    figures(
        f,
        "RebootWave",
        &run.samples,
        run.touched,
        opened,
        &marks,
        &originals,
    )
    .await
}

/// Samples until every node rebooted since `marks` is back (or [`RUN_TIMEOUT`]).
async fn until_back(f: &mut Fleet, sampler: &mut Sampler, marks: &[usize], nodes: &[usize]) {
    let started = now_unix();
    loop {
        let s = sampler.next(f).await.clone();
        let reboots: Vec<(String, Vec<Reboot>)> = f
            .reboots_since(marks)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| nodes.contains(i))
            .map(|(_, r)| r)
            .collect();
        if all_back(&s, &reboots) || s.at - started > RUN_TIMEOUT.as_secs_f64() {
            return;
        }
    }
}

/// (ii) every node at once.
async fn all_at_once(f: &mut Fleet) -> Figures {
    let marks = f.reboot_marks();
    let originals = originals(f).await;
    let mut sampler = Sampler::new();
    sampler.next(f).await;
    let start = now_unix();
    for m in &f.machines {
        m.exec(&["systemctl", "reboot"]);
    }
    let all: Vec<usize> = (0..f.machines.len()).collect();
    until_back(f, &mut sampler, &marks, &all).await;
    figures(
        f,
        "every node at once",
        &sampler.samples,
        start,
        start,
        &marks,
        &originals,
    )
    .await
}

/// (iii) one at a time, each once the one before is Ready and uncordoned, without a taint.
async fn one_at_a_time(f: &mut Fleet) -> Figures {
    let marks = f.reboot_marks();
    let originals = originals(f).await;
    let mut sampler = Sampler::new();
    sampler.next(f).await;
    let start = now_unix();
    for i in 0..f.machines.len() {
        f.machines[i].exec(&["systemctl", "reboot"]);
        until_back(f, &mut sampler, &marks, &[i]).await;
    }
    let way = "one at a time, no taint (kured)";
    figures(f, way, &sampler.samples, start, start, &marks, &originals).await
}

fn print(all: &[Figures]) {
    println!(
        "{:<34} {:>7} {:>9} {:>8} {:>9} {:>8} {:>8}",
        "way", "twice", "evicted", "most", "in a zone", "healthy", "wall s"
    );
    for g in all {
        println!(
            "{:<34} {:>7} {:>9} {:>8} {:>9} {:>8} {:>8}",
            g.way,
            g.twice,
            g.evictions,
            g.most_down,
            g.most_in_a_zone,
            g.least_healthy.map_or("-".into(), |h| h.to_string()),
            g.wall.map_or("-".into(), |w| format!("{w:.1}")),
        );
    }
    println!(
        "twice: pods evicted more than once; evicted: evictions in all; most: most wave nodes unavailable at once; in a zone: most of one zone; healthy: fewest healthy pods of the budget's {REPLICAS} (minAvailable {MIN_AVAILABLE}); wall: start to every node back (Ready, uncordoned)"
    );
}

async fn three_ways(mut f: Fleet) {
    let mut all = vec![by_wave(&mut f).await];
    let waves: Api<RebootWave> = Api::all(f.admin.clone());
    waves
        .delete(&f.wave, &DeleteParams::default())
        .await
        .expect("deleting the wave");
    f.reschedule().await;
    all.push(all_at_once(&mut f).await);
    f.reschedule().await;
    all.push(one_at_a_time(&mut f).await);
    print(&all);
    for done in f.finish() {
        done.shut();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    real::require_prerequisites();
    let binary = real::nodegrace_binary();
    println!(
        "bench_wave at {} ({}), load {} before",
        realk8s::commit(),
        binary.display(),
        realk8s::load_average()
    );
    fleet::with_fleet(&realk8s::unique("ng-bw"), three_ways).await;
    println!("load {} after", realk8s::load_average());
}
