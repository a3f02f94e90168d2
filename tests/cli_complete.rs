//! `nodegrace complete` against the fake apiserver: what it changes in the cluster and on disk.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use nodegrace::node_maintenance_crd;
use nodegrace_testkit::fake_apiserver::FakeCluster;
use serde_json::json;

#[path = "engine_support/rbac.rs"]
mod rbac;

const NODE: &str = "node-a";

fn write_config(dir: &Path, server: &str) -> std::path::PathBuf {
    nodegrace_testkit::write_kubeconfig(&dir.join("kubeconfig"), server).unwrap();
    for d in ["manifests", "state"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let gate = dir.join("state/gated");
    std::fs::create_dir_all(&gate).unwrap();
    std::fs::set_permissions(&gate, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        gate.join("etcd.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n  namespace: kube-system\nspec:\n  containers:\n  - name: etcd\n    image: etcd\n",
    )
    .unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{d}/state\"\n[node]\nname = \"{NODE}\"\nkubeconfig = \"{d}/kubeconfig\"\n[static_pods]\nmanifest_dir = \"{d}/manifests\"\ngate_dir = \"{d}/state/gated\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    config
}

async fn complete(config: &Path) -> Output {
    let config = config.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_nodegrace"))
            .arg("--config")
            .arg(&config)
            .arg("complete")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn maintenance(name: &str, selector: serde_json::Value, stage: &str) -> serde_json::Value {
    json!({
        "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {"nodeSelector": selector, "stage": stage, "reason": "test"},
    })
}

#[tokio::test]
async fn static_pods_stay_gated_while_another_maintenance_drains_the_node() {
    let cluster = FakeCluster::start().await.unwrap();
    cluster
        .install_crd(&node_maintenance_crd().unwrap())
        .unwrap();
    cluster.add_node(NODE).unwrap();
    let pinned = json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]});
    let by_hostname = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]});
    let elsewhere = json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]});
    for m in [
        maintenance("shutdown-node-a", pinned.clone(), "Drain"),
        maintenance("upgrade", by_hostname, "Drain"),
        maintenance("other-node", elsewhere, "Drain"),
        maintenance("done", pinned, "Complete"),
    ] {
        cluster.insert(&m).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let server = cluster.api.kube_config().unwrap().cluster_url.to_string();
    let config = write_config(dir.path(), server.trim_end_matches('/'));

    let out = complete(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let m = cluster
        .store
        .get_obj("nodegrace.dev", "nodemaintenances", "", "shutdown-node-a")
        .unwrap();
    assert_eq!(m["spec"]["stage"], json!("Complete"));
    assert!(
        dir.path().join("state/gated/etcd.yaml").exists(),
        "{stdout}"
    );
    assert!(!dir.path().join("manifests/etcd.yaml").exists());
    assert!(
        stdout.contains("1 manifest(s) stay gated while NodeMaintenance upgrade is active"),
        "{stdout}"
    );
    rbac::assert_cluster_role_allows(&cluster.api.requests());
}

#[tokio::test]
async fn completes_the_shutdown_maintenance_and_restores_static_pods() {
    let cluster = FakeCluster::start().await.unwrap();
    cluster
        .install_crd(&node_maintenance_crd().unwrap())
        .unwrap();
    cluster.add_node(NODE).unwrap();
    cluster
        .insert(&json!({
            "apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": "shutdown-node-a"},
            "spec": {"nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
                "stage": "Drain", "reason": "poweroff"},
        }))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = cluster.api.kube_config().unwrap().cluster_url.to_string();
    let config = write_config(dir.path(), server.trim_end_matches('/'));

    let out = complete(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = cluster
        .store
        .get_obj("nodegrace.dev", "nodemaintenances", "", "shutdown-node-a")
        .unwrap();
    assert_eq!(m["spec"]["stage"], json!("Complete"));
    assert!(dir.path().join("manifests/etcd.yaml").exists(), "{stdout}");
    assert!(!dir.path().join("state/gated/etcd.yaml").exists());
    assert!(stdout.contains("1 manifest(s) restored"), "{stdout}");
    rbac::assert_cluster_role_allows(&cluster.api.requests());
}

#[tokio::test]
async fn an_unreachable_apiserver_changes_nothing() {
    let cluster = FakeCluster::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = cluster.api.kube_config().unwrap().cluster_url.to_string();
    let config = write_config(dir.path(), server.trim_end_matches('/'));
    cluster.api.set_reachable(false).await.unwrap();

    let out = complete(&config).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nothing was changed"), "{stderr}");
    assert!(
        dir.path().join("state/gated/etcd.yaml").exists(),
        "the manifest stays gated"
    );
    assert!(!dir.path().join("manifests/etcd.yaml").exists());
}

/// A journal intent line as a corrupted or hand-edited journal could hold it.
fn intent_line(file: &str, from: &str, to: &str, bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let sha = digest.as_ref().iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    });
    format!(
        "{{\"record\":\"intent\",\"id\":1,\"op\":\"gate\",\"file\":\"{file}\",\"from\":\"{from}\",\"to\":\"{to}\",\"size\":{},\"sha256\":\"{sha}\",\"mode\":384,\"uid\":0,\"gid\":0,\"copy\":false}}\n",
        bytes.len()
    )
}

#[tokio::test]
async fn journal_records_recovery_cannot_settle_are_set_aside_and_the_rest_restored() {
    let cluster = FakeCluster::start().await.unwrap();
    cluster
        .install_crd(&node_maintenance_crd().unwrap())
        .unwrap();
    cluster.add_node(NODE).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = cluster.api.kube_config().unwrap().cluster_url.to_string();
    let config = write_config(dir.path(), server.trim_end_matches('/'));
    // The recipe: an intent naming the manifest directory as source and destination
    // of the only copy; then a gated manifest removed by hand after an interrupted move.
    let apiserver = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\n  namespace: kube-system\nspec:\n  containers: []\n";
    std::fs::write(dir.path().join("manifests/kube-apiserver.yaml"), apiserver).unwrap();
    let journal = format!(
        "{}{}{}",
        intent_line("kube-apiserver.yaml", "manifests", "manifests", apiserver),
        intent_line("gone.yaml", "manifests", "gate", b"gone"),
        "{\"record\":\"intent\",\"id\":3,\"from\":\"elsewhere\"}\n",
    );
    std::fs::write(dir.path().join("state/static-pods.journal"), journal).unwrap();

    let out = complete(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert_eq!(
        std::fs::read(dir.path().join("manifests/kube-apiserver.yaml")).unwrap(),
        apiserver,
        "the only copy is never removed"
    );
    assert!(
        dir.path().join("manifests/etcd.yaml").exists(),
        "the other gated manifest is still restored: {stdout}"
    );
    assert!(stdout.contains("1 manifest(s) restored"), "{stdout}");
    assert!(
        stdout.contains("3 record(s) could not be settled and were set aside"),
        "{stdout}"
    );
    assert!(stdout.contains("gone.yaml"), "{stdout}");
    assert!(stdout.contains("kube-apiserver.yaml"), "{stdout}");
    assert!(stdout.contains("put its manifest back"), "{stdout}");
    // The daemon's log lines reach the operator too.
    assert!(
        stderr.contains("ERROR") && stderr.contains("journal record is set aside"),
        "{stderr}"
    );
    let aside =
        std::fs::read_to_string(dir.path().join("state/static-pods.journal.set-aside")).unwrap();
    assert_eq!(aside.lines().count(), 3, "{aside}");
    assert!(
        aside.contains("\"gone.yaml\"") && aside.contains("elsewhere"),
        "{aside}"
    );

    // The set-aside records no longer block anything.
    let again = complete(&config).await;
    assert_eq!(
        again.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&again.stdout),
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(
        std::fs::read(dir.path().join("manifests/kube-apiserver.yaml")).unwrap(),
        apiserver
    );
}
