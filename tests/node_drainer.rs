//! The composed drainer: cluster engine while the apiserver answers, CRI fallback while it
//! does not, and back (issue 4, "Switch back").

#[path = "engine_support/mod.rs"]
mod engine_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use engine_support::{eventually, request, Env, Kind, NODE};
use nodegrace::config::{PriorityGracePeriod, Settings};
use nodegrace::daemon::node::{NodeDrainer, NodeParts};
use nodegrace::daemon::{Drainer, ShutdownKind};
use nodegrace::fallback::KubeletControl;
use nodegrace::plan::{PodInfo, PodType};
use nodegrace::state::PodCache;
use nodegrace::testing::fake_cri::{CriCall, FakeRuntime};
use nodegrace::testing::fake_kubelet::KubeletConfig;
use serde_json::json;

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
        boot_id_path: env.dir.path().join("boot_id"),
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
    let client_source = env.cluster.api.kube_config().unwrap();
    let drainer = NodeDrainer::start(parts(&env, settings, &runtime, &kubelet), move || {
        let config = client_source.clone();
        async move { Ok(kube::Client::try_from(config)?) }
    });

    let req = request(ShutdownKind::Poweroff, Duration::from_secs(120));
    let drain = tokio::spawn(async move { drainer.drain(&req).await.map(|()| drainer) });

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
    assert_eq!(maintenance.spec.stage, nodegrace::api::Stage::Drain);
    assert!(
        env.evictions().contains(&"dns".to_string()),
        "evictions: {:?}",
        env.evictions()
    );
    assert!(!env.pod_exists("dns"));
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
        anyhow::bail!("no kubeconfig on this node")
    });
    let req = request(ShutdownKind::Reboot, Duration::from_secs(60));
    tokio::time::timeout(Duration::from_secs(20), drainer.drain(&req))
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
    assert!(
        text.contains("nodegrace_pods_terminated_total{method=\"cri\"} 3"),
        "{text}"
    );

    drainer.cancel(&req).await.unwrap();
    assert_eq!(
        kubelet.0.lock().unwrap().as_slice(),
        ["stop", "start"],
        "a cancel starts the kubelet again"
    );
}

#[tokio::test]
async fn a_cluster_path_that_fails_while_reachable_drains_locally_once() {
    let env = Env::new(KubeletConfig::node(NODE)).await;
    env.cluster
        .uninstall_crd(nodegrace::api::NODE_MAINTENANCE_CRD_NAME)
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
    let client_source = env.cluster.api.kube_config().unwrap();
    let drainer = NodeDrainer::start(parts(&env, settings, &runtime, &kubelet), move || {
        let config = client_source.clone();
        async move { Ok(kube::Client::try_from(config)?) }
    });
    let req = request(ShutdownKind::Poweroff, Duration::from_secs(60));
    tokio::time::timeout(Duration::from_secs(20), drainer.drain(&req))
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
