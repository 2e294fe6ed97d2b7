//! The Produce request, hand-parsed for the hot path: every partition's records stay a
//! `Bytes` slice of the request buffer (no copy), ready to validate in place and append.
//!
//! Layout, v3–v8 (classic encodings) and v9+ (flexible: compact lengths, tagged fields):
//!
//! ```text
//! transactional_id  nullable string
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

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::{Reader, put_array_len, put_bytes_len, put_nullable_string, put_string};
use crate::{WireError, api};

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
        let transactional_id = r.nullable_string("transactional_id", flexible)?;
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
        put_nullable_string(out, self.transactional_id.as_deref(), flexible);
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

fn parse_topics(r: &mut Reader<'_>, flexible: bool) -> Result<Vec<ProduceTopic>, WireError> {
    let count = r
        .array_len("topic_data", flexible, min_topic_bytes(flexible))?
        .unwrap_or(0);
    let mut topics = Vec::with_capacity(count);
    for _ in 0..count {
        let name = r.string("topic name", flexible)?;
        let partitions = parse_partitions(r, flexible)?;
        if flexible {
            r.skip_tagged_fields()?;
        }
        topics.push(ProduceTopic { name, partitions });
    }
    Ok(topics)
}

fn parse_partitions(
    r: &mut Reader<'_>,
    flexible: bool,
) -> Result<Vec<ProducePartition>, WireError> {
    let count = r
        .array_len("partition_data", flexible, min_partition_bytes(flexible))?
        .unwrap_or(0);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(version: i16) -> ProduceRequestView {
        ProduceRequestView {
            version,
            transactional_id: (version % 2 == 0).then(|| Bytes::from_static(b"tx-1")),
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
        for version in 3..=9 {
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
        for version in [3, 9] {
            let mut out = BytesMut::new();
            sample(version).encode_body(&mut out);
            let body = out.freeze();
            for cut in 0..body.len() {
                assert!(ProduceRequestView::parse(&body.slice(..cut), version).is_err());
            }
        }
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
