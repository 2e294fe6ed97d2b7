//! `check_produced_batch`: what a broker refuses of a client's batch beyond framing and
//! CRC, each case built with a correct CRC so that only the rule under test can refuse it.

use bytes::Bytes;
use wire::batch::{BatchBuilder, Compression, NewRecord, check_produced_batch, validate_batch};

fn records(n: usize) -> Vec<NewRecord> {
    (0..n)
        .map(|i| NewRecord::value(1_700_000_000_000 + i as i64, format!("value-{i}")))
        .collect()
}

fn batch(n: usize) -> Vec<u8> {
    let b = BatchBuilder {
        records: records(n),
        ..BatchBuilder::default()
    };
    b.build().expect("batch").to_vec()
}

/// Writes a big-endian i32 at `at` and recomputes the CRC (attributes..end).
fn patch_i32(mut b: Vec<u8>, at: usize, value: i32) -> Vec<u8> {
    b[at..at + 4].copy_from_slice(&value.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

#[test]
fn a_plain_batch_passes_compressed_too() {
    assert!(check_produced_batch(&batch(1)).is_ok());
    assert!(check_produced_batch(&batch(5)).is_ok());
    let gzip = BatchBuilder {
        records: records(5),
        compression: Compression::Gzip,
        ..BatchBuilder::default()
    };
    assert!(check_produced_batch(&gzip.build().expect("gzip")).is_ok());
}

#[test]
fn a_control_batch_from_a_client_is_refused() {
    let b = BatchBuilder {
        control: true,
        records: vec![NewRecord {
            key: Some(Bytes::from_static(&[0, 0, 0, 0])),
            ..NewRecord::value(1_700_000_000_000, Bytes::from_static(&[0, 0, 0, 0, 0, 0]))
        }],
        ..BatchBuilder::default()
    };
    let b = b.build().expect("control");
    assert!(validate_batch(&b).is_ok(), "well formed");
    assert!(check_produced_batch(&b).is_err());
}

#[test]
fn counts_that_disagree_with_the_offsets_are_refused() {
    // lastOffsetDelta (bytes 23..27) 0 with 3 records: offsets 1 and 2 would be claimed
    // by the batches after it.
    let b = patch_i32(batch(3), 23, 0);
    assert!(validate_batch(&b).is_ok());
    assert!(check_produced_batch(&b).is_err());
    // recordsCount (bytes 57..61) 0, and 2 of 3.
    let b = patch_i32(batch(3), 57, 0);
    assert!(check_produced_batch(&b).is_err());
    let b = patch_i32(patch_i32(batch(3), 57, 2), 23, 1);
    assert!(validate_batch(&b).is_ok());
    assert!(check_produced_batch(&b).is_err(), "a record left over");
    // lastOffsetDelta i32::MAX with recordsCount i32::MAX is bounded by the bytes first.
    let b = patch_i32(patch_i32(batch(1), 57, i32::MAX), 23, i32::MAX);
    assert!(check_produced_batch(&b).is_err());
}

#[test]
fn a_record_with_another_offset_delta_is_refused() {
    // One record: its offsetDelta varint is 0 (zigzag 0) right after length, attributes
    // and timestampDelta 0 (zigzag 0): bytes 61 (length), 62 (attributes), 63 (ts), 64.
    let mut b = batch(1);
    assert_eq!(b[64], 0, "offsetDelta 0");
    b[64] = 2; // zigzag 1
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(validate_batch(&b).is_ok());
    assert!(check_produced_batch(&b).is_err());
}
