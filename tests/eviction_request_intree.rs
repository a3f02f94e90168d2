//! The in-tree EvictionRequest API of Kubernetes 1.37 (`lifecycle.k8s.io/v1alpha1`), against
//! the fake apiserver with the in-tree controllers' documented behaviour
//! (`testkit::fake_lifecycle`): the daemon as a requester of it, the path it picks, withdrawal,
//! the deadline escalation, and bad input. No 1.37 control plane can be built here: these are
//! the only tests of that path.

#[path = "engine_support/mod.rs"]
mod engine_support;

use std::sync::Arc;
use std::time::Duration;

use engine_support::{
    drain_a_reboot, eventually, log_lines, logs, request, start_drainer, Env, Kind, NODE,
};
use nodegrace::{NodeDrainer, ShutdownKind};
use nodegrace_testkit::fake_apiserver::RecordedRequest;
use nodegrace_testkit::fake_kubelet::KubeletConfig;
use nodegrace_testkit::fake_lifecycle::FakeEvictionControllers;
use serde_json::{json, Value};

const KEY: &str = "nodegrace.dev/node-a";
const REQUESTS: &str = "/apis/lifecycle.k8s.io/v1alpha1/namespaces/work/evictionrequests";

fn start(env: &Env) -> NodeDrainer {
    logs();
    start_drainer(env)
}

fn uid(env: &Env, pod: &str) -> String {
    env.cluster.store.get_obj("", "pods", "work", pod).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `pod` declares `responder` (`spec.evictionResponders`): only such a pod is asked for
/// through an EvictionRequest; the others go straight to the Eviction API.
fn declare(env: &Env, pod: &str, responder: &str) {
    env.cluster
        .store
        .update_in_process("", "pods", "work", pod, |p| {
            p["spec"]["evictionResponders"] = json!([{"name": responder, "priority": 10000}])
        })
        .unwrap();
}

/// The EvictionRequests POSTed to the in-tree API.
fn posted(reqs: &[RecordedRequest]) -> Vec<Value> {
    reqs.iter()
        .filter(|r| r.method == "POST" && r.path == REQUESTS)
        .map(|r| r.body_json().unwrap())
        .collect()
}

#[tokio::test]
async fn where_the_in_tree_api_is_served_pods_with_responders_leave_through_it() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let controllers = Arc::new(FakeEvictionControllers::start(env.cluster.store.clone()));
    env.pod("web", Kind::Default, 0, 30, json!({"app": "web"}));
    env.pod("kv", Kind::Default, 0, 30, json!({"app": "kv"}));
    env.pod("ds", Kind::DaemonSet, 0, 30, json!({"app": "ds"}));
    declare(&env, "kv", "kv.example.com/operator");
    let kv = uid(&env, "kv");
    let drainer = start(&env);
    let operator = {
        let controllers = controllers.clone();
        let kv = kv.clone();
        tokio::spawn(async move {
            while !controllers.respond("work", &kv, "kv.example.com/operator", "done", true) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    drain_a_reboot(&drainer).await;
    operator.await.unwrap();

    assert!(!env.pod_exists("web") && !env.pod_exists("kv") && !env.pod_exists("ds"));
    let reqs = env.requests();
    let sent = posted(&reqs);
    assert_eq!(sent.len(), 1, "one request, for kv only: {sent:?}");
    let r = &sent[0];
    assert_eq!(r["metadata"]["name"], format!("nodegrace-{kv}"));
    assert_eq!(r["spec"]["requester"], KEY);
    assert_eq!(r["spec"]["intent"], "Eviction");
    assert_eq!(r["spec"]["target"]["pod"], json!({"name": "kv", "uid": kv}));
    // The in-tree imperative evictor evicted kv after its responder; nodegrace evicted web.
    assert_eq!(controllers.evicted(), ["work/kv"]);
    assert_eq!(env.evictions(), ["web"]);
    // The DaemonSet pod stayed nodegrace's: deleted by it, never requested.
    assert_eq!(env.deletes(), ["ds"]);
    // Counted by the way each went: kv through its request, web evicted directly.
    let metrics = env.metrics.render().unwrap();
    // And by the band each went in, named as the band's duration is (the default plan: the
    // Default pods first, then the DaemonSet pods).
    const DEFAULT: &str = "Default<=1000000000";
    const DAEMONSETS: &str = "Default<=2147483647, DaemonSet<=1000000000";
    for line in [
        format!(
            "nodegrace_pods_terminated_total{{method=\"eviction_request\",band=\"{DEFAULT}\"}} 1"
        ),
        format!("nodegrace_pods_terminated_total{{method=\"eviction\",band=\"{DEFAULT}\"}} 1"),
        format!("nodegrace_pods_terminated_total{{method=\"delete\",band=\"{DAEMONSETS}\"}} 1"),
        format!("nodegrace_band_duration_seconds{{band=\"{DEFAULT}\"}} "),
        format!("nodegrace_band_duration_seconds{{band=\"{DAEMONSETS}\"}} "),
    ] {
        assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
    let eviction = controllers.eviction_of("work", &kv).unwrap();
    assert_eq!(eviction["metadata"]["labels"][KEY], "requester");
    // Env's teardown checks every request against the shipped ClusterRole.
}

/// An administrator's maintenance drains db, whose budget allows no disruption; its operator
/// is done at once, leaving db to the in-tree evictor, which the budget refuses.
async fn db_left_to_the_evictor(env: &Env) -> (FakeEvictionControllers, String, NodeDrainer) {
    let controllers = FakeEvictionControllers::start(env.cluster.store.clone());
    env.pod("db", Kind::Default, 0, 30, json!({"app": "db"}));
    env.pdb("db-pdb", "db", 1);
    declare(env, "db", "db.example.com/operator");
    let db = uid(env, "db");
    env.admin_maintenance("upgrade", "Drain", json!([]));
    let drainer = start(env);
    eventually(15, "the operator done with db", || {
        controllers.respond("work", &db, "db.example.com/operator", "done", true)
    })
    .await;
    (controllers, db, drainer)
}

#[tokio::test]
async fn a_cancelled_maintenance_withdraws_and_the_eviction_is_cancelled() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let (controllers, db, _drainer) = db_left_to_the_evictor(&env).await;
    eventually(15, "the imperative evictor refused by the budget", || {
        controllers
            .eviction_of("work", &db)
            .is_some_and(|e| e.to_string().contains("number of retries"))
    })
    .await;
    eventually(15, "the blocker named in the node's entry", || {
        env.maintenance("upgrade")
            .and_then(|m| m.node_status(NODE).map(|e| e.drain_message.clone()))
            .is_some_and(|msg| msg.contains("disruption budget"))
    })
    .await;
    // The admin ends the maintenance.
    env.cluster
        .store
        .update_in_process("nodegrace.dev", "nodemaintenances", "", "upgrade", |m| {
            m["spec"]["stage"] = json!("Complete")
        })
        .unwrap();
    eventually(15, "intent Withdrawn sent", || {
        env.requests().iter().any(|r| {
            r.method == "PATCH"
                && r.path == format!("{REQUESTS}/nodegrace-{db}")
                && r.body_json()
                    .is_some_and(|b| b["spec"]["intent"] == "Withdrawn")
        })
    })
    .await;
    eventually(15, "the Eviction cancelled for want of requesters", || {
        controllers.eviction_of("work", &db).is_some_and(|e| {
            e["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| {
                    c["type"] == "Failed"
                        && c["status"] == "True"
                        && c["reason"] == "CanceledDueToNoRequesters"
                })
        })
    })
    .await;
    assert!(env.pod_exists("db"));
    assert!(
        env.deletes().is_empty(),
        "an admin maintenance never escalates"
    );
}

#[tokio::test]
async fn a_blocked_pod_is_escalated_at_the_deadline_as_on_every_path() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let controllers = FakeEvictionControllers::start(env.cluster.store.clone());
    env.pod("pg", Kind::Default, 0, 30, json!({"app": "pg"}));
    env.pdb("pg-pdb", "pg", 1);
    let drainer = start(&env);
    let started = std::time::Instant::now();
    tokio::time::timeout(
        Duration::from_secs(30),
        nodegrace_testkit::drain_through(
            &drainer,
            &request(ShutdownKind::Poweroff, Duration::from_secs(4)),
            true,
        ),
    )
    .await
    .expect("the drain ends")
    .unwrap();
    let took = started.elapsed();
    assert!(!env.pod_exists("pg"));
    // No responder: the Eviction API directly, refused by the budget until the deadline.
    assert!(posted(&env.requests()).is_empty());
    assert!(controllers.evicted().is_empty());
    assert!(env.evictions().iter().all(|p| p == "pg") && !env.evictions().is_empty());
    // Cooperative until half the budget, then DELETE with what is left, as on the other paths.
    assert_eq!(env.deletes(), ["pg"]);
    let delete = env
        .requests()
        .into_iter()
        .find(|r| r.method == "DELETE" && r.path.ends_with("/pods/pg"))
        .unwrap();
    let grace = delete.body_json().unwrap()["gracePeriodSeconds"]
        .as_i64()
        .unwrap();
    assert!(
        (1..=2).contains(&grace),
        "grace bounded by what is left: {grace}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(!env.events("Escalated").is_empty());
    assert!(env
        .events("EvictionBlocked")
        .iter()
        .any(|e| e["note"].as_str().unwrap().contains("pg-pdb")));
}

#[tokio::test]
async fn an_eviction_naming_another_pods_uid_evicts_nothing_and_is_logged() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let controllers = FakeEvictionControllers::start(env.cluster.store.clone());
    env.pod("cache", Kind::Default, 0, 30, json!({"app": "cache"}));
    env.pdb("cache-pdb", "cache", 1);
    declare(&env, "cache", "cache.example.com/operator");
    let cache = uid(&env, "cache");
    env.admin_maintenance("rotate", "Drain", json!([]));
    let _drainer = start(&env);
    eventually(15, "the request for cache", || {
        controllers.eviction_of("work", &cache).is_some()
    })
    .await;
    // Someone writes an Eviction about "cache" that names another UID, labelled with our key
    // and already failed: acting on it would evict a pod nobody asked about.
    env.cluster
        .insert(&json!({
            "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "Eviction",
            "metadata": {"name": "cache-rogue", "namespace": "work", "labels": {KEY: "requester"},
                "ownerReferences": [{"apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "EvictionRequest",
                    "name": format!("nodegrace-{cache}"), "uid": "x"}]},
            "spec": {"target": {"pod": {"name": "cache", "uid": "0000-other"}}},
            "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "NoFurtherResponder",
                "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]},
        }))
        .unwrap();
    eventually(15, "a log line naming the other UID", || {
        log_lines("0000-other")
            .iter()
            .any(|l| l.contains("names another pod's UID"))
    })
    .await;
    eventually(
        15,
        "a Warning event on the pod naming the other UID",
        || !env.events("EvictionTargetMismatch").is_empty(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        env.evictions().is_empty(),
        "nodegrace evicted nothing: {:?}",
        env.evictions()
    );
    assert!(env.pod_exists("cache"));
    let events = env.events("EvictionTargetMismatch");
    assert_eq!(events.len(), 1, "once: {events:?}");
    let e = &events[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["regarding"]["kind"], "Pod");
    assert_eq!(e["regarding"]["name"], "cache");
    assert_eq!(e["regarding"]["uid"], cache.as_str());
    assert_eq!(e["metadata"]["namespace"], "work");
    let note = e["note"].as_str().unwrap();
    assert!(
        note.contains("0000-other") && note.contains("cache-rogue"),
        "{note}"
    );
    assert_eq!(e["reportingController"], "nodegrace");
}

#[tokio::test]
async fn bad_responder_declarations_are_logged() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let _controllers = FakeEvictionControllers::start(env.cluster.store.clone());
    env.pod("many", Kind::Default, 0, 30, json!({"app": "many"}));
    env.pod("badname", Kind::Default, 0, 30, json!({"app": "badname"}));
    env.pod("twice", Kind::Default, 0, 30, json!({"app": "twice"}));
    let set = |pod: &str, responders: Value| {
        env.cluster
            .store
            .update_in_process("", "pods", "work", pod, |p| {
                p["spec"]["evictionResponders"] = responders;
            })
            .unwrap();
    };
    let eleven: Vec<Value> = (0..11)
        .map(|i| json!({"name": format!("r{i}.example.com/x"), "priority": 5000}))
        .collect();
    set("many", json!(eleven));
    set("badname", json!([{"name": "no-domain", "priority": 5000}]));
    set(
        "twice",
        json!([
            {"name": "db.example.com/operator", "priority": 10000},
            {"name": "db.example.com/operator", "priority": 20000}
        ]),
    );
    let drainer = start(&env);
    // Responders that never answer hold their pods until the escalation: a short budget.
    tokio::time::timeout(
        Duration::from_secs(30),
        nodegrace_testkit::drain_through(
            &drainer,
            &request(ShutdownKind::Reboot, Duration::from_secs(4)),
            true,
        ),
    )
    .await
    .expect("the drain ends")
    .unwrap();
    let find = |pod: &str, what: &str| {
        log_lines(&format!("work/{pod}"))
            .iter()
            .any(|l| l.contains("eviction responders") && l.contains(what))
    };
    assert!(find("many", "11 responders declared"));
    assert!(find("badname", "no domain prefix"));
    assert!(find("twice", "declared twice"));
    // The same problems as Warning events on the pods, once per pod and problem.
    eventually(15, "the events written", || {
        env.events("EvictionResponderInvalid").len() >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events = env.events("EvictionResponderInvalid");
    let on = |pod: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["regarding"]["kind"] == "Pod" && e["regarding"]["name"] == pod)
            .map(|e| {
                assert_eq!(e["type"], "Warning");
                assert_eq!(e["metadata"]["namespace"], "work");
                e["note"].as_str().unwrap().to_owned()
            })
            .collect()
    };
    let many = on("many");
    assert_eq!(many.len(), 1, "{many:?}");
    assert!(many[0].contains("11 responders declared"), "{many:?}");
    let badname = on("badname");
    assert!(
        badname.iter().any(|n| n.contains("no domain prefix")),
        "{badname:?}"
    );
    let twice = on("twice");
    assert_eq!(twice.len(), 1, "{twice:?}");
    assert!(twice[0].contains("declared twice"), "{twice:?}");
}

#[tokio::test]
async fn a_responders_progress_is_shown_and_its_completion_hands_over_to_the_evictor() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let controllers = FakeEvictionControllers::start(env.cluster.store.clone());
    env.pod("kv", Kind::Default, 0, 30, json!({"app": "kv"}));
    env.cluster
        .store
        .update_in_process("", "pods", "work", "kv", |p| {
            p["spec"]["evictionResponders"] =
                json!([{"name": "kv.example.com/operator", "priority": 10000}])
        })
        .unwrap();
    let kv = uid(&env, "kv");
    env.admin_maintenance("move", "Drain", json!([]));
    let _drainer = start(&env);
    eventually(15, "the operator active on kv's Eviction", || {
        controllers.respond(
            "work",
            &kv,
            "kv.example.com/operator",
            "moving shard 3 of 8",
            false,
        )
    })
    .await;
    eventually(15, "the operator's word in the node's entry", || {
        env.maintenance("move")
            .and_then(|m| m.node_status(NODE).map(|e| e.drain_message.clone()))
            .is_some_and(|msg| {
                msg.contains("responder kv.example.com/operator: moving shard 3 of 8")
            })
    })
    .await;
    assert!(
        env.pod_exists("kv"),
        "nothing evicted while the operator works"
    );
    assert!(controllers.respond("work", &kv, "kv.example.com/operator", "shards moved", true));
    eventually(15, "kv evicted by the in-tree evictor", || {
        !env.pod_exists("kv")
    })
    .await;
    assert_eq!(controllers.evicted(), ["work/kv"]);
    assert!(
        env.evictions().is_empty(),
        "nodegrace evicted nothing itself"
    );
}

#[test]
fn the_shipped_cluster_role_grants_what_the_in_tree_path_checks_for() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/rbac/clusterrole.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let role: Value = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .find(|d: &Value| d["kind"] == "ClusterRole")
        .unwrap();
    let has = |list: &Value, item: &str| list.as_array().unwrap().iter().any(|v| v == item);
    for p in nodegrace::required_in_tree() {
        let granted = role["rules"].as_array().unwrap().iter().any(|r| {
            has(&r["apiGroups"], p.group)
                && has(&r["resources"], p.resource)
                && has(&r["verbs"], p.verb)
        });
        assert!(granted, "{p}");
    }
}

/// gang, a pod of a PodGroup declaring a responder: the in-tree API refuses its request
/// (EvictionInvalid) and makes no Eviction. Its UID.
fn gang_pod(env: &Env) -> String {
    env.pod("gang", Kind::Default, 0, 30, json!({"app": "gang"}));
    env.cluster
        .store
        .update_in_process("", "pods", "work", "gang", |p| {
            p["spec"]["schedulingGroup"] = json!({"podGroupName": "g"})
        })
        .unwrap();
    declare(env, "gang", "gang.example.com/operator");
    uid(env, "gang")
}

#[tokio::test]
async fn a_request_the_in_tree_controller_refuses_is_evicted_directly() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let controllers = FakeEvictionControllers::start(env.cluster.store.clone());
    let gang = gang_pod(&env);
    let drainer = start(&env);
    drain_a_reboot(&drainer).await;
    assert!(!env.pod_exists("gang"));
    assert_eq!(posted(&env.requests()).len(), 1);
    assert!(
        controllers.eviction_of("work", &gang).is_none(),
        "no Eviction was made"
    );
    assert_eq!(
        env.evictions(),
        ["gang"],
        "nodegrace evicted it through the Eviction API"
    );
    assert!(env.deletes().is_empty(), "long before any escalation");
}

/// The in-tree evictor's attempts, as its message in the pod's Eviction counts them.
fn retries(controllers: &FakeEvictionControllers, uid: &str) -> u64 {
    let text = controllers
        .eviction_of("work", uid)
        .unwrap_or_default()
        .to_string();
    text.split_once("number of retries: ").map_or(0, |(_, n)| {
        n.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    })
}

/// The in-tree evictor's refusals are nodegrace's to count though it did not send them:
/// each attempt once, by the budget that refused it.
#[tokio::test]
async fn each_refusal_of_the_in_tree_evictor_is_counted_once_by_its_reason() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let (controllers, db, _drainer) = db_left_to_the_evictor(&env).await;
    eventually(15, "two refusals, each counted", || {
        let tried = retries(&controllers, &db);
        tried >= 2 && env.refused("budget") == tried
    })
    .await;
    assert!(
        env.evictions().is_empty(),
        "nodegrace evicted nothing itself"
    );
    assert_eq!(env.refused("error") + env.refused("throttled"), 0);
}

/// Where the in-tree controller gives up and nodegrace evicts the pod itself, the budget's
/// refusal of that eviction is counted once.
#[tokio::test]
async fn a_direct_eviction_after_the_in_tree_api_refused_is_counted_when_a_budget_refuses_it() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let _controllers = FakeEvictionControllers::start(env.cluster.store.clone());
    gang_pod(&env);
    env.pdb("gang-pdb", "gang", 1);
    env.admin_maintenance("upgrade", "Drain", json!([]));
    let _drainer = start(&env);
    eventually(15, "the direct eviction refused and counted", || {
        env.evictions() == ["gang"] && env.refused("budget") == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(env.evictions(), ["gang"]);
    assert_eq!(env.refused("budget"), 1, "counted once");
    assert!(env.pod_exists("gang"));
}
