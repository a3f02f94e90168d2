//! The fake apiserver and fake kubelet, exercised through kube clients the way nodegrace
//! talks to a real cluster.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::{Eviction, PodDisruptionBudget};
use kube::api::{
    Api, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams, PostParams,
    Preconditions, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use kube::ResourceExt;
use nodegrace_testkit::fake_apiserver::FakeCluster;
use nodegrace_testkit::fake_kubelet::KubeletConfig;
use serde_json::{json, Value};

fn api_err(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn pod(name: &str, node: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
    }))
    .unwrap()
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

/// A NodeMaintenance-shaped CRD: cluster-scoped, status subresource, `status.nodeStatuses`
/// a map-list keyed by `nodeName`.
fn maintenance_crd() -> Value {
    json!({
        "metadata": {"name": "nodemaintenances.nodegrace.dev"},
        "spec": {
            "group": "nodegrace.dev", "scope": "Cluster",
            "names": {"plural": "nodemaintenances", "singular": "nodemaintenance", "kind": "NodeMaintenance", "shortNames": ["nm"]},
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "stage": {"type": "string", "default": "Idle", "enum": ["Idle", "Cordon", "Drain", "Complete"]},
                        "reason": {"type": "string"}}},
                    "status": {"type": "object", "properties": {
                        "nodeStatuses": {"type": "array", "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["nodeName"],
                            "items": {"type": "object", "required": ["nodeName"], "properties": {
                                "nodeName": {"type": "string"},
                                "drainTargets": {"type": "integer"},
                                "drainMessage": {"type": "string"}}}}}}}}},
            }],
        },
    })
}

fn maintenance_api(client: kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nodegrace.dev", "v1alpha1", "NodeMaintenance");
    Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&gvk, "nodemaintenances"),
    )
}

#[tokio::test]
async fn create_get_list_with_selectors_and_pagination() {
    let cluster = FakeCluster::start().await.unwrap();
    let client = cluster.client().unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    for (name, n, app) in [("a", "n1", "db"), ("b", "n1", "web"), ("c", "n2", "db")] {
        pods.create(&PostParams::default(), &pod(name, n, json!({"app": app})))
            .await
            .unwrap();
    }

    let fetched = pods.get("a").await.unwrap();
    assert_eq!(
        fetched.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "create resets pod status"
    );
    assert!(fetched.metadata.uid.is_some() && fetched.metadata.resource_version.is_some());

    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(
        on_n1.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    let db_on_n1 = pods
        .list(
            &ListParams::default()
                .fields("spec.nodeName=n1")
                .labels("app=db"),
        )
        .await
        .unwrap();
    assert_eq!(db_on_n1.items.len(), 1);
    let not_db = pods
        .list(&ListParams::default().labels("app notin (db)"))
        .await
        .unwrap();
    assert_eq!(not_db.items.len(), 1);

    let err = api_err(
        pods.list(&ListParams::default().fields("spec.priority=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
    assert!(err
        .message
        .contains("field label not supported: spec.priority"));

    let err = api_err(
        pods.create(&PostParams::default(), &pod("a", "n1", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));

    let move_pod = Patch::Merge(json!({"spec": {"nodeName": "n2"}}));
    let err = api_err(
        pods.patch("a", &PatchParams::default(), &move_pod)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (err.code, err.reason.as_str()),
        (422, "Invalid"),
        "pod specs are immutable"
    );

    let other_ns: Api<Pod> = Api::namespaced(client.clone(), "nowhere");
    let err = api_err(
        other_ns
            .create(&PostParams::default(), &pod("x", "n1", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        err.code, 404,
        "creating in a missing namespace fails like the real server"
    );

    let mut generated = pod("", "n1", json!({}));
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let created = pods
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(created.name_any().starts_with("gen-") && created.name_any().len() == 9);

    let page1 = pods.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(page1.items.len(), 2);
    let token = page1.metadata.continue_.clone().expect("a continue token");
    let page2 = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(page2.items.len(), 2);
    assert!(page2.metadata.continue_.is_none());
    let all: Vec<String> = page1
        .items
        .iter()
        .chain(&page2.items)
        .map(|p| p.name_any())
        .collect();
    assert_eq!(all.len(), 4);
}

#[tokio::test]
async fn stale_resource_version_is_a_conflict() {
    let cluster = FakeCluster::start().await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client().unwrap());
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    let mut stale = nodes.get("n1").await.unwrap();
    let mut fresh = stale.clone();
    fresh.labels_mut().insert("a".into(), "1".into());
    let updated = nodes
        .replace("n1", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_ne!(updated.resource_version(), stale.resource_version());

    stale.labels_mut().insert("b".into(), "2".into());
    let err = api_err(
        nodes
            .replace("n1", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );
    assert_eq!(err.details.unwrap().name, "n1");

    // A merge patch carrying a stale resourceVersion is a precondition too.
    let patch =
        json!({"metadata": {"resourceVersion": stale.resource_version(), "labels": {"c": "3"}}});
    let err = api_err(
        nodes
            .patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert_eq!(nodes.get("n1").await.unwrap().labels().get("b"), None);

    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("someone-else".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let err = api_err(nodes.delete("n1", &wrong_uid).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    let right_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: updated.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert!(
        nodes.delete("n1", &right_uid).await.unwrap().is_right(),
        "nodes answer a Status"
    );
    assert!(nodes.get_opt("n1").await.unwrap().is_none());
}

#[tokio::test]
async fn watcher_gets_events_and_relists_after_410() {
    let cluster = FakeCluster::start().await.unwrap();
    let client = cluster.client().unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("before", "n1", json!({})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("elsewhere", "n2", json!({})))
        .await
        .unwrap();

    let mut stream = watcher(
        pods.clone(),
        watcher::Config::default().fields("spec.nodeName=n1"),
    )
    .boxed();
    type Item = Result<watcher::Event<Pod>, watcher::Error>;
    async fn next_of(s: &mut futures::stream::BoxStream<'static, Item>) -> Item {
        tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("watcher event in time")
            .expect("stream open")
    }
    macro_rules! next {
        () => {
            next_of(&mut stream)
        };
    }
    assert!(matches!(next!().await.unwrap(), watcher::Event::Init));
    match next!().await.unwrap() {
        watcher::Event::InitApply(p) => assert_eq!(p.name_any(), "before"),
        e => panic!("unexpected {e:?}"),
    }
    assert!(matches!(next!().await.unwrap(), watcher::Event::InitDone));

    pods.create(&PostParams::default(), &pod("during", "n1", json!({})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("ignored", "n2", json!({})))
        .await
        .unwrap();
    match next!().await.unwrap() {
        watcher::Event::Apply(p) => assert_eq!(p.name_any(), "during"),
        e => panic!("unexpected {e:?}"),
    }
    // A bound pod without a kubelet needs grace 0 to go at once.
    pods.delete("during", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    match next!().await.unwrap() {
        watcher::Event::Delete(p) => assert_eq!(p.name_any(), "during"),
        e => panic!("unexpected {e:?}"),
    }

    cluster.store.compact();
    let err = next!().await.unwrap_err();
    match err {
        watcher::Error::WatchError(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        e => panic!("expected a 410 watch error, got {e:?}"),
    }
    pods.create(&PostParams::default(), &pod("after", "n1", json!({})))
        .await
        .unwrap();
    let mut relisted = Vec::new();
    loop {
        match next!().await.unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(p) => relisted.push(p.name_any()),
            watcher::Event::InitDone => break,
            e => panic!("unexpected {e:?}"),
        }
    }
    relisted.sort();
    assert_eq!(relisted, ["after", "before"]);
    let relists = cluster
        .api
        .requests()
        .iter()
        .filter(|r| {
            r.method == "GET" && r.path == "/api/v1/namespaces/default/pods" && !r.is_watch()
        })
        .count();
    assert_eq!(relists, 2, "one initial list, one re-list after 410");
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_is_gone() {
    let cluster = FakeCluster::start().await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client().unwrap());
    let n = nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    let old_rv = n.resource_version().unwrap();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    cluster.store.compact();
    let mut events = nodes
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected ERROR 410, got {other:?}"),
    }

    // A watch from the current rv sees a later change as MODIFIED, selected by name.
    let rv = nodes.get("n1").await.unwrap().resource_version().unwrap();
    let wp = WatchParams::default().fields("metadata.name=n1");
    let mut events = nodes.watch(&wp, &rv).await.unwrap().boxed();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Modified(n)) => assert_eq!(n.spec.unwrap().unschedulable, Some(true)),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
}

#[tokio::test]
async fn server_side_apply_on_a_map_list_keeps_each_managers_entries() {
    let cluster = FakeCluster::start().await.unwrap();
    cluster.install_crd(&maintenance_crd()).unwrap();
    let api = maintenance_api(cluster.client().unwrap());
    let nm = json!({"apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": "shutdown-a"}, "spec": {"reason": "reboot", "unknownField": 1}});
    let created = api
        .patch(
            "shutdown-a",
            &PatchParams::apply("admin"),
            &Patch::Apply(&nm),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"],
        json!({"reason": "reboot", "stage": "Idle"}),
        "defaulted and pruned"
    );

    let entry = |node: &str, targets: i64| {
        json!({"apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance", "metadata": {"name": "shutdown-a"},
            "status": {"nodeStatuses": [{"nodeName": node, "drainTargets": targets}]}})
    };
    api.patch_status(
        "shutdown-a",
        &PatchParams::apply("nodegrace-a"),
        &Patch::Apply(entry("a", 1)),
    )
    .await
    .unwrap();
    api.patch_status(
        "shutdown-a",
        &PatchParams::apply("nodegrace-b"),
        &Patch::Apply(entry("b", 5)),
    )
    .await
    .unwrap();
    let got = api
        .patch_status(
            "shutdown-a",
            &PatchParams::apply("nodegrace-a"),
            &Patch::Apply(entry("a", 2)),
        )
        .await
        .unwrap();
    assert_eq!(
        got.data["status"]["nodeStatuses"],
        json!([{"nodeName": "a", "drainTargets": 2}, {"nodeName": "b", "drainTargets": 5}])
    );
    let managers: Vec<String> = got
        .metadata
        .managed_fields
        .as_ref()
        .unwrap()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(managers.contains(&"nodegrace-a".into()) && managers.contains(&"nodegrace-b".into()));
    let owned_by_a =
        serde_json::to_value(&got.metadata.managed_fields.as_ref().unwrap()[..]).unwrap();
    let a = owned_by_a
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["manager"] == "nodegrace-a")
        .unwrap();
    assert_eq!(
        (a["operation"].as_str(), a["subresource"].as_str()),
        (Some("Apply"), Some("status"))
    );
    assert_eq!(
        a["fieldsV1"],
        json!({"f:status": {"f:nodeStatuses": {"k:{\"nodeName\":\"a\"}": {".": {}, "f:nodeName": {}, "f:drainTargets": {}}}}})
    );

    // Another manager changing a's entry conflicts, naming the owner and the field.
    let err = api_err(
        api.patch_status(
            "shutdown-a",
            &PatchParams::apply("nodegrace-b"),
            &Patch::Apply(entry("a", 9)),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("conflict with \"nodegrace-a\""),
        "{}",
        err.message
    );
    assert!(
        err.message
            .contains(".status.nodeStatuses[nodeName=\"a\"].drainTargets"),
        "{}",
        err.message
    );

    // Omitting its entry removes it; b's entry stays.
    let none = json!({"apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": "shutdown-a"}, "status": {"nodeStatuses": []}});
    let got = api
        .patch_status(
            "shutdown-a",
            &PatchParams::apply("nodegrace-a"),
            &Patch::Apply(&none),
        )
        .await
        .unwrap();
    assert_eq!(
        got.data["status"]["nodeStatuses"],
        json!([{"nodeName": "b", "drainTargets": 5}])
    );

    // Forcing takes ownership.
    let forced = api
        .patch_status(
            "shutdown-a",
            &PatchParams::apply("nodegrace-a").force(),
            &Patch::Apply(entry("b", 7)),
        )
        .await
        .unwrap();
    assert_eq!(
        forced.data["status"]["nodeStatuses"],
        json!([{"nodeName": "b", "drainTargets": 7}])
    );

    // Status through the main resource is ignored; spec through /status too.
    let spec_and_status = json!({"apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": "shutdown-a"}, "spec": {"reason": "reboot", "stage": "Drain"}, "status": {"nodeStatuses": []}});
    let got = api
        .patch(
            "shutdown-a",
            &PatchParams::apply("admin"),
            &Patch::Apply(&spec_and_status),
        )
        .await
        .unwrap();
    assert_eq!(got.data["spec"]["stage"], json!("Drain"));
    assert_eq!(
        got.data["status"]["nodeStatuses"].as_array().unwrap().len(),
        1
    );

    // Schema validation (enum) and missing fieldManager are rejected.
    let bad = json!({"apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": "shutdown-a"}, "spec": {"stage": "Sideways"}});
    let err = api_err(
        api.patch(
            "shutdown-a",
            &PatchParams::apply("admin"),
            &Patch::Apply(&bad),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    let err = api_err(
        api.patch(
            "shutdown-a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        err.code, 415,
        "strategic merge patch is not supported on custom resources"
    );
}

#[tokio::test]
async fn merge_patch_cordons_and_strategic_patch_merges_taints() {
    let cluster = FakeCluster::start().await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client().unwrap());
    let mut n = node("n1");
    n.spec = Some(
        serde_json::from_value(json!({"taints": [{"key": "other", "effect": "NoExecute"}]}))
            .unwrap(),
    );
    nodes.create(&PostParams::default(), &n).await.unwrap();
    cluster.api.clear_requests();

    let cordon = json!({"spec": {"unschedulable": true},
        "metadata": {"annotations": {"nodegrace.dev/cordoned": "true"}}});
    let got = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&cordon))
        .await
        .unwrap();
    assert_eq!(got.spec.as_ref().unwrap().unschedulable, Some(true));
    let req = &cluster.api.writes()[0];
    assert_eq!(req.method, "PATCH");
    assert_eq!(req.path, "/api/v1/nodes/n1");
    assert_eq!(
        req.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(req.body_json().unwrap(), cordon);

    let taint =
        json!({"spec": {"taints": [{"key": "nodegrace.dev/maintenance", "effect": "NoSchedule"}]}});
    let got = nodes
        .patch("n1", &PatchParams::default(), &Patch::Strategic(&taint))
        .await
        .unwrap();
    let keys: Vec<String> = got
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(keys, ["other", "nodegrace.dev/maintenance"]);

    let cond = json!({"status": {"conditions": [{"type": "GracefulNodeShutdownInProgress", "status": "True"}]}});
    let got = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&cond))
        .await
        .unwrap();
    assert_eq!(got.status.unwrap().conditions.unwrap().len(), 1);
    let unchanged = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    assert_eq!(
        unchanged.resource_version(),
        nodes.get("n1").await.unwrap().resource_version()
    );
}

#[tokio::test]
async fn eviction_honours_the_disruption_budget() {
    let cluster = FakeCluster::start().await.unwrap();
    let client = cluster.client().unwrap();
    for name in ["db-0", "db-1", "db-2"] {
        cluster
            .add_running_pod("prod", name, "n1", json!({"app": "db"}))
            .unwrap();
    }
    cluster
        .add_running_pod("prod", "loner", "n1", json!({"app": "loner"}))
        .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "prod");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({"metadata": {"name": "db-pdb"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}}}))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let status = pdbs.get("db-pdb").await.unwrap().status.unwrap();
    assert_eq!(
        (
            status.current_healthy,
            status.desired_healthy,
            status.disruptions_allowed
        ),
        (Some(3), Some(2), Some(1))
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "prod");
    // kube 5's `Api::evict` sends `delete_options` (snake case): a real apiserver drops the
    // unknown field, so its UID precondition is silently not applied. The fake does the same.
    let wrong = EvictParams {
        delete_options: Some(DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some("not-the-uid".into()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }),
        ..EvictParams::default()
    };
    pods.evict("loner", &wrong).await.unwrap();
    let sent = cluster.api.requests().last().unwrap().body_json().unwrap();
    assert!(sent.get("delete_options").is_some() && sent.get("deleteOptions").is_none());

    // A proper policy/v1 Eviction carries the precondition.
    let eviction = |uid: &str| -> Eviction {
        serde_json::from_value(json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "db-0", "namespace": "prod"},
            "deleteOptions": {"preconditions": {"uid": uid}}}))
        .unwrap()
    };
    let uid = pods.get("db-0").await.unwrap().uid().unwrap();
    let err = api_err(
        pods.create_subresource::<_, kube::core::Status>(
            "eviction",
            "db-0",
            &PostParams::default(),
            &eviction("not-the-uid"),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(err
        .message
        .contains("Precondition failed: UID in precondition"));

    pods.create_subresource::<_, kube::core::Status>(
        "eviction",
        "db-0",
        &PostParams::default(),
        &eviction(&uid),
    )
    .await
    .unwrap();
    let evicted = pods.get("db-0").await.unwrap();
    assert!(
        evicted.metadata.deletion_timestamp.is_some(),
        "evicted = graceful delete"
    );
    assert_eq!(
        pdbs.get("db-pdb")
            .await
            .unwrap()
            .status
            .unwrap()
            .disruptions_allowed,
        Some(0)
    );

    let err = api_err(
        pods.evict("db-1", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(
        err.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let causes = err.details.unwrap().causes;
    assert_eq!(causes[0].reason, "DisruptionBudget");
    assert!(
        causes[0]
            .message
            .contains("db-pdb needs 2 healthy pods and has 2 currently"),
        "{}",
        causes[0].message
    );

    // Evicting an already terminating pod skips the budget.
    pods.evict("db-0", &EvictParams::default()).await.unwrap();

    // When db-0 is gone and a replacement is ready, the budget allows one again.
    cluster
        .store
        .finish_deletion("", "pods", "prod", "db-0", None);
    cluster
        .add_running_pod("prod", "db-3", "n1", json!({"app": "db"}))
        .unwrap();
    assert_eq!(
        pdbs.get("db-pdb")
            .await
            .unwrap()
            .status
            .unwrap()
            .disruptions_allowed,
        Some(1)
    );
    pods.evict("db-1", &EvictParams::default()).await.unwrap();
    assert_eq!(
        pdbs.get("db-pdb")
            .await
            .unwrap()
            .status
            .unwrap()
            .disruptions_allowed,
        Some(0)
    );

    // A terminal pod is evicted without consulting the exhausted budget.
    cluster
        .store
        .update_in_process("", "pods", "prod", "db-2", |p| {
            p["status"]["phase"] = json!("Succeeded")
        });
    pods.evict("db-2", &EvictParams::default()).await.unwrap();
    assert!(
        pods.get_opt("db-2").await.unwrap().is_none(),
        "terminal pods are deleted at once"
    );
}

#[tokio::test]
async fn percentage_budgets_round_like_the_disruption_controller() {
    let cluster = FakeCluster::start().await.unwrap();
    for i in 0..4 {
        cluster
            .add_running_pod("default", &format!("w-{i}"), "n1", json!({"app": "w"}))
            .unwrap();
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client().unwrap(), "default");
    for (name, spec) in [
        ("max-50", json!({"maxUnavailable": "50%"})),
        ("min-30", json!({"minAvailable": "30%"})),
    ] {
        let mut spec = spec;
        spec["selector"] = json!({"matchLabels": {"app": "w"}});
        let pdb: PodDisruptionBudget =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
        pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    }
    // maxUnavailable 50% of 4 = 2 -> desired 2; minAvailable 30% of 4 rounds up to 2.
    for name in ["max-50", "min-30"] {
        let s = pdbs.get(name).await.unwrap().status.unwrap();
        assert_eq!(
            (s.desired_healthy, s.disruptions_allowed),
            (Some(2), Some(2)),
            "{name}"
        );
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client().unwrap(), "default");
    let err = api_err(
        pods.evict("w-0", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(
        err.code, 500,
        "two budgets on one pod is unsupported, as on a real server"
    );
}

#[tokio::test(start_paused = true)]
async fn graceful_delete_is_finished_by_the_fake_kubelet_after_the_chosen_time() {
    let cluster = FakeCluster::start().await.unwrap();
    let mut config = KubeletConfig::node("n1");
    config.default_finish = Duration::from_secs(2);
    config
        .finish_after
        .insert("default/slow".into(), Duration::from_secs(10));
    config
        .finish_after
        .insert("default/capped".into(), Duration::from_secs(100));
    let kubelet = cluster.kubelet(config);
    for name in ["slow", "quick", "capped"] {
        cluster
            .add_running_pod("default", name, "n1", json!({}))
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client().unwrap(), "default");
    let start = tokio::time::Instant::now();
    for name in ["slow", "quick"] {
        let deleted = pods
            .delete(name, &DeleteParams::default().grace_period(30))
            .await
            .unwrap();
        assert!(
            deleted.is_left(),
            "a graceful delete returns the still-present pod"
        );
    }
    pods.delete("capped", &DeleteParams::default().grace_period(5))
        .await
        .unwrap();
    let p = pods.get("slow").await.unwrap();
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));

    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(
        pods.get_opt("slow").await.unwrap().is_some(),
        "slow pod still terminating at 9s"
    );
    assert!(pods.get_opt("quick").await.unwrap().is_none());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        pods.get_opt("slow").await.unwrap().is_none(),
        "slow pod gone after 10s"
    );

    let finished: Vec<(String, u64)> = kubelet
        .finished()
        .iter()
        .map(|f| (f.name.clone(), (f.finished_at - start).as_secs()))
        .collect();
    assert_eq!(
        finished,
        [
            ("quick".to_string(), 2),
            ("capped".to_string(), 5),
            ("slow".to_string(), 10)
        ],
        "each pod exits after its chosen time, never later than its grace period"
    );
}

#[tokio::test(start_paused = true)]
async fn fake_kubelet_recreates_statefulset_pods_with_a_new_uid() {
    let cluster = FakeCluster::start().await.unwrap();
    let mut config = KubeletConfig::node("n1");
    config.auto_run = true;
    config.recreate_statefulset = Some(nodegrace_testkit::fake_kubelet::StatefulSetRecreate {
        node: Some("n2".into()),
    });
    let _kubelet = cluster.kubelet(config);
    let pods: Api<Pod> = Api::namespaced(cluster.client().unwrap(), "default");
    let mut p = pod("web-0", "n1", json!({"app": "web"}));
    p.metadata.owner_references = Some(vec![serde_json::from_value(
        json!({"apiVersion": "apps/v1",
        "kind": "StatefulSet", "name": "web", "uid": "sts-uid", "controller": true}),
    )
    .unwrap()]);
    let created = pods.create(&PostParams::default(), &p).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        pods.get("web-0")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Running")
    );

    pods.delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = pods.get("web-0").await.unwrap();
    assert_ne!(again.uid(), created.uid());
    assert_eq!(again.spec.unwrap().node_name.as_deref(), Some("n2"));
}

#[tokio::test]
async fn installing_a_crd_makes_its_resource_discoverable() {
    let cluster = FakeCluster::start().await.unwrap();
    let client = cluster.client().unwrap();
    let served = |client: kube::Client| async move {
        let d = kube::discovery::Discovery::new(client).run().await.unwrap();
        let found = d.groups().any(|g| g.name() == "nodegrace.dev");
        found
    };
    assert!(!served(client.clone()).await);
    assert!(served_policy(&client).await);
    let err = api_err(
        maintenance_api(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);

    cluster.install_crd(&maintenance_crd()).unwrap();
    assert!(served(client.clone()).await);
    let resources = client
        .list_api_group_resources("nodegrace.dev/v1alpha1")
        .await
        .unwrap();
    let names: Vec<&str> = resources
        .resources
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["nodemaintenances", "nodemaintenances/status"]);
    let nm: DynamicObject = serde_json::from_value(json!({"apiVersion": "nodegrace.dev/v1alpha1",
        "kind": "NodeMaintenance", "metadata": {"name": "m"}, "spec": {}}))
    .unwrap();
    maintenance_api(client.clone())
        .create(&PostParams::default(), &nm)
        .await
        .unwrap();

    cluster
        .uninstall_crd("nodemaintenances.nodegrace.dev")
        .unwrap();
    assert!(!served(client.clone()).await);
    assert!(cluster
        .store
        .get_obj("nodegrace.dev", "nodemaintenances", "", "m")
        .is_none());
}

async fn served_policy(client: &kube::Client) -> bool {
    let r = client.list_api_group_resources("policy/v1").await.unwrap();
    r.resources.iter().any(|r| r.name == "poddisruptionbudgets")
}

#[tokio::test]
async fn faults_unreachability_and_the_request_log() {
    let cluster = FakeCluster::start().await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client().unwrap());
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();

    cluster
        .api
        .inject_errors(Some("PATCH"), "/api/v1/nodes/*", 500, 2);
    let patch = Patch::Merge(json!({"spec": {"unschedulable": true}}));
    for _ in 0..2 {
        let err = api_err(
            nodes
                .patch("n1", &PatchParams::default(), &patch)
                .await
                .unwrap_err(),
        );
        assert_eq!(err.code, 500);
    }
    nodes
        .patch("n1", &PatchParams::default(), &patch)
        .await
        .unwrap();
    assert_eq!(
        cluster
            .api
            .writes()
            .iter()
            .filter(|r| r.method == "PATCH")
            .count(),
        3
    );

    cluster.api.inject_errors(None, "/api/v1/nodes/n1", 429, 1);
    let err = api_err(nodes.get("n1").await.unwrap_err());
    assert_eq!(
        (err.code, err.reason.as_str()),
        (429, "TooManyRequests"),
        "the client does not retry 429 itself"
    );
    let throttled = cluster.api.requests().len();
    nodes.get("n1").await.unwrap();
    assert_eq!(cluster.api.requests().len(), throttled + 1);

    cluster.api.set_reachable(false).await.unwrap();
    let err = nodes.get("n1").await.unwrap_err();
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "unreachable is a transport error: {err:?}"
    );
    cluster.api.set_reachable(true).await.unwrap();
    assert_eq!(nodes.get("n1").await.unwrap().name_any(), "n1");
}

#[tokio::test(start_paused = true)]
async fn finalizers_hold_a_finished_pod_until_removed() {
    let cluster = FakeCluster::start().await.unwrap();
    let kubelet = cluster.kubelet(KubeletConfig::node("n1"));
    let pods: Api<Pod> = Api::namespaced(cluster.client().unwrap(), "default");
    let mut p = pod("held", "n1", json!({}));
    p.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    pods.create(&PostParams::default(), &p).await.unwrap();
    pods.delete("held", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held = pods.get("held").await.unwrap();
    assert_eq!(held.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(kubelet.finished().len(), 1);
    let rv = held.resource_version();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        pods.get("held").await.unwrap().resource_version(),
        rv,
        "no write loop on a held pod"
    );

    let err = api_err(
        pods.patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}}),
            ),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        err.code, 422,
        "no new finalizers on an object being deleted"
    );
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(pods.get_opt("held").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn latency_is_added_in_tokio_time() {
    let cluster = FakeCluster::start().await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client().unwrap());
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    cluster.api.set_latency(Duration::from_secs(3));
    let start = tokio::time::Instant::now();
    nodes.get("n1").await.unwrap();
    assert!(start.elapsed() >= Duration::from_secs(3));
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_and_the_end_bookmark() {
    let cluster = FakeCluster::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client().unwrap(), "default");
    pods.create(&PostParams::default(), &pod("a", "n1", json!({})))
        .await
        .unwrap();
    let mut stream = watcher(pods.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut seen = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match ev {
            watcher::Event::Init => {}
            watcher::Event::InitApply(p) => seen.push(p.name_any()),
            watcher::Event::InitDone => break,
            e => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(seen, ["a"]);
    let watch = cluster
        .api
        .requests()
        .into_iter()
        .find(|r| r.is_watch())
        .unwrap();
    assert_eq!(watch.param("sendInitialEvents").as_deref(), Some("true"));
}
