//! The data path against a real `weir serve`: Produce acks 0/1/all and
//! `min.insync.replicas`, batch validation errors, Fetch long polls woken by appends on
//! either shard (not by polling), ListOffsets, DeleteRecords, and pipelining order.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Broker, Client, batch};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

const PRODUCE_V: i16 = 9;
const FETCH_V: i16 = 12;
const LIST_OFFSETS_V: i16 = 6;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn create(c: &mut Client, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let t = CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(partitions)
        .with_replication_factor(1)
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(s(k))
                        .with_value(Some(s(v)))
                })
                .collect(),
        );
    let resp: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default().with_topics(vec![t]),
    );
    assert_eq!(resp.topics[0].error_code, 0);
}

fn produce_req(topic: &str, partition: i32, acks: i16, records: Bytes) -> ProduceRequest {
    let p = PartitionProduceData::default()
        .with_index(partition)
        .with_records(Some(records));
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s(topic)))
                .with_partition_data(vec![p]),
        ])
}

/// Produces and returns (error code, base offset).
fn produce(c: &mut Client, topic: &str, partition: i32, acks: i16, records: Bytes) -> (i16, i64) {
    let resp: ProduceResponse = c.call(
        api::PRODUCE,
        PRODUCE_V,
        &produce_req(topic, partition, acks, records),
    );
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

fn fetch_req(
    topic: &str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
    min_bytes: i32,
) -> FetchRequest {
    let p = FetchPartition::default()
        .with_partition(partition)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(1 << 20);
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(min_bytes)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(s(topic)))
                .with_partitions(vec![p]),
        ])
}

/// Fetches; returns (error, high watermark, record bytes, elapsed).
fn fetch(
    c: &mut Client,
    topic: &str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
) -> (i16, i64, Bytes, Duration) {
    let t0 = Instant::now();
    let resp: FetchResponse = c.call(
        api::FETCH,
        FETCH_V,
        &fetch_req(topic, partition, offset, max_wait_ms, 1),
    );
    let p = &resp.responses[0].partitions[0];
    (
        p.error_code,
        p.high_watermark,
        p.records.clone().unwrap_or_default(),
        t0.elapsed(),
    )
}

fn list_offset(c: &mut Client, topic: &str, partition: i32, timestamp: i64) -> (i16, i64, i64) {
    let p = ListOffsetsPartition::default()
        .with_partition_index(partition)
        .with_timestamp(timestamp);
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(vec![p]),
        ]);
    let resp: ListOffsetsResponse = c.call(api::LIST_OFFSETS, LIST_OFFSETS_V, &req);
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.offset, p.timestamp)
}

/// Every record value in a fetched records blob, in order.
fn record_values(records: &Bytes) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for range in wire::batch::split_batches(records) {
        let one = records.slice(range.expect("valid batch from the broker"));
        let (_, iter) = wire::batch::batch_records(&one, 1 << 20).expect("records");
        for rec in iter {
            out.push(
                rec.expect("record")
                    .value
                    .map(|v| v.to_vec())
                    .unwrap_or_default(),
            );
        }
    }
    out
}

#[test]
fn acks_min_insync_replicas_and_batch_validation() {
    let broker = Broker::start(2, &[("message.max.bytes", "2000")]);
    let mut c = broker.client();
    create(&mut c, "plain", 1, &[]);
    create(&mut c, "strict", 1, &[("min.insync.replicas", "2")]);

    assert_eq!(
        produce(&mut c, "plain", 0, -1, batch(&[b"a", b"b"], 1)),
        (0, 0)
    );
    assert_eq!(produce(&mut c, "plain", 0, 1, batch(&[b"c"], 1)), (0, 2));
    assert_eq!(
        produce(&mut c, "strict", 0, -1, batch(&[b"x"], 1)).0,
        19,
        "NOT_ENOUGH_REPLICAS with one replica"
    );
    assert_eq!(
        produce(&mut c, "strict", 0, 1, batch(&[b"x"], 1)),
        (0, 0),
        "acks=1 ignores min.insync.replicas"
    );
    assert_eq!(
        produce(&mut c, "plain", 0, 7, batch(&[b"x"], 1)).0,
        21,
        "INVALID_REQUIRED_ACKS"
    );
    assert_eq!(
        produce(&mut c, "plain", 5, 1, batch(&[b"x"], 1)).0,
        3,
        "UNKNOWN_TOPIC_OR_PARTITION"
    );
    assert_eq!(produce(&mut c, "nosuch", 0, 1, batch(&[b"x"], 1)).0, 3);

    let mut bad = batch(&[b"crc"], 1).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert_eq!(
        produce(&mut c, "plain", 0, 1, Bytes::from(bad)).0,
        2,
        "CORRUPT_MESSAGE on CRC mismatch"
    );
    let big = vec![7u8; 3000];
    assert_eq!(
        produce(&mut c, "plain", 0, 1, batch(&[&big], 1)).0,
        10,
        "MESSAGE_TOO_LARGE over message.max.bytes"
    );
    let mut truncated = batch(&[b"t"], 1).to_vec();
    truncated.truncate(truncated.len() - 3);
    assert_eq!(produce(&mut c, "plain", 0, 1, Bytes::from(truncated)).0, 2);

    // acks=0: no response at all; the next response on the connection is the next request's.
    let silent = c.send(
        api::PRODUCE,
        PRODUCE_V,
        &produce_req("plain", 0, 0, batch(&[b"quiet"], 1)),
    );
    let (code, base) = produce(&mut c, "plain", 0, 1, batch(&[b"loud"], 1));
    assert_eq!(
        (code, base),
        (0, 4),
        "acks=0 record was appended at 3, silently"
    );
    assert!(silent > 0);

    let (err, hw, records, _) = fetch(&mut c, "plain", 0, 0, 0);
    assert_eq!((err, hw), (0, 5));
    let values = record_values(&records);
    assert_eq!(
        values,
        vec![
            b"a".to_vec(),
            b"b".to_vec(),
            b"c".to_vec(),
            b"quiet".to_vec(),
            b"loud".to_vec()
        ],
        "rejected batches left no trace"
    );
}

#[test]
fn long_poll_is_woken_by_appends_on_either_shard() {
    let broker = Broker::start(2, &[]);
    let mut admin = broker.client();
    // Two partitions: with two shards, one is owned by this connection's shard and one by
    // the other, whichever shard accepted the connection.
    create(&mut admin, "lp", 2, &[]);
    for partition in 0..2 {
        let mut consumer = broker.client();
        let addr = broker.addr();
        // The fetch is on its way before the producer's clock starts: the append comes at
        // least 300 ms after t0, however the threads are scheduled.
        let t0 = Instant::now();
        consumer.send(
            api::FETCH,
            FETCH_V,
            &fetch_req("lp", partition, 0, 20_000, 1),
        );
        let producer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut p = Client::connect(&addr);
            produce(&mut p, "lp", partition, 1, batch(&[b"wake"], 1))
        });
        let (_, resp): (i32, FetchResponse) = consumer.recv(api::FETCH, FETCH_V);
        let elapsed = t0.elapsed();
        assert_eq!(producer.join().expect("producer"), (0, 0));
        let p = &resp.responses[0].partitions[0];
        assert_eq!((p.error_code, p.high_watermark), (0, 1));
        assert!(
            p.records.as_ref().is_some_and(|r| !r.is_empty()),
            "the woken fetch returns the appended batch"
        );
        assert!(
            elapsed >= Duration::from_millis(250),
            "it waited for the append: {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_secs(5),
            "woken by the append, not by max_wait: {elapsed:?}"
        );
    }
    // Nothing arrives: the long poll ends at max_wait_ms with an empty answer.
    let (err, _, records, elapsed) = fetch(&mut admin, "lp", 1, 1, 400);
    assert_eq!(err, 0);
    assert!(records.is_empty());
    assert!(
        elapsed >= Duration::from_millis(350) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    // Offsets past the end are OFFSET_OUT_OF_RANGE, at once.
    let (err, _, _, elapsed) = fetch(&mut admin, "lp", 0, 99, 10_000);
    assert_eq!(err, 1);
    assert!(elapsed < Duration::from_secs(5));
}

#[test]
fn list_offsets_and_delete_records() {
    let mut broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "lo", 1, &[]);
    assert_eq!(
        list_offset(&mut c, "lo", 0, -3),
        (0, -1, -1),
        "empty log has no max timestamp"
    );
    for (i, ts) in [1_000i64, 2_000, 3_000].iter().enumerate() {
        let vals: Vec<Vec<u8>> = (0..5).map(|r| format!("{i}-{r}").into_bytes()).collect();
        let refs: Vec<&[u8]> = vals.iter().map(Vec::as_slice).collect();
        assert_eq!(
            produce(&mut c, "lo", 0, -1, batch(&refs, *ts)),
            (0, 5 * i as i64)
        );
    }
    assert_eq!(list_offset(&mut c, "lo", 0, -2).1, 0);
    assert_eq!(list_offset(&mut c, "lo", 0, -1).1, 15);
    assert_eq!(
        list_offset(&mut c, "lo", 0, 1_500),
        (0, 5, 2_000),
        "first batch at or after the time"
    );
    assert_eq!(
        list_offset(&mut c, "lo", 0, 9_000).1,
        -1,
        "nothing that new"
    );
    assert_eq!(list_offset(&mut c, "lo", 0, -3).2, 3_000, "max timestamp");
    // Records with their own timestamps inside one batch: the exact record is found.
    let mixed = wire::batch::BatchBuilder {
        records: [4_000i64, 5_000, 6_000]
            .iter()
            .map(|t| wire::batch::NewRecord::value(*t, Bytes::from_static(b"m")))
            .collect(),
        ..Default::default()
    }
    .build()
    .expect("batch");
    assert_eq!(produce(&mut c, "lo", 0, 1, mixed), (0, 15));
    assert_eq!(
        list_offset(&mut c, "lo", 0, 4_500),
        (0, 16, 5_000),
        "the record, not its batch"
    );
    assert_eq!(list_offset(&mut c, "lo", 0, 6_000), (0, 17, 6_000));

    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![
            DeleteRecordsTopic::default()
                .with_name(TopicName(s("lo")))
                .with_partitions(vec![
                    DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(5),
                ]),
        ]);
    let resp: DeleteRecordsResponse = c.call(api::DELETE_RECORDS, 2, &req);
    let p = &resp.topics[0].partitions[0];
    assert_eq!((p.error_code, p.low_watermark), (0, 5));
    assert_eq!(list_offset(&mut c, "lo", 0, -2).1, 5);
    assert_eq!(
        fetch(&mut c, "lo", 0, 0, 0).0,
        1,
        "deleted offsets are out of range"
    );

    broker.restart();
    let mut c = broker.client();
    assert_eq!(
        list_offset(&mut c, "lo", 0, -2).1,
        5,
        "log start offset survives a restart"
    );
    assert_eq!(
        list_offset(&mut c, "lo", 0, -1).1,
        18,
        "every acknowledged record survives"
    );
    let (err, hw, records, _) = fetch(&mut c, "lo", 0, 5, 0);
    assert_eq!((err, hw), (0, 18));
    assert_eq!(wire::batch::split_batches(&records).count(), 3);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    create(&mut c, "pipe", 4, &[]);
    let mut sent = Vec::new();
    for i in 0..60 {
        let id = match i % 3 {
            0 => c.send(
                api::PRODUCE,
                PRODUCE_V,
                &produce_req("pipe", i % 4, 1, batch(&[b"p"], 1)),
            ),
            1 => c.send(api::FETCH, FETCH_V, &fetch_req("pipe", i % 4, 0, 50, 1)),
            _ => c.send(
                api::METADATA,
                12,
                &MetadataRequest::default().with_topics(None),
            ),
        };
        sent.push(id);
    }
    let mut got = Vec::new();
    for _ in 0..60 {
        let frame = c.read_frame().expect("response");
        got.push(i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]));
    }
    assert_eq!(got, sent);
}

#[test]
fn large_multi_partition_produce_is_stored_exactly() {
    let broker = Broker::start(2, &[("message.max.bytes", "2000000")]);
    let mut c = broker.client();
    create(&mut c, "big", 4, &[]);
    // One request, four partitions of ~600 KiB each: a large frame, cut per partition.
    let values: Vec<Vec<u8>> = (0..4u8)
        .map(|p| (0..600_000u32).map(|i| (i as u8) ^ p).collect())
        .collect();
    let topic = TopicProduceData::default()
        .with_name(TopicName(s("big")))
        .with_partition_data(
            (0..4)
                .map(|p| {
                    PartitionProduceData::default()
                        .with_index(p)
                        .with_records(Some(batch(&[&values[p as usize], b"tail"], 9)))
                })
                .collect(),
        );
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![topic]);
    let resp: ProduceResponse = c.call(api::PRODUCE, PRODUCE_V, &req);
    for p in &resp.responses[0].partition_responses {
        assert_eq!(
            (p.error_code, p.base_offset),
            (0, 0),
            "partition {}",
            p.index
        );
    }
    for p in 0..4 {
        let (err, hw, records, _) = fetch(&mut c, "big", p, 0, 0);
        assert_eq!((err, hw), (0, 2));
        assert_eq!(
            record_values(&records),
            vec![values[p as usize].clone(), b"tail".to_vec()],
            "partition {p}"
        );
    }
}

/// KIP-320 on the real broker: a Fetch or ListOffsets naming the partition's current
/// leader epoch (0 on a single node) is served, one naming a newer epoch is answered
/// UNKNOWN_LEADER_EPOCH, and -1 (a client that does not say) is served — on whichever
/// shard owns the partition.
#[test]
fn leader_epochs_in_fetch_and_list_offsets_are_checked_by_the_owner() {
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    create(&mut c, "epochs", 2, &[]);
    for partition in 0..2 {
        assert_eq!(
            produce(&mut c, "epochs", partition, 1, batch(&[b"e"], 1)).0,
            0
        );
        for (epoch, want) in [(0, 0), (-1, 0), (5, 75)] {
            let mut req = fetch_req("epochs", partition, 0, 0, 1);
            req.topics[0].partitions[0].current_leader_epoch = epoch;
            let resp: FetchResponse = c.call(api::FETCH, FETCH_V, &req);
            let p = &resp.responses[0].partitions[0];
            assert_eq!(
                p.error_code, want,
                "fetch, partition {partition}, epoch {epoch}"
            );
            let got = record_values(&p.records.clone().unwrap_or_default());
            assert_eq!(
                got.len(),
                usize::from(want == 0),
                "records only when served"
            );

            let lp = ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_timestamp(-1)
                .with_current_leader_epoch(epoch);
            let req = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![
                    ListOffsetsTopic::default()
                        .with_name(TopicName(s("epochs")))
                        .with_partitions(vec![lp]),
                ]);
            let resp: ListOffsetsResponse = c.call(api::LIST_OFFSETS, LIST_OFFSETS_V, &req);
            let lo = &resp.topics[0].partitions[0];
            assert_eq!(lo.error_code, want, "list offsets, epoch {epoch}");
            if want == 0 {
                assert_eq!((lo.offset, lo.leader_epoch), (1, 0));
            }
        }
    }
}

/// OffsetForLeaderEpoch on the real broker (KIP-101/279): epoch 0, the only one a single
/// node has, ends at the log end; an epoch the log never saw is unknown (-1, -1); a
/// `current_leader_epoch` newer than the partition's is UNKNOWN_LEADER_EPOCH. After a
/// restart the answer is the same (the `leader-epoch-checkpoint` file is Kafka's format).
#[test]
fn offset_for_leader_epoch_answers_from_the_epoch_checkpoint() {
    use kafka_protocol::messages::offset_for_leader_epoch_request::{
        OffsetForLeaderPartition, OffsetForLeaderTopic,
    };
    let mut broker = Broker::start(2, &[]);
    let mut c = broker.client();
    create(&mut c, "lineage", 2, &[]);
    for _ in 0..3 {
        assert_eq!(
            produce(&mut c, "lineage", 1, 1, batch(&[b"a", b"b"], 1)).0,
            0
        );
    }
    let ask = |c: &mut Client, epoch: i32, current: i32| {
        let p = OffsetForLeaderPartition::default()
            .with_partition(1)
            .with_current_leader_epoch(current)
            .with_leader_epoch(epoch);
        let req = OffsetForLeaderEpochRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![
                OffsetForLeaderTopic::default()
                    .with_topic(TopicName(s("lineage")))
                    .with_partitions(vec![p]),
            ]);
        let resp: OffsetForLeaderEpochResponse = c.call(api::OFFSET_FOR_LEADER_EPOCH, 4, &req);
        let p = &resp.topics[0].partitions[0];
        (p.error_code, p.leader_epoch, p.end_offset)
    };
    assert_eq!(
        ask(&mut c, 0, 0),
        (0, 0, 6),
        "the latest epoch ends at the log end"
    );
    assert_eq!(
        ask(&mut c, 3, -1),
        (0, -1, -1),
        "an epoch the log never saw"
    );
    assert_eq!(ask(&mut c, 0, 4).0, 75, "UNKNOWN_LEADER_EPOCH");
    broker.restart();
    let mut c = broker.client();
    assert_eq!(ask(&mut c, 0, 0), (0, 0, 6), "after a restart");
    let dir = broker.data_dir.path().join("lineage-1");
    let checkpoint = std::fs::read_to_string(dir.join("leader-epoch-checkpoint"))
        .expect("a leader-epoch-checkpoint in the partition dir");
    assert_eq!(
        checkpoint, "0\n1\n0 0\n",
        "Kafka's format: version, count, epoch start"
    );
}

/// Kafka refuses records without a key on a `cleanup.policy=compact` topic (the cleaner
/// could not tell which to keep): INVALID_RECORD, nothing appended; keyed records pass.
#[test]
fn a_compacted_topic_refuses_keyless_records() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "compacted", 1, &[("cleanup.policy", "compact")]);
    assert_eq!(
        produce(&mut c, "compacted", 0, 1, batch(&[b"no key"], 1)).0,
        87
    );
    let keyed = wire::batch::BatchBuilder {
        records: vec![wire::batch::NewRecord {
            timestamp_ms: 1,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"v")),
            headers: Vec::new(),
        }],
        ..wire::batch::BatchBuilder::default()
    }
    .build()
    .expect("a keyed batch");
    assert_eq!(produce(&mut c, "compacted", 0, 1, keyed), (0, 0));

    // Produce v8+ names each keyless record (librdkafka fails only those with
    // INVALID_RECORD and the rest of the batch as "a different record failed").
    let rec = |key: Option<&'static [u8]>| wire::batch::NewRecord {
        timestamp_ms: 1,
        key: key.map(Bytes::from_static),
        value: Some(Bytes::from_static(b"v")),
        headers: Vec::new(),
    };
    let mixed = wire::batch::BatchBuilder {
        records: vec![rec(Some(b"a")), rec(None), rec(Some(b"b")), rec(None)],
        ..wire::batch::BatchBuilder::default()
    }
    .build()
    .expect("a mixed batch");
    let resp: ProduceResponse = c.call(api::PRODUCE, 8, &produce_req("compacted", 0, 1, mixed));
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 87);
    let named: Vec<i32> = p.record_errors.iter().map(|e| e.batch_index).collect();
    assert_eq!(named, vec![1, 3], "{p:?}");
    assert!(p.error_message.is_some(), "{p:?}");
    // Nothing of the batch was appended: the next keyed batch lands at offset 1.
    let keyed = wire::batch::BatchBuilder {
        records: vec![rec(Some(b"c"))],
        ..wire::batch::BatchBuilder::default()
    }
    .build()
    .expect("a keyed batch");
    assert_eq!(produce(&mut c, "compacted", 0, 1, keyed), (0, 1));
}

/// Kafka's `message.timestamp.after.max.ms` (default one hour, as in Kafka 4) and
/// `message.timestamp.before.max.ms`: a CreateTime batch outside them is refused with
/// INVALID_TIMESTAMP. A timestamp far in the future would otherwise keep its segment,
/// and every later one, from time-based retention. LogAppendTime topics are not checked.
#[test]
fn timestamps_outside_the_topics_limits_are_refused() {
    const INVALID_TIMESTAMP: i16 = 32;
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "ts", 1, &[]);
    create(
        &mut c,
        "ts-before",
        1,
        &[("message.timestamp.before.max.ms", "60000")],
    );
    create(
        &mut c,
        "ts-append",
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64;
    let far_future = now + 2 * 3_600_000;
    assert_eq!(produce(&mut c, "ts", 0, 1, batch(&[b"now"], now)).0, 0);
    assert_eq!(
        produce(&mut c, "ts", 0, 1, batch(&[b"later"], far_future)).0,
        INVALID_TIMESTAMP
    );
    assert_eq!(
        produce(&mut c, "ts", 0, 1, batch(&[b"max"], i64::MAX)).0,
        INVALID_TIMESTAMP
    );
    assert_eq!(
        produce(&mut c, "ts", 0, 1, batch(&[b"2023"], 1_700_000_000_000)).0,
        0,
        "no limit before by default"
    );
    assert_eq!(
        produce(
            &mut c,
            "ts-before",
            0,
            1,
            batch(&[b"2023"], 1_700_000_000_000)
        )
        .0,
        INVALID_TIMESTAMP
    );
    assert_eq!(
        produce(&mut c, "ts-before", 0, 1, batch(&[b"now"], now)).0,
        0
    );
    assert_eq!(
        produce(&mut c, "ts-append", 0, 1, batch(&[b"later"], far_future)).0,
        0
    );

    // Every record is checked (KIP-937), not only the header's range: a far-future record
    // behind a header maxTimestamp of now is refused, and named.
    let with_max = |timestamps: &[i64], max: i64| {
        let b = wire::batch::BatchBuilder {
            records: timestamps
                .iter()
                .map(|t| wire::batch::NewRecord::value(*t, Bytes::from_static(b"r")))
                .collect(),
            ..Default::default()
        }
        .build()
        .expect("batch");
        let mut b = b.to_vec();
        b[35..43].copy_from_slice(&max.to_be_bytes());
        with_crc(b)
    };
    let hidden = with_max(&[now, far_future], now);
    let resp: ProduceResponse = c.call(api::PRODUCE, PRODUCE_V, &produce_req("ts", 0, 1, hidden));
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!(p.error_code, INVALID_TIMESTAMP, "{p:?}");
    let named: Vec<i32> = p.record_errors.iter().map(|e| e.batch_index).collect();
    assert_eq!(named, vec![1]);
    // A header maxTimestamp that is not its records' max is corrected, as Kafka's
    // LogValidator does: the max timestamp ListOffsets finds is the records'.
    create(&mut c, "ts-max", 1, &[]);
    let understated = with_max(&[now - 1000, now - 500], now - 1000);
    assert_eq!(produce(&mut c, "ts-max", 0, 1, understated), (0, 0));
    assert_eq!(list_offset(&mut c, "ts-max", 0, -3), (0, 1, now - 500));
}

/// A partition named twice in one ListOffsets gets INVALID_REQUEST for each entry, as in
/// Kafka (a lookup by timestamp may decompress a batch: one request must not repeat it
/// thousands of times); the others are answered.
#[test]
fn list_offsets_naming_a_partition_twice_is_refused_for_it() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "twice", 2, &[]);
    let p = |index| {
        ListOffsetsPartition::default()
            .with_partition_index(index)
            .with_timestamp(-1)
    };
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(TopicName(s("twice")))
                .with_partitions(vec![p(0), p(1)]),
            ListOffsetsTopic::default()
                .with_name(TopicName(s("twice")))
                .with_partitions(vec![p(0)]),
        ]);
    let resp: ListOffsetsResponse = c.call(api::LIST_OFFSETS, LIST_OFFSETS_V, &req);
    let codes: Vec<(i32, i16)> = resp
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.partition_index, p.error_code))
        })
        .collect();
    assert_eq!(codes, vec![(0, 42), (1, 0), (0, 42)]);
}

/// Whether the broker closed `c` (EOF or reset), as opposed to a read timing out.
fn closed_by_broker(c: &mut Client) -> bool {
    use std::io::{ErrorKind, Read};
    let mut b = [0u8; 1];
    match c.stream.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

/// acks=0 gets no answer, so a partition error would go unseen: as in Kafka
/// (`handleProduceRequest`), the connection is closed, and the producer refreshes its
/// metadata. An acks=0 produce that succeeds leaves the connection open.
#[test]
fn an_acks_0_produce_with_a_partition_error_closes_the_connection() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "quiet", 1, &[]);
    c.send(
        api::PRODUCE,
        PRODUCE_V,
        &produce_req("quiet", 0, 0, batch(&[b"ok"], 1)),
    );
    assert_eq!(
        produce(&mut c, "quiet", 0, 1, batch(&[b"next"], 1)),
        (0, 1),
        "still open after a good acks=0 produce"
    );
    c.send(
        api::PRODUCE,
        PRODUCE_V,
        &produce_req("quiet", 5, 0, batch(&[b"nowhere"], 1)),
    );
    assert!(
        closed_by_broker(&mut c),
        "closed after a failed acks=0 produce"
    );
    let mut other = broker.client();
    assert_eq!(
        produce(&mut other, "quiet", 0, 1, batch(&[b"x"], 1)),
        (0, 2)
    );
}

/// A partition named twice in one Produce gets INVALID_REQUEST for each entry and
/// nothing of either is appended (appending both would store the records twice); the
/// request's other partitions are appended.
#[test]
fn a_produce_naming_a_partition_twice_is_refused_for_it() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "twice", 2, &[]);
    let p = |index, value: &[u8]| {
        PartitionProduceData::default()
            .with_index(index)
            .with_records(Some(batch(&[value], 1)))
    };
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s("twice")))
                .with_partition_data(vec![p(0, b"a"), p(1, b"b")]),
            TopicProduceData::default()
                .with_name(TopicName(s("twice")))
                .with_partition_data(vec![p(0, b"c")]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, PRODUCE_V, &req);
    let codes: Vec<(i32, i16)> = resp
        .responses
        .iter()
        .flat_map(|t| {
            t.partition_responses
                .iter()
                .map(|p| (p.index, p.error_code))
        })
        .collect();
    assert_eq!(codes, vec![(0, 42), (1, 0), (0, 42)]);
    assert_eq!(list_offset(&mut c, "twice", 0, -1).1, 0, "nothing appended");
    assert_eq!(list_offset(&mut c, "twice", 1, -1).1, 1);
}

/// One record encoded by hand: value `value`, the given deltas, no key, no headers.
fn hand_record(offset_delta: i32, timestamp_delta: i64, value: &[u8]) -> Vec<u8> {
    let mut body = vec![0u8];
    wire::codec::put_varlong(&mut body, timestamp_delta);
    wire::codec::put_varint(&mut body, offset_delta);
    wire::codec::put_varint(&mut body, -1);
    wire::codec::put_varint(&mut body, value.len() as i32);
    body.extend_from_slice(value);
    wire::codec::put_varint(&mut body, 0);
    let mut out = Vec::new();
    wire::codec::put_varint(&mut out, body.len() as i32);
    out.extend_from_slice(&body);
    out
}

/// A batch around `body` (its records section, already compressed if `codec` says so)
/// claiming `count` records, with a correct CRC: what a buggy or hostile client can send.
fn hand_batch(codec: wire::batch::Compression, body: &[u8], count: i32) -> Bytes {
    let mut b = vec![0u8; wire::batch::BATCH_HEADER_SIZE];
    b.extend_from_slice(body);
    let length = (b.len() - wire::batch::LOG_OVERHEAD) as i32;
    b[8..12].copy_from_slice(&length.to_be_bytes());
    b[16] = wire::batch::MAGIC_V2;
    b[21..23].copy_from_slice(&codec.bits().to_be_bytes());
    b[23..27].copy_from_slice(&count.wrapping_sub(1).to_be_bytes());
    b[27..35].copy_from_slice(&1i64.to_be_bytes());
    b[35..43].copy_from_slice(&1i64.to_be_bytes());
    b[43..51].copy_from_slice(&(-1i64).to_be_bytes());
    b[51..53].copy_from_slice(&(-1i16).to_be_bytes());
    b[53..57].copy_from_slice(&(-1i32).to_be_bytes());
    b[57..61].copy_from_slice(&count.to_be_bytes());
    with_crc(b)
}

fn with_crc(mut b: Vec<u8>) -> Bytes {
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

/// `hand_batch` of `records` compressed with `codec`.
fn compressed(codec: wire::batch::Compression, records: &[Vec<u8>], count: i32) -> Bytes {
    let raw = records.concat();
    let body =
        wire::batch::compress(codec, &raw, wire::batch::SnappyFraming::Xerial).expect("compresses");
    hand_batch(codec, &body, count)
}

/// Kafka's `LogValidator` opens every produced batch and walks every record, compressed
/// ones too: a record count that is not the records present, an offsetDelta that is not
/// the record's index, or data that does not decompress is INVALID_RECORD, and nothing is
/// appended. Stored, such a batch makes Java consumers skip records or stop at it; a count
/// of i32::MAX in a 100-byte lz4 batch would move the log end by 2^31.
#[test]
fn compressed_batches_are_opened_and_every_record_checked() {
    use wire::batch::Compression;
    const INVALID_RECORD: i16 = 87;
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "walked", 1, &[]);
    let good = compressed(
        Compression::Lz4,
        &[hand_record(0, 0, b"a"), hand_record(1, 0, b"b")],
        2,
    );
    assert_eq!(produce(&mut c, "walked", 0, 1, good), (0, 0));
    let built = wire::batch::BatchBuilder {
        records: vec![wire::batch::NewRecord::value(1, Bytes::from_static(b"c"))],
        compression: Compression::Zstd,
        ..Default::default()
    }
    .build()
    .expect("zstd batch");
    assert_eq!(produce(&mut c, "walked", 0, 1, built), (0, 2));

    let refused = [
        (
            "offsetDelta 1000000 in a one-record lz4 batch",
            compressed(Compression::Lz4, &[hand_record(1_000_000, 0, b"x")], 1),
        ),
        (
            "three records claimed, two present",
            compressed(
                Compression::Gzip,
                &[hand_record(0, 0, b"x"), hand_record(1, 0, b"y")],
                3,
            ),
        ),
        (
            "one record claimed, two present",
            compressed(
                Compression::Snappy,
                &[hand_record(0, 0, b"x"), hand_record(1, 0, b"y")],
                1,
            ),
        ),
        (
            "gzip that does not decompress",
            hand_batch(Compression::Gzip, b"\x1f\x8b\x08\0 not gzip at all", 1),
        ),
        (
            "recordsCount i32::MAX in a small lz4 batch",
            compressed(Compression::Lz4, &[hand_record(0, 0, b"x")], i32::MAX),
        ),
    ];
    for (what, batch) in refused {
        let resp: ProduceResponse =
            c.call(api::PRODUCE, PRODUCE_V, &produce_req("walked", 0, 1, batch));
        let p = &resp.responses[0].partition_responses[0];
        assert_eq!(p.error_code, INVALID_RECORD, "{what}");
        assert!(p.error_message.is_some(), "{what}: {p:?}");
    }
    assert_eq!(
        list_offset(&mut c, "walked", 0, -1).1,
        3,
        "nothing appended"
    );
    let (err, _, records, _) = fetch(&mut c, "walked", 0, 0, 0);
    assert_eq!(err, 0);
    assert_eq!(
        record_values(&records),
        vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
    );
}

/// Kafka's `ProduceRequest.validateRecords`: from v3 a partition's records are exactly
/// one batch, else INVALID_RECORD. One batch bounds the decompression one request makes
/// a shard do for a partition.
#[test]
fn two_batches_for_one_partition_are_refused() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "one", 1, &[]);
    let mut two = batch(&[b"a"], 1).to_vec();
    two.extend_from_slice(&batch(&[b"b"], 1));
    for version in [3, PRODUCE_V] {
        let resp: ProduceResponse = c.call(
            api::PRODUCE,
            version,
            &produce_req("one", 0, 1, Bytes::from(two.clone())),
        );
        let p = &resp.responses[0].partition_responses[0];
        assert_eq!(p.error_code, 87, "v{version}");
    }
    assert_eq!(list_offset(&mut c, "one", 0, -1).1, 0, "nothing appended");
    assert_eq!(produce(&mut c, "one", 0, 1, batch(&[b"c"], 1)), (0, 0));
}

/// DeleteRecords up to `offset` on partition 0 of `topic`; returns the new log start.
fn delete_records(c: &mut Client, topic: &str, offset: i64) -> i64 {
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![
            DeleteRecordsTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(vec![
                    DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(offset),
                ]),
        ]);
    let resp: DeleteRecordsResponse = c.call(api::DELETE_RECORDS, 2, &req);
    let p = &resp.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.low_watermark
}

/// A batch of one record per timestamp, created at those times.
fn timed(timestamps: &[i64]) -> Bytes {
    wire::batch::BatchBuilder {
        records: timestamps
            .iter()
            .map(|t| wire::batch::NewRecord::value(*t, Bytes::from_static(b"t")))
            .collect(),
        ..Default::default()
    }
    .build()
    .expect("batch")
}

/// ListOffsets answers with records, not batches: -3 (KIP-734) with the first record
/// holding the max timestamp (on a LogAppendTime topic the batch's first record still in
/// the log); by time, never below the log start, and past a batch whose records left in
/// the log are all older than asked, as Kafka's `LogSegment.findOffsetByTimestamp`.
#[test]
fn list_offsets_answers_the_exact_record() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "max", 1, &[]);
    assert_eq!(
        produce(&mut c, "max", 0, 1, timed(&[4_000, 6_000, 5_000])),
        (0, 0)
    );
    assert_eq!(
        list_offset(&mut c, "max", 0, -3),
        (0, 1, 6_000),
        "the record with the max timestamp, not the batch's last"
    );

    create(
        &mut c,
        "append",
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    );
    assert_eq!(
        produce(&mut c, "append", 0, 1, timed(&[1, 2, 3, 4, 5])),
        (0, 0)
    );
    assert_eq!(delete_records(&mut c, "append", 2), 2);
    let (err, offset, _) = list_offset(&mut c, "append", 0, 0);
    assert_eq!((err, offset), (0, 2), "by time: not below the log start");
    let (err, offset, _) = list_offset(&mut c, "append", 0, -3);
    assert_eq!(
        (err, offset),
        (0, 2),
        "max timestamp: the batch's first record left"
    );

    // Batch 0-2 holds 9000 at offset 1, deleted; what is left of it is older than 8000.
    create(&mut c, "scan", 1, &[]);
    assert_eq!(
        produce(&mut c, "scan", 0, 1, timed(&[1_000, 9_000, 1_000])),
        (0, 0)
    );
    assert_eq!(produce(&mut c, "scan", 0, 1, timed(&[8_500])), (0, 3));
    assert_eq!(delete_records(&mut c, "scan", 2), 2);
    assert_eq!(list_offset(&mut c, "scan", 0, 8_000), (0, 3, 8_500));
}

/// Every batch stored in partition 0 of `topic`, as a consumer fetches them.
fn stored_batches(c: &mut Client, topic: &str) -> Vec<Bytes> {
    let (err, _, records, _) = fetch(c, topic, 0, 0, 0);
    assert_eq!(err, 0, "fetch {topic}");
    wire::batch::split_batches(&records)
        .map(|r| records.slice(r.expect("a valid batch from the broker")))
        .collect()
}

/// A batch's records, decoded.
fn records_of(batch: &Bytes) -> Vec<wire::batch::Record> {
    let (_, iter) = wire::batch::batch_records(batch, 1 << 20).expect("a valid batch");
    iter.map(|r| r.expect("record")).collect()
}

fn codec_of(batch: &[u8]) -> wire::batch::Compression {
    let header = wire::batch::read_header(batch).expect("header");
    header.attributes().compression().expect("a known codec")
}

/// Three records with keys, values and headers, from an idempotent producer at `seq`.
fn idempotent_batch(codec: wire::batch::Compression, seq: i32) -> Bytes {
    let records = (0..3)
        .map(|i| wire::batch::NewRecord {
            timestamp_ms: clients_now_ms() + i,
            key: Some(Bytes::from(format!("key-{seq}-{i}"))),
            value: Some(Bytes::from(vec![b'v'; 500 + i as usize])),
            headers: vec![(Bytes::from_static(b"id"), Some(Bytes::from(format!("{i}"))))],
        })
        .collect();
    wire::batch::BatchBuilder {
        producer_id: wire::ProducerId(4000),
        producer_epoch: wire::ProducerEpoch(0),
        base_sequence: wire::Sequence(seq),
        compression: codec,
        records,
        ..Default::default()
    }
    .build()
    .expect("batch")
}

fn clients_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A topic's `compression.type` (Kafka's `LogValidator`): a client's batch in another
/// codec is stored in the topic's, with its producer id, epoch, sequence, timestamps
/// and records as sent; a batch already in it, or any batch under `producer`, is stored
/// byte for byte as sent. A resent idempotent batch is still a duplicate.
#[test]
fn compression_type_stores_batches_in_the_topics_codec() {
    use wire::batch::Compression;
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "to-zstd", 1, &[("compression.type", "zstd")]);
    let sent = idempotent_batch(Compression::None, 0);
    assert_eq!(produce(&mut c, "to-zstd", 0, 1, sent.clone()), (0, 0));
    assert_eq!(
        produce(&mut c, "to-zstd", 0, 1, sent.clone()),
        (0, 0),
        "a resent batch is a duplicate: its first offset again"
    );
    let already = idempotent_batch(Compression::Zstd, 3);
    assert_eq!(produce(&mut c, "to-zstd", 0, 1, already.clone()), (0, 3));
    assert_eq!(list_offset(&mut c, "to-zstd", 0, -1).1, 6, "nothing twice");
    let stored = stored_batches(&mut c, "to-zstd");
    assert_eq!(stored.len(), 2);
    assert_eq!(codec_of(&stored[0]), Compression::Zstd);
    let (was, now) = (
        wire::batch::read_header(&sent).expect("sent"),
        wire::batch::read_header(&stored[0]).expect("stored"),
    );
    assert_eq!(now.producer_id(), was.producer_id());
    assert_eq!(now.producer_epoch(), was.producer_epoch());
    assert_eq!(now.base_sequence(), was.base_sequence());
    assert_eq!(now.base_timestamp(), was.base_timestamp());
    assert_eq!(now.max_timestamp(), was.max_timestamp());
    assert_eq!(records_of(&stored[0]), records_of(&sent));
    assert_eq!(
        &stored[1][17..],
        &already[17..],
        "already in the topic's codec: as sent, CRC included"
    );

    create(
        &mut c,
        "to-none",
        1,
        &[("compression.type", "uncompressed")],
    );
    let gzip = idempotent_batch(Compression::Gzip, 0);
    assert_eq!(produce(&mut c, "to-none", 0, 1, gzip.clone()), (0, 0));
    let stored = stored_batches(&mut c, "to-none");
    assert_eq!(codec_of(&stored[0]), Compression::None);
    assert_eq!(records_of(&stored[0]), records_of(&gzip));

    create(&mut c, "as-sent", 1, &[]);
    let lz4 = idempotent_batch(Compression::Lz4, 0);
    assert_eq!(produce(&mut c, "as-sent", 0, 1, lz4.clone()), (0, 0));
    let stored = stored_batches(&mut c, "as-sent");
    assert_eq!(&stored[0][17..], &lz4[17..], "producer: stored as sent");

    // LogAppendTime still stamps a rewritten batch with the append time.
    create(
        &mut c,
        "append-lz4",
        1,
        &[
            ("compression.type", "lz4"),
            ("message.timestamp.type", "LogAppendTime"),
        ],
    );
    let before = clients_now_ms();
    let plain = batch(&[b"a", b"b"], 1_000);
    assert_eq!(produce(&mut c, "append-lz4", 0, 1, plain), (0, 0));
    let stored = stored_batches(&mut c, "append-lz4");
    let header = wire::batch::read_header(&stored[0]).expect("stored");
    assert_eq!(codec_of(&stored[0]), Compression::Lz4);
    assert_eq!(
        header.attributes().timestamp_type(),
        wire::batch::TimestampType::LogAppendTime
    );
    assert!(
        header.max_timestamp() >= before,
        "{}",
        header.max_timestamp()
    );
    assert_eq!(
        record_values(&stored[0]),
        vec![b"a".to_vec(), b"b".to_vec()]
    );
}

/// KIP-390: a batch the topic's `compression.type` rewrites is compressed at the topic's
/// `compression.gzip.level` / `compression.zstd.level`, else at the broker's, else at the
/// codec's default. Smaller at gzip 9 than at 1, at zstd 19 (the broker's default here)
/// than at 1; the records read back as sent either way.
#[test]
fn compression_levels_set_how_far_a_rewritten_batch_is_compressed() {
    let broker = Broker::start(1, &[("compression.zstd.level", "19")]);
    let mut c = broker.client();
    let words = [
        "offset", "epoch", "leader", "replica", "segment", "fetch", "batch",
    ];
    let values: Vec<Vec<u8>> = (0..60usize)
        .map(|i| {
            (0..60usize)
                .map(|j| format!("{}-{} ", words[(i * 7 + j * j) % words.len()], (i * j) % 97))
                .collect::<String>()
                .into_bytes()
        })
        .collect();
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let mut stored_size = |topic: &str, configs: &[(&str, &str)]| {
        create(&mut c, topic, 1, configs);
        assert_eq!(produce(&mut c, topic, 0, 1, batch(&refs, 1_000)), (0, 0));
        let stored = stored_batches(&mut c, topic);
        assert_eq!(stored.len(), 1, "{topic}");
        assert_eq!(
            record_values(&stored[0]),
            values,
            "{topic}: records as sent"
        );
        stored[0].len()
    };
    let gzip1 = stored_size(
        "gzip-1",
        &[
            ("compression.type", "gzip"),
            ("compression.gzip.level", "1"),
        ],
    );
    let gzip9 = stored_size(
        "gzip-9",
        &[
            ("compression.type", "gzip"),
            ("compression.gzip.level", "9"),
        ],
    );
    assert!(gzip9 < gzip1, "gzip 9: {gzip9} bytes, gzip 1: {gzip1}");
    let zstd1 = stored_size(
        "zstd-1",
        &[
            ("compression.type", "zstd"),
            ("compression.zstd.level", "1"),
        ],
    );
    let zstd_broker = stored_size("zstd-broker", &[("compression.type", "zstd")]);
    assert!(
        zstd_broker < zstd1,
        "zstd at the broker's 19: {zstd_broker} bytes, zstd 1: {zstd1}"
    );
}

/// Kafka checks `max.message.bytes` again after recompression (RecordTooLargeException):
/// a gzip batch within it that is larger uncompressed is MESSAGE_TOO_LARGE on an
/// `uncompressed` topic, and nothing is appended.
#[test]
fn a_batch_too_large_in_the_topics_codec_is_refused() {
    use wire::batch::Compression;
    const MESSAGE_TOO_LARGE: i16 = 10;
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(
        &mut c,
        "small",
        1,
        &[
            ("compression.type", "uncompressed"),
            ("max.message.bytes", "2000"),
        ],
    );
    let gzip_of_zeros = |n: usize| {
        wire::batch::BatchBuilder {
            records: vec![wire::batch::NewRecord::value(1, vec![0u8; n])],
            compression: Compression::Gzip,
            ..Default::default()
        }
        .build()
        .expect("gzip batch")
    };
    let big = gzip_of_zeros(10_000);
    assert!(big.len() < 2000, "{} bytes compressed", big.len());
    let resp: ProduceResponse = c.call(api::PRODUCE, PRODUCE_V, &produce_req("small", 0, 1, big));
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!(p.error_code, MESSAGE_TOO_LARGE, "{p:?}");
    assert_eq!(list_offset(&mut c, "small", 0, -1).1, 0, "nothing appended");
    let fits = gzip_of_zeros(1_000);
    assert_eq!(produce(&mut c, "small", 0, 1, fits), (0, 0));
    assert_eq!(
        codec_of(&stored_batches(&mut c, "small")[0]),
        Compression::None
    );
}

/// The broker's `compression.type` is the default of topics without their own; a
/// topic's own value set or removed with IncrementalAlterConfigs, and the broker's set
/// at runtime, apply to the next produce.
#[test]
fn a_changed_compression_type_applies_to_later_produces() {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use wire::batch::Compression;
    let broker = Broker::start(1, &[("compression.type", "snappy")]);
    let mut c = broker.client();
    create(&mut c, "changing", 1, &[]);
    const TOPIC: i8 = 2;
    const BROKER: i8 = 4;
    let alter_resource = |c: &mut Client, (kind, name): (i8, &str), op: i8, value: &str| {
        let resource = AlterConfigsResource::default()
            .with_resource_type(kind)
            .with_resource_name(s(name))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(s("compression.type"))
                    .with_config_operation(op)
                    .with_value(Some(s(value))),
            ]);
        let resp: IncrementalAlterConfigsResponse = c.call(
            api::INCREMENTAL_ALTER_CONFIGS,
            1,
            &IncrementalAlterConfigsRequest::default().with_resources(vec![resource]),
        );
        assert_eq!(resp.responses[0].error_code, 0, "{op} {value}");
    };
    let alter =
        |c: &mut Client, op: i8, value: &str| alter_resource(c, (TOPIC, "changing"), op, value);
    let plain = || batch(&[b"x"], 1);
    assert_eq!(produce(&mut c, "changing", 0, 1, plain()), (0, 0));
    alter(&mut c, 0, "producer");
    assert_eq!(produce(&mut c, "changing", 0, 1, plain()), (0, 1));
    alter(&mut c, 0, "gzip");
    assert_eq!(produce(&mut c, "changing", 0, 1, plain()), (0, 2));
    alter(&mut c, 1, "");
    assert_eq!(produce(&mut c, "changing", 0, 1, plain()), (0, 3));
    // The cluster-wide dynamic default, over the static one.
    alter_resource(&mut c, (BROKER, ""), 0, "zstd");
    assert_eq!(produce(&mut c, "changing", 0, 1, plain()), (0, 4));
    let codecs: Vec<Compression> = stored_batches(&mut c, "changing")
        .iter()
        .map(|b| codec_of(b))
        .collect();
    assert_eq!(
        codecs,
        vec![
            Compression::Snappy,
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Zstd
        ]
    );
}

/// Kafka's rule for clients from before zstd (KIP-110): Fetch below v10 gets
/// UNSUPPORTED_COMPRESSION_TYPE and no records for a partition whose answer holds a zstd
/// batch; v10 and later, and partitions without zstd, are served as before.
#[test]
fn a_fetch_below_v10_is_refused_zstd_batches() {
    use wire::batch::Compression;
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, "zstd-old", 1, &[]);
    create(&mut c, "gzip-old", 1, &[]);
    assert_eq!(
        produce(
            &mut c,
            "zstd-old",
            0,
            1,
            idempotent_batch(Compression::Zstd, 0)
        ),
        (0, 0)
    );
    assert_eq!(
        produce(
            &mut c,
            "gzip-old",
            0,
            1,
            idempotent_batch(Compression::Gzip, 0)
        ),
        (0, 0)
    );
    let at = |c: &mut Client, topic: &str, version: i16| {
        let resp: FetchResponse = c.call(api::FETCH, version, &fetch_req(topic, 0, 0, 0, 1));
        let p = &resp.responses[0].partitions[0];
        (p.error_code, p.records.as_ref().map_or(0, |r| r.len()))
    };
    let (code, bytes) = at(&mut c, "zstd-old", 9);
    assert_eq!(
        (code, bytes),
        (76, 0),
        "UNSUPPORTED_COMPRESSION_TYPE, no records"
    );
    let (code, bytes) = at(&mut c, "zstd-old", 10);
    assert_eq!(code, 0);
    assert!(bytes > 0, "v10 reads zstd");
    let (code, bytes) = at(&mut c, "gzip-old", 9);
    assert_eq!(code, 0);
    assert!(bytes > 0, "gzip is served to v9");
}

/// A topic's `segment.index.bytes` takes effect: with 64 bytes (8 offset or 5 time
/// entries) and an index entry per batch, its segments roll whenever the index fills,
/// every index file stays within it, and every record reads back by offset and by time.
#[test]
fn a_topics_segment_index_bytes_rolls_its_segments_when_the_index_fills() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    let cfg = [("segment.index.bytes", "64"), ("index.interval.bytes", "0")];
    create(&mut c, "small-index", 1, &cfg);
    let now = clients_now_ms();
    for i in 0..40 {
        let value = format!("v{i}");
        let produced = produce(
            &mut c,
            "small-index",
            0,
            1,
            batch(&[value.as_bytes()], now + i),
        );
        assert_eq!(produced, (0, i));
    }
    let dir = broker.data_dir.path().join("small-index-0");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let logs = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"));
    assert!(logs.count() >= 6, "segments rolled: {files:?}");
    for path in &files {
        if path
            .extension()
            .is_some_and(|e| e == "index" || e == "timeindex")
        {
            let len = std::fs::metadata(path).unwrap().len();
            assert!(len <= 64, "{} is {len} bytes", path.display());
        }
    }
    for i in 0..40 {
        let (code, _, records, _) = fetch(&mut c, "small-index", 0, i, 0);
        assert_eq!(code, 0);
        let values = record_values(&records);
        assert_eq!(
            values.first(),
            Some(&format!("v{i}").into_bytes()),
            "at {i}"
        );
    }
    assert_eq!(
        list_offset(&mut c, "small-index", 0, now + 25),
        (0, 25, now + 25)
    );
}
