//! Every answer from the apiserver bounded, against local stubs on 127.0.0.1: one that
//! accepts and never answers (the commands give up within their time, saying why) and one
//! that streams an endless body (the commands fail with the cap's error, their memory
//! bounded).

mod cli_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use cli_support::CliEnv;

/// Accepts every connection and never writes a byte.
fn silent_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    url
}

/// Answers every request with 200 and a JSON list whose items never end.
fn endless_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || stream_forever(conn));
        }
    });
    url
}

fn stream_forever(mut conn: TcpStream) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    let chunk = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
    if conn
        .write_all(
            format!(
                "{head}{}",
                chunk(r#"{"kind":"List","apiVersion":"v1","metadata":{},"items":["#)
            )
            .as_bytes(),
        )
        .is_err()
    {
        return;
    }
    let item = format!("{{\"metadata\":{{\"name\":\"{}\"}}}},", "x".repeat(200));
    let block = chunk(&item.repeat(300));
    while conn.write_all(block.as_bytes()).is_ok() {}
}

/// Runs `nodegrace args` and returns its exit status, stderr, wall time and peak RSS (KiB).
fn measured(env: &CliEnv, args: &[&str], kubeconfig: Option<&Path>) -> (i32, String, f64, i64) {
    let start = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodegrace"));
    cmd.arg("--config")
        .arg(env.path("config.toml"))
        .args(args)
        .env("NODEGRACE_STATUS_FILE", env.path("status.json"))
        .env_remove("KUBECONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(k) = kubeconfig {
        cmd.arg("--kubeconfig").arg(k);
    }
    // Waited for below with wait4, which gives its rusage.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd.spawn().unwrap();
    let pid = child.id() as i32;
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut raw_status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, not yet waited for; both pointers are valid for the call.
    let waited = unsafe { libc::wait4(pid, &mut raw_status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    let secs = start.elapsed().as_secs_f64();
    let status = std::process::ExitStatus::from_raw(raw_status);
    (
        status.code().unwrap_or(-1),
        reader.join().unwrap(),
        secs,
        usage.ru_maxrss,
    )
}

fn env_at(server: &str) -> CliEnv {
    let env = CliEnv::new(server, "15m", "");
    let config = env.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replacen("[node]\n", "[node]\nkubelet_kubeconfig = \"\"\n", 1),
    )
    .unwrap();
    env
}

#[test]
fn credential_commands_give_up_on_a_server_that_never_answers() {
    let env = env_at(&silent_server());
    let approver = env.path("kubeconfig");
    std::thread::scope(|s| {
        let request = s.spawn(|| measured(&env, &["credentials", "request", "--wait", "3s"], None));
        let approve = s.spawn(|| {
            measured(
                &env,
                &["credentials", "approve", "--dry-run"],
                Some(&approver),
            )
        });
        for (what, (code, err, secs, _)) in [
            ("request", request.join().unwrap()),
            ("approve", approve.join().unwrap()),
        ] {
            assert_eq!(code, 1, "{what}: {err}");
            assert!(
                err.contains("the apiserver did not answer in full within 10s"),
                "{what}: {err}"
            );
            assert!((9.0..20.0).contains(&secs), "{what}: {secs} s");
        }
    });
}

#[test]
fn an_endless_answer_is_cut_at_the_cap_with_bounded_memory() {
    let env = env_at(&endless_server());
    let approver = env.path("kubeconfig");
    for (args, kubeconfig) in [
        (
            &["credentials", "approve", "--dry-run"][..],
            Some(approver.as_path()),
        ),
        (&["plan"][..], None),
    ] {
        let (code, err, secs, rss_kib) = measured(&env, args, kubeconfig);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains("larger than 64 MiB, nodegrace's cap on one answer"),
            "{args:?}: {err}"
        );
        assert!(secs < 30.0, "{args:?}: {secs} s");
        // The cap (64 MiB) held once or twice while it is read, and the program itself.
        assert!(rss_kib < 400 * 1024, "{args:?}: peak RSS {rss_kib} KiB");
        eprintln!("{args:?}: {secs:.1} s, peak RSS {} MiB", rss_kib / 1024);
    }
    // The status probe gives up at its own time, before the cap.
    let (code, err, secs, rss_kib) = measured(&env, &["status"], None);
    assert_ne!(code, 0, "{err}");
    assert!(secs < 20.0, "status: {secs} s");
    assert!(rss_kib < 400 * 1024, "status: peak RSS {rss_kib} KiB");
}
