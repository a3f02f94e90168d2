//! Bus faults: the first connection failing and the bus restarting. Alone in its test
//! binary because it counts the process's open fds.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nodegrace::Phase;
use nodegrace_testkit::{open_fd_count, DrainMode, FakeState, ScriptedDrainer, TestEnv};

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("timed out waiting")
}

#[tokio::test]
async fn reconnects_after_bus_restarts_without_leaking_fds() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = TestEnv::start(dir.path(), FakeState::with_delay(Duration::from_secs(1200)))
        .await
        .unwrap();
    // No bus at all when the daemon starts: the first connection must be retried.
    env.fakes.disconnect();
    env.bus.kill();
    let drainer = ScriptedDrainer::new(DrainMode::UntilFinished);
    let d = env.spawn(env.daemon(env.settings(), Arc::new(drainer.clone())));
    let st = within(d.handle.wait_for(|s| s.last_error.is_some()))
        .await
        .unwrap();
    assert_eq!(st.phase, Phase::Starting);
    assert!(!d.task.is_finished());

    env.bus.restart().unwrap();
    env.fakes.serve(env.bus.address()).await.unwrap();
    within(
        d.handle
            .wait_for(|s| s.phase == Phase::Armed && s.inhibitor_held),
    )
    .await
    .unwrap();
    let baseline = open_fd_count();

    for round in 2..=4 {
        env.restart_bus().await.unwrap();
        let fake = within(
            env.fakes
                .wait_until(|s| s.taken_by("nodegrace").len() == round && s.held().len() == 1),
        )
        .await;
        assert!(fake.taken_by("nodegrace").last().unwrap().held());
        within(d.handle.wait_for(|s| s.bus_connected && s.inhibitor_held))
            .await
            .unwrap();
        assert_eq!(open_fd_count(), baseline, "fds after bus restart {round}");
    }

    // Still working: a shutdown is handled on the new connection.
    env.fakes.prepare_for_shutdown(true).await.unwrap();
    within(drainer.wait_until(|r| r.drains.len() == 1)).await;
    drainer.finish();
    within(env.fakes.wait_until(|s| s.held().is_empty())).await;
}
