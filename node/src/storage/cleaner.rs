//! The log cleaner: compaction of `cleanup.policy=compact` logs, Kafka's way — keep the
//! latest record of each key, with its offset, in the sealed segments.
//!
//! One call of [`Log::clean_if_due`] (from the shard's housekeeping) cleans a log when its
//! dirty ratio (bytes of sealed segments past the cleaner checkpoint / all cleanable
//! sealed bytes) reaches `min.cleanable.dirty.ratio`, when its oldest dirty segment is
//! older than `max.compaction.lag.ms`, or when tombstones it marked earlier passed their
//! delete horizon. A round:
//!
//! 1. **Offset map**: the dirty batches, from the checkpoint on, are read and every key
//!    mapped to its latest offset, within `log.cleaner.dedupe.buffer.size` (the key bytes
//!    plus [`MAP_ENTRY_OVERHEAD_BYTES`] each). When the map is full the round stops at that
//!    batch and the next round continues from it (at least one batch per round).
//! 2. **Rewrite**: the cleanable sealed segments holding offsets below the map's end are
//!    grouped (consecutive, together at most `segment.bytes` before cleaning, as Kafka
//!    groups them) and each group is filtered batch by batch ([`batch::filter_batch`])
//!    into `<first base>.log.cleaned` beside it, written with DMA, trimmed and
//!    fdatasynced. A single segment that did not change is not swapped. Sealed segments
//!    younger than `min.compaction.lag.ms` and the active segment are never touched.
//! 3. **Swap** (synchronous, no await, so no append, truncation or retention interleaves):
//!    the group's segments must still be the ones read (same files); `.cleaned` is
//!    renamed to `.swap` and the directory synced — the commit point — then the group's
//!    other segments and the first's index files go, `.swap` is renamed over the first
//!    `.log`, the directory synced, the new segment replaces the group in memory and its
//!    index files are written.
//! 4. **Checkpoint**: the map's end is written to `cleaner-offset-checkpoint` in the
//!    partition directory (Kafka's file format, one line; Kafka keeps one per log dir).
//!
//! Recovery ([`recover_leftovers`], at open): `.cleaned` files are deleted (the swap never
//! committed: the old segments are intact), a `.swap` file replaces every segment that
//! starts inside its offsets and is renamed over its `.log` (the swap committed: the
//! cleaned segment is durable). So a crash leaves each group old or new. A cleaned segment ends where the old one did (its next offset is the
//! next segment's base), so offsets stay contiguous across segments.
//!
//! The cleaner never takes the log's I/O gate and never touches the active segment:
//! appends and their writes continue while it reads and writes sealed segments; its
//! I/O is throttled to `log.cleaner.io.max.bytes.per.second` ([`CleanerBudget`]) and it
//! yields to the shard's other tasks between batches.

mod batch;

use std::cell::Cell;
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wire::Offset;
use wire::batch::{BATCH_HEADER_SIZE, read_header, records_section, validate_batch, walk_records};

pub use batch::{
    DECOMPRESSED_BATCH_BYTES_MAX, DELETE_HORIZON_BIT, FilterRules, Filtered, Outcome,
    STORED_DECOMPRESSED_BYTES_MAX, decompressed_batch_bytes_max, filter_batch, keyless_records,
};

use super::atomic::{sync_dir, write_atomic};
use super::error::{Result, StorageError};
use super::file::{Disk, SegmentFile};
use super::index::relative;
use super::log::{Log, State};
use super::open::write_index_files;
use super::recovery::FileWindow;
use super::segment::{BatchMeta, Segment, check_stored_header};
use super::txn_index::AbortedTxn;
use super::writer::{SegmentWriter, create_log_file};

/// The per-partition cleaner checkpoint (Kafka's name and format; Kafka keeps one file
/// per log directory for all its partitions, weir one per partition directory).
pub const CHECKPOINT_FILE: &str = "cleaner-offset-checkpoint";
/// Suffix of a cleaned segment being written (deleted by recovery).
pub const CLEANED_SUFFIX: &str = ".cleaned";
/// Suffix of a cleaned segment whose swap committed (completed by recovery).
pub const SWAP_SUFFIX: &str = ".swap";
/// Kafka's `log.cleaner.dedupe.buffer.size` default (for the whole node; weir divides it
/// among the shards).
pub const DEDUPE_BUFFER_BYTES_DEFAULT: u64 = 128 << 20;
/// Memory counted per mapped key besides its bytes (hash table slot, box, offset).
pub const MAP_ENTRY_OVERHEAD_BYTES: u64 = 48;
/// Memory counted per producer id remembered by the map.
const PRODUCER_ENTRY_BYTES: u64 = 32;
/// Cleaned batches are written in runs of about this many bytes.
const WRITE_CHUNK_BYTES: usize = 1 << 20;
/// Rounds one call may run (a round is bounded by the dedupe buffer).
pub const ROUNDS_PER_CALL_MAX: u32 = 16;
/// The cleaner yields to the shard's other tasks after this much I/O.
const YIELD_EVERY_BYTES: u64 = 64 << 10;
/// The cleaner reads sealed segments in pieces of this size. Its reads share the device
/// queue with the appends of the same disk, and an append queued behind a cleaner read
/// waits for it: with 1 MiB reads a producer beside a busy cleaner lost 27 % of its
/// throughput, with 128 KiB 16 %, with 64 KiB 12 % (tests/bench_cleaner.sh, docs/PERFORMANCE.md).
const CLEANER_READ_BYTES: usize = 64 << 10;
/// The throttle measures the I/O rate over windows of this length (Kafka's Throttler).
const THROTTLE_WINDOW: Duration = Duration::from_secs(1);

/// A shard's cleaner budget, shared by every log the shard cleans: the offset map's
/// memory (`log.cleaner.dedupe.buffer.size`) and the I/O rate
/// (`log.cleaner.io.max.bytes.per.second`, bytes read plus written).
pub struct CleanerBudget {
    dedupe_bytes: u64,
    io_bytes_per_second: u64,
    window_start: Cell<Instant>,
    window_bytes: Cell<u64>,
    since_yield_bytes: Cell<u64>,
}

impl CleanerBudget {
    /// `io_bytes_per_second == u64::MAX` is no limit (Kafka's default).
    pub fn new(dedupe_bytes: u64, io_bytes_per_second: u64) -> CleanerBudget {
        assert!(io_bytes_per_second > 0, "a zero I/O rate would never clean");
        CleanerBudget {
            dedupe_bytes: dedupe_bytes.max(1),
            io_bytes_per_second,
            window_start: Cell::new(Instant::now()),
            window_bytes: Cell::new(0),
            since_yield_bytes: Cell::new(0),
        }
    }

    /// The offset map's memory bound.
    pub fn dedupe_bytes(&self) -> u64 {
        self.dedupe_bytes
    }

    /// Counts `bytes` of cleaner I/O; sleeps while the rate in this window is above the
    /// budget, and otherwise yields if the task used its time slice.
    async fn throttle(&self, bytes: u64) {
        if self.io_bytes_per_second != u64::MAX {
            let total = self.window_bytes.get().saturating_add(bytes);
            self.window_bytes.set(total);
            let elapsed = self.window_start.get().elapsed();
            let allowed = Duration::from_secs_f64(total as f64 / self.io_bytes_per_second as f64);
            if allowed > elapsed {
                glommio::timer::sleep(allowed - elapsed).await;
            }
            if self.window_start.get().elapsed() >= THROTTLE_WINDOW {
                self.window_start.set(Instant::now());
                self.window_bytes.set(0);
            }
        }
        // Let the shard's other task queues (appends, fetches) run often, not only when
        // the executor's time slice (100 ms) ran out: the cleaner is the least urgent task
        // there is. Yielding within the cleaner's own queue would not do: the executor
        // keeps running a queue until its slice ends, so the cleaner yields its queue.
        let since = self.since_yield_bytes.get().saturating_add(bytes);
        if since >= YIELD_EVERY_BYTES {
            self.since_yield_bytes.set(0);
            glommio::executor().yield_task_queue_now().await;
        } else {
            self.since_yield_bytes.set(since);
            glommio::yield_if_needed().await;
        }
    }
}

/// What the partition knows and the log does not, bounding a clean (Kafka's
/// `firstUncleanableDirtyOffset` and its aborted-transaction skip):
///
/// - `clean_below`: only segments wholly below it are cleaned — the last stable offset
///   (the first offset of the oldest undecided transaction, at most the high watermark).
///   A transaction that may still abort must not hide an older value of its keys, and a
///   record above the HW may still be truncated away, so it must not obsolete one below.
/// - the aborted transactions: their records never enter the offset map, so they obsolete
///   nothing (they stay in the log until a later record of their key obsoletes them).
///
/// A log's own tests use [`CleanBounds::unbounded`] (no transactions, no replication).
#[derive(Debug, Default)]
pub struct CleanBounds {
    clean_below: Option<Offset>,
    /// Aborted transactions by producer id: (first offset, marker offset).
    aborted: HashMap<i64, Vec<(Offset, Offset)>>,
}

impl CleanBounds {
    /// No bound: every sealed segment may be cleaned and every record is committed.
    pub fn unbounded() -> CleanBounds {
        CleanBounds::default()
    }

    /// Cleans only below `clean_below`; the records of `aborted` never obsolete others.
    pub fn new(clean_below: Offset, aborted: &[AbortedTxn]) -> CleanBounds {
        let mut by_producer: HashMap<i64, Vec<(Offset, Offset)>> = HashMap::new();
        // An entry always ends at its marker, after its first batch (decoded entries are
        // checked); one that did not could cover no batch, so it is skipped.
        for t in aborted.iter().filter(|t| t.first_offset < t.last_offset) {
            by_producer
                .entry(t.producer_id.get())
                .or_default()
                .push((t.first_offset, t.last_offset));
        }
        CleanBounds {
            clean_below: Some(clean_below),
            aborted: by_producer,
        }
    }

    /// Whether a segment ending before `next_offset` may be cleaned.
    fn allows(&self, next_offset: Offset) -> bool {
        self.clean_below.is_none_or(|below| next_offset <= below)
    }

    /// Whether the transactional batch of `producer_id` at `base` belongs to an aborted
    /// transaction (it starts at or after the transaction's first offset and before its
    /// ABORT marker).
    fn is_aborted(&self, producer_id: i64, base: Offset) -> bool {
        self.aborted
            .get(&producer_id)
            .is_some_and(|ranges| ranges.iter().any(|&(f, l)| f <= base && base < l))
    }
}

/// What one [`Log::clean_if_due`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanStats {
    /// Rounds run (0: the log was not due).
    pub rounds: u32,
    /// Segments rewritten and swapped in.
    pub segments_swapped: u32,
    /// Bytes of sealed segments read (map building and rewriting).
    pub bytes_read: u64,
    /// Size of the swapped segments before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub records_removed: u64,
    pub tombstones_removed: u64,
    /// Most keys the offset map held in a round.
    pub map_keys: u64,
    pub elapsed: Duration,
}

/// The cleaner's memory of a log.
#[derive(Debug, Default)]
pub struct CleanerState {
    /// The checkpoint, once read from its file.
    checkpoint: Option<Offset>,
    /// The earliest delete horizon of tombstones still in the cleaned segments (the log is
    /// due again then). Lost on restart: the next clean rediscovers it.
    horizon_ms: Option<i64>,
    /// A clean is running (a second concurrent one returns at once).
    running: bool,
    /// The segment where a clean last found damage, as (its base, its size then): the
    /// log is not cleaned again while that segment is there unchanged, else every
    /// `log.cleaner.backoff.ms` would re-read it up to the damage and log the same error.
    /// Retention, a truncation or a restart lets the cleaner try again.
    damaged: Option<(Offset, u64)>,
}

/// A cleanable sealed segment, as planned.
struct SegRef {
    base: Offset,
    next_offset: Offset,
    size: u64,
    file: Rc<SegmentFile>,
    path: PathBuf,
    roll_base_ms: Option<i64>,
    /// Where batches at the checkpoint start in this segment (0 if it starts after).
    checkpoint_position: u64,
    /// The log's truncation count when planned: a segment cut, refilled and sealed again
    /// keeps its file, and only this tells the copy is of its old contents.
    truncations: u64,
}

/// The segments a round may clean and where the dirty part starts.
struct Plan {
    segments: Vec<SegRef>,
    checkpoint: Offset,
    /// The offset after the last cleanable segment.
    end: Offset,
}

/// Keys → latest offset over the dirty batches read, and each producer's last batch.
struct OffsetMap {
    keys: HashMap<Box<[u8]>, Offset>,
    producers: HashMap<i64, Offset>,
    bytes: u64,
    limit: u64,
    /// Offsets below this were mapped (from the checkpoint).
    end: Offset,
}

impl OffsetMap {
    fn new(limit: u64, start: Offset) -> OffsetMap {
        OffsetMap {
            keys: HashMap::new(),
            producers: HashMap::new(),
            bytes: 0,
            limit,
            end: start,
        }
    }

    /// Maps a batch's keys, unless they might not fit (then false, nothing added; the
    /// first batch of a round always fits, so every round makes progress).
    /// `bounds`: the records of an aborted transaction are not mapped (they obsolete
    /// nothing); its producer is still remembered.
    fn add_batch(
        &mut self,
        batch: &Bytes,
        bounds: &CleanBounds,
    ) -> std::result::Result<bool, String> {
        let (header, section) =
            records_section(batch, STORED_DECOMPRESSED_BYTES_MAX).map_err(|e| e.to_string())?;
        let attributes = header.attributes();
        let aborted = attributes.is_transactional()
            && bounds.is_aborted(header.producer_id.get(), header.base_offset());
        let mut keys = Vec::new();
        if !attributes.is_control() && !aborted {
            // Walked, not decoded: only keys are wanted, headers are skipped unread.
            walk_records(&section, header.records_count(), |_, r| {
                if let Some(k) = r.key {
                    keys.push((k, header.base_offset().add(i64::from(r.offset_delta))));
                }
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        }
        // An upper bound (a key repeated inside the batch is counted each time).
        let need: u64 = keys
            .iter()
            .filter(|(k, _)| !self.keys.contains_key(&k[..]))
            .map(|(k, _)| k.len() as u64 + MAP_ENTRY_OVERHEAD_BYTES)
            .sum::<u64>()
            + PRODUCER_ENTRY_BYTES;
        if self.bytes + need > self.limit && !(self.keys.is_empty() && self.producers.is_empty()) {
            return Ok(false);
        }
        for (k, offset) in keys {
            let cost = k.len() as u64 + MAP_ENTRY_OVERHEAD_BYTES;
            if self
                .keys
                .insert(k.to_vec().into_boxed_slice(), offset)
                .is_none()
            {
                self.bytes += cost;
            }
        }
        // A producer's last *data* batch holds its sequence state; a marker after it must
        // not make that batch look superseded (Kafka keeps the batch at lastDataOffset).
        let pid = header.producer_id.get();
        if pid >= 0
            && !attributes.is_control()
            && self.producers.insert(pid, header.base_offset()).is_none()
        {
            self.bytes += PRODUCER_ENTRY_BYTES;
        }
        Ok(true)
    }

    /// Whether the batch at `base` may be its producer's last: no later batch of the
    /// producer was mapped (a producer not seen in the dirty part is assumed to end here).
    fn last_of_producer(&self, producer_id: i64, base: Offset) -> bool {
        self.producers
            .get(&producer_id)
            .is_none_or(|&last| base >= last)
    }
}

/// Resets the running flag however the clean ends.
struct Running<'a>(&'a Log);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.state.borrow_mut().cleaner.running = false;
    }
}

impl Log {
    /// Compacts the log if it is `cleanup.policy=compact` (or `compact,delete`) and due
    /// (see the module docs); runs up to [`ROUNDS_PER_CALL_MAX`] rounds, each bounded by
    /// the budget's dedupe buffer, with I/O throttled to its rate. `now_ms` is the clock
    /// for `min.compaction.lag.ms`, `max.compaction.lag.ms` and tombstone horizons. Never
    /// blocks appends. A log that is closed, failed or out of space is not cleaned; damage
    /// in a sealed segment fails the clean with [`StorageError::Corrupt`] and leaves the
    /// log as it was, and later calls skip the log (nothing read, nothing logged) while
    /// that segment is there unchanged.
    pub async fn clean_if_due(&self, now_ms: i64, budget: &CleanerBudget) -> Result<CleanStats> {
        self.clean_if_due_within(now_ms, budget, &CleanBounds::unbounded())
            .await
    }

    /// [`Self::clean_if_due`] within what the partition allows ([`CleanBounds`]: below
    /// its last stable offset, aborted transactions obsoleting nothing).
    pub async fn clean_if_due_within(
        &self,
        now_ms: i64,
        budget: &CleanerBudget,
        bounds: &CleanBounds,
    ) -> Result<CleanStats> {
        let started = Instant::now();
        let mut stats = CleanStats::default();
        {
            let mut st = self.state.borrow_mut();
            if !st.config.cleanup_policy.compact || st.cleaner.running {
                return Ok(stats);
            }
            if let Some((base, size)) = st.cleaner.damaged {
                if st.segments.get(&base).is_some_and(|s| s.size == size) {
                    return Ok(stats);
                }
                st.cleaner.damaged = None;
            }
            st.check_writable(&self.dir)?;
            st.cleaner.running = true;
        }
        let _running = Running(self);
        let cleaned = self.clean_rounds(now_ms, budget, bounds, &mut stats).await;
        if let Err(StorageError::Corrupt { path, .. }) = &cleaned {
            self.remember_damage(path);
        }
        cleaned?;
        stats.elapsed = started.elapsed();
        Ok(stats)
    }

    /// The rounds of one [`Self::clean_if_due_within`].
    async fn clean_rounds(
        &self,
        now_ms: i64,
        budget: &CleanerBudget,
        bounds: &CleanBounds,
        stats: &mut CleanStats,
    ) -> Result<()> {
        let mut forced = false;
        for _ in 0..ROUNDS_PER_CALL_MAX {
            let checkpoint = self.cleaner_checkpoint()?;
            let Some(plan) = plan(&self.state.borrow(), checkpoint, now_ms, forced, bounds) else {
                break;
            };
            let round = self.clean_round(&plan, now_ms, (budget, bounds), stats);
            let Some(end) = round.await? else {
                break;
            };
            stats.rounds += 1;
            if end > checkpoint {
                write_checkpoint(&self.dir, end)?;
                self.state.borrow_mut().cleaner.checkpoint = Some(end);
            }
            if end >= plan.end {
                break;
            }
            // The rest of the dirty part follows now, whatever the ratio says.
            forced = true;
        }
        Ok(())
    }

    /// Notes the segment at `path` as damaged (see `CleanerState::damaged`).
    fn remember_damage(&self, path: &Path) {
        let mut st = self.state.borrow_mut();
        let damaged = st
            .segments
            .values()
            .find(|s| s.path("log") == path)
            .map(|s| (s.base, s.size));
        if damaged.is_some() {
            st.cleaner.damaged = damaged;
        }
    }

    /// After a cut of the log at `end` (a follower's truncation, a restart below it): a
    /// cleaner checkpoint past it is lowered to it, as Kafka's `maybeTruncateCheckpoint`
    /// does, so that records appended again below the old checkpoint are mapped (else a
    /// tombstone there could go while the value it deletes stays).
    pub(super) fn lower_cleaner_checkpoint(&self, end: Offset) -> Result<()> {
        if self.cleaner_checkpoint()? > end {
            write_checkpoint(&self.dir, end)?;
            self.state.borrow_mut().cleaner.checkpoint = Some(end);
        }
        Ok(())
    }

    /// The offset up to which the log was cleaned (`cleaner-offset-checkpoint`); offset 0
    /// before the first clean.
    pub fn cleaner_checkpoint(&self) -> Result<Offset> {
        if let Some(c) = self.state.borrow().cleaner.checkpoint {
            return Ok(c);
        }
        let c = read_checkpoint(&self.dir)?.unwrap_or(Offset(0));
        self.state.borrow_mut().cleaner.checkpoint = Some(c);
        Ok(c)
    }

    /// One round: map, rewrite, swap. Returns the map's end, or `None` if a segment
    /// changed under the cleaner (retention, truncation, close): the caller stops.
    async fn clean_round(
        &self,
        plan: &Plan,
        now_ms: i64,
        (budget, bounds): (&CleanerBudget, &CleanBounds),
        stats: &mut CleanStats,
    ) -> Result<Option<Offset>> {
        let map = self.build_map(plan, (budget, bounds), stats).await?;
        let segment_bytes = self.state.borrow().config.segment_bytes;
        let mut horizon: Option<i64> = None;
        let to_clean: Vec<&SegRef> = plan.segments.iter().filter(|s| s.base < map.end).collect();
        for group in groups(&to_clean, segment_bytes) {
            let (cleaned, group_horizon) =
                self.clean_group(group, &map, now_ms, budget, stats).await?;
            horizon = min_some(horizon, group_horizon);
            if let Some(new) = cleaned {
                let size = new.size;
                if !self.swap(group, new)? {
                    return Ok(None);
                }
                stats.segments_swapped += group.len() as u32;
                stats.bytes_before += group.iter().map(|s| s.size).sum::<u64>();
                stats.bytes_after += size;
            }
        }
        self.state.borrow_mut().cleaner.horizon_ms = horizon;
        Ok(Some(map.end))
    }

    /// Builds the offset map from the checkpoint over the dirty segments, until the
    /// budget's dedupe buffer is full.
    async fn build_map(
        &self,
        plan: &Plan,
        (budget, bounds): (&CleanerBudget, &CleanBounds),
        stats: &mut CleanStats,
    ) -> Result<OffsetMap> {
        let mut map = OffsetMap::new(budget.dedupe_bytes(), plan.checkpoint);
        let dirty = plan
            .segments
            .iter()
            .filter(|s| s.next_offset > plan.checkpoint);
        'segments: for seg in dirty {
            let mut window =
                FileWindow::with_window(seg.file.clone(), &seg.path, seg.size, CLEANER_READ_BYTES);
            let mut pos = seg.checkpoint_position;
            while pos < seg.size {
                // A log closed meanwhile (shutdown, idle eviction) stops the clean.
                self.check_readable()?;
                let batch = read_batch(&mut window, &seg.path, pos, seg.size).await?;
                let size = batch.len() as u64;
                stats.bytes_read += size;
                budget.throttle(size).await;
                let (last, next) = match read_header(&batch) {
                    Ok(h) => (h.last_offset(), h.next_offset()),
                    Err(e) => return Err(corrupt(&seg.path, pos, e.to_string())),
                };
                if last >= plan.checkpoint {
                    let added = map
                        .add_batch(&batch, bounds)
                        .map_err(|reason| corrupt(&seg.path, pos, reason))?;
                    if !added {
                        break 'segments;
                    }
                    map.end = next;
                }
                pos += size;
            }
            map.end = map.end.max(seg.next_offset);
        }
        stats.map_keys = stats.map_keys.max(map.keys.len() as u64);
        Ok(map)
    }

    /// Writes the filtered copy of the segments of `group` (consecutive) into one
    /// `<first base>.log.cleaned`. Returns the new segment (durable, not yet swapped) if
    /// anything changed (a merge of several segments is a change), and the earliest
    /// delete horizon of the tombstones it keeps.
    async fn clean_group(
        &self,
        group: &[&SegRef],
        map: &OffsetMap,
        now_ms: i64,
        budget: &CleanerBudget,
        stats: &mut CleanStats,
    ) -> Result<(Option<Segment>, Option<i64>)> {
        let path = suffixed(&group[0].path, CLEANED_SUFFIX);
        let file = create_log_file(&self.disk, &path).await?;
        let result = self
            .write_cleaned(group, map, now_ms, budget, stats, (file, &path))
            .await;
        if !matches!(result, Ok((Some(_), _))) {
            // Unchanged or failed: the old segments stay, the copy goes.
            let _ = self.disk.remove(&path);
        }
        result
    }

    async fn write_cleaned(
        &self,
        group: &[&SegRef],
        map: &OffsetMap,
        now_ms: i64,
        budget: &CleanerBudget,
        stats: &mut CleanStats,
        (file, path): (Rc<SegmentFile>, &Path),
    ) -> Result<(Option<Segment>, Option<i64>)> {
        let (interval, delete_retention_ms) = {
            let st = self.state.borrow();
            let c = &st.config;
            (c.index_interval_bytes, c.delete_retention_ms)
        };
        let (first, last) = (group[0], group[group.len() - 1]);
        let mut copy = Copy {
            writer: SegmentWriter::resume(file.clone(), path, 0).await?,
            segment: Segment::new(&self.dir, first.base),
            chunks: Vec::new(),
            chunk_bytes: 0,
            interval,
        };
        let (mut changed, mut horizon) = (group.len() > 1, None);
        for seg in group {
            let mut window =
                FileWindow::with_window(seg.file.clone(), &seg.path, seg.size, CLEANER_READ_BYTES);
            let mut pos = 0;
            while pos < seg.size {
                self.check_readable()?;
                let batch = read_batch(&mut window, &seg.path, pos, seg.size).await?;
                let size = batch.len() as u64;
                stats.bytes_read += size;
                let f = filter_stored(&batch, (&seg.path, pos), map, now_ms, delete_retention_ms)?;
                stats.records_removed += f.records_removed;
                stats.tombstones_removed += f.tombstones_removed;
                horizon = min_some(horizon, f.horizon_ms);
                pos += size;
                changed |= f.outcome != Outcome::Keep;
                match f.outcome {
                    Outcome::Keep => copy.push(batch, budget).await?,
                    Outcome::Rewrite(b) => copy.push(b, budget).await?,
                    Outcome::Drop => {}
                }
                budget.throttle(size).await;
            }
        }
        if !changed {
            return Ok((None, horizon));
        }
        let mut new = copy.finish().await?;
        new.restore(new.size, last.next_offset, 0);
        new.roll_base_ms = first.roll_base_ms;
        new.seal_time_index();
        new.sealed = true;
        new.file = Some(file);
        Ok((Some(new), horizon))
    }

    /// Swaps the cleaned copy in for the segments of `group` (see the module docs, step
    /// 3). Synchronous from the check to the state update, so nothing else runs in
    /// between. Returns false (the copy deleted) if a segment of the group is no longer
    /// in the log as it was read.
    fn swap(&self, group: &[&SegRef], mut new: Segment) -> Result<bool> {
        let first = group[0];
        let cleaned = suffixed(&first.path, CLEANED_SUFFIX);
        let swap = suffixed(&first.path, SWAP_SUFFIX);
        let unchanged = {
            let st = self.state.borrow();
            let same_files = group.iter().all(|old| {
                st.truncations == old.truncations
                    && st.segments.get(&old.base).is_some_and(|s| {
                        s.sealed && s.file.as_ref().is_some_and(|f| Rc::ptr_eq(f, &old.file))
                    })
            });
            same_files && !st.closed && st.failed.is_none()
        };
        if !unchanged {
            self.disk
                .remove(&cleaned)
                .map_err(|e| StorageError::io("remove", &cleaned, e))?;
            return Ok(false);
        }
        keep_modified_time(group, &cleaned);
        self.disk
            .rename(&cleaned, &swap)
            .map_err(|e| StorageError::io("rename", &cleaned, e))?;
        // The commit point: from here recovery completes the swap.
        sync_dir(&self.dir)?;
        // The merged segments after the first go, then the first's index files.
        for old in group.iter().skip(1) {
            remove_files(
                &self.disk,
                &self.dir,
                old.base,
                &["log", "index", "timeindex"],
            )?;
        }
        remove_files(&self.disk, &self.dir, first.base, &["index", "timeindex"])?;
        self.disk
            .rename(&swap, &first.path)
            .map_err(|e| StorageError::io("rename", &swap, e))?;
        sync_dir(&self.dir)?;
        let mut st = self.state.borrow_mut();
        st.cache.drop_below(new.next_offset);
        st.read_ahead.invalidate();
        match write_index_files(&new, &self.disk) {
            Ok(()) => new.index_to_files(false),
            // Rebuilt from the `.log` at the next open; kept in memory until then.
            Err(e) => {
                tracing::warn!(segment = %first.path.display(), "cleaned segment's index files: {e}")
            }
        }
        for old in group.iter().skip(1) {
            st.segments.remove(&old.base);
        }
        st.segments.insert(first.base, new);
        st.assert_positions();
        Ok(true)
    }
}

/// Gives the cleaned copy the newest last-modified time of the segments it replaces, as
/// Kafka's cleaner does: time retention ages a segment without timestamps by it, and a
/// clean must not make such a segment young again. Best effort (a failure only delays
/// retention; a simulated disk has no such file).
fn keep_modified_time(group: &[&SegRef], cleaned: &Path) {
    let newest = group
        .iter()
        .filter_map(|old| fs::metadata(&old.path).and_then(|m| m.modified()).ok())
        .max();
    if let Some(t) = newest
        && let Err(e) = fs::File::options()
            .write(true)
            .open(cleaned)
            .and_then(|f| f.set_modified(t))
    {
        tracing::debug!(segment = %cleaned.display(), "cleaned segment's modified time: {e}");
    }
}

/// A cleaned copy being written: the batches kept so far, in runs of
/// [`WRITE_CHUNK_BYTES`], and the summary and indexes of the segment they make.
struct Copy {
    writer: SegmentWriter,
    segment: Segment,
    chunks: Vec<Bytes>,
    chunk_bytes: usize,
    interval: u32,
}

impl Copy {
    async fn push(&mut self, batch: Bytes, budget: &CleanerBudget) -> Result<()> {
        if let Ok(h) = read_header(&batch) {
            self.segment
                .record_batch(&BatchMeta::of(h), self.interval, h.max_timestamp());
        }
        self.chunk_bytes += batch.len();
        self.chunks.push(batch);
        if self.chunk_bytes >= WRITE_CHUNK_BYTES {
            self.writer.write(&self.chunks).await?;
            budget.throttle(self.chunk_bytes as u64).await;
            self.chunks.clear();
            self.chunk_bytes = 0;
        }
        Ok(())
    }

    /// Writes the rest, trims and fdatasyncs: durable before the swap commits, so a crash
    /// after the rename keeps these bytes.
    async fn finish(mut self) -> Result<Segment> {
        self.writer.write(&self.chunks).await?;
        self.writer.finish().await?;
        assert_eq!(
            self.writer.end(),
            self.segment.size,
            "cleaned segment size differs from its batches"
        );
        Ok(self.segment)
    }
}

/// Filters one stored batch (at `pos` in `path`) against the map.
fn filter_stored(
    batch: &Bytes,
    (path, pos): (&Path, u64),
    map: &OffsetMap,
    now_ms: i64,
    delete_retention_ms: i64,
) -> Result<Filtered> {
    let (pid, base) = match read_header(batch) {
        Ok(h) => (h.producer_id.get(), h.base_offset()),
        Err(e) => return Err(corrupt(path, pos, e.to_string())),
    };
    let rules = FilterRules {
        now_ms,
        delete_retention_ms,
        last_of_producer: map.last_of_producer(pid, base),
    };
    filter_batch(batch, &map.keys, rules).map_err(|e| corrupt(path, pos, e.0))
}

/// Removes the files with `extensions` of the segment at `base` (missing ones are fine).
fn remove_files(disk: &Disk, dir: &Path, base: Offset, extensions: &[&str]) -> Result<()> {
    for ext in extensions {
        let path = dir.join(super::segment_file_name(base, ext));
        disk.remove(&path)
            .map_err(|e| StorageError::io("remove", &path, e))?;
    }
    Ok(())
}

/// Splits consecutive segments into groups that are rewritten into one segment each:
/// together at most `segment_bytes` before cleaning (so the result fits a segment, as
/// Kafka groups them) and within the index's 4-byte relative offsets.
fn groups<'a, 'b>(segments: &'b [&'a SegRef], segment_bytes: u64) -> Vec<&'b [&'a SegRef]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for (i, seg) in segments.iter().enumerate() {
        let fits = bytes + seg.size <= segment_bytes
            && relative(segments[start].base, seg.next_offset).is_some();
        if i > start && !fits {
            out.push(&segments[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += seg.size;
    }
    if start < segments.len() {
        out.push(&segments[start..]);
    }
    out
}

/// What a round of the log in `st` would clean, if it is due (see the module docs).
/// `forced`: a previous round stopped at a full map, continue whatever the ratio.
/// Only segments wholly below `bounds`' last stable offset are cleanable.
fn plan(
    st: &State,
    checkpoint: Offset,
    now_ms: i64,
    forced: bool,
    bounds: &CleanBounds,
) -> Option<Plan> {
    let cfg = &st.config;
    let active_base = st.active()?.base;
    let mut segments = Vec::new();
    for seg in st.segments.values() {
        if seg.base >= active_base || !seg.sealed || !bounds.allows(seg.next_offset) {
            break;
        }
        let young = cfg.min_compaction_lag_ms > 0
            && seg.max_timestamp.0 > now_ms.saturating_sub(cfg.min_compaction_lag_ms);
        let Some(file) = seg.file.clone().filter(|_| !young) else {
            break;
        };
        if seg.next_offset <= st.log_start {
            continue;
        }
        let checkpoint_position = match relative(seg.base, checkpoint) {
            // Only if the shard's index cache holds it: else the dirty part is found
            // by reading the segment from its start (batches below the checkpoint are
            // read and skipped), which costs reads, not a wrong map.
            Some(rel) if checkpoint < seg.next_offset => seg
                .with_index(None, |ix| ix.position_for(rel).get())
                .unwrap_or(0),
            _ => 0,
        };
        segments.push(SegRef {
            base: seg.base,
            next_offset: seg.next_offset,
            size: seg.size,
            file,
            path: seg.path("log"),
            roll_base_ms: seg.roll_base_ms,
            checkpoint_position,
            truncations: st.truncations,
        });
    }
    let end = segments.last()?.next_offset;
    let checkpoint = checkpoint.max(segments[0].base);
    let total: u64 = segments.iter().map(|s| s.size).sum();
    let mut dirty_segments = segments.iter().filter(|s| s.next_offset > checkpoint);
    let first_dirty = dirty_segments.clone().next();
    let dirty: u64 = dirty_segments.by_ref().map(|s| s.size).sum();
    let ratio_due =
        dirty > 0 && total > 0 && dirty as f64 / total as f64 >= cfg.min_cleanable_dirty_ratio;
    let lag_due = dirty > 0
        && first_dirty
            .and_then(|s| s.roll_base_ms)
            .is_some_and(|t| now_ms.saturating_sub(t) >= cfg.max_compaction_lag_ms);
    let horizon_due = st.cleaner.horizon_ms.is_some_and(|h| now_ms >= h);
    let due = (forced && dirty > 0) || ratio_due || lag_due || horizon_due;
    due.then_some(Plan {
        segments,
        checkpoint,
        end,
    })
}

/// Reads and checks (framing, CRC) the stored batch at `pos`.
async fn read_batch(window: &mut FileWindow, path: &Path, pos: u64, end: u64) -> Result<Bytes> {
    let head = window.get(pos, BATCH_HEADER_SIZE).await?;
    let (_, total) =
        check_stored_header(head, end - pos).map_err(|r| corrupt(path, pos, r.to_owned()))?;
    let bytes = window.get(pos, total).await?;
    validate_batch(bytes).map_err(|e| corrupt(path, pos, e.to_string()))?;
    Ok(Bytes::copy_from_slice(bytes))
}

fn corrupt(path: &Path, position: u64, reason: String) -> StorageError {
    StorageError::Corrupt {
        path: path.to_path_buf(),
        position,
        reason: format!("log cleaner: {reason}"),
    }
}

fn min_some(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `path` with `suffix` appended to its file name (`x.log` → `x.log.cleaned`).
fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The topic and partition a partition directory is named for (`<topic>-<partition>`),
/// for the checkpoint line; a directory not named that way uses its name and 0.
fn topic_partition(dir: &Path) -> (String, i32) {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.rsplit_once('-').map(|(t, p)| (t, p.parse::<i32>())) {
        Some((topic, Ok(p))) => (topic.to_owned(), p),
        _ => (name, 0),
    }
}

/// Kafka's checkpoint format: `0` (version), the entry count, then `topic partition
/// offset` per line.
fn write_checkpoint(dir: &Path, offset: Offset) -> Result<()> {
    let (topic, partition) = topic_partition(dir);
    let text = format!("0\n1\n{topic} {partition} {}\n", offset.get());
    write_atomic(&dir.join(CHECKPOINT_FILE), text.as_bytes())
}

fn read_checkpoint(dir: &Path) -> Result<Option<Offset>> {
    let path = dir.join(CHECKPOINT_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StorageError::io("read", &path, e)),
    };
    let mut lines = text.lines();
    let entry = match (lines.next(), lines.next()) {
        (Some("0"), Some("1")) => lines.next(),
        (Some("0"), Some("0")) => return Ok(None),
        _ => None,
    };
    let offset = entry
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|o| o.parse::<i64>().ok())
        .filter(|&o| o >= 0);
    match offset {
        Some(o) => Ok(Some(Offset(o))),
        None => Err(StorageError::Corrupt {
            path,
            position: 0,
            reason: "cleaner checkpoint is not `0\\n1\\n<topic> <partition> <offset>\\n`".into(),
        }),
    }
}

/// At open, before the segments are listed: finishes or undoes a swap a crash
/// interrupted. `<base>.log.cleaned` (not committed) is deleted; `<base>.log.swap`
/// (committed, durable) replaces `<base>.log`, whose index files are deleted (they are
/// rebuilt). Returns how many files it handled.
pub(super) async fn recover_leftovers(disk: &Disk, dir: &Path) -> Result<usize> {
    let entries = fs::read_dir(dir).map_err(|e| StorageError::io("read dir", dir, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("read dir", dir, e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    let mut handled = 0;
    for name in names {
        let path = dir.join(&name);
        if name.ends_with(CLEANED_SUFFIX) {
            disk.remove(&path)
                .map_err(|e| StorageError::io("remove", &path, e))?;
            tracing::info!(file = %path.display(), "deleted an uncommitted cleaned segment");
            handled += 1;
        } else if let Some(log_name) = name.strip_suffix(SWAP_SUFFIX)
            && let Some(base) = log_name.strip_suffix(".log").and_then(parse_base)
        {
            // Segments merged into the copy: those starting inside its offsets (Kafka's
            // rule). A merged segment whose batches were all removed starts past them and
            // stays, with its old, obsolete records: nothing live is lost.
            let next = next_offset_of(disk, &path).await?;
            for other in segment_bases(dir)? {
                if other > base && other < next {
                    remove_files(disk, dir, other, &["log", "index", "timeindex"])?;
                }
            }
            remove_files(disk, dir, base, &["index", "timeindex"])?;
            let target = dir.join(log_name);
            disk.rename(&path, &target)
                .map_err(|e| StorageError::io("rename", &path, e))?;
            tracing::info!(segment = %target.display(), "completed an interrupted cleaner swap");
            handled += 1;
        }
    }
    if handled > 0 {
        sync_dir(dir)?;
    }
    Ok(handled)
}

fn parse_base(stem: &str) -> Option<Offset> {
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
        .then(|| stem.parse().ok().map(Offset))
        .flatten()
}

/// Base offsets of the `.log` files in `dir`.
fn segment_bases(dir: &Path) -> Result<Vec<Offset>> {
    let entries = fs::read_dir(dir).map_err(|e| StorageError::io("read dir", dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("read dir", dir, e))?;
        let name = entry.file_name();
        if let Some(base) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(parse_base)
        {
            out.push(base);
        }
    }
    Ok(out)
}

/// The offset after the last batch of a (durable, complete) cleaned copy, by walking its
/// batch headers; 0 if it holds none.
async fn next_offset_of(disk: &Disk, path: &Path) -> Result<Offset> {
    let file = super::writer::open_log_file(disk, path).await?;
    let size = file
        .file_size()
        .await
        .map_err(|e| StorageError::io("stat", path, e))?;
    let mut window = FileWindow::new(file, path, size);
    let mut next = Offset(0);
    let mut pos = 0u64;
    // Bounded: every turn moves `pos` forward by a whole batch.
    while pos + BATCH_HEADER_SIZE as u64 <= size {
        let head = window.get(pos, BATCH_HEADER_SIZE).await?;
        let Ok((h, total)) = check_stored_header(head, size - pos) else {
            break;
        };
        next = h.next_offset();
        pos += total as u64;
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::batch::{BatchBuilder, NewRecord, control_batch};
    use wire::{ProducerEpoch, ProducerId, Sequence};

    /// A transactional batch of producer 7 at `base`, one record keyed "k".
    fn txn_batch(base: i64) -> Bytes {
        BatchBuilder {
            base_offset: Offset(base),
            producer_id: ProducerId(7),
            producer_epoch: ProducerEpoch(0),
            base_sequence: Sequence(0),
            transactional: true,
            records: vec![NewRecord {
                key: Some(Bytes::from_static(b"k")),
                ..NewRecord::value(1000, Bytes::from_static(b"v"))
            }],
            ..BatchBuilder::default()
        }
        .build()
        .expect("a batch")
    }

    #[test]
    fn a_marker_after_a_producers_last_data_batch_leaves_that_batch_its_last() {
        let bounds = CleanBounds::new(Offset(100), &[]);
        let mut map = OffsetMap::new(1 << 20, Offset(0));
        assert_eq!(map.add_batch(&txn_batch(0), &bounds), Ok(true));
        let mut marker = bytes::BytesMut::from(
            &control_batch(ProducerId(7), ProducerEpoch(0), true, 0, 1001).expect("marker")[..],
        );
        wire::batch::assign_offsets(&mut marker, Offset(1), wire::LeaderEpoch(0)).expect("offsets");
        assert_eq!(map.add_batch(&marker.freeze(), &bounds), Ok(true));
        assert!(
            map.last_of_producer(7, Offset(0)),
            "the data batch before the marker holds the producer's sequences"
        );
    }
}
