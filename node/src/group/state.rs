//! One group's state machine: Kafka's classic rebalance protocol, as its broker runs it.
//!
//! States: `Empty` → (a member joins) → `PreparingRebalance` → (every member rejoined, or
//! the rebalance timeout) → `CompletingRebalance` → (the leader's SyncGroup) → `Stable`.
//! A join with changed metadata, a leave or a session expiry sends a `Stable` or
//! `CompletingRebalance` group back to `PreparingRebalance`; a rebalance that ends with no
//! members leaves the group `Empty` with a new generation. A deleted group is removed from
//! its coordinator (DescribeGroups then shows it as `Dead`).
//!
//! Pure and synchronous: time comes in as [`Now`] (a monotonic clock for every timer, the
//! system clock only for the state timestamp that is stored), answers to waiting JoinGroup and
//! SyncGroup requests go out through their [`Waiter`]s. The coordinator (`super`) owns
//! the groups of one shard, persists what [`Group::take_dirty`] reports and drives
//! [`Group::tick`]. Lives on the shard that owns the group's `__consumer_offsets` partition.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::Bytes;
use glommio::channels::local_channel::LocalSender;

use super::codes;
use super::schema::{GroupValue, MemberValue, OffsetValue};

/// The time a call runs at, on two clocks. Every timer — sessions, pending member ids,
/// rebalance and sync deadlines, the initial rebalance delay — runs on `mono_ms`, a
/// monotonic clock, as Kafka's timing wheel runs on `nanoTime`: a step of the system
/// clock must neither expire every member at once (forward) nor hold expiry back
/// (backward). `wall_ms`, the system clock, only stamps what is stored and compared with
/// other stored times: the state timestamp (offsets retention of an empty group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Milliseconds on a monotonic clock (any origin; only differences count).
    pub mono_ms: i64,
    /// Milliseconds since the Unix epoch on the system clock.
    pub wall_ms: i64,
}

impl Now {
    /// Both clocks at `ms` (tests; a clock step is `Now { wall_ms: .., ..now }`).
    pub fn at(ms: i64) -> Now {
        Now {
            mono_ms: ms,
            wall_ms: ms,
        }
    }
}

/// Where the answer to a parked JoinGroup / SyncGroup goes.
pub type Waiter<T> = LocalSender<T>;

/// Group states, named as Kafka names them (DescribeGroups, ListGroups).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::PreparingRebalance => "PreparingRebalance",
            State::CompletingRebalance => "CompletingRebalance",
            State::Stable => "Stable",
        }
    }
}

/// Broker settings the state machine obeys (Kafka's keys in `super::Settings`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of an empty group
    /// waits for more members.
    pub initial_delay_ms: i64,
    /// `group.max.size`.
    pub max_size: usize,
}

/// A JoinGroup, version-independent.
#[derive(Clone, Debug, Default)]
pub struct JoinArgs {
    pub group: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub client_id: String,
    pub client_host: String,
    /// v4+: an unknown member first gets MEMBER_ID_REQUIRED (KIP-394).
    pub require_known_member_id: bool,
    /// The client connection the request came on (peer `ip:port`; empty if unknown): a
    /// client is one member of a group at a time, so a new KIP-394 id asked for on a
    /// connection supersedes the one handed out there before (see [`Pending`]).
    pub connection: String,
}

/// One member in the leader's JoinGroup answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JoinMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub metadata: Bytes,
}

/// The answer to a JoinGroup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JoinResult {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    pub members: Vec<JoinMember>,
}

impl JoinResult {
    pub fn error(error: i16, member_id: &str) -> JoinResult {
        JoinResult {
            error,
            generation: -1,
            member_id: member_id.to_string(),
            ..JoinResult::default()
        }
    }
}

/// A SyncGroup, version-independent.
#[derive(Clone, Debug, Default)]
pub struct SyncArgs {
    pub group: String,
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(String, Bytes)>,
}

/// The answer to a SyncGroup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncResult {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResult {
    pub fn error(error: i16) -> SyncResult {
        SyncResult {
            error,
            ..SyncResult::default()
        }
    }
}

/// One member of a group.
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    join_waiter: Option<Waiter<JoinResult>>,
    sync_waiter: Option<Waiter<SyncResult>>,
    last_seen_ms: i64,
}

impl Member {
    fn new(id: String, a: &JoinArgs, now: Now) -> Member {
        Member {
            id,
            instance_id: a.instance_id.clone(),
            client_id: a.client_id.clone(),
            client_host: a.client_host.clone(),
            session_timeout_ms: a.session_timeout_ms,
            rebalance_timeout_ms: a.rebalance_timeout_ms,
            protocols: a.protocols.clone(),
            assignment: Bytes::new(),
            join_waiter: None,
            sync_waiter: None,
            last_seen_ms: now.mono_ms,
        }
    }

    /// The member's metadata for `protocol` (empty if it does not support it).
    pub fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map_or_else(Bytes::new, |(_, m)| m.clone())
    }

    /// Answers a waiting JoinGroup. The member's session restarts from the answer, as
    /// Kafka's `completeAndScheduleNextHeartbeatExpiration`: it sent nothing while it
    /// waited, and must not be expired before it can act on the answer.
    /// Returns whether a JoinGroup was waiting.
    fn answer_join(&mut self, result: JoinResult, now: Now) -> bool {
        let Some(w) = self.join_waiter.take() else {
            return false;
        };
        let _ = w.try_send(result);
        self.last_seen_ms = self.last_seen_ms.max(now.mono_ms);
        true
    }

    /// Answers a waiting SyncGroup; the session restarts as in [`Member::answer_join`].
    fn answer_sync(&mut self, result: SyncResult, now: Now) {
        if let Some(w) = self.sync_waiter.take() {
            let _ = w.try_send(result);
            self.last_seen_ms = self.last_seen_ms.max(now.mono_ms);
        }
    }
}

/// One consumer group: membership, generation, committed offsets.
pub struct Group {
    pub id: String,
    pub state: State,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    /// In join order (join order picks the next leader). Read-only outside this module:
    /// the indexes below follow it.
    pub members: Vec<Member>,
    /// Where each member id is in `members`: a group may have many thousands of members
    /// (one client can park them), and every request names one.
    positions: HashMap<String, usize>,
    /// Static members' member ids, by instance id.
    instances: HashMap<String, String>,
    /// How many members list each protocol name: the protocols every member supports
    /// are those listed by all, without a scan of the members per join.
    protocol_support: HashMap<String, usize>,
    /// How many members wait in JoinGroup (have a `join_waiter`): whether all rejoined,
    /// without a scan per join.
    joined: usize,
    /// KIP-394: member ids handed out with MEMBER_ID_REQUIRED, not yet joined.
    pending: PendingIds,
    pub offsets: BTreeMap<(String, i32), OffsetValue>,
    /// When the group entered its current state (offsets retention counts from here).
    pub state_since_ms: i64,
    /// PreparingRebalance: when to stop waiting for members; CompletingRebalance: for
    /// the leader's assignment.
    deadline_ms: i64,
    /// Set while the first rebalance of an empty group waits for more members.
    initial_delay_until_ms: Option<i64>,
    /// The group's metadata changed in a way that must be written to the log.
    dirty: bool,
}

/// A member id handed out with MEMBER_ID_REQUIRED (KIP-394). Until it joins or expires,
/// the join phase waits for it (Kafka's `hasAllMembersJoined`).
#[derive(Clone, Debug)]
struct Pending {
    expires_ms: i64,
    /// The connection it was handed out on (empty: unknown).
    connection: String,
}

/// KIP-394's pending member ids, indexed by the connection each was handed out on, so
/// that a new id superseding a connection's earlier one costs no scan of them all (a
/// client may hold one per connection, thousands).
#[derive(Debug, Default)]
struct PendingIds {
    by_id: HashMap<String, Pending>,
    /// Connection → the id last handed out on it (only non-empty connections).
    by_connection: HashMap<String, String>,
}

impl PendingIds {
    fn len(&self) -> usize {
        self.by_id.len()
    }

    fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    fn contains(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    fn insert(&mut self, id: String, pending: Pending) {
        if !pending.connection.is_empty() {
            let old = self
                .by_connection
                .insert(pending.connection.clone(), id.clone());
            if let Some(old) = old.filter(|old| *old != id) {
                self.by_id.remove(&old);
            }
        }
        self.by_id.insert(id, pending);
    }

    fn remove(&mut self, id: &str) -> bool {
        let Some(p) = self.by_id.remove(id) else {
            return false;
        };
        if self
            .by_connection
            .get(&p.connection)
            .is_some_and(|i| i == id)
        {
            self.by_connection.remove(&p.connection);
        }
        true
    }

    /// Forgets the id handed out on `connection`, if any; whether one was.
    fn forget_on(&mut self, connection: &str) -> bool {
        match self.by_connection.remove(connection) {
            Some(id) => self.by_id.remove(&id).is_some(),
            None => false,
        }
    }

    fn clear(&mut self) {
        self.by_id.clear();
        self.by_connection.clear();
    }

    fn expire(&mut self, now: Now) {
        let before = self.by_id.len();
        self.by_id.retain(|_, p| p.expires_ms > now.mono_ms);
        if self.by_id.len() != before {
            let by_id = &self.by_id;
            self.by_connection.retain(|_, id| by_id.contains_key(id));
        }
        debug_assert!(self.by_connection.len() <= self.by_id.len());
    }
}

/// A static member replaced in a `Stable` group without a rebalance (KIP-345): its new
/// id is handed out only once the group's metadata naming it is stored (Kafka's
/// `updateStaticMemberAndRebalance`). The coordinator writes [`Group::to_value`] and
/// reports with [`Group::replacement_written`]; until then the JoinGroup waits.
#[must_use = "the replacement must be written and reported"]
pub struct Replacement {
    new_id: String,
    /// The member as it was, to restore if the write fails.
    old_id: String,
    old_protocols: Vec<(String, Bytes)>,
    old_session_timeout_ms: i32,
    old_rebalance_timeout_ms: i32,
    old_client_id: String,
    old_client_host: String,
    was_leader: bool,
    /// The answer once stored.
    result: JoinResult,
}

fn new_member_id(prefix: &str) -> String {
    let id = crate::metadata::new_topic_id();
    format!("{prefix}-{}", uuid::Uuid::from_u128(id))
}

impl Group {
    /// Answers every member's waiting JoinGroup/SyncGroup with `code` (the coordinator
    /// is dropping the group: it no longer leads its partition).
    pub fn fail_waiters(&mut self, code: i16, now: Now) {
        for m in &mut self.members {
            let id = m.id.clone();
            m.answer_join(JoinResult::error(code, &id), now);
            m.answer_sync(SyncResult::error(code), now);
        }
        self.joined = 0;
    }

    pub fn new(id: &str, now: Now) -> Group {
        Group {
            id: id.to_string(),
            state: State::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: Vec::new(),
            positions: HashMap::new(),
            instances: HashMap::new(),
            protocol_support: HashMap::new(),
            joined: 0,
            pending: PendingIds::default(),
            offsets: BTreeMap::new(),
            state_since_ms: now.wall_ms,
            deadline_ms: i64::MAX,
            initial_delay_until_ms: None,
            dirty: false,
        }
    }

    fn member(&self, id: &str) -> Option<&Member> {
        self.positions.get(id).map(|&at| &self.members[at])
    }

    fn member_mut(&mut self, id: &str) -> Option<&mut Member> {
        self.positions.get(id).map(|&at| &mut self.members[at])
    }

    fn static_member(&self, instance: &str) -> Option<&Member> {
        self.instances.get(instance).and_then(|id| self.member(id))
    }

    /// Counts (or uncounts) one member's protocol names in `protocol_support`, each
    /// name once however often the member lists it.
    fn count_protocols(&mut self, protocols: &[(String, Bytes)], add: bool) {
        let names: HashSet<&str> = protocols.iter().map(|(n, _)| n.as_str()).collect();
        for name in names {
            if add {
                *self.protocol_support.entry(name.to_string()).or_default() += 1;
                continue;
            }
            if let Some(n) = self.protocol_support.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    self.protocol_support.remove(name);
                }
            }
        }
    }

    /// Replaces the protocols of the member at `at`, keeping the counts.
    fn set_protocols(&mut self, at: usize, protocols: Vec<(String, Bytes)>) {
        let old = std::mem::replace(&mut self.members[at].protocols, protocols);
        self.count_protocols(&old, false);
        let new = self.members[at].protocols.clone();
        self.count_protocols(&new, true);
    }

    /// Gives the member at `at` a new id, keeping the indexes.
    fn rename_member(&mut self, at: usize, new_id: &str) {
        let old = std::mem::replace(&mut self.members[at].id, new_id.to_string());
        self.positions.remove(&old);
        self.positions.insert(new_id.to_string(), at);
        if let Some(i) = self.members[at].instance_id.clone() {
            self.instances.insert(i, new_id.to_string());
        }
    }

    /// Parks a JoinGroup of the member at `at` (one already parked is told to rejoin).
    fn park_join(&mut self, at: usize, reply: Waiter<JoinResult>, now: Now) {
        let m = &mut self.members[at];
        let id = m.id.clone();
        if !m.answer_join(JoinResult::error(codes::REBALANCE_IN_PROGRESS, &id), now) {
            self.joined += 1;
        }
        self.members[at].join_waiter = Some(reply);
    }

    /// Answers the parked JoinGroup of the member at `at`, if any.
    fn answer_join_at(&mut self, at: usize, result: JoinResult, now: Now) {
        if self.members[at].answer_join(result, now) {
            self.joined -= 1;
        }
    }

    /// Rebuilds `positions` from `from` on (members moved).
    fn reindex_from(&mut self, from: usize) {
        for (at, m) in self.members.iter().enumerate().skip(from) {
            self.positions.insert(m.id.clone(), at);
        }
    }

    /// Forgets a removed member in the indexes.
    fn unindex(&mut self, m: &Member) {
        self.positions.remove(&m.id);
        if let Some(i) = &m.instance_id
            && self.instances.get(i) == Some(&m.id)
        {
            self.instances.remove(i);
        }
        self.count_protocols(&m.protocols, false);
    }

    /// Whether `positions`, `instances`, `protocol_support` and `joined` say what a scan
    /// of the members says.
    fn indexes_hold(&self) -> bool {
        let mut support: HashMap<String, usize> = HashMap::new();
        for m in &self.members {
            let names: HashSet<&str> = m.protocols.iter().map(|(n, _)| n.as_str()).collect();
            for n in names {
                *support.entry(n.to_string()).or_default() += 1;
            }
        }
        let joined = self.members.iter().filter(|m| m.join_waiter.is_some());
        self.positions.len() == self.members.len()
            && self.members.iter().enumerate().all(|(at, m)| {
                self.positions.get(&m.id) == Some(&at)
                    && m.instance_id
                        .as_ref()
                        .is_none_or(|i| self.instances.contains_key(i))
            })
            && self
                .instances
                .values()
                .all(|id| self.positions.contains_key(id))
            && support == self.protocol_support
            && joined.count() == self.joined
    }

    /// Adds a member at the end, indexed.
    fn push_member(&mut self, m: Member) {
        self.positions.insert(m.id.clone(), self.members.len());
        if let Some(i) = &m.instance_id {
            self.instances
                .entry(i.clone())
                .or_insert_with(|| m.id.clone());
        }
        self.count_protocols(&m.protocols, true);
        self.joined += usize::from(m.join_waiter.is_some());
        self.members.push(m);
    }

    /// Whether a request naming `member_id` and `instance` comes from a fenced (replaced)
    /// static member: the instance id now belongs to another member id.
    fn is_fenced(&self, member_id: &str, instance: Option<&str>) -> bool {
        instance
            .and_then(|i| self.static_member(i))
            .is_some_and(|m| m.id != member_id)
    }

    fn is_leader(&self, id: &str) -> bool {
        self.leader.as_deref() == Some(id)
    }

    /// Empty: nothing but its offsets keeps it. KIP-394 member ids handed out and not
    /// used yet do not count (as in Kafka: the group is `Empty`, and may be deleted with
    /// them; an id that joins later is unknown and its client asks for a new one).
    pub fn is_idle(&self) -> bool {
        self.state == State::Empty && self.members.is_empty()
    }

    /// As [`Group::new`] made it: nothing joined, nothing pending, committed or stored.
    pub fn is_blank(&self) -> bool {
        self.is_idle()
            && self.generation == 0
            && self.pending.is_empty()
            && self.offsets.is_empty()
            && !self.dirty
    }

    /// Returns and clears whether the group's metadata must be written.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// Every transition goes through here, logged at debug (`WEIR_LOG=weir::group=debug`)
    /// with the generation and why: the trail to follow when a rebalance takes long.
    fn set_state(&mut self, state: State, now: Now, reason: &str) {
        tracing::debug!(
            group = %self.id,
            generation = self.generation,
            members = self.members.len(),
            "{} -> {}: {reason}",
            self.state.name(),
            state.name()
        );
        self.state = state;
        self.state_since_ms = now.wall_ms;
    }

    /// Whether a joining member's protocols fit the group: same type, and at least one
    /// protocol that every member supports.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if protocol_type.is_empty() || protocols.is_empty() {
            return false;
        }
        if self.members.is_empty() {
            return true;
        }
        if self.protocol_type.as_deref() != Some(protocol_type) {
            return false;
        }
        let names = protocols.iter().map(|(n, _)| n.as_str());
        !self.common_protocols(names).is_empty()
    }

    /// Which of `names` every member supports: those all members list (counted as they
    /// join), so linear in `names` alone — a JoinGroup may carry thousands of names and a
    /// group hold thousands of members.
    fn common_protocols<'a>(&self, names: impl Iterator<Item = &'a str>) -> HashSet<&'a str> {
        let all = self.members.len();
        names
            .filter(|n| self.protocol_support.get(*n).copied().unwrap_or(0) == all)
            .collect()
    }

    /// JoinGroup. The answer goes to `reply`, now or when the rebalance completes; a
    /// static member's replacement returned here is answered once stored (see
    /// [`Replacement`]).
    pub fn join(
        &mut self,
        a: JoinArgs,
        now: Now,
        limits: &Limits,
        reply: Waiter<JoinResult>,
    ) -> Option<Replacement> {
        if !self.supports(&a.protocol_type, &a.protocols) {
            let _ = reply.try_send(JoinResult::error(
                codes::INCONSISTENT_GROUP_PROTOCOL,
                &a.member_id,
            ));
            return None;
        }
        tracing::debug!(
            group = %self.id, generation = self.generation, member = %a.member_id,
            instance = ?a.instance_id, state = self.state.name(), "join"
        );
        if a.member_id.is_empty() {
            self.join_new(a, now, limits, reply)
        } else {
            self.join_known(a, now, limits, reply);
            None
        }
    }

    fn join_new(
        &mut self,
        a: JoinArgs,
        now: Now,
        limits: &Limits,
        reply: Waiter<JoinResult>,
    ) -> Option<Replacement> {
        let returning = a.instance_id.as_deref().and_then(|i| self.static_member(i));
        if let Some(old) = returning.map(|m| m.id.clone()) {
            return self.replace_static(&old, a, now, limits, reply);
        }
        if a.instance_id.is_none() && a.require_known_member_id {
            self.forget_superseded_pending(&a.connection);
        }
        if self.members.len() + self.pending.len() >= limits.max_size {
            let _ = reply.try_send(JoinResult::error(codes::GROUP_MAX_SIZE_REACHED, ""));
            return None;
        }
        let prefix = a.instance_id.as_deref().unwrap_or(&a.client_id);
        let id = new_member_id(prefix);
        if a.instance_id.is_none() && a.require_known_member_id {
            let pending = Pending {
                expires_ms: now.mono_ms + i64::from(a.session_timeout_ms),
                connection: a.connection.clone(),
            };
            self.pending.insert(id.clone(), pending);
            let _ = reply.try_send(JoinResult::error(codes::MEMBER_ID_REQUIRED, &id));
            return None;
        }
        self.add_member(id, &a, now, limits, reply);
        None
    }

    /// A client that asks for a new member id on a connection has given up the id handed
    /// out there before (librdkafka does so when `subscribe()` is called again while its
    /// first JoinGroup is answered): that id will never join, and would hold the join
    /// phase until its session timeout (45 s by default) expires. Kafka waits for it;
    /// weir forgets it at once.
    fn forget_superseded_pending(&mut self, connection: &str) {
        if !connection.is_empty() && self.pending.forget_on(connection) {
            tracing::debug!(
                group = %self.id, connection,
                "pending member id superseded by a new one on the same connection"
            );
        }
    }

    fn add_member(
        &mut self,
        id: String,
        a: &JoinArgs,
        now: Now,
        limits: &Limits,
        reply: Waiter<JoinResult>,
    ) {
        self.pending.remove(&id);
        let mut m = Member::new(id.clone(), a, now);
        m.join_waiter = Some(reply);
        // The first member of an empty group sets its protocol type (Kafka's rule): a
        // group id emptied by consumers may be used by another kind of client.
        if self.members.is_empty() {
            self.protocol_type = Some(a.protocol_type.clone());
        }
        self.push_member(m);
        if self.leader.is_none() {
            self.leader = Some(id);
        }
        self.extend_initial_delay(now, limits);
        self.prepare_rebalance_if_settled(now, limits, "a new member joined");
    }

    /// A new member arriving during an empty group's initial delay buys it another delay
    /// (bounded by the rebalance deadline).
    fn extend_initial_delay(&mut self, now: Now, limits: &Limits) {
        if let Some(until) = self.initial_delay_until_ms.as_mut() {
            *until = (now.mono_ms + limits.initial_delay_ms).min(self.deadline_ms);
        }
    }

    /// A static member rejoined with no member id: it gets a new id, the old id is fenced.
    fn replace_static(
        &mut self,
        old: &str,
        a: JoinArgs,
        now: Now,
        limits: &Limits,
        reply: Waiter<JoinResult>,
    ) -> Option<Replacement> {
        let new_id = new_member_id(a.instance_id.as_deref().unwrap_or("static"));
        let was_leader = self.is_leader(old);
        let leader_before = self.leader.clone().unwrap_or_default();
        let at = *self.positions.get(old)?;
        self.answer_join_at(at, JoinResult::error(codes::FENCED_INSTANCE_ID, old), now);
        let m = &mut self.members[at];
        m.answer_sync(SyncResult::error(codes::FENCED_INSTANCE_ID), now);
        let mut replacement = Replacement {
            new_id: new_id.clone(),
            old_id: old.to_string(),
            old_protocols: m.protocols.clone(),
            old_session_timeout_ms: m.session_timeout_ms,
            old_rebalance_timeout_ms: m.rebalance_timeout_ms,
            old_client_id: m.client_id.clone(),
            old_client_host: m.client_host.clone(),
            was_leader,
            result: JoinResult::default(),
        };
        m.session_timeout_ms = a.session_timeout_ms;
        m.rebalance_timeout_ms = a.rebalance_timeout_ms;
        m.client_id = a.client_id.clone();
        m.client_host = a.client_host.clone();
        m.last_seen_ms = now.mono_ms;
        self.rename_member(at, &new_id);
        self.set_protocols(at, a.protocols.clone());
        if was_leader {
            self.leader = Some(new_id.clone());
        }
        // Kafka (`updateStaticMemberAndRebalance`): a Stable group rebalances only if the
        // protocol it would select now differs from the current one. Otherwise the member
        // keeps its old assignment; the answer names the leader as it was before the
        // replacement and carries no member list (JoinGroup < v9 has no `skip_assignment`),
        // so a rejoining leader acts as a follower, syncs, and gets its assignment back.
        let keeps_protocol = self.select_protocol() == self.protocol;
        match self.state {
            State::Stable if keeps_protocol => {
                tracing::debug!(
                    group = %self.id, generation = self.generation, member = %new_id, was_leader,
                    "static member rejoined: no rebalance (selected protocol unchanged)"
                );
                let mut result = self.current_join_result(&new_id);
                result.members.clear();
                result.leader = leader_before;
                replacement.result = result;
                // Parked like a rejoin: alive, and answered by a rebalance if one
                // completes before the write does (Kafka's awaitingJoinCallback).
                self.park_join(at, reply, now);
                Some(replacement)
            }
            _ => {
                self.rejoin(&new_id, &a, now, limits, reply);
                None
            }
        }
    }

    /// The write of a [`Replacement`] ended with `result`. Stored: the member gets its
    /// new id. Not stored: the replacement is undone (the old id holds again, as in the
    /// log) and the member gets the write's error (Kafka's `updateStaticMemberAndRebalance`
    /// callback). Nothing if the member was answered meanwhile (a rebalance completed, or
    /// it was replaced or removed again).
    pub fn replacement_written(&mut self, r: Replacement, result: Result<(), i16>, now: Now) {
        let Some(&at) = self.positions.get(&r.new_id) else {
            return;
        };
        if self.members[at].join_waiter.is_none() {
            return;
        }
        let code = match result {
            Ok(()) => return self.answer_join_at(at, r.result, now),
            Err(code) => code,
        };
        assert_ne!(code, codes::NONE, "a failed write has an error code");
        self.answer_join_at(at, JoinResult::error(code, ""), now);
        let m = &mut self.members[at];
        m.session_timeout_ms = r.old_session_timeout_ms;
        m.rebalance_timeout_ms = r.old_rebalance_timeout_ms;
        m.client_id = r.old_client_id;
        m.client_host = r.old_client_host;
        self.rename_member(at, &r.old_id);
        self.set_protocols(at, r.old_protocols);
        if r.was_leader && self.is_leader(&r.new_id) {
            self.leader = Some(r.old_id.clone());
        }
        tracing::debug!(
            group = %self.id, member = %r.old_id, code,
            "static member replacement not stored: undone"
        );
    }

    fn join_known(&mut self, a: JoinArgs, now: Now, limits: &Limits, reply: Waiter<JoinResult>) {
        if self.pending.contains(&a.member_id) {
            return self.add_member(a.member_id.clone(), &a, now, limits, reply);
        }
        let refuse = |code: i16| {
            let _ = reply.try_send(JoinResult::error(code, &a.member_id));
        };
        if self.is_fenced(&a.member_id, a.instance_id.as_deref()) {
            return refuse(codes::FENCED_INSTANCE_ID);
        }
        let Some(m) = self.member(&a.member_id) else {
            return refuse(codes::UNKNOWN_MEMBER_ID);
        };
        let same = m.protocols == a.protocols;
        match self.state {
            State::Empty => refuse(codes::UNKNOWN_MEMBER_ID),
            State::PreparingRebalance => self.rejoin(&a.member_id, &a, now, limits, reply),
            State::CompletingRebalance if same => {
                let result = self.current_join_result(&a.member_id);
                let _ = reply.try_send(result);
            }
            State::Stable if same && !self.is_leader(&a.member_id) => {
                let result = self.current_join_result(&a.member_id);
                let _ = reply.try_send(result);
            }
            State::CompletingRebalance | State::Stable => {
                self.rejoin(&a.member_id, &a, now, limits, reply)
            }
        }
    }

    /// A known member (re)joins: new metadata, parked until the rebalance completes.
    fn rejoin(
        &mut self,
        id: &str,
        a: &JoinArgs,
        now: Now,
        limits: &Limits,
        reply: Waiter<JoinResult>,
    ) {
        let Some(&at) = self.positions.get(id) else {
            let _ = reply.try_send(JoinResult::error(codes::UNKNOWN_MEMBER_ID, id));
            return;
        };
        let m = &mut self.members[at];
        m.session_timeout_ms = a.session_timeout_ms;
        m.rebalance_timeout_ms = a.rebalance_timeout_ms;
        m.last_seen_ms = now.mono_ms;
        self.set_protocols(at, a.protocols.clone());
        self.park_join(at, reply, now);
        self.prepare_rebalance_if_settled(now, limits, "a member rejoined");
    }

    /// Starts a rebalance unless one is already under way.
    fn prepare_rebalance_if_settled(&mut self, now: Now, limits: &Limits, reason: &str) {
        if matches!(
            self.state,
            State::Empty | State::Stable | State::CompletingRebalance
        ) {
            self.prepare_rebalance(now, limits, reason);
        }
    }

    fn prepare_rebalance(&mut self, now: Now, limits: &Limits, reason: &str) {
        if self.state == State::CompletingRebalance {
            for m in &mut self.members {
                m.assignment = Bytes::new();
                m.answer_sync(SyncResult::error(codes::REBALANCE_IN_PROGRESS), now);
            }
        }
        let first = self.state == State::Empty;
        self.set_state(State::PreparingRebalance, now, reason);
        let timeout = self
            .members
            .iter()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0);
        self.deadline_ms = now.mono_ms + timeout;
        self.initial_delay_until_ms = (first && limits.initial_delay_ms > 0)
            .then(|| (now.mono_ms + limits.initial_delay_ms).min(self.deadline_ms));
    }

    /// Completes the join phase if every member rejoined (after any initial delay), or
    /// the rebalance timeout passed (members that did not rejoin are dropped).
    pub fn try_complete_join(&mut self, now: Now) {
        if self.state != State::PreparingRebalance {
            return;
        }
        // Checked in debug builds for groups small enough to scan on every call.
        debug_assert!(
            self.members.len() > 1000 || self.indexes_hold(),
            "the indexes follow the members"
        );
        let all_joined = self.pending.is_empty() && self.joined == self.members.len();
        let delay_over = self.initial_delay_until_ms.is_none_or(|t| now.mono_ms >= t);
        let timed_out = now.mono_ms >= self.deadline_ms;
        if !(timed_out || all_joined && delay_over) {
            return;
        }
        if !all_joined {
            self.pending.clear();
            self.drop_members(now, |m| m.join_waiter.is_none());
        }
        self.complete_join(now);
    }

    fn complete_join(&mut self, now: Now) {
        self.initial_delay_until_ms = None;
        self.generation = self.generation.wrapping_add(1).max(1);
        if self.members.is_empty() {
            self.protocol = None;
            self.leader = None;
            self.set_state(State::Empty, now, "join phase over with no members");
            self.dirty = true;
            return;
        }
        self.protocol = self.select_protocol();
        let leader_present = self
            .leader
            .as_deref()
            .is_some_and(|l| self.member(l).is_some());
        if !leader_present {
            self.leader = self.members.first().map(|m| m.id.clone());
        }
        self.set_state(State::CompletingRebalance, now, "join phase over");
        let timeout = self.members.iter().map(|m| m.rebalance_timeout_ms).max();
        self.deadline_ms = now.mono_ms + i64::from(timeout.unwrap_or(0));
        // One pass: a follower's answer differs from the others' only in its id, and the
        // leader's member list is built once.
        let leader = self.leader.clone().unwrap_or_default();
        let mut for_leader = Some(self.current_join_result(&leader));
        let for_follower = JoinResult {
            members: Vec::new(),
            ..self.current_join_result("")
        };
        let mut answered = 0;
        for m in &mut self.members {
            let result = match for_leader.take_if(|_| m.id == leader) {
                Some(result) => result,
                None => JoinResult {
                    member_id: m.id.clone(),
                    ..for_follower.clone()
                },
            };
            answered += usize::from(m.answer_join(result, now));
        }
        self.joined -= answered;
    }

    /// The JoinGroup answer for `id` in the current generation; the leader also gets
    /// every member's metadata for the chosen protocol.
    fn current_join_result(&self, id: &str) -> JoinResult {
        let protocol = self.protocol.clone().unwrap_or_default();
        let members = if self.is_leader(id) {
            self.members
                .iter()
                .map(|m| JoinMember {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    metadata: m.metadata(&protocol),
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinResult {
            error: codes::NONE,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: id.to_string(),
            members,
        }
    }

    /// Kafka's vote: among the protocols every member supports, each member votes for
    /// the one it lists first; most votes wins (ties: the earlier in the leader's list).
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.first()?;
        let common = self.common_protocols(first.protocols.iter().map(|(n, _)| n.as_str()));
        let mut votes: HashMap<&str, usize> = HashMap::new();
        for m in &self.members {
            let choice = m
                .protocols
                .iter()
                .find(|(n, _)| common.contains(n.as_str()));
            if let Some((n, _)) = choice {
                *votes.entry(n.as_str()).or_default() += 1;
            }
        }
        let mut best: Option<(&str, usize)> = None;
        for (c, _) in &first.protocols {
            let Some(&v) = votes.get(c.as_str()) else {
                continue;
            };
            if best.is_none_or(|(_, bv)| v > bv) {
                best = Some((c, v));
            }
        }
        best.map(|(n, _)| n.to_string())
    }

    /// SyncGroup. The leader's call carries the assignment; every member's answer is its
    /// own part of it, once the assignment is stored: for the leader's call this returns
    /// the generation whose metadata (see [`Group::to_value`]) the coordinator must write
    /// now and report with [`Group::assignment_written`] (Kafka's `doSyncGroup`, which
    /// answers nobody before `storeGroup` calls back). Until then every member waits.
    #[must_use = "the leader's assignment must be written and reported"]
    pub fn sync(&mut self, a: SyncArgs, now: Now, reply: Waiter<SyncResult>) -> Option<i32> {
        if let Err(code) = self.check_sync(&a) {
            let _ = reply.try_send(SyncResult::error(code));
            return None;
        }
        match self.state {
            State::Empty => {
                let _ = reply.try_send(SyncResult::error(codes::UNKNOWN_MEMBER_ID));
                None
            }
            State::PreparingRebalance => {
                let _ = reply.try_send(SyncResult::error(codes::REBALANCE_IN_PROGRESS));
                None
            }
            State::Stable => {
                let result = self.sync_result(&a.member_id);
                if let Some(m) = self.member_mut(&a.member_id) {
                    m.last_seen_ms = now.mono_ms;
                }
                let _ = reply.try_send(result);
                None
            }
            State::CompletingRebalance => {
                let leader = self.is_leader(&a.member_id);
                if let Some(m) = self.member_mut(&a.member_id) {
                    m.last_seen_ms = now.mono_ms;
                    m.answer_sync(SyncResult::error(codes::REBALANCE_IN_PROGRESS), now);
                    m.sync_waiter = Some(reply);
                }
                leader.then(|| self.stage_assignment(a.assignments))
            }
        }
    }

    fn check_sync(&self, a: &SyncArgs) -> Result<(), i16> {
        if self.is_fenced(&a.member_id, a.instance_id.as_deref()) {
            return Err(codes::FENCED_INSTANCE_ID);
        }
        if self.member(&a.member_id).is_none() {
            return Err(codes::UNKNOWN_MEMBER_ID);
        }
        if a.generation != self.generation {
            return Err(codes::ILLEGAL_GENERATION);
        }
        let type_differs = a
            .protocol_type
            .as_ref()
            .is_some_and(|t| Some(t) != self.protocol_type.as_ref());
        let name_differs = a
            .protocol_name
            .as_ref()
            .is_some_and(|n| Some(n) != self.protocol.as_ref());
        if type_differs || name_differs {
            return Err(codes::INCONSISTENT_GROUP_PROTOCOL);
        }
        Ok(())
    }

    fn sync_result(&self, id: &str) -> SyncResult {
        SyncResult {
            error: codes::NONE,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            assignment: self
                .member(id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
        }
    }

    /// The leader's assignment, held until it is stored: members it left out get an
    /// empty one. Returns the generation it belongs to. The group stays
    /// `CompletingRebalance` and nobody is answered yet.
    fn stage_assignment(&mut self, assignments: Vec<(String, Bytes)>) -> i32 {
        assert_eq!(
            self.state,
            State::CompletingRebalance,
            "assignment outside its phase"
        );
        let mut by_member: HashMap<String, Bytes> = assignments.into_iter().collect();
        for m in &mut self.members {
            m.assignment = by_member.remove(&m.id).unwrap_or_default();
        }
        self.generation
    }

    /// The write of the leader's assignment for `generation` ended with `result` (an
    /// error: the code Kafka's `storeGroup` gives the SyncGroup, e.g.
    /// COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, REBALANCE_IN_PROGRESS). Stored: the
    /// group is `Stable` and every waiting member gets its part. Not stored: every
    /// waiting member gets the error, the assignment is dropped and the group rebalances,
    /// so the members rejoin (Kafka's `resetAndPropagateAssignmentError` and
    /// `maybePrepareRebalance`). Ignored if the group moved on meanwhile (another
    /// rebalance, a new generation): what it does now is not this write's to decide.
    pub fn assignment_written(
        &mut self,
        generation: i32,
        result: Result<(), i16>,
        now: Now,
        limits: &Limits,
    ) {
        if self.state != State::CompletingRebalance || self.generation != generation {
            return;
        }
        match result {
            Ok(()) => {
                self.set_state(State::Stable, now, "the leader's assignment is stored");
                let answer = SyncResult {
                    error: codes::NONE,
                    protocol_type: self.protocol_type.clone(),
                    protocol_name: self.protocol.clone(),
                    assignment: Bytes::new(),
                };
                for m in &mut self.members {
                    let assignment = m.assignment.clone();
                    m.answer_sync(
                        SyncResult {
                            assignment,
                            ..answer.clone()
                        },
                        now,
                    );
                }
            }
            Err(code) => {
                assert_ne!(code, codes::NONE, "a failed write has an error code");
                for m in &mut self.members {
                    m.assignment = Bytes::new();
                    m.answer_sync(SyncResult::error(code), now);
                }
                self.prepare_rebalance(now, limits, "the assignment could not be stored");
            }
        }
    }

    /// Heartbeat: keeps the session alive; tells the member when to rejoin.
    pub fn heartbeat(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
        now: Now,
    ) -> i16 {
        if self.is_fenced(member_id, instance) {
            return codes::FENCED_INSTANCE_ID;
        }
        let state = self.state;
        let current = self.generation;
        let Some(m) = self.member_mut(member_id) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        if state == State::Empty {
            return codes::UNKNOWN_MEMBER_ID;
        }
        if generation != current {
            return codes::ILLEGAL_GENERATION;
        }
        m.last_seen_ms = now.mono_ms;
        if state == State::PreparingRebalance {
            codes::REBALANCE_IN_PROGRESS
        } else {
            codes::NONE
        }
    }

    /// LeaveGroup of one member (by member id, or by instance id for static members).
    pub fn leave(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        now: Now,
        limits: &Limits,
    ) -> i16 {
        let code = self.leave_member(member_id, instance, now, limits);
        tracing::debug!(group = %self.id, member = member_id, ?instance, code, "leave");
        code
    }

    fn leave_member(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        now: Now,
        limits: &Limits,
    ) -> i16 {
        let id = match instance {
            Some(i) => match self.static_member(i) {
                None => return codes::UNKNOWN_MEMBER_ID,
                Some(m) if !member_id.is_empty() && m.id != member_id => {
                    return codes::FENCED_INSTANCE_ID;
                }
                Some(m) => m.id.clone(),
            },
            None if self.pending.remove(member_id) => {
                self.try_complete_join(now);
                return codes::NONE;
            }
            None if self.member(member_id).is_none() => return codes::UNKNOWN_MEMBER_ID,
            None => member_id.to_string(),
        };
        self.remove_member(&id, now, limits, "a member left");
        codes::NONE
    }

    /// Drops a member without touching the group's state.
    fn drop_member(&mut self, id: &str, now: Now) {
        let Some(at) = self.positions.get(id).copied() else {
            return;
        };
        self.answer_join_at(at, JoinResult::error(codes::UNKNOWN_MEMBER_ID, id), now);
        let mut m = self.members.remove(at);
        m.answer_sync(SyncResult::error(codes::UNKNOWN_MEMBER_ID), now);
        self.unindex(&m);
        self.reindex_from(at);
        if self.is_leader(id) {
            self.leader = self.members.first().map(|m| m.id.clone());
        }
    }

    /// Drops every member `doomed` picks in one pass, without touching the group's
    /// state (one at a time, each removal would shift and re-index the rest). Returns
    /// how many went.
    fn drop_members(&mut self, now: Now, doomed: impl Fn(&Member) -> bool) -> usize {
        let (gone, kept): (Vec<Member>, Vec<Member>) = std::mem::take(&mut self.members)
            .into_iter()
            .partition(doomed);
        self.members = kept;
        let count = gone.len();
        if count == 0 {
            return 0;
        }
        for mut m in gone {
            let id = m.id.clone();
            if m.answer_join(JoinResult::error(codes::UNKNOWN_MEMBER_ID, &id), now) {
                self.joined -= 1;
            }
            m.answer_sync(SyncResult::error(codes::UNKNOWN_MEMBER_ID), now);
            self.unindex(&m);
        }
        self.reindex_from(0);
        let leader_gone = self
            .leader
            .as_deref()
            .is_some_and(|l| !self.positions.contains_key(l));
        if leader_gone {
            self.leader = self.members.first().map(|m| m.id.clone());
        }
        count
    }

    /// Removes a member (left, expired); the others rebalance.
    fn remove_member(&mut self, id: &str, now: Now, limits: &Limits, reason: &str) {
        self.drop_member(id, now);
        if matches!(self.state, State::Stable | State::CompletingRebalance) {
            self.prepare_rebalance(now, limits, reason);
        }
        // The last member gone: the group is empty at once, not at the next tick.
        self.try_complete_join(now);
    }

    /// Timers: expired sessions and pending member ids, rebalance and sync deadlines.
    pub fn tick(&mut self, now: Now, limits: &Limits) {
        self.pending.expire(now);
        let expired = |m: &Member| {
            m.join_waiter.is_none()
                && m.sync_waiter.is_none()
                && now.mono_ms - m.last_seen_ms >= i64::from(m.session_timeout_ms)
        };
        for m in self.members.iter().filter(|m| expired(m)) {
            tracing::info!(group = %self.id, member = %m.id, "session expired");
        }
        // All at once, and one rebalance for all of them.
        let gone = self.drop_members(now, expired);
        if gone > 0 && matches!(self.state, State::Stable | State::CompletingRebalance) {
            self.prepare_rebalance(now, limits, "a member's session expired");
        }
        if self.state == State::CompletingRebalance && now.mono_ms >= self.deadline_ms {
            // The leader never sent its assignment: drop whoever has not synced, retry.
            self.drop_members(now, |m| m.sync_waiter.is_none());
            self.prepare_rebalance(now, limits, "the leader did not sync in time");
        }
        self.try_complete_join(now);
    }

    /// Checks an OffsetCommit's member and generation (Kafka's rules: a commit with no
    /// member and a negative generation — a simple consumer's, or an admin's
    /// AlterConsumerGroupOffsets — is allowed only while the group is empty; into a group
    /// with members it gets UNKNOWN_MEMBER_ID, as Kafka's `validateOffsetCommit` answers).
    pub fn check_commit(
        &self,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
    ) -> Result<(), i16> {
        self.check_member_commit(member_id, instance, generation)?;
        if self.state == State::CompletingRebalance {
            return Err(codes::REBALANCE_IN_PROGRESS);
        }
        Ok(())
    }

    /// A TxnOffsetCommit's check: as a commit's, but without REBALANCE_IN_PROGRESS while
    /// the group completes a rebalance (Kafka's transactional `validateOffsetCommit`;
    /// the Java producer has no way to handle that code there and fails).
    pub fn check_txn_commit(
        &self,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
    ) -> Result<(), i16> {
        self.check_member_commit(member_id, instance, generation)
    }

    fn check_member_commit(
        &self,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
    ) -> Result<(), i16> {
        if generation < 0 && member_id.is_empty() && instance.is_none() {
            return if self.members.is_empty() {
                Ok(())
            } else {
                Err(codes::UNKNOWN_MEMBER_ID)
            };
        }
        if self.is_fenced(member_id, instance) {
            return Err(codes::FENCED_INSTANCE_ID);
        }
        if self.member(member_id).is_none() {
            return Err(codes::UNKNOWN_MEMBER_ID);
        }
        if generation != self.generation {
            return Err(codes::ILLEGAL_GENERATION);
        }
        Ok(())
    }

    /// The group's metadata as written to `__consumer_offsets`.
    pub fn to_value(&self) -> GroupValue {
        let protocol = self.protocol.clone().unwrap_or_default();
        GroupValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            state_timestamp_ms: self.state_since_ms,
            members: self
                .members
                .iter()
                .map(|m| MemberValue {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    /// Rebuilds membership from a stored value (replay after a restart). Members get a
    /// fresh session from `now.mono_ms`: those that do not come back expire and rebalance.
    pub fn restore(&mut self, v: GroupValue, now: Now) {
        self.generation = v.generation;
        self.protocol_type = (!v.protocol_type.is_empty()).then_some(v.protocol_type);
        self.protocol = v.protocol;
        self.leader = v.leader;
        self.state_since_ms = if v.state_timestamp_ms >= 0 {
            v.state_timestamp_ms
        } else {
            now.wall_ms
        };
        let protocol = self.protocol.clone().unwrap_or_default();
        let restored: Vec<Member> = v
            .members
            .into_iter()
            .map(|m| Member {
                id: m.member_id,
                instance_id: m.instance_id,
                client_id: m.client_id,
                client_host: m.client_host,
                session_timeout_ms: m.session_timeout_ms,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                protocols: vec![(protocol.clone(), m.subscription)],
                assignment: m.assignment,
                join_waiter: None,
                sync_waiter: None,
                last_seen_ms: now.mono_ms,
            })
            .collect();
        self.members.clear();
        self.positions.clear();
        self.instances.clear();
        self.protocol_support.clear();
        self.joined = 0;
        for m in restored {
            // A member id stored twice (a damaged value) is kept once: the index holds one.
            if !self.positions.contains_key(&m.id) {
                self.push_member(m);
            }
        }
        self.state = if self.members.is_empty() {
            State::Empty
        } else {
            State::Stable
        };
    }
}

#[cfg(test)]
mod tests;
