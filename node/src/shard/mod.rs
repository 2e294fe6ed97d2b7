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
    ClientSite, DeleteRecordsCall, DescribeProducersCall, EpochEndCall, FetchCall, FetchRead,
    ListOffsetCall, ProduceCall, SyncCall, WaitCall, WriteMarkerCall,
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
/// Most opens, closes and deletes under way that shutdown waits for, one after another.
const SETTLE_WAITS_MAX: usize = 100_000;
/// Longest a shard waits for another to apply a catalogue change (and, at shutdown, for
/// its opens under way).
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
    /// The version of `synced`: while the catalogue has not moved past it, every open
    /// partition is the catalogue's (see [`Shard::opened`]).
    synced_version: Cell<u64>,
    /// Set once the directories of topics deleted while this node was down were looked
    /// for (see [`Shard::retire_orphans`]).
    orphans_swept: Cell<bool>,
    /// Partition logs this shard keeps open (its share of `max.open.partitions`).
    open_max: usize,
    /// Counts partition uses: the idle logs closed first are those used longest ago.
    use_clock: Cell<u64>,
    /// True while idle logs are being closed (one eviction at a time).
    evicting: Cell<bool>,
    pub shutting_down: Cell<bool>,
    /// Set once [`Shard::close_all`] began: no partition log opens any more.
    closing: Cell<bool>,
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

/// Whether partition directory `dir` may hold topic `topic_id`'s log: its
/// `partition.metadata` names that id, or none (a directory from before topic ids, or
/// none at all).
fn dir_of_topic(dir: &std::path::Path, topic_id: u128) -> bool {
    let path = dir.join(crate::partition::PARTITION_METADATA_FILE);
    let Ok(text) = std::fs::read_to_string(path) else {
        return true;
    };
    let id_of = |text: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix("topic_id:"))
            .map(|id| id.trim().to_string())
    };
    let wanted = id_of(&crate::partition::partition_metadata_text(topic_id));
    id_of(&text).is_none_or(|id| Some(id) == wanted)
}

/// Milliseconds since the Unix epoch (the system clock): for times that are stored or
/// sent (record and commit timestamps, retention of records by their timestamps). Timers
/// and periodic work use [`mono_ms`].
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Milliseconds on a monotonic clock, counted from the first call in this process (the
/// same origin on every shard): for durations and deadlines — group sessions and
/// rebalances, the housekeeping intervals — which a step of the system clock must not
/// move (forward, every member's session would expire at once).
pub fn mono_ms() -> i64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    i64::try_from(origin.elapsed().as_millis()).unwrap_or(i64::MAX)
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
        let synced_version = Cell::new(catalog.0);
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
            synced_version,
            orphans_swept: Cell::new(false),
            open_max,
            use_clock: Cell::new(0),
            evicting: Cell::new(false),
            shutting_down: Cell::new(false),
            closing: Cell::new(false),
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
        self.newest_catalog().1.clone()
    }

    /// The cached (version, catalogue), refreshed if the catalogue moved; borrowed, not
    /// cloned (the hot path shares no reference count with other shards).
    fn newest_catalog(&self) -> std::cell::Ref<'_, (u64, Arc<Catalog>)> {
        let version = self.node.meta.version();
        if self.catalog.borrow().0 != version {
            *self.catalog.borrow_mut() = (version, self.node.meta.snapshot());
        }
        self.catalog.borrow()
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
                ready |= p.fetch_ready(reader, *offset);
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
            // Open under a deleted topic's id: the sync that deletes it has not run yet,
            // and its directory is not free for the new topic until then.
            if self.partitions.borrow().contains_key(tp) {
                return Err(errors::NOT_LEADER_OR_FOLLOWER);
            }
            let lead_epoch = replicas::lead_epoch_here(meta, tp.1, self.node_id());
            let meta = meta.clone();
            self.open_partition(tp, meta.id, &meta.configs, lead_epoch)
                .await?;
        }
        self.opened(tp).ok_or(errors::UNKNOWN_TOPIC_OR_PARTITION)
    }

    /// `tp` if it is open here and is the catalogue's (marked as used), without waiting.
    fn opened(&self, tp: &TopicPartition) -> Option<Rc<Partition>> {
        let p = self.partitions.borrow().get(tp).cloned()?;
        if !self.is_current(tp, &p) {
            return None;
        }
        self.touch(&p);
        Some(p)
    }

    /// Whether open `p` is the catalogue's partition `tp`, not one of a topic deleted
    /// (maybe created again under the same name) since the last sync. Until the
    /// catalogue moves past that sync, every open partition is: the sync removed the
    /// others, and an open keeps its log only if its topic is still there.
    fn is_current(&self, tp: &TopicPartition, p: &Partition) -> bool {
        self.node.meta.version() == self.synced_version.get() || self.in_catalog(tp, p)
    }

    /// Whether the newest catalogue has `p`'s topic, under its id, and partition `tp`.
    fn in_catalog(&self, tp: &TopicPartition, p: &Partition) -> bool {
        self.newest_catalog()
            .1
            .topics
            .get(&*tp.0)
            .is_some_and(|t| t.id == p.topic_id && tp.1 < t.partitions)
    }

    /// Ends `ev`, the open, close or delete of `tp`: its entry goes (unless another has
    /// replaced it) and its waiters wake.
    fn opening_done(&self, tp: &TopicPartition, ev: &Rc<Event>) {
        let mut opening = self.opening.borrow_mut();
        if opening.get(tp).is_some_and(|e| Rc::ptr_eq(e, ev)) {
            opening.remove(tp);
        }
        drop(opening);
        ev.notify_all();
    }

    async fn open_partition(
        &self,
        tp: &TopicPartition,
        topic_id: u128,
        overrides: &BTreeMap<String, String>,
        lead_epoch: Option<wire::LeaderEpoch>,
    ) -> Result<(), i16> {
        if self.closing.get() {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
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
        // The topic was deleted while its log opened: the sync that deleted it found
        // neither a log to delete nor a free directory. Deleted here, still marked busy.
        if let Ok(p) = &opened
            && !self.in_catalog(tp, p)
        {
            if let Err(e) = p.log.delete().await {
                tracing::warn!(topic = %tp.0, partition = tp.1, "deleting partition: {e}");
            }
            self.opening_done(tp, &ev);
            return Err(errors::UNKNOWN_TOPIC_OR_PARTITION);
        }
        self.opening_done(tp, &ev);
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

    /// The broker's log defaults ([`Config::log_defaults`](crate::config::Config::log_defaults)),
    /// then the topic's own overrides, which replace them key by key.
    pub fn topic_configs(&self, overrides: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut m = self.config().log_defaults();
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
        self.opening_done(tp, &ev);
    }

    /// Brings this shard in line with the catalogue: closes and deletes open partitions
    /// whose topic is gone (or was recreated with a new id), removes the directories of
    /// unopened ones, and reconfigures open partitions whose topic config changed.
    /// Nothing is opened here: partitions open on first use (see [`Shard::partition`]),
    /// so creating or restarting with 100,000 partitions opens none of them.
    pub async fn sync_partitions(&self) {
        // The version is read before the snapshot is taken: never newer than it.
        let (version, catalog) = self.newest_catalog().clone();
        let previous = self.synced.replace(catalog.clone());
        self.synced_version.set(version);
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
        // Every stale log leaves the map, and is marked busy, before the first await: a
        // topic created again under the same name meanwhile (another sync runs then)
        // must neither be served by the old log nor lose its own to this delete.
        let deleting: Vec<_> = stale
            .into_iter()
            .map(|(tp, p)| {
                let ev = self.retire_open(&tp, &p);
                (tp, p, ev)
            })
            .collect();
        for (tp, p, ev) in deleting {
            let Some(ev) = ev else {
                continue;
            };
            if let Err(e) = p.log.delete().await {
                tracing::warn!(topic = %tp.0, partition = tp.1, "deleting partition: {e}");
            }
            self.opening_done(&tp, &ev);
        }
        for (name, old) in previous.topics.iter() {
            let gone = catalog.topics.get(name).is_none_or(|t| t.id != old.id);
            if gone {
                self.node.hw_checkpoint.remove_topic(name);
                self.metrics().forget_topic(name);
                self.remove_unopened(name, old.id, old.partitions).await;
            }
        }
        if !self.orphans_swept.get() && self.image_has_this_process(&catalog) {
            self.orphans_swept.set(true);
            self.retire_orphans();
        }
        self.apply_assignments().await;
    }

    /// Whether `catalog` registers this very process (a cluster node, its broker epoch).
    /// That registration was committed after the process started, so the image holds
    /// everything committed before: every topic this node ever had a directory of is in
    /// it, or was deleted.
    fn image_has_this_process(&self, catalog: &Catalog) -> bool {
        let Some(q) = self.node.controller.cluster() else {
            return false;
        };
        let epoch = q.broker_epoch();
        q.image_ready()
            && epoch != wire::BrokerEpoch::NONE
            && catalog
                .nodes
                .get(&self.config().node_id)
                .is_some_and(|n| n.epoch() == epoch)
    }

    /// Retires the directories this shard owns of topics deleted while this node was
    /// down: `<topic>-<n>` with a `partition.metadata`, whose topic the image does not
    /// have at all. A node that misses a delete (a broker-only node starts from an empty
    /// image) never sees the topic go, so the diff in [`Shard::sync_partitions`] never
    /// removes them. A topic of that name in the catalogue keeps its directory (one of an
    /// older id is set aside when it opens). Checked against the newest catalogue right
    /// before each rename, with no await in between: a topic created meanwhile is kept.
    fn retire_orphans(&self) {
        let data_dir = self.config().data_dir.clone();
        let Ok(entries) = std::fs::read_dir(&data_dir) else {
            return;
        };
        for e in entries.filter_map(Result::ok) {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let file_name = e.file_name();
            let Some((topic, index)) = file_name
                .to_str()
                .and_then(|n| n.rsplit_once('-'))
                .and_then(|(t, i)| Some((t, i.parse::<i32>().ok().filter(|i| *i >= 0)?)))
            else {
                continue;
            };
            let dir = crate::partition::partition_dir(&data_dir, topic, index);
            if dir != e.path() || self.router.owner(topic, index) != self.id {
                continue;
            }
            // Only a partition directory (it names a topic id), never anything else.
            let text = std::fs::read_to_string(dir.join(crate::partition::PARTITION_METADATA_FILE));
            if !text.is_ok_and(|t| t.lines().any(|l| l.trim().starts_with("topic_id:"))) {
                continue;
            }
            let tp: TopicPartition = (Arc::from(topic), index);
            let in_use = self.partitions.borrow().contains_key(&tp)
                || self.opening.borrow().contains_key(&tp);
            if in_use || self.newest_catalog().1.topics.contains_key(topic) {
                continue;
            }
            tracing::warn!(
                topic,
                partition = index,
                "a deleted topic's partition directory, left while this node was down, is removed"
            );
            if let Err(e) = crate::storage::reclaim::retire_dir(&dir) {
                tracing::warn!(
                    topic,
                    partition = index,
                    "removing a deleted topic's partition: {e}"
                );
            }
        }
    }

    /// Takes `p`, open as `tp` but no longer in the catalogue, out of use at once: out of
    /// the map, not followed, offline (an acks=all produce waiting on it answers now, not
    /// at its timeout), and marked busy so that `tp` is not opened again until its
    /// directory is deleted. Returns that mark; `None` if `tp` was already busy, which
    /// an open log never is (its directory then goes with the topic's unopened ones).
    fn retire_open(&self, tp: &TopicPartition, p: &Rc<Partition>) -> Option<Rc<Event>> {
        self.partitions.borrow_mut().remove(tp);
        // Its fetcher would ask for the deleted topic's id forever, holding the log.
        self.unfollow(tp);
        p.update_replica(|r| {
            let offline = crate::partition::replica::Assignment {
                replicas: Vec::new(),
                leader: None,
                leader_epoch: r.leader_epoch(),
                isr: Vec::new(),
                partition_epoch: r.partition_epoch(),
            };
            r.apply(&offline, now_ms());
        });
        if self.opening.borrow().contains_key(tp) {
            tracing::warn!(topic = %tp.0, partition = tp.1, "a deleted partition's log is open and busy: its directory goes with the unopened ones");
            return None;
        }
        let ev = Rc::new(Event::default());
        self.opening.borrow_mut().insert(tp.clone(), ev.clone());
        Some(ev)
    }

    /// Removes the directories of a deleted topic's partitions that this shard owns and
    /// has not open (an open one was deleted through its log). A directory whose
    /// `partition.metadata` names another topic id is a newer topic's of the same name
    /// (created, opened and closed again while this ran): kept.
    async fn remove_unopened(&self, name: &str, topic_id: u128, partitions: i32) {
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
            if !dir_of_topic(&dir, topic_id) {
                continue;
            }
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
        self.closing.set(true);
        // Opens under way finish first: one would add its log after the drain below, and
        // it would never be closed. Idle closes and deletes under way finish too.
        let settled = mesh::within(Instant::now() + SYNC_TIMEOUT, async {
            for _ in 0..SETTLE_WAITS_MAX {
                let busy = self.opening.borrow().values().next().cloned();
                let Some(ev) = busy else {
                    return;
                };
                ev.listen().await;
            }
        });
        if settled.await.is_none() {
            tracing::warn!(shard = %self.id, "partition opens still under way at shutdown");
        }
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
pub(super) mod tests {
    use super::*;
    use crate::config::{CliOverrides, Properties};
    use crate::metadata::TopicMeta;
    use std::path::Path;

    /// Partitions each test topic has: more than a shard keeps open at the least.
    pub(super) const TEST_PARTITIONS: i32 = 4 * OPEN_PER_SHARD_MIN as i32;
    /// Partitions a test opens at once, past the shard's budget.
    pub(super) const OVER_BUDGET: i32 = 3 * OPEN_PER_SHARD_MIN as i32;
    /// Most executor turns a test waits for a condition before it gives up.
    pub(super) const TURNS_MAX: usize = 10_000;

    /// A one-shard node on `data`, keeping the fewest logs open a shard may.
    pub(super) fn test_shard(data: &Path) -> Rc<Shard> {
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
    pub(super) fn create_topic(shard: &Shard, name: &str) -> u128 {
        create_topic_with(shard, name, &[])
    }

    /// [`create_topic`] with these topic configs too.
    pub(super) fn create_topic_with(shard: &Shard, name: &str, extra: &[(&str, &str)]) -> u128 {
        let id = crate::metadata::new_topic_id();
        let configs = [("segment.bytes", "1048576"), ("preallocate", "false")]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()));
        let topic = TopicMeta {
            name: name.into(),
            id,
            partitions: TEST_PARTITIONS,
            configs: configs.collect(),
            assignment: Vec::new(),
        };
        let created = shard.node.meta.update(|c| {
            c.topics.insert(name.into(), Arc::new(topic));
            Ok(())
        });
        created.expect("catalogue update");
        id
    }

    /// Waits until `ready` holds, at most [`TURNS_MAX`] turns (the first ones yields,
    /// so that a state seen at once is not missed; then 1 ms sleeps, for I/O); whether
    /// it held.
    pub(super) async fn turns_until(ready: impl Fn() -> bool) -> bool {
        for turn in 0..TURNS_MAX {
            if ready() {
                return true;
            }
            if turn < TURNS_MAX / 2 {
                glommio::executor().yield_now().await;
            } else {
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        ready()
    }

    pub(super) fn delete_topic(shard: &Shard, name: &str) {
        let deleted = shard.node.meta.update(|c| {
            c.topics.remove(name);
            Ok(())
        });
        deleted.expect("catalogue update");
    }

    pub(super) fn tp(i: i32) -> TopicPartition {
        (Arc::from("t"), i)
    }

    /// Whether `tp` has a directory, naming topic `topic_id` (or no id).
    pub(super) fn dir_names(shard: &Shard, tp: &TopicPartition, topic_id: u128) -> bool {
        let dir = crate::partition::partition_dir(&shard.config().data_dir, &tp.0, tp.1);
        dir.exists() && dir_of_topic(&dir, topic_id)
    }

    /// Partitions of `t` the topic-recreation tests open.
    pub(super) const RECREATED: i32 = 16;

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

#[cfg(test)]
mod deletion_tests {
    use super::tests::*;
    use super::*;

    /// A topic deleted and created again under the same name while the first sync still
    /// deletes the old logs: from the create on, every partition is the new topic's (none
    /// served by an old log about to be deleted), and the old sync leaves the new logs
    /// and their directories alone.
    #[test]
    fn a_topic_created_again_while_its_old_logs_are_deleted_gets_new_logs() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let (ids, kept, dirs, expected) = crate::storage::testing::run_on_shard(move || {
            async move {
                let shard = test_shard(&data);
                create_topic(&shard, "t");
                shard.sync_partitions().await;
                // Appends still being written when the topic goes: each delete waits for
                // its log's write, so the first sync is still deleting when it is created
                // again.
                let mut appends = Vec::new();
                for i in 0..RECREATED {
                    let p = shard.partition(&tp(i)).await.expect("open");
                    appends.push(glommio::spawn_local(async move {
                        let records = crate::storage::testing::build_batch(0, &[b"old"]);
                        let deadline = Instant::now() + std::time::Duration::from_secs(10);
                        let acks = crate::partition::Acks::Leader;
                        p.produce(records, acks, deadline, now_ms()).await.error
                    }));
                }
                delete_topic(&shard, "t");
                let first_sync = glommio::spawn_local({
                    let shard = shard.clone();
                    async move { shard.sync_partitions().await }
                });
                let deleting = turns_until(|| !shard.opening.borrow().is_empty()).await;
                assert!(deleting, "the first sync deletes logs");
                let id = create_topic(&shard, "t");
                // Those the first sync has not reached first (as produces for them):
                // each request that waits for a delete lets the sync go on meanwhile.
                let mut order: Vec<i32> = (0..RECREATED).collect();
                order.sort_by_key(|i| !shard.partitions.borrow().contains_key(&tp(*i)));
                let mut got = vec![Err(errors::NONE); RECREATED as usize];
                for i in order {
                    got[i as usize] = shard.partition(&tp(i)).await;
                }
                first_sync.await;
                shard.sync_partitions().await;
                for append in appends {
                    append.await;
                }
                let ids: Vec<_> = got
                    .iter()
                    .map(|p| p.as_ref().map(|p| p.topic_id).map_err(|e| *e))
                    .collect();
                let kept = got.iter().enumerate().all(|(i, p)| {
                    let open = shard.partitions.borrow().get(&tp(i as i32)).cloned();
                    matches!((p, open), (Ok(p), Some(open)) if Rc::ptr_eq(p, &open))
                });
                let dirs = (0..RECREATED).all(|i| dir_names(&shard, &tp(i), id));
                drop(got);
                shard.close_all().await;
                (ids, kept, dirs, id)
            }
        });
        assert!(
            ids.iter().all(|id| *id == Ok(expected)),
            "every partition is the new topic's: {ids:?}"
        );
        assert!(kept, "the first sync left the new logs open");
        assert!(dirs, "the new logs' directories are there");
    }

    /// A sync that finds a topic deleted and created again keeps a directory the new
    /// topic already wrote (opened and closed as idle before the sync ran).
    #[test]
    fn a_sync_keeps_the_directory_of_a_topic_created_again() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let (kept, reopened) = crate::storage::testing::run_on_shard(move || async move {
            let shard = test_shard(&data);
            create_topic(&shard, "t");
            shard.sync_partitions().await;
            delete_topic(&shard, "t");
            let id = create_topic(&shard, "t");
            let p = shard.partition(&tp(3)).await.expect("open");
            drop(p);
            shard.close_partition(&tp(3)).await;
            shard.sync_partitions().await;
            let kept = dir_names(&shard, &tp(3), id);
            let reopened = shard.partition(&tp(3)).await.map(|p| p.topic_id) == Ok(id);
            shard.close_all().await;
            (kept, reopened)
        });
        assert!(kept, "the new topic's directory is kept");
        assert!(reopened, "and opens again");
    }

    /// A partition whose topic is deleted while its log opens is not kept open, and its
    /// directory goes (the sync found neither an open log nor a free directory).
    #[test]
    fn a_partition_opening_when_its_topic_is_deleted_is_dropped_with_its_directory() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let (answer, open, dir) = crate::storage::testing::run_on_shard(move || async move {
            let shard = test_shard(&data);
            let id = create_topic(&shard, "t");
            shard.sync_partitions().await;
            let opening = glommio::spawn_local({
                let shard = shard.clone();
                async move { shard.partition(&tp(5)).await.map(|p| p.topic_id) }
            });
            let started = turns_until(|| shard.opening.borrow().contains_key(&tp(5))).await;
            assert!(started, "the open started");
            delete_topic(&shard, "t");
            shard.sync_partitions().await;
            let answer = opening.await;
            let open = shard.partitions.borrow().contains_key(&tp(5));
            let dir = dir_names(&shard, &tp(5), id);
            shard.close_all().await;
            (answer, open, dir)
        });
        assert_eq!(answer, Err(errors::UNKNOWN_TOPIC_OR_PARTITION));
        assert!(!open, "not kept open");
        assert!(!dir, "its directory is gone");
    }

    /// An acks=all produce waiting for a follower on a partition whose topic is deleted
    /// answers at once (NOT_LEADER_OR_FOLLOWER), not at its timeout.
    #[test]
    fn an_acks_all_produce_waiting_on_a_deleted_partition_answers_at_once() {
        use crate::partition::Acks;
        use wire::{LeaderEpoch, NodeId};
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let answer = crate::storage::testing::run_on_shard(move || async move {
            let shard = test_shard(&data);
            create_topic(&shard, "t");
            shard.sync_partitions().await;
            let p = shard.partition(&tp(0)).await.expect("open");
            let both = [shard.node_id(), NodeId(2)];
            p.update_replica(|r| r.become_leader(LeaderEpoch(1), both.to_vec(), &both));
            let produce = glommio::spawn_local({
                let p = p.clone();
                async move {
                    let records = crate::storage::testing::build_batch(0, &[b"a"]);
                    let deadline = Instant::now() + std::time::Duration::from_secs(60);
                    p.produce(records, Acks::All, deadline, now_ms())
                        .await
                        .error
                }
            });
            let appended = turns_until(|| p.log.log_end_offset() == Offset(1)).await;
            assert!(appended, "appended, waiting for the follower");
            drop(p);
            delete_topic(&shard, "t");
            shard.sync_partitions().await;
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            let answer = mesh::within(deadline, produce).await;
            shard.close_all().await;
            answer
        });
        assert_eq!(answer, Some(errors::NOT_LEADER_OR_FOLLOWER));
    }
}

#[cfg(test)]
mod shutdown_tests {
    use super::tests::*;
    use super::*;

    /// A log still opening when the shard closes every log is closed with them, and no
    /// log opens once closing began.
    #[test]
    fn a_log_opening_at_shutdown_is_closed_and_no_log_opens_after() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let dir = crate::partition::partition_dir(&data, "t", 1);
        let (first, later, open) = crate::storage::testing::run_on_shard(move || async move {
            let shard = test_shard(&data);
            create_topic(&shard, "t");
            let opening = glommio::spawn_local({
                let shard = shard.clone();
                async move { shard.partition(&tp(1)).await.map(|_| ()) }
            });
            let started = turns_until(|| shard.opening.borrow().contains_key(&tp(1))).await;
            assert!(started, "the open started");
            shard.close_all().await;
            let first = opening.await;
            let later = shard.partition(&tp(2)).await.map(|_| ());
            let open = shard.partitions.borrow().len();
            (first, later, open)
        });
        assert!(first.is_ok(), "the open under way completed: {first:?}");
        assert_eq!(later, Err(errors::NOT_LEADER_OR_FOLLOWER), "no open after");
        assert_eq!(open, 0, "every log closed");
        // The log's clean-shutdown marker (`storage::log::CLEAN_SHUTDOWN_FILE`).
        let marker = dir.join(".weir-clean-shutdown");
        assert!(marker.exists(), "the opened log was closed cleanly");
    }
}

#[cfg(test)]
mod housekeeping_tests {
    use super::tests::*;
    use super::*;

    /// While the interval flushes run, idle eviction can close the logs they are not
    /// flushing: the pass holds each log only for its own flush (it held every open log
    /// until the pass ended, and the cleaner's pass takes minutes).
    #[test]
    fn idle_logs_close_while_interval_flushes_run() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let (open_before, open_after) = crate::storage::testing::run_on_shard(move || {
            async move {
                let shard = test_shard(&data);
                create_topic_with(&shard, "t", &[("flush.ms", "60000")]);
                shard.sync_partitions().await;
                // The first append of a log is synced (its last flush is "never"); the
                // second is not, until the interval passed.
                for i in 0..OPEN_PER_SHARD_MIN as i32 {
                    let p = shard.partition(&tp(i)).await.expect("open");
                    for _ in 0..2 {
                        let records = crate::storage::testing::build_batch(0, &[b"a"]);
                        let deadline = Instant::now() + std::time::Duration::from_secs(10);
                        let acks = crate::partition::Acks::Leader;
                        let answer = p.produce(records, acks, deadline, now_ms()).await;
                        assert_eq!(answer.error, errors::NONE, "appended");
                    }
                }
                let open_before = shard.partitions.borrow().len();
                // Every log is due: written, not synced, its last flush long ago.
                let flushes = glommio::spawn_local({
                    let shard = shard.clone();
                    async move { shard.flush_and_retain(now_ms() + 120_000, false).await }
                });
                glommio::executor().yield_now().await;
                shard.close_idle().await;
                let open_after = shard.partitions.borrow().len();
                flushes.await;
                shard.close_all().await;
                (open_before, open_after)
            }
        });
        assert_eq!(open_before, OPEN_PER_SHARD_MIN);
        assert!(
            open_after < open_before,
            "idle logs closed while the flushes ran: {open_after} of {open_before} open"
        );
    }
}
