//! The transaction APIs (KIP-98): InitProducerId with a transactional id,
//! AddPartitionsToTxn, AddOffsetsToTxn, EndTxn (to the transaction coordinator, see
//! `crate::txn`), TxnOffsetCommit (to the group coordinator), WriteTxnMarkers (to the
//! partitions' owners), and the KIP-890 check a transactional produce passes (asked of
//! another node's coordinator with an inter-broker AddPartitionsToTxn v4).
//!
//! Each handler runs on the connection's shard and reaches the coordinator with a
//! `TxnCall` to the shard owning the transactional id's `__transaction_state` partition,
//! created (like `__consumer_offsets`) on first use.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, DescribeProducersRequest, DescribeProducersResponse,
    DescribeTransactionsRequest, DescribeTransactionsResponse, EndTxnRequest, EndTxnResponse,
    InitProducerIdRequest, InitProducerIdResponse, ListTransactionsRequest,
    ListTransactionsResponse, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use wire::{LeaderEpoch, Offset, ProducerEpoch, ProducerId};

use super::topic_name;
use crate::errors;
use crate::group::{CommitArgs, GroupReply, OFFSETS_TOPIC, OffsetCommit};
use crate::producer_state::partition::Marker;
use crate::shard::{DescribeProducersCall, Shard, WriteMarkerCall};
use crate::txn::{
    Settings, TRANSACTIONAL_ID_MAX_BYTES, TXN_TOPIC, TxnCall, TxnOp, TxnReply, partition_for,
};

/// Longest one coordinator call may take (it may write markers to many partitions).
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest one WriteTxnMarkers partition write may take.
const MARKER_TIMEOUT: Duration = Duration::from_secs(30);

/// The partition count of `__transaction_state`, creating the topic on first use.
pub async fn txn_partitions(shard: &Rc<Shard>) -> Result<i32, i16> {
    let s = Settings::from_config(shard.config());
    let replication = (s.replication_factor, Some(s.min_isr));
    super::admin::internal_topic_partitions(
        shard,
        TXN_TOPIC,
        s.num_partitions,
        s.segment_bytes,
        replication,
    )
    .await
}

/// The node the metadata image names as the leader of `__transaction_state` partition
/// `partition` if that is another node (in a cluster; a single node coordinates every id
/// itself).
fn coordinator_elsewhere(shard: &Shard, partition: i32) -> Option<i32> {
    let catalog = shard.catalog();
    let leader = catalog
        .topics
        .get(TXN_TOPIC)
        .and_then(|t| {
            usize::try_from(partition)
                .ok()
                .and_then(|i| t.assignment.get(i))
        })
        .map(|a| a.leader);
    leader.filter(|l| *l != shard.node_id().get())
}

fn valid_txn_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= TRANSACTIONAL_ID_MAX_BYTES
}

/// Runs `op` on the coordinator of `txn_id`.
pub async fn call_txn(shard: &Rc<Shard>, txn_id: &str, op: TxnOp) -> TxnReply {
    call_coordinator(shard, txn_id, op, true).await
}

/// Runs `op` on the coordinator of `txn_id`; a verification whose coordinator is on
/// another node is sent there only if `may_forward` (a verification that came from
/// another node is answered here, NOT_COORDINATOR if need be: two nodes whose metadata
/// disagree never pass it back and forth).
async fn call_coordinator(
    shard: &Rc<Shard>,
    txn_id: &str,
    op: TxnOp,
    may_forward: bool,
) -> TxnReply {
    let partitions = match txn_partitions(shard).await {
        Ok(n) => n,
        Err(code) => return TxnReply::Code(code),
    };
    let partition = partition_for(txn_id, partitions);
    if let TxnOp::AddPartitions {
        verify_only: true,
        producer_id,
        producer_epoch,
        partitions: ps,
        ..
    } = &op
        && may_forward
        && let Some(node) = coordinator_elsewhere(shard, partition)
    {
        // KIP-890's check asks the coordinator, here on another node: an inter-broker
        // AddPartitionsToTxn v4 with verify_only, as Kafka's partition leader sends.
        let producer = (*producer_id, *producer_epoch);
        return remote_verify(shard, node, txn_id, producer, ps).await;
    }
    let target = shard.router.owner(TXN_TOPIC, partition);
    let deadline = Instant::now() + TXN_CALL_TIMEOUT;
    match shard
        .call(target, TxnCall { partition, op }, deadline)
        .await
    {
        Ok(reply) => reply,
        // Kafka's coordinator never answers REQUEST_TIMED_OUT, which the Java client's
        // InitProducerId and EndTxn handlers take as fatal: a slow coordinator is a
        // coordinator not available (retried).
        Err(e) if e.code() == errors::REQUEST_TIMED_OUT => {
            TxnReply::Code(errors::COORDINATOR_NOT_AVAILABLE)
        }
        Err(e) => TxnReply::Code(e.code()),
    }
}

fn code_of(reply: &TxnReply) -> i16 {
    match reply {
        TxnReply::Code(c) => *c,
        TxnReply::Producer { error, .. } => *error,
        TxnReply::Partitions(codes) => codes
            .iter()
            .copied()
            .find(|c| *c != errors::NONE)
            .unwrap_or(errors::NONE),
        TxnReply::Described(c, _) => *c,
        TxnReply::Listed(_) => errors::NONE,
    }
}

/// InitProducerId with a transactional id (the dispatcher sends the others to the
/// idempotent allocator).
pub async fn init_producer_id(
    shard: &Rc<Shard>,
    req: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let txn_id = req
        .transactional_id
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    let error = |code: i16| {
        InitProducerIdResponse::default()
            .with_error_code(code)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1)
    };
    if !valid_txn_id(&txn_id) {
        return error(errors::INVALID_REQUEST);
    }
    let producer = (version >= 3 && req.producer_id.0 >= 0).then_some((
        ProducerId(req.producer_id.0),
        ProducerEpoch(req.producer_epoch),
    ));
    let op = TxnOp::InitProducerId {
        txn_id: txn_id.clone(),
        timeout_ms: req.transaction_timeout_ms,
        producer,
        version,
    };
    match call_txn(shard, &txn_id, op).await {
        TxnReply::Producer {
            error: errors::NONE,
            producer_id,
            producer_epoch,
        } => InitProducerIdResponse::default()
            .with_producer_id(producer_id.get().into())
            .with_producer_epoch(producer_epoch.get()),
        other => error(code_of(&other)),
    }
}

/// AddPartitionsToTxn: v0–v3 from clients (one transaction), v4+ from other brokers
/// (KIP-890: a batch of transactions, each adding its partitions or, `verify_only`, only
/// checking that they are in the ongoing transaction; the dispatcher has checked
/// ClusterAction).
pub async fn add_partitions(
    shard: &Rc<Shard>,
    req: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let mut resp = AddPartitionsToTxnResponse::default();
    if version >= 4 {
        for t in &req.transactions {
            let txn_id = t.transactional_id.0.to_string();
            let wanted = flatten(&t.topics);
            let producer = (ProducerId(t.producer_id.0), ProducerEpoch(t.producer_epoch));
            let verify = t.verify_only;
            let per = add_for_txn(shard, &txn_id, producer, &wanted, verify, false).await;
            let per = per.into_iter().map(|c| for_version(c, version));
            let mut result = AddPartitionsToTxnResult::default();
            result.transactional_id = t.transactional_id.clone();
            result.topic_results = topic_results(&wanted, per);
            resp.results_by_transaction.push(result);
        }
        return resp;
    }
    let txn_id = req.v3_and_below_transactional_id.0.to_string();
    let wanted = flatten(&req.v3_and_below_topics);
    let producer = (
        ProducerId(req.v3_and_below_producer_id.0),
        ProducerEpoch(req.v3_and_below_producer_epoch),
    );
    let per = add_for_txn(shard, &txn_id, producer, &wanted, false, true).await;
    let per = per.into_iter().map(|c| for_version(c, version));
    resp.results_by_topic_v3_and_below = topic_results(&wanted, per);
    resp
}

fn flatten(topics: &[AddPartitionsToTxnTopic]) -> Vec<(String, i32)> {
    topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.to_string(), *p)))
        .collect()
}

/// A code as AddPartitionsToTxn `version` may carry it: PRODUCER_FENCED from v2,
/// TRANSACTION_ABORTABLE from v5 (Kafka's older answers instead).
fn for_version(code: i16, version: i16) -> i16 {
    match code {
        errors::PRODUCER_FENCED if version < 2 => errors::INVALID_PRODUCER_EPOCH,
        errors::TRANSACTION_ABORTABLE if version < 5 => errors::INVALID_TXN_STATE,
        code => code,
    }
}

/// A code as EndTxn or AddOffsetsToTxn `version` may carry it: PRODUCER_FENCED from v2
/// (KIP-588); before, Kafka answers INVALID_PRODUCER_EPOCH, which clients of those
/// versions (librdkafka's EndTxn v0-1, Java before 2.7) know as fencing.
fn fenced_for_version(code: i16, version: i16) -> i16 {
    match code {
        errors::PRODUCER_FENCED if version < 2 => errors::INVALID_PRODUCER_EPOCH,
        code => code,
    }
}

/// One transaction's partitions added (or, `verify_only`, checked): a code per partition,
/// in order. Any unknown partition fails the whole transaction (Kafka: the others
/// OPERATION_NOT_ATTEMPTED); an add answers one code for all, a check one each.
/// `from_client`: a v0–v3 request (a v4+ one came from another node: never forwarded).
async fn add_for_txn(
    shard: &Rc<Shard>,
    txn_id: &str,
    producer: (ProducerId, ProducerEpoch),
    wanted: &[(String, i32)],
    verify_only: bool,
    from_client: bool,
) -> Vec<i16> {
    let catalog = shard.catalog();
    let known = |(t, p): &(String, i32)| {
        t != OFFSETS_TOPIC
            && t != TXN_TOPIC
            && catalog
                .topics
                .get(t)
                .is_some_and(|m| *p >= 0 && *p < m.partitions)
    };
    if !valid_txn_id(txn_id) {
        return vec![errors::INVALID_REQUEST; wanted.len()];
    }
    if wanted.iter().any(|tp| !known(tp)) {
        return wanted
            .iter()
            .map(|tp| {
                if known(tp) {
                    errors::OPERATION_NOT_ATTEMPTED
                } else {
                    errors::UNKNOWN_TOPIC_OR_PARTITION
                }
            })
            .collect();
    }
    drop(catalog);
    if wanted.is_empty() {
        return Vec::new();
    }
    let op = TxnOp::AddPartitions {
        txn_id: txn_id.to_string(),
        producer_id: producer.0,
        producer_epoch: producer.1,
        partitions: wanted.to_vec(),
        verify_only,
    };
    match call_coordinator(shard, txn_id, op, from_client).await {
        TxnReply::Partitions(per) if verify_only && per.len() == wanted.len() => per,
        other => vec![code_of(&other); wanted.len()],
    }
}

/// Results grouped by topic, consecutive partitions of one topic together (the request's
/// order).
fn topic_results(
    wanted: &[(String, i32)],
    codes: impl Iterator<Item = i16>,
) -> Vec<AddPartitionsToTxnTopicResult> {
    let mut topics: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
    for ((t, p), code) in wanted.iter().zip(codes) {
        let mut r = AddPartitionsToTxnPartitionResult::default();
        r.partition_index = *p;
        r.partition_error_code = code;
        match topics.last_mut() {
            Some(last) if last.name.0.as_str() == t => last.results_by_partition.push(r),
            _ => {
                let mut tr = AddPartitionsToTxnTopicResult::default();
                tr.name = topic_name(t);
                tr.results_by_partition.push(r);
                topics.push(tr);
            }
        }
    }
    topics
}

/// AddPartitionsToTxn version a partition leader sends to verify (KIP-890's first).
const VERIFY_VERSION: i16 = 4;
/// Longest a partition leader waits for another node's coordinator to verify a batch
/// (connect, request, answer); the produce is refused, retriably, after it.
const REMOTE_VERIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// KIP-890's check on the coordinator on node `node`: an AddPartitionsToTxn v4 with
/// verify_only. Each answer per partition; a node that cannot be reached or answers
/// with a top-level error: COORDINATOR_NOT_AVAILABLE for all (never accepted unchecked).
async fn remote_verify(
    shard: &Rc<Shard>,
    node: i32,
    txn_id: &str,
    producer: (ProducerId, ProducerEpoch),
    partitions: &[(String, i32)],
) -> TxnReply {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTransaction;
    let unreachable = TxnReply::Code(errors::COORDINATOR_NOT_AVAILABLE);
    let (host, port) = {
        let catalog = shard.catalog();
        let Some(n) = catalog.nodes.get(&node).filter(|n| !n.fenced) else {
            return unreachable;
        };
        (n.host.clone(), n.port)
    };
    let Some(addr) = crate::resolve::resolve(&host, port).await else {
        return unreachable;
    };
    let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
    for (t, p) in partitions {
        match topics.last_mut() {
            Some(last) if last.name.0.as_str() == t => last.partitions.push(*p),
            _ => topics.push(
                AddPartitionsToTxnTopic::default()
                    .with_name(topic_name(t))
                    .with_partitions(vec![*p]),
            ),
        }
    }
    let txn = AddPartitionsToTxnTransaction::default()
        .with_transactional_id(kafka_protocol::messages::TransactionalId(super::str_bytes(
            txn_id,
        )))
        .with_producer_id(producer.0.get().into())
        .with_producer_epoch(producer.1.get())
        .with_verify_only(true)
        .with_topics(topics);
    let req = AddPartitionsToTxnRequest::default().with_transactions(vec![txn]);
    let deadline = Instant::now() + REMOTE_VERIFY_TIMEOUT;
    let call = async {
        let mut conn = crate::replication::client::BrokerConn::connect_to(&host, addr).await?;
        conn.call(&req, VERIFY_VERSION, deadline).await
    };
    let resp = match call.await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::info!(
                txn_id,
                node,
                "verifying a transactional batch with its coordinator failed: {e}"
            );
            return unreachable;
        }
    };
    if resp.error_code != errors::NONE {
        tracing::info!(
            txn_id,
            node,
            code = resp.error_code,
            "the coordinator refused to verify"
        );
        return unreachable;
    }
    let Some(result) = resp
        .results_by_transaction
        .iter()
        .find(|r| r.transactional_id.0.as_str() == txn_id)
    else {
        return unreachable;
    };
    let per = partitions.iter().map(|(t, p)| {
        result
            .topic_results
            .iter()
            .filter(|r| r.name.0.as_str() == t)
            .flat_map(|r| r.results_by_partition.iter())
            .find(|r| r.partition_index == *p)
            .map_or(errors::COORDINATOR_NOT_AVAILABLE, |r| {
                r.partition_error_code
            })
    });
    TxnReply::Partitions(per.collect())
}

pub async fn add_offsets(
    shard: &Rc<Shard>,
    req: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let txn_id = req.transactional_id.0.to_string();
    let group = req.group_id.0.to_string();
    let code = if !valid_txn_id(&txn_id) || group.is_empty() {
        errors::INVALID_REQUEST
    } else {
        match super::groups::offsets_partitions(shard).await {
            Err(code) => code,
            Ok(n) => {
                let partition = crate::group::partition_for(&group, n);
                let op = TxnOp::AddPartitions {
                    txn_id: txn_id.clone(),
                    producer_id: ProducerId(req.producer_id.0),
                    producer_epoch: ProducerEpoch(req.producer_epoch),
                    partitions: vec![(OFFSETS_TOPIC.to_string(), partition)],
                    verify_only: false,
                };
                fenced_for_version(code_of(&call_txn(shard, &txn_id, op).await), version)
            }
        }
    };
    AddOffsetsToTxnResponse::default().with_error_code(code)
}

pub async fn end_txn(shard: &Rc<Shard>, req: EndTxnRequest, version: i16) -> EndTxnResponse {
    let txn_id = req.transactional_id.0.to_string();
    let code = if !valid_txn_id(&txn_id) {
        errors::INVALID_REQUEST
    } else {
        let op = TxnOp::EndTxn {
            txn_id: txn_id.clone(),
            producer_id: ProducerId(req.producer_id.0),
            producer_epoch: ProducerEpoch(req.producer_epoch),
            commit: req.committed,
        };
        fenced_for_version(code_of(&call_txn(shard, &txn_id, op).await), version)
    };
    EndTxnResponse::default().with_error_code(code)
}

/// TxnOffsetCommit: to the group coordinator, held there until the marker.
pub async fn txn_offset_commit(
    shard: &Rc<Shard>,
    req: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let group = req.group_id.0.to_string();
    let args = CommitArgs {
        group: group.clone(),
        generation: req.generation_id,
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()),
        offsets: req
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| OffsetCommit {
                    topic: t.name.0.to_string(),
                    partition: p.partition_index,
                    offset: Offset(p.committed_offset),
                    leader_epoch: LeaderEpoch(p.committed_leader_epoch),
                    metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                })
            })
            .collect(),
    };
    let count = args.offsets.len();
    let txn_id = req.transactional_id.0.to_string();
    let producer = (
        ProducerId(req.producer_id.0),
        ProducerEpoch(req.producer_epoch),
    );
    let per = if group.is_empty() || !valid_txn_id(&txn_id) {
        vec![errors::INVALID_REQUEST; count]
    } else {
        match commit_txn_offsets(shard, &txn_id, producer, args).await {
            GroupReply::Codes(_, per) if per.len() == count => per,
            GroupReply::Code(code) | GroupReply::Codes(code, _) => vec![code; count],
            _ => vec![errors::UNKNOWN_SERVER_ERROR; count],
        }
    };
    let mut resp = TxnOffsetCommitResponse::default();
    let mut codes = per.into_iter();
    for t in &req.topics {
        let mut tr = TxnOffsetCommitResponseTopic::default();
        tr.name = t.name.clone();
        for p in &t.partitions {
            let mut pr = TxnOffsetCommitResponsePartition::default();
            pr.partition_index = p.partition_index;
            pr.error_code = codes.next().unwrap_or(errors::UNKNOWN_SERVER_ERROR);
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    resp
}

/// Longest a TxnOffsetCommit may take on the group coordinator's shard (its KIP-890
/// check, then its append, replicated), as any group call.
const TXN_COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends a TxnOffsetCommit to the shard of its group's coordinator, which checks it with
/// the transaction coordinator and appends it (`TxnOffsetCommitCall`).
async fn commit_txn_offsets(
    shard: &Rc<Shard>,
    txn_id: &str,
    producer: (ProducerId, ProducerEpoch),
    commit: CommitArgs,
) -> GroupReply {
    let partitions = match super::groups::offsets_partitions(shard).await {
        Ok(n) => n,
        Err(code) => return GroupReply::Code(code),
    };
    let partition = crate::group::partition_for(&commit.group, partitions);
    let call = crate::shard::calls::TxnOffsetCommitCall {
        partition,
        transactional_id: Arc::from(txn_id),
        commit,
        producer,
    };
    let target = shard.router.owner(OFFSETS_TOPIC, partition);
    let deadline = Instant::now() + TXN_COMMIT_TIMEOUT;
    match shard.call(target, call, deadline).await {
        Ok(reply) => reply,
        Err(e) => GroupReply::Code(e.code()),
    }
}

/// KIP-890 for transactional offsets (Kafka 3.6+): the group's `__consumer_offsets`
/// partition (`partition`) must be in the producer's ongoing transaction
/// (AddOffsetsToTxn) at this epoch. Unchecked, an offset commit of no transaction, or one
/// that arrives after its transaction ended, opened a transaction no marker would ever
/// close: the partition's LSO stood still, its cleaner stopped, and `require_stable`
/// fetches waited for ever. Asked from the group coordinator's shard, under a
/// verification begun there (`shard::calls::TxnOffsetCommitCall`).
pub(crate) async fn verify_offsets(
    shard: &Rc<Shard>,
    txn_id: &str,
    producer: (ProducerId, ProducerEpoch),
    partition: i32,
) -> i16 {
    match verify_produce(shard, txn_id, producer, OFFSETS_TOPIC, partition).await {
        // verify_produce's mapping of a busy coordinator, for a produce; a TxnOffsetCommit
        // retries this one.
        errors::NOT_ENOUGH_REPLICAS => errors::COORDINATOR_NOT_AVAILABLE,
        code => code,
    }
}

/// WriteTxnMarkers (an inter-broker API, served for completeness): each marker to each
/// of its partitions, on the partitions' owners.
pub async fn write_txn_markers(
    shard: &Rc<Shard>,
    req: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let mut resp = WriteTxnMarkersResponse::default();
    for m in &req.markers {
        let marker = Marker {
            producer_id: ProducerId(m.producer_id.0),
            producer_epoch: ProducerEpoch(m.producer_epoch),
            commit: m.transaction_result,
            coordinator_epoch: m.coordinator_epoch,
        };
        let mut result = WritableTxnMarkerResult::default();
        result.producer_id = m.producer_id;
        for t in &m.topics {
            let mut tr = WritableTxnMarkerTopicResult::default();
            tr.name = t.name.clone();
            for p in &t.partition_indexes {
                let tp = (Arc::from(t.name.0.as_str()), *p);
                let owner = shard.router.owner(&tp.0, tp.1);
                let deadline = Instant::now() + MARKER_TIMEOUT;
                let call = WriteMarkerCall { tp, marker };
                let code = match shard.call(owner, call, deadline).await {
                    Ok(code) => code,
                    Err(e) => e.code(),
                };
                let mut pr = WritableTxnMarkerPartitionResult::default();
                pr.partition_index = *p;
                pr.error_code = code;
                tr.partitions.push(pr);
            }
            result.topics.push(tr);
        }
        resp.markers.push(result);
    }
    resp
}

/// KIP-890's check, on a transactional batch that would open a transaction in a
/// partition: the partition must be in the producer's ongoing transaction (else
/// INVALID_TXN_STATE), with the producer's current epoch (else PRODUCER_FENCED, which a
/// Produce answers as INVALID_PRODUCER_EPOCH).
pub async fn verify_produce(
    shard: &Rc<Shard>,
    txn_id: &str,
    producer: (ProducerId, ProducerEpoch),
    topic: &str,
    partition: i32,
) -> i16 {
    let op = TxnOp::AddPartitions {
        txn_id: txn_id.to_string(),
        producer_id: producer.0,
        producer_epoch: producer.1,
        partitions: vec![(topic.to_string(), partition)],
        verify_only: true,
    };
    match code_of(&call_txn(shard, txn_id, op).await) {
        errors::PRODUCER_FENCED => errors::INVALID_PRODUCER_EPOCH,
        errors::INVALID_PRODUCER_ID_MAPPING
        | errors::TRANSACTION_ABORTABLE
        | errors::INVALID_TXN_STATE => errors::INVALID_TXN_STATE,
        // Kafka's mapping of a coordinator that cannot answer now to an error a producer
        // knows and retries.
        errors::COORDINATOR_NOT_AVAILABLE
        | errors::COORDINATOR_LOAD_IN_PROGRESS
        | errors::NOT_COORDINATOR
        | errors::CONCURRENT_TRANSACTIONS => errors::NOT_ENOUGH_REPLICAS,
        code => code,
    }
}

/// DescribeTransactions: each id's state from its coordinator.
pub async fn describe(
    shard: &Rc<Shard>,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
    let mut resp = DescribeTransactionsResponse::default();
    for id in &req.transactional_ids {
        let txn_id = id.0.to_string();
        let mut state = TransactionState::default();
        state.transactional_id = id.clone();
        let reply = if valid_txn_id(&txn_id) {
            let op = TxnOp::Describe {
                txn_id: txn_id.clone(),
            };
            call_txn(shard, &txn_id, op).await
        } else {
            TxnReply::Code(errors::TRANSACTIONAL_ID_NOT_FOUND)
        };
        match reply {
            TxnReply::Described(errors::NONE, Some(m)) => {
                state.transaction_state = super::str_bytes(m.state.name());
                state.transaction_timeout_ms = m.timeout_ms;
                state.transaction_start_time_ms = m.start_ms;
                state.producer_id = m.producer_id.get().into();
                state.producer_epoch = m.producer_epoch.get();
                let mut topics: Vec<TopicData> = Vec::new();
                for (t, p) in &m.partitions {
                    match topics.last_mut() {
                        Some(last) if last.topic.0.as_str() == t => last.partitions.push(*p),
                        _ => {
                            let mut td = TopicData::default();
                            td.topic = topic_name(t);
                            td.partitions.push(*p);
                            topics.push(td);
                        }
                    }
                }
                state.topics = topics;
            }
            other => {
                state.error_code = match code_of(&other) {
                    errors::NONE => errors::TRANSACTIONAL_ID_NOT_FOUND,
                    code => code,
                };
                state.producer_id = (-1).into();
                state.producer_epoch = -1;
            }
        }
        resp.transaction_states.push(state);
    }
    resp
}

/// ListTransactions: every shard's transactions, filtered by state and producer id.
pub async fn list(shard: &Rc<Shard>, req: ListTransactionsRequest) -> ListTransactionsResponse {
    use kafka_protocol::messages::list_transactions_response::TransactionState;
    let mut resp = ListTransactionsResponse::default();
    const STATES: [&str; 8] = [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ];
    // Filters as sets, each unknown one answered once: the request's lists are the
    // client's to make long (matched per listed transaction, they were quadratic).
    let states: std::collections::HashSet<&str> =
        req.state_filters.iter().map(|f| f.as_str()).collect();
    let pids: std::collections::HashSet<i64> =
        req.producer_id_filters.iter().map(|p| p.0).collect();
    let mut unknown: Vec<&str> = states
        .iter()
        .copied()
        .filter(|f| !STATES.contains(f))
        .collect();
    unknown.sort_unstable();
    resp.unknown_state_filters = unknown.into_iter().map(super::str_bytes).collect();
    if !shard.catalog().topics.contains_key(TXN_TOPIC) {
        return resp;
    }
    for s in 0..shard.router.shards() {
        let call = TxnCall {
            partition: -1,
            op: TxnOp::List,
        };
        let deadline = Instant::now() + TXN_CALL_TIMEOUT;
        let listed = match shard.call(crate::router::ShardId(s), call, deadline).await {
            Ok(TxnReply::Listed(listed)) => listed,
            Ok(other) => {
                resp.error_code = code_of(&other);
                continue;
            }
            Err(e) => {
                resp.error_code = e.code();
                continue;
            }
        };
        for (id, pid, state) in listed {
            let state_ok = states.is_empty() || states.contains(state);
            let pid_ok = pids.is_empty() || pids.contains(&pid.get());
            if !(state_ok && pid_ok) {
                continue;
            }
            let mut t = TransactionState::default();
            t.transactional_id = kafka_protocol::messages::TransactionalId(super::str_bytes(&id));
            t.producer_id = pid.get().into();
            t.transaction_state = super::str_bytes(state);
            resp.transaction_states.push(t);
        }
    }
    resp
}

/// Longest one DescribeProducers partition may take on its owner.
const DESCRIBE_PRODUCERS_TIMEOUT: Duration = Duration::from_secs(30);

/// The partition entries a DescribeProducers names (for the request bound).
pub fn describe_producers_partitions(req: &DescribeProducersRequest) -> usize {
    req.topics.iter().map(|t| t.partition_indexes.len()).sum()
}

/// DescribeProducers (KIP-664, what `kafka-transactions.sh describe-producers` and
/// `find-hanging` send): each partition's active producers, answered by its leader.
/// A partition named twice is answered once: each answer copies producer state.
pub async fn describe_producers(
    shard: &Rc<Shard>,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    use kafka_protocol::messages::describe_producers_response::{
        PartitionResponse, ProducerState, TopicResponse,
    };
    let mut seen: std::collections::HashSet<(String, i32)> = std::collections::HashSet::new();
    let mut resp = DescribeProducersResponse::default();
    for t in req.topics {
        let name: Arc<str> = Arc::from(t.name.0.as_str());
        let known = shard.catalog().topics.contains_key(&*name);
        let tasks: Vec<_> = t
            .partition_indexes
            .iter()
            .filter(|p| seen.insert((name.to_string(), **p)))
            .map(|&index| {
                let tp = (name.clone(), index);
                let s = shard.clone();
                let task = known.then(|| {
                    let deadline = Instant::now() + DESCRIBE_PRODUCERS_TIMEOUT;
                    let call = DescribeProducersCall { tp: tp.clone() };
                    glommio::spawn_local(async move { s.call_owner(&tp, call, deadline).await })
                });
                (index, task)
            })
            .collect();
        let mut partitions = Vec::with_capacity(tasks.len());
        for (index, task) in tasks {
            let described = match task {
                None => Err(errors::UNKNOWN_TOPIC_OR_PARTITION),
                Some(task) => task.await.unwrap_or_else(|e| Err(e.code())),
            };
            let mut p = PartitionResponse::default().with_partition_index(index);
            match described {
                Ok(producers) => {
                    p.active_producers = producers
                        .into_iter()
                        .map(|a| {
                            ProducerState::default()
                                .with_producer_id(kafka_protocol::messages::ProducerId(
                                    a.producer_id.get(),
                                ))
                                .with_producer_epoch(i32::from(a.epoch.0))
                                .with_last_sequence(a.last_sequence.0)
                                .with_last_timestamp(a.last_timestamp)
                                .with_coordinator_epoch(a.coordinator_epoch)
                                .with_current_txn_start_offset(a.txn_start.map_or(-1, |o| o.get()))
                        })
                        .collect();
                }
                Err(code) => p.error_code = code,
            }
            partitions.push(p);
        }
        resp.topics.push(
            TopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    resp
}
