//! Recovery decision table on real files: zero padding and torn tails are trimmed, damage
//! followed by a valid batch in the active segment refuses to open (naming file and
//! position), damage in a sealed segment fails only the reads that reach it, and the
//! clean-shutdown marker skips the rescan.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use weir::storage::testing::{batch_of_size, run_on_shard};
use weir::storage::{Log, LogConfig, StorageError, prime_dma_probe};
use weir_tests::process::run_bounded;
use wire::{LeaderEpoch, Offset};

/// How long a `weir log` command may run.
const CMD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
const BATCHES: i64 = 20;
const BATCH_BYTES: usize = 1000;

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn config(segment_bytes: u64) -> LogConfig {
    LogConfig::from_pairs([("segment.bytes", segment_bytes.to_string().as_str())]).unwrap()
}

/// Writes `BATCHES` one-record batches and returns without closing (a crash, as far as the
/// files are concerned). Returns the `.log` paths and each batch's (position, size) in
/// the active segment.
fn write_log(pdir: PathBuf, segment_bytes: u64, close: bool) -> Vec<PathBuf> {
    run_on_shard(move || async move {
        prime_dma_probe(pdir.parent().unwrap()).await.unwrap();
        let log = Log::open(pdir.clone(), config(segment_bytes))
            .await
            .unwrap();
        for i in 0..BATCHES {
            log.append(batch_of_size(i, 1, BATCH_BYTES), LeaderEpoch(0), 0)
                .await
                .unwrap();
        }
        if close {
            log.close().await.unwrap();
        }
        log.segment_bases()
            .iter()
            .map(|b| pdir.join(format!("{:020}.log", b.get())))
            .collect()
    })
}

fn open(pdir: PathBuf, segment_bytes: u64) -> Result<(Offset, u64), StorageError> {
    run_on_shard(move || async move {
        prime_dma_probe(pdir.parent().unwrap()).await.unwrap();
        let log = Log::open(pdir, config(segment_bytes)).await?;
        let end = log.log_end_offset();
        // Every remaining batch must read back whole.
        let r = log.read(log.log_start_offset(), usize::MAX, end).await?;
        for b in &r.batches {
            wire::batch::validate_batch(b).unwrap();
        }
        Ok((end, log.size_bytes()))
    })
}

/// Opens without reading anything back: the log end offset.
fn open_only(pdir: PathBuf, segment_bytes: u64) -> Result<Offset, StorageError> {
    run_on_shard(move || async move {
        prime_dma_probe(pdir.parent().unwrap()).await.unwrap();
        Ok(Log::open(pdir, config(segment_bytes))
            .await?
            .log_end_offset())
    })
}

fn batch_size(log_file: &Path) -> u64 {
    let bytes = std::fs::read(log_file).unwrap();
    wire::batch::read_header(&bytes).unwrap().total_size() as u64
}

fn overwrite(path: &Path, pos: u64, bytes: &[u8]) {
    let mut f = OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(pos)).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn zero_padding_after_the_last_batch_is_the_end_not_damage() {
    let dir = tempdir();
    let pdir = dir.path().join("t-0");
    let files = write_log(pdir.clone(), 1 << 30, false);
    let log_file = &files[0];
    let size = batch_size(log_file) * BATCHES as u64;
    // The DMA writer pads the last block with zeros; make it a lot more padding.
    let len = std::fs::metadata(log_file).unwrap().len();
    assert!(len >= size);
    overwrite(log_file, len, &[0u8; 10_000]);
    let (end, bytes) = open(pdir, 1 << 30).unwrap();
    assert_eq!(end, Offset(BATCHES));
    assert_eq!(bytes, size);
    assert_eq!(
        std::fs::metadata(log_file).unwrap().len(),
        size,
        "padding trimmed"
    );
}

#[test]
fn torn_tail_is_truncated_at_the_last_whole_batch() {
    for (case, cut) in [("truncated", true), ("zeroed", false)] {
        let dir = tempdir();
        let pdir = dir.path().join("t-0");
        let files = write_log(pdir.clone(), 1 << 30, false);
        let log_file = &files[0];
        let one = batch_size(log_file);
        let size = one * BATCHES as u64;
        if cut {
            let f = OpenOptions::new().write(true).open(log_file).unwrap();
            f.set_len(size - 100).unwrap();
        } else {
            // Zero the last 50 bytes of the last batch but keep the length: CRC fails.
            overwrite(log_file, size - 50, &[0u8; 50]);
            let f = OpenOptions::new().write(true).open(log_file).unwrap();
            f.set_len(size).unwrap();
        }
        let (end, bytes) = open(pdir.clone(), 1 << 30).unwrap();
        assert_eq!(end, Offset(BATCHES - 1), "{case}");
        assert_eq!(bytes, one * (BATCHES as u64 - 1), "{case}");
        assert_eq!(
            std::fs::metadata(log_file).unwrap().len(),
            bytes,
            "{case}: file cut"
        );
        // And it opens again, unchanged (the repair was durable and complete).
        assert_eq!(
            open(pdir, 1 << 30).unwrap().0,
            Offset(BATCHES - 1),
            "{case}"
        );
    }
}

#[test]
fn flipped_byte_in_the_middle_refuses_to_open_naming_file_and_position() {
    let dir = tempdir();
    let pdir = dir.path().join("t-0");
    let files = write_log(pdir.clone(), 1 << 30, false);
    let log_file = &files[0];
    let one = batch_size(log_file);
    let victim = 7;
    let pos = one * victim + 200;
    let mut byte = [0u8; 1];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(log_file).unwrap();
        f.seek(SeekFrom::Start(pos)).unwrap();
        f.read_exact(&mut byte).unwrap();
    }
    overwrite(log_file, pos, &[byte[0] ^ 0x40]);
    match open(pdir, 1 << 30) {
        Err(StorageError::Corrupt {
            path,
            position,
            reason,
        }) => {
            assert_eq!(&path, log_file);
            assert_eq!(position, one * victim, "position of the damaged batch");
            assert!(reason.contains("valid batch follows"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Nothing was truncated: the data is still there for an operator.
    assert!(std::fs::metadata(log_file).unwrap().len() >= one * BATCHES as u64);
}

/// The base offset is outside the CRC, so a damaged one still passes the CRC check: it
/// must be rejected as damage, not overflow the offset arithmetic.
#[test]
fn base_offset_too_large_for_its_batch_is_damage() {
    for (case, victim) in [("last", BATCHES - 1), ("middle", 7)] {
        let dir = tempdir();
        let pdir = dir.path().join("t-0");
        let files = write_log(pdir.clone(), 1 << 30, false);
        let log_file = &files[0];
        let one = batch_size(log_file);
        overwrite(log_file, one * victim as u64, &i64::MAX.to_be_bytes());
        let result = open(pdir, 1 << 30);
        if victim == BATCHES - 1 {
            assert_eq!(
                result.unwrap().0,
                Offset(BATCHES - 1),
                "{case}: torn tail trimmed"
            );
        } else {
            match result {
                Err(StorageError::Corrupt { position, .. }) => {
                    assert_eq!(position, one * victim as u64, "{case}")
                }
                other => panic!("{case}: expected Corrupt, got {other:?}"),
            }
        }
    }
}

/// DeleteRecords can move the start up to written but unsynced records; if a crash then
/// loses them, the log must restart empty at its start, not append below it.
#[test]
fn log_ending_below_its_start_offset_restarts_empty_at_the_start() {
    let dir = tempdir();
    let pdir = dir.path().join("t-0");
    let files = write_log(pdir.clone(), 1 << 30, true);
    std::fs::write(pdir.join("weir-log-start-offset"), "0\n100\n").unwrap();
    let (start, end, first) = run_on_shard(move || async move {
        prime_dma_probe(pdir.parent().unwrap()).await.unwrap();
        let log = Log::open(pdir, config(1 << 30)).await.unwrap();
        let (start, end) = (log.log_start_offset(), log.log_end_offset());
        let info = log
            .append(batch_of_size(0, 1, BATCH_BYTES), LeaderEpoch(0), 0)
            .await
            .unwrap();
        (start, end, info.first_offset)
    });
    assert_eq!((start, end), (Offset(100), Offset(100)));
    assert_eq!(
        first,
        Offset(100),
        "no offset below the start is handed out"
    );
    assert!(!files[0].exists(), "the segment below the start is deleted");
}

/// A sealed segment is never appended to again, so damage in it is not a torn write: it
/// is neither truncated nor allowed to take the whole log down. The log opens, the batches
/// before the damage read back, and a read that reaches it fails naming the file.
#[test]
fn sealed_segment_that_does_not_end_at_a_batch_opens_and_fails_only_reads_of_the_damage() {
    let dir = tempdir();
    let pdir = dir.path().join("t-0");
    let files = write_log(pdir.clone(), 5000, true);
    assert!(files.len() >= 3, "{files:?}");
    let sealed = files[0].clone();
    let len = std::fs::metadata(&sealed).unwrap().len();
    let f = OpenOptions::new().write(true).open(&sealed).unwrap();
    f.set_len(len - 10).unwrap();
    let last_in_sealed = {
        let bytes = std::fs::read(&files[1]).unwrap();
        wire::batch::read_header(&bytes)
            .unwrap()
            .base_offset()
            .get()
            - 1
    };
    let (end, before, damaged) = run_on_shard(move || async move {
        prime_dma_probe(pdir.parent().unwrap()).await.unwrap();
        let log = Log::open(pdir, config(5000)).await.unwrap();
        let end = log.log_end_offset();
        let before = log.read(Offset(0), usize::MAX, end).await.unwrap();
        let damaged = log.read(Offset(last_in_sealed), usize::MAX, end).await;
        (end, before.next_offset, damaged)
    });
    assert_eq!(end, Offset(BATCHES), "nothing after the damage is lost");
    assert_eq!(
        before,
        Offset(last_in_sealed),
        "the batches before the damage"
    );
    match damaged {
        Err(StorageError::Corrupt { path, .. }) => assert_eq!(path, sealed),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(
        std::fs::metadata(&sealed).unwrap().len(),
        len - 10,
        "not truncated"
    );
}

#[test]
fn clean_shutdown_marker_skips_the_rescan_and_is_consumed() {
    let dir = tempdir();
    let pdir = dir.path().join("t-0");
    let files = write_log(pdir.clone(), 1 << 30, true);
    let marker = pdir.join(".weir-clean-shutdown");
    assert!(marker.exists());
    let log_file = &files[0];
    let one = batch_size(log_file);
    // Damage a batch the index vouches for: a trusted (clean) open does not rescan it...
    overwrite(log_file, one * 2 + 100, b"XX");
    assert_eq!(open_only(pdir.clone(), 1 << 30).unwrap(), Offset(BATCHES));
    assert!(
        !marker.exists(),
        "the marker is removed once the log is open"
    );
    // ...but without the marker (as after a crash) the rescan finds it.
    assert!(matches!(
        open_only(pdir, 1 << 30),
        Err(StorageError::Corrupt { .. })
    ));
}

#[test]
fn weir_log_dump_prints_batches_and_index_entries() {
    let dir = tempdir();
    let pdir = dir.path().join("t-0");
    let files = write_log(pdir.clone(), 1 << 30, true);
    let out = run_bounded(
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["log", "dump"])
            .arg(&pdir),
        CMD_TIMEOUT,
    )
    .expect("weir log dump");
    let text = &out.stdout;
    assert!(out.ok(), "{text}\n{}", out.stderr);
    assert_eq!(text.matches("crcValid: true").count(), BATCHES as usize);
    assert!(text.contains("baseOffset: 0 lastOffset: 0 count: 1"));
    assert!(text.contains("position: 0 CreateTime: 0"));
    assert!(text.contains("offset: ") && text.contains("timestamp: 19 offset: 19"));
    // A damaged batch makes the dump say so and exit non-zero.
    overwrite(&files[0], 300, b"\xff");
    let out = run_bounded(
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["log", "dump"])
            .arg(&files[0]),
        CMD_TIMEOUT,
    )
    .expect("weir log dump");
    let text = &out.stdout;
    assert!(!out.ok());
    assert!(text.contains("crcValid: false"), "{text}");
}
