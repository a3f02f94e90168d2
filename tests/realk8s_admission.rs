//! Real-control-plane tier: the shipped ClusterRole and admission policy (v1beta1 form on
//! 1.28) as the real apiserver enforces them. A node's nodegrace identity may act on its own
//! Node, pods and maintenances and is refused for another node's. Writes are server-side
//! dry runs: admission runs, nothing is stored.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

mod real;
mod realk8s;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PostParams};
use kube::{Api, Client};
use nodegrace::NodeMaintenance;
use serde_json::json;

struct Two {
    admin: Client,
    /// nodegrace's identity on node A.
    a: Client,
    a_name: String,
    b_name: String,
}

async fn two_nodes() -> Two {
    let cp = tokio::task::spawn_blocking(realk8s::control_plane)
        .await
        .expect("control plane");
    let admin = cp.admin().await;
    let (a_name, b_name) = (realk8s::unique("ng-adm-a"), realk8s::unique("ng-adm-b"));
    let nodes: Api<Node> = Api::all(admin.clone());
    for name in [&a_name, &b_name] {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("p-{name}")},
            "spec": {"nodeName": name, "containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let a = realk8s::client_from(&cp.nodegrace_identity(&a_name)).await;
    Two {
        admin,
        a,
        a_name,
        b_name,
    }
}

impl Two {
    async fn cleanup(&self) {
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
        for name in [&self.a_name, &self.b_name] {
            let _ = pods
                .delete(&format!("p-{name}"), &DeleteParams::default())
                .await;
            let _ = nodes.delete(name, &DeleteParams::default()).await;
        }
    }
}

fn refused<T: std::fmt::Debug>(what: &str, r: kube::Result<T>) {
    match r {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => {}
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

fn maintenance(name: &str, selector: serde_json::Value) -> NodeMaintenance {
    serde_json::from_value(json!({
        "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"nodeSelectorTerms": [selector]}, "stage": "Drain"},
    }))
    .unwrap()
}

/// A node's identity on its own objects (the positive control) and on another node's: the
/// Node, its pods and NodeMaintenances that select it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_identity_acts_on_its_own_objects_only() {
    if !realk8s::enabled("realk8s_admission::a_node_identity_acts_on_its_own_objects_only") {
        return;
    }
    let t = two_nodes().await;
    let (a, b) = (&t.a_name, &t.b_name);
    let nodes: Api<Node> = Api::all(t.a.clone());
    let cordon = Patch::Merge(json!({"spec": {"unschedulable": true}}));
    nodes
        .patch(a, &realk8s::dry::patch(), &cordon)
        .await
        .expect("cordon itself");
    // An admission policy applied a moment ago takes effect once the apiserver's policy
    // informers caught up: on a control plane that just started that can take seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while nodes
        .patch(b, &realk8s::dry::patch(), &cordon)
        .await
        .is_ok()
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    refused(
        "cordon another node",
        nodes.patch(b, &realk8s::dry::patch(), &cordon).await,
    );
    let label = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    refused(
        "label another node",
        nodes.patch(b, &realk8s::dry::patch(), &label).await,
    );
    // Of its own Node's conditions, the lifecycle ones (KEP-5683) only.
    let conditions = |types: &[&str]| {
        let list: Vec<serde_json::Value> = types
            .iter()
            .map(|t| json!({"type": t, "status": "True", "reason": "NodeShutdown"}))
            .collect();
        Patch::Strategic(json!({"status": {"conditions": list}}))
    };
    let lifecycle = conditions(&[
        "GracefulNodeShutdownInProgress",
        "DrainInProgress",
        "Drained",
    ]);
    nodes
        .patch_status(a, &realk8s::dry::patch(), &lifecycle)
        .await
        .expect("the lifecycle conditions of its own Node");
    refused(
        "the lifecycle conditions of another node",
        nodes
            .patch_status(b, &realk8s::dry::patch(), &lifecycle)
            .await,
    );
    refused(
        "its own Node's Ready condition",
        nodes
            .patch_status(a, &realk8s::dry::patch(), &conditions(&["Ready"]))
            .await,
    );

    // Pods are the kubelet's credential's to delete (tests/realk8s_identity.rs): nodegrace's
    // identity has no pod writes, not even for its own node's pods.
    let pods: Api<Pod> = Api::namespaced(t.a.clone(), "default");
    refused(
        "delete its own pod",
        pods.delete(&format!("p-{a}"), &realk8s::dry::delete())
            .await,
    );
    refused(
        "delete another node's pod",
        pods.delete(&format!("p-{b}"), &realk8s::dry::delete())
            .await,
    );
    let target = Patch::Strategic(
        json!({"status": {"conditions": [{"type": "DisruptionTarget",
        "status": "True", "reason": "DeletionByNodeMaintenance", "message": "test"}]}}),
    );
    pods.patch_status(&format!("p-{a}"), &realk8s::dry::patch(), &target)
        .await
        .expect("mark its own pod a disruption target");
    refused(
        "mark another node's pod",
        pods.patch_status(&format!("p-{b}"), &realk8s::dry::patch(), &target)
            .await,
    );
    refused(
        "change another condition of its own pod",
        pods.patch_status(
            &format!("p-{a}"),
            &realk8s::dry::patch(),
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "test"}]}})),
        )
        .await,
    );

    let nms: Api<NodeMaintenance> = Api::all(t.a.clone());
    let pin = |n: &str| json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]});
    nms.create(
        &realk8s::dry::post(),
        &maintenance(&format!("shutdown-{a}"), pin(a)),
    )
    .await
    .expect("create its own maintenance");
    refused(
        "create a maintenance for another node",
        nms.create(
            &realk8s::dry::post(),
            &maintenance(&format!("shutdown-{b}"), pin(b)),
        )
        .await,
    );
    // Labelled for its node (only its daemon watches it), not for another's.
    let labelled = |node: &str| {
        let mut m = maintenance(&format!("shutdown-{a}"), pin(a));
        m.metadata.labels = Some([(nodegrace::NODE_LABEL.to_string(), node.to_string())].into());
        m
    };
    nms.create(&realk8s::dry::post(), &labelled(a))
        .await
        .expect("create its own maintenance labelled for itself");
    refused(
        "label its maintenance for another node",
        nms.create(&realk8s::dry::post(), &labelled(b)).await,
    );
    refused(
        "create a maintenance by label",
        nms.create(
            &realk8s::dry::post(),
            &maintenance(
                &format!("by-label-{a}"),
                json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [a]}]}),
            ),
        )
        .await,
    );
    // One that an admin created for node B: node A may not change it.
    let admin_nms: Api<NodeMaintenance> = Api::all(t.admin.clone());
    let theirs = format!("shutdown-{b}");
    admin_nms
        .create(&PostParams::default(), &maintenance(&theirs, pin(b)))
        .await
        .unwrap();
    refused(
        "move another node's maintenance",
        nms.patch(
            &theirs,
            &realk8s::dry::patch(),
            &Patch::Merge(json!({"spec": {"stage": "Complete"}})),
        )
        .await,
    );
    refused(
        "delete another node's maintenance",
        nms.delete(&theirs, &realk8s::dry::delete()).await,
    );
    let _ = admin_nms.delete(&theirs, &DeleteParams::default()).await;
    t.cleanup().await;
}
