//! Record batch v2 (magic 2): the unit Kafka producers send, brokers store and consumers
//! fetch. weir keeps batches exactly as received; it only patches `baseOffset` and
//! `partitionLeaderEpoch` in place, which the CRC does not cover.

pub mod header;

pub use header::{
    Attributes, BATCH_HEADER_SIZE, BatchHeader, BatchView, Compression, LOG_OVERHEAD, MAGIC_V2,
    TimestampType, assign_offsets, read_header, split_batches, validate_batch,
};
