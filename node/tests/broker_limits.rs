//! Limits and shutdown against a real `weir serve`: `socket.request.max.bytes` and bad
//! framing close only the offending connection (with a log line), `max.connections` is
//! enforced node-wide, and SIGTERM answers an in-flight long poll before a clean exit.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{Broker, Client, raw_frame};
use kafka_protocol::messages::*;
use wire::api;

fn api_versions_ok(c: &mut Client) -> bool {
    let resp: ApiVersionsResponse = c.call(api::API_VERSIONS, 3, &ApiVersionsRequest::default());
    resp.error_code == 0 && resp.api_keys.iter().any(|k| k.api_key == api::PRODUCE)
}

#[test]
fn oversized_and_garbage_frames_close_only_their_connection() {
    let broker = Broker::start(2, &[("socket.request.max.bytes", "4096")]);
    let mut good = broker.client();
    assert!(api_versions_ok(&mut good));

    let mut big = broker.client();
    big.stream.write_all(&8192i32.to_be_bytes()).expect("write");
    assert!(
        big.is_closed(),
        "a size over socket.request.max.bytes closes the connection"
    );
    assert!(
        broker.wait_log("socket.request.max.bytes", Duration::from_secs(5)),
        "and says why"
    );

    let mut huge = broker.client();
    huge.stream
        .write_all(&i32::MAX.to_be_bytes())
        .expect("write");
    assert!(
        huge.is_closed(),
        "a 2 GiB size prefix is refused before any allocation"
    );

    let mut negative = broker.client();
    negative
        .stream
        .write_all(&(-5i32).to_be_bytes())
        .expect("write");
    assert!(negative.is_closed());

    let mut unknown = broker.client();
    unknown
        .stream
        .write_all(&raw_frame(&[0x7f, 0x00, 0, 0, 0, 0, 0, 9, 0xff, 0xff]))
        .expect("write");
    assert!(
        unknown.is_closed(),
        "an unknown API key closes the connection"
    );

    let mut garbage = broker.client();
    garbage
        .stream
        .write_all(&raw_frame(&[0, 0, 0, 9, 1, 2, 3]))
        .expect("write");
    assert!(
        garbage.is_closed(),
        "a truncated header closes the connection"
    );

    let mut bad_body = broker.client();
    let mut body = vec![0, 3, 0, 12, 0, 0, 0, 5, 0xff, 0xff, 0];
    body.extend_from_slice(&[0xff; 8]);
    bad_body.stream.write_all(&raw_frame(&body)).expect("write");
    assert!(
        bad_body.is_closed(),
        "an undecodable Metadata body closes the connection"
    );

    let mut half = broker.client();
    half.stream.write_all(&100i32.to_be_bytes()).expect("write");
    half.stream.write_all(&[0, 18]).expect("write");
    half.stream
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    assert!(
        half.is_closed(),
        "a frame cut short by EOF closes the connection"
    );

    assert!(
        api_versions_ok(&mut good),
        "the well-behaved connection is unaffected"
    );
    assert!(
        api_versions_ok(&mut broker.client()),
        "and new connections are served"
    );
}

/// `Client::is_closed` is false for a peer that holds the connection open and silent
/// (its read times out): else every `is_closed` assert here would pass against a broker
/// that ignored the bad input instead of closing.
#[test]
fn is_closed_is_false_for_a_silent_peer() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let stream =
        std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (peer, _) = listener.accept().expect("accept");
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut c = Client::from_stream(stream);
    assert!(!c.is_closed(), "a read timeout is not a close");
    drop(peer);
    assert!(c.is_closed(), "EOF is");
}

#[test]
fn unsupported_versions() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    // ApiVersions above our maximum: UNSUPPORTED_VERSION plus the table, as v0 (KIP-511).
    c.send(api::API_VERSIONS, 3, &ApiVersionsRequest::default());
    let _: (i32, ApiVersionsResponse) = c.recv(api::API_VERSIONS, 3);
    let mut raw = broker.client();
    raw.stream
        .write_all(&raw_frame(&[0, 18, 0, 99, 0, 0, 0, 7, 0xff, 0xff, 0]))
        .expect("write");
    let frame = raw.read_frame().expect("an answer, not a close");
    let (corr, resp): (i32, ApiVersionsResponse) =
        wire::messages::decode_response_as(api::API_VERSIONS, 0, &frame).expect("v0");
    assert_eq!((corr, resp.error_code), (7, 35));
    assert!(!resp.api_keys.is_empty());
    // Any other API at an unserved version: the connection is closed.
    c.stream
        .write_all(&raw_frame(&[0, 3, 0, 99, 0, 0, 0, 8, 0xff, 0xff, 0, 0]))
        .expect("write");
    assert!(c.is_closed());
}

#[test]
fn max_connections_is_enforced_node_wide() {
    let broker = Broker::start(2, &[("max.connections", "3")]);
    let mut open: Vec<Client> = (0..3).map(|_| broker.client()).collect();
    for c in &mut open {
        assert!(api_versions_ok(c));
    }
    let mut extra = broker.client();
    assert!(extra.is_closed(), "the fourth connection is refused");
    assert!(broker.wait_log("max.connections", Duration::from_secs(5)));
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut served = false;
    while !served && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let mut again = broker.client();
        served =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| api_versions_ok(&mut again)))
                .unwrap_or(false);
    }
    assert!(served, "a slot freed by a closed connection is reused");
}

#[test]
fn sigterm_answers_in_flight_requests_then_exits_cleanly() {
    let mut broker = Broker::start(2, &[]);
    let mut c = broker.client();
    let md = MetadataRequest::default().with_topics(Some(vec![
        kafka_protocol::messages::metadata_request::MetadataRequestTopic::default().with_name(
            Some(TopicName(
                kafka_protocol::protocol::StrBytes::from_static_str("sd"),
            )),
        ),
    ]));
    let _: MetadataResponse = c.call(api::METADATA, 12, &md);
    // A long poll that would wait 30 s is in flight when the signal comes.
    let p = kafka_protocol::messages::fetch_request::FetchPartition::default()
        .with_fetch_offset(0)
        .with_partition_max_bytes(1 << 20);
    let fetch = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(30_000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            kafka_protocol::messages::fetch_request::FetchTopic::default()
                .with_topic(TopicName(
                    kafka_protocol::protocol::StrBytes::from_static_str("sd"),
                ))
                .with_partitions(vec![p]),
        ]);
    let sent = c.send(api::FETCH, 12, &fetch);
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let status = broker.terminate();
    assert!(status.success(), "clean exit: {status:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    let (got, resp): (i32, FetchResponse) = c.recv(api::FETCH, 12);
    assert_eq!(
        got, sent,
        "the in-flight fetch was answered before the exit"
    );
    assert_eq!(resp.responses[0].partitions[0].error_code, 0);
    assert!(broker.log_contains("logs closed"));
}

/// A Produce of `entries` empty (null records) partition entries of topic `t`, as a
/// whole frame: v7, classic encoding, 8 bytes an entry.
fn produce_of_empty_entries(entries: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + 8 * entries);
    body.extend_from_slice(&api::PRODUCE.to_be_bytes());
    body.extend_from_slice(&7i16.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes()); // correlation id
    body.extend_from_slice(&(-1i16).to_be_bytes()); // client id: null
    body.extend_from_slice(&(-1i16).to_be_bytes()); // transactional id: null
    body.extend_from_slice(&1i16.to_be_bytes()); // acks
    body.extend_from_slice(&5000i32.to_be_bytes()); // timeout
    body.extend_from_slice(&1i32.to_be_bytes()); // one topic
    body.extend_from_slice(&1i16.to_be_bytes());
    body.push(b't');
    let count = i32::try_from(entries).expect("fits");
    body.extend_from_slice(&count.to_be_bytes());
    for i in 0..count {
        body.extend_from_slice(&i.to_be_bytes());
        body.extend_from_slice(&(-1i32).to_be_bytes()); // records: null
    }
    raw_frame(&body)
}

/// A Produce naming more partition entries than `PARTITIONS_PER_PRODUCE_MAX` is refused
/// at once as undecodable (connection closed): each entry would cost a task, a shard
/// call and a response entry. Other clients are served meanwhile; a request at the
/// bound is answered.
#[test]
fn a_produce_over_the_partition_entry_bound_closes_its_connection() {
    let max = wire::produce::PARTITIONS_PER_PRODUCE_MAX;
    let broker = Broker::start(2, &[]);
    let mut over = broker.client();
    let started = Instant::now();
    over.stream
        .write_all(&produce_of_empty_entries(max + 1))
        .expect("write");
    assert!(over.is_closed(), "closed, not answered");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused quickly"
    );
    let mut other = broker.client();
    assert!(api_versions_ok(&mut other));

    let mut at = broker.client();
    at.stream
        .write_all(&produce_of_empty_entries(max))
        .expect("write");
    let (_, resp): (i32, ProduceResponse) = at.recv(api::PRODUCE, 7);
    let entries: usize = resp
        .responses
        .iter()
        .map(|t| t.partition_responses.len())
        .sum();
    assert_eq!(entries, max, "answered at the bound");
}

/// A topic named again in one Metadata request is answered once, by name (v1) and by id
/// (v12), as Kafka takes the request's topics as a set: each repeat would build the
/// topic's whole partition list again (a small request could name a large topic
/// hundreds of thousands of times).
#[test]
fn metadata_answers_a_repeated_topic_once() {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    const REPEATS: usize = 10_000;
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    assert_eq!(common::requests::create_topics(&mut c, &[("t", 50)]), [0]);

    let by_name = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default()
            .with_name(Some(
                TopicName(common::requests::s("t"))
            ));
        REPEATS
    ]));
    let resp: MetadataResponse = c.call(api::METADATA, 1, &by_name);
    assert_eq!(resp.topics.len(), 1, "one answer for the one topic named");
    assert_eq!(resp.topics[0].partitions.len(), 50);

    let all: MetadataResponse = c.call(
        api::METADATA,
        12,
        &MetadataRequest::default().with_topics(None),
    );
    let id = all.topics[0].topic_id;
    assert!(!id.is_nil(), "the topic has an id");
    let by_id = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default()
            .with_name(None)
            .with_topic_id(id);
        REPEATS
    ]));
    let resp: MetadataResponse = c.call(api::METADATA, 12, &by_id);
    assert_eq!(resp.topics.len(), 1, "one answer for the one id named");
    assert_eq!(resp.topics[0].error_code, 0);
    assert_eq!(resp.topics[0].partitions.len(), 50);
    // v10-v11 requests may carry a null name, their answers cannot: INVALID_REQUEST,
    // encodable (a null name in the answer could not be parsed by a client).
    let resp: MetadataResponse = c.call(api::METADATA, 11, &by_id);
    assert_eq!(resp.topics.len(), 1);
    assert_eq!(resp.topics[0].error_code, 42, "INVALID_REQUEST");
}

/// A DescribeConfigs naming the broker again (same keys) is answered once; more
/// resources than the bound close the connection, as Produce's partition bound.
#[test]
fn describe_configs_answers_a_repeated_resource_once_and_is_bounded() {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    const REPEATS: usize = 10_000;
    const BROKER: i8 = 4;
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    let resource = DescribeConfigsResource::default()
        .with_resource_type(BROKER)
        .with_resource_name(common::requests::s(""));
    let req = DescribeConfigsRequest::default().with_resources(vec![resource.clone(); REPEATS]);
    let resp: DescribeConfigsResponse = c.call(api::DESCRIBE_CONFIGS, 4, &req);
    assert_eq!(
        resp.results.len(),
        1,
        "one answer for the one resource named"
    );
    assert_eq!(resp.results[0].error_code, 0);
    assert!(resp.results[0].configs.len() > 10, "every broker key");

    // Different keys are a different question: each is answered, with its keys only.
    let keyed = |key: &str| {
        resource
            .clone()
            .with_configuration_keys(Some(vec![common::requests::s(key)]))
    };
    let req = DescribeConfigsRequest::default().with_resources(vec![
        keyed("num.partitions"),
        keyed("log.retention.ms"),
        keyed("num.partitions"),
    ]);
    let resp: DescribeConfigsResponse = c.call(api::DESCRIBE_CONFIGS, 4, &req);
    let names: Vec<Vec<String>> = resp
        .results
        .iter()
        .map(|r| r.configs.iter().map(|e| e.name.to_string()).collect())
        .collect();
    assert_eq!(names, [["num.partitions"], ["log.retention.ms"]]);

    let max = weir::api::configs::RESOURCES_PER_DESCRIBE_MAX;
    let mut over = broker.client();
    let req = DescribeConfigsRequest::default().with_resources(vec![resource; max + 1]);
    over.send(api::DESCRIBE_CONFIGS, 4, &req);
    assert!(over.is_closed(), "over the bound: closed, not answered");
    assert!(api_versions_ok(&mut c), "other connections are served");
}

/// An OffsetFetch naming many distinct topics is answered in time linear in them (its
/// answer was grouped by topic with a scan of the topics so far for each offset).
#[test]
fn offset_fetch_of_many_distinct_topics_is_answered_in_time() {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    const TOPICS: usize = 200_000;
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    common::requests::find_coordinator(&mut c, "g");
    let topics = (0..TOPICS)
        .map(|i| {
            OffsetFetchRequestTopic::default()
                .with_name(TopicName(common::requests::s(&format!("t{i}"))))
                .with_partition_indexes(vec![0])
        })
        .collect();
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(common::requests::s("g")))
        .with_topics(Some(topics));
    let resp = offset_fetch_within(&mut c, &req, OFFSET_FETCH_ANSWER_MAX);
    assert_eq!(resp.error_code, 0);
    assert_eq!(resp.topics.len(), TOPICS, "each topic answered once");
}

/// A stable OffsetFetch (v7, `require_stable`) of many partitions with as many offsets
/// of an open transaction is answered in time linear in them (each fetched offset was
/// checked against every pending one), each partition UNSTABLE_OFFSET_COMMIT.
#[test]
fn stable_offset_fetch_of_many_pending_offsets_is_answered_in_time() {
    use common::requests::s;
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    const PARTITIONS: i32 = 50_000;
    const COMMIT_PARTITIONS: usize = 5_000;
    const UNSTABLE_OFFSET_COMMIT: i16 = 88;
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    common::requests::find_coordinator(&mut c, "g");
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(s("tx"))))
        .with_transaction_timeout_ms(600_000)
        .with_producer_id((-1).into())
        .with_producer_epoch(-1);
    let resp: InitProducerIdResponse = c.call(api::INIT_PRODUCER_ID, 4, &req);
    assert_eq!(resp.error_code, 0, "InitProducerId");
    let (pid, epoch) = (resp.producer_id, resp.producer_epoch);
    let req = AddOffsetsToTxnRequest::default()
        .with_transactional_id(TransactionalId(s("tx")))
        .with_producer_id(pid)
        .with_producer_epoch(epoch)
        .with_group_id(GroupId(s("g")));
    let resp: AddOffsetsToTxnResponse = c.call(api::ADD_OFFSETS_TO_TXN, 3, &req);
    assert_eq!(resp.error_code, 0, "AddOffsetsToTxn");
    // In parts: one commit's batch must fit the offsets topic's record size limit.
    for first in (0..PARTITIONS).step_by(COMMIT_PARTITIONS) {
        let partitions = (first..PARTITIONS.min(first + COMMIT_PARTITIONS as i32))
            .map(|p| {
                TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(p)
                    .with_committed_offset(1)
            })
            .collect();
        let req = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(s("tx")))
            .with_group_id(GroupId(s("g")))
            .with_producer_id(pid)
            .with_producer_epoch(epoch)
            .with_generation_id(-1)
            .with_topics(vec![
                TxnOffsetCommitRequestTopic::default()
                    .with_name(TopicName(s("x")))
                    .with_partitions(partitions),
            ]);
        let resp: TxnOffsetCommitResponse = c.call(api::TXN_OFFSET_COMMIT, 3, &req);
        assert!(
            resp.topics[0].partitions.iter().all(|p| p.error_code == 0),
            "TxnOffsetCommit: {:?}",
            resp.topics[0].partitions.first()
        );
    }

    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_require_stable(true)
        .with_topics(Some(vec![
            OffsetFetchRequestTopic::default()
                .with_name(TopicName(s("x")))
                .with_partition_indexes((0..PARTITIONS).collect()),
        ]));
    let resp = offset_fetch_within(&mut c, &req, OFFSET_FETCH_ANSWER_MAX);
    assert_eq!(resp.error_code, 0, "answered, not failed");
    let unstable = resp
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .filter(|p| p.error_code == UNSTABLE_OFFSET_COMMIT)
        .count();
    assert_eq!(
        unstable, PARTITIONS as usize,
        "each pending offset is unstable"
    );
}

/// A ListOffsets or OffsetForLeaderEpoch naming more partition entries than the bound
/// is refused as undecodable (connection closed): each entry costs a task and a call
/// to its owner, all queued at once. One at the bound is answered.
#[test]
fn offsets_requests_over_the_partition_entry_bound_close_their_connection() {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::offset_for_leader_epoch_request::{
        OffsetForLeaderPartition, OffsetForLeaderTopic,
    };
    let max = weir::api::offsets::PARTITIONS_PER_REQUEST_MAX;
    let broker = Broker::start(2, &[]);
    let list = |entries: usize| {
        let partitions = (0..entries)
            .map(|i| {
                ListOffsetsPartition::default()
                    .with_partition_index(i32::try_from(i).expect("fits"))
                    .with_timestamp(-1)
            })
            .collect();
        ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![
                ListOffsetsTopic::default()
                    .with_name(TopicName(common::requests::s("t")))
                    .with_partitions(partitions),
            ])
    };
    let mut over = broker.client();
    over.send(api::LIST_OFFSETS, 6, &list(max + 1));
    assert!(over.is_closed(), "ListOffsets over the bound: closed");

    let epochs = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![
            OffsetForLeaderTopic::default()
                .with_topic(TopicName(common::requests::s("t")))
                .with_partitions(vec![
                    OffsetForLeaderPartition::default().with_leader_epoch(0);
                    max + 1
                ]),
        ]);
    let mut over = broker.client();
    over.send(api::OFFSET_FOR_LEADER_EPOCH, 4, &epochs);
    assert!(
        over.is_closed(),
        "OffsetForLeaderEpoch over the bound: closed"
    );

    let mut at = broker.client();
    let resp: ListOffsetsResponse = at.call(api::LIST_OFFSETS, 6, &list(max));
    let entries: usize = resp.topics.iter().map(|t| t.partitions.len()).sum();
    assert_eq!(entries, max, "answered at the bound");
}

/// Generous for a debug build; the quadratic code took minutes.
const OFFSET_FETCH_ANSWER_MAX: Duration = Duration::from_secs(60);

/// Sends OffsetFetch v7 `req` and asserts it is answered within `max` (the read waits
/// past it, so a slow answer fails this assertion, not the read).
fn offset_fetch_within(
    c: &mut Client,
    req: &OffsetFetchRequest,
    max: Duration,
) -> OffsetFetchResponse {
    c.stream.set_read_timeout(Some(max * 2)).expect("timeout");
    let started = Instant::now();
    let sent = c.send(api::OFFSET_FETCH, 7, req);
    let frame = c.read_frame();
    let elapsed = started.elapsed();
    assert!(elapsed < max, "answered in {elapsed:?}");
    let frame = frame.expect("answered");
    let (got, resp): (i32, OffsetFetchResponse) =
        wire::messages::decode_response_as(api::OFFSET_FETCH, 7, &frame).expect("decode");
    assert_eq!(got, sent);
    resp
}
