//! SIGHUP reaches the drain: the running daemon (fake logind on a private bus) with the real
//! node drainer (drain engine against the fake apiserver, CRI fallback against the fake
//! runtime) reloads its configuration, and the next shutdown uses the new `[drain]`
//! reserves (and `nodegrace_budget_needed_seconds` says them at once) and `[fallback]` bands.

mod engine_support;

use std::sync::Arc;
use std::time::Duration;

use engine_support::{eventually, Env, Kind, NODE};
use nodegrace::{
    BootIdSource, NodeDrainer, NodeParts, Phase, PodCache, PriorityGracePeriod, Settings,
};
use nodegrace_testkit::fake_cri::{CriCall, FakeRuntime};
use nodegrace_testkit::fake_kubelet::KubeletConfig;
use nodegrace_testkit::{FakeState, TestEnv};
use serde_json::json;

const BUDGET: Duration = Duration::from_secs(8);

/// A daemon on fake logind whose drainer is the real node drainer on `cluster`; SIGHUP
/// returns `reloaded`.
async fn daemon(
    dir: &tempfile::TempDir,
    cluster: &Env,
    runtime: &FakeRuntime,
    initial: Settings,
    reloaded: Settings,
) -> (TestEnv, nodegrace_testkit::harness::RunningDaemon) {
    let logind = TestEnv::start(dir.path(), FakeState::with_delay(BUDGET))
        .await
        .expect("private bus with fakes");
    let fake = cluster.cluster.clone();
    std::fs::write(cluster.dir.path().join("boot_id"), "boot-1").unwrap();
    let drainer = NodeDrainer::start(
        NodeParts {
            settings: initial.clone(),
            node: NODE.into(),
            runtime: Arc::new(runtime.clone()),
            kubelet: None,
            gate: cluster.gate.clone(),
            metrics: cluster.metrics.clone(),
            boot_id: BootIdSource::File(cluster.dir.path().join("boot_id")),
        },
        move || {
            let fake = fake.clone();
            async move { fake.clients() }
        },
    );
    let daemon = logind
        .daemon(initial, Arc::new(drainer))
        .with_reloader(Box::new(move || Ok(reloaded.clone())));
    let running = logind.spawn_until_armed(daemon).await;
    (logind, running)
}

/// Settings of both fixtures: the daemon's paths, the cluster's node, an 8 s budget.
fn settings(logind_dir: &tempfile::TempDir, cluster: &Env) -> Settings {
    let mut s = cluster.settings();
    s.shutdown.max_delay = BUDGET;
    s.shutdown.logind_dropin_dir = logind_dir.path().join("logind.conf.d");
    s.shutdown.manage_logind_dropin = false;
    s.static_pods.manifest_dir = logind_dir.path().join("manifests");
    s.static_pods.gate_dir = cluster.dir.path().join("gated-manifests");
    s
}

/// The critical reserve decides when a blocked first band is escalated: with 7 s of an 8 s
/// budget kept for critical pods it would be at 0.5 s; reloaded to 2 s, at 4 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_drain_reserve_moves_the_escalation() {
    let cluster = Env::new(KubeletConfig::node(NODE)).await;
    cluster.pod("db", Kind::Default, 0, 2, json!({"app": "db"}));
    cluster.pdb("db-pdb", "db", 1);
    cluster.pod(
        "crit",
        Kind::Default,
        2_000_000_000,
        2,
        json!({"app": "crit"}),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut initial = settings(&dir, &cluster);
    initial.drain.reserve_critical = Duration::from_secs(7);
    let mut reloaded = initial.clone();
    reloaded.drain.reserve_critical = Duration::from_secs(2);
    let runtime = FakeRuntime::new();
    let (logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

    assert_eq!(d.handle.status().phase, Phase::Armed);
    let needed = |secs: &str| {
        let line = format!("nodegrace_budget_needed_seconds {secs}");
        cluster.metrics.render().unwrap().lines().any(|l| l == line)
    };
    eventually(10, "the critical reserve needed", || needed("7.0")).await;
    // The reload runs off the state machine's thread; the reloader answers at once.
    d.handle.reload();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        needed("2.0"),
        "the metric kept the reserve before the reload"
    );
    let started = std::time::Instant::now();
    logind.fakes.prepare_for_shutdown(true).await.unwrap();
    eventually(10, "the db pod escalated", || !cluster.deletes().is_empty()).await;
    let at = started.elapsed();
    assert!(
        at >= Duration::from_millis(3500),
        "escalated after {at:?}: the reloaded reserve (escalation at 4 s) was not used"
    );
    assert_eq!(cluster.deletes(), ["db"]);
}

/// The fallback's bands decide the grace of the pods it stops: reloaded from 30 s to 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_fallback_band_sets_the_grace_of_the_offline_drain() {
    let cluster = Env::new(KubeletConfig::node(NODE)).await;
    let dir = tempfile::tempdir().unwrap();
    let band = |grace| {
        vec![PriorityGracePeriod {
            priority: 0,
            shutdown_grace_period: Duration::from_secs(grace),
        }]
    };
    let mut initial = settings(&dir, &cluster);
    initial.fallback.apiserver_timeout = Duration::from_secs(1);
    initial.fallback.shutdown_grace_period_by_pod_priority = band(30);
    let mut reloaded = initial.clone();
    reloaded.fallback.shutdown_grace_period_by_pod_priority = band(3);
    PodCache {
        node: NODE.into(),
        written_at: None,
        pods: vec![],
    }
    .store(&initial.state_dir)
    .unwrap();
    let runtime = FakeRuntime::new();
    runtime.add_pod("work", "web", "uid-web", Duration::from_millis(100));
    cluster.cluster.api.set_reachable(false).await.unwrap();
    let (logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

    // The reload runs off the state machine's thread; the reloader answers at once.
    d.handle.reload();
    tokio::time::sleep(Duration::from_millis(300)).await;
    logind.fakes.prepare_for_shutdown(true).await.unwrap();
    eventually(10, "the offline drain stops web", || {
        runtime
            .calls()
            .iter()
            .any(|c| matches!(c, CriCall::StopContainer { pod, .. } if pod == "work/web"))
    })
    .await;
    let graces: Vec<Duration> = runtime
        .calls()
        .iter()
        .filter_map(|c| match c {
            CriCall::StopContainer { grace, .. } => Some(*grace),
            _ => None,
        })
        .collect();
    assert_eq!(graces, [Duration::from_secs(3)], "the reloaded band");
}
