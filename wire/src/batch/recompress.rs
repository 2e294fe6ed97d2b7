//! A produced batch rewritten with another compression codec: what a broker stores when
//! the topic's `compression.type` names a codec other than the producer's (Kafka's
//! `LogValidator`). Only the records' encoding changes: the header keeps its producer id,
//! epoch, base sequence, transactional flag, timestamp type and timestamps, and the
//! records keep their bytes (deltas from the same base offset and timestamp), so
//! idempotence and consumers see the batch the producer sent. The CRC is new.

use zerocopy::FromBytes;

use crate::WireError;
use crate::batch::compression::{Levels, SnappyFraming, compress_into};
use crate::batch::header::{
    Attributes, BATCH_HEADER_SIZE, BatchHeader, Compression, LOG_OVERHEAD, read_header,
};

/// Where the CRC sits, and where the bytes it covers begin.
const CRC: std::ops::Range<usize> = 17..21;
const CRC_START: usize = 21;
/// A compressed target's output is reserved at this share of the records' size first
/// (records of Kafka clients compress 2–10 times); it grows if they compress less.
const COMPRESSED_SHARE_RESERVED: usize = 4;

/// `batch` (one whole batch, already validated) with its records — `records`, its
/// uncompressed records section (see [`crate::batch::uncompressed_records`]) —
/// compressed with `codec` at its level in `levels`, in one new buffer of at most `max_bytes` (`TooLarge` as soon
/// as the batch would pass it: nothing larger is built). The header is the batch's but
/// for the codec bits of its attributes, its `batchLength` and its CRC. The buffer holds
/// little more than the batch: it is kept (in the log's tail cache) for as long as the
/// batch is.
pub fn with_codec(
    batch: &[u8],
    records: &[u8],
    codec: Compression,
    snappy_framing: SnappyFraming,
    levels: Levels,
    max_bytes: usize,
) -> Result<Vec<u8>, WireError> {
    let header = read_header(batch)?;
    let attributes = header.attributes();
    debug_assert!(!attributes.is_control(), "markers are written uncompressed");
    let too_large = |size: usize| WireError::TooLarge {
        field: "record batch",
        offset: 0,
        size: size as u64,
        max: max_bytes as u64,
    };
    let reserved = match codec {
        Compression::None => records.len(),
        _ => records.len() / COMPRESSED_SHARE_RESERVED,
    };
    let reserved = BATCH_HEADER_SIZE.saturating_add(reserved);
    if codec == Compression::None && reserved > max_bytes {
        return Err(too_large(reserved));
    }
    let mut out = Vec::with_capacity(reserved.min(max_bytes));
    out.extend_from_slice(&batch[..BATCH_HEADER_SIZE]);
    compress_into(codec, records, snappy_framing, levels, &mut out, max_bytes)?;
    if out.capacity() - out.len() > out.len() / 8 {
        // Records that compressed better than reserved for: give the rest back.
        out.shrink_to_fit();
    }
    let length = i32::try_from(out.len() - LOG_OVERHEAD).map_err(|_| WireError::TooLarge {
        field: "batchLength",
        offset: 8,
        size: out.len() as u64,
        max: i32::MAX as u64,
    })?;
    let (new, _) =
        BatchHeader::mut_from_prefix(&mut out).map_err(|_| WireError::UnexpectedEof {
            field: "record batch header",
            offset: 0,
            need: BATCH_HEADER_SIZE,
            have: 0,
        })?;
    new.batch_length.set(length);
    let bits = (attributes.0 & !Attributes::COMPRESSION_MASK) | codec.bits();
    new.attributes.set(bits);
    let crc = crc32c::crc32c(&out[CRC_START..]);
    out[CRC].copy_from_slice(&crc.to_be_bytes());
    debug_assert!(crate::batch::validate_batch(&out).is_ok());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::batch::{BatchBuilder, NewRecord, batch_records, uncompressed_records};
    use crate::types::{ProducerEpoch, ProducerId, Sequence};

    const CODECS: [Compression; 5] = Compression::ALL;

    fn records() -> Vec<NewRecord> {
        (0..50i64)
            .map(|i| NewRecord {
                timestamp_ms: 1_700_000_000_000 + i * 3,
                key: (i % 7 != 0).then(|| Bytes::from(format!("key-{i}"))),
                value: (i % 11 != 0).then(|| Bytes::from(vec![i as u8; 100 + i as usize])),
                headers: vec![
                    (Bytes::from_static(b"h"), Some(Bytes::from(format!("v{i}")))),
                    (Bytes::from_static(b"null"), None),
                ],
            })
            .collect()
    }

    fn idempotent(codec: Compression, framing: SnappyFraming) -> Bytes {
        BatchBuilder {
            producer_id: ProducerId(4242),
            producer_epoch: ProducerEpoch(7),
            base_sequence: Sequence(99),
            transactional: true,
            log_append_time: false,
            compression: codec,
            snappy_framing: framing,
            records: records(),
            ..BatchBuilder::default()
        }
        .build()
        .expect("batch")
    }

    /// Every codec to every other: the header fields but codec, length and CRC are the
    /// source's, the CRC is valid, and the records decode to the same records.
    #[test]
    fn every_codec_to_every_codec_keeps_header_and_records() {
        for from in CODECS {
            for framing in [SnappyFraming::Xerial, SnappyFraming::Raw] {
                let source = idempotent(from, framing);
                let plain = uncompressed_records(&source, 1 << 20).expect("records");
                for to in CODECS {
                    let out = rewrite(&source, &plain, to, usize::MAX)
                        .unwrap_or_else(|e| panic!("{from:?} -> {to:?}: {e}"));
                    same_but_codec(&source, &out, to);
                }
            }
        }
    }

    /// `with_codec` as the broker calls it: xerial snappy, the default levels.
    fn rewrite(
        source: &[u8],
        plain: &[u8],
        to: Compression,
        max_bytes: usize,
    ) -> Result<Vec<u8>, WireError> {
        with_codec(
            source,
            plain,
            to,
            SnappyFraming::Xerial,
            Levels::default(),
            max_bytes,
        )
    }

    fn same_but_codec(source: &Bytes, out: &[u8], to: Compression) {
        let out = Bytes::copy_from_slice(out);
        let (a, ra) = batch_records(source, 1 << 20).expect("source");
        let (b, rb) = batch_records(&out, 1 << 20).expect("rewritten batch is valid");
        assert_eq!(b.attributes().compression(), Some(to));
        assert_eq!(
            a.attributes().0 & !Attributes::COMPRESSION_MASK,
            b.attributes().0 & !Attributes::COMPRESSION_MASK
        );
        assert!(b.attributes().is_transactional());
        assert_eq!(a.producer_id(), b.producer_id());
        assert_eq!(a.producer_epoch(), b.producer_epoch());
        assert_eq!(a.base_sequence(), b.base_sequence());
        assert_eq!(a.base_timestamp(), b.base_timestamp());
        assert_eq!(a.max_timestamp(), b.max_timestamp());
        assert_eq!(a.records_count(), b.records_count());
        assert_eq!(a.last_offset_delta.get(), b.last_offset_delta.get());
        assert_eq!(a.base_offset(), b.base_offset());
        assert_eq!(b.total_size(), out.len());
        let ra: Vec<_> = ra.map(|r| r.expect("record")).collect();
        let rb: Vec<_> = rb.map(|r| r.expect("record")).collect();
        assert_eq!(ra, rb);
        assert_eq!(rb.len(), 50);
    }

    /// The produce path's common case costs no copy: an uncompressed batch's records are
    /// borrowed from it.
    #[test]
    fn an_uncompressed_batchs_records_are_borrowed() {
        let source = idempotent(Compression::None, SnappyFraming::Xerial);
        let records = uncompressed_records(&source, 1 << 20).expect("records");
        assert!(matches!(records, std::borrow::Cow::Borrowed(_)));
        assert_eq!(&records[..], &source[BATCH_HEADER_SIZE..]);
    }

    #[test]
    fn a_batch_compressed_by_the_broker_shrinks_and_uncompressed_holds_the_records() {
        let source = idempotent(Compression::None, SnappyFraming::Xerial);
        let plain = uncompressed_records(&source, 1 << 20).expect("records");
        for to in [Compression::Gzip, Compression::Lz4, Compression::Zstd] {
            let out = rewrite(&source, &plain, to, usize::MAX).expect("packs");
            assert!(out.len() < source.len(), "{to:?}: {} bytes", out.len());
        }
        let gz = idempotent(Compression::Gzip, SnappyFraming::Xerial);
        let plain = uncompressed_records(&gz, 1 << 20).expect("records");
        let out = rewrite(&gz, &plain, Compression::None, usize::MAX).expect("none");
        assert_eq!(out.len(), BATCH_HEADER_SIZE + plain.len());
        assert_eq!(&out[BATCH_HEADER_SIZE..], &plain[..]);
    }

    /// One batch of `count` records of `value_bytes` each, every value byte from `byte`.
    fn batch_of(count: i64, value_bytes: usize, byte: impl Fn(usize) -> u8) -> Bytes {
        BatchBuilder {
            records: (0..count)
                .map(|i| NewRecord {
                    timestamp_ms: 1_700_000_000_000 + i,
                    key: None,
                    value: Some(Bytes::from(
                        (0..value_bytes)
                            .map(|j| byte(i as usize * value_bytes + j))
                            .collect::<Vec<u8>>(),
                    )),
                    headers: Vec::new(),
                })
                .collect(),
            ..BatchBuilder::default()
        }
        .build()
        .expect("batch")
    }

    /// Records that do not compress, rewritten under a bound they pass: every codec stops
    /// with `TooLarge` (none builds the oversized batch to be measured after).
    #[test]
    fn a_rewrite_past_its_bound_is_refused() {
        // splitmix64 of the position: bytes no codec here can shrink.
        let noise = |i: usize| {
            let mut z = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as u8
        };
        let source = batch_of(64, 4096, noise);
        let plain = uncompressed_records(&source, 1 << 22).expect("records");
        for to in CODECS {
            let got = rewrite(&source, &plain, to, 64 * 1024);
            assert!(
                matches!(got, Err(WireError::TooLarge { .. })),
                "{to:?}: {:?}",
                got.map(|b| b.len())
            );
        }
    }

    /// Records that compress a thousand times: the rewritten batch's buffer is not the
    /// share of the records reserved up front (it is kept as long as the batch is).
    #[test]
    fn a_rewritten_batch_keeps_little_more_than_its_bytes() {
        let source = batch_of(64, 64 * 1024, |_| 0);
        let plain = uncompressed_records(&source, 1 << 23).expect("records");
        // Every codec but none (uncompressed does not shrink).
        for to in &Compression::ALL[1..] {
            let to = *to;
            let out =
                rewrite(&source, &plain, to, usize::MAX).unwrap_or_else(|e| panic!("{to:?}: {e}"));
            assert!(
                out.capacity() <= out.len() + out.len() / 8,
                "{to:?}: {} bytes in a buffer of {}",
                out.len(),
                out.capacity()
            );
        }
    }
}
