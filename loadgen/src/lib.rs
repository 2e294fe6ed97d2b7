//! `weir-loadgen` as a library: measurement, scheduling, reports, and a Kafka client.
//!
//! - [`schedule`]: the open-loop send schedule (intended send times, no coordinated omission).
//! - [`stats`]: HdrHistogram latency recording, throughput, lag, errors, per-second lines.
//! - [`report`]: the summary table, `--json`, and the self-contained HTML report.

pub mod report;
pub mod schedule;
pub mod stats;
