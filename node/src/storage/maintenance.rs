//! Operations that remove data or end the log: truncation (followers), DeleteRecords,
//! retention, clean close, delete. Each takes the I/O lock and first writes everything
//! pending, so no write is in flight while files shrink or disappear.

use std::fs;
use std::rc::Rc;

use wire::Offset;

use super::atomic::{sync_dir, write_atomic};
use super::error::{Result, StorageError};
use super::file::SegmentFile;
use super::index::relative;
use super::log::{
    AppendsRefused, CLEAN_SHUTDOWN_FILE, Log, LogInner, NO_SPACE_RETRY_BACKOFF, Refusal, State,
};
use super::open::{
    remove_files, remove_segment_files, retire_segment_files, write_index_files, write_log_start,
    write_log_start_synced_later,
};
use super::read::{Planned, plan_loading_index};
use super::recovery::FileWindow;
use super::segment::{Segment, check_stored_header};
use super::writer::create_log_file;

/// Where a truncation cuts: segment, byte position, and the new log end offset.
struct Cut {
    base: Offset,
    position: u64,
    next_offset: Offset,
    /// The file `position` is in: a cleaner swap of the segment while the cut was found
    /// (its reads and its index load await) puts another file there, where the position
    /// means nothing.
    file: Option<Rc<SegmentFile>>,
}

/// Tries at finding a cut while the cleaner swaps the segment under it.
const CUT_TRIES: usize = 4;

impl Log {
    /// Removes every batch that holds an offset `>= offset` (a follower's truncation; the
    /// cut is at a batch boundary, so the new LEO may be below `offset` if it fell inside a
    /// batch). Returns the new LEO. Truncating below the log start empties the log and
    /// restarts it at `offset`. Durable (fdatasync) before it returns.
    pub async fn truncate_to(&self, offset: Offset) -> Result<Offset> {
        let _permit = self.lock_io().await?;
        // An append while the cut is found (disk reads) would be pending past the end
        // the cut sets; the replica may have become leader meanwhile.
        let _refused = AppendsRefused::new(&self.state, Refusal::Truncating);
        self.write_pending().await?;
        let (log_start, log_end) = {
            let st = self.state.borrow();
            st.check_writable(&self.dir)?;
            (st.log_start, st.log_end)
        };
        if offset >= log_end {
            return Ok(log_end);
        }
        if offset <= log_start {
            self.truncate_fully(offset.max(Offset(0))).await?;
            return Ok(self.log_end_offset());
        }
        let cut = self.find_cut_in_place(offset).await?;
        if cut.next_offset <= log_start {
            // The cut batch straddles the log start (DeleteRecords can stop mid-batch):
            // nothing at or after the start survives, so the log restarts empty there.
            self.truncate_fully(log_start).await?;
            return Ok(log_start);
        }
        let result = self.apply_cut(&cut).await;
        self.check_io(result)?;
        self.lower_cleaner_checkpoint(cut.next_offset)?;
        Ok(cut.next_offset)
    }

    /// Empties the log and restarts it at `offset` — a follower whose log ends below its
    /// leader's log start, which cannot copy the records in between. Durable before it
    /// returns.
    pub async fn restart_at(&self, offset: Offset) -> Result<()> {
        let _permit = self.lock_io().await?;
        let _refused = AppendsRefused::new(&self.state, Refusal::Truncating);
        self.write_pending().await?;
        self.state.borrow().check_writable(&self.dir)?;
        self.truncate_fully(offset.max(Offset(0))).await
    }

    /// [`Log::find_cut`], with the cut segment's index brought into memory, and checked
    /// (with no await after) to still be in the file it was found in.
    async fn find_cut_in_place(&self, offset: Offset) -> Result<Cut> {
        for _ in 0..CUT_TRIES {
            let cut = self.find_cut(offset).await?;
            self.index_to_memory(cut.base).await?;
            let st = self.state.borrow();
            let file = st.segments.get(&cut.base).map(|s| s.file.as_ref());
            let same = match (file, &cut.file) {
                (Some(Some(now)), Some(then)) => Rc::ptr_eq(now, then),
                (Some(None), None) => true,
                _ => false,
            };
            if same {
                return Ok(cut);
            }
            tracing::debug!(dir = %self.dir.display(), base = %cut.base, "segment swapped while its cut was found; finding it again");
        }
        Err(StorageError::Io {
            op: "truncate (the segment kept being replaced)",
            path: self.dir.clone(),
            source: std::io::Error::from(std::io::ErrorKind::ResourceBusy),
        })
    }

    /// Finds the first batch holding an offset `>= offset`.
    async fn find_cut(&self, offset: Offset) -> Result<Cut> {
        let planned = plan_loading_index(self, |st, loaded| {
            let Some(seg) = st.segments.range(..=offset).next_back().map(|(_, s)| s) else {
                return Err(StorageError::OffsetOutOfRange {
                    requested: offset,
                    log_start: st.log_start,
                    log_end: st.log_end,
                });
            };
            let from = match relative(seg.base, offset) {
                None => Ok(0),
                Some(r) => seg.with_index(loaded, |ix| ix.position_for(r).get()),
            };
            let from = match from {
                Ok(from) => from,
                Err(load) => return Ok(Planned::Load(load)),
            };
            Ok(Planned::Ready((
                seg.base,
                seg.file.clone(),
                seg.path("log"),
                from,
                seg.written,
                seg.next_offset,
            )))
        })
        .await?;
        let Some((base, file, path, from, end, seg_next)) = planned else {
            return Err(StorageError::OffsetOutOfRange {
                requested: offset,
                log_start: self.log_start_offset(),
                log_end: self.log_end_offset(),
            });
        };
        let Some(file) = file else {
            return Ok(Cut {
                base,
                position: 0,
                next_offset: base,
                file: None,
            });
        };
        let mut window = FileWindow::new(file.clone(), &path, end);
        let mut pos = from;
        while pos < end {
            let head = window.get(pos, wire::batch::BATCH_HEADER_SIZE).await?;
            let (h, size) =
                check_stored_header(head, end - pos).map_err(|reason| StorageError::Corrupt {
                    path: path.clone(),
                    position: pos,
                    reason: reason.to_owned(),
                })?;
            if h.last_offset() >= offset {
                return Ok(Cut {
                    base,
                    position: pos,
                    next_offset: h.base_offset(),
                    file: Some(file),
                });
            }
            pos += size as u64;
        }
        Ok(Cut {
            base,
            position: end,
            next_offset: seg_next,
            file: Some(file),
        })
    }
}

impl Log {
    /// Brings a sealed segment's index entries back into memory from its files: a cut
    /// in it makes it the active segment, whose index grows with appends.
    async fn index_to_memory(&self, base: Offset) -> Result<()> {
        let index = plan_loading_index(self, |st, loaded| {
            let Some(seg) = st.segments.get(&base).filter(|s| s.index_in_files()) else {
                return Ok(Planned::Nothing);
            };
            Ok(match seg.with_index(loaded, |ix| ix.clone()) {
                Ok(index) => Planned::Ready(index),
                Err(load) => Planned::Load(load),
            })
        })
        .await?;
        // No await since the plan: the segment is the one the index was loaded for.
        if let Some(index) = index
            && let Some(seg) = self.state.borrow_mut().segments.get_mut(&base)
        {
            seg.index_to_memory(index);
        }
        Ok(())
    }
}

impl LogInner {
    /// Applies a cut in memory, then on disk: later segments deleted, the cut segment
    /// truncated and synced, its stale index files removed, the writer resumed.
    async fn apply_cut(&self, cut: &Cut) -> Result<()> {
        let (doomed, file, path) = {
            let mut st = self.state.borrow_mut();
            let doomed: Vec<Segment> = split_after(&mut st, cut.base);
            let Some(seg) = st.segments.get_mut(&cut.base) else {
                return Ok(());
            };
            if seg.index_in_files() {
                // Not brought back into memory (see `Log::index_to_memory`): no entries
                // is a correct sparse index, which the appends after the cut extend.
                seg.index_to_memory(super::index::SegmentIndex::default());
            }
            let since = cut.position
                - seg
                    .index
                    .last_offset_entry()
                    .map_or(0, |(_, p)| p.get())
                    .min(cut.position);
            let rel_end = relative(seg.base, cut.next_offset).unwrap_or(0);
            seg.index
                .truncate_at(super::FilePosition(cut.position as u32), rel_end);
            seg.restore(cut.position, cut.next_offset, since);
            seg.max_timestamp = (-1, Offset::NONE);
            seg.sealed = false;
            if cut.position == 0 {
                seg.roll_base_ms = None;
            }
            let (file, path) = (seg.file.clone(), seg.path("log"));
            // Nothing pending survives a cut: it lies past the written end, which is at
            // or past the cut. Written later, it would land past the bytes the segment
            // and its index describe. Its waiters see the cut and fail.
            st.pending.clear();
            st.cache.truncate(cut.next_offset);
            st.read_ahead.invalidate();
            st.log_end = cut.next_offset;
            // What was served past the cut is gone with it, unless a rollback just
            // fenced the epoch that served it (the fence keeps the mark until lifted).
            if st.fenced_epoch.is_none() {
                st.served_end = st.served_end.min(cut.next_offset);
            }
            st.written_next = cut.next_offset;
            st.synced_next = st.synced_next.min(cut.next_offset);
            st.note_cut(cut.next_offset);
            st.assert_positions();
            (doomed, file, path)
        };
        self.writer.set(None);
        for seg in doomed.iter().rev() {
            remove_segment_files(seg)?;
        }
        // The later segments' removal is durable before the cut segment's truncation: a
        // power loss must not keep the truncation and bring back the segments after it
        // (the cut segment would then read as sealed, with a gap before them).
        if !doomed.is_empty() {
            sync_dir(&self.dir)?;
        }
        if let Some(file) = file {
            file.truncate(cut.position)
                .await
                .map_err(|e| StorageError::io("truncate", &path, e))?;
            file.fdatasync()
                .await
                .map_err(|e| StorageError::io("fdatasync", &path, e))?;
            self.state.borrow_mut().counters.fdatasyncs += 1;
            crate::metrics::add(|m| &m.storage_fdatasyncs, 1);
        }
        self.note_synced_to(cut);
        self.remove_active_index_files()?;
        sync_dir(&self.dir)?;
        self.restore_max_timestamp(cut.base).await?;
        self.resume_writer().await
    }

    /// After a cut: everything below it is durable when the segments before the cut one
    /// are sealed (synced then) — the cut segment was just synced, or holds nothing on
    /// disk. Appends waiting for a sync of the bytes the cut kept are then done: an
    /// out-of-space error later in their I/O run (which syncs nothing else) must not
    /// refuse bytes the log keeps and a consumer will read.
    fn note_synced_to(&self, cut: &Cut) {
        let mut st = self.state.borrow_mut();
        let earlier_sealed = st.segments.range(..cut.base).all(|(_, s)| s.sealed);
        let on_disk = st
            .segments
            .get(&cut.base)
            .is_some_and(|s| s.file.is_some() || cut.position == 0);
        if earlier_sealed && on_disk && st.written_next >= cut.next_offset {
            st.synced_next = st.synced_next.max(cut.next_offset);
            st.assert_positions();
        }
    }

    /// Out of space (finding 6): forgets every append not yet written — their callers get
    /// the error, nothing of them was acknowledged — so the log ends at what is on disk,
    /// cuts the file there (a failed write may have left part of its bytes), and refuses
    /// writes for [`NO_SPACE_RETRY_BACKOFF`]; the next append after it tries again, at the
    /// same offsets — unless reads for replicas were served some of the rolled-back
    /// offsets: then appends under the current leader epoch stay refused until a newer
    /// one (`State::fenced_epoch`). Nothing written is lost and nothing is written twice.
    /// Caller holds the I/O lock. An error here fails the log.
    ///
    /// [`NO_SPACE_RETRY_BACKOFF`]: super::log::NO_SPACE_RETRY_BACKOFF
    pub(super) async fn roll_back_unwritten(&self, cause: &StorageError) -> Result<()> {
        let (cut, dropped) = {
            let mut st = self.state.borrow_mut();
            let keep = st.written_next;
            if keep < st.log_start {
                // DeleteRecords moved the start past appends that are now rolled back:
                // the log would end below its start. Rare enough to fail loudly (a
                // reopen restarts the log at its start) rather than guess.
                return Err(StorageError::Failed {
                    path: self.dir.clone(),
                    reason: format!("out of space below the log start {}: {cause}", st.log_start),
                });
            }
            let dropped = keep.get().abs_diff(st.log_end.get());
            if st.served_end > keep {
                // A replica may hold some of what goes now: this epoch may not append
                // at those offsets again (see `State::fenced_epoch`).
                let epoch = st.append_epoch;
                st.fence_epoch(epoch);
                tracing::warn!(
                    dir = %self.dir.display(), %epoch, served_end = %st.served_end, log_end = %keep,
                    "out of disk space after serving unwritten appends to replicas: appends under this leader epoch are refused until a newer one"
                );
            }
            st.pending.clear();
            st.cache.truncate(keep);
            st.read_ahead.invalidate();
            st.log_end = keep;
            st.no_space_until = Some(std::time::Instant::now() + NO_SPACE_RETRY_BACKOFF);
            (rollback_cut(&st, keep), dropped)
        };
        tracing::warn!(
            dir = %self.dir.display(), log_end = %cut.next_offset, dropped_offsets = dropped,
            retry_ms = NO_SPACE_RETRY_BACKOFF.as_millis() as u64,
            "out of disk space: unwritten appends rolled back, writes refused until the retry: {cause}"
        );
        // The writer may stand past the segment's `written` (a write of several DMA
        // buffers failed midway): resume from what the log accounts for.
        self.writer.set(None);
        self.apply_cut(&cut).await
    }

    /// Recomputes a segment's newest timestamp by reading its batch headers (rare: only
    /// after truncation).
    async fn restore_max_timestamp(&self, base: Offset) -> Result<()> {
        let (file, path, end) = {
            let st = self.state.borrow();
            let Some(seg) = st.segments.get(&base) else {
                return Ok(());
            };
            let Some(file) = seg.file.clone() else {
                return Ok(());
            };
            (file, seg.path("log"), seg.written)
        };
        let mut window = FileWindow::new(file, &path, end);
        let mut max = (-1, Offset::NONE);
        let mut pos = 0;
        while pos < end {
            let head = window.get(pos, wire::batch::BATCH_HEADER_SIZE).await?;
            let Ok((h, size)) = check_stored_header(head, end - pos) else {
                break;
            };
            if h.max_timestamp() > max.0 {
                max = (h.max_timestamp(), h.last_offset());
            }
            pos += size as u64;
        }
        if let Some(seg) = self.state.borrow_mut().segments.get_mut(&base) {
            seg.max_timestamp = max;
        }
        Ok(())
    }

    fn remove_active_index_files(&self) -> Result<()> {
        let st = self.state.borrow();
        let Some(active) = st.active() else {
            return Ok(());
        };
        remove_files(active, &["index", "timeindex"])
    }
}

impl Log {
    /// Empties the log and restarts it at `offset` (Kafka's truncateFullyAndStartAt).
    async fn truncate_fully(&self, offset: Offset) -> Result<()> {
        let doomed: Vec<Segment> = {
            let mut st = self.state.borrow_mut();
            let doomed = std::mem::take(&mut st.segments).into_values().collect();
            st.segments.insert(offset, Segment::new(&self.dir, offset));
            st.pending.clear();
            st.cache.clear(offset);
            st.read_ahead.invalidate();
            st.log_start = offset;
            st.log_end = offset;
            st.served_end = offset;
            st.written_next = offset;
            st.synced_next = offset;
            // Nothing of the old log stays, whatever offset it restarts at.
            st.note_cut(Offset(0));
            st.assert_positions();
            doomed
        };
        self.writer.set(None);
        write_log_start(&self.dir, offset)?;
        let delay_ms = self.state.borrow().config.file_delete_delay_ms;
        for seg in &doomed {
            retire_segment_files(seg, delay_ms)?;
        }
        sync_dir(&self.dir)?;
        self.lower_cleaner_checkpoint(offset)
    }

    /// DeleteRecords: moves the log start offset up to `offset` (clamped to the LEO),
    /// persists it, and deletes sealed segments entirely below it. Returns the new start.
    pub async fn delete_records_before(&self, offset: Offset) -> Result<Offset> {
        let _permit = self.lock_io().await?;
        self.write_pending().await?;
        let new_start = {
            let st = self.state.borrow();
            st.check_writable(&self.dir)?;
            offset.min(st.log_end)
        };
        if new_start <= self.log_start_offset() {
            return Ok(self.log_start_offset());
        }
        self.advance_start(new_start, Durable::Now)?;
        Ok(new_start)
    }

    /// A follower's log start follows its leader's (moved there by DeleteRecords or
    /// retention), up to `offset` and never past the log end; returns the new start. Not
    /// synced at once, as retention's is not: a crash can bring back segments below it,
    /// which the next answer from the leader retires again.
    pub async fn follow_log_start(&self, offset: Offset) -> Result<Offset> {
        let _permit = self.lock_io().await?;
        let new_start = {
            let st = self.state.borrow();
            st.check_writable(&self.dir)?;
            offset.min(st.written_next)
        };
        if new_start <= self.log_start_offset() {
            return Ok(self.log_start_offset());
        }
        self.advance_start(new_start, Durable::Later)?;
        Ok(new_start)
    }

    /// Moves the log start offset up to `new_start` and retires the sealed segments below
    /// it. `Durable::Now` persists the new start before anything is deleted, with fsyncs
    /// on this thread (DeleteRecords: a client is told the records are gone).
    /// `Durable::Later` (retention) writes it after the segments are renamed and leaves
    /// the fsyncs to the blocking pool: a crash can at worst bring back segments retention
    /// deletes again, and a start file older than the first segment is raised to it at
    /// open. A shard fsyncs here while retained segments' discards hold the journal: tens
    /// of ms every request of the shard waited for.
    fn advance_start(&self, new_start: Offset, durable: Durable) -> Result<()> {
        if durable == Durable::Now {
            write_log_start(&self.dir, new_start)?;
        }
        let doomed: Vec<Segment> = {
            let mut st = self.state.borrow_mut();
            st.log_start = new_start;
            st.read_ahead.invalidate();
            // Nothing below the start is served again: memory for what is.
            st.cache.drop_below(new_start);
            let bases: Vec<Offset> = st
                .segments
                .values()
                .rev()
                .skip(1)
                .filter(|s| s.next_offset <= new_start)
                .map(|s| s.base)
                .collect();
            bases.iter().filter_map(|b| st.segments.remove(b)).collect()
        };
        let delay_ms = self.state.borrow().config.file_delete_delay_ms;
        for seg in &doomed {
            retire_segment_files(seg, delay_ms)?;
        }
        match durable {
            Durable::Now => sync_dir(&self.dir),
            // Its background fsync of the directory also covers the renames above.
            Durable::Later => write_log_start_synced_later(&self.dir, new_start),
        }
    }

    /// Applies `retention.ms` and `retention.bytes`: deletes whole segments, oldest first,
    /// each only if it ends at or below `below` (the partition's HW: as in Kafka, records
    /// not yet on every ISR member are never retention's to delete), and advances the log
    /// start offset. When the non-empty active segment is due too (a partition that
    /// stopped receiving records), the log first rolls an empty one at its end and then
    /// deletes them all, as Kafka's `deleteSegments` does: the log start becomes the log
    /// end, which does not move. Returns the number of segments deleted.
    pub async fn apply_retention(&self, now_ms: i64, below: Offset) -> Result<usize> {
        let _permit = self.lock_io().await?;
        self.write_pending().await?;
        let new_start = {
            let st = self.state.borrow();
            st.check_writable(&self.dir)?;
            retention_cut(&st, now_ms, below)
        };
        let Some((count, new_start)) = new_start else {
            return Ok(0);
        };
        if new_start >= self.log_end_offset() {
            self.roll_for_retention().await?;
        }
        self.advance_start(new_start.max(self.log_start_offset()), Durable::Later)?;
        Ok(count)
    }

    /// Before retention deletes the active segment: starts an empty active segment at the
    /// log end, then seals the old one (trim, fdatasync, index files, as a roll on append
    /// does) and creates the new one's file, its name durable, before anything is retired:
    /// a restart then finds the log end there even if the new log start file did not reach
    /// the disk (else the log would reopen at its old start and hand out offsets again).
    /// Caller holds the I/O lock.
    ///
    /// The roll comes first, in the same turn as the caller's decision and before any
    /// await: appends do not wait for the I/O lock, so one arriving while the old segment
    /// is sealed goes to the new segment (its write waits for the lock). Rolled after the
    /// seal, such an append landed in the segment being retired, past what the writer had
    /// written, and the seal's synced position overtook the written one (found by review).
    async fn roll_for_retention(&self) -> Result<()> {
        let (base, path) = {
            let mut st = self.state.borrow_mut();
            st.roll(&self.dir);
            // Everything below the log end goes: nothing to serve from memory.
            let written = st.written_next;
            st.cache.clear(written);
            st.read_ahead.invalidate();
            match st.active() {
                Some(a) => (a.base, a.path("log")),
                None => return Ok(()),
            }
        };
        if let Some(writer) = self.writer.take() {
            let result = self.seal(writer).await;
            self.check_io(result)?;
        }
        let created = create_log_file(&self.disk, &path).await;
        let file = self.check_io(created)?;
        let dir = self.dir.clone();
        let synced = glommio::executor()
            .spawn_blocking(move || sync_dir(&dir))
            .await;
        self.check_io(synced)?;
        // By base, not "the last segment": appends meanwhile may have rolled again.
        if let Some(segment) = self.state.borrow_mut().segments.get_mut(&base) {
            segment.file = Some(file);
        }
        let resumed = self.resume_writer().await;
        self.check_io(resumed)
    }

    /// Clean shutdown: writes and syncs everything, trims the active segment to its last
    /// batch, writes its indexes and the clean-shutdown marker (so the next open skips the
    /// rescan). The log refuses further calls.
    pub async fn close(&self) -> Result<()> {
        let _permit = self.lock_io().await?;
        self.state.borrow().check_writable(&self.dir)?;
        // From here: an append while the active segment is sealed would take offsets
        // past the end the clean-shutdown marker and the index files record.
        let _refused = AppendsRefused::new(&self.state, Refusal::Closing);
        self.write_pending().await?;
        if let Some(writer) = self.writer.take() {
            let result = writer.finish().await;
            self.check_io(result)?;
        }
        let log_end = self.ensure_active_file().await?;
        {
            let mut st = self.state.borrow_mut();
            if let Some(active) = st.segments.values_mut().next_back() {
                active.seal_time_index();
                write_index_files(active, &self.disk)?;
            }
            st.closed = true;
            st.read_ahead.invalidate();
        }
        write_atomic(
            &self.dir.join(CLEAN_SHUTDOWN_FILE),
            format!("{}\n", log_end.get()).as_bytes(),
        )
    }

    /// An empty active segment has no file yet; create it so its base offset survives.
    async fn ensure_active_file(&self) -> Result<Offset> {
        let (missing, log_end) = {
            let st = self.state.borrow();
            let missing = st
                .active()
                .filter(|a| a.file.is_none())
                .map(|a| a.path("log"));
            (missing, st.log_end)
        };
        if let Some(path) = missing {
            let file = create_log_file(&self.disk, &path).await?;
            let _ = file.fdatasync().await;
            sync_dir(&self.dir)?;
        }
        Ok(log_end)
    }

    /// Removes the partition directory and everything in it (partition deleted or moved):
    /// renamed aside at once, its files removed in steps off the shard's thread
    /// ([`super::reclaim::retire_dir`]). A log already closed or deleted leaves the
    /// directory alone: it may be another log's by now (reopened, or a new topic's).
    pub async fn delete(&self) -> Result<()> {
        let _permit = self.lock_io().await?;
        {
            let mut st = self.state.borrow_mut();
            if st.closed {
                return Ok(());
            }
            st.closed = true;
            st.pending.clear();
            st.segments.clear();
            let written = st.written_next;
            st.cache.clear(written);
            st.read_ahead.invalidate();
        }
        self.writer.set(None);
        super::reclaim::retire_dir(&self.dir)
            .map_err(|e| StorageError::io("retire dir", &self.dir, e))
    }
}

/// Where an out-of-space rollback cuts: at the written end of the segment the next write
/// continues. A segment rolled at `keep` and never written is dropped again unless the
/// one before it was sealed completely (else that one would stay unsealed, not active).
fn rollback_cut(st: &State, keep: Offset) -> Cut {
    let mut candidates = st.segments.range(..=keep).rev();
    let chosen = match (candidates.next(), candidates.next()) {
        (Some((_, last)), Some((_, prev)))
            if last.base == keep && last.written == 0 && !prev.sealed =>
        {
            prev
        }
        (Some((_, last)), _) => last,
        (None, _) => {
            return Cut {
                base: keep,
                position: 0,
                next_offset: keep,
                file: None,
            };
        }
    };
    Cut {
        base: chosen.base,
        position: chosen.written,
        next_offset: keep,
        file: chosen.file.clone(),
    }
}

/// Removes and returns the segments after `base`.
fn split_after(st: &mut State, base: Offset) -> Vec<Segment> {
    let later = st.segments.split_off(&base.add(1));
    later.into_values().collect()
}

/// How many of the oldest segments retention deletes, and the offset after them: none
/// past `below`. The active segment counts too, when not empty (the caller rolls first).
fn retention_cut(st: &State, now_ms: i64, below: Offset) -> Option<(usize, Offset)> {
    let cfg = &st.config;
    if !cfg.cleanup_policy.delete {
        // `cleanup.policy=compact` alone: the cleaner, not retention, bounds the log.
        return None;
    }
    let mut total: i64 = st.segments.values().map(|s| s.size as i64).sum();
    let mut count = 0;
    let mut new_start = None;
    let active_base = st.active().map(|a| a.base);
    for seg in st.segments.values() {
        let active = Some(seg.base) == active_base;
        if active && seg.is_empty() {
            // Nothing to delete: an empty active segment stays (Kafka's
            // `isLastSegmentAndEmpty`).
            break;
        }
        // A sealed segment the cleaner emptied has no timestamp: it holds nothing to keep,
        // and must not stop time retention of the segments after it.
        let emptied = !active && seg.size == 0 && cfg.retention_ms >= 0;
        let by_time = emptied
            || (cfg.retention_ms >= 0
                && retention_timestamp(seg)
                    .is_some_and(|ts| now_ms.saturating_sub(ts) > cfg.retention_ms));
        let by_size = cfg.retention_bytes >= 0 && total - seg.size as i64 >= cfg.retention_bytes;
        if !(by_time || by_size) || seg.next_offset > below {
            break;
        }
        total -= seg.size as i64;
        count += 1;
        new_start = Some(seg.next_offset);
    }
    new_start.map(|s| (count, s))
}

/// A segment's age for time retention: its newest batch timestamp, else — no batch
/// carries one (maxTimestamp -1) — its file's last modification, as Kafka's
/// `largestTimestamp` falls back to it. Before, such a segment stopped time retention for
/// itself and every later one. `None` if neither is known.
fn retention_timestamp(seg: &Segment) -> Option<i64> {
    if seg.max_timestamp.0 >= 0 {
        return Some(seg.max_timestamp.0);
    }
    let modified = fs::metadata(seg.path("log")).and_then(|m| m.modified());
    let since_epoch = modified.ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since_epoch.as_millis()).ok()
}

/// When [`Log::advance_start`] makes the new log start offset durable.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durable {
    Now,
    Later,
}
