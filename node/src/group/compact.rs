//! Compaction of `__consumer_offsets` partitions, by rewrite: weir's log has no cleaner,
//! so the coordinator keeps each partition's replay short itself. When at least
//! `offsets.compaction.min.records` records are in a partition's log and at least half of
//! them are dead (overwritten or deleted keys), it appends the live state of the
//! partition's groups — every committed offset and group metadata — as a run of batches,
//! each within the batch limit (`max.message.bytes`), so live state of any size can be
//! rewritten; then fdatasyncs the log and moves the log start offset to the first of those
//! batches (DeleteRecords); whole segments below it are deleted by the log. Replay reads
//! from the log start, so it reads the snapshot and what came after.
//!
//! Why this is safe: the snapshot is taken from memory, and every batch of it takes its
//! offsets, in one poll while no other write is in flight
//! (`Coordinators::writes_in_flight == 0`), so the log's order matches memory: every
//! record before the snapshot is already in memory (and so in the snapshot), every later
//! one is newer, and nothing lands between the snapshot's batches. The switch-over is
//! crash-safe: until the log start moves, replay reads the old records and whatever
//! prefix of the snapshot was written — duplicates of the latest values, which replay
//! resolves (latest wins); the log start moves only after the whole snapshot is written
//! and fdatasynced, so it never points past records a crash could lose.

use bytes::Bytes;

use super::schema;
use super::state::Group;
use super::store;
use super::{Coordinators, Settings, partition_for};
use crate::partition::{Partition, storage_error_code};
use crate::shard::now_ms;

/// Records holding the live state of the groups in partition `index`.
pub fn live_records<'a>(
    groups: impl Iterator<Item = &'a Group>,
    index: i32,
    partitions: i32,
) -> Vec<(Bytes, Option<Bytes>)> {
    let mut out = Vec::new();
    for g in groups.filter(|g| partition_for(&g.id, partitions) == index) {
        if g.generation > 0 || g.protocol_type.is_some() {
            let value = schema::group_value(&g.to_value());
            out.push((schema::group_key(&g.id), Some(value)));
        }
        for ((topic, p), v) in &g.offsets {
            let value = schema::offset_value(v);
            out.push((schema::offset_key(&g.id, topic, *p), Some(value)));
        }
    }
    out
}

/// Whether a log of `total` records holding `live` live keys is worth rewriting.
pub fn is_due(total: i64, live: usize, min_records: i64) -> bool {
    total >= min_records && total >= 2 * live as i64
}

impl Coordinators {
    /// Compacts every loaded partition that is due.
    pub(super) async fn compact_due(&self, s: &Settings) {
        let parts: Vec<_> = self.partitions.borrow().values().cloned().collect();
        for part in parts {
            if let Err(code) = self.compact(&part, s).await {
                tracing::warn!(partition = part.index, "compaction failed: error {code}");
            }
        }
    }

    async fn compact(&self, part: &Partition, s: &Settings) -> Result<(), i16> {
        let start = part.log.log_start_offset().get();
        let total = part.high_watermark().get() - start;
        // Everything from here to the append runs in one poll (no await).
        if self.writes_in_flight.get() > 0 {
            return Ok(());
        }
        let records = {
            let groups = self.groups.borrow();
            live_records(groups.values(), part.index, self.topic_partitions.get())
        };
        if !is_due(total, records.len(), s.compaction_min_records) {
            return Ok(());
        }
        let live = records.len();
        // From the snapshot to the last batch taking its offsets: one poll, no yield.
        let (base, batches) = match records.is_empty() {
            true => (part.high_watermark().get(), 0),
            false => {
                let max = store::batch_bytes_max(part);
                let batches = store::build_batches(records, max, now_ms())?;
                let count = batches.len();
                (store::append_contiguous(part, batches).await?, count)
            }
        };
        // The snapshot must be durable before the records it replaces go.
        if let Err(e) = part.log.flush(now_ms()).await {
            tracing::warn!(partition = part.index, "compaction flush failed: {e}");
            return Err(storage_error_code(&e));
        }
        let new_start = part.delete_records(wire::Offset(base)).await?.get();
        assert!(new_start <= base, "log start moved past the snapshot");
        tracing::info!(
            partition = part.index,
            records_before = total,
            live,
            batches,
            log_start = new_start,
            log_bytes = part.log.size_bytes(),
            "compacted __consumer_offsets partition"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::schema::OffsetValue;

    #[test]
    fn due_only_when_mostly_dead_and_big_enough() {
        assert!(!is_due(999, 10, 1000), "too small");
        assert!(is_due(1000, 10, 1000));
        assert!(!is_due(1000, 600, 1000), "more than half live");
        assert!(is_due(1200, 600, 1000));
    }

    #[test]
    fn live_records_cover_the_partition_only() {
        let mut g = Group::new("g", 0);
        g.protocol_type = Some("consumer".into());
        let v = OffsetValue {
            offset: wire::Offset(3),
            leader_epoch: wire::LeaderEpoch::NONE,
            metadata: String::new(),
            commit_timestamp_ms: 0,
        };
        g.offsets.insert(("t".into(), 0), v.clone());
        g.offsets.insert(("t".into(), 1), v);
        let index = partition_for("g", 4);
        let recs = live_records([&g].into_iter(), index, 4);
        assert_eq!(recs.len(), 3, "group metadata and two offsets");
        assert!(live_records([&g].into_iter(), (index + 1) % 4, 4).is_empty());
    }
}
