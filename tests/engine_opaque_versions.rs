//! resourceVersions are opaque (API conventions: only equality means anything): the engine
//! against a fake apiserver that serves versions that are no numbers and whose text runs
//! backwards, against a watch that sends an event of a type no apiserver sends, and against
//! objects the apiserver accepts but k8s-openapi's types cannot hold.

mod engine_support;

use std::time::Duration;

use engine_support::*;
use nodegrace::{shutdown_maintenance_name, ShutdownKind};
use serde_json::{json, Value};

/// A pod an OpenKruise Advanced DaemonSet controls.
fn kruise_daemonset_pod(env: &Env, name: &str) {
    env.cluster
        .insert(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "work", "ownerReferences": [{
                "apiVersion": "apps.kruise.io/v1alpha1", "kind": "DaemonSet", "name": "agent",
                "uid": "kruise-ds-uid", "controller": true}]},
            "spec": {
                "nodeName": NODE, "priority": 0, "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            },
            "status": nodegrace_testkit::fake_apiserver::running_status(&env.cluster.store.now_str()),
        }))
        .unwrap();
}

#[tokio::test]
async fn a_drain_on_versions_that_are_not_numbers_goes_in_plan_order_and_never_writes_on_a_stale_copy(
) {
    let env = Env::new(kubelet(150)).await;
    env.cluster.store.serve_opaque_resource_versions();
    env.pod("low", Kind::Default, 0, 30, json!({}));
    env.pod("crit", Kind::Default, 2_000_001_000, 30, json!({}));
    env.pod("ds", Kind::DaemonSet, 2_000_001_000, 30, json!({}));
    kruise_daemonset_pod(&env, "kruise-agent");
    let mirror = env.pod("etcd", Kind::Static, 2_000_001_000, 30, json!({}));
    let rv = env.node()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(rv.parse::<u64>().is_err(), "the fake serves {rv}");
    let engine = env.engine(env.settings());

    drain_timed(&engine, ShutdownKind::Reboot, Duration::from_secs(60)).await;

    for p in ["low", "crit", "ds", "kruise-agent", mirror.as_str()] {
        assert!(!env.pod_exists(p), "{p} still exists");
    }
    assert_eq!(env.evictions(), ["low", "crit"], "Default pods by priority");
    let mut deleted = env.deletes();
    deleted.sort();
    assert_eq!(
        deleted,
        ["ds", "kruise-agent"],
        "both DaemonSets' pods deleted in their band, not evicted"
    );
    assert_eq!(env.gate.gated_files(), ["etcd.yaml"]);
    let m = env.maintenance(&shutdown_maintenance_name(NODE)).unwrap();
    let entry = m.node_status(NODE).unwrap();
    assert_eq!(entry.pods_remaining, 0);
    assert_eq!(entry.drain_message, "Drained");
    assert_eq!(m.drained(), Some("True"));
    assert_eq!(env.node()["spec"]["unschedulable"], true);
    // The maintenance's aggregate status is written with the version it was decided on: a
    // decision on a copy older than the engine's own last write would be refused.
    let refused = refused_as_stale(&env, "nodemaintenances");
    assert!(refused.is_empty(), "refused as stale: {refused:?}");
    let aggregate_writes: Vec<String> = env
        .requests()
        .iter()
        .filter(|r| {
            r.method == "PATCH"
                && r.path
                    .ends_with(&format!("{}/status", shutdown_maintenance_name(NODE)))
                && r.param("fieldManager").as_deref() == Some("nodegrace")
        })
        .map(|r| r.body_json().unwrap()["metadata"]["resourceVersion"].to_string())
        .collect();
    let mut once = aggregate_writes.clone();
    once.dedup();
    assert_eq!(once, aggregate_writes, "no write repeated on the same copy");
}

/// The node as stored, without its resourceVersion.
fn unversioned(mut object: Value) -> Value {
    if let Some(m) = object["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    object
}

#[tokio::test]
async fn a_watch_event_of_an_unknown_type_or_without_a_version_is_told_and_the_drain_goes_on() {
    logs();
    let env = Env::new(kubelet(150)).await;
    env.cluster.store.serve_opaque_resource_versions();
    env.pod("odd-low", Kind::Default, 0, 30, json!({}));
    env.pod("odd-ds", Kind::DaemonSet, 0, 30, json!({}));
    let engine = env.engine(env.settings());
    eventually(10, "the engine's view of the pods", || {
        engine.pods().len() == 2
    })
    .await;
    let pod = env
        .cluster
        .store
        .get_obj("", "pods", "work", "odd-low")
        .unwrap();
    env.cluster
        .api
        .inject_watch_event("pods", json!({"type": "RENAMED", "object": pod.clone()}));
    env.cluster.api.inject_watch_event(
        "nodes",
        json!({"type": "MODIFIED", "object": unversioned(env.node())}),
    );

    drain_timed(&engine, ShutdownKind::Poweroff, Duration::from_secs(60)).await;

    assert!(!env.pod_exists("odd-low") && !env.pod_exists("odd-ds"));
    assert_eq!(env.evictions(), ["odd-low"]);
    assert_eq!(env.deletes(), ["odd-ds"]);
    let told = log_lines("Pod: the watch sent an event nodegrace cannot read");
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("WARN"), "{told:?}");
    let told = log_lines("Node: the watch sent an object without a resourceVersion");
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("WARN"), "{told:?}");
}

#[tokio::test]
async fn a_pod_that_cannot_be_decoded_is_set_aside_and_the_watch_and_the_drain_go_on() {
    logs();
    let env = Env::new(kubelet(150)).await;
    env.pod("plain", Kind::Default, 0, 30, json!({}));
    // A date the apiserver accepts, one day past where k8s-openapi's timestamps end.
    let far = "9999-12-31T23:59:59.000000Z";
    env.cluster
        .insert(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "far-future", "namespace": "work"},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "pause"}]},
            "status": {"phase": "Running", "startTime": far},
        }))
        .unwrap();
    let engine = env.engine(env.settings());
    eventually(10, "the engine's view of the decodable pod", || {
        engine.pods().len() == 1
    })
    .await;
    // A change the types cannot hold either: the view keeps the pod as it last decoded it.
    let mut plain = env
        .cluster
        .store
        .get_obj("", "pods", "work", "plain")
        .unwrap();
    plain["status"]["startTime"] = json!(far);
    env.cluster
        .api
        .inject_watch_event("pods", json!({"type": "MODIFIED", "object": plain}));

    drain_timed(&engine, ShutdownKind::Poweroff, Duration::from_secs(60)).await;

    assert!(!env.pod_exists("plain"));
    assert_eq!(env.evictions(), ["plain"]);
    let told = log_lines("cannot be decoded");
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(
        told[0].contains("ERROR")
            && told[0].contains("kind=Pod")
            && told[0].contains("namespace=work"),
        "{told:?}"
    );
    assert!(
        told.iter().any(|l| l.contains("name=far-future")),
        "{told:?}"
    );
    assert!(told.iter().any(|l| l.contains("name=plain")), "{told:?}");
}
