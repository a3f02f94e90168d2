//! `cluster::evict` against the fake apiserver: what the apiserver receives and how each
//! answer is classified.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use nodegrace::evict::{self, Outcome};
use nodegrace_testkit::fake_apiserver::FakeCluster;
use serde_json::json;

async fn cluster_with_db_pods() -> (FakeCluster, Api<Pod>) {
    let cluster = FakeCluster::start().await.unwrap();
    for name in ["db-0", "db-1"] {
        cluster
            .add_running_pod("prod", name, "n1", json!({"app": "db"}))
            .unwrap();
    }
    let client = cluster.client().unwrap();
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({"metadata": {"name": "db-pdb"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}}}))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "prod")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    (cluster, Api::namespaced(client, "prod"))
}

#[tokio::test]
async fn eviction_carries_the_uid_precondition_and_a_replaced_pod_is_gone() {
    let (cluster, pods) = cluster_with_db_pods().await;
    let outcome = evict::evict(&pods, "db-0", "uid-of-a-predecessor", Some(10))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Gone);
    let sent = cluster.api.requests().last().unwrap().body_json().unwrap();
    assert_eq!(sent["kind"], json!("Eviction"));
    assert_eq!(sent["apiVersion"], json!("policy/v1"));
    assert_eq!(
        sent["deleteOptions"]["preconditions"]["uid"],
        json!("uid-of-a-predecessor")
    );
    assert_eq!(sent["deleteOptions"]["gracePeriodSeconds"], json!(10));
    assert!(pods
        .get("db-0")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_none());
}

#[tokio::test]
async fn a_pdb_block_is_reported_with_the_budget_name() {
    let (_cluster, pods) = cluster_with_db_pods().await;
    let uid = pods.get("db-0").await.unwrap().uid().unwrap();
    let outcome = evict::evict(&pods, "db-0", &uid, None).await.unwrap();
    match outcome {
        Outcome::Blocked { budget, .. } => assert_eq!(budget.as_deref(), Some("db-pdb")),
        other => panic!("expected a PDB block, got {other:?}"),
    }
}

#[tokio::test]
async fn delete_bypasses_the_budget_and_respects_the_uid() {
    let (_cluster, pods) = cluster_with_db_pods().await;
    let uid = pods.get("db-1").await.unwrap().uid().unwrap();
    assert_eq!(
        evict::delete(&pods, "db-1", "someone-else", 5, "upgrade")
            .await
            .unwrap(),
        Outcome::Gone
    );
    let untouched = pods.get("db-1").await.unwrap();
    assert_eq!(untouched.uid().as_deref(), Some(uid.as_str()));
    assert!(
        disruption_target(&untouched).is_none(),
        "another pod's request marks nothing"
    );
    assert_eq!(
        evict::delete(&pods, "db-1", &uid, 5, "upgrade")
            .await
            .unwrap(),
        Outcome::Accepted
    );
    let pod = pods.get("db-1").await.unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some());
    assert_eq!(pod.metadata.deletion_grace_period_seconds, Some(5));
    let condition = disruption_target(&pod).expect("a deleted pod is marked a disruption target");
    assert_eq!(condition.status, "True");
    assert_eq!(
        condition.reason.as_deref(),
        Some("DeletionByNodeMaintenance")
    );
    assert_eq!(
        condition.message.as_deref(),
        Some("Pod was deleted for NodeMaintenance upgrade.")
    );
}

fn disruption_target(pod: &Pod) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .cloned()
}

/// A grace period beyond 32 bits is saturated, never wrapped: 2^32 s once became 0, a
/// forced delete.
#[tokio::test]
async fn a_delete_grace_beyond_32_bits_saturates() {
    let (_cluster, pods) = cluster_with_db_pods().await;
    let uid = pods.get("db-1").await.unwrap().uid().unwrap();
    assert_eq!(
        evict::delete(&pods, "db-1", &uid, 1 << 32, "upgrade")
            .await
            .unwrap(),
        Outcome::Accepted
    );
    let pod = pods.get("db-1").await.unwrap();
    assert_eq!(
        pod.metadata.deletion_grace_period_seconds,
        Some(i64::from(u32::MAX))
    );
}
