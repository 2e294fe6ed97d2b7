//! A shard: one glommio executor thread, pinned to a core, owning a subset of the
//! partitions (chosen by [`Router`]). Its state lives on that thread only.
//!
//! Work for a partition owned by another shard travels over two bounded glommio channel
//! meshes: requests ([`Envelope`]) to the owner, replies ([`ReplyEnvelope`]) back. A full
//! queue makes the sender wait (backpressure), it never drops. Each shard runs one inbox
//! task per peer; it handles at most [`INBOX_IN_FLIGHT_MAX`] requests from that peer at
//! once, then stops pulling, which pushes back on the peer's connections.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use bytes::BytesMut;
use glommio::channels::channel_mesh::{Receivers, Senders};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::sync::Semaphore;

use crate::config::Config;
use crate::errors;
use crate::event::Event;
use crate::metadata::{Catalog, MetaStore, is_internal};
use crate::partition::{FetchOutcome, Partition, ProduceOutcome, partition_dir};
use crate::router::{RouteRevision, Router, ShardId};
use crate::send_turns::SendTurns;

/// Requests from one peer shard handled concurrently before its inbox stops pulling.
pub const INBOX_IN_FLIGHT_MAX: u64 = 256;
/// Capacity of each mesh queue (per ordered pair of shards).
pub const MESH_QUEUE_CAPACITY: usize = 1024;

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

/// One partition read of a Fetch.
#[derive(Debug, Clone)]
pub struct FetchRead {
    pub tp: TopicPartition,
    pub offset: i64,
    pub max_bytes: usize,
}

/// A partition key: topic name and index.
pub type TopicPartition = (Arc<str>, i32);

/// Work for a partition's owning shard.
#[derive(Debug)]
pub enum Op {
    Produce {
        tp: TopicPartition,
        records: BytesMut,
    },
    /// Reads of several partitions owned by the same shard, in one message, in request
    /// order: together they return at most `budget_bytes` of records, except that with
    /// `exceed_once` the first partition with data returns its first batch whole even if
    /// it is larger (KIP-74: a fetch always makes progress).
    Fetch {
        reads: Vec<FetchRead>,
        budget_bytes: usize,
        exceed_once: bool,
    },
    /// Completes when any of `tps` has a high watermark above the given offset (at once
    /// if one already has), or after `timeout_ms`.
    Wait {
        tps: Vec<(TopicPartition, i64)>,
        timeout_ms: u64,
    },
    ListOffset {
        tp: TopicPartition,
        timestamp: i64,
    },
    DeleteRecords {
        tp: TopicPartition,
        offset: i64,
    },
    /// Bring the open partitions in line with the catalogue (open new, drop deleted).
    Sync,
    /// Work for the group coordinator hosted here (see `group`).
    Group(Box<crate::group::GroupCall>),
}

/// The owner's answer to an [`Op`].
#[derive(Debug)]
pub enum Reply {
    Produce(ProduceOutcome),
    /// One outcome per read, in order.
    Fetch(Vec<FetchOutcome>),
    Waited,
    ListOffset {
        error: i16,
        timestamp: i64,
        offset: i64,
    },
    DeleteRecords {
        error: i16,
        low_watermark: i64,
    },
    Synced,
    Group(Box<crate::group::GroupReply>),
    /// The op could not run here (unknown partition, wrong owner): a Kafka error code.
    Refused(i16),
}

/// A request crossing the mesh.
pub struct Envelope {
    pub from: ShardId,
    pub id: u64,
    pub revision: RouteRevision,
    pub op: Op,
}

/// A reply crossing back.
pub struct ReplyEnvelope {
    pub id: u64,
    pub reply: Reply,
}

/// Everything that is shared by all shards of the node (immutable or atomic).
pub struct NodeShared {
    pub config: Config,
    pub meta: MetaStore,
    /// Open client connections, all shards (for `max.connections`).
    pub connections: AtomicUsize,
    /// Shards that finished draining their connections during shutdown.
    pub drained: AtomicUsize,
    pub cluster_id: String,
}

/// The state of one shard.
pub struct Shard {
    pub id: ShardId,
    pub node: Arc<NodeShared>,
    pub router: Router,
    requests: Option<Senders<Envelope>>,
    replies: Option<Senders<ReplyEnvelope>>,
    pending: RefCell<HashMap<u64, LocalSender<Reply>>>,
    /// One FIFO turn per peer's request queue, so envelopes enter it in call order.
    send_turns: Vec<SendTurns>,
    next_id: Cell<u64>,
    catalog: RefCell<(u64, Arc<Catalog>)>,
    pub partitions: RefCell<HashMap<TopicPartition, Rc<Partition>>>,
    /// Partitions being opened or closed right now, so concurrent requests open each only
    /// once, and never while its log is still being closed.
    opening: RefCell<HashMap<TopicPartition, Rc<Event>>>,
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
            synced,
            open_max,
            use_clock: Cell::new(0),
            evicting: Cell::new(false),
            shutting_down: Cell::new(false),
            shutdown: Event::default(),
            open_connections: Cell::new(0),
            advertised,
            groups: Rc::default(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.node.config
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

    /// Runs `op` on the shard that owns its partition (or here for `Sync`/`Wait`
    /// addressed with `target`).
    pub async fn call(&self, target: ShardId, op: Op) -> Reply {
        if target == self.id {
            return self.exec(op).await;
        }
        let (Some(requests), Some(turns)) = (&self.requests, self.send_turns.get(target.0)) else {
            return Reply::Refused(errors::UNKNOWN_SERVER_ERROR);
        };
        let id = self.next_id.get();
        self.next_id.set(id.wrapping_add(1));
        let (tx, rx) = local_channel::new_bounded(1);
        self.pending.borrow_mut().insert(id, tx);
        let env = Envelope {
            from: self.id,
            id,
            revision: self.router.revision(),
            op,
        };
        // In call order even when the queue is full (see `send_turns`): one connection's
        // requests reach the owner in the order the client sent them.
        let sent = {
            let _turn = turns.wait().await;
            requests.send_to(target.0, env).await
        };
        if sent.is_err() {
            self.pending.borrow_mut().remove(&id);
            return Reply::Refused(errors::UNKNOWN_SERVER_ERROR);
        }
        rx.recv()
            .await
            .unwrap_or(Reply::Refused(errors::UNKNOWN_SERVER_ERROR))
    }

    /// Runs `op` on the owner of `tp`.
    pub async fn call_owner(&self, tp: &TopicPartition, op: Op) -> Reply {
        let owner = self.router.owner(&tp.0, tp.1);
        self.call(owner, op).await
    }

    /// Executes an op on this shard (the owner).
    pub async fn exec(&self, op: Op) -> Reply {
        match op {
            Op::Produce { tp, records } => match self.partition(&tp).await {
                Ok(p) => Reply::Produce(p.produce(records, now_ms()).await),
                Err(code) => Reply::Refused(code),
            },
            Op::Fetch {
                reads,
                budget_bytes,
                exceed_once,
            } => Reply::Fetch(self.fetch_many(reads, budget_bytes, exceed_once).await),
            Op::Wait { tps, timeout_ms } => {
                self.wait_for_append(&tps, timeout_ms).await;
                Reply::Waited
            }
            Op::ListOffset { tp, timestamp } => match self.partition(&tp).await {
                Ok(p) => {
                    let (error, timestamp, offset) = p.list_offset(timestamp).await;
                    Reply::ListOffset {
                        error,
                        timestamp,
                        offset,
                    }
                }
                Err(code) => Reply::Refused(code),
            },
            Op::DeleteRecords { tp, offset } => match self.partition(&tp).await {
                Ok(p) => {
                    let (error, low_watermark) = p.delete_records(offset).await;
                    Reply::DeleteRecords {
                        error,
                        low_watermark,
                    }
                }
                Err(code) => Reply::Refused(code),
            },
            Op::Sync => {
                self.sync_partitions().await;
                Reply::Synced
            }
            Op::Group(call) => {
                let groups = self.groups.clone();
                Reply::Group(Box::new(groups.exec(self, *call).await))
            }
        }
    }

    /// Reads local partitions one after another in request order, each limited by what
    /// is left of `budget_bytes`, so nothing is read that the response will not carry
    /// (see [`Op::Fetch`]). A partition reached with no budget left is not read at all.
    async fn fetch_many(
        &self,
        reads: Vec<FetchRead>,
        budget_bytes: usize,
        exceed_once: bool,
    ) -> Vec<FetchOutcome> {
        let mut left = budget_bytes;
        let mut exceed = exceed_once;
        let mut out = Vec::with_capacity(reads.len());
        for r in reads {
            let hard_max_bytes = if exceed { usize::MAX } else { left };
            let outcome = match self.partition(&r.tp).await {
                Ok(p) => {
                    let max_bytes = r.max_bytes.min(left);
                    p.fetch_within(r.offset, max_bytes, hard_max_bytes).await
                }
                Err(code) => FetchOutcome::refused(code),
            };
            let got = outcome.bytes();
            assert!(exceed || got <= left, "read {got} bytes with {left} left");
            exceed &= got == 0;
            left = left.saturating_sub(got);
            out.push(outcome);
        }
        out
    }

    /// Waits until one of the local partitions in `tps` is appended to, or the timeout.
    async fn wait_for_append(&self, tps: &[(TopicPartition, i64)], timeout_ms: u64) {
        // Through `partition`: a log closed as idle since the fetch read it reopens, so
        // its appends still wake this wait.
        let mut parts: Vec<Rc<Partition>> = Vec::with_capacity(tps.len());
        let mut ready = false;
        for (tp, offset) in tps {
            if let Ok(p) = self.partition(tp).await {
                ready |= p.high_watermark().get() > *offset;
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
        let timeout = glommio::timer::sleep(Duration::from_millis(timeout_ms));
        let shutdown = self.shutdown.listen();
        futures_lite::future::or(
            any,
            futures_lite::future::or(
                async {
                    timeout.await;
                },
                shutdown,
            ),
        )
        .await;
    }

    /// The open partition `tp`, opening it if the catalogue has it and this shard owns it.
    pub async fn partition(&self, tp: &TopicPartition) -> Result<Rc<Partition>, i16> {
        if self.router.owner(&tp.0, tp.1) != self.id {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        for _ in 0..2 {
            if let Some(p) = self.partitions.borrow().get(tp) {
                self.touch(p);
                return Ok(p.clone());
            }
            let catalog = self.catalog();
            let Some(meta) = catalog.topics.get(&*tp.0) else {
                return Err(errors::UNKNOWN_TOPIC_OR_PARTITION);
            };
            if tp.1 < 0 || tp.1 >= meta.partitions {
                return Err(errors::UNKNOWN_TOPIC_OR_PARTITION);
            }
            let meta = meta.clone();
            self.open_partition(tp, meta.id, &meta.configs).await?;
        }
        self.partitions
            .borrow()
            .get(tp)
            .cloned()
            .ok_or(errors::UNKNOWN_TOPIC_OR_PARTITION)
    }

    async fn open_partition(
        &self,
        tp: &TopicPartition,
        topic_id: u128,
        overrides: &BTreeMap<String, String>,
    ) -> Result<(), i16> {
        let waiting = self.opening.borrow().get(tp).cloned();
        if let Some(ev) = waiting {
            ev.listen().await;
            return Ok(());
        }
        if self.partitions.borrow().len() >= self.open_max {
            self.close_idle().await;
        }
        // Closing idle logs waited: another request may have started opening this one.
        let opened_meanwhile = self.opening.borrow().get(tp).cloned();
        if let Some(ev) = opened_meanwhile {
            ev.listen().await;
            return Ok(());
        }
        let ev = Rc::new(Event::default());
        self.opening.borrow_mut().insert(tp.clone(), ev.clone());
        let configs = self.topic_configs(overrides);
        let data_dir = self.config().data_dir.clone();
        let opened = Partition::open(&data_dir, tp.0.clone(), tp.1, topic_id, configs).await;
        self.opening.borrow_mut().remove(tp);
        ev.notify_all();
        match opened {
            Ok(p) => {
                let p = Rc::new(p);
                self.touch(&p);
                self.apply_newest_configs(tp, &p);
                self.partitions.borrow_mut().insert(tp.clone(), p);
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
            p.appended.notify_all();
            if let Err(e) = p.log.delete().await {
                tracing::warn!(topic = %tp.0, partition = tp.1, "deleting partition: {e}");
            }
        }
        for (name, old) in previous.topics.iter() {
            let gone = catalog.topics.get(name).is_none_or(|t| t.id != old.id);
            if gone {
                self.remove_unopened(name, old.partitions).await;
            }
        }
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
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(topic = %name, partition = index, "deleting partition: {e}");
                }
            }
        }
    }

    /// Asks every shard (including this one) to sync with the catalogue, and waits.
    pub async fn sync_all(&self) {
        let calls = (0..self.router.shards()).map(|s| self.call(ShardId(s), Op::Sync));
        for call in calls {
            call.await;
        }
    }

    /// Serves requests from peer `from` until the mesh closes.
    pub async fn run_inbox(self: Rc<Self>, mut receivers: Receivers<Envelope>) {
        let streams = receivers.streams();
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|(peer, rx)| {
                let shard = self.clone();
                glommio::spawn_local(async move {
                    let permits = Rc::new(Semaphore::new(INBOX_IN_FLIGHT_MAX));
                    while let Some(env) = rx.recv().await {
                        // A long-poll wait holds no permit: it is cheap, and parked waits
                        // must not hold back the peer's produces and reads. Their number
                        // is bounded by the peer's in-flight requests.
                        let permit = if matches!(env.op, Op::Wait { .. }) {
                            None
                        } else {
                            match permits.clone().acquire_static_permit(1).await {
                                Ok(p) => Some(p),
                                Err(_) => break,
                            }
                        };
                        let shard = shard.clone();
                        glommio::spawn_local(async move {
                            shard.serve_envelope(env).await;
                            drop(permit);
                        })
                        .detach();
                    }
                    tracing::debug!(shard = %shard.id, peer, "inbox closed");
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
    }

    async fn serve_envelope(&self, env: Envelope) {
        let reply = if env.revision != self.router.revision() {
            Reply::Refused(errors::NOT_LEADER_OR_FOLLOWER)
        } else {
            self.exec(env.op).await
        };
        if let Some(replies) = &self.replies {
            let _ = replies
                .send_to(env.from.0, ReplyEnvelope { id: env.id, reply })
                .await;
        }
    }

    /// Delivers replies from peers to the waiting callers.
    pub async fn run_replies(self: Rc<Self>, mut receivers: Receivers<ReplyEnvelope>) {
        let tasks: Vec<_> = receivers
            .streams()
            .into_iter()
            .map(|(_, rx)| {
                let shard = self.clone();
                glommio::spawn_local(async move {
                    while let Some(env) = rx.recv().await {
                        let waiter = shard.pending.borrow_mut().remove(&env.id);
                        if let Some(tx) = waiter {
                            let _ = tx.try_send(env.reply);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
    }

    /// Periodic per-shard housekeeping: retention and interval flushes.
    pub async fn run_housekeeping(self: Rc<Self>) {
        let interval_ms = self
            .config()
            .retention_check_interval_ms
            .clamp(100, 3_600_000);
        let mut last_retention = now_ms();
        let cleaner = self.config().log_cleaner;
        let (cleaner_budget, mut last_clean) = (cleaner.shard_budget(self.config().shards), 0);
        while !self.shutting_down.get() {
            let tick = glommio::timer::sleep(Duration::from_millis(1000.min(interval_ms)));
            futures_lite::future::or(
                async {
                    tick.await;
                },
                self.shutdown.listen(),
            )
            .await;
            if self.shutting_down.get() {
                break;
            }
            let parts: Vec<Rc<Partition>> = self.partitions.borrow().values().cloned().collect();
            let now = now_ms();
            let retention_due = now - last_retention >= interval_ms as i64;
            let clean_due = cleaner.enable && now - last_clean >= cleaner.backoff_ms as i64;
            for p in parts {
                if let Err(e) = p.log.flush_if_due(now).await {
                    tracing::warn!(topic = %p.topic, partition = p.index, "flush: {e}");
                }
                if retention_due {
                    apply_retention(&p, now).await;
                }
                if clean_due {
                    clean_log(&p, now, &cleaner_budget).await;
                }
            }
            if clean_due {
                last_clean = now;
            }
            if retention_due {
                self.retain_unopened(now).await;
                last_retention = now;
            }
            crate::api::fetch_budget::trim_shard_heap_if_idle();
        }
    }

    /// Retention for the partitions this shard owns that are not open (logs open on first
    /// use, and idle ones close past `max.open.partitions`): those holding a sealed segment
    /// on disk are opened (the open budget closes idle ones again) and retained. A log with
    /// only its active segment has nothing retention could delete, so most idle partitions
    /// cost one directory listing, done off the shard's thread.
    async fn retain_unopened(&self, now: i64) {
        let candidates = self.unopened_partitions();
        if candidates.is_empty() {
            return;
        }
        let data_dir = self.config().data_dir.clone();
        let sealed = glommio::executor()
            .spawn_blocking(move || {
                candidates
                    .into_iter()
                    .filter(|tp| has_sealed_segment(&partition_dir(&data_dir, &tp.0, tp.1)))
                    .collect::<Vec<_>>()
            })
            .await;
        for tp in sealed {
            if self.shutting_down.get() {
                return;
            }
            if let Ok(p) = self.partition(&tp).await {
                apply_retention(&p, now).await;
            }
        }
    }

    /// Partitions of user topics this shard owns whose logs are not open now.
    fn unopened_partitions(&self) -> Vec<TopicPartition> {
        let catalog = self.catalog();
        let open = self.partitions.borrow();
        let mut out = Vec::new();
        for (name, meta) in catalog.topics.iter().filter(|(n, _)| !is_internal(n)) {
            let topic: Arc<str> = Arc::from(name.as_str());
            for index in 0..meta.partitions {
                let tp = (topic.clone(), index);
                if self.router.owner(name, index) == self.id && !open.contains_key(&tp) {
                    out.push(tp);
                }
            }
        }
        out
    }

    /// Closes every partition log (flush, clean-shutdown marker), a bounded number at once.
    pub async fn close_all(&self) {
        let parts: Vec<(TopicPartition, Rc<Partition>)> =
            self.partitions.borrow_mut().drain().collect();
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
        self.shutdown.notify_all();
        for p in self.partitions.borrow().values() {
            p.appended.notify_all();
        }
    }
}

/// Runs all `futures` concurrently on this task; returns when every one has finished.
async fn join_all<F: Future<Output = O> + Unpin, O>(mut futures: Vec<F>) -> Vec<O> {
    let mut done: Vec<Option<O>> = futures.iter().map(|_| None).collect();
    futures_lite::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futures.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match std::pin::Pin::new(&mut *f).poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// Applies retention to one open log, logging what it did.
async fn apply_retention(p: &Partition, now: i64) {
    match p.log.apply_retention(now).await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(topic = %p.topic, partition = p.index, "retention deleted {n} segments")
        }
        Err(e) => tracing::warn!(topic = %p.topic, partition = p.index, "retention: {e}"),
    }
}

/// Compacts a `cleanup.policy=compact` log if it is due (storage/cleaner.rs).
async fn clean_log(p: &Partition, now: i64, budget: &crate::storage::CleanerBudget) {
    match p.log.clean_if_due(now, budget).await {
        Ok(s) if s.rounds == 0 => {}
        Ok(s) => tracing::info!(
            topic = %p.topic, partition = p.index, segments = s.segments_swapped,
            bytes_before = s.bytes_before, bytes_after = s.bytes_after,
            records_removed = s.records_removed, ms = s.elapsed.as_millis() as u64,
            "log cleaner compacted"
        ),
        Err(e) => tracing::warn!(topic = %p.topic, partition = p.index, "log cleaner: {e}"),
    }
}

/// Whether a partition directory holds more than its active segment (two `.log` files or
/// more); a missing directory holds none.
fn has_sealed_segment(dir: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .nth(1)
        .is_some()
}
