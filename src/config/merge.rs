//! The files of one configuration merged into one tree that still says, for every value,
//! which file set it and where.

use std::ops::Range;
use std::path::PathBuf;

use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::error::{located, ConfigError, Fragment};
use super::Settings;

/// The files merged in order into one tree (later files win: tables merge key by key, arrays
/// and scalars replace), its spans moved to offsets into the files' texts laid end to end
/// (each from `starts`), so that a span alone says which file set a value and where.
pub(super) struct Merged<'a> {
    fragments: &'a [Fragment],
    starts: Vec<usize>,
    tree: DeTable<'a>,
}

const SIMPLE_FORM: [&str; 2] = [
    "shutdown_grace_period",
    "shutdown_grace_period_critical_pods",
];
const BAND_LIST: &str = "shutdown_grace_period_by_pod_priority";

impl<'a> Merged<'a> {
    pub(super) fn parse(fragments: &'a [Fragment]) -> Result<Self, ConfigError> {
        let mut files = Merged {
            fragments,
            starts: Vec::new(),
            tree: DeTable::new(),
        };
        let mut start = 0;
        for fragment in fragments {
            let tree = DeTable::parse(&fragment.text).map_err(|err| syntax_error(fragment, err))?;
            files.starts.push(start);
            files.merge(shift_table(tree.into_inner(), start))?;
            start += fragment.text.len() + 1;
        }
        Ok(files)
    }

    /// The merged files as settings, each value checked as its field says.
    pub(super) fn deserialize(&self) -> Result<Settings, ConfigError> {
        let root = Spanned::new(0..0, self.tree.clone());
        let settings =
            Settings::deserialize(toml::de::Deserializer::from(root)).map_err(|err| {
                let offset = err.span().map(|span| span.start);
                let key = offset.and_then(|offset| key_at(&self.tree, offset));
                self.error(offset, key, err.message())
            })?;
        // serde also reads a list as a section, field by field; the message is serde's own for
        // a list too short to fill one.
        let list = self
            .tree
            .iter()
            .find_map(|(key, value)| match value.get_ref() {
                DeValue::Array(items) if key.get_ref() != "state_dir" => {
                    Some((key, value, items.len()))
                }
                _ => None,
            });
        if let Some((key, value, len)) = list {
            let why = format!(
                "invalid length {len}, expected a table ([{}])",
                key.get_ref()
            );
            return Err(self.error(
                Some(value.span().start),
                Some(key.get_ref().to_string()),
                &why,
            ));
        }
        Ok(settings)
    }

    fn merge(&mut self, later: DeTable<'a>) -> Result<(), ConfigError> {
        if let Some(DeValue::Table(fb)) = later.get("fallback").map(Spanned::get_ref) {
            let simple = SIMPLE_FORM.iter().find(|key| fb.contains_key(**key));
            if let (Some(bands), Some(simple)) = (fb.get(BAND_LIST), simple) {
                let why = format!(
                    "cannot be combined with fallback.{simple} in the same file; use either \
                     the simple form or the list of bands"
                );
                let key = format!("fallback.{BAND_LIST}");
                return Err(self.error(Some(bands.span().start), Some(key), &why));
            }
            // The simple form and the band list are two spellings of one setting: a file that
            // uses one form replaces whatever an earlier file said in the other.
            if let Some(DeValue::Table(earlier)) =
                self.tree.get_mut("fallback").map(Spanned::get_mut)
            {
                if simple.is_some() {
                    earlier.remove(BAND_LIST);
                }
                if fb.contains_key(BAND_LIST) {
                    for key in SIMPLE_FORM {
                        earlier.remove(key);
                    }
                }
            }
        }
        merge_tables(&mut self.tree, later);
        Ok(())
    }

    /// Where the value at a dotted `key` (`drain.plan[1].pod_priority`) is, if a file set it.
    pub(super) fn set(&self, key: &str) -> Option<usize> {
        let mut table = &self.tree;
        let mut parts = key.split('.').peekable();
        loop {
            let part = parts.next()?;
            let (name, index) = match part.split_once('[') {
                Some((name, index)) => (name, Some(index.trim_end_matches(']').parse().ok()?)),
                None => (part, None),
            };
            let mut value = table.get(name)?;
            if let Some(index) = index {
                let DeValue::Array(items) = value.get_ref() else {
                    return None;
                };
                value = items.get::<usize>(index)?;
            }
            if parts.peek().is_none() {
                return Some(value.span().start);
            }
            let DeValue::Table(inner) = value.get_ref() else {
                return None;
            };
            table = inner;
        }
    }

    /// The error about the value at `key`, located where a file set it.
    pub(super) fn at(&self, key: &str, message: &str) -> ConfigError {
        self.error(self.set(key), Some(key.to_string()), message)
    }

    /// The error about whichever of `keys` the files set last.
    pub(super) fn at_last(&self, keys: &[&str], message: &str) -> ConfigError {
        let last = keys
            .iter()
            .filter_map(|key| Some((self.set(key)?, *key)))
            .max();
        let (offset, key) = last.unzip();
        self.error(offset, key.map(String::from), message)
    }

    /// The file that holds `offset`.
    pub(super) fn file_at(&self, offset: usize) -> PathBuf {
        self.locate(offset)
            .map(|(fragment, _)| fragment.name.clone())
            .unwrap_or_default()
    }

    fn locate(&self, offset: usize) -> Option<(&Fragment, usize)> {
        let index = self
            .starts
            .partition_point(|&start| start <= offset)
            .checked_sub(1)?;
        Some((self.fragments.get(index)?, offset - self.starts[index]))
    }

    /// The error at `offset`; without one it is the defaults' (a value no file set).
    fn error(&self, offset: Option<usize>, key: Option<String>, message: &str) -> ConfigError {
        match offset.and_then(|offset| self.locate(offset)) {
            Some((fragment, offset)) => located(
                fragment.name.clone(),
                &fragment.text,
                Some(offset),
                key,
                message,
            ),
            None => located(PathBuf::from("<defaults>"), "", None, key, message),
        }
    }
}

fn merge_tables<'a>(into: &mut DeTable<'a>, later: DeTable<'a>) {
    for (key, value) in later {
        let span = value.span();
        let name: &str = key.get_ref();
        let earlier = match into.get_mut(name).map(Spanned::get_mut) {
            Some(DeValue::Table(earlier)) => Some(earlier),
            _ => None,
        };
        match (earlier, value.into_inner()) {
            (Some(earlier), DeValue::Table(later)) => merge_tables(earlier, later),
            (_, value) => {
                // The key too is the later file's, for errors about it.
                into.remove(name);
                into.insert(key, Spanned::new(span, value));
            }
        }
    }
}

fn shifted<T>(value: Spanned<T>, by: usize, inner: impl FnOnce(T) -> T) -> Spanned<T> {
    let span = value.span();
    Spanned::new(span.start + by..span.end + by, inner(value.into_inner()))
}

fn shift_table(table: DeTable<'_>, by: usize) -> DeTable<'_> {
    table
        .into_iter()
        .map(|(key, value)| (shifted(key, by, |k| k), shift_value(value, by)))
        .collect()
}

fn shift_value(value: Spanned<DeValue<'_>>, by: usize) -> Spanned<DeValue<'_>> {
    shifted(value, by, |value| match value {
        DeValue::Table(table) => DeValue::Table(shift_table(table, by)),
        DeValue::Array(items) => DeValue::Array(
            items
                .into_iter()
                .map(|item| shift_value(item, by))
                .collect(),
        ),
        other => other,
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
