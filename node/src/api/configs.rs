//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics (broker configs are
//! described read-only). Topic overrides are stored in the catalogue (changed through the
//! controller); changing them makes
//! each owning shard reopen the partition logs with the new settings. An internal topic's
//! `cleanup.policy` and retention cannot be changed (INVALID_CONFIG).

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse as AlterResult;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse as IncResult;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};

use super::admin::{TOPIC_CONFIG_KEYS, TopicError, validate_configs};
use super::str_bytes;
use crate::controller::{Command, Outcome};
use crate::errors;
use crate::shard::Shard;

/// Kafka's ConfigResource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// Kafka's config sources.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
/// Kafka's config types.
const TYPE_STRING: i8 = 2;
const TYPE_LONG: i8 = 5;

/// Broker keys DescribeConfigs reports for the broker resource.
const BROKER_KEYS: &[&str] = &[
    "auto.create.topics.enable",
    "default.replication.factor",
    "log.retention.bytes",
    "log.retention.ms",
    "log.segment.bytes",
    "max.connections",
    "message.max.bytes",
    "min.insync.replicas",
    "num.partitions",
    "socket.request.max.bytes",
];

/// DescribeConfigs.
pub async fn describe(shard: &Rc<Shard>, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let results = req
        .resources
        .iter()
        .map(|r| {
            // Null asks for every key; so does an empty list (some clients send that).
            let keys: Option<Vec<String>> = r
                .configuration_keys
                .as_ref()
                .filter(|k| !k.is_empty())
                .map(|k| k.iter().map(|s| s.to_string()).collect());
            let base = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let entries = match r.resource_type {
                RESOURCE_TOPIC => topic_entries(shard, r.resource_name.as_str()),
                RESOURCE_BROKER => Ok(broker_entries(shard)),
                _ => Err((
                    errors::INVALID_REQUEST,
                    "unsupported resource type".to_string(),
                )),
            };
            match entries {
                Ok(all) => base.with_configs(
                    all.into_iter()
                        .filter(|e| {
                            keys.as_ref()
                                .is_none_or(|k| k.iter().any(|k| k == e.name.as_str()))
                        })
                        .collect(),
                ),
                Err((code, msg)) => base
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(&msg))),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

fn entry(name: &str, value: &str, source: i8, read_only: bool) -> DescribeConfigsResourceResult {
    let numeric = name.ends_with(".ms") || name.ends_with(".bytes");
    DescribeConfigsResourceResult::default()
        .with_name(str_bytes(name))
        .with_value(Some(str_bytes(value)))
        .with_read_only(read_only)
        .with_config_source(source)
        .with_config_type(if numeric { TYPE_LONG } else { TYPE_STRING })
}

fn topic_entries(
    shard: &Shard,
    topic: &str,
) -> Result<Vec<DescribeConfigsResourceResult>, TopicError> {
    let catalog = shard.catalog();
    let Some(meta) = catalog.topics.get(topic) else {
        return Err((
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("topic {topic} does not exist"),
        ));
    };
    let defaults = shard.config().topic_defaults();
    let mut keys: Vec<&str> = defaults.keys().map(String::as_str).collect();
    keys.extend(meta.configs.keys().map(String::as_str));
    keys.sort_unstable();
    keys.dedup();
    Ok(keys
        .into_iter()
        .filter_map(|k| match (meta.configs.get(k), defaults.get(k)) {
            (Some(v), _) => Some(entry(k, v, SOURCE_TOPIC, false)),
            (None, Some(v)) => Some(entry(k, v, SOURCE_DEFAULT, false)),
            (None, None) => None,
        })
        .collect())
}

fn broker_entries(shard: &Shard) -> Vec<DescribeConfigsResourceResult> {
    let c = shard.config();
    BROKER_KEYS
        .iter()
        .map(|k| {
            let value = match *k {
                "auto.create.topics.enable" => c.auto_create_topics.to_string(),
                "default.replication.factor" => c.default_replication_factor.to_string(),
                "log.retention.bytes" => c.retention_bytes.to_string(),
                "log.retention.ms" => c.retention_ms.to_string(),
                "log.segment.bytes" => c.segment_bytes.to_string(),
                "max.connections" => c.max_connections.to_string(),
                "message.max.bytes" => c.message_max_bytes.to_string(),
                "min.insync.replicas" => c.min_insync_replicas.to_string(),
                "num.partitions" => c.num_partitions.to_string(),
                _ => c.socket_request_max_bytes.to_string(),
            };
            entry(k, &value, SOURCE_STATIC_BROKER, true)
        })
        .collect()
}

/// Replaces (`AlterConfigs`) or edits (`IncrementalAlterConfigs`) a topic's overrides.
async fn change_topic(
    shard: &Rc<Shard>,
    resource_type: i8,
    topic: &str,
    validate_only: bool,
    edit: impl FnOnce(&mut BTreeMap<String, String>) -> Result<(), TopicError>,
) -> Result<(), TopicError> {
    if resource_type != RESOURCE_TOPIC {
        return Err((
            errors::INVALID_REQUEST,
            "only topic configs can be altered".into(),
        ));
    }
    let Some(meta) = shard.catalog().topics.get(topic).cloned() else {
        return Err((
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("topic {topic} does not exist"),
        ));
    };
    let mut configs = meta.configs.clone();
    edit(&mut configs)?;
    validate_changed(&meta.configs, &configs)?;
    if crate::metadata::is_internal(topic) {
        keeps_internal_pins(topic, &configs)?;
    }
    if validate_only || configs == meta.configs {
        return Ok(());
    }
    let cmd = Command::AlterConfigs {
        name: topic.to_string(),
        id: meta.id,
        configs,
    };
    match shard.node.controller.submit(&shard.node, cmd).await {
        Outcome::Done(done) => done?,
        other => {
            let msg = format!("controller answered {other:?}");
            return Err((errors::UNKNOWN_SERVER_ERROR, msg));
        }
    }
    tracing::info!(topic, "topic config changed");
    shard.sync_all().await;
    Ok(())
}

/// Checks the overrides a change adds or alters (those already stored were accepted when
/// set — some, like an internal topic's `log.tail.cache.bytes`, by the broker itself), then
/// the whole set as the log would read it.
fn validate_changed(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Result<(), TopicError> {
    let changed: BTreeMap<String, String> = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    validate_configs(&changed)?;
    let pairs = new.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    crate::storage::LogConfig::from_pairs(pairs)
        .map_err(|e| (errors::INVALID_CONFIG, e.to_string()))?;
    Ok(())
}

/// An internal topic keeps `cleanup.policy=compact` and no time or size retention (see
/// [`crate::metadata::INTERNAL_TOPIC_PINNED_CONFIGS`]): checked on the resulting override
/// set, so a SET, a DELETE (back to the broker default) and an AlterConfigs that leaves the
/// key out are all refused.
fn keeps_internal_pins(topic: &str, configs: &BTreeMap<String, String>) -> Result<(), TopicError> {
    for (key, pinned) in crate::metadata::INTERNAL_TOPIC_PINNED_CONFIGS {
        let value = configs.get(*key).map(String::as_str);
        if value.map(str::trim) != Some(*pinned) {
            let shown = value.unwrap_or("the broker default");
            return Err((
                errors::INVALID_CONFIG,
                format!("{key} of internal topic {topic} must stay {pinned}, not {shown}"),
            ));
        }
    }
    Ok(())
}

/// AlterConfigs: the given set becomes the topic's whole override set.
pub async fn alter(shard: &Rc<Shard>, req: AlterConfigsRequest) -> AlterConfigsResponse {
    let mut responses = Vec::new();
    for r in req.resources {
        let new: BTreeMap<String, String> = r
            .configs
            .iter()
            .filter_map(|c| {
                c.value
                    .as_ref()
                    .map(|v| (c.name.to_string(), v.to_string()))
            })
            .collect();
        let outcome = change_topic(
            shard,
            r.resource_type,
            r.resource_name.as_str(),
            req.validate_only,
            |c| {
                *c = new;
                Ok(())
            },
        )
        .await;
        let mut resp = AlterResult::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        if let Err((code, msg)) = outcome {
            resp = resp
                .with_error_code(code)
                .with_error_message(Some(str_bytes(&msg)));
        }
        responses.push(resp);
    }
    AlterConfigsResponse::default().with_responses(responses)
}

/// IncrementalAlterConfigs: SET (0), DELETE (1), APPEND (2), SUBTRACT (3) per key.
pub async fn incremental_alter(
    shard: &Rc<Shard>,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::new();
    for r in req.resources {
        let ops: Vec<(String, i8, Option<String>)> = r
            .configs
            .iter()
            .map(|c| {
                (
                    c.name.to_string(),
                    c.config_operation,
                    c.value.as_ref().map(|v| v.to_string()),
                )
            })
            .collect();
        let outcome = change_topic(
            shard,
            r.resource_type,
            r.resource_name.as_str(),
            req.validate_only,
            |c| apply_ops(c, ops),
        )
        .await;
        let mut resp = IncResult::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        if let Err((code, msg)) = outcome {
            resp = resp
                .with_error_code(code)
                .with_error_message(Some(str_bytes(&msg)));
        }
        responses.push(resp);
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

fn apply_ops(
    configs: &mut BTreeMap<String, String>,
    ops: Vec<(String, i8, Option<String>)>,
) -> Result<(), TopicError> {
    for (key, op, value) in ops {
        if !TOPIC_CONFIG_KEYS.contains(&key.as_str()) {
            return Err((
                errors::INVALID_CONFIG,
                format!("unknown topic config {key}"),
            ));
        }
        match (op, value) {
            (0, Some(v)) => {
                configs.insert(key, v);
            }
            (1, _) => {
                configs.remove(&key);
            }
            (2, Some(v)) | (3, Some(v)) if key == "cleanup.policy" => {
                let mut items: Vec<String> = configs
                    .get(&key)
                    .map(|s| s.split(',').map(|x| x.trim().to_string()).collect())
                    .unwrap_or_default();
                items.retain(|x| !x.is_empty() && *x != v);
                if op == 2 {
                    items.push(v);
                }
                configs.insert(key, items.join(","));
            }
            _ => {
                return Err((
                    errors::INVALID_CONFIG,
                    format!("bad operation {op} for {key}"),
                ));
            }
        }
    }
    Ok(())
}
