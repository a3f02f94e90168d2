//! Prints how fast the fake apiserver answers through a real kube client: start-up, creates,
//! selected lists, evictions finished by the fake kubelet, and watch delivery latency.
//! Run: `cargo run --example bench_fake_apiserver [pods]`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use nodegrace_testkit::fake_apiserver::FakeCluster;
use nodegrace_testkit::fake_kubelet::KubeletConfig;
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(250);
    let t = Instant::now();
    let cluster = FakeCluster::start().await?;
    let client = cluster.client()?;
    println!(
        "start:            {:>8.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    let _kubelet = cluster.kubelet(KubeletConfig::node("n1"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let t = Instant::now();
    for i in 0..n {
        let p: Pod = serde_json::from_value(
            json!({"metadata": {"name": format!("p-{i}"), "labels": {"band": (i % 4).to_string()}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "pause"}]}}),
        )?;
        pods.create(&PostParams::default(), &p).await?;
    }
    let e = t.elapsed();
    println!(
        "create x{n}:      {:>8.2} ms ({:.0} req/s)",
        e.as_secs_f64() * 1e3,
        n as f64 / e.as_secs_f64()
    );

    let t = Instant::now();
    let listed = pods
        .list(
            &ListParams::default()
                .fields("spec.nodeName=n1")
                .labels("band=1"),
        )
        .await?;
    println!(
        "selected list:    {:>8.2} ms ({} of {n} pods)",
        t.elapsed().as_secs_f64() * 1e3,
        listed.items.len()
    );

    let mut stream = watcher(
        pods.clone(),
        watcher::Config::default().fields("spec.nodeName=n1"),
    )
    .boxed();
    while let Some(ev) = stream.next().await {
        if matches!(ev?, watcher::Event::InitDone) {
            break;
        }
    }
    let rounds = 100;
    let t = Instant::now();
    for i in 0..rounds {
        let patch = json!({"metadata": {"annotations": {"round": i.to_string()}}});
        pods.patch("p-0", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        loop {
            if let watcher::Event::Apply(p) = stream.next().await.expect("watch open")? {
                if p.metadata.annotations.and_then(|a| a.get("round").cloned())
                    == Some(i.to_string())
                {
                    break;
                }
            }
        }
    }
    println!(
        "patch->watch:     {:>8.3} ms per round trip",
        t.elapsed().as_secs_f64() * 1e3 / rounds as f64
    );

    let t = Instant::now();
    for i in 0..n {
        pods.evict(&format!("p-{i}"), &EvictParams::default())
            .await?;
    }
    let evicted = t.elapsed();
    while !pods.list(&ListParams::default()).await?.items.is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    println!(
        "evict x{n}:       {:>8.2} ms, all gone after {:.2} ms",
        evicted.as_secs_f64() * 1e3,
        t.elapsed().as_secs_f64() * 1e3
    );
    println!("requests served:  {}", cluster.api.requests().len());
    Ok(())
}
