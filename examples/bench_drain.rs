//! Shutdown drain of a node with 250 pods in 4 bands (regular, critical, DaemonSet, static)
//! on the in-process fake apiserver over loopback; every pod exits a chosen time after its
//! deletion. Prints signal → maintenance created, signal → cordoned, total delay minus the
//! ideal (the sum over bands of the slowest pod), the API requests made, peak RSS and CPU.
//!
//! `cargo run --example bench_drain` (numbers include the fake apiserver and fake kubelet,
//! which run in the same process).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use nodegrace::{
    node_maintenance_crd, Engine, EngineOptions, Metrics, Settings, ShutdownKind, ShutdownRequest,
    StaticManifest, StaticPodGate,
};
use nodegrace_testkit::fake_apiserver::{running_status, DeleteOpts, FakeCluster, Store};
use nodegrace_testkit::fake_kubelet::KubeletConfig;
use serde_json::json;

const NODE: &str = "bench-node";

struct Gate {
    store: Arc<Store>,
    active: Mutex<Vec<StaticManifest>>,
    gated: Mutex<Vec<StaticManifest>>,
}

impl StaticPodGate for Gate {
    fn recover(&self) -> Result<()> {
        Ok(())
    }
    fn active(&self) -> Result<Vec<StaticManifest>> {
        Ok(self
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone())
    }
    fn gated(&self) -> Result<Vec<StaticManifest>> {
        Ok(self.gated.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
    fn gate(&self, file_name: &str) -> Result<()> {
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        let i = active
            .iter()
            .position(|m| m.file_name == file_name)
            .ok_or_else(|| anyhow::anyhow!("{file_name} not active"))?;
        let m = active.remove(i);
        let pods = self
            .store
            .find_resource("", "v1", "pods")
            .ok_or_else(|| anyhow::anyhow!("pods not served"))?;
        let _ = self.store.delete(
            &pods,
            &m.namespace,
            &format!("{}-{NODE}", m.pod_name),
            &DeleteOpts::default(),
        );
        self.gated.lock().unwrap_or_else(|p| p.into_inner()).push(m);
        Ok(())
    }
    fn restore_all(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

fn proc_status(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User + system CPU of this process, from /proc/self/stat (clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the command name.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let cluster = FakeCluster::start().await?;
    cluster.install_crd(&node_maintenance_crd()?)?;
    cluster.insert(&json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "spec": {},
    }))?;
    cluster.ensure_namespace("work")?;

    // (band, count, priority, kind, slowest exit in ms)
    let bands = [
        ("regular", 200usize, 0i32, "default", 400u64),
        ("critical", 25, 2_000_001_000, "default", 250),
        ("daemonset", 20, 2_000_001_000, "daemonset", 200),
        ("static", 5, 2_000_001_000, "static", 150),
    ];
    let gate = Arc::new(Gate {
        store: cluster.store.clone(),
        active: Mutex::new(Vec::new()),
        gated: Mutex::new(Vec::new()),
    });
    let mut finish_after = HashMap::new();
    let mut ideal = Duration::ZERO;
    let now = cluster.store.now_str();
    for (band, count, priority, kind, slowest) in bands {
        for i in 0..count {
            // Spread exits evenly up to the band's slowest.
            let exit = Duration::from_millis(slowest * (i as u64 + 1) / count as u64);
            let mut meta = json!({"name": format!("{band}-{i}"), "namespace": "work"});
            match kind {
                "daemonset" => {
                    meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
                        "name": "ds", "uid": "ds-uid", "controller": true}]);
                }
                "static" => {
                    let base = format!("{band}-{i}");
                    meta["name"] = json!(format!("{base}-{NODE}"));
                    meta["annotations"] = json!({"kubernetes.io/config.mirror": format!("h{i}"),
                        "kubernetes.io/config.source": "file"});
                    gate.active
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(StaticManifest {
                            file_name: format!("{base}.yaml"),
                            namespace: "work".into(),
                            pod_name: base,
                            priority,
                            labels: Default::default(),
                        });
                }
                _ => {}
            }
            let name = meta["name"].as_str().unwrap_or_default().to_string();
            finish_after.insert(format!("work/{name}"), exit);
            cluster.insert(&json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": NODE, "priority": priority, "terminationGracePeriodSeconds": 30,
                    "containers": [{"name": "main", "image": "pause"}]},
                "status": running_status(&now),
            }))?;
        }
        ideal += Duration::from_millis(slowest);
    }
    let _kubelet = cluster.kubelet(KubeletConfig {
        finish_after,
        ..KubeletConfig::node(NODE)
    });

    let dir = tempfile::tempdir()?;
    let mut settings = Settings::default();
    settings.node.name = NODE.into();
    settings.state_dir = dir.path().to_path_buf();
    let engine = Engine::start(EngineOptions {
        endpoint: "fake apiserver".into(),
        client: cluster.client()?,
        settings,
        node: NODE.into(),
        gate,
        metrics: Metrics::new(),
        terminator: None,
    });
    // Steady state first: the watches have listed before the signal arrives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_requests = cluster.api.requests().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_extra = cluster.api.requests().len() - idle_requests;
    cluster.api.clear_requests();

    let cpu0 = cpu_time();
    let signal = Instant::now();
    let t = engine
        .shutdown_drain(&ShutdownRequest {
            kind: ShutdownKind::Reboot,
            started_at: chrono::Utc::now(),
            budget: Duration::from_secs(15 * 60),
            resumed: false,
            boot_id: "bench-boot".into(),
            started_since_boot: None,
        })
        .await?;
    let total = signal.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let reqs = cluster.api.requests();
    let count = |pred: &dyn Fn(&nodegrace_testkit::fake_apiserver::RecordedRequest) -> bool| {
        reqs.iter().filter(|r| pred(r)).count()
    };
    let evictions = count(&|r| r.path.ends_with("/eviction"));
    let deletes = count(&|r| r.method == "DELETE" && r.path.contains("/pods/"));
    let status = count(&|r| r.path.contains("nodemaintenances") && r.path.ends_with("/status"));
    let events = count(&|r| r.path.contains("/events"));
    let node = count(&|r| r.path.starts_with("/api/v1/nodes"));
    let watches = count(&|r| r.is_watch());

    let ms = |d: Option<Duration>| {
        d.map_or("-".to_string(), |d| {
            format!("{:.1} ms", d.as_secs_f64() * 1000.0)
        })
    };
    println!("pods: 250 in 4 bands (200 regular, 25 critical, 20 DaemonSet, 5 static)");
    println!("signal -> maintenance created: {}", ms(t.maintenance_ready));
    println!("signal -> cordoned:            {}", ms(t.cordoned));
    println!("signal -> node empty:          {}", ms(t.node_empty));
    println!(
        "total shutdown delay:          {:.1} ms",
        total.as_secs_f64() * 1000.0
    );
    println!(
        "ideal (sum of slowest/band):   {:.1} ms",
        ideal.as_secs_f64() * 1000.0
    );
    println!(
        "delay minus ideal:             {:.1} ms",
        (total.as_secs_f64() - ideal.as_secs_f64()) * 1000.0
    );
    println!(
        "API requests during the drain: {} (evictions {evictions}, pod deletes {deletes}, maintenance status {status}, node {node}, events {events}, watch restarts {watches})",
        reqs.len()
    );
    println!("API requests while idle (2 s): {idle_extra}");
    println!(
        "peak RSS (whole process):      {} KiB",
        proc_status("VmHWM:").unwrap_or(0)
    );
    println!(
        "CPU time during the drain:     {} ms (whole process)",
        cpu.as_millis()
    );
    Ok(())
}
