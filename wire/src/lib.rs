//! `wire` — the Kafka wire protocol as weir speaks it.
//!
//! Pure functions over bytes: no sockets, no runtime, no disk. The broker (`node`) uses it
//! to read requests and write responses, the load generator (`loadgen`) to be a client, and
//! the tests to craft exact bytes.
//!
//! - [`types`]: newtypes for the numbers Kafka gives meaning to (offsets, epochs, ...).
//! - [`error`]: [`WireError`], which says where and why decoding failed.
//! - [`frame`]: the 4-byte size prefix, request headers v0–v2, response headers v0–v1.
//! - [`api`]: the API table — keys, advertised version ranges, flexible versions,
//!   ApiVersions responses (including the KIP-511 fallback).
//! - [`messages`]: every other message body through the `kafka-protocol` crate, both
//!   directions (broker: decode requests, encode responses; client: the reverse).
//! - [`produce`]: the Produce request, hand-parsed: records stay slices of the request buffer.
//! - [`fetch`]: the Fetch response, hand-encoded as chunks (headers + untouched record slices).
//! - [`codec`]: bounds-checked primitive readers/writers (integers, varints, strings).
//! - [`batch`]: record batch v2 — the 61-byte header as a zero-copy view, validation
//!   (sizes, magic, CRC-32C), in-place offset assignment.
//! - [`scram`]: SASL/SCRAM-SHA-256/512 messages (KIP-84), both sides of the exchange: the
//!   broker authenticates with it, weir's replication client and `weir-loadgen` log in.
//! - [`sasl`]: the client's SASL login (PLAIN or SCRAM) as a state machine without I/O,
//!   shared by weir's three clients.

pub mod api;
pub mod batch;
pub mod codec;
pub mod error;
pub mod fetch;
pub mod frame;
pub mod messages;
pub mod produce;
pub mod sasl;
pub mod scram;
pub mod types;

/// Re-exported so that users name the same `Bytes` type wire hands out.
pub use bytes;
pub use error::WireError;
pub use types::{BrokerEpoch, LeaderEpoch, NodeId, Offset, ProducerEpoch, ProducerId, Sequence};
