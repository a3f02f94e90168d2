//! Real-control-plane tier, a randomized fault soak: shutdowns of a node with pods in four
//! bands (`realk8s::faults::booted_with_bands`: the real control plane, the node's real
//! logind, the shipped configuration with a 110 s budget), each with ONE fault drawn at
//! random, at a random moment 0–6 s after `systemctl poweroff`:
//! the apiserver killed (SIGKILL) and started again 2–8 s later; etcd, the same; the daemon
//! killed (SIGKILL; systemd restarts it); the apiserver killed, then the daemon, the
//! apiserver back 2–8 s later; the node's dbus-daemon or logind restarted, or logind killed
//! (logind forgets the poweroff: `systemctl poweroff` again once nodegrace is armed again,
//! its drain stopped); the node's
//! requests throttled (429) for 2–8 s; nodegrace's credential refused (its RBAC binding
//! deleted) until the node is down.
//!
//! Half the runs whose fault can leave the kubelet finishing pods on its own, unseen (the
//! apiserver or etcd killed, the daemon killed), run on a node of the real kubelet v1.28.4
//! and its containerd (`realk8s::real_kubelet`, real busybox containers with the same
//! bands' exit times) instead of the stand-in; there every pod is checked from the
//! kubelet's own requests and its runtime (each container exited 0 on its own after
//! SIGTERM: no grace cut), the drain's bound has [`REAL_KUBELET_SLACK_SECS`] more, and an
//! outage lasts until the kubelet has caught up ([`kubelet_caught_up`]), plus what it was
//! slower than a second to act on a pod asked after that ([`kubelet_slow_to_act`]): the
//! kubelet's own back-offs after the apiserver returns, out of nodegrace's hands.
//! A soak of two runs or more has one of each.
//!
//! Each run draws from a seed of its own, printed before it starts (`soak seed: N`);
//! `NODEGRACE_SOAK_SEED=N` replays that run (`N,M,...`: those runs), `NODEGRACE_SOAK_RUNS`
//! sets the number of runs (3 by default; the long soak, `#[ignore]`d: 100). The runs end with a table of
//! fault × kubelet × moment × outcome and the seeds of the failures.
//!
//! Checked on every run, from the audit log and the kubelet stand-in's records
//! (`realk8s::faults`): no pod is left, none had its grace cut, none of the Deployments' pods
//! is DELETEd or evicted twice; the static manifest is gated byte for byte; the inhibitor is
//! released within the budget and within 2 s of the node being empty; the drain (signal to
//! release) within [`SLACK_SECS`] of ideal plus outage. A shutdown that went on offline (the
//! credential refused, or an outage longer than `fallback.apiserver_timeout`) is checked as
//! `realk8s_outage` checks one: released within the budget, no pod evicted twice or
//! DELETEd, the manifest in exactly one place, byte for byte; offline only after the
//! timeout, never on a shorter outage.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root; it stops the shared apiserver and etcd and
//! deletes the shipped RBAC binding for a while, so nothing else may use the control plane
//! meanwhile (cargo runs test binaries one after another).

mod real;
mod realk8s;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use nodegrace::v1 as cri;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use realk8s::faults::*;
use realk8s::fixture::{app_of, deletes, evictions};
use realk8s::real_kubelet::{self as rk, RealFixture};
use realk8s::workload::{self, PodShape};
use realk8s::ControlPlane;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The drain may take this much longer than ideal plus outage: the reconnection after an
/// outage (watches listed again, the first eviction within 1 s of the apiserver answering,
/// as `realk8s_outage` asserts), the kubelet stand-in's and the apiserver's answers on a
/// loaded 2-core machine, and the control plane's controllers being restarted meanwhile.
/// Issue 33 measured every drain within 3 s of ideal plus outage.
const SLACK_SECS: f64 = 3.0;

/// The node's `fallback.apiserver_timeout`: an outage shorter than this (less a second for
/// when the daemon last heard from the apiserver) never goes offline. 20 s, not the shipped
/// 10 s: up.sh restarts a killed apiserver in 9–11 s on a loaded 2-core machine, so with 10 s
/// every apiserver kill would go offline and none would try the drain planned again after an
/// outage (issue 33); `realk8s_outage`'s past-deadline faults do the same.
const APISERVER_TIMEOUT_SECS: u64 = 20;

/// The node's configuration drop-in: the fault budget and the apiserver timeout above.
fn soak_config(budget_secs: u64) -> String {
    format!(
        "[shutdown]\nmax_delay = \"{budget_secs}s\"\n[fallback]\napiserver_timeout = \"{APISERVER_TIMEOUT_SECS}s\"\n"
    )
}

/// The real-kubelet runs' budget: the kubelet's catching up after an outage
/// ([`kubelet_caught_up`], up to 23 s seen) comes on top of the apiserver's restart, which
/// with [`FAULT_BUDGET_SECS`] would leave the first band no time of its own and make its
/// escalation the plan; these runs are about the kubelet finishing pods unseen, so the
/// budget keeps every band's share and any escalation breaks an invariant.
const REAL_KUBELET_BUDGET_SECS: u64 = 180;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    ApiserverKilled,
    EtcdKilled,
    DaemonKilled,
    ApiserverThenDaemon,
    DbusRestarted,
    LogindRestarted,
    LogindKilled,
    Throttled,
    CredentialRevoked,
}

const FAULTS: [Fault; 8] = [
    Fault::ApiserverKilled,
    Fault::EtcdKilled,
    Fault::DaemonKilled,
    Fault::ApiserverThenDaemon,
    Fault::DbusRestarted,
    Fault::LogindRestarted,
    Fault::Throttled,
    Fault::CredentialRevoked,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::ApiserverKilled => "apiserver killed",
            Fault::EtcdKilled => "etcd killed",
            Fault::DaemonKilled => "daemon killed",
            Fault::ApiserverThenDaemon => "apiserver, then daemon",
            Fault::DbusRestarted => "dbus restarted",
            Fault::LogindRestarted => "logind restarted",
            Fault::LogindKilled => "logind killed",
            Fault::Throttled => "429 storm",
            Fault::CredentialRevoked => "credential revoked",
        }
    }

    /// Whether the fault lasts the drawn outage.
    fn lasts(self) -> bool {
        self.stops_control_plane() || self == Fault::Throttled
    }

    /// Whether the fault can leave the kubelet to finish pods on its own while nodegrace
    /// cannot see it (the runs that may be drawn onto the real kubelet).
    fn kubelet_matters(self) -> bool {
        self.stops_control_plane() || self == Fault::DaemonKilled
    }

    /// Whether the fault stops part of the control plane (started again after it).
    fn stops_control_plane(self) -> bool {
        matches!(
            self,
            Fault::ApiserverKilled | Fault::EtcdKilled | Fault::ApiserverThenDaemon
        )
    }
}

/// One run's draws, all from its seed.
#[derive(Debug, Clone, Copy)]
struct Draw {
    seed: u64,
    fault: Fault,
    /// Seconds after `systemctl poweroff`.
    moment: f64,
    /// How long the apiserver or etcd stays down, or the storm lasts, in seconds.
    outage: f64,
    /// On a node run by the real kubelet (and its containerd) rather than the stand-in.
    real_kubelet: bool,
    /// A pod is bound to the node at the fault's moment, just before the fault (issue 44):
    /// it keeps its grace as the others do.
    late_pod: bool,
}

impl Draw {
    fn new(seed: u64) -> Draw {
        let mut rng = StdRng::seed_from_u64(seed);
        let fault = FAULTS[rng.random_range(0..FAULTS.len())];
        let moment = rng.random_range(0.0..6.0);
        let outage = rng.random_range(2.0..8.0);
        // Drawn last, so that a seed from before the real-kubelet runs draws the same fault.
        let real_kubelet = fault.kubelet_matters() && rng.random_bool(REAL_KUBELET_SHARE);
        // Half the logind faults kill it (issue 44), drawn after everything else for the same
        // reason.
        let fault = if fault == Fault::LogindRestarted && rng.random_bool(0.5) {
            Fault::LogindKilled
        } else {
            fault
        };
        // On the stand-in, whose records the checks read; drawn last too.
        let late_pod = !real_kubelet && rng.random_bool(LATE_POD_SHARE);
        Draw {
            seed,
            fault,
            moment,
            outage,
            real_kubelet,
            late_pod,
        }
    }

    /// The shutdown budget of the run's node.
    fn budget_secs(&self) -> u64 {
        if self.real_kubelet {
            REAL_KUBELET_BUDGET_SECS
        } else {
            FAULT_BUDGET_SECS
        }
    }

    fn kubelet(&self) -> &'static str {
        if self.real_kubelet {
            "real"
        } else {
            "stand-in"
        }
    }

    /// The fault, its moment and (where it lasts it) the outage drawn.
    fn describe(&self) -> String {
        let mut text = format!(
            "{} {:.2} s after the poweroff",
            self.fault.name(),
            self.moment
        );
        if self.fault.lasts() {
            text.push_str(&format!(" for {:.2} s", self.outage));
        }
        if self.real_kubelet {
            text.push_str(", real kubelet");
        }
        if self.late_pod {
            text.push_str(", a pod bound to the node just before it");
        }
        text
    }

    /// The moment's bucket in the table.
    fn bucket(&self) -> &'static str {
        match self.moment {
            m if m < 2.0 => "0-2 s",
            m if m < 4.0 => "2-4 s",
            _ => "4-6 s",
        }
    }
}

/// How a run ended: passed (the fault landed before the release, or after it), or which
/// invariant broke, or the harness itself failed (a panic: its message).
#[derive(Debug, Clone)]
enum Outcome {
    Passed,
    PassedOffline,
    FaultAfterRelease,
    Broken(Broken),
    Harness(String),
}

impl Outcome {
    fn label(&self) -> String {
        match self {
            Outcome::Passed => "passed".into(),
            Outcome::PassedOffline => "passed (offline)".into(),
            Outcome::FaultAfterRelease => "passed (fault after the release)".into(),
            Outcome::Broken(b) => b.invariant.into(),
            Outcome::Harness(_) => "harness failed".into(),
        }
    }

    fn failed(&self) -> bool {
        matches!(self, Outcome::Broken(_) | Outcome::Harness(_))
    }
}

/// When the fault came and when it was over, and when the late pod's create was answered
/// (Unix seconds).
struct Injected {
    at: f64,
    over: f64,
    late_bound: Option<f64>,
}

/// Lifts a storm or gives the credential back, whatever the run did (the control plane is
/// started again by `inject`, or after a panic by `soak`).
struct Restore {
    cp: &'static ControlPlane,
    node: String,
    fault: Fault,
}

impl Drop for Restore {
    fn drop(&mut self) {
        match self.fault {
            Fault::Throttled => self.cp.unthrottle(&self.node),
            Fault::CredentialRevoked => self.cp.apply_cluster_side(),
            _ => {}
        }
    }
}

/// A line on the test's stderr even when the test passes (libtest captures `eprintln!`):
/// the seeds and the table belong in every run's output.
fn say(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

fn kill_daemon(container: &real::Container) {
    if let Some(pid) = container.host_pid_of("/usr/bin/nodegrace") {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Blocking control-plane calls, off the runtime's workers.
async fn blocking(f: impl FnOnce() + Send + 'static) {
    tokio::task::spawn_blocking(f).await.expect("control plane");
}

/// Injects `d`'s fault into the shutdown under way. The apiserver and etcd are back (and
/// the controllers started anew) when it returns.
async fn inject(
    d: &Draw,
    cp: &'static ControlPlane,
    node: &str,
    container: &mut real::Container,
) -> Result<Injected, Broken> {
    let outage = Duration::from_secs_f64(d.outage);
    let at = realk8s::now_unix();
    let over = match d.fault {
        Fault::ApiserverKilled | Fault::EtcdKilled | Fault::ApiserverThenDaemon => {
            if d.fault == Fault::EtcdKilled {
                cp.stop_etcd();
            } else {
                cp.stop_apiserver();
            }
            if d.fault == Fault::ApiserverThenDaemon {
                kill_daemon(container);
            }
            tokio::time::sleep(outage).await;
            blocking(move || cp.up()).await;
            let back = realk8s::now_unix();
            blocking(move || cp.heal()).await;
            back
        }
        Fault::DaemonKilled => {
            kill_daemon(container);
            // Over when systemd restarted it: read from the journal once the node is down.
            at
        }
        Fault::DbusRestarted | Fault::LogindRestarted | Fault::LogindKilled => {
            let unit = if d.fault == Fault::DbusRestarted {
                "dbus.service"
            } else {
                "systemd-logind.service"
            };
            if d.fault == Fault::LogindKilled {
                let _ = container.exec(&["systemctl", "kill", "--signal=KILL", unit]);
            } else {
                let _ = container.exec(&["systemctl", "restart", "--no-block", unit]);
            }
            // logind forgets the poweroff: nodegrace takes a new inhibitor before it lets
            // the old one go and is armed again; the operator powers off again.
            let deadline = at + 30.0;
            loop {
                if container.wait_exit(Duration::from_millis(50)).is_some() {
                    break realk8s::now_unix();
                }
                let ours = container.journal_of("nodegrace");
                let why = |reason: &str| {
                    ours.iter()
                        .find(|l| l.time >= at && l.field("REASON") == Some(reason))
                        .map(|l| l.time)
                };
                let replaced = why("replaced by the inhibitor taken after reconnecting");
                // A drain that finished before the fault (or as it came) let its inhibitor go
                // already: there is none to replace.
                let released = ours
                    .iter()
                    .find(|l| l.field("REASON") == Some("drain finished"))
                    .map(|l| l.time);
                let armed = why(
                    "logind restarted and lost the shutdown: the drain stopped; ask for the shutdown again",
                );
                let let_go = replaced.or(released);
                if let_go.zip(armed).is_some_and(|(r, a)| r <= a) {
                    let _ = container.exec(&["systemctl", "poweroff"]);
                    break realk8s::now_unix();
                }
                if realk8s::now_unix() > deadline {
                    return Err(Broken {
                        invariant: "not armed again",
                        detail: format!(
                            "{unit} restarted: no new inhibitor and no cancelled shutdown within 30 s"
                        ),
                    });
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Fault::Throttled => {
            let node = node.to_owned();
            let again = node.clone();
            blocking(move || cp.throttle(&node)).await;
            tokio::time::sleep(outage).await;
            blocking(move || cp.unthrottle(&again)).await;
            realk8s::now_unix()
        }
        Fault::CredentialRevoked => {
            blocking(move || {
                cp.kubectl_ok(&["delete", "clusterrolebinding", "nodegrace-node"]);
            })
            .await;
            // Refused until the node is down (the binding comes back with `Restore`).
            at
        }
    };
    Ok(Injected {
        at,
        over,
        late_bound: None,
    })
}

/// What a run measured, for its line in the output.
#[derive(Default)]
struct Measured {
    drain: f64,
    bound: f64,
    outage: f64,
    offline: bool,
    throttled: usize,
    /// On the real kubelet: how long after the apiserver's return the kubelet had caught up
    /// ([`kubelet_caught_up`]), plus how much it was slow to act ([`kubelet_slow_to_act`]):
    /// part of the outage.
    kubelet_lag: f64,
}

/// One shutdown with `d`'s fault, and its checks.
async fn run_once(d: Draw) -> (Outcome, Measured) {
    if d.real_kubelet {
        run_on_real_kubelet(d).await
    } else {
        run_on_stand_in(d).await
    }
}

/// Powers the booted node off, injects `d`'s fault and waits for the node to go down.
/// `None` when it did not. `late`: the client and namespace to bind `d`'s late pod with.
async fn poweroff_with_fault(
    d: &Draw,
    cp: &'static ControlPlane,
    node: &str,
    container: &mut real::Container,
    late: Option<(&kube::Client, &str)>,
) -> Option<Result<Injected, Broken>> {
    let _ = container.exec(&["systemctl", "poweroff"]);
    tokio::time::sleep(Duration::from_secs_f64(d.moment)).await;
    let mut late_bound = None;
    if let (true, Some((client, ns))) = (d.late_pod, late) {
        let shape = PodShape::new(LATE_APP).exits_after_ms(1000);
        workload::bound_pod(client, ns, node, &format!("{LATE_APP}-{}", d.seed), shape).await;
        late_bound = Some(realk8s::now_unix());
    }
    let injected = inject(d, cp, node, container).await.map(|mut i| {
        i.late_bound = late_bound;
        i
    });
    let exited = tokio::task::block_in_place(|| {
        container.wait_exit(Duration::from_secs(d.budget_secs() + 30))
    });
    exited.map(|_| injected)
}

fn no_poweroff(d: &Draw) -> Outcome {
    Outcome::Broken(broken(
        "no poweroff",
        format!(
            "the node is still up {} s + 30 s after the fault",
            d.budget_secs()
        ),
    ))
}

async fn run_on_stand_in(d: Draw) -> (Outcome, Measured) {
    let (mut f, manifest) = booted_with_bands("ng-soak", true, soak_config(d.budget_secs())).await;
    let restore = Restore {
        cp: f.cp,
        node: f.name.clone(),
        fault: d.fault,
    };
    let mut container = f.node.container.take().expect("booted");
    let admin = f.admin.clone();
    let down =
        poweroff_with_fault(&d, f.cp, &f.name, &mut container, Some((&admin, &f.name))).await;
    if d.fault == Fault::CredentialRevoked {
        drop(restore);
    }
    let journal = container.journal_text();
    let mut m = Measured::default();
    let outcome = match down {
        None => no_poweroff(&d),
        Some(Err(b)) => Outcome::Broken(b),
        Some(Ok(i)) => {
            let reqs: Vec<_> = f
                .requests()
                .into_iter()
                .filter(|r| r.user_agent.starts_with("nodegrace/"))
                .collect();
            let node = Node {
                container: &container,
                reqs: &reqs,
                manifest: &manifest,
                manifests: &f.node.manifests,
                state: &f.node.state,
            };
            let deployments: Vec<String> = f
                .kubelet
                .records()
                .iter()
                .filter(|r| r.name.starts_with("web-") || r.name.starts_with("crit-"))
                .map(|r| r.name.clone())
                .collect();
            check(&d, &node, &i, &deployments, &mut m, |signal, release| {
                let mut apps = vec!["web-", "crit-", "agent-", "etcd-"];
                // A late pod is the drain's when it was bound before the drain ended, by
                // more than the daemon's watch takes to deliver it; one bound after (its
                // moment came after the release) was never the drain's.
                if i.late_bound
                    .is_some_and(|at| at + LATE_POD_SEEN_SECS < release)
                {
                    apps.push("late-");
                }
                each_pod_went_once(&f, &reqs, &journal, &apps, signal)
            })
            .unwrap_or_else(Outcome::Broken)
        }
    };
    if outcome.failed() {
        eprintln!(
            "soak seed {}: {:?}\njournal:\n{journal}\nrequests: {:#?}",
            d.seed,
            outcome,
            realk8s::audit::count_by_kind(&f.requests())
        );
    }
    f.cleanup().await;
    (outcome, m)
}

/// The apps of a real-kubelet run, the bands of `booted_with_bands`: 3 `web` pods, 1
/// critical `crit`, the DaemonSet's `agent`, the static `etcd`.
const REAL_APPS: [(&str, usize); 4] = [("web", 3), ("crit", 1), ("agent", 1), ("etcd", 1)];

/// The share of the stand-in's runs that also bind a pod to the node during the drain.
const LATE_POD_SHARE: f64 = 0.3;

/// Time for the daemon to see a pod bound to its node: a late pod bound less than this
/// before the release may have come after the drain found the node empty.
const LATE_POD_SEEN_SECS: f64 = 0.5;

/// The share of the runs whose fault can leave the kubelet finishing pods unseen
/// ([`Fault::kubelet_matters`]) that run on the real kubelet.
const REAL_KUBELET_SHARE: f64 = 0.5;

/// What the real kubelet adds to a drain over the stand-in, in seconds: each band is gone
/// once the kubelet has written its pods' terminal status (it syncs a pod after its
/// containers exit), and the static pod once the kubelet has looked at its staticPodPath
/// again and deleted the mirror pod.
const REAL_KUBELET_SLACK_SECS: f64 = 4.0;

/// The node of `booted_with_bands` run by a real kubelet (real busybox containers that exit
/// the bands' times after SIGTERM), the original pods and the static manifest's bytes.
async fn booted_on_real_kubelet() -> (RealFixture, Vec<Pod>, Vec<u8>) {
    let mut f = RealFixture::new("ng-soakr", "", false).await;
    f.node.config_dropins.push((
        "50-budget.toml".into(),
        soak_config(REAL_KUBELET_BUDGET_SECS),
    ));
    let (c, ns, node) = (&f.admin.clone(), f.name.clone(), f.name.clone());
    let real = |app| PodShape::new(app).on_real_kubelet();
    let ms = |band: usize| (BAND_EXITS[band] * 1000.0) as u64;
    workload::deployment(c, &ns, &node, 3, real("web").exits_after_ms(ms(0))).await;
    let crit = real("crit").priority("system-cluster-critical");
    workload::deployment(c, &ns, &node, 1, crit.exits_after_ms(ms(1))).await;
    workload::daemonset(c, &ns, &node, false, real("agent").exits_after_ms(ms(2))).await;
    workload::static_pod(
        &f.kubelet.manifests(),
        &ns,
        real("etcd").exits_after_ms(ms(3)),
    );
    let manifest = std::fs::read(f.kubelet.manifests().join("etcd.yaml")).expect("manifest");
    let originals = rk::wait_running(c, &ns, &node, &REAL_APPS, Duration::from_secs(90)).await;
    f.node.boot();
    wait_pod_cache(&f.node.state, originals.len());
    (f, originals, manifest)
}

async fn run_on_real_kubelet(d: Draw) -> (Outcome, Measured) {
    let (mut f, originals, manifest) = booted_on_real_kubelet().await;
    let endpoint = format!("unix://{}", f.kubelet.dir.join("containerd.sock").display());
    let runtime = rk::ContainerWatch::start(&endpoint);
    let mut container = f.node.container.take().expect("booted");
    let down = poweroff_with_fault(&d, f.cp, &f.name, &mut container, None).await;
    let journal = container.journal_text();
    let mut m = Measured::default();
    let outcome = match down {
        None => no_poweroff(&d),
        Some(Err(b)) => Outcome::Broken(b),
        Some(Ok(mut i)) => {
            let kubelets = f.kubelet_requests();
            let ctrs = runtime.seen();
            let running_now: std::collections::BTreeSet<String> = rk::containers(&endpoint)
                .await
                .into_iter()
                .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
                .map(|c| c.id)
                .collect();
            let reqs = f.nodegrace_requests();
            if d.fault.stops_control_plane() {
                let back = kubelet_caught_up(&originals, &kubelets, &reqs, &ctrs, &f.name, i.over);
                let gated = container
                    .journal_of("nodegrace")
                    .iter()
                    .find(|l| l.contains("static pod manifest gated"))
                    .map(|l| l.time);
                let slow = kubelet_slow_to_act(&originals, &reqs, &ctrs, gated, back);
                m.kubelet_lag = (back - i.over).max(0.0) + slow;
                i.over = i.over.max(back) + slow;
            }
            let node = Node {
                container: &container,
                reqs: &reqs,
                manifest: &manifest,
                manifests: &f.kubelet.manifests(),
                state: &f.node.state,
            };
            let deployments: Vec<String> = originals
                .iter()
                .filter(|p| matches!(app_of(p).as_str(), "web" | "crit"))
                .map(|p| p.name_any())
                .collect();
            check(&d, &node, &i, &deployments, &mut m, |signal, _| {
                let kubelet = KubeletRecord {
                    requests: &kubelets,
                    containers: &ctrs,
                    running_now: &running_now,
                };
                real_pods_went_once(&originals, &reqs, &kubelet, &journal, &f.name, signal)
            })
            .unwrap_or_else(Outcome::Broken)
        }
    };
    drop(runtime);
    if outcome.failed() {
        eprintln!(
            "soak seed {}: {:?}\njournal:\n{journal}\nnodegrace: {:#?}\nkubelet: {:#?}\nkubelet log:\n{}",
            d.seed,
            outcome,
            realk8s::audit::count_by_kind(&f.nodegrace_requests()),
            realk8s::audit::count_by_kind(&f.kubelet_requests()),
            f.kubelet.log_tail()
        );
    }
    drop(container);
    f.kubelet.down();
    f.cleanup().await;
    (outcome, m)
}

/// [`each_pod_went_once`] on the real kubelet, from its own requests and its runtime: every
/// original pod stopped by the kubelet (its terminal status written, or the mirror pod
/// deleted), none still running, every container of theirs seen exiting exited on its own
/// after SIGTERM (exit code 0: none was killed at the end of a grace period cut short),
/// each Deployment pod evicted exactly once and never DELETEd. Returns when the last of
/// them went.
fn real_pods_went_once(
    originals: &[Pod],
    reqs: &[realk8s::audit::Request],
    kubelet: &KubeletRecord,
    journal: &str,
    node: &str,
    signal: f64,
) -> Result<f64, Broken> {
    let KubeletRecord {
        requests: kubelets,
        containers: ctrs,
        running_now,
    } = kubelet;
    let mirror = format!("etcd-{node}");
    let mut last_gone = 0f64;
    for p in originals {
        let name = p.name_any();
        let gone = rk::stopped(kubelets, reqs, &name, &mirror)
            .ok_or_else(|| broken("a pod left running", format!("{name} still there")))?;
        last_gone = last_gone.max(gone);
        let ours: Vec<&rk::Ctr> = ctrs.iter().filter(|c| c.pod == name).collect();
        if ours.is_empty() {
            return Err(broken(
                "a pod left running",
                format!("the runtime never showed {name}'s containers"),
            ));
        }
        // A container last seen running that the runtime no longer has ended and was
        // removed between two looks (the kubelet removes a deleted pod's containers at
        // once): its end was not seen, so it is not judged.
        if let Some(c) = ours.iter().find(|c| running_now.contains(&c.id)) {
            return Err(broken(
                "a pod left running",
                format!("{name}: container {} still running", c.id),
            ));
        }
        if let Some(c) = ours
            .iter()
            .find(|c| c.state == cri::ContainerState::ContainerExited as i32 && c.exit_code != 0)
        {
            return Err(broken(
                "grace cut",
                format!(
                    "{name}: container {} exited {} ({:.2} s after the signal)",
                    c.id,
                    c.exit_code,
                    c.finished - signal
                ),
            ));
        }
        if matches!(app_of(p).as_str(), "web" | "crit") {
            // No time of the pod's deletion is seen on this path to tell a lost audit record.
            evicted_once_never_deleted(reqs, journal, &name, &name, signal, false)?;
        }
    }
    Ok(last_gone)
}

/// When the kubelet had caught up after the apiserver came back at `back`: it watches its
/// pods again (client-go's back-off after the refused connections: only then does it learn
/// of an eviction), and it has written every pod whose containers ended while the
/// apiserver was away (only then can the API, which alone may release the node, know it).
/// Both are the kubelet's, out of nodegrace's hands; seen up to 23 s after the return.
fn kubelet_caught_up(
    originals: &[Pod],
    kubelets: &[realk8s::audit::Request],
    ours: &[realk8s::audit::Request],
    ctrs: &[rk::Ctr],
    node: &str,
    back: f64,
) -> f64 {
    let mirror = format!("etcd-{node}");
    let watching = kubelets
        .iter()
        .filter(|r| r.resource == "pods" && r.subresource.is_empty())
        .filter(|r| matches!(r.verb.as_str(), "list" | "watch"))
        .filter(|r| r.received >= back && (r.code == 200 || r.code == 0))
        .map(|r| r.received)
        .reduce(f64::min)
        .unwrap_or(back);
    let written = originals
        .iter()
        .filter_map(|p| {
            let name = p.name_any();
            let ended = ctrs
                .iter()
                .filter(|c| c.pod == name)
                .map(|c| c.finished)
                .reduce(f64::max)?;
            let known = rk::stopped(kubelets, ours, &name, &mirror)?;
            (ended < back && known > back).then_some(known)
        })
        .fold(back, f64::max);
    watching.max(written)
}

/// How much longer than a second the kubelet took to begin stopping a pod it was asked to
/// stop once it had caught up (its SIGTERM: the container's end less the band's exit time),
/// the slowest pod of each band, summed over the bands: after an outage the kubelet's pod
/// workers come back from a back-off of their own (seen acting on an eviction 19 s after it
/// watched its pods again). Out of nodegrace's hands, like the outage it follows.
fn kubelet_slow_to_act(
    originals: &[Pod],
    reqs: &[realk8s::audit::Request],
    ctrs: &[rk::Ctr],
    gated: Option<f64>,
    caught_up: f64,
) -> f64 {
    let mut per_band = [0f64; 4];
    for p in originals {
        let name = p.name_any();
        let band = match app_of(p).as_str() {
            "web" => 0,
            "crit" => 1,
            "agent" => 2,
            _ => 3,
        };
        let asked = match band {
            0 | 1 => evictions(reqs, &name)
                .iter()
                .filter(|e| e.code == 201)
                .map(|e| e.received)
                .reduce(f64::min),
            2 => deletes(reqs, &name)
                .iter()
                .map(|e| e.received)
                .reduce(f64::min),
            _ => gated,
        };
        let ended = ctrs
            .iter()
            .filter(|c| c.pod == name)
            .map(|c| c.finished)
            .reduce(f64::max);
        if let (Some(asked), Some(ended)) = (asked, ended) {
            let slow = ended - BAND_EXITS[band] - asked.max(caught_up) - 1.0;
            per_band[band] = per_band[band].max(slow);
        }
    }
    per_band.iter().sum()
}

/// What the real kubelet did: its requests, every container its runtime showed while the
/// node drained, and those still running after.
struct KubeletRecord<'a> {
    requests: &'a [realk8s::audit::Request],
    containers: &'a [rk::Ctr],
    running_now: &'a std::collections::BTreeSet<String>,
}

/// What a run left to check: the node and nodegrace's requests, the static
/// manifest's bytes and where it lives and is gated.
struct Node<'a> {
    container: &'a real::Container,
    reqs: &'a [realk8s::audit::Request],
    manifest: &'a [u8],
    manifests: &'a std::path::Path,
    state: &'a std::path::Path,
}

fn broken(invariant: &'static str, detail: String) -> Broken {
    Broken { invariant, detail }
}

/// The invariants of a run whose node is down; `went` checks the pods (the stand-in's
/// records or the real kubelet's) and returns when the last one went.
fn check(
    d: &Draw,
    node: &Node,
    i: &Injected,
    deployments: &[String],
    m: &mut Measured,
    went: impl FnOnce(f64, f64) -> Result<f64, Broken>,
) -> Result<Outcome, Broken> {
    let logind = node.container.journal_of("systemd-logind");
    let ours = node.container.journal_of("nodegrace");
    let signal = real::first_with(&logind, "The system will power off now")
        .ok_or_else(|| broken("no poweroff", "logind never announced it".into()))?
        .time;
    // The poweroff that went through: the second one where logind forgot the first.
    let last_signal =
        real::last_with(&logind, "The system will power off now").map_or(signal, |l| l.time);
    let release = ours
        .iter()
        .rev()
        .find(|l| l.contains("phase change") && l.field("PHASE") == Some("Released"))
        .ok_or_else(|| broken("never released", "no Released phase change".into()))?
        .time;
    let reqs = node.reqs;
    m.throttled = reqs
        .iter()
        .filter(|r| r.code == 429 && r.received >= signal)
        .count();
    let after_release = i.at >= release;
    let over = if d.fault == Fault::DaemonKilled {
        // The restarted daemon's first line.
        let killed = ours.iter().rev().find(|l| l.time <= i.at).map(|l| &l.pid);
        ours.iter()
            .find(|l| l.time > i.at && Some(&l.pid) != killed)
            .map_or(i.at, |l| l.time)
    } else {
        i.over
    };
    m.outage = if after_release { 0.0 } else { over - i.at };
    m.drain = release - signal;
    m.offline = ours.iter().any(|l| l.contains("draining locally"));

    let gated = node.state.join("gated-manifests").join("etcd.yaml");
    if m.offline {
        let local = ours
            .iter()
            .find(|l| l.contains("draining locally"))
            .map_or(release, |l| l.time);
        let refused_for = local - i.at;
        let long_outage =
            d.fault.stops_control_plane() && m.outage >= APISERVER_TIMEOUT_SECS as f64 - 1.0;
        if d.fault != Fault::CredentialRevoked && !long_outage {
            return Err(broken(
                "offline without a long outage",
                format!("drained locally; outage {:.1} s", m.outage),
            ));
        }
        if d.fault == Fault::CredentialRevoked
            && !(APISERVER_TIMEOUT_SECS as f64 - 1.0..APISERVER_TIMEOUT_SECS as f64 + 5.0)
                .contains(&refused_for)
        {
            return Err(broken(
                "offline not at the timeout",
                format!("offline {refused_for:.1} s after the credential was refused"),
            ));
        }
        if release - signal >= d.budget_secs() as f64 {
            return Err(broken(
                "released after the budget",
                format!("released {:.1} s after the signal", release - signal),
            ));
        }
        for name in deployments {
            let accepted = evictions(reqs, name)
                .iter()
                .filter(|e| e.code == 201)
                .count();
            if accepted > 1 {
                return Err(broken(
                    "not evicted exactly once",
                    format!("{name} evicted {accepted} times"),
                ));
            }
            if !deletes(reqs, name).is_empty() {
                return Err(broken("a pod deleted", format!("{name} deleted")));
            }
        }
        let kept = node.manifests.join("etcd.yaml");
        let copies = [&gated, &kept]
            .into_iter()
            .filter(|p| std::fs::read(p).ok().as_deref() == Some(node.manifest))
            .count();
        if copies != 1 {
            return Err(broken(
                "static manifest lost",
                format!("the manifest is in {copies} places, byte for byte"),
            ));
        }
        return Ok(Outcome::PassedOffline);
    }

    let last_gone = went(signal, release)?;
    // After logind forgot the poweroff the node waits, empty or not, for the next one; and
    // a node that emptied while the apiserver (or the daemon) was away can be known empty
    // only once it is back.
    let known_empty_from = if after_release {
        last_gone
    } else {
        last_gone.max(over)
    };
    released_on_time(
        d.budget_secs(),
        last_signal,
        known_empty_from.max(last_signal),
        release,
    )?;
    if std::fs::read(&gated).ok().as_deref() != Some(node.manifest) {
        return Err(broken(
            "static manifest lost",
            format!("not gated byte for byte at {}", gated.display()),
        ));
    }
    let ideal: f64 = BAND_EXITS.iter().sum();
    let slack = if d.real_kubelet {
        SLACK_SECS + REAL_KUBELET_SLACK_SECS
    } else {
        SLACK_SECS
    };
    m.bound = ideal + m.outage + slack;
    if m.drain > m.bound {
        return Err(broken(
            "drain over its bound",
            format!(
                "signal -> release {:.2} s, bound {:.2} s (ideal {ideal:.1} + outage {:.2} + {slack})",
                m.drain, m.bound, m.outage
            ),
        ));
    }
    Ok(if after_release {
        Outcome::FaultAfterRelease
    } else {
        Outcome::Passed
    })
}

struct Run {
    draw: Draw,
    outcome: Outcome,
}

/// `runs` shutdowns with a fresh seed each (or those `NODEGRACE_SOAK_SEED` replays); the
/// table printed; fails if any run broke an invariant.
async fn soak(runs: u64) {
    let _serial = ONE_AT_A_TIME.lock().await;
    let seeds: Vec<u64> = match std::env::var("NODEGRACE_SOAK_SEED") {
        Ok(list) => list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("NODEGRACE_SOAK_SEED={list}: not seeds"))
            })
            .collect(),
        Err(_) => fresh_seeds(runs),
    };
    let mut done = Vec::new();
    for (n, seed) in seeds.iter().enumerate() {
        let d = Draw::new(*seed);
        say(&format!("soak seed: {seed}"));
        say(&format!(
            "soak run {}/{}: {}",
            n + 1,
            seeds.len(),
            d.describe()
        ));
        let ran = tokio::spawn(run_once(d)).await;
        let (outcome, m) = match ran {
            Ok(r) => r,
            Err(e) => {
                let message = e.into_panic();
                let text = message
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| message.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                // The control plane as it was before the run, whatever the panic left.
                blocking(|| realk8s::control_plane().heal()).await;
                (Outcome::Harness(text), Measured::default())
            }
        };
        let figures = match &outcome {
            Outcome::Harness(text) => text.lines().next().unwrap_or_default().to_owned(),
            _ if m.offline => format!(
                "signal -> release {:.2} s, offline, outage {:.2} s",
                m.drain, m.outage
            ),
            _ => format!(
                "signal -> release {:.2} s, bound {:.2} s, outage {:.2} s",
                m.drain, m.bound, m.outage
            ),
        };
        let storm = if d.fault == Fault::Throttled {
            format!(", {} answered 429", m.throttled)
        } else if m.kubelet_lag > 0.0 {
            format!(", the kubelet {:.2} s behind the apiserver", m.kubelet_lag)
        } else {
            String::new()
        };
        say(&format!(
            "soak run {}/{} seed {seed}: {} ({figures}{storm})",
            n + 1,
            seeds.len(),
            outcome.label()
        ));
        done.push(Run { draw: d, outcome });
    }
    say(&table(&done));
    let failures: Vec<String> = done
        .iter()
        .filter(|r| r.outcome.failed())
        .map(|r| {
            let detail = match &r.outcome {
                Outcome::Broken(b) => b.detail.clone(),
                Outcome::Harness(text) => text.lines().next().unwrap_or_default().to_owned(),
                _ => String::new(),
            };
            format!(
                "seed {}: {}: {}: {detail}",
                r.draw.seed,
                r.draw.describe(),
                r.outcome.label()
            )
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} runs failed (replay with NODEGRACE_SOAK_SEED=<seed>[,<seed>...]):\n{}",
        failures.len(),
        done.len(),
        failures.join("\n")
    );
}

/// `runs` fresh seeds; from two runs on, drawn again until both kubelets have a run (each
/// run still a function of its seed alone, so that it replays).
fn fresh_seeds(runs: u64) -> Vec<u64> {
    loop {
        let seeds: Vec<u64> = (0..runs).map(|_| rand::random::<u32>().into()).collect();
        let real = seeds.iter().filter(|s| Draw::new(**s).real_kubelet).count();
        if runs < 2 || (real > 0 && real < seeds.len()) {
            return seeds;
        }
    }
}

/// Fault × kubelet × moment bucket × outcome, with the seeds of the failures.
fn table(runs: &[Run]) -> String {
    let mut rows: BTreeMap<(Fault, &str, &str, String), Vec<&Run>> = BTreeMap::new();
    for r in runs {
        let key = (
            r.draw.fault,
            r.draw.kubelet(),
            r.draw.bucket(),
            r.outcome.label(),
        );
        rows.entry(key).or_default().push(r);
    }
    let mut out = format!(
        "{:<24} {:<8} {:<7} {:<34} {:>4}  seeds of failures\n",
        "fault", "kubelet", "moment", "outcome", "runs"
    );
    for ((fault, kubelet, bucket, label), rs) in &rows {
        let seeds: Vec<String> = rs
            .iter()
            .filter(|r| r.outcome.failed())
            .map(|r| r.draw.seed.to_string())
            .collect();
        out.push_str(&format!(
            "{:<24} {kubelet:<8} {bucket:<7} {label:<34} {:>4}  {}\n",
            fault.name(),
            rs.len(),
            seeds.join(" ")
        ));
    }
    let failed = runs.iter().filter(|r| r.outcome.failed()).count();
    out.push_str(&format!(
        "soak: {} runs, {} passed, {failed} failed",
        runs.len(),
        runs.len() - failed
    ));
    out
}

fn skip(test: &str) -> bool {
    if !realk8s::enabled(&format!("realk8s_soak::{test}")) {
        return true;
    }
    real::require_prerequisites();
    false
}

/// The short soak `scripts/test-all` runs: a few shutdowns, each with a random fault at a
/// random moment, from fresh seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_at_random_moments_break_no_invariant() {
    if skip("random_faults_at_random_moments_break_no_invariant") {
        return;
    }
    soak(env_u64("NODEGRACE_SOAK_RUNS").unwrap_or(3)).await;
}

/// The long soak (README, "Run the tests"):
/// `NODEGRACE_REAL_TESTS=1 cargo test --test realk8s_soak -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long soak: 100 shutdowns, about 45 minutes; run by hand (README)"]
async fn the_long_soak() {
    if skip("the_long_soak") {
        return;
    }
    soak(env_u64("NODEGRACE_SOAK_RUNS").unwrap_or(100)).await;
}
