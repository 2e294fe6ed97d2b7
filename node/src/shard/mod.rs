//! A shard: one glommio executor thread, pinned to a core, owning a subset of the
//! partitions (chosen by [`Router`]). Its state lives on that thread only.
//!
//! - [`mesh`]: typed calls to other shards, with deadlines, over bounded channel meshes.
//! - [`calls`]: the operations API handlers run on a partition's owner.
//! - [`context`]: the narrow view hosted services (the group coordinator) get.
//! - [`arrivals`]: produces for a partition that is not open yet append in arrival order.
//! - `housekeeping`: retention and interval flushes, per shard.
//! - `replicas`: applying the cluster's assignments (lead / follow / offline) to the
//!   shard's partitions and running its replication fetchers.
//!
//! This file: the shard's state and its open partitions (opened on first use, closed
//! when idle past `max.open.partitions`, dropped when the catalogue deletes them).

pub mod arrivals;
pub mod calls;
pub mod context;
mod housekeeping;
pub mod mesh;
mod replicas;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use glommio::channels::channel_mesh::Senders;
use glommio::channels::local_channel::LocalSender;
use wire::{NodeId, Offset};

use crate::config::Config;
use crate::errors;
use crate::event::{Event, join_all};
use crate::metadata::{Catalog, MetaStore};
use crate::partition::{Partition, ReadFor};
use crate::router::{Router, ShardId};
use crate::send_turns::SendTurns;
pub use calls::{
    DeleteRecordsCall, EpochEndCall, FetchCall, FetchRead, ListOffsetCall, ProduceCall, SyncCall,
    WaitCall, WriteMarkerCall,
};
pub use mesh::{CallError, Envelope, INBOX_IN_FLIGHT_MAX, MESH_QUEUE_CAPACITY, ReplyEnvelope};

/// Partition logs one shard closes at the same time (shutdown, idle eviction).
const OPEN_CONCURRENCY_MAX: usize = 32;
/// Fewest partition logs a shard may keep open, whatever `max.open.partitions` says: the
/// group coordinators keep their `__consumer_offsets` partitions open.
const OPEN_PER_SHARD_MIN: usize = 64;
/// When a shard reaches its open-partition budget it closes idle logs until it is this
/// fraction (1/N) below it, so eviction runs once per many opens, not on every one.
const EVICT_FRACTION: usize = 10;
/// Partitions a catalogue sync handles between yields to the executor.
const SYNC_YIELD_PARTITIONS: usize = 256;
/// Longest a shard waits for another to apply a catalogue change.
const SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A partition key: topic name and index.
pub type TopicPartition = (Arc<str>, i32);

/// Everything that is shared by all shards of the node (immutable or atomic).
pub struct NodeShared {
    pub config: Config,
    pub meta: MetaStore,
    /// Open client connections, all shards (for `max.connections`).
    pub connections: AtomicUsize,
    /// Shards that finished draining their connections during shutdown.
    pub drained: AtomicUsize,
    /// Every shard's metrics registry (see `metrics`).
    pub metrics: Arc<crate::metrics::NodeMetrics>,
    pub cluster_id: String,
    /// Every metadata write goes through it (issue 12).
    pub controller: crate::controller::Controller,
    /// The data dir's `replication-offset-checkpoint` (HWs of every replica here).
    pub hw_checkpoint: crate::storage::hw_checkpoint::HwCheckpoint,
}

/// The state of one shard.
pub struct Shard {
    pub id: ShardId,
    pub node: Arc<NodeShared>,
    pub router: Router,
    requests: Option<Senders<Envelope>>,
    replies: Option<Senders<ReplyEnvelope>>,
    /// Callers waiting for a peer's reply, by call id (see `mesh`).
    pending: RefCell<HashMap<u64, LocalSender<mesh::Delivery>>>,
    /// One FIFO turn per peer's request queue, so envelopes enter it in call order.
    send_turns: Vec<SendTurns>,
    next_id: Cell<u64>,
    catalog: RefCell<(u64, Arc<Catalog>)>,
    pub partitions: RefCell<HashMap<TopicPartition, Rc<Partition>>>,
    /// Partitions being opened or closed right now, so concurrent requests open each only
    /// once, and never while its log is still being closed.
    opening: RefCell<HashMap<TopicPartition, Rc<Event>>>,
    /// Produces queued, in arrival order, on partitions that were not open when they
    /// arrived (see [`arrivals`]); empty on the hot path.
    arrivals: RefCell<HashMap<TopicPartition, Rc<arrivals::ArrivalQueue>>>,
    /// The catalogue the last sync applied (to find topics deleted since).
    synced: RefCell<Arc<Catalog>>,
    /// Partition logs this shard keeps open (its share of `max.open.partitions`).
    open_max: usize,
    /// Counts partition uses: the idle logs closed first are those used longest ago.
    use_clock: Cell<u64>,
    /// True while idle logs are being closed (one eviction at a time).
    evicting: Cell<bool>,
    pub shutting_down: Cell<bool>,
    pub shutdown: Event,
    /// Client connections open on this shard.
    pub open_connections: Cell<usize>,
    /// The host and port clients are told to connect to.
    pub advertised: (String, u16),
    /// Group coordinators of the `__consumer_offsets` partitions this shard owns.
    pub groups: Rc<crate::group::Coordinators>,
    /// The transaction coordinator's state for the `__transaction_state` partitions here.
    pub txns: Rc<crate::txn::Coordinators>,
    /// Replication fetchers of this shard, one per source node (see `replicas`).
    fetchers: RefCell<BTreeMap<NodeId, Rc<crate::replication::ReplicaFetcher>>>,
    /// Partitions whose ISR change is being proposed to the controller.
    isr_proposing: RefCell<std::collections::HashSet<TopicPartition>>,
    /// Notified when a replica of a coordinator's internal topic changes role (the
    /// coordinator loader, `calls::run_coordinator_loads`, loads or unloads it).
    pub coordinator_roles: Event,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Shard {
    pub fn new(
        id: ShardId,
        node: Arc<NodeShared>,
        requests: Option<Senders<Envelope>>,
        replies: Option<Senders<ReplyEnvelope>>,
        advertised: (String, u16),
    ) -> Shard {
        let router = Router::new(node.config.shards);
        let send_turns = (0..router.shards()).map(|_| SendTurns::default()).collect();
        let catalog = (node.meta.version(), node.meta.snapshot());
        let open_max = usize::try_from(node.config.partition_limits.max_open_partitions)
            .unwrap_or(usize::MAX)
            / router.shards().max(1);
        let open_max = open_max.max(OPEN_PER_SHARD_MIN);
        let synced = RefCell::new(catalog.1.clone());
        Shard {
            id,
            node,
            router,
            requests,
            replies,
            pending: RefCell::new(HashMap::new()),
            send_turns,
            next_id: Cell::new(1),
            catalog: RefCell::new(catalog),
            partitions: RefCell::new(HashMap::new()),
            opening: RefCell::new(HashMap::new()),
            arrivals: RefCell::new(HashMap::new()),
            synced,
            open_max,
            use_clock: Cell::new(0),
            evicting: Cell::new(false),
            shutting_down: Cell::new(false),
            shutdown: Event::default(),
            open_connections: Cell::new(0),
            advertised,
            groups: Rc::default(),
            txns: Rc::default(),
            fetchers: RefCell::new(BTreeMap::new()),
            isr_proposing: RefCell::default(),
            coordinator_roles: Event::default(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.node.config
    }

    /// This shard's metrics registry.
    pub fn metrics(&self) -> &crate::metrics::ShardMetrics {
        self.node.metrics.shard(self.id.0)
    }

    /// The newest catalogue snapshot; one atomic load when nothing changed.
    pub fn catalog(&self) -> Arc<Catalog> {
        let version = self.node.meta.version();
        let mut cached = self.catalog.borrow_mut();
        if cached.0 != version {
            *cached = (version, self.node.meta.snapshot());
        }
        cached.1.clone()
    }

    /// The node this shard belongs to (`node.id`).
    pub fn node_id(&self) -> NodeId {
        NodeId(self.node.config.node_id)
    }

    /// Waits until one of the local partitions in `tps` can be read past its offset by
    /// `reader`, or the deadline, or shutdown.
    async fn wait_for_data(
        &self,
        tps: &[(TopicPartition, Offset)],
        reader: ReadFor,
        deadline: Instant,
    ) {
        // Through `partition`: a log closed as idle since the fetch read it reopens, so
        // its appends still wake this wait.
        let mut parts: Vec<Rc<Partition>> = Vec::with_capacity(tps.len());
        let mut ready = false;
        for (tp, offset) in tps {
            if let Ok(p) = self.partition(tp).await {
                ready |= p.read_upper(reader) > *offset;
                parts.push(p);
            }
        }
        // A shard that is shutting down has already fired its shutdown event; a new
        // listener would never hear it.
        if ready || self.shutting_down.get() {
            return;
        }
        let listens = parts.iter().map(|p| Box::pin(p.appended.listen()));
        let any = futures_lite::future::poll_fn({
            let mut listens: Vec<_> = listens.collect();
            move |cx| {
                for l in listens.iter_mut() {
                    if l.as_mut().poll(cx).is_ready() {
                        return std::task::Poll::Ready(());
                    }
                }
                std::task::Poll::Pending
            }
        });
        let shutdown = self.shutdown.listen();
        mesh::within(deadline, futures_lite::future::or(any, shutdown)).await;
    }

    /// The open partition `tp`, opening it if the catalogue has it and this shard owns it.
    /// Appends use [`Shard::partition_in_turn`], which keeps their arrival order while
    /// the partition opens.
    pub async fn partition(&self, tp: &TopicPartition) -> Result<Rc<Partition>, i16> {
        if self.router.owner(&tp.0, tp.1) != self.id {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        for _ in 0..2 {
            if let Some(p) = self.opened(tp) {
                return Ok(p);
            }
            let catalog = self.catalog();
            let Some(meta) = catalog.topics.get(&*tp.0) else {
                return Err(errors::UNKNOWN_TOPIC_OR_PARTITION);
            };
            if tp.1 < 0 || tp.1 >= meta.partitions {
                return Err(errors::UNKNOWN_TOPIC_OR_PARTITION);
            }
            // In a cluster a node holds only the partitions assigned to it.
            if !replicas::hosted_here(meta, tp.1, self.node_id()) {
                return Err(errors::NOT_LEADER_OR_FOLLOWER);
            }
            let lead_epoch = replicas::lead_epoch_here(meta, tp.1, self.node_id());
            let meta = meta.clone();
            self.open_partition(tp, meta.id, &meta.configs, lead_epoch)
                .await?;
        }
        self.partitions
            .borrow()
            .get(tp)
            .cloned()
            .ok_or(errors::UNKNOWN_TOPIC_OR_PARTITION)
    }

    /// `tp` if it is open here (marked as used), without waiting.
    fn opened(&self, tp: &TopicPartition) -> Option<Rc<Partition>> {
        let p = self.partitions.borrow().get(tp).cloned()?;
        self.touch(&p);
        Some(p)
    }

    async fn open_partition(
        &self,
        tp: &TopicPartition,
        topic_id: u128,
        overrides: &BTreeMap<String, String>,
        lead_epoch: Option<wire::LeaderEpoch>,
    ) -> Result<(), i16> {
        if self.partitions.borrow().contains_key(tp) {
            return Ok(());
        }
        let waiting = self.opening.borrow().get(tp).cloned();
        if let Some(ev) = waiting {
            ev.listen().await;
            return Ok(());
        }
        // Registered before the first await (closing idle logs waits): a request for
        // this partition arriving meanwhile waits for this open instead of opening the
        // same directory a second time.
        let ev = Rc::new(Event::default());
        self.opening.borrow_mut().insert(tp.clone(), ev.clone());
        if self.partitions.borrow().len() >= self.open_max {
            self.close_idle().await;
        }
        let configs = self.topic_configs(overrides);
        let data_dir = self.config().data_dir.clone();
        let local = self.node_id();
        let with = crate::partition::OpenWith {
            disk: crate::storage::Disk::Real,
            lead_epoch,
        };
        let (topic, index) = (tp.0.clone(), tp.1);
        let opened = Partition::open_on(&data_dir, local, topic, index, topic_id, configs, with);
        let opened = opened.await;
        self.opening.borrow_mut().remove(tp);
        ev.notify_all();
        match opened {
            Ok(p) => {
                let p = Rc::new(p);
                self.touch(&p);
                self.apply_newest_configs(tp, &p);
                // A replica the cluster manages opens at its checkpointed HW, not its LEO.
                let mut stale_entry = false;
                if self.is_replicated(tp) {
                    let checkpointed = self.node.hw_checkpoint.get(&tp.0, tp.1);
                    p.restore_high_watermark(checkpointed);
                    // A directory this open created has no HW of its own yet: an entry
                    // is a deleted topic's of the same name. Replaced at once, so that a
                    // crash before the next checkpoint does not read it as this log's
                    // lost records.
                    if p.created() && checkpointed.is_some() {
                        self.checkpoint_high_watermarks([&p]);
                        stale_entry = true;
                    }
                }
                // Its role before anyone can use it: a replica opens as the sole leader.
                self.apply_catalog_assignment(tp, &p);
                self.partitions.borrow_mut().insert(tp.clone(), p);
                if stale_entry {
                    self.write_hw_checkpoint(true).await;
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!(topic = %tp.0, partition = tp.1, "cannot open partition log: {e}");
                Err(errors::KAFKA_STORAGE_ERROR)
            }
        }
    }

    /// Broker properties (passed through for storage keys such as `log.tail.cache.bytes`),
    /// then broker topic defaults, then the topic's own overrides.
    pub fn topic_configs(&self, overrides: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        for key in [
            "log.tail.cache.bytes",
            "log.read.ahead.bytes",
            "log.index.interval.bytes",
            "log.flush.interval.messages",
            "log.flush.interval.ms",
            "log.roll.ms",
            "producer.id.expiration.ms",
        ] {
            if let Some(v) = self.config().props.get(key) {
                m.insert(key.to_string(), v.to_string());
            }
        }
        if self.config().flush_on_ack {
            m.insert("log.flush.on.ack".into(), "true".into());
        }
        m.extend(self.config().topic_defaults());
        m.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        m
    }

    /// Marks `p` as just used (idle eviction closes the least recently used first).
    fn touch(&self, p: &Partition) {
        let now = self.use_clock.get() + 1;
        self.use_clock.set(now);
        p.last_used.set(now);
    }

    /// A log opened with a catalogue that changed while it opened runs with the newest
    /// topic configs (the sync that carried the change did not see it yet).
    fn apply_newest_configs(&self, tp: &TopicPartition, p: &Partition) {
        let catalog = self.catalog();
        let Some(t) = catalog.topics.get(&*tp.0).filter(|t| t.id == p.topic_id) else {
            return;
        };
        let wanted = self.topic_configs(&t.configs);
        if wanted != p.configs()
            && let Err(e) = p.reconfigure(wanted)
        {
            tracing::warn!(topic = %tp.0, partition = tp.1, "config not applied: {e}");
        }
    }

    /// Closes idle partition logs (no request holds them) until this shard is
    /// 1/[`EVICT_FRACTION`] below its budget, least recently used first. They reopen on
    /// their next use.
    async fn close_idle(&self) {
        if self.evicting.replace(true) {
            return;
        }
        let target = self.open_max - self.open_max / EVICT_FRACTION;
        let mut idle: Vec<(u64, TopicPartition)> = {
            let map = self.partitions.borrow();
            map.iter()
                .filter(|(_, p)| Rc::strong_count(p) == 1)
                .map(|(tp, p)| (p.last_used.get(), tp.clone()))
                .collect()
        };
        idle.sort_unstable_by_key(|(used, _)| *used);
        idle.truncate(self.partitions.borrow().len().saturating_sub(target));
        tracing::debug!(shard = %self.id, closing = idle.len(), open_max = self.open_max, "closing idle partition logs");
        for chunk in idle.chunks(OPEN_CONCURRENCY_MAX) {
            let closes = chunk
                .iter()
                .map(|(_, tp)| Box::pin(self.close_partition(tp)));
            join_all(closes.collect()).await;
        }
        self.evicting.set(false);
    }

    /// Closes one open partition log if nothing holds it; while it closes, `partition`
    /// waits for it instead of opening the same directory twice.
    async fn close_partition(&self, tp: &TopicPartition) {
        let p = {
            let map = self.partitions.borrow();
            match map.get(tp) {
                Some(p) if Rc::strong_count(p) == 1 => p.clone(),
                _ => return,
            }
        };
        if self.opening.borrow().contains_key(tp) {
            return;
        }
        self.partitions.borrow_mut().remove(tp);
        self.checkpoint_high_watermarks([&p]);
        let ev = Rc::new(Event::default());
        self.opening.borrow_mut().insert(tp.clone(), ev.clone());
        match p.log.close().await {
            Ok(()) => p.producers.close(&p.log),
            Err(e) => tracing::error!(topic = %tp.0, partition = tp.1, "close failed: {e}"),
        }
        self.opening.borrow_mut().remove(tp);
        ev.notify_all();
    }

    /// Brings this shard in line with the catalogue: closes and deletes open partitions
    /// whose topic is gone (or was recreated with a new id), removes the directories of
    /// unopened ones, and reconfigures open partitions whose topic config changed.
    /// Nothing is opened here: partitions open on first use (see [`Shard::partition`]),
    /// so creating or restarting with 100,000 partitions opens none of them.
    pub async fn sync_partitions(&self) {
        let catalog = self.catalog();
        let previous = self.synced.replace(catalog.clone());
        let mut stale = Vec::new();
        for (tp, p) in self.partitions.borrow().iter() {
            match catalog.topics.get(&*tp.0) {
                Some(t) if t.id == p.topic_id && tp.1 < t.partitions => {
                    let unchanged = previous
                        .topics
                        .get(&*tp.0)
                        .is_some_and(|old| Arc::ptr_eq(old, t));
                    if unchanged {
                        continue;
                    }
                    let wanted = self.topic_configs(&t.configs);
                    if wanted == p.configs() {
                        continue;
                    }
                    if let Err(e) = p.reconfigure(wanted) {
                        tracing::warn!(topic = %tp.0, partition = tp.1, "config not applied: {e}");
                    }
                }
                _ => stale.push((tp.clone(), p.clone())),
            }
        }
        for (tp, p) in stale {
            self.partitions.borrow_mut().remove(&tp);
            // Its fetcher would ask for the deleted topic's id forever, holding the log.
            self.unfollow(&tp);
            p.appended.notify_all();
            // While the directory is deleted, `partition` waits instead of opening it for
            // a new topic of the same name: the delete would remove the new directory.
            let busy = self.opening.borrow().get(&tp).cloned();
            if let Some(ev) = busy {
                ev.listen().await;
            }
            let ev = Rc::new(Event::default());
            self.opening.borrow_mut().insert(tp.clone(), ev.clone());
            if let Err(e) = p.log.delete().await {
                tracing::warn!(topic = %tp.0, partition = tp.1, "deleting partition: {e}");
            }
            self.opening.borrow_mut().remove(&tp);
            ev.notify_all();
        }
        for (name, old) in previous.topics.iter() {
            let gone = catalog.topics.get(name).is_none_or(|t| t.id != old.id);
            if gone {
                self.node.hw_checkpoint.remove_topic(name);
                self.metrics().forget_topic(name);
                self.remove_unopened(name, old.partitions).await;
            }
        }
        self.apply_assignments().await;
    }

    /// Removes the directories of a deleted topic's partitions that this shard owns and
    /// has not open (an open one was deleted through its log).
    async fn remove_unopened(&self, name: &str, partitions: i32) {
        let topic: Arc<str> = Arc::from(name);
        let data_dir = self.config().data_dir.clone();
        for index in 0..partitions {
            if index as usize % SYNC_YIELD_PARTITIONS == SYNC_YIELD_PARTITIONS - 1 {
                glommio::executor().yield_if_needed().await;
            }
            if self.router.owner(name, index) != self.id {
                continue;
            }
            let tp: TopicPartition = (topic.clone(), index);
            // A log being closed (idle eviction) still writes into its directory.
            let closing = self.opening.borrow().get(&tp).cloned();
            if let Some(ev) = closing {
                ev.listen().await;
            }
            // An open log is the new topic's (or was deleted above through its log).
            if self.partitions.borrow().contains_key(&tp) {
                continue;
            }
            let dir = crate::partition::partition_dir(&data_dir, name, index);
            match crate::storage::reclaim::retire_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(topic = %name, partition = index, "deleting partition: {e}");
                }
            }
        }
    }

    /// Asks every shard (including this one) to sync with the catalogue, and waits (each
    /// at most [`SYNC_TIMEOUT`]; a shard that does not answer in time syncs later).
    pub async fn sync_all(self: &Rc<Self>) {
        for s in 0..self.router.shards() {
            let deadline = Instant::now() + SYNC_TIMEOUT;
            if let Err(e) = self.call(ShardId(s), SyncCall, deadline).await {
                tracing::warn!(shard = s, "catalogue sync not confirmed: {e:?}");
            }
        }
    }

    /// Closes every partition log (flush, clean-shutdown marker), a bounded number at once.
    pub async fn close_all(&self) {
        let parts: Vec<(TopicPartition, Rc<Partition>)> =
            self.partitions.borrow_mut().drain().collect();
        self.checkpoint_high_watermarks(parts.iter().map(|(_, p)| p));
        self.write_hw_checkpoint(true).await;
        for chunk in parts.chunks(OPEN_CONCURRENCY_MAX) {
            let closes = chunk.iter().map(|(tp, p)| {
                Box::pin(async move {
                    match p.log.close().await {
                        // The snapshot lets the next open skip replaying the log.
                        Ok(()) => p.producers.close(&p.log),
                        Err(e) => {
                            tracing::error!(topic = %tp.0, partition = tp.1, "close failed: {e}");
                        }
                    }
                })
            });
            join_all(closes.collect()).await;
        }
    }

    /// Begins shutdown: wakes everything that waits on the shard.
    pub fn begin_shutdown(&self) {
        self.shutting_down.set(true);
        self.stop_fetchers();
        self.shutdown.notify_all();
        for p in self.partitions.borrow().values() {
            p.appended.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CliOverrides, Properties};
    use crate::metadata::TopicMeta;
    use std::path::Path;

    /// Partitions each test topic has: more than a shard keeps open at the least.
    const TEST_PARTITIONS: i32 = 4 * OPEN_PER_SHARD_MIN as i32;
    /// Partitions a test opens at once, past the shard's budget.
    const OVER_BUDGET: i32 = 3 * OPEN_PER_SHARD_MIN as i32;
    /// Most executor turns a test waits for a condition before it gives up.
    const TURNS_MAX: usize = 10_000;

    /// A one-shard node on `data`, keeping the fewest logs open a shard may.
    fn test_shard(data: &Path) -> Rc<Shard> {
        let mut props = Properties::default();
        props.set("log.dirs", &data.display().to_string());
        props.set("weir.shards", "1");
        props.set("max.open.partitions", "1");
        let config = Config::resolve(props, &CliOverrides::default()).expect("config");
        let node = Arc::new(NodeShared {
            hw_checkpoint: crate::storage::hw_checkpoint::HwCheckpoint::empty(data),
            meta: MetaStore::in_memory(data),
            config,
            connections: AtomicUsize::new(0),
            drained: AtomicUsize::new(0),
            metrics: Arc::new(crate::metrics::NodeMetrics::new(1)),
            cluster_id: "test".into(),
            controller: crate::controller::Controller::local(),
        });
        Rc::new(Shard::new(
            ShardId(0),
            node,
            None,
            None,
            ("127.0.0.1".into(), 9092),
        ))
    }

    /// Creates (or recreates, under a new id) topic `name`; returns its id.
    fn create_topic(shard: &Shard, name: &str) -> u128 {
        let id = crate::metadata::new_topic_id();
        let configs = [("segment.bytes", "1048576"), ("preallocate", "false")]
            .map(|(k, v)| (k.to_string(), v.to_string()));
        let topic = TopicMeta {
            name: name.into(),
            id,
            partitions: TEST_PARTITIONS,
            configs: configs.into_iter().collect(),
            assignment: Vec::new(),
        };
        let created = shard.node.meta.update(|c| {
            c.topics.insert(name.into(), Arc::new(topic));
            Ok(())
        });
        created.expect("catalogue update");
        id
    }

    /// Yields until `ready` holds, at most [`TURNS_MAX`] times; whether it held.
    async fn turns_until(ready: impl Fn() -> bool) -> bool {
        for _ in 0..TURNS_MAX {
            if ready() {
                return true;
            }
            glommio::executor().yield_now().await;
        }
        ready()
    }

    /// A request that has to close idle logs before it opens a partition (the shard is at
    /// its budget) and a request for the same partition arriving meanwhile open it once:
    /// both get the same log, the one in the map. Before, the second opened it while the
    /// first was closing logs, and the first then opened the same directory again.
    #[test]
    fn a_partition_opened_while_idle_logs_close_is_opened_once() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let (same, in_map, evicting_seen) = crate::storage::testing::run_on_shard(move || {
            async move {
                let shard = test_shard(&data);
                create_topic(&shard, "t");
                let tp = |i: i32| -> TopicPartition { (Arc::from("t"), i) };
                // Opened together, far past the budget (each skips the eviction another
                // runs), so that the first request below has many logs to close.
                let opens = (0..OVER_BUDGET).map(|i| {
                    let (shard, tp) = (shard.clone(), tp(i));
                    Box::pin(async move { shard.partition(&tp).await.map(|_| ()) })
                });
                let opened = join_all(opens.collect()).await;
                assert!(opened.iter().all(Result::is_ok), "opened");
                let target = tp(TEST_PARTITIONS - 1);
                let first = glommio::spawn_local({
                    let (shard, target) = (shard.clone(), target.clone());
                    async move { shard.partition(&target).await }
                });
                let evicting_seen = turns_until(|| shard.evicting.get()).await;
                let second = shard.partition(&target).await.expect("second open");
                let first = first.await.expect("first open");
                let in_map = shard.partitions.borrow().get(&target).cloned();
                let same = Rc::ptr_eq(&first, &second);
                let in_map = in_map.is_some_and(|p| Rc::ptr_eq(&p, &second));
                shard.close_all().await;
                (same, in_map, evicting_seen)
            }
        });
        assert!(evicting_seen, "the first request closed idle logs");
        assert!(same, "both requests got the same log");
        assert!(in_map, "the log they got is the open one");
    }
}
