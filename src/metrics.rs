//! Prometheus metrics, served as text on `[metrics] listen` (`endpoint`). Recording is cheap
//! and lock-free, so it is always on; only the listener is optional.

mod endpoint;
pub(crate) use endpoint::serve;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::{Context, Result};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::plan::intree::Refusal;
use crate::state::ShutdownOutcome;

/// How a pod was made to go away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminationMethod {
    Eviction,
    EvictionRequest,
    Delete,
    Cri,
    StaticGate,
}

impl TerminationMethod {
    fn label(self) -> &'static str {
        match self {
            TerminationMethod::Eviction => "eviction",
            TerminationMethod::EvictionRequest => "eviction_request",
            TerminationMethod::Delete => "delete",
            TerminationMethod::Cri => "cri",
            TerminationMethod::StaticGate => "static_gate",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TerminatedLabel {
    method: String,
    band: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BandLabel {
    band: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CredentialLabel {
    credential: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabel {
    namespace: String,
    name: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

/// Seconds: from a few seconds to the 24 h `shutdown.max_delay` allows.
const SHUTDOWN_BUCKETS: [f64; 12] = [
    1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 86400.0,
];

type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric nodegrace exports. Cloning shares the same series.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    shutdown_start: FloatGauge,
    last_shutdown_end: FloatGauge,
    last_shutdown_outcome: Family<OutcomeLabel, Gauge>,
    band_duration: Family<BandLabel, FloatGauge>,
    pods_terminated: Family<TerminatedLabel, Counter>,
    escalations: Counter,
    fallback_used: Counter,
    inhibitor_held: Gauge,
    effective_budget: FloatGauge,
    budget_needed: FloatGauge,
    budget_too_short: Gauge,
    budget_blocking_since: Family<BudgetLabel, FloatGauge>,
    apiserver_reachable: Gauge,
    apiserver_outages: Counter,
    cordoned: Gauge,
    maintenances_active: Gauge,
    api_errors: Family<OperationLabel, Counter>,
    credential_expiry: Family<CredentialLabel, FloatGauge>,
    armed: Gauge,
    draining: Gauge,
    offline_fallback: Gauge,
    bus_connected: Gauge,
    shutdown_duration: Family<KindLabel, Histogram>,
    /// Shutdown durations to count once a scrape has shown their series (see
    /// [`Metrics::shutdown_took`]).
    durations_to_count: Arc<std::sync::Mutex<Vec<(KindLabel, f64)>>>,
    evictions_refused: Family<ReasonLabel, Counter>,
    wave_slot_held: Gauge,
    wave_stuck: Gauge,
    wave_waiting: Gauge,
    wave_slots_taken_back: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A metric's name (after the `nodegrace_` prefix) and its help text.
type Help = (&'static str, &'static str);

fn register<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    (name, help): Help,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

const SHUTDOWN_START: Help = (
    "shutdown_start_timestamp_seconds",
    "Unix time the last shutdown drain started",
);

const LAST_SHUTDOWN_END: Help = (
    "last_shutdown_end_timestamp_seconds",
    "Unix time the last shutdown ended (released, cancelled, or last recorded when interrupted); kept across restarts",
);

const LAST_SHUTDOWN_OUTCOME: Help = (
    "last_shutdown_outcome",
    "1 for how the last shutdown ended (drained, failed, budget_ended, cancelled, interrupted), 0 for the others; kept across restarts",
);

const BAND_DURATION: Help = (
    "band_duration_seconds",
    "How long each drain band of the last shutdown took",
);

const PODS_TERMINATED: Help = (
    "pods_terminated",
    "Pods terminated, by method and by the band they were terminated in (named as band_duration_seconds names it)",
);

const ESCALATIONS: Help = (
    "escalations",
    "Pods whose cooperative drain was escalated to deletion at a shutdown deadline",
);

const FALLBACK_USED: Help = (
    "fallback_used",
    "Shutdowns drained through the local CRI fallback",
);

const INHIBITOR_HELD: Help = (
    "inhibitor_held",
    "1 while the logind shutdown delay inhibitor is held",
);

const EFFECTIVE_BUDGET: Help = (
    "effective_budget_seconds",
    "Usable shutdown budget: min(configured max delay, logind InhibitDelayMaxUSec)",
);

const BUDGET_NEEDED: Help = (
    "budget_needed_seconds",
    "What the shutdown drain plan reserves for the later bands of the node's pods now",
);

const BUDGET_TOO_SHORT: Help = (
    "budget_too_short",
    "1 while the effective budget is below what the drain plan reserves for the node's pods",
);

const BUDGET_BLOCKING_SINCE: Help = (
    "budget_blocking_since_timestamp_seconds",
    "Unix time since which the PodDisruptionBudget blocking longest in the running drain has refused evictions; one series at most, none when no budget blocks",
);

const APISERVER_REACHABLE: Help = (
    "apiserver_reachable",
    "1 while the apiserver answers nodegrace's requests and watches",
);

const APISERVER_OUTAGES: Help = (
    "apiserver_outages",
    "Times the apiserver could not be used for a second or more",
);

const CORDONED: Help = (
    "node_cordoned",
    "1 while nodegrace's own cordon holds the node (its previous-unschedulable annotation is set)",
);

const MAINTENANCES_ACTIVE: Help = (
    "maintenances_active",
    "NodeMaintenances selecting the node that are active (not Idle, not Complete)",
);

const API_ERRORS: Help = (
    "api_errors",
    "Failed requests to the Kubernetes apiserver, by operation",
);

const CREDENTIAL_EXPIRY: Help = (
    "credential_expiry_timestamp_seconds",
    "Unix time the client certificate of each credential expires (nodegrace: node.kubeconfig, kubelet: node.kubelet_kubeconfig); absent without a certificate",
);

const ARMED: Help = (
    "armed",
    "1 while the inhibitor is held and no shutdown is in progress",
);

const DRAINING: Help = ("draining", "1 while a shutdown drain is in progress");

const OFFLINE_FALLBACK: Help = (
    "offline_fallback",
    "1 while the node is drained locally through the CRI runtime because the apiserver cannot be used",
);

const BUS_CONNECTED: Help = (
    "bus_connected",
    "1 while the daemon is connected to the system bus (logind)",
);

const SHUTDOWN_DURATION: Help = (
    "shutdown_duration_seconds",
    "Time from the shutdown signal to the inhibitor's release, by kind of shutdown",
);

const EVICTIONS_REFUSED: Help = (
    "evictions_refused",
    "Evictions refused, by reason: budget (a PodDisruptionBudget), throttled (429 without a budget), error",
);

const WAVE_SLOT_HELD: Help = (
    "wave_slot_held",
    "1 while the node holds a slot of its RebootWave (draining, rebooting, or on its way back)",
);

const WAVE_STUCK: Help = (
    "wave_stuck",
    "1 while the node's slot says Stuck: not healthy within the wave's reboot budget, the wave stops",
);

const WAVE_WAITING: Help = (
    "wave_waiting",
    "1 while the node needs a reboot and waits for its turn in its RebootWave",
);

const WAVE_SLOTS_TAKEN_BACK: Help = (
    "wave_slots_taken_back",
    "Slots of other nodes this node took back: their node was gone or silent past the wave's reboot budget",
);

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodegrace");
        let r = &mut registry;
        Metrics {
            shutdown_start: register(r, SHUTDOWN_START, FloatGauge::default()),
            last_shutdown_end: register(r, LAST_SHUTDOWN_END, FloatGauge::default()),
            last_shutdown_outcome: register(
                r,
                LAST_SHUTDOWN_OUTCOME,
                Family::<OutcomeLabel, Gauge>::default(),
            ),
            band_duration: register(r, BAND_DURATION, Family::<BandLabel, FloatGauge>::default()),
            pods_terminated: register(
                r,
                PODS_TERMINATED,
                Family::<TerminatedLabel, Counter>::default(),
            ),
            escalations: register(r, ESCALATIONS, Counter::default()),
            fallback_used: register(r, FALLBACK_USED, Counter::default()),
            inhibitor_held: register(r, INHIBITOR_HELD, Gauge::default()),
            effective_budget: register(r, EFFECTIVE_BUDGET, FloatGauge::default()),
            budget_needed: register(r, BUDGET_NEEDED, FloatGauge::default()),
            budget_too_short: register(r, BUDGET_TOO_SHORT, Gauge::default()),
            budget_blocking_since: register(
                r,
                BUDGET_BLOCKING_SINCE,
                Family::<BudgetLabel, FloatGauge>::default(),
            ),
            apiserver_reachable: register(r, APISERVER_REACHABLE, Gauge::default()),
            apiserver_outages: register(r, APISERVER_OUTAGES, Counter::default()),
            cordoned: register(r, CORDONED, Gauge::default()),
            maintenances_active: register(r, MAINTENANCES_ACTIVE, Gauge::default()),
            api_errors: register(r, API_ERRORS, Family::<OperationLabel, Counter>::default()),
            credential_expiry: register(
                r,
                CREDENTIAL_EXPIRY,
                Family::<CredentialLabel, FloatGauge>::default(),
            ),
            armed: register(r, ARMED, Gauge::default()),
            draining: register(r, DRAINING, Gauge::default()),
            offline_fallback: register(r, OFFLINE_FALLBACK, Gauge::default()),
            bus_connected: register(r, BUS_CONNECTED, Gauge::default()),
            shutdown_duration: register(
                r,
                SHUTDOWN_DURATION,
                Family::<KindLabel, Histogram>::new_with_constructor(
                    (|| Histogram::new(SHUTDOWN_BUCKETS)) as fn() -> Histogram,
                ),
            ),
            durations_to_count: Arc::default(),
            evictions_refused: register(
                r,
                EVICTIONS_REFUSED,
                Family::<ReasonLabel, Counter>::default(),
            ),
            wave_slot_held: register(&mut registry, WAVE_SLOT_HELD, Gauge::default()),
            wave_stuck: register(&mut registry, WAVE_STUCK, Gauge::default()),
            wave_waiting: register(&mut registry, WAVE_WAITING, Gauge::default()),
            wave_slots_taken_back: register(
                &mut registry,
                WAVE_SLOTS_TAKEN_BACK,
                Counter::default(),
            ),
            // Last: the fields above have registered their metrics in it.
            registry: Arc::new(registry),
        }
    }

    pub(crate) fn set_phase(&self, armed: bool, draining: bool) {
        self.armed.set(i64::from(armed));
        self.draining.set(i64::from(draining));
    }

    pub(crate) fn set_bus_connected(&self, connected: bool) {
        self.bus_connected.set(i64::from(connected));
    }

    /// 1 until the returned guard is dropped.
    pub(crate) fn offline_fallback(&self) -> OfflineFallback {
        self.offline_fallback.set(1);
        OfflineFallback(self.offline_fallback.clone())
    }

    /// A shutdown of `kind` ("poweroff", "reboot", ...) released its inhibitor after `took`.
    /// Its series is served at once, and the duration is counted after the next scrape:
    /// Prometheus's `increase()` takes the value a series is first scraped with as its start,
    /// and this daemon has just started (`ShutdownState::duration_to_count`), so a count in
    /// its first scrape would never show in a dashboard.
    pub(crate) fn shutdown_took(&self, kind: &str, took: std::time::Duration) {
        let label = KindLabel { kind: kind.into() };
        drop(self.shutdown_duration.get_or_create(&label));
        self.durations_to_count
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((label, took.as_secs_f64()));
    }

    /// A scrape was served: the durations waiting for one are counted.
    pub(crate) fn scraped(&self) {
        let waiting = std::mem::take(
            &mut *self
                .durations_to_count
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for (label, took) in waiting {
            self.shutdown_duration.get_or_create(&label).observe(took);
        }
    }

    pub(crate) fn eviction_refused(&self, why: Refusal) {
        self.evictions_refused(why, 1);
    }

    pub(crate) fn evictions_refused(&self, why: Refusal, count: u64) {
        let reason = match why {
            Refusal::Budget => "budget",
            Refusal::Throttled => "throttled",
            Refusal::Error => "error",
        };
        self.evictions_refused
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc_by(count);
    }

    pub(crate) fn shutdown_started(&self, at: chrono::DateTime<chrono::Utc>) {
        self.shutdown_start.set(unix_seconds(at));
    }

    /// The last shutdown ended `at` with `outcome` (also the one restored at start).
    pub(crate) fn shutdown_ended(
        &self,
        outcome: ShutdownOutcome,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        self.last_shutdown_end.set(unix_seconds(at));
        for o in ShutdownOutcome::ALL {
            self.last_shutdown_outcome
                .get_or_create(&OutcomeLabel {
                    outcome: o.as_str().into(),
                })
                .set(i64::from(o == outcome));
        }
    }

    pub(crate) fn band_finished(&self, band: &str, took: std::time::Duration) {
        self.band_duration
            .get_or_create(&BandLabel { band: band.into() })
            .set(took.as_secs_f64());
    }

    /// `band` is the name [`Metrics::band_finished`] gets for the same band: the drain's
    /// targets, or the offline fallback's priority band.
    pub(crate) fn pod_terminated(&self, method: TerminationMethod, band: &str) {
        self.pods_terminated
            .get_or_create(&TerminatedLabel {
                method: method.label().into(),
                band: band.into(),
            })
            .inc();
    }

    pub fn escalated(&self) {
        self.escalations.inc();
    }

    pub(crate) fn fallback_used(&self) {
        self.fallback_used.inc();
    }

    pub(crate) fn set_inhibitor_held(&self, held: bool) {
        self.inhibitor_held.set(i64::from(held));
    }

    pub(crate) fn set_effective_budget(&self, budget: std::time::Duration) {
        self.effective_budget.set(budget.as_secs_f64());
        self.judge_budget();
    }

    /// What the drain plan reserves for the node's pods now (`Settings::reserves_needed`).
    /// The node's place in its reboot wave: a slot held, that slot stuck, waiting for one.
    pub(crate) fn set_wave(&self, held: bool, stuck: bool, waiting: bool) {
        self.wave_slot_held.set(i64::from(held));
        self.wave_stuck.set(i64::from(stuck));
        self.wave_waiting.set(i64::from(waiting));
    }

    pub(crate) fn wave_slot_taken_back(&self) {
        self.wave_slots_taken_back.inc();
    }

    pub(crate) fn set_budget_needed(&self, needed: std::time::Duration) {
        self.budget_needed.set(needed.as_secs_f64());
        self.judge_budget();
    }

    /// Short only once both are known: no budget yet is not a short one.
    fn judge_budget(&self) {
        let budget = self.effective_budget.get();
        let short = budget > 0.0 && budget < self.budget_needed.get();
        self.budget_too_short.set(i64::from(short));
    }

    /// The PodDisruptionBudget (`namespace/name`) that has refused evictions longest in the
    /// running drain, and since when; None clears it.
    pub(crate) fn set_budget_blocking(
        &self,
        longest: Option<(&str, chrono::DateTime<chrono::Utc>)>,
    ) {
        let wanted = longest.and_then(|(key, since)| {
            let (namespace, name) = key.split_once('/')?;
            Some((
                BudgetLabel {
                    namespace: namespace.into(),
                    name: name.into(),
                },
                since,
            ))
        });
        // One series at most: the previous one goes unless it is still the one.
        let keep = wanted
            .as_ref()
            .is_some_and(|(label, _)| self.budget_blocking_since.get(label).is_some());
        if !keep {
            self.budget_blocking_since.clear();
        }
        if let Some((label, since)) = wanted {
            self.budget_blocking_since
                .get_or_create(&label)
                .set(unix_seconds(since));
        }
    }

    pub(crate) fn apiserver_answered(&self) {
        self.apiserver_reachable.set(1);
    }

    /// The apiserver has not been usable for a second or more (once per outage).
    pub(crate) fn apiserver_went_away(&self) {
        self.apiserver_reachable.set(0);
        self.apiserver_outages.inc();
    }

    /// Whether nodegrace's cordon holds the node, and how many maintenances are active on it.
    pub(crate) fn set_node_hold(&self, cordoned: bool, maintenances_active: usize) {
        self.cordoned.set(i64::from(cordoned));
        self.maintenances_active
            .set(i64::try_from(maintenances_active).unwrap_or(i64::MAX));
    }

    pub(crate) fn api_error(&self, operation: &str) {
        self.api_errors
            .get_or_create(&OperationLabel {
                operation: operation.into(),
            })
            .inc();
    }

    /// When the client certificate of `credential` ("nodegrace" or "kubelet") expires; None
    /// removes the series.
    pub(crate) fn set_credential_expiry(
        &self,
        credential: &'static str,
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let label = CredentialLabel {
            credential: credential.into(),
        };
        match at {
            Some(at) => {
                self.credential_expiry
                    .get_or_create(&label)
                    .set(unix_seconds(at));
            }
            None => {
                self.credential_expiry.remove(&label);
            }
        }
    }

    /// The OpenMetrics exposition, as served to a client that accepts it (Prometheus does).
    pub fn render(&self) -> Result<String> {
        let mut out = String::new();
        encode(&mut out, &self.registry).context("encoding metrics")?;
        Ok(out)
    }

    /// The same in Prometheus's text format 0.0.4, as served to everyone else (curl,
    /// `promtool check metrics`): a counter's family is named with its `_total`, and there is
    /// no `# EOF`.
    pub fn render_text(&self) -> Result<String> {
        Ok(openmetrics_to_text(&self.render()?))
    }
}

/// Keeps `nodegrace_offline_fallback` at 1 while it lives.
pub(crate) struct OfflineFallback(Gauge);

impl Drop for OfflineFallback {
    fn drop(&mut self) {
        self.0.set(0);
    }
}

fn openmetrics_to_text(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| Some((prefix, line.strip_prefix(prefix)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                out.push_str(&format!("{prefix}{name}{suffix} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

fn unix_seconds(at: chrono::DateTime<chrono::Utc>) -> f64 {
    at.timestamp_millis() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_values_appear_in_the_exposition() {
        let m = Metrics::new();
        m.pod_terminated(TerminationMethod::Eviction, "Default<=0");
        m.pod_terminated(TerminationMethod::Eviction, "Default<=0");
        m.pod_terminated(TerminationMethod::Eviction, "Default<=1000");
        m.pod_terminated(TerminationMethod::Cri, "priority>=0 (offline)");
        m.set_inhibitor_held(true);
        m.set_effective_budget(std::time::Duration::from_secs(90));
        m.band_finished("Default/0", std::time::Duration::from_millis(1500));
        m.shutdown_took("reboot", std::time::Duration::from_secs(42));
        let before = m.render().unwrap();
        assert!(
            before.contains("nodegrace_shutdown_duration_seconds_count{kind=\"reboot\"} 0"),
            "served at zero before a scrape:\n{before}"
        );
        m.scraped();
        m.scraped();
        m.eviction_refused(Refusal::Budget);
        m.set_phase(false, true);
        let offline = m.offline_fallback();
        let text = m.render().unwrap();
        assert!(text.contains("nodegrace_offline_fallback 1"), "{text}");
        drop(offline);
        assert!(m.render().unwrap().contains("nodegrace_offline_fallback 0"));
        let text_format = m.render_text().unwrap();
        assert!(
            text_format.contains("# TYPE nodegrace_pods_terminated_total counter\n"),
            "{text_format}"
        );
        assert!(text_format.contains("# HELP nodegrace_pods_terminated_total Pods"));
        assert!(!text_format.contains("# EOF"), "{text_format}");
        for line in [
            "nodegrace_shutdown_duration_seconds_count{kind=\"reboot\"} 1",
            "nodegrace_shutdown_duration_seconds_bucket{le=\"60.0\",kind=\"reboot\"} 1",
            "nodegrace_shutdown_duration_seconds_bucket{le=\"30.0\",kind=\"reboot\"} 0",
            "nodegrace_evictions_refused_total{reason=\"budget\"} 1",
            "nodegrace_draining 1",
            "nodegrace_armed 0",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        for line in [
            "nodegrace_pods_terminated_total{method=\"eviction\",band=\"Default<=0\"} 2",
            "nodegrace_pods_terminated_total{method=\"eviction\",band=\"Default<=1000\"} 1",
            "nodegrace_pods_terminated_total{method=\"cri\",band=\"priority>=0 (offline)\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        assert!(text.contains("nodegrace_inhibitor_held 1"), "{text}");
        assert!(
            text.contains("nodegrace_effective_budget_seconds 90.0"),
            "{text}"
        );
        assert!(
            text.contains("nodegrace_band_duration_seconds{band=\"Default/0\"} 1.5"),
            "{text}"
        );
    }

    #[test]
    fn the_budget_is_too_short_only_below_what_the_plan_needs_once_both_are_known() {
        let m = Metrics::new();
        let short = |m: &Metrics| {
            m.render()
                .unwrap()
                .lines()
                .any(|l| l == "nodegrace_budget_too_short 1")
        };
        m.set_budget_needed(std::time::Duration::from_secs(90));
        assert!(!short(&m), "no budget yet");
        m.set_effective_budget(std::time::Duration::from_secs(60));
        assert!(short(&m));
        m.set_budget_needed(std::time::Duration::from_secs(30));
        assert!(!short(&m));
        m.set_budget_needed(std::time::Duration::from_secs(61));
        assert!(short(&m));
        assert!(m
            .render()
            .unwrap()
            .contains("nodegrace_budget_needed_seconds 61.0"));
    }

    #[test]
    fn one_blocking_budget_at_most_and_none_once_cleared() {
        let m = Metrics::new();
        let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        m.set_budget_blocking(Some(("shop/web", at)));
        m.set_budget_blocking(Some(("shop/db", at)));
        let text = m.render().unwrap();
        assert!(
            text.contains("nodegrace_budget_blocking_since_timestamp_seconds{namespace=\"shop\",name=\"db\"} 1700000000.0"),
            "{text}"
        );
        assert!(!text.contains("name=\"web\""), "{text}");
        m.set_budget_blocking(None);
        assert!(!m.render().unwrap().contains("namespace="));
    }

    #[test]
    fn the_last_outcome_is_one_of_a_fixed_set_and_outages_are_counted() {
        let m = Metrics::new();
        assert!(!m
            .render()
            .unwrap()
            .contains("nodegrace_last_shutdown_outcome{"));
        let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        m.shutdown_ended(ShutdownOutcome::Drained, at);
        m.shutdown_ended(ShutdownOutcome::BudgetEnded, at);
        m.apiserver_answered();
        m.apiserver_went_away();
        m.set_node_hold(true, 0);
        let text = m.render().unwrap();
        for line in [
            "nodegrace_last_shutdown_outcome{outcome=\"budget_ended\"} 1",
            "nodegrace_last_shutdown_outcome{outcome=\"drained\"} 0",
            "nodegrace_last_shutdown_outcome{outcome=\"interrupted\"} 0",
            "nodegrace_last_shutdown_end_timestamp_seconds 1700000000.0",
            "nodegrace_apiserver_reachable 0",
            "nodegrace_apiserver_outages_total 1",
            "nodegrace_node_cordoned 1",
            "nodegrace_maintenances_active 0",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        assert_eq!(text.matches("nodegrace_last_shutdown_outcome{").count(), 6);
    }
}
