//! The offline fallback on a real containerd: 100 containers in 3 bands with short graces.
//!
//!     cargo run --release --example bench_fallback   (as root; containerd, runc, busybox-static)
//!     BENCH_PODS_PER_BAND=1 cargo run ...              (a smaller node: 3 pods, 12 containers)
//!
//! Prints the time from the fallback decision to the first StopContainer and the total time
//! minus the ideal (the sum over bands of the slowest container's own exit time), and splits
//! that overhead into what the runtime spent delivering signals and reporting exits and what
//! is left for nodegrace. It also prints the CPU the machine spent during the run beside this
//! process's own: when the runtime's work for the stops exceeds what the cores can do within
//! the ideal, no drain can reach it, and the last line says by how much.

#[path = "../tests/real/harness.rs"]
mod harness;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use harness::{bands, cached, script, Containerd, OnTerm, PodSpec};
use nodegrace::{
    Container, CriError, Fallback, FallbackOptions, PodCache, PodOutcome, PodSandbox, Runtime,
    RuntimeVersion,
};

/// The real client, noting when the first StopContainer went out.
struct Timed<R> {
    inner: R,
    first_stop: Mutex<Option<Instant>>,
}

#[async_trait]
impl<R: Runtime> Runtime for Timed<R> {
    fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }
    async fn version(&self) -> Result<RuntimeVersion, CriError> {
        self.inner.version().await
    }
    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>, CriError> {
        self.inner.list_pod_sandboxes().await
    }
    async fn list_containers(&self, sandbox_id: Option<&str>) -> Result<Vec<Container>, CriError> {
        self.inner.list_containers(sandbox_id).await
    }
    async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        self.first_stop
            .lock()
            .unwrap()
            .get_or_insert_with(Instant::now);
        self.inner.stop_container(id, grace).await
    }
    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        self.inner.stop_pod_sandbox(id).await
    }
}

/// (priority, band grace s) and, per band, pods of 4 containers.
const BANDS: [(i32, f64, usize); 3] = [(0, 2.0, 9), (10_000, 2.0, 8), (2_000_000_000, 2.0, 8)];
/// What the 4 containers of a pod do on SIGTERM.
const EXIT_DELAYS: [f64; 4] = [0.0, 0.2, 0.4, 0.6];
/// One pod per band ignores SIGTERM with a 1 s grace of its own: killed after 1 s.
const KILLED_AFTER: f64 = 1.0;

fn main() {
    harness::require();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

async fn bench() {
    let ctd = Containerd::start();
    let setup = Instant::now();
    let mut cache = PodCache::default();
    let mut marks = Vec::new();
    let mut pod_no = 0;
    let pods_override: Option<usize> = std::env::var("BENCH_PODS_PER_BAND")
        .ok()
        .map(|v| v.parse().expect("BENCH_PODS_PER_BAND: a number"));
    for (band_no, &(priority, _, pods)) in BANDS.iter().enumerate() {
        let pods = pods_override.unwrap_or(pods);
        for k in 0..pods {
            pod_no += 1;
            let name = format!("b{band_no}-p{k}");
            let uid = format!("uid-{name}");
            let stubborn = k == 0;
            let grace = if stubborn { KILLED_AFTER as i64 } else { 30 };
            cache
                .pods
                .push(cached("bench", &name, &uid, priority, grace));
            let containers = EXIT_DELAYS
                .iter()
                .enumerate()
                .map(|(c, &d)| {
                    let mark = format!("{name}-c{c}");
                    let on_term = if stubborn && c == 0 {
                        OnTerm::Ignore
                    } else {
                        OnTerm::ExitAfter(d)
                    };
                    marks.push(mark.clone());
                    (format!("c{c}"), script(&mark, on_term))
                })
                .collect();
            ctd.run_pod(&PodSpec {
                namespace: "bench".into(),
                name,
                uid,
                containers,
            })
            .await;
        }
    }
    ctd.wait_started(&marks).await;
    println!(
        "setup: {} pods, {} containers started in {:.1?} ({} snapshotter)",
        pod_no,
        marks.len(),
        setup.elapsed(),
        ctd.snapshotter
    );

    let quiet = machine_busy();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_rate = (machine_busy() - quiet) / 2.0;
    println!("before the run, all containers up: machine CPU {idle_rate:.2} s per s");
    let runtime = Arc::new(Timed {
        inner: ctd.client(),
        first_stop: Mutex::new(None),
    });
    let fallback = Fallback::new(
        runtime.clone(),
        None,
        None,
        FallbackOptions {
            node: "bench".into(),
            bands: bands(&BANDS.map(|(p, g, _)| (p, g))),
            stop_kubelet: false,
            kubelet_unit: String::new(),
            kubelet_timeout: Duration::from_secs(5),
            band_slack: Duration::from_secs(2),
            list_retry: Duration::from_secs(1),
            sandbox_wait: Duration::from_secs(10),
            restart_watch: Duration::from_secs(30),
        },
    );
    let ctd_pid = ctd.pid().to_string();
    let ((busy_before, steal_before), own_before, ctd_before) =
        (machine_cpu(), own_cpu(), process_cpu(&ctd_pid));
    let decision_uptime = harness::host_uptime();
    let decision_wall = chrono::Utc::now();
    let decision = Instant::now();
    let report = fallback.run(&cache).await;
    let total = decision.elapsed();
    let (busy_after, steal_after) = machine_cpu();
    let (busy, steal, own, ctd_cpu) = (
        busy_after - busy_before,
        steal_after - steal_before,
        own_cpu() - own_before,
        process_cpu(&ctd_pid) - ctd_before,
    );
    let first_stop = runtime
        .first_stop
        .lock()
        .unwrap()
        .expect("no StopContainer was sent")
        - decision;

    // A loaded machine can push a band past its time (grace + slack): such pods are
    // reported, and the figures below are then not clean.
    for p in report
        .pods
        .iter()
        .filter(|p| p.outcome != PodOutcome::Stopped)
    {
        println!("NOT CLEAN: {} {:?} {:?}", p.name, p.outcome, p.errors);
    }
    for e in &report.errors {
        println!("NOT CLEAN: {e}");
    }
    for m in marks
        .iter()
        .filter(|m| ctd.uptime_mark(&format!("{m}.term")).is_none())
    {
        println!("NOT CLEAN: {m} got no SIGTERM");
    }

    // Per band: when the runtime had delivered every SIGTERM, when the slowest container
    // exited (its own time would be the ideal), and how long the runtime then took to answer
    // StopContainer. What is left of total - ideal is nodegrace's (and the final sandbox wait).
    let slowest_own = KILLED_AFTER.max(EXIT_DELAYS.iter().cloned().fold(0.0, f64::max));
    let ideal = Duration::from_secs_f64(slowest_own * BANDS.len() as f64);
    let (mut exit_late, mut reply_lag) = (Duration::ZERO, Duration::ZERO);
    let mut client = ctd.client().raw();
    for b in &report.bands {
        let pods: Vec<_> = report
            .pods
            .iter()
            .filter(|p| p.band == b.priority)
            .collect();
        let band_start_uptime = decision_uptime + b.started_after.as_secs_f64();
        let band_start_ns =
            decision_wall.timestamp_nanos_opt().unwrap() + b.started_after.as_nanos() as i64;
        let last_term = pods
            .iter()
            .flat_map(|p| (0..EXIT_DELAYS.len()).map(move |c| format!("{}-c{c}.term", p.name)))
            .filter_map(|m| ctd.uptime_mark(&m))
            .fold(f64::MIN, f64::max);
        let mut last_exit_ns = 0;
        for id in pods.iter().flat_map(|p| p.containers.iter()) {
            let st = client
                .container_status(nodegrace::v1::ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                })
                .await
                .expect("ContainerStatus")
                .into_inner()
                .status
                .expect("status");
            last_exit_ns = last_exit_ns.max(st.finished_at);
        }
        let last_exit = Duration::from_nanos((last_exit_ns - band_start_ns).max(0) as u64);
        let length = b.ended_after.unwrap() - b.started_after;
        exit_late += last_exit.saturating_sub(Duration::from_secs_f64(slowest_own));
        reply_lag += length.saturating_sub(last_exit);
        println!(
            "band {:>10}: {:>2} pods, {:>3} containers; every SIGTERM delivered after {:.2} s; last exit after {:.3?} (own {:.1} s); band ended after {:.3?}",
            b.priority,
            b.pods,
            pods.iter().map(|p| p.containers.len()).sum::<usize>(),
            last_term - band_start_uptime,
            last_exit,
            slowest_own,
            length,
        );
    }
    let overhead = total.saturating_sub(ideal);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average: {}", load.trim());
    println!("decision -> first StopContainer: {first_stop:.3?}");
    println!(
        "total: {total:.3?}, ideal: {ideal:.3?}, total - ideal: {overhead:.3?} (target < 300 ms)"
    );
    println!(
        "  runtime, signal delivery and kills (last exit - own time, summed): {exit_late:.3?}"
    );
    println!("  runtime, exit -> StopContainer reply (summed): {reply_lag:.3?}");
    println!(
        "  CPU during the run: machine {busy:.2} s (of which stolen by the hypervisor {steal:.2} s) of {:.2} s available ({} cores); containerd itself {ctd_cpu:.2} s; this process (nodegrace + bench) {own:.3} s",
        total.as_secs_f64() * cores() as f64,
        cores()
    );
    let work = busy - own - idle_rate * total.as_secs_f64();
    println!(
        "  CPU the stops cost (machine - this process - the idle rate before): {work:.2} s, so on {} cores no run can be shorter than {:.3} s",
        cores(),
        work / cores() as f64
    );
    let last_band_end = report
        .bands
        .last()
        .and_then(|b| b.ended_after)
        .unwrap_or_default();
    println!(
        "  final wait for sandbox teardown after the last band: {:.3?}",
        total.saturating_sub(last_band_end)
    );
    println!(
        "  the rest (nodegrace: listing, between bands): {:.3?}",
        overhead.saturating_sub(exit_late + reply_lag + total.saturating_sub(last_band_end))
    );
    ctd.remove_all_pods().await;
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// Seconds every CPU spent neither idle nor waiting (busy, of which stolen by the
/// hypervisor), from /proc/stat.
fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let at = |i: usize| fields.get(i).copied().unwrap_or(0.0);
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy: f64 = fields.iter().take(8).sum::<f64>() - at(3) - at(4);
    (busy / clock_ticks(), at(7) / clock_ticks())
}

fn machine_busy() -> f64 {
    machine_cpu().0
}

/// User + system CPU seconds of this process.
fn own_cpu() -> f64 {
    process_cpu("self")
}

/// User + system CPU seconds of process `pid` ("self" for this one).
fn process_cpu(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<f64> = after_comm
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // utime and stime are fields 14 and 15; after "pid (comm)" that is index 11 and 12.
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / clock_ticks()
}
