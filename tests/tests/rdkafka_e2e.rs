//! librdkafka against a real weir: an 8-partition topic made with CreateTopics, 200,000
//! records with keys, headers and explicit timestamps produced at acks=all with every
//! compression codec, read back and compared record by record; metadata, watermarks and
//! ListOffsets by timestamp checked against what was produced.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use kafka_protocol::records::Compression;
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use weir_tests::clients::{self, Acked, Sent};
use weir_tests::disk;
use weir_tests::raw::{self, RawConn};
use weir_tests::{Weir, WeirConfig};

const TOPIC: &str = "e2e-codecs";
const PARTITIONS: i32 = 8;
const CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];
const RECORDS_PER_CODEC: u64 = 40_000;

#[test]
fn produce_consume_200k_records_every_codec_acks_all() -> Result<()> {
    let mut weir = Weir::start(WeirConfig::shards(2))?;
    let bootstrap = weir.bootstrap();
    clients::create_topics(&bootstrap, &[TOPIC], PARTITIONS, &[])?;
    ensure!(clients::partition_count(&bootstrap, TOPIC)? == PARTITIONS as usize);

    // Timestamps an hour in the past, one millisecond apart, increasing with the id.
    let base_ts_ms = clients::now_ms() - 3_600_000;
    let mut sent: Vec<Sent> = Vec::new();
    let mut acked: Vec<Acked> = Vec::new();
    for (i, codec) in CODECS.iter().enumerate() {
        let first_id = i as u64 * RECORDS_PER_CODEC;
        let records = clients::make_records(
            first_id,
            RECORDS_PER_CODEC,
            codec,
            base_ts_ms + first_id as i64,
        );
        let (producer, log) = clients::producer(&bootstrap, "all", codec, &[])?;
        clients::produce_all(&producer, TOPIC, &records, None)?;
        ensure!(
            log.failed().is_empty(),
            "{codec}: failed deliveries {:?}",
            &log.failed()[..3.min(log.failed().len())]
        );
        ensure!(
            log.acked().len() == records.len(),
            "{codec}: {} of {} acked",
            log.acked().len(),
            records.len()
        );
        acked.extend(log.acked());
        sent.extend(records);
    }

    let all: Vec<i32> = (0..PARTITIONS).collect();
    let got = clients::consume_exact(&bootstrap, TOPIC, &all, sent.len())?;
    ensure!(
        got.len() == sent.len(),
        "read {} records, produced {}",
        got.len(),
        sent.len()
    );
    let checked = clients::verify(&sent, &acked, &got).map_err(|e| e.context(weir.log_tail(20)))?;
    ensure!(checked == 200_000);

    let per_partition = count_per_partition(&acked);
    ensure!(
        per_partition.len() == PARTITIONS as usize,
        "keys reached only partitions {per_partition:?}"
    );
    check_metadata_and_watermarks(&weir, &per_partition)?;
    check_offsets_for_times(&bootstrap, TOPIC, PARTITIONS, &sent, &acked, true)?;

    // The codecs really reached the log (librdkafka silently sends uncompressed batches
    // when it believes the broker lacks a codec).
    let status = weir.terminate()?;
    ensure!(status.success(), "SIGTERM exit status {status}");
    let codecs = disk::batches_by_codec(weir.data_dir(), TOPIC)?;
    for (codec, name) in [
        (0, "none"),
        (1, "gzip"),
        (2, "snappy"),
        (3, "lz4"),
        (4, "zstd"),
    ] {
        ensure!(
            codecs.get(&codec).is_some_and(|n| *n > 0),
            "no {name} batch on disk: {codecs:?}"
        );
    }
    Ok(())
}

/// librdkafka compresses with LZ4 only for a broker that advertises FindCoordinator
/// (its proxy for "supports LZ4"); otherwise it quietly sends uncompressed batches. Every
/// batch on disk must be LZ4.
#[test]
fn librdkafka_sends_lz4_compressed_batches() -> Result<()> {
    let mut weir = Weir::start(WeirConfig::shards(1))?;
    let bootstrap = weir.bootstrap();
    clients::create_topics(&bootstrap, &["lz4"], 1, &[])?;
    // librdkafka sends a batch uncompressed when LZ4 would make it bigger (a lone record
    // of the default test values, under linger), so these values compress in any batch.
    let mut records = clients::make_records(0, 2000, "lz4", clients::now_ms());
    for r in &mut records {
        r.value = format!("lz4 record {} ", r.id).repeat(16).into_bytes();
    }
    let (producer, log) = clients::producer(&bootstrap, "all", "lz4", &[])?;
    clients::produce_all(&producer, "lz4", &records, None)?;
    ensure!(log.acked().len() == records.len());
    ensure!(weir.terminate()?.success());
    let codecs = disk::batches_by_codec(weir.data_dir(), "lz4")?;
    ensure!(
        codecs.keys().all(|c| *c == 3) && !codecs.is_empty(),
        "batches by codec on disk: {codecs:?}"
    );
    Ok(())
}

/// LZ4 batches written by a raw client (kafka-protocol's LZ4 frames, not librdkafka's)
/// are stored as sent and served to a librdkafka consumer, which checks their CRCs and
/// decompresses them.
#[test]
fn lz4_batches_are_stored_and_served() -> Result<()> {
    let mut weir = Weir::start(WeirConfig::shards(2))?;
    let bootstrap = weir.bootstrap();
    clients::create_topics(&bootstrap, &["lz4-raw"], 1, &[])?;
    let mut conn = RawConn::connect(weir.addr())?;
    let mut values = Vec::new();
    for b in 0..20 {
        let batch_values: Vec<Vec<u8>> = (0..50)
            .map(|i| format!("lz4 value {b}-{i} {}", "x".repeat(i * 10)).into_bytes())
            .collect();
        let batch = raw::record_batch(&batch_values, Compression::Lz4)?;
        let (code, base) = conn.produce("lz4-raw", 0, -1, batch)?;
        ensure!(
            code == 0 && base == values.len() as i64,
            "batch {b}: error {code}, base {base}"
        );
        values.extend(batch_values);
    }
    let got = clients::consume_to_end(&bootstrap, "lz4-raw", &[0])?;
    ensure!(
        got.len() == values.len(),
        "read {} of {}",
        got.len(),
        values.len()
    );
    for (i, (g, v)) in got.iter().zip(&values).enumerate() {
        ensure!(
            g.offset == i as i64 && g.value.as_deref() == Some(&v[..]),
            "record {i} differs"
        );
    }
    ensure!(weir.terminate()?.success());
    let codecs = disk::batches_by_codec(weir.data_dir(), "lz4-raw")?;
    ensure!(
        codecs.get(&3).is_some_and(|n| *n > 0),
        "no lz4 batch on disk: {codecs:?}"
    );
    Ok(())
}

fn count_per_partition(acked: &[Acked]) -> BTreeMap<i32, i64> {
    let mut m = BTreeMap::new();
    for a in acked {
        *m.entry(a.partition).or_insert(0) += 1;
    }
    m
}

/// One broker (this one, at its real port), 8 partitions led by it, and each partition's
/// watermarks 0..count.
fn check_metadata_and_watermarks(weir: &Weir, per_partition: &BTreeMap<i32, i64>) -> Result<()> {
    let bootstrap = weir.bootstrap();
    let c = clients::consumer(&bootstrap, &[])?;
    let md = c.fetch_metadata(Some(TOPIC), Duration::from_secs(10))?;
    ensure!(md.brokers().len() == 1, "brokers: {}", md.brokers().len());
    let broker = &md.brokers()[0];
    ensure!(
        broker.host() == "127.0.0.1",
        "advertised host {}",
        broker.host()
    );
    ensure!(
        broker.port() == i32::from(weir.addr().port()),
        "advertised port {}",
        broker.port()
    );
    let topic = md.topics().iter().find(|t| t.name() == TOPIC);
    let Some(topic) = topic else {
        anyhow::bail!("{TOPIC} missing from metadata")
    };
    ensure!(topic.partitions().len() == PARTITIONS as usize);
    for p in topic.partitions() {
        ensure!(
            p.leader() == broker.id(),
            "partition {} led by {}",
            p.id(),
            p.leader()
        );
        ensure!(
            p.error().is_none(),
            "partition {} error {:?}",
            p.id(),
            p.error()
        );
    }
    for (&p, &count) in per_partition {
        let (low, high) = c.fetch_watermarks(TOPIC, p, Duration::from_secs(10))?;
        ensure!(
            (low, high) == (0, count),
            "partition {p}: watermarks {low}..{high}, expected 0..{count}"
        );
    }
    Ok(())
}

/// ListOffsets by timestamp. Kafka answers, per partition, the first offset whose record
/// timestamp is at or after the time (`End` if none). With `exact == false` this checks
/// only what a consumer seeking by time relies on: the answer is at or before that offset
/// and every record before the answer is older than the time (nothing newer is skipped).
fn check_offsets_for_times(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    sent: &[Sent],
    acked: &[Acked],
    exact: bool,
) -> Result<()> {
    let ts: BTreeMap<u64, i64> = sent.iter().map(|s| (s.id, s.timestamp_ms)).collect();
    let ts_at: BTreeMap<(i32, i64), i64> = acked
        .iter()
        .filter_map(|a| Some(((a.partition, a.offset), *ts.get(&a.id)?)))
        .collect();
    let first_ts = sent.iter().map(|s| s.timestamp_ms).min().unwrap_or(0);
    let last_ts = sent.iter().map(|s| s.timestamp_ms).max().unwrap_or(0);
    let span = last_ts - first_ts;
    let probes = [
        first_ts - 1000,
        first_ts + span / 3 + 7,
        first_ts + span * 2 / 3 + 1,
        last_ts,
        last_ts + 1000,
    ];
    let c = clients::consumer(bootstrap, &[])?;
    for probe in probes {
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Offset(probe))?;
        }
        let answer = c.offsets_for_times(tpl, Duration::from_secs(10))?;
        for p in 0..partitions {
            let want = ts_at
                .iter()
                .filter(|((q, _), t)| *q == p && **t >= probe)
                .map(|((_, o), _)| *o)
                .min();
            let got = answer.find_partition(topic, p).map(|e| e.offset());
            let at = format!(
                "{topic}/{p}, time {probe}: answer {got:?}, first offset at or after it {want:?}"
            );
            match (got, want) {
                (Some(Offset::End), None) => {}
                (Some(Offset::Offset(g)), Some(w)) if g == w => {}
                (Some(Offset::Offset(g)), Some(w)) if !exact && g < w => {
                    // Batch-granular answer: everything it makes the consumer re-read
                    // must be older than the time.
                    let newer = ts_at.range((p, g)..(p, w)).find(|(_, t)| **t >= probe);
                    ensure!(
                        newer.is_none(),
                        "{at}: records before the answer are newer: {newer:?}"
                    );
                    ensure!(
                        ts_at.contains_key(&(p, g)),
                        "{at}: answer is not a record offset"
                    );
                }
                _ => anyhow::bail!(
                    "{at} (timestamp of the answer {:?})",
                    got.and_then(|o| o.to_raw())
                        .and_then(|o| ts_at.get(&(p, o)))
                ),
            }
        }
    }
    Ok(())
}

/// Kafka's exact ListOffsets-by-time answer (the first *record* at or after the time),
/// probed inside large uncompressed and compressed batches of one partition.
#[test]
fn offsets_for_times_answers_the_exact_record() -> Result<()> {
    let weir = Weir::start(WeirConfig::shards(1))?;
    let bootstrap = weir.bootstrap();
    clients::create_topics(&bootstrap, &["by-time"], 2, &[])?;
    let (mut sent, mut acked) = (Vec::new(), Vec::new());
    for (i, codec) in ["none", "zstd"].iter().enumerate() {
        let first_id = i as u64 * 5000;
        let records = clients::make_records(
            first_id,
            5000,
            codec,
            clients::now_ms() - 60_000 + first_id as i64,
        );
        let (producer, log) = clients::producer(&bootstrap, "all", codec, &[("linger.ms", "50")])?;
        clients::produce_all(&producer, "by-time", &records, Some(i as i32))?;
        ensure!(log.acked().len() == records.len());
        acked.extend(log.acked());
        sent.extend(records);
    }
    check_offsets_for_times(&bootstrap, "by-time", 2, &sent, &acked, true)
}
