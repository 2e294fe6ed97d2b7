//! `weir` — the broker binary: `weir serve` runs a node; the other subcommands are admin
//! tools for operators.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "weir", version, about = "A Kafka-compatible storage node")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker node that Kafka clients connect to.
    Serve(ServeArgs),
    /// Inspect log files on disk.
    Log {
        #[command(subcommand)]
        command: LogCommand,
    },
    /// Consumer groups of a running node: members, assignment, committed offsets, lag.
    Groups {
        /// HOST:PORT of the node.
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap_server: String,
        #[command(subcommand)]
        command: GroupsCommand,
    },
    /// The cluster as a running node sees it: nodes, controller, under-replicated and
    /// offline partitions.
    Cluster {
        /// HOST:PORT of any node.
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap_server: String,
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// ACLs of a running node: add, list, remove (like kafka-acls.sh).
    Acls(weir::admin_cli::acls::AclsArgs),
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Nodes, the active controller, under-replicated and offline partitions.
    Status,
}

#[derive(Subcommand)]
enum GroupsCommand {
    /// Every group with its state.
    List,
    /// One group: per partition the committed offset, log end offset, lag and owner.
    Describe { group: String },
}

#[derive(Subcommand)]
enum LogCommand {
    /// Print batches and index entries of segment files, like Kafka's DumpLogSegments.
    Dump {
        /// `.log`, `.index` or `.timeindex` files, or partition directories.
        paths: Vec<PathBuf>,
    },
    /// Check every batch (framing, CRC-32C, offsets) of the `.log` files under the paths
    /// (segment files, partition directories or a data directory); list every damaged
    /// byte range and exit non-zero if there is one.
    Verify {
        /// `.log` files, partition directories or a data directory.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Data directory (Kafka key `log.dirs`). Default: ./weir-data.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to listen on, HOST:PORT (Kafka key `listeners`). Default: 127.0.0.1:9092.
    /// Port 0 picks a free port; the ready line shows the real one.
    #[arg(long)]
    listen: Option<String>,
    /// HOST:PORT clients are told to connect to (Kafka key `advertised.listeners`).
    #[arg(long)]
    advertised_listener: Option<String>,
    /// This node's id (Kafka key `node.id`). Default: 0.
    #[arg(long)]
    node_id: Option<i32>,
    /// Number of shards (one pinned thread each). Default: one per core.
    #[arg(long)]
    shards: Option<usize>,
    /// A Kafka-style server.properties file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one config key, KEY=VALUE (repeatable; applied after --config).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut props = match &args.config {
        Some(path) => weir::config::Properties::load(path)?,
        None => weir::config::Properties::default(),
    };
    for kv in &args.set {
        props.set_arg(kv)?;
    }
    let cli = weir::config::CliOverrides {
        data_dir: args.data_dir,
        listen: args.listen,
        advertised_listener: args.advertised_listener,
        node_id: args.node_id,
        shards: args.shards,
    };
    let config = weir::config::Config::resolve(props, &cli)?;
    for warning in weir::config::keys::warnings(&config.props) {
        tracing::warn!("{warning}");
    }
    weir::server::serve(config)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Acls(args) => weir::admin_cli::acls::run(args),
        Command::Serve(args) => {
            init_logging();
            match serve(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("weir serve: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Groups {
            bootstrap_server,
            command,
        } => {
            let mut out = std::io::stdout().lock();
            let done = match command {
                GroupsCommand::List => weir::admin_cli::list(&bootstrap_server, &mut out),
                GroupsCommand::Describe { group } => {
                    weir::admin_cli::describe(&bootstrap_server, &group, &mut out)
                }
            };
            match done {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("weir groups: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Cluster {
            bootstrap_server,
            command: ClusterCommand::Status,
        } => {
            match weir::admin_cli::cluster::status(&bootstrap_server, &mut std::io::stdout().lock())
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("weir cluster status: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Log {
            command: LogCommand::Verify { paths },
        } => match weir::storage::dump::verify_paths(&paths, &mut std::io::stdout().lock()) {
            Ok(summary) if summary.damaged == 0 => ExitCode::SUCCESS,
            Ok(summary) => {
                eprintln!("weir log verify: {} damaged range(s)", summary.damaged);
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("weir log verify: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Log {
            command: LogCommand::Dump { paths },
        } => match weir::storage::dump::dump_paths(&paths, &mut std::io::stdout().lock()) {
            Ok(summary) if summary.problems == 0 => ExitCode::SUCCESS,
            Ok(summary) => {
                eprintln!("weir log dump: {} problem(s) found", summary.problems);
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("weir log dump: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
