//! The kubelet's own Graceful Node Shutdown settings, read from its configuration file and
//! its drop-in directory (`--config-dir`, GA in 1.35) as the kubelet reads them, so that the
//! offline fallback uses the bands the kubelet would without anyone typing them twice.
//!
//! Reading (files, caps) is [`read`]; what the kubelet makes of the files' text is
//! [`decide`], pure: its decoding (YAML turned into JSON, then typed), its merge of the
//! drop-ins, its feature gates, its validation and its migration of the two older fields.
//!
//! Nothing here stops nodegrace: a configuration that cannot be used is set aside whole
//! (a drop-in skipped alone could leave bands the kubelet never used), and why is kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use super::PriorityGracePeriod;
use crate::fsutil::{read_regular, ReadError, Symlinks, CONFIG_FILE_LIMIT};
use crate::yaml::{self, Duplicates, Reading};

type Mapping = Map<String, Value>;

/// `system-critical`'s priority: the critical band the kubelet makes of the older fields.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// nodegrace's own bound on a band's grace period.
const MAX_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Most drop-ins read (a node has a handful), and most bytes of the file and its drop-ins
/// together: past either the kubelet's configuration is not read, so that reading it stays
/// well under a second.
const MAX_DROP_INS: usize = 64;
const MAX_TOTAL_BYTES: usize = 1 << 20;
/// The kubelet walks the drop-in directory's subdirectories too; nodegrace this deep.
const MAX_DIR_DEPTH: usize = 8;

const KIND: &str = "KubeletConfiguration";
const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
const GATE_GNS: &str = "GracefulNodeShutdown";
const GATE_BY_PRIORITY: &str = "GracefulNodeShutdownBasedOnPodPriority";
const SECOND_NS: i64 = 1_000_000_000;

/// What the kubelet makes of its configuration, as far as its Graceful Node Shutdown goes.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) enum Verdict {
    /// Its GNS is off (or nothing was found): no inhibitor, pods die with the node.
    #[default]
    Off,
    /// Its GNS is on with these bands, in ascending priority.
    On(Vec<PriorityGracePeriod>),
    /// The kubelet refuses this configuration: it does not start with it.
    Refused(String),
    /// nodegrace does not read it (a limit of its own): whether the kubelet's GNS is on is
    /// not known.
    NotRead(String),
    /// The kubelet's GNS is on with bands nodegrace's fallback cannot take.
    NotMirrored(String),
}

/// The kubelet's configuration as read: the verdict and the files it came from.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct KubeletShutdown {
    pub verdict: Verdict,
    /// The files read, in merge order.
    pub files: Vec<PathBuf>,
}

impl KubeletShutdown {
    /// The kubelet's own Graceful Node Shutdown is on: it takes a delay inhibitor and kills
    /// pods at a shutdown.
    pub(crate) fn gns_on(&self) -> bool {
        matches!(self.verdict, Verdict::On(_) | Verdict::NotMirrored(_))
    }

    /// The kubelet's bands, where nodegrace can take them.
    pub(crate) fn bands(&self) -> &[PriorityGracePeriod] {
        match &self.verdict {
            Verdict::On(b) => b,
            _ => &[],
        }
    }

    /// Why the configuration is set aside, if it is.
    pub(crate) fn set_aside(&self) -> Option<String> {
        match &self.verdict {
            Verdict::Off | Verdict::On(_) => None,
            Verdict::Refused(why) => Some(format!(
                "the kubelet refuses it too (it does not start with it): {why}"
            )),
            Verdict::NotRead(why) => Some(format!(
                "{why}; whether the kubelet's Graceful Node Shutdown is on is not known"
            )),
            Verdict::NotMirrored(why) => Some(format!(
                "the kubelet's Graceful Node Shutdown is on, with bands nodegrace's fallback cannot take: {why}"
            )),
        }
    }
}

/// One file's text for [`decide`].
pub(crate) struct FileText<'a> {
    /// Its name as shown in a message (escaped).
    pub shown: String,
    pub bytes: &'a [u8],
    /// The kubelet's `--config` (not a drop-in).
    pub main: bool,
}

/// Reads `config` (the kubelet's `--config`) and the `*.conf` files of `dir` (its
/// `--config-dir`, subdirectories included) in the kubelet's order. A missing file or
/// directory is not a fault: not every node is set up that way.
pub(crate) fn read(config: Option<&Path>, dir: Option<&Path>) -> KubeletShutdown {
    let not_read = |why: String| KubeletShutdown {
        verdict: Verdict::NotRead(why),
        files: Vec::new(),
    };
    let mut paths: Vec<(PathBuf, bool)> = config
        .map(|p| (p.to_path_buf(), true))
        .into_iter()
        .collect();
    if let Some(dir) = dir {
        match drop_ins(dir) {
            Ok(list) => paths.extend(list.into_iter().map(|p| (p, false))),
            Err(why) => return not_read(why),
        }
    }
    let mut read = Vec::new();
    let mut total = 0;
    for (path, main) in paths {
        let shown = show(&path);
        match read_regular(&path, CONFIG_FILE_LIMIT, Symlinks::Refuse) {
            Ok(bytes) => {
                total += bytes.len();
                if total > MAX_TOTAL_BYTES {
                    return not_read(format!(
                        "{shown}: the kubelet's configuration and drop-ins pass {} MiB together here, more than is read",
                        MAX_TOTAL_BYTES >> 20
                    ));
                }
                read.push((path, main, bytes));
            }
            Err(ReadError::NotFound) => continue,
            Err(err) => return not_read(format!("{shown}: cannot read: {err}")),
        }
    }
    let texts: Vec<FileText<'_>> = read
        .iter()
        .map(|(path, main, bytes)| FileText {
            shown: show(path),
            bytes,
            main: *main,
        })
        .collect();
    let verdict = decide(&texts);
    KubeletShutdown {
        verdict,
        files: read.into_iter().map(|(p, _, _)| p).collect(),
    }
}

fn show(path: &Path) -> String {
    crate::text::escape(&path.display().to_string()).into_owned()
}

/// The kubelet's drop-ins: files whose name ends in `.conf`, dot files included, walked as
/// the kubelet walks the directory (names in byte order, a subdirectory where its name
/// falls).
fn drop_ins(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: cannot read: {e}", show(dir))),
    };
    if meta.file_type().is_symlink() {
        return Err(format!("{}: a symlink, not followed", show(dir)));
    }
    if !meta.is_dir() {
        return Err(format!("{}: not a directory", show(dir)));
    }
    let mut out = Vec::new();
    walk(dir, 0, &mut out)?;
    Ok(out)
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let shown = show(dir);
    if depth > MAX_DIR_DEPTH {
        return Err(format!(
            "{shown}: drop-in subdirectories deeper than the {MAX_DIR_DEPTH} levels read"
        ));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("{shown}: cannot read: {e}"))?;
        let is_dir = entry
            .file_type()
            .map_err(|e| format!("{shown}: cannot read: {e}"))?
            .is_dir();
        let name = entry.file_name();
        if is_dir || name.as_bytes().ends_with(b".conf") {
            names.push((name, is_dir));
        }
        if names.len() > 4 * MAX_DROP_INS {
            return Err(format!(
                "{shown}: more than the {MAX_DROP_INS} drop-ins read"
            ));
        }
    }
    names.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    for (name, is_dir) in names {
        let path = dir.join(name);
        if is_dir {
            walk(&path, depth + 1, out)?;
        } else {
            out.push(path);
        }
        if out.len() > MAX_DROP_INS {
            return Err(format!(
                "{}: more than the {MAX_DROP_INS} drop-ins read",
                show(dir)
            ));
        }
    }
    Ok(())
}

/// What the kubelet makes of these files (the `--config` file first, then the drop-ins in
/// order): each decoded as the kubelet decodes it, the drop-ins merged over it field by
/// field (a JSON merge patch: a list replaced whole, a map key by key, `null` back to the
/// default), then its feature gates, its validation and its migration of
/// `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` to two bands.
pub(crate) fn decide(files: &[FileText<'_>]) -> Verdict {
    let mut merged = Merged::default();
    for file in files {
        let map = match document(file.bytes) {
            Ok(map) => map,
            Err(Fault::Refused(why)) => return Verdict::Refused(format!("{}: {why}", file.shown)),
            Err(Fault::NotRead(why)) => return Verdict::NotRead(format!("{}: {why}", file.shown)),
        };
        if let Err(why) = merged.apply(&map, file.main) {
            return Verdict::Refused(format!("{}: {why}", file.shown));
        }
    }
    let names: Vec<&str> = files.iter().map(|f| f.shown.as_str()).collect();
    match merged.verdict() {
        Verdict::Refused(why) => Verdict::Refused(format!("{}: {why}", names.join(", "))),
        Verdict::NotMirrored(why) => Verdict::NotMirrored(format!("{}: {why}", names.join(", "))),
        other => other,
    }
}

enum Fault {
    Refused(String),
    NotRead(String),
}

/// One file as the kubelet decodes it: YAML (UTF-8, or UTF-16 after its byte order mark),
/// merge keys applied, a mapping of kind `KubeletConfiguration` and apiVersion
/// `kubelet.config.k8s.io/v1beta1`.
fn document(bytes: &[u8]) -> Result<Mapping, Fault> {
    if bytes.is_empty() {
        return Err(Fault::Refused("empty".into()));
    }
    let text = decode_text(bytes).ok_or_else(|| Fault::Refused("not valid UTF-8".into()))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    // The kubelet decodes strictly and, failing on a key given twice, again leniently (its
    // `DecodeKubeletConfiguration`): the last one wins. Merge keys (`<<`) are applied.
    let doc: Value = match yaml::first_document(text, Reading::file(Duplicates::LastWins)) {
        None => Value::Null,
        Some(Ok(doc)) => doc,
        Some(Err(e)) => {
            return Err(match yaml::limit(&e) {
                Some(why) => Fault::NotRead(format!("not read: {why}")),
                None => Fault::Refused(format!("not YAML: {}", crate::text::yaml_fault(&e))),
            })
        }
    };
    let Value::Object(map) = doc else {
        return Err(Fault::Refused(format!(
            "not a {KIND} (no kind and apiVersion)"
        )));
    };
    match map.get("kind").map(Value::as_str) {
        Some(Some(KIND)) => {}
        Some(_) => return Err(Fault::Refused(format!("its kind is not {KIND}"))),
        None => return Err(Fault::Refused(format!("not a {KIND} (no kind)"))),
    }
    match map.get("apiVersion").map(Value::as_str) {
        Some(Some(API_VERSION)) => {}
        Some(_) => {
            return Err(Fault::Refused(format!(
                "its apiVersion is not {API_VERSION}"
            )))
        }
        None => return Err(Fault::Refused(format!("not a {KIND} (no apiVersion)"))),
    }
    Ok(map)
}

fn decode_text(bytes: &[u8]) -> Option<String> {
    let utf16 = |be: bool| {
        let units: Vec<u16> = bytes[2..]
            .chunks(2)
            .map(|c| match (c, be) {
                ([a, b], true) => Some(u16::from_be_bytes([*a, *b])),
                ([a, b], false) => Some(u16::from_le_bytes([*a, *b])),
                _ => None,
            })
            .collect::<Option<_>>()?;
        String::from_utf16(&units).ok()
    };
    match bytes {
        [0xff, 0xfe, ..] => utf16(false),
        [0xfe, 0xff, ..] => utf16(true),
        _ => String::from_utf8(bytes.to_vec()).ok(),
    }
}

/// The fields of the kubelet's configuration that decide its Graceful Node Shutdown, as
/// merged so far (durations in nanoseconds, as Go keeps them).
#[derive(Debug, Default)]
struct Merged {
    grace: i64,
    critical: i64,
    by_priority: Vec<(i32, i64)>,
    gates: BTreeMap<String, bool>,
}

impl Merged {
    fn apply(&mut self, map: &Mapping, main: bool) -> Result<(), String> {
        const GRACE: &str = "shutdownGracePeriod";
        const CRITICAL: &str = "shutdownGracePeriodCriticalPods";
        const BY_PRIORITY: &str = "shutdownGracePeriodByPodPriority";
        if let Some(v) = map.get(GRACE) {
            self.grace = duration_value(v).ok_or_else(|| not_a_duration(GRACE))?;
        }
        if let Some(v) = map.get(CRITICAL) {
            self.critical = duration_value(v).ok_or_else(|| not_a_duration(CRITICAL))?;
        }
        if let Some(v) = map.get(BY_PRIORITY) {
            self.by_priority = by_priority(v)?;
        }
        match map.get("featureGates") {
            None => {}
            Some(Value::Null) => self.gates.clear(),
            Some(Value::Object(gates)) => {
                for (name, value) in gates {
                    let name = name.as_str();
                    let known = name == GATE_GNS || name == GATE_BY_PRIORITY;
                    let on = match value {
                        // In the file the kubelet decodes, null is false; in a drop-in
                        // (a merge patch) it removes the gate.
                        Value::Null if !main => {
                            self.gates.remove(name);
                            continue;
                        }
                        Value::Null => false,
                        v => yaml11_bool(v).ok_or_else(|| {
                            if known {
                                format!("featureGates.{name}: not true or false")
                            } else {
                                "featureGates: a gate set to something other than true or false"
                                    .to_string()
                            }
                        })?,
                    };
                    if known {
                        self.gates.insert(name.to_string(), on);
                    }
                }
            }
            Some(_) => return Err("featureGates: not a map of gate names to true or false".into()),
        }
        Ok(())
    }

    fn gate(&self, name: &str) -> bool {
        // Both are beta and on by default (1.21 and 1.24), not locked.
        self.gates.get(name).copied().unwrap_or(true)
    }

    /// The kubelet's validation, then its shutdown manager's choice of bands.
    fn verdict(&self) -> Verdict {
        let (grace, critical) = (self.grace, self.critical);
        let gns = self.gate(GATE_GNS);
        let by_priority = self.gate(GATE_BY_PRIORITY);
        let below_a_second = |d: i64| d < 0 || (d > 0 && d < SECOND_NS);
        let refused = |why: String| Verdict::Refused(why);
        if gns {
            if critical > grace {
                return refused(format!(
                    "shutdownGracePeriodCriticalPods ({}) is longer than shutdownGracePeriod ({})",
                    show_ns(critical),
                    show_ns(grace)
                ));
            }
            if below_a_second(grace) {
                return refused(format!(
                    "shutdownGracePeriod ({}) is neither 0 nor at least 1s",
                    show_ns(grace)
                ));
            }
            if below_a_second(critical) {
                return refused(format!(
                    "shutdownGracePeriodCriticalPods ({}) is neither 0 nor at least 1s",
                    show_ns(critical)
                ));
            }
        }
        let older_set = grace > 0 || critical > 0;
        if older_set && !gns {
            return refused(format!(
                "shutdownGracePeriod or shutdownGracePeriodCriticalPods is set and the {GATE_GNS} feature gate is off"
            ));
        }
        if !self.by_priority.is_empty() {
            if !by_priority {
                return refused(format!(
                    "shutdownGracePeriodByPodPriority is set and the {GATE_BY_PRIORITY} feature gate is off"
                ));
            }
            if older_set {
                return refused(
                    "shutdownGracePeriodByPodPriority is set beside shutdownGracePeriod or shutdownGracePeriodCriticalPods".into(),
                );
            }
        }
        if !gns {
            return Verdict::Off;
        }
        let mut bands = if !by_priority || self.by_priority.is_empty() {
            migrate(grace, critical)
        } else {
            self.by_priority.clone()
        };
        if bands.is_empty() {
            return Verdict::Off;
        }
        bands.sort_by_key(|b| b.0);
        if let Some(pair) = bands.windows(2).find(|w| w[0].0 == w[1].0) {
            return Verdict::NotMirrored(format!(
                "two bands for priority {} (which of them the kubelet gives those pods is not defined)",
                pair[0].0
            ));
        }
        let mut out = Vec::with_capacity(bands.len());
        for (priority, seconds) in bands {
            let grace = u64::try_from(seconds)
                .ok()
                .map(Duration::from_secs)
                .filter(|g| *g <= MAX_GRACE)
                .ok_or_else(|| {
                    format!(
                        "the band of priority {priority} has a grace period of {seconds}s; nodegrace's bands take 0s to 24h"
                    )
                });
            match grace {
                Ok(g) => out.push(PriorityGracePeriod {
                    priority,
                    shutdown_grace_period: g,
                }),
                Err(why) => return Verdict::NotMirrored(why),
            }
        }
        Verdict::On(out)
    }
}

/// The kubelet's two bands of `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods`:
/// priority 0 gets the difference, `system-critical` the critical time, each in whole
/// seconds (cut, not rounded); a zero total is none.
fn migrate(grace: i64, critical: i64) -> Vec<(i32, i64)> {
    if grace == 0 {
        return Vec::new();
    }
    let Some(regular) = grace.checked_sub(critical).filter(|d| *d >= 0) else {
        return Vec::new();
    };
    let critical = grace - regular;
    vec![
        (0, regular / SECOND_NS),
        (SYSTEM_CRITICAL_PRIORITY, critical / SECOND_NS),
    ]
}

fn not_a_duration(key: &str) -> String {
    format!("{key}: not a duration such as \"30s\" or \"1m30s\"")
}

fn show_ns(ns: i64) -> String {
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns < 0 {
        format!("-{d:?}")
    } else {
        format!("{d:?}")
    }
}

fn by_priority(v: &Value) -> Result<Vec<(i32, i64)>, String> {
    const KEY: &str = "shutdownGracePeriodByPodPriority";
    let list = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(s) => s,
        _ => return Err(format!("{KEY}: not a list")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, band) in list.iter().enumerate() {
        let field = |name: &str| match band {
            Value::Object(m) => Ok(m.get(name)),
            Value::Null => Ok(None),
            _ => Err(format!("{KEY}[{i}]: not a mapping")),
        };
        let priority = match field("priority")? {
            None => 0,
            Some(v) => integer(v)
                .and_then(|p| i32::try_from(p).ok())
                .ok_or_else(|| format!("{KEY}[{i}].priority: not a 32-bit integer"))?,
        };
        let seconds = match field("shutdownGracePeriodSeconds")? {
            None => 0,
            Some(v) => integer(v).ok_or_else(|| {
                format!("{KEY}[{i}].shutdownGracePeriodSeconds: not a whole number of seconds")
            })?,
        };
        out.push((priority, seconds));
    }
    Ok(out)
}

/// An integer field as the kubelet decodes it: YAML is turned into JSON first, where a
/// whole float (`1e3`, `60.0`) is written as an integer; `null` leaves the field at 0.
fn integer(v: &Value) -> Option<i64> {
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    match v {
        Value::Null => Some(0),
        Value::Number(n) => n.as_i64().or_else(|| {
            if n.is_u64() {
                return None;
            }
            let f = n.as_f64()?;
            (f.is_finite() && f.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&f))
                .then_some(f as i64)
        }),
        _ => None,
    }
}

/// A boolean as the kubelet's YAML reader (YAML 1.1) takes it.
fn yaml11_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.as_str() {
            "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => {
                Some(true)
            }
            "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False"
            | "FALSE" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

fn duration_value(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => go_duration(s),
        Value::Null => Some(0),
        _ => None,
    }
}

/// A Go `time.Duration` string ("30s", "1m30s", "1.5h", "1500ms", "-5s", "0") in
/// nanoseconds, as Go's `time.ParseDuration` reads it; None where Go refuses it.
fn go_duration(s: &str) -> Option<i64> {
    const MAX: u64 = 1 << 63;
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let mut whole: u64 = 0;
        for b in rest[..int_len].bytes() {
            whole = whole.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
            if whole > MAX {
                return None;
            }
        }
        rest = &rest[int_len..];
        let (mut frac, mut scale, mut frac_len) = (0u64, 1f64, 0);
        if let Some(after) = rest.strip_prefix('.') {
            frac_len = after.bytes().take_while(u8::is_ascii_digit).count();
            let mut overflow = false;
            for b in after[..frac_len].bytes() {
                if overflow || frac > (MAX - 1) / 10 {
                    overflow = true;
                    continue;
                }
                frac = frac * 10 + u64::from(b - b'0');
                scale *= 10.0;
            }
            rest = &after[frac_len..];
        }
        if int_len == 0 && frac_len == 0 {
            return None;
        }
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit: u64 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        if whole > MAX / unit {
            return None;
        }
        let mut value = whole * unit;
        if frac > 0 {
            value += (frac as f64 * (unit as f64 / scale)) as u64;
            if value > MAX {
                return None;
            }
        }
        total = total.checked_add(value).filter(|t| *t <= MAX)?;
    }
    if neg {
        0i64.checked_sub_unsigned(total)
    } else {
        i64::try_from(total).ok()
    }
}

#[cfg(test)]
mod tests;
