//! Real-control-plane tier: what a node's daemon asks the apiserver to send it. Every list
//! and watch it makes, read from the real apiserver's audit log through a boot and a
//! poweroff, is confined to its own node: the Node by name, the pods by `spec.nodeName`,
//! NodeMaintenances by the `nodegrace.dev/node` label (its own, or unlabelled), its
//! EvictionRequests (`lifecycle.k8s.io`, served here by the tests' CRDs) by its own label and
//! their Evictions by its requester key, and no VolumeAttachment at all.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

mod real;
mod realk8s;

use std::time::Duration;

use kube::api::PostParams;
use kube::{Api, ResourceExt};
use nodegrace::{shutdown_maintenance_name, NodeMaintenance, NODE_LABEL};
use realk8s::audit::Request;
use realk8s::fixture::*;
use realk8s::workload::{self, PodShape};
use serde_json::json;

/// The decoded query parameter `name` of a request URI.
fn param(uri: &str, name: &str) -> Option<String> {
    let query = uri.split_once('?')?.1;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a list or watch of the daemon is confined to, or None when it would bring every
/// object of its kind in the cluster.
fn confinement(r: &Request, node: &str) -> Option<String> {
    let fields = param(&r.uri, "fieldSelector").unwrap_or_default();
    let labels = param(&r.uri, "labelSelector").unwrap_or_default();
    let own_label = format!("{NODE_LABEL}={node}");
    let unlabelled = format!("!{NODE_LABEL}");
    let ok = match (r.api_group.as_str(), r.resource.as_str()) {
        ("", "nodes") => fields == format!("metadata.name={node}"),
        ("", "pods") => fields == format!("spec.nodeName={node}"),
        // The budget blocking one of its pods, in that pod's namespace.
        ("policy", "poddisruptionbudgets") => !r.namespace.is_empty(),
        ("nodegrace.dev", "nodemaintenances") => labels == own_label || labels == unlabelled,
        // The requester's own requests, and the Evictions the cluster's controller labels
        // with its key.
        ("lifecycle.k8s.io", "evictionrequests") => labels == own_label,
        ("lifecycle.k8s.io", "evictions") => labels == nodegrace::lifecycle::requester_key(node),
        // The reboot waves: a few cluster-wide policies, and which selects the node is known
        // only by reading them. Said as it is, not as a selector.
        ("nodegrace.dev", "rebootwaves") if fields.is_empty() && labels.is_empty() => {
            return Some("every RebootWave (a node cannot tell which selects it)".into())
        }
        _ => false,
    };
    ok.then(|| format!("{fields}{labels}"))
}

/// A node booted, idle, then powered off with its pods drained, beside another node's
/// shutdown maintenance, on a cluster serving `lifecycle.k8s.io`: each of the daemon's lists and
/// watches carries its node's selector, and its own shutdown maintenance carries the label
/// that keeps it out of every other node's watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lists_and_watches_only_what_concerns_it() {
    if !realk8s::enabled("realk8s_watches::a_node_lists_and_watches_only_what_concerns_it") {
        return;
    }
    let mut f = Fixture::new("ng-watch").await;
    let (admin, ns, node) = (f.admin.clone(), f.name.clone(), f.name.clone());
    // Another node's shutdown maintenance, as its daemon labels it: never this node's.
    let other = realk8s::unique("ng-watch-other");
    let foreign: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": shutdown_maintenance_name(&other), "labels": {NODE_LABEL: other}},
        "spec": {"nodeSelector": nodegrace::node_selector_for(&other), "stage": "Drain"},
    }))
    .expect("maintenance");
    let nms: Api<NodeMaintenance> = Api::all(admin.clone());
    nms.create(&PostParams::default(), &foreign)
        .await
        .expect("another node's maintenance");
    workload::deployment(
        &admin,
        &ns,
        &node,
        3,
        PodShape::new("web").exits_after_ms(200),
    )
    .await;
    f.kubelet.wait_running(3).await;
    f.node.boot();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let down = f.node.shutdown("poweroff", Duration::from_secs(120));

    let requests = f.requests();
    let evictions = requests
        .iter()
        .filter(|r| r.verb == "create" && r.subresource == "eviction" && r.code == 201)
        .count();
    assert_eq!(
        evictions,
        3,
        "the drain evicts the 3 pods:\n{}",
        down.journal_text()
    );
    let reads: Vec<&Request> = requests
        .iter()
        .filter(|r| r.verb == "list" || r.verb == "watch")
        .collect();
    for r in &reads {
        println!(
            "{:<40} {}",
            r.kind(),
            confinement(r, &node).unwrap_or_else(|| "(every object)".into())
        );
    }
    let unconfined: Vec<String> = reads
        .iter()
        .filter(|r| confinement(r, &node).is_none())
        .map(|r| format!("{} {}", r.kind(), r.uri))
        .collect();
    assert!(
        unconfined.is_empty(),
        "lists and watches not confined to node {node}:\n{}",
        unconfined.join("\n")
    );
    let own = format!("{NODE_LABEL}={node}");
    for (group, resource, selectors) in [
        (
            "nodegrace.dev",
            "nodemaintenances",
            vec![own.clone(), format!("!{NODE_LABEL}")],
        ),
        ("lifecycle.k8s.io", "evictionrequests", vec![own.clone()]),
        (
            "lifecycle.k8s.io",
            "evictions",
            vec![nodegrace::lifecycle::requester_key(&node)],
        ),
    ] {
        let watched: Vec<String> = reads
            .iter()
            .filter(|r| r.is_watch() && r.api_group == group && r.resource == resource)
            .filter_map(|r| param(&r.uri, "labelSelector"))
            .collect();
        for selector in selectors {
            assert!(
                watched.contains(&selector),
                "no watch of {group}/{resource} with {selector}: {watched:?}"
            );
        }
    }
    let volumes: Vec<String> = requests
        .iter()
        .filter(|r| r.resource == "volumeattachments")
        .map(|r| r.uri.clone())
        .collect();
    assert!(volumes.is_empty(), "VolumeAttachments read: {volumes:?}");
    let foreign_reads: Vec<String> = requests
        .iter()
        .filter(|r| r.name == foreign.name_any())
        .map(|r| format!("{} {}", r.kind(), r.uri))
        .collect();
    assert!(
        foreign_reads.is_empty(),
        "another node's maintenance read: {foreign_reads:?}"
    );

    let own = nms
        .get(&shutdown_maintenance_name(&node))
        .await
        .expect("the shutdown maintenance");
    assert_eq!(
        own.labels().get(NODE_LABEL),
        Some(&node),
        "the shutdown maintenance is labelled for its node"
    );
    let _ = nms
        .patch(
            &foreign.name_any(),
            &Default::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
    let _ = nms.delete(&foreign.name_any(), &Default::default()).await;
    f.cleanup().await;
}

/// The Node's volumes as the real attach-detach controller reports them: a pod on the node
/// with a CSI volume (the test plays the CSI external attacher and the kubelet's
/// `volumesInUse`). At poweroff the daemon releases its inhibitor only once the volume is no
/// longer in use and the controller has taken it off `volumesAttached`: not when the pod is
/// gone, and well before `drain.volume_detach_timeout` (20 s shipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poweroff_waits_for_the_nodes_volumes_as_the_node_reports_them() {
    if !realk8s::enabled(
        "realk8s_watches::poweroff_waits_for_the_nodes_volumes_as_the_node_reports_them",
    ) {
        return;
    }
    use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::api::{Patch, PatchParams};

    let mut f = Fixture::new("ng-vol").await;
    let (admin, ns, node) = (f.admin.clone(), f.name.clone(), f.name.clone());
    let nodes: Api<Node> = Api::all(admin.clone());
    // The kubelet sets this on registration when the controller attaches its volumes.
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}})),
        )
        .await
        .expect("annotate node");
    let pv_name = format!("pv-{node}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "csi": {"driver": "volumes.test.nodegrace.dev", "volumeHandle": format!("h-{node}")}},
    }))
    .expect("pv");
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    pvs.create(&PostParams::default(), &pv).await.expect("pv");
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .expect("pvc");
    Api::<PersistentVolumeClaim>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &pvc)
        .await
        .expect("pvc");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "c", "image": "registry.invalid/db:1"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
    }))
    .expect("pod");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod");
    f.kubelet.wait_running(1).await;

    // The external attacher: the controller's VolumeAttachment is attached.
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    let volume = loop {
        let list = vas
            .list(&Default::default())
            .await
            .expect("list VolumeAttachments");
        if let Some(va) = list.items.iter().find(|v| v.spec.node_name == node) {
            vas.patch_status(
                &va.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"attached": true}})),
            )
            .await
            .expect("attach");
            break format!("kubernetes.io/csi/volumes.test.nodegrace.dev^h-{node}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The kubelet: mounted, in use.
    nodes
        .patch_status(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumesInUse": [volume]}})),
        )
        .await
        .expect("volumesInUse");
    let attached = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.volumes_attached.as_ref())
            .is_some_and(|v| !v.is_empty())
    };
    wait_node(
        &admin,
        &node,
        "the controller reports the volume attached",
        attached,
    )
    .await;
    f.node.boot_connected();

    // Once the pod is gone, the kubelet unmounts after 3 s; then the controller detaches.
    let unmount = {
        let (pods, nodes) = (pods.clone(), nodes.clone());
        let node = node.clone();
        tokio::spawn(async move {
            while pods.get_opt("db").await.ok().flatten().is_some() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let gone = realk8s::now_unix();
            tokio::time::sleep(Duration::from_secs(3)).await;
            let unmounted = realk8s::now_unix();
            nodes
                .patch_status(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"volumesInUse": null}})),
                )
                .await
                .expect("unmount");
            (gone, unmounted)
        })
    };
    let c = tokio::task::block_in_place(|| f.node.shutdown("poweroff", Duration::from_secs(120)));
    let (_, release) = signal_and_release(&c);
    let (gone, unmounted) = unmount.await.expect("unmount task");
    println!(
        "pod gone at +0, unmounted at +{:.2} s, released at +{:.2} s",
        unmounted - gone,
        release - gone
    );
    assert!(
        release >= unmounted,
        "released {:.2} s before the volume was unmounted:\n{}",
        unmounted - release,
        c.journal_text()
    );
    assert!(
        release - unmounted < 10.0,
        "released {:.2} s after the unmount: the controller's detach was not seen",
        release - unmounted
    );
    let after = nodes.get(&node).await.expect("node");
    assert!(!attached(&after), "the controller still reports the volume");
    let _ = pvs.delete(&pv_name, &Default::default()).await;
    f.cleanup().await;
}
