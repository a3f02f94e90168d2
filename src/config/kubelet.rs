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

use serde_yaml::{Mapping, Value};

use super::PriorityGracePeriod;
use crate::fsutil::{read_regular, ReadError, Symlinks, CONFIG_FILE_LIMIT};

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
    if let Some(why) = crate::yaml::why_not_read(text) {
        return Err(Fault::NotRead(format!("not read: {why}")));
    }
    let mut doc: Value = match first_document(text) {
        Ok(doc) => doc,
        // The kubelet decodes strictly and, failing on a key given twice, again leniently
        // (its `DecodeKubeletConfiguration`): the last one wins.
        Err(e) if e.to_string().contains("duplicate entry with key") => last_key_wins(text)
            .ok_or_else(|| Fault::Refused(format!("not YAML: {}", crate::text::yaml_fault(&e))))?,
        Err(e) => {
            return Err(Fault::Refused(format!(
                "not YAML: {}",
                crate::text::yaml_fault(&e)
            )))
        }
    };
    doc.apply_merge().map_err(|_| {
        Fault::Refused(
            "not YAML: a merge key (<<) that is not a mapping or a list of mappings".into(),
        )
    })?;
    let Value::Mapping(map) = doc else {
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

/// The first YAML document of `text`: the kubelet's YAML decoding reads that one and
/// ignores any after a `---`.
fn first_document<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_yaml::Error> {
    match serde_yaml::Deserializer::from_str(text).next() {
        Some(doc) => T::deserialize(doc),
        None => serde_yaml::from_str(text),
    }
}

/// `text` with each key given twice in a mapping taking its last value (a JSON object's
/// decoding keeps the last); None when it is not read that way either.
fn last_key_wins(text: &str) -> Option<Value> {
    let json: serde_json::Value = first_document(text).ok()?;
    serde_yaml::to_value(json).ok()
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
            Some(Value::Mapping(gates)) => {
                for (name, value) in gates {
                    let name = match name {
                        Value::String(s) => s.as_str(),
                        _ => continue,
                    };
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
        Value::Sequence(s) => s,
        _ => return Err(format!("{KEY}: not a list")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, band) in list.iter().enumerate() {
        let field = |name: &str| match band {
            Value::Mapping(m) => Ok(m.get(name)),
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
mod tests {
    use super::*;

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn band(priority: i32, secs: u64) -> PriorityGracePeriod {
        PriorityGracePeriod {
            priority,
            shutdown_grace_period: Duration::from_secs(secs),
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The verdict on the `--config` file `main` with `drop_ins` after it.
    fn verdict_of(main: &[u8], drop_ins: &[&str]) -> Verdict {
        let mut files = vec![FileText {
            shown: "config.yaml".into(),
            bytes: main,
            main: true,
        }];
        for (i, d) in drop_ins.iter().enumerate() {
            files.push(FileText {
                shown: format!("{i}.conf"),
                bytes: d.as_bytes(),
                main: false,
            });
        }
        decide(&files)
    }

    enum Want {
        On(&'static [(i32, u64)]),
        Off,
        Refused(&'static str),
        NotMirrored(&'static str),
    }

    /// The kubelet's own cases (its validation, its shutdown manager's migration, its
    /// decoding), each with what the kubelet does with it.
    #[test]
    fn the_kubelets_accepted_and_refused_configurations() {
        use Want::*;
        const CRIT: i32 = SYSTEM_CRITICAL_PRIORITY;
        let cases: Vec<(&str, String, Vec<&str>, Want)> = vec![
            // Accepted.
            ("grace alone: a critical band of 0s", format!("{HEAD}shutdownGracePeriod: 30s\n"), vec![], On(&[(0, 30), (CRIT, 0)])),
            ("critical equal to the total", format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 30s\n"), vec![], On(&[(0, 0), (CRIT, 30)])),
            ("the usual two", format!("{HEAD}shutdownGracePeriod: 2m\nshutdownGracePeriodCriticalPods: 30s\n"), vec![], On(&[(0, 90), (CRIT, 30)])),
            ("1500ms: whole seconds, cut", format!("{HEAD}shutdownGracePeriod: 1500ms\n"), vec![], On(&[(0, 1), (CRIT, 0)])),
            ("each band cut to whole seconds", format!("{HEAD}shutdownGracePeriod: 3.9s\nshutdownGracePeriodCriticalPods: 1.5s\n"), vec![], On(&[(0, 2), (CRIT, 1)])),
            ("Go duration forms", format!("{HEAD}shutdownGracePeriod: 1h0m0.5s\nshutdownGracePeriodCriticalPods: +.5h\n"), vec![], On(&[(0, 1800), (CRIT, 1800)])),
            ("a band of 0s", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- priority: 0\n  shutdownGracePeriodSeconds: 0\n- priority: 1000\n  shutdownGracePeriodSeconds: 10\n"), vec![], On(&[(0, 0), (1000, 10)])),
            ("priority 1e3, seconds 60.0 (JSON integers once YAML is JSON)", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- priority: 1e3\n  shutdownGracePeriodSeconds: 60.0\n"), vec![], On(&[(1000, 60)])),
            ("a band's missing fields are 0", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- shutdownGracePeriodSeconds: 5\n- priority: 7\n"), vec![], On(&[(0, 5), (7, 0)])),
            ("sorted by priority", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 100000, shutdownGracePeriodSeconds: 20}}\n- {{priority: -5, shutdownGracePeriodSeconds: 120}}\n"), vec![], On(&[(-5, 120), (100000, 20)])),
            ("a merge key", format!("{HEAD}base: &gns\n  shutdownGracePeriod: 40s\n  shutdownGracePeriodCriticalPods: 10s\n<<: *gns\n"), vec![], On(&[(0, 30), (CRIT, 10)])),
            ("a key given twice: the last (the kubelet's lenient decoding)", format!("{HEAD}shutdownGracePeriod: 30s\nfeatureGates:\n  GracefulNodeShutdown: false\n  GracefulNodeShutdown: true\nshutdownGracePeriod: 40s\n"), vec![], On(&[(0, 40), (CRIT, 0)])),
            ("only the first document is read", format!("{HEAD}shutdownGracePeriod: 30s\n---\n{HEAD}shutdownGracePeriod: 1d\n---\n- [unclosed\n"), vec![], On(&[(0, 30), (CRIT, 0)])),
            ("the file's own key wins over a merge key", format!("{HEAD}base: &gns\n  shutdownGracePeriod: 40s\n<<: *gns\nshutdownGracePeriod: 20s\n"), vec![], On(&[(0, 20), (CRIT, 0)])),
            ("priority-based gate off: the older fields migrated", format!("{HEAD}featureGates:\n  GracefulNodeShutdownBasedOnPodPriority: false\nshutdownGracePeriod: 30s\n"), vec![], On(&[(0, 30), (CRIT, 0)])),
            ("gates as YAML 1.1 booleans", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: on\n  GracefulNodeShutdownBasedOnPodPriority: yes\nshutdownGracePeriod: 30s\n"), vec![], On(&[(0, 30), (CRIT, 0)])),
            ("a drop-in replaces one field", format!("{HEAD}shutdownGracePeriod: 60s\nshutdownGracePeriodCriticalPods: 20s\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodCriticalPods: 10s\n"], On(&[(0, 50), (CRIT, 10)])),
            ("a drop-in's null puts the list back to none", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: 9}}\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodByPodPriority: null\nshutdownGracePeriod: 20s\n"], On(&[(0, 20), (CRIT, 0)])),
            ("a drop-in's null gate is the default again", format!("{HEAD}featureGates: {{GracefulNodeShutdown: false}}\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfeatureGates: {GracefulNodeShutdown: null}\nshutdownGracePeriod: 10s\n"], On(&[(0, 10), (CRIT, 0)])),
            // Accepted, GNS off.
            ("GNS not configured", HEAD.to_string(), vec![], Off),
            ("zero grace", format!("{HEAD}shutdownGracePeriod: 0s\nshutdownGracePeriodCriticalPods: \"0\"\n"), vec![], Off),
            ("the gate off alone", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: false\n"), vec![], Off),
            ("the gate off: a negative grace is not checked", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: off\nshutdownGracePeriod: -5s\n"), vec![], Off),
            ("an empty list", format!("{HEAD}shutdownGracePeriodByPodPriority: []\n"), vec![], Off),
            ("a drop-in turns it off", format!("{HEAD}shutdownGracePeriod: 60s\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 0s\n"], Off),
            // Accepted by the kubelet, not mirrored by nodegrace.
            ("two bands for one priority", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 5, shutdownGracePeriodSeconds: 9}}\n- {{priority: 5, shutdownGracePeriodSeconds: 3}}\n"), vec![], NotMirrored("two bands for priority 5")),
            ("a negative band", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 5, shutdownGracePeriodSeconds: -1}}\n"), vec![], NotMirrored("grace period of -1s")),
            ("a band over a day", format!("{HEAD}shutdownGracePeriod: 25h\n"), vec![], NotMirrored("grace period of 90000s")),
            // Refused by the kubelet's validation.
            ("grace 0, critical 30s", format!("{HEAD}shutdownGracePeriod: 0s\nshutdownGracePeriodCriticalPods: 30s\n"), vec![], Refused("longer than shutdownGracePeriod")),
            ("critical above the total", format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 40s\n"), vec![], Refused("longer than")),
            ("critical beside the list", format!("{HEAD}shutdownGracePeriodCriticalPods: 0s\nshutdownGracePeriod: 0s\nshutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: 10}}\nfeatureGates: {{}}\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodCriticalPods: 10s\nshutdownGracePeriod: 10s\n"], Refused("beside shutdownGracePeriod")),
            ("both forms", format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: 10}}\n"), vec![], Refused("beside")),
            ("the gate off with a grace period", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: false\nshutdownGracePeriod: 30s\n"), vec![], Refused("GracefulNodeShutdown feature gate is off")),
            ("the priority gate off with a list", format!("{HEAD}featureGates:\n  GracefulNodeShutdownBasedOnPodPriority: false\nshutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: 10}}\n"), vec![], Refused("GracefulNodeShutdownBasedOnPodPriority feature gate is off")),
            ("grace under a second", format!("{HEAD}shutdownGracePeriod: 500ms\n"), vec![], Refused("neither 0 nor at least 1s")),
            ("critical under a second", format!("{HEAD}shutdownGracePeriod: 2s\nshutdownGracePeriodCriticalPods: 999ms\n"), vec![], Refused("neither 0 nor at least 1s")),
            ("a negative grace", format!("{HEAD}shutdownGracePeriod: -5s\nshutdownGracePeriodCriticalPods: -6s\n"), vec![], Refused("neither 0 nor at least 1s")),
            // Refused by the kubelet's decoding.
            ("a number for a duration", format!("{HEAD}shutdownGracePeriod: 30\n"), vec![], Refused("shutdownGracePeriod: not a duration")),
            ("a day is no Go unit", format!("{HEAD}shutdownGracePeriod: 1d\n"), vec![], Refused("not a duration")),
            ("a fraction of a priority", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 1.5, shutdownGracePeriodSeconds: 10}}\n"), vec![], Refused("priority: not a 32-bit integer")),
            ("a priority over 32 bits", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 3e9, shutdownGracePeriodSeconds: 10}}\n"), vec![], Refused("priority: not a 32-bit integer")),
            ("a quoted number", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: \"10\"}}\n"), vec![], Refused("whole number of seconds")),
            ("a list that is not one", format!("{HEAD}shutdownGracePeriodByPodPriority: 10\n"), vec![], Refused("not a list")),
            ("a gate that is not a boolean", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: maybe\n"), vec![], Refused("featureGates.GracefulNodeShutdown: not true or false")),
            ("another gate that is not a boolean", format!("{HEAD}featureGates:\n  SomeGate: 3\n"), vec![], Refused("a gate set to something other")),
            ("no kind", "apiVersion: kubelet.config.k8s.io/v1beta1\nshutdownGracePeriod: 30s\n".into(), vec![], Refused("no kind")),
            ("no apiVersion", "kind: KubeletConfiguration\nshutdownGracePeriod: 30s\n".into(), vec![], Refused("no apiVersion")),
            ("another kind", "apiVersion: v1\nkind: Pod\n".into(), vec![], Refused("its kind is not KubeletConfiguration")),
            ("another version", "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n".into(), vec![], Refused("its apiVersion is not")),
            ("a drop-in without kind", format!("{HEAD}shutdownGracePeriod: 30s\n"), vec!["shutdownGracePeriod: 10s\n"], Refused("0.conf: not a KubeletConfiguration (no kind)")),
            ("an empty file", String::new(), vec![], Refused("config.yaml: empty")),
            ("an empty drop-in", format!("{HEAD}shutdownGracePeriod: 30s\n"), vec![""], Refused("0.conf: empty")),
            ("only a comment", "# nothing\n".into(), vec![], Refused("no kind and apiVersion")),
            ("a list, not a mapping", "- a\n".into(), vec![], Refused("no kind and apiVersion")),
            ("not YAML", format!("{HEAD}shutdownGracePeriod: [1, 2\n"), vec![], Refused("not YAML")),
        ];
        for (name, main, drop_ins, want) in cases {
            let got = verdict_of(main.as_bytes(), &drop_ins);
            match (&want, &got) {
                (On(bands), Verdict::On(got_bands)) => {
                    let bands: Vec<_> = bands.iter().map(|(p, s)| band(*p, *s)).collect();
                    assert_eq!(got_bands, &bands, "{name}");
                }
                (Off, Verdict::Off) => {}
                (Refused(why), Verdict::Refused(got_why))
                | (NotMirrored(why), Verdict::NotMirrored(got_why)) => {
                    assert!(got_why.contains(why), "{name}: {got_why}");
                }
                _ => panic!("{name}: {got:?}"),
            }
        }
    }

    #[test]
    fn byte_order_marks_and_utf16_are_read_as_the_kubelet_reads_them() {
        let text = format!("{HEAD}shutdownGracePeriod: 30s\n");
        let want = Verdict::On(vec![band(0, 30), band(SYSTEM_CRITICAL_PRIORITY, 0)]);
        let bom = [b"\xef\xbb\xbf".as_slice(), text.as_bytes()].concat();
        assert_eq!(verdict_of(&bom, &[]), want);
        let le: Vec<u8> = [0xff, 0xfe]
            .into_iter()
            .chain(text.encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        assert_eq!(verdict_of(&le, &[]), want);
        let be: Vec<u8> = [0xfe, 0xff]
            .into_iter()
            .chain(text.encode_utf16().flat_map(u16::to_be_bytes))
            .collect();
        assert_eq!(verdict_of(&be, &[]), want);
        assert!(
            matches!(verdict_of(b"\xff\x00\xfe", &[]), Verdict::Refused(w) if w.contains("UTF-8"))
        );
    }

    #[test]
    fn go_durations_as_go_parses_them() {
        for (s, ns) in [
            ("30s", 30 * SECOND_NS),
            ("1m30s", 90 * SECOND_NS),
            ("1.5h", 5400 * SECOND_NS),
            ("0", 0),
            ("-0", 0),
            ("0s", 0),
            ("500ms", SECOND_NS / 2),
            ("1500ms", 3 * SECOND_NS / 2),
            ("2h0m0s", 7200 * SECOND_NS),
            ("-5s", -5 * SECOND_NS),
            ("+1s", SECOND_NS),
            (".5s", SECOND_NS / 2),
            ("1.s", SECOND_NS),
            ("1\u{b5}s", 1000),
            ("3ns4us", 4003),
            ("2562047h47m16.854775807s", i64::MAX),
        ] {
            assert_eq!(go_duration(s), Some(ns), "{s}");
        }
        for s in [
            "",
            "30",
            "1d",
            "s",
            "1m30",
            "abc",
            ".s",
            "-",
            "+",
            "1..5s",
            "2562047h47m16.854775808s",
            "9999999999999999999h",
        ] {
            assert_eq!(go_duration(s), None, "{s:?}");
        }
    }

    #[test]
    fn deep_nesting_and_too_many_or_too_large_drop_ins_are_not_read_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let head =
            format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n");
        let config = write(
            dir.path(),
            "config.yaml",
            &format!("{head}x: {}", "[".repeat((1 << 20) - 200)),
        );
        let d = dir.path().join("d");
        std::fs::create_dir(&d).unwrap();
        let start = std::time::Instant::now();
        let read_now = read(Some(&config), Some(&d));
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        assert!(read_now.bands().is_empty() && !read_now.gns_on());
        assert!(
            matches!(&read_now.verdict, Verdict::NotRead(w) if w.contains("nested deeper than 64 levels at line 5 column 68")),
            "{:?}",
            read_now.verdict
        );

        write(dir.path(), "config.yaml", &head);
        for i in 0..=MAX_DROP_INS {
            write(&d, &format!("{i:03}.conf"), HEAD);
        }
        let many = read(Some(&config), Some(&d));
        assert!(
            matches!(&many.verdict, Verdict::NotRead(w) if w.contains("more than the 64 drop-ins read")),
            "{:?}",
            many.verdict
        );

        for i in 0..=MAX_DROP_INS {
            std::fs::remove_file(d.join(format!("{i:03}.conf"))).unwrap();
        }
        let big = format!("{HEAD}#{}\n", "x".repeat(300 << 10));
        for i in 0..4 {
            write(&d, &format!("{i}.conf"), &big);
        }
        let large = read(Some(&config), Some(&d));
        assert!(
            matches!(&large.verdict, Verdict::NotRead(w) if w.contains("3.conf: the kubelet's configuration and drop-ins pass 1 MiB together")),
            "{:?}",
            large.verdict
        );
        std::fs::remove_file(d.join("3.conf")).unwrap();
        assert_eq!(read(Some(&config), Some(&d)).bands().len(), 2);
    }

    #[test]
    fn drop_ins_in_the_kubelets_order_dot_files_and_subdirectories_included() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(
            dir.path(),
            "config.yaml",
            &format!("{HEAD}shutdownGracePeriod: 60s\nshutdownGracePeriodCriticalPods: 20s\n"),
        );
        let d = dir.path().join("kubelet.conf.d");
        std::fs::create_dir_all(d.join("15-sub")).unwrap();
        let crit = |s: &str| format!("{HEAD}shutdownGracePeriodCriticalPods: {s}\n");
        write(&d, "20-late.conf", &crit("10s"));
        write(&d, "10-early.conf", &crit("50s"));
        write(&d, ".05-hidden.conf", &crit("40s"));
        write(&d.join("15-sub"), "a.conf", &crit("30s"));
        write(&d, "30-ignored.yaml", "shutdownGracePeriod: 999s\n");
        let k = read(Some(&main), Some(&d));
        assert_eq!(k.bands(), [band(0, 50), band(SYSTEM_CRITICAL_PRIORITY, 10)]);
        assert_eq!(
            k.files,
            [
                main.clone(),
                d.join(".05-hidden.conf"),
                d.join("10-early.conf"),
                d.join("15-sub/a.conf"),
                d.join("20-late.conf")
            ]
        );
        // A drop-in turning the kubelet's GNS off.
        write(
            &d,
            "40-off.conf",
            &format!("{HEAD}shutdownGracePeriod: 0s\nshutdownGracePeriodCriticalPods: 0s\n"),
        );
        let k = read(Some(&main), Some(&d));
        assert_eq!(k.verdict, Verdict::Off);
        assert!(!k.gns_on() && k.set_aside().is_none());
    }

    #[test]
    fn nothing_there_is_gns_off_and_nothing_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let none = read(
            Some(&dir.path().join("missing.yaml")),
            Some(&dir.path().join("nodir")),
        );
        assert_eq!(none, KubeletShutdown::default());
        assert!(none.set_aside().is_none());
    }

    #[test]
    fn a_file_that_is_no_kubelet_configuration_is_refused_as_the_kubelet_refuses_it() {
        let k = read(Some(Path::new("/proc/self/status")), None);
        assert!(
            matches!(&k.verdict, Verdict::Refused(w) if w.starts_with("/proc/self/status: ")),
            "{:?}",
            k.verdict
        );
        assert!(k
            .set_aside()
            .unwrap()
            .contains("the kubelet refuses it too"));
    }

    #[test]
    fn files_nodegrace_does_not_read_leave_the_kubelets_gns_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let good = write(
            dir.path(),
            "config.yaml",
            &format!("{HEAD}shutdownGracePeriod: 60s\n"),
        );
        let unknown = |k: &KubeletShutdown, what: &str| {
            assert!(k.bands().is_empty() && !k.gns_on(), "{k:?}");
            assert!(
                matches!(&k.verdict, Verdict::NotRead(w) if w.contains(what)),
                "{what}: {:?}",
                k.verdict
            );
            assert!(k.set_aside().unwrap().contains("is not known"));
        };
        // A symlinked file, a symlinked drop-in directory, a symlinked drop-in: not followed.
        let link = dir.path().join("link.yaml");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        unknown(&read(Some(&link), None), "symlink");
        let d = dir.path().join("d");
        std::fs::create_dir(&d).unwrap();
        let dlink = dir.path().join("dlink");
        std::os::unix::fs::symlink(&d, &dlink).unwrap();
        unknown(&read(Some(&good), Some(&dlink)), "symlink");
        std::os::unix::fs::symlink(&good, d.join("10-link.conf")).unwrap();
        unknown(&read(Some(&good), Some(&d)), "10-link.conf");
        // A directory where the file should be.
        unknown(&read(Some(dir.path()), None), "not a regular file");
        // The files themselves are left as they were.
        assert_eq!(
            std::fs::read_to_string(&good).unwrap(),
            format!("{HEAD}shutdownGracePeriod: 60s\n")
        );
    }

    #[test]
    fn no_value_of_the_file_is_quoted_in_a_refusal() {
        let secret = "c2VjcmV0LXRva2VuLXZhbHVl";
        for text in [
            format!("{HEAD}shutdownGracePeriod: {secret}\n"),
            format!("{HEAD}featureGates:\n  X: {secret}\n"),
            format!("{HEAD}shutdownGracePeriodByPodPriority:\n- priority: {secret}\n"),
            format!("{HEAD}token: {secret}\nbad: [unclosed\n"),
        ] {
            let v = verdict_of(text.as_bytes(), &[]);
            assert!(
                matches!(&v, Verdict::Refused(w) if !w.contains(secret)),
                "{v:?}"
            );
        }
    }
}
