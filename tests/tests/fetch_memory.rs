//! Fetch memory (issue 10, finding 1), against a real node with 2 shards and a cold
//! 32 MiB partition (the node restarted after it was written, so every read comes from
//! the segment files):
//! - one Fetch v4 naming that partition 100 times with limits near 2^31 is answered with
//!   the partition once, within `fetch.max.bytes` and one partition's worth of bytes, and
//!   the broker's peak RSS (VmHWM) grows by little;
//! - `fetch.max.bytes` caps a response whatever the client asks (the first batch whole);
//! - four connections pipelining cold fetches they never read are held to
//!   `fetch.response.buffer.max.bytes`, a canary producer on another connection keeps
//!   its p99 latency, and the memory goes back to the OS once the connections close.
//!
//! Figures are printed as `MEASURE ...` lines. Before the fix the first case answered
//! 2 GiB with +3.7 GiB VmHWM, and the pipelined case reached 2.3 GiB with a 2 s stall.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use weir_tests::broker::proc_status_kib;
use weir_tests::raw::{RawConn, record_batch};
use weir_tests::{Weir, WeirConfig, clients};

const COLD_TOPIC: &str = "cold";
const CANARY_TOPIC: &str = "canary";
/// Bytes written to the cold partition.
const PARTITION_BYTES: usize = 32 << 20;
/// Record value size; 100 of them make a batch well under `message.max.bytes`.
const VALUE_BYTES: usize = 10_000;
const VALUES_PER_PRODUCE: usize = 100;
/// Times the abusive fetch names the same partition.
const DUPLICATES: usize = 100;
/// `max_bytes` and `partition_max_bytes` "near 2^31".
const LIMIT_NEAR_2_31: i32 = i32::MAX - 1;
/// Kafka's (and weir's) default `fetch.max.bytes`.
const FETCH_MAX_BYTES_DEFAULT: usize = 57_671_680;
/// VmHWM growth allowed for the abusive fetch (the response itself is up to 32 MiB).
const ABUSIVE_HWM_GROWTH_KIB_MAX: u64 = 200 * 1024;
/// Socket timeout of the raw connections: a cold read of a big response on a loaded
/// 2-core machine may take seconds.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Appends about `bytes` of uncompressed records to `topic`-`partition` through one raw
/// connection; returns the high watermark.
fn fill(weir: &Weir, topic: &str, partition: i32, bytes: usize) -> Result<i64> {
    let mut conn = RawConn::connect_timeout(weir.addr(), IO_TIMEOUT)?;
    let produces = bytes.div_ceil(VALUE_BYTES * VALUES_PER_PRODUCE);
    let mut end = 0;
    for i in 0..produces {
        let values: Vec<Vec<u8>> = (0..VALUES_PER_PRODUCE)
            .map(|v| vec![((i * 7 + v) % 251) as u8; VALUE_BYTES])
            .collect();
        let batch = record_batch(&values, Compression::None)?;
        let (error, base) = conn.produce(topic, partition, 1, batch)?;
        ensure!(error == 0, "produce {i}: error {error}");
        end = base + VALUES_PER_PRODUCE as i64;
    }
    Ok(end)
}

/// A Fetch naming `topic`'s `partitions` in order (repeats allowed), all from offset 0.
fn fetch_request(topic: &str, partitions: &[i32], limit: i32) -> FetchRequest {
    let parts = partitions
        .iter()
        .map(|&p| {
            FetchPartition::default()
                .with_partition(p)
                .with_fetch_offset(0)
                .with_partition_max_bytes(limit)
        })
        .collect();
    let topic = FetchTopic::default()
        .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
        .with_partitions(parts);
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(limit)
        .with_topics(vec![topic])
}

/// (partition entries, record bytes, base offset of the first batch) of a response.
fn answered(resp: &FetchResponse) -> Result<(usize, usize, Option<i64>)> {
    let mut entries = 0;
    let mut bytes = 0;
    let mut first_base = None;
    for t in &resp.responses {
        for p in &t.partitions {
            ensure!(
                p.error_code == 0,
                "partition {}: error {}",
                p.partition_index,
                p.error_code
            );
            entries += 1;
            let records = p.records.clone().unwrap_or_default();
            if first_base.is_none() && records.len() >= 8 {
                first_base = Some(i64::from_be_bytes(records[..8].try_into()?));
            }
            bytes += records.len();
        }
    }
    Ok((entries, bytes, first_base))
}

fn vm_hwm_kib(weir: &Weir) -> Result<u64> {
    proc_status_kib(weir.pid().context("weir is not running")?, "VmHWM")
}

/// A node with a cold 32 MiB partition `cold-0` (and a `canary` topic), restarted.
fn cold_node(config: WeirConfig) -> Result<Weir> {
    let mut weir = Weir::start(config)?;
    clients::create_topics(&weir.bootstrap(), &[COLD_TOPIC, CANARY_TOPIC], 1, &[])?;
    let end = fill(&weir, COLD_TOPIC, 0, PARTITION_BYTES)?;
    ensure!(end > 0);
    weir.terminate()?;
    weir.restart()?;
    Ok(weir)
}

#[test]
fn a_cold_partition_named_100_times_is_read_once_within_fetch_max_bytes() -> Result<()> {
    let weir = cold_node(WeirConfig::shards(2))?;
    let hwm_before = vm_hwm_kib(&weir)?;
    let mut conn = RawConn::connect_timeout(weir.addr(), IO_TIMEOUT)?;
    let req = fetch_request(COLD_TOPIC, &[0; DUPLICATES], LIMIT_NEAR_2_31);
    let started = Instant::now();
    let resp: FetchResponse = conn.call(ApiKey::Fetch, 4, &req)?;
    let ms = started.elapsed().as_millis();
    let hwm_after = vm_hwm_kib(&weir)?;
    let (entries, bytes, first_base) = answered(&resp)?;
    eprintln!(
        "MEASURE abusive_fetch duplicates={DUPLICATES} entries={entries} record_bytes={bytes} \
         ms={ms} vm_hwm_before_kib={hwm_before} vm_hwm_after_kib={hwm_after} \
         vm_hwm_growth_kib={}",
        hwm_after.saturating_sub(hwm_before)
    );
    ensure!(
        entries == 1,
        "{entries} entries for one partition named {DUPLICATES} times"
    );
    ensure!(
        first_base == Some(0),
        "first batch at {first_base:?}, expected offset 0"
    );
    ensure!(
        bytes <= FETCH_MAX_BYTES_DEFAULT,
        "{bytes} bytes > fetch.max.bytes"
    );
    ensure!(
        (PARTITION_BYTES..=PARTITION_BYTES + (1 << 20)).contains(&bytes),
        "{bytes} bytes for a partition of ~{PARTITION_BYTES}"
    );
    ensure!(
        hwm_after < hwm_before + ABUSIVE_HWM_GROWTH_KIB_MAX,
        "VmHWM {hwm_before} -> {hwm_after} KiB for one fetch"
    );
    Ok(())
}

#[test]
fn fetch_max_bytes_caps_a_response_whatever_the_client_asks() -> Result<()> {
    const FETCH_MAX_BYTES: usize = 4 << 20;
    let weir = Weir::start(WeirConfig::shards(2).set("fetch.max.bytes", FETCH_MAX_BYTES))?;
    clients::create_topics(&weir.bootstrap(), &[COLD_TOPIC], 2, &[])?;
    for p in 0..2 {
        fill(&weir, COLD_TOPIC, p, 3 << 20)?;
    }
    let mut conn = RawConn::connect_timeout(weir.addr(), IO_TIMEOUT)?;
    let req = fetch_request(COLD_TOPIC, &[0, 1], LIMIT_NEAR_2_31);
    let (entries, bytes, _) = answered(&conn.call(ApiKey::Fetch, 4, &req)?)?;
    ensure!(entries == 2, "{entries} entries for 2 partitions");
    ensure!(
        bytes <= FETCH_MAX_BYTES && bytes > FETCH_MAX_BYTES - (2 << 20),
        "{bytes} record bytes with fetch.max.bytes={FETCH_MAX_BYTES}"
    );
    // A client limit of 1 byte still gets the first batch whole (KIP-74), and only that.
    let req = fetch_request(COLD_TOPIC, &[0, 1], 1);
    let (_, bytes, first_base) = answered(&conn.call(ApiKey::Fetch, 4, &req)?)?;
    ensure!(first_base == Some(0));
    ensure!(
        bytes > 0 && bytes <= 1 << 20,
        "{bytes} bytes for a 1-byte limit"
    );
    Ok(())
}

/// Connections that pipeline cold fetches and never read the responses.
const STALLED_CONNECTIONS: usize = 4;
/// Fetches each stalled connection sends (the broker works on 16 at a time per connection).
const FETCHES_PER_CONNECTION: usize = 16;
/// The node-wide response budget of the pipelined test (the default).
const RESPONSE_BUFFER_BYTES: u64 = 256 << 20;
/// VmHWM growth allowed while the stalled connections are open: the budget plus cold-read
/// windows and allocator slack. Before the fix: 2.3 GiB.
const STALLED_HWM_GROWTH_KIB_MAX: u64 = 400 * 1024;
/// RSS above the pre-load RSS allowed once the stalled connections are gone.
const RSS_AFTER_GROWTH_KIB_MAX: u64 = 128 * 1024;
/// Canary produces, one every `CANARY_GAP`, during the load.
const CANARY_PRODUCES: usize = 200;
const CANARY_GAP: Duration = Duration::from_millis(10);
/// Largest p99 produce latency allowed for the canary. Generous for a loaded 2-core CI
/// machine running a debug build (measured there: 68-74 ms p99 with the fix, 864 ms p99
/// and a 2.8 s stall before it); the aim on a quiet machine is 50 ms. On a machine where
/// the canary alone (before the load) is slower, `CANARY_P99_RATIO_MAX` times that.
const CANARY_P99_MAX: Duration = Duration::from_millis(250);
const CANARY_P99_RATIO_MAX: u32 = 3;

#[test]
fn pipelined_unread_cold_fetches_are_bounded_and_a_producer_keeps_its_latency() -> Result<()> {
    let weir = cold_node(WeirConfig::shards(2))?;
    let mut canary = RawConn::connect_timeout(weir.addr(), IO_TIMEOUT)?;
    let small = record_batch(&[vec![1u8; 100]], Compression::None)?;
    ensure!(canary.produce(CANARY_TOPIC, 0, 1, small.clone())?.0 == 0);
    let p99_alone = percentile(&canary_latencies(&mut canary, &small)?, 99);
    let (hwm_before, rss_before) = (vm_hwm_kib(&weir)?, weir.rss_kib()?);

    let req = fetch_request(COLD_TOPIC, &[0], LIMIT_NEAR_2_31);
    let mut stalled = Vec::new();
    let mut reader_ids = Vec::new();
    for c in 0..STALLED_CONNECTIONS {
        let mut conn = RawConn::connect_timeout(weir.addr(), IO_TIMEOUT)?;
        for _ in 0..FETCHES_PER_CONNECTION {
            let id = conn.send(ApiKey::Fetch, 4, &req)?;
            if c == 0 {
                reader_ids.push(id);
            }
        }
        stalled.push(conn);
    }
    let latencies = canary_latencies(&mut canary, &small)?;
    let hwm_stalled = vm_hwm_kib(&weir)?;
    let p99 = percentile(&latencies, 99);

    // One stalled connection reads its responses: the first that carries records is a
    // whole, valid cold read. Those before it may be empty: a fetch that finds its shard's
    // budget held by the other stalled connections for all of its max_wait is answered
    // with no records, as Kafka answers a fetch that found nothing in time, and its
    // client fetches again.
    let (mut first_bytes, mut first_base, mut empty_before) = (0, None, 0);
    for id in reader_ids {
        let resp: FetchResponse = stalled[0].recv(ApiKey::Fetch, 4, id)?;
        (_, first_bytes, first_base) = answered(&resp)?;
        if first_bytes > 0 {
            break;
        }
        empty_before += 1;
    }
    drop(stalled);
    let rss_after = settled_rss_kib(&weir, rss_before + RSS_AFTER_GROWTH_KIB_MAX)?;
    eprintln!(
        "MEASURE pipelined_cold_fetches connections={STALLED_CONNECTIONS} \
         fetches_each={FETCHES_PER_CONNECTION} vm_hwm_before_kib={hwm_before} \
         vm_hwm_stalled_kib={hwm_stalled} vm_hwm_growth_kib={} rss_before_kib={rss_before} \
         rss_after_close_kib={rss_after} canary_p50_ms={:.2} canary_p99_ms={:.2} \
         canary_max_ms={:.2} empty_before_first={empty_before}",
        hwm_stalled.saturating_sub(hwm_before),
        ms(percentile(&latencies, 50)),
        ms(p99),
        ms(percentile(&latencies, 100)),
    );
    ensure!(
        first_base == Some(0) && first_bytes >= PARTITION_BYTES,
        "first response with records: {first_bytes} bytes, after {empty_before} empty"
    );
    ensure!(
        hwm_stalled < hwm_before + STALLED_HWM_GROWTH_KIB_MAX,
        "VmHWM {hwm_before} -> {hwm_stalled} KiB with {STALLED_CONNECTIONS} stalled connections \
         (budget {RESPONSE_BUFFER_BYTES})"
    );
    let p99_max = CANARY_P99_MAX.max(p99_alone * CANARY_P99_RATIO_MAX);
    ensure!(
        p99 <= p99_max,
        "canary p99 {p99:?} > {p99_max:?} (alone {p99_alone:?})"
    );
    ensure!(
        rss_after < rss_before + RSS_AFTER_GROWTH_KIB_MAX,
        "RSS {rss_before} -> {rss_after} KiB after the stalled connections closed"
    );
    Ok(())
}

/// Produces `CANARY_PRODUCES` small batches one at a time (acks=1); their latencies.
fn canary_latencies(canary: &mut RawConn, batch: &Bytes) -> Result<Vec<Duration>> {
    let mut latencies = Vec::with_capacity(CANARY_PRODUCES);
    for i in 0..CANARY_PRODUCES {
        let started = Instant::now();
        let (error, _) = canary.produce(CANARY_TOPIC, 0, 1, batch.clone())?;
        latencies.push(started.elapsed());
        ensure!(error == 0, "canary produce {i}: error {error}");
        thread::sleep(CANARY_GAP);
    }
    Ok(latencies)
}

/// The `p`-th percentile (nearest rank) of `samples`.
fn percentile(samples: &[Duration], p: usize) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = (sorted.len() * p)
        .div_ceil(100)
        .clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// RSS once it is below `target_kib` (the broker writes out or drops what the closed
/// connections held, then trims its heap), or its value after 20 s.
fn settled_rss_kib(weir: &Weir, target_kib: u64) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rss = weir.rss_kib()?;
        if rss < target_kib || Instant::now() > deadline {
            return Ok(rss);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// How long the other consumer keeps fetching while one client has pipelined 16 cold
/// fetches it never reads (16 MiB each: four times the test's budget). Long enough for the stalled fetches to fill the budget on a loaded
/// machine (they did within about a second before the turns), bounded in attempts too.
const STARVE_PROBE: Duration = Duration::from_secs(8);
const STARVE_ATTEMPTS_MAX: usize = 400;

/// One client that pipelines Fetches and never reads the answers holds one response's
/// budget at a time (a connection's Fetches take turns), so another consumer on the same
/// shard keeps getting records. Before the turns, the stalled client's fetches held the
/// whole budget and the other consumer's fetches were answered empty after max_wait.
#[test]
fn a_client_that_does_not_read_its_fetches_cannot_starve_another_consumer() -> Result<()> {
    // 64 MiB of budget: four 16 MiB responses of the stalled client fill it (but for
    // scraps smaller than the consumer's 8 MiB), one leaves room.
    let config = WeirConfig::shards(1).set("fetch.response.buffer.max.bytes", 64 << 20);
    let weir = cold_node(config)?;
    let mut stalled = RawConn::connect_timeout(weir.addr(), IO_TIMEOUT)?;
    let greedy = fetch_request(COLD_TOPIC, &[0], 16 << 20);
    for _ in 0..FETCHES_PER_CONNECTION {
        stalled.send(ApiKey::Fetch, 4, &greedy)?;
    }
    let mut consumer = RawConn::connect_timeout(weir.addr(), IO_TIMEOUT)?;
    let modest = fetch_request(COLD_TOPIC, &[0], 8 << 20);
    let (mut attempts, mut empty) = (0, 0);
    let started = Instant::now();
    while started.elapsed() < STARVE_PROBE && attempts < STARVE_ATTEMPTS_MAX {
        let (_, bytes, _) = answered(&consumer.call(ApiKey::Fetch, 4, &modest)?)?;
        attempts += 1;
        if bytes == 0 {
            empty += 1;
        }
    }
    eprintln!("MEASURE starve attempts={attempts} answered_empty={empty}");
    ensure!(
        empty == 0,
        "{empty} of {attempts} fetches answered without records while another client stalled"
    );
    // The stalled client's responses are still whole and in order once it reads.
    for correlation_id in 1..=2 {
        let resp: FetchResponse = stalled.recv(ApiKey::Fetch, 4, correlation_id)?;
        let (_, bytes, base) = answered(&resp)?;
        ensure!(base == Some(0) && bytes >= 8 << 20, "{bytes} bytes");
    }
    Ok(())
}
