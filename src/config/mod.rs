//! Configuration: `/etc/nodegrace/config.toml` plus `config.d/*.toml` drop-ins, validated
//! into a typed [`Settings`]. Every default here is documented in `config/nodegrace.toml`.
//!
//! The files are merged in order into one TOML tree that remembers which file and line set
//! each value, and only then deserialized into [`Settings`], whose fields name their checks:
//! only the effective value is checked, and an error names the file, key and line that set it.
//!
//! # Reloading (SIGHUP)
//!
//! [`load`] is side-effect free; on SIGHUP call it again and keep the running settings if it
//! fails. The keys of [`RESTART_ONLY`] only apply after a restart ([`restart_required`]
//! names the changed ones, to be logged; [`keep_restart_only`] keeps their running values):
//! `state_dir` (state and gate journal live there), `node.*` (the watches are bound to one
//! Node and one client), the logind settings of `[shutdown]` (the budget is negotiated at
//! start), `fallback.cri_endpoint` (one CRI
//! connection), `static_pods.*` (moving these while manifests are gated could strand a
//! manifest), `metrics.listen` (bound socket). Every other key is read when next used (a
//! drain already running keeps the plan it started with).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::plan::budget::BudgetReserves;

pub(crate) use crate::plan::{DrainPlanEntrySetting, PriorityGracePeriod, ShutdownPlanSettings};

mod check;
mod error;
pub(crate) mod kubelet;
mod load;
mod merge;
mod render;
#[cfg(test)]
mod tests;

pub(crate) use load::load;
pub(crate) use load::{load_report, Loaded};
pub(crate) use render::to_toml_string;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/nodegrace/config.toml";
/// Where nodegrace's own identity lives unless `node.kubeconfig` says otherwise.
pub(crate) const DEFAULT_KUBECONFIG: &str = "/etc/nodegrace/kubeconfig";

/// Shortest `node.credential_lifetime`: the CertificateSigningRequest API's minimum.
pub(crate) const MIN_CREDENTIAL_LIFETIME: Duration = Duration::from_secs(600);
/// Longest `node.credential_lifetime` (ten years).
pub(crate) const MAX_CREDENTIAL_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The longest `shutdown.max_delay`, so the longest budget a shutdown can have.
pub(crate) const MAX_SHUTDOWN_DELAY: Duration = Duration::from_secs(24 * 3600);

/// How long the daemon waits for its configuration, at start and on SIGHUP: every file
/// class is capped so that a read takes well under a second; past this the read is stuck (a
/// file on a hung filesystem) and is abandoned with an error.
pub(crate) const READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What to do with the shutdown NodeMaintenance after a cancelled shutdown or after boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompletionPolicy {
    /// Leave it for the admin (`nodegrace complete`).
    Keep,
    /// Move it to stage Complete: uncordon (per the rules), restore static pods.
    Complete,
}

// Every section: a key left out keeps the default below, an unknown key is an error, and a
// value is checked where it is written (`check::*`, the bounds in seconds) or, for what
// spans keys, by `check::across`, after the files are merged.

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "the top-level table")]
pub struct Settings {
    /// Where state.json, the pod cache and the gate journal live.
    #[serde(deserialize_with = "check::abs_path")]
    pub state_dir: PathBuf,
    pub node: NodeSettings,
    pub shutdown: ShutdownSettings,
    pub drain: DrainSettings,
    pub fallback: FallbackSettings,
    pub static_pods: StaticPodSettings,
    pub metrics: MetricsSettings,
    pub reboot: RebootSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            node: NodeSettings::default(),
            shutdown: ShutdownSettings::default(),
            drain: DrainSettings::default(),
            fallback: FallbackSettings::default(),
            static_pods: StaticPodSettings::default(),
            state_dir: PathBuf::from("/var/lib/nodegrace"),
            metrics: MetricsSettings::default(),
            reboot: RebootSettings::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a table ([node])")]
pub struct NodeSettings {
    /// The Node's name; empty means the host name.
    #[serde(deserialize_with = "check::node_name")]
    pub name: String,
    /// nodegrace's own identity (`nodegrace:node:<node>`). None means in-cluster config or
    /// `$KUBECONFIG`, as kube's `Config::infer`.
    #[serde(with = "check::optional_path")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubelet's identity (`system:node:<node>`), which evicts and deletes the node's
    /// pods. None means the same credential as `kubeconfig`.
    #[serde(with = "check::optional_path")]
    pub kubelet_kubeconfig: Option<PathBuf>,
    /// Renew (or first request) the client certificate in `kubeconfig` through a
    /// CertificateSigningRequest made with the kubelet's credential.
    pub renew_credential: bool,
    /// The certificate lifetime asked for (`expirationSeconds`); the signer may cap it.
    #[serde(with = "check::credential_lifetime")]
    pub credential_lifetime: Duration,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            name: String::new(),
            kubeconfig: Some(PathBuf::from(DEFAULT_KUBECONFIG)),
            kubelet_kubeconfig: Some(PathBuf::from("/etc/kubernetes/kubelet.conf")),
            renew_credential: true,
            credential_lifetime: Duration::from_secs(365 * 24 * 3600),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a table ([shutdown])")]
pub struct ShutdownSettings {
    /// The longest shutdown delay nodegrace asks of logind (`InhibitDelayMaxSec`).
    #[serde(with = "check::Nonzero::<{ MAX_SHUTDOWN_DELAY.as_secs() }>")]
    pub max_delay: Duration,
    /// Write a logind.conf.d drop-in raising `InhibitDelayMaxSec` when it is too low.
    pub manage_logind_dropin: bool,
    #[serde(deserialize_with = "check::abs_path")]
    pub logind_dropin_dir: PathBuf,
    /// Must sort after every other drop-in so that it wins.
    #[serde(deserialize_with = "check::logind_dropin_name")]
    pub logind_dropin_name: String,
    pub on_cancel: CompletionPolicy,
    pub after_boot: CompletionPolicy,
    /// Drain time when systemd stops nodegrace during a shutdown that bypassed logind;
    /// must stay below the unit's `TimeoutStopSec`.
    #[serde(with = "check::Nonzero::<110>")]
    pub stop_drain_timeout: Duration,
    /// Warn when the kubelet also holds a shutdown delay inhibitor (two drains fight).
    pub warn_kubelet_inhibitor: bool,
}

impl Default for ShutdownSettings {
    fn default() -> Self {
        ShutdownSettings {
            max_delay: Duration::from_secs(15 * 60),
            manage_logind_dropin: true,
            logind_dropin_dir: PathBuf::from("/etc/systemd/logind.conf.d"),
            logind_dropin_name: "zz-nodegrace.conf".into(),
            on_cancel: CompletionPolicy::Keep,
            after_boot: CompletionPolicy::Complete,
            stop_drain_timeout: Duration::from_secs(80),
            warn_kubelet_inhibitor: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a table ([drain])")]
pub struct DrainSettings {
    /// The shutdown drain plan; default entries are injected by `plan`.
    #[serde(with = "check::List::<check::PlanEntry>")]
    pub plan: Vec<DrainPlanEntrySetting>,
    /// Time kept at the end of a shutdown budget for DaemonSet pods.
    #[serde(with = "check::ZeroOr::<3600>")]
    pub reserve_daemonset: Duration,
    /// Time kept at the end of a shutdown budget for static pods.
    #[serde(with = "check::ZeroOr::<3600>")]
    pub reserve_static: Duration,
    /// Time kept for pods at or above `critical_priority`.
    #[serde(with = "check::ZeroOr::<3600>")]
    pub reserve_critical: Duration,
    #[serde(deserialize_with = "check::priority")]
    pub critical_priority: i32,
    /// Cap of the exponential back-off after a 429 from the Eviction API.
    #[serde(with = "check::Nonzero::<3600>")]
    pub eviction_backoff_max: Duration,
    /// The same cap while a shutdown deadline runs.
    #[serde(with = "check::Nonzero::<300>")]
    pub eviction_backoff_max_shutdown: Duration,
    /// Requests to the apiserver in flight at once when a band's pods are asked to go.
    #[serde(deserialize_with = "check::max_concurrent_requests")]
    pub max_concurrent_requests: usize,
    /// How long to wait for the Node to report no volume attached or in use before
    /// releasing.
    #[serde(with = "check::ZeroOr::<600>")]
    pub volume_detach_timeout: Duration,
    /// The kubelet's `--root-dir`, where the node's view of a pod's volumes is read (None:
    /// the API alone says when a band ends).
    #[serde(with = "check::optional_path")]
    pub kubelet_root_dir: Option<PathBuf>,
}

impl Default for DrainSettings {
    fn default() -> Self {
        DrainSettings {
            plan: Vec::new(),
            reserve_daemonset: Duration::from_secs(30),
            reserve_static: Duration::from_secs(30),
            reserve_critical: Duration::from_secs(30),
            critical_priority: 2_000_000_000,
            eviction_backoff_max: Duration::from_secs(15 * 60),
            eviction_backoff_max_shutdown: Duration::from_secs(5),
            max_concurrent_requests: 64,
            volume_detach_timeout: Duration::from_secs(20),
            kubelet_root_dir: Some(PathBuf::from("/var/lib/kubelet")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a table ([fallback])")]
pub struct FallbackSettings {
    pub enabled: bool,
    /// How long the apiserver may be unreachable before the local fallback takes over.
    #[serde(with = "check::Nonzero::<3600>")]
    pub apiserver_timeout: Duration,
    /// CRI endpoint, e.g. `unix:///run/containerd/containerd.sock`.
    #[serde(deserialize_with = "check::cri_endpoint")]
    pub cri_endpoint: String,
    pub stop_kubelet: bool,
    #[serde(deserialize_with = "check::kubelet_unit")]
    pub kubelet_unit: String,
    /// The simple form of the bands, as the kubelet's `shutdownGracePeriod` and
    /// `shutdownGracePeriodCriticalPods`: converted to two bands on load (then None).
    #[serde(skip_serializing, deserialize_with = "check::grace_period")]
    pub shutdown_grace_period: Option<Duration>,
    #[serde(skip_serializing, deserialize_with = "check::some_duration")]
    pub shutdown_grace_period_critical_pods: Option<Duration>,
    /// Bands in ascending priority (`check::across` checks the order).
    #[serde(with = "check::List::<check::Band>")]
    pub shutdown_grace_period_by_pod_priority: Vec<PriorityGracePeriod>,
    /// The kubelet's configuration file and drop-in directory, where the kubelet's own
    /// bands are read from (None: not read).
    #[serde(with = "check::optional_path")]
    pub kubelet_config: Option<PathBuf>,
    #[serde(with = "check::optional_path")]
    pub kubelet_config_dir: Option<PathBuf>,
    /// Where the bands above came from (not a key).
    #[serde(skip)]
    pub bands_from: BandsSource,
    /// The kubelet's configuration turns its own Graceful Node Shutdown on (read from it,
    /// not a key of nodegrace's): the kubelet is then the node's graceful shutdown manager
    /// and nodegrace leaves the `GracefulNodeShutdownInProgress` condition to it.
    #[serde(skip)]
    pub kubelet_gns: bool,
    /// Why the kubelet's configuration is set aside and what nodegrace does instead, if it
    /// is (not a key).
    #[serde(skip)]
    pub kubelet_set_aside: Option<String>,
}

impl Default for FallbackSettings {
    fn default() -> Self {
        FallbackSettings {
            enabled: true,
            apiserver_timeout: Duration::from_secs(10),
            cri_endpoint: "unix:///run/containerd/containerd.sock".into(),
            stop_kubelet: true,
            kubelet_unit: "kubelet.service".into(),
            shutdown_grace_period_by_pod_priority: vec![
                PriorityGracePeriod {
                    priority: 0,
                    shutdown_grace_period: Duration::from_secs(60),
                },
                PriorityGracePeriod {
                    priority: 2_000_000_000,
                    shutdown_grace_period: Duration::from_secs(30),
                },
            ],
            shutdown_grace_period: None,
            shutdown_grace_period_critical_pods: None,
            kubelet_config: Some(PathBuf::from("/var/lib/kubelet/config.yaml")),
            kubelet_config_dir: Some(PathBuf::from("/etc/kubernetes/kubelet.conf.d")),
            bands_from: BandsSource::Defaults,
            kubelet_gns: false,
            kubelet_set_aside: None,
        }
    }
}

/// Where the fallback's bands came from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BandsSource {
    /// nodegrace's defaults.
    #[default]
    Defaults,
    /// `[fallback]` in this file of nodegrace's configuration.
    Nodegrace(PathBuf),
    /// The kubelet's configuration, these files.
    Kubelet(Vec<PathBuf>),
}

impl std::fmt::Display for BandsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |p: &PathBuf| crate::text::escape(&p.display().to_string()).into_owned();
        match self {
            BandsSource::Defaults => f.write_str("nodegrace's defaults"),
            BandsSource::Nodegrace(p) => write!(f, "[fallback] in {}", show(p)),
            BandsSource::Kubelet(files) => write!(
                f,
                "the kubelet's configuration ({})",
                files.iter().map(show).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a table ([static_pods])")]
pub struct StaticPodSettings {
    /// The kubelet's `staticPodPath`.
    #[serde(deserialize_with = "check::abs_path")]
    pub manifest_dir: PathBuf,
    /// Where gated manifests wait; outside the manifest directory.
    #[serde(deserialize_with = "check::abs_path")]
    pub gate_dir: PathBuf,
}

impl Default for StaticPodSettings {
    fn default() -> Self {
        StaticPodSettings {
            manifest_dir: PathBuf::from("/etc/kubernetes/manifests"),
            gate_dir: PathBuf::from("/var/lib/nodegrace/gated-manifests"),
        }
    }
}

/// When the node needs a reboot (its turn in a RebootWave).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a table ([reboot])")]
pub struct RebootSettings {
    /// A regular file here means the node needs a reboot (Debian's and Ubuntu's updates).
    #[serde(deserialize_with = "check::abs_path")]
    pub sentinel: PathBuf,
    /// Run instead of looking at `sentinel`: exit status 1 means a reboot is needed (as
    /// `needs-restarting -r`), 0 that it is not. Empty: the sentinel.
    #[serde(deserialize_with = "check::sentinel_command")]
    pub sentinel_command: Vec<String>,
    /// Reboots when needed even if no RebootWave selects the node: one node of the cluster
    /// at a time, in the wave `one-at-a-time`.
    pub without_wave: bool,
}

impl Default for RebootSettings {
    fn default() -> Self {
        RebootSettings {
            sentinel: PathBuf::from("/run/reboot-required"),
            sentinel_command: Vec::new(),
            without_wave: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a table ([metrics])")]
pub struct MetricsSettings {
    /// Prometheus listen address; None turns metrics off.
    #[serde(with = "check::listen")]
    pub listen: Option<SocketAddr>,
}

/// Every address, like node_exporter's, so that the cluster's Prometheus can scrape each
/// node; 9847 is none of the kubelet's (10248, 10250, 10255), kube-proxy's (10249, 10256),
/// node_exporter's (9100) or Prometheus's own (9090, 9091, 9093).
const DEFAULT_METRICS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9847);

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            listen: Some(DEFAULT_METRICS_LISTEN),
        }
    }
}

impl Settings {
    /// The Node this daemon serves: `node.name`, or else the host name lowercased, as the
    /// kubelet derives its default node name.
    pub fn node_name(&self) -> anyhow::Result<String> {
        if !self.node.name.is_empty() {
            return Ok(self.node.name.clone());
        }
        let host = nix::unistd::gethostname().context("cannot read the host name")?;
        let host = host
            .into_string()
            .map_err(|raw| anyhow::anyhow!("the host name {raw:?} is not UTF-8; set node.name"))?;
        let name = host.trim().to_lowercase();
        anyhow::ensure!(!name.is_empty(), "the host name is empty; set node.name");
        Ok(name)
    }
}

/// The keys a SIGHUP does not apply: they only take effect after a restart (see the module
/// documentation). Every other key of the rendered settings is applied by a reload.
pub(crate) const RESTART_ONLY: &[&str] = &[
    "state_dir",
    "node.name",
    "node.kubeconfig",
    "node.kubelet_kubeconfig",
    "node.renew_credential",
    "node.credential_lifetime",
    "shutdown.max_delay",
    "shutdown.manage_logind_dropin",
    "shutdown.logind_dropin_dir",
    "shutdown.logind_dropin_name",
    "fallback.cri_endpoint",
    "static_pods.manifest_dir",
    "static_pods.gate_dir",
    "metrics.listen",
];

/// Keys of [`RESTART_ONLY`] whose value differs between `running` and `reloaded`.
pub(crate) fn restart_required(running: &Settings, reloaded: &Settings) -> Vec<&'static str> {
    let (a, b) = (
        render::to_toml_table(running),
        render::to_toml_table(reloaded),
    );
    RESTART_ONLY
        .iter()
        .copied()
        .filter(|key| render::lookup(&a, key) != render::lookup(&b, key))
        .collect()
}

/// `reloaded`, except for the keys of [`RESTART_ONLY`], which keep their running values.
pub(crate) fn keep_restart_only(running: &Settings, reloaded: Settings) -> Settings {
    let mut s = reloaded;
    s.state_dir = running.state_dir.clone();
    s.node = running.node.clone();
    s.shutdown.max_delay = running.shutdown.max_delay;
    s.shutdown.manage_logind_dropin = running.shutdown.manage_logind_dropin;
    s.shutdown.logind_dropin_dir = running.shutdown.logind_dropin_dir.clone();
    s.shutdown.logind_dropin_name = running.shutdown.logind_dropin_name.clone();
    s.fallback.cri_endpoint = running.fallback.cri_endpoint.clone();
    s.static_pods = running.static_pods.clone();
    s.metrics = running.metrics.clone();
    s
}

/// What `check-config` prints on success; valid TOML (the file list is in comments).
pub(crate) fn check_config_report(main: &Path, loaded: &Loaded) -> String {
    let mut out = String::new();
    if loaded.main_missing {
        out.push_str(&format!(
            "# {} does not exist; using the defaults\n",
            crate::text::escape(&main.display().to_string())
        ));
    }
    if loaded.files.is_empty() {
        out.push_str("# no configuration files read\n");
    } else {
        out.push_str("# files read, in order (later wins):\n");
        for file in &loaded.files {
            // A drop-in's name is whatever its author chose: one line of comment, always.
            out.push_str(&format!(
                "#   {}\n",
                crate::text::escape(&file.display().to_string())
            ));
        }
    }
    let fb = &loaded.settings.fallback;
    out.push_str(&format!(
        "# fallback bands from {}\n",
        crate::text::escape(&fb.bands_from.to_string())
    ));
    if fb.kubelet_gns {
        out.push_str("# the kubelet's own Graceful Node Shutdown is on: nodegrace leaves the GracefulNodeShutdownInProgress condition to it\n");
    }
    if let Some(why) = &fb.kubelet_set_aside {
        out.push_str(&format!(
            "# warning: the kubelet's configuration is set aside: {}\n",
            crate::text::escape(why)
        ));
    }
    out.push_str("# effective settings:\n");
    out.push_str(&to_toml_string(&loaded.settings));
    out
}

impl Settings {
    /// What the shutdown drain plan reserves for the later bands of `pods` (those still
    /// running): a budget below it cannot give them their time. Zero when no plan can be made.
    pub(crate) fn reserves_needed(&self, pods: &[crate::plan::PodInfo]) -> Duration {
        let reserves = BudgetReserves::from(&self.drain);
        crate::plan::shutdown_drain_plan(self)
            .ok()
            .and_then(|plan| crate::plan::plan_steps(&plan, pods).ok())
            .map(|steps| {
                // Which classes have pods does not depend on the budget split.
                let schedule =
                    crate::plan::split_budget(self.shutdown.max_delay, &steps, &reserves);
                crate::plan::reserves_needed(&schedule, &reserves)
            })
            .unwrap_or(Duration::ZERO)
    }
}

impl From<&DrainSettings> for BudgetReserves {
    fn from(d: &DrainSettings) -> Self {
        BudgetReserves {
            daemonset: d.reserve_daemonset,
            static_pods: d.reserve_static,
            critical: d.reserve_critical,
            critical_priority: d.critical_priority,
        }
    }
}

impl ShutdownPlanSettings for Settings {
    fn drain_plan(&self) -> &[DrainPlanEntrySetting] {
        &self.drain.plan
    }

    fn gns_bands(&self) -> &[PriorityGracePeriod] {
        &self.fallback.shutdown_grace_period_by_pod_priority
    }
}

impl ShutdownPlanSettings for std::sync::Arc<Settings> {
    fn drain_plan(&self) -> &[DrainPlanEntrySetting] {
        &self.drain.plan
    }

    fn gns_bands(&self) -> &[PriorityGracePeriod] {
        &self.fallback.shutdown_grace_period_by_pod_priority
    }
}
