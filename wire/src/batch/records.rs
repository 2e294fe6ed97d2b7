//! The records inside a batch: an iterator that decodes each record's varints and hands out
//! key, value and header bytes as zero-copy slices, never trusting a count or a length
//! before checking it against the bytes present.
//!
//! Record layout (v2), all integers zigzag varints unless said otherwise:
//!
//! ```text
//! length          varint   bytes after this field
//! attributes      int8     unused, 0
//! timestampDelta  varlong  from the batch's baseTimestamp
//! offsetDelta     varint   from the batch's baseOffset
//! keyLength       varint   -1 = null key
//! key             bytes
//! valueLength     varint   -1 = null value
//! value           bytes
//! headersCount    varint
//! headers         [headerKeyLength varint, headerKey, headerValueLength varint, value]
//! ```

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;

use crate::WireError;
use crate::batch::compression::{decompress, decompress_to_vec};
use crate::batch::header::{BATCH_HEADER_SIZE, MIN_RECORD_SIZE, validate_batch};
use crate::batch::{BatchHeader, Compression};
use crate::codec::Reader;

/// The smallest record header on the wire: key length (1) + value length (1).
const MIN_HEADER_SIZE: usize = 2;

/// One record header: key and optional value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub key: Bytes,
    pub value: Option<Bytes>,
}

/// One decoded record. Byte fields share the batch (or decompressed) buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub attributes: i8,
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<RecordHeader>,
}

/// Iterates over `count` records in `bytes` (uncompressed records section). Yields an error
/// and stops at the first malformed record; after the last record, errors if bytes remain.
pub struct RecordIter {
    bytes: Bytes,
    pos: usize,
    left: usize,
    failed: bool,
}

impl RecordIter {
    /// Records claimed by a batch header, checked against the bytes present: every record
    /// takes at least [`MIN_RECORD_SIZE`] bytes.
    pub fn new(bytes: Bytes, count: i32) -> Result<RecordIter, WireError> {
        let max = bytes.len() / MIN_RECORD_SIZE;
        let count = usize::try_from(count).map_err(|_| WireError::Invalid {
            field: "recordsCount",
            offset: 0,
            reason: "negative",
        })?;
        if count > max {
            return Err(WireError::TooLarge {
                field: "recordsCount",
                offset: 0,
                size: count as u64,
                max: max as u64,
            });
        }
        Ok(RecordIter {
            bytes,
            pos: 0,
            left: count,
            failed: false,
        })
    }

    fn next_record(&mut self) -> Result<Record, WireError> {
        let (body, next) = record_body_at(&self.bytes, self.pos)?;
        let start = body.start;
        // The record's own bytes bound every count inside it (headers above all).
        let body = self.bytes.slice(body);
        let mut r = Reader::over(&body);
        let record = parse_record_body(&mut r).map_err(|e| e.shifted(start))?;
        self.pos = next;
        Ok(record)
    }
}

/// Most headers a decoded record reserves room for before it has read them: the count is
/// the sender's, so a larger one grows the Vec only as headers are actually read.
const HEADERS_PREALLOCATED_MAX: usize = 64;

/// The record at `pos` of `records`: the range of its body (after its length varint) and
/// where the next record starts. Its length is checked against the bytes present.
fn record_body_at(records: &[u8], pos: usize) -> Result<(Range<usize>, usize), WireError> {
    let mut r = Reader::new(records.get(pos..).unwrap_or(&[]));
    let length = r.varint("record length").map_err(|e| e.shifted(pos))?;
    let length = usize::try_from(length).map_err(|_| WireError::Invalid {
        field: "record length",
        offset: pos,
        reason: "negative",
    })?;
    let body_start = pos + r.position();
    if length > r.remaining() {
        return Err(WireError::UnexpectedEof {
            field: "record",
            offset: body_start,
            need: length,
            have: r.remaining(),
        });
    }
    Ok((body_start..body_start + length, body_start + length))
}

/// Reads a record's fields from a reader over exactly its body; every byte must be used.
fn parse_record_body(r: &mut Reader<'_>) -> Result<Record, WireError> {
    let attributes = r.i8("record attributes")?;
    let timestamp_delta = r.varlong("timestampDelta")?;
    let offset_delta = r.varint("offsetDelta")?;
    let key = varint_bytes(r, "record key")?;
    let value = varint_bytes(r, "record value")?;
    let count = headers_count(r)?;
    let mut headers = Vec::with_capacity(count.min(HEADERS_PREALLOCATED_MAX));
    for _ in 0..count {
        let hat = r.position();
        let key = varint_bytes(r, "header key")?.ok_or(WireError::Invalid {
            field: "header key",
            offset: hat,
            reason: "null header key",
        })?;
        let value = varint_bytes(r, "header value")?;
        headers.push(RecordHeader { key, value });
    }
    end_of_record(r)?;
    Ok(Record {
        attributes,
        timestamp_delta,
        offset_delta,
        key,
        value,
        headers,
    })
}

/// The headers count, bounded by the bytes left in the record: each header takes at least
/// [`MIN_HEADER_SIZE`] bytes.
fn headers_count(r: &mut Reader<'_>) -> Result<usize, WireError> {
    let at = r.position();
    let count = r.varint("headersCount")?;
    let count = usize::try_from(count).map_err(|_| WireError::Invalid {
        field: "headersCount",
        offset: at,
        reason: "negative",
    })?;
    let max = r.remaining() / MIN_HEADER_SIZE;
    if count > max {
        return Err(WireError::TooLarge {
            field: "headersCount",
            offset: at,
            size: count as u64,
            max: max as u64,
        });
    }
    Ok(count)
}

fn end_of_record(r: &Reader<'_>) -> Result<(), WireError> {
    if !r.is_empty() {
        return Err(WireError::Invalid {
            field: "record length",
            offset: r.position(),
            reason: "does not match the record's fields",
        });
    }
    Ok(())
}

/// One record as [`walk_records`] sees it: fields borrowed from the records bytes, nothing
/// allocated. Headers are checked (lengths, no null key) and skipped; only their count is
/// kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub attributes: i8,
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers_count: usize,
    /// The record's bytes from its key length to its end (key, value, headers) as they
    /// are, for re-encoding it with other deltas without decoding its headers.
    pub fields: &'a [u8],
}

/// Walks the `count` records of an uncompressed records section, handing each to `visit`
/// with its index, and allocates nothing: the check a broker makes of every produced
/// record. Fails on the first record that does not parse to exactly its length, on a
/// count the bytes cannot hold, on bytes left after the last record, or with `visit`'s
/// own error. Error offsets are from the start of `records`.
pub fn walk_records<'a>(
    records: &'a [u8],
    count: i32,
    mut visit: impl FnMut(usize, RecordRef<'a>) -> Result<(), WireError>,
) -> Result<(), WireError> {
    let count = usize::try_from(count).map_err(|_| WireError::Invalid {
        field: "recordsCount",
        offset: 0,
        reason: "negative",
    })?;
    let max = records.len() / MIN_RECORD_SIZE;
    if count > max {
        return Err(WireError::TooLarge {
            field: "recordsCount",
            offset: 0,
            size: count as u64,
            max: max as u64,
        });
    }
    let mut pos = 0usize;
    for i in 0..count {
        let (body, next) = record_body_at(records, pos)?;
        let start = body.start;
        let record = walk_record_body(&records[body]).map_err(|e| e.shifted(start))?;
        visit(i, record)?;
        pos = next;
    }
    if pos != records.len() {
        return Err(WireError::Invalid {
            field: "records",
            offset: pos,
            reason: "bytes left after the last record",
        });
    }
    Ok(())
}

/// [`parse_record_body`] without collecting anything: key and value borrowed, headers
/// skipped by their lengths.
fn walk_record_body(body: &[u8]) -> Result<RecordRef<'_>, WireError> {
    let mut r = Reader::new(body);
    let attributes = r.i8("record attributes")?;
    let timestamp_delta = r.varlong("timestampDelta")?;
    let offset_delta = r.varint("offsetDelta")?;
    let fields = &body[r.position()..];
    let key = varint_slice(&mut r, "record key")?;
    let value = varint_slice(&mut r, "record value")?;
    let headers_count = headers_count(&mut r)?;
    for _ in 0..headers_count {
        let hat = r.position();
        if varint_slice(&mut r, "header key")?.is_none() {
            return Err(WireError::Invalid {
                field: "header key",
                offset: hat,
                reason: "null header key",
            });
        }
        varint_slice(&mut r, "header value")?;
    }
    end_of_record(&r)?;
    Ok(RecordRef {
        attributes,
        timestamp_delta,
        offset_delta,
        key,
        value,
        headers_count,
        fields,
    })
}

/// Varint-length-prefixed bytes borrowed from the reader's slice; -1 is null.
fn varint_slice<'a>(
    r: &mut Reader<'a>,
    field: &'static str,
) -> Result<Option<&'a [u8]>, WireError> {
    let at = r.position();
    let len = r.varint(field)?;
    if len == -1 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| WireError::Invalid {
        field,
        offset: at,
        reason: "negative length",
    })?;
    let range = r.take(field, len)?;
    Ok(Some(r.slice_of(range)))
}

/// Varint-length-prefixed bytes; -1 is null.
fn varint_bytes(r: &mut Reader<'_>, field: &'static str) -> Result<Option<Bytes>, WireError> {
    let at = r.position();
    let len = r.varint(field)?;
    if len == -1 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| WireError::Invalid {
        field,
        offset: at,
        reason: "negative length",
    })?;
    let range = r.take(field, len)?;
    Ok(Some(r.bytes_of(range)))
}

impl Iterator for RecordIter {
    type Item = Result<Record, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.left == 0 {
            if self.pos != self.bytes.len() {
                self.failed = true;
                return Some(Err(WireError::Invalid {
                    field: "records",
                    offset: self.pos,
                    reason: "bytes left after the last record",
                }));
            }
            return None;
        }
        self.left -= 1;
        let result = self.next_record();
        self.failed = result.is_err();
        Some(result)
    }
}

/// Validates the batch at the start of `batch` (CRC included), decompresses its records if
/// needed (output at most `max_decompressed_bytes`), and iterates over them.
pub fn batch_records(
    batch: &Bytes,
    max_decompressed_bytes: usize,
) -> Result<(BatchHeader, RecordIter), WireError> {
    let (header, records) = records_section(batch, max_decompressed_bytes)?;
    let iter = RecordIter::new(records, header.records_count())
        .map_err(|e| e.shifted(BATCH_HEADER_SIZE))?;
    Ok((header, iter))
}

/// Walks the records of one batch already checked by
/// [`validate_batch`](crate::batch::validate_batch) (see [`walk_records`]). A compressed
/// batch is decompressed first into one buffer of at most `max_decompressed_bytes`;
/// an uncompressed one is walked in place, nothing copied. Error offsets are within the
/// records section (the decompressed one if compressed).
pub fn walk_batch(
    batch: &[u8],
    max_decompressed_bytes: usize,
    visit: impl FnMut(usize, RecordRef<'_>) -> Result<(), WireError>,
) -> Result<(), WireError> {
    let count = crate::batch::read_header(batch)?.records_count();
    let records = uncompressed_records(batch, max_decompressed_bytes)?;
    walk_records(&records, count, visit)
}

/// The records section of one batch already checked by
/// [`validate_batch`](crate::batch::validate_batch), uncompressed: borrowed from `batch`
/// if it is not compressed (nothing copied), else decompressed into one buffer of at most
/// `max_decompressed_bytes`.
pub fn uncompressed_records(
    batch: &[u8],
    max_decompressed_bytes: usize,
) -> Result<Cow<'_, [u8]>, WireError> {
    let header = crate::batch::read_header(batch)?;
    let end = header.total_size().min(batch.len());
    let raw = batch.get(BATCH_HEADER_SIZE..end).unwrap_or(&[]);
    match header.attributes().compression() {
        Some(Compression::None) => Ok(Cow::Borrowed(raw)),
        Some(codec) => {
            let records = decompress_to_vec(codec, raw, max_decompressed_bytes)?;
            Ok(Cow::Owned(records))
        }
        None => Err(WireError::Invalid {
            field: "attributes",
            offset: 21,
            reason: "unknown compression codec",
        }),
    }
}

/// Validates the batch at the start of `batch` (CRC included) and returns its header and
/// its records section: a slice of `batch` if uncompressed (nothing copied), else the
/// records decompressed (at most `max_decompressed_bytes`). Walk it with
/// [`walk_records`] to see the records without allocating per record.
pub fn records_section(
    batch: &Bytes,
    max_decompressed_bytes: usize,
) -> Result<(BatchHeader, Bytes), WireError> {
    let view = validate_batch(batch)?;
    let header = *view.header;
    let total = view.bytes.len();
    let codec = header
        .attributes()
        .compression()
        .unwrap_or(Compression::None);
    let raw = batch.slice(BATCH_HEADER_SIZE..total);
    let records = match codec {
        Compression::None => raw,
        codec => decompress(codec, &raw, max_decompressed_bytes)?,
    };
    Ok((header, records))
}
