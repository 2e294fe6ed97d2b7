//! Storage faults, modelled: the log on a simulated disk (`storage::SimDisk`) that loses
//! every byte not fdatasynced when it "crashes" and fails with EIO or ENOSPC at named
//! points. Shows that `log.flush.on.ack` keeps every acknowledged append through a power
//! loss (and without it the log keeps a prefix of the appends), that an error at each named
//! point fails the log loudly without losing anything acknowledged, and that ENOSPC is not
//! permanent: once space is back appends resume, nothing lost or written twice.
//! Seeded; the seed is printed and replayed with `WEIR_SIM_SEED`.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weir::storage::testing::{build_batch, run_on_shard};
use weir::storage::{Disk, FaultKind, FaultPoint, Log, LogConfig, SimDisk, StorageError};
use wire::{LeaderEpoch, Offset};

/// Crash rounds per seed, seeds per run.
const ROUNDS: usize = 12;
const SEEDS: u64 = 4;
/// Appending tasks per round and appends per task (bounds every round).
const TASKS: u64 = 4;
const APPENDS_PER_TASK: u64 = 12;
/// How long a test waits for the out-of-space backoff to pass (it is 1 s).
const RESUME_TIMEOUT: Duration = Duration::from_secs(20);

fn config(flush_on_ack: bool) -> LogConfig {
    LogConfig::from_pairs([
        ("segment.bytes", "16384"),
        ("index.interval.bytes", "1024"),
        ("log.preallocate", "false"),
        (
            "log.flush.on.ack",
            if flush_on_ack { "true" } else { "false" },
        ),
    ])
    .unwrap()
}

/// A batch whose payload names its task and sequence number.
fn payload(round: usize, task: u64, seq: u64, len: usize) -> BytesMut {
    let mut v = format!("r{round}t{task}s{seq}:").into_bytes();
    v.resize(len.max(v.len()), b'a' + (seq % 26) as u8);
    build_batch(seq as i64, &[&v[..]])
}

/// The (round, task, seq) a batch was built with: its one uncompressed value starts with
/// `r<round>t<task>s<seq>:`, found in the batch's record bytes.
fn tag(batch: &[u8]) -> (usize, u64, u64) {
    let view = wire::batch::validate_batch(batch).unwrap();
    let records = view.records_bytes();
    let parse = |from: usize| -> Option<(usize, u64, u64)> {
        let rest = records.get(from + 1..)?;
        let end = rest.iter().position(|&c| c == b':')?;
        let head = std::str::from_utf8(&rest[..end]).ok()?;
        let (r, rest) = head.split_once('t')?;
        let (t, s) = rest.split_once('s')?;
        Some((r.parse().ok()?, t.parse().ok()?, s.parse().ok()?))
    };
    (0..records.len())
        .filter(|&i| records[i] == b'r')
        .find_map(parse)
        .unwrap()
}

fn base(b: &[u8]) -> i64 {
    wire::batch::read_header(b).unwrap().base_offset().get()
}

fn next_offset(b: &[u8]) -> i64 {
    wire::batch::read_header(b).unwrap().last_offset().get() + 1
}

/// Every batch in the log below `end` (default: the log end), in order, checking that
/// offsets are contiguous.
async fn read_until(log: &Log, end: Option<Offset>) -> Vec<Bytes> {
    let end = end.unwrap_or(log.log_end_offset());
    let mut out: Vec<Bytes> = Vec::new();
    let mut at = log.log_start_offset();
    for _ in 0..100_000 {
        if at >= end {
            break;
        }
        let read = log.read(at, 1 << 20, end).await.unwrap();
        assert!(!read.batches.is_empty(), "no progress reading at {at}");
        for b in read.batches {
            assert_eq!(base(&b), at.get(), "offsets not contiguous");
            at = Offset(next_offset(&b));
            out.push(b);
        }
    }
    assert_eq!(at, end, "read stopped before the log end");
    out
}

async fn read_all(log: &Log) -> Vec<Bytes> {
    read_until(log, None).await
}

fn seed_from_env(name: &str) -> u64 {
    let seed: u64 = std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("{name}={seed}");
    seed
}

/// What one crash round appended: acknowledged offsets by tag, and every tag tried.
#[derive(Default)]
struct Round {
    acked: BTreeMap<(usize, u64, u64), i64>,
}

/// Runs `TASKS` concurrent appenders until each has made its appends or met an error (the
/// disk crashed under it). Returns what was acknowledged.
async fn append_until_crash(log: &Rc<Log>, round: usize, rng: &mut StdRng) -> Round {
    let acked = Rc::new(RefCell::new(Round::default()));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (log, acked) = (log.clone(), acked.clone());
        let lens: Vec<usize> = (0..APPENDS_PER_TASK)
            .map(|_| rng.random_range(10..3000))
            .collect();
        tasks.push(glommio::spawn_local(async move {
            for (seq, len) in lens.into_iter().enumerate() {
                let batch = payload(round, task, seq as u64, len);
                match log.append(batch, LeaderEpoch(1), 0).await {
                    Ok(info) => {
                        let key = (round, task, seq as u64);
                        acked
                            .borrow_mut()
                            .acked
                            .insert(key, info.first_offset.get());
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    for t in tasks {
        t.await;
    }
    Rc::try_unwrap(acked).ok().unwrap().into_inner()
}

/// One seed: rounds of concurrent appends, a power loss at a random operation (some
/// rounds with a torn tail), reopen, and the check against what was acknowledged.
fn crash_rounds(seed: u64, flush_on_ack: bool) {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = root.path().join("sim-0");
    run_on_shard(move || async move {
        let mut rng = StdRng::seed_from_u64(seed);
        let disk = SimDisk::new();
        let cfg = config(flush_on_ack);
        // Batches that survived every earlier round: the log must always start with them.
        let mut kept: Vec<Bytes> = Vec::new();
        for round in 0..ROUNDS {
            let ctx = format!("seed {seed} flush_on_ack={flush_on_ack} round {round}");
            let log = Rc::new(open(&dir, &cfg, &disk).await);
            let torn = rng.random_bool(0.5).then(|| rng.random());
            disk.crash_after(rng.random_range(0..60), torn);
            let crashes = disk.crashes();
            let round_acked = append_until_crash(&log, round, &mut rng).await;
            if disk.crashes() == crashes {
                disk.crash(torn); // the workload ended first
            }
            drop(log);
            let log = open(&dir, &cfg, &disk).await;
            let all = read_all(&log).await;
            assert!(all.len() >= kept.len(), "{ctx}: lost earlier rounds");
            assert_eq!(
                &all[..kept.len()],
                &kept[..],
                "{ctx}: earlier rounds changed"
            );
            check_prefix_of_appends(&all[kept.len()..], round, &ctx);
            let survived: BTreeMap<_, _> = all[kept.len()..]
                .iter()
                .map(|b| (tag(b), base(b)))
                .collect();
            for (key, offset) in &round_acked.acked {
                match survived.get(key) {
                    Some(got) => assert_eq!(got, offset, "{ctx}: {key:?} moved"),
                    None => assert!(
                        !flush_on_ack,
                        "{ctx}: acknowledged append {key:?} at {offset} lost with log.flush.on.ack"
                    ),
                }
            }
            kept = all;
            log.close().await.unwrap();
        }
        drop(root);
    });
}

/// The batches a round left must be, per task, its first appends in order (appends of one
/// task are made one after the other, so the log cannot hold a later one without the
/// earlier ones), each exactly once.
fn check_prefix_of_appends(batches: &[Bytes], round: usize, ctx: &str) {
    let mut next_seq: BTreeMap<u64, u64> = BTreeMap::new();
    for b in batches {
        let (r, task, seq) = tag(b);
        assert_eq!(r, round, "{ctx}: a batch of another round");
        let want = next_seq.entry(task).or_insert(0);
        assert_eq!(seq, *want, "{ctx}: task {task} has a gap or a duplicate");
        *want += 1;
    }
}

async fn open(dir: &Path, cfg: &LogConfig, disk: &Rc<SimDisk>) -> Log {
    Log::open_on(dir.to_path_buf(), cfg.clone(), Disk::Sim(disk.clone()))
        .await
        .unwrap()
}

#[test]
fn a_power_loss_keeps_every_acknowledged_append_with_flush_on_ack() {
    let first = seed_from_env("WEIR_SIM_SEED");
    for k in 0..SEEDS {
        crash_rounds(first.wrapping_add(k), true);
    }
}

#[test]
fn a_power_loss_without_flush_on_ack_leaves_a_prefix_of_the_appends() {
    let first = seed_from_env("WEIR_SIM_SEED");
    for k in 0..SEEDS {
        crash_rounds(first.wrapping_add(k), false);
    }
}

/// Appends until one fails (bounded); returns the acknowledged batches and the error.
async fn append_until_error(log: &Log, acked: &mut Vec<Bytes>, tag_round: usize) -> StorageError {
    for seq in 0..400u64 {
        let batch = payload(tag_round, 0, seq, 700);
        match log.append(batch, LeaderEpoch(1), 0).await {
            Ok(info) => {
                let read = log
                    .read(info.first_offset, usize::MAX, info.last_offset.add(1))
                    .await
                    .unwrap();
                acked.extend(read.batches);
            }
            Err(e) => return e,
        }
    }
    panic!("no append failed in 400 tries");
}

/// Appends `n` batches that must succeed.
async fn append_ok(log: &Log, acked: &mut Vec<Bytes>, tag_round: usize, n: u64) {
    for seq in 0..n {
        let batch = payload(tag_round, 1, seq, 500);
        let info = log.append(batch, LeaderEpoch(1), 0).await.unwrap();
        let read = log
            .read(info.first_offset, usize::MAX, info.last_offset.add(1))
            .await
            .unwrap();
        acked.extend(read.batches);
    }
}

const POINTS: [FaultPoint; 5] = [
    FaultPoint::Append,
    FaultPoint::Roll,
    FaultPoint::Truncate,
    FaultPoint::IndexWrite,
    FaultPoint::Sync,
];

#[test]
fn eio_at_each_named_point_fails_the_log_for_good_and_loses_nothing_acknowledged() {
    for point in POINTS {
        let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let dir = root.path().join("eio-0");
        run_on_shard(move || async move {
            let disk = SimDisk::new();
            let cfg = config(true);
            let log = open(&dir, &cfg, &disk).await;
            let mut acked = Vec::new();
            append_ok(&log, &mut acked, 0, 30).await;
            disk.inject(point, FaultKind::Eio, 2);
            let seen = disk.seen(point);
            let err = append_until_error(&log, &mut acked, 1).await;
            assert!(disk.seen(point) > seen, "{point:?}: never reached");
            assert!(
                !err.is_out_of_space(),
                "{point:?}: EIO taken for ENOSPC: {err}"
            );
            // Loud and permanent: every later append fails, even after the backoff.
            let later = log.append(payload(2, 0, 0, 10), LeaderEpoch(1), 0).await;
            assert!(
                matches!(later, Err(StorageError::Failed { .. })),
                "{point:?}: {later:?}"
            );
            // The failed appends stay unreadable below the high watermark the broker
            // keeps (the end of the acknowledged appends); the acknowledged ones read.
            let acked_end = Offset(next_offset(acked.last().unwrap()));
            assert_eq!(
                read_until(&log, Some(acked_end)).await,
                acked,
                "{point:?}: reads after the error"
            );
            disk.crash(None);
            drop(log);
            let log = open(&dir, &cfg, &disk).await;
            let all = read_all(&log).await;
            assert_eq!(
                all, acked,
                "{point:?}: acknowledged appends after reopening"
            );
            drop(root);
        });
    }
}

/// Appends until one succeeds again after an out-of-space error, waiting out the
/// backoff (bounded). Returns the append's first offset.
async fn append_once_space_is_back(log: &Log, acked: &mut Vec<Bytes>, tag_round: usize) -> i64 {
    let deadline = Instant::now() + RESUME_TIMEOUT;
    loop {
        let batch = payload(tag_round, 2, 0, 600);
        match log.append(batch, LeaderEpoch(1), 0).await {
            Ok(info) => {
                let read = log
                    .read(info.first_offset, usize::MAX, info.last_offset.add(1))
                    .await
                    .unwrap();
                acked.extend(read.batches);
                return info.first_offset.get();
            }
            Err(StorageError::NoSpace { retry_in_ms, .. }) => {
                assert!(Instant::now() < deadline, "appends did not resume");
                let wait = Duration::from_millis(retry_in_ms.clamp(10, 200));
                glommio::timer::sleep(wait).await;
            }
            Err(e) => panic!("an out-of-space log failed for good: {e}"),
        }
    }
}

#[test]
fn enospc_at_each_named_write_point_rolls_back_and_appends_resume() {
    for point in [
        FaultPoint::Append,
        FaultPoint::Roll,
        FaultPoint::Truncate,
        FaultPoint::IndexWrite,
    ] {
        let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let dir = root.path().join("enospc-0");
        run_on_shard(move || async move {
            let disk = SimDisk::new();
            let cfg = config(true);
            let log = open(&dir, &cfg, &disk).await;
            let mut acked = Vec::new();
            append_ok(&log, &mut acked, 0, 20).await;
            disk.inject(point, FaultKind::NoSpace, 1);
            let err = append_until_error(&log, &mut acked, 1).await;
            assert!(err.is_out_of_space(), "{point:?}: {err}");
            let end = log.log_end_offset().get();
            assert_eq!(
                end,
                next_offset(acked.last().unwrap()),
                "{point:?}: offsets advanced"
            );
            let first = append_once_space_is_back(&log, &mut acked, 2).await;
            assert_eq!(
                first, end,
                "{point:?}: the failed append's offsets are reused"
            );
            append_ok(&log, &mut acked, 3, 30).await;
            assert_eq!(read_all(&log).await, acked, "{point:?}: after resuming");
            disk.crash(None);
            drop(log);
            let log = open(&dir, &cfg, &disk).await;
            assert_eq!(read_all(&log).await, acked, "{point:?}: after a power loss");
            drop(root);
        });
    }
}

#[test]
fn a_full_disk_refuses_appends_until_space_is_back_then_nothing_is_lost_or_duplicated() {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir: PathBuf = root.path().join("full-0");
    run_on_shard(move || async move {
        let disk = SimDisk::new();
        let cfg = config(true);
        let log = Rc::new(open(&dir, &cfg, &disk).await);
        let mut acked = Vec::new();
        append_ok(&log, &mut acked, 0, 25).await;
        let end = log.log_end_offset();
        disk.set_full(true);
        // Concurrent appends share the failing write: every one of them fails.
        let tasks: Vec<_> = (0..4u64)
            .map(|task| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    log.append(payload(1, task, 0, 5000), LeaderEpoch(1), 0)
                        .await
                })
            })
            .collect();
        for t in tasks {
            let result = t.await;
            assert!(
                matches!(
                    result,
                    Err(StorageError::NoSpace { .. }) | Err(StorageError::Io { .. })
                ),
                "{result:?}"
            );
        }
        assert!(log.is_out_of_space());
        assert_eq!(log.log_end_offset(), end, "unwritten appends rolled back");
        assert_eq!(read_all(&log).await, acked);
        // The rolled-back write landed half its bytes; a power loss now must not bring
        // any of them back.
        disk.crash(None);
        drop(log);
        let log = Rc::new(open(&dir, &cfg, &disk).await);
        assert_eq!(read_all(&log).await, acked, "rolled-back bytes came back");
        assert_eq!(log.log_end_offset(), end);
        // Still full after the reopen: refused, then space comes back.
        let refused = log.append(payload(2, 0, 0, 100), LeaderEpoch(1), 0).await;
        assert!(refused.is_err(), "{refused:?}");
        disk.set_full(false);
        let first = append_once_space_is_back(&log, &mut acked, 3).await;
        assert_eq!(first, end.get(), "offsets continue where the disk filled");
        append_ok(&log, &mut acked, 4, 40).await;
        assert_eq!(read_all(&log).await, acked, "nothing lost or duplicated");
        disk.crash(None);
        drop(log);
        let log = open(&dir, &cfg, &disk).await;
        assert_eq!(read_all(&log).await, acked, "after a power loss");
        drop(root);
    });
}

/// Waits (bounded) until the out-of-space backoff has passed.
async fn wait_writable(log: &Log) {
    let deadline = Instant::now() + RESUME_TIMEOUT;
    while log.is_out_of_space() {
        assert!(
            Instant::now() < deadline,
            "the out-of-space backoff did not end"
        );
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader's side of replication (issue 11): a follower copies an append from the tail
/// cache while its write is in flight; the write runs out of space and is rolled back.
/// Appending other batches at those offsets under the same leader epoch would leave the
/// follower holding different bytes at offsets the leader counts it in sync for, so the
/// log refuses that epoch until a newer one — and a rollback nobody was served still
/// retries at the same offsets under the same epoch (the single-node behaviour).
#[test]
fn a_rollback_of_offsets_served_to_a_replica_fences_the_leader_epoch() {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = root.path().join("served-0");
    run_on_shard(move || async move {
        let disk = SimDisk::new();
        let log = open(&dir, &config(false), &disk).await;
        let mut acked = Vec::new();
        append_ok(&log, &mut acked, 0, 5).await;
        let written = log.log_end_offset();

        // Not served: rolled back, then retried at the same offsets, same epoch.
        disk.inject(FaultPoint::Append, FaultKind::NoSpace, 0);
        let err = log.append(payload(1, 0, 0, 600), LeaderEpoch(1), 0).await;
        assert!(matches!(err, Err(ref e) if e.is_out_of_space()), "{err:?}");
        assert!(
            !log.epoch_fenced(LeaderEpoch(1)),
            "nobody saw the rolled-back batch"
        );
        wait_writable(&log).await;
        let info = log
            .append(payload(2, 0, 0, 600), LeaderEpoch(1), 0)
            .await
            .unwrap();
        assert_eq!(info.first_offset, written);
        let written = log.log_end_offset();

        // Served to a replica before its write failed.
        disk.inject(FaultPoint::Append, FaultKind::NoSpace, 0);
        disk.hold_writes(true);
        let mut append = Box::pin(log.append(payload(3, 0, 0, 600), LeaderEpoch(1), 0));
        let first_poll = futures_lite::future::poll_once(&mut append).await;
        assert!(
            first_poll.is_none(),
            "the append waits for its write: {first_poll:?}"
        );
        let end = log.log_end_offset();
        assert!(end > written, "offsets assigned before the write");
        // A consumer-style read past the written end is not a replica's copy.
        log.read_within(written, usize::MAX, usize::MAX, end)
            .await
            .unwrap();
        assert!(log.served_end() <= written, "a consumer read is not noted");
        let copied = log
            .read_for_replica(written, usize::MAX, usize::MAX, end)
            .await
            .unwrap();
        assert_eq!(
            copied.next_offset, end,
            "the follower copied the unwritten batch"
        );
        assert_eq!(log.served_end(), end);
        disk.hold_writes(false);
        let err = append.await;
        assert!(matches!(err, Err(ref e) if e.is_out_of_space()), "{err:?}");
        assert_eq!(
            log.log_end_offset(),
            written,
            "rolled back to the written end"
        );
        assert!(log.epoch_fenced(LeaderEpoch(1)));
        wait_writable(&log).await;

        // The same epoch may not reuse the served offsets; nothing is appended.
        let refused = log.append(payload(4, 0, 0, 900), LeaderEpoch(1), 0).await;
        assert!(
            matches!(refused, Err(StorageError::ServedRolledBack { epoch, served_end, log_end, .. })
                if epoch == LeaderEpoch(1) && served_end == end && log_end == written),
            "{refused:?}"
        );
        assert_eq!(log.log_end_offset(), written);
        // Old epochs stay fenced too; a newer one appends at the rolled-back offsets.
        assert!(log.epoch_fenced(LeaderEpoch(0)));
        let info = log
            .append(payload(5, 0, 0, 900), LeaderEpoch(2), 0)
            .await
            .unwrap();
        assert_eq!(info.first_offset, written);
        assert!(!log.epoch_fenced(LeaderEpoch(2)));
        let all = read_all(&log).await;
        let last = all.last().unwrap();
        assert_eq!(tag(last), (5, 0, 0));
        assert_eq!(
            wire::batch::read_header(last)
                .unwrap()
                .partition_leader_epoch(),
            LeaderEpoch(2)
        );
        drop(root);
    });
}

/// Two appends share one I/O run with `log.flush.on.ack`: A's write succeeds, B's fails
/// for lack of space (sealing the full segment's index files, creating the next segment's
/// file, or a second DMA write). Nothing refused may stay in the log: A is either
/// acknowledged (and survives a power loss) or gone. Before, A was written, refused
/// (its waiter saw the out-of-space backoff) and kept: a producer's retry duplicated it.
#[test]
fn an_append_written_before_an_out_of_space_error_in_its_io_run_is_acknowledged_or_gone() {
    // (point, segment.bytes, size of A, size of B): B rolls for the first two; for the
    // last, A and B are one 4 MiB write each in the same segment.
    let cases = [
        (FaultPoint::Roll, 16_384usize, 600usize, 3_000usize),
        (FaultPoint::IndexWrite, 16_384, 600, 3_000),
        (FaultPoint::Append, 16 << 20, 3 << 20, 2 << 20),
    ];
    for (point, segment_bytes, a_len, b_len) in cases {
        let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let dir = root.path().join("shared-run-0");
        run_on_shard(move || async move {
            let disk = SimDisk::new();
            let cfg = LogConfig::from_pairs([
                ("segment.bytes", segment_bytes.to_string().as_str()),
                ("log.preallocate", "false"),
                ("log.flush.on.ack", "true"),
            ])
            .unwrap();
            let log = Rc::new(open(&dir, &cfg, &disk).await);
            // Fill the segment until A still fits and B does not.
            let mut acked = Vec::new();
            for seq in 0..100u64 {
                let size = log.size_bytes() as usize;
                if size + a_len + b_len + 100 > segment_bytes || point == FaultPoint::Append {
                    break;
                }
                let info = log
                    .append(payload(0, 0, seq, 1_000), LeaderEpoch(1), 0)
                    .await
                    .unwrap();
                acked.push(info.first_offset);
            }
            let segments = log.segment_count();
            let skip = match point {
                // The first write of the run (A's) succeeds.
                FaultPoint::Append => 1,
                _ => 0,
            };
            disk.inject(point, FaultKind::NoSpace, skip);
            let spawn = |seq: u64, len: usize| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    log.append(payload(1, 0, seq, len), LeaderEpoch(1), 0).await
                })
            };
            let a = spawn(0, a_len);
            let b = spawn(1, b_len);
            let (a, b) = (a.await, b.await);
            assert!(
                matches!(b, Err(ref e) if e.is_out_of_space()),
                "{point:?}: B: {b:?}"
            );
            if point != FaultPoint::Append {
                assert!(
                    log.segment_count() <= segments + 1,
                    "{point:?}: B rolled once at most"
                );
            }
            let tags_in = |batches: &[Bytes]| -> Vec<(usize, u64, u64)> {
                batches
                    .iter()
                    .map(|b| tag(b))
                    .filter(|t| t.0 == 1)
                    .collect()
            };
            let present = tags_in(&read_all(&log).await);
            match &a {
                Ok(info) => {
                    assert_eq!(present, vec![(1, 0, 0)], "{point:?}: A acknowledged");
                    assert!(log.log_end_offset() > info.last_offset);
                }
                Err(e) => assert!(
                    present.is_empty(),
                    "{point:?}: A refused ({e}) but kept in the log"
                ),
            }
            // An acknowledged A is durable; a refused one does not come back.
            disk.crash(None);
            drop(log);
            let log = open(&dir, &cfg, &disk).await;
            let after = tags_in(&read_all(&log).await);
            assert_eq!(after, present, "{point:?}: after a power loss");
            drop(root);
        });
    }
}
