//! A real kubelet (v1.28.4, `../shared/realk8s/kubelet-up.sh`) for a test node, with its own
//! containerd, instead of the stand-in of [`super::kubelet`].
//!
//! The kubelet runs on the host beside the node's nspawn container, not inside it: runc
//! cannot run containers inside an nspawn container on these cgroup-v1 machines (no
//! writable cgroup controllers, no keyring syscalls), and the kubelet binary inside the node
//! exits on `/dev/kmsg` (`../shared/realk8s/README.md`). What nodegrace in the node sees is
//! what it sees on a real node: the kubelet's `staticPodPath` at its `static_pods.manifest_dir`,
//! the kubelet's containerd socket at its `fallback.cri_endpoint`, the kubelet's credential
//! at `node.kubelet_kubeconfig`, and a `kubelet.service` whose stop stops the kubelet (the
//! unit's `ExecStop` asks the host through a bound directory, [`UnitBridge`]). The kubelet
//! registers the node under the node's host name (`--hostname-override`), which is the name
//! nodegrace resolves with the shipped `node.name = ""`.
//!
//! A reboot of such a node is: the node's container powers off (its `kubelet.service` stop
//! stops the kubelet), [`RealKubelet::down`] (every container and containerd go, as they go
//! with a machine), [`RealKubelet::up`], the node boots again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use nodegrace::{v1 as cri, CriClient, CriTimeouts};

use super::audit::{self, Request};
use super::node::{KubeletUnit, TestNode};
use super::{workload, ControlPlane};

/// The image kubelet-up.sh builds from busybox-static and imports.
pub const IMAGE: &str = "localhost/busybox:1";

/// Where the node's `kubelet.service` and the host meet.
const CTL_IN_NODE: &str = "/run/kubelet-ctl";

/// A free loopback TCP port (for the kubelet's port, one per kubelet).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A kubeconfig like `from` whose server is `127.0.0.1:port` (an [`ApiProxy`]).
pub fn kubeconfig_through(from: &Path, port: u16, to: &Path) {
    let text = std::fs::read_to_string(from).expect("read kubeconfig");
    assert!(text.contains("https://127.0.0.1:6443"), "{from:?}");
    std::fs::write(
        to,
        text.replace(
            "https://127.0.0.1:6443",
            &format!("https://127.0.0.1:{port}"),
        ),
    )
    .expect("write kubeconfig");
}

pub struct RealKubelet {
    pub node: String,
    /// kubelet-up.sh's DIR: containerd, the kubelet's root, `manifests/`, logs, pids.
    pub dir: PathBuf,
    tmp: Option<tempfile::TempDir>,
    pub port: u16,
    /// `KUBELET_EXTRA_CONFIG`.
    pub extra_config: String,
    /// More environment for kubelet-up.sh and so the kubelet (`DBUS_SYSTEM_BUS_ADDRESS`).
    pub env: Vec<(String, String)>,
    scripts: PathBuf,
    bridge: Option<UnitBridge>,
    /// A hung kubelet: the host ignores the unit's stop request (the kubelet keeps running),
    /// and the unit's stop waits for it until systemd's `TimeoutStopSec=` gives up.
    pub ignores_stop: bool,
}

impl RealKubelet {
    /// A kubelet for `node` whose credential is `kubeconfig` (copied to where kubelet-up.sh
    /// looks for it); not started.
    pub fn new(cp: &ControlPlane, node: &str, kubeconfig: &Path) -> RealKubelet {
        // Short: containerd's sockets live under it (108-byte socket paths).
        let tmp = tempfile::Builder::new()
            .prefix("ngk-")
            .tempdir_in("/tmp")
            .expect("kubelet dir");
        let dir = tmp.path().to_path_buf();
        std::fs::copy(kubeconfig, dir.join("kubelet.kubeconfig")).expect("kubelet kubeconfig");
        std::fs::create_dir_all(dir.join("manifests")).expect("manifest dir");
        std::fs::create_dir_all(dir.join("ctl")).expect("ctl dir");
        RealKubelet {
            node: node.to_owned(),
            dir,
            tmp: Some(tmp),
            port: free_port(),
            extra_config: String::new(),
            env: Vec::new(),
            scripts: cp.scripts.clone(),
            bridge: None,
            ignores_stop: false,
        }
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.join("manifests")
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubelet.kubeconfig")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/kubelet.log")).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The kubelet's `--root-dir`.
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// The kubelet's root made a shared mount of its own, so the mounts the kubelet makes
    /// under it reach the node's container too (kubelet-down.sh unmounts it).
    fn share_root(&self) {
        let root = self.root();
        std::fs::create_dir_all(&root).expect("kubelet root");
        let mounted = Command::new("mountpoint")
            .arg("-q")
            .arg(&root)
            .status()
            .is_ok_and(|s| s.success());
        let mut steps = vec![vec!["--make-shared"]];
        if !mounted {
            steps.insert(0, vec!["--bind"]);
        }
        for step in steps {
            let mut cmd = Command::new("mount");
            cmd.args(&step);
            if step == ["--bind"] {
                cmd.arg(&root);
            }
            let status = cmd.arg(&root).status().expect("mount");
            assert!(status.success(), "mount {step:?} {root:?} failed");
        }
    }

    /// kubelet-up.sh: containerd and the kubelet, until the Node is Ready.
    pub fn up(&mut self) {
        self.share_root();
        let out = Command::new("bash")
            .arg(self.scripts.join("kubelet-up.sh"))
            .arg(&self.node)
            .arg(&self.dir)
            .env("KUBELET_PORT", self.port.to_string())
            .env("KUBELET_EXTRA_CONFIG", &self.extra_config)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .expect("run kubelet-up.sh");
        assert!(
            out.status.success(),
            "kubelet-up.sh {} failed ({}):\n{}{}\n{}",
            self.node,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        if self.bridge.is_none() {
            self.bridge = Some(UnitBridge::start(
                self.dir.join("ctl"),
                self.dir.join("kubelet.pid"),
                self.ignores_stop,
            ));
        }
    }

    /// kubelet-down.sh: the kubelet, every pod sandbox and containerd (a machine's power
    /// going off).
    pub fn down(&mut self) {
        let _ = Command::new("bash")
            .arg(self.scripts.join("kubelet-down.sh"))
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output();
    }

    /// Whether the kubelet process runs.
    pub fn running(&self) -> bool {
        pid_in(&self.dir.join("kubelet.pid")).is_some_and(alive)
    }

    /// When the node's `kubelet.service` stop stopped the kubelet (Unix seconds), if it did.
    pub fn stopped_by_unit(&self) -> Option<f64> {
        std::fs::read_to_string(self.dir.join("ctl/stopped"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// When the host ignored the unit's stop request ([`RealKubelet::ignores_stop`]), if it
    /// was asked (Unix seconds).
    pub fn stop_ignored(&self) -> Option<f64> {
        std::fs::read_to_string(self.dir.join("ctl/ignored"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The node's `kubelet.service`: stopping it stops this kubelet on the host.
    pub fn unit(&self) -> KubeletUnit {
        // A hung kubelet's stop lasts until `TimeoutStopSec=` (30 s) has passed.
        let polls = if self.ignores_stop { 2000 } else { 400 };
        let stop = format!(
            "#!/bin/sh\n# Asks the host to stop the kubelet and waits until it has.\n\
             date +%s.%N > /results/kubelet-stop\n: > {CTL_IN_NODE}/stop\n\
             i=0\nwhile [ ! -e {CTL_IN_NODE}/stopped ] && [ $i -lt {polls} ]; do sleep 0.05; i=$((i+1)); done\n"
        );
        KubeletUnit {
            unit: format!(
                "[Unit]\nDescription=kubelet (runs on the test host; this unit's stop stops it)\n\n\
                 [Service]\nExecStartPre=/bin/rm -f {CTL_IN_NODE}/stop {CTL_IN_NODE}/stopped\n\
                 ExecStart=/bin/sleep infinity\nExecStop=/bin/sh /usr/local/lib/kubelet-stop.sh\n\
                 TimeoutStopSec=30\n"
            ),
            files: vec![("/usr/local/lib/kubelet-stop.sh".into(), stop)],
            rw_dirs: vec![(CTL_IN_NODE.into(), self.dir.join("ctl"))],
        }
    }

    /// Wires `node` to this kubelet: its staticPodPath, its containerd socket (the directory
    /// holding `containerd.sock`, at the shipped `fallback.cri_endpoint`'s) and its unit.
    pub fn attach(&self, node: &mut TestNode) {
        node.manifests = self.manifests();
        node.cri_dir = Some(self.dir.clone());
        node.kubelet_root = Some(self.root());
        node.kubelet_unit = Some(self.unit());
    }

    /// Names of the containers containerd runs now (`ctr tasks ls`, state RUNNING).
    pub fn running_containers(&self) -> Vec<String> {
        let out = Command::new("ctr")
            .arg("-a")
            .arg(self.dir.join("containerd.sock"))
            .args(["-n", "k8s.io", "tasks", "ls"])
            .stdin(Stdio::null())
            .output()
            .expect("ctr tasks ls");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter(|l| l.split_whitespace().nth(2) == Some("RUNNING"))
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    }
}

impl Drop for RealKubelet {
    fn drop(&mut self) {
        self.bridge.take();
        self.down();
        if std::thread::panicking() || std::env::var_os("NODEGRACE_KEEP_RESULTS").is_some() {
            if let Some(tmp) = self.tmp.take() {
                eprintln!(
                    "kubelet of {}: logs kept in {}",
                    self.node,
                    tmp.keep().join("logs").display()
                );
            }
        }
    }
}

fn pid_in(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

fn alive(pid: i32) -> bool {
    // A zombie (exited, not yet reaped) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
        .unwrap_or(false)
}

/// The host side of the node's `kubelet.service`: when its stop writes `ctl/stop`, SIGTERM
/// to the kubelet, SIGKILL after 10 s, then `ctl/stopped` (holding the time it was gone);
/// with `ignores_stop`, only `ctl/ignored` (the time it was asked), the kubelet untouched.
struct UnitBridge {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UnitBridge {
    fn start(ctl: PathBuf, pid_file: PathBuf, ignores_stop: bool) -> UnitBridge {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if ctl.join("stop").exists() && ignores_stop {
                    if !ctl.join("ignored").exists() {
                        let _ = std::fs::write(
                            ctl.join("ignored"),
                            format!("{:.6}", super::now_unix()),
                        );
                    }
                    let _ = std::fs::remove_file(ctl.join("stop"));
                } else if ctl.join("stop").exists() {
                    if let Some(pid) = pid_in(&pid_file) {
                        let pid_ = nix::unistd::Pid::from_raw(pid);
                        let _ = nix::sys::signal::kill(pid_, nix::sys::signal::Signal::SIGTERM);
                        let deadline = Instant::now() + Duration::from_secs(10);
                        while alive(pid) && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        let _ = nix::sys::signal::kill(pid_, nix::sys::signal::Signal::SIGKILL);
                    }
                    let _ = std::fs::remove_file(ctl.join("stop"));
                    let _ =
                        std::fs::write(ctl.join("stopped"), format!("{:.6}", super::now_unix()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        UnitBridge {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for UnitBridge {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TCP proxy on 127.0.0.1 to the shared apiserver (127.0.0.1:6443): a node whose
/// kubeconfigs name it loses the apiserver when it closes, and nobody else does.
pub struct ApiProxy {
    pub port: u16,
    close: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiProxy {
    /// Listens on `port` (0: any free one).
    pub fn open(port: u16) -> ApiProxy {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("proxy port");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("proxy address").port();
        let (close, mut closed) = tokio::sync::watch::channel(false);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    tokio::select! {
                        _ = closed.changed() => return,
                        accepted = listener.accept() => {
                            let Ok((mut down, _)) = accepted else { continue };
                            tokio::spawn(async move {
                                if let Ok(mut up) = tokio::net::TcpStream::connect("127.0.0.1:6443").await {
                                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                                }
                            });
                        }
                    }
                }
            });
            // Dropping the runtime drops every connection: the node sees them reset.
        });
        ApiProxy {
            port,
            close: Some(close),
            thread: Some(thread),
        }
    }

    /// Stops listening and drops every connection.
    pub fn close(&mut self) {
        if let Some(close) = self.close.take() {
            let _ = close.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.close();
    }
}

/// What a watch of a namespace's pods saw of each pod, by UID.
#[derive(Debug, Clone, Default)]
pub struct PodSeen {
    pub name: String,
    /// `metadata.deletionGracePeriodSeconds` when the pod was first seen terminating.
    pub deletion_grace: Option<i64>,
    pub termination_grace: Option<i64>,
    pub node: String,
    /// The reason of its `DisruptionTarget` condition and when the watch first saw it
    /// (Unix seconds): `TerminationByKubelet` for the kubelet's GNS, `EvictionByEvictionAPI`.
    pub disruption: Option<(String, f64)>,
    /// When the watch first saw it Succeeded or Failed.
    pub terminal_at: Option<f64>,
    /// When the watch first saw it terminating (a deletion timestamp).
    pub terminating_at: Option<f64>,
}

/// Watches `ns`'s pods and records each one's deletion grace period.
pub struct PodWatch {
    seen: Arc<Mutex<BTreeMap<String, PodSeen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    pub fn start(admin: &Client, ns: &str) -> PodWatch {
        let api: Api<Pod> = Api::namespaced(admin.clone(), ns);
        let seen: Arc<Mutex<BTreeMap<String, PodSeen>>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let pods = match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => vec![p],
                    Ok(watcher::Event::Delete(p)) => vec![p],
                    _ => continue,
                };
                let mut map = record.lock().unwrap_or_else(|p| p.into_inner());
                for p in pods {
                    let entry = map.entry(p.uid().unwrap_or_default()).or_default();
                    entry.name = p.name_any();
                    let spec = p.spec.clone().unwrap_or_default();
                    entry.termination_grace = spec.termination_grace_period_seconds;
                    entry.node = spec.node_name.unwrap_or_default();
                    if entry.deletion_grace.is_none() && p.metadata.deletion_timestamp.is_some() {
                        entry.deletion_grace = p.metadata.deletion_grace_period_seconds;
                    }
                    let now = super::now_unix();
                    if p.metadata.deletion_timestamp.is_some() {
                        entry.terminating_at.get_or_insert(now);
                    }
                    let status = p.status.clone().unwrap_or_default();
                    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
                        entry.terminal_at.get_or_insert(now);
                    }
                    if entry.disruption.is_none() {
                        entry.disruption = status
                            .conditions
                            .iter()
                            .flatten()
                            .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
                            .map(|c| (c.reason.clone().unwrap_or_default(), now));
                    }
                }
            }
        });
        PodWatch { seen, task }
    }

    pub fn seen(&self) -> BTreeMap<String, PodSeen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// When the kubelet's Graceful Node Shutdown began killing each pod (its log's "Shutdown
/// manager killing pod" lines), by pod name, in Unix seconds.
pub fn gns_kills(log: &str) -> BTreeMap<String, f64> {
    gns_lines(log, "Shutdown manager killing pod")
}

/// When the kubelet's GNS had stopped each pod's containers, by pod name (its log).
pub fn gns_killed(log: &str) -> BTreeMap<String, f64> {
    gns_lines(log, "Shutdown manager finished killing pod")
}

fn gns_lines(log: &str, says: &str) -> BTreeMap<String, f64> {
    let year = chrono::Utc::now().format("%Y").to_string();
    log.lines()
        .filter(|l| l.contains(says))
        .filter_map(|l| {
            // I1124 16:17:05.196576   32173 nodeshutdown_manager_linux.go:375] "..." pod="ns/name" ...
            let mut words = l.split_whitespace();
            let date = words.next()?.get(1..)?;
            let time = words.next()?;
            let at = chrono::NaiveDateTime::parse_from_str(
                &format!("{year}{date} {time}"),
                "%Y%m%d %H:%M:%S%.f",
            )
            .ok()?
            .and_utc();
            let pod = l.split("pod=\"").nth(1)?.split('"').next()?;
            let name = pod.rsplit('/').next()?.to_owned();
            Some((name, at.timestamp_micros() as f64 / 1e6))
        })
        .collect()
}

/// The real kubelet's own requests (user `system:node:<node>`, user agent `kubelet/...`).
pub fn kubelet_requests(cp: &ControlPlane, node: &str, since: f64) -> Vec<Request> {
    audit::requests_of(&cp.audit_log(), &format!("system:node:{node}"), since)
        .into_iter()
        .filter(|r| r.user_agent.starts_with("kubelet/"))
        .collect()
}

/// The kubelet's DELETEs of pods (the last step of every termination it carries out),
/// successful ones, in order.
pub fn kubelet_pod_deletes(reqs: &[Request]) -> Vec<&Request> {
    reqs.iter()
        .filter(|r| r.verb == "delete" && r.resource == "pods" && r.subresource.is_empty())
        .filter(|r| r.code == 200)
        .collect()
}

/// Pods of `ns` bound to `node` and not terminating, by name.
pub async fn live_pods(admin: &Client, ns: &str, node: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(admin.clone(), ns);
    api.list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn running(p: &Pod) -> bool {
    let status = p.status.clone().unwrap_or_default();
    status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Waits until exactly `names` (by the `app` label) pods of `ns` run Ready on `node`.
pub async fn wait_running(
    admin: &Client,
    ns: &str,
    node: &str,
    apps: &[(&str, usize)],
    timeout: Duration,
) -> Vec<Pod> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let pods = live_pods(admin, ns, node).await;
        let ok = apps.iter().all(|(app, n)| {
            pods.iter()
                .filter(|p| super::fixture::app_of(p) == *app && running(p))
                .count()
                == *n
        }) && pods.len() == apps.iter().map(|(_, n)| n).sum::<usize>();
        if ok {
            return pods;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {apps:?} running on {node}: {:?}",
            pods.iter()
                .map(|p| (
                    p.name_any(),
                    p.status.as_ref().and_then(|s| s.phase.clone())
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One node of the real cluster run by a real kubelet, a namespace for its pods, and the
/// time it began (audit records before it are not this test's).
pub struct RealFixture {
    pub cp: &'static ControlPlane,
    pub admin: Client,
    pub name: String,
    pub node: TestNode,
    pub kubelet: RealKubelet,
    pub started: f64,
    /// When set, the node and its kubelet reach the apiserver only through it.
    pub proxy: Option<ApiProxy>,
}

impl RealFixture {
    /// A node named `<prefix>-...`, its kubelet up and Ready; the node not booted yet.
    /// With `through_proxy`, the kubelet's and nodegrace's kubeconfigs name an [`ApiProxy`].
    pub async fn new(prefix: &str, extra_config: &str, through_proxy: bool) -> RealFixture {
        Self::with_kubelet_env(prefix, extra_config, through_proxy, &[]).await
    }

    /// Like [`RealFixture::new`], with `env` added to the kubelet's environment.
    pub async fn with_kubelet_env(
        prefix: &str,
        extra_config: &str,
        through_proxy: bool,
        env: &[(&str, &str)],
    ) -> RealFixture {
        Self::build(prefix, extra_config, through_proxy, env, false).await
    }

    /// Like [`RealFixture::new`] through a proxy, with a kubelet that does not stop when its
    /// unit is stopped ([`RealKubelet::ignores_stop`]).
    pub async fn with_hung_kubelet(prefix: &str) -> RealFixture {
        Self::build(prefix, "", true, &[], true).await
    }

    async fn build(
        prefix: &str,
        extra_config: &str,
        through_proxy: bool,
        env: &[(&str, &str)],
        ignores_stop: bool,
    ) -> RealFixture {
        let cp = super::running_control_plane().await;
        let started = super::now_unix();
        let admin = cp.admin().await;
        let name = super::unique(prefix);
        workload::create_namespace(&admin, &name).await;
        let proxy = through_proxy.then(|| ApiProxy::open(0));
        let (ours, theirs) = (cp.nodegrace_identity(&name), cp.kubelet_identity(&name));
        let mut kubelet = RealKubelet::new(cp, &name, &theirs);
        let nodegrace_kubeconfig = match &proxy {
            Some(proxy) => {
                kubeconfig_through(&theirs, proxy.port, &kubelet.kubeconfig());
                let path = kubelet.dir.join("nodegrace.kubeconfig");
                kubeconfig_through(&ours, proxy.port, &path);
                path
            }
            None => ours,
        };
        kubelet.extra_config = extra_config.to_owned();
        kubelet.ignores_stop = ignores_stop;
        kubelet.env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut node = TestNode::new(&name, nodegrace_kubeconfig, kubelet.kubeconfig());
        kubelet.attach(&mut node);
        let kubelet = tokio::task::spawn_blocking(move || {
            kubelet.up();
            kubelet
        })
        .await
        .expect("kubelet-up.sh");
        RealFixture {
            cp,
            admin,
            name,
            node,
            kubelet,
            started,
            proxy,
        }
    }

    pub fn user(&self) -> String {
        format!("nodegrace:node:{}", self.name)
    }

    /// nodegrace's requests (its own identity, and the kubelet's credential used by it).
    pub fn nodegrace_requests(&self) -> Vec<Request> {
        super::fixture::nodegrace_requests(self.cp, &self.name, self.started)
    }

    /// The real kubelet's own requests since the fixture began.
    pub fn kubelet_requests(&self) -> Vec<Request> {
        kubelet_requests(self.cp, &self.name, self.started)
    }

    /// The machine's reboot after the node's container exited: every container and
    /// containerd go, then the kubelet comes up again.
    pub async fn restart_kubelet(&mut self) {
        let mut kubelet = std::mem::replace(&mut self.kubelet, RealKubelet::placeholder());
        let kubelet = tokio::task::spawn_blocking(move || {
            kubelet.down();
            kubelet.up();
            kubelet
        })
        .await
        .expect("kubelet restart");
        self.kubelet = kubelet;
    }

    pub async fn cleanup(&self) {
        super::fixture::cleanup_node(&self.admin, &self.name).await;
    }
}

impl RealKubelet {
    /// Holds nothing and does nothing on drop; only while a real one is moved out.
    fn placeholder() -> RealKubelet {
        RealKubelet {
            node: String::new(),
            dir: PathBuf::from("/nonexistent"),
            tmp: None,
            port: 0,
            extra_config: String::new(),
            env: Vec::new(),
            scripts: PathBuf::from("/nonexistent"),
            bridge: None,
            ignores_stop: false,
        }
    }
}

/// A container as the runtime reports it, with its pod.
#[derive(Debug, Clone)]
pub struct Ctr {
    pub id: String,
    pub pod: String,
    pub attempt: u32,
    pub state: i32,
    pub exit_code: i32,
    pub finished: f64,
}

pub async fn containers(endpoint: &str) -> Vec<Ctr> {
    let mut rt = CriClient::new(endpoint, CriTimeouts::default())
        .expect("CRI client")
        .raw();
    let list = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    let mut all = Vec::new();
    for c in list {
        // Gone since the listing (the kubelet removes the containers of old sandboxes).
        let Some(status) = rt
            .container_status(cri::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|s| s.into_inner().status)
        else {
            continue;
        };
        all.push(Ctr {
            id: c.id.clone(),
            pod: c
                .labels
                .get(nodegrace::LABEL_POD_NAME)
                .cloned()
                .unwrap_or_default(),
            attempt: c.metadata.map(|m| m.attempt).unwrap_or_default(),
            state: status.state,
            exit_code: status.exit_code,
            finished: status.finished_at as f64 / 1e9,
        });
    }
    all
}

/// Every container the runtime ran while it watched, as last seen, by ID: a kubelet removes
/// the containers of a pod's old sandboxes, which a listing at the end no longer shows.
pub struct ContainerWatch {
    seen: Arc<Mutex<BTreeMap<String, Ctr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ContainerWatch {
    pub fn start(endpoint: &str) -> ContainerWatch {
        let seen: Arc<Mutex<BTreeMap<String, Ctr>>> = Arc::default();
        let record = seen.clone();
        let endpoint = endpoint.to_owned();
        let task = tokio::spawn(async move {
            loop {
                for c in containers(&endpoint).await {
                    let mut map = record.lock().unwrap_or_else(|p| p.into_inner());
                    map.insert(c.id.clone(), c);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        ContainerWatch { seen, task }
    }

    pub fn seen(&self) -> Vec<Ctr> {
        let map = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        map.values().cloned().collect()
    }
}

impl Drop for ContainerWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The first request in `reqs` about pod `name` matching `pick`.
pub fn first<'a>(
    reqs: &'a [Request],
    name: &str,
    pick: impl Fn(&Request) -> bool,
) -> Option<&'a Request> {
    reqs.iter().find(|r| r.name == name && pick(r))
}

/// When the kubelet had stopped pod `name`, as the apiserver recorded it: the completion of
/// its last status write before its DELETE, if any yet (the pod's terminal status: from then
/// on nothing of the pod runs, and its DELETE follows once the kubelet has cleaned up); for
/// the mirror pod of a static pod, whose status it does not write then, the first DELETE,
/// the kubelet's or nodegrace's (`ours`: nodegrace deletes it once the node shows the static
/// pod gone).
pub fn stopped(kubelets: &[Request], ours: &[Request], name: &str, mirror: &str) -> Option<f64> {
    let delete = first(kubelets, name, is_pod_delete);
    if name == mirror {
        return delete
            .into_iter()
            .chain(first(ours, name, is_pod_delete))
            .map(|d| d.completed)
            .reduce(f64::min);
    }
    // Its DELETE may not have been sent yet when the node powered off: nodegrace goes on at
    // the terminal status, and the kubelet deletes once it has cleaned up.
    let before = delete.map_or(f64::INFINITY, |d| d.received);
    kubelets
        .iter()
        .filter(|r| r.name == name && r.verb == "patch" && r.subresource == "status")
        .filter(|r| r.received < before)
        .map(|r| r.completed)
        .reduce(f64::max)
        .or(delete.map(|d| d.completed))
}

pub fn is_eviction(r: &Request) -> bool {
    r.verb == "create" && r.resource == "pods" && r.subresource == "eviction" && r.code == 201
}

pub fn is_pod_delete(r: &Request) -> bool {
    r.verb == "delete" && r.resource == "pods" && r.subresource.is_empty() && r.code == 200
}

/// When each pod (by the UID the kubelet runs it under) was last seen leaving the node: no
/// ready sandbox or unexited container of it in the runtime and no mount under its volume
/// directory (what the kubelet waits for before it deletes the pod), polled from the host
/// every 50 ms while it lives.
pub struct NodeGone {
    gone: Arc<Mutex<BTreeMap<String, f64>>>,
    stop: Arc<AtomicBool>,
}

impl NodeGone {
    pub fn start(kubelet: &RealKubelet) -> NodeGone {
        let endpoint = format!("unix://{}", kubelet.dir.join("containerd.sock").display());
        let pods = kubelet.root().join("pods");
        let gone = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, s) = (gone.clone(), stop.clone());
        tokio::spawn(async move {
            let rt = nodegrace::CriClient::new(&endpoint, CriTimeouts::default()).expect("cri");
            let mut present: std::collections::BTreeSet<String> = Default::default();
            while !s.load(Ordering::Relaxed) {
                let containers = nodegrace::Runtime::list_containers(&rt, None).await;
                let sandboxes = nodegrace::Runtime::list_pod_sandboxes(&rt).await;
                let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
                let at = super::now_unix();
                if let (Ok(containers), Ok(sandboxes)) = (containers, sandboxes) {
                    let owner: BTreeMap<&str, &str> = sandboxes
                        .iter()
                        .map(|s| (s.id.as_str(), s.uid.as_str()))
                        .collect();
                    let mut now: std::collections::BTreeSet<String> = sandboxes
                        .iter()
                        .filter(|s| s.state == nodegrace::SandboxState::Ready)
                        .map(|s| s.uid.clone())
                        .collect();
                    for c in &containers {
                        if c.state != nodegrace::ContainerState::Exited {
                            if let Some(uid) = owner.get(c.sandbox_id.as_str()) {
                                now.insert((*uid).to_owned());
                            }
                        }
                    }
                    for line in table.lines() {
                        let Some(point) = line.split(' ').nth(4) else {
                            continue;
                        };
                        let Ok(rest) = Path::new(point).strip_prefix(&pods) else {
                            continue;
                        };
                        let mut parts = rest.components();
                        if let (Some(uid), Some(v), Some(_)) =
                            (parts.next(), parts.next(), parts.next())
                        {
                            if v.as_os_str() == "volumes" {
                                now.insert(uid.as_os_str().to_string_lossy().into_owned());
                            }
                        }
                    }
                    let mut gone = g.lock().expect("lock");
                    for uid in present.difference(&now) {
                        gone.insert(uid.clone(), at);
                    }
                    for uid in &now {
                        gone.remove(uid);
                    }
                    present = now;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        NodeGone { gone, stop }
    }

    /// When the pod the kubelet runs under `uid` left the node, if it did.
    pub fn gone(&self, uid: &str) -> Option<f64> {
        self.gone.lock().expect("lock").get(uid).copied()
    }
}

impl Drop for NodeGone {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
