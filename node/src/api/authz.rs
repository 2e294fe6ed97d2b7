//! Where each API asks the authorizer, the way Kafka's `KafkaApis` does, and Kafka's
//! error codes for a refusal. Each wrapper takes the typed request and the real handler:
//! the resources the principal may not touch are taken out of the request before the
//! handler runs and answered with the refusal after it (TOPIC_AUTHORIZATION_FAILED per
//! partition, GROUP_ / TRANSACTIONAL_ID_ / CLUSTER_AUTHORIZATION_FAILED where Kafka puts
//! them); a request refused as a whole does not reach its handler. With no authorizer
//! configured every check is one branch and nothing is taken out.
//!
//! Produce, Fetch and Metadata ask in their own handlers ([`Authz`] is passed in): their
//! requests are not decoded into the typed form here.

use std::future::Future;

use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::str_bytes;
use crate::errors;
use crate::security::acl::{CLUSTER_NAME, Operation, ResourceType};
use crate::server::session::Session;
use crate::shard::Shard;

/// The operations Kafka reports in `authorized_operations`, per resource type (its
/// `AclEntry.supportedOperations`).
const TOPIC_OPERATIONS: [Operation; 8] = [
    Operation::Read,
    Operation::Write,
    Operation::Create,
    Operation::Describe,
    Operation::Delete,
    Operation::Alter,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
];
const GROUP_OPERATIONS: [Operation; 3] = [Operation::Read, Operation::Describe, Operation::Delete];
const CLUSTER_OPERATIONS: [Operation; 7] = [
    Operation::Create,
    Operation::ClusterAction,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
    Operation::IdempotentWrite,
    Operation::Alter,
    Operation::Describe,
];
const TRANSACTIONAL_ID_OPERATIONS: [Operation; 2] = [Operation::Describe, Operation::Write];

/// One request's view of the authorizer: the connection's session and the shard's image.
pub struct Authz<'a> {
    shard: &'a Shard,
    session: &'a Session,
}

impl<'a> Authz<'a> {
    pub fn new(shard: &'a Shard, session: &'a Session) -> Authz<'a> {
        Authz { shard, session }
    }

    /// The name of the listener the client came through (answers that name nodes give
    /// that listener's addresses).
    pub fn listener_name(&self) -> &str {
        &self.session.listener.config.name
    }

    pub fn enabled(&self) -> bool {
        self.shard.config().authorizer.enabled
    }

    /// Whether this connection may do `op` on `name` of type `rt`.
    pub fn allows(&self, op: Operation, rt: ResourceType, name: &str) -> bool {
        let settings = &self.shard.config().authorizer;
        if !settings.enabled {
            return true;
        }
        let version = self.shard.node.meta.version();
        let image = self.shard.catalog();
        let ok = self
            .session
            .authorize(settings, (version, &image), (op, rt, name));
        if !ok {
            tracing::debug!(peer = %self.session.peer, principal = %self.session.principal(), ?op, ?rt, name, "authorization denied");
        }
        ok
    }

    /// Kafka's `authorized_operations` bitmask for `name` of type `rt`: bit
    /// `AclOperation` code set for each operation Kafka lists for the resource type that
    /// this connection may do (without an authorizer: all of them, as Kafka answers).
    pub fn authorized_operations(&self, rt: ResourceType, name: &str) -> i32 {
        let ops: &[Operation] = match rt {
            ResourceType::Topic => &TOPIC_OPERATIONS,
            ResourceType::Group => &GROUP_OPERATIONS,
            ResourceType::Cluster => &CLUSTER_OPERATIONS,
            ResourceType::TransactionalId => &TRANSACTIONAL_ID_OPERATIONS,
        };
        ops.iter()
            .filter(|op| self.allows(**op, rt, name))
            .fold(0, |mask, op| mask | (1 << op.code()))
    }

    pub fn topic(&self, op: Operation, name: &str) -> bool {
        self.allows(op, ResourceType::Topic, name)
    }

    pub fn group(&self, op: Operation, id: &str) -> bool {
        self.allows(op, ResourceType::Group, id)
    }

    pub fn txn(&self, op: Operation, id: &str) -> bool {
        self.allows(op, ResourceType::TransactionalId, id)
    }

    pub fn cluster(&self, op: Operation) -> bool {
        self.allows(op, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// Kafka's `authorizeByResourceType`: `op` is allowed on some resource of type `rt`.
    pub fn on_some(&self, op: Operation, rt: ResourceType) -> bool {
        let settings = &self.shard.config().authorizer;
        if !settings.enabled {
            return true;
        }
        let version = self.shard.node.meta.version();
        let image = self.shard.catalog();
        self.session
            .authorize_some(settings, (version, &image), (op, rt))
    }

    /// Creating topic `name`: Create on the cluster or on the topic.
    pub fn may_create_topic(&self, name: &str) -> bool {
        self.cluster(Operation::Create) || self.topic(Operation::Create, name)
    }
}

/// Keeps in `items` those `ok` allows and returns the others, in order.
fn take_denied<T>(items: &mut Vec<T>, mut ok: impl FnMut(&T) -> bool) -> Vec<T> {
    let mut denied = Vec::new();
    let mut kept = Vec::with_capacity(items.len());
    for item in items.drain(..) {
        match ok(&item) {
            true => kept.push(item),
            false => denied.push(item),
        }
    }
    *items = kept;
    denied
}

const TOPIC_DENIED: i16 = errors::TOPIC_AUTHORIZATION_FAILED;
const GROUP_DENIED: i16 = errors::GROUP_AUTHORIZATION_FAILED;
const CLUSTER_DENIED: i16 = errors::CLUSTER_AUTHORIZATION_FAILED;
const TXN_DENIED: i16 = errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;

fn msg(s: &str) -> Option<StrBytes> {
    Some(str_bytes(s))
}

// ---- topics ------------------------------------------------------------------------

/// ListOffsets: Describe on each topic.
pub async fn list_offsets<F, Fut>(
    a: &Authz<'_>,
    mut q: ListOffsetsRequest,
    f: F,
) -> ListOffsetsResponse
where
    F: FnOnce(ListOffsetsRequest) -> Fut,
    Fut: Future<Output = ListOffsetsResponse>,
{
    use list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
    let denied = take_denied(&mut q.topics, |t| a.topic(Operation::Describe, &t.name));
    let mut resp = f(q).await;
    resp.topics.extend(denied.into_iter().map(|t| {
        let parts = t.partitions.iter().map(|p| {
            ListOffsetsPartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_error_code(TOPIC_DENIED)
                .with_offset(-1)
                .with_timestamp(-1)
        });
        ListOffsetsTopicResponse::default()
            .with_name(t.name)
            .with_partitions(parts.collect())
    }));
    resp
}

/// DescribeProducers: Read on each topic (Kafka's rule, KIP-664).
pub async fn describe_producers<F, Fut>(
    a: &Authz<'_>,
    mut q: DescribeProducersRequest,
    f: F,
) -> DescribeProducersResponse
where
    F: FnOnce(DescribeProducersRequest) -> Fut,
    Fut: Future<Output = DescribeProducersResponse>,
{
    use describe_producers_response::{PartitionResponse, TopicResponse};
    let denied = take_denied(&mut q.topics, |t| a.topic(Operation::Read, &t.name));
    let mut resp = f(q).await;
    resp.topics.extend(denied.into_iter().map(|t| {
        let parts = t.partition_indexes.iter().map(|p| {
            PartitionResponse::default()
                .with_partition_index(*p)
                .with_error_code(TOPIC_DENIED)
        });
        TopicResponse::default()
            .with_name(t.name)
            .with_partitions(parts.collect())
    }));
    resp
}

/// OffsetForLeaderEpoch: a follower's (replica id set) needs ClusterAction, a client's
/// Describe on each topic.
pub async fn offset_for_leader_epoch<F, Fut>(
    a: &Authz<'_>,
    mut q: OffsetForLeaderEpochRequest,
    f: F,
) -> OffsetForLeaderEpochResponse
where
    F: FnOnce(OffsetForLeaderEpochRequest) -> Fut,
    Fut: Future<Output = OffsetForLeaderEpochResponse>,
{
    use offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
    let follower = q.replica_id.0 >= 0;
    let cluster_ok = !follower || a.cluster(Operation::ClusterAction);
    let denied = take_denied(&mut q.topics, |t| {
        cluster_ok && (follower || a.topic(Operation::Describe, &t.topic))
    });
    let mut resp = f(q).await;
    resp.topics.extend(denied.into_iter().map(|t| {
        let parts = t.partitions.iter().map(|p| {
            EpochEndOffset::default()
                .with_partition(p.partition)
                .with_error_code(TOPIC_DENIED)
                .with_leader_epoch(-1)
                .with_end_offset(-1)
        });
        OffsetForLeaderTopicResult::default()
            .with_topic(t.topic)
            .with_partitions(parts.collect())
    }));
    resp
}

/// DeleteRecords: Delete on each topic.
pub async fn delete_records<F, Fut>(
    a: &Authz<'_>,
    mut q: DeleteRecordsRequest,
    f: F,
) -> DeleteRecordsResponse
where
    F: FnOnce(DeleteRecordsRequest) -> Fut,
    Fut: Future<Output = DeleteRecordsResponse>,
{
    use delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
    let denied = take_denied(&mut q.topics, |t| a.topic(Operation::Delete, &t.name));
    let mut resp = f(q).await;
    resp.topics.extend(denied.into_iter().map(|t| {
        let parts = t.partitions.iter().map(|p| {
            DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_error_code(TOPIC_DENIED)
                .with_low_watermark(-1)
        });
        DeleteRecordsTopicResult::default()
            .with_name(t.name)
            .with_partitions(parts.collect())
    }));
    resp
}

/// CreateTopics: Create on the cluster, or on each topic.
pub async fn create_topics<F, Fut>(
    a: &Authz<'_>,
    mut q: CreateTopicsRequest,
    f: F,
) -> CreateTopicsResponse
where
    F: FnOnce(CreateTopicsRequest) -> Fut,
    Fut: Future<Output = CreateTopicsResponse>,
{
    use create_topics_response::CreatableTopicResult;
    let cluster = !a.enabled() || a.cluster(Operation::Create);
    let denied = take_denied(&mut q.topics, |t| {
        cluster || a.topic(Operation::Create, &t.name)
    });
    let mut resp = f(q).await;
    resp.topics.extend(denied.into_iter().map(|t| {
        CreatableTopicResult::default()
            .with_name(t.name)
            .with_error_code(TOPIC_DENIED)
            .with_error_message(msg("Authorization failed."))
            .with_num_partitions(-1)
            .with_replication_factor(-1)
    }));
    resp
}

/// DeleteTopics: Delete on each topic. An entry by topic id (v6) is first resolved to
/// the name the id has here and Delete asked on that name, as Kafka does: the id is no
/// way around the ACL. The name is filled into the entry, so the handler deletes the
/// topic that was checked (the id is kept: a topic of that name created again meanwhile
/// is not deleted). An id that names no topic is left to the handler
/// (UNKNOWN_TOPIC_ID). A refusal by id gives the name only to a principal that may
/// describe the topic (Kafka's `ControllerApis.deleteTopics`).
pub async fn delete_topics<F, Fut>(
    a: &Authz<'_>,
    mut q: DeleteTopicsRequest,
    f: F,
) -> DeleteTopicsResponse
where
    F: FnOnce(DeleteTopicsRequest) -> Fut,
    Fut: Future<Output = DeleteTopicsResponse>,
{
    use delete_topics_response::DeletableTopicResult;
    let denied = take_denied(&mut q.topic_names, |n| a.topic(Operation::Delete, n));
    if a.enabled() {
        resolve_topic_ids(a, &mut q.topics);
    }
    let denied_states = take_denied(&mut q.topics, |t| {
        t.name
            .as_ref()
            .is_none_or(|n| a.topic(Operation::Delete, n))
    });
    let mut resp = f(q).await;
    let by_name = denied.into_iter().map(|n| (Some(n), uuid::Uuid::nil()));
    let by_state = denied_states.into_iter().map(|t| {
        let shown = t.topic_id.is_nil()
            || t.name
                .as_ref()
                .is_some_and(|n| a.topic(Operation::Describe, n));
        (t.name.filter(|_| shown), t.topic_id)
    });
    resp.responses
        .extend(by_name.chain(by_state).map(|(name, id)| {
            DeletableTopicResult::default()
                .with_name(name)
                .with_topic_id(id)
                .with_error_code(TOPIC_DENIED)
                .with_error_message(msg("Authorization failed."))
        }));
    resp
}

/// Gives each DeleteTopics entry named only by its id the name that id has in this
/// shard's image (an id that names nothing keeps no name).
fn resolve_topic_ids(a: &Authz<'_>, topics: &mut [delete_topics_request::DeleteTopicState]) {
    if topics.iter().all(|t| t.name.is_some()) {
        return;
    }
    let image = a.shard.catalog();
    let by_id: std::collections::HashMap<u128, &str> = image
        .topics
        .values()
        .map(|t| (t.id, t.name.as_str()))
        .collect();
    for t in topics.iter_mut().filter(|t| t.name.is_none()) {
        if let Some(name) = by_id.get(&t.topic_id.as_u128()) {
            t.name = Some(super::topic_name(name));
        }
    }
}

/// CreatePartitions: Alter on each topic.
pub async fn create_partitions<F, Fut>(
    a: &Authz<'_>,
    mut q: CreatePartitionsRequest,
    f: F,
) -> CreatePartitionsResponse
where
    F: FnOnce(CreatePartitionsRequest) -> Fut,
    Fut: Future<Output = CreatePartitionsResponse>,
{
    use create_partitions_response::CreatePartitionsTopicResult;
    let denied = take_denied(&mut q.topics, |t| a.topic(Operation::Alter, &t.name));
    let mut resp = f(q).await;
    resp.results.extend(denied.into_iter().map(|t| {
        CreatePartitionsTopicResult::default()
            .with_name(t.name)
            .with_error_code(TOPIC_DENIED)
            .with_error_message(msg("Authorization failed."))
    }));
    resp
}

// ---- configs -----------------------------------------------------------------------

/// Kafka's config resource types: 2 topic; 4 broker and 8 broker logger are the cluster's.
const CONFIG_TOPIC: i8 = 2;

/// The refusal for config operation `op` on resource `(kind, name)`, or `None`.
fn config_denied(a: &Authz<'_>, op: Operation, kind: i8, name: &str) -> Option<i16> {
    match kind {
        CONFIG_TOPIC => (!a.topic(op, name)).then_some(TOPIC_DENIED),
        _ => (!a.cluster(op)).then_some(CLUSTER_DENIED),
    }
}

/// DescribeConfigs: DescribeConfigs on the topic, or on the cluster for a broker.
pub async fn describe_configs<F, Fut>(
    a: &Authz<'_>,
    mut q: DescribeConfigsRequest,
    f: F,
) -> DescribeConfigsResponse
where
    F: FnOnce(DescribeConfigsRequest) -> Fut,
    Fut: Future<Output = DescribeConfigsResponse>,
{
    use describe_configs_response::DescribeConfigsResult;
    let op = Operation::DescribeConfigs;
    let mut codes = Vec::new();
    let denied = take_denied(&mut q.resources, |r| {
        let code = config_denied(a, op, r.resource_type, &r.resource_name);
        codes.extend(code);
        code.is_none()
    });
    let mut resp = f(q).await;
    resp.results
        .extend(denied.into_iter().zip(codes).map(|(r, code)| {
            DescribeConfigsResult::default()
                .with_error_code(code)
                .with_error_message(msg("Authorization failed."))
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name)
        }));
    resp
}

/// AlterConfigs: AlterConfigs on the topic, or on the cluster for a broker.
pub async fn alter_configs<F, Fut>(
    a: &Authz<'_>,
    mut q: AlterConfigsRequest,
    f: F,
) -> AlterConfigsResponse
where
    F: FnOnce(AlterConfigsRequest) -> Fut,
    Fut: Future<Output = AlterConfigsResponse>,
{
    use alter_configs_response::AlterConfigsResourceResponse;
    let op = Operation::AlterConfigs;
    let mut codes = Vec::new();
    let denied = take_denied(&mut q.resources, |r| {
        let code = config_denied(a, op, r.resource_type, &r.resource_name);
        codes.extend(code);
        code.is_none()
    });
    let mut resp = f(q).await;
    resp.responses
        .extend(denied.into_iter().zip(codes).map(|(r, code)| {
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(msg("Authorization failed."))
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name)
        }));
    resp
}

/// IncrementalAlterConfigs: as AlterConfigs.
pub async fn incremental_alter_configs<F, Fut>(
    a: &Authz<'_>,
    mut q: IncrementalAlterConfigsRequest,
    f: F,
) -> IncrementalAlterConfigsResponse
where
    F: FnOnce(IncrementalAlterConfigsRequest) -> Fut,
    Fut: Future<Output = IncrementalAlterConfigsResponse>,
{
    use incremental_alter_configs_response::AlterConfigsResourceResponse;
    let op = Operation::AlterConfigs;
    let mut codes = Vec::new();
    let denied = take_denied(&mut q.resources, |r| {
        let code = config_denied(a, op, r.resource_type, &r.resource_name);
        codes.extend(code);
        code.is_none()
    });
    let mut resp = f(q).await;
    resp.responses
        .extend(denied.into_iter().zip(codes).map(|(r, code)| {
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(msg("Authorization failed."))
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name)
        }));
    resp
}

// ---- cluster -----------------------------------------------------------------------

/// Runs `f` if the cluster allows `op`, else answers `deny()`.
pub async fn cluster_gate<Q, P, F, Fut>(
    a: &Authz<'_>,
    op: Operation,
    q: Q,
    deny: impl FnOnce(Q) -> P,
    f: F,
) -> P
where
    F: FnOnce(Q) -> Fut,
    Fut: Future<Output = P>,
{
    if !a.cluster(op) {
        return deny(q);
    }
    f(q).await
}

pub fn describe_log_dirs_denied(_: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    DescribeLogDirsResponse::default().with_error_code(CLUSTER_DENIED)
}

pub fn alter_replica_log_dirs_denied(q: AlterReplicaLogDirsRequest) -> AlterReplicaLogDirsResponse {
    use alter_replica_log_dirs_response::{
        AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
    };
    let results = q.dirs.into_iter().flat_map(|d| d.topics).map(|t| {
        let parts = t.partitions.iter().map(|p| {
            AlterReplicaLogDirPartitionResult::default()
                .with_partition_index(*p)
                .with_error_code(CLUSTER_DENIED)
        });
        AlterReplicaLogDirTopicResult::default()
            .with_topic_name(t.name)
            .with_partitions(parts.collect())
    });
    AlterReplicaLogDirsResponse::default().with_results(results.collect())
}

/// Every requested partition refused, and from v1 the top-level code too (v0 has no
/// top-level code: set there, the answer could not be encoded and the connection closed).
pub fn elect_leaders_denied(req: ElectLeadersRequest, version: i16) -> ElectLeadersResponse {
    use kafka_protocol::messages::elect_leaders_response::{
        PartitionResult, ReplicaElectionResult,
    };
    let results = req
        .topic_partitions
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    PartitionResult::default()
                        .with_partition_id(*p)
                        .with_error_code(CLUSTER_DENIED)
                        .with_error_message(msg("Cluster Alter is required"))
                })
                .collect();
            ReplicaElectionResult::default()
                .with_topic(t.topic)
                .with_partition_result(partitions)
        })
        .collect();
    let top = if version >= 1 { CLUSTER_DENIED } else { 0 };
    ElectLeadersResponse::default()
        .with_error_code(top)
        .with_replica_election_results(results)
}

pub fn alter_reassignments_denied(
    _: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    AlterPartitionReassignmentsResponse::default()
        .with_error_code(CLUSTER_DENIED)
        .with_error_message(msg("Cluster Alter is required"))
}

pub fn list_reassignments_denied(
    _: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    ListPartitionReassignmentsResponse::default()
        .with_error_code(CLUSTER_DENIED)
        .with_error_message(msg("Cluster Describe is required"))
}

pub fn describe_scram_denied(
    _: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    DescribeUserScramCredentialsResponse::default()
        .with_error_code(CLUSTER_DENIED)
        .with_error_message(msg("Cluster Describe is required"))
}

pub fn alter_scram_denied(
    q: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    use alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
    let users = q
        .deletions
        .iter()
        .map(|d| d.name.clone())
        .chain(q.upsertions.iter().map(|u| u.name.clone()));
    let results = users.map(|u| {
        AlterUserScramCredentialsResult::default()
            .with_user(u)
            .with_error_code(CLUSTER_DENIED)
            .with_error_message(msg("Cluster Alter is required"))
    });
    AlterUserScramCredentialsResponse::default().with_results(results.collect())
}

pub fn write_txn_markers_denied(q: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse {
    use write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    };
    let markers = q.markers.into_iter().map(|m| {
        let topics = m.topics.into_iter().map(|t| {
            let parts = t.partition_indexes.iter().map(|p| {
                WritableTxnMarkerPartitionResult::default()
                    .with_partition_index(*p)
                    .with_error_code(CLUSTER_DENIED)
            });
            WritableTxnMarkerTopicResult::default()
                .with_name(t.name)
                .with_partitions(parts.collect())
        });
        WritableTxnMarkerResult::default()
            .with_producer_id(m.producer_id)
            .with_topics(topics.collect())
    });
    WriteTxnMarkersResponse::default().with_markers(markers.collect())
}

// ---- transactions ------------------------------------------------------------------

/// InitProducerId: Write on the transactional id; without one (idempotence)
/// IdempotentWrite on the cluster or Write on some topic (KIP-679).
pub async fn init_producer_id<F, Fut>(
    a: &Authz<'_>,
    q: InitProducerIdRequest,
    f: F,
) -> InitProducerIdResponse
where
    F: FnOnce(InitProducerIdRequest) -> Fut,
    Fut: Future<Output = InitProducerIdResponse>,
{
    let refused = match &q.transactional_id {
        Some(id) => (!a.txn(Operation::Write, id)).then_some(TXN_DENIED),
        None => {
            let ok = a.cluster(Operation::IdempotentWrite)
                || a.on_some(Operation::Write, ResourceType::Topic);
            (!ok).then_some(CLUSTER_DENIED)
        }
    };
    match refused {
        Some(code) => InitProducerIdResponse::default()
            .with_error_code(code)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
        None => f(q).await,
    }
}

/// AddPartitionsToTxn (v0–v3): Write on the transactional id, then on every topic; a
/// refused topic leaves the others OPERATION_NOT_ATTEMPTED, as in Kafka.
pub async fn add_partitions_to_txn<F, Fut>(
    a: &Authz<'_>,
    q: AddPartitionsToTxnRequest,
    f: F,
) -> AddPartitionsToTxnResponse
where
    F: FnOnce(AddPartitionsToTxnRequest) -> Fut,
    Fut: Future<Output = AddPartitionsToTxnResponse>,
{
    use add_partitions_to_txn_response::{
        AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
    };
    let txn_ok = a.txn(Operation::Write, &q.v3_and_below_transactional_id);
    let denied: Vec<bool> = q
        .v3_and_below_topics
        .iter()
        .map(|t| !txn_ok || !a.topic(Operation::Write, &t.name))
        .collect();
    if !denied.iter().any(|d| *d) {
        return f(q).await;
    }
    let results = q.v3_and_below_topics.iter().zip(denied).map(|(t, no)| {
        let code = match (txn_ok, no) {
            (false, _) => TXN_DENIED,
            (true, true) => TOPIC_DENIED,
            (true, false) => errors::OPERATION_NOT_ATTEMPTED,
        };
        let parts = t.partitions.iter().map(|p| {
            AddPartitionsToTxnPartitionResult::default()
                .with_partition_index(*p)
                .with_partition_error_code(code)
        });
        AddPartitionsToTxnTopicResult::default()
            .with_name(t.name.clone())
            .with_results_by_partition(parts.collect())
    });
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results.collect())
}

/// AddPartitionsToTxn v4+ without ClusterAction: Kafka's top-level error, no results.
pub fn add_partitions_to_txn_batch_denied(
    _: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    AddPartitionsToTxnResponse::default().with_error_code(CLUSTER_DENIED)
}

/// AddOffsetsToTxn: Write on the transactional id, Read on the group.
pub async fn add_offsets_to_txn<F, Fut>(
    a: &Authz<'_>,
    q: AddOffsetsToTxnRequest,
    f: F,
) -> AddOffsetsToTxnResponse
where
    F: FnOnce(AddOffsetsToTxnRequest) -> Fut,
    Fut: Future<Output = AddOffsetsToTxnResponse>,
{
    if !a.txn(Operation::Write, &q.transactional_id) {
        return AddOffsetsToTxnResponse::default().with_error_code(TXN_DENIED);
    }
    if !a.group(Operation::Read, &q.group_id) {
        return AddOffsetsToTxnResponse::default().with_error_code(GROUP_DENIED);
    }
    f(q).await
}

/// EndTxn: Write on the transactional id.
pub async fn end_txn<F, Fut>(a: &Authz<'_>, q: EndTxnRequest, f: F) -> EndTxnResponse
where
    F: FnOnce(EndTxnRequest) -> Fut,
    Fut: Future<Output = EndTxnResponse>,
{
    if !a.txn(Operation::Write, &q.transactional_id) {
        return EndTxnResponse::default().with_error_code(TXN_DENIED);
    }
    f(q).await
}

/// TxnOffsetCommit: Write on the transactional id, Read on the group, Read on each topic.
pub async fn txn_offset_commit<F, Fut>(
    a: &Authz<'_>,
    mut q: TxnOffsetCommitRequest,
    f: F,
) -> TxnOffsetCommitResponse
where
    F: FnOnce(TxnOffsetCommitRequest) -> Fut,
    Fut: Future<Output = TxnOffsetCommitResponse>,
{
    use txn_offset_commit_response::{
        TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
    };
    let whole = if !a.txn(Operation::Write, &q.transactional_id) {
        Some(TXN_DENIED)
    } else if !a.group(Operation::Read, &q.group_id) {
        Some(GROUP_DENIED)
    } else {
        None
    };
    let denied = take_denied(&mut q.topics, |t| {
        whole.is_none() && a.topic(Operation::Read, &t.name)
    });
    let mut resp = match whole {
        Some(_) => TxnOffsetCommitResponse::default(),
        None => f(q).await,
    };
    let code = whole.unwrap_or(TOPIC_DENIED);
    resp.topics.extend(denied.into_iter().map(|t| {
        let parts = t.partitions.iter().map(|p| {
            TxnOffsetCommitResponsePartition::default()
                .with_partition_index(p.partition_index)
                .with_error_code(code)
        });
        TxnOffsetCommitResponseTopic::default()
            .with_name(t.name)
            .with_partitions(parts.collect())
    }));
    resp
}

/// DescribeTransactions: Describe on each transactional id.
pub async fn describe_transactions<F, Fut>(
    a: &Authz<'_>,
    mut q: DescribeTransactionsRequest,
    f: F,
) -> DescribeTransactionsResponse
where
    F: FnOnce(DescribeTransactionsRequest) -> Fut,
    Fut: Future<Output = DescribeTransactionsResponse>,
{
    use describe_transactions_response::TransactionState;
    let denied = take_denied(&mut q.transactional_ids, |id| {
        a.txn(Operation::Describe, id)
    });
    let mut resp = f(q).await;
    resp.transaction_states.extend(denied.into_iter().map(|id| {
        TransactionState::default()
            .with_transactional_id(id)
            .with_error_code(TXN_DENIED)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    }));
    resp
}

/// ListTransactions: only the transactional ids the principal may Describe.
pub async fn list_transactions<F, Fut>(
    a: &Authz<'_>,
    q: ListTransactionsRequest,
    f: F,
) -> ListTransactionsResponse
where
    F: FnOnce(ListTransactionsRequest) -> Fut,
    Fut: Future<Output = ListTransactionsResponse>,
{
    let mut resp = f(q).await;
    resp.transaction_states
        .retain(|t| a.txn(Operation::Describe, &t.transactional_id));
    resp
}

// ---- groups ------------------------------------------------------------------------

/// Runs `f` if the group allows `op`, else answers `deny()`.
pub async fn group_gate<P, Fut>(
    a: &Authz<'_>,
    op: Operation,
    group: &str,
    deny: impl FnOnce() -> P,
    f: Fut,
) -> P
where
    Fut: Future<Output = P>,
{
    if !a.group(op, group) {
        return deny();
    }
    f.await
}

pub fn join_group_denied() -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_error_code(GROUP_DENIED)
        .with_generation_id(-1)
}

pub fn sync_group_denied() -> SyncGroupResponse {
    SyncGroupResponse::default().with_error_code(GROUP_DENIED)
}

pub fn heartbeat_denied() -> HeartbeatResponse {
    HeartbeatResponse::default().with_error_code(GROUP_DENIED)
}

pub fn leave_group_denied() -> LeaveGroupResponse {
    LeaveGroupResponse::default().with_error_code(GROUP_DENIED)
}

/// FindCoordinator: Describe on the group (key type 0) or the transactional id (1).
pub async fn find_coordinator<F, Fut>(
    a: &Authz<'_>,
    mut q: FindCoordinatorRequest,
    version: i16,
    f: F,
) -> FindCoordinatorResponse
where
    F: FnOnce(FindCoordinatorRequest) -> Fut,
    Fut: Future<Output = FindCoordinatorResponse>,
{
    use find_coordinator_response::Coordinator;
    let txn = q.key_type == 1;
    let (op, code) = (
        Operation::Describe,
        if txn { TXN_DENIED } else { GROUP_DENIED },
    );
    let ok = |key: &str| match txn {
        true => a.txn(op, key),
        false => a.group(op, key),
    };
    if version < 4 {
        if !ok(&q.key) {
            return FindCoordinatorResponse::default()
                .with_error_code(code)
                .with_node_id(BrokerId(-1))
                .with_port(-1);
        }
        return f(q).await;
    }
    let denied = take_denied(&mut q.coordinator_keys, |k| ok(k));
    let mut resp = f(q).await;
    resp.coordinators.extend(denied.into_iter().map(|key| {
        Coordinator::default()
            .with_key(key)
            .with_node_id(BrokerId(-1))
            .with_port(-1)
            .with_error_code(code)
    }));
    resp
}

/// OffsetCommit: Read on the group, Read on each topic.
pub async fn offset_commit<F, Fut>(
    a: &Authz<'_>,
    mut q: OffsetCommitRequest,
    f: F,
) -> OffsetCommitResponse
where
    F: FnOnce(OffsetCommitRequest) -> Fut,
    Fut: Future<Output = OffsetCommitResponse>,
{
    use offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
    let group_ok = a.group(Operation::Read, &q.group_id);
    let denied = take_denied(&mut q.topics, |t| {
        group_ok && a.topic(Operation::Read, &t.name)
    });
    let mut resp = match group_ok {
        true => f(q).await,
        false => OffsetCommitResponse::default(),
    };
    let code = if group_ok { TOPIC_DENIED } else { GROUP_DENIED };
    resp.topics.extend(denied.into_iter().map(|t| {
        let parts = t.partitions.iter().map(|p| {
            OffsetCommitResponsePartition::default()
                .with_partition_index(p.partition_index)
                .with_error_code(code)
        });
        OffsetCommitResponseTopic::default()
            .with_name(t.name)
            .with_topic_id(t.topic_id)
            .with_partitions(parts.collect())
    }));
    resp
}

/// OffsetFetch: Describe on the group; Describe on each named topic (29 per partition),
/// or, for "all topics", only the topics the principal may Describe.
pub async fn offset_fetch<F, Fut>(
    a: &Authz<'_>,
    mut q: OffsetFetchRequest,
    version: i16,
    f: F,
) -> OffsetFetchResponse
where
    F: FnOnce(OffsetFetchRequest) -> Fut,
    Fut: Future<Output = OffsetFetchResponse>,
{
    use offset_fetch_response::*;
    if !a.enabled() {
        return f(q).await;
    }
    let describe = Operation::Describe;
    if version < 8 {
        if !a.group(describe, &q.group_id) {
            return super::groups::offset_fetch_error(&q, version, GROUP_DENIED);
        }
        let denied = match &mut q.topics {
            Some(topics) => take_denied(topics, |t| a.topic(describe, &t.name)),
            None => Vec::new(),
        };
        let mut resp = f(q).await;
        resp.topics.retain(|t| a.topic(describe, &t.name));
        resp.topics.extend(denied.into_iter().map(|t| {
            let parts = t.partition_indexes.iter().map(|p| {
                OffsetFetchResponsePartition::default()
                    .with_partition_index(*p)
                    .with_committed_offset(-1)
                    .with_committed_leader_epoch(-1)
                    .with_error_code(TOPIC_DENIED)
            });
            OffsetFetchResponseTopic::default()
                .with_name(t.name)
                .with_partitions(parts.collect())
        }));
        return resp;
    }
    let denied_groups = take_denied(&mut q.groups, |g| a.group(describe, &g.group_id));
    let mut denied_topics = Vec::new();
    for g in &mut q.groups {
        if let Some(topics) = &mut g.topics {
            let gone = take_denied(topics, |t| a.topic(describe, &t.name));
            denied_topics.push((g.group_id.clone(), gone));
        }
    }
    let mut resp = f(q).await;
    for g in &mut resp.groups {
        g.topics.retain(|t| a.topic(describe, &t.name));
        let gone = denied_topics.iter_mut().find(|(id, _)| *id == g.group_id);
        for t in gone.map(|(_, t)| std::mem::take(t)).unwrap_or_default() {
            let parts = t.partition_indexes.iter().map(|p| {
                OffsetFetchResponsePartitions::default()
                    .with_partition_index(*p)
                    .with_committed_offset(-1)
                    .with_committed_leader_epoch(-1)
                    .with_error_code(TOPIC_DENIED)
            });
            g.topics.push(
                OffsetFetchResponseTopics::default()
                    .with_name(t.name)
                    .with_partitions(parts.collect()),
            );
        }
    }
    resp.groups.extend(denied_groups.into_iter().map(|g| {
        OffsetFetchResponseGroup::default()
            .with_group_id(g.group_id)
            .with_error_code(GROUP_DENIED)
    }));
    resp
}

/// ListGroups: every group with Describe on the cluster, else those the principal may
/// Describe.
pub async fn list_groups<F, Fut>(a: &Authz<'_>, q: ListGroupsRequest, f: F) -> ListGroupsResponse
where
    F: FnOnce(ListGroupsRequest) -> Fut,
    Fut: Future<Output = ListGroupsResponse>,
{
    let mut resp = f(q).await;
    if !a.cluster(Operation::Describe) {
        resp.groups
            .retain(|g| a.group(Operation::Describe, &g.group_id));
    }
    resp
}

/// DescribeGroups: Describe on each group.
pub async fn describe_groups<F, Fut>(
    a: &Authz<'_>,
    mut q: DescribeGroupsRequest,
    f: F,
) -> DescribeGroupsResponse
where
    F: FnOnce(DescribeGroupsRequest) -> Fut,
    Fut: Future<Output = DescribeGroupsResponse>,
{
    use describe_groups_response::DescribedGroup;
    let denied = take_denied(&mut q.groups, |g| a.group(Operation::Describe, g));
    let include_operations = q.include_authorized_operations;
    let mut resp = f(q).await;
    if include_operations {
        for g in resp
            .groups
            .iter_mut()
            .filter(|g| g.error_code == errors::NONE)
        {
            g.authorized_operations = a.authorized_operations(ResourceType::Group, &g.group_id);
        }
    }
    resp.groups.extend(denied.into_iter().map(|g| {
        DescribedGroup::default()
            .with_group_id(g)
            .with_error_code(GROUP_DENIED)
    }));
    resp
}

/// DeleteGroups: Delete on each group.
pub async fn delete_groups<F, Fut>(
    a: &Authz<'_>,
    mut q: DeleteGroupsRequest,
    f: F,
) -> DeleteGroupsResponse
where
    F: FnOnce(DeleteGroupsRequest) -> Fut,
    Fut: Future<Output = DeleteGroupsResponse>,
{
    use delete_groups_response::DeletableGroupResult;
    let denied = take_denied(&mut q.groups_names, |g| a.group(Operation::Delete, g));
    let mut resp = f(q).await;
    resp.results.extend(denied.into_iter().map(|g| {
        DeletableGroupResult::default()
            .with_group_id(g)
            .with_error_code(GROUP_DENIED)
    }));
    resp
}

/// OffsetDelete: Delete on the group, Read on each topic.
pub async fn offset_delete<F, Fut>(
    a: &Authz<'_>,
    mut q: OffsetDeleteRequest,
    f: F,
) -> OffsetDeleteResponse
where
    F: FnOnce(OffsetDeleteRequest) -> Fut,
    Fut: Future<Output = OffsetDeleteResponse>,
{
    use offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
    if !a.group(Operation::Delete, &q.group_id) {
        return OffsetDeleteResponse::default().with_error_code(GROUP_DENIED);
    }
    let denied = take_denied(&mut q.topics, |t| a.topic(Operation::Read, &t.name));
    let mut resp = f(q).await;
    resp.topics.extend(denied.into_iter().map(|t| {
        let parts = t.partitions.iter().map(|p| {
            OffsetDeleteResponsePartition::default()
                .with_partition_index(p.partition_index)
                .with_error_code(TOPIC_DENIED)
        });
        OffsetDeleteResponseTopic::default()
            .with_name(t.name)
            .with_partitions(parts.collect())
    }));
    resp
}
