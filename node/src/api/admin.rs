//! Topic administration: CreateTopics (with configs, validate_only), DeleteTopics,
//! CreatePartitions. Changes go to the catalogue first (persisted), then every shard is
//! told to sync its open partitions with it.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse,
};
use uuid::Uuid;

use super::{str_bytes, topic_name};
use crate::errors;
use crate::metadata::{self, MetaError, PARTITIONS_PER_TOPIC_MAX, TopicMeta};
use crate::shard::Shard;

/// An error code and message for one topic.
pub type TopicError = (i16, String);

/// Topic-level config keys weir accepts (Kafka's names). Those the log uses take effect;
/// the rest are stored and reported for compatibility (e.g. `cleanup.policy=compact` is
/// kept until compaction exists).
pub const TOPIC_CONFIG_KEYS: &[&str] = &[
    "cleanup.policy",
    "compression.type",
    "delete.retention.ms",
    "file.delete.delay.ms",
    "flush.messages",
    "flush.ms",
    "index.interval.bytes",
    "max.compaction.lag.ms",
    "max.message.bytes",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "min.insync.replicas",
    "preallocate",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.index.bytes",
    "segment.jitter.ms",
    "segment.ms",
    "unclean.leader.election.enable",
];

/// Checks topic config overrides: known keys, values the log accepts.
pub fn validate_configs(configs: &BTreeMap<String, String>) -> Result<(), TopicError> {
    for (k, v) in configs {
        if !TOPIC_CONFIG_KEYS.contains(&k.as_str()) {
            return Err((errors::INVALID_CONFIG, format!("unknown topic config {k}")));
        }
        let numeric = k.ends_with(".ms")
            || k.ends_with(".bytes")
            || k.ends_with(".messages")
            || k == "min.insync.replicas";
        if numeric && v.parse::<i64>().is_err() {
            return Err((errors::INVALID_CONFIG, format!("{k}={v} is not a number")));
        }
        if k == "cleanup.policy"
            && !v
                .split(',')
                .all(|p| matches!(p.trim(), "delete" | "compact"))
        {
            return Err((
                errors::INVALID_CONFIG,
                format!("cleanup.policy={v} is not delete/compact"),
            ));
        }
    }
    let pairs = configs.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    crate::storage::LogConfig::from_pairs(pairs)
        .map_err(|e| (errors::INVALID_CONFIG, e.to_string()))?;
    Ok(())
}

fn meta_error(e: MetaError) -> TopicError {
    let code = match &e {
        MetaError::TopicExists(_) => errors::TOPIC_ALREADY_EXISTS,
        MetaError::UnknownTopic(_) => errors::UNKNOWN_TOPIC_OR_PARTITION,
        MetaError::InvalidName(_) => errors::INVALID_TOPIC_EXCEPTION,
        MetaError::InvalidPartitions(_) => errors::INVALID_PARTITIONS,
        MetaError::Internal(_) => errors::INVALID_REQUEST,
        MetaError::Collides(..) => errors::INVALID_TOPIC_EXCEPTION,
        MetaError::Io(_) => errors::KAFKA_STORAGE_ERROR,
    };
    (code, e.to_string())
}

/// Creates a topic (or only checks that it could be created) and opens its partitions.
pub async fn create_topic(
    shard: &Rc<Shard>,
    name: &str,
    partitions: i32,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<u128, TopicError> {
    metadata::validate_topic_name(name).map_err(meta_error)?;
    if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&partitions) {
        return Err(meta_error(MetaError::InvalidPartitions(partitions)));
    }
    validate_configs(&configs)?;
    // Exists (TOPIC_ALREADY_EXISTS), internal (INVALID_REQUEST), `.`/`_` collision
    // (INVALID_TOPIC_EXCEPTION), as Kafka answers; checked again under the catalogue lock.
    shard.catalog().check_new_name(name).map_err(meta_error)?;
    if validate_only {
        return Ok(0);
    }
    let id = metadata::new_topic_id();
    let meta = TopicMeta {
        name: name.to_string(),
        id,
        partitions,
        configs,
    };
    shard
        .node
        .meta
        .update(|c| {
            c.check_new_name(name)?;
            c.topics.insert(name.to_string(), Arc::new(meta));
            Ok(())
        })
        .map_err(meta_error)?;
    tracing::info!(topic = %name, partitions, "topic created");
    shard.sync_all().await;
    Ok(id)
}

/// CreateTopics.
pub async fn create_topics(shard: &Rc<Shard>, req: CreateTopicsRequest) -> CreateTopicsResponse {
    let mut results = Vec::new();
    for t in req.topics {
        let name = t.name.0.to_string();
        let partitions = if t.num_partitions == -1 {
            shard.config().num_partitions
        } else {
            t.num_partitions
        };
        let rf = if t.replication_factor == -1 {
            shard.config().default_replication_factor
        } else {
            t.replication_factor
        };
        let configs: BTreeMap<String, String> = t
            .configs
            .iter()
            .filter_map(|c| {
                c.value
                    .as_ref()
                    .map(|v| (c.name.to_string(), v.to_string()))
            })
            .collect();
        let outcome = if rf != 1 {
            Err((
                errors::INVALID_REPLICATION_FACTOR,
                format!("replication factor {rf}: this is a single node"),
            ))
        } else if !t.assignments.is_empty() {
            Err((
                errors::INVALID_REPLICA_ASSIGNMENT,
                "manual assignment is not supported".into(),
            ))
        } else {
            create_topic(shard, &name, partitions, configs, req.validate_only).await
        };
        let mut r = CreatableTopicResult::default().with_name(topic_name(&name));
        match outcome {
            Ok(id) => {
                r = r
                    .with_topic_id(Uuid::from_u128(id))
                    .with_num_partitions(partitions)
                    .with_replication_factor(1);
            }
            Err((code, msg)) => {
                r = r
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(&msg)));
            }
        }
        results.push(r);
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// Refuses to delete or grow an internal topic: the coordinators keep its partitions
/// open and hash groups by its partition count, so either would strand committed offsets.
fn refuse_internal(name: &str, what: &str) -> Result<(), TopicError> {
    if metadata::is_internal(name) {
        return Err((
            errors::INVALID_REQUEST,
            format!("cannot {what} the internal topic {name}"),
        ));
    }
    Ok(())
}

/// Deletes a topic: catalogue first, then every shard closes and removes its partitions.
pub async fn delete_topic(shard: &Rc<Shard>, name: &str) -> Result<u128, TopicError> {
    refuse_internal(name, "delete")?;
    let id = shard
        .node
        .meta
        .update(|c| match c.topics.remove(name) {
            Some(t) => Ok(t.id),
            None => Err(MetaError::UnknownTopic(name.to_string())),
        })
        .map_err(meta_error)?;
    tracing::info!(topic = %name, "topic deleted");
    shard.sync_all().await;
    Ok(id)
}

/// DeleteTopics (by name, or by id from v6).
pub async fn delete_topics(shard: &Rc<Shard>, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut targets: Vec<(Option<String>, Uuid)> = req
        .topic_names
        .iter()
        .map(|n| (Some(n.0.to_string()), Uuid::nil()))
        .collect();
    targets.extend(
        req.topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id)),
    );
    let mut results = Vec::new();
    for (name, id) in targets {
        let name = name.or_else(|| {
            shard
                .catalog()
                .topics
                .values()
                .find(|t| t.id == id.as_u128())
                .map(|t| t.name.clone())
        });
        let mut r = DeletableTopicResult::default().with_topic_id(id);
        match name {
            None => r = r.with_error_code(errors::UNKNOWN_TOPIC_ID),
            Some(n) => {
                r = r.with_name(Some(topic_name(&n)));
                match delete_topic(shard, &n).await {
                    Ok(id) => r = r.with_topic_id(Uuid::from_u128(id)),
                    Err((code, msg)) => {
                        r = r
                            .with_error_code(code)
                            .with_error_message(Some(str_bytes(&msg)))
                    }
                }
            }
        }
        results.push(r);
    }
    DeleteTopicsResponse::default().with_responses(results)
}

/// CreatePartitions: grows a topic to `count` partitions (never shrinks).
pub async fn create_partitions(
    shard: &Rc<Shard>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::new();
    for t in req.topics {
        let name = t.name.0.to_string();
        let outcome = grow_topic(
            shard,
            &name,
            t.count,
            t.assignments.as_ref().is_some_and(|a| !a.is_empty()),
            req.validate_only,
        )
        .await;
        let mut r = CreatePartitionsTopicResult::default().with_name(topic_name(&name));
        if let Err((code, msg)) = outcome {
            r = r
                .with_error_code(code)
                .with_error_message(Some(str_bytes(&msg)));
        }
        results.push(r);
    }
    CreatePartitionsResponse::default().with_results(results)
}

async fn grow_topic(
    shard: &Rc<Shard>,
    name: &str,
    count: i32,
    assigned: bool,
    validate_only: bool,
) -> Result<(), TopicError> {
    refuse_internal(name, "add partitions to")?;
    let Some(current) = shard.catalog().topics.get(name).cloned() else {
        return Err(meta_error(MetaError::UnknownTopic(name.to_string())));
    };
    if assigned {
        return Err((
            errors::INVALID_REPLICA_ASSIGNMENT,
            "manual assignment is not supported".into(),
        ));
    }
    if count <= current.partitions || count > PARTITIONS_PER_TOPIC_MAX {
        let msg = format!(
            "topic {name} has {} partitions; cannot change to {count}",
            current.partitions
        );
        return Err((errors::INVALID_PARTITIONS, msg));
    }
    if validate_only {
        return Ok(());
    }
    shard
        .node
        .meta
        .update(|c| match c.topics.get_mut(name) {
            Some(t) => {
                let mut grown = (**t).clone();
                grown.partitions = count;
                *t = Arc::new(grown);
                Ok(())
            }
            None => Err(MetaError::UnknownTopic(name.to_string())),
        })
        .map_err(meta_error)?;
    tracing::info!(topic = %name, partitions = count, "partitions added");
    shard.sync_all().await;
    Ok(())
}
