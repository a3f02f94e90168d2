//! The in-tree controllers of the EvictionRequest API (Kubernetes 1.37,
//! `lifecycle.k8s.io/v1alpha1`, KEP-4563), working directly on the fake apiserver's store the
//! way their documentation and `pkg/controller/evictionrequest` describe them:
//!
//! - **eviction-request controller**: one `Eviction` per target pod while some EvictionRequest
//!   for it has intent `Eviction` (owner references to the requests, each requester's key as a
//!   label with value `requester`, responders' keys `responder` or `requester-responder`);
//!   `status.requesters`; `status.targetResponders` from the pod's `spec.evictionResponders`
//!   plus `imperative-eviction.k8s.io/evictor` at priority 100, highest priority first, one
//!   `Active` at a time, handed over on `completionTime` or after a 20-minute heartbeat
//!   silence (`Interrupted`); conditions `TargetEvicted` (`PodDeleted`, `PodTerminal`) and
//!   `Failed` (`CanceledDueToNoRequesters`, `NoFurtherResponder`, `EvictionInvalid`), copied
//!   back to the EvictionRequests; a request for a missing pod, another UID, or a pod with
//!   `spec.schedulingGroup` gets `Failed` (`EvictionInvalid`) and no Eviction.
//! - **imperative eviction responder**: while it is the active responder it calls the Eviction
//!   API with the pod's UID as precondition, backing off exponentially (to about 15 minutes),
//!   its message counting the retries; it skips DaemonSet, mirror and terminating pods.
//!
//! Simplifications: no 5-second grace before `TargetEvicted` when the active responder has not
//! reported completion; no metrics; no Workload/PodGroup targets. Timing is tokio time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::fake_apiserver::{Filter, Store};

pub const GROUP: &str = "lifecycle.k8s.io";
pub const IMPERATIVE: &str = "imperative-eviction.k8s.io/evictor";
pub const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(20 * 60);
const BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

/// Serves `lifecycle.k8s.io/v1alpha1` (evictionrequests, evictions) from now on, as an
/// apiserver with `--runtime-config=lifecycle.k8s.io/v1alpha1=true` does.
pub fn serve(store: &Store) {
    store.serve_builtin(
        GROUP,
        "v1alpha1",
        "evictionrequests",
        "EvictionRequest",
        true,
        true,
    );
    store.serve_builtin(GROUP, "v1alpha1", "evictions", "Eviction", true, true);
}

#[derive(Default)]
struct State {
    /// Per pod UID: failed imperative evictions and when the next may be tried.
    imperative: HashMap<String, (u32, Instant)>,
    /// Pods the imperative evictor evicted ("namespace/name").
    evicted: Vec<String>,
}

pub struct FakeEvictionControllers {
    store: Arc<Store>,
    state: Arc<Mutex<State>>,
    wake: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Drop for FakeEvictionControllers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn parse_time(t: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(t)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn condition_true(obj: &Value, kind: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| s(c, "/type") == kind && s(c, "/status") == "True")
}

fn completed(eviction: &Value) -> bool {
    condition_true(eviction, "TargetEvicted") || condition_true(eviction, "Failed")
}

/// Conditions as `meta.SetStatusCondition` leaves them: the transition time moves only
/// when the status does.
fn set_condition(
    existing: &Value,
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: &str,
) -> Value {
    let old = existing
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| s(c, "/type") == kind);
    let since = match old {
        Some(o) if s(o, "/status") == status => s(o, "/lastTransitionTime").to_string(),
        _ => now.to_string(),
    };
    json!({"type": kind, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since})
}

fn pod_skipped_by_imperative(pod: &Value) -> Option<&'static str> {
    let daemonset = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|o| s(o, "/kind") == "DaemonSet" && o.get("controller") == Some(&json!(true)));
    if daemonset {
        return Some("DaemonSet pods are not evicted by the imperative evictor");
    }
    if pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
    {
        return Some("mirror pods are not evicted by the imperative evictor");
    }
    None
}

impl FakeEvictionControllers {
    /// Serves the API and starts both controllers on `store`.
    pub fn start(store: Arc<Store>) -> Self {
        serve(&store);
        let state = Arc::new(Mutex::new(State::default()));
        let wake = Arc::new(Notify::new());
        let task = tokio::spawn(run(store.clone(), state.clone(), wake.clone()));
        Self {
            store,
            state,
            wake,
            task,
        }
    }

    /// Pods the imperative evictor evicted, in order ("namespace/name").
    pub fn evicted(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .evicted
            .clone()
    }

    /// The Eviction the controller keeps for the pod with `uid`, if any.
    pub fn eviction_of(&self, namespace: &str, uid: &str) -> Option<Value> {
        let (items, _) = self.store.list(&Filter::all(GROUP, "evictions"));
        items
            .into_iter()
            .filter(|e| s(e, "/metadata/namespace") == namespace)
            .filter(|e| s(e, "/spec/target/pod/uid") == uid)
            .max_by_key(|e| !completed(e))
    }

    /// Acts as `responder` on the pod's Eviction: a heartbeat with `message`, and
    /// `completionTime` when `complete`. False when the responder is not active there.
    pub fn respond(
        &self,
        namespace: &str,
        uid: &str,
        responder: &str,
        message: &str,
        complete: bool,
    ) -> bool {
        let Some(eviction) = self.eviction_of(namespace, uid) else {
            return false;
        };
        let active = eviction
            .pointer("/status/targetResponders")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|r| s(r, "/name") == responder && s(r, "/state") == "Active");
        if !active {
            return false;
        }
        let now = self.store.now_str();
        let name = s(&eviction, "/metadata/name").to_string();
        self.store
            .update_in_process(GROUP, "evictions", namespace, &name, |e| {
                if let Some(list) = e
                    .pointer_mut("/status/responders")
                    .and_then(Value::as_array_mut)
                {
                    for r in list.iter_mut().filter(|r| s(r, "/name") == responder) {
                        r["heartbeatTime"] = json!(now);
                        r["message"] = json!(message);
                        if complete {
                            r["completionTime"] = json!(now);
                        }
                    }
                }
            });
        self.wake.notify_one();
        true
    }
}

async fn run(store: Arc<Store>, state: Arc<Mutex<State>>, wake: Arc<Notify>) {
    let mut changes = store.subscribe();
    loop {
        let next = reconcile(&store, &state);
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            () = wake.notified() => {}
            () = sleep => {}
        }
    }
}

/// One pass of both controllers; returns when to look again without a change.
fn reconcile(store: &Store, state: &Mutex<State>) -> Option<Instant> {
    let now = Instant::now();
    let mut next: Option<Instant> = None;
    let mut at = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
    let (requests, _) = store.list(&Filter::all(GROUP, "evictionrequests"));
    let (evictions, _) = store.list(&Filter::all(GROUP, "evictions"));
    let target = |v: &Value| {
        (
            s(v, "/metadata/namespace").to_string(),
            s(v, "/spec/target/pod/uid").to_string(),
        )
    };
    let mut created: Vec<(String, String)> = Vec::new();
    let mut by_target: BTreeMap<(String, String), Vec<&Value>> = BTreeMap::new();
    for r in &requests {
        by_target.entry(target(r)).or_default().push(r);
    }

    // EvictionRequests: validation, Eviction creation, conditions copied back.
    for request in &requests {
        if condition_true(request, "TargetEvicted")
            || (condition_true(request, "Failed")
                && request
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .any(|c| s(c, "/reason") == "EvictionInvalid"))
        {
            continue;
        }
        let (ns, uid) = target(request);
        let pod_name = s(request, "/spec/target/pod/name");
        let name = s(request, "/metadata/name").to_string();
        let pod = store.get_obj("", "pods", &ns, pod_name);
        let mine: Vec<&Value> = evictions
            .iter()
            .filter(|e| target(e) == (ns.clone(), uid.clone()))
            .collect();
        let now_str = store.now_str();
        let invalid = if mine.is_empty() {
            match &pod {
                None => Some("Target pod not found.".to_string()),
                Some(p) if s(p, "/metadata/uid") != uid => Some(format!(
                    "Target pod UID mismatch: expected {uid}, got {}.",
                    s(p, "/metadata/uid")
                )),
                Some(p) if p.pointer("/spec/schedulingGroup").is_some() => Some(
                    "Target pod references a SchedulingGroup. Eviction is currently not supported."
                        .to_string(),
                ),
                _ => None,
            }
        } else {
            None
        };
        if let Some(why) = invalid {
            store.update_in_process(GROUP, "evictionrequests", &ns, &name, |r| {
                let existing = r.pointer("/status/conditions").cloned().unwrap_or(Value::Null);
                r["status"] = json!({"observedGeneration": 1, "conditions": [
                    set_condition(&existing, "Failed", "True", "EvictionInvalid", &why, &now_str),
                    set_condition(&existing, "TargetEvicted", "False", "EvictionFailed", "", &now_str),
                ]});
            });
            continue;
        }
        let active = mine.iter().find(|e| !completed(e)).copied();
        let wants = by_target
            .get(&(ns.clone(), uid.clone()))
            .into_iter()
            .flatten()
            .any(|r| {
                s(r, "/spec/intent") == "Eviction"
                    && r.pointer("/metadata/deletionTimestamp").is_none()
            });
        // A new Eviction only for a target without one, or after a cancelled one (a new
        // Eviction intent after all had withdrawn).
        let renewable = mine.iter().all(|e| {
            e.pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| {
                    s(c, "/type") == "Failed" && s(c, "/reason") == "CanceledDueToNoRequesters"
                })
        });
        if active.is_none() && wants && renewable && !created.contains(&(ns.clone(), uid.clone())) {
            created.push((ns.clone(), uid.clone()));
            let taken: Vec<&str> = evictions
                .iter()
                .filter(|e| s(e, "/metadata/namespace") == ns)
                .map(|e| s(e, "/metadata/name"))
                .collect();
            let mut eviction_name = pod_name.to_string();
            let mut n = 1;
            while taken.contains(&eviction_name.as_str()) {
                eviction_name = format!("{pod_name}-{n}");
                n += 1;
            }
            let requester = s(request, "/spec/requester");
            let _ = store.insert_fixture(json!({
                "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "Eviction",
                "metadata": {"name": eviction_name, "namespace": ns,
                    "labels": {requester: "requester"},
                    "ownerReferences": [{"apiVersion": "lifecycle.k8s.io/v1alpha1",
                        "kind": "EvictionRequest", "name": name,
                        "uid": s(request, "/metadata/uid")}]},
                "spec": {"target": {"pod": {"name": pod_name, "uid": uid}}},
            }));
            // The new Eviction is a change: the next pass takes it on.
            continue;
        }
        let relevant = active.or_else(|| {
            mine.iter()
                .max_by_key(|e| s(e, "/metadata/creationTimestamp").to_string())
                .copied()
        });
        if let Some(e) = relevant {
            let copy: Vec<Value> = e
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if !copy.is_empty() {
                store.update_in_process(GROUP, "evictionrequests", &ns, &name, |r| {
                    r["status"] = json!({"observedGeneration": 1, "conditions": copy});
                });
            }
        }
    }

    // Evictions: requesters, responders, conditions, labels; the imperative evictor.
    for eviction in &evictions {
        if completed(eviction) {
            continue;
        }
        let (ns, uid) = target(eviction);
        let name = s(eviction, "/metadata/name").to_string();
        let pod = store
            .get_obj("", "pods", &ns, s(eviction, "/spec/target/pod/name"))
            .filter(|p| s(p, "/metadata/uid") == uid);
        let gone = pod.is_none();
        let terminal = pod
            .as_ref()
            .is_some_and(|p| matches!(s(p, "/status/phase"), "Succeeded" | "Failed"));
        let requests = by_target
            .get(&(ns.clone(), uid.clone()))
            .cloned()
            .unwrap_or_default();
        let canceled = !requests.iter().any(|r| {
            s(r, "/spec/intent") == "Eviction" && r.pointer("/metadata/deletionTimestamp").is_none()
        });
        let mut requesters: Vec<Value> = eviction
            .pointer("/status/requesters")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for r in &requests {
            let key = s(r, "/spec/requester");
            let intent = if r.pointer("/metadata/deletionTimestamp").is_some() {
                "Withdrawn"
            } else {
                s(r, "/spec/intent")
            };
            match requesters.iter_mut().find(|x| s(x, "/name") == key) {
                Some(x) => x["intent"] = json!(intent),
                None => requesters.push(json!({"name": key, "intent": intent})),
            }
        }
        let known: Vec<&str> = requests.iter().map(|r| s(r, "/spec/requester")).collect();
        for x in requesters.iter_mut() {
            if !known.contains(&s(x, "/name")) {
                x["intent"] = json!("Withdrawn");
            }
        }

        let mut targets: Vec<Value> = eviction
            .pointer("/status/targetResponders")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if targets.is_empty() {
            if let Some(p) = &pod {
                let mut list: Vec<(i64, String)> = p
                    .pointer("/spec/evictionResponders")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|r| {
                        (
                            r.get("priority").and_then(Value::as_i64).unwrap_or(0),
                            s(r, "/name").to_string(),
                        )
                    })
                    .collect();
                list.push((100, IMPERATIVE.to_string()));
                list.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
                targets = list
                    .into_iter()
                    .map(|(p, n)| json!({"name": n, "priority": p, "state": "Inactive"}))
                    .collect();
            }
        }
        let statuses: Vec<Value> = eviction
            .pointer("/status/responders")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let status_of = |n: &str| statuses.iter().find(|r| s(r, "/name") == n).cloned();
        let store_now = store.now();
        let now_str = store.now_str();
        let last_final = targets
            .last()
            .is_some_and(|t| matches!(s(t, "/state"), "Interrupted" | "Canceled" | "Completed"));
        let mut progression_done = last_final;
        if !targets.is_empty() && !last_final {
            let active = targets.iter().position(|t| s(t, "/state") == "Active");
            if gone || terminal {
                if let Some(i) = active {
                    let done = status_of(s(&targets[i], "/name"))
                        .is_some_and(|r| r.get("completionTime").is_some());
                    targets[i]["state"] = json!(if done { "Completed" } else { "Interrupted" });
                }
            } else if canceled {
                if let Some(i) = active {
                    targets[i]["state"] = json!("Canceled");
                }
            } else {
                let i =
                    active.or_else(|| targets.iter().position(|t| s(t, "/state") == "Inactive"));
                if let Some(i) = i {
                    let responder = s(&targets[i], "/name").to_string();
                    let st = status_of(&responder);
                    let state = match &st {
                        None => "Active",
                        Some(r) if r.get("completionTime").is_some() => "Completed",
                        Some(r) => {
                            let last = parse_time(s(r, "/heartbeatTime"))
                                .or_else(|| parse_time(s(r, "/startTime")))
                                .unwrap_or(store_now);
                            let elapsed = (store_now - last).to_std().unwrap_or_default();
                            if elapsed >= HEARTBEAT_DEADLINE {
                                "Interrupted"
                            } else {
                                at(now + (HEARTBEAT_DEADLINE - elapsed));
                                "Active"
                            }
                        }
                    };
                    targets[i]["state"] = json!(state);
                    if state != "Active" {
                        if let Some(next_one) = targets.get_mut(i + 1) {
                            next_one["state"] = json!("Active");
                            at(now + HEARTBEAT_DEADLINE);
                        } else {
                            progression_done = true;
                        }
                    }
                }
            }
        }
        let responders: Vec<Value> = targets
            .iter()
            .map(|t| {
                let n = s(t, "/name");
                let mut r = status_of(n).unwrap_or_else(|| json!({"name": n}));
                if r.get("startTime").is_none() && s(t, "/state") == "Active" {
                    r["startTime"] = json!(now_str);
                }
                r
            })
            .collect();
        let existing = eviction
            .pointer("/status/conditions")
            .cloned()
            .unwrap_or(Value::Null);
        let cond = |k: &str, st: &str, reason: &str, msg: &str| {
            set_condition(&existing, k, st, reason, msg, &now_str)
        };
        let conditions = if gone {
            vec![
                cond(
                    "TargetEvicted",
                    "True",
                    "PodDeleted",
                    "Target pod has been deleted",
                ),
                cond("Failed", "False", "Succeeded", ""),
            ]
        } else if terminal {
            vec![
                cond(
                    "TargetEvicted",
                    "True",
                    "PodTerminal",
                    "Pod has reached terminal state",
                ),
                cond("Failed", "False", "Succeeded", ""),
            ]
        } else if canceled {
            vec![
                cond(
                    "Failed",
                    "True",
                    "CanceledDueToNoRequesters",
                    "No active requesters with eviction intent",
                ),
                cond("TargetEvicted", "False", "EvictionFailed", ""),
            ]
        } else if progression_done {
            vec![
                cond(
                    "Failed",
                    "True",
                    "NoFurtherResponder",
                    "All responders have completed without evicting the target",
                ),
                cond("TargetEvicted", "False", "EvictionFailed", ""),
            ]
        } else {
            vec![
                cond("Failed", "False", "AwaitingEviction", ""),
                cond("TargetEvicted", "False", "AwaitingEviction", ""),
            ]
        };
        let mut labels: BTreeMap<String, String> = BTreeMap::new();
        for r in &requests {
            labels.insert(s(r, "/spec/requester").to_string(), "requester".into());
        }
        for t in &targets {
            let n = s(t, "/name").to_string();
            let role = if labels.contains_key(&n) {
                "requester-responder"
            } else {
                "responder"
            };
            labels.insert(n, role.into());
        }
        let owners: Vec<Value> = requests
            .iter()
            .map(|r| {
                json!({"apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "EvictionRequest",
                "name": s(r, "/metadata/name"), "uid": s(r, "/metadata/uid")})
            })
            .collect();
        let written = store.update_in_process(GROUP, "evictions", &ns, &name, |e| {
            e["status"] = json!({"observedGeneration": 1, "requesters": requesters,
                "targetResponders": targets, "responders": responders, "conditions": conditions});
            let meta = &mut e["metadata"];
            let mut all: BTreeMap<String, Value> = meta
                .get("labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default();
            for (k, v) in &labels {
                all.insert(k.clone(), json!(v));
            }
            meta["labels"] = json!(all);
            let mut refs: Vec<Value> = meta
                .get("ownerReferences")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for o in &owners {
                if !refs.iter().any(|r| s(r, "/uid") == s(o, "/uid")) {
                    refs.push(o.clone());
                }
            }
            meta["ownerReferences"] = json!(refs);
        });

        // The imperative evictor, while it is the active responder.
        let Some(written) = written else { continue };
        if completed(&written) {
            continue;
        }
        let imperative_active = written
            .pointer("/status/targetResponders")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|t| s(t, "/name") == IMPERATIVE && s(t, "/state") == "Active");
        let Some(pod) = pod.filter(|_| imperative_active) else {
            continue;
        };
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let message = if let Some(why) = pod_skipped_by_imperative(&pod) {
            why.to_string()
        } else {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            let (tries, not_before) = st.imperative.get(&uid).copied().unwrap_or((0, now));
            if not_before > now {
                at(not_before);
                continue;
            }
            let pod_name = s(&pod, "/metadata/name").to_string();
            let body = json!({"metadata": {"name": pod_name, "namespace": ns},
                "deleteOptions": {"preconditions": {"uid": uid}}});
            match store.evict(&ns, &pod_name, &body) {
                Ok(()) => {
                    st.evicted.push(format!("{ns}/{pod_name}"));
                    st.imperative.remove(&uid);
                    "pod evicted".to_string()
                }
                Err(err) => {
                    let tries = tries + 1;
                    let delay = Duration::from_secs(1u64 << tries.min(10)).min(BACKOFF_MAX);
                    st.imperative.insert(uid.clone(), (tries, now + delay));
                    at(now + delay);
                    format!("{}, number of retries: {tries}", err.message)
                }
            }
        };
        let now_str = store.now_str();
        store.update_in_process(GROUP, "evictions", &ns, &name, |e| {
            if let Some(list) = e
                .pointer_mut("/status/responders")
                .and_then(Value::as_array_mut)
            {
                for r in list.iter_mut().filter(|r| s(r, "/name") == IMPERATIVE) {
                    if r.get("message") != Some(&json!(message)) {
                        r["message"] = json!(message);
                        r["heartbeatTime"] = json!(now_str);
                    }
                }
            }
        });
    }
    next
}
