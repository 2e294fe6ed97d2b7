//! `wire` — the Kafka wire protocol as weir speaks it.
//!
//! Pure functions over bytes: no sockets, no runtime, no disk. The broker (`node`) uses it
//! to read requests and write responses, the load generator (`loadgen`) to be a client, and
//! the tests to craft exact bytes.
//!
//! - [`types`]: newtypes for the numbers Kafka gives meaning to (offsets, epochs, ...).
//! - [`error`]: [`WireError`], which says where and why decoding failed.
//! - [`batch`]: record batch v2 — the 61-byte header as a zero-copy view, validation
//!   (sizes, magic, CRC-32C), in-place offset assignment.

pub mod batch;
pub mod error;
pub mod types;

pub use error::WireError;
pub use types::{LeaderEpoch, Offset, ProducerEpoch, ProducerId, Sequence};
