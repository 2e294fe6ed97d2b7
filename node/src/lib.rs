//! weir's broker: shards, network, storage, partitions, coordinators, config, admin CLI.
//!
//! How the parts fit: [`server`] starts one pinned glommio executor per [`shard`]; each
//! accepts connections ([`server::conn`]), parses frames ([`proto`]) and runs the [`api`]
//! handlers. Work for a partition goes to the shard that owns it ([`router`]) over bounded
//! channel meshes; there a [`partition`] wraps the [`storage`] log. Topics live in the
//! persisted [`metadata`] catalogue; [`config`] reads Kafka-style properties.
//!
//! - [`storage`]: the segmented partition log on direct I/O.
pub mod admin_cli;
pub mod api;
pub mod config;
pub mod controller;
pub mod coordinator;
pub mod errors;
pub mod event;
pub mod group;
pub mod log_limit;
pub mod metadata;
pub mod metrics;
pub mod partition;
pub mod producer_state;
pub mod proto;
pub mod replication;
pub mod resolve;
pub mod router;
pub mod security;
pub mod send_turns;
pub mod server;
pub mod shard;
pub mod storage;
pub mod txn;
