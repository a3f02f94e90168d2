//! The shutdown budget: logind's InhibitDelayMaxUSec, the drop-in raising it, bad loginds.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nodegrace::{Phase, Status};
use nodegrace_testkit::{DrainMode, FakeState, ScriptedDrainer, TestEnv};

const MIN: Duration = Duration::from_secs(60);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("timed out waiting")
}

fn drainer() -> Arc<ScriptedDrainer> {
    Arc::new(ScriptedDrainer::new(DrainMode::Immediate))
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn a_dropin_sorting_last_is_written_and_logind_reloaded_when_the_budget_is_too_low() {
    let dir = tempfile::tempdir().unwrap();
    let env = TestEnv::start(dir.path(), FakeState::with_delay(Duration::from_secs(30)))
        .await
        .unwrap();
    let dropins = dir.path().join("logind.conf.d");
    // Like unattended-upgrades' drop-in, which would otherwise win.
    std::fs::write(
        dropins.join("zzz-unattended-upgrades.conf"),
        "[Login]\nInhibitDelayMaxSec=30\n",
    )
    .unwrap();

    let d = env.spawn(env.daemon(env.settings(), drainer()));
    let st = within(d.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();

    let ours: Vec<String> = names(&dropins)
        .into_iter()
        .filter(|n| n != "zzz-unattended-upgrades.conf")
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert!(
        ours[0].as_str() > "zzz-unattended-upgrades.conf",
        "{ours:?}"
    );
    let text = std::fs::read_to_string(dropins.join(&ours[0])).unwrap();
    assert!(
        text.contains("[Login]\nInhibitDelayMaxSec=900s\n"),
        "{text}"
    );

    let fake = env.fakes.state();
    assert_eq!(
        fake.kill_unit_calls,
        vec![("systemd-logind.service".to_string(), "main".to_string(), 1)]
    );
    assert_eq!(fake.delay_max, Some(15 * MIN));
    let reload = env.log.position("systemd: KillUnit").unwrap();
    let inhibit = env.log.position("logind: Inhibit(").unwrap();
    assert!(reload < inhibit);

    let b = st.budget.unwrap();
    assert_eq!(b.logind_initial, Duration::from_secs(30));
    assert_eq!(b.logind_effective, 15 * MIN);
    assert_eq!(b.budget, 15 * MIN);
    assert_eq!(b.dropin_written, Some(dropins.join(&ours[0])));
    assert!(b.reload_requested);
    assert_eq!(b.error, None);
    let other = b
        .delay_dropins
        .iter()
        .find(|x| x.path.ends_with("zzz-unattended-upgrades.conf"))
        .unwrap();
    assert!(!other.overrides_ours);
    let file = Status::read(&env.paths().status_file).unwrap();
    assert_eq!(file.budget.unwrap().budget, 15 * MIN);
}

#[tokio::test]
async fn no_dropin_when_logind_already_allows_enough() {
    let dir = tempfile::tempdir().unwrap();
    let env = TestEnv::start(dir.path(), FakeState::with_delay(20 * MIN))
        .await
        .unwrap();
    let d = env.spawn(env.daemon(env.settings(), drainer()));
    let st = within(d.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();
    assert!(names(&dir.path().join("logind.conf.d")).is_empty());
    assert!(env.fakes.state().kill_unit_calls.is_empty());
    let b = st.budget.unwrap();
    assert_eq!((b.budget, b.logind_effective), (15 * MIN, 20 * MIN));
    assert!(!b.reload_requested);
}

#[tokio::test]
async fn without_dropin_management_the_budget_is_logind_s() {
    let dir = tempfile::tempdir().unwrap();
    let env = TestEnv::start(dir.path(), FakeState::with_delay(Duration::from_secs(30)))
        .await
        .unwrap();
    let mut settings = env.settings();
    settings.shutdown.manage_logind_dropin = false;
    let d = env.spawn(env.daemon(settings, drainer()));
    let st = within(d.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();
    assert!(names(&dir.path().join("logind.conf.d")).is_empty());
    assert_eq!(st.budget.unwrap().budget, Duration::from_secs(30));
}

#[tokio::test]
async fn an_unwritable_dropin_is_a_clear_error_and_leaves_no_half_file() {
    let dir = tempfile::tempdir().unwrap();
    let env = TestEnv::start(dir.path(), FakeState::with_delay(Duration::from_secs(30)))
        .await
        .unwrap();
    // The rename onto the drop-in's name fails: a directory is in the way.
    let blocked = dir.path().join("blocked");
    std::fs::create_dir_all(blocked.join("zz-nodegrace.conf")).unwrap();
    let mut settings = env.settings();
    settings.shutdown.logind_dropin_dir = blocked.clone();
    let d = env.spawn(env.daemon(settings, drainer()));
    let st = within(d.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();
    assert_eq!(names(&blocked), vec!["zz-nodegrace.conf".to_string()]);
    let b = st.budget.unwrap();
    let err = b.error.unwrap();
    assert!(
        err.starts_with("cannot write logind drop-in ") && err.contains("zz-nodegrace.conf"),
        "{err}"
    );
    assert!(!err.contains('\n'));
    assert_eq!(b.budget, Duration::from_secs(30));
    assert!(env.fakes.state().kill_unit_calls.is_empty());
    assert!(st.inhibitor_held, "a lower budget is still a budget");

    // A drop-in directory that cannot even exist.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let mut settings = env.settings();
    settings.shutdown.logind_dropin_dir = file.join("logind.conf.d");
    let d2 = env.spawn(env.daemon(settings, drainer()));
    let st = within(d2.handle.wait_for(|s| s.phase == Phase::Armed))
        .await
        .unwrap();
    assert!(st
        .budget
        .unwrap()
        .error
        .unwrap()
        .starts_with("cannot write logind drop-in"));
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[tokio::test]
async fn a_logind_without_the_delay_property_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut state = FakeState::with_delay(MIN);
    state.delay_max = None;
    let env = TestEnv::start(dir.path(), state).await.unwrap();
    let d = env.spawn(env.daemon(env.settings(), drainer()));
    let err = within(d.task).await.unwrap().unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("InhibitDelayMaxUSec"), "{msg}");
    assert!(env.fakes.state().inhibitors.is_empty());
    let file = Status::read(&env.paths().status_file).unwrap();
    assert!(file.last_error.unwrap().contains("InhibitDelayMaxUSec"));
}
