//! The sparse offset index (`.index`) and time index (`.timeindex`) of one segment, in
//! Kafka's byte layout, written to disk when the segment is sealed or the log is closed.
//!
//! `.index` entry, 8 bytes, big-endian:
//!
//! | off | size | field                                                     |
//! |----:|-----:|-----------------------------------------------------------|
//! |   0 |    4 | relative offset: a batch's last offset − segment base      |
//! |   4 |    4 | position of that batch's first byte in the `.log` file     |
//!
//! `.timeindex` entry, 12 bytes, big-endian:
//!
//! | off | size | field                                                     |
//! |----:|-----:|-----------------------------------------------------------|
//! |   0 |    8 | the largest batch max timestamp so far in the segment      |
//! |   8 |    4 | relative offset of the last record of the batch holding it |
//!
//! One entry of each is added per `log.index.interval.bytes` of batches, as Kafka does.
//! The active segment's index lives here in memory; a sealed segment's is read back from
//! its files when needed, into the shard's bounded cache (`index_cache.rs`).

use zerocopy::byteorder::big_endian::{I32, I64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use wire::Offset;

use super::FilePosition;

/// One `.index` entry as stored.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct OffsetIndexEntry {
    pub relative_offset: I32,
    pub position: I32,
}

/// One `.timeindex` entry as stored.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct TimeIndexEntry {
    pub timestamp: I64,
    pub relative_offset: I32,
}

const _: () = assert!(size_of::<OffsetIndexEntry>() == 8);
const _: () = assert!(size_of::<TimeIndexEntry>() == 12);

/// A segment's two indexes, in memory. Entries are strictly increasing in offset and
/// position (offset index) and in timestamp (time index).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentIndex {
    /// (relative last offset of a batch, position of that batch)
    offsets: Vec<(u32, FilePosition)>,
    /// (max timestamp so far, relative offset of the batch holding it)
    times: Vec<(i64, u32)>,
}

/// Why an index file cannot be trusted (it is then rebuilt from the segment).
#[derive(Debug, PartialEq, Eq)]
pub struct IndexInvalid(pub &'static str);

impl SegmentIndex {
    /// Adds the entries for one batch: its last offset at its position, and the largest
    /// timestamp so far (only if it grew since the last time entry).
    #[cfg(test)]
    pub fn push(&mut self, relative_last: u32, position: FilePosition, max_ts: (i64, u32)) {
        self.push_offset(relative_last, position);
        self.push_time(max_ts);
    }

    /// Adds an offset entry: a batch's last offset at its position.
    pub fn push_offset(&mut self, relative_last: u32, position: FilePosition) {
        debug_assert!(
            self.offsets
                .last()
                .is_none_or(|&(o, p)| o < relative_last && p < position)
        );
        self.offsets.push((relative_last, position));
    }

    /// Adds a time entry if the timestamp grew (also used when a segment is sealed).
    pub fn push_time(&mut self, (timestamp, relative): (i64, u32)) {
        if self.times.last().is_none_or(|&(t, _)| t < timestamp) {
            self.times.push((timestamp, relative));
        }
    }

    /// The position to start scanning from for `relative` (an offset minus base): the
    /// largest indexed batch whose last offset is `<= relative`, or the segment start.
    pub fn position_for(&self, relative: u32) -> FilePosition {
        let n = self.offsets.partition_point(|&(o, _)| o <= relative);
        match n {
            0 => FilePosition(0),
            _ => self.offsets[n - 1].1,
        }
    }

    /// The relative offset from which a scan for the first batch with max timestamp
    /// `>= timestamp` may start: batches up to the last entry older than `timestamp`
    /// are all older.
    pub fn relative_offset_for_time(&self, timestamp: i64) -> u32 {
        let n = self.times.partition_point(|&(t, _)| t < timestamp);
        match n {
            0 => 0,
            _ => self.times[n - 1].1,
        }
    }

    /// Drops entries at or after `position` (truncation).
    pub fn truncate_at(&mut self, position: FilePosition, relative_end: u32) {
        self.offsets.retain(|&(_, p)| p < position);
        self.times.retain(|&(_, o)| o < relative_end);
    }

    /// The last offset-index entry, if any.
    pub fn last_offset_entry(&self) -> Option<(u32, FilePosition)> {
        self.offsets.last().copied()
    }

    pub fn time_entries(&self) -> &[(i64, u32)] {
        &self.times
    }

    /// Entries in the offset index (8 bytes each in `.index`).
    pub fn offset_entry_count(&self) -> usize {
        self.offsets.len()
    }

    /// Entries in the time index (12 bytes each in `.timeindex`).
    pub fn time_entry_count(&self) -> usize {
        self.times.len()
    }

    /// The memory the entries take (what the index cache charges for them).
    pub fn memory_bytes(&self) -> u64 {
        (self.offsets.capacity() * size_of::<(u32, FilePosition)>()
            + self.times.capacity() * size_of::<(i64, u32)>()) as u64
    }

    /// What [`Self::memory_bytes`] will be for the index decoded from files of these
    /// sizes (8 bytes per `.index` entry, 12 per `.timeindex` entry; decoding allocates
    /// exactly one slot per entry): the index cache reserves it before a load reads them.
    pub fn memory_bytes_of_files(offsets_len: u64, times_len: u64) -> u64 {
        let offsets = offsets_len / 8 * size_of::<(u32, FilePosition)>() as u64;
        let times = times_len / 12 * size_of::<(i64, u32)>() as u64;
        offsets.saturating_add(times)
    }

    /// The `.index` file bytes.
    pub fn encode_offsets(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.offsets.len() * 8);
        for &(o, p) in &self.offsets {
            let e = OffsetIndexEntry {
                relative_offset: I32::new(o as i32),
                position: I32::new(p.0 as i32),
            };
            out.extend_from_slice(e.as_bytes());
        }
        out
    }

    /// The `.timeindex` file bytes.
    pub fn encode_times(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.times.len() * 12);
        for &(t, o) in &self.times {
            let e = TimeIndexEntry {
                timestamp: I64::new(t),
                relative_offset: I32::new(o as i32),
            };
            out.extend_from_slice(e.as_bytes());
        }
        out
    }

    /// Decodes both files, checking every entry is in order and inside the segment
    /// (`log_size` bytes, holding relative offsets below `relative_end`).
    pub fn decode(
        offsets: &[u8],
        times: &[u8],
        log_size: u64,
        relative_end: u64,
    ) -> Result<SegmentIndex, IndexInvalid> {
        let offsets = decode_offsets(offsets, log_size, relative_end)?;
        let times = decode_times(times, relative_end)?;
        Ok(SegmentIndex { offsets, times })
    }
}

/// Decodes `.index` bytes; each entry must advance and stay inside the segment.
pub fn decode_offsets(
    bytes: &[u8],
    log_size: u64,
    relative_end: u64,
) -> Result<Vec<(u32, FilePosition)>, IndexInvalid> {
    let entries = <[OffsetIndexEntry]>::ref_from_bytes(bytes)
        .map_err(|_| IndexInvalid("offset index size is not a multiple of 8"))?;
    let mut out: Vec<(u32, FilePosition)> = Vec::with_capacity(entries.len());
    for e in entries {
        let (o, p) = (e.relative_offset.get(), e.position.get());
        if o < 0 || p < 0 || o as u64 >= relative_end || p as u64 >= log_size {
            return Err(IndexInvalid("offset index entry outside the segment"));
        }
        let (o, p) = (o as u32, FilePosition(p as u32));
        if out.last().is_some_and(|&(lo, lp)| lo >= o || lp >= p) {
            return Err(IndexInvalid("offset index entries out of order"));
        }
        out.push((o, p));
    }
    Ok(out)
}

/// Decodes `.timeindex` bytes; timestamps must grow and offsets stay in the segment.
pub fn decode_times(bytes: &[u8], relative_end: u64) -> Result<Vec<(i64, u32)>, IndexInvalid> {
    let entries = <[TimeIndexEntry]>::ref_from_bytes(bytes)
        .map_err(|_| IndexInvalid("time index size is not a multiple of 12"))?;
    let mut out: Vec<(i64, u32)> = Vec::with_capacity(entries.len());
    for e in entries {
        let (t, o) = (e.timestamp.get(), e.relative_offset.get());
        if o < 0 || o as u64 >= relative_end {
            return Err(IndexInvalid("time index entry outside the segment"));
        }
        if out.last().is_some_and(|&(lt, _)| lt >= t) {
            return Err(IndexInvalid("time index timestamps out of order"));
        }
        out.push((t, o as u32));
    }
    Ok(out)
}

/// `offset - base` as the 4-byte relative offset the index stores; `None` if it does not
/// fit (the segment must roll before that happens).
pub fn relative(base: Offset, offset: Offset) -> Option<u32> {
    let d = offset.get().checked_sub(base.get())?;
    u32::try_from(d).ok().filter(|&d| d <= i32::MAX as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SegmentIndex {
        let mut ix = SegmentIndex::default();
        ix.push(9, FilePosition(0), (100, 9));
        ix.push(19, FilePosition(5000), (100, 9));
        ix.push(29, FilePosition(9000), (300, 29));
        ix
    }

    #[test]
    fn lookup_finds_the_last_entry_at_or_below() {
        let ix = sample();
        assert_eq!(ix.position_for(0), FilePosition(0));
        assert_eq!(ix.position_for(19), FilePosition(5000));
        assert_eq!(ix.position_for(20), FilePosition(5000));
        assert_eq!(ix.position_for(1000), FilePosition(9000));
        // The repeated timestamp 100 was not indexed twice.
        assert_eq!(ix.time_entries(), &[(100, 9), (300, 29)]);
        assert_eq!(ix.relative_offset_for_time(50), 0);
        assert_eq!(ix.relative_offset_for_time(200), 9);
        assert_eq!(ix.relative_offset_for_time(301), 29);
    }

    #[test]
    fn files_round_trip_in_kafka_layout() {
        let ix = sample();
        let offsets = ix.encode_offsets();
        assert_eq!(offsets.len(), 24);
        // Entry 2: relative offset 19, position 5000, big-endian.
        assert_eq!(&offsets[8..16], &[0, 0, 0, 19, 0, 0, 0x13, 0x88]);
        let times = ix.encode_times();
        assert_eq!(&times[12..24], &[0, 0, 0, 0, 0, 0, 1, 44, 0, 0, 0, 29]);
        let back = SegmentIndex::decode(&offsets, &times, 10_000, 30).unwrap();
        assert_eq!(back, ix);
    }

    #[test]
    fn damaged_index_files_are_rejected() {
        let ix = sample();
        let offsets = ix.encode_offsets();
        assert!(SegmentIndex::decode(&offsets[..7], &[], 10_000, 30).is_err());
        // Position beyond the log file.
        assert!(SegmentIndex::decode(&offsets, &[], 8_000, 30).is_err());
        // Out of order.
        let mut swapped = offsets[8..16].to_vec();
        swapped.extend_from_slice(&offsets[0..8]);
        assert!(SegmentIndex::decode(&swapped, &[], 10_000, 30).is_err());
    }
}
