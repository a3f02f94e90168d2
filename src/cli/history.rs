//! `nodegrace history NODE`: a node's past shutdowns drawn from what the daemon wrote to the
//! apiserver (the Events on its `shutdown-<node>` NodeMaintenance, and the maintenance
//! itself), from any machine with a kubeconfig.

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::events::v1::Event;

use super::runtime;
use super::timeline::{draw, Record, Story};
use crate::api::{shutdown_maintenance_name, NodeMaintenance, Stage};
use crate::cluster::client::Timeouts;
use crate::cluster::listing::{get_opt, list_each, Caps};

pub(crate) const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(10),
    read: Some(Duration::from_secs(30)),
    answer: Some(Duration::from_secs(60)),
};

/// What one `history` reads at most: the Events about one maintenance are a few hundred per
/// shutdown, of at most 1 KiB each on a real apiserver.
const EVENTS_CAPS: Caps = Caps {
    pages: 1000,
    bytes: 16 << 20,
};
const EVENTS_PAGE: u32 = 100;
/// Shutdowns drawn at most, the latest ones.
const SHUTDOWNS_MAX: usize = 5;

/// The Events nodegrace wrote on `node`'s shutdown maintenances, one list per maintenance
/// (its UID: each shutdown creates its own), oldest shutdown first. The Recorder writes
/// the events of a cluster-scoped object in `default`.
async fn shutdown_events(client: &kube::Client, node: &str) -> Result<Vec<Vec<Record>>> {
    let name = shutdown_maintenance_name(node);
    let mut by_uid: HashMap<String, Vec<Record>> = HashMap::new();
    let params = kube::api::ListParams::default()
        .fields(&format!(
            "regarding.kind=NodeMaintenance,regarding.name={name}"
        ))
        .limit(EVENTS_PAGE);
    list_each(client, Some("default"), &params, EVENTS_CAPS, |e: Event| {
        let ours = e.reporting_controller.as_deref() == Some(crate::cluster::FIELD_MANAGER);
        let on = e.regarding.as_ref();
        let regards = on.is_some_and(|r| {
            r.kind.as_deref() == Some("NodeMaintenance") && r.name.as_deref() == Some(&name)
        });
        let at = e
            .event_time
            .as_ref()
            .map(|t| t.0)
            .or(e.deprecated_first_timestamp.as_ref().map(|t| t.0))
            .and_then(|t| chrono::DateTime::from_timestamp_millis(t.as_millisecond()));
        let (true, true, Some(at)) = (ours, regards, at) else {
            return;
        };
        let uid = on.and_then(|r| r.uid.clone()).unwrap_or_default();
        by_uid.entry(uid).or_default().push(Record {
            at,
            reason: e.reason.unwrap_or_default(),
            note: e.note.unwrap_or_default(),
        });
    })
    .await
    .with_context(|| {
        format!("listing the Events of NodeMaintenance {name} in namespace default")
    })?;
    let mut lists: Vec<Vec<Record>> = by_uid.into_values().collect();
    lists.sort_by_key(|l| l.iter().map(|r| r.at).min());
    Ok(lists)
}

/// The terminal's width and whether to paint: a terminal's own width, else `$COLUMNS`,
/// else 80; colour only on a terminal and without `NO_COLOR`.
pub(crate) fn terminal() -> (usize, bool) {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let columns = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse::<usize>().ok())
        .filter(|c| *c > 0);
    let width = tty_width().filter(|_| tty).or(columns).unwrap_or(80);
    let colour = tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    (width, colour)
}

fn tty_width() -> Option<usize> {
    let mut size = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ only writes a winsize into the struct passed, which outlives the call.
    let r = unsafe { nix::libc::ioctl(1, nix::libc::TIOCGWINSZ, &mut size) };
    (r == 0 && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// `nodegrace history NODE`.
pub fn history_command(node: &str, kubeconfig: Option<&Path>) -> Result<ExitCode> {
    if !crate::plan::names::is_dns_subdomain(node) {
        anyhow::bail!(
            "{:?} is not a node name (a DNS subdomain)",
            crate::text::escape(node)
        );
    }
    let (lists, maintenance) = runtime()?.block_on(async {
        let client = crate::cluster::client::build(kubeconfig, "the kubeconfig", TIMEOUTS).await?;
        let lists = shutdown_events(&client, node).await?;
        let name = shutdown_maintenance_name(node);
        let maintenance = get_opt::<NodeMaintenance>(&client, None, &name)
            .await
            .with_context(|| format!("reading NodeMaintenance {name}"))?;
        anyhow::Ok((lists, maintenance))
    })?;
    let (width, colour) = terminal();
    let now = chrono::Utc::now();
    let mut out = String::new();
    let first = lists.len().saturating_sub(SHUTDOWNS_MAX);
    let last = lists.len().saturating_sub(1);
    for (i, events) in lists.iter().enumerate().skip(first) {
        let Some(mut story) = Story::tell(node, &[], events, now) else {
            continue;
        };
        // The latest shutdown's maintenance still draining: it is under way.
        let under_way = i == last
            && !events.iter().any(|r| r.reason == "Drained")
            && maintenance
                .as_ref()
                .is_some_and(|m| m.stage() != Stage::Complete);
        if under_way {
            story.end = now;
            story.outcome = "under way (its maintenance is not complete)".into();
        }
        if !out.is_empty() {
            out.push('\n');
        }
        for line in draw(&story, width, colour) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    if out.is_empty() {
        out = format!(
            "no shutdown of node {} told by the Events kept (nodegrace writes them on NodeMaintenance {}; the apiserver keeps Events an hour by default)\n",
            crate::text::escape(node),
            shutdown_maintenance_name(node)
        );
    }
    crate::text::print_stdout_painted(&out, colour)?;
    Ok(ExitCode::SUCCESS)
}
