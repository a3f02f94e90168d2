//! `nodegrace complete`: ends this node's shutdown maintenance by hand and brings its static
//! pods back.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use super::{kube_client, load_settings, print_stdout, runtime};
use crate::staticpods::FsGate;
use crate::text::escape;

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
    // An interrupted move that cannot be settled must not keep every other manifest gated:
    // it is reported (and set aside, or left in the journal to retry) and the rest restored.
    let recovery = gate
        .recover_report()
        .context("settling interrupted static pod moves")?;
    let mut attention = false;
    if !recovery.set_aside.is_empty() {
        attention = true;
        out.push_str(&format!(
            "Static pod journal: {} record(s) could not be settled and were set aside in {} (nothing deleted):\n",
            recovery.set_aside.len(),
            gate.set_aside_file().display()
        ));
        for p in &recovery.set_aside {
            out.push_str(&format!(
                "  {}: {}\n",
                escape(&p.file_name),
                escape(&p.reason)
            ));
        }
        out.push_str(
            "  Check the manifest and gate directories for these files; once they are where they belong, the set-aside file can be deleted.\n",
        );
    }
    if !recovery.unsettled.is_empty() {
        attention = true;
        out.push_str(&format!(
            "Static pod journal: {} interrupted move(s) not settled yet (kept in {}; tried again at the next start or `complete`):\n",
            recovery.unsettled.len(),
            gate.journal_file().display()
        ));
        for p in &recovery.unsettled {
            out.push_str(&format!(
                "  {}: {}\n",
                escape(&p.file_name),
                escape(&p.reason)
            ));
        }
    }
    let gated = gate
        .scan(crate::staticpods::Place::Gate)
        .context("listing gated static pods")?;
    let gated = gated.manifests.len() + gated.unparseable.len();
    if !others.is_empty() {
        // Another maintenance still drains this node: its drain keeps static pods gated
        // (§Uncordon); the daemon restores them when the last one completes.
        out.push_str(&format!(
            "Static pods: {} manifest(s) stay gated while NodeMaintenance {} is active on {node}; the daemon restores them when it completes.\n",
            gated,
            others.join(", ")
        ));
        print_stdout(&out)?;
        return Ok(exit(attention));
    }
    let restore = gate.restore_report().context("restoring static pods")?;
    out.push_str(&format!(
        "Static pods: {} manifest(s) restored to {}.\n",
        restore.restored.len(),
        settings.static_pods.manifest_dir.display()
    ));
    for name in &restore.kept_aside {
        out.push_str(&format!(
            "  kept in {}: {} (a file of that name is back in the manifest directory; decide which to keep)\n",
            settings.static_pods.gate_dir.display(),
            escape(name)
        ));
    }
    for p in &restore.failed {
        out.push_str(&format!(
            "  not restored, still in {}: {}: {}\n",
            settings.static_pods.gate_dir.display(),
            escape(&p.file_name),
            escape(&p.reason)
        ));
    }
    attention |= !restore.kept_aside.is_empty() || !restore.failed.is_empty();
    print_stdout(&out)?;
    Ok(exit(attention))
}

/// Success unless something was left for the operator to decide.
fn exit(attention: bool) -> ExitCode {
    if attention {
        ExitCode::from(super::EXIT_FAILURE)
    } else {
        ExitCode::SUCCESS
    }
}
