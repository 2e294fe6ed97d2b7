//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and the broker.
//! Topic overrides are stored in the catalogue (changed through the
//! controller); changing them makes each owning shard
//! reopen the partition logs with the new settings. An internal topic's `cleanup.policy`
//! and retention cannot be changed (INVALID_CONFIG).
//!
//! The BROKER resource describes every key weir reads, with its value, source and whether
//! it can change at runtime. Dynamic broker configs ([`crate::config::dynamic`]): the
//! topic defaults in [`keys::DYNAMIC_APPLIED`] apply at once; Kafka's dynamic keys weir
//! does not use are stored and described without effect; every other key is refused with
//! INVALID_CONFIG and a message saying why. A DescribeConfigs naming more than
//! `RESOURCES_PER_DESCRIBE_MAX` resources is undecodable (connection closed).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::rc::Rc;
use std::sync::Arc;

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
use crate::config::dynamic::Layer;
use crate::config::keys::{self, Dynamic};
use crate::controller::{Command, Outcome};
use crate::errors;
use crate::shard::Shard;

/// Kafka's ConfigResource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// Kafka's config sources.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DYNAMIC_BROKER: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
/// Kafka's config types.
const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_LONG: i8 = 5;
const TYPE_PASSWORD: i8 = 9;

/// Broker keys set by the command line's dedicated flags or their Kafka keys: always
/// static (given at startup one way or the other).
const FLAG_KEYS: &[&str] = &[
    "advertised.listeners",
    "broker.id",
    "listeners",
    "log.dir",
    "log.dirs",
    "node.id",
    "weir.shards",
];

/// Most resources one DescribeConfigs may name; past it the request is refused as
/// undecodable (the connection is closed), as Produce's partition bound: a 4-byte
/// resource entry could otherwise ask for a hundred entries of the broker's configs,
/// millions of times in one request.
pub const RESOURCES_PER_DESCRIBE_MAX: usize = 100_000;

/// The resources a DescribeConfigs names (for [`RESOURCES_PER_DESCRIBE_MAX`]).
pub fn describe_resources(req: &DescribeConfigsRequest) -> usize {
    req.resources.len()
}

/// A resource as it is answered: type, name and the keys asked for (`None`: all).
type ResourceKey<'a> = (i8, &'a str, Option<BTreeSet<&'a str>>);

/// DescribeConfigs. A resource named again with the same keys is answered once (its
/// answer would be the same); the broker's entries are built once per request.
pub async fn describe(shard: &Rc<Shard>, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let mut seen: HashSet<ResourceKey<'_>> = HashSet::new();
    let mut broker: Option<Vec<DescribeConfigsResourceResult>> = None;
    let mut results = Vec::new();
    for r in &req.resources {
        // Null asks for every key; so does an empty list (some clients send that).
        let keys: Option<BTreeSet<&str>> = r
            .configuration_keys
            .as_ref()
            .filter(|k| !k.is_empty())
            .map(|k| k.iter().map(|s| s.as_str()).collect());
        if !seen.insert((r.resource_type, r.resource_name.as_str(), keys.clone())) {
            continue;
        }
        let wanted = |name: &str| keys.as_ref().is_none_or(|k| k.contains(name));
        let base = DescribeConfigsResult::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name.clone());
        let entries = match r.resource_type {
            RESOURCE_TOPIC => topic_entries(shard, r.resource_name.as_str(), &wanted),
            RESOURCE_BROKER => check_broker_name(shard, r.resource_name.as_str()).map(|()| {
                let all = broker.get_or_insert_with(|| broker_entries(shard));
                all.iter()
                    .filter(|e| wanted(e.name.as_str()))
                    .cloned()
                    .collect()
            }),
            _ => Err((
                errors::INVALID_REQUEST,
                "unsupported resource type".to_string(),
            )),
        };
        results.push(match entries {
            Ok(entries) => base.with_configs(entries),
            Err((code, msg)) => base
                .with_error_code(code)
                .with_error_message(Some(str_bytes(&msg))),
        });
    }
    DescribeConfigsResponse::default().with_results(results)
}

fn entry(name: &str, value: &str, source: i8, read_only: bool) -> DescribeConfigsResourceResult {
    let numeric = name.ends_with(".ms") || name.ends_with(".bytes");
    let config_type = if numeric { TYPE_LONG } else { TYPE_STRING };
    let e = DescribeConfigsResourceResult::default()
        .with_name(str_bytes(name))
        .with_value(Some(str_bytes(value)))
        .with_read_only(read_only)
        .with_config_source(source)
        .with_config_type(config_type);
    hide_secret(e)
}

/// A secret's entry as Kafka describes a PASSWORD key: no value, `is_sensitive` (a
/// field of every version of the response).
fn hide_secret(e: DescribeConfigsResourceResult) -> DescribeConfigsResourceResult {
    if !keys::is_sensitive(e.name.as_str()) {
        return e;
    }
    e.with_value(None)
        .with_is_sensitive(true)
        .with_config_type(TYPE_PASSWORD)
}

/// A topic's entries of the keys `wanted` (only those are built).
fn topic_entries(
    shard: &Shard,
    topic: &str,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<DescribeConfigsResourceResult>, TopicError> {
    let catalog = shard.catalog();
    let Some(meta) = catalog.topics.get(topic) else {
        return Err((
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("topic {topic} does not exist"),
        ));
    };
    let defaults = shard.config().topic_defaults();
    // Topic keys whose broker default was set dynamically (AlterConfigs on the broker),
    // with the source Kafka names for the layer it was set in.
    // (A single node's one set stands for the cluster default, as before clusters.)
    let store = &shard.config().dynamic;
    let dynamic = store.all_with_layer();
    let dynamic_defaults: BTreeMap<&str, i8> = keys::DYNAMIC_APPLIED
        .iter()
        .filter_map(|(broker_key, topic_key)| {
            let source = match dynamic.get(*broker_key)?.1 {
                Layer::Node if store.in_cluster() => SOURCE_DYNAMIC_BROKER,
                _ => SOURCE_DYNAMIC_DEFAULT_BROKER,
            };
            Some((*topic_key, source))
        })
        .collect();
    let mut keys: Vec<&str> = defaults.keys().map(String::as_str).collect();
    keys.extend(meta.configs.keys().map(String::as_str));
    keys.retain(|k| wanted(k));
    keys.sort_unstable();
    keys.dedup();
    Ok(keys
        .into_iter()
        .filter_map(|k| match (meta.configs.get(k), defaults.get(k)) {
            (Some(v), _) => Some(entry(k, v, SOURCE_TOPIC, false)),
            (None, Some(v)) if dynamic_defaults.contains_key(k) => {
                Some(entry(k, v, dynamic_defaults[k], false))
            }
            (None, Some(v)) => Some(entry(k, v, SOURCE_DEFAULT, false)),
            (None, None) => None,
        })
        .collect())
}

/// Every broker key weir reads, Kafka's dynamic keys it accepts without effect (null
/// unless set: clients such as kafka-python alter only keys described as dynamic), and
/// every dynamic key set, in key order.
fn broker_entries(shard: &Shard) -> Vec<DescribeConfigsResourceResult> {
    let c = shard.config();
    let dynamic = c.dynamic.all_with_layer();
    let mut names: Vec<&str> = keys::WEIR_KEYS.to_vec();
    names.extend(keys::KAFKA_DYNAMIC_IGNORED);
    names.extend(dynamic.keys().map(String::as_str));
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|k| {
            let read_only = !matches!(keys::dynamic_kind(k), Dynamic::Applied(_) | Dynamic::Stored);
            let (value, source) = match dynamic.get(k) {
                Some((v, Layer::Node)) => (Some(v.clone()), SOURCE_DYNAMIC_BROKER),
                Some((v, Layer::ClusterDefault)) => {
                    (Some(v.clone()), SOURCE_DYNAMIC_DEFAULT_BROKER)
                }
                None if FLAG_KEYS.contains(&k) || c.props.get(k).is_some() => {
                    (broker_value(shard, k), SOURCE_STATIC_BROKER)
                }
                None => (broker_value(shard, k), SOURCE_DEFAULT),
            };
            let config_type = match value.as_deref() {
                Some("true" | "false") => TYPE_BOOLEAN,
                Some(v) if v.parse::<i64>().is_ok() => TYPE_LONG,
                _ => TYPE_STRING,
            };
            let e = DescribeConfigsResourceResult::default()
                .with_name(str_bytes(k))
                .with_value(value.map(|v| str_bytes(&v)))
                .with_read_only(read_only)
                .with_config_source(source)
                .with_config_type(config_type);
            hide_secret(e)
        })
        .collect()
}

/// `NAME://HOST:PORT,...` over every listener, each address from `addr`.
fn listener_list(
    c: &crate::config::Config,
    addr: impl Fn(usize, &crate::security::listener::ListenerConfig) -> String,
) -> String {
    c.listeners
        .iter()
        .enumerate()
        .map(|(i, l)| format!("{}://{}", l.name, addr(i, l)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The value weir runs with for broker key `key` (static or default; `None` where Kafka's
/// default is null, e.g. `log.retention.minutes`).
fn broker_value(shard: &Shard, key: &str) -> Option<String> {
    let c = shard.config();
    let log = crate::storage::LogConfig::default();
    let group = crate::group::Settings::from_config(shard.config());
    let txn = crate::txn::Settings::from_config(shard.config());
    let limits = &c.partition_limits;
    let (host, port) = &shard.advertised;
    let value = match key {
        "advertised.listeners" => listener_list(c, |i, l| match &l.advertised {
            Some((h, p)) => format!("{h}:{p}"),
            // The first listener's is known as bound (an ephemeral port resolved).
            None if i == 0 => format!("{host}:{port}"),
            None if l.bind.ip().is_unspecified() => format!("127.0.0.1:{}", l.bind.port()),
            None => l.bind.to_string(),
        }),
        "listeners" => listener_list(c, |_, l| l.bind.to_string()),
        "log.dir" | "log.dirs" => c.data_dir.display().to_string(),
        "node.id" | "broker.id" => c.node_id.to_string(),
        "weir.shards" => c.shards.to_string(),
        "auto.create.topics.enable" => c.auto_create_topics.to_string(),
        "connections.max.idle.ms" => c.connections_max_idle_ms.to_string(),
        "default.replication.factor" => c.default_replication_factor.to_string(),
        "fetch.max.bytes" => c.fetch_max_bytes.to_string(),
        "fetch.response.buffer.max.bytes" => c.fetch_response_buffer_max_bytes.to_string(),
        "log.index.cache.bytes" => c.log_index_cache_bytes.to_string(),
        "log.tail.cache.max.bytes" => c.log_tail_cache_max_bytes.to_string(),
        "log.flush.on.ack" => c.flush_on_ack.to_string(),
        "log.retention.bytes" | "retention.bytes" => c.retention_bytes.to_string(),
        "log.retention.ms" | "retention.ms" => c.retention_ms.to_string(),
        "log.segment.bytes" | "segment.bytes" => c.segment_bytes.to_string(),
        "log.retention.check.interval.ms" => c.retention_check_interval_ms.to_string(),
        "max.connections" => c.max_connections.to_string(),
        "max.connections.per.ip" => c.max_connections_per_ip.to_string(),
        "max.open.partitions" => limits.max_open_partitions.to_string(),
        "max.partitions" => limits.max_partitions.to_string(),
        "max.partitions.per.request" => limits.max_partitions_per_request.to_string(),
        "message.max.bytes" => c.message_max_bytes.to_string(),
        "min.insync.replicas" => c.min_insync_replicas.to_string(),
        "num.partitions" => c.num_partitions.to_string(),
        "queued.max.request.bytes" => c.queued_max_request_bytes.to_string(),
        "request.read.timeout.ms" => c.request_read_timeout_ms.to_string(),
        "socket.request.max.bytes" => c.socket_request_max_bytes.to_string(),
        _ => {
            return c.props.get(key).map(str::to_string).or_else(|| {
                // Keys read elsewhere: their own defaults.
                let v = match key {
                    "log.cleanup.policy" => "delete".to_string(),
                    "connections.max.reauth.ms" => "0".to_string(),
                    "compression.type" => "producer".to_string(),
                    "log.message.timestamp.type" => "CreateTime".to_string(),
                    "log.retention.hours" => "168".to_string(),
                    "log.flush.interval.messages" => log.flush_interval_messages.to_string(),
                    "log.flush.interval.ms" => log.flush_interval_ms.to_string(),
                    "log.index.interval.bytes" => log.index_interval_bytes.to_string(),
                    "log.index.size.max.bytes" => log.segment_index_bytes.to_string(),
                    "log.roll.ms" => log.segment_ms.to_string(),
                    "log.tail.cache.bytes" => log.tail_cache_bytes.to_string(),
                    "log.read.ahead.bytes" => log.read_ahead_bytes.to_string(),
                    "producer.id.expiration.ms" => {
                        crate::producer_state::PRODUCER_ID_EXPIRATION_MS_DEFAULT.to_string()
                    }
                    "group.initial.rebalance.delay.ms" => group.limits.initial_delay_ms.to_string(),
                    "group.max.session.timeout.ms" => group.session_max_ms.to_string(),
                    "group.max.size" => group.limits.max_size.to_string(),
                    "group.min.session.timeout.ms" => group.session_min_ms.to_string(),
                    "log.cleaner.backoff.ms" => c.log_cleaner.backoff_ms.to_string(),
                    "offset.metadata.max.bytes" => group.metadata_max_bytes.to_string(),
                    "offsets.retention.check.interval.ms" => group.retention_check_ms.to_string(),
                    "offsets.retention.minutes" => (group.retention_ms / 60_000).to_string(),
                    "offsets.topic.num.partitions" => group.num_partitions.to_string(),
                    "offsets.topic.segment.bytes" => group.segment_bytes.to_string(),
                    "transaction.max.timeout.ms" => txn.max_timeout_ms.to_string(),
                    "transactional.id.expiration.ms" => txn.id_expiration_ms.to_string(),
                    "transaction.abort.timed.out.transaction.cleanup.interval.ms" => {
                        txn.abort_check_ms.to_string()
                    }
                    "transaction.remove.expired.transaction.cleanup.interval.ms" => {
                        txn.expire_check_ms.to_string()
                    }
                    "transaction.state.log.num.partitions" => txn.num_partitions.to_string(),
                    "transaction.state.log.replication.factor" => {
                        txn.replication_factor.to_string()
                    }
                    "transaction.state.log.min.isr" => txn.min_isr.to_string(),
                    "transaction.state.log.segment.bytes" => txn.segment_bytes.to_string(),
                    _ => crate::partition::COMPRESSION_LEVEL_DEFAULTS
                        .iter()
                        .find(|(k, _)| *k == key)
                        .map(|(_, v)| v.to_string())?,
                };
                Some(v)
            });
        }
    };
    Some(value)
}

/// A BROKER resource names this node (its id) or, empty, the cluster-wide default; a
/// single node keeps one set for both.
fn check_broker_name(shard: &Shard, name: &str) -> Result<(), TopicError> {
    let node = shard.config().node_id;
    if name.is_empty() || name.trim() == node.to_string() {
        return Ok(());
    }
    Err((
        errors::INVALID_REQUEST,
        format!("broker {name} is not this node (node {node})"),
    ))
}

/// Replaces (`AlterConfigs`) or edits (`IncrementalAlterConfigs`) the dynamic broker
/// configs. `edit` gets the current dynamic set and the value weir runs with for a key
/// (for APPEND/SUBTRACT on a key without a dynamic value).
async fn change_broker(
    shard: &Rc<Shard>,
    name: &str,
    validate_only: bool,
    edit: impl FnOnce(
        &mut BTreeMap<String, String>,
        &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), TopicError>,
) -> Result<(), TopicError> {
    check_broker_name(shard, name)?;
    let store = shard.config().dynamic.clone();
    if store.in_cluster() {
        return change_cluster_broker(shard, name, validate_only, edit).await;
    }
    let old = store.all();
    let new = edited(shard, &old, edit)?;
    if validate_only || new == old {
        return Ok(());
    }
    let applied = keys::DYNAMIC_APPLIED
        .iter()
        .any(|(k, _)| old.get(*k) != new.get(*k));
    // Another shard's client may change the set meanwhile: the store applies this change
    // over whatever it holds then.
    let now = glommio::executor()
        .spawn_blocking(move || store.change(&old, &new))
        .await
        .map_err(|e| {
            let msg = format!("cannot persist dynamic broker configs: {e}");
            (errors::KAFKA_STORAGE_ERROR, msg)
        })?;
    // Secrets set dynamically (a listener's JAAS line, a key password) stay out of the log.
    let shown: Vec<String> = now.iter().map(|(k, v)| keys::shown(k, v)).collect();
    let shown = shown.join(", ");
    tracing::info!(configs = %shown, "dynamic broker configs changed");
    if applied {
        reconfigure_all_topics(shard).await;
    }
    Ok(())
}

/// `old` after `edit`, every key it adds or changes checked.
fn edited(
    shard: &Rc<Shard>,
    old: &BTreeMap<String, String>,
    edit: impl FnOnce(
        &mut BTreeMap<String, String>,
        &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), TopicError>,
) -> Result<BTreeMap<String, String>, TopicError> {
    let mut new = old.clone();
    let effective = |k: &str| broker_value(shard, k);
    edit(&mut new, &effective)?;
    for (k, v) in new.iter().filter(|(k, v)| old.get(*k) != Some(*v)) {
        check_dynamic(k, v)?;
    }
    Ok(new)
}

/// A cluster's broker configs are metadata: the set named ("" the cluster default, else
/// this node's own) is changed through the controller, compare and set as a topic's,
/// and every node applies it from its image.
async fn change_cluster_broker(
    shard: &Rc<Shard>,
    name: &str,
    validate_only: bool,
    edit: impl FnOnce(
        &mut BTreeMap<String, String>,
        &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), TopicError>,
) -> Result<(), TopicError> {
    let name = name.trim();
    // The edit runs once (it may own its operations); a retry after another change came
    // first replays the same difference onto the newer set.
    let old = shard
        .catalog()
        .broker_configs
        .get(name)
        .cloned()
        .unwrap_or_default();
    let new = edited(shard, &old, edit)?;
    if validate_only || new == old {
        return Ok(());
    }
    let mut last = (errors::INVALID_UPDATE_VERSION, String::new());
    let mut expected = old.clone();
    for attempt in 0..CHANGE_ATTEMPTS {
        if attempt > 0 {
            glommio::timer::sleep(CHANGE_RETRY_BACKOFF * attempt).await;
            shard.sync_all().await;
            expected = shard
                .catalog()
                .broker_configs
                .get(name)
                .cloned()
                .unwrap_or_default();
        }
        let configs = crate::config::dynamic::replay(&old, &new, &expected);
        let cmd = Command::AlterBrokerConfigs {
            name: name.to_string(),
            configs,
            expected: expected.clone(),
        };
        match submit_compared(shard, cmd).await? {
            Err(stale) => last = stale,
            Ok(()) => {
                let shown: Vec<String> = new.iter().map(|(k, v)| keys::shown(k, v)).collect();
                tracing::info!(broker = name, configs = %shown.join(", "), "dynamic broker configs changed");
                return Ok(());
            }
        }
    }
    Err(last)
}

/// Submits a compare-and-set config command: `Ok(Ok(()))` once it is applied (and this
/// node's shards synced), `Ok(Err(stale))` if the set it was computed from changed
/// meanwhile (compute again), `Err` for any other refusal.
async fn submit_compared(
    shard: &Rc<Shard>,
    cmd: Command,
) -> Result<Result<(), TopicError>, TopicError> {
    match shard.node.controller.submit(&shard.node, cmd).await {
        Outcome::Done(Err(e)) if e.0 == errors::INVALID_UPDATE_VERSION => Ok(Err(e)),
        Outcome::Done(done) => {
            done?;
            shard.sync_all().await;
            Ok(Ok(()))
        }
        other => {
            let msg = format!("controller answered {other:?}");
            Err((errors::UNKNOWN_SERVER_ERROR, msg))
        }
    }
}

/// Longest value a dynamic broker config may have (a JAAS line or a certificate list
/// fits; it is stored in the catalogue or the properties file).
const DYNAMIC_VALUE_BYTES_MAX: usize = 32 * 1024;

/// Whether `key` may be set to `value` at runtime.
fn check_dynamic(key: &str, value: &str) -> Result<(), TopicError> {
    use crate::config::dynamic::storable;
    if value.len() > DYNAMIC_VALUE_BYTES_MAX {
        return Err((
            errors::INVALID_CONFIG,
            format!(
                "{key}: a {} byte value is longer than {DYNAMIC_VALUE_BYTES_MAX}",
                value.len()
            ),
        ));
    }
    if !storable(key, true) || !storable(value, false) {
        return Err((
            errors::INVALID_CONFIG,
            format!(
                "{key:?}: a line break, blanks at either end, a trailing backslash, or in a \
                 key one of = : # !, cannot be stored"
            ),
        ));
    }
    match keys::dynamic_kind(key) {
        Dynamic::Applied(topic_key) => {
            let one = BTreeMap::from([(topic_key.to_string(), value.to_string())]);
            validate_configs(&one).map_err(|(code, msg)| (code, format!("{key}: {msg}")))
        }
        Dynamic::Stored => Ok(()),
        Dynamic::ReadOnly => Err((
            errors::INVALID_CONFIG,
            format!(
                "{key} cannot be changed while weir runs: set it in server.properties or with \
                 --set and restart (dynamic keys: {})",
                keys::DYNAMIC_APPLIED
                    .iter()
                    .map(|(k, _)| *k)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        Dynamic::Unknown => Err((
            errors::INVALID_CONFIG,
            format!("unknown broker config {key}"),
        )),
    }
}

/// A broker default changed the effective config of every topic without its own
/// override. The shards reconfigure open partitions whose catalogue entry changed, so
/// every entry is replaced by an equal copy (one catalogue write), then all shards sync.
async fn reconfigure_all_topics(shard: &Rc<Shard>) {
    let touched = shard.node.meta.update(|c| {
        for t in c.topics.values_mut() {
            *t = Arc::new((**t).clone());
        }
        Ok(())
    });
    if let Err(e) = touched {
        tracing::warn!("broker defaults changed, open partitions not reconfigured: {e}");
        return;
    }
    shard.sync_all().await;
}

/// Replaces (`AlterConfigs`) or edits (`IncrementalAlterConfigs`) a topic's overrides.
async fn change_topic(
    shard: &Rc<Shard>,
    resource_type: i8,
    topic: &str,
    validate_only: bool,
    edit: impl Fn(&mut BTreeMap<String, String>) -> Result<(), TopicError>,
) -> Result<(), TopicError> {
    if resource_type != RESOURCE_TOPIC {
        return Err((
            errors::INVALID_REQUEST,
            "only topic and broker configs can be altered".into(),
        ));
    }
    // The change is computed from this node's catalogue and applied only if the topic's
    // overrides are still those (compare and set): when another change came first, it is
    // computed again from the catalogue that has it.
    let mut last = (errors::INVALID_UPDATE_VERSION, String::new());
    for attempt in 0..CHANGE_ATTEMPTS {
        if attempt > 0 {
            glommio::timer::sleep(CHANGE_RETRY_BACKOFF * attempt).await;
            shard.sync_all().await;
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
            expected: Some(meta.configs.clone()),
        };
        match submit_compared(shard, cmd).await? {
            Err(stale) => last = stale,
            Ok(()) => {
                tracing::info!(topic, "topic config changed");
                return Ok(());
            }
        }
    }
    Err(last)
}

/// How many times a topic config change is computed again after another change of the
/// same topic came first.
const CHANGE_ATTEMPTS: u32 = 8;
/// The wait before computing again (times the attempt), for this node's catalogue to
/// catch up with the change that came first.
const CHANGE_RETRY_BACKOFF: std::time::Duration = std::time::Duration::from_millis(20);

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
        let outcome = if r.resource_type == RESOURCE_BROKER {
            change_broker(
                shard,
                r.resource_name.as_str(),
                req.validate_only,
                |c, _| {
                    *c = new;
                    Ok(())
                },
            )
            .await
        } else {
            change_topic(
                shard,
                r.resource_type,
                r.resource_name.as_str(),
                req.validate_only,
                |c| {
                    c.clone_from(&new);
                    Ok(())
                },
            )
            .await
        };
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
        let outcome = if r.resource_type == RESOURCE_BROKER {
            change_broker(
                shard,
                r.resource_name.as_str(),
                req.validate_only,
                |c, now| apply_broker_ops(c, ops, now),
            )
            .await
        } else {
            // APPEND / SUBTRACT start from the value in force: the broker default when the
            // topic has no override (Kafka's rule), not from nothing.
            let defaults = shard.config().topic_defaults();
            change_topic(
                shard,
                r.resource_type,
                r.resource_name.as_str(),
                req.validate_only,
                |c| apply_ops(c, ops.clone(), &defaults),
            )
            .await
        };
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
    defaults: &BTreeMap<String, String>,
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
                    .or_else(|| defaults.get(&key))
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

/// IncrementalAlterConfigs on the broker: SET and DELETE for any key (checked after),
/// APPEND and SUBTRACT for the list key `log.cleanup.policy`, starting from the value weir
/// runs with when no dynamic value is set.
fn apply_broker_ops(
    configs: &mut BTreeMap<String, String>,
    ops: Vec<(String, i8, Option<String>)>,
    effective: &dyn Fn(&str) -> Option<String>,
) -> Result<(), TopicError> {
    for (key, op, value) in ops {
        match (op, value) {
            (0, Some(v)) => {
                configs.insert(key, v);
            }
            (1, _) => {
                configs.remove(&key);
            }
            (2, Some(v)) | (3, Some(v)) if key == "log.cleanup.policy" => {
                let current = configs.get(&key).cloned().or_else(|| effective(&key));
                let mut items: Vec<String> = current
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A dynamic broker value is stored in the catalogue (a cluster's metadata log) or
    /// the properties file: bounded, whatever the key.
    #[test]
    fn a_dynamic_value_is_bounded() {
        let long = "x".repeat(DYNAMIC_VALUE_BYTES_MAX + 1);
        let refused = check_dynamic("sasl.jaas.config", &long);
        assert_eq!(refused.map_err(|e| e.0), Err(errors::INVALID_CONFIG));
        assert!(check_dynamic("log.retention.ms", "1000").is_ok());
    }
}
