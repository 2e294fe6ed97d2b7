//! A record batch v2 builder, for the load generator and tests: records with keys, values,
//! headers and timestamps; producer id/epoch/sequence; transactional and control flags;
//! any compression codec. The output passes [`crate::batch::validate_batch`].

use bytes::{BufMut, Bytes, BytesMut};

use crate::WireError;
use crate::batch::compression::{SnappyFraming, compress};
use crate::batch::header::{Attributes, BATCH_HEADER_SIZE, Compression, LOG_OVERHEAD, MAGIC_V2};
use crate::codec::{put_varint, put_varlong, varint_size, varlong_size};
use crate::types::{LeaderEpoch, Offset, ProducerEpoch, ProducerId, Sequence};

/// Where the CRC-covered bytes begin.
const CRC_START: usize = 21;

/// One record to put into a batch. Its offset is its position in the batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewRecord {
    /// Absolute timestamp (ms); the batch stores it as a delta.
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

impl NewRecord {
    /// A record with a value only.
    pub fn value(timestamp_ms: i64, value: impl Into<Bytes>) -> NewRecord {
        NewRecord {
            timestamp_ms,
            value: Some(value.into()),
            ..NewRecord::default()
        }
    }
}

/// The batch-level fields. Defaults describe a plain producer's batch: no producer id,
/// no sequence, CreateTime, no compression.
#[derive(Clone, Debug)]
pub struct BatchBuilder {
    pub base_offset: Offset,
    pub partition_leader_epoch: LeaderEpoch,
    pub producer_id: ProducerId,
    pub producer_epoch: ProducerEpoch,
    pub base_sequence: Sequence,
    pub compression: Compression,
    pub snappy_framing: SnappyFraming,
    pub log_append_time: bool,
    pub transactional: bool,
    pub control: bool,
    pub records: Vec<NewRecord>,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        BatchBuilder {
            base_offset: Offset(0),
            partition_leader_epoch: LeaderEpoch::NONE,
            producer_id: ProducerId::NONE,
            producer_epoch: ProducerEpoch(-1),
            base_sequence: Sequence::NONE,
            compression: Compression::None,
            snappy_framing: SnappyFraming::default(),
            log_append_time: false,
            transactional: false,
            control: false,
            records: Vec::new(),
        }
    }
}

impl BatchBuilder {
    fn attributes(&self) -> i16 {
        let mut bits = self.compression.bits();
        if self.log_append_time {
            bits |= Attributes::TIMESTAMP_TYPE_BIT;
        }
        if self.transactional {
            bits |= Attributes::TRANSACTIONAL_BIT;
        }
        if self.control {
            bits |= Attributes::CONTROL_BIT;
        }
        bits
    }

    fn base_timestamp(&self) -> i64 {
        self.records
            .iter()
            .map(|r| r.timestamp_ms)
            .min()
            .unwrap_or(0)
    }

    fn max_timestamp(&self) -> i64 {
        self.records
            .iter()
            .map(|r| r.timestamp_ms)
            .max()
            .unwrap_or(0)
    }

    /// The uncompressed records section.
    fn encode_records(&self, base_timestamp: i64) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, record) in self.records.iter().enumerate() {
            encode_record(
                record,
                i as i32,
                record.timestamp_ms - base_timestamp,
                &mut out,
            );
        }
        out
    }

    /// Builds the batch: header, (compressed) records, CRC-32C over attributes..end.
    pub fn build(&self) -> Result<Bytes, WireError> {
        let count = i32::try_from(self.records.len()).map_err(|_| WireError::TooLarge {
            field: "recordsCount",
            offset: 57,
            size: self.records.len() as u64,
            max: i32::MAX as u64,
        })?;
        let base_timestamp = self.base_timestamp();
        let records = self.encode_records(base_timestamp);
        let records = compress(self.compression, &records, self.snappy_framing)?;
        let total = BATCH_HEADER_SIZE + records.len();
        let mut out = BytesMut::with_capacity(total);
        out.put_i64(self.base_offset.get());
        out.put_i32((total - LOG_OVERHEAD) as i32);
        out.put_i32(self.partition_leader_epoch.get());
        out.put_u8(MAGIC_V2);
        out.put_u32(0); // CRC, filled below
        out.put_i16(self.attributes());
        out.put_i32((count - 1).max(0));
        out.put_i64(base_timestamp);
        out.put_i64(self.max_timestamp());
        out.put_i64(self.producer_id.get());
        out.put_i16(self.producer_epoch.get());
        out.put_i32(self.base_sequence.get());
        out.put_i32(count);
        out.put_slice(&records);
        let crc = crc32c::crc32c(&out[CRC_START..]);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        Ok(out.freeze())
    }
}

fn encode_record(record: &NewRecord, offset_delta: i32, timestamp_delta: i64, out: &mut Vec<u8>) {
    let key = record.key.as_deref();
    let value = record.value.as_deref();
    let mut body = 1 + varlong_size(timestamp_delta) + varint_size(offset_delta);
    body += bytes_size(key) + bytes_size(value);
    body += varint_size(record.headers.len() as i32);
    for (k, v) in &record.headers {
        body += bytes_size(Some(k)) + bytes_size(v.as_deref());
    }
    put_varint(out, body as i32);
    out.put_i8(0);
    put_varlong(out, timestamp_delta);
    put_varint(out, offset_delta);
    put_bytes(out, key);
    put_bytes(out, value);
    put_varint(out, record.headers.len() as i32);
    for (k, v) in &record.headers {
        put_bytes(out, Some(k));
        put_bytes(out, v.as_deref());
    }
}

fn bytes_size(b: Option<&[u8]>) -> usize {
    match b {
        Some(b) => varint_size(b.len() as i32) + b.len(),
        None => 1,
    }
}

fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            put_varint(out, b.len() as i32);
            out.put_slice(b);
        }
        None => put_varint(out, -1),
    }
}

/// A control record batch (transaction marker): `commit` true for COMMIT, false for ABORT.
/// Key: version 0 + type (0 abort, 1 commit); value: version 0 + coordinator epoch.
pub fn control_batch(
    producer_id: ProducerId,
    producer_epoch: ProducerEpoch,
    commit: bool,
    coordinator_epoch: i32,
    timestamp_ms: i64,
) -> Result<Bytes, WireError> {
    let mut key = BytesMut::with_capacity(4);
    key.put_i16(0);
    key.put_i16(i16::from(commit));
    let mut value = BytesMut::with_capacity(6);
    value.put_i16(0);
    value.put_i32(coordinator_epoch);
    let record = NewRecord {
        timestamp_ms,
        key: Some(key.freeze()),
        value: Some(value.freeze()),
        headers: Vec::new(),
    };
    BatchBuilder {
        producer_id,
        producer_epoch,
        transactional: true,
        control: true,
        records: vec![record],
        ..BatchBuilder::default()
    }
    .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::records::batch_records;
    use crate::batch::validate_batch;

    fn sample(compression: Compression) -> BatchBuilder {
        let records = (0..50)
            .map(|i| NewRecord {
                timestamp_ms: 1_700_000_000_000 + i,
                key: (i % 3 != 0).then(|| Bytes::from(format!("key-{i}"))),
                value: (i % 7 != 0).then(|| Bytes::from(vec![i as u8; i as usize * 10])),
                headers: (0..(i % 4))
                    .map(|h| (Bytes::from(format!("h{h}")), (h % 2 == 0).then(Bytes::new)))
                    .collect(),
            })
            .collect();
        BatchBuilder {
            producer_id: ProducerId(4242),
            producer_epoch: ProducerEpoch(3),
            base_sequence: Sequence(100),
            compression,
            records,
            ..BatchBuilder::default()
        }
    }

    #[test]
    fn built_batches_validate_and_iterate_back_for_every_codec() {
        for codec in Compression::ALL {
            let b = sample(codec);
            let batch = b.build().expect("builds");
            let view = validate_batch(&batch).expect("valid");
            assert_eq!(view.header.records_count(), 50);
            assert_eq!(view.header.last_offset_delta.get(), 49);
            assert_eq!(view.header.attributes().compression(), Some(codec));
            assert_eq!(view.header.base_sequence(), Sequence(100));
            let (_, iter) = batch_records(&batch, 1 << 20).expect("records");
            let records: Vec<_> = iter.collect::<Result<_, _>>().expect("all decode");
            assert_eq!(records.len(), 50);
            for (i, (got, want)) in records.iter().zip(&b.records).enumerate() {
                assert_eq!(got.offset_delta, i as i32);
                assert_eq!(got.timestamp_delta, i as i64);
                assert_eq!(got.key, want.key);
                assert_eq!(got.value, want.value);
                assert_eq!(got.headers.len(), want.headers.len());
            }
        }
    }

    #[test]
    fn control_batch_has_flags_and_marker() {
        let batch = control_batch(ProducerId(7), ProducerEpoch(1), true, 5, 9).expect("builds");
        let view = validate_batch(&batch).expect("valid");
        assert!(view.header.attributes().is_control());
        assert!(view.header.attributes().is_transactional());
        let (_, mut iter) = batch_records(&batch, 1024).expect("records");
        let rec = iter.next().expect("one").expect("valid");
        assert_eq!(rec.key.as_deref(), Some(&[0u8, 0, 0, 1][..]));
    }

    #[test]
    fn corrupt_record_lengths_are_errors() {
        let batch = sample(Compression::None).build().expect("builds");
        let mut bytes = batch.to_vec();
        // Claim a huge first record length; fix the CRC so only the record is wrong.
        bytes[BATCH_HEADER_SIZE] = 0xfe;
        bytes[BATCH_HEADER_SIZE + 1] = 0xff;
        bytes[BATCH_HEADER_SIZE + 2] = 0x7f;
        let crc = crc32c::crc32c(&bytes[CRC_START..]);
        bytes[17..21].copy_from_slice(&crc.to_be_bytes());
        let batch = Bytes::from(bytes);
        let (_, mut iter) = batch_records(&batch, 1 << 20).expect("header ok");
        assert!(matches!(iter.next(), Some(Err(_))));
        assert!(iter.next().is_none());
    }
}
