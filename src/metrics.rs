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
use prometheus_client::registry::Registry;

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
struct MethodLabel {
    method: String,
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

type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric nodegrace exports. Cloning shares the same series.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    shutdown_start: FloatGauge,
    shutdown_end: FloatGauge,
    band_duration: Family<BandLabel, FloatGauge>,
    pods_terminated: Family<MethodLabel, Counter>,
    escalations: Counter,
    fallback_used: Counter,
    inhibitor_held: Gauge,
    effective_budget: FloatGauge,
    api_errors: Family<OperationLabel, Counter>,
    credential_expiry: Family<CredentialLabel, FloatGauge>,
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

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodegrace");
        let shutdown_start = FloatGauge::default();
        registry.register(
            "shutdown_start_timestamp_seconds",
            "Unix time the last shutdown drain started",
            shutdown_start.clone(),
        );
        let shutdown_end = FloatGauge::default();
        registry.register(
            "shutdown_end_timestamp_seconds",
            "Unix time the last shutdown drain released the inhibitor",
            shutdown_end.clone(),
        );
        let band_duration = Family::<BandLabel, FloatGauge>::default();
        registry.register(
            "band_duration_seconds",
            "How long each drain band of the last shutdown took",
            band_duration.clone(),
        );
        let pods_terminated = Family::<MethodLabel, Counter>::default();
        registry.register(
            "pods_terminated",
            "Pods terminated, by method",
            pods_terminated.clone(),
        );
        let escalations = Counter::default();
        registry.register(
            "escalations",
            "Pods whose cooperative drain was escalated to deletion at a shutdown deadline",
            escalations.clone(),
        );
        let fallback_used = Counter::default();
        registry.register(
            "fallback_used",
            "Shutdowns drained through the local CRI fallback",
            fallback_used.clone(),
        );
        let inhibitor_held = Gauge::default();
        registry.register(
            "inhibitor_held",
            "1 while the logind shutdown delay inhibitor is held",
            inhibitor_held.clone(),
        );
        let effective_budget = FloatGauge::default();
        registry.register(
            "effective_budget_seconds",
            "Usable shutdown budget: min(configured max delay, logind InhibitDelayMaxUSec)",
            effective_budget.clone(),
        );
        let api_errors = Family::<OperationLabel, Counter>::default();
        registry.register(
            "api_errors",
            "Failed requests to the Kubernetes apiserver, by operation",
            api_errors.clone(),
        );
        let credential_expiry = Family::<CredentialLabel, FloatGauge>::default();
        registry.register(
            "credential_expiry_timestamp_seconds",
            "Unix time the client certificate of each credential expires (nodegrace: node.kubeconfig, kubelet: node.kubelet_kubeconfig); absent without a certificate",
            credential_expiry.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            shutdown_start,
            shutdown_end,
            band_duration,
            pods_terminated,
            escalations,
            fallback_used,
            inhibitor_held,
            effective_budget,
            api_errors,
            credential_expiry,
        }
    }

    pub(crate) fn shutdown_started(&self, at: chrono::DateTime<chrono::Utc>) {
        self.shutdown_start.set(unix_seconds(at));
    }

    pub(crate) fn shutdown_ended(&self, at: chrono::DateTime<chrono::Utc>) {
        self.shutdown_end.set(unix_seconds(at));
    }

    pub(crate) fn band_finished(&self, band: &str, took: std::time::Duration) {
        self.band_duration
            .get_or_create(&BandLabel { band: band.into() })
            .set(took.as_secs_f64());
    }

    pub(crate) fn pod_terminated(&self, method: TerminationMethod) {
        self.pods_terminated
            .get_or_create(&MethodLabel {
                method: method.label().into(),
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

    /// The exposition text, as served on `/metrics`.
    pub fn render(&self) -> Result<String> {
        let mut out = String::new();
        encode(&mut out, &self.registry).context("encoding metrics")?;
        Ok(out)
    }
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
        m.pod_terminated(TerminationMethod::Eviction);
        m.pod_terminated(TerminationMethod::Eviction);
        m.pod_terminated(TerminationMethod::Cri);
        m.set_inhibitor_held(true);
        m.set_effective_budget(std::time::Duration::from_secs(90));
        m.band_finished("Default/0", std::time::Duration::from_millis(1500));
        let text = m.render().unwrap();
        assert!(
            text.contains("nodegrace_pods_terminated_total{method=\"eviction\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("nodegrace_pods_terminated_total{method=\"cri\"} 1"),
            "{text}"
        );
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
}
