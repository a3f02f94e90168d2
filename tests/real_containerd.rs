//! The offline fallback against a real containerd (Debian's, with runc), started by the test
//! on a private socket. Runs only with NODEGRACE_REAL_TESTS=1, as root.

#[path = "real/harness.rs"]
mod harness;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use harness::{bands, cached, script, Containerd, OnTerm, PodSpec};
use nodegrace::{
    CriClient, CriTimeouts, Fallback, FallbackOptions, KubeletControl, PodCache, PodOutcome,
    Runtime, SandboxState,
};

/// One containerd at a time: timings mean something only on an otherwise idle runtime.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn options(band_spec: &[(i32, f64)], stop_kubelet: bool) -> FallbackOptions {
    FallbackOptions {
        node: "node1".into(),
        bands: bands(band_spec),
        stop_kubelet,
        kubelet_unit: "kubelet.service".into(),
        kubelet_timeout: Duration::from_secs(5),
        // The daemon's own (`FallbackOptions::from_settings`): with 1 s, a runtime slowed by a
        // busy machine ended a band on its timeout after its last kill.
        band_slack: Duration::from_secs(2),
        list_retry: Duration::from_millis(500),
        sandbox_wait: Duration::from_secs(5),
        restart_watch: Duration::from_secs(30),
    }
}

/// Records (as host uptime) when the fallback stopped and started the kubelet.
#[derive(Default)]
struct RecordingKubelet {
    stopped_at: Mutex<Option<f64>>,
    started_at: Mutex<Option<f64>>,
}

#[async_trait]
impl KubeletControl for RecordingKubelet {
    async fn stop(&self, _unit: &str) -> anyhow::Result<()> {
        *self.stopped_at.lock().unwrap() = Some(harness::host_uptime());
        Ok(())
    }
    async fn start(&self, _unit: &str) -> anyhow::Result<()> {
        *self.started_at.lock().unwrap() = Some(harness::host_uptime());
        Ok(())
    }
}

struct Pod {
    ns: &'static str,
    name: &'static str,
    /// (priority, terminationGracePeriodSeconds) in the pod cache; None: unknown pod.
    cached: Option<(i32, i64)>,
    containers: Vec<(&'static str, OnTerm)>,
}

fn mark(pod: &str, container: &str) -> String {
    format!("{pod}-{container}")
}

async fn start_pods(ctd: &Containerd, pods: &[Pod]) -> (PodCache, Vec<harness::RunningPod>) {
    let mut cache = PodCache {
        node: "node1".into(),
        ..Default::default()
    };
    let mut running = Vec::new();
    let mut marks = Vec::new();
    for p in pods {
        let uid = format!("uid-{}", p.name);
        if let Some((priority, grace)) = p.cached {
            cache.pods.push(cached(p.ns, p.name, &uid, priority, grace));
        }
        let spec = PodSpec {
            namespace: p.ns.into(),
            name: p.name.into(),
            uid,
            containers: p
                .containers
                .iter()
                .map(|(c, on_term)| (c.to_string(), script(&mark(p.name, c), *on_term)))
                .collect(),
        };
        running.push(ctd.run_pod(&spec).await);
        marks.extend(p.containers.iter().map(|(c, _)| mark(p.name, c)));
    }
    ctd.wait_started(&marks).await;
    (cache, running)
}

#[test]
fn bands_stop_in_priority_order_with_sigterm_then_sigkill_after_the_grace() {
    if !harness::enabled() {
        return;
    }
    let _serial = serial();
    rt().block_on(async {
        let ctd = Containerd::start();
        eprintln!(
            "containerd at {} ({} snapshotter)",
            ctd.endpoint, ctd.snapshotter
        );
        let pods = vec![
            Pod {
                ns: "default",
                name: "low-a",
                cached: Some((0, 30)),
                containers: vec![("app", OnTerm::ExitAfter(0.0))],
            },
            // Its own 1 s grace is shorter than the band's 2 s: SIGKILL after 1 s.
            Pod {
                ns: "default",
                name: "low-b",
                cached: Some((0, 1)),
                containers: vec![("app", OnTerm::Ignore)],
            },
            // Not in the cache: lowest band, band grace.
            Pod {
                ns: "default",
                name: "stranger",
                cached: None,
                containers: vec![("app", OnTerm::ExitAfter(0.2))],
            },
            // The band's 3 s grace is shorter than its own 30 s: SIGKILL after 3 s.
            Pod {
                ns: "default",
                name: "mid",
                cached: Some((1500, 30)),
                containers: vec![("app", OnTerm::Ignore), ("side", OnTerm::ExitAfter(0.0))],
            },
            Pod {
                ns: "kube-system",
                name: "high",
                cached: Some((2_000_000_000, 30)),
                containers: vec![("app", OnTerm::ExitAfter(0.5))],
            },
        ];
        let (cache, running) = start_pods(&ctd, &pods).await;
        let kubelet = Arc::new(RecordingKubelet::default());
        let fallback = Fallback::new(
            Arc::new(ctd.client()),
            Some(kubelet.clone()),
            None,
            options(&[(0, 2.0), (1000, 3.0), (2_000_000_000, 2.0)], true),
        );
        let started = Instant::now();
        let report = fallback.run(&cache).await;
        let total = started.elapsed();

        // Every container got SIGTERM.
        let term = |pod: &str, c: &str| {
            ctd.uptime_mark(&format!("{}.term", mark(pod, c)))
                .unwrap_or_else(|| panic!("{pod}/{c} never got SIGTERM; report: {report:#?}"))
        };
        let band0 = [
            term("low-a", "app"),
            term("low-b", "app"),
            term("stranger", "app"),
        ];
        let band1 = [term("mid", "app"), term("mid", "side")];
        let band2 = term("high", "app");
        let kubelet_stop = kubelet.stopped_at.lock().unwrap().expect("kubelet stopped");
        assert!(
            band0.iter().all(|&t| t >= kubelet_stop),
            "the kubelet is stopped first"
        );

        // Band order; each band waited for its slowest pod (low-b killed at 1 s, mid/app at 3 s).
        // From each band's first SIGTERM: a container's trap that writes late moves no band.
        let max = |ts: &[f64]| ts.iter().cloned().fold(f64::MIN, f64::max);
        let min = |ts: &[f64]| ts.iter().cloned().fold(f64::MAX, f64::min);
        assert!(
            min(&band1) - min(&band0) >= 0.9,
            "band 1000 started {:.2} s after band 0",
            min(&band1) - min(&band0)
        );
        assert!(
            band2 - min(&band1) >= 2.9,
            "band 2e9 started {:.2} s after band 1000",
            band2 - min(&band1)
        );
        // Concurrency within a band (one after the other, stranger would wait for low-b's 1 s).
        assert!(
            max(&band0) - min(&band0) < 0.9,
            "band 0 SIGTERMs spread over {:.2} s",
            max(&band0) - min(&band0)
        );

        // Those ignoring SIGTERM were killed only after their grace, the rest exited by
        // themselves. The upper bound tells low-b's own 1 s grace from its band's 2 s.
        for (pod_idx, pod, grace) in [(1, "low-b", 1.0), (3, "mid", 3.0)] {
            let (_, id) = &running[pod_idx].containers[0];
            let (code, finished_ns) = ctd.exit_of(id).await;
            assert_eq!(code, 137, "{pod} was SIGKILLed");
            let stop_started = report.pod("default", pod).unwrap().stop_started_at.unwrap();
            let lived = (finished_ns - stop_started.timestamp_nanos_opt().unwrap()) as f64 / 1e9;
            eprintln!("{pod} lived {lived:.3} s after StopContainer (grace {grace} s)");
            assert!(
                lived >= grace - 0.05 && lived < grace + 0.9,
                "{pod} lived {lived:.2} s after StopContainer, grace {grace} s"
            );
        }
        for (pod_idx, c) in [(0, 0), (2, 0), (3, 1), (4, 0)] {
            let (name, id) = &running[pod_idx].containers[c];
            assert_eq!(
                ctd.exit_of(id).await.0,
                0,
                "{}/{name} exited on its own",
                pods[pod_idx].name
            );
        }

        assert!(report.errors.is_empty(), "{report:#?}");
        assert!(
            report.pods.iter().all(|p| p.outcome == PodOutcome::Stopped),
            "{report:#?}"
        );
        let stranger = report.pod("default", "stranger").unwrap();
        assert_eq!((stranger.band, stranger.priority), (0, None));
        assert!(report.bands.iter().all(|b| !b.timed_out));
        let sandboxes = ctd.client().list_pod_sandboxes().await.unwrap();
        assert_eq!(sandboxes.len(), 5);
        assert!(
            sandboxes.iter().all(|s| s.state == SandboxState::NotReady),
            "{sandboxes:#?}"
        );

        for b in &report.bands {
            eprintln!(
                "band {:>10}: {:?} .. {:?}",
                b.priority,
                b.started_after,
                b.ended_after.unwrap()
            );
        }
        for p in &report.pods {
            eprintln!(
                "{:>8}: stop at {:?}, containers gone {:?}, sandbox gone {:?}",
                p.name,
                p.stop_started_after.unwrap(),
                p.containers_stopped_after.unwrap(),
                p.stopped_after.unwrap()
            );
        }
        // Ideal: 1 s (low-b) + 3 s (mid/app) + 0.5 s (high).
        let ideal = Duration::from_millis(4500);
        eprintln!(
            "total {total:?}, ideal {ideal:?}, overhead {:?}",
            total.saturating_sub(ideal)
        );
        assert!(
            total >= ideal && total < ideal + Duration::from_millis(2500),
            "total {total:?}"
        );

        assert!(fallback.restart_kubelet().await.unwrap());
        assert!(kubelet.started_at.lock().unwrap().is_some());
        ctd.remove_all_pods().await;
    });
}

#[test]
fn a_runtime_that_dies_mid_band_is_reported_and_the_run_does_not_hang() {
    if !harness::enabled() {
        return;
    }
    let _serial = serial();
    rt().block_on(async {
        let mut ctd = Containerd::start();
        let pods = vec![
            Pod {
                ns: "default",
                name: "stubborn",
                cached: Some((0, 30)),
                containers: vec![("app", OnTerm::Ignore)],
            },
            Pod {
                ns: "default",
                name: "later",
                cached: Some((1000, 30)),
                containers: vec![("app", OnTerm::ExitAfter(0.0))],
            },
        ];
        let (cache, running) = start_pods(&ctd, &pods).await;
        let endpoint = ctd.endpoint.clone();
        let fallback = Fallback::new(
            Arc::new(ctd.client()),
            None,
            None,
            options(&[(0, 6.0), (1000, 2.0)], false),
        );
        let started = Instant::now();
        let killer = async {
            // Kill containerd once the band is under way (stubborn got SIGTERM).
            while ctd.uptime_mark("stubborn-app.term").is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            ctd.kill();
        };
        let (report, ()) = tokio::join!(fallback.run(&cache), killer);
        let elapsed = started.elapsed();
        eprintln!("run ended {elapsed:?} after start; report: {report:#?}");
        assert!(
            elapsed < Duration::from_secs(4),
            "the run waited {elapsed:?} on a dead runtime"
        );

        let stubborn = report.pod("default", "stubborn").unwrap();
        assert_eq!(stubborn.outcome, PodOutcome::Failed);
        let (_, stubborn_id) = &running[0].containers[0];
        assert!(
            stubborn
                .errors
                .iter()
                .any(|e| e.contains(stubborn_id.as_str()) && e.contains(&endpoint)),
            "{stubborn:#?}"
        );
        // The next band was still attempted, and its failure reported.
        let later = report.pod("default", "later").unwrap();
        assert_eq!(later.outcome, PodOutcome::Failed);
        let (_, later_id) = &running[1].containers[0];
        assert!(
            later.errors.iter().any(|e| e.contains(later_id.as_str())),
            "{later:#?}"
        );
        assert!(
            ctd.uptime_mark("later-app.term").is_none(),
            "nothing reached the dead runtime"
        );
        assert_eq!(report.bands.len(), 2);
        // Drop restarts containerd and removes the pods.
    });
}

#[test]
fn an_absent_socket_is_one_clear_error_and_no_hang() {
    let _serial = serial();
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}/containerd.sock", dir.path().display());
        let client = CriClient::new(&endpoint, CriTimeouts::default()).unwrap();
        let fallback = Fallback::new(Arc::new(client), None, None, options(&[(0, 30.0)], false));
        let started = Instant::now();
        let report = fallback.run(&PodCache::default()).await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(report.errors.len(), 1, "{report:#?}");
        assert!(report.errors[0].contains(&endpoint), "{}", report.errors[0]);
        assert!(report.pods.is_empty());
    });
}
