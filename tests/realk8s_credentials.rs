//! Real-control-plane tier: `nodegrace credentials request` issues nodegrace's identity from
//! the kubelet's credential (a CertificateSigningRequest the real kube-controller-manager
//! signs once an administrator approves it), and `nodegrace credentials approve` approves a
//! node's request for its own identity but never one node's request for another's.
//!
//! Only with `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

mod real;
mod realk8s;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// The approver approves every node's pending request: the tests that wait for a person's
/// decision run one at a time with it.
static APPROVALS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Node1 {
    admin: Client,
    cp: &'static realk8s::ControlPlane,
    name: String,
    dir: tempfile::TempDir,
}

impl Node1 {
    async fn new(prefix: &str) -> Node1 {
        let cp = realk8s::running_control_plane().await;
        let admin = cp.admin().await;
        let name = realk8s::unique(prefix);
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<Node>::all(admin.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "state_dir = \"{}\"\n[node]\nname = \"{name}\"\nkubeconfig = \"{}\"\nkubelet_kubeconfig = \"{}\"\ncredential_lifetime = \"1h\"\n",
            dir.path().join("state").display(),
            dir.path().join("etc/kubeconfig").display(),
            cp.kubelet_identity(&name).display(),
        );
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        Node1 {
            admin,
            cp,
            name,
            dir,
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("etc/kubeconfig")
    }

    fn request(&self, extra: &[&str]) -> Child {
        Command::new(env!("CARGO_BIN_EXE_nodegrace"))
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .args(["credentials", "request", "--wait", "60s"])
            .args(extra)
            .env_remove("KUBECONFIG")
            .env_remove("NODEGRACE_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The pending request `nodegrace credentials request` made with this node's kubelet
    /// credential, once there is one.
    async fn pending_request(&self) -> CertificateSigningRequest {
        let api: Api<CertificateSigningRequest> = Api::all(self.admin.clone());
        for _ in 0..150 {
            let found = api
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|c| {
                    c.name_any().starts_with("nodegrace-")
                        && c.spec.username.as_deref() == Some(&format!("system:node:{}", self.name))
                        && c.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_none_or(|cs| cs.is_empty())
                });
            if let Some(csr) = found {
                return csr;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("no CertificateSigningRequest by system:node:{}", self.name);
    }

    async fn cleanup(&self) {
        let api: Api<CertificateSigningRequest> = Api::all(self.admin.clone());
        for c in api.list(&ListParams::default()).await.unwrap().items {
            if c.name_any().contains(&self.name) {
                let _ = api.delete(&c.name_any(), &DeleteParams::default()).await;
            }
        }
        let _ = Api::<Node>::all(self.admin.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

fn finish(child: Child) -> (i32, String) {
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

async fn who(kubeconfig: &Path) -> (String, Vec<String>) {
    let client = realk8s::client_from(kubeconfig).await;
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let info = review.status.unwrap().user_info.unwrap();
    (info.username.unwrap(), info.groups.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_made_with_the_kubelet_credential_and_approved_gives_the_node_its_identity() {
    if !realk8s::enabled("realk8s_credentials::a_request_made_with_the_kubelet_credential_and_approved_gives_the_node_its_identity") {
        return;
    }
    let _serial = APPROVALS.lock().await;
    let n = Node1::new("ng-cred").await;
    let child = n.request(&[]);
    let csr = n.pending_request().await;
    assert_eq!(csr.spec.signer_name, "kubernetes.io/kube-apiserver-client");
    assert_eq!(csr.spec.expiration_seconds, Some(3600));
    n.cp.kubectl_ok(&["certificate", "approve", &csr.name_any()]);
    let (code, text) = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert_eq!(code, 0, "{text}");
    let mode = std::fs::metadata(n.kubeconfig())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{text}");
    let (user, groups) = who(&n.kubeconfig()).await;
    assert_eq!(user, format!("nodegrace:node:{}", n.name));
    assert!(groups.contains(&"nodegrace:nodes".to_owned()), "{groups:?}");
    assert!(
        text.contains("(mode 0600)") && text.contains(&user),
        "{text}"
    );

    // `nodegrace status` names the identity and when its certificate expires.
    let status = Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .arg("--config")
        .arg(n.dir.path().join("config.toml"))
        .args(["status", "-o", "json"])
        .env("NODEGRACE_STATUS_FILE", n.dir.path().join("no-daemon.json"))
        .env_remove("NODEGRACE_CONFIG")
        .output()
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_slice(&status.stdout).unwrap_or_else(|e| panic!("{e}: {status:?}"));
    let own = report["credentials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["key"] == "node.kubeconfig")
        .unwrap_or_else(|| panic!("{report:#}"))
        .clone();
    assert_eq!(own["state"], "ok", "{own:#}");
    assert!(own["identity"].as_str().unwrap().contains(&user), "{own:#}");
    let expires: chrono::DateTime<chrono::Utc> =
        own["expiresAt"].as_str().unwrap().parse().unwrap();
    let left = (expires - chrono::Utc::now()).num_minutes();
    assert!(
        (50..=61).contains(&left),
        "the 1h certificate expires in {left} min: {own:#}"
    );

    // Not due for renewal: nothing is requested.
    let (code, text) = finish(n.request(&[]));
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("already holds"), "{text}");

    // A denied renewal is a clear error and keeps the working credential.
    let before = std::fs::read(n.kubeconfig()).unwrap();
    let child = n.request(&["--force"]);
    let csr = n.pending_request().await;
    n.cp.kubectl_ok(&["certificate", "deny", &csr.name_any()]);
    let (code, text) = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("nodegrace:node:{}", n.name)) && text.contains("was denied"),
        "{text}"
    );
    assert_eq!(std::fs::read(n.kubeconfig()).unwrap(), before);
    n.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approver_approves_a_nodes_own_request_only() {
    if !realk8s::enabled("realk8s_credentials::the_approver_approves_a_nodes_own_request_only") {
        return;
    }
    let _serial = APPROVALS.lock().await;
    let a = Node1::new("ng-appr-a").await;
    let b = Node1::new("ng-appr-b").await;
    let kubelet_a = realk8s::client_from(&a.cp.kubelet_identity(&a.name)).await;
    let csrs: Api<CertificateSigningRequest> = Api::all(kubelet_a);
    // Node A's kubelet asks for node B's nodegrace identity (a stolen kubelet credential).
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = nodegrace::request_pem(&b.name, &key).unwrap();
    let theft: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": format!("theft-{}", a.name)},
        "spec": {"request": base64(pem.as_bytes()), "signerName": "kubernetes.io/kube-apiserver-client",
                 "usages": ["digital signature", "client auth"], "expirationSeconds": 3600},
    }))
    .unwrap();
    csrs.create(&PostParams::default(), &theft).await.unwrap();
    let child = a.request(&[]);
    let own = a.pending_request().await;

    let approve = Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .args(["credentials", "approve", "--kubeconfig"])
        .arg(a.cp.admin_kubeconfig())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&approve.stdout).into_owned()
        + &String::from_utf8_lossy(&approve.stderr);
    assert!(approve.status.success(), "{said}");
    let (code, text) = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert_eq!(code, 0, "{text}\napprover: {said}");

    let admin: Api<CertificateSigningRequest> = Api::all(a.admin.clone());
    let conditions = |c: &CertificateSigningRequest| {
        c.status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.type_)
            .collect::<Vec<_>>()
    };
    let own = admin.get(&own.name_any()).await.unwrap();
    assert!(conditions(&own).contains(&"Approved".to_owned()), "{said}");
    let theft = admin.get(&format!("theft-{}", a.name)).await.unwrap();
    assert!(conditions(&theft).is_empty(), "{said}");
    assert!(said.contains(&format!("theft-{}", a.name)), "{said}");
    a.cleanup().await;
    b.cleanup().await;
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// What the daemon checks when it connects (`identity::verify`), against the real
/// apiserver: another node's identity, and a kubelet credential the Node authorizer does not
/// recognise, are one error naming the identity, the key and what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_names_a_wrong_identity_and_a_missing_permission() {
    if !realk8s::enabled(
        "realk8s_credentials::the_daemon_names_a_wrong_identity_and_a_missing_permission",
    ) {
        return;
    }
    let n = Node1::new("ng-ident").await;
    let other = realk8s::unique("ng-ident-other");
    let connect = |nodegrace: PathBuf, kubelet: PathBuf| {
        let node = n.name.clone();
        async move {
            let mut settings = nodegrace::Settings::default();
            settings.node.name = node.clone();
            settings.node.kubeconfig = Some(nodegrace.clone());
            settings.node.kubelet_kubeconfig = Some(kubelet.clone());
            let clients = nodegrace::daemon_clients(&settings, Duration::from_secs(5)).await?;
            nodegrace::verify_identity(
                &clients,
                [Some(nodegrace.as_path()), Some(kubelet.as_path())],
                &node,
            )
            .await
        }
    };
    let own = n.cp.nodegrace_identity(&n.name);
    let kubelet = n.cp.kubelet_identity(&n.name);
    let verified = connect(own.clone(), kubelet.clone())
        .await
        .expect("this node's two identities");
    assert!(
        verified
            .nodegrace
            .starts_with(&format!("nodegrace:node:{}", n.name)),
        "{verified:?}"
    );
    assert!(
        verified
            .kubelet
            .starts_with(&format!("system:node:{}", n.name)),
        "{verified:?}"
    );

    let err = format!(
        "{:#}",
        connect(n.cp.nodegrace_identity(&other), kubelet.clone())
            .await
            .unwrap_err()
    );
    assert!(
        err.contains(&format!("nodegrace:node:{other}"))
            && err.contains(&format!("this node is {}", n.name))
            && err.contains("nodegrace credentials request"),
        "{err}"
    );

    // The kubelet's user name without the system:nodes group: the Node authorizer grants it
    // nothing.
    let groupless = n.dir.path().join("groupless.kubeconfig");
    let minted = Command::new("bash")
        .arg(n.cp.scripts.join("mint-kubeconfig.sh"))
        .args([&format!("system:node:{}", n.name), ""])
        .arg(&groupless)
        .output()
        .unwrap();
    assert!(minted.status.success(), "{minted:?}");
    let err = format!("{:#}", connect(own, groupless).await.unwrap_err());
    assert!(
        err.contains(&format!("system:node:{}", n.name))
            && err.contains("node.kubelet_kubeconfig")
            && err.contains("may not create pods/eviction"),
        "{err}"
    );
    n.cleanup().await;
}
