//! The `__transaction_state` record formats, Kafka's (`TransactionLogKey` v0,
//! `TransactionLogValue` v0), so a Kafka transaction log keeps its meaning here:
//!
//! Key: version int16 = 0, transactional_id string (int16 length).
//!
//! Value: version int16 = 0, producer_id int64, producer_epoch int16,
//! transaction_timeout_ms int32, transaction_status int8, transaction_partitions
//! nullable array (int32 count) of {topic string, partition_ids array of int32},
//! transaction_last_update_timestamp_ms int64, transaction_start_timestamp_ms int64.
//! A null value (tombstone) removes the transactional id.

use std::collections::BTreeSet;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use wire::{ProducerEpoch, ProducerId};

use super::state::{TxnMetadata, TxnState};

/// Key and value version written (and the only one read).
pub const TXN_LOG_VERSION: i16 = 0;
/// Most partitions one stored transaction may list: a bound on decoding, and what
/// [`value`] writes at most (the state machine never holds more).
pub const PARTITIONS_MAX: usize = super::state::PARTITIONS_MAX;

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("record ends early at {field}")]
    Truncated { field: &'static str },
    #[error("unsupported version {0}")]
    Version(i16),
    #[error("invalid {0}")]
    Invalid(&'static str),
}

fn put_string(out: &mut BytesMut, s: &str) {
    out.put_i16(s.len().min(i16::MAX as usize) as i16);
    out.put_slice(&s.as_bytes()[..s.len().min(i16::MAX as usize)]);
}

fn need(buf: &Bytes, n: usize, field: &'static str) -> Result<(), SchemaError> {
    if buf.remaining() < n {
        return Err(SchemaError::Truncated { field });
    }
    Ok(())
}

fn get_string(buf: &mut Bytes, field: &'static str) -> Result<String, SchemaError> {
    need(buf, 2, field)?;
    let len = buf.get_i16();
    if len < 0 {
        return Err(SchemaError::Invalid(field));
    }
    let len = len as usize;
    need(buf, len, field)?;
    let bytes = buf.split_to(len);
    String::from_utf8(bytes.to_vec()).map_err(|_| SchemaError::Invalid(field))
}

/// The key of `transactional_id`.
pub fn key(transactional_id: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(4 + transactional_id.len());
    out.put_i16(TXN_LOG_VERSION);
    put_string(&mut out, transactional_id);
    out.freeze()
}

/// The transactional id of a key.
pub fn decode_key(bytes: &Bytes) -> Result<String, SchemaError> {
    let mut buf = bytes.clone();
    need(&buf, 2, "key version")?;
    let version = buf.get_i16();
    if version != TXN_LOG_VERSION {
        return Err(SchemaError::Version(version));
    }
    get_string(&mut buf, "transactional id")
}

/// The value of one transaction's metadata; refused (nothing to write) if
/// [`decode_value`] would refuse it, so the log never holds a state its replay skips.
pub fn value(m: &TxnMetadata) -> Result<Bytes, SchemaError> {
    if m.partitions.len() > PARTITIONS_MAX {
        return Err(SchemaError::Invalid("partition count"));
    }
    let mut out = BytesMut::with_capacity(64);
    out.put_i16(TXN_LOG_VERSION);
    out.put_i64(m.producer_id.get());
    out.put_i16(m.producer_epoch.get());
    out.put_i32(m.timeout_ms);
    out.put_i8(m.state.code());
    let mut by_topic: Vec<(&str, Vec<i32>)> = Vec::new();
    for (t, p) in &m.partitions {
        match by_topic.last_mut() {
            Some((topic, ps)) if *topic == t.as_str() => ps.push(*p),
            _ => by_topic.push((t.as_str(), vec![*p])),
        }
    }
    out.put_i32(by_topic.len() as i32);
    for (t, ps) in by_topic {
        put_string(&mut out, t);
        out.put_i32(ps.len() as i32);
        for p in ps {
            out.put_i32(p);
        }
    }
    out.put_i64(m.last_update_ms);
    out.put_i64(m.start_ms);
    Ok(out.freeze())
}

/// Decodes a value; every count is bounded by the bytes present.
pub fn decode_value(bytes: &Bytes) -> Result<TxnMetadata, SchemaError> {
    let mut buf = bytes.clone();
    need(&buf, 2 + 8 + 2 + 4 + 1 + 4, "value header")?;
    let version = buf.get_i16();
    if version != TXN_LOG_VERSION {
        return Err(SchemaError::Version(version));
    }
    let producer_id = ProducerId(buf.get_i64());
    let producer_epoch = ProducerEpoch(buf.get_i16());
    let timeout_ms = buf.get_i32();
    let state = TxnState::from_code(buf.get_i8()).ok_or(SchemaError::Invalid("status"))?;
    let topics = buf.get_i32();
    let mut partitions = BTreeSet::new();
    for _ in 0..topics.max(0) {
        let topic = get_string(&mut buf, "topic")?;
        need(&buf, 4, "partition count")?;
        let count = buf.get_i32().max(0) as usize;
        if count > buf.remaining() / 4 || partitions.len() + count > PARTITIONS_MAX {
            return Err(SchemaError::Invalid("partition count"));
        }
        for _ in 0..count {
            partitions.insert((topic.clone(), buf.get_i32()));
        }
    }
    need(&buf, 16, "timestamps")?;
    let last_update_ms = buf.get_i64();
    let start_ms = buf.get_i64();
    Ok(TxnMetadata {
        producer_id,
        producer_epoch,
        timeout_ms,
        state,
        partitions,
        last_update_ms,
        start_ms,
        bumped_from: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_round_trips() {
        let m = TxnMetadata {
            producer_id: ProducerId(42),
            producer_epoch: ProducerEpoch(3),
            timeout_ms: 60_000,
            state: TxnState::Ongoing,
            partitions: [
                ("a".to_string(), 0),
                ("a".to_string(), 2),
                ("b".to_string(), 1),
            ]
            .into_iter()
            .collect(),
            last_update_ms: 5,
            start_ms: 4,
            bumped_from: None,
        };
        assert_eq!(decode_value(&value(&m).expect("encodes")), Ok(m));
        assert_eq!(decode_key(&key("tx-1")).as_deref(), Ok("tx-1"));
        let cut = value(&TxnMetadata::empty(ProducerId(1), ProducerEpoch(0), 10, 0));
        let cut = cut.expect("encodes");
        assert!(decode_value(&cut.slice(..cut.len() - 1)).is_err());
    }

    /// What is written is what a replay reads: a transaction of the most partitions a
    /// value may list is written and read back; one more is not written at all (it was
    /// written, and the replay skipped it, so an older state of the id won).
    #[test]
    fn no_value_is_written_that_the_reader_refuses() {
        let mut m = TxnMetadata::empty(ProducerId(5), ProducerEpoch(0), 60_000, 0);
        m.state = TxnState::PrepareCommit;
        // Spread over topics as a real transaction's are (one topic's group of many).
        m.partitions = (0..PARTITIONS_MAX)
            .map(|i| (format!("t{}", i % 7), i as i32))
            .collect();
        let written = value(&m).expect("the most partitions a value lists");
        assert_eq!(decode_value(&written), Ok(m.clone()));
        m.partitions.insert(("t-more".to_string(), 0));
        assert_eq!(
            value(&m),
            Err(SchemaError::Invalid("partition count")),
            "one more is refused before it is written"
        );
    }
}
