//! `nodegrace history --wave NAME`: a RebootWave's turns as its nodes' Events tell them
//! (slots taken, freed, taken back, a stuck node, and why nodes waited), under the wave's
//! slots and members now.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use jiff::Timestamp;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt as _;

use super::runtime;
use crate::api::RebootWave;
use crate::cluster::listing::{get_opt, list_each, Caps};
use crate::daemon::wave::{FREED, REASONS, TAKEN, WAITING};
use crate::text::escape;

/// The Events on Nodes are a few per node and turn; a fleet of thousands fits.
const EVENTS_CAPS: Caps = Caps {
    pages: 1000,
    bytes: 32 << 20,
};
const EVENTS_PAGE: u32 = 500;

/// One Event of the wave: when, on which node, why and what it says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Told {
    pub at: Timestamp,
    pub node: String,
    pub reason: String,
    pub note: String,
}

/// `nodegrace history --wave NAME`.
pub fn wave_history_command(name: &str, kubeconfig: Option<&Path>) -> Result<ExitCode> {
    if !crate::plan::names::is_dns_subdomain(name) {
        anyhow::bail!(
            "{:?} is not a RebootWave name (a DNS subdomain)",
            crate::text::escape(name)
        );
    }
    let (wave, told) = runtime()?.block_on(async {
        let client =
            crate::cluster::client::build(kubeconfig, "the kubeconfig", super::history::TIMEOUTS)
                .await?;
        let wave = get_opt::<RebootWave>(&client, None, name)
            .await
            .with_context(|| format!("reading RebootWave {name}"))?;
        let told = node_events(&client).await?;
        anyhow::Ok((wave, told))
    })?;
    let Some(wave) = wave else {
        anyhow::bail!("no RebootWave {name}");
    };
    crate::text::print_stdout(&tell(&wave, &told))?;
    Ok(ExitCode::SUCCESS)
}

/// The Events nodegrace wrote on Nodes about reboots, oldest first (the Recorder writes the
/// events of cluster-scoped objects in `default`).
async fn node_events(client: &kube::Client) -> Result<Vec<Told>> {
    let params = kube::api::ListParams::default()
        .fields("regarding.kind=Node")
        .limit(EVENTS_PAGE);
    let mut told = Vec::new();
    list_each(client, Some("default"), &params, EVENTS_CAPS, |e: Event| {
        let ours = e.reporting_controller.as_deref() == Some(crate::cluster::FIELD_MANAGER);
        let reason = e.reason.unwrap_or_default();
        let node = e.regarding.and_then(|r| r.name).unwrap_or_default();
        let at = e
            .series
            .map(|s| s.last_observed_time.0)
            .or(e.event_time.map(|t| t.0))
            .or(e.deprecated_last_timestamp.map(|t| t.0));
        if let (true, true, Some(at)) = (ours, REASONS.contains(&reason.as_str()), at) {
            told.push(Told {
                at,
                node,
                reason,
                note: e.note.unwrap_or_default(),
            });
        }
    })
    .await
    .context("listing the Events on Nodes in namespace default")?;
    told.sort_by_key(|t| t.at);
    Ok(told)
}

/// The wave now, then its Events: those naming it, and why its nodes (members, holders, or
/// nodes that took one of its slots) waited. Last, each node's turns from taken to freed.
pub(crate) fn tell(wave: &RebootWave, told: &[Told]) -> String {
    let name = wave.name_any();
    let named = format!("RebootWave {name}");
    let status = wave.status.clone().unwrap_or_default();
    let mut ours: Vec<&Told> = told.iter().filter(|t| t.note.contains(&named)).collect();
    let nodes: BTreeSet<&str> = status
        .members
        .iter()
        .map(|m| m.node.as_str())
        .chain(status.slots.iter().map(|s| s.node.as_str()))
        .chain(ours.iter().map(|t| t.node.as_str()))
        .collect();
    ours.extend(
        told.iter()
            .filter(|t| t.reason == WAITING && nodes.contains(t.node.as_str())),
    );
    ours.sort_by_key(|t| t.at);
    let held: Vec<String> = status
        .slots
        .iter()
        .map(|s| {
            format!(
                "{} ({:?} since {})",
                escape(&s.node),
                s.phase,
                clock(s.taken.0)
            )
        })
        .collect();
    let mut out = format!(
        "{}: {} members; slots held: {}\n",
        escape(&named),
        status.members.len(),
        if held.is_empty() {
            "none".to_owned()
        } else {
            held.join(", ")
        }
    );
    if ours.is_empty() {
        out.push_str("no Event of this wave kept (nodegrace writes them on the Nodes; the apiserver keeps Events an hour by default)\n");
        return out;
    }
    for t in &ours {
        // One line each, whatever a note holds.
        let (node, note) = (escape(&t.node), escape(&t.note));
        out.push_str(&format!("{}  {node}  {note}\n", clock(t.at)));
    }
    out.push_str("turns (slot taken to freed):\n");
    let mut taken: BTreeMap<&str, Timestamp> = BTreeMap::new();
    for t in &ours {
        match t.reason.as_str() {
            TAKEN => {
                taken.insert(&t.node, t.at);
            }
            FREED => {
                if let Some(from) = taken.remove(t.node.as_str()) {
                    out.push_str(&format!(
                        "  {}: {} to {} ({} s)\n",
                        escape(&t.node),
                        clock(from),
                        clock(t.at),
                        t.at.as_second() - from.as_second()
                    ));
                }
            }
            _ => {}
        }
    }
    for (node, from) in taken {
        out.push_str(&format!(
            "  {}: {} to (not freed)\n",
            escape(node),
            clock(from)
        ));
    }
    out
}

fn clock(t: Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn told(at: &str, node: &str, reason: &str, note: &str) -> Told {
        Told {
            at: at.parse().unwrap(),
            node: node.into(),
            reason: reason.into(),
            note: note.into(),
        }
    }

    #[test]
    fn a_wave_is_told_by_its_nodes_events_with_each_turn() {
        let wave: RebootWave = serde_json::from_value(json!({
            "apiVersion": "nodegrace.dev/v1alpha1", "kind": "RebootWave",
            "metadata": {"name": "nightly"},
            "spec": {"maxUnavailable": 1},
            "status": {"members": [{"node": "a"}, {"node": "b"}], "slots": [
                {"node": "b", "phase": "Down", "bootId": "x",
                 "taken": "2026-11-29T02:00:40Z", "renewTime": "2026-11-29T02:00:40Z"}]},
        }))
        .unwrap();
        let events = [
            told(
                "2026-11-29T02:00:00Z",
                "a",
                "RebootSlotTaken",
                "took a slot of RebootWave nightly: draining, then rebooting",
            ),
            told(
                "2026-11-29T02:00:01Z",
                "b",
                "RebootWaiting",
                "waiting for a reboot: wave full: 1 of 1 slots held",
            ),
            told(
                "2026-11-29T02:00:02Z",
                "c",
                "RebootWaiting",
                "waiting for a reboot: window closed",
            ),
            told(
                "2026-11-29T02:00:03Z",
                "d",
                "RebootSlotTaken",
                "took a slot of RebootWave other: draining, then rebooting",
            ),
            told(
                "2026-11-29T02:00:39Z",
                "a",
                "RebootSlotFreed",
                "healthy for RebootWave nightly's healthy time after the reboot: freed the slot",
            ),
            told(
                "2026-11-29T02:00:40Z",
                "b",
                "RebootSlotTaken",
                "took a slot of RebootWave nightly: draining, then rebooting",
            ),
        ];
        let text = tell(&wave, &events);
        assert_eq!(
            text,
            "RebootWave nightly: 2 members; slots held: b (Down since 2026-11-29 02:00:40)\n\
             2026-11-29 02:00:00  a  took a slot of RebootWave nightly: draining, then rebooting\n\
             2026-11-29 02:00:01  b  waiting for a reboot: wave full: 1 of 1 slots held\n\
             2026-11-29 02:00:39  a  healthy for RebootWave nightly's healthy time after the reboot: freed the slot\n\
             2026-11-29 02:00:40  b  took a slot of RebootWave nightly: draining, then rebooting\n\
             turns (slot taken to freed):\n\
             \x20 a: 2026-11-29 02:00:00 to 2026-11-29 02:00:39 (39 s)\n\
             \x20 b: 2026-11-29 02:00:40 to (not freed)\n"
        );
    }

    #[test]
    fn a_wave_without_events_says_so() {
        let wave = RebootWave::one_at_a_time();
        let text = tell(&wave, &[]);
        assert!(
            text.starts_with(
                "RebootWave one-at-a-time: 0 members; slots held: none\nno Event of this wave kept"
            ),
            "{text}"
        );
    }
}
