use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use nodegrace::cli;

/// Makes Kubernetes node shutdown and reboot safe for workloads.
#[derive(Debug, Parser)]
#[command(name = "nodegrace", version, about, long_about = None)]
struct Cli {
    /// Main configuration file; drop-ins are read from `config.d/` beside it.
    #[arg(long, global = true, env = "NODEGRACE_CONFIG", default_value = nodegrace::config::DEFAULT_CONFIG_PATH)]
    config: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon (normally started by systemd).
    Run,
    /// Validate the configuration and print the effective settings.
    CheckConfig,
    /// Print the CustomResourceDefinitions nodegrace uses, as YAML.
    Crds,
}

fn main() -> ExitCode {
    let args = Cli::parse();
    let result = match args.command {
        Command::Run => cli::run(&args.config),
        Command::CheckConfig => cli::check_config(&args.config),
        Command::Crds => cli::crds(),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("nodegrace: {err:#}");
            ExitCode::from(cli::EXIT_FAILURE)
        }
    }
}
