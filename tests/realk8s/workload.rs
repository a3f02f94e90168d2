//! Workloads for a test node, created as an operator would (Deployments, DaemonSets,
//! PodDisruptionBudgets, static pod manifests) and pinned to the node with a
//! `kubernetes.io/hostname` node selector, since every test's node shares the cluster.

use std::path::Path;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::kubelet::EXIT_AFTER_ANNOTATION;

/// A pod template for `node`, labelled `app=<app>`.
pub struct PodShape<'a> {
    pub app: &'a str,
    pub priority_class: Option<&'a str>,
    /// How long the pod takes to exit once asked to (the kubelet stand-in plays it).
    pub exit_after_ms: u64,
    pub grace_seconds: i64,
    /// An eviction responder the pod declares (priority 10000, what a managing controller
    /// uses), by name: `spec.evictionResponders` as 1.37 serves it, which v1.28 drops, so
    /// written in [`super::lifecycle::RESPONDERS_ANNOTATION`] (see
    /// [`super::responders_proxy`]).
    pub responder: Option<&'a str>,
    /// For a real kubelet ([`super::real_kubelet`]): a busybox container that exits
    /// `exit_after_ms` after SIGTERM (so the kubelet kills it at its grace period when that
    /// is shorter), on the host's network, from the locally imported image.
    pub real: bool,
    /// Runs on any node labelled [`POOL_LABEL`]`=<pool>` instead of only on the test's node,
    /// so that replacements can be scheduled elsewhere.
    pub pool: Option<&'a str>,
}

/// The node label of [`PodShape::in_pool`].
pub const POOL_LABEL: &str = "nodegrace.test/pool";

impl<'a> PodShape<'a> {
    pub fn new(app: &'a str) -> Self {
        PodShape {
            app,
            priority_class: None,
            exit_after_ms: 300,
            grace_seconds: 30,
            responder: None,
            real: false,
            pool: None,
        }
    }

    /// A pod the real kubelet runs (see [`PodShape::real`]).
    pub fn on_real_kubelet(mut self) -> Self {
        self.real = true;
        self
    }

    /// Declares the responder `name`: the pod's Eviction waits for it before the imperative
    /// evictor calls the Eviction API.
    pub fn responded_by(mut self, name: &'a str) -> Self {
        self.responder = Some(name);
        self
    }

    pub fn in_pool(mut self, pool: &'a str) -> Self {
        self.pool = Some(pool);
        self
    }

    pub fn priority(mut self, class: &'a str) -> Self {
        self.priority_class = Some(class);
        self
    }

    pub fn exits_after_ms(mut self, ms: u64) -> Self {
        self.exit_after_ms = ms;
        self
    }

    pub fn grace(mut self, seconds: i64) -> Self {
        self.grace_seconds = seconds;
        self
    }

    fn template(&self, node: &str) -> Value {
        let mut spec = json!({
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": self.grace_seconds,
            "containers": [{"name": "main", "image": "registry.invalid/nodegrace-test:1"}],
        });
        if let Some(pool) = self.pool {
            spec["nodeSelector"] = json!({POOL_LABEL: pool});
        }
        if let Some(class) = self.priority_class {
            spec["priorityClassName"] = json!(class);
        }
        if self.real {
            let on_term = format!(
                "sleep {}.{:03}; exit 0",
                self.exit_after_ms / 1000,
                self.exit_after_ms % 1000
            );
            spec["hostNetwork"] = json!(true);
            spec["automountServiceAccountToken"] = json!(false);
            // A volume the kubelet mounts (tmpfs) and unmounts before it deletes the pod.
            spec["volumes"] = json!([{"name": "scratch", "emptyDir": {"medium": "Memory"}}]);
            spec["containers"] = json!([{
                "name": "main",
                "image": super::real_kubelet::IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", format!(
                    "trap '{on_term}' TERM; while :; do sleep 1 & wait $!; done")],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }]);
        }
        let mut annotations = json!({EXIT_AFTER_ANNOTATION: self.exit_after_ms.to_string()});
        if let Some(name) = self.responder {
            annotations[super::lifecycle::RESPONDERS_ANNOTATION] =
                json!(json!([{"name": name, "priority": 10000}]).to_string());
        }
        json!({
            "metadata": {"labels": {"app": self.app}, "annotations": annotations},
            "spec": spec,
        })
    }
}

pub async fn create_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    api.create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

pub async fn delete_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
}

pub async fn deployment(client: &Client, ns: &str, node: &str, replicas: i32, shape: PodShape<'_>) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": shape.app},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": shape.app}},
            "template": shape.template(node),
        },
    }))
    .expect("deployment");
    api.create(&PostParams::default(), &d)
        .await
        .unwrap_or_else(|e| panic!("creating deployment {}: {e}", shape.app));
}

/// A one-pod Job on `node` that may not fail (backoffLimit 0) but whose podFailurePolicy
/// ignores disruptions (a pod with the DisruptionTarget condition), as batch users set it.
pub async fn job(client: &Client, ns: &str, node: &str, shape: PodShape<'_>) {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    let mut template = shape.template(node);
    template["spec"]["restartPolicy"] = json!("Never");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": shape.app},
        "spec": {
            "backoffLimit": 0,
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
            "template": template,
        },
    }))
    .expect("job");
    api.create(&PostParams::default(), &job)
        .await
        .unwrap_or_else(|e| panic!("creating job {}: {e}", shape.app));
}

/// A DaemonSet on `node`; `tolerate_all` adds `{operator: Exists}` (a CNI-like agent that
/// runs on every node whatever its taints).
pub async fn daemonset(
    client: &Client,
    ns: &str,
    node: &str,
    tolerate_all: bool,
    shape: PodShape<'_>,
) {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let mut template = shape.template(node);
    if tolerate_all {
        template["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    }
    let d: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": shape.app},
        "spec": {
            "selector": {"matchLabels": {"app": shape.app}},
            "template": template,
        },
    }))
    .expect("daemonset");
    api.create(&PostParams::default(), &d)
        .await
        .unwrap_or_else(|e| panic!("creating daemonset {}: {e}", shape.app));
}

/// A bare pod `name` bound to `node` by `spec.nodeName`, as a controller whose scheduler
/// cache still shows the node schedulable binds one (a cordon does not stop it).
pub async fn bound_pod(client: &Client, ns: &str, node: &str, name: &str, shape: PodShape<'_>) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut pod = shape.template(node);
    pod["metadata"]["name"] = json!(name);
    if let Some(spec) = pod["spec"].as_object_mut() {
        spec.remove("nodeSelector");
        spec.insert("nodeName".into(), json!(node));
    }
    let pod: Pod = serde_json::from_value(pod).expect("pod");
    api.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
}

/// Puts `node` in `pool` (see [`PodShape::in_pool`]).
pub async fn join_pool(client: &Client, node: &str, pool: &str) {
    let api: Api<Node> = Api::all(client.clone());
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {POOL_LABEL: pool}}})),
    )
    .await
    .unwrap_or_else(|e| panic!("labelling node {node}: {e}"));
}

/// A PodDisruptionBudget `app` that keeps `min_available` of its pods.
pub async fn pdb(client: &Client, ns: &str, app: &str, min_available: i32) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": app},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    }))
    .expect("pdb");
    api.create(&PostParams::default(), &pdb)
        .await
        .unwrap_or_else(|e| panic!("creating PodDisruptionBudget {app}: {e}"));
}

/// A PodDisruptionBudget that allows no disruption of `app`'s single replica.
pub async fn blocking_pdb(client: &Client, ns: &str, app: &str) {
    pdb(client, ns, app, 1).await;
}

/// Waits until the disruption controller has computed `app`'s budget (no disruption
/// allowed while its pod is healthy).
pub async fn wait_pdb_blocking(client: &Client, ns: &str, app: &str) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    for _ in 0..300 {
        if let Ok(pdb) = api.get(app).await {
            if let Some(status) = pdb.status {
                if status.current_healthy.unwrap_or(0) >= 1
                    && status.disruptions_allowed.unwrap_or(0) == 0
                {
                    return;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("PodDisruptionBudget {ns}/{app} never became blocking");
}

/// Writes a static pod manifest into the node's manifest directory (host path).
pub fn static_pod(dir: &Path, ns: &str, shape: PodShape<'_>) {
    let mut pod = shape.template("");
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    pod["metadata"]["name"] = json!(shape.app);
    pod["metadata"]["namespace"] = json!(ns);
    pod["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("nodeSelector");
    pod["spec"]["priorityClassName"] = json!("system-node-critical");
    let path = dir.join(format!("{}.yaml", shape.app));
    std::fs::write(&path, serde_yaml::to_string(&pod).expect("manifest yaml"))
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
