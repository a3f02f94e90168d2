//! The offline fallback against the kit's in-memory runtime on tokio's paused clock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use nodegrace::{
    Fallback, FallbackOptions, KubeletControl, Method, PodCache, PodInfo, PodOutcome, PodType,
    PriorityGracePeriod, StaticManifest, StaticPodGate,
};
use nodegrace_testkit::fake_cri::{Behaviour, CriEvent, FakeRuntime};
use nodegrace_testkit::LogBuffer;

const S: fn(u64) -> Duration = Duration::from_secs;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    KubeletStop,
    KubeletStart,
    Gate(String),
    StopRequested { container: String, grace: Duration },
    ContainerStopped(String),
    SandboxStopped(String),
}

impl From<CriEvent> for Ev {
    fn from(e: CriEvent) -> Self {
        match e {
            CriEvent::StopRequested {
                container, grace, ..
            } => Ev::StopRequested { container, grace },
            CriEvent::ContainerStopped { container, .. } => Ev::ContainerStopped(container),
            CriEvent::SandboxStopped { sandbox, .. } => Ev::SandboxStopped(sandbox),
        }
    }
}

type Log = Arc<Mutex<Vec<(Duration, Ev)>>>;

struct Clock {
    t0: Instant,
    log: Log,
}

impl Clock {
    fn push(&self, ev: Ev) {
        self.log
            .lock()
            .unwrap()
            .push((Instant::now() - self.t0, ev));
    }
}

/// What the kubelet unit does when it is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KubeletStop {
    Stops,
    /// The stop job never finishes (a unit that ignores SIGTERM, a long TimeoutStopSec).
    Hangs,
    /// systemd answers the stop with an error (RefuseManualStop=, a failed job).
    Fails,
    /// The stop job finishes this late (a kubelet that ignores SIGTERM until the unit's
    /// `TimeoutStopSec=` has it killed).
    FinishesAfter(Duration),
}

struct FakeKubelet(Arc<Clock>, KubeletStop);

#[async_trait]
impl KubeletControl for FakeKubelet {
    async fn stop(&self, unit: &str) -> anyhow::Result<()> {
        assert_eq!(unit, "kubelet.service");
        tokio::time::sleep(Duration::from_millis(100)).await;
        match self.1 {
            KubeletStop::Stops => {}
            KubeletStop::Hangs => std::future::pending::<()>().await,
            KubeletStop::FinishesAfter(late) => tokio::time::sleep(late).await,
            KubeletStop::Fails => anyhow::bail!(
                "Operation refused, unit kubelet.service may be requested by dependency only"
            ),
        }
        self.0.push(Ev::KubeletStop);
        Ok(())
    }
    async fn start(&self, unit: &str) -> anyhow::Result<()> {
        assert_eq!(unit, "kubelet.service");
        self.0.push(Ev::KubeletStart);
        Ok(())
    }
}

struct FakeGate {
    clock: Arc<Clock>,
    active: Vec<StaticManifest>,
    /// Files the kubelet refuses as manifests.
    unreadable: Vec<String>,
}

impl StaticPodGate for FakeGate {
    fn recover(&self) -> anyhow::Result<()> {
        Ok(())
    }
    fn active(&self) -> anyhow::Result<Vec<StaticManifest>> {
        Ok(self.active.clone())
    }
    fn gated(&self) -> anyhow::Result<Vec<StaticManifest>> {
        Ok(Vec::new())
    }
    fn gate(&self, file_name: &str) -> anyhow::Result<()> {
        if file_name == "broken.yaml" {
            anyhow::bail!("read-only file system");
        }
        self.clock.push(Ev::Gate(file_name.into()));
        Ok(())
    }
    fn restore_all(&self) -> anyhow::Result<Vec<String>> {
        Ok(Vec::new())
    }
    fn unreadable_active(&self) -> anyhow::Result<Vec<nodegrace::Problem>> {
        Ok(self
            .unreadable
            .iter()
            .map(|f| nodegrace::Problem {
                file_name: f.clone(),
                reason: "not YAML".into(),
            })
            .collect())
    }
}

/// A node: pods with their sandbox, containers and cache entry.
struct Node {
    clock: Arc<Clock>,
    runtime: FakeRuntime,
    cache: PodCache,
    manifests: Vec<StaticManifest>,
    unreadable: Vec<String>,
    sandbox_delay: Duration,
    kubelet_stop: KubeletStop,
}

impl Node {
    fn new() -> Self {
        Node {
            clock: Arc::new(Clock {
                t0: Instant::now(),
                log: Arc::default(),
            }),
            runtime: FakeRuntime::new(),
            cache: PodCache::default(),
            manifests: Vec::new(),
            unreadable: Vec::new(),
            sandbox_delay: Duration::ZERO,
            kubelet_stop: KubeletStop::Stops,
        }
    }

    /// A running pod `name` in namespace `ns`; `cached` = Some((priority, grace)) puts it in
    /// the pod cache. Its sandbox is `sb-<name>`, its containers `<name>-c<i>`.
    fn pod(
        &mut self,
        ns: &str,
        name: &str,
        cached: Option<(i32, i64)>,
        containers: &[Behaviour],
    ) -> &mut Self {
        let uid = format!("uid-{name}");
        let sandbox = self.runtime.add_sandbox(ns, name, &uid);
        for (i, b) in containers.iter().enumerate() {
            self.runtime.add_container(&sandbox, &format!("c{i}"), *b);
        }
        if let Some((priority, grace)) = cached {
            self.cache.pods.push(PodInfo {
                namespace: ns.into(),
                name: name.into(),
                uid,
                priority,
                pod_type: PodType::Default,
                termination_grace_period_seconds: grace,
                labels: BTreeMap::new(),
                terminating: false,
                terminal: false,
                static_hash: None,
            });
        }
        self
    }

    fn fallback(&self, bands: &[(i32, u64)], kubelet: bool, unreachable: bool) -> Fallback {
        self.runtime.set_unreachable(unreachable);
        self.runtime.set_sandbox_delay(self.sandbox_delay);
        let clock = self.clock.clone();
        self.runtime.observe(move |e| clock.push(e.into()));
        let opts = FallbackOptions {
            node: "node1".into(),
            bands: bands
                .iter()
                .map(|&(priority, secs)| PriorityGracePeriod {
                    priority,
                    shutdown_grace_period: S(secs),
                })
                .collect(),
            stop_kubelet: kubelet,
            kubelet_unit: "kubelet.service".into(),
            kubelet_timeout: S(5),
            band_slack: S(1),
            list_retry: S(1),
            sandbox_wait: S(5),
            restart_watch: S(30),
        };
        let gate = FakeGate {
            clock: self.clock.clone(),
            active: self.manifests.clone(),
            unreadable: self.unreadable.clone(),
        };
        Fallback::new(
            Arc::new(self.runtime.clone()),
            kubelet.then(|| {
                Arc::new(FakeKubelet(self.clock.clone(), self.kubelet_stop))
                    as Arc<dyn KubeletControl>
            }),
            Some(Arc::new(gate)),
            opts,
        )
    }

    fn events(&self) -> Vec<(Duration, Ev)> {
        self.clock.log.lock().unwrap().clone()
    }

    fn when(&self, ev: &Ev) -> Duration {
        self.events()
            .into_iter()
            .find(|(_, e)| e == ev)
            .unwrap_or_else(|| panic!("{ev:?} never happened: {:#?}", self.events()))
            .0
    }

    fn stop_requested(&self, container: &str) -> (Duration, Duration) {
        self.events()
            .into_iter()
            .find_map(|(t, e)| match e {
                Ev::StopRequested {
                    container: c,
                    grace,
                } if c == container => Some((t, grace)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{container} was never stopped: {:#?}", self.events()))
    }
}

const BANDS: &[(i32, u64)] = &[(0, 10), (1000, 5), (2_000_000_000, 3)];

#[tokio::test(start_paused = true)]
async fn bands_run_in_ascending_priority_each_waiting_for_its_slowest_pod() {
    let mut n = Node::new();
    n.pod(
        "ns",
        "critical",
        Some((2_000_000_000, 30)),
        &[Behaviour::ExitsAfter(S(1))],
    )
    .pod("ns", "web", Some((0, 30)), &[Behaviour::ExitsAfter(S(2))])
    .pod(
        "ns",
        "batch",
        Some((5, 30)),
        &[Behaviour::ExitsAfter(S(4)), Behaviour::ExitsAfter(S(1))],
    )
    .pod("ns", "mid", Some((1500, 30)), &[Behaviour::IgnoresTerm]);
    let report = n.fallback(BANDS, false, false).run(&n.cache).await;

    // Band 0: web and batch, all three containers at once; it ends with batch-c0 at 4 s.
    for c in ["web-c0", "batch-c0", "batch-c1"] {
        assert_eq!(n.stop_requested(c).0, S(0), "{c}");
    }
    assert_eq!(n.when(&Ev::ContainerStopped("batch-c0".into())), S(4));
    // Sandboxes go only after their containers.
    assert_eq!(n.when(&Ev::SandboxStopped("sb-web".into())), S(2));
    assert_eq!(n.when(&Ev::SandboxStopped("sb-batch".into())), S(4));
    // Band 1000: mid ignores SIGTERM and is killed at the end of its 5 s grace.
    assert_eq!(n.stop_requested("mid-c0"), (S(4), S(5)));
    assert_eq!(n.when(&Ev::ContainerStopped("mid-c0".into())), S(9));
    // Band 2e9 after that.
    assert_eq!(n.stop_requested("critical-c0"), (S(9), S(3)));

    let bands: Vec<(i32, Duration, bool)> = report
        .bands
        .iter()
        .map(|b| (b.priority, b.started_after, b.timed_out))
        .collect();
    assert_eq!(
        bands,
        vec![
            (0, S(0), false),
            (1000, S(4), false),
            (2_000_000_000, S(9), false)
        ]
    );
    assert!(
        report.pods.iter().all(|p| p.outcome == PodOutcome::Stopped),
        "{report:#?}"
    );
    assert!(report.errors.is_empty());
    let mid = report.pod("ns", "mid").unwrap();
    assert_eq!(
        (mid.band, mid.priority, mid.method),
        (1000, Some(1500), Method::Cri)
    );
    assert_eq!(mid.stopped_after, Some(S(9)));
}

#[tokio::test(start_paused = true)]
async fn a_pod_gets_the_shorter_of_band_and_own_grace() {
    let mut n = Node::new();
    n.pod("ns", "quick", Some((0, 3)), &[Behaviour::IgnoresTerm])
        .pod("ns", "slow", Some((0, 600)), &[Behaviour::IgnoresTerm]);
    let report = n.fallback(BANDS, false, false).run(&n.cache).await;
    assert_eq!(n.stop_requested("quick-c0").1, S(3));
    assert_eq!(n.stop_requested("slow-c0").1, S(10));
    assert_eq!(report.pod("ns", "quick").unwrap().stopped_after, Some(S(3)));
    assert_eq!(report.pod("ns", "slow").unwrap().stopped_after, Some(S(10)));
    assert!(!report.bands[0].timed_out);
}

#[tokio::test(start_paused = true)]
async fn pods_the_cache_does_not_know_go_to_the_lowest_band_with_its_grace() {
    let mut n = Node::new();
    n.pod(
        "ns",
        "known-low",
        Some((0, 30)),
        &[Behaviour::ExitsAfter(S(1))],
    )
    .pod("ns", "stranger", None, &[Behaviour::IgnoresTerm])
    .pod(
        "ns",
        "known-high",
        Some((1000, 30)),
        &[Behaviour::ExitsAfter(S(1))],
    );
    let report = n.fallback(BANDS, false, false).run(&n.cache).await;
    let stranger = report.pod("ns", "stranger").unwrap();
    assert_eq!((stranger.band, stranger.priority), (0, None));
    assert_eq!(n.stop_requested("stranger-c0"), (S(0), S(10)));
    assert_eq!(n.stop_requested("known-high-c0").0, S(10));
}

/// A pod the cache does not know is static when its sandbox says the kubelet took it from a
/// file or a URL (`kubernetes.io/config.source`), as the API's pods are classified; one
/// from the apiserver is not.
#[tokio::test(start_paused = true)]
async fn a_sandbox_from_a_file_or_a_url_is_a_static_pods() {
    let mut n = Node::new();
    for (name, source) in [
        ("from-file", "file"),
        ("from-url", "http"),
        ("from-api", "api"),
    ] {
        n.pod("ns", name, None, &[Behaviour::ExitsAfter(S(1))]);
        n.runtime
            .annotate_sandbox(&format!("sb-{name}"), "kubernetes.io/config.source", source);
    }
    let report = n.fallback(BANDS, false, false).run(&n.cache).await;
    let kind = |name: &str| report.pod("ns", name).unwrap().pod_type;
    assert_eq!(kind("from-file"), Some(PodType::Static));
    assert_eq!(kind("from-url"), Some(PodType::Static));
    assert_eq!(kind("from-api"), None);
}

#[tokio::test(start_paused = true)]
async fn an_erroring_container_is_reported_and_the_rest_goes_on() {
    let mut n = Node::new();
    n.pod(
        "ns",
        "flaky",
        Some((0, 30)),
        &[Behaviour::Errors, Behaviour::ExitsAfter(S(2))],
    )
    .pod("ns", "fine", Some((0, 30)), &[Behaviour::ExitsAfter(S(1))])
    .pod(
        "ns",
        "later",
        Some((1000, 30)),
        &[Behaviour::ExitsAfter(S(1))],
    );
    let report = n.fallback(BANDS, false, false).run(&n.cache).await;
    let flaky = report.pod("ns", "flaky").unwrap();
    assert_eq!(flaky.outcome, PodOutcome::Failed);
    assert_eq!(flaky.errors.len(), 1, "{flaky:#?}");
    assert!(flaky.errors[0].contains("flaky-c0"), "{}", flaky.errors[0]);
    assert!(
        flaky.errors[0].contains("unix:///fake.sock"),
        "{}",
        flaky.errors[0]
    );
    // Its other container and its sandbox are still stopped, and so is everything else.
    assert_eq!(n.when(&Ev::ContainerStopped("flaky-c1".into())), S(2));
    n.when(&Ev::SandboxStopped("sb-flaky".into()));
    assert_eq!(
        report.pod("ns", "fine").unwrap().outcome,
        PodOutcome::Stopped
    );
    assert_eq!(
        report.pod("ns", "later").unwrap().outcome,
        PodOutcome::Stopped
    );
    assert_eq!(n.stop_requested("later-c0").0, S(2));
}

#[tokio::test(start_paused = true)]
async fn a_stuck_runtime_ends_the_band_at_its_time_and_the_next_band_runs() {
    let mut n = Node::new();
    n.pod("ns", "stuck", Some((0, 30)), &[Behaviour::Hangs])
        .pod(
            "ns",
            "next",
            Some((1000, 30)),
            &[Behaviour::ExitsAfter(S(1))],
        );
    let report = n.fallback(BANDS, false, false).run(&n.cache).await;
    // Band 0: 10 s grace + 1 s slack.
    assert_eq!(n.stop_requested("next-c0").0, S(11));
    assert!(report.bands[0].timed_out);
    assert!(!report.bands[1].timed_out);
    let stuck = report.pod("ns", "stuck").unwrap();
    assert_eq!(stuck.outcome, PodOutcome::TimedOut);
    assert!(!stuck.errors.is_empty());
    assert_eq!(
        report.pod("ns", "next").unwrap().outcome,
        PodOutcome::Stopped
    );
}

#[tokio::test(start_paused = true)]
async fn the_kubelet_is_stopped_first_and_started_again_on_cancel() {
    let mut n = Node::new();
    n.pod("ns", "web", Some((0, 30)), &[Behaviour::IgnoresTerm])
        .pod("ns", "db", Some((1000, 30)), &[Behaviour::ExitsAfter(S(1))]);
    let fallback = n.fallback(BANDS, true, false);
    // The daemon drops the drain future (budget end or cancel) in the middle of band 0.
    let dropped = tokio::time::timeout(S(4), fallback.run(&n.cache)).await;
    assert!(dropped.is_err());
    let ev = n.events();
    assert_eq!(ev[0].1, Ev::KubeletStop, "{ev:#?}");
    assert!(n.stop_requested("web-c0").0 >= Duration::from_millis(100));

    let partial = fallback.report();
    assert!(partial.kubelet_stopped);
    assert_eq!(
        partial.pod("ns", "web").unwrap().outcome,
        PodOutcome::Stopping
    );
    assert_eq!(
        partial.pod("ns", "db").unwrap().outcome,
        PodOutcome::Pending
    );

    assert!(fallback.restart_kubelet().await.unwrap());
    assert_eq!(n.events().last().unwrap().1, Ev::KubeletStart);
    assert!(!fallback.report().kubelet_stopped);
    // A second cancel does not start it twice.
    assert!(!fallback.restart_kubelet().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn static_pods_are_gated_in_their_band_and_manifests_without_a_pod_too() {
    let mut n = Node::new();
    n.pod("ns", "web", Some((0, 30)), &[Behaviour::ExitsAfter(S(1))])
        .pod(
            "kube-system",
            "etcd-node1",
            None,
            &[Behaviour::ExitsAfter(S(2))],
        );
    let manifest = |file: &str, name: &str, priority| StaticManifest {
        file_name: file.into(),
        namespace: "kube-system".into(),
        pod_name: name.into(),
        priority,
        labels: BTreeMap::new(),
    };
    n.manifests = vec![
        manifest("etcd.yaml", "etcd", 2_000_001_000),
        manifest("scheduler.yaml", "kube-scheduler", 2_000_000_000),
        manifest("broken.yaml", "kube-proxy", 0),
    ];
    let report = n.fallback(BANDS, false, false).run(&n.cache).await;

    let etcd = report.pod("kube-system", "etcd-node1").unwrap();
    assert_eq!(etcd.pod_type, Some(PodType::Static));
    assert_eq!(
        (etcd.band, etcd.priority),
        (2_000_000_000, Some(2_000_001_000))
    );
    assert_eq!(etcd.gated_manifest.as_deref(), Some("etcd.yaml"));
    assert_eq!(etcd.outcome, PodOutcome::Stopped);
    // Gated when its band starts, after the lower band finished.
    assert_eq!(n.when(&Ev::Gate("etcd.yaml".into())), S(1));
    assert_eq!(n.stop_requested("etcd-node1-c0").0, S(1));

    let sched = report.pod("kube-system", "kube-scheduler-node1").unwrap();
    assert_eq!(sched.outcome, PodOutcome::Gated);
    assert_eq!(sched.gated_manifest.as_deref(), Some("scheduler.yaml"));
    n.when(&Ev::Gate("scheduler.yaml".into()));

    let proxy = report.pod("kube-system", "kube-proxy-node1").unwrap();
    assert_eq!(proxy.outcome, PodOutcome::Failed);
    assert!(proxy.errors[0].contains("read-only"), "{proxy:#?}");
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_runtime_is_reported_and_static_manifests_are_still_gated() {
    let mut n = Node::new();
    n.pod("ns", "web", Some((0, 30)), &[Behaviour::ExitsAfter(S(1))]);
    n.manifests = vec![StaticManifest {
        file_name: "etcd.yaml".into(),
        namespace: "kube-system".into(),
        pod_name: "etcd".into(),
        priority: 2_000_001_000,
        labels: BTreeMap::new(),
    }];
    let started = Instant::now();
    let report = n.fallback(BANDS, false, true).run(&n.cache).await;
    assert!(Instant::now() - started < S(3), "retried too long");
    assert_eq!(report.errors.len(), 1, "{report:#?}");
    assert!(
        report.errors[0].contains("unix:///fake.sock"),
        "{}",
        report.errors[0]
    );
    assert_eq!(report.pods.len(), 2, "{report:#?}");
    assert_eq!(report.pods[0].outcome, PodOutcome::Gated);
    // The cached pod the runtime could not be asked about is in the report, with why.
    let web = report.pod("ns", "web").unwrap();
    assert_eq!(web.outcome, PodOutcome::NotReached);
    assert!(
        web.errors[0].contains("could not be listed") && web.errors[0].contains("fake.sock"),
        "{web:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn sandbox_teardown_overlaps_the_next_band_and_is_waited_for_at_the_end() {
    let mut n = Node::new();
    n.sandbox_delay = S(2);
    n.pod("ns", "web", Some((0, 30)), &[Behaviour::ExitsAfter(S(1))])
        .pod("ns", "db", Some((1000, 30)), &[Behaviour::ExitsAfter(S(1))]);
    let started = Instant::now();
    let report = n.fallback(BANDS, false, false).run(&n.cache).await;
    assert_eq!(
        n.stop_requested("db-c0").0,
        S(1),
        "db's band waits for web's containers only"
    );
    assert_eq!(n.when(&Ev::SandboxStopped("sb-web".into())), S(3));
    assert_eq!(n.when(&Ev::SandboxStopped("sb-db".into())), S(4));
    assert_eq!(
        Instant::now() - started,
        S(4),
        "the run waits for the last sandbox"
    );
    let web = report.pod("ns", "web").unwrap();
    assert_eq!(
        (web.containers_stopped_after, web.stopped_after),
        (Some(S(1)), Some(S(3)))
    );
    assert!(report.pods.iter().all(|p| p.outcome == PodOutcome::Stopped));
}

/// A kubelet whose unit does not stop (the stop job hangs, or systemd refuses it): the
/// report says so, the pods are stopped through the CRI all the same, and the containers
/// the still-running kubelet starts again (in a new sandbox, as it does once the old one
/// is stopped) are stopped again after the last band.
#[tokio::test(start_paused = true)]
async fn a_kubelet_that_does_not_stop_is_reported_and_its_restarts_are_stopped_again() {
    for stop in [KubeletStop::Hangs, KubeletStop::Fails] {
        let mut n = Node::new();
        n.kubelet_stop = stop;
        n.pod("ns", "web", Some((0, 30)), &[Behaviour::ExitsAfter(S(1))])
            .pod("ns", "db", Some((1000, 30)), &[Behaviour::ExitsAfter(S(1))]);
        let fallback = n.fallback(BANDS, true, false);
        // The kubelet, still running, starts web again 0.5 s after its container stopped,
        // while the next band runs.
        let runtime = n.runtime.clone();
        let restarter = tokio::spawn(async move {
            while runtime.running().contains(&"ns/web".to_string()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let sandbox = runtime.add_sandbox("ns", "web", "uid-web");
            runtime.add_container(&sandbox, "c0", Behaviour::ExitsAfter(S(1)))
        });
        let started = Instant::now();
        let report = fallback.run(&n.cache).await;
        let restarted = restarter.await.unwrap();
        let took = Instant::now() - started;

        let why = report
            .kubelet_not_stopped
            .as_deref()
            .unwrap_or_else(|| panic!("{stop:?}: not reported: {report:#?}"));
        match stop {
            KubeletStop::Hangs => assert!(why.contains("did not stop within 5s"), "{why}"),
            _ => assert!(why.contains("Operation refused"), "{why}"),
        }
        assert!(report.errors.iter().any(|e| e == why), "{report:#?}");
        // Through the CRI all the same: band by band, after the kubelet's stop gave up.
        let gave_up = if stop == KubeletStop::Hangs {
            S(5)
        } else {
            Duration::from_millis(100)
        };
        assert_eq!(n.stop_requested("web-c0").0, gave_up, "{stop:?}");
        assert!(n.stop_requested("db-c0").0 > n.stop_requested("web-c0").0);
        assert_eq!(report.pod("ns", "db").unwrap().outcome, PodOutcome::Stopped);
        // The container the kubelet started again is stopped too, with web's grace.
        let (at, grace) = n.stop_requested(&restarted);
        assert!(
            at > n.stop_requested("db-c0").0,
            "{stop:?}: {:#?}",
            n.events()
        );
        assert_eq!(grace, S(10));
        let web = report.pod("ns", "web").unwrap();
        assert!(
            web.errors
                .iter()
                .any(|e| e.contains("started again by the kubelet") && e.contains("stopped again")),
            "{web:#?}"
        );
        assert!(web.containers.contains(&restarted), "{web:#?}");
        assert!(n.runtime.running().is_empty(), "{:?}", n.runtime.running());
        // A stop job that never ends is waited for `restart_watch` (30 s) after the last
        // band, and reported; a failed one not at all.
        if stop == KubeletStop::Hangs {
            assert!(
                took >= S(30) && took < gave_up + S(10) + S(30),
                "{stop:?}: the fallback took {took:?}"
            );
            assert!(
                report
                    .errors
                    .iter()
                    .any(|e| e.contains("still not stopped 30s after the last band")),
                "{report:#?}"
            );
        } else {
            assert!(
                took < gave_up + S(10),
                "{stop:?}: the fallback took {took:?}"
            );
        }
    }
}

/// As the real kubelet does: a container it saw exit is started again a few seconds later
/// (in a new sandbox), and once more after a 10 s back-off, after the last band too. While
/// the kubelet's stop job is under way each of them is stopped again, and the fallback ends
/// right after that job does, with nothing running.
#[tokio::test(start_paused = true)]
async fn what_a_kubelet_still_stopping_starts_after_the_last_band_is_stopped_until_its_stop_ends() {
    let mut n = Node::new();
    n.kubelet_stop = KubeletStop::FinishesAfter(S(25));
    n.pod("ns", "web", Some((0, 30)), &[Behaviour::ExitsAfter(S(1))])
        .pod("ns", "db", Some((1000, 30)), &[Behaviour::ExitsAfter(S(1))]);
    let fallback = n.fallback(BANDS, true, false);
    let runtime = n.runtime.clone();
    let restarter = tokio::spawn(async move {
        let mut started = Vec::new();
        for (i, delay) in [S(3), S(10)].into_iter().enumerate() {
            while runtime.running().contains(&"ns/web".to_string()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(delay).await;
            let sandbox = runtime.add_sandbox("ns", "web", "uid-web");
            let name = format!("again{i}");
            started.push(runtime.add_container(&sandbox, &name, Behaviour::ExitsAfter(S(1))));
        }
        started
    });
    let started = Instant::now();
    let report = fallback.run(&n.cache).await;
    let took = Instant::now() - started;
    let restarted = restarter.await.unwrap();

    let last_band = n.stop_requested("db-c0").0;
    let (first, _) = n.stop_requested(&restarted[0]);
    let (second, grace) = n.stop_requested(&restarted[1]);
    assert!(first > last_band && second > first, "{:#?}", n.events());
    assert_eq!(grace, S(10));
    assert!(n.runtime.running().is_empty(), "{:?}", n.runtime.running());
    // The kubelet's stop job ended at 25.1 s: one more look, then done.
    assert!(took >= S(25) && took < S(27), "took {took:?}");
    assert!(
        !report
            .errors
            .iter()
            .any(|e| e.contains("still not stopped")),
        "{report:#?}"
    );
    let web = report.pod("ns", "web").unwrap();
    assert!(
        restarted.iter().all(|c| web.containers.contains(c)),
        "{web:#?}"
    );
}

/// A CRI socket that accepts connections and never answers (a wedged containerd): the
/// fallback gives up at the client's call timeout, says so in one log line and in its
/// report, still gates the static manifests, and is done within that bound.
#[tokio::test(start_paused = true)]
async fn a_cri_socket_that_never_answers_is_bounded_by_the_call_timeout_and_reported() {
    use nodegrace::{CriClient, CriTimeouts};

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("containerd.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    // Accepts, reads whatever comes, answers nothing.
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let endpoint = format!("unix://{}", socket.display());
    let client = CriClient::new(&endpoint, CriTimeouts::default()).unwrap();

    // The global subscriber: a thread-local one can miss events whose callsite another
    // test's thread registered first. Other tests log here too; none names this socket.
    let lines = LogBuffer::default();
    let sink = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || sink.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let mut n = Node::new();
    n.pod("ns", "web", Some((0, 30)), &[Behaviour::ExitsAfter(S(1))]);
    n.manifests = vec![StaticManifest {
        file_name: "etcd.yaml".into(),
        namespace: "kube-system".into(),
        pod_name: "etcd".into(),
        priority: 2_000_001_000,
        labels: BTreeMap::new(),
    }];
    let gate = FakeGate {
        clock: n.clock.clone(),
        active: n.manifests.clone(),
        unreadable: Vec::new(),
    };
    let fallback = Fallback::new(
        Arc::new(client),
        Some(Arc::new(FakeKubelet(n.clock.clone(), KubeletStop::Stops))),
        Some(Arc::new(gate)),
        FallbackOptions {
            node: "node1".into(),
            bands: vec![PriorityGracePeriod {
                priority: 0,
                shutdown_grace_period: S(30),
            }],
            stop_kubelet: true,
            kubelet_unit: "kubelet.service".into(),
            kubelet_timeout: S(20),
            band_slack: S(2),
            list_retry: S(2),
            sandbox_wait: S(5),
            restart_watch: S(30),
        },
    );
    let started = Instant::now();
    let report = fallback.run(&n.cache).await;
    let took = Instant::now() - started;

    let call = CriTimeouts::default().call;
    assert!(took >= call && took < call + S(1), "took {took:?}");
    let why = report
        .runtime_unusable
        .as_deref()
        .unwrap_or_else(|| panic!("not reported: {report:#?}"));
    assert!(
        why.contains("accepts connections but does not answer") && why.contains(&endpoint),
        "{why}"
    );
    assert_eq!(report.errors, [why.to_string()], "{report:#?}");
    let web = report.pod("ns", "web").unwrap();
    assert_eq!(web.outcome, PodOutcome::NotReached);
    assert!(web.errors[0].contains("does not answer"), "{web:#?}");
    n.when(&Ev::Gate("etcd.yaml".into()));
    let log = lines.text();
    let about: Vec<&str> = log.lines().filter(|l| l.contains(&endpoint)).collect();
    assert_eq!(about.len(), 1, "{log}");
    assert!(about[0].contains("does not answer"), "{log}");
}

/// A file the kubelet refuses as a static pod manifest names no pod and no priority: it is
/// gated after the last band, and the report lists it.
#[tokio::test(start_paused = true)]
async fn a_file_the_kubelet_refuses_is_gated_after_the_last_band() {
    let mut n = Node::new();
    n.pod("ns", "web", Some((0, 30)), &[Behaviour::ExitsAfter(S(1))])
        .pod(
            "ns",
            "crit",
            Some((2_000_000_000, 30)),
            &[Behaviour::ExitsAfter(S(2))],
        );
    n.unreadable = vec!["half-edited.yaml".into()];
    let report = n.fallback(BANDS, false, false).run(&n.cache).await;
    assert_eq!(report.gated_unreadable, ["half-edited.yaml"], "{report:#?}");
    let gated = n.when(&Ev::Gate("half-edited.yaml".into()));
    assert!(
        gated >= n.when(&Ev::ContainerStopped("crit-c0".into())),
        "{:#?}",
        n.events()
    );
    assert!(report.errors.is_empty(), "{report:#?}");
}

/// Issue 44: a pod that arrives while the offline drain runs (the runtime shows a sandbox
/// the first look did not: a kubelet not stopped yet started it) is stopped too, with its
/// own band's grace although that band is over, and the drain ends only once it is.
#[tokio::test(start_paused = true)]
async fn a_pod_that_arrives_during_the_offline_drain_is_stopped_with_its_grace() {
    let mut n = Node::new();
    n.pod("ns", "web", Some((0, 30)), &[Behaviour::ExitsAfter(S(1))])
        .pod("ns", "db", Some((1000, 30)), &[Behaviour::ExitsAfter(S(2))]);
    let fallback = n.fallback(BANDS, false, false);
    // Bound while db's band runs; its priority is unknown (not in the pod cache): band 0's.
    let runtime = n.runtime.clone();
    let arrival = tokio::spawn(async move {
        while runtime.running().contains(&"ns/web".to_string()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let sandbox = runtime.add_sandbox("ns", "late", "uid-late");
        runtime.add_container(&sandbox, "c0", Behaviour::ExitsAfter(S(3)))
    });
    let report = fallback.run(&n.cache).await;
    let late = arrival.await.unwrap();
    let (at, grace) = n.stop_requested(&late);
    assert_eq!(grace, S(10), "band 0's grace");
    assert!(at > n.stop_requested("web-c0").0, "{:#?}", n.events());
    let pod = report
        .pod("ns", "late")
        .unwrap_or_else(|| panic!("not in the report: {report:#?}"));
    assert_eq!(pod.outcome, PodOutcome::Stopped, "{pod:#?}");
    assert!(n.runtime.running().is_empty(), "{:?}", n.runtime.running());
    assert!(report.pods.iter().all(|p| p.outcome == PodOutcome::Stopped));
}
