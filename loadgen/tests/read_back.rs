//! The consumer as `verify`'s read-back uses it, against a fake one-node cluster: it reads
//! on until every partition has passed the acknowledged end however long the broker holds
//! the records back (the idle rule applies only after that), and at OFFSET_OUT_OF_RANGE it
//! stops reading the partition instead of jumping to the log start.

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

mod fake;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fake::{Fake, Req, api_versions, metadata};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ListOffsetsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use weir_loadgen::client::consumer::{
    Consumer, ConsumerConfig, NoRecordSink, Positions, StartAt, Until,
};
use weir_loadgen::stats::{Clock, Recorder};
use wire::batch::{BatchBuilder, NewRecord};
use wire::{Offset, api};

const TOPIC: &str = "read-back";
const RECORDS: i64 = 10;
/// How long the fake answers fetches with nothing before it hands the records out.
const HOLD: Duration = Duration::from_millis(1500);
/// The idle rule of the consumers under test: far shorter than HOLD.
const IDLE: Duration = Duration::from_millis(200);
/// OFFSET_OUT_OF_RANGE.
const OUT_OF_RANGE: i16 = 1;

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

fn fetch_answer(pd: PartitionData) -> FetchResponse {
    FetchResponse::default().with_responses(vec![
        FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(vec![pd.with_partition_index(0)]),
    ])
}

/// One node leading partition 0; `fetch` answers Fetch; ListOffsets are counted.
fn one_node(
    fetch: impl Fn(&FetchRequest) -> FetchResponse + Send + Sync + 'static,
    list_offsets: Arc<AtomicU64>,
) -> Fake {
    Fake::start(
        1,
        Arc::new(move |req: &Req| match req.api_key {
            api::API_VERSIONS => req.answer(&api_versions(&[
                (api::FETCH, 4, 12),
                (api::LIST_OFFSETS, 1, 7),
                (api::METADATA, 1, 12),
                (api::API_VERSIONS, 0, 3),
            ])),
            api::METADATA => req.answer(&metadata(&req.ports, TOPIC, &[0])),
            api::FETCH => req.answer(&fetch(&req.decode())),
            api::LIST_OFFSETS => {
                list_offsets.fetch_add(1, Ordering::SeqCst);
                let p = ListOffsetsPartitionResponse::default().with_offset(0);
                req.answer(&ListOffsetsResponse::default().with_topics(vec![
                    ListOffsetsTopicResponse::default()
                        .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                        .with_partitions(vec![p]),
                ]))
            }
            _ => None,
        }),
    )
}

/// A read-back consumer of partition 0 from offset 0 that must reach `RECORDS`.
fn read_back(fake: &Fake, recorder: Arc<Recorder>, positions: Arc<Positions>) -> u64 {
    positions.0[0].store(0, Ordering::SeqCst);
    let cfg = ConsumerConfig {
        topic: TOPIC.to_string(),
        start: StartAt::Earliest,
        max_wait_ms: 20,
        fetch_max_bytes: 1 << 20,
        partition_max_bytes: 1 << 20,
        group: None,
        max_records_per_sec: None,
        read_committed: false,
        reset_out_of_range: false,
    };
    let c = Consumer::new(
        cfg,
        fake.cluster(&[0]),
        vec![0],
        positions,
        Clock::start(),
        recorder,
        Arc::new(NoRecordSink),
        1,
    );
    let until = Until {
        records: None,
        consumed: Arc::default(),
        deadline: Instant::now() + Duration::from_secs(10),
        run_for: None,
        idle: Some(IDLE),
        reach: BTreeMap::from([(0, RECORDS)]),
    };
    c.run(until, &AtomicBool::new(false))
}

#[test]
fn the_read_back_waits_past_idle_spells_until_the_acknowledged_end() {
    let first_fetch: Mutex<Option<Instant>> = Mutex::new(None);
    let fake = one_node(
        move |r| {
            let at = *first_fetch.lock().unwrap().get_or_insert_with(Instant::now);
            let offset = r.topics[0].partitions[0].fetch_offset;
            let pd = PartitionData::default().with_high_watermark(RECORDS);
            if at.elapsed() < HOLD || offset >= RECORDS {
                // Nothing (yet): what a broker answers after max_wait.
                std::thread::sleep(Duration::from_millis(20));
                fetch_answer(pd.with_records(Some(Bytes::new())))
            } else {
                fetch_answer(pd.with_records(Some(batch())))
            }
        },
        Arc::default(),
    );
    let positions = Positions::new(1);
    let started = Instant::now();
    let consumed = read_back(&fake, Arc::new(Recorder::new(0)), positions.clone());
    assert_eq!(consumed, RECORDS as u64, "after {:?}", started.elapsed());
    assert_eq!(positions.get(0), Some(RECORDS));
}

#[test]
fn the_read_back_stops_a_partition_out_of_range_instead_of_resetting_it() {
    let list_offsets = Arc::new(AtomicU64::new(0));
    let fake = one_node(
        |_| {
            fetch_answer(
                PartitionData::default()
                    .with_error_code(OUT_OF_RANGE)
                    .with_high_watermark(-1),
            )
        },
        list_offsets.clone(),
    );
    let positions = Positions::new(1);
    let recorder = Arc::new(Recorder::new(0));
    let started = Instant::now();
    let consumed = read_back(&fake, recorder.clone(), positions.clone());
    assert_eq!(consumed, 0);
    assert_eq!(positions.get(0), None, "given up, not reset");
    assert_eq!(
        list_offsets.load(Ordering::SeqCst),
        0,
        "no reset to earliest"
    );
    let errors = recorder.summary(1).errors;
    assert!(errors.contains_key("OffsetOutOfRange"), "{errors:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "ended by the idle rule, not the deadline: {:?}",
        started.elapsed()
    );
}
