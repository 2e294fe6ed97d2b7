//! The Prometheus endpoint of a real `weir serve` (`metrics.listener`): requests per API
//! and version and their latency histogram, bytes and records in and out per topic, summed
//! over both shards, and per-shard gauges — scraped over HTTP as Prometheus would. Off by
//! default: without the key no metrics port is opened.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Broker, Client, batch};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn scrape(addr: &str, path: &str) -> String {
    let mut c = TcpStream::connect(addr).expect("connect to the metrics port");
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let mut out = String::new();
    c.read_to_string(&mut out).expect("read the answer");
    out
}

/// The value of the series named exactly `series` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
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
    let t = CreatableTopic::default()
        .with_name(TopicName(s("metered")))
        .with_num_partitions(2)
        .with_replication_factor(1);
    let resp: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default().with_topics(vec![t]),
    );
    assert_eq!(resp.topics[0].error_code, 0);
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
}

#[test]
fn without_the_key_there_is_no_metrics_port() {
    let broker = Broker::start(1, &[]);
    let _ = broker.client();
    assert!(!broker.log_contains("metrics listening on"));
}
