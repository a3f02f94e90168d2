//! Real-control-plane tier: what a stolen credential of node A can do to node B, row by row
//! as packaging/rbac/README.md ("What a stolen credential can do") tables it, with the
//! packaged ClusterRole and admission policy applied (v1beta1 form on 1.28) and the 1.37
//! `lifecycle.k8s.io` API as the tests' CRDs (`tests/data/lifecycle.k8s.io`). Node A holds
//! two credentials: nodegrace's identity (`nodegrace:node:A`) and the kubelet's
//! (`system:node:A`, which the Node authorizer and NodeRestriction confine). Each refusal is
//! checked against who refused it (RBAC, NodeRestriction or the named policy), and each
//! refused write has a control that the same write on A's own object is accepted, so a
//! malformed request cannot pass for a refusal. Writes are server-side dry runs.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

mod real;
mod realk8s;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest as LifecycleRequest};
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodegrace::lifecycle::requester_key;
use nodegrace::{NodeMaintenance, FINALIZER_MAINTENANCE_COMPLETION, NODE_LABEL};
use serde_json::{json, Value};

const NS: &str = "default";
const MAINTENANCES: &str = "nodegrace-node-restriction-nodemaintenances";
const LC_REQUESTS: &str = "nodegrace-node-restriction-lifecycle-evictionrequests";

/// Who refused a request, told by the apiserver's message.
#[derive(Clone, Copy, Debug)]
enum By {
    /// RBAC: the identity has no grant for the verb at all.
    Rbac,
    /// The NodeRestriction admission plugin or the Node authorizer (the kubelet's identity).
    NodeRestriction,
    /// The named ValidatingAdmissionPolicy of packaging/admission.
    Policy(&'static str),
}

fn refused<T: std::fmt::Debug>(what: &str, by: By, r: kube::Result<T>) {
    let e = match r {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => e,
        other => panic!("{what}: expected a refusal by {by:?}, got {other:?}"),
    };
    let m = &e.message;
    let ok = match by {
        By::Rbac => e.code == 403 && m.contains("cannot"),
        By::NodeRestriction => {
            e.code == 403 && m.contains(" is forbidden: node ") && !m.contains("cannot")
        }
        // A rule's verdict, not an expression that failed to evaluate (which denies too).
        By::Policy(name) => {
            m.contains(&format!("ValidatingAdmissionPolicy '{name}'"))
                && !m.contains("resulted in error")
        }
    };
    assert!(ok, "{what}: refused, but not by {by:?}: {e:?}");
}

fn accepted<T>(what: &str, r: kube::Result<T>) {
    if let Err(e) = r {
        panic!("{what}: expected it accepted (the control), got {e:?}");
    }
}

fn dry_evict() -> EvictParams {
    EvictParams {
        delete_options: Some(realk8s::dry::delete()),
        post_options: realk8s::dry::post(),
    }
}

/// Nodes A and B, a pod bound to each, and A's two credentials.
struct Cluster {
    admin: Client,
    a: String,
    b: String,
    /// nodegrace's identity on A.
    ng: Client,
    /// The kubelet's identity on A.
    kubelet: Client,
    pods: Vec<String>,
    maintenances: Vec<String>,
}

impl Cluster {
    async fn new() -> Cluster {
        let cp = realk8s::running_control_plane().await;
        let admin = cp.admin().await;
        let (a, b) = (realk8s::unique("ng-id-a"), realk8s::unique("ng-id-b"));
        let nodes: Api<Node> = Api::all(admin.clone());
        let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
        for name in [&a, &b] {
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            }))
            .unwrap();
            nodes.create(&PostParams::default(), &node).await.unwrap();
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("p-{name}")},
                "spec": {"nodeName": name, "containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
            }))
            .unwrap();
            pods.create(&PostParams::default(), &pod).await.unwrap();
        }
        let ng = realk8s::client_from(&cp.nodegrace_identity(&a)).await;
        let kubelet = realk8s::client_from(&cp.kubelet_identity(&a)).await;
        Cluster {
            admin,
            pods: vec![format!("p-{a}"), format!("p-{b}")],
            a,
            b,
            ng,
            kubelet,
            maintenances: Vec::new(),
        }
    }

    fn pod_of(&self, node: &str) -> String {
        format!("p-{node}")
    }

    /// A `lifecycle.k8s.io` EvictionRequest for `node`'s pod under `requester`,
    /// labelled for `label` (not made).
    async fn lifecycle_request(
        &self,
        node: &str,
        requester: &str,
        label: Option<&str>,
    ) -> LifecycleRequest {
        let pod = Api::<Pod>::namespaced(self.admin.clone(), NS)
            .get(&self.pod_of(node))
            .await
            .unwrap();
        serde_json::from_value(json!({
            "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "EvictionRequest",
            "metadata": {
                "name": format!("nodegrace-{}", pod.uid().unwrap()),
                "namespace": NS,
                "labels": label.map(|l| json!({NODE_LABEL: l})).unwrap_or(json!({})),
            },
            "spec": {"intent": "Eviction", "requester": requester,
                     "target": {"pod": {"name": pod.name_any(), "uid": pod.uid().unwrap()}}},
        }))
        .unwrap()
    }

    /// The `lifecycle.k8s.io` Eviction of `node`'s pod, labelled for `label` (not made), as
    /// the cluster's evictionrequest-controller would make it.
    async fn eviction(&self, node: &str, label: Option<&str>) -> Eviction {
        let pod = Api::<Pod>::namespaced(self.admin.clone(), NS)
            .get(&self.pod_of(node))
            .await
            .unwrap();
        serde_json::from_value(json!({
            "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "Eviction",
            "metadata": {
                "name": pod.uid().unwrap(),
                "namespace": NS,
                "labels": label.map(|l| json!({NODE_LABEL: l})).unwrap_or(json!({})),
            },
            "spec": {"target": {"pod": {"name": pod.name_any(), "uid": pod.uid().unwrap()}}},
        }))
        .unwrap()
    }

    /// A NodeMaintenance the admin makes selecting `node` with `term`, with the nodegrace
    /// finalizer, a label, and `node`'s status entry saying it is still draining.
    async fn maintenance(&mut self, name: &str, node: &str, term: Value) -> NodeMaintenance {
        let api: Api<NodeMaintenance> = Api::all(self.admin.clone());
        let m: NodeMaintenance = serde_json::from_value(json!({
            "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": name, "labels": {"team": "ops"},
                         "finalizers": [FINALIZER_MAINTENANCE_COMPLETION]},
            "spec": {"nodeSelector": {"nodeSelectorTerms": [term]}, "stage": "Drain"},
        }))
        .unwrap();
        api.create(&PostParams::default(), &m).await.unwrap();
        self.maintenances.push(name.to_owned());
        let mut entry = nodegrace::NodeMaintenanceNodeStatus::for_node(node);
        entry.drain_message = "Draining".into();
        entry.pods_remaining = 1;
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "stageStatuses": [{"name": "Cordon"}, {"name": "Drain"}],
                "nodeStatuses": [entry],
            }})),
        )
        .await
        .unwrap()
    }

    async fn cleanup(&self) {
        let nms: Api<NodeMaintenance> = Api::all(self.admin.clone());
        for m in &self.maintenances {
            let _ = nms
                .patch(
                    m,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
            let _ = nms.delete(m, &DeleteParams::default()).await;
        }
        let lifecycle_ers: Api<LifecycleRequest> = Api::namespaced(self.admin.clone(), NS);
        let evictions: Api<Eviction> = Api::namespaced(self.admin.clone(), NS);
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), NS);
        for p in &self.pods {
            if let Ok(pod) = pods.get(p).await {
                let uid = pod.uid().unwrap_or_default();
                let _ = lifecycle_ers
                    .delete(&format!("nodegrace-{uid}"), &DeleteParams::default())
                    .await;
                let _ = evictions.delete(&uid, &DeleteParams::default()).await;
            }
            let _ = pods.delete(p, &DeleteParams::default()).await;
        }
        let nodes: Api<Node> = Api::all(self.admin.clone());
        for n in [&self.a, &self.b] {
            let _ = nodes.delete(n, &DeleteParams::default()).await;
        }
    }
}

/// Rows "evict a pod bound to B" and "delete a pod bound to B": nodegrace's identity has no
/// pod writes at all; the kubelet's is confined to A's pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_of_a_node_evicts_or_deletes_another_nodes_pod() {
    if !realk8s::enabled(
        "realk8s_identity::no_credential_of_a_node_evicts_or_deletes_another_nodes_pod",
    ) {
        return;
    }
    let c = Cluster::new().await;
    let (own, theirs) = (c.pod_of(&c.a), c.pod_of(&c.b));
    let ng: Api<Pod> = Api::namespaced(c.ng.clone(), NS);
    let kubelet: Api<Pod> = Api::namespaced(c.kubelet.clone(), NS);

    refused(
        "nodegrace:node:A evicts B's pod",
        By::Rbac,
        ng.evict(&theirs, &dry_evict()).await,
    );
    refused(
        "nodegrace:node:A evicts its own pod",
        By::Rbac,
        ng.evict(&own, &dry_evict()).await,
    );
    refused(
        "nodegrace:node:A deletes B's pod",
        By::Rbac,
        ng.delete(&theirs, &realk8s::dry::delete()).await,
    );

    // pods/status: the DisruptionTarget condition nodegrace records for pods it stopped
    // offline.
    let pods: Api<Pod> = Api::namespaced(c.admin.clone(), NS);
    let own_uid = pods.get(&own).await.unwrap().uid().unwrap();
    let their_uid = pods.get(&theirs).await.unwrap().uid().unwrap();
    let disruption = |uid: &str| {
        Patch::Strategic(json!({"metadata": {"uid": uid}, "status": {"conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
            "message": "x", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
    };
    accepted(
        "nodegrace:node:A marks its own pod a disruption target",
        ng.patch_status(&own, &realk8s::dry::patch(), &disruption(&own_uid))
            .await,
    );
    refused(
        "nodegrace:node:A marks B's pod a disruption target",
        By::Policy("nodegrace-node-restriction-pods"),
        ng.patch_status(&theirs, &realk8s::dry::patch(), &disruption(&their_uid))
            .await,
    );
    let kubelet_status = kubelet
        .patch_status(&theirs, &realk8s::dry::patch(), &disruption(&their_uid))
        .await;
    refused(
        "system:node:A marks B's pod a disruption target",
        By::NodeRestriction,
        kubelet_status,
    );

    accepted(
        "system:node:A evicts its own pod",
        kubelet.evict(&own, &dry_evict()).await,
    );
    refused(
        "system:node:A evicts B's pod",
        By::NodeRestriction,
        kubelet.evict(&theirs, &dry_evict()).await,
    );
    accepted(
        "system:node:A deletes its own pod",
        kubelet.delete(&own, &realk8s::dry::delete()).await,
    );
    refused(
        "system:node:A deletes B's pod",
        By::NodeRestriction,
        kubelet.delete(&theirs, &realk8s::dry::delete()).await,
    );
    c.cleanup().await;
}

/// Row "write B's Node": cordon, taint, label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_of_a_node_writes_another_node() {
    if !realk8s::enabled("realk8s_identity::no_credential_of_a_node_writes_another_node") {
        return;
    }
    let c = Cluster::new().await;
    let taint = json!({"spec": {"unschedulable": true, "taints": [
        {"key": "nodegrace.dev/maintenance", "effect": "NoSchedule"}]}});
    let label = json!({"metadata": {"labels": {"x": "y"}}});
    let ng: Api<Node> = Api::all(c.ng.clone());
    accepted(
        "nodegrace:node:A cordons and taints A",
        ng.patch(&c.a, &realk8s::dry::patch(), &Patch::Merge(&taint))
            .await,
    );
    for (what, patch) in [("cordons and taints", &taint), ("labels", &label)] {
        refused(
            &format!("nodegrace:node:A {what} B"),
            By::Policy("nodegrace-node-restriction-nodes"),
            ng.patch(&c.b, &realk8s::dry::patch(), &Patch::Merge(patch))
                .await,
        );
    }
    let kubelet: Api<Node> = Api::all(c.kubelet.clone());
    for (what, patch) in [("cordons and taints", &taint), ("labels", &label)] {
        refused(
            &format!("system:node:A {what} B"),
            By::NodeRestriction,
            kubelet
                .patch(&c.b, &realk8s::dry::patch(), &Patch::Merge(patch))
                .await,
        );
    }
    c.cleanup().await;
}

/// Waits until the admission policy `name`, maybe applied a moment ago, refuses `attempt`
/// (the apiserver's policy informers catch up within seconds), then checks the refusal.
async fn once_in_effect<T, F, Fut>(what: &str, name: &'static str, attempt: F)
where
    T: std::fmt::Debug,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while attempt().await.is_ok() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    refused(what, By::Policy(name), attempt().await);
}

/// Rows "EvictionRequests": node A's identity asks for evictions (`lifecycle.k8s.io`, the
/// tests' CRDs of the 1.37 API) only under its own requester key and labelled for itself,
/// withdraws its own, and leaves B's requests alone; it writes no request's status (that is
/// the cluster's evictionrequest-controller's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_of_a_node_requests_or_withdraws_under_another_nodes_key() {
    if !realk8s::enabled(
        "realk8s_identity::no_credential_of_a_node_requests_or_withdraws_under_another_nodes_key",
    ) {
        return;
    }
    let c = Cluster::new().await;
    let (a, b) = (c.a.clone(), c.b.clone());
    let (key_a, key_b) = (requester_key(&a), requester_key(&b));
    let ng: Api<LifecycleRequest> = Api::namespaced(c.ng.clone(), NS);
    let admin: Api<LifecycleRequest> = Api::namespaced(c.admin.clone(), NS);

    let own = c.lifecycle_request(&a, &key_a, Some(&a)).await;
    accepted(
        "nodegrace:node:A asks for its pod's eviction under its key, labelled for itself",
        ng.create(&realk8s::dry::post(), &own).await,
    );
    let with_b_key = c.lifecycle_request(&a, &key_b, Some(&a)).await;
    let post = realk8s::dry::post();
    once_in_effect("nodegrace:node:A asks under B's key", LC_REQUESTS, || {
        ng.create(&post, &with_b_key)
    })
    .await;
    for (what, request) in [
        (
            "labelled for B",
            c.lifecycle_request(&a, &key_a, Some(&b)).await,
        ),
        ("unlabelled", c.lifecycle_request(&a, &key_a, None).await),
        (
            "under the key someone.example/x",
            c.lifecycle_request(&a, "someone.example/x", Some(&a)).await,
        ),
        (
            "for B's pod under B's key labelled for B",
            c.lifecycle_request(&b, &key_b, Some(&b)).await,
        ),
    ] {
        refused(
            &format!("nodegrace:node:A asks for an eviction {what}"),
            By::Policy(LC_REQUESTS),
            ng.create(&realk8s::dry::post(), &request).await,
        );
    }
    let kubelet: Api<LifecycleRequest> = Api::namespaced(c.kubelet.clone(), NS);
    refused(
        "system:node:A makes a lifecycle EvictionRequest",
        By::Rbac,
        kubelet.create(&realk8s::dry::post(), &own).await,
    );

    // Requests as they stand: A's own and B's.
    let own = admin.create(&PostParams::default(), &own).await.unwrap();
    let theirs = c.lifecycle_request(&b, &key_b, Some(&b)).await;
    let theirs = admin.create(&PostParams::default(), &theirs).await.unwrap();
    let (own, theirs) = (own.name_any(), theirs.name_any());
    let withdraw = Patch::Merge(json!({"spec": {"intent": "Withdrawn"}}));
    accepted(
        "nodegrace:node:A withdraws its own request",
        ng.patch(&own, &realk8s::dry::patch(), &withdraw).await,
    );
    refused(
        "nodegrace:node:A withdraws B's request",
        By::Policy(LC_REQUESTS),
        ng.patch(&theirs, &realk8s::dry::patch(), &withdraw).await,
    );
    for (what, label) in [("to B", json!(b)), ("away", Value::Null)] {
        refused(
            &format!("nodegrace:node:A changes the label of its own request {what}"),
            By::Policy(LC_REQUESTS),
            ng.patch(
                &own,
                &realk8s::dry::patch(),
                &Patch::Merge(json!({"metadata": {"labels": {NODE_LABEL: label}}})),
            )
            .await,
        );
    }
    refused(
        "nodegrace:node:A labels B's request for itself",
        By::Policy(LC_REQUESTS),
        ng.patch(
            &theirs,
            &realk8s::dry::patch(),
            &Patch::Merge(json!({"metadata": {"labels": {NODE_LABEL: a}}})),
        )
        .await,
    );
    // delete is not granted (a request is withdrawn, and goes with its pod): RBAC refuses
    // A's own as well; the policy would refuse B's.
    refused(
        "nodegrace:node:A deletes B's request",
        By::Rbac,
        ng.delete(&theirs, &realk8s::dry::delete()).await,
    );

    // Status: the cluster's controllers write it, never a node.
    let status = Patch::Merge(json!({"status": {"conditions": [{
        "type": "Failed", "status": "True", "reason": "Set", "message": "x",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}));
    refused(
        "nodegrace:node:A writes the status of its own request",
        By::Rbac,
        ng.patch_status(&own, &realk8s::dry::patch(), &status).await,
    );
    refused(
        "nodegrace:node:A writes the status of B's request",
        By::Rbac,
        ng.patch_status(&theirs, &realk8s::dry::patch(), &status)
            .await,
    );

    // An admin is not a node: the same writes go through.
    accepted(
        "the admin withdraws B's request",
        admin
            .patch(&theirs, &realk8s::dry::patch(), &withdraw)
            .await,
    );
    accepted(
        "the admin relabels B's request",
        admin
            .patch(
                &theirs,
                &realk8s::dry::patch(),
                &Patch::Merge(json!({"metadata": {"labels": {NODE_LABEL: a}}})),
            )
            .await,
    );
    accepted(
        "the admin writes the status of B's request",
        admin
            .patch_status(&theirs, &realk8s::dry::patch(), &status)
            .await,
    );
    accepted(
        "the admin deletes B's request",
        admin.delete(&theirs, &realk8s::dry::delete()).await,
    );
    c.cleanup().await;
}

/// Rows "Evictions": node A's identity follows the Evictions (`lifecycle.k8s.io`) of its
/// requests and writes none, its own pod's or B's: the cluster's evictionrequest-controller
/// keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_of_a_node_writes_an_eviction() {
    if !realk8s::enabled("realk8s_identity::no_credential_of_a_node_writes_an_eviction") {
        return;
    }
    let c = Cluster::new().await;
    let (a, b) = (c.a.clone(), c.b.clone());
    let ng: Api<Eviction> = Api::namespaced(c.ng.clone(), NS);
    let admin: Api<Eviction> = Api::namespaced(c.admin.clone(), NS);
    let key_a = requester_key(&a);

    let own = c.eviction(&a, Some(&a)).await;
    let labelled_b = c.eviction(&b, Some(&b)).await;
    for (what, eviction) in [("its pod's", &own), ("B's pod's", &labelled_b)] {
        refused(
            &format!("nodegrace:node:A makes {what} Eviction"),
            By::Rbac,
            ng.create(&realk8s::dry::post(), eviction).await,
        );
    }
    let kubelet: Api<Eviction> = Api::namespaced(c.kubelet.clone(), NS);
    refused(
        "system:node:A makes an Eviction",
        By::Rbac,
        kubelet.create(&realk8s::dry::post(), &own).await,
    );

    let own = admin.create(&PostParams::default(), &own).await.unwrap();
    let theirs = admin
        .create(&PostParams::default(), &labelled_b)
        .await
        .unwrap();
    admin
        .patch(
            &own.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key_a.as_str(): "requester"}}})),
        )
        .await
        .unwrap();
    accepted(
        "nodegrace:node:A lists the Evictions labelled with its requester key",
        ng.list(&kube::api::ListParams::default().labels(&key_a))
            .await,
    );
    let (own, theirs) = (own.name_any(), theirs.name_any());
    // What a responder or the imperative evictor writes.
    let status = Patch::Merge(json!({"status": {
        "targetResponders": [{"name": "imperative-eviction.k8s.io/evictor",
                              "priority": 100, "state": "Active"}],
        "responders": [{"name": "imperative-eviction.k8s.io/evictor",
                        "startTime": "2026-01-01T00:00:00Z",
                        "heartbeatTime": "2026-01-01T00:00:00Z",
                        "message": "evicting"}],
    }}));
    let annotate = Patch::Merge(json!({"metadata": {"annotations": {"x": "y"}}}));
    for (whose, name) in [("its own", &own), ("B's", &theirs)] {
        refused(
            &format!("nodegrace:node:A writes the status of {whose} Eviction"),
            By::Rbac,
            ng.patch_status(name, &realk8s::dry::patch(), &status).await,
        );
        refused(
            &format!("nodegrace:node:A changes {whose} Eviction"),
            By::Rbac,
            ng.patch(name, &realk8s::dry::patch(), &annotate).await,
        );
        refused(
            &format!("nodegrace:node:A deletes {whose} Eviction"),
            By::Rbac,
            ng.delete(name, &realk8s::dry::delete()).await,
        );
    }
    accepted(
        "the admin writes the status of B's Eviction",
        admin
            .patch_status(&theirs, &realk8s::dry::patch(), &status)
            .await,
    );
    for name in [&own, &theirs] {
        let _ = admin.delete(name, &DeleteParams::default()).await;
    }
    c.cleanup().await;
}

/// Row "change a NodeMaintenance that does not select A": metadata, finalizer, spec,
/// aggregate status and B's entry. The same writes on a maintenance of A alone are the
/// control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_of_a_node_changes_another_nodes_maintenance() {
    if !realk8s::enabled(
        "realk8s_identity::no_credential_of_a_node_changes_another_nodes_maintenance",
    ) {
        return;
    }
    let mut c = Cluster::new().await;
    let (a, b) = (c.a.clone(), c.b.clone());
    let own = format!("own-{a}");
    let pinned =
        json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [a]}]});
    c.maintenance(&own, &a, pinned).await;
    let by_label = format!("by-label-{b}");
    let label_term = json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [b]}]});
    c.maintenance(&by_label, &b, label_term).await;
    let b_node = Api::<Node>::all(c.admin.clone()).get(&b).await.unwrap();

    let ng: Api<NodeMaintenance> = Api::all(c.ng.clone());
    let condition = |t: &str, s: &str| {
        json!({"type": t, "status": s, "reason": "Set", "message": "x",
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let mut b_entry = nodegrace::NodeMaintenanceNodeStatus::for_node(&b);
    b_entry.drain_message = "Completed".into();
    let writes: Vec<(&str, bool, Value)> = vec![
        (
            "labels",
            false,
            json!({"metadata": {"labels": {"team": "mine"}}}),
        ),
        (
            "annotations",
            false,
            json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        (
            "ownerReferences",
            false,
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                "name": b, "uid": b_node.uid().unwrap()}]}}),
        ),
        (
            "the finalizer",
            false,
            json!({"metadata": {"finalizers": null}}),
        ),
        ("the spec", false, json!({"spec": {"stage": "Complete"}})),
        (
            "drainStatus",
            true,
            json!({"status": {"drainStatus": {"drainMessage": "Drained",
                "podsPendingEvictionRequest": 0, "activeEvictionRequests": 0}}}),
        ),
        (
            "the Drained condition",
            true,
            json!({"status": {"conditions": [condition("Drained", "True")]}}),
        ),
        (
            "a stage beyond the current one",
            true,
            json!({"status": {"stageStatuses": [{"name": "Cordon"}, {"name": "Drain"}, {"name": "Complete"}]}}),
        ),
    ];
    for (what, status, patch) in &writes {
        let on = |name: &str| {
            let ng = ng.clone();
            let name = name.to_owned();
            let patch = patch.clone();
            async move {
                if *status {
                    ng.patch_status(&name, &realk8s::dry::patch(), &Patch::Merge(&patch))
                        .await
                } else {
                    ng.patch(&name, &realk8s::dry::patch(), &Patch::Merge(&patch))
                        .await
                }
            }
        };
        accepted(
            &format!("nodegrace:node:A writes {what} of its own maintenance"),
            on(&own).await,
        );
        refused(
            &format!("nodegrace:node:A writes {what} of a maintenance selecting B by label"),
            By::Policy(MAINTENANCES),
            on(&by_label).await,
        );
    }
    refused(
        "nodegrace:node:A writes B's status entry",
        By::Policy(MAINTENANCES),
        ng.patch_status(
            &by_label,
            &realk8s::dry::patch(),
            &Patch::Merge(json!({"status": {"nodeStatuses": [b_entry]}})),
        )
        .await,
    );
    refused(
        "nodegrace:node:A deletes a maintenance selecting B",
        By::Policy(MAINTENANCES),
        ng.delete(&by_label, &realk8s::dry::delete()).await,
    );
    let kubelet: Api<NodeMaintenance> = Api::all(c.kubelet.clone());
    refused(
        "system:node:A changes a maintenance",
        By::Rbac,
        kubelet
            .patch(
                &by_label,
                &realk8s::dry::patch(),
                &Patch::Merge(&writes[0].2),
            )
            .await,
    );
    refused(
        "system:node:A writes a maintenance's status",
        By::Rbac,
        kubelet
            .patch_status(
                &by_label,
                &realk8s::dry::patch(),
                &Patch::Merge(&writes[5].2),
            )
            .await,
    );
    c.cleanup().await;
}
