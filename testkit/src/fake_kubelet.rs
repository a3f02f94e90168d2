//! A fake kubelet working directly on the fake apiserver's store: it finishes pods that got
//! a deletionTimestamp after a chosen time (never later than their grace period), can start
//! pods (Running + Ready), and can stand in for the StatefulSet controller by recreating a
//! finished StatefulSet pod under the same name with a new UID. All timing is tokio time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::fake_apiserver::{running_status, EventType, Filter, Store, WatchBatch};

/// Where and when a finished StatefulSet pod comes back.
#[derive(Debug, Clone, Default)]
pub struct StatefulSetRecreate {
    /// Node the new pod is bound to; None leaves it unscheduled (Pending).
    pub node: Option<String>,
}

#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// Only pods bound to this node; None = pods on every node.
    pub node: Option<String>,
    /// How long a pod takes to exit after its deletion; capped by its grace period.
    pub default_finish: Duration,
    /// Per pod ("namespace/name") exit times, overriding `default_finish`.
    pub finish_after: HashMap<String, Duration>,
    /// Pending pods bound to the node are marked Running and Ready at once.
    pub auto_run: bool,
    pub recreate_statefulset: Option<StatefulSetRecreate>,
}

impl KubeletConfig {
    /// A kubelet for one node whose pods exit as soon as they are told to.
    pub fn node(name: &str) -> Self {
        Self {
            node: Some(name.to_string()),
            ..Self::default()
        }
    }
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            node: None,
            default_finish: Duration::ZERO,
            finish_after: HashMap::new(),
            auto_run: false,
            recreate_statefulset: None,
        }
    }
}

/// A pod the kubelet finished.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// When the deletion was first seen, and when the pod was removed (tokio time).
    pub deleted_at: Instant,
    pub finished_at: Instant,
}

struct Pending {
    namespace: String,
    name: String,
    seen: Instant,
    deadline: Instant,
    grace: i64,
}

struct State {
    config: KubeletConfig,
    pending: HashMap<String, Pending>,
    finished: Vec<FinishedPod>,
    /// UIDs already finished (a pod held by finalizers stays visible afterwards).
    done: HashSet<String>,
}

pub struct FakeKubelet {
    store: Arc<Store>,
    state: Arc<Mutex<State>>,
    wake: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

impl FakeKubelet {
    pub fn start(store: Arc<Store>, config: KubeletConfig) -> Self {
        let state = Arc::new(Mutex::new(State {
            config,
            pending: HashMap::new(),
            finished: Vec::new(),
            done: HashSet::new(),
        }));
        let wake = Arc::new(Notify::new());
        let task = tokio::spawn(run(store.clone(), state.clone(), wake.clone()));
        Self {
            store,
            state,
            wake,
            task,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets how long `namespace/name` takes to exit once deleted (also if already deleting).
    pub fn set_finish_after(&self, namespace: &str, name: &str, after: Duration) {
        let mut st = self.state();
        st.config
            .finish_after
            .insert(format!("{namespace}/{name}"), after);
        for p in st.pending.values_mut() {
            if p.namespace == namespace && p.name == name {
                p.deadline = p.seen + after.min(Duration::from_secs(p.grace.max(0) as u64));
            }
        }
        drop(st);
        self.wake.notify_one();
    }

    /// Marks a pod Running and Ready. False when it does not exist.
    pub fn mark_running(&self, namespace: &str, name: &str) -> bool {
        let now = self.store.now_str();
        self.store
            .update_in_process("", "pods", namespace, name, |p| {
                p["status"] = running_status(&now)
            })
            .is_some()
    }

    /// Pods finished so far, in order.
    pub fn finished(&self) -> Vec<FinishedPod> {
        self.state().finished.clone()
    }

    /// Pods deleted but not yet finished.
    pub fn terminating(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .state()
            .pending
            .values()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        v.sort();
        v
    }
}

async fn run(store: Arc<Store>, state: Arc<Mutex<State>>, wake: Arc<Notify>) {
    let mut changes = store.subscribe();
    let all_pods = Filter::all("", "pods");
    // Follows the store's event history (cheap per change); re-lists only when it expired.
    let mut last_rv: Option<u64> = None;
    loop {
        let now = Instant::now();
        let (changed, gone, full): (Vec<Value>, Vec<String>, bool) =
            match last_rv.map(|rv| store.events_after(rv, &all_pods)) {
                Some(WatchBatch::Events(events, rv)) => {
                    last_rv = Some(rv);
                    let mut changed = Vec::new();
                    let mut gone = Vec::new();
                    for (kind, obj) in events {
                        if kind == EventType::Deleted {
                            gone.push(s(&obj, "/metadata/uid").to_string());
                        } else {
                            changed.push(obj);
                        }
                    }
                    (changed, gone, false)
                }
                _ => {
                    let (items, rv) = store.list(&all_pods);
                    last_rv = Some(rv);
                    (items, Vec::new(), true)
                }
            };
        let mut to_start = Vec::new();
        let mut due = Vec::new();
        let next_deadline;
        {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            let my_node = st.config.node.clone();
            let mine = |p: &Value| {
                let node = s(p, "/spec/nodeName");
                !node.is_empty() && my_node.as_deref().is_none_or(|n| n == node)
            };
            let mut deleting_uids = Vec::new();
            for p in changed.iter().filter(|p| mine(p)) {
                let uid = s(p, "/metadata/uid").to_string();
                let ns = s(p, "/metadata/namespace").to_string();
                let name = s(p, "/metadata/name").to_string();
                let phase = s(p, "/status/phase");
                if st.done.contains(&uid) {
                    continue;
                }
                if p.pointer("/metadata/deletionTimestamp").is_some() {
                    deleting_uids.push(uid.clone());
                    let grace = p
                        .pointer("/metadata/deletionGracePeriodSeconds")
                        .and_then(Value::as_i64)
                        .unwrap_or(0)
                        .max(0);
                    let chosen = st
                        .config
                        .finish_after
                        .get(&format!("{ns}/{name}"))
                        .copied()
                        .unwrap_or(st.config.default_finish);
                    let entry = st.pending.entry(uid).or_insert(Pending {
                        namespace: ns,
                        name,
                        seen: now,
                        deadline: now + chosen.min(Duration::from_secs(grace as u64)),
                        grace,
                    });
                    if grace < entry.grace {
                        // A second delete shortened the grace period: kill sooner.
                        entry.deadline =
                            entry.deadline.min(now + Duration::from_secs(grace as u64));
                        entry.grace = grace;
                    }
                } else if st.config.auto_run && phase == "Pending" {
                    to_start.push((ns, name));
                }
            }
            if full {
                st.pending.retain(|uid, _| deleting_uids.contains(uid));
            }
            for uid in &gone {
                st.pending.remove(uid);
            }
            for (uid, p) in &st.pending {
                if p.deadline <= now {
                    due.push((uid.clone(), p.namespace.clone(), p.name.clone(), p.seen));
                }
            }
            next_deadline = st
                .pending
                .values()
                .map(|p| p.deadline)
                .filter(|d| *d > now)
                .min();
        }
        let now_str = store.now_str();
        for (ns, name) in to_start {
            store.update_in_process("", "pods", &ns, &name, |p| {
                p["status"] = running_status(&now_str)
            });
        }
        for (uid, ns, name, seen) in due {
            finish(&store, &state, &uid, &ns, &name, seen);
        }
        let sleep = async {
            match next_deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = sleep => {}
            _ = wake.notified() => {}
        }
    }
}

/// What the real kubelet does once the containers exited: terminal status, then the
/// final delete (UID precondition), then the StatefulSet controller may bring it back.
fn finish(store: &Store, state: &Mutex<State>, uid: &str, ns: &str, name: &str, seen: Instant) {
    let before = store.get_obj("", "pods", ns, name);
    store.update_in_process("", "pods", ns, name, |p| {
        if s(p, "/metadata/uid") == uid {
            p["status"]["phase"] = "Succeeded".into();
            if let Some(conds) = p
                .pointer_mut("/status/conditions")
                .and_then(Value::as_array_mut)
            {
                for c in conds.iter_mut() {
                    if matches!(s(c, "/type"), "Ready" | "ContainersReady") {
                        c["status"] = "False".into();
                        c["reason"] = "PodCompleted".into();
                    }
                }
            }
        }
    });
    let removed = store.finish_deletion("", "pods", ns, name, Some(uid));
    let recreate = {
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        st.pending.remove(uid);
        st.done.insert(uid.to_string());
        if !removed {
            return;
        }
        st.finished.push(FinishedPod {
            namespace: ns.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            deleted_at: seen,
            finished_at: Instant::now(),
        });
        st.config.recreate_statefulset.clone()
    };
    if let (Some(rc), Some(old)) = (recreate, before) {
        recreate_statefulset_pod(store, &old, &rc);
    }
}

fn recreate_statefulset_pod(store: &Store, old: &Value, rc: &StatefulSetRecreate) {
    let owned_by_sts = old
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter().any(|r| {
                s(r, "/kind") == "StatefulSet"
                    && r.get("controller").and_then(Value::as_bool) == Some(true)
            })
        });
    if !owned_by_sts {
        return;
    }
    let mut spec = old.get("spec").cloned().unwrap_or_else(|| json!({}));
    match &rc.node {
        Some(n) => spec["nodeName"] = n.clone().into(),
        None => {
            if let Some(o) = spec.as_object_mut() {
                o.remove("nodeName");
            }
        }
    }
    let meta = &old["metadata"];
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": meta["name"], "namespace": meta["namespace"],
            "labels": meta.get("labels").cloned().unwrap_or(json!({})),
            "annotations": meta.get("annotations").cloned().unwrap_or(json!({})),
            "ownerReferences": meta["ownerReferences"],
        },
        "spec": spec,
    });
    if let Some(pods) = store.find_resource("", "v1", "pods") {
        let ns = s(old, "/metadata/namespace").to_string();
        let _ = store.create(&pods, &ns, pod, "statefulset-controller");
    }
}
