//! Parsing linear or capped: a 1 MiB file of `[` in every place the product reads YAML (the
//! kubelet's configuration, a gated manifest, a manifest in `staticPodPath`, `plan --pods`,
//! the kubeconfig) is refused in well under a second, saying where.

mod cli_support;

use std::time::Duration;

use cli_support::{cpu_timed, refused_port, CliEnv};

fn brackets() -> String {
    format!("x: {}", "[".repeat((1 << 20) - 100))
}

/// In CPU time (what the machine's load does not change much), process start included.
const QUICK: Duration = Duration::from_millis(900);

#[test]
fn a_megabyte_of_brackets_is_refused_at_once_everywhere() {
    let env = CliEnv::new(&format!("https://127.0.0.1:{}", refused_port()), "15m", "");
    let config = env.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!(
            "{text}[fallback]\nkubelet_config = \"{}\"\n",
            env.path("kubelet.yaml").display()
        ),
    )
    .unwrap();
    std::fs::write(env.path("kubelet.yaml"), brackets()).unwrap();
    let (text, took) = cpu_timed(&env, &["check-config"]);
    assert!(took < QUICK, "check-config: {took:?}");
    assert!(
        text.contains("kubelet.yaml: not read: flow collections nested deeper than 64 levels at line 1 column 68"),
        "{text}"
    );
    std::fs::remove_file(env.path("kubelet.yaml")).unwrap();

    std::fs::write(env.path("gate/deep.yaml"), brackets()).unwrap();
    std::fs::write(env.path("manifests/deep.yaml"), brackets()).unwrap();
    let (text, took) = cpu_timed(&env, &["status"]);
    assert!(took < Duration::from_secs(4), "status: {took:?}");
    assert!(text.contains("nested deeper than 64 levels"), "{text}");

    std::fs::write(env.path("pods.yaml"), brackets()).unwrap();
    let pods = env.path("pods.yaml").display().to_string();
    let (text, took) = cpu_timed(&env, &["plan", "--pods", &pods]);
    assert!(took < QUICK, "plan --pods: {took:?}");
    assert!(
        text.contains("flow collections nested deeper than 64 levels at line 1 column 68"),
        "{text}"
    );

    std::fs::write(env.path("kubeconfig"), brackets()).unwrap();
    let (text, took) = cpu_timed(&env, &["plan", "--pods", &pods]);
    assert!(took < QUICK, "{took:?}");
    let (text2, took) = cpu_timed(&env, &["complete"]);
    assert!(took < QUICK, "complete: {took:?}");
    assert!(
        text2.contains("kubeconfig: not read: flow collections nested deeper than 64 levels"),
        "{text} {text2}"
    );
}
