//! One batch through the cleaner: which records survive (latest per key, tombstones until
//! their delete horizon), and the batch re-encoded in Kafka's format when any record goes.
//! Pure functions over bytes; the produce-side check for keyless records lives here too.
//!
//! A batch is rewritten only when it loses records or gets its delete horizon; otherwise
//! its bytes are kept as they are. A rewritten batch keeps its base offset, its
//! `lastOffsetDelta` (so the offsets after it, and its producer's last sequence, do not
//! move), its leader epoch, producer id / epoch / base sequence and max timestamp; its
//! records keep their offset deltas and absolute timestamps; the CRC is recomputed. A
//! batch that loses every record is dropped, unless it may be its idempotent producer's
//! last batch: then it stays as an empty batch (header only, `recordsCount` 0), as
//! Kafka's `RETAIN_EMPTY` keeps the producer's sequence state in the log.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use wire::Offset;
use wire::batch::{
    Attributes, BATCH_HEADER_SIZE, BatchHeader, Compression, LOG_OVERHEAD, RecordRef,
    SnappyFraming, compress, records_section, walk_records,
};
use wire::codec::{put_varint, put_varlong, varint_size, varlong_size};
use zerocopy::FromBytes;

/// Attribute bit 6 (KIP-534): the batch's `baseTimestamp` is its delete horizon, the time
/// after which the cleaner may remove its tombstones.
pub const DELETE_HORIZON_BIT: i16 = 0x40;
/// Least bound on a batch's records once decompressed (see
/// [`decompressed_batch_bytes_max`]).
pub const DECOMPRESSED_BATCH_BYTES_MAX: usize = 64 << 20;
/// Most any batch's records may take once decompressed, whatever the topic allows.
pub const DECOMPRESSED_BATCH_BYTES_CEILING: usize = 1 << 30;
/// The bound the cleaner opens stored batches with. It does not know the topic's
/// `max.message.bytes`; a stored batch passed its CRC, so it is one the produce check
/// accepted within [`decompressed_batch_bytes_max`], never above this ceiling (a fixed
/// 64 MiB left legitimate big batches of a topic with a large `max.message.bytes`
/// uncleanable). Batches are opened one at a time.
pub const STORED_DECOMPRESSED_BYTES_MAX: usize = DECOMPRESSED_BATCH_BYTES_CEILING;
/// How many times its wire size a batch may grow when decompressed, beyond the floor.
const DECOMPRESSION_RATIO_MAX: usize = 8;

/// Bound on one batch's records once decompressed, on a topic whose batches are at most
/// `max_message_bytes` on the wire: 8 times that, at least 64 MiB, at most 1 GiB. The
/// produce check and the cleaner share it, so a batch the broker accepted is one its
/// cleaner can open (a fixed 64 MiB refused legitimate big batches); the bound only
/// guards against a batch that claims to decompress to gigabytes.
pub fn decompressed_batch_bytes_max(max_message_bytes: usize) -> usize {
    max_message_bytes
        .saturating_mul(DECOMPRESSION_RATIO_MAX)
        .clamp(
            DECOMPRESSED_BATCH_BYTES_MAX,
            DECOMPRESSED_BATCH_BYTES_CEILING,
        )
}
/// Where the CRC-covered bytes begin.
const CRC_START: usize = 21;

/// What the cleaner knows when it filters a batch: the offset map's view of each key.
pub trait KeyView {
    /// The offset of the latest record with `key` in the mapped range, if mapped.
    fn latest(&self, key: &[u8]) -> Option<Offset>;
}

impl KeyView for HashMap<Box<[u8]>, Offset> {
    fn latest(&self, key: &[u8]) -> Option<Offset> {
        self.get(key).copied()
    }
}

/// The decision for one batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing removed, nothing to mark: the stored bytes stay.
    Keep,
    /// Every record removed and no producer state to keep: the batch goes.
    Drop,
    /// Re-encoded (records removed, or the delete horizon set), or emptied to its header.
    Rewrite(Bytes),
}

/// A filtered batch and what happened to its records.
#[derive(Debug, PartialEq, Eq)]
pub struct Filtered {
    pub outcome: Outcome,
    pub records_removed: u64,
    pub tombstones_removed: u64,
    /// The delete horizon of the tombstones this batch still holds (None if none).
    pub horizon_ms: Option<i64>,
}

/// Why a stored batch could not be filtered (the caller treats it as damage).
#[derive(Debug)]
pub struct FilterError(pub String);

/// How a batch is filtered: the time now, `delete.retention.ms`, and whether the batch
/// may be its producer's last (then an emptied batch stays as a header).
#[derive(Clone, Copy, Debug)]
pub struct FilterRules {
    pub now_ms: i64,
    pub delete_retention_ms: i64,
    pub last_of_producer: bool,
}

/// Filters one stored batch against `map`: a record survives if it has a key and no
/// later record of that key is mapped; a surviving tombstone goes once the batch's delete
/// horizon passed, and a batch holding tombstones without a horizon gets one
/// (`now + delete.retention.ms`). Control batches (transaction markers) are kept whole.
pub fn filter_batch(
    batch: &Bytes,
    map: &impl KeyView,
    rules: FilterRules,
) -> Result<Filtered, FilterError> {
    let (header, section) = records_section(batch, STORED_DECOMPRESSED_BYTES_MAX)
        .map_err(|e| FilterError(e.to_string()))?;
    let keep_all = Filtered {
        outcome: Outcome::Keep,
        records_removed: 0,
        tombstones_removed: 0,
        horizon_ms: None,
    };
    if header.attributes().is_control() {
        return Ok(keep_all);
    }
    let attributes = header.attributes.get();
    let horizon = (attributes & DELETE_HORIZON_BIT != 0).then(|| header.base_timestamp());
    let horizon_passed = horizon.is_some_and(|h| rules.now_ms >= h);
    let base = header.base_offset();
    let (mut kept, mut removed, mut tombstones_removed, mut tombstones_kept) =
        (Vec::new(), 0u64, 0u64, false);
    // Records are walked, not decoded: their headers stay bytes (a record may claim
    // millions of empty headers).
    let walked = walk_records(&section, header.records_count(), |_, record| {
        let offset = base.add(i64::from(record.offset_delta));
        let Some(key) = record.key else {
            // Keyless records cannot be compacted; Kafka's cleaner discards them.
            removed += 1;
            return Ok(());
        };
        if map.latest(key).is_some_and(|latest| latest > offset) {
            removed += 1;
            return Ok(());
        }
        if record.value.is_none() {
            if horizon_passed {
                removed += 1;
                tombstones_removed += 1;
                return Ok(());
            }
            tombstones_kept = true;
        }
        kept.push(record);
        Ok(())
    });
    walked.map_err(|e| FilterError(e.to_string()))?;
    let set_horizon = tombstones_kept && horizon.is_none();
    let new_horizon = set_horizon.then(|| rules.now_ms.saturating_add(rules.delete_retention_ms));
    let horizon_ms = if tombstones_kept {
        horizon.or(new_horizon)
    } else {
        None
    };
    // An emptied batch stays only as its producer's last (its header holds the producer's
    // sequence state); one kept empty earlier goes once a later batch of its producer is
    // mapped, else empty headers would pile up round after round.
    let holds_producer = header.producer_id.get() >= 0 && rules.last_of_producer;
    let outcome = if kept.is_empty() && !holds_producer {
        Outcome::Drop
    } else if removed == 0 && !set_horizon {
        Outcome::Keep
    } else if kept.is_empty() {
        Outcome::Rewrite(encode(&header, &[], None)?)
    } else {
        Outcome::Rewrite(encode(&header, &kept, new_horizon)?)
    };
    Ok(Filtered {
        outcome,
        records_removed: removed,
        tombstones_removed,
        horizon_ms,
    })
}

/// Re-encodes a batch with `records` (a subset of its own, in order): the header fields
/// are the original's but for the length, record count, CRC and — with `horizon` — the
/// delete-horizon bit and a `baseTimestamp` equal to the horizon (record timestamp deltas
/// are shifted so every record keeps its absolute timestamp). The records are compressed
/// with the batch's own codec; each record's key, value and headers are copied as they
/// are.
pub fn encode(
    original: &BatchHeader,
    records: &[RecordRef<'_>],
    horizon: Option<i64>,
) -> Result<Bytes, FilterError> {
    let old_base_ts = original.base_timestamp();
    let new_base_ts = horizon.unwrap_or(old_base_ts);
    let shift = old_base_ts.wrapping_sub(new_base_ts);
    let mut raw = Vec::new();
    for r in records {
        encode_record(r, r.timestamp_delta.wrapping_add(shift), &mut raw);
    }
    let codec = original
        .attributes()
        .compression()
        .unwrap_or(Compression::None);
    let body = match (codec, records.is_empty()) {
        (Compression::None, _) | (_, true) => raw,
        (codec, false) => compress(codec, &raw, SnappyFraming::default())
            .map_err(|e| FilterError(e.to_string()))?,
    };
    let total = BATCH_HEADER_SIZE + body.len();
    let mut out = BytesMut::with_capacity(total);
    out.put_slice(zerocopy::IntoBytes::as_bytes(original));
    out.put_slice(&body);
    let count = i32::try_from(records.len()).map_err(|_| FilterError("too many records".into()))?;
    let length =
        i32::try_from(total - LOG_OVERHEAD).map_err(|_| FilterError("batch too large".into()))?;
    let mut attributes = original.attributes.get();
    if horizon.is_some() {
        attributes |= DELETE_HORIZON_BIT;
    }
    if records.is_empty() {
        // An empty batch carries no records section to compress (Kafka's writeEmptyHeader).
        attributes &= !0x07;
    }
    {
        let (h, _) = BatchHeader::mut_from_prefix(&mut out[..])
            .map_err(|_| FilterError("short header".into()))?;
        h.batch_length.set(length);
        h.attributes.set(attributes);
        h.base_timestamp.set(new_base_ts);
        h.records_count.set(count);
    }
    let crc = crc32c::crc32c(&out[CRC_START..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    debug_assert!(wire::batch::validate_batch(&out).is_ok());
    Ok(out.freeze())
}

fn encode_record(record: &RecordRef<'_>, timestamp_delta: i64, out: &mut Vec<u8>) {
    let body =
        1 + varlong_size(timestamp_delta) + varint_size(record.offset_delta) + record.fields.len();
    put_varint(out, body as i32);
    out.put_i8(record.attributes);
    put_varlong(out, timestamp_delta);
    put_varint(out, record.offset_delta);
    out.put_slice(record.fields);
}

/// Produce validation for a `cleanup.policy=compact` topic: the indexes of the records
/// without a key in one (CRC-checked) batch; Kafka rejects such a batch with
/// INVALID_RECORD (error 87), naming the records in `record_errors`. Control batches are
/// the broker's own and pass. A batch whose records cannot be decoded fails with every
/// index from the first undecodable record on (the caller answers INVALID_RECORD too).
pub fn keyless_records(batch: &Bytes) -> Result<(), Vec<usize>> {
    let header = wire::batch::validate_batch(batch)
        .map_err(|_| vec![0])?
        .header;
    if Attributes(header.attributes.get()).is_control() {
        return Ok(());
    }
    let mut bad = Vec::new();
    let walked = wire::batch::walk_batch(batch, DECOMPRESSED_BATCH_BYTES_MAX, |i, r| {
        if r.key.is_none() {
            bad.push(i);
        }
        Ok(())
    });
    if walked.is_err() {
        // Where the walk stopped is not known here: the whole batch is named.
        return Err(vec![0]);
    }
    if bad.is_empty() { Ok(()) } else { Err(bad) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::batch::{BatchBuilder, NewRecord, Record, batch_records, validate_batch};
    use wire::{ProducerEpoch, ProducerId, Sequence};

    fn rec(ts: i64, key: Option<&str>, value: Option<&str>) -> NewRecord {
        NewRecord {
            timestamp_ms: ts,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: vec![(Bytes::from_static(b"h"), Some(Bytes::from_static(b"v")))],
        }
    }

    fn batch(base: i64, records: Vec<NewRecord>, compression: Compression) -> Bytes {
        BatchBuilder {
            base_offset: Offset(base),
            producer_id: ProducerId(7),
            producer_epoch: ProducerEpoch(1),
            base_sequence: Sequence(100),
            compression,
            records,
            ..BatchBuilder::default()
        }
        .build()
        .unwrap()
    }

    fn rules(now_ms: i64, last: bool) -> FilterRules {
        FilterRules {
            now_ms,
            delete_retention_ms: 1000,
            last_of_producer: last,
        }
    }

    fn map(entries: &[(&str, i64)]) -> HashMap<Box<[u8]>, Offset> {
        entries
            .iter()
            .map(|(k, o)| (k.as_bytes().to_vec().into_boxed_slice(), Offset(*o)))
            .collect()
    }

    fn decoded(b: &Bytes) -> (BatchHeader, Vec<Record>) {
        let (h, it) = batch_records(b, 1 << 20).unwrap();
        (h, it.map(Result::unwrap).collect())
    }

    #[test]
    fn latest_records_survive_with_their_offsets_timestamps_and_producer_fields() {
        for codec in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let b = batch(
                10,
                vec![
                    rec(1000, Some("a"), Some("a1")),
                    rec(1001, Some("b"), Some("b1")),
                    rec(1002, Some("a"), Some("a2")),
                    rec(1003, Some("c"), Some("c1")),
                ],
                codec,
            );
            // "a" is superseded at 12 inside the batch, "c" later in the log.
            let m = map(&[("a", 12), ("b", 11), ("c", 40)]);
            let f = filter_batch(&b, &m, rules(0, false)).unwrap();
            assert_eq!(f.records_removed, 2);
            let Outcome::Rewrite(out) = f.outcome else {
                panic!("expected a rewrite");
            };
            validate_batch(&out).unwrap();
            let (h, recs) = decoded(&out);
            let (orig, _) = decoded(&b);
            assert_eq!(h.base_offset(), Offset(10));
            assert_eq!(h.last_offset(), Offset(13), "lastOffsetDelta kept");
            assert_eq!(h.producer_id(), orig.producer_id());
            assert_eq!(h.base_sequence(), orig.base_sequence());
            assert_eq!(h.max_timestamp(), orig.max_timestamp());
            assert_eq!(h.attributes().compression(), Some(codec));
            let got: Vec<(i32, i64, &[u8])> = recs
                .iter()
                .map(|r| {
                    (
                        r.offset_delta,
                        h.base_timestamp() + r.timestamp_delta,
                        &r.value.as_ref().unwrap()[..],
                    )
                })
                .collect();
            assert_eq!(got, vec![(1, 1001, &b"b1"[..]), (2, 1002, &b"a2"[..])]);
        }
    }

    #[test]
    fn unchanged_batches_are_kept_as_stored() {
        let b = batch(0, vec![rec(5, Some("a"), Some("1"))], Compression::None);
        let f = filter_batch(&b, &map(&[("a", 0)]), rules(0, false)).unwrap();
        assert_eq!(f.outcome, Outcome::Keep);
        let f = filter_batch(&b, &map(&[]), rules(0, false)).unwrap();
        assert_eq!(f.outcome, Outcome::Keep, "keys only in the clean part stay");
    }

    #[test]
    fn emptied_batches_go_unless_they_hold_producer_state() {
        let b = batch(0, vec![rec(5, Some("a"), Some("1"))], Compression::Gzip);
        let m = map(&[("a", 9)]);
        assert_eq!(
            filter_batch(&b, &m, rules(0, false)).unwrap().outcome,
            Outcome::Drop
        );
        let f = filter_batch(&b, &m, rules(0, true)).unwrap();
        let Outcome::Rewrite(out) = f.outcome else {
            panic!("expected an empty batch");
        };
        let (h, recs) = decoded(&out);
        assert!(recs.is_empty());
        assert_eq!(out.len(), BATCH_HEADER_SIZE);
        assert_eq!(h.records_count(), 0);
        assert_eq!(h.last_offset(), Offset(0));
        assert_eq!(h.producer_id(), ProducerId(7));
        assert_eq!(h.last_sequence(), Sequence(100));
    }

    #[test]
    fn an_empty_batch_kept_for_its_producer_goes_once_the_producer_writes_again() {
        let b = batch(0, vec![rec(5, Some("a"), Some("1"))], Compression::None);
        let m = map(&[("a", 9)]);
        let Outcome::Rewrite(empty) = filter_batch(&b, &m, rules(0, true)).unwrap().outcome else {
            panic!("expected an empty batch");
        };
        assert_eq!(
            filter_batch(&empty, &m, rules(0, true)).unwrap().outcome,
            Outcome::Keep,
            "still the producer's last"
        );
        assert_eq!(
            filter_batch(&empty, &m, rules(0, false)).unwrap().outcome,
            Outcome::Drop,
            "a later batch of its producer holds its state now"
        );
    }

    #[test]
    fn tombstones_get_a_horizon_then_go_after_it() {
        let b = batch(
            0,
            vec![rec(500, Some("a"), None), rec(600, Some("b"), Some("x"))],
            Compression::None,
        );
        let m = map(&[("a", 0), ("b", 1)]);
        let f = filter_batch(&b, &m, rules(2000, false)).unwrap();
        assert_eq!(f.horizon_ms, Some(3000));
        let Outcome::Rewrite(marked) = f.outcome else {
            panic!("the horizon is set by a rewrite");
        };
        let (h, recs) = decoded(&marked);
        assert_ne!(h.attributes.get() & DELETE_HORIZON_BIT, 0);
        assert_eq!(h.base_timestamp(), 3000);
        assert_eq!(h.base_timestamp() + recs[0].timestamp_delta, 500);
        assert_eq!(h.base_timestamp() + recs[1].timestamp_delta, 600);
        // Before the horizon: kept as is; after: the tombstone goes, the value stays.
        let f = filter_batch(&marked, &m, rules(2999, false)).unwrap();
        assert_eq!(f.outcome, Outcome::Keep);
        assert_eq!(f.horizon_ms, Some(3000));
        let f = filter_batch(&marked, &m, rules(3000, false)).unwrap();
        assert_eq!(f.tombstones_removed, 1);
        assert_eq!(f.horizon_ms, None);
        let Outcome::Rewrite(out) = f.outcome else {
            panic!("expected a rewrite");
        };
        let (_, recs) = decoded(&out);
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].offset_delta, 1);
    }

    #[test]
    fn keyless_records_are_named_by_index() {
        let good = batch(0, vec![rec(0, Some("a"), Some("1"))], Compression::None);
        assert_eq!(keyless_records(&good), Ok(()));
        let bad = batch(
            0,
            vec![
                rec(0, None, Some("1")),
                rec(0, Some("k"), Some("2")),
                rec(0, None, None),
            ],
            Compression::Snappy,
        );
        assert_eq!(keyless_records(&bad), Err(vec![0, 2]));
        let marker =
            wire::batch::control_batch(ProducerId(1), ProducerEpoch(0), true, 0, 0).unwrap();
        assert_eq!(keyless_records(&marker), Ok(()));
        let mut damaged = good.to_vec();
        damaged[30] ^= 1;
        assert_eq!(keyless_records(&Bytes::from(damaged)), Err(vec![0]));
    }

    /// A record that claims many headers: they are copied as bytes on a rewrite, never
    /// decoded one by one (a few KB of zstd can hold millions of empty headers).
    #[test]
    fn headers_are_copied_as_bytes_on_a_rewrite() {
        let headers: Vec<(Bytes, Option<Bytes>)> =
            (0..1000).map(|_| (Bytes::new(), None)).collect();
        let keyed = |key: &'static str| NewRecord {
            timestamp_ms: 7,
            key: Some(Bytes::from_static(key.as_bytes())),
            value: Some(Bytes::from_static(b"v")),
            headers: headers.clone(),
        };
        let b = batch(0, vec![keyed("a"), keyed("b")], Compression::Zstd);
        let f = filter_batch(&b, &map(&[("a", 5)]), rules(0, false)).unwrap();
        let Outcome::Rewrite(out) = f.outcome else {
            panic!("expected a rewrite");
        };
        let (h, recs) = decoded(&out);
        assert_eq!(h.records_count(), 1);
        assert_eq!(recs[0].key.as_deref(), Some(&b"b"[..]));
        assert_eq!(recs[0].offset_delta, 1);
        assert_eq!(recs[0].headers.len(), 1000);
    }

    /// The cleaner opens any batch the produce check could have accepted: one whose
    /// records take more than 64 MiB decompressed (a topic with a large
    /// `max.message.bytes`) is filtered, not refused as damage.
    #[test]
    fn a_batch_above_64_mib_decompressed_is_filtered() {
        let big = NewRecord {
            timestamp_ms: 7,
            key: Some(Bytes::from_static(b"a")),
            value: Some(Bytes::from(vec![0u8; (64 << 20) + 1024])),
            headers: Vec::new(),
        };
        let b = batch(0, vec![big], Compression::Zstd);
        assert!(b.len() < 1 << 20, "compresses well");
        let f = filter_batch(&b, &map(&[("a", 9)]), rules(0, false)).unwrap();
        assert_eq!(f.outcome, Outcome::Drop);
        assert_eq!(
            decompressed_batch_bytes_max(1 << 20),
            DECOMPRESSED_BATCH_BYTES_MAX
        );
        assert_eq!(decompressed_batch_bytes_max(64 << 20), 512 << 20);
        assert_eq!(
            decompressed_batch_bytes_max(usize::MAX),
            DECOMPRESSED_BATCH_BYTES_CEILING
        );
    }
}
