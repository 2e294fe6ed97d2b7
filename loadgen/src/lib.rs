//! `weir-loadgen` as a library: measurement, scheduling, reports, and a Kafka client.
//!
//! - [`schedule`]: the open-loop send schedule (intended send times, no coordinated omission).
//! - [`stats`]: HdrHistogram latency recording, throughput, lag, errors, per-second lines.
//! - [`report`]: the summary table, `--json`, and the self-contained HTML report.
//! - [`client`]: the Kafka client (connections, metadata, producer, consumer).
//! - [`run`]: one measured run (threads, progress line, lag sampling, summary).
//! - [`scrape`]: follower lag from the brokers' Prometheus metrics during a run.
//! - [`cli`], [`commands`], [`verify`]: the subcommands; [`broker`]: a local `weir` process.

pub mod broker;
pub mod cli;
pub mod client;
pub mod commands;
pub mod report;
pub mod run;
pub mod schedule;
pub mod scrape;
pub mod stats;
pub mod verify;
