//! SIGHUP reaches every component: the running daemon (fake logind on a private bus) with the
//! real node drainer (drain engine against the fake apiserver, CRI fallback against the fake
//! runtime) reloads its configuration, and what the next shutdown does shows each reloaded
//! key in use. `config::tests::RELOADED` names the test of each key; the keys of
//! `config::RESTART_ONLY` are kept (`daemon_lifecycle`).

mod engine_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine_support::{eventually, kubelet, request, Env, Kind, NODE};
use nodegrace::{
    shutdown_maintenance_name, BootIdSource, CompletionPolicy, DrainPlanEntrySetting,
    KubeletControl, NodeDrainer, NodeParts, Phase, PodCache, PodType, PriorityGracePeriod,
    Settings, ShutdownKind, Stage,
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
    daemon_with(dir, cluster, runtime, None, initial, reloaded).await
}

/// [`daemon`] whose offline drain stops and starts the kubelet through `kubelet`.
async fn daemon_with(
    dir: &tempfile::TempDir,
    cluster: &Env,
    runtime: &FakeRuntime,
    kubelet: Option<Arc<dyn KubeletControl>>,
    initial: Settings,
    reloaded: Settings,
) -> (TestEnv, nodegrace_testkit::harness::RunningDaemon) {
    let logind = TestEnv::start(dir.path(), FakeState::with_delay(BUDGET))
        .await
        .expect("private bus with fakes");
    let fake = cluster.cluster.clone();
    let boot_id = cluster.dir.path().join("boot_id");
    if !boot_id.exists() {
        std::fs::write(&boot_id, "boot-1").unwrap();
    }
    let drainer = NodeDrainer::start(
        NodeParts {
            settings: initial.clone(),
            node: NODE.into(),
            runtime: Arc::new(runtime.clone()),
            kubelet,
            gate: cluster.gate.clone(),
            metrics: cluster.metrics.clone(),
            boot_id: BootIdSource::File(boot_id),
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

/// SIGHUP; the reload runs off the state machine's thread, and the reloader answers at once
/// (a second for both on a loaded machine).
async fn reload(d: &nodegrace_testkit::harness::RunningDaemon) {
    d.handle.reload();
    tokio::time::sleep(Duration::from_secs(1)).await;
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
    reload(&d).await;
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

/// Stops and starts of the kubelet's unit, in order.
#[derive(Clone, Default)]
struct RecordingKubelet(Arc<Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl KubeletControl for RecordingKubelet {
    async fn stop(&self, unit: &str) -> anyhow::Result<()> {
        self.0.lock().unwrap().push(format!("stop {unit}"));
        Ok(())
    }
    async fn start(&self, unit: &str) -> anyhow::Result<()> {
        self.0.lock().unwrap().push(format!("start {unit}"));
        Ok(())
    }
}

fn band(grace: u64) -> Vec<PriorityGracePeriod> {
    vec![PriorityGracePeriod {
        priority: 0,
        shutdown_grace_period: Duration::from_secs(grace),
    }]
}

/// The graces the offline drain stopped containers with, once it stopped `work/web`.
async fn offline_graces(runtime: &FakeRuntime) -> Vec<Duration> {
    eventually(10, "the offline drain stops web", || {
        runtime
            .calls()
            .iter()
            .any(|c| matches!(c, CriCall::StopContainer { pod, .. } if pod == "work/web"))
    })
    .await;
    runtime
        .calls()
        .iter()
        .filter_map(|c| match c {
            CriCall::StopContainer { grace, .. } => Some(*grace),
            _ => None,
        })
        .collect()
}

/// The apiserver away, a runtime with one pod and an empty pod cache.
fn offline(settings: &Settings) -> FakeRuntime {
    PodCache {
        node: NODE.into(),
        written_at: None,
        pods: vec![],
    }
    .store(&settings.state_dir)
    .unwrap();
    let runtime = FakeRuntime::new();
    runtime.add_pod("work", "web", "uid-web", Duration::from_millis(100));
    runtime
}

/// Every key of `[fallback]` but the CRI endpoint: the offline drain, off and waiting 60 s for
/// the apiserver before the reload, runs after 1 s; it stops the reloaded kubelet unit and
/// gives the pods the reloaded band's grace (3 s, not 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_fallback_section_drives_the_offline_drain() {
    let cluster = Env::new(KubeletConfig::node(NODE)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut initial = settings(&dir, &cluster);
    initial.fallback.enabled = false;
    initial.fallback.apiserver_timeout = Duration::from_secs(60);
    initial.fallback.stop_kubelet = false;
    initial.fallback.kubelet_unit = "kubelet.service".into();
    initial.fallback.shutdown_grace_period_by_pod_priority = band(30);
    let mut reloaded = initial.clone();
    reloaded.fallback.enabled = true;
    reloaded.fallback.apiserver_timeout = Duration::from_secs(1);
    reloaded.fallback.stop_kubelet = true;
    reloaded.fallback.kubelet_unit = "k8s-node.service".into();
    reloaded.fallback.shutdown_grace_period_by_pod_priority = band(3);
    let runtime = offline(&initial);
    cluster.cluster.api.set_reachable(false).await.unwrap();
    let units = RecordingKubelet::default();
    let kubelet: Arc<dyn KubeletControl> = Arc::new(units.clone());
    let (logind, d) = daemon_with(&dir, &cluster, &runtime, Some(kubelet), initial, reloaded).await;

    reload(&d).await;
    let started = std::time::Instant::now();
    logind.fakes.prepare_for_shutdown(true).await.unwrap();
    let graces = offline_graces(&runtime).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the offline drain began after {:?}: not the reloaded apiserver_timeout",
        started.elapsed()
    );
    assert_eq!(graces, [Duration::from_secs(3)], "the reloaded band");
    assert_eq!(
        units.0.lock().unwrap().first().map(String::as_str),
        Some("stop k8s-node.service"),
        "the reloaded kubelet unit"
    );
}

/// `fallback.kubelet_config` and `kubelet_config_dir` are read again by the reload: the
/// kubelet's bands they lead to give the offline drain's grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_files_are_read_again_on_reload() {
    for changed in ["kubelet_config", "kubelet_config_dir"] {
        let cluster = Env::new(KubeletConfig::node(NODE)).await;
        let dir = tempfile::tempdir().unwrap();
        let files = dir.path().join("files");
        let kubelet_file = |name: &str, grace: u64| {
            let text = format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodByPodPriority:\n- priority: 0\n  shutdownGracePeriodSeconds: {grace}\n"
            );
            std::fs::create_dir_all(files.join(name).parent().unwrap()).unwrap();
            std::fs::write(files.join(name), text).unwrap();
        };
        kubelet_file("before.yaml", 30);
        kubelet_file("after.yaml", 3);
        std::fs::create_dir_all(files.join("before.d")).unwrap();
        // A drop-in's list replaces the file's.
        kubelet_file("after.d/50-grace.conf", 3);
        let config = dir.path().join("config.toml");
        let write_config = |file: &str, drop_ins: &str| {
            let text = format!(
                "[fallback]\nkubelet_config = {:?}\nkubelet_config_dir = {:?}\n",
                files.join(file).display().to_string(),
                files.join(drop_ins).display().to_string()
            );
            std::fs::write(&config, text).unwrap();
        };
        write_config("before.yaml", "before.d");
        let mut initial = settings(&dir, &cluster);
        let read = nodegrace::commands::load_settings(&config).unwrap();
        initial.fallback = read.fallback;
        initial.fallback.apiserver_timeout = Duration::from_secs(1);
        assert_eq!(
            initial.fallback.shutdown_grace_period_by_pod_priority,
            band(30)
        );
        let runtime = offline(&initial);
        cluster.cluster.api.set_reachable(false).await.unwrap();
        match changed {
            "kubelet_config" => write_config("after.yaml", "before.d"),
            _ => write_config("before.yaml", "after.d"),
        }
        // What the daemon's reloader does: read the files again; the test's own keys stay.
        let mut reloaded = initial.clone();
        reloaded.fallback = nodegrace::commands::load_settings(&config)
            .unwrap()
            .fallback;
        reloaded.fallback.apiserver_timeout = Duration::from_secs(1);
        let (logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

        reload(&d).await;
        logind.fakes.prepare_for_shutdown(true).await.unwrap();
        let graces = offline_graces(&runtime).await;
        assert_eq!(graces, [Duration::from_secs(3)], "{changed} reloaded");
    }
}

/// `nodegrace_budget_needed_seconds` is what the drain plan reserves for the classes with
/// pods: a DaemonSet pod, a static pod and a pod at priority 0 (critical once
/// `critical_priority` is reloaded to 0). 2 s + 4 s + 8 s: a key that stays at 1 s, or a
/// pod that stays uncritical, gives another sum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloaded_reserves_set_the_budget_needed() {
    let cluster = Env::new(KubeletConfig::node(NODE)).await;
    cluster.pod("agent", Kind::DaemonSet, 0, 2, json!({"app": "agent"}));
    cluster.pod("etcd", Kind::Static, 0, 2, json!({"app": "etcd"}));
    cluster.pod("web", Kind::Default, 0, 2, json!({"app": "web"}));
    let dir = tempfile::tempdir().unwrap();
    let initial = settings(&dir, &cluster);
    let mut reloaded = initial.clone();
    reloaded.drain.reserve_daemonset = Duration::from_secs(2);
    reloaded.drain.reserve_static = Duration::from_secs(4);
    reloaded.drain.reserve_critical = Duration::from_secs(8);
    reloaded.drain.critical_priority = 0;
    let runtime = FakeRuntime::new();
    let (_logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;
    let needed = |secs: &str| {
        let line = format!("nodegrace_budget_needed_seconds {secs}");
        cluster.metrics.render().unwrap().lines().any(|l| l == line)
    };
    eventually(10, "the reserves of the DaemonSet and static pods", || {
        needed("2.0")
    })
    .await;
    reload(&d).await;
    eventually(10, "the reloaded reserves of all three classes", || {
        needed("14.0")
    })
    .await;
}

/// The maintenance `name` is Complete and the node schedulable.
fn completed_and_uncordoned(cluster: &Env, name: &str) -> bool {
    cluster
        .maintenance(name)
        .is_some_and(|m| m.spec.stage == Stage::Complete)
        && cluster.node()["spec"]
            .get("unschedulable")
            .is_none_or(|u| u == false)
}

/// A shutdown cancelled after `shutdown.on_cancel` was reloaded to `complete`: its
/// NodeMaintenance moves to Complete and the node is uncordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_on_cancel_completes_a_cancelled_shutdown() {
    let cluster = Env::new(kubelet(100)).await;
    cluster.pod("db", Kind::Default, 0, 30, json!({"app": "db"}));
    cluster.pdb("db-pdb", "db", 1);
    let dir = tempfile::tempdir().unwrap();
    let mut initial = settings(&dir, &cluster);
    initial.shutdown.on_cancel = CompletionPolicy::Keep;
    let mut reloaded = initial.clone();
    reloaded.shutdown.on_cancel = CompletionPolicy::Complete;
    let runtime = FakeRuntime::new();
    let (logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

    reload(&d).await;
    let name = shutdown_maintenance_name(NODE);
    logind.fakes.prepare_for_shutdown(true).await.unwrap();
    eventually(10, "the shutdown maintenance", || {
        cluster.maintenance(&name).is_some()
    })
    .await;
    logind.fakes.prepare_for_shutdown(false).await.unwrap();
    eventually(
        10,
        "the maintenance completed and the node uncordoned",
        || completed_and_uncordoned(&cluster, &name),
    )
    .await;
}

/// The drain plan the next shutdown follows: `back` first after the reload (`front` first
/// before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_drain_plan_orders_the_next_shutdown() {
    let cluster = Env::new(kubelet(200)).await;
    cluster.pod("front", Kind::Default, 0, 1, json!({"app": "front"}));
    cluster.pod("back", Kind::Default, 0, 1, json!({"app": "back"}));
    let first = |app: &str| {
        vec![DrainPlanEntrySetting {
            pod_type: PodType::Default,
            pod_priority: 0,
            pod_selector: [("app".to_string(), app.to_string())].into(),
        }]
    };
    let dir = tempfile::tempdir().unwrap();
    let mut initial = settings(&dir, &cluster);
    initial.drain.plan = first("front");
    let mut reloaded = initial.clone();
    reloaded.drain.plan = first("back");
    let runtime = FakeRuntime::new();
    let (logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

    reload(&d).await;
    logind.fakes.prepare_for_shutdown(true).await.unwrap();
    eventually(10, "both pods evicted", || cluster.evictions().len() == 2).await;
    assert_eq!(cluster.evictions(), ["back", "front"]);
}

/// The wait for the node's volumes after the last band: reloaded from 60 s (past the 8 s
/// budget) to 1 s, the inhibitor is released about a second after the pod went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_volume_detach_timeout_releases_sooner() {
    let cluster = Env::new(kubelet(50)).await;
    cluster.pod("app", Kind::Default, 0, 30, json!({}));
    cluster
        .cluster
        .store
        .update_in_process("", "nodes", "", NODE, |n| {
            n["status"]["volumesInUse"] = json!(["kubernetes.io/csi/csi.example.com^vol-1"]);
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut initial = settings(&dir, &cluster);
    initial.drain.volume_detach_timeout = Duration::from_secs(60);
    let mut reloaded = initial.clone();
    reloaded.drain.volume_detach_timeout = Duration::from_secs(1);
    let runtime = FakeRuntime::new();
    let (logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

    reload(&d).await;
    let started = std::time::Instant::now();
    logind.fakes.prepare_for_shutdown(true).await.unwrap();
    eventually(10, "the inhibitor released", || {
        d.handle.status().phase == Phase::Released
    })
    .await;
    let at = started.elapsed();
    assert!(
        at < Duration::from_secs(5),
        "released after {at:?}: the reloaded volume wait (1 s) was not used"
    );
    assert!(!cluster.pod_exists("app"));
}

/// Requests in flight at once, reloaded from 3 to 1: with every eviction answered a second
/// late, one of the band's three pods is being evicted at a time. (The engine's requests on
/// the Eviction API; nodegrace's eviction-request controller: the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_max_concurrent_requests_bounds_the_evictions_in_flight() {
    let cluster = Env::new(kubelet(50)).await;
    for name in ["a", "b", "c"] {
        cluster.pod(name, Kind::Default, 0, 1, json!({"app": name}));
    }
    cluster
        .cluster
        .api
        .delay(Some("POST"), "*/eviction", Duration::from_secs(2));
    let dir = tempfile::tempdir().unwrap();
    let mut initial = settings(&dir, &cluster);
    initial.drain.max_concurrent_requests = 3;
    let mut reloaded = initial.clone();
    reloaded.drain.max_concurrent_requests = 1;
    let runtime = FakeRuntime::new();
    let (logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

    reload(&d).await;
    logind.fakes.prepare_for_shutdown(true).await.unwrap();
    eventually(10, "the first eviction sent", || {
        !cluster.evictions().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        cluster.evictions().len(),
        1,
        "more than one eviction in flight"
    );
    eventually(15, "every pod evicted", || cluster.evictions().len() == 3).await;
}

/// Eviction attempts of `pod` so far.
fn attempts(cluster: &Env, pod: &str) -> usize {
    cluster.evictions().iter().filter(|p| *p == pod).count()
}

/// A pod its disruption budget keeps is asked again after 1 s, 2 s, 4 s... up to the cap in
/// force: an admin's drain (`eviction_backoff_max`), then a shutdown
/// (`eviction_backoff_max_shutdown`), each reloaded from minutes to 1 s. In 5.5 s that is six
/// attempts; at the running caps it would be three (0, 1 and 3 s). The pod's grace is 1 s so
/// that the shutdown escalates it only near the end of its 8 s budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloaded_backoff_caps_pace_the_blocked_evictions() {
    for shutdown in [false, true] {
        let cluster = Env::new(kubelet(50)).await;
        cluster.pod("db", Kind::Default, 0, 1, json!({"app": "db"}));
        cluster.pdb("db-pdb", "db", 1);
        let dir = tempfile::tempdir().unwrap();
        let mut initial = settings(&dir, &cluster);
        initial.drain.eviction_backoff_max = Duration::from_secs(15 * 60);
        initial.drain.eviction_backoff_max_shutdown = Duration::from_secs(5 * 60);
        let mut reloaded = initial.clone();
        match shutdown {
            false => reloaded.drain.eviction_backoff_max = Duration::from_secs(1),
            true => reloaded.drain.eviction_backoff_max_shutdown = Duration::from_secs(1),
        }
        let runtime = FakeRuntime::new();
        let (logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

        reload(&d).await;
        if shutdown {
            logind.fakes.prepare_for_shutdown(true).await.unwrap();
        } else {
            cluster.admin_maintenance("upgrade", "Drain", json!([]));
        }
        eventually(10, "the first eviction", || attempts(&cluster, "db") > 0).await;
        tokio::time::sleep(Duration::from_millis(5500)).await;
        let n = attempts(&cluster, "db");
        // Four or more: the running caps allow three.
        assert!(
            n >= 4,
            "shutdown: {shutdown}: {n} attempts in 5.5 s: the reloaded cap (1 s) was not used"
        );
    }
}

/// `shutdown.after_boot` reloaded while the apiserver is still away: when it answers, the
/// last boot's shutdown maintenance is completed (and not kept, as before the reload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_after_boot_completes_the_last_shutdown() {
    let cluster = Env::new(kubelet(50)).await;
    cluster.pod("web", Kind::Default, 0, 1, json!({}));
    let dir = tempfile::tempdir().unwrap();
    let mut initial = settings(&dir, &cluster);
    initial.shutdown.after_boot = CompletionPolicy::Keep;
    let mut reloaded = initial.clone();
    reloaded.shutdown.after_boot = CompletionPolicy::Complete;
    // The last boot's shutdown (boot-1) drained the node and left its maintenance.
    let engine = cluster.engine(initial.clone());
    engine
        .shutdown_drain(&request(ShutdownKind::Reboot, Duration::from_secs(60)))
        .await
        .unwrap();
    drop(engine);
    let name = shutdown_maintenance_name(NODE);
    assert_eq!(cluster.maintenance(&name).unwrap().spec.stage, Stage::Drain);
    std::fs::write(cluster.dir.path().join("boot_id"), "boot-2").unwrap();
    cluster.cluster.api.set_reachable(false).await.unwrap();
    let runtime = FakeRuntime::new();
    let (_logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

    reload(&d).await;
    cluster.cluster.api.set_reachable(true).await.unwrap();
    eventually(
        15,
        "the last shutdown completed and the node uncordoned",
        || completed_and_uncordoned(&cluster, &name),
    )
    .await;
}

/// `drain.kubelet_root_dir` reloaded from "" (the API alone ends a band) to a root with no
/// pod's volume mounted: `slow`, still terminating in the API for 30 s but run by no
/// container, no longer holds the first band, and the critical pod is asked to go at once,
/// not at its step's start (7 s into the 8 s budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_kubelet_root_dir_is_where_mounts_are_read() {
    let cluster = Env::new(kubelet(30_000)).await;
    cluster.pod("slow", Kind::Default, 0, 30, json!({"app": "slow"}));
    cluster.pod(
        "crit",
        Kind::Default,
        2_000_000_000,
        1,
        json!({"app": "crit"}),
    );
    let dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let mut initial = settings(&dir, &cluster);
    initial.drain.kubelet_root_dir = None;
    let mut reloaded = initial.clone();
    reloaded.drain.kubelet_root_dir = Some(root.path().to_path_buf());
    let runtime = FakeRuntime::new();
    let (logind, d) = daemon(&dir, &cluster, &runtime, initial, reloaded).await;

    reload(&d).await;
    let started = std::time::Instant::now();
    logind.fakes.prepare_for_shutdown(true).await.unwrap();
    eventually(10, "the critical pod evicted", || {
        cluster.evictions().contains(&"crit".to_string())
    })
    .await;
    let at = started.elapsed();
    assert!(
        at < Duration::from_secs(4),
        "the critical band began after {at:?}: the node's view under the reloaded root was not read"
    );
    assert!(cluster.pod_exists("slow"), "slow is still terminating");
}
