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

use bytes::Bytes;

use crate::WireError;
use crate::batch::compression::decompress;
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
        let mut r = Reader::over_at(&self.bytes, self.pos);
        let start = r.position();
        let length = r.varint("record length")?;
        let length = usize::try_from(length).map_err(|_| WireError::Invalid {
            field: "record length",
            offset: start,
            reason: "negative",
        })?;
        let body_start = r.position();
        if length > r.remaining() {
            return Err(WireError::UnexpectedEof {
                field: "record",
                offset: body_start,
                need: length,
                have: r.remaining(),
            });
        }
        let record = parse_record_body(&mut r)?;
        if r.position() - body_start != length {
            return Err(WireError::Invalid {
                field: "record length",
                offset: start,
                reason: "does not match the record's fields",
            });
        }
        self.pos = r.position();
        Ok(record)
    }
}

fn parse_record_body(r: &mut Reader<'_>) -> Result<Record, WireError> {
    let attributes = r.i8("record attributes")?;
    let timestamp_delta = r.varlong("timestampDelta")?;
    let offset_delta = r.varint("offsetDelta")?;
    let key = varint_bytes(r, "record key")?;
    let value = varint_bytes(r, "record value")?;
    let at = r.position();
    let count = r.varint("headersCount")?;
    let max = r.remaining() / MIN_HEADER_SIZE;
    let count = usize::try_from(count).map_err(|_| WireError::Invalid {
        field: "headersCount",
        offset: at,
        reason: "negative",
    })?;
    if count > max {
        return Err(WireError::TooLarge {
            field: "headersCount",
            offset: at,
            size: count as u64,
            max: max as u64,
        });
    }
    let mut headers = Vec::with_capacity(count);
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
    Ok(Record {
        attributes,
        timestamp_delta,
        offset_delta,
        key,
        value,
        headers,
    })
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
    let iter = RecordIter::new(records, header.records_count())
        .map_err(|e| e.shifted(BATCH_HEADER_SIZE))?;
    Ok((header, iter))
}
