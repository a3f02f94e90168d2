//! EvictionRequests against the fake apiserver with the CRD installed: the requester side
//! (create, join, withdraw) and this node's eviction-request controller (interceptors,
//! heartbeats, hand-over, Eviction API fallback with PodDisruptionBudgets, completion).
//! Time is tokio's, paused: heartbeat deadlines pass without waiting.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use nodegrace::{
    is_crd_installed, Controller, ControllerConfig, ControllerHandle, EvictionRequest, PodKey,
    Reconciler, Requested, Requester, WallClock, Withdrawn, INTERCEPTOR_ANNOTATION_PREFIX,
    NODE_LABEL,
};
use nodegrace_testkit::fake_apiserver::{running_status, FakeCluster, RecordedRequest};
use nodegrace_testkit::fake_kubelet::KubeletConfig;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const NODE: &str = "n1";
/// This node's requester name.
const OURS: &str = "n1.nodemaintenance.nodegrace.dev";
const NS: &str = "prod";
const DESCHEDULER: &str = "descheduler.example.com";

async fn cluster() -> FakeCluster {
    let cluster = FakeCluster::start().await.unwrap();
    cluster
        .install_crd(&nodegrace::eviction_request_crd().unwrap())
        .unwrap();
    cluster.add_node(NODE).unwrap();
    cluster.add_node("n2").unwrap();
    cluster.ensure_namespace(NS).unwrap();
    cluster
}

/// A running pod on `node` with interceptor annotations `(name, "priority[/role]")`.
fn add_pod(cluster: &FakeCluster, name: &str, node: &str, interceptors: &[(&str, &str)]) -> PodKey {
    let annotations: serde_json::Map<String, Value> = interceptors
        .iter()
        .map(|(n, p)| (format!("{INTERCEPTOR_ANNOTATION_PREFIX}{n}"), json!(p)))
        .collect();
    let pod = cluster
        .insert(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "db"}, "annotations": annotations},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
            "status": running_status(&cluster.store.now_str()),
        }))
        .unwrap();
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    PodKey::new(NS, name, uid)
}

/// A PodDisruptionBudget over the `app: db` pods; `limit` is `minAvailable` or
/// `maxUnavailable`.
async fn add_pdb(client: &Client, name: &str, limit: Value) {
    let mut spec = limit;
    spec["selector"] = json!({"matchLabels": {"app": "db"}});
    let pdb: PodDisruptionBudget =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
}

/// This node asks for `pod`'s eviction with the default heartbeat deadline.
async fn request_eviction(client: &Client, pod: &PodKey) {
    Requester::new(client.clone(), NODE)
        .request(pod)
        .await
        .unwrap();
}

fn requests_api(client: &Client) -> Api<EvictionRequest> {
    Api::namespaced(client.clone(), NS)
}

async fn get(client: &Client, pod: &PodKey) -> EvictionRequest {
    requests_api(client).get(&pod.uid).await.unwrap()
}

fn requester_names(r: &EvictionRequest) -> Vec<&str> {
    r.spec.requesters.iter().map(|q| q.name.as_str()).collect()
}

fn active(r: &EvictionRequest) -> Option<&str> {
    r.status.as_ref()?.active_interceptor_name.as_deref()
}

fn message(r: &EvictionRequest) -> String {
    r.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

fn complete_reason(r: &EvictionRequest) -> Option<String> {
    let s = r.status.as_ref()?;
    s.conditions
        .iter()
        .find(|c| c.type_ == "Complete" && c.status == "True")
        .map(|c| c.reason.clone())
}

/// The controller's wall clock, on the fake apiserver's (both advance with tokio time).
fn clock_of(cluster: &FakeCluster) -> WallClock {
    let now = cluster.store.now();
    WallClock::Tokio {
        wall: k8s_openapi::jiff::Timestamp::new(
            now.timestamp(),
            now.timestamp_subsec_nanos() as i32,
        )
        .unwrap(),
        mono: tokio::time::Instant::now(),
    }
}

/// Starts the controller for `NODE` the way the engine runs it: a reflector of the node's
/// pods (field selector) that reports every pod event to the controller.
fn start_controller(cluster: &FakeCluster, backoff_max: Duration) -> CancellationToken {
    start_controller_with_handle(cluster, backoff_max).0
}

fn start_controller_with_handle(
    cluster: &FakeCluster,
    backoff_max: Duration,
) -> (CancellationToken, ControllerHandle) {
    start_controller_for(cluster, backoff_max, None)
}

/// The controller, putting the requester of `intent` back where it was removed.
fn start_controller_for(
    cluster: &FakeCluster,
    backoff_max: Duration,
    intent: Option<nodegrace::Intent>,
) -> (CancellationToken, ControllerHandle) {
    let client = cluster.client().unwrap();
    let stop = CancellationToken::new();
    let (pods, writer) = reflector::store::<Pod>();
    let (mut controller, handle) = Controller::new(
        client.clone(),
        pods,
        ControllerConfig {
            node: NODE.into(),
            backoff_max,
            clock: clock_of(cluster),
            concurrency: 64,
        },
    );
    let all_pods: Api<Pod> = Api::all(client);
    let pod_events = reflector::reflector(
        writer,
        watcher(
            all_pods,
            watcher::Config::default().fields(&format!("spec.nodeName={NODE}")),
        ),
    )
    .default_backoff();
    let pod_stop = stop.clone();
    let returned = handle.clone();
    tokio::spawn(async move {
        let mut pod_events = std::pin::pin!(pod_events);
        loop {
            tokio::select! {
                () = pod_stop.cancelled() => return,
                ev = pod_events.next() => match ev {
                    Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p) | watcher::Event::Delete(p))) => {
                        handle.pod_changed(p.metadata.namespace.as_deref().unwrap_or_default(),
                            p.metadata.uid.as_deref().unwrap_or_default());
                    }
                    Some(_) => {}
                    None => return,
                },
            }
        }
    });
    if let Some(intent) = intent {
        controller = controller.reasserting(intent);
    }
    let run_stop = stop.clone();
    tokio::spawn(async move { controller.run(run_stop).await.unwrap() });
    (stop, returned)
}

/// Waits (in paused tokio time, up to `limit`) until `check` holds for the request.
async fn until(
    client: &Client,
    pod: &PodKey,
    limit: Duration,
    what: &str,
    check: impl Fn(&EvictionRequest) -> bool,
) -> EvictionRequest {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(r) = requests_api(client).get_opt(&pod.uid).await.unwrap() {
            if check(&r) {
                return r;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("{what}: not within {limit:?}; request is {r:#?}");
            }
        } else if tokio::time::Instant::now() >= deadline {
            panic!("{what}: not within {limit:?}; no request");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The interceptor `name` reports progress (or gives up) the way a real one would: a
/// merge patch of the status subresource.
async fn interceptor_reports(cluster: &FakeCluster, pod: &PodKey, status: Value) {
    let client = cluster.client().unwrap();
    requests_api(&client)
        .patch_status(
            &pod.uid,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .unwrap();
}

fn evictions_of(requests: &[RecordedRequest], pod: &str) -> usize {
    let path = format!("/api/v1/namespaces/{NS}/pods/{pod}/eviction");
    requests
        .iter()
        .filter(|r| r.method == "POST" && r.path == path)
        .count()
}

#[tokio::test]
async fn the_crd_is_detected_through_discovery() {
    let bare = FakeCluster::start().await.unwrap();
    assert!(!is_crd_installed(&bare.client().unwrap()).await.unwrap());
    let cluster = cluster().await;
    assert!(is_crd_installed(&cluster.client().unwrap()).await.unwrap());
}

#[tokio::test]
async fn create_then_join_makes_one_request_with_both_requesters() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let pod = add_pod(&cluster, "db-0", NODE, &[]);
    let ours = Requester::new(client.clone(), NODE);
    let descheduler = Requester::new(client.clone(), "elsewhere").named(DESCHEDULER);

    assert_eq!(ours.request(&pod).await.unwrap(), Requested::Created);
    assert_eq!(descheduler.request(&pod).await.unwrap(), Requested::Joined);
    assert_eq!(
        ours.request(&pod).await.unwrap(),
        Requested::AlreadyRequested
    );
    assert_eq!(
        descheduler.request(&pod).await.unwrap(),
        Requested::AlreadyRequested
    );

    let all = requests_api(&client)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(all.items.len(), 1, "one EvictionRequest per pod");
    let r = &all.items[0];
    assert_eq!(r.metadata.name.as_deref(), Some(pod.uid.as_str()));
    assert_eq!(requester_names(r), [OURS, DESCHEDULER]);
    let pod_ref = r.pod_ref().unwrap();
    assert_eq!(
        (pod_ref.name.as_str(), pod_ref.uid.as_str()),
        ("db-0", pod.uid.as_str())
    );
    assert_eq!(r.spec.heartbeat_deadline_seconds, 1800);
    let owner = &r.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", pod.uid.as_str())
    );
    let labels = r.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("db"),
        "pod labels merged"
    );
    assert!(labels.contains_key(NODE_LABEL));
}

#[tokio::test]
async fn concurrent_joins_lose_no_requester() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let pod = add_pod(&cluster, "db-0", NODE, &[]);
    request_eviction(&client, &pod).await;
    // Every read is answered before any write lands: all joiners write against the same
    // resourceVersion and all but one get a 409.
    cluster.api.set_latency(Duration::from_millis(20));
    cluster.api.clear_requests();
    let names = ["a.example.com", "b.example.com", "c.example.com"];
    let joiners: Vec<Requester> = names
        .iter()
        .map(|n| Requester::new(client.clone(), NODE).named(n))
        .collect();
    let results = futures::future::join_all(joiners.iter().map(|j| j.request(&pod))).await;
    for result in results {
        assert_eq!(result.unwrap(), Requested::Joined);
    }
    let patches = cluster
        .api
        .writes()
        .iter()
        .filter(|w| w.method == "PATCH" && w.path.ends_with(&pod.uid))
        .count();
    assert!(
        patches > names.len(),
        "conflicting writes were retried ({patches} patches)"
    );
    let r = get(&client, &pod).await;
    let mut got = requester_names(&r);
    got.sort();
    assert_eq!(
        got,
        ["a.example.com", "b.example.com", "c.example.com", OURS]
    );
}

#[tokio::test]
async fn withdraw_removes_the_requester_and_the_last_one_cancels() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    // An interceptor keeps the Eviction API out of the way while requesters come and go.
    let pod = add_pod(
        &cluster,
        "db-0",
        NODE,
        &[("db-operator.example.com", "100")],
    );
    let ours = Requester::new(client.clone(), NODE);
    let descheduler = Requester::new(client.clone(), NODE).named(DESCHEDULER);
    ours.request(&pod).await.unwrap();
    descheduler.request(&pod).await.unwrap();

    assert_eq!(ours.withdraw(&pod).await.unwrap(), Withdrawn::Removed);
    assert_eq!(requester_names(&get(&client, &pod).await), [DESCHEDULER]);
    assert_eq!(ours.withdraw(&pod).await.unwrap(), Withdrawn::NotRequested);

    let stop = start_controller(&cluster, Duration::from_secs(60));
    until(
        &client,
        &pod,
        Duration::from_secs(5),
        "interceptor selected",
        |r| active(r).is_some(),
    )
    .await;
    assert_eq!(
        descheduler.withdraw(&pod).await.unwrap(),
        Withdrawn::Cancelled
    );
    let done = until(&client, &pod, Duration::from_secs(5), "cancelled", |r| {
        complete_reason(r).is_some()
    })
    .await;
    assert_eq!(complete_reason(&done).as_deref(), Some("Cancelled"));
    assert_eq!(active(&done), None, "the active interceptor is cleared");
    assert!(done.spec.requesters.is_empty());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    assert!(
        pods.get("db-0")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none(),
        "cancelled, not evicted"
    );

    // A new request replaces the cancelled one (its requesters are frozen).
    assert_eq!(ours.request(&pod).await.unwrap(), Requested::Created);
    let again = until(&client, &pod, Duration::from_secs(5), "active again", |r| {
        active(r).is_some()
    })
    .await;
    assert_eq!(complete_reason(&again), None);
    assert_eq!(requester_names(&again), [OURS]);
    stop.cancel();
}

#[tokio::test]
async fn a_forbid_policy_keeps_the_requester() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let pod = add_pod(
        &cluster,
        "db-0",
        NODE,
        &[("db-operator.example.com", "100")],
    );
    let ours = Requester::new(client.clone(), NODE);
    ours.request(&pod).await.unwrap();
    interceptor_reports(
        &cluster,
        &pod,
        json!({"evictionRequestCancellationPolicy": "Forbid"}),
    )
    .await;
    assert_eq!(ours.withdraw(&pod).await.unwrap(), Withdrawn::Forbidden);
    assert_eq!(requester_names(&get(&client, &pod).await), [OURS]);
    let late = Requester::new(client.clone(), NODE).named(DESCHEDULER);
    assert_eq!(late.request(&pod).await.unwrap(), Requested::Uncancellable);
}

#[tokio::test(start_paused = true)]
async fn interceptors_run_highest_priority_first_and_hand_over_on_a_missed_heartbeat() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let _kubelet = cluster.kubelet(KubeletConfig::node(NODE));
    let pod = add_pod(
        &cluster,
        "db-0",
        NODE,
        &[
            ("replicaset.apps.k8s.io", "100/controller"),
            ("db-operator.example.com", "20000/knowledgeable"),
            ("deployment.apps.k8s.io", "10000/controller"),
        ],
    );
    Requester::new(client.clone(), NODE)
        .heartbeat_deadline_seconds(600)
        .request(&pod)
        .await
        .unwrap();
    let created = get(&client, &pod).await;
    let order: Vec<&str> = created
        .spec
        .interceptors
        .iter()
        .map(|i| i.name.as_str())
        .collect();
    assert_eq!(
        order,
        [
            "replicaset.apps.k8s.io",
            "deployment.apps.k8s.io",
            "db-operator.example.com"
        ]
    );

    let stop = start_controller(&cluster, Duration::from_secs(60));
    let r = until(
        &client,
        &pod,
        Duration::from_secs(5),
        "first interceptor",
        |r| active(r).is_some(),
    )
    .await;
    assert_eq!(
        active(&r),
        Some("db-operator.example.com"),
        "highest priority first"
    );

    // Heartbeats inside the deadline keep it in charge well past one deadline.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(500)).await;
        interceptor_reports(
            &cluster,
            &pod,
            json!({"heartbeatTime": cluster.store.now_str()}),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(500)).await;
    let kept = get(&client, &pod).await;
    assert_eq!(
        active(&kept),
        Some("db-operator.example.com"),
        "2000s in, heartbeats kept it"
    );

    // Silence: the deadline passes and the next lower index takes over.
    let handed = until(&client, &pod, Duration::from_secs(200), "hand-over", |r| {
        active(r) == Some("deployment.apps.k8s.io")
    })
    .await;
    assert!(message(&handed).contains("db-operator.example.com sent no heartbeat within 600s"));
    let hb = handed
        .status
        .as_ref()
        .unwrap()
        .heartbeat_time
        .clone()
        .unwrap();
    let age = cluster.store.now().timestamp() - hb.0.as_second();
    assert!(
        (0..=2).contains(&age),
        "hand-over restarts the heartbeat clock ({age}s old)"
    );

    // Giving up hands over at once, without waiting for the deadline.
    interceptor_reports(&cluster, &pod, json!({"activeInterceptorCompleted": true})).await;
    let last = until(
        &client,
        &pod,
        Duration::from_secs(5),
        "last interceptor",
        |r| active(r) == Some("replicaset.apps.k8s.io"),
    )
    .await;
    assert!(!last.status.as_ref().unwrap().active_interceptor_completed);
    assert_eq!(
        evictions_of(&cluster.api.requests(), "db-0"),
        0,
        "no eviction while an interceptor is left"
    );

    // The last interceptor gives up: the Eviction API, then Complete once the pod is gone.
    interceptor_reports(&cluster, &pod, json!({"activeInterceptorCompleted": true})).await;
    let done = until(&client, &pod, Duration::from_secs(60), "complete", |r| {
        complete_reason(r).is_some()
    })
    .await;
    assert_eq!(complete_reason(&done).as_deref(), Some("PodDeleted"));
    assert_eq!(active(&done), None);
    assert_eq!(evictions_of(&cluster.api.requests(), "db-0"), 1);
    let eviction = cluster
        .api
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/pods/db-0/eviction"))
        .unwrap();
    let body = eviction.body_json().unwrap();
    assert_eq!(
        body["deleteOptions"]["preconditions"]["uid"],
        json!(pod.uid),
        "UID precondition"
    );
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_last_interceptor_missing_its_heartbeat_falls_back_to_the_eviction_api() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let _kubelet = cluster.kubelet(KubeletConfig::node(NODE));
    let pod = add_pod(&cluster, "db-0", NODE, &[("db-operator.example.com", "1")]);
    Requester::new(client.clone(), NODE)
        .heartbeat_deadline_seconds(600)
        .request(&pod)
        .await
        .unwrap();
    let stop = start_controller(&cluster, Duration::from_secs(60));
    until(&client, &pod, Duration::from_secs(5), "selected", |r| {
        active(r).is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(590)).await;
    assert_eq!(
        evictions_of(&cluster.api.requests(), "db-0"),
        0,
        "not before the deadline"
    );
    let done = until(&client, &pod, Duration::from_secs(60), "complete", |r| {
        complete_reason(r).is_some()
    })
    .await;
    assert_eq!(evictions_of(&cluster.api.requests(), "db-0"), 1);
    assert_eq!(complete_reason(&done).as_deref(), Some("PodDeleted"));
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_blocking_budget_is_counted_named_and_backed_off_until_it_allows() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let _kubelet = cluster.kubelet(KubeletConfig::node(NODE));
    let pod = add_pod(&cluster, "db-0", NODE, &[]);
    add_pdb(&client, "db-pdb", json!({"minAvailable": 1})).await;
    request_eviction(&client, &pod).await;
    let stop = start_controller(&cluster, Duration::from_secs(8));
    let start = tokio::time::Instant::now();

    let first = until(
        &client,
        &pod,
        Duration::from_secs(1),
        "first failure",
        |r| r.failed_api_evictions() == 1,
    )
    .await;
    assert!(
        message(&first).contains("PodDisruptionBudget db-pdb"),
        "{}",
        message(&first)
    );
    assert!(
        message(&first).contains("next attempt in 1s"),
        "{}",
        message(&first)
    );

    // Attempts at 0, 1, 3, 7, 15 (cap 8s), 23 s.
    let mut seen = Vec::new();
    for t in [0.5, 1.5, 3.5, 7.5, 15.5, 23.5] {
        tokio::time::sleep_until(start + Duration::from_secs_f64(t)).await;
        seen.push(evictions_of(&cluster.api.requests(), "db-0"));
    }
    assert_eq!(seen, [1, 2, 3, 4, 5, 6]);
    let r = get(&client, &pod).await;
    assert_eq!(r.failed_api_evictions(), 6);
    assert!(complete_reason(&r).is_none());

    // Each refusal is also an event on the request, naming the budget.
    let events = Api::<K8sEvent>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    let blocked: Vec<&K8sEvent> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("EvictionBlocked"))
        .collect();
    assert!(!blocked.is_empty(), "events: {:#?}", events.items);
    let e = blocked[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(
        e.regarding.as_ref().unwrap().name.as_deref(),
        Some(pod.uid.as_str())
    );
    assert_eq!(e.related.as_ref().unwrap().name.as_deref(), Some("db-pdb"));
    assert!(e
        .note
        .as_deref()
        .unwrap()
        .contains("PodDisruptionBudget db-pdb"));

    // A second replica makes room in the budget: the next attempt goes through.
    add_pod(&cluster, "db-1", "n2", &[]);
    let done = until(&client, &pod, Duration::from_secs(60), "complete", |r| {
        complete_reason(r).is_some()
    })
    .await;
    assert_eq!(evictions_of(&cluster.api.requests(), "db-0"), 7);
    assert_eq!(
        done.failed_api_evictions(),
        6,
        "the counter never goes down"
    );
    stop.cancel();
}

fn status_writes_of(requests: &[RecordedRequest], pod: &PodKey) -> usize {
    let path = format!("/namespaces/{NS}/evictionrequests/{}/status", pod.uid);
    requests
        .iter()
        .filter(|r| matches!(r.method.as_str(), "PUT" | "PATCH") && r.path.ends_with(&path))
        .count()
}

/// A request owned by its pod (as this node's requester makes them) is marked Complete
/// only if the garbage collector has not deleted it 5 s after the pod went: when a band of
/// pods goes, the next band's evictions do not compete with writes to requests about to
/// be collected. One that stays is marked Complete.
#[tokio::test(start_paused = true)]
async fn a_request_collected_with_its_pod_is_not_written_after_the_pod_went() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let _kubelet = cluster.kubelet(KubeletConfig::node(NODE));
    let collected = add_pod(&cluster, "db-0", NODE, &[]);
    let kept = add_pod(&cluster, "db-1", NODE, &[]);
    let stop = start_controller(&cluster, Duration::from_secs(8));
    let asked = tokio::time::Instant::now();
    request_eviction(&client, &collected).await;
    request_eviction(&client, &kept).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let start = tokio::time::Instant::now();
    loop {
        let left = pods.list(&ListParams::default()).await.unwrap().items;
        if left
            .iter()
            .all(|p| p.metadata.name.as_deref() == Some("other"))
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "pods not evicted: {left:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The garbage collector deletes db-0's request a second after its pod.
    tokio::time::sleep(Duration::from_secs(1)).await;
    requests_api(&client)
        .delete(&collected.uid, &Default::default())
        .await
        .unwrap();
    let done = until(&client, &kept, Duration::from_secs(10), "complete", |r| {
        complete_reason(r).is_some()
    })
    .await;
    assert!(
        asked.elapsed() >= Duration::from_secs(5),
        "Complete {:?} after the eviction was asked for",
        asked.elapsed()
    );
    assert_eq!(complete_reason(&done).as_deref(), Some("PodDeleted"));
    let requests = cluster.api.requests();
    assert_eq!(
        status_writes_of(&requests, &collected),
        0,
        "a write to a request being collected"
    );
    assert_eq!(status_writes_of(&requests, &kept), 1);
    stop.cancel();
}

/// The requester hands the requests it creates to this node's controller, which evicts
/// at once instead of waiting for its watch to bring them (here 5 s late).
#[tokio::test(start_paused = true)]
async fn a_request_created_here_is_acted_on_before_the_watch_brings_it() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let pod = add_pod(&cluster, "db-0", NODE, &[]);
    cluster.api.delay(
        Some("GET"),
        "/apis/nodegrace.dev/v1alpha1/evictionrequests",
        Duration::from_secs(5),
    );
    let (stop, handle) = start_controller_with_handle(&cluster, Duration::from_secs(8));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let requester = Requester::new(client.clone(), NODE);
    requester.announce_to(handle);
    let asked = tokio::time::Instant::now();
    requester.request(&pod).await.unwrap();
    while evictions_of(&cluster.api.requests(), "db-0") == 0 {
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "not evicted within 1 s of its request"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Once the watch brings it, nothing is done twice.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(evictions_of(&cluster.api.requests(), "db-0"), 1);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_goes_away_by_itself_completes_the_request() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let pod = add_pod(&cluster, "db-0", NODE, &[("db-operator.example.com", "1")]);
    request_eviction(&client, &pod).await;
    // This time the controller watches the node's pods itself.
    let stop = CancellationToken::new();
    let config = ControllerConfig {
        node: NODE.into(),
        backoff_max: Duration::from_secs(60),
        clock: clock_of(&cluster),
        concurrency: 64,
    };
    tokio::spawn(Controller::run_with_own_pod_watch(
        client.clone(),
        config,
        stop.clone(),
    ));
    until(&client, &pod, Duration::from_secs(5), "selected", |r| {
        active(r).is_some()
    })
    .await;
    // The interceptor deletes the pod itself.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("db-0", &Default::default()).await.unwrap();
    cluster.store.finish_deletion("", "pods", NS, "db-0", None);
    let done = until(&client, &pod, Duration::from_secs(5), "complete", |r| {
        complete_reason(r).is_some()
    })
    .await;
    assert_eq!(complete_reason(&done).as_deref(), Some("PodDeleted"));
    assert_eq!(evictions_of(&cluster.api.requests(), "db-0"), 0);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn requests_for_other_nodes_pods_are_left_alone() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let theirs = add_pod(&cluster, "web-0", "n2", &[]);
    let ours = add_pod(&cluster, "db-0", NODE, &[("db-operator.example.com", "1")]);
    Requester::new(client.clone(), "n2")
        .request(&theirs)
        .await
        .unwrap();
    request_eviction(&client, &ours).await;
    let stop = start_controller(&cluster, Duration::from_secs(60));
    until(
        &client,
        &ours,
        Duration::from_secs(5),
        "ours handled",
        |r| active(r).is_some(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        get(&client, &theirs).await.status.is_none(),
        "n2's request untouched"
    );
    assert_eq!(evictions_of(&cluster.api.requests(), "web-0"), 0);
    stop.cancel();
}

/// Another requester's request (unlabelled) for this node's pod is labelled for the node and
/// acted on; one for another node's pod is left to that node. The controller watches only
/// the requests labelled for its node and the unlabelled ones: requests labelled for other
/// nodes (their drains' churn) never reach it.
#[tokio::test(start_paused = true)]
async fn unlabelled_requests_are_claimed_and_only_this_nodes_requests_are_watched() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let ours = add_pod(&cluster, "db-0", NODE, &[("db-operator.example.com", "1")]);
    let theirs = add_pod(&cluster, "web-0", "n2", &[]);
    for pod in [&ours, &theirs] {
        let mut request =
            EvictionRequest::for_pod(&pod.namespace, &pod.name, &pod.uid, DESCHEDULER, vec![]);
        if pod == &ours {
            request.spec.interceptors = vec![nodegrace::Interceptor {
                name: "db-operator.example.com".into(),
            }];
        }
        requests_api(&client)
            .create(&PostParams::default(), &request)
            .await
            .unwrap();
    }
    let stop = start_controller(&cluster, Duration::from_secs(60));
    let claimed = until(
        &client,
        &ours,
        Duration::from_secs(5),
        "claimed and handled",
        |r| active(r).is_some(),
    )
    .await;
    assert_eq!(
        claimed
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(NODE_LABEL))
            .map(String::as_str),
        Some(NODE)
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let left = get(&client, &theirs).await;
    assert!(
        left.status.is_none()
            && left
                .metadata
                .labels
                .as_ref()
                .is_none_or(|l| !l.contains_key(NODE_LABEL)),
        "n2's pod's request untouched: {left:?}"
    );

    let selectors: Vec<Option<String>> = cluster
        .api
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/evictionrequests"))
        .map(|r| r.param("labelSelector"))
        .collect();
    assert!(!selectors.is_empty());
    let ours_selector = format!("{NODE_LABEL}={NODE}");
    let unlabelled = format!("!{NODE_LABEL}");
    for selector in &selectors {
        assert!(
            selector.as_deref() == Some(ours_selector.as_str())
                || selector.as_deref() == Some(unlabelled.as_str()),
            "a list or watch of EvictionRequests not confined to this node's: {selector:?}"
        );
    }
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_restarted_controller_resumes_from_the_persisted_heartbeat() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let pod = add_pod(
        &cluster,
        "db-0",
        NODE,
        &[("a.example.com", "1"), ("b.example.com", "2")],
    );
    let ours = Requester::new(client.clone(), NODE).heartbeat_deadline_seconds(600);
    ours.request(&pod).await.unwrap();
    let first = start_controller(&cluster, Duration::from_secs(60));
    until(&client, &pod, Duration::from_secs(5), "selected", |r| {
        active(r) == Some("b.example.com")
    })
    .await;
    first.cancel();

    // Down for longer than the deadline; the drain asks again after its own restart.
    tokio::time::sleep(Duration::from_secs(700)).await;
    assert_eq!(active(&get(&client, &pod).await), Some("b.example.com"));
    assert_eq!(
        ours.request(&pod).await.unwrap(),
        Requested::AlreadyRequested
    );
    cluster.api.clear_requests();
    let second = start_controller(&cluster, Duration::from_secs(60));
    let r = until(
        &client,
        &pod,
        Duration::from_secs(2),
        "hand-over after restart",
        |r| active(r) == Some("a.example.com"),
    )
    .await;
    assert!(message(&r).contains("b.example.com sent no heartbeat"));
    let creates = cluster
        .api
        .writes()
        .iter()
        .filter(|w| w.method == "POST" && w.path.contains("evictionrequests"))
        .count();
    assert_eq!(creates, 0, "no duplicate request");
    let all = requests_api(&client)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(all.items.len(), 1);
    second.cancel();
}

/// What a drain of many pods costs in API requests, and that nothing but watches is sent
/// once it is done.
#[tokio::test(start_paused = true)]
async fn requests_are_proportional_to_pods_and_none_are_sent_when_idle() {
    const PODS: usize = 50;
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let _kubelet = cluster.kubelet(KubeletConfig::node(NODE));
    let keys: Vec<PodKey> = (0..PODS)
        .map(|i| add_pod(&cluster, &format!("w-{i}"), NODE, &[]))
        .collect();
    let stop = start_controller(&cluster, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(100)).await;
    cluster.api.clear_requests();

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let ours = Requester::new(client.clone(), NODE);
    for key in &keys {
        let pod = pods.get(&key.name).await.unwrap();
        assert_eq!(ours.request_pod(&pod).await.unwrap(), Requested::Created);
    }
    for key in &keys {
        until(&client, key, Duration::from_secs(30), "complete", |r| {
            complete_reason(r).is_some()
        })
        .await;
    }
    let log = cluster.api.requests();
    let count = |f: &dyn Fn(&RecordedRequest) -> bool| log.iter().filter(|r| f(r)).count();
    // The test's own reads (the pod reads above and the polling in `until`) are GETs of
    // single objects; what the requester and the controller send is everything else.
    let ours_sent = count(&|r| r.method != "GET");
    let evictions = count(&|r| r.path.ends_with("/eviction"));
    let status_writes = count(&|r| r.method == "PUT" && r.path.ends_with("/status"));
    let creates = count(&|r| r.method == "POST" && r.path.contains("evictionrequests"));
    let events = count(&|r| r.path.contains("/events"));
    let pod_reads =
        count(&|r| r.method == "GET" && r.path.contains("/pods/") && !r.is_watch()) - PODS;
    println!(
        "{PODS} pods: {ours_sent} writes ({creates} creates, {evictions} evictions, \
         {status_writes} status writes, {events} events) and about {pod_reads} pod reads"
    );
    assert_eq!(
        (creates, evictions),
        (PODS, PODS),
        "one create and one eviction per pod"
    );
    assert!(status_writes <= 2 * PODS, "{status_writes} status writes");
    assert!(ours_sent <= 5 * PODS, "{ours_sent} writes");

    cluster.api.clear_requests();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let idle: Vec<String> = cluster
        .api
        .requests()
        .iter()
        .filter(|r| !r.is_watch())
        .map(|r| format!("{} {}?{}", r.method, r.path, r.query))
        .collect();
    assert!(idle.is_empty(), "requests while idle: {idle:#?}");
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn other_eviction_refusals_count_as_failed_attempts() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let pod = add_pod(&cluster, "db-0", NODE, &[]);
    for name in ["pdb-a", "pdb-b"] {
        add_pdb(&client, name, json!({"maxUnavailable": 1})).await;
    }
    request_eviction(&client, &pod).await;
    let stop = start_controller(&cluster, Duration::from_secs(60));
    let r = until(&client, &pod, Duration::from_secs(4), "two failures", |r| {
        r.failed_api_evictions() == 2
    })
    .await;
    assert!(
        message(&r).contains("more than one PodDisruptionBudget"),
        "{}",
        message(&r)
    );
    assert!(complete_reason(&r).is_none());
    stop.cancel();
}

fn pod_info(key: &PodKey) -> nodegrace::PodInfo {
    serde_json::from_value(json!({
        "namespace": key.namespace, "name": key.name, "uid": key.uid, "priority": 0,
        "podType": "Default", "terminationGracePeriodSeconds": 30,
    }))
    .unwrap()
}

/// The engine's terminator: a maintenance's withdrawal leaves pods another maintenance
/// still wants, and a restarted daemon still withdraws what it requested before.
#[tokio::test]
async fn the_terminator_withdraws_per_maintenance_and_after_a_restart() {
    use nodegrace::{
        evict::Outcome, EvictionRequestTerminator, PodTerminator, Request, TerminationMethod,
    };

    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let interceptor = [("db-operator.example.com", "1")];
    let shared = add_pod(&cluster, "shared", NODE, &interceptor);
    let only_a = add_pod(&cluster, "only-a", NODE, &interceptor);
    let later = add_pod(&cluster, "later", NODE, &interceptor);
    let terminator =
        EvictionRequestTerminator::new(client.clone(), Requester::new(client.clone(), NODE));
    assert_eq!(
        terminator.method(Request::Cooperative),
        TerminationMethod::EvictionRequest
    );
    for (pod, m) in [(&shared, "m-a"), (&shared, "m-b"), (&only_a, "m-a")] {
        let outcome = terminator
            .terminate(&pod_info(pod), None, Request::Cooperative, m)
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Accepted);
    }
    let holders = |r: EvictionRequest| requester_names(&r).len();
    terminator.withdraw("m-a").await.unwrap();
    assert_eq!(
        holders(get(&client, &only_a).await),
        0,
        "only m-a wanted it"
    );
    assert_eq!(
        holders(get(&client, &shared).await),
        1,
        "m-b still wants it"
    );
    terminator.withdraw("m-b").await.unwrap();
    assert_eq!(holders(get(&client, &shared).await), 0);

    // Requested by a daemon that then restarted: the new one withdraws it too.
    terminator
        .terminate(&pod_info(&later), None, Request::Cooperative, "m-c")
        .await
        .unwrap();
    let restarted =
        EvictionRequestTerminator::new(client.clone(), Requester::new(client.clone(), NODE));
    restarted.withdraw("m-c").await.unwrap();
    assert_eq!(holders(get(&client, &later).await), 0);

    // DELETE stays a DELETE, with the pod's grace period.
    let outcome = restarted
        .terminate(
            &pod_info(&later),
            None,
            Request::Delete { grace_seconds: 5 },
            "m-d",
        )
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Accepted);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deleting = pods.get("later").await.unwrap();
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(5));
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_shortens_a_running_back_off() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let pod = add_pod(&cluster, "db-0", NODE, &[]);
    add_pdb(&client, "db-pdb", json!({"minAvailable": 1})).await;
    request_eviction(&client, &pod).await;
    let (stop, handle) = start_controller_with_handle(&cluster, Duration::from_secs(900));
    let start = tokio::time::Instant::now();
    // Attempts at 0, 1, 3, 7, 15; the next would be at 31.
    tokio::time::sleep_until(start + Duration::from_secs(16)).await;
    assert_eq!(evictions_of(&cluster.api.requests(), "db-0"), 5);
    handle.set_backoff_max(Duration::from_secs(2));
    tokio::time::sleep_until(start + Duration::from_millis(18_500)).await;
    assert_eq!(
        evictions_of(&cluster.api.requests(), "db-0"),
        6,
        "cut to the new cap"
    );
    tokio::time::sleep_until(start + Duration::from_millis(20_500)).await;
    assert_eq!(evictions_of(&cluster.api.requests(), "db-0"), 7);
    stop.cancel();
}

/// The pod watch may still show an evicted pod without its deletionTimestamp when the
/// request is reconciled again (the request changed, another pod event): it is not
/// evicted a second time.
#[tokio::test]
async fn an_evicted_pod_is_not_evicted_again_while_the_pod_watch_lags() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let key = add_pod(&cluster, "web-0", NODE, &[]);
    request_eviction(&client, &key).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let before_eviction = pods.get("web-0").await.unwrap();
    let reconciler = Reconciler::new(
        client.clone(),
        &ControllerConfig {
            node: NODE.into(),
            backoff_max: Duration::from_secs(60),
            clock: clock_of(&cluster),
            concurrency: 64,
        },
    );
    for _ in 0..2 {
        let request = get(&client, &key).await;
        reconciler
            .reconcile(&request, Some(&before_eviction))
            .await
            .unwrap();
    }
    assert_eq!(evictions_of(&cluster.api.requests(), "web-0"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_removed_requester_is_put_back_while_its_maintenance_wants_the_pod() {
    use nodegrace::{EvictionRequestTerminator, PodTerminator, Request};

    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    // An interceptor keeps the Eviction API out of the way while requesters come and go.
    let pod = add_pod(
        &cluster,
        "db-0",
        NODE,
        &[("db-operator.example.com", "100")],
    );
    let terminator =
        EvictionRequestTerminator::new(client.clone(), Requester::new(client.clone(), NODE));
    let (stop, _) =
        start_controller_for(&cluster, Duration::from_secs(60), Some(terminator.intent()));
    terminator
        .terminate(&pod_info(&pod), None, Request::Cooperative, "m-a")
        .await
        .unwrap();
    until(
        &client,
        &pod,
        Duration::from_secs(5),
        "interceptor selected",
        |r| active(r).is_some(),
    )
    .await;

    // Someone else takes every requester off.
    let requests: Api<EvictionRequest> = Api::namespaced(client.clone(), NS);
    requests
        .patch(
            &pod.uid,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"requesters": []}})),
        )
        .await
        .unwrap();
    let back = until(
        &client,
        &pod,
        Duration::from_secs(5),
        "requester back",
        |r| !r.spec.requesters.is_empty(),
    )
    .await;
    assert_eq!(requester_names(&back), [OURS]);
    assert_eq!(complete_reason(&back), None, "not cancelled");

    // Once the maintenance withdraws, the request is let go.
    terminator.withdraw("m-a").await.unwrap();
    let done = until(&client, &pod, Duration::from_secs(5), "cancelled", |r| {
        complete_reason(r).is_some()
    })
    .await;
    assert_eq!(complete_reason(&done).as_deref(), Some("Cancelled"));
    assert!(done.spec.requesters.is_empty());
    stop.cancel();
}
