//! [`Log`]: one partition replica's segmented log — the API the broker calls.

use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use wire::{LeaderEpoch, Offset};

use super::config::LogConfig;
use super::error::Result;

/// What an append did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendInfo {
    /// Offset given to the first record of the first batch.
    pub first_offset: Offset,
    /// Offset of the last record of the last batch.
    pub last_offset: Offset,
    /// The append time stamped into the batches when `message.timestamp.type` is
    /// `LogAppendTime` (Produce responses return it); `None` for `CreateTime`.
    pub log_append_time_ms: Option<i64>,
    /// The log start offset after the append (Produce v5+ returns it).
    pub log_start_offset: Offset,
    /// Number of batches appended.
    pub batches: u32,
    /// Bytes appended.
    pub bytes: u64,
}

/// What a read returned.
#[derive(Clone, Debug, Default)]
pub struct ReadResult {
    /// Whole batches, in offset order, never split. Empty if nothing is readable at the
    /// requested offset below the upper bound.
    pub batches: Vec<Bytes>,
    /// The offset after the last returned batch (the next fetch offset), or the requested
    /// offset if nothing was returned.
    pub next_offset: Offset,
    /// Log start offset at the time of the read.
    pub log_start_offset: Offset,
    /// Log end offset at the time of the read.
    pub log_end_offset: Offset,
}

impl ReadResult {
    /// Total bytes of the returned batches.
    pub fn bytes(&self) -> usize {
        self.batches.iter().map(Bytes::len).sum()
    }
}

/// Counters that make the I/O visible (group commit shows as `appends > fdatasyncs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogCounters {
    /// Calls to `append` that succeeded.
    pub appends: u64,
    /// Batches appended.
    pub batches: u64,
    /// Bytes appended.
    pub bytes: u64,
    /// DMA writes issued to segment files.
    pub dma_writes: u64,
    /// fdatasync calls on segment files.
    pub fdatasyncs: u64,
    /// Reads served from the in-memory tail cache.
    pub cache_reads: u64,
    /// Reads served from segment files.
    pub disk_reads: u64,
    /// Segments rolled.
    pub rolls: u64,
}

/// One partition replica's log. See the module docs for ownership and concurrency:
/// share it as `Rc<Log>` among the owning shard's tasks; every method takes `&self`.
pub struct Log {
    dir: PathBuf,
    config: LogConfig,
}

impl Log {
    /// Opens (creating if missing) the log in `dir` and recovers it: sealed segments are
    /// checked (indexes loaded, last batches verified), the active segment is rescanned
    /// with CRCs unless the last shutdown was clean, a torn tail is truncated (fsynced,
    /// logged), and damage followed by a valid batch is refused with
    /// [`StorageError::Corrupt`](super::StorageError::Corrupt). Call
    /// [`prime_dma_probe`](super::prime_dma_probe) on this shard first.
    pub async fn open(dir: PathBuf, config: LogConfig) -> Result<Log> {
        let _ = (&dir, &config);
        todo!("issue 3")
    }

    /// Appends `records` — one or more whole v2 batches, already validated by the caller
    /// with `wire::batch::split_batches` (CRC checked) — assigning offsets from the log end
    /// offset and stamping `leader_epoch`, in place. Offsets are assigned before the first
    /// await (see module docs). Returns once the bytes are written to the segment file
    /// and, with `log.flush.on.ack`, fdatasynced. Rolls the segment first if needed.
    pub async fn append(
        &self,
        records: BytesMut,
        leader_epoch: LeaderEpoch,
        now_ms: i64,
    ) -> Result<AppendInfo> {
        let _ = (records, leader_epoch, now_ms);
        todo!("issue 3")
    }

    /// Reads whole batches starting with the one that contains `start`, up to `max_bytes`
    /// (the first batch is returned whole even if larger, as Kafka does) and only batches
    /// whose last offset is below `upper_bound` (the high watermark for consumers, the
    /// LEO for followers). `start` outside `[log_start, log_end]` is
    /// [`StorageError::OffsetOutOfRange`](super::StorageError::OffsetOutOfRange).
    pub async fn read(
        &self,
        start: Offset,
        max_bytes: usize,
        upper_bound: Offset,
    ) -> Result<ReadResult> {
        let _ = (start, max_bytes, upper_bound);
        todo!("issue 3")
    }

    /// ListOffsets by time: the first batch whose max timestamp is `>= timestamp_ms`, as
    /// (its base offset, its max timestamp); `None` if no batch is that new.
    pub async fn read_by_time(&self, timestamp_ms: i64) -> Result<Option<(Offset, i64)>> {
        let _ = timestamp_ms;
        todo!("issue 3")
    }

    /// The first offset still in the log.
    pub fn log_start_offset(&self) -> Offset {
        todo!("issue 3")
    }

    /// The log end offset (LEO): the offset the next appended record gets.
    pub fn log_end_offset(&self) -> Offset {
        todo!("issue 3")
    }

    /// The largest batch max timestamp in the log (-1 if empty), and the offset of that
    /// batch's last record.
    pub fn max_timestamp(&self) -> (i64, Offset) {
        todo!("issue 3")
    }

    /// Total bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        todo!("issue 3")
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        todo!("issue 3")
    }

    /// I/O counters since open.
    pub fn counters(&self) -> LogCounters {
        todo!("issue 3")
    }

    /// Removes every batch that holds an offset `>= offset` (a follower's truncation; the
    /// cut is at a batch boundary, so the new LEO may be below `offset` if it fell inside a
    /// batch). Returns the new LEO. Truncating below the log start empties the log and
    /// restarts it at `offset`. Durable (fdatasync) before it returns.
    pub async fn truncate_to(&self, offset: Offset) -> Result<Offset> {
        let _ = offset;
        todo!("issue 3")
    }

    /// DeleteRecords: moves the log start offset up to `offset` (clamped to the LEO),
    /// persists it, and deletes sealed segments entirely below it. Returns the new start.
    pub async fn delete_records_before(&self, offset: Offset) -> Result<Offset> {
        let _ = offset;
        todo!("issue 3")
    }

    /// Applies `retention.ms` and `retention.bytes`: deletes whole sealed segments (never
    /// the active one) and advances the log start offset. Returns segments deleted.
    pub async fn apply_retention(&self, now_ms: i64) -> Result<usize> {
        let _ = now_ms;
        todo!("issue 3")
    }

    /// Rolls a new segment now, even if the active one is not full (the next append goes
    /// to the new segment). Mostly for tests and admin tools.
    pub fn roll(&self, now_ms: i64) -> Result<()> {
        let _ = now_ms;
        todo!("issue 3")
    }

    /// Writes everything appended so far and fdatasyncs it.
    pub async fn flush(&self) -> Result<()> {
        todo!("issue 3")
    }

    /// Applies `log.flush.interval.ms`: flushes if the last flush is that old. The broker
    /// calls it from a periodic task.
    pub async fn flush_if_due(&self, now_ms: i64) -> Result<bool> {
        let _ = now_ms;
        todo!("issue 3")
    }

    /// Clean shutdown: writes and syncs everything, trims the active segment to its last
    /// batch, writes its indexes and the clean-shutdown marker (so the next open skips the
    /// rescan). The log refuses further calls.
    pub async fn close(&self) -> Result<()> {
        todo!("issue 3")
    }

    /// Removes the partition directory and everything in it (partition deleted or moved).
    pub async fn delete(&self) -> Result<()> {
        todo!("issue 3")
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The settings in force.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }
}
