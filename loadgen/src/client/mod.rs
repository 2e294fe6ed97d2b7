//! The load generator's own Kafka client: connections, metadata, a batching producer and a
//! fetching consumer. Everything on the wire goes through `wire`: framing and headers,
//! message bodies (`wire::messages`), record batches (builder and records iterator).

pub mod conn;
pub mod consumer;
pub mod group;
pub mod metadata;
pub mod produce_wire;
pub mod producer;
pub mod security;
pub mod txn;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;

/// Kafka error code DUPLICATE_SEQUENCE_NUMBER: the broker already has this batch.
pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
/// Kafka error code OUT_OF_ORDER_SEQUENCE_NUMBER.
pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;

/// A Kafka error code's name as the `errors` map in the summary spells it.
pub fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        None => "None".to_string(),
        Some(ResponseError::Unknown(c)) => format!("Unknown({c})"),
        Some(e) => format!("{e:?}"),
    }
}

/// Whether a produce error is worth retrying (Kafka's own classification, plus
/// OUT_OF_ORDER_SEQUENCE_NUMBER, which an idempotent producer retries after an earlier
/// batch of the same partition failed: giving that batch up renews the producer id, and
/// the retry goes out renumbered under the new one, see `producer.rs`).
pub fn is_retriable(code: i16, idempotent: bool) -> bool {
    if idempotent && code == OUT_OF_ORDER_SEQUENCE_NUMBER {
        return true;
    }
    ResponseError::try_from_code(code).is_some_and(|e| e.is_retriable())
}

/// Record values written by the load generator start with this header, so a consumer can
/// recognise them, tell which record it is, and when it was meant to be sent.
///
/// ```text
/// 0..4   magic "WLG1"
/// 4..12  run id (u64 BE): random per process, so old records are not mistaken for ours
/// 12..20 record id (u64 BE): producer index << 40 | sequence number within the producer
/// 20..28 intended send time (u64 BE), ns on the run clock
/// 28..   filler up to the record size
/// ```
pub mod payload {
    use super::*;

    pub const MAGIC: &[u8; 4] = b"WLG1";
    /// Smallest record size that fits the header.
    pub const HEADER_BYTES: usize = 28;
    /// Bits of the record id that number records within one producer.
    pub const PRODUCER_SHIFT: u32 = 40;

    /// The fields carried in a record's value.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Stamp {
        pub run_id: u64,
        pub record_id: u64,
        pub intended_ns: u64,
    }

    /// A value of exactly `size` bytes (at least [`HEADER_BYTES`]) carrying `stamp`.
    pub fn encode(stamp: Stamp, size: usize, filler: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(size.max(HEADER_BYTES));
        write(stamp, size, filler, &mut b);
        b.freeze()
    }

    /// The first [`HEADER_BYTES`] of a value: all that differs between two records of
    /// the same size.
    pub fn header(stamp: Stamp) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[..4].copy_from_slice(MAGIC);
        h[4..12].copy_from_slice(&stamp.run_id.to_be_bytes());
        h[12..20].copy_from_slice(&stamp.record_id.to_be_bytes());
        h[20..].copy_from_slice(&stamp.intended_ns.to_be_bytes());
        h
    }

    /// Bytes of `filler` a value of `size` uses (the rest of its tail is `b'x'`).
    pub fn filler_used(size: usize, filler: &[u8]) -> &[u8] {
        &filler[..(size.max(HEADER_BYTES) - HEADER_BYTES).min(filler.len())]
    }

    /// Appends the value [`encode`] returns, straight into `out` (no allocation).
    pub fn write(stamp: Stamp, size: usize, filler: &[u8], out: &mut impl BufMut) {
        let size = size.max(HEADER_BYTES);
        out.put_slice(&header(stamp));
        let rest = size - HEADER_BYTES;
        let from_filler = rest.min(filler.len());
        out.put_slice(&filler[..from_filler]);
        out.put_bytes(b'x', rest - from_filler);
    }

    /// The stamp of a value, if it is one of ours.
    pub fn decode(value: &[u8]) -> Option<Stamp> {
        let (head, _) = value.split_first_chunk::<HEADER_BYTES>()?;
        if &head[..4] != MAGIC {
            return None;
        }
        let u = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&head[i..i + 8]);
            u64::from_be_bytes(a)
        };
        Some(Stamp {
            run_id: u(4),
            record_id: u(12),
            intended_ns: u(20),
        })
    }
}

/// Kafka's default partitioner hash (murmur2, seed 0x9747b28c), so keyed records land on
/// the same partitions as with Kafka's own clients.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len() as u32;
    let mut h = SEED ^ len;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner picks for `key`.
pub fn partition_for_key(key: &[u8], partitions: usize) -> usize {
    ((murmur2(key) & 0x7fff_ffff) as usize) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips() {
        let s = payload::Stamp {
            run_id: 7,
            record_id: (3 << payload::PRODUCER_SHIFT) | 99,
            intended_ns: 123_456_789,
        };
        let v = payload::encode(s, 100, b"abc");
        assert_eq!(v.len(), 100);
        assert_eq!(payload::decode(&v), Some(s));
        assert_eq!(payload::decode(b"short"), None);
        assert_eq!(payload::decode(&[0u8; 40]), None);
    }

    #[test]
    fn murmur2_matches_kafka() {
        // Values from Kafka's own UtilsTest.testMurmur2.
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58897971
        );
        assert_eq!(murmur2(b"abc"), 479470107);
    }

    #[test]
    fn error_names_are_kafkas() {
        assert_eq!(error_name(6), "NotLeaderOrFollower");
        assert!(is_retriable(6, false));
        assert!(!is_retriable(OUT_OF_ORDER_SEQUENCE_NUMBER, false));
        assert!(is_retriable(OUT_OF_ORDER_SEQUENCE_NUMBER, true));
    }
}
