//! Fuzz target: a records blob as carried by Produce. Splits it into batches, validates
//! each (sizes, magic, CRC), and iterates its records, decompressing with a bound. The CRC
//! is recomputed first on a copy so the fuzzer reaches the record parser, not just the CRC
//! check. Nothing may panic or allocate past the bounds.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use wire::batch::{BATCH_HEADER_SIZE, batch_records, split_batches};

const MAX_DECOMPRESSED_BYTES: usize = 1 << 20;

/// Rewrites the CRC of the batch at the start of `buf` so that the rest gets exercised.
fn fix_crc(buf: &mut [u8]) {
    if buf.len() < BATCH_HEADER_SIZE {
        return;
    }
    let len = i32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
    let Ok(len) = usize::try_from(len) else {
        return;
    };
    let end = 12usize.saturating_add(len).min(buf.len());
    if end <= 21 {
        return;
    }
    let crc = crc32c_of(&buf[21..end]);
    buf[17..21].copy_from_slice(&crc.to_be_bytes());
}

fn crc32c_of(bytes: &[u8]) -> u32 {
    // Same polynomial as wire's validation (Castagnoli), bitwise: the fuzzer does not care
    // about speed here and this keeps the target free of extra dependencies.
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0x82f6_3b78 & mask);
        }
    }
    !crc
}

fuzz_target!(|data: &[u8]| {
    let raw = Bytes::copy_from_slice(data);
    for range in split_batches(&raw).flatten() {
        let _ = batch_records(&raw.slice(range), MAX_DECOMPRESSED_BYTES);
    }
    let mut fixed = data.to_vec();
    fix_crc(&mut fixed);
    let fixed = Bytes::from(fixed);
    if let Ok((header, iter)) = batch_records(&fixed, MAX_DECOMPRESSED_BYTES) {
        let mut n = 0usize;
        for record in iter {
            n += 1;
            if record.is_err() {
                break;
            }
        }
        // The iterator yields at most the claimed count plus one trailing error.
        assert!(n <= header.records_count().max(0) as usize + 1);
    }
});
