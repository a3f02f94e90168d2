use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

use nodegrace::commands as cli;

/// Makes Kubernetes node shutdown and reboot safe for workloads.
#[derive(Debug, Parser)]
#[command(name = "nodegrace", version, about, long_about = None, after_help = EXIT_CODES)]
struct Cli {
    /// Main configuration file; drop-ins are read from `config.d/` beside it.
    #[arg(long, global = true, env = "NODEGRACE_CONFIG", default_value = nodegrace::DEFAULT_CONFIG_PATH)]
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
    /// Dry run: which pods a shutdown starting now would drain, in which order and band, with
    /// which share of the budget and grace period, and which would be escalated.
    #[command(after_help = PLAN_HELP)]
    Plan {
        /// Plan for the pods in FILE (`-`: standard input): `kubectl get pods -o yaml` or `-o
        /// json` output (a List, a PodList, a single Pod, or a multi-document YAML stream).
        /// Without it, the node's pods are read from the apiserver with the configured
        /// kubeconfig.
        #[arg(long, value_name = "FILE")]
        pods: Option<PathBuf>,
        /// Shutdown budget, e.g. `5m` or `90s`, at most 24h (the longest `shutdown.max_delay`).
        /// Default: the running daemon's effective budget from its status file, else
        /// `shutdown.max_delay`.
        #[arg(long, value_name = "DURATION", value_parser = cli::parse_budget)]
        budget: Option<Duration>,
        /// Plan a shutdown that lost this much of its budget before its drain could go on
        /// (e.g. `20s` to an unreachable apiserver): what is left is split over the pods, as
        /// the daemon does when the apiserver answers again.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        lost: Option<Duration>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = cli::OutputFormat::Table)]
        output: cli::OutputFormat,
    },
    /// Complete this node's shutdown NodeMaintenance (stage Complete: the daemon then
    /// uncordons the node if nodegrace cordoned it) and restore its gated static pods.
    #[command(after_help = COMPLETE_HELP)]
    Complete,
    /// This node at a glance: daemon and inhibitor, budget and logind's delay, apiserver,
    /// active NodeMaintenances, gated static pods, the last shutdown and an offline drain not
    /// yet recorded.
    #[command(after_help = STATUS_HELP)]
    Status {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = cli::OutputFormat::Table)]
        output: cli::OutputFormat,
    },
    /// A node's last shutdowns drawn on a time axis (its bands, the pods that waited and on
    /// what, the apiserver's outages and re-plans, the escalations), read from the Events
    /// the daemon wrote on its shutdown NodeMaintenance: from any machine with a kubeconfig.
    /// With --wave, a RebootWave's turns instead.
    #[command(after_help = HISTORY_HELP)]
    History {
        /// The node's name.
        #[arg(required_unless_present = "wave", conflicts_with = "wave")]
        node: Option<String>,
        /// A RebootWave instead: its slots now and its turns as its nodes' Events tell them.
        #[arg(long, value_name = "NAME")]
        wave: Option<String>,
        /// The kubeconfig to read with (default: $KUBECONFIG, then in-cluster config). Not
        /// the node's configuration.
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
    },
    /// Ask for this node's turn in the RebootWave that selects it (as the sentinel
    /// /run/reboot-required does): it drains and reboots when the wave's limits allow.
    /// Without a wave selecting the node, nothing reboots unless `reboot.without_wave` is
    /// true (then one node of the cluster at a time).
    Reboot {
        /// Withdraw the ask (a slot already taken is seen through to the reboot).
        #[arg(long)]
        cancel: bool,
    },
    /// nodegrace's identity on this node (nodegrace:node:<node> in nodegrace:nodes): request
    /// it, or approve nodes' requests.
    #[command(subcommand)]
    Credentials(CredentialsCommand),
    /// systemd generator (run by systemd through nodegrace-generator): writes the unit
    /// drop-in that creates the configured directories and adds them to ReadWritePaths=.
    #[command(hide = true)]
    Generator {
        /// Where systemd wants normal-priority generated units.
        normal_dir: PathBuf,
        /// Early and late generator directories (unused).
        #[arg(num_args = 0..=2)]
        other_dirs: Vec<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum CredentialsCommand {
    /// On the node, as root: make a key and a CertificateSigningRequest for this node's
    /// identity with the kubelet's credential (node.kubelet_kubeconfig), wait for its
    /// approval and write node.kubeconfig (mode 0600).
    #[command(after_help = REQUEST_HELP)]
    Request {
        /// How long to wait for an administrator (or `credentials approve`) to approve it.
        #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// Request a new certificate even though the current one is not due for renewal.
        #[arg(long)]
        force: bool,
    },
    /// For an administrator: approve the pending requests of nodes for their own nodegrace
    /// identity, and nothing else (rules below); never denies.
    #[command(after_help = APPROVE_HELP)]
    Approve {
        /// The approver's kubeconfig (default: $KUBECONFIG, then in-cluster config). Not
        /// the node's configuration.
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        /// Keep watching and approve requests as they come, until interrupted.
        #[arg(long)]
        watch: bool,
        /// Say what would be approved without approving.
        #[arg(long)]
        dry_run: bool,
        /// Leave requests asking for a longer certificate lifetime for a person.
        #[arg(long, value_name = "DURATION", default_value = "8760h", value_parser = humantime::parse_duration)]
        max_lifetime: Duration,
    },
}

const REQUEST_HELP: &str = "\
The request is signed by kubernetes.io/kube-apiserver-client for CN=nodegrace:node:<node>,
O=nodegrace:nodes, with the lifetime of node.credential_lifetime; the apiserver records the
kubelet (system:node:<node>) as its requester. Approve it with
  kubectl certificate approve <name>
after checking that spec.username is system:node:<the node in the CN> (or run
`nodegrace credentials approve`, which checks that). The key waits in
<node.kubeconfig>.pending-key until then: running the command again picks up the same request.
When node.kubeconfig already holds this node's certificate and it is not yet due for renewal
(two thirds of its lifetime), nothing is done unless --force. The daemon renews the
certificate itself (node.renew_credential).

Exit codes: 0 written (or nothing due), 1 failure: the request was denied, not approved in
time, or the apiserver or the kubelet's credential could not be used; 2 invalid
configuration or usage.";

const APPROVE_HELP: &str = "\
A request is approved only when: its signer is kubernetes.io/kube-apiserver-client; it was
made by a kubelet (spec.username system:node:<node>, group system:nodes); its subject is
exactly CN=nodegrace:node:<that same node>, O=nodegrace:nodes, without extensions or
subject alternative names, and its signature verifies; its usages are within client auth,
digital signature and key encipherment; its expirationSeconds is set and at most
--max-lifetime; and the Node exists. Anything else is listed and left for a person.

The limit: whoever holds a node's kubelet credential obtains that node's nodegrace identity,
which reaches no other node (packaging/rbac/README.md). The approver's own identity needs
the ClusterRole in packaging/rbac/approver.yaml (approving kube-apiserver-client requests:
hold it carefully).

Exit codes: 0 done, 1 failure, 2 usage.";

const PLAN_HELP: &str = "\
The plan uses the configured [drain] plan and reserves. A pod list is one node's pods: the
node its pods name in spec.nodeName (pods bound to no node are ignored), or this node when
none is named; a list spanning several nodes is refused. Terminal pods (Succeeded, Failed) are
listed as ignored. A pod is escalated when its grace period does not fit its step's share of
the budget (or the step has no share because the budget is below the reserves): it is then
deleted at the step's escalation time with its grace cut to what is left of the share. The
offline view shows what the fallback (no apiserver) would do: the kubelet's priority bands.

Exit codes: 0 plan printed, 1 the pods could not be read (bad file, apiserver unreachable:
use --pods), 2 invalid configuration or usage.";

const COMPLETE_HELP: &str = "\
A static pod manifest whose name is back in the manifest directory is never overwritten: it
stays in the gate directory and is listed. An interrupted move that the files on disk cannot
settle (the file is in neither directory, or the journal record is impossible or unreadable)
touches nothing: its journal record is moved to static-pods.journal.set-aside in state_dir,
listed with what to do, and every other gated manifest is still restored.

Exit codes: 0 done, 1 the apiserver could not be reached (nothing changed), or something was
left for you to decide (a manifest kept aside or not restored, a journal record set aside or
not settled), 2 invalid configuration or usage.";

const STATUS_HELP: &str = "\
Each section is read on its own; one that cannot be read says why and the others are still
printed. The apiserver is probed for at most 3s. The daemon's status file is
/run/nodegrace/status.json ($NODEGRACE_STATUS_FILE overrides it); state.json, pods.json and
offline-drain.json are read from state_dir, gated manifests from static_pods.gate_dir. Active NodeMaintenances are the
ones not Complete that have an entry for this node, are its shutdown maintenance, or whose
nodeSelector matches the Node (by name only, when the Node cannot be read).

The exit code says whether the node is protected, with -o json too (the report is printed
in every case):
  0  protected: the daemon runs, holds its shutdown delay inhibitor, and its budget covers
     the reserves the drain plan needs for the pods of its pod cache (sections such as the
     apiserver may still be unknown)
  1  nothing could be determined (status file, state directory, static pod gate and
     apiserver all unreadable)
  2  invalid configuration or usage
  3  the daemon is not running (no status file, its process is gone, or the file cannot
     be read)
  4  the daemon holds no shutdown delay inhibitor (still starting, or released for a
     shutdown under way): a shutdown now would not wait for a drain
  5  the budget is below the reserves the drain plan needs for the node's pods (the
     reserves are scaled down and ordinary pods get no time)";

const HISTORY_HELP: &str = "\
Reads the Events nodegrace wrote on NodeMaintenance shutdown-<node> (namespace default, where
Events of cluster-scoped objects live; the apiserver keeps them an hour by default) and that
maintenance, and draws each shutdown they tell, at most the last 5: one time axis, a bar per
band, the apiserver's outages (from each re-plan's time lost), a row per pod whose eviction was
refused (from the first refusal until it was escalated or its band ended), and R (re-planned),
E (escalated) and F (offline fallback) where they happened, then the same as a list. Lines fit
the terminal's width (else $COLUMNS, else 80); colour only on a terminal without NO_COLOR. Needs
get on the NodeMaintenance and list on Events in namespace default: the ClusterRole
nodegrace-viewer (/usr/share/nodegrace/rbac/viewer.yaml) grants exactly that.

With --wave NAME: the RebootWave's members and slots now, then every Event nodegrace wrote on a
Node about it (slots taken, freed, taken back, a stuck node, and why its nodes waited), oldest
first, and each node's turn from its slot taken to freed. Needs get on the RebootWave too
(nodegrace-viewer grants it).";

const EXIT_CODES: &str =
    "Exit codes: 0 success, 1 failure (message on stderr), 2 invalid configuration or usage.";

fn main() -> ExitCode {
    cli::record_panics();
    let args = match Cli::try_parse() {
        Ok(args) => args,
        // Help and version are output like any other (clap's own printing ignores a full
        // stdout and exits 0).
        Err(e) if !e.use_stderr() => {
            let printed = cli::print_stdout(&e.render().to_string());
            return cli::exit_code("nodegrace", printed.map(|()| ExitCode::SUCCESS));
        }
        Err(e) => e.exit(),
    };
    if !matches!(args.command, Command::Run) {
        nodegrace::commands::init_cli();
    }
    let result = match args.command {
        Command::Run => cli::run(&args.config),
        Command::CheckConfig => cli::check_config(&args.config),
        Command::Crds => cli::crds(),
        Command::Completions { shell } => completions(shell),
        Command::Man => man_page(),
        Command::Plan {
            pods,
            budget,
            lost,
            output,
        } => cli::plan(
            &args.config,
            &cli::PlanOptions {
                pods,
                budget,
                lost,
                output,
            },
        ),
        Command::Status { output } => cli::status(&args.config, output),
        Command::Complete => cli::complete(&args.config),
        Command::Reboot { cancel } => cli::reboot(cancel),
        Command::History {
            node,
            wave,
            kubeconfig,
        } => match wave {
            Some(wave) => cli::wave_history(&wave, kubeconfig.as_deref()),
            // clap requires a node without --wave.
            None => cli::history(&node.unwrap_or_default(), kubeconfig.as_deref()),
        },
        Command::Credentials(CredentialsCommand::Request { wait, force }) => {
            nodegrace::commands::request_command(
                &args.config,
                &nodegrace::commands::RequestOptions { wait, force },
            )
        }
        Command::Credentials(CredentialsCommand::Approve {
            kubeconfig,
            watch,
            dry_run,
            max_lifetime,
        }) => nodegrace::commands::approve_command(
            kubeconfig.as_deref(),
            &nodegrace::commands::ApproveOptions {
                watch,
                dry_run,
                max_lifetime,
            },
        ),
        Command::Generator { normal_dir, .. } => {
            nodegrace::commands::generator_command(&args.config, &normal_dir)
        }
    };
    cli::exit_code("nodegrace", result)
}

// Both generators are written into memory first: clap_complete panics when its writer fails.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "nodegrace", &mut out);
    cli::print_stdout(&String::from_utf8_lossy(&out))?;
    Ok(ExitCode::SUCCESS)
}

fn man_page() -> anyhow::Result<ExitCode> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut out)?;
    cli::print_stdout(&String::from_utf8_lossy(&out))?;
    Ok(ExitCode::SUCCESS)
}
