//! The log cleaner at the `Log` level: a compacted log keeps exactly the latest record of
//! each key with its original offset, tombstones go after `delete.retention.ms`, the disk
//! size shrinks, a crash at any point of a clean leaves every segment old or new (never
//! a mix, never a loss), the dedupe buffer bounds a round, and appends go on during a
//! clean with bounded latency.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weir::storage::testing::run_on_shard;
use weir::storage::{
    CleanBounds, CleanerBudget, Disk, FaultPoint, Log, LogConfig, SimDisk, prime_dma_probe,
};
use wire::batch::{BatchBuilder, NewRecord, batch_records};
use wire::{LeaderEpoch, Offset};

/// A record as a consumer sees it: offset, key, value (None: tombstone).
type Seen = (i64, Vec<u8>, Option<Vec<u8>>);

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn config(pairs: &[(&str, &str)]) -> LogConfig {
    let mut all = vec![
        ("cleanup.policy", "compact"),
        ("log.preallocate", "false"),
        ("index.interval.bytes", "1024"),
    ];
    all.extend_from_slice(pairs);
    LogConfig::from_pairs(all).unwrap()
}

fn budget() -> CleanerBudget {
    CleanerBudget::new(16 << 20, u64::MAX)
}

/// One batch of `(key, value)` records, timestamps `ts`.
fn keyed_batch(ts: i64, records: &[(String, Option<Vec<u8>>)]) -> BytesMut {
    let records = records
        .iter()
        .map(|(k, v)| NewRecord {
            timestamp_ms: ts,
            key: Some(Bytes::copy_from_slice(k.as_bytes())),
            value: v.clone().map(Bytes::from),
            headers: Vec::new(),
        })
        .collect();
    let b = BatchBuilder {
        records,
        ..BatchBuilder::default()
    };
    BytesMut::from(b.build().unwrap())
}

/// Appends `count` records, `per_batch` to a batch, record `i` with key `key(i)`; the
/// value names the record (`v<i>`) padded to `value_bytes`.
async fn write(
    log: &Log,
    first: usize,
    count: usize,
    per_batch: usize,
    key: impl Fn(usize) -> String,
    value_bytes: usize,
    ts: i64,
) {
    for start in (first..first + count).step_by(per_batch) {
        let records: Vec<_> = (start..(start + per_batch).min(first + count))
            .map(|i| {
                let mut v = format!("v{i}-").into_bytes();
                v.resize(value_bytes.max(v.len()), b'x');
                (key(i), Some(v))
            })
            .collect();
        log.append(keyed_batch(ts, &records), LeaderEpoch(1), ts)
            .await
            .unwrap();
    }
}

/// Every record from `from` to the log end, as a consumer reads them (whole batches, so
/// records before `from` in its first batch are skipped as a client does).
async fn read_records(log: &Log, from: Offset) -> Vec<Seen> {
    let end = log.log_end_offset();
    let mut out = Vec::new();
    let mut next = from;
    // Bounded: each read returns at least one batch or ends the loop.
    for _ in 0..1_000_000 {
        if next >= end {
            break;
        }
        let read = log.read(next, 1 << 20, end).await.unwrap();
        if read.batches.is_empty() {
            break;
        }
        for b in &read.batches {
            let (h, records) = batch_records(b, 1 << 24).unwrap();
            for r in records {
                let r = r.unwrap();
                let offset = h.base_offset().get() + i64::from(r.offset_delta);
                if offset >= from.get() {
                    out.push((offset, r.key.unwrap().to_vec(), r.value.map(|v| v.to_vec())));
                }
            }
        }
        assert!(read.next_offset > next, "reads make progress");
        next = read.next_offset;
    }
    out
}

/// What compaction must leave of `records` (all the log's records, in offset order): the
/// latest record of each key below `active_base`, and every record from it on.
fn compacted(records: &[Seen], active_base: i64) -> Vec<Seen> {
    let mut latest: BTreeMap<&[u8], &Seen> = BTreeMap::new();
    for r in records.iter().filter(|r| r.0 < active_base) {
        latest.insert(&r.1, r);
    }
    let mut out: Vec<Seen> = latest.into_values().cloned().collect();
    out.extend(records.iter().filter(|r| r.0 >= active_base).cloned());
    out.sort();
    out
}

fn active_base(log: &Log) -> i64 {
    log.segment_bases().last().unwrap().get()
}

fn disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[test]
fn compaction_keeps_the_latest_value_of_each_key_at_its_offset_and_drops_tombstones_after_the_horizon()
 {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("segment.bytes", "16384"), ("delete.retention.ms", "1000")]);
        let path = root.join("compacted-0");
        let log = Log::open(path.clone(), cfg.clone()).await.unwrap();
        let now = 1_000_000;
        // 10,000 records over 100 keys, 10 to a batch, 40-byte values: ~50 segments.
        write(&log, 0, 10_000, 10, |i| format!("key-{}", i % 100), 40, now).await;
        let before = read_records(&log, Offset(0)).await;
        assert_eq!(before.len(), 10_000);
        let (size_before, disk_before) = (log.size_bytes(), disk_bytes(&path));
        let segments_before = log.segment_count();

        let stats = log.clean_if_due(now, &budget()).await.unwrap();
        let after = read_records(&log, Offset(0)).await;
        let want = compacted(&before, active_base(&log));
        assert_eq!(after, want, "latest value of each key, original offsets");
        let sealed_keys = after.iter().filter(|r| r.0 < active_base(&log)).count();
        assert_eq!(
            sealed_keys, 100,
            "one record per key in the sealed segments"
        );
        let (size_after, disk_after) = (log.size_bytes(), disk_bytes(&path));
        eprintln!(
            "cleaned: {stats:?}; log {size_before} -> {size_after} bytes ({disk_before} -> \
             {disk_after} on disk), {segments_before} segments"
        );
        assert!(stats.rounds >= 1 && stats.segments_swapped > 0);
        assert_eq!(stats.records_removed as usize, before.len() - after.len());
        // The files hold the batches, plus the active segment's zero-padded last block.
        assert!(disk_after >= size_after && disk_after < size_after + 4096);
        assert!(
            size_after * 5 < size_before,
            "the log shrank: {size_before} -> {size_after}"
        );
        // Nothing dirty is left: a second call does nothing.
        assert_eq!(log.clean_if_due(now, &budget()).await.unwrap().rounds, 0);
        // A fetch at an offset that was cleaned away returns the next surviving batch.
        let gap = (0..10_000)
            .find(|o| !after.iter().any(|r| r.0 == *o))
            .unwrap();
        let next = after.iter().find(|r| r.0 > gap).unwrap().0;
        let read = log
            .read(Offset(gap), 1, log.log_end_offset())
            .await
            .unwrap();
        let first = wire::batch::read_header(&read.batches[0]).unwrap();
        assert!(first.base_offset().get() <= next && first.last_offset().get() >= next);

        // Tombstones for 10 keys, then enough values of other keys to seal them.
        let tombstones: Vec<_> = (0..10).map(|k| (format!("key-{k}"), None)).collect();
        log.append(keyed_batch(now, &tombstones), LeaderEpoch(1), now)
            .await
            .unwrap();
        write(
            &log,
            20_000,
            2_000,
            10,
            |i| format!("key-{}", 10 + i % 90),
            40,
            now,
        )
        .await;
        let all = read_records(&log, Offset(0)).await;
        let stats = log.clean_if_due(now + 10, &budget()).await.unwrap();
        assert!(stats.rounds >= 1);
        let marked = read_records(&log, Offset(0)).await;
        assert_eq!(marked, compacted(&all, active_base(&log)));
        let dead = |rs: &[Seen]| rs.iter().filter(|r| r.2.is_none()).count();
        assert_eq!(
            dead(&marked),
            10,
            "tombstones kept before delete.retention.ms"
        );
        // Not yet: the horizon is the first pass plus delete.retention.ms.
        let stats = log.clean_if_due(now + 10 + 999, &budget()).await.unwrap();
        assert_eq!(stats.tombstones_removed, 0);
        let stats = log.clean_if_due(now + 10 + 1000, &budget()).await.unwrap();
        assert_eq!(stats.tombstones_removed, 10, "{stats:?}");
        let gone = read_records(&log, Offset(0)).await;
        assert_eq!(dead(&gone), 0, "tombstones removed after the horizon");
        eprintln!(
            "segments: {segments_before} before, {} now",
            log.segment_count()
        );
        assert!(
            log.segment_count() * 4 < segments_before,
            "small cleaned segments merged"
        );
        for k in 0..10 {
            let key = format!("key-{k}").into_bytes();
            assert!(!gone.iter().any(|r| r.1 == key), "key-{k} is gone entirely");
        }

        // Reopened (clean shutdown, then after a crash: rescan), the log reads the same.
        log.close().await.unwrap();
        let log = Log::open(path.clone(), cfg.clone()).await.unwrap();
        assert_eq!(read_records(&log, Offset(0)).await, gone);
        assert_eq!(
            log.cleaner_checkpoint().unwrap(),
            Offset(active_base(&log)),
            "the checkpoint persisted"
        );
        drop(log);
        let log = Log::open(path, cfg).await.unwrap();
        assert_eq!(read_records(&log, Offset(0)).await, gone);
    });
}

#[test]
fn a_small_dedupe_buffer_cleans_in_rounds_and_young_segments_wait_for_the_lag() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("segment.bytes", "8192")]);
        let log = Log::open(root.join("rounds-0"), cfg.clone()).await.unwrap();
        let now = 5_000;
        // Keys 0..100 then 100..200: a map of ~120 keys needs two rounds.
        write(&log, 0, 1_000, 10, |i| format!("k{:03}", i % 100), 20, now).await;
        write(
            &log,
            1_000,
            1_000,
            10,
            |i| format!("k{:03}", 100 + i % 100),
            20,
            now,
        )
        .await;
        let before = read_records(&log, Offset(0)).await;
        let small = CleanerBudget::new(120 * (4 + 48) + 64, u64::MAX);
        let stats = log.clean_if_due(now, &small).await.unwrap();
        assert!(stats.rounds >= 2, "{stats:?}");
        assert!(stats.map_keys <= 120, "{stats:?}");
        assert_eq!(
            read_records(&log, Offset(0)).await,
            compacted(&before, active_base(&log))
        );

        // min.compaction.lag.ms: segments with records younger than the lag wait.
        let lagged = config(&[
            ("segment.bytes", "8192"),
            ("min.compaction.lag.ms", "60000"),
        ]);
        let log = Log::open(root.join("lag-0"), lagged).await.unwrap();
        write(&log, 0, 1_000, 10, |i| format!("k{}", i % 10), 20, now).await;
        let stats = log.clean_if_due(now + 59_000, &budget()).await.unwrap();
        assert_eq!(stats.rounds, 0, "too young");
        let stats = log.clean_if_due(now + 60_000, &budget()).await.unwrap();
        assert!(stats.segments_swapped > 0, "{stats:?}");

        // Retention: off for `compact` alone, on for `compact,delete`.
        let week_later = now + 8 * 24 * 3600 * 1000;
        assert_eq!(
            log.apply_retention(week_later, log.log_end_offset())
                .await
                .unwrap(),
            0
        );
        let both = config(&[
            ("segment.bytes", "8192"),
            ("cleanup.policy", "compact,delete"),
        ]);
        let log = Log::open(root.join("both-0"), both).await.unwrap();
        write(&log, 0, 1_000, 10, |i| format!("k{}", i % 10), 20, now).await;
        assert!(
            log.apply_retention(week_later, log.log_end_offset())
                .await
                .unwrap()
                > 0
        );

        // A delete-only log is never compacted.
        let plain = LogConfig::from_pairs([("segment.bytes", "8192")]).unwrap();
        let log = Log::open(root.join("plain-0"), plain).await.unwrap();
        write(&log, 0, 1_000, 10, |i| format!("k{}", i % 10), 20, now).await;
        assert_eq!(log.clean_if_due(now, &budget()).await.unwrap().rounds, 0);
    });
}

/// Builds the log for the crash test on `disk`, all durable: 800 records over 30 keys,
/// cleaned once (so its next clean merges the small cleaned segments), then 400 more.
async fn crash_fixture(path: &Path, cfg: &LogConfig, disk: &Rc<SimDisk>) -> Log {
    let log = Log::open_on(path.to_path_buf(), cfg.clone(), Disk::Sim(disk.clone()))
        .await
        .unwrap();
    write(&log, 0, 800, 10, |i| format!("key-{}", i % 30), 30, 1_000).await;
    log.flush(1_000).await.unwrap();
    let first = log.clean_if_due(1_000, &budget()).await.unwrap();
    assert!(first.segments_swapped > 0);
    write(&log, 800, 400, 10, |i| format!("key-{}", i % 30), 30, 1_000).await;
    log.flush(1_000).await.unwrap();
    log
}

/// Each segment's records: base offset → records in `[base, next base)`.
fn by_segment(records: &[Seen], bases: &[Offset]) -> BTreeMap<i64, Vec<Seen>> {
    let mut out = BTreeMap::new();
    for (i, b) in bases.iter().enumerate() {
        let end = bases.get(i + 1).map_or(i64::MAX, |n| n.get());
        let rs = records
            .iter()
            .filter(|r| r.0 >= b.get() && r.0 < end)
            .cloned()
            .collect::<Vec<_>>();
        out.insert(b.get(), rs);
    }
    out
}

#[test]
fn a_crash_at_any_point_of_a_clean_leaves_each_segment_old_or_new_and_loses_nothing() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        let cfg = config(&[("segment.bytes", "4096")]);
        // The reference run: old and new content, and how many disk operations a clean
        // takes.
        let disk = SimDisk::new();
        let log = crash_fixture(&root.join("ref-0"), &cfg, &disk).await;
        let bases = log.segment_bases();
        let old = read_records(&log, Offset(0)).await;
        let points = [
            FaultPoint::Append,
            FaultPoint::Roll,
            FaultPoint::Truncate,
            FaultPoint::IndexWrite,
            FaultPoint::Sync,
            FaultPoint::Swap,
        ];
        let ops_before: u64 = points.iter().map(|p| disk.seen(*p)).sum();
        let stats = log.clean_if_due(1_000, &budget()).await.unwrap();
        let ops: u64 = points.iter().map(|p| disk.seen(*p)).sum::<u64>() - ops_before;
        let new = read_records(&log, Offset(0)).await;
        assert!(stats.segments_swapped >= 3, "{stats:?}");
        assert!(log.segment_count() < bases.len(), "small segments merged");
        assert_eq!(new, compacted(&old, active_base(&log)));
        eprintln!(
            "a clean of {} segments takes {ops} disk operations",
            bases.len()
        );
        assert!(ops > 10);
        // Power loss before each of those operations, then reopen.
        let mut mixed_logs = 0;
        // Crashes that left a `.cleaned` (uncommitted) and a `.swap` (committed) copy.
        let mut leftovers_seen = [0usize; 2];
        for n in 0..ops {
            let disk = SimDisk::new();
            let path = root.join(format!("crash{n}-0"));
            let log = crash_fixture(&path, &cfg, &disk).await;
            disk.set_halt_on_crash(true);
            disk.crash_after(n, None);
            let result = log.clean_if_due(1_000, &budget()).await;
            assert!(
                disk.crashes() == 1,
                "op {n} of {ops} was reached: {result:?}"
            );
            drop(log);
            disk.restart();
            for name in leftover_copies(&path) {
                let kind = usize::from(name.ends_with(".swap"));
                leftovers_seen[kind] += 1;
            }
            let log = Log::open_on(path.clone(), cfg.clone(), Disk::Sim(disk.clone()))
                .await
                .unwrap();
            let now_bases = log.segment_bases();
            assert!(
                now_bases.iter().all(|b| bases.contains(b)),
                "op {n}: segments {now_bases:?} not among {bases:?}"
            );
            let got = read_records(&log, Offset(0)).await;
            let got_segs = by_segment(&got, &now_bases);
            let (old_segs, new_segs) = (by_segment(&old, &now_bases), by_segment(&new, &now_bases));
            let mut new_count = 0;
            for (base, records) in &got_segs {
                let is_old = records == &old_segs[base];
                let is_new = records == &new_segs[base];
                assert!(
                    is_old || is_new,
                    "op {n}: segment {base} is neither old nor new"
                );
                new_count += usize::from(is_new && !is_old);
            }
            mixed_logs += usize::from(new_count > 0);
            // Nothing lost: the latest value of every key is still there.
            assert_eq!(
                compacted(&got, active_base(&log)),
                new,
                "op {n}: a latest value was lost"
            );
            let leftovers = leftover_copies(&path);
            assert!(leftovers.is_empty(), "op {n}: recovery left {leftovers:?}");
            // And the cleaner finishes the job after the restart.
            log.clean_if_due(1_000, &budget()).await.unwrap();
            assert_eq!(read_records(&log, Offset(0)).await, new, "op {n}: re-clean");
        }
        assert!(mixed_logs > 0, "some crashes fell after a committed swap");
        eprintln!("crashes leaving .cleaned / .swap: {leftovers_seen:?}");
        assert!(leftovers_seen[0] > 0, "recovery deleted uncommitted copies");
        assert!(leftovers_seen[1] > 0, "recovery completed committed swaps");
    });
}

#[test]
fn appends_continue_during_a_clean_with_bounded_latency() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    let (p99_idle, p99_cleaning, appends, stats) = run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("segment.bytes", "1048576")]);
        let log = Rc::new(Log::open(root.join("busy-0"), cfg).await.unwrap());
        let now = 1_000;
        // 24 MiB of sealed log: 24,000 records of 1 KiB over 1,000 keys.
        write(
            &log,
            0,
            24_000,
            20,
            |i| format!("key-{}", i % 1000),
            1000,
            now,
        )
        .await;
        let mut seq = 100_000;
        let mut idle = Vec::new();
        for _ in 0..500 {
            idle.push(timed_append(&log, &mut seq, now).await);
        }
        let done = Rc::new(Cell::new(false));
        let cleaner = glommio::spawn_local({
            let (log, done) = (log.clone(), done.clone());
            async move {
                let stats = log.clean_if_due(now, &budget()).await.unwrap();
                done.set(true);
                stats
            }
        });
        let mut busy = Vec::new();
        // Bounded: the clean of 24 MiB ends long before this many appends.
        while !done.get() && busy.len() < 2_000_000 {
            busy.push(timed_append(&log, &mut seq, now).await);
        }
        let stats = cleaner.await;
        (p99(&mut idle), p99(&mut busy), busy.len(), stats)
    });
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let secs = stats.elapsed.as_secs_f64();
    eprintln!(
        "MEASURE append p99 idle {p99_idle:?}, during the clean {p99_cleaning:?} over {appends} \
         appends; cleaned {:.1} MiB of sealed log in {secs:.2} s = {:.1} MiB/s (read {:.1} MiB, \
         {:.1} MiB/s); {stats:?}",
        mib(stats.bytes_before),
        mib(stats.bytes_before) / secs,
        mib(stats.bytes_read),
        mib(stats.bytes_read) / secs,
    );
    assert!(stats.segments_swapped > 10, "{stats:?}");
    assert!(appends >= 20, "appends ran during the clean: {appends}");
    // 500 ms, or ten times the idle p99 on a machine too loaded for that: a clean that
    // does not yield holds appends for its whole run (seconds for 24 MiB).
    let bound = Duration::from_millis(500).max(p99_idle * 10);
    assert!(
        p99_cleaning < bound,
        "append p99 during a clean: {p99_cleaning:?} (idle {p99_idle:?})"
    );
}

/// The cleaner's `.cleaned` / `.swap` files in a partition directory.
fn leftover_copies(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cleaned") || n.ends_with(".swap"))
        .collect()
}

async fn timed_append(log: &Log, seq: &mut u64, now: i64) -> Duration {
    *seq += 1;
    let b = keyed_batch(
        now,
        &[(format!("key-{}", *seq % 1000), Some(vec![7; 1000]))],
    );
    let t = Instant::now();
    log.append(b, LeaderEpoch(1), now).await.unwrap();
    t.elapsed()
}

fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}

#[test]
fn delete_records_during_a_clean_aborts_the_swap_of_removed_segments_and_leaves_no_copy() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("segment.bytes", "16384")]);
        let path = root.join("racing-0");
        let log = Rc::new(Log::open(path.clone(), cfg).await.unwrap());
        let now = 1_000;
        write(&log, 0, 4_000, 10, |i| format!("key-{}", i % 50), 40, now).await;
        let before = read_records(&log, Offset(0)).await;
        // A slow clean (64 KiB/s), and DeleteRecords past half the log while it runs.
        let cleaner = glommio::spawn_local({
            let log = log.clone();
            async move {
                let slow = CleanerBudget::new(16 << 20, 64 << 10);
                log.clean_if_due(now, &slow).await.unwrap()
            }
        });
        glommio::timer::sleep(Duration::from_millis(300)).await;
        let cut = Offset(2_000);
        assert!(log.delete_records_before(cut).await.unwrap() >= cut);
        let stats = cleaner.await;
        // Its map pass alone takes seconds at that rate, so DeleteRecords came first and
        // the first segment it rewrote was gone when it tried to swap it in.
        assert_eq!(stats.segments_swapped, 0, "{stats:?}");
        let start = log.log_start_offset();
        let after = read_records(&log, start).await;
        // Nothing the cleaner kept is lost: from the log start on, the latest value of
        // every key is still there, and what is there is in the log before the clean.
        let want = compacted(&before, active_base(&log));
        let latest_after_start: Vec<Seen> = want
            .iter()
            .filter(|r| r.0 >= start.get())
            .cloned()
            .collect();
        for r in &latest_after_start {
            assert!(after.contains(r), "latest record {r:?} lost");
        }
        for r in &after {
            assert!(before.contains(r), "record {r:?} was never written");
        }
        let copies = leftover_copies(&path);
        assert!(copies.is_empty(), "copies left: {copies:?} ({stats:?})");
        // The next clean finishes the job from the new log start.
        log.clean_if_due(now, &budget()).await.unwrap();
        let done = read_records(&log, log.log_start_offset()).await;
        let want: Vec<Seen> = compacted(&after, active_base(&log));
        assert_eq!(done, want);
    });
}

/// A log holding `k` at offset 0, a transactional batch of producer 7 for `k` at offset 1,
/// then 200 records of other keys in 4 KiB segments (offset 1 is sealed well before the
/// active segment).
async fn txn_fixture(path: &Path) -> Log {
    let log = Log::open(path.to_path_buf(), config(&[("segment.bytes", "4096")]))
        .await
        .unwrap();
    let now = 1_000_000;
    write(&log, 0, 1, 1, |_| "k".to_string(), 40, now).await;
    let txn = BatchBuilder {
        producer_id: wire::ProducerId(7),
        producer_epoch: wire::ProducerEpoch(0),
        transactional: true,
        records: vec![NewRecord {
            timestamp_ms: now,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"in a transaction")),
            headers: Vec::new(),
        }],
        ..BatchBuilder::default()
    };
    log.append(BytesMut::from(txn.build().unwrap()), LeaderEpoch(1), now)
        .await
        .unwrap();
    write(&log, 2, 200, 1, |i| format!("other-{i}"), 40, now).await;
    assert!(active_base(&log) > 20, "offset 1 is in a sealed segment");
    log
}

/// The offsets `k` has in the log.
async fn offsets_of_k(log: &Log) -> Vec<i64> {
    let records = read_records(log, Offset(0)).await;
    records
        .iter()
        .filter(|r| r.1 == b"k")
        .map(|r| r.0)
        .collect()
}

/// `CleanBounds` (the partition's view: last stable offset, aborted transactions): a
/// clean never reaches a segment at or past the last stable offset, and the record of an
/// aborted transaction does not obsolete the key's older value. Unbounded (the cleaner
/// before: what `clean_if_due` still does), the transactional record removes it.
#[test]
fn bounds_keep_what_an_open_or_aborted_transaction_would_obsolete() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let now = 1_000_000;
        let aborted = [weir::storage::AbortedTxn {
            producer_id: wire::ProducerId(7),
            first_offset: Offset(1),
            last_offset: Offset(2),
            last_stable_offset: Offset(3),
        }];

        // Open transaction at offset 1: only segments wholly below it may be cleaned.
        let log = txn_fixture(&root.join("open-0")).await;
        let open = CleanBounds::new(Offset(1), &[]);
        let stats = log
            .clean_if_due_within(now, &budget(), &open)
            .await
            .unwrap();
        assert_eq!(
            stats.rounds, 0,
            "the first segment holds offset 1: nothing cleanable"
        );
        assert_eq!(offsets_of_k(&log).await, vec![0, 1]);
        assert_eq!(log.cleaner_checkpoint().unwrap(), Offset(0));

        // Aborted: the rest is cleaned, `k` keeps its value at offset 0.
        let bounds = CleanBounds::new(log.log_end_offset(), &aborted);
        let stats = log
            .clean_if_due_within(now, &budget(), &bounds)
            .await
            .unwrap();
        assert!(stats.rounds >= 1, "cleaned: {stats:?}");
        assert_eq!(
            offsets_of_k(&log).await,
            vec![0, 1],
            "the aborted record hid nothing"
        );
        log.close().await.unwrap();

        // Unbounded, the transactional record is the key's latest: offset 0 goes.
        let log = txn_fixture(&root.join("unbounded-0")).await;
        let unbounded = CleanBounds::unbounded();
        let stats = log
            .clean_if_due_within(now, &budget(), &unbounded)
            .await
            .unwrap();
        assert!(stats.rounds >= 1);
        assert_eq!(offsets_of_k(&log).await, vec![1]);
        log.close().await.unwrap();
    });
}

/// `cleanup.policy=compact,delete`: a sealed segment the cleaner emptied (every key in it
/// overwritten later) has no timestamp; time retention must go on past it to the expired
/// segments after it, not stop there for as long as the topic stays quiet.
#[test]
fn an_emptied_segment_does_not_stop_time_retention() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[
            ("cleanup.policy", "compact,delete"),
            ("retention.ms", "1000"),
            // Two segments do not fit one: each is cleaned on its own.
            ("segment.bytes", "1000"),
        ]);
        let log = Log::open(root.join("quiet-0"), cfg).await.unwrap();
        let now = 1_000_000;
        // Segment 0: keys 0..10; segment 1: the same keys again; segment 2: active.
        write(&log, 0, 10, 10, |i| format!("key-{i}"), 40, now).await;
        log.roll().unwrap();
        write(&log, 10, 10, 10, |i| format!("key-{}", i - 10), 40, now).await;
        log.roll().unwrap();
        // Recent: retention deletes an expired active segment too (rolling first).
        write(&log, 20, 1, 1, |_| "other".to_string(), 40, now + 10_000).await;
        let stats = log.clean_if_due(now, &budget()).await.unwrap();
        assert!(stats.segments_swapped > 0, "{stats:?}");
        assert_eq!(log.segment_count(), 3);
        assert_eq!(
            read_records(&log, Offset(0)).await.first().map(|r| r.0),
            Some(10),
            "segment 0 emptied"
        );
        let deleted = log
            .apply_retention(now + 10_000, log.log_end_offset())
            .await
            .unwrap();
        assert_eq!(
            deleted, 2,
            "the emptied segment and the expired one after it"
        );
        assert_eq!(log.log_start_offset(), Offset(20));
    });
}

/// A truncation below the cleaner checkpoint lowers it (Kafka's maybeTruncateCheckpoint):
/// records appended again below the old checkpoint must be mapped by the next clean, else
/// a tombstone among them could be dropped while the value it deletes stays.
#[test]
fn a_truncation_below_the_cleaner_checkpoint_lowers_it() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("segment.bytes", "16384")]);
        let path = root.join("cut-0");
        let log = Log::open(path.clone(), cfg.clone()).await.unwrap();
        let now = 1_000_000;
        write(&log, 0, 2_000, 10, |i| format!("key-{}", i % 100), 40, now).await;
        log.clean_if_due(now, &budget()).await.unwrap();
        let cleaned = log.cleaner_checkpoint().unwrap();
        assert!(cleaned > Offset(100), "cleaned up to {cleaned}");
        let end = log.truncate_to(cleaned.add(-1)).await.unwrap();
        assert!(end < cleaned, "cut at {end}");
        assert_eq!(log.cleaner_checkpoint().unwrap(), end);
        log.close().await.unwrap();
        let reopened = Log::open(path, cfg).await.unwrap();
        assert_eq!(reopened.cleaner_checkpoint().unwrap(), end, "kept on disk");
    });
}

/// A cleaned segment keeps the newest modified time of the segments it replaces (Kafka's
/// cleaner does the same): time retention ages a segment without timestamps by its
/// file's modified time, and a clean must not make such a segment young again.
#[test]
fn a_cleaned_segment_keeps_its_sources_modified_time() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("segment.bytes", "1000")]);
        let path = root.join("aged-0");
        let log = Log::open(path.clone(), cfg).await.unwrap();
        let now = 1_000_000;
        write(&log, 0, 10, 10, |i| format!("key-{i}"), 40, now).await;
        log.roll().unwrap();
        write(&log, 10, 10, 10, |i| format!("key-{}", i - 10), 40, now).await;
        log.roll().unwrap();
        write(&log, 20, 1, 1, |_| "other".to_string(), 40, now).await;
        let first = path.join("00000000000000000000.log");
        let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        std::fs::File::options()
            .write(true)
            .open(&first)
            .and_then(|f| f.set_modified(old))
            .unwrap();
        let stats = log.clean_if_due(now, &budget()).await.unwrap();
        assert!(stats.segments_swapped > 0, "{stats:?}");
        let modified = std::fs::metadata(&first)
            .and_then(|m| m.modified())
            .unwrap();
        assert_eq!(modified, old, "the cleaned copy of segment 0 kept its time");
    });
}

/// A batch with a correct CRC whose one record lacks its headers count: stored fine, but
/// the cleaner cannot read it.
fn undecodable_batch(ts: i64) -> BytesMut {
    let mut b = keyed_batch(ts, &[("k".to_string(), None)]).to_vec();
    assert_eq!(b.len(), 61 + 8, "one 7-byte record");
    assert_eq!(b[61], 14, "record length 7 (zigzag)");
    b.pop();
    b[61] = 12;
    let length = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    BytesMut::from(&b[..])
}

/// A sealed segment the cleaner cannot read fails one clean; later calls skip the log
/// (nothing read) while that segment is there unchanged, instead of re-reading it every
/// `log.cleaner.backoff.ms` and logging the same error forever. A restart tries again.
#[test]
fn a_damaged_segment_is_not_re_read_every_backoff() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[]);
        let path = root.join("damaged-0");
        let log = Log::open(path.clone(), cfg.clone()).await.unwrap();
        let now = 1_000_000;
        write(&log, 0, 10, 10, |i| format!("key-{i}"), 40, now).await;
        log.append(undecodable_batch(now), LeaderEpoch(1), now)
            .await
            .unwrap();
        log.roll().unwrap();
        write(&log, 11, 10, 10, |i| format!("key-{}", i % 5), 40, now).await;
        let first = log.clean_if_due(now, &budget()).await;
        assert!(
            matches!(first, Err(weir::storage::StorageError::Corrupt { .. })),
            "{first:?}"
        );
        for _ in 0..3 {
            let again = log.clean_if_due(now, &budget()).await.unwrap();
            assert_eq!((again.rounds, again.bytes_read), (0, 0), "{again:?}");
        }
        log.close().await.unwrap();
        let reopened = Log::open(path, cfg).await.unwrap();
        assert!(reopened.clean_if_due(now, &budget()).await.is_err());
    });
}
