//! nodegrace: safe Kubernetes node shutdown and reboot.
//!
//! Pure decisions live in `plan`; every external system has one adapter module
//! behind a small trait; `daemon` is the one state machine that drives them.
//!
//! The modules are private. What `main.rs`, the test kit (testkit/) and the integration
//! tests use is re-exported below, grouped by the module it comes from: this list is the
//! crate's whole public surface.

#![warn(unreachable_pub)]

mod api;
mod cli;
mod cluster;
mod config;
mod credentials;
mod cri;
mod daemon;
mod fallback;
mod fsutil;
mod logind;
mod metrics;
mod nodeview;
mod plan;
mod sandbox;
mod shutdown;
mod state;
mod staticpods;
mod systemd;
mod telemetry;
mod text;
mod timer;
mod yaml;

/// The commands behind `main`'s argument parsing (and the simulator's), with their
/// exit codes and output helpers.
pub mod commands {
    pub use crate::cli::{
        align, approve_command, check_config, complete, crds, exit_code, history, human,
        load_settings, parse_budget, parse_pod_list, plan, reboot, record_panics, request_command,
        run, runtime, status, wave_history, LabelKeys, ListedPod, OutputFormat, PlanOptions,
        RequestOptions, EXIT_CONFIG, EXIT_FAILURE,
    };
    pub use crate::credentials::approve::ApproveOptions;
    pub use crate::sandbox::generator_command;
    pub use crate::telemetry::init_cli;
    pub use crate::text::print_stdout;
}

/// One eviction or deletion of a pod, with the pod's UID as precondition.
pub mod evict {
    pub use crate::cluster::evict::{delete, evict, Outcome};
}

/// The CRI's generated v1 messages.
pub use crate::cri::v1;

/// The EvictionRequest API of Kubernetes 1.37 as nodegrace requests through it.
pub mod lifecycle {
    pub use crate::plan::intree::requester_key;
}

// The CRDs and their names and labels.
pub use crate::api::{
    crd_files, crds_yaml, node_maintenance_crd, node_selector_for, node_status_apply_patch,
    node_status_patch_params, reboot_wave_crd, shutdown_maintenance_name, NodeMaintenance,
    NodeMaintenanceNodeStatus, NodeMaintenanceSpec, NodeMaintenanceStatus, RebootWave,
    RebootWaveSpec, RebootWaveStatus, SlotPhase, Stage, WaveMember, WaveSlot,
    FINALIZER_MAINTENANCE_COMPLETION, NODE_LABEL, NODE_MAINTENANCE_CRD_NAME, REBOOT_WAVE_CRD_NAME,
};

// The cluster engine, the requester and the apiserver clients.
pub use crate::cluster::client::{build as build_clients, Clients, Timeouts};
pub use crate::cluster::engine::COMPLETED_MESSAGE;
pub use crate::cluster::engine::{AfterBoot, Engine, EngineError, EngineOptions};
pub use crate::cluster::eviction_request::NODE_LABEL as REQUEST_NODE_LABEL;
pub use crate::cluster::identity::{required_in_tree, verify as verify_identity};
pub use crate::cluster::{EvictionApi, PodTerminator, Request};

// Settings.
pub use crate::config::{CompletionPolicy, Settings, StaticPodSettings, DEFAULT_CONFIG_PATH};
pub use crate::credentials::issue::request_pem;

// The CRI runtime.
pub use crate::cri::{
    Container, ContainerState, CriClient, CriError, CriTimeouts, PodSandbox, Runtime,
    RuntimeVersion, SandboxState, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

// The node's own view of its pods.
pub use crate::nodeview::{PodsOnNode, RuntimeAndMounts};
pub use crate::plan::bandend::{NodeView, OnNode};

// The running daemon and its drainer.
pub use crate::daemon::node::{daemon_clients, NodeDrainer, NodeParts};
pub use crate::daemon::status::ShutdownStatus;
pub use crate::daemon::{
    Bus, CancelCause, Connector, Daemon, DaemonHandle, DaemonPaths, Drainer, Phase, RouteEvent,
    ShutdownKind, ShutdownRequest, Status, Way, ZbusConnector,
};
pub use crate::plan::lifecycle::{route, Route};

// The offline fallback.
pub use crate::fallback::{Fallback, FallbackOptions, KubeletControl};
pub use crate::state::report::{FallbackReport, Method, PodOutcome, PodReport};

// logind and systemd.
pub use crate::logind::budget::{parse_inhibit_delay, BudgetReport, DelayDropin};
pub use crate::logind::{InhibitorInfo, InhibitorLock, Logind, LogindError, LogindEvent};
pub use crate::systemd::{Job, Notifier, Notify, SystemdManager, INHIBITOR_FDNAME};

// Metrics.
pub use crate::metrics::{Metrics, TerminationMethod};

// The pure plan.
pub use crate::plan::drainplan::DrainPlanEntrySetting;
pub use crate::plan::drainplan::{normalize_drain_plan, shutdown_drain_plan};
pub use crate::plan::gns::{GnsBands, PriorityGracePeriod};
pub use crate::plan::{plan_steps, DrainPlanEntry, PodInfo, PodType};

// Local state and static pods.
pub use crate::state::{
    current_boot_id, BootIdSource, OfflineDrain, PodCache, ShutdownOutcome, ShutdownPhase,
    ShutdownState,
};
pub use crate::staticpods::{mirror_pod_name, FsGate, Problem, StaticManifest, StaticPodGate};
