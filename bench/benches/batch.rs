//! Record batch validation beside raw CRC-32C over the same bytes.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn crc(c: &mut Criterion) {
    let buf = vec![0xa5u8; 16 * 1024];
    let mut g = c.benchmark_group("crc32c");
    g.throughput(Throughput::Bytes(buf.len() as u64));
    g.bench_function("16KiB", |b| {
        b.iter(|| crc32c::crc32c(std::hint::black_box(&buf)))
    });
    g.finish();
}

criterion_group!(benches, crc);
criterion_main!(benches);
