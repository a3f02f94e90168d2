//! `nodegrace-sim`: plays a node shutdown against the test kit's fakes. Built from the
//! repository only (`cargo simulate`); the packages never ship it.

mod simulate;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use nodegrace::commands as cli;

/// Play a node shutdown on your laptop: the real nodegrace daemon and drain against an
/// in-memory logind, apiserver, kubelet and CRI runtime; prints the timeline and the totals.
#[derive(Debug, Parser)]
#[command(name = "nodegrace-sim", version, long_about = None, after_help = SIMULATE_HELP)]
struct Cli {
    /// nodegrace configuration whose drain plan, reserves and fallback bands are used when
    /// the file exists; drop-ins are read from `config.d/` beside it.
    #[arg(long, env = "NODEGRACE_CONFIG", default_value = nodegrace::DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// Simulate the pods in FILE (`kubectl get pods -o yaml` or `-o json` output of one
    /// node). Without it, a built-in sample node.
    #[arg(long, value_name = "FILE")]
    pods: Option<PathBuf>,
    /// Shutdown budget (logind's InhibitDelayMaxSec and shutdown.max_delay), e.g. `5m`;
    /// more than 0s and at most 24h, as shutdown.max_delay.
    #[arg(long, value_name = "DURATION", value_parser = simulate::parse_budget, default_value = "5m")]
    budget: Duration,
    /// Make the apiserver unreachable: the drain falls back to the kubelet-like priority
    /// bands through the CRI runtime.
    #[arg(long)]
    apiserver_down: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = cli::OutputFormat::Table)]
    output: cli::OutputFormat,
}

const SIMULATE_HELP: &str = "\
Nothing on the machine is touched and no root, D-Bus or cluster is needed: the daemon runs
against fakes in this process, with the drain plan, reserves and fallback bands of --config
when that file exists (else the defaults). Pods exit after a time scaled down
from their grace period, so a shutdown of minutes plays in a few seconds; the timestamps are
the simulation's real time since PrepareForShutdown.

Exit codes: 0 the shutdown was simulated, 1 it could not be (bad pod file, the inhibitor was
not released), 2 invalid configuration or usage.";

fn main() -> ExitCode {
    cli::record_panics();
    let args = Cli::parse();
    let result = simulate::simulate_command(
        &args.config,
        &simulate::SimulateOptions {
            pods: args.pods,
            budget: args.budget,
            apiserver_down: args.apiserver_down,
            output: args.output,
        },
    );
    cli::exit_code("nodegrace-sim", result)
}
