//! The replica state of one partition on its owning shard: whether this node leads it or
//! follows another, under which leader epoch, and the high watermark — kept apart from the
//! log end offset (LEO), because with followers the HW is the smallest LEO in the ISR.
//!
//! A single node is the case ISR = {self}: the HW follows the local LEO as appends complete.
//! The replication fetchers and the controller drive the other transitions (become leader
//! or follower at an epoch, followers' fetch offsets, ISR changes); the invariants they must
//! keep are asserted here, where the state changes: the HW never moves backwards, never
//! passes the local LEO, and a leader is always in its own ISR.

use std::collections::BTreeMap;

use wire::{BrokerEpoch, LeaderEpoch, NodeId, Offset};

/// The leader epoch of a partition whose only replica leads it since it was created
/// (single node: the leader never changes). The cluster's metadata image carries real
/// epochs; Metadata answers this one where there is no image.
pub const SOLE_LEADER_EPOCH: LeaderEpoch = LeaderEpoch(0);

/// What this replica does for its partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// This node appends for clients; followers fetch from it.
    Leader(LeaderState),
    /// This node copies from `leader` (replication fetchers append with the leader's
    /// offsets); producers are told NOT_LEADER_OR_FOLLOWER, consumers fetching at v11+
    /// read up to the HW it learned (KIP-392), older consumers are refused.
    Follower { leader: NodeId },
}

/// A leader's view of its replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderState {
    /// In-sync replicas, this node included.
    isr: Vec<NodeId>,
    /// Each other replica's progress, as its fetches report it.
    followers: BTreeMap<NodeId, FollowerProgress>,
    /// Where this leader's epoch starts in its log. A follower joins the ISR only once it
    /// holds everything before it as well as the HW (Kafka, KAFKA-7128): a new leader's
    /// HW, learned as a follower, can lag what the old leader acknowledged, and a replica
    /// caught up only to that lagging HW may lack acknowledged records.
    epoch_start: Offset,
    /// Followers an ISR change proposed to the controller would add, until it is applied
    /// or fails. The HW waits for them as for members (Kafka's "maximal ISR"): a joiner
    /// qualified by holding everything up to the HW when the change was proposed, and
    /// once committed it is an ISR member the controller may elect, so the HW must not
    /// pass it meanwhile.
    joining: Vec<NodeId>,
}

/// One follower, as the leader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowerProgress {
    /// The follower's log end offset: the offset of its last fetch.
    pub log_end: Offset,
    /// When its fetch last reached the leader's LEO (for `replica.lag.time.max.ms`).
    pub caught_up_ms: i64,
    /// The broker epoch its last fetch carried: the process that vouched for `log_end`.
    /// An ISR change that adds the follower names it, and the controller refuses the
    /// change if the node has registered another since (KIP-903: a process that
    /// restarted may have lost what it vouched for).
    pub broker_epoch: BrokerEpoch,
    /// A new process of this follower fetched from below the HW: the one before it
    /// vouched for records this one does not hold (lost by a power failure or a disk).
    /// It leaves the ISR at the next check, whatever its lag, even if it has caught up
    /// meanwhile (the controller may have elected it while it had not); set until an ISR
    /// without it is committed, after which it rejoins as any follower does.
    pub lost_acknowledged: bool,
    /// The follower's log start, as its fetches report it (`Offset::NONE` until one
    /// does): DeleteRecords is answered once every live replica's is past the deleted
    /// records (see [`ReplicaState::low_watermark`]).
    pub log_start: Offset,
    /// The leader's log start in the last answer this follower's fetches were given
    /// (`Offset::NONE` until one was): a fetch that would carry a newer one is answered
    /// at once rather than parked, so a follower whose fetch was in transit when
    /// DeleteRecords moved the start (no parked fetch to wake) learns it within a round
    /// trip, not after `replica.fetch.wait.max.ms`.
    pub log_start_sent: Offset,
}

impl Default for FollowerProgress {
    /// Unknown until the follower's first fetch (Kafka's rule: offset 0; log start -1).
    fn default() -> Self {
        FollowerProgress {
            log_end: Offset(0),
            caught_up_ms: 0,
            broker_epoch: BrokerEpoch::NONE,
            lost_acknowledged: false,
            log_start: Offset::NONE,
            log_start_sent: Offset::NONE,
        }
    }
}

/// Where a partition lives, as the cluster metadata committed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// Nodes holding a replica (the first is the preferred leader).
    pub replicas: Vec<NodeId>,
    /// The leader; `None` while no ISR member is alive (the partition is offline).
    pub leader: Option<NodeId>,
    pub leader_epoch: LeaderEpoch,
    pub isr: Vec<NodeId>,
    /// Bumped on every change of the record; an ISR change proposed by the leader names
    /// the epoch it was based on.
    pub partition_epoch: i32,
}

/// What applying an [`Assignment`] asks of the shard's replication fetchers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleChange {
    /// Nothing (a stale record, or the same role; an ISR update on a leader).
    Unchanged,
    /// Became (or stays, under a new epoch) leader: stop fetching.
    Lead,
    /// Follows this leader now: fetch from it.
    Follow(NodeId),
    /// No leader: stop fetching, refuse clients.
    Offline,
}

/// The leader of a partition that has none (offline): `Role::Follower` of nobody.
pub const NO_LEADER: NodeId = NodeId(-1);

/// Why a request for this replica is refused (each a Kafka error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochCheck {
    /// The request's epoch is older than ours (KIP-320): FENCED_LEADER_EPOCH.
    Fenced,
    /// The request's epoch is newer than ours: UNKNOWN_LEADER_EPOCH (we have not heard yet).
    Unknown,
}

/// Role, leader epoch and HW of one partition replica.
#[derive(Clone, Debug)]
pub struct ReplicaState {
    local: NodeId,
    role: Role,
    leader_epoch: LeaderEpoch,
    /// The partition epoch of the assignment in force (0 for a sole replica).
    partition_epoch: i32,
    high_watermark: Offset,
    /// The end of what the local log has completed writing (appends still in flight are
    /// not counted: the HW must not cover them).
    log_end: Offset,
}

impl ReplicaState {
    /// The only replica: leader at epoch 0, ISR = {local}, HW = the log's end (what a
    /// single node had acknowledged is all on its own disk).
    pub fn sole(local: NodeId, log_end: Offset) -> ReplicaState {
        ReplicaState {
            local,
            role: Role::Leader(LeaderState {
                isr: vec![local],
                followers: BTreeMap::new(),
                epoch_start: Offset(0),
                joining: Vec::new(),
            }),
            leader_epoch: SOLE_LEADER_EPOCH,
            partition_epoch: 0,
            high_watermark: log_end,
            log_end,
        }
    }

    pub fn local(&self) -> NodeId {
        self.local
    }

    /// A replica reopened in a cluster: its HW is what was checkpointed (`None`: nothing
    /// was — the log start), never past what the log holds. Called once, right after the
    /// log opened and before any role is applied: the one time the HW is set from disk
    /// rather than moved by the ISR, so it may be below the [`ReplicaState::sole`] default.
    pub fn restore_high_watermark(&mut self, checkpointed: Option<Offset>, log_start: Offset) {
        let hw = checkpointed
            .unwrap_or(log_start)
            .max(log_start)
            .min(self.log_end);
        self.high_watermark = hw;
    }

    pub fn role(&self) -> &Role {
        &self.role
    }

    pub fn is_leader(&self) -> bool {
        matches!(self.role, Role::Leader(_))
    }

    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.leader_epoch
    }

    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    /// Members of the ISR (0 on a follower: it does not know the leader's ISR).
    pub fn isr_len(&self) -> usize {
        match &self.role {
            Role::Leader(l) => l.isr.len(),
            Role::Follower { .. } => 0,
        }
    }

    /// The leader this replica follows or is.
    /// On a leader, each follower's progress (for metrics); none on a follower.
    pub fn followers(&self) -> impl Iterator<Item = (NodeId, FollowerProgress)> + '_ {
        let l = match &self.role {
            Role::Leader(l) => Some(l),
            Role::Follower { .. } => None,
        };
        l.into_iter()
            .flat_map(|l| l.followers.iter().map(|(n, p)| (*n, *p)))
    }

    /// On a leader, whether `node` is one of its followers (an assigned replica).
    pub fn has_follower(&self, node: NodeId) -> bool {
        matches!(&self.role, Role::Leader(l) if l.followers.contains_key(&node))
    }

    pub fn leader(&self) -> NodeId {
        match &self.role {
            Role::Leader(_) => self.local,
            Role::Follower { leader } => *leader,
        }
    }

    /// Checks a request's `current_leader_epoch` (-1: the client does not say).
    pub fn check_epoch(&self, requested: LeaderEpoch) -> Result<(), EpochCheck> {
        if requested == LeaderEpoch::NONE || requested == self.leader_epoch {
            Ok(())
        } else if requested < self.leader_epoch {
            Err(EpochCheck::Fenced)
        } else {
            Err(EpochCheck::Unknown)
        }
    }

    /// The local log completed writing up to `log_end`. On a leader the HW becomes the
    /// smallest LEO over the ISR. Returns whether the HW advanced.
    pub fn local_log_end(&mut self, log_end: Offset) -> bool {
        self.log_end = self.log_end.max(log_end);
        self.recompute_high_watermark()
    }

    /// The local log end the HW is bounded by.
    pub fn log_end(&self) -> Offset {
        self.log_end
    }

    /// A follower's fetch at `offset`, from its process at broker epoch `epoch`, says it
    /// holds everything before it; `leader_end` is the end of the leader's log including
    /// appends still being written (a follower may have copied those from the tail
    /// cache). Returns whether the HW advanced. Unknown replicas are ignored (not assigned
    /// to this partition).
    pub fn follower_fetched(
        &mut self,
        follower: NodeId,
        epoch: BrokerEpoch,
        offset: Offset,
        leader_end: Offset,
        now_ms: i64,
    ) -> bool {
        let Role::Leader(l) = &mut self.role else {
            return false;
        };
        let Some(p) = l.followers.get_mut(&follower) else {
            return false;
        };
        // Never beyond what the leader has: a follower cannot vouch for more.
        p.log_end = offset.min(leader_end);
        // A follower's completed writes survive its process (SIGKILL included), so a new
        // process fetches from at least what the old one vouched for, and that is at
        // least the HW. From below it, acknowledged records are gone from this replica.
        // Only a member matters: one outside the ISR rejoins by the usual rule.
        let restarted = p.broker_epoch != BrokerEpoch::NONE && epoch != p.broker_epoch;
        if restarted && offset < self.high_watermark && l.isr.contains(&follower) {
            tracing::warn!(
                follower = %follower,
                offset = %offset,
                high_watermark = %self.high_watermark,
                "a follower restarted without records it had acknowledged; it leaves the ISR"
            );
            p.lost_acknowledged = true;
        }
        if restarted {
            // A new process has been sent nothing yet.
            p.log_start_sent = Offset::NONE;
        }
        p.broker_epoch = epoch;
        if offset >= leader_end {
            p.caught_up_ms = now_ms;
        }
        self.recompute_high_watermark()
    }

    /// A follower's fetch reports its log start (Fetch v5+; -1 from older ones, which
    /// leaves it unknown). Returns whether it changed. Unknown replicas are ignored.
    pub fn follower_log_start(&mut self, follower: NodeId, log_start: Offset) -> bool {
        let Role::Leader(l) = &mut self.role else {
            return false;
        };
        let Some(p) = l.followers.get_mut(&follower) else {
            return false;
        };
        let changed = p.log_start != log_start;
        p.log_start = log_start;
        changed
    }

    /// A fetch answer to `follower` carries `log_start` as the leader's log start.
    /// Returns whether it is newer than the one the follower was last answered (the fetch
    /// must then be answered now, not parked), and notes it as sent. False on a follower
    /// and for unknown replicas.
    pub fn follower_log_start_sent(&mut self, follower: NodeId, log_start: Offset) -> bool {
        let Role::Leader(l) = &mut self.role else {
            return false;
        };
        let Some(p) = l.followers.get_mut(&follower) else {
            return false;
        };
        let newer = log_start > p.log_start_sent;
        p.log_start_sent = p.log_start_sent.max(log_start);
        newer
    }

    /// Whether `log_start` is newer than the one `follower` was last answered, without
    /// noting it: a parked follower fetch is ready when it is (the start moved between
    /// the fetch's read and its wait).
    pub fn follower_log_start_unsent(&self, follower: NodeId, log_start: Offset) -> bool {
        let Role::Leader(l) = &self.role else {
            return false;
        };
        l.followers
            .get(&follower)
            .is_some_and(|p| log_start > p.log_start_sent)
    }

    /// KIP-392's rack-aware selector, on a leader: the replica a consumer in
    /// `client_rack` fetching at `offset` should read from instead, if any. Only an ISR
    /// member that holds `offset` (log start at or below it, log end at or past it), is not
    /// known to have lost acknowledged records, and sits in the client's rack qualifies;
    /// none if this leader's own rack is the client's (the leader is as close) or none
    /// qualifies. Of several, the one furthest ahead, then the one caught up most
    /// recently, then the lowest id (Kafka's order, made deterministic). `rack_of` is a
    /// node's `broker.rack` from the metadata image.
    pub fn read_replica_for(
        &self,
        client_rack: &str,
        offset: Offset,
        rack_of: impl Fn(NodeId) -> Option<String>,
    ) -> Option<NodeId> {
        let Role::Leader(l) = &self.role else {
            return None;
        };
        if client_rack.is_empty() || rack_of(self.local).as_deref() == Some(client_rack) {
            return None;
        }
        // A follower not yet heard from under this leadership has no known progress
        // (Kafka starts it at log end -1): never chosen before its first fetch.
        let holds = |p: &FollowerProgress| {
            p.broker_epoch != BrokerEpoch::NONE
                && p.log_end >= offset
                && p.log_start <= offset
                && !p.lost_acknowledged
        };
        let chosen = l
            .followers
            .iter()
            .filter(|(n, p)| l.isr.contains(n) && holds(p))
            .filter(|(n, _)| rack_of(**n).as_deref() == Some(client_rack))
            .max_by_key(|(n, p)| (p.log_end, p.caught_up_ms, std::cmp::Reverse(**n)))
            .map(|(n, _)| *n);
        debug_assert!(
            chosen != Some(self.local),
            "a leader is not its own follower"
        );
        chosen
    }

    /// On a leader, the low watermark (Kafka's `lowWatermarkIfLeader`): the smallest log
    /// start over this replica (`local_log_start`) and every other assigned replica on a
    /// node `alive` says is live, in the ISR or not — a live replica outside it may still
    /// be elected (unclean election, or after it rejoins) and would serve what it holds.
    /// A replica not heard from since this leader took over counts as -1. `None` on a
    /// follower.
    pub fn low_watermark(
        &self,
        local_log_start: Offset,
        alive: impl Fn(NodeId) -> bool,
    ) -> Option<Offset> {
        let Role::Leader(l) = &self.role else {
            return None;
        };
        let low = l
            .followers
            .iter()
            .filter(|(n, _)| alive(**n))
            .map(|(_, p)| p.log_start)
            .fold(local_log_start, Ord::min);
        Some(low)
    }

    /// A follower learns the leader's HW from a fetch response: its own HW is the smaller
    /// of that and what it holds.
    pub fn learn_high_watermark(&mut self, leader_hw: Offset) -> bool {
        if self.is_leader() {
            return false;
        }
        self.advance_high_watermark(leader_hw.min(self.log_end))
    }

    /// On a leader: HW = the smallest log end over the ISR (this node's included).
    fn recompute_high_watermark(&mut self) -> bool {
        let Role::Leader(l) = &self.role else {
            return false;
        };
        let hw = l
            .isr
            .iter()
            .chain(&l.joining)
            .filter(|n| **n != self.local)
            .map(|n| l.followers.get(n).map_or(Offset(0), |f| f.log_end))
            .fold(self.log_end, Ord::min);
        self.advance_high_watermark(hw)
    }

    /// Becomes leader at `epoch` with `isr` (which must include this node) and the other
    /// `replicas` as followers, whose progress starts unknown (offset 0) as in Kafka.
    pub fn become_leader(&mut self, epoch: LeaderEpoch, isr: Vec<NodeId>, replicas: &[NodeId]) {
        assert!(
            epoch >= self.leader_epoch,
            "leader epoch moves forward: {} -> {epoch}",
            self.leader_epoch
        );
        assert!(isr.contains(&self.local), "a leader is in its own ISR");
        let followers = replicas
            .iter()
            .filter(|n| **n != self.local)
            .map(|n| (*n, FollowerProgress::default()))
            .collect();
        self.leader_epoch = epoch;
        self.role = Role::Leader(LeaderState {
            isr,
            followers,
            epoch_start: self.log_end,
            joining: Vec::new(),
        });
        self.recompute_high_watermark();
    }

    /// On a leader, where its epoch starts in its log.
    pub fn epoch_start(&self) -> Option<Offset> {
        match &self.role {
            Role::Leader(l) => Some(l.epoch_start),
            Role::Follower { .. } => None,
        }
    }

    /// On a leader: its epoch starts at `start` in its log (the epoch cache's entry, which
    /// counts appends still being written when it became leader).
    pub fn epoch_started_at(&mut self, start: Offset) {
        if let Role::Leader(l) = &mut self.role {
            l.epoch_start = l.epoch_start.max(start);
        }
    }

    /// Becomes a follower of `leader` at `epoch`.
    pub fn become_follower(&mut self, leader: NodeId, epoch: LeaderEpoch) {
        assert!(
            epoch >= self.leader_epoch,
            "leader epoch moves forward: {} -> {epoch}",
            self.leader_epoch
        );
        assert_ne!(leader, self.local, "a follower follows another node");
        self.leader_epoch = epoch;
        self.role = Role::Follower { leader };
    }

    /// The local log was truncated to end at `log_end` (a follower cutting off what the
    /// leader does not have). The one case where the HW may move back: it cannot cover
    /// records that are gone. Also on a replica that became leader while the truncation
    /// waited for the disk (the assignment does not wait for it): its epoch then starts
    /// no later than the new end.
    pub fn truncated(&mut self, log_end: Offset) {
        self.log_end = log_end;
        self.high_watermark = self.high_watermark.min(log_end);
        self.epoch_start_at_most(log_end);
    }

    /// The local log was emptied and restarts at `offset` (a follower below its leader's
    /// log start): nothing below it is here any more, and nothing above it yet. As
    /// [`truncated`](Self::truncated), also on a replica that became leader meanwhile.
    pub fn restarted(&mut self, offset: Offset) {
        self.log_end = offset;
        self.high_watermark = offset;
        self.epoch_start_at_most(offset);
    }

    /// A leader's epoch cannot start past its log end.
    fn epoch_start_at_most(&mut self, log_end: Offset) {
        if let Role::Leader(l) = &mut self.role {
            l.epoch_start = l.epoch_start.min(log_end);
        }
    }

    pub fn partition_epoch(&self) -> i32 {
        self.partition_epoch
    }

    /// Applies a committed assignment at `now_ms`. A record older than the epoch in force
    /// changes nothing; on a leader that stays leader under the same epoch it updates the
    /// ISR, keeping what it knows of its followers. A new leader counts its ISR members as
    /// caught up now (Kafka's rule), so none is dropped before it could fetch.
    pub fn apply(&mut self, a: &Assignment, now_ms: i64) -> RoleChange {
        if a.leader_epoch < self.leader_epoch {
            return RoleChange::Unchanged;
        }
        let newer = a.leader_epoch > self.leader_epoch;
        self.partition_epoch = self.partition_epoch.max(a.partition_epoch);
        match a.leader {
            Some(leader) if leader == self.local => {
                if !newer && self.is_leader() {
                    self.update_isr(&a.isr, &a.replicas, now_ms);
                    return RoleChange::Unchanged;
                }
                let mut isr = a.isr.clone();
                if !isr.contains(&self.local) {
                    isr.push(self.local);
                }
                self.become_leader(a.leader_epoch, isr, &a.replicas);
                self.followers_caught_up_now(now_ms);
                RoleChange::Lead
            }
            Some(leader) => {
                let same = matches!(self.role, Role::Follower { leader: l } if l == leader);
                if same && !newer {
                    return RoleChange::Unchanged;
                }
                self.become_follower(leader, a.leader_epoch);
                RoleChange::Follow(leader)
            }
            None => {
                if matches!(self.role, Role::Follower { leader } if leader == NO_LEADER) {
                    return RoleChange::Unchanged;
                }
                self.leader_epoch = a.leader_epoch;
                self.role = Role::Follower { leader: NO_LEADER };
                RoleChange::Offline
            }
        }
    }

    /// A leader's ISR as committed: followers keep their progress; replicas that just
    /// joined the ISR count as caught up now.
    fn update_isr(&mut self, isr: &[NodeId], replicas: &[NodeId], now_ms: i64) {
        let local = self.local;
        let Role::Leader(l) = &mut self.role else {
            return;
        };
        let mut isr = isr.to_vec();
        if !isr.contains(&local) {
            isr.push(local);
        }
        l.followers.retain(|n, _| replicas.contains(n));
        for n in replicas.iter().filter(|n| **n != local) {
            let joined = isr.contains(n) && !l.isr.contains(n);
            let p = l.followers.entry(*n).or_default();
            if !isr.contains(n) {
                p.lost_acknowledged = false;
            }
            if joined {
                p.caught_up_ms = now_ms;
            }
        }
        crate::metrics::isr_changed(&l.isr, &isr);
        l.isr = isr;
        l.joining.clear();
        self.recompute_high_watermark();
    }

    /// A new leader counts every follower as caught up now (Kafka's rule): none leaves
    /// the ISR before it had `replica.lag.time.max.ms` to fetch from the new leader.
    fn followers_caught_up_now(&mut self, now_ms: i64) {
        if let Role::Leader(l) = &mut self.role {
            for p in l.followers.values_mut() {
                p.caught_up_ms = now_ms;
            }
        }
    }

    /// On a leader, the ISR it should have at `now_ms`: members whose fetches have not
    /// reached its log end for `lag_max_ms` leave, and so do members whose new process
    /// lost what they acknowledged; followers outside that hold everything up to the HW
    /// and to the start of this leader's epoch join if `eligible` for the broker epoch their fetches carry (KIP-841: a node the
    /// metadata has fenced does not rejoin; KIP-903: nor one whose fetches came from a
    /// process it has since replaced — proposing either would only be refused again every
    /// round). `None` when the ISR is right as it is (or not a leader).
    pub fn wanted_isr(
        &self,
        now_ms: i64,
        lag_max_ms: i64,
        eligible: impl Fn(NodeId, BrokerEpoch) -> bool,
    ) -> Option<Vec<NodeId>> {
        let Role::Leader(l) = &self.role else {
            return None;
        };
        let mut wanted: Vec<NodeId> = l
            .isr
            .iter()
            .copied()
            .filter(|n| {
                *n == self.local
                    || l.followers.get(n).is_some_and(|p| {
                        now_ms - p.caught_up_ms <= lag_max_ms && !p.lost_acknowledged
                    })
            })
            .collect();
        for (n, p) in &l.followers {
            let holds_acknowledged = p.log_end >= self.high_watermark.max(l.epoch_start);
            let caught_up = holds_acknowledged && now_ms - p.caught_up_ms <= lag_max_ms;
            let may_join = !p.lost_acknowledged && eligible(*n, p.broker_epoch);
            if !wanted.contains(n) && caught_up && may_join {
                wanted.push(*n);
            }
        }
        wanted.sort();
        let mut current = l.isr.clone();
        current.sort();
        (wanted != current).then_some(wanted)
    }

    /// On a leader: `isr` is being proposed to the controller; the followers it adds
    /// count for the HW from now on (see `LeaderState::joining`).
    pub fn isr_proposed(&mut self, isr: &[NodeId]) {
        if let Role::Leader(l) = &mut self.role {
            l.joining = isr.iter().filter(|n| !l.isr.contains(n)).copied().collect();
        }
    }

    /// On a leader: the proposal was refused or not answered; its joiners count no more.
    /// (A committed one arrives as an assignment, which replaces the ISR.)
    pub fn isr_proposal_failed(&mut self) {
        if let Role::Leader(l) = &mut self.role {
            l.joining.clear();
        }
        self.recompute_high_watermark();
    }

    /// The broker epochs a proposal of `isr` names: each joining follower's, from the
    /// fetches that qualified it (KIP-903). Members that stay are not named: a stale
    /// epoch of one of them must not block a shrink that removes another.
    pub fn joiner_epochs(&self, isr: &[NodeId]) -> Vec<(NodeId, BrokerEpoch)> {
        let Role::Leader(l) = &self.role else {
            return Vec::new();
        };
        isr.iter()
            .filter(|n| !l.isr.contains(n))
            .filter_map(|n| l.followers.get(n).map(|p| (*n, p.broker_epoch)))
            .filter(|(_, e)| *e != BrokerEpoch::NONE)
            .collect()
    }

    /// Sets the HW to `hw` if that is ahead; never backwards, never past the local LEO.
    fn advance_high_watermark(&mut self, hw: Offset) -> bool {
        assert!(
            hw <= self.log_end,
            "HW {hw} past the local log end {}",
            self.log_end
        );
        if hw > self.high_watermark {
            self.high_watermark = hw;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sole_replica_moves_its_high_watermark_with_its_log() {
        let mut r = ReplicaState::sole(NodeId(1), Offset(5));
        assert!(r.is_leader());
        assert_eq!((r.high_watermark(), r.isr_len()), (Offset(5), 1));
        assert!(r.local_log_end(Offset(9)));
        assert!(!r.local_log_end(Offset(9)), "no change, no advance");
        assert_eq!(r.high_watermark(), Offset(9));
    }

    /// A new leader's HW, learned as a follower, can lag what the old leader acknowledged:
    /// a follower holding everything up to that HW but not up to where the new leader's
    /// epoch starts may lack acknowledged records, and does not join the ISR until it has
    /// reached the epoch start too (KAFKA-7128).
    #[test]
    fn a_follower_joins_the_isr_only_once_past_the_leaders_epoch_start() {
        let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
        let mut r = ReplicaState::sole(b, Offset(10));
        r.restore_high_watermark(Some(Offset(9)), Offset(0));
        r.become_leader(LeaderEpoch(2), vec![b, a], &[a, b, c]);
        assert_eq!(r.high_watermark(), Offset(9));
        assert_eq!(
            r.epoch_start(),
            Some(Offset(10)),
            "ListOffsets waits for it too"
        );
        r.follower_fetched(c, BrokerEpoch(1), Offset(9), Offset(10), 0);
        assert_eq!(
            r.wanted_isr(1, 30_000, |_, _| true),
            None,
            "c at 9 < 10 waits"
        );
        r.follower_fetched(c, BrokerEpoch(1), Offset(10), Offset(10), 0);
        assert_eq!(r.wanted_isr(1, 30_000, |_, _| true), Some(vec![a, b, c]));
    }

    /// KIP-392: a consumer in another rack than the leader's is sent to an in-sync
    /// follower in its own rack that holds its fetch offset; to none if the leader is in
    /// its rack, it gives no rack, or no such follower is in sync or far enough.
    #[test]
    fn the_rack_aware_selector_picks_an_in_sync_follower_in_the_clients_rack() {
        let (a, b, c, d) = (NodeId(1), NodeId(2), NodeId(3), NodeId(4));
        let racks = |n: NodeId| match n.0 {
            1 => Some("ra".to_string()),
            2 | 4 => Some("rb".to_string()),
            3 => Some("rc".to_string()),
            _ => None,
        };
        let mut r = ReplicaState::sole(a, Offset(10));
        r.become_leader(LeaderEpoch(1), vec![a, b, c], &[a, b, c, d]);
        assert_eq!(
            r.read_replica_for("rb", Offset(0), racks),
            None,
            "no follower has fetched from this leader yet: its progress is unknown"
        );
        for n in [b, c, d] {
            r.follower_fetched(n, BrokerEpoch(1), Offset(10), Offset(10), 5);
            r.follower_log_start(n, Offset(0));
        }
        // d, out of the ISR, caught up last: it would win if it counted.
        r.follower_fetched(d, BrokerEpoch(1), Offset(10), Offset(10), 9);
        assert_eq!(
            r.read_replica_for("rb", Offset(4), racks),
            Some(b),
            "d is not in sync"
        );
        assert_eq!(r.read_replica_for("rc", Offset(10), racks), Some(c));
        assert_eq!(
            r.read_replica_for("ra", Offset(4), racks),
            None,
            "the leader's rack"
        );
        assert_eq!(
            r.read_replica_for("", Offset(4), racks),
            None,
            "no rack given"
        );
        assert_eq!(
            r.read_replica_for("rz", Offset(4), racks),
            None,
            "nobody there"
        );
        assert_eq!(
            r.read_replica_for("rc", Offset(11), racks),
            None,
            "c lacks 10"
        );
        r.follower_log_start(c, Offset(5));
        assert_eq!(
            r.read_replica_for("rc", Offset(4), racks),
            None,
            "c's log starts at 5"
        );
        // A follower does not choose: the leader does.
        let mut f = ReplicaState::sole(b, Offset(10));
        f.become_follower(a, LeaderEpoch(1));
        assert_eq!(f.read_replica_for("rc", Offset(4), racks), None);
    }

    /// While a change adding a follower is proposed, the HW waits for that follower as
    /// for a member: once the change commits, the controller may elect it, and it must
    /// hold everything acknowledged.
    #[test]
    fn the_hw_waits_for_a_follower_whose_joining_is_proposed() {
        let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
        let mut r = ReplicaState::sole(a, Offset(10));
        r.become_leader(LeaderEpoch(1), vec![a, b], &[a, b, c]);
        r.follower_fetched(b, BrokerEpoch(1), Offset(10), Offset(10), 0);
        r.follower_fetched(c, BrokerEpoch(1), Offset(10), Offset(10), 0);
        assert_eq!(r.high_watermark(), Offset(10));
        let wanted = r.wanted_isr(1, 30_000, |_, _| true).expect("c joins");
        r.isr_proposed(&wanted);
        r.local_log_end(Offset(20));
        r.follower_fetched(b, BrokerEpoch(1), Offset(20), Offset(20), 2);
        assert_eq!(r.high_watermark(), Offset(10), "c, joining, holds only 10");
        r.follower_fetched(c, BrokerEpoch(1), Offset(15), Offset(20), 3);
        assert_eq!(r.high_watermark(), Offset(15));
        // Refused: c counts no more.
        r.isr_proposal_failed();
        assert_eq!(r.high_watermark(), Offset(20));
        // Proposed again and committed: c is a member.
        r.isr_proposed(&wanted);
        let committed = Assignment {
            replicas: vec![a, b, c],
            leader: Some(a),
            leader_epoch: LeaderEpoch(1),
            isr: wanted.clone(),
            partition_epoch: 2,
        };
        r.apply(&committed, 4);
        r.local_log_end(Offset(30));
        r.follower_fetched(b, BrokerEpoch(1), Offset(30), Offset(30), 5);
        assert_eq!(r.high_watermark(), Offset(20), "c, a member, holds 20");
    }

    /// An ISR change names the broker epoch of each follower it adds, from the fetches
    /// that qualified it (a restarted follower's new epoch replaces the old); members that
    /// stay, followers not heard from yet and the leader itself are not named.
    #[test]
    fn an_isr_change_names_the_broker_epochs_of_its_joiners() {
        let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
        let mut r = ReplicaState::sole(a, Offset(0));
        r.become_leader(LeaderEpoch(1), vec![a, b], &[a, b, c]);
        assert!(r.joiner_epochs(&[a, b, c]).is_empty(), "c not heard from");
        r.follower_fetched(b, BrokerEpoch(7), Offset(0), Offset(0), 0);
        r.follower_fetched(c, BrokerEpoch(5), Offset(0), Offset(0), 0);
        assert_eq!(r.joiner_epochs(&[a, b, c]), vec![(c, BrokerEpoch(5))]);
        r.follower_fetched(c, BrokerEpoch(6), Offset(0), Offset(0), 1);
        assert_eq!(r.joiner_epochs(&[a, b, c]), vec![(c, BrokerEpoch(6))]);
        assert!(r.joiner_epochs(&[a]).is_empty(), "a shrink names nobody");
    }

    /// A follower whose new process fetches from below the HW lost records it had
    /// acknowledged: it leaves the ISR at once, not after the lag time. A new process
    /// that fetches from the HW or beyond (its writes survived) stays.
    #[test]
    fn a_follower_back_without_what_it_acknowledged_leaves_the_isr() {
        let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
        let lag = 10_000;
        let any = |_: NodeId, _: BrokerEpoch| true;
        let mut r = ReplicaState::sole(a, Offset(0));
        r.become_leader(LeaderEpoch(1), vec![a, b, c], &[a, b, c]);
        r.local_log_end(Offset(10));
        r.follower_fetched(b, BrokerEpoch(1), Offset(10), Offset(10), 0);
        r.follower_fetched(c, BrokerEpoch(1), Offset(10), Offset(10), 0);
        assert_eq!(r.high_watermark(), Offset(10));
        // c restarted after a clean kill: its writes are there.
        r.follower_fetched(c, BrokerEpoch(2), Offset(10), Offset(10), 1);
        assert_eq!(r.wanted_isr(2, lag, any), None);
        // b restarted after losing its tail.
        r.follower_fetched(b, BrokerEpoch(2), Offset(4), Offset(10), 1);
        assert_eq!(r.wanted_isr(2, lag, any), Some(vec![a, c]));
        assert_eq!(r.high_watermark(), Offset(10), "never backwards");
        // Caught up again before the ISR check: it still leaves first.
        r.follower_fetched(b, BrokerEpoch(2), Offset(10), Offset(10), 2);
        assert_eq!(r.wanted_isr(2, lag, any), Some(vec![a, c]));
        // Out of the ISR, it rejoins when it holds the HW again, under the epoch the
        // controller has registered for it.
        r.update_isr(&[a, c], &[a, b, c], 2);
        r.follower_fetched(b, BrokerEpoch(2), Offset(10), Offset(10), 3);
        assert_eq!(r.wanted_isr(4, lag, any), Some(vec![a, b, c]));
        assert_eq!(r.wanted_isr(4, lag, |_, e| e != BrokerEpoch(2)), None);
        assert_eq!(r.joiner_epochs(&[a, b, c]), vec![(b, BrokerEpoch(2))]);
    }

    /// Kafka's `lowWatermarkIfLeader`: the smallest log start over the leader and every
    /// assigned replica on a live node, in the ISR or not; unknown (-1) until a replica's
    /// fetch reports it, and again after a leader change.
    #[test]
    fn the_low_watermark_is_the_smallest_log_start_over_live_replicas() {
        let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
        let any = |_: NodeId| true;
        let mut r = ReplicaState::sole(a, Offset(10));
        assert_eq!(r.low_watermark(Offset(4), any), Some(Offset(4)), "alone");
        r.become_leader(LeaderEpoch(1), vec![a, b], &[a, b, c]);
        assert_eq!(r.low_watermark(Offset(4), any), Some(Offset::NONE));
        assert!(r.follower_log_start(b, Offset(6)));
        assert!(!r.follower_log_start(b, Offset(6)), "no change");
        assert!(r.follower_log_start(c, Offset(2)));
        assert_eq!(
            r.low_watermark(Offset(4), any),
            Some(Offset(2)),
            "c, outside the ISR, counts"
        );
        assert_eq!(r.low_watermark(Offset(4), |n| n != c), Some(Offset(4)));
        assert!(!r.follower_log_start(NodeId(9), Offset(0)), "not assigned");
        r.become_leader(LeaderEpoch(2), vec![a, b], &[a, b, c]);
        assert_eq!(r.low_watermark(Offset(4), |n| n != c), Some(Offset::NONE));
        r.become_follower(b, LeaderEpoch(3));
        assert_eq!(r.low_watermark(Offset(4), any), None);
    }

    /// A follower's answer carrying a newer leader log start than its last is news (the
    /// fetch is answered at once); the same or an older one is not; each leadership
    /// starts from nothing sent.
    #[test]
    fn a_newer_log_start_than_the_last_sent_is_news_once() {
        let (a, b) = (NodeId(1), NodeId(2));
        let mut r = ReplicaState::sole(a, Offset(10));
        r.become_leader(LeaderEpoch(1), vec![a, b], &[a, b]);
        assert!(r.follower_log_start_sent(b, Offset(0)), "never sent");
        assert!(!r.follower_log_start_sent(b, Offset(0)), "sent already");
        assert!(
            r.follower_log_start_sent(b, Offset(6)),
            "DeleteRecords moved it"
        );
        assert!(!r.follower_log_start_sent(b, Offset(6)));
        assert!(!r.follower_log_start_sent(b, Offset(4)), "never backwards");
        assert!(
            !r.follower_log_start_sent(NodeId(9), Offset(7)),
            "not assigned"
        );
        r.become_leader(LeaderEpoch(2), vec![a, b], &[a, b]);
        assert!(r.follower_log_start_sent(b, Offset(6)), "a new leadership");
        r.become_follower(b, LeaderEpoch(3));
        assert!(!r.follower_log_start_sent(b, Offset(8)), "not leading");
    }

    #[test]
    fn the_high_watermark_is_the_smallest_log_end_in_the_isr() {
        let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
        let mut r = ReplicaState::sole(a, Offset(0));
        r.become_leader(LeaderEpoch(1), vec![a, b, c], &[a, b, c]);
        assert!(!r.local_log_end(Offset(10)), "followers hold nothing yet");
        assert!(!r.follower_fetched(b, BrokerEpoch(1), Offset(10), Offset(10), 0));
        assert!(r.follower_fetched(c, BrokerEpoch(1), Offset(7), Offset(10), 0));
        assert_eq!(r.high_watermark(), Offset(7));
        // A follower that reports less later cannot move the HW back.
        r.follower_fetched(c, BrokerEpoch(1), Offset(3), Offset(10), 0);
        assert_eq!(r.high_watermark(), Offset(7));
        assert!(!r.follower_fetched(NodeId(9), BrokerEpoch(1), Offset(10), Offset(10), 0));
        // Followers ahead of the leader's written end (copied from its tail cache): the
        // HW waits for the leader's own write.
        r.follower_fetched(b, BrokerEpoch(1), Offset(12), Offset(12), 0);
        r.follower_fetched(c, BrokerEpoch(1), Offset(12), Offset(12), 0);
        assert_eq!(r.high_watermark(), Offset(10));
        assert!(r.local_log_end(Offset(12)));
        assert_eq!(r.high_watermark(), Offset(12));
    }

    fn assignment(leader: Option<i32>, epoch: i32, isr: &[i32]) -> Assignment {
        Assignment {
            replicas: vec![NodeId(1), NodeId(2), NodeId(3)],
            leader: leader.map(NodeId),
            leader_epoch: LeaderEpoch(epoch),
            isr: isr.iter().copied().map(NodeId).collect(),
            partition_epoch: epoch,
        }
    }

    #[test]
    fn assignments_move_the_role_and_the_isr_follows_the_followers_progress() {
        let lag = 10_000;
        let mut r = ReplicaState::sole(NodeId(1), Offset(0));
        assert_eq!(
            r.apply(&assignment(Some(1), 1, &[1, 2, 3]), 0),
            RoleChange::Lead
        );
        assert_eq!(r.isr_len(), 3);
        let any = |_: NodeId, _: BrokerEpoch| true;
        assert_eq!(
            r.wanted_isr(lag, lag, any),
            None,
            "all caught up at the start"
        );
        r.local_log_end(Offset(10));
        r.follower_fetched(NodeId(2), BrokerEpoch(1), Offset(10), Offset(10), 5_000);
        // Node 3 never fetches: out after the lag, node 2 stays.
        assert_eq!(
            r.wanted_isr(lag + 1, lag, any),
            Some(vec![NodeId(1), NodeId(2)])
        );
        assert_eq!(
            r.apply(&assignment(Some(1), 1, &[1, 2]), lag + 1),
            RoleChange::Unchanged
        );
        assert_eq!((r.isr_len(), r.high_watermark()), (2, Offset(10)));
        // Node 3 catches up: it may rejoin.
        r.follower_fetched(NodeId(3), BrokerEpoch(1), Offset(10), Offset(10), lag + 2);
        assert_eq!(
            r.wanted_isr(lag + 3, lag, any),
            Some(vec![NodeId(1), NodeId(2), NodeId(3)])
        );
        // Unless the metadata fenced it (its lease expired): then it is not proposed.
        assert_eq!(r.wanted_isr(lag + 3, lag, |n, _| n != NodeId(3)), None);
        // A stale record changes nothing; a newer epoch with another leader demotes.
        assert_eq!(
            r.apply(&assignment(Some(2), 0, &[2]), 0),
            RoleChange::Unchanged
        );
        assert_eq!(
            r.apply(&assignment(Some(2), 2, &[2, 3]), 0),
            RoleChange::Follow(NodeId(2))
        );
        assert_eq!(
            r.apply(&assignment(Some(2), 2, &[2, 3]), 0),
            RoleChange::Unchanged
        );
        assert_eq!(r.apply(&assignment(None, 3, &[]), 0), RoleChange::Offline);
        assert!(!r.is_leader());
        assert_eq!(r.leader(), NO_LEADER);
    }

    #[test]
    fn a_reopened_replica_starts_at_its_checkpointed_high_watermark() {
        let (a, b) = (NodeId(1), NodeId(2));
        let mut r = ReplicaState::sole(a, Offset(300));
        r.restore_high_watermark(Some(Offset(200)), Offset(0));
        assert_eq!(r.high_watermark(), Offset(200), "not the log end");
        // Leading again, it waits for the ISR before exposing the tail.
        r.become_leader(LeaderEpoch(2), vec![a, b], &[a, b]);
        assert_eq!(r.high_watermark(), Offset(200));
        r.follower_fetched(b, BrokerEpoch(1), Offset(300), Offset(300), 0);
        assert_eq!(r.high_watermark(), Offset(300));
        // Never past the log end; nothing checkpointed: the log start.
        let mut r = ReplicaState::sole(a, Offset(50));
        r.restore_high_watermark(Some(Offset(80)), Offset(10));
        assert_eq!(r.high_watermark(), Offset(50));
        r.restore_high_watermark(None, Offset(10));
        assert_eq!(r.high_watermark(), Offset(10));
    }

    #[test]
    fn epochs_fence_old_requests_and_a_follower_learns_the_leaders_hw() {
        let mut r = ReplicaState::sole(NodeId(1), Offset(4));
        r.become_follower(NodeId(2), LeaderEpoch(3));
        assert_eq!(r.check_epoch(LeaderEpoch(2)), Err(EpochCheck::Fenced));
        assert_eq!(r.check_epoch(LeaderEpoch(4)), Err(EpochCheck::Unknown));
        assert_eq!(r.check_epoch(LeaderEpoch::NONE), Ok(()));
        assert_eq!(r.leader(), NodeId(2));
        assert!(
            !r.local_log_end(Offset(6)),
            "a follower's HW comes from its leader"
        );
        assert!(r.learn_high_watermark(Offset(9)));
        assert_eq!(r.high_watermark(), Offset(6), "not past what it holds");
    }
}
