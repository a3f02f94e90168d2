//! CRD types: NodeMaintenance and EvictionRequest in `nodegrace.dev/v1alpha1`.

/// `nodegrace crds`.
pub fn crds_command() -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("`crds` is not implemented yet")
}
