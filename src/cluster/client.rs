//! The apiserver client for this node's identity.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::config::Settings;

/// Builds a client from `node.kubeconfig` (else in-cluster config or `$KUBECONFIG`).
/// `connect_timeout` bounds connects; `read_timeout`, when given, bounds every read, which
/// suits one-shot CLI requests but would cut the daemon's long-running watches.
pub async fn client(
    settings: &Settings,
    connect_timeout: Duration,
    read_timeout: Option<Duration>,
) -> Result<kube::Client> {
    let mut config = match &settings.node.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .with_context(|| format!("cannot use kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no kubeconfig (node.kubeconfig is empty, no in-cluster config, no $KUBECONFIG)",
        )?,
    };
    // kube retries 429/503/504 inside the client by default, for up to many minutes: a PDB
    // refusing an eviction must come back to the drain loop at once, which backs off itself.
    config.default_retry = false;
    config.connect_timeout = Some(connect_timeout);
    if let Some(read) = read_timeout {
        config.read_timeout = Some(read);
        config.write_timeout = Some(read);
    }
    kube::Client::try_from(config).context("cannot build the apiserver client")
}

/// The apiserver URL the client of `settings` talks to, for logs ("in-cluster or
/// $KUBECONFIG" when the configuration does not say).
pub fn endpoint(settings: &Settings) -> String {
    let from_kubeconfig = settings.node.kubeconfig.as_ref().and_then(|path| {
        let kc = kube::config::Kubeconfig::read_from(path).ok()?;
        let context = kc.current_context.as_ref()?;
        let cluster = kc
            .contexts
            .iter()
            .find(|c| &c.name == context)?
            .context
            .as_ref()?
            .cluster
            .clone();
        kc.clusters
            .iter()
            .find(|c| c.name == cluster)?
            .cluster
            .as_ref()?
            .server
            .clone()
    });
    from_kubeconfig.unwrap_or_else(|| "in-cluster or $KUBECONFIG".to_string())
}

/// The user and groups the apiserver authenticates `client` as (a SelfSubjectReview,
/// which every authenticated identity may create).
pub async fn identity(client: &kube::Client) -> Result<(String, Vec<String>)> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let review = api
        .create(
            &kube::api::PostParams::default(),
            &SelfSubjectReview::default(),
        )
        .await
        .context("asking the apiserver who this client is (SelfSubjectReview)")?;
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    Ok((
        user.username.unwrap_or_default(),
        user.groups.unwrap_or_default(),
    ))
}
