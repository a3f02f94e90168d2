//! What the `nodegrace run` binary serves on its metrics port, on a private bus with the fake
//! logind and against the fake apiserver: what a scrape shows during and after a drain (the
//! budget blocking longest, reachability, the cordon, the last outcome, kept across a
//! restart), a budget too short for the plan; what it serves after a drain passes
//! `promtool check metrics`, and every metric the shipped Grafana dashboard queries is one it
//! serves. The endpoint cannot cost the daemon its inhibitor or its bus: under systemd's
//! default soft limit of 1,024 open files it drains a shutdown while 2,000 idle and half-sent
//! connections are held against its metrics port, and a port already taken is reported by
//! its key while the daemon still holds its inhibitor.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nodegrace_testkit::fake_apiserver::FakeCluster;
use nodegrace_testkit::fake_kubelet::{FakeKubelet, KubeletConfig};
use nodegrace_testkit::{FakeState, TestEnv};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

mod promtool;

const DAEMON_NOFILE: u64 = 1024;
const NODE: &str = "node-a";
const NS: &str = "work";

/// A fake cluster with the node, its kubelet stand-in and `pods` running on it.
struct Env {
    cluster: FakeCluster,
    _kubelet: FakeKubelet,
    dir: tempfile::TempDir,
}

impl Env {
    async fn new(pods: &[&str]) -> Env {
        let cluster = FakeCluster::start().await.unwrap();
        cluster
            .install_crd(&nodegrace::node_maintenance_crd().unwrap())
            .unwrap();
        cluster.add_node(NODE).unwrap();
        for name in pods {
            cluster.add_running_pod(NS, name, NODE, json!({})).unwrap();
        }
        let kubelet = cluster.kubelet(KubeletConfig::node(NODE));
        Env {
            cluster,
            _kubelet: kubelet,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn pod_exists(&self, name: &str) -> bool {
        self.cluster.store.get_obj("", "pods", NS, name).is_some()
    }

    /// Pods the apiserver was asked to evict.
    fn evicted(&self) -> Vec<String> {
        self.cluster
            .api
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/eviction"))
            .filter_map(|r| {
                r.path
                    .split("/pods/")
                    .nth(1)?
                    .split('/')
                    .next()
                    .map(String::from)
            })
            .collect()
    }
}

/// The daemon as a child process; killed when dropped.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start(env: &Env, bus: &TestEnv, metrics_port: u16) -> Daemon {
        Daemon::start_with(env, bus, metrics_port, "reserve_critical = \"1s\"")
    }

    /// `reserve_critical` is a line of the `[drain]` section.
    fn start_with(env: &Env, bus: &TestEnv, metrics_port: u16, reserve_critical: &str) -> Daemon {
        let dir = env.dir.path();
        let root = dir.display();
        nodegrace_testkit::write_kubeconfig(&dir.join("kubeconfig"), &env.cluster.api.url())
            .unwrap();
        for d in ["state", "manifests", "gate", "logind.conf.d"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(
            dir.join("config.toml"),
            format!(
                r#"state_dir = "{root}/state"
[node]
name = "{NODE}"
kubeconfig = "{root}/kubeconfig"
kubelet_kubeconfig = ""
renew_credential = false
[shutdown]
max_delay = "60s"
manage_logind_dropin = false
logind_dropin_dir = "{root}/logind.conf.d"
[drain]
reserve_daemonset = "1s"
reserve_static = "1s"
{reserve_critical}
volume_detach_timeout = "1s"
[fallback]
stop_kubelet = false
[static_pods]
manifest_dir = "{root}/manifests"
gate_dir = "{root}/gate"
[metrics]
listen = "127.0.0.1:{metrics_port}"
"#
            ),
        )
        .unwrap();
        let log = dir.join("daemon.log");
        // systemd's default for a unit without LimitNOFILE=: the limit the probe in issue 30
        // exhausted.
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n {DAEMON_NOFILE} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_nodegrace"))
            .arg("--config")
            .arg(dir.join("config.toml"))
            .arg("run")
            .env("DBUS_SYSTEM_BUS_ADDRESS", bus.bus.address())
            .env("NODEGRACE_STATUS_FILE", dir.join("status.json"))
            .env_remove("KUBECONFIG")
            .env_remove("JOURNAL_STREAM")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Daemon { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// User and system CPU time the daemon used so far.
    fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // Fields after the command's closing parenthesis; utime and stime are the 14th and
        // 15th of the whole line.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .unwrap()
            .unwrap() as u64;
        Duration::from_millis(ticks * 1000 / per_second)
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

async fn bus_env(dir: &Path) -> TestEnv {
    bus_env_with(dir, Duration::from_secs(120)).await
}

/// logind's `InhibitDelayMaxUSec` is `delay`.
async fn bus_env_with(dir: &Path, delay: Duration) -> TestEnv {
    TestEnv::start(dir, FakeState::with_delay(delay))
        .await
        .unwrap()
}

async fn wait_armed(bus: &TestEnv, daemon: &Daemon) {
    let held = tokio::time::timeout(
        Duration::from_secs(30),
        bus.fakes
            .wait_until(|s| !s.taken_by("nodegrace").is_empty() && !s.held().is_empty()),
    )
    .await;
    assert!(
        held.is_ok(),
        "no inhibitor within 30 s; log:\n{}",
        daemon.log()
    );
}

/// Waits up to 30 s for the daemon to release its inhibitor.
async fn wait_released(bus: &TestEnv, daemon: &Daemon) {
    let released = tokio::time::timeout(
        Duration::from_secs(30),
        bus.fakes.wait_until(|s| s.held().is_empty()),
    )
    .await;
    assert!(
        released.is_ok(),
        "the inhibitor was not released within 30 s; log:\n{}",
        daemon.log()
    );
}

/// The cluster with `pods`, the bus with the fakes, and the daemon armed with its metrics on
/// a free local port (also returned, as an address).
async fn armed_daemon(pods: &[&str]) -> (Env, tempfile::TempDir, TestEnv, Daemon, String) {
    let env = Env::new(pods).await;
    let (bus_dir, bus, daemon, addr) = armed_on(&env).await;
    (env, bus_dir, bus, daemon, addr)
}

/// A daemon started on `env` (its state directory kept from any daemon before), armed on a
/// bus of its own; and its metrics' address.
async fn armed_on(env: &Env) -> (tempfile::TempDir, TestEnv, Daemon, String) {
    let bus_dir = tempfile::tempdir().unwrap();
    let bus = bus_env(bus_dir.path()).await;
    let port = free_port();
    let daemon = Daemon::start(env, &bus, port);
    wait_armed(&bus, &daemon).await;
    (bus_dir, bus, daemon, format!("127.0.0.1:{port}"))
}

/// Holds `count` connections to `addr`: odd ones send half a request head, even ones nothing.
/// Returns how many are established now and the token that closes them all.
fn flood(addr: String, count: usize) -> (Arc<AtomicUsize>, CancellationToken) {
    let established = Arc::new(AtomicUsize::new(0));
    let release = CancellationToken::new();
    for i in 0..count {
        let (addr, established, release) = (addr.clone(), established.clone(), release.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = release.cancelled() => {}
                _ = async {
                    let Ok(mut conn) = TcpStream::connect(&addr).await else { return };
                    established.fetch_add(1, Ordering::Relaxed);
                    if i % 2 == 1 {
                        let _ = conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: flood\r\n").await;
                    }
                    std::future::pending::<()>().await;
                } => {}
            }
        });
    }
    (established, release)
}

async fn scrape(addr: &str) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    tokio::time::timeout(Duration::from_secs(20), conn.read_to_string(&mut reply))
        .await
        .unwrap()
        .unwrap();
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_and_half_sent_connections_cost_the_drain_nothing() {
    // The flood's own descriptors are the test's, not the daemon's.
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard >= 4096,
        "the test needs 2,000 sockets; hard limit {hard}"
    );

    let pods = ["web-1", "web-2", "web-3"];
    let (env, _bus_dir, bus, daemon, addr) = armed_daemon(&pods).await;
    // Settled: the watches are up and the endpoint answers.
    assert!(scrape(&addr).await.starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fds_before = daemon.open_fds();

    let cpu_before = daemon.cpu();
    let flood_started = Instant::now();
    let (established, release) = flood(addr.clone(), 2000);
    let mut max_fds = fds_before;
    let sample = |max: &mut usize| *max = (*max).max(daemon.open_fds());
    while flood_started.elapsed() < Duration::from_secs(3) {
        sample(&mut max_fds);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held_at_shutdown = established.load(Ordering::Relaxed);

    let signalled = Instant::now();
    bus.fakes.prepare_for_shutdown(true).await.unwrap();
    let mut released = None;
    while signalled.elapsed() < Duration::from_secs(40) {
        sample(&mut max_fds);
        if released.is_none() && bus.fakes.state().held().is_empty() {
            released = Some(signalled.elapsed());
        }
        // The flood outlasts the release and a connection time limit (10 s).
        if released.is_some() && flood_started.elapsed() > Duration::from_secs(12) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let flood_lasted = flood_started.elapsed();
    let cpu = daemon.cpu() - cpu_before;
    let held_at_end = established.load(Ordering::Relaxed);
    release.cancel();
    let log = daemon.log();
    println!(
        "established {held_at_shutdown} of 2000 at the signal, {held_at_end} by the end; daemon fds {fds_before} before, at most {max_fds}; \
         released {released:?} after the signal; daemon CPU {cpu:?} in {flood_lasted:?}; log {} lines",
        log.lines().count()
    );

    let released =
        released.unwrap_or_else(|| panic!("the inhibitor was never released; log:\n{log}"));
    assert!(
        released < Duration::from_secs(15),
        "released only after {released:?}"
    );
    for p in pods {
        assert!(!env.pod_exists(p), "{p} still exists");
        assert!(
            env.evicted().contains(&p.to_string()),
            "{p} was not evicted"
        );
    }
    assert!(
        held_at_shutdown >= 1000,
        "only {held_at_shutdown} connections established: the flood did not happen"
    );
    assert!(
        max_fds <= fds_before + 16 + 8,
        "the endpoint took descriptors beyond its cap: {fds_before} before, {max_fds} at most"
    );
    assert!(max_fds < (DAEMON_NOFILE - 256) as usize);
    assert!(
        cpu < flood_lasted / 10,
        "the daemon used {cpu:?} of CPU in {flood_lasted:?}"
    );
    assert!(!log.contains("Too many open files"), "{log}");
    assert!(
        log.lines().count() < 200,
        "the log grew by {} lines",
        log.lines().count()
    );

    // The endpoint serves again once the flood is gone.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reply = scrape(&addr).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("nodegrace_inhibitor_held 0"), "{reply}");
}

#[tokio::test]
async fn a_metrics_port_already_taken_is_reported_by_its_key_and_the_node_still_protected() {
    let env = Env::new(&[]).await;
    let bus_dir = tempfile::tempdir().unwrap();
    let bus = bus_env(bus_dir.path()).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut daemon = Daemon::start(&env, &bus, port);
    wait_armed(&bus, &daemon).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemon.log().contains("metrics.listen") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = daemon.log();
    assert!(log.contains("metrics.listen"), "{log}");
    assert!(log.contains(&format!("127.0.0.1:{port}")), "{log}");
    assert!(log.contains("in use"), "{log}");
    assert!(log.contains("the node is protected all the same"), "{log}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(daemon.child.try_wait().ok().flatten().is_none(), "{log}");
    assert_eq!(bus.held_by_us(), 1);
}

#[tokio::test]
async fn what_the_endpoint_serves_after_a_drain_passes_promtool_check_metrics() {
    let Some(promtool) = promtool::promtool("promtool check metrics on the endpoint") else {
        return;
    };
    let (_env, _bus_dir, bus, daemon, addr) = armed_daemon(&["web-1", "web-2"]).await;
    bus.fakes
        .prepare_for_shutdown_typed(true, "reboot")
        .await
        .unwrap();
    wait_released(&bus, &daemon).await;
    // The status mirror sets the last gauges just after the release.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reply = scrape(&addr).await;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{reply}");
    // Both evicted in the drain's one band, under the name its duration has.
    let band = sample_labelled(body, "nodegrace_band_duration_seconds{band=\"");
    assert_eq!(band.len(), 1, "{body}");
    let terminated = format!(
        "nodegrace_pods_terminated_total{{method=\"eviction\",band=\"{}\"}} 2",
        band[0]
    );
    assert!(body.contains(&terminated), "{terminated} missing:\n{body}");
    // Its duration is the next daemon's to count (the next boot's, in
    // `a_scrape_shows_the_budget_blocking_during_a_drain_and_the_outcome_after_it_and_the_next_boot`).
    assert!(
        !body.contains("nodegrace_shutdown_duration_seconds_count"),
        "{body}"
    );
    for line in [
        "nodegrace_armed 0",
        "nodegrace_draining 0",
        "nodegrace_bus_connected 1",
    ] {
        assert!(body.contains(line), "{line} missing:\n{body}");
    }
    promtool::check_metrics(&promtool, body);
}

/// The values of the first label of the series whose line starts `prefix` (the metric's name,
/// `{` and the label's name, `="`), as `body` shows them.
fn sample_labelled<'a>(body: &'a str, prefix: &str) -> Vec<&'a str> {
    body.lines()
        .filter_map(|l| l.strip_prefix(prefix)?.split_once('"').map(|(v, _)| v))
        .collect()
}

/// The body of a scrape (Prometheus's text format), failing unless it answers 200.
async fn scrape_body(addr: &str) -> String {
    let reply = scrape(addr).await;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{reply}");
    body.to_string()
}

/// The value of the sample `series` (its name and labels as served), if it is served.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// Scrapes until `ready` holds of the body, for up to `secs` seconds.
async fn scrape_until(addr: &str, secs: u64, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let body = scrape_body(addr).await;
        if ready(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} within {secs} s:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn unix_now() -> f64 {
    chrono::Utc::now().timestamp_millis() as f64 / 1000.0
}

const BLOCKING: &str =
    "nodegrace_budget_blocking_since_timestamp_seconds{namespace=\"work\",name=\"db-pdb\"}";

fn outcome(name: &str) -> String {
    format!("nodegrace_last_shutdown_outcome{{outcome=\"{name}\"}}")
}

/// Also the dashboard's test: the scrapes of this drain (a budget blocking, then evictions,
/// bands, a shutdown's duration and outcome) serve every metric its panels query.
#[tokio::test]
async fn a_scrape_shows_the_budget_blocking_during_a_drain_and_the_outcome_after_it_and_the_next_boot(
) {
    let env = Env::new(&["web-1"]).await;
    env.cluster
        .add_running_pod(NS, "db-1", NODE, json!({"app": "db"}))
        .unwrap();
    env.cluster
        .insert(&json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "db-pdb", "namespace": NS},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
        }))
        .unwrap();
    let bus_dir = tempfile::tempdir().unwrap();
    let bus = bus_env(bus_dir.path()).await;
    let port = free_port();
    let daemon = Daemon::start(&env, &bus, port);
    wait_armed(&bus, &daemon).await;
    let addr = format!("127.0.0.1:{port}");
    let armed = scrape_until(&addr, 10, "reachable apiserver", |b| {
        sample(b, "nodegrace_apiserver_reachable") == Some(1.0)
    })
    .await;
    assert_eq!(sample(&armed, "nodegrace_node_cordoned"), Some(0.0));
    assert_eq!(sample(&armed, "nodegrace_maintenances_active"), Some(0.0));
    assert_eq!(
        sample(&armed, "nodegrace_apiserver_outages_total"),
        Some(0.0)
    );
    assert!(
        !armed.contains("nodegrace_last_shutdown_outcome{"),
        "no shutdown yet:\n{armed}"
    );

    let signalled = unix_now();
    bus.fakes
        .prepare_for_shutdown_typed(true, "reboot")
        .await
        .unwrap();
    let blocked = scrape_until(&addr, 15, "budget blocking", |b| b.contains(BLOCKING)).await;
    let since = sample(&blocked, BLOCKING).unwrap();
    assert!(
        since >= signalled - 1.0 && since <= unix_now(),
        "blocking since {since}, signalled at {signalled}"
    );
    assert_eq!(sample(&blocked, "nodegrace_draining"), Some(1.0));
    assert_eq!(sample(&blocked, "nodegrace_node_cordoned"), Some(1.0));
    assert_eq!(sample(&blocked, "nodegrace_maintenances_active"), Some(1.0));
    assert!(
        sample(
            &blocked,
            "nodegrace_evictions_refused_total{reason=\"budget\"}"
        ) >= Some(1.0),
        "{blocked}"
    );
    // Refused again since: still blocking since its first refusal.
    let refused = sample(
        &blocked,
        "nodegrace_evictions_refused_total{reason=\"budget\"}",
    );
    let later = scrape_until(&addr, 15, "a second refusal", |b| {
        sample(b, "nodegrace_evictions_refused_total{reason=\"budget\"}") > refused
    })
    .await;
    assert_eq!(sample(&later, BLOCKING), Some(since), "{later}");
    let mut served = served_names(&blocked);

    env.cluster
        .store
        .update_in_process("policy", "poddisruptionbudgets", NS, "db-pdb", |p| {
            p["spec"]["minAvailable"] = json!(0);
        })
        .unwrap();
    wait_released(&bus, &daemon).await;
    let ended = unix_now();
    let after = scrape_until(&addr, 5, "the outcome", |b| {
        sample(b, &outcome("drained")) == Some(1.0)
    })
    .await;
    assert!(
        !after.contains("nodegrace_budget_blocking_since_timestamp_seconds{"),
        "{after}"
    );
    for other in ["failed", "budget_ended", "cancelled", "interrupted"] {
        assert_eq!(sample(&after, &outcome(other)), Some(0.0), "{after}");
    }
    served.extend(served_names(&after));
    let end = sample(&after, "nodegrace_last_shutdown_end_timestamp_seconds").unwrap();
    let start = sample(&after, "nodegrace_shutdown_start_timestamp_seconds").unwrap();
    assert!(start >= signalled - 1.0 && start < end, "{start} to {end}");
    assert!(
        end >= since && end <= ended + 1.0,
        "ended at {end}, released by {ended}"
    );

    // The next boot: the state directory says the shutdown was of another boot.
    drop(daemon);
    let state_dir = env.dir.path().join("state");
    let mut state = nodegrace::ShutdownState::load(&state_dir).unwrap().unwrap();
    let (kernel, ticks) = state.boot_id.split_once('.').unwrap();
    state.boot_id = format!("{kernel}.{}", ticks.parse::<u64>().unwrap() + 1);
    state.store(&state_dir).unwrap();
    let (_next_bus_dir, _next_bus, next, next_addr) = armed_on(&env).await;
    let booted = scrape_body(&next_addr).await;
    assert_eq!(sample(&booted, &outcome("drained")), Some(1.0), "{booted}");
    // The shutdown's duration: served at zero first, counted after that scrape (a series'
    // first value is no increase to Prometheus), once.
    const COUNT: &str = "nodegrace_shutdown_duration_seconds_count{kind=\"reboot\"}";
    const SUM: &str = "nodegrace_shutdown_duration_seconds_sum{kind=\"reboot\"}";
    assert_eq!(sample(&booted, COUNT), Some(0.0), "{booted}");
    let counted = scrape_body(&next_addr).await;
    assert_eq!(sample(&counted, COUNT), Some(1.0), "{counted}");
    let took = sample(&counted, SUM).unwrap();
    assert!(
        (took - (end - start)).abs() < 0.01,
        "{took} s, released {} s after the start",
        end - start
    );
    assert_eq!(sample(&scrape_body(&next_addr).await, COUNT), Some(1.0));
    served.extend(served_names(&counted));
    the_dashboard_queries_only(&served);
    drop(next);
    let (_again_bus_dir, _again_bus, _again, again_addr) = armed_on(&env).await;
    let restarted = scrape_body(&again_addr).await;
    assert_eq!(
        sample(&restarted, &outcome("drained")),
        Some(1.0),
        "{restarted}"
    );
    assert_eq!(
        sample(&restarted, COUNT),
        None,
        "counted by the daemon before:\n{restarted}"
    );
    assert_eq!(
        sample(&booted, "nodegrace_last_shutdown_end_timestamp_seconds"),
        Some(end)
    );
    assert_eq!(
        sample(&booted, "nodegrace_shutdown_start_timestamp_seconds"),
        Some(start)
    );
}

#[tokio::test]
async fn a_logind_budget_below_the_plans_reserves_is_too_short() {
    let env = Env::new(&[]).await;
    env.cluster.ensure_namespace(NS).unwrap();
    env.cluster
        .insert(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "critical-1", "namespace": NS},
            "spec": {"nodeName": NODE, "priority": 2_000_000_000,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
            "status": nodegrace_testkit::fake_apiserver::running_status(&env.cluster.store.now_str()),
        }))
        .unwrap();
    let bus_dir = tempfile::tempdir().unwrap();
    // logind honours 30 s; the critical pods' reserve is 40 s of the configured 60 s.
    let bus = bus_env_with(bus_dir.path(), Duration::from_secs(30)).await;
    let port = free_port();
    let daemon = Daemon::start_with(&env, &bus, port, "reserve_critical = \"40s\"");
    wait_armed(&bus, &daemon).await;
    let body = scrape_until(&format!("127.0.0.1:{port}"), 10, "the plan's needs", |b| {
        sample(b, "nodegrace_budget_needed_seconds") == Some(40.0)
    })
    .await;
    assert_eq!(
        sample(&body, "nodegrace_effective_budget_seconds"),
        Some(30.0)
    );
    assert_eq!(
        sample(&body, "nodegrace_budget_too_short"),
        Some(1.0),
        "{body}"
    );
}

/// The strings under `keys` anywhere in a dashboard: its panels' queries (`expr`) and its
/// variables' (`definition`).
fn dashboard_queries(v: &serde_json::Value, keys: &[&str], out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match value.as_str() {
                    Some(q) if keys.contains(&key.as_str()) => out.push(q.to_string()),
                    _ => dashboard_queries(value, keys, out),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                dashboard_queries(item, keys, out);
            }
        }
        _ => {}
    }
}

/// The metric names a dashboard's queries (and its variables' queries) use.
fn dashboard_metrics(dashboard: &serde_json::Value) -> std::collections::BTreeSet<String> {
    let mut found = Vec::new();
    dashboard_queries(dashboard, &["expr", "definition"], &mut found);
    let mut names = std::collections::BTreeSet::new();
    for query in &found {
        for (at, _) in query.match_indices("nodegrace_") {
            let name: String = query[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// The sample names a scrape in Prometheus's text format can hold, from its TYPE lines.
fn served_names(body: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "histogram" => {
                for suffix in ["_bucket", "_count", "_sum"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

const DASHBOARD: &str = "packaging/grafana/nodegrace-dashboard.json";

/// Every metric the shipped dashboard queries is one of `served` (the names the binary
/// served), and every query is PromQL.
fn the_dashboard_queries_only(served: &std::collections::BTreeSet<String>) {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(DASHBOARD)).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let used = dashboard_metrics(&dashboard);
    assert!(
        served.contains("nodegrace_armed")
            && served.contains("nodegrace_shutdown_duration_seconds_bucket"),
        "{served:?}"
    );
    // The check itself: a name the binary does not serve is caught.
    let mut doctored = dashboard.clone();
    doctored["panels"][1]["targets"][0]["expr"] = json!("sum(nodegrace_not_served_total)");
    assert!(!dashboard_metrics(&doctored).is_subset(served));

    let missing: Vec<&String> = used.difference(served).collect();
    assert!(
        missing.is_empty(),
        "{DASHBOARD} queries metrics the binary does not serve: {missing:?}"
    );
    for panel_metric in [
        "nodegrace_budget_blocking_since_timestamp_seconds",
        "nodegrace_evictions_refused_total",
        "nodegrace_apiserver_reachable",
        "nodegrace_band_duration_seconds",
        "nodegrace_shutdown_duration_seconds_bucket",
        "nodegrace_offline_fallback",
    ] {
        assert!(used.contains(panel_metric), "{panel_metric}: {used:?}");
    }

    // Every query parses as PromQL: promtool checks them as recording rules, with
    // Grafana's variables given values.
    let Some(promtool) = promtool::promtool("promtool on the dashboard's queries") else {
        return;
    };
    let mut exprs = Vec::new();
    dashboard_queries(&dashboard, &["expr"], &mut exprs);
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let e = e
                .replace("$__rate_interval", "5m")
                .replace("$__range", "1d")
                .replace("$node", "node-a");
            json!({"record": format!("dashboard:query_{i}"), "expr": e})
        })
        .collect();
    let file = json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("queries.yml"),
        serde_yaml::to_string(&file).unwrap(),
    )
    .unwrap();
    let out = promtool::run_promtool(&promtool, &["check", "rules", "queries.yml"], dir.path());
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{out}"
    );
}
