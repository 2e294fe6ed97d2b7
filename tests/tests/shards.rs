//! Thread-per-core is real: with `--shards 2`, the partitions of two topics are owned by
//! both shards (seen from outside: which shard's threads and io_uring workers write a
//! partition's bytes to disk), and one client connection — accepted by one shard —
//! produces to and fetches from every partition, the other shard's included, correctly.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use bytes::Bytes;
use kafka_protocol::records::Compression;
use weir_tests::broker::{shard_write_bytes, shard_write_deltas};
use weir_tests::raw::{self, RawConn};
use weir_tests::{Weir, WeirConfig};

const TOPICS: [&str; 2] = ["spread-a", "spread-b"];
const PARTITIONS: i32 = 4;
/// Per partition: this many single-record batches of `VALUE_BYTES`.
const BATCHES: usize = 12;
const VALUE_BYTES: usize = 256 * 1024;

type ThreadWrites = BTreeMap<String, (usize, u64)>;

#[test]
fn partitions_spread_over_both_shards_and_one_connection_serves_all() -> Result<()> {
    let weir = Weir::start(WeirConfig::shards(2))?;
    weir_tests::clients::create_topics(&weir.bootstrap(), &TOPICS, PARTITIONS, &[])?;
    let pid = weir.pid().unwrap_or(0);
    let mut conn = RawConn::connect(weir.addr())?;

    let mut owner: BTreeMap<(&str, i32), usize> = BTreeMap::new();
    for topic in TOPICS {
        for p in 0..PARTITIONS {
            let before = shard_write_bytes(pid)?;
            produce_partition(&mut conn, topic, p)?;
            let delta = deltas_once_written(pid, &before)?;
            owner.insert((topic, p), writer_shard(&delta, topic, p)?);
        }
    }
    let shards_used: std::collections::BTreeSet<usize> = owner.values().copied().collect();
    ensure!(
        shards_used.len() == 2,
        "all partitions written by shard(s) {shards_used:?}: {owner:?}"
    );
    eprintln!("partition owners (shard by disk writes): {owner:?}");

    // The same connection reads every partition back, whichever shard owns it.
    for topic in TOPICS {
        for p in 0..PARTITIONS {
            fetch_and_check(&mut conn, topic, p)?;
        }
    }
    Ok(())
}

/// The value of record `i` of a partition: deterministic, incompressible enough.
fn value(topic: &str, partition: i32, i: usize) -> Vec<u8> {
    let mut x =
        (topic.len() as u64 + 1) * 0x9e37_79b9 + partition as u64 * 7919 + i as u64 * 104_729 + 1;
    (0..VALUE_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn produce_partition(conn: &mut RawConn, topic: &str, p: i32) -> Result<()> {
    for i in 0..BATCHES {
        let batch: Bytes = raw::record_batch(&[value(topic, p, i)], Compression::None)?;
        let (code, base) = conn.produce(topic, p, -1, batch)?;
        ensure!(code == 0, "{topic}/{p} batch {i}: error {code}");
        ensure!(
            base == i as i64,
            "{topic}/{p} batch {i}: base offset {base}"
        );
    }
    Ok(())
}

/// Per-shard bytes written since `before`, once one shard has written the partition's
/// payload (write-behind may trail the ack; bounded: 10 s, then whatever was seen).
fn deltas_once_written(pid: u32, before: &ThreadWrites) -> Result<BTreeMap<usize, u64>> {
    let payload = (BATCHES * VALUE_BYTES) as u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let delta = shard_write_deltas(before, &shard_write_bytes(pid)?);
        if delta.values().any(|d| *d >= payload) || Instant::now() > deadline {
            return Ok(delta);
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The shard that wrote (at least) the partition's bytes while the others wrote little.
fn writer_shard(delta: &BTreeMap<usize, u64>, topic: &str, p: i32) -> Result<usize> {
    let payload = (BATCHES * VALUE_BYTES) as u64;
    let Some((&shard, &most)) = delta.iter().max_by_key(|(_, d)| **d) else {
        bail!("no weir-shard threads found (thread names changed?)");
    };
    let others: u64 = delta
        .iter()
        .filter(|(s, _)| **s != shard)
        .map(|(_, d)| *d)
        .sum();
    ensure!(
        most >= payload / 2 && others < most / 4,
        "{topic}/{p}: no single shard wrote its {payload} bytes: per-shard write bytes {delta:?}"
    );
    Ok(shard)
}

fn fetch_and_check(conn: &mut RawConn, topic: &str, p: i32) -> Result<()> {
    let mut offset = 0i64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while offset < BATCHES as i64 {
        ensure!(
            Instant::now() < deadline,
            "{topic}/{p}: fetched only {offset} records in 30 s"
        );
        let (code, hw, records) = conn.fetch(topic, p, offset, 1 << 20)?;
        ensure!(code == 0, "{topic}/{p} fetch at {offset}: error {code}");
        ensure!(hw == BATCHES as i64, "{topic}/{p}: high watermark {hw}");
        let from = offset;
        for r in records.into_iter().filter(|r| r.offset >= from) {
            ensure!(
                r.offset == offset,
                "{topic}/{p}: offset {} where {offset} was expected",
                r.offset
            );
            let want = value(topic, p, offset as usize);
            ensure!(
                r.value.as_deref() == Some(&want[..]),
                "{topic}/{p}@{offset}: value differs"
            );
            offset += 1;
        }
    }
    Ok(())
}
