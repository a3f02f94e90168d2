//! Lifecycle figures on a private dbus-daemon with the fake logind:
//! - PrepareForShutdown emitted -> drain started, and drain done -> inhibitor fd closed
//!   (as the fake logind sees it), medians over ITERATIONS shutdown/cancel cycles of an
//!   in-process daemon;
//! - idle RSS, threads and wake-ups of a real `nodegrace run` process (the binary next to
//!   this example, or `$NODEGRACE_BIN`) over 10 s, with the watchdog on (WatchdogSec=4s).
//!
//! cargo build --bin nodegrace --examples && target/debug/examples/bench_lifecycle

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nodegrace::Phase;
use nodegrace_testkit::{DrainMode, FakeState, ScriptedDrainer, TestEnv};

const ITERATIONS: usize = 60;
const IDLE: Duration = Duration::from_secs(10);
const WATCHDOG: Duration = Duration::from_secs(4);

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

async fn latencies() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let env = TestEnv::start(dir.path(), FakeState::with_delay(Duration::from_secs(1200))).await?;
    let drainer = ScriptedDrainer::new(DrainMode::Immediate);
    // The daemon gets its own thread and runtime, as in `nodegrace run`; the fakes stay
    // here, like logind in its own process.
    let daemon = env.daemon(env.settings(), Arc::new(drainer.clone()));
    let handle = daemon.handle();
    let thread = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(daemon.run()))
    });
    handle
        .wait_for(|s| s.phase == Phase::Armed)
        .await
        .context("daemon never armed")?;

    let (mut to_start, mut to_close) = (Vec::new(), Vec::new());
    for i in 0..ITERATIONS {
        let emitted = env.fakes.prepare_for_shutdown(true).await?;
        let rec = drainer.wait_until(|r| r.drains.len() == i + 1).await;
        let call = &rec.drains[i];
        to_start.push(call.started.duration_since(emitted));
        let fake = env.fakes.wait_until(|s| s.held().is_empty()).await;
        let closed = fake
            .taken_by("nodegrace")
            .last()
            .and_then(|l| l.closed_at)
            .context("no close seen")?;
        let finished = drainer
            .wait_until(|r| r.drains[i].finished.is_some())
            .await
            .drains[i]
            .finished
            .context("drain not finished")?;
        to_close.push(closed.duration_since(finished));
        env.fakes.prepare_for_shutdown(false).await?;
        env.fakes.wait_until(|s| s.held().len() == 1).await;
        handle
            .wait_for(|s| s.phase == Phase::Armed && s.inhibitor_held)
            .await
            .context("daemon stopped")?;
    }
    println!(
        "iterations: {ITERATIONS} (state dir on {})",
        dir.path().display()
    );
    println!(
        "PrepareForShutdown emitted -> drain started: median {}, max {}",
        ms(median(to_start.clone())),
        ms(*to_start.iter().max().unwrap_or(&Duration::ZERO))
    );
    println!(
        "drain done -> inhibitor fd closed (seen by logind): median {}, max {}",
        ms(median(to_close.clone())),
        ms(*to_close.iter().max().unwrap_or(&Duration::ZERO))
    );
    handle.terminate();
    tokio::task::spawn_blocking(move || thread.join())
        .await?
        .map_err(|_| anyhow::anyhow!("daemon thread panicked"))??;
    Ok(())
}

fn binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("NODEGRACE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let p = exe
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("nodegrace"))
        .context("locating the nodegrace binary")?;
    if !p.exists() {
        bail!(
            "{} not found: cargo build --bin nodegrace first",
            p.display()
        );
    }
    Ok(p)
}

fn status_field(pid: u32, task: Option<&str>, field: &str) -> Result<u64> {
    let path = match task {
        Some(t) => format!("/proc/{pid}/task/{t}/status"),
        None => format!("/proc/{pid}/status"),
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{field} in {path}"))
}

/// Voluntary + involuntary context switches of each thread.
fn switches(pid: u32) -> Result<std::collections::BTreeMap<String, u64>> {
    let mut out = std::collections::BTreeMap::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let t = t?.file_name().to_string_lossy().into_owned();
        let n = status_field(pid, Some(&t), "voluntary_ctxt_switches")?
            + status_field(pid, Some(&t), "nonvoluntary_ctxt_switches")?;
        out.insert(t, n);
    }
    Ok(out)
}

async fn idle() -> Result<()> {
    let bin = binary()?;
    let dir = tempfile::tempdir()?;
    let env = TestEnv::start(dir.path(), FakeState::with_delay(Duration::from_secs(1200))).await?;
    let notify_path = dir.path().join("notify.sock");
    let notify = tokio::net::UnixDatagram::bind(&notify_path)?;
    // sd_watchdog_enabled(3) wants WATCHDOG_PID to be the service's pid: exec from sh.
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg("WATCHDOG_PID=$$ exec \"$0\" run")
        .arg(&bin)
        .env("DBUS_SYSTEM_BUS_ADDRESS", env.bus.address())
        .env("NODEGRACE_STATUS_FILE", dir.path().join("status.json"))
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", WATCHDOG.as_micros().to_string())
        .env("RUST_LOG", "warn")
        .env_remove("JOURNAL_STREAM")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id().context("child pid")?;

    let mut buf = [0u8; 512];
    let started = Instant::now();
    loop {
        let n = tokio::time::timeout(Duration::from_secs(20), notify.recv(&mut buf))
            .await
            .context("no READY=1 from nodegrace run")??;
        if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
            break;
        }
    }
    println!(
        "nodegrace run ({}) ready in {}",
        bin.display(),
        ms(started.elapsed())
    );
    // Past the runtime's 1 s keep-alive of the blocking threads used while connecting.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let before = switches(pid)?;
    let mut pings = 0;
    let until = tokio::time::Instant::now() + IDLE;
    while let Ok(r) = tokio::time::timeout_at(until, notify.recv(&mut buf)).await {
        let n = r?;
        if String::from_utf8_lossy(&buf[..n]).contains("WATCHDOG=1") {
            pings += 1;
        }
    }
    let after = switches(pid)?;
    let rss_kib = status_field(pid, None, "VmRSS")?;
    let anon_kib = status_field(pid, None, "RssAnon")?;
    let file_kib = status_field(pid, None, "RssFile")?;
    let wakeups: u64 = after
        .iter()
        .map(|(t, n)| n - before.get(t).copied().unwrap_or(0))
        .sum();
    println!(
        "idle {}s: RSS {:.1} MiB (anon {:.1}, file {:.1}), {} thread(s) (before: {}), {wakeups} context switches, {pings} watchdog pings (WatchdogSec={}s)",
        IDLE.as_secs(),
        rss_kib as f64 / 1024.0,
        anon_kib as f64 / 1024.0,
        file_kib as f64 / 1024.0,
        after.len(),
        before.len(),
        WATCHDOG.as_secs()
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await??;
    env.fakes.wait_until(|s| s.held().is_empty()).await;
    println!("SIGTERM: exit {status}, inhibitor released");
    Ok(())
}

fn main() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        latencies().await?;
        idle().await
    })
}
