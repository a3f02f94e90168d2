//! Configuration: `/etc/nodegrace/config.toml` plus `config.d/*.toml` drop-ins, validated
//! into a typed [`Settings`]. Every default here is documented in `config/nodegrace.toml`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::plan::PodType;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/nodegrace/config.toml";

/// What to do with the shutdown NodeMaintenance after a cancelled shutdown or after boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionPolicy {
    /// Move it to stage Complete: uncordon (per the rules), restore static pods.
    Complete,
    /// Leave it for the admin (`nodegrace complete`).
    Keep,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub node: NodeSettings,
    pub shutdown: ShutdownSettings,
    pub drain: DrainSettings,
    pub fallback: FallbackSettings,
    pub static_pods: StaticPodSettings,
    /// Where state.json, the pod cache and the gate journal live.
    pub state_dir: PathBuf,
    pub metrics: MetricsSettings,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// The Node's name; empty means the host name.
    pub name: String,
    /// None means in-cluster config or `$KUBECONFIG`, as kube's `Config::infer`.
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ShutdownSettings {
    /// The longest shutdown delay nodegrace asks of logind (`InhibitDelayMaxSec`).
    pub max_delay: Duration,
    /// Write a logind.conf.d drop-in raising `InhibitDelayMaxSec` when it is too low.
    pub manage_logind_dropin: bool,
    pub logind_dropin_dir: PathBuf,
    /// Must sort after every other drop-in so that it wins.
    pub logind_dropin_name: String,
    pub on_cancel: CompletionPolicy,
    pub after_boot: CompletionPolicy,
    /// Drain time when systemd stops nodegrace during a shutdown that bypassed logind;
    /// must stay below the unit's `TimeoutStopSec`.
    pub stop_drain_timeout: Duration,
    /// Warn when the kubelet also holds a shutdown delay inhibitor (two drains fight).
    pub warn_kubelet_inhibitor: bool,
}

/// One entry of the shutdown drain plan (KEP-4212 `DrainPlanEntry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainPlanEntrySetting {
    pub pod_type: PodType,
    pub pod_priority: i32,
    /// `matchLabels` of the entry's `podSelector`; empty selects every pod.
    pub pod_selector: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DrainSettings {
    /// The shutdown drain plan; default entries are injected by `plan`.
    pub plan: Vec<DrainPlanEntrySetting>,
    /// Time kept at the end of a shutdown budget for DaemonSet pods.
    pub reserve_daemonset: Duration,
    /// Time kept at the end of a shutdown budget for static pods.
    pub reserve_static: Duration,
    /// Time kept for pods at or above `critical_priority`.
    pub reserve_critical: Duration,
    pub critical_priority: i32,
    /// Cap of the exponential back-off after a 429 from the Eviction API.
    pub eviction_backoff_max: Duration,
    /// The same cap while a shutdown deadline runs.
    pub eviction_backoff_max_shutdown: Duration,
    /// An external eviction-request controller runs in the cluster; do not act as one.
    pub external_eviction_request_controller: bool,
    /// How long to wait for this node's VolumeAttachments before releasing.
    pub volume_detach_timeout: Duration,
}

/// One band of the kubelet's `shutdownGracePeriodByPodPriority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityGracePeriod {
    pub priority: i32,
    pub shutdown_grace_period: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FallbackSettings {
    pub enabled: bool,
    /// How long the apiserver may be unreachable before the local fallback takes over.
    pub apiserver_timeout: Duration,
    /// CRI endpoint, e.g. `unix:///run/containerd/containerd.sock`.
    pub cri_endpoint: String,
    pub stop_kubelet: bool,
    pub kubelet_unit: String,
    /// Bands in ascending priority; the simple form (`shutdown_grace_period` and
    /// `shutdown_grace_period_critical_pods`) is converted to two bands on load.
    pub shutdown_grace_period_by_pod_priority: Vec<PriorityGracePeriod>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StaticPodSettings {
    /// The kubelet's `staticPodPath`.
    pub manifest_dir: PathBuf,
    /// Where gated manifests wait; outside the manifest directory.
    pub gate_dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricsSettings {
    /// Prometheus listen address; None turns metrics off.
    pub listen: Option<SocketAddr>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            node: NodeSettings {
                name: String::new(),
                kubeconfig: Some(PathBuf::from("/etc/kubernetes/kubelet.conf")),
            },
            shutdown: ShutdownSettings {
                max_delay: Duration::from_secs(15 * 60),
                manage_logind_dropin: true,
                logind_dropin_dir: PathBuf::from("/etc/systemd/logind.conf.d"),
                logind_dropin_name: "zz-nodegrace.conf".into(),
                on_cancel: CompletionPolicy::Keep,
                after_boot: CompletionPolicy::Complete,
                stop_drain_timeout: Duration::from_secs(80),
                warn_kubelet_inhibitor: true,
            },
            drain: DrainSettings {
                plan: Vec::new(),
                reserve_daemonset: Duration::from_secs(30),
                reserve_static: Duration::from_secs(30),
                reserve_critical: Duration::from_secs(30),
                critical_priority: 2_000_000_000,
                eviction_backoff_max: Duration::from_secs(15 * 60),
                eviction_backoff_max_shutdown: Duration::from_secs(5),
                external_eviction_request_controller: false,
                volume_detach_timeout: Duration::from_secs(20),
            },
            fallback: FallbackSettings {
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
            },
            static_pods: StaticPodSettings {
                manifest_dir: PathBuf::from("/etc/kubernetes/manifests"),
                gate_dir: PathBuf::from("/var/lib/nodegrace/gated-manifests"),
            },
            state_dir: PathBuf::from("/var/lib/nodegrace"),
            metrics: MetricsSettings::default(),
        }
    }
}

/// `nodegrace check-config`.
pub fn check_config_command(_path: &std::path::Path) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("`check-config` is not implemented yet")
}
