//! Kafka requests several broker tests send, each one call on the raw [`Client`] with the
//! answer reduced to what the tests compare (error codes, offsets).

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

use super::Client;

/// ListOffsets timestamp of the log end (the next offset).
pub const LATEST: i64 = -1;
/// ListOffsets timestamp of the log start.
pub const EARLIEST: i64 = -2;

pub fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// CreateTopics (v7) of `(name, partitions)`, replication factor 1; the error code of each.
pub fn create_topics(c: &mut Client, topics: &[(&str, i32)]) -> Vec<i16> {
    let topics = topics
        .iter()
        .map(|(name, partitions)| {
            CreatableTopic::default()
                .with_name(TopicName(s(name)))
                .with_num_partitions(*partitions)
                .with_replication_factor(1)
        })
        .collect();
    let req = CreateTopicsRequest::default()
        .with_topics(topics)
        .with_timeout_ms(5000);
    let resp: CreateTopicsResponse = c.call(api::CREATE_TOPICS, 7, &req);
    resp.topics.iter().map(|t| t.error_code).collect()
}

/// FindCoordinator, which creates `__consumer_offsets` on first use.
pub fn find_coordinator(c: &mut Client, group: &str) {
    let req = FindCoordinatorRequest::default().with_key(s(group));
    let resp: FindCoordinatorResponse = c.call(api::FIND_COORDINATOR, 3, &req);
    assert_eq!(resp.error_code, 0, "FindCoordinator");
}

/// A simple consumer's commit (no generation) of `(partition, offset, metadata)` to
/// `topic`; the error code of each partition.
pub fn commit_offsets(
    c: &mut Client,
    group: &str,
    topic: &str,
    offsets: &[(i32, i64, &str)],
) -> Vec<i16> {
    let partitions = offsets
        .iter()
        .map(|(p, o, m)| {
            OffsetCommitRequestPartition::default()
                .with_partition_index(*p)
                .with_committed_offset(*o)
                .with_committed_metadata(Some(s(m)))
        })
        .collect();
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(partitions),
        ]);
    let resp: OffsetCommitResponse = c.call(api::OFFSET_COMMIT, 8, &req);
    resp.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect()
}

/// The committed (offset, metadata) of `partitions` of `topic` in `group` (OffsetFetch
/// v7; every error code must be 0).
pub fn fetch_offsets(
    c: &mut Client,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> Vec<(i64, String)> {
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(Some(vec![
            OffsetFetchRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partition_indexes(partitions.to_vec()),
        ]));
    let resp: OffsetFetchResponse = c.call(api::OFFSET_FETCH, 7, &req);
    assert_eq!(resp.error_code, 0, "OffsetFetch {group}");
    let t = resp.topics.first().expect("the topic");
    t.partitions
        .iter()
        .map(|p| {
            assert_eq!(p.error_code, 0, "OffsetFetch {group}/{}", p.partition_index);
            let meta = p.metadata.as_ref().map(|m| m.to_string());
            (p.committed_offset, meta.unwrap_or_default())
        })
        .collect()
}

/// The offset ListOffsets (v6) answers for `timestamp` ([`EARLIEST`], [`LATEST`]) of
/// `topic`/`partition`.
pub fn list_offset(c: &mut Client, topic: &str, partition: i32, timestamp: i64) -> i64 {
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(partition)
                        .with_timestamp(timestamp),
                ]),
        ]);
    let resp: ListOffsetsResponse = c.call(api::LIST_OFFSETS, 6, &req);
    let p = &resp.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "ListOffsets");
    p.offset
}

/// Most fetches per partition before [`fetch_values`] gives up (each returns at least one
/// batch while the partition has more).
const FETCHES_MAX: usize = 1_000;

/// Every record value of each partition, from offset 0 up to its high watermark, read
/// as a consumer reads: fetch (v12, 1 MiB), continue after the last batch returned. Every
/// batch is CRC-checked.
pub fn fetch_values(c: &mut Client, topic: &str, partitions: &[i32]) -> Vec<(i32, Vec<Vec<u8>>)> {
    partitions
        .iter()
        .map(|&p| {
            let (mut offset, mut values) = (0i64, Vec::new());
            for _ in 0..FETCHES_MAX {
                let (high_watermark, records) = fetch_at(c, topic, p, offset);
                if offset >= high_watermark {
                    return (p, values);
                }
                for range in wire::batch::split_batches(&records) {
                    let one = records.slice(range.expect("valid batch from the broker"));
                    let (header, iter) =
                        wire::batch::batch_records(&one, 1 << 20).expect("records");
                    offset = header.last_offset().get() + 1;
                    for rec in iter {
                        let value = rec.expect("record").value.map(|v| v.to_vec());
                        values.push(value.unwrap_or_default());
                    }
                }
            }
            panic!("partition {p}: still below its high watermark after {FETCHES_MAX} fetches");
        })
        .collect()
}

/// One Fetch (v12) of `partition` from `offset`, at most 1 MiB: (high watermark, records).
pub fn fetch_at(c: &mut Client, topic: &str, partition: i32, offset: i64) -> (i64, Bytes) {
    let part = FetchPartition::default()
        .with_partition(partition)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(1 << 20);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(s(topic)))
                .with_partitions(vec![part]),
        ]);
    let resp: FetchResponse = c.call(api::FETCH, 12, &req);
    let p = &resp.responses[0].partitions[0];
    assert_eq!(
        p.error_code, 0,
        "fetch of partition {partition} at {offset}"
    );
    (p.high_watermark, p.records.clone().unwrap_or_default())
}
