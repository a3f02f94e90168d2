//! What one node receives while the rest of a fleet reboots, on the real control plane
//! (`../shared/realk8s/`, kube-apiserver v1.28.4). Prints numbers, asserts nothing.
//!
//! One observer node runs the real daemon (an nspawn node as in the real-cluster tier,
//! shipped unit and configuration). The rest of the fleet, `BENCH_NODES` other nodes, is
//! played by the apiserver traffic their drains make, in waves of `BENCH_WAVE` nodes: per
//! node `BENCH_VOLUMES` VolumeAttachments, its shutdown maintenance (labelled for it, as the
//! daemon labels it) updated `BENCH_UPDATES` times, and one EvictionRequest per pod
//! (`BENCH_PODS`, labelled for it) updated `BENCH_UPDATES` times. The updates are annotation
//! patches: each is one watch event, as a status write is, but a smaller one; the byte
//! counts understate a real drain's.
//!
//! Beside the daemon, the benchmark holds two sets of watches with the admin identity: the
//! ones a node holds now (NodeMaintenances by `nodegrace.dev/node`, its own or unlabelled;
//! its own `lifecycle.k8s.io` EvictionRequests) and the ones it held before (every
//! NodeMaintenance, EvictionRequest
//! and VolumeAttachment), and counts the events and bytes (JSON) each set receives idle and
//! while the others drain. It prints those, the daemon's lists/watches and other requests
//! (audit log), its RSS and CPU before and after the fleet's objects exist, and the
//! apiserver's.
//!
//! With `BENCH_ENGINES=1` the other nodes are daemons instead: each runs the daemon's cluster
//! side in this process with its own identities, a stand-in registers their Nodes and binds
//! `BENCH_PODS` pods to each, and they reboot in a rolling wave of `BENCH_WAVE` at a time
//! (drain, restart with a new boot id, complete the maintenance). It prints per node the
//! watches it holds, the watch events and bytes it receives idle and while the others
//! reboot, its requests (per pod for its own drain), the memory a daemon adds, the observer's
//! figures and the apiserver's CPU and RSS (header of `examples/fleet_engines/mod.rs`).
//!
//! As root, with the control plane's scripts at `../shared/realk8s` (or
//! `$NODEGRACE_REALK8S`; started if not running, never stopped):
//!
//! ```sh
//! cargo build --release --bin nodegrace    # or set NODEGRACE_TEST_BINARY
//! cargo run --release --example bench_fleet_watches
//! BENCH_NODES=1000 BENCH_WAVE=50 cargo run --release --example bench_fleet_watches
//! BENCH_ENGINES=1 BENCH_NODES=100 BENCH_WAVE=10 BENCH_PODS=5 cargo run --release --example bench_fleet_watches
//! ```

#[path = "fleet_engines/mod.rs"]
mod fleet_engines;
#[path = "../tests/real/mod.rs"]
mod real;
#[path = "../tests/realk8s/mod.rs"]
mod realk8s;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::lifecycle::v1alpha1::EvictionRequest;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use nodegrace::{node_selector_for, shutdown_maintenance_name, NodeMaintenance, NODE_LABEL};
use realk8s::fixture::Fixture;
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Counter {
    events: AtomicU64,
    bytes: AtomicU64,
}

impl Counter {
    fn get(&self) -> (u64, u64) {
        (
            self.events.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// Counts the events (after the initial list) and their JSON bytes of one watch.
fn count<K>(api: Api<K>, config: watcher::Config, counter: Arc<Counter>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + 'static,
{
    tokio::spawn(async move {
        let mut stream = watcher(api, config).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) = event {
                counter.events.fetch_add(1, Ordering::Relaxed);
                let bytes = serde_json::to_vec(&obj).map_or(0, |b| b.len());
                counter.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            }
        }
    });
}

struct Watches {
    now: Arc<Counter>,
    before: Arc<Counter>,
}

fn watches(admin: &Client, node: &str) -> Watches {
    let now = Arc::new(Counter::default());
    let before = Arc::new(Counter::default());
    let own = format!("{NODE_LABEL}={node}");
    let unlabelled = format!("!{NODE_LABEL}");
    for selector in [&own, &unlabelled] {
        count(
            Api::<NodeMaintenance>::all(admin.clone()),
            watcher::Config::default().labels(selector),
            now.clone(),
        );
    }
    // The requester's own EvictionRequests (lifecycle.k8s.io, the tests' CRDs on v1.28).
    count(
        Api::<EvictionRequest>::all(admin.clone()),
        watcher::Config::default().labels(&own),
        now.clone(),
    );
    count(
        Api::<NodeMaintenance>::all(admin.clone()),
        watcher::Config::default(),
        before.clone(),
    );
    count(
        Api::<EvictionRequest>::all(admin.clone()),
        watcher::Config::default(),
        before.clone(),
    );
    count(
        Api::<VolumeAttachment>::all(admin.clone()),
        watcher::Config::default(),
        before.clone(),
    );
    Watches { now, before }
}

/// One other node's drain as the apiserver sees it.
async fn drain_of(
    admin: Client,
    ns: String,
    node: String,
    volumes: usize,
    pods: usize,
    updates: usize,
) {
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    for j in 0..volumes {
        let va: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-v{j}")},
            "spec": {"attacher": "bench.csi.example.com", "nodeName": node,
                     "source": {"persistentVolumeName": format!("pv-{node}-{j}")}},
        }))
        .expect("volume attachment");
        let _ = vas.create(&PostParams::default(), &va).await;
    }
    let nms: Api<NodeMaintenance> = Api::all(admin.clone());
    let name = shutdown_maintenance_name(&node);
    let m: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name, "labels": {NODE_LABEL: node}},
        "spec": {"nodeSelector": node_selector_for(&node), "stage": "Drain"},
    }))
    .expect("maintenance");
    let _ = nms.create(&PostParams::default(), &m).await;
    let ers: Api<EvictionRequest> = Api::namespaced(admin.clone(), &ns);
    let mut requests = Vec::new();
    for p in 0..pods {
        let uid = format!("{node}-pod-{p}");
        let r: EvictionRequest = serde_json::from_value(json!({
            "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "EvictionRequest",
            "metadata": {"name": format!("bench-{uid}"), "namespace": ns,
                         "labels": {NODE_LABEL: node}},
            "spec": {"intent": "Eviction", "requester": "bench.example.com/fleet",
                     "target": {"pod": {"name": format!("pod-{p}"), "uid": uid}}},
        }))
        .expect("eviction request");
        if ers.create(&PostParams::default(), &r).await.is_ok() {
            requests.push(format!("bench-{uid}"));
        }
    }
    for step in 0..updates {
        let patch = Patch::Merge(
            json!({"metadata": {"annotations": {"bench.example.com/step": step.to_string()}}}),
        );
        let _ = nms.patch(&name, &PatchParams::default(), &patch).await;
        for name in &requests {
            let _ = ers.patch(name, &PatchParams::default(), &patch).await;
        }
    }
}

fn apiserver_pid() -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let argv0 = cmdline.split(|b| *b == 0).next()?;
        String::from_utf8_lossy(argv0)
            .ends_with("kube-apiserver")
            .then_some(pid)
    })
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes = env_usize("BENCH_NODES", 100);
    let wave = env_usize("BENCH_WAVE", 10).max(1);
    let volumes = env_usize("BENCH_VOLUMES", 10);
    let pods = env_usize("BENCH_PODS", 10);
    let updates = env_usize("BENCH_UPDATES", 3);
    let engines = std::env::var("BENCH_ENGINES").as_deref() == Ok("1");
    if engines {
        println!(
            "fleet: 1 observer node (real daemon) + {nodes} in-process daemons with {pods} pods each, rebooting {wave} at a time"
        );
    } else {
        println!(
            "fleet: 1 observer node (real daemon) + {nodes} others in waves of {wave}; per other node \
             {volumes} VolumeAttachments, 1 shutdown maintenance, {pods} EvictionRequests, {updates} updates each"
        );
    }
    let mut f = Fixture::new("ng-fleet").await;
    let admin = f.admin.clone();
    let ns = f.name.clone();
    let observer = f.name.clone();
    let counters = watches(&admin, &observer);
    f.node.boot();
    let pid = f.node.nodegrace_pid();
    tokio::time::sleep(Duration::from_secs(5)).await;

    if engines {
        let watches = || [counters.now.get(), counters.before.get()];
        let observer = fleet_engines::Observer {
            fixture: &f,
            pid,
            watches: &watches,
        };
        fleet_engines::run(observer, nodes, wave, pods).await;
        let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
        f.cleanup().await;
        println!("cleaned up");
        return;
    }

    let idle_from = realk8s::now_unix();
    let (now0, before0) = (counters.now.get(), counters.before.get());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (now1, before1) = (counters.now.get(), counters.before.get());
    let daemon_idle = real::proc_usage(pid).expect("nodegrace's /proc");
    let api_pid = apiserver_pid();
    let api_before = api_pid.and_then(real::proc_usage);

    let churn_from = realk8s::now_unix();
    let others: Vec<String> = (0..nodes).map(|i| format!("{observer}-o{i}")).collect();
    for chunk in others.chunks(wave) {
        let drains = chunk.iter().map(|node| {
            drain_of(
                admin.clone(),
                ns.clone(),
                node.clone(),
                volumes,
                pods,
                updates,
            )
        });
        futures::future::join_all(drains).await;
    }
    let churn_to = realk8s::now_unix();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (now2, before2) = (counters.now.get(), counters.before.get());
    let daemon_after = real::proc_usage(pid).expect("nodegrace's /proc");
    let api_after = api_pid.and_then(real::proc_usage);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let requests = f.requests();
    let reads: Vec<String> = requests
        .iter()
        .filter(|r| r.verb == "watch" || r.verb == "list")
        .map(|r| r.kind())
        .collect();
    let during = |from: f64, to: f64| {
        let kinds: Vec<String> = requests
            .iter()
            .filter(|r| r.received >= from && r.received <= to && !r.is_watch())
            .map(|r| r.kind())
            .collect();
        format!("{} {kinds:?}", kinds.len())
    };
    let watches_held = requests.iter().filter(|r| r.is_watch()).count();
    let secs = churn_to - churn_from;
    println!("the other nodes' drains took {secs:.1} s");
    println!("watch events and bytes one node receives (idle 10 s | while {nodes} others drain):");
    println!(
        "  now (label-selected maintenances and requests): {} events, {} B | {} events, {} B",
        now1.0 - now0.0,
        now1.1 - now0.1,
        now2.0 - now1.0,
        now2.1 - now1.1
    );
    println!(
        "  before (every maintenance, request, VolumeAttachment): {} events, {} B | {} events, {} B",
        before1.0 - before0.0,
        before1.1 - before0.1,
        before2.0 - before1.0,
        before2.1 - before1.1
    );
    println!(
        "daemon: {watches_held} watches opened since boot; requests other than watches: idle {}, while the others drain {}",
        during(idle_from, churn_from),
        during(churn_from, churn_to + 3.0)
    );
    println!("daemon: lists/watches since boot: {reads:?}");
    println!(
        "daemon RSS {:.1} MiB (anon {:.1}) with no other node's objects, {:.1} MiB (anon {:.1}) with {} VolumeAttachments, {} maintenances, {} EvictionRequests of other nodes; CPU {:.2} s during the drains",
        mib(daemon_idle.rss_kib),
        mib(daemon_idle.rss_anon_kib),
        mib(daemon_after.rss_kib),
        mib(daemon_after.rss_anon_kib),
        nodes * volumes,
        nodes,
        nodes * pods,
        daemon_after.cpu_seconds - daemon_idle.cpu_seconds
    );
    // None when the shared apiserver was restarted meanwhile (another test's outage).
    if let (Some(a), Some(b)) = (api_before, api_after) {
        println!(
            "kube-apiserver: CPU {:.1} s over the drains ({:.0} % of a core), RSS {:.0} -> {:.0} MiB",
            b.cpu_seconds - a.cpu_seconds,
            100.0 * (b.cpu_seconds - a.cpu_seconds) / secs.max(0.001),
            mib(a.rss_kib),
            mib(b.rss_kib)
        );
    }

    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    let nms: Api<NodeMaintenance> = Api::all(admin.clone());
    for node in &others {
        for j in 0..volumes {
            let _ = vas
                .delete(&format!("{node}-v{j}"), &DeleteParams::default())
                .await;
        }
        let _ = nms
            .delete(&shutdown_maintenance_name(node), &DeleteParams::default())
            .await;
    }
    let left = vas
        .list(&ListParams::default().limit(1))
        .await
        .map_or(0, |l| l.items.len());
    f.cleanup().await;
    println!("cleaned up ({left} VolumeAttachments of other tests left in the cluster)");
}
