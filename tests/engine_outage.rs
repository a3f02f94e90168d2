//! Issue 33's bad input, on the fake apiserver: what an apiserver does on its way back from an
//! outage (404 for a pod it still has, a watch that resumes past a compaction, its clock stepped
//! meanwhile) costs no pod its grace, evicts none twice and never releases a node that is not
//! empty.

mod engine_support;

use std::time::{Duration, Instant};

use engine_support::*;
use nodegrace::ShutdownKind;
use serde_json::json;

/// The shipped `fallback.apiserver_timeout`, so that an outage is ridden out, not fallen back
/// from.
fn shipped_timeout(env: &Env) -> nodegrace::Settings {
    let mut settings = env.settings();
    settings.fallback.apiserver_timeout = Duration::from_secs(10);
    settings
}

/// Until the engine has seen the node's pod: the outage starts after it is running.
async fn synced(engine: &nodegrace::Engine) {
    let started = Instant::now();
    while engine.pods().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "never synced");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The apiserver is away when the poweroff comes and while it is away its clock is stepped an
/// hour ahead (or the node's back: the same skew). web's eviction, accepted on its return,
/// carries a `deletionTimestamp` an hour later than the node's clock reads it; by the node's
/// clock alone web would look late at its escalation time and its grace be cut. It is going
/// in time (10 s of grace, gone after 8 s, its band ends 12.5 s after the return): no DELETE.
#[tokio::test]
async fn a_clock_step_while_the_apiserver_was_away_cuts_no_grace() {
    let env = Env::new(kubelet(8000)).await;
    env.pod("web", Kind::Default, 0, 10, json!({}));
    let engine = env.engine(shipped_timeout(&env));
    synced(&engine).await;
    let api = env.cluster.api.clone();
    let store = env.cluster.store.clone();
    api.set_reachable(false).await.unwrap();
    let back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        store.step_clock(chrono::Duration::hours(1));
        api.set_reachable(true).await.unwrap();
    });
    engine
        .shutdown_drain(&request(ShutdownKind::Poweroff, Duration::from_secs(18)))
        .await
        .expect("an outage shorter than fallback.apiserver_timeout is ridden out");
    back.await.unwrap();
    assert_went_once_with_its_grace(&env, "web");
}

/// An apiserver that has just restarted answers 404 for a pod it still has (seen on v1.28.4):
/// the pod is not taken as gone (the node is not released with it still there), it is asked
/// again and evicted once.
#[tokio::test]
async fn a_404_for_a_pod_the_restarted_apiserver_still_has_is_not_taken_as_gone() {
    let env = Env::new(kubelet(1500)).await;
    env.pod("web", Kind::Default, 0, 30, json!({}));
    let engine = env.engine(shipped_timeout(&env));
    synced(&engine).await;
    let api = env.cluster.api.clone();
    api.set_reachable(false).await.unwrap();
    let back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2000)).await;
        api.inject_errors(Some("POST"), "/api/v1/namespaces/*/pods/*/eviction", 404, 2);
        api.inject_errors(Some("GET"), "/api/v1/namespaces/*/pods/*", 404, 2);
        api.set_reachable(true).await.unwrap();
    });
    engine
        .shutdown_drain(&request(ShutdownKind::Poweroff, Duration::from_secs(60)))
        .await
        .expect("the drain finishes");
    back.await.unwrap();
    assert!(!env.pod_exists("web"), "released with web still there");
    assert_eq!(
        env.evictions(),
        ["web", "web", "web"],
        "asked again after each 404, not again once accepted"
    );
    assert!(env.deletes().is_empty(), "{:?}", env.deletes());
}

/// web goes while the apiserver is away, and the apiserver comes back compacted past the
/// watch's resourceVersion (410 Gone): the engine lists again, sees the node empty and returns
/// at once, not at a timer or the budget's end.
#[tokio::test]
async fn a_watch_resumed_past_a_compaction_still_sees_the_node_empty_at_once() {
    let env = Env::new(kubelet(2000)).await;
    env.pod("web", Kind::Default, 0, 30, json!({}));
    let engine = env.engine(shipped_timeout(&env));
    let api = env.cluster.api.clone();
    let store = env.cluster.store.clone();
    let gone_while_away = {
        let env_requests = env.cluster.api.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            while pod_requests(&env_requests.requests(), "POST", "/eviction").is_empty() {
                assert!(started.elapsed() < Duration::from_secs(10), "never evicted");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            api.set_reachable(false).await.unwrap();
            while store.get_obj("", "pods", "work", "web").is_some() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(1000)).await;
            store.compact();
            api.set_reachable(true).await.unwrap();
            Instant::now()
        })
    };
    engine
        .shutdown_drain(&request(ShutdownKind::Poweroff, Duration::from_secs(60)))
        .await
        .expect("the drain finishes");
    let returned = Instant::now();
    let back_at = gone_while_away.await.unwrap();
    let after = returned.saturating_duration_since(back_at);
    assert!(
        after < Duration::from_secs(3),
        "the node seen empty {after:?} after the apiserver came back"
    );
    assert_eq!(env.evictions(), ["web"]);
    assert!(env.deletes().is_empty());
}
