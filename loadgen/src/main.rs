//! `weir-loadgen` — throughput, latency and lag against any Kafka-compatible broker.
//!
//! The work is in the library (`weir_loadgen`); this file parses flags and dispatches.

use clap::Parser;
use weir_loadgen::cli::{Cli, Cmd};
use weir_loadgen::{commands, verify};

fn main() {
    let cli = Cli::parse();
    if let Err(e) = cli.cmd.security().install() {
        eprintln!("weir-loadgen: error: {e:#}");
        std::process::exit(1);
    }
    let result = match &cli.cmd {
        Cmd::Produce(l) => commands::single(l, true, false, "produce").map(|_| 0),
        Cmd::Consume(l) => commands::single(l, false, true, "consume").map(|_| 0),
        Cmd::E2e(l) => commands::single(l, true, true, "e2e").map(|_| 0),
        Cmd::Sweep(s) => commands::sweep(s).map(|_| 0),
        Cmd::Plan(p) => commands::plan(p).map(|_| 0),
        Cmd::Quickstart(q) => commands::quickstart(q).map(|_| 0),
        Cmd::Verify(v) => verify::verify(v).map(|f| {
            let why = if v.strict {
                f.strict_failures()
            } else {
                Vec::new()
            };
            for w in &why {
                eprintln!("weir-loadgen: verify --strict: {w}");
            }
            if why.is_empty() { 0 } else { 2 }
        }),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("weir-loadgen: error: {e:#}");
            std::process::exit(1);
        }
    }
}
