//! One configuration file as written: every key optional, unknown keys rejected, each value
//! remembering where it was written so that validation after the merge can point at it.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use toml::Spanned;

use crate::plan::PodType;

/// A value plus the file (index into the loader's sources) and byte span that set it.
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub(super) struct Leaf<T> {
    #[serde(skip)]
    pub file: usize,
    pub inner: Spanned<T>,
}

impl<T> Leaf<T> {
    pub(crate) fn get(&self) -> &T {
        self.inner.get_ref()
    }

    pub(crate) fn span(&self) -> Range<usize> {
        self.inner.span()
    }
}

/// A duration written as a humantime string ("90s", "15m", "1h 30s").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DurVisitor)
    }
}

struct DurVisitor;

fn bare_number<E: de::Error>(n: impl fmt::Display) -> E {
    E::custom(format!(
        "a bare number is not a duration; write it as a string with a unit, e.g. \"{n}s\""
    ))
}

impl Visitor<'_> for DurVisitor {
    type Value = Dur;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a duration string such as \"90s\", \"15m\" or \"1h 30s\"")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
        humantime::parse_duration(s.trim()).map(Dur).map_err(|err| {
            E::custom(format!(
                "invalid duration {s:?} ({err}); write e.g. \"90s\", \"15m\" or \"1h 30s\""
            ))
        })
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Dur, E> {
        Err(bare_number(n))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Dur, E> {
        Err(bare_number(n))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Dur, E> {
        Err(bare_number(n))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawPolicy {
    Keep,
    Complete,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "the top-level table")]
pub(super) struct RawConfig {
    pub state_dir: Option<Leaf<String>>,
    pub node: Option<RawNode>,
    pub shutdown: Option<RawShutdown>,
    pub drain: Option<RawDrain>,
    pub fallback: Option<RawFallback>,
    pub static_pods: Option<RawStaticPods>,
    pub metrics: Option<RawMetrics>,
    pub reboot: Option<RawReboot>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table ([node])")]
pub(super) struct RawNode {
    pub name: Option<Leaf<String>>,
    pub kubeconfig: Option<Leaf<String>>,
    pub kubelet_kubeconfig: Option<Leaf<String>>,
    pub renew_credential: Option<Leaf<bool>>,
    pub credential_lifetime: Option<Leaf<Dur>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table ([shutdown])")]
pub(super) struct RawShutdown {
    pub max_delay: Option<Leaf<Dur>>,
    pub manage_logind_dropin: Option<Leaf<bool>>,
    pub logind_dropin_dir: Option<Leaf<String>>,
    pub logind_dropin_name: Option<Leaf<String>>,
    pub on_cancel: Option<Leaf<RawPolicy>>,
    pub after_boot: Option<Leaf<RawPolicy>>,
    pub stop_drain_timeout: Option<Leaf<Dur>>,
    pub warn_kubelet_inhibitor: Option<Leaf<bool>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table ([drain])")]
pub(super) struct RawDrain {
    pub plan: Option<Leaf<Vec<Spanned<RawPlanEntry>>>>,
    pub reserve_daemonset: Option<Leaf<Dur>>,
    pub reserve_static: Option<Leaf<Dur>>,
    pub reserve_critical: Option<Leaf<Dur>>,
    pub critical_priority: Option<Leaf<i64>>,
    pub eviction_backoff_max: Option<Leaf<Dur>>,
    pub eviction_backoff_max_shutdown: Option<Leaf<Dur>>,
    pub max_concurrent_requests: Option<Leaf<i64>>,
    pub volume_detach_timeout: Option<Leaf<Dur>>,
    pub kubelet_root_dir: Option<Leaf<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a drain plan entry ([[drain.plan]])")]
pub(super) struct RawPlanEntry {
    pub pod_type: Option<Spanned<PodType>>,
    pub pod_priority: Spanned<i64>,
    pub pod_selector: Option<Spanned<BTreeMap<String, String>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table ([fallback])")]
pub(super) struct RawFallback {
    pub enabled: Option<Leaf<bool>>,
    pub apiserver_timeout: Option<Leaf<Dur>>,
    pub cri_endpoint: Option<Leaf<String>>,
    pub stop_kubelet: Option<Leaf<bool>>,
    pub kubelet_unit: Option<Leaf<String>>,
    pub shutdown_grace_period: Option<Leaf<Dur>>,
    pub shutdown_grace_period_critical_pods: Option<Leaf<Dur>>,
    pub shutdown_grace_period_by_pod_priority: Option<Leaf<Vec<Spanned<RawBand>>>>,
    pub kubelet_config: Option<Leaf<String>>,
    pub kubelet_config_dir: Option<Leaf<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a band ([[fallback.shutdown_grace_period_by_pod_priority]])"
)]
pub(super) struct RawBand {
    pub priority: Spanned<i64>,
    pub shutdown_grace_period: Spanned<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table ([static_pods])")]
pub(super) struct RawStaticPods {
    pub manifest_dir: Option<Leaf<String>>,
    pub gate_dir: Option<Leaf<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table ([metrics])")]
pub(super) struct RawMetrics {
    pub listen: Option<Leaf<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table ([reboot])")]
pub(super) struct RawReboot {
    pub sentinel: Option<Leaf<String>>,
    pub sentinel_command: Option<Leaf<Vec<String>>>,
    pub without_wave: Option<Leaf<bool>>,
}

/// Later fragments win: tables merge key by key, arrays and scalars replace as a whole.
pub(super) trait Merge {
    fn merge(&mut self, later: Self, file: usize);
}

macro_rules! merge_leaves {
    ($acc:ident, $later:ident, $file:ident; $($field:ident),* $(,)?) => {
        $(
            if let Some(mut leaf) = $later.$field {
                leaf.file = $file;
                $acc.$field = Some(leaf);
            }
        )*
    };
}

macro_rules! merge_tables {
    ($acc:ident, $later:ident, $file:ident; $($field:ident),* $(,)?) => {
        $(
            if let Some(table) = $later.$field {
                $acc.$field.get_or_insert_with(Default::default).merge(table, $file);
            }
        )*
    };
}

impl Merge for RawConfig {
    fn merge(&mut self, later: Self, file: usize) {
        merge_leaves!(self, later, file; state_dir);
        merge_tables!(self, later, file; node, shutdown, drain, fallback, static_pods, metrics, reboot);
    }
}

impl Merge for RawNode {
    fn merge(&mut self, later: Self, file: usize) {
        merge_leaves!(self, later, file; name, kubeconfig, kubelet_kubeconfig, renew_credential, credential_lifetime);
    }
}

impl Merge for RawShutdown {
    fn merge(&mut self, later: Self, file: usize) {
        merge_leaves!(self, later, file; max_delay, manage_logind_dropin, logind_dropin_dir,
            logind_dropin_name, on_cancel, after_boot, stop_drain_timeout, warn_kubelet_inhibitor);
    }
}

impl Merge for RawDrain {
    fn merge(&mut self, later: Self, file: usize) {
        merge_leaves!(self, later, file; plan, reserve_daemonset, reserve_static, reserve_critical,
            critical_priority, eviction_backoff_max, eviction_backoff_max_shutdown,
            max_concurrent_requests, volume_detach_timeout, kubelet_root_dir);
    }
}

impl Merge for RawFallback {
    fn merge(&mut self, later: Self, file: usize) {
        // The simple form and the band list are two spellings of one setting: a later file
        // that uses one form replaces whatever an earlier file said in the other.
        let later_simple = later.shutdown_grace_period.is_some()
            || later.shutdown_grace_period_critical_pods.is_some();
        if later_simple {
            self.shutdown_grace_period_by_pod_priority = None;
        }
        if later.shutdown_grace_period_by_pod_priority.is_some() {
            self.shutdown_grace_period = None;
            self.shutdown_grace_period_critical_pods = None;
        }
        merge_leaves!(self, later, file; enabled, apiserver_timeout, cri_endpoint, stop_kubelet,
            kubelet_unit, shutdown_grace_period, shutdown_grace_period_critical_pods,
            shutdown_grace_period_by_pod_priority, kubelet_config, kubelet_config_dir);
    }
}

impl Merge for RawStaticPods {
    fn merge(&mut self, later: Self, file: usize) {
        merge_leaves!(self, later, file; manifest_dir, gate_dir);
    }
}

impl Merge for RawMetrics {
    fn merge(&mut self, later: Self, file: usize) {
        merge_leaves!(self, later, file; listen);
    }
}

impl Merge for RawReboot {
    fn merge(&mut self, later: Self, file: usize) {
        merge_leaves!(self, later, file; sentinel, sentinel_command, without_wave);
    }
}
