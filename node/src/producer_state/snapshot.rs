//! Producer-state snapshots: `<offset:020>.snapshot` files in the partition directory, so
//! that a restart needs to replay only the log after the newest snapshot.
//!
//! The layout is weir's own, version 2 (version 1, written before transactions, is
//! still read: it has no open-transaction section), all integers big-endian:
//!
//! File header, 24 bytes ([`FileHeader`]):
//!
//! | off | size | field                                                        |
//! |----:|-----:|--------------------------------------------------------------|
//! |   0 |    4 | magic `WPSS` (weir producer state snapshot)                  |
//! |   4 |    2 | version = 1                                                  |
//! |   6 |    2 | reserved, 0                                                  |
//! |   8 |    4 | CRC-32C of bytes 12..end                                     |
//! |  12 |    8 | snapshot offset: the state covers every batch below it, none at or above; equals the file name |
//! |  20 |    4 | producer count N                                             |
//!
//! Then N producers in ascending producer-id order, each a 19-byte [`EntryHeader`]:
//!
//! | off | size | field                                       |
//! |----:|-----:|---------------------------------------------|
//! |   0 |    8 | producer id (≥ 0)                           |
//! |   8 |    2 | producer epoch (≥ 0)                        |
//! |  10 |    8 | last seen (broker clock, ms)                |
//! |  18 |    1 | batch count B, 0..=5 (0: an epoch a marker fenced to, no batch yet) |
//!
//! followed by B 32-byte [`BatchRecord`]s, oldest first:
//!
//! | off | size | field          |
//! |----:|-----:|----------------|
//! |   0 |    4 | first sequence |
//! |   4 |    4 | last sequence  |
//! |   8 |    8 | first offset   |
//! |  16 |    8 | last offset    |
//! |  24 |    8 | max timestamp  |
//!
//! Version 2 then holds the open transactions: a 4-byte count T, then T 16-byte
//! [`OngoingRecord`]s in ascending producer-id order: producer id (8), first offset of its
//! open transaction (8, below the snapshot offset).
//!
//! Version 3 then holds the coordinator epochs of the producers' newest transaction
//! markers: a 4-byte count C, then C 12-byte [`CoordinatorRecord`]s in ascending
//! producer-id order: producer id (8, one of the N above), coordinator epoch (4, ≥ 0).
//! Producers with no marker seen are not listed.
//!
//! A snapshot is derived data: one that fails any check is ignored (and deleted) and the
//! state is rebuilt from an older snapshot or the whole log, never trusted in part.

use zerocopy::byteorder::big_endian::{I16, I32, I64, U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use wire::{Offset, ProducerEpoch, ProducerId, Sequence};

use super::entry::{BATCHES_RETAINED, BatchMetadata, ProducerEntry};
use super::{ProducerStateConfig, ProducerStateTable};

/// `WPSS`.
pub const SNAPSHOT_MAGIC: [u8; 4] = *b"WPSS";
/// The layout version written (and read).
pub const SNAPSHOT_VERSION: u16 = 3;
/// The layout before coordinator epochs (no coordinator-epoch section), still read.
pub const SNAPSHOT_VERSION_V2: u16 = 2;
/// The layout before transactions (no open-transaction section), still read.
pub const SNAPSHOT_VERSION_V1: u16 = 1;
/// File name suffix, as Kafka's.
pub const SNAPSHOT_SUFFIX: &str = ".snapshot";
/// Where the CRC-covered bytes begin.
const CRC_START: usize = 12;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct FileHeader {
    magic: [u8; 4],
    version: U16,
    reserved: U16,
    crc: U32,
    snapshot_offset: I64,
    producer_count: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct EntryHeader {
    producer_id: I64,
    epoch: I16,
    last_seen_ms: I64,
    batch_count: u8,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct BatchRecord {
    first_sequence: I32,
    last_sequence: I32,
    first_offset: I64,
    last_offset: I64,
    max_timestamp: I64,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct OngoingRecord {
    producer_id: I64,
    first_offset: I64,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct CoordinatorRecord {
    producer_id: I64,
    coordinator_epoch: I32,
}

const COORDINATOR_RECORD_SIZE: usize = size_of::<CoordinatorRecord>();
const _: () = assert!(COORDINATOR_RECORD_SIZE == 12);
const ONGOING_RECORD_SIZE: usize = size_of::<OngoingRecord>();
const _: () = assert!(ONGOING_RECORD_SIZE == 16);
const FILE_HEADER_SIZE: usize = size_of::<FileHeader>();
const ENTRY_HEADER_SIZE: usize = size_of::<EntryHeader>();
const BATCH_RECORD_SIZE: usize = size_of::<BatchRecord>();
const _: () = assert!(FILE_HEADER_SIZE == 24);
const _: () = assert!(ENTRY_HEADER_SIZE == 19);
const _: () = assert!(BATCH_RECORD_SIZE == 32);
/// The smallest producer: an entry header (a fenced epoch has no batch). Bounds the count
/// before trusting it.
const MIN_ENTRY_SIZE: usize = ENTRY_HEADER_SIZE;

/// Why a snapshot was not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot ends at byte {have} reading {field}: need {need} bytes")]
    Truncated {
        field: &'static str,
        need: usize,
        have: usize,
    },
    #[error("not a weir producer snapshot (magic {found:?})")]
    BadMagic { found: [u8; 4] },
    #[error("snapshot version {found} is not supported (only {SNAPSHOT_VERSION})")]
    UnsupportedVersion { found: u16 },
    #[error("snapshot CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("snapshot says offset {stored} but its file name says {expected}")]
    OffsetMismatch { stored: Offset, expected: Offset },
    #[error("invalid snapshot at byte {position}: {reason}")]
    Invalid {
        position: usize,
        reason: &'static str,
    },
}

/// `00000000000000001234.snapshot` for offset 1234.
pub fn snapshot_file_name(offset: Offset) -> String {
    format!("{:020}{SNAPSHOT_SUFFIX}", offset.get())
}

/// The offset in a snapshot file name, or `None` if the name is not one (temp files
/// included).
pub fn parse_snapshot_file_name(name: &str) -> Option<Offset> {
    let stem = name.strip_suffix(SNAPSHOT_SUFFIX)?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse::<i64>().ok().map(Offset)
}

/// Encodes the table as of `snapshot_offset` (the log end offset when it is taken).
pub fn encode_snapshot(table: &ProducerStateTable, snapshot_offset: Offset) -> Vec<u8> {
    let mut producers: Vec<(ProducerId, &ProducerEntry)> = table.iter().collect();
    producers.sort_unstable_by_key(|(pid, _)| *pid);
    let mut out = Vec::with_capacity(
        FILE_HEADER_SIZE + producers.len() * (ENTRY_HEADER_SIZE + 5 * BATCH_RECORD_SIZE),
    );
    let header = FileHeader {
        magic: SNAPSHOT_MAGIC,
        version: U16::new(SNAPSHOT_VERSION),
        reserved: U16::new(0),
        crc: U32::new(0),
        snapshot_offset: I64::new(snapshot_offset.get()),
        producer_count: U32::new(producers.len() as u32),
    };
    out.extend_from_slice(header.as_bytes());
    for (pid, entry) in producers {
        encode_entry(&mut out, pid, entry, snapshot_offset);
    }
    let ongoing: Vec<(ProducerId, Offset)> = table.ongoing_txns().collect();
    out.extend_from_slice(&(ongoing.len() as u32).to_be_bytes());
    for (pid, first) in ongoing {
        debug_assert!(
            first < snapshot_offset,
            "open transaction past the snapshot"
        );
        let record = OngoingRecord {
            producer_id: I64::new(pid.get()),
            first_offset: I64::new(first.get()),
        };
        out.extend_from_slice(record.as_bytes());
    }
    let marked: Vec<(ProducerId, i32)> = producers_marked(table);
    out.extend_from_slice(&(marked.len() as u32).to_be_bytes());
    for (pid, coordinator_epoch) in marked {
        let record = CoordinatorRecord {
            producer_id: I64::new(pid.get()),
            coordinator_epoch: I32::new(coordinator_epoch),
        };
        out.extend_from_slice(record.as_bytes());
    }
    let crc = crc32c::crc32c(&out[CRC_START..]);
    out[8..12].copy_from_slice(&crc.to_be_bytes());
    out
}

/// The producers with a marker's coordinator epoch, in producer-id order.
fn producers_marked(table: &ProducerStateTable) -> Vec<(ProducerId, i32)> {
    let mut marked: Vec<(ProducerId, i32)> = table
        .iter()
        .filter(|(_, e)| e.coordinator_epoch() >= 0)
        .map(|(pid, e)| (pid, e.coordinator_epoch()))
        .collect();
    marked.sort_unstable_by_key(|(pid, _)| *pid);
    marked
}

fn encode_entry(out: &mut Vec<u8>, pid: ProducerId, entry: &ProducerEntry, limit: Offset) {
    let head = EntryHeader {
        producer_id: I64::new(pid.get()),
        epoch: I16::new(entry.epoch().get()),
        last_seen_ms: I64::new(entry.last_seen_ms()),
        batch_count: entry.batches().len() as u8,
    };
    out.extend_from_slice(head.as_bytes());
    for b in entry.batches() {
        debug_assert!(
            b.last_offset < limit,
            "snapshot taken below a recorded batch"
        );
        let record = BatchRecord {
            first_sequence: I32::new(b.first_sequence.get()),
            last_sequence: I32::new(b.last_sequence.get()),
            first_offset: I64::new(b.first_offset.get()),
            last_offset: I64::new(b.last_offset.get()),
            max_timestamp: I64::new(b.max_timestamp),
        };
        out.extend_from_slice(record.as_bytes());
    }
}

/// Decodes a snapshot read from the file for `expected_offset`. Every field is checked
/// before use; nothing is allocated beyond what the byte length allows.
pub fn decode_snapshot(
    bytes: &[u8],
    expected_offset: Offset,
    config: ProducerStateConfig,
) -> Result<ProducerStateTable, SnapshotError> {
    let (header, _) =
        FileHeader::read_from_prefix(bytes).map_err(|_| SnapshotError::Truncated {
            field: "file header",
            need: FILE_HEADER_SIZE,
            have: bytes.len(),
        })?;
    check_file_header(&header, bytes, expected_offset)?;
    let count = header.producer_count.get() as usize;
    if count > (bytes.len() - FILE_HEADER_SIZE) / MIN_ENTRY_SIZE {
        return Err(SnapshotError::Invalid {
            position: 20,
            reason: "producer count larger than the file can hold",
        });
    }
    let mut table = ProducerStateTable::new(config);
    let mut pos = FILE_HEADER_SIZE;
    let mut previous: Option<ProducerId> = None;
    for _ in 0..count {
        let (pid, entry, next) = decode_entry(bytes, pos, expected_offset)?;
        if previous.is_some_and(|p| p >= pid) {
            return Err(SnapshotError::Invalid {
                position: pos,
                reason: "producer ids not in ascending order",
            });
        }
        previous = Some(pid);
        table.insert_entry(pid, entry);
        pos = next;
    }
    if header.version.get() >= SNAPSHOT_VERSION_V2 {
        pos = decode_ongoing(bytes, pos, expected_offset, &mut table)?;
    }
    if header.version.get() >= SNAPSHOT_VERSION {
        pos = decode_coordinator_epochs(bytes, pos, &mut table)?;
    }
    if pos != bytes.len() {
        return Err(SnapshotError::Invalid {
            position: pos,
            reason: "bytes after the last producer",
        });
    }
    Ok(table)
}

/// A section at `pos`: a 4-byte record count, then that many `record_size`-byte records.
/// Returns where the records start and end, the count checked against the bytes present.
fn counted_section(
    bytes: &[u8],
    pos: usize,
    record_size: usize,
    what: &'static str,
) -> Result<(usize, usize), SnapshotError> {
    let count_bytes: [u8; 4] = bytes
        .get(pos..pos + 4)
        .and_then(|b| b.try_into().ok())
        .ok_or(SnapshotError::Truncated {
            field: what,
            need: pos + 4,
            have: bytes.len(),
        })?;
    let count = u32::from_be_bytes(count_bytes) as usize;
    let start = pos + 4;
    if count > (bytes.len() - start) / record_size {
        return Err(invalid(pos, "section count larger than the file can hold"));
    }
    Ok((start, start + count * record_size))
}

/// The open-transaction section at `pos` (version 2): returns the position after it.
fn decode_ongoing(
    bytes: &[u8],
    pos: usize,
    limit: Offset,
    table: &mut ProducerStateTable,
) -> Result<usize, SnapshotError> {
    let (start, end) = counted_section(bytes, pos, ONGOING_RECORD_SIZE, "open transaction")?;
    let mut previous: Option<ProducerId> = None;
    for (i, chunk) in bytes[start..end]
        .chunks_exact(ONGOING_RECORD_SIZE)
        .enumerate()
    {
        let at = start + i * ONGOING_RECORD_SIZE;
        let (r, _) =
            OngoingRecord::read_from_prefix(chunk).map_err(|_| invalid(at, "open transaction"))?;
        let pid = ProducerId(r.producer_id.get());
        let first = Offset(r.first_offset.get());
        if !pid.is_some() || first.0 < 0 || first >= limit {
            return Err(invalid(at, "open transaction outside the snapshot"));
        }
        if previous.is_some_and(|p| p >= pid) {
            return Err(invalid(at, "open transactions not in producer id order"));
        }
        previous = Some(pid);
        table.insert_ongoing(pid, first);
    }
    Ok(end)
}

/// The coordinator-epoch section at `pos` (version 3): returns the position after it.
fn decode_coordinator_epochs(
    bytes: &[u8],
    pos: usize,
    table: &mut ProducerStateTable,
) -> Result<usize, SnapshotError> {
    let (start, end) = counted_section(bytes, pos, COORDINATOR_RECORD_SIZE, "coordinator epoch")?;
    let mut previous: Option<ProducerId> = None;
    for (i, chunk) in bytes[start..end]
        .chunks_exact(COORDINATOR_RECORD_SIZE)
        .enumerate()
    {
        let at = start + i * COORDINATOR_RECORD_SIZE;
        let (r, _) = CoordinatorRecord::read_from_prefix(chunk)
            .map_err(|_| invalid(at, "coordinator epoch"))?;
        let pid = ProducerId(r.producer_id.get());
        let coordinator_epoch = r.coordinator_epoch.get();
        if previous.is_some_and(|p| p >= pid) {
            return Err(invalid(at, "coordinator epochs not in producer id order"));
        }
        previous = Some(pid);
        if coordinator_epoch < 0 || !table.note_coordinator_epoch(pid, coordinator_epoch) {
            return Err(invalid(at, "coordinator epoch of no listed producer"));
        }
    }
    Ok(end)
}

fn check_file_header(
    header: &FileHeader,
    bytes: &[u8],
    expected_offset: Offset,
) -> Result<(), SnapshotError> {
    if header.magic != SNAPSHOT_MAGIC {
        return Err(SnapshotError::BadMagic {
            found: header.magic,
        });
    }
    if !matches!(
        header.version.get(),
        SNAPSHOT_VERSION | SNAPSHOT_VERSION_V2 | SNAPSHOT_VERSION_V1
    ) {
        return Err(SnapshotError::UnsupportedVersion {
            found: header.version.get(),
        });
    }
    if header.reserved.get() != 0 {
        return Err(invalid(6, "reserved field is not 0"));
    }
    let stored = header.crc.get();
    let computed = crc32c::crc32c(&bytes[CRC_START..]);
    if stored != computed {
        return Err(SnapshotError::CrcMismatch { stored, computed });
    }
    let offset = Offset(header.snapshot_offset.get());
    if offset != expected_offset {
        return Err(SnapshotError::OffsetMismatch {
            stored: offset,
            expected: expected_offset,
        });
    }
    Ok(())
}

/// One producer at `pos`: returns it and the position after it.
fn decode_entry(
    bytes: &[u8],
    pos: usize,
    limit: Offset,
) -> Result<(ProducerId, ProducerEntry, usize), SnapshotError> {
    let rest = &bytes[pos..];
    let (head, _) = EntryHeader::read_from_prefix(rest).map_err(|_| SnapshotError::Truncated {
        field: "producer entry",
        need: pos + ENTRY_HEADER_SIZE,
        have: bytes.len(),
    })?;
    let count = usize::from(head.batch_count);
    if count > BATCHES_RETAINED {
        return Err(invalid(pos + 18, "batch count not in 0..=5"));
    }
    let pid = ProducerId(head.producer_id.get());
    let epoch = ProducerEpoch(head.epoch.get());
    if !pid.is_some() || epoch.0 < 0 {
        return Err(invalid(pos, "negative producer id or epoch"));
    }
    let start = pos + ENTRY_HEADER_SIZE;
    let end = start + count * BATCH_RECORD_SIZE;
    let records = bytes.get(start..end).ok_or(SnapshotError::Truncated {
        field: "producer batches",
        need: end,
        have: bytes.len(),
    })?;
    let mut batches = Vec::with_capacity(count);
    for (i, chunk) in records.chunks_exact(BATCH_RECORD_SIZE).enumerate() {
        let b = decode_batch(chunk, start + i * BATCH_RECORD_SIZE, limit)?;
        if batches
            .last()
            .is_some_and(|p: &BatchMetadata| p.last_offset >= b.first_offset)
        {
            return Err(invalid(
                start + i * BATCH_RECORD_SIZE,
                "batches not in offset order",
            ));
        }
        batches.push(b);
    }
    let entry = ProducerEntry::from_parts(epoch, &batches, head.last_seen_ms.get())
        .ok_or(invalid(pos + 18, "batch count not in 1..=5"))?;
    Ok((pid, entry, end))
}

fn decode_batch(chunk: &[u8], pos: usize, limit: Offset) -> Result<BatchMetadata, SnapshotError> {
    let (r, _) = BatchRecord::read_from_prefix(chunk).map_err(|_| SnapshotError::Truncated {
        field: "batch record",
        need: pos + BATCH_RECORD_SIZE,
        have: pos + chunk.len(),
    })?;
    let b = BatchMetadata {
        first_sequence: Sequence(r.first_sequence.get()),
        last_sequence: Sequence(r.last_sequence.get()),
        first_offset: Offset(r.first_offset.get()),
        last_offset: Offset(r.last_offset.get()),
        max_timestamp: r.max_timestamp.get(),
    };
    if b.first_offset.0 < 0 || b.last_offset < b.first_offset {
        return Err(invalid(pos + 8, "batch offsets negative or reversed"));
    }
    if b.last_offset >= limit {
        return Err(invalid(pos + 16, "batch at or past the snapshot offset"));
    }
    if b.first_sequence.0 < 0 || b.last_sequence.0 < 0 {
        return Err(invalid(pos, "negative sequence"));
    }
    Ok(b)
}

fn invalid(position: usize, reason: &'static str) -> SnapshotError {
    SnapshotError::Invalid { position, reason }
}

/// What to do with the snapshots found in a partition directory when the log opens.
///
/// | case | snapshot found                          | action                                   |
/// |------|-----------------------------------------|------------------------------------------|
/// | 1    | none                                    | replay the whole log from its start      |
/// | 2    | newest ≤ log end offset                 | load it, replay from max(it, log start)  |
/// | 3    | above the log end offset (log truncated after it was taken) | delete it, consider the next older |
/// | 4    | fails to decode (caller retries without it) | delete it, consider the next older   |
/// | 5    | older than the newest usable, beyond the newest `keep` | delete (no longer needed) |
///
/// A snapshot older than the log start offset is still loaded (case 2): like Kafka after
/// KIP-360, producer state outlives the segments that wrote it, until expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// The snapshot to load, if any.
    pub load: Option<Offset>,
    /// Replay log batches from this offset to the log end.
    pub replay_from: Offset,
    /// Snapshot files to delete.
    pub delete: Vec<Offset>,
}

/// Applies the recovery table to the snapshot offsets present, keeping the newest `keep`
/// usable snapshots on disk (the spare guards against a damaged newest one).
pub fn plan_recovery(
    snapshots: &[Offset],
    log_start: Offset,
    log_end: Offset,
    keep: usize,
) -> RecoveryPlan {
    debug_assert!(log_start <= log_end);
    let mut sorted = snapshots.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.dedup();
    let (stale, usable): (Vec<Offset>, Vec<Offset>) =
        sorted.into_iter().partition(|&o| o > log_end);
    let load = usable.first().copied();
    let mut delete = stale;
    delete.extend(usable.iter().skip(keep.max(1)).copied());
    let replay_from = load.map_or(log_start, |o| o.max(log_start));
    RecoveryPlan {
        load,
        replay_from,
        delete,
    }
}
