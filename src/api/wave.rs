//! `RebootWave`: a fleet's reboots in turns (issue 43), cluster-scoped in
//! `nodegrace.dev/v1alpha1`. An operator writes the spec; the nodes take and free their
//! slots in the status, one write at a time ordered by the apiserver, and the admission
//! policy (packaging/admission) refuses a write that breaks the limits or touches another
//! node's slot.
//!
//! A kind of its own rather than a NodeMaintenance that carries a reboot: a maintenance is
//! one drain of the nodes it selects, all at once, and ends; a wave stays, selects nodes by
//! label, and holds the limits every night a node needs a reboot. Each node's reboot is
//! still drained through its own `shutdown-<node>` maintenance, as any shutdown is.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which nodes reboot in turns, how many at once, when, and how long each must stay
/// healthy before the next may go.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nodegrace.dev",
    version = "v1alpha1",
    kind = "RebootWave",
    plural = "rebootwaves",
    singular = "rebootwave",
    shortname = "rw",
    category = "nodegrace",
    status = "RebootWaveStatus",
    derive = "PartialEq",
    doc = "A fleet's reboots in turns: at most maxUnavailable nodes at a time, at most perDomain.maxUnavailable in one topology domain, inside the windows.",
    printcolumn(
        name = "MaxUnavailable",
        type_ = "string",
        json_path = ".spec.maxUnavailable"
    ),
    printcolumn(name = "Held", type_ = "string", json_path = ".status.slots[*].node"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RebootWaveSpec {
    /// The nodes of this wave (by label); none: no node by label. A node selected by two
    /// waves takes part in neither: it says so, and reboots only when an operator resolves it.
    /// The wave `one-at-a-time` also takes every node whose configuration turns reboots on
    /// (`reboot.without_wave`) and that no other wave selects; the first such node makes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,

    /// How many of the wave's nodes may be down at once: a count, or a percentage of the
    /// nodes taking part (`status.members`), rounded down but never below 1.
    #[serde(default = "one")]
    pub max_unavailable: IntOrString,

    /// A limit per topology domain, e.g. one node a zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_domain: Option<PerDomain>,

    /// When a reboot may start; none: at any time. A node already rebooting finishes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub windows: Vec<RebootWindow>,

    /// How long a node stays healthy after its reboot (Ready, uncordoned, its DaemonSet and
    /// static pods Ready) before its slot is free.
    #[serde(default = "healthy_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub healthy_seconds: u32,

    /// How long a node may hold its slot before the wave counts as stuck and stops; a slot
    /// not renewed for longer is taken back.
    #[serde(default = "reboot_budget_seconds")]
    #[schemars(range(min = 60, max = 86400))]
    pub reboot_budget_seconds: u32,

    /// An operator's request for the whole wave: every node it selects whose current boot
    /// began before this time needs a reboot, as if its sentinel said so. Set to now, the
    /// fleet reboots in turns; a node rebooted since is not asked again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot_requested_at: Option<Time>,
}

/// The wave of the nodes whose configuration turns reboots on without a wave selecting them.
pub(crate) const ONE_AT_A_TIME: &str = "one-at-a-time";

impl RebootWave {
    /// [`ONE_AT_A_TIME`] as a node makes it (the admission policy admits it from a node only
    /// so): one node of the cluster at a time, no window, the default times.
    pub(crate) fn one_at_a_time() -> RebootWave {
        RebootWave::new(
            ONE_AT_A_TIME,
            RebootWaveSpec {
                node_selector: None,
                max_unavailable: one(),
                per_domain: None,
                windows: Vec::new(),
                healthy_seconds: healthy_seconds(),
                reboot_budget_seconds: reboot_budget_seconds(),
                reboot_requested_at: None,
            },
        )
    }
}

fn one() -> IntOrString {
    IntOrString::Int(1)
}

fn healthy_seconds() -> u32 {
    300
}

fn reboot_budget_seconds() -> u32 {
    1800
}

/// At most `maxUnavailable` nodes down at once among those with the same value of label
/// `topologyKey` (nodes without the label count as one domain, "").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PerDomain {
    #[schemars(length(min = 1, max = 316))]
    pub topology_key: String,
    #[schemars(range(min = 1))]
    pub max_unavailable: u32,
}

/// A time of the week when reboots may start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootWindow {
    /// The days the window starts on; none: every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub days: Vec<Day>,
    /// `HH:MM`, 24-hour, in `timeZone`.
    pub start: String,
    /// `HH:MM`; at or before `start`, the window ends the next day.
    pub end: String,
    /// An IANA time zone such as `Europe/Berlin`, as in the nodes' tzdata.
    #[serde(default = "utc")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,
}

fn utc() -> String {
    "UTC".to_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Day {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Day {
    pub(crate) fn weekday(self) -> jiff::civil::Weekday {
        use jiff::civil::Weekday as W;
        match self {
            Day::Monday => W::Monday,
            Day::Tuesday => W::Tuesday,
            Day::Wednesday => W::Wednesday,
            Day::Thursday => W::Thursday,
            Day::Friday => W::Friday,
            Day::Saturday => W::Saturday,
            Day::Sunday => W::Sunday,
        }
    }
}

/// Who takes part and who holds a slot. Each node writes only its own entries (the
/// admission policy); a take or a free is one update with the resourceVersion it read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootWaveStatus {
    /// The nodes taking part: selected by this wave and with reboots turned on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5000))]
    pub members: Vec<WaveMember>,
    /// The nodes down or on their way back, each holding one slot; at most 100 at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub slots: Vec<WaveSlot>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveMember {
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    /// The node's value of `spec.perDomain.topologyKey` ("" without one).
    #[serde(default)]
    #[schemars(length(max = 63))]
    pub domain: String,
    /// The node needs a reboot and holds no slot yet: a free slot goes first to a domain
    /// where more nodes wait, so the wave ends in as few turns as its limits allow.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waiting: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveSlot {
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    #[serde(default)]
    #[schemars(length(max = 63))]
    pub domain: String,
    pub phase: SlotPhase,
    /// The holder's boot id when it took the slot: another one after the reboot.
    #[schemars(length(max = 64))]
    pub boot_id: String,
    /// When the slot was taken, by the holder's clock.
    pub taken: Time,
    /// Written by the holder while its daemon runs; others judge silence by their own clock.
    pub renew_time: Time,
    /// Healthy again since (by the holder's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<Time>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SlotPhase {
    /// Draining, then rebooting.
    Down,
    /// Booted, not healthy yet, or healthy for less than `healthySeconds`.
    Returning,
    /// Held past `rebootBudgetSeconds` without becoming healthy: the wave stops here.
    Stuck,
}
