//! `nodegrace credentials request` and `nodegrace credentials approve`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::{human, load_settings, runtime};
use crate::cluster::client::{client_for, identity, Role, Timeouts};
use crate::cluster::gateway;
use crate::cluster::identity::{judge, unauthorized, Finding};
use crate::credentials::approve;
use crate::credentials::issue::{self, Issue, Submitted};

/// Options of `nodegrace credentials request`.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    /// How long to wait for the approval.
    pub wait: Duration,
    /// Request even when the current certificate is not due for renewal.
    pub force: bool,
}

/// No read timeout: `request` and `approve --watch` watch for as long as they wait.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(10),
    read: None,
    answer: Some(issue::ANSWER_TIMEOUT),
};

/// `nodegrace credentials request`.
pub fn request_command(config: &Path, opts: &RequestOptions) -> Result<ExitCode> {
    let settings = match load_settings(config) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let node = settings.node_name().context("determining the node name")?;
    let Some(kubeconfig) = settings.node.kubeconfig.clone() else {
        bail!("node.kubeconfig is empty: there is no file to write nodegrace's credential to");
    };
    if let (Some(current), false) = (issue::current(&kubeconfig, &node), opts.force) {
        if current.renew_at() > chrono::Utc::now() {
            let _ = crate::text::print_stdout(&format!(
                "{} already holds {}, valid until {} (due for renewal from {}); --force requests a new one\n",
                kubeconfig.display(),
                current.identity(),
                current.not_after.to_rfc3339(),
                current.renew_at().to_rfc3339()
            ));
            return Ok(ExitCode::SUCCESS);
        }
    }
    let issue = Issue {
        node: node.clone(),
        kubeconfig,
        template: Role::Kubelet.path(&settings).map(Path::to_owned),
        lifetime: settings.node.credential_lifetime,
    };
    runtime()?.block_on(request(&issue, opts.wait))
}

/// Whether `kubelet` (the client of `issue.template`) is this node's kubelet, as the
/// apiserver says: a warning when it is another identity that works.
async fn check_kubelet(kubelet: &kube::Client, issue: &Issue) -> Result<()> {
    match gateway::reply(identity(kubelet).await) {
        Ok((user, groups)) => match judge(Role::Kubelet, &issue.node, &user, &groups) {
            Finding::Expected => Ok(()),
            Finding::Unusual(w) => {
                crate::text::print_stderr(&format!("nodegrace: warning: {w}"));
                Ok(())
            }
            Finding::Unusable(e) => bail!("{e}"),
        },
        Err(f) if f.code() == Some(401) => {
            let path = issue.template.as_deref();
            bail!("{}", unauthorized(Role::Kubelet, path, chrono::Utc::now()))
        }
        Err(f) => Err(f.error).context("asking the apiserver who the kubelet's credential is"),
    }
}

async fn request(issue: &Issue, wait: Duration) -> Result<ExitCode> {
    let kubelet = client_for(issue.template.as_deref(), Role::Kubelet, TIMEOUTS).await?;
    check_kubelet(&kubelet, issue).await?;
    let key = issue::pending_key(issue)?;
    let submitted = issue::submit(&kubelet, issue, &key).await?;
    let name = submitted.name().to_owned();
    crate::text::print_stderr(&format!(
        "{} CertificateSigningRequest {name} for {} ({}), signer {}; waiting up to {} for its approval:\n  kubectl certificate approve {name}",
        match submitted {
            Submitted::Created(_) => "created",
            Submitted::Existing(_) => "found the pending",
        },
        issue.user(),
        crate::cluster::identity::NODEGRACE_GROUP,
        issue::SIGNER,
        human(wait),
    ));
    let Some(cert) = issue::wait_issued(&kubelet, issue, &name, Some(wait)).await? else {
        crate::text::print_stderr(&format!(
            "nodegrace: CertificateSigningRequest {name} was not approved within {}; it stays pending (the controller-manager removes pending requests after 24 hours). Approve it, then run `nodegrace credentials request` again: it picks up the same request.",
            human(wait)
        ));
        return Ok(ExitCode::from(super::EXIT_FAILURE));
    };
    let info = issue::install(issue, &key, &cert)?;
    let client = client_for(Some(&issue.kubeconfig), Role::Nodegrace, TIMEOUTS).await?;
    let (user, groups) = identity(&client)
        .await
        .context("checking the new credential with the apiserver")?;
    if let Finding::Unusable(e) = judge(Role::Nodegrace, &issue.node, &user, &groups) {
        bail!("the new credential does not work: {e}");
    }
    let _ = crate::text::print_stdout(&format!(
        "wrote {} (mode 0600): {} as the apiserver sees it, certificate valid until {}; the daemon uses it within a minute and renews it from {}\n",
        issue.kubeconfig.display(),
        user,
        info.not_after.to_rfc3339(),
        info.renew_at().to_rfc3339()
    ));
    Ok(ExitCode::SUCCESS)
}

/// `nodegrace credentials approve`, with the administrator's kubeconfig.
pub fn approve_command(
    kubeconfig: Option<&Path>,
    opts: &approve::ApproveOptions,
) -> Result<ExitCode> {
    runtime()?.block_on(async {
        let client =
            crate::cluster::client::build(kubeconfig, "the approver's kubeconfig", TIMEOUTS)
                .await?;
        let mut out = |line: &str| {
            let _ = crate::text::print_stdout(&format!("{line}\n"));
        };
        let run = approve::run(client, opts, &mut out);
        if opts.watch {
            tokio::select! {
                r = run => r,
                r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT"),
            }
        } else {
            run.await
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::gateway::testutil::{answering, status_body};

    #[tokio::test]
    async fn a_kubelet_credential_refused_with_401_says_why_and_other_refusals_are_errors() {
        let issue = Issue {
            node: "n1".into(),
            kubeconfig: "/nonexistent/kubeconfig".into(),
            template: None,
            lifetime: Duration::from_secs(3600),
        };
        let kubelet = |code: u16| {
            answering(move |_, _| match code {
                200 => {
                    let user = serde_json::json!({"username": "system:node:n1"});
                    (200, serde_json::json!({"status": {"userInfo": user}}))
                }
                code => (code, status_body(code, "refused")),
            })
        };
        check_kubelet(&kubelet(200), &issue).await.unwrap();
        let err = format!(
            "{:#}",
            check_kubelet(&kubelet(401), &issue).await.unwrap_err()
        );
        assert!(
            err.contains("401 Unauthorized") && err.contains("the kubelet renews"),
            "{err}"
        );
        for code in [403, 500] {
            let err = format!(
                "{:#}",
                check_kubelet(&kubelet(code), &issue).await.unwrap_err()
            );
            assert!(err.contains("who the kubelet's credential is"), "{err}");
        }
    }
}
