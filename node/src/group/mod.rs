//! The group coordinator: consumer groups and their committed offsets.
//!
//! A group hashes (Kafka's rule: `abs(groupId.hashCode) % partitions`) to one partition of
//! the internal topic `__consumer_offsets`; the shard that owns that partition hosts the
//! group. Its state lives on that shard only, in [`Coordinators`] (a field of the shard):
//! the [`state::Group`] state machines of the groups whose partitions this shard owns, and
//! the open `__consumer_offsets` partitions they are written to.
//!
//! Durability: offset commits, and a group's metadata whenever a generation completes or
//! the group empties, are appended to the group's partition in Kafka's record formats
//! ([`schema`]). On first use after a start, a shard replays each of its partitions from
//! the log start: the latest value per key wins, a null value (tombstone) deletes.
//! Connection shards reach the coordinator with a [`GroupCall`] (see `shard::calls`).

pub mod codes;
pub mod schema;
pub mod state;

mod park;
mod store;
#[cfg(test)]
mod txn_tests;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use glommio::channels::local_channel;
use wire::{LeaderEpoch, Offset};

use crate::coordinator::Led;
use crate::partition::Partition;
use crate::producer_state::partition::VerificationGuard;
use crate::shard::context::ServiceContext;
use crate::shard::{mono_ms, now_ms};
use schema::OffsetValue;
use state::{Group, JoinArgs, JoinResult, Limits, Now, State, SyncArgs, SyncResult};

/// The internal topic holding committed offsets and group metadata.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// How often a shard's coordinator checks sessions and rebalance deadlines.
const TICK_MS: u64 = 200;
/// Bound on waiting for writes in flight before a deletion (2 ms each: one second).
const QUIESCE_ROUNDS_MAX: u32 = 500;

/// Kafka's `Utils.abs(groupId.hashCode()) % partitions`: the same partition as Kafka, so a
/// Kafka `__consumer_offsets` log dir keeps its meaning here.
pub fn partition_for(group: &str, partitions: i32) -> i32 {
    let mut h: i32 = 0;
    for unit in group.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions.max(1)
}

/// Coordinator settings, under Kafka's keys.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `offsets.topic.num.partitions` (used when the topic is created).
    pub num_partitions: i32,
    /// `offsets.topic.segment.bytes`.
    pub segment_bytes: i64,
    /// `offsets.topic.replication.factor` (Kafka's default 3; capped at the live nodes
    /// when the topic is created, so 1 on a single node).
    pub replication_factor: i16,
    /// `offsets.retention.minutes`, in ms.
    pub retention_ms: i64,
    /// `offsets.retention.check.interval.ms`.
    pub retention_check_ms: i64,
    /// `offset.metadata.max.bytes`.
    pub metadata_max_bytes: usize,
    /// `group.min.session.timeout.ms` / `group.max.session.timeout.ms`.
    pub session_min_ms: i32,
    pub session_max_ms: i32,
    pub limits: Limits,
}

impl Settings {
    pub fn from_config(config: &crate::config::Config) -> Settings {
        let props = &config.props;
        let num = |key: &str, default: i64| -> i64 {
            props
                .get(key)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(default)
        };
        Settings {
            num_partitions: num("offsets.topic.num.partitions", 50).clamp(1, 1000) as i32,
            segment_bytes: num("offsets.topic.segment.bytes", 104_857_600).max(1 << 14),
            replication_factor: num("offsets.topic.replication.factor", 3).clamp(1, 255) as i16,
            retention_ms: num("offsets.retention.minutes", 10_080).max(1) * 60_000,
            retention_check_ms: num("offsets.retention.check.interval.ms", 600_000).max(1),
            // Stored as a Kafka string (int16 length): longer metadata could not be logged.
            metadata_max_bytes: num("offset.metadata.max.bytes", 4096).clamp(0, i64::from(i16::MAX))
                as usize,
            session_min_ms: num("group.min.session.timeout.ms", 6_000) as i32,
            session_max_ms: num("group.max.session.timeout.ms", 1_800_000) as i32,
            limits: Limits {
                initial_delay_ms: num("group.initial.rebalance.delay.ms", 3_000).max(0),
                max_size: num("group.max.size", i64::from(i32::MAX)).max(1) as usize,
            },
        }
    }
}

/// An offset commit, version-independent.
#[derive(Clone, Debug, Default)]
pub struct CommitArgs {
    pub group: String,
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub offsets: Vec<OffsetCommit>,
}

/// One partition's offset in a commit.
#[derive(Clone, Debug, Default)]
pub struct OffsetCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: Offset,
    pub leader_epoch: LeaderEpoch,
    pub metadata: Option<String>,
}

/// One committed offset in an OffsetFetch answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: Offset,
    pub leader_epoch: LeaderEpoch,
    pub metadata: Option<String>,
    pub error: i16,
}

/// A member as DescribeGroups shows it.
#[derive(Clone, Debug, Default)]
pub struct MemberSummary {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// A group as DescribeGroups shows it.
#[derive(Clone, Debug, Default)]
pub struct GroupSummary {
    pub error: i16,
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberSummary>,
}

/// Work for the coordinator of one group (or, for `List`, all groups of a shard).
#[derive(Debug)]
pub enum GroupOp {
    Join(JoinArgs),
    Sync(SyncArgs),
    Heartbeat {
        group: String,
        member_id: String,
        instance_id: Option<String>,
        generation: i32,
    },
    Leave {
        group: String,
        members: Vec<(String, Option<String>)>,
    },
    Commit(CommitArgs),
    /// `topics: None` = every committed offset of the group. `require_stable` (KIP-447):
    /// a partition with a transactional commit pending answers UNSTABLE_OFFSET_COMMIT.
    FetchOffsets {
        group: String,
        topics: Option<Vec<(String, Vec<i32>)>>,
        require_stable: bool,
    },
    Describe {
        group: String,
    },
    List,
    Delete {
        group: String,
    },
    DeleteOffsets {
        group: String,
        partitions: Vec<(String, i32)>,
    },
    /// Asks again for a JoinGroup/SyncGroup answer parked under a ticket (see `park`).
    Await {
        ticket: u64,
    },
    /// TxnOffsetCommit: offsets logged now, applied when the producer's COMMIT marker
    /// reaches this partition, dropped on ABORT. `verified`: the KIP-890 verification
    /// begun on the partition before the transaction coordinator was asked
    /// (`shard::calls::TxnOffsetCommitCall`); the append goes in only while it holds.
    TxnCommit {
        commit: CommitArgs,
        producer_id: wire::ProducerId,
        producer_epoch: wire::ProducerEpoch,
        verified: VerificationGuard,
    },
}

/// A [`GroupOp`] addressed to the coordinator of `partition` (ignored for `List`).
#[derive(Debug)]
pub struct GroupCall {
    pub partition: i32,
    pub op: GroupOp,
}

/// The coordinator's answer.
#[derive(Debug)]
pub enum GroupReply {
    Join(JoinResult),
    Sync(SyncResult),
    Code(i16),
    /// A top-level code and one code per item, in request order.
    Codes(i16, Vec<i16>),
    Offsets(i16, Vec<FetchedOffset>),
    Described(GroupSummary),
    /// (group id, protocol type, state) of every group on the shard.
    Listed(Vec<(String, String, &'static str)>),
    /// The answer is not there yet: ask again with [`GroupOp::Await`].
    Parked(u64),
}

/// The coordinator state of one shard.
#[derive(Default)]
pub struct Coordinators {
    groups: RefCell<HashMap<String, Group>>,
    /// Loaded `__consumer_offsets` partitions of this shard (shared host machinery).
    partitions: crate::coordinator::PartitionLoads,
    ticker_started: Cell<bool>,
    /// How many partitions `__consumer_offsets` has (from the catalogue, at load).
    topic_partitions: Cell<i32>,
    /// Appends to `__consumer_offsets` issued and not yet applied (see `quiesce`).
    writes_in_flight: Cell<u32>,
    /// Read from the broker config on first use (it does not change while running).
    settings: std::cell::OnceCell<Settings>,
    /// JoinGroup/SyncGroup answers still to come, by ticket (see `park`).
    parked: RefCell<HashMap<u64, (park::Pending, i64)>>,
    next_ticket: Cell<u64>,
    /// Transactional offset commits waiting for their marker, by partition index.
    pending_txn: RefCell<HashMap<i32, store::PendingTxnOffsets>>,
    /// Groups whose metadata the timers changed, to be written by the store task (the
    /// ticker does not wait for writes: timers keep running while one is slow).
    to_store: RefCell<std::collections::BTreeSet<String>>,
    /// Whether the store task runs.
    storing: Cell<bool>,
    /// The group whose metadata the store task is writing now.
    storing_group: RefCell<Option<String>>,
    /// Whether a retention pass runs (one at a time, beside the ticker).
    expiring: Cell<bool>,
}

/// Counts a write as in flight while alive.
struct Writing<'a>(&'a Cell<u32>);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

impl Coordinators {
    /// Visits every group of this shard (metrics: state, members, committed offsets).
    pub fn for_each_group(&self, f: impl FnMut(&Group)) {
        self.groups.borrow().values().for_each(f);
    }

    /// Runs a group call on this shard (the owner of the call's partition).
    pub async fn exec(self: &Rc<Self>, ctx: &ServiceContext<'_>, call: GroupCall) -> GroupReply {
        let settings = *self
            .settings
            .get_or_init(|| Settings::from_config(ctx.config()));
        self.start_ticker(settings);
        // Served only while this node leads the partition (NOT_COORDINATOR otherwise).
        self.drop_stale();
        if let GroupOp::List = call.op {
            return self.list(ctx).await;
        }
        if !ctx.owns(OFFSETS_TOPIC, call.partition) {
            return GroupReply::Code(codes::NOT_COORDINATOR);
        }
        let part = match self.load(ctx, call.partition).await {
            Ok(p) => p,
            Err(code) => return GroupReply::Code(code),
        };
        self.run(ctx, &part, &settings, call.op).await
    }

    async fn run(
        &self,
        ctx: &ServiceContext<'_>,
        part: &Led,
        s: &Settings,
        op: GroupOp,
    ) -> GroupReply {
        let now = clock();
        match op {
            GroupOp::Join(a) => self.join(ctx, part, s, a).await,
            GroupOp::Sync(a) => self.sync(ctx, part, s, a).await,
            GroupOp::Heartbeat {
                group,
                member_id,
                instance_id,
                generation,
            } => GroupReply::Code(self.with_group(&group, codes::UNKNOWN_MEMBER_ID, |g| {
                g.heartbeat(&member_id, instance_id.as_deref(), generation, now)
            })),
            GroupOp::Leave { group, members } => self.leave(part, s, &group, members).await,
            GroupOp::Commit(a) => self.commit(part, s, a).await,
            GroupOp::FetchOffsets {
                group,
                topics,
                require_stable,
            } => {
                let reply = self.fetch_offsets(&group, topics);
                if require_stable {
                    self.mark_unstable(part.index, &group, reply)
                } else {
                    reply
                }
            }
            GroupOp::Describe { group } => GroupReply::Described(self.describe(&group)),
            GroupOp::Delete { group } => GroupReply::Code(self.delete(part, &group).await),
            GroupOp::DeleteOffsets { group, partitions } => {
                self.delete_offsets(part, &group, partitions).await
            }
            GroupOp::Await { ticket } => self.await_ticket(ctx, ticket).await,
            GroupOp::TxnCommit {
                commit,
                producer_id,
                producer_epoch,
                verified,
            } => {
                let producer = (producer_id, producer_epoch);
                self.txn_commit(part, s, commit, producer, verified).await
            }
            GroupOp::List => GroupReply::Code(codes::INVALID_REQUEST),
        }
    }

    /// Runs `f` on the group if it exists, else answers `missing`.
    fn with_group(&self, group: &str, missing: i16, f: impl FnOnce(&mut Group) -> i16) -> i16 {
        self.groups.borrow_mut().get_mut(group).map_or(missing, f)
    }

    async fn join(
        &self,
        ctx: &ServiceContext<'_>,
        part: &Led,
        s: &Settings,
        a: JoinArgs,
    ) -> GroupReply {
        let now = clock();
        if a.session_timeout_ms < s.session_min_ms || a.session_timeout_ms > s.session_max_ms {
            return GroupReply::Join(JoinResult::error(
                codes::INVALID_SESSION_TIMEOUT,
                &a.member_id,
            ));
        }
        let group = a.group.clone();
        let member = a.member_id.clone();
        let (tx, rx) = local_channel::new_bounded(1);
        let replacement = {
            let mut groups = self.groups.borrow_mut();
            let created = !groups.contains_key(&group);
            let g = groups
                .entry(group.clone())
                .or_insert_with(|| Group::new(&group, now));
            let replacement = g.join(a, now, &s.limits, tx);
            g.try_complete_join(now);
            let replacement = replacement.map(|r| (r, g.to_value()));
            // A refused join (no common protocol, an unknown member id, a full group)
            // leaves no group behind: nothing but this call made it.
            if created && g.is_blank() {
                groups.remove(&group);
            }
            replacement
        };
        match replacement {
            Some((r, value)) => self.store_replacement(part, &group, r, value).await,
            None => self.store_if_dirty(part, &group).await,
        }
        self.wait_pending(ctx, park::Pending::Join(rx, member))
            .await
    }

    /// Writes the metadata naming a replaced static member's new id, then lets the group
    /// answer it: the new id if stored, else the mapped error and the old id back (a new
    /// id only logged as failed would be fenced by the next coordinator's replay).
    async fn store_replacement(
        &self,
        part: &Led,
        group: &str,
        r: state::Replacement,
        value: schema::GroupValue,
    ) {
        let result = self.write_group(part, group, &value).await;
        if let Err(code) = result {
            tracing::warn!(
                group,
                "cannot store a static member's replacement: error {code}"
            );
        }
        // As in `store_assignment`: a lost lead dropped the group and answered its waiters.
        if !part.leads() {
            return;
        }
        if let Some(g) = self.groups.borrow_mut().get_mut(group) {
            g.replacement_written(r, result, clock());
        }
    }

    async fn sync(
        &self,
        ctx: &ServiceContext<'_>,
        part: &Led,
        s: &Settings,
        a: SyncArgs,
    ) -> GroupReply {
        let group = a.group.clone();
        let (tx, rx) = local_channel::new_bounded(1);
        // The leader's call: the assignment to store, with the group's metadata as Kafka
        // writes it (this generation, every member's assignment).
        let staged = match self.groups.borrow_mut().get_mut(&group) {
            Some(g) => Ok(g
                .sync(a, clock(), tx)
                .map(|generation| (generation, g.to_value()))),
            None => Err(()),
        };
        match staged {
            Err(()) => return GroupReply::Sync(SyncResult::error(codes::UNKNOWN_MEMBER_ID)),
            Ok(Some((generation, value))) => {
                self.store_assignment(part, s, &group, generation, value)
                    .await
            }
            Ok(None) => self.store_if_dirty(part, &group).await,
        }
        self.wait_pending(ctx, park::Pending::Sync(rx)).await
    }

    /// Writes the leader's assignment of `generation`, then lets the group answer its
    /// members: their assignments if it was stored, else the error Kafka maps the failed
    /// append to (NOT_ENOUGH_REPLICAS → COORDINATOR_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER
    /// → NOT_COORDINATOR, a timeout → REBALANCE_IN_PROGRESS), and a rebalance. An
    /// assignment only logged as failed would have members consume a generation that a
    /// new coordinator never hears of.
    async fn store_assignment(
        &self,
        part: &Led,
        s: &Settings,
        group: &str,
        generation: i32,
        value: schema::GroupValue,
    ) {
        let result = self.write_group(part, group, &value).await;
        if let Err(code) = result {
            tracing::warn!(
                group,
                generation,
                "cannot store the leader's assignment: error {code}; the members rejoin"
            );
        }
        // The lead its state was loaded under ended (even if regained since): the group
        // was dropped, and whatever has its id now was replayed from the log, not this
        // write's to decide.
        if !part.leads() {
            return;
        }
        if let Some(g) = self.groups.borrow_mut().get_mut(group) {
            g.assignment_written(generation, result, clock(), &s.limits);
        }
    }

    async fn leave(
        &self,
        part: &Led,
        s: &Settings,
        group: &str,
        members: Vec<(String, Option<String>)>,
    ) -> GroupReply {
        let now = clock();
        let codes_out: Option<Vec<i16>> = self.groups.borrow_mut().get_mut(group).map(|g| {
            members
                .iter()
                .map(|(id, instance)| g.leave(id, instance.as_deref(), now, &s.limits))
                .collect()
        });
        let Some(per_member) = codes_out else {
            let all = vec![codes::UNKNOWN_MEMBER_ID; members.len()];
            return GroupReply::Codes(codes::UNKNOWN_MEMBER_ID, all);
        };
        self.store_if_dirty(part, group).await;
        // v0-v2 name one member: its code is the top-level code.
        let top = if per_member.len() == 1 {
            per_member[0]
        } else {
            codes::NONE
        };
        GroupReply::Codes(top, per_member)
    }

    /// Checks, persists, then applies an offset commit; one code per offset.
    async fn commit(&self, part: &Led, s: &Settings, a: CommitArgs) -> GroupReply {
        let now = clock();
        let check = match self.groups.borrow().get(&a.group) {
            Some(g) => g.check_commit(&a.member_id, a.instance_id.as_deref(), a.generation),
            None if a.generation < 0 => Ok(()),
            None => Err(codes::ILLEGAL_GENERATION),
        };
        if let Err(code) = check {
            return GroupReply::Codes(codes::NONE, vec![code; a.offsets.len()]);
        }
        let (per, mut writes) = offset_writes(&a, s, now.wall_ms);
        let writing = self.writing();
        match store::write_offsets(part, &a.group, &writes).await {
            Ok(at) => writes.iter_mut().for_each(|(_, v)| v.appended_at = at),
            Err(code) => return GroupReply::Codes(codes::NONE, failed_writes(&per, code)),
        }
        let mut groups = self.groups.borrow_mut();
        let g = groups
            .entry(a.group.clone())
            .or_insert_with(|| Group::new(&a.group, now));
        for (key, value) in writes {
            // A value appended later (a transaction's, committed meanwhile) stays, as
            // Kafka's onOffsetCommitAppend and as a reload would keep it.
            let newer = g
                .offsets
                .get(&key)
                .is_some_and(|held| held.appended_at > value.appended_at);
            if !newer {
                g.offsets.insert(key, value);
            }
        }
        // Applied in the same poll as the append completed: a deletion (which waits for
        // no write in flight) never decides between the two.
        drop(writing);
        GroupReply::Codes(codes::NONE, per)
    }

    /// TxnOffsetCommit: checked like a commit (a generation of -1 skips the member
    /// check), logged as a transactional batch, held until the producer's marker.
    ///
    /// Held from the step its batch took its offsets (Kafka's
    /// `pendingTransactionalOffsetCommits`), not once it is replicated: the marker that
    /// ends the transaction may be appended right after the batch and be replicated,
    /// and complete the transaction, before this task runs again; held later, the offsets
    /// would wait for a marker that had come and gone. A batch that was not written is
    /// dropped again; one that was written stays held even if its replication fails (it
    /// is in the log, and its marker decides it, as a replay of the log would).
    async fn txn_commit(
        &self,
        part: &Led,
        s: &Settings,
        a: CommitArgs,
        producer: (wire::ProducerId, wire::ProducerEpoch),
        verified: VerificationGuard,
    ) -> GroupReply {
        let now = now_ms();
        let check = match self.groups.borrow().get(&a.group) {
            Some(_) if a.generation < 0 => Ok(()),
            Some(g) => g.check_txn_commit(&a.member_id, a.instance_id.as_deref(), a.generation),
            None => Ok(()),
        };
        if let Err(code) = check {
            return GroupReply::Codes(codes::NONE, vec![code; a.offsets.len()]);
        }
        let (per, writes) = offset_writes(&a, s, now);
        if writes.is_empty() {
            return GroupReply::Codes(codes::NONE, per);
        }
        // In flight until replicated, as a plain commit (see `quiesce`).
        let _writing = self.writing();
        let appended = store::append_txn_offsets(part, &a.group, producer, verified, &writes);
        let (at, written) = match appended.await {
            Ok(appended) => appended,
            Err(code) => return GroupReply::Codes(codes::NONE, failed_writes(&per, code)),
        };
        // Same step as the append's first poll: no marker can come between.
        self.pending_txn
            .borrow_mut()
            .entry(part.index)
            .or_default()
            .hold_batch(producer.0, at, &a.group, writes);
        if let Err(code) = written.await {
            if let Some(p) = self.pending_txn.borrow_mut().get_mut(&part.index) {
                p.drop_batch(producer.0, at);
            }
            return GroupReply::Codes(codes::NONE, failed_writes(&per, code));
        }
        match crate::coordinator::await_replicated(part, part.epoch(), at.end).await {
            codes::NONE => GroupReply::Codes(codes::NONE, per),
            code => {
                let code = crate::coordinator::WriteKind::Offsets.code(code);
                GroupReply::Codes(codes::NONE, failed_writes(&per, code))
            }
        }
    }

    /// The producer's marker was appended at `marker_at` in `__consumer_offsets`
    /// partition `index` (on this shard) and replicated: the offset commits of every
    /// transaction of the producer it closes (each begun before it) are applied (COMMIT)
    /// or dropped. Commits of a later transaction of the producer, appended after the
    /// marker while it was being replicated, stay held for their own marker.
    pub async fn complete_txn(
        &self,
        ctx: &ServiceContext<'_>,
        index: i32,
        marker: crate::producer_state::partition::Marker,
        marker_at: Offset,
    ) -> i16 {
        if let Err(code) = self.load(ctx, index).await {
            return code;
        }
        let done = self
            .pending_txn
            .borrow_mut()
            .get_mut(&index)
            .map(|p| p.take_closed(marker.producer_id, marker_at))
            .unwrap_or_default();
        if marker.commit {
            store::apply_committed(&mut self.groups.borrow_mut(), done, clock());
        }
        codes::NONE
    }

    /// The loaded `__consumer_offsets` partition `index`, as [`Self::exec`] serves it
    /// (NOT_COORDINATOR where this node does not lead it): a TxnOffsetCommit begins its
    /// KIP-890 verification on it before the transaction coordinator is asked.
    pub async fn led(&self, ctx: &ServiceContext<'_>, index: i32) -> Result<Led, i16> {
        self.drop_stale();
        if !ctx.owns(OFFSETS_TOPIC, index) {
            return Err(codes::NOT_COORDINATOR);
        }
        self.load(ctx, index).await
    }

    /// Offset values held for open transactions in partition `index` (tests).
    #[cfg(test)]
    pub fn pending_txn_offsets(&self, index: i32) -> usize {
        self.pending_txn.borrow().get(&index).map_or(0, |p| p.len())
    }

    /// Marks the offsets of `group` that a pending transaction will change.
    fn mark_unstable(&self, index: i32, group: &str, reply: GroupReply) -> GroupReply {
        let GroupReply::Offsets(code, mut offsets) = reply else {
            return reply;
        };
        let pending = self.pending_txn.borrow();
        let Some(pending) = pending.get(&index) else {
            return GroupReply::Offsets(code, offsets);
        };
        // Built once per call: checking each offset against every pending one is
        // offsets x pending.
        let unstable = pending.unstable(group);
        for o in &mut offsets {
            if unstable.contains(&(o.topic.as_str(), o.partition)) {
                o.error = codes::UNSTABLE_OFFSET_COMMIT;
            }
        }
        GroupReply::Offsets(code, offsets)
    }

    fn fetch_offsets(&self, group: &str, topics: Option<Vec<(String, Vec<i32>)>>) -> GroupReply {
        let groups = self.groups.borrow();
        let offsets = groups.get(group).map(|g| &g.offsets);
        let found = |t: &str, p: i32| offsets.and_then(|o| o.get(&(t.to_string(), p)));
        let entry = |t: &str, p: i32| {
            let v = found(t, p);
            FetchedOffset {
                topic: t.to_string(),
                partition: p,
                offset: v.map_or(Offset::NONE, |v| v.offset),
                leader_epoch: v.map_or(LeaderEpoch::NONE, |v| v.leader_epoch),
                metadata: Some(v.map(|v| v.metadata.clone()).unwrap_or_default()),
                error: codes::NONE,
            }
        };
        let out = match topics {
            Some(topics) => topics
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |p| (t, *p)))
                .map(|(t, p)| entry(t, p))
                .collect(),
            None => offsets
                .into_iter()
                .flat_map(|o| o.keys())
                .map(|(t, p)| entry(t, *p))
                .collect(),
        };
        GroupReply::Offsets(codes::NONE, out)
    }

    fn describe(&self, group: &str) -> GroupSummary {
        let groups = self.groups.borrow();
        let Some(g) = groups.get(group) else {
            return GroupSummary {
                state: "Dead",
                ..GroupSummary::default()
            };
        };
        let stable = g.state == State::Stable;
        let protocol = g.protocol.clone().unwrap_or_default();
        let members = g
            .members
            .iter()
            .map(|m| MemberSummary {
                member_id: m.id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: if stable {
                    m.metadata(&protocol)
                } else {
                    Bytes::new()
                },
                assignment: if stable {
                    m.assignment.clone()
                } else {
                    Bytes::new()
                },
            })
            .collect();
        GroupSummary {
            error: codes::NONE,
            state: g.state.name(),
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: if stable { protocol } else { String::new() },
            members,
        }
    }

    /// Loads every partition of this shard, then lists its groups.
    async fn list(&self, ctx: &ServiceContext<'_>) -> GroupReply {
        if let Some(topic) = ctx.catalog().topics.get(OFFSETS_TOPIC).cloned() {
            for p in 0..topic.partitions {
                if ctx.owns(OFFSETS_TOPIC, p) {
                    let _ = self.load(ctx, p).await;
                }
            }
        }
        let groups = self.groups.borrow();
        let listed = groups
            .values()
            .map(|g| {
                let kind = g.protocol_type.clone().unwrap_or_default();
                (g.id.clone(), kind, g.state.name())
            })
            .collect();
        GroupReply::Listed(listed)
    }

    /// DeleteGroups: only an empty group; its metadata and offsets get tombstones.
    async fn delete(&self, part: &Led, group: &str) -> i16 {
        if !self.quiesce(group).await {
            return codes::COORDINATOR_LOAD_IN_PROGRESS;
        }
        let seen = match self.groups.borrow().get(group) {
            None => return codes::GROUP_ID_NOT_FOUND,
            Some(g) if !g.is_idle() => return codes::NON_EMPTY_GROUP,
            Some(g) => g.offsets.clone(),
        };
        let keys: Vec<(String, i32)> = seen.keys().cloned().collect();
        let _writing = self.writing();
        if let Err(code) = store::tombstones(part, group, &keys, true).await {
            return code;
        }
        // A commit or join that raced with the tombstones was logged after them: keep it.
        let mut groups = self.groups.borrow_mut();
        if let Some(g) = groups.get_mut(group) {
            g.offsets.retain(|k, v| seen.get(k) != Some(v));
            if g.is_idle() && g.offsets.is_empty() {
                groups.remove(group);
            }
        }
        codes::NONE
    }

    /// OffsetDelete: refused per partition while the group's members subscribe to it.
    async fn delete_offsets(&self, part: &Led, group: &str, ps: Vec<(String, i32)>) -> GroupReply {
        if !self.quiesce(group).await {
            return GroupReply::Codes(codes::COORDINATOR_LOAD_IN_PROGRESS, Vec::new());
        }
        let subscribed = match self.groups.borrow().get(group) {
            None => return GroupReply::Codes(codes::GROUP_ID_NOT_FOUND, Vec::new()),
            Some(g) => store::subscribed_topics(g),
        };
        let per: Vec<i16> = ps
            .iter()
            .map(|(t, _)| {
                if subscribed.contains(t) {
                    codes::GROUP_SUBSCRIBED_TO_TOPIC
                } else {
                    codes::NONE
                }
            })
            .collect();
        let doomed: Vec<(String, i32)> = ps
            .iter()
            .zip(&per)
            .filter(|(_, c)| **c == codes::NONE)
            .map(|(k, _)| k.clone())
            .collect();
        let seen: Vec<Option<OffsetValue>> = {
            let groups = self.groups.borrow();
            let offsets = groups.get(group).map(|g| &g.offsets);
            doomed
                .iter()
                .map(|k| offsets.and_then(|o| o.get(k)).cloned())
                .collect()
        };
        let _writing = self.writing();
        if let Err(code) = store::tombstones(part, group, &doomed, false).await {
            return GroupReply::Codes(code, Vec::new());
        }
        if let Some(g) = self.groups.borrow_mut().get_mut(group) {
            // Only what is unchanged since the tombstones were issued (see `delete`).
            for (k, v) in doomed.iter().zip(&seen) {
                if g.offsets.get(k) == v.as_ref() {
                    g.offsets.remove(k);
                }
            }
        }
        GroupReply::Codes(codes::NONE, per)
    }

    /// Writes the group's metadata if the state machine changed it.
    async fn store_if_dirty(&self, part: &Led, group: &str) {
        let value = {
            let mut groups = self.groups.borrow_mut();
            let Some(g) = groups.get_mut(group) else {
                return;
            };
            if !g.take_dirty() {
                return;
            }
            g.to_value()
        };
        if let Err(code) = self.write_group(part, group, &value).await {
            tracing::warn!(group, "cannot store group metadata: error {code}");
        }
    }

    /// The open, replayed partition `index` of `__consumer_offsets` on this shard, while
    /// this node leads it.
    async fn load(&self, ctx: &ServiceContext<'_>, index: i32) -> Result<Led, i16> {
        self.partitions
            .load(index, || self.replay(ctx, index))
            .await
    }

    /// Loads partition `index` if this node leads it, and starts the ticker: this node
    /// became its leader (the shard's coordinator loader, on a role change).
    pub async fn load_owned(
        self: &Rc<Self>,
        ctx: &ServiceContext<'_>,
        index: i32,
    ) -> Result<(), i16> {
        let settings = *self
            .settings
            .get_or_init(|| Settings::from_config(ctx.config()));
        self.start_ticker(settings);
        self.drop_stale();
        self.load(ctx, index).await.map(|_| ())
    }

    /// Whether partition `index` is loaded or being loaded.
    pub fn is_loaded(&self, index: i32) -> bool {
        self.partitions.is_loaded(index)
    }

    /// Unloads every partition this node no longer leads (under the epoch it was loaded
    /// at): its groups and pending transactional commits are dropped — members waiting
    /// in a JoinGroup/SyncGroup (parked or not) are answered NOT_COORDINATOR and find the
    /// new coordinator — and the ticker no longer sees them.
    pub fn drop_stale(&self) {
        for index in self.partitions.stale() {
            let partitions = self.topic_partitions.get();
            let dropped = {
                let mut groups = self.groups.borrow_mut();
                let before = groups.len();
                groups.retain(|id, g| {
                    let keep = partition_for(id, partitions) != index;
                    if !keep {
                        g.fail_waiters(codes::NOT_COORDINATOR, clock());
                    }
                    keep
                });
                before - groups.len()
            };
            self.pending_txn.borrow_mut().remove(&index);
            self.partitions.unload(index);
            tracing::info!(
                partition = index,
                groups = dropped,
                "unloaded group coordinator state: no longer the partition's leader"
            );
        }
    }

    async fn replay(
        &self,
        ctx: &ServiceContext<'_>,
        index: i32,
    ) -> Result<(Rc<Partition>, LeaderEpoch), i16> {
        let tp = (std::sync::Arc::from(OFFSETS_TOPIC), index);
        let (part, epoch) = crate::coordinator::open_led(ctx, &tp).await?;
        if let Some(t) = ctx.catalog().topics.get(OFFSETS_TOPIC) {
            self.topic_partitions.set(t.partitions);
        }
        let started = std::time::Instant::now();
        // Replayed into a map of its own: no borrow of `self.groups` across the reads.
        let mut loaded = HashMap::new();
        let mut pending = store::PendingTxnOffsets::new();
        let records = store::replay(&part, &mut loaded, &mut pending, clock()).await?;
        {
            // The log is the partition's whole state: nothing older of it stays.
            let partitions = self.topic_partitions.get();
            let mut groups = self.groups.borrow_mut();
            groups.retain(|id, _| partition_for(id, partitions) != index);
            groups.extend(loaded);
        }
        self.pending_txn.borrow_mut().insert(index, pending);
        tracing::info!(
            partition = index,
            records,
            epoch = %epoch,
            ms = started.elapsed().as_millis() as u64,
            "loaded group coordinator state"
        );
        Ok((part, epoch))
    }

    /// Waits (bounded) until no write is in flight and `group`'s metadata is neither
    /// queued for the store task nor being written by it (such a write landing after a
    /// deletion's tombstones would bring the group back at the next load), so that state
    /// read right after (in the same poll) holds every record logged so far. Other
    /// groups' queued writes do not hold it. Returns false on timeout.
    async fn quiesce(&self, group: &str) -> bool {
        for _ in 0..QUIESCE_ROUNDS_MAX {
            let queued = self.to_store.borrow().contains(group)
                || self.storing_group.borrow().as_deref() == Some(group);
            if self.writes_in_flight.get() == 0 && !queued {
                return true;
            }
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    /// Writes `group`'s metadata, counted as a write in flight from the caller's poll on
    /// (`quiesce` waits for it).
    async fn write_group(
        &self,
        part: &Led,
        group: &str,
        value: &schema::GroupValue,
    ) -> Result<(), i16> {
        let _writing = self.writing();
        store::write_group(part, group, value).await
    }

    fn writing(&self) -> Writing<'_> {
        self.writes_in_flight.set(self.writes_in_flight.get() + 1);
        Writing(&self.writes_in_flight)
    }

    /// Starts this shard's timer task once: sessions, rebalance deadlines, retention.
    /// (Compaction of `__consumer_offsets` is the log cleaner's: the shard's housekeeping
    /// cleans it like every `cleanup.policy=compact` log.)
    fn start_ticker(self: &Rc<Self>, settings: Settings) {
        if self.ticker_started.replace(true) {
            return;
        }
        let me = self.clone();
        glommio::spawn_local(async move {
            let mut last_retention = mono_ms();
            // Never waits for I/O: writes and retention run in tasks of their own, so a
            // slow write holds no session expiry or rebalance deadline.
            loop {
                glommio::timer::sleep(Duration::from_millis(TICK_MS)).await;
                let now = clock();
                me.drop_idle_parked(now.mono_ms);
                me.drop_stale();
                me.tick(now, &settings);
                if now.mono_ms - last_retention >= settings.retention_check_ms && !me.expiring.get()
                {
                    last_retention = now.mono_ms;
                    // Offsets retention compares stored times: the system clock.
                    let now = now.wall_ms;
                    me.expiring.set(true);
                    let task = me.clone();
                    glommio::spawn_local(async move {
                        task.expire_offsets(now, &settings).await;
                        task.expiring.set(false);
                    })
                    .detach();
                }
            }
        })
        .detach();
    }

    /// Runs every group's timers; the metadata they changed is queued for the store task.
    fn tick(self: &Rc<Self>, now: Now, s: &Settings) {
        let mut to_store = self.to_store.borrow_mut();
        for g in self.groups.borrow_mut().values_mut() {
            g.tick(now, &s.limits);
            if g.take_dirty() {
                to_store.insert(g.id.clone());
            }
        }
        if to_store.is_empty() || self.storing.replace(true) {
            return;
        }
        let me = self.clone();
        glommio::spawn_local(async move {
            me.store_queued().await;
            me.storing.set(false);
        })
        .detach();
    }

    /// Writes the queued groups' metadata, one at a time, until the queue is empty (each
    /// value taken right before its write: the latest).
    async fn store_queued(&self) {
        loop {
            let next = self.to_store.borrow_mut().pop_first();
            let Some(group) = next else {
                return;
            };
            let Some(part) = self.partition_of(&group) else {
                continue;
            };
            let value = self.groups.borrow().get(&group).map(Group::to_value);
            let Some(value) = value else {
                continue;
            };
            *self.storing_group.borrow_mut() = Some(group.clone());
            if let Err(code) = self.write_group(&part, &group, &value).await {
                tracing::warn!(group, "cannot store group metadata: error {code}");
            }
            *self.storing_group.borrow_mut() = None;
        }
    }

    /// The loaded partition that holds `group`.
    fn partition_of(&self, group: &str) -> Option<Led> {
        let index = partition_for(group, self.topic_partitions.get());
        self.partitions.get(index)
    }

    /// Offsets retention (KIP-211): offsets of a group that has been empty for
    /// `offsets.retention.minutes` expire (a group without a protocol type: each offset
    /// that long after its commit); a group left with nothing is deleted.
    async fn expire_offsets(&self, now: i64, s: &Settings) {
        let ids: Vec<String> = self.groups.borrow().keys().cloned().collect();
        for group in ids {
            self.expire_group(&group, now, s).await;
        }
    }

    /// Whether `group` has offsets to expire, or is to be deleted.
    fn expiry_due(&self, group: &str, now: i64, s: &Settings) -> bool {
        let groups = self.groups.borrow();
        let Some(g) = groups.get(group) else {
            return false;
        };
        let idle_and_bare = g.is_idle() && g.offsets.is_empty();
        idle_and_bare || !store::expired_offsets(g, now, s.retention_ms).is_empty()
    }

    /// Expires one group's offsets. Decided from the group's state right before the
    /// tombstones are issued (no await between), and applied only to what is still
    /// expired once they are written: a commit or a join that raced with the write wins.
    async fn expire_group(&self, group: &str, now: i64, s: &Settings) {
        // Most groups have nothing due: seen without waiting for writes in flight
        // (`quiesce` may take a second), and decided again after it.
        if !self.expiry_due(group, now, s) || !self.quiesce(group).await {
            return;
        }
        let (keys, all_gone) = {
            let groups = self.groups.borrow();
            let Some(g) = groups.get(group) else {
                return;
            };
            let keys = store::expired_offsets(g, now, s.retention_ms);
            (keys.clone(), g.is_idle() && keys.len() == g.offsets.len())
        };
        if keys.is_empty() && !all_gone {
            return;
        }
        let Some(part) = self.partition_of(group) else {
            return;
        };
        let _writing = self.writing();
        if store::tombstones(&part, group, &keys, all_gone)
            .await
            .is_err()
        {
            return;
        }
        let mut groups = self.groups.borrow_mut();
        let Some(g) = groups.get_mut(group) else {
            return;
        };
        let still = store::expired_offsets(g, now, s.retention_ms);
        for k in keys.iter().filter(|k| still.contains(k)) {
            g.offsets.remove(k);
        }
        if all_gone && g.is_idle() && g.offsets.is_empty() {
            groups.remove(group);
        }
        tracing::info!(group, offsets = keys.len(), all_gone, "offsets expired");
    }
}

/// The time on both clocks: the monotonic one for the groups' timers, the system one for
/// what is stored (see [`Now`]).
fn clock() -> Now {
    Now {
        mono_ms: mono_ms(),
        wall_ms: now_ms(),
    }
}

/// One committed offset to store: its (topic, partition) key and value.
type OffsetWrite = ((String, i32), OffsetValue);

/// The offsets of a commit to write, and one code per offset: too-large metadata is
/// refused (OFFSET_METADATA_TOO_LARGE), the rest are written.
fn offset_writes(a: &CommitArgs, s: &Settings, now: i64) -> (Vec<i16>, Vec<OffsetWrite>) {
    let mut per = Vec::with_capacity(a.offsets.len());
    let mut writes = Vec::new();
    for c in &a.offsets {
        let metadata = c.metadata.clone().unwrap_or_default();
        if metadata.len() > s.metadata_max_bytes {
            per.push(codes::OFFSET_METADATA_TOO_LARGE);
            continue;
        }
        per.push(codes::NONE);
        let value = OffsetValue {
            offset: c.offset,
            leader_epoch: c.leader_epoch,
            metadata,
            commit_timestamp_ms: now,
            appended_at: Offset::NONE,
        };
        writes.push(((c.topic.clone(), c.partition), value));
    }
    (per, writes)
}

/// The codes of a commit whose write failed with `code`: every offset that was to be
/// written gets it.
fn failed_writes(per: &[i16], code: i16) -> Vec<i16> {
    per.iter()
        .map(|c| if *c == codes::NONE { code } else { *c })
        .collect()
}
