//! Sealed segments' indexes on the real disk: read back from their files through the
//! shard's bounded index cache (`log.index.cache.bytes`), after a reopen with the cache
//! cold, from damaged files; and `segment.index.bytes` rolling the active segment.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;

use weir::storage::testing::{batch_of_size, run_on_shard};
use weir::storage::{
    Log, LogConfig, prime_dma_probe, set_shard_index_cache_bytes, shard_index_cache_stats,
};
use wire::{LeaderEpoch, Offset};

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn config(pairs: &[(&str, &str)]) -> LogConfig {
    LogConfig::from_pairs(pairs.iter().copied()).unwrap()
}

/// Batches of one record each: offset `i` holds timestamp `ts(i)`.
const BATCHES: i64 = 200;

fn ts(i: i64) -> i64 {
    1_000 + 10 * i
}

/// Small segments (4 KiB) with an index entry every ~300-byte batch: ~15 sealed segments
/// of ~12 entries each. No tail cache: every read goes to the segment files.
fn small_segments() -> LogConfig {
    config(&[
        ("segment.bytes", "4096"),
        ("index.interval.bytes", "256"),
        ("log.tail.cache.bytes", "0"),
    ])
}

async fn fill(log: &Log) {
    for i in 0..BATCHES {
        log.append(batch_of_size(ts(i), 1, 300), LeaderEpoch(1), 0)
            .await
            .unwrap();
    }
}

/// Memory for sealed segments' index entries: the shard's cache plus what the log's
/// sealed segments hold themselves.
fn sealed_index_memory(log: &Log) -> u64 {
    shard_index_cache_stats().held_bytes + log.sealed_index_bytes_held()
}

/// Reads every offset (in an order that jumps between segments) and looks up every
/// timestamp, checking each answer and that sealed index memory stays within `bound`.
async fn check_every_read(log: &Log, bound: u64) {
    let end = Offset(BATCHES);
    for k in 0..BATCHES {
        let i = (k * 37) % BATCHES;
        let read = log.read(Offset(i), 1, end).await.unwrap();
        let h = wire::batch::read_header(&read.batches[0]).unwrap();
        assert_eq!(h.base_offset(), Offset(i), "read at {i}");
        assert_eq!(h.max_timestamp(), ts(i), "batch at {i}");
        let found = log.read_by_time(ts(i) - 5).await.unwrap();
        assert_eq!(found, Some((Offset(i), ts(i))), "by time before {i}");
        let memory = sealed_index_memory(log);
        assert!(memory <= bound, "sealed index memory {memory} over {bound}");
    }
    assert_eq!(log.read_by_time(ts(BATCHES)).await.unwrap(), None);
}

/// With a cache far smaller than the sealed segments' indexes, the memory they take
/// stays within the bound while reads by offset and by time across every segment
/// return the right batches; after a reopen, with the cache cold, too.
#[test]
fn sealed_indexes_stay_within_the_cache_bound_and_reads_stay_right() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        // About two segments' indexes.
        let bound = 1024;
        set_shard_index_cache_bytes(bound);
        let pdir = root.join("t-0");
        let log = Log::open(pdir.clone(), small_segments()).await.unwrap();
        fill(&log).await;
        let segments = log.segment_count();
        assert!(segments >= 10, "{segments} segments");
        assert!(sealed_index_memory(&log) <= bound);
        let before = shard_index_cache_stats();
        check_every_read(&log, bound).await;
        let after = shard_index_cache_stats();
        assert!(
            after.loads > before.loads + segments as u64,
            "indexes read back from their files: {after:?}"
        );
        assert!(after.evictions > before.evictions, "{after:?}");

        log.close().await.unwrap();
        drop(log);
        assert_eq!(shard_index_cache_stats().indexes, 0, "closed log's left");
        let log = Log::open(pdir, small_segments()).await.unwrap();
        assert_eq!(shard_index_cache_stats().indexes, 0, "cold after the open");
        assert!(sealed_index_memory(&log) <= bound);
        let loads = shard_index_cache_stats().loads;
        check_every_read(&log, bound).await;
        assert!(shard_index_cache_stats().loads > loads + segments as u64);
        log.close().await.unwrap();
    });
}

fn segment_file(pdir: &Path, base: Offset, ext: &str) -> std::path::PathBuf {
    pdir.join(format!("{:020}.{ext}", base.get()))
}

/// Index files damaged after the log opened are found when a read loads them: no
/// panic, and reads by offset and by time still answer right (the segment is scanned).
#[test]
fn damaged_index_files_found_on_a_later_load_fall_back_to_a_scan() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        // Nothing kept: every lookup in a sealed segment reads its files.
        set_shard_index_cache_bytes(0);
        let pdir = root.join("t-0");
        let log = Log::open(pdir.clone(), small_segments()).await.unwrap();
        fill(&log).await;
        let bases = log.segment_bases();
        assert!(bases.len() >= 4, "{bases:?}");
        // Not a whole number of entries.
        std::fs::write(segment_file(&pdir, bases[1], "index"), [7u8; 13]).unwrap();
        std::fs::write(segment_file(&pdir, bases[1], "timeindex"), [1u8; 5]).unwrap();
        // Whole entries, out of order.
        let index = segment_file(&pdir, bases[2], "index");
        let mut entries = std::fs::read(&index).unwrap();
        assert!(entries.len() >= 16);
        entries.rotate_left(8);
        std::fs::write(&index, entries).unwrap();
        let times = segment_file(&pdir, bases[2], "timeindex");
        let mut entries = std::fs::read(&times).unwrap();
        assert!(entries.len() >= 24);
        entries.rotate_left(12);
        std::fs::write(&times, entries).unwrap();
        // Gone.
        std::fs::remove_file(segment_file(&pdir, bases[3], "index")).unwrap();
        check_every_read(&log, 0).await;
        log.close().await.unwrap();
        drop(log);
        // The next open rebuilds them.
        set_shard_index_cache_bytes(1 << 20);
        let log = Log::open(pdir.clone(), small_segments()).await.unwrap();
        for base in &bases[1..4] {
            let index = std::fs::read(segment_file(&pdir, *base, "index")).unwrap();
            assert!(!index.is_empty() && index.len().is_multiple_of(8), "{base}");
        }
        check_every_read(&log, 1 << 20).await;
        log.close().await.unwrap();
    });
}

/// `segment.index.bytes`: the active segment rolls before its offset or time index
/// would grow past it, as Kafka rolls a segment whose index is full.
#[test]
fn segment_index_bytes_rolls_the_segment_when_its_index_fills() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        // An entry for every batch after the first; 64 bytes: 8 offset or 5 time entries.
        let cfg = config(&[
            ("index.interval.bytes", "0"),
            ("segment.index.bytes", "64"),
            ("log.tail.cache.bytes", "0"),
        ]);
        let pdir = root.join("t-0");
        let log = Log::open(pdir.clone(), cfg.clone()).await.unwrap();
        fill(&log).await;
        let bases = log.segment_bases();
        // 1 GiB segments would never roll on size: only the index bound rolls them.
        assert!(
            bases.len() >= BATCHES as usize / 6,
            "{} segments",
            bases.len()
        );
        log.close().await.unwrap();
        for base in &bases {
            let index = std::fs::read(segment_file(&pdir, *base, "index")).unwrap();
            let times = std::fs::read(segment_file(&pdir, *base, "timeindex")).unwrap();
            assert!(index.len() <= 64, "{base}: .index of {} bytes", index.len());
            assert!(
                times.len() <= 64,
                "{base}: .timeindex of {} bytes",
                times.len()
            );
        }
        drop(log);
        let log = Log::open(pdir, cfg).await.unwrap();
        check_every_read(&log, u64::MAX).await;
        log.close().await.unwrap();
    });
}

/// Reads of many distinct sealed segments at once, with the cache cold, keep the memory
/// of index entries within the bound: each load counts against it from before it reads
/// its files until its index is cached or let go. Before, each load's index sat beside
/// a full cache until it was inserted, and many at once went far past the bound (found
/// by review). Every read is answered (no load waits forever for room).
#[test]
fn concurrent_loads_of_many_segments_stay_within_the_cache_bound() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        // About two segments' indexes.
        let bound = 1024;
        set_shard_index_cache_bytes(bound);
        let pdir = root.join("t-0");
        let log = Log::open(pdir.clone(), small_segments()).await.unwrap();
        fill(&log).await;
        log.close().await.unwrap();
        drop(log);
        let log = Log::open(pdir, small_segments()).await.unwrap();
        let segments = log.segment_count() as u64;
        let loads = shard_index_cache_stats().loads;
        let (log, end) = (&log, Offset(BATCHES));
        let reads = (0..BATCHES)
            .step_by(7)
            .map(|i| Box::pin(async move { (i, log.read(Offset(i), 1, end).await.unwrap()) }));
        for (i, read) in weir::event::join_all(reads.collect()).await {
            let h = wire::batch::read_header(&read.batches[0]).unwrap();
            assert_eq!(h.base_offset(), Offset(i), "read at {i}");
        }
        let stats = shard_index_cache_stats();
        assert!(stats.loads >= loads + segments - 1, "{stats:?}");
        assert_eq!(stats.reserved_bytes, 0, "{stats:?}");
        assert!(
            stats.peak_bytes <= bound,
            "index entries in memory at once: {stats:?}"
        );
        log.close().await.unwrap();
    });
}
