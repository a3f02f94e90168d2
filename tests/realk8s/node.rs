//! A Kubernetes node for the real control plane: a booted Debian (systemd-nspawn, the host's
//! network so it reaches the apiserver on 127.0.0.1) whose host name is the node name,
//! running nodegrace as the package installs it — the repository's unit, the shipped
//! `config/nodegrace.toml` unchanged, and nodegrace's own identity and the kubelet's at the
//! kubeconfig paths that configuration names — beside a `kubelet.service` stand-in unit (the kubelet's API
//! side is played from the host by [`super::kubelet::Kubelet`]).
//!
//! The manifest and state directories live on the host, so they outlive a boot: booting
//! the same node again is a reboot. A node made with [`TestNode::on`] (Debian 12 or 13)
//! carries all of it in its own root instead, which also lives through a soft reboot.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::real::{self, Container, Spec};

/// The shipped configuration, as the package installs it.
pub fn shipped_config() -> String {
    std::fs::read_to_string(Path::new(super::MANIFEST_DIR).join("config/nodegrace.toml"))
        .expect("config/nodegrace.toml")
}

/// A value of the shipped configuration (`section`.`key`, a string).
pub fn shipped_value(section: &str, key: &str) -> String {
    let config: toml::Value = toml::from_str(&shipped_config()).expect("shipped config parses");
    let table = if section.is_empty() {
        &config
    } else {
        &config[section]
    };
    table[key]
        .as_str()
        .unwrap_or_else(|| panic!("{section}.{key} is not a string"))
        .to_owned()
}

/// A `kubelet.service` for the node with the files and directories it uses.
#[derive(Clone, Default)]
pub struct KubeletUnit {
    pub unit: String,
    /// (container path, contents), bound read-only.
    pub files: Vec<(String, String)>,
    /// (container path, host directory), bound writable.
    pub rw_dirs: Vec<(String, PathBuf)>,
}

pub struct TestNode {
    pub name: String,
    /// Host side of the node's `static_pods.manifest_dir`.
    pub manifests: PathBuf,
    /// Host side of the node's `state_dir`.
    pub state: PathBuf,
    dirs: tempfile::TempDir,
    kubeconfig: PathBuf,
    /// The kubelet's identity, at `node.kubelet_kubeconfig`: nodegrace evicts with it.
    kubelet_kubeconfig: PathBuf,
    /// Host directory holding a CRI runtime's `containerd.sock`, mounted where the shipped
    /// `fallback.cri_endpoint` looks for it; none by default (no runtime on the node).
    pub cri_dir: Option<PathBuf>,
    /// Host directory of the kubelet's root (`--root-dir`), bound at the shipped
    /// `drain.kubelet_root_dir`; its pods' volume mounts reach the node as they are made when
    /// it is a shared mount on the host (a real node has one mount table for both).
    pub kubelet_root: Option<PathBuf>,
    /// Drop-ins in `/etc/nodegrace/config.d/` (file name, contents); none by default.
    pub config_dropins: Vec<(String, String)>,
    /// The node's `kubelet.service` and what it needs (container path, host path of a
    /// writable directory; files); a stand-in that only records its stop by default.
    pub kubelet_unit: Option<KubeletUnit>,
    /// The node's system bus replaced by a stand-in's (see [`SystemBus`]); none by default.
    pub system_bus: Option<SystemBus>,
    /// The kubelet's configuration file, at the shipped `fallback.kubelet_config`; none by
    /// default.
    pub kubelet_config: Option<PathBuf>,
    pub container: Option<Container>,
    /// The node's own root ([`TestNode::on`]); dropped after the container.
    own_root: Option<real::OwnRoot>,
}

/// A stand-in system bus for nodegrace in the node (`super::stand_in_logind`): its socket's
/// host directory, bound in and named in the unit's `DBUS_SYSTEM_BUS_ADDRESS`, and the
/// stand-in's logind.conf.d, bound at the shipped `shutdown.logind_dropin_dir`.
#[derive(Clone)]
pub struct SystemBus {
    pub socket_dir: PathBuf,
    pub dropin_dir: PathBuf,
}

/// Where a [`SystemBus`]'s socket directory is in the node.
const BUS_IN_NODE: &str = "/run/stand-in-bus";

impl TestNode {
    /// A node named `name` with nodegrace's identity `kubeconfig` and the kubelet's
    /// `kubelet_kubeconfig`; not booted yet.
    pub fn new(name: &str, kubeconfig: PathBuf, kubelet_kubeconfig: PathBuf) -> TestNode {
        let dirs = tempfile::Builder::new()
            .prefix(&format!("nodegrace-node-{name}-"))
            .tempdir()
            .expect("node dirs");
        let manifests = dirs.path().join("manifests");
        let state = dirs.path().join("state");
        std::fs::create_dir_all(&manifests).expect("manifest dir");
        std::fs::create_dir_all(&state).expect("state dir");
        TestNode {
            name: name.to_owned(),
            manifests,
            state,
            dirs,
            kubeconfig,
            kubelet_kubeconfig,
            cri_dir: None,
            kubelet_root: None,
            config_dropins: Vec::new(),
            kubelet_unit: None,
            system_bus: None,
            kubelet_config: None,
            container: None,
            own_root: None,
        }
    }

    /// nodegrace's identity from `kubeconfig` instead (before the node boots).
    pub fn use_kubeconfig(&mut self, kubeconfig: PathBuf) {
        self.kubeconfig = kubeconfig;
    }

    /// A node of `debian` that carries everything in its own root, as a host does: binary,
    /// unit, configuration, identities, host name, manifests and state are files in it (not
    /// bind mounts), so they outlive its boots and a soft reboot. `manifests` and `state` are
    /// their host paths in that root.
    pub fn on(
        debian: real::Debian,
        name: &str,
        kubeconfig: PathBuf,
        kubelet_kubeconfig: PathBuf,
    ) -> TestNode {
        let mut node = TestNode::new(name, kubeconfig, kubelet_kubeconfig);
        let root = real::OwnRoot::new(name, debian);
        node.manifests = root.at(&shipped_value("static_pods", "manifest_dir"));
        node.state = root.at(&shipped_value("", "state_dir"));
        std::fs::create_dir_all(&node.manifests).expect("manifest dir in the node's root");
        std::fs::create_dir_all(&node.state).expect("state dir in the node's root");
        node.own_root = Some(root);
        node
    }

    /// The release the node boots.
    pub fn debian(&self) -> real::Debian {
        self.own_root
            .as_ref()
            .map_or(real::Debian::Bookworm, |r| r.debian)
    }

    /// The node's own root, when it has one ([`TestNode::on`]).
    pub fn own_root(&self) -> Option<&real::OwnRoot> {
        self.own_root.as_ref()
    }

    fn spec(&self) -> Spec {
        let mut spec = Spec {
            host_network: true,
            root: self.own_root.as_ref().map(|r| r.path().to_path_buf()),
            ..Spec::default()
        };
        spec.bind("/usr/bin/nodegrace", real::nodegrace_binary())
            .bind(
                "/etc/systemd/system/nodegrace.service",
                real::repo_file("systemd/nodegrace.service"),
            )
            .bind(
                "/etc/nodegrace/config.toml",
                real::repo_file("config/nodegrace.toml"),
            )
            .bind(&shipped_value("node", "kubeconfig"), &self.kubeconfig)
            .bind(
                &shipped_value("node", "kubelet_kubeconfig"),
                &self.kubelet_kubeconfig,
            )
            .file("/etc/hostname", format!("{}\n", self.name))
            .file(
                "/etc/systemd/system/marker.service",
                real::marker_unit("marker"),
            )
            .file(
                "/etc/systemd/system/kubelet.service",
                self.kubelet_unit
                    .as_ref()
                    .map(|u| u.unit.clone())
                    .unwrap_or_else(|| real::long_running_unit("kubelet")),
            )
            .want("kubelet.service")
            .want("nodegrace.service")
            .want("marker.service");
        if self.own_root.is_none() {
            spec.bind_rw(
                &shipped_value("static_pods", "manifest_dir"),
                &self.manifests,
            )
            .bind_rw(&shipped_value("", "state_dir"), &self.state);
        }
        if let Some(dir) = &self.cri_dir {
            let endpoint = shipped_value("fallback", "cri_endpoint");
            let socket = Path::new(endpoint.trim_start_matches("unix://"));
            let parent = socket.parent().expect("the CRI socket's directory");
            assert_eq!(
                socket.file_name(),
                Some(std::ffi::OsStr::new("containerd.sock")),
                "the shipped cri_endpoint is not a containerd.sock"
            );
            spec.bind_rw(&parent.display().to_string(), dir);
        }
        if let Some(root) = &self.kubelet_root {
            spec.bind_rw(&shipped_value("drain", "kubelet_root_dir"), root);
        }
        if let Some(unit) = &self.kubelet_unit {
            for (path, text) in &unit.files {
                spec.file(path, text.clone());
            }
            for (path, host) in &unit.rw_dirs {
                spec.bind_rw(path, host);
            }
        }
        if let Some(bus) = &self.system_bus {
            spec.bind_rw(BUS_IN_NODE, &bus.socket_dir)
                .bind_rw(
                    &shipped_value("shutdown", "logind_dropin_dir"),
                    &bus.dropin_dir,
                )
                .file(
                    "/etc/systemd/system/nodegrace.service.d/stand-in-bus.conf",
                    format!(
                        "[Service]\nEnvironment=DBUS_SYSTEM_BUS_ADDRESS=unix:path={BUS_IN_NODE}/{}\n",
                        super::stand_in_logind::SOCKET
                    ),
                );
        }
        if let Some(config) = &self.kubelet_config {
            spec.bind(&shipped_value("fallback", "kubelet_config"), config);
        }
        for (name, text) in &self.config_dropins {
            spec.file(&format!("/etc/nodegrace/config.d/{name}"), text.clone());
        }
        spec
    }

    /// Boots the node (again, after a poweroff: a new boot with the same directories) and
    /// waits until nodegrace holds its inhibitor (on the node's logind; with a
    /// [`SystemBus`], the caller asks the stand-in).
    pub fn boot(&mut self) -> &Container {
        assert!(self.container.is_none(), "node {} is running", self.name);
        let container = Container::boot(&self.name, &self.spec());
        assert_eq!(
            container.systemd_version(),
            self.debian().systemd(),
            "node {} runs another systemd than Debian {}'s",
            self.name,
            self.debian().suite()
        );
        container.wait_active("nodegrace.service", Duration::from_secs(60));
        if self.system_bus.is_none() {
            wait_inhibitor(&container);
        }
        self.container = Some(container);
        self.container.as_ref().expect("booted")
    }

    /// The running boot's id (`/proc/sys/kernel/random/boot_id`, as the kubelet reports it).
    pub fn boot_id(&self) -> String {
        self.container()
            .run(&["cat", "/proc/sys/kernel/random/boot_id"])
            .trim()
            .to_owned()
    }

    /// [`boot`](Self::boot), then waits until the daemon is connected to the apiserver (its
    /// after-boot reconcile done), as a node's long-running daemon is when it shuts down: one
    /// signalled sooner begins its drain late.
    pub fn boot_connected(&mut self) -> &Container {
        self.boot();
        let c = self.container();
        real::wait_until(
            "nodegrace connected to the apiserver",
            Duration::from_secs(60),
            || {
                c.journal_of("nodegrace")
                    .iter()
                    .any(|l| l.contains("after-boot reconcile done"))
                    .then_some(())
            },
        );
        c
    }

    /// Runs `how` inside (`systemctl soft-reboot`, systemd 254+) and waits until userspace
    /// restarted in the same container (PID 1 and the kernel stay) and the new userspace's
    /// nodegrace holds its inhibitor. Returns how long that took.
    pub fn soft_reboot(&mut self, how: &[&str], timeout: Duration) -> Duration {
        let before = self.nodegrace_pid();
        let c = self.container();
        let start = std::time::Instant::now();
        let _ = c.exec(how);
        real::wait_until("nodegrace of the new userspace", timeout, || {
            assert!(
                Path::new(&format!("/proc/{}", c.pid1)).exists(),
                "node {} went down instead of soft-rebooting:\n{}",
                self.name,
                c.journal_text()
            );
            c.host_pid_of("/usr/bin/nodegrace")
                .filter(|pid| *pid != before)
        });
        c.wait_active("nodegrace.service", Duration::from_secs(60));
        wait_inhibitor(c);
        start.elapsed()
    }

    pub fn container(&self) -> &Container {
        self.container.as_ref().expect("node is running")
    }

    /// The running daemon's PID on the host.
    pub fn nodegrace_pid(&self) -> i32 {
        self.container()
            .host_pid_of("/usr/bin/nodegrace")
            .expect("nodegrace runs in the node")
    }

    /// `systemctl poweroff` (or `reboot`) inside, then waits until the container is gone.
    /// Returns the container (for its journal and results).
    pub fn shutdown(&mut self, verb: &str, timeout: Duration) -> Container {
        let mut c = self.container.take().expect("node is running");
        let _ = c.exec(&["systemctl", verb]);
        let status = c.wait_exit(timeout).unwrap_or_else(|| {
            panic!(
                "node {} did not {verb} within {timeout:?}:\n{}",
                self.name,
                c.journal_text()
            )
        });
        // 133: the container asked to be rebooted.
        assert!(
            status.success() || status.code() == Some(133),
            "systemd-nspawn exited with {status}"
        );
        c
    }

    pub fn dirs(&self) -> &Path {
        self.dirs.path()
    }
}

/// Waits until nodegrace holds its delay inhibitor on the node's logind.
fn wait_inhibitor(container: &Container) {
    real::wait_until(
        "nodegrace's delay inhibitor",
        Duration::from_secs(30),
        || {
            let list = container.run(&["systemd-inhibit", "--list", "--no-pager", "--no-legend"]);
            list.lines()
                .any(|l| l.contains("nodegrace") && l.contains("delay"))
                .then_some(())
        },
    );
}
