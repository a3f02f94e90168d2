//! Gate and restore N static pod manifests; prints wall time per manifest.
//! `cargo run --example bench_staticpods [N] [dir]` (dir defaults to /var/tmp: a real disk,
//! so the fsyncs cost what they cost on a node).

use std::path::Path;
use std::time::{Duration, Instant};

use nodegrace::{FsGate, StaticPodGate, StaticPodSettings};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(100);
    let base = args.next().unwrap_or_else(|| "/var/tmp".into());
    for copy in [false, true] {
        let root = tempfile::tempdir_in(Path::new(&base))?;
        let settings = StaticPodSettings {
            manifest_dir: root.path().join("manifests"),
            gate_dir: root.path().join("gated"),
        };
        std::fs::create_dir(&settings.manifest_dir)?;
        for i in 0..n {
            std::fs::write(
                settings.manifest_dir.join(format!("pod-{i}.yaml")),
                format!(
                    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-{i}\n  namespace: kube-system\n\
                     spec:\n  priorityClassName: system-node-critical\n  containers:\n  - name: c\n    image: busybox\n"
                ),
            )?;
        }
        let gate = FsGate::new(&settings, &root.path().join("state"))?.with_forced_copy(copy);
        let t = Instant::now();
        let active = gate.active()?;
        let scan = t.elapsed();
        let t = Instant::now();
        for m in &active {
            gate.gate(&m.file_name)?;
        }
        let gated = t.elapsed();
        let t = Instant::now();
        let kept = gate.restore_all()?;
        let restored = t.elapsed();
        assert!(kept.is_empty());
        let t = Instant::now();
        gate.recover()?;
        let recovered = t.elapsed();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{n} manifests on {base} ({}): scan+parse {:.1} ms; gate {:.2} ms/manifest; \
             restore {:.2} ms/manifest; recover (journal of {} records) {:.1} ms",
            if copy { "copy path" } else { "rename path" },
            ms(scan),
            ms(gated) / n as f64,
            ms(restored) / n as f64,
            4 * n,
            ms(recovered),
        );
    }
    Ok(())
}
