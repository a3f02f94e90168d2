//! `nodegrace history NODE` against the fake apiserver after a drain the engine ran: the
//! shutdown it draws is the one the daemon's Events tell.

mod engine_support;

use std::time::Duration;

use engine_support::*;
use nodegrace::ShutdownKind;
use serde_json::json;

/// `nodegrace history node-a` with a kubeconfig for the fake apiserver, 80 columns.
fn history(env: &Env, columns: &str) -> String {
    let kubeconfig = env.dir.path().join("operator.kubeconfig");
    nodegrace_testkit::write_kubeconfig(&kubeconfig, &env.cluster.api.url()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .args(["history", NODE, "--kubeconfig"])
        .arg(&kubeconfig)
        .env("COLUMNS", columns)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drain_with_a_budget_wait_and_an_escalation_is_drawn_from_its_events() {
    let env = Env::new(kubelet(100)).await;
    env.pod("db", Kind::Default, 0, 30, json!({"app": "db"}));
    env.pod("crit", Kind::Default, 2_000_001_000, 30, json!({}));
    env.pdb("db-pdb", "db", 1);
    let engine = env.engine(env.settings());
    drain_timed(&engine, ShutdownKind::Poweroff, Duration::from_secs(4)).await;
    // Events are written in the background.
    for _ in 0..100 {
        if !env.events("Drained").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    assert_cluster_role_allows(&env.requests());
    env.cluster.api.clear_requests();
    let drawn = tokio::task::block_in_place(|| history(&env, "80"));
    for line in drawn.lines() {
        assert!(line.chars().count() <= 80, "{line:?} in\n{drawn}");
    }
    for expected in [
        "node-a: shutdown at ",
        ", drained",
        "band Default<=1000000000 ",
        "work/db waited on PodDisruptionBudget work/db-pdb",
        "E +",
        "escalated (deleted with the grace left): work/db",
    ] {
        assert!(drawn.contains(expected), "{expected:?} missing:\n{drawn}");
    }
    let waited: f64 = drawn
        .lines()
        .find(|l| l.contains("work/db waited on"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|d| d.trim_end_matches('s').parse().ok())
        .unwrap();
    assert!(
        waited >= 1.0,
        "db waited from its refusal to its escalation:\n{drawn}"
    );
    let bars = |c: char| drawn.lines().filter(|l| l.contains(c)).count();
    assert!(bars('█') >= 2, "a bar per band and the legend:\n{drawn}");
    assert!(bars('░') >= 2, "db's wait and the legend:\n{drawn}");
    let narrow = tokio::task::block_in_place(|| history(&env, "40"));
    assert!(narrow.lines().all(|l| l.chars().count() <= 40), "{narrow}");
    assert!(narrow.contains("work/db waited on"), "{narrow}");
    assert_reads_only(&env);
}

/// The command's requests (by its user agent: the engine, still writing events in the
/// background, sends none): the Events in `default` and the shutdown maintenance, read
/// only (what `history --help` says it needs).
fn assert_reads_only(env: &Env) {
    let mine: Vec<_> = env
        .requests()
        .into_iter()
        .filter(|r| r.user_agent.starts_with("nodegrace/"))
        .collect();
    assert!(!mine.is_empty(), "no request of the command recorded");
    for r in mine {
        assert_eq!(r.method, "GET", "{} {}", r.method, r.path);
        assert!(
            r.path
                .starts_with("/apis/events.k8s.io/v1/namespaces/default/events")
                || r.path.ends_with("/nodemaintenances/shutdown-node-a"),
            "{}",
            r.path
        );
    }
    env.cluster.api.clear_requests();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_without_shutdown_events_says_so() {
    let env = Env::new(kubelet(100)).await;
    let said = tokio::task::block_in_place(|| history(&env, "80"));
    assert!(
        said.starts_with("no shutdown of node node-a told by the Events kept"),
        "{said}"
    );
    assert_reads_only(&env);
}
