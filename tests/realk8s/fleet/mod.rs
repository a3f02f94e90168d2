//! A fleet for issue 43's waves, shared by tests/realk8s_wave_fleet.rs and
//! examples/bench_wave.rs: six nspawn nodes (real systemd-logind, nodegrace as packaged) in
//! three zones, selected by one RebootWave of `maxUnavailable: 2`, one a zone,
//! `healthySeconds: 5`; beside them a spare node a zone that no wave selects (a kubelet
//! stand-in only) and a Deployment spread over all nine under a PodDisruptionBudget. The
//! harness plays the machines: a node whose container exits from a reboot is booted again
//! with the same state, its kubelet stand-in stopped meanwhile. [`Sampler`] looks at the
//! fleet every second.
//!
//! Included by `#[path]` where it is used rather than from `realk8s/mod.rs`, so that the
//! other real-tier binaries do not compile it.
#![allow(dead_code)]

pub mod wave;

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
use serde_json::json;

use crate::real::{self, Container};
use crate::realk8s::audit::{self, Request};
use crate::realk8s::fixture::{cleanup_node, cordoned};
use crate::realk8s::kubelet::Kubelet;
use crate::realk8s::node::TestNode;
use crate::realk8s::workload::{self, PodShape, POOL_LABEL};
use crate::realk8s::{self as k8s, now_unix, ControlPlane};

pub const ZONES: [&str; 3] = ["z1", "z2", "z3"];
pub const ZONE_KEY: &str = "topology.kubernetes.io/zone";
/// The label the wave selects its nodes by; the spares do not have it.
pub const WAVE_LABEL: &str = "nodegrace.test/wave";
pub const PENDING_TAINT: &str = "nodegrace.dev/reboot-pending";
pub const WAVE_NODES: usize = 6;
pub const MAX_UNAVAILABLE: usize = 2;
pub const MAX_PER_ZONE: usize = 1;
pub const HEALTHY_SECONDS: u32 = 5;
/// Two pods a node. The budget lets one go at a time, so the two nodes draining together
/// share it (the apiserver refuses the other's evictions until a replacement runs).
pub const REPLICAS: i32 = 18;
pub const MIN_AVAILABLE: i32 = 17;
/// How long the nodes have to join the wave and taint themselves once they need a reboot.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one look at the apiserver may take in a sample: past it, the sample does not
/// know (the apiserver may be away or starting).
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// One reboot as the harness saw it (Unix seconds).
#[derive(Debug, Clone)]
pub struct Reboot {
    pub down: f64,
    /// systemd-nspawn's exit code: 133 when the node asked to be rebooted.
    pub code: Option<i32>,
    /// When the node was booted again and its daemon connected.
    pub up: Option<f64>,
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
pub struct Machine {
    pub name: String,
    pub zone: &'static str,
    power: Arc<Mutex<Power>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(TestNode, Vec<Container>)>>,
}

impl Machine {
    /// `plane` is false while the harness keeps the apiserver away: a machine that reboots
    /// meanwhile boots, but its daemon cannot connect nor its kubelet stand-in register
    /// until it is back.
    fn start(
        node: TestNode,
        zone: &'static str,
        kubelet: Kubelet,
        identity: PathBuf,
        plane: Arc<AtomicBool>,
    ) -> Machine {
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
                    node.boot();
                    while !plane.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    connected(node.container());
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
    pub fn running(&self) -> bool {
        lock(&self.power)
            .pid1
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
    }

    /// Runs a command in the running container, as [`Container::exec`] does; whether it
    /// ran and succeeded.
    pub fn try_exec(&self, argv: &[&str]) -> bool {
        self.remote().try_exec(argv)
    }

    /// A handle that runs commands in the machine from another task.
    pub fn remote(&self) -> Remote {
        Remote {
            name: self.name.clone(),
            power: self.power.clone(),
        }
    }

    pub fn exec(&self, argv: &[&str]) {
        assert!(self.try_exec(argv), "`{}` in {}", argv.join(" "), self.name);
    }

    pub fn boots(&self) -> u32 {
        lock(&self.power).boots
    }

    pub fn reboots(&self) -> Vec<Reboot> {
        lock(&self.power).reboots.clone()
    }

    /// Fails with the machine thread's panic, if it had one.
    pub fn check_alive(&mut self) {
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
        // On a failed run too: the containers go down with the thread's node.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            if let Ok((mut node, earlier)) = thread.join() {
                drop(node.container.take());
                drop(earlier);
            }
        }
    }
}

/// Runs commands in a [`Machine`] from anywhere.
#[derive(Clone)]
pub struct Remote {
    pub name: String,
    power: Arc<Mutex<Power>>,
}

impl Remote {
    /// Runs a command in the running container, as [`Container::exec`] does; whether it
    /// ran and succeeded.
    pub fn try_exec(&self, argv: &[&str]) -> bool {
        let Some(pid1) = lock(&self.power).pid1 else {
            return false;
        };
        std::process::Command::new("nsenter")
            .args(["-t", &pid1.to_string()])
            .args(["-m", "-u", "-i", "-n", "-p", "-C", "-r", "-w"])
            .args(argv)
            .output()
            .is_ok_and(|out| out.status.success())
    }
}

/// Until the daemon of a node just booted is connected to the apiserver (its after-boot
/// reconcile done), as [`TestNode::boot_connected`] waits; longer, for an apiserver that has
/// just come back.
fn connected(c: &Container) {
    real::wait_until(
        "nodegrace connected to the apiserver",
        Duration::from_secs(120),
        || {
            c.journal_of("nodegrace")
                .iter()
                .any(|l| l.contains("after-boot reconcile done"))
                .then_some(())
        },
    );
}

/// A slot of the wave as a sample read it.
#[derive(Debug, Clone)]
pub struct Slot {
    pub node: String,
    pub domain: String,
    pub phase: String,
    /// When the node took it, Unix seconds (the API's whole seconds).
    pub taken: f64,
}

/// What one sample saw. A field the apiserver did not answer for is `None`.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: f64,
    /// Wave nodes whose container is not running.
    pub down: BTreeSet<String>,
    /// Wave nodes cordoned.
    pub cordoned: Option<BTreeSet<String>>,
    /// Wave nodes whose Node is Ready.
    pub ready: Option<BTreeSet<String>>,
    /// The wave's slots; `Some` of none when there is no wave.
    pub slots: Option<Vec<Slot>>,
    /// The budget's healthy pods.
    pub healthy: Option<i32>,
}

impl Sample {
    pub fn unavailable(&self) -> BTreeSet<String> {
        let mut all = self.down.clone();
        all.extend(self.cordoned.iter().flatten().cloned());
        all
    }

    pub fn holds(&self, node: &str) -> Option<bool> {
        self.slot(node).map(|s| s.is_some())
    }

    pub fn slot(&self, node: &str) -> Option<Option<&Slot>> {
        self.slots
            .as_ref()
            .map(|slots| slots.iter().find(|s| s.node == node))
    }

    /// Whether `node` is back: running, Ready and not cordoned.
    pub fn back(&self, node: &str) -> bool {
        !self.down.contains(node)
            && self.ready.as_ref().is_some_and(|r| r.contains(node))
            && self.cordoned.as_ref().is_some_and(|c| !c.contains(node))
    }
}

async fn within<T, E>(read: impl Future<Output = Result<T, E>>) -> Option<T> {
    tokio::time::timeout(READ_TIMEOUT, read).await.ok()?.ok()
}

pub struct Fleet {
    pub cp: &'static ControlPlane,
    pub admin: Client,
    pub ns: String,
    pub wave: String,
    pub machines: Vec<Machine>,
    /// The spare nodes' kubelets, running for as long as the fleet.
    _spares: Vec<Kubelet>,
    pub wave_nodes: Vec<String>,
    /// False while the harness keeps the apiserver away (see [`Machine::start`]).
    pub plane: Arc<AtomicBool>,
}

impl Fleet {
    pub fn zone_of(&self, node: &str) -> &'static str {
        self.machines
            .iter()
            .find(|m| m.name == node)
            .map(|m| m.zone)
            .unwrap_or("")
    }

    pub async fn sample(&self) -> Sample {
        let at = now_unix();
        let down = self
            .machines
            .iter()
            .filter(|m| !m.running())
            .map(|m| m.name.clone())
            .collect();
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let selector = ListParams::default().labels(&format!("{WAVE_LABEL}={}", self.wave));
        let listed = within(nodes.list(&selector)).await;
        let cordoned = listed.as_ref().map(|l| {
            l.items
                .iter()
                .filter(|n| cordoned(n))
                .map(|n| n.name_any())
                .collect()
        });
        let ready = listed.as_ref().map(|l| {
            l.items
                .iter()
                .filter(|n| ready(n))
                .map(|n| n.name_any())
                .collect()
        });
        // Read after the machines and Nodes: a slot is taken before its node goes down and
        // freed only a healthy time after it is back, so a node seen down or cordoned above
        // without a slot here never had one.
        let waves: Api<RebootWave> = Api::all(self.admin.clone());
        let slots = match within(waves.get_opt(&self.wave)).await {
            Some(Some(w)) => Some(slots_of(w)),
            Some(None) => Some(Vec::new()),
            None => None,
        };
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.admin.clone(), &self.ns);
        let healthy = within(pdbs.get("web"))
            .await
            .and_then(|p| p.status?.current_healthy);
        Sample {
            at,
            down,
            cordoned,
            ready,
            slots,
            healthy,
        }
    }

    /// The nodes whose `status.members` entry says they wait for a slot.
    pub async fn waiting(&self) -> BTreeSet<String> {
        let waves: Api<RebootWave> = Api::all(self.admin.clone());
        let status = waves.get(&self.wave).await.ok().and_then(|w| w.status);
        status.map_or_else(BTreeSet::new, |s| {
            s.members
                .into_iter()
                .filter(|m| m.waiting)
                .map(|m| m.node)
                .collect()
        })
    }

    /// Whether every wave node waits in the wave and is tainted reboot-pending.
    pub async fn all_waiting(&self) -> bool {
        let members = self.waiting().await.len();
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let selector = ListParams::default().labels(&format!("{WAVE_LABEL}={}", self.wave));
        let tainted = nodes
            .list(&selector)
            .await
            .map_or(0, |l| l.items.iter().filter(|n| pending(n)).count());
        members == WAVE_NODES && tainted == WAVE_NODES
    }

    /// Opens the wave's window (no windows: always open), or closes it.
    pub async fn set_window(&self, open: bool) {
        let windows = if open {
            serde_json::Value::Null
        } else {
            closed_window()
        };
        let waves: Api<RebootWave> = Api::all(self.admin.clone());
        waves
            .patch(
                &self.wave,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"windows": windows}})),
            )
            .await
            .expect("the wave's window");
    }

    /// Every reboot each machine has had so far, to tell a run's own from earlier ones.
    pub fn reboot_marks(&self) -> Vec<usize> {
        self.machines.iter().map(|m| m.reboots().len()).collect()
    }

    /// Each machine's reboots after `marks` ([`reboot_marks`](Self::reboot_marks)).
    pub fn reboots_since(&self, marks: &[usize]) -> Vec<(String, Vec<Reboot>)> {
        self.machines
            .iter()
            .zip(marks)
            .map(|(m, &from)| (m.name.clone(), m.reboots().split_off(from)))
            .collect()
    }

    /// Until the Deployment is available and its budget counts every pod healthy.
    pub async fn settled(&self) {
        let deployments: Api<Deployment> = Api::namespaced(self.admin.clone(), &self.ns);
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.admin.clone(), &self.ns);
        wait_for(
            "the Deployment available and its budget computed",
            Duration::from_secs(180),
            || {
                let (deployments, pdbs) = (deployments.clone(), pdbs.clone());
                async move {
                    let d = deployments.get("web").await.ok()?.status?;
                    let healthy = pdbs.get("web").await.ok()?.status?.current_healthy?;
                    (d.available_replicas? == REPLICAS
                        && d.updated_replicas? == REPLICAS
                        && d.replicas? == REPLICAS
                        && healthy == REPLICAS)
                        .then_some(())
                }
            },
        )
        .await;
    }

    /// Every pod of the Deployment scheduled anew over the fleet as it stands: scaled to
    /// none and back, then [`settled`](Self::settled).
    pub async fn reschedule(&self) {
        let deployments: Api<Deployment> = Api::namespaced(self.admin.clone(), &self.ns);
        let scale = |n: i32| {
            let deployments = deployments.clone();
            async move {
                deployments
                    .patch(
                        "web",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": n}})),
                    )
                    .await
                    .expect("scaling the Deployment");
            }
        };
        scale(0).await;
        let (admin, ns) = (self.admin.clone(), self.ns.clone());
        wait_for(
            "the Deployment's pods gone",
            Duration::from_secs(120),
            || {
                let (admin, ns) = (admin.clone(), ns.clone());
                async move {
                    let pods: Api<Pod> = Api::namespaced(admin, &ns);
                    let left = pods.list(&ListParams::default()).await.ok()?.items.len();
                    (left == 0).then_some(())
                }
            },
        )
        .await;
        scale(REPLICAS).await;
        self.settled().await;
    }

    /// The requests of the wave nodes' daemons from `since` to `end`, from the apiserver's
    /// audit log (their own identity, and the kubelet's for pod writes).
    pub async fn daemon_requests(&self, since: f64, end: f64) -> Vec<Request> {
        let users: Vec<String> = self
            .wave_nodes
            .iter()
            .flat_map(|n| [format!("nodegrace:node:{n}"), format!("system:node:{n}")])
            .collect();
        let log = self.cp.audit_log();
        tokio::task::spawn_blocking(move || audit::requests_of_users(&log, &users, since))
            .await
            .expect("audit log")
            .into_iter()
            .filter(|r| r.user.starts_with("nodegrace:") || r.user_agent.starts_with("nodegrace/"))
            .filter(|r| r.received <= end)
            .collect()
    }

    /// Stops playing the machines: every wave node (still running) with its boots.
    pub fn finish(&mut self) -> Vec<Finished> {
        self.machines
            .iter_mut()
            .map(|m| {
                let (node, boots) = m.finish();
                Finished {
                    name: m.name.clone(),
                    node,
                    boots,
                }
            })
            .collect()
    }
}

pub fn slots_of(w: RebootWave) -> Vec<Slot> {
    let millis = |t: &jiff::Timestamp| t.as_millisecond() as f64 / 1000.0;
    w.status
        .unwrap_or_default()
        .slots
        .iter()
        .map(|s| Slot {
            node: s.node.clone(),
            domain: s.domain.clone(),
            phase: format!("{:?}", s.phase),
            taken: millis(&s.taken.0),
        })
        .collect()
}

/// Looks at the fleet once a second and keeps what it saw.
pub struct Sampler {
    tick: tokio::time::Interval,
    pub samples: Vec<Sample>,
}

impl Sampler {
    pub fn new() -> Sampler {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Sampler {
            tick,
            samples: Vec::new(),
        }
    }

    /// The next sample, a second after the last; fails with a machine thread's panic.
    pub async fn next(&mut self, f: &mut Fleet) -> &Sample {
        self.tick.tick().await;
        for m in &mut f.machines {
            m.check_alive();
        }
        let s = f.sample().await;
        self.samples.push(s);
        self.samples.last().expect("just pushed")
    }
}

/// A wave node after the runs: its node (still running) and the containers of its boots.
pub struct Finished {
    pub name: String,
    pub node: TestNode,
    pub boots: Vec<Container>,
}

impl Finished {
    pub fn all_boots(&self) -> impl Iterator<Item = &Container> {
        self.boots.iter().chain(self.node.container.iter())
    }

    /// The daemon's journal of every boot.
    pub fn journal(&self) -> String {
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
    pub fn shut(mut self) {
        drop(self.node.container.take());
        drop(self.boots);
    }
}

/// Polls `check` every 200 ms until it gives a value or `timeout` passes.
pub async fn wait_for<T, F: Future<Output = Option<T>>>(
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

pub fn pending(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == PENDING_TAINT && t.effect == "PreferNoSchedule")
        })
}

fn ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What a run with names from `prefix` leaves in the cluster, removed once it is over,
/// passed or failed (its containers are gone by then).
pub async fn remove_leftovers(prefix: &str) {
    let cp = k8s::running_control_plane().await;
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

/// Runs `run` on a fleet named from `prefix` in a task of its own, so that a failed run is
/// cleaned up too; then fails with its panic, if it had one.
pub async fn with_fleet<F>(prefix: &str, run: impl FnOnce(Fleet) -> F + Send + 'static)
where
    F: Future<Output = ()> + Send + 'static,
{
    let outcome = tokio::spawn({
        let prefix = prefix.to_owned();
        async move { run(fleet(&prefix).await).await }
    })
    .await;
    remove_leftovers(prefix).await;
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("the fleet's task: {e}"),
        }
    }
}

async fn create_wave(admin: &Client, wave: &str) {
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
}

/// Boots `nodes` two at a time, which keeps a 2-core machine responsive.
fn boot_all(mut nodes: Vec<TestNode>) -> Vec<TestNode> {
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
        "{} wave nodes booted in {:.1} s",
        booted.len(),
        started.elapsed().as_secs_f64()
    );
    booted
}

/// Nine nodes (six of the wave, booted; a spare a zone), the wave with its window closed
/// and the Deployment with its budget, all pods running.
pub async fn fleet(prefix: &str) -> Fleet {
    let cp = k8s::running_control_plane().await;
    let admin = cp.admin().await;
    let ns = prefix.to_owned();
    workload::create_namespace(&admin, &ns).await;
    let wave = prefix.to_owned();
    create_wave(&admin, &wave).await;

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
    let plane = Arc::new(AtomicBool::new(true));
    let machines = boot_all(nodes)
        .into_iter()
        .zip(kubelets)
        .map(|(node, (kubelet, zone))| {
            let identity = cp.kubelet_identity(&node.name);
            Machine::start(node, zone, kubelet, identity, plane.clone())
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
    let f = Fleet {
        cp,
        admin,
        ns,
        wave,
        machines,
        _spares: spares,
        wave_nodes,
        plane,
    };
    f.settled().await;
    f
}

pub async fn pods_by_node(admin: &Client, ns: &str) -> BTreeMap<String, Vec<String>> {
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

/// A pod a drain disrupted: an eviction the apiserver granted, or a DELETE a daemon made
/// (its escalation).
pub fn disruption(r: &Request, ns: &str) -> bool {
    r.namespace == ns
        && r.resource == "pods"
        && (200..300).contains(&r.code)
        && ((r.verb == "create" && r.subresource == "eviction")
            || (r.verb == "delete" && r.subresource.is_empty()))
}
