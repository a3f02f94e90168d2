//! Kubeconfig files as nodegrace reads and writes them: bounded reads of regular files,
//! relative paths resolved against the file's directory (as kubectl does), the client
//! certificate's subject and validity, and a self-contained kubeconfig written 0600.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use kube::config::{Kubeconfig, NamedAuthInfo, NamedCluster};

use crate::fsutil::{read_regular, Symlinks, CONFIG_FILE_LIMIT};
use crate::yaml::{Duplicates, Reading};

/// A client certificate's identity and validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertInfo {
    /// Subject CN: the user name the apiserver authenticates.
    pub common_name: String,
    /// Subject O: the groups.
    pub organizations: Vec<String>,
    pub not_before: DateTime<Utc>,
    pub not_after: DateTime<Utc>,
    /// DER SubjectPublicKeyInfo, to match a certificate with its key.
    pub public_key: Vec<u8>,
}

impl CertInfo {
    /// The first certificate in `pem` (a chain may follow it).
    pub(crate) fn from_pem(pem: &[u8]) -> Result<CertInfo> {
        let (_, parsed) =
            x509_parser::pem::parse_x509_pem(pem).context("no PEM certificate found")?;
        let cert = parsed
            .parse_x509()
            .map_err(|e| anyhow::anyhow!("the PEM block is not an X.509 certificate: {e}"))?;
        let subject = cert.subject();
        let text = |attr: &x509_parser::x509::AttributeTypeAndValue| {
            attr.as_str().map(str::to_owned).unwrap_or_default()
        };
        let time = |t: x509_parser::time::ASN1Time| {
            DateTime::<Utc>::from_timestamp(t.timestamp(), 0).unwrap_or_default()
        };
        let common_name = subject
            .iter_common_name()
            .next()
            .map(text)
            .unwrap_or_default();
        let organizations = subject.iter_organization().map(text).collect();
        let info = CertInfo {
            common_name,
            organizations,
            not_before: time(cert.validity().not_before),
            not_after: time(cert.validity().not_after),
            public_key: cert.public_key().raw.to_vec(),
        };
        Ok(info)
    }

    /// When two thirds of the validity have passed: renewing then leaves a third of the
    /// lifetime for the request to be approved (kubelets rotate at 70 to 90 %).
    pub(crate) fn renew_at(&self) -> DateTime<Utc> {
        let lifetime = self.not_after - self.not_before;
        self.not_before + lifetime * 2 / 3
    }

    /// `CN (O, O)` as the apiserver will see it.
    pub(crate) fn identity(&self) -> String {
        if self.organizations.is_empty() {
            self.common_name.clone()
        } else {
            format!("{} ({})", self.common_name, self.organizations.join(", "))
        }
    }
}

/// How the current user of a kubeconfig authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    Certificate(CertInfo),
    /// A bearer token, a token file, an exec plugin or an auth provider: no expiry to read.
    Other(&'static str),
    None,
}

/// A kubeconfig read from disk, with its relative paths made absolute.
#[derive(Debug, Clone)]
pub(crate) struct KubeconfigFile {
    pub path: PathBuf,
    pub config: Kubeconfig,
}

/// kube's parse error of a kubeconfig with its location only: its own quotes the lines
/// around the fault, a token or key among them. None: not a parse error.
pub(crate) fn without_text(err: &kube::config::KubeconfigError) -> Option<String> {
    let kube::config::KubeconfigError::Parse(e) = err else {
        return None;
    };
    let at = e
        .location()
        .map(|l| (l.line() as usize, l.column() as usize));
    Some(crate::text::parse_fault(
        "not valid YAML or not a kubeconfig",
        at,
    ))
}

fn absolute(dir: &Path, file: &mut Option<String>) {
    if let Some(f) = file.as_mut() {
        if !f.is_empty() && Path::new(f.as_str()).is_relative() {
            *f = dir.join(&*f).display().to_string();
        }
    }
}

impl KubeconfigFile {
    /// Reads `path`: a regular file of at most 1 MiB (a FIFO or a device is refused at
    /// once instead of blocking).
    pub(crate) fn read(path: &Path) -> Result<KubeconfigFile> {
        let bytes = read_regular(path, CONFIG_FILE_LIMIT, Symlinks::Follow)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let text =
            String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))?;
        // As kube's `Kubeconfig::from_yaml`, within nodegrace's limits and without the text.
        let documents: Vec<Kubeconfig> =
            crate::yaml::documents(&text, Reading::file(Duplicates::Refused)).map_err(|e| {
                match crate::yaml::limit(&e) {
                    Some(why) => anyhow::anyhow!("{}: not read: {why}", path.display()),
                    None => anyhow::anyhow!(
                        "{} is not a kubeconfig: {}",
                        path.display(),
                        crate::text::yaml_fault(&e)
                    ),
                }
            })?;
        let mut config = documents
            .into_iter()
            .try_fold(Kubeconfig::default(), Kubeconfig::merge)
            .with_context(|| format!("{} is not a kubeconfig", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("/"));
        for c in &mut config.clusters {
            if let Some(cluster) = c.cluster.as_mut() {
                absolute(dir, &mut cluster.certificate_authority);
            }
        }
        for a in &mut config.auth_infos {
            if let Some(auth) = a.auth_info.as_mut() {
                absolute(dir, &mut auth.client_certificate);
                absolute(dir, &mut auth.client_key);
                absolute(dir, &mut auth.token_file);
            }
        }
        Ok(KubeconfigFile {
            path: path.to_owned(),
            config,
        })
    }

    fn context(&self) -> Option<&kube::config::Context> {
        let name = self.config.current_context.as_deref()?;
        self.config
            .contexts
            .iter()
            .find(|c| c.name == name)?
            .context
            .as_ref()
    }

    /// The current context's cluster.
    pub(crate) fn cluster(&self) -> Option<&NamedCluster> {
        let name = &self.context()?.cluster;
        self.config.clusters.iter().find(|c| &c.name == name)
    }

    /// The current context's user.
    pub(crate) fn user(&self) -> Option<&NamedAuthInfo> {
        let name = self.context()?.user.as_deref()?;
        self.config.auth_infos.iter().find(|a| a.name == name)
    }

    pub(crate) fn server(&self) -> Option<&str> {
        self.cluster()?.cluster.as_ref()?.server.as_deref()
    }

    /// What the current user authenticates with; a certificate is read and parsed.
    pub(crate) fn credential(&self) -> Result<Credential> {
        let Some(auth) = self.user().and_then(|u| u.auth_info.as_ref()) else {
            return Ok(Credential::None);
        };
        if let Some(data) = &auth.client_certificate_data {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .with_context(|| {
                    format!(
                        "{}: client-certificate-data is not base64",
                        self.path.display()
                    )
                })?;
            return CertInfo::from_pem(&pem)
                .map(Credential::Certificate)
                .with_context(|| format!("{}: client-certificate-data", self.path.display()));
        }
        if let Some(file) = &auth.client_certificate {
            let pem = read_regular(Path::new(file), CONFIG_FILE_LIMIT, Symlinks::Follow)
                .with_context(|| format!("cannot read client certificate {file}"))?;
            return CertInfo::from_pem(&pem)
                .map(Credential::Certificate)
                .with_context(|| format!("client certificate {file}"));
        }
        Ok(if auth.token.is_some() || auth.token_file.is_some() {
            Credential::Other("bearer token")
        } else if auth.exec.is_some() {
            Credential::Other("exec plugin")
        } else if auth.auth_provider.is_some() {
            Credential::Other("auth provider")
        } else {
            Credential::None
        })
    }

    /// Every file the current context reads (the kubeconfig itself, a certificate, a key, a
    /// CA bundle, a token file): a change to any of them is a changed credential.
    pub(crate) fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.path.clone()];
        if let Some(auth) = self.user().and_then(|u| u.auth_info.as_ref()) {
            for f in [&auth.client_certificate, &auth.client_key, &auth.token_file]
                .into_iter()
                .flatten()
            {
                files.push(PathBuf::from(f));
            }
        }
        if let Some(ca) = self
            .cluster()
            .and_then(|c| c.cluster.as_ref())
            .and_then(|c| c.certificate_authority.as_ref())
        {
            files.push(PathBuf::from(ca));
        }
        files
    }

    /// The current cluster as a self-contained entry: a CA file is embedded.
    pub(crate) fn embedded_cluster(&self) -> Result<kube::config::Cluster> {
        let mut cluster = self
            .cluster()
            .and_then(|c| c.cluster.clone())
            .with_context(|| format!("{} names no current cluster", self.path.display()))?;
        if cluster.server.as_deref().unwrap_or_default().is_empty() {
            bail!("{}: the current cluster has no server", self.path.display());
        }
        if let Some(ca) = cluster.certificate_authority.take() {
            if cluster.certificate_authority_data.is_none() {
                let pem = read_regular(Path::new(&ca), CONFIG_FILE_LIMIT, Symlinks::Follow)
                    .with_context(|| format!("cannot read the cluster CA {ca}"))?;
                cluster.certificate_authority_data =
                    Some(base64::engine::general_purpose::STANDARD.encode(pem));
            }
        }
        Ok(cluster)
    }
}

/// A kubeconfig for `user` at `cluster` with the certificate and key embedded.
pub(crate) fn render(
    cluster: &kube::config::Cluster,
    user: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<String> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let mut c = serde_json::Map::new();
    let mut put = |k: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            c.insert(k.to_owned(), v);
        }
    };
    put("server", cluster.server.clone().map(Into::into));
    put(
        "certificate-authority-data",
        cluster.certificate_authority_data.clone().map(Into::into),
    );
    put(
        "tls-server-name",
        cluster.tls_server_name.clone().map(Into::into),
    );
    put(
        "insecure-skip-tls-verify",
        cluster.insecure_skip_tls_verify.map(Into::into),
    );
    put("proxy-url", cluster.proxy_url.clone().map(Into::into));
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubernetes", "cluster": c}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(cert_pem),
            "client-key-data": b64(key_pem),
        }}],
        "contexts": [{"name": "nodegrace", "context": {"cluster": "kubernetes", "user": user}}],
        "current-context": "nodegrace",
    });
    Ok(format!(
        "# nodegrace's identity on this node ({user}), written by nodegrace; renewed before it expires.\n{}",
        crate::yaml::to_string(&doc)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str, orgs: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        params.not_before = rcgen::date_time_ymd(2030, 1, 1);
        params.not_after = rcgen::date_time_ymd(2031, 1, 1);
        let c = params.self_signed(&key).unwrap();
        (c.pem(), key.serialize_pem())
    }

    #[test]
    fn a_rendered_kubeconfig_reads_back_with_its_identity_and_validity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), "CA PEM").unwrap();
        let cluster = kube::config::Cluster {
            server: Some("https://10.0.0.1:6443".into()),
            certificate_authority: Some("ca.crt".into()),
            ..Default::default()
        };
        // The cluster as a kubelet.conf with a relative CA path names it.
        let kubelet_conf = crate::yaml::to_string(&serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "k", "cluster": cluster}],
            "users": [{"name": "u", "user": {"client-certificate": "pki/c.pem", "client-key": "pki/c.pem"}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "current-context": "c",
        }))
        .unwrap();
        let kubelet = dir.path().join("kubelet.conf");
        std::fs::write(&kubelet, kubelet_conf).unwrap();
        let read = KubeconfigFile::read(&kubelet).unwrap();
        let ca = dir.path().join("ca.crt").display().to_string();
        assert!(read.files().contains(&PathBuf::from(&ca)));
        assert!(read
            .files()
            .contains(&dir.path().join("pki/c.pem").to_path_buf()));
        let embedded = read.embedded_cluster().unwrap();
        assert_eq!(
            embedded.certificate_authority_data.as_deref(),
            Some(
                base64::engine::general_purpose::STANDARD
                    .encode("CA PEM")
                    .as_str()
            )
        );
        assert_eq!(embedded.certificate_authority, None);

        let (crt, key) = cert("nodegrace:node:n1", &["nodegrace:nodes"]);
        let text = render(&embedded, "nodegrace:node:n1", &crt, &key).unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, text).unwrap();
        let written = KubeconfigFile::read(&path).unwrap();
        assert_eq!(written.server(), Some("https://10.0.0.1:6443"));
        let Credential::Certificate(info) = written.credential().unwrap() else {
            panic!("no certificate")
        };
        assert_eq!(info.common_name, "nodegrace:node:n1");
        assert_eq!(info.organizations, ["nodegrace:nodes"]);
        assert_eq!(info.identity(), "nodegrace:node:n1 (nodegrace:nodes)");
        assert_eq!(info.not_after.to_rfc3339(), "2031-01-01T00:00:00+00:00");
        // Two thirds of a year (365 days) after the start.
        assert_eq!(info.renew_at().to_rfc3339(), "2030-09-01T08:00:00+00:00");
        assert_eq!(written.files(), [path]);
    }

    #[test]
    fn tokens_and_plugins_have_no_certificate_to_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kc");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
        )
        .unwrap();
        assert_eq!(
            KubeconfigFile::read(&path).unwrap().credential().unwrap(),
            Credential::Other("bearer token")
        );
    }

    #[test]
    fn a_fifo_or_garbage_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = KubeconfigFile::read(&fifo).unwrap_err();
        assert!(format!("{err:#}").contains("FIFO"), "{err:#}");
        let junk = dir.path().join("junk");
        std::fs::write(&junk, "clusters: 7").unwrap();
        assert!(format!("{:#}", KubeconfigFile::read(&junk).unwrap_err())
            .contains("is not a kubeconfig"));
        let missing = KubeconfigFile::read(&dir.path().join("none")).unwrap_err();
        assert!(
            format!("{missing:#}").contains("no such file"),
            "{missing:#}"
        );
    }
}
