//! Topic administration: CreateTopics (with configs, validate_only), DeleteTopics,
//! CreatePartitions. Requests are checked here; changes are made by the controller
//! (`crate::controller`: the catalogue on a single node, the quorum in a cluster), then
//! every shard is told to sync its open partitions with it.

use std::collections::{BTreeMap, HashMap, HashSet};
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
use crate::controller::apply::check_placement;
use crate::controller::{Command, NewTopic, Outcome, meta_error};
use crate::errors;
use crate::metadata::{
    self, Catalog, CollisionIndex, MetaError, PARTITIONS_PER_TOPIC_MAX, TopicMeta,
};
use crate::shard::Shard;

/// An error code and message for one topic.
pub use crate::controller::TopicError;

/// Topic-level config keys weir accepts (Kafka's names). Those the log uses take effect;
/// the rest are stored and reported for compatibility.
pub const TOPIC_CONFIG_KEYS: &[&str] = &[
    "cleanup.policy",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.type",
    "compression.zstd.level",
    "delete.retention.ms",
    "file.delete.delay.ms",
    "flush.messages",
    "flush.ms",
    "index.interval.bytes",
    "max.compaction.lag.ms",
    "max.message.bytes",
    // Accepted and ignored, as Kafka 3.x does (it writes record batch v2 whatever the value).
    "message.format.version",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
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
        // Every topic key takes a short value; a long one only bloats the catalogue (and
        // in a cluster every metadata command that carries it).
        if v.len() > TOPIC_CONFIG_VALUE_BYTES_MAX {
            return Err((
                errors::INVALID_CONFIG,
                format!(
                    "{k}: a {} byte value is longer than {TOPIC_CONFIG_VALUE_BYTES_MAX}",
                    v.len()
                ),
            ));
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
        // Kafka's validators for the keys stored without effect on the log.
        let level = crate::partition::compression_level_valid(k, v);
        let valid = match k.as_str() {
            _ if level.is_some() => level == Some(true),
            "min.insync.replicas" => v.trim().parse::<i64>().is_ok_and(|n| n >= 1),
            // Kafka's int with atLeast(0): a negative or oversized value fell back to the
            // built-in limit, ignoring the broker's message.max.bytes.
            "max.message.bytes" => v
                .trim()
                .parse::<i64>()
                .is_ok_and(|n| (0..=i64::from(i32::MAX)).contains(&n)),
            "compression.type" => matches!(
                v.trim(),
                "uncompressed" | "zstd" | "lz4" | "snappy" | "gzip" | "producer"
            ),
            "unclean.leader.election.enable" => matches!(v.trim(), "true" | "false"),
            // A Kafka version ("3.0", "2.8-IV1"), accepted and ignored.
            "message.format.version" => {
                let v = v.trim();
                v.starts_with(|c: char| c.is_ascii_digit())
                    && v.len() <= 32
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
            }
            _ => true,
        };
        if !valid {
            return Err((
                errors::INVALID_CONFIG,
                format!("{k}={v} is not a valid value"),
            ));
        }
    }
    let pairs = configs.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    crate::storage::LogConfig::from_pairs(pairs)
        .map_err(|e| (errors::INVALID_CONFIG, e.to_string()))?;
    Ok(())
}

/// Longest value any topic config may have.
pub const TOPIC_CONFIG_VALUE_BYTES_MAX: usize = 1024;

/// Topics of one CreateTopics request checked between yields to the executor, so a
/// request naming thousands of topics does not hold the shard's other clients back.
const CHECK_YIELD_TOPICS: usize = 256;
/// Topics named in one log line of a creation; more are only counted.
const LOGGED_TOPICS_MAX: usize = 16;

/// Partitions one request may still add: `max.partitions.per.request`, shared by all
/// topics of a CreateTopics, CreatePartitions or auto-creating Metadata request.
pub struct RequestBudget {
    left: std::cell::Cell<u64>,
    max: u64,
}

impl RequestBudget {
    pub fn new(shard: &Shard) -> RequestBudget {
        let max = shard.config().partition_limits.max_partitions_per_request;
        RequestBudget {
            left: std::cell::Cell::new(max),
            max,
        }
    }

    /// Takes `partitions` from the budget, or refuses with POLICY_VIOLATION.
    fn take(&self, partitions: i32) -> Result<(), TopicError> {
        let wanted = u64::try_from(partitions).unwrap_or(0);
        let left = self.left.get();
        if wanted > left {
            let max = self.max;
            return Err((
                errors::POLICY_VIOLATION,
                format!(
                    "request would add more than max.partitions.per.request={max} partitions \
                     ({wanted} asked, {left} left in this request): send fewer per request"
                ),
            ));
        }
        self.left.set(left - wanted);
        Ok(())
    }
}

/// The catalogue new names are checked against. For a request of many names, with its
/// collision index built once: a CreateTopics naming thousands of topics costs one pass
/// over the catalogue, not one per topic.
struct NameCheck {
    catalog: Arc<Catalog>,
    /// `None` for a single name: one scan, and none for a name without `.` or `_`.
    index: Option<CollisionIndex>,
}

impl NameCheck {
    fn for_request(shard: &Shard) -> NameCheck {
        let catalog = shard.catalog();
        let index = Some(catalog.collision_index());
        NameCheck { catalog, index }
    }

    fn for_one(shard: &Shard) -> NameCheck {
        let catalog = shard.catalog();
        NameCheck {
            catalog,
            index: None,
        }
    }

    fn check(&self, name: &str) -> Result<(), TopicError> {
        let checked = match &self.index {
            Some(index) => self.catalog.check_new_name_in(name, index),
            None => self.catalog.check_new_name(name),
        };
        checked.map_err(meta_error)
    }
}

/// Checks that a topic could be created as asked (name, partition count, configs, not
/// already there).
fn check_topic(
    names: &NameCheck,
    name: &str,
    partitions: i32,
    configs: &BTreeMap<String, String>,
) -> Result<(), TopicError> {
    metadata::validate_topic_name(name).map_err(meta_error)?;
    if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&partitions) {
        return Err(meta_error(MetaError::InvalidPartitions(partitions)));
    }
    validate_configs(configs)?;
    // Exists (TOPIC_ALREADY_EXISTS), internal (INVALID_REQUEST), `.`/`_` collision
    // (INVALID_TOPIC_EXCEPTION), as Kafka answers; checked again under the catalogue lock.
    names.check(name)
}

/// Adds checked topics through the controller in one write. Each is checked again there
/// (another shard may have created it, or taken the node's partitions, meanwhile). One
/// outcome per topic, in order: its id or its error.
async fn insert_topics(shard: &Shard, topics: Vec<NewTopic>) -> Vec<Result<u128, TopicError>> {
    // A request whose topics would make one command larger than a quorum command may be
    // is written in several (each still atomic); any other in one.
    let mut out = Vec::with_capacity(topics.len());
    for chunk in by_size(topics, TOPICS_COMMAND_BYTES) {
        out.extend(insert_chunk(shard, chunk).await);
    }
    out
}

/// Topic bytes (as JSON) put in one CreateTopics command: a quarter of the command bound
/// ([`crate::controller::bridge::COMMAND_BYTES_MAX`]), leaving room for the rest of it
/// and keeping each command's apply short.
const TOPICS_COMMAND_BYTES: usize = crate::controller::bridge::SPLIT_COMMAND_BYTES;

/// `topics` in order, cut into runs of at most `limit` bytes as JSON (a topic larger
/// than `limit` alone in its run; the command bound refuses it if it is too large).
fn by_size(topics: Vec<NewTopic>, limit: usize) -> Vec<Vec<NewTopic>> {
    crate::controller::bridge::by_size(topics, limit)
}

/// One CreateTopics command of `topics`: one outcome per topic, in order.
async fn insert_chunk(shard: &Shard, topics: Vec<NewTopic>) -> Vec<Result<u128, TopicError>> {
    // Nothing passed the checks: no command (in a cluster each is a quorum write, and
    // every node re-syncs its partitions after it).
    if topics.is_empty() {
        return Vec::new();
    }
    let count = topics.len();
    let cmd = Command::CreateTopics {
        topics,
        max_partitions: shard.config().partition_limits.max_partitions,
    };
    match shard.node.controller.submit(&shard.node, cmd).await {
        Outcome::Created(outcomes) if outcomes.len() == count => outcomes,
        other => {
            let err = (
                errors::UNKNOWN_SERVER_ERROR,
                format!("controller answered {other:?}"),
            );
            (0..count).map(|_| Err(err.clone())).collect()
        }
    }
}

/// Whether this node is one of a cluster (partitions placed on several nodes).
fn in_cluster(shard: &Shard) -> bool {
    shard.node.controller.cluster().is_some()
}

/// A topic created with the defaults of this node (auto-creation).
fn new_topic(shard: &Shard, meta: TopicMeta) -> NewTopic {
    let replication_factor = if in_cluster(shard) {
        shard.config().default_replication_factor
    } else {
        1
    };
    NewTopic {
        meta,
        internal: false,
        replication_factor,
        assignments: Vec::new(),
    }
}

/// Logs what a creation added: each topic of a small request, a count for a large one.
fn log_created(created: &[(&str, i32)]) {
    if created.len() <= LOGGED_TOPICS_MAX {
        for (topic, partitions) in created {
            tracing::info!(%topic, partitions, "topic created");
        }
    } else {
        let partitions: i64 = created.iter().map(|(_, p)| i64::from(*p)).sum();
        let first = created.first().map_or("", |(t, _)| *t);
        tracing::info!(topics = created.len(), partitions, first, "topics created");
    }
}

/// Creates a topic (or only checks that it could be created). Its partitions are opened
/// on first use, not here: creating 100,000 partitions is a catalogue write.
pub async fn create_topic(
    shard: &Rc<Shard>,
    name: &str,
    partitions: i32,
    configs: BTreeMap<String, String>,
    validate_only: bool,
    budget: &RequestBudget,
) -> Result<u128, TopicError> {
    check_topic(&NameCheck::for_one(shard), name, partitions, &configs)?;
    budget.take(partitions)?;
    if validate_only {
        return Ok(0);
    }
    let meta = TopicMeta {
        name: name.to_string(),
        id: metadata::new_topic_id(),
        partitions,
        configs,
        assignment: Vec::new(),
    };
    let outcome = insert_topics(shard, vec![new_topic(shard, meta)])
        .await
        .pop()
        .unwrap_or(Err((errors::UNKNOWN_SERVER_ERROR, "no outcome".into())));
    if outcome.is_ok() {
        log_created(&[(name, partitions)]);
        shard.sync_all().await;
    }
    outcome
}

/// Metadata's auto-creation of `names` (each unknown when asked) with this node's
/// defaults: each checked and counted against `budget`, those that pass created in one
/// catalogue write, the shards synced once. One outcome per name, in order.
pub async fn auto_create(
    shard: &Rc<Shard>,
    names: &[String],
    budget: &RequestBudget,
) -> Vec<Result<u128, TopicError>> {
    let partitions = shard.config().num_partitions;
    let check = NameCheck::for_request(shard);
    let mut outcomes: Vec<Result<u128, TopicError>> = Vec::with_capacity(names.len());
    let mut pending: Vec<(usize, NewTopic)> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if i % CHECK_YIELD_TOPICS == CHECK_YIELD_TOPICS - 1 {
            glommio::executor().yield_if_needed().await;
        }
        let checked = check_topic(&check, name, partitions, &BTreeMap::new())
            .and_then(|()| budget.take(partitions));
        outcomes.push(checked.map(|()| 0));
        if outcomes[i].is_ok() {
            let meta = TopicMeta {
                name: name.clone(),
                id: metadata::new_topic_id(),
                partitions,
                configs: BTreeMap::new(),
                assignment: Vec::new(),
            };
            pending.push((i, new_topic(shard, meta)));
        }
    }
    let at: Vec<usize> = pending.iter().map(|(i, _)| *i).collect();
    let inserted = insert_topics(shard, pending.into_iter().map(|(_, t)| t).collect()).await;
    let mut created = Vec::new();
    for (i, outcome) in at.into_iter().zip(inserted) {
        if outcome.is_ok() {
            created.push((names[i].as_str(), partitions));
        }
        outcomes[i] = outcome;
    }
    if !created.is_empty() {
        log_created(&created);
        shard.sync_all().await;
    }
    outcomes
}

/// One CreateTopics topic as asked for: partitions, configs, replication factor and the
/// explicit replica lists (empty: placed by the controller).
struct Requested {
    partitions: i32,
    configs: BTreeMap<String, String>,
    replication_factor: i16,
    assignments: Vec<Vec<i32>>,
}

/// One CreateTopics topic: its partition count (`-1`: `num.partitions`), configs and
/// placement, or why it cannot be created.
fn requested_topic(
    shard: &Rc<Shard>,
    names: &NameCheck,
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    budget: &RequestBudget,
) -> Result<Requested, TopicError> {
    let name = t.name.0.as_str();
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
    if in_cluster(shard) {
        return requested_in_cluster(names, t, partitions, rf, configs, budget);
    }
    let partitions = if t.assignments.is_empty() {
        if rf != 1 {
            return Err((
                errors::INVALID_REPLICATION_FACTOR,
                format!("replication factor {rf}: this is a single node"),
            ));
        }
        partitions
    } else {
        let lists = explicit_assignment(t)?;
        single_node_assignment(shard, &lists)?;
        i32::try_from(lists.len()).unwrap_or(i32::MAX)
    };
    check_topic(names, name, partitions, &configs)?;
    budget.take(partitions)?;
    Ok(Requested {
        partitions,
        configs,
        replication_factor: 1,
        assignments: Vec::new(),
    })
}

/// A CreateTopics topic's explicit replica lists in partition order (Kafka: then neither
/// a partition count nor a replication factor may be given, and the partitions are
/// 0..n, each once).
fn explicit_assignment(
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
) -> Result<Vec<Vec<i32>>, TopicError> {
    if t.num_partitions != -1 || t.replication_factor != -1 {
        return Err((
            errors::INVALID_REQUEST,
            "give either an assignment or a partition count and replication factor".into(),
        ));
    }
    let mut given: Vec<(i32, Vec<i32>)> = t
        .assignments
        .iter()
        .map(|a| {
            (
                a.partition_index,
                a.broker_ids.iter().map(|b| b.0).collect(),
            )
        })
        .collect();
    given.sort_by_key(|(p, _)| *p);
    let in_order = given
        .iter()
        .enumerate()
        .all(|(i, (p, _))| usize::try_from(*p).ok() == Some(i));
    if !in_order {
        return Err((
            errors::INVALID_REPLICA_ASSIGNMENT,
            "assignments must name partitions 0..n once each".into(),
        ));
    }
    Ok(given.into_iter().map(|(_, b)| b).collect())
}

/// On a single node the only valid replica list is `[this node]` (a Kafka cluster of one
/// broker answers any other id as unknown).
fn single_node_assignment(shard: &Shard, lists: &[Vec<i32>]) -> Result<(), TopicError> {
    let node = shard.config().node_id;
    match lists.iter().find(|l| l.as_slice() != [node]) {
        Some(l) => Err((
            errors::INVALID_REPLICA_ASSIGNMENT,
            format!("replicas {l:?}: this single node is node {node}"),
        )),
        None => Ok(()),
    }
}

/// A CreateTopics topic on a cluster node: an explicit assignment (Kafka: then neither
/// a partition count nor a replication factor) gives both; the controller checks the
/// replication factor against the live nodes.
fn requested_in_cluster(
    names: &NameCheck,
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    partitions: i32,
    rf: i16,
    configs: BTreeMap<String, String>,
    budget: &RequestBudget,
) -> Result<Requested, TopicError> {
    let name = t.name.0.as_str();
    if t.assignments.is_empty() {
        check_topic(names, name, partitions, &configs)?;
        budget.take(partitions)?;
        return Ok(Requested {
            partitions,
            configs,
            replication_factor: rf,
            assignments: Vec::new(),
        });
    }
    let assignments = explicit_assignment(t)?;
    let partitions = i32::try_from(assignments.len()).unwrap_or(i32::MAX);
    check_topic(names, name, partitions, &configs)?;
    budget.take(partitions)?;
    let replication_factor = assignments
        .first()
        .map_or(0, |a| i16::try_from(a.len()).unwrap_or(i16::MAX));
    Ok(Requested {
        partitions,
        configs,
        replication_factor,
        assignments,
    })
}

/// CreateTopics: every topic is checked (yielding between chunks), then all that passed
/// go into the catalogue in one atomic write, and the shards sync once.
pub async fn create_topics(shard: &Rc<Shard>, req: CreateTopicsRequest) -> CreateTopicsResponse {
    let budget = RequestBudget::new(shard);
    let mut results = Vec::with_capacity(req.topics.len());
    let mut pending: Vec<(usize, NewTopic)> = Vec::new();
    let named_twice = repeated(req.topics.iter().map(|t| t.name.0.as_str()));
    let names = NameCheck::for_request(shard);
    for (i, t) in req.topics.iter().enumerate() {
        if i % CHECK_YIELD_TOPICS == CHECK_YIELD_TOPICS - 1 {
            glommio::executor().yield_if_needed().await;
        }
        let name = t.name.0.to_string();
        let mut r = CreatableTopicResult::default().with_name(topic_name(&name));
        let asked = match named_twice.contains(name.as_str()) {
            true => Err(duplicate("Found multiple entries for this topic.")),
            false => requested_topic(shard, &names, t, &budget),
        };
        match asked {
            Ok(asked) => {
                let partitions = asked.partitions;
                r = r
                    .with_num_partitions(partitions)
                    .with_replication_factor(asked.replication_factor);
                let meta = TopicMeta {
                    name,
                    id: metadata::new_topic_id(),
                    partitions,
                    configs: asked.configs,
                    assignment: Vec::new(),
                };
                let topic = NewTopic {
                    meta,
                    internal: false,
                    replication_factor: asked.replication_factor,
                    assignments: asked.assignments,
                };
                let placed = match (req.validate_only, in_cluster(shard)) {
                    (true, true) => check_placement(&shard.catalog(), &topic),
                    _ => Ok(()),
                };
                match placed {
                    Err((code, msg)) => {
                        r = r
                            .with_error_code(code)
                            .with_error_message(Some(str_bytes(&msg)));
                    }
                    Ok(()) if req.validate_only => {}
                    Ok(()) => pending.push((i, topic)),
                }
            }
            Err((code, msg)) => {
                r = r
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(&msg)));
            }
        }
        results.push(r);
    }
    let names: Vec<(usize, String, i32)> = pending
        .iter()
        .map(|(i, t)| (*i, t.meta.name.clone(), t.meta.partitions))
        .collect();
    let outcomes = insert_topics(shard, pending.into_iter().map(|(_, m)| m).collect()).await;
    let mut created = Vec::new();
    for ((i, name, partitions), outcome) in names.iter().zip(outcomes) {
        let Some(r) = results.get_mut(*i) else {
            continue;
        };
        match outcome {
            Ok(id) => {
                r.topic_id = Uuid::from_u128(id);
                created.push((name.as_str(), *partitions));
            }
            Err((code, msg)) => {
                r.error_code = code;
                r.error_message = Some(str_bytes(&msg));
                r.num_partitions = -1;
                r.replication_factor = -1;
            }
        }
    }
    if !created.is_empty() {
        log_created(&created);
        shard.sync_all().await;
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// The keys that occur more than once in `keys`. Kafka answers every entry of a topic
/// named twice in one CreateTopics, DeleteTopics or CreatePartitions INVALID_REQUEST
/// and does nothing for it: which of the two was meant is not for the broker to guess.
fn repeated<K: std::hash::Hash + Eq>(keys: impl Iterator<Item = K>) -> HashSet<K> {
    let mut seen = HashSet::new();
    let mut twice = HashSet::new();
    for key in keys {
        if let Some(again) = seen.replace(key) {
            twice.insert(again);
        }
    }
    twice
}

fn duplicate(msg: &str) -> TopicError {
    (errors::INVALID_REQUEST, msg.to_string())
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

/// Deletes topic `name` with id `id` (by default the id the name has here):
/// catalogue first, then every shard closes and removes its partitions.
pub async fn delete_topic(
    shard: &Rc<Shard>,
    name: &str,
    id: Option<u128>,
) -> Result<u128, TopicError> {
    refuse_internal(name, "delete")?;
    let id = id.or_else(|| shard.catalog().topics.get(name).map(|t| t.id));
    let cmd = Command::DeleteTopic {
        name: name.to_string(),
        id,
    };
    let id = match shard.node.controller.submit(&shard.node, cmd).await {
        Outcome::Deleted(outcome) => outcome?,
        other => {
            let msg = format!("controller answered {other:?}");
            return Err((errors::UNKNOWN_SERVER_ERROR, msg));
        }
    };
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
    // An entry is the id it gives, else the name (the authorizer may have added the
    // name an id has).
    let key = |(name, id): &(Option<String>, Uuid)| match id.is_nil() {
        true => (name.clone(), Uuid::nil()),
        false => (None, *id),
    };
    if !shard.config().delete_topic_enable {
        // Kafka's controller refuses the whole request, every topic named.
        let responses = targets.into_iter().map(|(name, id)| {
            DeletableTopicResult::default()
                .with_name(name.map(|n| topic_name(&n)))
                .with_topic_id(id)
                .with_error_code(errors::TOPIC_DELETION_DISABLED)
                .with_error_message(Some(str_bytes("Topic deletion is disabled.")))
        });
        return DeleteTopicsResponse::default().with_responses(responses.collect());
    }
    let named_twice = repeated(targets.iter().map(key));
    let ids = names_by_id(shard, &targets);
    let mut results = Vec::new();
    for target in targets {
        if named_twice.contains(&key(&target)) {
            let (name, id) = target;
            let msg = match id.is_nil() {
                true => "Duplicate topic name.",
                false => "Duplicate topic id.",
            };
            results.push(
                DeletableTopicResult::default()
                    .with_name(name.map(|n| topic_name(&n)))
                    .with_topic_id(id)
                    .with_error_code(errors::INVALID_REQUEST)
                    .with_error_message(Some(str_bytes(msg))),
            );
            continue;
        }
        let (name, id) = target;
        let name = name.or_else(|| ids.get(&id.as_u128()).cloned());
        let mut r = DeletableTopicResult::default().with_topic_id(id);
        match name {
            None => r = r.with_error_code(errors::UNKNOWN_TOPIC_ID),
            Some(n) => {
                r = r.with_name(Some(topic_name(&n)));
                let by_id = (!id.is_nil()).then(|| id.as_u128());
                match delete_topic(shard, &n, by_id).await {
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

/// The names of the topics that DeleteTopics entries without a name give by id, from one
/// pass over the catalogue (not one per entry).
fn names_by_id(shard: &Shard, targets: &[(Option<String>, Uuid)]) -> HashMap<u128, String> {
    if targets.iter().all(|(name, _)| name.is_some()) {
        return HashMap::new();
    }
    let catalog = shard.catalog();
    let topics = catalog.topics.values();
    topics.map(|t| (t.id, t.name.clone())).collect()
}

/// CreatePartitions: grows a topic to `count` partitions (never shrinks).
pub async fn create_partitions(
    shard: &Rc<Shard>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let budget = RequestBudget::new(shard);
    let mut results = Vec::new();
    let named_twice = repeated(req.topics.iter().map(|t| t.name.0.to_string()));
    for t in req.topics {
        let name = t.name.0.to_string();
        if named_twice.contains(&name) {
            let (code, msg) = duplicate("Duplicate topic in request.");
            results.push(
                CreatePartitionsTopicResult::default()
                    .with_name(topic_name(&name))
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(&msg))),
            );
            continue;
        }
        let assignments: Vec<Vec<i32>> = t
            .assignments
            .iter()
            .flatten()
            .map(|a| a.broker_ids.iter().map(|b| b.0).collect())
            .collect();
        let outcome = grow_topic(
            shard,
            &name,
            t.count,
            assignments,
            req.validate_only,
            &budget,
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
    assignments: Vec<Vec<i32>>,
    validate_only: bool,
    budget: &RequestBudget,
) -> Result<(), TopicError> {
    refuse_internal(name, "add partitions to")?;
    let Some(current) = shard.catalog().topics.get(name).cloned() else {
        return Err(meta_error(MetaError::UnknownTopic(name.to_string())));
    };
    // The count is the client's: checked before any arithmetic on it (i32::MIN minus
    // the current count would overflow).
    if count <= current.partitions || count > PARTITIONS_PER_TOPIC_MAX {
        let msg = format!(
            "topic {name} has {} partitions; cannot change to {count}",
            current.partitions
        );
        return Err((errors::INVALID_PARTITIONS, msg));
    }
    let added = count - current.partitions;
    assert!(added > 0, "a topic only grows");
    if !assignments.is_empty() && !in_cluster(shard) {
        single_node_assignment(shard, &assignments)?;
        if usize::try_from(added).ok() != Some(assignments.len()) {
            return Err((
                errors::INVALID_REPLICA_ASSIGNMENT,
                format!(
                    "{} replica lists for {added} new partitions",
                    assignments.len()
                ),
            ));
        }
    }
    // A single node's partitions carry no assignment (it leads them all).
    let assignments = if in_cluster(shard) {
        assignments
    } else {
        Vec::new()
    };
    budget.take(added)?;
    if validate_only {
        return Ok(());
    }
    let cmd = Command::CreatePartitions {
        name: name.to_string(),
        count,
        max_partitions: shard.config().partition_limits.max_partitions,
        assignments,
    };
    match shard.node.controller.submit(&shard.node, cmd).await {
        Outcome::Done(done) => done?,
        other => {
            let msg = format!("controller answered {other:?}");
            return Err((errors::UNKNOWN_SERVER_ERROR, msg));
        }
    }
    tracing::info!(topic = %name, partitions = count, "partitions added");
    shard.sync_all().await;
    Ok(())
}

/// The partition count of an internal topic (`__consumer_offsets`, `__transaction_state`),
/// created on first use through the controller like every metadata write (placed on
/// nodes in a cluster): kept forever (cleanup.policy=compact, no time or size retention;
/// the coordinator deletes with tombstones), a small tail cache and no preallocation (its
/// partitions see little traffic; 50 preallocated ones would reserve ~1 GiB). Any failure
/// is COORDINATOR_NOT_AVAILABLE, which clients retry.
///
/// In a cluster it is replicated on `replication` = (replication factor, `min.insync.replicas`)
/// nodes (Kafka's `offsets.topic.replication.factor`, `transaction.state.log.*`), both
/// capped at the live nodes (the controller places a broker-made topic on what the
/// cluster has; a minimum above that would refuse every coordinator write). A `None`
/// minimum is the broker's `min.insync.replicas` (Kafka's rule for `__consumer_offsets`),
/// capped the same way, so on a single node it is 1.
pub async fn internal_topic_partitions(
    shard: &Rc<Shard>,
    name: &str,
    partitions: i32,
    segment_bytes: i64,
    replication: (i16, Option<i32>),
) -> Result<i32, i16> {
    if let Some(t) = shard.catalog().topics.get(name) {
        return Ok(t.partitions);
    }
    let mut configs = BTreeMap::from([
        ("segment.bytes".to_string(), segment_bytes.to_string()),
        ("log.tail.cache.bytes".to_string(), "65536".to_string()),
        ("preallocate".to_string(), "false".to_string()),
    ]);
    let (replication_factor, min_isr) = replication;
    // The replicas the controller will place (a single node: one, no placement).
    let rf = if shard.node.controller.cluster().is_some() {
        let live = shard.catalog().nodes.values().filter(|n| !n.fenced).count();
        let live = i32::try_from(live).unwrap_or(i32::MAX).max(1);
        i32::from(replication_factor).clamp(1, live)
    } else {
        1
    };
    let min_isr = min_isr.unwrap_or(shard.config().min_insync_replicas);
    configs.insert(
        "min.insync.replicas".to_string(),
        min_isr.clamp(1, rf).to_string(),
    );
    // cleanup.policy=compact, retention.ms=-1, retention.bytes=-1 (kept by AlterConfigs).
    let pinned = metadata::INTERNAL_TOPIC_PINNED_CONFIGS.iter();
    configs.extend(pinned.map(|(k, v)| (k.to_string(), v.to_string())));
    let meta = TopicMeta {
        name: name.to_string(),
        id: metadata::new_topic_id(),
        partitions,
        configs,
        assignment: Vec::new(),
    };
    let topic = NewTopic {
        meta,
        internal: true,
        replication_factor,
        assignments: Vec::new(),
    };
    let cmd = Command::CreateTopics {
        topics: vec![topic],
        max_partitions: shard.config().partition_limits.max_partitions,
    };
    match shard.node.controller.submit(&shard.node, cmd).await {
        Outcome::Created(v) => match v.into_iter().next() {
            Some(Ok(_)) => tracing::info!(partitions, "created {name}"),
            Some(Err((errors::TOPIC_ALREADY_EXISTS, _))) => {}
            Some(Err((_, e))) => {
                tracing::error!("cannot create {name}: {e}");
                return Err(errors::COORDINATOR_NOT_AVAILABLE);
            }
            None => return Err(errors::COORDINATOR_NOT_AVAILABLE),
        },
        other => {
            tracing::error!("cannot create {name}: controller answered {other:?}");
            return Err(errors::COORDINATOR_NOT_AVAILABLE);
        }
    }
    shard.sync_all().await;
    let topics = shard.catalog();
    topics
        .topics
        .get(name)
        .map(|t| t.partitions)
        .ok_or(errors::COORDINATOR_NOT_AVAILABLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &str, value: &str) -> bool {
        validate_configs(&BTreeMap::from([(key.to_string(), value.to_string())])).is_ok()
    }

    #[test]
    fn stored_keys_get_kafkas_value_checks() {
        assert!(check("min.insync.replicas", "2"));
        assert!(
            !check("min.insync.replicas", "0"),
            "Kafka requires at least 1"
        );
        assert!(!check("min.insync.replicas", "-1"));
        assert!(check("compression.type", "zstd"));
        assert!(check("compression.type", "producer"));
        assert!(!check("compression.type", "brotli"));
        // KIP-390's levels, Kafka's ranges.
        for (key, good, bad) in [
            (
                "compression.gzip.level",
                ["-1", "1", "9"],
                ["0", "10", "-2"],
            ),
            ("compression.lz4.level", ["1", "9", "17"], ["0", "18", "-1"]),
            (
                "compression.zstd.level",
                ["-131072", "3", "22"],
                ["23", "-131073", "x"],
            ),
        ] {
            for v in good {
                assert!(check(key, v), "{key}={v}");
            }
            for v in bad {
                assert!(!check(key, v), "{key}={v}");
            }
        }
        assert!(check("unclean.leader.election.enable", "false"));
        assert!(!check("unclean.leader.election.enable", "maybe"));
        assert!(check("max.message.bytes", "1048588"));
        assert!(
            !check("max.message.bytes", "-1"),
            "Kafka requires at least 0"
        );
        assert!(!check("max.message.bytes", "1000000000000"), "an int");
        // Accepted and ignored, but a version, not any text (it rode in every metadata
        // command that carried the topic).
        assert!(check("message.format.version", "3.0-IV1"));
        assert!(check("message.format.version", "2.8"));
        assert!(!check("message.format.version", &"9".repeat(70_000)));
        assert!(!check("message.format.version", "3.0\u{0}\n"));
        assert!(!check("message.format.version", ""));
        assert!(!check(
            "retention.ms",
            &"1".repeat(TOPIC_CONFIG_VALUE_BYTES_MAX + 1)
        ));
    }

    /// Topics too many for one quorum command are cut into runs under the bound, in
    /// order; a request that fits is one run (one atomic write, as before).
    #[test]
    fn topics_are_cut_into_commands_under_the_bound() {
        let topic = |i: usize| NewTopic {
            meta: TopicMeta {
                name: format!("{i:x>249}"),
                id: 1,
                partitions: 1,
                configs: BTreeMap::new(),
                assignment: Vec::new(),
            },
            internal: false,
            replication_factor: 3,
            assignments: Vec::new(),
        };
        let few: Vec<NewTopic> = (0..10).map(topic).collect();
        assert_eq!(by_size(few, TOPICS_COMMAND_BYTES).len(), 1);
        let many: Vec<NewTopic> = (0..30_000).map(topic).collect();
        let runs = by_size(many, TOPICS_COMMAND_BYTES);
        assert!(runs.len() > 1);
        let names: Vec<String> = runs.iter().flatten().map(|t| t.meta.name.clone()).collect();
        let want: Vec<String> = (0..30_000).map(|i| format!("{i:x>249}")).collect();
        assert_eq!(names, want, "every topic once, in order");
        for run in &runs {
            let cmd = Command::CreateTopics {
                topics: run.clone(),
                max_partitions: u64::MAX,
            };
            let size = crate::controller::bridge::encoded_len(&cmd);
            assert!(
                size <= crate::controller::bridge::COMMAND_BYTES_MAX,
                "{size}"
            );
        }
    }
}
