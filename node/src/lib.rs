//! weir's broker: shards, network, storage, partitions, coordinators, config, admin CLI.
//!
//! - [`storage`]: the segmented partition log on direct I/O.
pub mod storage;
pub mod producer_state;
