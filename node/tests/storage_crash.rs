//! Crash test with real processes: a child process appends in a loop and reports each
//! completed append on stdout; the parent SIGKILLs it at a random moment, reopens the
//! log, and checks that every reported append is present and intact, and that the log
//! ends at a batch boundary. Rounds reuse the same directory, so each child also
//! recovers what the previous one left.
//!
//! The child is this test binary re-executed with `WEIR_CRASH_CHILD_DIR` set; it runs the
//! ignored test `crash_child`. Set `WEIR_CRASH_SEED` to replay a run.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weir::storage::testing::{build_batch, run_on_shard};
use weir::storage::{Log, LogConfig, prime_dma_probe};
use wire::{LeaderEpoch, Offset};

const ROUNDS: usize = 24;
const CHILD_TASKS: u64 = 4;
const CHILD_APPENDS_MAX: u64 = 500_000;
const CHILD_SECONDS_MAX: u64 = 30;
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);

/// The batch a child appends as `seq` of `task`: sizes vary from 1 record of a few bytes
/// to many records of up to 2 KiB, so writes straddle blocks and segments.
fn payload(task: u64, seq: u64) -> BytesMut {
    let mut rng = StdRng::seed_from_u64(task << 32 | seq);
    let records = rng.random_range(1..=8usize);
    let values: Vec<Vec<u8>> = (0..records)
        .map(|r| {
            let len = rng.random_range(1..2048usize);
            let mut v = format!("t{task}s{seq}r{r}:").into_bytes();
            v.resize(len.max(v.len()), b'a' + (seq % 26) as u8);
            v
        })
        .collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| &v[..]).collect();
    build_batch(seq as i64, &refs)
}

fn config(flush_on_ack: bool) -> LogConfig {
    LogConfig::from_pairs([
        ("segment.bytes", "262144"),
        ("index.interval.bytes", "4096"),
        (
            "log.flush.on.ack",
            if flush_on_ack { "true" } else { "false" },
        ),
    ])
    .unwrap()
}

#[test]
#[ignore = "child process of crash_rounds_keep_every_reported_append; run by it"]
fn crash_child() {
    let Ok(dir) = std::env::var("WEIR_CRASH_CHILD_DIR") else {
        return;
    };
    let flush = std::env::var("WEIR_CRASH_FLUSH").is_ok_and(|v| v == "1");
    let round: u64 = std::env::var("WEIR_CRASH_ROUND").unwrap().parse().unwrap();
    run_on_shard(move || async move {
        let dir = PathBuf::from(dir);
        prime_dma_probe(dir.parent().unwrap()).await.unwrap();
        let log = std::rc::Rc::new(Log::open(dir, config(flush)).await.unwrap());
        // libtest has printed "test crash_child ... " without a newline: start a line.
        println!("\nOPENED {}", log.log_end_offset());
        let deadline = Instant::now() + Duration::from_secs(CHILD_SECONDS_MAX);
        let tasks: Vec<_> = (0..CHILD_TASKS)
            .map(|t| {
                let log = log.clone();
                let task = round * CHILD_TASKS + t;
                glommio::spawn_local(async move {
                    for seq in 0..CHILD_APPENDS_MAX {
                        if Instant::now() > deadline {
                            break;
                        }
                        let info = log.append(payload(task, seq), LeaderEpoch(1), 0).await;
                        let info = info.unwrap();
                        println!(
                            "APPENDED {} {} {task} {seq}",
                            info.first_offset, info.last_offset
                        );
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
    });
}

/// One completed append as the child reported it.
#[derive(Clone, Copy, Debug)]
struct Reported {
    last: i64,
    task: u64,
    seq: u64,
}

fn parse_line(line: &str) -> Option<(i64, Reported)> {
    let mut it = line.strip_prefix("APPENDED ")?.split(' ');
    let first = it.next()?.parse().ok()?;
    let last = it.next()?.parse().ok()?;
    let task = it.next()?.parse().ok()?;
    let seq = it.next()?.parse().ok()?;
    Some((first, Reported { last, task, seq }))
}

/// Runs one child until a random moment after it opened the log, SIGKILLs it, and
/// returns the appends it reported.
fn run_child(dir: &Path, round: usize, flush: bool, kill_after: Duration) -> Vec<(i64, Reported)> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("WEIR_CRASH_CHILD_DIR", dir)
        .env("WEIR_CRASH_FLUSH", if flush { "1" } else { "0" })
        .env("WEIR_CRASH_ROUND", round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let opened = Instant::now();
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(OPEN_TIMEOUT.saturating_sub(opened.elapsed())) {
            Ok(l) if l.starts_with("OPENED") => break,
            Ok(l) if l.contains("OPENED") => break,
            Ok(l) => lines.push(l),
            Err(e) => panic!("round {round}: child never opened the log: {e}"),
        }
    }
    std::thread::sleep(kill_after);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    lines.iter().filter_map(|l| parse_line(l)).collect()
}

/// Reopens the log and returns every batch by base offset, plus the log end offset.
fn read_all(dir: PathBuf) -> (BTreeMap<i64, Bytes>, Offset) {
    run_on_shard(move || async move {
        prime_dma_probe(dir.parent().unwrap()).await.unwrap();
        let log = Log::open(dir, config(false)).await.unwrap();
        let end = log.log_end_offset();
        let mut batches = BTreeMap::new();
        let mut at = log.log_start_offset();
        for _ in 0..1_000_000 {
            if at >= end {
                break;
            }
            let r = log.read(at, 4 << 20, end).await.unwrap();
            assert!(
                !r.batches.is_empty(),
                "no batch at {at} below the end {end}"
            );
            for b in r.batches {
                let h = wire::batch::validate_batch(&b).unwrap().header;
                batches.insert(h.base_offset().get(), b.clone());
            }
            at = r.next_offset;
        }
        assert_eq!(at, end, "the log ends at a batch boundary");
        (batches, end)
    })
}

#[test]
fn crash_rounds_keep_every_reported_append() {
    let seed = std::env::var("WEIR_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("WEIR_CRASH_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = root.path().join("crash-0");
    let mut acked: BTreeMap<i64, Reported> = BTreeMap::new();
    for round in 0..ROUNDS {
        let flush = round % 2 == 0;
        let kill_after = Duration::from_millis(rng.random_range(5..300));
        let reported = run_child(&dir, round, flush, kill_after);
        acked.extend(reported.iter().copied());
        let (batches, end) = read_all(dir.clone());
        for (first, r) in &acked {
            let Some(got) = batches.get(first) else {
                panic!("seed {seed} round {round}: reported append at {first} missing (end {end})");
            };
            let h = wire::batch::read_header(got).unwrap();
            assert_eq!(h.last_offset().get(), r.last, "seed {seed} round {round}");
            let want = payload(r.task, r.seq);
            assert_eq!(
                &got[21..],
                &want[21..],
                "seed {seed} round {round}: bytes of {first}"
            );
        }
        println!(
            "round {round}: flush_on_ack={flush} killed after {kill_after:?}, {} reported this round, {} total, end {end}",
            reported.len(),
            acked.len()
        );
    }
    assert!(acked.len() > ROUNDS, "children appended something");
}
