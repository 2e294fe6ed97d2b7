//! Produce requests written straight into one reused buffer: frame, header, body and each
//! record batch (records generated in place from their stamps), CRC-32C computed once over
//! the batch where it lies. No record value is allocated or copied on the way to the
//! socket, and the buffer is overwritten, not cleared: a batch whose records section starts
//! where the same batch of the previous request started already holds its records' fixed
//! bytes (lengths, offset deltas, value filler), so only each record's 28-byte stamp is
//! rewritten — the bytes written per request are the stamps and headers, not the values.
//!
//! The bytes are those `wire::batch::BatchBuilder` and `kafka-protocol`'s `ProduceRequest`
//! would produce (a unit test compares them, fresh and after any previous request), for
//! Produce v3..=9 (v9 is flexible).

use bytes::Bytes;
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
/// A key-less record: attributes, timestamp delta 0, and (after the offset delta) key
/// length -1, one byte each.
const KEYLESS_FIXED_BYTES: usize = 3;
/// Longest varint.
const VARINT_MAX_BYTES: usize = 5;

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

/// Offset deltas whose zigzag varint takes 1, 2, 3, 4 and 5 bytes: `[start, end)` each.
const DELTA_WIDTHS: [(usize, usize); 5] = [
    (0, 64),
    (64, 8_192),
    (8_192, 1 << 20),
    (1 << 20, 1 << 27),
    (1 << 27, usize::MAX),
];

/// A key-less record whose offset delta takes `delta_bytes`: (its whole length, where its
/// value, i.e. its stamp, starts in it). Every record of a width is laid out alike.
fn keyless_layout(delta_bytes: usize, value: usize) -> (usize, usize) {
    let value_len_bytes = varint_size(value as i32);
    // attributes, timestamp delta, offset delta, key -1, value length, value, 0 headers
    let body = KEYLESS_FIXED_BYTES + delta_bytes + value_len_bytes + value + 1;
    let len_bytes = varint_size(body as i32);
    let value_at = len_bytes + KEYLESS_FIXED_BYTES + delta_bytes + value_len_bytes;
    (len_bytes + body, value_at)
}

/// Length of the uncompressed records section.
pub fn records_len(recs: &[Rec], values: Values<'_>) -> usize {
    let value = values.size.max(payload::HEADER_BYTES);
    if recs.iter().all(|r| r.key.is_none()) {
        // Per width, not per record: the same sum.
        return DELTA_WIDTHS
            .iter()
            .enumerate()
            .map(|(w, &(lo, hi))| {
                let n = recs.len().min(hi).saturating_sub(lo);
                n * keyless_layout(w + 1, value).0
            })
            .sum();
    }
    recs.iter()
        .enumerate()
        .map(|(i, r)| record_len(i as i32, r.key.as_ref().map(Bytes::len), value).1)
        .sum()
}

/// Writes over a buffer from `pos` on, growing it where it runs out: what a previous
/// request left there is overwritten, never cleared first.
struct Cursor<'a> {
    buf: &'a mut Vec<u8>,
    pos: usize,
}

impl Cursor<'_> {
    fn put(&mut self, src: &[u8]) {
        debug_assert!(self.pos <= self.buf.len());
        let over = (self.buf.len() - self.pos).min(src.len());
        self.buf[self.pos..self.pos + over].copy_from_slice(&src[..over]);
        self.buf.extend_from_slice(&src[over..]);
        self.pos += src.len();
    }

    fn fill(&mut self, byte: u8, n: usize) {
        let over = (self.buf.len() - self.pos).min(n);
        self.buf[self.pos..self.pos + over].fill(byte);
        self.buf.resize(self.buf.len() + (n - over), byte);
        self.pos += n;
    }

    /// Steps over `n` bytes that already hold what belongs there.
    fn skip(&mut self, n: usize) {
        assert!(
            self.pos + n <= self.buf.len(),
            "skipping past the written bytes"
        );
        self.pos += n;
    }

    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }

    fn i16(&mut self, v: i16) {
        self.put(&v.to_be_bytes());
    }

    fn i32(&mut self, v: i32) {
        self.put(&v.to_be_bytes());
    }

    fn i64(&mut self, v: i64) {
        self.put(&v.to_be_bytes());
    }

    fn varint(&mut self, v: i32) {
        let mut tmp = [0u8; VARINT_MAX_BYTES];
        let mut rest = &mut tmp[..];
        put_varint(&mut rest, v);
        let n = VARINT_MAX_BYTES - rest.len();
        self.put(&tmp[..n]);
    }

    fn uvarint(&mut self, v: u32) {
        let mut tmp = [0u8; VARINT_MAX_BYTES];
        let mut rest = &mut tmp[..];
        put_uvarint(&mut rest, v);
        let n = VARINT_MAX_BYTES - rest.len();
        self.put(&tmp[..n]);
    }

    /// An array count or a bytes length: i32, or compact (uvarint of n + 1) when flexible.
    fn len(&mut self, n: usize, flexible: bool) {
        if flexible {
            self.uvarint(n as u32 + 1);
        } else {
            self.i32(n as i32);
        }
    }
}

/// Writes the uncompressed records section at the cursor. The first `in_place` records
/// (key-less, same value size and filler, at the same place as before) already hold all
/// but their stamps.
fn write_records(cur: &mut Cursor<'_>, recs: &[Rec], values: Values<'_>, in_place: usize) {
    let value = values.size.max(payload::HEADER_BYTES);
    let in_place = in_place.min(recs.len());
    for (w, &(lo, hi)) in DELTA_WIDTHS.iter().enumerate() {
        let end = hi.min(in_place);
        if lo >= end {
            break;
        }
        let (len, value_at) = keyless_layout(w + 1, value);
        let span = len * (end - lo);
        let at = cur.pos;
        cur.skip(span);
        for (slot, r) in cur.buf[at..at + span]
            .chunks_exact_mut(len)
            .zip(&recs[lo..end])
        {
            debug_assert!(r.key.is_none());
            slot[value_at..value_at + payload::HEADER_BYTES]
                .copy_from_slice(&payload::header(r.stamp));
        }
    }
    let filler = payload::filler_used(value, values.filler);
    for (i, r) in recs.iter().enumerate().skip(in_place) {
        let delta = i as i32;
        let key = r.key.as_deref();
        let (body, _) = record_len(delta, key.map(<[u8]>::len), value);
        cur.varint(body as i32);
        cur.u8(0); // attributes
        cur.u8(0); // timestamp delta 0: one timestamp per batch
        cur.varint(delta);
        match key {
            Some(k) => {
                cur.varint(k.len() as i32);
                cur.put(k);
            }
            None => cur.varint(-1),
        }
        cur.varint(value as i32);
        cur.put(&payload::header(r.stamp));
        cur.put(filler);
        cur.fill(b'x', value - payload::HEADER_BYTES - filler.len());
        cur.u8(0); // no headers
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

    /// Whether its records section may be written over an earlier one in place.
    fn plain(&self) -> bool {
        self.compressed.is_none() && self.recs.iter().all(|r| r.key.is_none())
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
    write_records(
        &mut Cursor {
            buf: scratch,
            pos: 0,
        },
        recs,
        values,
        0,
    );
    compress(codec, scratch, SnappyFraming::default())
}

/// Writes one record batch v2 of `total` bytes ([`BatchSource::len`]) at the cursor
/// (`in_place` as in [`write_records`]) and fills in its CRC over the bytes where they lie.
fn write_batch(
    cur: &mut Cursor<'_>,
    b: &BatchSource<'_>,
    values: Values<'_>,
    in_place: usize,
    total: usize,
) {
    let start = cur.pos;
    let count = b.recs.len() as i32;
    let f = &b.fields;
    cur.i64(0); // base offset
    cur.i32((total - LOG_OVERHEAD) as i32);
    cur.i32(-1); // partition leader epoch
    cur.u8(MAGIC_V2);
    cur.i32(0); // CRC, below
    let txn_bit = if f.transactional {
        Attributes::TRANSACTIONAL_BIT
    } else {
        0
    };
    cur.i16(f.compression.bits() | txn_bit);
    cur.i32((count - 1).max(0));
    cur.i64(f.timestamp_ms);
    cur.i64(f.timestamp_ms);
    cur.i64(f.producer_id.get());
    cur.i16(f.producer_epoch.get());
    let seq = if f.producer_id.is_some() {
        f.base_sequence
    } else {
        Sequence::NONE
    };
    cur.i32(seq.get());
    cur.i32(count);
    match b.compressed {
        Some(c) => cur.put(c),
        None => write_records(cur, b.recs, values, in_place),
    }
    debug_assert_eq!(cur.pos - start, total, "batch length as computed");
    let crc = crc32c::crc32c(&cur.buf[start + CRC_START..cur.pos]);
    cur.buf[start + CRC_AT.start..start + CRC_AT.end].copy_from_slice(&crc.to_be_bytes());
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

/// Where the previous request left a plain batch's records section: `count` key-less
/// records starting at `records_at`.
#[derive(Clone, Copy, Debug)]
struct Slot {
    records_at: usize,
    count: usize,
}

/// The request buffer of one producer, reused for every request: it keeps its bytes (and
/// capacity), and remembers where the previous request's plain batches lie, so the next
/// request writes only what differs.
#[derive(Debug, Default)]
pub struct RequestBuf {
    /// Every byte up to the high-water mark is initialised; the frame is `..frame_len`.
    bytes: Vec<u8>,
    frame_len: usize,
    /// Per batch index of the previous request (`None`: not plain).
    slots: Vec<Option<Slot>>,
    /// The value size and filler the slots were written with.
    value_size: usize,
    filler: Vec<u8>,
}

impl RequestBuf {
    /// The frame written last (size prefix included).
    pub fn frame(&self) -> &[u8] {
        &self.bytes[..self.frame_len]
    }

    /// Forgets the slots unless `values` are those they were written with.
    fn check_values(&mut self, values: Values<'_>) {
        let filler = payload::filler_used(values.size, values.filler);
        if self.value_size != values.size || self.filler[..] != *filler {
            self.slots.clear();
            self.value_size = values.size;
            self.filler.clear();
            self.filler.extend_from_slice(filler);
        }
    }

    /// Writes a whole Produce request frame (size prefix included): one topic, one batch
    /// per partition. Returns the frame.
    pub fn write(
        &mut self,
        req: RequestFields<'_>,
        batches: &[(i32, BatchSource<'_>)],
        values: Values<'_>,
    ) -> &[u8] {
        self.check_values(values);
        let mut cur = Cursor {
            buf: &mut self.bytes,
            pos: 0,
        };
        let flexible = write_request_head(&mut cur, req, batches.len());
        let mut slots = Vec::with_capacity(batches.len());
        for (j, (partition, b)) in batches.iter().enumerate() {
            let total = b.len(values);
            cur.i32(*partition);
            cur.len(total, flexible);
            let records_at = cur.pos + BATCH_HEADER_SIZE;
            let plain = b.plain();
            let in_place = match self.slots.get(j) {
                Some(Some(s)) if plain && s.records_at == records_at => s.count.min(b.recs.len()),
                _ => 0,
            };
            write_batch(&mut cur, b, values, in_place, total);
            slots.push(plain.then_some(Slot {
                records_at,
                count: b.recs.len(),
            }));
            if flexible {
                cur.u8(0); // partition tagged fields
            }
        }
        if flexible {
            cur.u8(0); // topic tagged fields
            cur.u8(0); // request tagged fields
        }
        let frame_len = cur.pos;
        self.bytes[..4].copy_from_slice(&((frame_len - 4) as i32).to_be_bytes());
        self.frame_len = frame_len;
        self.slots = slots;
        self.frame()
    }
}

/// Writes the size prefix (0, filled in at the end), the request header and the body up
/// to the partition array's length. Returns whether the version is flexible.
fn write_request_head(cur: &mut Cursor<'_>, req: RequestFields<'_>, batches: usize) -> bool {
    let flexible = req.version >= FIRST_FLEXIBLE;
    cur.i32(0); // size prefix, at the end
    // Request header v1 (v2 when flexible: plus empty tagged fields).
    cur.i16(api::PRODUCE);
    cur.i16(req.version);
    cur.i32(req.correlation_id);
    cur.i16(CLIENT_ID.len() as i16);
    cur.put(CLIENT_ID);
    if flexible {
        cur.u8(0);
    }
    match (req.transactional_id, flexible) {
        (None, true) => cur.uvarint(0),
        (None, false) => cur.i16(-1),
        (Some(t), true) => {
            cur.uvarint(t.len() as u32 + 1);
            cur.put(t.as_bytes());
        }
        (Some(t), false) => {
            cur.i16(t.len() as i16);
            cur.put(t.as_bytes());
        }
    }
    cur.i16(req.acks);
    cur.i32(req.timeout_ms);
    cur.len(1, flexible); // one topic
    if flexible {
        cur.uvarint(req.topic.len() as u32 + 1);
    } else {
        cur.i16(req.topic.len() as i16);
    }
    cur.put(req.topic.as_bytes());
    cur.len(batches, flexible);
    flexible
}

/// Bytes [`RequestBuf::write`] writes for these batches (for sizing tests and buffers).
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

    fn fields(pid: i64, codec: Compression, txn: bool) -> BatchFields {
        BatchFields {
            producer_id: ProducerId(pid),
            producer_epoch: ProducerEpoch(if pid < 0 { -1 } else { 3 }),
            base_sequence: Sequence(if pid < 0 { -1 } else { 11 }),
            timestamp_ms: 1_700_000_000_123,
            compression: codec,
            transactional: txn,
        }
    }

    fn request(version: i16, txn: Option<&str>) -> RequestFields<'_> {
        RequestFields {
            version,
            correlation_id: 77,
            acks: -1,
            timeout_ms: 30_000,
            topic: "topic-x",
            transactional_id: txn,
        }
    }

    /// Writes `data` with `buf` and checks the frame against the reference encoders.
    fn check(
        buf: &mut RequestBuf,
        req: RequestFields<'_>,
        data: &[(i32, BatchFields, Vec<Rec>)],
        values: Values<'_>,
        what: &str,
    ) {
        let mut scratch = Vec::new();
        let compressed: Vec<Option<Vec<u8>>> = data
            .iter()
            .map(|(_, f, rs)| {
                (f.compression != Compression::None)
                    .then(|| compress_records(f.compression, rs, values, &mut scratch).unwrap())
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
        let out = buf.write(req, &batches, values).to_vec();
        let want = reference(req, data, values);
        assert_eq!(out.len(), request_len(req, &batches, values), "{what}");
        assert!(out[..] == want[..], "{what}: bytes differ");
    }

    fn filler() -> Vec<u8> {
        (0..300u32).map(|i| b'a' + (i % 26) as u8).collect()
    }

    #[test]
    fn requests_match_builder_and_kafka_protocol_byte_for_byte() {
        let filler = filler();
        // One buffer for every case (so each is written over the one before) and a fresh
        // one per case: both must give the reference bytes.
        let mut reused = RequestBuf::default();
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
                let f = fields(pid, codec, txn.is_some());
                let req = request(version, txn);
                let data = vec![(0, f, recs(3, keyed)), (5, f, recs(200, keyed))];
                let what = format!("v{version} keyed={keyed} {codec:?}");
                check(&mut RequestBuf::default(), req, &data, values, &what);
                check(&mut reused, req, &data, values, &format!("{what}, reused"));
            }
        }
        // And the batches pass the broker's own validation (CRC included).
        let values = Values {
            size: 1024,
            filler: &filler,
        };
        let rs = recs(10, false);
        let src = BatchSource {
            fields: fields(-1, Compression::None, false),
            recs: &rs,
            compressed: None,
        };
        let mut b = Vec::new();
        let total = src.len(values);
        write_batch(
            &mut Cursor {
                buf: &mut b,
                pos: 0,
            },
            &src,
            values,
            0,
            total,
        );
        assert!(validate_batch(&b).is_ok());
    }

    /// Records of one run numbered from `first` (so two requests differ in every stamp).
    fn recs_from(first: u64, n: u64) -> Vec<Rec> {
        (first..first + n)
            .map(|i| Rec {
                stamp: Stamp {
                    run_id: 42,
                    record_id: i,
                    intended_ns: 5_000 + 3 * i,
                },
                key: None,
            })
            .collect()
    }

    #[test]
    fn keyless_records_len_per_width_is_the_per_record_sum() {
        let filler = filler();
        for size in [28, 100, 1000, 20_000] {
            let values = Values {
                size,
                filler: &filler,
            };
            for n in [0, 1, 63, 64, 65, 8_191, 8_192, 8_193, 10_000] {
                let rs = recs_from(0, n);
                let per_record: usize = (0..n as i32)
                    .map(|i| record_len(i, None, size.max(payload::HEADER_BYTES)).1)
                    .sum();
                assert_eq!(
                    records_len(&rs, values),
                    per_record,
                    "size {size}, {n} records"
                );
            }
        }
    }

    #[test]
    fn a_request_written_over_another_has_the_same_bytes_as_a_fresh_one() {
        let filler = filler();
        let long: Vec<u8> = (0..2000u32).map(|i| b'A' + (i % 7) as u8).collect();
        let v = |size: usize, filler: &[u8]| -> (usize, Vec<u8>) { (size, filler.to_vec()) };
        let f = fields(7, Compression::None, false);
        let keyed = |first: u64, n: u64| {
            let mut r = recs_from(first, n);
            r[n as usize / 2].key = Some(Bytes::from_static(b"key"));
            r
        };
        // (version, value size and filler, batches): the same layout again (only stamps
        // differ), fewer and more records, a second batch, a changed value size, a changed
        // filler, a keyed record, a compressed batch, a flexible version (prefix shifts).
        type Step = (i16, (usize, Vec<u8>), Vec<(i32, BatchFields, Vec<Rec>)>);
        let steps: Vec<Step> = vec![
            (8, v(1000, &filler), vec![(0, f, recs_from(0, 70))]),
            (8, v(1000, &filler), vec![(0, f, recs_from(70, 70))]),
            (8, v(1000, &filler), vec![(0, f, recs_from(140, 20))]),
            (8, v(1000, &filler), vec![(0, f, recs_from(160, 150))]),
            (
                8,
                v(1000, &filler),
                vec![(0, f, recs_from(1, 150)), (1, f, recs_from(9, 9))],
            ),
            (
                8,
                v(1000, &filler),
                vec![(0, f, recs_from(2, 150)), (1, f, recs_from(8, 12))],
            ),
            (8, v(1001, &filler), vec![(0, f, recs_from(3, 150))]),
            (8, v(1001, &long), vec![(0, f, recs_from(4, 150))]),
            (8, v(1001, &long), vec![(0, f, keyed(5, 150))]),
            (8, v(1001, &long), vec![(0, f, recs_from(6, 150))]),
            (
                8,
                v(1001, &long),
                vec![(0, fields(7, Compression::Gzip, false), recs_from(7, 150))],
            ),
            (8, v(1001, &long), vec![(0, f, recs_from(8, 150))]),
            (9, v(1001, &long), vec![(0, f, recs_from(9, 150))]),
            (9, v(1001, &long), vec![(0, f, recs_from(10, 150))]),
            (9, v(28, &long), vec![(0, f, recs_from(11, 150))]),
            (9, v(28, &long), vec![(0, f, recs_from(12, 150))]),
            // Past 64 and 8,192 records the offset delta's varint widens.
            (9, v(28, &long), vec![(0, f, recs_from(13, 8_300))]),
            (9, v(28, &long), vec![(0, f, recs_from(14, 8_300))]),
            (9, v(28, &long), vec![(0, f, recs_from(15, 8_200))]),
            (9, v(28, &long), vec![(0, f, recs_from(16, 8_250))]),
        ];
        let mut buf = RequestBuf::default();
        for (n, (version, (size, fill), data)) in steps.iter().enumerate() {
            let values = Values {
                size: *size,
                filler: fill,
            };
            check(
                &mut buf,
                request(*version, None),
                data,
                values,
                &format!("step {n}"),
            );
        }
    }
}
