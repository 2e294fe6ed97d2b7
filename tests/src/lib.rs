//! Helpers for weir's end-to-end tests: start a real `weir` process on an ephemeral port
//! in a temporary data dir on the real disk, talk to it with real clients, and stop it.
//!
//! - [`certs`]: a CA and server/client certificates made with the openssl CLI.
//! - [`broker`]: the `weir serve` process — start, wait for ready, SIGTERM/SIGKILL,
//!   restart on the same data dir, RSS; always killed on drop.
//! - [`cluster`]: several weir processes forming one cluster (controller quorum), and a
//!   canonical dump of a node's Metadata to compare nodes by.
//! - [`disk`]: what reached the data dir (record batches in segment files).
//! - [`raw`]: a blocking Kafka client over a bare `TcpStream`, for exact bytes (bad input).
//! - [`fuzz`]: a mutation fuzzer over TCP seeded with captured client requests.
//! - [`proxy`]: a TCP fault proxy (pass / blackhole / refuse, per Kafka client id).
//! - [`clients`]: librdkafka (the `rdkafka` crate) producers, consumers and admin calls
//!   configured for a weir under test, with bounded waits.
//! - [`fetch_tap`]: a recording proxy that decodes every Fetch exchange (KIP-227 session
//!   id and epoch, partitions listed and answered) between real clients and a broker.
//! - [`peer_security`]: what the node-to-node TLS/SASL tests share (a PKI and keystore,
//!   TLS config keys, bounded waits for registration and log lines).
//! - [`process`]: a short-lived child process (client script, `weir` command) run with a
//!   time limit, its stdout and stderr read as it runs.

pub mod broker;
pub mod certs;
pub mod clients;
pub mod cluster;
pub mod disk;
pub mod fetch_tap;
pub mod fuzz;
pub mod peer_security;
pub mod process;
pub mod proxy;
pub mod raw;

pub use broker::{Weir, WeirConfig};
