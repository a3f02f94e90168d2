//! Real-control-plane tier, apiserver outages: the kube-apiserver process is stopped and
//! started around a shutdown. The tests of this binary run one at a time (they stop the
//! apiserver every other test shares); cargo runs test binaries one after another.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

#[path = "real/harness.rs"]
mod harness;
mod real;
mod realk8s;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use realk8s::audit;
use realk8s::faults::*;
use realk8s::fixture::*;
use realk8s::kubelet::Kubelet;
use realk8s::workload::{self, PodShape};
use serde_json::Value;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn skip(test: &str) -> bool {
    if !realk8s::enabled(&format!("realk8s_outage::{test}")) {
        return true;
    }
    real::require_prerequisites();
    false
}

/// Powers the node off with the apiserver down (the local fallback runs), then brings the
/// apiserver, the kubelet stand-in and the node back: the boot after an offline shutdown.
/// Returns the first boot's container, exited.
async fn poweroff_offline_then_reboot(f: &mut Fixture) -> real::Container {
    f.cp.stop_apiserver();
    let mut c1 = f.node.container.take().expect("booted");
    let _ = c1.exec(&["systemctl", "poweroff"]);
    c1.wait_exit(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("no poweroff:\n{}", c1.journal_text()));
    assert!(
        c1.journal_of("nodegrace")
            .iter()
            .any(|l| l.contains("draining locally")),
        "{}",
        c1.journal_text()
    );
    f.kubelet.stop();
    start_apiserver(f).await;
    f.kubelet = Kubelet::start(
        &f.cp.kubelet_identity(&f.name),
        &f.name,
        Some(f.node.manifests.clone()),
    )
    .await;
    f.node.boot();
    c1
}

/// An apiserver that restarts around the poweroff (stopped 1 s before, started 2 s after;
/// while it starts it answers 403 to everything until RBAC is loaded) is waited for, not
/// taken for gone: the drain goes through the NodeMaintenance and the Eviction API, and the
/// kubelet is never stopped for a local drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarting_apiserver_is_waited_for_not_drained_around() {
    if skip("a_restarting_apiserver_is_waited_for_not_drained_around") {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut f = Fixture::new("ng-rst").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::deployment(c, &ns, &node, 3, PodShape::new("web")).await;
    f.kubelet.wait_running(3).await;
    f.node.boot();
    // A restart of the apiserver the daemon is connected to: connected (its pod cache
    // written) before the apiserver goes.
    wait_pod_cache(&f.node.state, 3);

    f.cp.stop_apiserver();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let container = f.node.container.take().expect("booted");
    let _ = container.exec(&["systemctl", "poweroff"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    start_apiserver(&f).await;
    let mut container = container;
    container
        .wait_exit(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("no poweroff:\n{}", container.journal_text()));
    let journal = container.journal_text();

    let ours = container.journal_of("nodegrace");
    assert!(
        !ours.iter().any(|l| l.contains("draining locally")),
        "went to the local fallback:\n{journal}"
    );
    assert!(container.stop_time("kubelet").is_some());
    let nm = wait_maintenance(
        c,
        &format!("shutdown-{node}"),
        "created",
        Duration::from_secs(10),
        |_| true,
    )
    .await;
    assert_eq!(
        nm.node_status(&node).map(|e| e.pods_remaining),
        Some(0),
        "{journal}"
    );
    let reqs = f.requests();
    for r in f
        .kubelet
        .records()
        .iter()
        .filter(|r| r.name.starts_with("web-"))
    {
        assert!(
            evictions(&reqs, &r.name).iter().any(|e| e.code == 201),
            "{} not evicted: {:#?}\n{journal}",
            r.name,
            audit::count_by_kind(&reqs)
        );
    }
    f.cleanup().await;
}

/// The apiserver is down when the node powers off and comes back only after the node
/// rebooted: the local fallback runs (the kubelet unit stopped; no CRI runtime on this node,
/// so nothing can be stopped through it), its record names every pod the node had, and
/// the boot after creates the shutdown maintenance from it and completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_shutdown_is_recorded_after_the_reboot_with_every_pod() {
    if skip("an_offline_shutdown_is_recorded_after_the_reboot_with_every_pod") {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut f = Fixture::new("ng-offl").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::deployment(c, &ns, &node, 2, PodShape::new("web")).await;
    workload::deployment(
        c,
        &ns,
        &node,
        1,
        PodShape::new("crit").priority("system-cluster-critical"),
    )
    .await;
    workload::static_pod(&f.node.manifests, &ns, PodShape::new("etcd"));
    f.kubelet.wait_running(4).await;
    let pods: Vec<String> = f
        .kubelet
        .live_pods()
        .iter()
        .map(|p| format!("{ns}/{}", p.name_any()))
        .collect();
    f.node.boot();
    // The offline fallback works from the pod cache the daemon keeps while online.
    wait_pod_cache(&f.node.state, 4);

    poweroff_offline_then_reboot(&mut f).await;

    let name = format!("shutdown-{node}");
    let report: Value = completed_with_fallback_report(c, &name).await;
    let counted = ["podsStopped", "podsNotStopped", "podsNotReached"]
        .iter()
        .map(|k| report[k].as_u64().unwrap_or(0))
        .sum::<u64>();
    assert_eq!(counted, 4, "{report:#}");
    let named: Vec<String> = ["stopped", "notStopped", "notReached"]
        .iter()
        .flat_map(|k| report[k].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    for pod in &pods {
        assert!(
            named.iter().any(|n| n.starts_with(pod.as_str())),
            "{pod} not named in {report:#}"
        );
    }
    assert!(
        named.iter().any(|n| n.contains("could not be listed")),
        "{report:#}"
    );
    f.kubelet
        .wait_for(
            "the static pod's mirror back",
            Duration::from_secs(30),
            |_, live| live.iter().any(|p| p.name_any() == format!("etcd-{node}")),
        )
        .await;
    audit::assert_allowed_by_cluster_role(&f.requests());
    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    f.cleanup().await;
}

/// The apiserver is down at the poweroff of a node whose pods run in a real containerd (at
/// the shipped `fallback.cri_endpoint`): the fallback stops them through the CRI, and once
/// the apiserver is back after the reboot each gets the status the kubelet's graceful node
/// shutdown writes. The Job controller then reads its pod as a disruption: the Job's
/// podFailurePolicy ignores DisruptionTarget, so backoffLimit 0 is not spent and the pod is
/// replaced instead of the Job failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_stopped_offline_get_the_status_of_a_kubelet_shutdown_after_the_reboot() {
    if skip("pods_stopped_offline_get_the_status_of_a_kubelet_shutdown_after_the_reboot") {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().await;
    let containerd = tokio::task::spawn_blocking(harness::Containerd::start)
        .await
        .expect("containerd");
    let mut f = Fixture::new("ng-gns").await;
    f.node.cri_dir = Some(containerd.dir.clone());
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::deployment(c, &ns, &node, 1, PodShape::new("web")).await;
    workload::job(c, &ns, &node, PodShape::new("batch")).await;
    f.kubelet.wait_running(2).await;
    // The runtime side of the same pods, as the kubelet would have started them.
    let live = f.kubelet.live_pods();
    let mut marks = Vec::new();
    for pod in &live {
        let name = pod.name_any();
        containerd
            .run_pod(&harness::PodSpec {
                namespace: ns.clone(),
                name: name.clone(),
                uid: pod.uid().expect("uid"),
                containers: vec![(
                    "main".into(),
                    harness::script(&name, harness::OnTerm::ExitAfter(0.0)),
                )],
            })
            .await;
        marks.push(name);
    }
    containerd.wait_started(&marks).await;
    let originals: Vec<String> = live.iter().filter_map(|p| p.uid()).collect();
    f.node.boot();
    wait_pod_cache(&f.node.state, 2);

    let c1 = poweroff_offline_then_reboot(&mut f).await;
    for name in &marks {
        assert!(
            containerd.uptime_mark(&format!("{name}.term")).is_some(),
            "{name} was not stopped through the CRI:\n{}\n{}",
            c1.journal_text(),
            containerd.log_tail()
        );
    }

    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let stopped = loop {
        let now: Vec<Pod> = pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| originals.contains(&p.uid().unwrap_or_default()))
            .collect();
        let failed = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
        if now.len() == originals.len() && now.iter().all(failed) {
            break now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stopped pods are not Failed 60 s after the reboot: {:#?}\n{}",
            now.iter()
                .map(|p| (p.name_any(), p.status.clone()))
                .collect::<Vec<_>>(),
            f.node.container().journal_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for p in &stopped {
        let status = p.status.clone().unwrap_or_default();
        assert_eq!(status.reason.as_deref(), Some("Terminated"), "{status:?}");
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown."),
            "{status:?}"
        );
        let target = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget")
            .unwrap_or_else(|| panic!("no DisruptionTarget on {}: {status:?}", p.name_any()));
        assert_eq!(target.status, "True");
        assert_eq!(target.reason.as_deref(), Some("TerminationByKubelet"));
    }

    // The Job replaces its disrupted pod instead of failing.
    assert_job_replaced_its_disrupted_pod(c, &ns, "batch", &originals).await;
    audit::assert_allowed_by_cluster_role(&f.requests());
    let _ = f.node.shutdown("poweroff", Duration::from_secs(60));
    f.cleanup().await;
    drop(containerd);
}

/// What goes wrong, and when, relative to the shutdown.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Killed 1 s before `systemctl poweroff`, started again 2 s after it.
    ApiserverAroundTheSignal,
    /// Killed once the first band's evictions were accepted, started again 1 s later.
    ApiserverDuringTheFirstBand,
    /// Killed once the DaemonSet pod was asked to go, started again 1 s later.
    ApiserverDuringTheDaemonSetBand,
    /// Killed once the static pod's manifest left the kubelet's directory (gated), started
    /// again 1 s later.
    ApiserverWhileStaticPodsAreGated,
    /// etcd killed once the first band's evictions were accepted, started again 2 s later:
    /// the apiserver stays up and answers errors, or late.
    EtcdDuringTheFirstBand,
    /// Killed once the first band's evictions were accepted; while it is away the daemon is
    /// killed too (SIGKILL) and restarted by systemd; the apiserver starts again 3 s later.
    DaemonKilledWhileTheApiserverIsAway,
    /// systemd-logind restarted in the node once the first band's evictions were accepted.
    /// logind (systemd 252) forgets the pending poweroff: nodegrace takes a new inhibitor
    /// before it lets the old one go and takes the shutdown as cancelled; the node stays up
    /// until `systemctl poweroff` again.
    LogindRestartedDuringTheFirstBand,
    /// The node's dbus-daemon restarted once the first band's evictions were accepted: logind
    /// is started again with it, the same as above.
    DbusRestartedDuringTheFirstBand,
    /// Issue 44: systemd-logind killed (SIGKILL) once the first band's evictions were
    /// accepted; systemd starts it again, without the poweroff: the drain stops where it is
    /// (the later bands never asked, the static manifest in place), the Node says why, and
    /// the operator's second poweroff drains what is left.
    LogindKilledDuringTheFirstBand,
    /// The same restart and kill on Debian 13 (systemd 257). Where its logind keeps the
    /// pending poweroff, the drain goes on with no step lost.
    LogindRestartedOnDebian13,
    LogindKilledOnDebian13,
    /// Issue 33: killed once the first band's evictions were accepted and started again 9 s
    /// later (back 14–19 s into the drain, as fast as up.sh restarts it): the first band's
    /// escalation as planned at the start (12 s, see [`PAST_DEADLINE_CONFIG`]) passes while it
    /// is away. Its pods, terminating gracefully, keep their grace: the schedule made when the
    /// apiserver answers again decides.
    ApiserverAwayPastTheFirstBandsDeadline,
    /// The same with etcd killed instead (the apiserver stays up, answering errors or late).
    EtcdAwayPastTheFirstBandsDeadline,
}

/// The phase's reason when logind came back without the shutdown (`plan::lifecycle::LOST`).
const LOGIND_LOST: &str =
    "logind restarted and lost the shutdown: the drain stopped; ask for the shutdown again";

/// What the node looks like once logind lost its poweroff in the first band: the drain
/// stopped where it was (no pod of a later band asked, the static manifest in place), the
/// node still cordoned (`shutdown.on_cancel = "keep"`, the shipped default) under its kept
/// maintenance, which says its drain stopped, the shutdown conditions False, and a Warning
/// Event on the Node that says to ask again.
async fn assert_the_drain_stopped(f: &Fixture, container: &real::Container) {
    let (c, node) = (&f.admin, &f.name);
    let name = format!("shutdown-{node}");
    wait_maintenance(
        c,
        &name,
        "its drain marked stopped",
        Duration::from_secs(20),
        |m| m.annotations().contains_key("nodegrace.dev/drain-stopped"),
    )
    .await;
    // The first band's pods exit 3 s after SIGTERM: a drain still under way asks the next
    // band by then.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let reqs = f.requests();
    let journal = container.journal_text();
    let later: Vec<String> = f
        .kubelet
        .records()
        .into_iter()
        .filter(|r| !r.name.starts_with("web-"))
        .filter(|r| r.stop_seen.is_some() || !evictions(&reqs, &r.name).is_empty())
        .map(|r| r.name)
        .collect();
    assert!(
        later.is_empty(),
        "asked after logind lost the shutdown: {later:?}\n{journal}"
    );
    assert!(
        f.node.manifests.join("etcd.yaml").exists(),
        "the static manifest was gated after logind lost the shutdown\n{journal}"
    );
    let n = wait_node(c, node, "the shutdown conditions False", |n| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "GracefulNodeShutdownInProgress"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("NodeShutdownCancelled")
                })
            })
    })
    .await;
    assert!(cordoned(&n), "uncordoned although the maintenance is kept");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.clone(), "default");
    let lost = events
        .list(&ListParams::default().fields(&format!("regarding.name={node}")))
        .await
        .expect("listing the node's Events")
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("ShutdownLost"))
        .unwrap_or_else(|| panic!("no ShutdownLost Event on the Node\n{journal}"));
    assert_eq!(lost.type_.as_deref(), Some("Warning"));
    let note = lost.note.unwrap_or_default();
    assert!(note.contains("ask for the shutdown again"), "{note}");
}

/// The faults that outlast the first band's first deadline: a budget of 114 s gives the band
/// 24 s (the shipped reserves take 90), its escalation 12 s into the drain as planned at the
/// start. The outage has to end after that and before the fallback: 20 s instead of the
/// shipped 10 s makes a window that an apiserver restarted on a busy machine still hits.
const PAST_DEADLINE_CONFIG: &str =
    "[shutdown]\nmax_delay = \"114s\"\n[fallback]\napiserver_timeout = \"20s\"\n";

impl Fault {
    fn budget_secs(self) -> u64 {
        match self {
            Fault::ApiserverAwayPastTheFirstBandsDeadline
            | Fault::EtcdAwayPastTheFirstBandsDeadline => 114,
            _ => FAULT_BUDGET_SECS,
        }
    }

    /// How logind goes away in the node, for the faults that take it away.
    fn logind_fault(self) -> Option<&'static [&'static str]> {
        const RESTART_LOGIND: &[&str] = &[
            "systemctl",
            "restart",
            "--no-block",
            "systemd-logind.service",
        ];
        const KILL_LOGIND: &[&str] = &[
            "systemctl",
            "kill",
            "--signal=KILL",
            "systemd-logind.service",
        ];
        match self {
            Fault::LogindRestartedDuringTheFirstBand | Fault::LogindRestartedOnDebian13 => {
                Some(RESTART_LOGIND)
            }
            Fault::LogindKilledDuringTheFirstBand | Fault::LogindKilledOnDebian13 => {
                Some(KILL_LOGIND)
            }
            Fault::DbusRestartedDuringTheFirstBand => {
                Some(&["systemctl", "restart", "--no-block", "dbus.service"])
            }
            _ => None,
        }
    }

    fn debian(self) -> Option<real::Debian> {
        matches!(
            self,
            Fault::LogindRestartedOnDebian13 | Fault::LogindKilledOnDebian13
        )
        .then_some(real::Debian::Trixie)
    }

    /// The configuration drop-in of its node.
    fn config(self) -> String {
        match self {
            Fault::ApiserverAwayPastTheFirstBandsDeadline
            | Fault::EtcdAwayPastTheFirstBandsDeadline => PAST_DEADLINE_CONFIG.to_owned(),
            _ => fault_budget_config(),
        }
    }
}

/// One row of the fault table: the apiserver killed (SIGKILL) and started again around or
/// during a poweroff of a node with pods in four bands. Whatever the moment: the drain goes
/// through the NodeMaintenance, never locally; no pod that nothing blocks is deleted (the
/// time lost is planned again, not charged to the band that was current); no pod is evicted
/// twice; the static manifest is gated byte for byte; the inhibitor is released within the
/// budget and within 2 s of the last pod's going; the maintenance and the node's events say
/// what was lost.
async fn killed_mid_shutdown(outage: Fault) {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (mut f, manifest) =
        booted_with_bands_on("ng-kill", true, outage.config(), outage.debian()).await;
    let (c, node) = (&f.admin.clone(), f.name.clone());

    let container = f.node.container.take().expect("booted");
    let killed_at = match outage {
        Fault::ApiserverAroundTheSignal => {
            let at = realk8s::now_unix();
            f.cp.stop_apiserver();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let _ = container.exec(&["systemctl", "poweroff"]);
            tokio::time::sleep(Duration::from_secs(2)).await;
            at
        }
        Fault::LogindRestartedDuringTheFirstBand
        | Fault::DbusRestartedDuringTheFirstBand
        | Fault::LogindKilledDuringTheFirstBand
        | Fault::LogindRestartedOnDebian13
        | Fault::LogindKilledOnDebian13 => {
            let _ = container.exec(&["systemctl", "poweroff"]);
            wait_first_band_asked(&f).await;
            let at = realk8s::now_unix();
            let _ = container.exec(outage.logind_fault().expect("a logind fault"));
            // A logind started again without the poweroff: nodegrace takes a new inhibitor
            // before it lets the old one go, and stops the drain. One that kept it: the
            // drain goes on and the node goes down.
            let lost = real::wait_until(
                "nodegrace armed again after logind lost the poweroff, or the node going down",
                Duration::from_secs(60),
                || {
                    if container.host_pid_of("/usr/bin/nodegrace").is_none() {
                        return Some(false);
                    }
                    let ours = container.journal_of("nodegrace");
                    let why = |reason: &str| {
                        ours.iter()
                            .find(|l| l.field("REASON") == Some(reason))
                            .map(|l| l.time)
                    };
                    let replaced = why("replaced by the inhibitor taken after reconnecting")?;
                    let armed = why(LOGIND_LOST)?;
                    (replaced <= armed).then_some(true)
                },
            );
            eprintln!("{outage:?}: logind lost the poweroff: {lost}");
            if lost {
                assert_the_drain_stopped(&f, &container).await;
                let _ = container.exec(&["systemctl", "poweroff"]);
            }
            at
        }
        Fault::ApiserverDuringTheDaemonSetBand | Fault::ApiserverWhileStaticPodsAreGated => {
            let _ = container.exec(&["systemctl", "poweroff"]);
            if outage == Fault::ApiserverDuringTheDaemonSetBand {
                f.kubelet
                    .wait_for(
                        "the DaemonSet pod asked to go",
                        Duration::from_secs(60),
                        |r, _| {
                            r.iter()
                                .any(|r| r.name.starts_with("agent-") && r.stop_seen.is_some())
                        },
                    )
                    .await;
            } else {
                let manifest = f.node.manifests.join("etcd.yaml");
                real::wait_until(
                    "the static pod's manifest gated",
                    Duration::from_secs(60),
                    || (!manifest.exists()).then_some(()),
                );
            }
            let at = realk8s::now_unix();
            f.cp.stop_apiserver();
            tokio::time::sleep(Duration::from_secs(1)).await;
            at
        }
        Fault::ApiserverAwayPastTheFirstBandsDeadline
        | Fault::EtcdAwayPastTheFirstBandsDeadline => {
            let _ = container.exec(&["systemctl", "poweroff"]);
            wait_first_band_asked(&f).await;
            let at = realk8s::now_unix();
            if outage == Fault::EtcdAwayPastTheFirstBandsDeadline {
                f.cp.stop_etcd();
            } else {
                f.cp.stop_apiserver();
            }
            tokio::time::sleep(Duration::from_secs(9)).await;
            at
        }
        Fault::ApiserverDuringTheFirstBand
        | Fault::EtcdDuringTheFirstBand
        | Fault::DaemonKilledWhileTheApiserverIsAway => {
            let _ = container.exec(&["systemctl", "poweroff"]);
            wait_first_band_asked(&f).await;
            let at = realk8s::now_unix();
            if outage == Fault::EtcdDuringTheFirstBand {
                f.cp.stop_etcd();
                tokio::time::sleep(Duration::from_secs(2)).await;
            } else if outage == Fault::DaemonKilledWhileTheApiserverIsAway {
                f.cp.stop_apiserver();
                let pid = container
                    .host_pid_of("/usr/bin/nodegrace")
                    .expect("nodegrace runs in the node");
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                tokio::time::sleep(Duration::from_secs(3)).await;
            } else {
                f.cp.stop_apiserver();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            at
        }
    };
    start_apiserver(&f).await;
    let mut container = container;
    container
        .wait_exit(Duration::from_secs(outage.budget_secs() + 30))
        .unwrap_or_else(|| panic!("no poweroff:\n{}", container.journal_text()));
    let (signal, release) = signal_and_release(&container);
    // The poweroff that went through: the second one where logind forgot the first.
    let last_signal = real::last_with(
        &container.journal_of("systemd-logind"),
        "The system will power off now",
    )
    .map_or(signal, |l| l.time);
    let journal = container.journal_text();
    let reqs = f.requests();
    let context = || {
        format!(
            "{outage:?}\nrequests: {:#?}\njournal:\n{journal}",
            audit::count_by_kind(&reqs)
        )
    };

    assert!(
        !container
            .journal_of("nodegrace")
            .iter()
            .any(|l| l.contains("draining locally")),
        "went to the local fallback\n{}",
        context()
    );
    let last_gone = assert_each_pod_went_once(
        &f,
        &reqs,
        &journal,
        &["web-", "crit-", "agent-", "etcd-"],
        signal,
        &context,
    );
    assert_released_on_time(
        outage.budget_secs(),
        last_signal,
        last_gone,
        release,
        &context,
    );
    eprintln!(
        "{outage:?}: signal -> release {:.2} s, last pod gone -> release {:.3} s",
        release - signal,
        release - last_gone
    );
    let gated = f.node.state.join("gated-manifests").join("etcd.yaml");
    assert_eq!(
        std::fs::read(&gated).ok().as_deref(),
        Some(manifest.as_slice()),
        "the static manifest is not gated byte for byte at {}\n{}",
        gated.display(),
        context()
    );

    // The drain went on within two seconds of the apiserver answering again (the watches
    // did not wait out a back-off from the outage; its warming caches and the writes before
    // the first eviction take the rest).
    if outage == Fault::ApiserverAroundTheSignal {
        let back = reqs
            .iter()
            .find(|r| r.received > killed_at && r.code > 0 && r.code < 400)
            .unwrap_or_else(|| panic!("no answer after the outage\n{}", context()));
        let first_eviction = reqs
            .iter()
            .find(|r| r.subresource == "eviction" && r.code == 201)
            .unwrap_or_else(|| panic!("no eviction\n{}", context()));
        let resumed = first_eviction.received - back.received;
        eprintln!("{outage:?}: first eviction {resumed:.3} s after the apiserver answered again");
        assert!(
            resumed < 2.0,
            "first eviction {resumed:.3} s after the apiserver answered again\n{}",
            context()
        );
    }

    let nm = wait_maintenance(
        c,
        &format!("shutdown-{node}"),
        "written",
        Duration::from_secs(10),
        |_| true,
    )
    .await;
    // An apiserver whose etcd is away may only answer late: no outage to plan again then.
    if !matches!(
        outage,
        Fault::EtcdDuringTheFirstBand | Fault::EtcdAwayPastTheFirstBandsDeadline
    ) && outage.logind_fault().is_none()
    {
        let message = nm
            .node_status(&node)
            .map(|e| e.drain_message.clone())
            .unwrap_or_default();
        assert!(
            message.contains("; planned again at "),
            "the maintenance's status does not tell the time lost: {message:?}\n{}",
            context()
        );
        assert!(journal.contains("time lost"), "{}", context());
    }
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_killed_around_the_signal_costs_no_pod_its_grace() {
    if skip("an_apiserver_killed_around_the_signal_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::ApiserverAroundTheSignal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_killed_during_the_first_band_costs_no_pod_its_grace() {
    if skip("an_apiserver_killed_during_the_first_band_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::ApiserverDuringTheFirstBand).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_away_past_the_first_bands_deadline_costs_it_no_grace() {
    if skip("an_apiserver_away_past_the_first_bands_deadline_costs_it_no_grace") {
        return;
    }
    killed_mid_shutdown(Fault::ApiserverAwayPastTheFirstBandsDeadline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_away_past_the_first_bands_deadline_costs_it_no_grace() {
    if skip("etcd_away_past_the_first_bands_deadline_costs_it_no_grace") {
        return;
    }
    killed_mid_shutdown(Fault::EtcdAwayPastTheFirstBandsDeadline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_during_the_first_band_costs_no_pod_its_grace() {
    if skip("etcd_killed_during_the_first_band_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::EtcdDuringTheFirstBand).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_killed_while_the_apiserver_is_away_costs_no_pod_its_grace() {
    if skip("the_daemon_killed_while_the_apiserver_is_away_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::DaemonKilledWhileTheApiserverIsAway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logind_restarted_during_the_first_band_costs_no_pod_its_grace() {
    if skip("logind_restarted_during_the_first_band_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::LogindRestartedDuringTheFirstBand).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logind_killed_during_the_first_band_stops_the_drain_until_asked_again() {
    if skip("logind_killed_during_the_first_band_stops_the_drain_until_asked_again") {
        return;
    }
    killed_mid_shutdown(Fault::LogindKilledDuringTheFirstBand).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_debian_13_logind_restarted_during_the_first_band_costs_no_pod_its_grace() {
    if skip("on_debian_13_logind_restarted_during_the_first_band_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::LogindRestartedOnDebian13).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_debian_13_logind_killed_during_the_first_band_costs_no_pod_its_grace() {
    if skip("on_debian_13_logind_killed_during_the_first_band_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::LogindKilledOnDebian13).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dbus_restarted_during_the_first_band_costs_no_pod_its_grace() {
    if skip("dbus_restarted_during_the_first_band_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::DbusRestartedDuringTheFirstBand).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_killed_during_the_daemonset_band_costs_no_pod_its_grace() {
    if skip("an_apiserver_killed_during_the_daemonset_band_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::ApiserverDuringTheDaemonSetBand).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_killed_while_static_pods_are_gated_costs_no_pod_its_grace() {
    if skip("an_apiserver_killed_while_static_pods_are_gated_costs_no_pod_its_grace") {
        return;
    }
    killed_mid_shutdown(Fault::ApiserverWhileStaticPodsAreGated).await;
}

/// Issue 44: pods bound to the node by `spec.nodeName` while it drains for a poweroff (as
/// a scheduler whose cache still shows the node schedulable binds them): one in the band
/// under way, one long after its band (priority 0) ended and that band's planned deadline
/// passed, one while the last band (the static pod's) runs. Each is evicted once through the
/// Eviction API, never DELETEd (the budget has time for its grace), and the inhibitor is
/// released only once it is gone. The DaemonSet pod takes 12 s to exit, so that the first
/// band's deadline (10 s into the 110 s budget) passes while the drain is still on; the
/// daemon of 68fbbf5 DELETEd the last two at once. The static pod takes 2 s, so that the
/// last band is still on when its pod is bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_bound_to_the_node_during_the_drain_keep_their_grace() {
    if skip("pods_bound_to_the_node_during_the_drain_keep_their_grace") {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut f = Fixture::new("ng-late").await;
    f.node
        .config_dropins
        .push(("50-budget.toml".into(), fault_budget_config()));
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::deployment(c, &ns, &node, 3, PodShape::new("web").exits_after_ms(1000)).await;
    // With a critical pod the reserves leave the first band 20 s of the 110, its deadline
    // at 10 s.
    let crit = PodShape::new("crit")
        .priority("system-cluster-critical")
        .exits_after_ms(500);
    workload::deployment(c, &ns, &node, 1, crit).await;
    workload::daemonset(
        c,
        &ns,
        &node,
        false,
        PodShape::new("agent").exits_after_ms(12_000),
    )
    .await;
    workload::static_pod(
        &f.node.manifests,
        &ns,
        PodShape::new("etcd").exits_after_ms(2000),
    );
    f.kubelet.wait_running(6).await;
    f.node.boot();
    wait_pod_cache(&f.node.state, 6);

    let mut container = f.node.container.take().expect("booted");
    let _ = container.exec(&["systemctl", "poweroff"]);
    let poweroff = realk8s::now_unix();
    let late = |name: &'static str| {
        let (c, ns, node) = (c.clone(), ns.clone(), node.clone());
        async move {
            let shape = PodShape::new("late").exits_after_ms(2000);
            workload::bound_pod(&c, &ns, &node, name, shape).await;
        }
    };
    f.kubelet
        .wait_for("the web band asked", Duration::from_secs(30), |r, _| {
            r.iter()
                .any(|r| r.name.starts_with("web-") && r.stop_seen.is_some())
        })
        .await;
    late("late-under-way").await;
    f.kubelet
        .wait_for(
            "the DaemonSet pod asked",
            Duration::from_secs(30),
            |r, _| {
                r.iter()
                    .any(|r| r.name.starts_with("agent-") && r.stop_seen.is_some())
            },
        )
        .await;
    let past_deadline = poweroff + 11.0 - realk8s::now_unix();
    tokio::time::sleep(Duration::from_secs_f64(past_deadline.max(0.0))).await;
    late("late-after-its-band").await;
    let manifest = f.node.manifests.join("etcd.yaml");
    real::wait_until("the static manifest gated", Duration::from_secs(60), || {
        (!manifest.exists()).then_some(())
    });
    late("late-in-the-last-band").await;

    container
        .wait_exit(Duration::from_secs(FAULT_BUDGET_SECS + 30))
        .unwrap_or_else(|| panic!("no poweroff:\n{}", container.journal_text()));
    let (signal, release) = signal_and_release(&container);
    let journal = container.journal_text();
    let reqs = f.requests();
    let records = f.kubelet.records();
    for name in [
        "late-under-way",
        "late-after-its-band",
        "late-in-the-last-band",
    ] {
        let r = records
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("{name} never ran\n{journal}"));
        let gone = r
            .gone_at
            .unwrap_or_else(|| panic!("{name} left running\n{journal}"));
        assert!(r.grace_cut_at.is_none(), "{name}: grace cut\n{journal}");
        evicted_once_never_deleted(&reqs, &journal, name, &r.key(), signal, false)
            .unwrap_or_else(|b| panic!("{}\n{journal}", b.detail));
        assert!(
            gone <= release,
            "released {:.2} s before {name} was gone\n{journal}",
            gone - release
        );
        eprintln!(
            "{name}: bound {:.2} s after the signal, gone {:.2} s after it",
            r.running_at.unwrap_or(0.0) - signal,
            gone - signal
        );
    }
    assert!(
        !journal.contains("escalated to DELETE"),
        "an escalation\n{journal}"
    );
    f.cleanup().await;
}

/// Row 2 of the fault table: the apiserver throttles (API Priority and Fairness answers 429)
/// the node's requests while a band of 100 pods drains at a poweroff. Every pod is evicted
/// once, none is DELETEd (a throttled request was not looked at: nothing holds the pod), and
/// the inhibitor goes within 2 s of the last pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_apiserver_costs_no_pod_its_grace() {
    if skip("a_throttling_apiserver_costs_no_pod_its_grace") {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().await;
    // The shipped budget (15 min): throttling slows the drain, and the Regular band's share
    // of a squeezed budget (20 s of 110 s) would be spent by it, escalating late evictions
    // with the grace left, as planned. The drain still has to end within the fault budget.
    let mut f = Fixture::new("ng-apf").await;
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    workload::deployment(
        c,
        &ns,
        &node,
        100,
        PodShape::new("web").exits_after_ms(1000),
    )
    .await;
    workload::deployment(
        c,
        &ns,
        &node,
        2,
        PodShape::new("crit")
            .priority("system-cluster-critical")
            .exits_after_ms(500),
    )
    .await;
    workload::daemonset(c, &ns, &node, false, PodShape::new("agent")).await;
    workload::static_pod(&f.node.manifests, &ns, PodShape::new("etcd"));
    f.kubelet.wait_running(104).await;
    f.node.boot();
    wait_pod_cache(&f.node.state, 104);

    f.cp.throttle(&node);
    let mut container = f.node.container.take().expect("booted");
    let _ = container.exec(&["systemctl", "poweroff"]);
    let exited = container.wait_exit(Duration::from_secs(FAULT_BUDGET_SECS + 30));
    f.cp.unthrottle(&node);
    exited.unwrap_or_else(|| panic!("no poweroff:\n{}", container.journal_text()));
    let (signal, release) = signal_and_release(&container);
    let journal = container.journal_text();
    let reqs = f.requests();
    let throttled: Vec<_> = reqs
        .iter()
        .filter(|r| r.code == 429 && r.received >= signal)
        .collect();
    let context = || {
        format!(
            "requests: {:#?}\njournal:\n{journal}",
            audit::count_by_kind(&reqs)
        )
    };
    assert!(
        throttled.len() >= 10,
        "the apiserver throttled {} requests: the fault did not happen\n{}",
        throttled.len(),
        context()
    );
    let last_gone = assert_each_pod_went_once(
        &f,
        &reqs,
        &journal,
        &["web-", "crit-", "agent-", "etcd-"],
        signal,
        &context,
    );
    assert_released_on_time(FAULT_BUDGET_SECS, signal, last_gone, release, &context);
    let after_signal = reqs.iter().filter(|r| r.received >= signal).count();
    eprintln!(
        "throttled: signal -> release {:.2} s, last pod gone -> release {:.3} s, {} of {after_signal} requests answered 429 ({:.1} requests per pod)",
        release - signal,
        release - last_gone,
        throttled.len(),
        after_signal as f64 / 104.0
    );
    f.cleanup().await;
}

/// Row 6 of the fault table: nodegrace's credential is refused mid-drain (its RBAC binding
/// deleted once the first band was asked to go). Every request then answers 403: one warning
/// names the identity and the refused permission in the apiserver's words; after
/// `fallback.apiserver_timeout` (shipped: 10 s) of refusals the shutdown goes on offline; the
/// pods already evicted are not asked again, the static manifest is gated, not lost.
///
/// RBAC only adds, so the credential is refused by deleting the shipped binding of the
/// `nodegrace:nodes` group (every node's nodegrace loses it: the tests of this binary run
/// alone); it is applied again when the test ends, failed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_refused_mid_drain_is_named_and_the_shutdown_goes_on_offline() {
    if skip("a_credential_refused_mid_drain_is_named_and_the_shutdown_goes_on_offline") {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().await;
    let (mut f, manifest) = booted_with_bands(
        "ng-rbac",
        false,
        Fault::ApiserverDuringTheFirstBand.config(),
    )
    .await;
    let node = f.name.clone();

    let mut container = f.node.container.take().expect("booted");
    let _ = container.exec(&["systemctl", "poweroff"]);
    wait_first_band_asked(&f).await;
    let _restore = BindingBack(f.cp);
    f.cp.kubectl_ok(&["delete", "clusterrolebinding", "nodegrace-node"]);
    let revoked = realk8s::now_unix();
    container
        .wait_exit(Duration::from_secs(FAULT_BUDGET_SECS + 30))
        .unwrap_or_else(|| panic!("no poweroff:\n{}", container.journal_text()));
    let (signal, release) = signal_and_release(&container);
    let journal = container.journal_text();
    let reqs = f.requests();
    let context = || {
        format!(
            "requests: {:#?}\njournal:\n{journal}",
            audit::count_by_kind(&reqs)
        )
    };
    let ours = container.journal_of("nodegrace");
    let user = format!("User \"nodegrace:node:{node}\" cannot");
    let named: Vec<_> = ours
        .iter()
        .filter(|l| {
            l.contains("the apiserver cannot be used")
                && l.field("ERROR").is_some_and(|e| e.contains(&user))
        })
        .collect();
    assert!(
        !named.is_empty(),
        "no warning names the identity and what it was refused\n{}",
        context()
    );
    let local = ours
        .iter()
        .find(|l| l.contains("draining locally"))
        .unwrap_or_else(|| panic!("the shutdown did not go on offline\n{}", context()));
    let timeout = 10.0;
    assert!(
        local.time - revoked >= timeout - 1.0 && local.time - revoked < timeout + 5.0,
        "offline {:.1} s after the credential was refused (fallback.apiserver_timeout {timeout} s)\n{}",
        local.time - revoked,
        context()
    );
    assert!(
        release - signal < FAULT_BUDGET_SECS as f64,
        "released {:.1} s after the signal\n{}",
        release - signal,
        context()
    );
    for r in f
        .kubelet
        .records()
        .iter()
        .filter(|r| r.name.starts_with("web-"))
    {
        let accepted = evictions(&reqs, &r.name)
            .iter()
            .filter(|e| e.code == 201)
            .count();
        assert_eq!(
            accepted,
            1,
            "{} evicted {accepted} times\n{}",
            r.key(),
            context()
        );
        assert!(
            deletes(&reqs, &r.name).is_empty(),
            "{} deleted\n{}",
            r.key(),
            context()
        );
    }
    let gated = f.node.state.join("gated-manifests").join("etcd.yaml");
    let kept = f.node.manifests.join("etcd.yaml");
    let copies: Vec<_> = [&gated, &kept]
        .into_iter()
        .filter(|p| std::fs::read(p).ok().as_deref() == Some(manifest.as_slice()))
        .collect();
    assert_eq!(
        copies.len(),
        1,
        "the static manifest must be in exactly one place, byte for byte: {copies:?}\n{}",
        context()
    );
    eprintln!(
        "credential refused: signal -> release {:.2} s, refused -> offline {:.2} s; named as: {}",
        release - signal,
        local.time - revoked,
        named[0].field("ERROR").unwrap_or_default()
    );
    f.cleanup().await;
}
