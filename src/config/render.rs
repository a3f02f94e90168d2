//! The effective settings as TOML that [`super::load_str`] reads back to the same settings.

use std::path::Path;
use std::time::Duration;

use toml::{Table, Value};

use super::{
    CompletionPolicy, DrainSettings, FallbackSettings, NodeSettings, Settings, ShutdownSettings,
};
use crate::plan::PodType;

fn dur(d: Duration) -> Value {
    // humantime's months and years are averages (30.44 and 365.25 days): whole hours say
    // a long duration exactly, as "8760h".
    if d >= Duration::from_secs(30 * 24 * 3600)
        && d.as_secs().is_multiple_of(3600)
        && d.subsec_nanos() == 0
    {
        return Value::String(format!("{}h", d.as_secs() / 3600));
    }
    Value::String(humantime::format_duration(d).to_string())
}

fn path(p: &Path) -> Value {
    Value::String(p.display().to_string())
}

fn policy(p: CompletionPolicy) -> Value {
    Value::String(
        match p {
            CompletionPolicy::Keep => "keep",
            CompletionPolicy::Complete => "complete",
        }
        .into(),
    )
}

fn pod_type(t: PodType) -> Value {
    Value::String(
        match t {
            PodType::Default => "Default",
            PodType::DaemonSet => "DaemonSet",
            PodType::Static => "Static",
        }
        .into(),
    )
}

fn entries<const N: usize>(entries: [(&str, Value); N]) -> Table {
    entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn table<const N: usize>(fields: [(&str, Value); N]) -> Value {
    Value::Table(entries(fields))
}

/// Every key, defaults included; durations as humantime strings.
pub(crate) fn to_toml_table(s: &Settings) -> Table {
    let static_pods = table([
        ("manifest_dir", path(&s.static_pods.manifest_dir)),
        ("gate_dir", path(&s.static_pods.gate_dir)),
    ]);
    let metrics = table([(
        "listen",
        Value::String(s.metrics.listen.map(|a| a.to_string()).unwrap_or_default()),
    )]);
    let reboot = table([
        ("sentinel", path(&s.reboot.sentinel)),
        (
            "sentinel_command",
            Value::Array(
                s.reboot
                    .sentinel_command
                    .iter()
                    .map(|a| Value::String(a.clone()))
                    .collect(),
            ),
        ),
        ("without_wave", Value::Boolean(s.reboot.without_wave)),
    ]);
    entries([
        ("state_dir", path(&s.state_dir)),
        ("node", node_table(&s.node)),
        ("shutdown", shutdown_table(&s.shutdown)),
        ("drain", drain_table(&s.drain)),
        ("fallback", fallback_table(&s.fallback)),
        ("static_pods", static_pods),
        ("metrics", metrics),
        ("reboot", reboot),
    ])
}

fn node_table(n: &NodeSettings) -> Value {
    table([
        ("name", Value::String(n.name.clone())),
        (
            "kubeconfig",
            n.kubeconfig
                .as_deref()
                .map_or(Value::String(String::new()), path),
        ),
        (
            "kubelet_kubeconfig",
            n.kubelet_kubeconfig
                .as_deref()
                .map_or(Value::String(String::new()), path),
        ),
        ("renew_credential", Value::Boolean(n.renew_credential)),
        ("credential_lifetime", dur(n.credential_lifetime)),
    ])
}

fn shutdown_table(sd: &ShutdownSettings) -> Value {
    table([
        ("max_delay", dur(sd.max_delay)),
        (
            "manage_logind_dropin",
            Value::Boolean(sd.manage_logind_dropin),
        ),
        ("logind_dropin_dir", path(&sd.logind_dropin_dir)),
        (
            "logind_dropin_name",
            Value::String(sd.logind_dropin_name.clone()),
        ),
        ("on_cancel", policy(sd.on_cancel)),
        ("after_boot", policy(sd.after_boot)),
        ("stop_drain_timeout", dur(sd.stop_drain_timeout)),
        (
            "warn_kubelet_inhibitor",
            Value::Boolean(sd.warn_kubelet_inhibitor),
        ),
    ])
}

fn drain_table(d: &DrainSettings) -> Value {
    let plan = d
        .plan
        .iter()
        .map(|e| {
            table([
                ("pod_type", pod_type(e.pod_type)),
                ("pod_priority", Value::Integer(e.pod_priority.into())),
                (
                    "pod_selector",
                    Value::Table(
                        e.pod_selector
                            .iter()
                            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                            .collect(),
                    ),
                ),
            ])
        })
        .collect();
    table([
        ("plan", Value::Array(plan)),
        ("reserve_daemonset", dur(d.reserve_daemonset)),
        ("reserve_static", dur(d.reserve_static)),
        ("reserve_critical", dur(d.reserve_critical)),
        (
            "critical_priority",
            Value::Integer(d.critical_priority.into()),
        ),
        ("eviction_backoff_max", dur(d.eviction_backoff_max)),
        (
            "eviction_backoff_max_shutdown",
            dur(d.eviction_backoff_max_shutdown),
        ),
        (
            "max_concurrent_requests",
            Value::Integer(i64::try_from(d.max_concurrent_requests).unwrap_or(i64::MAX)),
        ),
        ("volume_detach_timeout", dur(d.volume_detach_timeout)),
        (
            "kubelet_root_dir",
            d.kubelet_root_dir
                .as_deref()
                .map_or(Value::String(String::new()), path),
        ),
    ])
}

fn fallback_table(f: &FallbackSettings) -> Value {
    let bands = f
        .shutdown_grace_period_by_pod_priority
        .iter()
        .map(|b| {
            table([
                ("priority", Value::Integer(b.priority.into())),
                ("shutdown_grace_period", dur(b.shutdown_grace_period)),
            ])
        })
        .collect();
    table([
        ("enabled", Value::Boolean(f.enabled)),
        ("apiserver_timeout", dur(f.apiserver_timeout)),
        ("cri_endpoint", Value::String(f.cri_endpoint.clone())),
        ("stop_kubelet", Value::Boolean(f.stop_kubelet)),
        ("kubelet_unit", Value::String(f.kubelet_unit.clone())),
        (
            "kubelet_config",
            f.kubelet_config
                .as_deref()
                .map_or(Value::String(String::new()), path),
        ),
        (
            "kubelet_config_dir",
            f.kubelet_config_dir
                .as_deref()
                .map_or(Value::String(String::new()), path),
        ),
        ("shutdown_grace_period_by_pod_priority", Value::Array(bands)),
    ])
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
