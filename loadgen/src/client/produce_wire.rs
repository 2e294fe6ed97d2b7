//! Produce requests written straight into one reused buffer: frame, header, body and each
//! record batch (records generated in place from their stamps), CRC-32C computed once over
//! the batch where it lies. No record value is allocated or copied on the way to the
//! socket; the buffer keeps its capacity from request to request.
//!
//! The bytes are those `wire::batch::BatchBuilder` and `kafka-protocol`'s `ProduceRequest`
//! would produce (a unit test compares them), for Produce v3..=9 (v9 is flexible).

use bytes::{BufMut, Bytes};
use wire::batch::{Attributes, BATCH_HEADER_SIZE, Compression, SnappyFraming, compress};
use wire::codec::{put_uvarint, put_varint, uvarint_size, varint_size};
use wire::{ProducerEpoch, ProducerId, Sequence, api};

use super::payload::{self, Stamp};

/// Where the CRC-covered bytes of a batch begin (attributes .. end).
const CRC_START: usize = 21;
/// The CRC field's place in a batch.
const CRC_AT: std::ops::Range<usize> = 17..21;
/// Batch length field (after base offset) counts from here.
const LOG_OVERHEAD: usize = 12;
const MAGIC_V2: u8 = 2;
/// First flexible Produce version (compact strings/arrays, tagged fields, header v2).
const FIRST_FLEXIBLE: i16 = 9;
/// Client id written in every request header.
pub const CLIENT_ID: &[u8] = b"weir-loadgen";

/// One record as the producer keeps it: its stamp and optional key; the value is
/// `payload::write(stamp, value_size)` and is generated only when it goes on the wire.
#[derive(Clone, Debug)]
pub struct Rec {
    pub stamp: Stamp,
    pub key: Option<Bytes>,
}

/// The batch-level fields of one batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchFields {
    pub producer_id: ProducerId,
    pub producer_epoch: ProducerEpoch,
    pub base_sequence: Sequence,
    pub timestamp_ms: i64,
    pub compression: Compression,
    /// Part of a transaction (attributes bit 4).
    pub transactional: bool,
}

/// What the value of each record is made of.
#[derive(Clone, Copy, Debug)]
pub struct Values<'a> {
    pub size: usize,
    pub filler: &'a [u8],
}

fn bytes_size(len: Option<usize>) -> usize {
    len.map_or(1, |n| varint_size(n as i32) + n)
}

/// (record body length, whole record length with its length varint).
fn record_len(offset_delta: i32, key: Option<usize>, value: usize) -> (usize, usize) {
    // attributes (1) + timestamp delta varlong 0 (1) + offset delta + key + value + 0 headers
    let body = 1 + 1 + varint_size(offset_delta) + bytes_size(key) + bytes_size(Some(value)) + 1;
    (body, varint_size(body as i32) + body)
}

/// Length of the uncompressed records section.
pub fn records_len(recs: &[Rec], values: Values<'_>) -> usize {
    let value = values.size.max(payload::HEADER_BYTES);
    recs.iter()
        .enumerate()
        .map(|(i, r)| record_len(i as i32, r.key.as_ref().map(Bytes::len), value).1)
        .sum()
}

/// Appends the uncompressed records section.
pub fn write_records(out: &mut Vec<u8>, recs: &[Rec], values: Values<'_>) {
    let value = values.size.max(payload::HEADER_BYTES);
    for (i, r) in recs.iter().enumerate() {
        let delta = i as i32;
        let key = r.key.as_deref();
        let (body, _) = record_len(delta, key.map(<[u8]>::len), value);
        put_varint(out, body as i32);
        out.put_u8(0); // attributes
        out.put_u8(0); // timestamp delta 0: one timestamp per batch
        put_varint(out, delta);
        match key {
            Some(k) => {
                put_varint(out, k.len() as i32);
                out.put_slice(k);
            }
            None => put_varint(out, -1),
        }
        put_varint(out, value as i32);
        payload::write(r.stamp, value, values.filler, out);
        out.put_u8(0); // no headers
    }
}

/// A batch ready to be written: its records, or (compressed) its records section.
pub struct BatchSource<'a> {
    pub fields: BatchFields,
    pub recs: &'a [Rec],
    /// The compressed records section, for a compressed batch.
    pub compressed: Option<&'a [u8]>,
}

impl BatchSource<'_> {
    /// Whole batch length in bytes.
    pub fn len(&self, values: Values<'_>) -> usize {
        BATCH_HEADER_SIZE
            + match self.compressed {
                Some(c) => c.len(),
                None => records_len(self.recs, values),
            }
    }
}

/// Compresses a batch's records section (done once, when the batch is sealed, so a retry
/// sends the same bytes).
pub fn compress_records(
    codec: Compression,
    recs: &[Rec],
    values: Values<'_>,
    scratch: &mut Vec<u8>,
) -> Result<Vec<u8>, wire::WireError> {
    scratch.clear();
    write_records(scratch, recs, values);
    compress(codec, scratch, SnappyFraming::default())
}

/// Appends one record batch v2 and fills in its CRC over the bytes where they lie.
pub fn write_batch(out: &mut Vec<u8>, b: &BatchSource<'_>, values: Values<'_>) {
    let start = out.len();
    let total = b.len(values);
    let count = b.recs.len() as i32;
    let f = &b.fields;
    out.reserve(total);
    out.put_i64(0); // base offset
    out.put_i32((total - LOG_OVERHEAD) as i32);
    out.put_i32(-1); // partition leader epoch
    out.put_u8(MAGIC_V2);
    out.put_u32(0); // CRC, below
    let txn_bit = if f.transactional {
        Attributes::TRANSACTIONAL_BIT
    } else {
        0
    };
    out.put_i16(f.compression.bits() | txn_bit);
    out.put_i32((count - 1).max(0));
    out.put_i64(f.timestamp_ms);
    out.put_i64(f.timestamp_ms);
    out.put_i64(f.producer_id.get());
    out.put_i16(f.producer_epoch.get());
    let seq = if f.producer_id.is_some() {
        f.base_sequence
    } else {
        Sequence::NONE
    };
    out.put_i32(seq.get());
    out.put_i32(count);
    match b.compressed {
        Some(c) => out.put_slice(c),
        None => write_records(out, b.recs, values),
    }
    debug_assert_eq!(out.len() - start, total, "batch length as computed");
    let crc = crc32c::crc32c(&out[start + CRC_START..]);
    out[start + CRC_AT.start..start + CRC_AT.end].copy_from_slice(&crc.to_be_bytes());
}

/// The request-level fields of a Produce request.
#[derive(Clone, Copy, Debug)]
pub struct RequestFields<'a> {
    pub version: i16,
    pub correlation_id: i32,
    pub acks: i16,
    pub timeout_ms: i32,
    pub topic: &'a str,
    /// The transactional.id of a transactional producer; `None` otherwise.
    pub transactional_id: Option<&'a str>,
}

/// Writes a whole Produce request frame (size prefix included) into `out`, replacing what
/// was there but keeping its capacity: one topic, one batch per partition.
pub fn write_request(
    out: &mut Vec<u8>,
    req: RequestFields<'_>,
    batches: &[(i32, BatchSource<'_>)],
    values: Values<'_>,
) {
    let flexible = req.version >= FIRST_FLEXIBLE;
    out.clear();
    out.put_i32(0); // size prefix, below
    // Request header v1 (v2 when flexible: plus empty tagged fields).
    out.put_i16(api::PRODUCE);
    out.put_i16(req.version);
    out.put_i32(req.correlation_id);
    out.put_i16(CLIENT_ID.len() as i16);
    out.put_slice(CLIENT_ID);
    if flexible {
        out.put_u8(0);
    }
    match (req.transactional_id, flexible) {
        (None, true) => put_uvarint(out, 0),
        (None, false) => out.put_i16(-1),
        (Some(t), true) => {
            put_uvarint(out, t.len() as u32 + 1);
            out.put_slice(t.as_bytes());
        }
        (Some(t), false) => {
            out.put_i16(t.len() as i16);
            out.put_slice(t.as_bytes());
        }
    }
    out.put_i16(req.acks);
    out.put_i32(req.timeout_ms);
    put_len(out, 1, flexible); // one topic
    if flexible {
        put_uvarint(out, req.topic.len() as u32 + 1);
    } else {
        out.put_i16(req.topic.len() as i16);
    }
    out.put_slice(req.topic.as_bytes());
    put_len(out, batches.len(), flexible);
    for (partition, b) in batches {
        out.put_i32(*partition);
        put_len(out, b.len(values), flexible);
        write_batch(out, b, values);
        if flexible {
            out.put_u8(0); // partition tagged fields
        }
    }
    if flexible {
        out.put_u8(0); // topic tagged fields
        out.put_u8(0); // request tagged fields
    }
    let size = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&size.to_be_bytes());
}

/// An array count or a bytes length: i32, or compact (uvarint of n + 1) when flexible.
fn put_len(out: &mut Vec<u8>, n: usize, flexible: bool) {
    if flexible {
        put_uvarint(out, n as u32 + 1);
    } else {
        out.put_i32(n as i32);
    }
}

/// Bytes [`write_request`] writes for these batches (for sizing tests and buffers).
pub fn request_len(
    req: RequestFields<'_>,
    batches: &[(i32, BatchSource<'_>)],
    values: Values<'_>,
) -> usize {
    let flexible = req.version >= FIRST_FLEXIBLE;
    let len = |n: usize| {
        if flexible {
            uvarint_size(n as u32 + 1)
        } else {
            4
        }
    };
    let mut n = 4 + 2 + 2 + 4 + 2 + CLIENT_ID.len() + usize::from(flexible);
    n += match req.transactional_id {
        None if flexible => 1,
        None => 2,
        Some(t) if flexible => uvarint_size(t.len() as u32 + 1) + t.len(),
        Some(t) => 2 + t.len(),
    };
    n += 2 + 4 + len(1);
    n += if flexible {
        uvarint_size(req.topic.len() as u32 + 1)
    } else {
        2
    } + req.topic.len();
    n += len(batches.len());
    for (_, b) in batches {
        let bl = b.len(values);
        n += 4 + len(bl) + bl + usize::from(flexible);
    }
    n + 2 * usize::from(flexible)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use wire::batch::{BatchBuilder, NewRecord, validate_batch};

    fn recs(n: u64, keyed: bool) -> Vec<Rec> {
        (0..n)
            .map(|i| Rec {
                stamp: Stamp {
                    run_id: 42,
                    record_id: i,
                    intended_ns: 1_000 + i,
                },
                key: keyed.then(|| Bytes::from(format!("k{i}"))),
            })
            .collect()
    }

    /// The old path: values allocated per record, BatchBuilder, kafka-protocol's encoder.
    fn reference(
        req: RequestFields<'_>,
        batches: &[(i32, BatchFields, Vec<Rec>)],
        values: Values<'_>,
    ) -> Bytes {
        let mut t = TopicProduceData::default();
        t.name = TopicName(StrBytes::from_string(req.topic.to_string()));
        for (p, f, rs) in batches {
            let builder = BatchBuilder {
                producer_id: f.producer_id,
                producer_epoch: f.producer_epoch,
                base_sequence: if f.producer_id.is_some() {
                    f.base_sequence
                } else {
                    Sequence::NONE
                },
                compression: f.compression,
                transactional: f.transactional,
                records: rs
                    .iter()
                    .map(|r| NewRecord {
                        timestamp_ms: f.timestamp_ms,
                        key: r.key.clone(),
                        value: Some(payload::encode(r.stamp, values.size, values.filler)),
                        headers: Vec::new(),
                    })
                    .collect(),
                ..BatchBuilder::default()
            };
            let mut pd = PartitionProduceData::default();
            pd.index = *p;
            pd.records = Some(builder.build().unwrap());
            t.partition_data.push(pd);
        }
        let mut r = ProduceRequest::default();
        r.acks = req.acks;
        r.timeout_ms = req.timeout_ms;
        r.transactional_id = req
            .transactional_id
            .map(|t| kafka_protocol::messages::TransactionalId(StrBytes::from_string(t.into())));
        r.topic_data = vec![t];
        super::super::conn::encode_request(&r, req.version, req.correlation_id).unwrap()
    }

    #[test]
    fn requests_match_builder_and_kafka_protocol_byte_for_byte() {
        let filler: Vec<u8> = (0..300u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        for version in [3, 7, 8, 9] {
            for (keyed, codec, pid, txn) in [
                (false, Compression::None, -1, None),
                (true, Compression::None, 7, None),
                (false, Compression::Gzip, -1, None),
                (true, Compression::Lz4, 9, None),
                (false, Compression::None, 7, Some("txn-a")),
                (true, Compression::Gzip, 9, Some("txn-b")),
            ] {
                let values = Values {
                    size: 500, // longer than the filler: padded with 'x'
                    filler: &filler,
                };
                let fields = BatchFields {
                    producer_id: ProducerId(pid),
                    producer_epoch: ProducerEpoch(if pid < 0 { -1 } else { 3 }),
                    base_sequence: Sequence(if pid < 0 { -1 } else { 11 }),
                    timestamp_ms: 1_700_000_000_123,
                    compression: codec,
                    transactional: txn.is_some(),
                };
                let req = RequestFields {
                    version,
                    correlation_id: 77,
                    acks: -1,
                    timeout_ms: 30_000,
                    topic: "topic-x",
                    transactional_id: txn,
                };
                let data = vec![(0, fields, recs(3, keyed)), (5, fields, recs(200, keyed))];
                let compressed: Vec<Option<Vec<u8>>> = data
                    .iter()
                    .map(|(_, f, rs)| {
                        (f.compression != Compression::None).then(|| {
                            compress_records(f.compression, rs, values, &mut scratch).unwrap()
                        })
                    })
                    .collect();
                let batches: Vec<(i32, BatchSource<'_>)> = data
                    .iter()
                    .zip(&compressed)
                    .map(|((p, f, rs), c)| {
                        let src = BatchSource {
                            fields: *f,
                            recs: rs,
                            compressed: c.as_deref(),
                        };
                        (*p, src)
                    })
                    .collect();
                write_request(&mut out, req, &batches, values);
                let want = reference(req, &data, values);
                assert_eq!(out.len(), request_len(req, &batches, values));
                assert!(
                    out[..] == want[..],
                    "v{version} keyed={keyed} {codec:?}: bytes differ"
                );
            }
        }
        // And the batches pass the broker's own validation (CRC included).
        let values = Values {
            size: 1024,
            filler: &filler,
        };
        let rs = recs(10, false);
        let mut b = Vec::new();
        let src = BatchSource {
            fields: BatchFields {
                producer_id: ProducerId::NONE,
                producer_epoch: ProducerEpoch(-1),
                base_sequence: Sequence::NONE,
                timestamp_ms: 5,
                compression: Compression::None,
                transactional: false,
            },
            recs: &rs,
            compressed: None,
        };
        write_batch(&mut b, &src, values);
        assert!(validate_batch(&b).is_ok());
    }
}
