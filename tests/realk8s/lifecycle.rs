//! A stand-in of the cluster's side of the EvictionRequest API (Kubernetes 1.37,
//! `lifecycle.k8s.io/v1alpha1`, KEP-4563) for the real control plane, whose v1.28 serves that
//! API only as the tests' CRDs ([`super::LIFECYCLE_CRDS`]) and runs none of its controllers.
//! It plays kube-controller-manager's evictionrequest-controller and imperative evictor for
//! one namespace, through the apiserver as the cluster admin, carrying out the decisions of
//! `nodegrace_testkit::lifecycle_decisions` (upstream's rules, once nodegrace's own
//! controller's): one `Eviction` per target pod while a request for it has intent `Eviction`,
//! its responders in priority order one `Active` at a time, the imperative evictor calling
//! the Eviction API with the pod's UID as precondition and backing off, the conditions
//! copied back to the requests.
//!
//! Each pass reads the namespace's requests, Evictions and pods afresh (the apiserver's
//! consistent lists) and writes what the decisions say; a watch of each only wakes it. A write
//! refused as stale (409) or about an object already collected (404) waits for the next pass.
//!
//! A v1.28 apiserver drops `spec.evictionResponders` from pods, so a test pod declares its
//! responders in [`RESPONDERS_ANNOTATION`] (the field's JSON); the stand-in reads either, and
//! [`super::responders_proxy`] shows the annotation to the daemon as the field.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest, ResponderStatus};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::watcher;
use kube::{Api, Client};
use nodegrace_testkit::lifecycle_decisions::{
    activated_eviction, decide, decide_evictor, eviction_is_final, evictor_attempted,
    with_evictor_entry, Decision, DeclaredResponder, EvictionOutcome, EvictorDecision, PodFacts,
    PodKind, Presence, TargetRef, EVICTOR_BACKOFF_CAP,
};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// The default responder of every pod's Eviction, which calls the Eviction API.
pub const IMPERATIVE: &str = nodegrace_testkit::lifecycle_decisions::IMPERATIVE_EVICTOR;

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

/// What the controllers keep in memory, as upstream's do.
#[derive(Default)]
struct Memory {
    /// Per pod UID: when the imperative evictor last tried and was refused.
    last_attempt: HashMap<String, Timestamp>,
    /// Pod UIDs the imperative evictor evicted (not evicted again).
    evicted_uids: HashSet<String>,
    /// Pods the imperative evictor evicted, in order ("namespace/name").
    evicted: Vec<String>,
}

/// The evictionrequest-controller and imperative evictor of one namespace, until dropped.
pub struct StandInControllers {
    memory: Arc<Mutex<Memory>>,
    task: JoinHandle<()>,
}

impl Drop for StandInControllers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The identity the stand-in acts as, a cluster admin of its own so that the audit log tells
/// its requests (the cluster's) from the test's and the node's.
pub const CONTROLLERS_USER: &str = "nodegrace-test:evictionrequest-controller";

impl StandInControllers {
    /// Starts both controllers for `namespace`, as [`CONTROLLERS_USER`].
    pub async fn for_namespace(cp: &super::ControlPlane, namespace: &str) -> Self {
        let kubeconfig = cp.mint(CONTROLLERS_USER, "system:masters");
        Self::start(super::client_from(&kubeconfig).await, namespace)
    }

    /// Starts both controllers for `namespace` with `admin`'s client.
    pub fn start(admin: Client, namespace: &str) -> Self {
        let memory = Arc::new(Mutex::new(Memory::default()));
        let apis = Apis {
            requests: Api::namespaced(admin.clone(), namespace),
            evictions: Api::namespaced(admin.clone(), namespace),
            pods: Api::namespaced(admin, namespace),
            namespace: namespace.to_owned(),
        };
        let task = tokio::spawn(run(apis, memory.clone()));
        StandInControllers { memory, task }
    }

    /// Pods the imperative evictor evicted, in order ("namespace/name").
    pub fn evicted(&self) -> Vec<String> {
        lock(&self.memory).evicted.clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Apis {
    requests: Api<EvictionRequest>,
    evictions: Api<Eviction>,
    pods: Api<Pod>,
    namespace: String,
}

async fn run(apis: Apis, memory: Arc<Mutex<Memory>>) {
    let cfg = watcher::Config::default;
    let mut changes = futures::stream::select_all([
        watcher(apis.requests.clone(), cfg()).map(|_| ()).boxed(),
        watcher(apis.evictions.clone(), cfg()).map(|_| ()).boxed(),
        watcher(apis.pods.clone(), cfg()).map(|_| ()).boxed(),
    ]);
    loop {
        let wake = match pass(&apis, &memory).await {
            Ok(wake) => wake,
            Err(err) => {
                eprintln!("lifecycle stand-in ({}): {err}", apis.namespace);
                Some(Duration::from_millis(500))
            }
        };
        let sleep = async {
            match wake {
                Some(after) => tokio::time::sleep(after).await,
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

/// A 409 (stale) or 404 (collected meanwhile): the next pass decides again.
fn next_pass<T>(r: kube::Result<T>) -> kube::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// One pass over every target pod of the namespace's requests; how long until the next
/// without a change.
async fn pass(apis: &Apis, memory: &Mutex<Memory>) -> kube::Result<Option<Duration>> {
    let requests = apis.requests.list(&ListParams::default()).await?.items;
    let evictions = apis.evictions.list(&ListParams::default()).await?.items;
    let pods: HashMap<String, Pod> = apis
        .pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, p)))
        .collect();
    let names: BTreeSet<String> = requests
        .iter()
        .filter_map(|r| r.spec.target.pod.as_ref().map(|p| p.name.clone()))
        .collect();
    let mut wakes: Vec<Timestamp> = Vec::new();
    for name in names {
        let about = |n: Option<&str>| n == Some(name.as_str());
        let requests: Vec<EvictionRequest> = requests
            .iter()
            .filter(|r| about(r.spec.target.pod.as_ref().map(|p| p.name.as_str())))
            .cloned()
            .collect();
        let mut evictions: Vec<Eviction> = evictions
            .iter()
            .filter(|e| about(e.spec.target.pod.as_ref().map(|p| p.name.as_str())))
            .cloned()
            .collect();
        let pod = pods.get(&name);
        let uids: BTreeSet<String> = requests
            .iter()
            .filter_map(|r| r.spec.target.pod.as_ref().map(|p| p.uid.clone()))
            .collect();
        for uid in uids {
            let facts = facts(pod, &uid);
            let target = TargetRef {
                name: name.clone(),
                uid: uid.clone(),
            };
            // The evictor reports first: a pod it evicted that is now gone is its completion,
            // which the controller must see before it closes the Eviction.
            if let Some(i) = evictions.iter().position(|e| is_open_for(e, &uid)) {
                let d = evictor_step(apis, memory, &target, &facts, &evictions[i]).await;
                wakes.extend(d.wake_at);
                if let Some(entry) = d.status {
                    if let Some(written) = write_entry(apis, &evictions[i], entry).await? {
                        evictions[i] = written;
                    }
                }
            }
            let mut decision = decide(&target, &facts, &requests, &evictions, Timestamp::now());
            for problem in &decision.problems {
                eprintln!("lifecycle stand-in ({}): {problem}", apis.namespace);
            }
            wakes.extend(decision.wake_at);
            if decision.is_quiet() {
                continue;
            }
            // The evictor acts at once when the decision makes it the active responder, and
            // its report joins the decision's write.
            if let Some(activated) = activated_eviction(&decision, &evictions, &target) {
                let d = evictor_step(apis, memory, &target, &facts, &activated).await;
                if let (Some(entry), Some(at)) = (d.status, activated.metadata.name.as_deref()) {
                    with_evictor_entry(&mut decision, at, entry);
                }
                wakes.extend(d.wake_at);
            }
            apply(apis, &decision, &evictions).await?;
        }
    }
    let now = Timestamp::now();
    Ok(wakes
        .into_iter()
        .min()
        .map(|at| Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO)))
}

fn is_open_for(eviction: &Eviction, uid: &str) -> bool {
    eviction
        .spec
        .target
        .pod
        .as_ref()
        .is_some_and(|p| p.uid == uid)
        && !eviction_is_final(eviction)
}

/// What the decisions need of the pod named in the requests, for the target `uid`.
fn facts(pod: Option<&Pod>, uid: &str) -> PodFacts {
    let other = |presence| PodFacts {
        presence,
        kind: PodKind::Regular,
        in_pod_group: false,
        responders: Vec::new(),
    };
    let Some(pod) = pod else {
        return other(Presence::Absent);
    };
    if pod.metadata.uid.as_deref() != Some(uid) {
        return other(Presence::Replaced {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        });
    }
    let terminal = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    let deletion = pod.metadata.deletion_timestamp.as_ref().map(|t| t.0);
    let presence = match (terminal, deletion) {
        (true, d) => Presence::Terminal {
            deletion_timestamp: d,
        },
        (false, Some(d)) => Presence::Terminating {
            deletion_timestamp: d,
            removed_at_once: pod.metadata.deletion_grace_period_seconds == Some(0),
        },
        _ => Presence::Running,
    };
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let daemonset = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    let kind = if mirror {
        PodKind::Mirror
    } else if daemonset {
        PodKind::DaemonSet
    } else {
        PodKind::Regular
    };
    let responders = serde_json::to_value(pod)
        .ok()
        .and_then(|v| declared_responders(&v))
        .and_then(|v| v.as_array().cloned())
        .into_iter()
        .flatten()
        .map(|r| DeclaredResponder {
            name: r
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            priority: r
                .get("priority")
                .and_then(Value::as_i64)
                .unwrap_or_default(),
        })
        .collect();
    PodFacts {
        presence,
        kind,
        in_pod_group: pod
            .spec
            .as_ref()
            .is_some_and(|s| s.scheduling_group.is_some()),
        responders,
    }
}

/// The imperative evictor's decision on `eviction`, the Eviction API called when it says so;
/// the entry to write is the caller's.
async fn evictor_step(
    apis: &Apis,
    memory: &Mutex<Memory>,
    target: &TargetRef,
    facts: &PodFacts,
    eviction: &Eviction,
) -> EvictorDecision {
    let now = Timestamp::now();
    let last = lock(memory).last_attempt.get(&target.uid).copied();
    let d = decide_evictor(eviction, target, facts, last, EVICTOR_BACKOFF_CAP, now);
    if !d.evict_now {
        return d;
    }
    if lock(memory).evicted_uids.contains(&target.uid) {
        return EvictorDecision::idle();
    }
    let params = EvictParams {
        delete_options: Some(DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(target.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }),
        ..EvictParams::default()
    };
    let outcome = match apis.pods.evict(&target.name, &params).await {
        Ok(_) => EvictionOutcome::Evicted,
        Err(kube::Error::Api(e)) if e.code == 404 => EvictionOutcome::Evicted,
        Err(kube::Error::Api(e)) if e.code < 500 => EvictionOutcome::Refused {
            error: e.message,
            retry_after: None,
        },
        // Not answered: no attempt to count; asked again in a second.
        Err(_) => {
            return EvictorDecision {
                evict_now: false,
                status: None,
                wake_at: now.checked_add(Duration::from_secs(1)).ok(),
            }
        }
    };
    {
        let mut m = lock(memory);
        match &outcome {
            EvictionOutcome::Evicted => {
                m.last_attempt.remove(&target.uid);
                m.evicted_uids.insert(target.uid.clone());
                m.evicted
                    .push(format!("{}/{}", apis.namespace, target.name));
            }
            EvictionOutcome::Refused { .. } => {
                m.last_attempt.insert(target.uid.clone(), now);
            }
        }
    }
    evictor_attempted(eviction, target, &outcome, EVICTOR_BACKOFF_CAP, now)
}

/// The imperative evictor's entry of `eviction` replaced by `entry`; the Eviction as written.
async fn write_entry(
    apis: &Apis,
    eviction: &Eviction,
    entry: ResponderStatus,
) -> kube::Result<Option<Eviction>> {
    let mut responders = eviction
        .status
        .as_ref()
        .and_then(|s| s.responders.clone())
        .unwrap_or_default();
    match responders.iter_mut().find(|r| r.name == entry.name) {
        Some(r) => *r = entry,
        None => return Ok(None),
    }
    write_status(apis, eviction, json!({"responders": responders})).await
}

/// Replaces the status of `eviction`, refused when it changed since it was read.
async fn write_status(
    apis: &Apis,
    eviction: &Eviction,
    status: Value,
) -> kube::Result<Option<Eviction>> {
    let name = eviction.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {"resourceVersion": eviction.metadata.resource_version},
        "status": status,
    });
    next_pass(
        apis.evictions
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
}

/// Writes `decision`.
async fn apply(apis: &Apis, decision: &Decision, known: &[Eviction]) -> kube::Result<()> {
    if let Some(new) = &decision.create {
        let mut new = new.clone();
        let status = new.status.take();
        let Some(created) = next_pass(apis.evictions.create(&PostParams::default(), &new).await)?
        else {
            return Ok(());
        };
        if let Some(status) = status {
            write_status(apis, &created, json!(status)).await?;
        }
    }
    let mut known = known.to_vec();
    for (name, metadata) in &decision.eviction_metadata {
        let patch = json!({"metadata": {"labels": metadata.labels, "ownerReferences": metadata.owner_references}});
        let written = next_pass(
            apis.evictions
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        )?;
        // Its status is written next, on the version this write made.
        if let Some(written) = written {
            known.retain(|e| e.metadata.name.as_deref() != Some(name));
            known.push(written);
        }
    }
    for (name, status) in &decision.eviction_statuses {
        // Written from the object the decision was made on: stale, it waits.
        if let Some(old) = known
            .iter()
            .find(|e| e.metadata.name.as_deref() == Some(name))
        {
            write_status(apis, old, json!(status)).await?;
        }
    }
    for (name, status) in &decision.request_statuses {
        // Only the controller writes a request's status: no precondition needed.
        next_pass(
            apis.requests
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await,
        )?;
    }
    Ok(())
}
