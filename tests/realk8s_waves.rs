//! Real-control-plane tier: a RebootWave's slots as the real apiserver orders and limits them
//! (issue 43, item 3). Six node identities of three zones join a wave of `maxUnavailable: 2`,
//! one a zone, and all take a slot at once, each by an update with the resourceVersion it
//! read: the packaged admission policy refuses every take beyond the limits, and a node's
//! credential cannot write another node's slot.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

mod real;
mod realk8s;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodegrace::RebootWave;
use realk8s::fixture::Fixture;
use realk8s::workload::{self, PodShape};
use serde_json::{json, Value};

/// The wave a node makes when its configuration turns reboots on without one.
const ONE_AT_A_TIME: &str = "one-at-a-time";

const ZONES: [&str; 3] = ["z1", "z2", "z3"];

struct Wave {
    admin: Api<RebootWave>,
    name: String,
}

impl Wave {
    async fn create(admin: Client, spec: Value) -> Wave {
        let admin: Api<RebootWave> = Api::all(admin);
        let name = realk8s::unique("ng-wave");
        let wave: RebootWave = serde_json::from_value(json!({
            "apiVersion": "nodegrace.dev/v1alpha1", "kind": "RebootWave",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap();
        admin.create(&PostParams::default(), &wave).await.unwrap();
        Wave { admin, name }
    }

    /// A wave of `node` alone (labelled for it), healthy after 3 s.
    async fn of_node(admin: Client, node: &str) -> Wave {
        let nodes: Api<Node> = Api::all(admin.clone());
        let label = json!({"metadata": {"labels": {"nodegrace-test/wave": node}}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(label))
            .await
            .unwrap();
        let spec = json!({
            "nodeSelector": {"matchLabels": {"nodegrace-test/wave": node}},
            "healthySeconds": 3,
        });
        Wave::create(admin, spec).await
    }

    async fn status(&self) -> Value {
        let wave = self.admin.get(&self.name).await.unwrap();
        serde_json::to_value(wave.status.unwrap_or_default()).unwrap()
    }

    async fn delete(&self) {
        let _ = self
            .admin
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

/// What the apiserver answered a node's write.
#[derive(Debug)]
enum Answer {
    Written,
    Refused(String),
}

/// Reads the wave and writes `change` of its status with the resourceVersion read, again on a
/// conflict: what a node does to join, take, renew or free.
async fn write(api: &Api<RebootWave>, name: &str, change: impl Fn(&mut Value)) -> Answer {
    loop {
        let wave = api.get(name).await.unwrap();
        let mut body = serde_json::to_value(&wave).unwrap();
        if body.get("status").is_none_or(Value::is_null) {
            body["status"] = json!({});
        }
        change(&mut body["status"]);
        let body: RebootWave = serde_json::from_value(body).unwrap();
        match api
            .replace_status(name, &PostParams::default(), &body)
            .await
        {
            Ok(_) => return Answer::Written,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => {
                return Answer::Refused(e.message)
            }
            Err(e) => panic!("writing wave {name}: {e}"),
        }
    }
}

fn push(status: &mut Value, list: &str, entry: Value) {
    let key = entry["node"].clone();
    let items = status[list].as_array().cloned().unwrap_or_default();
    let mut items: Vec<Value> = items.into_iter().filter(|e| e["node"] != key).collect();
    items.push(entry);
    status[list] = Value::Array(items);
}

fn remove(status: &mut Value, list: &str, node: &str) {
    if let Some(items) = status[list].as_array_mut() {
        items.retain(|e| e["node"] != node);
    }
}

fn slot(node: &str, zone: &str) -> Value {
    let now = jiff::Timestamp::now().to_string();
    json!({"node": node, "domain": zone, "phase": "Down", "bootId": "b", "taken": now, "renewTime": now})
}

fn held(status: &Value) -> Vec<(String, String)> {
    let mut held: Vec<(String, String)> = status["slots"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            (
                s["node"].as_str().unwrap().to_owned(),
                s["domain"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    held.sort();
    held
}

/// Six nodes of three zones race for slots of a wave of two, one a zone, then the same wave at
/// 50%: the apiserver grants what the limits allow and refuses the rest with the policy's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_racing_for_slots_get_no_more_than_the_wave_and_a_zone_allow() {
    if !realk8s::enabled(
        "realk8s_waves::nodes_racing_for_slots_get_no_more_than_the_wave_and_a_zone_allow",
    ) {
        return;
    }
    let cp = realk8s::running_control_plane().await;
    let admin = cp.admin().await;
    let wave = Wave::create(
        admin.clone(),
        json!({
            "nodeSelector": {"matchLabels": {"pool": "wave"}},
            "maxUnavailable": 2,
            "perDomain": {"topologyKey": "topology.kubernetes.io/zone", "maxUnavailable": 1},
        }),
    )
    .await;
    let prefix = realk8s::unique("ng-w");
    let nodes: Vec<(String, &str)> = (0..6)
        .map(|i| (format!("{prefix}-{i}"), ZONES[i % 3]))
        .collect();
    let mut apis = Vec::new();
    for (node, _) in &nodes {
        let client = realk8s::client_from(&cp.nodegrace_identity(node)).await;
        apis.push(Api::<RebootWave>::all(client));
    }

    // A policy applied a moment ago takes effect once the apiserver's informers caught up.
    let deadline = Instant::now() + Duration::from_secs(20);
    let intruder = loop {
        let answer = write(&apis[0], &wave.name, |s| {
            push(s, "slots", slot(&nodes[1].0, nodes[1].1))
        })
        .await;
        match answer {
            Answer::Refused(message) => break message,
            Answer::Written if Instant::now() < deadline => {
                write(&apis[0], &wave.name, |s| remove(s, "slots", &nodes[1].0)).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Answer::Written => panic!("a node wrote another node's slot"),
        }
    };
    assert!(
        intruder.contains("may only take, renew and free its own slot"),
        "{intruder}"
    );

    // A node makes no wave but the one of one node at a time, and that only as nodegrace
    // makes it (dry runs: the wave is the cluster's one).
    let other = realk8s::unique("ng-made");
    for (name, max, made) in [
        (ONE_AT_A_TIME, 1, true),
        (ONE_AT_A_TIME, 2, false),
        (other.as_str(), 1, false),
    ] {
        let made_by_node: RebootWave = serde_json::from_value(json!({
            "apiVersion": "nodegrace.dev/v1alpha1", "kind": "RebootWave",
            "metadata": {"name": name}, "spec": {"maxUnavailable": max},
        }))
        .unwrap();
        match (apis[0].create(&realk8s::dry::post(), &made_by_node).await, made) {
            (Ok(_), true) => {}
            (Err(kube::Error::Api(e)), false) if e.code == 422 || e.code == 403 => assert!(
                e.message.contains("may only update the status of a RebootWave, or make RebootWave one-at-a-time as nodegrace makes it"),
                "{}",
                e.message
            ),
            (other, _) => panic!("a node making wave {name} of {max}: {other:?}"),
        }
    }

    let joins = nodes.iter().zip(&apis).map(|((node, zone), api)| {
        let entry = json!({"node": node, "domain": zone});
        let name = wave.name.clone();
        async move { write(api, &name, |s| push(s, "members", entry.clone())).await }
    });
    for answer in futures::future::join_all(joins).await {
        assert!(matches!(answer, Answer::Written), "{answer:?}");
    }

    let takes = nodes.iter().zip(&apis).map(|((node, zone), api)| {
        let name = wave.name.clone();
        async move { write(api, &name, |s| push(s, "slots", slot(node, zone))).await }
    });
    let answers = futures::future::join_all(takes).await;
    let granted = answers
        .iter()
        .filter(|a| matches!(a, Answer::Written))
        .count();
    let status = wave.status().await;
    let slots = held(&status);
    assert_eq!(granted, 2, "{answers:?}");
    assert_eq!(slots.len(), 2, "{slots:?}");
    assert_ne!(slots[0].1, slots[1].1, "two slots in one zone: {slots:?}");
    for answer in &answers {
        if let Answer::Refused(message) = answer {
            assert!(
                message.contains("has 2 slots, all held")
                    || message.contains("has 1 slots, all held"),
                "{message}"
            );
        }
    }

    // A node takes back the slot of another (one that is gone): allowed, never the reverse
    // of adding one.
    let holder = slots[0].0.clone();
    let taker = nodes
        .iter()
        .position(|(n, _)| !slots.iter().any(|(h, _)| h == n))
        .unwrap();
    let answer = write(&apis[taker], &wave.name, |s| remove(s, "slots", &holder)).await;
    assert!(matches!(answer, Answer::Written), "{answer:?}");
    assert_eq!(held(&wave.status().await).len(), 1);

    // At 50% of six members and no zone limit, three slots.
    wave.admin
        .patch(
            &wave.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxUnavailable": "50%", "perDomain": null}})),
        )
        .await
        .unwrap();
    let mut answers = Vec::new();
    for ((node, zone), api) in nodes.iter().zip(&apis) {
        answers.push(write(api, &wave.name, |s| push(s, "slots", slot(node, zone))).await);
    }
    let status = wave.status().await;
    assert_eq!(held(&status).len(), 3, "{answers:?}");
    let refused: Vec<&String> = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Refused(m) => Some(m),
            Answer::Written => None,
        })
        .collect();
    assert!(!refused.is_empty());
    for message in refused {
        assert!(message.contains("has 3 slots, all held"), "{message}");
    }
    wave.delete().await;
}

/// What the CRD itself refuses from an operator: a limit of none, a window at 25:00.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_with_no_slot_or_a_window_past_midnight_is_refused() {
    if !realk8s::enabled("realk8s_waves::a_wave_with_no_slot_or_a_window_past_midnight_is_refused")
    {
        return;
    }
    let cp = realk8s::running_control_plane().await;
    let admin: Api<RebootWave> = Api::all(cp.admin().await);
    for (spec, says) in [
        (
            json!({"nodeSelector": {}, "maxUnavailable": "0%"}),
            "maxUnavailable is a count of 1 or more or a percentage",
        ),
        (
            json!({"nodeSelector": {}, "windows": [{"start": "25:00", "end": "04:00"}]}),
            "spec.windows[0].start",
        ),
    ] {
        let wave: RebootWave = serde_json::from_value(json!({
            "apiVersion": "nodegrace.dev/v1alpha1", "kind": "RebootWave",
            "metadata": {"name": realk8s::unique("ng-bad-wave")}, "spec": spec,
        }))
        .unwrap();
        match admin.create(&realk8s::dry::post(), &wave).await {
            Err(kube::Error::Api(e)) if e.code == 422 => {
                assert!(e.message.contains(says), "{}", e.message)
            }
            other => panic!("expected 422 for {spec}, got {other:?}"),
        }
    }
}

/// One node of a wave on the real control plane, with real logind: the sentinel makes it
/// taint itself, take its slot and ask logind to reboot; the shutdown drains it; after the
/// boot the slot goes once the node is healthy for the wave's healthy time, and the taint
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_needing_a_reboot_takes_its_turn_reboots_and_frees_its_slot_once_healthy() {
    if !realk8s::enabled("realk8s_waves::a_node_needing_a_reboot_takes_its_turn_reboots_and_frees_its_slot_once_healthy") {
        return;
    }
    let mut f = Fixture::new("ng-wave-node").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    let nodes: Api<Node> = Api::all(c.clone());
    let wave = Wave::of_node(c.clone(), &node).await;
    workload::deployment(c, &ns, &node, 1, PodShape::new("web")).await;
    f.kubelet.wait_running(1).await;
    f.node.boot_connected();
    let booted = f.node.boot_id();
    // The sentinel as a reload sets it (reboot.sentinel, read at each look).
    reload_with(f.node.container(), "sentinel = \"/run/wave-test-sentinel\"");
    let _ = f
        .node
        .container()
        .exec(&["touch", "/run/wave-test-sentinel"]);
    let down = rebooted(&mut f.node);
    let journal = journal_lines(&down);
    for said in [
        "joined the reboot wave",
        "taint the node reboot-pending",
        "took a slot of the reboot wave: rebooting",
        "shutdown delay inhibitor released",
    ] {
        assert!(journal.contains(said), "{said:?} not in:\n{journal}");
    }
    let first = wave.status().await;
    assert_eq!(held(&first), [(node.clone(), String::new())]);
    let first_boot = first["slots"][0]["bootId"].clone();

    // The kubelet went down with the node. The node is back before it: the Node still
    // says Ready as the kubelet of the last boot reported it (the node lifecycle controller
    // waits 40 s), which does not count, so the slot stays past the healthy time.
    f.kubelet.stop();
    f.node.boot_connected();
    let rebooted_into = f.node.boot_id();
    assert_ne!(rebooted_into, booted);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let journal = journal_lines(f.node.container());
    assert_eq!(
        held(&wave.status().await),
        [(node.clone(), String::new())],
        "the slot went before the kubelet of the new boot reported:\n{journal}"
    );
    assert!(
        !journal.contains("healthy again after the reboot"),
        "{journal}"
    );
    f.restart_kubelet().await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = wave.status().await;
        let n = nodes.get(&node).await.unwrap();
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "nodegrace.dev/reboot-pending"));
        let cordoned = n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if status["slots"].as_array().is_none_or(Vec::is_empty) && !tainted && !cordoned {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot was not freed after the boot: {status}\n{}",
            journal_lines(f.node.container())
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let journal = journal_lines(f.node.container());
    for said in [
        "back after the reboot",
        "healthy again after the reboot",
        "freed the slot",
    ] {
        assert!(journal.contains(said), "{said:?} not in:\n{journal}");
    }
    wave_history_as_a_viewer(&f, &wave.name);

    // A sentinel command as a reload sets it: exit status 1, a reboot is needed.
    reload_with(
        f.node.container(),
        "sentinel_command = [\"sh\", \"-c\", \"exit 1\"]",
    );
    let _ = rebooted(&mut f.node);
    let slots = wave.status().await["slots"].clone();
    assert_eq!(slots[0]["node"], json!(node), "{slots}");
    assert_ne!(
        slots[0]["bootId"], first_boot,
        "{slots}: taken in the first boot"
    );
    wave.delete().await;

    // No wave selects the node any more; its configuration turns reboots on without one
    // (reboot.without_wave, as a reload sets it). An operator asks (`nodegrace reboot`) and
    // the daemon crashes at once: the unit restarts it with the ask kept. It makes the wave
    // of one node at a time, takes its one slot and reboots.
    let waves: Api<RebootWave> = Api::all(c.clone());
    let _ = waves.delete(ONE_AT_A_TIME, &DeleteParams::default()).await;
    f.restart_kubelet().await;
    f.node.boot_connected();
    reload_with(f.node.container(), "without_wave = true");
    let out = f.node.container().exec(&[
        "sh",
        "-c",
        "nodegrace reboot && systemctl kill -s KILL nodegrace",
    ]);
    assert!(out.status.success(), "{out:?}");
    let down = rebooted(&mut f.node);
    let journal = journal_lines(&down);
    let whole = down.journal_text();
    assert!(
        whole
            .lines()
            .any(|l| l.contains("nodegrace.service") && l.contains("Scheduled restart job")),
        "the daemon was not restarted:\n{whole}"
    );
    assert!(
        journal.contains("made the reboot wave of one node at a time"),
        "{journal}"
    );
    let alone = waves.get(ONE_AT_A_TIME).await.unwrap();
    let spec = serde_json::to_value(&alone.spec).unwrap();
    assert_eq!(
        spec,
        json!({"maxUnavailable": 1, "healthySeconds": 300, "rebootBudgetSeconds": 1800})
    );
    let slots = serde_json::to_value(alone.status.unwrap_or_default()).unwrap();
    assert_eq!(held(&slots), [(node.clone(), String::new())]);
    let _ = waves.delete(ONE_AT_A_TIME, &DeleteParams::default()).await;
    f.cleanup().await;
}

/// The fleet-wide request: an operator sets the wave's `rebootRequestedAt`; the node, booted
/// before it and with no sentinel, takes its turn and reboots; back and healthy, it frees its
/// slot and is not asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_asked_to_reboot_reboots_its_node_once_without_a_sentinel() {
    if !realk8s::enabled(
        "realk8s_waves::a_wave_asked_to_reboot_reboots_its_node_once_without_a_sentinel",
    ) {
        return;
    }
    let mut f = Fixture::new("ng-wave-ask").await;
    let (c, node) = (f.admin.clone(), f.name.clone());
    let wave = Wave::of_node(c.clone(), &node).await;
    f.node.boot_connected();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        wave.status().await["slots"].is_null(),
        "a slot taken with nothing asking for a reboot"
    );
    let asked = jiff::Timestamp::now().to_string();
    wave.admin
        .patch(
            &wave.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rebootRequestedAt": asked}})),
        )
        .await
        .unwrap();
    let down = rebooted(&mut f.node);
    let journal = journal_lines(&down);
    assert!(
        journal.contains("took a slot of the reboot wave: rebooting"),
        "{journal}"
    );
    f.kubelet.stop();
    f.node.boot_connected();
    f.restart_kubelet().await;
    let deadline = Instant::now() + Duration::from_secs(90);
    while !wave.status().await["slots"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        assert!(
            Instant::now() < deadline,
            "the slot was not freed after the boot:\n{}",
            journal_lines(f.node.container())
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Booted after the request: not asked again (a look every 2 s).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let status = wave.status().await;
    assert!(
        status["slots"].as_array().is_none_or(Vec::is_empty),
        "asked again after its reboot: {status}"
    );
    let member = &status["members"][0];
    assert_eq!(member["node"], json!(node), "{status}");
    assert!(member.get("waiting").is_none(), "{status}");
    wave.delete().await;
    f.cleanup().await;
}

/// `nodegrace history --wave` as an operator with the packaged `nodegrace-viewer` only: the
/// node's turn from its Events, slot taken to freed.
fn wave_history_as_a_viewer(f: &Fixture, wave: &str) {
    let viewer = f.cp.viewer(&format!("viewer-{}", f.name));
    viewer.bind();
    let node = &f.name;
    let turn = format!("  {node}: ");
    // RBAC's cache follows the binding; the Events are written in the background.
    let told = real::wait_until(
        "history --wave to tell the node's turn",
        Duration::from_secs(30),
        || {
            let (ok, out, _) = tokio::task::block_in_place(|| viewer.history(&["--wave", wave]));
            (ok && out
                .lines()
                .any(|l| l.starts_with(&turn) && l.ends_with(" s)")))
            .then_some(out)
        },
    );
    for said in [
        format!("RebootWave {wave}: 1 members; slots held: none"),
        format!("{node}  took a slot of RebootWave {wave}: draining, then rebooting"),
        format!(
            "{node}  healthy for RebootWave {wave}'s healthy time after the reboot: freed the slot"
        ),
        "turns (slot taken to freed):".to_owned(),
    ] {
        assert!(told.contains(&said), "{said:?} not in:\n{told}");
    }
}

fn journal_lines(c: &real::Container) -> String {
    c.journal_of("nodegrace")
        .iter()
        .map(|l| l.text.clone())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the node's container exits asking to be rebooted (systemd-nspawn's 133);
/// returns it, for its journal.
fn rebooted(node: &mut realk8s::node::TestNode) -> real::Container {
    let mut down = node.container.take().expect("node is running");
    let status = down
        .wait_exit(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("the node did not reboot:\n{}", down.journal_text()));
    assert_eq!(
        status.code(),
        Some(133),
        "systemd-nspawn exited with {status}"
    );
    down
}

/// Writes a `[reboot]` drop-in with `line` and reloads nodegrace, waiting until it did.
fn reload_with(c: &real::Container, line: &str) {
    let script = format!(
        "mkdir -p /etc/nodegrace/config.d && printf '[reboot]\\n%s\\n' '{line}' > /etc/nodegrace/config.d/50-wave-test.toml && systemctl reload nodegrace"
    );
    let reloads = || journal_lines(c).matches("configuration reloaded").count();
    let before = reloads();
    let out = c.exec(&["sh", "-c", &script]);
    assert!(out.status.success(), "{out:?}");
    real::wait_until(
        "the configuration reloaded",
        Duration::from_secs(20),
        || (reloads() > before).then_some(()),
    );
}
