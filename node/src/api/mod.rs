//! Request dispatch: checks the API key and version against what weir serves, decodes the
//! typed request, runs the handler of its API family, and encodes the response frame.
//!
//! A handler returns `Ok(None)` when Kafka sends no response (Produce with acks=0). A
//! decode failure or an unserved version closes the connection (Kafka does the same);
//! the one exception is ApiVersions, which answers UNSUPPORTED_VERSION so the client can
//! pick a version it shares with us.

pub mod admin;
pub mod configs;
pub mod fetch;
pub mod fetch_budget;
pub mod fetch_session;
pub mod groups;
pub mod metadata;
pub mod offsets;
pub mod produce;
pub mod replicas;
pub mod sasl;
pub mod txn;
pub mod versions;

use std::rc::Rc;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable};

use wire::{WireError, api};

use crate::producer_state::init_producer_id::handle_on_shard as init_producer_id;
use crate::proto::{self, Request};
use crate::server::session::Session;
use crate::shard::Shard;

/// Frames to write for one request: `None` = no response; `Some(vec![])` = close.
pub type Response = Option<Vec<Bytes>>;

/// The response that makes the connection writer close the connection.
pub fn close() -> Response {
    Some(Vec::new())
}

/// Handles one request of `session`'s connection; never panics on its content.
pub async fn handle(shard: &Rc<Shard>, req: Request, session: &Session) -> Response {
    let peer = session.peer;
    if req.api_key == api::API_VERSIONS {
        return versions::handle(&req);
    }
    if !proto::is_served(req.api_key, req.version) {
        let (key, version) = (req.api_key, req.version);
        crate::client_warn!(%peer, "closing connection: unsupported api key {key} version {version}");
        return close();
    }
    let (name, version, api_key) = (req.api_name(), req.version, req.api_key);
    let started = std::time::Instant::now();
    let routed = match req.key() {
        Some(key) if groups::is_group_api(key) => groups::dispatch(shard, &req, session).await,
        Some(ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) => {
            sasl::handle(shard, &req, session).await
        }
        // Produce takes the request by value: it reuses the frame's bytes for the log.
        Some(ApiKey::Produce) => produce::handle(shard, req).await,
        _ => dispatch(shard, &req, session.advertised()).await,
    };
    let closed = routed.is_err();
    shard
        .metrics()
        .request(api_key, version, started.elapsed(), closed);
    match routed {
        Ok(resp) => resp,
        Err(e) => {
            crate::client_warn!(%peer, "closing connection: {name} v{version}: {e}");
            close()
        }
    }
}

async fn dispatch(
    shard: &Rc<Shard>,
    req: &Request,
    advertised: &(String, u16),
) -> Result<Response, WireError> {
    let v = req.version;
    match req.key() {
        Some(ApiKey::Metadata) => run(req, |r| metadata::handle(shard, r, v, advertised)).await,
        Some(ApiKey::DescribeCluster) => {
            run(req, |r| metadata::describe_cluster(shard, r, advertised)).await
        }
        Some(ApiKey::DescribeUserScramCredentials) => {
            run(req, |r| sasl::describe_scram(shard, r)).await
        }
        Some(ApiKey::AlterUserScramCredentials) => run(req, |r| sasl::alter_scram(shard, r)).await,
        Some(ApiKey::InitProducerId) => run(req, |r| init_producer_id_any(shard, r, v)).await,
        Some(ApiKey::AddPartitionsToTxn) => run(req, |r| txn::add_partitions(shard, r)).await,
        Some(ApiKey::AddOffsetsToTxn) => run(req, |r| txn::add_offsets(shard, r)).await,
        Some(ApiKey::EndTxn) => run(req, |r| txn::end_txn(shard, r)).await,
        Some(ApiKey::TxnOffsetCommit) => run(req, |r| txn::txn_offset_commit(shard, r)).await,
        Some(ApiKey::WriteTxnMarkers) => run(req, |r| txn::write_txn_markers(shard, r)).await,
        Some(ApiKey::DescribeTransactions) => run(req, |r| txn::describe(shard, r)).await,
        Some(ApiKey::ListTransactions) => run(req, |r| txn::list(shard, r)).await,
        Some(ApiKey::Fetch) => fetch::handle(shard, req).await,
        Some(ApiKey::ListOffsets) => run(req, |r| offsets::list_offsets(shard, r, v)).await,
        Some(ApiKey::DeleteRecords) => run(req, |r| offsets::delete_records(shard, r)).await,
        Some(ApiKey::OffsetForLeaderEpoch) => {
            run(req, |r| offsets::offset_for_leader_epoch(shard, r)).await
        }
        Some(ApiKey::CreateTopics) => run(req, |r| admin::create_topics(shard, r)).await,
        Some(ApiKey::DeleteTopics) => run(req, |r| admin::delete_topics(shard, r)).await,
        Some(ApiKey::CreatePartitions) => run(req, |r| admin::create_partitions(shard, r)).await,
        Some(ApiKey::DescribeConfigs) => run(req, |r| configs::describe(shard, r)).await,
        Some(ApiKey::AlterConfigs) => run(req, |r| configs::alter(shard, r)).await,
        Some(ApiKey::IncrementalAlterConfigs) => {
            run(req, |r| configs::incremental_alter(shard, r)).await
        }
        Some(ApiKey::DescribeLogDirs) => run(req, |r| replicas::describe_log_dirs(shard, r)).await,
        Some(ApiKey::AlterReplicaLogDirs) => {
            run(req, |r| replicas::alter_replica_log_dirs(shard, r)).await
        }
        Some(ApiKey::ElectLeaders) => run(req, |r| replicas::elect_leaders(shard, r)).await,
        Some(ApiKey::AlterPartitionReassignments) => {
            run(req, |r| replicas::alter_partition_reassignments(shard, r)).await
        }
        Some(ApiKey::ListPartitionReassignments) => {
            run(req, |r| replicas::list_partition_reassignments(shard, r)).await
        }
        _ => Err(WireError::UnsupportedVersion {
            api_key: req.api_key,
            api_version: req.version,
        }),
    }
}

/// InitProducerId: with a transactional id to the transaction coordinator, else the
/// idempotent producer id allocator of this shard.
async fn init_producer_id_any(
    shard: &Rc<Shard>,
    req: kafka_protocol::messages::InitProducerIdRequest,
    version: i16,
) -> kafka_protocol::messages::InitProducerIdResponse {
    if req.transactional_id.is_some() {
        return txn::init_producer_id(shard, req, version).await;
    }
    init_producer_id(shard, req, version).await
}

/// Decode, run, encode: the shape of every handler that always answers.
async fn run<Q, P, F, Fut>(req: &Request, f: F) -> Result<Response, WireError>
where
    Q: Decodable,
    P: Encodable,
    F: FnOnce(Q) -> Fut,
    Fut: std::future::Future<Output = P>,
{
    let typed: Q = proto::decode(req)?;
    let resp = f(typed).await;
    let frame = proto::encode_response(req, &resp)?;
    Ok(Some(vec![frame]))
}

/// A topic name as a kafka-protocol `TopicName`.
pub fn topic_name(name: &str) -> kafka_protocol::messages::TopicName {
    kafka_protocol::messages::TopicName(kafka_protocol::protocol::StrBytes::from_string(
        name.to_string(),
    ))
}

/// A string as `StrBytes`.
pub fn str_bytes(s: &str) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.to_string())
}
