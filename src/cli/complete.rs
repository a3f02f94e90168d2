//! `nodegrace complete`: ends this node's shutdown maintenance by hand and brings its static
//! pods back.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use super::{kube_client, load_settings, print_stdout, runtime};
use crate::staticpods::{FsGate, StaticPodGate};

const APISERVER_TIMEOUT: Duration = Duration::from_secs(10);

pub fn complete_command(config: &Path) -> Result<ExitCode> {
    let settings = match load_settings(config) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let node = settings.node_name().context("determining the node name")?;
    let name = crate::api::shutdown_maintenance_name(&node);

    // The maintenance first: while it is active the daemon keeps static pods gated, so
    // restoring them without completing it would be undone.
    let (completed, others) = runtime()?
        .block_on(async {
            let client = kube_client(&settings, APISERVER_TIMEOUT).await?;
            let completed = crate::cluster::complete_shutdown_maintenance(&client, &node)
                .await
                .with_context(|| format!("completing NodeMaintenance {name} (nothing was changed; retry once the apiserver answers)"))?;
            let others = crate::cluster::other_active_maintenances(&client, &node)
                .await
                .with_context(|| format!("finding the other maintenances of {node} (static pods stay gated; run it again once the apiserver answers)"))?;
            anyhow::Ok((completed, others))
        })?;
    let mut out = if completed {
        format!(
            "NodeMaintenance {name}: stage Complete. The daemon uncordons {node} if nodegrace cordoned it and no other maintenance is active.\n"
        )
    } else {
        format!("NodeMaintenance {name}: none (nothing to complete).\n")
    };

    let gate = FsGate::new(&settings.static_pods, &settings.state_dir)
        .context("opening the static pod gate")?;
    gate.recover()
        .context("settling interrupted static pod moves")?;
    let gated = gate.gated().context("listing gated static pods")?;
    if !others.is_empty() {
        // Another maintenance still drains this node: its drain keeps static pods gated
        // (§Uncordon); the daemon restores them when the last one completes.
        out.push_str(&format!(
            "Static pods: {} manifest(s) stay gated while NodeMaintenance {} is active on {node}; the daemon restores them when it completes.\n",
            gated.len(),
            others.join(", ")
        ));
        print_stdout(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let kept = gate.restore_all().context("restoring static pods")?;
    let restored = gated.len().saturating_sub(kept.len());
    out.push_str(&format!(
        "Static pods: {restored} manifest(s) restored to {}.\n",
        settings.static_pods.manifest_dir.display()
    ));
    for name in &kept {
        out.push_str(&format!(
            "  kept in {}: {name} (a file of that name is back in the manifest directory; decide which to keep)\n",
            settings.static_pods.gate_dir.display()
        ));
    }
    print_stdout(&out)?;
    Ok(if kept.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::EXIT_FAILURE)
    })
}
