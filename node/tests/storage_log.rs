//! Partition log behaviour on the real disk: appends, reads (cache and DMA), rolls,
//! indexes, truncation, retention, group commit, reopen.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::rc::Rc;

use bytes::BytesMut;
use weir::storage::testing::{batch_of_size, build_batch, run_on_shard};
use weir::storage::{Log, LogConfig, StorageError, prime_dma_probe};
use wire::{LeaderEpoch, Offset};

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn config(pairs: &[(&str, &str)]) -> LogConfig {
    LogConfig::from_pairs(pairs.iter().copied()).unwrap()
}

fn batch(ts: i64, n: usize) -> BytesMut {
    let values: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("value-{ts}-{i}").into_bytes())
        .collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| &v[..]).collect();
    build_batch(ts, &refs)
}

#[test]
fn dma_reads_back_what_was_written_on_a_fresh_dir() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        // No tail cache: every read goes to the segment file through DMA reads.
        let cfg = config(&[("log.tail.cache.bytes", "0")]);
        let log = Log::open(root.join("t-0"), cfg.clone()).await.unwrap();
        let mut sent = Vec::new();
        for i in 0..50 {
            let b = batch(1000 + i, 3);
            sent.push(b.clone());
            log.append(b, LeaderEpoch(7), 5000).await.unwrap();
        }
        assert_eq!(log.log_end_offset(), Offset(150));
        let read = log.read(Offset(0), 1 << 20, Offset(150)).await.unwrap();
        assert!(log.counters().disk_reads >= 1);
        assert_eq!(read.batches.len(), 50);
        for (i, (got, mut want)) in read.batches.iter().zip(sent).enumerate() {
            wire::batch::assign_offsets(&mut want, Offset(3 * i as i64), LeaderEpoch(7)).unwrap();
            assert_eq!(&got[..], &want[..], "batch {i}");
        }
        log.close().await.unwrap();
        let log = Log::open(root.join("t-0"), cfg).await.unwrap();
        let read = log.read(Offset(100), 1, Offset(150)).await.unwrap();
        assert_eq!(
            read.batches.len(),
            1,
            "first batch returned whole despite max_bytes 1"
        );
        let h = wire::batch::validate_batch(&read.batches[0]).unwrap();
        assert_eq!(h.header.base_offset(), Offset(99));
        assert_eq!(h.header.partition_leader_epoch(), LeaderEpoch(7));
    });
}

/// AlterConfigs of `tail.cache.bytes` applies to an open log at once: recent reads that
/// came from memory come from the segment files after the bound is lowered.
#[test]
fn a_lowered_tail_cache_bound_applies_to_an_open_log() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = LogConfig::default();
        let log = Log::open(root.join("t-0"), cfg.clone()).await.unwrap();
        for i in 0..10 {
            log.append(batch(i, 2), LeaderEpoch(0), 0).await.unwrap();
        }
        log.read(Offset(0), 1 << 20, Offset(20)).await.unwrap();
        let before = log.counters();
        assert_eq!((before.cache_reads, before.disk_reads), (1, 0));
        log.set_config(LogConfig {
            tail_cache_bytes: 0,
            ..cfg
        });
        let read = log.read(Offset(0), 1 << 20, Offset(20)).await.unwrap();
        assert_eq!(read.batches.len(), 10);
        let after = log.counters();
        assert_eq!(after.cache_reads, 1, "nothing left in memory");
        assert!(after.disk_reads >= 1);
    });
}

#[test]
fn reads_respect_limits_and_upper_bound_and_range() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let log = Log::open(root.join("t-0"), LogConfig::default())
            .await
            .unwrap();
        for i in 0..10 {
            let info = log.append(batch(i, 2), LeaderEpoch(0), 0).await.unwrap();
            assert_eq!(info.first_offset, Offset(2 * i));
            assert_eq!(info.last_offset, Offset(2 * i + 1));
        }
        let one = log.read(Offset(0), 1, Offset(20)).await.unwrap();
        let size = one.bytes();
        assert_eq!(one.batches.len(), 1);
        assert_eq!(one.next_offset, Offset(2));
        let three = log.read(Offset(3), 3 * size, Offset(20)).await.unwrap();
        assert_eq!(three.batches.len(), 3);
        let hdr = wire::batch::read_header(&three.batches[0]).unwrap();
        assert_eq!(hdr.base_offset(), Offset(2), "batch containing offset 3");
        let bounded = log.read(Offset(0), 1 << 20, Offset(5)).await.unwrap();
        assert_eq!(
            bounded.batches.len(),
            2,
            "only batches whose last offset < 5"
        );
        assert!(
            log.read(Offset(20), 100, Offset(20))
                .await
                .unwrap()
                .batches
                .is_empty()
        );
        assert!(matches!(
            log.read(Offset(21), 100, Offset(30)).await,
            Err(StorageError::OffsetOutOfRange { .. })
        ));
    });
}

#[test]
fn segments_roll_by_size_with_kafka_file_names_and_indexes() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[
            ("segment.bytes", "65536"),
            ("index.interval.bytes", "4096"),
            ("log.tail.cache.bytes", "0"),
        ]);
        let pdir = root.join("t-0");
        let log = Log::open(pdir.clone(), cfg.clone()).await.unwrap();
        for i in 0..100 {
            log.append(batch_of_size(i, 4, 3000), LeaderEpoch(1), 0)
                .await
                .unwrap();
        }
        let bases = log.segment_bases();
        assert!(bases.len() >= 4, "{bases:?}");
        log.close().await.unwrap();
        for (i, base) in bases.iter().enumerate() {
            let name = format!("{:020}", base.get());
            let log_len = std::fs::metadata(pdir.join(format!("{name}.log")))
                .unwrap()
                .len();
            assert!(log_len <= 65536);
            let index = std::fs::read(pdir.join(format!("{name}.index"))).unwrap();
            let times = std::fs::read(pdir.join(format!("{name}.timeindex"))).unwrap();
            assert_eq!(index.len() % 8, 0);
            assert_eq!(times.len() % 12, 0);
            if i + 1 < bases.len() {
                // ~3000-byte batches: an entry each time more than 4096 bytes passed.
                assert!(index.len() / 8 >= (log_len as usize / 6000).saturating_sub(1));
                let first_pos = u32::from_be_bytes(index[4..8].try_into().unwrap());
                assert!(first_pos > 4096, "no entry before 4096 bytes");
            }
        }
        // Reopen (clean) and read every offset back through the indexes.
        let log = Log::open(pdir.clone(), cfg).await.unwrap();
        assert_eq!(log.segment_bases(), bases);
        assert_eq!(log.log_end_offset(), Offset(400));
        for o in (0..400).step_by(7) {
            let r = log.read(Offset(o), 1, Offset(400)).await.unwrap();
            let h = wire::batch::read_header(&r.batches[0]).unwrap();
            assert!(h.base_offset() <= Offset(o) && h.last_offset() >= Offset(o));
        }
        assert_eq!(log.read_by_time(50).await.unwrap(), Some((Offset(188), 50)));
        assert_eq!(log.read_by_time(1000).await.unwrap(), None);
    });
}

/// A log of 8 KiB segments holding 40 records of 1 KiB under `retention.bytes` = 20,000,
/// so retention has sealed segments to delete.
async fn forty_records_over_retention(
    root: &std::path::Path,
) -> (Log, std::path::PathBuf, LogConfig) {
    prime_dma_probe(root).await.unwrap();
    let cfg = config(&[("segment.bytes", "8192"), ("retention.bytes", "20000")]);
    let pdir = root.join("t-0");
    let log = Log::open(pdir.clone(), cfg.clone()).await.unwrap();
    for i in 0..40 {
        log.append(batch_of_size(i, 1, 1000), LeaderEpoch(1), 0)
            .await
            .unwrap();
    }
    (log, pdir, cfg)
}

/// Retention deletes no segment that reaches past the bound it is given (the HW): a
/// follower may not hold those records yet, and acks=all produces wait on them.
#[test]
fn retention_stops_at_the_bound_it_is_given() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        let (log, _pdir, _cfg) = forty_records_over_retention(&root).await;
        assert_eq!(log.apply_retention(0, Offset(0)).await.unwrap(), 0);
        assert_eq!(log.log_start_offset(), Offset(0));
        let deleted = log.apply_retention(0, Offset(10)).await.unwrap();
        let start = log.log_start_offset();
        assert!(deleted >= 1, "the segments below 10 go");
        assert!(
            start > Offset(0) && start <= Offset(10),
            "none past 10: start {start}"
        );
        assert!(log.apply_retention(0, log.log_end_offset()).await.unwrap() >= 1);
        assert!(
            log.log_start_offset() > Offset(10),
            "the rest once the bound allows"
        );
        log.close().await.unwrap();
    });
}

#[test]
fn truncate_retention_and_delete_records_move_the_ends() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        let (log, pdir, cfg) = forty_records_over_retention(&root).await;
        assert_eq!(log.truncate_to(Offset(30)).await.unwrap(), Offset(30));
        assert_eq!(log.log_end_offset(), Offset(30));
        let info = log.append(batch(99, 1), LeaderEpoch(2), 0).await.unwrap();
        assert_eq!(info.first_offset, Offset(30));
        let deleted = log.apply_retention(0, log.log_end_offset()).await.unwrap();
        assert!(deleted >= 1);
        assert!(log.size_bytes() < 20000 + 8192);
        let start = log.log_start_offset();
        assert!(start > Offset(0));
        assert!(matches!(
            log.read(Offset(0), 100, Offset(31)).await,
            Err(StorageError::OffsetOutOfRange { .. })
        ));
        assert_eq!(
            log.delete_records_before(Offset(25)).await.unwrap(),
            Offset(25)
        );
        log.close().await.unwrap();
        let log = Log::open(pdir.clone(), cfg).await.unwrap();
        assert_eq!(
            log.log_start_offset(),
            Offset(25),
            "log start offset persisted"
        );
        assert_eq!(log.log_end_offset(), Offset(31));
        let r = log.read(Offset(25), 1 << 20, Offset(31)).await.unwrap();
        assert_eq!(r.next_offset, Offset(31));
        log.delete().await.unwrap();
        assert!(!pdir.exists());
    });
}

#[test]
fn concurrent_appends_share_fdatasyncs_with_flush_on_ack() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("log.flush.on.ack", "true")]);
        let log = Rc::new(Log::open(root.join("t-0"), cfg).await.unwrap());
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    let mut offsets = Vec::new();
                    for j in 0..10 {
                        let info = log.append(batch(i * 100 + j, 1), LeaderEpoch(0), 0).await;
                        offsets.push(info.unwrap().first_offset);
                    }
                    offsets
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await);
        }
        all.sort();
        assert_eq!(all, (0..640).map(Offset).collect::<Vec<_>>());
        let c = log.counters();
        assert_eq!(c.appends, 640);
        assert!(c.fdatasyncs >= 1);
        assert!(c.fdatasyncs * 4 <= c.appends, "group commit: {c:?}");
    });
}

#[test]
fn log_append_time_stamps_batches_and_keeps_crc_valid() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("message.timestamp.type", "LogAppendTime")]);
        let log = Log::open(root.join("t-0"), cfg).await.unwrap();
        let info = log
            .append(batch(5, 2), LeaderEpoch(0), 123_456)
            .await
            .unwrap();
        assert_eq!(info.log_append_time_ms, Some(123_456));
        let r = log.read(Offset(0), 1 << 20, Offset(2)).await.unwrap();
        let view = wire::batch::validate_batch(&r.batches[0]).unwrap();
        assert_eq!(view.header.max_timestamp(), 123_456);
        assert_eq!(
            view.header.attributes().timestamp_type(),
            wire::batch::TimestampType::LogAppendTime
        );
    });
}

#[test]
fn garbage_appends_are_errors_not_panics() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let log = Log::open(root.join("t-0"), LogConfig::default())
            .await
            .unwrap();
        for junk in [&b""[..], b"\x00\x01", &[0xff; 100][..]] {
            let r = log.append(BytesMut::from(junk), LeaderEpoch(0), 0).await;
            assert!(matches!(r, Err(StorageError::InvalidBatch { .. })), "{r:?}");
        }
        let mut truncated = batch(1, 3);
        truncated.truncate(truncated.len() - 1);
        assert!(log.append(truncated, LeaderEpoch(0), 0).await.is_err());
        assert_eq!(log.log_end_offset(), Offset(0));
    });
}

#[test]
fn flush_interval_keys_drive_fdatasync() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        // Every 10 records (Kafka's log.flush.interval.messages).
        let log = Log::open(root.join("t-0"), config(&[("flush.messages", "10")]))
            .await
            .unwrap();
        for i in 0..100 {
            log.append(batch(i, 1), LeaderEpoch(0), 0).await.unwrap();
        }
        assert_eq!(log.counters().fdatasyncs, 10);
        // Default (never by count or time): no fdatasync until asked.
        let log = Log::open(root.join("t-1"), LogConfig::default())
            .await
            .unwrap();
        for i in 0..100 {
            log.append(batch(i, 1), LeaderEpoch(0), 1_000)
                .await
                .unwrap();
        }
        assert_eq!(log.counters().fdatasyncs, 0);
        // log.flush.interval.ms: due once the last flush is that old.
        log.set_config(config(&[("log.flush.interval.ms", "500")]));
        assert!(log.flush_if_due(1_000).await.unwrap());
        assert_eq!(log.counters().fdatasyncs, 1);
        log.append(batch(0, 1), LeaderEpoch(0), 1_100)
            .await
            .unwrap();
        assert!(
            !log.flush_if_due(1_200).await.unwrap(),
            "flushed 200 ms ago"
        );
        assert!(log.flush_if_due(1_600).await.unwrap());
        assert_eq!(log.counters().fdatasyncs, 2);
    });
}

#[test]
fn segments_roll_by_time() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let log = Log::open(root.join("t-0"), config(&[("segment.ms", "1000")]))
            .await
            .unwrap();
        log.append(batch(0, 1), LeaderEpoch(0), 10_000)
            .await
            .unwrap();
        log.append(batch(1, 1), LeaderEpoch(0), 10_500)
            .await
            .unwrap();
        assert_eq!(log.segment_count(), 1);
        log.append(batch(2, 1), LeaderEpoch(0), 11_000)
            .await
            .unwrap();
        assert_eq!(log.segment_bases(), vec![Offset(0), Offset(2)]);
        assert_eq!(log.counters().rolls, 1);
    });
}

#[test]
fn dropping_an_append_future_midway_loses_nothing_and_corrupts_nothing() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let log = Log::open(root.join("t-0"), config(&[("log.tail.cache.bytes", "0")]))
            .await
            .unwrap();
        for i in 0..20 {
            // First poll assigns offsets and starts the write; then the caller goes away
            // (as when a client disconnects).
            let mut append = std::pin::pin!(log.append(batch(i, 2), LeaderEpoch(0), 0));
            let _ = futures_lite::future::poll_once(&mut append).await;
        }
        let info = log.append(batch(99, 1), LeaderEpoch(0), 0).await.unwrap();
        assert_eq!(info.first_offset, Offset(40));
        log.close().await.unwrap();
        let log = Log::open(root.join("t-0"), LogConfig::default())
            .await
            .unwrap();
        assert_eq!(log.log_end_offset(), Offset(41));
        let r = log.read(Offset(0), usize::MAX, Offset(41)).await.unwrap();
        assert_eq!(r.batches.len(), 21);
        for (i, b) in r.batches.iter().enumerate() {
            let v = wire::batch::validate_batch(b).unwrap();
            assert_eq!(v.header.base_offset(), Offset(2 * i as i64));
        }
    });
}

/// Retention renames a deleted segment's `.log` to `.log.deleted` and hands it to the
/// reclaim thread (which gives its blocks back a step at a time, then unlinks it); the
/// file goes without a restart, and a `.deleted` file left by a crash is removed at the
/// next open (and never read as a segment).
#[test]
fn retention_retires_segments_off_the_shard_and_open_removes_leftovers() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        let (log, pdir, cfg) = forty_records_over_retention(&root).await;
        // Retired files removed without `file.delete.delay.ms` (60 s by default).
        log.set_config(LogConfig {
            file_delete_delay_ms: 0,
            ..cfg.clone()
        });
        let logs = |dir: &std::path::Path, suffix: &str| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(suffix))
                .collect();
            names.sort();
            names
        };
        let before = logs(&pdir, ".log");
        let handed = weir::storage::retired_files_handed_over();
        let deleted = log.apply_retention(0, log.log_end_offset()).await.unwrap();
        assert!(deleted >= 1);
        assert!(
            weir::storage::retired_files_handed_over() >= handed + deleted,
            "retention retires its segments (not unlinked on the shard's thread)"
        );
        let after = logs(&pdir, ".log");
        assert_eq!(
            after.len(),
            before.len() - deleted,
            "the .log files are gone at once"
        );
        // The unlinks run on the reclaim thread: wait (bounded) until no .deleted is left.
        let mut left = logs(&pdir, ".deleted");
        for _ in 0..500 {
            if left.is_empty() {
                break;
            }
            glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
            left = logs(&pdir, ".deleted");
        }
        assert!(left.is_empty(), "retired segments never unlinked: {left:?}");
        log.close().await.unwrap();
        // A crash between the rename and the unlink leaves a .deleted file behind.
        let leftover = pdir.join("00000000000000000000.log.deleted");
        std::fs::write(&leftover, b"not a segment").unwrap();
        let start = log.log_start_offset();
        let log = Log::open(pdir.clone(), cfg).await.unwrap();
        assert!(!leftover.exists(), "open removes retired leftovers");
        assert_eq!(log.log_start_offset(), start);
        assert_eq!(log.log_end_offset(), Offset(40));
        log.close().await.unwrap();
    });
}

/// A disk read whose first batch does not fit what is left of the response answers
/// nothing, not the next segment's batches: those start past `start`, and a consumer would
/// skip the offsets in between.
#[test]
fn a_batch_too_big_for_the_hard_limit_is_not_skipped_to_the_next_segment() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("log.tail.cache.bytes", "0")]);
        let log = Log::open(root.join("t-0"), cfg).await.unwrap();
        log.append(batch_of_size(1000, 1, 3000), LeaderEpoch(0), 0)
            .await
            .unwrap();
        log.roll().unwrap();
        log.append(batch_of_size(1001, 1, 500), LeaderEpoch(0), 0)
            .await
            .unwrap();
        let read = log
            .read_within(Offset(0), 1000, 1000, Offset(2))
            .await
            .unwrap();
        assert!(read.batches.is_empty(), "nothing fits: nothing served");
        assert_eq!(read.next_offset, Offset(0));
        let read = log
            .read_within(Offset(0), 1000, 4000, Offset(2))
            .await
            .unwrap();
        assert_eq!(read.batches.len(), 1, "the first batch, whole");
        assert_eq!(read.next_offset, Offset(1));
        // Below `upper` only: offset 0 is not readable yet, so neither is offset 1.
        let read = log
            .read_within(Offset(0), 1 << 20, 1 << 20, Offset(0))
            .await
            .unwrap();
        assert!(read.batches.is_empty());
    });
}

/// A disk read that was waiting on the disk while the log was cut and rewritten must not
/// leave its byte position behind for the next read to resume at: that position is of
/// the old layout (a cleaner swap or a truncation), and resuming there would skip records
/// or land mid-batch.
#[test]
fn a_read_spanning_a_truncation_leaves_no_stale_resume_position() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("log.tail.cache.bytes", "0")]);
        let log = Log::open(root.join("t-0"), cfg).await.unwrap();
        // Old layout: 10 records in a 3,000-byte batch, then 10 more.
        log.append(batch_of_size(1000, 10, 3000), LeaderEpoch(0), 0)
            .await
            .unwrap();
        log.append(batch_of_size(1001, 10, 3000), LeaderEpoch(0), 0)
            .await
            .unwrap();
        let mut pending = std::pin::pin!(log.read(Offset(0), 1, Offset(20)));
        assert!(
            futures_lite::future::poll_once(&mut pending)
                .await
                .is_none(),
            "waiting on the disk"
        );
        // New layout: 10 batches of 2 records, 500 bytes each, offsets 0..20 again. Byte
        // 3,000, where the old read ended, is now the batch of offsets 12 and 13.
        log.truncate_to(Offset(0)).await.unwrap();
        for i in 0..10 {
            log.append(batch_of_size(2000 + i, 2, 500), LeaderEpoch(1), 0)
                .await
                .unwrap();
        }
        let old = pending.await.unwrap();
        assert_eq!(old.next_offset, Offset(10));
        let next = log.read(Offset(10), 1 << 20, Offset(20)).await.unwrap();
        let first = wire::batch::read_header(&next.batches[0]).unwrap();
        assert_eq!(
            first.base_offset(),
            Offset(10),
            "the batch holding offset 10 in the new layout"
        );
        assert_eq!(next.next_offset, Offset(20));
    });
}

/// Reads every batch from the log start to its end, checking that offsets follow on.
async fn read_contiguous(log: &Log) -> Vec<bytes::Bytes> {
    let end = log.log_end_offset();
    let mut at = log.log_start_offset();
    let mut out = Vec::new();
    for _ in 0..10_000 {
        if at >= end {
            break;
        }
        let read = log.read(at, 1 << 20, end).await.unwrap();
        assert!(!read.batches.is_empty(), "no progress at {at}");
        for b in read.batches {
            let h = wire::batch::read_header(&b).unwrap();
            assert_eq!(h.base_offset(), at, "offsets follow on");
            at = h.last_offset().add(1);
            out.push(b);
        }
    }
    assert_eq!(at, end, "read to the log end");
    out
}

/// A follower's truncation reads the disk to find its cut; an append made meanwhile (the
/// replica became leader) is refused, not left pending past the cut, where the next write
/// put its bytes into the file beyond what the segment and its index describe (a debug
/// assertion, or a release one on the write positions, took the shard down).
#[test]
fn an_append_during_a_truncation_is_refused_and_the_log_stays_consistent() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("log.tail.cache.bytes", "0")]);
        let log = Log::open(root.join("t-0"), cfg.clone()).await.unwrap();
        for i in 0..10 {
            log.append(batch(i, 2), LeaderEpoch(1), 0).await.unwrap();
        }
        let mut cut = Box::pin(log.truncate_to(Offset(9)));
        assert!(
            futures_lite::future::poll_once(&mut cut).await.is_none(),
            "the truncation waits on the disk to find its cut"
        );
        let mut during = Box::pin(log.append(batch(100, 2), LeaderEpoch(2), 0));
        let first_poll = futures_lite::future::poll_once(&mut during).await;
        assert_eq!(cut.await.unwrap(), Offset(8), "cut at the batch holding 9");
        let during = match first_poll {
            Some(result) => result,
            None => during.await,
        };
        // Refused, or else present intact: never pending past the cut.
        let kept = usize::from(during.is_ok());
        log.append(batch(200, 2), LeaderEpoch(2), 0).await.unwrap();
        log.append(batch(300, 2), LeaderEpoch(2), 0).await.unwrap();
        let all = read_contiguous(&log).await;
        assert_eq!(all.len(), 6 + kept);
        let end = log.log_end_offset();
        log.close().await.unwrap();
        let log = Log::open(root.join("t-0"), cfg).await.unwrap();
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(read_contiguous(&log).await, all, "after a reopen");
        assert!(
            matches!(during, Err(StorageError::Truncating { .. })),
            "{during:?}"
        );
    });
}

/// Segments whose batches carry no timestamp (maxTimestamp -1) are aged by their file's
/// last modification, as Kafka does; before, the first such segment stopped time
/// retention for itself and every later segment.
#[test]
fn time_retention_passes_segments_without_timestamps() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("segment.bytes", "8192"), ("retention.ms", "60000")]);
        let log = Log::open(root.join("t-0"), cfg).await.unwrap();
        let wall_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        // Ten minutes from now: the files written now are older than retention.ms.
        let now_ms = wall_ms + 600_000;
        for _ in 0..20 {
            let b = batch_of_size(-1, 1, 1000);
            assert_eq!(wire::batch::read_header(&b).unwrap().max_timestamp(), -1);
            log.append(b, LeaderEpoch(1), 0).await.unwrap();
        }
        let timeless_end = log.log_end_offset();
        for _ in 0..20 {
            let b = batch_of_size(now_ms, 1, 1000);
            log.append(b, LeaderEpoch(1), 0).await.unwrap();
        }
        let segments = log.segment_count();
        let deleted = log.apply_retention(now_ms, log.log_end_offset()).await;
        assert!(deleted.unwrap() >= 2, "the timestamp-less segments go");
        let start = log.log_start_offset();
        assert!(
            start >= Offset(10) && start <= timeless_end,
            "none with recent timestamps: start {start}, timeless up to {timeless_end}"
        );
        assert!(log.segment_count() < segments);
        log.close().await.unwrap();
    });
}

/// An append while `close()` seals the active segment is refused: before, it took
/// offsets past what was written, and the clean-shutdown marker and the index files
/// recorded that end.
#[test]
fn an_append_during_close_is_refused_and_the_log_reopens_at_its_written_end() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        // Every batch indexed, so an index entry would show an append past the file.
        let cfg = config(&[("log.tail.cache.bytes", "0"), ("index.interval.bytes", "1")]);
        let log = Log::open(root.join("t-0"), cfg.clone()).await.unwrap();
        for i in 0..10 {
            log.append(batch(i, 2), LeaderEpoch(1), 0).await.unwrap();
        }
        let written = read_contiguous(&log).await;
        let mut closing = Box::pin(log.close());
        assert!(
            futures_lite::future::poll_once(&mut closing)
                .await
                .is_none(),
            "the close waits on the disk"
        );
        let mut during = Box::pin(log.append(batch(100, 2), LeaderEpoch(1), 0));
        let first_poll = futures_lite::future::poll_once(&mut during).await;
        closing.await.unwrap();
        let during = match first_poll {
            Some(result) => result,
            None => during.await,
        };
        assert!(
            matches!(during, Err(StorageError::Closed { .. })),
            "{during:?}"
        );
        let pdir = root.join("t-0");
        let marker = std::fs::read_to_string(pdir.join(".weir-clean-shutdown")).unwrap();
        assert_eq!(
            marker, "20\n",
            "the clean-shutdown marker records the written end"
        );
        let file_len = std::fs::metadata(pdir.join("00000000000000000000.log"))
            .unwrap()
            .len();
        let index = std::fs::read(pdir.join("00000000000000000000.index")).unwrap();
        for entry in index.chunks_exact(8) {
            let position = u32::from_be_bytes(entry[4..8].try_into().unwrap());
            assert!(u64::from(position) < file_len, "index entry past the file");
        }
        let log = Log::open(pdir, cfg).await.unwrap();
        assert_eq!(log.log_end_offset(), Offset(20));
        assert_eq!(read_contiguous(&log).await, written);
        let info = log.append(batch(200, 2), LeaderEpoch(1), 0).await.unwrap();
        assert_eq!(info.first_offset, Offset(20));
    });
}

/// A leader's append whose batches declare more than 2^31 offsets in all (compressed
/// batches can claim any record count) is refused: no segment can index it, and before,
/// it was appended into one with its index entries past 2^31 skipped silently.
#[test]
fn an_append_spanning_more_offsets_than_a_segment_indexes_is_refused() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let log = Log::open(root.join("t-0"), LogConfig::default())
            .await
            .unwrap();
        log.append(batch(0, 2), LeaderEpoch(1), 0).await.unwrap();
        let claiming_max = || {
            let mut b = batch(1, 1);
            // lastOffsetDelta: bytes 23..27 of the header (after baseOffset 8, batchLength
            // 4, partitionLeaderEpoch 4, magic 1, crc 4, attributes 2).
            b[23..27].copy_from_slice(&i32::MAX.to_be_bytes());
            b
        };
        let one = claiming_max();
        assert_eq!(
            wire::batch::read_header(&one).unwrap().last_offset().get(),
            i64::from(i32::MAX)
        );
        let mut blob = claiming_max();
        blob.extend_from_slice(&claiming_max());
        let refused = log.append(blob, LeaderEpoch(1), 0).await;
        assert!(
            matches!(refused, Err(StorageError::OffsetSpanTooLarge { .. })),
            "{refused:?}"
        );
        assert_eq!(log.log_end_offset(), Offset(2));
        let info = log.append(batch(2, 2), LeaderEpoch(1), 0).await.unwrap();
        assert_eq!(info.first_offset, Offset(2));
        log.close().await.unwrap();
    });
}

/// Deleting a log that was already closed leaves its directory alone: by then it may be
/// another log's (the same partition reopened, or a new topic's of the same name).
#[test]
fn deleting_a_closed_log_leaves_its_directory_to_the_next_log() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let pdir = root.join("t-0");
        let closed = Log::open(pdir.clone(), config(&[])).await.unwrap();
        closed.append(batch(1, 1), LeaderEpoch(0), 0).await.unwrap();
        closed.close().await.unwrap();
        let next = Log::open(pdir.clone(), config(&[])).await.unwrap();
        closed.delete().await.unwrap();
        assert!(pdir.exists(), "the next log's directory is kept");
        let info = next.append(batch(2, 1), LeaderEpoch(0), 0).await.unwrap();
        assert_eq!(info.first_offset, Offset(1));
        next.close().await.unwrap();
    });
}

/// Time retention deletes the active segment of a partition that stopped receiving
/// records, as Kafka does (it rolls an empty segment at the log end first): before, the
/// expired records stayed readable until an append rolled it. The log end does not move,
/// the log start reaches it, appends continue at the same offset, and a restart — also
/// one that lost the new log start file — reopens there.
#[test]
fn time_retention_deletes_an_expired_active_segment_and_the_log_end_stays() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("retention.ms", "60000")]);
        let pdir = root.join("t-0");
        let log = Log::open(pdir.clone(), cfg.clone()).await.unwrap();
        for i in 0..5 {
            log.append(batch(1_000 + i, 2), LeaderEpoch(1), 0)
                .await
                .unwrap();
        }
        let end = log.log_end_offset();
        assert_eq!((end, log.segment_count()), (Offset(10), 1));
        let later = 1_000 + 120_000;
        // Not past the bound (the HW): nothing goes, as for a sealed segment.
        assert_eq!(log.apply_retention(later, Offset(9)).await.unwrap(), 0);
        // Not yet expired: nothing goes.
        assert_eq!(log.apply_retention(1_010, end).await.unwrap(), 0);
        assert_eq!(log.apply_retention(later, end).await.unwrap(), 1);
        assert_eq!(log.log_start_offset(), end);
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(log.segment_bases(), vec![end]);
        assert!(matches!(
            log.read(Offset(0), 1 << 20, end).await,
            Err(StorageError::OffsetOutOfRange { .. })
        ));
        let read = log.read(end, 1 << 20, end).await.unwrap();
        assert!(read.batches.is_empty());
        // An empty active segment is never retention's.
        assert_eq!(log.apply_retention(later, end).await.unwrap(), 0);
        let info = log
            .append(batch(later, 3), LeaderEpoch(1), 0)
            .await
            .unwrap();
        assert_eq!(info.first_offset, end);
        assert_eq!(info.log_start_offset, end);
        let read = log.read(end, 1 << 20, Offset(13)).await.unwrap();
        assert_eq!(read.batches.len(), 1);
        assert_eq!(read.next_offset, Offset(13));
        // Expired again with nothing appended since: the same again, past the restart.
        assert_eq!(
            log.apply_retention(later + 120_000, Offset(13))
                .await
                .unwrap(),
            1
        );
        assert_eq!(log.log_start_offset(), Offset(13));
        drop(log);
        // The new log start file lost (a power loss before its sync): the empty active
        // segment's file still says where the log ends.
        std::fs::remove_file(pdir.join("weir-log-start-offset")).unwrap();
        let log = Log::open(pdir.clone(), cfg.clone()).await.unwrap();
        assert_eq!(log.log_start_offset(), Offset(13));
        assert_eq!(log.log_end_offset(), Offset(13));
        let info = log
            .append(batch(later, 1), LeaderEpoch(2), 0)
            .await
            .unwrap();
        assert_eq!(info.first_offset, Offset(13));
        log.close().await.unwrap();
        let log = Log::open(pdir, cfg).await.unwrap();
        assert_eq!(log.log_start_offset(), Offset(13));
        assert_eq!(log.log_end_offset(), Offset(14));
        let read = log.read(Offset(13), 1 << 20, Offset(14)).await.unwrap();
        assert_eq!(read.batches.len(), 1);
        log.close().await.unwrap();
    });
}

/// On a compacted log, the active segment rolls once it is `max.compaction.lag.ms` old
/// when that is below `segment.ms` (Kafka's `maxSegmentMs`): the cleaner never reads the
/// active segment, so before, a record there stayed uncompacted up to `segment.ms`
/// (seven days by default) whatever lag the topic promised. A log that is not compacted
/// keeps rolling at `segment.ms`.
#[test]
fn a_compacted_log_rolls_at_its_max_compaction_lag() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let lag = ("max.compaction.lag.ms", "1000");
        let compacted = config(&[lag, ("cleanup.policy", "compact")]);
        let deleted = config(&[lag, ("cleanup.policy", "delete")]);
        for (name, cfg, segments) in [("c-0", compacted, 2), ("d-0", deleted, 1)] {
            let log = Log::open(root.join(name), cfg).await.unwrap();
            // A keyed record, as a compacted log takes.
            let record = wire::batch::NewRecord {
                timestamp_ms: 0,
                key: Some(bytes::Bytes::from_static(b"k")),
                value: Some(bytes::Bytes::from_static(b"v")),
                headers: Vec::new(),
            };
            let built = wire::batch::BatchBuilder {
                records: vec![record],
                ..Default::default()
            };
            let b = BytesMut::from(built.build().unwrap());
            log.append(b.clone(), LeaderEpoch(1), 0).await.unwrap();
            log.append(b.clone(), LeaderEpoch(1), 999).await.unwrap();
            assert_eq!(log.segment_count(), 1, "{name}: not yet");
            log.append(b, LeaderEpoch(1), 1_000).await.unwrap();
            assert_eq!(log.segment_count(), segments, "{name}");
            log.close().await.unwrap();
        }
    });
}

/// A segment retention retires stays whole for `file.delete.delay.ms` before the reclaim
/// thread cuts and removes it (Kafka's delay): a read planned on it before it was retired
/// goes on through the fd it holds. Before, the file was cut at once, and such a read
/// could fail with KAFKA_STORAGE_ERROR.
#[test]
fn a_retired_segment_stays_whole_until_its_delete_delay_passed() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let delay = std::time::Duration::from_millis(1_000);
        let cfg = config(&[
            ("segment.bytes", "8192"),
            ("retention.ms", "60000"),
            ("file.delete.delay.ms", "1000"),
        ]);
        let pdir = root.join("t-0");
        let log = Log::open(pdir.clone(), cfg).await.unwrap();
        for i in 0..20 {
            log.append(batch_of_size(1_000, 1, 1000), LeaderEpoch(1), i)
                .await
                .unwrap();
        }
        let bases = log.segment_bases();
        assert!(bases.len() >= 3, "{bases:?}");
        let first = pdir.join(format!("{:020}.log", bases[0].get()));
        let size = std::fs::metadata(&first).unwrap().len();
        let retired_at = std::time::Instant::now();
        // Only the first segment: the bound is the second one's base.
        assert_eq!(log.apply_retention(200_000, bases[1]).await.unwrap(), 1);
        // Named `<base>.<when retired>-<n>.log.deleted`.
        let stem = format!("{:020}.", bases[0].get());
        let retired = std::fs::read_dir(&pdir)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with(&stem) && name.ends_with(".log.deleted")
            })
            .expect("the retired segment");
        assert_eq!(
            std::fs::metadata(&retired).map(|m| m.len()).ok(),
            Some(size),
            "renamed, whole"
        );
        let mut gone_at = None;
        for _ in 0..3_000 {
            let Ok(meta) = std::fs::metadata(&retired) else {
                gone_at = Some(retired_at.elapsed());
                break;
            };
            assert_eq!(meta.len(), size, "whole until it goes");
            glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
        }
        let gone_at = gone_at.expect("removed once the delay passed");
        assert!(
            gone_at >= delay,
            "removed after {gone_at:?}, before the delay"
        );
        log.close().await.unwrap();
    });
}

/// A follower beside a leader whose retention deleted its expired active segment: the
/// follower takes the leader's log start (the log end) from a fetch answer, keeps
/// copying the leader's next batches at the same offsets, and its own retention later
/// deletes its expired segment the same way.
#[test]
fn a_follower_follows_a_leader_whose_retention_emptied_the_log() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("retention.ms", "60000")]);
        let leader = Log::open(root.join("leader"), cfg.clone()).await.unwrap();
        let follower = Log::open(root.join("follower"), cfg).await.unwrap();
        let copy = |from: Offset| {
            let (leader, follower) = (&leader, &follower);
            async move {
                let end = leader.log_end_offset();
                let r = leader
                    .read_for_replica(from, 1 << 20, 1 << 20, end)
                    .await
                    .unwrap();
                for b in &r.batches {
                    follower
                        .append_keeping_offsets(BytesMut::from(&b[..]), 0)
                        .await
                        .unwrap();
                }
                r.log_start_offset
            }
        };
        for i in 0..4 {
            leader
                .append(batch(1_000 + i, 2), LeaderEpoch(3), 0)
                .await
                .unwrap();
        }
        copy(Offset(0)).await;
        assert_eq!(follower.log_end_offset(), Offset(8));
        let later = 200_000;
        assert_eq!(leader.apply_retention(later, Offset(8)).await.unwrap(), 1);
        // The next fetch answer carries the new log start; nothing to copy.
        let start = copy(Offset(8)).await;
        assert_eq!(start, Offset(8));
        assert_eq!(follower.follow_log_start(start).await.unwrap(), Offset(8));
        assert_eq!(follower.log_start_offset(), follower.log_end_offset());
        leader
            .append(batch(later, 3), LeaderEpoch(3), 0)
            .await
            .unwrap();
        copy(Offset(8)).await;
        assert_eq!(follower.log_end_offset(), Offset(11));
        let r = follower.read(Offset(8), 1 << 20, Offset(11)).await.unwrap();
        assert_eq!(r.batches.len(), 1);
        assert_eq!(r.next_offset, Offset(11));
        // The follower's own retention: its one segment holds the new batch too, so it
        // stays until that expires (as in Kafka, followers roll on their own).
        assert_eq!(
            follower.apply_retention(later, Offset(11)).await.unwrap(),
            0
        );
        assert_eq!(follower.log_start_offset(), Offset(8));
        let much_later = later + 120_000;
        assert_eq!(
            follower
                .apply_retention(much_later, Offset(11))
                .await
                .unwrap(),
            1
        );
        assert_eq!(follower.log_start_offset(), Offset(11));
        assert_eq!(follower.segment_bases(), vec![Offset(11)]);
        leader.close().await.unwrap();
        follower.close().await.unwrap();
    });
}

/// An append that arrives while time retention seals the expired active segment (the
/// seal's fdatasync is an await, and appends do not wait for the I/O lock) goes to the
/// new active segment at the log end and stays readable. Before, retention rolled after
/// the seal: the append landed in the segment being retired, past what its writer had
/// written, and the seal's synced position overtook the written one (an assertion
/// stopped the broker) (found by review).
#[test]
fn an_append_during_retentions_seal_of_the_active_segment_goes_to_the_new_one() {
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    run_on_shard(move || async move {
        prime_dma_probe(&root).await.unwrap();
        let cfg = config(&[("retention.ms", "60000")]);
        let log = Rc::new(Log::open(root.join("t-0"), cfg).await.unwrap());
        for i in 0..5 {
            log.append(batch(1_000 + i, 2), LeaderEpoch(1), 0)
                .await
                .unwrap();
        }
        let end = log.log_end_offset();
        let later = 1_000 + 120_000;
        let retained = {
            let log = log.clone();
            glommio::spawn_local(async move { log.apply_retention(later, end).await })
        };
        // Let retention take the I/O lock and reach the seal's fdatasync.
        for _ in 0..3 {
            futures_lite::future::yield_now().await;
        }
        let info = log
            .append(batch(later, 2), LeaderEpoch(1), 0)
            .await
            .unwrap();
        assert_eq!(retained.await.unwrap(), 1, "the expired segment goes");
        assert_eq!(info.first_offset, end, "the append follows the old end");
        assert_eq!(log.log_start_offset(), end);
        assert_eq!(log.log_end_offset(), Offset(end.0 + 2));
        let read = log.read(end, 1 << 20, Offset(end.0 + 2)).await.unwrap();
        assert_eq!(read.batches.len(), 1, "the new batch is readable");
        assert_eq!(read.next_offset, Offset(end.0 + 2));
    });
}
