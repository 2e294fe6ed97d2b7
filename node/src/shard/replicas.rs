//! The shard's side of replication: applying a committed [`Assignment`] to one of its
//! partitions (become leader, follower or offline) and keeping its replication fetchers
//! — one per source node — following exactly the partitions it follows; and, for the
//! partitions it leads, the ISR each should have now (`replica.lag.time.max.ms`), for the
//! controller to commit.

use std::net::SocketAddr;
use std::rc::Rc;

use wire::NodeId;

use super::{Shard, TopicPartition, now_ms};
use crate::partition::Partition;
use crate::partition::replica::{Assignment, RoleChange};
use crate::replication::{FetcherConfig, ReplicaFetcher};

/// An ISR change a leader asks the controller for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsrProposal {
    pub tp: TopicPartition,
    /// The partition epoch the proposal is based on (the controller refuses stale ones).
    pub partition_epoch: i32,
    pub isr: Vec<NodeId>,
}

impl Shard {
    /// Applies `assignment` to the open replica `p` of `tp`; `leader_addr` is where the
    /// leader takes fetches when it is another node.
    pub fn apply_assignment(
        self: &Rc<Self>,
        tp: &TopicPartition,
        p: &Rc<Partition>,
        assignment: &Assignment,
        leader_addr: Option<SocketAddr>,
    ) {
        let mut change = RoleChange::Unchanged;
        p.update_replica(|r| change = r.apply(assignment, now_ms()));
        match change {
            RoleChange::Unchanged => {}
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
    fn unfollow(&self, tp: &TopicPartition) {
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
    fn fetcher_for(&self, source: NodeId, addr: SocketAddr) -> Rc<ReplicaFetcher> {
        if let Some(f) = self.fetchers.borrow().get(&source) {
            return f.clone();
        }
        let config = fetcher_config(self.config());
        let f = ReplicaFetcher::new(self.node_id(), source, addr, config);
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
        let parts = self.partitions.borrow();
        parts
            .iter()
            .filter_map(|(tp, p)| {
                let r = p.replica();
                let isr = r.wanted_isr(now, lag_max_ms)?;
                Some(IsrProposal {
                    tp: tp.clone(),
                    partition_epoch: r.partition_epoch(),
                    isr,
                })
            })
            .collect()
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
