//! The shutdown lifecycle against fake logind/systemd services on a private dbus-daemon.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nodegrace::{
    current_boot_id, Phase, RouteEvent, ShutdownKind, ShutdownPhase, ShutdownState, Status, Way,
};
use nodegrace_testkit::{DrainMode, FakeState, ScriptedDrainer, TestEnv};

const MIN: Duration = Duration::from_secs(60);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("timed out waiting")
}

async fn env(dir: &tempfile::TempDir, delay: Duration) -> TestEnv {
    TestEnv::start(dir.path(), FakeState::with_delay(delay))
        .await
        .expect("private bus with fakes")
}

#[tokio::test]
async fn inhibitor_is_held_before_ready_and_status_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let _daemon = env
        .spawn_armed(env.settings(), Arc::new(drainer.clone()))
        .await;

    let fake = env.fakes.state();
    let ours = fake.taken_by("nodegrace");
    assert_eq!(ours.len(), 1);
    assert!(ours[0].held());
    assert_eq!(
        (ours[0].what.as_str(), ours[0].mode.as_str()),
        ("shutdown", "delay")
    );
    assert_eq!(ours[0].pid, std::process::id());
    let inhibit = env.log.position("logind: Inhibit(").unwrap();
    let ready = env.log.position("notify: READY=1").unwrap();
    assert!(inhibit < ready, "{:?}", env.log.entries());

    let file = Status::read(&env.paths().status_file).unwrap();
    assert_eq!(file.phase, Phase::Armed);
    assert!(file.inhibitor_held && file.bus_connected);
    let budget = file.budget.unwrap();
    assert_eq!(budget.budget, 15 * MIN);
    assert_eq!(budget.logind_effective, 20 * MIN);
    assert_eq!(budget.dropin_written, None);
    assert_eq!(
        file.timeline.iter().map(|c| c.phase).collect::<Vec<_>>(),
        vec![Phase::Starting, Phase::Armed]
    );
    within(drainer.wait_until(|r| r.after_boots == 1)).await;
    assert!(drainer.record().drains.is_empty());
}

#[tokio::test]
async fn drain_starts_on_the_signal_and_the_inhibitor_closes_when_it_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let settings = env.settings();
    let d = env
        .spawn_armed(settings.clone(), Arc::new(drainer.clone()))
        .await;

    env.fakes
        .prepare_for_shutdown_typed(true, "reboot")
        .await
        .unwrap();
    let rec = within(drainer.wait_until(|r| !r.drains.is_empty())).await;
    let req = rec.drains[0].req.clone();
    assert_eq!(req.kind, ShutdownKind::Reboot);
    assert_eq!(req.budget, 15 * MIN);
    assert!(!req.resumed);
    assert_eq!(req.boot_id, current_boot_id());

    let st = within(d.handle.wait_for(|s| s.phase == Phase::Draining))
        .await
        .unwrap();
    assert_eq!(st.shutdown.unwrap().started_at, req.started_at);
    let persisted = ShutdownState::load(&settings.state_dir).unwrap().unwrap();
    assert_eq!(persisted.phase, ShutdownPhase::Draining);
    assert_eq!(persisted.started_at, req.started_at);
    assert_eq!(persisted.boot_id, current_boot_id());
    assert_eq!(env.held_by_us(), 1, "the lock is held while draining");

    drainer.finish();
    let fake = within(env.fakes.wait_until(|s| s.held().is_empty())).await;
    let closed = fake.taken_by("nodegrace")[0].closed_at.unwrap();
    let finished = drainer.record().drains[0].finished.unwrap();
    assert!(closed >= finished);
    let st = within(d.handle.wait_for(|s| s.phase == Phase::Released))
        .await
        .unwrap();
    assert!(!st.inhibitor_held);
    assert_eq!(
        ShutdownState::load(&settings.state_dir)
            .unwrap()
            .unwrap()
            .phase,
        ShutdownPhase::Released
    );
    assert!(env
        .log
        .entries()
        .iter()
        .any(|e| e.starts_with("notify: STATUS=draining")));
}

/// The way the drain goes is the lifecycle's: no apiserver at first, so offline until it
/// answers, then through the cluster again with the shutdown's maintenance kept (resumed);
/// the status names the way, and the inhibitor goes once the cluster drained the node.
#[tokio::test]
async fn the_drain_goes_offline_and_back_to_the_cluster_leg_by_leg() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    drainer.legs([
        RouteEvent::Begin { engine: false },
        RouteEvent::ApiserverBack,
    ]);
    let d = env
        .spawn_armed(env.settings(), Arc::new(drainer.clone()))
        .await;
    env.fakes
        .prepare_for_shutdown_typed(true, "poweroff")
        .await
        .unwrap();
    let st = within(
        d.handle
            .wait_for(|s| s.shutdown.as_ref().and_then(|s| s.way) == Some(Way::Online)),
    )
    .await
    .unwrap();
    assert_eq!(st.phase, Phase::Draining);
    assert_eq!(env.held_by_us(), 1, "the lock is held while draining");
    drainer.finish();
    let st = within(d.handle.wait_for(|s| s.phase == Phase::Released))
        .await
        .unwrap();
    assert_eq!(st.shutdown.and_then(|s| s.way), None);
    let legs = drainer.record().legs;
    let ways: Vec<(Way, bool)> = legs.iter().map(|(w, r)| (*w, r.resumed)).collect();
    assert_eq!(
        ways,
        [
            (Way::Connecting, false),
            (Way::Offline { switch_back: true }, false),
            (Way::Online, true),
        ]
    );
    assert_eq!(
        st.last_shutdown.map(|l| l.outcome),
        Some(nodegrace::ShutdownOutcome::Drained)
    );
}

#[tokio::test]
async fn the_inhibitor_is_released_when_the_budget_ends() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::Forever);
    let mut settings = env.settings();
    settings.shutdown.max_delay = 90 * Duration::from_secs(1);
    let d = env.spawn_armed(settings, Arc::new(drainer.clone())).await;

    // From here on the clock only moves when every task is idle.
    tokio::time::pause();
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    let rec = drainer.wait_until(|r| !r.drains.is_empty()).await;
    let started = rec.drains[0].started_tokio;
    let fake = env.fakes.wait_until(|s| s.held().is_empty()).await;
    let closed = fake.taken_by("nodegrace")[0].closed_at_tokio.unwrap();
    let waited = closed - started;
    assert!(
        waited >= Duration::from_secs(90) && waited < Duration::from_secs(91),
        "released after {waited:?}"
    );
    let rec = drainer.wait_until(|r| r.drains[0].dropped).await;
    assert!(rec.drains[0].finished.is_none());
    let st = d
        .handle
        .wait_for(|s| s.phase == Phase::Released)
        .await
        .unwrap();
    assert_eq!(st.timeline.last().unwrap().reason, "shutdown budget ended");
}

#[tokio::test]
async fn cancel_stops_the_drain_and_retakes_the_inhibitor() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let settings = env.settings();
    let d = env
        .spawn_armed(settings.clone(), Arc::new(drainer.clone()))
        .await;

    // Cancelled mid-drain: the drain stops, the lock we hold stays.
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    within(drainer.wait_until(|r| r.drains.len() == 1)).await;
    env.fakes.prepare_for_shutdown(false).await.unwrap();
    let rec = within(drainer.wait_until(|r| r.cancels.len() == 1 && r.drains[0].dropped)).await;
    assert_eq!(rec.cancels[0].started_at, rec.drains[0].req.started_at);
    within(
        d.handle
            .wait_for(|s| s.phase == Phase::Armed && s.shutdown.is_none()),
    )
    .await
    .unwrap();
    assert_eq!(env.held_by_us(), 1);
    assert_eq!(env.fakes.state().taken_by("nodegrace").len(), 1);
    assert_eq!(
        ShutdownState::load(&settings.state_dir)
            .unwrap()
            .unwrap()
            .phase,
        ShutdownPhase::Cancelled
    );

    // Cancelled after release: a new lock is taken.
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    within(drainer.wait_until(|r| r.drains.len() == 2)).await;
    drainer.finish();
    within(env.fakes.wait_until(|s| s.held().is_empty())).await;
    env.fakes.prepare_for_shutdown(false).await.unwrap();
    let fake = within(env.fakes.wait_until(|s| s.held().len() == 1)).await;
    assert_eq!(fake.taken_by("nodegrace").len(), 2);
    within(drainer.wait_until(|r| r.cancels.len() == 2)).await;
    within(
        d.handle
            .wait_for(|s| s.phase == Phase::Armed && s.inhibitor_held),
    )
    .await
    .unwrap();

    // And the next shutdown is handled like the first.
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    within(drainer.wait_until(|r| r.drains.len() == 3)).await;
}

#[tokio::test]
async fn a_daemon_killed_mid_shutdown_resumes_with_the_persisted_start() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::Forever);
    let settings = env.settings();
    let first = env
        .spawn_armed(settings.clone(), Arc::new(drainer.clone()))
        .await;
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    let rec = within(drainer.wait_until(|r| r.drains.len() == 1)).await;
    let original = rec.drains[0].req.clone();
    within(first.handle.wait_for(|s| s.phase == Phase::Draining))
        .await
        .unwrap();

    first.kill().await;
    within(env.fakes.wait_until(|s| s.held().is_empty())).await;
    assert!(drainer.record().drains[0].dropped);

    let second = env.spawn(env.daemon(settings, Arc::new(drainer.clone())));
    let rec = within(drainer.wait_until(|r| r.drains.len() == 2)).await;
    let resumed = &rec.drains[1].req;
    assert!(resumed.resumed);
    assert_eq!(resumed.started_at, original.started_at);
    assert_eq!(resumed.budget, original.budget);
    let st = within(second.handle.wait_for(|s| s.phase == Phase::Draining))
        .await
        .unwrap();
    assert!(st.shutdown.unwrap().resumed);
    assert!(st.inhibitor_held);
    assert_eq!(env.held_by_us(), 1);
    assert_eq!(drainer.record().after_boots, 1, "only the first start");
}

#[tokio::test]
async fn a_shutdown_cancelled_while_down_is_cancelled_on_start() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::Forever);
    let settings = env.settings();
    let first = env
        .spawn_armed(settings.clone(), Arc::new(drainer.clone()))
        .await;
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    within(first.handle.wait_for(|s| s.phase == Phase::Draining))
        .await
        .unwrap();
    first.kill().await;
    env.fakes.with(|s| s.preparing = false);

    let _second = env.spawn_armed(settings, Arc::new(drainer.clone())).await;
    let rec = within(drainer.wait_until(|r| r.cancels.len() == 1)).await;
    assert_eq!(rec.drains.len(), 1);
    assert_eq!(rec.after_boots, 1, "only the first start");
}

#[tokio::test]
async fn a_plain_stop_exits_without_draining() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::Immediate);
    let d = env
        .spawn_armed(env.settings(), Arc::new(drainer.clone()))
        .await;
    d.handle.terminate();
    within(d.task).await.unwrap().unwrap();
    within(env.fakes.wait_until(|s| s.held().is_empty())).await;
    assert!(drainer.record().drains.is_empty());
    assert!(env.log.position("notify: STOPPING=1").is_some());
    let file = Status::read(&env.paths().status_file).unwrap();
    assert_eq!(file.phase, Phase::Stopping);
}

async fn stop_while_the_system_goes_down(state: &str, jobs: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let settings = env.settings();
    let d = env
        .spawn_armed(settings.clone(), Arc::new(drainer.clone()))
        .await;
    env.fakes.with(|s| {
        s.system_state = state.into();
        s.jobs = jobs
            .iter()
            .map(|(u, t)| (u.to_string(), t.to_string()))
            .collect();
    });
    d.handle.terminate();
    let rec = within(drainer.wait_until(|r| r.drains.len() == 1)).await;
    assert_eq!(rec.drains[0].req.kind, ShutdownKind::Bypass);
    assert_eq!(
        rec.drains[0].req.budget,
        settings.shutdown.stop_drain_timeout
    );
    assert_eq!(env.held_by_us(), 1, "held while the bypass drain runs");
    assert!(!d.task.is_finished());
    drainer.finish();
    within(d.task).await.unwrap().unwrap();
    let persisted = ShutdownState::load(&settings.state_dir).unwrap().unwrap();
    assert_eq!(persisted.kind, ShutdownKind::Bypass);
    assert_eq!(persisted.phase, ShutdownPhase::Released);
}

#[tokio::test]
async fn stop_while_systemd_is_stopping_drains_first() {
    stop_while_the_system_goes_down("stopping", &[]).await;
}

#[tokio::test]
async fn stop_with_a_queued_poweroff_drains_first() {
    stop_while_the_system_goes_down("running", &[("poweroff.target", "start")]).await;
}

#[tokio::test]
async fn reload_applies_runtime_keys_and_keeps_the_config_when_invalid() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let settings = env.settings();
    let calls = Arc::new(AtomicUsize::new(0));
    let (c, base) = (calls.clone(), settings.clone());
    let daemon = env
        .daemon(settings, Arc::new(drainer.clone()))
        .with_reloader(Box::new(move || {
            let mut s = base.clone();
            match c.fetch_add(1, Ordering::SeqCst) {
                0 => anyhow::bail!("config.toml line 3: unknown key `max_dela`"),
                1 => s.shutdown.stop_drain_timeout = Duration::from_secs(42),
                _ => {
                    s.shutdown.stop_drain_timeout = Duration::from_secs(7);
                    // Only after a restart: the budget was negotiated with logind at start.
                    s.shutdown.max_delay = 10 * MIN;
                }
            }
            Ok(s)
        }));
    let d = env.spawn(daemon);
    within(d.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();
    d.handle.reload();
    d.handle.reload();
    d.handle.reload();
    // Control messages are handled in order: the stop below sees all three reloads.
    env.fakes.with(|s| s.system_state = "stopping".into());
    d.handle.terminate();
    let rec = within(drainer.wait_until(|r| r.drains.len() == 1)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(rec.drains[0].req.budget, Duration::from_secs(7));
    let st = d.handle.status();
    assert_eq!(st.budget.unwrap().budget, 15 * MIN);
    drainer.finish();
    within(d.task).await.unwrap().unwrap();
}

/// The kubelet's own shutdown delay inhibitor, as it takes it.
fn kubelet_takes_its_lock(env: &TestEnv) {
    env.fakes.add_foreign_inhibitor(
        "kubelet",
        "Kubelet needs time to handle node shutdown",
        4242,
    );
}

#[tokio::test]
async fn a_kubelet_delay_inhibitor_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    kubelet_takes_its_lock(&env);
    let d = env.spawn(env.daemon(
        env.settings(),
        Arc::new(ScriptedDrainer::new(DrainMode::Immediate)),
    ));
    let st = within(
        d.handle
            .wait_for(|s| s.phase == Phase::Armed && s.kubelet_inhibitor.is_some()),
    )
    .await
    .unwrap();
    assert!(st.kubelet_inhibitor.unwrap().contains("kubelet"));
}

/// The kubelet takes its delay lock once its runtime is up, often after nodegrace armed:
/// logind's inhibitors are read again (every 30 s) and a lock taken later is reported too.
#[tokio::test]
async fn a_kubelet_delay_inhibitor_taken_after_arming_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let d = env.spawn(env.daemon(
        env.settings(),
        Arc::new(ScriptedDrainer::new(DrainMode::Immediate)),
    ));
    within(d.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();
    assert!(d.handle.status().kubelet_inhibitor.is_none());
    kubelet_takes_its_lock(&env);
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(31)).await;
    tokio::time::resume();
    let st = within(d.handle.wait_for(|s| s.kubelet_inhibitor.is_some()))
        .await
        .unwrap();
    assert!(st.kubelet_inhibitor.unwrap().contains("kubelet"));
}

/// `shutdown.warn_kubelet_inhibitor` turned on by a reload: the next look at logind's
/// inhibitors (every 30 s) reports the kubelet's lock.
#[tokio::test]
async fn a_reloaded_warn_kubelet_inhibitor_reports_the_kubelets_lock() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    kubelet_takes_its_lock(&env);
    let mut settings = env.settings();
    settings.shutdown.warn_kubelet_inhibitor = false;
    let mut reloaded = settings.clone();
    reloaded.shutdown.warn_kubelet_inhibitor = true;
    let d = env.spawn(
        env.daemon(
            settings,
            Arc::new(ScriptedDrainer::new(DrainMode::Immediate)),
        )
        .with_reloader(Box::new(move || Ok(reloaded.clone()))),
    );
    within(d.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();
    assert!(d.handle.status().kubelet_inhibitor.is_none());
    d.handle.reload();
    // The reload is applied on the daemon's loop, unseen: look again until it is reported.
    for _ in 0..50 {
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(31)).await;
        tokio::time::resume();
        let reported = d.handle.wait_for(|s| s.kubelet_inhibitor.is_some());
        if tokio::time::timeout(Duration::from_millis(200), reported)
            .await
            .is_ok()
        {
            break;
        }
    }
    let seen = d.handle.status().kubelet_inhibitor;
    assert!(
        seen.as_deref().is_some_and(|k| k.contains("kubelet")),
        "{seen:?}"
    );
}

/// A state.json whose budget no clock can hold (found by fuzzing: it panicked the daemon at
/// every start, so systemd restarted it in a loop) is set aside, and the shutdown logind is
/// preparing is drained afresh with the negotiated budget.
#[tokio::test]
async fn a_corrupt_state_file_is_set_aside_and_the_shutdown_drained_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let settings = env.settings();
    std::fs::create_dir_all(&settings.state_dir).unwrap();
    let state_file = settings.state_dir.join("state.json");
    let corrupt = serde_json::json!({
        "phase": "draining",
        "kind": "reboot",
        "startedAt": chrono::Utc::now().to_rfc3339(),
        "budgetSeconds": 1e15,
        "bootId": current_boot_id(),
        "updatedAt": chrono::Utc::now().to_rfc3339(),
    })
    .to_string();
    std::fs::write(&state_file, &corrupt).unwrap();
    env.fakes.with(|s| s.preparing = true);

    let drainer = ScriptedDrainer::new(DrainMode::Forever);
    let d = env.spawn(env.daemon(settings.clone(), Arc::new(drainer.clone())));
    let rec = within(drainer.wait_until(|r| r.drains.len() == 1)).await;
    let req = &rec.drains[0].req;
    assert!(!req.resumed, "nothing to resume from a corrupt file");
    assert_eq!(req.budget, 15 * MIN);
    within(d.handle.wait_for(|s| s.phase == Phase::Draining))
        .await
        .unwrap();

    let aside: Vec<_> = std::fs::read_dir(&settings.state_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("state.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read_to_string(settings.state_dir.join(&aside[0])).unwrap(),
        corrupt,
        "kept as it was"
    );
    let fresh = ShutdownState::load(&settings.state_dir).unwrap().unwrap();
    assert_eq!(fresh.budget_seconds, (15 * MIN).as_secs_f64());
    d.kill().await;
}

/// A reloader returning `base` whose first read hangs until the sender is used (a file on a
/// hung mount), and the count of its reads.
#[allow(clippy::type_complexity)]
fn first_read_hangs(
    base: nodegrace::Settings,
) -> (
    std::sync::mpsc::Sender<()>,
    Arc<std::sync::atomic::AtomicUsize>,
    Box<dyn Fn() -> anyhow::Result<nodegrace::Settings> + Send + Sync>,
) {
    let (release, hold) = std::sync::mpsc::channel::<()>();
    let hold = std::sync::Mutex::new(hold);
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = reads.clone();
    let reloader = Box::new(move || {
        if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            let _ = hold.lock().unwrap().recv();
        }
        Ok(base.clone())
    });
    (release, reads, reloader)
}

/// SIGHUP reads the configuration off the state machine's thread: while the read hangs (a
/// file on a hung mount), shutdowns are still handled. The read is abandoned after 5 s;
/// SIGHUPs while it still hangs read nothing more (its thread cannot be stopped: three
/// SIGHUPs must not leave three), and once it has ended the next SIGHUP reads again.
#[tokio::test]
async fn a_hanging_reload_holds_up_no_shutdown_and_starts_no_other_read() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let settings = env.settings();
    let (release, reads, reloader) = first_read_hangs(settings.clone());
    let daemon = env
        .daemon(settings, Arc::new(drainer.clone()))
        .with_reloader(reloader);
    let d = env.spawn_until_armed(daemon).await;
    let count = || reads.load(std::sync::atomic::Ordering::SeqCst);
    let reloaded_at = std::time::Instant::now();
    d.handle.reload();
    tokio::time::sleep(Duration::from_millis(50)).await;

    env.fakes
        .prepare_for_shutdown_typed(true, "poweroff")
        .await
        .unwrap();
    within(drainer.wait_until(|r| r.drains.len() == 1)).await;
    drainer.finish();
    within(env.fakes.wait_until(|s| s.held().is_empty())).await;
    within(d.handle.wait_for(|s| s.phase == Phase::Released))
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(5200).saturating_sub(reloaded_at.elapsed())).await;
    d.handle.reload();
    d.handle.reload();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(count(), 1, "a read started beside the hung one");

    release.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    d.handle.reload();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(count(), 2, "the hung read ended: SIGHUP reads again");
    d.handle.terminate();
    within(d.task).await.unwrap().unwrap();
}

/// logind before 255 says nothing about the kind in `PrepareForShutdown`: the daemon reads it
/// from logind's `ScheduledShutdown` (what logind 252 sets during the delay), else from a
/// shutdown job systemd has queued, else it is unknown.
#[tokio::test]
async fn without_metadata_the_kind_comes_from_logind_or_systemd() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let d = env
        .spawn_armed(env.settings(), Arc::new(drainer.clone()))
        .await;
    /// (ScheduledShutdown type, systemd's queued jobs, the kind drained for)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], ShutdownKind);
    let cases: [Case; 5] = [
        ("reboot", &[], ShutdownKind::Reboot),
        ("poweroff", &[], ShutdownKind::Poweroff),
        ("kexec", &[], ShutdownKind::Kexec),
        ("", &[("reboot.target", "start")], ShutdownKind::Reboot),
        ("", &[], ShutdownKind::Unknown),
    ];
    for (n, (scheduled, jobs, want)) in cases.into_iter().enumerate() {
        env.fakes.with(|s| {
            s.scheduled_shutdown = scheduled.into();
            s.jobs = jobs
                .iter()
                .map(|(u, t)| (u.to_string(), t.to_string()))
                .collect();
        });
        env.fakes.prepare_for_shutdown(true).await.unwrap();
        let rec = within(drainer.wait_until(|r| r.drains.len() == n + 1)).await;
        assert_eq!(rec.drains[n].req.kind, want, "{scheduled:?} {jobs:?}");
        let st = within(d.handle.wait_for(|s| s.phase == Phase::Draining))
            .await
            .unwrap();
        assert_eq!(st.shutdown.unwrap().kind, want);
        env.fakes.with(|s| {
            s.scheduled_shutdown.clear();
            s.jobs.clear();
        });
        env.fakes.prepare_for_shutdown(false).await.unwrap();
        within(drainer.wait_until(|r| r.cancels.len() == n + 1)).await;
        within(d.handle.wait_for(|s| s.phase == Phase::Armed))
            .await
            .unwrap();
    }
}

/// logind 255+ names the shutdown in `PrepareForShutdownWithMetadata`, sent before
/// `PrepareForShutdown`: the kind comes from it (even where `ScheduledShutdown` says
/// otherwise), the later plain signal starts nothing more, and the status names the kind.
#[tokio::test]
async fn with_metadata_the_kind_comes_from_the_signal() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let d = env
        .spawn_armed(env.settings(), Arc::new(drainer.clone()))
        .await;
    let cases = [
        ("poweroff", ShutdownKind::Poweroff),
        ("reboot", ShutdownKind::Reboot),
        ("halt", ShutdownKind::Halt),
        ("kexec", ShutdownKind::Kexec),
        ("soft-reboot", ShutdownKind::SoftReboot),
        ("something-new", ShutdownKind::Unknown),
    ];
    for (n, (sent, want)) in cases.into_iter().enumerate() {
        // What logind before 255 would say: ignored when the signal says.
        env.fakes.with(|s| s.scheduled_shutdown = "poweroff".into());
        env.fakes
            .prepare_for_shutdown_typed(true, sent)
            .await
            .unwrap();
        let rec = within(drainer.wait_until(|r| r.drains.len() == n + 1)).await;
        assert_eq!(rec.drains[n].req.kind, want, "{sent}");
        let st = within(d.handle.wait_for(|s| s.phase == Phase::Draining))
            .await
            .unwrap();
        assert_eq!(st.shutdown.unwrap().kind, want);
        let file = Status::read(&env.paths().status_file).unwrap();
        assert_eq!(file.shutdown.unwrap().kind, want);
        let json = serde_json::to_value(want).unwrap();
        assert_eq!(json, want.as_str(), "status names it as logind does");
        env.fakes.with(|s| s.scheduled_shutdown.clear());
        env.fakes
            .prepare_for_shutdown_typed(false, sent)
            .await
            .unwrap();
        within(drainer.wait_until(|r| r.cancels.len() == n + 1)).await;
        within(d.handle.wait_for(|s| s.phase == Phase::Armed))
            .await
            .unwrap();
        assert_eq!(
            drainer.record().drains.len(),
            n + 1,
            "one drain per shutdown"
        );
    }
}

/// Issue 29's bad input from logind 255+: metadata without a type (or with one that is not a
/// string) leaves the kind to `ScheduledShutdown`, as before 255; the metadata signal alone
/// (no plain one), or the plain one alone, starts the drain; a shutdown announced again
/// (both signals twice, even naming another kind) drains once, as the kind first named.
#[tokio::test]
async fn odd_metadata_signals_start_one_drain_each_shutdown() {
    use std::collections::HashMap;
    use zbus::zvariant::Value;
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let d = env
        .spawn_armed(env.settings(), Arc::new(drainer.clone()))
        .await;
    let drained = |n: usize| {
        let drainer = drainer.clone();
        async move { within(drainer.wait_until(|r| r.drains.len() == n)).await }
    };
    let cancelled = |n: usize| {
        let drainer = drainer.clone();
        async move { within(drainer.wait_until(|r| r.cancels.len() == n)).await }
    };

    // No type, then the plain signal.
    env.fakes.with(|s| s.scheduled_shutdown = "reboot".into());
    env.fakes
        .prepare_for_shutdown_metadata(true, HashMap::new())
        .await
        .unwrap();
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    assert_eq!(drained(1).await.drains[0].req.kind, ShutdownKind::Reboot);
    env.fakes.prepare_for_shutdown(false).await.unwrap();
    cancelled(1).await;

    // A type that is no string, and no plain signal after it.
    env.fakes.with(|s| s.scheduled_shutdown = "halt".into());
    env.fakes
        .prepare_for_shutdown_metadata(true, HashMap::from([("type", Value::from(7u32))]))
        .await
        .unwrap();
    assert_eq!(drained(2).await.drains[1].req.kind, ShutdownKind::Halt);
    env.fakes
        .prepare_for_shutdown_metadata(false, HashMap::new())
        .await
        .unwrap();
    cancelled(2).await;
    env.fakes.with(|s| s.scheduled_shutdown.clear());

    // The metadata signal alone; then both signals twice, once naming another kind.
    env.fakes
        .prepare_for_shutdown_metadata(true, HashMap::from([("type", Value::from("soft-reboot"))]))
        .await
        .unwrap();
    assert_eq!(
        drained(3).await.drains[2].req.kind,
        ShutdownKind::SoftReboot
    );
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    env.fakes
        .prepare_for_shutdown_typed(true, "soft-reboot")
        .await
        .unwrap();
    env.fakes
        .prepare_for_shutdown_typed(true, "poweroff")
        .await
        .unwrap();
    within(d.handle.wait_for(|s| s.phase == Phase::Draining))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rec = drainer.record();
    assert_eq!(rec.drains.len(), 3, "one drain per shutdown");
    let file = Status::read(&env.paths().status_file).unwrap();
    assert_eq!(file.shutdown.unwrap().kind, ShutdownKind::SoftReboot);
    drainer.finish();
    within(env.fakes.wait_until(|s| s.held().is_empty())).await;
    let persisted = ShutdownState::load(&env.settings().state_dir)
        .unwrap()
        .unwrap();
    assert_eq!(persisted.kind, ShutdownKind::SoftReboot);
    assert_eq!(drainer.record().drains.len(), 3);
    d.handle.terminate();
    within(d.task).await.unwrap().unwrap();
}

/// A soft reboot keeps the kernel and so its boot id: the daemon that starts after one it
/// let go takes it as a boot (after_boot), not as a shutdown cancelled while it was down,
/// as it would a regular reboot.
#[tokio::test]
async fn the_start_after_a_soft_reboot_is_a_boot_not_a_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir, 20 * MIN).await;
    let drainer = ScriptedDrainer::new(DrainMode::Immediate);
    let settings = env.settings();
    let first = env
        .spawn_armed(settings.clone(), Arc::new(drainer.clone()))
        .await;
    env.fakes
        .prepare_for_shutdown_typed(true, "soft-reboot")
        .await
        .unwrap();
    within(first.handle.wait_for(|s| s.phase == Phase::Released))
        .await
        .unwrap();
    let persisted = ShutdownState::load(&settings.state_dir).unwrap().unwrap();
    assert_eq!(persisted.kind, ShutdownKind::SoftReboot);
    assert_eq!(persisted.phase, ShutdownPhase::Released);
    assert_eq!(persisted.boot_id, current_boot_id());
    first.kill().await;
    env.fakes.with(|s| s.preparing = false);

    let _second = env.spawn_armed(settings, Arc::new(drainer.clone())).await;
    let rec = within(drainer.wait_until(|r| r.after_boots == 2)).await;
    assert!(rec.cancels.is_empty(), "taken as a cancelled shutdown");
    assert_eq!(rec.drains.len(), 1);
}
