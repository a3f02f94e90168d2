//! The built binary against a configuration whose every path is under a temporary
//! directory, with a kubeconfig pointing at `server`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub struct CliEnv {
    pub dir: tempfile::TempDir,
}

impl CliEnv {
    /// `config.toml`: state, manifest, gate and logind drop-in paths under the directory,
    /// node `node-a`, `max_delay`, then `extra` (TOML sections other than `[node]`,
    /// `[shutdown]` and `[static_pods]`). The directories exist.
    pub fn new(server: &str, max_delay: &str, extra: &str) -> CliEnv {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().display().to_string();
        nodegrace_testkit::write_kubeconfig(&dir.path().join("kubeconfig"), server).unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            format!(
                r#"state_dir = "{root}/state"
[node]
name = "node-a"
kubeconfig = "{root}/kubeconfig"
[shutdown]
max_delay = "{max_delay}"
logind_dropin_dir = "{root}/logind.conf.d"
[static_pods]
manifest_dir = "{root}/manifests"
gate_dir = "{root}/gate"
{extra}"#
            ),
        )
        .unwrap();
        for d in ["state", "manifests", "gate", "logind.conf.d"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        CliEnv { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `nodegrace --config <config.toml> <args>`, the daemon status file under the
    /// directory, `$KUBECONFIG` unset.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// The command [`CliEnv::run`] runs, to add to.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nodegrace"));
        c.arg("--config")
            .arg(self.path("config.toml"))
            .args(args)
            .env("NODEGRACE_STATUS_FILE", self.path("status.json"))
            .env_remove("KUBECONFIG");
        c
    }
}

/// A local port nothing listens on.
pub fn refused_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The command's output, and the CPU time it took (user and system: what the machine's
/// load does not change much, unlike the wall time), of that child alone (the tests of this
/// file run their commands at once).
#[allow(clippy::zombie_processes)] // reaped by wait4, which also gives its rusage
pub fn cpu_timed(env: &CliEnv, args: &[&str]) -> (String, std::time::Duration) {
    use nix::libc;
    let out = env.path(&format!("out-{}", args[0]));
    let file = std::fs::File::create(&out).unwrap();
    let start = std::time::Instant::now();
    let child = env
        .command(args)
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: wait4 only writes the status and the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut u) }, pid);
    let wall = start.elapsed();
    let t = |tv: libc::timeval| {
        std::time::Duration::from_secs(tv.tv_sec as u64)
            + std::time::Duration::from_micros(tv.tv_usec as u64)
    };
    let took = t(u.ru_utime) + t(u.ru_stime);
    println!("  {args:?}: {took:?} CPU, {wall:?} wall");
    (std::fs::read_to_string(&out).unwrap(), took)
}
