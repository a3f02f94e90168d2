//! The effective settings as TOML that [`super::load`] reads back to the same settings.

use std::time::Duration;

use serde::{Serialize, Serializer};
use toml::{Table, Value};

use super::Settings;

pub(crate) fn dur<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    // humantime's months and years are averages (30.44 and 365.25 days): whole hours say
    // a long duration exactly, as "8760h".
    if *d >= Duration::from_secs(30 * 24 * 3600)
        && d.as_secs().is_multiple_of(3600)
        && d.subsec_nanos() == 0
    {
        return s.serialize_str(&format!("{}h", d.as_secs() / 3600));
    }
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

/// An optional value is written empty when it is None, as it is read.
pub(crate) fn or_empty<T: Serialize, S: Serializer>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => v.serialize(s),
        None => s.serialize_str(""),
    }
}

/// Every key, defaults included; durations as humantime strings.
pub(crate) fn to_toml_table(s: &Settings) -> Table {
    // Every value is a string (paths are read from TOML strings, so UTF-8), a number, a
    // boolean, a list or a table: this cannot fail.
    Table::try_from(s).unwrap_or_default()
}

/// The value at a dotted `key` of a rendered table (`"drain.plan"`).
pub(crate) fn lookup<'a>(table: &'a Table, key: &str) -> Option<&'a Value> {
    let (section, rest) = key.split_once('.').unwrap_or((key, ""));
    let value = table.get(section)?;
    if rest.is_empty() {
        return Some(value);
    }
    lookup(value.as_table()?, rest)
}

/// The effective settings as a TOML document, sections in the order of the documented file.
pub(crate) fn to_toml_string(s: &Settings) -> String {
    let mut all = to_toml_table(s);
    let order = [
        "state_dir",
        "node",
        "shutdown",
        "drain",
        "fallback",
        "static_pods",
        "metrics",
        "reboot",
    ];
    let mut parts = Vec::new();
    for key in order {
        if let Some(value) = all.remove(key) {
            let mut one = Table::new();
            one.insert(key.to_string(), value);
            parts.push(render(&one));
        }
    }
    if !all.is_empty() {
        parts.push(render(&all));
    }
    parts.join("\n")
}

fn render(table: &Table) -> String {
    // Strings, integers, booleans, arrays and tables always serialize.
    toml::to_string_pretty(table).unwrap_or_else(|err| format!("# cannot render: {err}\n"))
}
