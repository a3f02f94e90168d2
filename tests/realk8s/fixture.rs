//! One node of the real cluster with its kubelet stand-in, and what tests read back.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use nodegrace::NodeMaintenance;

use super::audit::{self, Request};
use super::kubelet::Kubelet;
use super::node::TestNode;
use super::{workload, ControlPlane};
use crate::real;

pub fn app_of(pod: &Pod) -> String {
    pod.labels().get("app").cloned().unwrap_or_default()
}

/// One node of the real cluster with its kubelet stand-in and a namespace for its pods.
pub struct Fixture {
    pub cp: &'static ControlPlane,
    pub admin: Client,
    pub name: String,
    pub node: TestNode,
    pub kubelet: Kubelet,
    pub started: f64,
}

impl Fixture {
    /// Pods in every band of the shipped drain plan, one replica held by its budget: `web`
    /// (2 replicas), `db` (1, a PodDisruptionBudget that allows no disruption), `crit`
    /// (system-cluster-critical), the DaemonSet pod `agent` and the static pod `etcd`.
    /// Returns once all 6 run and the budget blocks.
    pub async fn every_band_one_blocked(&self) {
        let (c, ns, node) = (&self.admin, self.name.as_str(), self.name.as_str());
        workload::deployment(c, ns, node, 2, workload::PodShape::new("web")).await;
        workload::deployment(c, ns, node, 1, workload::PodShape::new("db")).await;
        workload::blocking_pdb(c, ns, "db").await;
        workload::deployment(
            c,
            ns,
            node,
            1,
            workload::PodShape::new("crit").priority("system-cluster-critical"),
        )
        .await;
        workload::daemonset(c, ns, node, false, workload::PodShape::new("agent")).await;
        workload::static_pod(&self.node.manifests, ns, workload::PodShape::new("etcd"));
        self.kubelet.wait_running(6).await;
        workload::wait_pdb_blocking(c, ns, "db").await;
    }

    pub async fn new(prefix: &str) -> Fixture {
        Fixture::with_node(prefix, None).await
    }

    /// A fixture whose node boots `debian` from its own root ([`TestNode::on`]).
    pub async fn on(prefix: &str, debian: real::Debian) -> Fixture {
        Fixture::with_node(prefix, Some(debian)).await
    }

    async fn with_node(prefix: &str, debian: Option<real::Debian>) -> Fixture {
        let cp = tokio::task::spawn_blocking(|| {
            let cp = super::control_plane();
            cp.ensure_running();
            cp
        })
        .await
        .expect("control plane");
        let started = super::now_unix();
        let admin = cp.admin().await;
        let name = super::unique(prefix);
        workload::create_namespace(&admin, &name).await;
        let (identity, kubelet_identity) =
            (cp.nodegrace_identity(&name), cp.kubelet_identity(&name));
        let node = match debian {
            Some(debian) => TestNode::on(debian, &name, identity, kubelet_identity),
            None => TestNode::new(&name, identity, kubelet_identity),
        };
        let kubelet = Kubelet::start(
            &cp.kubelet_identity(&name),
            &name,
            Some(node.manifests.clone()),
        )
        .await;
        Fixture {
            cp,
            admin,
            name,
            node,
            kubelet,
            started,
        }
    }

    /// The kubelet stand-in as at the node's next boot: a new one, the old one stopped.
    pub async fn restart_kubelet(&mut self) {
        self.kubelet.stop();
        self.kubelet = Kubelet::start(
            &self.cp.kubelet_identity(&self.name),
            &self.name,
            Some(self.node.manifests.clone()),
        )
        .await;
    }

    pub fn user(&self) -> String {
        format!("nodegrace:node:{}", self.name)
    }

    /// nodegrace's requests since the fixture was made, under its own identity and (pod
    /// writes) under the kubelet's, which the kubelet stand-in also uses.
    pub fn requests(&self) -> Vec<Request> {
        nodegrace_requests(self.cp, &self.name, self.started)
    }

    pub async fn cleanup(&self) {
        cleanup_node(&self.admin, &self.name).await;
    }
}

/// Removes what a test made for node `name`: its maintenances (finalizers dropped), its
/// namespace and its Node.
pub async fn cleanup_node(admin: &Client, name: &str) {
    let nms: Api<NodeMaintenance> = Api::all(admin.clone());
    for m in nms
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        if m.name_any().contains(name) {
            let _ = nms
                .patch(
                    &m.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
                )
                .await;
            let _ = nms.delete(&m.name_any(), &DeleteParams::default()).await;
        }
    }
    workload::delete_namespace(admin, name).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let _ = nodes.delete(name, &DeleteParams::default()).await;
}

/// nodegrace's requests on node `node` since `since` (Unix seconds), under its own identity
/// and (pod writes) under the kubelet's, in the order the apiserver received them.
pub fn nodegrace_requests(cp: &ControlPlane, node: &str, since: f64) -> Vec<Request> {
    let log = cp.audit_log();
    let mut all = audit::requests_of(&log, &format!("nodegrace:node:{node}"), since);
    all.extend(
        audit::requests_of(&log, &format!("system:node:{node}"), since)
            .into_iter()
            .filter(|r| r.user_agent.starts_with("nodegrace/")),
    );
    all.sort_by(|a, b| a.received.total_cmp(&b.received));
    all
}

/// Waits (60 s) until maintenance `name` is Complete and its finalizer gone; returns the
/// offline fallback's report it carries.
pub async fn completed_with_fallback_report(c: &Client, name: &str) -> serde_json::Value {
    let m = wait_maintenance(
        c,
        name,
        "recorded and completed",
        Duration::from_secs(60),
        |m| m.spec.stage == nodegrace::Stage::Complete && !has_finalizer(m),
    )
    .await;
    serde_json::from_str(
        m.annotations()
            .get("nodegrace.dev/fallback-report")
            .expect("the fallback report"),
    )
    .expect("report JSON")
}

/// When logind announced the poweroff, and when nodegrace released its inhibitor.
pub fn signal_and_release(c: &real::Container) -> (f64, f64) {
    let logind = c.journal_of("systemd-logind");
    let signal = real::first_with(&logind, "The system will power off now")
        .unwrap_or_else(|| panic!("logind never announced the poweroff:\n{}", c.journal_text()))
        .time;
    let ours = c.journal_of("nodegrace");
    let release = ours
        .iter()
        .find(|l| l.contains("phase change") && l.field("PHASE") == Some("Released"))
        .unwrap_or_else(|| panic!("nodegrace never released:\n{}", c.journal_text()))
        .time;
    (signal, release)
}

pub fn evictions<'a>(reqs: &'a [Request], pod: &str) -> Vec<&'a Request> {
    reqs.iter()
        .filter(|r| r.verb == "create" && r.resource == "pods" && r.subresource == "eviction")
        .filter(|r| r.name == pod)
        .collect()
}

pub fn deletes<'a>(reqs: &'a [Request], pod: &str) -> Vec<&'a Request> {
    reqs.iter()
        .filter(|r| r.verb == "delete" && r.resource == "pods" && r.subresource.is_empty())
        .filter(|r| r.name == pod)
        .collect()
}

/// Asserts that every DELETE of `pod` came right after an admitted patch of its status (the
/// DisruptionTarget condition a DELETE does not add itself).
pub fn assert_marked_before_deletes(reqs: &[Request], pod: &str) {
    for del in deletes(reqs, pod) {
        let marked = reqs.iter().any(|r| {
            r.verb == "patch"
                && r.resource == "pods"
                && r.subresource == "status"
                && r.name == pod
                && r.code == 200
                && r.completed <= del.received
        });
        assert!(
            marked,
            "{pod} deleted without a DisruptionTarget condition first"
        );
    }
}

/// Waits (polling the apiserver) until `check` holds for the NodeMaintenance `name`.
pub async fn wait_maintenance(
    admin: &Client,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&NodeMaintenance) -> bool,
) -> NodeMaintenance {
    let api: Api<NodeMaintenance> = Api::all(admin.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(Some(m)) = api.get_opt(name).await {
            if check(&m) {
                return m;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("NodeMaintenance {name}: timed out after {timeout:?} waiting for {what}: {m:#?}");
            }
        } else if tokio::time::Instant::now() >= deadline {
            panic!("NodeMaintenance {name}: timed out after {timeout:?} waiting for {what}: it does not exist");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `check` holds for the Node.
pub async fn wait_node(
    admin: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&Node) -> bool,
) -> Node {
    let api: Api<Node> = Api::all(admin.clone());
    for _ in 0..300 {
        // An apiserver another test restarts answers again within seconds.
        if let Ok(node) = api.get(name).await {
            if check(&node) {
                return node;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("node {name}: timed out waiting for {what}");
}

pub fn cordoned(n: &Node) -> bool {
    n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

pub fn maintenance_tainted(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == "nodegrace.dev/maintenance"))
}

pub fn has_finalizer(m: &NodeMaintenance) -> bool {
    m.finalizers()
        .iter()
        .any(|f| f == nodegrace::FINALIZER_MAINTENANCE_COMPLETION)
}

/// Waits until the Job `name` has a pod whose UID is not among `originals`, then checks
/// that the Job neither failed nor counted a failure: its podFailurePolicy ignores
/// DisruptionTarget, so a pod disrupted by the shutdown is replaced, not held against
/// backoffLimit 0.
pub async fn assert_job_replaced_its_disrupted_pod(
    c: &Client,
    ns: &str,
    name: &str,
    originals: &[String],
) {
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(c.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let selector = kube::api::ListParams::default().labels(&format!("job-name={name}"));
    let failed = |job: &k8s_openapi::api::batch::v1::Job| {
        job.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "Failed" && c.status == "True")
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let job = loop {
        let job = jobs.get(name).await.expect("the Job");
        let replaced = pods
            .list(&selector)
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .any(|p| !originals.contains(&p.uid().unwrap_or_default()));
        if failed(&job) || replaced {
            break job;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Job did not replace its disrupted pod: {:?}",
            job.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let status = job.status.clone().unwrap_or_default();
    assert!(
        !failed(&job),
        "the Job failed on a disrupted pod: {status:?}"
    );
    assert_eq!(status.failed.unwrap_or(0), 0, "{status:?}");
}
