//! Read-ahead (storage/readahead.rs) on the real disk: a reader going through a log
//! sequentially, past the tail cache, gets byte for byte what was appended, with the
//! next window read ahead, also when the log changes under a window read ahead:
//! truncation and appends of other bytes at the same positions, a roll and
//! DeleteRecords, a truncation to the log start (every segment file replaced). The same
//! reads with `log.read.ahead.bytes=0` return the same bytes.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;

use bytes::BytesMut;
use weir::storage::testing::{build_batch, run_on_shard};
use weir::storage::{Log, LogConfig, prime_dma_probe, shard_read_ahead_bytes};
use wire::{LeaderEpoch, Offset};

/// Bytes of each record value: a batch is a little over 4 KiB.
const VALUE_BYTES: usize = 4000;
/// Bytes a read asks for: the smallest window (64 KiB), about 16 batches.
const READ_BYTES: usize = 64 << 10;
/// Bound on the reads of one pass (the log holds far fewer windows).
const READS_MAX: usize = 10_000;
const EPOCH: LeaderEpoch = LeaderEpoch(3);

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// A one-record batch whose value names its generation and index, so batches appended
/// at the same offset after a truncation differ from the ones they replace.
fn batch(generation: u32, i: u32) -> BytesMut {
    let tag = format!("gen {generation} batch {i} ");
    let value: Vec<u8> = tag.bytes().cycle().take(VALUE_BYTES).collect();
    build_batch(
        i64::from(generation) * 1_000_000 + i64::from(i),
        &[&value[..]],
    )
}

/// What the log must hold: each batch's bytes by base offset (offsets and epoch stamped
/// as the log stamps them).
#[derive(Default)]
struct Model(BTreeMap<i64, Vec<u8>>);

impl Model {
    async fn append(&mut self, log: &Log, generation: u32, count: u32) {
        for i in 0..count {
            let b = batch(generation, i);
            let mut want = b.clone();
            let info = log.append(b, EPOCH, 0).await.unwrap();
            wire::batch::assign_offsets(&mut want, info.first_offset, EPOCH).unwrap();
            self.0.insert(info.first_offset.get(), want.to_vec());
        }
    }

    fn truncate(&mut self, offset: Offset) {
        self.0.retain(|&base, _| base < offset.get());
    }
}

/// Reads sequentially from `from` until `until` (or the log end), checking every batch
/// against the model; returns where it stopped.
async fn read_through(log: &Log, model: &Model, from: Offset, until: Offset) -> Offset {
    let mut at = from;
    let end = log.log_end_offset();
    for _ in 0..READS_MAX {
        if at >= until.min(end) {
            return at;
        }
        let read = log.read(at, READ_BYTES, end).await.unwrap();
        assert!(!read.batches.is_empty(), "nothing read at {at}");
        for got in &read.batches {
            let h = wire::batch::read_header(got).unwrap();
            assert_eq!(h.base_offset(), at, "batches contiguous");
            let want = model.0.get(&at.get()).unwrap();
            assert!(
                got[..] == want[..],
                "batch at offset {at} differs from what was appended"
            );
            at = h.next_offset();
        }
        assert_eq!(read.next_offset, at);
    }
    panic!("read did not reach {until} in {READS_MAX} reads");
}

/// The scenario, on a log in `dir` with `pairs` as its settings; returns the log's read-
/// ahead counters (windows read ahead, reads that found theirs) after each phase.
async fn scenario(dir: std::path::PathBuf, pairs: &[(&str, &str)]) -> Vec<(u64, u64)> {
    prime_dma_probe(dir.parent().unwrap()).await.unwrap();
    let cfg = LogConfig::from_pairs(pairs.iter().copied()).unwrap();
    let log = Log::open(dir, cfg).await.unwrap();
    let mut model = Model::default();
    let mut phases = Vec::new();
    let mut note = |log: &Log| {
        let c = log.counters();
        phases.push((c.read_ahead_reads, c.read_ahead_hits));
    };
    model.append(&log, 0, 400).await;
    assert!(log.segment_count() >= 5, "several segments");

    // 1. Sequentially into the second segment: every window after the second is read
    // ahead, and a window is waiting at the position we stop at (16 batches a read, so
    // not at a segment's end).
    let at = read_through(&log, &model, Offset(0), Offset(100)).await;
    note(&log);

    // 2. Truncation inside the waiting window (a few batches after its start), then
    // other bytes at the same positions of the same file: the next read starts where
    // the window does, and must get the new bytes, not the window's.
    let cut = at.add(4);
    assert_eq!(log.truncate_to(cut).await.unwrap(), cut);
    model.truncate(cut);
    model.append(&log, 1, 150).await;
    let at = read_through(&log, &model, at, Offset(200)).await;
    note(&log);

    // 3. A roll and DeleteRecords (the segments below the reader go) while a window
    // waits; then on through the new segments to the end.
    log.roll().unwrap();
    model.append(&log, 2, 100).await;
    assert_eq!(log.delete_records_before(at).await.unwrap(), at);
    let at = read_through(&log, &model, at, log.log_end_offset()).await;
    assert_eq!(at, log.log_end_offset());
    note(&log);

    // 4. Truncation to the log start: every segment goes, the log restarts empty there
    // in a new file.
    let start = log.log_start_offset();
    log.truncate_to(start).await.unwrap();
    model.truncate(start);
    model.append(&log, 3, 100).await;
    let at = read_through(&log, &model, start, log.log_end_offset()).await;
    assert_eq!(at, log.log_end_offset());
    note(&log);

    log.close().await.unwrap();
    drop(log);
    assert_eq!(
        shard_read_ahead_bytes(),
        0,
        "every window's budget given back"
    );
    phases
}

/// No tail cache, 256 KiB segments: every read goes to the segment files.
const SETTINGS: &[(&str, &str)] = &[("log.tail.cache.bytes", "0"), ("segment.bytes", "262144")];

#[test]
fn sequential_reads_are_read_ahead_and_byte_identical_across_truncation_roll_and_delete() {
    let dir = tempdir();
    let path = dir.path().join("t-0");
    let phases = run_on_shard(move || scenario(path, SETTINGS));
    // Each phase's reads found windows read ahead (phase 1 from its third read on; after
    // each change the reader is sequential again from its second read).
    let mut before = (0, 0);
    for (i, &(reads, hits)) in phases.iter().enumerate() {
        assert!(
            hits > before.1,
            "phase {}: no read found its window: {phases:?}",
            i + 1
        );
        assert!(reads >= hits, "{phases:?}");
        before = (reads, hits);
    }
}

#[test]
fn with_read_ahead_off_the_same_reads_return_the_same_bytes() {
    let dir = tempdir();
    let path = dir.path().join("t-0");
    let mut settings = SETTINGS.to_vec();
    settings.push(("log.read.ahead.bytes", "0"));
    let phases = run_on_shard(move || async move { scenario(path, &settings).await });
    assert!(phases.iter().all(|&p| p == (0, 0)), "{phases:?}");
}

/// A sequential reader whose reads are the size of the read-ahead window is served from
/// its windows alone: each window is read once, where the previous read ended. (Reading
/// ahead from the offset index's position, one batch early, left the end of every answer
/// outside its window, so each read read a second window: every byte twice.)
#[test]
fn a_sequential_reader_reads_each_window_once() {
    let dir = tempdir();
    let path = dir.path().join("t-0");
    let (counters, reads) = run_on_shard(move || async move {
        prime_dma_probe(path.parent().unwrap()).await.unwrap();
        let pairs = [("log.tail.cache.bytes", "0"), ("segment.bytes", "67108864")];
        let cfg = LogConfig::from_pairs(pairs.iter().copied()).unwrap();
        let log = Log::open(path, cfg).await.unwrap();
        // Batches of several records: the index keys a batch by its last offset, so a
        // lookup of the offset after a batch lands on that batch, not the next one.
        let mut model = Model::default();
        for i in 0..300u32 {
            let values: Vec<Vec<u8>> = (0..4u8).map(|r| vec![r; VALUE_BYTES / 4]).collect();
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            let b = build_batch(i64::from(i), &refs);
            let mut want = b.clone();
            let info = log.append(b, EPOCH, 0).await.unwrap();
            wire::batch::assign_offsets(&mut want, info.first_offset, EPOCH).unwrap();
            model.0.insert(info.first_offset.get(), want.to_vec());
        }
        assert_eq!(
            log.segment_count(),
            1,
            "one segment: no window ends at a roll"
        );
        let before = log.counters();
        let end = read_through(&log, &model, Offset(0), log.log_end_offset()).await;
        assert_eq!(end, log.log_end_offset());
        let after = log.counters();
        log.close().await.unwrap();
        (after, after.disk_reads - before.disk_reads)
    });
    assert!(reads >= 10, "{reads} reads: several windows");
    // The first read is not sequential yet (nothing read ahead for it), the second starts
    // the read-ahead; every later one finds its window.
    assert_eq!(counters.read_ahead_hits, reads - 2, "{counters:?}");
    assert_eq!(
        counters.window_reads, 2,
        "only the first two reads read windows of their own: {counters:?}"
    );
}
