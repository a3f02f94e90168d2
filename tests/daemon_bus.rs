//! Bus faults: a shutdown that began while nodegrace was disconnected.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nodegrace::Phase;
use nodegrace_testkit::{DrainMode, FakeState, ScriptedDrainer, TestEnv};

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("timed out waiting")
}

#[tokio::test]
async fn a_shutdown_that_began_while_disconnected_is_drained_on_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = TestEnv::start(dir.path(), FakeState::with_delay(Duration::from_secs(1200)))
        .await
        .unwrap();
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let d = env.spawn(env.daemon(env.settings(), Arc::new(drainer.clone())));
    within(d.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();

    env.fakes.disconnect();
    env.bus.kill();
    within(d.handle.wait_for(|s| !s.bus_connected))
        .await
        .unwrap();
    env.fakes.with(|s| s.preparing = true);
    env.bus.restart().unwrap();
    env.fakes.serve(env.bus.address()).await.unwrap();

    let rec = within(drainer.wait_until(|r| r.drains.len() == 1)).await;
    assert!(!rec.drains[0].req.resumed);
    within(
        d.handle
            .wait_for(|s| s.phase == Phase::Draining && s.inhibitor_held),
    )
    .await
    .unwrap();
    drainer.finish();
    within(env.fakes.wait_until(|s| s.held().is_empty())).await;
}

#[tokio::test]
async fn logind_leaving_the_bus_is_a_reconnect_with_a_new_inhibitor() {
    let dir = tempfile::tempdir().unwrap();
    let env = TestEnv::start(dir.path(), FakeState::with_delay(Duration::from_secs(1200)))
        .await
        .unwrap();
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let d = env.spawn(env.daemon(env.settings(), Arc::new(drainer.clone())));
    within(d.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();

    // logind (and systemd's name, served by the same fake connection) leave; the bus stays.
    env.fakes.disconnect();
    within(d.handle.wait_for(|s| !s.bus_connected))
        .await
        .unwrap();
    env.fakes.serve(env.bus.address()).await.unwrap();
    let fake = within(
        env.fakes
            .wait_until(|s| s.taken_by("nodegrace").len() == 2 && s.held().len() == 1),
    )
    .await;
    assert!(fake.taken_by("nodegrace")[1].held());
    within(
        d.handle
            .wait_for(|s| s.bus_connected && s.phase == Phase::Armed),
    )
    .await
    .unwrap();
}
