//! Side by side with the anchor: one workload on a node run by a real kubelet v1.28.4
//! (`../shared/realk8s/kubelet-up.sh`, its own containerd, real busybox containers) against
//! the real control plane, shut down three ways:
//!
//! 1. **kubelet GNS**: the kubelet's own Graceful Node Shutdown, configured by priority
//!    (`shutdownGracePeriodByPodPriority`), no nodegrace. The kubelet talks to a logind
//!    stand-in (the test kit's fake `org.freedesktop.login1` on a private `dbus-daemon`,
//!    `DBUS_SYSTEM_BUS_ADDRESS`): it reads `InhibitDelayMaxUSec`, takes its delay lock, and on
//!    `PrepareForShutdown(true)` kills the pods by priority and closes the lock. The real
//!    logind of an nspawn node refuses the kubelet on the host (`../shared/realk8s/README.md`).
//! 2. **nodegrace**: the node is a booted Debian (nspawn, real logind and systemd) running
//!    nodegrace as packaged, the kubelet wired to it as in the real-kubelet tier; `systemctl
//!    poweroff` in the node.
//! 3. **kubectl drain**: `kubectl drain --ignore-daemonsets` (kured's way), then the power
//!    goes off.
//! 4. **both** (only when asked: `BENCH_MODES=both`): the kubelet's GNS of way 1 and
//!    nodegrace of way 2 on the same logind stand-in, the node's system bus (a drop-in for
//!    nodegrace's unit sets `DBUS_SYSTEM_BUS_ADDRESS`; the kubelet's configuration is at the
//!    shipped `fallback.kubelet_config`); release is when the last of the two locks closed.
//!
//! "The power goes off" is `kubelet-down.sh`: the kubelet stops and every container still
//! running is SIGKILLed, as a machine losing power; nothing reaches the apiserver.
//!
//! The workload, on node 1: Deployments `web` (priority 0, 3 replicas, PDB minAvailable 2),
//! `api` (system-cluster-critical, 3, minAvailable 2), `dns` (system-node-critical, 2,
//! minAvailable 1), a DaemonSet pod `agent`, a static pod `etcd` (system-node-critical);
//! every container exits `BENCH_EXIT_MS` (default 1000) after SIGTERM. Node 2 (a second real
//! kubelet) joins the Deployments' node pool just before the shutdown, so replacements have
//! somewhere to run.
//!
//! For each way it prints: signal → release (the last delay lock let go; for `kubectl drain`,
//! its end) and → power off; how each pod of node 1 ended (evicted through the Eviction API,
//! which checks its PDB; deleted or stopped by the kubelet with no PDB check; killed by the
//! power going off); the PDB budget exceeded (pod disruptions that left a Deployment below
//! its PDB's minAvailable); per Deployment the seconds from the signal until every replica
//! runs again with fewer healthy replicas than minAvailable (healthy as the disruption
//! controller counts it: Running, Ready, not terminating, and on a node that still has
//! power), and the original pods' statuses afterwards. Its table has a lower bound: the least
//! signal → release with the band order and the PDBs kept, from the replacements' measured
//! time to Ready and the containers' exit (`lower_bound`). `BENCH_RUNS=N` runs every way N
//! times, interleaved, and ends with the median and range of each.
//!
//! As root, with the control plane's scripts at `../shared/realk8s` (or `$NODEGRACE_REALK8S`;
//! started if not running, never stopped), `containerd`, `runc`, `busybox-static`,
//! `dbus-daemon`:
//!
//! ```sh
//! cargo build --release --bin nodegrace    # or set NODEGRACE_TEST_BINARY
//! cargo run --example bench_vs_kubelet_gns                # all three
//! BENCH_MODES=gns,drain cargo run --example bench_vs_kubelet_gns
//! BENCH_MODES=gns,nodegrace,both cargo run --example bench_vs_kubelet_gns
//! ```

#[path = "../tests/real/mod.rs"]
mod real;
#[path = "../tests/realk8s/mod.rs"]
mod realk8s;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use nodegrace::v1 as cri;
use realk8s::fixture::{app_of, cleanup_node, signal_and_release};
use realk8s::node::SystemBus;
use realk8s::real_kubelet::{self as rk, RealFixture, RealKubelet};
use realk8s::stand_in_logind::StandInLogind;
use realk8s::workload::{self, PodShape};

/// The Deployments: (name, priority class, replicas, the PDB's minAvailable).
const DEPLOYMENTS: [(&str, Option<&str>, usize, usize); 3] = [
    ("web", None, 3, 2),
    ("api", Some("system-cluster-critical"), 3, 2),
    ("dns", Some("system-node-critical"), 2, 1),
];

/// The kubelet's GNS for way 1: 10 s for each of the three priorities in use (the default
/// band, system-cluster-critical, system-node-critical), 30 s in all.
const GNS_CONFIG: &str = "shutdownGracePeriodByPodPriority:
- {priority: 0, shutdownGracePeriodSeconds: 10}
- {priority: 2000000000, shutdownGracePeriodSeconds: 10}
- {priority: 2000001000, shutdownGracePeriodSeconds: 10}";

/// The stand-in logind's InhibitDelayMaxSec: above the 30 s the kubelet asks for, so it
/// does not rewrite logind's configuration (it would write the host's
/// /etc/systemd/logind.conf.d/).
const LOGIND_DELAY: Duration = Duration::from_secs(60);

/// How long after the power went off replacements may take to run (`BENCH_RESTORE_S`): past
/// the node lifecycle controller's 40 s and the pods' default 300 s toleration of an
/// unreachable node, after which it evicts what the apiserver still has there.
const RESTORE_TIMEOUT_S: f64 = 420.0;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Gns,
    Nodegrace,
    Drain,
    Both,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::Gns => "kubelet GNS alone",
            Way::Nodegrace => "nodegrace",
            Way::Drain => "kubectl drain + poweroff",
            Way::Both => "kubelet GNS + nodegrace",
        }
    }
}

/// One pod state the watch saw.
#[derive(Clone, Debug)]
struct Seen {
    at: f64,
    uid: String,
    app: String,
    node: String,
    /// As the disruption controller counts a pod: Running, Ready, not terminating.
    healthy: bool,
    /// `DisruptionTarget` condition's reason, if any.
    disruption: Option<String>,
    terminating: bool,
    gone: bool,
}

fn seen(p: &Pod, gone: bool) -> Seen {
    let status = p.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let ready = conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let terminating = p.metadata.deletion_timestamp.is_some();
    Seen {
        at: realk8s::now_unix(),
        uid: p.uid().unwrap_or_default(),
        app: app_of(p),
        node: p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        healthy: !gone && ready && !terminating && status.phase.as_deref() == Some("Running"),
        disruption: conditions
            .iter()
            .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
            .and_then(|c| c.reason.clone()),
        terminating,
        gone,
    }
}

/// Every state of the namespace's pods the watch saw, in order.
struct Timeline {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Timeline {
    fn start(admin: &Client, ns: &str) -> Timeline {
        let api: Api<Pod> = Api::namespaced(admin.clone(), ns);
        let seen_ = Arc::new(Mutex::new(Vec::new()));
        let record = seen_.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let s = match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => seen(&p, false),
                    Ok(watcher::Event::Delete(p)) => seen(&p, true),
                    _ => continue,
                };
                record.lock().unwrap_or_else(|p| p.into_inner()).push(s);
            }
        });
        Timeline { seen: seen_, task }
    }

    fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The latest state of every pod seen.
    fn latest(&self) -> HashMap<String, Seen> {
        let mut by_uid = HashMap::new();
        for s in self.all() {
            by_uid.insert(s.uid.clone(), s);
        }
        by_uid
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One pod of node 1 before the shutdown.
#[derive(Clone, Debug)]
struct Original {
    uid: String,
    name: String,
    app: String,
}

/// What one way of shutting down gave.
struct Outcome {
    way: Way,
    signal: f64,
    release: f64,
    off: f64,
    /// When every Deployment ran all its replicas healthy on node 2 again.
    restored: Option<f64>,
    /// When the run stopped watching.
    end: f64,
    /// Per original pod, how it ended.
    ended: BTreeMap<String, &'static str>,
    /// Per Deployment: disruptions beyond its budget, seconds below minAvailable, fewest
    /// healthy, healthy at the end.
    availability: BTreeMap<&'static str, (usize, f64, usize, usize)>,
    /// Per original pod, its status after (phase/reason, or gone).
    after: BTreeMap<String, String>,
    /// Per app, when its first and its last original pod stopped counting as healthy.
    out: BTreeMap<String, (f64, f64)>,
    /// The host's 1-minute load average at the signal (other work on the machine shows here).
    load: String,
    /// Per replacement on the spare node: seconds from its creation to Ready.
    ready_after: Vec<f64>,
}

fn healthy_on(s: &Seen, node1: &str, off: f64, at: f64) -> bool {
    s.healthy && !(s.node == node1 && at >= off)
}

/// Per Deployment over [signal, end]: pod disruptions of node 1 that left it below its
/// minAvailable, seconds below minAvailable and the fewest healthy replicas.
fn availability(
    timeline: &[Seen],
    node1: &str,
    signal: f64,
    off: f64,
    end: f64,
) -> BTreeMap<&'static str, (usize, f64, usize, usize)> {
    let mut result = BTreeMap::new();
    for (app, _, replicas, min) in DEPLOYMENTS {
        let mine: Vec<&Seen> = timeline.iter().filter(|s| s.app == app).collect();
        // The moments anything changed: every watch event, and the power going off.
        let mut moments: Vec<f64> = mine.iter().map(|s| s.at).collect();
        moments.push(off);
        moments.push(signal);
        moments.sort_by(f64::total_cmp);
        moments.dedup();
        let mut state: HashMap<&str, &Seen> = HashMap::new();
        let count = |state: &HashMap<&str, &Seen>, at: f64| {
            state
                .values()
                .filter(|s| healthy_on(s, node1, off, at))
                .count()
        };
        let mut events = mine.iter().peekable();
        let (mut breaches, mut below, mut fewest) = (0usize, 0f64, replicas);
        let mut previous: Option<(f64, usize)> = None;
        let mut was_healthy: HashMap<&str, bool> = HashMap::new();
        for at in moments {
            while let Some(s) = events.next_if(|s| s.at <= at) {
                state.insert(s.uid.as_str(), s);
            }
            let now = count(&state, at);
            if at >= signal && at <= end {
                if let Some((t, n)) = previous {
                    if n < min {
                        below += at - t.max(signal);
                    }
                }
                // Pods of node 1 healthy at the previous moment and not now, leaving too few.
                let lost = state
                    .iter()
                    .filter(|(uid, s)| {
                        s.node == node1
                            && was_healthy.get(*uid) == Some(&true)
                            && !healthy_on(s, node1, off, at)
                    })
                    .count();
                if now < min {
                    breaches += lost.min(min - now);
                }
                fewest = fewest.min(now);
            }
            was_healthy = state
                .iter()
                .map(|(uid, s)| (*uid, healthy_on(s, node1, off, at)))
                .collect();
            previous = Some((at, now));
        }
        let last = previous.map_or(0, |(_, n)| n);
        if let Some((t, n)) = previous {
            if n < min && t < end {
                below += end - t.max(signal);
            }
        }
        result.insert(app, (breaches, below, fewest, last));
    }
    result
}

/// Waits until every Deployment runs all its replicas healthy on `node2` (None after the
/// timeout).
async fn restored(timeline: &Timeline, node2: &str, deadline: f64) -> Option<f64> {
    loop {
        let latest = timeline.latest();
        let done = DEPLOYMENTS.iter().all(|(app, _, replicas, _)| {
            latest
                .values()
                .filter(|s| s.app == *app && s.node == node2 && s.healthy)
                .count()
                >= *replicas
        });
        if done {
            return latest
                .values()
                .filter(|s| s.node == node2 && s.healthy)
                .map(|s| s.at)
                .reduce(f64::max);
        }
        if realk8s::now_unix() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the disruption controller has computed every PDB with all pods healthy.
async fn wait_budgets(admin: &Client, ns: &str) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), ns);
    for _ in 0..600 {
        let mut ok = true;
        for (app, _, replicas, min) in DEPLOYMENTS {
            let status = api.get(app).await.ok().and_then(|p| p.status);
            ok &= status.is_some_and(|s| {
                s.current_healthy == Some(replicas as i32)
                    && s.disruptions_allowed == Some((replicas - min) as i32)
            });
        }
        if ok {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the PodDisruptionBudgets of {ns} were never computed");
}

/// Names of the pods whose containers still run on `kubelet`'s containerd.
async fn running_pods(kubelet: &RealKubelet) -> Vec<String> {
    let endpoint = format!("unix://{}", kubelet.dir.join("containerd.sock").display());
    rk::containers(&endpoint)
        .await
        .into_iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .map(|c| c.pod)
        .collect()
}

async fn run(way: Way, exit_ms: u64, restore_timeout: f64) -> Outcome {
    let logind = match way {
        Way::Gns | Way::Both => Some(StandInLogind::start(LOGIND_DELAY).await),
        _ => None,
    };
    let env: Vec<(&str, &str)> = logind
        .iter()
        .map(|l| ("DBUS_SYSTEM_BUS_ADDRESS", l.address.as_str()))
        .collect();
    let extra = match way {
        Way::Gns | Way::Both => GNS_CONFIG,
        _ => "",
    };
    let mut f = RealFixture::with_kubelet_env("ng-vs", extra, false, &env).await;
    if let (Way::Both, Some(l)) = (way, &logind) {
        f.node.system_bus = Some(SystemBus {
            socket_dir: l.socket_dir(),
            dropin_dir: l.dropin_dir(),
        });
        f.node.kubelet_config = Some(f.kubelet.dir.join("kubelet.yaml"));
    }
    let (c, ns, node1) = (f.admin.clone(), f.name.clone(), f.name.clone());
    let node2 = format!("{node1}-spare");
    let mut spare = RealKubelet::new(f.cp, &node2, &f.cp.kubelet_identity(&node2));
    let mut spare = tokio::task::spawn_blocking(move || {
        spare.up();
        spare
    })
    .await
    .expect("kubelet-up.sh for the spare node");

    let pool = node1.as_str();
    workload::join_pool(&c, &node1, pool).await;
    for (app, class, replicas, min) in DEPLOYMENTS {
        let mut shape = PodShape::new(app)
            .on_real_kubelet()
            .in_pool(pool)
            .exits_after_ms(exit_ms);
        if let Some(class) = class {
            shape = shape.priority(class);
        }
        workload::deployment(&c, &ns, &node1, replicas as i32, shape).await;
        workload::pdb(&c, &ns, app, min as i32).await;
    }
    let real = |app| PodShape::new(app).on_real_kubelet().exits_after_ms(exit_ms);
    workload::daemonset(&c, &ns, &node1, false, real("agent")).await;
    workload::static_pod(&f.kubelet.manifests(), &ns, real("etcd"));
    let mut apps: Vec<(&str, usize)> = DEPLOYMENTS.iter().map(|d| (d.0, d.2)).collect();
    apps.extend([("agent", 1), ("etcd", 1)]);
    let pods = rk::wait_running(&c, &ns, &node1, &apps, Duration::from_secs(120)).await;
    let originals: Vec<Original> = pods
        .iter()
        .map(|p| Original {
            uid: p.uid().unwrap_or_default(),
            name: p.name_any(),
            app: app_of(p),
        })
        .collect();
    wait_budgets(&c, &ns).await;
    let timeline = Timeline::start(&c, &ns);
    if matches!(way, Way::Nodegrace | Way::Both) {
        f.node.boot();
    }
    if let (Way::Both, Some(l)) = (way, &logind) {
        real::wait_until(
            "nodegrace's delay lock on the stand-in",
            Duration::from_secs(30),
            || l.holds_delay("nodegrace").then_some(()),
        );
    }
    if let Some(l) = &logind {
        let held = l.holds_delay("kubelet");
        assert!(
            held,
            "the kubelet holds no delay lock on the logind stand-in:\n{}",
            f.kubelet.log_tail()
        );
    }
    workload::join_pool(&c, &node2, pool).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let load = realk8s::load_average();
    let (signal, release, off, running) = match way {
        Way::Gns | Way::Both => {
            let fakes = &logind.as_ref().expect("stand-in").fakes;
            let signal = realk8s::now_unix();
            let at = fakes
                .prepare_for_shutdown_typed(true, "poweroff")
                .await
                .expect("signal");
            let delay_locks = |s: &nodegrace_testkit::FakeState| {
                s.inhibitors
                    .iter()
                    .filter(|i| i.mode == "delay")
                    .cloned()
                    .collect::<Vec<_>>()
            };
            let state = tokio::time::timeout(
                LOGIND_DELAY,
                fakes.wait_until(|s| delay_locks(s).iter().all(|i| !i.held())),
            )
            .await;
            // logind's own limit: it powers off at InhibitDelayMaxSec whatever is held.
            let closed = state
                .ok()
                .and_then(|s| delay_locks(&s).iter().filter_map(|i| i.closed_at).max());
            let release = closed.map_or(signal + LOGIND_DELAY.as_secs_f64(), |t| {
                signal + t.duration_since(at).as_secs_f64()
            });
            let off = realk8s::now_unix();
            (signal, release, off, running_pods(&f.kubelet).await)
        }
        Way::Nodegrace => {
            let container = f.node.shutdown("poweroff", Duration::from_secs(900));
            let (signal, release) = signal_and_release(&container);
            let off = realk8s::now_unix();
            (signal, release, off, running_pods(&f.kubelet).await)
        }
        Way::Drain => {
            let signal = realk8s::now_unix();
            let cp = f.cp;
            let drained = node1.clone();
            let out = tokio::task::spawn_blocking(move || {
                cp.kubectl(&[
                    "drain",
                    &drained,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--timeout=600s",
                ])
            })
            .await
            .expect("kubectl drain");
            assert!(
                out.status.success(),
                "kubectl drain failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let release = realk8s::now_unix();
            (signal, release, release, running_pods(&f.kubelet).await)
        }
    };
    f.kubelet.down();
    let restored = restored(&timeline, &node2, realk8s::now_unix() + restore_timeout).await;
    // A moment for what the controllers do next to show in the statuses.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let end = restored.unwrap_or_else(realk8s::now_unix);
    let all = timeline.all();
    let latest = timeline.latest();
    let mut ended = BTreeMap::new();
    let mut after = BTreeMap::new();
    for o in &originals {
        let last = latest.get(&o.uid);
        let how = if running.contains(&o.name) {
            "killed by the power going off"
        } else {
            let disruption = all
                .iter()
                .filter(|s| s.uid == o.uid)
                .find_map(|s| s.disruption.clone());
            let deleted = all.iter().any(|s| s.uid == o.uid && s.terminating);
            match disruption.as_deref() {
                Some("EvictionByEvictionAPI") => "evicted (Eviction API, PDB checked)",
                Some("TerminationByKubelet") => "stopped by the kubelet's GNS (no PDB check)",
                _ if o.app == "etcd" && matches!(way, Way::Nodegrace | Way::Both) => {
                    "static: manifest gated, stopped by the kubelet"
                }
                _ if deleted => "deleted (no PDB check)",
                // Its container stopped, and the apiserver never heard: the kubelet's status
                // write was still pending when the power went off.
                _ if matches!(way, Way::Gns | Way::Both) => {
                    "stopped by the kubelet's GNS (no PDB check), unreported"
                }
                _ => "stopped otherwise",
            }
        };
        ended.insert(o.name.clone(), how);
        let status = match last {
            None => "unknown".to_owned(),
            Some(s) if s.gone => "gone".to_owned(),
            Some(_) => {
                let api: Api<Pod> = Api::namespaced(c.clone(), &ns);
                match api.get_opt(&o.name).await.ok().flatten() {
                    None => "gone".to_owned(),
                    Some(p) => describe(&p),
                }
            }
        };
        after.insert(o.name.clone(), status);
    }
    let availability = availability(&all, &node1, signal, off, end);
    let ready_after = ready_after(&all, &node2, signal);
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for o in &originals {
        let at = all
            .iter()
            .filter(|s| s.uid == o.uid && s.at >= signal && !s.healthy)
            .map(|s| s.at)
            .next()
            .unwrap_or(off)
            .min(off);
        let e = out.entry(o.app.clone()).or_insert((at, at));
        e.0 = e.0.min(at);
        e.1 = e.1.max(at);
    }
    drop(timeline);
    spare.down();
    drop(spare);
    drop(f.node.container.take());
    f.cleanup().await;
    cleanup_node(&c, &node2).await;
    drop(logind);
    Outcome {
        way,
        signal,
        release,
        off,
        restored,
        end,
        ended,
        availability,
        after,
        out,
        load,
        ready_after,
    }
}

/// Per pod created on `node2` after the signal: seconds from when the watch first saw it
/// to when it first was healthy.
fn ready_after(timeline: &[Seen], node2: &str, signal: f64) -> Vec<f64> {
    let mut first: BTreeMap<&str, (f64, Option<f64>)> = BTreeMap::new();
    for s in timeline.iter().filter(|s| s.at >= signal) {
        let e = first.entry(s.uid.as_str()).or_insert((s.at, None));
        if s.node == node2 && s.healthy && e.1.is_none() {
            e.1 = Some(s.at - e.0);
        }
    }
    first.values().filter_map(|(_, ready)| *ready).collect()
}

fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The least signal → release any way could take with the band order and every PDB kept: per
/// Deployment band, one round of evictions for each `replicas − minAvailable` pods, every
/// round but the last waiting for its replacements to be Ready (the median measured in the
/// run), the last for its pods' exit; then the DaemonSet pod's and the static pod's exits.
/// Requests, status writes and scheduling cost nothing here.
fn lower_bound(o: &Outcome, exit_ms: u64) -> Option<f64> {
    let ready = median(&o.ready_after)?;
    let exit = exit_ms as f64 / 1000.0;
    let deployments: f64 = DEPLOYMENTS
        .iter()
        .map(|(_, _, replicas, min)| {
            let rounds = replicas.div_ceil(replicas - min);
            (rounds - 1) as f64 * ready + exit
        })
        .sum();
    Some(deployments + 2.0 * exit)
}

/// `Running`, `Failed (Terminated)`, `Running, terminating`...
fn describe(p: &Pod) -> String {
    let status = p.status.clone().unwrap_or_default();
    let mut text = status.phase.unwrap_or_else(|| "?".into());
    if let Some(reason) = status.reason {
        text = format!("{text} ({reason})");
    }
    if p.metadata.deletion_timestamp.is_some() {
        text.push_str(", terminating");
    }
    text
}

fn secs(s: f64) -> String {
    format!("{s:.1} s")
}

/// `gone ×8, Running ×2`.
fn tally<'a>(values: impl Iterator<Item = &'a str>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    let mut counts: Vec<(&str, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    counts
        .iter()
        .map(|(v, n)| format!("{v} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Seconds `app` was below minAvailable; "≥" when it still was when the run stopped watching.
fn gap(o: &Outcome, app: &str) -> String {
    let (_, below, _, last) = o.availability[app];
    let min = DEPLOYMENTS.iter().find(|d| d.0 == app).map_or(0, |d| d.3);
    if last < min {
        format!("≥ {}", secs(below))
    } else {
        secs(below)
    }
}

/// "+13.3 s", or which Deployments still lacked replicas when the run stopped watching.
fn restored_text(o: &Outcome, prefix: &str) -> String {
    match o.restored {
        Some(t) => format!("{prefix}{}", secs(t - o.signal)),
        None => {
            let short: Vec<String> = DEPLOYMENTS
                .iter()
                .filter(|(app, _, replicas, _)| o.availability[app].3 < *replicas)
                .map(|(app, _, replicas, _)| format!("{app} {}/{replicas}", o.availability[app].3))
                .collect();
            format!("no: {} after {}", short.join(", "), secs(o.end - o.signal))
        }
    }
}

fn evicted(o: &Outcome) -> usize {
    o.ended
        .values()
        .filter(|h| h.starts_with("evicted"))
        .count()
}

fn killed_by_power(o: &Outcome) -> usize {
    o.ended.values().filter(|h| h.starts_with("killed")).count()
}

fn report(o: &Outcome) {
    println!();
    println!(
        "== {} == (host load average {} at the signal)",
        o.way.label(),
        o.load
    );
    let release = match o.way {
        Way::Gns => "the kubelet's lock closed",
        Way::Nodegrace => "nodegrace's lock closed",
        Way::Drain => "kubectl drain returned",
        Way::Both => "the last of the two locks closed",
    };
    println!(
        "signal → release ({release}): {}; → power off: {}; every replica healthy on the spare node again: {}",
        secs(o.release - o.signal),
        secs(o.off - o.signal),
        restored_text(o, "")
    );
    println!(
        "out of service (first → last pod of each app): {}",
        o.out
            .iter()
            .map(|(app, (a, b))| format!("{app} +{:.1}…{:.1} s", a - o.signal, b - o.signal))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("pods of node 1, how each ended → status after:");
    for (name, how) in &o.ended {
        println!("  {name:<28} {how} → {}", o.after[name]);
    }
    println!(
        "  evicted {}, stopped without a PDB check {}, killed by the power going off {}",
        evicted(o),
        o.ended.len() - evicted(o) - killed_by_power(o),
        killed_by_power(o)
    );
    let exceeded: usize = o.availability.values().map(|a| a.0).sum();
    println!("PDB budget exceeded: {exceeded} pod disruptions beyond what the PDBs allow");
    for (app, _, replicas, min) in DEPLOYMENTS {
        let (breaches, _, fewest, last) = o.availability[app];
        println!(
            "  {app}: {replicas} replicas, minAvailable {min}: {breaches} beyond budget, {} below minAvailable, fewest healthy {fewest}, at the end {last}",
            gap(o, app)
        );
    }
}

fn table(outcomes: &[Outcome], exit_ms: u64) {
    println!();
    println!(
        "| | {} |",
        outcomes
            .iter()
            .map(|o| o.way.label())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(outcomes.len()));
    let row = |label: &str, cell: &dyn Fn(&Outcome) -> String| {
        println!(
            "| {label} | {} |",
            outcomes.iter().map(cell).collect::<Vec<_>>().join(" | ")
        );
    };
    row("signal → release", &|o| secs(o.release - o.signal));
    row("lower bound (band order, PDBs kept)", &|o| {
        lower_bound(o, exit_ms).map_or("—".into(), secs)
    });
    row("replacement created → Ready (median)", &|o| {
        median(&o.ready_after).map_or("—".into(), secs)
    });
    row("signal → power off", &|o| secs(o.off - o.signal));
    row(
        "pods evicted / stopped without PDB check / killed by power-off",
        &|o| {
            format!(
                "{} / {} / {}",
                evicted(o),
                o.ended.len() - evicted(o) - killed_by_power(o),
                killed_by_power(o)
            )
        },
    );
    row("PDB budget exceeded (pod disruptions)", &|o| {
        o.availability
            .values()
            .map(|a| a.0)
            .sum::<usize>()
            .to_string()
    });
    for (app, _, replicas, min) in DEPLOYMENTS {
        row(
            &format!("{app} ({replicas} replicas, min {min}): s below min"),
            &|o| gap(o, app),
        );
    }
    row("all replicas healthy elsewhere", &|o| restored_text(o, "+"));
    row("original pods after", &|o| {
        tally(o.after.values().map(String::as_str))
    });
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let exit_ms: u64 = realk8s::env_or("BENCH_EXIT_MS", 1000);
    let restore_timeout: f64 = realk8s::env_or("BENCH_RESTORE_S", RESTORE_TIMEOUT_S);
    let modes: String = realk8s::env_or("BENCH_MODES", "gns,nodegrace,drain".to_owned());
    let runs: usize = realk8s::env_or("BENCH_RUNS", 1);
    let ways: Vec<Way> = modes
        .split(',')
        .map(|m| match m.trim() {
            "gns" => Way::Gns,
            "nodegrace" => Way::Nodegrace,
            "drain" => Way::Drain,
            "both" => Way::Both,
            other => panic!("BENCH_MODES: unknown {other:?} (gns, nodegrace, drain, both)"),
        })
        .collect();
    real::require_prerequisites();
    let binary = real::nodegrace_binary();
    let commit = realk8s::commit();
    println!(
        "bench_vs_kubelet_gns: kubelet + control plane v1.28.4; Deployments {}; DaemonSet pod agent; static pod etcd; containers exit {exit_ms} ms after SIGTERM",
        DEPLOYMENTS
            .iter()
            .map(|(a, c, r, m)| format!("{a} ({}, {r}, min {m})", c.unwrap_or("priority 0")))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  nodegrace {} (commit {commit}); kubelet GNS: {}",
        binary.display(),
        GNS_CONFIG.replace('\n', " ")
    );
    let mut all: Vec<Outcome> = Vec::new();
    for n in 1..=runs {
        let mut outcomes = Vec::new();
        for &way in &ways {
            println!("\n-- run {n} of {runs} --");
            let o = run(way, exit_ms, restore_timeout).await;
            report(&o);
            outcomes.push(o);
        }
        table(&outcomes, exit_ms);
        all.extend(outcomes);
    }
    if runs > 1 {
        summary(&all, &ways, exit_ms, runs);
    }
}

/// Over the runs, per way: median (min–max) of the times, and each run's counts.
fn summary(all: &[Outcome], ways: &[Way], exit_ms: u64, runs: usize) {
    println!("\n{runs} runs each, median (min–max); counts per run");
    println!(
        "| | {} |",
        ways.iter()
            .map(|w| w.label())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(ways.len()));
    let row = |label: &str, cell: &dyn Fn(&[&Outcome]) -> String| {
        let cells: Vec<String> = ways
            .iter()
            .map(|w| {
                let mine: Vec<&Outcome> = all.iter().filter(|o| o.way == *w).collect();
                cell(&mine)
            })
            .collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    let spread = |values: Vec<f64>| -> String {
        let (Some(mid), Some(lo), Some(hi)) = (
            median(&values),
            values.iter().copied().reduce(f64::min),
            values.iter().copied().reduce(f64::max),
        ) else {
            return "—".into();
        };
        format!("{mid:.1} s ({lo:.1}–{hi:.1})")
    };
    let each = |mine: &[&Outcome], f: &dyn Fn(&Outcome) -> String| {
        mine.iter().map(|o| f(o)).collect::<Vec<_>>().join(", ")
    };
    row("signal → release", &|m| {
        spread(m.iter().map(|o| o.release - o.signal).collect())
    });
    row("lower bound (band order, PDBs kept)", &|m| {
        spread(m.iter().filter_map(|o| lower_bound(o, exit_ms)).collect())
    });
    row("signal → power off", &|m| {
        spread(m.iter().map(|o| o.off - o.signal).collect())
    });
    row("PDB budget exceeded (pod disruptions)", &|m| {
        each(m, &|o| {
            o.availability
                .values()
                .map(|a| a.0)
                .sum::<usize>()
                .to_string()
        })
    });
    row("left Running in the API", &|m| {
        each(m, &|o| {
            o.after
                .values()
                .filter(|a| a.starts_with("Running"))
                .count()
                .to_string()
        })
    });
}
