//! The shipped Grafana dashboard against a real Prometheus (Debian's `prometheus`) that
//! found the node through the Kubernetes API with the scrape configuration of
//! docs/operating.md, word for word, and scraped nodegrace (shipped configuration: metrics on
//! `0.0.0.0:9847`) through a real drain and the next boot. Every panel's every query,
//! with the dashboard's variables filled in as Grafana fills them, returns data: a range
//! query over the whole story for the panels drawn over time, an instant query for the
//! others at the moment the panel is about (a budget blocking: during the drain; the last
//! shutdown: after the reboot).
//!
//! Its own test binary: the node's daemon needs port 9847 of the host's network, which the
//! nodes of a test binary running tests side by side would share. Only with
//! `NODEGRACE_REAL_TESTS=1` as root (`scripts/test-all`).

mod real;
mod realk8s;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use realk8s::fixture::*;
use serde_json::Value;

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/packaging/grafana/nodegrace-dashboard.json"
);
const OPERATING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operating.md");
/// The escalation of the blocked pod comes 10 s into the drain with this budget (as in
/// `realk8s_shutdown`); the only change to the shipped configuration.
const BUDGET: &str = "[shutdown]\nmax_delay = \"110s\"\n";
const SCRAPE_INTERVAL_S: u64 = 1;

/// A Prometheus of its own: a temp dir for its data, a free port, killed when dropped.
struct Prometheus {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Started with `scrape` (the documented scrape configuration) as its only job.
    fn start(scrape: serde_yaml::Value) -> Prometheus {
        let binary = real::which("prometheus").expect(
            "prometheus is missing; scripts/install-test-deps installs it (Debian package prometheus)",
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let config = serde_yaml::to_string(&serde_json::json!({
            "global": {
                "scrape_interval": format!("{SCRAPE_INTERVAL_S}s"),
                "scrape_timeout": format!("{SCRAPE_INTERVAL_S}s"),
            },
            "scrape_configs": [scrape],
        }))
        .expect("prometheus config");
        std::fs::write(dir.path().join("prometheus.yml"), &config).expect("prometheus.yml");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting prometheus");
        let mut p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        real::wait_until("prometheus ready", Duration::from_secs(60), || {
            if let Ok(Some(exit)) = p.child.try_wait() {
                panic!("prometheus exited ({exit}):\n{}\n{config}", p.log());
            }
            curl(&[&format!("{}/-/ready", p.url)]).ok()
        });
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `/api/v1/<path>` with `params`; its `data`, or the error it answered.
    fn api(&self, path: &str, params: &[(&str, String)]) -> Result<Value, String> {
        let mut args = vec!["-G".to_string(), format!("{}/api/v1/{path}", self.url)];
        for (k, v) in params {
            args.push("--data-urlencode".into());
            args.push(format!("{k}={v}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let body = curl(&args)?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if v["status"] != "success" {
            return Err(body);
        }
        Ok(v["data"].clone())
    }

    fn instant(&self, expr: &str, at: f64) -> Result<Value, String> {
        self.api(
            "query",
            &[("query", expr.into()), ("time", format!("{at:.3}"))],
        )
    }

    fn range(&self, expr: &str, start: f64, end: f64) -> Result<Value, String> {
        self.api(
            "query_range",
            &[
                ("query", expr.into()),
                ("start", format!("{start:.3}")),
                ("end", format!("{end:.3}")),
                ("step", "1".into()),
            ],
        )
    }
}

/// `curl -sS --fail-with-body ARGS`: its body, or why not.
fn curl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body", "--max-time", "10"])
        .args(args)
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(body)
    } else {
        Err(format!("{body}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// Whether a query's data holds a number: a sample or point that is not NaN (what a panel
/// draws; `histogram_quantile` over no shutdown is NaN).
fn has_data(data: &Value) -> bool {
    let number = |p: &Value| {
        p.get(1)
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<f64>().ok())
            .is_some_and(|v| !v.is_nan())
    };
    data["result"].as_array().is_some_and(|series| {
        series.iter().any(|s| {
            s.get("value").is_some_and(number)
                || s["values"]
                    .as_array()
                    .is_some_and(|points| points.iter().any(number))
        })
    })
}

/// The scrape configuration docs/operating.md gives, parsed from its yaml block.
fn documented_scrape_config() -> serde_yaml::Value {
    let text = std::fs::read_to_string(OPERATING).expect("docs/operating.md");
    let block = text
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split_once("```").map(|(yaml, _)| yaml))
        .find(|yaml| yaml.contains("kubernetes_sd_configs"))
        .expect("docs/operating.md gives a scrape configuration with kubernetes_sd_configs");
    let doc: serde_yaml::Value = serde_yaml::from_str(block).expect("the documented yaml");
    let jobs = doc["scrape_configs"].as_sequence().expect("scrape_configs");
    assert_eq!(jobs.len(), 1, "{block}");
    jobs[0].clone()
}

/// What Prometheus's Kubernetes node role discovers for `node`: its address (the first
/// InternalIP) with the kubelet's port, and its name as `__meta_kubernetes_node_name`.
async fn node_role_targets(c: &kube::Client, node: &str) -> Value {
    let n = kube::Api::<k8s_openapi::api::core::v1::Node>::all(c.clone())
        .get(node)
        .await
        .expect("the node");
    let status = n.status.unwrap_or_default();
    let ip = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .expect("an InternalIP")
        .address;
    let port = status
        .daemon_endpoints
        .and_then(|d| d.kubelet_endpoint)
        .map_or(10250, |e| e.port);
    serde_json::json!([{
        "targets": [format!("{ip}:{port}")],
        "labels": {"__meta_kubernetes_node_name": node},
    }])
}

/// One panel's query and how the dashboard evaluates it.
struct Query {
    panel: String,
    row: String,
    expr: String,
    instant: bool,
}

/// Every target of every panel, in order, with the row it sits under.
fn dashboard_queries() -> Vec<Query> {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).expect("dashboard"))
            .expect("dashboard JSON");
    let mut row = String::new();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        if panel["type"] == "row" {
            row = title;
            continue;
        }
        for t in panel["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                panel: title.clone(),
                row: row.clone(),
                expr: t["expr"].as_str().expect("expr").to_string(),
                instant: t["instant"].as_bool().unwrap_or(false),
            });
        }
    }
    out
}

/// `expr` with the variables Grafana fills in: the node, the range shown, and
/// `$__rate_interval` (four scrape intervals at least).
fn filled(expr: &str, node: &str, range_s: u64) -> String {
    expr.replace("$node", node)
        .replace("$__rate_interval", &format!("{}s", 4 * SCRAPE_INTERVAL_S))
        .replace("$__range", &format!("{range_s}s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_draws_every_dashboard_panel_from_a_real_drain_and_the_next_boot() {
    if !realk8s::enabled(
        "realk8s_prometheus::a_real_prometheus_draws_every_dashboard_panel_from_a_real_drain_and_the_next_boot",
    ) {
        return;
    }
    real::require_prerequisites();
    let mut f = Fixture::new("ng-prom").await;
    f.node
        .config_dropins
        .push(("50-budget.toml".into(), BUDGET.into()));
    let (c, node) = (&f.admin.clone(), f.name.clone());
    f.every_band_one_blocked().await;

    // The documented configuration as it stands, but for its discovery: Debian's
    // Prometheus is built without Kubernetes discovery, so the node role's target for this
    // node (its InternalIP and kubelet port, its name as a meta label) is given in a file.
    let mut scrape = documented_scrape_config();
    let sd = scrape
        .as_mapping_mut()
        .expect("a scrape job")
        .remove("kubernetes_sd_configs")
        .expect("kubernetes_sd_configs");
    assert_eq!(sd[0]["role"], "node", "{sd:?}");
    let targets = tempfile::tempdir().expect("tempdir");
    let targets_file = targets.path().join("nodes.json");
    std::fs::write(&targets_file, node_role_targets(c, &node).await.to_string())
        .expect("targets file");
    scrape["file_sd_configs"] = serde_yaml::from_str(&format!(
        "[{{files: [{}], refresh_interval: 1s}}]",
        targets_file.display()
    ))
    .expect("file_sd_configs");
    let prom = Prometheus::start(scrape);
    let began = realk8s::now_unix();

    f.node.boot();
    let up = |p: &Prometheus| {
        p.instant(
            &format!("up{{job=\"nodegrace\",node=\"{node}\"}} == 1"),
            realk8s::now_unix(),
        )
        .ok()
        .filter(has_data)
    };
    real::wait_until(
        "prometheus to scrape the node's nodegrace",
        Duration::from_secs(60),
        || up(&prom),
    );
    let container = f.node.shutdown("poweroff", Duration::from_secs(140));
    let (signal, release) = signal_and_release(&container);
    let reqs = f.requests();
    let blocked = reqs
        .iter()
        .find(|r| r.subresource == "eviction" && r.code == 429 && r.name.starts_with("db-"))
        .map(|r| r.received)
        .unwrap_or_else(|| panic!("db was never refused:\n{}", container.journal_text()));
    drop(container);

    // The next boot: its daemon tells the last shutdown (and counts its duration once a
    // scrape has shown the series at zero).
    f.node.boot();
    let counted = format!(
        "sum(nodegrace_shutdown_duration_seconds_count{{node=\"{node}\",kind=\"poweroff\"}}) == 1"
    );
    real::wait_until(
        "the next boot's daemon to count the shutdown's duration",
        Duration::from_secs(60),
        || {
            prom.instant(&counted, realk8s::now_unix())
                .ok()
                .filter(has_data)
        },
    );
    // Two more scrapes: a rate over four scrape intervals holds both sides of the count.
    tokio::time::sleep(Duration::from_secs(2 * SCRAPE_INTERVAL_S + 1)).await;
    let now = realk8s::now_unix();
    let range_s = (now - began).ceil() as u64 + 1;

    let mut empty = Vec::new();
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{} queries", queries.len());
    for q in &queries {
        let expr = filled(&q.expr, &node, range_s);
        // An instant panel is read at the moment it is about: what blocks, while the
        // budget refused the drain (2 s after the first refusal, 8 s before the
        // escalation); the rest, now (the last shutdown, after the reboot).
        let data = if q.instant {
            let at = if q.row.starts_with("What blocks") {
                blocked + 2.0
            } else {
                now
            };
            prom.instant(&expr, at)
        } else {
            prom.range(&expr, began, now)
        };
        match data {
            Ok(d) if has_data(&d) => {}
            Ok(d) => empty.push(format!("{} [{}]: {expr}\n  -> {d}", q.panel, q.row)),
            Err(e) => empty.push(format!("{} [{}]: {expr}\n  -> error {e}", q.panel, q.row)),
        }
    }
    assert!(
        empty.is_empty(),
        "panels without data (signal {signal:.1}, release {release:.1}, first refusal {blocked:.1}, now {now:.1}):\n{}\nprometheus:\n{}",
        empty.join("\n"),
        prom.log()
    );
    // The check itself: a query of a series nodegrace never served has no data.
    let missing = prom
        .range("nodegrace_not_served_total", began, now)
        .expect("query");
    assert!(!has_data(&missing), "{missing}");
    println!(
        "{} dashboard queries, each with data from a real Prometheus; signal -> release {:.2} s",
        queries.len(),
        release - signal
    );
    f.cleanup().await;
}
