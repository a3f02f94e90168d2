//! Support for the real-systemd test tiers: a cached minimal Debian root booted with
//! `systemd-nspawn`, commands run inside through `nsenter`, and the container's journal read
//! from outside. Only active with `NODEGRACE_REAL_TESTS=1` (as root); see README.md.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// True when the real tiers should run. Otherwise says on stderr (past the test harness's
/// output capture, so plain `cargo test` shows it) that `tier` was skipped.
pub fn enabled(tier: &str) -> bool {
    if std::env::var("NODEGRACE_REAL_TESTS").as_deref() == Ok("1") {
        return true;
    }
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {tier} (real-systemd tier; set NODEGRACE_REAL_TESTS=1 and run as root, or use scripts/test-all)"
    );
    false
}

/// Panics with a clear message when something the real tiers need is missing.
pub fn require_prerequisites() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "NODEGRACE_REAL_TESTS=1 needs root (systemd-nspawn, nsenter)"
    );
    for tool in [
        "systemd-nspawn",
        "nsenter",
        "journalctl",
        "debootstrap",
        "flock",
    ] {
        assert!(
            which(tool).is_some(),
            "NODEGRACE_REAL_TESTS=1 needs `{tool}`; install it (scripts/test-all does: apt-get install systemd-container debootstrap util-linux systemd)"
        );
    }
}

pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(tool))
        .find(|candidate| {
            candidate
                .metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// The Debian releases a node boots: 12 (systemd 252) and 13 (systemd 257, whose logind
/// sends `PrepareForShutdownWithMetadata` and can soft-reboot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Debian {
    #[default]
    Bookworm,
    Trixie,
}

impl Debian {
    pub const ALL: [Debian; 2] = [Debian::Bookworm, Debian::Trixie];

    /// The suite's name, as `tests/real/ensure-root.sh` takes it.
    pub fn suite(self) -> &'static str {
        match self {
            Debian::Bookworm => "bookworm",
            Debian::Trixie => "trixie",
        }
    }

    /// The systemd major version the release ships.
    pub fn systemd(self) -> u32 {
        match self {
            Debian::Bookworm => 252,
            Debian::Trixie => 257,
        }
    }
}

/// The cached Debian 12 root (built by `tests/real/ensure-root.sh` on first use).
pub fn debian_root() -> PathBuf {
    debian_root_of(Debian::Bookworm)
}

/// The cached root of `debian` (built by `tests/real/ensure-root.sh` on first use).
pub fn debian_root_of(debian: Debian) -> PathBuf {
    static ROOTS: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
    ROOTS[debian as usize]
        .get_or_init(|| {
            let script = Path::new(MANIFEST_DIR).join("tests/real/ensure-root.sh");
            let out = Command::new("bash")
                .arg(&script)
                .arg(debian.suite())
                .stderr(Stdio::inherit())
                .output()
                .expect("run tests/real/ensure-root.sh");
            assert!(
                out.status.success(),
                "building the Debian {} root failed ({})",
                debian.suite(),
                out.status
            );
            let root = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            assert!(
                root.join("usr/lib/systemd/systemd").exists(),
                "{root:?} has no systemd"
            );
            root
        })
        .clone()
}

/// A node's own root: an overlay of a cached root, mounted on the host for as long as this
/// lives. What the node writes, and what a test puts in it, stays in it across boots and
/// through a soft reboot (which drops every bind mount nspawn made), as on a real host; the
/// host reads it at [`OwnRoot::at`].
pub struct OwnRoot {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    pub debian: Debian,
}

impl OwnRoot {
    pub fn new(name: &str, debian: Debian) -> OwnRoot {
        let lower = debian_root_of(debian);
        let dir = tempfile::Builder::new()
            .prefix(&format!("nodegrace-root-{name}-"))
            .tempdir()
            .expect("own root dir");
        for sub in ["upper", "work", "root"] {
            fs::create_dir_all(dir.path().join(sub)).expect("overlay dirs");
        }
        let root = dir.path().join("root");
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            dir.path().join("upper").display(),
            dir.path().join("work").display()
        );
        let out = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &options])
            .arg(&root)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting the node's root over {lower:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let own = OwnRoot {
            dir: Some(dir),
            root,
            debian,
        };
        // The journal persists in the node's root (journald keeps it only where this exists).
        fs::create_dir_all(own.at("/var/log/journal")).expect("journal dir in the node's root");
        own
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Where the node's `container_path` is on the host.
    pub fn at(&self, container_path: &str) -> PathBuf {
        self.root.join(container_path.trim_start_matches('/'))
    }

    /// Writes a file into the node's root (its directories made as needed).
    pub fn write(&self, container_path: &str, contents: impl AsRef<[u8]>) {
        let path = self.at(container_path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("directory in the node's root");
        }
        fs::write(&path, contents).unwrap_or_else(|e| panic!("write {path:?}: {e}"));
    }

    /// Copies a host file into the node's root, mode included.
    pub fn copy(&self, container_path: &str, host: &Path) {
        let path = self.at(container_path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("directory in the node's root");
        }
        fs::copy(host, &path).unwrap_or_else(|e| panic!("copy {host:?} to {path:?}: {e}"));
    }
}

impl Drop for OwnRoot {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.root)
            .status()
            .is_ok_and(|s| s.success())
            || Command::new("umount")
                .arg("-l")
                .arg(&self.root)
                .status()
                .is_ok_and(|s| s.success());
        let Some(dir) = self.dir.take() else { return };
        if !unmounted || std::thread::panicking() {
            // Never remove files through a mounted overlay; keep a failed run's evidence.
            let kept = dir.keep();
            let _ = writeln!(
                std::io::stderr(),
                "node root kept in {} (upper/ holds what the node wrote)",
                kept.display()
            );
        }
    }
}

pub fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// Polls `check` every 50 ms until it returns Some or `timeout` passes.
pub fn wait_until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What to put into a container besides the cached root.
#[derive(Default)]
pub struct Spec {
    /// Read-only files: container path -> host path.
    pub bind_files: BTreeMap<String, PathBuf>,
    /// Files written for this test and bound read-only: container path -> contents.
    pub files: BTreeMap<String, String>,
    /// Units started at boot (`systemd.wants=` on the kernel command line).
    pub wants: Vec<String>,
    /// Writable directories: container path -> host path (they outlive the container).
    pub rw_dirs: BTreeMap<String, PathBuf>,
    /// Share the host's network (to reach a control plane on the host's loopback).
    pub host_network: bool,
    /// The release booted from its cached root (with a volatile overlay: nothing the
    /// container writes outside its binds is kept).
    pub debian: Debian,
    /// Boot this root instead (an [`OwnRoot`]'s), keeping what the container writes; the
    /// files and bound files go into it rather than being bound, so a soft reboot keeps them,
    /// and the journal is kept in it.
    pub root: Option<PathBuf>,
}

impl Spec {
    pub fn file(&mut self, container_path: &str, contents: impl Into<String>) -> &mut Self {
        self.files.insert(container_path.into(), contents.into());
        self
    }
    pub fn bind(&mut self, container_path: &str, host: impl Into<PathBuf>) -> &mut Self {
        self.bind_files.insert(container_path.into(), host.into());
        self
    }
    pub fn want(&mut self, unit: &str) -> &mut Self {
        self.wants.push(unit.into());
        self
    }
    pub fn bind_rw(&mut self, container_path: &str, host: impl Into<PathBuf>) -> &mut Self {
        self.rw_dirs.insert(container_path.into(), host.into());
        self
    }
}

/// A booted container. Dropping it kills `systemd-nspawn` (and with it the container), so
/// every test tears down even when an assertion fails.
pub struct Container {
    pub name: String,
    nspawn: Child,
    exit: Option<ExitStatus>,
    pub pid1: i32,
    /// Host directory bound at `/results`; `journal/` inside it is the container's journal.
    pub results: tempfile::TempDir,
    /// This container's own cgroups (one per hierarchy nspawn uses), removed on drop.
    cgroups: Vec<PathBuf>,
    /// Where its persistent journal is on the host.
    journal_dir: PathBuf,
}

/// A fresh cgroup, named after the results dir, in each hierarchy systemd-nspawn places its
/// container in: the v1 `name=systemd` one and the v2 one (hybrid hosts have both).
fn own_cgroups(results: &Path) -> Vec<PathBuf> {
    let name = results
        .file_name()
        .expect("results dir has a name")
        .to_string_lossy()
        .into_owned();
    let unified = Path::new("/sys/fs/cgroup/unified");
    let v1_systemd = Path::new("/sys/fs/cgroup/systemd");
    let roots: Vec<&Path> = if unified.join("cgroup.procs").exists() {
        [unified, v1_systemd]
            .into_iter()
            .filter(|r| r.join("cgroup.procs").exists())
            .collect()
    } else {
        vec![Path::new("/sys/fs/cgroup")]
    };
    roots
        .into_iter()
        .map(|root| {
            let dir = root.join("nodegrace-tests").join(&name);
            fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("create the container's cgroup {dir:?}: {e}"));
            dir
        })
        .collect()
}

/// Removes a cgroup and what nspawn and the container's systemd left below it (empty by now).
fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup(&entry.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// A oneshot marker unit: its `ExecStop` records (in `/results/NAME-stop`) when systemd began
/// stopping units.
pub fn marker_unit(name: &str) -> String {
    format!(
        "[Unit]\nDescription=nodegrace test marker {name}\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n\
         ExecStart=/bin/true\nExecStop=/bin/sh -c 'date +%%s.%%N > /results/{name}-stop'\n"
    )
}

/// A stand-in for the kubelet: runs until stopped and records (in `/results/NAME-stop`) when
/// its stop began.
pub fn long_running_unit(name: &str) -> String {
    format!(
        "[Unit]\nDescription=nodegrace test stand-in {name}\n\n[Service]\nExecStart=/bin/sleep infinity\n\
         ExecStop=/bin/sh -c 'date +%%s.%%N > /results/{name}-stop'\n"
    )
}

impl Container {
    pub fn boot(name: &str, spec: &Spec) -> Container {
        let results = tempfile::Builder::new()
            .prefix(&format!("nodegrace-real-{name}-"))
            .tempdir()
            .expect("results dir");
        // The container's root and journald write here; readable afterwards from the host.
        fs::set_permissions(results.path(), fs::Permissions::from_mode(0o777)).ok();
        let files_dir = results.path().join("files");
        fs::create_dir_all(&files_dir).expect("files dir");

        let mut args: Vec<String> = vec![
            "--quiet".into(),
            "--register=no".into(),
            "--keep-unit".into(),
            format!("--machine=ng-{name}"),
            format!("--bind={}:/results", results.path().display()),
        ];
        let journal_dir = match &spec.root {
            Some(root) => {
                args.push(format!("--directory={}", root.display()));
                for (target, contents) in &spec.files {
                    let path = root.join(target.trim_start_matches('/'));
                    fs::create_dir_all(path.parent().expect("a file's directory"))
                        .expect("directory in the node's root");
                    fs::write(&path, contents).expect("write test file into the root");
                }
                for (target, host) in &spec.bind_files {
                    let path = root.join(target.trim_start_matches('/'));
                    fs::create_dir_all(path.parent().expect("a file's directory"))
                        .expect("directory in the node's root");
                    fs::copy(host, &path)
                        .unwrap_or_else(|e| panic!("copy {host:?} to {path:?}: {e}"));
                }
                root.join("var/log/journal")
            }
            None => {
                let journal = results.path().join("journal");
                fs::create_dir_all(&journal).expect("journal dir");
                args.extend([
                    "--volatile=overlay".into(),
                    format!("--directory={}", debian_root_of(spec.debian).display()),
                    format!("--bind={}:/var/log/journal", journal.display()),
                ]);
                for (i, (target, contents)) in spec.files.iter().enumerate() {
                    let host = files_dir.join(format!("{i}"));
                    fs::write(&host, contents).expect("write test file");
                    args.push(format!("--bind-ro={}:{target}", host.display()));
                }
                journal
            }
        };
        if !spec.host_network {
            args.push("--private-network".into());
        }
        for (target, host) in &spec.rw_dirs {
            args.push(format!("--bind={}:{target}", host.display()));
        }
        for (target, host) in spec.bind_files.iter().filter(|_| spec.root.is_none()) {
            assert!(
                host.exists(),
                "{host:?} (to bind at {target}) does not exist"
            );
            args.push(format!("--bind-ro={}:{target}", host.display()));
        }
        args.push("--boot".into());
        for unit in &spec.wants {
            args.push(format!("systemd.wants={unit}"));
        }

        let console = fs::File::create(results.path().join("console.log")).expect("console log");
        // nspawn (with --keep-unit) puts the container's systemd in the cgroup it was started
        // in. Containers booted side by side from one cgroup share /payload/system.slice/...
        // and one's poweroff removes the other's unit cgroups (its ExecStop then fails with
        // "Failed to attach to cgroup"), so each is started from a cgroup of its own.
        let cgroups = own_cgroups(results.path());
        let mut join = String::new();
        for dir in &cgroups {
            join.push_str(&format!("echo $$ > '{}/cgroup.procs' && ", dir.display()));
        }
        let nspawn = Command::new("sh")
            .arg("-c")
            .arg(format!("{join}exec systemd-nspawn \"$@\""))
            .arg("sh")
            .args(&args)
            .env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1")
            .stdin(Stdio::null())
            .stdout(console.try_clone().expect("dup console log"))
            .stderr(console)
            .spawn()
            .expect("spawn systemd-nspawn");
        let mut container = Container {
            name: name.into(),
            pid1: 0,
            exit: None,
            nspawn,
            results,
            cgroups,
            journal_dir,
        };
        let nspawn_pid = container.nspawn.id() as i32;
        container.pid1 = wait_until("the container's PID 1", Duration::from_secs(30), || {
            if let Some(status) = container.nspawn.try_wait().expect("poll nspawn") {
                panic!(
                    "systemd-nspawn exited early ({status}):\n{}",
                    container.console()
                );
            }
            find_container_init(nspawn_pid)
        });
        container
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.results.path().join(rel)
    }

    pub fn console(&self) -> String {
        fs::read_to_string(self.path("console.log")).unwrap_or_default()
    }

    /// Runs a command inside the container (all of PID 1's namespaces and root).
    pub fn exec(&self, argv: &[&str]) -> Output {
        let pid = self.pid1.to_string();
        Command::new("timeout")
            .args([
                "60", "nsenter", "-t", &pid, "-m", "-u", "-i", "-n", "-p", "-C", "-r", "-w",
            ])
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter")
    }

    /// Like [`exec`](Self::exec) but panics (with the output) when the command fails.
    pub fn run(&self, argv: &[&str]) -> String {
        let out = self.exec(argv);
        assert!(
            out.status.success(),
            "`{}` failed in container {} ({}):\n{}{}",
            argv.join(" "),
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The major version of the container's systemd (`systemctl --version`).
    pub fn systemd_version(&self) -> u32 {
        let out = self.run(&["systemctl", "--version"]);
        out.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no version in `systemctl --version`: {out}"))
    }

    pub fn is_active(&self, unit: &str) -> String {
        String::from_utf8_lossy(&self.exec(&["systemctl", "is-active", unit]).stdout)
            .trim()
            .to_string()
    }

    /// Waits until `unit` is active (panics early if it failed).
    pub fn wait_active(&self, unit: &str, timeout: Duration) {
        wait_until(&format!("{unit} to become active"), timeout, || match self
            .is_active(unit)
            .as_str()
        {
            "active" => Some(()),
            "failed" => panic!(
                "{unit} failed in container {}:\n{}",
                self.name,
                self.journal_text()
            ),
            _ => None,
        })
    }

    /// Waits until systemd-nspawn exits (the container powered off); None on timeout.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.exit.is_some() {
            return self.exit;
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.nspawn.try_wait().expect("poll nspawn") {
                self.exit = Some(status);
                return self.exit;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// The value of a results file written by a marker, as Unix seconds.
    pub fn stop_time(&self, marker: &str) -> Option<f64> {
        let text = fs::read_to_string(self.path(&format!("{marker}-stop"))).ok()?;
        text.trim().parse().ok()
    }

    /// The container's journal (persistent, bound from the results dir), in order.
    pub fn journal(&self) -> Vec<JournalLine> {
        let out = Command::new("journalctl")
            .arg("-D")
            .arg(&self.journal_dir)
            .args(["--no-pager", "-o", "json", "-q"])
            .output()
            .expect("run journalctl -D");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(JournalLine::parse)
            .collect()
    }

    pub fn journal_text(&self) -> String {
        self.journal()
            .iter()
            .map(|l| {
                let extra: Vec<String> = l
                    .fields
                    .iter()
                    .filter(|(k, _)| is_tracing_field(k))
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect();
                format!(
                    "{:.6} {}[{}]: {} {}",
                    l.time,
                    l.ident,
                    l.pid,
                    l.text,
                    extra.join(" ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Journal lines of one syslog identifier (e.g. "nodegrace", "systemd").
    pub fn journal_of(&self, ident: &str) -> Vec<JournalLine> {
        self.journal()
            .into_iter()
            .filter(|l| l.ident == ident)
            .collect()
    }
}

impl Container {
    /// The host PID of the container's process whose command line starts with `argv0`
    /// (a process in the container's PID namespace, seen from the host's /proc).
    pub fn host_pid_of(&self, argv0: &str) -> Option<i32> {
        let ns = fs::read_link(format!("/proc/{}/ns/pid", self.pid1)).ok()?;
        fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let first = cmdline.split(|b| *b == 0).next()?;
            (first == argv0.as_bytes() && fs::read_link(format!("/proc/{pid}/ns/pid")).ok()? == ns)
                .then_some(pid)
        })
    }
}

/// How many established TCP connections `pid` holds: its sockets, looked up in the TCP
/// tables of its network namespace.
pub fn tcp_connections(pid: i32) -> usize {
    let sockets: std::collections::HashSet<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    ["tcp", "tcp6"]
        .iter()
        .flat_map(|table| {
            let text = fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
            text.lines().skip(1).map(str::to_owned).collect::<Vec<_>>()
        })
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // State 01 is ESTABLISHED; the tenth field is the socket's inode.
            fields.get(3) == Some(&"01") && fields.get(9).is_some_and(|i| sockets.contains(*i))
        })
        .count()
}

/// CPU time and memory of a process, from the host's /proc.
#[derive(Debug, Clone, Copy)]
pub struct ProcUsage {
    /// User + system time, in seconds.
    pub cpu_seconds: f64,
    /// VmRSS, in KiB.
    pub rss_kib: u64,
    /// VmHWM (peak resident set size), in KiB.
    pub peak_rss_kib: u64,
    /// RssAnon (heap and stacks) and RssFile (mapped files: mostly the binary's own code),
    /// in KiB.
    pub rss_anon_kib: u64,
    pub rss_file_kib: u64,
}

/// None once the process is gone.
pub fn proc_usage(pid: i32) -> Option<ProcUsage> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) in parentheses; utime and
    // stime are fields 14 and 15 of proc(5), in USER_HZ ticks, which Linux fixes at 100.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some(ProcUsage {
        cpu_seconds: ticks as f64 / 100.0,
        rss_kib: kib("VmRSS:")?,
        peak_rss_kib: kib("VmHWM:")?,
        rss_anon_kib: kib("RssAnon:")?,
        rss_file_kib: kib("RssFile:")?,
    })
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.exit.is_none() {
            // Killing PID 1 ends the whole PID namespace; nspawn then exits and unmounts.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid1),
                nix::sys::signal::Signal::SIGKILL,
            );
            if self.wait_exit(Duration::from_secs(10)).is_none() {
                let _ = self.nspawn.kill();
                let _ = self.nspawn.wait();
            }
        }
        for dir in &self.cgroups {
            remove_cgroup(dir);
        }
        if std::thread::panicking() || std::env::var_os("NODEGRACE_KEEP_RESULTS").is_some() {
            // Keep the evidence of a failed run.
            let placeholder = tempfile::tempdir().expect("placeholder tempdir");
            let kept = std::mem::replace(&mut self.results, placeholder).keep();
            let _ = writeln!(
                std::io::stderr(),
                "container {}: console log, results and journal kept in {}",
                self.name,
                kept.display()
            );
        }
    }
}

#[derive(Debug, Clone)]
pub struct JournalLine {
    /// Unix seconds.
    pub time: f64,
    /// SYSLOG_IDENTIFIER, e.g. "systemd", "systemd-logind", "nodegrace".
    pub ident: String,
    pub pid: String,
    pub text: String,
    /// Every field of the entry (tracing fields appear as `NAME`, unprefixed).
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl JournalLine {
    fn parse(line: &str) -> Option<JournalLine> {
        let serde_json::Value::Object(fields) = serde_json::from_str(line).ok()? else {
            return None;
        };
        let text_of = |key: &str| {
            fields
                .get(key)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let time = text_of("__REALTIME_TIMESTAMP").parse::<f64>().ok()? / 1e6;
        Some(JournalLine {
            time,
            ident: text_of("SYSLOG_IDENTIFIER"),
            pid: text_of("_PID"),
            text: text_of("MESSAGE"),
            fields,
        })
    }

    /// Whether the message contains `needle` (case-insensitive).
    pub fn contains(&self, needle: &str) -> bool {
        self.text
            .to_ascii_lowercase()
            .contains(&needle.to_ascii_lowercase())
    }

    /// A structured field as text (`"KIND"`, `"PRIORITY"`, ...).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).and_then(|v| v.as_str())
    }
}

/// First journal line (in order) containing `needle` (case-insensitive), with its time.
pub fn first_with<'a>(lines: &'a [JournalLine], needle: &str) -> Option<&'a JournalLine> {
    lines.iter().find(|l| l.contains(needle))
}

pub fn last_with<'a>(lines: &'a [JournalLine], needle: &str) -> Option<&'a JournalLine> {
    lines.iter().rev().find(|l| l.contains(needle))
}

/// The container's init: the child of systemd-nspawn that is PID 1 in its own namespace.
fn find_container_init(nspawn_pid: i32) -> Option<i32> {
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
        };
        let ppid: Option<i32> = field("PPid:").and_then(|v| v.first()?.parse().ok());
        let nspid = field("NSpid:").unwrap_or_default();
        if nspid.len() >= 2 && nspid.last() == Some(&"1") {
            // The container's init is the child (or grandchild) of our nspawn process.
            let parent = ppid?;
            if parent == nspawn_pid || parent_of(parent) == Some(nspawn_pid) {
                return Some(pid);
            }
        }
    }
    None
}

fn parent_of(pid: i32) -> Option<i32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

/// The nodegrace binary under test: `NODEGRACE_TEST_BINARY`, else the one cargo built for
/// this test run, else (examples, which cargo gives no binary) `target/release/nodegrace`
/// or `target/debug/nodegrace` under `$CARGO_TARGET_DIR` or the repository.
pub fn nodegrace_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NODEGRACE_TEST_BINARY") {
        return PathBuf::from(path);
    }
    if let Some(path) = option_env!("CARGO_BIN_EXE_nodegrace") {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_file("target"));
    ["release", "debug"]
        .iter()
        .map(|profile| target.join(profile).join("nodegrace"))
        .find(|path| path.exists())
        .unwrap_or_else(|| {
            panic!(
                "no nodegrace binary under {}: run `cargo build --release --bin nodegrace` or set NODEGRACE_TEST_BINARY",
                target.display()
            )
        })
}

pub fn repo_file(rel: &str) -> PathBuf {
    Path::new(MANIFEST_DIR).join(rel)
}

/// A field nodegrace's tracing added (they are unprefixed), not one journald or systemd set.
fn is_tracing_field(name: &str) -> bool {
    const JOURNAL_FIELDS: &[&str] = &[
        "MESSAGE",
        "MESSAGE_ID",
        "PRIORITY",
        "SYSLOG_IDENTIFIER",
        "SYSLOG_FACILITY",
        "SYSLOG_PID",
        "SYSLOG_TIMESTAMP",
        "SYSLOG_RAW",
        "CODE_FILE",
        "CODE_LINE",
        "CODE_FUNC",
        "TARGET",
        "INVOCATION_ID",
        "UNIT",
        "USER_UNIT",
        "TID",
        "ERRNO",
        "DOCUMENTATION",
    ];
    !name.starts_with('_') && !JOURNAL_FIELDS.contains(&name)
}
