//! Metadata (with auto-creation of topics) and DescribeCluster: this node is the only
//! broker, the controller, and the leader of every partition.

use std::rc::Rc;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse,
};
use uuid::Uuid;

use super::{admin, str_bytes, topic_name};
use crate::errors;
use crate::metadata::TopicMeta;
use crate::partition::replica::SOLE_LEADER_EPOCH;
use crate::shard::Shard;

/// Metadata: all topics when none are named; named ones are created when
/// `auto.create.topics.enable` and the request allow it.
/// In v0 an empty topic list means "all topics"; from v1 that is a null list.
pub async fn handle(
    shard: &Rc<Shard>,
    req: MetadataRequest,
    version: i16,
    advertised: &(String, u16),
) -> MetadataResponse {
    let all = match &req.topics {
        None => true,
        Some(t) => t.is_empty() && version == 0,
    };
    // Before v4 there is no allow flag: auto-creation follows the broker setting.
    let allow_create = req.allow_auto_topic_creation || version < 4;
    let mut topics = Vec::new();
    if all {
        for meta in shard.catalog().topics.values() {
            topics.push(describe_topic(shard, meta));
        }
    } else {
        // Auto-creation counts against `max.partitions.per.request` like CreateTopics.
        let budget = admin::RequestBudget::new(shard);
        for t in req.topics.iter().flatten() {
            topics.push(
                requested_topic(
                    shard,
                    t.name.as_ref().map(|n| n.0.to_string()),
                    t.topic_id,
                    allow_create,
                    &budget,
                )
                .await,
            );
        }
    }
    let node_id = shard.config().node_id;
    let broker = MetadataResponseBroker::default()
        .with_node_id(BrokerId(node_id))
        .with_host(str_bytes(&advertised.0))
        .with_port(i32::from(advertised.1));
    MetadataResponse::default()
        .with_brokers(vec![broker])
        .with_cluster_id(Some(str_bytes(&shard.node.cluster_id)))
        .with_controller_id(BrokerId(node_id))
        .with_topics(topics)
}

async fn requested_topic(
    shard: &Rc<Shard>,
    name: Option<String>,
    id: Uuid,
    allow_create: bool,
    budget: &admin::RequestBudget,
) -> MetadataResponseTopic {
    let catalog = shard.catalog();
    let found = match &name {
        Some(n) => catalog.topics.get(n).cloned(),
        None => catalog
            .topics
            .values()
            .find(|t| t.id == id.as_u128())
            .cloned(),
    };
    if let Some(meta) = found {
        return describe_topic(shard, &meta);
    }
    let Some(name) = name else {
        return MetadataResponseTopic::default()
            .with_topic_id(id)
            .with_error_code(errors::UNKNOWN_TOPIC_ID);
    };
    let unknown = MetadataResponseTopic::default().with_name(Some(topic_name(&name)));
    if crate::metadata::validate_topic_name(&name).is_err() {
        return unknown.with_error_code(errors::INVALID_TOPIC_EXCEPTION);
    }
    if !(allow_create && shard.config().auto_create_topics) {
        return unknown.with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION);
    }
    if crate::metadata::is_internal(&name) {
        return auto_create_internal(shard, &name, unknown).await;
    }
    let partitions = shard.config().num_partitions;
    match admin::create_topic(shard, &name, partitions, Default::default(), false, budget).await {
        Ok(_) | Err((errors::TOPIC_ALREADY_EXISTS, _)) => {}
        Err((code, msg)) => {
            tracing::warn!(topic = %name, "auto-create failed: {msg}");
            return unknown.with_error_code(code);
        }
    }
    match shard.catalog().topics.get(&name) {
        Some(meta) => describe_topic(shard, meta),
        None => unknown.with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION),
    }
}

/// An internal topic asked for by name is created as its coordinator creates it (Kafka's
/// auto-creation does the same), never with a client's defaults; one without a
/// coordinator yet is unknown.
async fn auto_create_internal(
    shard: &Rc<Shard>,
    name: &str,
    unknown: MetadataResponseTopic,
) -> MetadataResponseTopic {
    if name != crate::group::OFFSETS_TOPIC {
        return unknown.with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION);
    }
    if let Err(code) = super::groups::offsets_partitions(shard).await {
        return unknown.with_error_code(code);
    }
    match shard.catalog().topics.get(name) {
        Some(meta) => describe_topic(shard, meta),
        None => unknown.with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION),
    }
}

/// One topic's metadata: every partition led by this node, ISR = {this node}.
pub fn describe_topic(shard: &Shard, meta: &TopicMeta) -> MetadataResponseTopic {
    let node = BrokerId(shard.config().node_id);
    let partitions = (0..meta.partitions)
        .map(|p| {
            MetadataResponsePartition::default()
                .with_partition_index(p)
                .with_leader_id(node)
                .with_leader_epoch(SOLE_LEADER_EPOCH.get())
                .with_replica_nodes(vec![node])
                .with_isr_nodes(vec![node])
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(topic_name(&meta.name)))
        .with_topic_id(Uuid::from_u128(meta.id))
        .with_is_internal(crate::metadata::is_internal(&meta.name))
        .with_partitions(partitions)
}

/// DescribeCluster: this node alone, as controller.
pub async fn describe_cluster(
    shard: &Rc<Shard>,
    _req: DescribeClusterRequest,
    advertised: &(String, u16),
) -> DescribeClusterResponse {
    let node_id = shard.config().node_id;
    let broker = DescribeClusterBroker::default()
        .with_broker_id(BrokerId(node_id))
        .with_host(str_bytes(&advertised.0))
        .with_port(i32::from(advertised.1));
    DescribeClusterResponse::default()
        .with_cluster_id(str_bytes(&shard.node.cluster_id))
        .with_controller_id(BrokerId(node_id))
        .with_brokers(vec![broker])
}
