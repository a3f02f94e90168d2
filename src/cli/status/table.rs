//! `nodegrace status`'s human form: one aligned `key  value` line per fact.

use std::time::Duration;

use serde::Serialize;

use super::{CredentialReport, StatusReport};
use crate::cli::timeline::{draw, Story};
use crate::cli::{align, human};

/// The table's rows, in order.
#[derive(Default)]
struct Rows(Vec<Vec<String>>);

impl Rows {
    fn row(&mut self, key: &str, value: String) {
        self.0.push(vec![key.to_string(), value]);
    }
}

/// The name a unit enum has in the JSON output (`reboot`, `released`).
fn serde_name<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn dur(s: f64) -> String {
    human(Duration::from_millis((s * 1000.0).round() as u64))
}

fn credential_line(c: &CredentialReport, now: chrono::DateTime<chrono::Utc>) -> String {
    let path = c
        .path
        .as_ref()
        .map_or_else(String::new, |p| format!("; {}", p.display()));
    let expiry = |at: chrono::DateTime<chrono::Utc>| {
        let left = (at - now)
            .to_std()
            .map(human)
            .unwrap_or_else(|_| "0s".into());
        format!("{} (in {left})", at.to_rfc3339())
    };
    match (c.state.as_str(), &c.identity, c.expires_at) {
        ("ok", Some(id), Some(at)) => format!("{id}, certificate expires {}{path}", expiry(at)),
        ("renewal-due", Some(id), Some(at)) => format!(
            "{id}, certificate expires {}: renewal due (the daemon requests it; approve the request){path}",
            expiry(at)
        ),
        ("expired", Some(id), Some(at)) => format!(
            "EXPIRED: {id}, certificate expired {}; {}{path}",
            at.to_rfc3339(),
            if c.key == "node.kubeconfig" {
                "run `nodegrace credentials request`"
            } else {
                "check the kubelet"
            }
        ),
        ("missing", ..) => format!("MISSING{path}: {}", c.detail.clone().unwrap_or_default()),
        ("unreadable", ..) => format!("UNREADABLE{path}: {}", c.detail.clone().unwrap_or_default()),
        _ => format!("{}{path}", c.detail.clone().unwrap_or_default()),
    }
}

/// The human form: one aligned `key  value` line per fact, sections in a fixed order.
pub(crate) fn render_table(r: &StatusReport) -> String {
    let mut rows = Rows::default();

    rows.row(
        "Node",
        r.node
            .clone()
            .unwrap_or_else(|| format!("unknown: {}", r.node_error.clone().unwrap_or_default())),
    );
    daemon_rows(&mut rows, r);
    budget_rows(&mut rows, r);
    access_rows(&mut rows, r);
    maintenance_rows(&mut rows, r);
    rows.row("Reboot wave", super::wave::line(&r.reboot_wave));
    local_rows(&mut rows, r);
    kubelet_rows(&mut rows, r);
    shutdown_rows(&mut rows, r);

    let l = &r.last_shutdown;
    let mut out = String::new();
    for line in align(&rows.0) {
        out.push_str(&line);
        out.push('\n');
    }
    if !l.timeline.is_empty() {
        out.push_str("\nTimeline (this daemon run):\n");
        let rows: Vec<Vec<String>> = l
            .timeline
            .iter()
            .map(|t| {
                vec![
                    t.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    serde_name(&t.phase),
                    t.reason.clone(),
                ]
            })
            .collect();
        for line in align(&rows) {
            out.push_str(&format!("  {line}\n"));
        }
    }
    let node = r.node.as_deref().unwrap_or("this node");
    if let Some(story) = Story::tell(node, &l.timeline, &[], chrono::Utc::now()) {
        let (width, colour) = crate::cli::history::terminal();
        out.push_str("\nLast shutdown:\n");
        for line in draw(&story, width, colour) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// The daemon, its inhibitor and its last error.
fn daemon_rows(rows: &mut Rows, r: &StatusReport) {
    let d = &r.daemon;
    let daemon = match d.state.as_str() {
        "running" => format!(
            "running (pid {}): {}",
            d.pid.unwrap_or_default(),
            d.phase_description.clone().unwrap_or_default()
        ),
        _ => format!("{}: {}", d.state, d.error.clone().unwrap_or_default()),
    };
    rows.row("Daemon", daemon);
    if d.state == "stale" {
        rows.row(
            "  last phase",
            d.phase_description.clone().unwrap_or_default(),
        );
    }
    rows.row(
        "Inhibitor",
        match d.inhibitor_held {
            Some(true) => "held (shutdowns wait for the drain)".into(),
            Some(false) => "NOT held: a shutdown now would not wait for the drain".into(),
            None => "unknown (daemon not running: nothing delays a shutdown)".into(),
        },
    );
    if let Some(k) = &d.kubelet_inhibitor {
        rows.row(
            "  kubelet",
            format!("also holds a shutdown delay inhibitor: {k}"),
        );
    }
    if let Some(e) = &d.last_error {
        rows.row("  last error", e.clone());
    }
}

/// The shutdown budget and who set logind's delay.
fn budget_rows(rows: &mut Rows, r: &StatusReport) {
    let b = &r.budget;
    match b.budget_seconds {
        Some(budget) => rows.row(
            "Budget",
            format!(
                "{} (shutdown.max_delay {}, logind's effective delay {})",
                dur(budget),
                dur(b.configured_seconds),
                b.logind_effective_seconds.map(dur).unwrap_or_default()
            ),
        ),
        None => rows.row(
            "Budget",
            format!(
                "at most {} (shutdown.max_delay); {}",
                dur(b.configured_seconds),
                b.error.clone().unwrap_or_default()
            ),
        ),
    }
    if let Some(set_by) = &b.set_by {
        rows.row("logind delay", format!("set by {set_by}"));
    }
    if b.budget_seconds.is_some() {
        if let Some(e) = &b.error {
            rows.row("  budget error", e.clone());
        }
    }
}

/// The apiserver and the credentials to reach it.
fn access_rows(rows: &mut Rows, r: &StatusReport) {
    let a = &r.apiserver;
    rows.row(
        "apiserver",
        if a.reachable {
            format!("reachable ({})", a.version.clone().unwrap_or_default())
        } else {
            format!("UNREACHABLE: {}", a.error.clone().unwrap_or_default())
        },
    );

    let now = chrono::Utc::now();
    for c in &r.credentials {
        let label = if c.key == "node.kubeconfig" {
            "Credential"
        } else {
            "Kubelet cred."
        };
        rows.row(label, credential_line(c, now));
    }
}

/// The maintenances active for this node, band by band.
fn maintenance_rows(rows: &mut Rows, r: &StatusReport) {
    let m = &r.maintenances;
    if !m.known {
        rows.row(
            "Maintenances",
            format!("unknown: {}", m.error.clone().unwrap_or_default()),
        );
    } else if m.active.is_empty() {
        rows.row("Maintenances", "none active for this node".into());
    }
    for nm in &m.active {
        rows.row(
            "Maintenance",
            format!(
                "{}: stage {}{}{}",
                nm.name,
                nm.stage,
                nm.drained
                    .as_ref()
                    .map(|s| format!(", Drained={s}"))
                    .unwrap_or_default(),
                nm.reason
                    .as_ref()
                    .map(|s| format!(", reason: {s}"))
                    .unwrap_or_default()
            ),
        );
        rows.row(
            "  targets",
            if nm.drain_targets.is_empty() {
                "none yet".into()
            } else {
                nm.drain_targets.join("; ")
            },
        );
        if let Some(msg) = &nm.drain_message {
            rows.row("  message", msg.clone());
        }
        if let Some(left) = nm.pods_remaining {
            rows.row(
                "  remaining",
                format!(
                    "{left} targeted pod(s), {} awaiting an eviction request, {} being evicted",
                    nm.pods_pending_eviction_request.unwrap_or_default(),
                    nm.active_eviction_requests.unwrap_or_default()
                ),
            );
        }
        for band in &nm.bands {
            rows.row(
                "  band",
                format!(
                    "{}: {} pod(s){}: {}",
                    band.description,
                    band.remaining,
                    if band.targeted { " (draining)" } else { "" },
                    band.pods.join(" ")
                ),
            );
        }
        if let Some(e) = &nm.bands_error {
            rows.row("  bands", format!("unknown: {e}"));
        }
    }
}

/// The kubelet's configuration: whether its own GNS is on, where the fallback's bands come
/// from, and why the configuration is set aside.
fn kubelet_rows(rows: &mut Rows, r: &StatusReport) {
    let k = &r.kubelet_config;
    rows.row(
        "Kubelet GNS",
        match (&k.set_aside, k.gns_on) {
            (Some(why), _) => format!("SET ASIDE: {why}"),
            (None, true) => "its Graceful Node Shutdown is on: nodegrace leaves GracefulNodeShutdownInProgress to it".into(),
            (None, false) => "its Graceful Node Shutdown is off".into(),
        },
    );
    rows.row("  bands from", k.bands_from.clone());
}

/// What is kept on the node: gated static pods and the pod cache.
fn local_rows(rows: &mut Rows, r: &StatusReport) {
    let s = &r.static_pods;
    rows.row(
        "Static pods",
        match &s.error {
            Some(e) => format!("gate unreadable: {e}"),
            None if s.gated.is_empty() => {
                format!("none gated ({})", s.gate_dir.display())
            }
            None => format!(
                "{} gated in {}: {}",
                s.gated.len(),
                s.gate_dir.display(),
                s.gated
                    .iter()
                    .map(|g| format!("{}/{} ({})", g.namespace, g.pod_name, g.file_name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    );
    for o in &s.gated_unreadable {
        rows.row(
            "  gated, unreadable",
            format!(
                "{}: the kubelet refuses it ({}); gated last, restored byte for byte at Complete",
                o.file_name, o.reason
            ),
        );
    }
    for o in &s.unreadable {
        rows.row(
            "  unreadable",
            format!(
                "{} in {}: the kubelet refuses it ({}); no priority: a shutdown gates it last, after every pod",
                o.file_name,
                s.manifest_dir.display(),
                o.reason
            ),
        );
    }
    for o in &s.other_files {
        rows.row(
            "  not a manifest",
            format!("{}: {} (left in the gate directory)", o.file_name, o.reason),
        );
    }
    if let Some(p) = &s.set_aside_journal {
        rows.row(
            "  set aside",
            format!(
                "journal records recovery could not settle, in {} (check them, then delete the file)",
                p.display()
            ),
        );
    }

    let c = &r.pod_cache;
    rows.row(
        "Pod cache",
        match (&c.error, c.pods) {
            (Some(e), _) => format!("unreadable: {e}"),
            (None, Some(n)) => format!(
                "{n} pod(s) for the offline fallback{}",
                c.written_at
                    .map(|t| format!(", written {}", t.to_rfc3339()))
                    .unwrap_or_else(|| " (never written)".into())
            ),
            (None, None) => "unknown".into(),
        },
    );
}

/// The shutdown under way and the last one recorded.
fn shutdown_rows(rows: &mut Rows, r: &StatusReport) {
    let l = &r.last_shutdown;
    if let Some(cur) = &l.current {
        rows.row(
            "Shutdown",
            format!(
                "{} since {}, deadline {}{}{}",
                serde_name(&cur.kind),
                cur.started_at.to_rfc3339(),
                cur.deadline.to_rfc3339(),
                if cur.resumed { " (resumed)" } else { "" },
                cur.way
                    .map(|w| format!(", draining {}", w.describe()))
                    .unwrap_or_default()
            ),
        );
    }
    rows.row(
        "Last shutdown",
        match (&l.persisted, &l.persisted_error) {
            (_, Some(e)) => format!("unreadable: {e}"),
            (Some(p), None) => format!(
                "{} started {}, {} (budget {}, last update {})",
                serde_name(&p.kind),
                p.started_at.to_rfc3339(),
                serde_name(&p.phase),
                dur(p.budget_seconds),
                p.updated_at.to_rfc3339()
            ),
            (None, None) => "none recorded".into(),
        },
    );
    match (&l.offline_drain, &l.offline_drain_error) {
        (_, Some(e)) => rows.row("Offline drain", format!("record unreadable: {e}")),
        (Some(d), None) => rows.row(
            "Offline drain",
            format!(
                "{} of boot {}{}: {} pod(s) stopped, {} not; recorded on shutdown-<node> once the apiserver answers",
                serde_name(&d.kind),
                d.boot_id,
                d.started_at
                    .map(|t| format!(" at {}", t.to_rfc3339()))
                    .unwrap_or_default(),
                d.pods_stopped,
                d.pods_not_stopped
            ),
        ),
        (None, None) => {}
    }
}
