//! ListOffsets (earliest -2, latest -1, max timestamp -3, by timestamp), DeleteRecords and
//! OffsetForLeaderEpoch (where a leader epoch ends in the log, KIP-101/279: what a replica
//! becoming follower truncates to), each partition answered by its owning shard.
//! DeleteRecords on an internal topic is refused with INVALID_TOPIC_EXCEPTION. A
//! ListOffsets, DeleteRecords or OffsetForLeaderEpoch naming more than
//! `PARTITIONS_PER_REQUEST_MAX` partition entries is undecodable (connection closed).

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{
    DeleteRecordsRequest, DeleteRecordsResponse, ListOffsetsRequest, ListOffsetsResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
};

use std::time::{Duration, Instant};

use wire::{LeaderEpoch, Offset};

use super::topic_name;
use crate::errors;
use crate::partition::ListedOffset;
use crate::partition::Lister;
use crate::shard::{DeleteRecordsCall, EpochEndCall, ListOffsetCall, Shard};

/// Longest a ListOffsets partition may take on its owner.
const LIST_OFFSETS_TIMEOUT: Duration = Duration::from_secs(30);
/// DeleteRecords' own `timeout_ms` is used when positive, else this.
const DELETE_RECORDS_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// How long past its `timeout_ms` a DeleteRecords partition's call may take: the log
/// start's move itself is never cut short by a short timeout.
const DELETE_RECORDS_CALL_SLACK: Duration = Duration::from_secs(30);

/// Most partition entries one ListOffsets or OffsetForLeaderEpoch may name (as Fetch and
/// Produce): each costs a task and a call to its owner, all queued at once. Past it the
/// request is refused as undecodable (the connection is closed).
pub const PARTITIONS_PER_REQUEST_MAX: usize = 100_000;

/// The partition entries a ListOffsets names (for [`PARTITIONS_PER_REQUEST_MAX`]).
pub fn list_offsets_partitions(req: &ListOffsetsRequest) -> usize {
    req.topics.iter().map(|t| t.partitions.len()).sum()
}

/// The partition entries an OffsetForLeaderEpoch names (for
/// [`PARTITIONS_PER_REQUEST_MAX`]).
pub fn epoch_end_partitions(req: &OffsetForLeaderEpochRequest) -> usize {
    req.topics.iter().map(|t| t.partitions.len()).sum()
}

/// ListOffsets.
/// `leader_epoch` exists from v4; encoding it earlier is an error.
pub async fn list_offsets(
    shard: &Rc<Shard>,
    req: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    // Kafka answers every entry of a partition named twice with INVALID_REQUEST, unread
    // (a lookup by timestamp may decompress a batch: one request must not repeat it).
    let mut named: HashMap<(&str, i32), usize> = HashMap::new();
    for t in &req.topics {
        for p in &t.partitions {
            *named
                .entry((t.name.0.as_str(), p.partition_index))
                .or_default() += 1;
        }
    }
    let duplicated: HashSet<(String, i32)> = named
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((t, p), _)| (t.to_string(), p))
        .collect();
    let mut topics = Vec::new();
    for t in req.topics {
        let name: Arc<str> = Arc::from(t.name.0.as_str());
        let tasks: Vec<_> = t
            .partitions
            .iter()
            .map(|p| {
                if duplicated.contains(&(name.to_string(), p.partition_index)) {
                    return (p.partition_index, None);
                }
                let tp = (name.clone(), p.partition_index);
                let call = ListOffsetCall {
                    tp: tp.clone(),
                    timestamp: p.timestamp,
                    current_epoch: LeaderEpoch(p.current_leader_epoch),
                    asker: Lister {
                        // v2+: read_committed's latest offset is the LSO (Kafka's rule).
                        read_committed: version >= 2 && req.isolation_level == 1,
                        consumer: req.replica_id.0 == -1,
                        // Kafka checks every client request from v1 (v0 has its own path).
                        lagging_hw_error: (version >= 1 && req.replica_id.0 == -1).then_some(
                            match version >= 5 {
                                true => errors::OFFSET_NOT_AVAILABLE,
                                false => errors::LEADER_NOT_AVAILABLE,
                            },
                        ),
                    },
                };
                let s = shard.clone();
                let deadline = Instant::now() + LIST_OFFSETS_TIMEOUT;
                let task =
                    glommio::spawn_local(async move { s.call_owner(&tp, call, deadline).await });
                (p.partition_index, Some(task))
            })
            .collect();
        let mut partitions = Vec::new();
        for (index, task) in tasks {
            let listed = match task {
                Some(task) => task
                    .await
                    .unwrap_or_else(|e| ListedOffset::failed(e.code())),
                None => ListedOffset::failed(errors::INVALID_REQUEST),
            };
            let epoch = if version >= 4 && listed.error == errors::NONE && listed.offset.get() >= 0
            {
                listed.leader_epoch
            } else {
                LeaderEpoch::NONE
            };
            partitions.push(
                ListOffsetsPartitionResponse::default()
                    .with_partition_index(index)
                    .with_error_code(listed.error)
                    .with_timestamp(listed.timestamp)
                    .with_offset(listed.offset.get())
                    .with_leader_epoch(epoch.get()),
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

/// The partition entries a DeleteRecords names (for [`PARTITIONS_PER_REQUEST_MAX`]).
pub fn delete_records_partitions(req: &DeleteRecordsRequest) -> usize {
    req.topics.iter().map(|t| t.partitions.len()).sum()
}

/// DeleteRecords: moves each partition's log start offset up, and answers once the
/// replicas have followed or the request's `timeout_ms` passed (see
/// `Partition::delete_records`). The partitions of every topic wait concurrently, each on
/// its owner, so one partition's wait does not eat the others' time.
pub async fn delete_records(shard: &Rc<Shard>, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let timeout = match u64::try_from(req.timeout_ms) {
        Ok(ms) if ms > 0 => Duration::from_millis(ms),
        _ => DELETE_RECORDS_TIMEOUT_DEFAULT,
    };
    let now = Instant::now();
    let replicated_by = now + timeout;
    // The call's own deadline is later: the wait answers REQUEST_TIMED_OUT itself.
    let deadline = replicated_by + DELETE_RECORDS_CALL_SLACK;
    // Every topic's partitions are started before any is awaited: they share one wait,
    // as in Kafka's delayed operation (topic by topic, a later topic started only after an
    // earlier one had waited out the timeout, and answered REQUEST_TIMED_OUT after its
    // records were deleted) (found by review).
    let mut started = Vec::new();
    for t in req.topics {
        let name: Arc<str> = Arc::from(t.name.0.as_str());
        let tasks: Vec<_> = t
            .partitions
            .iter()
            .map(|p| {
                let tp = (name.clone(), p.partition_index);
                let call = DeleteRecordsCall {
                    tp: tp.clone(),
                    offset: Offset(p.offset),
                    replicated_by,
                };
                // Internal topics lose records only by their coordinator's compaction
                // (Kafka: "Cannot delete records of internal topic").
                let task = (!crate::metadata::is_internal(&name)).then(|| {
                    let s = shard.clone();
                    glommio::spawn_local(async move { s.call_owner(&tp, call, deadline).await })
                });
                (p.partition_index, task)
            })
            .collect();
        started.push((name, tasks));
    }
    let mut topics = Vec::new();
    for (name, tasks) in started {
        let mut partitions = Vec::new();
        for (index, task) in tasks {
            let answer = match task {
                None => Err(errors::INVALID_TOPIC_EXCEPTION),
                Some(task) => match task.await {
                    Ok(result) => result,
                    Err(e) => Err(e.code()),
                },
            };
            let (error, low) = match answer {
                Ok(low) => (errors::NONE, low.get()),
                Err(code) => (code, -1),
            };
            partitions.push(
                DeleteRecordsPartitionResult::default()
                    .with_partition_index(index)
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

/// OffsetForLeaderEpoch: for each partition, the end offset of the requested epoch in
/// the owner's log (the partitions of a topic asked concurrently).
pub async fn offset_for_leader_epoch(
    shard: &Rc<Shard>,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let deadline = Instant::now() + LIST_OFFSETS_TIMEOUT;
    let mut topics = Vec::new();
    for t in req.topics {
        let name: Arc<str> = Arc::from(t.topic.0.as_str());
        let tasks: Vec<_> = t
            .partitions
            .iter()
            .map(|p| {
                let tp = (name.clone(), p.partition);
                let call = EpochEndCall {
                    tp: tp.clone(),
                    epoch: LeaderEpoch(p.leader_epoch),
                    current_epoch: LeaderEpoch(p.current_leader_epoch),
                };
                let s = shard.clone();
                let task = async move { s.call_owner(&tp, call, deadline).await };
                (p.partition, glommio::spawn_local(task))
            })
            .collect();
        let mut partitions = Vec::with_capacity(tasks.len());
        for (index, task) in tasks {
            let answer = task.await.unwrap_or_else(|e| Err(e.code()));
            let (error, (epoch, end)) = match answer {
                Ok(found) => (errors::NONE, found),
                Err(code) => (code, (LeaderEpoch::NONE, Offset::NONE)),
            };
            partitions.push(
                EpochEndOffset::default()
                    .with_partition(index)
                    .with_error_code(error)
                    .with_leader_epoch(epoch.get())
                    .with_end_offset(end.get()),
            );
        }
        topics.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(topic_name(&name))
                .with_partitions(partitions),
        );
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
