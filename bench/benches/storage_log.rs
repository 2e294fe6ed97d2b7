//! Partition log benchmarks on the real disk: append throughput by batch size (one
//! producer, and 16 concurrent), read-by-offset latency (DMA and tail cache), and group
//! commit under concurrency with `log.flush.on.ack`. Compare with `fio` sequential
//! direct writes of the same block size (commands in docs/PERFORMANCE.md "storage").

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use weir::storage::testing::{batch_of_size, run_on_shard};
use weir::storage::{Log, LogConfig, prime_dma_probe};
use wire::{LeaderEpoch, Offset};

const SIZES: [(usize, &str); 3] = [(1 << 10, "1KiB"), (16 << 10, "16KiB"), (1 << 20, "1MiB")];

fn bench_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
    std::fs::create_dir_all(&root).ok();
    root
}

fn config(pairs: &[(&str, &str)]) -> LogConfig {
    LogConfig::from_pairs(pairs.iter().copied()).unwrap_or_default()
}

/// How many batches one timed round appends. Each is a copy of the bench's batch made
/// before the round's clock starts: in the broker a batch arrives in its own request
/// buffer, so cloning a `BytesMut` (a full copy) inside the timed loop would charge the
/// log a copy it never makes. 256 × 1 MiB bounds the memory held for a round.
const ROUND_BATCHES: u64 = 256;

/// Appends `iters` copies of `batch` from `tasks` concurrent tasks on a fresh log; returns
/// the time spent appending (the copies are made outside it, `ROUND_BATCHES` at a time)
/// and (appends, fdatasyncs).
fn append_run(batch: BytesMut, iters: u64, tasks: u64, cfg: LogConfig) -> (Duration, u64, u64) {
    let dir = tempfile::tempdir_in(bench_root()).expect("tempdir");
    let path = dir.path().to_path_buf();
    let out = run_on_shard(move || async move {
        prime_dma_probe(&path).await.expect("probe");
        let log = Rc::new(Log::open(path.join("bench-0"), cfg).await.expect("open"));
        let mut elapsed = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let n = left.min(ROUND_BATCHES.max(tasks));
            left -= n;
            let round: Rc<RefCell<Vec<BytesMut>>> =
                Rc::new(RefCell::new((0..n).map(|_| batch.clone()).collect()));
            let start = Instant::now();
            let handles: Vec<_> = (0..tasks)
                .map(|_| {
                    let (log, round) = (log.clone(), round.clone());
                    glommio::spawn_local(async move {
                        loop {
                            let Some(b) = round.borrow_mut().pop() else {
                                break;
                            };
                            log.append(b, LeaderEpoch(0), 0).await.expect("append");
                        }
                    })
                })
                .collect();
            for h in handles {
                h.await;
            }
            elapsed += start.elapsed();
        }
        let c = log.counters();
        (elapsed, c.appends, c.fdatasyncs)
    });
    drop(dir);
    out
}

fn append_throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("storage_append");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    for (size, name) in SIZES {
        let batch = batch_of_size(0, (size / 512).max(1), size);
        g.throughput(Throughput::Bytes(batch.len() as u64));
        for tasks in [1u64, 16] {
            let id = BenchmarkId::new(format!("tasks{tasks}"), name);
            g.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    append_run(batch.clone(), iters, tasks, LogConfig::default()).0
                })
            });
        }
    }
    g.finish();
}

fn group_commit(c: &mut Criterion) {
    let mut g = c.benchmark_group("storage_group_commit");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    let batch = batch_of_size(0, 1, 1 << 10);
    for tasks in [1u64, 8, 64] {
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("flush_on_ack_1KiB", tasks), |b| {
            b.iter_custom(|iters| {
                let cfg = config(&[("log.flush.on.ack", "true")]);
                let (t, appends, syncs) = append_run(batch.clone(), iters.max(tasks), tasks, cfg);
                eprintln!(
                    "group commit tasks={tasks}: {appends} appends, {syncs} fdatasyncs, {:.1} appends/fdatasync",
                    appends as f64 / syncs.max(1) as f64
                );
                // `append_run` appended `iters.max(tasks)` batches; criterion asked for `iters`.
                t * iters as u32 / iters.max(tasks) as u32
            })
        });
    }
    g.finish();
}

/// Fills a log with 1 KiB batches (no tail cache unless `cache`), then times reads of
/// one batch at random offsets.
fn read_run(iters: u64, cache: bool) -> Duration {
    const BATCHES: i64 = 20_000;
    let dir = tempfile::tempdir_in(bench_root()).expect("tempdir");
    let path = dir.path().to_path_buf();
    let out = run_on_shard(move || async move {
        prime_dma_probe(&path).await.expect("probe");
        let cache_bytes = if cache { "64000000" } else { "0" };
        let cfg = config(&[
            ("log.tail.cache.bytes", cache_bytes),
            ("segment.bytes", "4194304"),
        ]);
        let log = Log::open(path.join("bench-0"), cfg).await.expect("open");
        let batch = batch_of_size(0, 1, 1 << 10);
        for _ in 0..BATCHES {
            log.append(batch.clone(), LeaderEpoch(0), 0)
                .await
                .expect("append");
        }
        let end = log.log_end_offset();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let start = Instant::now();
        for _ in 0..iters {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = Offset((x % BATCHES as u64) as i64);
            let r = log.read(at, 1, end).await.expect("read");
            assert_eq!(r.batches.len(), 1);
        }
        start.elapsed()
    });
    drop(dir);
    out
}

fn read_latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("storage_read_by_offset");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.bench_function("dma_1KiB", |b| {
        b.iter_custom(|iters| read_run(iters, false))
    });
    g.bench_function("cache_1KiB", |b| {
        b.iter_custom(|iters| read_run(iters, true))
    });
    g.finish();
}

criterion_group!(benches, append_throughput, group_commit, read_latency);
criterion_main!(benches);
