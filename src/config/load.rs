//! Reading, merging and validating configuration files into [`Settings`].

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::error::{located, ConfigError};
use super::raw::{Dur, Leaf, Merge, RawBand, RawConfig, RawPlanEntry, RawPolicy};
use super::{CompletionPolicy, DrainPlanEntrySetting, PriorityGracePeriod, Settings};
use crate::fsutil::{read_regular, ReadError, Symlinks, CONFIG_FILE_LIMIT};
use crate::plan::PodType;

/// The result of [`load_report`]: the settings and how they were found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Loaded {
    pub settings: Settings,
    /// Every file that was read, in merge order (main file first, if it exists).
    pub files: Vec<PathBuf>,
    /// The main file does not exist; the settings are the defaults plus any drop-ins.
    pub main_missing: bool,
}

/// One configuration text and the name errors use for it.
#[derive(Debug, Clone)]
pub(crate) struct Fragment {
    pub name: PathBuf,
    pub text: String,
}

impl Fragment {
    pub fn new(name: impl Into<PathBuf>, text: impl Into<String>) -> Self {
        Fragment {
            name: name.into(),
            text: text.into(),
        }
    }
}

/// Loads `main` and the drop-ins `<dir of main>/config.d/*.toml` (see [`load_report`]).
pub fn load(main: &Path) -> Result<Settings, ConfigError> {
    load_report(main).map(|loaded| loaded.settings)
}

/// Loads `main` and the drop-ins `<dir of main>/config.d/*.toml`, merged in byte order of
/// their names after the main file; later files win, tables merge key by key, arrays and
/// scalars replace. Drop-ins whose names start with `.` or do not end in `.toml` are
/// skipped; a drop-in that is a symlink or not a regular file is an error. A missing main
/// file is not an error (a dangling symlink in its place is): the result says so and holds
/// the defaults plus the drop-ins.
pub(crate) fn load_report(main: &Path) -> Result<Loaded, ConfigError> {
    let mut fragments = Vec::new();
    // The main file may be a symlink (configuration management often makes it one).
    let main_missing = match read_regular(main, CONFIG_FILE_LIMIT, Symlinks::Follow) {
        Ok(bytes) => {
            fragments.push(fragment_from_bytes(main, bytes)?);
            false
        }
        // A symlink to nothing is a configuration that went missing, not no configuration.
        Err(ReadError::NotFound) if std::fs::symlink_metadata(main).is_ok() => {
            return Err(ConfigError::file(
                main,
                "cannot read: a symlink to a file that does not exist".to_string(),
            ))
        }
        Err(ReadError::NotFound) => true,
        Err(err) => return Err(ConfigError::file(main, format!("cannot read: {err}"))),
    };
    for path in drop_in_paths(main)? {
        let bytes = read_regular(&path, CONFIG_FILE_LIMIT, Symlinks::Refuse)
            .map_err(|err| ConfigError::file(&path, format!("cannot read: {err}")))?;
        fragments.push(fragment_from_bytes(&path, bytes)?);
    }
    let settings = load_fragments(&fragments)?;
    Ok(Loaded {
        settings,
        files: fragments.into_iter().map(|f| f.name).collect(),
        main_missing,
    })
}

/// Parses one TOML text on top of the defaults; errors name the file `<string>`.
#[cfg(test)]
pub(crate) fn load_str(text: &str) -> Result<Settings, ConfigError> {
    load_fragments(&[Fragment::new("<string>", text)])
}

/// Merges fragments in the given order on top of the defaults and validates the result.
pub(crate) fn load_fragments(fragments: &[Fragment]) -> Result<Settings, ConfigError> {
    let mut merged = RawConfig::default();
    for (index, fragment) in fragments.iter().enumerate() {
        let raw = parse_fragment(fragment)?;
        check_fragment(&Ctx { fragments }, index, &raw)?;
        merged.merge(raw, index);
    }
    build(&Ctx { fragments }, merged)
}

fn fragment_from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Fragment, ConfigError> {
    let text = String::from_utf8(bytes)
        .map_err(|_| ConfigError::file(path, "not valid UTF-8 (TOML files must be UTF-8)"))?;
    Ok(Fragment::new(path, text))
}

fn drop_in_paths(main: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let dir = main
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("config.d");
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => {
            return Err(ConfigError::file(
                &dir,
                format!("cannot list drop-ins: {err}"),
            ))
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|err| ConfigError::file(&dir, format!("cannot list drop-ins: {err}")))?;
        let name = entry.file_name();
        let bytes = name.as_bytes();
        if bytes.starts_with(b".") || !bytes.ends_with(b".toml") {
            continue;
        }
        let path = entry.path();
        let meta = fs::symlink_metadata(&path)
            .map_err(|err| ConfigError::file(&path, format!("cannot stat drop-in: {err}")))?;
        if meta.file_type().is_symlink() {
            return Err(ConfigError::file(
                &path,
                "drop-in is a symlink; copy the file into config.d instead",
            ));
        }
        if !meta.file_type().is_file() {
            return Err(ConfigError::file(&path, "drop-in is not a regular file"));
        }
        names.push(name);
    }
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names.into_iter().map(|name| dir.join(name)).collect())
}

fn parse_fragment(fragment: &Fragment) -> Result<RawConfig, ConfigError> {
    let error = |err: toml::de::Error, key: Option<String>| {
        located(
            fragment.name.clone(),
            &fragment.text,
            err.span().map(|span| span.start),
            key,
            err.message(),
        )
    };
    let tree = DeTable::parse(&fragment.text).map_err(|err| syntax_error(fragment, err))?;
    let deserializer = toml::de::Deserializer::from(tree.clone());
    serde::Deserialize::deserialize(deserializer).map_err(|err| {
        let key = err
            .span()
            .and_then(|span| key_at(tree.get_ref(), span.start));
        error(err, key)
    })
}

/// A TOML syntax error, with the key it happened in when the rest of the file parses.
fn syntax_error(fragment: &Fragment, err: toml::de::Error) -> ConfigError {
    let text = &fragment.text;
    let span = err.span();
    let mut message = err.message().to_string();
    if message == "duplicate key" {
        if let Some(key) = span.clone().and_then(|span| text.get(span)) {
            message = format!("duplicate key `{key}`");
        }
    }
    let (recovered, _) = DeTable::parse_recoverable(text);
    let key = span
        .as_ref()
        .and_then(|span| key_at(recovered.get_ref(), span.start));
    let offset = span
        .map(|span| span.start)
        .or_else(|| spanless_error_line(text, &message));
    located(fragment.name.clone(), text, offset, key, &message)
}

/// Where an error that toml reports without a place (a dotted key nested past its recursion
/// limit) is: the start of the first line up to which the file already fails that way.
fn spanless_error_line(text: &str, message: &str) -> Option<usize> {
    let ends: Vec<usize> = text
        .match_indices('\n')
        .map(|(i, _)| i + 1)
        .chain(std::iter::once(text.len()))
        .collect();
    let fails = |end: usize| matches!(DeTable::parse(&text[..end]), Err(e) if e.span().is_none() && e.message() == message);
    let line = ends.partition_point(|&end| !fails(end));
    if line == ends.len() {
        return None;
    }
    Some(if line == 0 { 0 } else { ends[line - 1] })
}

/// The dotted key of the deepest key or value whose span holds `offset`.
fn key_at(table: &DeTable<'_>, offset: usize) -> Option<String> {
    let mut best: Option<Vec<String>> = None;
    let mut path = Vec::new();
    walk_table(table, offset, &mut path, &mut best);
    best.map(|parts| dotted(&parts))
}

fn dotted(parts: &[String]) -> String {
    let mut out = String::new();
    for part in parts {
        if !out.is_empty() && !part.starts_with('[') {
            out.push('.');
        }
        out.push_str(part);
    }
    out
}

fn holds(span: &Range<usize>, offset: usize) -> bool {
    span.start <= offset && offset < span.end
}

fn consider(path: &[String], best: &mut Option<Vec<String>>) {
    if best.as_ref().is_none_or(|b| b.len() < path.len()) {
        *best = Some(path.to_vec());
    }
}

fn walk_table(
    table: &DeTable<'_>,
    offset: usize,
    path: &mut Vec<String>,
    best: &mut Option<Vec<String>>,
) {
    for (key, value) in table.iter() {
        path.push(quote_key(key.get_ref()));
        if holds(&key.span(), offset) || holds(&value.span(), offset) {
            consider(path, best);
        }
        walk_value(value, offset, path, best);
        path.pop();
    }
}

fn walk_value(
    value: &Spanned<DeValue<'_>>,
    offset: usize,
    path: &mut Vec<String>,
    best: &mut Option<Vec<String>>,
) {
    match value.get_ref() {
        DeValue::Table(table) => walk_table(table, offset, path, best),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(format!("[{i}]"));
                if holds(&item.span(), offset) {
                    consider(path, best);
                }
                walk_value(item, offset, path, best);
                path.pop();
            }
        }
        _ => {}
    }
}

fn quote_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}

/// Locates errors found after parsing: file and span come from the value that set the key.
struct Ctx<'a> {
    fragments: &'a [Fragment],
}

impl Ctx<'_> {
    fn at(&self, file: usize, span: Range<usize>, key: &str, message: &str) -> ConfigError {
        match self.fragments.get(file) {
            Some(fragment) => located(
                fragment.name.clone(),
                &fragment.text,
                Some(span.start),
                Some(key.to_string()),
                message,
            ),
            None => ConfigError {
                file: PathBuf::from("<defaults>"),
                location: None,
                key: Some(key.to_string()),
                message: message.to_string(),
            },
        }
    }

    fn leaf<T>(&self, leaf: &Leaf<T>, key: &str, message: &str) -> ConfigError {
        self.at(leaf.file, leaf.span(), key, message)
    }
}

fn check_fragment(ctx: &Ctx<'_>, index: usize, raw: &RawConfig) -> Result<(), ConfigError> {
    let Some(fallback) = &raw.fallback else {
        return Ok(());
    };
    if let Some(bands) = &fallback.shutdown_grace_period_by_pod_priority {
        let simple = fallback
            .shutdown_grace_period
            .as_ref()
            .map(|_| "shutdown_grace_period")
            .or(fallback
                .shutdown_grace_period_critical_pods
                .as_ref()
                .map(|_| "shutdown_grace_period_critical_pods"));
        if let Some(simple) = simple {
            return Err(ctx.at(
                index,
                bands.span(),
                "fallback.shutdown_grace_period_by_pod_priority",
                &format!(
                    "cannot be combined with fallback.{simple} in the same file; use either \
                     the simple form or the list of bands"
                ),
            ));
        }
    }
    Ok(())
}

const DAY: Duration = super::MAX_SHUTDOWN_DELAY;
const HOUR: Duration = Duration::from_secs(3600);

/// Every duration setting is 0 or at least this: timeouts, back-off caps and grace periods
/// all work in whole seconds or more, and a shorter one would spin or kill at once.
const MIN_DURATION: Duration = Duration::from_secs(1);

/// Bounds of a duration setting (besides [`MIN_DURATION`]); `nonzero` where zero has no
/// sensible meaning.
#[derive(Clone, Copy)]
struct Bounds {
    nonzero: bool,
    max: Duration,
}

fn duration(
    ctx: &Ctx<'_>,
    leaf: &Option<Leaf<Dur>>,
    key: &str,
    bounds: Bounds,
    target: &mut Duration,
) -> Result<(), ConfigError> {
    let Some(leaf) = leaf else { return Ok(()) };
    check_duration(ctx, leaf.file, leaf.span(), key, leaf.get().0, &bounds)?;
    *target = leaf.get().0;
    Ok(())
}

fn check_duration(
    ctx: &Ctx<'_>,
    file: usize,
    span: Range<usize>,
    key: &str,
    value: Duration,
    bounds: &Bounds,
) -> Result<(), ConfigError> {
    if bounds.nonzero && value.is_zero() {
        return Err(ctx.at(
            file,
            span,
            key,
            &format!(
                "must be greater than zero (at least {})",
                humantime::format_duration(MIN_DURATION)
            ),
        ));
    }
    if !value.is_zero() && value < MIN_DURATION {
        return Err(ctx.at(
            file,
            span,
            key,
            &format!(
                "{} is too short; at least {}{}",
                humantime::format_duration(value),
                humantime::format_duration(MIN_DURATION),
                if bounds.nonzero { "" } else { ", or 0" }
            ),
        ));
    }
    if value > bounds.max {
        return Err(ctx.at(
            file,
            span,
            key,
            &format!(
                "{} is too long; at most {}",
                humantime::format_duration(value),
                humantime::format_duration(bounds.max)
            ),
        ));
    }
    Ok(())
}

fn flag(leaf: &Option<Leaf<bool>>, target: &mut bool) {
    if let Some(leaf) = leaf {
        *target = *leaf.get();
    }
}

fn policy(leaf: &Option<Leaf<RawPolicy>>, target: &mut CompletionPolicy) {
    if let Some(leaf) = leaf {
        *target = match leaf.get() {
            RawPolicy::Keep => CompletionPolicy::Keep,
            RawPolicy::Complete => CompletionPolicy::Complete,
        };
    }
}

fn priority(
    ctx: &Ctx<'_>,
    file: usize,
    value: &Spanned<i64>,
    key: &str,
) -> Result<i32, ConfigError> {
    i32::try_from(*value.get_ref()).map_err(|_| {
        ctx.at(
            file,
            value.span(),
            key,
            &format!(
                "{} is out of range; a pod priority is a 32-bit integer ({} to {})",
                value.get_ref(),
                i32::MIN,
                i32::MAX
            ),
        )
    })
}

/// An absolute path without `..`, so that prefix checks between paths are meaningful.
fn check_path(ctx: &Ctx<'_>, leaf: &Leaf<String>, key: &str) -> Result<PathBuf, ConfigError> {
    let path = PathBuf::from(leaf.get());
    if leaf.get().is_empty() {
        return Err(ctx.leaf(leaf, key, "must not be empty"));
    }
    no_control_characters(ctx, leaf, key)?;
    if !path.is_absolute() {
        return Err(ctx.leaf(
            leaf,
            key,
            &format!("{:?} is not an absolute path", leaf.get()),
        ));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(ctx.leaf(leaf, key, "must not contain `..`"));
    }
    Ok(path)
}

/// NUL cannot be in a path or a D-Bus string at all, and a newline or other control
/// character in a name is a mistake that would only show when the value is used.
fn no_control_characters(ctx: &Ctx<'_>, leaf: &Leaf<String>, key: &str) -> Result<(), ConfigError> {
    match leaf.get().chars().find(|c| c.is_control()) {
        Some(c) => Err(ctx.leaf(
            leaf,
            key,
            &format!("must not contain control characters; it contains {c:?}"),
        )),
        None => Ok(()),
    }
}

fn path(
    ctx: &Ctx<'_>,
    leaf: &Option<Leaf<String>>,
    key: &str,
    target: &mut PathBuf,
) -> Result<(), ConfigError> {
    if let Some(leaf) = leaf {
        *target = check_path(ctx, leaf, key)?;
    }
    Ok(())
}

/// RFC 1123 subdomain, as the apiserver requires of Node names.
fn valid_node_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn build(ctx: &Ctx<'_>, raw: RawConfig) -> Result<Settings, ConfigError> {
    let mut s = Settings::default();
    path(ctx, &raw.state_dir, "state_dir", &mut s.state_dir)?;

    if let Some(node) = &raw.node {
        if let Some(leaf) = &node.name {
            if !leaf.get().is_empty() && !valid_node_name(leaf.get()) {
                return Err(ctx.leaf(
                    leaf,
                    "node.name",
                    &format!(
                        "{:?} is not a valid Node name (lowercase letters, digits, '-' and '.'; \
                         empty means the host name)",
                        leaf.get()
                    ),
                ));
            }
            s.node.name = leaf.get().clone();
        }
        if let Some(leaf) = &node.kubeconfig {
            s.node.kubeconfig = if leaf.get().is_empty() {
                None
            } else {
                Some(check_path(ctx, leaf, "node.kubeconfig")?)
            };
        }
        if let Some(leaf) = &node.kubelet_kubeconfig {
            s.node.kubelet_kubeconfig = if leaf.get().is_empty() {
                None
            } else {
                Some(check_path(ctx, leaf, "node.kubelet_kubeconfig")?)
            };
        }
        flag(&node.renew_credential, &mut s.node.renew_credential);
        if let Some(leaf) = &node.credential_lifetime {
            let value = leaf.get().0;
            if value < super::MIN_CREDENTIAL_LIFETIME {
                return Err(ctx.leaf(
                    leaf,
                    "node.credential_lifetime",
                    &format!(
                        "{} is too short; at least {} (the CertificateSigningRequest API's minimum)",
                        humantime::format_duration(value),
                        humantime::format_duration(super::MIN_CREDENTIAL_LIFETIME)
                    ),
                ));
            }
            check_duration(
                ctx,
                leaf.file,
                leaf.span(),
                "node.credential_lifetime",
                value,
                &Bounds {
                    nonzero: true,
                    max: super::MAX_CREDENTIAL_LIFETIME,
                },
            )?;
            s.node.credential_lifetime = value;
        }
    }

    if let Some(sd) = &raw.shutdown {
        let t = &mut s.shutdown;
        duration(
            ctx,
            &sd.max_delay,
            "shutdown.max_delay",
            Bounds {
                nonzero: true,
                max: DAY,
            },
            &mut t.max_delay,
        )?;
        flag(&sd.manage_logind_dropin, &mut t.manage_logind_dropin);
        path(
            ctx,
            &sd.logind_dropin_dir,
            "shutdown.logind_dropin_dir",
            &mut t.logind_dropin_dir,
        )?;
        if let Some(leaf) = &sd.logind_dropin_name {
            no_control_characters(ctx, leaf, "shutdown.logind_dropin_name")?;
            let name = leaf.get();
            if name.contains('/')
                || name.starts_with('.')
                || !name.ends_with(".conf")
                || name.len() <= ".conf".len()
            {
                return Err(ctx.leaf(
                    leaf,
                    "shutdown.logind_dropin_name",
                    &format!("{name:?} must be a plain file name ending in \".conf\" (no '/', not hidden)"),
                ));
            }
            t.logind_dropin_name = name.clone();
        }
        policy(&sd.on_cancel, &mut t.on_cancel);
        policy(&sd.after_boot, &mut t.after_boot);
        duration(
            ctx,
            &sd.stop_drain_timeout,
            "shutdown.stop_drain_timeout",
            Bounds {
                nonzero: true,
                max: Duration::from_secs(110),
            },
            &mut t.stop_drain_timeout,
        )?;
        flag(&sd.warn_kubelet_inhibitor, &mut t.warn_kubelet_inhibitor);
    }

    if let Some(dr) = &raw.drain {
        let t = &mut s.drain;
        if let Some(plan) = &dr.plan {
            t.plan = drain_plan(ctx, plan)?;
        }
        let reserve = Bounds {
            nonzero: false,
            max: HOUR,
        };
        duration(
            ctx,
            &dr.reserve_daemonset,
            "drain.reserve_daemonset",
            reserve,
            &mut t.reserve_daemonset,
        )?;
        duration(
            ctx,
            &dr.reserve_static,
            "drain.reserve_static",
            reserve,
            &mut t.reserve_static,
        )?;
        duration(
            ctx,
            &dr.reserve_critical,
            "drain.reserve_critical",
            reserve,
            &mut t.reserve_critical,
        )?;
        if let Some(leaf) = &dr.critical_priority {
            t.critical_priority = priority(ctx, leaf.file, &leaf.inner, "drain.critical_priority")?;
        }
        duration(
            ctx,
            &dr.eviction_backoff_max,
            "drain.eviction_backoff_max",
            Bounds {
                nonzero: true,
                max: HOUR,
            },
            &mut t.eviction_backoff_max,
        )?;
        duration(
            ctx,
            &dr.eviction_backoff_max_shutdown,
            "drain.eviction_backoff_max_shutdown",
            Bounds {
                nonzero: true,
                max: Duration::from_secs(5 * 60),
            },
            &mut t.eviction_backoff_max_shutdown,
        )?;
        flag(
            &dr.external_eviction_request_controller,
            &mut t.external_eviction_request_controller,
        );
        if let Some(leaf) = &dr.max_concurrent_requests {
            let n = *leaf.get();
            t.max_concurrent_requests = usize::try_from(n)
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| {
                    ctx.leaf(
                        leaf,
                        "drain.max_concurrent_requests",
                        &format!("{n} is out of range (1 to 1000)"),
                    )
                })?;
        }
        duration(
            ctx,
            &dr.volume_detach_timeout,
            "drain.volume_detach_timeout",
            Bounds {
                nonzero: false,
                max: Duration::from_secs(10 * 60),
            },
            &mut t.volume_detach_timeout,
        )?;
    }

    if let Some(fb) = &raw.fallback {
        let t = &mut s.fallback;
        flag(&fb.enabled, &mut t.enabled);
        duration(
            ctx,
            &fb.apiserver_timeout,
            "fallback.apiserver_timeout",
            Bounds {
                nonzero: true,
                max: HOUR,
            },
            &mut t.apiserver_timeout,
        )?;
        if let Some(leaf) = &fb.cri_endpoint {
            no_control_characters(ctx, leaf, "fallback.cri_endpoint")?;
            let socket = leaf.get().strip_prefix("unix://").unwrap_or("");
            if !socket.starts_with('/')
                || Path::new(socket)
                    .components()
                    .any(|c| c == Component::ParentDir)
            {
                return Err(ctx.leaf(
                    leaf,
                    "fallback.cri_endpoint",
                    &format!(
                        "{:?} must be \"unix://\" followed by an absolute socket path",
                        leaf.get()
                    ),
                ));
            }
            t.cri_endpoint = leaf.get().clone();
        }
        flag(&fb.stop_kubelet, &mut t.stop_kubelet);
        if let Some(leaf) = &fb.kubelet_unit {
            no_control_characters(ctx, leaf, "fallback.kubelet_unit")?;
            let unit = leaf.get();
            if unit.contains('/') || !unit.ends_with(".service") || unit.len() <= ".service".len() {
                return Err(ctx.leaf(
                    leaf,
                    "fallback.kubelet_unit",
                    &format!(
                        "{unit:?} must be a systemd service unit name, e.g. \"kubelet.service\""
                    ),
                ));
            }
            t.kubelet_unit = unit.clone();
        }
        if let Some(bands) = &fb.shutdown_grace_period_by_pod_priority {
            t.shutdown_grace_period_by_pod_priority = grace_bands(ctx, bands)?;
        } else if fb.shutdown_grace_period.is_some()
            || fb.shutdown_grace_period_critical_pods.is_some()
        {
            t.shutdown_grace_period_by_pod_priority = simple_grace(ctx, fb)?;
        }
    }

    if let Some(sp) = &raw.static_pods {
        path(
            ctx,
            &sp.manifest_dir,
            "static_pods.manifest_dir",
            &mut s.static_pods.manifest_dir,
        )?;
        path(
            ctx,
            &sp.gate_dir,
            "static_pods.gate_dir",
            &mut s.static_pods.gate_dir,
        )?;
    }
    check_layout(ctx, &raw, &s)?;

    if let Some(metrics) = &raw.metrics {
        if let Some(leaf) = &metrics.listen {
            s.metrics.listen = metrics_listen(ctx, leaf)?;
        }
    }

    check_reserves(ctx, &raw, &s)?;
    Ok(s)
}

/// The error about the first of `candidates` that the files set (the defaults never clash).
fn blame(
    ctx: &Ctx<'_>,
    candidates: &[(Option<&Leaf<String>>, &str)],
    message: &str,
) -> ConfigError {
    match candidates
        .iter()
        .find_map(|(leaf, key)| leaf.map(|l| (l, *key)))
    {
        Some((leaf, key)) => ctx.leaf(leaf, key, message),
        None => ConfigError::file("<defaults>", message),
    }
}

/// What the static pod gate and the state directory need of each other; the daemon (and
/// `nodegrace complete`) refuse to start on anything else, so `check-config` does too.
fn check_layout(ctx: &Ctx<'_>, raw: &RawConfig, s: &Settings) -> Result<(), ConfigError> {
    let sp = raw.static_pods.as_ref();
    let state = (raw.state_dir.as_ref(), "state_dir");
    let manifests = (
        sp.and_then(|sp| sp.manifest_dir.as_ref()),
        "static_pods.manifest_dir",
    );
    let gate = (
        sp.and_then(|sp| sp.gate_dir.as_ref()),
        "static_pods.gate_dir",
    );
    let (state_dir, manifest_dir, gate_dir) = (
        &s.state_dir,
        &s.static_pods.manifest_dir,
        &s.static_pods.gate_dir,
    );
    for (candidate, dir) in [
        (state, state_dir),
        (manifests, manifest_dir),
        (gate, gate_dir),
    ] {
        if dir.parent().is_none() {
            return Err(blame(
                ctx,
                &[candidate],
                "must not be the root directory; give nodegrace a directory of its own",
            ));
        }
    }
    if gate_dir.starts_with(manifest_dir) {
        return Err(blame(
            ctx,
            &[gate, manifests],
            &format!(
                "the gate directory {} must not be the manifest directory {} or inside it \
                 (the kubelet would start gated pods)",
                gate_dir.display(),
                manifest_dir.display()
            ),
        ));
    }
    if manifest_dir.starts_with(gate_dir) {
        return Err(blame(
            ctx,
            &[gate, manifests],
            &format!(
                "the gate directory {} must not contain the manifest directory {} (restoring \
                 static pods would move every pod manifest found in it into the manifest \
                 directory)",
                gate_dir.display(),
                manifest_dir.display()
            ),
        ));
    }
    if state_dir.starts_with(manifest_dir) {
        return Err(blame(
            ctx,
            &[state, manifests],
            &format!(
                "the state directory {} must not be the manifest directory {} or inside it \
                 (the kubelet would read nodegrace's files as manifests)",
                state_dir.display(),
                manifest_dir.display()
            ),
        ));
    }
    if gate_dir == state_dir {
        return Err(blame(
            ctx,
            &[gate, state],
            &format!(
                "the gate directory must not be the state directory {} (its files would be \
                 taken for gated manifests); the default is a directory inside it",
                state_dir.display()
            ),
        ));
    }
    Ok(())
}

fn unreachable_defaults<T>() -> Result<T, ConfigError> {
    Err(ConfigError::file(
        "<defaults>",
        "the built-in defaults are inconsistent",
    ))
}

/// The three reserves come out of the shutdown budget; Default pods need some of it too.
fn check_reserves(ctx: &Ctx<'_>, raw: &RawConfig, s: &Settings) -> Result<(), ConfigError> {
    let d = &s.drain;
    let reserved = d.reserve_daemonset + d.reserve_static + d.reserve_critical;
    if reserved < s.shutdown.max_delay {
        return Ok(());
    }
    let drain = raw.drain.as_ref();
    let culprit = raw
        .shutdown
        .as_ref()
        .and_then(|sd| sd.max_delay.as_ref())
        .map(|leaf| (leaf.file, leaf.span(), "shutdown.max_delay"))
        .into_iter()
        .chain(
            drain
                .and_then(|d| d.reserve_daemonset.as_ref())
                .map(|l| (l.file, l.span(), "drain.reserve_daemonset")),
        )
        .chain(
            drain
                .and_then(|d| d.reserve_static.as_ref())
                .map(|l| (l.file, l.span(), "drain.reserve_static")),
        )
        .chain(
            drain
                .and_then(|d| d.reserve_critical.as_ref())
                .map(|l| (l.file, l.span(), "drain.reserve_critical")),
        )
        .max_by_key(|(file, span, _)| (*file, span.start));
    let Some((file, span, key)) = culprit else {
        return unreachable_defaults();
    };
    Err(ctx.at(
        file,
        span,
        key,
        &format!(
            "the drain reserves add up to {} which leaves nothing of shutdown.max_delay ({}) \
             for ordinary pods",
            humantime::format_duration(reserved),
            humantime::format_duration(s.shutdown.max_delay)
        ),
    ))
}

/// A label name or the name part of a key: 1 to 63 of `[A-Za-z0-9-_.]`, alphanumeric at
/// both ends (what the apiserver accepts; a selector on anything else matches no pod).
fn label_name_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS subdomain (the prefix of a label key): at most 253 characters, dot-separated
/// labels of lowercase alphanumerics and `-`, alphanumeric at both ends.
fn dns_subdomain_ok(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let ok = label_name_ok(name) && prefix.is_none_or(dns_subdomain_ok);
    (!ok).then(|| {
        format!(
            "{:?} is not a label key (an optional DNS subdomain and '/', then 1 to 63 of \
             A-Z a-z 0-9 - _ . starting and ending with a letter or digit)",
            crate::text::escape(key)
        )
    })
}

fn label_value_problem(key: &str, value: &str) -> Option<String> {
    (!value.is_empty() && !label_name_ok(value)).then(|| {
        format!(
            "the value of {:?}, {:?}, is not a label value (empty, or 1 to 63 of A-Z a-z 0-9 \
             - _ . starting and ending with a letter or digit)",
            crate::text::escape(key),
            crate::text::escape(value)
        )
    })
}

/// The most `drain.plan` entries: plans have a handful, and the planner's work (at
/// shutdown too) grows with entries times pods.
pub(crate) const MAX_PLAN_ENTRIES: usize = 64;

fn drain_plan(
    ctx: &Ctx<'_>,
    plan: &Leaf<Vec<Spanned<RawPlanEntry>>>,
) -> Result<Vec<DrainPlanEntrySetting>, ConfigError> {
    if plan.get().len() > MAX_PLAN_ENTRIES {
        return Err(ctx.leaf(
            plan,
            "drain.plan",
            &format!(
                "has {} entries; at most {MAX_PLAN_ENTRIES} are allowed",
                plan.get().len()
            ),
        ));
    }
    let mut out: Vec<DrainPlanEntrySetting> = Vec::new();
    for (i, entry) in plan.get().iter().enumerate() {
        let key = format!("drain.plan[{i}]");
        let raw = entry.get_ref();
        let setting = DrainPlanEntrySetting {
            pod_type: raw
                .pod_type
                .as_ref()
                .map_or(PodType::Default, |t| *t.get_ref()),
            pod_priority: priority(
                ctx,
                plan.file,
                &raw.pod_priority,
                &format!("{key}.pod_priority"),
            )?,
            pod_selector: raw
                .pod_selector
                .as_ref()
                .map(|s| s.get_ref().clone())
                .unwrap_or_default(),
        };
        if let Some(selector) = &raw.pod_selector {
            for (k, v) in selector.get_ref() {
                if let Some(why) = label_key_problem(k).or_else(|| label_value_problem(k, v)) {
                    return Err(ctx.at(
                        plan.file,
                        selector.span(),
                        &format!("{key}.pod_selector"),
                        &why,
                    ));
                }
            }
        }
        if let Some(first) = out.iter().position(|e| *e == setting) {
            return Err(ctx.at(
                plan.file,
                entry.span(),
                &key,
                &format!(
                    "duplicates drain.plan[{first}] (same pod_type, pod_priority and pod_selector)"
                ),
            ));
        }
        out.push(setting);
    }
    Ok(out)
}

fn grace_bands(
    ctx: &Ctx<'_>,
    bands: &Leaf<Vec<Spanned<RawBand>>>,
) -> Result<Vec<PriorityGracePeriod>, ConfigError> {
    const KEY: &str = "fallback.shutdown_grace_period_by_pod_priority";
    if bands.get().is_empty() {
        return Err(ctx.leaf(
            bands,
            KEY,
            "needs at least one band; set fallback.enabled = false to turn the fallback off",
        ));
    }
    let mut out: Vec<PriorityGracePeriod> = Vec::new();
    for (i, band) in bands.get().iter().enumerate() {
        let key = format!("{KEY}[{i}]");
        let raw = band.get_ref();
        let priority = priority(ctx, bands.file, &raw.priority, &format!("{key}.priority"))?;
        let grace = raw.shutdown_grace_period.get_ref().0;
        check_duration(
            ctx,
            bands.file,
            raw.shutdown_grace_period.span(),
            &format!("{key}.shutdown_grace_period"),
            grace,
            &Bounds {
                nonzero: true,
                max: DAY,
            },
        )?;
        if let Some(prev) = out.last() {
            if priority <= prev.priority {
                return Err(ctx.at(
                    bands.file,
                    raw.priority.span(),
                    &format!("{key}.priority"),
                    &format!(
                        "bands must be in strictly ascending priority without duplicates; {priority} follows {}",
                        prev.priority
                    ),
                ));
            }
        }
        out.push(PriorityGracePeriod {
            priority,
            shutdown_grace_period: grace,
        });
    }
    Ok(out)
}

/// The kubelet's conversion of `shutdownGracePeriod` + `shutdownGracePeriodCriticalPods`.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
const DEFAULT_SHUTDOWN_GRACE_PERIOD: Duration = Duration::from_secs(90);
const DEFAULT_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS: Duration = Duration::from_secs(30);

fn simple_grace(
    ctx: &Ctx<'_>,
    fb: &super::raw::RawFallback,
) -> Result<Vec<PriorityGracePeriod>, ConfigError> {
    let total = fb
        .shutdown_grace_period
        .as_ref()
        .map_or(DEFAULT_SHUTDOWN_GRACE_PERIOD, |l| l.get().0);
    let critical = fb
        .shutdown_grace_period_critical_pods
        .as_ref()
        .map_or(DEFAULT_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS, |l| l.get().0);
    let blame = |message: &str| {
        // Point at whichever of the two was written last.
        let total = fb
            .shutdown_grace_period
            .as_ref()
            .map(|l| (l.file, l.span(), "fallback.shutdown_grace_period"));
        let critical = fb.shutdown_grace_period_critical_pods.as_ref().map(|l| {
            (
                l.file,
                l.span(),
                "fallback.shutdown_grace_period_critical_pods",
            )
        });
        match total
            .into_iter()
            .chain(critical)
            .max_by_key(|(file, span, _)| (*file, span.start))
        {
            Some((file, span, key)) => ctx.at(file, span, key, message),
            None => ConfigError::file("<defaults>", message),
        }
    };
    if let Some(leaf) = &fb.shutdown_grace_period {
        check_duration(
            ctx,
            leaf.file,
            leaf.span(),
            "fallback.shutdown_grace_period",
            total,
            &Bounds {
                nonzero: true,
                max: DAY,
            },
        )?;
    }
    if critical.is_zero() {
        return Err(blame(
            "shutdown_grace_period_critical_pods must be greater than zero (critical pods would \
             be killed without a grace period); use the list of bands for other layouts",
        ));
    }
    if critical < MIN_DURATION {
        return Err(blame(&format!(
            "shutdown_grace_period_critical_pods ({}) is too short; at least {}",
            humantime::format_duration(critical),
            humantime::format_duration(MIN_DURATION)
        )));
    }
    if critical >= total {
        return Err(blame(&format!(
            "shutdown_grace_period_critical_pods ({}{}) must be less than shutdown_grace_period \
             ({}{}), which includes it",
            humantime::format_duration(critical),
            if fb.shutdown_grace_period_critical_pods.is_none() {
                ", the default"
            } else {
                ""
            },
            humantime::format_duration(total),
            if fb.shutdown_grace_period.is_none() {
                ", the default"
            } else {
                ""
            },
        )));
    }
    if total - critical < MIN_DURATION {
        return Err(blame(&format!(
            "shutdown_grace_period ({}) leaves other pods {} after \
             shutdown_grace_period_critical_pods; at least {}",
            humantime::format_duration(total),
            humantime::format_duration(total - critical),
            humantime::format_duration(MIN_DURATION)
        )));
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

fn metrics_listen(ctx: &Ctx<'_>, leaf: &Leaf<String>) -> Result<Option<SocketAddr>, ConfigError> {
    let text = leaf.get().trim();
    if text.is_empty() {
        return Ok(None);
    }
    let addr: SocketAddr = text.parse().map_err(|_| {
        ctx.leaf(
            leaf,
            "metrics.listen",
            &format!("{text:?} is not an IP address and port such as \"127.0.0.1:9847\""),
        )
    })?;
    if !addr.ip().is_loopback() {
        return Err(ctx.leaf(
            leaf,
            "metrics.listen",
            &format!(
                "{addr} is not a loopback address; the metrics endpoint has no authentication, \
                 so it only listens on 127.0.0.1 or [::1] (scrape it through a local agent or proxy)"
            ),
        ));
    }
    if addr.port() == 0 {
        return Err(ctx.leaf(leaf, "metrics.listen", "needs a fixed port, not 0"));
    }
    Ok(Some(addr))
}
