//! The real-control-plane tier: a real kube-apiserver, kube-controller-manager and
//! kube-scheduler (v1.28.4, `../shared/realk8s/`), the packaged CRDs, ClusterRole and
//! admission policy applied as docs/install.md says, the 1.37 `lifecycle.k8s.io` API as CRDs
//! with a stand-in of its controllers ([`lifecycle`]), identities minted from the cluster CA, the
//! apiserver's audit log read back, and a kubelet stand-in ([`kubelet`]) playing the node.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` (as root). The control plane is started on first use
//! (idempotent, under a lock) and left running for the next test binary; `scripts/test-all`
//! stops it when the run ends. Tests share it and keep apart by node name and namespace.
#![allow(dead_code)]

pub mod audit;
pub mod faults;
pub mod fixture;
pub mod kubelet;
pub mod lifecycle;
pub mod node;
pub mod real_kubelet;
pub mod responders_proxy;
pub mod stand_in_logind;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

pub const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// `lifecycle.k8s.io/v1alpha1` EvictionRequest and Eviction as CRDs (tests only).
pub const LIFECYCLE_CRDS: &str = "tests/data/lifecycle.k8s.io";

/// The group of the CRDs nodegrace shipped before it was a requester only.
const OLD_LIFECYCLE_GROUP: &str = "lifecycle.nodegrace.dev";

/// True when the real tiers run; otherwise says on stderr that `tier` was skipped.
pub fn enabled(tier: &str) -> bool {
    if std::env::var("NODEGRACE_REAL_TESTS").as_deref() == Ok("1") {
        assert!(
            nix::unistd::geteuid().is_root(),
            "NODEGRACE_REAL_TESTS=1 needs root (the control plane's state, nspawn nodes)"
        );
        return true;
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {tier} (real control plane tier; set NODEGRACE_REAL_TESTS=1 and run as root, or use scripts/test-all)"
    );
    false
}

/// The shared control plane of this test run.
pub struct ControlPlane {
    /// `../shared/realk8s` (or `$NODEGRACE_REALK8S`).
    pub scripts: PathBuf,
    /// `$REALK8S_RUN` (default `/tmp/realk8s`): certificates, kubeconfigs, logs.
    pub run: PathBuf,
    /// The unpacked binaries (kubectl v1.28.4 among them).
    pub bin: PathBuf,
    /// Kubeconfigs minted for this process.
    minted: tempfile::TempDir,
    /// When [`stop_apiserver`](Self::stop_apiserver) killed the apiserver, Unix seconds.
    apiserver_killed: std::sync::Mutex<Vec<f64>>,
}

/// The control plane, started on first use with every cluster-side manifest applied.
pub fn control_plane() -> &'static ControlPlane {
    CP.get_or_init(|| {
        let scripts = std::env::var_os("NODEGRACE_REALK8S")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(MANIFEST_DIR).join("../shared/realk8s"));
        assert!(
            scripts.join("up.sh").exists(),
            "no real control plane at {} (set NODEGRACE_REALK8S)",
            scripts.display()
        );
        let run = PathBuf::from(
            std::env::var("REALK8S_RUN").unwrap_or_else(|_| "/tmp/realk8s".to_string()),
        );
        let cache = std::env::var("REALK8S_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|_| {
                let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
                Path::new(&home).join(".cache/nodegrace-realk8s/v1.28.4")
            });
        let cp = ControlPlane {
            scripts,
            run,
            bin: cache.join("bin"),
            minted: tempfile::Builder::new()
                .prefix("nodegrace-realk8s-ids-")
                .tempdir()
                .expect("tempdir for kubeconfigs"),
            apiserver_killed: Default::default(),
        };
        // A static is never dropped: the minted credentials go when the process exits.
        // SAFETY: `remove_minted` is a plain function that never unwinds.
        unsafe { libc::atexit(remove_minted) };
        cp.up();
        cp.apply_cluster_side();
        cp
    })
}

static CP: OnceLock<ControlPlane> = OnceLock::new();

extern "C" fn remove_minted() {
    if let Some(cp) = CP.get() {
        let _ = std::fs::remove_dir_all(cp.minted.path());
    }
}

fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn check(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl ControlPlane {
    /// Starts whatever is not running (up.sh is idempotent); one caller at a time.
    pub fn up(&self) {
        let lock = std::fs::File::create("/tmp/nodegrace-realk8s.lock").expect("lock file");
        nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map(|guard| {
                check(Command::new("bash").arg(self.scripts.join("up.sh")));
                drop(guard);
            })
            .unwrap_or_else(|(_, e)| panic!("locking /tmp/nodegrace-realk8s.lock: {e}"));
    }

    /// Starts again whatever is not running. An outage test stops the apiserver; the
    /// controller-manager and the scheduler then lose their leader lease and exit.
    pub fn ensure_running(&self) {
        let alive = |name: &str| {
            std::fs::read_to_string(self.run.join(format!("{name}.pid")))
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok())
                .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
        };
        if ![
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ]
        .iter()
        .all(|n| alive(n))
        {
            self.up();
        }
    }

    /// After an outage (apiserver or etcd stopped): up.sh, the controller-manager and the
    /// scheduler started anew, and waits until both have taken their leader leases. Left as
    /// they were, either may exit seconds after the apiserver is back (its lease lost
    /// meanwhile) with nothing to start it again, or go on with stale informers: the next
    /// test's node then never loses its not-ready taint.
    pub fn heal(&self) {
        self.up();
        // Their informers may stay stale for a minute after the apiserver restarted (every
        // node update then conflicts: a new node keeps its not-ready taint): fresh ones.
        for name in ["kube-controller-manager", "kube-scheduler"] {
            self.kill(name);
        }
        self.up();
        let since = chrono::Utc::now();
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let renewed = |lease: &str| {
            let out = self.kubectl(&[
                "-n",
                "kube-system",
                "get",
                "lease",
                lease,
                "-o",
                "jsonpath={.spec.renewTime}",
            ]);
            chrono::DateTime::parse_from_rfc3339(String::from_utf8_lossy(&out.stdout).trim())
                .is_ok_and(|t| t > since)
        };
        loop {
            self.ensure_running();
            if renewed("kube-controller-manager") && renewed("kube-scheduler") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the controller-manager or the scheduler did not renew its lease within 90 s of the outage"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.run.join("admin.kubeconfig")
    }

    pub fn audit_log(&self) -> PathBuf {
        self.run.join("logs/audit.log")
    }

    /// `kubectl` v1.28.4 as the cluster admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        output(
            Command::new(self.bin.join("kubectl"))
                .arg("--kubeconfig")
                .arg(self.admin_kubeconfig())
                .args(args),
        )
    }

    /// Like [`kubectl`](Self::kubectl), panicking with its output on failure.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {} failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply --server-side` of a manifest given as text.
    pub fn apply_text(&self, yaml: &str) {
        let file = tempfile::NamedTempFile::new().expect("temp manifest");
        std::fs::write(file.path(), yaml).expect("write manifest");
        self.kubectl_ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &file.path().display().to_string(),
        ]);
    }

    /// What an operator applies once per cluster (docs/install.md "Cluster side"): the CRDs, the
    /// ClusterRole and binding, and the admission policy in the form this Kubernetes serves;
    /// and what a 1.37 cluster serves itself, `lifecycle.k8s.io` ([`LIFECYCLE_CRDS`]).
    pub fn apply_cluster_side(&self) {
        let repo = Path::new(MANIFEST_DIR);
        // nodegrace's own lifecycle.nodegrace.dev CRDs, from before it was a requester only,
        // are not applied and are gone from a cluster that had them: an upgraded cluster has
        // none, and a daemon must find nothing of them.
        let mut crds: Vec<PathBuf> = std::fs::read_dir(repo.join("packaging/crds"))
            .expect("packaging/crds")
            .map(|e| e.expect("packaging/crds entry").path())
            .filter(|p| {
                p.extension().is_some_and(|e| e == "yaml")
                    && !p.to_string_lossy().contains(OLD_LIFECYCLE_GROUP)
            })
            .collect();
        crds.sort();
        for crd in &crds {
            self.kubectl_ok(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                &crd.display().to_string(),
            ]);
        }
        self.kubectl_ok(&[
            "delete",
            "crd",
            &format!("evictionrequests.{OLD_LIFECYCLE_GROUP}"),
            &format!("evictions.{OLD_LIFECYCLE_GROUP}"),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ]);
        for dir in ["packaging/rbac", "packaging/admission/v1beta1"] {
            self.kubectl_ok(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                &repo.join(dir).display().to_string(),
            ]);
        }
        // The in-tree EvictionRequest API of 1.37 as the tests' own CRDs: v1.28 does not
        // serve it, and nodegrace is its requester, never its server.
        self.kubectl_ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &repo.join(LIFECYCLE_CRDS).display().to_string(),
        ]);
        for crd in [
            "nodemaintenances.nodegrace.dev",
            "evictionrequests.lifecycle.k8s.io",
            "evictions.lifecycle.k8s.io",
        ] {
            self.kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{crd}"),
            ]);
        }
    }

    /// A kubeconfig for `user` in `groups` (comma-separated), signed by the cluster CA.
    pub fn mint(&self, user: &str, groups: &str) -> PathBuf {
        let path = self
            .minted
            .path()
            .join(format!("{}.kubeconfig", user.replace(':', "_")));
        if !path.exists() {
            // One at a time, across test threads and binaries: openssl's -CAcreateserial
            // rewrites the CA's serial file, and two at once fail.
            let lock =
                std::fs::File::create("/tmp/nodegrace-realk8s-mint.lock").expect("lock file");
            let guard = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
                .unwrap_or_else(|(_, e)| panic!("locking /tmp/nodegrace-realk8s-mint.lock: {e}"));
            check(
                Command::new("bash")
                    .arg(self.scripts.join("mint-kubeconfig.sh"))
                    .args([user, groups])
                    .arg(&path),
            );
            drop(guard);
        }
        path
    }

    /// The kubeconfig of nodegrace's identity on `node` (docs/install.md "Cluster side").
    pub fn nodegrace_identity(&self, node: &str) -> PathBuf {
        self.mint(&format!("nodegrace:node:{node}"), "nodegrace:nodes")
    }

    /// The kubelet's identity on `node` (NodeRestriction applies to it).
    pub fn kubelet_identity(&self, node: &str) -> PathBuf {
        self.mint(&format!("system:node:{node}"), "system:nodes")
    }

    pub async fn admin(&self) -> Client {
        client_from(&self.admin_kubeconfig()).await
    }

    /// A kubeconfig of the admin's acting as `user`, who may do nothing until
    /// [`Viewer::bind`] binds the packaged ClusterRole `nodegrace-viewer` to it.
    pub fn viewer(&self, user: &str) -> Viewer<'_> {
        let admin = std::fs::read_to_string(self.admin_kubeconfig()).expect("admin kubeconfig");
        let mut config: serde_yaml::Value = serde_yaml::from_str(&admin).expect("admin kubeconfig");
        for u in config["users"].as_sequence_mut().expect("users") {
            u["user"]["as"] = user.into();
        }
        let kubeconfig = std::env::temp_dir().join(format!("{user}.kubeconfig"));
        std::fs::write(&kubeconfig, serde_yaml::to_string(&config).unwrap()).unwrap();
        Viewer {
            cp: self,
            user: user.to_owned(),
            kubeconfig,
        }
    }

    /// The apiserver throttles `node`'s requests from now on (see [`throttling`]).
    pub fn throttle(&self, node: &str) {
        self.apply_text(&throttling(node));
    }

    /// Ends [`throttle`](Self::throttle).
    pub fn unthrottle(&self, node: &str) {
        let name = format!("{node}-throttled");
        self.kubectl(&["delete", "flowschema", &name, "--ignore-not-found"]);
        self.kubectl(&[
            "delete",
            "prioritylevelconfiguration",
            &name,
            "--ignore-not-found",
        ]);
    }

    /// Stops the apiserver process only (etcd and the controllers keep running).
    pub fn stop_apiserver(&self) {
        let at = now_unix();
        self.kill("kube-apiserver");
        self.apiserver_killed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(at);
        closed("kube-apiserver", 6443);
    }

    /// Whether the apiserver was killed within a second before or two after `t`. Its audit
    /// record of a request is written after the answer: a kill just after an answer can lose
    /// the record of a request that was carried out (seen on CI: 2 of 3 evictions whose pods
    /// the kubelet saw deleted 0.1 s before the kill).
    pub fn apiserver_killed_around(&self, t: f64) -> bool {
        self.apiserver_killed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|&k| (-1.0..=2.0).contains(&(k - t)))
    }

    /// Stops etcd only: the apiserver keeps running and answers errors or late.
    pub fn stop_etcd(&self) {
        self.kill("etcd");
        closed("etcd", 2379);
    }

    /// SIGKILL to the control-plane process `name` (its `<name>.pid`); returns once it is gone.
    fn kill(&self, name: &str) {
        let pid_file = self.run.join(format!("{name}.pid"));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
            .trim()
            .parse()
            .expect("pid");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        for _ in 0..200 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("{name} (pid {pid}) did not stop");
    }
}

/// An operator's identity for `nodegrace history` ([`ControlPlane::viewer`]).
pub struct Viewer<'a> {
    cp: &'a ControlPlane,
    pub user: String,
    pub kubeconfig: PathBuf,
}

impl Viewer<'_> {
    /// Binds the packaged `nodegrace-viewer` to the user, and nothing else.
    pub fn bind(&self) {
        let role = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/rbac/viewer.yaml");
        self.cp.kubectl_ok(&["apply", "-f", role]);
        self.cp.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            &format!("{}-binding", self.user),
            "--clusterrole=nodegrace-viewer",
            &format!("--user={}", self.user),
        ]);
    }

    /// `nodegrace history ARGS --kubeconfig <the viewer's>` at 100 columns: whether it
    /// succeeded, its stdout and stderr.
    pub fn history(&self, args: &[&str]) -> (bool, String, String) {
        let out = std::process::Command::new(crate::real::nodegrace_binary())
            .arg("history")
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("COLUMNS", "100")
            .env_remove("KUBECONFIG")
            .output()
            .expect("nodegrace history");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }
}

impl Drop for Viewer<'_> {
    fn drop(&mut self) {
        let binding = format!("{}-binding", self.user);
        self.cp.kubectl(&[
            "delete",
            "clusterrolebinding",
            &binding,
            "--ignore-not-found",
        ]);
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// Fails unless nothing answers on 127.0.0.1:`port` any more once `name`'s process was
/// killed: a fault that did not happen must not pass for one that did. (A second `up.sh`
/// run at the same time, outside the lock, leaves the pid file naming a process that could
/// not bind while the first one keeps serving.)
fn closed(name: &str, port: u16) {
    for _ in 0..40 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{name} was killed by its pid file, yet 127.0.0.1:{port} still answers: a process the pid file does not name serves it");
}

/// The control plane, started again if an outage test stopped part of it, from async code.
pub async fn running_control_plane() -> &'static ControlPlane {
    tokio::task::spawn_blocking(|| {
        let cp = control_plane();
        cp.ensure_running();
        cp
    })
    .await
    .expect("control plane")
}

/// Server-side dry runs: admission runs, nothing is stored.
pub mod dry {
    use kube::api::{DeleteParams, PatchParams, PostParams};

    pub fn patch() -> PatchParams {
        PatchParams {
            dry_run: true,
            ..PatchParams::default()
        }
    }

    pub fn post() -> PostParams {
        PostParams {
            dry_run: true,
            ..PostParams::default()
        }
    }

    pub fn delete() -> DeleteParams {
        DeleteParams {
            dry_run: true,
            ..DeleteParams::default()
        }
    }
}

pub async fn client_from(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// A name unique to this test run, usable as a node or namespace name.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{:x}{n}", std::process::id())
}

pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// For the benchmarks: `name`'s value from the environment, else `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a valid value")),
        Err(_) => default,
    }
}

/// For the benchmarks: the repository's commit, abbreviated (empty when git cannot say).
pub fn commit() -> String {
    Command::new("git")
        .args(["-C", MANIFEST_DIR, "log", "-1", "--format=%h"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// For the benchmarks: the host's 1-minute load average (other work on the machine shows
/// here).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

/// API Priority and Fairness for this node's two identities: a priority level of one
/// concurrency share (about 3 seats of the apiserver's 600) that rejects what does not fit
/// (429), for everything nodegrace's identity asks and for the evictions of the kubelet's
/// (the kubelet stand-in, under the same identity, keeps its own requests unthrottled).
fn throttling(node: &str) -> String {
    format!(
        r#"apiVersion: flowcontrol.apiserver.k8s.io/v1beta3
kind: PriorityLevelConfiguration
metadata: {{name: {node}-throttled}}
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 1
    lendablePercent: 0
    borrowingLimitPercent: 0
    limitResponse: {{type: Reject}}
---
apiVersion: flowcontrol.apiserver.k8s.io/v1beta3
kind: FlowSchema
metadata: {{name: {node}-throttled}}
spec:
  priorityLevelConfiguration: {{name: {node}-throttled}}
  matchingPrecedence: 50
  distinguisherMethod: {{type: ByUser}}
  rules:
  - subjects: [{{kind: User, user: {{name: "nodegrace:node:{node}"}}}}]
    resourceRules:
    - {{verbs: ["*"], apiGroups: ["*"], resources: ["*"], namespaces: ["*"], clusterScope: true}}
    nonResourceRules:
    - {{verbs: ["*"], nonResourceURLs: ["*"]}}
  - subjects: [{{kind: User, user: {{name: "system:node:{node}"}}}}]
    resourceRules:
    - {{verbs: ["create"], apiGroups: [""], resources: ["pods/eviction"], namespaces: ["*"]}}
"#
    )
}
