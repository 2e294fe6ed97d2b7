//! Metadata (with auto-creation of topics) and DescribeCluster. A single node is the only
//! broker, the controller, and the leader of every partition; a cluster node answers from
//! the controller quorum's committed image (live brokers, active controller, per
//! partition leader, leader epoch, replicas, ISR).

use std::collections::HashSet;
use std::rc::Rc;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse,
};
use uuid::Uuid;

use super::authz::Authz;
use super::{admin, str_bytes, topic_name};
use crate::errors;
use crate::metadata::TopicMeta;
use crate::partition::replica::SOLE_LEADER_EPOCH;
use crate::security::ListenerSetup;
use crate::security::acl::{CLUSTER_NAME, Operation, ResourceType};
use crate::shard::Shard;

/// Metadata: all topics when none are named; named ones are created when
/// `auto.create.topics.enable` and the request allow it.
/// In v0 an empty topic list means "all topics"; from v1 that is a null list.
pub async fn handle(
    shard: &Rc<Shard>,
    req: MetadataRequest,
    version: i16,
    listener: &ListenerSetup,
    authz: &Authz<'_>,
) -> MetadataResponse {
    let all = match &req.topics {
        None => true,
        Some(t) => t.is_empty() && version == 0,
    };
    // Before v4 there is no allow flag: auto-creation follows the broker setting.
    let allow_create = req.allow_auto_topic_creation || version < 4;
    let mut topics = Vec::new();
    if all {
        // Kafka: topics the principal may not Describe are left out.
        let catalog = shard.catalog();
        let visible = catalog
            .topics
            .values()
            .filter(|m| authz.topic(Operation::Describe, &m.name));
        for meta in visible {
            topics.push(describe_topic(shard, meta));
        }
    } else {
        // Unknown topics to create are collected and created in one catalogue write
        // (one quorum command in a cluster), as Kafka's AutoTopicCreationManager sends
        // one CreateTopics: one write per name made a request naming thousands of new
        // topics rewrite the whole catalogue as often.
        let mut to_create: Vec<(usize, String)> = Vec::new();
        for (name, id) in requested_once(&req) {
            // Topics by id (a null name) are v12+; v10-v11 requests allow a null name but
            // their answers cannot carry one: refused with an encodable answer, as Kafka
            // refuses such a request (InvalidRequestException).
            if name.is_none() && version < 12 {
                let refused = MetadataResponseTopic::default()
                    .with_name(Some(topic_name("")))
                    .with_error_code(errors::INVALID_REQUEST);
                topics.push(refused);
                continue;
            }
            match requested_topic(shard, name, id, allow_create, authz).await {
                Asked::Answer(t) => topics.push(t),
                Asked::Create(name) => {
                    to_create.push((topics.len(), name.clone()));
                    let unknown =
                        MetadataResponseTopic::default().with_name(Some(topic_name(&name)));
                    topics.push(unknown);
                }
            }
        }
        if !to_create.is_empty() {
            // Auto-creation counts against `max.partitions.per.request` like CreateTopics.
            let budget = admin::RequestBudget::new(shard);
            let names: Vec<String> = to_create.iter().map(|(_, n)| n.clone()).collect();
            let outcomes = admin::auto_create(shard, &names, &budget).await;
            let catalog = shard.catalog();
            for ((at, name), outcome) in to_create.into_iter().zip(outcomes) {
                let Some(t) = topics.get_mut(at) else {
                    continue;
                };
                let code = match outcome {
                    Ok(_) | Err((errors::TOPIC_ALREADY_EXISTS, _)) => {
                        errors::UNKNOWN_TOPIC_OR_PARTITION
                    }
                    Err((code, msg)) => {
                        tracing::warn!(topic = %name, "auto-create failed: {msg}");
                        code
                    }
                };
                *t = match catalog.topics.get(&name) {
                    Some(meta) if code == errors::UNKNOWN_TOPIC_OR_PARTITION => {
                        describe_topic(shard, meta)
                    }
                    _ => std::mem::take(t).with_error_code(code),
                };
            }
        }
    }
    let view = cluster_view(shard, listener);
    let brokers = view
        .brokers
        .iter()
        .map(|b| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.id))
                .with_host(str_bytes(&b.host))
                .with_port(i32::from(b.port))
                .with_rack(b.rack.as_deref().map(str_bytes))
        })
        .collect();
    // Kafka's bitmasks, only when asked (and only where the version has the field).
    if req.include_topic_authorized_operations && version >= 8 {
        for t in topics.iter_mut().filter(|t| t.error_code == errors::NONE) {
            if let Some(name) = &t.name {
                t.topic_authorized_operations =
                    authz.authorized_operations(ResourceType::Topic, name.0.as_str());
            }
        }
    }
    let mut resp = MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(str_bytes(&view.cluster_id)))
        .with_controller_id(BrokerId(view.controller))
        .with_topics(topics);
    if req.include_cluster_authorized_operations && (8..=10).contains(&version) {
        resp.cluster_authorized_operations =
            authz.authorized_operations(ResourceType::Cluster, CLUSTER_NAME);
    }
    resp
}

/// Who the cluster is, as this node's image says.
pub struct ClusterView {
    /// Live brokers.
    pub brokers: Vec<ViewBroker>,
    pub controller: i32,
    pub cluster_id: String,
}

/// One live broker as clients are told of it.
pub struct ViewBroker {
    pub id: i32,
    /// Its advertised address on the listener the client came through.
    pub host: String,
    pub port: u16,
    /// Its `broker.rack`.
    pub rack: Option<String>,
}

/// The brokers, controller and cluster id to answer with: this node alone on a single
/// node; the registered, unfenced nodes of the image in a cluster, each at its address
/// on the client's `listener` (a node without that listener is left out, as Kafka does).
pub fn cluster_view(shard: &Shard, listener: &ListenerSetup) -> ClusterView {
    let node_id = shard.config().node_id;
    let me = ViewBroker {
        id: node_id,
        host: listener.advertised.0.clone(),
        port: listener.advertised.1,
        rack: shard.config().rack().map(str::to_string),
    };
    let Some(q) = shard.node.controller.cluster() else {
        return ClusterView {
            brokers: vec![me],
            controller: node_id,
            cluster_id: shard.node.cluster_id.clone(),
        };
    };
    let image = shard.catalog();
    let mut brokers: Vec<ViewBroker> = image
        .nodes
        .iter()
        .filter(|(_, n)| !n.fenced)
        .filter_map(|(id, n)| {
            let (host, port) = n.address_for(&listener.config.name)?;
            Some(ViewBroker {
                id: *id,
                host: host.to_string(),
                port,
                rack: n.rack.clone(),
            })
        })
        .collect();
    if brokers.is_empty() {
        // Not registered yet: a client still needs an address to retry on.
        brokers.push(me);
    }
    ClusterView {
        brokers,
        controller: q.controller_id(),
        cluster_id: image
            .cluster_id
            .clone()
            .unwrap_or_else(|| shard.node.cluster_id.clone()),
    }
}

/// The request's topics in order, each once: Kafka takes them as a set, and a topic
/// named again would cost its whole partition list again (one small request could name
/// a large topic hundreds of thousands of times). A named topic is keyed by its name, one
/// asked for by id (no name) by its id.
fn requested_once(req: &MetadataRequest) -> Vec<(Option<String>, Uuid)> {
    let mut seen: HashSet<(Option<&str>, Uuid)> = HashSet::new();
    let mut out = Vec::new();
    for t in req.topics.iter().flatten() {
        let name = t.name.as_ref().map(|n| n.0.as_str());
        let key = match name {
            Some(name) => (Some(name), Uuid::nil()),
            None => (None, t.topic_id),
        };
        if seen.insert(key) {
            out.push((name.map(str::to_string), t.topic_id));
        }
    }
    out
}

/// One topic of a Metadata request: answered as it stands, or to be auto-created.
enum Asked {
    Answer(MetadataResponseTopic),
    Create(String),
}

async fn requested_topic(
    shard: &Rc<Shard>,
    name: Option<String>,
    id: Uuid,
    allow_create: bool,
    authz: &Authz<'_>,
) -> Asked {
    let catalog = shard.catalog();
    let denied = |topic: MetadataResponseTopic| {
        topic
            .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED)
            .with_is_internal(false)
            .with_partitions(Vec::new())
    };
    let found = match &name {
        Some(n) => catalog.topics.get(n).cloned(),
        // By the id map of this catalogue snapshot (built once per snapshot, as Fetch
        // does), not a scan of every topic per id asked for.
        None => super::fetch::topic_ids(&catalog)
            .get(&id.as_u128())
            .and_then(|n| catalog.topics.get(&**n))
            .cloned(),
    };
    if let Some(meta) = found {
        let described = describe_topic(shard, &meta);
        return Asked::Answer(match authz.topic(Operation::Describe, &meta.name) {
            true => described,
            // Asked for by id, it is not named to one who may not see it.
            false if name.is_none() => denied(described.with_name(None)),
            false => denied(described),
        });
    }
    let Some(name) = name else {
        return Asked::Answer(
            MetadataResponseTopic::default()
                .with_topic_id(id)
                .with_error_code(errors::UNKNOWN_TOPIC_ID),
        );
    };
    let unknown = MetadataResponseTopic::default().with_name(Some(topic_name(&name)));
    // Before existence, as Kafka: an unauthorized name does not say whether it exists.
    if !authz.topic(Operation::Describe, &name) {
        return Asked::Answer(denied(unknown));
    }
    if crate::metadata::validate_topic_name(&name).is_err() {
        return Asked::Answer(unknown.with_error_code(errors::INVALID_TOPIC_EXCEPTION));
    }
    if !(allow_create && shard.config().auto_create_topics) {
        return Asked::Answer(unknown.with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION));
    }
    if crate::metadata::is_internal(&name) {
        return Asked::Answer(auto_create_internal(shard, &name, unknown).await);
    }
    if !authz.may_create_topic(&name) {
        return Asked::Answer(denied(unknown));
    }
    Asked::Create(name)
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

/// One topic's metadata: on a single node every partition led by this node, ISR = {this
/// node}; in a cluster as the controller placed it (no leader: LEADER_NOT_AVAILABLE).
pub fn describe_topic(shard: &Shard, meta: &TopicMeta) -> MetadataResponseTopic {
    let node = BrokerId(shard.config().node_id);
    if !meta.assignment.is_empty() {
        return describe_placed(shard, meta);
    }
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

/// A cluster topic's partitions from the image.
fn describe_placed(shard: &Shard, meta: &TopicMeta) -> MetadataResponseTopic {
    let image = shard.catalog();
    let fenced = |id: &i32| image.nodes.get(id).is_none_or(|n| n.fenced);
    let ids = |v: &[i32]| v.iter().map(|id| BrokerId(*id)).collect::<Vec<_>>();
    let partitions = meta
        .assignment
        .iter()
        .zip(0..)
        .map(|(a, p)| {
            let offline: Vec<i32> = a.replicas.iter().copied().filter(fenced).collect();
            let code = if a.leader < 0 {
                errors::LEADER_NOT_AVAILABLE
            } else {
                errors::NONE
            };
            MetadataResponsePartition::default()
                .with_error_code(code)
                .with_partition_index(p)
                .with_leader_id(BrokerId(a.leader))
                .with_leader_epoch(a.leader_epoch)
                .with_replica_nodes(ids(&a.replicas))
                .with_isr_nodes(ids(&a.isr))
                .with_offline_replicas(ids(&offline))
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(topic_name(&meta.name)))
        .with_topic_id(Uuid::from_u128(meta.id))
        .with_is_internal(crate::metadata::is_internal(&meta.name))
        .with_partitions(partitions)
}

/// DescribeCluster: the live brokers and the active controller (a single node: itself).
pub async fn describe_cluster(
    shard: &Rc<Shard>,
    req: DescribeClusterRequest,
    listener: &ListenerSetup,
    authz: &Authz<'_>,
) -> DescribeClusterResponse {
    let view = cluster_view(shard, listener);
    let brokers = view
        .brokers
        .iter()
        .map(|b| {
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(b.id))
                .with_host(str_bytes(&b.host))
                .with_port(i32::from(b.port))
                .with_rack(b.rack.as_deref().map(str_bytes))
        })
        .collect();
    let mut resp = DescribeClusterResponse::default()
        .with_cluster_id(str_bytes(&view.cluster_id))
        .with_controller_id(BrokerId(view.controller))
        .with_brokers(brokers);
    if req.include_cluster_authorized_operations {
        resp.cluster_authorized_operations =
            authz.authorized_operations(ResourceType::Cluster, CLUSTER_NAME);
    }
    resp
}
