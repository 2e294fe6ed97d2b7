//! [`Segment`]: one `.log` file named by its base offset, with the summary (next offset,
//! size, newest timestamp) the log needs without touching disk, and its indexes: in
//! memory while it is active, in its files (and the shard's index cache) once sealed.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use wire::Offset;
use wire::batch::{BATCH_HEADER_SIZE, BatchHeader, LOG_OVERHEAD, MAGIC_V2, read_header};

use super::file::SegmentFile;
use super::index::{SegmentIndex, relative};
use super::index_cache::{self, IndexLoad, LoadedIndex, SegmentId};
use super::{FilePosition, segment_file_name};

/// What the log keeps about one batch: enough to index it and to answer by-time queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchMeta {
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub max_timestamp: i64,
    pub size: u32,
    pub records: i32,
}

impl BatchMeta {
    /// The summary of a batch whose header was already checked by [`check_header`].
    pub fn of(header: &BatchHeader) -> BatchMeta {
        BatchMeta {
            base_offset: header.base_offset(),
            last_offset: header.last_offset(),
            max_timestamp: header.max_timestamp(),
            size: header.total_size() as u32,
            records: header.records_count(),
        }
    }
}

/// Checks the fields of a batch header that framing depends on (length, magic, offset
/// delta), without the CRC. Returns the batch's total size.
pub fn check_header(buf: &[u8], max_size: u64) -> Result<(&BatchHeader, usize), &'static str> {
    let header = read_header(buf).map_err(|_| "incomplete batch header")?;
    let length = header.batch_length.get();
    if length < (BATCH_HEADER_SIZE - LOG_OVERHEAD) as i32 {
        return Err("batchLength shorter than the batch header");
    }
    if header.magic != MAGIC_V2 {
        return Err("magic is not 2");
    }
    if header.last_offset_delta.get() < 0 {
        return Err("negative lastOffsetDelta");
    }
    let total = header.total_size();
    if total as u64 > max_size {
        return Err("batch longer than the bytes that can hold it");
    }
    Ok((header, total))
}

/// [`check_header`] for a batch read back from a segment file. The base offset is not
/// covered by the CRC, so a damaged one passes validation: it must be non-negative and
/// leave room for the offset after the batch's last record, or offset arithmetic on it
/// would overflow.
pub fn check_stored_header(
    buf: &[u8],
    max_size: u64,
) -> Result<(&BatchHeader, usize), &'static str> {
    let (header, total) = check_header(buf, max_size)?;
    let base = header.base_offset().get();
    let past_last = i64::from(header.last_offset_delta.get()) + 1;
    if base < 0 || base.checked_add(past_last).is_none() {
        return Err("base offset negative or too large for the batch's offsets");
    }
    Ok((header, total))
}

/// One segment of a partition log.
pub struct Segment {
    /// Offset the file is named by; every batch in it has offsets `>= base`.
    pub base: Offset,
    /// Offset after the last batch appended to this segment.
    pub next_offset: Offset,
    /// Bytes of batches appended (some may still be pending their DMA write).
    pub size: u64,
    /// Bytes known to be written to the file: reads from disk stay below this.
    pub written: u64,
    /// Sparse offset and time indexes, while they live in memory (the active segment, or
    /// a sealed one whose files could not be written); empty once they are in the files
    /// (`index_in_files`): use [`Segment::with_index`] to read them.
    pub index: SegmentIndex,
    /// The index entries are in the `.index` / `.timeindex` files, read into the shard's
    /// index cache on demand, and not in `index`.
    index_in_files: bool,
    /// This segment in the shard's index cache.
    id: SegmentId,
    /// Batch bytes appended since the last index entry.
    bytes_since_index: u64,
    /// Largest batch max timestamp and the last offset of its batch; -1 when empty.
    pub max_timestamp: (i64, Offset),
    /// When the first batch was appended (or its timestamp, after recovery): for
    /// `log.roll.ms`.
    pub roll_base_ms: Option<i64>,
    /// The open `.log` file; `None` until the first write creates it.
    pub file: Option<Rc<SegmentFile>>,
    /// Trimmed, fdatasynced and its index files written: no longer the active segment.
    pub sealed: bool,
    /// The partition directory.
    dir: PathBuf,
}

impl Segment {
    /// A new, empty segment starting at `base`; its file is created on first write.
    pub fn new(dir: &Path, base: Offset) -> Segment {
        Segment {
            base,
            next_offset: base,
            size: 0,
            written: 0,
            index: SegmentIndex::default(),
            index_in_files: false,
            id: SegmentId::next(),
            bytes_since_index: 0,
            max_timestamp: (-1, Offset::NONE),
            roll_base_ms: None,
            file: None,
            sealed: false,
            dir: dir.to_path_buf(),
        }
    }

    /// Path of this segment's file with `extension` (`log`, `index`, `timeindex`).
    pub fn path(&self, extension: &str) -> PathBuf {
        self.dir.join(segment_file_name(self.base, extension))
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Runs `f` on this segment's index if it is at hand: its own in memory, `loaded` if
    /// that was loaded for this very segment, or the shard's cached copy. Otherwise the
    /// load to await first (then call again with its result).
    pub fn with_index<T>(
        &self,
        loaded: Option<&LoadedIndex>,
        f: impl FnOnce(&SegmentIndex) -> T,
    ) -> std::result::Result<T, IndexLoad> {
        if !self.index_in_files {
            return Ok(f(&self.index));
        }
        if let Some(loaded) = loaded.filter(|l| l.id == self.id) {
            return Ok(f(&loaded.index));
        }
        match index_cache::get(self.id) {
            Some(index) => Ok(f(&index)),
            None => Err(self.index_load()),
        }
    }

    /// What loading this segment's index from its files needs.
    pub fn index_load(&self) -> IndexLoad {
        IndexLoad {
            id: self.id,
            offsets_path: self.path("index"),
            times_path: self.path("timeindex"),
            log_size: self.size,
            relative_end: self.next_offset.get().saturating_sub(self.base.get()) as u64,
        }
    }

    /// Whether the index entries are in the files only (see [`Segment::with_index`]).
    pub fn index_in_files(&self) -> bool {
        self.index_in_files
    }

    /// A sealed segment whose index files were just written (or checked) stops holding
    /// the entries itself; `warm` keeps them in the shard's index cache (a segment just
    /// rolled is the likeliest to be read next).
    pub fn index_to_files(&mut self, warm: bool) {
        debug_assert!(self.sealed, "only a sealed segment's index leaves memory");
        let index = std::mem::take(&mut self.index);
        self.index_in_files = true;
        index_cache::live(self.id);
        if warm {
            index_cache::insert(self.id, std::rc::Rc::new(index));
        }
    }

    /// The segment holds its index in memory again (`index`, loaded from its files): it is
    /// about to change (a truncation makes it active). It takes a new id: a load of its
    /// old files still under way can then neither be cached nor be taken for its index
    /// (see `with_index`), whatever files it is written with next.
    pub fn index_to_memory(&mut self, index: SegmentIndex) {
        if self.index_in_files {
            index_cache::forget(self.id);
        }
        self.id = SegmentId::next();
        self.index = index;
        self.index_in_files = false;
    }

    /// Records a batch appended at `position` (the segment's current size): indexes it
    /// once per `interval` bytes, as Kafka does, and updates the summary.
    pub fn record_batch(&mut self, meta: &BatchMeta, interval: u32, now_ms: i64) {
        debug_assert!(meta.base_offset >= self.next_offset);
        let position = FilePosition(self.size as u32);
        if meta.max_timestamp > self.max_timestamp.0 {
            self.max_timestamp = (meta.max_timestamp, meta.last_offset);
        }
        if self.bytes_since_index > u64::from(interval) {
            self.push_index(meta.last_offset, position);
            self.bytes_since_index = 0;
        }
        self.bytes_since_index += u64::from(meta.size);
        self.size += u64::from(meta.size);
        self.next_offset = meta.last_offset.add(1);
        self.roll_base_ms.get_or_insert(now_ms);
    }

    /// Indexes the batch at `position`: its offset always (as Kafka does, whatever the
    /// timestamps: reads find batches by it), the newest timestamp so far only once some
    /// batch carried one (`maxTimestamp` -1 is none).
    fn push_index(&mut self, last_offset: Offset, position: FilePosition) {
        let Some(rel) = relative(self.base, last_offset) else {
            return;
        };
        self.index.push_offset(rel, position);
        if let Some(rel_ts) = relative(self.base, self.max_timestamp.1)
            && self.max_timestamp.0 >= 0
        {
            self.index.push_time((self.max_timestamp.0, rel_ts));
        }
    }

    /// Whether appending `batches` batches of `blob_len` bytes could take the offset or
    /// the time index past `max_bytes` (`segment.index.bytes`): each batch may add an
    /// entry of each, at most one per `interval` bytes, and sealing adds a last time
    /// entry. The log rolls first, as Kafka rolls a segment whose index is full.
    pub fn index_would_overflow(
        &self,
        batches: usize,
        blob_len: u64,
        interval: u32,
        max_bytes: u64,
    ) -> bool {
        debug_assert!(
            !self.index_in_files,
            "the active segment's index is in memory"
        );
        let added = (batches as u64).min(1 + blob_len / (u64::from(interval) + 1));
        let offsets = (self.index.offset_entry_count() as u64 + added) * 8;
        let times = (self.index.time_entry_count() as u64 + added + 1) * 12;
        offsets > max_bytes || times > max_bytes
    }

    /// Adds the final time-index entry (the segment's newest timestamp) before the
    /// indexes are written, as Kafka does when a segment stops being active.
    pub fn seal_time_index(&mut self) {
        if let Some(rel) = relative(self.base, self.max_timestamp.1)
            && self.max_timestamp.0 >= 0
        {
            self.index.push_time((self.max_timestamp.0, rel));
        }
    }

    /// Restores the summary after recovery or truncation.
    pub fn restore(&mut self, size: u64, next_offset: Offset, since_index: u64) {
        self.size = size;
        self.written = size;
        self.next_offset = next_offset;
        self.bytes_since_index = since_index;
    }
}

impl Drop for Segment {
    /// A segment that leaves its log (retention, a cleaner swap, a truncation, the log
    /// closed) leaves the index cache too.
    fn drop(&mut self) {
        if self.index_in_files {
            index_cache::forget(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(base: i64, max_timestamp: i64) -> BatchMeta {
        BatchMeta {
            base_offset: Offset(base),
            last_offset: Offset(base + 1),
            max_timestamp,
            size: 100,
            records: 2,
        }
    }

    /// Batches without timestamps (maxTimestamp -1) are indexed by offset all the same;
    /// before, a segment of them had no index entry and every read scanned it from byte 0.
    #[test]
    fn batches_without_timestamps_get_offset_entries_and_no_time_entries() {
        let mut seg = Segment::new(Path::new("/nonexistent"), Offset(1000));
        for i in 0..10 {
            seg.record_batch(&meta(1000 + 2 * i, -1), 150, 0);
        }
        assert!(seg.index.last_offset_entry().is_some(), "offset entries");
        assert_eq!(seg.index.position_for(19), FilePosition(800));
        assert!(seg.index.time_entries().is_empty(), "no timestamp to index");
        seg.record_batch(&meta(1020, 5_000), 150, 0);
        seg.record_batch(&meta(1022, -1), 150, 0);
        assert_eq!(seg.index.time_entries(), &[(5_000, 21)]);
    }
}
