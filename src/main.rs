use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use nodegrace::cli;

/// Makes Kubernetes node shutdown and reboot safe for workloads.
#[derive(Debug, Parser)]
#[command(name = "nodegrace", version, about, long_about = None, after_help = EXIT_CODES)]
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
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
}

const EXIT_CODES: &str =
    "Exit codes: 0 success, 1 failure (message on stderr), 2 invalid configuration or usage.";

fn main() -> ExitCode {
    let args = Cli::parse();
    let result = match args.command {
        Command::Run => cli::run(&args.config),
        Command::CheckConfig => cli::check_config(&args.config),
        Command::Crds => cli::crds(),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "nodegrace",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => man_page(),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("nodegrace: {err:#}");
            ExitCode::from(cli::EXIT_FAILURE)
        }
    }
}

fn man_page() -> anyhow::Result<ExitCode> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut out)?;
    std::io::Write::write_all(&mut std::io::stdout(), &out)?;
    Ok(ExitCode::SUCCESS)
}
