//! The composed drainer: cluster engine while the apiserver answers, CRI fallback while it
//! does not, and back (issue 4, "Switch back").

#[path = "engine_support/mod.rs"]
mod engine_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use engine_support::{eventually, fallback_annotation, request, Env, Kind, NODE};
use nodegrace::{
    BootIdSource, CancelCause, CompletionPolicy, Drainer, FallbackReport, KubeletControl,
    NodeDrainer, NodeParts, OfflineDrain, PodCache, PodInfo, PodOutcome, PodType,
    PriorityGracePeriod, Settings, ShutdownKind, Stage, StaticPodGate,
};
use nodegrace_testkit::fake_cri::{CriCall, FakeRuntime};
use nodegrace_testkit::fake_kubelet::KubeletConfig;
use nodegrace_testkit::fake_lifecycle::FakeEvictionControllers;
use serde_json::{json, Value};

#[derive(Default)]
struct RecordingKubelet(Mutex<Vec<&'static str>>);

#[async_trait]
impl KubeletControl for RecordingKubelet {
    async fn stop(&self, _unit: &str) -> anyhow::Result<()> {
        self.0.lock().unwrap().push("stop");
        Ok(())
    }
    async fn start(&self, _unit: &str) -> anyhow::Result<()> {
        self.0.lock().unwrap().push("start");
        Ok(())
    }
}

fn cached(name: &str, priority: i32) -> PodInfo {
    PodInfo {
        namespace: "work".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        priority,
        pod_type: PodType::Default,
        termination_grace_period_seconds: 30,
        labels: Default::default(),
        terminating: false,
        terminal: false,
        static_hash: None,
    }
}

fn bands(low: Duration, critical: Duration) -> Vec<PriorityGracePeriod> {
    vec![
        PriorityGracePeriod {
            priority: 0,
            shutdown_grace_period: low,
        },
        PriorityGracePeriod {
            priority: 2_000_000_000,
            shutdown_grace_period: critical,
        },
    ]
}

/// Settings with a short apiserver timeout, the given fallback bands, and a pod cache that
/// knows `web` (priority 0) and `dns` (critical).
fn offline_ready_settings(
    env: &Env,
    apiserver_timeout: Duration,
    bands: Vec<PriorityGracePeriod>,
) -> Settings {
    let mut settings = env.settings();
    settings.fallback.apiserver_timeout = apiserver_timeout;
    settings.fallback.shutdown_grace_period_by_pod_priority = bands;
    PodCache {
        node: NODE.into(),
        written_at: None,
        pods: vec![cached("web", 0), cached("dns", 2_000_000_000)],
    }
    .store(&settings.state_dir)
    .unwrap();
    settings
}

fn parts(
    env: &Env,
    settings: Settings,
    runtime: &FakeRuntime,
    kubelet: &Arc<RecordingKubelet>,
) -> NodeParts {
    NodeParts {
        settings,
        node: NODE.into(),
        runtime: Arc::new(runtime.clone()),
        kubelet: Some(kubelet.clone()),
        gate: env.gate.clone(),
        metrics: env.metrics.clone(),
        boot_id: BootIdSource::File(env.dir.path().join("boot_id")),
    }
}

#[tokio::test]
async fn unreachable_at_start_then_back_mid_way_continues_through_the_maintenance() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    env.pod("web", Kind::Default, 0, 30, json!({"app": "web"}));
    env.pod(
        "dns",
        Kind::Default,
        2_000_000_000,
        30,
        json!({"app": "dns"}),
    );

    // Band 0 lasts long enough for the apiserver to come back before the critical band.
    let settings = offline_ready_settings(
        &env,
        Duration::from_millis(300),
        bands(Duration::from_secs(20), Duration::from_secs(5)),
    );
    let runtime = FakeRuntime::new();
    runtime.add_pod("work", "web", "uid-web", Duration::from_secs(8));
    runtime.add_pod("work", "dns", "uid-dns", Duration::from_millis(100));
    let kubelet = Arc::new(RecordingKubelet::default());

    env.cluster.api.set_reachable(false).await.unwrap();
    let cluster = env.cluster.clone();
    let drainer = NodeDrainer::start(parts(&env, settings, &runtime, &kubelet), move || {
        let cluster = cluster.clone();
        async move { cluster.clients() }
    });

    let req = request(ShutdownKind::Poweroff, Duration::from_secs(120));
    let drain = tokio::spawn(async move {
        nodegrace_testkit::drain_through(&drainer, &req, true)
            .await
            .map(|()| drainer)
    });

    eventually(
        10,
        "the fallback stops the low band through the CRI",
        || {
            runtime
                .calls()
                .iter()
                .any(|c| matches!(c, CriCall::StopContainer { pod, .. } if pod == "work/web"))
        },
    )
    .await;
    assert_eq!(
        kubelet.0.lock().unwrap().as_slice(),
        ["stop"],
        "kubelet stopped before any pod"
    );
    assert!(
        env.maintenance("shutdown-node-a").is_none(),
        "nothing reached the apiserver yet"
    );

    env.cluster.api.set_reachable(true).await.unwrap();
    let drainer = tokio::time::timeout(Duration::from_secs(30), drain)
        .await
        .expect("the drain finishes once the cluster path takes over")
        .unwrap()
        .unwrap();

    assert_eq!(
        kubelet.0.lock().unwrap().as_slice(),
        ["stop", "start"],
        "the kubelet runs again before the cluster path continues"
    );
    assert!(
        !runtime
            .calls()
            .iter()
            .any(|c| matches!(c, CriCall::StopContainer { pod, .. } if pod == "work/dns")),
        "the critical band was left to the cluster path: {:?}",
        runtime.calls()
    );
    let maintenance = env
        .maintenance("shutdown-node-a")
        .expect("shutdown maintenance created");
    assert_eq!(maintenance.spec.stage, nodegrace::Stage::Drain);
    assert!(
        env.evictions().contains(&"dns".to_string()),
        "evictions: {:?}",
        env.evictions()
    );
    assert!(!env.pod_exists("dns"));
    let record = OfflineDrain::load(env.dir.path()).unwrap().unwrap();
    let outcomes: Vec<(&str, PodOutcome)> = record.reports[0]
        .pods
        .iter()
        .map(|p| (p.name.as_str(), p.outcome))
        .collect();
    assert!(
        outcomes.contains(&("web", PodOutcome::Stopping))
            && outcomes.contains(&("dns", PodOutcome::Pending)),
        "the local part is on disk until the next boot: {outcomes:?}"
    );
    eventually(5, "the maintenance records the local part", || {
        env.maintenance("shutdown-node-a")
            .and_then(|m| fallback_annotation(&m))
            .is_some_and(|s| {
                s["podsNotStopped"] == 1
                    && s["notStopped"][0] == "work/web: still stopping when the fallback ended"
                    && s["podsNotReached"] == 1
            })
    })
    .await;
    drop(drainer);
}

#[tokio::test]
async fn no_apiserver_at_all_drains_every_band_locally() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let settings = offline_ready_settings(
        &env,
        Duration::from_millis(200),
        bands(Duration::from_secs(2), Duration::from_secs(2)),
    );
    let runtime = FakeRuntime::new();
    runtime.add_pod("work", "dns", "uid-dns", Duration::from_millis(50));
    runtime.add_pod("work", "web", "uid-web", Duration::from_millis(50));
    runtime.add_pod("work", "unknown", "uid-unknown", Duration::from_millis(50));
    let kubelet = Arc::new(RecordingKubelet::default());
    let drainer = NodeDrainer::start(parts(&env, settings, &runtime, &kubelet), || async {
        Err::<kube::Client, _>(anyhow::anyhow!("no kubeconfig on this node"))
    });
    let req = request(ShutdownKind::Reboot, Duration::from_secs(60));
    tokio::time::timeout(
        Duration::from_secs(20),
        nodegrace_testkit::drain_through(&drainer, &req, true),
    )
    .await
    .expect("the offline drain ends")
    .unwrap();

    let stops: Vec<String> = runtime
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            CriCall::StopContainer { pod, .. } => Some(pod),
            _ => None,
        })
        .collect();
    assert_eq!(
        stops.last().map(String::as_str),
        Some("work/dns"),
        "critical band last: {stops:?}"
    );
    assert_eq!(
        stops.len(),
        3,
        "the pod the cache does not know is stopped too: {stops:?}"
    );
    assert!(runtime.running().is_empty());
    let text = env.metrics.render().unwrap();
    assert!(text.contains("nodegrace_fallback_used_total 1"), "{text}");
    // Counted by the priority band each was stopped in, named as the bands' durations are.
    for line in [
        "nodegrace_pods_terminated_total{method=\"cri\",band=\"priority>=0 (offline)\"} 2",
        "nodegrace_pods_terminated_total{method=\"cri\",band=\"priority>=2000000000 (offline)\"} 1",
        "nodegrace_band_duration_seconds{band=\"priority>=0 (offline)\"} ",
        "nodegrace_band_duration_seconds{band=\"priority>=2000000000 (offline)\"} ",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }

    let record = OfflineDrain::load(env.dir.path())
        .unwrap()
        .expect("the offline drain is recorded on disk for the next boot");
    assert_eq!(record.boot_id, "boot-1");
    assert_eq!(record.kind, ShutdownKind::Reboot);
    assert_eq!(record.reports.len(), 1);
    assert!(
        record.reports[0]
            .pods
            .iter()
            .all(|p| p.outcome == PodOutcome::Stopped),
        "{:?}",
        record.reports[0].pods
    );

    drainer.cancel(&req, CancelCause::Cancelled).await.unwrap();
    assert_eq!(
        kubelet.0.lock().unwrap().as_slice(),
        ["stop", "start"],
        "a cancel starts the kubelet again"
    );
    assert_eq!(
        OfflineDrain::load(env.dir.path()).unwrap(),
        None,
        "a cancelled shutdown leaves nothing to record"
    );
}

/// A drainer for the boot after the shutdown, connected to the fake apiserver.
fn next_boot(
    env: &Env,
    settings: Settings,
    runtime: &FakeRuntime,
    kubelet: &Arc<RecordingKubelet>,
) -> NodeDrainer {
    std::fs::write(env.dir.path().join("boot_id"), "boot-2\n").unwrap();
    let cluster = env.cluster.clone();
    NodeDrainer::start(parts(env, settings, runtime, kubelet), move || {
        let cluster = cluster.clone();
        async move { cluster.clients() }
    })
}

/// The drainer's after-boot reconcile, which must end.
async fn after_boot(drainer: &NodeDrainer) {
    tokio::time::timeout(Duration::from_secs(20), drainer.after_boot())
        .await
        .expect("the after-boot reconcile ends")
        .unwrap();
}

#[tokio::test]
async fn the_boot_after_an_offline_shutdown_records_it_in_the_shutdown_maintenance() {
    for policy in [CompletionPolicy::Complete, CompletionPolicy::Keep] {
        let env = Env::new(KubeletConfig::node(NODE)).await;
        env.pod("etcd", Kind::Static, 2_000_001_000, 30, json!({}));
        env.pod("web", Kind::Default, 0, 30, json!({"app": "web"}));
        let mut settings = offline_ready_settings(
            &env,
            Duration::from_millis(200),
            bands(Duration::from_secs(2), Duration::from_secs(2)),
        );
        settings.shutdown.after_boot = policy;
        let runtime = FakeRuntime::new();
        let web_uid = pod_status(&env, "web")["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_owned();
        runtime.add_pod("work", "web", &web_uid, Duration::from_millis(50));
        runtime.add_pod(
            "work",
            "etcd-node-a",
            "hash-etcd",
            Duration::from_millis(50),
        );
        let kubelet = Arc::new(RecordingKubelet::default());

        // The shutdown: no apiserver at all.
        let offline = NodeDrainer::start(
            parts(&env, settings.clone(), &runtime, &kubelet),
            || async { Err::<kube::Client, _>(anyhow::anyhow!("apiserver unreachable")) },
        );
        let req = request(ShutdownKind::Poweroff, Duration::from_secs(60));
        tokio::time::timeout(
            Duration::from_secs(20),
            nodegrace_testkit::drain_through(&offline, &req, true),
        )
        .await
        .expect("the offline drain ends")
        .unwrap();
        drop(offline);
        assert_eq!(env.gate.gated_files(), ["etcd.yaml"]);
        assert!(env.maintenance("shutdown-node-a").is_none());

        // The next boot, the apiserver reachable.
        let drainer = next_boot(&env, settings, &runtime, &kubelet);
        after_boot(&drainer).await;

        let m = env
            .maintenance("shutdown-node-a")
            .expect("a maintenance records the offline shutdown");
        let annotations = m.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations["nodegrace.dev/boot-id"], "boot-1");
        assert_eq!(annotations["nodegrace.dev/shutdown-kind"], "poweroff");
        assert!(
            m.spec.reason.as_deref().unwrap().contains("offline"),
            "{:?}",
            m.spec.reason
        );
        let summary = fallback_annotation(&m).expect("the fallback report is on it");
        assert_eq!(summary["podsStopped"], 2, "{summary}");
        assert_eq!(summary["podsNotStopped"], 0, "{summary}");
        let stopped = summary["stopped"].as_array().unwrap();
        assert!(stopped.contains(&json!("work/web")), "{summary}");
        assert!(stopped.contains(&json!("work/etcd-node-a")), "{summary}");
        // The pod stopped offline reads as the kubelet's graceful shutdown leaves it.
        let web = pod_status(&env, "web");
        assert_eq!(web["status"]["phase"], "Failed", "{web}");
        assert_eq!(web["status"]["reason"], "Terminated", "{web}");
        assert_eq!(
            web["status"]["message"],
            "Pod was terminated in response to imminent node shutdown."
        );
        let conditions = web["status"]["conditions"].as_array().unwrap();
        let target = conditions
            .iter()
            .find(|c| c["type"] == "DisruptionTarget")
            .expect("a DisruptionTarget condition");
        assert_eq!(
            (&target["status"], &target["reason"]),
            (&json!("True"), &json!("TerminationByKubelet"))
        );
        assert!(
            conditions.iter().any(|c| c["type"] == "Ready"),
            "the other conditions are kept"
        );
        eventually(
            5,
            "a FallbackUsed event on the node and the maintenance",
            || env.events("FallbackUsed").len() == 2,
        )
        .await;
        assert_eq!(
            OfflineDrain::load(env.dir.path()).unwrap(),
            None,
            "the record is gone once the apiserver has it"
        );

        match policy {
            CompletionPolicy::Complete => {
                assert_eq!(m.spec.stage, Stage::Complete);
                eventually(
                    10,
                    "the engine completes it and restores static pods",
                    || {
                        let m = env.maintenance("shutdown-node-a").unwrap();
                        m.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty())
                            && m.node_status(NODE)
                                .is_some_and(|e| e.drain_message == "Completed")
                            && env.gate.gated_files().is_empty()
                    },
                )
                .await;
                assert!(env.pod_exists("web"), "nothing is drained after the boot");
                assert!(env.node()["spec"]
                    .get("unschedulable")
                    .is_none_or(|u| u == false));
            }
            CompletionPolicy::Keep => {
                assert_eq!(m.spec.stage, Stage::Drain);
                // web stopped offline and now Failed: terminated, nothing left to evict.
                eventually(10, "the kept maintenance holds the drained node", || {
                    env.node()["spec"]["unschedulable"] == true
                        && env.maintenance("shutdown-node-a").unwrap().drained() == Some("True")
                })
                .await;
                assert!(env.evictions().is_empty(), "{:?}", env.evictions());
                assert_eq!(
                    env.gate.gated_files(),
                    ["etcd.yaml"],
                    "static pods stay gated while the maintenance is kept"
                );
            }
        }
        drop(drainer);
    }
}

#[tokio::test]
async fn an_offline_record_goes_onto_that_shutdowns_maintenance_once_and_a_stale_one_is_dropped() {
    // (boot id on the maintenance, fallback annotation already there, expect annotated)
    let cases = [
        ("boot-1", false, true),
        ("boot-1", true, false),
        ("boot-0", false, false),
    ];
    for (m_boot, annotated, expect_annotation) in cases {
        let env = Env::new(KubeletConfig::node(NODE)).await;
        let mut annotations = json!({"nodegrace.dev/boot-id": m_boot});
        if annotated {
            annotations["nodegrace.dev/fallback-report"] = json!("{\"podsStopped\":7}");
        }
        env.cluster
            .insert(&json!({
                "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
                "metadata": {"name": "shutdown-node-a", "annotations": annotations},
                "spec": {
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
                    "stage": "Drain",
                },
            }))
            .unwrap();
        let report = FallbackReport {
            pods: Vec::new(),
            started_at: Some(chrono::Utc::now()),
            ..Default::default()
        };
        OfflineDrain {
            boot_id: "boot-1".into(),
            kind: ShutdownKind::Reboot,
            reports: vec![report],
        }
        .store(env.dir.path())
        .unwrap();
        let settings = env.settings();
        let runtime = FakeRuntime::new();
        let kubelet = Arc::new(RecordingKubelet::default());
        let drainer = next_boot(&env, settings, &runtime, &kubelet);
        after_boot(&drainer).await;

        let m = env.maintenance("shutdown-node-a").unwrap();
        let case = format!("maintenance of {m_boot}, annotated {annotated}");
        assert_eq!(m.spec.stage, Stage::Complete, "{case}");
        if expect_annotation {
            eventually(
                5,
                "a FallbackUsed event on the node and the maintenance",
                || env.events("FallbackUsed").len() == 2,
            )
            .await;
        } else {
            // Events are sent in the background: give a wrong one the time to show.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(env.events("FallbackUsed").is_empty(), "{case}");
        }
        let summary = fallback_annotation(&m);
        match (annotated, expect_annotation) {
            (true, _) => assert_eq!(summary.unwrap()["podsStopped"], 7, "{case}: kept"),
            (false, true) => assert_eq!(summary.unwrap()["podsStopped"], 0, "{case}"),
            (false, false) => assert!(summary.is_none(), "{case}: not another shutdown's"),
        }
        assert_eq!(OfflineDrain::load(env.dir.path()).unwrap(), None, "{case}");
        drop(drainer);
    }
}

#[tokio::test]
async fn a_cluster_path_that_fails_while_reachable_drains_locally_once() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    env.cluster
        .uninstall_crd(nodegrace::NODE_MAINTENANCE_CRD_NAME)
        .unwrap();
    let settings = offline_ready_settings(
        &env,
        Duration::from_millis(500),
        bands(Duration::from_secs(2), Duration::from_secs(2)),
    );
    let runtime = FakeRuntime::new();
    runtime.add_pod("work", "web", "uid-web", Duration::from_millis(50));
    runtime.add_pod("work", "dns", "uid-dns", Duration::from_millis(50));
    let kubelet = Arc::new(RecordingKubelet::default());
    let cluster = env.cluster.clone();
    let drainer = NodeDrainer::start(parts(&env, settings, &runtime, &kubelet), move || {
        let cluster = cluster.clone();
        async move { cluster.clients() }
    });
    let req = request(ShutdownKind::Poweroff, Duration::from_secs(60));
    tokio::time::timeout(
        Duration::from_secs(20),
        nodegrace_testkit::drain_through(&drainer, &req, true),
    )
    .await
    .expect("the local drain ends")
    .unwrap();

    let stops = runtime
        .calls()
        .into_iter()
        .filter(|c| matches!(c, CriCall::StopContainer { .. }))
        .count();
    assert_eq!(stops, 2, "each pod stopped once: {:?}", runtime.calls());
    assert_eq!(
        kubelet.0.lock().unwrap().as_slice(),
        ["stop"],
        "an apiserver that answers but cannot drain is not switched back to"
    );
}

#[tokio::test]
async fn with_the_eviction_request_api_served_a_pod_without_responders_is_evicted_directly() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let _controllers = FakeEvictionControllers::start(env.cluster.store.clone());
    env.pod("web", Kind::Default, 0, 30, json!({"app": "web"}));
    env.pod("ds", Kind::DaemonSet, 0, 30, json!({"app": "ds"}));
    let settings = env.settings();
    let runtime = FakeRuntime::new();
    let kubelet = Arc::new(RecordingKubelet::default());
    let cluster = env.cluster.clone();
    let drainer = NodeDrainer::start(parts(&env, settings, &runtime, &kubelet), move || {
        let cluster = cluster.clone();
        async move { cluster.clients() }
    });
    let req = request(ShutdownKind::Reboot, Duration::from_secs(60));
    tokio::time::timeout(
        Duration::from_secs(30),
        nodegrace_testkit::drain_through(&drainer, &req, true),
    )
    .await
    .expect("the drain ends")
    .unwrap();

    assert!(!env.pod_exists("web") && !env.pod_exists("ds"));
    // web declares no responders: evicted directly, without an EvictionRequest.
    assert_eq!(env.evictions(), ["web"]);
    assert!(
        !env.requests()
            .iter()
            .any(|r| r.method == "POST" && r.path.ends_with("/evictionrequests")),
        "no EvictionRequest for a pod without responders"
    );
    assert!(
        runtime.calls().is_empty(),
        "the CRI is not touched while the apiserver answers"
    );
    // Env's teardown checks every request against the shipped ClusterRole.
    drop(drainer);
}

/// With the EvictionRequest API served, a pod without responders meets its budget on the
/// Eviction API; the maintenance names it (KEP-4212 drainMessage).
#[tokio::test]
async fn a_blocking_budget_is_named_on_the_maintenance_with_the_eviction_request_api_served() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let _controllers = FakeEvictionControllers::start(env.cluster.store.clone());
    env.pod("db", Kind::Default, 0, 30, json!({"app": "db"}));
    env.pdb("db-pdb", "db", 1);
    env.admin_maintenance("upgrade", "Drain", json!([]));
    let runtime = FakeRuntime::new();
    let kubelet = Arc::new(RecordingKubelet::default());
    let cluster = env.cluster.clone();
    let _drainer = NodeDrainer::start(parts(&env, env.settings(), &runtime, &kubelet), move || {
        let cluster = cluster.clone();
        async move { cluster.clients() }
    });
    eventually(15, "the budget named in the node's entry", || {
        env.maintenance("upgrade")
            .and_then(|m| m.node_status(NODE).map(|e| e.drain_message.clone()))
            .is_some_and(|msg| msg.contains("PodDisruptionBudget work/db-pdb"))
    })
    .await;
    eventually(5, "an EvictionBlocked event", || {
        !env.events("EvictionBlocked").is_empty()
    })
    .await;
    assert!(env.pod_exists("db"));
}

fn pod_status(env: &Env, name: &str) -> Value {
    env.cluster.store.get_obj("", "pods", "work", name).unwrap()
}

/// An apiserver that is away is looked for every few seconds at most (a shutdown waits only
/// `fallback.apiserver_timeout` for it), not at a back-off that grows to half a minute.
#[tokio::test]
async fn an_unreachable_apiserver_is_retried_every_few_seconds() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    let settings = env.settings();
    let runtime = FakeRuntime::new();
    let kubelet = Arc::new(RecordingKubelet::default());
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    tokio::time::pause();
    let seen = attempts.clone();
    let _drainer = NodeDrainer::start(parts(&env, settings, &runtime, &kubelet), move || {
        seen.lock().unwrap().push(tokio::time::Instant::now());
        async { Err::<kube::Client, _>(anyhow::anyhow!("connection refused")) }
    });
    tokio::time::sleep(Duration::from_secs(120)).await;
    let at = attempts.lock().unwrap().clone();
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|g| *g <= Duration::from_millis(4100)),
        "gaps between attempts: {gaps:?}"
    );
    assert!(
        (25..=40).contains(&at.len()),
        "{} attempts in 2 minutes",
        at.len()
    );
}

/// The daemon restarted (a package upgrade) or the node booted while an admin's
/// NodeMaintenance holds the node's static pods gated: the after-boot reconcile finds no
/// shutdown maintenance and leaves them gated for the maintenance that gated them, whose drain
/// would otherwise wait forever for a static pod the kubelet runs again (found by CI: a
/// maintenance created as the node booted).
#[tokio::test]
async fn the_boot_leaves_static_pods_another_maintenance_gated() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    env.pod("etcd", Kind::Static, 2_000_001_000, 30, json!({}));
    env.admin_maintenance("upgrade", "Drain", json!([]));
    StaticPodGate::gate(&*env.gate, "etcd.yaml").unwrap();
    let settings = env.settings();
    assert_eq!(settings.shutdown.after_boot, CompletionPolicy::Complete);
    let runtime = FakeRuntime::new();
    let kubelet = Arc::new(RecordingKubelet::default());
    let drainer = next_boot(&env, settings, &runtime, &kubelet);
    after_boot(&drainer).await;
    assert_eq!(env.gate.gated_files(), ["etcd.yaml"]);
    assert!(env.maintenance("shutdown-node-a").is_none());
}
