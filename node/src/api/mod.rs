//! Request dispatch: checks the API key and version against what weir serves, decodes the
//! typed request, runs the handler of its API family, and encodes the response frame.
//!
//! A handler returns `Ok(None)` when Kafka sends no response (Produce with acks=0). A
//! decode failure or an unserved version closes the connection (Kafka does the same);
//! the one exception is ApiVersions, which answers UNSUPPORTED_VERSION so the client can
//! pick a version it shares with us.

pub mod acls;
pub mod admin;
pub mod authz;
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
use crate::security::acl::Operation;
use crate::server::session::Session;
use crate::shard::Shard;
use authz::Authz;

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
        // The futures of every API but Produce are boxed: each request's task is as large
        // as the largest future it may hold, and it is copied whole when spawned (7 KiB
        // with the group and transaction handlers inline, a memcpy per Produce).
        Some(key) if groups::is_group_api(key) => {
            Box::pin(groups::dispatch(shard, &req, session)).await
        }
        Some(ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) => {
            sasl::handle(shard, &req, session).await
        }
        // Produce takes the request by value: it reuses the frame's bytes for the log.
        Some(ApiKey::Produce) => produce::handle(shard, req, &Authz::new(shard, session)).await,
        _ => Box::pin(dispatch(shard, &req, session)).await,
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

/// Every API not routed above, each behind its authorization wrapper (`authz`).
async fn dispatch(
    shard: &Rc<Shard>,
    req: &Request,
    session: &Session,
) -> Result<Response, WireError> {
    let v = req.version;
    let listener = &*session.listener;
    let a = &Authz::new(shard, session);
    match req.key() {
        Some(ApiKey::Metadata) => run(req, |r| metadata::handle(shard, r, v, listener, a)).await,
        Some(ApiKey::DescribeCluster) => {
            run(req, |r| metadata::describe_cluster(shard, r, listener, a)).await
        }
        Some(ApiKey::Fetch) => fetch::handle(shard, req, a).await,
        // Boxed, so that a Fetch's future is not as large as theirs.
        _ => match Box::pin(transactional(shard, req, a)).await {
            Some(routed) => routed,
            None => Box::pin(administrative(shard, req, a)).await,
        },
    }
}

/// Producer ids and transactions; `None` for any other API.
async fn transactional(
    shard: &Rc<Shard>,
    req: &Request,
    a: &Authz<'_>,
) -> Option<Result<Response, WireError>> {
    let v = req.version;
    let routed = match req.key()? {
        ApiKey::InitProducerId => {
            run(req, |r| {
                authz::init_producer_id(a, r, |r| init_producer_id_any(shard, r, v))
            })
            .await
        }
        // v4+ (KIP-890's batched form) comes from other brokers: ClusterAction.
        ApiKey::AddPartitionsToTxn if v >= 4 => {
            let deny = authz::add_partitions_to_txn_batch_denied;
            run(req, |r| {
                authz::cluster_gate(a, Operation::ClusterAction, r, deny, |r| {
                    txn::add_partitions(shard, r, v)
                })
            })
            .await
        }
        ApiKey::AddPartitionsToTxn => {
            run(req, |r| {
                authz::add_partitions_to_txn(a, r, |r| txn::add_partitions(shard, r, v))
            })
            .await
        }
        ApiKey::AddOffsetsToTxn => {
            run(req, |r| {
                authz::add_offsets_to_txn(a, r, |r| txn::add_offsets(shard, r, v))
            })
            .await
        }
        ApiKey::EndTxn => run(req, |r| authz::end_txn(a, r, |r| txn::end_txn(shard, r, v))).await,
        ApiKey::TxnOffsetCommit => {
            run(req, |r| {
                authz::txn_offset_commit(a, r, |r| txn::txn_offset_commit(shard, r))
            })
            .await
        }
        ApiKey::WriteTxnMarkers => {
            let deny = authz::write_txn_markers_denied;
            run(req, |r| {
                authz::cluster_gate(a, Operation::ClusterAction, r, deny, |r| {
                    txn::write_txn_markers(shard, r)
                })
            })
            .await
        }
        ApiKey::DescribeTransactions => {
            run(req, |r| {
                authz::describe_transactions(a, r, |r| txn::describe(shard, r))
            })
            .await
        }
        ApiKey::ListTransactions => {
            run(req, |r| {
                authz::list_transactions(a, r, |r| txn::list(shard, r))
            })
            .await
        }
        ApiKey::DescribeProducers => {
            let bound = (
                txn::describe_producers_partitions as fn(&_) -> usize,
                "partitions in one DescribeProducers request",
                offsets::PARTITIONS_PER_REQUEST_MAX,
            );
            run_bounded(req, bound, |r| {
                authz::describe_producers(a, r, |r| txn::describe_producers(shard, r))
            })
            .await
        }
        _ => return None,
    };
    Some(routed)
}

/// Topics, configs and offsets; anything else goes on to [`cluster_admin`].
async fn administrative(
    shard: &Rc<Shard>,
    req: &Request,
    a: &Authz<'_>,
) -> Result<Response, WireError> {
    let v = req.version;
    match req.key() {
        Some(ApiKey::ListOffsets) => {
            let bound = (
                offsets::list_offsets_partitions as fn(&_) -> usize,
                "partitions in one ListOffsets request",
                offsets::PARTITIONS_PER_REQUEST_MAX,
            );
            run_bounded(req, bound, |r| {
                authz::list_offsets(a, r, |r| offsets::list_offsets(shard, r, v))
            })
            .await
        }
        Some(ApiKey::DeleteRecords) => {
            let bound = (
                offsets::delete_records_partitions as fn(&_) -> usize,
                "partitions in one DeleteRecords request",
                offsets::PARTITIONS_PER_REQUEST_MAX,
            );
            run_bounded(req, bound, |r| {
                authz::delete_records(a, r, |r| offsets::delete_records(shard, r))
            })
            .await
        }
        Some(ApiKey::OffsetForLeaderEpoch) => {
            let bound = (
                offsets::epoch_end_partitions as fn(&_) -> usize,
                "partitions in one OffsetForLeaderEpoch request",
                offsets::PARTITIONS_PER_REQUEST_MAX,
            );
            run_bounded(req, bound, |r| {
                authz::offset_for_leader_epoch(a, r, |r| offsets::offset_for_leader_epoch(shard, r))
            })
            .await
        }
        Some(ApiKey::CreateTopics) => {
            run(req, |r| {
                authz::create_topics(a, r, |r| admin::create_topics(shard, r))
            })
            .await
        }
        Some(ApiKey::DeleteTopics) => {
            run(req, |r| {
                authz::delete_topics(a, r, |r| admin::delete_topics(shard, r))
            })
            .await
        }
        Some(ApiKey::CreatePartitions) => {
            run(req, |r| {
                authz::create_partitions(a, r, |r| admin::create_partitions(shard, r))
            })
            .await
        }
        Some(ApiKey::DescribeConfigs) => {
            let bound = (
                configs::describe_resources as fn(&_) -> usize,
                "resources in one DescribeConfigs request",
                configs::RESOURCES_PER_DESCRIBE_MAX,
            );
            run_bounded(req, bound, |r| {
                authz::describe_configs(a, r, |r| configs::describe(shard, r))
            })
            .await
        }
        Some(ApiKey::AlterConfigs) => {
            run(req, |r| {
                authz::alter_configs(a, r, |r| configs::alter(shard, r))
            })
            .await
        }
        Some(ApiKey::IncrementalAlterConfigs) => {
            run(req, |r| {
                authz::incremental_alter_configs(a, r, |r| configs::incremental_alter(shard, r))
            })
            .await
        }
        _ => cluster_admin(shard, req, a).await,
    }
}

/// Credentials and ACLs; anything else goes on to [`replica_admin`].
async fn cluster_admin(
    shard: &Rc<Shard>,
    req: &Request,
    a: &Authz<'_>,
) -> Result<Response, WireError> {
    use authz::cluster_gate as gate;
    let (alter, describe) = (Operation::Alter, Operation::Describe);
    match req.key() {
        Some(ApiKey::DescribeUserScramCredentials) => {
            let deny = authz::describe_scram_denied;
            run(req, |r| {
                gate(a, describe, r, deny, |r| sasl::describe_scram(shard, r))
            })
            .await
        }
        Some(ApiKey::AlterUserScramCredentials) => {
            let deny = authz::alter_scram_denied;
            run(req, |r| {
                gate(a, alter, r, deny, |r| sasl::alter_scram(shard, r))
            })
            .await
        }
        Some(ApiKey::CreateAcls) => run(req, |r| acls::create(shard, a, r)).await,
        Some(ApiKey::DescribeAcls) => run(req, |r| async { acls::describe(shard, a, r) }).await,
        Some(ApiKey::DeleteAcls) => run(req, |r| acls::delete(shard, a, r)).await,
        _ => replica_admin(shard, req, a).await,
    }
}

/// The replica admin APIs.
async fn replica_admin(
    shard: &Rc<Shard>,
    req: &Request,
    a: &Authz<'_>,
) -> Result<Response, WireError> {
    use authz::cluster_gate as gate;
    let (alter, describe) = (Operation::Alter, Operation::Describe);
    match req.key() {
        Some(ApiKey::DescribeLogDirs) => {
            let deny = authz::describe_log_dirs_denied;
            run(req, |r| {
                gate(a, describe, r, deny, |r| {
                    replicas::describe_log_dirs(shard, r)
                })
            })
            .await
        }
        Some(ApiKey::AlterReplicaLogDirs) => {
            let deny = authz::alter_replica_log_dirs_denied;
            run(req, |r| {
                gate(a, alter, r, deny, |r| {
                    replicas::alter_replica_log_dirs(shard, r)
                })
            })
            .await
        }
        Some(ApiKey::ElectLeaders) => {
            let deny = |r| authz::elect_leaders_denied(r, req.version);
            run(req, |r| {
                gate(a, alter, r, deny, |r| replicas::elect_leaders(shard, r))
            })
            .await
        }
        Some(ApiKey::AlterPartitionReassignments) => {
            let deny = authz::alter_reassignments_denied;
            run(req, |r| {
                gate(a, alter, r, deny, |r| {
                    replicas::alter_partition_reassignments(shard, r)
                })
            })
            .await
        }
        Some(ApiKey::ListPartitionReassignments) => {
            let deny = authz::list_reassignments_denied;
            run(req, |r| {
                gate(a, describe, r, deny, |r| {
                    replicas::list_partition_reassignments(shard, r)
                })
            })
            .await
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
    answer(req, typed, f).await
}

/// Runs `f` on a decoded request and encodes its answer.
async fn answer<Q, P, F, Fut>(req: &Request, typed: Q, f: F) -> Result<Response, WireError>
where
    P: Encodable,
    F: FnOnce(Q) -> Fut,
    Fut: std::future::Future<Output = P>,
{
    let resp = f(typed).await;
    let frame = proto::encode_response(req, &resp)?;
    Ok(Some(vec![frame]))
}

/// [`run`] for a request whose entries cost work each: more than `max` of them (as
/// `count` counts) is refused as undecodable, the connection closed, as Produce's bound.
async fn run_bounded<Q, P, F, Fut>(
    req: &Request,
    (count, field, max): (fn(&Q) -> usize, &'static str, usize),
    f: F,
) -> Result<Response, WireError>
where
    Q: Decodable,
    P: Encodable,
    F: FnOnce(Q) -> Fut,
    Fut: std::future::Future<Output = P>,
{
    let typed: Q = proto::decode(req)?;
    let size = count(&typed);
    if size > max {
        return Err(WireError::TooLarge {
            field,
            offset: 0,
            size: u64::try_from(size).unwrap_or(u64::MAX),
            max: u64::try_from(max).unwrap_or(u64::MAX),
        });
    }
    answer(req, typed, f).await
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

#[cfg(test)]
mod future_size {
    use super::Request;
    use crate::server::session::Session;
    use crate::shard::Shard;
    use std::rc::Rc;

    /// The size of the future `handle` returns, without building one.
    fn size_of_future<'a, F, Fut>(_handle: F) -> usize
    where
        F: FnOnce(&'a Rc<Shard>, Request, &'a Session) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// Each request is a task holding `handle`'s future, copied whole when spawned: it
    /// stays small because every large handler is boxed (inline, the group and
    /// transaction handlers made it 7 KiB, copied for every Produce).
    #[test]
    fn a_requests_future_stays_small() {
        let size = size_of_future(super::handle);
        assert!(size <= 2048, "api::handle's future is {size} bytes");
    }
}
