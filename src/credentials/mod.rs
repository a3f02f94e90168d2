//! nodegrace's identity on a node (`nodegrace:node:<node>` in `nodegrace:nodes`): issued
//! from the kubelet's credential through a CertificateSigningRequest, renewed by the
//! daemon, and approved by an administrator or the opt-in approver.
//!
//! - `cluster::kubeconfig`: reading kubeconfigs (identity and expiry of a client
//!   certificate) and writing nodegrace's.
//! - [`issue`]: the key, the request, waiting for it, writing the kubeconfig.
//! - [`renew`]: the daemon's renewal and the expiry metric.
//! - [`approve`]: the approver behind `nodegrace credentials approve`.
//!
//! The two commands themselves are in `cli/credentials.rs`.

pub(crate) mod approve;
pub(crate) mod issue;
pub(crate) mod renew;
