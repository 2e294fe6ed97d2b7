//! Model-based test: random sequences of append / roll / read / read-by-time / truncate /
//! DeleteRecords / retention / close-and-reopen / crash-and-reopen against a simple
//! in-memory reference, comparing every read. Seeded; the seed is printed and can be
//! replayed with `WEIR_MODEL_SEED`.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weir::storage::testing::{build_batch, run_on_shard};
use weir::storage::{Log, LogConfig, prime_dma_probe};
use wire::{LeaderEpoch, Offset};

const RUNS: u64 = 6;
const STEPS: usize = 400;

/// The reference: the batches the log must hold, in order, and its start offset.
#[derive(Default)]
struct Model {
    batches: Vec<Bytes>,
    log_start: i64,
    end: i64,
}

fn last(b: &Bytes) -> i64 {
    wire::batch::read_header(b).unwrap().last_offset().get()
}

fn base(b: &Bytes) -> i64 {
    wire::batch::read_header(b).unwrap().base_offset().get()
}

fn max_ts(b: &Bytes) -> i64 {
    wire::batch::read_header(b).unwrap().max_timestamp()
}

impl Model {
    /// Batches a read at `start` should return if it could span every segment.
    fn read(&self, start: i64, max_bytes: usize, upper: i64) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut total = 0;
        for b in self.batches.iter().filter(|b| last(b) >= start) {
            if last(b) >= upper || (!out.is_empty() && total + b.len() > max_bytes) {
                break;
            }
            total += b.len();
            out.push(b.clone());
        }
        out
    }

    fn by_time(&self, ts: i64) -> Option<(i64, i64)> {
        self.batches
            .iter()
            .find(|b| max_ts(b) >= ts)
            .map(|b| (base(b).max(self.log_start), max_ts(b)))
    }

    fn truncate(&mut self, target: i64) {
        if target >= self.end {
            return;
        }
        if target <= self.log_start {
            self.batches.clear();
            self.log_start = target;
            self.end = target;
            return;
        }
        let keep = self.batches.iter().take_while(|b| last(b) < target).count();
        self.batches.truncate(keep);
        self.end = self.batches.last().map_or(self.log_start, |b| last(b) + 1);
    }

    fn advance_start(&mut self, start: i64) {
        self.log_start = start;
        self.batches.retain(|b| last(b) >= start);
    }
}

fn random_batch(rng: &mut StdRng) -> bytes::BytesMut {
    let big = rng.random_bool(0.1);
    let records = if big { 1 } else { rng.random_range(1..6usize) };
    let size = if big {
        9000
    } else {
        rng.random_range(1..600usize)
    };
    let values: Vec<Vec<u8>> = (0..records).map(|r| vec![r as u8; size]).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| &v[..]).collect();
    build_batch(rng.random_range(0..10_000), &refs)
}

async fn check_read(log: &Log, model: &Model, rng: &mut StdRng, seed: u64, step: usize) {
    let start = rng.random_range(model.log_start..=model.end);
    let upper = rng.random_range(start..=model.end);
    let max_bytes = rng.random_range(1..40_000usize);
    let got = log
        .read(Offset(start), max_bytes, Offset(upper))
        .await
        .unwrap();
    let want = model.read(start, max_bytes, upper);
    let ctx = format!("seed {seed} step {step}: read({start}, {max_bytes}, {upper})");
    assert!(got.batches.len() <= want.len(), "{ctx}: too many batches");
    assert_eq!(got.batches.is_empty(), want.is_empty(), "{ctx}: emptiness");
    for (g, w) in got.batches.iter().zip(&want) {
        assert_eq!(g, w, "{ctx}: batch bytes");
    }
    if got.batches.len() < want.len() {
        // A read stops early only where a segment ends.
        let bases = log.segment_bases();
        assert!(
            bases.contains(&got.next_offset),
            "{ctx}: stopped mid-segment at {}",
            got.next_offset
        );
    }
}

async fn step(
    slot: &mut Option<Log>,
    model: &mut Model,
    dir: &Path,
    cfg: &LogConfig,
    rng: &mut StdRng,
    seed: u64,
    i: usize,
) {
    let ctx = format!("seed {seed} step {i}");
    let log = slot.as_ref().unwrap();
    match rng.random_range(0..100) {
        0..=44 => {
            let n = rng.random_range(1..4);
            let mut blob = bytes::BytesMut::new();
            for _ in 0..n {
                blob.extend_from_slice(&random_batch(rng));
            }
            let info = log.append(blob, LeaderEpoch(3), 0).await.unwrap();
            assert_eq!(info.first_offset, Offset(model.end), "{ctx}");
            let read = log
                .read(info.first_offset, usize::MAX, info.last_offset.add(1))
                .await
                .unwrap();
            model.batches.extend(read.batches);
            model.end = info.last_offset.get() + 1;
        }
        45..=47 => log.roll().unwrap(),
        48..=69 => check_read(log, model, rng, seed, i).await,
        70..=77 => {
            let ts = rng.random_range(-10..10_010);
            assert_eq!(
                log.read_by_time(ts)
                    .await
                    .unwrap()
                    .map(|(o, t)| (o.get(), t)),
                model.by_time(ts),
                "{ctx}: by time {ts}"
            );
        }
        78..=82 => {
            let target = rng.random_range(model.log_start.saturating_sub(2).max(0)..=model.end + 2);
            let got = log.truncate_to(Offset(target)).await.unwrap();
            model.truncate(target);
            assert_eq!(got, Offset(model.end), "{ctx}: truncate_to({target})");
        }
        83..=85 => {
            let target = rng.random_range(model.log_start..=model.end);
            let got = log.delete_records_before(Offset(target)).await.unwrap();
            model.advance_start(target.max(model.log_start));
            assert_eq!(
                got,
                Offset(model.log_start),
                "{ctx}: delete_records_before({target})"
            );
        }
        86..=89 => {
            log.apply_retention(0, log.log_end_offset()).await.unwrap();
            let start = log.log_start_offset().get();
            assert!(
                start >= model.log_start,
                "{ctx}: retention moved start back"
            );
            model.advance_start(start);
            assert!(
                model
                    .batches
                    .first()
                    .is_none_or(|b| base(b) == start || model.log_start == start),
                "{ctx}"
            );
        }
        90..=94 => {
            log.close().await.unwrap();
            *slot = None;
            *slot = Some(Log::open(dir.to_path_buf(), cfg.clone()).await.unwrap());
        }
        _ => {
            // Crash: drop without closing; everything acknowledged must survive.
            *slot = None;
            *slot = Some(Log::open(dir.to_path_buf(), cfg.clone()).await.unwrap());
        }
    }
    let log = slot.as_ref().unwrap();
    assert_eq!(log.log_end_offset(), Offset(model.end), "{ctx}: log end");
    assert_eq!(
        log.log_start_offset(),
        Offset(model.log_start),
        "{ctx}: log start"
    );
}

fn run(seed: u64) {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = root.path().join("model-0");
    run_on_shard(move || async move {
        prime_dma_probe(root.path()).await.unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let segment_bytes = [32_768u64, 65_536, 200_000][rng.random_range(0..3)];
        let cache = [0u64, 10_000, 1 << 20][rng.random_range(0..3)];
        let cfg = LogConfig::from_pairs([
            ("segment.bytes", segment_bytes.to_string().as_str()),
            ("index.interval.bytes", "1024"),
            ("retention.bytes", "60000"),
            ("log.tail.cache.bytes", cache.to_string().as_str()),
            (
                "log.flush.on.ack",
                if rng.random_bool(0.5) {
                    "true"
                } else {
                    "false"
                },
            ),
        ])
        .unwrap();
        let mut slot = Some(Log::open(dir.clone(), cfg.clone()).await.unwrap());
        let mut model = Model::default();
        for i in 0..STEPS {
            step(&mut slot, &mut model, &dir, &cfg, &mut rng, seed, i).await;
        }
        let log = slot.as_ref().unwrap();
        let all = log
            .read(Offset(model.log_start), usize::MAX, Offset(model.end))
            .await
            .unwrap();
        assert!(!model.batches.is_empty() || all.batches.is_empty());
        drop(root);
    });
}

#[test]
fn log_matches_the_reference_model() {
    let first: u64 = std::env::var("WEIR_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!(
        "WEIR_MODEL_SEED={first} (runs seeds {first}..{})",
        first.wrapping_add(RUNS)
    );
    for k in 0..RUNS {
        run(first.wrapping_add(k));
    }
}
