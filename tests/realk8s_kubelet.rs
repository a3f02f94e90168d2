//! The real-kubelet tier: nodegrace in a booted Debian node (real logind, the repository's
//! unit, the shipped configuration unchanged) beside a real kubelet v1.28.4 with its own
//! containerd (`../shared/realk8s/kubelet-up.sh`), against the real control plane. The
//! kubelet runs on the host (see `realk8s/real_kubelet.rs` for why and how the node is wired
//! to it); the pods are real busybox containers that exit a set time after SIGTERM.
//! Asserted from the apiserver's audit log (nodegrace's and the kubelet's requests), the
//! objects it holds, the runtime's containers and the node's journal.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`). Each test has its own
//! node name, kubelet port and containerd, so they run side by side; none stops the shared
//! apiserver (the offline test cuts its own node off through a proxy of its own).

mod real;
mod realk8s;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use nodegrace::v1 as cri;
use realk8s::audit::{self, Request};
use realk8s::faults::wait_pod_cache;
use realk8s::fixture::*;
use realk8s::node::SystemBus;
use realk8s::real_kubelet::{
    self as rk, containers, first, is_eviction, is_pod_delete, stopped, ApiProxy, Ctr, PodWatch,
    RealFixture,
};
use realk8s::stand_in_logind::StandInLogind;
use realk8s::workload::{self, PodShape};
use serde_json::Value;

fn skip(test: &str) -> bool {
    if !realk8s::enabled(&format!("realk8s_kubelet::{test}")) {
        return true;
    }
    real::require_prerequisites();
    false
}

/// When logind announced the shutdown (poweroff or reboot) and when nodegrace released.
fn signal_and_release_of(c: &real::Container) -> (f64, f64) {
    let logind = c.journal_of("systemd-logind");
    let signal = logind
        .iter()
        .find(|l| l.contains("The system will"))
        .unwrap_or_else(|| panic!("logind never announced the shutdown:\n{}", c.journal_text()))
        .time;
    let release = c
        .journal_of("nodegrace")
        .iter()
        .find(|l| l.contains("phase change") && l.field("PHASE") == Some("Released"))
        .unwrap_or_else(|| panic!("nodegrace never released:\n{}", c.journal_text()))
        .time;
    (signal, release)
}

/// The Deployments of the real-kubelet tests on `node`: band 0 `web` ×2 and `slow` (ignores
/// SIGTERM past its 3 s grace period: the kubelet kills it at 3 s), band 1 `crit`.
async fn two_bands(c: &kube::Client, ns: &str, node: &str) {
    let real = |app| PodShape::new(app).on_real_kubelet();
    workload::deployment(c, ns, node, 2, real("web").exits_after_ms(300)).await;
    workload::deployment(c, ns, node, 1, real("slow").exits_after_ms(60_000).grace(3)).await;
    let crit = real("crit").priority("system-cluster-critical");
    workload::deployment(c, ns, node, 1, crit.exits_after_ms(300)).await;
}

/// Waits until the kubelet's log (new at each start) says it cannot use `file` of its
/// staticPodPath.
fn kubelet_refuses(kubelet: &rk::RealKubelet, file: &str, when: &str) {
    real::wait_until(
        &format!("the kubelet refusing {file} {when}"),
        Duration::from_secs(30),
        || {
            kubelet
                .log()
                .lines()
                .any(|l| l.contains(file) && l.contains("manifest"))
                .then_some(())
        },
    );
}

/// (a) `systemctl poweroff` on a node run by the real kubelet: Deployment pods in two
/// priority bands evicted (never DELETEd) and stopped by the kubelet with their own grace
/// period, band after band; then the DaemonSet pod (DELETEd with its own grace); then the
/// static pod, whose manifest is gated out of the kubelet's staticPodPath so the kubelet
/// stops it and deletes its mirror pod; the inhibitor released right after the kubelet's
/// last deletion. After the reboot nodegrace completes the maintenance: the manifest is
/// back byte for byte and the kubelet runs it again, mirror pod included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poweroff_drains_a_real_kubelet_node_band_by_band_and_the_boot_restores_its_static_pod() {
    if skip("poweroff_drains_a_real_kubelet_node_band_by_band_and_the_boot_restores_its_static_pod")
    {
        return;
    }
    let mut f = RealFixture::new("ng-rka", "", false).await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    let watch = PodWatch::start(c, &ns);
    let real = |app| PodShape::new(app).on_real_kubelet();
    two_bands(c, &ns, &node).await;
    workload::daemonset(c, &ns, &node, false, real("agent").exits_after_ms(300)).await;
    workload::static_pod(
        &f.kubelet.manifests(),
        &ns,
        real("etcd").exits_after_ms(300),
    );
    let manifest = std::fs::read(f.kubelet.manifests().join("etcd.yaml")).expect("manifest");
    // Two files the kubelet refuses beside it: gated last, restored byte for byte.
    let refused: [(&str, &[u8]); 2] = [
        (
            "broken.yaml",
            b"apiVersion: v1\nkind: Pod\nmetadata: [name: x\n",
        ),
        (
            "not-a-pod.yaml",
            b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: not-a-pod\ndata: {a: b}\n",
        ),
    ];
    for (file, bytes) in refused {
        std::fs::write(f.kubelet.manifests().join(file), bytes).expect("a refused file");
    }
    let apps = [
        ("web", 2),
        ("slow", 1),
        ("crit", 1),
        ("agent", 1),
        ("etcd", 1),
    ];
    let originals = rk::wait_running(c, &ns, &node, &apps, Duration::from_secs(90)).await;
    let mirror = format!("etcd-{node}");
    for (file, _) in refused {
        kubelet_refuses(&f.kubelet, file, "before the shutdown");
    }
    let on_node = rk::NodeGone::start(&f.kubelet);
    f.node.boot_connected();
    // The node sees the kubelet's volume mounts, as a real node does: nodegrace's view of
    // when a band has left the node is in force.
    let mounts = f.node.container().run(&["cat", "/proc/self/mountinfo"]);
    let kubelet_root = realk8s::node::shipped_value("drain", "kubelet_root_dir");
    for p in originals.iter().filter(|p| app_of(p) == "web") {
        let volumes = format!(
            "{kubelet_root}/pods/{}/volumes/",
            p.uid().unwrap_or_default()
        );
        assert!(
            mounts.contains(&volumes),
            "the node does not see {}'s volume mounts:\n{mounts}",
            p.name_any()
        );
    }

    let container = f.node.shutdown("poweroff", Duration::from_secs(120));
    let (signal, release) = signal_and_release_of(&container);
    let ours = f.nodegrace_requests();
    let kubelets = f.kubelet_requests();
    let journal = container.journal_text();
    let context = || {
        format!(
            "nodegrace: {:#?}\nkubelet: {:#?}\njournal:\n{journal}\nkubelet log:\n{}",
            audit::count_by_kind(&ours),
            audit::count_by_kind(&kubelets),
            f.kubelet.log_tail()
        )
    };

    // How each original pod was asked to go (nodegrace's request, or the gate for the
    // static pod) and when the kubelet's final DELETE of it completed.
    let gated = container
        .journal_of("nodegrace")
        .iter()
        .find(|l| l.contains("static pod manifest gated"))
        .unwrap_or_else(|| panic!("the static pod was not gated\n{}", context()))
        .time;
    // The refused files: out of the staticPodPath, after every pod (there is no priority
    // to order them by) and before the release.
    let refused_gated: Vec<f64> = container
        .journal_of("nodegrace")
        .iter()
        .filter(|l| l.contains("gated a file the kubelet refuses"))
        .map(|l| l.time)
        .collect();
    assert_eq!(
        refused_gated.len(),
        2,
        "the refused files were not gated\n{}",
        context()
    );
    for (file, bytes) in refused {
        assert!(
            !f.kubelet.manifests().join(file).exists(),
            "{file} is still in the staticPodPath\n{}",
            context()
        );
        assert_eq!(
            std::fs::read(f.node.state.join("gated-manifests").join(file)).expect("gated"),
            bytes,
            "{file} changed when it was gated"
        );
    }
    let mut asked: BTreeMap<String, f64> = BTreeMap::new();
    let mut gone: BTreeMap<String, f64> = BTreeMap::new();
    for p in &originals {
        let name = p.name_any();
        let app = app_of(p);
        let ask = match app.as_str() {
            "etcd" => gated,
            "agent" => {
                first(&ours, &name, is_pod_delete)
                    .unwrap_or_else(|| panic!("{name} was not DELETEd by nodegrace\n{}", context()))
                    .received
            }
            _ => {
                assert!(
                    first(&ours, &name, is_pod_delete).is_none(),
                    "nodegrace DELETEd {name}, which nothing blocks\n{}",
                    context()
                );
                first(&ours, &name, is_eviction)
                    .unwrap_or_else(|| panic!("{name} was not evicted\n{}", context()))
                    .received
            }
        };
        let done = stopped(&kubelets, &ours, &name, &mirror)
            .unwrap_or_else(|| panic!("the kubelet never stopped {name}\n{}", context()));
        assert!(
            done > ask,
            "{name}: stopped before it was asked to go\n{}",
            context()
        );
        asked.insert(name.clone(), ask);
        gone.insert(name, done);
    }
    // Their own grace period, from what the apiserver recorded when each began terminating;
    // the mirror pod is the kubelet's to delete at once.
    let seen = watch.seen();
    for p in originals.iter().filter(|p| p.name_any() != mirror) {
        let s = &seen[&p.uid().unwrap_or_default()];
        assert_eq!(
            s.deletion_grace,
            s.termination_grace,
            "{}: deleted with grace {:?}, its own is {:?}\n{}",
            s.name,
            s.deletion_grace,
            s.termination_grace,
            context()
        );
    }
    for p in &originals {
        let name = p.name_any();
        let took = gone[&name] - asked[&name];
        match app_of(p).as_str() {
            // Killed by the kubelet at its 3 s grace period: not earlier, and long before it
            // would exit (60 s) or a default 30 s grace would end (a loaded machine: 6 s).
            "slow" => assert!(
                (3.0..15.0).contains(&took),
                "{name} gone {took:.2} s after its eviction (grace 3 s)\n{}",
                context()
            ),
            // Exited 0.3 s after SIGTERM, far inside its 30 s grace (the static pod once the
            // kubelet looked at its staticPodPath again: every second).
            _ => assert!(
                took < 5.0,
                "{name} gone {took:.2} s after it was asked\n{}",
                context()
            ),
        }
    }
    // Band after band: nothing of a band is asked before the previous band has left the node
    // (its containers exited, its volumes unmounted: polled every 50 ms), which the node
    // knows before the kubelet's status write or DELETE shows it in the API.
    let band = |app: &str| match app {
        "web" | "slow" => 0,
        "crit" => 1,
        "agent" => 2,
        "etcd" => 3,
        other => panic!("no band for {other}"),
    };
    let node_uid = |p: &Pod| {
        p.annotations()
            .get("kubernetes.io/config.mirror")
            .cloned()
            .unwrap_or_else(|| p.uid().unwrap_or_default())
    };
    for b in 1..=3 {
        let before: Vec<&Pod> = originals
            .iter()
            .filter(|p| band(&app_of(p)) == b - 1)
            .collect();
        let api_gone = before
            .iter()
            .map(|p| gone[&p.name_any()])
            .fold(0f64, f64::max);
        let node_gone = before
            .iter()
            .map(|p| {
                on_node.gone(&node_uid(p)).unwrap_or_else(|| {
                    panic!("{} never left the node\n{}", p.name_any(), context())
                })
            })
            .fold(0f64, f64::max);
        let first_of = originals
            .iter()
            .filter(|p| band(&app_of(p)) == b)
            .map(|p| asked[&p.name_any()])
            .fold(f64::MAX, f64::min);
        eprintln!(
            "band {b}: band {} left the node at {:.3}, the API showed it at {:.3}; band {b} asked at {:.3} ({:+.3} s from the node, {:+.3} s from the API)",
            b - 1,
            node_gone - signal,
            api_gone - signal,
            first_of - signal,
            first_of - node_gone,
            first_of - api_gone,
        );
        assert!(
            first_of >= node_gone - 0.1,
            "band {b} asked {:.3} s before band {} left the node\n{}",
            node_gone - first_of,
            b - 1,
            context()
        );
    }
    // The mirror pod: deleted by nodegrace only once the node showed the static pod gone
    // (or by the kubelet's housekeeping, when it came first).
    let etcd_on_node = originals
        .iter()
        .find(|p| p.name_any() == mirror)
        .map(node_uid)
        .and_then(|uid| on_node.gone(&uid))
        .unwrap_or_else(|| panic!("the static pod never left the node\n{}", context()));
    let mirror_deletes: Vec<&Request> = ours
        .iter()
        .filter(|r| r.name == mirror && r.verb == "delete" && r.resource == "pods")
        .collect();
    for d in &mirror_deletes {
        assert!(
            d.received >= etcd_on_node - 0.1,
            "nodegrace deleted the mirror pod {:.3} s before the static pod left the node\n{}",
            etcd_on_node - d.received,
            context()
        );
    }
    eprintln!(
        "the static pod left the node at {:.3}; the mirror pod deleted at {:.3} by {}",
        etcd_on_node - signal,
        gone[&mirror] - signal,
        if mirror_deletes.iter().any(|d| d.code == 200) {
            "nodegrace"
        } else {
            "the kubelet"
        }
    );
    // Released right after the kubelet's last deletion (the mirror pod's: it is the last
    // to stop). Between the two nodegrace writes the drain's end onto the maintenance (it
    // waits for those answers); the rest is its own reaction time.
    let last = gone.values().copied().fold(0f64, f64::max);
    assert_eq!(
        last,
        gone[&mirror],
        "the mirror pod was not the last to go\n{}",
        context()
    );
    for at in &refused_gated {
        assert!(
            *at >= gated && *at <= release,
            "a refused file was gated at {at:.3}, not between the static pod's gate ({gated:.3}) and the release ({release:.3})\n{}",
            context()
        );
    }
    let lag = release - last;
    // The part of [last deletion, release] spent waiting on those writes.
    let writes: f64 = ours
        .iter()
        .filter(|r| r.resource == "nodemaintenances" && r.subresource == "status")
        .map(|r| (r.completed.min(release) - r.received.max(last)).max(0.0))
        .sum();
    eprintln!(
        "real kubelet poweroff: signal -> release {:.3} s; the kubelet's last deletion -> release {lag:.3} s, of which the apiserver answering nodegrace's status writes {writes:.3} s",
        release - signal,
    );
    assert!(
        (0.0..=2.0).contains(&lag) && lag - writes <= 0.5,
        "released {lag:.3} s after the kubelet's last deletion ({writes:.3} s of it in nodegrace's requests)\n{}",
        context()
    );
    audit::assert_allowed_by_cluster_role(&ours);

    // The reboot: the machine's containers go, the kubelet comes back, then the node.
    f.restart_kubelet().await;
    f.node.boot();
    wait_maintenance(
        c,
        &format!("shutdown-{node}"),
        "completed after the boot",
        Duration::from_secs(60),
        |m| m.spec.stage == nodegrace::Stage::Complete && !has_finalizer(m),
    )
    .await;
    wait_node(c, &node, "uncordoned", |n| {
        !cordoned(n) && !maintenance_tainted(n)
    })
    .await;
    assert_eq!(
        std::fs::read(f.kubelet.manifests().join("etcd.yaml")).expect("the manifest is back"),
        manifest,
        "the restored manifest differs"
    );
    for (file, bytes) in refused {
        assert_eq!(
            std::fs::read(f.kubelet.manifests().join(file))
                .unwrap_or_else(|e| panic!("{file} is not back: {e}")),
            bytes,
            "{file} came back changed"
        );
    }
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let old_uid = originals
        .iter()
        .find(|p| p.name_any() == mirror)
        .and_then(|p| p.uid());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let back = pods.get_opt(&mirror).await.ok().flatten();
        let running = back.as_ref().is_some_and(|p| {
            p.uid() != old_uid
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        });
        if running {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the kubelet does not run the restored static pod: {back:#?}\n{}",
            f.kubelet.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The kubelet refuses the restored files as it refused them before, and runs no pod
    // from them.
    for (file, _) in refused {
        kubelet_refuses(&f.kubelet, file, "after the restore");
    }
    let all = pods.list(&Default::default()).await.expect("pods");
    assert!(
        !all.items
            .iter()
            .any(|p| p.name_any().starts_with("not-a-pod") || p.name_any().starts_with("x-")),
        "a pod from a refused file: {:?}",
        all.items.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    drop(f.node.container.take());
    f.kubelet.down();
    f.cleanup().await;
}

/// (d) A node `kubectl drain` already emptied and cordoned (kured's way) before `systemctl
/// reboot`: nodegrace has nothing to evict and releases at once; after the boot it
/// completes its maintenance without uncordoning the node it did not cordon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_kubectl_drained_before_the_reboot_is_released_at_once_and_stays_cordoned() {
    if skip("a_node_kubectl_drained_before_the_reboot_is_released_at_once_and_stays_cordoned") {
        return;
    }
    let mut f = RealFixture::new("ng-rkd", "", false).await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    let real = |app| PodShape::new(app).on_real_kubelet();
    workload::deployment(c, &ns, &node, 2, real("web").exits_after_ms(300)).await;
    workload::deployment(
        c,
        &ns,
        &node,
        1,
        real("crit")
            .priority("system-cluster-critical")
            .exits_after_ms(300),
    )
    .await;
    rk::wait_running(
        c,
        &ns,
        &node,
        &[("web", 2), ("crit", 1)],
        Duration::from_secs(90),
    )
    .await;
    f.node.boot();

    let cp = f.cp;
    let drained = node.clone();
    let out = tokio::task::spawn_blocking(move || {
        cp.kubectl(&[
            "drain",
            &drained,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=60s",
        ])
    })
    .await
    .expect("kubectl drain");
    assert!(
        out.status.success(),
        "kubectl drain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(rk::live_pods(c, &ns, &node).await.is_empty());
    let drained_at = realk8s::now_unix();

    let container = f.node.shutdown("reboot", Duration::from_secs(60));
    let (signal, release) = signal_and_release_of(&container);
    let ours: Vec<Request> = f
        .nodegrace_requests()
        .into_iter()
        .filter(|r| r.received >= drained_at)
        .collect();
    eprintln!(
        "real kubelet, node drained by kubectl: signal -> release {:.3} s",
        release - signal
    );
    // Held to its 60 s budget it would be a minute; a few writes to a real apiserver first.
    assert!(
        release - signal < 3.0,
        "released {:.3} s after the signal on an empty node\n{}",
        release - signal,
        container.journal_text()
    );
    assert!(
        !ours
            .iter()
            .any(|r| r.resource == "pods" && (r.verb == "delete" || r.subresource == "eviction")),
        "nodegrace evicted or deleted pods on an empty node: {:#?}",
        audit::count_by_kind(&ours)
    );

    f.restart_kubelet().await;
    f.node.boot();
    wait_maintenance(
        c,
        &format!("shutdown-{node}"),
        "completed after the boot",
        Duration::from_secs(60),
        |m| m.spec.stage == nodegrace::Stage::Complete && !has_finalizer(m),
    )
    .await;
    // Its own marks go; the cordon, which was kubectl's, stays.
    wait_node(c, &node, "nodegrace's taint gone", |n| {
        !maintenance_tainted(n)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n = wait_node(c, &node, "the node", |_| true).await;
    assert!(
        cordoned(&n),
        "nodegrace uncordoned a node kubectl had cordoned\n{}",
        f.node.container().journal_text()
    );
    drop(f.node.container.take());
    f.kubelet.down();
    f.cleanup().await;
}

/// What became of a pod stopped by the offline fallback, after the reboot.
#[derive(Debug, PartialEq)]
enum AfterReboot {
    /// Failed with the status of the kubelet's graceful shutdown (`DisruptionTarget`/
    /// `TerminationByKubelet`; reason `Terminated` unless the kubelet's next status write
    /// replaced it), not run again.
    ShutdownStatus,
    /// Run again by the kubelet, in containers started in this boot.
    RunAgain,
    /// Run again by the kubelet, then stopped when the shutdown status reached it: Failed
    /// with `DisruptionTarget`/`TerminationByKubelet` (the kubelet's own write replaced
    /// the reason), its container restarted and ended.
    RunAgainThenStopped,
    Gone,
    /// Anything else (not settled yet, or wrong), with the status.
    Other(String),
}

fn after_reboot(
    status: Option<k8s_openapi::api::core::v1::PodStatus>,
    rebooted: f64,
) -> AfterReboot {
    let Some(status) = status else {
        return AfterReboot::Gone;
    };
    let containers = status.container_statuses.clone().unwrap_or_default();
    let running = containers
        .iter()
        .any(|cs| cs.state.as_ref().is_some_and(|s| s.running.is_some()));
    let of_this_boot = |cs: &k8s_openapi::api::core::v1::ContainerStatus| {
        let state = cs.state.clone().unwrap_or_default();
        let started = state
            .running
            .and_then(|r| r.started_at)
            .or_else(|| state.terminated.and_then(|t| t.started_at));
        started.is_some_and(|t| t.0.as_second() as f64 >= rebooted.floor())
    };
    let restarted = !containers.is_empty() && containers.iter().all(of_this_boot);
    let disrupted = status.conditions.iter().flatten().any(|c| {
        c.type_ == "DisruptionTarget"
            && c.status == "True"
            && c.reason.as_deref() == Some("TerminationByKubelet")
    });
    match status.phase.as_deref() {
        Some("Failed") if disrupted && !running && !restarted => AfterReboot::ShutdownStatus,
        Some("Failed") if disrupted && !running && restarted => AfterReboot::RunAgainThenStopped,
        Some("Running") if running && restarted => AfterReboot::RunAgain,
        _ => AfterReboot::Other(format!("{status:?}")),
    }
}

/// (b) The apiserver unreachable from the node at `systemctl poweroff` (its kubeconfigs and
/// the kubelet's go through a proxy the test closes; the shared apiserver keeps running):
/// after `fallback.apiserver_timeout` nodegrace stops the node's kubelet unit, and so the
/// real kubelet, then stops the kubelet's containers through its containerd, band by band
/// with each pod's grace; no container runs or was restarted afterwards. After the reboot
/// (the apiserver reachable again, the kubelet back and running the pods again, as it does
/// with what the apiserver still has as Running) the maintenance records what the fallback
/// did, and nodegrace leaves the pods the kubelet runs again as the kubelet reported them
/// (a Failed status would make the kubelet stop them a second time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_apiserver_at_poweroff_stops_the_real_kubelet_and_its_containers_by_band() {
    if skip(
        "an_unreachable_apiserver_at_poweroff_stops_the_real_kubelet_and_its_containers_by_band",
    ) {
        return;
    }
    let mut f = RealFixture::new("ng-rkb", "", true).await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    two_bands(c, &ns, &node).await;
    let apps = [("web", 2), ("slow", 1), ("crit", 1)];
    let originals = rk::wait_running(c, &ns, &node, &apps, Duration::from_secs(90)).await;
    f.node.boot();
    wait_pod_cache(&f.node.state, 4);
    let endpoint = format!("unix://{}", f.kubelet.dir.join("containerd.sock").display());

    let port = f.proxy.as_ref().expect("proxy").port;
    f.proxy.as_mut().expect("proxy").close();
    let mut c1 = f.node.container.take().expect("booted");
    let _ = c1.exec(&["systemctl", "poweroff"]);
    c1.wait_exit(Duration::from_secs(150))
        .unwrap_or_else(|| panic!("no poweroff:\n{}", c1.journal_text()));
    let journal = c1.journal_text();
    assert!(
        c1.journal_of("nodegrace")
            .iter()
            .any(|l| l.contains("draining locally")),
        "{journal}"
    );
    // A watch retrying against the closed port is no answer: the fallback is not handed
    // back to a drain through the apiserver (nor the kubelet started again).
    assert!(
        !c1.journal_of("nodegrace")
            .iter()
            .any(|l| l.contains("apiserver reachable again")),
        "{journal}"
    );
    let kubelet_stopped = f
        .kubelet
        .stopped_by_unit()
        .unwrap_or_else(|| panic!("the kubelet unit was never stopped\n{journal}"));
    assert!(!f.kubelet.running(), "the kubelet still runs");
    let ctrs = containers(&endpoint).await;
    let of = |app: &str| -> Vec<&Ctr> {
        ctrs.iter()
            .filter(|c| c.pod.starts_with(&format!("{app}-")))
            .collect()
    };
    let context = || format!("containers: {ctrs:#?}\njournal:\n{journal}");
    for p in &originals {
        let mine: Vec<&Ctr> = ctrs.iter().filter(|c| c.pod == p.name_any()).collect();
        assert_eq!(mine.len(), 1, "{}: {mine:?}\n{}", p.name_any(), context());
        assert_eq!(mine[0].attempt, 0, "restarted: {mine:?}");
        assert_eq!(
            mine[0].state,
            cri::ContainerState::ContainerExited as i32,
            "{} was not stopped\n{}",
            p.name_any(),
            context()
        );
        assert!(
            mine[0].finished > kubelet_stopped,
            "{} stopped before the kubelet was\n{}",
            p.name_any(),
            context()
        );
    }
    // Band 0 (priority 0, 60 s) together: web exits at 0.3 s, slow is killed at its own 3 s;
    // band 1 (system-cluster-critical) only after.
    let web_end = of("web").iter().map(|c| c.finished).fold(0f64, f64::max);
    let slow_end = of("slow")[0].finished;
    let crit_end = of("crit")[0].finished;
    assert!(
        (2.0..5.0).contains(&(slow_end - web_end)),
        "slow stopped {:.2} s after web (its grace is 3 s)\n{}",
        slow_end - web_end,
        context()
    );
    assert!(
        crit_end > slow_end,
        "band 1 ended before band 0\n{}",
        context()
    );
    assert!(crit_end - slow_end < 3.0, "{}", context());
    let (signal, release) = signal_and_release_of(&c1);
    eprintln!(
        "real kubelet, apiserver unreachable: signal -> kubelet stopped {:.3} s, -> release {:.3} s",
        kubelet_stopped - signal,
        release - signal
    );

    // The reboot: the apiserver reachable again, the kubelet back. The kubelet runs again
    // what the apiserver still has as Running; here it has done so for every pod before
    // nodegrace starts (a race otherwise: see docs/install.md), so nodegrace must leave their
    // status as the kubelet reported it, not mark them Failed for the kubelet to stop again.
    f.proxy = Some(ApiProxy::open(port));
    f.restart_kubelet().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let snapshot = || async {
        let now: Vec<Pod> = pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        originals
            .iter()
            .map(|o| {
                let status = now
                    .iter()
                    .find(|p| p.uid() == o.uid())
                    .and_then(|p| p.status.clone());
                (o.name_any(), after_reboot(status, release))
            })
            .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = snapshot().await;
        if now.iter().all(|(_, s)| *s == AfterReboot::RunAgain) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the kubelet did not run the pods again after the reboot: {now:#?}\n{}",
            f.kubelet.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let booted = realk8s::now_unix();
    f.node.boot();
    let report: Value = completed_with_fallback_report(c, &format!("shutdown-{node}")).await;
    assert_eq!(report["podsStopped"].as_u64(), Some(4), "{report:#}");
    // A moment for any status write nodegrace would make after recording the maintenance.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let settled = snapshot().await;
    let marked: Vec<String> = f
        .nodegrace_requests()
        .into_iter()
        .filter(|r| r.received >= booted && r.resource == "pods" && r.subresource == "status")
        .map(|r| r.name)
        .collect();
    assert!(
        marked.is_empty() && settled.iter().all(|(_, s)| *s == AfterReboot::RunAgain),
        "nodegrace wrote the status of pods the kubelet runs again: {marked:?}; pods: {settled:#?}\n{}",
        f.node.container().journal_text()
    );
    eprintln!("real kubelet, apiserver unreachable: the pods after the reboot: {settled:?}");
    audit::assert_allowed_by_cluster_role(&f.nodegrace_requests());
    drop(f.node.container.take());
    f.kubelet.down();
    f.cleanup().await;
}

/// (b2) Like (b), with a kubelet that does not stop when its unit is stopped (the host
/// ignores the unit's stop request: the real kubelet keeps running and the unit's stop hangs
/// until systemd gives up on it, as a hung kubelet's does). nodegrace says so in its journal
/// and in the fallback report the next boot records, stops every container through the CRI
/// band by band all the same, and stops again the containers the still-running kubelet
/// started again (restartPolicy Always); no container of the old boot runs when the node
/// has powered off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_kubelet_that_does_not_stop_at_poweroff_is_reported_and_its_containers_are_stopped()
{
    if skip(
        "a_real_kubelet_that_does_not_stop_at_poweroff_is_reported_and_its_containers_are_stopped",
    ) {
        return;
    }
    let mut f = RealFixture::with_hung_kubelet("ng-rkh").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    two_bands(c, &ns, &node).await;
    let apps = [("web", 2), ("slow", 1), ("crit", 1)];
    let originals = rk::wait_running(c, &ns, &node, &apps, Duration::from_secs(90)).await;
    f.node.boot();
    wait_pod_cache(&f.node.state, 4);
    let endpoint = format!("unix://{}", f.kubelet.dir.join("containerd.sock").display());

    let watch = rk::ContainerWatch::start(&endpoint);
    let port = f.proxy.as_ref().expect("proxy").port;
    f.proxy.as_mut().expect("proxy").close();
    let mut c1 = f.node.container.take().expect("booted");
    let _ = c1.exec(&["systemctl", "poweroff"]);
    c1.wait_exit(Duration::from_secs(180))
        .unwrap_or_else(|| panic!("no poweroff:\n{}", c1.journal_text()));
    let journal = c1.journal_text();
    let ours = c1.journal_of("nodegrace");
    assert!(
        ours.iter().any(|l| l.contains("draining locally")),
        "{journal}"
    );
    let asked = f
        .kubelet
        .stop_ignored()
        .unwrap_or_else(|| panic!("the kubelet unit was never stopped\n{journal}"));
    assert!(f.kubelet.running(), "the kubelet stopped after all");
    let not_stopped = ours
        .iter()
        .find(|l| l.contains("the kubelet did not stop"))
        .unwrap_or_else(|| panic!("no line says the kubelet did not stop:\n{journal}"));
    assert!(
        not_stopped
            .field("ERROR")
            .is_some_and(|e| e.contains("did not stop within 20s")),
        "{journal}"
    );

    let now = containers(&endpoint).await;
    let mut seen: BTreeMap<String, Ctr> = watch
        .seen()
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect();
    drop(watch);
    seen.extend(now.iter().map(|c| (c.id.clone(), c.clone())));
    let ctrs: Vec<Ctr> = seen.into_values().collect();
    let context = || format!("containers: {ctrs:#?}\nnow: {now:#?}\njournal:\n{journal}");
    let first_of = |app: &str| -> Vec<&Ctr> {
        ctrs.iter()
            .filter(|c| c.pod.starts_with(&format!("{app}-")) && c.attempt == 0)
            .collect()
    };
    for p in &originals {
        let first: Vec<&Ctr> = ctrs
            .iter()
            .filter(|c| c.pod == p.name_any() && c.attempt == 0)
            .collect();
        assert_eq!(first.len(), 1, "{}\n{}", p.name_any(), context());
        assert_eq!(
            first[0].state,
            cri::ContainerState::ContainerExited as i32,
            "{}\n{}",
            p.name_any(),
            context()
        );
        assert!(
            first[0].finished > asked + 15.0,
            "{} stopped before nodegrace gave up waiting for the kubelet\n{}",
            p.name_any(),
            context()
        );
    }
    // Nothing of the old boot runs: neither the first containers nor those the kubelet
    // started again.
    let running: Vec<&Ctr> = now
        .iter()
        .filter(|c| c.state != cri::ContainerState::ContainerExited as i32)
        .collect();
    assert!(
        running.is_empty(),
        "still running at poweroff: {running:#?}\n{}",
        context()
    );
    // The bands as in (b), the first containers' ends.
    let web_end = first_of("web")
        .iter()
        .map(|c| c.finished)
        .fold(0f64, f64::max);
    let slow_end = first_of("slow")[0].finished;
    let crit_end = first_of("crit")[0].finished;
    assert!(
        (2.0..5.0).contains(&(slow_end - web_end)),
        "slow stopped {:.2} s after web (its grace is 3 s)\n{}",
        slow_end - web_end,
        context()
    );
    assert!(
        crit_end > slow_end,
        "band 1 ended before band 0\n{}",
        context()
    );
    // The kubelet, still running, started stopped containers again; each was stopped again:
    // by its pod's sandbox stop when it came back before the pod's band ended, else by the
    // watch after the last band.
    let again: Vec<&Ctr> = ctrs.iter().filter(|c| c.attempt > 0).collect();
    assert!(
        !again.is_empty(),
        "the kubelet started no container again (the test proves nothing)\n{}",
        context()
    );
    let said_again = ours
        .iter()
        .filter(|l| l.contains("started a stopped container again"))
        .count();
    assert!(said_again >= 1, "{}", context());
    for c in &again {
        let first_end = ctrs
            .iter()
            .filter(|f| f.pod == c.pod && f.attempt == 0)
            .map(|f| f.finished)
            .fold(0f64, f64::max);
        assert!(
            c.state == cri::ContainerState::ContainerExited as i32 && c.finished > first_end,
            "{c:?} was not stopped again\n{}",
            context()
        );
    }

    let (signal, release) = signal_and_release_of(&c1);
    eprintln!(
        "real kubelet that does not stop: signal -> stop asked {:.3} s, -> last first container \
         stopped {:.3} s, -> release {:.3} s; {} container(s) started again by the kubelet",
        asked - signal,
        crit_end - signal,
        release - signal,
        again.len()
    );

    // The reboot (the machine's power went: the kubelet and every container with it): the
    // maintenance records that the kubelet did not stop.
    f.proxy = Some(ApiProxy::open(port));
    f.restart_kubelet().await;
    f.node.boot();
    let report: Value = completed_with_fallback_report(c, &format!("shutdown-{node}")).await;
    let why = report["kubeletNotStopped"].as_str().unwrap_or_default();
    assert!(why.contains("did not stop within 20s"), "{report:#}");
    assert_eq!(report["podsStopped"].as_u64(), Some(4), "{report:#}");
    audit::assert_allowed_by_cluster_role(&f.nodegrace_requests());
    drop(f.node.container.take());
    f.kubelet.down();
    f.cleanup().await;
}

/// The kubelet's Graceful Node Shutdown takes this delay lock (kubelet v1.28
/// `pkg/kubelet/nodeshutdown/systemd`): who and why as it sets them.
const KUBELET_INHIBIT: &[&str] = &[
    "systemd-inhibit",
    "--what=shutdown",
    "--mode=delay",
    "--who=kubelet",
    "--why=Kubelet needs time to handle node shutdown",
];

/// (c) The kubelet's Graceful Node Shutdown beside nodegrace on one logind. Both would act
/// on the same `PrepareForShutdown` and nodegrace cannot hold the kubelet's GNS back (it kills
/// pods by priority at once, PDBs or not), so the decided behaviour is: GNS off
/// (`shutdownGracePeriod: 0s`, docs/install.md "Kubelet settings to change"), and nodegrace reports a
/// kubelet delay lock beside its own in its journal and in `nodegrace status`, also one
/// taken after nodegrace started (the kubelet takes it once its runtime is up, and the unit
/// starts nodegrace after the kubelet's unit, not after its lock). The lock here is the
/// kubelet's, who and why, taken with `systemd-inhibit` in the node's real logind, which the
/// real kubelet on the host cannot reach (the next test has the real one on a stand-in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_gns_lock_beside_nodegrace_is_reported() {
    if skip("a_kubelet_gns_lock_beside_nodegrace_is_reported") {
        return;
    }
    let mut f = RealFixture::new("ng-rkc", "", false).await;
    f.node.boot();
    let mut argv: Vec<&str> = vec!["systemd-run", "--unit=kubelet-gns-lock", "--"];
    argv.extend_from_slice(KUBELET_INHIBIT);
    argv.extend_from_slice(&["sleep", "infinity"]);
    f.node.container().run(&argv);
    let c = f.node.container();
    real::wait_until(
        "nodegrace's warning about the kubelet's lock",
        Duration::from_secs(90),
        || {
            c.journal_of("nodegrace")
                .iter()
                .any(|l| l.contains("the kubelet holds a shutdown delay inhibitor too"))
                .then_some(())
        },
    );
    let status: Value =
        serde_json::from_str(&c.run(&["nodegrace", "status", "-o", "json"])).expect("status JSON");
    let reported = status["daemon"]["kubeletInhibitor"]
        .as_str()
        .unwrap_or_default();
    assert!(reported.contains("kubelet"), "{status:#}");
    drop(f.node.container.take());
    f.kubelet.down();
    f.cleanup().await;
}

/// The logind stand-in's InhibitDelayMaxSec: above the 30 s the kubelet's GNS asks for, so
/// the kubelet does not rewrite logind's configuration (it would write the host's).
/// How long after a pod was seen stopped an eviction may still arrive that nodegrace sent
/// before its own watch saw it: the watch's delivery and the request's flight, on a loaded
/// machine.
const CROSSING_S: f64 = 0.5;
const STAND_IN_DELAY: Duration = Duration::from_secs(60);

/// The kubelet's GNS in (c): 20 s for ordinary pods, then 10 s for critical ones.
const GNS: &str = "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s";
const GNS_PERIOD: f64 = 30.0;

/// When the stand-in saw `who`'s delay lock closed, in Unix seconds (`signal` at `at`).
fn closed_at(
    state: &nodegrace_testkit::FakeState,
    who: &str,
    signal: f64,
    at: std::time::Instant,
) -> Option<f64> {
    state
        .taken_by(who)
        .iter()
        .filter(|i| i.mode == "delay")
        .filter_map(|i| i.closed_at)
        .filter(|t| *t >= at)
        .map(|t| signal + t.duration_since(at).as_secs_f64())
        .reduce(f64::max)
}

/// (c) The real kubelet's Graceful Node Shutdown (30 s, 10 s of it for critical pods) and
/// nodegrace (the shipped unit and configuration, the kubelet's configuration at the
/// shipped `fallback.kubelet_config`) on one logind: the stand-in of
/// `realk8s/stand_in_logind.rs`, the node's system bus and the kubelet's. On its
/// `PrepareForShutdown` both act on the same pods: a Deployment `web` (2 replicas, a PDB
/// that allows no disruption) and `crit` (system-cluster-critical).
///
/// What happens, asserted: nodegrace warns about the kubelet's lock before the shutdown and
/// reads the kubelet's GNS from its configuration. At the signal the kubelet's GNS begins
/// killing the ordinary pods at once, PDB or not; the apiserver learns of it only when they
/// have stopped (the kubelet writes their status then), and until then the PDB refuses
/// every eviction nodegrace asks for them. Each pod's container is stopped once (one
/// container, never restarted), the kubelet DELETEs no pod twice and nodegrace evicts no pod
/// the apiserver shows stopped; it may evict `crit`, whose stop the kubelet began a moment
/// earlier where the API cannot show it (the pod then goes with the kubelet's shorter grace
/// period, and its object is deleted instead of left Failed). nodegrace releases once the
/// pods have stopped, so the delay is the kubelet's, within its shutdownGracePeriod. The
/// PDB protected nothing: why docs/install.md says to turn the kubelet's GNS off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_kubelets_gns_beside_nodegrace_on_one_logind() {
    if skip("the_real_kubelets_gns_beside_nodegrace_on_one_logind") {
        return;
    }
    let logind = StandInLogind::start(STAND_IN_DELAY).await;
    let mut f = RealFixture::with_kubelet_env(
        "ng-rkg",
        GNS,
        false,
        &[("DBUS_SYSTEM_BUS_ADDRESS", &logind.address)],
    )
    .await;
    f.node.system_bus = Some(SystemBus {
        socket_dir: logind.socket_dir(),
        dropin_dir: logind.dropin_dir(),
    });
    f.node.kubelet_config = Some(f.kubelet.dir.join("kubelet.yaml"));
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    let watch = PodWatch::start(c, &ns);
    let real = |app| PodShape::new(app).on_real_kubelet();
    // web's pods exit a second after SIGTERM: the window in which nodegrace asks to evict
    // pods the kubelet is already stopping and the PDB refuses it.
    workload::deployment(c, &ns, &node, 2, real("web").exits_after_ms(1000)).await;
    workload::pdb(c, &ns, "web", 2).await;
    let crit = real("crit").priority("system-cluster-critical");
    workload::deployment(c, &ns, &node, 1, crit.exits_after_ms(300)).await;
    let apps = [("web", 2), ("crit", 1)];
    let originals = rk::wait_running(c, &ns, &node, &apps, Duration::from_secs(90)).await;
    workload::wait_pdb_blocking(c, &ns, "web").await;
    assert!(
        logind.holds_delay("kubelet"),
        "the kubelet's GNS holds no delay lock on the stand-in:\n{}",
        f.kubelet.log_tail()
    );
    // A node's daemon has long been connected when it shuts down; one signalled while it
    // still connects starts its drain late, after the kubelet's GNS has stopped web (seen
    // on a loaded CI machine: the drain began 1.06 s after the signal and evicted nothing).
    f.node.boot_connected();
    real::wait_until(
        "nodegrace's delay lock on the stand-in",
        Duration::from_secs(30),
        || logind.holds_delay("nodegrace").then_some(()),
    );
    let warned = || {
        f.node
            .container()
            .journal_of("nodegrace")
            .iter()
            .any(|l| {
                l.contains("the kubelet holds a shutdown delay inhibitor too")
                    && l.field("WHO") == Some("kubelet")
            })
            .then_some(())
    };
    real::wait_until(
        "nodegrace's warning about the kubelet's lock",
        Duration::from_secs(30),
        warned,
    );
    let signal = realk8s::now_unix();
    let at = logind
        .fakes
        .prepare_for_shutdown_typed(true, "poweroff")
        .await
        .expect("PrepareForShutdown");
    let released = |s: &nodegrace_testkit::FakeState| {
        s.inhibitors
            .iter()
            .filter(|i| i.mode == "delay")
            .all(|i| !i.held())
    };
    let state = tokio::time::timeout(STAND_IN_DELAY, logind.fakes.wait_until(released))
        .await
        .ok();
    // The kubelet's last requests (its DELETEs of evicted pods) a moment after its release.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ours = f.nodegrace_requests();
    let kubelets = f.kubelet_requests();
    let journal = f.node.container().journal_text();
    let context = || {
        format!(
            "nodegrace: {:#?}\nkubelet: {:#?}\njournal:\n{journal}\nkubelet log:\n{}",
            audit::count_by_kind(&ours),
            audit::count_by_kind(&kubelets),
            f.kubelet.log_tail()
        )
    };
    let state = state.unwrap_or_else(|| {
        panic!(
            "a delay lock still held {STAND_IN_DELAY:?} after the signal: {:#?}\n{}",
            logind.fakes.state().held(),
            context()
        )
    });
    let kubelet_release = closed_at(&state, "kubelet", signal, at)
        .unwrap_or_else(|| panic!("the kubelet never released its lock\n{}", context()));
    let nodegrace_release = closed_at(&state, "nodegrace", signal, at)
        .unwrap_or_else(|| panic!("nodegrace never released its lock\n{}", context()));
    assert!(
        journal.contains("the kubelet's own Graceful Node Shutdown is configured"),
        "nodegrace did not read the kubelet's GNS from its configuration\n{}",
        context()
    );

    let seen = watch.seen();
    // When the apiserver received the kubelet's write of a pod's terminal status (its last
    // status write before the test's watch saw the pod terminal, which is later): from then
    // on an eviction may cross it and find a finished pod, deleted without a budget check.
    let stopped_in_api = |name: &str| {
        let seen_terminal = seen.values().find(|s| s.name == name)?.terminal_at?;
        kubelets
            .iter()
            .filter(|r| {
                r.name == name
                    && r.verb == "patch"
                    && r.resource == "pods"
                    && r.subresource == "status"
                    && r.received <= seen_terminal
            })
            .map(|r| r.received)
            .reduce(f64::max)
            .or(Some(seen_terminal))
    };
    let kills = rk::gns_kills(&f.kubelet.log());
    let endpoint = format!("unix://{}", f.kubelet.dir.join("containerd.sock").display());
    let ctrs = containers(&endpoint).await;
    let mut overlaps = Vec::new();
    let mut crossings = Vec::new();
    for p in &originals {
        let name = p.name_any();
        let s = &seen[&p.uid().unwrap_or_default()];
        let terminal = s
            .terminal_at
            .unwrap_or_else(|| panic!("{name} never ended: {s:?}\n{}", context()));
        // Its container stopped once: one, never restarted, exited; or none left of a pod
        // deleted in the API (evicted), whose dead containers the kubelet removes.
        let mine: Vec<&Ctr> = ctrs.iter().filter(|c| c.pod == name).collect();
        let removed = mine.is_empty() && s.terminating_at.is_some();
        assert!(
            removed
                || (mine.len() == 1
                    && mine[0].attempt == 0
                    && mine[0].state == cri::ContainerState::ContainerExited as i32),
            "{name}: {mine:?}\n{}",
            context()
        );
        let deletes = kubelets
            .iter()
            .filter(|r| r.name == name && is_pod_delete(r))
            .count();
        assert!(
            deletes <= 1,
            "the kubelet DELETEd {name} {deletes} times\n{}",
            context()
        );
        // No eviction of a pod the kubelet had already stopped (terminal in the API), but
        // for one that crossed the kubelet's status write on the way: a retry of a refused
        // eviction sent before nodegrace's watch brought the news. The apiserver deletes
        // the finished pod; its container was stopped once all the same (above).
        let admitted: Vec<&Request> = evictions(&ours, &name)
            .into_iter()
            .filter(|r| r.code == 201)
            .collect();
        let stopped = stopped_in_api(&name).unwrap_or(terminal);
        for e in admitted.iter().filter(|e| e.received >= stopped) {
            assert!(
                e.received < terminal + CROSSING_S,
                "nodegrace evicted {name} +{:.3} s after the kubelet had stopped it (seen +{:.3} s after the signal)\n{}",
                e.received - terminal,
                terminal - signal,
                context()
            );
            crossings.push(format!(
                "{name}: admitted +{:.3} s after it was seen stopped",
                e.received - terminal
            ));
        }
        // An eviction of a pod the kubelet's GNS was already stopping, which the API
        // cannot show (the kubelet writes its status once the pod has stopped).
        if let (Some(e), Some(kill)) = (
            admitted.iter().find(|e| e.received < stopped),
            kills.get(&name),
        ) {
            if e.received > *kill {
                overlaps.push(format!(
                    "{name}: the kubelet began at +{:.3} s, nodegrace's eviction +{:.3} s",
                    kill - signal,
                    e.received - signal
                ));
            }
        }
    }
    // The PDB-protected pods: the kubelet's GNS stops them at once, PDB or not; the API
    // learns it only when they have stopped, and meanwhile the PDB refuses nodegrace's
    // evictions of them (what nodegrace alone gets until its drain deadline).
    let web: Vec<String> = originals
        .iter()
        .filter(|p| app_of(p) == "web")
        .map(|p| p.name_any())
        .collect();
    for name in &web {
        let s = seen.values().find(|s| s.name == *name).expect("seen");
        assert_eq!(
            s.disruption.as_ref().map(|d| d.0.as_str()),
            Some("TerminationByKubelet"),
            "{name} was not stopped by the kubelet's GNS\n{}",
            context()
        );
        assert!(
            kills.contains_key(name),
            "the kubelet's log does not show its GNS killing {name}\n{}",
            context()
        );
    }
    let first_kill = web.iter().map(|n| kills[n]).fold(f64::MAX, f64::min);
    let first_stopped = web
        .iter()
        .filter_map(|n| seen.values().find(|s| s.name == *n)?.terminal_at)
        .fold(f64::MAX, f64::min);
    // A pod whose containers the kubelet has stopped is no longer healthy, and the
    // Eviction API may admit an eviction of it before the kubelet's terminal status write
    // arrives (seen once in CI, 27 ms after the kubelet's "finished killing pod"): a
    // crossing with a pod already gone, not a budget bypassed.
    let killed = rk::gns_killed(&f.kubelet.log());
    let web_evictions: Vec<&Request> = web
        .iter()
        .flat_map(|n| {
            let stopped = match (stopped_in_api(n), killed.get(n.as_str())) {
                (Some(a), Some(k)) => Some(a.min(*k)),
                (a, k) => a.or(k.copied()),
            };
            evictions(&ours, n)
                .into_iter()
                .filter(move |r| stopped.is_none_or(|t| r.received < t))
        })
        .collect();
    let refused = web_evictions.iter().filter(|r| r.code == 429).count();
    assert!(
        refused >= 1 && web_evictions.iter().all(|r| r.code == 429),
        "nodegrace's evictions of the PDB-protected pods were not all refused by the PDB: {web_evictions:#?}\n{}",
        context()
    );
    let last = kubelet_release.max(nodegrace_release);
    eprintln!(
        "kubelet GNS + nodegrace on one logind: the kubelet began killing the first PDB-protected pod +{:.3} s after the signal, stopped +{:.3} s (nodegrace's evictions of them: {refused} refused by the PDB); kubelet released +{:.3} s, nodegrace +{:.3} s; nodegrace's evictions of pods the kubelet was already stopping: {overlaps:?}; crossing its status write: {crossings:?}",
        first_kill - signal,
        first_stopped - signal,
        kubelet_release - signal,
        nodegrace_release - signal,
    );
    assert!(
        first_kill - signal < 1.0,
        "the kubelet's GNS began killing the first PDB-protected pod only +{:.3} s after the signal\n{}",
        first_kill - signal,
        context()
    );
    // The delay: the kubelet's, within its shutdownGracePeriod; nodegrace releases as soon
    // as the pods have stopped (alone, with this PDB, it would hold until its deadline).
    assert!(
        last - signal <= GNS_PERIOD,
        "the last lock was released +{:.3} s after the signal (the kubelet's GNS: {GNS_PERIOD} s)\n{}",
        last - signal,
        context()
    );
    let last_stopped = seen
        .values()
        .filter_map(|s| s.terminal_at)
        .fold(0f64, f64::max);
    assert!(
        nodegrace_release <= last_stopped.max(kubelet_release) + 2.0,
        "nodegrace released +{:.3} s after the signal; the last pod stopped +{:.3} s, the kubelet released +{:.3} s\n{}",
        nodegrace_release - signal,
        last_stopped - signal,
        kubelet_release - signal,
        context()
    );
    // The kubelet's GNS configured: nodegrace marks its drain, not the kubelet's condition.
    let n = wait_node(c, &node, "the node", |_| true).await;
    let conditions = n.status.and_then(|s| s.conditions).unwrap_or_default();
    let condition = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.status.clone())
    };
    assert!(condition("DrainInProgress").is_some(), "{conditions:#?}");
    assert_eq!(
        condition("GracefulNodeShutdownInProgress"),
        None,
        "{conditions:#?}"
    );
    audit::assert_allowed_by_cluster_role(&ours);
    drop(f.node.container.take());
    f.kubelet.down();
    f.cleanup().await;
    drop(logind);
}
