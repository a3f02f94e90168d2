//! Real-control-plane tier: a fleet reboots in turns (issue 43, item 7). Six nspawn nodes
//! (real systemd-logind, nodegrace as packaged) in three zones make one RebootWave of
//! `maxUnavailable: 2`, one a zone, `healthySeconds: 5`; beside them a spare node a zone
//! that the wave does not select (a kubelet stand-in only) and a Deployment spread over all
//! nine under a PodDisruptionBudget. Every wave node is told it needs a reboot
//! (`/run/reboot-required`, as Debian's packages write it) while the wave's window is
//! closed, as updates land by day for a reboot at night; once all have joined the wave and
//! tainted themselves the window opens. The harness plays the machines: a node whose
//! container exits from a reboot is booted again with the same state, its kubelet stand-in
//! stopped meanwhile.
//!
//! Sampled every second: never more than 2 wave nodes unavailable (container down or Node
//! cordoned), never more than 1 a zone, no node down without a slot. At the end every wave
//! node rebooted exactly once, no slot is left and no pod was evicted twice (no pod made
//! during the wave was evicted in its turn). The wave's times, its evictions and each node's
//! requests to the apiserver are printed.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

mod real;
mod realk8s;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodegrace::RebootWave;
use real::Container;
use realk8s::audit::{self, Request};
use realk8s::fixture::{cleanup_node, cordoned};
use realk8s::kubelet::Kubelet;
use realk8s::node::TestNode;
use realk8s::workload::{self, PodShape, POOL_LABEL};
use realk8s::{now_unix, ControlPlane};
use serde_json::json;

const ZONES: [&str; 3] = ["z1", "z2", "z3"];
const ZONE_KEY: &str = "topology.kubernetes.io/zone";
/// The label the wave selects its nodes by; the spares do not have it.
const WAVE_LABEL: &str = "nodegrace.test/wave";
const PENDING_TAINT: &str = "nodegrace.dev/reboot-pending";
const WAVE_NODES: usize = 6;
const MAX_UNAVAILABLE: usize = 2;
const MAX_PER_ZONE: usize = 1;
const HEALTHY_SECONDS: u32 = 5;
/// Two pods a node. The budget lets one go at a time, so the two nodes draining together
/// share it (the apiserver refuses the other's evictions until a replacement runs).
const REPLICAS: i32 = 18;
const MIN_AVAILABLE: i32 = 17;
/// Three turns of a drain, a container's reboot and the healthy time, on a loaded 2-core
/// machine.
const WAVE_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the nodes have to join the wave and taint themselves once they need a reboot.
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the fleet is watched after the wave, for a node that would reboot again.
const AFTER_WAVE: Duration = Duration::from_secs(6);

/// One reboot as the harness saw it (Unix seconds).
#[derive(Debug, Clone)]
struct Reboot {
    down: f64,
    /// systemd-nspawn's exit code: 133 when the node asked to be rebooted.
    code: Option<i32>,
    /// When the node was booted again and its daemon connected.
    up: Option<f64>,
}

#[derive(Debug, Default)]
struct Power {
    /// The running container's PID 1 on the host; none while the machine is down.
    pid1: Option<i32>,
    boots: u32,
    reboots: Vec<Reboot>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A wave node played as a machine: a thread boots its container again whenever it exits
/// from a reboot. The node's state directory is on the host, so the boot is a reboot.
struct Machine {
    name: String,
    zone: &'static str,
    power: Arc<Mutex<Power>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(TestNode, Vec<Container>)>>,
}

impl Machine {
    fn start(node: TestNode, zone: &'static str, kubelet: Kubelet, identity: PathBuf) -> Machine {
        let name = node.name.clone();
        let power = Arc::new(Mutex::new(Power {
            pid1: Some(node.container().pid1),
            boots: 1,
            reboots: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let runtime = tokio::runtime::Handle::current();
        let thread = {
            let (power, stop, name) = (power.clone(), stop.clone(), name.clone());
            std::thread::spawn(move || {
                let (mut node, mut kubelet) = (node, kubelet);
                // The containers of earlier boots, for their journals.
                let mut earlier = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let running = node.container.as_mut().expect("a booted node");
                    let Some(status) = running.wait_exit(Duration::from_millis(200)) else {
                        continue;
                    };
                    let down = now_unix();
                    kubelet.stop();
                    {
                        let mut p = lock(&power);
                        p.pid1 = None;
                        p.reboots.push(Reboot {
                            down,
                            code: status.code(),
                            up: None,
                        });
                    }
                    let gone = node.container.take().expect("the exited container");
                    assert!(
                        status.success() || status.code() == Some(133),
                        "node {name}: systemd-nspawn exited with {status}:\n{}",
                        gone.journal_text()
                    );
                    earlier.push(gone);
                    node.boot_connected();
                    kubelet = runtime.block_on(Kubelet::start(&identity, &name, None));
                    let mut p = lock(&power);
                    p.pid1 = Some(node.container().pid1);
                    p.boots += 1;
                    if let Some(last) = p.reboots.last_mut() {
                        last.up = Some(now_unix());
                    }
                }
                (node, earlier)
            })
        };
        Machine {
            name,
            zone,
            power,
            stop,
            thread: Some(thread),
        }
    }

    /// Whether the machine is up: its container runs (it may still be booting).
    fn running(&self) -> bool {
        lock(&self.power)
            .pid1
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
    }

    /// Runs a command in the running container, as [`Container::exec`] does.
    fn exec(&self, argv: &[&str]) {
        let pid1 = lock(&self.power)
            .pid1
            .expect("a running machine")
            .to_string();
        let out = std::process::Command::new("nsenter")
            .args(["-t", &pid1, "-m", "-u", "-i", "-n", "-p", "-C", "-r", "-w"])
            .args(argv)
            .output()
            .expect("run nsenter");
        assert!(
            out.status.success(),
            "`{}` in {}: {out:?}",
            argv.join(" "),
            self.name
        );
    }

    fn boots(&self) -> u32 {
        lock(&self.power).boots
    }

    fn reboots(&self) -> Vec<Reboot> {
        lock(&self.power).reboots.clone()
    }

    /// Fails the test with the machine thread's panic, if it had one.
    fn check_alive(&mut self) {
        if self.thread.as_ref().is_some_and(JoinHandle::is_finished) {
            if let Err(panic) = self.thread.take().expect("checked").join() {
                std::panic::resume_unwind(panic);
            }
            panic!("machine {} stopped on its own", self.name);
        }
    }

    /// Stops playing the machine; returns the node (still running) and its earlier boots.
    fn finish(&mut self) -> (TestNode, Vec<Container>) {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().expect("a running machine").join() {
            Ok(done) => done,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // On a failed test too: the containers go down with the thread's node.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            if let Ok((mut node, earlier)) = thread.join() {
                drop(node.container.take());
                drop(earlier);
            }
        }
    }
}

/// What one sample saw.
#[derive(Debug, Clone)]
struct Sample {
    at: f64,
    /// Wave nodes whose container is not running.
    down: BTreeSet<String>,
    /// Wave nodes cordoned; none when the Nodes could not be read.
    cordoned: Option<BTreeSet<String>>,
    /// The wave's slots (node, domain, phase); none when the wave could not be read.
    slots: Option<Vec<(String, String, String)>>,
    /// The budget's healthy pods.
    healthy: Option<i32>,
}

impl Sample {
    fn unavailable(&self) -> BTreeSet<String> {
        let mut all = self.down.clone();
        all.extend(self.cordoned.iter().flatten().cloned());
        all
    }

    fn holds(&self, node: &str) -> Option<bool> {
        self.slots
            .as_ref()
            .map(|s| s.iter().any(|(n, _, _)| n == node))
    }
}

struct Fleet {
    cp: &'static ControlPlane,
    admin: Client,
    ns: String,
    wave: String,
    machines: Vec<Machine>,
    /// The spare nodes' kubelets, running for as long as the fleet.
    _spares: Vec<Kubelet>,
    wave_nodes: Vec<String>,
}

impl Fleet {
    fn zone_of(&self, node: &str) -> &'static str {
        self.machines
            .iter()
            .find(|m| m.name == node)
            .map(|m| m.zone)
            .unwrap_or("")
    }

    async fn sample(&self) -> Sample {
        let at = now_unix();
        let down = self
            .machines
            .iter()
            .filter(|m| !m.running())
            .map(|m| m.name.clone())
            .collect();
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let selector = ListParams::default().labels(&format!("{WAVE_LABEL}={}", self.wave));
        let cordoned = nodes.list(&selector).await.ok().map(|l| {
            l.items
                .iter()
                .filter(|n| cordoned(n))
                .map(|n| n.name_any())
                .collect()
        });
        // Read after the machines and Nodes: a slot is taken before its node goes down and
        // freed only a healthy time after it is back, so a node seen down or cordoned above
        // without a slot here never had one.
        let waves: Api<RebootWave> = Api::all(self.admin.clone());
        let slots = waves.get(&self.wave).await.ok().map(|w| {
            w.status
                .unwrap_or_default()
                .slots
                .iter()
                .map(|s| (s.node.clone(), s.domain.clone(), format!("{:?}", s.phase)))
                .collect()
        });
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.admin.clone(), &self.ns);
        let healthy = pdbs
            .get("web")
            .await
            .ok()
            .and_then(|p| p.status?.current_healthy);
        Sample {
            at,
            down,
            cordoned,
            slots,
            healthy,
        }
    }

    /// Whether every wave node is a member of the wave and tainted reboot-pending.
    async fn all_waiting(&self) -> bool {
        let waves: Api<RebootWave> = Api::all(self.admin.clone());
        let members = waves
            .get(&self.wave)
            .await
            .ok()
            .and_then(|w| w.status)
            .map_or(0, |s| s.members.len());
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let selector = ListParams::default().labels(&format!("{WAVE_LABEL}={}", self.wave));
        let tainted = nodes
            .list(&selector)
            .await
            .map_or(0, |l| l.items.iter().filter(|n| pending(n)).count());
        members == WAVE_NODES && tainted == WAVE_NODES
    }

    /// What breaks the wave's limits in one sample.
    fn violations(&self, s: &Sample, opened: Option<f64>) -> Vec<String> {
        let mut out = Vec::new();
        let unavailable = s.unavailable();
        if unavailable.len() > MAX_UNAVAILABLE {
            out.push(format!(
                "{} nodes unavailable: {unavailable:?}",
                unavailable.len()
            ));
        }
        for zone in ZONES {
            let here: Vec<&String> = unavailable
                .iter()
                .filter(|n| self.zone_of(n) == zone)
                .collect();
            if here.len() > MAX_PER_ZONE {
                out.push(format!(
                    "zone {zone}: {} nodes unavailable: {here:?}",
                    here.len()
                ));
            }
        }
        for node in &unavailable {
            if s.holds(node) == Some(false) {
                out.push(format!("{node} unavailable without a slot"));
            }
        }
        if let Some(slots) = &s.slots {
            if slots.len() > MAX_UNAVAILABLE {
                out.push(format!("{} slots held: {slots:?}", slots.len()));
            }
            if !slots.is_empty() && opened.is_none() {
                out.push(format!(
                    "slots taken while the window was closed: {slots:?}"
                ));
            }
        }
        out
    }
}

/// A wave node after the wave: its node (still running) and the containers of its boots.
struct Finished {
    name: String,
    node: TestNode,
    boots: Vec<Container>,
}

impl Finished {
    fn all_boots(&self) -> impl Iterator<Item = &Container> {
        self.boots.iter().chain(self.node.container.iter())
    }

    /// The daemon's journal of every boot.
    fn journal(&self) -> String {
        let mut text = String::new();
        for (boot, c) in self.all_boots().enumerate() {
            text.push_str(&format!("--- {} boot {}\n", self.name, boot + 1));
            for line in c
                .journal_text()
                .lines()
                .filter(|l| l.contains(" nodegrace["))
            {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// Containers down before the node's directories go.
    fn shut(mut self) {
        drop(self.node.container.take());
        drop(self.boots);
    }
}

/// Polls `check` every 200 ms until it gives a value or `timeout` passes.
async fn wait_for<T, F: Future<Output = Option<T>>>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn label(admin: &Client, node: &str, labels: serde_json::Value) {
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .unwrap_or_else(|e| panic!("labelling node {node}: {e}"));
}

/// A window that is closed now: half an hour starting twelve hours from now (UTC).
fn closed_window() -> serde_json::Value {
    let hour = (chrono::Utc::now().format("%H").to_string())
        .parse::<u32>()
        .expect("an hour");
    let start = (hour + 12) % 24;
    json!([{"start": format!("{start:02}:00"), "end": format!("{start:02}:30"), "timeZone": "UTC"}])
}

fn pending(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == PENDING_TAINT && t.effect == "PreferNoSchedule")
        })
}

/// What a run with names from `prefix` leaves in the cluster, removed once it is over,
/// passed or failed (its containers are gone by then).
async fn remove_leftovers(prefix: &str) {
    let cp = realk8s::running_control_plane().await;
    let admin = cp.admin().await;
    let waves: Api<RebootWave> = Api::all(admin.clone());
    let _ = waves.delete(prefix, &DeleteParams::default()).await;
    workload::delete_namespace(&admin, prefix).await;
    let nodes = (0..WAVE_NODES)
        .map(|i| format!("{prefix}-{i}"))
        .chain(ZONES.iter().map(|z| format!("{prefix}-spare-{z}")));
    for node in nodes {
        cleanup_node(&admin, &node).await;
    }
}

/// Nine nodes (six of the wave, booted; a spare a zone), the wave with its window closed
/// and the Deployment with its budget, all pods running.
async fn fleet(prefix: &str) -> Fleet {
    let cp = realk8s::running_control_plane().await;
    let admin = cp.admin().await;
    let ns = prefix.to_owned();
    workload::create_namespace(&admin, &ns).await;

    let wave = prefix.to_owned();
    let waves: Api<RebootWave> = Api::all(admin.clone());
    let spec: RebootWave = serde_json::from_value(json!({
        "apiVersion": "nodegrace.dev/v1alpha1", "kind": "RebootWave",
        "metadata": {"name": wave},
        "spec": {
            "nodeSelector": {"matchLabels": {WAVE_LABEL: wave}},
            "maxUnavailable": MAX_UNAVAILABLE,
            "perDomain": {"topologyKey": ZONE_KEY, "maxUnavailable": MAX_PER_ZONE},
            "healthySeconds": HEALTHY_SECONDS,
            "windows": closed_window(),
        },
    }))
    .expect("wave");
    waves
        .create(&PostParams::default(), &spec)
        .await
        .unwrap_or_else(|e| panic!("creating wave {wave}: {e}"));

    let mut spares = Vec::new();
    for zone in ZONES {
        let name = format!("{prefix}-spare-{zone}");
        let kubelet = Kubelet::start(&cp.kubelet_identity(&name), &name, None).await;
        label(&admin, &name, json!({ZONE_KEY: zone, POOL_LABEL: prefix})).await;
        spares.push(kubelet);
    }

    let mut kubelets = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..WAVE_NODES {
        let name = format!("{prefix}-{i}");
        let zone = ZONES[i % ZONES.len()];
        let kubelet = Kubelet::start(&cp.kubelet_identity(&name), &name, None).await;
        label(
            &admin,
            &name,
            json!({ZONE_KEY: zone, POOL_LABEL: prefix, WAVE_LABEL: wave}),
        )
        .await;
        let mut node = TestNode::new(
            &name,
            cp.nodegrace_identity(&name),
            cp.kubelet_identity(&name),
        );
        // Six daemons on the host's network: the shipped metrics port is the first's.
        node.config_dropins.push((
            "50-metrics.toml".into(),
            "[metrics]\nlisten = \"\"\n".into(),
        ));
        kubelets.push((kubelet, zone));
        nodes.push(node);
    }
    let wave_nodes: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();

    // Two boots at a time keep a 2-core machine responsive.
    let started = std::time::Instant::now();
    let mut booted = Vec::new();
    while !nodes.is_empty() {
        let pair: Vec<TestNode> = nodes.drain(..nodes.len().min(2)).collect();
        let threads: Vec<JoinHandle<TestNode>> = pair
            .into_iter()
            .map(|mut n| {
                std::thread::spawn(move || {
                    n.boot_connected();
                    n
                })
            })
            .collect();
        for t in threads {
            booted.push(tokio::task::block_in_place(|| t.join()).expect("boot"));
        }
    }
    println!(
        "{WAVE_NODES} wave nodes booted in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let machines = booted
        .into_iter()
        .zip(kubelets)
        .map(|(node, (kubelet, zone))| {
            let identity = cp.kubelet_identity(&node.name);
            Machine::start(node, zone, kubelet, identity)
        })
        .collect();

    workload::deployment(
        &admin,
        &ns,
        "",
        REPLICAS,
        PodShape::new("web").in_pool(prefix),
    )
    .await;
    workload::pdb(&admin, &ns, "web", MIN_AVAILABLE).await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), &ns);
    wait_for(
        "the Deployment available and its budget computed",
        Duration::from_secs(120),
        || {
            let (deployments, pdbs) = (deployments.clone(), pdbs.clone());
            async move {
                let available = deployments
                    .get("web")
                    .await
                    .ok()?
                    .status?
                    .available_replicas?;
                let healthy = pdbs.get("web").await.ok()?.status?.current_healthy?;
                (available == REPLICAS && healthy == REPLICAS).then_some(())
            }
        },
    )
    .await;

    Fleet {
        cp,
        admin,
        ns,
        wave,
        machines,
        _spares: spares,
        wave_nodes,
    }
}

async fn pods_by_node(admin: &Client, ns: &str) -> BTreeMap<String, Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in pods.list(&ListParams::default()).await.expect("pods").items {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        by_node.entry(node).or_default().push(p.name_any());
    }
    by_node
}

/// A pod the drain disrupted: an eviction the apiserver granted, or a DELETE the daemon
/// made (its escalation).
fn disruption(r: &Request, ns: &str) -> bool {
    r.namespace == ns
        && r.resource == "pods"
        && (200..300).contains(&r.code)
        && ((r.verb == "create" && r.subresource == "eviction")
            || (r.verb == "delete" && r.subresource.is_empty()))
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
/// the wave's status: the first after joining, and the last.
fn slot_writes(requests: &[Request], node: &str) -> (Option<f64>, Option<f64>) {
    let user = format!("nodegrace:node:{node}");
    let writes: Vec<f64> = requests
        .iter()
        .filter(|r| r.user == user && r.resource == "rebootwaves" && r.subresource == "status")
        .filter(|r| r.verb == "update" && r.code == 200)
        .map(|r| r.completed)
        .collect();
    (
        writes.get(1).copied(),
        writes.last().copied().filter(|_| writes.len() > 2),
    )
}

/// The nodes' slots over time, from the samples: (node, first seen, first seen gone).
fn slot_spans(samples: &[Sample]) -> Vec<(String, f64, Option<f64>)> {
    let mut spans: Vec<(String, f64, Option<f64>)> = Vec::new();
    for s in samples {
        let Some(slots) = &s.slots else { continue };
        for (node, _, _) in slots {
            if !spans.iter().any(|(n, _, end)| n == node && end.is_none()) {
                spans.push((node.clone(), s.at, None));
            }
        }
        for (node, _, end) in spans.iter_mut() {
            if end.is_none() && !slots.iter().any(|(n, _, _)| n == node) {
                *end = Some(s.at);
            }
        }
    }
    spans.sort_by(|a, b| a.1.total_cmp(&b.1));
    spans
}

/// Six nodes in three zones need a reboot at once: they reboot two at a time, never two
/// of a zone, each once, the wave leaves no slot, and no pod is evicted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_reboots_two_at_a_time_one_a_zone_and_no_pod_is_evicted_twice() {
    if !realk8s::enabled(
        "realk8s_wave_fleet::a_fleet_reboots_two_at_a_time_one_a_zone_and_no_pod_is_evicted_twice",
    ) {
        return;
    }
    real::require_prerequisites();
    let prefix = realk8s::unique("ng-wf");
    // A task of its own, so that a failed run is cleaned up too.
    let outcome = tokio::spawn({
        let prefix = prefix.clone();
        async move { reboot_in_turns(fleet(&prefix).await).await }
    })
    .await;
    remove_leftovers(&prefix).await;
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("the wave's task: {e}"),
        }
    }
}

async fn reboot_in_turns(mut f: Fleet) {
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

    // Every node learns at once that it needs a reboot, while the wave's window is closed:
    // each joins and is avoided by the scheduler, and none reboots yet.
    let touched = now_unix();
    for m in &f.machines {
        m.exec(&["touch", "/run/reboot-required"]);
    }
    let waves: Api<RebootWave> = Api::all(f.admin.clone());
    let mut samples: Vec<Sample> = Vec::new();
    let mut broken: Vec<(f64, String)> = Vec::new();
    let mut all_waiting: Option<f64> = None;
    let mut originals: BTreeSet<String> = BTreeSet::new();
    let mut opened: Option<f64> = None;
    let mut ended: Option<f64> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for m in &mut f.machines {
            m.check_alive();
        }
        let s = f.sample().await;
        broken.extend(f.violations(&s, opened).into_iter().map(|v| (s.at, v)));
        let at = s.at;
        let done = f.machines.iter().all(|m| m.boots() >= 2 && m.running())
            && s.slots.as_ref().is_some_and(Vec::is_empty)
            && s.cordoned.as_ref().is_some_and(BTreeSet::is_empty);
        samples.push(s);
        if opened.is_none() {
            if f.all_waiting().await {
                // The pods as the wave finds them: any other was made during the wave.
                originals = pods_by_node(&f.admin, &f.ns)
                    .await
                    .into_values()
                    .flatten()
                    .collect();
                all_waiting = Some(now_unix());
                waves
                    .patch(
                        &f.wave,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"windows": null}})),
                    )
                    .await
                    .expect("opening the wave's window");
                opened = Some(now_unix());
            } else if at - touched > JOIN_TIMEOUT.as_secs_f64() {
                break;
            }
            continue;
        }
        match ended {
            None if done => ended = Some(at),
            Some(end) if at - end >= AFTER_WAVE.as_secs_f64() => break,
            _ => {}
        }
        if ended.is_none() && opened.is_some_and(|o| at - o > WAVE_TIMEOUT.as_secs_f64()) {
            break;
        }
    }
    let end = ended.unwrap_or_else(now_unix);
    let opened = opened.unwrap_or(end);
    let boots: Vec<(String, u32, Vec<Reboot>)> = f
        .machines
        .iter()
        .map(|m| (m.name.clone(), m.boots(), m.reboots()))
        .collect();
    let finished: Vec<Finished> = f
        .machines
        .iter_mut()
        .map(|m| {
            let (node, boots) = m.finish();
            Finished {
                name: m.name.clone(),
                node,
                boots,
            }
        })
        .collect();

    // The record, from the apiserver's audit log: every request of the wave nodes'
    // daemons (their own identity, and the kubelet's for pod writes).
    let users: Vec<String> = f
        .wave_nodes
        .iter()
        .flat_map(|n| [format!("nodegrace:node:{n}"), format!("system:node:{n}")])
        .collect();
    let log = f.cp.audit_log();
    let requests: Vec<Request> =
        tokio::task::spawn_blocking(move || audit::requests_of_users(&log, &users, touched))
            .await
            .expect("audit log")
            .into_iter()
            .filter(|r| r.user.starts_with("nodegrace:") || r.user_agent.starts_with("nodegrace/"))
            .filter(|r| r.received <= end)
            .collect();
    let mut evicted: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests.iter().filter(|r| disruption(r, &f.ns)) {
        *evicted.entry(r.name.clone()).or_default() += 1;
    }
    let twice: Vec<&String> = evicted
        .iter()
        .filter(|(pod, n)| **n > 1 || !originals.contains(*pod))
        .map(|(pod, _)| pod)
        .collect();
    let refused = requests
        .iter()
        .filter(|r| r.namespace == f.ns && r.subresource == "eviction" && r.code == 429)
        .count();
    // A node watches its own Node and pods only (issue 43: no cluster-wide watch of either).
    let unscoped: Vec<String> = requests
        .iter()
        .filter(|r| r.is_watch() && (r.resource == "nodes" || r.resource == "pods"))
        .filter(|r| !r.uri.contains("fieldSelector="))
        .map(|r| format!("{} {}", r.user, r.uri))
        .collect();

    println!(
        "--- wave of {WAVE_NODES} nodes, maxUnavailable {MAX_UNAVAILABLE}, {MAX_PER_ZONE} a zone, healthy {HEALTHY_SECONDS} s"
    );
    if let Some(all) = all_waiting {
        println!(
            "every node a member and tainted {:.1} s after the sentinels",
            all - touched
        );
    }
    match ended {
        Some(end) => println!(
            "wave duration (window opened to no slot left): {:.1} s",
            end - opened
        ),
        None => println!("the wave did not end within {WAVE_TIMEOUT:?}"),
    }
    // Each node's turn: its slot taken and freed as the apiserver completed the writes (the
    // samples when there were none), its container down and booted again as the harness saw.
    let spans = slot_spans(&samples);
    let mut turns: Vec<Turn> = spans
        .iter()
        .map(|(node, from, to)| {
            let (took, freed) = slot_writes(&requests, node);
            let reboot = boots
                .iter()
                .find(|(n, _, _)| n == node)
                .and_then(|(_, _, r)| r.first().cloned());
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
    println!("from a slot freed to the next taken (s): {handovers:?}");
    println!(
        "evictions: {} of {} pods ({refused} refused by the budget); pods evicted twice: {}",
        evicted.values().sum::<usize>(),
        evicted.len(),
        twice.len()
    );
    let least_healthy = samples.iter().filter_map(|s| s.healthy).min();
    println!(
        "the budget's healthy pods, fewest seen: {least_healthy:?} (minAvailable {MIN_AVAILABLE})"
    );
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
    let codes: Vec<(&String, u32, Vec<Option<i32>>)> = boots
        .iter()
        .map(|(n, b, r)| (n, *b, r.iter().map(|r| r.code).collect()))
        .collect();
    println!("boots (node, boots, systemd-nspawn exit codes): {codes:?}");

    let mut failures: Vec<String> = broken
        .iter()
        .map(|(at, v)| format!("at {:.1} s: {v}", at - opened))
        .collect();
    if all_waiting.is_none() {
        failures.push(format!(
            "not every wave node joined the wave and was tainted within {JOIN_TIMEOUT:?} of its sentinel"
        ));
    } else if ended.is_none() {
        failures.push(format!("the wave did not end within {WAVE_TIMEOUT:?}"));
    }
    for (node, n, _) in &boots {
        if *n != 2 {
            failures.push(format!(
                "{node} booted {n} times (rebooted {} times)",
                n.saturating_sub(1)
            ));
        }
    }
    if !twice.is_empty() {
        failures.push(format!("pods evicted twice: {twice:?}"));
    }
    if evicted.is_empty() {
        failures.push("no pod was evicted: the drains did nothing".into());
    }
    if !unscoped.is_empty() {
        failures.push(format!(
            "cluster-wide watches of Nodes or pods: {unscoped:?}"
        ));
    }
    if !failures.is_empty() {
        let journals: String = finished.iter().map(Finished::journal).collect();
        panic!(
            "{}\n\nthe daemons' journals:\n{journals}",
            failures.join("\n")
        );
    }
    for done in finished {
        done.shut();
    }
}
