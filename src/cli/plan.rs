//! `nodegrace plan`: a dry run of a shutdown that starts now. The drain plan and the budget
//! split come from [`crate::plan`]; this module only gathers pods, picks the budget and prints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::podlist::{parse_pod_list, LabelKeys, ListedPod};
use super::{align, human, kube_client, load_settings, runtime, secs, OutputFormat};
use crate::config::Settings;
use crate::daemon::{DaemonPaths, Status};
use crate::fsutil::{read_regular, Symlinks, POD_LIST_LIMIT};
use crate::plan::budget::StepClass;
use crate::plan::{
    escalation_grace, plan_steps, reserves_needed, shutdown_drain_plan, split_remaining,
    BudgetReserves, DrainPlanEntry, GnsBands, GnsCandidate, PodInfo, PodType, StepSchedule,
};

/// How long `plan` waits for the apiserver before giving up.
const APISERVER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// `kubectl get pods -o yaml|json` output; None reads the node's pods from the apiserver.
    pub pods: Option<PathBuf>,
    pub budget: Option<Duration>,
    /// Plan a shutdown that lost this much of its budget before its drain could go on.
    pub lost: Option<Duration>,
    pub output: OutputFormat,
}

/// What `plan -o json` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PlanReport {
    /// The node planned for; None when the pods come from a file and no node name is known.
    pub node: Option<String>,
    /// `file:<path>`, `stdin` or `apiserver`.
    pub source: String,
    pub budget: BudgetChoice,
    pub reserves: ReservesReport,
    /// Every step of the normalized shutdown drain plan, in plan order (empty ones included).
    pub steps: Vec<StepReport>,
    /// `namespace/name` of every pod in drain order.
    pub order: Vec<String>,
    /// `namespace/name` of the pods whose grace period would be cut.
    pub escalated: Vec<String>,
    pub ignored: Vec<IgnoredPod>,
    /// Files in the kubelet's manifest directory that it refuses (read from this node's
    /// directory when the pods come from the apiserver): gated after every pod.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable_manifests: Vec<IgnoredPod>,
    pub offline: OfflineReport,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BudgetChoice {
    pub seconds: f64,
    /// `flag` (--budget), `status-file` (the running daemon's effective budget) or `config`
    /// (`shutdown.max_delay`).
    pub source: String,
    pub detail: String,
    /// Seconds lost before the drain could go on (`--lost`): what is left of the budget is
    /// split over the pods, as the daemon does after an apiserver outage.
    #[serde(skip_serializing_if = "is_zero")]
    pub lost_seconds: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReservesReport {
    pub critical_seconds: f64,
    pub daemonset_seconds: f64,
    pub static_seconds: f64,
    pub critical_priority: i32,
    /// Sum of the reserves of the classes that have pods; a smaller budget scales them down
    /// and leaves regular pods no time at all.
    pub needed_seconds: f64,
    pub below_reserves: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StepReport {
    /// Position in the normalized plan, from 0.
    pub index: usize,
    pub entry: DrainPlanEntry,
    pub description: String,
    /// `regular`, `critical`, `daemonset` or `static`.
    pub class: String,
    pub start_seconds: f64,
    pub escalate_at_seconds: f64,
    pub end_seconds: f64,
    pub share_seconds: f64,
    pub longest_grace_seconds: f64,
    pub explanation: String,
    pub pods: Vec<PodPlan>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodPlan {
    /// 1-based position in the drain order.
    pub order: usize,
    pub pod: String,
    pub namespace: String,
    pub name: String,
    pub priority: i32,
    pub pod_type: PodType,
    pub grace_seconds: i64,
    /// Already has a deletionTimestamp.
    pub terminating: bool,
    /// Its grace period does not fit its step's share: if still there at `escalateAtSeconds`
    /// it is deleted with `escalationGraceSeconds`.
    pub escalated: bool,
    pub escalation_grace_seconds: Option<f64>,
    pub escalation_reason: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IgnoredPod {
    pub pod: String,
    pub reason: String,
}

/// The offline fallback: the kubelet's priority bands through the CRI runtime.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OfflineReport {
    /// `fallback.enabled`.
    pub enabled: bool,
    pub bands: Vec<OfflineBand>,
    /// Sum of the grace periods of the bands with pods.
    pub max_duration_seconds: f64,
    pub note: Option<String>,
    /// Where the bands come from.
    pub bands_from: String,
    /// Why the kubelet's configuration is set aside and what nodegrace does instead.
    pub kubelet_set_aside: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OfflineBand {
    pub priority: i32,
    pub shutdown_grace_period_seconds: f64,
    pub pods: Vec<OfflinePod>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OfflinePod {
    pub pod: String,
    pub priority: i32,
    pub grace_seconds: f64,
}

/// `nodegrace plan`.
pub fn plan_command(config: &Path, opts: &PlanOptions) -> Result<ExitCode> {
    let settings = match load_settings(config) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let (node, source, pods, unbound) = match &opts.pods {
        Some(path) => {
            let stdin = path.as_os_str() == "-";
            let name = if stdin {
                "standard input".to_string()
            } else {
                path.display().to_string()
            };
            let bytes = if stdin {
                read_stdin(POD_LIST_LIMIT)
                    .context("cannot read the pod list from standard input")?
            } else {
                read_regular(path, POD_LIST_LIMIT, Symlinks::Follow)
                    .with_context(|| format!("cannot read pod list {name}"))?
            };
            let text = String::from_utf8(bytes)
                .with_context(|| format!("pod list {name} is not UTF-8"))?;
            let labels = LabelKeys::of_plan(&shutdown_drain_plan(&settings).unwrap_or_default());
            let (node, pods, unbound) = parse_pod_list(&text, &labels)
                .and_then(|pods| pods_of_one_node(pods, settings.node_name().ok()))
                .with_context(|| format!("invalid pod list {name}"))?;
            let source = if stdin {
                "stdin".to_string()
            } else {
                format!("file:{name}")
            };
            (node, source, pods, unbound)
        }
        None => {
            let node = settings.node_name()?;
            let pods = runtime()?.block_on(live_pods(&settings, &node))?;
            (Some(node), "apiserver".to_string(), pods, Vec::new())
        }
    };
    let mut budget = choose_budget(opts.budget, &settings, &DaemonPaths::from_env().status_file);
    budget.lost_seconds = opts.lost.map_or(0.0, secs);
    let live = source == "apiserver";
    let mut report = build_report(&settings, node, source, pods, unbound, budget)?;
    if live {
        report.unreadable_manifests = unreadable_manifests(&settings);
    }
    let text = match opts.output {
        OutputFormat::Json => serde_json::to_string_pretty(&report)? + "\n",
        OutputFormat::Table => render_table(&report),
    };
    super::print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// This node's files that the kubelet refuses as static pod manifests.
fn unreadable_manifests(settings: &Settings) -> Vec<IgnoredPod> {
    crate::staticpods::FsGate::new(&settings.static_pods, &settings.state_dir)
        .and_then(|gate| gate.scan(crate::staticpods::Place::Manifests))
        .map(|scan| {
            scan.unparseable
                .into_iter()
                .map(|p| IgnoredPod {
                    pod: p.file_name,
                    reason: p.reason,
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn live_pods(settings: &Settings, node: &str) -> Result<Vec<ListedPod>> {
    let list = async {
        let client = kube_client(settings, APISERVER_TIMEOUT).await?;
        use crate::cluster::listing::{list_all, Caps};
        let params =
            kube::api::ListParams::default().fields(&crate::plan::own::pods_field_selector(node));
        list_all::<Pod>(&client, None, &params, Caps::NODE).await
    };
    let result = match tokio::time::timeout(APISERVER_TIMEOUT, list).await {
        Ok(r) => r,
        Err(_) => Err(anyhow::anyhow!(
            "no answer within {}",
            human(APISERVER_TIMEOUT)
        )),
    };
    match result {
        Ok(list) => list
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                ListedPod::from_pod(pod).with_context(|| {
                    format!("pod {} of node {node}'s list from the apiserver", i + 1)
                })
            })
            .collect(),
        // One line: the cause, then the offline way.
        Err(e) => bail!(
            "cannot list the pods of node {node} from the apiserver: {}; use --pods FILE (kubectl get pods -o yaml output) to plan offline",
            crate::cluster::error_text(&e)
        ),
    }
}

/// A plan is for one node: the one the list's pods are bound to (`spec.nodeName`), whose
/// unbound pods are then ignored. A list without any binding is taken as the configured
/// node's; a list spanning several nodes is an error.
fn pods_of_one_node(
    pods: Vec<ListedPod>,
    configured: Option<String>,
) -> Result<(Option<String>, Vec<ListedPod>, Vec<IgnoredPod>)> {
    let node_of = |p: &ListedPod| p.node_name.clone();
    let nodes: std::collections::BTreeSet<String> = pods.iter().filter_map(node_of).collect();
    if nodes.len() > 1 {
        let names: Vec<&str> = nodes.iter().map(String::as_str).take(5).collect();
        bail!(
            "it holds pods of {} nodes ({}{}); a plan is for one node: kubectl get pods -A --field-selector spec.nodeName=NODE -o yaml",
            nodes.len(),
            names.join(", "),
            if nodes.len() > 5 { ", ..." } else { "" }
        );
    }
    let Some(node) = nodes.into_iter().next() else {
        return Ok((configured, pods, Vec::new()));
    };
    let (bound, unbound): (Vec<ListedPod>, Vec<ListedPod>) =
        pods.into_iter().partition(|p| p.node_name.is_some());
    let ignored = unbound
        .iter()
        .map(|p| IgnoredPod {
            pod: p.info.key(),
            reason: "not bound to a node (no spec.nodeName)".into(),
        })
        .collect();
    Ok((Some(node), bound, ignored))
}

/// At most `limit` bytes of standard input (`kubectl get pods -o yaml | nodegrace plan
/// --pods -`), the same cap as a pod list file.
fn read_stdin(limit: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        anyhow::bail!("larger than {limit} bytes, more than such a file can sensibly hold");
    }
    Ok(bytes)
}

/// `--budget`: a duration no longer than any budget the daemon can have (`shutdown.max_delay`
/// is at most 24 h).
pub fn parse_budget(s: &str) -> std::result::Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    let max = crate::config::MAX_SHUTDOWN_DELAY;
    if d > max {
        return Err(format!(
            "{} is longer than any shutdown budget (shutdown.max_delay is at most {})",
            human(d),
            human(max)
        ));
    }
    Ok(d)
}

/// `--budget`, else the running daemon's effective budget, else `shutdown.max_delay`.
fn choose_budget(flag: Option<Duration>, settings: &Settings, status_file: &Path) -> BudgetChoice {
    if let Some(b) = flag {
        return BudgetChoice {
            seconds: secs(b),
            source: "flag".into(),
            detail: "--budget".into(),
            lost_seconds: 0.0,
        };
    }
    let configured = settings.shutdown.max_delay;
    let why_not = match Status::read(status_file) {
        Ok(status) => match status.budget {
            Some(report) => {
                return BudgetChoice {
                    seconds: secs(report.budget),
                    source: "status-file".into(),
                    lost_seconds: 0.0,
                    detail: format!(
                        "the daemon's effective budget from {} (min of shutdown.max_delay {} and logind's delay {})",
                        status_file.display(),
                        human(report.configured),
                        human(report.logind_effective)
                    ),
                };
            }
            None => format!("{} has no budget yet", status_file.display()),
        },
        Err(e) if is_not_found(&e) => format!("no status file {}", status_file.display()),
        Err(e) => format!("{e:#}"),
    };
    BudgetChoice {
        seconds: secs(configured),
        source: "config".into(),
        detail: format!("shutdown.max_delay from the configuration; {why_not}"),
        lost_seconds: 0.0,
    }
}

fn is_not_found(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
            || matches!(
                c.downcast_ref::<crate::fsutil::ReadError>(),
                Some(crate::fsutil::ReadError::NotFound)
            )
    })
}

fn class_name(class: StepClass) -> &'static str {
    match class {
        StepClass::Regular => "regular",
        StepClass::Critical => "critical",
        StepClass::DaemonSet => "daemonset",
        StepClass::Static => "static",
    }
}

/// Builds the report from pods already read; pure apart from the settings it is given.
pub(crate) fn build_report(
    settings: &Settings,
    node: Option<String>,
    source: String,
    pods: Vec<ListedPod>,
    mut ignored: Vec<IgnoredPod>,
    budget: BudgetChoice,
) -> Result<PlanReport> {
    let mut infos = Vec::with_capacity(pods.len());
    for pod in pods {
        if pod.info.terminal {
            ignored.push(IgnoredPod {
                pod: pod.info.key(),
                reason: format!(
                    "terminal (phase {}): no drain touches it",
                    pod.phase.unwrap_or_default()
                ),
            });
        } else {
            infos.push(pod.info);
        }
    }

    let plan = shutdown_drain_plan(settings).context("invalid [drain] plan")?;
    let steps = plan_steps(&plan, &infos).context("invalid drain plan")?;
    let reserves = BudgetReserves::from(&settings.drain);
    let budget_duration = Duration::from_millis((budget.seconds * 1000.0).round() as u64);
    let lost = Duration::from_millis((budget.lost_seconds * 1000.0).round() as u64);
    let schedule = split_remaining(budget_duration, lost, &steps, &reserves);

    let needed = reserves_needed(&schedule, &reserves);
    let mut order = Vec::new();
    let mut escalated = Vec::new();
    let mut step_reports = Vec::with_capacity(schedule.len());
    for (step, sched) in steps.iter().zip(&schedule) {
        let mut pods: Vec<&PodInfo> = step.pods.iter().collect();
        pods.sort_by_key(|a| (a.priority, a.key()));
        let share = sched.end.saturating_sub(sched.start);
        let pod_plans = pods
            .into_iter()
            .map(|p| {
                order.push(p.key());
                let plan = pod_plan(p, order.len(), sched, share);
                if plan.escalated {
                    escalated.push(p.key());
                }
                plan
            })
            .collect();
        step_reports.push(StepReport {
            index: sched.index,
            entry: sched.entry.clone(),
            description: sched.entry.to_string(),
            class: class_name(sched.class).into(),
            start_seconds: secs(sched.start),
            escalate_at_seconds: secs(sched.escalate_at),
            end_seconds: secs(sched.end),
            share_seconds: secs(share),
            longest_grace_seconds: secs(sched.longest_grace),
            explanation: sched.explanation.clone(),
            pods: pod_plans,
        });
    }

    Ok(PlanReport {
        node,
        source,
        reserves: ReservesReport {
            critical_seconds: secs(reserves.critical),
            daemonset_seconds: secs(reserves.daemonset),
            static_seconds: secs(reserves.static_pods),
            critical_priority: reserves.critical_priority,
            needed_seconds: secs(needed),
            below_reserves: budget_duration.saturating_sub(lost) < needed,
        },
        budget,
        steps: step_reports,
        order,
        escalated,
        ignored,
        unreadable_manifests: Vec::new(),
        offline: offline_report(settings, &infos),
    })
}

/// The reserves of the classes that have pods (what the budget must cover before regular pods
/// get any time).
fn pod_plan(pod: &PodInfo, order: usize, sched: &StepSchedule, share: Duration) -> PodPlan {
    let grace = pod.grace_period();
    let reason = if share.is_zero() {
        Some(format!(
            "no share of the budget for this step (budget below the reserves): deleted at {} with grace 0s",
            human(sched.escalate_at)
        ))
    } else if grace > share {
        Some(format!(
            "grace {} does not fit the step's share {}: deleted at {} with grace {}",
            human(grace),
            human(share),
            human(sched.escalate_at),
            human(escalation_grace(grace, sched.escalate_at, sched.end))
        ))
    } else {
        None
    };
    PodPlan {
        order,
        pod: pod.key(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        priority: pod.priority,
        pod_type: pod.pod_type,
        grace_seconds: pod.termination_grace_period_seconds,
        terminating: pod.terminating,
        escalated: reason.is_some(),
        escalation_grace_seconds: reason
            .as_ref()
            .map(|_| secs(escalation_grace(grace, sched.escalate_at, sched.end))),
        escalation_reason: reason,
    }
}

fn offline_report(settings: &Settings, pods: &[PodInfo]) -> OfflineReport {
    let fallback = &settings.fallback;
    let (bands, note) = match GnsBands::new(&fallback.shutdown_grace_period_by_pod_priority) {
        Ok(b) => (b, None),
        Err(e) => (
            GnsBands::immediate(),
            Some(format!("{e}: every pod would be stopped at once")),
        ),
    };
    let groups = bands.group(pods.iter().map(|p| GnsCandidate::known(p, p)));
    let max = GnsBands::max_duration(&groups);
    let note = note.or_else(|| {
        (!fallback.enabled).then(|| {
            "fallback.enabled is false: without the apiserver nothing is drained".to_string()
        })
    });
    OfflineReport {
        bands_from: fallback.bands_from.to_string(),
        kubelet_set_aside: fallback.kubelet_set_aside.clone(),
        enabled: fallback.enabled,
        max_duration_seconds: secs(max),
        bands: groups
            .into_iter()
            .map(|g| OfflineBand {
                priority: g.priority,
                shutdown_grace_period_seconds: secs(g.shutdown_grace_period),
                pods: g
                    .members
                    .into_iter()
                    .map(|m| OfflinePod {
                        pod: m.item.key(),
                        priority: m.item.priority,
                        grace_seconds: secs(m.grace),
                    })
                    .collect(),
            })
            .collect(),
        note,
    }
}

fn type_name(t: PodType) -> &'static str {
    match t {
        PodType::Default => "Default",
        PodType::DaemonSet => "DaemonSet",
        PodType::Static => "Static",
    }
}

/// The human form: one header per step with pods, one aligned line per pod.
pub(crate) fn render_table(r: &PlanReport) -> String {
    let mut out = String::new();
    render_summary(&mut out, r);
    out.push('\n');
    render_steps(&mut out, r);
    render_left_out(&mut out, r);
    render_offline(&mut out, r);
    out
}

/// Seconds as the table prints them.
fn human_secs(s: f64) -> String {
    human(Duration::from_millis((s * 1000.0).round() as u64))
}

/// The node, where the pods came from, the budget and the reserves.
fn render_summary(out: &mut String, r: &PlanReport) {
    let node = crate::text::escape(r.node.as_deref().unwrap_or("(unknown node)"));
    let source = match r.source.strip_prefix("file:") {
        Some(path) => format!("pods from {}", crate::text::escape(path)),
        None if r.source == "stdin" => "pods from standard input".to_string(),
        None => "pods from the apiserver".to_string(),
    };
    out.push_str(&format!(
        "Shutdown plan for {node} if it shut down now ({source}): {} pod(s) to drain, {} ignored, {} escalated\n",
        r.order.len(),
        r.ignored.len(),
        r.escalated.len()
    ));
    let budget = Duration::from_millis((r.budget.seconds * 1000.0).round() as u64);
    out.push_str(&format!(
        "Budget: {} ({})\n",
        human(budget),
        r.budget.detail
    ));
    if r.budget.lost_seconds > 0.0 {
        let lost = Duration::from_millis((r.budget.lost_seconds * 1000.0).round() as u64);
        out.push_str(&format!(
            "Lost before the drain could go on: {} (--lost); the {} left is split over the pods, as after an apiserver outage\n",
            human(lost),
            human(budget.saturating_sub(lost))
        ));
    }
    let res = &r.reserves;
    out.push_str(&format!(
        "Reserves: critical (priority >= {}) {}, DaemonSet {}, static {}; needed for these pods {}{}\n",
        res.critical_priority,
        human_secs(res.critical_seconds),
        human_secs(res.daemonset_seconds),
        human_secs(res.static_seconds),
        human_secs(res.needed_seconds),
        if res.below_reserves {
            " - BUDGET BELOW THE RESERVES: reserves scaled down, regular pods are deleted at once"
        } else {
            ""
        }
    ));
}

/// The online drain: one header per step with pods, one aligned line per pod.
fn render_steps(out: &mut String, r: &PlanReport) {
    let mut rows = vec![vec![
        "#".to_string(),
        "POD".into(),
        "TYPE".into(),
        "PRIORITY".into(),
        "GRACE".into(),
        "ESCALATION".into(),
    ]];
    // Row index where each step's header goes, to keep columns aligned across steps.
    let mut headers = Vec::new();
    for step in r.steps.iter().filter(|s| !s.pods.is_empty()) {
        headers.push((
            rows.len(),
            format!(
                "\nStep {} [{}] {}: {} -> {}, escalate at {}\n  {}",
                step.index + 1,
                step.class,
                step.description,
                human_secs(step.start_seconds),
                human_secs(step.end_seconds),
                human_secs(step.escalate_at_seconds),
                step.explanation
                    .strip_prefix(&format!("{}: ", step.description))
                    .unwrap_or(&step.explanation)
            ),
        ));
        for p in &step.pods {
            let mut grace = human(Duration::from_secs(p.grace_seconds.max(0) as u64));
            if p.terminating {
                grace.push_str(" (terminating)");
            }
            rows.push(vec![
                p.order.to_string(),
                p.pod.clone(),
                type_name(p.pod_type).into(),
                p.priority.to_string(),
                grace,
                p.escalation_reason
                    .as_ref()
                    .map_or("-".to_string(), |why| format!("ESCALATED: {why}")),
            ]);
        }
    }
    let lines = align(&rows);
    let mut next_header = headers.iter().peekable();
    for (i, line) in lines.iter().enumerate() {
        if let Some((_, text)) = next_header.next_if(|(at, _)| *at == i) {
            out.push_str(text);
            out.push('\n');
        }
        if i == 0 && r.order.is_empty() {
            out.push_str("\nNo pods to drain.\n");
            continue;
        }
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    let empty = r.steps.iter().filter(|s| s.pods.is_empty()).count();
    out.push_str(&format!(
        "\n{empty} of {} plan steps have no pods and reserve nothing.\n",
        r.steps.len()
    ));
}

/// The pods the plan leaves out or puts last.
fn render_left_out(out: &mut String, r: &PlanReport) {
    if !r.ignored.is_empty() {
        out.push_str("\nIgnored:\n");
        let rows: Vec<Vec<String>> = r
            .ignored
            .iter()
            .map(|i| vec![i.pod.clone(), i.reason.clone()])
            .collect();
        for line in align(&rows) {
            out.push_str(&format!("  {line}\n"));
        }
    }

    if !r.unreadable_manifests.is_empty() {
        out.push_str(
            "\nLast, after every pod: files in the static pod directory the kubelet refuses (no priority to read), gated and restored at Complete byte for byte:\n",
        );
        let rows: Vec<Vec<String>> = r
            .unreadable_manifests
            .iter()
            .map(|i| vec![i.pod.clone(), i.reason.clone()])
            .collect();
        for line in align(&rows) {
            out.push_str(&format!("  {line}\n"));
        }
    }
}

/// The offline fallback's bands and their pods.
fn render_offline(out: &mut String, r: &PlanReport) {
    let off = &r.offline;
    out.push_str(&format!(
        "\nOffline fallback (apiserver unreachable: the kubelet's priority bands through the CRI runtime, at most {}){}:\n",
        human_secs(off.max_duration_seconds),
        if off.enabled { "" } else { " - DISABLED" }
    ));
    if let Some(note) = &off.note {
        out.push_str(&format!("  {note}\n"));
    }
    out.push_str(&format!("  bands from {}\n", off.bands_from));
    if let Some(why) = &off.kubelet_set_aside {
        out.push_str(&format!(
            "  the kubelet's configuration is set aside: {why}\n"
        ));
    }
    let mut rows = vec![vec![
        "BAND PRIORITY".to_string(),
        "BAND GRACE".into(),
        "POD".into(),
        "PRIORITY".into(),
        "GRACE".into(),
    ]];
    for band in &off.bands {
        if band.pods.is_empty() {
            rows.push(vec![
                band.priority.to_string(),
                human_secs(band.shutdown_grace_period_seconds),
                "(no pods, skipped)".into(),
            ]);
        }
        for p in &band.pods {
            rows.push(vec![
                band.priority.to_string(),
                human_secs(band.shutdown_grace_period_seconds),
                p.pod.clone(),
                p.priority.to_string(),
                human_secs(p.grace_seconds),
            ]);
        }
    }
    for line in align(&rows) {
        out.push_str(&format!("  {line}\n"));
    }
}
