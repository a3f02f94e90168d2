//! The inhibitor in systemd's fd store, against the fake logind on a private bus: a store
//! that keeps real duplicates of the fds it is sent, as systemd does, so that the fake
//! logind sees a lock as held until every copy is closed.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nodegrace::{Daemon, Notifier, Notify, Phase, ZbusConnector, INHIBITOR_FDNAME};
use nodegrace_testkit::{DrainMode, EventLog, FakeState, ScriptedDrainer, TestEnv};

const MIN: Duration = Duration::from_secs(60);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("timed out waiting")
}

/// systemd's side of `FDSTORE=1` / `FDSTOREREMOVE=1`, keyed by `FDNAME`.
#[derive(Clone, Default)]
struct FdStore {
    fds: Arc<Mutex<BTreeMap<String, Vec<OwnedFd>>>>,
    log: EventLog,
}

impl FdStore {
    fn count(&self, name: &str) -> usize {
        self.fds.lock().unwrap().get(name).map_or(0, Vec::len)
    }

    /// What systemd passes to the restarted service: a copy, the store keeps its own.
    fn passed(&self, name: &str) -> Option<OwnedFd> {
        let fds = self.fds.lock().unwrap();
        fds.get(name)?.first().map(|fd| fd.try_clone().unwrap())
    }
}

impl Notifier for FdStore {
    fn notify(&self, msg: Notify) {
        if msg == Notify::Ready {
            self.log.push("notify: READY=1");
        }
    }
    fn watchdog_interval(&self) -> Option<Duration> {
        None
    }
    fn store_fd(&self, name: &str, fd: BorrowedFd<'_>) {
        let dup = fd.try_clone_to_owned().unwrap();
        self.log.push(format!(
            "notify: FDSTORE=1 FDNAME={name} fd={}",
            fd.as_raw_fd()
        ));
        self.fds
            .lock()
            .unwrap()
            .entry(name.into())
            .or_default()
            .push(dup);
    }
    fn remove_stored_fd(&self, name: &str) {
        self.log
            .push(format!("notify: FDSTOREREMOVE=1 FDNAME={name}"));
        self.fds.lock().unwrap().remove(name);
    }
}

async fn env(dir: &tempfile::TempDir) -> TestEnv {
    TestEnv::start(dir.path(), FakeState::with_delay(20 * MIN))
        .await
        .expect("private bus with fakes")
}

impl FdStore {
    fn logging_to(env: &TestEnv) -> FdStore {
        FdStore {
            log: env.log.clone(),
            ..FdStore::default()
        }
    }
}

fn daemon(env: &TestEnv, store: &FdStore, drainer: &ScriptedDrainer) -> Daemon {
    Daemon::new(
        env.settings(),
        env.paths(),
        Arc::new(ZbusConnector::at(env.bus.address())),
        Arc::new(drainer.clone()),
        Arc::new(store.clone()),
    )
}

#[tokio::test]
async fn the_inhibitor_is_stored_and_removed_before_the_release() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir).await;
    let store = FdStore::logging_to(&env);
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let d = env.spawn_until_armed(daemon(&env, &store, &drainer)).await;
    assert_eq!(store.count(INHIBITOR_FDNAME), 1);
    let inhibit = env.log.position("logind: Inhibit(").unwrap();
    let stored = env
        .log
        .position("notify: FDSTORE=1 FDNAME=logind-inhibitor")
        .unwrap();
    let ready = env.log.position("notify: READY=1").unwrap();
    assert!(
        inhibit < stored && stored < ready,
        "{:?}",
        env.log.entries()
    );

    env.fakes.prepare_for_shutdown(true).await.unwrap();
    within(drainer.wait_until(|r| r.drains.len() == 1)).await;
    drainer.finish();
    // Held by the store's copy too: the fake sees it closed only once both are gone.
    let st = within(env.fakes.wait_until(|s| s.held().is_empty())).await;
    let closed = st.taken_by("nodegrace")[0].closed_at.unwrap();
    let finished = drainer.record().drains[0].finished.unwrap();
    eprintln!(
        "drain done -> inhibitor closed (with FDSTOREREMOVE): {:?}",
        closed.duration_since(finished)
    );
    assert_eq!(store.count(INHIBITOR_FDNAME), 0);
    let removed = env
        .log
        .position("notify: FDSTOREREMOVE=1 FDNAME=logind-inhibitor")
        .unwrap();
    let seen_closed = env.log.position("logind: inhibitor").unwrap_or(usize::MAX);
    assert!(removed < seen_closed, "{:?}", env.log.entries());
    assert!(closed.duration_since(finished) < Duration::from_secs(1));
    d.handle.terminate();
    within(d.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_killed_daemon_leaves_the_lock_held_and_the_restart_adopts_it() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir).await;
    let store = FdStore::logging_to(&env);
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let first = env.spawn_until_armed(daemon(&env, &store, &drainer)).await;
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    within(first.handle.wait_for(|s| s.phase == Phase::Draining))
        .await
        .unwrap();

    first.kill().await;
    // The process's fd is closed; systemd's copy keeps logind waiting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(env.held_by_us(), 1, "the kill released the delay lock");
    assert_eq!(store.count(INHIBITOR_FDNAME), 1);

    let passed = store.passed(INHIBITOR_FDNAME);
    let second = env.spawn(daemon(&env, &store, &drainer).with_adopted_inhibitor(passed));
    let rec = within(drainer.wait_until(|r| r.drains.len() == 2)).await;
    assert!(rec.drains[1].req.resumed);
    let st = within(second.handle.wait_for(|s| s.phase == Phase::Draining))
        .await
        .unwrap();
    assert!(st.inhibitor_held);
    let fake = env.fakes.state();
    assert_eq!(
        fake.taken_by("nodegrace").len(),
        1,
        "adopted, not a second Inhibit"
    );
    assert_eq!(store.count(INHIBITOR_FDNAME), 1);

    drainer.finish();
    within(env.fakes.wait_until(|s| s.held().is_empty())).await;
    assert_eq!(store.count(INHIBITOR_FDNAME), 0);
    within(second.handle.wait_for(|s| s.phase == Phase::Released))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_stored_fd_logind_no_longer_holds_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir).await;
    let store = FdStore::logging_to(&env);
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    // A fifo whose reader is gone: what a lock logind dropped looks like.
    let (r, w) = nix::unistd::pipe().unwrap();
    drop(r);
    let d = env
        .spawn_until_armed(daemon(&env, &store, &drainer).with_adopted_inhibitor(Some(w)))
        .await;
    assert_eq!(env.held_by_us(), 1);
    assert_eq!(store.count(INHIBITOR_FDNAME), 1);
    d.handle.terminate();
    within(d.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_plain_stop_empties_the_store_and_releases() {
    let dir = tempfile::tempdir().unwrap();
    let env = env(&dir).await;
    let store = FdStore::logging_to(&env);
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let d = env.spawn_until_armed(daemon(&env, &store, &drainer)).await;
    assert_eq!(store.count(INHIBITOR_FDNAME), 1);
    d.handle.terminate();
    within(d.task).await.unwrap().unwrap();
    assert_eq!(store.count(INHIBITOR_FDNAME), 0);
    within(env.fakes.wait_until(|s| s.held().is_empty())).await;
    assert!(
        drainer.record().drains.is_empty(),
        "a plain stop does not drain"
    );
}

#[tokio::test]
async fn a_reconnect_replaces_the_stored_inhibitor() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = env(&dir).await;
    let store = FdStore::logging_to(&env);
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let d = env.spawn_until_armed(daemon(&env, &store, &drainer)).await;
    env.restart_bus().await.unwrap();
    within(env.fakes.wait_until(|s| s.taken_by("nodegrace").len() == 2)).await;
    within(d.handle.wait_for(|s| s.bus_connected && s.inhibitor_held))
        .await
        .unwrap();
    // Only the new lock stays held: the old one left both the process and the store.
    within(env.fakes.wait_until(|s| {
        let ours = s.taken_by("nodegrace");
        !ours[0].held() && ours[1].held()
    }))
    .await;
    assert_eq!(store.count(INHIBITOR_FDNAME), 1);
    d.handle.terminate();
    within(d.task).await.unwrap().unwrap();
}
