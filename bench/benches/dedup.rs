//! Cost of the idempotence check per produced batch (check + record on the owning
//! shard), beside the CRC-32C that validating the same batch costs, measured in the same
//! run. Compare with the append path in `storage_*.rs`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use weir::producer_state::{ProducerStateConfig, ProducerStateTable, Verdict};
use wire::Offset;
use wire::batch::BatchHeader;
use zerocopy::FromZeros;

const RECORDS_PER_BATCH: i32 = 10;
const NOW_MS: i64 = 1_700_000_000_000;

fn header(pid: i64, first_seq: i32) -> BatchHeader {
    let mut h = BatchHeader::new_zeroed();
    h.magic = 2;
    h.last_offset_delta.set(RECORDS_PER_BATCH - 1);
    h.max_timestamp.set(NOW_MS);
    h.producer_id.set(pid);
    h.base_sequence.set(first_seq);
    h.records_count.set(RECORDS_PER_BATCH);
    h
}

/// A table with `producers` producers that have each appended 5 batches.
fn populated(producers: i64) -> (ProducerStateTable, Offset) {
    let mut table = ProducerStateTable::new(ProducerStateConfig {
        max_producers: producers as usize + 1,
        ..ProducerStateConfig::default()
    });
    let mut offset = Offset(0);
    for pid in 0..producers {
        for i in 0..5 {
            table.record_append(&header(pid, i * RECORDS_PER_BATCH), offset, NOW_MS);
            offset = offset.add(i64::from(RECORDS_PER_BATCH));
        }
    }
    (table, offset)
}

/// In-order appends: the common case, check then record.
fn in_order(c: &mut Criterion) {
    let mut g = c.benchmark_group("dedup/in_order_check_and_record");
    g.throughput(Throughput::Elements(1));
    for producers in [1i64, 1000, 10_000] {
        g.bench_with_input(
            BenchmarkId::from_parameter(producers),
            &producers,
            |b, &n| {
                let (mut table, mut offset) = populated(n);
                let mut seq = vec![5 * RECORDS_PER_BATCH; n as usize];
                let mut pid = 0usize;
                b.iter(|| {
                    pid = (pid + 7919) % n as usize;
                    let h = header(pid as i64, seq[pid]);
                    let verdict = table.check(black_box(&h));
                    debug_assert_eq!(verdict, Ok(Verdict::Append));
                    table.record_append(&h, offset, NOW_MS);
                    seq[pid] += RECORDS_PER_BATCH;
                    offset = offset.add(i64::from(RECORDS_PER_BATCH));
                    verdict
                });
            },
        );
    }
    g.finish();
}

/// A resend of one of the last 5 batches: found and answered, nothing recorded.
fn duplicate(c: &mut Criterion) {
    let mut g = c.benchmark_group("dedup/duplicate_check");
    g.throughput(Throughput::Elements(1));
    let (mut table, _) = populated(1000);
    let resends: Vec<BatchHeader> = (0..5).map(|i| header(500, i * RECORDS_PER_BATCH)).collect();
    let mut i = 0usize;
    g.bench_function("1000_producers", |b| {
        b.iter(|| {
            i = (i + 1) % resends.len();
            table.check(black_box(&resends[i]))
        })
    });
    g.finish();
}

/// What validating a batch costs anyway: CRC-32C over its bytes.
fn crc_reference(c: &mut Criterion) {
    let mut g = c.benchmark_group("dedup/reference_crc32c");
    for size in [1024usize, 16 * 1024] {
        let buf = vec![0x5au8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &buf, |b, buf| {
            b.iter(|| crc32c::crc32c(black_box(buf)))
        });
    }
    g.finish();
}

criterion_group!(benches, in_order, duplicate, crc_reference);
criterion_main!(benches);
