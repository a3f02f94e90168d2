//! The checks the fields of [`super::Settings`] name (a failed one is located by serde at the
//! value it read), then [`across`]: what spans keys, located through the merged files.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, Error as _, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::error::ConfigError;
use super::merge::Merged;
use super::render::dur;
use super::{BandsSource, DrainPlanEntrySetting, PriorityGracePeriod, Settings};
use crate::plan::{names, PodType};

/// Every duration setting is 0 or at least this: timeouts, back-off caps and grace periods
/// all work in whole seconds or more, and a shorter one would spin or kill at once.
const MIN_DURATION: Duration = Duration::from_secs(1);

/// A duration written as a humantime string ("90s", "15m", "1h 30s").
fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct Humantime;
    fn bare_number<E: de::Error>(n: impl fmt::Display) -> Result<Duration, E> {
        Err(E::custom(format!(
            "a bare number is not a duration; write it as a string with a unit, e.g. \"{n}s\""
        )))
    }
    impl Visitor<'_> for Humantime {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a duration string such as \"90s\", \"15m\" or \"1h 30s\"")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
            humantime::parse_duration(s.trim()).map_err(|err| {
                E::custom(format!(
                    "invalid duration {s:?} ({err}); write e.g. \"90s\", \"15m\" or \"1h 30s\""
                ))
            })
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
            bare_number(n)
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
            bare_number(n)
        }
        fn visit_f64<E: de::Error>(self, n: f64) -> Result<Duration, E> {
            bare_number(n)
        }
    }
    d.deserialize_any(Humantime)
}

/// Why `value` is not a duration of at least [`MIN_DURATION`] (or zero, unless `nonzero`)
/// and at most `max`.
fn out_of_bounds(value: Duration, nonzero: bool, max: Duration) -> Option<String> {
    let show = humantime::format_duration;
    if nonzero && value.is_zero() {
        Some(format!(
            "must be greater than zero (at least {})",
            show(MIN_DURATION)
        ))
    } else if !value.is_zero() && value < MIN_DURATION {
        let or_zero = if nonzero { "" } else { ", or 0" };
        Some(format!(
            "{} is too short; at least {}{or_zero}",
            show(value),
            show(MIN_DURATION)
        ))
    } else if value > max {
        Some(format!(
            "{} is too long; at most {}",
            show(value),
            show(max)
        ))
    } else {
        None
    }
}

fn bounded<'de, D: Deserializer<'de>>(d: D, nonzero: bool, max: u64) -> Result<Duration, D::Error> {
    let value = duration(d)?;
    match out_of_bounds(value, nonzero, Duration::from_secs(max)) {
        Some(why) => Err(D::Error::custom(why)),
        None => Ok(value),
    }
}

/// The longest grace period of a band, in seconds: the longest shutdown.
const DAY: u64 = super::MAX_SHUTDOWN_DELAY.as_secs();

/// A duration of at least a second and at most `MAX_SECS`.
pub(super) struct Nonzero<const MAX_SECS: u64>;
/// A duration of 0 ("off"), or at least a second and at most `MAX_SECS`.
pub(super) struct ZeroOr<const MAX_SECS: u64>;

impl<const MAX_SECS: u64> Nonzero<MAX_SECS> {
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        bounded(d, true, MAX_SECS)
    }
    pub(super) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        dur(value, s)
    }
}

impl<const MAX_SECS: u64> ZeroOr<MAX_SECS> {
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        bounded(d, false, MAX_SECS)
    }
    pub(super) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        dur(value, s)
    }
}

pub(super) mod credential_lifetime {
    use super::*;
    use crate::config::{MAX_CREDENTIAL_LIFETIME, MIN_CREDENTIAL_LIFETIME};

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let value = duration(d)?;
        let show = humantime::format_duration;
        if value < MIN_CREDENTIAL_LIFETIME {
            return Err(D::Error::custom(format!(
                "{} is too short; at least {} (the CertificateSigningRequest API's minimum)",
                show(value),
                show(MIN_CREDENTIAL_LIFETIME)
            )));
        }
        match out_of_bounds(value, true, MAX_CREDENTIAL_LIFETIME) {
            Some(why) => Err(D::Error::custom(why)),
            None => Ok(value),
        }
    }
    pub(crate) use crate::config::render::dur as serialize;
}

/// `fallback.shutdown_grace_period`, the simple form's total.
pub(super) fn grace_period<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Nonzero::<DAY>::deserialize(d).map(Some)
}

pub(super) fn some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// A string run through `check`, which says what is wrong with it.
fn string<'de, D: Deserializer<'de>>(
    d: D,
    check: impl FnOnce(&str) -> Option<String>,
) -> Result<String, D::Error> {
    let text = String::deserialize(d)?;
    match check(&text) {
        Some(why) => Err(D::Error::custom(why)),
        None => Ok(text),
    }
}

/// NUL cannot be in a path or a D-Bus string at all, and a newline or other control
/// character in a name is a mistake that would only show when the value is used.
fn control_character(text: &str) -> Option<String> {
    let c = text.chars().find(|c| c.is_control())?;
    Some(format!(
        "must not contain control characters; it contains {c:?}"
    ))
}

/// Why `text` is not an absolute path without `..` (so that prefix checks between paths are
/// meaningful).
fn path_problem(text: &str) -> Option<String> {
    if text.is_empty() {
        return Some("must not be empty".into());
    }
    control_character(text).or_else(|| {
        let path = Path::new(text);
        if !path.is_absolute() {
            Some(format!("{text:?} is not an absolute path"))
        } else if path.components().any(|c| c == Component::ParentDir) {
            Some("must not contain `..`".into())
        } else {
            None
        }
    })
}

pub(super) fn abs_path<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    string(d, path_problem).map(PathBuf::from)
}

/// An absolute path, or None when set empty.
pub(super) mod optional_path {
    use super::*;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<PathBuf>, D::Error> {
        let text = string(d, |t| path_problem(t).filter(|_| !t.is_empty()))?;
        Ok((!text.is_empty()).then(|| PathBuf::from(text)))
    }
    pub(crate) use crate::config::render::or_empty as serialize;
}

/// An IP address and fixed port, or None when set empty.
pub(super) mod listen {
    use super::*;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let addr: SocketAddr = text.parse().map_err(|_| {
            D::Error::custom(format!(
                "{text:?} is not an IP address and port such as \"127.0.0.1:9847\""
            ))
        })?;
        if addr.port() == 0 {
            return Err(D::Error::custom("needs a fixed port, not 0"));
        }
        Ok(Some(addr))
    }
    pub(crate) use crate::config::render::or_empty as serialize;
}

pub(super) fn node_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    string(d, |name| {
        (!name.is_empty() && !names::is_dns_subdomain(name)).then(|| {
            format!(
                "{name:?} is not a valid Node name (lowercase letters, digits, '-' and '.'; \
                 empty means the host name)"
            )
        })
    })
}

pub(super) fn logind_dropin_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    string(d, |name| {
        control_character(name).or_else(|| {
            let bad = name.contains('/')
                || name.starts_with('.')
                || !name.ends_with(".conf")
                || name.len() <= ".conf".len();
            bad.then(|| {
                format!(
                    "{name:?} must be a plain file name ending in \".conf\" (no '/', not hidden)"
                )
            })
        })
    })
}

pub(super) fn cri_endpoint<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    string(d, |endpoint| {
        control_character(endpoint).or_else(|| {
            let socket = endpoint.strip_prefix("unix://").unwrap_or("");
            let bad = !socket.starts_with('/')
                || Path::new(socket)
                    .components()
                    .any(|c| c == Component::ParentDir);
            bad.then(|| {
                format!("{endpoint:?} must be \"unix://\" followed by an absolute socket path")
            })
        })
    })
}

pub(super) fn kubelet_unit<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    string(d, |unit| {
        if let Some(why) = control_character(unit) {
            return Some(why);
        }
        if unit.contains('/') || !unit.ends_with(".service") || unit.len() <= ".service".len() {
            return Some(format!(
                "{unit:?} must be a systemd service unit name, e.g. \"kubelet.service\""
            ));
        }
        let essential = unit == "nodegrace.service"
            || unit.starts_with("dbus")
            || unit.starts_with("systemd-")
            || unit == "init.service";
        essential.then(|| format!("{unit:?} is not the kubelet: the offline fallback stops this unit, and stopping nodegrace itself, the system bus or a systemd service would end the drain"))
    })
}

pub(super) fn sentinel_command<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let command = Vec::<String>::deserialize(d)?;
    if command.iter().any(|a| a.is_empty() || a.contains('\0')) {
        return Err(D::Error::custom(
            "every argument must be a non-empty string without NUL",
        ));
    }
    Ok(command)
}

pub(super) fn priority<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    let value = i64::deserialize(d)?;
    i32::try_from(value).map_err(|_| {
        D::Error::custom(format!(
            "{value} is out of range; a pod priority is a 32-bit integer ({} to {})",
            i32::MIN,
            i32::MAX
        ))
    })
}

pub(super) fn max_concurrent_requests<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = i64::deserialize(d)?;
    usize::try_from(n)
        .ok()
        .filter(|n| (1..=1000).contains(n))
        .ok_or_else(|| D::Error::custom(format!("{n} is out of range (1 to 1000)")))
}

/// `matchLabels` that the apiserver accepts.
fn label_selector<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let selector = BTreeMap::<String, String>::deserialize(d)?;
    for (key, value) in &selector {
        let (key_text, value_text) = (crate::text::escape(key), crate::text::escape(value));
        if !names::is_qualified_name(key) {
            return Err(D::Error::custom(format!(
                "{key_text:?} is not a label key (an optional DNS subdomain and '/', then 1 to 63 \
                 of A-Z a-z 0-9 - _ . starting and ending with a letter or digit)"
            )));
        }
        if !names::is_label_value(value) {
            return Err(D::Error::custom(format!(
                "the value of {key_text:?}, {value_text:?}, is not a label value (empty, or 1 to \
                 63 of A-Z a-z 0-9 - _ . starting and ending with a letter or digit)"
            )));
        }
    }
    Ok(selector)
}

/// A list setting kept as `T` and written as a list of `W`, whose fields carry the checks.
pub(super) struct List<W>(PhantomData<W>);

impl<W> List<W> {
    pub(super) fn deserialize<'de, T, D>(d: D) -> Result<Vec<T>, D::Error>
    where
        W: Deserialize<'de> + Into<T>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<W>::deserialize(d)?.into_iter().map(W::into).collect())
    }

    pub(super) fn serialize<'a, T, S: Serializer>(items: &'a [T], s: S) -> Result<S::Ok, S::Error>
    where
        W: Serialize + From<&'a T>,
    {
        s.collect_seq(items.iter().map(W::from))
    }
}

/// One `[[drain.plan]]` entry as written.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a drain plan entry ([[drain.plan]])")]
pub(super) struct PlanEntry {
    pod_type: Option<PodType>,
    #[serde(deserialize_with = "priority")]
    pod_priority: i32,
    #[serde(default, deserialize_with = "label_selector")]
    pod_selector: BTreeMap<String, String>,
}

impl From<PlanEntry> for DrainPlanEntrySetting {
    fn from(e: PlanEntry) -> Self {
        DrainPlanEntrySetting {
            pod_type: e.pod_type.unwrap_or(PodType::Default),
            pod_priority: e.pod_priority,
            pod_selector: e.pod_selector,
        }
    }
}

impl From<&DrainPlanEntrySetting> for PlanEntry {
    fn from(e: &DrainPlanEntrySetting) -> Self {
        PlanEntry {
            pod_type: Some(e.pod_type),
            pod_priority: e.pod_priority,
            pod_selector: e.pod_selector.clone(),
        }
    }
}

/// One `[[fallback.shutdown_grace_period_by_pod_priority]]` band as written.
#[derive(Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a band ([[fallback.shutdown_grace_period_by_pod_priority]])"
)]
pub(super) struct Band {
    #[serde(deserialize_with = "priority")]
    priority: i32,
    #[serde(with = "Nonzero::<DAY>")]
    shutdown_grace_period: Duration,
}

impl From<Band> for PriorityGracePeriod {
    fn from(b: Band) -> Self {
        PriorityGracePeriod {
            priority: b.priority,
            shutdown_grace_period: b.shutdown_grace_period,
        }
    }
}

impl From<&PriorityGracePeriod> for Band {
    fn from(b: &PriorityGracePeriod) -> Self {
        Band {
            priority: b.priority,
            shutdown_grace_period: b.shutdown_grace_period,
        }
    }
}

/// The most `drain.plan` entries: plans have a handful, and the planner's work (at
/// shutdown too) grows with entries times pods.
const MAX_PLAN_ENTRIES: usize = 64;

const BANDS: &str = "fallback.shutdown_grace_period_by_pod_priority";

/// The checks that span values, after the merge; each error names the key it blames.
pub(super) fn across(s: &mut Settings, files: &Merged<'_>) -> Result<(), ConfigError> {
    let plan = &s.drain.plan;
    if plan.len() > MAX_PLAN_ENTRIES {
        let why = format!(
            "has {} entries; at most {MAX_PLAN_ENTRIES} are allowed",
            plan.len()
        );
        return Err(files.at("drain.plan", &why));
    }
    for (i, entry) in plan.iter().enumerate() {
        if let Some(first) = plan[..i].iter().position(|e| e == entry) {
            return Err(files.at(
                &format!("drain.plan[{i}]"),
                &format!(
                    "duplicates drain.plan[{first}] (same pod_type, pod_priority and pod_selector)"
                ),
            ));
        }
    }
    fallback_bands(s, files)?;
    check_layout(s, files)?;
    check_reserves(s, files)
}

fn fallback_bands(s: &mut Settings, files: &Merged<'_>) -> Result<(), ConfigError> {
    let fb = &mut s.fallback;
    let simple = [
        "fallback.shutdown_grace_period",
        "fallback.shutdown_grace_period_critical_pods",
    ];
    if let Some(set) = files.set(BANDS) {
        let bands = &fb.shutdown_grace_period_by_pod_priority;
        if bands.is_empty() {
            return Err(files.at(
                BANDS,
                "needs at least one band; set fallback.enabled = false to turn the fallback off",
            ));
        }
        for (i, pair) in bands.windows(2).enumerate() {
            if pair[1].priority <= pair[0].priority {
                return Err(files.at(
                    &format!("{BANDS}[{}].priority", i + 1),
                    &format!(
                        "bands must be in strictly ascending priority without duplicates; {} follows {}",
                        pair[1].priority, pair[0].priority
                    ),
                ));
            }
        }
        fb.bands_from = BandsSource::Nodegrace(files.file_at(set));
    } else if let Some(set) = simple.iter().filter_map(|key| files.set(key)).max() {
        let (total, critical) = (
            fb.shutdown_grace_period.take(),
            fb.shutdown_grace_period_critical_pods.take(),
        );
        fb.shutdown_grace_period_by_pod_priority =
            simple_grace(total, critical).map_err(|why| files.at_last(&simple, &why))?;
        fb.bands_from = BandsSource::Nodegrace(files.file_at(set));
    }
    Ok(())
}

/// The kubelet's conversion of `shutdownGracePeriod` + `shutdownGracePeriodCriticalPods`.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
const DEFAULT_SHUTDOWN_GRACE_PERIOD: Duration = Duration::from_secs(90);
const DEFAULT_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS: Duration = Duration::from_secs(30);

fn simple_grace(
    total: Option<Duration>,
    critical: Option<Duration>,
) -> Result<Vec<PriorityGracePeriod>, String> {
    let show = humantime::format_duration;
    let default = |set: Option<Duration>| if set.is_none() { ", the default" } else { "" };
    let (total_note, critical_note) = (default(total), default(critical));
    let total = total.unwrap_or(DEFAULT_SHUTDOWN_GRACE_PERIOD);
    let critical = critical.unwrap_or(DEFAULT_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS);
    if critical.is_zero() {
        return Err(
            "shutdown_grace_period_critical_pods must be greater than zero (critical pods would \
             be killed without a grace period); use the list of bands for other layouts"
                .into(),
        );
    }
    if critical < MIN_DURATION {
        return Err(format!(
            "shutdown_grace_period_critical_pods ({}) is too short; at least {}",
            show(critical),
            show(MIN_DURATION)
        ));
    }
    if critical >= total {
        return Err(format!(
            "shutdown_grace_period_critical_pods ({}{critical_note}) must be less than \
             shutdown_grace_period ({}{total_note}), which includes it",
            show(critical),
            show(total),
        ));
    }
    if total - critical < MIN_DURATION {
        return Err(format!(
            "shutdown_grace_period ({}) leaves other pods {} after \
             shutdown_grace_period_critical_pods; at least {}",
            show(total),
            show(total - critical),
            show(MIN_DURATION)
        ));
    }
    Ok(vec![
        PriorityGracePeriod {
            priority: 0,
            shutdown_grace_period: total - critical,
        },
        PriorityGracePeriod {
            priority: SYSTEM_CRITICAL_PRIORITY,
            shutdown_grace_period: critical,
        },
    ])
}

/// What the static pod gate and the state directory need of each other; the daemon (and
/// `nodegrace complete`) refuse to start on anything else, so `check-config` does too.
fn check_layout(s: &Settings, files: &Merged<'_>) -> Result<(), ConfigError> {
    let state = ("state_dir", &s.state_dir);
    let manifests = ("static_pods.manifest_dir", &s.static_pods.manifest_dir);
    let gate = ("static_pods.gate_dir", &s.static_pods.gate_dir);
    let (state_dir, manifest_dir, gate_dir) = (state.1, manifests.1, gate.1);
    // The first of the keys that a file set (the defaults never clash).
    let blame = |keys: &[&str], why: &str| {
        let key = keys.iter().find(|key| files.set(key).is_some());
        files.at(key.unwrap_or(&keys[0]), why)
    };
    for (key, dir) in [state, manifests, gate] {
        if dir.parent().is_none() {
            return Err(blame(
                &[key],
                "must not be the root directory; give nodegrace a directory of its own",
            ));
        }
    }
    for (key, dir) in [state, gate] {
        if let Some(why) = cannot_exist(dir) {
            return Err(blame(&[key], &why));
        }
    }
    let show = |p: &PathBuf| p.display().to_string();
    let clash = if gate_dir.starts_with(manifest_dir) {
        Some((
            gate.0,
            manifests.0,
            format!(
                "the gate directory {} must not be the manifest directory {} or inside it \
             (the kubelet would start gated pods)",
                show(gate_dir),
                show(manifest_dir)
            ),
        ))
    } else if manifest_dir.starts_with(gate_dir) {
        Some((
            gate.0,
            manifests.0,
            format!(
                "the gate directory {} must not contain the manifest directory {} (restoring \
             static pods would move every pod manifest found in it into the manifest \
             directory)",
                show(gate_dir),
                show(manifest_dir)
            ),
        ))
    } else if state_dir.starts_with(manifest_dir) {
        Some((
            state.0,
            manifests.0,
            format!(
                "the state directory {} must not be the manifest directory {} or inside it \
             (the kubelet would read nodegrace's files as manifests)",
                show(state_dir),
                show(manifest_dir)
            ),
        ))
    } else if gate_dir == state_dir {
        Some((
            gate.0,
            state.0,
            format!(
                "the gate directory must not be the state directory {} (its files would be \
             taken for gated manifests); the default is a directory inside it",
                show(state_dir)
            ),
        ))
    } else {
        None
    };
    match clash {
        Some((first, second, why)) => Err(blame(&[first, second], &why)),
        None => Ok(()),
    }
}

/// Why a directory nodegrace creates and writes to can never be one: it is under a file, or
/// on /proc or /sys (where nothing can be created, or what is there is the kernel's). The
/// deepest parent that exists is what decides, with its symlinks followed; the directory
/// itself being something else is a state to report at run time, not a setting's fault,
/// unless it is a symlink loop, which nothing but an operator's hand can undo.
fn cannot_exist(dir: &Path) -> Option<String> {
    let ancestors: Vec<_> = dir.ancestors().collect();
    let looped = ancestors
        .into_iter()
        .rev()
        .find(|a| std::fs::metadata(a).is_err_and(|e| e.raw_os_error() == Some(nix::libc::ELOOP)));
    if let Some(looped) = looped {
        return Some(format!(
            "{} cannot be a directory: {} is a symlink loop (too many levels of symbolic links)",
            dir.display(),
            looped.display()
        ));
    }
    let existing = dir.ancestors().skip(1).find_map(|a| {
        let meta = std::fs::metadata(a).ok()?;
        Some((a, meta))
    })?;
    let (found, meta) = existing;
    if !meta.is_dir() {
        return Some(format!(
            "{} cannot be a directory: {} is not a directory",
            dir.display(),
            found.display()
        ));
    }
    let real = std::fs::canonicalize(found).ok()?;
    let kernel = ["/proc", "/sys"]
        .into_iter()
        .find(|k| real.starts_with(k) || dir.starts_with(k))?;
    Some(format!(
        "{} is on {kernel}, the kernel's view of itself, where nothing of nodegrace's can be kept",
        dir.display()
    ))
}

/// The three reserves come out of the shutdown budget; Default pods need some of it too.
fn check_reserves(s: &Settings, files: &Merged<'_>) -> Result<(), ConfigError> {
    let d = &s.drain;
    let reserved = d.reserve_daemonset + d.reserve_static + d.reserve_critical;
    if reserved < s.shutdown.max_delay {
        return Ok(());
    }
    let why = format!(
        "the drain reserves add up to {} which leaves nothing of shutdown.max_delay ({}) \
         for ordinary pods",
        humantime::format_duration(reserved),
        humantime::format_duration(s.shutdown.max_delay)
    );
    Err(files.at_last(
        &[
            "shutdown.max_delay",
            "drain.reserve_daemonset",
            "drain.reserve_static",
            "drain.reserve_critical",
        ],
        &why,
    ))
}
