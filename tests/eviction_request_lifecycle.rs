//! nodegrace's `lifecycle.nodegrace.dev` CRDs (the in-tree 1.37 shapes) against the fake
//! apiserver: the daemon as their requester and as the eviction-request controller and
//! imperative evictor of its node's pods — responders in priority order, a responder that
//! completes hands over, the evictor evicts, DaemonSet pods stay the drain's — and bad input.

#[path = "engine_support/mod.rs"]
mod engine_support;

use std::sync::Arc;
use std::time::Duration;

use engine_support::{
    drain_a_reboot, eventually, refused_as_stale, request, start_drainer, Env, Kind, NODE,
};
use nodegrace::{Drainer, ShutdownKind};
use nodegrace_testkit::fake_apiserver::{Filter, RecordedRequest};
use nodegrace_testkit::fake_kubelet::KubeletConfig;
use serde_json::{json, Value};

const GROUP: &str = "lifecycle.nodegrace.dev";
const KEY: &str = "nodegrace.dev/node-a";
const EVICTOR: &str = "imperative-eviction.nodegrace.dev/evictor";
const OPERATOR: &str = "db.example.com/operator";

async fn env_with_our_crds() -> Env {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    env.install_lifecycle_crds();
    env
}

fn uid(env: &Env, pod: &str) -> String {
    env.cluster.store.get_obj("", "pods", "work", pod).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn annotate(env: &Env, pod: &str, key: &str, value: &str) {
    env.cluster
        .store
        .update_in_process("", "pods", "work", pod, |p| {
            p["metadata"]["annotations"] = json!({ key: value });
        })
        .unwrap();
}

/// `pod` declares [`OPERATOR`] its responder, by nodegrace's annotation.
fn declares_the_operator(env: &Env, pod: &str) {
    annotate(
        env,
        pod,
        "nodegrace.dev/eviction-responders",
        &json!([{"name": OPERATOR, "priority": 10000}]).to_string(),
    );
}

/// A reboot's drain (60 s budget) in the background, and its drainer, kept: its controller
/// goes on after the drain ends.
fn reboot_in_background(
    env: &Env,
) -> (
    Arc<nodegrace::NodeDrainer>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let drainer = Arc::new(start_drainer(env));
    let drain = {
        let drainer = drainer.clone();
        tokio::spawn(async move {
            drainer
                .drain(&request(ShutdownKind::Reboot, Duration::from_secs(60)))
                .await
        })
    };
    (drainer, drain)
}

/// The Eviction of the pod with `uid`, if the controller made one.
fn eviction_of(env: &Env, uid: &str) -> Option<Value> {
    let (all, _) = env.cluster.store.list(&Filter::all(GROUP, "evictions"));
    all.into_iter()
        .find(|e| e["spec"]["target"]["pod"]["uid"] == uid)
}

fn states(eviction: &Value) -> Vec<(String, i64, String)> {
    eviction["status"]["targetResponders"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_owned(),
                r["priority"].as_i64().unwrap_or(-1),
                r["state"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Acts as `responder` on the Eviction of `uid`: heartbeat, message, completion.
fn respond(env: &Env, uid: &str, responder: &str, complete: bool) {
    let e = eviction_of(env, uid).unwrap();
    let name = e["metadata"]["name"].as_str().unwrap().to_owned();
    let now = env.cluster.store.now_str();
    env.cluster
        .store
        .update_in_process(GROUP, "evictions", "work", &name, |e| {
            for r in e["status"]["responders"].as_array_mut().unwrap() {
                if r["name"] == responder {
                    r["heartbeatTime"] = json!(now);
                    r["message"] = json!("primary moved away");
                    if complete {
                        r["completionTime"] = json!(now);
                    }
                }
            }
        })
        .unwrap();
}

/// pg, whose budget allows no disruption, declaring the operator as its responder.
fn pg_behind_its_budget(env: &Env) -> String {
    env.pod("pg", Kind::Default, 0, 30, json!({"app": "pg"}));
    env.pdb("pg-pdb", "pg", 1);
    declares_the_operator(env, "pg");
    uid(env, "pg")
}

/// pg's operator, once active on its Eviction, is done: the evictor takes over.
async fn operator_done(env: &Env, pg: &str) {
    eventually(10, "pg's operator active", || {
        eviction_of(env, pg)
            .is_some_and(|e| states(&e).first().map(|s| s.2.as_str()) == Some("Active"))
    })
    .await;
    eventually(10, "pg's operator completed", || {
        respond(env, pg, OPERATOR, true);
        eviction_of(env, pg)
            .is_some_and(|e| states(&e).first().map(|s| s.2.as_str()) == Some("Completed"))
    })
    .await;
}

fn posted_requests(reqs: &[RecordedRequest]) -> Vec<Value> {
    reqs.iter()
        .filter(|r| {
            r.method == "POST"
                && r.path == format!("/apis/{GROUP}/v1alpha1/namespaces/work/evictionrequests")
        })
        .map(|r| r.body_json().unwrap())
        .collect()
}

#[tokio::test]
async fn a_pods_responder_goes_first_then_nodegraces_evictor_evicts() {
    responder_then_evictor(false).await;
}

/// resourceVersions are opaque: the controller's own writes stand in for the watch's copies
/// by the watch's order, never by comparing versions.
#[tokio::test]
async fn the_same_on_resource_versions_that_are_not_numbers() {
    responder_then_evictor(true).await;
}

async fn responder_then_evictor(opaque: bool) {
    let env = env_with_our_crds().await;
    if opaque {
        env.cluster.store.serve_opaque_resource_versions();
    }
    env.pod("db", Kind::Default, 0, 30, json!({"app": "db"}));
    env.pod("web", Kind::Default, 0, 30, json!({"app": "web"}));
    env.pod("ds", Kind::DaemonSet, 0, 30, json!({"app": "ds"}));
    declares_the_operator(&env, "db");
    let (db, web) = (uid(&env, "db"), uid(&env, "web"));
    let (_drainer, drain) = reboot_in_background(&env);

    // db's Eviction: its operator active first, nodegrace's evictor after it.
    eventually(20, "db's Eviction with its operator active", || {
        eviction_of(&env, &db)
            .is_some_and(|e| states(&e).first().map(|s| s.2.as_str()) == Some("Active"))
    })
    .await;
    let e = eviction_of(&env, &db).unwrap();
    assert_eq!(
        states(&e),
        [
            (OPERATOR.to_owned(), 10000, "Active".to_owned()),
            (EVICTOR.to_owned(), 100, "Inactive".to_owned()),
        ]
    );
    assert_eq!(e["metadata"]["labels"][KEY], "requester");
    assert_eq!(e["metadata"]["labels"]["nodegrace.dev/node"], NODE);
    // web, declaring nothing, is evicted at once; db is not while its operator works.
    eventually(20, "web evicted", || !env.pod_exists("web")).await;
    assert!(env.pod_exists("db"));
    assert!(!env.evictions().contains(&"db".to_owned()));

    respond(&env, &db, OPERATOR, true);
    tokio::time::timeout(Duration::from_secs(30), drain)
        .await
        .expect("the drain ends")
        .unwrap()
        .unwrap();
    assert!(!env.pod_exists("db") && !env.pod_exists("ds"));
    assert_eq!(
        {
            let mut e = env.evictions();
            e.sort();
            e
        },
        ["db", "web"]
    );
    assert_eq!(env.deletes(), ["ds"], "the DaemonSet pod stays the drain's");
    eventually(10, "both responders completed", || {
        eviction_of(&env, &db).is_some_and(|e| {
            states(&e).iter().map(|s| s.2.as_str()).collect::<Vec<_>>()
                == ["Completed", "Completed"]
        })
    })
    .await;
    let e = eviction_of(&env, &db).unwrap();
    let conditions = e["status"]["conditions"].as_array().unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "TargetEvicted" && c["status"] == "True"),
        "{conditions:?}"
    );
    let sent = posted_requests(&env.requests());
    let targets: Vec<&str> = sent
        .iter()
        .map(|r| {
            assert_eq!(r["spec"]["requester"], KEY);
            assert_eq!(r["spec"]["intent"], "Eviction");
            r["spec"]["target"]["pod"]["uid"].as_str().unwrap()
        })
        .collect();
    // web declares no responder: evicted through the Eviction API directly, no objects.
    assert_eq!(targets, [db.as_str()]);
    assert!(eviction_of(&env, &web).is_none());
    let refused = refused_as_stale(&env, "evictions");
    assert!(refused.is_empty(), "written on a stale copy: {refused:?}");
    // Env's teardown checks every request against the shipped ClusterRole.
}

#[tokio::test]
async fn a_budget_refusing_the_evictor_names_it_and_the_pod_is_escalated_at_the_deadline() {
    let env = env_with_our_crds().await;
    let pg = pg_behind_its_budget(&env);
    // Every eviction is answered late, so that one is on its way when the drain escalates.
    env.cluster
        .api
        .delay(Some("POST"), "*/eviction", Duration::from_millis(900));
    let drainer = start_drainer(&env);
    // The operator is done at once: the evictor takes over.
    let done = async {
        operator_done(&env, &pg).await;
    };
    let poweroff = request(ShutdownKind::Poweroff, Duration::from_secs(4));
    let (drained, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(30), drainer.drain(&poweroff)),
        done
    );
    drained.expect("the drain ends").unwrap();
    assert!(!env.pod_exists("pg"));
    // The evictor asked (refused by the budget, again after its short shutdown back-off),
    // then the drain's escalation deleted it: cooperative first, as on every path.
    assert!(!env.evictions().is_empty());
    assert_eq!(env.deletes(), ["pg"]);
    // What blocked it, told in events (first its operator; an event series keeps its first
    // note) and in the evictor's entry.
    assert!(!env.events("EvictionBlocked").is_empty());
    assert!(
        env.requests()
            .iter()
            .any(|r| r.method == "PATCH" && String::from_utf8_lossy(&r.body).contains("pg-pdb")),
        "the budget is named in the evictor's entry"
    );
    // The evictor's refusals were written to its entry, counted, then its completion.
    let pg_eviction = eviction_of(&env, &pg).unwrap();
    let status_path = format!(
        "/apis/{GROUP}/v1alpha1/namespaces/work/evictions/{}/status",
        pg_eviction["metadata"]["name"].as_str().unwrap()
    );
    let refusals = env
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == status_path)
        .filter(|r| String::from_utf8_lossy(&r.body).contains("(attempts="))
        .count();
    assert!(refusals >= 1, "no refusal written to the evictor's entry");
    // Once deleted by the drain the pod's budget no longer guards it: the evictor, which
    // would now be let through, stopped asking, and the DELETE waited for the eviction on
    // its way (whose answer comes in after the drain returned).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let evicted_after = env
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == status_path)
        .any(|r| String::from_utf8_lossy(&r.body).contains("was evicted through the Eviction API"));
    assert!(
        !evicted_after,
        "the evictor evicted the pod the drain had deleted"
    );
    assert_eq!(
        states(&pg_eviction)
            .iter()
            .map(|s| s.0.as_str())
            .collect::<Vec<_>>(),
        [OPERATOR, EVICTOR]
    );
}

/// nodegrace's own evictor counts each eviction a budget refuses where it sends it; the
/// requester, which reads the same refusals back from the Eviction, does not count them again.
#[tokio::test]
async fn each_refusal_of_nodegraces_evictor_is_counted_once() {
    let env = env_with_our_crds().await;
    let pg = pg_behind_its_budget(&env);
    env.admin_maintenance("upgrade", "Drain", json!([]));
    let _drainer = start_drainer(&env);
    operator_done(&env, &pg).await;
    // Every eviction of pg is refused by its budget: as many refusals as evictions sent.
    eventually(15, "two refusals, each counted", || {
        let sent = env.evictions().len() as u64;
        sent >= 2 && env.refused("budget") == sent
    })
    .await;
    assert!(env.pod_exists("pg"));
    assert_eq!(env.refused("error") + env.refused("throttled"), 0);
}

#[tokio::test]
async fn an_invalid_declaration_is_told_and_skipped_and_an_old_uids_request_evicts_nothing() {
    let env = env_with_our_crds().await;
    env.pod("api", Kind::Default, 0, 30, json!({"app": "api"}));
    annotate(
        &env,
        "api",
        "nodegrace.dev/eviction-responders",
        r#"[{"name":"no-slash","priority":10000}]"#,
    );
    env.pod("cache", Kind::Default, 0, 30, json!({"app": "cache"}));
    let api = uid(&env, "api");
    // Another requester's request for a pod named "cache" with another, older UID.
    let old_uid = "0ld00000-0000-4000-8000-000000000000";
    env.cluster
        .insert(&json!({
            "apiVersion": "lifecycle.nodegrace.dev/v1alpha1", "kind": "EvictionRequest",
            "metadata": {"name": "stale", "namespace": "work"},
            "spec": {"intent": "Eviction", "requester": "descheduler.example.com/d",
                     "target": {"pod": {"name": "cache", "uid": old_uid}}},
        }))
        .unwrap();
    let drainer = start_drainer(&env);
    // The stale request evicts nothing, even with the controller running for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(env.pod_exists("cache"));
    assert!(env.evictions().is_empty(), "{:?}", env.evictions());

    // A drain of api: its invalid responder is told and skipped; the evictor evicts it.
    drain_a_reboot(&drainer).await;
    assert!(!env.pod_exists("api"));
    assert!(env
        .events("EvictionResponderInvalid")
        .iter()
        .any(|e| e["note"].as_str().unwrap_or_default().contains("no-slash")));
    eventually(10, "only nodegrace's evictor, completed", || {
        eviction_of(&env, &api)
            .is_some_and(|e| states(&e) == [(EVICTOR.to_owned(), 100, "Completed".to_owned())])
    })
    .await;
    // cache left once, for the drain's own request; the old UID's request acted on nothing.
    let cache_evictions = env.evictions().iter().filter(|p| *p == "cache").count();
    assert_eq!(cache_evictions, 1);
}

/// A pod of a PodGroup that declares a responder: nodegrace's controller refuses its request
/// (`EvictionInvalid`, as the in-tree controller does) and makes no Eviction, and the requester
/// evicts the pod through the Eviction API. The controller reads the pod from the engine's
/// slimmed cache, which must keep `spec.schedulingGroup`.
#[tokio::test]
async fn a_pod_of_a_pod_group_is_refused_by_nodegraces_controller_and_evicted_directly() {
    let env = env_with_our_crds().await;
    env.pod("gang", Kind::Default, 0, 30, json!({"app": "gang"}));
    env.cluster
        .store
        .update_in_process("", "pods", "work", "gang", |p| {
            p["spec"]["schedulingGroup"] = json!({"podGroupName": "g"});
            p["metadata"]["annotations"] = json!({
                "nodegrace.dev/eviction-responders":
                    format!(r#"[{{"name":"{OPERATOR}","priority":10000}}]"#)
            });
        })
        .unwrap();
    let gang = uid(&env, "gang");
    let drainer = start_drainer(&env);
    drain_a_reboot(&drainer).await;
    assert!(!env.pod_exists("gang"));
    let (requests, _) = env
        .cluster
        .store
        .list(&Filter::all(GROUP, "evictionrequests"));
    let refused = requests.iter().any(|r| {
        r["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "Failed" && c["status"] == "True" && c["reason"] == "EvictionInvalid"
            })
    });
    assert!(refused, "the request was not refused: {requests:?}");
    assert!(eviction_of(&env, &gang).is_none(), "an Eviction was made");
    assert_eq!(
        env.evictions(),
        ["gang"],
        "evicted through the Eviction API"
    );
    assert!(env.deletes().is_empty(), "long before any escalation");
}

/// A pod that terminated while being deleted is leaving, its request and Eviction collected
/// with it moments later: the final writes about it wait, as for a pod gone (the kubelet's
/// terminal status comes a moment before its final DELETE).
#[tokio::test]
async fn the_final_writes_about_a_pod_terminated_while_being_deleted_wait() {
    let env = env_with_our_crds().await;
    env.pod("db", Kind::Default, 0, 30, json!({"app": "db"}));
    declares_the_operator(&env, "db");
    // Held by a finalizer: it stays, terminated and being deleted.
    env.cluster
        .store
        .update_in_process("", "pods", "work", "db", |p| {
            p["metadata"]["finalizers"] = json!(["example.com/hold"]);
        })
        .unwrap();
    let db = uid(&env, "db");
    let (_drainer, drain) = reboot_in_background(&env);
    operator_done(&env, &db).await;
    eventually(20, "db terminated", || {
        env.cluster
            .store
            .get_obj("", "pods", "work", "db")
            .is_some_and(|p| p["status"]["phase"] == "Succeeded")
    })
    .await;
    let terminated = std::time::Instant::now();
    eventually(15, "the evictor's completion written", || {
        eviction_of(&env, &db).is_some_and(|e| {
            states(&e).iter().map(|s| s.2.as_str()).collect::<Vec<_>>()
                == ["Completed", "Completed"]
        })
    })
    .await;
    assert!(
        terminated.elapsed() >= Duration::from_secs(4),
        "written {:?} after the pod terminated",
        terminated.elapsed()
    );
    tokio::time::timeout(Duration::from_secs(30), drain)
        .await
        .expect("the drain ends")
        .unwrap()
        .unwrap();
}
