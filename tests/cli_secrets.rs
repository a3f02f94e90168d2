//! No secret in an error: every file class that may hold a credential (nodegrace's and the
//! kubelet's kubeconfig, `$KUBECONFIG`, the certificate and key files a kubeconfig names, the
//! kubelet's configuration and its drop-ins, static pod manifests, `plan --pods` input) is
//! broken right after a token and a private key, and every command that reads it is run: the
//! error names the file, line and column, and neither secret appears in any output.

mod cli_support;

use std::process::{Command, Output};

use base64::Engine as _;
use cli_support::{refused_port, CliEnv};

const TOKEN: &str = "abcdef.0123456789abcdef";

struct Secrets {
    key_pem: String,
    /// Pieces of the key as it appears in files: its PEM body and its base64 (`*-data`).
    pieces: Vec<String>,
}

fn secrets() -> Secrets {
    let key_pem = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let body: String = key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let data = base64::engine::general_purpose::STANDARD.encode(&key_pem);
    let pieces = vec![
        TOKEN.to_string(),
        body[..16].to_string(),
        body[40..56].to_string(),
        data[40..56].to_string(),
    ];
    Secrets { key_pem, pieces }
}

/// A YAML file whose fault comes right after a token and a key (in both spellings).
fn broken_yaml(s: &Secrets, head: &str) -> String {
    let data = base64::engine::general_purpose::STANDARD.encode(&s.key_pem);
    let pem_block: String = s.key_pem.lines().map(|l| format!("      {l}\n")).collect();
    format!("{head}users:\n- name: u\n  user:\n    token: {TOKEN}\n    client-key-data: {data}\n    key: |\n{pem_block}    bad: [unclosed\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n")
}

fn assert_no_secret(s: &Secrets, what: &str, out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for piece in &s.pieces {
        assert!(
            !text.contains(piece.as_str()),
            "{what}: {piece:?} is printed:\n{text}"
        );
    }
    text
}

/// The error says where in the file it went wrong.
fn located(text: &str) -> bool {
    text.contains(" at line ") && text.contains("(the file's text is not shown)")
}

fn set_node_key(env: &CliEnv, line: &str) {
    let config = env.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replacen("[node]\n", &format!("[node]\n{line}\n"), 1);
    std::fs::write(&config, text).unwrap();
}

fn env() -> CliEnv {
    CliEnv::new(&format!("https://127.0.0.1:{}", refused_port()), "15m", "")
}

#[test]
fn broken_kubeconfigs_are_located_not_quoted() {
    let s = secrets();
    // nodegrace's own kubeconfig, the kubelet's too.
    let env = env();
    set_node_key(&env, "kubelet_kubeconfig = \"\"");
    std::fs::write(
        env.path("kubeconfig"),
        broken_yaml(&s, "apiVersion: v1\nkind: Config\n"),
    )
    .unwrap();
    for args in [
        &["status"][..],
        &["plan"],
        &["complete"],
        &["credentials", "request", "--wait", "1s"],
    ] {
        let out = env.run(args);
        let text = assert_no_secret(&s, &format!("{args:?}"), &out);
        assert!(
            text.contains("is not a kubeconfig") && located(&text),
            "{args:?}: {text}"
        );
    }

    // The kubelet's, beside a usable one of nodegrace's.
    let env = self::env();
    let kubelet = env.path("kubelet.conf");
    std::fs::write(&kubelet, broken_yaml(&s, "apiVersion: v1\n")).unwrap();
    set_node_key(
        &env,
        &format!("kubelet_kubeconfig = \"{}\"", kubelet.display()),
    );
    for args in [&["status"][..], &["credentials", "request", "--wait", "1s"]] {
        let out = env.run(args);
        let text = assert_no_secret(&s, &format!("kubelet {args:?}"), &out);
        assert!(located(&text), "{args:?}: {text}");
    }

    // $KUBECONFIG, when the configuration names none.
    let env = self::env();
    set_node_key(&env, "kubeconfig = \"\"");
    let config = env.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace(
            &format!("kubeconfig = \"{}\"\n", env.path("kubeconfig").display()),
            "",
        ),
    )
    .unwrap();
    std::fs::write(env.path("kubeconfig"), broken_yaml(&s, "")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .arg("--config")
        .arg(&config)
        .arg("plan")
        .env("KUBECONFIG", env.path("kubeconfig"))
        .env("NODEGRACE_STATUS_FILE", env.path("status.json"))
        .output()
        .unwrap();
    let text = assert_no_secret(&s, "$KUBECONFIG", &out);
    assert!(text.contains("$KUBECONFIG"), "{text}");
    assert!(located(&text), "{text}");
}

#[test]
fn broken_key_and_certificate_files_are_not_quoted() {
    let s = secrets();
    let env = env();
    let mut body: Vec<&str> = s.key_pem.lines().collect();
    // A stray character in the middle of each block.
    let middle = body.len() / 2;
    let broken_line = format!("{}!", body[middle]);
    body[middle] = &broken_line;
    let broken = body.join("\n");
    std::fs::write(env.path("client.key"), &broken).unwrap();
    std::fs::write(
        env.path("client.crt"),
        broken.replace("PRIVATE KEY", "CERTIFICATE"),
    )
    .unwrap();
    std::fs::write(
        env.path("kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{}', certificate-authority: client.crt}}}}]\nusers: [{{name: u, user: {{client-certificate: client.crt, client-key: client.key}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n",
            refused_port()
        ),
    )
    .unwrap();
    for args in [
        &["status"][..],
        &["plan"],
        &["credentials", "request", "--wait", "1s"],
        &["plan", "--pods"],
    ] {
        let mut args = args.to_vec();
        let key = env.path("client.key").display().to_string();
        if args.len() == 2 {
            args.push(&key);
        }
        let out = env.run(&args);
        assert!(!out.status.success(), "{args:?}");
        assert_no_secret(&s, &format!("{args:?}"), &out);
    }
    // A whole, valid key given as a pod list.
    std::fs::write(env.path("whole.key"), &s.key_pem).unwrap();
    let out = env.run(&[
        "plan",
        "--pods",
        &env.path("whole.key").display().to_string(),
    ]);
    let text = assert_no_secret(&s, "plan --pods whole.key", &out);
    assert!(text.contains("at line 1 column 1"), "{text}");
}

#[test]
fn broken_kubelet_configurations_manifests_and_pod_lists_are_not_quoted() {
    let s = secrets();
    let env = env();
    let config = env.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let kubelet = env.path("kubelet.yaml");
    let dropins = env.path("kubelet.conf.d");
    std::fs::create_dir_all(&dropins).unwrap();
    std::fs::write(
        &config,
        format!(
            "{text}[fallback]\nkubelet_config = \"{}\"\nkubelet_config_dir = \"{}\"\n",
            kubelet.display(),
            dropins.display()
        ),
    )
    .unwrap();
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    std::fs::write(&kubelet, broken_yaml(&s, head)).unwrap();
    for args in [&["status"][..], &["plan"]] {
        let out = env.run(args);
        assert_no_secret(&s, &format!("kubelet config {args:?}"), &out);
    }
    let out = env.run(&["check-config"]);
    let text = assert_no_secret(&s, "kubelet config check-config", &out);
    assert!(located(&text), "{text}");
    std::fs::write(&kubelet, head).unwrap();
    std::fs::write(dropins.join("10-a.conf"), broken_yaml(&s, head)).unwrap();
    let out = env.run(&["check-config"]);
    let text = assert_no_secret(&s, "kubelet drop-in", &out);
    assert!(text.contains("10-a.conf"), "{text}");

    // Static pod manifests, gated and in place.
    std::fs::write(
        env.path("manifests/etcd.yaml"),
        broken_yaml(&s, "apiVersion: v1\nkind: Pod\n"),
    )
    .unwrap();
    std::fs::write(
        env.path("gate/kube-apiserver.yaml"),
        broken_yaml(&s, "apiVersion: v1\nkind: Pod\n"),
    )
    .unwrap();
    let out = env.run(&["status"]);
    assert_no_secret(&s, "manifests", &out);

    // Pod lists, YAML and JSON.
    let pods = env.path("pods.yaml");
    std::fs::write(&pods, broken_yaml(&s, "kind: List\n")).unwrap();
    let out = env.run(&["plan", "--pods", &pods.display().to_string()]);
    let text = assert_no_secret(&s, "pods.yaml", &out);
    assert!(located(&text), "{text}");
    let json = env.path("pods.json");
    std::fs::write(
        &json,
        format!("{{\"kind\": \"List\", \"items\": [{{\"kind\": \"{TOKEN}\"}}, \"{TOKEN}\"]}}"),
    )
    .unwrap();
    let out = env.run(&["plan", "--pods", &json.display().to_string()]);
    assert!(!out.status.success());
    assert_no_secret(&s, "pods.json", &out);
}
