//! Replication: followers copy their leaders by fetching (ISR, HW and epochs live in
//! `partition::replica`; the leader's side of a follower's Fetch is `partition::read`).
//!
//! - [`client`]: a broker's own connection to another broker (glommio, bounded, deadlines).
//! - [`fetcher`]: one replication fetcher per (shard, source node): one Fetch with this
//!   node's `replica_id` for every partition the shard follows from that node; appends
//!   keeping the leader's offsets, learns the HW, truncates by epoch (KIP-320).
//!
//! Who follows whom comes from the cluster metadata (the controller, `shard::replicas`);
//! a single node follows nobody.

pub mod client;
pub mod fetcher;

pub use fetcher::{FetcherConfig, ReplicaFetcher, RoundStats};
