//! A topic's `compression.type` with librdkafka against a real weir: an idempotent
//! producer's batches reach topics set to zstd, lz4, uncompressed and producer; a raw
//! fetch shows every stored batch in the topic's codec (the producer's for `producer`)
//! with the producer's id and contiguous sequences, and a consumer reads every record
//! back with its key, value, headers and timestamp.

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use weir_tests::clients::{self, Sent};
use weir_tests::raw::RawConn;
use weir_tests::{Weir, WeirConfig};
use wire::batch::{BatchHeader, Compression, read_header, split_batches};

const RECORDS: u64 = 3000;

/// (topic, its `compression.type`, the producer's codec, the codec stored batches have).
const CASES: [(&str, &str, &str, Compression); 4] = [
    ("ct-zstd", "zstd", "none", Compression::Zstd),
    ("ct-lz4", "lz4", "none", Compression::Lz4),
    ("ct-uncompressed", "uncompressed", "gzip", Compression::None),
    ("ct-producer", "producer", "snappy", Compression::Snappy),
];

#[test]
fn batches_are_stored_in_the_topics_codec_and_read_back_whole() -> Result<()> {
    let mut weir = Weir::start(WeirConfig::shards(2))?;
    let bootstrap = weir.bootstrap();
    for (i, (topic, topic_codec, producer_codec, stored)) in CASES.iter().enumerate() {
        clients::create_topics(
            &bootstrap,
            &[topic],
            1,
            &[("compression.type", topic_codec)],
        )?;
        let first_id = i as u64 * RECORDS;
        let mut records = clients::make_records(first_id, RECORDS, topic, clients::now_ms());
        // Values that compress in any batch: librdkafka sends a batch uncompressed when
        // its codec would make it bigger, which would prove nothing here.
        for r in &mut records {
            r.value = format!("record {} of {topic} ", r.id)
                .repeat(8)
                .into_bytes();
        }
        let idempotent = [("enable.idempotence", "true"), ("linger.ms", "20")];
        let (producer, log) = clients::producer(&bootstrap, "all", producer_codec, &idempotent)?;
        clients::produce_all(&producer, topic, &records, Some(0))?;
        ensure!(log.failed().is_empty(), "{topic}: {:?}", &log.failed()[..1]);
        ensure!(log.acked().len() == records.len(), "{topic}: not all acked");

        let batches = stored_batches(&weir, topic)?;
        check_batches(topic, &batches, *stored, RECORDS)?;
        check_read_back(&bootstrap, topic, &records, &log.acked())
            .map_err(|e| e.context(weir.log_tail(20)))?;
    }
    ensure!(weir.terminate()?.success());
    Ok(())
}

/// Every stored batch in `codec`, from one idempotent producer (one id and epoch,
/// sequences following on from batch to batch), holding `records` records in all.
fn check_batches(topic: &str, batches: &[Bytes], codec: Compression, records: u64) -> Result<()> {
    ensure!(!batches.is_empty(), "{topic}: nothing stored");
    let headers: Vec<BatchHeader> = batches
        .iter()
        .map(|b| read_header(b).copied())
        .collect::<Result<_, _>>()?;
    let first = headers[0];
    ensure!(first.producer_id().0 >= 0, "{topic}: no producer id");
    let mut next_sequence = 0;
    let mut count = 0u64;
    for h in &headers {
        let got = h.attributes().compression();
        ensure!(
            got == Some(codec),
            "{topic}: a batch in {got:?}, not {codec:?}"
        );
        ensure!(
            h.producer_id() == first.producer_id(),
            "{topic}: producer id"
        );
        ensure!(
            h.producer_epoch() == first.producer_epoch(),
            "{topic}: epoch"
        );
        ensure!(
            h.base_sequence().0 == next_sequence,
            "{topic}: sequence {} where {next_sequence} was next",
            h.base_sequence().0
        );
        next_sequence += h.records_count();
        count += u64::try_from(h.records_count())?;
    }
    ensure!(
        count == records,
        "{topic}: {count} records stored of {records}"
    );
    Ok(())
}

/// A consumer reads back every record with its key, value, headers and timestamp, at the
/// offset its producer was told.
fn check_read_back(
    bootstrap: &str,
    topic: &str,
    sent: &[Sent],
    acked: &[clients::Acked],
) -> Result<()> {
    let got = clients::consume_exact(bootstrap, topic, &[0], sent.len())?;
    ensure!(got.len() == sent.len(), "{topic}: read {}", got.len());
    let checked = clients::verify(sent, acked, &got)?;
    ensure!(checked == sent.len(), "{topic}: {checked} checked");
    Ok(())
}

/// Every batch of partition 0 of `topic`, fetched raw (Fetch v11, up to 16 MiB).
fn stored_batches(weir: &Weir, topic: &str) -> Result<Vec<Bytes>> {
    const FETCH_BYTES_MAX: i32 = 16 << 20;
    let mut conn = RawConn::connect(weir.addr())?;
    let part = FetchPartition::default()
        .with_partition(0)
        .with_fetch_offset(0)
        .with_partition_max_bytes(FETCH_BYTES_MAX);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(FETCH_BYTES_MAX)
        .with_session_epoch(-1)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![part]),
        ]);
    let resp: FetchResponse = conn.call(ApiKey::Fetch, 11, &req)?;
    let p = resp
        .responses
        .first()
        .and_then(|t| t.partitions.first())
        .context("empty fetch response")?;
    ensure!(p.error_code == 0, "fetch {topic}: error {}", p.error_code);
    let records = p.records.clone().unwrap_or_default();
    let mut out = Vec::new();
    for range in split_batches(&records) {
        out.push(records.slice(range.context("a stored batch that does not validate")?));
    }
    ensure!(
        out.iter().map(|b| b.len()).sum::<usize>() == records.len(),
        "{topic}: the fetch answer was cut (raise FETCH_BYTES_MAX)"
    );
    Ok(out)
}
