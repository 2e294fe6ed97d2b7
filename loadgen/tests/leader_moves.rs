//! The consumer and the lag sampler against a fake two-node cluster whose partition moved:
//! node 0 (the leader in the layout they start with) answers NOT_LEADER_OR_FOLLOWER, and
//! Metadata names node 1, which serves the records. They must ask for metadata again
//! (backing off) and follow the leader, and a lag sample the old leader refused must be an
//! error, never a lag of 0.

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

mod fake;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fake::{Fake, Req, api_versions, metadata};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{
    FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use weir_loadgen::client::consumer::{
    Consumer, ConsumerConfig, LagSampler, NoRecordSink, Positions, StartAt, Until, sample_lag,
};
use weir_loadgen::stats::{Clock, Recorder};
use wire::batch::{BatchBuilder, NewRecord};
use wire::{Offset, api};

const TOPIC: &str = "moved";
/// NOT_LEADER_OR_FOLLOWER.
const NOT_LEADER: i16 = 6;
/// Records node 1 holds.
const RECORDS: i64 = 10;
/// The log end node 1 reports to ListOffsets.
const LOG_END: i64 = 100;

#[derive(Default)]
struct Counts {
    fetch_old: AtomicU64,
    metadata: AtomicU64,
}

fn batch() -> Bytes {
    let records = (0..RECORDS)
        .map(|_| NewRecord::value(0, Bytes::from_static(b"v")))
        .collect();
    BatchBuilder {
        base_offset: Offset(0),
        records,
        ..BatchBuilder::default()
    }
    .build()
    .unwrap()
}

fn fetch(req: &Req, counts: &Counts) -> FetchResponse {
    let r: FetchRequest = req.decode();
    let offset = r.topics[0].partitions[0].fetch_offset;
    let mut pd = PartitionData::default()
        .with_partition_index(0)
        .with_high_watermark(RECORDS)
        .with_last_stable_offset(RECORDS);
    if req.node == 0 {
        counts.fetch_old.fetch_add(1, Ordering::SeqCst);
        pd = pd.with_error_code(NOT_LEADER).with_high_watermark(-1);
    } else if offset < RECORDS {
        pd = pd.with_records(Some(batch()));
    } else {
        // Caught up: what a broker answers after max_wait with nothing new.
        std::thread::sleep(Duration::from_millis(20));
        pd = pd.with_records(Some(Bytes::new()));
    }
    FetchResponse::default().with_responses(vec![
        FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(vec![pd]),
    ])
}

fn list_offsets(req: &Req) -> ListOffsetsResponse {
    let _: ListOffsetsRequest = req.decode();
    let p = if req.node == 0 {
        ListOffsetsPartitionResponse::default()
            .with_error_code(NOT_LEADER)
            .with_offset(-1)
    } else {
        ListOffsetsPartitionResponse::default().with_offset(LOG_END)
    };
    ListOffsetsResponse::default().with_topics(vec![
        ListOffsetsTopicResponse::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(vec![p]),
    ])
}

/// Two nodes; the partition is led by node 1 (whatever the client thinks).
fn moved_cluster(counts: Arc<Counts>) -> Fake {
    cluster_led_by(1, counts)
}

/// Two nodes; Metadata names node `leader` as the partition's leader (node 0 refuses).
fn cluster_led_by(leader: i32, counts: Arc<Counts>) -> Fake {
    Fake::start(
        2,
        Arc::new(move |req: &Req| match req.api_key {
            api::API_VERSIONS => req.answer(&api_versions(&[
                (api::FETCH, 4, 12),
                (api::LIST_OFFSETS, 1, 7),
                (api::METADATA, 1, 12),
                (api::API_VERSIONS, 0, 3),
            ])),
            api::METADATA => {
                counts.metadata.fetch_add(1, Ordering::SeqCst);
                req.answer(&metadata(&req.ports, TOPIC, &[leader]))
            }
            api::FETCH => req.answer(&fetch(req, &counts)),
            api::LIST_OFFSETS => req.answer(&list_offsets(req)),
            _ => None,
        }),
    )
}

#[test]
fn a_consumer_follows_a_moved_leader_and_backs_off() {
    let counts = Arc::new(Counts::default());
    let fake = moved_cluster(counts.clone());
    let positions = Positions::new(1);
    positions.0[0].store(0, Ordering::SeqCst);
    let recorder = Arc::new(Recorder::new(0));
    let cfg = ConsumerConfig {
        topic: TOPIC.to_string(),
        start: StartAt::Earliest,
        max_wait_ms: 100,
        fetch_max_bytes: 1 << 20,
        partition_max_bytes: 1 << 20,
        group: None,
        max_records_per_sec: None,
        read_committed: false,
        reset_out_of_range: true,
    };
    let c = Consumer::new(
        cfg,
        fake.cluster(&[0]),
        vec![0],
        positions.clone(),
        Clock::start(),
        recorder.clone(),
        Arc::new(NoRecordSink),
        1,
    );
    let started = Instant::now();
    let until = Until {
        records: Some(RECORDS as u64),
        consumed: Arc::default(),
        deadline: Instant::now() + Duration::from_secs(10),
        run_for: None,
        idle: None,
        reach: BTreeMap::new(),
    };
    let consumed = c.run(until, &AtomicBool::new(false));
    let elapsed = started.elapsed();
    let old = counts.fetch_old.load(Ordering::SeqCst);
    let refreshes = counts.metadata.load(Ordering::SeqCst);
    assert_eq!(
        consumed, RECORDS as u64,
        "consumed {consumed} in {elapsed:?}; {old} fetches to the old leader, {refreshes} metadata requests"
    );
    assert_eq!(positions.get(0), Some(RECORDS));
    assert!(refreshes >= 1, "never asked for metadata");
    // A refused fetch is retried after a refresh, not in a tight loop.
    assert!(old <= 5, "{old} fetches to the old leader in {elapsed:?}");
    let errors = recorder.summary(1).errors;
    assert!(errors.contains_key("NotLeaderOrFollower"), "{errors:?}");
}

#[test]
fn a_lag_sample_the_old_leader_refused_is_an_error_not_zero() {
    let fake = moved_cluster(Arc::default());
    let positions = Positions::new(1);
    positions.0[0].store(40, Ordering::SeqCst);
    let mut conns = BTreeMap::new();
    let lag = sample_lag(&mut conns, &fake.cluster(&[0]), TOPIC, &positions);
    assert!(lag.is_err(), "a refused partition was sampled as {lag:?}");
    let lag = sample_lag(&mut conns, &fake.cluster(&[1]), TOPIC, &positions);
    assert_eq!(lag.unwrap(), LOG_END - 40);
}

#[test]
fn the_lag_sampler_follows_a_moved_leader() {
    let counts = Arc::new(Counts::default());
    let fake = moved_cluster(counts.clone());
    let positions = Positions::new(1);
    positions.0[0].store(40, Ordering::SeqCst);
    let mut sampler = LagSampler::new(fake.cluster(&[0]), TOPIC);
    // Refused by the old leader, refreshed, sampled again from the new one.
    assert_eq!(sampler.sample(&positions).unwrap(), LOG_END - 40);
    assert_eq!(counts.metadata.load(Ordering::SeqCst), 1);
    assert_eq!(sampler.sample(&positions).unwrap(), LOG_END - 40);
    assert_eq!(
        counts.metadata.load(Ordering::SeqCst),
        1,
        "no refresh once healthy"
    );
}

/// verify's start offsets: a partition whose leader refused ListOffsets is asked again
/// at its new leader, never left out (it would never be read back).
#[test]
fn verify_start_offsets_follow_a_moved_leader() {
    let fake = moved_cluster(Arc::default());
    let starts =
        weir_loadgen::verify::start_offsets(TOPIC, &fake.cluster(&[0]), Duration::from_secs(10))
            .unwrap();
    assert_eq!(starts, BTreeMap::from([(0, LOG_END)]));
}

/// ... and a partition that never gets an offset fails the run, with why.
#[test]
fn verify_start_offsets_fail_when_a_partition_never_answers() {
    let fake = cluster_led_by(0, Arc::default());
    let started = Instant::now();
    let e =
        weir_loadgen::verify::start_offsets(TOPIC, &fake.cluster(&[0]), Duration::from_millis(500))
            .unwrap_err();
    let text = format!("{e:#}");
    assert!(text.contains("0 of 1 partitions"), "{text}");
    assert!(text.contains("NotLeaderOrFollower"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(10), "{text}");
}
