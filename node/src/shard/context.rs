//! What a service hosted on a shard (the group and transaction coordinators; replication
//! fetchers next) may use of it: its identity and config, the
//! committed catalogue, which partitions it owns, their open replicas, and its shutdown.
//! Not the shard itself: a hosted service cannot reach the mesh, the open-partition
//! bookkeeping or another service's state, so each can be read and tested on its own.

use std::rc::Rc;
use std::sync::Arc;

use super::{Shard, TopicPartition};
use crate::config::Config;
use crate::metadata::Catalog;
use crate::partition::Partition;
use crate::router::ShardId;

/// A hosted service's view of its shard.
pub struct ServiceContext<'a> {
    shard: &'a Shard,
}

impl<'a> ServiceContext<'a> {
    pub fn new(shard: &'a Shard) -> ServiceContext<'a> {
        ServiceContext { shard }
    }

    pub fn shard_id(&self) -> ShardId {
        self.shard.id
    }

    pub fn config(&self) -> &Config {
        self.shard.config()
    }

    /// The newest committed catalogue.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.shard.catalog()
    }

    /// Whether this shard owns `topic`/`partition`.
    pub fn owns(&self, topic: &str, partition: i32) -> bool {
        self.shard.router.owner(topic, partition) == self.shard.id
    }

    /// The open replica of `tp` on this shard (opened if needed), or a Kafka error.
    pub async fn partition(&self, tp: &TopicPartition) -> Result<Rc<Partition>, i16> {
        self.shard.partition(tp).await
    }

    /// A new producer id (epoch 0) from this shard's allocator, or a Kafka error code.
    pub async fn new_producer_id(&self, version: i16) -> Result<wire::ProducerId, i16> {
        crate::producer_state::init_producer_id::new_producer_id(self.shard, version).await
    }

    pub fn shutting_down(&self) -> bool {
        self.shard.shutting_down.get()
    }

    /// Completes when the shard begins shutting down.
    pub async fn until_shutdown(&self) {
        if !self.shutting_down() {
            self.shard.shutdown.listen().await;
        }
    }
}

/// The transaction coordinator's one way off its shard: writing a transaction marker to a
/// partition on whichever shard owns it (a `WriteMarkerCall` there). Owned, so the
/// coordinator's ticker can keep it; it exposes nothing else of the shard.
#[derive(Clone)]
pub struct MarkerWriter {
    shard: Rc<Shard>,
}

impl MarkerWriter {
    pub fn new(shard: Rc<Shard>) -> MarkerWriter {
        MarkerWriter { shard }
    }

    /// Writes `marker` to `tp` on its leader — this node's owning shard, or, in a cluster,
    /// the node the metadata image names (a WriteTxnMarkers request to it, as Kafka's
    /// coordinator sends); a Kafka error code (a partition without a leader:
    /// NOT_LEADER_OR_FOLLOWER, which the coordinator retries).
    pub async fn write(
        &self,
        tp: TopicPartition,
        marker: crate::producer_state::partition::Marker,
        deadline: std::time::Instant,
    ) -> i16 {
        let catalog = self.shard.catalog();
        let leader = catalog
            .topics
            .get(&*tp.0)
            .and_then(|t| usize::try_from(tp.1).ok().and_then(|i| t.assignment.get(i)))
            .map(|a| a.leader);
        if let Some(leader) = leader
            && leader != self.shard.node_id().get()
        {
            return remote_marker(&catalog, leader, &tp, marker, deadline).await;
        }
        let owner = self.shard.router.owner(&tp.0, tp.1);
        let call = super::calls::WriteMarkerCall { tp, marker };
        match self.shard.call(owner, call, deadline).await {
            Ok(code) => code,
            Err(e) => e.code(),
        }
    }
}

/// WriteTxnMarkers version sent to another node (the first flexible one).
const WRITE_MARKERS_VERSION: i16 = 1;

/// Writes `marker` to `tp` on node `leader` with a WriteTxnMarkers request; a Kafka
/// error code (any connection failure: NOT_LEADER_OR_FOLLOWER, retried).
async fn remote_marker(
    catalog: &Catalog,
    leader: i32,
    tp: &TopicPartition,
    marker: crate::producer_state::partition::Marker,
    deadline: std::time::Instant,
) -> i16 {
    use kafka_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    let unreachable = crate::errors::NOT_LEADER_OR_FOLLOWER;
    let Some(node) = catalog.nodes.get(&leader).filter(|n| !n.fenced) else {
        return unreachable;
    };
    let Some(addr) = crate::resolve::resolve(&node.host, node.port).await else {
        return unreachable;
    };
    let topic = WritableTxnMarkerTopic::default()
        .with_name(kafka_protocol::messages::TopicName(
            kafka_protocol::protocol::StrBytes::from_string(tp.0.to_string()),
        ))
        .with_partition_indexes(vec![tp.1]);
    let m = WritableTxnMarker::default()
        .with_producer_id(kafka_protocol::messages::ProducerId(marker.producer_id.0))
        .with_producer_epoch(marker.producer_epoch.0)
        .with_transaction_result(marker.commit)
        .with_topics(vec![topic])
        .with_coordinator_epoch(marker.coordinator_epoch);
    let req = kafka_protocol::messages::WriteTxnMarkersRequest::default().with_markers(vec![m]);
    let call = async {
        let mut conn = crate::replication::client::BrokerConn::connect_to(&node.host, addr).await?;
        conn.call(&req, WRITE_MARKERS_VERSION, deadline).await
    };
    match call.await {
        Ok(resp) => resp
            .markers
            .first()
            .and_then(|m| m.topics.first())
            .and_then(|t| t.partitions.first())
            .map_or(unreachable, |p| p.error_code),
        Err(e) => {
            tracing::info!(topic = %tp.0, partition = tp.1, leader, "marker to another node failed: {e}");
            unreachable
        }
    }
}
