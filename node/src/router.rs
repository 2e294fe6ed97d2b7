//! The partition→shard table: which shard owns each partition replica.
//!
//! Ownership is a pure function of (topic name, partition, shard count), so every shard
//! computes the same answer without coordination and the answer is stable across restarts
//! with the same `--shards`. The table carries a revision; every cross-shard message carries
//! the revision it was routed with, and the receiver refuses a message routed under a
//! different revision (a future rebalance bumps it).

use std::fmt;

/// A shard's index, `0..shards`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(pub usize);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The routing table's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteRevision(pub u64);

/// Maps partitions to their owning shard.
#[derive(Clone, Debug)]
pub struct Router {
    shards: usize,
    revision: RouteRevision,
}

impl Router {
    pub fn new(shards: usize) -> Router {
        assert!(shards >= 1, "a node has at least one shard");
        Router {
            shards,
            revision: RouteRevision(1),
        }
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    pub fn revision(&self) -> RouteRevision {
        self.revision
    }

    /// The shard owning `topic`/`partition`. Consecutive partitions of one topic land on
    /// consecutive shards, so a topic's partitions spread evenly.
    pub fn owner(&self, topic: &str, partition: i32) -> ShardId {
        let base = fnv1a(topic.as_bytes());
        let p = u64::from(partition.unsigned_abs());
        ShardId((base.wrapping_add(p) % self.shards as u64) as usize)
    }
}

/// FNV-1a: stable across processes and Rust versions (unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_spread_over_all_shards() {
        let r = Router::new(2);
        let owners: Vec<_> = (0..4).map(|p| r.owner("orders", p)).collect();
        assert_ne!(owners[0], owners[1]);
        assert_eq!(owners[0], owners[2]);
        assert_eq!(Router::new(1).owner("orders", 7), ShardId(0));
        assert_eq!(r.owner("orders", 3), Router::new(2).owner("orders", 3));
    }
}
