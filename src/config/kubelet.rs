//! The kubelet's own Graceful Node Shutdown settings, read from its configuration file and
//! its drop-in directory (`--config-dir`, GA in 1.35), so that the offline fallback uses
//! the bands the kubelet would without anyone typing them twice.
//!
//! Nothing here stops nodegrace: a file that cannot be read or understood is a warning,
//! and the whole of the kubelet's configuration is then set aside (a drop-in skipped alone
//! could leave bands the kubelet never used).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml::Value;

use super::PriorityGracePeriod;
use crate::fsutil::{read_regular, ReadError, Symlinks, CONFIG_FILE_LIMIT};

const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// nodegrace's own bound on a band's grace period.
const MAX_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Most drop-ins read (a node has a handful), and most bytes of the file and its drop-ins
/// together: past either the kubelet's configuration is set aside, so that reading it stays
/// well under a second.
const MAX_DROP_INS: usize = 64;
const MAX_TOTAL_BYTES: usize = 4 << 20;

/// What the kubelet's configuration says about its Graceful Node Shutdown.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct KubeletShutdown {
    /// The kubelet's bands in ascending priority; empty: its GNS is off (or nothing was
    /// found).
    pub bands: Vec<PriorityGracePeriod>,
    /// The files read, in merge order.
    pub files: Vec<PathBuf>,
    /// Why the kubelet's configuration was set aside, if it was.
    pub warnings: Vec<String>,
}

impl KubeletShutdown {
    /// The kubelet's own Graceful Node Shutdown is on: it takes a delay inhibitor and kills
    /// pods at a shutdown.
    pub(crate) fn gns_on(&self) -> bool {
        !self.bands.is_empty()
    }
}

/// The fields of `KubeletConfiguration` that matter here, as the files set them (a later
/// file's value replaces an earlier one's, as the kubelet merges its drop-ins).
#[derive(Debug, Default)]
struct Fields {
    grace: Option<Duration>,
    critical: Option<Duration>,
    by_priority: Option<Vec<PriorityGracePeriod>>,
    feature_gate: Option<bool>,
}

/// Reads `config` (the kubelet's `--config`) and the `*.conf` files of `dir` (its
/// `--config-dir`) in name order. A missing file or directory is not a warning: not every
/// node is set up that way.
pub(crate) fn read(config: Option<&Path>, dir: Option<&Path>) -> KubeletShutdown {
    let mut out = KubeletShutdown::default();
    let mut fields = Fields::default();
    let mut paths: Vec<PathBuf> = config.map(Path::to_path_buf).into_iter().collect();
    if let Some(dir) = dir {
        match drop_ins(dir) {
            Ok(list) if list.len() > MAX_DROP_INS => {
                out.warnings.push(format!(
                    "{}: {} drop-ins, more than the {MAX_DROP_INS} read",
                    crate::text::escape(&dir.display().to_string()),
                    list.len()
                ));
                return out;
            }
            Ok(list) => paths.extend(list),
            Err(why) => {
                out.warnings.push(why);
                return out;
            }
        }
    }
    let mut total = 0;
    for path in paths {
        let bytes = match read_regular(&path, CONFIG_FILE_LIMIT, Symlinks::Refuse) {
            Ok(b) if total + b.len() > MAX_TOTAL_BYTES => {
                out.warnings.push(format!(
                    "{}: the kubelet's configuration and drop-ins pass {} MiB together here, more than is read",
                    crate::text::escape(&path.display().to_string()),
                    MAX_TOTAL_BYTES >> 20
                ));
                return KubeletShutdown {
                    warnings: out.warnings,
                    ..KubeletShutdown::default()
                };
            }
            Ok(b) => {
                total += b.len();
                b
            }
            Err(ReadError::NotFound) => continue,
            Err(err) => {
                out.warnings.push(format!(
                    "{}: cannot read: {err}",
                    crate::text::escape(&path.display().to_string())
                ));
                return KubeletShutdown {
                    warnings: out.warnings,
                    ..KubeletShutdown::default()
                };
            }
        };
        if let Err(why) = merge_file(&mut fields, &bytes) {
            out.warnings.push(format!(
                "{}: {why}",
                crate::text::escape(&path.display().to_string())
            ));
            return KubeletShutdown {
                warnings: out.warnings,
                ..KubeletShutdown::default()
            };
        }
        out.files.push(path);
    }
    match effective_bands(&fields) {
        Ok(bands) => out.bands = bands,
        Err(why) => {
            let files: Vec<String> = out
                .files
                .iter()
                .map(|p| crate::text::escape(&p.display().to_string()).into_owned())
                .collect();
            out.warnings.push(format!("{}: {why}", files.join(", ")));
            out.bands.clear();
        }
    }
    out
}

/// The kubelet's drop-ins: `*.conf` in byte order of their names (dot files skipped).
fn drop_ins(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let shown = crate::text::escape(&dir.display().to_string()).into_owned();
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{shown}: cannot read: {e}")),
    };
    if meta.file_type().is_symlink() {
        return Err(format!("{shown}: a symlink, not followed"));
    }
    if !meta.is_dir() {
        return Err(format!("{shown}: not a directory"));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("{shown}: cannot read: {e}"))?;
        let name = entry.file_name();
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str());
        if bytes.starts_with(b".") || !bytes.ends_with(b".conf") {
            continue;
        }
        names.push(name);
    }
    names.sort_by(|a, b| {
        std::os::unix::ffi::OsStrExt::as_bytes(a.as_os_str())
            .cmp(std::os::unix::ffi::OsStrExt::as_bytes(b.as_os_str()))
    });
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

fn merge_file(fields: &mut Fields, bytes: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not valid UTF-8".to_string())?;
    if let Some(at) = crate::yaml::too_deep(text) {
        return Err(format!(
            "not read: flow collections nested deeper than {} levels at {at}",
            crate::yaml::MAX_FLOW_DEPTH
        ));
    }
    let doc: Value = serde_yaml::from_str(text)
        .map_err(|e| format!("not YAML: {}", crate::text::yaml_fault(&e)))?;
    let map = match doc {
        Value::Mapping(m) => m,
        // An empty file.
        Value::Null => return Ok(()),
        _ => return Err("not a KubeletConfiguration (not a mapping)".into()),
    };
    let get = |key: &str| map.get(Value::String(key.into()));
    if let Some(kind) = get("kind") {
        if kind.as_str() != Some("KubeletConfiguration") {
            return Err("its kind is not KubeletConfiguration".into());
        }
    }
    if let Some(v) = get("shutdownGracePeriod") {
        fields.grace = Some(go_duration_value(v).map_err(|e| format!("shutdownGracePeriod: {e}"))?);
    }
    if let Some(v) = get("shutdownGracePeriodCriticalPods") {
        fields.critical = Some(
            go_duration_value(v).map_err(|e| format!("shutdownGracePeriodCriticalPods: {e}"))?,
        );
    }
    if let Some(v) = get("shutdownGracePeriodByPodPriority") {
        fields.by_priority = Some(by_priority(v)?);
    }
    if let Some(gates) = get("featureGates") {
        if let Some(v) = gates.get("GracefulNodeShutdown") {
            fields.feature_gate = Some(
                v.as_bool()
                    .ok_or("featureGates.GracefulNodeShutdown: not true or false")?,
            );
        }
    }
    Ok(())
}

fn by_priority(v: &Value) -> Result<Vec<PriorityGracePeriod>, String> {
    const KEY: &str = "shutdownGracePeriodByPodPriority";
    let list = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Sequence(s) => s,
        _ => return Err(format!("{KEY}: not a list")),
    };
    let mut out = Vec::new();
    for (i, band) in list.iter().enumerate() {
        let priority = band
            .get("priority")
            .and_then(Value::as_i64)
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| format!("{KEY}[{i}].priority: not a 32-bit integer"))?;
        let seconds = band
            .get("shutdownGracePeriodSeconds")
            .and_then(Value::as_i64)
            .and_then(|s| u64::try_from(s).ok())
            .ok_or_else(|| {
                format!("{KEY}[{i}].shutdownGracePeriodSeconds: not a whole number of seconds")
            })?;
        out.push(PriorityGracePeriod {
            priority,
            shutdown_grace_period: Duration::from_secs(seconds),
        });
    }
    Ok(out)
}

/// The bands the kubelet would use (its `shutdownGracePeriodByPodPriority`, or the two
/// bands it makes of `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods`), checked
/// as nodegrace checks its own.
fn effective_bands(f: &Fields) -> Result<Vec<PriorityGracePeriod>, String> {
    if f.feature_gate == Some(false) {
        return Ok(Vec::new());
    }
    let listed = f.by_priority.clone().unwrap_or_default();
    let grace = f.grace.unwrap_or_default();
    let mut bands = if !listed.is_empty() {
        if !grace.is_zero() {
            return Err(
                "both shutdownGracePeriod and shutdownGracePeriodByPodPriority are set (the kubelet refuses that)"
                    .into(),
            );
        }
        listed
    } else if grace.is_zero() {
        return Ok(Vec::new());
    } else {
        let critical = f.critical.unwrap_or_default();
        if critical > grace {
            return Err(format!(
                "shutdownGracePeriodCriticalPods ({critical:?}) is longer than shutdownGracePeriod ({grace:?})"
            ));
        }
        vec![
            PriorityGracePeriod {
                priority: 0,
                shutdown_grace_period: grace - critical,
            },
            PriorityGracePeriod {
                priority: SYSTEM_CRITICAL_PRIORITY,
                shutdown_grace_period: critical,
            },
        ]
    };
    bands.sort_by_key(|b| b.priority);
    for pair in bands.windows(2) {
        if pair[0].priority == pair[1].priority {
            return Err(format!("two bands for priority {}", pair[0].priority));
        }
    }
    for b in &bands {
        let g = b.shutdown_grace_period;
        if g < Duration::from_secs(1) || g > MAX_GRACE {
            return Err(format!(
                "the band of priority {} has a grace period of {g:?}; nodegrace's bands take 1s to 24h",
                b.priority
            ));
        }
    }
    Ok(bands)
}

fn go_duration_value(v: &Value) -> Result<Duration, String> {
    match v {
        Value::String(s) => go_duration(s),
        Value::Null => Ok(Duration::ZERO),
        _ => Err("not a duration string such as \"30s\"".into()),
    }
}

/// A Go `time.Duration` string as the kubelet's configuration holds it: "30s", "1m30s",
/// "1.5h", "0". Negative durations are refused.
pub(crate) fn go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration such as \"30s\" or \"1m30s\"");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_len == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn deep_nesting_and_too_many_or_too_large_drop_ins_are_set_aside_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let head = "kind: KubeletConfiguration\nshutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n";
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
        assert!(read_now.bands.is_empty());
        assert!(
            read_now.warnings[0].contains("nested deeper than 64 levels at line 4 column 68"),
            "{:?}",
            read_now.warnings
        );

        write(dir.path(), "config.yaml", head);
        for i in 0..=MAX_DROP_INS {
            write(&d, &format!("{i:03}.conf"), "kind: KubeletConfiguration\n");
        }
        let many = read(Some(&config), Some(&d));
        assert!(many.bands.is_empty());
        assert!(
            many.warnings[0].contains("65 drop-ins, more than the 64 read"),
            "{:?}",
            many.warnings
        );

        for i in 0..=MAX_DROP_INS {
            std::fs::remove_file(d.join(format!("{i:03}.conf"))).unwrap();
        }
        let big = format!("kind: KubeletConfiguration\n#{}\n", "x".repeat(900 << 10));
        for i in 0..5 {
            write(&d, &format!("{i}.conf"), &big);
        }
        let large = read(Some(&config), Some(&d));
        assert!(large.bands.is_empty());
        assert!(
            large.warnings[0]
                .contains("4.conf: the kubelet's configuration and drop-ins pass 4 MiB together"),
            "{:?}",
            large.warnings
        );
        std::fs::remove_file(d.join("4.conf")).unwrap();
        assert_eq!(read(Some(&config), Some(&d)).bands.len(), 2);
    }

    #[test]
    fn go_durations_as_the_kubelet_writes_them() {
        for (s, secs) in [
            ("30s", 30.0),
            ("1m30s", 90.0),
            ("1.5h", 5400.0),
            ("0", 0.0),
            ("0s", 0.0),
            ("500ms", 0.5),
            ("2h0m0s", 7200.0),
        ] {
            assert_eq!(
                go_duration(s).unwrap(),
                Duration::from_secs_f64(secs),
                "{s}"
            );
        }
        for s in ["", "30", "-5s", "1d", "s", "1m30", "abc"] {
            assert!(go_duration(s).is_err(), "{s:?}");
        }
    }

    #[test]
    fn the_band_list_is_read_and_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(
            dir.path(),
            "config.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             shutdownGracePeriodByPodPriority:\n\
             - priority: 100000\n  shutdownGracePeriodSeconds: 20\n\
             - priority: 0\n  shutdownGracePeriodSeconds: 120\n",
        );
        let k = read(Some(&main), None);
        assert_eq!(k.bands, [band(0, 120), band(100000, 20)]);
        assert_eq!(k.files, [main]);
        assert!(k.warnings.is_empty());
        assert!(k.gns_on());
    }

    #[test]
    fn the_two_fields_become_the_kubelets_two_bands() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(
            dir.path(),
            "config.yaml",
            "kind: KubeletConfiguration\nshutdownGracePeriod: 2m\nshutdownGracePeriodCriticalPods: 30s\n",
        );
        assert_eq!(
            read(Some(&main), None).bands,
            [band(0, 90), band(SYSTEM_CRITICAL_PRIORITY, 30)]
        );
    }

    #[test]
    fn drop_ins_override_in_name_order_and_only_conf_files_count() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(
            dir.path(),
            "config.yaml",
            "kind: KubeletConfiguration\nshutdownGracePeriod: 60s\nshutdownGracePeriodCriticalPods: 20s\n",
        );
        let d = dir.path().join("kubelet.conf.d");
        std::fs::create_dir(&d).unwrap();
        write(
            &d,
            "20-late.conf",
            "kind: KubeletConfiguration\nshutdownGracePeriodCriticalPods: 10s\n",
        );
        write(
            &d,
            "10-early.conf",
            "kind: KubeletConfiguration\nshutdownGracePeriodCriticalPods: 50s\n",
        );
        write(&d, "30-ignored.yaml", "shutdownGracePeriod: 999s\n");
        write(&d, ".hidden.conf", "shutdownGracePeriod: 999s\n");
        let k = read(Some(&main), Some(&d));
        assert_eq!(k.bands, [band(0, 50), band(SYSTEM_CRITICAL_PRIORITY, 10)]);
        assert_eq!(
            k.files,
            [
                main.clone(),
                d.join("10-early.conf"),
                d.join("20-late.conf")
            ]
        );
        // A drop-in turning the kubelet's GNS off.
        write(&d, "40-off.conf", "shutdownGracePeriod: 0s\n");
        let k = read(Some(&main), Some(&d));
        assert!(k.bands.is_empty() && !k.gns_on() && k.warnings.is_empty());
    }

    #[test]
    fn gns_off_or_absent_gives_no_bands_and_no_warning() {
        let dir = tempfile::tempdir().unwrap();
        let none = read(
            Some(&dir.path().join("missing.yaml")),
            Some(&dir.path().join("nodir")),
        );
        assert_eq!(none, KubeletShutdown::default());
        let off = write(
            dir.path(),
            "off.yaml",
            "kind: KubeletConfiguration\nshutdownGracePeriod: 0s\n",
        );
        assert!(read(Some(&off), None).bands.is_empty());
        let gate = write(
            dir.path(),
            "gate.yaml",
            "shutdownGracePeriod: 30s\nfeatureGates:\n  GracefulNodeShutdown: false\n",
        );
        assert!(read(Some(&gate), None).bands.is_empty());
        let empty = write(dir.path(), "empty.yaml", "");
        assert_eq!(read(Some(&empty), None).warnings, Vec::<String>::new());
    }

    #[test]
    fn bad_input_is_a_warning_and_sets_the_whole_configuration_aside() {
        let dir = tempfile::tempdir().unwrap();
        let good = write(dir.path(), "config.yaml", "shutdownGracePeriod: 60s\n");
        let cases: Vec<(PathBuf, &str)> = vec![
            (write(dir.path(), "bad.yaml", "shutdownGracePeriod: [1, 2\n"), "not YAML"),
            (write(dir.path(), "kind.yaml", "kind: Pod\n"), "not KubeletConfiguration"),
            (write(dir.path(), "dur.yaml", "shutdownGracePeriod: 30\n"), "shutdownGracePeriod"),
            (
                write(dir.path(), "both.yaml", "shutdownGracePeriod: 30s\nshutdownGracePeriodByPodPriority:\n- priority: 0\n  shutdownGracePeriodSeconds: 10\n"),
                "both",
            ),
            (
                write(dir.path(), "crit.yaml", "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 40s\n"),
                "longer than",
            ),
            (
                write(dir.path(), "neg.yaml", "shutdownGracePeriodByPodPriority:\n- priority: 0\n  shutdownGracePeriodSeconds: -1\n"),
                "whole number",
            ),
            (write(dir.path(), "bin.yaml", "\u{0}\u{ff}"), ""),
        ];
        for (path, why) in cases {
            let k = read(Some(&path), None);
            assert!(k.bands.is_empty(), "{path:?}");
            assert_eq!(k.warnings.len(), 1, "{path:?}: {:?}", k.warnings);
            assert!(k.warnings[0].contains(why), "{path:?}: {:?}", k.warnings);
        }
        // A symlinked file, a symlinked or unreadable drop-in directory: not followed.
        let link = dir.path().join("link.yaml");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let k = read(Some(&link), None);
        assert!(k.bands.is_empty());
        assert!(k.warnings[0].contains("symlink"), "{:?}", k.warnings);
        let d = dir.path().join("d");
        std::fs::create_dir(&d).unwrap();
        let dlink = dir.path().join("dlink");
        std::os::unix::fs::symlink(&d, &dlink).unwrap();
        let k = read(Some(&good), Some(&dlink));
        assert!(k.bands.is_empty());
        assert!(k.warnings[0].contains("symlink"), "{:?}", k.warnings);
        std::os::unix::fs::symlink(&good, d.join("10-link.conf")).unwrap();
        let k = read(Some(&good), Some(&d));
        assert!(k.bands.is_empty());
        assert!(k.warnings[0].contains("10-link.conf"), "{:?}", k.warnings);
        // A directory where the file should be.
        let k = read(Some(dir.path()), None);
        assert!(
            k.warnings[0].contains("not a regular file"),
            "{:?}",
            k.warnings
        );
        // The files themselves are left as they were.
        assert_eq!(
            std::fs::read_to_string(&good).unwrap(),
            "shutdownGracePeriod: 60s\n"
        );
    }
}
