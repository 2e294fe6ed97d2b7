//! Kafka requests several broker tests send, each one call on the raw [`Client`] with the
//! answer reduced to what the tests compare (error codes, offsets).

use kafka_protocol::messages::create_topics_request::CreatableTopic;
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
