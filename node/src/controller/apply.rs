//! The metadata changes as pure functions of the catalogue: one [`Command`] applied to a
//! [`Catalog`] gives the same catalogue and the same [`Outcome`] on every node, which is
//! what makes them fit a replicated log. Placement, leader election and fencing live here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::errors;
use crate::metadata::{
    Catalog, MetaError, NodeInfo, PARTITIONS_PER_TOPIC_MAX, PartitionAssignment, TopicMeta,
};

/// An error code and message for one topic (what the API layer answers with).
pub type TopicError = (i16, String);

/// One topic a CreateTopics (or a coordinator) asks for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NewTopic {
    pub meta: TopicMeta,
    /// Created by the broker itself (`__consumer_offsets`): no client name checks, no
    /// `max.partitions`, and an existing topic is not an error to report.
    pub internal: bool,
    /// Replicas per partition (already resolved from `default.replication.factor`).
    pub replication_factor: i16,
    /// Explicit replica lists, one per partition (empty: the controller places them).
    pub assignments: Vec<Vec<i32>>,
}

/// A metadata write. Every field the outcome depends on is in the command (ids, limits),
/// so that applying it is deterministic.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Command {
    CreateTopics {
        topics: Vec<NewTopic>,
        max_partitions: u64,
    },
    DeleteTopic {
        name: String,
        /// The topic the request meant (by id, or the id its name had where the request
        /// was handled): another topic of the same name — the deleted one created again
        /// meanwhile, when a forward is retried or an image is behind — is not deleted.
        /// `None` (an older binary's entry): by name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u128>,
    },
    CreatePartitions {
        name: String,
        count: i32,
        max_partitions: u64,
        /// Replica lists of the added partitions (empty: placed by the controller).
        assignments: Vec<Vec<i32>>,
    },
    AlterConfigs {
        name: String,
        /// The topic the change was checked against (a recreated topic is not changed).
        id: u128,
        configs: BTreeMap<String, String>,
        /// The overrides the change was computed from: applied only if they are still the
        /// topic's (else INVALID_UPDATE_VERSION, and the sender computes again), so two
        /// changes of different keys at once cannot undo each other. `None` (older
        /// entries): applied whatever the topic has.
        #[serde(default)]
        expected: Option<BTreeMap<String, String>>,
    },
    /// AlterConfigs / IncrementalAlterConfigs on the BROKER resource in a cluster: the
    /// whole set of `name` ("" the cluster default, else a node id), applied only if it
    /// still is `expected` (else INVALID_UPDATE_VERSION, as for topics).
    AlterBrokerConfigs {
        name: String,
        configs: BTreeMap<String, String>,
        expected: BTreeMap<String, String>,
    },
    /// A node heartbeat from a node the image does not know, or knows as fenced, at
    /// another address or under another broker epoch (it restarted). The epoch is what
    /// an ISR change naming the node is checked against (KIP-903). A restart alone does
    /// not take the node out of its ISRs: a follower fetches from the end of its
    /// completed writes, so every offset it acknowledged was written before it said so,
    /// and a process's death does not take back a completed write.
    RegisterNode {
        id: i32,
        host: String,
        port: u16,
        /// `wire::BrokerEpoch` of the registering process.
        #[serde(default = "no_broker_epoch")]
        epoch: i64,
        /// Every listener's advertised address (empty from an older node).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        endpoints: Vec<crate::metadata::Endpoint>,
        /// The `directory.id` of the node's data dir (`None` from an older node). Another
        /// one than the node registered with: its storage was replaced, and it leaves its
        /// ISRs and leaderships (see [`forget_storage`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        directory: Option<u128>,
        /// The node's `broker.rack` (`None` unset, or from an older node).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rack: Option<String>,
    },
    /// A node's lease expired: it leads nothing any more.
    FenceNode { id: i32 },
    /// The first controller names the cluster.
    InitCluster { id: String },
    /// A partition leader asks for a new ISR (Kafka's AlterPartition): applied only if the
    /// record is still the one the leader saw (same leader, leader epoch and partition
    /// epoch) and the ISR is made of the partition's replicas, the leader among them.
    AlterPartition {
        topic: String,
        id: u128,
        partition: i32,
        leader: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: Vec<i32>,
        /// (member, broker epoch) for each member the change adds, from the fetches that
        /// qualified it: refused (INELIGIBLE_REPLICA) if the node registered another since,
        /// because what those fetches vouched for may not have survived the restart.
        #[serde(default)]
        epochs: Vec<(i32, i64)>,
    },
    /// A partition leader may not append under its leader epoch any more (an
    /// out-of-space rollback cut offsets its followers had copied): applied only if the
    /// record still names it leader at `leader_epoch`. The first other live ISR member
    /// leads, and the resigning node leaves the ISR (its disk is full; it rejoins when
    /// caught up); with none, it leads again. Either way under a new leader epoch, which
    /// tells every follower where the old epoch ended.
    ResignLeader {
        topic: String,
        id: u128,
        partition: i32,
        leader: i32,
        leader_epoch: i32,
    },
    /// CreateAcls: bindings already checked by the handler (an existing one is not an
    /// error, as in Kafka).
    CreateAcls {
        bindings: Vec<crate::security::acl::AclBinding>,
    },
    /// DeleteAcls: every binding matching one of the filters goes.
    DeleteAcls {
        filters: Vec<crate::security::acl::AclFilter>,
    },
    /// AlterUserScramCredentials: salted credentials (never passwords), already checked
    /// by the handler, applied in order.
    AlterScramCredentials {
        changes: Vec<crate::metadata::scram::ScramChange>,
    },
    /// Preferred-leader election (Kafka's auto leader rebalance and ElectLeaders
    /// PREFERRED): each listed partition (topic, topic id, index) whose first replica is
    /// live, in the ISR and not leading gets it as leader.
    ElectPreferred { partitions: Vec<PartitionRef> },
    /// Unclean election (Kafka's ElectLeaders UNCLEAN): each listed partition that is
    /// offline (no leader, or a fenced one) gets its first live ISR member as leader, or,
    /// with none, its first live replica, whose log becomes the partition's: the ISR is
    /// then that replica alone, and records only the lost members held are gone.
    ElectUnclean { partitions: Vec<PartitionRef> },
    /// Kafka's AllocateProducerIds (KIP-730): reserves the next block of
    /// `PRODUCER_ID_BLOCK_SIZE` producer ids for a shard of `node` from the catalogue's
    /// counter, so ids are unique across the cluster and across wiped data dirs. Refused
    /// (STALE_BROKER_EPOCH, as Kafka's `checkBrokerEpoch`) unless `node` is registered,
    /// unfenced and under `broker_epoch`.
    AllocateProducerIds { node: i32, broker_epoch: i64 },
}

/// A partition named in a command: (topic, topic id, partition index).
pub type PartitionRef = (String, u128, i32);

fn no_broker_epoch() -> i64 {
    wire::BrokerEpoch::NONE.get()
}

/// Most ACL bindings the cluster holds: every change rewrites the metadata image, so its
/// size stays bounded whatever clients send.
pub const ACLS_MAX: usize = 10_000;

/// What a command did, in the shape its caller answers with.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Outcome {
    /// Per topic of a CreateTopics, in order: its id or its error.
    Created(Vec<Result<u128, TopicError>>),
    /// A deleted topic's id.
    Deleted(Result<u128, TopicError>),
    /// CreatePartitions, AlterConfigs.
    Done(Result<(), TopicError>),
    /// Node and cluster records.
    Noted,
    /// Per binding of a CreateAcls, in order.
    AclsCreated(Vec<Result<(), TopicError>>),
    /// Per filter of a DeleteAcls, in order: the bindings it deleted.
    AclsDeleted(Result<Vec<Vec<crate::security::acl::AclBinding>>, TopicError>),
    /// AlterScramCredentials, per change in order.
    ScramAltered(Result<Vec<crate::metadata::scram::ScramOutcome>, TopicError>),
    /// ElectPreferred, per listed partition in order: elected, or why not
    /// (ELECTION_NOT_NEEDED when the preferred replica already leads).
    Elected(Vec<Result<(), TopicError>>),
    /// AllocateProducerIds: the first id of the reserved block.
    ProducerIds(Result<i64, TopicError>),
}

impl Outcome {
    /// The outcome of `cmd` when the change could not be made at all (the catalogue could
    /// not be persisted, or the quorum did not answer).
    pub fn failed(cmd: &Command, err: TopicError) -> Outcome {
        match cmd {
            Command::CreateTopics { topics, .. } => {
                Outcome::Created(topics.iter().map(|_| Err(err.clone())).collect())
            }
            Command::DeleteTopic { .. } => Outcome::Deleted(Err(err)),
            Command::CreatePartitions { .. }
            | Command::AlterConfigs { .. }
            | Command::AlterBrokerConfigs { .. }
            | Command::AlterPartition { .. }
            | Command::ResignLeader { .. } => Outcome::Done(Err(err)),
            Command::CreateAcls { bindings } => {
                Outcome::AclsCreated(bindings.iter().map(|_| Err(err.clone())).collect())
            }
            Command::DeleteAcls { .. } => Outcome::AclsDeleted(Err(err)),
            Command::AlterScramCredentials { .. } => Outcome::ScramAltered(Err(err)),
            Command::ElectPreferred { partitions } | Command::ElectUnclean { partitions } => {
                Outcome::Elected(partitions.iter().map(|_| Err(err.clone())).collect())
            }
            Command::AllocateProducerIds { .. } => Outcome::ProducerIds(Err(err)),
            _ => Outcome::Noted,
        }
    }
}

/// Maps a catalogue refusal to Kafka's error code.
pub fn meta_error(e: MetaError) -> TopicError {
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

/// The error a write gets when the catalogue write itself failed.
pub fn write_failed(cmd: &Command, e: MetaError) -> Outcome {
    match cmd {
        // AlterConfigs always answered a failed catalogue write this way.
        Command::AlterConfigs { .. } => {
            Outcome::Done(Err((errors::UNKNOWN_TOPIC_OR_PARTITION, e.to_string())))
        }
        _ => Outcome::failed(cmd, meta_error(e)),
    }
}

/// Replaces the dynamic broker configs of `name` if they are still `expected`. If a key
/// topics inherit changed, every topic entry is replaced by an equal copy, so that each
/// node's shards check their open partitions against the new broker defaults.
fn alter_broker_configs(
    c: &mut Catalog,
    name: &str,
    configs: &BTreeMap<String, String>,
    expected: &BTreeMap<String, String>,
) -> (Outcome, bool) {
    let current = c.broker_configs.get(name).cloned().unwrap_or_default();
    if current != *expected {
        let msg = format!("the dynamic configs of broker {name:?} changed meanwhile");
        return (
            Outcome::Done(Err((errors::INVALID_UPDATE_VERSION, msg))),
            false,
        );
    }
    if current == *configs {
        return (Outcome::Done(Ok(())), false);
    }
    if configs.is_empty() {
        c.broker_configs.remove(name);
    } else {
        c.broker_configs.insert(name.to_string(), configs.clone());
    }
    // Only a change of a key topics inherit makes the shards look again (the key list is
    // a constant: the outcome stays a function of catalogue and command).
    let applied = crate::config::keys::DYNAMIC_APPLIED
        .iter()
        .any(|(k, _)| current.get(*k) != configs.get(*k));
    if applied {
        for t in c.topics.values_mut() {
            *t = Arc::new((**t).clone());
        }
    }
    (Outcome::Done(Ok(())), true)
}

/// POLICY_VIOLATION for a change that would take the node past `max.partitions`.
fn over_node_limit(existing: u64, added: u64, max: u64) -> TopicError {
    (
        errors::POLICY_VIOLATION,
        format!("node has {existing} partitions; adding {added} would exceed max.partitions={max}"),
    )
}

/// Applies `cmd` to `c`. `cluster` says whether partitions are placed on nodes (a
/// cluster) or all led by the one node (empty assignments). Returns the outcome and
/// whether the catalogue changed.
pub fn apply(c: &mut Catalog, cmd: &Command, cluster: bool) -> (Outcome, bool) {
    match cmd {
        Command::CreateTopics {
            topics,
            max_partitions,
        } => create_topics(c, topics, *max_partitions, cluster),
        Command::DeleteTopic { name, id } => {
            let meant = c
                .topics
                .get(name)
                .is_some_and(|t| id.is_none_or(|id| t.id == id));
            match meant.then(|| c.topics.remove(name)).flatten() {
                Some(t) => (Outcome::Deleted(Ok(t.id)), true),
                None => (
                    Outcome::Deleted(Err(meta_error(MetaError::UnknownTopic(name.clone())))),
                    false,
                ),
            }
        }
        Command::CreatePartitions {
            name,
            count,
            max_partitions,
            assignments,
        } => {
            let done = grow(c, name, *count, *max_partitions, assignments, cluster);
            let changed = done.is_ok();
            (Outcome::Done(done), changed)
        }
        Command::AlterConfigs {
            name,
            id,
            configs,
            expected,
        } => {
            let Some(t) = c.topics.get_mut(name).filter(|t| t.id == *id) else {
                let e = MetaError::UnknownTopic(name.clone());
                return (
                    Outcome::Done(Err((errors::UNKNOWN_TOPIC_OR_PARTITION, e.to_string()))),
                    false,
                );
            };
            if expected.as_ref().is_some_and(|e| *e != t.configs) {
                let msg = format!("the configs of {name} changed meanwhile");
                return (
                    Outcome::Done(Err((errors::INVALID_UPDATE_VERSION, msg))),
                    false,
                );
            }
            let mut changed = (**t).clone();
            changed.configs = configs.clone();
            *t = Arc::new(changed);
            // unclean.leader.election.enable=true takes effect at once, as in Kafka.
            elect_offline(c);
            (Outcome::Done(Ok(())), true)
        }
        Command::AlterBrokerConfigs {
            name,
            configs,
            expected,
        } => alter_broker_configs(c, name, configs, expected),
        Command::RegisterNode {
            id,
            host,
            port,
            epoch,
            endpoints,
            directory,
            rack,
        } => {
            let known = c.nodes.get(id).and_then(|n| n.directory_id);
            // None from an older binary keeps what the node registered before; None
            // known and Some sent is an upgrade, only recorded.
            let replaced = matches!((known, directory), (Some(k), Some(d)) if k != *d);
            let info = NodeInfo {
                host: host.clone(),
                port: *port,
                fenced: false,
                broker_epoch: *epoch,
                endpoints: endpoints.clone(),
                directory_id: directory.or(known),
                rack: rack.clone(),
            };
            if c.nodes.get(id) == Some(&info) {
                return (Outcome::Noted, false);
            }
            c.nodes.insert(*id, info);
            if replaced {
                tracing::warn!(
                    node = id,
                    "node registers another directory id: its storage was replaced; it leaves its ISRs and leaderships"
                );
                forget_storage(c, *id);
            }
            elect_offline(c);
            (Outcome::Noted, true)
        }
        Command::FenceNode { id } => match c.nodes.get_mut(id) {
            Some(n) if !n.fenced => {
                n.fenced = true;
                fence(c, *id);
                // A partition left offline may be led uncleanly where the topic allows.
                elect_offline(c);
                (Outcome::Noted, true)
            }
            _ => (Outcome::Noted, false),
        },
        Command::AlterPartition {
            topic,
            id,
            partition,
            leader,
            leader_epoch,
            partition_epoch,
            isr,
            epochs,
        } => {
            let done = alter_partition(
                c,
                topic,
                *id,
                *partition,
                (*leader, *leader_epoch, *partition_epoch),
                (isr, epochs),
            );
            let changed = done.is_ok();
            (Outcome::Done(done), changed)
        }
        Command::ResignLeader {
            topic,
            id,
            partition,
            leader,
            leader_epoch,
        } => {
            let done = resign_leader(c, topic, *id, *partition, (*leader, *leader_epoch));
            let changed = done.is_ok();
            (Outcome::Done(done), changed)
        }
        Command::ElectPreferred { partitions } => {
            let results: Vec<_> = partitions
                .iter()
                .map(|(topic, id, partition)| elect_preferred(c, topic, *id, *partition))
                .collect();
            let changed = results.iter().any(Result::is_ok);
            (Outcome::Elected(results), changed)
        }
        Command::ElectUnclean { partitions } => {
            let results: Vec<_> = partitions
                .iter()
                .map(|(topic, id, partition)| elect_unclean(c, topic, *id, *partition))
                .collect();
            let changed = results.iter().any(Result::is_ok);
            (Outcome::Elected(results), changed)
        }
        Command::InitCluster { id } => {
            if c.cluster_id.is_some() {
                return (Outcome::Noted, false);
            }
            c.cluster_id = Some(id.clone());
            (Outcome::Noted, true)
        }
        Command::CreateAcls { bindings } => create_acls(c, bindings),
        Command::DeleteAcls { filters } => delete_acls(c, filters),
        Command::AlterScramCredentials { changes } => {
            let (outcomes, changed) = crate::metadata::scram::alter(c, changes);
            (Outcome::ScramAltered(Ok(outcomes)), changed)
        }
        Command::AllocateProducerIds { node, broker_epoch } => {
            let block = allocate_producer_ids(c, *node, *broker_epoch);
            let changed = block.is_ok();
            (Outcome::ProducerIds(block), changed)
        }
    }
}

/// Reserves the next block of producer ids for `node` (see
/// [`Command::AllocateProducerIds`]); its first id.
fn allocate_producer_ids(c: &mut Catalog, node: i32, broker_epoch: i64) -> Result<i64, TopicError> {
    use crate::producer_state::allocator::{CONTROLLER_FIRST_PRODUCER_ID, PRODUCER_ID_BLOCK_SIZE};
    let stale = |why: String| Err((errors::STALE_BROKER_EPOCH, why));
    match c.nodes.get(&node) {
        None => return stale(format!("no registration found for node {node}")),
        Some(n) if n.fenced => return stale(format!("node {node} is fenced")),
        Some(n) if n.broker_epoch != broker_epoch => {
            let registered = n.broker_epoch;
            return stale(format!(
                "node {node} is registered under broker epoch {registered}, not {broker_epoch}"
            ));
        }
        Some(_) => {}
    }
    let start = c
        .next_producer_id
        .unwrap_or(CONTROLLER_FIRST_PRODUCER_ID)
        .max(CONTROLLER_FIRST_PRODUCER_ID);
    let Some(next) = start.checked_add(PRODUCER_ID_BLOCK_SIZE) else {
        let why = "the cluster's producer ids are exhausted".to_string();
        return Err((errors::UNKNOWN_SERVER_ERROR, why));
    };
    c.next_producer_id = Some(next);
    Ok(start)
}

fn create_acls(c: &mut Catalog, bindings: &[crate::security::acl::AclBinding]) -> (Outcome, bool) {
    let mut changed = false;
    let outcomes = bindings
        .iter()
        .map(|b| {
            // Checked by the handler too; a command from the log is bounded all the same.
            b.validate()
                .map_err(|why| (errors::INVALID_REQUEST, why.to_string()))?;
            if c.acls.contains(b) {
                return Ok(());
            }
            if c.acls.len() >= ACLS_MAX {
                let why = format!("the cluster holds {ACLS_MAX} ACLs, the most it keeps");
                return Err((errors::POLICY_VIOLATION, why));
            }
            changed |= c.acls.insert(b.clone());
            Ok(())
        })
        .collect();
    assert!(c.acls.len() <= ACLS_MAX, "ACLs stay within ACLS_MAX");
    (Outcome::AclsCreated(outcomes), changed)
}

fn delete_acls(c: &mut Catalog, filters: &[crate::security::acl::AclFilter]) -> (Outcome, bool) {
    let per_filter: Vec<Vec<_>> = filters
        .iter()
        .map(|f| c.acls.iter().filter(|b| f.matches(b)).cloned().collect())
        .collect();
    let before = c.acls.len();
    for gone in per_filter.iter().flatten() {
        c.acls.remove(gone);
    }
    let changed = c.acls.len() != before;
    (Outcome::AclsDeleted(Ok(per_filter)), changed)
}

fn create_topics(c: &mut Catalog, topics: &[NewTopic], max: u64, cluster: bool) -> (Outcome, bool) {
    let start = c.partition_count();
    let mut total = start;
    let mut changed = false;
    // Built once for the batch and kept up to date with what it adds: a scan of the
    // catalogue per topic would make one large CreateTopics quadratic.
    let mut index = c.collision_index();
    let outcomes: Vec<_> = topics
        .iter()
        .map(|t| {
            let name = &t.meta.name;
            // Checked by the handler too; a command from the log is bounded all the same.
            if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&t.meta.partitions) {
                return Err(meta_error(MetaError::InvalidPartitions(t.meta.partitions)));
            }
            if t.internal {
                if c.topics.contains_key(name) {
                    return Err(meta_error(MetaError::TopicExists(name.clone())));
                }
            } else {
                // Also catches a collision with a topic added earlier in this request.
                c.check_new_name_in(name, &index).map_err(meta_error)?;
                let added = u64::try_from(t.meta.partitions).unwrap_or(0);
                if total + added > max {
                    return Err(over_node_limit(total, added, max));
                }
                total += added;
            }
            let mut meta = t.meta.clone();
            if cluster {
                meta.assignment = place(c, t)?;
            }
            changed = true;
            let id = meta.id;
            index.add(name);
            c.topics.insert(name.clone(), Arc::new(meta));
            Ok(id)
        })
        .collect();
    assert!(
        total <= max.max(start),
        "client topics stay within max.partitions"
    );
    (Outcome::Created(outcomes), changed)
}

/// Live (not fenced) registered nodes, by id.
fn live_nodes(c: &Catalog) -> Vec<i32> {
    c.nodes
        .iter()
        .filter(|(_, n)| !n.fenced)
        .map(|(id, _)| *id)
        .collect()
}

/// Whether the controller could place `t` in `c` (replication factor within the live
/// nodes, an explicit assignment naming live nodes): CreateTopics' `validate_only`
/// answers from it, as Kafka's controller validates without writing.
pub fn check_placement(c: &Catalog, t: &NewTopic) -> Result<(), TopicError> {
    place(c, t).map(|_| ())
}

/// Replica lists for a new topic: as given, or spread round-robin over live nodes.
fn place(c: &Catalog, t: &NewTopic) -> Result<Vec<PartitionAssignment>, TopicError> {
    let live = live_nodes(c);
    if !t.assignments.is_empty() {
        return assigned(c, &t.assignments, &live);
    }
    // A broker-made topic takes what the cluster has (Kafka refuses below
    // offsets.topic.replication.factor; weir would rather have the coordinator).
    let rf = if t.internal {
        i64::from(t.replication_factor)
            .min(live.len() as i64)
            .max(1)
    } else {
        i64::from(t.replication_factor)
    };
    spread(c, t.meta.partitions, 0, rf, &live)
}

/// Partitions `first..first+count` placed round-robin: partition p's replicas start at
/// live node `(p + topics) % n`, so leaders spread over the nodes and over topics. When
/// every live node has a `broker.rack` (and there are two racks or more), the round goes
/// over the nodes in Kafka's rack-alternating order (see [`rack_alternated`]) and each
/// next replica is the next node whose rack the partition has no replica in yet, while
/// such a node is left: a partition's replicas span `min(rf, racks)` racks, so losing a
/// rack loses no partition with replicas in two.
fn spread(
    c: &Catalog,
    count: i32,
    first: i32,
    rf: i64,
    live: &[i32],
) -> Result<Vec<PartitionAssignment>, TopicError> {
    let n = live.len();
    if rf < 1 || rf as usize > n {
        return Err((
            errors::INVALID_REPLICATION_FACTOR,
            format!("replication factor {rf} is not within 1..={n}, the live brokers"),
        ));
    }
    let shift = c.topics.len();
    let racks = rack_alternated(c, live);
    let out = (first..first + count)
        .map(|p| {
            let base = usize::try_from(p).unwrap_or(0) + shift;
            let replicas: Vec<i32> = match &racks {
                None => (0..rf as usize).map(|i| live[(base + i) % n]).collect(),
                Some(order) => rack_aware_replicas(order, base, rf as usize),
            };
            debug_assert_eq!(
                replicas.iter().collect::<BTreeSet<_>>().len(),
                replicas.len(),
                "a node placed twice in one partition"
            );
            PartitionAssignment {
                leader: replicas[0],
                leader_epoch: 0,
                isr: replicas.clone(),
                replicas,
                partition_epoch: 0,
            }
        })
        .collect();
    Ok(out)
}

/// `live` with each node's rack, in Kafka's rack-alternating order: the first node (by
/// id) of each rack, racks in name order, then the second of each, and so on. `None`
/// unless every live node has a rack and there are two racks or more (Kafka refuses a
/// rack-aware placement over nodes of which only some have racks; weir places those
/// without racks, as when none has one).
fn rack_alternated<'a>(c: &'a Catalog, live: &[i32]) -> Option<Vec<(i32, &'a str)>> {
    let mut by_rack: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for id in live {
        let rack = c.nodes.get(id)?.rack.as_deref()?;
        by_rack.entry(rack).or_default().push(*id);
    }
    if by_rack.len() < 2 {
        return None;
    }
    let deepest = by_rack.values().map(Vec::len).max().unwrap_or(0);
    let order = (0..deepest)
        .flat_map(|i| {
            by_rack
                .iter()
                .filter_map(move |(rack, ids)| ids.get(i).map(|id| (*id, *rack)))
        })
        .collect();
    Some(order)
}

/// One partition's `rf` replicas from the rack-alternated `order`, starting at
/// `base % len`: each next replica is the next node in the order not yet chosen whose
/// rack has no replica yet, or, once every rack has one, the next node not yet chosen.
fn rack_aware_replicas(order: &[(i32, &str)], base: usize, rf: usize) -> Vec<i32> {
    let n = order.len();
    let racks = order.iter().map(|(_, r)| *r).collect::<BTreeSet<_>>().len();
    let mut chosen: Vec<i32> = Vec::with_capacity(rf);
    let mut used: BTreeSet<&str> = BTreeSet::new();
    let mut at = base % n.max(1);
    while chosen.len() < rf.min(n) {
        let pick = (0..n).map(|k| order[(at + k) % n]).position(|(id, rack)| {
            !chosen.contains(&id) && (used.len() >= racks || !used.contains(rack))
        });
        let Some(k) = pick else { break };
        let (id, rack) = order[(at + k) % n];
        chosen.push(id);
        used.insert(rack);
        at = (at + k + 1) % n;
    }
    chosen
}

/// Explicit replica lists (CreateTopics/CreatePartitions assignments), checked: known
/// nodes, no node twice, all of one length. The leader is the first live replica.
fn assigned(
    c: &Catalog,
    lists: &[Vec<i32>],
    live: &[i32],
) -> Result<Vec<PartitionAssignment>, TopicError> {
    let bad = |msg: String| Err((errors::INVALID_REPLICA_ASSIGNMENT, msg));
    let len = lists.first().map_or(0, Vec::len);
    let mut out = Vec::with_capacity(lists.len());
    for (p, replicas) in lists.iter().enumerate() {
        if replicas.is_empty() || replicas.len() != len {
            return bad(format!(
                "partition {p}: every partition needs the same, non-zero number of replicas"
            ));
        }
        let unique: BTreeSet<i32> = replicas.iter().copied().collect();
        if unique.len() != replicas.len() {
            return bad(format!("partition {p}: a node is named twice"));
        }
        if let Some(unknown) = replicas.iter().find(|r| !c.nodes.contains_key(r)) {
            return bad(format!("partition {p}: node {unknown} is not registered"));
        }
        let isr: Vec<i32> = replicas
            .iter()
            .copied()
            .filter(|r| live.contains(r))
            .collect();
        // With no live replica the partition would start with an empty ISR, which no
        // election can ever fill (Kafka refuses such an assignment the same way).
        if isr.is_empty() {
            return bad(format!("partition {p}: every node named is fenced"));
        }
        out.push(PartitionAssignment {
            leader: isr.first().copied().unwrap_or(-1),
            leader_epoch: 0,
            isr,
            replicas: replicas.clone(),
            partition_epoch: 0,
        });
    }
    Ok(out)
}

fn grow(
    c: &mut Catalog,
    name: &str,
    count: i32,
    max: u64,
    assignments: &[Vec<i32>],
    cluster: bool,
) -> Result<(), TopicError> {
    let total = c.partition_count();
    let Some(current) = c.topics.get(name).cloned() else {
        return Err(meta_error(MetaError::UnknownTopic(name.to_string())));
    };
    // Another request may have grown it since the handler's check.
    let Some(added) = u64::try_from(count - current.partitions)
        .ok()
        .filter(|a| *a > 0)
    else {
        let msg = format!("topic {name} already has {} partitions", current.partitions);
        return Err((errors::INVALID_PARTITIONS, msg));
    };
    if total + added > max {
        return Err(over_node_limit(total, added, max));
    }
    if count > PARTITIONS_PER_TOPIC_MAX {
        return Err(meta_error(MetaError::InvalidPartitions(count)));
    }
    let mut grown = (*current).clone();
    if cluster {
        let live = live_nodes(c);
        let new = if assignments.is_empty() {
            let rf = current.assignment.first().map_or(1, |a| a.replicas.len()) as i64;
            spread(c, count - current.partitions, current.partitions, rf, &live)?
        } else {
            if assignments.len() as u64 != added {
                return Err((
                    errors::INVALID_REPLICA_ASSIGNMENT,
                    format!(
                        "{} assignments for {added} new partitions",
                        assignments.len()
                    ),
                ));
            }
            // Kafka: every new partition has the topic's replication factor.
            let rf = current.assignment.first().map(|a| a.replicas.len());
            if let Some(rf) = rf
                && let Some((i, bad)) = assignments.iter().enumerate().find(|(_, l)| l.len() != rf)
            {
                return Err((
                    errors::INVALID_REPLICA_ASSIGNMENT,
                    format!(
                        "new partition {}: {} replicas, but topic {name} has a replication factor of {rf}",
                        current.partitions + i as i32,
                        bad.len()
                    ),
                ));
            }
            assigned(c, assignments, &live)?
        };
        grown.assignment.extend(new);
    }
    grown.partitions = count;
    c.topics.insert(name.to_string(), Arc::new(grown));
    Ok(())
}

/// A fenced node leaves the ISR of every partition (unless it is the last member: the
/// ISR then keeps naming the replica that has every acknowledged record, and with
/// `unclean.leader.election.enable=false` the partition waits for it), and every
/// partition it led gets the first live ISR member as leader, or none (-1, offline).
fn fence(c: &mut Catalog, dead: i32) {
    let live: BTreeSet<i32> = live_nodes(c).into_iter().collect();
    for t in c.topics.values_mut() {
        if !t.assignment.iter().any(|a| a.replicas.contains(&dead)) {
            continue;
        }
        let mut changed = (**t).clone();
        for a in &mut changed.assignment {
            if !a.replicas.contains(&dead) {
                continue;
            }
            if step_out(a, dead, &live) {
                a.partition_epoch += 1;
            }
        }
        *t = Arc::new(changed);
    }
}

/// `node` leaves `a`'s ISR unless it is its last member, and a partition it led gets the
/// first live ISR member as leader, or none (-1), under a new leader epoch. Whether `a`
/// changed (the caller bumps the partition epoch).
fn step_out(a: &mut PartitionAssignment, node: i32, live: &BTreeSet<i32>) -> bool {
    let before = a.clone();
    if a.isr.len() > 1 {
        a.isr.retain(|r| *r != node);
    }
    if a.leader == node {
        a.leader = a
            .isr
            .iter()
            .copied()
            .find(|r| live.contains(r))
            .unwrap_or(-1);
        a.leader_epoch += 1;
    }
    *a != before
}

/// A node back with another data dir (its `directory.id` changed) holds none of the
/// records its ISR memberships vouched for: it leaves every ISR it is in, and every
/// partition it led gets another live ISR member as leader (or none, offline), leader
/// and partition epochs bumped: what [`fence`] does, but the node stays registered and
/// live, and rejoins each ISR by catching up like any follower. Leading on with an empty
/// log under its old epoch, it would make its followers cut every acknowledged record.
/// Where it is the last ISR member it stays (Kafka before KIP-966: the ISR is never
/// emptied), and the loss is logged.
fn forget_storage(c: &mut Catalog, node: i32) {
    let live: BTreeSet<i32> = live_nodes(c).into_iter().collect();
    for t in c.topics.values_mut() {
        if !t.assignment.iter().any(|a| a.isr.contains(&node)) {
            continue;
        }
        let mut changed = (**t).clone();
        for (p, a) in changed.assignment.iter_mut().enumerate() {
            if !a.isr.contains(&node) {
                continue;
            }
            if a.isr.len() == 1 {
                tracing::error!(
                    node,
                    topic = %t.name,
                    partition = p,
                    "the last ISR member's storage was replaced: acknowledged records of this partition may be lost"
                );
                continue;
            }
            let stepped = step_out(a, node, &live);
            debug_assert!(stepped, "a member of a larger ISR leaves it");
            a.partition_epoch += 1;
        }
        *t = Arc::new(changed);
    }
}

/// Kafka's AlterPartition checks, then the new ISR with the partition epoch bumped.
/// `seen` is (leader, leader epoch, partition epoch) of the record the leader acted on.
fn alter_partition(
    c: &mut Catalog,
    topic: &str,
    id: u128,
    partition: i32,
    seen: (i32, i32, i32),
    (isr, epochs): (&[i32], &[(i32, i64)]),
) -> Result<(), TopicError> {
    let stale = |why: &str| (errors::INVALID_UPDATE_VERSION, why.to_string());
    let Some(t) = c.topics.get_mut(topic).filter(|t| t.id == id) else {
        return Err((
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("no topic {topic}"),
        ));
    };
    let Some(a) = usize::try_from(partition)
        .ok()
        .and_then(|i| t.assignment.get(i))
    else {
        return Err((
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("no partition {partition}"),
        ));
    };
    if (a.leader, a.leader_epoch, a.partition_epoch) != seen {
        return Err(stale("the partition changed since the leader saw it"));
    }
    let (leader, _, _) = seen;
    if !isr.contains(&leader) || isr.iter().any(|r| !a.replicas.contains(r)) {
        return Err((
            errors::INVALID_REQUEST,
            "ISR must be replicas, leader among them".into(),
        ));
    }
    // KIP-903: a joiner qualified by fetches from a process it has since replaced may
    // have lost what they vouched for.
    let restarted = epochs.iter().find_map(|(n, e)| {
        let node = c.nodes.get(n)?;
        (!node.registered_as(wire::BrokerEpoch(*e))).then_some((*n, *e, node.broker_epoch))
    });
    if let Some((n, e, registered)) = restarted {
        return Err((
            errors::INELIGIBLE_REPLICA,
            format!(
                "node {n} restarted (broker epoch {registered}) since the fetches at broker epoch {e} that qualified it"
            ),
        ));
    }
    let fenced: BTreeSet<i32> = c
        .nodes
        .iter()
        .filter(|(_, n)| n.fenced)
        .map(|(id, _)| *id)
        .collect();
    let index = usize::try_from(partition).unwrap_or(usize::MAX);
    let mut changed = (**t).clone();
    let a = &mut changed.assignment[index];
    // A fenced node does not rejoin the ISR (its lease expired).
    a.isr = isr
        .iter()
        .copied()
        .filter(|r| !fenced.contains(r) || *r == leader)
        .collect();
    a.partition_epoch += 1;
    *t = Arc::new(changed);
    Ok(())
}

/// The topic record holding partition `partition` of topic `topic` (with id `id`), and
/// the partition's index in its assignment: UNKNOWN_TOPIC_OR_PARTITION if there is none.
fn partition_of<'a>(
    c: &'a mut Catalog,
    topic: &str,
    id: u128,
    partition: i32,
) -> Result<(&'a mut Arc<TopicMeta>, usize), TopicError> {
    let unknown = || {
        (
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("no partition {topic}-{partition}"),
        )
    };
    let t = c
        .topics
        .get_mut(topic)
        .filter(|t| t.id == id)
        .ok_or_else(unknown)?;
    let index = usize::try_from(partition).map_err(|_| unknown())?;
    if index >= t.assignment.len() {
        return Err(unknown());
    }
    Ok((t, index))
}

/// A leader gives up its leader epoch (see [`Command::ResignLeader`]). `seen` is
/// (leader, leader epoch) of the record the leader acted on.
fn resign_leader(
    c: &mut Catalog,
    topic: &str,
    id: u128,
    partition: i32,
    seen: (i32, i32),
) -> Result<(), TopicError> {
    let live: BTreeSet<i32> = live_nodes(c).into_iter().collect();
    let (t, index) = partition_of(c, topic, id, partition)?;
    let a = &t.assignment[index];
    if (a.leader, a.leader_epoch) != seen {
        return Err((
            errors::INVALID_UPDATE_VERSION,
            "the partition changed since the leader saw it".into(),
        ));
    }
    let (resigning, _) = seen;
    let mut changed = (**t).clone();
    let a = &mut changed.assignment[index];
    // Another ISR member holds every acknowledged record, so it may lead; the resigning
    // node leaves the ISR only then (an ISR is never emptied).
    if let Some(next) = a
        .isr
        .iter()
        .copied()
        .find(|r| *r != resigning && live.contains(r))
    {
        a.leader = next;
        a.isr.retain(|r| *r != resigning);
    }
    a.leader_epoch += 1;
    a.partition_epoch += 1;
    *t = Arc::new(changed);
    Ok(())
}

/// Makes the first replica of `topic`-`partition` its leader if it is live, in the ISR
/// and not leading (leader and partition epochs bumped, as any leader change).
fn elect_preferred(
    c: &mut Catalog,
    topic: &str,
    id: u128,
    partition: i32,
) -> Result<(), TopicError> {
    let live: BTreeSet<i32> = live_nodes(c).into_iter().collect();
    let (t, index) = partition_of(c, topic, id, partition)?;
    let a = &t.assignment[index];
    let Some(&preferred) = a.replicas.first() else {
        return Err((
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("no replicas for {topic}-{partition}"),
        ));
    };
    if a.leader == preferred {
        return Err((
            errors::ELECTION_NOT_NEEDED,
            format!("node {preferred} already leads {topic}-{partition}"),
        ));
    }
    if !live.contains(&preferred) || !a.isr.contains(&preferred) {
        return Err((
            errors::PREFERRED_LEADER_NOT_AVAILABLE,
            format!("node {preferred} is not live and in the ISR of {topic}-{partition}"),
        ));
    }
    let mut changed = (**t).clone();
    let a = &mut changed.assignment[index];
    a.leader = preferred;
    a.leader_epoch += 1;
    a.partition_epoch += 1;
    *t = Arc::new(changed);
    Ok(())
}

/// Gives offline `topic`-`partition` (no leader, or a fenced one) a leader: its first
/// live ISR member (a clean election), else its first live replica with the ISR that
/// replica alone (unclean: what only the lost members held is gone). Leader and
/// partition epochs bumped. ELECTION_NOT_NEEDED for a partition with a live leader,
/// ELIGIBLE_LEADERS_NOT_AVAILABLE with no live replica.
fn elect_unclean(c: &mut Catalog, topic: &str, id: u128, partition: i32) -> Result<(), TopicError> {
    let live: BTreeSet<i32> = live_nodes(c).into_iter().collect();
    let (t, index) = partition_of(c, topic, id, partition)?;
    let a = &t.assignment[index];
    if live.contains(&a.leader) {
        return Err((
            errors::ELECTION_NOT_NEEDED,
            format!("node {} leads {topic}-{partition}", a.leader),
        ));
    }
    let clean = a.isr.iter().copied().find(|r| live.contains(r));
    let Some(leader) = clean.or_else(|| a.replicas.iter().copied().find(|r| live.contains(r)))
    else {
        return Err((
            errors::ELIGIBLE_LEADERS_NOT_AVAILABLE,
            format!("no replica of {topic}-{partition} is live"),
        ));
    };
    let mut changed = (**t).clone();
    let a = &mut changed.assignment[index];
    if clean.is_none() {
        tracing::warn!(
            topic,
            partition,
            leader,
            "unclean leader election: records only the lost ISR members held are gone"
        );
        a.isr = vec![leader];
    }
    a.leader = leader;
    a.leader_epoch += 1;
    a.partition_epoch += 1;
    *t = Arc::new(changed);
    Ok(())
}

/// The partitions Kafka's auto leader rebalance would move now: for each live node, the
/// partitions whose preferred (first) replica it is, in their ISR, but led by another
/// node — if those are more than `percentage` % of the node's preferred partitions.
pub fn imbalanced(c: &Catalog, percentage: u32) -> Vec<PartitionRef> {
    let live: BTreeSet<i32> = live_nodes(c).into_iter().collect();
    let mut by_node: BTreeMap<i32, (usize, Vec<PartitionRef>)> = BTreeMap::new();
    for t in c.topics.values() {
        for (i, a) in t.assignment.iter().enumerate() {
            let Some(&preferred) = a.replicas.first() else {
                continue;
            };
            let entry = by_node.entry(preferred).or_default();
            entry.0 += 1;
            if a.leader != preferred && a.isr.contains(&preferred) && live.contains(&preferred) {
                entry.1.push((t.name.clone(), t.id, i as i32));
            }
        }
    }
    by_node
        .into_values()
        .filter(|(total, moved)| moved.len() * 100 > *total * percentage as usize)
        .flat_map(|(_, moved)| moved)
        .collect()
}

/// ElectPreferred commands for `partitions`, in order, each within the command bound
/// (a null ElectLeaders list or an auto rebalance of a large cluster names more than one
/// command may hold).
pub fn elect_preferred_commands(partitions: Vec<PartitionRef>) -> Vec<Command> {
    super::bridge::by_size(partitions, super::bridge::SPLIT_COMMAND_BYTES)
        .into_iter()
        .map(|partitions| Command::ElectPreferred { partitions })
        .collect()
}

/// ElectUnclean commands for `partitions`, in order, each within the command bound.
pub fn elect_unclean_commands(partitions: Vec<PartitionRef>) -> Vec<Command> {
    super::bridge::by_size(partitions, super::bridge::SPLIT_COMMAND_BYTES)
        .into_iter()
        .map(|partitions| Command::ElectUnclean { partitions })
        .collect()
}

/// The topic config key that lets the controller elect a replica outside the ISR.
const UNCLEAN_KEY: &str = "unclean.leader.election.enable";

/// Partitions without a leader get one when a node of their ISR is live again; with the
/// topic's `unclean.leader.election.enable=true`, also when only a replica outside the
/// ISR is live: it leads with the ISR itself alone, and what only the lost members held
/// is gone (Kafka's unclean election). Only the topic's config counts here: the
/// broker-level default a topic without a value inherits is the active controller's (its
/// static value is not in the image, and every node must apply a command alike), applied
/// by that controller through [`unclean_by_default`] and ElectUnclean commands.
fn elect_offline(c: &mut Catalog) {
    let live: BTreeSet<i32> = live_nodes(c).into_iter().collect();
    for t in c.topics.values_mut() {
        let unclean = t
            .configs
            .get(UNCLEAN_KEY)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        // (new leader, whether it is an ISR member)
        let pick = |a: &PartitionAssignment| -> Option<(i32, bool)> {
            if a.leader != -1 {
                return None;
            }
            if let Some(r) = a.isr.iter().copied().find(|r| live.contains(r)) {
                return Some((r, true));
            }
            let outside = a.replicas.iter().copied().find(|r| live.contains(r));
            outside.filter(|_| unclean).map(|r| (r, false))
        };
        if !t.assignment.iter().any(|a| pick(a).is_some()) {
            continue;
        }
        let mut changed = (**t).clone();
        for (p, a) in changed.assignment.iter_mut().enumerate() {
            let Some((leader, clean)) = pick(a) else {
                continue;
            };
            if !clean {
                tracing::warn!(
                    topic = %t.name,
                    partition = p,
                    leader,
                    "unclean leader election (unclean.leader.election.enable): records only the lost ISR members held are gone"
                );
                a.isr = vec![leader];
            }
            a.leader = leader;
            a.leader_epoch += 1;
            a.partition_epoch += 1;
        }
        *t = Arc::new(changed);
    }
}

/// The broker-level `unclean.leader.election.enable` the active controller `controller`
/// applies to topics without a value of their own, as Kafka's controller resolves it:
/// its node's dynamic value, else the cluster-wide dynamic default (broker resource ""),
/// else `static_value` (its `server.properties`); false when none says.
pub fn unclean_default(c: &Catalog, controller: i32, static_value: Option<&str>) -> bool {
    let dynamic = |name: &str| c.broker_configs.get(name)?.get(UNCLEAN_KEY).cloned();
    dynamic(&controller.to_string())
        .or_else(|| dynamic(""))
        .or_else(|| static_value.map(str::to_string))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// The offline partitions the broker-level default lets the controller elect uncleanly
/// now (Kafka applies the broker value where the topic has none): no leader, no live ISR
/// member, a live replica, and a topic without its own `unclean.leader.election.enable`.
/// Empty when `default_enabled` is false.
pub fn unclean_by_default(c: &Catalog, default_enabled: bool) -> Vec<PartitionRef> {
    if !default_enabled {
        return Vec::new();
    }
    let live: BTreeSet<i32> = live_nodes(c).into_iter().collect();
    let mut out = Vec::new();
    for t in c
        .topics
        .values()
        .filter(|t| !t.configs.contains_key(UNCLEAN_KEY))
    {
        for (i, a) in t.assignment.iter().enumerate() {
            let offline = a.leader == -1 || !live.contains(&a.leader);
            let isr_gone = !a.isr.iter().any(|r| live.contains(r));
            if offline && isr_gone && a.replicas.iter().any(|r| live.contains(r)) {
                out.push((t.name.clone(), t.id, i as i32));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(c: &mut Catalog, id: i32) {
        node_in(c, id, None);
    }

    fn node_in(c: &mut Catalog, id: i32, rack: Option<&str>) {
        let cmd = Command::RegisterNode {
            id,
            host: "127.0.0.1".into(),
            port: 9000 + id as u16,
            epoch: 1,
            endpoints: Vec::new(),
            directory: Some(100 + id as u128),
            rack: rack.map(str::to_string),
        };
        apply(c, &cmd, true);
    }

    /// `broker.rack` on every node: each partition's replicas span as many racks as its
    /// replication factor allows (two racks of 3 and 1 nodes: every RF 2 and RF 3
    /// partition has a replica in each), leaders still go round every node, and a
    /// placement over nodes of which only some have racks ignores racks.
    #[test]
    fn replicas_are_spread_over_racks_when_every_node_has_one() {
        let rack_of = |c: &Catalog, id: &i32| c.nodes[id].rack.clone().expect("a rack");
        let mut c = Catalog::default();
        for (id, rack) in [(1, "a"), (2, "a"), (3, "a"), (4, "b")] {
            node_in(&mut c, id, Some(rack));
        }
        for (name, rf) in [("two", 2), ("three", 3)] {
            let mut cmd = topic(name, 8, rf);
            if let Command::CreateTopics { topics, .. } = &mut cmd {
                topics[0].meta.id = u128::from(rf as u16);
            }
            apply(&mut c, &cmd, true);
            let placed = &c.topics[name].assignment;
            assert_eq!(placed.len(), 8);
            for a in placed {
                let racks: BTreeSet<String> = a.replicas.iter().map(|r| rack_of(&c, r)).collect();
                assert_eq!(racks.len(), 2, "{name}: {:?} in one rack", a.replicas);
                let nodes: BTreeSet<i32> = a.replicas.iter().copied().collect();
                assert_eq!(nodes.len(), rf as usize, "{name}: {:?}", a.replicas);
            }
            let leaders: BTreeSet<i32> = placed.iter().map(|a| a.leader).collect();
            assert_eq!(leaders.len(), 4, "{name}: leaders {leaders:?}");
        }
        // Node 5 without a rack: no rack-aware placement (it would have to guess).
        node_in(&mut c, 5, None);
        assert!(rack_alternated(&c, &live_nodes(&c)).is_none());
        let order = rack_alternated(&c, &[1, 2, 3, 4]).expect("all have racks");
        assert_eq!(order, vec![(1, "a"), (4, "b"), (2, "a"), (3, "a")]);
    }

    fn topic(name: &str, partitions: i32, rf: i16) -> Command {
        Command::CreateTopics {
            topics: vec![NewTopic {
                meta: TopicMeta {
                    name: name.into(),
                    id: 7,
                    partitions,
                    configs: BTreeMap::new(),
                    assignment: Vec::new(),
                },
                internal: false,
                replication_factor: rf,
                assignments: Vec::new(),
            }],
            max_partitions: 1000,
        }
    }

    /// Node 2's registration under broker epoch `epoch` from a data dir of id `directory`.
    fn register_2(epoch: i64, directory: Option<u128>) -> Command {
        Command::RegisterNode {
            id: 2,
            host: "127.0.0.1".into(),
            port: 9002,
            epoch,
            endpoints: Vec::new(),
            directory,
            rack: None,
        }
    }

    /// A node registering a new broker epoch (it restarted) from the same data dir is
    /// noted with it, and keeps its ISRs and leaderships (what it acknowledged was on its
    /// disk); the same epoch again changes nothing, nor does a registration without a
    /// directory id (an older binary), which keeps the known one.
    #[test]
    fn a_node_back_with_a_new_broker_epoch_is_noted_with_it() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        apply(&mut c, &topic("t", 3, 3), true);
        let before = c.topics["t"].assignment.clone();
        let same = Some(102);
        assert_eq!(
            apply(&mut c, &register_2(1, same), true),
            (Outcome::Noted, false)
        );
        assert_eq!(
            apply(&mut c, &register_2(2, same), true),
            (Outcome::Noted, true)
        );
        assert_eq!(c.nodes[&2].broker_epoch, 2);
        assert_eq!(c.topics["t"].assignment, before);
        assert_eq!(
            apply(&mut c, &register_2(3, None), true),
            (Outcome::Noted, true)
        );
        assert_eq!(c.nodes[&2].directory_id, same);
        assert_eq!(c.topics["t"].assignment, before);
    }

    /// A node back with another data dir (a new directory id: wiped, a new disk) leaves
    /// every ISR it is in unless it is the last member, and each partition it led gets
    /// another ISR member as leader under newer leader and partition epochs; it stays
    /// registered and live. Leading on with an empty log under its old epoch, it would
    /// make its followers cut every acknowledged record. A first directory id (an upgrade)
    /// is only recorded.
    #[test]
    fn a_node_back_with_another_directory_id_leaves_its_isrs_and_leaderships() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        apply(&mut c, &topic("t", 3, 3), true);
        apply(&mut c, &topic("alone", 1, 1), true);
        // Upgrade: a node registered without one sends its first.
        c.nodes.get_mut(&2).expect("node 2").directory_id = None;
        let before = c.topics["t"].assignment.clone();
        assert_eq!(
            apply(&mut c, &register_2(2, Some(102)), true),
            (Outcome::Noted, true)
        );
        assert_eq!(c.nodes[&2].directory_id, Some(102));
        assert_eq!(c.topics["t"].assignment, before);
        let alone = c.topics["alone"].assignment[0].clone();
        assert!(before.iter().any(|a| a.leader == 2), "{before:?}");

        assert_eq!(
            apply(&mut c, &register_2(3, Some(999)), true),
            (Outcome::Noted, true)
        );
        assert_eq!(c.nodes[&2].directory_id, Some(999));
        assert!(!c.nodes[&2].fenced);
        for (a, was) in c.topics["t"].assignment.iter().zip(&before) {
            assert!(!a.isr.contains(&2), "{a:?}");
            assert_eq!(a.replicas, was.replicas);
            assert_eq!(a.partition_epoch, was.partition_epoch + 1);
            if was.leader == 2 {
                assert!(a.leader > 0 && a.leader != 2, "{a:?}");
                assert_eq!(a.leader_epoch, was.leader_epoch + 1);
            } else {
                assert_eq!((a.leader, a.leader_epoch), (was.leader, was.leader_epoch));
            }
        }
        // The last ISR member stays (the ISR is never emptied).
        assert_eq!(alone.isr, [2]);
        assert_eq!(c.topics["alone"].assignment[0], alone);
        // The same directory again: nothing more moves.
        let after = c.topics["t"].assignment.clone();
        assert_eq!(
            apply(&mut c, &register_2(4, Some(999)), true),
            (Outcome::Noted, true)
        );
        assert_eq!(c.topics["t"].assignment, after);
    }

    /// A delete names the topic it meant by id: a retried forward, or one handled where
    /// the image was behind, does not delete a topic created again under the same name.
    #[test]
    fn a_delete_of_a_topic_id_leaves_its_successor_of_the_same_name() {
        let mut c = Catalog::default();
        node(&mut c, 1);
        apply(&mut c, &topic("t", 1, 1), true);
        let delete = |id| Command::DeleteTopic {
            name: "t".into(),
            id,
        };
        assert_eq!(
            apply(&mut c, &delete(Some(7)), true),
            (Outcome::Deleted(Ok(7)), true)
        );
        let Command::CreateTopics {
            mut topics,
            max_partitions,
        } = topic("t", 1, 1)
        else {
            unreachable!("topic() builds CreateTopics");
        };
        topics[0].meta.id = 8;
        apply(
            &mut c,
            &Command::CreateTopics {
                topics,
                max_partitions,
            },
            true,
        );
        let (out, changed) = apply(&mut c, &delete(Some(7)), true);
        assert!(!changed, "{out:?}");
        assert_eq!(c.topics["t"].id, 8, "the successor stays");
        assert_eq!(
            apply(&mut c, &delete(None), true),
            (Outcome::Deleted(Ok(8)), true)
        );
    }

    /// An explicit assignment naming only fenced nodes would start with an empty ISR that
    /// no election fills: refused (INVALID_REPLICA_ASSIGNMENT), as Kafka does; one live
    /// node in it is enough.
    #[test]
    fn an_explicit_assignment_onto_fenced_nodes_only_is_refused() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        for id in [2, 3] {
            apply(&mut c, &Command::FenceNode { id }, true);
        }
        let with = |assignments: Vec<Vec<i32>>| {
            let Command::CreateTopics {
                mut topics,
                max_partitions,
            } = topic("t", 1, 2)
            else {
                unreachable!("topic() builds CreateTopics");
            };
            topics[0].assignments = assignments;
            topics[0].replication_factor = -1;
            Command::CreateTopics {
                topics,
                max_partitions,
            }
        };
        let (out, changed) = apply(&mut c, &with(vec![vec![2, 3]]), true);
        assert!(!changed);
        assert!(
            matches!(&out, Outcome::Created(r) if matches!(r[0], Err((code, _)) if code == errors::INVALID_REPLICA_ASSIGNMENT)),
            "{out:?}"
        );
        let (out, changed) = apply(&mut c, &with(vec![vec![2, 1]]), true);
        assert!(changed, "{out:?}");
        let a = &c.topics["t"].assignment[0];
        assert_eq!((a.leader, a.isr.clone()), (1, vec![1]));
    }

    /// KIP-903: an ISR change naming a member's broker epoch is refused once that node
    /// registered another (its fetch vouched for a run that is gone).
    #[test]
    fn an_isr_change_naming_a_stale_broker_epoch_is_refused() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        apply(&mut c, &topic("t", 1, 3), true);
        let a = c.topics["t"].assignment[0].clone();
        let follower = *a
            .replicas
            .iter()
            .find(|r| **r != a.leader)
            .expect("a follower");
        let (leader, leader_epoch) = (a.leader, a.leader_epoch);
        // AlterPartition against the partition epoch in force.
        let alter = |c: &mut Catalog, isr: Vec<i32>, epochs: Vec<(i32, i64)>| {
            let cmd = Command::AlterPartition {
                topic: "t".into(),
                id: 7,
                partition: 0,
                leader,
                leader_epoch,
                partition_epoch: c.topics["t"].assignment[0].partition_epoch,
                isr,
                epochs,
            };
            apply(c, &cmd, true)
        };
        let shrink = |c: &mut Catalog| alter(c, vec![leader], Vec::new());
        let grow =
            |c: &mut Catalog, epoch: i64| alter(c, vec![leader, follower], vec![(follower, epoch)]);
        assert_eq!(shrink(&mut c).0, Outcome::Done(Ok(())));
        let (out, changed) = grow(&mut c, 0);
        assert!(!changed);
        assert!(
            matches!(out, Outcome::Done(Err((code, _))) if code == errors::INELIGIBLE_REPLICA),
            "{out:?}"
        );
        assert_eq!(grow(&mut c, 1).0, Outcome::Done(Ok(())));
        assert!(c.topics["t"].assignment[0].isr.contains(&follower));
        // A node registered by an older binary, without an epoch, is not checked.
        assert_eq!(shrink(&mut c).0, Outcome::Done(Ok(())));
        let register = Command::RegisterNode {
            id: follower,
            host: "127.0.0.1".into(),
            port: 9000 + u16::try_from(follower).expect("a small id"),
            epoch: -1,
            endpoints: Vec::new(),
            directory: None,
            rack: None,
        };
        apply(&mut c, &register, true);
        assert_eq!(c.nodes[&follower].broker_epoch, -1);
        assert_eq!(grow(&mut c, 5).0, Outcome::Done(Ok(())));
    }

    #[test]
    fn replicas_and_leaders_spread_and_fencing_elects_from_the_isr() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        let (out, changed) = apply(&mut c, &topic("t", 6, 3), true);
        assert!(changed);
        assert_eq!(out, Outcome::Created(vec![Ok(7)]));
        let t = c.topics["t"].clone();
        let leaders: BTreeSet<i32> = t.assignment.iter().map(|a| a.leader).collect();
        assert_eq!(leaders.len(), 3, "leaders on every node");
        for a in &t.assignment {
            assert_eq!(a.replicas.iter().collect::<BTreeSet<_>>().len(), 3);
        }
        let (out, _) = apply(&mut c, &topic("u", 1, 4), true);
        assert!(
            matches!(out, Outcome::Created(ref v) if v[0].as_ref().err().map(|e| e.0) == Some(errors::INVALID_REPLICATION_FACTOR))
        );

        apply(&mut c, &Command::FenceNode { id: 1 }, true);
        for a in &c.topics["t"].assignment {
            assert_ne!(a.leader, 1);
            assert!(!a.isr.contains(&1));
        }
        let moved = t.assignment.iter().filter(|a| a.leader == 1).count();
        let bumped = c.topics["t"]
            .assignment
            .iter()
            .filter(|a| a.leader_epoch == 1)
            .count();
        assert_eq!(moved, bumped);
        // The last ISR member is kept; its partition goes offline, and returns with it.
        apply(&mut c, &Command::FenceNode { id: 2 }, true);
        apply(&mut c, &Command::FenceNode { id: 3 }, true);
        assert!(c.topics["t"].assignment.iter().all(|a| a.leader == -1));
        assert!(c.topics["t"].assignment.iter().all(|a| a.isr == vec![3]));
        node(&mut c, 3);
        assert!(c.topics["t"].assignment.iter().all(|a| a.leader == 3));
    }

    #[test]
    fn a_resigning_leader_hands_over_to_the_isr_or_leads_again_under_a_new_epoch() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        apply(&mut c, &topic("t", 1, 3), true);
        let a = c.topics["t"].assignment[0].clone();
        let resign = |leader: i32, leader_epoch: i32| Command::ResignLeader {
            topic: "t".into(),
            id: 7,
            partition: 0,
            leader,
            leader_epoch,
        };
        // A stale request (another epoch) changes nothing.
        let (out, changed) = apply(&mut c, &resign(a.leader, a.leader_epoch + 1), true);
        assert!(!changed);
        assert!(
            matches!(out, Outcome::Done(Err((code, _))) if code == errors::INVALID_UPDATE_VERSION)
        );
        let (out, changed) = apply(&mut c, &resign(a.leader, a.leader_epoch), true);
        assert!(changed);
        assert_eq!(out, Outcome::Done(Ok(())));
        let b = c.topics["t"].assignment[0].clone();
        assert_ne!(b.leader, a.leader, "another ISR member leads");
        assert!(a.isr.contains(&b.leader));
        assert!(
            !b.isr.contains(&a.leader),
            "the resigning node left the ISR"
        );
        assert_eq!(b.leader_epoch, a.leader_epoch + 1);
        assert_eq!(b.partition_epoch, a.partition_epoch + 1);
        // The last live ISR member resigning leads again, under a new epoch.
        let others: Vec<i32> = b.isr.iter().copied().filter(|r| *r != b.leader).collect();
        for r in others {
            apply(&mut c, &Command::FenceNode { id: r }, true);
        }
        let b = c.topics["t"].assignment[0].clone();
        assert_eq!(b.isr, vec![b.leader]);
        apply(&mut c, &resign(b.leader, b.leader_epoch), true);
        let d = c.topics["t"].assignment[0].clone();
        assert_eq!((d.leader, d.isr.clone()), (b.leader, b.isr.clone()));
        assert_eq!(d.leader_epoch, b.leader_epoch + 1);
    }

    #[test]
    fn preferred_leaders_return_only_when_live_and_in_the_isr() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        apply(&mut c, &topic("t", 3, 3), true);
        let preferred = |c: &Catalog| {
            c.topics["t"]
                .assignment
                .iter()
                .all(|a| a.replicas.first() == Some(&a.leader))
        };
        assert!(preferred(&c), "placement starts balanced");
        assert!(imbalanced(&c, 10).is_empty());
        apply(&mut c, &Command::FenceNode { id: 1 }, true);
        // Node 1 is fenced (not live) and out of the ISRs: nothing to give back yet.
        assert!(imbalanced(&c, 10).is_empty());
        node(&mut c, 1);
        assert!(imbalanced(&c, 10).is_empty(), "not in the ISR yet");
        // Back in the ISR of its partition (the leader's AlterPartition).
        let (i, a) = c.topics["t"]
            .assignment
            .iter()
            .enumerate()
            .find(|(_, a)| a.replicas[0] == 1)
            .map(|(i, a)| (i, a.clone()))
            .expect("a partition preferring node 1");
        let mut isr = a.isr.clone();
        isr.push(1);
        let alter = Command::AlterPartition {
            topic: "t".into(),
            id: 7,
            partition: i as i32,
            leader: a.leader,
            leader_epoch: a.leader_epoch,
            partition_epoch: a.partition_epoch,
            isr,
            epochs: vec![(1, 1)],
        };
        assert_eq!(apply(&mut c, &alter, true).0, Outcome::Done(Ok(())));
        let moves = imbalanced(&c, 10);
        assert_eq!(moves, vec![("t".to_string(), 7, i as i32)]);
        // Above the threshold (1 of 1 = 100 %) nothing moves.
        assert!(imbalanced(&c, 100).is_empty());
        let before = c.topics["t"].assignment[i].clone();
        let (out, changed) = apply(&mut c, &Command::ElectPreferred { partitions: moves }, true);
        assert!(changed);
        assert_eq!(out, Outcome::Elected(vec![Ok(())]));
        let after = &c.topics["t"].assignment[i];
        assert_eq!(after.leader, 1);
        assert_eq!(after.leader_epoch, before.leader_epoch + 1);
        assert_eq!(after.partition_epoch, before.partition_epoch + 1);
        assert!(preferred(&c));
        // Again: not needed.
        let again = Command::ElectPreferred {
            partitions: vec![("t".into(), 7, i as i32)],
        };
        let (out, changed) = apply(&mut c, &again, true);
        assert!(!changed);
        assert!(
            matches!(&out, Outcome::Elected(r) if r[0].as_ref().is_err_and(|e| e.0 == errors::ELECTION_NOT_NEEDED))
        );
    }

    #[test]
    fn single_node_topics_carry_no_assignment() {
        let mut c = Catalog::default();
        let (out, _) = apply(&mut c, &topic("t", 2, 1), false);
        assert_eq!(out, Outcome::Created(vec![Ok(7)]));
        assert!(c.topics["t"].assignment.is_empty());
    }

    #[test]
    fn acl_commands_add_once_delete_by_filter_and_stay_bounded() {
        use crate::security::acl::*;
        let b = |name: &str| AclBinding {
            resource_type: ResourceType::Topic,
            name: name.into(),
            pattern: PatternType::Literal,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: Operation::Read,
            permission: Permission::Allow,
        };
        let mut c = Catalog::default();
        let create = Command::CreateAcls {
            bindings: vec![b("a"), b("a"), b("b")],
        };
        let (out, changed) = apply(&mut c, &create, true);
        assert!(changed);
        assert_eq!(out, Outcome::AclsCreated(vec![Ok(()), Ok(()), Ok(())]));
        assert_eq!(c.acls.len(), 2, "an existing binding is not added twice");
        let (_, changed) = apply(&mut c, &create, true);
        assert!(!changed);
        let filter = AclFilter {
            resource_type: None,
            name: Some("a".into()),
            pattern: PatternFilter::Any,
            principal: None,
            host: None,
            operation: None,
            permission: None,
        };
        let (out, changed) = apply(
            &mut c,
            &Command::DeleteAcls {
                filters: vec![filter],
            },
            true,
        );
        assert!(changed);
        assert_eq!(out, Outcome::AclsDeleted(Ok(vec![vec![b("a")]])));
        assert_eq!(c.acls.iter().collect::<Vec<_>>(), vec![&b("b")]);
        for i in 0..ACLS_MAX {
            c.acls.insert(b(&format!("t{i}")));
        }
        c.acls.remove(&b("b"));
        let (out, _) = apply(
            &mut c,
            &Command::CreateAcls {
                bindings: vec![b("b")],
            },
            true,
        );
        assert!(
            matches!(out, Outcome::AclsCreated(ref v) if v[0].as_ref().err().map(|e| e.0) == Some(errors::POLICY_VIOLATION))
        );
        assert_eq!(c.acls.len(), ACLS_MAX);
    }

    /// One CreateTopics batch of 20,000 names holding `_` is applied in linear time (the
    /// collision check once scanned every topic per name), and collisions are still
    /// refused: with a topic already there and within the batch.
    #[test]
    fn a_large_batch_of_collidable_names_is_checked_in_linear_time() {
        const TOPICS: usize = 20_000;
        let new = |name: String| NewTopic {
            meta: TopicMeta {
                name,
                id: 7,
                partitions: 1,
                configs: BTreeMap::new(),
                assignment: Vec::new(),
            },
            internal: false,
            replication_factor: 1,
            assignments: Vec::new(),
        };
        let batch = |names: Vec<String>| Command::CreateTopics {
            topics: names.into_iter().map(new).collect(),
            max_partitions: 1_000_000,
        };
        let mut c = Catalog::default();
        let names = (0..TOPICS).map(|i| format!("t_{i}")).collect();
        let started = std::time::Instant::now();
        let (out, changed) = apply(&mut c, &batch(names), false);
        let took = started.elapsed();
        assert!(changed);
        assert!(matches!(&out, Outcome::Created(v) if v.iter().all(Result::is_ok)));
        assert_eq!(c.topics.len(), TOPICS);
        assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
        let names = ["t.5", "a.b", "a_b", "plain", "plain"]
            .map(String::from)
            .to_vec();
        let (out, _) = apply(&mut c, &batch(names), false);
        let Outcome::Created(v) = out else {
            panic!("{out:?}")
        };
        let codes: Vec<i16> = v
            .iter()
            .map(|r| r.as_ref().map_or_else(|e| e.0, |_| 0))
            .collect();
        assert_eq!(
            codes,
            vec![
                errors::INVALID_TOPIC_EXCEPTION,
                0,
                errors::INVALID_TOPIC_EXCEPTION,
                0,
                errors::TOPIC_ALREADY_EXISTS
            ]
        );
    }

    /// CreatePartitions with explicit replica lists of another length than the topic's
    /// replication factor is refused (INVALID_REPLICA_ASSIGNMENT, as Kafka), lists of
    /// that length are placed as given.
    #[test]
    fn added_partitions_keep_the_topics_replication_factor() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        apply(&mut c, &topic("t", 1, 2), true);
        let grow = |lists: Vec<Vec<i32>>| Command::CreatePartitions {
            name: "t".into(),
            count: 1 + lists.len() as i32,
            max_partitions: 1000,
            assignments: lists,
        };
        for lists in [
            vec![vec![1, 2, 3]],
            vec![vec![3]],
            vec![vec![1, 2], vec![2]],
        ] {
            let (out, changed) = apply(&mut c, &grow(lists.clone()), true);
            assert!(!changed, "{lists:?}");
            assert!(
                matches!(&out, Outcome::Done(Err((code, _))) if *code == errors::INVALID_REPLICA_ASSIGNMENT),
                "{lists:?}: {out:?}"
            );
        }
        assert_eq!(c.topics["t"].partitions, 1);
        let (out, changed) = apply(&mut c, &grow(vec![vec![3, 1]]), true);
        assert_eq!((out, changed), (Outcome::Done(Ok(())), true));
        assert_eq!(c.topics["t"].assignment[1].replicas, [3, 1]);
    }

    /// Preferred-leader elections of more partitions than one command may hold are
    /// split into commands within the bound, keeping every partition in order.
    #[test]
    fn preferred_elections_of_many_partitions_are_split_within_the_command_bound() {
        let many: Vec<PartitionRef> = (0..300_000)
            .map(|p| (format!("topic-with-a-long-name-{}", p % 97), 7, p))
            .collect();
        let cmds = elect_preferred_commands(many.clone());
        assert!(cmds.len() > 1);
        let mut again = Vec::new();
        for cmd in cmds {
            let size = super::super::bridge::encoded_len(&cmd);
            assert!(size <= super::super::bridge::COMMAND_BYTES_MAX, "{size}");
            let Command::ElectPreferred { partitions } = cmd else {
                panic!("{cmd:?}")
            };
            again.extend(partitions);
        }
        assert_eq!(again, many);
        let few = vec![("t".to_string(), 7, 0)];
        assert_eq!(
            elect_preferred_commands(few.clone()),
            [Command::ElectPreferred { partitions: few }]
        );
    }

    /// An unclean election gives an offline partition its first live ISR member if any
    /// (ISR kept), else its first live replica with the ISR that replica alone; a
    /// partition with a live leader needs none, one with no live replica gets none.
    #[test]
    fn an_unclean_election_leads_an_offline_partition_from_a_live_replica() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        apply(&mut c, &topic("t", 1, 3), true);
        let elect = Command::ElectUnclean {
            partitions: vec![("t".into(), 7, 0)],
        };
        let code = |out: &Outcome| match out {
            Outcome::Elected(r) => r[0].as_ref().err().map_or(0, |e| e.0),
            other => panic!("{other:?}"),
        };
        let (out, changed) = apply(&mut c, &elect, true);
        assert_eq!((code(&out), changed), (errors::ELECTION_NOT_NEEDED, false));
        // The ISR shrinks to its leader, which is fenced: offline, ISR kept.
        let a = c.topics["t"].assignment[0].clone();
        let last = a.leader;
        let mut t = (*c.topics["t"]).clone();
        t.assignment[0].isr = vec![last];
        c.topics.insert("t".into(), Arc::new(t));
        apply(&mut c, &Command::FenceNode { id: last }, true);
        let offline = c.topics["t"].assignment[0].clone();
        assert_eq!((offline.leader, offline.isr.clone()), (-1, vec![last]));
        let (out, changed) = apply(&mut c, &elect, true);
        assert_eq!((code(&out), changed), (0, true));
        let now = &c.topics["t"].assignment[0];
        let first_live = *a.replicas.iter().find(|r| **r != last).expect("a live one");
        assert_eq!(
            (now.leader, now.isr.clone()),
            (first_live, vec![first_live])
        );
        assert_eq!(now.leader_epoch, offline.leader_epoch + 1);
        assert_eq!(now.partition_epoch, offline.partition_epoch + 1);
        // No live replica at all: nothing to elect.
        for id in 1..=3 {
            apply(&mut c, &Command::FenceNode { id }, true);
        }
        let (out, _) = apply(&mut c, &elect, true);
        assert_eq!(code(&out), errors::ELIGIBLE_LEADERS_NOT_AVAILABLE);
    }

    /// With `unclean.leader.election.enable=true` a partition whose last ISR member is
    /// fenced is led at once by a live replica outside the ISR (ISR = it alone); with the
    /// default (false) it stays offline, and setting the topic's config to true elects.
    #[test]
    fn unclean_leader_election_enable_elects_a_live_replica_outside_the_isr() {
        for (at_creation, name) in [(true, "on"), (false, "off")] {
            let mut c = Catalog::default();
            for id in 1..=3 {
                node(&mut c, id);
            }
            let Command::CreateTopics {
                mut topics,
                max_partitions,
            } = topic(name, 1, 2)
            else {
                panic!("a CreateTopics")
            };
            if at_creation {
                topics[0]
                    .meta
                    .configs
                    .insert(UNCLEAN_KEY.into(), "true".into());
            }
            let create = Command::CreateTopics {
                topics,
                max_partitions,
            };
            apply(&mut c, &create, true);
            let a = c.topics[name].assignment[0].clone();
            let (last, other) = (a.replicas[0], a.replicas[1]);
            let mut t = (*c.topics[name]).clone();
            t.assignment[0].isr = vec![last];
            c.topics.insert(name.into(), Arc::new(t));
            apply(&mut c, &Command::FenceNode { id: last }, true);
            let now = c.topics[name].assignment[0].clone();
            if at_creation {
                assert_eq!((now.leader, now.isr), (other, vec![other]), "{name}");
                continue;
            }
            assert_eq!((now.leader, now.isr.clone()), (-1, vec![last]), "{name}");
            let mut configs = BTreeMap::new();
            configs.insert(UNCLEAN_KEY.to_string(), "true".to_string());
            let alter = Command::AlterConfigs {
                name: name.into(),
                id: 7,
                configs,
                expected: None,
            };
            assert_eq!(apply(&mut c, &alter, true), (Outcome::Done(Ok(())), true));
            let elected = &c.topics[name].assignment[0];
            assert_eq!((elected.leader, elected.isr.clone()), (other, vec![other]));
            assert_eq!(elected.leader_epoch, now.leader_epoch + 1);
        }
    }

    /// The broker-level `unclean.leader.election.enable` (Kafka: the topic value
    /// overrides it) was accepted and unused: a partition whose last ISR member is
    /// fenced, on a topic without its own value, now gets a live replica when the active
    /// controller's default says true — its node's dynamic value, else the cluster-wide
    /// dynamic default, else its static one — and a topic's false still keeps it
    /// offline (found by review).
    #[test]
    fn the_broker_level_unclean_default_applies_where_the_topic_has_no_value() {
        let mut c = Catalog::default();
        for id in 1..=3 {
            node(&mut c, id);
        }
        // Replicas [1, 2] and [1, 3], ISR {1} alone; "strict" says false itself.
        for (name, id, other) in [("plain", 7, 2), ("strict", 8, 3)] {
            let Command::CreateTopics {
                mut topics,
                max_partitions,
            } = topic(name, 1, 2)
            else {
                panic!("a CreateTopics")
            };
            topics[0].meta.id = id;
            topics[0].assignments = vec![vec![1, other]];
            if name == "strict" {
                topics[0]
                    .meta
                    .configs
                    .insert(UNCLEAN_KEY.into(), "false".into());
            }
            let create = Command::CreateTopics {
                topics,
                max_partitions,
            };
            apply(&mut c, &create, true);
            let mut t = (*c.topics[name]).clone();
            t.assignment[0].isr = vec![1];
            c.topics.insert(name.into(), Arc::new(t));
        }
        apply(&mut c, &Command::FenceNode { id: 1 }, true);
        for name in ["plain", "strict"] {
            assert_eq!(c.topics[name].assignment[0].leader, -1, "{name} offline");
        }

        assert!(!unclean_default(&c, 1, None), "false when nothing says");
        assert!(unclean_by_default(&c, false).is_empty());
        assert!(unclean_default(&c, 1, Some("true")), "the static value");
        // Booleans in any case, as Kafka reads them.
        assert!(
            unclean_default(&c, 1, Some(" TRUE")),
            "the static value, upper case"
        );
        // The cluster-wide dynamic default overrides the static value; the controller
        // node's own dynamic value overrides both.
        let set = |c: &mut Catalog, name: &str, v: &str| {
            let expected = c.broker_configs.get(name).cloned().unwrap_or_default();
            let configs = BTreeMap::from([(UNCLEAN_KEY.to_string(), v.to_string())]);
            let cmd = Command::AlterBrokerConfigs {
                name: name.into(),
                configs,
                expected,
            };
            assert_eq!(apply(c, &cmd, true).0, Outcome::Done(Ok(())));
        };
        set(&mut c, "", "false");
        assert!(!unclean_default(&c, 2, Some("true")));
        set(&mut c, "2", "true");
        assert!(unclean_default(&c, 2, Some("false")));
        assert!(!unclean_default(&c, 3, Some("true")), "another controller");

        // Only the topic without a value of its own is elected.
        let wanted = unclean_by_default(&c, true);
        assert_eq!(wanted, vec![("plain".to_string(), 7, 0)]);
        for cmd in elect_unclean_commands(wanted) {
            apply(&mut c, &cmd, true);
        }
        let a = &c.topics["plain"].assignment[0];
        assert_eq!((a.leader, a.isr.clone()), (2, vec![2]));
        assert_eq!(
            c.topics["strict"].assignment[0].leader, -1,
            "its topic says no"
        );
        assert!(
            unclean_by_default(&c, true).is_empty(),
            "nothing left to elect"
        );
    }

    fn allocate_ids(c: &mut Catalog, node: i32, epoch: i64) -> Result<i64, TopicError> {
        match apply(
            c,
            &Command::AllocateProducerIds {
                node,
                broker_epoch: epoch,
            },
            true,
        ) {
            (Outcome::ProducerIds(block), changed) => {
                assert_eq!(
                    changed,
                    block.is_ok(),
                    "only a granted block changes the image"
                );
                block
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }

    /// Kafka's AllocateProducerIds: blocks from the replicated counter are disjoint and
    /// rising whoever asks, above every id a per-shard range could hold, kept across a
    /// snapshot (the catalogue as JSON) and an older catalogue without the counter; a
    /// node that is not registered, fenced, or asks under another broker epoch is
    /// refused with STALE_BROKER_EPOCH and moves nothing.
    #[test]
    fn producer_id_blocks_are_disjoint_rising_and_survive_a_snapshot() {
        use crate::producer_state::allocator::{
            CONTROLLER_FIRST_PRODUCER_ID, IdRange, PRODUCER_ID_BLOCK_SIZE,
        };
        let mut c = Catalog::default();
        for id in [1, 2, 3] {
            node(&mut c, id);
        }
        let highest_range = IdRange::for_shard(0x7FFF, 1023).expect("range");
        assert!(highest_range.end <= CONTROLLER_FIRST_PRODUCER_ID);
        let mut starts = Vec::new();
        for i in 0..9 {
            starts.push(allocate_ids(&mut c, 1 + i % 3, 1).expect("a block"));
        }
        // Through a snapshot: the catalogue as the state machine stores it.
        let json = serde_json::to_vec(&c).expect("encode");
        let mut restored: Catalog = serde_json::from_slice(&json).expect("decode");
        starts.push(allocate_ids(&mut restored, 2, 1).expect("a block"));
        assert_eq!(starts[0], CONTROLLER_FIRST_PRODUCER_ID);
        for pair in starts.windows(2) {
            assert_eq!(pair[1], pair[0] + PRODUCER_ID_BLOCK_SIZE, "{starts:?}");
        }

        for (node, epoch, why) in [(9, 1, "no registration"), (2, 7, "broker epoch")] {
            let before = restored.next_producer_id;
            let (code, msg) = allocate_ids(&mut restored, node, epoch).expect_err("refused");
            assert_eq!(code, errors::STALE_BROKER_EPOCH);
            assert!(msg.contains(why), "{msg}");
            assert_eq!(restored.next_producer_id, before);
        }
        apply(&mut restored, &Command::FenceNode { id: 3 }, true);
        let refused = allocate_ids(&mut restored, 3, 1).expect_err("fenced");
        assert_eq!(refused.0, errors::STALE_BROKER_EPOCH);

        // A catalogue written before the counter (no field) starts above the old ranges;
        // and a single node's catalogue never carries it.
        let mut old = Catalog::default();
        node(&mut old, 1);
        let mut value = serde_json::to_value(&old).expect("encode");
        assert!(value.get("next_producer_id").is_none());
        value
            .as_object_mut()
            .expect("object")
            .remove("next_producer_id");
        let mut old: Catalog = serde_json::from_value(value).expect("decode");
        assert_eq!(
            allocate_ids(&mut old, 1, 1),
            Ok(CONTROLLER_FIRST_PRODUCER_ID)
        );
    }
}
