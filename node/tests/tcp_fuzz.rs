//! The TCP mutation fuzzer (`weir_tests::fuzz`) against a live node: captured client
//! requests, mutated, on many connections. The node must not crash or log a panic, its RSS
//! must stay within 256 MiB of where it started, and a canary producer/consumer on its own
//! connection must keep working with p99 ≤ 50 ms (long run; 250 ms in the default suite,
//! see there). Frames are paced at 1,000/s in all (`WEIR_FUZZ_RATE`, 0 = unpaced).
//!
//! - default suite: 20 s on 4 connections (`WEIR_FUZZ_SECONDS`, `WEIR_FUZZ_SEED` change it);
//!   `WEIR_FUZZ_CONNECTIONS=0` with the long run measures the canary alone;
//! - the long run, ignored by default (`tests/tcp-fuzz.sh --minutes N` builds a release
//!   node and runs it): `WEIR_BIN=target/release/weir WEIR_FUZZ_MINUTES=10 cargo test -p
//!   weir --test tcp_fuzz -- --ignored --nocapture`.

use std::time::Duration;

use anyhow::Result;
use weir_tests::fuzz::{self, FuzzOptions};

fn env(key: &str) -> Option<u64> {
    std::env::var(key).ok().and_then(|v| v.parse().ok())
}

fn fuzz_for(duration: Duration, connections: usize, seed: u64, p99_ms: u64) -> Result<()> {
    let mut opts = FuzzOptions {
        duration,
        connections,
        seed,
        canary_p99_max: Duration::from_millis(env("WEIR_FUZZ_P99_MS").unwrap_or(p99_ms)),
        ..FuzzOptions::default()
    };
    if let Some(rate) = env("WEIR_FUZZ_RATE") {
        opts.requests_per_second = rate;
    }
    eprintln!("tcp-fuzz: seed {seed}, {duration:?}, {connections} connections");
    let report = fuzz::run(&opts)?;
    eprintln!("{report}");
    report.check(&opts)
}

/// How many times the canary's p99 alone (no fuzzing) the fuzzed run's may be, on a
/// machine too loaded for the default suite's 250 ms.
const CANARY_P99_RATIO_MAX: u32 = 4;

#[test]
fn mutated_requests_never_crash_the_node_or_slow_the_canary() -> Result<()> {
    let seconds = env("WEIR_FUZZ_SECONDS").unwrap_or(20);
    let seed = env("WEIR_FUZZ_SEED").unwrap_or(10);
    // A debug node beside the rest of the suite on a loaded 2-core machine: there the
    // canary alone measured p99 50 ms (load average 17), so 250 ms has margin; on a
    // machine slower still, the bound follows the canary alone, measured first on a node
    // of its own; the long run (release node) holds the 50 ms bound.
    let alone = fuzz::run(&FuzzOptions {
        duration: Duration::from_secs(3),
        connections: 0,
        seed,
        ..FuzzOptions::default()
    })?;
    let p99_ms = 250.max(alone.canary_p99.as_millis() as u64 * u64::from(CANARY_P99_RATIO_MAX));
    eprintln!(
        "tcp-fuzz: canary alone p99 {:?}, bound {p99_ms} ms",
        alone.canary_p99
    );
    fuzz_for(Duration::from_secs(seconds), 4, seed, p99_ms)
}

#[test]
#[ignore = "minutes long: WEIR_FUZZ_MINUTES=10 cargo test -p weir --test tcp_fuzz -- --ignored"]
fn long_fuzz_run() -> Result<()> {
    let minutes = env("WEIR_FUZZ_MINUTES").unwrap_or(10);
    let duration = env("WEIR_FUZZ_SECONDS").map_or(minutes * 60, |s| s);
    let seed = env("WEIR_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let connections = env("WEIR_FUZZ_CONNECTIONS").unwrap_or(8) as usize;
    fuzz_for(Duration::from_secs(duration), connections, seed, 50)
}
