//! `nodegrace status` through the built binary, with the daemon's files prepared by the test
//! (status file via `$NODEGRACE_STATUS_FILE`, `state_dir` and the static pod dirs via the
//! config) and an apiserver address that refuses connections.

use std::process::Command;
use std::time::{Duration, Instant};

use nodegrace::{
    BudgetReport, DelayDropin, Phase, ShutdownKind, ShutdownPhase, ShutdownState, ShutdownStatus,
    Status,
};
use serde_json::Value;

mod cli_support;
use cli_support::{refused_port, CliEnv};

struct Env(CliEnv);

impl std::ops::Deref for Env {
    type Target = CliEnv;
    fn deref(&self) -> &CliEnv {
        &self.0
    }
}

const ETCD_MANIFEST: &str = "apiVersion: v1
kind: Pod
metadata:
  name: etcd
  namespace: kube-system
spec:
  priority: 2000001000
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.5.21-0
";

impl Env {
    fn new() -> Env {
        Env(CliEnv::new(
            &format!("https://127.0.0.1:{}", refused_port()),
            "10m",
            "",
        ))
    }

    fn json(&self) -> Value {
        self.json_exiting(0)
    }

    /// `status -o json`, asserting its exit code.
    fn json_exiting(&self, code: i32) -> Value {
        let out = self.run(&["status", "-o", "json"]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `status` (the table), asserting its exit code.
    fn table_exiting(&self, code: i32) -> String {
        let out = self.run(&["status"]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// What a daemon that drained for a reboot and released leaves behind.
    fn prepare_released_reboot(&self, pid: u32) {
        let started = chrono::Utc::now() - chrono::Duration::seconds(40);
        let mut status = Status::new();
        status.pid = pid;
        status.bus_connected = true;
        status.inhibitor_held = true;
        status.enter(Phase::Armed, "inhibitor taken");
        status.enter(Phase::Draining, "PrepareForShutdown(true): reboot");
        status.enter(Phase::Released, "node drained");
        status.budget = Some(BudgetReport {
            configured: Duration::from_secs(600),
            logind_initial: Duration::from_secs(5),
            logind_effective: Duration::from_secs(600),
            budget: Duration::from_secs(600),
            dropin_written: Some(self.path("logind.conf.d/zz-nodegrace.conf")),
            reload_requested: true,
            delay_dropins: vec![DelayDropin {
                path: self.path("logind.conf.d/10-vendor.conf"),
                value: "30s".into(),
                overrides_ours: false,
            }],
            error: None,
        });
        status.shutdown = Some(ShutdownStatus {
            kind: ShutdownKind::Reboot,
            started_at: started,
            deadline: started + chrono::Duration::seconds(600),
            resumed: false,
            way: None,
        });
        status.write(&self.path("status.json"));
        ShutdownState {
            phase: ShutdownPhase::Released,
            kind: ShutdownKind::Reboot,
            started_at: started,
            budget_seconds: 600.0,
            boot_id: "boot-1".into(),
            started_since_boot_seconds: None,
            updated_at: chrono::Utc::now(),
            outcome: Some(nodegrace::ShutdownOutcome::Drained),
            duration_counted: false,
        }
        .store(&self.path("state"))
        .unwrap();
        std::fs::write(self.path("gate/etcd.yaml"), ETCD_MANIFEST).unwrap();
    }
}

#[test]
fn status_json_shows_local_state_and_an_unreachable_apiserver() {
    let env = Env::new();
    env.prepare_released_reboot(std::process::id());
    let stopped = |name: &str, outcome| nodegrace::PodReport::new("work", name, outcome);
    nodegrace::OfflineDrain {
        boot_id: "b-0".into(),
        kind: ShutdownKind::Poweroff,
        reports: vec![nodegrace::FallbackReport {
            pods: vec![
                stopped("web", nodegrace::PodOutcome::Stopped),
                stopped("db", nodegrace::PodOutcome::TimedOut),
            ],
            ..Default::default()
        }],
    }
    .store(&env.path("state"))
    .unwrap();
    let began = Instant::now();
    let r = env.json();
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "the probe is bounded"
    );

    assert_eq!(r["node"], "node-a");
    let d = &r["daemon"];
    assert_eq!(d["state"], "running");
    assert_eq!(d["phase"], "released");
    assert_eq!(d["inhibitorHeld"], true);
    assert_eq!(d["pid"], std::process::id());

    let b = &r["budget"];
    assert_eq!(b["source"], "daemon");
    assert_eq!(b["budgetSeconds"], 600.0);
    assert_eq!(b["logindInitialSeconds"], 5.0);
    assert_eq!(b["logindEffectiveSeconds"], 600.0);
    assert!(
        b["setBy"].as_str().unwrap().contains("zz-nodegrace.conf"),
        "{b}"
    );
    assert_eq!(b["otherDropins"][0]["value"], "30s");

    assert_eq!(r["apiserver"]["reachable"], false);
    assert!(r["apiserver"]["error"]
        .as_str()
        .unwrap()
        .contains("apiserver probe"));
    assert_eq!(r["maintenances"]["known"], false);

    let gated = r["staticPods"]["gated"].as_array().unwrap();
    assert_eq!(gated.len(), 1);
    assert_eq!(gated[0]["podName"], "etcd");
    assert_eq!(gated[0]["fileName"], "etcd.yaml");
    assert_eq!(r["staticPods"]["error"], Value::Null);

    let l = &r["lastShutdown"];
    assert_eq!(l["persisted"]["phase"], "released");
    assert_eq!(l["persisted"]["kind"], "reboot");
    assert_eq!(l["current"]["kind"], "reboot");
    let phases: Vec<&str> = l["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["starting", "armed", "draining", "released"]);
    assert_eq!(l["offlineDrain"]["bootId"], "b-0");
    assert_eq!(l["offlineDrain"]["podsStopped"], 1);
    assert_eq!(l["offlineDrain"]["podsNotStopped"], 1);

    let table = env.table_exiting(0);
    for expected in [
        "Protected: yes",
        "running (pid",
        "released: shutdown may proceed",
        "UNREACHABLE: apiserver probe",
        "Maintenances   unknown: apiserver unreachable",
        "1 gated in",
        "kube-system/etcd (etcd.yaml)",
        "reboot started",
        "released (budget 10m",
        "Offline drain  poweroff of boot b-0: 1 pod(s) stopped, 1 not",
        "Timeline",
        // Drawn from the daemon's phases alone: the apiserver, and so the Events, is out
        // of reach.
        "Last shutdown:\nnode-a: shutdown at ",
        ", released: node drained\n",
    ] {
        assert!(table.contains(expected), "{expected:?} missing:\n{table}");
    }
}

#[test]
fn a_dead_daemon_is_reported_as_such_and_holds_nothing() {
    let env = Env::new();
    // A pid that cannot be alive: beyond the kernel's pid_max ceiling.
    env.prepare_released_reboot(4_194_305);
    let r = env.json_exiting(3);
    assert_eq!(r["daemon"]["state"], "stale");
    assert_eq!(r["daemon"]["inhibitorHeld"], false);
    assert_eq!(r["lastShutdown"]["persisted"]["phase"], "released");
}

#[test]
fn without_daemon_files_status_still_prints_and_says_not_running() {
    let env = Env::new();
    let r = env.json_exiting(3);
    assert_eq!(r["daemon"]["state"], "not-running");
    assert_eq!(r["daemon"]["inhibitorHeld"], Value::Null);
    assert_eq!(r["budget"]["source"], "config");
    assert_eq!(r["budget"]["configuredSeconds"], 600.0);
    assert_eq!(r["budget"]["budgetSeconds"], Value::Null);
    assert_eq!(r["apiserver"]["reachable"], false);
    assert_eq!(r["lastShutdown"]["persisted"], Value::Null);
    assert_eq!(r["staticPods"]["gated"].as_array().unwrap().len(), 0);

    let table = env.table_exiting(3);
    assert!(table.contains("not-running"), "{table}");
    assert!(
        table.contains("Protected: NO, the daemon is not running: no status file"),
        "{table}"
    );
    assert!(table.contains("Last shutdown  none recorded"), "{table}");
    assert!(!table.contains("Offline drain"), "{table}");
}

#[test]
fn corrupt_local_files_are_reported_per_section() {
    let env = Env::new();
    std::fs::write(env.path("status.json"), b"{ not json").unwrap();
    std::fs::write(env.path("state/state.json"), b"[").unwrap();
    // The gate is still readable, so something was determined; the daemon is not known
    // to run.
    let r = env.json_exiting(3);
    assert_eq!(r["daemon"]["state"], "unreadable");
    assert!(r["daemon"]["error"]
        .as_str()
        .unwrap()
        .contains("parsing status"));
    assert!(r["lastShutdown"]["persistedError"]
        .as_str()
        .unwrap()
        .contains("parsing shutdown state"));
    assert_eq!(r["staticPods"]["error"], Value::Null);
}

#[test]
fn nothing_determinable_exits_one() {
    let env = Env::new();
    std::fs::write(env.path("status.json"), b"{ not json").unwrap();
    std::fs::write(env.path("state/state.json"), b"[").unwrap();
    // A gate path that is a file, not a directory: unreadable.
    std::fs::remove_dir(env.path("gate")).unwrap();
    std::fs::write(env.path("gate"), b"").unwrap();
    let out = env.run(&["status", "-o", "json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["staticPods"]["error"].is_string(), "{r}");
}

#[test]
fn help_documents_the_exit_codes_and_overrides() {
    let out = Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .args(["status", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for code in [
        "0  protected",
        "3  the daemon is not running",
        "4  the daemon holds no shutdown delay inhibitor",
        "5  the budget is below the reserves",
        "with -o json too",
    ] {
        assert!(help.contains(code), "{code:?} missing:\n{help}");
    }
    assert!(help.contains("NODEGRACE_STATUS_FILE"), "{help}");
    let out = Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .args(["plan", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(
        help.contains("--pods <FILE>") && help.contains("--budget <DURATION>"),
        "{help}"
    );
    assert!(help.contains("Exit codes: 0 plan printed"), "{help}");
}

/// A running daemon (this test process stands in for it) with and without its inhibitor,
/// and with a budget below the reserves its pods need: each gap has its own exit code, in
/// the table and in JSON alike, and the JSON report keeps its shape.
#[test]
fn exit_codes_say_whether_the_node_is_protected() {
    let env = Env::new();
    let write = |held: bool, budget_secs: u64| {
        let mut status = Status::new();
        status.bus_connected = true;
        status.inhibitor_held = held;
        status.enter(Phase::Armed, "inhibitor taken");
        status.budget = Some(BudgetReport {
            configured: Duration::from_secs(600),
            logind_initial: Duration::from_secs(600),
            logind_effective: Duration::from_secs(budget_secs),
            budget: Duration::from_secs(budget_secs),
            dropin_written: None,
            reload_requested: false,
            delay_dropins: Vec::new(),
            error: None,
        });
        status.write(&env.path("status.json"));
    };
    let pod = |name: &str, priority: i64, pod_type: &str| {
        serde_json::json!({"namespace": "work", "name": name, "uid": format!("uid-{name}"),
            "priority": priority, "podType": pod_type, "terminationGracePeriodSeconds": 30})
    };
    // A critical pod and a DaemonSet pod: their reserves (30 s each by default) are needed.
    let cache = serde_json::json!({"node": "node-a", "writtenAt": null, "pods": [
        pod("web", 0, "Default"),
        pod("dns", 2_000_000_000, "Default"),
        pod("cni", 0, "DaemonSet"),
    ]});
    std::fs::write(env.path("state/pods.json"), cache.to_string()).unwrap();

    write(true, 600);
    let baseline = env.json_exiting(0);
    assert!(env.table_exiting(0).contains("Protected: yes"));

    write(false, 600);
    let r = env.json_exiting(4);
    assert_eq!(r["daemon"]["inhibitorHeld"], false);
    let table = env.table_exiting(4);
    assert!(
        table.contains("Protected: NO, the daemon holds no shutdown delay inhibitor"),
        "{table}"
    );

    write(true, 59);
    let r = env.json_exiting(5);
    assert_eq!(r["budget"]["budgetSeconds"], 59.0);
    let table = env.table_exiting(5);
    assert!(
        table.contains("the shutdown budget 59s is below the 1m the drain plan reserves"),
        "{table}"
    );
    write(true, 60);
    env.json_exiting(0);

    let keys = |v: &Value| {
        v.as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<String>>()
    };
    assert_eq!(keys(&r), keys(&baseline), "the JSON report keeps its shape");
}

/// Nothing `status` reads can hang it or make it read without end: a FIFO as the daemon's
/// status file, /dev/zero behind the pod cache's name, a directory as state.json.
#[test]
fn a_fifo_or_a_device_in_place_of_a_file_is_reported_at_once() {
    let env = Env::new();
    nix::unistd::mkfifo(
        &env.path("status.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::os::unix::fs::symlink("/dev/zero", env.path("state/pods.json")).unwrap();
    std::fs::create_dir(env.path("state/state.json")).unwrap();
    let began = Instant::now();
    let r = env.json_exiting(3);
    assert!(began.elapsed() < Duration::from_secs(10));
    assert_eq!(r["daemon"]["state"], "unreadable");
    let error = |v: &Value| v.as_str().unwrap_or_default().to_string();
    assert!(
        error(&r["daemon"]["error"]).contains("a FIFO, not a regular file"),
        "{}",
        r["daemon"]
    );
    assert!(
        error(&r["podCache"]["error"]).contains("a symlink, not a regular file"),
        "{}",
        r["podCache"]
    );
    assert!(
        error(&r["lastShutdown"]["persistedError"]).contains("a directory, not a regular file"),
        "{}",
        r["lastShutdown"]
    );
    // `status` only reports: nothing is renamed.
    assert!(env.path("state/state.json").is_dir());
}

#[test]
fn warnings_the_daemon_would_log_reach_stderr() {
    let env = Env::new();
    std::fs::write(env.path("gate/broken.yaml"), b"kind: Deployment\n").unwrap();
    let out = env.run(&["status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("WARN")
            && stderr.contains("not a static pod manifest the kubelet can run")
            && stderr.contains("broken.yaml"),
        "{stderr}"
    );
    // RUST_LOG still decides.
    let quiet = std::process::Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .arg("--config")
        .arg(env.path("config.toml"))
        .arg("status")
        .env("NODEGRACE_STATUS_FILE", env.path("status.json"))
        .env("RUST_LOG", "off")
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&quiet.stderr).contains("does not parse"),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
}

#[test]
fn strings_from_outside_reach_the_terminal_escaped() {
    let env = Env::new();
    // logind's delay-lock holders are chosen by any local user; file names by whoever
    // wrote them.
    let forged = "kubelet\u{1b}[2J\u{1b}]0;owned\u{7}\nProtected       yes\u{202e}";
    let mut status = Status::new();
    status.pid = std::process::id();
    status.bus_connected = true;
    status.inhibitor_held = true;
    status.kubelet_inhibitor = Some(forged.into());
    status.enter(Phase::Armed, "inhibitor taken");
    status.budget = Some(BudgetReport {
        configured: Duration::from_secs(600),
        logind_initial: Duration::from_secs(600),
        logind_effective: Duration::from_secs(600),
        budget: Duration::from_secs(600),
        dropin_written: None,
        reload_requested: false,
        delay_dropins: vec![DelayDropin {
            path: env.path("logind.conf.d/10-\u{1b}[31mred\n.conf"),
            value: "30s".into(),
            overrides_ours: false,
        }],
        error: None,
    });
    status.write(&env.path("status.json"));
    std::fs::write(env.path("gate/\u{1b}[1mbold\u{7f}.yaml"), ETCD_MANIFEST).unwrap();
    std::fs::write(
        env.path("gate/x\nProtected: yes\u{1b}[8m.yaml"),
        b"kind: Nope\n",
    )
    .unwrap();

    let out = env.run(&["status"]);
    let table = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    for text in [&table, &stderr] {
        assert!(
            !text
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{text:?}"
        );
    }
    // The warning about the unparseable file is one log line.
    assert!(
        stderr.contains("x\\u000aProtected: yes\\u001b[8m.yaml"),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .all(|l| l.trim_start().starts_with("WARN") || l.trim_start().starts_with("ERROR")),
        "{stderr}"
    );
    assert!(
        !table.lines().any(|l| l.starts_with("Protected       yes")),
        "no line is forged: {table}"
    );
    assert!(
        table.contains("kubelet\\u001b[2J\\u001b]0;owned\\u0007\\u000aProtected       yes\\u202e"),
        "{table}"
    );
    assert!(table.contains("10-\\u001b[31mred\\u000a.conf"), "{table}");
    assert!(table.contains("\\u001b[1mbold\\u007f.yaml"), "{table}");

    // The JSON report stays valid and keeps the values as they are.
    let out = env.run(&["status", "-o", "json"]);
    let json = String::from_utf8(out.stdout).unwrap();
    assert!(!json
        .chars()
        .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'));
    let r: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(r["daemon"]["kubeletInhibitor"], forged, "{json}");
}

#[test]
fn files_in_the_gate_that_are_not_manifests_and_set_aside_records_are_shown() {
    let env = Env::new();
    std::fs::write(env.path("gate/broken.yaml"), b"kind: Deployment\n").unwrap();
    std::fs::write(env.path("manifests/half.yaml"), b"metadata: [").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", env.path("gate/link.yaml")).unwrap();
    let r = env.json_exiting(3);
    assert_eq!(r["staticPods"]["gated"], serde_json::json!([]));
    // A file the kubelet refuses is gated and restored like a manifest; a symlink never.
    let gated = r["staticPods"]["gatedUnreadable"].as_array().unwrap();
    assert_eq!(gated.len(), 1, "{r}");
    assert_eq!(gated[0]["fileName"], "broken.yaml");
    let unreadable = r["staticPods"]["unreadable"].as_array().unwrap();
    assert_eq!(unreadable.len(), 1, "{r}");
    assert_eq!(unreadable[0]["fileName"], "half.yaml");
    let others = r["staticPods"]["otherFiles"].as_array().unwrap();
    assert_eq!(others.len(), 1, "{r}");
    assert_eq!(others[0]["fileName"], "link.yaml");
    assert_eq!(r["staticPods"]["setAsideJournal"], Value::Null);

    std::fs::write(
        env.path("state/static-pods.journal.set-aside"),
        b"{\"reason\":\"x\"}\n",
    )
    .unwrap();
    let table = env.table_exiting(3);
    assert!(
        table.contains("gated, unreadable  broken.yaml: the kubelet refuses it")
            && table.contains("restored byte for byte at Complete"),
        "{table}"
    );
    assert!(
        table.contains("unreadable")
            && table.contains("half.yaml in ")
            && table.contains("a shutdown gates it last"),
        "{table}"
    );
    assert!(table.contains("link.yaml: is a symlink"), "{table}");
    assert!(
        table.contains("static-pods.journal.set-aside (check them"),
        "{table}"
    );
}
