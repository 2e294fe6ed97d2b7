//! The node's topic catalogue: topic name, id (UUID), partition count and per-topic config
//! overrides, persisted as `topics.json` in the data dir with an atomic write.
//!
//! Shared by all shards. Reads are lock-free on the data path: each shard keeps an
//! `Arc<Catalog>` snapshot and reloads it only when the global version counter (one atomic
//! load) moved. Writes (create/delete/alter — rare, control plane) take a mutex, persist,
//! then publish a new snapshot.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

pub mod scram;

/// File name of the catalogue inside the data dir.
pub const CATALOG_FILE: &str = "topics.json";
/// Longest topic name Kafka accepts.
pub const TOPIC_NAME_MAX: usize = 249;
/// Most partitions weir lets one topic have (bounds memory a single request can cause).
pub const PARTITIONS_PER_TOPIC_MAX: i32 = 100_000;

/// One topic as stored.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TopicMeta {
    pub name: String,
    /// Kafka topic id (KIP-516), a random UUID. A catalogue written without one (0) gets
    /// one assigned, persisted, once, when it is opened.
    #[serde(default)]
    pub id: u128,
    pub partitions: i32,
    /// Topic-level overrides only (Kafka names: `retention.ms`, `segment.bytes`, ...).
    pub configs: BTreeMap<String, String>,
    /// Per partition (index = partition): replicas, leader, leader epoch, ISR. Empty on a
    /// single node (this node leads every partition), so its `topics.json` is unchanged;
    /// in a cluster the controller places every partition (see `controller`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assignment: Vec<PartitionAssignment>,
}

/// Where one partition lives in a cluster, as the controller's quorum committed it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartitionAssignment {
    /// Node ids holding a replica; the first is the preferred leader.
    pub replicas: Vec<i32>,
    /// The node leading the partition; -1 while none of its ISR is alive (offline).
    pub leader: i32,
    /// Bumped on every leader change (fences the old leader's writes).
    pub leader_epoch: i32,
    /// In-sync replicas (the leader among them).
    pub isr: Vec<i32>,
    /// Bumped on every change of this record (leader, ISR, replicas).
    pub partition_epoch: i32,
}

/// One node of the cluster as registered with the controller.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeInfo {
    /// The address clients are given (`advertised.listeners`).
    pub host: String,
    pub port: u16,
    /// True once the node's heartbeat lease expired: it leads nothing until it heartbeats
    /// again.
    pub fenced: bool,
    /// The broker epoch of the node's process (`wire::BrokerEpoch`; -1 in an image
    /// written before nodes had one).
    #[serde(default = "no_broker_epoch")]
    pub broker_epoch: i64,
    /// Every listener's advertised address, by listener name: a client is answered with
    /// the address of the listener it came through (Kafka's rule). Empty in an image
    /// written before nodes registered them: then `host`/`port` serve every listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<Endpoint>,
    /// The `directory.id` of the node's data dir (Kafka's KIP-858, simplified): another
    /// one at a registration means its storage was replaced (wiped, a new disk), so what
    /// its ISR memberships vouched for is gone. `None` in an image written before nodes
    /// sent one, or from an older node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory_id: Option<u128>,
    /// The node's `broker.rack` (`None` unset, or in an image written before racks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
}

/// One listener of a node as registered: its name and advertised address.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Endpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
}

fn no_broker_epoch() -> i64 {
    wire::BrokerEpoch::NONE.get()
}

impl NodeInfo {
    /// The address a client of listener `listener` is given for this node; `None` if the
    /// node has no such listener (Kafka leaves such a node out of the answer).
    pub fn address_for(&self, listener: &str) -> Option<(&str, u16)> {
        if self.endpoints.is_empty() {
            return Some((&self.host, self.port));
        }
        self.endpoints
            .iter()
            .find(|e| e.name == listener)
            .map(|e| (e.host.as_str(), e.port))
    }

    /// The broker epoch the node registered (NONE: an older node, or an older image).
    pub fn epoch(&self) -> wire::BrokerEpoch {
        wire::BrokerEpoch(self.broker_epoch)
    }

    /// Whether fetches made under `fetched` came from the process registered now (KIP-903).
    /// NONE on either side is a node or a fetch from before broker epochs: not checked,
    /// so that nodes and voters can be upgraded one after the other.
    pub fn registered_as(&self, fetched: wire::BrokerEpoch) -> bool {
        let registered = self.epoch();
        registered == wire::BrokerEpoch::NONE
            || fetched == wire::BrokerEpoch::NONE
            || registered == fetched
    }
}

/// An immutable snapshot of every topic.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Catalog {
    pub topics: BTreeMap<String, Arc<TopicMeta>>,
    /// Registered nodes of a cluster (empty on a single node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nodes: BTreeMap<i32, NodeInfo>,
    /// The id the whole cluster shares (set once by the first controller; `None` on a
    /// single node, which keeps its own `cluster.id` file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// SCRAM credentials by user, then mechanism (see [`scram`]); absent in catalogues
    /// written before they existed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scram_users: BTreeMap<String, BTreeMap<String, crate::security::scram::ScramCredential>>,
    /// ACL bindings (see `security::acl`), changed only by the controller's CreateAcls /
    /// DeleteAcls commands; absent in catalogues written before them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub acls: std::collections::BTreeSet<crate::security::acl::AclBinding>,
    /// A cluster's dynamic broker configs by resource name: "" is the cluster-wide
    /// default, a node id's decimal form that node's own (see `config::dynamic`). Empty
    /// on a single node, which keeps them in its data dir.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub broker_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// The start of the next block of producer ids the controller hands out (Kafka's
    /// `ProducerIdsRecord`; `Command::AllocateProducerIds`). `None` until the first block
    /// (a single node, or a catalogue from before the counter): the first block then
    /// starts at `CONTROLLER_FIRST_PRODUCER_ID`, above every id the nodes' own per-shard
    /// ranges could have handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_producer_id: Option<i64>,
}

impl Catalog {
    /// Partitions of every topic (what `max.partitions` bounds).
    pub fn partition_count(&self) -> u64 {
        self.topics
            .values()
            .map(|t| u64::try_from(t.partitions).unwrap_or(0))
            .sum()
    }
}

/// Why a catalogue change was refused; mapped to Kafka error codes by the API layer.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("topic {0} already exists")]
    TopicExists(String),
    #[error("topic {0} does not exist")]
    UnknownTopic(String),
    #[error("invalid topic name {0:?}")]
    InvalidName(String),
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
    #[error("topic {0} is internal: only the broker creates it")]
    Internal(String),
    #[error("topic '{0}' collides with existing topic: {1}")]
    Collides(String, String),
    #[error("cannot persist topic catalogue: {0}")]
    Io(#[from] std::io::Error),
}

/// The persisted, shared catalogue.
pub struct MetaStore {
    path: PathBuf,
    /// False in a cluster: the controller's Raft log is the durable record there, and the
    /// catalogue is rebuilt from it on start.
    persist: bool,
    version: AtomicU64,
    /// The published catalogue: held only to read or swap the pointer, so a reader (every
    /// shard after a change, every SASL authentication) never waits for a write's
    /// serialisation and fsyncs.
    current: Mutex<Arc<Catalog>>,
    /// Held by a writer from the copy to the publish: writes stay serialised.
    writing: Mutex<()>,
}

impl MetaStore {
    /// Loads `topics.json` from `data_dir` (an absent file is an empty catalogue).
    pub fn open(data_dir: &Path) -> anyhow::Result<MetaStore> {
        let path = data_dir.join(CATALOG_FILE);
        let catalog = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(anyhow::Error::from)
                .and_then(|c| check_catalog(&c).map(|()| c))
                .map_err(|e| anyhow::anyhow!("corrupt {}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Catalog::default(),
            Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        };
        let store = MetaStore {
            path,
            persist: true,
            version: AtomicU64::new(1),
            current: Mutex::new(Arc::new(catalog)),
            writing: Mutex::new(()),
        };
        store.assign_missing_topic_ids()?;
        Ok(store)
    }

    /// Gives every topic without an id (0) a new random one and persists it, so the id a
    /// client learns stays the topic's id across restarts.
    fn assign_missing_topic_ids(&self) -> anyhow::Result<()> {
        let assigned = self.update_batch(|c| {
            let mut n = 0;
            for t in c.topics.values_mut().filter(|t| t.id == 0) {
                Arc::make_mut(t).id = new_topic_id();
                n += 1;
            }
            (n, n > 0)
        });
        match assigned {
            Ok(0) => Ok(()),
            Ok(n) => {
                tracing::info!(
                    topics = n,
                    "assigned topic ids to topics stored without one"
                );
                Ok(())
            }
            Err(e) => Err(anyhow::anyhow!("cannot persist assigned topic ids: {e}")),
        }
    }

    /// An empty catalogue that is never written to disk: a cluster node's image, filled
    /// by the controller's state machine from the Raft log.
    pub fn in_memory(data_dir: &Path) -> MetaStore {
        MetaStore {
            path: data_dir.join(CATALOG_FILE),
            persist: false,
            version: AtomicU64::new(1),
            current: Mutex::new(Arc::new(Catalog::default())),
            writing: Mutex::new(()),
        }
    }

    /// Replaces the whole catalogue (a cluster node installing a snapshot).
    pub fn replace(&self, catalog: Catalog) -> Result<(), MetaError> {
        self.update_batch(|c| {
            *c = catalog;
            ((), true)
        })
    }

    /// The version of the newest snapshot; changes on every successful write.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The newest snapshot.
    pub fn snapshot(&self) -> Arc<Catalog> {
        lock(&self.current).clone()
    }

    /// Applies a batch of changes (many topics of one request) to a copy of the
    /// catalogue in one atomic write. `change` says whether it changed anything; an
    /// unchanged catalogue is not written. Its result (per-item outcomes) is returned.
    pub fn update_batch<T>(
        &self,
        change: impl FnOnce(&mut Catalog) -> (T, bool),
    ) -> Result<T, MetaError> {
        let _writing = lock(&self.writing);
        let mut next = (*self.snapshot()).clone();
        let (out, changed) = change(&mut next);
        if !changed {
            return Ok(out);
        }
        self.publish(next)?;
        Ok(out)
    }

    /// Persists `next` (on a single node), then makes it the published catalogue. The
    /// caller holds `writing`.
    fn publish(&self, next: Catalog) -> Result<(), MetaError> {
        if self.persist {
            let json = serde_json::to_vec_pretty(&next).map_err(std::io::Error::other)?;
            write_atomic(&self.path, &json)?;
        }
        *lock(&self.current) = Arc::new(next);
        self.version.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Applies `change` to a copy of the catalogue, persists it, then publishes it.
    /// `change` returns an error to abort without writing.
    pub fn update<T>(
        &self,
        change: impl FnOnce(&mut Catalog) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        let _writing = lock(&self.writing);
        let mut next = (*self.snapshot()).clone();
        let out = change(&mut next)?;
        self.publish(next)?;
        Ok(out)
    }
}

/// Locks `m`, also after a panic elsewhere poisoned it (the data is replaced whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The internal topics (Kafka's `Topic.isInternal`): written only by the broker's own
/// coordinators, never by a client's Produce, DeleteRecords, CreateTopics or a config
/// change that would break them.
pub const INTERNAL_TOPICS: &[&str] = &[crate::group::OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC];
/// The transaction coordinator's internal topic (reserved before that coordinator exists).
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";

/// Overrides an internal topic must keep: the coordinators delete only with tombstones and
/// their own compaction, so time or size retention (the broker's defaults once an override
/// is removed) would erase committed state.
pub const INTERNAL_TOPIC_PINNED_CONFIGS: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("retention.ms", "-1"),
    ("retention.bytes", "-1"),
];

/// Whether `topic` is internal (see [`INTERNAL_TOPICS`]).
pub fn is_internal(topic: &str) -> bool {
    INTERNAL_TOPICS.contains(&topic)
}

/// Kafka's `Topic.unifyCollisionChars`: `.` and `_` map to the same metric name, so two
/// topics whose names differ only there cannot coexist.
pub fn collision_key(name: &str) -> String {
    name.replace('.', "_")
}

/// The topics whose names can collide with another's (those holding `.` or `_`), by
/// [`collision_key`]: built in one pass over the catalogue for a request or a batch of
/// new topics, so that checking each new name is one lookup, not a scan of every topic.
#[derive(Debug, Default)]
pub struct CollisionIndex {
    by_key: std::collections::HashMap<String, String>,
}

impl CollisionIndex {
    /// Notes topic `name` (one that exists, or is being added in the same batch).
    pub fn add(&mut self, name: &str) {
        // A name without `.` or `_` collides only with itself: the existence check's job.
        if name.contains(['.', '_']) {
            self.by_key
                .entry(collision_key(name))
                .or_insert_with(|| name.to_string());
        }
    }

    /// The noted topic `name` collides with, if any (never `name` itself).
    fn colliding(&self, name: &str) -> Option<&String> {
        if !name.contains(['.', '_']) {
            return None;
        }
        self.by_key
            .get(&collision_key(name))
            .filter(|existing| existing.as_str() != name)
    }
}

impl Catalog {
    /// Checks that a client may create `name` now: it does not exist, is not internal, and
    /// does not collide with an existing topic (`t.1` vs `t_1`). One scan of the
    /// catalogue: to check many names, build [`Catalog::collision_index`] once and use
    /// [`Catalog::check_new_name_in`].
    pub fn check_new_name(&self, name: &str) -> Result<(), MetaError> {
        let mut index = CollisionIndex::default();
        // Only names holding `.` or `_` can collide; skip the scan for the rest.
        if name.contains(['.', '_']) {
            let key = collision_key(name);
            let same = self.topics.keys().filter(|t| collision_key(t) == key);
            same.for_each(|t| index.add(t));
        }
        self.check_new_name_in(name, &index)
    }

    /// The collision index of every topic here.
    pub fn collision_index(&self) -> CollisionIndex {
        let mut index = CollisionIndex::default();
        for name in self.topics.keys() {
            index.add(name);
        }
        index
    }

    /// As [`Catalog::check_new_name`], against `index` (this catalogue's, with any
    /// topics added since noted in it).
    pub fn check_new_name_in(&self, name: &str, index: &CollisionIndex) -> Result<(), MetaError> {
        if self.topics.contains_key(name) {
            return Err(MetaError::TopicExists(name.to_string()));
        }
        if is_internal(name) {
            return Err(MetaError::Internal(name.to_string()));
        }
        match index.colliding(name) {
            Some(existing) => Err(MetaError::Collides(name.to_string(), existing.clone())),
            None => Ok(()),
        }
    }
}

/// Checks a loaded catalogue holds only what creation allows: the partition count bounds
/// per-partition work and allocations, and the name becomes a directory name.
fn check_catalog(catalog: &Catalog) -> anyhow::Result<()> {
    for (key, topic) in &catalog.topics {
        validate_topic_name(key)?;
        if topic.name != *key {
            anyhow::bail!("topic {key:?} stored under another name {:?}", topic.name);
        }
        if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&topic.partitions) {
            return Err(MetaError::InvalidPartitions(topic.partitions).into());
        }
    }
    Ok(())
}

/// Checks a topic name the way Kafka does: 1..=249 chars of `[a-zA-Z0-9._-]`, not `.`/`..`.
pub fn validate_topic_name(name: &str) -> Result<(), MetaError> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if name.is_empty() || name.len() > TOPIC_NAME_MAX || !ok_chars || name == "." || name == ".." {
        return Err(MetaError::InvalidName(name.to_string()));
    }
    Ok(())
}

/// A new random topic id (never 0, which Kafka reserves for "no id").
pub fn new_topic_id() -> u128 {
    let mut buf = [0u8; 16];
    // SAFETY: getrandom writes at most `buf.len()` bytes into the valid buffer.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != buf.len() as isize {
        // Fall back to time + pid: ids only need to be unique on this node.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        buf = (nanos ^ (u128::from(std::process::id()) << 64)).to_be_bytes();
    }
    // Version 4, variant 1, like Java's UUID.randomUUID().
    buf[6] = (buf[6] & 0x0f) | 0x40;
    buf[8] = (buf[8] & 0x3f) | 0x80;
    u128::from_be_bytes(buf)
}

/// Writes `bytes` to `path` so that a crash leaves either the old or the new file:
/// write a temp file, fsync it, rename over, fsync the directory.
// TODO(storage): switch to the storage module's atomic-write helper once it lands.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader is not held back by a write in progress (its serialisation and fsyncs):
    /// the published catalogue and the writer have separate locks.
    #[test]
    fn a_snapshot_does_not_wait_for_a_write_in_progress() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Arc::new(MetaStore::open(dir.path()).expect("open"));
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                store.update_batch(|_| {
                    let _ = entered_tx.send(());
                    let _ = release_rx.recv_timeout(std::time::Duration::from_secs(30));
                    ((), false)
                })
            })
        };
        entered_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the writer started");
        let (read_tx, read_rx) = std::sync::mpsc::channel();
        let reader = {
            let store = store.clone();
            std::thread::spawn(move || {
                let _ = read_tx.send(store.snapshot().topics.len());
            })
        };
        let read = read_rx.recv_timeout(std::time::Duration::from_secs(5));
        let _ = release_tx.send(());
        assert_eq!(read, Ok(0), "the snapshot waited for the writer");
        assert!(writer.join().is_ok() && reader.join().is_ok());
    }

    #[test]
    fn a_topic_stored_without_an_id_gets_one_once() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
        std::fs::create_dir_all(&root).unwrap();
        let dir = tempfile::tempdir_in(root).unwrap();
        let old = r#"{"topics":{"a":{"name":"a","partitions":1,"configs":{}}}}"#;
        std::fs::write(dir.path().join(CATALOG_FILE), old).unwrap();
        let first = MetaStore::open(dir.path()).unwrap().snapshot().topics["a"].id;
        assert_ne!(first, 0);
        let again = MetaStore::open(dir.path()).unwrap().snapshot().topics["a"].id;
        assert_eq!(first, again, "assigned once, then kept");
    }

    #[test]
    fn catalogue_survives_reopen() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
        std::fs::create_dir_all(&root).unwrap();
        let dir = tempfile::tempdir_in(root).unwrap();
        let store = MetaStore::open(dir.path()).unwrap();
        let v0 = store.version();
        store
            .update(|c| {
                let t = TopicMeta {
                    name: "a".into(),
                    id: new_topic_id(),
                    partitions: 3,
                    configs: BTreeMap::from([("retention.ms".into(), "10".into())]),
                    assignment: Vec::new(),
                };
                c.topics.insert("a".into(), Arc::new(t));
                Ok(())
            })
            .unwrap();
        assert!(store.version() > v0);
        let again = MetaStore::open(dir.path()).unwrap().snapshot();
        assert_eq!(again.topics["a"].partitions, 3);
        assert_eq!(again.topics["a"].configs["retention.ms"], "10");
        assert!(validate_topic_name("ok.name-1_x").is_ok());
        assert!(validate_topic_name("bad/name").is_err());
        assert!(validate_topic_name("..").is_err());
    }

    #[test]
    fn new_names_that_exist_are_internal_or_collide_are_refused() {
        let mut c = Catalog::default();
        for name in ["t.1", "plain"] {
            let t = TopicMeta {
                name: name.into(),
                id: 1,
                partitions: 1,
                configs: BTreeMap::new(),
                assignment: Vec::new(),
            };
            c.topics.insert(name.into(), Arc::new(t));
        }
        assert!(matches!(
            c.check_new_name("t.1"),
            Err(MetaError::TopicExists(_))
        ));
        assert!(matches!(c.check_new_name("t_1"), Err(MetaError::Collides(_, e)) if e == "t.1"));
        assert!(c.check_new_name("t-1").is_ok(), "'-' does not collide");
        assert!(c.check_new_name("plain.2").is_ok());
        for internal in INTERNAL_TOPICS {
            assert!(is_internal(internal));
            assert!(matches!(
                c.check_new_name(internal),
                Err(MetaError::Internal(_))
            ));
        }
        assert!(!is_internal("__consumer_offsets2"));
    }

    #[test]
    fn a_catalogue_file_creation_would_refuse_does_not_load() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
        std::fs::create_dir_all(&root).unwrap();
        let dir = tempfile::tempdir_in(root).unwrap();
        let topic = |name: &str, partitions: i64| {
            format!(
                r#"{{"topics":{{"{name}":{{"name":"{name}","id":1,"partitions":{partitions},"configs":{{}}}}}}}}"#
            )
        };
        std::fs::write(dir.path().join(CATALOG_FILE), topic("a", 3)).unwrap();
        assert_eq!(
            MetaStore::open(dir.path()).unwrap().snapshot().topics["a"].partitions,
            3
        );
        for bad in [
            topic("a", 0),
            topic("a", -1),
            topic("a", 2_000_000_000),
            topic("..", 1),
        ] {
            std::fs::write(dir.path().join(CATALOG_FILE), &bad).unwrap();
            assert!(MetaStore::open(dir.path()).is_err(), "{bad}");
        }
        let renamed = topic("a", 1).replacen(r#""name":"a""#, r#""name":"b""#, 1);
        std::fs::write(dir.path().join(CATALOG_FILE), &renamed).unwrap();
        assert!(MetaStore::open(dir.path()).is_err(), "{renamed}");
    }
}
