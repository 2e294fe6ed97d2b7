//! Reads: by offset (tail cache, else offset index then a scan in the segment file) and
//! by timestamp (time index, then a scan of batch headers). A sealed segment's index is
//! loaded from its files into the shard's index cache when a read needs it and it is not
//! there (`index_cache.rs`).

use std::path::PathBuf;
use std::rc::Rc;

use bytes::Bytes;
use wire::Offset;
use wire::batch::{BatchHeader, validate_batch};

use super::error::{Result, StorageError};
use super::file::SegmentFile;
use super::index::relative;
use super::index_cache::{IndexLoad, LoadedIndex};
use super::log::{Log, ReadResult, State};
use super::recovery::{FileWindow, find_valid_batch};
use super::segment::{BatchMeta, check_stored_header};

/// Smallest window read from disk for a fetch: covers the index interval plus a batch.
const READ_WINDOW_MIN: usize = 64 << 10;
/// Largest window read at once for a fetch.
const READ_WINDOW_MAX: usize = 8 << 20;

/// Where in which file a disk read starts.
struct DiskPlan {
    file: Rc<SegmentFile>,
    path: PathBuf,
    base: Offset,
    /// The segment's next offset: a stored batch reaching it is damage.
    next_offset: Offset,
    from: u64,
    end: u64,
}

/// See [`Log::read`], [`Log::read_within`] and [`Log::read_for_replica`] (`replica`:
/// batches handed out past the written end are noted in `served_end`).
pub async fn read(
    log: &Log,
    start: Offset,
    max_bytes: usize,
    hard_max_bytes: usize,
    upper: Offset,
    replica: bool,
) -> Result<ReadResult> {
    log.check_readable()?;
    let mut result = {
        let mut st = log.state.borrow_mut();
        let result = ReadResult {
            batches: Vec::new(),
            next_offset: start,
            log_start_offset: st.log_start,
            log_end_offset: st.log_end,
        };
        if start < st.log_start || start > st.log_end {
            return Err(StorageError::OffsetOutOfRange {
                requested: start,
                log_start: st.log_start,
                log_end: st.log_end,
            });
        }
        if start == st.log_end || start >= upper {
            return Ok(result);
        }
        if st.cache.covers(start) {
            st.counters.cache_reads += 1;
            let batches = st.cache.read(start, max_bytes, hard_max_bytes, upper);
            let result = finish(result, batches);
            // Noted in the same borrow that hands the batches out, so a rollback cannot
            // fall between the two. (Disk reads never reach past the written end.)
            if replica && result.next_offset > st.written_next {
                st.served_end = st.served_end.max(result.next_offset);
            }
            return Ok(result);
        }
        st.counters.disk_reads += 1;
        result
    };
    let mut after: Option<Offset> = None;
    let segments = log.segment_count();
    let window_bytes = max_bytes.clamp(READ_WINDOW_MIN, READ_WINDOW_MAX);
    for _ in 0..segments {
        let planned = plan_loading_index(log, |st, loaded| {
            Ok(match plan_disk_read(st, start, after, loaded)? {
                Planned::Ready(plan) => Planned::Ready((plan, st.read_ahead.generation())),
                Planned::Nothing => Planned::Nothing,
                Planned::Load(load) => Planned::Load(load),
            })
        })
        .await?;
        let Some((plan, generation)) = planned else {
            break;
        };
        let seed = read_ahead_for(log, &plan).await;
        let hit = seed.is_some();
        let limits = (max_bytes, hard_max_bytes);
        let read = read_file(&plan, seed, window_bytes, start, limits, upper).await?;
        log.state.borrow_mut().counters.window_reads += read.windows;
        if !read.batches.is_empty() {
            result = finish(result, read.batches);
            let end = (result.next_offset, plan.base, read.end_pos);
            read_ahead_next(log, start, end, (window_bytes, generation), hit);
            break;
        }
        if read.held_back {
            // The batch holding `start` is here but may not be served now (too big for
            // what is left of the response, or not below `upper`): an empty answer, not
            // the next segment's batches, which would skip the offsets in between.
            break;
        }
        after = Some(plan.base);
    }
    Ok(result)
}

/// The window read ahead where `plan` starts, if there is one still valid: its start in
/// the file and its bytes. A read-ahead that failed is forgotten (the read itself then
/// reads, and reports its own error).
async fn read_ahead_for(log: &Log, plan: &DiskPlan) -> Option<(u64, Bytes)> {
    let window = log
        .state
        .borrow_mut()
        .read_ahead
        .take(&plan.file, plan.base, plan.from)?;
    let (pos, generation) = (window.pos, window.generation);
    let bytes = window.bytes().await.ok()?;
    let mut st = log.state.borrow_mut();
    // The log changed while the window was read (truncation, a cleaner swap ...): its
    // bytes may be of the old file's layout.
    if st.read_ahead.generation() != generation {
        return None;
    }
    st.counters.read_ahead_hits += 1;
    Some((pos, bytes))
}

/// After a disk read from `start` that ended at `next` (byte `end_pos` of the segment
/// based at `segment`), planned under read-ahead `generation`: if it continued the previous disk read (or was served from a
/// read-ahead), starts reading the window at `next` (at most `log.read.ahead.bytes` and
/// the window this read used), unless the tail cache holds it.
fn read_ahead_next(
    log: &Log,
    start: Offset,
    (next, segment, end_pos): (Offset, Offset, u64),
    (window_bytes, generation): (usize, u64),
    hit: bool,
) {
    let mut st = log.state.borrow_mut();
    // The log changed while this read waited on the disk (a cleaner swap, a truncation):
    // its byte position is of a file that may no longer be the segment's, and the next
    // read must not resume there.
    if st.read_ahead.generation() != generation {
        return;
    }
    let sequential = hit || st.read_ahead.is_sequential(start);
    st.read_ahead.note_end(next, segment, end_pos);
    let limit = st.config.read_ahead_bytes.min(window_bytes as u64);
    if !sequential || limit == 0 || next >= st.log_end || st.cache.covers(next) {
        return;
    }
    // Its index was just at hand for the read that ended here; if it is not now (the
    // shard's index cache is small), no read ahead rather than a load.
    let Ok(Planned::Ready(plan)) = plan_disk_read(&st, next, None, None) else {
        return;
    };
    let len = limit.min(plan.end.saturating_sub(plan.from));
    if st.read_ahead.start(plan.file, plan.base, plan.from, len) {
        st.counters.read_ahead_reads += 1;
    }
}

fn finish(mut result: ReadResult, batches: Vec<Bytes>) -> ReadResult {
    if let Some(last) = batches.last()
        && let Ok(h) = wire::batch::read_header(last)
    {
        result.next_offset = h.next_offset();
    }
    result.batches = batches;
    result
}

/// What planning a read found.
pub(super) enum Planned<T> {
    /// Where to read.
    Ready(T),
    /// Nothing to read.
    Nothing,
    /// The segment's index is only in its files: load it, then plan again.
    Load(IndexLoad),
}

/// Index loads one plan may await before it settles for no index entries: each load
/// happens only if the segment it was for was replaced meanwhile (a cleaner swap, a
/// truncation), so more than one is rare.
const PLAN_INDEX_LOADS_MAX: usize = 3;

/// Runs `plan` on the log's state, loading the sealed segment index it asks for and
/// planning again with it. If the log keeps changing under the loads, the last plan gets
/// an empty index for its segment, which is always correct: the segment is scanned from
/// its first byte.
pub(super) async fn plan_loading_index<T>(
    log: &Log,
    mut plan: impl FnMut(&State, Option<&LoadedIndex>) -> Result<Planned<T>>,
) -> Result<Option<T>> {
    let mut loaded: Option<LoadedIndex> = None;
    for _ in 0..PLAN_INDEX_LOADS_MAX {
        let load = match plan(&log.state.borrow(), loaded.as_ref())? {
            Planned::Ready(t) => return Ok(Some(t)),
            Planned::Nothing => return Ok(None),
            Planned::Load(load) => load,
        };
        loaded = Some(load.load().await);
    }
    let st = log.state.borrow();
    let load = match plan(&st, loaded.as_ref())? {
        Planned::Ready(t) => return Ok(Some(t)),
        Planned::Nothing => return Ok(None),
        Planned::Load(load) => load,
    };
    let empty = LoadedIndex {
        id: load.id,
        index: Rc::default(),
    };
    Ok(match plan(&st, Some(&empty))? {
        Planned::Ready(t) => Some(t),
        Planned::Nothing | Planned::Load(_) => None,
    })
}

/// The segment holding `start` (or, with `after`, the segment after that one). `loaded`:
/// a sealed segment's index just loaded (see [`plan_loading_index`]).
fn plan_disk_read(
    st: &State,
    start: Offset,
    after: Option<Offset>,
    loaded: Option<&LoadedIndex>,
) -> Result<Planned<DiskPlan>> {
    let seg = match after {
        None => st.segments.range(..=start).next_back().map(|(_, s)| s),
        Some(b) => st.segments.range(b.add(1)..).next().map(|(_, s)| s),
    };
    let Some(seg) = seg else {
        return Ok(Planned::Nothing);
    };
    let Some(file) = seg.file.clone() else {
        return Ok(Planned::Nothing);
    };
    let from = match relative(seg.base, start) {
        Some(rel) if after.is_none() => {
            let indexed = match seg.with_index(loaded, |ix| ix.position_for(rel).get()) {
                Ok(position) => position,
                Err(load) => return Ok(Planned::Load(load)),
            };
            // Where the previous read ended, if `start` is there: the batch itself, not
            // the one before it (where the index points). Never before the index's answer
            // nor past the written end, so a stale position could only cost a scan.
            match st.read_ahead.resume_pos(start, seg.base) {
                Some(pos) if pos >= indexed && pos <= seg.written => pos,
                _ => indexed,
            }
        }
        _ => 0,
    };
    Ok(Planned::Ready(DiskPlan {
        file,
        path: seg.path("log"),
        base: seg.base,
        next_offset: seg.next_offset,
        from,
        end: seg.written,
    }))
}

/// Whole batches from one segment file: skips those before `start`, stops at the byte
/// limit (after the first, see [`batch_fits`]) or at the first batch reaching `upper`.
///
/// Every batch served is checked (framing, offsets, CRC-32C) before it leaves the node, so
/// a damaged batch on disk is never handed to a client as data. Damage ends the read with
/// the batches before it (the next fetch, starting at the damaged batch, gets the error);
/// damage before `start` is stepped over to the next valid batch, so the records after it
/// stay readable once `start` is past it (DeleteRecords is the operator's way past it).
///
/// The window is read shared (see `shared_read.rs`): the batches returned are slices of
/// the buffer the disk read filled, uncopied. `seed` is a window read ahead: where it
/// starts in the file, and its bytes. See [`FileRead`] for what else it tells.
async fn read_file(
    plan: &DiskPlan,
    seed: Option<(u64, Bytes)>,
    window_bytes: usize,
    start: Offset,
    (max_bytes, hard_max_bytes): (usize, usize),
    upper: Offset,
) -> Result<FileRead> {
    let mut window =
        FileWindow::shared(plan.file.clone(), &plan.path, plan.end, window_bytes, seed);
    let mut out = Vec::new();
    let mut total = 0usize;
    let mut pos = plan.from;
    // Offsets only grow inside a segment: a batch below this is damage (its base offset
    // is outside the CRC).
    let mut next_min = plan.base;
    let mut served_end = plan.from;
    let mut held_back = false;
    while pos < plan.end {
        if !out.is_empty() && total >= max_bytes {
            // Full: no later batch fits, so do not read its header (which may lie just
            // past the window, and cost a whole window's read).
            break;
        }
        let (meta, size) = match framed(&mut window, plan, pos, next_min).await? {
            Ok(found) => found,
            Err(damage) if out.is_empty() => {
                let (at, meta) =
                    step_over(&mut window, plan, (pos, damage), start, next_min).await?;
                pos = at;
                (meta, meta.size as usize)
            }
            Err(damage) => {
                tracing::debug!(segment = %plan.path.display(), position = pos, %damage, "read stops before a damaged batch");
                break;
            }
        };
        if meta.last_offset >= start {
            if meta.last_offset >= upper
                || !batch_fits(out.is_empty(), total, size, max_bytes, hard_max_bytes)
            {
                held_back = true;
                break;
            }
            let bytes = window.get_bytes(pos, size).await?;
            if let Err(e) = validate_batch(&bytes) {
                if out.is_empty() {
                    return Err(corrupt(
                        plan,
                        pos,
                        format!("stored batch fails its check: {e}"),
                    ));
                }
                tracing::debug!(segment = %plan.path.display(), position = pos, "read stops before a batch that fails its CRC");
                break;
            }
            out.push(bytes);
            total += size;
            served_end = pos + size as u64;
        }
        next_min = meta.last_offset.add(1);
        pos += size as u64;
        // A large cold read is mostly checking CRCs: let the shard's other tasks
        // (produces on other connections) run when this one has used its time slice.
        glommio::yield_if_needed().await;
    }
    Ok(FileRead {
        batches: out,
        end_pos: served_end,
        windows: window.reads(),
        held_back,
    })
}

/// What [`read_file`] read from one segment.
struct FileRead {
    batches: Vec<Bytes>,
    /// The byte position after the last batch returned: where the next read of this file
    /// continues.
    end_pos: u64,
    /// How many windows it read from the disk.
    windows: u64,
    /// It stopped at a batch at or after `start` that could not be served (the byte
    /// limits, or `upper`), rather than at the segment's end.
    held_back: bool,
}

/// Whether a batch of `size` bytes joins a read that holds `total` bytes so far: the
/// first batch always does up to `hard_max_bytes` (whole, even past `max_bytes`, as Kafka
/// does), later ones only within `max_bytes`; nothing ever goes past `hard_max_bytes`.
pub(super) fn batch_fits(
    first: bool,
    total: usize,
    size: usize,
    max_bytes: usize,
    hard_max_bytes: usize,
) -> bool {
    let after = total.saturating_add(size);
    after <= hard_max_bytes && (first || after <= max_bytes)
}

/// The header of the batch at `pos`, checked for framing and for offsets that grow
/// (`>= next_min`). The inner error says why the bytes are not the next batch.
async fn framed(
    window: &mut FileWindow,
    plan: &DiskPlan,
    pos: u64,
    next_min: Offset,
) -> Result<Result<(BatchMeta, usize), String>> {
    let head = window.get(pos, wire::batch::BATCH_HEADER_SIZE).await?;
    Ok(match check_stored_header(head, plan.end - pos) {
        Ok((h, _)) if h.base_offset() < next_min => Err(format!(
            "batch base offset {} below the expected {next_min}",
            h.base_offset()
        )),
        Ok((h, _)) if h.last_offset() >= plan.next_offset => Err(format!(
            "batch last offset {} past the segment's end {}",
            h.last_offset(),
            plan.next_offset
        )),
        Ok((h, size)) => Ok((BatchMeta::of(h), size)),
        Err(reason) => Err(reason.to_owned()),
    })
}

/// Damage at `damage.0` was met before any batch to serve: finds the next valid batch
/// after it. If `start` lies in the damaged bytes (no valid batch follows, or the next one
/// begins after `start`), the read fails with [`StorageError::Corrupt`] naming the file
/// and byte position of the damage.
async fn step_over(
    window: &mut FileWindow,
    plan: &DiskPlan,
    (pos, reason): (u64, String),
    start: Offset,
    next_min: Offset,
) -> Result<(u64, BatchMeta)> {
    let Some((at, meta)) = find_valid_batch(window, pos + 1, next_min).await? else {
        return Err(corrupt(
            plan,
            pos,
            format!("{reason}; no valid batch after it"),
        ));
    };
    if meta.base_offset > start {
        return Err(corrupt(
            plan,
            pos,
            format!(
                "{reason}; offset {start} is in the damaged bytes (next valid batch: offset {} at byte {at})",
                meta.base_offset
            ),
        ));
    }
    tracing::debug!(segment = %plan.path.display(), position = pos, resumed = at, "read stepped over damaged bytes before its start offset");
    Ok((at, meta))
}

fn corrupt(plan: &DiskPlan, position: u64, reason: String) -> StorageError {
    StorageError::Corrupt {
        path: plan.path.clone(),
        position,
        reason,
    }
}

/// See [`Log::read_by_time`]. Batches wholly below the log start offset (still on disk
/// after DeleteRecords) are skipped; the returned offset is at least the log start.
pub async fn read_by_time(log: &Log, timestamp: i64) -> Result<Option<(Offset, i64)>> {
    log.check_readable()?;
    let log_start = log.log_start_offset();
    let mut after: Option<Offset> = None;
    for _ in 0..log.segment_count() {
        let planned = plan_loading_index(log, |st, loaded| {
            Ok(plan_time_scan(st, timestamp, log_start, after, loaded))
        })
        .await?;
        let Some(plan) = planned else {
            break;
        };
        if let Some((base, ts)) = scan_time(&plan, timestamp, log_start).await? {
            return Ok(Some((base.max(log_start), ts)));
        }
        after = Some(plan.base);
    }
    // Not on disk yet: the batch is still pending its write, so it is in the cache.
    let cached = log.state.borrow().cache.find_time(timestamp, log_start);
    Ok(cached.map(|(base, ts)| (base.max(log_start), ts)))
}

/// The next segment (after `after`) that may hold a batch at or after `log_start` with
/// max timestamp `>= timestamp`, and where in it to start scanning (`loaded`: see
/// [`plan_disk_read`]).
fn plan_time_scan(
    st: &State,
    timestamp: i64,
    log_start: Offset,
    after: Option<Offset>,
    loaded: Option<&LoadedIndex>,
) -> Planned<DiskPlan> {
    let from = after.map_or(Offset(i64::MIN), |b| b.add(1));
    let Some(seg) = st
        .segments
        .range(from..)
        .map(|(_, s)| s)
        .find(|s| s.max_timestamp.0 >= timestamp && s.next_offset > log_start)
    else {
        return Planned::Nothing;
    };
    let from = seg.with_index(loaded, |ix| {
        ix.position_for(ix.relative_offset_for_time(timestamp))
            .get()
    });
    let from = match from {
        Ok(from) => from,
        Err(load) => return Planned::Load(load),
    };
    let Some(file) = seg.file.clone() else {
        return Planned::Nothing;
    };
    Planned::Ready(DiskPlan {
        file,
        path: seg.path("log"),
        base: seg.base,
        next_offset: seg.next_offset,
        from,
        end: seg.written,
    })
}

/// The first batch in the file, from `plan.from`, ending at or after `log_start`, with
/// max timestamp `>= timestamp`.
async fn scan_time(
    plan: &DiskPlan,
    timestamp: i64,
    log_start: Offset,
) -> Result<Option<(Offset, i64)>> {
    let mut window =
        FileWindow::with_window(plan.file.clone(), &plan.path, plan.end, READ_WINDOW_MIN);
    let mut pos = plan.from;
    while pos < plan.end {
        let (header, size) = stored_header(&mut window, plan, pos).await?;
        if header.max_timestamp() >= timestamp && header.last_offset() >= log_start {
            return Ok(Some((header.base_offset(), header.max_timestamp())));
        }
        pos += size as u64;
    }
    Ok(None)
}

/// The header of the batch at `pos` in `plan`'s file, checked for framing: bytes that do
/// not frame a batch there mean the file is corrupt.
async fn stored_header<'w>(
    window: &'w mut FileWindow,
    plan: &DiskPlan,
    pos: u64,
) -> Result<(&'w BatchHeader, usize)> {
    let head = window.get(pos, wire::batch::BATCH_HEADER_SIZE).await?;
    check_stored_header(head, plan.end - pos).map_err(|reason| StorageError::Corrupt {
        path: plan.path.clone(),
        position: pos,
        reason: reason.to_owned(),
    })
}
