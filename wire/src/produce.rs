//! The Produce request, hand-parsed for the hot path: every partition's records stay a
//! `Bytes` slice of the request buffer (no copy), ready to validate in place and append.
//!
//! Layout, v0–v8 (classic encodings) and v9 (flexible: compact lengths, tagged fields):
//!
//! ```text
//! transactional_id  nullable string                          v3+
//! acks              int16
//! timeout_ms        int32
//! topic_data        array of
//!   name            string
//!   partition_data  array of
//!     index         int32
//!     records       nullable bytes (the record batches)
//!     [tagged fields]   v9+
//!   [tagged fields]     v9+
//! [tagged fields]       v9+
//! ```
//!
//! The Produce response is hand-written too ([`encode_produce_response`]): kafka-protocol
//! does not encode v0–v2, which weir advertises only because librdkafka < 2.11 compresses
//! with gzip/snappy/lz4 only if the broker's Produce range includes v0 (see [`crate::api`]).
//! Those old versions carry message format v0/v1, which weir does not store: the broker
//! answers them per partition with an error, but it does answer.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::{Reader, put_array_len, put_bytes_len, put_nullable_string, put_string};
use crate::{WireError, api, frame};

/// Most partition entries one Produce request may name (as Fetch's bound). Each costs
/// the broker a task, a call to the partition's shard and a response entry; a request
/// of empty entries could otherwise name millions in 100 MiB. Past it the request is
/// refused as undecodable (the connection is closed): answering every entry would cost
/// what the bound avoids, and no client names more partitions than it writes to.
pub const PARTITIONS_PER_PRODUCE_MAX: usize = 100_000;

/// Smallest encoded topic entry: name length + partition array length (classic 2 + 4,
/// flexible 1 + 1 + tagged 1).
fn min_topic_bytes(flexible: bool) -> usize {
    if flexible { 3 } else { 6 }
}

/// Smallest encoded partition entry: index + records length (+ tagged fields).
fn min_partition_bytes(flexible: bool) -> usize {
    if flexible { 6 } else { 8 }
}

/// One partition's data: its index and its record batches, untouched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducePartition {
    pub index: i32,
    /// The record batches as sent; `None` if the client sent null.
    pub records: Option<Bytes>,
}

/// One topic's partitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceTopic {
    pub name: Bytes,
    pub partitions: Vec<ProducePartition>,
}

impl ProduceTopic {
    /// The topic name as text, if valid UTF-8.
    pub fn name_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.name).ok()
    }
}

/// A Produce request body, viewed without copying record bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceRequestView {
    pub version: i16,
    pub transactional_id: Option<Bytes>,
    pub acks: i16,
    pub timeout_ms: i32,
    pub topics: Vec<ProduceTopic>,
}

impl ProduceRequestView {
    /// Parses a Produce request body (the bytes after the request header) at `version`.
    /// `body` is usually `frame.slice(body_offset..)`, so record slices share the frame.
    pub fn parse(body: &Bytes, version: i16) -> Result<ProduceRequestView, WireError> {
        if !api::is_supported(api::PRODUCE, version) {
            return Err(WireError::UnsupportedVersion {
                api_key: api::PRODUCE,
                api_version: version,
            });
        }
        let flexible = api::is_flexible(api::PRODUCE, version);
        let mut r = Reader::over(body);
        let transactional_id = if version >= 3 {
            r.nullable_string("transactional_id", flexible)?
        } else {
            None
        };
        let acks = r.i16("acks")?;
        let timeout_ms = r.i32("timeout_ms")?;
        let topics = parse_topics(&mut r, flexible)?;
        if flexible {
            r.skip_tagged_fields()?;
        }
        Ok(ProduceRequestView {
            version,
            transactional_id,
            acks,
            timeout_ms,
            topics,
        })
    }

    /// The number of partitions across all topics.
    pub fn partition_count(&self) -> usize {
        self.topics.iter().map(|t| t.partitions.len()).sum()
    }

    /// Encodes this request's body at `self.version` (for clients and tests). Record bytes
    /// are copied into the output.
    pub fn encode_body(&self, out: &mut BytesMut) {
        let flexible = api::is_flexible(api::PRODUCE, self.version);
        if self.version >= 3 {
            put_nullable_string(out, self.transactional_id.as_deref(), flexible);
        }
        out.put_i16(self.acks);
        out.put_i32(self.timeout_ms);
        put_array_len(out, self.topics.len(), flexible);
        for topic in &self.topics {
            put_string(out, &topic.name, flexible);
            put_array_len(out, topic.partitions.len(), flexible);
            for p in &topic.partitions {
                out.put_i32(p.index);
                put_bytes_len(out, p.records.as_ref().map(Bytes::len), flexible);
                if let Some(records) = &p.records {
                    out.put_slice(records);
                }
                if flexible {
                    out.put_u8(0);
                }
            }
            if flexible {
                out.put_u8(0);
            }
        }
        if flexible {
            out.put_u8(0);
        }
    }
}

/// Client side (load generator): encodes a whole Produce request frame as chunks — size
/// prefix + request header + fields in small buffers, each partition's records passed
/// through as the caller's `Bytes` (no copy). `view.version` selects the encoding.
pub fn encode_produce_request_chunks(
    header: &frame::RequestHeader,
    view: &ProduceRequestView,
) -> Result<Vec<Bytes>, WireError> {
    if header.api_key != api::PRODUCE || header.api_version != view.version {
        return Err(WireError::Invalid {
            field: "request header",
            offset: 0,
            reason: "not a Produce header of the view's version",
        });
    }
    let flexible = api::is_flexible(api::PRODUCE, view.version);
    let mut out = Vec::with_capacity(1 + 2 * view.partition_count());
    let mut buf = BytesMut::with_capacity(64 + 32 * view.partition_count());
    let start = frame::begin_frame(&mut buf);
    frame::encode_request_header(header, &mut buf)?;
    if view.version >= 3 {
        put_nullable_string(&mut buf, view.transactional_id.as_deref(), flexible);
    }
    buf.put_i16(view.acks);
    buf.put_i32(view.timeout_ms);
    put_array_len(&mut buf, view.topics.len(), flexible);
    for topic in &view.topics {
        put_string(&mut buf, &topic.name, flexible);
        put_array_len(&mut buf, topic.partitions.len(), flexible);
        for p in &topic.partitions {
            buf.put_i32(p.index);
            put_bytes_len(&mut buf, p.records.as_ref().map(Bytes::len), flexible);
            if let Some(records) = p.records.as_ref().filter(|r| !r.is_empty()) {
                out.push(buf.split().freeze());
                out.push(records.clone());
            }
            if flexible {
                buf.put_u8(0);
            }
        }
        if flexible {
            buf.put_u8(0);
        }
    }
    if flexible {
        buf.put_u8(0);
    }
    out.push(buf.split().freeze());
    patch_size_prefix(&mut out, start)?;
    out.retain(|c| !c.is_empty());
    Ok(out)
}

/// Writes the frame size into the first chunk (which holds the 4-byte prefix at `start`).
fn patch_size_prefix(chunks: &mut [Bytes], start: usize) -> Result<(), WireError> {
    let total: usize = chunks.iter().map(Bytes::len).sum();
    let size =
        i32::try_from(total - frame::SIZE_PREFIX_BYTES).map_err(|_| WireError::TooLarge {
            field: "produce request size",
            offset: 0,
            size: total as u64,
            max: i32::MAX as u64,
        })?;
    let Some(first) = chunks.first_mut() else {
        return Ok(());
    };
    let mut patched = BytesMut::from(&first[..]);
    patched[start..start + frame::SIZE_PREFIX_BYTES].copy_from_slice(&size.to_be_bytes());
    *first = patched.freeze();
    Ok(())
}

fn parse_topics(r: &mut Reader<'_>, flexible: bool) -> Result<Vec<ProduceTopic>, WireError> {
    let count = r
        .array_len("topic_data", flexible, min_topic_bytes(flexible))?
        .unwrap_or(0);
    let mut topics = Vec::with_capacity(count);
    let mut left = PARTITIONS_PER_PRODUCE_MAX;
    for _ in 0..count {
        let name = r.string("topic name", flexible)?;
        let partitions = parse_partitions(r, flexible, &mut left)?;
        if flexible {
            r.skip_tagged_fields()?;
        }
        topics.push(ProduceTopic { name, partitions });
    }
    Ok(topics)
}

/// One topic's partitions; `left` is how many more entries the request may name.
fn parse_partitions(
    r: &mut Reader<'_>,
    flexible: bool,
    left: &mut usize,
) -> Result<Vec<ProducePartition>, WireError> {
    let offset = r.position();
    let count = r
        .array_len("partition_data", flexible, min_partition_bytes(flexible))?
        .unwrap_or(0);
    let Some(still) = left.checked_sub(count) else {
        let named = PARTITIONS_PER_PRODUCE_MAX.saturating_sub(*left);
        return Err(WireError::TooLarge {
            field: "partitions in one produce request",
            offset,
            size: u64::try_from(named.saturating_add(count)).unwrap_or(u64::MAX),
            max: u64::try_from(PARTITIONS_PER_PRODUCE_MAX).unwrap_or(u64::MAX),
        });
    };
    *left = still;
    let mut partitions = Vec::with_capacity(count);
    for _ in 0..count {
        let index = r.i32("partition index")?;
        let records = r
            .nullable_bytes("records", flexible)?
            .map(|range| r.bytes_of(range));
        if flexible {
            r.skip_tagged_fields()?;
        }
        partitions.push(ProducePartition { index, records });
    }
    Ok(partitions)
}

/// One partition's result in a Produce response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducePartitionResponse {
    pub index: i32,
    pub error_code: i16,
    /// Offset of the first record appended, or -1.
    pub base_offset: i64,
    /// v2+: the append time if the topic uses LogAppendTime, else -1.
    pub log_append_time_ms: i64,
    /// v5+: the partition's log start offset.
    pub log_start_offset: i64,
    /// v8+: batches that failed (batch index, message).
    pub record_errors: Vec<(i32, Option<Bytes>)>,
    /// v8+: a message for the error code.
    pub error_message: Option<Bytes>,
}

impl Default for ProducePartitionResponse {
    fn default() -> Self {
        ProducePartitionResponse {
            index: 0,
            error_code: 0,
            base_offset: -1,
            log_append_time_ms: -1,
            log_start_offset: -1,
            record_errors: Vec::new(),
            error_message: None,
        }
    }
}

/// One topic's results.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProduceTopicResponse {
    pub name: Bytes,
    pub partitions: Vec<ProducePartitionResponse>,
}

/// A Produce response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProduceResponseParts {
    pub topics: Vec<ProduceTopicResponse>,
    /// v1+.
    pub throttle_time_ms: i32,
}

/// Encodes a whole Produce response frame (size prefix, response header, body) at
/// `version`, for every version weir advertises (v0–v9). Fields a version lacks are left
/// out, as Kafka does.
pub fn encode_produce_response(
    correlation_id: i32,
    version: i16,
    parts: &ProduceResponseParts,
) -> Result<Bytes, WireError> {
    if !api::is_supported(api::PRODUCE, version) {
        return Err(WireError::UnsupportedVersion {
            api_key: api::PRODUCE,
            api_version: version,
        });
    }
    let flexible = api::is_flexible(api::PRODUCE, version);
    let mut out = BytesMut::with_capacity(64 + 48 * parts.topics.len());
    let start = frame::begin_frame(&mut out);
    frame::encode_response_header(correlation_id, i16::from(flexible), &mut out);
    put_array_len(&mut out, parts.topics.len(), flexible);
    for topic in &parts.topics {
        put_string(&mut out, &topic.name, flexible);
        put_array_len(&mut out, topic.partitions.len(), flexible);
        for p in &topic.partitions {
            encode_partition_response(&mut out, p, version, flexible);
        }
        if flexible {
            out.put_u8(0);
        }
    }
    if version >= 1 {
        out.put_i32(parts.throttle_time_ms);
    }
    if flexible {
        out.put_u8(0);
    }
    frame::finish_frame(&mut out, start)?;
    Ok(out.freeze())
}

fn encode_partition_response(
    out: &mut BytesMut,
    p: &ProducePartitionResponse,
    version: i16,
    flexible: bool,
) {
    out.put_i32(p.index);
    out.put_i16(p.error_code);
    out.put_i64(p.base_offset);
    if version >= 2 {
        out.put_i64(p.log_append_time_ms);
    }
    if version >= 5 {
        out.put_i64(p.log_start_offset);
    }
    if version >= 8 {
        put_array_len(out, p.record_errors.len(), flexible);
        for (batch_index, message) in &p.record_errors {
            out.put_i32(*batch_index);
            put_nullable_string(out, message.as_deref(), flexible);
            if flexible {
                out.put_u8(0);
            }
        }
        put_nullable_string(out, p.error_message.as_deref(), flexible);
    }
    if flexible {
        out.put_u8(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(version: i16) -> ProduceRequestView {
        ProduceRequestView {
            version,
            transactional_id: (version >= 3 && version % 2 == 0)
                .then(|| Bytes::from_static(b"tx-1")),
            acks: -1,
            timeout_ms: 30_000,
            topics: vec![ProduceTopic {
                name: Bytes::from_static(b"events"),
                partitions: vec![
                    ProducePartition {
                        index: 0,
                        records: Some(Bytes::from_static(b"batch-bytes")),
                    },
                    ProducePartition {
                        index: 3,
                        records: None,
                    },
                ],
            }],
        }
    }

    #[test]
    fn roundtrips_every_version_and_records_are_zero_copy() {
        for version in 0..=9 {
            let view = sample(version);
            let mut out = BytesMut::new();
            view.encode_body(&mut out);
            let body = out.freeze();
            let parsed = ProduceRequestView::parse(&body, version).expect("parses");
            assert_eq!(parsed, view);
            let records = parsed.topics[0].partitions[0]
                .records
                .as_ref()
                .expect("present");
            let at = records.as_ptr() as usize - body.as_ptr() as usize;
            assert!(
                at < body.len(),
                "records must point into the request buffer"
            );
        }
    }

    #[test]
    fn truncation_anywhere_is_an_error() {
        for version in [0, 3, 9] {
            let mut out = BytesMut::new();
            sample(version).encode_body(&mut out);
            let body = out.freeze();
            for cut in 0..body.len() {
                assert!(ProduceRequestView::parse(&body.slice(..cut), version).is_err());
            }
        }
    }

    #[test]
    fn request_chunks_concatenate_to_the_copying_encoder() {
        for version in 0..=9 {
            let view = sample(version);
            let header = frame::RequestHeader {
                api_key: api::PRODUCE,
                api_version: version,
                correlation_id: 3,
                client_id: Some(Bytes::from_static(b"lg")),
            };
            let chunks = encode_produce_request_chunks(&header, &view).expect("encodes");
            let records = view.topics[0].partitions[0].records.as_ref().expect("some");
            assert!(
                chunks.iter().any(|c| c.as_ptr() == records.as_ptr()),
                "zero-copy"
            );
            let mut whole = BytesMut::new();
            for c in &chunks {
                whole.put_slice(c);
            }
            let mut expected = BytesMut::new();
            let start = frame::begin_frame(&mut expected);
            frame::encode_request_header(&header, &mut expected).expect("header");
            view.encode_body(&mut expected);
            frame::finish_frame(&mut expected, start).expect("size");
            assert_eq!(whole, expected, "v{version}");
        }
    }

    #[test]
    fn produce_response_v0_is_exact() {
        let parts = ProduceResponseParts {
            topics: vec![ProduceTopicResponse {
                name: Bytes::from_static(b"t"),
                partitions: vec![ProducePartitionResponse {
                    index: 2,
                    error_code: 43,
                    ..ProducePartitionResponse::default()
                }],
            }],
            throttle_time_ms: 5,
        };
        let v0 = encode_produce_response(7, 0, &parts).expect("encodes");
        let expected: &[u8] = &[
            0, 0, 0, 29, // size
            0, 0, 0, 7, // correlation id
            0, 0, 0, 1, 0, 1, b't', // one topic "t"
            0, 0, 0, 1, 0, 0, 0, 2, 0, 43, // one partition: index 2, error 43
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // base offset -1
        ];
        assert_eq!(&v0[..], expected);
        let v1 = encode_produce_response(7, 1, &parts).expect("encodes");
        assert_eq!(&v1[v1.len() - 4..], &5i32.to_be_bytes());
        let v2 = encode_produce_response(7, 2, &parts).expect("encodes");
        assert_eq!(v2.len(), v1.len() + 8);
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        // transactional_id null, acks 1, timeout, topics = i32::MAX.
        let body = Bytes::from_static(&[0xff, 0xff, 0, 1, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff]);
        assert!(matches!(
            ProduceRequestView::parse(&body, 3),
            Err(WireError::TooLarge { .. })
        ));
    }
}
