//! Producer-state snapshots on a real partition log on the real disk: written at segment
//! roll and at clean shutdown, and the state rebuilt on open — from the newest snapshot,
//! from an older one when the newest is damaged, or from the whole log — always equal to
//! the state the live partition had.

use std::path::{Path, PathBuf};

use bytes::BytesMut;
use weir::producer_state::partition::{PartitionProducers, ProducerAppend, SNAPSHOTS_KEPT};
use weir::producer_state::{
    ProducerStateConfig, ProducerStateTable, decode_snapshot, parse_snapshot_file_name,
};
use weir::storage::testing::run_on_shard;
use weir::storage::{Log, LogConfig, prime_dma_probe};
use wire::batch::{BatchBuilder, NewRecord, read_header};
use wire::{LeaderEpoch, Offset, ProducerEpoch, ProducerId, Sequence};

/// One clock for the whole test, so live and rebuilt entries carry the same last-seen.
const NOW_MS: i64 = 1_700_000_000_000;
const PRODUCERS: i64 = 3;
const ROUNDS: i32 = 60;

fn test_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
    std::fs::create_dir_all(&root).expect("create target/tmp");
    root
}

fn batch(pid: i64, first_seq: i32, count: i32) -> BytesMut {
    let records = (0..count)
        .map(|i| NewRecord::value(NOW_MS, format!("p{pid}-s{}", first_seq + i)))
        .collect();
    let bytes = BatchBuilder {
        producer_id: ProducerId(pid),
        producer_epoch: ProducerEpoch(0),
        base_sequence: Sequence(first_seq),
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("a batch from test data");
    BytesMut::from(&bytes[..])
}

async fn open(dir: &Path) -> (Log, PartitionProducers) {
    let config = LogConfig::from_pairs([("segment.bytes", "2048")]).expect("log config");
    let log = Log::open(dir.to_path_buf(), config)
        .await
        .expect("open log");
    let producers = PartitionProducers::open(&log, ProducerStateConfig::default(), NOW_MS)
        .await
        .expect("rebuild producer state");
    (log, producers)
}

fn snapshots(dir: &Path) -> Vec<(Offset, PathBuf)> {
    let mut found: Vec<(Offset, PathBuf)> = std::fs::read_dir(dir)
        .expect("read partition dir")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str().and_then(parse_snapshot_file_name)?;
            Some((name, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// Appends, resends and gaps from several producers; returns the live table.
async fn produce_workload(log: &Log, producers: &PartitionProducers) -> ProducerStateTable {
    let mut next = vec![0i32; PRODUCERS as usize];
    for round in 0..ROUNDS {
        for pid in 0..PRODUCERS {
            let seq = next[pid as usize];
            let outcome = producers
                .append(log, batch(pid, seq, 3), LeaderEpoch(0), NOW_MS)
                .await;
            assert!(
                matches!(outcome, Ok(ProducerAppend::Appended(_))),
                "{outcome:?}"
            );
            next[pid as usize] += 3;
            if round % 7 == 0 {
                let again = producers
                    .append(log, batch(pid, seq, 3), LeaderEpoch(0), NOW_MS)
                    .await;
                assert!(
                    matches!(again, Ok(ProducerAppend::Duplicate(_))),
                    "{again:?}"
                );
                let gap = producers
                    .append(log, batch(pid, seq + 10, 1), LeaderEpoch(0), NOW_MS)
                    .await;
                assert!(matches!(gap, Ok(ProducerAppend::Rejected(45))), "{gap:?}");
            }
        }
    }
    assert_eq!(
        log.log_end_offset(),
        Offset(i64::from(ROUNDS) * PRODUCERS * 3)
    );
    producers.table()
}

/// The table a snapshot plus the log after it gives.
async fn rebuilt_from(log: &Log, snapshot: &Path, offset: Offset) -> ProducerStateTable {
    let bytes = std::fs::read(snapshot).expect("read snapshot");
    let mut table =
        decode_snapshot(&bytes, offset, ProducerStateConfig::default()).expect("decode snapshot");
    let mut at = offset;
    for _ in 0..10_000 {
        if at >= log.log_end_offset() {
            break;
        }
        let read = log
            .read(at, 1 << 20, log.log_end_offset())
            .await
            .expect("read log");
        for b in &read.batches {
            table.replay(read_header(b).expect("batch header"), NOW_MS);
        }
        at = read.next_offset;
    }
    table
}

#[test]
fn snapshots_at_roll_plus_replay_equal_the_live_state() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let dir = root.path().join("idem-0");
        let (log, producers) = open(&dir).await;
        let live = produce_workload(&log, &producers).await;
        assert!(log.segment_count() > 3, "the workload rolls segments");
        let found = snapshots(&dir);
        assert!(!found.is_empty(), "a roll writes a snapshot");
        assert!(
            found.len() <= SNAPSHOTS_KEPT,
            "old snapshots are pruned: {found:?}"
        );
        let bases = log.segment_bases();
        for (offset, path) in &found {
            assert!(
                bases.contains(offset),
                "snapshot {offset} is at a segment base"
            );
            let rebuilt = rebuilt_from(&log, path, *offset).await;
            assert!(
                rebuilt.same_producers(&live),
                "snapshot {offset} + replay != live"
            );
        }
        assert_eq!(producers.counters().duplicates_dropped, 3 * 9);
        assert_eq!(producers.counters().out_of_order_rejections, 3 * 9);
        log.close().await.expect("close");
    });
}

#[test]
fn reopen_rebuilds_from_shutdown_snapshot_damaged_snapshot_or_whole_log() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let dir = root.path().join("idem-0");
        let (log, producers) = open(&dir).await;
        let live = produce_workload(&log, &producers).await;
        let end = log.log_end_offset();
        log.close().await.expect("close");
        producers.close(&log);
        assert_eq!(
            snapshots(&dir).last().map(|s| s.0),
            Some(end),
            "shutdown snapshot at the log end"
        );

        // 1. Clean restart: the shutdown snapshot, nothing to replay; a temp file left by
        // a crash during a snapshot write is removed.
        let temp = dir.join("00000000000000000001.snapshot.tmp");
        std::fs::write(&temp, b"torn").expect("write temp");
        let (log, producers) = open(&dir).await;
        assert!(!temp.exists(), "temp snapshot removed on open");
        assert!(producers.table().same_producers(&live));
        // The same state could come from replaying the whole log: prove it did not.
        assert_eq!(
            log.counters().disk_reads,
            0,
            "nothing replayed after the snapshot"
        );
        log.close().await.expect("close");

        // 2. The newest snapshot damaged: ignored and deleted, an older one + replay used.
        let newest = snapshots(&dir).last().cloned().expect("a snapshot");
        let mut bytes = std::fs::read(&newest.1).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x55;
        std::fs::write(&newest.1, &bytes).expect("damage");
        let (log, producers) = open(&dir).await;
        assert!(producers.table().same_producers(&live));
        assert!(!newest.1.exists(), "the damaged snapshot is deleted");
        log.close().await.expect("close");

        // 3. No snapshot at all: the whole log is replayed.
        for (_, path) in snapshots(&dir) {
            std::fs::remove_file(path).expect("remove snapshot");
        }
        let (log, producers) = open(&dir).await;
        assert!(producers.table().same_producers(&live));
        assert!(log.counters().disk_reads > 0, "the log was replayed");
        // And a resend of each producer's last batch is still a duplicate.
        for pid in 0..PRODUCERS {
            let last_seq = ROUNDS * 3 - 3;
            let again = producers
                .append(&log, batch(pid, last_seq, 3), LeaderEpoch(0), NOW_MS)
                .await;
            assert!(
                matches!(again, Ok(ProducerAppend::Duplicate(_))),
                "{again:?}"
            );
        }
        log.close().await.expect("close");
    });
}

#[test]
fn idle_producers_expire_after_producer_id_expiration_ms() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let (log, producers) = open(&root.path().join("idem-0")).await;
        let epoch = LeaderEpoch(0);
        let first = producers.append(&log, batch(1, 0, 2), epoch, NOW_MS).await;
        assert!(
            matches!(first, Ok(ProducerAppend::Appended(_))),
            "{first:?}"
        );
        // Within a day the resend is a duplicate.
        let hour_later = NOW_MS + 3_600_000;
        let again = producers
            .append(&log, batch(1, 0, 2), epoch, hour_later)
            .await;
        assert!(
            matches!(again, Ok(ProducerAppend::Duplicate(_))),
            "{again:?}"
        );
        // Another producer's append a day and a check interval later expires producer 1.
        let day_later = NOW_MS + 86_400_000 + 600_000;
        let other = producers
            .append(&log, batch(2, 0, 1), epoch, day_later)
            .await;
        assert!(
            matches!(other, Ok(ProducerAppend::Appended(_))),
            "{other:?}"
        );
        assert_eq!(producers.counters().producers_expired, 1);
        assert_eq!(producers.table().len(), 1);
        // Its window is gone: the old resend is now appended again (as in Kafka).
        let late = producers
            .append(&log, batch(1, 0, 2), epoch, day_later)
            .await;
        assert!(matches!(late, Ok(ProducerAppend::Appended(_))), "{late:?}");
        log.close().await.expect("close");
    });
}
