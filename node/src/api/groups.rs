//! Group API handlers: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
//! OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete.
//!
//! Each decodes the request on the connection's shard, turns it into a version-independent
//! [`GroupOp`], sends it to the shard that hosts the group's coordinator (the owner of the
//! group's `__consumer_offsets` partition) and builds the answer for the request's version.
//! Requests naming several groups (FindCoordinator v4+, OffsetFetch v8+, DescribeGroups,
//! DeleteGroups) are split per group. `__consumer_offsets` is created on first use.

use bytes::Bytes;
use std::collections::HashMap;
use std::rc::Rc;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use wire::WireError;

use super::authz::{self, Authz};
use super::{Response, run, str_bytes, topic_name};
use crate::group::state::{JoinArgs, JoinResult, SyncArgs, SyncResult};
use crate::group::{
    CommitArgs, FetchedOffset, GroupCall, GroupOp, GroupReply, GroupSummary, OFFSETS_TOPIC,
    OffsetCommit, Settings, codes, partition_for,
};
use crate::proto::Request;
use crate::router::ShardId;
use crate::security::ListenerSetup;
use crate::security::acl::Operation;
use crate::server::session::Session;
use crate::shard::Shard;

/// Whether `key` is a group API this module answers.
pub fn is_group_api(key: ApiKey) -> bool {
    matches!(
        key,
        ApiKey::FindCoordinator
            | ApiKey::JoinGroup
            | ApiKey::SyncGroup
            | ApiKey::Heartbeat
            | ApiKey::LeaveGroup
            | ApiKey::OffsetCommit
            | ApiKey::OffsetFetch
            | ApiKey::ListGroups
            | ApiKey::DescribeGroups
            | ApiKey::DeleteGroups
            | ApiKey::OffsetDelete
    )
}

/// Runs one group API request.
pub async fn dispatch(
    shard: &Rc<Shard>,
    req: &Request,
    session: &Session,
) -> Result<Response, WireError> {
    let peer = session.peer;
    let v = req.version;
    let client_id = req
        .client_id
        .as_deref()
        .and_then(|b| std::str::from_utf8(b).ok())
        .unwrap_or_default()
        .to_string();
    let a = &Authz::new(shard, session);
    match req.key() {
        Some(ApiKey::FindCoordinator) => {
            let f = |r| find_coordinator(shard, r, v, &session.listener);
            run(req, |r| authz::find_coordinator(a, r, v, f)).await
        }
        Some(ApiKey::JoinGroup | ApiKey::SyncGroup | ApiKey::Heartbeat | ApiKey::LeaveGroup) => {
            let who = (client_id, format!("/{}", peer.ip()), peer.to_string());
            membership(shard, req, a, who).await
        }
        Some(ApiKey::OffsetCommit) => {
            run(req, |r| {
                authz::offset_commit(a, r, |r| offset_commit(shard, r))
            })
            .await
        }
        Some(ApiKey::OffsetFetch) => {
            run(req, |r| {
                authz::offset_fetch(a, r, v, |r| offset_fetch(shard, r, v))
            })
            .await
        }
        Some(ApiKey::ListGroups) => {
            run(req, |r| authz::list_groups(a, r, |r| list_groups(shard, r))).await
        }
        Some(ApiKey::DescribeGroups) => {
            run(req, |r| {
                authz::describe_groups(a, r, |r| describe_groups(shard, r, v))
            })
            .await
        }
        Some(ApiKey::DeleteGroups) => {
            run(req, |r| {
                authz::delete_groups(a, r, |r| delete_groups(shard, r))
            })
            .await
        }
        Some(ApiKey::OffsetDelete) => {
            run(req, |r| {
                authz::offset_delete(a, r, |r| offset_delete(shard, r))
            })
            .await
        }
        _ => Err(WireError::UnsupportedVersion {
            api_key: req.api_key,
            api_version: req.version,
        }),
    }
}

/// JoinGroup, SyncGroup, Heartbeat, LeaveGroup: each needs Read on its group.
async fn membership(
    shard: &Rc<Shard>,
    req: &Request,
    a: &Authz<'_>,
    who: (String, String, String),
) -> Result<Response, WireError> {
    let v = req.version;
    let read = Operation::Read;
    match req.key() {
        Some(ApiKey::JoinGroup) => {
            let deny = authz::join_group_denied;
            run(req, |r: JoinGroupRequest| async move {
                let group = r.group_id.to_string();
                authz::group_gate(a, read, &group, deny, join_group(shard, r, v, who)).await
            })
            .await
        }
        Some(ApiKey::SyncGroup) => {
            let deny = authz::sync_group_denied;
            run(req, |r: SyncGroupRequest| async move {
                let group = r.group_id.to_string();
                authz::group_gate(a, read, &group, deny, sync_group(shard, r, v)).await
            })
            .await
        }
        Some(ApiKey::Heartbeat) => {
            let deny = authz::heartbeat_denied;
            run(req, |r: HeartbeatRequest| async move {
                let group = r.group_id.to_string();
                authz::group_gate(a, read, &group, deny, heartbeat(shard, r)).await
            })
            .await
        }
        Some(ApiKey::LeaveGroup) => {
            let deny = authz::leave_group_denied;
            run(req, |r: LeaveGroupRequest| async move {
                let group = r.group_id.to_string();
                authz::group_gate(a, read, &group, deny, leave_group(shard, r, v)).await
            })
            .await
        }
        _ => Err(WireError::UnsupportedVersion {
            api_key: req.api_key,
            api_version: req.version,
        }),
    }
}

/// The partition count of `__consumer_offsets`, creating the topic on first use.
pub async fn offsets_partitions(shard: &Rc<Shard>) -> Result<i32, i16> {
    let s = Settings::from_config(shard.config());
    // Kafka: the broker's `min.insync.replicas` (no topic override).
    let replication = (s.replication_factor, None);
    super::admin::internal_topic_partitions(
        shard,
        OFFSETS_TOPIC,
        s.num_partitions,
        s.segment_bytes,
        replication,
    )
    .await
}

/// Sends `op` for `group` to its coordinator.
pub(crate) async fn call_group(shard: &Rc<Shard>, group: &str, op: GroupOp) -> GroupReply {
    let partitions = match offsets_partitions(shard).await {
        Ok(n) => n,
        Err(code) => return GroupReply::Code(code),
    };
    let partition = partition_for(group, partitions);
    let target = shard.router.owner(OFFSETS_TOPIC, partition);
    call_shard(shard, target, GroupCall { partition, op }).await
}

/// Calls for a JoinGroup/SyncGroup: while the coordinator answers `Parked`, asks again
/// (each call holds the coordinator's inbox for at most one slice; see `group::park`).
async fn call_group_waiting(shard: &Rc<Shard>, group: &str, op: GroupOp) -> GroupReply {
    let mut reply = call_group(shard, group, op).await;
    for _ in 0..PARKED_ROUNDS_MAX {
        let GroupReply::Parked(ticket) = reply else {
            return reply;
        };
        reply = call_group(shard, group, GroupOp::Await { ticket }).await;
    }
    GroupReply::Code(codes::REBALANCE_IN_PROGRESS)
}

/// Bound on re-asks for one parked answer: an hour of one-second slices (longer than
/// any rebalance timeout a client sends).
const PARKED_ROUNDS_MAX: u32 = 3600;

/// Longest one coordinator call may take: a parked JoinGroup/SyncGroup answers within a
/// slice (`group::park`), everything else at once; this bounds a stuck coordinator.
const GROUP_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn call_shard(shard: &Rc<Shard>, target: ShardId, call: GroupCall) -> GroupReply {
    let deadline = std::time::Instant::now() + GROUP_CALL_TIMEOUT;
    match shard.call(target, call, deadline).await {
        Ok(reply) => reply,
        Err(e) => GroupReply::Code(e.code()),
    }
}

/// Longest group (or instance) id weir stores: `__consumer_offsets` keys hold it as a
/// Kafka string (int16 length), though flexible request versions could carry more.
const ID_MAX_BYTES: usize = i16::MAX as usize;

/// Kafka refuses empty group ids in membership APIs; weir also refuses ids it could not
/// store intact.
fn valid_group_id(group: &str) -> bool {
    !group.is_empty() && group.len() <= ID_MAX_BYTES
}

fn opt_string(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|s| s.to_string())
}

fn opt_str_bytes(s: &Option<String>) -> Option<StrBytes> {
    s.as_deref().map(str_bytes)
}

fn group_id(name: &str) -> GroupId {
    GroupId(str_bytes(name))
}

async fn find_coordinator(
    shard: &Rc<Shard>,
    req: FindCoordinatorRequest,
    version: i16,
    listener: &ListenerSetup,
) -> FindCoordinatorResponse {
    // Key type 0: a group (its `__consumer_offsets` partition); 1: a transactional id
    // (its `__transaction_state` partition). Each topic is created on first use.
    let (topic, found) = match req.key_type {
        0 => (OFFSETS_TOPIC, offsets_partitions(shard).await),
        1 => (
            crate::txn::TXN_TOPIC,
            super::txn::txn_partitions(shard).await,
        ),
        _ => (OFFSETS_TOPIC, Err(codes::INVALID_REQUEST)),
    };
    let error = match found {
        Ok(_) => codes::NONE,
        Err(code) => code,
    };
    let partitions = found.unwrap_or(1);
    let mut resp = FindCoordinatorResponse::default();
    if version < 4 {
        let (error, node, host, port) =
            coordinator_of(shard, listener, topic, req.key.as_str(), partitions, error);
        resp.error_code = error;
        if error == codes::NONE {
            resp.node_id = node;
            resp.host = str_bytes(&host);
            resp.port = i32::from(port);
        } else {
            resp.node_id = BrokerId(-1);
        }
        return resp;
    }
    resp.coordinators = req
        .coordinator_keys
        .iter()
        .map(|key| {
            let (error, node, host, port) =
                coordinator_of(shard, listener, topic, key.as_str(), partitions, error);
            let mut c = Coordinator::default();
            c.key = key.clone();
            c.error_code = error;
            if error == codes::NONE {
                c.node_id = node;
                c.host = str_bytes(&host);
                c.port = i32::from(port);
            } else {
                c.node_id = BrokerId(-1);
            }
            c
        })
        .collect();
    resp
}

/// The node hosting the coordinator of `key` (a group or transactional id) on `topic`
/// (`__consumer_offsets` or `__transaction_state`): this node on a single node; in a
/// cluster the leader of its partition (none yet, or without the client's listener:
/// COORDINATOR_NOT_AVAILABLE). Addresses are those of the client's `listener`.
fn coordinator_of(
    shard: &Shard,
    listener: &ListenerSetup,
    topic: &str,
    group: &str,
    partitions: i32,
    error: i16,
) -> (i16, BrokerId, String, u16) {
    let (host, port) = listener.advertised.clone();
    let me = (error, BrokerId(shard.config().node_id), host, port);
    if error != codes::NONE || shard.node.controller.cluster().is_none() {
        return me;
    }
    let image = shard.catalog();
    let partition = partition_for(group, partitions);
    let leader = image
        .topics
        .get(topic)
        .and_then(|t| t.assignment.get(usize::try_from(partition).ok()?))
        .map(|a| a.leader);
    let Some(leader) = leader else {
        return me;
    };
    let address = image
        .nodes
        .get(&leader)
        .filter(|n| !n.fenced)
        .and_then(|n| n.address_for(&listener.config.name));
    match address {
        Some((host, port)) => (error, BrokerId(leader), host.to_string(), port),
        None => (
            codes::COORDINATOR_NOT_AVAILABLE,
            BrokerId(-1),
            String::new(),
            0,
        ),
    }
}

async fn join_group(
    shard: &Rc<Shard>,
    req: JoinGroupRequest,
    version: i16,
    (client_id, client_host, connection): (String, String, String),
) -> JoinGroupResponse {
    let group = req.group_id.to_string();
    let instance_len = req.group_instance_id.as_ref().map_or(0, |i| i.len());
    let result = if !valid_group_id(&group) {
        JoinResult::error(codes::INVALID_GROUP_ID, &req.member_id)
    } else if instance_len > ID_MAX_BYTES {
        JoinResult::error(codes::INVALID_REQUEST, &req.member_id)
    } else {
        let args = JoinArgs {
            group: group.clone(),
            member_id: req.member_id.to_string(),
            instance_id: opt_string(&req.group_instance_id),
            protocol_type: req.protocol_type.to_string(),
            protocols: req
                .protocols
                .iter()
                // Copied: a slice would keep the whole 64 KiB read buffer it came in alive
                // for as long as the member stays in the group.
                .map(|p| (p.name.to_string(), Bytes::copy_from_slice(&p.metadata)))
                .collect(),
            session_timeout_ms: req.session_timeout_ms,
            // v0 has no rebalance timeout: Kafka uses the session timeout.
            rebalance_timeout_ms: if version >= 1 {
                req.rebalance_timeout_ms
            } else {
                req.session_timeout_ms
            },
            client_id,
            client_host,
            require_known_member_id: version >= 4,
            connection,
        };
        match call_group_waiting(shard, &group, GroupOp::Join(args)).await {
            GroupReply::Join(r) => r,
            GroupReply::Code(code) => JoinResult::error(code, &req.member_id),
            _ => JoinResult::error(codes::UNKNOWN_SERVER_ERROR, &req.member_id),
        }
    };
    join_response(result, version)
}

fn join_response(r: JoinResult, version: i16) -> JoinGroupResponse {
    let mut resp = JoinGroupResponse::default();
    resp.error_code = r.error;
    resp.generation_id = r.generation;
    resp.protocol_type = opt_str_bytes(&r.protocol_type);
    // Before v7 the protocol name is a non-null string.
    resp.protocol_name = if version >= 7 {
        opt_str_bytes(&r.protocol_name)
    } else {
        Some(str_bytes(r.protocol_name.as_deref().unwrap_or_default()))
    };
    resp.leader = str_bytes(&r.leader);
    resp.member_id = str_bytes(&r.member_id);
    resp.members = r
        .members
        .into_iter()
        .map(|m| {
            let mut out = JoinGroupResponseMember::default();
            out.member_id = str_bytes(&m.member_id);
            out.group_instance_id = opt_str_bytes(&m.instance_id);
            out.metadata = m.metadata;
            out
        })
        .collect();
    resp
}

async fn sync_group(shard: &Rc<Shard>, req: SyncGroupRequest, version: i16) -> SyncGroupResponse {
    let group = req.group_id.to_string();
    let args = SyncArgs {
        group: group.clone(),
        generation: req.generation_id,
        member_id: req.member_id.to_string(),
        instance_id: opt_string(&req.group_instance_id),
        protocol_type: opt_string(&req.protocol_type),
        protocol_name: opt_string(&req.protocol_name),
        assignments: req
            .assignments
            .iter()
            .map(|a| {
                (
                    a.member_id.to_string(),
                    Bytes::copy_from_slice(&a.assignment),
                )
            })
            .collect(),
    };
    let r = if !valid_group_id(&group) {
        SyncResult::error(codes::INVALID_GROUP_ID)
    } else {
        match call_group_waiting(shard, &group, GroupOp::Sync(args)).await {
            GroupReply::Sync(r) => r,
            GroupReply::Code(code) => SyncResult::error(code),
            _ => SyncResult::error(codes::UNKNOWN_SERVER_ERROR),
        }
    };
    let mut resp = SyncGroupResponse::default();
    resp.error_code = r.error;
    if version >= 5 {
        resp.protocol_type = opt_str_bytes(&r.protocol_type);
        resp.protocol_name = opt_str_bytes(&r.protocol_name);
    }
    resp.assignment = r.assignment;
    resp
}

async fn heartbeat(shard: &Rc<Shard>, req: HeartbeatRequest) -> HeartbeatResponse {
    let group = req.group_id.to_string();
    let code = if !valid_group_id(&group) {
        codes::INVALID_GROUP_ID
    } else {
        let op = GroupOp::Heartbeat {
            group: group.clone(),
            member_id: req.member_id.to_string(),
            instance_id: opt_string(&req.group_instance_id),
            generation: req.generation_id,
        };
        reply_code(call_group(shard, &group, op).await)
    };
    let mut resp = HeartbeatResponse::default();
    resp.error_code = code;
    resp
}

fn reply_code(reply: GroupReply) -> i16 {
    match reply {
        GroupReply::Code(code) => code,
        GroupReply::Codes(code, _) => code,
        _ => codes::UNKNOWN_SERVER_ERROR,
    }
}

async fn leave_group(
    shard: &Rc<Shard>,
    req: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let group = req.group_id.to_string();
    let members: Vec<(String, Option<String>)> = if version >= 3 {
        let m = req.members.iter();
        m.map(|m| (m.member_id.to_string(), opt_string(&m.group_instance_id)))
            .collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    let (top, per) = if !valid_group_id(&group) {
        (codes::INVALID_GROUP_ID, Vec::new())
    } else {
        let op = GroupOp::Leave {
            group: group.clone(),
            members: members.clone(),
        };
        match call_group(shard, &group, op).await {
            GroupReply::Codes(top, per) => (if version >= 3 { codes::NONE } else { top }, per),
            other => (reply_code(other), Vec::new()),
        }
    };
    let mut resp = LeaveGroupResponse::default();
    resp.error_code = top;
    if version >= 3 && !per.is_empty() {
        resp.members = members
            .iter()
            .zip(per)
            .map(|((id, instance), code)| {
                let mut m = MemberResponse::default();
                m.member_id = str_bytes(id);
                m.group_instance_id = opt_str_bytes(instance);
                m.error_code = code;
                m
            })
            .collect();
    }
    resp
}

async fn offset_commit(shard: &Rc<Shard>, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let group = req.group_id.to_string();
    let catalog = shard.catalog();
    let known = |t: &str, p: i32| {
        catalog
            .topics
            .get(t)
            .is_some_and(|m| p >= 0 && p < m.partitions)
    };
    let mut args = CommitArgs {
        group: group.clone(),
        generation: req.generation_id_or_member_epoch,
        member_id: req.member_id.to_string(),
        instance_id: opt_string(&req.group_instance_id),
        offsets: Vec::new(),
    };
    // Per partition: Some(code) decided here, None sent to the coordinator.
    let mut decided: Vec<(String, i32, Option<i16>)> = Vec::new();
    for t in &req.topics {
        let name = t.name.to_string();
        for p in &t.partitions {
            if !known(&name, p.partition_index) {
                decided.push((
                    name.clone(),
                    p.partition_index,
                    Some(codes::UNKNOWN_TOPIC_OR_PARTITION),
                ));
                continue;
            }
            decided.push((name.clone(), p.partition_index, None));
            let metadata = opt_string(&p.committed_metadata);
            let entry = OffsetCommit {
                topic: name.clone(),
                partition: p.partition_index,
                offset: wire::Offset(p.committed_offset),
                leader_epoch: wire::LeaderEpoch(p.committed_leader_epoch),
                metadata,
            };
            args.offsets.push(entry);
        }
    }
    let sent = args.offsets.len();
    let answers = if !valid_group_id(&group) {
        vec![codes::INVALID_GROUP_ID; sent]
    } else if sent == 0 {
        Vec::new()
    } else {
        match call_group(shard, &group, GroupOp::Commit(args)).await {
            GroupReply::Codes(_, per) if per.len() == sent => per,
            other => vec![reply_code(other); sent],
        }
    };
    let mut answers = answers.into_iter();
    let mut by_topic: Vec<OffsetCommitResponseTopic> = Vec::new();
    for (topic, partition, code) in decided {
        let code = code.unwrap_or_else(|| answers.next().unwrap_or(codes::UNKNOWN_SERVER_ERROR));
        let mut p = OffsetCommitResponsePartition::default();
        p.partition_index = partition;
        p.error_code = code;
        match by_topic.last_mut() {
            Some(t) if t.name.as_str() == topic => t.partitions.push(p),
            _ => {
                let mut t = OffsetCommitResponseTopic::default();
                t.name = topic_name(&topic);
                t.partitions.push(p);
                by_topic.push(t);
            }
        }
    }
    let mut resp = OffsetCommitResponse::default();
    resp.topics = by_topic;
    resp
}

/// Fetches one group's offsets: `topics: None` = all of them.
async fn fetch_group(
    shard: &Rc<Shard>,
    group: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
) -> (i16, Vec<FetchedOffset>) {
    let op = GroupOp::FetchOffsets {
        group: group.to_string(),
        topics,
        require_stable,
    };
    match call_group(shard, group, op).await {
        GroupReply::Offsets(code, offsets) => (code, offsets),
        other => (reply_code(other), Vec::new()),
    }
}

/// Groups fetched offsets by topic, in first-seen order (indexed by name: a request may
/// name hundreds of thousands of topics).
fn by_topic(offsets: Vec<FetchedOffset>) -> Vec<(String, Vec<FetchedOffset>)> {
    let mut out: Vec<(String, Vec<FetchedOffset>)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for o in offsets {
        match at.get(&o.topic) {
            Some(&i) => out[i].1.push(o),
            None => {
                at.insert(o.topic.clone(), out.len());
                out.push((o.topic.clone(), vec![o]));
            }
        }
    }
    out
}

async fn offset_fetch(
    shard: &Rc<Shard>,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let mut resp = OffsetFetchResponse::default();
    if version >= 8 {
        for g in &req.groups {
            let topics = g.topics.as_ref().map(|ts| {
                ts.iter()
                    .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                    .collect()
            });
            let stable = req.require_stable;
            let (code, offsets) = fetch_group(shard, &g.group_id, topics, stable).await;
            resp.groups.push(fetch_group_v8(&g.group_id, code, offsets));
        }
        return resp;
    }
    let topics = req.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
            .collect()
    });
    // v7+ (KIP-447): offsets of a pending transaction answer UNSTABLE_OFFSET_COMMIT.
    let stable = version >= 7 && req.require_stable;
    let (code, offsets) = fetch_group(shard, &req.group_id, topics, stable).await;
    if code != codes::NONE {
        return offset_fetch_error(&req, version, code);
    }
    for (topic, offsets) in by_topic(offsets) {
        let mut t = OffsetFetchResponseTopic::default();
        t.name = topic_name(&topic);
        t.partitions = offsets
            .into_iter()
            .map(|o| {
                let mut p = OffsetFetchResponsePartition::default();
                p.partition_index = o.partition;
                p.committed_offset = o.offset.get();
                p.committed_leader_epoch = o.leader_epoch.get();
                p.metadata = opt_str_bytes(&o.metadata);
                p.error_code = o.error;
                p
            })
            .collect();
        resp.topics.push(t);
    }
    resp
}

/// OffsetFetch below v8 answered with a group-level `code`. From v2 it is the top-level
/// code; v0-v1 have none, so every requested partition carries it (offset -1), as Kafka
/// answers: a client of those versions (librdkafka before 1.6) would otherwise read "no
/// offsets committed" and reset its position.
pub fn offset_fetch_error(
    req: &OffsetFetchRequest,
    version: i16,
    code: i16,
) -> OffsetFetchResponse {
    let mut resp = OffsetFetchResponse::default();
    if version >= 2 {
        resp.error_code = code;
        return resp;
    }
    resp.topics = req
        .topics
        .iter()
        .flatten()
        .map(|t| {
            let mut out = OffsetFetchResponseTopic::default();
            out.name = t.name.clone();
            out.partitions = t
                .partition_indexes
                .iter()
                .map(|p| {
                    let mut r = OffsetFetchResponsePartition::default();
                    r.partition_index = *p;
                    r.committed_offset = -1;
                    r.committed_leader_epoch = -1;
                    r.metadata = Some(str_bytes(""));
                    r.error_code = code;
                    r
                })
                .collect();
            out
        })
        .collect();
    resp
}

fn fetch_group_v8(
    group: &GroupId,
    code: i16,
    offsets: Vec<FetchedOffset>,
) -> OffsetFetchResponseGroup {
    let mut g = OffsetFetchResponseGroup::default();
    g.group_id = group.clone();
    g.error_code = code;
    for (topic, offsets) in by_topic(offsets) {
        let mut t = OffsetFetchResponseTopics::default();
        t.name = topic_name(&topic);
        t.partitions = offsets
            .into_iter()
            .map(|o| {
                let mut p = OffsetFetchResponsePartitions::default();
                p.partition_index = o.partition;
                p.committed_offset = o.offset.get();
                p.committed_leader_epoch = o.leader_epoch.get();
                p.metadata = opt_str_bytes(&o.metadata);
                p.error_code = o.error;
                p
            })
            .collect();
        g.topics.push(t);
    }
    g
}

async fn list_groups(shard: &Rc<Shard>, req: ListGroupsRequest) -> ListGroupsResponse {
    let mut resp = ListGroupsResponse::default();
    if offsets_partitions_if_any(shard).is_none() {
        return resp;
    }
    for s in 0..shard.router.shards() {
        let call = GroupCall {
            partition: -1,
            op: GroupOp::List,
        };
        let GroupReply::Listed(groups) = call_shard(shard, ShardId(s), call).await else {
            resp.error_code = codes::COORDINATOR_NOT_AVAILABLE;
            continue;
        };
        for (id, kind, state) in groups {
            let state_ok = req.states_filter.is_empty()
                || req
                    .states_filter
                    .iter()
                    .any(|f| f.eq_ignore_ascii_case(state));
            let type_ok = req.types_filter.is_empty()
                || req
                    .types_filter
                    .iter()
                    .any(|f| f.eq_ignore_ascii_case("classic"));
            if !(state_ok && type_ok) {
                continue;
            }
            let mut g = ListedGroup::default();
            g.group_id = group_id(&id);
            g.protocol_type = str_bytes(&kind);
            g.group_state = str_bytes(state);
            g.group_type = str_bytes("classic");
            resp.groups.push(g);
        }
    }
    resp
}

/// The partition count of `__consumer_offsets` if it exists (listing creates nothing).
fn offsets_partitions_if_any(shard: &Rc<Shard>) -> Option<i32> {
    shard
        .catalog()
        .topics
        .get(OFFSETS_TOPIC)
        .map(|t| t.partitions)
}

async fn describe_groups(
    shard: &Rc<Shard>,
    req: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let mut resp = DescribeGroupsResponse::default();
    for name in &req.groups {
        let summary = match call_group(
            shard,
            name,
            GroupOp::Describe {
                group: name.to_string(),
            },
        )
        .await
        {
            GroupReply::Described(s) => s,
            other => GroupSummary {
                error: reply_code(other),
                state: "Dead",
                ..GroupSummary::default()
            },
        };
        resp.groups.push(described(name, summary, version));
    }
    resp
}

fn described(name: &GroupId, s: GroupSummary, version: i16) -> DescribedGroup {
    let mut g = DescribedGroup::default();
    g.error_code = s.error;
    g.group_id = name.clone();
    g.group_state = str_bytes(s.state);
    g.protocol_type = str_bytes(&s.protocol_type);
    g.protocol_data = str_bytes(&s.protocol);
    g.members = s
        .members
        .into_iter()
        .map(|m| {
            let mut out = DescribedGroupMember::default();
            out.member_id = str_bytes(&m.member_id);
            out.group_instance_id = if version >= 4 {
                opt_str_bytes(&m.instance_id)
            } else {
                None
            };
            out.client_id = str_bytes(&m.client_id);
            out.client_host = str_bytes(&m.client_host);
            out.member_metadata = m.metadata;
            out.member_assignment = m.assignment;
            out
        })
        .collect();
    g
}

async fn delete_groups(shard: &Rc<Shard>, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut resp = DeleteGroupsResponse::default();
    for name in &req.groups_names {
        let code = if offsets_partitions_if_any(shard).is_none() {
            codes::GROUP_ID_NOT_FOUND
        } else {
            reply_code(
                call_group(
                    shard,
                    name,
                    GroupOp::Delete {
                        group: name.to_string(),
                    },
                )
                .await,
            )
        };
        let mut r = DeletableGroupResult::default();
        r.group_id = name.clone();
        r.error_code = code;
        resp.results.push(r);
    }
    resp
}

async fn offset_delete(shard: &Rc<Shard>, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let group = req.group_id.to_string();
    let partitions: Vec<(String, i32)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.name.to_string(), p.partition_index))
        })
        .collect();
    let mut resp = OffsetDeleteResponse::default();
    let op = GroupOp::DeleteOffsets {
        group: group.clone(),
        partitions: partitions.clone(),
    };
    let (top, per) = if offsets_partitions_if_any(shard).is_none() {
        (codes::GROUP_ID_NOT_FOUND, Vec::new())
    } else {
        match call_group(shard, &group, op).await {
            GroupReply::Codes(top, per) => (top, per),
            other => (reply_code(other), Vec::new()),
        }
    };
    resp.error_code = top;
    if top != codes::NONE || per.len() != partitions.len() {
        return resp;
    }
    // Indexed by name, as `by_topic`.
    let mut at: HashMap<String, usize> = HashMap::new();
    for ((topic, partition), code) in partitions.into_iter().zip(per) {
        let mut p = OffsetDeleteResponsePartition::default();
        p.partition_index = partition;
        p.error_code = code;
        match at.get(&topic) {
            Some(&i) => resp.topics[i].partitions.push(p),
            None => {
                let mut t = OffsetDeleteResponseTopic::default();
                t.name = topic_name(&topic);
                t.partitions.push(p);
                at.insert(topic, resp.topics.len());
                resp.topics.push(t);
            }
        }
    }
    resp
}
