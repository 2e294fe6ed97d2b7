//! Cluster metadata: brokers, partition leaders, topic creation, offsets, producer ids.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, InitProducerIdRequest, ListOffsetsRequest, MetadataRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use wire::api;
use wire::{ProducerEpoch, ProducerId};

use super::conn::Conn;
use super::error_name;

/// How long to wait for a new topic's partitions to get leaders.
const TOPIC_READY_TIMEOUT: Duration = Duration::from_secs(30);
const TOPIC_READY_POLL: Duration = Duration::from_millis(100);
/// ListOffsets timestamp meaning "the log end (high watermark)".
pub const LATEST: i64 = -1;
/// ListOffsets timestamp meaning "the log start".
pub const EARLIEST: i64 = -2;
/// Errors that mean "ask the cluster again who leads this partition":
/// NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE,
/// FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH.
pub const LEADERSHIP_ERRORS: [i16; 5] = [6, 3, 5, 74, 75];
/// The first refresh after a healthy spell waits this long at most (none at all if the
/// last refresh was longer ago); each further one in a row doubles it, up to the max.
const REFRESH_BACKOFF: Duration = Duration::from_millis(100);
const REFRESH_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Doublings of the refresh backoff at most (far beyond the max already).
const REFRESH_DOUBLINGS_MAX: u32 = 10;

/// One topic's layout: partition → leader broker id, and broker id → address.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    pub brokers: BTreeMap<i32, String>,
    /// Leader broker id of each partition, indexed by partition number.
    pub leaders: Vec<i32>,
}

impl Cluster {
    /// The address of partition `p`'s leader.
    pub fn leader_addr(&self, p: usize) -> Result<&str> {
        let id = self
            .leaders
            .get(p)
            .ok_or_else(|| anyhow!("no partition {p}"))?;
        self.brokers
            .get(id)
            .map(String::as_str)
            .ok_or_else(|| anyhow!("partition {p}: leader {id} is not in the broker list"))
    }

    /// Number of partitions.
    pub fn partitions(&self) -> usize {
        self.leaders.len()
    }
}

/// Whether a partition error code means its leader moved (or is being elected).
pub fn is_leadership_error(code: i16) -> bool {
    LEADERSHIP_ERRORS.contains(&code)
}

/// Asks every broker `cluster` knows, in turn, for `topic`'s layout again. Only a full
/// answer (every partition led, the same partition count) replaces the old one.
pub fn refresh(cluster: &Cluster, topic: &str) -> Result<Cluster> {
    let mut last = anyhow!("no brokers to ask");
    for addr in cluster.brokers.values() {
        let fresh = Conn::connect(addr).and_then(|mut c| fetch(&mut c, topic, false));
        match fresh {
            Ok(Some(c)) if c.partitions() == cluster.partitions() => return Ok(c),
            Ok(Some(c)) => {
                last = anyhow!(
                    "{addr}: topic {topic} has {} partitions, was {}",
                    c.partitions(),
                    cluster.partitions()
                );
            }
            Ok(None) => {
                last = anyhow!("{addr}: topic {topic} unknown or a partition has no leader")
            }
            Err(e) => last = e.context(format!("metadata from {addr}")),
        }
    }
    Err(last)
}

/// When a reader (consumer, lag sampler, verify) may ask for metadata again: wanted after
/// a leadership error or a lost connection; refreshes in a row back off exponentially
/// ([`REFRESH_BACKOFF`] doubling up to [`REFRESH_BACKOFF_MAX`]) until a clean answer
/// says the layout works again, so a partition without a leader is not asked about (nor
/// fetched from) in a tight loop.
#[derive(Debug)]
pub struct Refresher {
    wanted: bool,
    /// Refreshes since the last clean answer.
    in_a_row: u32,
    next_at: Instant,
}

impl Default for Refresher {
    fn default() -> Self {
        Self {
            wanted: false,
            in_a_row: 0,
            next_at: Instant::now(),
        }
    }
}

impl Refresher {
    /// A leadership error or a lost connection: refresh before relying on the layout.
    pub fn want(&mut self) {
        self.wanted = true;
    }

    pub fn wanted(&self) -> bool {
        self.wanted
    }

    /// How long until the wanted refresh may go (zero: now).
    pub fn wait(&self) -> Duration {
        self.next_at.saturating_duration_since(Instant::now())
    }

    /// An answer without leadership errors: the next refresh needs no backoff.
    pub fn healthy(&mut self) {
        self.in_a_row = 0;
    }

    /// Refreshes `cluster` if wanted and due. `Ok(true)`: it was replaced.
    pub fn refresh_if_due(&mut self, cluster: &mut Cluster, topic: &str) -> Result<bool> {
        if !self.wanted || !self.wait().is_zero() {
            return Ok(false);
        }
        let doublings = self.in_a_row.min(REFRESH_DOUBLINGS_MAX);
        let backoff = REFRESH_BACKOFF.saturating_mul(1 << doublings);
        self.in_a_row = self.in_a_row.saturating_add(1);
        self.next_at = Instant::now() + backoff.min(REFRESH_BACKOFF_MAX);
        let fresh = refresh(cluster, topic)?;
        *cluster = fresh;
        self.wanted = false;
        Ok(true)
    }
}

fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// Reads the topic's metadata once. `Ok(None)` when the topic does not exist (yet) or a
/// partition has no leader.
pub fn fetch(conn: &mut Conn, topic: &str, auto_create: bool) -> Result<Option<Cluster>> {
    let v = conn.versions.pick(api::METADATA, 1, 12)?;
    let mut t = MetadataRequestTopic::default();
    t.name = Some(topic_name(topic));
    let mut req = MetadataRequest::default();
    req.topics = Some(vec![t]);
    req.allow_auto_topic_creation = auto_create;
    let resp = conn.call(&req, v)?;
    let mut cluster = Cluster::default();
    for b in &resp.brokers {
        cluster
            .brokers
            .insert(b.node_id.0, format!("{}:{}", b.host.as_str(), b.port));
    }
    let Some(t) = resp
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
    else {
        return Ok(None);
    };
    if t.error_code != 0 || t.partitions.is_empty() {
        return Ok(None);
    }
    let mut leaders = vec![-1; t.partitions.len()];
    for p in &t.partitions {
        let idx = usize::try_from(p.partition_index).map_err(|_| anyhow!("negative partition"))?;
        let slot = leaders
            .get_mut(idx)
            .ok_or_else(|| anyhow!("partition {idx} out of range"))?;
        *slot = if p.error_code == 0 { p.leader_id.0 } else { -1 };
    }
    if leaders.iter().any(|&l| l < 0) {
        return Ok(None);
    }
    cluster.leaders = leaders;
    Ok(Some(cluster))
}

/// Makes sure `topic` exists (creating it with `partitions` partitions if the broker
/// supports CreateTopics, else relying on auto-creation) and returns its layout.
pub fn ensure_topic(conn: &mut Conn, topic: &str, partitions: i32) -> Result<Cluster> {
    if let Some(c) = fetch(conn, topic, false)? {
        return Ok(c);
    }
    if conn.versions.has(api::CREATE_TOPICS) {
        create(conn, topic, partitions)?;
    }
    let deadline = Instant::now() + TOPIC_READY_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(c) = fetch(conn, topic, true)? {
            return Ok(c);
        }
        std::thread::sleep(TOPIC_READY_POLL);
    }
    bail!("topic {topic} has no leaders after {TOPIC_READY_TIMEOUT:?}")
}

fn create(conn: &mut Conn, topic: &str, partitions: i32) -> Result<()> {
    let v = conn.versions.pick(api::CREATE_TOPICS, 2, 5)?;
    let mut t = CreatableTopic::default();
    t.name = topic_name(topic);
    t.num_partitions = partitions;
    t.replication_factor = -1;
    let mut req = CreateTopicsRequest::default();
    req.topics = vec![t];
    req.timeout_ms = 30_000;
    let resp = conn.call(&req, v)?;
    for t in resp.topics {
        // 36 = TOPIC_ALREADY_EXISTS: fine, someone else made it.
        if t.error_code != 0 && t.error_code != 36 {
            bail!("creating topic {topic}: {}", error_name(t.error_code));
        }
    }
    Ok(())
}

/// The offsets at `timestamp` (LATEST or EARLIEST) of the given partitions, all led by the
/// broker behind `conn`. Partitions that failed are left out.
pub fn list_offsets(
    conn: &mut Conn,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
) -> Result<BTreeMap<i32, i64>> {
    list_offsets_isolated(conn, topic, partitions, timestamp, 0)
}

/// [`list_offsets_answers`] without the failures.
pub fn list_offsets_isolated(
    conn: &mut Conn,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
    isolation_level: i8,
) -> Result<BTreeMap<i32, i64>> {
    let answers = list_offsets_answers(conn, topic, partitions, timestamp, isolation_level)?;
    Ok(answers
        .into_iter()
        .filter_map(|(p, a)| Some((p, a.ok()?)))
        .collect())
}

/// Each partition's answer to ListOffsets at `timestamp`: its offset or its error code.
/// Isolation level 1 (read_committed) makes LATEST the last stable offset instead of the
/// high watermark. A partition the broker left out of its answer is left out here too.
pub fn list_offsets_answers(
    conn: &mut Conn,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
    isolation_level: i8,
) -> Result<BTreeMap<i32, Result<i64, i16>>> {
    let lo = if isolation_level == 0 { 1 } else { 2 };
    let v = conn.versions.pick(api::LIST_OFFSETS, lo, 7)?;
    let mut t = ListOffsetsTopic::default();
    t.name = topic_name(topic);
    t.partitions = partitions
        .iter()
        .map(|&p| {
            let mut lp = ListOffsetsPartition::default();
            lp.partition_index = p;
            lp.current_leader_epoch = -1;
            lp.timestamp = timestamp;
            lp
        })
        .collect();
    let mut req = ListOffsetsRequest::default();
    req.replica_id = BrokerId(-1);
    req.isolation_level = isolation_level;
    req.topics = vec![t];
    let resp = conn.call(&req, v)?;
    let mut out = BTreeMap::new();
    for t in resp.topics {
        for p in t.partitions {
            let answer = if p.error_code == 0 {
                Ok(p.offset)
            } else {
                Err(p.error_code)
            };
            out.insert(p.partition_index, answer);
        }
    }
    Ok(out)
}

/// Asks for an idempotent producer id (InitProducerId without a transactional id).
pub fn init_producer_id(conn: &mut Conn) -> Result<(ProducerId, ProducerEpoch)> {
    let v = conn.versions.pick(api::INIT_PRODUCER_ID, 0, 4)?;
    let mut req = InitProducerIdRequest::default();
    req.transactional_id = None;
    req.transaction_timeout_ms = -1;
    req.producer_id = kafka_protocol::messages::ProducerId(-1);
    req.producer_epoch = -1;
    let resp = conn.call(&req, v)?;
    if resp.error_code != 0 {
        bail!("InitProducerId failed: {}", error_name(resp.error_code));
    }
    Ok((
        ProducerId(resp.producer_id.0),
        ProducerEpoch(resp.producer_epoch),
    ))
}
