//! [`Log`]: one partition replica's segmented log — the API the broker calls.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use wire::batch::{Attributes, BatchHeader, TimestampType};
use wire::{LeaderEpoch, Offset};
use zerocopy::FromBytes;

use super::cache::TailCache;
use super::config::LogConfig;
use super::error::{Result, StorageError};
use super::file::Disk;
use super::gate::{GateLeave, IoGate, IoGuard};
use super::segment::{BatchMeta, Segment, check_header};
use super::writer::{SegmentWriter, WRITE_BYTES_MAX};

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

impl AppendInfo {
    /// This append and `next`, which came right after it, as one.
    pub fn followed_by(&self, next: &AppendInfo) -> AppendInfo {
        debug_assert!(
            next.first_offset > self.last_offset,
            "appends in offset order"
        );
        AppendInfo {
            first_offset: self.first_offset,
            last_offset: next.last_offset,
            log_append_time_ms: next.log_append_time_ms.or(self.log_append_time_ms),
            log_start_offset: next.log_start_offset,
            batches: self.batches + next.batches,
            bytes: self.bytes + next.bytes,
        }
    }
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
    /// Windows read ahead for sequential disk readers (`readahead.rs`).
    pub read_ahead_reads: u64,
    /// Disk reads that found their window read ahead.
    pub read_ahead_hits: u64,
    /// Segment file windows read by disk reads themselves (the windows read ahead are in
    /// `read_ahead_reads`): a sequential reader served from its read-ahead reads none.
    pub window_reads: u64,
    /// Segments rolled.
    pub rolls: u64,
    /// `appends` as of the last interval or on-ack fdatasync (group-commit size metric).
    pub appends_at_sync: u64,
}

/// One partition replica's log. See the module docs for ownership and concurrency:
/// share it as `Rc<Log>` among the owning shard's tasks; every method takes `&self`.
pub struct Log {
    pub(super) inner: Rc<LogInner>,
}

impl std::ops::Deref for Log {
    type Target = LogInner;

    fn deref(&self) -> &LogInner {
        &self.inner
    }
}

/// The log's state, shared (by `Rc`) with the detached task that does its disk I/O, so
/// that dropping an `append` future midway (a client disconnects) never abandons a write.
pub struct LogInner {
    pub(super) dir: PathBuf,
    /// The real disk, or a simulated one in tests (the I/O seam).
    pub(super) disk: Disk,
    pub(super) state: RefCell<State>,
    /// Which task does the log's disk I/O (the "I/O leader"): writes, syncs,
    /// truncation, segment deletion. Everything else is synchronous on `state`.
    pub(super) io_gate: IoGate,
    /// The writer of the segment being written; taken out while a write is in flight
    /// (only by the I/O leader).
    pub(super) writer: Cell<Option<SegmentWriter>>,
}

/// Bytes appended but not yet written: one entry per append.
pub(super) struct Pending {
    pub segment_base: Offset,
    pub bytes: Bytes,
    pub next_offset: Offset,
    /// Batches copied from a leader with their offsets (a follower's append).
    pub copied: bool,
}

/// The log's in-memory state. Never borrowed across an `.await`.
pub(super) struct State {
    pub config: LogConfig,
    /// Segments by base offset; the last one is active.
    pub segments: BTreeMap<Offset, Segment>,
    pub log_start: Offset,
    pub log_end: Offset,
    pub cache: TailCache,
    pub pending: VecDeque<Pending>,
    /// Every offset below this is written to its segment file.
    pub written_next: Offset,
    /// Every offset below this is fdatasynced.
    pub synced_next: Offset,
    pub unflushed_records: u64,
    pub last_flush_ms: i64,
    pub counters: LogCounters,
    pub failed: Option<String>,
    /// Set when a write ran out of space: writes are refused until then, and the next
    /// one after it tries the disk again (finding 6: ENOSPC is not permanent).
    pub no_space_until: Option<Instant>,
    /// The end of what reads for replicas were handed past `written_next`: tail-cache
    /// batches a follower may have copied while their write was still in flight.
    pub served_end: Offset,
    /// The leader epoch of the latest append that assigned offsets.
    pub append_epoch: LeaderEpoch,
    /// Set when an out-of-space rollback cut offsets below `served_end`: a replica may
    /// hold the rolled-back batches, so appends under this epoch (or an older one) are
    /// refused ([`StorageError::ServedRolledBack`]). New, different batches at those
    /// offsets under the same epoch would look to that replica like what it holds (its
    /// fetch offset is within the log, its epoch current): silent divergence (KIP-101).
    /// An append under a newer epoch clears it: the epoch cache then says where the old
    /// epoch ended, and the replica truncates there.
    pub fenced_epoch: Option<LeaderEpoch>,
    /// How many times the log end moved back (an out-of-space rollback, a truncation):
    /// the producer state knows to drop what it recorded past the new end.
    pub truncations: u64,
    /// The latest cuts (numbered as `truncations` counts them) and the log end each left:
    /// an append waiting for its bytes tells from them whether they went. At most
    /// [`CUTS_REMEMBERED`]; a waiter that missed older ones counts its bytes gone.
    pub recent_cuts: VecDeque<(u64, Offset)>,
    pub closed: bool,
    /// Set while a truncation or a close holds the I/O gate: appends are refused, as the
    /// gate holder cuts or seals the end they would be appended at (see [`AppendsRefused`]).
    pub refusing_appends: Option<Refusal>,
    /// The log cleaner's checkpoint and schedule (compacted logs).
    pub cleaner: super::cleaner::CleanerState,
    /// The window read ahead for a sequential disk reader; invalidated wherever segment
    /// bytes may change or segments go.
    pub read_ahead: super::readahead::ReadAhead,
}

/// Why appends are refused while an operation holds the I/O gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// A follower's truncation (or restart) is cutting the log end.
    Truncating,
    /// `close()` is sealing the active segment and writing the clean-shutdown marker.
    Closing,
}

/// Refuses appends from its creation until it is dropped (on every return path of the
/// operation that holds it, and when its future is dropped midway).
pub(super) struct AppendsRefused<'a>(&'a RefCell<State>);

impl<'a> AppendsRefused<'a> {
    pub(super) fn new(state: &'a RefCell<State>, why: Refusal) -> AppendsRefused<'a> {
        state.borrow_mut().refusing_appends = Some(why);
        AppendsRefused(state)
    }
}

impl Drop for AppendsRefused<'_> {
    fn drop(&mut self) {
        self.0.borrow_mut().refusing_appends = None;
    }
}

/// Name of the file that persists the log start offset (text: version, offset).
pub(super) const LOG_START_FILE: &str = "weir-log-start-offset";
/// Present only after a clean close: the next open may skip the rescan.
pub(super) const CLEAN_SHUTDOWN_FILE: &str = ".weir-clean-shutdown";
/// After a write runs out of space, writes are refused for this long, then the next
/// append tries the disk again (a full disk frees up when an operator or retention
/// deletes something; a short backoff keeps a full log from retrying on every append).
pub const NO_SPACE_RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// Cuts of the log end remembered for waiting appends (see `State::recent_cuts`): a
/// waiter wakes after each I/O run, so more than a few cuts in between are rare.
const CUTS_REMEMBERED: usize = 16;

impl State {
    pub fn active(&self) -> Option<&Segment> {
        self.segments.values().next_back()
    }

    /// A leader's append under `epoch`: refused while a rollback of served offsets fenced
    /// that epoch; a newer epoch lifts the fence (see `fenced_epoch`).
    fn check_epoch_not_fenced(&mut self, dir: &Path, epoch: LeaderEpoch) -> Result<()> {
        if let Some(fenced) = self.fenced_epoch {
            if epoch <= fenced {
                return Err(StorageError::ServedRolledBack {
                    path: dir.to_path_buf(),
                    epoch,
                    served_end: self.served_end,
                    log_end: self.log_end,
                });
            }
            tracing::info!(dir = %dir.display(), %epoch, %fenced, log_end = %self.log_end, "appends resume under a new leader epoch after a rollback of served offsets");
            self.fenced_epoch = None;
            self.served_end = self.log_end;
        }
        self.append_epoch = self.append_epoch.max(epoch);
        Ok(())
    }

    /// Refuses appends under `epoch` and older ones (see `fenced_epoch`); a fence never
    /// moves back to an older epoch.
    pub(super) fn fence_epoch(&mut self, epoch: LeaderEpoch) {
        self.fenced_epoch = Some(self.fenced_epoch.map_or(epoch, |f| f.max(epoch)));
    }

    /// The invariant the fence keeps, checked where offsets are assigned: a leader never
    /// appends under an epoch at an offset it already served under that epoch and then
    /// rolled back.
    fn assert_not_reusing_served(&self, epoch: LeaderEpoch) {
        assert!(
            self.fenced_epoch.is_none_or(|f| epoch > f),
            "appending at {} under epoch {epoch}, fenced at {:?} after serving up to {}",
            self.log_end,
            self.fenced_epoch,
            self.served_end
        );
    }

    pub fn check_writable(&self, dir: &Path) -> Result<()> {
        if self.closed {
            return Err(StorageError::Closed {
                path: dir.to_path_buf(),
            });
        }
        if let Some(reason) = &self.failed {
            return Err(StorageError::Failed {
                path: dir.to_path_buf(),
                reason: reason.clone(),
            });
        }
        if let Some(until) = self.no_space_until {
            let left = until.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                return Err(StorageError::NoSpace {
                    path: dir.to_path_buf(),
                    retry_in_ms: left.as_millis().max(1) as u64,
                });
            }
        }
        Ok(())
    }

    /// The invariants of the write positions, checked wherever they move:
    /// log start <= synced <= written <= log end, served <= log end unless an epoch is
    /// fenced, and the segments are contiguous
    /// (each one starts where the previous one ends) with the last one ending at the
    /// log end.
    pub fn assert_positions(&self) {
        assert!(
            self.synced_next <= self.written_next,
            "synced {} past written {}",
            self.synced_next,
            self.written_next
        );
        assert!(
            self.written_next <= self.log_end,
            "written {} past the log end {}",
            self.written_next,
            self.log_end
        );
        assert!(
            self.log_start <= self.log_end,
            "log start {} past the log end {}",
            self.log_start,
            self.log_end
        );
        // The log never ends below what it served a replica unless that epoch is fenced:
        // else the next append would reuse served offsets under the served epoch.
        assert!(
            self.served_end <= self.log_end || self.fenced_epoch.is_some(),
            "served up to {} past the log end {} with no epoch fenced",
            self.served_end,
            self.log_end
        );
        // Per segment: cheap, but O(segments), so only in debug builds (every test).
        // Contiguity holds for every log weir wrote; a Kafka log dir imported with gaps
        // (compaction) would not, which is why this is not checked in release builds.
        let mut expected: Option<Offset> = None;
        for (base, seg) in &self.segments {
            debug_assert_eq!(*base, seg.base, "segment keyed by another base");
            debug_assert!(
                seg.next_offset >= seg.base,
                "segment {base} ends before it starts"
            );
            debug_assert!(
                seg.written <= seg.size,
                "segment {base} written past its size"
            );
            if let Some(prev_end) = expected {
                debug_assert_eq!(seg.base, prev_end, "segments not contiguous at {base}");
            }
            expected = Some(seg.next_offset);
        }
        if let Some(end) = expected {
            debug_assert_eq!(
                end, self.log_end,
                "the last segment does not end at the log end"
            );
        }
    }

    fn check_readable(&self, dir: &Path) -> Result<()> {
        if self.closed {
            return Err(StorageError::Closed {
                path: dir.to_path_buf(),
            });
        }
        Ok(())
    }

    /// Counts a cut of the log end to `kept_end` (everything from it on went) and
    /// remembers it for the appends waiting for their bytes.
    pub(super) fn note_cut(&mut self, kept_end: Offset) {
        self.truncations += 1;
        if self.recent_cuts.len() >= CUTS_REMEMBERED {
            self.recent_cuts.pop_front();
        }
        self.recent_cuts.push_back((self.truncations, kept_end));
    }

    /// Whether a cut made after the first `truncations` ones removed offsets below
    /// `next`. A cut above them keeps them (an out-of-space rollback keeps what was
    /// written); cuts too old to be remembered count as having removed them.
    fn cut_below_since(&self, truncations: u64, next: Offset) -> bool {
        if self.truncations == truncations {
            return false;
        }
        let oldest = self.recent_cuts.front().map_or(u64::MAX, |&(n, _)| n);
        if oldest > truncations + 1 {
            return true;
        }
        self.recent_cuts
            .iter()
            .any(|&(n, kept_end)| n > truncations && kept_end < next)
    }

    /// Starts a new, empty active segment at the log end.
    pub(super) fn roll(&mut self, dir: &Path) {
        if self.active().is_some_and(Segment::is_empty) {
            return;
        }
        let base = self.log_end;
        self.segments.insert(base, Segment::new(dir, base));
        self.counters.rolls += 1;
    }

    fn needs_roll(&self, blob_len: u64, batches: usize, last_delta: i64, now_ms: i64) -> bool {
        let Some(active) = self.active() else {
            return true;
        };
        if active.is_empty() {
            return false;
        }
        let full = active.size + blob_len > self.config.segment_bytes;
        let old = active
            .roll_base_ms
            .is_some_and(|t| now_ms.saturating_sub(t) >= self.config.roll_ms());
        let offsets_overflow =
            super::index::relative(active.base, self.log_end.add(last_delta)).is_none();
        let index_full = active.index_would_overflow(
            batches,
            blob_len,
            self.config.index_interval_bytes,
            self.config.segment_index_bytes,
        );
        full || old || offsets_overflow || index_full
    }
}

/// One batch of an append blob, found by walking the headers.
struct BlobBatch {
    pos: usize,
    size: usize,
    offset_delta: i64,
}

/// Splits an append blob into batches by their headers (length, magic, offset delta).
/// The CRC is the caller's job (`wire::batch::split_batches`); this only guards framing.
fn walk_blob(blob: &[u8]) -> Result<Vec<BlobBatch>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < blob.len() {
        let (header, size) =
            check_header(&blob[pos..], (blob.len() - pos) as u64).map_err(|reason| {
                StorageError::InvalidBatch {
                    position: pos,
                    reason: reason.to_owned(),
                }
            })?;
        out.push(BlobBatch {
            pos,
            size,
            offset_delta: i64::from(header.last_offset_delta.get()),
        });
        pos += size;
    }
    if out.is_empty() {
        return Err(StorageError::InvalidBatch {
            position: 0,
            reason: "no batches".into(),
        });
    }
    Ok(out)
}

/// Cuts `blob` (whole batches) at batch boundaries into parts of at most `room` bytes for
/// the first (what the active segment has left) and `segment_bytes` for the others, each
/// as long as it can be: every part fits the segment it goes to, and the log rolls
/// between them. A batch that does not fit starts a new segment; one larger than
/// `segment_bytes` is a part of its own. Returns the parts' byte lengths, in order.
pub(crate) fn segment_parts(blob: &[u8], room: u64, segment_bytes: u64) -> Result<Vec<usize>> {
    let room = room.min(segment_bytes);
    // The usual case, without a walk of the headers (the append walks them anyway).
    if blob.len() as u64 <= room {
        return Ok(vec![blob.len()]);
    }
    let mut parts = Vec::new();
    let (mut room, mut len) = (room, 0u64);
    for b in walk_blob(blob)? {
        let size = b.size as u64;
        if len + size > room {
            if len > 0 {
                parts.push(len as usize);
                len = 0;
            }
            // The next part starts a segment (the append rolls: it does not fit).
            room = segment_bytes;
        }
        len += size;
    }
    parts.push(len as usize);
    debug_assert_eq!(parts.iter().sum::<usize>(), blob.len());
    Ok(parts)
}

/// Stamps offsets, leader epoch and (for `LogAppendTime`) the append time into one batch.
fn stamp_batch(
    batch: &mut [u8],
    base: Offset,
    epoch: LeaderEpoch,
    append_time_ms: Option<i64>,
) -> Result<BatchMeta> {
    wire::batch::assign_offsets(batch, base, epoch).map_err(|e| StorageError::InvalidBatch {
        position: 0,
        reason: e.to_string(),
    })?;
    if let Some(now) = append_time_ms {
        set_log_append_time(batch, now);
    }
    let (header, _) =
        BatchHeader::ref_from_prefix(batch).map_err(|_| StorageError::InvalidBatch {
            position: 0,
            reason: "short batch".into(),
        })?;
    Ok(BatchMeta::of(header))
}

/// How an append treats the offsets in its batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stamp {
    /// A leader's append: offsets from the log end, this epoch stamped in.
    Assign(LeaderEpoch),
    /// A follower's append: the batches keep the leader's offsets and epochs.
    Keep,
}

/// A batch appended with the offsets it carries: its base offset must be at least `next`
/// (the offset after what comes before it).
fn kept_batch(batch: &[u8], next: Offset) -> Result<BatchMeta> {
    let (header, _) =
        BatchHeader::ref_from_prefix(batch).map_err(|_| StorageError::InvalidBatch {
            position: 0,
            reason: "short batch".into(),
        })?;
    if header.base_offset() < next {
        return Err(StorageError::InvalidBatch {
            position: 0,
            reason: format!(
                "replicated batch at offset {} where the log ends at {next}",
                header.base_offset()
            ),
        });
    }
    Ok(BatchMeta::of(header))
}

/// Kafka's LogAppendTime: set the timestamp-type bit and maxTimestamp, then recompute the
/// CRC, which covers both.
fn set_log_append_time(batch: &mut [u8], now_ms: i64) {
    let Ok((header, _)) = BatchHeader::mut_from_prefix(batch) else {
        return;
    };
    let attributes = header.attributes.get() | Attributes::TIMESTAMP_TYPE_BIT;
    header.attributes.set(attributes);
    header.max_timestamp.set(now_ms);
    let crc = crc32c::crc32c(&batch[21..]);
    if let Ok((header, _)) = BatchHeader::mut_from_prefix(batch) {
        header.crc.set(crc);
    }
}

impl Log {
    /// Opens (creating if missing) the log in `dir` and recovers it: sealed segments are
    /// checked (indexes loaded, last batches verified), the active segment is rescanned
    /// with CRCs unless the last shutdown was clean, a torn tail is truncated (fsynced,
    /// logged), and damage followed by a valid batch is refused with
    /// [`StorageError::Corrupt`]. Call [`prime_dma_probe`](super::prime_dma_probe) on this
    /// shard first.
    pub async fn open(dir: PathBuf, config: LogConfig) -> Result<Log> {
        super::open::open(dir, config, Disk::Real).await
    }

    /// [`open`](Self::open) on a given disk: a [`SimDisk`](super::SimDisk) in tests.
    pub async fn open_on(dir: PathBuf, config: LogConfig, disk: Disk) -> Result<Log> {
        super::open::open(dir, config, disk).await
    }

    /// Appends `records` — one or more whole v2 batches, already validated by the caller
    /// with `wire::batch::split_batches` (CRC checked) — assigning offsets from the log end
    /// offset and stamping `leader_epoch`, in place. Offsets are assigned before the first
    /// await (see module docs). Returns once the bytes are written to the segment file
    /// and, with `log.flush.on.ack` (or when a flush interval is due), fdatasynced. Rolls
    /// the segment first if needed.
    pub async fn append(
        &self,
        records: BytesMut,
        leader_epoch: LeaderEpoch,
        now_ms: i64,
    ) -> Result<AppendInfo> {
        let (info, must_sync) =
            self.append_in_memory(records, Stamp::Assign(leader_epoch), now_ms)?;
        self.finish_append(info, must_sync, now_ms).await
    }

    /// Appends batches that already carry their offsets and leader epochs — a follower
    /// copying its leader, whose log must stay byte for byte the leader's. At most
    /// `segment.bytes`, or one batch of any size (which rolls into a segment of its own);
    /// a larger fetched chunk is cut first with [`Log::replica_parts`]. Offsets must
    /// grow: each batch's base offset at or past the end of what comes before it (this
    /// log's end offset for the first), else [`StorageError::InvalidBatch`] and nothing is
    /// appended. Gaps are allowed, as Kafka allows them: a compacted leader's log has
    /// them wherever the cleaner removed whole batches. Nothing in the batches is
    /// rewritten (their CRCs stay the leader's).
    pub async fn append_keeping_offsets(
        &self,
        records: BytesMut,
        now_ms: i64,
    ) -> Result<AppendInfo> {
        let (info, must_sync) = self.append_in_memory(records, Stamp::Keep, now_ms)?;
        self.finish_append(info, must_sync, now_ms).await
    }

    async fn finish_append(
        &self,
        info: AppendInfo,
        must_sync: bool,
        now_ms: i64,
    ) -> Result<AppendInfo> {
        let next = info.last_offset.add(1);
        if must_sync {
            self.wait_synced(next, now_ms).await?;
        } else {
            self.wait_written(next).await?;
        }
        Ok(info)
    }

    /// The synchronous half of `append`: offsets, indexes, cache, pending write.
    fn append_in_memory(
        &self,
        mut records: BytesMut,
        stamp: Stamp,
        now_ms: i64,
    ) -> Result<(AppendInfo, bool)> {
        let mut st = self.state.borrow_mut();
        st.check_writable(&self.dir)?;
        match st.refusing_appends {
            None => {}
            Some(Refusal::Truncating) => {
                return Err(StorageError::Truncating {
                    path: self.dir.clone(),
                });
            }
            Some(Refusal::Closing) => {
                return Err(StorageError::Closed {
                    path: self.dir.clone(),
                });
            }
        }
        if let Stamp::Assign(epoch) = stamp {
            st.check_epoch_not_fenced(&self.dir, epoch)?;
        }
        let batches = walk_blob(&records)?;
        let blob_len = records.len() as u64;
        // A follower's single batch larger than a segment goes into a segment of its own
        // (the leader wrote it under a larger `segment.bytes`, or before it was lowered):
        // refused, it would stall the follower on it for good.
        let lone_copy = stamp == Stamp::Keep && batches.len() == 1;
        if blob_len > st.config.segment_bytes && !lone_copy {
            return Err(StorageError::RecordSetTooLarge {
                size: blob_len,
                max: st.config.segment_bytes,
            });
        }
        let last_delta: i64 = match stamp {
            Stamp::Assign(_) => batches.iter().map(|b| b.offset_delta + 1).sum::<i64>() - 1,
            // Kept offsets may leave gaps: the last batch's own last offset says how far
            // the segment must reach.
            Stamp::Keep => {
                let last = batches.last().map_or(Ok(st.log_end), |b| {
                    kept_batch(&records[b.pos..b.pos + b.size], st.log_end).map(|m| m.last_offset)
                })?;
                last.get().saturating_sub(st.log_end.get())
            }
        };
        // Even a new segment cannot index past 2^31 offsets from its base (before, the
        // index entries past it were skipped silently). A follower's kept offsets are
        // its leader's, which refused this.
        let span_max = i64::from(i32::MAX);
        if matches!(stamp, Stamp::Assign(_)) && last_delta > span_max {
            return Err(StorageError::OffsetSpanTooLarge {
                offsets: last_delta.saturating_add(1),
                max: span_max + 1,
            });
        }
        if st.needs_roll(blob_len, batches.len(), last_delta, now_ms) {
            st.roll(&self.dir);
        }
        let append_time = (st.config.message_timestamp_type == TimestampType::LogAppendTime
            && stamp != Stamp::Keep)
            .then_some(now_ms);
        let first = st.log_end;
        let mut metas = Vec::with_capacity(batches.len());
        let mut next = first;
        for b in &batches {
            let batch = &mut records[b.pos..b.pos + b.size];
            let meta = match stamp {
                Stamp::Assign(epoch) => {
                    st.assert_not_reusing_served(epoch);
                    stamp_batch(batch, next, epoch, append_time)?
                }
                Stamp::Keep => kept_batch(batch, next)?,
            };
            next = meta.last_offset.add(1);
            metas.push(meta);
        }
        let blob = records.freeze();
        let copied = stamp == Stamp::Keep;
        let info = self.record_append(&mut st, &batches, &metas, blob, now_ms, copied)?;
        let st = &*st;
        let must_sync = st.config.flush_on_ack
            || st.unflushed_records >= st.config.flush_interval_messages
            || now_ms.saturating_sub(st.last_flush_ms) >= st.config.flush_interval_ms;
        Ok((
            AppendInfo {
                log_append_time_ms: append_time,
                ..info
            },
            must_sync,
        ))
    }

    /// Applies stamped batches to the state: segment summary and indexes, cache, pending.
    fn record_append(
        &self,
        st: &mut State,
        batches: &[BlobBatch],
        metas: &[BatchMeta],
        blob: Bytes,
        now_ms: i64,
        copied: bool,
    ) -> Result<AppendInfo> {
        let interval = st.config.index_interval_bytes;
        let first = st.log_end;
        let mut records = 0u64;

        let segment_base = {
            // roll() ran before offsets were assigned, so there is an active segment.
            let Some(active) = st.segments.values_mut().next_back() else {
                return Err(StorageError::Failed {
                    path: self.dir.clone(),
                    reason: "no active segment".into(),
                });
            };
            for meta in metas {
                active.record_batch(meta, interval, now_ms);
                records += meta.records.max(0) as u64;
            }
            active.base
        };
        for (b, meta) in batches.iter().zip(metas) {
            let bytes = blob.slice(b.pos..b.pos + b.size);
            st.cache.push(meta.base_offset, meta.last_offset, bytes);
        }
        let next = metas.last().map_or(first, |m| m.last_offset.add(1));
        // A follower's batches may start past the old end (a gap a cleaner left).
        let first = metas.first().map_or(first, |m| m.base_offset);
        debug_assert!(next >= st.log_end, "the log end never moves back on append");
        st.log_end = next;
        st.unflushed_records += records;
        st.counters.appends += 1;
        crate::metrics::add(|m| &m.storage_appends, 1);
        st.counters.batches += metas.len() as u64;
        st.counters.bytes += blob.len() as u64;
        let bytes = blob.len() as u64;
        st.pending.push_back(Pending {
            segment_base,
            bytes: blob,
            next_offset: next,
            copied,
        });
        Ok(AppendInfo {
            first_offset: first,
            last_offset: next.add(-1),
            log_append_time_ms: None,
            log_start_offset: st.log_start,
            batches: metas.len() as u32,
            bytes,
        })
    }

    /// Waits until every offset below `next` is written to disk, doing the writing itself
    /// if no other task is (group write).
    pub(super) async fn wait_written(&self, next: Offset) -> Result<()> {
        let truncations = self.state.borrow().truncations;
        let gone = move |st: &State| st.cut_below_since(truncations, next);
        self.wait_until(|st| st.written_next >= next, gone, None)
            .await
    }

    /// Waits until every offset below `next` is fdatasynced; one detached I/O task writes
    /// and syncs for all waiting appends at once (group commit).
    pub(super) async fn wait_synced(&self, next: Offset, now_ms: i64) -> Result<()> {
        let truncations = self.state.borrow().truncations;
        let gone = move |st: &State| st.cut_below_since(truncations, next);
        self.wait_until(|st| st.synced_next >= next, gone, Some(now_ms))
            .await
    }

    /// Waits for `done`; when no I/O task is running, starts one that writes everything
    /// pending (and fdatasyncs, with `sync_now_ms`). The I/O runs in a detached task, so
    /// it completes even if this future is dropped. `gone` says the awaited bytes were
    /// cut (an out-of-space rollback, a truncation): then this fails even once the log is
    /// writable again. Bytes a cut kept are synced by it, so their waiters are done.
    async fn wait_until(
        &self,
        done: impl Fn(&State) -> bool,
        gone: impl Fn(&State) -> bool,
        sync_now_ms: Option<i64>,
    ) -> Result<()> {
        loop {
            {
                let st = self.state.borrow();
                if done(&st) {
                    return Ok(());
                }
                st.check_writable(&self.dir)?;
                if gone(&st) {
                    return Err(StorageError::NoSpace {
                        path: self.dir.clone(),
                        retry_in_ms: 0,
                    });
                }
            }
            if self.io_gate.try_enter_detached() {
                let inner = self.inner.clone();
                glommio::spawn_local(async move {
                    inner.run_io(sync_now_ms).await;
                })
                .detach();
            }
            self.io_gate.changed().await;
        }
    }

    /// Becomes the I/O leader (for truncation, retention, close).
    pub(super) async fn lock_io(&self) -> Result<IoGuard<'_>> {
        Ok(self.io_gate.enter().await)
    }
}

impl LogInner {
    /// The body of the detached I/O task: write everything pending, then sync if asked;
    /// errors mark the log failed (waiters see them), and leaving the gate wakes waiters.
    async fn run_io(&self, sync_now_ms: Option<i64>) {
        let _leave = GateLeave(&self.io_gate);
        // Behind the tasks this turn has already woken (requests read from other
        // connections, or later in the same one), so their appends join this write.
        futures_lite::future::yield_now().await;
        // write_pending handles its own errors (rollback or failed); a sync error fails
        // the log.
        if self.write_pending().await.is_err() {
            return;
        }
        if let Some(now_ms) = sync_now_ms
            && let Err(e) = self.sync_written(now_ms).await
        {
            self.state.borrow_mut().failed.get_or_insert(e.to_string());
        }
    }

    /// fdatasyncs the segment being written. Caller holds the I/O lock and has written
    /// everything pending (earlier segments were synced when sealed).
    pub(super) async fn sync_written(&self, now_ms: i64) -> Result<()> {
        let upto = self.state.borrow().written_next;
        let Some(writer) = self.writer.take() else {
            self.state.borrow_mut().synced_next = upto;
            return Ok(());
        };
        let started = Instant::now();
        let result = writer.sync().await;
        let took = started.elapsed();
        self.writer.set(Some(writer));
        self.check_io(result)?;
        let mut st = self.state.borrow_mut();
        st.synced_next = st.synced_next.max(upto);
        st.assert_positions();
        st.unflushed_records = 0;
        st.last_flush_ms = now_ms;
        st.counters.fdatasyncs += 1;
        let grouped = st.counters.appends - st.counters.appends_at_sync;
        st.counters.appends_at_sync = st.counters.appends;
        crate::metrics::local(|m| m.fdatasync(took, Some(grouped)));
        Ok(())
    }

    /// Marks the log failed if `result` is an error: after a failed write or sync the
    /// state of the file is unknown, so no more writes (Kafka takes the log dir offline).
    pub(super) fn check_io<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            self.state.borrow_mut().failed = Some(e.to_string());
        }
        result
    }

    /// Writes every pending append, oldest first, sealing a segment when the next pending
    /// bytes belong to a newer one. Caller holds the I/O lock. Out of space, the appends
    /// not yet written are rolled back and the log refuses writes for a backoff; any other
    /// error fails the log for good.
    pub(super) async fn write_pending(&self) -> Result<()> {
        let result = self.write_pending_once().await;
        match &result {
            Ok(()) => {
                let mut st = self.state.borrow_mut();
                if st.no_space_until.take().is_some() {
                    tracing::info!(dir = %self.dir.display(), "disk space is back; log writable again");
                }
            }
            Err(e) if e.is_out_of_space() => {
                if let Err(rollback) = self.roll_back_unwritten(e).await {
                    tracing::error!(dir = %self.dir.display(), "rollback after ENOSPC failed: {rollback}");
                    self.state
                        .borrow_mut()
                        .failed
                        .get_or_insert(rollback.to_string());
                }
            }
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), "log write failed, log is read-only: {e}");
                self.state.borrow_mut().failed.get_or_insert(e.to_string());
            }
        }
        result
    }

    async fn write_pending_once(&self) -> Result<()> {
        loop {
            let Some((base, chunks, next)) = self.take_pending() else {
                return Ok(());
            };
            let mut writer = self.writer_for(base).await?;
            let result = writer.write(&chunks).await;
            let end = writer.end();
            self.writer.set(Some(writer));
            let writes = result?;
            let mut st = self.state.borrow_mut();
            st.written_next = next;
            st.counters.dma_writes += writes;
            if let Some(seg) = st.segments.get_mut(&base) {
                seg.written = end;
            }
            st.assert_positions();
            st.cache.evict(next);
        }
    }

    /// Takes the oldest pending appends of one segment, up to about one write's worth.
    fn take_pending(&self) -> Option<(Offset, Vec<Bytes>, Offset)> {
        let mut st = self.state.borrow_mut();
        let front = st.pending.front()?;
        let base = front.segment_base;
        // Counted per write, by its first append: a leader's and a follower's writes
        // differ in how many appends they carry (docs/PERFORMANCE.md).
        if front.copied {
            crate::metrics::add(|m| &m.storage_follower_writes, 1);
        } else {
            crate::metrics::add(|m| &m.storage_leader_writes, 1);
        }
        let mut chunks = Vec::new();
        let mut bytes = 0usize;
        let mut next = st.written_next;
        while let Some(p) = st.pending.front() {
            if p.segment_base != base || (bytes > 0 && bytes + p.bytes.len() > WRITE_BYTES_MAX) {
                break;
            }
            bytes += p.bytes.len();
            next = p.next_offset;
            if let Some(p) = st.pending.pop_front() {
                chunks.push(p.bytes);
            }
        }
        Some((base, chunks, next))
    }

    /// The writer for segment `base`: the current one, or — when the log rolled — the
    /// current one sealed (trimmed, synced, indexes written) and a new file created.
    async fn writer_for(&self, base: Offset) -> Result<SegmentWriter> {
        if let Some(w) = self.writer.take() {
            if self.writer_base(&w) == Some(base) {
                return Ok(w);
            }
            self.seal(w).await?;
        }
        let path = self.dir.join(super::segment_file_name(base, "log"));
        let existing = {
            let st = self.state.borrow();
            st.segments
                .get(&base)
                .and_then(|s| s.file.clone().map(|f| (f, s.written)))
        };
        if let Some((file, written)) = existing {
            let mut writer = SegmentWriter::resume(file, &path, written).await?;
            writer.set_preallocation(self.preallocation());
            return Ok(writer);
        }
        let file = super::writer::create_log_file(&self.disk, &path).await?;
        // The new file's name made durable off the shard's thread: a directory fsync waits
        // for a journal commit, which on a busy disk stopped the shard for tens of ms.
        let dir = self.dir.clone();
        glommio::executor()
            .spawn_blocking(move || super::atomic::sync_dir(&dir))
            .await?;
        let mut writer = SegmentWriter::resume(file.clone(), &path, 0).await?;
        writer.set_preallocation(self.preallocation());
        if let Some(seg) = self.state.borrow_mut().segments.get_mut(&base) {
            seg.file = Some(file);
        }
        Ok(writer)
    }

    /// The preallocation limit for segment writers (`log.preallocate`).
    pub(super) fn preallocation(&self) -> Option<u64> {
        let st = self.state.borrow();
        st.config.preallocate.then_some(st.config.segment_bytes)
    }

    /// Which segment a writer writes (matched by file identity).
    fn writer_base(&self, w: &SegmentWriter) -> Option<Offset> {
        let st = self.state.borrow();
        st.segments
            .values()
            .rev()
            .find(|s| {
                s.file
                    .as_ref()
                    .is_some_and(|f| std::rc::Rc::ptr_eq(f, w.file()))
            })
            .map(|s| s.base)
    }

    /// Seals the segment `w` wrote: exact size, fdatasync, final time entry, index files.
    pub(super) async fn seal(&self, w: SegmentWriter) -> Result<()> {
        w.finish().await?;
        let base = self.writer_base(&w);
        let mut st = self.state.borrow_mut();
        st.counters.fdatasyncs += 1;
        crate::metrics::add(|m| &m.storage_fdatasyncs, 1);
        let Some(seg) = base.and_then(|b| st.segments.get_mut(&b)) else {
            return Ok(());
        };
        seg.seal_time_index();
        let next = seg.next_offset;
        super::open::write_index_files(seg, &self.disk)?;
        seg.sealed = true;
        // From here its entries are read back from the files when needed, through the
        // shard's bounded index cache (kept there for now: a consumer a little behind
        // reads the segment just rolled next).
        seg.index_to_files(true);
        st.synced_next = st.synced_next.max(next);
        st.assert_positions();
        Ok(())
    }
}

impl Log {
    /// Reads whole batches starting with the one that contains `start`, up to `max_bytes`
    /// (the first batch is returned whole even if larger, as Kafka does) and only batches
    /// whose last offset is below `upper_bound` (the high watermark for consumers, the
    /// LEO for followers). `start` outside `[log_start, log_end]` is
    /// [`StorageError::OffsetOutOfRange`].
    pub async fn read(
        &self,
        start: Offset,
        max_bytes: usize,
        upper_bound: Offset,
    ) -> Result<ReadResult> {
        super::read::read(self, start, max_bytes, usize::MAX, upper_bound, false).await
    }

    /// Like [`read`](Self::read), but never returns more than `hard_max_bytes`, not even
    /// the first batch: a fetch whose response budget is nearly spent reads nothing it
    /// could not send (only the first partition with data may exceed the budget).
    pub async fn read_within(
        &self,
        start: Offset,
        max_bytes: usize,
        hard_max_bytes: usize,
        upper_bound: Offset,
    ) -> Result<ReadResult> {
        super::read::read(self, start, max_bytes, hard_max_bytes, upper_bound, false).await
    }

    /// [`read_within`](Self::read_within) for a follower replica, which may read past the
    /// written end (the tail cache): the log notes how far it served, so that an
    /// out-of-space rollback below that fences the leader epoch (see
    /// [`StorageError::ServedRolledBack`]).
    pub async fn read_for_replica(
        &self,
        start: Offset,
        max_bytes: usize,
        hard_max_bytes: usize,
        upper_bound: Offset,
    ) -> Result<ReadResult> {
        super::read::read(self, start, max_bytes, hard_max_bytes, upper_bound, true).await
    }

    /// Whether appends under `epoch` are refused because an out-of-space rollback cut
    /// offsets replicas were served under it (only a newer leader epoch may append).
    pub fn epoch_fenced(&self, epoch: LeaderEpoch) -> bool {
        self.state
            .borrow()
            .fenced_epoch
            .is_some_and(|fenced| epoch <= fenced)
    }

    /// Refuses appends under `epoch` and older ones from now on, as an out-of-space
    /// rollback does; an append under a newer epoch lifts it. For a leader whose log
    /// reopened without records it had acknowledged (`Partition::fence_if_lost`).
    pub fn fence_epoch(&self, epoch: LeaderEpoch) {
        self.state.borrow_mut().fence_epoch(epoch);
    }

    /// The highest offset end reads for replicas were served while it was past the
    /// written end (kept across appends; lowered only by truncation and a lifted fence).
    pub fn served_end(&self) -> Offset {
        self.state.borrow().served_end
    }

    /// ListOffsets by time: the first batch whose max timestamp is `>= timestamp_ms`, as
    /// (its base offset, its max timestamp); `None` if no batch is that new. (Kafka
    /// returns the exact record inside the batch; weir returns the batch's first offset,
    /// so a consumer may see a few older records of that batch.)
    pub async fn read_by_time(&self, timestamp_ms: i64) -> Result<Option<(Offset, i64)>> {
        super::read::read_by_time(self, timestamp_ms).await
    }

    /// The first offset still in the log.
    pub fn log_start_offset(&self) -> Offset {
        self.state.borrow().log_start
    }

    /// The log end offset (LEO): the offset the next appended record gets.
    pub fn log_end_offset(&self) -> Offset {
        self.state.borrow().log_end
    }

    /// The largest batch max timestamp in the log (-1 if empty), and the offset of that
    /// batch's last record.
    pub fn max_timestamp(&self) -> (i64, Offset) {
        let st = self.state.borrow();
        st.segments
            .values()
            .map(|s| s.max_timestamp)
            .fold((-1, Offset::NONE), |a, b| if b.0 > a.0 { b } else { a })
    }

    /// Total bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        self.state.borrow().segments.values().map(|s| s.size).sum()
    }

    /// Segment files open now (sealed segments' files open on first read).
    pub fn open_files(&self) -> usize {
        let st = self.state.borrow();
        st.segments.values().filter(|s| s.file.is_some()).count()
    }

    /// Bytes of index entries this log's sealed segments hold in memory themselves,
    /// outside the shard's bounded index cache ([`super::shard_index_cache_stats`]): 0
    /// unless a sealed segment's index files could not be written.
    pub fn sealed_index_bytes_held(&self) -> u64 {
        let st = self.state.borrow();
        let active = st.active().map(|a| a.base);
        st.segments
            .values()
            .filter(|s| Some(s.base) != active && !s.index_in_files())
            .map(|s| s.index.memory_bytes())
            .sum()
    }

    /// How a follower appends `records` (whole batches fetched from its leader): the
    /// byte lengths of consecutive parts, cut at batch boundaries, each of which fits the
    /// room left in the active segment or a new one, so the log rolls between them as a
    /// leader appending the same batches would (see [`segment_parts`]). A fetch answer
    /// holds up to `replica.fetch.max.bytes`, which may be more than `segment.bytes`.
    pub fn replica_parts(&self, records: &[u8]) -> Result<Vec<usize>> {
        let st = self.state.borrow();
        let segment_bytes = st.config.segment_bytes;
        let room = st
            .active()
            .filter(|a| !a.is_empty())
            .map_or(segment_bytes, |a| segment_bytes.saturating_sub(a.size));
        segment_parts(records, room, segment_bytes)
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.state.borrow().segments.len()
    }

    /// Base offsets of the segments, oldest first.
    pub fn segment_bases(&self) -> Vec<Offset> {
        self.state.borrow().segments.keys().copied().collect()
    }

    /// How many times the log end moved back (out-of-space rollbacks, truncations). The
    /// producer state compares it before each check to drop what it recorded past the end.
    pub fn truncations(&self) -> u64 {
        self.state.borrow().truncations
    }

    /// Whether a cut made since the log had counted `truncations` cuts removed offsets
    /// below `next` (see [`Log::truncations`]): what a waiter for `next` must know, since
    /// a cut above them (an out-of-space rollback of later appends) keeps them.
    pub fn cut_below_since(&self, truncations: u64, next: Offset) -> bool {
        self.state.borrow().cut_below_since(truncations, next)
    }

    /// Whether the log refuses writes for lack of space right now (it retries after
    /// [`NO_SPACE_RETRY_BACKOFF`]).
    pub fn is_out_of_space(&self) -> bool {
        self.state
            .borrow()
            .no_space_until
            .is_some_and(|t| t > Instant::now())
    }

    /// I/O counters since open.
    pub fn counters(&self) -> LogCounters {
        self.state.borrow().counters
    }

    /// Replaces the settings (AlterConfigs); takes effect from the next append, except the
    /// tail cache's bound, which applies at once.
    pub fn set_config(&self, config: LogConfig) {
        let mut st = self.state.borrow_mut();
        st.cache.set_capacity(config.tail_cache_bytes);
        st.config = config;
    }

    /// The settings in force.
    pub fn config(&self) -> LogConfig {
        self.state.borrow().config.clone()
    }

    /// Rolls a new segment now, even if the active one is not full (the next append goes
    /// to the new segment). An empty active segment is kept.
    pub fn roll(&self) -> Result<()> {
        let mut st = self.state.borrow_mut();
        st.check_writable(&self.dir)?;
        st.roll(&self.dir);
        Ok(())
    }

    /// Writes everything appended so far and fdatasyncs it.
    pub async fn flush(&self, now_ms: i64) -> Result<()> {
        let next = self.state.borrow().log_end;
        self.wait_written(next).await?;
        self.wait_synced(next, now_ms).await
    }

    /// Applies `log.flush.interval.ms`: flushes if the last flush is that old and there is
    /// something to flush. The broker calls it from a periodic task. Returns whether it
    /// flushed.
    pub async fn flush_if_due(&self, now_ms: i64) -> Result<bool> {
        let due = {
            let st = self.state.borrow();
            st.synced_next < st.log_end
                && now_ms.saturating_sub(st.last_flush_ms) >= st.config.flush_interval_ms
        };
        if due {
            self.flush(now_ms).await?;
        }
        Ok(due)
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn check_readable(&self) -> Result<()> {
        self.state.borrow().check_readable(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::testing::batch_of_size;

    /// A blob of batches of these sizes (about: the builder rounds) and their exact sizes.
    fn blob(sizes: &[usize]) -> (Vec<u8>, Vec<usize>) {
        let batches: Vec<BytesMut> = sizes.iter().map(|s| batch_of_size(0, 4, *s)).collect();
        let exact = batches.iter().map(BytesMut::len).collect();
        (batches.concat(), exact)
    }

    /// A fetched chunk larger than a segment is cut where a leader appending the same
    /// batches one by one would roll: the first part fills what the active segment has
    /// left, the others a segment each, and a batch larger than a segment is alone.
    #[test]
    fn a_chunk_is_cut_at_batch_boundaries_into_parts_that_each_fit_a_segment() {
        let (chunk, b) = blob(&[20_000, 20_000, 20_000, 20_000, 100_000, 20_000]);
        let segment = 65_536;
        let parts = segment_parts(&chunk, segment, segment).expect("parts");
        assert_eq!(
            parts,
            vec![b[0] + b[1] + b[2], b[3], b[4], b[5]],
            "three fit a segment, the fourth rolls, the big one is alone"
        );
        // The active segment has room for one batch: the first part is that one.
        let parts = segment_parts(&chunk, 30_000, segment).expect("parts");
        assert_eq!(parts, vec![b[0], b[1] + b[2] + b[3], b[4], b[5]]);
        // No room at all: the first part starts a new segment.
        let parts = segment_parts(&chunk, 0, segment).expect("parts");
        assert_eq!(parts[0], b[0] + b[1] + b[2]);
        // A chunk that fits is one part, unwalked.
        let parts = segment_parts(&chunk, 1 << 20, 1 << 20).expect("parts");
        assert_eq!(parts, vec![chunk.len()]);
        for room in [0, 1, 30_000, segment] {
            let parts = segment_parts(&chunk, room, segment).expect("parts");
            assert_eq!(parts.iter().sum::<usize>(), chunk.len());
        }
        // Damaged framing is refused, as the append would refuse it.
        assert!(segment_parts(&chunk[..chunk.len() - 1], 0, segment).is_err());
    }
}
