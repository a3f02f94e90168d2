//! The two list settings: `drain.plan` and the fallback's bands by pod priority.

use std::time::Duration;

use toml::Spanned;

use super::check::{
    check_duration, label_key_problem, label_value_problem, priority, Bounds, Ctx, DAY,
    MIN_DURATION,
};
use super::error::ConfigError;
use super::raw::{Leaf, RawBand, RawFallback, RawPlanEntry};
use super::{DrainPlanEntrySetting, PriorityGracePeriod};
use crate::plan::PodType;

/// The most `drain.plan` entries: plans have a handful, and the planner's work (at
/// shutdown too) grows with entries times pods.
pub(crate) const MAX_PLAN_ENTRIES: usize = 64;

pub(super) fn drain_plan(
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

pub(super) fn grace_bands(
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

pub(super) fn simple_grace(
    ctx: &Ctx<'_>,
    fb: &RawFallback,
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
