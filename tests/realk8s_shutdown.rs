//! Real-control-plane tier: nodegrace installed as the package installs it (shipped config,
//! unit, CRDs, ClusterRole, admission policy; its own per-node identity), on a booted
//! Debian node with real systemd-logind, against a real kube-apiserver, controller-manager
//! (ReplicaSet, DaemonSet, disruption, garbage collector) and scheduler, with a kubelet
//! stand-in playing the node's kubelet. What is asserted comes from the apiserver's audit
//! log, the objects it holds, the kubelet's record of each pod and the node's journal.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

mod real;
mod realk8s;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use nodegrace::NodeMaintenance;
use real::Debian;
use realk8s::audit;
use realk8s::fixture::*;
use realk8s::kubelet::PodRecord;
use realk8s::workload::{self, PodShape};

/// The shutdown budget of the escalation test. The shipped 15 minutes would put the
/// escalation of a blocked first band near 13.5 minutes; with 110 s the drain plan's
/// reserves (30 s each for critical, DaemonSet and static pods) leave 20 s to the first
/// band, whose escalation comes at 10 s (half its share, as the grace periods are longer).
/// This drop-in is the only change to the shipped configuration.
const BUDGET_SECS: u32 = 110;
const FIRST_BAND_ESCALATION: f64 = 10.0;
const FIRST_BAND_END: f64 = 20.0;

/// Each workload's band in the shipped drain plan: Default pods up to priority 1e9, up to
/// 2e9 (system-cluster-critical), up to 2000001000 (system-node-critical), DaemonSet pods,
/// static pods.
const BANDS: &[(&str, usize)] = &[
    ("web", 0),
    ("db", 0),
    ("batch", 0),
    ("crit", 1),
    ("nodecrit", 2),
    ("agent", 3),
    ("cni", 3),
    ("etcd", 4),
];

fn band_of(app: &str) -> usize {
    BANDS
        .iter()
        .find(|(a, _)| *a == app)
        .map(|(_, b)| *b)
        .unwrap_or_else(|| panic!("no band for {app}"))
}

/// Deployments in three bands (one blocked by a PodDisruptionBudget), two DaemonSets
/// (one tolerating every taint) and a static pod; returns once all run.
async fn workloads(f: &Fixture) {
    let (c, ns, node) = (&f.admin, f.name.as_str(), f.name.as_str());
    workload::deployment(c, ns, node, 3, PodShape::new("web").exits_after_ms(800)).await;
    workload::deployment(c, ns, node, 1, PodShape::new("db").exits_after_ms(500)).await;
    workload::blocking_pdb(c, ns, "db").await;
    workload::job(c, ns, node, PodShape::new("batch").exits_after_ms(500)).await;
    workload::blocking_pdb(c, ns, "batch").await;
    workload::deployment(
        c,
        ns,
        node,
        2,
        PodShape::new("crit").priority("system-cluster-critical"),
    )
    .await;
    workload::deployment(
        c,
        ns,
        node,
        1,
        PodShape::new("nodecrit").priority("system-node-critical"),
    )
    .await;
    workload::daemonset(c, ns, node, false, PodShape::new("agent")).await;
    workload::daemonset(c, ns, node, true, PodShape::new("cni")).await;
    workload::static_pod(
        &f.node.manifests,
        ns,
        PodShape::new("etcd").exits_after_ms(300),
    );
    f.kubelet
        .wait_for(
            "11 pods running",
            Duration::from_secs(90),
            |records, live| {
                live.len() == 11
                    && live.iter().all(|p| {
                        records.iter().any(|r| {
                            Some(r.uid.as_str()) == p.metadata.uid.as_deref()
                                && r.running_at.is_some()
                        })
                    })
            },
        )
        .await;
    workload::wait_pdb_blocking(c, ns, "db").await;
    workload::wait_pdb_blocking(c, ns, "batch").await;
}

/// The running daemon holds one connection per identity (nodegrace's and the kubelet's),
/// each carrying all its watches and requests over HTTP/2, over two seconds of sampling.
async fn assert_one_connection_per_identity(f: &Fixture) {
    let pid = f.node.nodegrace_pid();
    let mut most = 0;
    for _ in 0..20 {
        most = most.max(real::tcp_connections(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        (1..=2).contains(&most),
        "nodegrace held up to {most} TCP connections to the apiserver (one per identity expected)"
    );
}

/// The node's condition `type_` as (status, reason).
fn condition_of(n: &Node, type_: &str) -> Option<(String, String)> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn says(n: &Node, type_: &str, status: &str, reason: &str) -> bool {
    condition_of(n, type_) == Some((status.to_string(), reason.to_string()))
}

/// nodegrace's writes of its Node's status (the lifecycle conditions), but for those the
/// apiserver refused as written over a newer copy (409: a kubelet heartbeat in between;
/// written again after a read).
fn status_writes(reqs: &[audit::Request]) -> Vec<&audit::Request> {
    reqs.iter()
        .filter(|r| r.verb == "patch" && r.resource == "nodes" && r.subresource == "status")
        .filter(|r| r.code != 409)
        .collect()
}

/// When the apiserver received the first eviction or pod DELETE among `reqs`.
fn first_pod_request(reqs: &[audit::Request]) -> f64 {
    reqs.iter()
        .filter(|r| r.resource == "pods" && (r.subresource == "eviction" || r.verb == "delete"))
        .map(|r| r.received)
        .fold(f64::INFINITY, f64::min)
}

fn skip(test: &str) -> bool {
    if !realk8s::enabled(&format!("realk8s_shutdown::{test}")) {
        return true;
    }
    real::require_prerequisites();
    false
}

/// `systemctl poweroff` on a node with pods in every band: band order, evictions (not
/// DELETEs) for every pod nothing blocks, one escalation for the PodDisruptionBudget's pod
/// inside its window, the tolerate-all DaemonSet pod terminated once and not chased, the
/// inhibitor released right after the last pod is gone, `GracefulNodeShutdownInProgress` and
/// `DrainInProgress` in one status write before the first eviction, and every request
/// allowed by the shipped ClusterRole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poweroff_drains_every_band_in_order_through_evictions() {
    if skip("poweroff_drains_every_band_in_order_through_evictions") {
        return;
    }
    poweroff_drains_every_band(Fixture::new("ng-off").await).await;
}

/// The same on Debian 13 (systemd 257, whose logind names the shutdown in
/// `PrepareForShutdownWithMetadata`), the node carrying everything in its own root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_debian_13_poweroff_drains_every_band_in_order_through_evictions() {
    if skip("on_debian_13_poweroff_drains_every_band_in_order_through_evictions") {
        return;
    }
    poweroff_drains_every_band(Fixture::on("ng-off13", Debian::Trixie).await).await;
}

async fn poweroff_drains_every_band(mut f: Fixture) {
    f.node.config_dropins.push((
        "50-budget.toml".into(),
        format!("[shutdown]\nmax_delay = \"{BUDGET_SECS}s\"\n"),
    ));
    workloads(&f).await;
    f.node.boot();
    // The pods as they were when the shutdown began (their replacements come later).
    let originals: HashMap<String, Arc<Pod>> = f
        .kubelet
        .live_pods()
        .into_iter()
        .map(|p| (p.uid().unwrap_or_default(), p))
        .collect();
    assert_eq!(originals.len(), 11);
    assert_one_connection_per_identity(&f).await;
    let c = f
        .node
        .shutdown("poweroff", Duration::from_secs(BUDGET_SECS as u64 + 30));
    let (signal, release) = signal_and_release(&c);
    let records: BTreeMap<String, PodRecord> = f
        .kubelet
        .records()
        .into_iter()
        .map(|r| (r.uid.clone(), r))
        .collect();
    let reqs = f.requests();
    let journal = c.journal_text();
    let context = || {
        format!(
            "requests: {:#?}\njournal:\n{journal}",
            audit::count_by_kind(&reqs)
        )
    };

    // Every original pod was asked to go and is gone (the Job's: terminal, its finalizer
    // is the Job controller's to remove); the inhibitor went right after.
    let finished = |r: &PodRecord| {
        if r.name.starts_with("batch-") {
            r.exited_at
        } else {
            r.gone_at
        }
    };
    let mut last_gone = 0f64;
    for (uid, pod) in &originals {
        let r = &records[uid];
        let gone = finished(r).unwrap_or_else(|| panic!("{} still there\n{}", r.key(), context()));
        last_gone = last_gone.max(gone);
        assert!(
            r.stop_seen.is_some(),
            "{} never asked to stop",
            pod.name_any()
        );
    }
    // Two observers (the stand-in's watch, the node's journal) of one moment: a little
    // allowance each way for their delivery on a loaded machine.
    assert!(
        release >= last_gone - 0.1 && release - last_gone <= 0.5,
        "released {:.3} s after the last pod was gone\n{}",
        release - last_gone,
        context()
    );

    // Bands in order: a band is asked to go only once the band before is gone.
    let mut by_band: BTreeMap<usize, Vec<&PodRecord>> = BTreeMap::new();
    for (uid, pod) in &originals {
        by_band
            .entry(band_of(&app_of(pod)))
            .or_default()
            .push(&records[uid]);
    }
    for (band, pods) in &by_band {
        if *band == 0 {
            continue;
        }
        let before_gone = by_band[&(band - 1)]
            .iter()
            .filter_map(|r| finished(r))
            .fold(0f64, f64::max);
        for r in pods {
            let asked = r.stop_seen.unwrap_or_default();
            assert!(
                asked >= before_gone - 0.05,
                "{} (band {band}) asked {:.3} s before band {} was gone\n{}",
                r.key(),
                before_gone - asked,
                band - 1,
                context()
            );
        }
    }

    // How each pod was asked: evictions for what nothing blocks, one escalation for the
    // PodDisruptionBudget's pod in its window, one DELETE per DaemonSet pod.
    let mut cni_deletes = 0;
    for pod in originals.values() {
        let name = pod.name_any();
        let (ev, del) = (evictions(&reqs, &name), deletes(&reqs, &name));
        let accepted = ev.iter().filter(|r| r.code == 201).count();
        match app_of(pod).as_str() {
            "web" | "crit" | "nodecrit" => {
                assert_eq!(
                    (accepted, del.len()),
                    (1, 0),
                    "{name}: evicted once, never deleted\n{}",
                    context()
                );
            }
            "db" | "batch" => {
                assert_eq!(accepted, 0, "{name} evicted past its budget\n{}", context());
                assert!(
                    ev.iter().any(|r| r.code == 429),
                    "{name} never blocked\n{}",
                    context()
                );
                assert_eq!(del.len(), 1, "{name}: one escalation\n{}", context());
                assert_marked_before_deletes(&reqs, &name);
                let at = del[0].received - signal;
                assert!(
                    (FIRST_BAND_ESCALATION - 0.5..FIRST_BAND_END).contains(&at),
                    "{name} escalated {at:.3} s after the signal, outside its window\n{}",
                    context()
                );
            }
            "agent" | "cni" => {
                assert_eq!(
                    (accepted, del.len()),
                    (0, 1),
                    "{name}: deleted once\n{}",
                    context()
                );
                assert_marked_before_deletes(&reqs, &name);
            }
            "etcd" => assert!(
                ev.is_empty() && del.is_empty(),
                "{name}: gated, not deleted"
            ),
            other => panic!("unexpected app {other}"),
        }
        if app_of(pod) == "cni" {
            cni_deletes += 1;
        }
    }
    // The tolerate-all DaemonSet's replacement is neither chased nor waited for.
    let all_cni_deletes = reqs
        .iter()
        .filter(|r| r.verb == "delete" && r.resource == "pods" && r.name.starts_with("cni-"))
        .count();
    assert_eq!((cni_deletes, all_cni_deletes), (1, 1), "{}", context());
    assert!(
        records
            .values()
            .any(|r| r.name.starts_with("cni-") && !originals.contains_key(&r.uid)),
        "the DaemonSet controller never recreated the cni pod (the test proves nothing)"
    );
    let mut per_pod: HashMap<&str, usize> = HashMap::new();
    for r in reqs
        .iter()
        .filter(|r| r.subresource == "eviction" && r.code == 201)
    {
        *per_pod.entry(r.name.as_str()).or_default() += 1;
    }
    assert!(
        per_pod.values().all(|n| *n == 1),
        "a pod evicted twice: {per_pod:?}"
    );

    // What the cluster says about the node and its shutdown.
    let nodes: Api<Node> = Api::all(f.admin.clone());
    let node = nodes.get(&f.name).await.unwrap();
    let spec = node.spec.clone().unwrap_or_default();
    assert_eq!(spec.unschedulable, Some(true), "not cordoned");
    assert!(
        spec.taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "nodegrace.dev/maintenance" && t.effect == "NoSchedule"),
        "no maintenance taint"
    );
    assert!(
        node.labels()
            .contains_key("node.kubernetes.io/exclude-from-external-load-balancers"),
        "not excluded from external load balancers"
    );
    // KEP-6249's conditions: both True, reason NodeShutdown, in nodegrace's one status
    // write, answered before the apiserver received the first eviction.
    for t in ["GracefulNodeShutdownInProgress", "DrainInProgress"] {
        assert!(
            says(&node, t, "True", "NodeShutdown"),
            "{t}: {:?}",
            condition_of(&node, t)
        );
    }
    let writes = status_writes(&reqs);
    assert_eq!(writes.len(), 1, "status writes: {writes:#?}");
    assert_eq!(writes[0].code, 200, "{writes:#?}");
    let first_ask = first_pod_request(&reqs);
    assert!(
        writes[0].completed <= first_ask,
        "the conditions were written {:.3} s after the first eviction was received",
        writes[0].completed - first_ask
    );
    println!(
        "conditions written {:.3} s after the signal, {:.3} s before the first eviction",
        writes[0].completed - signal,
        first_ask - writes[0].completed
    );
    let nms: Api<NodeMaintenance> = Api::all(f.admin.clone());
    let m = nms.get(&format!("shutdown-{}", f.name)).await.unwrap();
    assert_eq!(m.spec.stage, nodegrace::Stage::Drain);
    assert_eq!(
        m.annotations()
            .get("nodegrace.dev/shutdown-kind")
            .map(String::as_str),
        Some("poweroff")
    );
    assert!(
        m.spec
            .reason
            .as_deref()
            .unwrap_or_default()
            .starts_with("Node poweroff"),
        "{:?}",
        m.spec.reason
    );
    let entry = m.node_status(&f.name).expect("the node's status entry");
    assert_eq!(entry.pods_remaining, 0);

    // The static pod's manifest waits in the gate directory.
    assert!(std::fs::read_dir(&f.node.manifests)
        .unwrap()
        .next()
        .is_none());
    assert!(f.node.state.join("gated-manifests/etcd.yaml").exists());

    // The Job's escalated pod counts as a disruption (its podFailurePolicy ignores
    // DisruptionTarget), not against backoffLimit 0: the Job controller replaces it.
    let uids: Vec<String> = originals.keys().cloned().collect();
    assert_job_replaced_its_disrupted_pod(&f.admin, &f.name, "batch", &uids).await;

    audit::assert_allowed_by_cluster_role(&reqs);
    history_as_a_viewer(&f).await;
    f.cleanup().await;
}

/// `nodegrace history NODE` run by an operator with the packaged ClusterRole
/// `nodegrace-viewer` and nothing else: refused without it, and with it the drain just done
/// drawn from the real Events (its band wait on the budget, the escalation).
async fn history_as_a_viewer(f: &Fixture) {
    let viewer = f.cp.viewer(&format!("viewer-{}", f.name));
    let history = || viewer.history(&[&f.name]);
    let (ok, _, err) = tokio::task::block_in_place(history);
    assert!(
        !ok && err.contains("forbidden"),
        "history without the viewer role: {err}"
    );
    viewer.bind();
    // The Drained event is written in the background; RBAC's cache follows the binding.
    let drawn = real::wait_until(
        "history to draw the drain as the viewer",
        Duration::from_secs(30),
        || {
            let (ok, out, _) = tokio::task::block_in_place(history);
            (ok && out.contains(", drained")).then_some(out)
        },
    );
    drop(viewer);
    for expected in [
        format!("{}: shutdown at ", f.name),
        "waited on PodDisruptionBudget".into(),
        "escalated (deleted with the grace left)".into(),
    ] {
        assert!(drawn.contains(&expected), "{expected:?} missing:\n{drawn}");
    }
}

/// An admin's NodeMaintenance selecting the node by label: at Drain the first band is
/// evicted and the PodDisruptionBudget's pod is never deleted (there is no deadline); once
/// the budget goes the later bands follow and the static pod is gated in its turn; at
/// Complete the node is uncordoned, the taint goes and the static pod comes back. The Node
/// says `DrainInProgress` before the first eviction, then `Drained`, then neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_maintenance_drains_without_escalating_and_completes() {
    if skip("an_admin_maintenance_drains_without_escalating_and_completes") {
        return;
    }
    let mut f = Fixture::new("ng-adm").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    f.every_band_one_blocked().await;
    f.node.boot();

    let name = format!("adm-{node}");
    let m: NodeMaintenance = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]},
            "stage": "Drain",
            "reason": "kernel upgrade",
        },
    }))
    .unwrap();
    let nms: Api<NodeMaintenance> = Api::all(c.clone());
    nms.create(&Default::default(), &m).await.unwrap();

    let live_app = |app: &str| {
        f.kubelet
            .live_pods()
            .iter()
            .filter(|p| app_of(p) == app)
            .count()
    };
    f.kubelet
        .wait_for(
            "the first band's web pods gone",
            Duration::from_secs(60),
            |_, live| !live.iter().any(|p| app_of(p) == "web"),
        )
        .await;
    // Blocked, and no deadline: the budget's pod stays, the next band does not start.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!((live_app("db"), live_app("crit")), (1, 1));
    let n = wait_node(c, &node, "cordoned", cordoned).await;
    assert!(
        says(&n, "DrainInProgress", "True", "NodegraceDrainStarted"),
        "{:?}",
        condition_of(&n, "DrainInProgress")
    );
    assert_eq!(condition_of(&n, "GracefulNodeShutdownInProgress"), None);
    let reqs = f.requests();
    let writes = status_writes(&reqs);
    assert!(
        !writes.is_empty() && writes[0].completed <= first_pod_request(&reqs),
        "DrainInProgress after the first eviction: {writes:#?}"
    );

    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(c.clone(), &ns);
    pdbs.delete("db", &DeleteParams::default()).await.unwrap();
    let drained = wait_maintenance(c, &name, "Drained", Duration::from_secs(90), |m| {
        m.drained() == Some("True")
    })
    .await;
    assert_eq!(
        drained.node_status(&node).map(|e| e.pods_remaining),
        Some(0)
    );
    assert!(f.node.state.join("gated-manifests/etcd.yaml").exists());
    assert!(!f.node.manifests.join("etcd.yaml").exists());
    wait_node(c, &node, "Drained", |n| {
        says(n, "Drained", "True", "NodegraceDrainCompleted")
            && says(n, "DrainInProgress", "False", "NodegraceDrainCompleted")
    })
    .await;
    let reqs = f.requests();
    for pod in ["db", "web", "crit"] {
        assert!(
            !reqs.iter().any(|r| r.verb == "delete"
                && r.resource == "pods"
                && r.name.starts_with(&format!("{pod}-"))),
            "{pod} was deleted, not evicted: {:#?}",
            audit::count_by_kind(&reqs)
        );
    }

    nms.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"stage": "Complete"}})),
    )
    .await
    .unwrap();
    let back = wait_node(c, &node, "uncordoned and untainted", |n| {
        !cordoned(n) && !maintenance_tainted(n)
    })
    .await;
    assert!(!back
        .labels()
        .contains_key("node.kubernetes.io/exclude-from-external-load-balancers"));
    wait_node(c, &node, "Drained False", |n| {
        says(n, "Drained", "False", "NodegraceMaintenanceEnded")
    })
    .await;
    f.kubelet
        .wait_for(
            "the static pod's mirror back",
            Duration::from_secs(30),
            |_, live| live.iter().any(|p| p.name_any() == format!("etcd-{node}")),
        )
        .await;
    assert!(f.node.manifests.join("etcd.yaml").exists());
    let done = wait_maintenance(
        c,
        &name,
        "completed on the node",
        Duration::from_secs(30),
        |m| {
            m.node_status(&node)
                .is_some_and(|e| e.drain_message == "Completed")
                && !has_finalizer(m)
        },
    )
    .await;
    assert_eq!(done.spec.stage, nodegrace::Stage::Complete);
    audit::assert_allowed_by_cluster_role(&f.requests());
    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    f.cleanup().await;
}

/// A node idle for longer than the apiserver keeps an idle connection (90 s): the evicting
/// identity's connection is gone, and the shutdown's band of evictions goes over one new
/// connection, not one per pod opened at once when the apiserver is busiest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_idle_for_minutes_drains_over_the_connections_it_holds() {
    if skip("a_node_idle_for_minutes_drains_over_the_connections_it_holds") {
        return;
    }
    let mut f = Fixture::new("ng-idle").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::deployment(c, &ns, &node, 24, PodShape::new("web").exits_after_ms(300)).await;
    f.kubelet.wait_running(24).await;
    f.node.boot();
    let pid = f.node.nodegrace_pid();
    tokio::time::sleep(Duration::from_secs(100)).await;
    let idle = real::tcp_connections(pid);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(real::tcp_connections(pid));
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        })
    };
    let down = f.node.shutdown("poweroff", Duration::from_secs(120));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let during = sampler.join().expect("sampler");
    let evicted = f
        .requests()
        .iter()
        .filter(|r| r.verb == "create" && r.subresource == "eviction" && r.code == 201)
        .count();
    assert_eq!(
        evicted,
        24,
        "the drain evicts the 24 pods:\n{}",
        down.journal_text()
    );
    // The apiserver closes a connection idle for 90 s: the kubelet identity's (no watch).
    assert_eq!(
        idle, 1,
        "after 100 s idle nodegrace held {idle} connections (its watches' expected)"
    );
    assert!(
        during <= 2,
        "the drain after the idle time opened a connection per request: up to {during} held"
    );
    f.cleanup().await;
}

/// The boot after a poweroff: nodegrace finds its shutdown maintenance of the earlier boot
/// and completes it (the shipped `after_boot = "complete"`): the node is uncordoned and the
/// gated static pod comes back. The shutdown conditions left True are cleared first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_boot_after_a_poweroff_completes_the_shutdown_maintenance() {
    if skip("the_boot_after_a_poweroff_completes_the_shutdown_maintenance") {
        return;
    }
    the_boot_after_completes_the_shutdown_maintenance(Fixture::new("ng-boot").await, "poweroff")
        .await;
}

/// The same after a `systemctl reboot` of a Debian 13 (systemd 257) node that carries
/// everything in its own root, as a host does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_debian_13_the_boot_after_a_reboot_completes_the_shutdown_maintenance() {
    if skip("on_debian_13_the_boot_after_a_reboot_completes_the_shutdown_maintenance") {
        return;
    }
    let f = Fixture::on("ng-boot13", Debian::Trixie).await;
    the_boot_after_completes_the_shutdown_maintenance(f, "reboot").await;
}

async fn the_boot_after_completes_the_shutdown_maintenance(mut f: Fixture, verb: &str) {
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::deployment(c, &ns, &node, 1, PodShape::new("web")).await;
    workload::static_pod(&f.node.manifests, &ns, PodShape::new("etcd"));
    f.kubelet.wait_running(2).await;
    f.node.boot();
    let _ = f.node.shutdown(verb, Duration::from_secs(120));
    let name = format!("shutdown-{node}");
    let before = wait_maintenance(c, &name, "the drain", Duration::from_secs(5), |m| {
        m.spec.stage == nodegrace::Stage::Drain
    })
    .await;
    assert_eq!(
        before
            .annotations()
            .get("nodegrace.dev/shutdown-kind")
            .map(String::as_str),
        Some(verb)
    );
    assert!(f.node.state.join("gated-manifests/etcd.yaml").exists());
    let down = wait_node(c, &node, "the shutdown conditions", |n| {
        says(n, "GracefulNodeShutdownInProgress", "True", "NodeShutdown")
    })
    .await;
    assert!(says(&down, "DrainInProgress", "True", "NodeShutdown"));
    // The kubelet went down with the node and comes back with the next boot.
    f.restart_kubelet().await;
    let booted_again = chrono::Utc::now().timestamp_micros() as f64 / 1e6;
    f.node.boot();

    let done = completed_after_the_boot(&f).await;
    assert_eq!(done.uid(), before.uid(), "the same maintenance, completed");
    // The True the shutdown left is cleared first: before the maintenance is completed
    // and the node uncordoned.
    let reqs: Vec<audit::Request> = f
        .requests()
        .into_iter()
        .filter(|r| r.received >= booted_again)
        .collect();
    let writes = status_writes(&reqs);
    assert_eq!(writes.len(), 1, "{writes:#?}");
    let completed_at = reqs
        .iter()
        .filter(|r| {
            r.verb == "patch"
                && ((r.resource == "nodemaintenances" && r.subresource.is_empty())
                    || (r.resource == "nodes" && r.subresource.is_empty()))
        })
        .map(|r| r.received)
        .fold(f64::INFINITY, f64::min);
    assert!(
        writes[0].completed <= completed_at,
        "the stale conditions were cleared after the maintenance was completed"
    );
    audit::assert_allowed_by_cluster_role(&f.requests());
    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    f.cleanup().await;
}

/// Waits until the boot after a shutdown completed `shutdown-<node>` (its finalizer gone),
/// uncordoned the node with the shutdown conditions `False`, and put the gated static pod
/// `etcd` back (its mirror pod too); returns the maintenance.
async fn completed_after_the_boot(f: &Fixture) -> NodeMaintenance {
    let (c, node) = (&f.admin, f.name.as_str());
    let done = wait_maintenance(
        c,
        &format!("shutdown-{node}"),
        "completed after the boot",
        Duration::from_secs(60),
        |m| {
            m.spec.stage == nodegrace::Stage::Complete
                && m.node_status(node)
                    .is_some_and(|e| e.drain_message == "Completed")
                && !has_finalizer(m)
        },
    )
    .await;
    let up = wait_node(c, node, "uncordoned", |n| {
        !cordoned(n) && !maintenance_tainted(n)
    })
    .await;
    for t in ["GracefulNodeShutdownInProgress", "DrainInProgress"] {
        assert!(
            says(&up, t, "False", "NodeShutdownEnded"),
            "{t}: {:?}",
            condition_of(&up, t)
        );
    }
    f.kubelet
        .wait_for(
            "the static pod's mirror back",
            Duration::from_secs(30),
            |_, live| live.iter().any(|p| p.name_any() == format!("etcd-{node}")),
        )
        .await;
    assert!(f.node.manifests.join("etcd.yaml").exists());
    done
}

fn maintenance_by_label(
    name: &str,
    node: &str,
    stage: &str,
    plan: serde_json::Value,
) -> NodeMaintenance {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]},
            "stage": stage,
            "drainPlan": plan,
        },
    }))
    .unwrap()
}

/// KEP-4212 lifecycle on the real apiserver: the cordon is reconciled while a maintenance
/// is active; a drain plan the API accepts but that is invalid is reported on the
/// maintenance; one created at Complete is carried out; deleting an active one carries out
/// its Complete stage (the finalizer) and the node is uncordoned once none is active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_lifecycle_cordon_invalid_plan_complete_and_delete() {
    if skip("maintenance_lifecycle_cordon_invalid_plan_complete_and_delete") {
        return;
    }
    let mut f = Fixture::new("ng-life").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::deployment(c, &ns, &node, 1, PodShape::new("web")).await;
    f.kubelet.wait_running(1).await;
    f.node.boot();
    let nms: Api<NodeMaintenance> = Api::all(c.clone());
    let nodes: Api<Node> = Api::all(c.clone());
    let (hold, bad, done) = (
        format!("hold-{node}"),
        format!("bad-{node}"),
        format!("done-{node}"),
    );

    nms.create(
        &Default::default(),
        &maintenance_by_label(&hold, &node, "Cordon", serde_json::json!([])),
    )
    .await
    .unwrap();
    wait_node(c, &node, "cordoned", cordoned).await;
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"unschedulable": false}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    wait_node(c, &node, "cordoned again", cordoned).await;

    let twice = serde_json::json!([
        {"podType": "Default", "podPriority": 100},
        {"podType": "Default", "podPriority": 100, "podSelector": {}},
    ]);
    nms.create(
        &Default::default(),
        &maintenance_by_label(&bad, &node, "Drain", twice),
    )
    .await
    .unwrap();
    wait_maintenance(
        c,
        &bad,
        "the invalid plan reported",
        Duration::from_secs(30),
        |m| {
            m.node_status(&node)
                .is_some_and(|e| e.drain_message.starts_with("Invalid drainPlan"))
        },
    )
    .await;
    assert_eq!(f.kubelet.live_pods().len(), 1, "nothing drained for it");

    nms.create(
        &Default::default(),
        &maintenance_by_label(&done, &node, "Complete", serde_json::json!([])),
    )
    .await
    .unwrap();
    wait_maintenance(c, &done, "carried out", Duration::from_secs(30), |m| {
        m.node_status(&node)
            .is_some_and(|e| e.drain_message == "Completed")
    })
    .await;

    for name in [&hold, &bad] {
        nms.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for name in [&hold, &bad] {
        for _ in 0..150 {
            if nms.get_opt(name).await.unwrap().is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            nms.get_opt(name).await.unwrap().is_none(),
            "{name} still there (finalizer)"
        );
    }
    wait_node(c, &node, "uncordoned", |n| !cordoned(n)).await;
    audit::assert_allowed_by_cluster_role(&f.requests());
    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    f.cleanup().await;
}

/// A maintenance selecting nodes by a label: the node drains its first entry, then waits
/// for the other selected node (no daemon runs there) to report it before the next; once
/// that node's daemon would have reported (its own identity writes its own entry), the
/// drain goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_selected_maintenance_waits_for_every_selected_node() {
    if skip("a_label_selected_maintenance_waits_for_every_selected_node") {
        return;
    }
    let mut f = Fixture::new("ng-pool").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    let nodes: Api<Node> = Api::all(c.clone());
    let pool = serde_json::json!({"metadata": {"labels": {"pool": node}}});
    nodes
        .patch(&node, &PatchParams::default(), &Patch::Merge(&pool))
        .await
        .unwrap();
    let other = format!("{node}-b");
    let other_node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": other, "labels": {"pool": node}},
    }))
    .unwrap();
    nodes
        .create(&Default::default(), &other_node)
        .await
        .unwrap();
    workload::deployment(c, &ns, &node, 2, PodShape::new("web")).await;
    workload::deployment(
        c,
        &ns,
        &node,
        1,
        PodShape::new("crit").priority("system-cluster-critical"),
    )
    .await;
    f.kubelet.wait_running(3).await;
    f.node.boot();

    let name = format!("pool-{node}");
    let m: NodeMaintenance = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "pool", "operator": "In", "values": [node]}]}]},
            "stage": "Drain",
            "reason": "pool upgrade",
        },
    }))
    .unwrap();
    let nms: Api<NodeMaintenance> = Api::all(c.clone());
    nms.create(&Default::default(), &m).await.unwrap();
    f.kubelet
        .wait_for(
            "the first band's web pods gone",
            Duration::from_secs(60),
            |_, live| !live.iter().any(|p| app_of(p) == "web"),
        )
        .await;
    let waiting = wait_maintenance(
        c,
        &name,
        "this node waiting for the other",
        Duration::from_secs(30),
        |m| {
            m.node_status(&node)
                .is_some_and(|e| e.drain_message == format!("Waiting for {name}."))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        f.kubelet.live_pods().iter().any(|p| app_of(p) == "crit"),
        "the next band started before {other} reported"
    );
    assert_ne!(waiting.drained(), Some("True"));

    // The other node's daemon reports the first entry done, with its own identity.
    let mine = waiting.node_status(&node).unwrap().clone();
    let theirs = realk8s::client_from(&f.cp.nodegrace_identity(&other)).await;
    let mut entry = nodegrace::NodeMaintenanceNodeStatus::for_node(&other);
    entry.drain_targets = mine.drain_targets.clone();
    entry.drain_message = format!("Waiting for {name}.");
    Api::<NodeMaintenance>::all(theirs)
        .patch_status(
            &name,
            &nodegrace::node_status_patch_params(&other),
            &Patch::Apply(nodegrace::node_status_apply_patch(&name, &entry).unwrap()),
        )
        .await
        .unwrap();
    f.kubelet
        .wait_for("the next band gone", Duration::from_secs(60), |_, live| {
            !live.iter().any(|p| app_of(p) == "crit")
        })
        .await;
    let after = nms.get(&name).await.unwrap();
    assert!(
        after.node_status(&other).is_some(),
        "the other node's entry kept"
    );

    audit::assert_allowed_by_cluster_role(&f.requests());
    let _ = nms.delete(&name, &DeleteParams::default()).await;
    let _ = nodes.delete(&other, &DeleteParams::default()).await;
    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    f.cleanup().await;
}

/// KEP-4563 as a 1.37 cluster serves it, on the real apiserver: `lifecycle.k8s.io` as the
/// tests' CRDs, the cluster's evictionrequest-controller and imperative evictor played by
/// the test kit ([`StandInControllers`]), and the pods' `spec.evictionResponders` shown to the
/// daemon by [`RespondersProxy`]. A maintenance asks for two pods: the one that declares no
/// responder is evicted by nodegrace through the Eviction API, with no EvictionRequest; the
/// one whose declared responder never finishes gets nodegrace's EvictionRequest, its
/// Eviction has that responder Active and the imperative evictor waiting behind it, and it
/// keeps running; once the maintenance completes, nodegrace's request says `Withdrawn`, the
/// Eviction fails as cancelled, the responder is Canceled and the pod is left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_responder_holds_its_eviction_until_the_maintenance_withdraws() {
    if skip("a_pods_responder_holds_its_eviction_until_the_maintenance_withdraws") {
        return;
    }
    use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};
    use realk8s::lifecycle::IMPERATIVE;
    const OPERATOR: &str = "db-operator.example.com/operator";
    let WithResponders {
        mut f,
        controllers,
        proxy,
        db: held_pod,
        web: web_pod,
    } = WithResponders::booted_soon("ng-req", OPERATOR).await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    let pod_uid = held_pod.uid().unwrap();
    f.node.boot();
    let name = format!("req-{node}");
    let nms: Api<NodeMaintenance> = Api::all(c.clone());
    nms.create(
        &Default::default(),
        &maintenance_by_label(&name, &node, "Drain", serde_json::json!([])),
    )
    .await
    .unwrap();

    let key = nodegrace::lifecycle::requester_key(&node);
    let requests: Api<EvictionRequest> = Api::namespaced(c.clone(), &ns);
    let evictions: Api<Eviction> = Api::namespaced(c.clone(), &ns);
    let request_name = format!("nodegrace-{pod_uid}");
    let states = |e: &Eviction| -> Vec<(String, String)> {
        e.status
            .iter()
            .flat_map(|s| s.target_responders.iter().flatten())
            .map(|t| (t.name.clone(), t.state.clone()))
            .collect()
    };
    let condition = |e: &Eviction, kind: &str| -> Option<(String, String)> {
        e.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .find(|c| c.type_ == kind)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    let wait_eviction = |what: &'static str, check: Box<dyn Fn(&Eviction) -> bool>| {
        let evictions = evictions.clone();
        let uid = pod_uid.clone();
        async move {
            for _ in 0..600 {
                let list = evictions.list(&Default::default()).await.unwrap();
                if let Some(e) = list.items.into_iter().find(|e| {
                    e.spec.target.pod.as_ref().map(|p| p.uid.as_str()) == Some(uid.as_str())
                        && check(e)
                }) {
                    return e;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("Eviction of {uid}: timed out waiting for {what}");
        }
    };
    let held = wait_eviction(
        "the responder active",
        Box::new(move |e| states(e).first().map(|s| s.1.as_str()) == Some("Active")),
    )
    .await;
    assert_eq!(
        states(&held),
        [
            (OPERATOR.to_owned(), "Active".to_owned()),
            (IMPERATIVE.to_owned(), "Inactive".to_owned())
        ]
    );
    assert_eq!(
        held.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(&key))
            .map(String::as_str),
        Some("requester")
    );
    let request = requests.get(&request_name).await.unwrap();
    assert_eq!(request.spec.requester, key);
    assert_eq!(request.spec.intent, "Eviction");
    // The pod without responders goes the Eviction API's way.
    f.kubelet
        .wait_for("the web pod gone", Duration::from_secs(60), |_, live| {
            !live.iter().any(|p| p.uid() == web_pod.uid())
        })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        f.kubelet
            .live_pods()
            .iter()
            .filter(|p| p.uid().as_deref() == Some(pod_uid.as_str()))
            .count(),
        1,
        "the responder holds it"
    );

    // The maintenance completes: the request is withdrawn, the eviction cancelled, the pod stays.
    nms.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"stage": "Complete"}})),
    )
    .await
    .unwrap();
    let cancelled = wait_eviction(
        "cancelled",
        Box::new(move |e| {
            condition(e, "Failed")
                == Some(("True".to_owned(), "CanceledDueToNoRequesters".to_owned()))
        }),
    )
    .await;
    assert_eq!(states(&cancelled)[0].1, "Canceled", "{cancelled:?}");
    assert_eq!(
        requests.get(&request_name).await.unwrap().spec.intent,
        "Withdrawn"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(f
        .kubelet
        .live_pods()
        .iter()
        .any(|p| p.uid().as_deref() == Some(pod_uid.as_str())));
    assert!(
        controllers.evicted().is_empty(),
        "{:?}",
        controllers.evicted()
    );

    // What the apiserver received from the node: one EvictionRequest, for the held pod, and
    // one eviction, of the other; never an eviction of the held pod.
    let sent = f.requests();
    let created: Vec<&str> = sent
        .iter()
        .filter(|r| {
            r.kind() == "create lifecycle.k8s.io/evictionrequests" && r.code < 300 && r.code > 0
        })
        .map(|r| r.uri.as_str())
        .collect();
    assert_eq!(created.len(), 1, "{created:?}");
    assert!(
        created[0].contains(&format!("/namespaces/{ns}/evictionrequests")),
        "{created:?}"
    );
    let evicted: Vec<&str> = sent
        .iter()
        .filter(|r| r.resource == "pods" && r.subresource == "eviction")
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(evicted, [web_pod.name_any().as_str()], "{sent:#?}");
    audit::assert_allowed_by_cluster_role(&sent);
    let _ = nms.delete(&name, &DeleteParams::default()).await;
    // The responder never finishes: take the workload away before the poweroff.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(c.clone(), &ns);
    for app in ["db", "web"] {
        deployments
            .delete(app, &DeleteParams::foreground())
            .await
            .unwrap();
    }
    f.kubelet
        .wait_for("the pods gone", Duration::from_secs(60), |_, live| {
            live.is_empty()
        })
        .await;
    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    f.cleanup().await;
    drop(proxy);
}

/// A node whose daemon reaches the apiserver through a [`RespondersProxy`] (the pods'
/// `spec.evictionResponders` shown from their test annotation), the cluster's controllers
/// played by [`StandInControllers`], and two running pods: `db`, whose responder is
/// `operator`, and `web`, which declares none. The proxy and the kubeconfig through it live as
/// long as this does; the node is booted by the test.
struct WithResponders {
    f: Fixture,
    controllers: realk8s::lifecycle::StandInControllers,
    proxy: (
        realk8s::responders_proxy::RespondersProxy,
        tempfile::NamedTempFile,
    ),
    db: Arc<Pod>,
    web: Arc<Pod>,
}

impl WithResponders {
    async fn booted_soon(prefix: &str, operator: &'static str) -> WithResponders {
        let mut f = Fixture::new(prefix).await;
        let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
        let controllers = realk8s::lifecycle::StandInControllers::for_namespace(f.cp, &ns).await;
        let identity = f.cp.nodegrace_identity(&node);
        let proxy = realk8s::responders_proxy::RespondersProxy::open(&identity).await;
        let through = tempfile::NamedTempFile::new().unwrap();
        proxy.kubeconfig(&identity, through.path());
        f.node.use_kubeconfig(through.path().to_owned());
        workload::deployment(c, &ns, &node, 1, PodShape::new("db").responded_by(operator)).await;
        workload::deployment(c, &ns, &node, 1, PodShape::new("web")).await;
        f.kubelet.wait_running(2).await;
        let pod_of = |app: &str| {
            f.kubelet
                .live_pods()
                .into_iter()
                .find(|p| app_of(p) == app)
                .unwrap()
        };
        let (db, web) = (pod_of("db"), pod_of("web"));
        WithResponders {
            f,
            controllers,
            proxy: (proxy, through),
            db,
            web,
        }
    }
}

/// The requester's whole way on a poweroff, on the real apiserver with the test kit's
/// stand-in of the cluster's controllers and the pods' `spec.evictionResponders` shown by
/// [`RespondersProxy`]: the pod whose responder hands over at once (its operator, played
/// here, completes its entry as soon as it is Active) is asked through nodegrace's
/// EvictionRequest, evicted by the cluster's imperative evictor, never by the node, and gone
/// before the poweroff is released; the pod without responders is evicted by nodegrace
/// through the Eviction API with no EvictionRequest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poweroff_asks_a_pod_with_responders_through_its_eviction_request() {
    if skip("a_poweroff_asks_a_pod_with_responders_through_its_eviction_request") {
        return;
    }
    use k8s_openapi::api::lifecycle::v1alpha1::Eviction;
    use realk8s::lifecycle::IMPERATIVE;
    const OPERATOR: &str = "db-operator.example.com/operator";
    let WithResponders {
        mut f,
        controllers,
        proxy,
        db,
        web,
    } = WithResponders::booted_soon("ng-reqoff", OPERATOR).await;
    let (c, ns) = (&f.admin.clone(), f.name.clone());
    // The operator: nothing to move, so it completes its entry once it is Active.
    // What it saw of the responders' states (the Eviction goes with its pod).
    let seen: Arc<std::sync::Mutex<std::collections::BTreeSet<(String, String)>>> = Arc::default();
    let operated: Api<Eviction> = Api::namespaced(c.clone(), &ns);
    let (db_uid, saw) = (db.uid().unwrap(), seen.clone());
    let operator = tokio::spawn(async move {
        loop {
            for e in operated
                .list(&Default::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                if e.spec.target.pod.as_ref().map(|p| p.uid.as_str()) == Some(db_uid.as_str()) {
                    saw.lock().unwrap().extend(
                        e.status
                            .iter()
                            .flat_map(|s| s.target_responders.iter().flatten())
                            .map(|t| (t.name.clone(), t.state.clone())),
                    );
                }
                let active = e
                    .status
                    .iter()
                    .flat_map(|s| s.target_responders.iter().flatten())
                    .any(|t| t.name == OPERATOR && t.state == "Active");
                let mut done = e.clone();
                let Some(mine) = done
                    .status
                    .as_mut()
                    .and_then(|s| s.responders.as_mut())
                    .and_then(|r| r.iter_mut().find(|r| r.name == OPERATOR))
                    .filter(|r| active && r.completion_time.is_none())
                else {
                    continue;
                };
                let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                );
                mine.start_time.get_or_insert_with(|| now.clone());
                mine.heartbeat_time = Some(now.clone());
                mine.completion_time = Some(now);
                mine.message = Some("nothing to move: handed over".to_owned());
                let _ = operated
                    .replace_status(&e.name_any(), &Default::default(), &done)
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    f.node.boot();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let down = f.node.shutdown("poweroff", Duration::from_secs(120));
    operator.abort();
    let (_, release) = signal_and_release(&down);

    let sent = f.requests();
    let created: Vec<&str> = sent
        .iter()
        .filter(|r| r.kind() == "create lifecycle.k8s.io/evictionrequests" && r.code == 201)
        .map(|r| r.name.as_str())
        .collect();
    let db_uid = db.uid().unwrap();
    assert_eq!(
        created,
        [format!("nodegrace-{db_uid}").as_str()],
        "{}",
        down.journal_text()
    );
    assert!(evictions(&sent, &db.name_any()).is_empty(), "{sent:#?}");
    assert_eq!(evictions(&sent, &web.name_any()).len(), 1, "{sent:#?}");
    for pod in [&db, &web] {
        assert!(deletes(&sent, &pod.name_any()).is_empty(), "{sent:#?}");
    }
    assert_eq!(controllers.evicted(), [format!("{ns}/{}", db.name_any())]);
    let records = f.kubelet.records();
    for pod in [&db, &web] {
        let exited = records
            .iter()
            .find(|r| Some(r.uid.as_str()) == pod.uid().as_deref())
            .and_then(|r| r.exited_at)
            .unwrap_or_else(|| panic!("{} never exited: {records:#?}", pod.name_any()));
        assert!(
            exited <= release,
            "{} exited at {exited}, after the release at {release}",
            pod.name_any()
        );
    }
    let seen = seen.lock().unwrap().clone();
    for (responder, state) in [
        (OPERATOR, "Active"),
        (OPERATOR, "Completed"),
        (IMPERATIVE, "Active"),
    ] {
        assert!(
            seen.contains(&(responder.to_owned(), state.to_owned())),
            "{responder} never seen {state}: {seen:?}"
        );
    }
    audit::assert_allowed_by_cluster_role(&sent);
    f.cleanup().await;
    drop(proxy);
}

/// §Uncordon: `nodegrace complete` on a node another maintenance still drains leaves its
/// static pods gated (and says why); they come back when that maintenance completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodegrace_complete_keeps_static_pods_gated_under_another_maintenance() {
    if skip("nodegrace_complete_keeps_static_pods_gated_under_another_maintenance") {
        return;
    }
    let mut f = Fixture::new("ng-cmp").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::static_pod(&f.node.manifests, &ns, PodShape::new("etcd"));
    f.kubelet
        .wait_for(
            "the static pod's mirror",
            Duration::from_secs(90),
            |_, live| live.len() == 1,
        )
        .await;
    f.node.boot();
    let name = format!("hold-{node}");
    let nms: Api<NodeMaintenance> = Api::all(c.clone());
    nms.create(
        &Default::default(),
        &maintenance_by_label(&name, &node, "Drain", serde_json::json!([])),
    )
    .await
    .unwrap();
    wait_maintenance(c, &name, "Drained", Duration::from_secs(60), |m| {
        m.drained() == Some("True")
    })
    .await;
    assert!(f.node.state.join("gated-manifests/etcd.yaml").exists());

    let out = f.node.container().exec(&["nodegrace", "complete"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "1 manifest(s) stay gated while NodeMaintenance {name} is active"
        )),
        "{stdout}"
    );
    assert!(f.node.state.join("gated-manifests/etcd.yaml").exists());
    assert!(!f.node.manifests.join("etcd.yaml").exists());

    nms.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"stage": "Complete"}})),
    )
    .await
    .unwrap();
    for _ in 0..300 {
        if f.node.manifests.join("etcd.yaml").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        f.node.manifests.join("etcd.yaml").exists(),
        "restored once the maintenance completed"
    );
    audit::assert_allowed_by_cluster_role(&f.requests());
    let _ = nms.delete(&name, &DeleteParams::default()).await;
    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    f.cleanup().await;
}

/// A soft reboot of a Debian 13 (systemd 257) node end to end, as `how` asks for it: the
/// drain runs as for a reboot (kind `soft-reboot` from logind's metadata), userspace restarts
/// in the same container with the same boot id, and nodegrace of the new userspace knows it
/// is the boot after that shutdown: the maintenance completes, the gated manifest is back,
/// the node uncordoned, the conditions cleared, no pod asked to go twice.
async fn a_soft_reboot_completes_in_the_new_userspace(prefix: &str, how: &[&str]) {
    let mut f = Fixture::on(prefix, Debian::Trixie).await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::deployment(c, &ns, &node, 3, PodShape::new("web").exits_after_ms(300)).await;
    workload::static_pod(
        &f.node.manifests,
        &ns,
        PodShape::new("etcd").exits_after_ms(200),
    );
    f.kubelet.wait_running(4).await;
    let originals: Vec<String> = f
        .kubelet
        .live_pods()
        .iter()
        .filter(|p| app_of(p) == "web")
        .map(|p| p.name_any())
        .collect();
    f.node.boot();
    let boot_id = |f: &Fixture| {
        f.node
            .container()
            .run(&["cat", "/proc/sys/kernel/random/boot_id"])
    };
    let boot_before = boot_id(&f);
    let took = f.node.soft_reboot(how, Duration::from_secs(120));
    println!(
        "soft reboot ({}): new userspace's nodegrace armed after {took:.2?}",
        how.join(" ")
    );
    assert_eq!(boot_id(&f), boot_before, "the kernel stayed");
    let soft_reboots = f
        .node
        .container()
        .run(&["systemctl", "show", "-P", "SoftRebootsCount"]);
    assert_eq!(soft_reboots.trim(), "1", "systemd counted no soft reboot");

    let done = completed_after_the_boot(&f).await;
    assert_eq!(
        done.annotations()
            .get("nodegrace.dev/shutdown-kind")
            .map(String::as_str),
        Some("soft-reboot")
    );
    assert!(!f.node.state.join("gated-manifests/etcd.yaml").exists());

    let container = f.node.container();
    let journal = container.journal_text();
    let ng = container.journal_of("nodegrace");
    let draining = real::first_with(&ng, "draining the node")
        .unwrap_or_else(|| panic!("nodegrace never began draining:\n{journal}"));
    assert_eq!(draining.field("KIND"), Some("soft-reboot"), "{journal}");
    assert!(
        real::first_with(&ng, "the boot after a soft reboot").is_some(),
        "the new userspace's nodegrace did not take it as the boot after the shutdown:\n{journal}"
    );
    let status = container.run(&["nodegrace", "status"]);
    let last = status
        .lines()
        .find(|l| l.starts_with("Last shutdown"))
        .unwrap_or_else(|| panic!("no last shutdown in `nodegrace status`:\n{status}"));
    assert!(last.contains("soft-reboot"), "{status}");

    let reqs = f.requests();
    let mut evicted: BTreeMap<&str, usize> = BTreeMap::new();
    for r in reqs.iter().filter(|r| r.subresource == "eviction") {
        *evicted.entry(r.name.as_str()).or_default() += 1;
    }
    for pod in &originals {
        assert_eq!(
            evicted.get(pod.as_str()),
            Some(&1),
            "{pod} evicted {:?} times: {evicted:?}",
            evicted.get(pod.as_str())
        );
    }
    assert!(evicted.values().all(|n| *n == 1), "{evicted:?}");
    audit::assert_allowed_by_cluster_role(&reqs);
    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_debian_13_a_soft_reboot_completes_in_the_new_userspace() {
    if skip("on_debian_13_a_soft_reboot_completes_in_the_new_userspace") {
        return;
    }
    a_soft_reboot_completes_in_the_new_userspace("ng-soft13", &["systemctl", "soft-reboot"]).await;
}

/// systemd 255+ makes `systemctl reboot` a soft reboot when `/run/nextroot/` holds a root
/// (here the node's own root, bound there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_debian_13_a_reboot_into_run_nextroot_completes_in_the_new_userspace() {
    if skip("on_debian_13_a_reboot_into_run_nextroot_completes_in_the_new_userspace") {
        return;
    }
    a_soft_reboot_completes_in_the_new_userspace(
        "ng-next13",
        &[
            "sh",
            "-c",
            "mkdir -p /run/nextroot && mount --bind / /run/nextroot && systemctl reboot",
        ],
    )
    .await;
}
