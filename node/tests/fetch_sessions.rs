//! KIP-227 incremental fetch sessions and KIP-516 topic ids, at the protocol level against
//! a real `weir serve`: a full fetch opens a session, incremental fetches answer only the
//! partitions that changed, forgotten partitions leave the session, a wrong epoch gets
//! INVALID_FETCH_SESSION_EPOCH (71), an unknown id FETCH_SESSION_ID_NOT_FOUND (70), a full
//! cache a sessionless answer (or an eviction, by Kafka's rule); topic ids are reported by
//! CreateTopics and Metadata, delete by id, and name topics in Fetch v13+ (an unknown id is
//! UNKNOWN_TOPIC_ID).

mod common;

use std::time::Duration;

use common::{Broker, Client, batch, metric_value as value, scrape_metrics as scrape};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;
use wire::api;

const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
const UNKNOWN_TOPIC_ID: i16 = 100;
const FETCH_SESSION_TOPIC_ID_ERROR: i16 = 106;

fn name(v: &str) -> TopicName {
    TopicName(StrBytes::from_string(v.to_string()))
}

fn create(c: &mut Client, topic: &str, partitions: i32) -> Uuid {
    let t = CreatableTopic::default()
        .with_name(name(topic))
        .with_num_partitions(partitions)
        .with_replication_factor(1);
    let resp: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default().with_topics(vec![t]),
    );
    assert_eq!(resp.topics[0].error_code, 0, "{:?}", resp.topics[0]);
    assert!(
        !resp.topics[0].topic_id.is_nil(),
        "CreateTopics v7 reports the id"
    );
    resp.topics[0].topic_id
}

fn produce(c: &mut Client, topic: &str, partition: i32, value: &[u8]) {
    let data = PartitionProduceData::default()
        .with_index(partition)
        .with_records(Some(batch(&[value], 1)));
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(name(topic))
                .with_partition_data(vec![data]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 9, &req);
    assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
}

fn part(p: i32, offset: i64) -> FetchPartition {
    FetchPartition::default()
        .with_partition(p)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(1 << 20)
}

/// A fetch of `topic` by name (v12) with session fields, not waiting.
fn fetch(session: i32, epoch: i32, topic: &str, parts: Vec<FetchPartition>) -> FetchRequest {
    let topics = if parts.is_empty() {
        Vec::new()
    } else {
        vec![
            FetchTopic::default()
                .with_topic(name(topic))
                .with_partitions(parts),
        ]
    };
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_session_id(session)
        .with_session_epoch(epoch)
        .with_topics(topics)
}

/// (partition, has records) of every partition in the response, in order.
fn answered(resp: &FetchResponse) -> Vec<(i32, bool)> {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| {
            (
                p.partition_index,
                p.records.as_ref().is_some_and(|r| !r.is_empty()),
            )
        })
        .collect()
}

#[test]
fn a_session_answers_only_changed_partitions_and_checks_its_epoch() {
    // Two shards: the session lives on the connection's shard, the partitions on both.
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    create(&mut c, "fs", 3);
    produce(&mut c, "fs", 0, b"a");
    produce(&mut c, "fs", 1, b"b");

    // Full fetch (epoch 0): every partition answered, a session id given.
    let all = vec![part(0, 0), part(1, 0), part(2, 0)];
    let full: FetchResponse = c.call(api::FETCH, 12, &fetch(0, 0, "fs", all));
    assert_eq!(full.error_code, 0);
    let id = full.session_id;
    assert_ne!(id, 0, "a session was created");
    assert_eq!(
        answered(&full),
        vec![(0, true), (1, true), (2, false)],
        "a full fetch answers every partition"
    );

    // Incremental (epoch 1): the client moves 0 and 1 past their records; nothing changed.
    let moved = vec![part(0, 1), part(1, 1)];
    let inc: FetchResponse = c.call(api::FETCH, 12, &fetch(id, 1, "fs", moved));
    assert_eq!((inc.error_code, inc.session_id), (0, id));
    assert_eq!(answered(&inc), vec![], "unchanged partitions are left out");

    // New data on partition 2 only: an empty incremental fetch answers just it.
    produce(&mut c, "fs", 2, b"c");
    let inc: FetchResponse = c.call(api::FETCH, 12, &fetch(id, 2, "fs", Vec::new()));
    assert_eq!((inc.error_code, inc.session_id), (0, id));
    assert_eq!(answered(&inc), vec![(2, true)]);

    // Forget partition 2: new data there is not answered any more.
    let mut forget = fetch(id, 3, "fs", Vec::new());
    forget.forgotten_topics_data = vec![
        ForgottenTopic::default()
            .with_topic(name("fs"))
            .with_partitions(vec![2]),
    ];
    let inc: FetchResponse = c.call(api::FETCH, 12, &forget);
    assert_eq!(inc.error_code, 0);
    assert_eq!(answered(&inc), vec![]);
    produce(&mut c, "fs", 2, b"d");
    produce(&mut c, "fs", 0, b"e");
    let inc: FetchResponse = c.call(api::FETCH, 12, &fetch(id, 4, "fs", Vec::new()));
    assert_eq!(answered(&inc), vec![(0, true)], "partition 2 was forgotten");

    // The same epoch again: INVALID_FETCH_SESSION_EPOCH, no partitions, session 0.
    let again: FetchResponse = c.call(api::FETCH, 12, &fetch(id, 4, "fs", Vec::new()));
    assert_eq!(again.error_code, INVALID_FETCH_SESSION_EPOCH);
    assert_eq!((again.session_id, answered(&again)), (0, vec![]));
    // An id the broker never gave: FETCH_SESSION_ID_NOT_FOUND.
    let unknown = fetch(id.wrapping_add(1), 1, "fs", Vec::new());
    let lost: FetchResponse = c.call(api::FETCH, 12, &unknown);
    assert_eq!(lost.error_code, FETCH_SESSION_ID_NOT_FOUND);
    assert_eq!((lost.session_id, answered(&lost)), (0, vec![]));
    // The session survived the refused requests: epoch 5 is still next.
    let inc: FetchResponse = c.call(api::FETCH, 12, &fetch(id, 5, "fs", Vec::new()));
    assert_eq!((inc.error_code, inc.session_id), (0, id));

    // Epoch -1 closes it and fetches sessionless: every named partition, session 0.
    let close = fetch(id, -1, "fs", vec![part(0, 0)]);
    let closed: FetchResponse = c.call(api::FETCH, 12, &close);
    assert_eq!((closed.error_code, closed.session_id), (0, 0));
    assert_eq!(answered(&closed), vec![(0, true)]);
    let gone: FetchResponse = c.call(api::FETCH, 12, &fetch(id, 6, "fs", Vec::new()));
    assert_eq!(gone.error_code, FETCH_SESSION_ID_NOT_FOUND);
}

#[test]
fn a_full_cache_answers_sessionless_and_a_bigger_session_evicts() {
    let broker = Broker::start(
        1,
        &[
            ("max.incremental.fetch.session.cache.slots", "1"),
            ("metrics.listener", "127.0.0.1:0"),
        ],
    );
    assert!(broker.wait_log("metrics listening on", Duration::from_secs(30)));
    let metrics = {
        let log = broker.log.lock().expect("log");
        let line = log
            .iter()
            .find(|l| l.contains("metrics listening on"))
            .expect("the line")
            .clone();
        line.rsplit(' ').next().expect("address").trim().to_string()
    };
    let mut a = broker.client();
    let mut b = broker.client();
    create(&mut a, "full", 3);

    let two = || vec![part(0, 0), part(1, 0)];
    let first: FetchResponse = a.call(api::FETCH, 12, &fetch(0, 0, "full", two()));
    let id = first.session_id;
    assert_ne!(id, 0);
    // The one slot is taken by a session as large: no session, a full answer.
    let second: FetchResponse = b.call(api::FETCH, 12, &fetch(0, 0, "full", two()));
    assert_eq!((second.error_code, second.session_id), (0, 0));
    assert_eq!(answered(&second).len(), 2);
    let m = scrape(&metrics, "/metrics");
    assert_eq!(value(&m, r#"weir_fetch_sessions{shard="0"}"#), Some(1.0));
    assert_eq!(
        value(&m, r#"weir_fetch_session_partitions{shard="0"}"#),
        Some(2.0)
    );

    // A larger session is worth more: it evicts the first, whose next fetch gets 70.
    let three = vec![part(0, 0), part(1, 0), part(2, 0)];
    let third: FetchResponse = b.call(api::FETCH, 12, &fetch(0, 0, "full", three));
    assert_ne!(third.session_id, 0);
    assert_ne!(third.session_id, id);
    let evicted: FetchResponse = a.call(api::FETCH, 12, &fetch(id, 1, "full", Vec::new()));
    assert_eq!(evicted.error_code, FETCH_SESSION_ID_NOT_FOUND);
    let m = scrape(&metrics, "/metrics");
    assert_eq!(value(&m, "weir_fetch_session_evictions_total"), Some(1.0));
    assert_eq!(
        value(&m, r#"weir_fetch_session_partitions{shard="0"}"#),
        Some(3.0)
    );
}

#[test]
fn sessions_can_be_turned_off() {
    let broker = Broker::start(1, &[("max.incremental.fetch.session.cache.slots", "0")]);
    let mut c = broker.client();
    create(&mut c, "off", 1);
    let full: FetchResponse = c.call(api::FETCH, 12, &fetch(0, 0, "off", vec![part(0, 0)]));
    assert_eq!((full.error_code, full.session_id), (0, 0));
}

/// A fetch by topic id at `version` (13+).
fn fetch_by_id(
    version: i16,
    session: i32,
    epoch: i32,
    id: Uuid,
    parts: Vec<FetchPartition>,
) -> FetchRequest {
    let mut req = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_session_id(session)
        .with_session_epoch(epoch)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic_id(id)
                .with_partitions(parts),
        ]);
    if version < 15 {
        req = req.with_replica_id(BrokerId(-1));
    }
    req
}

#[test]
fn topic_ids_in_metadata_fetch_and_delete() {
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    let id = create(&mut c, "ids", 2);
    produce(&mut c, "ids", 1, b"x");

    // Metadata v12 reports the same id.
    let md: MetadataResponse = c.call(
        api::METADATA,
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name("ids"))),
        ])),
    );
    assert_eq!(md.topics[0].topic_id, id);

    // Fetch by id at every version from 13: the response names the topic by id.
    let advertised = api::lookup(api::FETCH).expect("listed").max_version;
    assert!(advertised >= 16, "Fetch v16+ advertised");
    for v in 13..=advertised {
        let resp: FetchResponse =
            c.call(api::FETCH, v, &fetch_by_id(v, 0, -1, id, vec![part(1, 0)]));
        assert_eq!(resp.error_code, 0, "v{v}");
        assert_eq!(resp.responses.len(), 1, "v{v}");
        assert_eq!(resp.responses[0].topic_id, id, "v{v}");
        assert_eq!(answered(&resp), vec![(1, true)], "v{v}");
    }

    // An id the broker does not know: UNKNOWN_TOPIC_ID under that id.
    let stranger = Uuid::from_u128(0x1234_5678);
    let resp: FetchResponse = c.call(
        api::FETCH,
        13,
        &fetch_by_id(13, 0, -1, stranger, vec![part(0, 0)]),
    );
    assert_eq!(resp.responses[0].topic_id, stranger);
    assert_eq!(resp.responses[0].partitions[0].error_code, UNKNOWN_TOPIC_ID);

    // A session by id: incremental fetches keep answering by id; continued at v12 (names)
    // it is refused with FETCH_SESSION_TOPIC_ID_ERROR.
    let full: FetchResponse = c.call(
        api::FETCH,
        16,
        &fetch_by_id(16, 0, 0, id, vec![part(0, 0), part(1, 0)]),
    );
    let session = full.session_id;
    assert_ne!(session, 0);
    produce(&mut c, "ids", 0, b"y");
    let mut inc = fetch_by_id(16, session, 1, id, Vec::new());
    inc.topics.clear();
    let resp: FetchResponse = c.call(api::FETCH, 16, &inc);
    assert_eq!((resp.error_code, resp.session_id), (0, session));
    assert_eq!(resp.responses[0].topic_id, id);
    assert_eq!(
        answered(&resp),
        vec![(0, true), (1, true)],
        "still at offset 0 in the session"
    );
    let by_name: FetchResponse = c.call(api::FETCH, 12, &fetch(session, 2, "ids", Vec::new()));
    assert_eq!(by_name.error_code, FETCH_SESSION_TOPIC_ID_ERROR);

    // Kafka's partition.metadata names the id in each partition directory.
    let dir = broker.data_dir.path().join("ids-1");
    let text = std::fs::read_to_string(dir.join("partition.metadata")).expect("partition.metadata");
    assert!(text.starts_with("version: 0\ntopic_id: "), "{text}");
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id.as_bytes());
    assert!(text.contains(&encoded), "{text} names {encoded}");

    // DeleteTopics v6 by id; an unknown id is UNKNOWN_TOPIC_ID.
    let del = DeleteTopicsRequest::default().with_topics(vec![
        DeleteTopicState::default().with_topic_id(id),
        DeleteTopicState::default().with_topic_id(stranger),
    ]);
    let resp: DeleteTopicsResponse = c.call(api::DELETE_TOPICS, 6, &del);
    assert_eq!(resp.responses[0].error_code, 0);
    assert_eq!(
        resp.responses[0].name.as_ref().map(|n| n.to_string()),
        Some("ids".into())
    );
    assert_eq!(resp.responses[1].error_code, UNKNOWN_TOPIC_ID);
    let resp: FetchResponse = c.call(
        api::FETCH,
        13,
        &fetch_by_id(13, 0, -1, id, vec![part(0, 0)]),
    );
    assert_eq!(
        resp.responses[0].partitions[0].error_code, UNKNOWN_TOPIC_ID,
        "deleted"
    );
}

/// Broker CPU per fetch of 1,000 idle partitions: full fetches (sessionless, every
/// partition in request and response) versus incremental fetches of an open session
/// (empty request, empty response). Minutes on a debug build; run with
/// `cargo test -p weir --test fetch_sessions -- --ignored --nocapture`, or on a release
/// build (the number in docs/PERFORMANCE.md) with `WEIR_FETCH_BENCH_FETCHES=5000 cargo test
/// --release -p weir --test fetch_sessions -- --ignored --nocapture` (more fetches, so the
/// 10 ms clock ticks of `/proc/PID/stat` are small beside the totals).
#[test]
#[ignore]
fn incremental_fetches_of_idle_partitions_cost_less_cpu() {
    const PARTITIONS: i32 = 1000;
    const FETCHES_DEFAULT: usize = 500;
    const FETCHES_MAX: usize = 1_000_000;
    let fetches = std::env::var("WEIR_FETCH_BENCH_FETCHES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(FETCHES_DEFAULT)
        .clamp(1, FETCHES_MAX);
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "idle", PARTITIONS);
    let all = || (0..PARTITIONS).map(|p| part(p, 0)).collect::<Vec<_>>();
    // Warm up: every partition opened once.
    let _: FetchResponse = c.call(api::FETCH, 12, &fetch(0, -1, "idle", all()));
    let full_req = fetch(0, -1, "idle", all());
    let cpu0 = broker.cpu_secs();
    for _ in 0..fetches {
        let r: FetchResponse = c.call(api::FETCH, 12, &full_req);
        assert_eq!(answered(&r).len(), PARTITIONS as usize);
    }
    let full_cpu = broker.cpu_secs() - cpu0;
    let opened: FetchResponse = c.call(api::FETCH, 12, &fetch(0, 0, "idle", all()));
    let id = opened.session_id;
    assert_ne!(id, 0);
    let cpu0 = broker.cpu_secs();
    for epoch in 1..=fetches as i32 {
        let r: FetchResponse = c.call(api::FETCH, 12, &fetch(id, epoch, "idle", Vec::new()));
        assert_eq!((r.error_code, answered(&r).len()), (0, 0));
    }
    let inc_cpu = broker.cpu_secs() - cpu0;
    let per = |cpu: f64| cpu / fetches as f64 * 1e6;
    println!(
        "broker CPU per fetch of {PARTITIONS} idle partitions: full {:.0} µs, incremental {:.0} µs ({fetches} fetches each; {full_cpu:.2} s vs {inc_cpu:.2} s)",
        per(full_cpu),
        per(inc_cpu)
    );
    assert!(
        inc_cpu < full_cpu,
        "incremental {inc_cpu:.2} s vs full {full_cpu:.2} s"
    );
}
