//! weir's broker: shards, network, storage, partitions, coordinators, config, admin CLI.
//!
//! - [`storage`] (planned): the segmented partition log on direct I/O.
