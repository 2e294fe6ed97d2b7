//! A long-polling Fetch whose response budget (`max_bytes`) leaves a partition with data
//! out must sleep until new data or `max_wait_ms`, not spin: the left-out partition's
//! wait must not count as "data arrived".

mod common;

use std::time::{Duration, Instant};

use common::{Broker, Client, batch};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

fn name(v: &str) -> TopicName {
    TopicName(StrBytes::from_string(v.to_string()))
}

/// Creates `topic` with `partitions` partitions.
fn create_topic(c: &mut Client, topic: &str, partitions: i32) {
    let t = CreatableTopic::default()
        .with_name(name(topic))
        .with_num_partitions(partitions)
        .with_replication_factor(1);
    let created: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default().with_topics(vec![t]),
    );
    assert_eq!(created.topics[0].error_code, 0, "CreateTopics {topic}");
}

#[test]
fn a_budget_limited_long_poll_sleeps_instead_of_spinning() {
    let broker = Broker::start(1, &[]);
    let mut c: Client = broker.client();
    create_topic(&mut c, "fb", 2);
    for partition in 0..2 {
        produce_values(&mut c, ("fb", partition), &[b"value"]);
    }
    // max_bytes 1: the first partition's batch is sent whole, the second left out; the
    // bytes sent stay below min_bytes, so the fetch long-polls for max_wait_ms.
    let partitions = (0..2)
        .map(|p| {
            FetchPartition::default()
                .with_partition(p)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)
        })
        .collect();
    let fetch = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(2000)
        .with_min_bytes(1 << 20)
        .with_max_bytes(1)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(name("fb"))
                .with_partitions(partitions),
        ]);
    let cpu_before = broker.cpu_secs();
    let t0 = Instant::now();
    let resp: FetchResponse = c.call(api::FETCH, 12, &fetch);
    let elapsed = t0.elapsed();
    let cpu = broker.cpu_secs() - cpu_before;
    let parts = &resp.responses[0].partitions;
    assert_eq!((parts[0].error_code, parts[1].error_code), (0, 0));
    assert!(parts[0].records.as_ref().is_some_and(|r| !r.is_empty()));
    assert!(parts[1].records.as_ref().is_none_or(|r| r.is_empty()));
    assert!(
        elapsed >= Duration::from_millis(1500),
        "waited for max_wait_ms: {elapsed:?}"
    );
    assert!(
        cpu < 0.5,
        "the broker used {cpu:.2} CPU seconds during a 2 s long poll (spinning)"
    );
}

/// One batch of `values` to partition `index` of `topic`, acks=1.
fn produce_values(c: &mut Client, (topic, index): (&str, i32), values: &[&[u8]]) {
    let data = PartitionProduceData::default()
        .with_index(index)
        .with_records(Some(batch(values, 1)));
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

/// A long poll whose partition already returned some bytes, fewer than min_bytes, is
/// answered once an append brings it to min_bytes, not at max_wait_ms (Kafka's
/// DelayedFetch counts every partition's bytes).
#[test]
fn a_long_poll_with_some_data_wakes_when_an_append_reaches_min_bytes() {
    let broker = Broker::start(1, &[]);
    let mut c: Client = broker.client();
    create_topic(&mut c, "mb", 1);
    let value = vec![b'x'; 1000];
    let values: Vec<&[u8]> = (0..50).map(|_| &value[..]).collect();
    produce_values(&mut c, ("mb", 0), &values);

    let fetch = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(10_000)
        .with_min_bytes(100_000)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(name("mb"))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(0)
                        .with_partition_max_bytes(1 << 20),
                ]),
        ]);
    let mut poller = broker.client();
    let t0 = Instant::now();
    poller.send(api::FETCH, 12, &fetch);
    // Lets the poll park on the 50 KB it has (with the fix the answer comes at the append
    // however the two race; without it, a parked poll sleeps the whole 10 s).
    std::thread::sleep(Duration::from_millis(300));
    let more: Vec<&[u8]> = (0..60).map(|_| &value[..]).collect();
    produce_values(&mut c, ("mb", 0), &more);
    let (_, resp): (i32, FetchResponse) = poller.recv(api::FETCH, 12);
    let elapsed = t0.elapsed();
    let part = &resp.responses[0].partitions[0];
    assert_eq!(part.error_code, 0);
    let bytes = part.records.as_ref().map_or(0, |r| r.len());
    assert!(bytes >= 100_000, "answered with min_bytes: {bytes}");
    assert!(
        elapsed < Duration::from_secs(5),
        "answered at the append, not at max_wait_ms: {elapsed:?}"
    );
}

/// A client that sends a Fetch and never reads its answer is closed once the write has
/// made no progress for `connections.max.idle.ms`, as an idle connection is: the stalled
/// response held its share of the fetch budget, which other consumers wait for.
#[test]
fn a_fetch_answer_never_read_closes_its_connection_after_the_idle_limit() {
    let broker = Broker::start(1, &[("connections.max.idle.ms", "2000")]);
    let mut c: Client = broker.client();
    create_topic(&mut c, "unread", 1);
    // 27 MB: more than the two sockets' buffers hold, so the broker's write stalls.
    let value = vec![b'u'; 1000];
    let values: Vec<&[u8]> = (0..900).map(|_| &value[..]).collect();
    for _ in 0..30 {
        produce_values(&mut c, ("unread", 0), &values);
    }
    let fetch = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(name("unread"))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(0)
                        .with_partition_max_bytes(50 << 20),
                ]),
        ]);
    let mut stalled = broker.client();
    stalled.send(api::FETCH, 12, &fetch);
    assert!(
        broker.wait_log("a response not read for 2000 ms", Duration::from_secs(30)),
        "the stalled connection was not closed: {}",
        broker.log_tail(20)
    );
    // Everyone else still reads (a new connection: `c` idled past the limit too).
    let mut c = broker.client();
    let resp: FetchResponse = c.call(api::FETCH, 12, &fetch.with_max_bytes(1 << 20));
    assert_eq!(resp.responses[0].partitions[0].error_code, 0);
    assert!(
        resp.responses[0].partitions[0]
            .records
            .as_ref()
            .is_some_and(|r| !r.is_empty())
    );
    drop(stalled);
}

/// A follower whose last fetched epoch diverges from the leader's log is told so at once
/// (Kafka's hasDivergingEpoch), not after `max_wait_ms`: it has to truncate before it can
/// fetch anything, and a parked answer only delays that.
#[test]
fn a_diverging_follower_is_answered_without_waiting() {
    let broker = Broker::start(1, &[]);
    let mut c: Client = broker.client();
    create_topic(&mut c, "dv", 1);
    produce_values(&mut c, ("dv", 0), &[b"a", b"b"]);
    // Epoch 99 is unknown to this leader: the follower diverges.
    let fetch = FetchRequest::default()
        .with_replica_id(BrokerId(2))
        .with_max_wait_ms(5000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(name("dv"))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(2)
                        .with_last_fetched_epoch(99)
                        .with_partition_max_bytes(1 << 20),
                ]),
        ]);
    let t0 = Instant::now();
    let resp: FetchResponse = c.call(api::FETCH, 12, &fetch);
    let elapsed = t0.elapsed();
    let part = &resp.responses[0].partitions[0];
    assert_eq!(part.error_code, 0);
    // This leader cannot place epoch 99: it answers the divergence as (-1, -1) (see
    // docs: an unplaceable epoch), with no records.
    assert!(part.records.as_ref().is_none_or(|r| r.is_empty()));
    assert!(
        elapsed < Duration::from_secs(3),
        "answered at once, not at max_wait_ms: {elapsed:?}"
    );
}

/// A consumer's last fetched epoch is checked as a follower's is (Kafka's readRecords
/// does it for every fetch): an epoch this leader cannot place is a diverging answer,
/// given at once, so a KIP-320 client truncates instead of resetting its position.
#[test]
fn a_consumer_whose_last_fetched_epoch_diverges_is_told_so() {
    let broker = Broker::start(1, &[]);
    let mut c: Client = broker.client();
    create_topic(&mut c, "cdv", 1);
    produce_values(&mut c, ("cdv", 0), &[b"a", b"b"]);
    let fetch = |last_fetched_epoch: i32| {
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(5000)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_topics(vec![
                FetchTopic::default()
                    .with_topic(name("cdv"))
                    .with_partitions(vec![
                        FetchPartition::default()
                            .with_partition(0)
                            .with_fetch_offset(1)
                            .with_last_fetched_epoch(last_fetched_epoch)
                            .with_partition_max_bytes(1 << 20),
                    ]),
            ])
    };
    let t0 = Instant::now();
    let resp: FetchResponse = c.call(api::FETCH, 12, &fetch(99));
    let part = &resp.responses[0].partitions[0];
    assert_eq!(part.error_code, 0);
    // An epoch it cannot place is answered as (-1, -1), with no records (as Kafka).
    assert!(part.records.as_ref().is_none_or(|r| r.is_empty()));
    assert_eq!(part.diverging_epoch.end_offset, -1);
    assert!(t0.elapsed() < Duration::from_secs(3), "answered at once");
    // Without a last fetched epoch, or with the leader's own, the fetch reads the record.
    let epoch = list_epoch(&mut c, "cdv");
    for last in [-1, epoch] {
        let resp: FetchResponse = c.call(api::FETCH, 12, &fetch(last));
        let part = &resp.responses[0].partitions[0];
        assert_eq!(part.error_code, 0);
        assert!(
            part.records.as_ref().is_some_and(|r| !r.is_empty()),
            "last fetched epoch {last}"
        );
    }
}

/// The leader epoch ListOffsets (v4+) gives for the latest offset of `topic`-0.
fn list_epoch(c: &mut Client, topic: &str) -> i32 {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(name(topic))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(-1),
                ]),
        ]);
    let resp: ListOffsetsResponse = c.call(api::LIST_OFFSETS, 6, &req);
    resp.topics[0].partitions[0].leader_epoch
}
