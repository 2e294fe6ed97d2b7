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
        #[command(flatten)]
        security: weir::admin_cli::security::SecurityArgs,
        #[command(subcommand)]
        command: GroupsCommand,
    },
    /// The cluster as a running node sees it: nodes, controller, under-replicated and
    /// offline partitions.
    Cluster {
        /// HOST:PORT of any node.
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap_server: String,
        #[command(flatten)]
        security: weir::admin_cli::security::SecurityArgs,
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// ACLs of a running node: add, list, remove (like kafka-acls.sh).
    Acls(weir::admin_cli::acls::AclsArgs),
    /// Topics of a running cluster: create, list, describe (leader, replicas, ISR per
    /// partition, as `kafka-topics --describe`), delete, alter.
    Topics {
        /// HOST:PORT of any node.
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap_server: String,
        #[command(flatten)]
        security: weir::admin_cli::security::SecurityArgs,
        #[command(subcommand)]
        command: TopicsCommand,
    },
}

#[derive(Subcommand)]
enum TopicsCommand {
    /// Create a topic.
    Create {
        topic: String,
        /// Partition count (default: the broker's `num.partitions`).
        #[arg(long, default_value_t = -1)]
        partitions: i32,
        /// Replicas per partition (default: the broker's `default.replication.factor`).
        #[arg(long, default_value_t = -1)]
        replication_factor: i16,
        /// Explicit replicas, `1:2:3,2:3:1` (one list per partition; overrides the counts).
        #[arg(long)]
        replica_assignment: Option<String>,
        /// A topic config, KEY=VALUE (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        config: Vec<String>,
    },
    /// Topic names, one per line.
    List {
        /// Include internal topics (`__consumer_offsets`, `__transaction_state`).
        #[arg(long)]
        include_internal: bool,
    },
    /// Partitions with leader, replicas and ISR, and the topic's config overrides.
    Describe { topics: Vec<String> },
    /// Delete topics.
    Delete {
        #[arg(required = true)]
        topics: Vec<String>,
    },
    /// Add partitions and/or change configs.
    Alter {
        topic: String,
        /// New total partition count.
        #[arg(long)]
        partitions: Option<i32>,
        /// Replicas of the added partitions, `1:2:3,2:3:1`.
        #[arg(long)]
        replica_assignment: Option<String>,
        /// Set a topic config, KEY=VALUE (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        config: Vec<String>,
        /// Remove a topic config override (repeatable).
        #[arg(long = "delete-config", value_name = "KEY")]
        delete_config: Vec<String>,
    },
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

/// A panic anywhere ends the process (after the usual message and a log line). A shard
/// thread that unwound would otherwise leave the node half alive: its partitions
/// unserved, and a SIGTERM waiting for ever for it to drain. A supervisor restarts a
/// process that exits; it cannot tell that a thread is gone.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        tracing::error!("panic: {info}; aborting the process");
        std::process::abort();
    }));
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

fn topics(bootstrap: &str, command: TopicsCommand) -> anyhow::Result<()> {
    use weir::admin_cli::topics;
    let mut out = std::io::stdout().lock();
    let assignment =
        |text: Option<String>| text.map_or(Ok(Vec::new()), |t| topics::parse_assignment(&t));
    let configs = |kvs: Vec<String>| {
        kvs.iter()
            .map(|kv| topics::parse_config(kv))
            .collect::<anyhow::Result<Vec<_>>>()
    };
    match command {
        TopicsCommand::Create {
            topic,
            partitions,
            replication_factor,
            replica_assignment,
            config,
        } => {
            let spec = topics::CreateSpec {
                name: topic,
                partitions,
                replication_factor,
                assignment: assignment(replica_assignment)?,
                configs: configs(config)?,
            };
            topics::create(bootstrap, &spec, &mut out)
        }
        TopicsCommand::List { include_internal } => {
            topics::list(bootstrap, include_internal, &mut out)
        }
        TopicsCommand::Describe { topics: names } => topics::describe(bootstrap, &names, &mut out),
        TopicsCommand::Delete { topics: names } => topics::delete(bootstrap, &names, &mut out),
        TopicsCommand::Alter {
            topic,
            partitions,
            replica_assignment,
            config,
            delete_config,
        } => {
            let spec = topics::AlterSpec {
                name: topic,
                partitions,
                assignment: assignment(replica_assignment)?,
                set: configs(config)?,
                delete: delete_config,
            };
            topics::alter(bootstrap, &spec, &mut out)
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A log line that cannot be written (stderr on a full disk, a closed pipe) is lost,
    // not reported: tracing reports it with `eprintln!`, which panics when stderr fails
    // too, and a panicking shard stopped the node (found with the log on a full disk).
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let security = match &cli.command {
        Command::Groups { security, .. }
        | Command::Cluster { security, .. }
        | Command::Topics { security, .. } => Some(security),
        Command::Acls(args) => Some(&args.security),
        _ => None,
    };
    if let Some(Err(e)) = security.map(weir::admin_cli::security::install) {
        eprintln!("weir: {e:#}");
        return ExitCode::FAILURE;
    }
    match cli.command {
        Command::Acls(args) => weir::admin_cli::acls::run(args),
        Command::Serve(args) => {
            init_logging();
            abort_on_panic();
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
            ..
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
            ..
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
        Command::Topics {
            bootstrap_server,
            command,
            ..
        } => match topics(&bootstrap_server, command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("weir topics: {e:#}");
                ExitCode::FAILURE
            }
        },
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
