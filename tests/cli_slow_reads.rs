//! `run` says it is starting before it reads anything, and gives up on a configuration read
//! that does not end; every input class at its largest accepted size is read in well under a
//! second.

mod cli_support;

use std::time::{Duration, Instant};

use cli_support::{cpu_timed, refused_port, CliEnv};

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs a test-hooks build: NODEGRACE_TEST_CONFIG_READ_SECONDS makes the read hang"
)]
fn run_says_it_is_starting_and_abandons_a_read_that_does_not_end() {
    let env = CliEnv::new(&format!("https://127.0.0.1:{}", refused_port()), "15m", "");
    let start = Instant::now();
    let out = env
        .command(&["run"])
        .env("NODEGRACE_TEST_CONFIG_READ_SECONDS", "3600")
        .env_remove("JOURNAL_STREAM")
        .output()
        .unwrap();
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("run with a hung configuration read ended after {took:?}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains("nodegrace starting: reading the configuration"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "reading the configuration did not finish in 5 s (a file on a hung filesystem?): abandoned, not started"
        ),
        "{stderr}"
    );
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(8),
        "{took:?}"
    );
}

/// The costliest YAML of `bytes` that is read: a block mapping under `indent` with as many
/// keys and values as the YAML budget allows (`nodes`; serde-saphyr's time goes by node, and
/// a short key and value cost it most per node), then comments up to the size.
fn costliest(nodes: usize, bytes: usize, indent: &str) -> String {
    let mut text: String = (0..nodes / 2)
        .map(|i| format!("{indent}k{i}: v\n"))
        .collect();
    let pad = "# padding\n";
    text.push_str(&pad.repeat(bytes.saturating_sub(text.len()) / pad.len()));
    text
}

/// The most nodes of a configuration file or a manifest (`yaml::MAX_FILE_NODES`) and of a
/// YAML pod list, less those of the heads below.
const FILE_NODES: usize = 50_000 - 40;
const POD_LIST_NODES: usize = 100_000 - 60;

/// The bound checked, in CPU time: one second as the product is shipped (optimized); an
/// unoptimized test build parses YAML several times slower and is held to five.
fn bound() -> Duration {
    if cfg!(debug_assertions) {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(1)
    }
}

/// The configuration files at the largest size nodegrace reads, filled with the most costly
/// YAML it accepts: nodegrace's own (1 MiB) and the kubelet's (its file and drop-ins, 1 MiB
/// together), through `check-config` (what `run` and a reload read).
#[test]
fn the_largest_configurations_are_read_in_time() {
    let env = CliEnv::new(&format!("https://127.0.0.1:{}", refused_port()), "15m", "");
    let config = env.path("config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[fallback]\nkubelet_config = \"{}\"\nkubelet_config_dir = \"{}\"\n",
        env.path("kubelet.yaml").display(),
        env.path("kubelet.conf.d").display()
    ));
    let pad = "# padding to the largest configuration file read\n";
    while text.len() + pad.len() <= 1 << 20 {
        text.push_str(pad);
    }
    std::fs::write(&config, &text).unwrap();
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 30s\nx:\n";
    let kubelet = format!(
        "{head}{}",
        costliest(FILE_NODES, (1 << 19) - head.len() - 200, "  ")
    );
    std::fs::write(env.path("kubelet.yaml"), &kubelet).unwrap();
    std::fs::create_dir(env.path("kubelet.conf.d")).unwrap();
    std::fs::write(env.path("kubelet.conf.d/0.conf"), &kubelet).unwrap();
    let (out, took) = cpu_timed(&env, &["check-config"]);
    assert!(
        out.contains("fallback bands from the kubelet's configuration"),
        "{out}"
    );
    println!("check-config: {took:?} of CPU");
    assert!(took < bound(), "check-config: {took:?}");
}

/// A gated static pod manifest (1 MiB, through `status`) and a pod list (2 MiB of YAML,
/// through `plan --pods`) at their largest parsed, filled the same way.
#[test]
fn the_largest_manifest_and_pod_list_are_read_in_time() {
    let env = CliEnv::new(&format!("https://127.0.0.1:{}", refused_port()), "15m", "");
    let pod_head = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: big\n  namespace: kube-system\nspec:\n  containers:\n  - name: c\n    image: busybox\nx:\n";
    let manifest = format!(
        "{pod_head}{}",
        costliest(FILE_NODES, (1 << 20) - pod_head.len() - 200, "  ")
    );
    std::fs::write(env.path("gate/big.yaml"), manifest).unwrap();
    let (out, took) = cpu_timed(&env, &["status"]);
    assert!(out.contains("kube-system/big (big.yaml)"), "{out}");
    println!("status: {took:?} of CPU");
    assert!(took < bound(), "status: {took:?}");

    let list_head = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: p\n    namespace: ns\n  spec:\n    nodeName: node-a\n    containers:\n    - name: c\n      image: busybox\n  x:\n";
    let pods = format!(
        "{list_head}{}",
        costliest(POD_LIST_NODES, (2 << 20) - list_head.len() - 200, "    ")
    );
    std::fs::write(env.path("pods.yaml"), pods).unwrap();
    let path = env.path("pods.yaml").display().to_string();
    let (out, took) = cpu_timed(&env, &["plan", "--pods", &path]);
    assert!(out.contains("ns/p"), "{out}");
    println!("plan --pods: {took:?} of CPU");
    assert!(took < bound(), "plan --pods: {took:?}");
}
