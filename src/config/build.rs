//! From the merged files to [`Settings`]: one builder per section, then the checks that
//! span sections (directory layout, the drain reserves against the shutdown budget).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::check::{
    blame, check_duration, check_path, duration, flag, metrics_listen, no_control_characters, path,
    policy, priority, unreachable_defaults, Bounds, Ctx, DAY, HOUR,
};
use super::error::ConfigError;
use super::lists::{drain_plan, grace_bands, simple_grace};
use super::raw::{Leaf, RawConfig, RawDrain, RawFallback, RawNode, RawShutdown};
use super::{
    BandsSource, DrainSettings, FallbackSettings, NodeSettings, Settings, ShutdownSettings,
};

/// Checks one file on its own (before merging) for what only makes sense per file.
pub(super) fn check_fragment(
    ctx: &Ctx<'_>,
    index: usize,
    raw: &RawConfig,
) -> Result<(), ConfigError> {
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

/// Validates the merged files into [`Settings`], section by section, then the checks that
/// span sections.
pub(super) fn build(ctx: &Ctx<'_>, raw: RawConfig) -> Result<Settings, ConfigError> {
    let mut s = Settings::default();
    path(ctx, &raw.state_dir, "state_dir", &mut s.state_dir)?;
    if let Some(node) = &raw.node {
        node_section(ctx, node, &mut s.node)?;
    }
    if let Some(sd) = &raw.shutdown {
        shutdown_section(ctx, sd, &mut s.shutdown)?;
    }
    if let Some(dr) = &raw.drain {
        drain_section(ctx, dr, &mut s.drain)?;
    }
    if let Some(fb) = &raw.fallback {
        fallback_section(ctx, fb, &mut s.fallback)?;
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

    if let Some(rb) = &raw.reboot {
        path(ctx, &rb.sentinel, "reboot.sentinel", &mut s.reboot.sentinel)?;
        if let Some(leaf) = &rb.sentinel_command {
            if leaf.get().iter().any(|a| a.is_empty() || a.contains('\0')) {
                return Err(ctx.leaf(
                    leaf,
                    "reboot.sentinel_command",
                    "every argument must be a non-empty string without NUL",
                ));
            }
            s.reboot.sentinel_command = leaf.get().clone();
        }
        if let Some(leaf) = &rb.without_wave {
            s.reboot.without_wave = *leaf.get();
        }
    }

    check_reserves(ctx, &raw, &s)?;
    Ok(s)
}

fn node_section(ctx: &Ctx<'_>, node: &RawNode, t: &mut NodeSettings) -> Result<(), ConfigError> {
    if let Some(leaf) = &node.name {
        if !leaf.get().is_empty() && !crate::plan::names::is_dns_subdomain(leaf.get()) {
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
        t.name = leaf.get().clone();
    }
    if let Some(leaf) = &node.kubeconfig {
        t.kubeconfig = if leaf.get().is_empty() {
            None
        } else {
            Some(check_path(ctx, leaf, "node.kubeconfig")?)
        };
    }
    if let Some(leaf) = &node.kubelet_kubeconfig {
        t.kubelet_kubeconfig = if leaf.get().is_empty() {
            None
        } else {
            Some(check_path(ctx, leaf, "node.kubelet_kubeconfig")?)
        };
    }
    flag(&node.renew_credential, &mut t.renew_credential);
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
        t.credential_lifetime = value;
    }
    Ok(())
}

fn shutdown_section(
    ctx: &Ctx<'_>,
    sd: &RawShutdown,
    t: &mut ShutdownSettings,
) -> Result<(), ConfigError> {
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
                &format!(
                    "{name:?} must be a plain file name ending in \".conf\" (no '/', not hidden)"
                ),
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
    Ok(())
}

fn drain_section(ctx: &Ctx<'_>, dr: &RawDrain, t: &mut DrainSettings) -> Result<(), ConfigError> {
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
    optional_path(
        ctx,
        &dr.kubelet_root_dir,
        "drain.kubelet_root_dir",
        &mut t.kubelet_root_dir,
    )
}

/// An absolute path, or None when set empty.
fn optional_path(
    ctx: &Ctx<'_>,
    leaf: &Option<Leaf<String>>,
    key: &str,
    target: &mut Option<PathBuf>,
) -> Result<(), ConfigError> {
    if let Some(leaf) = leaf {
        *target = if leaf.get().is_empty() {
            None
        } else {
            Some(check_path(ctx, leaf, key)?)
        };
    }
    Ok(())
}

fn fallback_section(
    ctx: &Ctx<'_>,
    fb: &RawFallback,
    t: &mut FallbackSettings,
) -> Result<(), ConfigError> {
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
                &format!("{unit:?} must be a systemd service unit name, e.g. \"kubelet.service\""),
            ));
        }
        let essential = unit == "nodegrace.service"
            || unit.starts_with("dbus")
            || unit.starts_with("systemd-")
            || unit == "init.service";
        if essential {
            return Err(ctx.leaf(
                leaf,
                "fallback.kubelet_unit",
                &format!("{unit:?} is not the kubelet: the offline fallback stops this unit, and stopping nodegrace itself, the system bus or a systemd service would end the drain"),
            ));
        }
        t.kubelet_unit = unit.clone();
    }
    if let Some(bands) = &fb.shutdown_grace_period_by_pod_priority {
        t.shutdown_grace_period_by_pod_priority = grace_bands(ctx, bands)?;
        t.bands_from = BandsSource::Nodegrace(ctx.fragments[bands.file].name.clone());
    } else if fb.shutdown_grace_period.is_some() || fb.shutdown_grace_period_critical_pods.is_some()
    {
        t.shutdown_grace_period_by_pod_priority = simple_grace(ctx, fb)?;
        let file = [
            &fb.shutdown_grace_period,
            &fb.shutdown_grace_period_critical_pods,
        ]
        .iter()
        .filter_map(|l| l.as_ref().map(|l| l.file))
        .max()
        .unwrap_or_default();
        t.bands_from = BandsSource::Nodegrace(ctx.fragments[file].name.clone());
    }
    for (leaf, key, target) in [
        (
            &fb.kubelet_config,
            "fallback.kubelet_config",
            &mut t.kubelet_config,
        ),
        (
            &fb.kubelet_config_dir,
            "fallback.kubelet_config_dir",
            &mut t.kubelet_config_dir,
        ),
    ] {
        optional_path(ctx, leaf, key, target)?;
    }
    Ok(())
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
    for (candidate, dir) in [(state, state_dir), (gate, gate_dir)] {
        if let Some(why) = cannot_exist(dir) {
            return Err(blame(ctx, &[candidate], &why));
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

/// Why a directory nodegrace creates and writes to can never be one: it is under a file, or
/// on /proc or /sys (where nothing can be created, or what is there is the kernel's). The
/// deepest parent that exists is what decides, with its symlinks followed; the directory
/// itself being something else is a state to report at run time, not a setting's fault,
/// unless it is a symlink loop, which nothing but an operator's hand can undo.
fn cannot_exist(dir: &std::path::Path) -> Option<String> {
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
