//! `nodegrace plan --pods FILE` on generated pod lists: prints the command's wall time and
//! peak RSS (the child's `ru_maxrss`) for 10k and 100k pods, and for the largest plan the
//! command accepts (a 64-entry drain plan with a label selector on each entry, 100,000 pods
//! padded to just under the 64 MiB input cap), as `kubectl get pods -o json` and `-o yaml`.
//!
//! ```sh
//! cargo build --release --bin nodegrace && cargo run --release --example bench_pod_list
//! ```
//!
//! The binary measured is the `nodegrace` beside the example's own directory (the same
//! profile), or `$BENCH_BIN`. `BENCH_CASES=10k,100k,max` picks cases.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const INPUT_CAP: usize = 64 << 20;
const SELECTED_TIERS: usize = 61;

fn main() -> anyhow::Result<()> {
    let bin = match std::env::var_os("BENCH_BIN") {
        Some(b) => PathBuf::from(b),
        None => {
            let exe = std::env::current_exe()?;
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .ok_or_else(|| anyhow::anyhow!("no profile directory above {}", exe.display()))?;
            profile_dir.join("nodegrace")
        }
    };
    anyhow::ensure!(
        bin.exists(),
        "{} does not exist: cargo build --bin nodegrace (same profile) or set BENCH_BIN",
        bin.display()
    );
    let cases = std::env::var("BENCH_CASES").unwrap_or_else(|_| "10k,100k,max".into());
    let dir = tempfile::tempdir()?;
    let plain = write_config(dir.path(), "plain", false)?;
    let full = write_config(dir.path(), "full", true)?;
    println!("binary: {}", bin.display());
    for case in cases.split(',') {
        let (pods, pad, config, what) = match case {
            "10k" => (10_000, 0, &plain, "1 plan entry"),
            "100k" => (100_000, 0, &plain, "1 plan entry"),
            "max" => (
                100_000,
                usize::MAX,
                &full,
                "64 plan entries, a selector each",
            ),
            other => anyhow::bail!("unknown case {other}: 10k, 100k or max"),
        };
        for format in [Format::Json, Format::Yaml] {
            let path = dir.path().join(format!("pods-{case}.{}", format.ext()));
            let bytes = write_list(&path, pods, pad, format)?;
            let (secs, rss_kib, status) = run(&bin, config, &path)?;
            println!(
                "{case:>5} {:<4} {pods:>7} pods, {:>5.1} MiB input, {what}: {secs:>6.2} s, peak RSS {:>7.1} MiB ({:.1}x the input){status}",
                format.ext(),
                bytes as f64 / 1048576.0,
                rss_kib as f64 / 1024.0,
                rss_kib as f64 * 1024.0 / bytes as f64,
            );
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Format {
    Json,
    Yaml,
}

impl Format {
    fn ext(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Yaml => "yaml",
        }
    }
}

/// `config.toml` for `plan`: with `full`, 64 drain plan entries (61 Default entries, each
/// selecting one `tier` label value, then the three classes without a selector).
fn write_config(dir: &Path, name: &str, full: bool) -> anyhow::Result<PathBuf> {
    let root = dir.join(name);
    std::fs::create_dir_all(root.join("state"))?;
    let mut text = format!(
        "state_dir = \"{r}/state\"\n[node]\nname = \"node-a\"\nkubeconfig = \"{r}/kubeconfig\"\n\
         [shutdown]\nmax_delay = \"1h\"\nlogind_dropin_dir = \"{r}/logind.conf.d\"\n\
         [static_pods]\nmanifest_dir = \"{r}/manifests\"\ngate_dir = \"{r}/gate\"\n",
        r = root.display()
    );
    if full {
        for i in 0..SELECTED_TIERS {
            write!(
                text,
                "[[drain.plan]]\npod_type = \"Default\"\npod_priority = {}\npod_selector = {{ tier = \"t{i}\" }}\n",
                (i + 1) * 1000
            )?;
        }
        text.push_str(
            "[[drain.plan]]\npod_type = \"Default\"\npod_priority = 2000000000\n\
             [[drain.plan]]\npod_type = \"DaemonSet\"\npod_priority = 2000000000\n\
             [[drain.plan]]\npod_type = \"Static\"\npod_priority = 2000000000\n",
        );
    } else {
        text.push_str("[[drain.plan]]\npod_type = \"Default\"\npod_priority = 1000000\n");
    }
    let path = root.join("config.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// A `kubectl get pods -o json|yaml` List of `pods` pods bound to node-a, each like a
/// Deployment's pod (labels, owner, one container, status); `pad` (usize::MAX: as much as
/// fits the input cap) adds an annotation of that many bytes to each pod.
fn write_list(path: &Path, pods: usize, pad: usize, format: Format) -> anyhow::Result<usize> {
    let pad = if pad == usize::MAX {
        let probe = pod_text(pods, 0, format).len() + 8;
        ((INPUT_CAP - 4096) / pods).saturating_sub(probe)
    } else {
        pad
    };
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut bytes = 0;
    let head = match format {
        Format::Json => "{\"apiVersion\":\"v1\",\"items\":[",
        Format::Yaml => "apiVersion: v1\nitems:\n",
    };
    out.write_all(head.as_bytes())?;
    bytes += head.len();
    for i in 0..pods {
        let mut pod = pod_text(i, pad, format);
        if matches!(format, Format::Json) && i + 1 < pods {
            pod.push(',');
        }
        out.write_all(pod.as_bytes())?;
        bytes += pod.len();
    }
    let tail = match format {
        Format::Json => "],\"kind\":\"List\",\"metadata\":{\"resourceVersion\":\"\"}}\n",
        Format::Yaml => "kind: List\nmetadata:\n  resourceVersion: \"\"\n",
    };
    out.write_all(tail.as_bytes())?;
    bytes += tail.len();
    out.flush()?;
    anyhow::ensure!(bytes <= INPUT_CAP, "{bytes} bytes: over the input cap");
    Ok(bytes)
}

fn pod_text(i: usize, pad: usize, format: Format) -> String {
    let tier = i % SELECTED_TIERS;
    let priority = (i * 7) % 70_000;
    let hash = format!("{:08x}", i.wrapping_mul(2654435761) & 0xffff_ffff);
    let filler = "x".repeat(pad);
    match format {
        Format::Json => format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"annotations\":{{\"note\":\"{filler}\"}},\
             \"labels\":{{\"app\":\"web\",\"tier\":\"t{tier}\",\"pod-template-hash\":\"{hash}\"}},\
             \"name\":\"web-{hash}-{i}\",\"namespace\":\"shop\",\"ownerReferences\":[{{\"apiVersion\":\"apps/v1\",\
             \"controller\":true,\"kind\":\"ReplicaSet\",\"name\":\"web-{hash}\",\
             \"uid\":\"0b1c6a5e-1111-4c1e-9a61-{i:012}\"}}]\
             ,\"uid\":\"7f3c2a1e-2222-4c1e-9a61-{i:012}\"}},\"spec\":{{\"containers\":[{{\"image\":\"nginx:1.27\",\
             \"name\":\"web\",\"resources\":{{\"requests\":{{\"cpu\":\"10m\"}}}}}}],\"nodeName\":\"node-a\",\
             \"priority\":{priority},\"terminationGracePeriodSeconds\":30}},\
             \"status\":{{\"phase\":\"Running\",\"podIP\":\"10.1.{}.{}\"}}}}",
            i / 256 % 256,
            i % 256
        ),
        Format::Yaml => format!(
            "- apiVersion: v1\n  kind: Pod\n  metadata:\n    annotations:\n      note: \"{filler}\"\n\
             \x20   labels:\n      app: web\n      tier: t{tier}\n      pod-template-hash: \"{hash}\"\n\
             \x20   name: web-{hash}-{i}\n    namespace: shop\n    ownerReferences:\n    - apiVersion: apps/v1\n\
             \x20     controller: true\n      kind: ReplicaSet\n      name: web-{hash}\n\
             \x20     uid: 0b1c6a5e-1111-4c1e-9a61-{i:012}\n\
             \x20   uid: 7f3c2a1e-2222-4c1e-9a61-{i:012}\n  spec:\n    containers:\n    - image: nginx:1.27\n\
             \x20     name: web\n      resources:\n        requests:\n          cpu: 10m\n    nodeName: node-a\n\
             \x20   priority: {priority}\n    terminationGracePeriodSeconds: 30\n  status:\n    phase: Running\n\
             \x20   podIP: 10.1.{}.{}\n",
            i / 256 % 256,
            i % 256
        ),
    }
}

/// Runs `plan` (table output to /dev/null); wall time, the child's peak RSS in KiB, and a
/// note when it failed.
fn run(bin: &Path, config: &Path, pods: &Path) -> anyhow::Result<(f64, i64, String)> {
    let start = Instant::now();
    // Waited for below with wait4, which gives its rusage.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(bin)
        .arg("--config")
        .arg(config)
        .args(["plan", "--budget", "1h", "--pods"])
        .arg(pods)
        .env(
            "NODEGRACE_STATUS_FILE",
            config.with_file_name("status.json"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id() as libc::pid_t;
    let mut stderr = child.stderr;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(s) = stderr.as_mut() {
            let _ = std::io::Read::read_to_string(s, &mut text);
        }
        text
    });
    let mut raw_status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, not yet waited for; both pointers are valid for the call.
    let waited = unsafe { libc::wait4(pid, &mut raw_status, 0, &mut usage) };
    anyhow::ensure!(waited == pid, "wait4: {}", std::io::Error::last_os_error());
    let secs = start.elapsed().as_secs_f64();
    let err = reader.join().unwrap_or_default();
    let status = std::process::ExitStatus::from_raw(raw_status);
    let note = if status.success() {
        String::new()
    } else {
        format!(
            " - FAILED ({status}): {}",
            err.lines()
                .last()
                .unwrap_or("")
                .chars()
                .take(200)
                .collect::<String>()
        )
    };
    Ok((secs, usage.ru_maxrss, note))
}
