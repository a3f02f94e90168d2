//! `nodegrace plan` through the built binary, from the sample pod lists in `tests/data/`.

use std::path::{Path, PathBuf};
use std::process::Output;

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

impl Env {
    /// A config with a user plan entry (Default <= 50) and reserves critical 40s, DaemonSet
    /// 30s, static 20s; max_delay 300s. No daemon status file, an apiserver that refuses.
    fn new() -> Env {
        let server = format!("https://127.0.0.1:{}", refused_port());
        Env(CliEnv::new(
            &server,
            "300s",
            r#"[drain]
reserve_daemonset = "30s"
reserve_static = "20s"
reserve_critical = "40s"
[[drain.plan]]
pod_type = "Default"
pod_priority = 50
"#,
        ))
    }

    fn status_file(&self) -> PathBuf {
        self.path("status.json")
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.run(&all);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .display()
        .to_string()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn step(report: &Value, index: u64) -> &Value {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["index"] == index)
        .unwrap()
}

fn window(s: &Value) -> (f64, f64, f64) {
    (
        s["startSeconds"].as_f64().unwrap(),
        s["escalateAtSeconds"].as_f64().unwrap(),
        s["endSeconds"].as_f64().unwrap(),
    )
}

fn step_pods(s: &Value) -> Vec<String> {
    s["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"].as_str().unwrap().to_string())
        .collect()
}

const ORDER: [&str; 6] = [
    "shop/web-7d9f8b6c5-x2kqp",
    "shop/cache-0",
    "shop/db-0",
    "kube-system/coredns-5d78c9869d-abcde",
    "kube-system/kube-proxy-8xk2m",
    "kube-system/etcd-node-a",
];

#[test]
fn plan_from_a_kubectl_list_orders_pods_splits_the_budget_and_marks_escalations() {
    let env = Env::new();
    let r = env.json(&["plan", "--pods", &data("pods-node-a.yaml")]);

    assert_eq!(strings(&r["order"]), ORDER);
    assert_eq!(r["budget"]["seconds"], 300.0);
    assert_eq!(r["budget"]["source"], "config");
    assert_eq!(r["reserves"]["neededSeconds"], 90.0);
    assert_eq!(r["reserves"]["belowReserves"], false);
    assert_eq!(
        r["steps"].as_array().unwrap().len(),
        13,
        "1 user + 12 default entries"
    );

    // Regular pods share 300 - 40 - 30 - 20 = 210 s by longest grace: 30 s vs 120 s.
    let s0 = step(&r, 0);
    assert_eq!(s0["class"], "regular");
    assert_eq!(s0["description"], "Default pods with priority <= 50");
    assert_eq!(step_pods(s0), ORDER[..2]);
    assert_eq!(window(s0), (0.0, 21.0, 42.0));
    let s1 = step(&r, 1);
    assert_eq!(step_pods(s1), ORDER[2..3]);
    assert_eq!(window(s1), (42.0, 126.0, 210.0));
    let s2 = step(&r, 2);
    assert_eq!(s2["class"], "critical");
    assert_eq!(step_pods(s2), ORDER[3..4]);
    assert_eq!(window(s2), (210.0, 230.0, 250.0));
    let s7 = step(&r, 7);
    assert_eq!(s7["class"], "daemonset");
    assert_eq!(step_pods(s7), ORDER[4..5]);
    assert_eq!(window(s7), (250.0, 265.0, 280.0));
    let s11 = step(&r, 11);
    assert_eq!(s11["class"], "static");
    assert_eq!(step_pods(s11), ORDER[5..6]);
    assert_eq!(window(s11), (280.0, 290.0, 300.0));
    for empty in [3, 4, 5, 6, 8, 9, 10, 12] {
        let s = step(&r, empty);
        assert!(s["pods"].as_array().unwrap().is_empty(), "step {empty}");
        assert_eq!(s["shareSeconds"], 0.0, "step {empty}");
    }

    // Only etcd's 30 s grace does not fit its 20 s share: deleted at 290 s with 10 s grace.
    assert_eq!(strings(&r["escalated"]), ["kube-system/etcd-node-a"]);
    let etcd = &s11["pods"][0];
    assert_eq!(etcd["escalated"], true);
    assert_eq!(etcd["escalationGraceSeconds"], 10.0);
    assert_eq!(etcd["podType"], "Static");
    let db = &s1["pods"][0];
    assert_eq!(db["escalated"], false);
    assert_eq!(db["graceSeconds"], 120);
    assert_eq!(db["escalationGraceSeconds"], Value::Null);
    assert_eq!(step(&r, 7)["pods"][0]["podType"], "DaemonSet");

    assert_eq!(r["ignored"].as_array().unwrap().len(), 1);
    assert_eq!(r["ignored"][0]["pod"], "shop/report-29012345-q8w7e");

    // Offline view: the default bands (0: 60 s, 2000000000: 30 s), grace = min(band, pod).
    let bands = r["offline"]["bands"].as_array().unwrap();
    assert_eq!(bands.len(), 2);
    assert_eq!(bands[0]["priority"], 0);
    let low: Vec<(String, f64)> = bands[0]["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pod"].as_str().unwrap().to_string(),
                p["graceSeconds"].as_f64().unwrap(),
            )
        })
        .collect();
    assert!(low.contains(&("shop/db-0".to_string(), 60.0)), "{low:?}");
    assert_eq!(bands[1]["pods"].as_array().unwrap().len(), 3);
    assert_eq!(r["offline"]["maxDurationSeconds"], 90.0);
}

#[test]
fn plan_table_lists_the_same_order_with_step_headers_and_escalation_marks() {
    let env = Env::new();
    let out = env.run(&["plan", "--pods", &data("pods-node-a.yaml")]);
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    let positions: Vec<usize> = ORDER
        .iter()
        .map(|p| {
            table
                .find(p)
                .unwrap_or_else(|| panic!("{p} missing:\n{table}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "order differs:\n{table}"
    );
    let header = table
        .find("Step 1 [regular] Default pods with priority <= 50")
        .unwrap();
    assert!(header < positions[0]);
    let etcd_line = table
        .lines()
        .find(|l| l.contains("kube-system/etcd-node-a") && l.trim_start().starts_with('6'))
        .unwrap();
    assert!(etcd_line.contains("ESCALATED"), "{etcd_line}");
    let db_line = table
        .lines()
        .find(|l| l.contains("shop/db-0") && l.trim_start().starts_with('3'))
        .unwrap();
    assert!(!db_line.contains("ESCALATED"), "{db_line}");
    // Aligned: the pod names of the drain table all start in the same column.
    let columns: Vec<usize> = ORDER
        .iter()
        .map(|p| {
            let line = table
                .lines()
                .find(|l| l.contains(p) && l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
                .unwrap();
            line.find(p).unwrap()
        })
        .collect();
    assert!(columns.windows(2).all(|w| w[0] == w[1]), "{table}");
    assert!(table.contains("Ignored:"));
    assert!(table.contains("shop/report-29012345-q8w7e"));
    assert!(table.contains("Offline fallback"));
    assert!(table.contains("Budget: 5m (shutdown.max_delay"));
}

#[test]
fn budget_below_the_reserves_escalates_every_regular_pod_at_once() {
    let env = Env::new();
    let r = env.json(&[
        "plan",
        "--pods",
        &data("pods-node-a.yaml"),
        "--budget",
        "60s",
    ]);
    assert_eq!(r["budget"]["source"], "flag");
    assert_eq!(r["budget"]["seconds"], 60.0);
    assert_eq!(r["reserves"]["belowReserves"], true);
    for index in [0, 1] {
        let s = step(&r, index);
        assert_eq!(window(s), (0.0, 0.0, 0.0), "step {index}");
        for p in s["pods"].as_array().unwrap() {
            assert_eq!(p["escalated"], true, "{p}");
            assert_eq!(p["escalationGraceSeconds"], 0.0, "{p}");
        }
    }
    // Reserves scaled by 60/90: critical 26.666 s, DaemonSet 20 s, static 13.333 s.
    assert_eq!(window(step(&r, 2)).2, 26.666);
    assert_eq!(window(step(&r, 7)), (26.666, 36.666, 46.666));
    assert_eq!(window(step(&r, 11)).2, 60.0);
    let escalated = strings(&r["escalated"]);
    for pod in ORDER {
        assert!(escalated.contains(&pod.to_string()), "{pod} not escalated");
    }
    // The order does not change with the budget.
    assert_eq!(strings(&r["order"]), ORDER);

    let out = env.run(&[
        "plan",
        "--pods",
        &data("pods-node-a.yaml"),
        "--budget",
        "60s",
    ]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("BUDGET BELOW THE RESERVES"), "{table}");
    assert!(
        table
            .lines()
            .filter(|l| l.contains("ESCALATED: no share of the budget"))
            .count()
            == 3,
        "{table}"
    );
}

#[test]
fn budget_comes_from_the_daemon_status_file_when_there_is_one() {
    let env = Env::new();
    let mut status = nodegrace::Status::new();
    status.budget = Some(nodegrace::BudgetReport {
        configured: std::time::Duration::from_secs(300),
        logind_initial: std::time::Duration::from_secs(5),
        logind_effective: std::time::Duration::from_secs(120),
        budget: std::time::Duration::from_secs(120),
        dropin_written: None,
        reload_requested: true,
        delay_dropins: Vec::new(),
        error: None,
    });
    status.write(&env.status_file());
    let r = env.json(&["plan", "--pods", &data("pods-node-a.yaml")]);
    assert_eq!(r["budget"]["source"], "status-file");
    assert_eq!(r["budget"]["seconds"], 120.0);
    assert_eq!(window(step(&r, 11)).2, 120.0);
    // --budget still wins.
    let r = env.json(&[
        "plan",
        "--pods",
        &data("pods-node-a.yaml"),
        "--budget",
        "10m",
    ]);
    assert_eq!(r["budget"]["seconds"], 600.0);
}

#[test]
fn pod_lists_as_api_podlist_json_and_multi_document_yaml() {
    let env = Env::new();
    let r = env.json(&["plan", "--pods", &data("podlist-node-a.json")]);
    assert_eq!(strings(&r["order"]), ORDER[..3]);
    let r = env.json(&["plan", "--pods", &data("pods-stream.yaml")]);
    assert_eq!(strings(&r["order"]), ORDER[3..]);
}

fn assert_one_line_error(out: &Output, expected: &[&str]) {
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    for e in expected {
        assert!(err.contains(e), "{err:?} lacks {e:?}");
    }
}

#[test]
fn malformed_pod_files_fail_with_one_clear_line() {
    let env = Env::new();
    let bad = data("pods-malformed.yaml");
    assert_one_line_error(
        &env.run(&["plan", "--pods", &bad]),
        &[
            "nodegrace: invalid pod list",
            "pods-malformed.yaml",
            // Where the bracket left open is (libyaml named the end of the file, line 10).
            "unclosed bracket at line 9 column 19",
        ],
    );
    assert_one_line_error(
        &env.run(&["plan", "--pods", &data("pods-not-pods.yaml")]),
        &["items[1] is a Deployment, not a Pod"],
    );
    let missing = env.dir.path().join("nope.yaml");
    assert_one_line_error(
        &env.run(&["plan", "--pods", missing.to_str().unwrap()]),
        &["cannot read pod list", "nope.yaml"],
    );
    let empty = env.dir.path().join("empty.yaml");
    std::fs::write(&empty, "# nothing\n").unwrap();
    assert_one_line_error(
        &env.run(&["plan", "--pods", empty.to_str().unwrap()]),
        &["no Kubernetes objects"],
    );
    let negative = env.dir.path().join("negative.yaml");
    std::fs::write(
        &negative,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x, namespace: y}\nspec:\n  terminationGracePeriodSeconds: -1\n  containers: [{name: c}]\n",
    )
    .unwrap();
    assert_one_line_error(
        &env.run(&["plan", "--pods", negative.to_str().unwrap()]),
        &[
            "invalid pod list",
            "negative.yaml",
            "terminationGracePeriodSeconds is negative",
        ],
    );
    let long = env.dir.path().join("long.yaml");
    let value = "x".repeat(900_000);
    std::fs::write(
        &long,
        format!("kind: Pod\nmetadata: {{name: a}}\nspec:\n  priority: \"{value}\"\n"),
    )
    .unwrap();
    let out = env.run(&["plan", "--pods", long.to_str().unwrap()]);
    assert_one_line_error(
        &out,
        &[
            "long.yaml",
            "invalid i32 at line 4 column 13",
            "(the file's text is not shown)",
        ],
    );
    assert!(out.stderr.len() < 1000, "{} bytes", out.stderr.len());
    let nameless = env.dir.path().join("nameless.json");
    std::fs::write(
        &nameless,
        r#"{"kind":"PodList","items":[{"metadata":{"name":"a"}},{"metadata":{"namespace":"b"}}]}"#,
    )
    .unwrap();
    assert_one_line_error(
        &env.run(&["plan", "--pods", nameless.to_str().unwrap()]),
        &[
            "invalid pod list",
            "nameless.json",
            "items[1]",
            "no metadata.name",
        ],
    );
}

#[test]
fn live_plan_without_an_apiserver_says_so_and_points_to_pods() {
    let env = Env::new();
    assert_one_line_error(
        &env.run(&["plan"]),
        &["cannot list the pods of node node-a", "--pods FILE"],
    );
}

#[test]
fn a_plan_is_for_the_one_node_the_list_names() {
    let env = Env::new();
    let text = std::fs::read_to_string(data("pods-node-a.yaml")).unwrap();
    // Unbound (pending) pods in a one-node list are ignored, and the node comes from the list.
    let pending = env.dir.path().join("pending.yaml");
    std::fs::write(
        &pending,
        text.replace("nodeName: node-a", "nodeName: node-x")
            .replacen("    nodeName: node-x\n", "", 1),
    )
    .unwrap();
    let r = env.json(&["plan", "--pods", pending.to_str().unwrap()]);
    assert_eq!(r["node"], "node-x");
    assert_eq!(strings(&r["order"]), ORDER[1..]);
    let ignored: Vec<&str> = r["ignored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["pod"].as_str().unwrap())
        .collect();
    assert!(ignored.contains(&ORDER[0]), "{ignored:?}");

    let two = env.dir.path().join("two-nodes.yaml");
    std::fs::write(
        &two,
        text.replacen("nodeName: node-a", "nodeName: node-b", 1),
    )
    .unwrap();
    assert_one_line_error(
        &env.run(&["plan", "--pods", two.to_str().unwrap()]),
        &[
            "pods of 2 nodes (node-a, node-b)",
            "--field-selector spec.nodeName=NODE",
        ],
    );
}

/// `--pods` is read only if it is a regular file of sane size: a FIFO would hang the command
/// and /dev/zero would be read until memory runs out.
#[test]
fn a_fifo_or_a_device_as_pod_list_fails_at_once() {
    let env = Env::new();
    let fifo = env.dir.path().join("pods.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let began = std::time::Instant::now();
    assert_one_line_error(
        &env.run(&["plan", "--pods", fifo.to_str().unwrap()]),
        &["cannot read pod list", "a FIFO, not a regular file"],
    );
    assert_one_line_error(
        &env.run(&["plan", "--pods", "/dev/zero"]),
        &[
            "cannot read pod list /dev/zero",
            "a device, not a regular file",
        ],
    );
    assert!(began.elapsed() < std::time::Duration::from_secs(10));
}

/// A FIFO where the daemon's status file should be does not hang `plan` either: the budget
/// then comes from the configuration.
#[test]
fn a_fifo_as_status_file_is_not_waited_for() {
    let env = Env::new();
    nix::unistd::mkfifo(
        &env.status_file(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let r = env.json(&["plan", "--pods", &data("pods-node-a.yaml")]);
    assert_eq!(r["budget"]["source"], "config");
    assert!(
        r["budget"]["detail"]
            .as_str()
            .unwrap()
            .contains("a FIFO, not a regular file"),
        "{}",
        r["budget"]
    );
}

#[test]
fn pod_and_node_names_reach_the_terminal_escaped() {
    let env = Env::new();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "PodList", "items": [{
        "metadata": {"name": "web\u{1b}[2J\nStep 9 forged", "namespace": "shop\u{202e}",
            "uid": "u1"},
        "spec": {"nodeName": "node-a\u{1b}]0;x\u{7}", "priority": 0,
            "terminationGracePeriodSeconds": 30, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"}
    }]});
    let pods = env.path("pods.json");
    std::fs::write(&pods, serde_json::to_vec(&list).unwrap()).unwrap();
    for args in [
        vec!["plan", "--pods", pods.to_str().unwrap()],
        vec!["plan", "--pods", pods.to_str().unwrap(), "-o", "json"],
    ] {
        let out = env.run(&args);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
        for text in [&stdout, &stderr] {
            assert!(
                !text
                    .chars()
                    .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
                "{args:?}: {text:?}"
            );
        }
        assert!(!stdout.lines().any(|l| l.starts_with("Step 9")), "{stdout}");
        if args.len() == 3 {
            assert!(
                stdout.contains("shop\\u202e/web\\u001b[2J\\u000aStep 9 forged"),
                "{stdout}"
            );
            assert!(stdout.contains("node-a\\u001b]0;x\\u0007"), "{stdout}");
        } else {
            let r: Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(r["node"], "node-a\u{1b}]0;x\u{7}", "{stdout}");
        }
    }
}

#[test]
fn pods_from_standard_input_with_a_dash() {
    use std::io::Write;
    let env = Env::new();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .arg("--config")
        .arg(env.path("config.toml"))
        .args(["plan", "--pods", "-", "-o", "json"])
        .env("NODEGRACE_STATUS_FILE", env.status_file())
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let list = std::fs::read(data("pods-node-a.yaml")).unwrap();
    child.stdin.take().unwrap().write_all(&list).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let piped: Value = serde_json::from_slice(&out.stdout).unwrap();
    let from_file = env.json(&["plan", "--pods", &data("pods-node-a.yaml")]);
    assert_eq!(piped["source"], "stdin");
    assert_eq!(piped["order"], from_file["order"]);
    assert!(!piped["order"].as_array().unwrap().is_empty());
}

#[test]
fn budget_longer_than_the_daemon_can_have_is_a_usage_error() {
    let env = Env::new();
    let pods = data("pods-node-a.yaml");
    let out = env.run(&["plan", "--pods", &pods, "--budget", "25h"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("longer than any shutdown budget"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = env.json(&["plan", "--pods", &pods, "--budget", "24h"]);
    assert_eq!(r["budget"]["seconds"], 86400.0);
}

/// Peak RSS in MiB of `nodegrace --config <env's config> <args>` (the child's `ru_maxrss`).
fn peak_rss_mib(env: &Env, args: &[&str]) -> f64 {
    // Waited for below with wait4, which gives its rusage.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .arg("--config")
        .arg(env.path("config.toml"))
        .args(args)
        .env("NODEGRACE_STATUS_FILE", env.status_file())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own, not yet waited, child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "{}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{args:?}: status {status}"
    );
    usage.ru_maxrss as f64 / 1024.0
}

#[test]
fn a_pod_list_costs_memory_for_what_the_plan_reads_not_for_its_size() {
    let env = Env::new();
    // 2,000 pods of ~8 KiB each (containers, environment, managed fields): 16 MiB that the
    // plan reads nothing of. Read whole, they took ~37x the file (600 MiB).
    let filler = format!("{{\"name\":\"E\",\"value\":\"{}\"}}", "v".repeat(100));
    let env_list = vec![filler.as_str(); 64].join(",");
    let items: Vec<String> = (0..2000)
        .map(|i| {
            format!(
                r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"web-{i}","namespace":"shop","labels":{{"app":"web"}},"managedFields":[{{"manager":"kubelet","fieldsV1":{{"f:status":{{"f:phase":{{}}}}}}}}]}},"spec":{{"nodeName":"node-a","containers":[{{"name":"web","image":"nginx","env":[{env_list}]}}]}},"status":{{"phase":"Running"}}}}"#
            )
        })
        .collect();
    let list = format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
        items.join(",")
    );
    let path = env.path("big.json");
    std::fs::write(&path, &list).unwrap();
    let input_mib = list.len() as f64 / 1048576.0;
    assert!(input_mib > 15.0, "{input_mib}");
    let rss = peak_rss_mib(&env, &["plan", "--pods", path.to_str().unwrap()]);
    // The binary itself (a debug build) and its runtime take ~20 MiB.
    assert!(
        rss < 40.0 + 2.0 * input_mib,
        "peak RSS {rss:.1} MiB for a {input_mib:.1} MiB pod list"
    );
}
