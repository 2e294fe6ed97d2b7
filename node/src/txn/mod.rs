//! The transaction coordinator (KIP-98): transactional ids, their producer ids and epochs,
//! and each transaction's partitions, through Kafka's states (see [`state`]).
//!
//! A transactional id hashes (Kafka's rule, as group ids: `abs(id.hashCode) % partitions`)
//! to one partition of `__transaction_state`; the shard that owns that partition hosts it,
//! in [`Coordinators`] (a field of the shard), with the group coordinator's hosting
//! machinery (`crate::coordinator`: partitions loaded and replayed once, appends).
//!
//! Every state change is appended to the partition (Kafka's key/value, [`schema`]) before
//! it is acted on: EndTxn writes PrepareCommit/PrepareAbort, then a marker to every
//! partition of the transaction (through `WriteMarkerCall`, on each partition's shard),
//! then CompleteCommit/CompleteAbort. On first use after a start, a partition is replayed
//! (latest value per id wins) to its log end; a transaction found in Prepare* has its
//! markers written again as soon as the HW covers what was read (a state read past the
//! HW may yet be lost with this node's lead), as Kafka completes them on load, not at
//! the ticker's next round (markers are idempotent for the partitions: a second one
//! closes nothing). An
//! Ongoing one continues: its producer may go on with it, or `transaction.timeout.ms`
//! after it began the ticker aborts it, with the producer's epoch bumped (fenced), as
//! Kafka's coordinator does.
//!
//! One request per transactional id at a time: a second one meanwhile (or the ticker)
//! gets CONCURRENT_TRANSACTIONS, which clients retry. A KIP-890 check meanwhile reads
//! the state in memory, but answers CONCURRENT_TRANSACTIONS while a write that ends the
//! transaction or the epoch waits for replication (see `Coordinators::verify`).
//!
//! An id with no transaction open or ending and unused for `transactional.id.expiration.ms`
//! is removed by the ticker, as Kafka's coordinator does: a tombstone is written, then
//! the id forgotten (a replay drops it too). Clients such as Flink's exactly-once sink
//! use new ids all the time; without it they would be kept forever.
//!
//! In a cluster `__transaction_state` is replicated (`transaction.state.log.replication.factor`,
//! `transaction.state.log.min.isr`) and the coordinator moves with its partition's leader:
//! loaded (replayed) when this node becomes the leader, unloaded when it stops leading,
//! NOT_COORDINATOR on a node that does not lead it; every state write is acknowledged once
//! replicated, so the next leader finishes (Prepare*) or times out (Ongoing) what this one
//! left. Markers go to each partition's leader (`MarkerWriter`): this node's owning
//! shard, or the node leading it (WriteTxnMarkers).

pub mod schema;
pub mod state;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wire::batch::batch_records;
use wire::{Offset, ProducerEpoch, ProducerId};

use crate::coordinator::{Led, PartitionLoads, append_contiguous, batch_bytes_max, build_batches};
use crate::errors;
use crate::partition::Partition;
use crate::producer_state::partition::Marker;
use crate::shard::context::{MarkerWriter, ServiceContext};
use crate::shard::now_ms;
use state::{EndDecision, TxnMetadata, TxnState};

/// The internal topic holding the transaction log.
pub const TXN_TOPIC: &str = "__transaction_state";
/// Most decompressed bytes one batch may have during replay.
const REPLAY_DECOMPRESSED_MAX: usize = 64 << 20;
/// Attempts to write one marker before the transaction is left to the ticker.
const MARKER_ATTEMPTS_MAX: u32 = 20;
/// Markers of one transaction written at once (each to another partition; a remote
/// leader's over a connection of its own, so with [`TICK_CONCURRENT_MAX`] this bounds
/// the connections a shard's ticker opens at once: 256).
const MARKERS_CONCURRENT_MAX: usize = 16;
/// Pause between marker attempts.
const MARKER_RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// How long one marker call may take.
const MARKER_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest transactional id: what `__transaction_state`'s int16-length strings hold (Kafka
/// refuses only an empty one).
pub const TRANSACTIONAL_ID_MAX_BYTES: usize = i16::MAX as usize;
/// Epochs above this start a new producer id instead (Kafka: `Short.MaxValue - 1`).
const EPOCH_MAX: i16 = i16::MAX - 1;
/// Tries to claim a transactional id found in Prepare* at load while a request holds it
/// (a retried EndTxn is answered at once); after them the ticker finishes it.
const RESUME_CLAIM_TRIES: u32 = 50;
/// Pause between those tries (with the tries: five seconds).
const RESUME_CLAIM_BACKOFF: Duration = Duration::from_millis(100);
/// How long a request that must finish a transaction found in Prepare* at load waits
/// for the HW to cover the loaded log (COORDINATOR_LOAD_IN_PROGRESS after, retried).
const LOADED_HW_WAIT: Duration = Duration::from_secs(10);
/// One round of the wait of a load's own resumption for the HW to cover the loaded log.
const RESUME_HW_WAIT: Duration = Duration::from_secs(30);
/// Rounds of [`RESUME_HW_WAIT`] before the resumption leaves the transaction to the
/// ticker (which finishes it once the HW covers the load).
const RESUME_HW_ROUNDS_MAX: u32 = 20;
/// Most transactions the ticker ends at once; the rest wait for its next round. Each
/// runs in a task of its own: one whose markers hang on an unreachable leader (up to
/// [`MARKER_ATTEMPTS_MAX`] calls of [`MARKER_CALL_TIMEOUT`]) does not hold up the others,
/// whose partitions' LSO (and every read_committed consumer of them) waits for their abort.
const TICK_CONCURRENT_MAX: usize = 16;
/// Most tombstones of expired transactional ids one append carries (ids of up to 32 KiB:
/// a pass that finds many writes them in several appends, not one huge one).
const EXPIRE_APPEND_IDS_MAX: usize = 500;

/// Coordinator settings, under Kafka's keys.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `transaction.state.log.num.partitions`.
    pub num_partitions: i32,
    /// `transaction.state.log.segment.bytes`.
    pub segment_bytes: i64,
    /// `transaction.state.log.replication.factor` (Kafka's default 3; capped at the live
    /// nodes when the topic is created, so 1 on a single node).
    pub replication_factor: i16,
    /// `transaction.state.log.min.isr`: the topic's `min.insync.replicas` (Kafka's
    /// default 2; capped at the replication factor).
    pub min_isr: i32,
    /// `transaction.max.timeout.ms`: a client's `transaction.timeout.ms` above it is
    /// refused with INVALID_TRANSACTION_TIMEOUT.
    pub max_timeout_ms: i32,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`.
    pub abort_check_ms: u64,
    /// `transactional.id.expiration.ms`: an id with no transaction open or ending and
    /// no change for this long is removed (a tombstone in its partition).
    pub id_expiration_ms: i64,
    /// `transaction.remove.expired.transaction.cleanup.interval.ms`: how often the
    /// ticker looks for expired ids.
    pub expire_check_ms: u64,
}

impl Settings {
    pub fn from_config(config: &crate::config::Config) -> Settings {
        let num = |key: &str, default: i64| -> i64 {
            config
                .props
                .get(key)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(default)
        };
        Settings {
            num_partitions: num("transaction.state.log.num.partitions", 50).clamp(1, 1000) as i32,
            segment_bytes: num("transaction.state.log.segment.bytes", 104_857_600).max(1 << 14),
            replication_factor: num("transaction.state.log.replication.factor", 3).clamp(1, 255)
                as i16,
            min_isr: num("transaction.state.log.min.isr", 2).clamp(1, 255) as i32,
            max_timeout_ms: num("transaction.max.timeout.ms", 900_000).clamp(1, i64::from(i32::MAX))
                as i32,
            abort_check_ms: num(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                10_000,
            )
            .clamp(10, 3_600_000) as u64,
            id_expiration_ms: num("transactional.id.expiration.ms", 604_800_000)
                .clamp(1, i64::from(i32::MAX)),
            expire_check_ms: num(
                "transaction.remove.expired.transaction.cleanup.interval.ms",
                3_600_000,
            )
            .clamp(10, i64::from(i32::MAX)) as u64,
        }
    }
}

/// Work for the coordinator of one transactional id (or, for `List`, all of a shard).
#[derive(Debug, Clone)]
pub enum TxnOp {
    /// InitProducerId with a transactional id. `producer`: the id and epoch a v3+ client
    /// sends to bump its epoch (KIP-360), if any.
    InitProducerId {
        txn_id: String,
        timeout_ms: i32,
        producer: Option<(ProducerId, ProducerEpoch)>,
        version: i16,
    },
    /// AddPartitionsToTxn / AddOffsetsToTxn (the group's `__consumer_offsets` partition);
    /// `verify_only` (KIP-890): only check that they are in the ongoing transaction.
    AddPartitions {
        txn_id: String,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        partitions: Vec<(String, i32)>,
        verify_only: bool,
    },
    EndTxn {
        txn_id: String,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        commit: bool,
    },
    Describe {
        txn_id: String,
    },
    List,
}

impl TxnOp {
    fn txn_id(&self) -> Option<&str> {
        match self {
            TxnOp::InitProducerId { txn_id, .. }
            | TxnOp::AddPartitions { txn_id, .. }
            | TxnOp::EndTxn { txn_id, .. }
            | TxnOp::Describe { txn_id } => Some(txn_id),
            TxnOp::List => None,
        }
    }
}

/// A [`TxnOp`] addressed to the coordinator of `partition` of `__transaction_state`.
#[derive(Debug, Clone)]
pub struct TxnCall {
    pub partition: i32,
    pub op: TxnOp,
}

/// The coordinator's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnReply {
    Producer {
        error: i16,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
    },
    /// One code for the request.
    Code(i16),
    /// One code per partition, in request order.
    Partitions(Vec<i16>),
    Described(i16, Option<TxnMetadata>),
    /// (transactional id, producer id, state) of every transaction on the shard.
    Listed(Vec<(String, ProducerId, &'static str)>),
}

impl TxnReply {
    fn producer_error(error: i16) -> TxnReply {
        TxnReply::Producer {
            error,
            producer_id: ProducerId::NONE,
            producer_epoch: ProducerEpoch(-1),
        }
    }
}

/// The partition of `__transaction_state` holding `txn_id` (Kafka's hash).
pub fn partition_for(txn_id: &str, partitions: i32) -> i32 {
    crate::group::partition_for(txn_id, partitions)
}

/// The transaction coordinator state of one shard.
#[derive(Default)]
pub struct Coordinators {
    txns: RefCell<HashMap<String, TxnMetadata>>,
    partitions: PartitionLoads,
    /// Transactional ids with a request (or the ticker) at work on them.
    busy: RefCell<HashSet<String>>,
    settings: OnceCell<Settings>,
    markers: OnceCell<MarkerWriter>,
    ticker_started: Cell<bool>,
    /// Transactions the ticker is ending now (each in a task of its own).
    ticking: Cell<usize>,
    /// How many partitions `__transaction_state` has (from the catalogue, at load).
    topic_partitions: Cell<i32>,
    /// Transactional ids found in Prepare* by a replay, whose markers are still to be
    /// written (see [`Coordinators::resume_loaded`]).
    to_resume: RefCell<Vec<String>>,
    /// Each loaded partition's log end at load, until its HW covers it: a replay reads to
    /// the log end (`crate::coordinator::replay_batches`), and a Prepare* state read past
    /// the HW may not survive this node's leadership (a next leader without it would time
    /// out, and abort, a transaction whose COMMIT markers were written). No markers for a
    /// loaded Prepare* state before the HW reaches it (Kafka's load has the same gap).
    loaded_ends: RefCell<HashMap<i32, Offset>>,
    /// State transitions appended and not yet replicated (so not yet the state), by
    /// transactional id, with the state each makes (Kafka's `pendingState`). At most one
    /// per id: a request holds the id while it writes.
    transitions: RefCell<HashMap<String, TxnState>>,
}

/// Marks a transition of an id as written and not yet applied while alive.
struct Transition<'a> {
    set: &'a RefCell<HashMap<String, TxnState>>,
    id: &'a str,
}

impl Drop for Transition<'_> {
    fn drop(&mut self) {
        self.set.borrow_mut().remove(self.id);
    }
}

/// Marks a transactional id busy while alive.
/// One of the ticker's transactions being ended: counted out when its task ends.
struct Ticking<'a>(&'a Cell<usize>);

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

struct Busy<'a> {
    set: &'a RefCell<HashSet<String>>,
    id: String,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.set.borrow_mut().remove(&self.id);
    }
}

impl Coordinators {
    /// Runs a call on this shard (the owner of the call's partition).
    pub async fn exec(
        self: &Rc<Self>,
        ctx: &ServiceContext<'_>,
        markers: MarkerWriter,
        call: TxnCall,
    ) -> TxnReply {
        let settings = *self
            .settings
            .get_or_init(|| Settings::from_config(ctx.config()));
        let _ = self.markers.set(markers);
        self.start_ticker(settings);
        // Served only while this node leads the partition (NOT_COORDINATOR otherwise).
        self.drop_stale();
        if let TxnOp::List = call.op {
            let listed = self.list(ctx).await;
            self.resume_loaded();
            return listed;
        }
        if !ctx.owns(TXN_TOPIC, call.partition) {
            return TxnReply::Code(errors::NOT_COORDINATOR);
        }
        let part = match self.load(ctx, call.partition).await {
            Ok(p) => p,
            Err(code) => return TxnReply::Code(code),
        };
        self.resume_loaded();
        let Some(id) = call.op.txn_id().map(str::to_string) else {
            return TxnReply::Code(errors::INVALID_REQUEST);
        };
        // A verification only reads (KIP-890): it never waits for, or blocks, the id.
        if let TxnOp::AddPartitions {
            producer_id,
            producer_epoch,
            partitions,
            verify_only: true,
            ..
        } = &call.op
        {
            return self.verify(&id, (*producer_id, *producer_epoch), partitions);
        }
        if let TxnOp::Describe { .. } = call.op {
            let found = self.txns.borrow().get(&id).cloned();
            let code = if found.is_some() {
                errors::NONE
            } else {
                errors::TRANSACTIONAL_ID_NOT_FOUND
            };
            return TxnReply::Described(code, found);
        }
        let Some(_busy) = self.claim(&id) else {
            return match call.op {
                TxnOp::InitProducerId { .. } => {
                    TxnReply::producer_error(errors::CONCURRENT_TRANSACTIONS)
                }
                _ => TxnReply::Code(errors::CONCURRENT_TRANSACTIONS),
            };
        };
        self.run(ctx, &part, &settings, &id, call.op).await
    }

    /// Runs a state-changing op on `id` (claimed by the caller).
    async fn run(
        &self,
        ctx: &ServiceContext<'_>,
        part: &Led,
        settings: &Settings,
        id: &str,
        op: TxnOp,
    ) -> TxnReply {
        match op {
            TxnOp::InitProducerId {
                timeout_ms,
                producer,
                version,
                ..
            } => {
                self.init_producer_id(ctx, part, settings, id, timeout_ms, producer, version)
                    .await
            }
            TxnOp::AddPartitions {
                producer_id,
                producer_epoch,
                partitions,
                verify_only,
                ..
            } => {
                let producer = (producer_id, producer_epoch);
                self.add_partitions(part, id, producer, partitions, verify_only)
                    .await
            }
            TxnOp::EndTxn {
                producer_id,
                producer_epoch,
                commit,
                ..
            } => {
                let producer = (producer_id, producer_epoch);
                TxnReply::Code(self.end_txn(part, id, producer, commit).await)
            }
            TxnOp::Describe { .. } | TxnOp::List => TxnReply::Code(errors::INVALID_REQUEST),
        }
    }

    /// Loads partition `index` and starts the ticker (at shard start).
    pub async fn load_owned(
        self: &Rc<Self>,
        ctx: &ServiceContext<'_>,
        markers: MarkerWriter,
        index: i32,
    ) -> Result<(), i16> {
        let settings = *self
            .settings
            .get_or_init(|| Settings::from_config(ctx.config()));
        let _ = self.markers.set(markers);
        self.start_ticker(settings);
        self.drop_stale();
        let loaded = self.load(ctx, index).await.map(|_| ());
        self.resume_loaded();
        loaded
    }

    /// Finishes, at once, the transactions a replay found in Prepare* (Kafka's
    /// coordinator completes them on load): their markers are written and Complete*
    /// logged by a task of their own, not at the ticker's next round
    /// (`transaction.abort.timed.out.transaction.cleanup.interval.ms`, 10 s by default),
    /// while their partitions' last stable offsets, and every read_committed consumer
    /// of them, wait.
    fn resume_loaded(self: &Rc<Self>) {
        let ids = std::mem::take(&mut *self.to_resume.borrow_mut());
        if ids.is_empty() {
            return;
        }
        let me = self.clone();
        glommio::spawn_local(async move {
            for id in ids {
                me.resume(&id).await;
            }
        })
        .detach();
    }

    /// Finishes `id` if it is still ending; while a request holds it, tries again a
    /// bounded number of times (then the ticker does).
    async fn resume(&self, id: &str) {
        if !self.resume_when_replicated(id).await {
            return;
        }
        for _ in 0..RESUME_CLAIM_TRIES {
            if self.finish_due(id, now_ms()).await {
                return;
            }
            glommio::timer::sleep(RESUME_CLAIM_BACKOFF).await;
        }
        tracing::info!(
            transactional_id = id,
            "ending transaction busy since load: left to the ticker"
        );
    }

    /// Waits, in bounded rounds, until the HW of `id`'s partition covers what its load
    /// read: only then are the markers of a Prepare* state it found written. False if
    /// this node stopped leading it, or the rounds ran out (the ticker then finishes it
    /// once the HW covers the load).
    async fn resume_when_replicated(&self, id: &str) -> bool {
        for _ in 0..RESUME_HW_ROUNDS_MAX {
            let Some(part) = self.partition_of(id) else {
                return false;
            };
            match self.await_loaded(&part, RESUME_HW_WAIT).await {
                Ok(()) => return true,
                Err(errors::NOT_COORDINATOR) => return false,
                Err(_) => {}
            }
        }
        tracing::warn!(
            transactional_id = id,
            "ending transaction found at load: the HW has not reached the loaded log; left to the ticker"
        );
        false
    }

    /// Whether the HW of `part` covers the log its load read (a write of this
    /// coordinator's since, replicated, covers it too).
    fn loaded_covered(&self, part: &Led) -> bool {
        let end = self.loaded_ends.borrow().get(&part.index).copied();
        end.is_none_or(|end| part.high_watermark() >= end)
    }

    /// Waits at most `wait` until the HW of `part` covers the log its load read.
    /// COORDINATOR_LOAD_IN_PROGRESS if it does not by then (the caller retries),
    /// NOT_COORDINATOR once this node stopped leading the partition.
    async fn await_loaded(&self, part: &Led, wait: Duration) -> Result<(), i16> {
        let Some(end) = self.loaded_ends.borrow().get(&part.index).copied() else {
            return Ok(());
        };
        if part.high_watermark() < end {
            let code = part.await_replicated(part.epoch(), end, wait).await;
            if code == errors::NOT_LEADER_OR_FOLLOWER || !part.leads() {
                return Err(errors::NOT_COORDINATOR);
            }
            // A shrunken ISR answers NOT_ENOUGH_REPLICAS_AFTER_APPEND even with the HW
            // past the end: the HW is what counts here.
            if part.high_watermark() < end {
                return Err(errors::COORDINATOR_LOAD_IN_PROGRESS);
            }
        }
        // Covered for good (the HW never goes back while this leadership lasts).
        let mut ends = self.loaded_ends.borrow_mut();
        if ends.get(&part.index) == Some(&end) {
            ends.remove(&part.index);
        }
        Ok(())
    }

    /// Whether partition `index` is loaded or being loaded.
    pub fn is_loaded(&self, index: i32) -> bool {
        self.partitions.is_loaded(index)
    }

    /// Unloads every partition this node no longer leads (under the epoch it was loaded
    /// at): its transactional ids are dropped, so the ticker no longer times them out or
    /// finishes them — the new leader's coordinator does, from the replicated log. A
    /// request still at work on one ends with its write refused (NOT_COORDINATOR).
    pub fn drop_stale(&self) {
        for index in self.partitions.stale() {
            let partitions = self.topic_partitions.get();
            let dropped = {
                let mut txns = self.txns.borrow_mut();
                let before = txns.len();
                txns.retain(|id, _| partition_for(id, partitions) != index);
                before - txns.len()
            };
            self.partitions.unload(index);
            self.loaded_ends.borrow_mut().remove(&index);
            tracing::info!(
                partition = index,
                transactional_ids = dropped,
                "unloaded transaction coordinator state: no longer the partition's leader"
            );
        }
    }

    fn claim(&self, id: &str) -> Option<Busy<'_>> {
        if !self.busy.borrow_mut().insert(id.to_string()) {
            return None;
        }
        Some(Busy {
            set: &self.busy,
            id: id.to_string(),
        })
    }

    /// InitProducerId: a new producer id for a new transactional id, else the next epoch
    /// of its producer id (fencing the previous instance); an ongoing transaction of the
    /// previous instance is aborted first, its markers written with the bumped epoch.
    #[allow(clippy::too_many_arguments)]
    async fn init_producer_id(
        &self,
        ctx: &ServiceContext<'_>,
        part: &Led,
        s: &Settings,
        id: &str,
        timeout_ms: i32,
        producer: Option<(ProducerId, ProducerEpoch)>,
        version: i16,
    ) -> TxnReply {
        if timeout_ms <= 0 || timeout_ms > s.max_timeout_ms {
            return TxnReply::producer_error(errors::INVALID_TRANSACTION_TIMEOUT);
        }
        let now = now_ms();
        let existing = self.txns.borrow().get(id).cloned();
        let next = match existing {
            None => match fresh_producer_id(ctx, version).await {
                Ok(pid) => TxnMetadata::empty(pid, ProducerEpoch(0), timeout_ms, now),
                Err(code) => return TxnReply::producer_error(code),
            },
            Some(m) => {
                if let Some((pid, epoch)) = producer {
                    if m.is_init_retry(pid, epoch) {
                        return TxnReply::Producer {
                            error: errors::NONE,
                            producer_id: m.producer_id,
                            producer_epoch: m.producer_epoch,
                        };
                    }
                    if pid != m.producer_id || epoch != m.producer_epoch {
                        return TxnReply::producer_error(fenced_code(version));
                    }
                }
                let m = match self.finish_open(part, id, m).await {
                    Ok(m) => m,
                    Err(code) => return TxnReply::producer_error(code),
                };
                match bump(ctx, &m, timeout_ms, now, version).await {
                    Ok(mut next) => {
                        next.bumped_from = producer;
                        next
                    }
                    Err(code) => return TxnReply::producer_error(code),
                }
            }
        };
        if let Err(code) = self.store(part, id, &next).await {
            return TxnReply::producer_error(code);
        }
        TxnReply::Producer {
            error: errors::NONE,
            producer_id: next.producer_id,
            producer_epoch: next.producer_epoch,
        }
    }

    /// Before a new epoch: a transaction still open is aborted (fencing its producer with
    /// the next epoch) or, if it was already ending, its markers are finished.
    async fn finish_open(&self, part: &Led, id: &str, m: TxnMetadata) -> Result<TxnMetadata, i16> {
        match m.state {
            TxnState::Ongoing => self.fence_abort(part, id, m).await,
            TxnState::PrepareCommit | TxnState::PrepareAbort => self.complete(part, id, m).await,
            _ => Ok(m),
        }
    }

    /// Aborts an ongoing transaction with the producer's epoch bumped, so that the
    /// producer (a zombie, or one silent past its timeout) is fenced.
    async fn fence_abort(&self, part: &Led, id: &str, m: TxnMetadata) -> Result<TxnMetadata, i16> {
        let now = now_ms();
        let mut fenced = m.prepare(false, now);
        fenced.bumped_from = None;
        // Up to i16::MAX (Kafka's `prepareFenceProducerEpoch`): the timed-out producer is
        // fenced even at the last epoch InitProducerId gives out; its next
        // InitProducerId then gets a new producer id.
        if m.producer_epoch.get() < i16::MAX {
            fenced.producer_epoch = ProducerEpoch(m.producer_epoch.get() + 1);
        }
        self.store(part, id, &fenced).await?;
        self.complete(part, id, fenced).await
    }

    async fn add_partitions(
        &self,
        part: &Led,
        id: &str,
        producer: (ProducerId, ProducerEpoch),
        partitions: Vec<(String, i32)>,
        verify_only: bool,
    ) -> TxnReply {
        if verify_only {
            return self.verify(id, producer, &partitions);
        }
        let Some(m) = self.txns.borrow().get(id).cloned() else {
            return TxnReply::Code(errors::INVALID_PRODUCER_ID_MAPPING);
        };
        match m.add_partitions(producer.0, producer.1, &partitions, now_ms()) {
            Err(errors::INVALID_REQUEST) => {
                crate::client_warn!(
                    transactional_id = id,
                    partitions_max = state::PARTITIONS_MAX,
                    "AddPartitionsToTxn refused: the transaction would hold more partitions than a transaction may"
                );
                TxnReply::Code(errors::INVALID_REQUEST)
            }
            Err(code) => TxnReply::Code(code),
            Ok(None) => TxnReply::Code(errors::NONE),
            Ok(Some(next)) => match self.store(part, id, &next).await {
                Ok(()) => TxnReply::Code(errors::NONE),
                Err(code) => TxnReply::Code(code),
            },
        }
    }

    /// KIP-890: a partition leader asks whether it may take a transactional batch: the
    /// producer's current epoch, an ongoing transaction, the partition in it. Kafka's
    /// codes (`handleVerifyPartitionsInTransaction`): PRODUCER_FENCED for another epoch,
    /// CONCURRENT_TRANSACTIONS while the transaction ends (also while the write that
    /// ends it, or bumps the epoch, is being replicated), TRANSACTION_ABORTABLE for a
    /// partition not in an ongoing transaction (the caller maps them for its client). The
    /// partition leader checks again at the append that no marker came meanwhile
    /// (`producer_state::partition::VerificationGuard`).
    fn verify(
        &self,
        id: &str,
        producer: (ProducerId, ProducerEpoch),
        partitions: &[(String, i32)],
    ) -> TxnReply {
        let txns = self.txns.borrow();
        let Some(m) = txns.get(id) else {
            return TxnReply::Code(errors::INVALID_PRODUCER_ID_MAPPING);
        };
        // A transition that ends the transaction or the epoch (Prepare*, a fence, a bump)
        // is written and waits for replication: the state in memory is about to go.
        // Adding partitions (→ Ongoing) ends nothing.
        let ending = self
            .transitions
            .borrow()
            .get(id)
            .is_some_and(|next| *next != TxnState::Ongoing);
        let code = match m.check_producer(producer.0, producer.1) {
            Err(code) => code,
            Ok(()) if m.state.is_preparing() || ending => errors::CONCURRENT_TRANSACTIONS,
            Ok(()) => errors::NONE,
        };
        let ongoing = m.state == TxnState::Ongoing;
        let per = partitions
            .iter()
            .map(|p| {
                if code != errors::NONE || (ongoing && m.partitions.contains(p)) {
                    code
                } else {
                    errors::TRANSACTION_ABORTABLE
                }
            })
            .collect();
        TxnReply::Partitions(per)
    }

    /// EndTxn: PrepareCommit/PrepareAbort logged, markers written, Complete* logged.
    async fn end_txn(
        &self,
        part: &Led,
        id: &str,
        producer: (ProducerId, ProducerEpoch),
        commit: bool,
    ) -> i16 {
        let Some(m) = self.txns.borrow().get(id).cloned() else {
            return errors::INVALID_PRODUCER_ID_MAPPING;
        };
        let prepared = match m.end(producer.0, producer.1, commit, now_ms()) {
            Err(code) => return code,
            Ok(EndDecision::AlreadyDone) => return errors::NONE,
            Ok(EndDecision::Prepare(p)) => p,
        };
        if let Err(code) = self.store(part, id, &prepared).await {
            return code;
        }
        match self.complete(part, id, prepared).await {
            Ok(_) => errors::NONE,
            Err(code) => code,
        }
    }

    /// Writes the markers of a Prepare* transaction to all its partitions, then logs
    /// Complete*. If a marker cannot be written (after retries) the transaction stays in
    /// Prepare* for the ticker to finish, and the caller gets that error.
    async fn complete(&self, part: &Led, id: &str, m: TxnMetadata) -> Result<TxnMetadata, i16> {
        assert!(m.state.is_preparing(), "markers for {:?}", m.state);
        // A Prepare* state this coordinator wrote is replicated already; one it loaded
        // may not be yet.
        self.await_loaded(part, LOADED_HW_WAIT).await?;
        let marker = Marker {
            producer_id: m.producer_id,
            producer_epoch: m.producer_epoch,
            commit: m.state == TxnState::PrepareCommit,
            coordinator_epoch: part.epoch().get(),
        };
        let Some(writer) = self.markers.get() else {
            return Err(errors::COORDINATOR_NOT_AVAILABLE);
        };
        // A coordinator that lost its partition writes no more markers (`write_marker`):
        // the next leader's finishes the transaction, and by then its producer may have
        // begun another one on a partition, which a late marker would end.
        // Written [`MARKERS_CONCURRENT_MAX`] at a time, as Kafka sends them to every
        // leader at once: one partition whose leader does not answer does not hold up
        // the markers (and the LSO) of the others.
        let partitions: Vec<&(String, i32)> = m.partitions.iter().collect();
        for some in partitions.chunks(MARKERS_CONCURRENT_MAX) {
            let writes = some
                .iter()
                .map(|(topic, index)| Box::pin(write_marker(writer, part, topic, *index, marker)))
                .collect();
            for written in crate::event::join_all(writes).await {
                written?;
            }
        }
        let done = m.complete(now_ms());
        self.store(part, id, &done).await?;
        Ok(done)
    }

    /// Appends `m` for `id` and, once replicated (acks=all), makes it the state. Errors as
    /// Kafka's `TransactionStateManager` maps them.
    async fn store(&self, part: &Led, id: &str, m: &TxnMetadata) -> Result<(), i16> {
        let kind = crate::coordinator::WriteKind::TxnState;
        let value = schema::value(m).map_err(|e| {
            // The state machine never makes such a state (`state::PARTITIONS_MAX`).
            tracing::error!(transactional_id = id, "transaction state not written: {e}");
            errors::UNKNOWN_SERVER_ERROR
        })?;
        let records = vec![(schema::key(id), Some(value))];
        let batches =
            build_batches(records, batch_bytes_max(part), now_ms()).map_err(|c| kind.code(c))?;
        let previous = self
            .transitions
            .borrow_mut()
            .insert(id.to_string(), m.state);
        assert!(previous.is_none(), "two transitions of {id} at once");
        let _transition = Transition {
            set: &self.transitions,
            id,
        };
        append_contiguous(part, batches)
            .await
            .map_err(|c| kind.code(c))?;
        self.txns.borrow_mut().insert(id.to_string(), m.clone());
        Ok(())
    }

    /// Loads every partition of this shard, then lists its transactions.
    async fn list(&self, ctx: &ServiceContext<'_>) -> TxnReply {
        if let Some(topic) = ctx.catalog().topics.get(TXN_TOPIC).cloned() {
            for p in 0..topic.partitions {
                if ctx.owns(TXN_TOPIC, p) {
                    let _ = self.load(ctx, p).await;
                }
            }
        }
        let listed = self
            .txns
            .borrow()
            .iter()
            .map(|(id, m)| (id.clone(), m.producer_id, m.state.name()))
            .collect();
        TxnReply::Listed(listed)
    }

    /// The open, replayed partition `index` of `__transaction_state` on this shard.
    async fn load(&self, ctx: &ServiceContext<'_>, index: i32) -> Result<Led, i16> {
        self.partitions
            .load(index, || self.replay(ctx, index))
            .await
    }

    async fn replay(
        &self,
        ctx: &ServiceContext<'_>,
        index: i32,
    ) -> Result<(Rc<Partition>, wire::LeaderEpoch), i16> {
        let tp = (std::sync::Arc::from(TXN_TOPIC), index);
        let (part, epoch) = crate::coordinator::open_led(ctx, &tp).await?;
        if let Some(t) = ctx.catalog().topics.get(TXN_TOPIC) {
            self.topic_partitions.set(t.partitions);
        }
        let started = Instant::now();
        let mut loaded: HashMap<String, TxnMetadata> = HashMap::new();
        // What `replay_batches` reads to (no await between).
        let loaded_end = part.replica().log_end();
        let batches = crate::coordinator::replay_batches(&part, |batch| {
            replay_batch(&batch, &mut loaded);
            Ok(())
        })
        .await?;
        let ending: Vec<String> = loaded
            .iter()
            .filter(|(_, m)| m.state.is_preparing())
            .map(|(id, _)| id.clone())
            .collect();
        tracing::info!(
            partition = index,
            batches,
            transactional_ids = loaded.len(),
            ending = ending.len(),
            epoch = %epoch,
            ms = started.elapsed().as_millis() as u64,
            "loaded transaction coordinator state"
        );
        self.to_resume.borrow_mut().extend(ending);
        if part.high_watermark() < loaded_end {
            self.loaded_ends.borrow_mut().insert(index, loaded_end);
        } else {
            self.loaded_ends.borrow_mut().remove(&index);
        }
        {
            // The log is the partition's whole state: nothing older of it stays.
            let partitions = self.topic_partitions.get();
            let mut txns = self.txns.borrow_mut();
            txns.retain(|id, _| partition_for(id, partitions) != index);
            txns.extend(loaded);
        }
        Ok((part, epoch))
    }

    /// Starts this shard's timer task once: aborts timed-out transactions and finishes
    /// those left in Prepare* (a marker that could not be written, or found at load)
    /// every `abort_check_ms`, and removes expired transactional ids every
    /// `expire_check_ms`.
    fn start_ticker(self: &Rc<Self>, settings: Settings) {
        if self.ticker_started.replace(true) {
            return;
        }
        let me = self.clone();
        let abort_every = Duration::from_millis(settings.abort_check_ms);
        let expire_every = Duration::from_millis(settings.expire_check_ms);
        glommio::spawn_local(async move {
            let mut aborted_at = Instant::now();
            let mut expired_at = Instant::now();
            loop {
                let next = (aborted_at + abort_every).min(expired_at + expire_every);
                glommio::timer::sleep(next.saturating_duration_since(Instant::now())).await;
                me.drop_stale();
                if aborted_at.elapsed() >= abort_every {
                    aborted_at = Instant::now();
                    me.tick(now_ms());
                }
                if expired_at.elapsed() >= expire_every {
                    expired_at = Instant::now();
                    me.expire(now_ms(), settings.id_expiration_ms).await;
                }
            }
        })
        .detach();
    }

    /// Removes the transactional ids expired at `now` (Kafka's
    /// `removeExpiredTransactionalIds`): a tombstone per id is appended to its partition
    /// (acks=all, as every state write), and only once it is written is the id dropped
    /// from memory, so a new leader's replay forgets it too. An id with a transaction
    /// open or ending never expires; one a request holds waits for the next pass.
    async fn expire(&self, now: i64, expiration_ms: i64) {
        let partitions = self.topic_partitions.get();
        let mut by_partition: BTreeMap<i32, Vec<String>> = BTreeMap::new();
        for (id, m) in self.txns.borrow().iter() {
            if m.expired(now, expiration_ms) {
                by_partition
                    .entry(partition_for(id, partitions))
                    .or_default()
                    .push(id.clone());
            }
        }
        for (index, ids) in by_partition {
            let Some(part) = self.partitions.get(index) else {
                continue;
            };
            for chunk in ids.chunks(EXPIRE_APPEND_IDS_MAX) {
                self.expire_ids(&part, index, chunk, now, expiration_ms)
                    .await;
            }
        }
    }

    /// Writes the tombstones of `ids` (of partition `index`) still expired under a
    /// claim, then drops them.
    async fn expire_ids(
        &self,
        part: &Led,
        index: i32,
        ids: &[String],
        now: i64,
        expiration_ms: i64,
    ) {
        let mut claimed = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(busy) = self.claim(id) else {
                continue;
            };
            // Read under the claim: a request may have moved it on meanwhile.
            let still = self
                .txns
                .borrow()
                .get(id)
                .is_some_and(|m| m.expired(now, expiration_ms));
            if still {
                claimed.push(busy);
            }
        }
        if claimed.is_empty() {
            return;
        }
        let kind = crate::coordinator::WriteKind::TxnState;
        let records = claimed
            .iter()
            .map(|busy| (schema::key(&busy.id), None))
            .collect();
        let written = match build_batches(records, batch_bytes_max(part), now_ms()) {
            Ok(batches) => append_contiguous(part, batches).await.map(|_| ()),
            Err(code) => Err(code),
        };
        match written {
            Ok(()) => {
                let mut txns = self.txns.borrow_mut();
                for busy in &claimed {
                    txns.remove(&busy.id);
                }
                tracing::info!(
                    partition = index,
                    transactional_ids = claimed.len(),
                    "expired transactional ids removed"
                );
            }
            Err(code) => tracing::warn!(
                partition = index,
                transactional_ids = claimed.len(),
                "cannot remove expired transactional ids: error {}",
                kind.code(code)
            ),
        }
    }

    /// Starts ending every transaction due at `now` (timed out, or left in Prepare*),
    /// each in a task of its own, at most [`TICK_CONCURRENT_MAX`] at once; one still
    /// being ended, or held by a request, is seen again by the next round.
    fn tick(self: &Rc<Self>, now: i64) {
        let mut ids: Vec<String> = self
            .txns
            .borrow()
            .iter()
            .filter(|(_, m)| due(m, now))
            .map(|(id, _)| id.clone())
            .collect();
        // In a stable order: which transactions wait for a later round does not depend
        // on the map's.
        ids.sort_unstable();
        for id in ids {
            if self.ticking.get() >= TICK_CONCURRENT_MAX {
                break;
            }
            if self.busy.borrow().contains(&id) {
                continue;
            }
            self.ticking.set(self.ticking.get() + 1);
            let me = self.clone();
            glommio::spawn_local(async move {
                let _counted = Ticking(&me.ticking);
                me.finish_due(&id, now).await;
            })
            .detach();
        }
    }

    /// Ends `id` if it is due (timed out: aborted and its producer fenced; Prepare*:
    /// markers written), under a claim. False if a request holds it (nothing done).
    async fn finish_due(&self, id: &str, now: i64) -> bool {
        let Some(part) = self.partition_of(id) else {
            return true;
        };
        let Some(_busy) = self.claim(id) else {
            return false;
        };
        // Read under the claim: a request may have moved it on meanwhile.
        let Some(m) = self.txns.borrow().get(id).cloned().filter(|m| due(m, now)) else {
            return true;
        };
        // A Prepare* state loaded past the HW waits for it (the load's resumption waits;
        // the ticker does not hold its round for it).
        if m.state.is_preparing() && !self.loaded_covered(&part) {
            return true;
        }
        let timed_out = m.state == TxnState::Ongoing;
        match self.finish_open(&part, id, m).await {
            Ok(done) if timed_out => tracing::info!(
                transactional_id = id,
                producer_id = %done.producer_id,
                epoch = %done.producer_epoch,
                "transaction timed out: aborted, producer fenced"
            ),
            Ok(_) => {}
            Err(code) => {
                tracing::warn!(
                    transactional_id = id,
                    "cannot end transaction: error {code}"
                )
            }
        }
        true
    }

    fn partition_of(&self, id: &str) -> Option<Led> {
        let index = partition_for(id, self.topic_partitions.get());
        self.partitions.get(index)
    }
}

/// Whether the ticker (or a load) must end `m` now: timed out, or ending (Prepare*).
fn due(m: &TxnMetadata, now: i64) -> bool {
    m.timed_out(now) || m.state.is_preparing()
}

/// Applies one batch of the transaction log: the latest value per id wins.
fn replay_batch(batch: &Bytes, loaded: &mut HashMap<String, TxnMetadata>) {
    let Ok((header, records)) = batch_records(batch, REPLAY_DECOMPRESSED_MAX) else {
        tracing::warn!("skipping unreadable __transaction_state batch");
        return;
    };
    if header.attributes().is_control() {
        return;
    }
    for record in records.flatten() {
        let Some(key) = record.key else { continue };
        let Ok(id) = schema::decode_key(&key) else {
            tracing::warn!("skipping unreadable __transaction_state key");
            continue;
        };
        match record.value.as_ref().map(schema::decode_value) {
            None => {
                loaded.remove(&id);
            }
            Some(Ok(m)) => {
                loaded.insert(id, m);
            }
            Some(Err(e)) => tracing::warn!(transactional_id = id, "skipping unreadable value: {e}"),
        }
    }
}

/// Writes one marker, retrying a bounded number of times while the coordinator still
/// leads `part` under the epoch its state was loaded at (NOT_COORDINATOR once it does
/// not). A partition that no longer exists needs no marker (Kafka drops those too).
async fn write_marker(
    writer: &MarkerWriter,
    part: &Led,
    topic: &str,
    index: i32,
    marker: Marker,
) -> Result<(), i16> {
    let tp = (std::sync::Arc::from(topic), index);
    let mut last = errors::NONE;
    for _ in 0..MARKER_ATTEMPTS_MAX {
        if !part.leads() {
            return Err(errors::NOT_COORDINATOR);
        }
        let deadline = Instant::now() + MARKER_CALL_TIMEOUT;
        last = writer.write(tp.clone(), marker, deadline).await;
        match last {
            errors::NONE | errors::UNKNOWN_TOPIC_OR_PARTITION => return Ok(()),
            // A newer coordinator of this id has written its markers there: this one has
            // lost the partition, whether it knows yet or not.
            errors::TRANSACTION_COORDINATOR_FENCED => return Err(errors::NOT_COORDINATOR),
            // The partition has seen a newer epoch of this producer: a retry can never be
            // taken, and waiting would hold the transaction (and the id) in Prepare*
            // forever. Kafka stops sending here too.
            errors::INVALID_PRODUCER_EPOCH => {
                tracing::warn!(
                    topic,
                    partition = index,
                    "marker refused: the partition knows a newer producer epoch"
                );
                return Ok(());
            }
            _ => glommio::timer::sleep(MARKER_RETRY_BACKOFF).await,
        }
    }
    tracing::warn!(topic, partition = index, "marker not written: error {last}");
    Err(errors::COORDINATOR_NOT_AVAILABLE)
}

/// The next epoch of `m`'s producer id, or a new producer id once epochs run out.
async fn bump(
    ctx: &ServiceContext<'_>,
    m: &TxnMetadata,
    timeout_ms: i32,
    now: i64,
    version: i16,
) -> Result<TxnMetadata, i16> {
    let (pid, epoch) = if m.producer_epoch.get() >= EPOCH_MAX {
        (fresh_producer_id(ctx, version).await?, ProducerEpoch(0))
    } else {
        (m.producer_id, ProducerEpoch(m.producer_epoch.get() + 1))
    };
    // Empty, as Kafka's `prepareIncrementProducerEpoch`: a retried EndTxn of the
    // previous transaction carries the old epoch and is fenced anyway, and a producer
    // just initialised is listed and described as having no transaction.
    Ok(TxnMetadata::empty(pid, epoch, timeout_ms, now))
}

/// PRODUCER_FENCED where the client knows it (InitProducerId v4+), else
/// INVALID_PRODUCER_EPOCH.
fn fenced_code(version: i16) -> i16 {
    if version >= 4 {
        errors::PRODUCER_FENCED
    } else {
        errors::INVALID_PRODUCER_EPOCH
    }
}

/// A producer id from this shard's allocator (the same ids as idempotent producers: the
/// shard's range on a single node, the controller's blocks in a cluster).
async fn fresh_producer_id(ctx: &ServiceContext<'_>, version: i16) -> Result<ProducerId, i16> {
    ctx.new_producer_id(version).await
}
