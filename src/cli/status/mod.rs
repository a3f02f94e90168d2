//! `nodegrace status`: this node at a glance. Every section is read on its own and says why
//! it could not be read, so a dead daemon or a lost apiserver still leaves the rest visible.
//!
//! Sources: the daemon's runtime status file ([`crate::daemon::status::DEFAULT_STATUS_FILE`],
//! `$NODEGRACE_STATUS_FILE` overrides it), `state.json` and `pods.json` in `state_dir`, the
//! static pod gate directory, logind.conf.d of `[shutdown]`, and the apiserver (3 s probe).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::{human, kube_client, load_settings, runtime, secs, OutputFormat};
use crate::api::{node_selector_for, shutdown_maintenance_name, NodeMaintenance};
use crate::cluster::client::Role;
use crate::config::Settings;

mod table;
mod wave;
pub(crate) use table::render_table;

use crate::daemon::status::{PhaseChange, ShutdownStatus};
use crate::daemon::{DaemonPaths, Status};
use crate::logind::budget::{DelayDropin, DROPIN_MARKER};
use crate::plan::{normalize_drain_plan, plan_steps, DrainTargets, PodInfo};
use crate::state::{OfflineDrain, PodCache, ShutdownState};
use crate::staticpods::FsGate;

/// How long the apiserver probe (and each list after it) may take.
pub(crate) const APISERVER_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What `status -o json` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StatusReport {
    pub node: Option<String>,
    pub node_error: Option<String>,
    pub daemon: DaemonSection,
    pub budget: BudgetSection,
    pub apiserver: ApiserverSection,
    /// nodegrace's credential, then the kubelet's (read from their kubeconfigs).
    pub credentials: Vec<CredentialReport>,
    pub maintenances: MaintenanceSection,
    pub static_pods: StaticPodSection,
    pub pod_cache: PodCacheSection,
    pub kubelet_config: KubeletConfigSection,
    pub last_shutdown: ShutdownSection,
    pub reboot_wave: wave::WaveSection,
}

/// What nodegrace made of the kubelet's configuration.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KubeletConfigSection {
    /// The kubelet's own Graceful Node Shutdown is on (it is then the node's graceful
    /// shutdown manager).
    pub gns_on: bool,
    /// Where the fallback's bands come from.
    pub bands_from: String,
    /// Why the kubelet's configuration is set aside and what nodegrace does instead.
    pub set_aside: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DaemonSection {
    pub status_file: PathBuf,
    /// `running`, `not-running` (no status file), `stale` (its process is gone) or
    /// `unreadable`.
    pub state: String,
    pub pid: Option<u32>,
    pub phase: Option<crate::daemon::Phase>,
    pub phase_description: Option<String>,
    pub inhibitor_held: Option<bool>,
    pub bus_connected: Option<bool>,
    pub kubelet_inhibitor: Option<String>,
    pub last_error: Option<String>,
    pub updated_at: Option<chrono::DateTime<chrono::Utc>>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BudgetSection {
    /// `daemon` (established by the running daemon) or `config` (daemon not running: only
    /// the configured maximum is known).
    pub source: String,
    pub configured_seconds: f64,
    pub budget_seconds: Option<f64>,
    pub logind_initial_seconds: Option<f64>,
    pub logind_effective_seconds: Option<f64>,
    /// The logind drop-in that sets the effective delay, as far as it can be told.
    pub set_by: Option<String>,
    pub dropin_written: Option<PathBuf>,
    /// Other drop-ins setting InhibitDelayMaxSec; `overrides_ours` ones win over nodegrace's.
    pub other_dropins: Vec<DelayDropin>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ApiserverSection {
    pub reachable: bool,
    pub version: Option<String>,
    pub error: Option<String>,
    pub probe_timeout_seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CredentialReport {
    /// `node.kubeconfig` or `node.kubelet_kubeconfig`.
    pub key: String,
    /// None: in-cluster config or `$KUBECONFIG` (or, for the kubelet's, node.kubeconfig's).
    pub path: Option<PathBuf>,
    /// `ok`, `renewal-due`, `expired`, `missing`, `unreadable`, `not-a-certificate`.
    pub state: String,
    /// `CN (O, ...)` of the client certificate.
    pub identity: Option<String>,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When the daemon renews it (nodegrace's only).
    pub renew_from: Option<chrono::DateTime<chrono::Utc>>,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MaintenanceSection {
    /// False when the apiserver could not be asked.
    pub known: bool,
    pub error: Option<String>,
    /// Active (not Complete) NodeMaintenances that select this node.
    pub active: Vec<MaintenanceReport>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MaintenanceReport {
    pub name: String,
    pub stage: String,
    pub reason: Option<String>,
    pub drained: Option<String>,
    /// This node's entry in `status.nodeStatuses`.
    pub drain_targets: Vec<String>,
    pub drain_message: Option<String>,
    pub pods_remaining: Option<i32>,
    pub pods_pending_eviction_request: Option<i32>,
    pub active_eviction_requests: Option<i32>,
    pub last_update_time: Option<String>,
    /// The node's active pods per step of this maintenance's plan (steps without pods left out).
    pub bands: Vec<BandReport>,
    pub bands_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BandReport {
    pub index: usize,
    pub description: String,
    /// Covered by this node's drain targets: these pods are being drained now.
    pub targeted: bool,
    pub remaining: usize,
    pub pods: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StaticPodSection {
    pub manifest_dir: PathBuf,
    pub gate_dir: PathBuf,
    pub gated: Vec<GatedManifest>,
    /// Gated files the kubelet refuses as manifests (no pod in them): restored with the
    /// others.
    pub gated_unreadable: Vec<OtherFile>,
    /// Files in the kubelet's manifest directory that it refuses: gated last at a shutdown.
    pub unreadable: Vec<OtherFile>,
    /// Files in the gate directory that are not restorable (symlinks, FIFOs, over the
    /// size limit, ...): `complete` leaves them there.
    pub other_files: Vec<OtherFile>,
    /// Journal records recovery set aside, when there are any: for the operator to check.
    pub set_aside_journal: Option<PathBuf>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OtherFile {
    pub file_name: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GatedManifest {
    pub file_name: String,
    pub namespace: String,
    pub pod_name: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodCacheSection {
    pub pods: Option<usize>,
    pub written_at: Option<chrono::DateTime<chrono::Utc>>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ShutdownSection {
    /// `state.json`: the last shutdown handled (persisted across restarts).
    pub persisted: Option<ShutdownState>,
    pub persisted_error: Option<String>,
    /// The shutdown the running daemon serves, if any.
    pub current: Option<ShutdownStatus>,
    /// The daemon's phase changes of this run, oldest first.
    pub timeline: Vec<PhaseChange>,
    /// `offline-drain.json`: what the offline fallback did, not yet recorded on a
    /// NodeMaintenance (the daemon does that once the apiserver answers after the boot).
    pub offline_drain: Option<OfflineDrainSummary>,
    pub offline_drain_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OfflineDrainSummary {
    pub boot_id: String,
    pub kind: crate::shutdown::ShutdownKind,
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    pub pods_stopped: usize,
    pub pods_not_stopped: usize,
}

/// `nodegrace status`.
pub fn status_command(config: &Path, output: OutputFormat) -> Result<ExitCode> {
    let settings = match load_settings(config) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let paths = DaemonPaths::from_env();
    let report = gather(&settings, &paths.status_file)?;
    let protection = protection(&settings, &report);
    let (text, colour) = match output {
        OutputFormat::Json => (serde_json::to_string_pretty(&report)? + "\n", false),
        OutputFormat::Table => (
            render_table(&report) + &protection_line(&protection),
            crate::cli::history::terminal().1,
        ),
    };
    // The exit code answers "is this node protected?" whether or not the report could
    // be written.
    if let Err(err) = crate::text::print_stdout_painted(&text, colour) {
        super::print_stderr(&format!("nodegrace: {err:#}"));
    }
    let determined = report.daemon.state != "unreadable"
        || report.apiserver.reachable
        || report.last_shutdown.persisted_error.is_none()
        || report.static_pods.error.is_none();
    Ok(if !determined {
        ExitCode::from(super::EXIT_FAILURE)
    } else {
        match protection {
            Ok(()) => ExitCode::SUCCESS,
            Err(gap) => ExitCode::from(gap.exit_code()),
        }
    })
}

/// Why the node is not protected against a shutdown right now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Unprotected {
    /// No daemon (no status file, its process gone, or the file unreadable).
    NotRunning(String),
    /// The daemon runs but holds no delay inhibitor: a shutdown would not wait.
    NoInhibitor(String),
    /// The budget is below the reserves the plan needs for the cached pods.
    BudgetShort { budget: Duration, needed: Duration },
}

impl Unprotected {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Unprotected::NotRunning(_) => super::EXIT_NOT_RUNNING,
            Unprotected::NoInhibitor(_) => super::EXIT_NO_INHIBITOR,
            Unprotected::BudgetShort { .. } => super::EXIT_BUDGET_SHORT,
        }
    }
}

/// Whether a shutdown now would be drained as configured: the daemon runs, holds its
/// inhibitor, and its budget covers the reserves the shutdown plan needs for the pods of
/// the pod cache (the daemon's last view of the node). The first gap found, in that order.
pub(crate) fn protection(settings: &Settings, report: &StatusReport) -> Result<(), Unprotected> {
    let d = &report.daemon;
    if d.state != "running" {
        return Err(Unprotected::NotRunning(
            d.error.clone().unwrap_or_else(|| d.state.clone()),
        ));
    }
    if d.inhibitor_held != Some(true) {
        let phase = d.phase_description.clone().unwrap_or_default();
        return Err(Unprotected::NoInhibitor(phase));
    }
    let Some(budget) = report.budget.budget_seconds else {
        return Ok(());
    };
    let budget = Duration::try_from_secs_f64(budget).unwrap_or(Duration::ZERO);
    let Ok(cache) = PodCache::load(&settings.state_dir) else {
        return Ok(());
    };
    let needed = settings.reserves_needed(&cache.pods);
    if budget < needed {
        return Err(Unprotected::BudgetShort { budget, needed });
    }
    Ok(())
}

/// The table's last line: protected or not, and why (with the exit code it gives).
fn protection_line(p: &Result<(), Unprotected>) -> String {
    let why = match p {
        Ok(()) => return "\nProtected: yes (a shutdown now waits for the drain)\n".into(),
        Err(Unprotected::NotRunning(why)) => format!("the daemon is not running: {why}"),
        Err(Unprotected::NoInhibitor(phase)) => format!(
            "the daemon holds no shutdown delay inhibitor ({phase}): a shutdown now would not wait"
        ),
        Err(Unprotected::BudgetShort { budget, needed }) => format!(
            "the shutdown budget {} is below the {} the drain plan reserves for this node's pods \
             (raise logind's InhibitDelayMaxSec or shutdown.max_delay, or lower the [drain] reserves)",
            human(*budget),
            human(*needed)
        ),
    };
    let code = p.as_ref().err().map(Unprotected::exit_code).unwrap_or(0);
    format!("\nProtected: NO, {why} (exit {code})\n")
}

fn gather(settings: &Settings, status_file: &Path) -> Result<StatusReport> {
    let (node, node_error) = match settings.node_name() {
        Ok(n) => (Some(n), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let (daemon, status) = daemon_section(status_file);
    let budget = budget_section(settings, status.as_ref());
    let (apiserver, maintenances, reboot_wave) =
        runtime()?.block_on(cluster_sections(settings, node.as_deref()));
    let (persisted, persisted_error) = match ShutdownState::load(&settings.state_dir) {
        Ok(s) => (s, None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let (offline_drain, offline_drain_error) = match OfflineDrain::load(&settings.state_dir) {
        Ok(d) => (d.map(|d| offline_summary(&d)), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let pod_cache = match PodCache::load(&settings.state_dir) {
        Ok(c) => PodCacheSection {
            pods: Some(c.pods.len()),
            written_at: c.written_at,
            error: None,
        },
        Err(e) => PodCacheSection {
            pods: None,
            written_at: None,
            error: Some(format!("{e:#}")),
        },
    };
    let credentials = vec![
        credential_report(settings, Role::Nodegrace, chrono::Utc::now()),
        credential_report(settings, Role::Kubelet, chrono::Utc::now()),
    ];
    Ok(StatusReport {
        node,
        node_error,
        daemon,
        budget,
        apiserver,
        credentials,
        maintenances,
        static_pods: static_pod_section(settings),
        pod_cache,
        kubelet_config: KubeletConfigSection {
            gns_on: settings.fallback.kubelet_gns,
            bands_from: settings.fallback.bands_from.to_string(),
            set_aside: settings.fallback.kubelet_set_aside.clone(),
        },
        last_shutdown: ShutdownSection {
            persisted,
            persisted_error,
            current: status.as_ref().and_then(|s| s.shutdown.clone()),
            timeline: status.map(|s| s.timeline).unwrap_or_default(),
            offline_drain,
            offline_drain_error,
        },
        reboot_wave,
    })
}

/// What `role`'s kubeconfig holds, read from disk (the apiserver is not asked).
pub(crate) fn credential_report(
    settings: &Settings,
    role: Role,
    now: chrono::DateTime<chrono::Utc>,
) -> CredentialReport {
    use crate::cluster::kubeconfig::{Credential, KubeconfigFile};
    let path = match role {
        Role::Nodegrace => settings.node.kubeconfig.clone(),
        Role::Kubelet => settings.node.kubelet_kubeconfig.clone(),
    };
    let mut report = CredentialReport {
        key: role.key().into(),
        path: path.clone(),
        state: "ok".into(),
        identity: None,
        expires_at: None,
        renew_from: None,
        detail: None,
    };
    let Some(path) = path else {
        report.state = "not-a-certificate".into();
        report.detail = Some(match role {
            Role::Nodegrace => "in-cluster config or $KUBECONFIG".into(),
            Role::Kubelet => "the same as node.kubeconfig".into(),
        });
        return report;
    };
    if std::fs::symlink_metadata(&path).is_err() {
        report.state = "missing".into();
        report.detail = Some(match role {
            Role::Nodegrace => "run `nodegrace credentials request` (or let the daemon request it: node.renew_credential)".into(),
            Role::Kubelet => "the kubelet's kubeconfig is not there: set node.kubelet_kubeconfig".into(),
        });
        return report;
    }
    match KubeconfigFile::read(&path).and_then(|f| f.credential()) {
        Ok(Credential::Certificate(c)) => {
            report.identity = Some(c.identity());
            report.expires_at = Some(c.not_after);
            if role == Role::Nodegrace {
                report.renew_from = Some(c.renew_at());
            }
            if c.not_after <= now {
                report.state = "expired".into();
            } else if role == Role::Nodegrace && c.renew_at() <= now {
                report.state = "renewal-due".into();
            }
        }
        Ok(Credential::Other(kind)) => {
            report.state = "not-a-certificate".into();
            report.detail = Some(format!("a {kind}: no expiry to read"));
        }
        Ok(Credential::None) => {
            report.state = "not-a-certificate".into();
            report.detail = Some("no credential in its current context".into());
        }
        Err(e) => {
            report.state = "unreadable".into();
            report.detail = Some(format!("{e:#}"));
        }
    }
    report
}

fn offline_summary(d: &OfflineDrain) -> OfflineDrainSummary {
    let s = crate::cluster::FallbackSummary::of_runs(&d.reports);
    OfflineDrainSummary {
        boot_id: d.boot_id.clone(),
        kind: d.kind,
        started_at: s.started_at,
        pods_stopped: s.pods_stopped,
        pods_not_stopped: s.pods_not_stopped + s.pods_not_reached,
    }
}

fn daemon_section(status_file: &Path) -> (DaemonSection, Option<Status>) {
    let mut section = DaemonSection {
        status_file: status_file.to_path_buf(),
        state: String::new(),
        pid: None,
        phase: None,
        phase_description: None,
        inhibitor_held: None,
        bus_connected: None,
        kubelet_inhibitor: None,
        last_error: None,
        updated_at: None,
        error: None,
    };
    match std::fs::symlink_metadata(status_file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            section.state = "not-running".into();
            section.error = Some(format!(
                "no status file {}: the daemon is not running",
                status_file.display()
            ));
            return (section, None);
        }
        _ => {}
    }
    let status = match Status::read(status_file) {
        Ok(s) => s,
        Err(e) => {
            section.state = "unreadable".into();
            section.error = Some(format!("{e:#}"));
            return (section, None);
        }
    };
    let alive = process_alive(status.pid);
    section.state = if alive { "running" } else { "stale" }.into();
    if !alive {
        section.error = Some(format!(
            "process {} that wrote {} is gone: the daemon is not running (what follows is its last word)",
            status.pid,
            status_file.display()
        ));
    }
    section.pid = Some(status.pid);
    section.phase = Some(status.phase);
    section.phase_description = Some(status.phase.describe().into());
    // A dead daemon holds nothing: logind drops an inhibitor with its process.
    section.inhibitor_held = Some(alive && status.inhibitor_held);
    section.bus_connected = Some(alive && status.bus_connected);
    section.kubelet_inhibitor = status.kubelet_inhibitor.clone();
    section.last_error = status.last_error.clone();
    section.updated_at = Some(status.updated_at);
    (section, Some(status))
}

fn process_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    }
}

fn budget_section(settings: &Settings, status: Option<&Status>) -> BudgetSection {
    let configured = settings.shutdown.max_delay;
    let own_dropin = own_dropin(&settings.shutdown.logind_dropin_dir);
    let Some(report) = status.and_then(|s| s.budget.as_ref()) else {
        return BudgetSection {
            source: "config".into(),
            configured_seconds: secs(configured),
            budget_seconds: None,
            logind_initial_seconds: None,
            logind_effective_seconds: None,
            set_by: own_dropin.map(|p| format!("{} (nodegrace's drop-in)", p.display())),
            dropin_written: None,
            other_dropins: Vec::new(),
            error: Some(match status {
                None => "the daemon is not running: logind's effective delay is not known".into(),
                Some(_) => "the daemon has not established the budget yet".into(),
            }),
        };
    };
    let overriding = report
        .delay_dropins
        .iter()
        .filter(|d| d.overrides_ours)
        .max_by(|a, b| a.path.file_name().cmp(&b.path.file_name()));
    let set_by = if let Some(d) = overriding {
        Some(format!(
            "{} (InhibitDelayMaxSec={}, overrides nodegrace's drop-in)",
            d.path.display(),
            d.value
        ))
    } else if let Some(p) = report.dropin_written.as_ref().or(own_dropin.as_ref()) {
        Some(format!("{} (nodegrace's drop-in)", p.display()))
    } else if let Some(d) = report
        .delay_dropins
        .iter()
        .max_by(|a, b| a.path.file_name().cmp(&b.path.file_name()))
    {
        Some(format!(
            "{} (InhibitDelayMaxSec={})",
            d.path.display(),
            d.value
        ))
    } else {
        Some("logind.conf or logind's built-in default (no drop-in sets it)".into())
    };
    BudgetSection {
        source: "daemon".into(),
        configured_seconds: secs(report.configured),
        budget_seconds: Some(secs(report.budget)),
        logind_initial_seconds: Some(secs(report.logind_initial)),
        logind_effective_seconds: Some(secs(report.logind_effective)),
        set_by,
        dropin_written: report.dropin_written.clone(),
        other_dropins: report.delay_dropins.clone(),
        error: report.error.clone(),
    }
}

/// nodegrace's own logind drop-in (recognised by its marker line), if one is installed.
fn own_dropin(dir: &Path) -> Option<PathBuf> {
    let mut ours: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "conf"))
        .filter(|p| {
            crate::fsutil::read_regular(
                p,
                crate::fsutil::CONFIG_FILE_LIMIT,
                crate::fsutil::Symlinks::Refuse,
            )
            .is_ok_and(|text| text.starts_with(DROPIN_MARKER.as_bytes()))
        })
        .collect();
    ours.sort();
    ours.pop()
}

fn static_pod_section(settings: &Settings) -> StaticPodSection {
    let sp = &settings.static_pods;
    let gate = FsGate::new(sp, &settings.state_dir);
    let scan = gate
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(|gate| gate.scan(crate::staticpods::Place::Gate));
    let set_aside_journal = gate
        .as_ref()
        .ok()
        .map(FsGate::set_aside_file)
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.len() > 0));
    let files = |problems: Vec<crate::staticpods::Problem>| -> Vec<OtherFile> {
        problems
            .into_iter()
            .map(|p| OtherFile {
                file_name: p.file_name,
                reason: p.reason,
            })
            .collect()
    };
    let unreadable = gate
        .as_ref()
        .ok()
        .and_then(|gate| gate.scan(crate::staticpods::Place::Manifests).ok())
        .map(|scan| files(scan.unparseable))
        .unwrap_or_default();
    let (gated, gated_unreadable, other_files, error) = match scan {
        Ok(scan) => (
            scan.manifests
                .into_iter()
                .map(|m| GatedManifest {
                    file_name: m.file_name,
                    namespace: m.namespace,
                    pod_name: m.pod_name,
                })
                .collect(),
            files(scan.unparseable),
            files(scan.refused),
            None,
        ),
        Err(e) => (Vec::new(), Vec::new(), Vec::new(), Some(format!("{e:#}"))),
    };
    StaticPodSection {
        manifest_dir: sp.manifest_dir.clone(),
        gate_dir: sp.gate_dir.clone(),
        gated,
        gated_unreadable,
        unreadable,
        other_files,
        set_aside_journal,
        error,
    }
}

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(APISERVER_PROBE_TIMEOUT, fut).await {
        Ok(r) => r.with_context(|| what.to_string()),
        Err(_) => Err(anyhow::anyhow!(
            "{what}: no answer within {}",
            human(APISERVER_PROBE_TIMEOUT)
        )),
    }
}

async fn cluster_sections(
    settings: &Settings,
    node: Option<&str>,
) -> (ApiserverSection, MaintenanceSection, wave::WaveSection) {
    let mut api = ApiserverSection {
        reachable: false,
        version: None,
        error: None,
        probe_timeout_seconds: secs(APISERVER_PROBE_TIMEOUT),
    };
    let unknown = |why: String| MaintenanceSection {
        known: false,
        error: Some(why),
        active: Vec::new(),
    };
    let probe = bounded("apiserver probe", async {
        // The outer bound is what gives up; the client's own timeouts only back it up.
        let client = kube_client(settings, APISERVER_PROBE_TIMEOUT * 2).await?;
        let version = client.apiserver_version().await?;
        Ok((client, version))
    })
    .await;
    let client = match probe {
        Ok((client, version)) => {
            api.reachable = true;
            api.version = Some(version.git_version);
            client
        }
        Err(e) => {
            api.error = Some(one_line(&e));
            let why = "apiserver unreachable".to_owned();
            return (
                api,
                unknown(why.clone()),
                wave::section(&settings.reboot, node.unwrap_or_default(), None, Err(why)).await,
            );
        }
    };
    let Some(node) = node else {
        let why = "the node name is not known".to_owned();
        return (
            api,
            unknown(why.clone()),
            wave::section(&settings.reboot, "", None, Err(why)).await,
        );
    };
    let maintenances = bounded("listing NodeMaintenances", async {
        crate::cluster::list_maintenances_for(&client, node).await
    })
    .await;
    // Label selectors need the Node; without it only entries and name pins can be judged.
    let node_obj = bounded("reading the Node", async {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
        Ok(nodes.get(node).await?)
    })
    .await
    .ok();
    let waves = bounded("listing RebootWaves", async {
        let api: kube::Api<crate::api::RebootWave> = kube::Api::all(client.clone());
        Ok(api.list(&kube::api::ListParams::default()).await?.items)
    })
    .await
    .map_err(|e| one_line(&e));
    let reboot_wave = wave::section(&settings.reboot, node, node_obj.as_ref(), waves).await;
    let maintenances = match maintenances {
        Ok(list) => list,
        Err(e) => return (api, unknown(one_line(&e)), reboot_wave),
    };
    let active: Vec<NodeMaintenance> = maintenances
        .into_iter()
        .filter(|m| {
            m.stage() != crate::api::Stage::Complete && selects_node(m, node, node_obj.as_ref())
        })
        .collect();
    let pods = if active.is_empty() {
        Ok(Vec::new())
    } else {
        bounded("listing the node's pods", async {
            use crate::cluster::listing::{list_all, Caps};
            let params = kube::api::ListParams::default()
                .fields(&crate::plan::own::pods_field_selector(node));
            list_all::<Pod>(&client, None, &params, Caps::NODE).await
        })
        .await
        .map(|pods| {
            pods.iter()
                .filter_map(|p| PodInfo::from_pod(p).ok())
                .filter(PodInfo::is_active)
                .collect::<Vec<_>>()
        })
    };
    let reports = active
        .iter()
        .map(|m| maintenance_report(m, node, &pods))
        .collect();
    (
        api,
        MaintenanceSection {
            known: true,
            error: None,
            active: reports,
        },
        reboot_wave,
    )
}

/// Whether `m` selects `node`: it has an entry for the node, it is the node's shutdown
/// maintenance, or its selector matches the Node (when the Node could be read; else only a
/// selector pinning the node by name counts).
fn selects_node(
    m: &NodeMaintenance,
    node: &str,
    node_obj: Option<&k8s_openapi::api::core::v1::Node>,
) -> bool {
    m.node_status(node).is_some()
        || m.metadata.name.as_deref() == Some(shutdown_maintenance_name(node).as_str())
        || match node_obj {
            Some(n) => crate::cluster::nodesel::selects(&m.spec.node_selector, n),
            None => m.spec.node_selector == node_selector_for(node),
        }
}

fn maintenance_report(
    m: &NodeMaintenance,
    node: &str,
    pods: &Result<Vec<PodInfo>>,
) -> MaintenanceReport {
    let ns = m.node_status(node);
    let mut report = MaintenanceReport {
        name: m.metadata.name.clone().unwrap_or_default(),
        stage: m.stage().to_string(),
        reason: m.spec.reason.clone(),
        drained: m.drained().map(str::to_string),
        drain_targets: ns
            .map(|s| s.drain_targets.iter().map(ToString::to_string).collect())
            .unwrap_or_default(),
        drain_message: ns
            .map(|s| s.drain_message.clone())
            .filter(|s| !s.is_empty()),
        pods_remaining: ns.map(|s| s.pods_remaining),
        pods_pending_eviction_request: ns.map(|s| s.pods_pending_eviction_request),
        active_eviction_requests: ns.map(|s| s.active_eviction_requests),
        last_update_time: ns
            .and_then(|s| s.last_update_time.as_ref())
            .map(|t| t.0.to_string()),
        bands: Vec::new(),
        bands_error: None,
    };
    let pods = match pods {
        Ok(p) => p,
        Err(e) => {
            report.bands_error = Some(one_line(e));
            return report;
        }
    };
    let bands = (|| -> Result<Vec<BandReport>> {
        let plan = normalize_drain_plan(&m.spec.drain_plan)?;
        let targets =
            DrainTargets::from_entries(ns.map(|s| s.drain_targets.as_slice()).unwrap_or(&[]))?;
        Ok(plan_steps(&plan, pods)?
            .into_iter()
            .filter(|s| !s.pods.is_empty())
            .map(|s| BandReport {
                index: s.index,
                description: s.entry.to_string(),
                targeted: s.pods.iter().all(|p| targets.targets(p)),
                remaining: s.pods.len(),
                pods: s.pods.iter().map(PodInfo::key).collect(),
            })
            .collect())
    })();
    match bands {
        Ok(b) => report.bands = b,
        Err(e) => report.bands_error = Some(one_line(&e)),
    }
    report
}

fn one_line(e: &anyhow::Error) -> String {
    crate::cluster::error_text(e)
}
