//! The daemon keeps nodegrace's credential valid: it requests one when `node.kubeconfig`
//! does not exist yet, renews the client certificate once two thirds of its lifetime have
//! passed (or it expired), and exports both credentials' expiry as a metric. The daemon's
//! clients pick the new file up by themselves ([`crate::cluster::client::ReloadingClient`]).
//!
//! A kubeconfig that is not nodegrace's certificate for this node (a token, another
//! identity, a file that cannot be read) is never replaced: that is an operator's choice or
//! mistake, which the start check reports.

use std::time::Duration;

use anyhow::Result;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::issue::{self, Issue, Refused};
use crate::cluster::client::{client_for, Role, Timeouts};
use crate::cluster::kubeconfig::{Credential, KubeconfigFile};
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::plan::backoff::Backoff;

/// How often the credential is looked at while nothing is due.
const RECHECK: Duration = Duration::from_secs(3600);
/// How long one wait for an approval lasts before the credential is looked at again.
const APPROVAL_WAIT: Duration = Duration::from_secs(3600);
/// After a refused request, the next one waits this long (an administrator decided).
const AFTER_REFUSAL: Duration = Duration::from_secs(24 * 3600);
const RETRY_MIN: Duration = Duration::from_secs(60);

/// What to do about the credential in `node.kubeconfig`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Request a certificate now, for this reason.
    Request(String),
    /// Nothing to do before this time.
    WaitUntil(DateTime<Utc>),
    /// Not a credential nodegrace renews (said once).
    LeaveAlone(String),
}

/// Decides from what `node.kubeconfig` holds (`None`: no such file) at `now`.
pub(crate) fn next(node: &str, file: Option<Result<Credential>>, now: DateTime<Utc>) -> Next {
    let user = format!("nodegrace:node:{node}");
    match file {
        None => Next::Request("there is no credential yet".into()),
        Some(Err(err)) => Next::LeaveAlone(format!("it cannot be read ({err:#})")),
        Some(Ok(Credential::Certificate(c))) if c.common_name == user => {
            if c.not_after <= now {
                Next::Request(format!(
                    "its certificate expired at {}",
                    c.not_after.to_rfc3339()
                ))
            } else if c.renew_at() <= now {
                Next::Request(format!(
                    "its certificate expires at {}",
                    c.not_after.to_rfc3339()
                ))
            } else {
                Next::WaitUntil(c.renew_at())
            }
        }
        Some(Ok(Credential::Certificate(c))) => Next::LeaveAlone(format!(
            "its certificate is for {}, not {user}",
            c.common_name
        )),
        Some(Ok(Credential::Other(kind))) => Next::LeaveAlone(format!("it holds a {kind}")),
        Some(Ok(Credential::None)) => Next::LeaveAlone("it holds no credential".into()),
    }
}

fn read(path: &std::path::Path) -> Option<Result<Credential>> {
    if !path.exists() && std::fs::symlink_metadata(path).is_err() {
        return None;
    }
    Some(KubeconfigFile::read(path).and_then(|f| f.credential()))
}

/// Sets the expiry metric of `role`'s credential (cleared when it has no certificate).
pub(crate) fn export_expiry(settings: &Settings, role: Role, metrics: &Metrics) {
    let expiry = role
        .path(settings)
        .and_then(read)
        .and_then(Result::ok)
        .and_then(|c| match c {
            Credential::Certificate(c) => Some(c.not_after),
            _ => None,
        });
    metrics.set_credential_expiry(role.name(), expiry);
}

/// Runs until `stop`: exports the expiry of both credentials and, when
/// `node.renew_credential` is on and `node.kubeconfig` names a file, requests and renews it.
pub(crate) async fn run(
    settings: Settings,
    node: String,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let mut said_leave_alone: Option<String> = None;
    let mut backoff = Backoff::new(RETRY_MIN, RECHECK);
    loop {
        export_expiry(&settings, Role::Nodegrace, &metrics);
        export_expiry(&settings, Role::Kubelet, &metrics);
        let wait = match (&settings.node.kubeconfig, settings.node.renew_credential) {
            (Some(path), true) => {
                let file = tokio::task::spawn_blocking({
                    let path = path.clone();
                    move || read(&path)
                })
                .await
                .unwrap_or(None);
                match next(&node, file, Utc::now()) {
                    Next::WaitUntil(at) => {
                        backoff.reset();
                        (at - Utc::now()).to_std().unwrap_or_default().min(RECHECK)
                    }
                    Next::LeaveAlone(why) => {
                        if said_leave_alone.as_deref() != Some(why.as_str()) {
                            tracing::warn!(node = %node, kubeconfig = %path.display(), "node.kubeconfig is not renewed by nodegrace: {why}");
                            said_leave_alone = Some(why);
                        }
                        RECHECK
                    }
                    Next::Request(why) => {
                        said_leave_alone = None;
                        tracing::info!(node = %node, kubeconfig = %path.display(), "requesting nodegrace's credential: {why}");
                        let issue = Issue {
                            node: node.clone(),
                            kubeconfig: path.clone(),
                            template: Role::Kubelet.path(&settings).map(std::path::Path::to_owned),
                            lifetime: settings.node.credential_lifetime,
                        };
                        let attempt = tokio::select! {
                            () = stop.cancelled() => return,
                            r = renew_once(&issue) => r,
                        };
                        match attempt {
                            Ok(true) => {
                                backoff.reset();
                                Duration::ZERO
                            }
                            Ok(false) => Duration::ZERO,
                            Err(err) if err.downcast_ref::<Refused>().is_some() => {
                                metrics.api_error("credential");
                                tracing::error!(node = %node, error = format!("{err:#}"), retry_in = ?AFTER_REFUSAL, "requesting nodegrace's credential failed");
                                AFTER_REFUSAL
                            }
                            Err(err) => {
                                metrics.api_error("credential");
                                let delay = backoff.next();
                                tracing::warn!(node = %node, error = format!("{err:#}"), retry_in = ?delay, "requesting nodegrace's credential failed");
                                delay
                            }
                        }
                    }
                }
            }
            _ => RECHECK,
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One round: submit (or find) the request and wait up to [`APPROVAL_WAIT`] for it.
/// `Ok(true)`: written; `Ok(false)`: still waiting for an approval.
async fn renew_once(issue: &Issue) -> Result<bool> {
    let kubelet = client_for(
        issue.template.as_deref(),
        Role::Kubelet,
        Timeouts {
            connect: Duration::from_secs(10),
            read: None,
            answer: Some(issue::ANSWER_TIMEOUT),
        },
    )
    .await?;
    let key = issue::pending_key(issue).map_err(read_only_hint)?;
    let submitted = issue::submit(&kubelet, issue, &key).await?;
    let name = submitted.name().to_owned();
    tracing::warn!(node = %issue.node, request = %name, user = %issue.user(), "waiting for an administrator to approve nodegrace's CertificateSigningRequest: kubectl certificate approve {name}");
    match issue::wait_issued(&kubelet, issue, &name, Some(APPROVAL_WAIT)).await? {
        Some(cert) => {
            let info = issue::install(issue, &key, &cert).map_err(read_only_hint)?;
            tracing::info!(node = %issue.node, request = %name, kubeconfig = %issue.kubeconfig.display(), identity = %info.identity(), valid_until = %info.not_after.to_rfc3339(), "nodegrace's credential issued");
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Under the unit's ProtectSystem=strict a directory missing from ReadWritePaths= is
/// read-only: say how to fix that.
fn read_only_hint(err: anyhow::Error) -> anyhow::Error {
    let erofs = err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.raw_os_error() == Some(nix::libc::EROFS))
    });
    if erofs {
        err.context("node.kubeconfig's directory is read-only for the daemon: nodegrace's systemd generator adds it to ReadWritePaths= (node.renew_credential); run `systemctl daemon-reload` and restart nodegrace")
    } else {
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::kubeconfig::CertInfo;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn cert(cn: &str) -> Credential {
        Credential::Certificate(CertInfo {
            common_name: cn.into(),
            organizations: vec!["nodegrace:nodes".into()],
            not_before: at("2030-01-01T00:00:00Z"),
            not_after: at("2030-01-31T00:00:00Z"),
            public_key: vec![],
        })
    }

    #[test]
    fn a_missing_credential_is_requested() {
        assert!(matches!(
            next("n1", None, at("2030-01-02T00:00:00Z")),
            Next::Request(_)
        ));
    }

    #[test]
    fn renewal_waits_for_two_thirds_of_the_lifetime() {
        assert_eq!(
            next(
                "n1",
                Some(Ok(cert("nodegrace:node:n1"))),
                at("2030-01-02T00:00:00Z")
            ),
            Next::WaitUntil(at("2030-01-21T00:00:00Z"))
        );
        assert!(matches!(
            next("n1", Some(Ok(cert("nodegrace:node:n1"))), at("2030-01-21T00:00:00Z")),
            Next::Request(why) if why.contains("expires at 2030-01-31")
        ));
        assert!(matches!(
            next("n1", Some(Ok(cert("nodegrace:node:n1"))), at("2030-02-01T00:00:00Z")),
            Next::Request(why) if why.contains("expired at 2030-01-31")
        ));
    }

    #[test]
    fn what_is_not_nodegraces_certificate_is_left_alone() {
        let now = at("2030-03-01T00:00:00Z");
        assert!(matches!(
            next("n1", Some(Ok(cert("nodegrace:node:n2"))), now),
            Next::LeaveAlone(why) if why.contains("nodegrace:node:n2")
        ));
        assert!(matches!(
            next("n1", Some(Ok(Credential::Other("bearer token"))), now),
            Next::LeaveAlone(_)
        ));
        assert!(matches!(
            next("n1", Some(Err(anyhow::anyhow!("a FIFO, not a regular file"))), now),
            Next::LeaveAlone(why) if why.contains("FIFO")
        ));
    }
}
