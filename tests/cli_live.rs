//! `plan` and `status` against an apiserver: a minimal HTTP responder that answers the three
//! reads the commands make (`/version`, the node's pods, NodeMaintenances) with objects
//! serialized from the real API types, and records the requests it got.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use nodegrace::{
    node_selector_for, DrainPlanEntry, NodeMaintenance, NodeMaintenanceNodeStatus,
    NodeMaintenanceSpec, NodeMaintenanceStatus, PodType, Stage,
};
use serde_json::{json, Value};

mod cli_support;
use cli_support::CliEnv;

type Requests = Arc<Mutex<Vec<String>>>;

/// Serves `routes` (path without query -> JSON body) on a local port; 404 otherwise.
/// `answer: false` accepts connections and never answers.
fn serve(routes: Vec<(&'static str, Value)>, answer: bool) -> (u16, Requests) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests: Requests = Arc::default();
    let seen = requests.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            if !answer {
                held.push(stream);
                continue;
            }
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                    break;
                }
            }
            let target = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            seen.lock().unwrap().push(target.clone());
            let path = target.split('?').next().unwrap_or_default();
            let (code, body) = match routes.iter().find(|(p, _)| *p == path) {
                // A Status answers with its own code.
                Some((_, body)) if body["kind"] == "Status" => {
                    (format!("{} Error", body["code"]), body.to_string())
                }
                Some((_, body)) => ("200 OK".to_string(), body.to_string()),
                None => (
                    "404 Not Found".to_string(),
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": format!("the server could not find the requested resource ({path})"),
                        "reason": "NotFound", "code": 404})
                    .to_string(),
                ),
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, requests)
}

struct Env(CliEnv);

impl std::ops::Deref for Env {
    type Target = CliEnv;
    fn deref(&self) -> &CliEnv {
        &self.0
    }
}

impl Env {
    fn new(port: u16) -> Env {
        Env(CliEnv::new(
            &format!("http://127.0.0.1:{port}"),
            "300s",
            r#"[drain]
reserve_daemonset = "30s"
reserve_static = "20s"
reserve_critical = "40s"
"#,
        ))
    }

    fn json(&self, args: &[&str]) -> Value {
        self.json_exiting(args, 0)
    }

    fn json_exiting(&self, args: &[&str], code: i32) -> Value {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `status -o json`: no daemon runs in these tests, so it exits 3 (not protected).
    fn status_json(&self) -> Value {
        self.json_exiting(&["status", "-o", "json"], 3)
    }
}

fn data_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/pods-node-a.yaml")
}

/// The sample pods as the apiserver returns them: a PodList.
fn pod_list() -> Value {
    let text = std::fs::read_to_string(data_path()).unwrap();
    let mut list: Value = serde_yaml::from_str(&text).unwrap();
    list["kind"] = json!("PodList");
    list["metadata"] = json!({"resourceVersion": "42"});
    list
}

fn version() -> Value {
    json!({"major": "1", "minor": "33", "gitVersion": "v1.33.1", "gitCommit": "abc",
        "gitTreeState": "clean", "buildDate": "2025-05-15T00:00:00Z", "goVersion": "go1.24.2",
        "compiler": "gc", "platform": "linux/amd64"})
}

fn entry(pod_type: PodType, pod_priority: i32) -> DrainPlanEntry {
    DrainPlanEntry {
        pod_selector: None,
        pod_priority,
        pod_type,
    }
}

fn maintenance(name: &str, stage: Stage, selector: NodeSelector) -> NodeMaintenance {
    let mut m = NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_selector: selector,
            stage,
            drain_plan: nodegrace::normalize_drain_plan(&[]).unwrap(),
            reason: Some(format!("{name} reason")),
        },
    );
    m.metadata.resource_version = Some("7".into());
    m
}

fn maintenances() -> Value {
    let mut shutdown = maintenance(
        &nodegrace::shutdown_maintenance_name("node-a"),
        Stage::Drain,
        node_selector_for("node-a"),
    );
    let mut ns = NodeMaintenanceNodeStatus::for_node("node-a");
    ns.drain_targets = vec![entry(PodType::Default, 1_000_000_000)];
    ns.drain_message = "Draining".into();
    ns.pods_remaining = 3;
    ns.active_eviction_requests = 1;
    ns.pods_pending_eviction_request = 2;
    shutdown.status = Some(NodeMaintenanceStatus {
        node_statuses: vec![ns],
        ..Default::default()
    });
    let done = maintenance(
        "kernel-upgrade",
        Stage::Complete,
        node_selector_for("node-a"),
    );
    let other = maintenance("other-node", Stage::Drain, node_selector_for("node-b"));
    let by_label = maintenance(
        "rack-7",
        Stage::Cordon,
        NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: "rack".into(),
                    operator: "In".into(),
                    values: Some(vec!["7".into()]),
                }]),
                match_fields: None,
            }],
        },
    );
    json!({
        "apiVersion": "nodegrace.dev/v1alpha1",
        "kind": "NodeMaintenanceList",
        "metadata": {"resourceVersion": "99"},
        "items": [shutdown, done, other, by_label],
    })
}

#[test]
fn an_apiserver_error_without_a_message_reads_as_its_code_and_reason() {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "", "reason": "InternalError", "code": 500});
    let (port, _) = serve(vec![("/api/v1/pods", status)], true);
    let env = Env::new(port);
    let out = env.run(&["plan"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot list the pods of node node-a from the apiserver: HTTP 500 (InternalError); use --pods FILE"),
        "{err}"
    );
    assert!(
        !err.contains("Status {") && !err.contains("ApiError"),
        "{err}"
    );
}

#[test]
fn live_plan_reads_the_nodes_pods_with_a_field_selector() {
    let (port, requests) = serve(vec![("/api/v1/pods", pod_list())], true);
    let env = Env::new(port);
    let r = env.json(&["plan", "-o", "json"]);
    assert_eq!(r["source"], "apiserver");
    assert_eq!(r["node"], "node-a");
    assert_eq!(r["order"].as_array().unwrap().len(), 6);
    assert_eq!(r["order"][5], "kube-system/etcd-node-a");
    assert!(r.get("unreadableManifests").is_none(), "{r}");
    // A file the kubelet refuses in its staticPodPath: listed, to be gated after every pod.
    std::fs::write(env.path("manifests/half.yaml"), b"metadata: [").unwrap();
    let r = env.json(&["plan", "-o", "json"]);
    assert_eq!(r["unreadableManifests"][0]["pod"], "half.yaml", "{r}");
    let out = env.run(&["plan"]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains(
            "Last, after every pod: files in the static pod directory the kubelet refuses"
        ) && table.contains("half.yaml"),
        "{table}"
    );
    let seen = requests.lock().unwrap().clone();
    assert!(
        seen.iter().any(|t| t.starts_with("/api/v1/pods?")
            && t.contains("fieldSelector=spec.nodeName%3Dnode-a")),
        "{seen:?}"
    );
}

#[test]
fn status_lists_the_active_maintenances_of_this_node_with_pods_per_band() {
    let (port, _) = serve(
        vec![
            ("/version", version()),
            ("/api/v1/pods", pod_list()),
            (
                "/apis/nodegrace.dev/v1alpha1/nodemaintenances",
                maintenances(),
            ),
        ],
        true,
    );
    let env = Env::new(port);
    let r = env.status_json();
    assert_eq!(r["apiserver"]["reachable"], true);
    assert_eq!(r["apiserver"]["version"], "v1.33.1");
    let m = &r["maintenances"];
    assert_eq!(m["known"], true);
    let active = m["active"].as_array().unwrap();
    // Complete ones and other nodes' are left out; this server does not serve the Node, so a
    // label selector nobody answered for this node cannot be evaluated and is left out too.
    assert_eq!(active.len(), 1, "{m}");
    let nm = &active[0];
    assert_eq!(nm["name"], nodegrace::shutdown_maintenance_name("node-a"));
    assert_eq!(nm["stage"], "Drain");
    assert_eq!(
        nm["drainTargets"][0],
        "Default pods with priority <= 1000000000"
    );
    assert_eq!(nm["drainMessage"], "Draining");
    assert_eq!(nm["podsRemaining"], 3);
    let bands: Vec<(String, bool, u64)> = nm["bands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["description"].as_str().unwrap().to_string(),
                b["targeted"].as_bool().unwrap(),
                b["remaining"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        bands,
        [
            (
                "Default pods with priority <= 1000000000".to_string(),
                true,
                3
            ),
            (
                "Default pods with priority <= 2000000000".to_string(),
                false,
                1
            ),
            (
                "DaemonSet pods with priority <= 2000001000".to_string(),
                false,
                1
            ),
            (
                "Static pods with priority <= 2000001000".to_string(),
                false,
                1
            ),
        ]
    );

    let out = env.run(&["status"]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("reachable (v1.33.1)"), "{table}");
    assert!(table.contains("stage Drain"), "{table}");
    assert!(
        table.contains("Default pods with priority <= 1000000000: 3 pod(s) (draining)"),
        "{table}"
    );
}

#[test]
fn a_silent_apiserver_is_given_up_on_after_the_probe_timeout() {
    let (port, _) = serve(Vec::new(), false);
    let env = Env::new(port);
    let began = Instant::now();
    let r = env.status_json();
    let took = began.elapsed();
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert!(took >= Duration::from_secs(3), "took {took:?}");
    assert_eq!(r["apiserver"]["reachable"], false);
    assert!(
        r["apiserver"]["error"].as_str().unwrap().contains("3s"),
        "{}",
        r["apiserver"]
    );
    assert_eq!(r["maintenances"]["known"], false);
}

#[test]
fn status_matches_label_selected_maintenances_against_the_node() {
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "labels": {"rack": "7", "kubernetes.io/hostname": "node-a"}}});
    let (port, _) = serve(
        vec![
            ("/version", version()),
            ("/api/v1/pods", pod_list()),
            ("/api/v1/nodes/node-a", node),
            (
                "/apis/nodegrace.dev/v1alpha1/nodemaintenances",
                maintenances(),
            ),
        ],
        true,
    );
    let env = Env::new(port);
    let r = env.status_json();
    let names: Vec<&str> = r["maintenances"]["active"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"rack-7"), "{names:?}");
}

/// A date the apiserver stores but the API types cannot hold (they stop at 9999-12-30).
const PAST_THE_TYPES: &str = "9999-12-31T23:59:59.000000Z";

/// An Event nodegrace wrote on `maintenance`, as events.k8s.io/v1 lists it.
fn event(name: &str, maintenance: &str, at: &str, reason: &str, note: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "default", "resourceVersion": "5"},
        "eventTime": at, "reason": reason, "note": note, "action": reason, "type": "Normal",
        "reportingController": "nodegrace", "reportingInstance": "node-a",
        "regarding": {"apiVersion": "nodegrace.dev/v1alpha1", "kind": "NodeMaintenance",
            "name": maintenance, "uid": "uid-1"}})
}

fn event_list(items: Vec<Value>, next: Option<&str>) -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "EventList",
        "metadata": {"resourceVersion": "9", "continue": next}, "items": items})
}

const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

fn one_shutdown() -> Vec<Value> {
    vec![
        event(
            "a",
            "shutdown-node-a",
            "2026-11-27T14:02:03.000000Z",
            "DrainTargets",
            "node node-a drains Default<=1000",
        ),
        event(
            "b",
            "shutdown-node-a",
            "2026-11-27T14:02:13.000000Z",
            "Drained",
            "node node-a drained for shutdown-node-a",
        ),
    ]
}

/// `nodegrace history node-a` with the environment's kubeconfig: exit code, stdout, stderr.
fn history(env: &Env) -> (Option<i32>, String, String) {
    let out = env.run(&[
        "history",
        "node-a",
        "--kubeconfig",
        env.path("kubeconfig").to_str().unwrap(),
    ]);
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn an_object_that_cannot_be_decoded_is_set_aside_and_the_rest_read() {
    let mut pods = pod_list();
    pods["items"][0]["status"]["startTime"] = json!(PAST_THE_TYPES);
    let bad_pod = format!(
        "Pod {}/{} cannot be decoded and is left out",
        pods["items"][0]["metadata"]["namespace"].as_str().unwrap(),
        pods["items"][0]["metadata"]["name"].as_str().unwrap()
    );
    let mut nms = maintenances();
    nms["items"][3]["metadata"]["creationTimestamp"] = json!(PAST_THE_TYPES);
    let mut events = one_shutdown();
    events.push(event(
        "far",
        "shutdown-node-a",
        PAST_THE_TYPES,
        "Drained",
        "written by hand",
    ));
    let mut shutdown = nms["items"][0].clone();
    shutdown["metadata"]["creationTimestamp"] = json!(PAST_THE_TYPES);
    let (port, requests) = serve(
        vec![
            ("/version", version()),
            ("/api/v1/pods", pods),
            ("/apis/nodegrace.dev/v1alpha1/nodemaintenances", nms),
            (
                "/apis/nodegrace.dev/v1alpha1/nodemaintenances/shutdown-node-a",
                shutdown,
            ),
            (EVENTS, event_list(events, None)),
        ],
        true,
    );
    let env = Env::new(port);

    let out = env.run(&["plan", "-o", "json"]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(0), "{err}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["order"].as_array().unwrap().len(), 5, "{r}");
    assert!(err.contains(&bad_pod), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let out = env.run(&["status", "-o", "json"]);
    let err = String::from_utf8(out.stderr).unwrap();
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["maintenances"]["known"], true, "{r}\n{err}");
    assert_eq!(r["maintenances"]["active"][0]["name"], "shutdown-node-a");
    // Once for each of the two lists (by label, unlabelled) the stub answers alike.
    assert!(
        err.contains("NodeMaintenance rack-7 cannot be decoded and is left out"),
        "{err}"
    );

    let (code, drawn, err) = history(&env);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        drawn.starts_with("node-a: shutdown at 2026-11-27 14:02:03Z, 10.0s, drained"),
        "{drawn}"
    );
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(
        err.contains("Event default/far cannot be decoded and is left out"),
        "{err}"
    );
    assert!(
        err.contains("NodeMaintenance shutdown-node-a cannot be decoded and is left out"),
        "{err}"
    );
    let seen = requests.lock().unwrap().clone();
    let lists: Vec<_> = seen.iter().filter(|t| t.starts_with(EVENTS)).collect();
    assert!(
        lists.iter().all(|t| t.contains(
            "fieldSelector=regarding.kind%3DNodeMaintenance%2Cregarding.name%3Dshutdown-node-a"
        )),
        "{lists:?}"
    );
}

#[test]
fn history_stops_paging_at_an_empty_page_a_token_sent_before_or_its_byte_cap() {
    let mut large = one_shutdown();
    large.push(event(
        "large",
        "shutdown-node-a",
        "2026-11-27T14:02:04.000000Z",
        "Throttled",
        &"n".repeat(17 << 20),
    ));
    for (page, pages_read, why, shown) in [
        (
            event_list(Vec::new(), Some("more")),
            1,
            "an empty page that says more follow",
            "no shutdown of node node-a",
        ),
        (
            event_list(one_shutdown(), Some("same")),
            2,
            "a continue token a second time",
            "node-a: shutdown at 2026-11-27 14:02:03Z",
        ),
        (
            event_list(large, Some("more")),
            1,
            "the most bytes read for one list",
            "node-a: shutdown at 2026-11-27 14:02:03Z",
        ),
    ] {
        let (port, requests) = serve(vec![(EVENTS, page)], true);
        let env = Env::new(port);
        let began = Instant::now();
        let (code, drawn, err) = history(&env);
        assert_eq!(code, Some(0), "{err}");
        assert!(began.elapsed() < Duration::from_secs(10));
        assert!(err.contains("listing Event: stopped after"), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(drawn.starts_with(shown), "{drawn}");
        let seen = requests.lock().unwrap().clone();
        let lists = seen.iter().filter(|t| t.starts_with(EVENTS)).count();
        assert_eq!(lists, pages_read, "{seen:?}\n{drawn}");
    }
}

#[test]
fn an_apiserver_message_of_megabytes_is_shown_clipped() {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "m".repeat(10 << 20), "reason": "InternalError", "code": 500});
    let (port, _) = serve(
        vec![("/api/v1/pods", status.clone()), (EVENTS, status)],
        true,
    );
    let env = Env::new(port);
    let out = env.run(&["plan"]);
    let plan_err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{plan_err}");
    let (code, _, history_err) = history(&env);
    assert_eq!(code, Some(1), "{history_err}");
    for err in [plan_err, history_err] {
        assert!(err.len() < 2000, "{} bytes", err.len());
        assert!(
            err.contains("HTTP 500 (InternalError): mmmm") && err.contains("characters left out"),
            "{err}"
        );
    }
}

/// `history` with its stdout on a terminal (a pseudo-terminal this test reads): what the
/// terminal gets.
fn history_on_a_terminal(env: &Env) -> String {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    // SAFETY: plain calls on a new pseudo-terminal; every fd is checked and owned once.
    let (master, slave) = unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap();
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        (std::fs::File::from_raw_fd(fd), slave)
    };
    let mut child = env
        .command(&[
            "history",
            "node-a",
            "--kubeconfig",
            env.path("kubeconfig").to_str().unwrap(),
        ])
        .env_remove("NO_COLOR")
        .env("COLUMNS", "80")
        .stdout(slave)
        .spawn()
        .unwrap();
    let reader = std::thread::spawn(move || {
        let mut master = master;
        let mut shown = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once the child, the last holder of the terminal, has exited.
        while let Ok(n @ 1..) = master.read(&mut buf) {
            shown.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&shown).into_owned()
    });
    assert!(child.wait().unwrap().success());
    reader.join().unwrap()
}

#[test]
fn a_terminal_gets_the_colours_and_names_stay_escaped() {
    let mut events = one_shutdown();
    events.push(event(
        "c",
        "shutdown-node-a",
        "2026-11-27T14:02:05.000000Z",
        "EvictionBlocked",
        "eviction of 1 pod(s) blocked by PodDisruptionBudget a/b\u{1b}[2J; retrying with back-off: a/p",
    ));
    let (port, _) = serve(vec![(EVENTS, event_list(events, None))], true);
    let env = Env::new(port);
    let shown = history_on_a_terminal(&env);
    assert!(shown.contains("\u{1b}[32m█"), "{shown:?}");
    assert!(shown.contains("\u{1b}[0m"), "{shown:?}");
    assert!(!shown.contains("\\u001b[32m"), "{shown:?}");
    assert!(shown.contains("a/b\\u001b[2J"), "{shown:?}");
    assert!(!shown.contains("\u{1b}[2J"), "{shown:?}");
}
