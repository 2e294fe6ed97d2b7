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
use crate::batch::records::{RecordRef, uncompressed_records, walk_records};
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
    /// Every codec, in attribute-bit order.
    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

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
    /// Bits 0–2: the compression codec.
    pub const COMPRESSION_MASK: i16 = 0x7;
    pub const TIMESTAMP_TYPE_BIT: i16 = 1 << 3;
    pub const TRANSACTIONAL_BIT: i16 = 1 << 4;
    pub const CONTROL_BIT: i16 = 1 << 5;

    /// The compression codec; `None` for the reserved values 5–7.
    pub fn compression(self) -> Option<Compression> {
        match self.0 & Self::COMPRESSION_MASK {
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

/// Bound on a produced batch's records once decompressed when the caller names none.
pub const PRODUCED_DECOMPRESSED_BYTES_DEFAULT: usize = 64 << 20;

/// [`walk_produced_batch`] with the default decompression bound and no visitor.
pub fn check_produced_batch(batch: &[u8]) -> Result<(), WireError> {
    walk_produced_batch(batch, PRODUCED_DECOMPRESSED_BYTES_DEFAULT, |_, _| Ok(()))
}

/// What Kafka's `LogValidator` checks of a batch a client produces, beyond
/// [`validate_batch`] (which holds for every stored batch, cleaned ones included): not a
/// control batch (only brokers write transaction markers), at least one record,
/// `lastOffsetDelta` = `recordsCount` − 1, and every record opened — decompressed first
/// if the batch is, into at most `max_decompressed_bytes` — and walked: exactly
/// `recordsCount` records, record i has offsetDelta i, each parses to exactly its length,
/// no null header key. Otherwise consumers would give a batch's records offsets that the
/// broker assigned to the batches after it, skip records, or stop at the batch for good.
/// Each record goes to `visit` (key, timestamp checks), which may refuse it. `batch` is
/// one whole batch, already validated. Record errors' offsets are within the records
/// section (the decompressed one if compressed).
pub fn walk_produced_batch(
    batch: &[u8],
    max_decompressed_bytes: usize,
    visit: impl FnMut(usize, RecordRef<'_>) -> Result<(), WireError>,
) -> Result<(), WireError> {
    let header = read_header(batch)?;
    check_produced_header(header)?;
    let records = uncompressed_records(batch, max_decompressed_bytes)?;
    walk_produced_records(&records, header.records_count(), visit)
}

/// The checks of [`walk_produced_batch`] the header alone answers: not a control batch,
/// at least one record, `lastOffsetDelta` = `recordsCount` − 1.
pub fn check_produced_header(header: &BatchHeader) -> Result<(), WireError> {
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
    Ok(())
}

/// The record checks of [`walk_produced_batch`] over a produced batch's uncompressed
/// records section (see [`uncompressed_records`]) claiming `count` records: exactly that
/// many, record i at offsetDelta i, each handed to `visit`.
pub fn walk_produced_records<'a>(
    records: &'a [u8],
    count: i32,
    mut visit: impl FnMut(usize, RecordRef<'a>) -> Result<(), WireError>,
) -> Result<(), WireError> {
    walk_records(records, count, |i, record| {
        if usize::try_from(record.offset_delta).ok() != Some(i) {
            return Err(WireError::Invalid {
                field: "offsetDelta",
                offset: i,
                reason: "record offsets must run 0, 1, 2, ... in a batch",
            });
        }
        visit(i, record)
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{SnappyFraming, compress};
    use crate::codec::{put_varint, put_varlong};

    /// One record by hand: `headers` is the count written, followed by `header_bytes`.
    fn record(offset_delta: i32, key: Option<&[u8]>, headers: i32, header_bytes: &[u8]) -> Vec<u8> {
        let mut body = vec![0u8];
        put_varlong(&mut body, 0);
        put_varint(&mut body, offset_delta);
        match key {
            Some(k) => {
                put_varint(&mut body, k.len() as i32);
                body.extend_from_slice(k);
            }
            None => put_varint(&mut body, -1),
        }
        put_varint(&mut body, 1);
        body.push(b'v');
        put_varint(&mut body, headers);
        body.extend_from_slice(header_bytes);
        let mut out = Vec::new();
        put_varint(&mut out, body.len() as i32);
        out.extend_from_slice(&body);
        out
    }

    /// A batch around `records` (compressed with `codec`) claiming `count` records, with a
    /// correct CRC so that only the rule under test can refuse it.
    fn batch(codec: Compression, records: &[u8], count: i32) -> Vec<u8> {
        let body = compress(codec, records, SnappyFraming::Xerial).expect("compresses");
        raw_batch(codec, &body, count)
    }

    fn raw_batch(codec: Compression, body: &[u8], count: i32) -> Vec<u8> {
        let mut b = vec![0u8; BATCH_HEADER_SIZE];
        b.extend_from_slice(body);
        let length = (b.len() - LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&length.to_be_bytes());
        b[16] = MAGIC_V2;
        b[21..23].copy_from_slice(&codec.bits().to_be_bytes());
        b[23..27].copy_from_slice(&count.wrapping_sub(1).to_be_bytes());
        b[43..51].copy_from_slice(&(-1i64).to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn records(deltas: &[i32]) -> Vec<u8> {
        deltas
            .iter()
            .flat_map(|d| record(*d, Some(b"k"), 0, &[]))
            .collect()
    }

    const CODECS: [Compression; 5] = Compression::ALL;

    #[test]
    fn well_formed_batches_pass_with_every_codec() {
        for codec in CODECS {
            let b = batch(codec, &records(&[0, 1, 2]), 3);
            validate_batch(&b).expect("valid framing");
            check_produced_batch(&b).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
        }
    }

    #[test]
    fn compressed_records_are_opened_and_walked() {
        for codec in CODECS {
            // One record at offsetDelta 1000000: Java consumers would skip records.
            let b = batch(codec, &records(&[1_000_000]), 1);
            assert!(check_produced_batch(&b).is_err(), "{codec:?} offsetDelta");
            // More records claimed than present, and fewer.
            let b = batch(codec, &records(&[0, 1]), 3);
            assert!(check_produced_batch(&b).is_err(), "{codec:?} count high");
            let b = batch(codec, &records(&[0, 1, 2]), 2);
            assert!(check_produced_batch(&b).is_err(), "{codec:?} count low");
            // A null header key, and a record shorter than its fields.
            let null_key = record(0, Some(b"k"), 1, &[1, 0]);
            assert!(check_produced_batch(&batch(codec, &null_key, 1)).is_err());
            let mut short = record(0, Some(b"k"), 0, &[]);
            short[0] -= 2; // length varint (zigzag): one byte less
            short.pop();
            assert!(check_produced_batch(&batch(codec, &short, 1)).is_err());
        }
    }

    #[test]
    fn a_gzip_body_of_several_members_is_walked_whole() {
        // Java's GZIPInputStream (Kafka's reader) reads concatenated gzip members as one
        // stream: records split across two members are all there.
        let all = records(&[0, 1, 2]);
        let (one, two) = all.split_at(all.len() / 2);
        let mut body = compress(Compression::Gzip, one, SnappyFraming::Xerial).expect("gzip");
        body.extend(compress(Compression::Gzip, two, SnappyFraming::Xerial).expect("gzip"));
        let b = raw_batch(Compression::Gzip, &body, 3);
        check_produced_batch(&b).expect("two gzip members hold the three records");
    }

    #[test]
    fn data_that_does_not_decompress_is_refused() {
        for codec in [Compression::Gzip, Compression::Lz4, Compression::Zstd] {
            let b = raw_batch(codec, b"definitely not compressed data", 1);
            validate_batch(&b).expect("valid framing");
            assert!(
                matches!(
                    check_produced_batch(&b),
                    Err(WireError::Decompression { .. })
                ),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn a_huge_count_in_a_small_compressed_batch_is_refused() {
        // ~100 bytes claiming i32::MAX records would move the log end by 2^31.
        let b = batch(Compression::Lz4, &records(&[0]), i32::MAX);
        validate_batch(&b).expect("the header alone cannot tell");
        assert!(matches!(
            check_produced_batch(&b),
            Err(WireError::TooLarge {
                field: "recordsCount",
                ..
            })
        ));
    }

    #[test]
    fn a_header_count_above_the_record_length_is_refused_before_allocating() {
        // 33 million headers claimed by a record of a few bytes, and 1000 by one followed
        // by bytes that would read as headers: the record's own length bounds the count.
        let huge = record(0, Some(b"k"), 33_000_000, &[2, b'h', 0]);
        let mut followed = record(0, Some(b"k"), 1000, &[]);
        followed.extend_from_slice(&[0; 4000]);
        for rec in [huge, followed] {
            headers_count_refused(&rec);
        }
    }

    fn headers_count_refused(rec: &[u8]) {
        for codec in [Compression::None, Compression::Zstd] {
            let b = batch(codec, rec, 1);
            assert!(matches!(
                check_produced_batch(&b),
                Err(WireError::TooLarge {
                    field: "headersCount",
                    ..
                })
            ));
            let (_, mut iter) =
                crate::batch::batch_records(&bytes::Bytes::from(b), 1 << 20).expect("batch");
            assert!(matches!(
                iter.next(),
                Some(Err(WireError::TooLarge {
                    field: "headersCount",
                    ..
                }))
            ));
        }
    }
}
