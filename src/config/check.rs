//! Checking one value and pointing its error at the file, line and key that set it.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Component, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::error::{located, ConfigError, Fragment};
use super::raw::{Dur, Leaf, RawPolicy};
use super::CompletionPolicy;
use crate::plan::names;

/// Locates errors found after parsing: file and span come from the value that set the key.
pub(super) struct Ctx<'a> {
    pub fragments: &'a [Fragment],
}

impl Ctx<'_> {
    pub(crate) fn at(
        &self,
        file: usize,
        span: Range<usize>,
        key: &str,
        message: &str,
    ) -> ConfigError {
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

    pub(crate) fn leaf<T>(&self, leaf: &Leaf<T>, key: &str, message: &str) -> ConfigError {
        self.at(leaf.file, leaf.span(), key, message)
    }
}

pub(super) const DAY: Duration = super::MAX_SHUTDOWN_DELAY;
pub(super) const HOUR: Duration = Duration::from_secs(3600);

/// Every duration setting is 0 or at least this: timeouts, back-off caps and grace periods
/// all work in whole seconds or more, and a shorter one would spin or kill at once.
pub(super) const MIN_DURATION: Duration = Duration::from_secs(1);

/// Bounds of a duration setting (besides [`MIN_DURATION`]); `nonzero` where zero has no
/// sensible meaning.
#[derive(Clone, Copy)]
pub(super) struct Bounds {
    pub nonzero: bool,
    pub max: Duration,
}

pub(super) fn duration(
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

pub(super) fn check_duration(
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

pub(super) fn flag(leaf: &Option<Leaf<bool>>, target: &mut bool) {
    if let Some(leaf) = leaf {
        *target = *leaf.get();
    }
}

pub(super) fn policy(leaf: &Option<Leaf<RawPolicy>>, target: &mut CompletionPolicy) {
    if let Some(leaf) = leaf {
        *target = match leaf.get() {
            RawPolicy::Keep => CompletionPolicy::Keep,
            RawPolicy::Complete => CompletionPolicy::Complete,
        };
    }
}

pub(super) fn priority(
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
pub(super) fn check_path(
    ctx: &Ctx<'_>,
    leaf: &Leaf<String>,
    key: &str,
) -> Result<PathBuf, ConfigError> {
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
pub(super) fn no_control_characters(
    ctx: &Ctx<'_>,
    leaf: &Leaf<String>,
    key: &str,
) -> Result<(), ConfigError> {
    match leaf.get().chars().find(|c| c.is_control()) {
        Some(c) => Err(ctx.leaf(
            leaf,
            key,
            &format!("must not contain control characters; it contains {c:?}"),
        )),
        None => Ok(()),
    }
}

pub(super) fn path(
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

/// The error about the first of `candidates` that the files set (the defaults never clash).
pub(super) fn blame(
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

pub(super) fn unreachable_defaults<T>() -> Result<T, ConfigError> {
    Err(ConfigError::file(
        "<defaults>",
        "the built-in defaults are inconsistent",
    ))
}

pub(super) fn label_key_problem(key: &str) -> Option<String> {
    (!names::is_qualified_name(key)).then(|| {
        format!(
            "{:?} is not a label key (an optional DNS subdomain and '/', then 1 to 63 of \
             A-Z a-z 0-9 - _ . starting and ending with a letter or digit)",
            crate::text::escape(key)
        )
    })
}

pub(super) fn label_value_problem(key: &str, value: &str) -> Option<String> {
    (!names::is_label_value(value)).then(|| {
        format!(
            "the value of {:?}, {:?}, is not a label value (empty, or 1 to 63 of A-Z a-z 0-9 \
             - _ . starting and ending with a letter or digit)",
            crate::text::escape(key),
            crate::text::escape(value)
        )
    })
}

pub(super) fn metrics_listen(
    ctx: &Ctx<'_>,
    leaf: &Leaf<String>,
) -> Result<Option<SocketAddr>, ConfigError> {
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
    if addr.port() == 0 {
        return Err(ctx.leaf(leaf, "metrics.listen", "needs a fixed port, not 0"));
    }
    Ok(Some(addr))
}
