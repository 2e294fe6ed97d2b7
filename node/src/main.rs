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
    /// Inspect log files on disk.
    Log {
        #[command(subcommand)]
        command: LogCommand,
    },
}

#[derive(Subcommand)]
enum LogCommand {
    /// Print batches and index entries of segment files, like Kafka's DumpLogSegments.
    Dump {
        /// `.log`, `.index` or `.timeindex` files, or partition directories.
        paths: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Log { command: LogCommand::Dump { paths } } => {
            match weir::storage::dump::dump_paths(&paths, &mut std::io::stdout().lock()) {
                Ok(summary) if summary.problems == 0 => ExitCode::SUCCESS,
                Ok(summary) => {
                    eprintln!("weir log dump: {} problem(s) found", summary.problems);
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln!("weir log dump: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
