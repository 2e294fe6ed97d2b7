//! The replica admin APIs, answered truthfully for a single node: DescribeLogDirs (one
//! log dir, each partition's size on disk, no lag), AlterReplicaLogDirs (the only dir is
//! where every replica already is), ElectLeaders (every partition's only replica leads:
//! ELECTION_NOT_NEEDED), AlterPartitionReassignments (only this node's id is a valid
//! replica set, and it is the current one) and ListPartitionReassignments (none ongoing).
//! Real answers come with replication; these already tell a client what is true now.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
    AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, DescribeLogDirsRequest,
    DescribeLogDirsResponse, ElectLeadersRequest, ElectLeadersResponse,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
};

use super::{str_bytes, topic_name};
use crate::controller::{Command, Outcome};
use crate::errors;
use crate::metadata::Catalog;
use crate::shard::Shard;

/// ElectLeaders' election type for the preferred replica (1 is unclean).
const ELECTION_PREFERRED: i8 = 0;

/// Whether `partition` of `topic` exists in the catalogue.
fn exists(catalog: &Catalog, topic: &str, partition: i32) -> bool {
    catalog
        .topics
        .get(topic)
        .is_some_and(|t| (0..t.partitions).contains(&partition))
}

/// Whether `node` holds a replica of `partition` of `topic`: named in its assignment in a
/// cluster; every existing partition on a single node (no assignment recorded).
fn hosted(catalog: &Catalog, node: i32, topic: &str, partition: i32) -> bool {
    let Some(t) = catalog.topics.get(topic) else {
        return false;
    };
    if !(0..t.partitions).contains(&partition) {
        return false;
    }
    usize::try_from(partition)
        .ok()
        .and_then(|i| t.assignment.get(i))
        .is_none_or(|a| a.replicas.contains(&node))
}

/// The data dir as clients see it: absolute, symlinks resolved where possible.
fn log_dir(shard: &Shard) -> PathBuf {
    let dir = &shard.config().data_dir;
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone())
}

/// DescribeLogDirs: the one log dir, with every asked-for partition this node holds a
/// replica of (all of them for a null topic list). A partition's size is the bytes of its `.log` segment
/// files on disk (Kafka reports the segments' sizes; weir's files hold the written data,
/// the last block of an active segment padded to 4 KiB). Offset lag is 0: there are no
/// future replicas to catch up.
pub async fn describe_log_dirs(
    shard: &Rc<Shard>,
    req: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    let catalog = shard.catalog();
    let node = shard.config().node_id;
    let wanted: Vec<(String, Vec<i32>)> = match &req.topics {
        None => catalog
            .topics
            .values()
            .map(|t| {
                let parts = (0..t.partitions)
                    .filter(|p| hosted(&catalog, node, &t.name, *p))
                    .collect();
                (t.name.clone(), parts)
            })
            .filter(|(_, parts): &(String, Vec<i32>)| !parts.is_empty())
            .collect(),
        Some(topics) => topics
            .iter()
            .map(|t| {
                let name = t.topic.to_string();
                let parts = t
                    .partitions
                    .iter()
                    .copied()
                    .filter(|p| hosted(&catalog, node, &name, *p))
                    .collect();
                (name, parts)
            })
            .filter(|(_, parts): &(String, Vec<i32>)| !parts.is_empty())
            .collect(),
    };
    let dir = log_dir(shard);
    // Directory listings and stats are blocking syscalls: off the shard's thread.
    let scan_dir = dir.clone();
    let (sizes, space) = glommio::executor()
        .spawn_blocking(move || (partition_sizes(&scan_dir, &wanted), disk_space(&scan_dir)))
        .await;
    let topics = sizes
        .into_iter()
        .map(|(name, parts)| {
            DescribeLogDirsTopic::default()
                .with_name(topic_name(&name))
                .with_partitions(
                    parts
                        .into_iter()
                        .map(|(p, size)| {
                            DescribeLogDirsPartition::default()
                                .with_partition_index(p)
                                .with_partition_size(size)
                                .with_offset_lag(0)
                                .with_is_future_key(false)
                        })
                        .collect(),
                )
        })
        .collect();
    let (total, usable) = space.unwrap_or((-1, -1));
    let result = DescribeLogDirsResult::default()
        .with_error_code(errors::NONE)
        .with_log_dir(str_bytes(&dir.display().to_string()))
        .with_topics(topics)
        .with_total_bytes(total)
        .with_usable_bytes(usable);
    DescribeLogDirsResponse::default().with_results(vec![result])
}

/// Bytes of each partition's `.log` files, per topic in request order.
fn partition_sizes(dir: &Path, wanted: &[(String, Vec<i32>)]) -> Vec<(String, Vec<(i32, i64)>)> {
    wanted
        .iter()
        .map(|(topic, parts)| {
            let sizes = parts
                .iter()
                .map(|p| (*p, log_bytes(&dir.join(format!("{topic}-{p}")))))
                .collect();
            (topic.clone(), sizes)
        })
        .collect()
}

/// Sum of the `.log` file sizes in one partition directory (0 if it was never written).
fn log_bytes(partition_dir: &Path) -> i64 {
    let Ok(entries) = std::fs::read_dir(partition_dir) else {
        return 0;
    };
    let bytes: u64 = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// (total, usable) bytes of the file system holding `dir` (KIP-827).
fn disk_space(dir: &Path) -> Option<(i64, i64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `path` is a NUL-terminated string and `st` a writable statvfs that lives
    // across the call; statvfs writes only into it.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path.as_ptr(), &mut st) != 0 {
            return None;
        }
        st
    };
    let block = st.f_frsize as u128;
    let clamp = |blocks: u128| i64::try_from(blocks * block).unwrap_or(i64::MAX);
    Some((clamp(st.f_blocks as u128), clamp(st.f_bavail as u128)))
}

/// AlterReplicaLogDirs: moving a replica to the one log dir it is in is done already;
/// any other path is LOG_DIR_NOT_FOUND, an unknown partition UNKNOWN_TOPIC_OR_PARTITION.
pub async fn alter_replica_log_dirs(
    shard: &Rc<Shard>,
    req: AlterReplicaLogDirsRequest,
) -> AlterReplicaLogDirsResponse {
    let catalog = shard.catalog();
    let ours = log_dir(shard);
    let mut results = Vec::new();
    for dir in &req.dirs {
        let asked = PathBuf::from(dir.path.as_str());
        let same = std::fs::canonicalize(&asked).unwrap_or(asked) == ours;
        for t in &dir.topics {
            let name = t.name.as_str();
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let code = if !exists(&catalog, name, *p) {
                        errors::UNKNOWN_TOPIC_OR_PARTITION
                    } else if same {
                        errors::NONE
                    } else {
                        errors::LOG_DIR_NOT_FOUND
                    };
                    AlterReplicaLogDirPartitionResult::default()
                        .with_partition_index(*p)
                        .with_error_code(code)
                })
                .collect();
            results.push(
                AlterReplicaLogDirTopicResult::default()
                    .with_topic_name(t.name.clone())
                    .with_partitions(partitions),
            );
        }
    }
    AlterReplicaLogDirsResponse::default().with_results(results)
}

/// ElectLeaders. On a single node each partition's only replica is its leader: no
/// election is needed. In a cluster a PREFERRED election goes through the controller
/// (`Command::ElectPreferred`: the first replica leads if it is live and in the ISR); so
/// does an UNCLEAN one (`Command::ElectUnclean`), whatever `unclean.leader.election.enable`
/// says, as Kafka: a partition with a live leader needs none, an offline one gets its
/// first live ISR member, else its first live replica (ELIGIBLE_LEADERS_NOT_AVAILABLE
/// with none). A null
/// partition list means "every partition": Kafka then leaves out the partitions that
/// needed no election (ELECTION_NOT_NEEDED), and lists the others with their result.
pub async fn elect_leaders(shard: &Rc<Shard>, req: ElectLeadersRequest) -> ElectLeadersResponse {
    let catalog = shard.catalog();
    let node = shard.config().node_id;
    let every = req.topic_partitions.is_none();
    let wanted: Vec<(TopicName, i32)> = match &req.topic_partitions {
        Some(topics) => topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.topic.clone(), *p)))
            .collect(),
        None => catalog
            .topics
            .values()
            .flat_map(|t| (0..t.partitions).map(|p| (topic_name(&t.name), p)))
            .collect(),
    };
    let mut answers: Vec<Option<(i16, String)>> = vec![None; wanted.len()];
    let mut proposed = Vec::new();
    for (slot, (name, p)) in wanted.iter().enumerate() {
        let topic = name.as_str();
        let Some(t) = catalog
            .topics
            .get(topic)
            .filter(|t| (0..t.partitions).contains(p))
        else {
            answers[slot] = Some((
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                format!("{topic}-{p} does not exist"),
            ));
            continue;
        };
        let Some(a) = usize::try_from(*p).ok().and_then(|i| t.assignment.get(i)) else {
            answers[slot] = Some((
                errors::ELECTION_NOT_NEEDED,
                format!("node {node}, the only replica, leads {topic}-{p}"),
            ));
            continue;
        };
        let led = catalog.nodes.get(&a.leader).is_some_and(|n| !n.fenced);
        if req.election_type != ELECTION_PREFERRED && led {
            answers[slot] = Some((
                errors::ELECTION_NOT_NEEDED,
                format!("{topic}-{p} has leader {}", a.leader),
            ));
            continue;
        }
        proposed.push((slot, (topic.to_string(), t.id, *p)));
    }
    if !proposed.is_empty() {
        let partitions: Vec<_> = proposed.iter().map(|(_, p)| p.clone()).collect();
        // A null list names every partition: more than one command may hold.
        let cmds = if req.election_type == ELECTION_PREFERRED {
            crate::controller::apply::elect_preferred_commands(partitions)
        } else {
            crate::controller::apply::elect_unclean_commands(partitions)
        };
        let mut results = Vec::with_capacity(proposed.len());
        for cmd in cmds {
            let count = match &cmd {
                Command::ElectPreferred { partitions } | Command::ElectUnclean { partitions } => {
                    partitions.len()
                }
                _ => 0,
            };
            match shard.node.controller.submit(&shard.node, cmd).await {
                Outcome::Elected(r) if r.len() == count => results.extend(r),
                other => {
                    let e = (
                        errors::UNKNOWN_SERVER_ERROR,
                        format!("controller answered {other:?}"),
                    );
                    results.extend(vec![Err(e); count]);
                }
            }
        }
        shard.sync_all().await;
        for ((slot, _), result) in proposed.iter().zip(results) {
            answers[*slot] = Some(match result {
                Ok(()) => (errors::NONE, String::new()),
                Err(e) => e,
            });
        }
    }
    let mut by_topic: Vec<(TopicName, Vec<PartitionResult>)> = Vec::new();
    for ((name, p), answer) in wanted.into_iter().zip(answers) {
        let (code, msg) = answer.unwrap_or((errors::UNKNOWN_SERVER_ERROR, String::new()));
        // Kafka leaves out only the partitions whose leader already is the one asked for.
        if every && code == errors::ELECTION_NOT_NEEDED {
            continue;
        }
        let result = PartitionResult::default()
            .with_partition_id(p)
            .with_error_code(code)
            .with_error_message((!msg.is_empty()).then(|| str_bytes(&msg)));
        match by_topic.last_mut() {
            Some((last, results)) if *last == name => results.push(result),
            _ => by_topic.push((name, vec![result])),
        }
    }
    let results = by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            ReplicaElectionResult::default()
                .with_topic(topic)
                .with_partition_result(partitions)
        })
        .collect();
    ElectLeadersResponse::default()
        .with_error_code(errors::NONE)
        .with_replica_election_results(results)
}

/// AlterPartitionReassignments: the replica set a partition has now is accepted (nothing to
/// move); cancelling (null replicas) finds nothing in progress; any other set is refused,
/// since weir does not move replicas yet.
pub async fn alter_partition_reassignments(
    shard: &Rc<Shard>,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let catalog = shard.catalog();
    let node = shard.config().node_id;
    let responses = req
        .topics
        .iter()
        .map(|t| {
            let name = t.name.as_str();
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let ids: Option<Vec<i32>> =
                        p.replicas.as_ref().map(|r| r.iter().map(|b| b.0).collect());
                    let (code, msg) = reassignment(&catalog, node, name, p.partition_index, ids);
                    ReassignablePartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                        .with_error_message(msg.map(|m| str_bytes(&m)))
                })
                .collect();
            ReassignableTopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(req.allow_replication_factor_change)
        .with_error_code(errors::NONE)
        .with_responses(responses)
}

/// One partition's reassignment outcome: a code and, for errors, why.
fn reassignment(
    catalog: &Catalog,
    node: i32,
    topic: &str,
    partition: i32,
    replicas: Option<Vec<i32>>,
) -> (i16, Option<String>) {
    if !exists(catalog, topic, partition) {
        let msg = format!("{topic}-{partition} does not exist");
        return (errors::UNKNOWN_TOPIC_OR_PARTITION, Some(msg));
    }
    match replicas {
        None => (
            errors::NO_REASSIGNMENT_IN_PROGRESS,
            Some(format!(
                "no reassignment of {topic}-{partition} is in progress"
            )),
        ),
        Some(r) => {
            // The replicas the partition has now: the catalogue's assignment in a
            // cluster, this node on a single node (no assignment recorded).
            let current = catalog
                .topics
                .get(topic)
                .and_then(|t| {
                    usize::try_from(partition)
                        .ok()
                        .and_then(|i| t.assignment.get(i))
                })
                .map_or_else(|| vec![node], |a| a.replicas.clone());
            if r == current {
                (errors::NONE, None)
            } else {
                // Moving replicas is not built yet: say so rather than answer NONE and
                // leave a tool to report a reassignment that never happens.
                (
                    errors::INVALID_REPLICA_ASSIGNMENT,
                    Some(format!(
                        "replicas {r:?}: weir does not move replicas yet; {topic}-{partition} keeps {current:?}"
                    )),
                )
            }
        }
    }
}

/// ListPartitionReassignments: a single node never has one in progress.
pub async fn list_partition_reassignments(
    _shard: &Rc<Shard>,
    _req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    ListPartitionReassignmentsResponse::default().with_error_code(errors::NONE)
}
