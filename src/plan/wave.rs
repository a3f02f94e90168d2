//! A fleet's reboots in turns (issue 43): whether a node may take a slot of its wave now,
//! when its slot is free again, when a wave is stuck and when a slot is taken back. The
//! limits are enforced by the apiserver (packaging/admission, `rebootwaves/status`); this
//! is what an honest node decides before it writes, so that it waits instead of being
//! refused, and what it tells the operator while it waits.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use jiff::civil::{Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan as _};

/// `spec.maxUnavailable`: a count, or a percentage of the wave's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    Count(u32),
    Percent(u32),
}

impl Limit {
    /// `2`, `"2"` or `"25%"`, as the CRD admits them (1 or more; 1 to 100 percent).
    pub(crate) fn parse(text: &str) -> Result<Limit, String> {
        let bad = || {
            format!("maxUnavailable {text:?} is neither a count of 1 or more nor a percentage from 1% to 100%")
        };
        match text.strip_suffix('%') {
            Some(pct) => match pct.parse::<u32>() {
                Ok(p) if (1..=100).contains(&p) => Ok(Limit::Percent(p)),
                _ => Err(bad()),
            },
            None => match text.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(Limit::Count(n)),
                _ => Err(bad()),
            },
        }
    }

    /// Slots the wave has with `members` nodes taking part: a percentage rounds down, as
    /// a Deployment's maxUnavailable does, but never below one slot, so a wave of few
    /// nodes still moves. The admission policy computes the same.
    pub(crate) fn slots(self, members: usize) -> usize {
        match self {
            Limit::Count(n) => n as usize,
            Limit::Percent(p) => (members.saturating_mul(p as usize) / 100).max(1),
        }
    }
}

/// One window of `spec.windows`: on `days` (every day when empty), from `start` to `end`
/// in `zone`; an `end` at or before `start` runs into the next day.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    pub(crate) days: Vec<Weekday>,
    pub(crate) start: Time,
    pub(crate) end: Time,
    pub(crate) zone: TimeZone,
}

/// Whether planned reboots may start at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    Open,
    /// Closed; the next window opens then (none within a week: no days at all).
    Closed {
        opens: Option<Timestamp>,
    },
}

/// Whether `windows` allow a reboot to start at `now`. No windows: always open.
pub(crate) fn opening(windows: &[Window], now: Timestamp) -> Opening {
    if windows.is_empty() || windows.iter().any(|w| w.contains(now)) {
        return Opening::Open;
    }
    let opens = windows.iter().filter_map(|w| w.next_start(now)).min();
    Opening::Closed { opens }
}

impl Window {
    fn on(&self, day: Weekday) -> bool {
        self.days.is_empty() || self.days.contains(&day)
    }

    fn contains(&self, now: Timestamp) -> bool {
        let here = now.to_zoned(self.zone.clone());
        let (day, time) = (here.weekday(), here.time());
        if self.start < self.end {
            return self.on(day) && self.start <= time && time < self.end;
        }
        // Over midnight: the evening of a listed day, or the morning after one.
        (self.on(day) && time >= self.start) || (self.on(day.previous()) && time < self.end)
    }

    fn next_start(&self, now: Timestamp) -> Option<Timestamp> {
        let today = now.to_zoned(self.zone.clone()).date();
        (0..=7)
            .filter_map(|ahead| today.checked_add(ahead.days()).ok())
            .filter(|date| self.on(date.weekday()))
            .filter_map(|date| {
                date.to_datetime(self.start)
                    .to_zoned(self.zone.clone())
                    .ok()
            })
            .map(|zoned| zoned.timestamp())
            .find(|start| *start > now)
    }
}

/// What a node that needs a reboot sees of its wave: the rules and who holds slots.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    pub(crate) limit: Limit,
    /// `spec.perDomain.maxUnavailable`, when the wave limits each topology domain.
    pub(crate) per_domain: Option<u32>,
    /// How long a node must stay healthy after its reboot before its slot is free.
    pub(crate) healthy_for: Duration,
    /// How long a node may hold a slot before the wave counts as stuck.
    pub(crate) reboot_budget: Duration,
}

/// A slot held in `status.slots`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) node: String,
    pub(crate) domain: String,
}

/// A node's turn, as [`turn`] decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Write a slot for this node now.
    Take,
    /// The node holds its slot already.
    Holding,
    Wait(Why),
}

/// Why a node waits for its turn: what `nodegrace status` and the node's Event say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Why {
    WindowClosed {
        opens: Option<Timestamp>,
    },
    WaveFull {
        held: usize,
        slots: usize,
    },
    DomainFull {
        domain: String,
        held: usize,
        slots: u32,
    },
    /// A domain with room has more nodes waiting: it goes first ([`give_way`]).
    GiveWay {
        domain: String,
        there: usize,
        here: usize,
    },
    /// The wave is stuck on a node that did not come back healthy in time: no one starts.
    Stuck {
        node: String,
    },
    /// More than one wave selects the node: it takes part in none.
    SelectedTwice {
        waves: Vec<String>,
    },
    /// The wave cannot be read as written (a time zone the node does not know).
    Invalid {
        problem: String,
    },
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::WindowClosed { opens: Some(at) } => write!(f, "window closed, opens at {at}"),
            Why::WindowClosed { opens: None } => {
                f.write_str("window closed, no day of the week is listed")
            }
            Why::WaveFull { held, slots } => write!(f, "wave full: {held} of {slots} slots held"),
            Why::DomainFull {
                domain,
                held,
                slots,
            } => {
                write!(f, "domain {domain:?} full: {held} of {slots} slots held")
            }
            Why::GiveWay {
                domain,
                there,
                here,
            } => write!(
                f,
                "domain {domain:?} goes first: {there} nodes wait there, {here} in this node's domain"
            ),
            Why::SelectedTwice { waves } => write!(
                f,
                "selected by more than one wave ({}): the node takes part in none until an operator changes their nodeSelectors",
                waves.join(", ")
            ),
            Why::Invalid { problem } => f.write_str(problem),
            Why::Stuck { node } => write!(
                f,
                "wave stuck on node {node}, which did not come back healthy in time"
            ),
        }
    }
}

/// The wave the node takes part in: the one that selects it; none of two or more. Selected by
/// none, a node whose configuration turns reboots on (`without_wave`) takes part in `alone`,
/// the wave of one node at a time.
pub(crate) fn choose<'a>(
    selecting: &'a [String],
    without_wave: bool,
    alone: &'a str,
) -> Result<Option<&'a str>, Why> {
    match selecting {
        [] if without_wave => Ok(Some(alone)),
        [] => Ok(None),
        [one] => Ok(Some(one)),
        more => Err(Why::SelectedTwice {
            waves: more.to_vec(),
        }),
    }
}

/// Whether node `me`, in topology domain `domain`, may take a slot now. `members` is the
/// number of nodes taking part in the wave, `stuck` a holder past its reboot budget.
pub(crate) fn turn(
    rules: &Rules,
    me: &str,
    domain: &str,
    held: &[Held],
    members: usize,
    opening: Opening,
    stuck: Option<&str>,
) -> Turn {
    if held.iter().any(|h| h.node == me) {
        return Turn::Holding;
    }
    if let Some(node) = stuck {
        return Turn::Wait(Why::Stuck {
            node: node.to_owned(),
        });
    }
    if let Opening::Closed { opens } = opening {
        return Turn::Wait(Why::WindowClosed { opens });
    }
    let slots = rules.limit.slots(members.max(1));
    if held.len() >= slots {
        return Turn::Wait(Why::WaveFull {
            held: held.len(),
            slots,
        });
    }
    if let Some(per) = rules.per_domain {
        let here = held.iter().filter(|h| h.domain == domain).count();
        if here >= per as usize {
            return Turn::Wait(Why::DomainFull {
                domain: domain.to_owned(),
                held: here,
                slots: per,
            });
        }
    }
    Turn::Take
}

/// How long a node gives way to another domain at most. The nodes there take a free slot
/// within a second while their daemons run; one that does not (its daemon down, its Node
/// gone with its members entry left) must not hold the wave up.
pub(crate) const GIVE_WAY_AT_MOST: Duration = Duration::from_secs(10);

/// Whether a node whose turn it is leaves the free slot to another domain first: one with
/// room where more nodes wait than in its own (`waiting` counts each domain's waiting
/// members, this node among them). The longest queue first ends the wave in as few turns as
/// the limits allow, ⌈N/k⌉ where the domains permit it; first come, first served can leave
/// one domain's nodes for last, each alone in its turn. After giving way for
/// [`GIVE_WAY_AT_MOST`] without a break the node takes its turn anyway.
pub(crate) fn give_way(
    rules: &Rules,
    domain: &str,
    held: &[Held],
    waiting: &BTreeMap<String, usize>,
    given_way_for: Duration,
) -> Option<Why> {
    let per = rules.per_domain? as usize;
    if given_way_for >= GIVE_WAY_AT_MOST {
        return None;
    }
    let here = waiting.get(domain).copied().unwrap_or(1);
    let (first, there) = waiting
        .iter()
        .filter(|(d, _)| d.as_str() != domain)
        .filter(|(d, _)| held.iter().filter(|h| &h.domain == *d).count() < per)
        // The most waiting; of equals, the first by name.
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
    (*there > here).then(|| Why::GiveWay {
        domain: first.clone(),
        there: *there,
        here,
    })
}

/// Where a slot's holder is on its way through the reboot (`status.slots[].phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Draining, then rebooting.
    Down,
    /// Booted; healthy for less than the healthy time, or not healthy yet.
    Returning,
    /// Held past the reboot budget without becoming healthy: the wave stops here.
    Stuck,
}

/// This node's own slot, as the wave's status holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mine {
    pub(crate) phase: Phase,
    /// The boot it was taken in: another boot id means the node rebooted.
    pub(crate) boot_id: String,
    pub(crate) taken: Timestamp,
    pub(crate) healthy_since: Option<Timestamp>,
}

/// A node's own `status.members` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member<'a> {
    pub(crate) domain: &'a str,
    /// It needs a reboot and holds no slot yet.
    pub(crate) waiting: bool,
}

/// What a node knows when it takes its next step in its wave.
#[derive(Debug, Clone)]
pub(crate) struct Seen<'a> {
    pub(crate) me: &'a str,
    pub(crate) boot_id: &'a str,
    /// The sentinel exists, or an operator asked (`nodegrace reboot`).
    pub(crate) needs_reboot: bool,
    pub(crate) rules: &'a Rules,
    /// The node's value of the wave's topology key ("" without one).
    pub(crate) domain: &'a str,
    pub(crate) member: Option<Member<'a>>,
    pub(crate) members: usize,
    /// The members waiting for a slot, by domain.
    pub(crate) waiting: &'a BTreeMap<String, usize>,
    /// How long the node has given way to another domain without a break ([`give_way`]).
    pub(crate) given_way_for: Duration,
    pub(crate) held: &'a [Held],
    pub(crate) mine: Option<&'a Mine>,
    pub(crate) opening: Opening,
    /// A holder whose slot says Stuck.
    pub(crate) stuck: Option<&'a str>,
    /// Another node's slot to take back ([`take_back`]).
    pub(crate) take_back: Option<&'a str>,
    /// Since when the node has been healthy without a break (Ready, uncordoned, its
    /// DaemonSet and static pods Ready); None: not healthy now.
    pub(crate) healthy: Option<Timestamp>,
    /// The holder's renewal is due.
    pub(crate) renew_due: bool,
    pub(crate) now: Timestamp,
}

/// The one write (or call) a node makes next in its wave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing to do.
    Idle,
    /// Write its own `status.members` entry in its domain, waiting.
    Join,
    /// It needs no reboot any more: its members entry stops waiting.
    StopWaiting,
    /// Write its own slot (phase Down, this boot); its members entry stops waiting.
    Take,
    /// Ask logind to reboot: the slot is held in this boot.
    Reboot,
    /// The node booted again: the slot becomes Returning.
    Returning,
    /// Healthy since then: written in the slot.
    Healthy(Timestamp),
    /// Not healthy any more: the slot's healthySince goes.
    Unhealthy,
    /// Healthy for the wave's healthy time: the slot goes.
    Free,
    /// Past its reboot budget without being healthy: the slot says Stuck, the wave stops.
    Stuck,
    /// Write the slot's renewTime.
    Renew,
    /// Remove the slot of a node that is gone.
    TakeBack(String),
    Wait(Why),
}

/// The next step of a node in its wave: its own slot first (the way back), then its turn.
pub(crate) fn next(seen: &Seen<'_>) -> Step {
    if let Some(mine) = seen.mine {
        return way_back(seen, mine);
    }
    let waiting = Member {
        domain: seen.domain,
        waiting: true,
    };
    if !seen.needs_reboot {
        return if seen.member.is_some_and(|m| m.waiting) {
            Step::StopWaiting
        } else {
            Step::Idle
        };
    }
    if seen.member != Some(waiting) {
        return Step::Join;
    }
    if let Some(node) = seen.take_back {
        return Step::TakeBack(node.to_owned());
    }
    match turn(
        seen.rules,
        seen.me,
        seen.domain,
        seen.held,
        seen.members,
        seen.opening,
        seen.stuck,
    ) {
        Turn::Take => match give_way(
            seen.rules,
            seen.domain,
            seen.held,
            seen.waiting,
            seen.given_way_for,
        ) {
            Some(why) => Step::Wait(why),
            None => Step::Take,
        },
        // Held by this node but not read back as its own yet: the watch catches up.
        Turn::Holding => Step::Idle,
        Turn::Wait(why) => Step::Wait(why),
    }
}

fn way_back(seen: &Seen<'_>, mine: &Mine) -> Step {
    if mine.phase == Phase::Down {
        return if mine.boot_id == seen.boot_id {
            Step::Reboot
        } else {
            Step::Returning
        };
    }
    match (seen.healthy, mine.healthy_since) {
        (Some(since), None) => return Step::Healthy(since),
        (None, Some(_)) => return Step::Unhealthy,
        (Some(_), Some(since)) if elapsed(since, seen.now) >= seen.rules.healthy_for => {
            return Step::Free
        }
        _ => {}
    }
    if mine.phase == Phase::Returning
        && mine.healthy_since.is_none()
        && elapsed(mine.taken, seen.now) >= seen.rules.reboot_budget
    {
        return Step::Stuck;
    }
    if seen.renew_due {
        Step::Renew
    } else {
        Step::Idle
    }
}

/// Whether the node is healthy again after its reboot: Ready as the kubelet of this boot
/// reported it (`kubelet_of_this_boot`: its heartbeat is not older than the boot, so a Ready
/// left from before the reboot does not count), uncordoned, and its DaemonSet and
/// static pods Ready (`not_ready` names those that are not). Err says what is missing.
pub(crate) fn health(
    ready: bool,
    kubelet_of_this_boot: bool,
    unschedulable: bool,
    not_ready: &[String],
) -> Result<(), String> {
    let mut missing = Vec::new();
    if !kubelet_of_this_boot {
        missing.push(
            "the kubelet has not reported since the reboot (the Node's Ready is from before it)"
                .to_owned(),
        );
    } else if !ready {
        missing.push("the Node is not Ready".to_owned());
    }
    if unschedulable {
        missing.push("the Node is cordoned".to_owned());
    }
    if !not_ready.is_empty() {
        missing.push(format!("not Ready: {}", not_ready.join(", ")));
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join("; "))
    }
}

/// Whether the wave's fleet-wide request (`spec.rebootRequestedAt`) asks this node for a
/// reboot: its boot began before the request. A boot time this node cannot read is no.
pub(crate) fn requested(requested_at: Option<Timestamp>, booted_at: Option<Timestamp>) -> bool {
    matches!((requested_at, booted_at), (Some(at), Some(boot)) if boot < at)
}

/// The node's `nodegrace.dev/reboot-pending:PreferNoSchedule` taint: from the moment it
/// knows it needs a reboot until its slot is free, so that the scheduler keeps evicted
/// pods off every node that waits.
pub(crate) fn pending_taint(needs_reboot: bool, holding: bool) -> bool {
    needs_reboot || holding
}

/// Whether a waiting node takes back another node's slot: its Node is gone, or the holder
/// has not renewed it for longer than the longest reboot allowed. A holder renews while its
/// daemon runs, so a node that is up and not healthy in time keeps its slot (it says the wave
/// is stuck); one that stays down past its budget is gone, and taking its slot back is counted
/// (an alert). `unrenewed_for` is measured on the waiting node's own monotonic clock from the
/// moment it last saw the slot change, so clocks that disagree between nodes change nothing.
pub(crate) fn take_back(rules: &Rules, node_gone: bool, unrenewed_for: Duration) -> bool {
    node_gone || unrenewed_for > rules.reboot_budget
}

fn elapsed(from: Timestamp, to: Timestamp) -> Duration {
    Duration::try_from(to.duration_since(from)).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests;
