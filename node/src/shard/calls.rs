//! The operations the API handlers run on a partition's owning shard, one type each with
//! its own reply (see [`ShardCall`]). Offsets and epochs travel as their newtypes.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use wire::{LeaderEpoch, Offset};

use super::context::{MarkerWriter, ServiceContext};
use super::mesh::ShardCall;
use super::{Shard, TopicPartition, now_ms};
use crate::group::{GroupCall, GroupReply};
use crate::partition::{Acks, FetchOutcome, ListedOffset, ProduceOutcome, ReadFor};
use crate::producer_state::partition::Marker;

/// Appends one Produce partition's records on its leader and answers as `acks` asks
/// (acks=all waits there, on the owner, until the HW covers the batch or
/// `replicated_by`, the request's `timeout_ms`; the call's own deadline is later, so that
/// the append itself is never cut short by a short client timeout).
pub struct ProduceCall {
    pub tp: TopicPartition,
    pub records: BytesMut,
    pub acks: Acks,
    pub replicated_by: Instant,
    /// The request's transactional id: a transactional batch that would open a
    /// transaction here is first checked with its coordinator (KIP-890).
    pub transactional_id: Option<std::sync::Arc<str>>,
}

impl ShardCall for ProduceCall {
    type Reply = ProduceOutcome;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> ProduceOutcome {
        let verify = |shard: Rc<Shard>,
                      txn_id: Arc<str>,
                      producer: Producer,
                      tp: TopicPartition| async move {
            crate::api::txn::verify_produce(&shard, &txn_id, producer, &tp.0, tp.1).await
        };
        self.append_verified(shard, verify).await
    }
}

/// A transactional producer's id and epoch.
type Producer = (wire::ProducerId, wire::ProducerEpoch);

impl ProduceCall {
    /// The produce, with `verify` as the KIP-890 check of a batch that would open a
    /// transaction here (the coordinator's answer; a test stands in for it).
    async fn append_verified<V, F>(self, shard: Rc<Shard>, verify: V) -> ProduceOutcome
    where
        V: FnOnce(Rc<Shard>, Arc<str>, Producer, TopicPartition) -> F,
        F: std::future::Future<Output = i16>,
    {
        // A cluster node whose lease expired (cut off from the controller) may have been
        // replaced as leader without knowing it: it acknowledges nothing more.
        if shard
            .node
            .controller
            .cluster()
            .is_some_and(|q| !q.lease_valid())
        {
            return ProduceOutcome::failed(crate::errors::NOT_LEADER_OR_FOLLOWER);
        }
        // Offsets are assigned in arrival order even when the partition has to be opened
        // first: a queued call holds its turn until then (see `shard::arrivals`).
        let (p, arrival) = match shard.partition_in_turn(&self.tp).await {
            Ok(found) => found,
            Err(code) => return ProduceOutcome::failed(code),
        };
        // Without turns, a producer's pipelined first batches of a transaction (seq 0, 1,
        // ...) would each await the coordinator's verification and could append in the
        // order the answers came back: OUT_OF_ORDER_SEQUENCE_NUMBER for seq 0.
        let turns = p.txn_turns(&self.records);
        // A transactional batch may wait for a coordinator's answer (its own
        // verification, or an earlier batch's in its turn): those waits hold no inbox
        // slot of the peer, whose produces and fetches must not stall behind a
        // coordinator slow to answer (as a wait for replication gives its slot back).
        if turns.is_some() {
            super::mesh::InboxSlot::release_current();
        }
        let turn = match &turns {
            Some(t) => Some(t.turns.wait().await),
            None => None,
        };
        let verifying = match p.opens_transaction(&self.records) {
            None => None,
            Some(producer) => {
                let Some(txn_id) = self.transactional_id.clone() else {
                    return ProduceOutcome::failed(crate::errors::INVALID_TXN_STATE);
                };
                // Begun before the coordinator is asked: an abort (or commit) marker of
                // this producer written here while it answers ends the verification, and
                // the batch is refused below instead of opening a transaction after it.
                let verifying = p.producers.begin_verification(producer.0, producer.1);
                let code = verify(shard.clone(), txn_id, producer, self.tp.clone()).await;
                if code != crate::errors::NONE {
                    return ProduceOutcome::failed(code);
                }
                Some(verifying)
            }
        };
        // Still in turn: after a cut of the log the producer state is rebuilt first, so
        // the first poll below takes offsets instead of parking in the rebuild.
        if let Err(code) = p.rebuild_producers().await {
            return ProduceOutcome::failed(code);
        }
        // No await from here to the append's first poll: the guard checked is the one
        // the append goes in under (Kafka checks it under the log's lock).
        if let Err(code) = still_verified(&p, &self.records, verifying.as_ref()) {
            return ProduceOutcome::failed(code);
        }
        let mut produce =
            std::pin::pin!(p.produce(self.records, self.acks, self.replicated_by, now_ms()));
        // The first poll checks and records the batch (offsets assigned synchronously,
        // see `PartitionProducers::append`); the next batch may go once it ran.
        let first = futures_lite::future::poll_once(&mut produce).await;
        drop(verifying);
        drop(turn);
        drop(turns);
        drop(arrival);
        match first {
            Some(outcome) => outcome,
            None => produce.await,
        }
    }
}

/// KIP-890 at the append (Kafka's `VerificationGuard` check): a transactional batch that
/// would open a transaction here needs a verification that still holds — none of the
/// producer's markers written here since it began. One verified before its transaction
/// was aborted, or that found the transaction open and saw it end meanwhile, is refused
/// with INVALID_TXN_STATE, as Kafka refuses it.
fn still_verified(
    p: &crate::partition::Partition,
    records: &[u8],
    verifying: Option<&crate::producer_state::partition::Verifying<'_>>,
) -> Result<(), i16> {
    if p.opens_transaction(records).is_none() || verifying.is_some_and(|v| v.holds()) {
        return Ok(());
    }
    Err(crate::errors::INVALID_TXN_STATE)
}

/// One partition read of a Fetch.
#[derive(Debug, Clone)]
pub struct FetchRead {
    pub tp: TopicPartition,
    /// The topic id the request named (0: named by name, not checked). A partition open
    /// under another id is a deleted topic's successor: UNKNOWN_TOPIC_ID.
    pub topic_id: u128,
    pub offset: Offset,
    pub max_bytes: usize,
    /// The request's `current_leader_epoch` (-1: not given).
    pub current_epoch: LeaderEpoch,
    /// A follower's `last_fetched_epoch` (-1: not given), checked for divergence.
    pub last_fetched_epoch: LeaderEpoch,
    /// A follower's `log_start_offset` (-1: not given), recorded by its leader for
    /// DeleteRecords' low watermark.
    pub log_start: Offset,
}

/// KIP-392: where a consumer's Fetch may be served, from its version and `rack_id`.
#[derive(Debug, Clone, Default)]
pub struct ClientSite {
    /// A consumer's Fetch v11+: a follower may answer it (Kafka's `fetchOnlyFromLeader`
    /// is false), up to the HW the follower knows. Below v11, and for replicas, only the
    /// leader answers.
    pub followers_may_serve: bool,
    /// The client's `rack_id` (`client.rack`); empty when not given. With the rack-aware
    /// `replica.selector.class`, a leader sends the client to an in-sync replica there.
    pub rack: std::sync::Arc<str>,
    /// The listener the client came through: a preferred read replica must have an
    /// address on it.
    pub listener: std::sync::Arc<str>,
}

/// Reads of several partitions owned by the same shard, in request order: together they
/// return at most `budget_bytes` of records, except that with `exceed_once` the first
/// partition with data returns its first batch whole even if it is larger (KIP-74: a
/// fetch always makes progress). A partition reached with no budget left is not read.
pub struct FetchCall {
    pub reads: Vec<FetchRead>,
    pub reader: ReadFor,
    pub budget_bytes: usize,
    pub exceed_once: bool,
    pub client: ClientSite,
}

impl ShardCall for FetchCall {
    /// One outcome per read, in order.
    type Reply = Vec<FetchOutcome>;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> Vec<FetchOutcome> {
        let mut left = self.budget_bytes;
        let mut exceed = self.exceed_once;
        let mut out = Vec::with_capacity(self.reads.len());
        for r in &self.reads {
            let hard_max_bytes = if exceed { usize::MAX } else { left };
            let max_bytes = r.max_bytes.min(left);
            let outcome = match shard.partition(&r.tp).await {
                Ok(p) if r.topic_id != 0 && p.topic_id != 0 && p.topic_id != r.topic_id => {
                    FetchOutcome::refused(crate::errors::UNKNOWN_TOPIC_ID)
                }
                Ok(p) => {
                    self.read_one(&shard, &p, r, (max_bytes, hard_max_bytes))
                        .await
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
}

impl FetchCall {
    /// One partition's read on its owner, by role: a leader reads (or, KIP-392, sends a
    /// consumer to a closer replica); a follower serves a consumer's Fetch v11+ from its
    /// own log; any other read is refused by `fetch_within`'s checks
    /// (NOT_LEADER_OR_FOLLOWER, or the epoch's error).
    async fn read_one(
        &self,
        shard: &Shard,
        p: &crate::partition::Partition,
        r: &FetchRead,
        (max_bytes, hard_max_bytes): (usize, usize),
    ) -> FetchOutcome {
        let leads = p.replica().is_leader();
        let serving_consumer = match self.reader {
            ReadFor::Consumer(isolation) if !leads && self.client.followers_may_serve => {
                Some(isolation)
            }
            _ => None,
        };
        // A consumer's last fetched epoch is checked too (Kafka's readRecords does it for
        // every fetch, on a follower serving it as well): a client that sends it (KIP-320)
        // learns of a truncated tail as a diverging epoch, not OFFSET_OUT_OF_RANGE and a
        // reset.
        if (leads || serving_consumer.is_some())
            && let Some(diverging) = p.diverging(r.offset, r.last_fetched_epoch)
        {
            return p.diverged(diverging, r.current_epoch);
        }
        if let Some(isolation) = serving_consumer {
            let sizes = (max_bytes, hard_max_bytes);
            let read = p.fetch_as_follower(r.offset, isolation, r.current_epoch, sizes, now_ms());
            let mut read = read.await;
            read.from_follower = true;
            return read;
        }
        if leads && let Some(node) = self.read_replica(shard, p, r) {
            return p.redirected(node, r.current_epoch);
        }
        let read = p.fetch_within(
            r.offset,
            self.reader,
            r.current_epoch,
            max_bytes,
            hard_max_bytes,
            now_ms(),
        );
        let read = read.await;
        if leads
            && let ReadFor::Follower(node, _) = self.reader
            && read.error == crate::errors::NONE
        {
            p.follower_log_start(node, r.log_start);
        }
        read
    }

    /// KIP-392 on a leader: the replica `r`'s consumer should read from instead, if the
    /// rack-aware selector is on, the client gave its rack and a closer in-sync replica
    /// holds its offset (see [`crate::partition::replica::ReplicaState::read_replica_for`]).
    fn read_replica(
        &self,
        shard: &Shard,
        p: &crate::partition::Partition,
        r: &FetchRead,
    ) -> Option<wire::NodeId> {
        let consumer = matches!(self.reader, ReadFor::Consumer(_));
        let selector = shard.config().replica_selector;
        if !consumer || !self.client.followers_may_serve || self.client.rack.is_empty() {
            return None;
        }
        if selector != crate::config::ReplicaSelector::RackAware {
            return None;
        }
        // Only a node the client can reach: unfenced, with an address on the listener the
        // client came through (the nodes its Metadata lists; Kafka's endpoints rule).
        let catalog = shard.catalog();
        let rack_of = |n: wire::NodeId| {
            let node = catalog.nodes.get(&n.0)?;
            if node.fenced || node.address_for(&self.client.listener).is_none() {
                return None;
            }
            node.rack.clone()
        };
        p.replica()
            .read_replica_for(&self.client.rack, r.offset, rack_of)
    }
}

/// Completes when any of `tps` can be read past its offset (the HW for a consumer, the
/// log end for a follower) — at once if one already can — or at the deadline.
pub struct WaitCall {
    pub tps: Vec<(TopicPartition, Offset)>,
    pub reader: ReadFor,
}

impl ShardCall for WaitCall {
    type Reply = ();

    async fn run(self, shard: Rc<Shard>, deadline: Instant) {
        shard.wait_for_data(&self.tps, self.reader, deadline).await;
    }

    fn takes_inbox_slot(&self) -> bool {
        false
    }
}

/// ListOffsets for one partition.
pub struct ListOffsetCall {
    pub tp: TopicPartition,
    pub timestamp: i64,
    pub current_epoch: LeaderEpoch,
    pub asker: crate::partition::Lister,
}

impl ShardCall for ListOffsetCall {
    type Reply = ListedOffset;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> ListedOffset {
        match shard.partition(&self.tp).await {
            Ok(p) => {
                p.list_offset_for(self.timestamp, self.current_epoch, self.asker)
                    .await
            }
            Err(code) => ListedOffset::failed(code),
        }
    }
}

/// DescribeProducers (KIP-664) for one partition: its active producers, on its leader
/// only (NOT_LEADER_OR_FOLLOWER elsewhere, as Kafka).
pub struct DescribeProducersCall {
    pub tp: TopicPartition,
}

/// Producers listed per partition at most: an answer of a partition with many idle
/// producer ids (they expire after `transactional.id.expiration.ms`) stays bounded.
pub const DESCRIBED_PRODUCERS_MAX: usize = 10_000;

impl ShardCall for DescribeProducersCall {
    type Reply = Result<Vec<crate::producer_state::partition::ActiveProducer>, i16>;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> Self::Reply {
        let p = shard.partition(&self.tp).await?;
        if !p.replica().is_leader() {
            return Err(crate::errors::NOT_LEADER_OR_FOLLOWER);
        }
        Ok(p.producers.active(DESCRIBED_PRODUCERS_MAX))
    }
}

/// DeleteRecords for one partition: the low watermark once every live replica's log
/// start reached the target (waiting at most until `replicated_by`, the request's
/// `timeout_ms`; the call's own deadline is later), or a Kafka error.
pub struct DeleteRecordsCall {
    pub tp: TopicPartition,
    pub offset: Offset,
    pub replicated_by: Instant,
}

impl ShardCall for DeleteRecordsCall {
    type Reply = Result<Offset, i16>;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> Result<Offset, i16> {
        let p = shard.partition(&self.tp).await?;
        let wait = self.replicated_by.saturating_duration_since(Instant::now());
        // Kafka counts the replicas on live brokers (registered, not fenced); the
        // catalogue is read afresh at every check.
        let alive = |n: wire::NodeId| {
            shard
                .catalog()
                .nodes
                .get(&n.get())
                .is_some_and(|node| !node.fenced)
        };
        p.delete_records(self.offset, wait, alive).await
    }
}

/// OffsetForLeaderEpoch for one partition: where `epoch` ends in the owner's log.
pub struct EpochEndCall {
    pub tp: TopicPartition,
    pub epoch: LeaderEpoch,
    pub current_epoch: LeaderEpoch,
}

impl ShardCall for EpochEndCall {
    type Reply = Result<(LeaderEpoch, Offset), i16>;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> Self::Reply {
        let p = shard.partition(&self.tp).await?;
        p.epoch_end_offset(self.epoch, self.current_epoch)
    }
}

/// Brings the shard's open partitions in line with the catalogue (drop deleted topics,
/// apply config changes).
pub struct SyncCall;

impl ShardCall for SyncCall {
    type Reply = ();

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) {
        shard.sync_partitions().await;
    }
}

/// Writes a transaction marker (COMMIT or ABORT control batch) to a partition on its
/// leader, answered once replicated (acks=all): from the transaction coordinator, or a
/// WriteTxnMarkers request. A marker on a
/// `__consumer_offsets` partition also completes the producer's pending transactional
/// offset commits there (the group coordinator applies or drops them). Replies with a
/// Kafka error code.
pub struct WriteMarkerCall {
    pub tp: TopicPartition,
    pub marker: Marker,
}

impl ShardCall for WriteMarkerCall {
    type Reply = i16;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> i16 {
        let p = match shard.partition(&self.tp).await {
            Ok(p) => p,
            Err(code) => return code,
        };
        let epoch = p.leader_epoch();
        // Where the marker goes: read with no await before the marker's first poll, which
        // takes its offset (a rebuild after a cut of the log would park it, so first).
        if let Err(code) = p.rebuild_producers().await {
            return code;
        }
        let marker_at = p.log.log_end_offset();
        let mut code = p.write_marker(self.marker, now_ms()).await;
        if code == crate::errors::NONE {
            // Kafka writes markers with acks=all: answered once the HW covers the marker
            // (with it every append before it), so a leader change cannot lose it.
            let end = p.replica().log_end();
            code = crate::coordinator::await_replicated(&p, epoch, end).await;
        }
        if code == crate::errors::NONE && &*self.tp.0 == crate::group::OFFSETS_TOPIC {
            let groups = shard.groups.clone();
            let ctx = ServiceContext::new(&shard);
            return groups
                .complete_txn(&ctx, self.tp.1, self.marker, marker_at)
                .await;
        }
        code
    }
}

/// Work for the group coordinator hosted on the target shard; it sees the shard only
/// through a [`ServiceContext`].
impl ShardCall for GroupCall {
    type Reply = GroupReply;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> GroupReply {
        let groups = shard.groups.clone();
        groups.exec(&ServiceContext::new(&shard), self).await
    }
}

/// TxnOffsetCommit, run on the shard hosting the group's coordinator: the KIP-890 check
/// (the group's `__consumer_offsets` partition must be in the producer's ongoing
/// transaction) is asked of the transaction coordinator from here, between a
/// verification begun on that partition and the coordinator's append, which goes in only
/// if no marker of the producer was written there meanwhile. Checked on the connection's
/// shard before, a commit verified just before its transaction was aborted could append
/// after the ABORT marker: a transaction no coordinator would end, its offsets held (and
/// `require_stable` fetches answered UNSTABLE_OFFSET_COMMIT) for ever.
pub struct TxnOffsetCommitCall {
    /// The group's `__consumer_offsets` partition.
    pub partition: i32,
    pub transactional_id: Arc<str>,
    pub commit: crate::group::CommitArgs,
    pub producer: Producer,
}

impl ShardCall for TxnOffsetCommitCall {
    type Reply = GroupReply;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> GroupReply {
        let verify = |shard: Rc<Shard>, txn_id: Arc<str>, producer: Producer, partition: i32| async move {
            crate::api::txn::verify_offsets(&shard, &txn_id, producer, partition).await
        };
        self.commit_verified(shard, verify).await
    }
}

impl TxnOffsetCommitCall {
    /// The commit, with `verify` as the KIP-890 check (the coordinator's answer; a test
    /// stands in for it). Each offset gets the check's refusal if there is one.
    async fn commit_verified<V, F>(self, shard: Rc<Shard>, verify: V) -> GroupReply
    where
        V: FnOnce(Rc<Shard>, Arc<str>, Producer, i32) -> F,
        F: std::future::Future<Output = i16>,
    {
        let count = self.commit.offsets.len();
        let groups = shard.groups.clone();
        let ctx = ServiceContext::new(&shard);
        let part = match groups.led(&ctx, self.partition).await {
            Ok(part) => part,
            Err(code) => return GroupReply::Code(code),
        };
        let verifying = part
            .producers
            .begin_verification(self.producer.0, self.producer.1);
        // The coordinator's answer may be slow (another node's): the wait holds no inbox
        // slot of the peer, whose produces and fetches would stall behind it.
        super::mesh::InboxSlot::release_current();
        let code = verify(
            shard.clone(),
            self.transactional_id,
            self.producer,
            self.partition,
        )
        .await;
        if code != crate::errors::NONE {
            return GroupReply::Codes(crate::errors::NONE, vec![code; count]);
        }
        let op = crate::group::GroupOp::TxnCommit {
            commit: self.commit,
            producer_id: self.producer.0,
            producer_epoch: self.producer.1,
            verified: verifying.guard(),
        };
        let call = GroupCall {
            partition: self.partition,
            op,
        };
        let reply = groups.exec(&ctx, call).await;
        drop(verifying);
        reply
    }
}

/// Work for the transaction coordinator hosted on the target shard; it sees the shard
/// through a [`ServiceContext`] and writes markers through a [`MarkerWriter`].
impl ShardCall for crate::txn::TxnCall {
    type Reply = crate::txn::TxnReply;

    async fn run(self, shard: Rc<Shard>, _deadline: Instant) -> crate::txn::TxnReply {
        let txns = shard.txns.clone();
        let markers = MarkerWriter::new(shard.clone());
        txns.exec(&ServiceContext::new(&shard), markers, self).await
    }
}

/// Longest the coordinator loader waits between two scans without a role-change notice.
const COORDINATOR_SCAN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The shard's coordinator loader, for its life: a coordinator moves with its
/// partition's leadership (Kafka's `onElection` / `onResignation`). Whenever a replica of
/// `__consumer_offsets` or `__transaction_state` changes role (`Shard::coordinator_roles`,
/// notified where assignments are applied) — and every second anyway — the partitions
/// this node no longer leads are unloaded and those it leads now are loaded (replayed
/// from the replicated log), so that a transaction left open or ending is finished or
/// timed out without waiting for its producer, and a group's members find it loaded.
/// On a single node every partition is led: the transaction state is loaded at start,
/// the groups on first use (as before).
pub async fn run_coordinator_loads(shard: Rc<Shard>) {
    while !shard.shutting_down.get() {
        // Listening before the scan: a role change during it triggers the next one.
        let changed = shard.coordinator_roles.listen();
        load_led_coordinators(&shard).await;
        let timer = glommio::timer::sleep(COORDINATOR_SCAN_INTERVAL);
        let shutdown = shard.shutdown.listen();
        futures_lite::future::or(changed, futures_lite::future::or(timer, shutdown)).await;
    }
}

/// One scan of [`run_coordinator_loads`].
async fn load_led_coordinators(shard: &Rc<Shard>) {
    shard.groups.drop_stale();
    shard.txns.drop_stale();
    let catalog = shard.catalog();
    for topic in [crate::group::OFFSETS_TOPIC, crate::txn::TXN_TOPIC] {
        let Some(meta) = catalog.topics.get(topic).cloned() else {
            continue;
        };
        let cluster = !meta.assignment.is_empty();
        if !cluster && topic == crate::group::OFFSETS_TOPIC {
            continue;
        }
        let name: std::sync::Arc<str> = std::sync::Arc::from(topic);
        for index in 0..meta.partitions {
            if shard.router.owner(topic, index) != shard.id {
                continue;
            }
            let tp = (name.clone(), index);
            let loaded = if topic == crate::txn::TXN_TOPIC {
                shard.txns.is_loaded(index)
            } else {
                shard.groups.is_loaded(index)
            };
            // In a cluster the replicas hosted here are open (their assignment applied);
            // only the ones led here are loaded.
            let led = shard
                .partitions
                .borrow()
                .get(&tp)
                .is_some_and(|p| p.replica().is_leader() && !p.leads_without_acknowledged());
            if loaded || (cluster && !led) {
                continue;
            }
            let ctx = ServiceContext::new(shard);
            let result = if topic == crate::txn::TXN_TOPIC {
                let markers = MarkerWriter::new(shard.clone());
                shard.txns.clone().load_owned(&ctx, markers, index).await
            } else {
                shard.groups.clone().load_owned(&ctx, index).await
            };
            if let Err(code) = result {
                tracing::warn!(
                    topic,
                    partition = index,
                    "cannot load coordinator state: error {code}"
                );
            }
        }
    }
}

#[cfg(test)]
mod txn_tests {
    //! KIP-890's guard at the append, on a one-shard node (`crate::txn::testing`): the
    //! coordinator's answer is stood in for, and an ABORT marker of the producer is
    //! written while it "answers" — a batch or offset commit checked against the
    //! transaction before it ended.

    use super::*;
    use crate::errors;
    use crate::group::{CommitArgs, OFFSETS_TOPIC, OffsetCommit};
    use crate::txn::testing::{self, PATIENCE, log_end, open, tp};
    use wire::{ProducerEpoch, ProducerId};

    const PRODUCER: (wire::ProducerId, wire::ProducerEpoch) = (ProducerId(42), ProducerEpoch(0));
    const ABORT: Marker = Marker {
        producer_id: PRODUCER.0,
        producer_epoch: PRODUCER.1,
        commit: false,
        coordinator_epoch: 0,
    };

    async fn abort_marker(shard: Rc<Shard>, tp: TopicPartition) {
        let deadline = Instant::now() + PATIENCE;
        let written = WriteMarkerCall { tp, marker: ABORT }.run(shard, deadline);
        assert_eq!(written.await, errors::NONE, "the ABORT marker");
    }

    /// A TxnOffsetCommit of `producer` for `group`: offset 7 of "t"-0, or nothing.
    fn offset_commit(group: &str, producer: Producer, offsets: bool) -> TxnOffsetCommitCall {
        let offsets = offsets.then(|| OffsetCommit {
            topic: "t".into(),
            partition: 0,
            offset: wire::Offset(7),
            leader_epoch: LeaderEpoch::NONE,
            metadata: None,
        });
        TxnOffsetCommitCall {
            partition: 0,
            transactional_id: Arc::from("tx"),
            commit: CommitArgs {
                group: group.into(),
                generation: -1,
                member_id: String::new(),
                instance_id: None,
                offsets: offsets.into_iter().collect(),
            },
            producer,
        }
    }

    fn produce_call() -> ProduceCall {
        ProduceCall {
            tp: tp("t", 0),
            records: testing::txn_batch(PRODUCER, 0, 2),
            acks: crate::partition::Acks::All,
            replicated_by: Instant::now() + PATIENCE,
            transactional_id: Some(Arc::from("tx")),
        }
    }

    /// A transactional batch whose transaction was aborted while its coordinator
    /// verified it is refused after the ABORT marker (INVALID_TXN_STATE) instead of
    /// opening a transaction there that no coordinator knows of: the partition's LSO would
    /// have stood behind it for ever. Verified with nothing in between, it goes in.
    #[test]
    fn a_batch_verified_before_its_transaction_was_aborted_is_refused() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        crate::storage::testing::run_on_shard(move || async move {
            let shard = testing::node(&data);
            testing::create_topic(&shard, "t");
            let p = open(&shard, "t", 0).await;
            let aborted_meanwhile = |shard: Rc<Shard>, _: Arc<str>, _: Producer, tp| async move {
                abort_marker(shard, tp).await;
                errors::NONE
            };
            let out = produce_call()
                .append_verified(shard.clone(), aborted_meanwhile)
                .await;
            assert_eq!(out.error, errors::INVALID_TXN_STATE);
            assert_eq!(log_end(&p), wire::Offset(1), "only the marker");
            assert_eq!(p.producers.first_unstable_offset(), None);
            assert_eq!(p.producers.verifications_open(), 0);

            let answered = |_: Rc<Shard>, _: Arc<str>, _: Producer, _| async { errors::NONE };
            let out = produce_call()
                .append_verified(shard.clone(), answered)
                .await;
            assert_eq!(
                (out.error, out.base_offset),
                (errors::NONE, wire::Offset(1))
            );
            assert_eq!(p.producers.first_unstable_offset(), Some(wire::Offset(1)));
            assert_eq!(p.producers.verifications_open(), 0, "ended with the append");
            shard.close_all().await;
        });
    }

    /// The same for a TxnOffsetCommit: verified, then its transaction aborted, it is
    /// refused and holds nothing. Before, it was appended after the ABORT marker: a
    /// transaction in `__consumer_offsets` that no marker would end, its offsets held for
    /// ever (`require_stable` fetches answered UNSTABLE_OFFSET_COMMIT, the log cleaner
    /// stopped at it).
    #[test]
    fn an_offset_commit_verified_before_its_transaction_was_aborted_is_refused() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        crate::storage::testing::run_on_shard(move || async move {
            let shard = testing::node(&data);
            testing::internal_topics(&shard).await;
            let offsets = open(&shard, OFFSETS_TOPIC, 0).await;
            let call = offset_commit("g", PRODUCER, true);
            let aborted_meanwhile = |shard: Rc<Shard>, _: Arc<str>, _: Producer, index| async move {
                abort_marker(shard, tp(OFFSETS_TOPIC, index)).await;
                errors::NONE
            };
            let reply = call.commit_verified(shard.clone(), aborted_meanwhile).await;
            assert!(
                matches!(&reply, GroupReply::Codes(errors::NONE, per) if per == &[errors::INVALID_TXN_STATE]),
                "refused: {reply:?}"
            );
            assert_eq!(log_end(&offsets), wire::Offset(1), "only the marker");
            assert_eq!(offsets.producers.first_unstable_offset(), None);
            assert_eq!(offsets.producers.verifications_open(), 0);
            assert_eq!(shard.groups.pending_txn_offsets(0), 0, "nothing held");
            shard.close_all().await;
        });
    }

    /// While a transactional batch or a TxnOffsetCommit waits for its coordinator's
    /// answer, the call holds no inbox slot of the peer that sent it: 256 such waits
    /// (a coordinator on a slow or unreachable node) held every slot, and the peer's
    /// produces and fetches to this shard stalled behind them.
    #[test]
    fn waits_for_the_coordinator_hold_no_inbox_slot() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        crate::storage::testing::run_on_shard(move || async move {
            let shard = testing::node(&data);
            testing::internal_topics(&shard).await;
            testing::create_topic(&shard, "t");
            let permits = Rc::new(glommio::sync::Semaphore::new(2));
            let slot = |permits: &Rc<glommio::sync::Semaphore>| {
                let permit = permits.try_acquire_static_permit(1).expect("a permit");
                super::super::mesh::InboxSlot::holding(permit)
            };
            let (produce_slot, commit_slot) = (slot(&permits), slot(&permits));
            let held_while_verifying = Rc::new(std::cell::Cell::new(Vec::new()));
            let seen = |slot: &super::super::mesh::InboxSlot| {
                let (slot, seen) = (slot.clone(), held_while_verifying.clone());
                move |_: Rc<Shard>, _: Arc<str>, _: Producer, _| {
                    let mut all = seen.take();
                    all.push(slot.held());
                    seen.set(all);
                    async { errors::NONE }
                }
            };
            let out = super::super::mesh::with_slot(
                produce_slot.clone(),
                produce_call().append_verified(shard.clone(), seen(&produce_slot)),
            )
            .await;
            assert_eq!(out.error, errors::NONE);
            let commit = offset_commit("g", PRODUCER, false);
            let verify = seen(&commit_slot);
            let verify = move |s: Rc<Shard>, id: Arc<str>, p: Producer, index: i32| {
                verify(s, id, p, tp(OFFSETS_TOPIC, index))
            };
            super::super::mesh::with_slot(
                commit_slot.clone(),
                commit.commit_verified(shard.clone(), verify),
            )
            .await;
            assert_eq!(
                held_while_verifying.take(),
                vec![false, false],
                "slots given back"
            );
            assert_eq!(permits.available(), 2, "both permits returned");
            shard.close_all().await;
        });
    }

    /// A fenced (older-epoch) producer's TxnOffsetCommit, begun while the current epoch's
    /// commit waits for its coordinator, does not end the current one's verification
    /// (Kafka keeps one guard per producer and only raises its epoch). Before, the current
    /// commit was refused with INVALID_TXN_STATE (found by review).
    #[test]
    fn a_fenced_epochs_commit_does_not_end_the_current_epochs_verification() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        crate::storage::testing::run_on_shard(move || async move {
            let shard = testing::node(&data);
            testing::internal_topics(&shard).await;
            let offsets = open(&shard, OFFSETS_TOPIC, 0).await;
            let current = offset_commit("g", (PRODUCER.0, ProducerEpoch(1)), true);
            // While the current epoch's coordinator answers, the zombie (epoch 0) of the
            // same producer id commits too; its coordinator fences it.
            let zombie_meanwhile = |shard: Rc<Shard>, _: Arc<str>, _: Producer, _| async move {
                let zombie = offset_commit("g2", PRODUCER, true);
                let fenced =
                    |_: Rc<Shard>, _: Arc<str>, _: Producer, _| async { errors::PRODUCER_FENCED };
                let _ = zombie.commit_verified(shard, fenced).await;
                errors::NONE
            };
            let reply = current
                .commit_verified(shard.clone(), zombie_meanwhile)
                .await;
            let n = offsets.producers.verifications_open();
            shard.close_all().await;
            assert_eq!(n, 0);
            assert!(
                matches!(&reply, GroupReply::Codes(errors::NONE, per) if per == &[errors::NONE]),
                "the current epoch's commit was refused: {reply:?}"
            );
        });
    }
}
