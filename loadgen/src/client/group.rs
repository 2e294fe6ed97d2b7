//! A simple consumer-group member: FindCoordinator, JoinGroup (with the KIP-394 member-id
//! handshake), SyncGroup with a round-robin assignment computed by the leader, Heartbeat,
//! OffsetFetch / OffsetCommit, LeaveGroup. One topic per group; the "range" protocol name
//! with round-robin placement (partition p to the (p mod n)-th member by member id).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedTopic;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, FindCoordinatorRequest, GroupId,
    HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, OffsetCommitRequest, OffsetFetchRequest,
    SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use wire::api;

use super::conn::Conn;
use super::error_name;
use super::metadata::Cluster;

const SESSION_TIMEOUT_MS: i32 = 10_000;
const REBALANCE_TIMEOUT_MS: i32 = 30_000;
/// How long a run waits for every member of its group to have an assignment before the
/// producers start: a first join waits out the broker's group.initial.rebalance.delay.ms
/// (3 s by default), each later member's join is a rebalance the others learn of by their
/// next heartbeat, and a member of an earlier generation that is gone holds a rebalance
/// up to its rebalance timeout, its session timeout after that. Both, plus a margin.
pub const READY_TIMEOUT: Duration =
    Duration::from_millis((REBALANCE_TIMEOUT_MS + SESSION_TIMEOUT_MS) as u64 + 10_000);
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// How often the wait for a group looks at its interrupt flag. A signal handler can set a
/// flag but not notify a condition variable, so the flag is looked at this often; every
/// member's news (assigned, failed) ends the wait at once.
const INTERRUPT_CHECK: Duration = Duration::from_millis(100);
/// Joins retried (member-id handshake, coordinator loading, rebalances) before giving up.
const JOIN_ATTEMPTS_MAX: u32 = 20;
const JOIN_RETRY_PAUSE: Duration = Duration::from_millis(200);
const PROTOCOL: &str = "range";
const MEMBER_ID_REQUIRED: i16 = 79;
const REBALANCE_IN_PROGRESS: i16 = 27;
const UNKNOWN_MEMBER_ID: i16 = 25;
const ILLEGAL_GENERATION: i16 = 22;

fn s(x: &str) -> StrBytes {
    StrBytes::from_string(x.to_string())
}

/// What a heartbeat said.
#[derive(Debug, PartialEq, Eq)]
pub enum Beat {
    Fine,
    /// The group is rebalancing (or forgot us): commit and rejoin.
    Rejoin,
}

/// This consumer's membership of one group.
pub struct GroupMember {
    group: String,
    topic: String,
    partitions_total: usize,
    coordinator: Conn,
    member_id: String,
    generation: i32,
    last_beat: Instant,
}

impl GroupMember {
    /// Finds the coordinator and joins; returns the member and its assignment.
    pub fn join(cluster: &Cluster, group: &str, topic: &str) -> Result<(Self, Vec<i32>)> {
        let coordinator = find_coordinator(cluster, group)?;
        let mut m = Self {
            group: group.to_string(),
            topic: topic.to_string(),
            partitions_total: cluster.partitions(),
            coordinator,
            member_id: String::new(),
            generation: -1,
            last_beat: Instant::now(),
        };
        let parts = m.rejoin()?;
        Ok((m, parts))
    }

    /// Joins (again) and syncs; returns the partitions assigned to this member.
    pub fn rejoin(&mut self) -> Result<Vec<i32>> {
        for _ in 0..JOIN_ATTEMPTS_MAX {
            let (code, leader, members) = self.join_once()?;
            match code {
                0 => {}
                MEMBER_ID_REQUIRED => continue, // member id set by join_once: go again
                UNKNOWN_MEMBER_ID => {
                    self.member_id.clear();
                    continue;
                }
                c => {
                    std::thread::sleep(JOIN_RETRY_PAUSE);
                    crate::client::producer::warn(&format!("JoinGroup: {}", error_name(c)));
                    continue;
                }
            }
            let assignments = if leader == self.member_id {
                assign(&self.topic, self.partitions_total, &members)?
            } else {
                Vec::new()
            };
            match self.sync(assignments)? {
                Some(parts) => {
                    self.last_beat = Instant::now();
                    return Ok(parts);
                }
                None => std::thread::sleep(JOIN_RETRY_PAUSE),
            }
        }
        bail!(
            "could not join group {} after {JOIN_ATTEMPTS_MAX} attempts",
            self.group
        )
    }

    /// One JoinGroup: (error code, leader id, member ids if leader).
    fn join_once(&mut self) -> Result<(i16, String, Vec<String>)> {
        let v = self.coordinator.versions.pick(api::JOIN_GROUP, 1, 7)?;
        let mut sub = ConsumerProtocolSubscription::default();
        sub.topics = vec![s(&self.topic)];
        let mut p = JoinGroupRequestProtocol::default();
        p.name = s(PROTOCOL);
        p.metadata = versioned(&sub, 0)?;
        let mut req = JoinGroupRequest::default();
        req.group_id = GroupId(s(&self.group));
        req.session_timeout_ms = SESSION_TIMEOUT_MS;
        req.rebalance_timeout_ms = REBALANCE_TIMEOUT_MS;
        req.member_id = s(&self.member_id);
        req.protocol_type = s("consumer");
        req.protocols = vec![p];
        let resp = self.coordinator.call(&req, v)?;
        if !resp.member_id.is_empty() {
            self.member_id = resp.member_id.to_string();
        }
        self.generation = resp.generation_id;
        let members = resp
            .members
            .iter()
            .map(|m| m.member_id.to_string())
            .collect();
        Ok((resp.error_code, resp.leader.to_string(), members))
    }

    /// SyncGroup; `None` if the group started rebalancing again.
    fn sync(&mut self, assignments: Vec<(String, Bytes)>) -> Result<Option<Vec<i32>>> {
        let v = self.coordinator.versions.pick(api::SYNC_GROUP, 0, 5)?;
        let mut req = SyncGroupRequest::default();
        req.group_id = GroupId(s(&self.group));
        req.generation_id = self.generation;
        req.member_id = s(&self.member_id);
        req.protocol_type = Some(s("consumer"));
        req.protocol_name = Some(s(PROTOCOL));
        req.assignments = assignments
            .into_iter()
            .map(|(member, bytes)| {
                let mut a = SyncGroupRequestAssignment::default();
                a.member_id = s(&member);
                a.assignment = bytes;
                a
            })
            .collect();
        let resp = self.coordinator.call(&req, v)?;
        match resp.error_code {
            0 => Ok(Some(decode_assignment(&self.topic, resp.assignment)?)),
            REBALANCE_IN_PROGRESS | ILLEGAL_GENERATION | UNKNOWN_MEMBER_ID => Ok(None),
            c => bail!("SyncGroup: {}", error_name(c)),
        }
    }

    /// The generation of this member's current assignment.
    pub fn generation(&self) -> i32 {
        self.generation
    }

    /// Sends a heartbeat if one is due.
    pub fn heartbeat_if_due(&mut self) -> Result<Beat> {
        if self.last_beat.elapsed() < HEARTBEAT_EVERY {
            return Ok(Beat::Fine);
        }
        self.last_beat = Instant::now();
        let v = self.coordinator.versions.pick(api::HEARTBEAT, 0, 4)?;
        let mut req = HeartbeatRequest::default();
        req.group_id = GroupId(s(&self.group));
        req.generation_id = self.generation;
        req.member_id = s(&self.member_id);
        let resp = self.coordinator.call(&req, v)?;
        match resp.error_code {
            0 => Ok(Beat::Fine),
            REBALANCE_IN_PROGRESS | ILLEGAL_GENERATION | UNKNOWN_MEMBER_ID => Ok(Beat::Rejoin),
            c => bail!("Heartbeat: {}", error_name(c)),
        }
    }

    /// Committed offsets of `parts` (partitions without one are left out).
    pub fn committed(&mut self, parts: &[i32]) -> Result<BTreeMap<i32, i64>> {
        let v = self.coordinator.versions.pick(api::OFFSET_FETCH, 1, 7)?;
        let mut t = OffsetFetchRequestTopic::default();
        t.name = TopicName(s(&self.topic));
        t.partition_indexes = parts.to_vec();
        let mut req = OffsetFetchRequest::default();
        req.group_id = GroupId(s(&self.group));
        req.topics = Some(vec![t]);
        let resp = self.coordinator.call(&req, v)?;
        let mut out = BTreeMap::new();
        for t in resp.topics {
            for p in t.partitions {
                if p.error_code == 0 && p.committed_offset >= 0 {
                    out.insert(p.partition_index, p.committed_offset);
                }
            }
        }
        Ok(out)
    }

    /// Commits `offsets` (next offset to read, per partition) for this generation.
    pub fn commit(&mut self, offsets: &BTreeMap<i32, i64>) -> Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        let v = self.coordinator.versions.pick(api::OFFSET_COMMIT, 2, 8)?;
        let mut t = OffsetCommitRequestTopic::default();
        t.name = TopicName(s(&self.topic));
        t.partitions = offsets
            .iter()
            .map(|(&p, &o)| {
                let mut cp = OffsetCommitRequestPartition::default();
                cp.partition_index = p;
                cp.committed_offset = o;
                cp.committed_leader_epoch = -1;
                cp
            })
            .collect();
        let mut req = OffsetCommitRequest::default();
        req.group_id = GroupId(s(&self.group));
        req.generation_id_or_member_epoch = self.generation;
        req.member_id = s(&self.member_id);
        req.retention_time_ms = -1;
        req.topics = vec![t];
        let resp = self.coordinator.call(&req, v)?;
        for t in resp.topics {
            for p in t.partitions {
                if p.error_code != 0 {
                    bail!(
                        "OffsetCommit partition {}: {}",
                        p.partition_index,
                        error_name(p.error_code)
                    );
                }
            }
        }
        Ok(())
    }

    /// Leaves the group (best effort; the session timeout covers a failure).
    pub fn leave(&mut self) {
        let Ok(v) = self.coordinator.versions.pick(api::LEAVE_GROUP, 0, 2) else {
            return;
        };
        let mut req = LeaveGroupRequest::default();
        req.group_id = GroupId(s(&self.group));
        req.member_id = s(&self.member_id);
        let _ = self.coordinator.call(&req, v);
    }
}

/// Where one member of a run's group stands.
#[derive(Clone, Debug, PartialEq)]
enum Member {
    Joining,
    Assigned {
        generation: i32,
        partitions: Vec<i32>,
    },
    Failed(String),
}

/// Whether a run's group is ready: decided from its members alone.
#[derive(Debug, PartialEq)]
enum Readiness {
    Ready,
    /// Not yet, and why (for the error if it never is).
    Waiting(String),
    Failed(String),
}

/// The assignments of a run's consumers in one group, for waiting until every one has
/// its share before the producers start pacing: records sent while the group is still
/// joining would be charged the join (seconds) as end-to-end latency and lag.
pub struct GroupReady {
    group: String,
    partitions: usize,
    members: Mutex<Vec<Member>>,
    changed: Condvar,
}

impl GroupReady {
    /// `members` consumers of `group`, sharing `partitions` partitions.
    pub fn new(group: &str, members: usize, partitions: usize) -> Self {
        Self {
            group: group.to_string(),
            partitions,
            members: Mutex::new(vec![Member::Joining; members]),
            changed: Condvar::new(),
        }
    }

    fn set(&self, member: usize, state: Member) {
        let mut g = self.members.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = g.get_mut(member) {
            *m = state;
        }
        self.changed.notify_all();
    }

    /// Member `member` holds `partitions` in `generation` (after a join or a rejoin).
    pub fn assigned(&self, member: usize, generation: i32, partitions: &[i32]) {
        let partitions = partitions.to_vec();
        self.set(
            member,
            Member::Assigned {
                generation,
                partitions,
            },
        );
    }

    /// Member `member` could not join: the run cannot start.
    pub fn failed(&self, member: usize, why: &str) {
        self.set(member, Member::Failed(why.to_string()));
    }

    /// Returns once every member holds an assignment of one generation and together they
    /// cover every partition; an error when a member failed (to join, or it stopped or
    /// panicked before the run started), when `interrupted()` says so (looked at every
    /// [`INTERRUPT_CHECK`]) or when `timeout` passes.
    pub fn wait(&self, timeout: Duration, interrupted: impl Fn() -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut g = self.members.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded by the deadline: every turn waits INTERRUPT_CHECK at most.
        loop {
            let why = match readiness(&g, self.partitions) {
                Readiness::Ready => return Ok(()),
                Readiness::Failed(why) => bail!("consumer group {}: {why}", self.group),
                Readiness::Waiting(why) => why,
            };
            if interrupted() {
                bail!(
                    "consumer group {}: interrupted while waiting for every consumer's \
                     assignment ({why}); the run did not start",
                    self.group
                );
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "consumer group {}: not every consumer had its assignment after {:.0} s \
                     ({why}); the run did not start",
                    self.group,
                    timeout.as_secs_f64()
                );
            }
            g = self
                .changed
                .wait_timeout(g, left.min(INTERRUPT_CHECK))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Ready when every member is assigned in one generation (so the leader assigned among
/// all of them) and the assignments cover every partition (none held by a member that
/// is not one of ours, e.g. left over from an earlier run).
fn readiness(members: &[Member], partitions: usize) -> Readiness {
    let mut generations = BTreeSet::new();
    let mut covered = BTreeSet::new();
    let mut joining = 0;
    for m in members {
        match m {
            Member::Joining => joining += 1,
            Member::Failed(why) => return Readiness::Failed(why.clone()),
            Member::Assigned {
                generation,
                partitions,
            } => {
                generations.insert(*generation);
                covered.extend(partitions.iter().copied());
            }
        }
    }
    if joining > 0 {
        return Readiness::Waiting(format!("{joining} of {} still joining", members.len()));
    }
    if generations.len() > 1 {
        return Readiness::Waiting(format!("members in generations {generations:?}"));
    }
    let missing = (0..partitions as i32)
        .filter(|p| !covered.contains(p))
        .count();
    if missing > 0 {
        return Readiness::Waiting(format!(
            "{missing} partition(s) assigned to no consumer of this run"
        ));
    }
    Readiness::Ready
}

fn find_coordinator(cluster: &Cluster, group: &str) -> Result<Conn> {
    let mut last = anyhow!("no brokers");
    for _ in 0..JOIN_ATTEMPTS_MAX {
        for addr in cluster.brokers.values() {
            match find_via(addr, group) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        std::thread::sleep(JOIN_RETRY_PAUSE);
    }
    Err(last)
}

fn find_via(addr: &str, group: &str) -> Result<Conn> {
    let mut c = Conn::connect(addr)?;
    let v = c.versions.pick(api::FIND_COORDINATOR, 0, 3)?;
    let mut req = FindCoordinatorRequest::default();
    req.key = s(group);
    req.key_type = 0;
    let resp = c.call(&req, v)?;
    if resp.error_code != 0 {
        bail!("FindCoordinator: {}", error_name(resp.error_code));
    }
    Conn::connect(&format!("{}:{}", resp.host.as_str(), resp.port))
}

/// The consumer protocol's framing: an i16 version, then the struct at that version.
fn versioned<T: Encodable>(value: &T, version: i16) -> Result<Bytes> {
    let mut b = BytesMut::new();
    b.put_i16(version);
    value.encode(&mut b, version)?;
    Ok(b.freeze())
}

/// Partition p goes to the (p mod n)-th member, members sorted by id.
fn assign(topic: &str, partitions: usize, members: &[String]) -> Result<Vec<(String, Bytes)>> {
    let mut sorted = members.to_vec();
    sorted.sort();
    sorted.dedup();
    if sorted.is_empty() {
        bail!("leader got no members");
    }
    let n = sorted.len();
    sorted
        .iter()
        .enumerate()
        .map(|(k, m)| {
            let mut tp = AssignedTopic::default();
            tp.topic = TopicName(s(topic));
            tp.partitions = (0..partitions)
                .filter(|p| p % n == k)
                .map(|p| p as i32)
                .collect();
            let mut a = ConsumerProtocolAssignment::default();
            a.assigned_partitions = vec![tp];
            Ok((m.clone(), versioned(&a, 0)?))
        })
        .collect()
}

fn decode_assignment(topic: &str, bytes: Bytes) -> Result<Vec<i32>> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut b = bytes;
    if b.remaining() < 2 {
        bail!("assignment too short");
    }
    // Newer assignment versions only add fields at the end; read what we know.
    let version = b.get_i16().clamp(0, 3);
    let a = ConsumerProtocolAssignment::decode(&mut b, version)?;
    Ok(a.assigned_partitions
        .into_iter()
        .filter(|t| t.topic.0.as_str() == topic)
        .flat_map(|t| t.partitions)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The producers wait for the group: every member assigned, in one generation,
    /// every partition covered; a member that failed to join ends the wait at once.
    #[test]
    fn a_group_is_ready_when_every_member_holds_one_generations_assignment() {
        let assigned = |generation, partitions: &[i32]| Member::Assigned {
            generation,
            partitions: partitions.to_vec(),
        };
        let ready = |m: &[Member]| readiness(m, 4);
        assert!(matches!(
            ready(&[assigned(1, &[0, 1, 2, 3]), Member::Joining]),
            Readiness::Waiting(_)
        ));
        // The first member got everything alone; the second's join started generation 2.
        assert!(matches!(
            ready(&[assigned(1, &[0, 1, 2, 3]), assigned(2, &[1, 3])]),
            Readiness::Waiting(_)
        ));
        assert!(matches!(
            ready(&[assigned(2, &[0]), assigned(2, &[1, 3])]),
            Readiness::Waiting(w) if w.contains("1 partition")
        ));
        assert_eq!(
            ready(&[assigned(2, &[0, 2]), assigned(2, &[1, 3])]),
            Readiness::Ready
        );
        // More consumers than partitions: an empty share is a share.
        assert_eq!(
            ready(&[assigned(3, &[0, 1, 2, 3]), assigned(3, &[])]),
            Readiness::Ready
        );
        assert!(matches!(
            ready(&[assigned(2, &[0, 1, 2, 3]), Member::Failed("x".into())]),
            Readiness::Failed(_)
        ));
    }

    #[test]
    fn waiting_for_a_group_ends_when_it_is_ready_fails_or_times_out() {
        let g = std::sync::Arc::new(GroupReady::new("g", 2, 2));
        let g2 = g.clone();
        let joiner = std::thread::spawn(move || {
            g2.assigned(0, 1, &[0]);
            g2.assigned(1, 1, &[1]);
        });
        g.wait(Duration::from_secs(60), || false)
            .expect("ready once both are assigned");
        joiner.join().expect("joiner");
        let g = GroupReady::new("g", 2, 2);
        g.assigned(0, 1, &[0, 1]);
        let started = Instant::now();
        let e = g
            .wait(Duration::from_millis(100), || false)
            .expect_err("one never joins");
        assert!(format!("{e:#}").contains("1 of 2 still joining"), "{e:#}");
        assert!(started.elapsed() >= Duration::from_millis(100));
        g.failed(1, "could not join group g after 20 attempts");
        let e = g
            .wait(Duration::from_secs(60), || false)
            .expect_err("a member failed");
        assert!(format!("{e:#}").contains("after 20 attempts"), "{e:#}");
    }

    /// An interrupt (Ctrl-C) ends the wait for a group that is still joining within about
    /// one INTERRUPT_CHECK, not at the 60 s timeout, and says it was interrupted.
    #[test]
    fn an_interrupt_ends_the_wait_for_a_group() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let g = Arc::new(GroupReady::new("g", 2, 2));
        let flag = Arc::new(AtomicBool::new(false));
        let (g2, f2) = (g.clone(), flag.clone());
        let started = Instant::now();
        let waiter = std::thread::spawn(move || {
            g2.wait(Duration::from_secs(60), || f2.load(Ordering::SeqCst))
        });
        flag.store(true, Ordering::SeqCst);
        let e = waiter
            .join()
            .expect("the waiter")
            .expect_err("interrupted before anyone joined");
        assert!(format!("{e:#}").contains("interrupted"), "{e:#}");
        assert!(format!("{e:#}").contains("2 of 2 still joining"), "{e:#}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ended by the interrupt, not the timeout: {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn round_robin_assignment_covers_every_partition_once() {
        let members = vec!["b".to_string(), "a".to_string(), "c".to_string()];
        let a = assign("t", 8, &members).unwrap();
        let mut all = Vec::new();
        for (m, bytes) in a {
            let parts = decode_assignment("t", bytes).unwrap();
            if m == "a" {
                assert_eq!(parts, vec![0, 3, 6]);
            }
            all.extend(parts);
        }
        all.sort();
        assert_eq!(all, (0..8).collect::<Vec<i32>>());
    }
}
