//! A stand-in of the cluster's side of the EvictionRequest API (Kubernetes 1.37,
//! `lifecycle.k8s.io/v1alpha1`, KEP-4563) for the real control plane, whose v1.28 serves that
//! API only as the tests' CRDs ([`super::LIFECYCLE_CRDS`]) and runs none of its controllers.
//! It plays kube-controller-manager's evictionrequest-controller and imperative evictor for
//! one namespace, through the apiserver as the cluster admin, with the rules of
//! `nodegrace_testkit::fake_lifecycle` (the fake apiserver's equivalent, which documents
//! them): one `Eviction` per target pod while a request for it has intent `Eviction`;
//! requesters and responders as labels and `status.requesters`; `status.targetResponders`
//! from the pod's responders plus [`IMPERATIVE`] at priority 100, one `Active` at a time,
//! handed over on `completionTime` or after [`HEARTBEAT_DEADLINE`]; `TargetEvicted` /
//! `Failed` copied back to the requests; the imperative evictor calls the Eviction API with
//! the pod's UID as precondition, backing off, and skips DaemonSet, mirror and terminating
//! pods.
//!
//! A v1.28 apiserver drops `spec.evictionResponders` from pods, so a test pod declares its
//! responders in [`RESPONDERS_ANNOTATION`] (the field's JSON); [`declared_responders`] reads
//! either, and [`super::responders_proxy`] shows the annotation to the daemon as the field.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams,
    PostParams, Preconditions,
};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub const IMPERATIVE: &str = "imperative-eviction.k8s.io/evictor";
pub const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(20 * 60);
const BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

/// Where a test pod declares what a 1.37 pod has in `spec.evictionResponders` (that JSON
/// list). Test-only: no product reads it.
pub const RESPONDERS_ANNOTATION: &str = "test.nodegrace.dev/eviction-responders";

/// The responders `pod` declares: `spec.evictionResponders`, else [`RESPONDERS_ANNOTATION`].
pub fn declared_responders(pod: &Value) -> Option<Value> {
    if let Some(field) = pod.pointer("/spec/evictionResponders") {
        return Some(field.clone());
    }
    let text = pod
        .pointer("/metadata/annotations")?
        .get(RESPONDERS_ANNOTATION)?
        .as_str()?;
    serde_json::from_str(text).ok()
}

#[derive(Default)]
struct State {
    /// Per pod UID: failed imperative evictions and when the next may be tried.
    imperative: HashMap<String, (u32, Instant)>,
    /// Pods the imperative evictor evicted ("namespace/name").
    evicted: Vec<String>,
}

/// The evictionrequest-controller and imperative evictor of one namespace, until dropped.
pub struct StandInControllers {
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for StandInControllers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandInControllers {
    /// Starts both controllers for `namespace` with `admin`'s client.
    pub fn start(admin: Client, namespace: &str) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let task = tokio::spawn(run(admin, namespace.to_owned(), state.clone()));
        StandInControllers { state, task }
    }

    /// Pods the imperative evictor evicted, in order ("namespace/name").
    pub fn evicted(&self) -> Vec<String> {
        lock(&self.state).evicted.clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn now_str() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn parse_time(t: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(t)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn conditions(obj: &Value) -> impl Iterator<Item = &Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn condition_true(obj: &Value, kind: &str) -> bool {
    conditions(obj).any(|c| s(c, "/type") == kind && s(c, "/status") == "True")
}

fn completed(eviction: &Value) -> bool {
    condition_true(eviction, "TargetEvicted") || condition_true(eviction, "Failed")
}

/// Conditions as `meta.SetStatusCondition` leaves them: the transition time moves only
/// when the status does.
fn set_condition(existing: &Value, kind: &str, status: &str, reason: &str, message: &str) -> Value {
    let old = existing
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| s(c, "/type") == kind);
    let since = match old {
        Some(o) if s(o, "/status") == status => s(o, "/lastTransitionTime").to_string(),
        _ => now_str(),
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

struct Apis {
    requests: Api<DynamicObject>,
    evictions: Api<DynamicObject>,
    pods: Api<Pod>,
}

async fn run(admin: Client, ns: String, state: Arc<Mutex<State>>) {
    let requests_ar = ApiResource::erase::<EvictionRequest>(&());
    let evictions_ar = ApiResource::erase::<Eviction>(&());
    let apis = Apis {
        requests: Api::namespaced_with(admin.clone(), &ns, &requests_ar),
        evictions: Api::namespaced_with(admin.clone(), &ns, &evictions_ar),
        pods: Api::namespaced(admin.clone(), &ns),
    };
    // The watches only wake a pass; each pass reads everything afresh.
    let cfg = watcher::Config::default;
    let mut changes = futures::stream::select_all([
        watcher(apis.requests.clone(), cfg()).map(|_| ()).boxed(),
        watcher(apis.evictions.clone(), cfg()).map(|_| ()).boxed(),
        watcher(apis.pods.clone(), cfg()).map(|_| ()).boxed(),
    ]);
    loop {
        let next = match reconcile(&apis, &state).await {
            Ok(next) => next,
            Err(err) => {
                eprintln!("lifecycle stand-in ({ns}): {err}");
                Some(Instant::now() + Duration::from_millis(500))
            }
        };
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            c = changes.next() => if c.is_none() { return },
            () = sleep => {}
        }
        // Changes arrive in bursts: one pass for what is already there.
        while let Some(Some(())) = changes.next().now_or_never() {}
    }
}

fn values(list: kube::core::ObjectList<DynamicObject>) -> Vec<Value> {
    list.items
        .into_iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .collect()
}

/// One pass of both controllers; returns when to look again without a change.
async fn reconcile(apis: &Apis, state: &Mutex<State>) -> Result<Option<Instant>, kube::Error> {
    let now = Instant::now();
    let mut next: Option<Instant> = None;
    let mut at = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
    let requests = values(apis.requests.list(&ListParams::default()).await?);
    let evictions = values(apis.evictions.list(&ListParams::default()).await?);
    let pods: HashMap<String, Value> = apis
        .pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| {
            let name = p.metadata.name.clone()?;
            Some((name, serde_json::to_value(p).ok()?))
        })
        .collect();
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
                && conditions(request).any(|c| s(c, "/reason") == "EvictionInvalid"))
        {
            continue;
        }
        let (ns, uid) = target(request);
        let pod_name = s(request, "/spec/target/pod/name");
        let name = s(request, "/metadata/name").to_string();
        let pod = pods.get(pod_name);
        let mine: Vec<&Value> = evictions
            .iter()
            .filter(|e| target(e) == (ns.clone(), uid.clone()))
            .collect();
        let invalid = if mine.is_empty() {
            match pod {
                None => Some("Target pod not found.".to_string()),
                Some(p) if s(p, "/metadata/uid") != uid => Some(format!(
                    "Target pod UID mismatch: expected {uid}, got {}.",
                    s(p, "/metadata/uid")
                )),
                _ => None,
            }
        } else {
            None
        };
        if let Some(why) = invalid {
            let existing = request
                .pointer("/status/conditions")
                .cloned()
                .unwrap_or(Value::Null);
            let status = json!({"observedGeneration": 1, "conditions": [
                set_condition(&existing, "Failed", "True", "EvictionInvalid", &why),
                set_condition(&existing, "TargetEvicted", "False", "EvictionFailed", ""),
            ]});
            write_status(&apis.requests, request, status).await?;
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
            conditions(e).any(|c| {
                s(c, "/type") == "Failed" && s(c, "/reason") == "CanceledDueToNoRequesters"
            })
        });
        if active.is_none() && wants && renewable && !created.contains(&(ns.clone(), uid.clone())) {
            created.push((ns.clone(), uid.clone()));
            let taken: Vec<&str> = evictions.iter().map(|e| s(e, "/metadata/name")).collect();
            let mut eviction_name = pod_name.to_string();
            let mut n = 1;
            while taken.contains(&eviction_name.as_str()) {
                eviction_name = format!("{pod_name}-{n}");
                n += 1;
            }
            let requester = s(request, "/spec/requester");
            let eviction: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "Eviction",
                "metadata": {"name": eviction_name, "namespace": ns,
                    "labels": {requester: "requester"},
                    "ownerReferences": [{"apiVersion": "lifecycle.k8s.io/v1alpha1",
                        "kind": "EvictionRequest", "name": name,
                        "uid": s(request, "/metadata/uid")}]},
                "spec": {"target": {"pod": {"name": pod_name, "uid": uid}}},
            }))
            .map_err(kube::Error::SerdeError)?;
            match apis
                .evictions
                .create(&PostParams::default(), &eviction)
                .await
            {
                Ok(_) => {}
                // Another pass's list did not see it yet.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
            // The new Eviction is a change: the next pass takes it on.
            continue;
        }
        let relevant = active.or_else(|| {
            mine.iter()
                .max_by_key(|e| s(e, "/metadata/creationTimestamp").to_string())
                .copied()
        });
        if let Some(e) = relevant {
            let copy: Vec<Value> = conditions(e).cloned().collect();
            if !copy.is_empty() {
                let status = json!({"observedGeneration": 1, "conditions": copy});
                write_status(&apis.requests, request, status).await?;
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
        let pod = pods
            .get(s(eviction, "/spec/target/pod/name"))
            .filter(|p| s(p, "/metadata/uid") == uid);
        let gone = pod.is_none();
        let terminal = pod.is_some_and(|p| matches!(s(p, "/status/phase"), "Succeeded" | "Failed"));
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
            if let Some(p) = pod {
                let mut list: Vec<(i64, String)> = declared_responders(p)
                    .and_then(|v| v.as_array().cloned())
                    .into_iter()
                    .flatten()
                    .map(|r| {
                        (
                            r.get("priority").and_then(Value::as_i64).unwrap_or(0),
                            s(&r, "/name").to_string(),
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
        let wall_now = Utc::now();
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
                    let state = match status_of(&responder) {
                        None => "Active",
                        Some(r) if r.get("completionTime").is_some() => "Completed",
                        Some(r) => {
                            let last = parse_time(s(&r, "/heartbeatTime"))
                                .or_else(|| parse_time(s(&r, "/startTime")))
                                .unwrap_or(wall_now);
                            let elapsed = (wall_now - last).to_std().unwrap_or_default();
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
                    r["startTime"] = json!(now_str());
                }
                r
            })
            .collect();
        let existing = eviction
            .pointer("/status/conditions")
            .cloned()
            .unwrap_or(Value::Null);
        let cond = |k: &str, st: &str, reason: &str, msg: &str| {
            set_condition(&existing, k, st, reason, msg)
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
        let mut labels: BTreeMap<String, Value> = eviction
            .pointer("/metadata/labels")
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        for r in &requests {
            labels.insert(s(r, "/spec/requester").to_string(), json!("requester"));
        }
        for t in &targets {
            let n = s(t, "/name").to_string();
            let role = if requests.iter().any(|r| s(r, "/spec/requester") == n) {
                "requester-responder"
            } else {
                "responder"
            };
            labels.insert(n, json!(role));
        }
        let mut refs: Vec<Value> = eviction
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for r in &requests {
            if !refs.iter().any(|o| s(o, "/uid") == s(r, "/metadata/uid")) {
                refs.push(json!({"apiVersion": "lifecycle.k8s.io/v1alpha1",
                    "kind": "EvictionRequest", "name": s(r, "/metadata/name"),
                    "uid": s(r, "/metadata/uid")}));
            }
        }
        let meta = json!({"labels": labels, "ownerReferences": refs});
        let mut current = eviction.clone();
        if eviction.pointer("/metadata/labels") != meta.get("labels")
            || eviction.pointer("/metadata/ownerReferences") != meta.get("ownerReferences")
        {
            let patched = apis
                .evictions
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": meta})),
                )
                .await?;
            current = serde_json::to_value(patched).map_err(kube::Error::SerdeError)?;
        }
        let status = json!({"observedGeneration": 1, "requesters": requesters,
            "targetResponders": targets, "responders": responders, "conditions": conditions});
        let written = write_status(&apis.evictions, &current, status).await?;

        // The imperative evictor, while it is the active responder.
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
        let message = if let Some(why) = pod_skipped_by_imperative(pod) {
            why.to_string()
        } else {
            let (tries, not_before) = lock(state)
                .imperative
                .get(&uid)
                .copied()
                .unwrap_or((0, now));
            if not_before > now {
                at(not_before);
                continue;
            }
            let pod_name = s(pod, "/metadata/name").to_string();
            let params = EvictParams {
                delete_options: Some(DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                }),
                ..EvictParams::default()
            };
            match apis.pods.evict(&pod_name, &params).await {
                Ok(_) => {
                    let mut st = lock(state);
                    st.evicted.push(format!("{ns}/{pod_name}"));
                    st.imperative.remove(&uid);
                    "pod evicted".to_string()
                }
                Err(err) => {
                    let tries = tries + 1;
                    let delay = Duration::from_secs(1u64 << tries.min(10)).min(BACKOFF_MAX);
                    lock(state)
                        .imperative
                        .insert(uid.clone(), (tries, now + delay));
                    at(now + delay);
                    let text = match err {
                        kube::Error::Api(e) => e.message,
                        other => other.to_string(),
                    };
                    format!("{text}, number of retries: {tries}")
                }
            }
        };
        let mut status = written.get("status").cloned().unwrap_or(Value::Null);
        if let Some(list) = status.get_mut("responders").and_then(Value::as_array_mut) {
            for r in list.iter_mut().filter(|r| s(r, "/name") == IMPERATIVE) {
                if r.get("message") != Some(&json!(message)) {
                    r["message"] = json!(message);
                    r["heartbeatTime"] = json!(now_str());
                }
            }
        }
        write_status(&apis.evictions, &written, status).await?;
    }
    Ok(next)
}

/// Writes `status` on `object` unless it is what it has already; the object as written.
/// A conflict (someone wrote it meanwhile, a responder among them) waits for the next pass.
async fn write_status(
    api: &Api<DynamicObject>,
    object: &Value,
    status: Value,
) -> Result<Value, kube::Error> {
    if object.get("status") == Some(&status) {
        return Ok(object.clone());
    }
    let name = s(object, "/metadata/name");
    let patch = json!({
        "metadata": {"resourceVersion": s(object, "/metadata/resourceVersion")},
        "status": status,
    });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(written) => serde_json::to_value(written).map_err(kube::Error::SerdeError),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(object.clone()),
        Err(e) => Err(e),
    }
}
