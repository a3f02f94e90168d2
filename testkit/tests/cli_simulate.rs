//! `nodegrace-sim` through the built binary: the timeline a user reads, in order. No root,
//! no dbus-daemon, no cluster; each run takes about two seconds.

use std::process::{Command, Output};

use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodegrace-sim"))
        .args(args)
        .args(["-o", "json"])
        .env("NODEGRACE_CONFIG", "/nonexistent/nodegrace.toml")
        .env_remove("DBUS_SYSTEM_BUS_ADDRESS")
        .output()
        .expect("running nodegrace-sim")
}

fn simulate(args: &[&str]) -> Value {
    let out = run(args);
    assert!(
        out.status.success(),
        "simulate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("simulate -o json prints one JSON object")
}

fn events(report: &Value) -> &Vec<Value> {
    report["events"].as_array().expect("events")
}

/// Index of the first event of `kind`.
fn first(report: &Value, kind: &str) -> usize {
    events(report)
        .iter()
        .position(|e| e["event"] == kind)
        .unwrap_or_else(|| panic!("no {kind} event in {report:#}"))
}

fn last(report: &Value, kind: &str) -> usize {
    events(report)
        .iter()
        .rposition(|e| e["event"] == kind)
        .unwrap_or_else(|| panic!("no {kind} event in {report:#}"))
}

/// (event, pod, order) of the events whose kind is one of `kinds`.
fn pod_events<'a>(report: &'a Value, kinds: &[&str]) -> Vec<(usize, &'a str, &'a str, u64)> {
    events(report)
        .iter()
        .enumerate()
        .filter(|(_, e)| kinds.iter().any(|k| e["event"] == *k))
        .map(|(i, e)| {
            (
                i,
                e["event"].as_str().unwrap(),
                e["pod"].as_str().expect("a pod event names its pod"),
                e["order"].as_u64().expect("a pod event has its step"),
            )
        })
        .collect()
}

/// Every pod event of step n comes after every pod of the steps before it is gone.
fn assert_steps_in_order(report: &Value, starts: &[&str]) {
    let all = pod_events(report, &[starts, &["pod-gone"]].concat());
    for &(i, kind, pod, order) in &all {
        if !starts.contains(&kind) {
            continue;
        }
        for &(j, other_kind, other, other_order) in &all {
            if other_order < order && other_kind == "pod-gone" {
                assert!(
                    j < i,
                    "{kind} {pod} (step {order}) came before {other} (step {other_order}) was gone"
                );
            }
        }
    }
    let orders: Vec<u64> = all
        .iter()
        .filter(|e| starts.contains(&e.1))
        .map(|e| e.3)
        .collect();
    assert!(
        orders.windows(2).all(|w| w[0] <= w[1]),
        "terminations out of step order: {orders:?}"
    );
}

/// Steps of the terminations, by pod name.
fn step_of(report: &Value, pod: &str) -> u64 {
    pod_events(report, &["evict", "delete", "gate", "cri-stop"])
        .into_iter()
        .find(|e| e.2 == pod)
        .unwrap_or_else(|| panic!("{pod} was never terminated: {report:#}"))
        .3
}

fn assert_common_shape(report: &Value, pods: usize) {
    assert_eq!(
        first(report, "signal"),
        0,
        "the timeline starts at the signal"
    );
    let released = first(report, "inhibitor-released");
    assert_eq!(
        released,
        events(report).len() - 1,
        "release is the last event"
    );
    assert!(
        last(report, "pod-gone") < released,
        "the inhibitor is released only once the node is empty"
    );
    let totals = &report["totals"];
    assert_eq!(totals["pods"], pods as u64);
    assert_eq!(totals["pods_terminated"], pods as u64, "{report:#}");
    let delay = totals["total_delay_ms"].as_u64().unwrap();
    assert_eq!(
        events(report)[released]["at_ms"].as_u64().unwrap(),
        delay,
        "the total delay is the release's time"
    );
    assert!(
        delay < 10_000,
        "a simulated shutdown takes seconds, not {delay} ms"
    );
}

#[test]
fn sample_node_drains_in_plan_order_then_releases() {
    let r = simulate(&[]);
    assert_common_shape(&r, 11);
    assert_eq!(r["apiserver"], "reachable");
    let cordon = first(&r, "cordon");
    let created = first(&r, "maintenance-created");
    let first_termination = pod_events(&r, &["evict", "delete", "gate"])[0].0;
    assert!(cordon < first_termination && created < first_termination);
    assert_steps_in_order(&r, &["evict", "delete", "gate"]);

    // Default pods by priority, the critical one last of them, then DaemonSet, then static.
    let report = step_of(&r, "batch/report-28f1");
    let critical = step_of(&r, "kube-system/coredns-5d78-a");
    let ds_low = step_of(&r, "monitoring/node-exporter-x7k2");
    let ds_critical = step_of(&r, "kube-system/kube-proxy-q9z4");
    let static_pod = step_of(&r, "kube-system/etcd-node-a");
    assert!(report <= step_of(&r, "data/postgres-0"));
    assert!(step_of(&r, "monitoring/prometheus-0") < critical);
    assert!(critical < ds_low && ds_low < ds_critical && ds_critical < static_pod);
    // Default pods are evicted, DaemonSet pods deleted, static pods gated.
    let kind_of = |pod: &str| {
        pod_events(&r, &["evict", "delete", "gate"])
            .into_iter()
            .find(|e| e.2 == pod)
            .unwrap()
            .1
    };
    assert_eq!(kind_of("shop/cache-0"), "evict");
    assert_eq!(kind_of("kube-system/kube-proxy-q9z4"), "delete");
    assert_eq!(kind_of("kube-system/etcd-node-a"), "gate");
    assert!(r["totals"]["api_writes"].as_u64().unwrap() >= 11);
    assert_eq!(r["totals"]["bands"].as_array().unwrap().len(), 5);
}

#[test]
fn pod_list_file_is_simulated_on_its_node() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/pods-node-a.yaml"
    );
    let r = simulate(&["--pods", path, "--budget", "2m"]);
    // The finished Job pod in the file is not drained.
    assert_common_shape(&r, 6);
    assert_eq!(r["node"], "node-a");
    assert_eq!(r["totals"]["budget_ms"], 120_000);
    assert!(first(&r, "maintenance-created") < first(&r, "evict"));
    assert_steps_in_order(&r, &["evict", "delete", "gate"]);
    let terminated: Vec<&str> = pod_events(&r, &["evict", "delete", "gate"])
        .into_iter()
        .map(|e| e.2)
        .collect();
    assert_eq!(terminated.len(), 6, "{terminated:?}");
    assert_eq!(*terminated.last().unwrap(), "kube-system/etcd-node-a");
}

#[test]
fn apiserver_down_stops_pods_through_the_cri_by_kubelet_band() {
    let r = simulate(&["--apiserver-down"]);
    assert_common_shape(&r, 11);
    assert_eq!(r["totals"]["api_requests"], 0);
    assert!(
        events(&r)
            .iter()
            .all(|e| !["evict", "delete", "cordon", "maintenance-created"]
                .contains(&e["event"].as_str().unwrap())),
        "nothing reaches an unreachable apiserver"
    );
    assert_steps_in_order(&r, &["cri-stop"]);
    // Two kubelet bands: below system-cluster-critical, and the critical pods.
    assert_eq!(step_of(&r, "shop/web-6d9f-a"), 0);
    assert_eq!(step_of(&r, "kube-system/coredns-5d78-a"), 1);
    assert_eq!(step_of(&r, "kube-system/etcd-node-a"), 1);
    assert_eq!(r["totals"]["bands"].as_array().unwrap().len(), 2);
    assert_eq!(
        pod_events(&r, &["cri-stop"]).len(),
        11,
        "every pod is stopped through the runtime"
    );
}

#[test]
fn a_budget_out_of_range_is_a_usage_error() {
    for budget in ["500000y", "25h", "0s"] {
        let out = run(&["--budget", budget]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--budget {budget}: {stderr}");
        assert!(
            stderr.contains("--budget") && stderr.contains("out of range"),
            "--budget {budget}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "--budget {budget}: {stderr}");
        assert!(out.stdout.is_empty(), "--budget {budget} printed a report");
    }
}

#[test]
fn a_grace_period_near_i64_max_is_drained_like_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let pods = dir.path().join("pods.yaml");
    std::fs::write(
        &pods,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: forever, namespace: batch}}\n\
             spec:\n  nodeName: node-a\n  terminationGracePeriodSeconds: {}\n  \
             containers: [{{name: main, image: busybox}}]\nstatus: {{phase: Running}}\n",
            i64::MAX
        ),
    )
    .unwrap();
    let pods = pods.to_str().unwrap();
    for extra in [&[][..], &["--apiserver-down"][..]] {
        let r = simulate(&[&["--pods", pods, "--budget", "30s"][..], extra].concat());
        assert_common_shape(&r, 1);
        let stops = pod_events(&r, &["evict", "cri-stop"]);
        assert_eq!(stops.len(), 1, "{extra:?}: {r:#}");
        assert_eq!(stops[0].2, "batch/forever");
    }
}
