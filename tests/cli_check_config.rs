//! `nodegrace check-config` on a kubeadm-like node whose kubelet configuration (file and
//! drop-in directory) turns the kubelet's Graceful Node Shutdown on.

mod cli_support;

use cli_support::CliEnv;

fn kubelet_keys(env: &CliEnv) -> String {
    format!(
        "[fallback]\nkubelet_config = \"{}\"\nkubelet_config_dir = \"{}\"\n",
        env.path("kubelet/config.yaml").display(),
        env.path("kubelet/kubelet.conf.d").display()
    )
}

fn env_with_kubelet() -> CliEnv {
    let env = CliEnv::new("https://127.0.0.1:1", "15m", "");
    let config = env.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}{}", kubelet_keys(&env))).unwrap();
    std::fs::create_dir_all(env.path("kubelet/kubelet.conf.d")).unwrap();
    std::fs::write(
        env.path("kubelet/config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 2m\nshutdownGracePeriodCriticalPods: 30s\n",
    )
    .unwrap();
    std::fs::write(
        env.path("kubelet/kubelet.conf.d/10-shutdown.conf"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodCriticalPods: 45s\n",
    )
    .unwrap();
    env
}

#[test]
fn check_config_uses_and_names_the_kubelets_bands() {
    let env = env_with_kubelet();
    let out = env.run(&["check-config"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("# fallback bands from"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("the kubelet's configuration ("), "{line}");
    assert!(line.contains("kubelet/config.yaml, "), "{line}");
    assert!(line.ends_with("kubelet.conf.d/10-shutdown.conf)"), "{line}");
    assert!(stdout.contains("leaves the GracefulNodeShutdownInProgress condition to it"));
    // 2m total, 45 s of it for critical pods: 75 s and 45 s.
    assert!(
        stdout.contains("priority = 0\nshutdown_grace_period = \"1m 15s\"")
            || stdout.contains("priority = 0\nshutdown_grace_period = \"75s\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("priority = 2000000000\nshutdown_grace_period = \"45s\""),
        "{stdout}"
    );
}

#[test]
fn a_symlinked_kubelet_drop_in_is_a_warning_and_changes_nothing() {
    let env = env_with_kubelet();
    let dropin = env.path("kubelet/kubelet.conf.d/10-shutdown.conf");
    let elsewhere = env.path("kubelet/elsewhere.conf");
    std::fs::rename(&dropin, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &dropin).unwrap();
    let out = env.run(&["check-config"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("# warning: the kubelet's configuration is set aside: ")
            && stdout.contains("10-shutdown.conf: cannot read: a symlink"),
        "{stdout}"
    );
    assert!(
        stdout.contains("# fallback bands from nodegrace's defaults"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("leaves the GracefulNodeShutdownInProgress"),
        "{stdout}"
    );
    assert!(
        stdout.contains("priority = 0\nshutdown_grace_period = \"1m\""),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_link(&dropin).unwrap(),
        elsewhere,
        "the kubelet's files are left as they were"
    );
}

#[test]
fn a_state_directory_that_cannot_exist_is_refused_by_check_config_and_run() {
    let env = CliEnv::new("https://127.0.0.1:1", "15m", "");
    let config = env.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(env.path("a-file"), "").unwrap();
    let under_a_file = env.path("a-file/state").display().to_string();
    std::os::unix::fs::symlink(env.path("loop"), env.path("loop")).unwrap();
    let a_loop = env.path("loop").display().to_string();
    let under_a_loop = env.path("loop/state").display().to_string();
    for (state_dir, why) in [
        (under_a_file.as_str(), "a-file is not a directory"),
        (a_loop.as_str(), "loop is a symlink loop"),
        (under_a_loop.as_str(), "loop is a symlink loop"),
        ("/proc/nodegrace", "is on /proc"),
        ("/sys/nodegrace", "is on /sys"),
    ] {
        let configured = text.replace(
            &format!("state_dir = \"{}\"", env.path("state").display()),
            &format!("state_dir = \"{state_dir}\""),
        );
        assert_ne!(configured, text);
        std::fs::write(&config, configured).unwrap();
        for command in ["check-config", "run"] {
            let out = env.run(&[command]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{command} {state_dir}: {stderr}"
            );
            assert!(
                stderr.contains("config.toml:1:")
                    && stderr.contains("state_dir: ")
                    && stderr.contains(why),
                "{command} {state_dir}: {stderr}"
            );
        }
    }
}

/// The kubelet's configuration as the kubelet reads it, seen through `check-config`,
/// `status` and `plan`: a file it accepts (`shutdownGracePeriod` alone: a critical band of
/// 0s) is used; one it refuses is set aside, and each command says so and what nodegrace
/// does instead.
#[test]
fn check_config_status_and_plan_say_when_the_kubelets_configuration_is_set_aside() {
    let env = env_with_kubelet();
    let pods = format!("{}/tests/data/pods-node-a.yaml", env!("CARGO_MANIFEST_DIR"));
    std::fs::remove_file(env.path("kubelet/kubelet.conf.d/10-shutdown.conf")).unwrap();
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let text = |args: &[&str]| {
        let out = env.run(args);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    std::fs::write(
        env.path("kubelet/config.yaml"),
        format!("\u{feff}{head}shutdownGracePeriod: 30s\n"),
    )
    .unwrap();
    let check = text(&["check-config"]);
    assert!(!check.contains("set aside"), "{check}");
    assert!(
        check.contains("priority = 2000000000\nshutdown_grace_period = \"0s\""),
        "{check}"
    );
    let status = text(&["status"]);
    assert!(
        status.contains("its Graceful Node Shutdown is on: nodegrace leaves GracefulNodeShutdownInProgress to it"),
        "{status}"
    );
    let plan = text(&["plan", "--pods", &pods]);
    assert!(
        plan.contains("bands from the kubelet's configuration ("),
        "{plan}"
    );
    assert!(!plan.contains("set aside"), "{plan}");

    // Refused by the kubelet: critical time with no total.
    std::fs::write(
        env.path("kubelet/config.yaml"),
        format!("{head}shutdownGracePeriod: 0s\nshutdownGracePeriodCriticalPods: 30s\n"),
    )
    .unwrap();
    let why = "config.yaml: shutdownGracePeriodCriticalPods (30s) is longer than shutdownGracePeriod (0ns); instead the fallback uses nodegrace's defaults and nodegrace writes GracefulNodeShutdownInProgress itself";
    let check = text(&["check-config"]);
    assert!(
        check.contains("# warning: the kubelet's configuration is set aside: the kubelet refuses it too (it does not start with it): ")
            && check.contains(why),
        "{check}"
    );
    let status = text(&["status"]);
    let line = status
        .lines()
        .find(|l| l.starts_with("Kubelet GNS"))
        .unwrap_or_default();
    assert!(
        line.contains("SET ASIDE: the kubelet refuses it too") && line.contains(why),
        "{status}"
    );
    assert!(
        status.contains("\n  bands from   nodegrace's defaults\n"),
        "{status}"
    );
    let json = text(&["status", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["kubeletConfig"]["gnsOn"], false, "{json}");
    assert!(
        v["kubeletConfig"]["setAside"]
            .as_str()
            .is_some_and(|s| s.contains(why)),
        "{json}"
    );
    let plan = text(&["plan", "--pods", &pods]);
    assert!(
        plan.contains("  bands from nodegrace's defaults\n  the kubelet's configuration is set aside: the kubelet refuses it too")
            && plan.contains(why),
        "{plan}"
    );
}
