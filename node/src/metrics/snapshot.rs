//! Gauges a shard computes from state it already has (its open partitions' replica state
//! and logs, its group coordinators), once per housekeeping tick, into a snapshot the
//! scrape reads. The data path never touches it: the shard takes the snapshot's lock once
//! a tick to replace it, the scrape thread once per scrape to read it.
//!
//! Label cardinality is bounded per shard: at most [`GROUPS_MAX`] groups,
//! [`GROUP_OFFSETS_MAX`] committed offsets (lag series) and [`FOLLOWERS_MAX`] follower
//! series; what a bound leaves out is counted in `weir_metrics_series_omitted`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use super::{ShardMetrics, escape, header};

/// Most consumer groups one shard reports (members, state).
pub const GROUPS_MAX: usize = 1_000;
/// Most committed offsets (group, topic, partition) one shard reports lag for.
pub const GROUP_OFFSETS_MAX: usize = 10_000;
/// Most (partition, follower) pairs one shard reports follower lag for (the laggiest).
pub const FOLLOWERS_MAX: usize = 10_000;
/// Most partition high watermarks one shard publishes for the group lag join.
pub const HIGH_WATERMARKS_MAX: usize = 100_000;

/// One shard's computed gauges.
#[derive(Default)]
pub struct ShardSnapshot {
    /// Segment files open in this shard's partition logs.
    pub open_files: u64,
    /// Bytes of recent batches this shard's logs hold in memory (their tail caches).
    pub tail_cache_bytes: u64,
    /// Partitions led here whose ISR is smaller than their replica set.
    pub under_replicated: u64,
    /// The HW of each open partition of this shard (group lag = HW − committed).
    pub high_watermarks: HashMap<(Arc<str>, i32), i64>,
    pub groups: Vec<GroupSnapshot>,
    pub followers: Vec<FollowerLag>,
    /// Series left out by the bounds above.
    pub omitted: u64,
}

/// A consumer group as its coordinator holds it.
pub struct GroupSnapshot {
    pub id: String,
    pub state: &'static str,
    pub members: usize,
    /// Committed offsets: topic, partition, offset.
    pub offsets: Vec<(Arc<str>, i32, i64)>,
}

/// One follower of a partition led here.
pub struct FollowerLag {
    pub topic: Arc<str>,
    pub partition: i32,
    pub follower: i32,
    /// Leader's log end − the follower's, in records (offsets).
    pub lag_records: u64,
    /// Since the follower's fetch last reached the leader's log end.
    pub since_caught_up_ms: i64,
}

/// A metric family: name, help, and how to get its value from `T`.
type Family<T, V> = (&'static str, &'static str, fn(&T) -> V);

/// Renders every shard's snapshot.
pub fn render(shards: &[ShardMetrics], out: &mut String) {
    let snaps: Vec<_> = shards
        .iter()
        .filter_map(|s| s.snapshot.lock().ok())
        .collect();
    let per_shard: [Family<ShardSnapshot, u64>; 4] = [
        (
            "weir_open_segment_files",
            "Segment files open in partition logs, by shard.",
            |s| s.open_files,
        ),
        (
            "weir_log_tail_cache_bytes",
            "Bytes of recently appended batches held in memory by partition logs, by shard (bounded by log.tail.cache.max.bytes).",
            |s| s.tail_cache_bytes,
        ),
        (
            "weir_under_replicated_partitions",
            "Partitions led here whose ISR is smaller than their replica set, by shard.",
            |s| s.under_replicated,
        ),
        (
            "weir_metrics_series_omitted",
            "Group and follower series left out by the per-shard label bounds, by shard.",
            |s| s.omitted,
        ),
    ];
    for (metric, help, get) in per_shard {
        header(out, metric, "gauge", help);
        for (i, s) in snaps.iter().enumerate() {
            let _ = writeln!(out, "{metric}{{shard=\"{i}\"}} {}", get(s));
        }
    }
    render_groups(&snaps, out);
    render_followers(&snaps, out);
}

fn render_groups(snaps: &[std::sync::MutexGuard<'_, ShardSnapshot>], out: &mut String) {
    header(
        out,
        "weir_group_members",
        "gauge",
        "Members of a consumer group, by group.",
    );
    for g in snaps.iter().flat_map(|s| &s.groups) {
        let _ = writeln!(
            out,
            "weir_group_members{{group=\"{}\"}} {}",
            escape(&g.id),
            g.members
        );
    }
    header(
        out,
        "weir_group_state",
        "gauge",
        "1 for the state a consumer group is in, by group and state.",
    );
    for g in snaps.iter().flat_map(|s| &s.groups) {
        let _ = writeln!(
            out,
            "weir_group_state{{group=\"{}\",state=\"{}\"}} 1",
            escape(&g.id),
            g.state
        );
    }
    header(
        out,
        "weir_group_lag_records",
        "gauge",
        "High watermark minus the committed offset, by group, topic and partition (partitions whose log is open on this node).",
    );
    let hw = |tp: &(Arc<str>, i32)| snaps.iter().find_map(|s| s.high_watermarks.get(tp));
    for g in snaps.iter().flat_map(|s| &s.groups) {
        for (topic, partition, committed) in &g.offsets {
            let Some(hw) = hw(&(topic.clone(), *partition)) else {
                continue;
            };
            let _ = writeln!(
                out,
                "weir_group_lag_records{{group=\"{}\",topic=\"{}\",partition=\"{partition}\"}} {}",
                escape(&g.id),
                escape(topic),
                (hw - committed).max(0)
            );
        }
    }
}

fn render_followers(snaps: &[std::sync::MutexGuard<'_, ShardSnapshot>], out: &mut String) {
    let series: [Family<FollowerLag, f64>; 2] = [
        (
            "weir_follower_lag_records",
            "Leader's log end minus a follower's, in records, by partition led here and follower.",
            |f| f.lag_records as f64,
        ),
        (
            "weir_follower_caught_up_age_seconds",
            "Time since a follower's fetch last reached the leader's log end, by partition led here and follower.",
            |f| f.since_caught_up_ms.max(0) as f64 / 1000.0,
        ),
    ];
    for (metric, help, get) in series {
        header(out, metric, "gauge", help);
        for f in snaps.iter().flat_map(|s| &s.followers) {
            let _ = writeln!(
                out,
                "{metric}{{topic=\"{}\",partition=\"{}\",follower=\"{}\"}} {}",
                escape(&f.topic),
                f.partition,
                f.follower,
                get(f)
            );
        }
    }
}
