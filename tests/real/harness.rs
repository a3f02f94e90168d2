//! A private, real containerd for the CRI tests and the fallback benchmark.
//!
//! Debian's containerd 1.6 with runc, started on a socket, root, state dir and config under a
//! temp dir; the CRI plugin on; images built here from the static busybox and imported with
//! `ctr`, so nothing is pulled. Pods use host networking (no CNI). See
//! `containerd-config.toml.in` for what these machines need (cgroup v1, cgroupfs driver).
//!
//! Everything here panics with a clear message when something is missing: a real test must
//! never pass without having run.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodegrace::{v1 as cri, CriClient, CriTimeouts, Runtime};

pub const IMAGE: &str = "nodegrace.local/busybox:1";
const CONFIG_TEMPLATE: &str = include_str!("containerd-config.toml.in");
const BUILD_IMAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/real/build-image.sh");

/// Whether the real tier runs; when it does, every prerequisite is checked loudly.
pub fn enabled() -> bool {
    if std::env::var("NODEGRACE_REAL_TESTS").as_deref() != Ok("1") {
        eprintln!("NODEGRACE_REAL_TESTS is not 1: skipping the real containerd tier");
        return false;
    }
    require();
    true
}

/// Panics unless root and every tool the private containerd needs is installed.
pub fn require() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "NODEGRACE_REAL_TESTS=1 but not root: the real containerd tests need root"
    );
    for tool in [
        "containerd",
        "containerd-shim-runc-v2",
        "runc",
        "ctr",
        "tar",
        "sha256sum",
        "mount",
    ] {
        assert!(
            which(tool).is_some(),
            "NODEGRACE_REAL_TESTS=1 but `{tool}` is not installed (apt-get install containerd runc busybox-static)"
        );
    }
    assert!(
        Path::new("/bin/busybox").exists(),
        "NODEGRACE_REAL_TESTS=1 but /bin/busybox is missing (apt-get install busybox-static)"
    );
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// overlayfs needs an upper dir on a filesystem that supports it (not every temp dir does
/// inside a VM); containerd would fail only when the first container starts.
fn overlay_works(dir: &Path) -> bool {
    let d = dir.join("overlay-probe");
    for sub in ["lower", "upper", "work", "merged"] {
        std::fs::create_dir_all(d.join(sub)).expect("creating overlay probe dirs");
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        d.join("lower").display(),
        d.join("upper").display(),
        d.join("work").display()
    );
    let ok = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(d.join("merged"))
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        let _ = Command::new("umount").arg(d.join("merged")).status();
    }
    let _ = std::fs::remove_dir_all(&d);
    ok
}

pub struct Containerd {
    tmp: Option<tempfile::TempDir>,
    pub dir: PathBuf,
    /// Bind-mounted at /out in every container: where they record SIGTERM.
    pub out: PathBuf,
    pub socket: PathBuf,
    pub endpoint: String,
    pub snapshotter: &'static str,
    child: Option<Child>,
}

impl Containerd {
    /// Builds the image, writes the config, starts containerd and imports the image.
    pub fn start() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("ngcri")
            .tempdir_in("/tmp")
            .expect("creating the containerd temp dir");
        let dir = tmp.path().to_path_buf();
        let snapshotter = if overlay_works(&dir) {
            "overlayfs"
        } else {
            "native"
        };
        let config = CONFIG_TEMPLATE
            .replace("@DIR@", &dir.display().to_string())
            .replace("@PAUSE@", IMAGE)
            .replace("@SNAPSHOTTER@", snapshotter);
        std::fs::write(dir.join("config.toml"), config).expect("writing containerd config");
        let out = dir.join("out");
        std::fs::create_dir_all(&out).expect("creating the out dir");
        // The sandbox ("pause") image and the containers' image are the same busybox; the
        // sandbox just sleeps.
        run(Command::new("sh")
            .arg(BUILD_IMAGE)
            .arg(dir.join("image.tar"))
            .arg(IMAGE)
            .args(["/bin/sleep", "2147483647"]));
        let socket = dir.join("containerd.sock");
        let mut c = Containerd {
            endpoint: format!("unix://{}", socket.display()),
            tmp: Some(tmp),
            dir,
            out,
            socket,
            snapshotter,
            child: None,
        };
        c.spawn();
        run(Command::new("ctr")
            .arg("-a")
            .arg(&c.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(c.dir.join("image.tar")));
        c
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))
            .expect("opening containerd.log");
        let child = Command::new("containerd")
            .arg("--config")
            .arg(self.dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.socket.exists() || !self.answers() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "containerd exited at start ({status}):\n{}",
                    self.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not answer on {} within 20 s:\n{}",
                self.endpoint,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Version over CRI, from a throwaway thread so it works inside or outside a runtime.
    fn answers(&self) -> bool {
        let endpoint = self.endpoint.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let Ok(c) = CriClient::new(&endpoint, CriTimeouts::default()) else {
                    return false;
                };
                c.version().await.is_ok()
            })
        })
        .join()
        .unwrap_or(false)
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("containerd is running").id()
    }

    /// SIGKILL, as a crashed runtime; its shims and containers keep running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same root and state; it finds its containers again.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn client(&self) -> CriClient {
        CriClient::new(&self.endpoint, CriTimeouts::default()).expect("CRI client")
    }

    /// Creates and starts a pod the way the kubelet would (labels included).
    pub async fn run_pod(&self, pod: &PodSpec) -> RunningPod {
        let mut rt = self.client().raw();
        let labels: std::collections::HashMap<String, String> = [
            ("io.kubernetes.pod.name", &pod.name),
            ("io.kubernetes.pod.namespace", &pod.namespace),
            ("io.kubernetes.pod.uid", &pod.uid),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
        let logs = self.dir.join("logs").join(&pod.name);
        std::fs::create_dir_all(&logs).expect("pod log dir");
        let sandbox_config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                namespace: pod.namespace.clone(),
                attempt: 0,
            }),
            hostname: String::new(),
            log_directory: logs.display().to_string(),
            labels: labels.clone(),
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sandbox_id = rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(sandbox_config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox {}: {e}\n{}", pod.name, self.log_tail()))
            .into_inner()
            .pod_sandbox_id;
        let mut containers = Vec::new();
        for (name, script) in &pod.containers {
            let config = cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: name.clone(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: IMAGE.into(),
                    ..Default::default()
                }),
                command: vec!["/bin/sh".into(), "-c".into(), script.clone()],
                mounts: vec![cri::Mount {
                    container_path: "/out".into(),
                    host_path: self.out.display().to_string(),
                    ..Default::default()
                }],
                log_path: format!("{name}.log"),
                labels: [("io.kubernetes.container.name".to_string(), name.clone())]
                    .into_iter()
                    .collect(),
                ..Default::default()
            };
            let id = rt
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: sandbox_id.clone(),
                    config: Some(config),
                    sandbox_config: Some(sandbox_config.clone()),
                })
                .await
                .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", self.log_tail()))
                .into_inner()
                .container_id;
            rt.start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e}\n{}", self.log_tail()));
            containers.push((name.clone(), id));
        }
        RunningPod {
            sandbox_id,
            containers,
        }
    }

    /// Waits until every named container wrote its start file (its trap is set).
    pub async fn wait_started(&self, names: &[String]) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        for n in names {
            while self.uptime_mark(&format!("{n}.start")).is_none() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "container {n} did not start within 60 s:\n{}",
                    self.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// `/proc/uptime` seconds a container wrote to `/out/<file>`; None if it did not.
    pub fn uptime_mark(&self, file: &str) -> Option<f64> {
        let s = std::fs::read_to_string(self.out.join(file)).ok()?;
        s.split_whitespace().next()?.parse().ok()
    }

    /// (exit code, finished at in Unix nanoseconds) of a container.
    pub async fn exit_of(&self, container_id: &str) -> (i32, i64) {
        let status = self
            .client()
            .raw()
            .container_status(cri::ContainerStatusRequest {
                container_id: container_id.into(),
                verbose: false,
            })
            .await
            .unwrap_or_else(|e| panic!("ContainerStatus {container_id}: {e}"))
            .into_inner()
            .status
            .expect("status");
        (status.exit_code, status.finished_at)
    }

    /// Stops and removes every sandbox (and so every container, shim and mount).
    pub async fn remove_all_pods(&self) {
        remove_all_pods(&self.endpoint).await
    }
}

async fn remove_all_pods(endpoint: &str) {
    let Ok(client) = CriClient::new(endpoint, CriTimeouts::default()) else {
        return;
    };
    let mut rt = client.raw();
    let Ok(list) = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
    else {
        return;
    };
    for s in list.into_inner().items {
        let _ = rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: s.id.clone(),
            })
            .await;
        let _ = rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: s.id,
            })
            .await;
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Leave no containers, shims or mounts behind, even after a failed test: bring the
        // runtime back if a test killed it, remove every pod, then stop it.
        if self.child.is_none() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.spawn()));
        }
        if self.child.is_some() {
            let endpoint = self.endpoint.clone();
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(remove_all_pods(&endpoint));
            })
            .join();
        }
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("NODEGRACE_KEEP_CONTAINERD_DIR").is_some() {
            if let Some(tmp) = self.tmp.take() {
                eprintln!("keeping {}", tmp.keep().display());
            }
        }
    }
}

pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// (container name, /bin/sh -c script)
    pub containers: Vec<(String, String)>,
}

pub struct RunningPod {
    pub sandbox_id: String,
    pub containers: Vec<(String, String)>,
}

/// What a test container does on SIGTERM.
#[derive(Debug, Clone, Copy)]
pub enum OnTerm {
    /// Records it and exits this many seconds later.
    ExitAfter(f64),
    /// Records it and keeps running: only SIGKILL ends it.
    Ignore,
}

/// A container script that writes `/out/<mark>.start` when its trap is set and
/// `/out/<mark>.term` (the host's uptime) when SIGTERM arrives.
pub fn script(mark: &str, on_term: OnTerm) -> String {
    let record = format!("cat /proc/uptime > /out/{mark}.term");
    let handler = match on_term {
        OnTerm::ExitAfter(d) if d > 0.0 => format!("{record}; sleep {d}; exit 0"),
        OnTerm::ExitAfter(_) => format!("{record}; exit 0"),
        OnTerm::Ignore => record,
    };
    format!(
        "trap '{handler}' TERM; cat /proc/uptime > /out/{mark}.start; \
         while :; do sleep 1 & wait $!; done"
    )
}

pub fn host_uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("reading /proc/uptime")
}

/// Band settings in the shape the fallback takes.
pub fn bands(spec: &[(i32, f64)]) -> Vec<nodegrace::PriorityGracePeriod> {
    spec.iter()
        .map(|&(priority, secs)| nodegrace::PriorityGracePeriod {
            priority,
            shutdown_grace_period: Duration::from_secs_f64(secs),
        })
        .collect()
}

/// A cached pod entry, as the online daemon would have written it.
pub fn cached(ns: &str, name: &str, uid: &str, priority: i32, grace: i64) -> nodegrace::PodInfo {
    nodegrace::PodInfo {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
        priority,
        pod_type: nodegrace::PodType::Default,
        termination_grace_period_seconds: grace,
        labels: BTreeMap::new(),
        terminating: false,
        terminal: false,
        static_hash: None,
    }
}
