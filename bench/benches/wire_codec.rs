//! Per-request cost of the hot-path codecs: parsing a Produce request (zero-copy view) and
//! encoding a Fetch response as chunks (no record copy). Shapes: one partition with one
//! 16 KiB batch, and 64 partitions × 16 KiB across 4 topics; Produce v7 (classic) and v9
//! (flexible), Fetch v11 (classic) and v12 (flexible).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wire::batch::{BatchBuilder, NewRecord};
use wire::bytes::{Bytes, BytesMut};
use wire::fetch::{
    FetchPartitionResponse, FetchResponseParts, FetchTopicResponse, encode_fetch_response,
};
use wire::produce::{ProducePartition, ProduceRequestView, ProduceTopic};

fn batch_16k() -> Bytes {
    let records = (0..148)
        .map(|i| NewRecord::value(1_700_000_000_000 + i, vec![7u8; 100]))
        .collect();
    BatchBuilder {
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("bench batch builds")
}

fn produce_body(version: i16, topics: usize, partitions: usize, batch: &Bytes) -> Bytes {
    let view = ProduceRequestView {
        version,
        transactional_id: None,
        acks: -1,
        timeout_ms: 30_000,
        topics: (0..topics)
            .map(|t| ProduceTopic {
                name: Bytes::from(format!("bench-topic-{t}")),
                partitions: (0..partitions)
                    .map(|p| ProducePartition {
                        index: p as i32,
                        records: Some(batch.clone()),
                    })
                    .collect(),
            })
            .collect(),
    };
    let mut out = BytesMut::new();
    view.encode_body(&mut out);
    out.freeze()
}

fn fetch_parts(topics: usize, partitions: usize, batch: &Bytes) -> FetchResponseParts {
    FetchResponseParts {
        topics: (0..topics)
            .map(|t| FetchTopicResponse {
                topic: Bytes::from(format!("bench-topic-{t}")),
                topic_id: 0,
                partitions: (0..partitions)
                    .map(|p| FetchPartitionResponse {
                        partition_index: p as i32,
                        high_watermark: 1_000_000,
                        last_stable_offset: 1_000_000,
                        log_start_offset: 0,
                        records: Some(vec![batch.clone()]),
                        ..FetchPartitionResponse::default()
                    })
                    .collect(),
            })
            .collect(),
        ..FetchResponseParts::default()
    }
}

const SHAPES: [(&str, usize, usize); 2] = [("1x1", 1, 1), ("4x16", 4, 16)];

fn produce_decode(c: &mut Criterion) {
    let batch = batch_16k();
    let mut g = c.benchmark_group("produce_request_decode");
    for version in [7i16, 9] {
        for (label, topics, partitions) in SHAPES {
            let body = produce_body(version, topics, partitions, &batch);
            g.throughput(Throughput::Elements(1));
            let id = BenchmarkId::new(format!("v{version}"), label);
            g.bench_with_input(id, &body, |b, body| {
                b.iter(|| {
                    ProduceRequestView::parse(black_box(body), version).map(|v| v.topics.len())
                })
            });
        }
    }
    g.finish();
}

fn fetch_encode(c: &mut Criterion) {
    let batch = batch_16k();
    let mut g = c.benchmark_group("fetch_response_encode");
    for version in [11i16, 12] {
        for (label, topics, partitions) in SHAPES {
            let parts = fetch_parts(topics, partitions, &batch);
            g.throughput(Throughput::Elements(1));
            let id = BenchmarkId::new(format!("v{version}"), label);
            g.bench_with_input(id, &parts, |b, parts| {
                b.iter(|| encode_fetch_response(7, version, black_box(parts)).map(|c| c.len()))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, produce_decode, fetch_encode);
criterion_main!(benches);
