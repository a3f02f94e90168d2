//! Shutdown drain of a node of the real control plane (`../shared/realk8s/`, kube-apiserver
//! v1.28.4) by the real daemon: an nspawn node running nodegrace as the package installs it
//! (shipped unit and configuration, 15 min budget), the real-cluster tier's kubelet stand-in,
//! N pods from plain Deployments and DaemonSets in 4 consecutive bands of the shipped drain
//! plan (Default pods at priority 0, system-cluster-critical, system-node-critical; DaemonSet
//! pods), every pod exiting a fixed time after its deletion. Then `systemctl poweroff`.
//!
//! Prints the timeline from logind's "The system will power off now" (NodeMaintenance
//! created, cordoned, first eviction, release), total − ideal (ideal = the sum over bands of
//! the slowest pod's exit time), nodegrace's requests by kind from the apiserver's audit log
//! between the signal and the release, conflicts and other failures, escalations, pods
//! evicted twice, the daemon's CPU time and peak RSS (host /proc), each band's timing and the
//! kubelet stand-in's own lag — with the targets of issue 10 beside them, not asserted.
//!
//! As root, with the control plane's scripts at `../shared/realk8s` (or `$NODEGRACE_REALK8S`;
//! started if not running, never stopped):
//!
//! ```sh
//! cargo build --release --bin nodegrace    # or set NODEGRACE_TEST_BINARY
//! cargo run --release --example bench_real_drain                   # 110 pods
//! BENCH_PODS=250 cargo run --release --example bench_real_drain
//! BENCH_DIRECT=1 cargo run --release --example bench_real_drain    # direct Eviction API path
//! BENCH_RESPONDERS=1 cargo run --release --example bench_real_drain # the responder path
//! ```
//!
//! `BENCH_FAULT=apiserver-around-signal|apiserver-first-band|etcd-first-band` kills the
//! apiserver (or etcd) around the poweroff and starts it again, and prints total − ideal −
//! outage (it stops the shared control plane: run it alone). `BENCH_FAULT=throttled` has API
//! Priority and Fairness reject what does not fit in one concurrency share of the node's
//! requests (429) during the drain; it stops nothing.
//! `BENCH_PODS` (default 110, at least 4), `BENCH_EXIT_MS` (default 1000), `BENCH_VERBOSE=1`
//! (every pod's timeline too).
//! `BENCH_DIRECT=1` measures the direct Eviction API path where `lifecycle.k8s.io` is not
//! served: it deletes the tests' EvictionRequest CRDs (and with them every EvictionRequest)
//! before the node boots and applies the cluster side again at the end, so it **needs the
//! control plane to itself** — run it only when no other test uses the control plane (no
//! `ng-` nspawn containers). By default `lifecycle.k8s.io` is served (the tests' CRDs) and no
//! pod declares a responder: every pod goes through the Eviction API too.
//! `BENCH_RESPONDERS=1` measures the responder path: every Deployment pod declares one
//! responder ([`RESPONDER`], in `spec.evictionResponders` as the daemon sees it through the
//! test kit's [`RespondersProxy`]), so each gets nodegrace's EvictionRequest, and the test
//! kit's stand-in of the cluster's controllers ([`StandInControllers`]) makes its Eviction.
//! The operator is played by [`Responder`]: one with nothing to move for these pods, which,
//! once its entry of a pod's Eviction is Active, writes it started and completed in one
//! status write and so hands the pod over to the imperative evictor, which calls the
//! Eviction API (as the cluster's controller, not as the node: those evictions are not
//! among nodegrace's requests). A responder nobody serves would hold its pod for
//! the 20-minute heartbeat deadline (the drain escalates it first), not a path an operator
//! takes. DaemonSet pods are DELETEd by the drain whatever they declare. The requests are
//! also split by the pods they are about (the pod, its EvictionRequest `nodegrace-<uid>`, its
//! Eviction `pod-<n>-<name>`).

#[path = "../tests/real/mod.rs"]
mod real;
#[path = "../tests/realk8s/mod.rs"]
mod realk8s;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::lifecycle::v1alpha1::Eviction;
use kube::api::PostParams;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use realk8s::audit::{self, Request};
use realk8s::fixture::{app_of, signal_and_release, Fixture};
use realk8s::lifecycle::{StandInControllers, CONTROLLERS_USER};
use realk8s::responders_proxy::RespondersProxy;
use realk8s::workload::{self, PodShape};
use realk8s::ControlPlane;

/// The bands, in drain order: the shipped plan puts Default pods up to 1e9, up to 2e9
/// (system-cluster-critical) and up to 2000001000 (system-node-critical) before DaemonSet
/// pods. User priority classes cannot exceed 1e9, so a fourth Default band is out of reach.
const BANDS: [(&str, Option<&str>, bool); 4] = [
    ("Default, priority 0", None, false),
    (
        "Default, system-cluster-critical",
        Some("system-cluster-critical"),
        false,
    ),
    (
        "Default, system-node-critical",
        Some("system-node-critical"),
        false,
    ),
    ("DaemonSet, priority 0", None, true),
];
/// The responder every Deployment pod declares with `BENCH_RESPONDERS=1`.
const RESPONDER: &str = "db-operator.example.com/operator";
/// Replicas per Deployment (a band of 28 pods is 3 Deployments).
const REPLICAS: usize = 10;
/// Quiet time after every pod runs, also the window of the idle request count.
const IDLE: Duration = Duration::from_secs(5);

/// `b<band>-<n>`: the app label of every workload, which names its band.
fn band_of_app(app: &str) -> Option<usize> {
    app.strip_prefix('b')?.split('-').next()?.parse().ok()
}

/// Other nspawn nodes of the real tiers running now (`--machine=ng-…`), besides `ours`.
fn other_nodes(ours: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !args.first().is_some_and(|a| a.ends_with("systemd-nspawn")) {
            continue;
        }
        if let Some(machine) = args.iter().find_map(|a| a.strip_prefix("--machine=")) {
            if machine.starts_with("ng-") && machine != format!("ng-{ours}") {
                found.push(machine.to_owned());
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The direct Eviction API path: the tests' `lifecycle.k8s.io` CRDs are absent while this
/// lives; the cluster side (CRDs included) is applied again when it goes.
struct WithoutEvictionRequests {
    cp: &'static ControlPlane,
}

impl WithoutEvictionRequests {
    async fn new(cp: &'static ControlPlane) -> Self {
        cp.kubectl_ok(&[
            "delete",
            "crd",
            "evictionrequests.lifecycle.k8s.io",
            "evictions.lifecycle.k8s.io",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ]);
        let guard = WithoutEvictionRequests { cp };
        let client = cp.admin().await;
        for _ in 0..300 {
            let lifecycle = client
                .list_api_group_resources("lifecycle.k8s.io/v1alpha1")
                .await
                .is_ok_and(|l| !l.resources.is_empty());
            if !lifecycle {
                return guard;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the EvictionRequest API is still served after its CRD was deleted");
    }
}

impl Drop for WithoutEvictionRequests {
    fn drop(&mut self) {
        self.cp.apply_cluster_side();
        eprintln!("EvictionRequest CRDs applied again (tests/data/lifecycle.k8s.io)");
    }
}

/// The stand-in for [`RESPONDER`]'s operator: whenever its entry of an Eviction in `ns` is
/// Active and not complete, one status write with its start, heartbeat and completion (the
/// resourceVersion read, so a write of the controller's meanwhile is never lost: a refused
/// one waits for the next watch event). Counts its writes and the refused ones.
struct Responder {
    writes: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Responder {
    fn start(admin: &Client, ns: &str) -> Responder {
        let api: Api<Eviction> = Api::namespaced(admin.clone(), ns);
        let writes: Arc<AtomicUsize> = Arc::default();
        let refused: Arc<AtomicUsize> = Arc::default();
        let (w, r) = (writes.clone(), refused.clone());
        let task = tokio::spawn(async move {
            let mut events = watcher(api.clone(), watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(eviction) = event else { continue };
                let Some(done) = completed_by_us(&eviction) else {
                    continue;
                };
                w.fetch_add(1, Ordering::Relaxed);
                if api
                    .replace_status(&eviction.name_any(), &PostParams::default(), &done)
                    .await
                    .is_err()
                {
                    r.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Responder {
            writes,
            refused,
            task,
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `eviction` with [`RESPONDER`]'s entry (the controller lists every target responder in
/// `status.responders`) started and completed now, when that responder is Active and its
/// entry not complete yet.
fn completed_by_us(eviction: &Eviction) -> Option<Eviction> {
    let status = eviction.status.as_ref()?;
    let active = status
        .target_responders
        .iter()
        .flatten()
        .any(|t| t.name == RESPONDER && t.state == "Active");
    if !active {
        return None;
    }
    let mut done = eviction.clone();
    let mine = done
        .status
        .as_mut()?
        .responders
        .iter_mut()
        .flatten()
        .find(|r| r.name == RESPONDER && r.completion_time.is_none())?;
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    mine.start_time.get_or_insert_with(|| now.clone());
    mine.heartbeat_time = Some(now.clone());
    mine.completion_time = Some(now);
    mine.message = Some("nothing to move: handed over".to_owned());
    Some(done)
}

#[derive(Clone, Copy)]
struct Sample {
    at: f64,
    usage: real::ProcUsage,
}

/// Samples the process every 20 ms until it is gone or `stop` is set.
fn sample(pid: i32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<Sample>> {
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        while let Some(usage) = real::proc_usage(pid) {
            samples.push(Sample {
                at: realk8s::now_unix(),
                usage,
            });
            if stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        samples
    })
}

/// One original pod of the node.
struct PodInfo {
    name: String,
    uid: String,
    band: usize,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// `median 80 ms, p90 237 ms, max 338 ms`.
fn stats(v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "median {}, p90 {}, max {}",
        ms(percentile(v, 0.5)),
        ms(percentile(v, 0.9)),
        ms(percentile(v, 1.0))
    )
}

fn ms(seconds: f64) -> String {
    // + 0.0 turns -0 into 0.
    format!("{:.0} ms", (seconds * 1000.0).round() + 0.0)
}

fn secs(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "—".to_owned(), |s| format!("{s:.3} s"))
}

fn is_ask(r: &Request, pod: &PodInfo) -> bool {
    (r.verb == "create"
        && r.resource == "evictionrequests"
        && (r.name == pod.uid || r.name == format!("nodegrace-{}", pod.uid)))
        || (r.resource == "pods"
            && r.name == pod.name
            && ((r.verb == "create" && r.subresource == "eviction")
                || (r.verb == "delete" && r.subresource.is_empty())))
}

/// The accepted eviction (201) or DELETE (200) of the pod.
fn is_accepted_termination(r: &Request, pod: &PodInfo) -> bool {
    r.resource == "pods"
        && r.name == pod.name
        && ((r.verb == "create" && r.subresource == "eviction" && r.code == 201)
            || (r.verb == "delete" && r.subresource.is_empty() && r.code == 200))
}

/// The stand-in's DELETE that removed `pod`: the last one with the kubelet's identity
/// (nodegrace deletes DaemonSet pods with that identity too, earlier).
fn final_delete<'a>(kubelet: &'a [Request], pod: &PodInfo) -> Option<&'a Request> {
    kubelet
        .iter()
        .filter(|r| {
            r.verb == "delete" && r.resource == "pods" && r.name == pod.name && r.code == 200
        })
        .max_by(|a, b| a.received.total_cmp(&b.received))
}

/// `BENCH_FAULT` values: the apiserver killed 1 s before the poweroff; the apiserver, or
/// etcd, killed once the first band was asked to go (each started again at once, up.sh);
/// API Priority and Fairness throttling the node's requests (429) from before the poweroff.
const FAULTS: [&str; 4] = [
    "apiserver-around-signal",
    "apiserver-first-band",
    "etcd-first-band",
    "throttled",
];

/// `systemctl poweroff` with `fault` injected; returns the exited node and how long the
/// control plane was away (from the kill until up.sh saw the apiserver ready).
async fn poweroff_with_fault(f: &mut Fixture, fault: &str) -> (real::Container, f64) {
    let mut c = f.node.container.take().expect("booted");
    if fault == "throttled" {
        f.cp.throttle(&f.name);
        let _ = c.exec(&["systemctl", "poweroff"]);
        let exited = c.wait_exit(Duration::from_secs(20 * 60));
        f.cp.unthrottle(&f.name);
        exited.unwrap_or_else(|| panic!("no poweroff:\n{}", c.journal_text()));
        return (c, 0.0);
    }
    let killed = if fault == "apiserver-around-signal" {
        let at = realk8s::now_unix();
        f.cp.stop_apiserver();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = c.exec(&["systemctl", "poweroff"]);
        at
    } else {
        let _ = c.exec(&["systemctl", "poweroff"]);
        f.kubelet
            .wait_for(
                "the first band asked to go",
                Duration::from_secs(60),
                |r, _| r.iter().any(|r| r.stop_seen.is_some()),
            )
            .await;
        let at = realk8s::now_unix();
        if fault == "etcd-first-band" {
            f.cp.stop_etcd();
        } else {
            f.cp.stop_apiserver();
        }
        at
    };
    let cp = f.cp;
    tokio::task::spawn_blocking(move || cp.up())
        .await
        .expect("up.sh");
    let outage = realk8s::now_unix() - killed;
    tokio::task::spawn_blocking(move || cp.heal())
        .await
        .expect("up.sh");
    c.wait_exit(Duration::from_secs(20 * 60))
        .unwrap_or_else(|| panic!("no poweroff:\n{}", c.journal_text()));
    (c, outage)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pods: usize = realk8s::env_or("BENCH_PODS", 110);
    let exit_ms: u64 = realk8s::env_or("BENCH_EXIT_MS", 1000);
    let direct = std::env::var("BENCH_DIRECT").as_deref() == Ok("1");
    let responders = std::env::var("BENCH_RESPONDERS").as_deref() == Ok("1");
    assert!(
        !(direct && responders),
        "BENCH_DIRECT=1 has no EvictionRequests: BENCH_RESPONDERS=1 needs them"
    );
    let fault = std::env::var("BENCH_FAULT").ok().filter(|f| !f.is_empty());
    if let Some(fault) = &fault {
        assert!(
            FAULTS.contains(&fault.as_str()),
            "BENCH_FAULT must be one of {FAULTS:?}"
        );
    }
    assert!(pods >= BANDS.len(), "BENCH_PODS must be at least 4");
    real::require_prerequisites();
    let binary = real::nodegrace_binary();

    let cp = tokio::task::spawn_blocking(realk8s::control_plane)
        .await
        .expect("control plane");
    let without_requests = if direct {
        let others = other_nodes("");
        if !others.is_empty() {
            eprintln!("warning: BENCH_DIRECT=1 while other nodes run (their EvictionRequests go with the CRD): {others:?}");
        }
        Some(WithoutEvictionRequests::new(cp).await)
    } else {
        None
    };

    let mut f = Fixture::new("bench").await;
    let exit = exit_ms as f64 / 1000.0;
    let sizes: Vec<usize> = (0..BANDS.len())
        .map(|b| pods / BANDS.len() + usize::from(b < pods % BANDS.len()))
        .collect();
    let commit = realk8s::commit();
    println!(
        "bench_real_drain: {pods} pods in 4 bands {sizes:?}, each exiting {exit_ms} ms after its deletion; {} path",
        if direct {
            "direct Eviction API (EvictionRequest CRD absent)"
        } else if responders {
            "EvictionRequest, every Deployment pod declaring a responder that hands over at once"
        } else {
            "lifecycle.k8s.io served, no pod declaring a responder"
        }
    );
    println!(
        "  node {}, binary {} (commit {commit}), shipped config and unit, kube-apiserver v1.28.4",
        f.name,
        binary.display()
    );

    // The responder path: the pods' responders as 1.37 serves them, the cluster's controllers.
    let through = tempfile::NamedTempFile::new().expect("kubeconfig");
    let _responder_path = if responders {
        let identity = f.cp.nodegrace_identity(&f.name);
        let proxy = RespondersProxy::open(&identity).await;
        proxy.kubeconfig(&identity, through.path());
        f.node.use_kubeconfig(through.path().to_owned());
        Some((
            proxy,
            StandInControllers::for_namespace(f.cp, &f.name).await,
        ))
    } else {
        None
    };

    // The main future runs on its own thread: blocking here leaves the runtime's workers
    // to the kubelet stand-in.
    f.node.boot();

    let (client, ns, node) = (f.admin.clone(), f.name.clone(), f.name.clone());
    for (band, (_, class, daemonset)) in BANDS.iter().enumerate() {
        let mut left = sizes[band];
        let mut n = 0;
        while left > 0 {
            let app = format!("b{band}-{n}");
            let mut shape = PodShape::new(&app).exits_after_ms(exit_ms);
            if let Some(class) = class {
                shape = shape.priority(class);
            }
            if responders && !*daemonset {
                shape = shape.responded_by(RESPONDER);
            }
            if *daemonset {
                workload::daemonset(&client, &ns, &node, false, shape).await;
                left -= 1;
            } else {
                let replicas = left.min(REPLICAS);
                workload::deployment(&client, &ns, &node, replicas as i32, shape).await;
                left -= replicas;
            }
            n += 1;
        }
    }
    let created = realk8s::now_unix();
    let responder = responders.then(|| Responder::start(&client, &ns));
    f.kubelet
        .wait_for(
            &format!("{pods} pods running"),
            Duration::from_secs(600),
            |records, live| {
                live.len() == pods
                    && live.iter().all(|p| {
                        records.iter().any(|r| {
                            Some(r.uid.as_str()) == p.metadata.uid.as_deref()
                                && r.running_at.is_some()
                        })
                    })
            },
        )
        .await;
    println!(
        "  all {pods} pods running {:.1} s after their workloads were created",
        realk8s::now_unix() - created
    );
    let idle_from = realk8s::now_unix();
    tokio::time::sleep(IDLE).await;
    let idle_to = realk8s::now_unix();

    let originals: Vec<PodInfo> = f
        .kubelet
        .live_pods()
        .iter()
        .map(|p| PodInfo {
            name: p.name_any(),
            uid: p.uid().unwrap_or_default(),
            band: band_of_app(&app_of(p)).expect("a bench pod"),
        })
        .collect();
    let others = other_nodes(&f.name);
    let load_before = realk8s::load_average();
    let pid = f.node.nodegrace_pid();
    let before = real::proc_usage(pid).expect("nodegrace's /proc");
    let mappings = resident_by_mapping(pid);
    let connections = real::tcp_connections(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(pid, stop.clone());

    let (c, outage) = match fault.as_deref() {
        None => (
            f.node.shutdown("poweroff", Duration::from_secs(20 * 60)),
            None,
        ),
        Some(fault) => {
            let (c, outage) = poweroff_with_fault(&mut f, fault).await;
            (c, Some(outage))
        }
    };
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().expect("sampler");
    let (signal, release) = signal_and_release(&c);
    f.kubelet.stop();
    // The audit log is written as requests complete; let the last lines land.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let all = f.requests();
    let drain: Vec<Request> = all
        .iter()
        .filter(|r| r.received >= signal && r.received <= release)
        .cloned()
        .collect();
    // The cluster's side of the responder path: the stand-in's Evictions and evictions.
    let cluster: Vec<Request> = audit::requests_of(&f.cp.audit_log(), CONTROLLERS_USER, signal)
        .into_iter()
        .filter(|r| r.received <= release)
        .collect();
    // What terminated pods: nodegrace's requests and the cluster's evictions, in order.
    let mut terminating: Vec<Request> = drain.iter().chain(&cluster).cloned().collect();
    terminating.sort_by(|a, b| a.received.total_cmp(&b.received));
    let kubelet_reqs = audit::requests_of(
        &f.cp.audit_log(),
        &format!("system:node:{}", f.name),
        signal,
    );
    let records: HashMap<String, realk8s::kubelet::PodRecord> = f
        .kubelet
        .records()
        .into_iter()
        .map(|r| (r.uid.clone(), r))
        .collect();

    // Timeline.
    let first = |pred: &dyn Fn(&Request) -> bool| {
        drain.iter().find(|r| pred(r)).map(|r| r.received - signal)
    };
    let last_gone = originals
        .iter()
        .filter_map(|p| records.get(&p.uid)?.gone_at)
        .fold(f64::NAN, f64::max);
    let not_gone = originals
        .iter()
        .filter(|p| records.get(&p.uid).and_then(|r| r.gone_at).is_none())
        .count();
    let total = release - signal;
    let ideal = BANDS.len() as f64 * exit;
    println!();
    println!("timeline (s after logind's \"The system will power off now\")");
    println!(
        "  NodeMaintenance created       {}",
        secs(first(
            &|r| r.verb == "create" && r.resource == "nodemaintenances"
        ))
    );
    println!(
        "  cordoned (first Node patch)   {}",
        secs(first(&|r| (r.verb == "patch" || r.verb == "update")
            && r.resource == "nodes"
            && r.subresource.is_empty()))
    );
    if !direct {
        println!(
            "  first EvictionRequest created {}",
            secs(first(
                &|r| r.verb == "create" && r.resource == "evictionrequests"
            ))
        );
    }
    println!(
        "  first eviction                {}",
        secs(first(&|r| r.verb == "create" && r.subresource == "eviction"))
    );
    println!(
        "  last pod gone                 {}",
        secs(Some(last_gone - signal))
    );
    println!("  released (PHASE=Released)     {total:.3} s");
    if not_gone > 0 {
        println!("  ({not_gone} pods never went)");
    }
    let target = match pods {
        110 => " [target ≤ 500 ms at 110 pods]",
        250 => " [target ≤ 1 s at 250 pods]",
        _ => " [targets: ≤ 500 ms at 110 pods, ≤ 1 s at 250]",
    };
    println!(
        "total {total:.3} s, ideal {ideal:.3} s (4 bands × {exit_ms} ms), total − ideal {}{target}",
        ms(total - ideal)
    );
    if let (Some(fault), Some(outage)) = (&fault, outage) {
        println!(
            "fault {fault}: the control plane away {outage:.3} s; total − ideal − outage {}",
            ms(total - ideal - outage)
        );
    }
    println!(
        "released {} after the last pod was gone",
        ms(release - last_gone)
    );

    // Bands.
    println!();
    println!(
        "per band, in s after the signal as the apiserver received the requests (asked: the pod's"
    );
    println!("  EvictionRequest, eviction or DELETE; evicted: the accepted eviction or DELETE; gone: seen");
    println!(
        "  gone by the kubelet stand-in; gap: first asked − previous band's last gone), and the"
    );
    println!(
        "  apiserver's medians (evict: answering the accepted eviction/DELETE; remove: from the"
    );
    println!("  kubelet's final DELETE received to the pod seen gone)");
    println!(
        "  {:<34} {:>4} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "band", "pods", "asked", "…last", "evicted", "…last", "gone", "gap", "evict", "remove"
    );
    let mut previous_gone = signal;
    for (band, (label, _, _)) in BANDS.iter().enumerate() {
        let members: Vec<&PodInfo> = originals.iter().filter(|p| p.band == band).collect();
        let span = |pred: &dyn Fn(&Request, &PodInfo) -> bool| {
            members
                .iter()
                .filter_map(|p| terminating.iter().find(|r| pred(r, p)).map(|r| r.received))
                .fold((f64::NAN, f64::NAN), |(lo, hi), t| (lo.min(t), hi.max(t)))
        };
        let asked = span(&is_ask);
        let evicted = span(&is_accepted_termination);
        let gone = members
            .iter()
            .filter_map(|p| records.get(&p.uid)?.gone_at)
            .fold(f64::NAN, f64::max);
        let mut evict_latency: Vec<f64> = members
            .iter()
            .filter_map(|p| terminating.iter().find(|r| is_accepted_termination(r, p)))
            .map(|r| r.completed - r.received)
            .collect();
        let mut remove_latency: Vec<f64> = members
            .iter()
            .filter_map(|p| {
                Some(records.get(&p.uid)?.gone_at? - final_delete(&kubelet_reqs, p)?.received)
            })
            .collect();
        evict_latency.sort_by(f64::total_cmp);
        remove_latency.sort_by(f64::total_cmp);
        println!(
            "  {:<34} {:>4} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7} {:>7} {:>7}",
            format!("{band} {label}"),
            members.len(),
            asked.0 - signal,
            asked.1 - signal,
            evicted.0 - signal,
            evicted.1 - signal,
            gone - signal,
            ms(asked.0 - previous_gone),
            ms(percentile(&evict_latency, 0.5)),
            ms(percentile(&remove_latency, 0.5)),
        );
        previous_gone = gone;
    }
    if std::env::var("BENCH_VERBOSE").as_deref() == Ok("1") {
        println!("  per pod: band name asked evicted seen-by-kubelet removed-by-kubelet gone");
        for p in &originals {
            let at = |pred: &dyn Fn(&Request, &PodInfo) -> bool| {
                secs(
                    terminating
                        .iter()
                        .find(|r| pred(r, p))
                        .map(|r| r.received - signal),
                )
            };
            let removed = secs(final_delete(&kubelet_reqs, p).map(|r| r.received - signal));
            let record = records.get(&p.uid);
            println!(
                "    {} {} {} {} {} {removed} {}",
                p.band,
                p.name,
                at(&is_ask),
                at(&is_accepted_termination),
                secs(record.and_then(|r| r.stop_seen).map(|t| t - signal)),
                secs(record.and_then(|r| r.gone_at).map(|t| t - signal)),
            );
        }
    }

    // Where total − ideal went, along the pod that went last in each band: the pieces add
    // up to its band's time from the previous band's end (the signal for the first).
    println!();
    println!("where total − ideal went, along the last pod of each band (ms):");
    println!(
        "  nodegrace: handover (previous band gone → band's first asked), asking (→ that pod's"
    );
    println!("    accepted eviction/DELETE received); apiserver: answer (that request answered),");
    println!(
        "    removal (stand-in's final DELETE received → seen gone); stand-in: watch (answered →"
    );
    println!(
        "    seen), exit (seen → exit due, less the exit time), timer, request (sent → received)"
    );
    println!(
        "  {:<6} {:>9} {:>7} {:>7} {:>8} {:>6} {:>5} {:>6} {:>8} {:>7}",
        "band",
        "handover",
        "asking",
        "answer",
        "removal",
        "watch",
        "exit",
        "timer",
        "request",
        "excess"
    );
    let mut previous_gone = signal;
    let mut sums = [0f64; 9];
    for band in 0..BANDS.len() {
        let members: Vec<&PodInfo> = originals.iter().filter(|p| p.band == band).collect();
        let first_asked = members
            .iter()
            .filter_map(|p| drain.iter().find(|r| is_ask(r, p)).map(|r| r.received))
            .fold(f64::NAN, f64::min);
        let Some((last, record, gone)) = members
            .iter()
            .filter_map(|p| {
                let record = records.get(&p.uid)?;
                Some((*p, record, record.gone_at?))
            })
            .max_by(|a, b| a.2.total_cmp(&b.2))
        else {
            continue;
        };
        let accepted = terminating
            .iter()
            .find(|r| is_accepted_termination(r, last));
        let removed = final_delete(&kubelet_reqs, last);
        let (Some(accepted), Some(removed), Some(seen), Some(due), Some(exited)) = (
            accepted,
            removed,
            record.stop_seen,
            record.exit_due,
            record.exited_at,
        ) else {
            continue;
        };
        let parts = [
            first_asked - previous_gone,
            accepted.received - first_asked,
            accepted.completed - accepted.received,
            gone - removed.received,
            seen - accepted.completed,
            due - seen - exit,
            exited - due,
            removed.received - exited,
            gone - previous_gone - exit,
        ];
        for (sum, part) in sums.iter_mut().zip(parts) {
            *sum += part;
        }
        let cells: Vec<String> = parts
            .iter()
            .map(|p| format!("{:.0}", (p * 1000.0).round() + 0.0))
            .collect();
        println!(
            "  {band:<6} {:>9} {:>7} {:>7} {:>8} {:>6} {:>5} {:>6} {:>8} {:>7}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8]
        );
        previous_gone = gone;
    }
    println!(
        "  in all: nodegrace {} (handover + asking) + {} (last pod gone → release); apiserver {}; kubelet stand-in {}",
        ms(sums[0] + sums[1]),
        ms(release - last_gone),
        ms(sums[2] + sums[3]),
        ms(sums[4] + sums[5] + sums[6] + sums[7]),
    );
    if responders {
        println!(
            "  (asking includes the responder's reaction: each pod's steps follow the requests)"
        );
    }

    // Requests.
    println!();
    println!(
        "requests by nodegrace:node:{} from the signal to the release: {} ({:.2} per pod) [target ≤ 4 per pod]",
        f.name,
        drain.len(),
        drain.len() as f64 / pods as f64
    );
    let everything: Vec<&Request> = drain.iter().collect();
    print_by_kind(&everything, pods);
    // The same by the pods they are about: the pod, its EvictionRequest or its Eviction.
    let groups: [(&str, bool); 2] = [
        (
            if responders {
                "Deployment pods (each declaring a responder)"
            } else {
                "Deployment pods"
            },
            false,
        ),
        ("DaemonSet pods", true),
    ];
    for (label, daemonset) in groups {
        let members: Vec<&PodInfo> = originals
            .iter()
            .filter(|p| BANDS[p.band].2 == daemonset)
            .collect();
        let about: Vec<&Request> = drain
            .iter()
            .filter(|r| members.iter().any(|p| is_about(r, p)))
            .collect();
        println!(
            "  about the {} {label}: {} ({:.2} per pod)",
            members.len(),
            about.len(),
            about.len() as f64 / members.len().max(1) as f64
        );
        print_by_kind(&about, members.len());
    }
    let about_none: Vec<&Request> = drain
        .iter()
        .filter(|r| !originals.iter().any(|p| is_about(r, p)))
        .collect();
    println!(
        "  about no one pod (the Node, the maintenance, events, lists): {}{}",
        about_none.len(),
        summarize(&about_none)
    );
    if let Some(responder) = &responder {
        println!(
            "  the responder stand-in's own status writes (not nodegrace's): {}, {} of them refused",
            responder.writes.load(Ordering::Relaxed),
            responder.refused.load(Ordering::Relaxed)
        );
        // Where a pod's asking went on this path, from the audit log: nodegrace's requests,
        // the cluster's (the stand-in of its controllers), and the responder's status writes
        // (the cluster admin's).
        let handovers = audit::requests_of(&f.cp.audit_log(), "admin", signal);
        let theirs = |pick: &dyn Fn(&Request) -> bool, p: &PodInfo| {
            cluster.iter().find(|r| is_about(r, p) && pick(r))
        };
        let mut steps: [Vec<f64>; 4] = Default::default();
        for p in originals.iter().filter(|p| !BANDS[p.band].2) {
            let ours =
                |pick: &dyn Fn(&Request) -> bool| drain.iter().find(|r| is_about(r, p) && pick(r));
            let chain = (
                ours(&|r| r.verb == "create" && r.resource == "evictionrequests"),
                theirs(&|r| r.verb == "create" && r.resource == "evictions", p),
                theirs(
                    &|r| r.resource == "evictions" && r.subresource == "status",
                    p,
                ),
                handovers
                    .iter()
                    .find(|r| r.subresource == "status" && is_about(r, p)),
                theirs(&|r| is_accepted_termination(r, p), p),
            );
            if let (Some(asked), Some(created), Some(active), Some(handed), Some(evicted)) = chain {
                steps[0].push(created.received - asked.received);
                steps[1].push(active.completed - created.completed);
                steps[2].push(handed.received - active.completed);
                steps[3].push(evicted.received - handed.completed);
            }
        }
        println!(
            "  per pod declaring the responder, over {}: EvictionRequest → Eviction created {}",
            steps[0].len(),
            stats(&mut steps[0])
        );
        println!(
            "    Eviction created → the controller's first status write of it answered (the responder Active) {}",
            stats(&mut steps[1])
        );
        println!(
            "    → the responder's write received (the stand-in's reaction) {}",
            stats(&mut steps[2])
        );
        println!(
            "    the responder's write answered → the imperative evictor's eviction received {}",
            stats(&mut steps[3])
        );
    }
    let conflicts: Vec<&Request> = drain.iter().filter(|r| r.code == 409).collect();
    println!(
        "  409 Conflict: {}{}",
        conflicts.len(),
        summarize(&conflicts)
    );
    let failures: Vec<&Request> = drain
        .iter()
        .filter(|r| r.code != 409 && r.code != 0 && !(200..300).contains(&r.code))
        .collect();
    println!(
        "  other non-2xx: {}{}",
        failures.len(),
        summarize(&failures)
    );
    let after: Vec<&Request> = all.iter().filter(|r| r.received > release).collect();
    println!(
        "  after the release, until the node was gone: {}{}",
        after.len(),
        summarize(&after)
    );
    let idle: Vec<&Request> = all
        .iter()
        .filter(|r| r.received >= idle_from && r.received < idle_to && !r.is_watch())
        .collect();
    println!(
        "  idle ({} s before the poweroff, every pod running), watches aside: {}{} [target 0]",
        IDLE.as_secs(),
        idle.len(),
        summarize(&idle)
    );

    // Escalations and repeated evictions.
    let escalated: Vec<&PodInfo> = originals
        .iter()
        .filter(|p| !BANDS[p.band].2)
        .filter(|p| {
            drain.iter().any(|r| {
                r.verb == "delete"
                    && r.resource == "pods"
                    && r.subresource.is_empty()
                    && r.name == p.name
            })
        })
        .collect();
    let twice: Vec<&PodInfo> = originals
        .iter()
        .filter(|p| {
            drain
                .iter()
                .filter(|r| r.subresource == "eviction" && r.code == 201 && r.name == p.name)
                .count()
                > 1
        })
        .collect();
    println!();
    println!(
        "escalations (DELETE of a pod that is not a DaemonSet pod): {} [target 0]",
        escalated.len()
    );
    println!("pods evicted twice: {} [target 0]", twice.len());

    // The daemon's CPU and memory.
    let at_release = samples
        .iter()
        .rev()
        .find(|s| s.at <= release)
        .or(samples.last())
        .copied();
    let last = samples.last().copied();
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!();
    match (at_release, last) {
        (Some(r), Some(l)) => {
            println!(
                "daemon CPU (user+sys): {:.2} s from the poweroff to the release, {:.2} s until its last sample, taken {:+.0} ms from the release",
                r.usage.cpu_seconds - before.cpu_seconds,
                l.usage.cpu_seconds - before.cpu_seconds,
                (l.at - release) * 1000.0
            );
            println!(
                "daemon memory: peak RSS (VmHWM) {:.1} MiB; RSS before the poweroff {:.1} MiB (anonymous {:.1} MiB, mapped files {:.1} MiB) [idle target ≤ 15 MiB]",
                mib(l.usage.peak_rss_kib),
                mib(before.rss_kib),
                mib(before.rss_anon_kib),
                mib(before.rss_file_kib)
            );
        }
        _ => println!("daemon CPU and memory: no sample (the process went at once)"),
    }
    println!(
        "  resident before the poweroff, by mapping (KiB): {}",
        mappings
            .iter()
            .take(8)
            .map(|(name, kib)| format!("{name} {kib}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  TCP connections held before the poweroff (to the apiserver, its watches included): {connections}");

    // The stand-in's own delays, beside the apiserver's. Watch: from the answer to
    // nodegrace's eviction or DELETE (the deletion is committed) to the stand-in seeing it;
    // timer: from the pod's exit time to the stand-in acting on it; request: from then to
    // the apiserver receiving its final DELETE. Total: that DELETE's receipt less the
    // answer to nodegrace's request and the exit time.
    let (mut watch, mut timer, mut request, mut total_lag) = (vec![], vec![], vec![], vec![]);
    for p in &originals {
        let Some(asked) = terminating.iter().find(|r| is_accepted_termination(r, p)) else {
            continue;
        };
        let Some(record) = records.get(&p.uid) else {
            continue;
        };
        let removed = final_delete(&kubelet_reqs, p);
        if let Some(seen) = record.stop_seen {
            watch.push(seen - asked.completed);
        }
        if let (Some(due), Some(exited)) = (record.exit_due, record.exited_at) {
            timer.push(exited - due);
            if let Some(removed) = removed {
                request.push(removed.received - exited);
            }
        }
        if let Some(removed) = removed {
            total_lag.push(removed.received - asked.completed - exit);
        }
    }
    println!(
        "kubelet stand-in lag over {} pods (its final DELETE received − nodegrace's eviction/DELETE answered − {exit_ms} ms): {}",
        total_lag.len(),
        stats(&mut total_lag)
    );
    println!("  watch (deletion committed → seen): {}", stats(&mut watch));
    println!("  timer (exit due → acted on):       {}", stats(&mut timer));
    println!(
        "  request (sent → received):         {}",
        stats(&mut request)
    );
    println!(
        "  its pod DELETEs: {} for {pods} pods",
        kubelet_reqs
            .iter()
            .filter(|r| r.verb == "delete" && r.resource == "pods")
            .count()
    );
    println!(
        "host load average (1 min): {} before the poweroff, {} after",
        load_before,
        realk8s::load_average()
    );
    if others.is_empty() {
        println!("other nspawn nodes during the run: none");
    } else {
        println!(
            "other nspawn nodes during the run (sharing the control plane and the CPUs): {}",
            others.join(" ")
        );
    }

    f.cleanup().await;
    drop(without_requests);
}

/// Whether `r` is about `pod`: the pod itself, its EvictionRequest (`nodegrace-<uid>`) or
/// its Eviction (`pod-<n>-<name>`).
fn is_about(r: &Request, pod: &PodInfo) -> bool {
    (r.resource == "pods" && r.name == pod.name)
        || (r.resource == "evictionrequests" && r.name == format!("nodegrace-{}", pod.uid))
        || (r.resource == "evictions"
            && r.name
                .strip_prefix("pod-")
                .and_then(|n| n.split_once('-'))
                .is_some_and(|(_, name)| name == pod.name))
}

/// A table of `requests` by kind and answer, with the count per pod of `pods`.
fn print_by_kind(requests: &[&Request], pods: usize) {
    let mut by_kind: BTreeMap<String, BTreeMap<u16, usize>> = BTreeMap::new();
    for r in requests {
        *by_kind
            .entry(r.kind())
            .or_default()
            .entry(r.code)
            .or_default() += 1;
    }
    let mut rows: Vec<(usize, String, String)> = by_kind
        .iter()
        .map(|(kind, codes)| {
            let codes_text: Vec<String> = codes.iter().map(|(c, n)| format!("{c}×{n}")).collect();
            (codes.values().sum(), kind.clone(), codes_text.join(" "))
        })
        .collect();
    rows.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    println!(
        "  {:>6} {:>8}  {:<52} codes",
        "count", "per pod", "verb group/resource[/subresource]"
    );
    for (count, kind, codes) in rows {
        println!(
            "  {count:>6} {:>8.2}  {kind:<52} {codes}",
            count as f64 / pods.max(1) as f64
        );
    }
}

/// `: 3 (2× get /pods 404, 1× …)`, most frequent first; empty when there is nothing.
fn summarize(requests: &[&Request]) -> String {
    if requests.is_empty() {
        return String::new();
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests {
        *counts
            .entry(format!("{} {}", r.kind(), r.code))
            .or_default() += 1;
    }
    let mut counts: Vec<(String, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let parts: Vec<String> = counts
        .iter()
        .map(|(kind, n)| format!("{n}× {kind}"))
        .collect();
    format!(" ({})", parts.join(", "))
}

/// Resident KiB per mapping of `pid` (file path, or `[heap]`, `[anon]`, `[stack]`...),
/// largest first.
fn resident_by_mapping(pid: i32) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut by: BTreeMap<String, u64> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields
            .first()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'))
        {
            current = match fields.get(5) {
                Some(path) if path.starts_with('/') => {
                    path.rsplit('/').next().unwrap_or(path).to_string()
                }
                Some(name) => (*name).to_string(),
                None => "[anon]".to_string(),
            };
        } else if fields.first() == Some(&"Rss:") {
            let kib: u64 = fields.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
            *by.entry(current.clone()).or_default() += kib;
        }
    }
    let mut all: Vec<(String, u64)> = by.into_iter().collect();
    all.sort_by_key(|(_, kib)| std::cmp::Reverse(*kib));
    all
}
