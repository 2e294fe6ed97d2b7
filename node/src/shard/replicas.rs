//! The shard's side of replication: applying a committed [`Assignment`] to one of its
//! partitions (become leader, follower or offline) and keeping its replication fetchers
//! — one per source node — following exactly the partitions it follows; and, for the
//! partitions it leads, the ISR each should have now (`replica.lag.time.max.ms`), for the
//! controller to commit.

use std::rc::Rc;
use std::sync::Arc;

use wire::{LeaderEpoch, NodeId};

use super::{Shard, TopicPartition, now_ms};
use crate::metadata::{Catalog, PartitionAssignment, TopicMeta};
use crate::partition::Partition;
use crate::partition::replica::{Assignment, RoleChange};
use crate::replication::{FetcherConfig, ReplicaFetcher};

/// An ISR change a leader asks the controller for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsrProposal {
    pub tp: TopicPartition,
    pub topic_id: u128,
    pub leader_epoch: LeaderEpoch,
    /// The partition epoch the proposal is based on (the controller refuses stale ones).
    pub partition_epoch: i32,
    pub isr: Vec<NodeId>,
    /// The broker epochs of the members' processes whose fetches the leader counted.
    pub epochs: Vec<(NodeId, wire::BrokerEpoch)>,
    /// The leader's view when it wanted the change, for the log line (Kafka's "Shrinking
    /// ISR" line names the same): its HW and LEO, each follower's LEO and how long ago
    /// its fetches last reached the leader's end.
    pub why: String,
}

/// Whether `node` holds a replica of partition `index` of `meta`: always on a single node
/// (no assignment), else when the assignment names it.
pub fn hosted_here(meta: &TopicMeta, index: i32, node: NodeId) -> bool {
    let Some(a) = usize::try_from(index)
        .ok()
        .and_then(|i| meta.assignment.get(i))
    else {
        return meta.assignment.is_empty();
    };
    a.replicas.contains(&node.get())
}

/// The leader epoch under which `node` will append to partition `index` of `meta` if it
/// leads it: the sole leader's epoch on a single node (no assignment), else the
/// assignment's epoch when it names `node` leader; `None` for a follower or an offline
/// partition. A new log's epoch checkpoint is written with it off the shard's thread
/// (`partition::OpenWith`); if the assignment changed meanwhile, the epoch it then
/// leads under is noted as usual, at its first append.
pub fn lead_epoch_here(meta: &TopicMeta, index: i32, node: NodeId) -> Option<LeaderEpoch> {
    let Some(a) = usize::try_from(index)
        .ok()
        .and_then(|i| meta.assignment.get(i))
    else {
        return meta
            .assignment
            .is_empty()
            .then_some(crate::partition::replica::SOLE_LEADER_EPOCH);
    };
    (a.leader == node.get()).then_some(LeaderEpoch(a.leader_epoch))
}

/// The catalogue's record, in the replica layer's types.
fn assignment(a: &PartitionAssignment) -> Assignment {
    let nodes = |v: &[i32]| v.iter().copied().map(NodeId).collect::<Vec<_>>();
    Assignment {
        replicas: nodes(&a.replicas),
        leader: (a.leader >= 0).then_some(NodeId(a.leader)),
        leader_epoch: LeaderEpoch(a.leader_epoch),
        isr: nodes(&a.isr),
        partition_epoch: a.partition_epoch,
    }
}

/// Where `node` takes fetches: its registered (advertised) host and port. The host is
/// resolved by the fetcher when it connects, off the shard's thread.
fn node_addr(catalog: &Catalog, node: NodeId) -> Option<NodeAddr> {
    let n = catalog.nodes.get(&node.get())?;
    Some(NodeAddr {
        host: n.host.clone(),
        port: n.port,
    })
}

/// A node's registered host (a name or an IP literal) and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddr {
    pub host: String,
    pub port: u16,
}

impl Shard {
    /// Opens every partition this shard owns and this node replicates (a follower must
    /// fetch whether or not a client ever asks for it), and applies its assignment.
    pub async fn apply_assignments(&self) {
        let catalog = self.catalog();
        let local = self.node_id();
        for (name, meta) in catalog
            .topics
            .iter()
            .filter(|(_, t)| !t.assignment.is_empty())
        {
            let topic: Arc<str> = Arc::from(name.as_str());
            for (index, a) in meta.assignment.iter().enumerate() {
                let Ok(index) = i32::try_from(index) else {
                    break;
                };
                if self.router.owner(name, index) != self.id || !a.replicas.contains(&local.get()) {
                    continue;
                }
                let tp: TopicPartition = (topic.clone(), index);
                // Opening applies the assignment too; an open one gets the newest here.
                if let Ok(p) = self.partition(&tp).await {
                    self.apply_catalog_assignment(&tp, &p);
                }
            }
        }
    }

    /// Applies the catalogue's assignment of `tp` (if it has one) to its open replica.
    pub fn apply_catalog_assignment(&self, tp: &TopicPartition, p: &Rc<Partition>) {
        let catalog = self.catalog();
        let Some(a) = catalog
            .topics
            .get(&*tp.0)
            .filter(|t| t.id == p.topic_id)
            .and_then(|t| usize::try_from(tp.1).ok().and_then(|i| t.assignment.get(i)))
        else {
            return;
        };
        let a = assignment(a);
        let addr = a.leader.and_then(|l| node_addr(&catalog, l));
        self.apply_assignment(tp, p, &a, addr);
    }

    /// Applies `assignment` to the open replica `p` of `tp`; `leader_addr` is where the
    /// leader takes fetches when it is another node.
    pub fn apply_assignment(
        &self,
        tp: &TopicPartition,
        p: &Rc<Partition>,
        assignment: &Assignment,
        leader_addr: Option<NodeAddr>,
    ) {
        let change = p.apply_assignment(assignment, now_ms());
        p.fence_if_lost();
        // A coordinator moves with its partition's leader (see `calls::run_coordinator_loads`).
        if change != RoleChange::Unchanged && crate::coordinator::is_coordinator_topic(&tp.0) {
            self.coordinator_roles.notify_all();
        }
        match change {
            RoleChange::Unchanged => {
                // Same leader, same epoch — but the leader may have restarted on another
                // address (before it was fenced): the fetcher must follow it there.
                let leader = p.replica().leader();
                if !p.replica().is_leader()
                    && leader != crate::partition::replica::NO_LEADER
                    && let Some(addr) = leader_addr
                {
                    let f = self.fetcher_for(leader, addr);
                    if !f.follows(tp) {
                        f.follow(tp.clone(), p.clone());
                    }
                }
            }
            RoleChange::Lead | RoleChange::Offline => {
                tracing::info!(topic = %tp.0, partition = tp.1, epoch = %assignment.leader_epoch, ?change, "replica role changed");
                self.unfollow(tp);
            }
            RoleChange::Follow(leader) => {
                tracing::info!(topic = %tp.0, partition = tp.1, epoch = %assignment.leader_epoch, %leader, "replica follows");
                self.unfollow(tp);
                match leader_addr {
                    Some(addr) => self.fetcher_for(leader, addr).follow(tp.clone(), p.clone()),
                    None => tracing::warn!(%leader, "no address for the leader: not fetching"),
                }
            }
        }
    }

    /// Stops following `tp` (on every fetcher); fetchers left with nothing stop.
    pub(super) fn unfollow(&self, tp: &TopicPartition) {
        let mut fetchers = self.fetchers.borrow_mut();
        for f in fetchers.values() {
            f.unfollow(tp);
        }
        fetchers.retain(|_, f| {
            let keep = !f.is_empty();
            if !keep {
                f.stop();
            }
            keep
        });
    }

    /// This shard's fetcher for `source`, started on first use.
    /// A fetcher whose source moved to another address (it restarted on a new port) is
    /// replaced by one fetching there, following the same partitions.
    fn fetcher_for(&self, source: NodeId, addr: NodeAddr) -> Rc<ReplicaFetcher> {
        let NodeAddr { host, port } = addr;
        let existing = self.fetchers.borrow().get(&source).cloned();
        let moved = match existing {
            Some(f) if f.port() == port && f.host() == host => return f,
            Some(f) => {
                tracing::info!(%source, from = %format!("{}:{}", f.host(), f.port()), to = %format!("{host}:{port}"), "replication source moved; refetching from its new address");
                f.retire()
            }
            None => Vec::new(),
        };
        let config = fetcher_config(self.config());
        let epoch = self
            .node
            .controller
            .cluster()
            .map_or(wire::BrokerEpoch::NONE, |q| q.broker_epoch());
        let f = ReplicaFetcher::new_named((self.node_id(), epoch), source, host, port, config);
        for (tp, p) in moved {
            f.follow(tp, p);
        }
        self.fetchers.borrow_mut().insert(source, f.clone());
        glommio::spawn_local(f.clone().run()).detach();
        f
    }

    /// Stops every fetcher (shutdown).
    pub fn stop_fetchers(&self) {
        for f in self.fetchers.borrow_mut().values() {
            f.stop();
        }
        self.fetchers.borrow_mut().clear();
    }

    /// For every open partition this shard leads, the ISR it should have now, where that
    /// differs from the committed one.
    pub fn isr_proposals(&self) -> Vec<IsrProposal> {
        let lag_max_ms = self.config().props.get("replica.lag.time.max.ms");
        let lag_max_ms = lag_max_ms
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(REPLICA_LAG_TIME_MAX_MS_DEFAULT);
        let now = now_ms();
        let catalog = self.catalog();
        // A follower may join if the metadata has it live under the broker epoch its
        // fetches carry (KIP-841, KIP-903).
        let eligible = |n: NodeId, fetched: wire::BrokerEpoch| {
            catalog
                .nodes
                .get(&n.get())
                .is_none_or(|node| !node.fenced && node.registered_as(fetched))
        };
        let parts = self.partitions.borrow();
        parts
            .iter()
            .filter_map(|(tp, p)| {
                // A leader whose log lost acknowledged records resigns instead: it answers
                // no fetch, so its followers only look as if they lag.
                if p.leads_without_acknowledged() {
                    return None;
                }
                let r = p.replica();
                let isr = r.wanted_isr(now, lag_max_ms, eligible)?;
                let followers: Vec<String> = r
                    .followers()
                    .map(|(n, f)| {
                        format!(
                            "{n}: end {} caught up {} ms ago",
                            f.log_end,
                            now - f.caught_up_ms
                        )
                    })
                    .collect();
                let why = format!(
                    "high watermark {}, log end {}; {}",
                    r.high_watermark(),
                    r.log_end(),
                    followers.join(", ")
                );
                Some(IsrProposal {
                    why,
                    tp: tp.clone(),
                    topic_id: p.topic_id,
                    leader_epoch: r.leader_epoch(),
                    partition_epoch: r.partition_epoch(),
                    epochs: r.joiner_epochs(&isr),
                    isr,
                })
            })
            .collect()
    }
}

impl Shard {
    /// Asks the controller for every ISR change this shard's leaders want, one request in
    /// flight per partition (a committed change comes back as a new assignment).
    pub fn propose_isr_changes(self: &Rc<Self>) {
        if self.node.controller.cluster().is_none() {
            return;
        }
        for proposal in self.isr_proposals() {
            if !self.isr_proposing.borrow_mut().insert(proposal.tp.clone()) {
                continue;
            }
            let part = self.partitions.borrow().get(&proposal.tp).cloned();
            if let Some(p) = &part {
                p.update_replica(|r| r.isr_proposed(&proposal.isr));
            }
            let shard = self.clone();
            glommio::spawn_local(async move {
                let tp = proposal.tp.clone();
                tracing::info!(topic = %tp.0, partition = tp.1, isr = ?proposal.isr, "proposing an ISR change: {}", proposal.why);
                let cmd = crate::controller::Command::AlterPartition {
                    topic: tp.0.to_string(),
                    id: proposal.topic_id,
                    partition: tp.1,
                    leader: shard.node_id().get(),
                    leader_epoch: proposal.leader_epoch.get(),
                    partition_epoch: proposal.partition_epoch,
                    isr: proposal.isr.iter().map(|n| n.get()).collect(),
                    epochs: proposal
                        .epochs
                        .iter()
                        .map(|(n, e)| (n.get(), e.get()))
                        .collect(),
                };
                let out = shard.node.controller.submit(&shard.node, cmd).await;
                let committed = matches!(out, crate::controller::Outcome::Done(Ok(_)));
                if let crate::controller::Outcome::Done(Err((code, why))) = &out {
                    tracing::info!(topic = %tp.0, partition = tp.1, code, "ISR change not applied: {why}");
                }
                // A committed change arrives as an assignment, which replaces the ISR and
                // its joiners; otherwise they stop counting for the HW here.
                if let (false, Some(p)) = (committed, &part) {
                    p.update_replica(|r| r.isr_proposal_failed());
                }
                shard.isr_proposing.borrow_mut().remove(&tp);
            })
            .detach();
        }
    }
}

impl Shard {
    /// Asks the controller for a new leader epoch for every partition this shard leads
    /// but may not append to under its epoch (an out-of-space rollback cut offsets its
    /// followers had copied: `Partition::needs_new_epoch`), one request in flight per
    /// partition; retried every tick until an assignment with a newer epoch arrives.
    /// A single node never needs one: it has no followers to serve.
    pub fn propose_resignations(self: &Rc<Self>) {
        if self.node.controller.cluster().is_none() {
            return;
        }
        let fenced: Vec<(TopicPartition, u128, LeaderEpoch, &'static str)> = self
            .partitions
            .borrow()
            .iter()
            .filter(|(_, p)| p.needs_new_epoch())
            .map(|(tp, p)| {
                let why = if p.leads_without_acknowledged() {
                    "its log reopened without records it had acknowledged"
                } else {
                    "served offsets were rolled back"
                };
                (tp.clone(), p.topic_id, p.leader_epoch(), why)
            })
            .collect();
        for (tp, topic_id, epoch, why) in fenced {
            if !self.isr_proposing.borrow_mut().insert(tp.clone()) {
                continue;
            }
            let shard = self.clone();
            glommio::spawn_local(async move {
                tracing::warn!(topic = %tp.0, partition = tp.1, %epoch, "leader resigns its epoch: {why}");
                let cmd = crate::controller::Command::ResignLeader {
                    topic: tp.0.to_string(),
                    id: topic_id,
                    partition: tp.1,
                    leader: shard.node_id().get(),
                    leader_epoch: epoch.get(),
                };
                let out = shard.node.controller.submit(&shard.node, cmd).await;
                if let crate::controller::Outcome::Done(Err((code, why))) = out {
                    tracing::info!(topic = %tp.0, partition = tp.1, code, "resignation not applied: {why}");
                }
                shard.isr_proposing.borrow_mut().remove(&tp);
            })
            .detach();
        }
    }
}

impl Shard {
    /// Whether the cluster manages `tp`'s replicas (its topic has an assignment): such a
    /// replica reopens at its checkpointed HW. A single node's partitions keep HW = LEO:
    /// their only replica had everything it acknowledged.
    pub fn is_replicated(&self, tp: &TopicPartition) -> bool {
        self.catalog()
            .topics
            .get(&*tp.0)
            .is_some_and(|t| !t.assignment.is_empty())
    }

    /// Reports the HWs of `parts` to the node's checkpoint (written by
    /// [`Shard::write_hw_checkpoint`]).
    pub fn checkpoint_high_watermarks<'a>(
        &self,
        parts: impl IntoIterator<Item = &'a Rc<Partition>>,
    ) {
        let hws = parts
            .into_iter()
            .map(|p| (p.topic.to_string(), p.index, p.checkpoint_hw()));
        self.node.hw_checkpoint.report(hws);
    }

    /// Writes `replication-offset-checkpoint` if HWs moved and the last write is older
    /// than `replica.high.watermark.checkpoint.interval.ms` (`now`: whenever one moved —
    /// shutdown). Called from the housekeeping tick, so a busy partition costs at most one
    /// small fsync'd file per interval, however often its HW moves. The write and its two
    /// fsyncs run in glommio's blocking pool: on the shard's thread they stopped every
    /// request of the shard for the length of an fsync (milliseconds to tens of them
    /// while the disk is busy), every interval.
    pub async fn write_hw_checkpoint(&self, now: bool) {
        let interval = if now {
            0
        } else {
            self.config()
                .props
                .get("replica.high.watermark.checkpoint.interval.ms")
                .and_then(|v| v.trim().parse::<i64>().ok())
                .unwrap_or(crate::storage::hw_checkpoint::INTERVAL_MS_DEFAULT)
                .max(0)
        };
        let node = self.node.clone();
        let written = glommio::executor()
            .spawn_blocking(move || node.hw_checkpoint.write_if_due(super::mono_ms(), interval))
            .await;
        if let Err(e) = written {
            tracing::warn!("high watermark checkpoint not written: {e}");
        }
    }
}

/// Kafka's `replica.lag.time.max.ms` default: a follower that has not reached the
/// leader's log end for this long leaves the ISR.
pub const REPLICA_LAG_TIME_MAX_MS_DEFAULT: i64 = 30_000;

/// The fetchers' settings from Kafka's keys.
fn fetcher_config(config: &crate::config::Config) -> FetcherConfig {
    let get = |key: &str| {
        config
            .props
            .get(key)
            .and_then(|v| v.trim().parse::<i64>().ok())
    };
    let default = FetcherConfig::default();
    FetcherConfig {
        wait_max: get("replica.fetch.wait.max.ms").map_or(default.wait_max, |ms| {
            std::time::Duration::from_millis(ms.clamp(1, 60_000) as u64)
        }),
        min_bytes: get("replica.fetch.min.bytes").map_or(default.min_bytes, |b| {
            b.clamp(1, i64::from(i32::MAX)) as i32
        }),
        partition_max_bytes: get("replica.fetch.max.bytes")
            .map_or(default.partition_max_bytes, |b| {
                b.clamp(1024, i64::from(i32::MAX)) as i32
            }),
        response_max_bytes: get("replica.fetch.response.max.bytes")
            .map_or(default.response_max_bytes, |b| {
                b.clamp(1024, i64::from(i32::MAX)) as i32
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::fetcher_config;
    use crate::config::{CliOverrides, Config, Properties};

    fn config(pairs: &[(&str, &str)]) -> Config {
        let mut p = Properties::default();
        for (k, v) in pairs {
            p.set(k, v);
        }
        Config::resolve(p, &CliOverrides::default()).expect("config")
    }

    #[test]
    fn fetchers_take_kafkas_replica_fetch_keys_and_defaults() {
        let default = fetcher_config(&config(&[]));
        assert_eq!(
            default.min_bytes, 1,
            "Kafka's default answers each append at once"
        );
        assert_eq!(default.wait_max.as_millis(), 500);
        let set = fetcher_config(&config(&[
            ("replica.fetch.min.bytes", "65536"),
            ("replica.fetch.wait.max.ms", "5"),
            ("replica.fetch.max.bytes", "2097152"),
        ]));
        assert_eq!(set.min_bytes, 65536);
        assert_eq!(set.wait_max.as_millis(), 5);
        assert_eq!(set.partition_max_bytes, 2 << 20);
        // Out of range is clamped, never zero or negative on the wire.
        assert_eq!(
            fetcher_config(&config(&[("replica.fetch.min.bytes", "-3")])).min_bytes,
            1
        );
    }
}
