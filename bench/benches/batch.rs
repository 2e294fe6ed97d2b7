//! Record batch validation beside raw CRC-32C over the same bytes.
//!
//! `validate_batch` = header checks + CRC-32C over attributes..end + count bounds. The
//! figure to report is the ratio of its throughput to `crc32c` alone on the same buffer
//! (1.0 = validation costs nothing beyond the checksum). Batches are real ones from
//! `wire::batch::BatchBuilder`: 1 KiB, 16 KiB and 1 MiB, uncompressed, 100-byte values.
//!
//! `produced_walk`: what the produce path adds on top, `check_produced_batch` walking every
//! record of an uncompressed 16 KiB and 1 MiB batch of 1 KiB records (the walk allocates
//! nothing), beside `validate_batch` on the same batch.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wire::batch::{BatchBuilder, NewRecord, check_produced_batch, validate_batch};
use wire::bytes::Bytes;

/// A batch of about `target_bytes`, built from 100-byte records.
fn batch_of(target_bytes: usize) -> Bytes {
    batch_of_values(target_bytes, 100)
}

/// A batch of about `target_bytes`, built from `value_bytes`-byte records.
fn batch_of_values(target_bytes: usize, value_bytes: usize) -> Bytes {
    let per_record = value_bytes + 10; // value + record framing
    let n = (target_bytes.saturating_sub(61) / per_record).max(1);
    let records = (0..n)
        .map(|i| {
            NewRecord::value(
                1_700_000_000_000 + i as i64,
                vec![(i % 251) as u8; value_bytes],
            )
        })
        .collect();
    BatchBuilder {
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("bench batch builds")
}

fn validation(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch_validation");
    for (label, size) in [("1KiB", 1024), ("16KiB", 16 * 1024), ("1MiB", 1 << 20)] {
        let batch = batch_of(size);
        g.throughput(Throughput::Bytes(batch.len() as u64));
        g.bench_with_input(BenchmarkId::new("crc32c", label), &batch, |b, batch| {
            b.iter(|| crc32c::crc32c(black_box(&batch[21..])))
        });
        g.bench_with_input(
            BenchmarkId::new("validate_batch", label),
            &batch,
            |b, batch| b.iter(|| validate_batch(black_box(batch)).map(|v| v.bytes.len())),
        );
    }
    g.finish();
}

fn produced_walk(c: &mut Criterion) {
    let mut g = c.benchmark_group("produced_walk");
    for (label, size) in [("16KiB", 16 * 1024), ("1MiB", 1 << 20)] {
        let batch = batch_of_values(size, 1024);
        g.throughput(Throughput::Bytes(batch.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("validate_batch", label),
            &batch,
            |b, batch| b.iter(|| validate_batch(black_box(batch)).map(|v| v.bytes.len())),
        );
        g.bench_with_input(
            BenchmarkId::new("check_produced_batch", label),
            &batch,
            |b, batch| b.iter(|| check_produced_batch(black_box(batch))),
        );
    }
    g.finish();
}

criterion_group!(benches, validation, produced_walk);
criterion_main!(benches);
