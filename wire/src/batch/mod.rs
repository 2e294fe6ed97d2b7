//! Record batch v2 (magic 2): the unit Kafka producers send, brokers store and consumers
//! fetch. weir keeps batches as received, patching only `baseOffset` and
//! `partitionLeaderEpoch` in place, which the CRC does not cover — unless the topic's
//! `compression.type` names another codec than the batch's ([`recompress`]).
//!
//! - [`header`]: the 61-byte header view, validation, offset assignment.
//! - [`records`]: the records inside a batch, decoded lazily as zero-copy slices.
//! - [`compression`]: gzip / snappy / lz4 / zstd with Kafka's framing, bounded output.
//! - [`recompress`]: a batch rewritten with another codec, all else kept.
//! - [`builder`]: building batches (load generator, tests).

pub mod builder;
pub mod compression;
pub mod header;
pub mod recompress;
pub mod records;

pub use builder::{BatchBuilder, NewRecord, control_batch};
pub use compression::{Levels, SnappyFraming, compress, compress_into, decompress};
pub use header::{
    Attributes, BATCH_HEADER_SIZE, BatchHeader, BatchView, Compression, LOG_OVERHEAD, MAGIC_V2,
    MIN_RECORD_SIZE, PRODUCED_DECOMPRESSED_BYTES_DEFAULT, TimestampType, assign_offsets,
    check_produced_batch, check_produced_header, read_header, split_batches, validate_batch,
    walk_produced_batch, walk_produced_records,
};
pub use records::{
    Record, RecordHeader, RecordIter, RecordRef, batch_records, records_section,
    uncompressed_records, walk_batch, walk_records,
};
