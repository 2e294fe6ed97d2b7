//! Record batch v2 (magic 2): the unit Kafka producers send, brokers store and consumers
//! fetch. weir keeps batches exactly as received; it only patches `baseOffset` and
//! `partitionLeaderEpoch` in place, which the CRC does not cover.
//!
//! - [`header`]: the 61-byte header view, validation, offset assignment.
//! - [`records`]: the records inside a batch, decoded lazily as zero-copy slices.
//! - [`compression`]: gzip / snappy / lz4 / zstd with Kafka's framing, bounded output.
//! - [`builder`]: building batches (load generator, tests).

pub mod builder;
pub mod compression;
pub mod header;
pub mod records;

pub use builder::{BatchBuilder, NewRecord, control_batch};
pub use compression::{SnappyFraming, compress, decompress};
pub use header::{
    Attributes, BATCH_HEADER_SIZE, BatchHeader, BatchView, Compression, LOG_OVERHEAD, MAGIC_V2,
    MIN_RECORD_SIZE, PRODUCED_DECOMPRESSED_BYTES_DEFAULT, TimestampType, assign_offsets,
    check_produced_batch, read_header, split_batches, validate_batch, walk_produced_batch,
};
pub use records::{
    Record, RecordHeader, RecordIter, RecordRef, batch_records, records_section, walk_batch,
    walk_records,
};
