//! The 61-byte record batch header as a zero-copy big-endian view, and batch validation.
//!
//! Byte layout (all integers big-endian), offsets from the start of the batch:
//!
//! | off | size | field                  | covered by CRC |
//! |----:|-----:|------------------------|----------------|
//! |   0 |    8 | baseOffset             | no             |
//! |   8 |    4 | batchLength (bytes after this field) | no |
//! |  12 |    4 | partitionLeaderEpoch   | no             |
//! |  16 |    1 | magic (= 2)            | no             |
//! |  17 |    4 | crc (CRC-32C of bytes 21..end) | no     |
//! |  21 |    2 | attributes             | yes            |
//! |  23 |    4 | lastOffsetDelta        | yes            |
//! |  27 |    8 | baseTimestamp          | yes            |
//! |  35 |    8 | maxTimestamp           | yes            |
//! |  43 |    8 | producerId             | yes            |
//! |  51 |    2 | producerEpoch          | yes            |
//! |  53 |    4 | baseSequence           | yes            |
//! |  57 |    4 | recordsCount           | yes            |
//! |  61 |    … | records                | yes            |
//!
//! Attributes: bits 0–2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3
//! timestamp type (1 = log append time), bit 4 transactional, bit 5 control, bit 6 has
//! delete horizon.

use zerocopy::byteorder::big_endian::{I16, I32, I64, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::WireError;
use crate::types::{LeaderEpoch, Offset, ProducerEpoch, ProducerId, Sequence};

/// Size of the fixed batch header.
pub const BATCH_HEADER_SIZE: usize = 61;
/// Bytes before `batchLength` counts: baseOffset (8) + batchLength (4).
pub const LOG_OVERHEAD: usize = 12;
/// The only record format weir stores.
pub const MAGIC_V2: u8 = 2;
/// Where the CRC-covered bytes begin.
const CRC_START: usize = 21;
/// The smallest record is 7 bytes (length, attributes, timestampDelta, offsetDelta, key
/// length, value length, header count: one byte each), so a count above
/// `bytes / 7` cannot be honest. Used to bound counts before trusting them.
pub const MIN_RECORD_SIZE: usize = 7;

/// The record batch header, viewed in place.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub struct BatchHeader {
    pub base_offset: I64,
    pub batch_length: I32,
    pub partition_leader_epoch: I32,
    pub magic: u8,
    pub crc: U32,
    pub attributes: I16,
    pub last_offset_delta: I32,
    pub base_timestamp: I64,
    pub max_timestamp: I64,
    pub producer_id: I64,
    pub producer_epoch: I16,
    pub base_sequence: I32,
    pub records_count: I32,
}

const _: () = assert!(size_of::<BatchHeader>() == BATCH_HEADER_SIZE);

/// Compression codec from attribute bits 0–2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    /// The codec's attribute bits.
    pub const fn bits(self) -> i16 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }
}

/// Timestamp type from attribute bit 3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// The decoded attribute bits of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attributes(pub i16);

impl Attributes {
    pub const TIMESTAMP_TYPE_BIT: i16 = 1 << 3;
    pub const TRANSACTIONAL_BIT: i16 = 1 << 4;
    pub const CONTROL_BIT: i16 = 1 << 5;

    /// The compression codec; `None` for the reserved values 5–7.
    pub fn compression(self) -> Option<Compression> {
        match self.0 & 0x7 {
            0 => Some(Compression::None),
            1 => Some(Compression::Gzip),
            2 => Some(Compression::Snappy),
            3 => Some(Compression::Lz4),
            4 => Some(Compression::Zstd),
            _ => None,
        }
    }

    pub fn timestamp_type(self) -> TimestampType {
        if self.0 & Self::TIMESTAMP_TYPE_BIT != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }

    pub fn is_transactional(self) -> bool {
        self.0 & Self::TRANSACTIONAL_BIT != 0
    }

    pub fn is_control(self) -> bool {
        self.0 & Self::CONTROL_BIT != 0
    }
}

impl BatchHeader {
    pub fn base_offset(&self) -> Offset {
        Offset(self.base_offset.get())
    }

    /// Offset of the last record: base + lastOffsetDelta.
    pub fn last_offset(&self) -> Offset {
        Offset(self.base_offset.get() + i64::from(self.last_offset_delta.get()))
    }

    /// Offset one past the last record.
    pub fn next_offset(&self) -> Offset {
        self.last_offset().add(1)
    }

    /// Total size of the batch on the wire and on disk.
    pub fn total_size(&self) -> usize {
        LOG_OVERHEAD + self.batch_length.get().max(0) as usize
    }

    pub fn partition_leader_epoch(&self) -> LeaderEpoch {
        LeaderEpoch(self.partition_leader_epoch.get())
    }

    pub fn attributes(&self) -> Attributes {
        Attributes(self.attributes.get())
    }

    pub fn producer_id(&self) -> ProducerId {
        ProducerId(self.producer_id.get())
    }

    pub fn producer_epoch(&self) -> ProducerEpoch {
        ProducerEpoch(self.producer_epoch.get())
    }

    pub fn base_sequence(&self) -> Sequence {
        Sequence(self.base_sequence.get())
    }

    /// Sequence of the last record, wrapping as Kafka does.
    pub fn last_sequence(&self) -> Sequence {
        self.base_sequence()
            .add_wrapping(self.last_offset_delta.get())
    }

    pub fn records_count(&self) -> i32 {
        self.records_count.get()
    }

    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp.get()
    }

    pub fn base_timestamp(&self) -> i64 {
        self.base_timestamp.get()
    }
}

/// A validated batch: the header view plus the whole batch's bytes.
#[derive(Clone, Copy, Debug)]
pub struct BatchView<'a> {
    pub header: &'a BatchHeader,
    /// The whole batch, header included.
    pub bytes: &'a [u8],
}

impl<'a> BatchView<'a> {
    /// The record bytes after the header (compressed if the batch is).
    pub fn records_bytes(&self) -> &'a [u8] {
        &self.bytes[BATCH_HEADER_SIZE..]
    }
}

/// Reads the header at the start of `buf` without validating the rest.
pub fn read_header(buf: &[u8]) -> Result<&BatchHeader, WireError> {
    let (header, _) = BatchHeader::ref_from_prefix(buf).map_err(|_| WireError::UnexpectedEof {
        field: "record batch header",
        offset: 0,
        need: BATCH_HEADER_SIZE,
        have: buf.len(),
    })?;
    Ok(header)
}

/// Validates the one batch that starts at `buf[0]`, which may be followed by more bytes.
/// Checks sizes, magic, record count bounds and the CRC-32C. Returns the view of exactly
/// the batch's bytes.
pub fn validate_batch(buf: &[u8]) -> Result<BatchView<'_>, WireError> {
    let header = read_header(buf)?;
    let batch_length = header.batch_length.get();
    let min_length = (BATCH_HEADER_SIZE - LOG_OVERHEAD) as i32;
    if batch_length < min_length {
        return Err(WireError::Invalid {
            field: "batchLength",
            offset: 8,
            reason: "shorter than the batch header",
        });
    }
    let total = header.total_size();
    if total > buf.len() {
        return Err(WireError::UnexpectedEof {
            field: "record batch",
            offset: 0,
            need: total,
            have: buf.len(),
        });
    }
    if header.magic != MAGIC_V2 {
        return Err(WireError::Invalid {
            field: "magic",
            offset: 16,
            reason: "only record batch v2 (magic 2) is supported",
        });
    }
    let bytes = &buf[..total];
    let stored = header.crc.get();
    let computed = crc32c::crc32c(&bytes[CRC_START..]);
    if stored != computed {
        return Err(WireError::CrcMismatch {
            offset: 0,
            stored,
            computed,
        });
    }
    check_counts(header, total)?;
    Ok(BatchView { header, bytes })
}

/// Record count and offset delta must agree with each other and fit the bytes present.
fn check_counts(header: &BatchHeader, total: usize) -> Result<(), WireError> {
    let count = header.records_count.get();
    let delta = header.last_offset_delta.get();
    if count < 0 || delta < 0 {
        return Err(WireError::Invalid {
            field: "recordsCount",
            offset: 57,
            reason: "negative record count or lastOffsetDelta",
        });
    }
    let record_bytes = total - BATCH_HEADER_SIZE;
    let compressed = header.attributes().compression() != Some(Compression::None);
    // Compressed records can be smaller than MIN_RECORD_SIZE each on the wire; the bound
    // is enforced again when they are decompressed.
    if !compressed && count as usize > record_bytes / MIN_RECORD_SIZE {
        return Err(WireError::TooLarge {
            field: "recordsCount",
            offset: 57,
            size: count as u64,
            max: (record_bytes / MIN_RECORD_SIZE) as u64,
        });
    }
    if header.attributes().compression().is_none() {
        return Err(WireError::Invalid {
            field: "attributes",
            offset: 21,
            reason: "unknown compression codec",
        });
    }
    Ok(())
}

/// What Kafka checks of a batch a client produces, beyond [`validate_batch`] (which holds
/// for every stored batch, cleaned ones included): not a control batch (only brokers write
/// transaction markers), at least one record, `lastOffsetDelta` = `recordsCount` − 1, and,
/// when uncompressed, record i has offsetDelta i and the records fill the batch exactly.
/// Otherwise consumers would give a batch's records offsets that the broker assigned to
/// the batches after it, and skip those. `batch` is one whole batch, already validated.
/// Compressed records are not walked here: that needs decompressing on the produce path.
pub fn check_produced_batch(batch: &[u8]) -> Result<(), WireError> {
    let header = read_header(batch)?;
    let invalid = |field, offset, reason| WireError::Invalid {
        field,
        offset,
        reason,
    };
    if header.attributes().is_control() {
        return Err(invalid(
            "attributes",
            21,
            "clients may not write control batches",
        ));
    }
    let count = header.records_count.get();
    if count <= 0 {
        return Err(invalid(
            "recordsCount",
            57,
            "a batch holds at least one record",
        ));
    }
    if i64::from(header.last_offset_delta.get()) != i64::from(count) - 1 {
        return Err(invalid(
            "lastOffsetDelta",
            23,
            "does not match recordsCount - 1",
        ));
    }
    if header.attributes().compression() != Some(Compression::None) {
        return Ok(());
    }
    let records = batch
        .get(BATCH_HEADER_SIZE..header.total_size())
        .unwrap_or(&[]);
    let mut pos = 0usize;
    for i in 0..count {
        let mut r = crate::codec::Reader::new(records.get(pos..).unwrap_or(&[]));
        let length = r.varint("record length")?;
        let body = r.position();
        let length = usize::try_from(length)
            .ok()
            .filter(|l| *l <= r.remaining())
            .ok_or(invalid(
                "record length",
                BATCH_HEADER_SIZE + pos,
                "outside the batch",
            ))?;
        r.i8("record attributes")?;
        r.varlong("timestampDelta")?;
        if r.varint("offsetDelta")? != i {
            return Err(invalid(
                "offsetDelta",
                BATCH_HEADER_SIZE + pos,
                "record offsets must run 0, 1, 2, ... in a batch",
            ));
        }
        if r.position() > body + length {
            return Err(invalid(
                "record length",
                BATCH_HEADER_SIZE + pos,
                "too short",
            ));
        }
        pos += body + length;
    }
    if pos != records.len() {
        return Err(invalid("recordsCount", 57, "bytes after the last record"));
    }
    Ok(())
}

/// Splits a `records` blob (as carried by Produce or Fetch) into validated batches.
/// Yields each batch's byte range within `records`; stops at the first error.
pub fn split_batches(
    records: &[u8],
) -> impl Iterator<Item = Result<std::ops::Range<usize>, WireError>> + '_ {
    let mut pos = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || pos >= records.len() {
            return None;
        }
        match validate_batch(&records[pos..]) {
            Ok(view) => {
                let range = pos..pos + view.bytes.len();
                pos = range.end;
                Some(Ok(range))
            }
            Err(e) => {
                failed = true;
                Some(Err(e.shifted(pos)))
            }
        }
    })
}

/// Assigns offsets and the leader epoch in place. The CRC does not cover these fields, so
/// the batch stays valid. `buf` must start with a batch header.
pub fn assign_offsets(
    buf: &mut [u8],
    base_offset: Offset,
    leader_epoch: LeaderEpoch,
) -> Result<(), WireError> {
    let have = buf.len();
    let (header, _) = BatchHeader::mut_from_prefix(buf).map_err(|_| WireError::UnexpectedEof {
        field: "record batch header",
        offset: 0,
        need: BATCH_HEADER_SIZE,
        have,
    })?;
    header.base_offset.set(base_offset.get());
    header.partition_leader_epoch.set(leader_epoch.get());
    Ok(())
}
