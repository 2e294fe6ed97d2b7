//! The Prometheus endpoint of a real `weir serve` (`metrics.listener`): requests per API
//! and version and their latency histogram, bytes and records in and out per topic, summed
//! over both shards, and per-shard gauges — scraped over HTTP as Prometheus would. Off by
//! default: without the key no metrics port is opened.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::requests::{create_topics, fetch_values};
use common::{Broker, Client, batch, metric_value as value, scrape_metrics as scrape};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn produce(c: &mut Client, partition: i32, values: &[&[u8]]) -> usize {
    let records = batch(values, 1);
    let len = records.len();
    let p = PartitionProduceData::default()
        .with_index(partition)
        .with_records(Some(records));
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s("metered")))
                .with_partition_data(vec![p]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 9, &req);
    assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
    len
}

#[test]
fn the_metrics_endpoint_counts_requests_and_topic_traffic_over_both_shards() {
    let broker = Broker::start(2, &[("metrics.listener", "127.0.0.1:0")]);
    assert!(broker.wait_log("metrics listening on", Duration::from_secs(30)));
    let addr = {
        let log = broker.log.lock().expect("log");
        let line = log
            .iter()
            .find(|l| l.contains("metrics listening on"))
            .expect("the line")
            .clone();
        line.rsplit(' ').next().expect("address").trim().to_string()
    };
    let mut c = broker.client();
    assert_eq!(create_topics(&mut c, &[("metered", 2)]), [0]);
    // Both partitions (one per shard), three batches, five records.
    let bytes = produce(&mut c, 0, &[b"a", b"b"])
        + produce(&mut c, 1, &[b"c"])
        + produce(&mut c, 1, &[b"d", b"e"]);
    let parts = (0..2)
        .map(|p| {
            FetchPartition::default()
                .with_partition(p)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)
        })
        .collect();
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(s("metered")))
                .with_partitions(parts),
        ]);
    let _: FetchResponse = c.call(api::FETCH, 12, &req);

    let text = scrape(&addr, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("text/plain; version=0.0.4"));
    let series = |s: &str| value(&text, s).unwrap_or_else(|| panic!("{s} missing in\n{text}"));
    assert_eq!(
        series(r#"weir_requests_total{api="Produce",version="9"}"#),
        3.0
    );
    assert_eq!(
        series(r#"weir_requests_total{api="Fetch",version="12"}"#),
        1.0
    );
    assert_eq!(
        series(r#"weir_request_duration_seconds_count{api="Produce"}"#),
        3.0
    );
    assert_eq!(
        series(r#"weir_request_duration_seconds_bucket{api="Produce",le="+Inf"}"#),
        3.0
    );
    assert_eq!(
        series(r#"weir_topic_bytes_in_total{topic="metered"}"#),
        bytes as f64
    );
    assert_eq!(
        series(r#"weir_topic_records_in_total{topic="metered"}"#),
        5.0
    );
    assert_eq!(
        series(r#"weir_topic_bytes_out_total{topic="metered"}"#),
        bytes as f64
    );
    assert_eq!(
        series(r#"weir_topic_records_out_total{topic="metered"}"#),
        5.0
    );
    assert!(text.contains("# TYPE weir_request_duration_seconds histogram"));
    assert!(text.contains(r#"weir_partitions_open{shard="1"}"#));
    assert!(scrape(&addr, "/other").starts_with("HTTP/1.1 404"));

    // A deleted topic's counters leave the scrape on both shards.
    let req = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(s("metered"))])
        .with_timeout_ms(30_000);
    let resp: DeleteTopicsResponse = c.call(api::DELETE_TOPICS, 4, &req);
    assert_eq!(resp.responses[0].error_code, 0, "DeleteTopics");
    let gone = |t: &str| !t.contains(r#"{topic="metered"}"#);
    scrape_until(&broker, &addr, &[("metered's series gone", &gone)]);
}

#[test]
fn without_the_key_there_is_no_metrics_port() {
    let broker = Broker::start(1, &[]);
    let _ = broker.client();
    assert!(!broker.log_contains("metrics listening on"));
}

/// The address the broker logged for its metrics endpoint.
fn metrics_addr(broker: &Broker) -> String {
    assert!(broker.wait_log("metrics listening on", Duration::from_secs(30)));
    let log = broker.log.lock().expect("log");
    let line = log
        .iter()
        .find(|l| l.contains("metrics listening on"))
        .expect("the line")
        .clone();
    line.rsplit(' ').next().expect("address").trim().to_string()
}

/// The sum of every series of `name` whose labels contain `labels` (all when empty).
fn total(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            let is_it = rest.is_empty() || rest.starts_with('{');
            (is_it && rest.contains(labels)).then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

/// A named condition on a scrape.
type Check<'a> = (&'a str, &'a dyn Fn(&str) -> bool);

/// Scrapes until every one of `checks` holds (housekeeping publishes gauges once a
/// second), bounded; a failure names the checks that did not hold and shows the broker's
/// log tail and threads.
fn scrape_until(broker: &Broker, addr: &str, checks: &[Check<'_>]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = scrape(addr, "/metrics");
        let missing: Vec<&str> = checks
            .iter()
            .filter(|(_, holds)| !holds(&text))
            .map(|(what, _)| *what)
            .collect();
        if missing.is_empty() {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not seen: {missing:?}\n--- broker log:\n{}\n--- scrape:\n{text}",
            broker.log_tail(60)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn produce_code(c: &mut Client, partition: i32, records: bytes::Bytes) -> i16 {
    let p = PartitionProduceData::default()
        .with_index(partition)
        .with_records(Some(records));
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s("metered")))
                .with_partition_data(vec![p]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 9, &req);
    resp.responses[0].partition_responses[0].error_code
}

/// An idempotent batch of `count` records from (`pid`, `epoch`) at sequence `first`.
fn idempotent(pid: i64, epoch: i16, first: i32, count: i32) -> bytes::Bytes {
    use wire::batch::{BatchBuilder, NewRecord};
    let records = (0..count)
        .map(|i| NewRecord::value(1_700_000_000_000, format!("idem-{first}-{i}")))
        .collect();
    BatchBuilder {
        producer_id: wire::ProducerId(pid),
        producer_epoch: wire::ProducerEpoch(epoch),
        base_sequence: wire::Sequence(first),
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("a batch built from test data")
}

#[test]
fn storage_idempotence_groups_refusals_budgets_and_the_request_split_move_with_their_workload() {
    let broker = Broker::start(
        2,
        &[
            ("metrics.listener", "127.0.0.1:0"),
            ("log.flush.on.ack", "true"),
            ("max.connections.per.ip", "3"),
        ],
    );
    let addr = metrics_addr(&broker);
    let mut c = broker.client();
    assert_eq!(create_topics(&mut c, &[("metered", 2)]), [0]);
    let before = scrape(&addr, "/metrics");
    let delta = |after: &str, name: &str, labels: &str| {
        total(after, name, labels) - total(&before, name, labels)
    };

    // Three plain batches (acks=1), then an idempotent producer: a batch, its resend
    // (answered from the dedup window) and a gap (out of order): six Produce requests.
    let mut batch_bytes = produce(&mut c, 0, &[b"a", b"b"])
        + produce(&mut c, 1, &[b"c"])
        + produce(&mut c, 1, &[b"d", b"e"]);
    let init = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let init: InitProducerIdResponse = c.call(api::INIT_PRODUCER_ID, 4, &init);
    assert_eq!(init.error_code, 0);
    let (pid, epoch) = (init.producer_id.0, init.producer_epoch);
    let first = idempotent(pid, epoch, 0, 2);
    let gap = idempotent(pid, epoch, 5, 1);
    batch_bytes += 2 * first.len() + gap.len();
    assert_eq!(produce_code(&mut c, 0, first.clone()), 0);
    assert_eq!(produce_code(&mut c, 0, first), 0, "the resend is answered");
    assert_eq!(
        produce_code(&mut c, 0, gap),
        45,
        "OUT_OF_ORDER_SEQUENCE_NUMBER"
    );

    // A Fetch at the log end of partition 0 (4 records) waits its whole max_wait_ms.
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(300)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(s("metered")))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(4)
                        .with_partition_max_bytes(1 << 20),
                ]),
        ]);
    let _: FetchResponse = c.call(api::FETCH, 12, &req);

    // A simple consumer's commit: partition 1 holds 3 records, committed 1 → lag 2.
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(s("lagging")))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(s("metered")))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(1)
                        .with_committed_offset(1),
                ]),
        ]);
    let commit: OffsetCommitResponse = c.call(api::OFFSET_COMMIT, 8, &commit);
    assert_eq!(commit.topics[0].partitions[0].error_code, 0);

    // A frame announced as 1 MiB takes that from the request budget before its body.
    let mut stalled = TcpStream::connect(broker.addr()).expect("connect");
    stalled
        .write_all(&(1i32 << 20).to_be_bytes())
        .expect("size prefix");
    stalled.write_all(&[0u8; 16]).expect("first bytes");
    // Admitted before the three below connect: with SO_REUSEPORT each shard accepts on
    // its own, and a busy shard could otherwise admit two of them first and refuse this
    // one (the refusals are node-wide).
    scrape_until(
        &broker,
        &addr,
        &[("the stalled frame's budget", &|t| {
            total(t, "weir_request_budget_bytes", "") >= f64::from(1 << 20)
        })],
    );
    // `c` and `stalled` are two of max.connections.per.ip=3: of three more, two are refused.
    let extra: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(broker.addr()).expect("connect"))
        .collect();

    let lag = r#"weir_group_lag_records{group="lagging",topic="metered",partition="1"}"#;
    let after = scrape_until(
        &broker,
        &addr,
        &[
            ("group lag", &|t| value(t, lag).is_some()),
            ("two refusals", &|t| {
                total(
                    t,
                    "weir_connections_refused_total",
                    "max_connections_per_ip",
                ) >= 2.0
            }),
            ("the stalled frame's budget", &|t| {
                total(t, "weir_request_budget_bytes", "") >= f64::from(1 << 20)
            }),
            ("six produce sends", &|t| {
                total(t, "weir_request_send_seconds_count", "Produce") >= 6.0
            }),
        ],
    );
    let d = |name: &str, labels: &str| delta(&after, name, labels);
    assert_eq!(value(&after, lag), Some(2.0), "HW 3 − committed 1");
    assert_eq!(
        value(&after, r#"weir_group_state{group="lagging",state="Empty"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(&after, r#"weir_group_members{group="lagging"}"#),
        Some(0.0)
    );
    assert_eq!(d("weir_request_queue_seconds_count", "\"Produce\""), 6.0);
    assert_eq!(d("weir_request_send_seconds_count", "\"Produce\""), 6.0);
    assert_eq!(d("weir_request_queue_seconds_count", "\"Fetch\""), 1.0);
    assert_eq!(d("weir_produce_batch_size_bytes_count", ""), 6.0);
    assert_eq!(
        d("weir_produce_batch_size_bytes_sum", ""),
        batch_bytes as f64
    );
    assert_eq!(d("weir_producer_duplicates_total", ""), 1.0);
    assert_eq!(d("weir_producer_out_of_order_total", ""), 1.0);
    assert_eq!(d("weir_fetch_wait_seconds_count", ""), 1.0);
    assert!(
        d("weir_fetch_wait_seconds_sum", "") >= 0.25,
        "waited ~300 ms"
    );
    assert_eq!(
        d("weir_produce_replication_wait_seconds_count", ""),
        2.0,
        "the one acks=-1 append and the offset commit (the coordinator writes with acks=all); \
         the resend and the gap are not appended"
    );
    // Appends: 3 plain + 1 idempotent + the offset commit; each fdatasynced on ack.
    let appends = d("weir_storage_appends_total", "");
    assert!((5.0..=6.0).contains(&appends), "{appends} appends");
    assert!(d("weir_storage_fdatasyncs_total", "") >= 1.0);
    // A single node only writes what it assigned offsets to; writes may carry several
    // appends, never fewer than one.
    let writes = d("weir_storage_leader_writes_total", "");
    assert!((1.0..=appends).contains(&writes), "{writes} leader writes");
    assert_eq!(d("weir_storage_follower_writes_total", ""), 0.0);
    assert!(d("weir_storage_fsync_seconds_count", "") >= 1.0);
    let grouped = d("weir_storage_group_commit_appends_sum", "");
    assert!(
        (1.0..=appends).contains(&grouped),
        "{grouped} appends group-committed"
    );
    assert!(total(&after, "weir_open_segment_files", "") >= 2.0);
    assert_eq!(
        total(&after, "weir_request_budget_bytes", ""),
        f64::from(1 << 20)
    );
    drop((stalled, extra));
}

/// A client that trickles its request a byte at a time, each inside the old per-read
/// timeout, is cut at the whole-connection deadline: the next scrape is answered within
/// it, not after hours.
#[test]
fn a_trickling_scrape_does_not_hold_the_endpoint() {
    let broker = Broker::start(1, &[("metrics.listener", "127.0.0.1:0")]);
    let addr = metrics_addr(&broker);
    let mut slow = TcpStream::connect(&addr).expect("connect");
    let trickle = std::thread::spawn(move || {
        // 12 s of one byte every 2 s: never done, each read well inside 5 s.
        for b in b"GET /metr" {
            if slow.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let text = scrape(&addr, "/metrics");
    let took = started.elapsed();
    assert!(text.contains("weir_"), "a real scrape: {text}");
    // The 5 s deadline plus a loaded machine's margin; the trickle alone lasts 18 s (the
    // next scrape waited 17.7 s before the fix).
    assert!(
        took < Duration::from_secs(12),
        "the next scrape waited {took:?}"
    );
    trickle.join().expect("trickle");
}

/// Recent batches stay in memory within the shard's share of `log.tail.cache.max.bytes`,
/// whichever partitions they belong to; what left is read back from the segment files,
/// so every record comes back either way.
#[test]
fn recent_batches_are_cached_within_the_nodes_bound_and_the_rest_read_from_disk() {
    const BOUND: u64 = 1 << 20;
    let bound = BOUND.to_string();
    let broker = Broker::start(
        1,
        &[
            ("metrics.listener", "127.0.0.1:0"),
            ("log.tail.cache.max.bytes", &bound),
        ],
    );
    let addr = metrics_addr(&broker);
    let mut c = broker.client();
    assert_eq!(create_topics(&mut c, &[("metered", 2)]), [0]);
    // 3 MiB in 48 batches of 16 records of 4 KiB over two partitions: three times the bound.
    let value = |p: i32, b: usize, r: usize| {
        let mut v = format!("p{p}-b{b}-r{r}-").into_bytes();
        v.resize(4096, b'x');
        v
    };
    let mut produced = 0usize;
    for b in 0..24 {
        for p in 0..2 {
            let values: Vec<Vec<u8>> = (0..16).map(|r| value(p, b, r)).collect();
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            produced += produce(&mut c, p, &refs);
        }
    }
    assert!(produced as u64 > 3 * BOUND);
    let held = |t: &str| total(t, "weir_log_tail_cache_bytes", "") as u64;
    let within = |t: &str| (BOUND / 2..=BOUND).contains(&held(t));
    let text = scrape_until(
        &broker,
        &addr,
        &[("the cache full, within its bound", &within)],
    );
    assert!(
        text.contains("# TYPE weir_log_tail_cache_bytes gauge"),
        "{text}"
    );
    for (p, values) in fetch_values(&mut c, "metered", &[0, 1]) {
        assert_eq!(values.len(), 24 * 16, "partition {p}");
        for (i, v) in values.iter().enumerate() {
            assert_eq!(v, &value(p, i / 16, i % 16), "partition {p}, offset {i}");
        }
    }
}
