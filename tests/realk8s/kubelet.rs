//! A kubelet stand-in for a real apiserver, with the kubelet's own identity
//! (`system:node:<node>`, so NodeRestriction applies to it as to a real kubelet):
//! - registers the Node (hostname and os labels, capacity, Ready) and keeps it Ready with
//!   Lease and status heartbeats; never touches `Node.spec`;
//! - marks pods bound to the node Running and Ready as soon as it sees them;
//! - finishes a graceful deletion when the pod "exits": after the time in its
//!   [`EXIT_AFTER_ANNOTATION`] (default at once), never after its deletion deadline; then
//!   deletes it with grace 0 and its UID as precondition, as the kubelet does;
//! - mirrors static pod manifests from a directory, like the kubelet's file source: a
//!   mirror pod per manifest (mirror annotations, owner reference to the Node), removed
//!   when the manifest goes (after the manifest's exit time) and created again when it
//!   comes back.
//!
//! It reacts to watch and inotify events, not by polling, and records when each pod was
//! asked to go and when it was gone, for the tests' timing assertions.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::now_unix;

/// How long after its deletion a pod takes to exit, in milliseconds (on pods and on static
/// pod manifests).
pub const EXIT_AFTER_ANNOTATION: &str = "test.nodegrace.dev/exit-after-ms";
const HEARTBEAT: Duration = Duration::from_secs(10);

/// What happened to one pod, in Unix seconds.
#[derive(Debug, Clone, Default)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub mirror: bool,
    pub running_at: Option<f64>,
    /// When its deletion (or, for a static pod, its manifest's removal) was first seen.
    pub stop_seen: Option<f64>,
    /// When it exited: its exit time (from `stop_seen`) as the stand-in kept it, at which
    /// the final DELETE went out.
    pub exited_at: Option<f64>,
    /// When that exit was due.
    pub exit_due: Option<f64>,
    /// When the kubelet removed it.
    pub gone_at: Option<f64>,
    /// When an update first put its deletion deadline before its exit: its grace cut short
    /// (a DELETE, or an eviction, with a shorter grace period than it needed). Never for a
    /// mirror pod, which the stand-in deletes itself once its static pod exited.
    pub grace_cut_at: Option<f64>,
    /// Its `deletionGracePeriodSeconds` and when the stand-in first saw that value.
    pub grace_seen: Option<(i64, f64)>,
}

impl PodRecord {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Default)]
struct State {
    records: HashMap<String, PodRecord>,
    /// uid -> (pod, exit deadline) of pods being deleted, not yet removed.
    stopping: HashMap<String, (Arc<Pod>, f64)>,
    /// Pods bound to the node, by uid (from the watch).
    pods: HashMap<String, Arc<Pod>>,
    /// Static manifests: file name -> (pod from the manifest, content hash).
    manifests: BTreeMap<String, (Pod, String)>,
    /// Manifests removed: mirror pod name -> when the static pod exits.
    static_exit: HashMap<String, f64>,
}

pub struct Kubelet {
    pub node: String,
    client: Client,
    state: Arc<Mutex<State>>,
    wake: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn exit_after(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> f64 {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(EXIT_AFTER_ANNOTATION))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1000.0
}

fn is_mirror(pod: &Pod) -> bool {
    pod.annotations()
        .contains_key("kubernetes.io/config.mirror")
}

fn rfc3339(t: f64) -> String {
    let secs = t.floor() as i64;
    let nanos = ((t - t.floor()) * 1e9) as u32;
    chrono::DateTime::from_timestamp(secs, nanos)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl Kubelet {
    /// Registers `node` and starts playing its kubelet with the credential in
    /// `kubeconfig`. `manifests` is the host path of the node's `staticPodPath`.
    pub async fn start(kubeconfig: &Path, node: &str, manifests: Option<PathBuf>) -> Kubelet {
        let client = super::client_from(kubeconfig).await;
        let nodes: Api<Node> = Api::all(client.clone());
        register(&nodes, node).await;
        let state = Arc::new(Mutex::new(State::default()));
        let wake = Arc::new(Notify::new());
        let tasks = vec![
            tokio::spawn(heartbeat(client.clone(), node.to_owned())),
            tokio::spawn(watch_pods(
                client.clone(),
                node.to_owned(),
                state.clone(),
                wake.clone(),
            )),
            tokio::spawn(finisher(
                client.clone(),
                node.to_owned(),
                state.clone(),
                wake.clone(),
            )),
        ];
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        if let Some(dir) = manifests {
            watch_manifests(dir, state.clone(), wake.clone(), stop.clone());
        }
        let kubelet = Kubelet {
            node: node.to_owned(),
            client,
            state,
            wake,
            tasks,
            stop,
        };
        kubelet.wait_ready(&nodes).await;
        kubelet
    }

    /// Until the node lifecycle controller lifted the not-ready taint (a controller-manager
    /// that just started takes its leader lease first: up to 15 s).
    async fn wait_ready(&self, nodes: &Api<Node>) {
        for _ in 0..600 {
            let node = nodes.get(&self.node).await.expect("get own node");
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let tainted = node
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .iter()
                .any(|t| t.key.starts_with("node.kubernetes.io/not-ready"));
            if ready && !tainted {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("node {} never became Ready and untainted", self.node);
    }

    /// Stops playing the kubelet (as at a node's poweroff); the Node stays registered.
    pub fn stop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Everything recorded so far.
    pub fn records(&self) -> Vec<PodRecord> {
        let mut all: Vec<PodRecord> = lock(&self.state).records.values().cloned().collect();
        all.sort_by_key(PodRecord::key);
        all
    }

    /// Pods bound to the node that are not being deleted.
    pub fn live_pods(&self) -> Vec<Arc<Pod>> {
        lock(&self.state)
            .pods
            .values()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .cloned()
            .collect()
    }

    /// Waits (up to 90 s) until exactly `pods` pods are bound to the node and not being
    /// deleted ([`Kubelet::live_pods`]), as the tests wait for their workloads to run.
    pub async fn wait_running(&self, pods: usize) {
        let what = format!("{pods} pod{} running", if pods == 1 { "" } else { "s" });
        self.wait_for(&what, Duration::from_secs(90), |_, live| live.len() == pods)
            .await;
    }

    /// Waits until `check` holds on the records (polled at each kubelet event).
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&[PodRecord], &[Arc<Pod>]) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.wake.notified();
            if check(&self.records(), &self.live_pods()) {
                return;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = tokio::time::sleep_until(deadline) => panic!("timed out after {timeout:?} waiting for {what}"),
            }
        }
    }
}

async fn register(nodes: &Api<Node>, name: &str) {
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
        }},
        "spec": {},
    }))
    .expect("node object");
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("registering node {name}: {e}"),
    }
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(node_status(name)),
        )
        .await
        .unwrap_or_else(|e| panic!("node {name} status: {e}"));
}

fn node_status(name: &str) -> Value {
    let now = rfc3339(now_unix());
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": "",
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let resources = json!({"cpu": "32", "memory": "128Gi", "pods": "300",
                           "ephemeral-storage": "100Gi"});
    json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            condition("Ready", "True", "KubeletReady"),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                      {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                     "osImage": "Debian GNU/Linux 12", "containerRuntimeVersion": "fake://1",
                     "kubeletVersion": "v1.28.4", "kubeProxyVersion": "v1.28.4",
                     "operatingSystem": "linux", "architecture": "amd64"},
    }})
}

async fn heartbeat(client: Client, node: String) {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    loop {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now},
        });
        let renewed = leases
            .patch(
                &node,
                &PatchParams::apply("test-kubelet").force(),
                &Patch::Apply(&lease),
            )
            .await;
        if let Err(e) = renewed {
            eprintln!("kubelet {node}: lease: {e}");
        }
        if let Err(e) = nodes
            .patch_status(
                &node,
                &PatchParams::default(),
                &Patch::Strategic(node_status(&node)),
            )
            .await
        {
            eprintln!("kubelet {node}: node status: {e}");
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}

async fn watch_pods(client: Client, node: String, state: Arc<Mutex<State>>, wake: Arc<Notify>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = watcher(pods, config).boxed();
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
            Ok(watcher::Event::Delete(p)) => {
                let uid = p.uid().unwrap_or_default();
                let mut st = lock(&state);
                st.pods.remove(&uid);
                st.stopping.remove(&uid);
                let rec = st.records.entry(uid).or_default();
                rec.gone_at.get_or_insert_with(now_unix);
                drop(st);
                wake.notify_waiters();
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                eprintln!("kubelet {node}: pod watch: {e}");
                continue;
            }
        };
        let uid = pod.uid().unwrap_or_default();
        let pod = Arc::new(pod);
        let start = {
            let mut st = lock(&state);
            st.pods.insert(uid.clone(), pod.clone());
            let rec = st.records.entry(uid.clone()).or_insert_with(|| PodRecord {
                namespace: pod.namespace().unwrap_or_default(),
                name: pod.name_any(),
                uid: uid.clone(),
                mirror: is_mirror(&pod),
                ..PodRecord::default()
            });
            match &pod.metadata.deletion_timestamp {
                Some(ts) => {
                    let seen = *rec.stop_seen.get_or_insert_with(now_unix);
                    // As the kubelet kills a pod: its current grace period from when that
                    // period was seen (a shorter one, from a DELETE, restarts the kill), not
                    // the `deletionTimestamp`, which a watch resumed after an outage shows
                    // long past.
                    let deadline = match pod.metadata.deletion_grace_period_seconds {
                        Some(grace) => {
                            let since = match rec.grace_seen {
                                Some((g, at)) if g == grace => at,
                                _ => now_unix(),
                            };
                            rec.grace_seen = Some((grace, since));
                            since + grace as f64
                        }
                        None => ts.0.as_microsecond() as f64 / 1e6,
                    };
                    let wanted = seen + exit_after(&pod.metadata);
                    let exit = wanted.min(deadline);
                    if deadline < wanted && rec.exited_at.is_none() && !rec.mirror {
                        rec.grace_cut_at.get_or_insert_with(now_unix);
                    }
                    // Once exited, the updates its own final DELETE causes change nothing
                    // (a second DELETE would only load the apiserver).
                    if rec.exited_at.is_none() {
                        st.stopping.insert(uid.clone(), (pod.clone(), exit));
                    }
                    false
                }
                None => {
                    // A pod that ended (Failed, Succeeded) is never started again.
                    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                    matches!(phase, None | Some("Pending")) && rec.running_at.is_none()
                }
            }
        };
        wake.notify_waiters();
        if start {
            let client = client.clone();
            let state = state.clone();
            let wake = wake.clone();
            tokio::spawn(async move {
                mark_running(&client, &pod).await;
                if let Some(rec) = lock(&state).records.get_mut(&uid) {
                    rec.running_at.get_or_insert_with(now_unix);
                }
                wake.notify_waiters();
            });
        }
    }
}

/// Every container of `pod` in `state`, ready (and started) or not.
fn container_statuses(pod: &Pod, ready: bool, state: Value) -> Vec<Value> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({"name": c.name, "ready": ready, "started": ready, "restartCount": 0,
                   "image": c.image.clone().unwrap_or_default(), "imageID": "",
                   "containerID": format!("fake://{}", c.name), "state": state})
        })
        .collect()
}

async fn mark_running(client: &Client, pod: &Pod) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let now = rfc3339(now_unix());
    let containers = container_statuses(pod, true, json!({"running": {"startedAt": now}}));
    let condition = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": "10.244.0.10",
        "startTime": now,
        "conditions": [condition("Initialized"), condition("Ready"),
                       condition("ContainersReady"), condition("PodScheduled")],
        "containerStatuses": containers,
    }});
    if let Err(e) = api
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(status),
        )
        .await
    {
        eprintln!("kubelet: marking {} Running: {e}", pod.name_any());
    }
}

/// Removes pods whose exit time came (graceful deletions, static pods whose manifest left)
/// and keeps mirror pods in line with the manifests.
async fn finisher(client: Client, node: String, state: Arc<Mutex<State>>, wake: Arc<Notify>) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node_uid = nodes
        .get(&node)
        .await
        .ok()
        .and_then(|n| n.uid())
        .unwrap_or_default();
    loop {
        let notified = wake.notified();
        let now = now_unix();
        let mut next: Option<f64> = None;
        let mut deletes: Vec<(Arc<Pod>, String)> = Vec::new();
        let mut creates: Vec<Value> = Vec::new();
        {
            let mut guard = lock(&state);
            let st = &mut *guard;
            let due: Vec<String> = st
                .stopping
                .iter()
                .filter(|(_, (_, at))| *at <= now)
                .map(|(uid, _)| uid.clone())
                .collect();
            for uid in due {
                if let Some((pod, at)) = st.stopping.remove(&uid) {
                    if let Some(rec) = st.records.get_mut(&uid) {
                        rec.exit_due.get_or_insert(at);
                        rec.exited_at.get_or_insert(now);
                    }
                    deletes.push((pod, uid));
                }
            }
            for (_, at) in st.stopping.values() {
                next = Some(next.map_or(*at, |n: f64| n.min(*at)));
            }
            // Mirror pods: one per manifest; those whose manifest left go at their exit.
            let mirrors: HashMap<String, Arc<Pod>> = st
                .pods
                .values()
                .filter(|p| is_mirror(p))
                .map(|p| (p.name_any(), p.clone()))
                .collect();
            let wanted: HashMap<String, &(Pod, String)> = st
                .manifests
                .values()
                .map(|m| (mirror_name(&m.0, &node), m))
                .collect();
            for (name, mirror) in &mirrors {
                if wanted.contains_key(name) || mirror.metadata.deletion_timestamp.is_some() {
                    st.static_exit.remove(name);
                    continue;
                }
                let uid = mirror.uid().unwrap_or_default();
                let at = *st
                    .static_exit
                    .entry(name.clone())
                    .or_insert_with(|| now + exit_after(&mirror.metadata));
                if let Some(rec) = st.records.get_mut(&uid) {
                    rec.stop_seen.get_or_insert(now);
                }
                if at <= now {
                    st.static_exit.remove(name);
                    deletes.push((mirror.clone(), uid));
                } else {
                    next = Some(next.map_or(at, |n: f64| n.min(at)));
                }
            }
            for (name, (pod, hash)) in &wanted {
                if !mirrors.contains_key(name) {
                    creates.push(mirror_pod(pod, hash, &node, &node_uid));
                }
            }
        }
        // Each on its own task, as the kubelet's per-pod workers do: awaited here, pods due
        // a moment later would wait for the earlier ones' requests, and a large band's last
        // pod would go late by the stand-in's own pace.
        for (pod, uid) in deletes {
            let (client, node) = (client.clone(), node.clone());
            tokio::spawn(async move { remove(&client, &node, pod, uid).await });
        }
        for mirror in creates {
            let ns = mirror["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned();
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let pod: Pod = serde_json::from_value(mirror).expect("mirror pod");
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => eprintln!(
                    "kubelet {node}: creating mirror pod {}: {e}",
                    pod.name_any()
                ),
            }
        }
        let sleep = next.map(|at| Duration::from_secs_f64((at - now_unix()).max(0.0)));
        tokio::select! {
            _ = notified => {}
            _ = async { match sleep { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => {}
        }
    }
}

/// Deletes a pod that exited, with grace 0 and its UID as precondition. A run-to-completion
/// pod (restartPolicy Never or OnFailure: a Job's) is first given its terminal status, as
/// the kubelet does: phase Failed, its containers terminated by SIGTERM (exit code 143).
async fn remove(client: &Client, node: &str, pod: Arc<Pod>, uid: String) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let restart = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
    if matches!(restart, Some("Never" | "OnFailure")) {
        let now = rfc3339(now_unix());
        let terminated = json!({"terminated": {"exitCode": 143, "reason": "Error",
                                               "startedAt": now, "finishedAt": now}});
        let containers = container_statuses(&pod, false, terminated);
        let status = json!({"metadata": {"uid": uid},
                            "status": {"phase": "Failed", "containerStatuses": containers}});
        if let Err(e) = api
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(status),
            )
            .await
        {
            eprintln!("kubelet {node}: marking {} Failed: {e}", pod.name_any());
        }
    }
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    // Retried while the apiserver cannot take it (away, starting: 403, 5xx), as the
    // kubelet's status manager does: a pod that exited during an outage is removed once the
    // apiserver is back, not left terminating.
    // A 404 is believed only when a read agrees: an apiserver that just restarted answers
    // 404 for pods it still has.
    let give_up = now_unix() + 120.0;
    loop {
        match api.delete(&pod.name_any(), &params).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => return,
            Err(kube::Error::Api(e))
                if e.code == 404
                    && matches!(api.get_opt(&pod.name_any()).await, Ok(ref p)
                        if p.as_ref().and_then(|p| p.uid()).as_deref() != pod.uid().as_deref()) =>
            {
                return
            }
            Err(e) => {
                if now_unix() > give_up {
                    eprintln!(
                        "kubelet {node}: deleting {}: {e}; giving up",
                        pod.name_any()
                    );
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn mirror_name(pod: &Pod, node: &str) -> String {
    nodegrace::mirror_pod_name(&pod.name_any(), node)
}

fn mirror_pod(pod: &Pod, hash: &str, node: &str, node_uid: &str) -> Value {
    let mut mirror = serde_json::to_value(pod).expect("pod json");
    let meta = &mut mirror["metadata"];
    meta["name"] = json!(mirror_name(pod, node));
    if meta["namespace"].is_null() {
        meta["namespace"] = json!("default");
    }
    let mut annotations = pod.annotations().clone();
    annotations.insert("kubernetes.io/config.mirror".into(), hash.into());
    annotations.insert("kubernetes.io/config.hash".into(), hash.into());
    annotations.insert("kubernetes.io/config.source".into(), "file".into());
    annotations.insert("kubernetes.io/config.seen".into(), rfc3339(now_unix()));
    meta["annotations"] = json!(annotations);
    meta["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Node", "name": node,
                                      "uid": node_uid, "controller": true}]);
    mirror["spec"]["nodeName"] = json!(node);
    mirror
}

/// Reads the manifest directory on every change (inotify), like the kubelet's file source.
/// A thread of its own: it ends when the kubelet stops (`stop`).
fn watch_manifests(
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    wake: Arc<Notify>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let inotify =
        Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).expect("inotify_init");
    inotify
        .add_watch(
            &dir,
            AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_CLOSE_WRITE,
        )
        .expect("inotify watch on the manifest directory");
    std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let manifests = read_manifests(&dir);
            lock(&state).manifests = manifests;
            wake.notify_waiters();
            let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(200u16));
            // Drain every queued event; the directory is read again as a whole.
            while inotify.read_events().is_ok_and(|e| !e.is_empty()) {}
        }
    });
}

fn read_manifests(dir: &Path) -> BTreeMap<String, (Pod, String)> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".json")) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        // A file being written may be empty or partial for a moment: skip it until whole.
        let Ok(pod) = serde_yaml::from_str::<Pod>(&text) else {
            continue;
        };
        if pod.metadata.name.is_none() || pod.spec.as_ref().is_none_or(|s| s.containers.is_empty())
        {
            continue;
        }
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        out.insert(name, (pod, format!("{:016x}", h.finish())));
    }
    out
}
