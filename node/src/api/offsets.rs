//! ListOffsets (earliest -2, latest -1, max timestamp -3, by timestamp) and DeleteRecords,
//! each partition answered by its owning shard. DeleteRecords on an internal topic is
//! refused with INVALID_TOPIC_EXCEPTION.

use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{
    DeleteRecordsRequest, DeleteRecordsResponse, ListOffsetsRequest, ListOffsetsResponse,
};

use super::topic_name;
use crate::errors;
use crate::partition::LEADER_EPOCH;
use crate::shard::{Op, Reply, Shard};

/// ListOffsets.
/// `leader_epoch` exists from v4; encoding it earlier is an error.
pub async fn list_offsets(
    shard: &Rc<Shard>,
    req: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let mut topics = Vec::new();
    for t in req.topics {
        let name: Arc<str> = Arc::from(t.name.0.as_str());
        let tasks: Vec<_> = t
            .partitions
            .iter()
            .map(|p| {
                let tp = (name.clone(), p.partition_index);
                let op = Op::ListOffset {
                    tp: tp.clone(),
                    timestamp: p.timestamp,
                };
                let s = shard.clone();
                (
                    p.partition_index,
                    glommio::spawn_local(async move { s.call_owner(&tp, op).await }),
                )
            })
            .collect();
        let mut partitions = Vec::new();
        for (index, task) in tasks {
            let (error, timestamp, offset) = match task.await {
                Reply::ListOffset {
                    error,
                    timestamp,
                    offset,
                } => (error, timestamp, offset),
                Reply::Refused(code) => (code, -1, -1),
                _ => (errors::UNKNOWN_SERVER_ERROR, -1, -1),
            };
            let epoch = if version >= 4 && error == errors::NONE && offset >= 0 {
                LEADER_EPOCH.get()
            } else {
                -1
            };
            partitions.push(
                ListOffsetsPartitionResponse::default()
                    .with_partition_index(index)
                    .with_error_code(error)
                    .with_timestamp(timestamp)
                    .with_offset(offset)
                    .with_leader_epoch(epoch),
            );
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(topic_name(&name))
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// DeleteRecords: moves each partition's log start offset up.
pub async fn delete_records(shard: &Rc<Shard>, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut topics = Vec::new();
    for t in req.topics {
        let name: Arc<str> = Arc::from(t.name.0.as_str());
        let mut partitions = Vec::new();
        for p in &t.partitions {
            let tp = (name.clone(), p.partition_index);
            let op = Op::DeleteRecords {
                tp: tp.clone(),
                offset: p.offset,
            };
            // Internal topics lose records only by their coordinator's compaction (Kafka:
            // "Cannot delete records of internal topic").
            let answer = match crate::metadata::is_internal(&name) {
                true => Reply::Refused(errors::INVALID_TOPIC_EXCEPTION),
                false => shard.call_owner(&tp, op).await,
            };
            let (error, low) = match answer {
                Reply::DeleteRecords {
                    error,
                    low_watermark,
                } => (error, low_watermark),
                Reply::Refused(code) => (code, -1),
                _ => (errors::UNKNOWN_SERVER_ERROR, -1),
            };
            partitions.push(
                DeleteRecordsPartitionResult::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(error)
                    .with_low_watermark(low),
            );
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(topic_name(&name))
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}
