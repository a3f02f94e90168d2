//! The node's part in its reboot wave (issue 43): it needs a reboot when the sentinel file
//! is there; it joins the wave that selects it, taints itself so the scheduler keeps pods
//! off it, takes a slot when `plan::wave::next` says so and asks logind to reboot; the
//! shutdown then drains as any other. After the boot it frees the slot once healthy for the
//! wave's healthy time. Each step is one write of the wave's status with the
//! resourceVersion read, so the apiserver orders them and its admission policy holds the
//! limits; a conflict is read again at the next event.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::PostParams;
use kube::runtime::{reflector, watcher, WatchStreamExt as _};
use kube::{Api, ResourceExt as _};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{RebootWave, RebootWaveStatus, SlotPhase, WaveMember, WaveSlot, ONE_AT_A_TIME};
use crate::cluster::backoff::backed_off;
use crate::cluster::gateway::{self, Kind};
use crate::cluster::node::{patch_node_with, reboot_pending_taint_patch, REBOOT_PENDING_TAINT_KEY};
use crate::cluster::Engine;
use crate::config::RebootSettings;
use crate::plan::selector::Selector;
use crate::plan::wave::{
    self, Held, Limit, Member, Mine, Opening, Phase, Rules, Seen, Step, Why, Window,
};

/// `nodegrace reboot`: an operator asks for this node's turn.
pub(crate) const ASKED: &str = "/run/nodegrace/reboot-requested";

/// The reasons of the Events the wave writes on the node (`nodegrace history --wave` reads them).
pub(crate) const TAKEN: &str = "RebootSlotTaken";
pub(crate) const FREED: &str = "RebootSlotFreed";
pub(crate) const TAKEN_BACK: &str = "RebootSlotTakenBack";
pub(crate) const STUCK: &str = "RebootWaveStuck";
pub(crate) const WAITING: &str = "RebootWaiting";
pub(crate) const REASONS: [&str; 5] = [TAKEN, FREED, TAKEN_BACK, STUCK, WAITING];

/// How often the node looks at its sentinel and its health between the wave's events.
const TICK: Duration = Duration::from_secs(2);
/// How long `reboot.sentinel_command` may take, and how long its answer is kept.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a holder writes its slot's renewTime while its daemon runs.
const RENEW: Duration = Duration::from_secs(30);
/// How long between two asks for the same reboot.
const ASK_AGAIN: Duration = Duration::from_secs(60);

/// Runs until `stop`: watches the RebootWaves and takes this node's steps in the one that
/// selects it.
pub(crate) async fn run(engine: Arc<Engine>, boot_id: String, stop: CancellationToken) {
    let client = engine.client();
    let node = engine.node().to_owned();
    let api: Api<RebootWave> = Api::all(client.clone());
    let mut reconnects = engine.reconnects();
    let (mut store, mut events) = watch_waves(&api, &engine);
    // No step on a store not listed yet: it would read as no wave, and drop the taint.
    let mut listed = false;
    let mut part = Part {
        api: api.clone(),
        nodes: Api::all(client),
        node,
        boot_id,
        booted_at: crate::state::booted_at(),
        engine: engine.clone(),
        seen_node: None,
        command_said: None,
        healthy_since: None,
        renewed: None,
        asked: None,
        made: None,
        others: HashMap::new(),
        said: None,
        giving_way: None,
        unhealthy_said: None,
        watch_failing: false,
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => match event {
                Some(Ok(watcher::Event::InitDone)) => {
                    listed = true;
                    part.watch_failing = false;
                }
                Some(Ok(_)) => part.watch_failing = false,
                Some(Err(err)) => {
                    if !part.watch_failing {
                        tracing::warn!(node = %part.node, error = %err, "cannot watch RebootWaves (is the rebootwaves.nodegrace.dev CRD installed?): no planned reboot starts until it can");
                    }
                    part.watch_failing = true;
                    continue;
                }
                None => return,
            },
            changed = reconnects.changed() => {
                if changed.is_err() {
                    return;
                }
                // The apiserver answers again: a watch waiting out the back-off of the
                // outage starts at once, so a freed slot is seen within a tick.
                if part.watch_failing {
                    (store, events) = watch_waves(&api, &engine);
                    listed = false;
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        if part.watch_failing || !listed {
            continue;
        }
        let Some(node) = engine.own_node() else {
            continue;
        };
        part.step(&store.state(), &node).await;
    }
}

type WaveEvents =
    futures::stream::BoxStream<'static, Result<watcher::Event<RebootWave>, watcher::Error>>;

/// The RebootWaves' watch and its store, with the back-off of every watch that can wait
/// (`cluster::backoff`).
fn watch_waves(
    api: &Api<RebootWave>,
    engine: &Engine,
) -> (reflector::Store<RebootWave>, WaveEvents) {
    let (store, writer) = reflector::store();
    let events = backed_off(
        watcher(api.clone(), watcher::Config::default()),
        engine.under_way(),
    )
    .reflect(writer)
    .boxed();
    (store, events)
}

/// Whether the node needs a reboot: an operator's ask is a regular file, or the configured
/// sentinel command says so (exit status 1), or else the sentinel is a regular file. Anything
/// else at a path, or a command that fails, is said once and counts as no.
pub(crate) async fn needs_reboot(settings: &RebootSettings, node: &str) -> bool {
    asked(node) || sentinel_says(settings, node).await
}

fn asked(node: &str) -> bool {
    regular_file(node, Path::new(ASKED))
}

async fn sentinel_says(settings: &RebootSettings, node: &str) -> bool {
    let Some((program, args)) = settings.sentinel_command.split_first() else {
        return regular_file(node, &settings.sentinel);
    };
    let run = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status();
    let said = match tokio::time::timeout(COMMAND_TIMEOUT, run).await {
        Ok(Ok(status)) if status.code() == Some(1) => return true,
        Ok(Ok(status)) if status.success() => return false,
        Ok(Ok(status)) => format!("exited with {status}"),
        Ok(Err(err)) => format!("could not be run: {err}"),
        Err(_) => format!("did not finish within {COMMAND_TIMEOUT:?}"),
    };
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(node = %node, command = ?settings.sentinel_command, "reboot.sentinel_command {said} (1 means a reboot is needed, 0 that it is not): the node does not count as needing a reboot");
    });
    false
}

fn regular_file(node: &str, path: &Path) -> bool {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => true,
        Ok(meta) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(node = %node, path = %path.display(), kind = ?meta.file_type(), "the reboot sentinel is not a regular file (a directory, a FIFO or a symlink): ignored, the node does not count as needing a reboot");
            });
            false
        }
        Err(_) => false,
    }
}

/// This node's part in the waves: what it remembers between steps.
struct Part {
    api: Api<RebootWave>,
    nodes: Api<Node>,
    node: String,
    boot_id: String,
    /// When this boot began (`state::booted_at`): a Ready older than that is the last boot's.
    booted_at: Option<Timestamp>,
    /// Its stores (the Node's health), settings, metrics and Events.
    engine: Arc<Engine>,
    /// The sentinel command's last answer, and when.
    command_said: Option<(Instant, bool)>,
    /// The Node as last seen, for its Events.
    seen_node: Option<Node>,
    /// Healthy without a break since then.
    healthy_since: Option<Timestamp>,
    /// When the own slot was last written.
    renewed: Option<Instant>,
    /// When logind was last asked to reboot.
    asked: Option<Instant>,
    /// When the wave of one at a time was last made.
    made: Option<Instant>,
    /// Other holders' slots as this node has seen them.
    others: HashMap<String, Silence>,
    /// What the node last said about its turn.
    said: Option<String>,
    /// Since when it has given way to another domain without a break.
    giving_way: Option<Instant>,
    /// What the node last said is missing for its health after the reboot.
    unhealthy_said: Option<String>,
    watch_failing: bool,
}

impl Part {
    async fn step(&mut self, waves: &[Arc<RebootWave>], node: &Node) {
        self.seen_node = Some(node.clone());
        let labels = node.labels();
        let without_wave = self.engine.settings().reboot.without_wave;
        let (wave, problems) = wave_of(waves, &self.node, labels, without_wave);
        let holding = matches!(&wave, Ok(Some(w)) if slot_of(w, &self.node).is_some());
        for why in problems {
            self.say(None, &why);
        }
        // Ok(None) with `without_wave`: the wave of one at a time is not made yet.
        let (wave, to_make) = match wave {
            Ok(wave) => (wave.clone(), wave.is_none() && without_wave),
            Err(why) => {
                self.say(None, &why);
                (None, false)
            }
        };
        // Without a wave the sentinel means nothing: it is not looked at (nor its command run).
        let requested = wave.as_ref().is_some_and(|w| asked_by(w, self.booted_at));
        let needs = (wave.is_some() || to_make) && (requested || self.needs_reboot().await);
        let taint = wave::pending_taint(needs, holding);
        self.keep_taint(node, taint).await;
        let metrics = self.engine.metrics();
        let Some(wave) = wave else {
            metrics.set_wave(false, false, needs);
            if needs {
                self.make_one_at_a_time().await;
            }
            return;
        };
        // Health is the way back's: it reads every pod of the node, so only while holding.
        let health = if holding {
            self.engine.health(node, self.booted_at)
        } else {
            Err("holds no slot".to_owned())
        };
        self.healthy_since = match (&health, self.healthy_since) {
            (Ok(()), Some(since)) => Some(since),
            (Ok(()), None) => Some(Timestamp::now()),
            (Err(_), _) => None,
        };
        let (rules, opening) = match read_rules(&wave) {
            Ok(read) => read,
            Err(problem) => {
                metrics.set_wave(false, false, needs);
                self.say(Some(&wave), &Why::Invalid { problem });
                return;
            }
        };
        let status = wave.status.clone().unwrap_or_default();
        let domain = domain_of(&wave, labels);
        let held = held_slots(&status);
        let mine = slot_of(&wave, &self.node).map(|s| Mine {
            phase: match s.phase {
                SlotPhase::Down => Phase::Down,
                SlotPhase::Returning => Phase::Returning,
                SlotPhase::Stuck => Phase::Stuck,
            },
            boot_id: s.boot_id.clone(),
            taken: s.taken.0,
            healthy_since: s.healthy_since.as_ref().map(|t| t.0),
        });
        if let (Some(Phase::Returning | Phase::Stuck), Err(why)) =
            (mine.as_ref().map(|m| m.phase), &health)
        {
            if self.unhealthy_said.as_ref() != Some(why) {
                tracing::info!(node = %self.node, wave = %wave.name_any(), why = %why, "back after the reboot, not healthy yet: the slot is kept");
                self.unhealthy_said = Some(why.clone());
            }
        } else {
            self.unhealthy_said = None;
        }
        let take_back = self
            .silent_holder(&rules, &status.slots, needs && mine.is_none())
            .await;
        let waiting = waiting_by_domain(&status);
        let seen = Seen {
            me: &self.node,
            boot_id: &self.boot_id,
            needs_reboot: needs,
            rules: &rules,
            domain: &domain,
            member: status
                .members
                .iter()
                .find(|m| m.node == self.node)
                .map(|m| Member {
                    domain: &m.domain,
                    waiting: m.waiting,
                }),
            members: status.members.len(),
            waiting: &waiting,
            given_way_for: self.giving_way.map_or(Duration::ZERO, |at| at.elapsed()),
            held: &held,
            mine: mine.as_ref(),
            opening,
            stuck: stuck_holder(&status, &self.node),
            take_back: take_back.as_deref(),
            healthy: self.healthy_since,
            renew_due: self.renewed.is_none_or(|at| at.elapsed() >= RENEW),
            now: Timestamp::now(),
        };
        let step = wave::next(&seen);
        if matches!(step, Step::Wait(Why::GiveWay { .. })) {
            self.giving_way.get_or_insert_with(Instant::now);
        } else {
            self.giving_way = None;
        }
        metrics.set_wave(
            mine.is_some(),
            mine.as_ref().is_some_and(|m| m.phase == Phase::Stuck),
            matches!(step, Step::Wait(_) | Step::Join | Step::TakeBack(_)),
        );
        if let Step::Wait(why) = &step {
            self.say(Some(&wave), why);
            return;
        }
        self.carry_out(&wave, step, &domain, health).await;
    }

    async fn carry_out(
        &mut self,
        wave: &RebootWave,
        step: Step,
        domain: &str,
        health: Result<(), String>,
    ) {
        let name = wave.name_any();
        let now = Time(Timestamp::now());
        let me = self.node.clone();
        let boot_id = self.boot_id.clone();
        let written = match &step {
            Step::Idle => return,
            Step::Wait(_) => return,
            Step::Reboot => {
                self.ask_reboot(&name).await;
                return;
            }
            Step::Join | Step::StopWaiting => {
                let entry = WaveMember {
                    node: me.clone(),
                    domain: domain.to_owned(),
                    waiting: step == Step::Join,
                };
                self.write(wave, |st| {
                    st.members.retain(|m| m.node != entry.node);
                    st.members.push(entry.clone());
                })
                .await
            }
            Step::Take => {
                let slot = WaveSlot {
                    node: me.clone(),
                    domain: domain.to_owned(),
                    phase: SlotPhase::Down,
                    boot_id,
                    taken: now.clone(),
                    renew_time: now.clone(),
                    healthy_since: None,
                };
                self.write(wave, |st| {
                    st.slots.push(slot.clone());
                    for m in st.members.iter_mut().filter(|m| m.node == me) {
                        m.waiting = false;
                    }
                })
                .await
            }
            Step::TakeBack(other) => {
                let other = other.clone();
                self.write(wave, |st| st.slots.retain(|s| s.node != other))
                    .await
            }
            Step::Free => {
                self.write(wave, |st| st.slots.retain(|s| s.node != me))
                    .await
            }
            Step::Returning | Step::Healthy(_) | Step::Unhealthy | Step::Stuck | Step::Renew => {
                let step = step.clone();
                self.write(wave, |st| {
                    if let Some(slot) = st.slots.iter_mut().find(|s| s.node == me) {
                        slot.renew_time = now.clone();
                        match step {
                            Step::Returning => slot.phase = SlotPhase::Returning,
                            Step::Healthy(since) => {
                                slot.phase = SlotPhase::Returning;
                                slot.healthy_since = Some(Time(since));
                            }
                            Step::Unhealthy => slot.healthy_since = None,
                            Step::Stuck => slot.phase = SlotPhase::Stuck,
                            _ => {}
                        }
                    }
                })
                .await
            }
        };
        match written {
            Written::Yes => {}
            Written::Conflict => return,
            Written::Refused(message) => {
                self.say(Some(wave), &Why::Invalid { problem: message });
                return;
            }
        }
        if !matches!(step, Step::Join | Step::StopWaiting | Step::TakeBack(_)) {
            self.renewed = Some(Instant::now());
        }
        self.written(&name, step, domain, health).await;
    }

    /// What a step written means: the log line, the Event, the reboot after a take.
    async fn written(&mut self, name: &str, step: Step, domain: &str, health: Result<(), String>) {
        let me = self.node.clone();
        match step {
            Step::Join => {
                tracing::info!(node = %me, wave = %name, domain = %domain, "joined the reboot wave: waiting for a slot")
            }
            Step::StopWaiting => {
                tracing::info!(node = %me, wave = %name, "needs no reboot any more: stopped waiting for a slot")
            }
            Step::Take => {
                self.event(
                    false,
                    TAKEN,
                    format!("took a slot of RebootWave {name}: draining, then rebooting"),
                );
                tracing::info!(node = %me, wave = %name, domain = %domain, "took a slot of the reboot wave: rebooting");
                self.ask_reboot(name).await;
            }
            Step::TakeBack(other) => {
                self.engine.metrics().wave_slot_taken_back();
                self.event(true, TAKEN_BACK, format!("took back the slot of node {other} in RebootWave {name}: it was gone or silent past the wave's reboot budget"));
                tracing::warn!(node = %me, wave = %name, holder = %other, "took back the slot of a node gone or silent past the wave's reboot budget")
            }
            Step::Returning => {
                tracing::info!(node = %me, wave = %name, "back after the reboot: the slot is freed once the node is healthy for the wave's healthy time")
            }
            Step::Healthy(_) => {
                tracing::info!(node = %me, wave = %name, "healthy again after the reboot")
            }
            Step::Unhealthy => {
                tracing::warn!(node = %me, wave = %name, why = %health.err().unwrap_or_default(), "not healthy any more: the healthy time starts again")
            }
            Step::Free => {
                self.renewed = None;
                self.event(false, FREED, format!("healthy for RebootWave {name}'s healthy time after the reboot: freed the slot"));
                tracing::info!(node = %me, wave = %name, "healthy for the wave's healthy time: freed the slot");
            }
            Step::Stuck => {
                let why = health.err().unwrap_or_default();
                self.event(true, STUCK, format!("not healthy within RebootWave {name}'s reboot budget ({why}): the wave stops here"));
                tracing::error!(node = %me, wave = %name, why = %why, "not healthy within the wave's reboot budget: the wave stops here and the slot is kept until the node is healthy or an operator frees it")
            }
            Step::Renew | Step::Idle | Step::Wait(_) | Step::Reboot => {}
        }
    }

    /// One write of the wave's status, with the resourceVersion read.
    async fn write(
        &self,
        wave: &RebootWave,
        change: impl FnOnce(&mut crate::api::RebootWaveStatus),
    ) -> Written {
        let mut next = wave.clone();
        change(next.status.get_or_insert_with(Default::default));
        let r = self
            .api
            .replace_status(&wave.name_any(), &PostParams::default(), &next)
            .await;
        match gateway::reply(r) {
            Ok(_) => Written::Yes,
            Err(f) if f.is(Kind::Conflict) => Written::Conflict,
            Err(f) => Written::Refused(format!("{:#}", anyhow::Error::from(f))),
        }
    }

    /// Makes the wave [`ONE_AT_A_TIME`] for a node whose configuration turns reboots on; the
    /// watch then brings it. Another node making it first is as good.
    async fn make_one_at_a_time(&mut self) {
        if self.made.is_some_and(|at| at.elapsed() < ASK_AGAIN) {
            return;
        }
        self.made = Some(Instant::now());
        let r = self
            .api
            .create(&PostParams::default(), &RebootWave::one_at_a_time())
            .await;
        match gateway::reply(r) {
            Ok(_) => {
                tracing::info!(node = %self.node, wave = ONE_AT_A_TIME, "made the reboot wave of one node at a time (reboot.without_wave)")
            }
            // 409: it already exists.
            Err(f) if f.is(Kind::Conflict) => {}
            Err(f) => {
                let problem = format!(
                    "cannot make RebootWave {ONE_AT_A_TIME} for reboot.without_wave (are this version's RBAC and admission policy applied?): {}",
                    f.text()
                );
                self.say(None, &Why::Invalid { problem });
            }
        }
    }

    async fn ask_reboot(&mut self, wave: &str) {
        if self.asked.is_some_and(|at| at.elapsed() < ASK_AGAIN) {
            return;
        }
        self.asked = Some(Instant::now());
        if let Err(err) = crate::logind::ask_reboot().await {
            tracing::error!(node = %self.node, wave = %wave, error = format!("{err:#}"), "logind did not take the reboot: the slot is kept and the reboot asked again in a minute");
        }
    }

    /// The first other holder that is gone or has been silent past the reboot budget. The
    /// silences are timed all along; a holder silent for a while is looked up (its Node
    /// deleted?) only by a node `waiting` for its turn, and at most once a renewal.
    async fn silent_holder(
        &mut self,
        rules: &Rules,
        slots: &[WaveSlot],
        waiting: bool,
    ) -> Option<String> {
        self.others
            .retain(|node, _| slots.iter().any(|s| &s.node == node));
        for slot in slots.iter().filter(|s| s.node != self.node) {
            let renewed = slot.renew_time.0.to_string();
            let seen = self
                .others
                .entry(slot.node.clone())
                .or_insert_with(|| Silence::since(renewed.clone()));
            if seen.renewed != renewed {
                *seen = Silence::since(renewed);
            }
            let silent = seen.since.elapsed();
            let look =
                waiting && silent > RENEW * 4 && seen.looked.is_none_or(|at| at.elapsed() >= RENEW);
            if look {
                seen.looked = Some(Instant::now());
            }
            let gone = look && self.node_gone(&slot.node).await;
            if wave::take_back(rules, gone, silent) {
                return Some(slot.node.clone());
            }
        }
        None
    }

    async fn node_gone(&self, node: &str) -> bool {
        matches!(gateway::reply(self.nodes.get(node).await), Err(f) if f.is(Kind::NotFound))
    }

    async fn keep_taint(&self, node: &Node, wanted: bool) {
        if reboot_pending_taint_patch(node, wanted).is_none() {
            return;
        }
        let what = if wanted {
            "taint the node reboot-pending"
        } else {
            "remove the reboot-pending taint"
        };
        match patch_node_with(&self.nodes, &self.node, what, |n| {
            reboot_pending_taint_patch(n, wanted)
        })
        .await
        {
            Ok(_) => {
                tracing::info!(node = %self.node, taint = REBOOT_PENDING_TAINT_KEY, present = wanted, "{what}")
            }
            Err(err) => {
                tracing::warn!(node = %self.node, error = format!("{err:#}"), "could not {what}")
            }
        }
    }

    fn event(&self, warning: bool, reason: &str, note: String) {
        if let Some(node) = &self.seen_node {
            self.engine.node_event(node, warning, reason, note);
        }
    }

    /// [`needs_reboot`] with the settings in force; a sentinel command's answer is kept a while.
    async fn needs_reboot(&mut self) -> bool {
        if asked(&self.node) {
            return true;
        }
        let settings = self.engine.settings();
        if settings.reboot.sentinel_command.is_empty() {
            return sentinel_says(&settings.reboot, &self.node).await;
        }
        if let Some((at, answer)) = self.command_said {
            if at.elapsed() < COMMAND_TIMEOUT {
                return answer;
            }
        }
        let answer = sentinel_says(&settings.reboot, &self.node).await;
        self.command_said = Some((Instant::now(), answer));
        answer
    }

    /// Says why the node waits, once each time the reason changes.
    fn say(&mut self, wave: Option<&RebootWave>, why: &Why) {
        let text = why.to_string();
        if self.said.as_deref() == Some(text.as_str()) {
            return;
        }
        let name = wave.map(|w| w.name_any()).unwrap_or_default();
        let warning = matches!(
            why,
            Why::Invalid { .. } | Why::SelectedTwice { .. } | Why::Stuck { .. }
        );
        self.event(warning, WAITING, format!("waiting for a reboot: {text}"));
        match why {
            Why::Invalid { .. } | Why::SelectedTwice { .. } | Why::Stuck { .. } => {
                tracing::warn!(node = %self.node, wave = %name, "waiting for a reboot: {text}")
            }
            _ => tracing::info!(node = %self.node, wave = %name, "waiting for a reboot: {text}"),
        }
        self.said = Some(text);
    }
}

/// The wave the node takes part in: the one holding its slot (seen to its end, selected or
/// not any more), else the one wave whose selector matches its labels, else with
/// `without_wave` the wave of one at a time. Beside it, what is wrong with the waves'
/// selectors.
pub(crate) fn wave_of(
    waves: &[Arc<RebootWave>],
    node: &str,
    labels: &std::collections::BTreeMap<String, String>,
    without_wave: bool,
) -> (Result<Option<Arc<RebootWave>>, Why>, Vec<Why>) {
    if let Some(w) = waves.iter().find(|w| slot_of(w, node).is_some()) {
        return (Ok(Some(w.clone())), Vec::new());
    }
    let mut selecting = Vec::new();
    let mut problems = Vec::new();
    for w in waves {
        let Some(selector) = &w.spec.node_selector else {
            continue;
        };
        match Selector::compile(selector) {
            Ok(sel) if sel.matches(labels) => selecting.push(w.name_any()),
            Ok(_) => {}
            Err(err) => problems.push(Why::Invalid {
                problem: format!("RebootWave {}: nodeSelector: {err}", w.name_any()),
            }),
        }
    }
    selecting.sort();
    let chosen = wave::choose(&selecting, without_wave, ONE_AT_A_TIME)
        .map(|name| name.and_then(|name| waves.iter().find(|w| w.name_any() == name).cloned()));
    (chosen, problems)
}

/// Another holder's slot as this node has seen it, on its own clock.
struct Silence {
    /// Its renewTime as last seen.
    renewed: String,
    /// Since when it has not changed.
    since: Instant,
    /// When its Node was last looked up.
    looked: Option<Instant>,
}

impl Silence {
    fn since(renewed: String) -> Silence {
        Silence {
            renewed,
            since: Instant::now(),
            looked: None,
        }
    }
}

enum Written {
    Yes,
    Conflict,
    Refused(String),
}

/// Whether the wave's `rebootRequestedAt` asks a node booted at `booted_at` for a reboot.
pub(crate) fn asked_by(wave: &RebootWave, booted_at: Option<Timestamp>) -> bool {
    let at = wave.spec.reboot_requested_at.as_ref().map(|t| t.0);
    wave::requested(at, booted_at)
}

/// The node's value of the wave's topology key ("" without one).
pub(crate) fn domain_of(
    wave: &RebootWave,
    labels: &std::collections::BTreeMap<String, String>,
) -> String {
    wave.spec
        .per_domain
        .as_ref()
        .and_then(|p| labels.get(&p.topology_key).cloned())
        .unwrap_or_default()
}

/// The members waiting for a slot, counted by domain.
pub(crate) fn waiting_by_domain(status: &RebootWaveStatus) -> BTreeMap<String, usize> {
    let mut waiting = BTreeMap::new();
    for m in status.members.iter().filter(|m| m.waiting) {
        *waiting.entry(m.domain.clone()).or_default() += 1;
    }
    waiting
}

pub(crate) fn held_slots(status: &RebootWaveStatus) -> Vec<Held> {
    status
        .slots
        .iter()
        .map(|s| Held {
            node: s.node.clone(),
            domain: s.domain.clone(),
        })
        .collect()
}

/// Another node whose slot says Stuck.
pub(crate) fn stuck_holder<'a>(status: &'a RebootWaveStatus, me: &str) -> Option<&'a str> {
    status
        .slots
        .iter()
        .find(|s| s.phase == SlotPhase::Stuck && s.node != me)
        .map(|s| s.node.as_str())
}

pub(crate) fn slot_of<'a>(wave: &'a RebootWave, node: &str) -> Option<&'a WaveSlot> {
    wave.status.as_ref()?.slots.iter().find(|s| s.node == node)
}

/// The wave's limits and whether its windows are open now.
pub(crate) fn read_rules(wave: &RebootWave) -> Result<(Rules, Opening), String> {
    let max = match &wave.spec.max_unavailable {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    };
    let rules = Rules {
        limit: Limit::parse(&max)?,
        per_domain: wave.spec.per_domain.as_ref().map(|p| p.max_unavailable),
        healthy_for: Duration::from_secs(u64::from(wave.spec.healthy_seconds)),
        reboot_budget: Duration::from_secs(u64::from(wave.spec.reboot_budget_seconds)),
    };
    let windows = wave
        .spec
        .windows
        .iter()
        .map(|w| {
            let zone = if w.time_zone == "UTC" {
                Ok(jiff::tz::TimeZone::UTC)
            } else {
                jiff::tz::db().get(&w.time_zone)
            }
            .map_err(|_| {
                format!(
                    "RebootWave {}: time zone {:?} is not in this node's tzdata (/usr/share/zoneinfo): no reboot starts until it is corrected",
                    wave.name_any(),
                    w.time_zone
                )
            })?;
            let clock = |t: &str| {
                t.parse::<jiff::civil::Time>()
                    .map_err(|e| format!("RebootWave {}: {t:?} is not HH:MM: {e}", wave.name_any()))
            };
            Ok(Window {
                days: w.days.iter().map(|d| d.weekday()).collect(),
                start: clock(&w.start)?,
                end: clock(&w.end)?,
                zone,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((rules, wave::opening(&windows, Timestamp::now())))
}
