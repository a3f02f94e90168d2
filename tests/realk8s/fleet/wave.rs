//! One RebootWave on a [`Fleet`], sampled every second: every wave node is told it needs a
//! reboot (`/run/reboot-required`, as Debian's packages write it) while the wave's window is
//! closed, as updates land by day for a reboot at night; once all have joined the wave and
//! tainted themselves the window opens. [`Faults`] break the wave on the way: the daemon of
//! a node that drains SIGKILLed, the apiserver stopped once a second batch holds slots.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::Api;
use nodegrace::RebootWave;

use super::{pods_by_node, slots_of, Fleet, Machine, Reboot, Remote, Sample, Sampler};
use super::{JOIN_TIMEOUT, MAX_PER_ZONE, MAX_UNAVAILABLE, ZONES};
use crate::realk8s::now_unix;

/// Three turns of a drain, a container's reboot and the healthy time, on a loaded 2-core
/// machine.
pub const WAVE_TIMEOUT: Duration = Duration::from_secs(240);
/// What an outage adds to it besides its own length: the controllers started anew and
/// their leases taken ([`ControlPlane::heal`](crate::realk8s::ControlPlane::heal)), the
/// nodes that rebooted meanwhile connected.
const HEAL_TIMEOUT: Duration = Duration::from_secs(150);
/// How long after the window opens a node with pods to drain must hold a slot, for the kill.
const KILL_WITHIN: Duration = Duration::from_secs(60);
/// How long the fleet is watched after the wave, for a node that would reboot again.
const AFTER_WAVE: Duration = Duration::from_secs(6);

/// What goes wrong during a wave.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// SIGKILL to the daemon of a node that holds a slot and drains; the packaged unit
    /// restarts it.
    pub kill_a_holder: bool,
    /// The apiserver stopped this long once a node of the second batch holds a slot (and
    /// after the kill, when there is one).
    pub outage: Option<Duration>,
}

/// The daemon killed, Unix seconds.
#[derive(Debug, Clone)]
pub struct Killed {
    pub node: String,
    pub at: f64,
    /// When the node took its slot, as the slot says (whole seconds).
    pub taken: f64,
}

/// The apiserver away, Unix seconds.
#[derive(Debug, Clone)]
pub struct Outage {
    pub stopped: f64,
    /// The first sample after the restart that read the wave.
    pub answered: Option<f64>,
    /// The control plane whole again: the apiserver started, the controllers' leases taken.
    pub healed: Option<f64>,
}

/// One wave as the harness saw it (Unix seconds).
pub struct WaveRun {
    /// When the sentinels were written.
    pub touched: f64,
    /// When every node was a member of the wave and tainted.
    pub all_waiting: Option<f64>,
    pub opened: Option<f64>,
    /// The first sample with every node back and no slot left.
    pub ended: Option<f64>,
    pub samples: Vec<Sample>,
    /// What broke the wave's limits, sample by sample.
    pub broken: Vec<(f64, String)>,
    /// The pods as the wave found them: any other was made during the wave.
    pub originals: BTreeSet<String>,
    /// Each machine's reboots before the wave.
    pub marks: Vec<usize>,
    /// The nodes waiting before the wave: one not among them joins with its first write.
    pub waiting_before: BTreeSet<String>,
    pub killed: Option<Killed>,
    pub outage: Option<Outage>,
}

impl WaveRun {
    /// Each wave node's reboots during this wave.
    pub fn reboots(&self, f: &Fleet) -> Vec<(String, Vec<Reboot>)> {
        f.reboots_since(&self.marks)
    }
}

/// Carries out [`Faults`] as the samples come.
struct Driver {
    faults: Faults,
    kill: Option<tokio::task::JoinHandle<Option<Killed>>>,
    heal: Option<tokio::task::JoinHandle<()>>,
}

impl Driver {
    /// Once the window is open.
    async fn opened(&mut self, f: &Fleet) {
        if self.faults.kill_a_holder {
            let pods = pods_by_node(&f.admin, &f.ns).await;
            let remotes: Vec<Remote> = f.machines.iter().map(Machine::remote).collect();
            let waves: Api<RebootWave> = Api::all(f.admin.clone());
            let wave = f.wave.clone();
            self.kill = Some(tokio::spawn(kill_a_holder(waves, wave, remotes, pods)));
        }
    }

    async fn drive(&mut self, f: &Fleet, samples: &[Sample], run: &mut WaveRun) {
        if self.kill.as_ref().is_some_and(|k| k.is_finished()) {
            let kill = self.kill.take().expect("finished");
            run.killed = kill
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        }
        let Some(away) = self.faults.outage else {
            return;
        };
        let s = samples.last().expect("a sample");
        let Some(outage) = &mut run.outage else {
            let holders: BTreeSet<&str> = samples
                .iter()
                .flat_map(|s| s.slots.iter().flatten())
                .map(|slot| slot.node.as_str())
                .collect();
            let holding = s.slots.as_ref().is_some_and(|v| !v.is_empty());
            if holders.len() > MAX_UNAVAILABLE && holding && self.kill.is_none() {
                f.plane.store(false, Ordering::Relaxed);
                let cp = f.cp;
                tokio::task::block_in_place(|| cp.stop_apiserver());
                run.outage = Some(Outage {
                    stopped: now_unix(),
                    answered: None,
                    healed: None,
                });
            }
            return;
        };
        if outage.healed.is_some() {
            return;
        }
        if self.heal.is_none() && now_unix() - outage.stopped >= away.as_secs_f64() {
            let cp = f.cp;
            self.heal = Some(tokio::task::spawn_blocking(move || cp.heal()));
        }
        if self.heal.is_some() && outage.answered.is_none() && s.slots.is_some() {
            outage.answered = Some(s.at);
            // A real node's kubelet posts its status as soon as the apiserver answers.
            f.plane.store(true, Ordering::Relaxed);
        }
        if self.heal.as_ref().is_some_and(|h| h.is_finished()) {
            let heal = self.heal.take().expect("finished");
            if let Err(e) = heal.await {
                std::panic::resume_unwind(e.into_panic());
            }
            outage.healed = Some(now_unix());
            f.plane.store(true, Ordering::Relaxed);
        }
    }

    /// Whether what the faults broke is whole again.
    fn over(&self, run: &WaveRun) -> bool {
        self.faults.outage.is_none() || run.outage.as_ref().is_some_and(|o| o.healed.is_some())
    }
}

/// SIGKILL to the daemon of the first node seen holding a slot that had pods to drain,
/// looked for every 50 ms: its drain lasts a second or two (the budget lets one pod go at a
/// time), too short to be hit from the samples a second apart. `systemctl kill` signals every
/// process of the unit, the daemon's included.
async fn kill_a_holder(
    waves: Api<RebootWave>,
    wave: String,
    remotes: Vec<Remote>,
    pods: BTreeMap<String, Vec<String>>,
) -> Option<Killed> {
    let deadline = now_unix() + KILL_WITHIN.as_secs_f64();
    while now_unix() < deadline {
        if let Ok(Some(w)) = waves.get_opt(&wave).await {
            let draining = slots_of(w)
                .into_iter()
                .find(|s| pods.get(&s.node).is_some_and(|p| !p.is_empty()));
            if let Some(slot) = draining {
                let remote = remotes.iter().find(|r| r.name == slot.node)?;
                let argv = ["systemctl", "kill", "--signal=KILL", "nodegrace.service"];
                let at = now_unix();
                return remote.try_exec(&argv).then_some(Killed {
                    node: slot.node,
                    at,
                    taken: slot.taken,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Every wave node needs a reboot (the window closed until all have joined): the wave,
/// sampled every second until every node is back and no slot is left, with `faults` on the
/// way.
pub async fn run_wave(f: &mut Fleet, faults: Faults) -> WaveRun {
    f.set_window(false).await;
    let waiting_before = f.waiting().await;
    let touched = now_unix();
    let mut run = WaveRun {
        touched,
        all_waiting: None,
        opened: None,
        ended: None,
        samples: Vec::new(),
        broken: Vec::new(),
        originals: BTreeSet::new(),
        marks: f.reboot_marks(),
        waiting_before,
        killed: None,
        outage: None,
    };
    for m in &f.machines {
        m.exec(&["touch", "/run/reboot-required"]);
    }
    let timeout = WAVE_TIMEOUT + faults.outage.map_or(Duration::ZERO, |o| o + HEAL_TIMEOUT);
    let mut driver = Driver {
        faults,
        kill: None,
        heal: None,
    };
    let mut sampler = Sampler::new();
    loop {
        let s = sampler.next(f).await.clone();
        run.broken
            .extend(violations(f, &s, run.opened).into_iter().map(|v| (s.at, v)));
        let Some(opened) = run.opened else {
            if f.all_waiting().await {
                run.originals = pods_by_node(&f.admin, &f.ns)
                    .await
                    .into_values()
                    .flatten()
                    .collect();
                run.all_waiting = Some(now_unix());
                f.set_window(true).await;
                run.opened = Some(now_unix());
                driver.opened(f).await;
            } else if s.at - touched > JOIN_TIMEOUT.as_secs_f64() {
                break;
            }
            continue;
        };
        driver.drive(f, &sampler.samples, &mut run).await;
        let back = run
            .reboots(f)
            .iter()
            .all(|(_, r)| r.last().is_some_and(|r| r.up.is_some()));
        let done = back
            && f.machines.iter().all(|m| m.running())
            && s.slots.as_ref().is_some_and(Vec::is_empty)
            && s.cordoned.as_ref().is_some_and(BTreeSet::is_empty)
            && driver.over(&run);
        match run.ended {
            None if done => run.ended = Some(s.at),
            Some(end) if s.at - end >= AFTER_WAVE.as_secs_f64() => break,
            _ => {}
        }
        if run.ended.is_none() && s.at - opened > timeout.as_secs_f64() {
            break;
        }
    }
    // A heal under way when the wave gave up: the next test needs the control plane whole.
    if let Some(heal) = driver.heal.take() {
        let _ = heal.await;
        f.plane.store(true, Ordering::Relaxed);
    }
    run.samples = sampler.samples;
    run
}

/// What breaks the wave's limits in one sample.
pub fn violations(f: &Fleet, s: &Sample, opened: Option<f64>) -> Vec<String> {
    let mut out = Vec::new();
    let unavailable = s.unavailable();
    if unavailable.len() > MAX_UNAVAILABLE {
        out.push(format!(
            "{} nodes unavailable: {unavailable:?}",
            unavailable.len()
        ));
    }
    for zone in ZONES {
        let here: Vec<&String> = unavailable
            .iter()
            .filter(|n| f.zone_of(n) == zone)
            .collect();
        if here.len() > MAX_PER_ZONE {
            out.push(format!(
                "zone {zone}: {} nodes unavailable: {here:?}",
                here.len()
            ));
        }
    }
    for node in &unavailable {
        if s.holds(node) == Some(false) {
            out.push(format!("{node} unavailable without a slot"));
        }
    }
    if let Some(slots) = &s.slots {
        if slots.len() > MAX_UNAVAILABLE {
            out.push(format!("{} slots held: {slots:?}", slots.len()));
        }
        if !slots.is_empty() && opened.is_none() {
            out.push(format!(
                "slots taken while the window was closed: {slots:?}"
            ));
        }
    }
    out
}

/// Reboots that no slot covers: for each, the first sample after the node went down that
/// read the wave must show the node's slot, taken before it went down. A slot is freed only
/// a healthy time after the node is back, and no write reaches the wave while the
/// apiserver is away, so this judges a reboot during an outage too, by the first read after.
pub fn reboots_without_a_slot(run: &WaveRun, reboots: &[(String, Vec<Reboot>)]) -> Vec<String> {
    let mut out = Vec::new();
    for (node, rs) in reboots {
        for r in rs {
            let read = run
                .samples
                .iter()
                .filter(|s| s.at >= r.down)
                .find_map(|s| Some((s.at, s.slot(node)?.cloned())));
            match read {
                Some((_, Some(slot))) if slot.taken < r.down => {}
                Some((at, slot)) => out.push(format!(
                    "{node} went down at {:.1} without a slot: the wave read at {at:.1} shows {slot:?}",
                    r.down
                )),
                None => out.push(format!(
                    "{node} went down at {:.1} and no sample read the wave after",
                    r.down
                )),
            }
        }
    }
    out
}
