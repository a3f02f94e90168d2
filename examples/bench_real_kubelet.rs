//! Issue 28's real-kubelet figure: 17 pods in the 7 bands of the shipped drain plan on a node
//! run by a real kubelet v1.28.4 (`../shared/realk8s/kubelet-up.sh`, its own containerd, real
//! busybox containers), drained by nodegrace as packaged (a booted Debian in nspawn, the
//! shipped unit, configuration and CRDs: the default path; wired to the kubelet as in
//! `tests/realk8s_kubelet.rs`), on `systemctl poweroff` in the node.
//!
//! The workload ([`APPS`]): Deployments `web` ×4 (exit 3 s after SIGTERM) and `batch` ×2
//! (1.5 s) at priority 0, `api` ×4 (2 s, system-cluster-critical), `dns` ×3 (2 s,
//! system-node-critical); DaemonSets `logs` (priority 0), `proxy` (system-cluster-critical),
//! `cni` (system-node-critical), 1 s each; the static pod `etcd` (system-node-critical, 1 s).
//! Every pod's grace is 30 s and no PodDisruptionBudget holds a band back, so the ideal is the
//! sum over the bands of each band's slowest exit: 3 + 2 + 2 + 1 + 1 + 1 + 1 = 11 s.
//!
//! Prints per run: signal → release (logind's "The system will power off now" → nodegrace's
//! `Released`), the ideal, total − ideal; per band, from the signal: the first ask (the
//! eviction or DELETE as the apiserver received it; the static pod's manifest gated, from the
//! journal), the first SIGTERM (the container's exit, from the runtime, less its exit time),
//! the last container exit (the runtime), when its last pod left the node (no container, no
//! volume mounted: what ends a band for nodegrace) and when the kubelet's writes showed it
//! stopped, and the gap from the previous band's last exit to this band's first ask;
//! nodegrace's requests per pod from the signal to the release (audit log: its identity, and
//! the kubelet's credential with user agent `nodegrace/`) by kind, escalations (a DELETE of a
//! Deployment's pod; the static pod's mirror, deleted once the node shows it gone, is not one)
//! and pods evicted twice. Nothing is asserted, but each run
//! says whether every pod was stopped once with its grace (one container, exited 0 on its own
//! after SIGTERM and never restarted; deleted with its own grace period; each Deployment pod
//! evicted once and never DELETEd, each DaemonSet pod DELETEd once) and no band began before
//! the previous one had exited, so a wrong run shows. `BENCH_RUNS=N` (default 1) ends with the
//! median and range.
//!
//! As root, with the control plane's scripts at `../shared/realk8s` (or `$NODEGRACE_REALK8S`;
//! started if not running, never stopped), `containerd`, `runc`, `busybox-static`:
//!
//! ```sh
//! cargo build --release --bin nodegrace    # or set NODEGRACE_TEST_BINARY
//! BENCH_RUNS=3 cargo run --release --example bench_real_kubelet
//! ```

#[path = "../tests/real/mod.rs"]
mod real;
#[path = "../tests/realk8s/mod.rs"]
mod realk8s;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use realk8s::audit::{self, Request};
use realk8s::fixture::{app_of, signal_and_release};
use realk8s::real_kubelet::{self as rk, RealFixture};
use realk8s::workload::{self, PodShape};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Deployment,
    DaemonSet,
    Static,
}

/// One workload: its app label, kind, priority class, pods, exit after SIGTERM and band.
struct App {
    name: &'static str,
    kind: Kind,
    class: Option<&'static str>,
    pods: usize,
    exit_ms: u64,
    band: usize,
}

const CLUSTER: Option<&str> = Some("system-cluster-critical");
const NODE: Option<&str> = Some("system-node-critical");

/// The shipped plan's bands that hold pods here, in drain order (user priority classes stop
/// at 1e9, so the Default entry up to 1999999999 stays empty).
const BANDS: [&str; 7] = [
    "Default, priority 0",
    "Default, system-cluster-critical",
    "Default, system-node-critical",
    "DaemonSet, priority 0",
    "DaemonSet, system-cluster-critical",
    "DaemonSet, system-node-critical",
    "Static, system-node-critical",
];

#[rustfmt::skip]
const APPS: [App; 8] = [
    App { name: "web", kind: Kind::Deployment, class: None, pods: 4, exit_ms: 3000, band: 0 },
    App { name: "batch", kind: Kind::Deployment, class: None, pods: 2, exit_ms: 1500, band: 0 },
    App { name: "api", kind: Kind::Deployment, class: CLUSTER, pods: 4, exit_ms: 2000, band: 1 },
    App { name: "dns", kind: Kind::Deployment, class: NODE, pods: 3, exit_ms: 2000, band: 2 },
    App { name: "logs", kind: Kind::DaemonSet, class: None, pods: 1, exit_ms: 1000, band: 3 },
    App { name: "proxy", kind: Kind::DaemonSet, class: CLUSTER, pods: 1, exit_ms: 1000, band: 4 },
    App { name: "cni", kind: Kind::DaemonSet, class: NODE, pods: 1, exit_ms: 1000, band: 5 },
    // workload::static_pod makes it system-node-critical.
    App { name: "etcd", kind: Kind::Static, class: NODE, pods: 1, exit_ms: 1000, band: 6 },
];

fn app(name: &str) -> &'static App {
    APPS.iter()
        .find(|a| a.name == name)
        .unwrap_or_else(|| panic!("no app {name}"))
}

/// Band `b`'s slowest exit after SIGTERM, in seconds.
fn slowest_exit(b: usize) -> f64 {
    APPS.iter()
        .filter(|a| a.band == b)
        .map(|a| a.exit_ms)
        .max()
        .unwrap_or(0) as f64
        / 1000.0
}

/// The sum over the bands of each band's slowest exit, in seconds.
fn ideal() -> f64 {
    (0..BANDS.len()).map(slowest_exit).sum()
}

/// What one run gave.
struct Outcome {
    total: f64,
    requests: usize,
    escalations: usize,
    evicted_twice: usize,
    /// What was wrong with how the pods were stopped (empty: nothing).
    wrong: Vec<String>,
}

/// Per original pod: when it was asked to go, its containers' exits (first SIGTERM derived,
/// last exit), when it left the node and when the kubelet's writes showed it stopped.
#[derive(Default)]
struct PodTimes {
    asked: Option<f64>,
    sigterm: Option<f64>,
    exited: Option<f64>,
    left_node: Option<f64>,
    api_stopped: Option<f64>,
}

fn min_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values.flatten().reduce(f64::min)
}

fn max_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values.flatten().reduce(f64::max)
}

fn at(t: Option<f64>, signal: f64) -> String {
    t.map_or_else(|| "—".to_owned(), |t| format!("{:.2}", t - signal))
}

async fn run(n: usize, runs: usize) -> Outcome {
    println!("\n-- run {n} of {runs} --");
    let mut f = RealFixture::new("ng-bk", "", false).await;
    let (c, ns, node) = (f.admin.clone(), f.name.clone(), f.name.clone());
    let watch = rk::PodWatch::start(&c, &ns);
    for a in &APPS {
        let mut shape = PodShape::new(a.name)
            .on_real_kubelet()
            .exits_after_ms(a.exit_ms);
        if let Some(class) = a.class {
            shape = shape.priority(class);
        }
        match a.kind {
            Kind::Deployment => {
                workload::deployment(&c, &ns, &node, a.pods as i32, shape).await;
            }
            Kind::DaemonSet => workload::daemonset(&c, &ns, &node, false, shape).await,
            Kind::Static => workload::static_pod(&f.kubelet.manifests(), &ns, shape),
        }
    }
    let wanted: Vec<(&str, usize)> = APPS.iter().map(|a| (a.name, a.pods)).collect();
    let originals: Vec<Pod> =
        rk::wait_running(&c, &ns, &node, &wanted, Duration::from_secs(180)).await;
    let endpoint = format!("unix://{}", f.kubelet.dir.join("containerd.sock").display());
    let containers = rk::ContainerWatch::start(&endpoint);
    let on_node = rk::NodeGone::start(&f.kubelet);
    f.node.boot_connected();
    let load_before = realk8s::load_average();

    let container = f.node.shutdown("poweroff", Duration::from_secs(300));
    let (signal, release) = signal_and_release(&container);
    // The audit log is written as requests complete; let the last lines land.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ours: Vec<Request> = f
        .nodegrace_requests()
        .into_iter()
        .filter(|r| r.received >= signal && r.received <= release)
        .collect();
    let kubelets = f.kubelet_requests();
    let ran = containers.seen();
    // A container the watch last saw running and the runtime no longer has ended and was
    // removed between two of its looks (200 ms apart): its end is not known, not wrong.
    let running_now: std::collections::BTreeSet<String> = rk::containers(&endpoint)
        .await
        .into_iter()
        .filter(|c| c.state == nodegrace::v1::ContainerState::ContainerRunning as i32)
        .map(|c| c.id)
        .collect();
    let mut unseen_exits = Vec::new();
    let seen = watch.seen();
    let gated = container
        .journal_of("nodegrace")
        .iter()
        .find(|l| l.contains("static pod manifest gated"))
        .map(|l| l.time);
    let mirror = format!("etcd-{node}");

    let mut wrong = Vec::new();
    let mut times: BTreeMap<String, PodTimes> = BTreeMap::new();
    let (mut escalations, mut evicted_twice) = (0, 0);
    for p in &originals {
        let name = p.name_any();
        let a = app(&app_of(p));
        let evictions = ours
            .iter()
            .filter(|r| r.name == name && rk::is_eviction(r))
            .count();
        let deletes = ours
            .iter()
            .filter(|r| r.name == name && rk::is_pod_delete(r))
            .count();
        let asked = match a.kind {
            Kind::Static => gated,
            Kind::DaemonSet => rk::first(&ours, &name, rk::is_pod_delete).map(|r| r.received),
            Kind::Deployment => rk::first(&ours, &name, rk::is_eviction).map(|r| r.received),
        };
        // nodegrace deletes the static pod's mirror once the node shows it gone: no escalation.
        if a.kind == Kind::Deployment && deletes > 0 {
            escalations += 1;
        }
        if evictions > 1 {
            evicted_twice += 1;
        }
        match a.kind {
            Kind::Deployment if evictions != 1 || deletes != 0 => wrong.push(format!(
                "{name}: evicted {evictions}×, DELETEd {deletes}× (once, never)"
            )),
            Kind::DaemonSet if deletes != 1 => {
                wrong.push(format!("{name}: DELETEd {deletes}× (once)"))
            }
            Kind::Static if gated.is_none() => {
                wrong.push(format!("{name}: its manifest was never gated"))
            }
            _ => {}
        }
        let mine: Vec<&rk::Ctr> = ran.iter().filter(|c| c.pod == name).collect();
        let exited: Vec<&&rk::Ctr> = mine
            .iter()
            .filter(|c| c.state == nodegrace::v1::ContainerState::ContainerExited as i32)
            .collect();
        let end_unseen = mine.len() == 1
            && exited.is_empty()
            && mine[0].state == nodegrace::v1::ContainerState::ContainerRunning as i32
            && !running_now.contains(&mine[0].id);
        if end_unseen {
            unseen_exits.push(name.clone());
        } else if mine.len() != 1 || exited.len() != 1 || exited[0].exit_code != 0 {
            wrong.push(format!(
                "{name}: containers {:?} (one, exited 0 on its own after SIGTERM)",
                mine.iter()
                    .map(|c| (c.attempt, c.state, c.exit_code))
                    .collect::<Vec<_>>()
            ));
        }
        let exit = exited.iter().map(|c| c.finished).reduce(f64::max);
        if name != mirror {
            let s = seen.get(&p.uid().unwrap_or_default());
            let (deleted, own) = (
                s.and_then(|s| s.deletion_grace),
                s.and_then(|s| s.termination_grace),
            );
            if deleted != own {
                wrong.push(format!(
                    "{name}: deleted with grace {deleted:?}, its own is {own:?}"
                ));
            }
        }
        let node_uid = p
            .annotations()
            .get("kubernetes.io/config.mirror")
            .cloned()
            .unwrap_or_else(|| p.uid().unwrap_or_default());
        times.insert(
            name.clone(),
            PodTimes {
                asked,
                sigterm: exit.map(|e| e - a.exit_ms as f64 / 1000.0),
                exited: exit,
                left_node: on_node.gone(&node_uid),
                api_stopped: rk::stopped(&kubelets, &ours, &name, &mirror),
            },
        );
    }

    let total = release - signal;
    let ideal = ideal();
    println!(
        "signal → release {total:.2} s, ideal {ideal:.1} s, total − ideal {:.2} s (host load average {load_before} at the poweroff, {} after)",
        total - ideal,
        realk8s::load_average()
    );
    println!(
        "per band, s after the signal: first asked, first SIGTERM (exit − exit time), last container exit, last pod off the node (containers and volumes), the kubelet's writes showing its last pod stopped; gap: first asked − previous band's last exit"
    );
    println!(
        "  {:<36} {:>4} {:>7} {:>8} {:>9} {:>9} {:>9} {:>6}",
        "band", "pods", "asked", "SIGTERM", "last exit", "off node", "API", "gap"
    );
    let mut previous_exit = Some(signal);
    // Where total − ideal went: nodegrace's handovers (the previous band off the node, or the
    // signal, → the band's first ask), the kubelet's and the runtime's part of each band's
    // exit (first ask → last exit, less the band's slowest exit time), the kubelet's teardown
    // (last exit → off the node); the end is the last band off the node → release.
    let (mut handover, mut beyond_exit, mut teardown) = (0.0, 0.0, 0.0);
    let mut previous_off = signal;
    for (b, label) in BANDS.iter().enumerate() {
        let members: Vec<&PodTimes> = originals
            .iter()
            .filter(|p| app(&app_of(p)).band == b)
            .filter_map(|p| times.get(&p.name_any()))
            .collect();
        let asked = min_of(members.iter().map(|t| t.asked));
        let last_exit = max_of(members.iter().map(|t| t.exited));
        let gap = asked
            .zip(previous_exit)
            .map_or_else(|| "—".to_owned(), |(a, e)| format!("{:.2}", a - e));
        println!(
            "  {:<36} {:>4} {:>7} {:>8} {:>9} {:>9} {:>9} {:>6}",
            format!("{b} {label}"),
            members.len(),
            at(asked, signal),
            at(min_of(members.iter().map(|t| t.sigterm)), signal),
            at(last_exit, signal),
            at(max_of(members.iter().map(|t| t.left_node)), signal),
            at(max_of(members.iter().map(|t| t.api_stopped)), signal),
            gap
        );
        if let (Some(a), Some(e)) = (asked, previous_exit) {
            if b > 0 && a < e - 0.1 {
                wrong.push(format!(
                    "band {b} asked {:.2} s before band {} had exited",
                    e - a,
                    b - 1
                ));
            }
        }
        let off = max_of(members.iter().map(|t| t.left_node)).unwrap_or(f64::NAN);
        let asked = asked.unwrap_or(f64::NAN);
        let exited = last_exit.unwrap_or(f64::NAN);
        handover += asked - previous_off;
        beyond_exit += exited - asked - slowest_exit(b);
        teardown += off - exited;
        previous_exit = last_exit;
        previous_off = off;
    }
    let api_last = originals
        .iter()
        .filter(|p| app(&app_of(p)).band == BANDS.len() - 1)
        .filter_map(|p| times.get(&p.name_any())?.api_stopped)
        .reduce(f64::max)
        .unwrap_or(f64::NAN);
    println!(
        "  last exit → release {}",
        at(Some(release), previous_exit.unwrap_or(release))
    );
    println!(
        "where total − ideal went (s): nodegrace's handovers {handover:.2}; asked → exit beyond the exit times {beyond_exit:.2} (the kubelet's SIGTERM, the container's exit); the kubelet's teardown {teardown:.2} (last exit → off the node); the end {:.2} (last band off the node → the API shows it {:.2} → released {:.2})",
        release - previous_off,
        api_last - previous_off,
        release - api_last
    );
    let pods = originals.len();
    println!(
        "nodegrace's requests from the signal to the release: {} ({:.2} per pod, {pods} pods)",
        ours.len(),
        ours.len() as f64 / pods as f64
    );
    for (kind, count) in audit::count_by_kind(&ours) {
        println!("  {count:>4} {:>6.2}  {kind}", count as f64 / pods as f64);
    }
    println!("escalations (DELETE of a Deployment's pod): {escalations}; pods evicted twice: {evicted_twice}");
    if !unseen_exits.is_empty() {
        println!("exit not seen (the container removed between two looks of the watch): {unseen_exits:?}");
    }
    if wrong.is_empty() {
        println!("every pod stopped once with its grace, band after band: yes");
    } else {
        println!("WRONG RUN:");
        for w in &wrong {
            println!("  {w}");
        }
    }
    drop(containers);
    drop(on_node);
    drop(watch);
    drop(container);
    f.cleanup().await;
    Outcome {
        total,
        requests: ours.len(),
        escalations,
        evicted_twice,
        wrong,
    }
}

fn spread(values: &[f64]) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match (v.get(v.len() / 2), v.first(), v.last()) {
        (Some(mid), Some(lo), Some(hi)) => format!("{mid:.2} ({lo:.2}–{hi:.2})"),
        _ => "—".to_owned(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = realk8s::env_or("BENCH_RUNS", 1);
    real::require_prerequisites();
    let binary = real::nodegrace_binary();
    let commit = realk8s::commit();
    let pods: usize = APPS.iter().map(|a| a.pods).sum();
    println!(
        "bench_real_kubelet: {pods} pods in {} bands on a real kubelet v1.28.4: {}; ideal {:.1} s",
        BANDS.len(),
        APPS.iter()
            .map(|a| format!(
                "{} ×{} ({:.1} s, band {})",
                a.name,
                a.pods,
                a.exit_ms as f64 / 1000.0,
                a.band
            ))
            .collect::<Vec<_>>()
            .join(", "),
        ideal()
    );
    println!(
        "  nodegrace {} (commit {commit}), shipped unit, configuration and CRDs",
        binary.display()
    );
    let mut all = Vec::new();
    for n in 1..=runs {
        all.push(run(n, runs).await);
    }
    let ideal = ideal();
    println!("\n{runs} runs, median (min–max):");
    let totals: Vec<f64> = all.iter().map(|o| o.total).collect();
    let over: Vec<f64> = all.iter().map(|o| o.total - ideal).collect();
    let per_pod: Vec<f64> = all
        .iter()
        .map(|o| o.requests as f64 / pods as f64)
        .collect();
    println!("  signal → release: {} s", spread(&totals));
    println!("  total − ideal ({ideal:.1} s): {} s", spread(&over));
    println!("  nodegrace's requests per pod: {}", spread(&per_pod));
    println!(
        "  escalations {:?}, pods evicted twice {:?}, wrong runs {}",
        all.iter().map(|o| o.escalations).collect::<Vec<_>>(),
        all.iter().map(|o| o.evicted_twice).collect::<Vec<_>>(),
        all.iter().filter(|o| !o.wrong.is_empty()).count()
    );
}
