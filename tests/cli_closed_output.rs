//! Every command into a closed pipe (`| head -c1` that has exited) and into a full device
//! (`> /dev/full`), on stdout and on stderr: never a panic (exit 101), always the exit code
//! the command documents.

mod cli_support;

use std::process::{Command, Output, Stdio};

use cli_support::{refused_port, CliEnv};

/// Where one of the two output streams goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    Captured,
    ClosedPipe,
    Full,
}

fn stdio(sink: Sink) -> Stdio {
    match sink {
        Sink::Captured => Stdio::piped(),
        Sink::ClosedPipe => {
            let (read, write) = nix::unistd::pipe().unwrap();
            drop(read);
            Stdio::from(write)
        }
        Sink::Full => Stdio::from(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        ),
    }
}

/// `args` without `--config` get the environment's configuration.
fn run(env: &CliEnv, args: &[&str], stdout: Sink, stderr: Sink) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodegrace"));
    if !args.contains(&"--config") {
        cmd.arg("--config").arg(env.path("config.toml"));
    }
    cmd.args(args)
        .env("NODEGRACE_STATUS_FILE", env.path("status.json"))
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(stdio(stdout))
        .stderr(stdio(stderr))
        .spawn()
        .unwrap()
        .wait_with_output()
        .unwrap()
}

struct Case {
    args: Vec<String>,
    /// Exit code with both streams writable, and with stdout closed (the reader has what
    /// it wanted).
    code: i32,
    /// Exit code when stdout is full: output that is the command's product could not be
    /// written, so it fails (1), unless the code means something else (status).
    full: i32,
}

fn case(args: &[&str], code: i32, full: i32) -> Case {
    Case {
        args: args.iter().map(|s| s.to_string()).collect(),
        code,
        full,
    }
}

#[test]
fn no_command_panics_when_its_output_cannot_be_written() {
    if !std::path::Path::new("/dev/full").exists() {
        panic!("/dev/full is missing: this test needs it");
    }
    let env = CliEnv::new(&format!("https://127.0.0.1:{}", refused_port()), "10m", "");
    let pods = format!("{}/tests/data/pods-node-a.yaml", env!("CARGO_MANIFEST_DIR"));
    let bad = env.path("bad.toml");
    std::fs::write(&bad, "[node]\nname = 1\n").unwrap();
    let generated = env.path("generated");
    std::fs::create_dir(&generated).unwrap();
    let cases = [
        case(&["check-config"], 0, 1),
        case(&["crds"], 0, 1),
        case(&["completions", "zsh"], 0, 1),
        case(&["completions", "bash"], 0, 1),
        case(&["man"], 0, 1),
        case(&["plan", "--pods", &pods], 0, 1),
        case(&["plan", "--pods", &pods, "-o", "json"], 0, 1),
        // The apiserver is unreachable: nothing to plan, nothing completed.
        case(&["plan"], 1, 1),
        case(&["complete"], 1, 1),
        // No daemon runs here; status's code says so whatever happens to its report.
        case(&["status"], 3, 3),
        case(&["status", "-o", "json"], 3, 3),
        case(&["credentials", "request", "--wait", "1s"], 1, 1),
        case(
            &["credentials", "approve", "--kubeconfig", "/nonexistent"],
            1,
            1,
        ),
        case(&["generator", generated.to_str().unwrap()], 0, 0),
        case(&["--config", bad.to_str().unwrap(), "check-config"], 2, 2),
        case(&["--config", bad.to_str().unwrap(), "status"], 2, 2),
        case(&["no-such-command"], 2, 2),
        case(&["--help"], 0, 1),
        case(&["plan", "--help"], 0, 1),
        case(&["--version"], 0, 1),
    ];
    let mut failures = Vec::new();
    for c in &cases {
        let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
        for (stdout, stderr) in [
            (Sink::Captured, Sink::Captured),
            (Sink::ClosedPipe, Sink::Captured),
            (Sink::Full, Sink::Captured),
            (Sink::Captured, Sink::ClosedPipe),
            (Sink::Captured, Sink::Full),
            (Sink::ClosedPipe, Sink::ClosedPipe),
            (Sink::Full, Sink::Full),
        ] {
            let out = run(&env, &args, stdout, stderr);
            let want = if stdout == Sink::Full { c.full } else { c.code };
            let err = String::from_utf8_lossy(&out.stderr);
            if out.status.code() != Some(want) || err.contains("panicked") {
                failures.push(format!(
                    "{args:?} stdout {stdout:?} stderr {stderr:?}: exit {:?}, want {want}; stderr: {err}",
                    out.status.code()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
