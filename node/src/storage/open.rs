//! Opening a log: find the segments, check or rescan them (see `recovery`), repair a torn
//! tail, restore the log start offset, and set up the writer of the active segment.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use wire::{LeaderEpoch, Offset};

use super::atomic::{sync_dir, write_atomic, write_atomic_synced_later};
use super::cache::TailCache;
use super::config::LogConfig;
use super::error::{Result, StorageError};
use super::file::{Disk, FaultPoint};
use super::index::SegmentIndex;
use super::log::{CLEAN_SHUTDOWN_FILE, LOG_START_FILE, Log, LogCounters, LogInner, State};
use super::recovery::{FileWindow, Scan, Tail, scan, scan_past_damage};
use super::segment::Segment;
use super::writer::{SegmentWriter, open_log_file};

/// Opens the log in `dir`; see [`Log::open`].
pub async fn open(dir: PathBuf, config: LogConfig, disk: Disk) -> Result<Log> {
    fs::create_dir_all(&dir).map_err(|e| StorageError::io("create dir", &dir, e))?;
    let clean = dir.join(CLEAN_SHUTDOWN_FILE).exists();
    let mut log_start = read_log_start(&dir)?.unwrap_or(Offset(0));
    super::cleaner::recover_leftovers(&disk, &dir).await?;
    remove_retired(&dir)?;
    let bases = list_segments(&dir)?;
    let mut segments = BTreeMap::new();
    for (i, &base) in bases.iter().enumerate() {
        let next_base = bases.get(i + 1).copied();
        let mut seg = load_segment(&disk, &dir, base, next_base, clean, &config).await?;
        if let Some(next_base) = next_base {
            // A compacted segment may have lost its last batches: it still ends where the
            // next one starts, so the segments stay contiguous and reads there go on.
            seg.next_offset = seg.next_offset.max(next_base);
        }
        segments.insert(base, seg);
    }
    drop_segments_below_start(&dir, &mut segments, log_start)?;
    drop_all_if_below_start(&dir, &mut segments, log_start)?;
    if segments.is_empty() {
        segments.insert(log_start, Segment::new(&dir, log_start));
    }
    if let Some(first) = segments.keys().next() {
        log_start = log_start.max(*first);
    }
    let log = build(dir, config, segments, log_start, disk);
    log.resume_writer().await?;
    if clean {
        let marker = log.dir.join(CLEAN_SHUTDOWN_FILE);
        fs::remove_file(&marker).map_err(|e| StorageError::io("remove", &marker, e))?;
        sync_dir(&log.dir)?;
    }
    Ok(log)
}

fn build(
    dir: PathBuf,
    config: LogConfig,
    segments: BTreeMap<Offset, Segment>,
    log_start: Offset,
    disk: Disk,
) -> Log {
    let log_end = segments
        .values()
        .next_back()
        .map_or(log_start, |s| s.next_offset);
    let cache = TailCache::new(config.tail_cache_bytes, log_end);
    let state = State {
        config,
        segments,
        log_start,
        log_end,
        cache,
        pending: VecDeque::new(),
        written_next: log_end,
        synced_next: log_end,
        unflushed_records: 0,
        last_flush_ms: 0,
        counters: LogCounters::default(),
        failed: None,
        no_space_until: None,
        served_end: log_end,
        append_epoch: LeaderEpoch::NONE,
        fenced_epoch: None,
        truncations: 0,
        recent_cuts: VecDeque::new(),
        closed: false,
        refusing_appends: None,
        cleaner: Default::default(),
        read_ahead: Default::default(),
    };
    Log {
        inner: std::rc::Rc::new(LogInner {
            dir,
            disk,
            state: RefCell::new(state),
            io_gate: Default::default(),
            writer: Cell::new(None),
        }),
    }
}

impl LogInner {
    /// Creates the writer that continues the active segment's file, if it has one.
    pub(super) async fn resume_writer(&self) -> Result<()> {
        let (file, written, path) = {
            let st = self.state.borrow();
            let Some(active) = st.active() else {
                return Ok(());
            };
            let Some(file) = active.file.clone() else {
                self.writer.set(None);
                return Ok(());
            };
            (file, active.written, active.path("log"))
        };
        let mut writer = SegmentWriter::resume(file, &path, written).await?;
        writer.set_preallocation(self.preallocation());
        self.writer.set(Some(writer));
        Ok(())
    }
}

/// Base offsets of the `.log` files in `dir`, ascending. Other files are not ours to judge.
fn list_segments(dir: &Path) -> Result<Vec<Offset>> {
    let entries = fs::read_dir(dir).map_err(|e| StorageError::io("read dir", dir, e))?;
    let mut bases = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("read dir", dir, e))?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".log")) else {
            continue;
        };
        if stem.len() == 20
            && stem.bytes().all(|b| b.is_ascii_digit())
            && let Ok(base) = stem.parse::<i64>()
        {
            bases.push(Offset(base));
        }
    }
    bases.sort();
    Ok(bases)
}

/// Opens one segment (`next_base`: the base of the segment after it; none for the active
/// one). Sealed segments, and the active one after a clean shutdown, are trusted after
/// their indexes load and the batches after the last index entry reach the end of the
/// file exactly; otherwise the segment is rescanned from the start. A sealed segment
/// with damage opens anyway (see [`load_damaged`]).
async fn load_segment(
    disk: &Disk,
    dir: &Path,
    base: Offset,
    next_base: Option<Offset>,
    clean: bool,
    config: &LogConfig,
) -> Result<Segment> {
    let active = next_base.is_none();
    let mut seg = Segment::new(dir, base);
    seg.sealed = !active;
    let path = seg.path("log");
    let file = open_log_file(disk, &path).await?;
    let size = file
        .file_size()
        .await
        .map_err(|e| StorageError::io("stat", &path, e))?;
    seg.file = Some(file.clone());
    let mut window = FileWindow::new(file, &path, size);
    let trusted = !active || clean;
    let checked = match trusted {
        true => quick_check(&mut seg, &mut window, config).await?,
        false => Checked::Failed,
    };
    if checked != Checked::Failed {
        if !active {
            seal_index(&mut seg, disk, checked == Checked::FromFiles);
        }
        return Ok(seg);
    }
    if let Some(next_base) = next_base {
        load_damaged(&mut seg, &mut window, next_base, config).await?;
        seal_index(&mut seg, disk, false);
        return Ok(seg);
    }
    let scan = scan(&mut window, 0, base).await?;
    apply_full_scan(&mut seg, &scan, config);
    repair_tail(&mut seg, &scan, active, &path).await?;
    Ok(seg)
}

/// What the quick check of a segment found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Checked {
    /// It does not check out: the caller rescans the whole segment.
    Failed,
    /// Its index is the one in its files.
    FromFiles,
    /// Its files held no entries; its index was rebuilt from a scan of the segment.
    Rebuilt,
}

/// Loads the index files and verifies the batches from the last index entry to the end
/// of the file.
async fn quick_check(
    seg: &mut Segment,
    window: &mut FileWindow,
    config: &LogConfig,
) -> Result<Checked> {
    let size = window.end();
    let (Ok(offsets), Ok(times)) = (fs::read(seg.path("index")), fs::read(seg.path("timeindex")))
    else {
        return Ok(Checked::Failed);
    };
    let Ok(index) = SegmentIndex::decode(&offsets, &times, size.max(1), i32::MAX as u64) else {
        tracing::warn!(segment = %seg.path("index").display(), "index files invalid; rebuilding");
        return Ok(Checked::Failed);
    };
    let Some((_, from)) = index.last_offset_entry() else {
        // No entries: the scan below covers the whole segment, so build the index too.
        let Some(scan) = not_corrupt(scan(window, 0, seg.base).await)? else {
            return Ok(Checked::Failed);
        };
        apply_full_scan(seg, &scan, config);
        return Ok(match scan.tail == Tail::Clean {
            true => Checked::Rebuilt,
            false => Checked::Failed,
        });
    };
    let Some(scan) = not_corrupt(scan(window, from.get(), seg.base).await)? else {
        return Ok(Checked::Failed);
    };
    if scan.tail != Tail::Clean || scan.batches.is_empty() {
        return Ok(Checked::Failed);
    }
    apply_indexed_scan(seg, &scan, index, from.get());
    seg.roll_base_ms = first_batch_timestamp(window).await?;
    Ok(Checked::FromFiles)
}

/// A sealed segment's index leaves memory once its files hold it: at once if it was read
/// from them, else (rebuilt by a scan) once they are written again. If they cannot be
/// written it stays in memory (logged): reads must not depend on files known to be stale.
fn seal_index(seg: &mut Segment, disk: &Disk, from_files: bool) {
    if !from_files && let Err(e) = write_index_files(seg, disk) {
        tracing::warn!(segment = %seg.path("index").display(), "rebuilt index files not written, index kept in memory: {e}");
        return;
    }
    seg.index_to_files(false);
}

/// A scan that found damage followed by a valid batch is `None` (the caller rescans);
/// I/O errors stay errors.
fn not_corrupt(scan: Result<Scan>) -> Result<Option<Scan>> {
    match scan {
        Ok(s) => Ok(Some(s)),
        Err(StorageError::Corrupt { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Rescans a sealed segment whose quick check failed, stepping over damage: the log
/// opens, every valid batch stays readable, and only a read that reaches a damaged range
/// fails (with its file and position). Each damaged range is logged. The segment keeps
/// its whole file size and ends at the next segment's base, so the offsets the damage
/// hides are not skipped silently: reading them is an error until DeleteRecords moves
/// the log start past them.
async fn load_damaged(
    seg: &mut Segment,
    window: &mut FileWindow,
    next_base: Offset,
    config: &LogConfig,
) -> Result<()> {
    let path = seg.path("log");
    let scan = scan_past_damage(window, seg.base).await?;
    for (position, bytes, reason) in &scan.damage {
        tracing::error!(
            segment = %path.display(), position, bytes, %reason,
            "damaged sealed segment: {} at byte {position}; reads reaching it fail (`weir log verify` lists all damage; DeleteRecords past it to skip it)",
            path.display()
        );
    }
    seg.index = SegmentIndex::default();
    seg.restore(0, seg.base, 0);
    let interval = config.index_interval_bytes;
    for (pos, meta) in &scan.batches {
        if *pos != seg.size {
            // The first batch after damage gets an index entry, so reads that start
            // past the damage begin here instead of stepping over it.
            let next = seg.next_offset;
            seg.restore(*pos, next, u64::from(interval) + 1);
        }
        seg.record_batch(meta, interval, meta.max_timestamp);
    }
    let next = seg.next_offset.max(next_base);
    seg.restore(window.end(), next, 0);
    seg.roll_base_ms = scan.batches.first().map(|(_, m)| m.max_timestamp);
    Ok(())
}

/// Rebuilds a segment's summary and index from a scan of all its batches.
fn apply_full_scan(seg: &mut Segment, scan: &Scan, config: &LogConfig) {
    seg.index = SegmentIndex::default();
    seg.restore(0, seg.base, 0);
    for (_, meta) in &scan.batches {
        seg.record_batch(meta, config.index_interval_bytes, meta.max_timestamp);
    }
    seg.written = seg.size;
    seg.roll_base_ms = scan.batches.first().map(|(_, m)| m.max_timestamp);
}

/// Restores a segment's summary from its loaded index plus a scan of the batches from
/// the last index entry (at `from`) to the end.
fn apply_indexed_scan(seg: &mut Segment, scan: &Scan, index: SegmentIndex, from: u64) {
    if let Some(&(ts, rel)) = index.time_entries().last() {
        seg.max_timestamp = (ts, seg.base.add(i64::from(rel)));
    }
    seg.index = index;
    let mut next = seg.base;
    for (_, meta) in &scan.batches {
        next = meta.last_offset.add(1);
        if meta.max_timestamp > seg.max_timestamp.0 {
            seg.max_timestamp = (meta.max_timestamp, meta.last_offset);
        }
    }
    seg.restore(scan.end, next, scan.end - from);
}

/// The max timestamp of the segment's first batch (Kafka rolls by time from it).
async fn first_batch_timestamp(window: &mut FileWindow) -> Result<Option<i64>> {
    let head = window.get(0, wire::batch::BATCH_HEADER_SIZE).await?;
    Ok(wire::batch::read_header(head)
        .ok()
        .map(|h| h.max_timestamp()))
}

/// Applies the decision table to a rescanned segment's tail.
async fn repair_tail(seg: &mut Segment, scan: &Scan, active: bool, path: &Path) -> Result<()> {
    let reason = match &scan.tail {
        Tail::Clean => return Ok(()),
        Tail::Padding { .. } if active => None,
        Tail::Torn { reason, .. } if active => Some(reason.clone()),
        Tail::Padding { .. } | Tail::Torn { .. } => {
            return Err(StorageError::Corrupt {
                path: path.to_path_buf(),
                position: scan.end,
                reason: format!(
                    "sealed segment does not end at its last batch: {:?}",
                    scan.tail
                ),
            });
        }
    };
    let Some(file) = seg.file.clone() else {
        return Ok(());
    };
    file.truncate(scan.end)
        .await
        .map_err(|e| StorageError::io("truncate", path, e))?;
    file.fdatasync()
        .await
        .map_err(|e| StorageError::io("fdatasync", path, e))?;
    if let Some(reason) = reason {
        tracing::warn!(
            segment = %path.display(), position = scan.end, dropped = ?scan.tail, %reason,
            "recovery truncated a torn tail"
        );
    } else {
        tracing::info!(segment = %path.display(), position = scan.end, "trimmed zero padding after the last batch");
    }
    Ok(())
}

/// Deletes segments wholly below the log start offset (an interrupted retention or
/// DeleteRecords), keeping at least the last segment.
fn drop_segments_below_start(
    dir: &Path,
    segments: &mut BTreeMap<Offset, Segment>,
    log_start: Offset,
) -> Result<()> {
    let doomed: Vec<Offset> = segments
        .values()
        .rev()
        .skip(1)
        .filter(|s| s.next_offset <= log_start)
        .map(|s| s.base)
        .collect();
    if doomed.is_empty() {
        // Nothing removed, nothing to make durable: an fsync here cost every open of
        // every partition one directory sync on the shard's thread.
        return Ok(());
    }
    for base in doomed {
        if let Some(seg) = segments.remove(&base) {
            remove_segment_files(&seg)?;
        }
    }
    sync_dir(dir)
}

/// Deletes every segment when the log ends below its start offset, so the log restarts
/// empty at the start (as Kafka does). That happens when DeleteRecords moved the start up
/// to written but unsynced records and a crash then lost them: appending below the start
/// would hand out offsets consumers were told are gone.
fn drop_all_if_below_start(
    dir: &Path,
    segments: &mut BTreeMap<Offset, Segment>,
    log_start: Offset,
) -> Result<()> {
    let below = segments
        .values()
        .next_back()
        .is_some_and(|s| s.next_offset < log_start);
    if !below {
        return Ok(());
    }
    tracing::warn!(dir = %dir.display(), %log_start, "log ends below its start offset; restarting it empty there");
    for seg in std::mem::take(segments).into_values() {
        remove_segment_files(&seg)?;
    }
    sync_dir(dir)
}

/// Removes a segment's `.log`, `.index` and `.timeindex` files (missing ones are fine).
pub fn remove_segment_files(seg: &Segment) -> Result<()> {
    remove_files(seg, &["log", "index", "timeindex", "txnindex"])
}

/// A retired segment file's suffix (Kafka's `.deleted`).
pub(super) const RETIRED_LOG_SUFFIX: &str = ".log.deleted";

/// Removes a segment the log no longer holds (retention, DeleteRecords) without making
/// the shard wait for the unlink: the small index files go at once, the `.log` is renamed
/// to `.log.deleted` and given back off the shard's thread after `delay_ms`
/// (`file.delete.delay.ms`: reads planned on it go on through its open fd), a step at a
/// time ([`super::reclaim`]). On this VM's ext4 the unlink of a 128 MiB segment takes 21 ms,
/// all of which every request of the shard waited for, and its discard, done whole,
/// stalled every append on the filesystem. A crash before the unlink leaves the
/// `.deleted` file; the next open removes it ([`remove_retired`]), and so does the reclaim
/// thread at the next start for a partition not opened again
/// ([`super::reclaim::retire_leftovers`]).
///
/// The retired name carries when it was retired (`<base>.<nanos>-<n>.log.deleted`): the
/// same base retired twice within the delay (a follower restarted at its leader's start)
/// must not replace the file the first is still waiting on, and the start-up sweep tells
/// an earlier process's leftovers from files this one still delays.
pub fn retire_segment_files(seg: &Segment, delay_ms: i64) -> Result<()> {
    remove_files(seg, &["index", "timeindex", "txnindex"])?;
    let log = seg.path("log");
    let retired = log.with_file_name(super::reclaim::retired_name(
        &format!("{:020}", seg.base.get()),
        RETIRED_LOG_SUFFIX,
    ));
    match fs::rename(&log, &retired) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StorageError::io("rename", &log, e)),
    }
    let delay = std::time::Duration::from_millis(u64::try_from(delay_ms).unwrap_or(0));
    super::reclaim::reclaim(retired, delay);
    Ok(())
}

/// Deletes the `.log.deleted` files a crash (or a shutdown) left before their unlink ran
/// (not this process's own: the reclaim thread holds those for their delay).
fn remove_retired(dir: &Path) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(|e| StorageError::io("read dir", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("read dir", dir, e))?;
        let name = entry.file_name();
        if name
            .to_str()
            .is_some_and(|n| n.ends_with(RETIRED_LOG_SUFFIX) && super::reclaim::is_leftover(n))
        {
            let path = entry.path();
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("remove", &path, e)),
            }
        }
    }
    Ok(())
}

/// Removes a segment's files with these extensions (missing ones are fine).
pub fn remove_files(seg: &Segment, extensions: &[&str]) -> Result<()> {
    for ext in extensions {
        let path = seg.path(ext);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StorageError::io("remove", &path, e)),
        }
    }
    Ok(())
}

/// Writes a segment's `.index` and `.timeindex` files. Small, written at seal and close
/// only, so blocking std I/O is acceptable. Not fsynced on purpose: indexes are rebuilt
/// from the `.log` when they do not check out, and after a crash a freshly written file is
/// empty or a prefix of its entries — still a valid sparse index (the quick check scans
/// from its last entry to the end of the segment). This saves four syncs per roll.
pub fn write_index_files(seg: &Segment, disk: &Disk) -> Result<()> {
    if seg.index_in_files() {
        // The files already hold the entries; `seg.index` is empty.
        return Ok(());
    }
    for (ext, bytes) in [
        ("index", seg.index.encode_offsets()),
        ("timeindex", seg.index.encode_times()),
    ] {
        let path = seg.path(ext);
        disk.probe(FaultPoint::IndexWrite)
            .and_then(|()| fs::write(&path, bytes))
            .map_err(|e| StorageError::io("write", &path, e))?;
    }
    Ok(())
}

/// Reads the persisted log start offset: `0\n<offset>\n`. An empty file counts as none
/// (the start is then the first segment's base): retention renames a new file in before
/// its data is synced (`write_log_start_synced_later`), and a power loss in between can
/// leave it empty. Anything else that does not parse is corruption.
fn read_log_start(dir: &Path) -> Result<Option<Offset>> {
    let path = dir.join(LOG_START_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StorageError::io("read", &path, e)),
    };
    if text.is_empty() {
        tracing::warn!(path = %path.display(), "log start offset file is empty (a power loss before its sync?): starting at the first segment");
        return Ok(None);
    }
    let mut lines = text.lines();
    let offset = match (lines.next(), lines.next().map(str::parse::<i64>)) {
        (Some("0"), Some(Ok(v))) if v >= 0 => v,
        _ => {
            return Err(StorageError::Corrupt {
                path,
                position: 0,
                reason: "log start offset file is not `0\\n<offset>\\n`".into(),
            });
        }
    };
    Ok(Some(Offset(offset)))
}

/// Persists the log start offset atomically.
pub fn write_log_start(dir: &Path, offset: Offset) -> Result<()> {
    write_atomic(&dir.join(LOG_START_FILE), &log_start_file(offset))
}

/// [`write_log_start`] with the file's and the directory's fsync in glommio's blocking
/// pool (call on a glommio executor).
pub fn write_log_start_synced_later(dir: &Path, offset: Offset) -> Result<()> {
    write_atomic_synced_later(&dir.join(LOG_START_FILE), &log_start_file(offset))
}

/// The log start file's contents, as [`read_log_start`] parses them.
fn log_start_file(offset: Offset) -> Vec<u8> {
    format!("0\n{}\n", offset.get()).into_bytes()
}
