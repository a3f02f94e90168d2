//! `nodegrace status`'s reboot wave: the wave this node takes part in, who holds its slots,
//! and this node's place: holding, or waiting and why (as `plan::wave` decides it).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use serde::Serialize;

use crate::api::RebootWave;
use crate::daemon::wave::{
    asked_by, domain_of, held_slots, needs_reboot, read_rules, slot_of, stuck_holder,
    waiting_by_domain, wave_of,
};
use crate::plan::wave::{self, Turn};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WaveSection {
    /// False when the waves could not be read.
    pub known: bool,
    pub error: Option<String>,
    /// The sentinel, `nodegrace reboot` or the wave's `rebootRequestedAt` asks for a reboot.
    pub needs_reboot: bool,
    pub wave: Option<String>,
    /// Slots the wave has now, and nodes taking part.
    pub slots: Option<usize>,
    pub members: usize,
    /// `node (phase)`, one per slot held.
    pub held: Vec<String>,
    /// This node's place: `holds a slot (Returning)`, `waits: zone "z1" full ...`,
    /// `takes its turn at the next look`, `needs no reboot`.
    pub this_node: String,
}

pub(crate) async fn section(
    settings: &crate::config::RebootSettings,
    node: &str,
    node_obj: Option<&Node>,
    waves: Result<Vec<RebootWave>, String>,
) -> WaveSection {
    let needs = needs_reboot(settings, node).await;
    let mut out = WaveSection {
        known: false,
        error: None,
        needs_reboot: needs,
        wave: None,
        slots: None,
        members: 0,
        held: Vec::new(),
        this_node: String::new(),
    };
    let (waves, node_obj) = match (waves, node_obj) {
        (Ok(w), Some(n)) => (w, n),
        (Err(e), _) => {
            out.error = Some(e);
            return out;
        }
        (_, None) => {
            out.error = Some("the Node could not be read".into());
            return out;
        }
    };
    out.known = true;
    let waves: Vec<Arc<RebootWave>> = waves.into_iter().map(Arc::new).collect();
    let (chosen, problems) = wave_of(&waves, node, node_obj.labels(), settings.without_wave);
    let w = match chosen {
        Ok(Some(w)) => w,
        Ok(None) => {
            out.this_node = match problems.first() {
                Some(why) => why.to_string(),
                None if settings.without_wave => format!("no RebootWave selects this node: it reboots one node of the cluster at a time (reboot.without_wave) in RebootWave {}, made when it needs a reboot", crate::api::ONE_AT_A_TIME),
                None => "no RebootWave selects this node: it never reboots by itself".into(),
            };
            return out;
        }
        Err(why) => {
            out.this_node = why.to_string();
            return out;
        }
    };
    out.wave = Some(w.name_any());
    let needs = needs || asked_by(&w, crate::state::booted_at());
    out.needs_reboot = needs;
    let status = w.status.clone().unwrap_or_default();
    out.members = status.members.len();
    out.held = status
        .slots
        .iter()
        .map(|s| format!("{} ({:?})", s.node, s.phase))
        .collect();
    let (rules, opening) = match read_rules(&w) {
        Ok(read) => read,
        Err(problem) => {
            out.this_node = problem;
            return out;
        }
    };
    out.slots = Some(rules.limit.slots(out.members.max(1)));
    if let Some(mine) = slot_of(&w, node) {
        out.this_node = format!("holds a slot ({:?})", mine.phase);
        return out;
    }
    if !needs {
        out.this_node = "needs no reboot".into();
        return out;
    }
    let domain = domain_of(&w, node_obj.labels());
    let held = held_slots(&status);
    let stuck = stuck_holder(&status, node);
    let waiting = waiting_by_domain(&status);
    let first = wave::give_way(&rules, &domain, &held, &waiting, Duration::ZERO);
    out.this_node = match wave::turn(&rules, node, &domain, &held, out.members, opening, stuck) {
        Turn::Take => match first {
            Some(why) => format!(
                "needs a reboot, waits: {why} (for at most {:?})",
                wave::GIVE_WAY_AT_MOST
            ),
            None => "needs a reboot: takes its turn at the daemon's next look".into(),
        },
        Turn::Holding => "holds a slot".into(),
        Turn::Wait(why) => format!("needs a reboot, waits: {why}"),
    };
    out
}

/// The table's line.
pub(crate) fn line(w: &WaveSection) -> String {
    if !w.known {
        return format!("unknown: {}", w.error.clone().unwrap_or_default());
    }
    let Some(name) = &w.wave else {
        return w.this_node.clone();
    };
    let slots = w.slots.map_or_else(|| "?".to_owned(), |n| n.to_string());
    let held = if w.held.is_empty() {
        "none held".to_owned()
    } else {
        format!("held by {}", w.held.join(", "))
    };
    format!(
        "{name}: {slots} slots for {} nodes, {held}; this node {}",
        w.members, w.this_node
    )
}
