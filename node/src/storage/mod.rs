//! The partition log on direct I/O: Kafka's segmented log format, written through glommio
//! `DmaFile`s (O_DIRECT, io_uring), recovered after crashes, trimmed by retention.
//!
//! # How the broker uses it
//!
//! ```text
//! storage::prime_dma_probe(&data_dir).await?;          // once per shard, before any log
//! let log = Rc::new(Log::open(dir, LogConfig::from_pairs(topic_cfg)?).await?);
//! let info = log.append(records, leader_epoch, now_ms).await?;   // from any task
//! let read = log.read(offset, max_bytes, high_watermark).await?;
//! log.close().await?;                                   // writes the clean-shutdown marker
//! ```
//!
//! # Ownership and concurrency
//!
//! A [`Log`] belongs to the shard (glommio executor thread) that opened it; it is `!Send`
//! and every method takes `&self`, so share it between that shard's tasks as `Rc<Log>`.
//! Interior state sits in a `RefCell` that is never held across an `.await`.
//!
//! Offsets are assigned synchronously, during the first poll of [`Log::append`], before
//! it awaits anything: appends are ordered exactly as the calls are made. So the broker
//! can check producer sequences and call `append` without an await in between, and the
//! order it checked is the order in the log. Each append then waits until its bytes are
//! written to the segment file (the DMA write completed, so a process crash cannot lose
//! them, like Kafka's page-cache write), and, with `log.flush.on.ack`, until an
//! fdatasync covers them. Writes and syncs are done by one detached I/O task at a time,
//! for everything pending when it starts: concurrent appends share one write and one
//! fdatasync (group commit); [`Log::counters`] shows the sharing. Because that task holds
//! its own `Rc` of the log, dropping an `append` future midway (a client disconnects)
//! never abandons a write: the batch was given its offsets and is written anyway.
//!
//! `truncate_to`, `delete_records_before`, `apply_retention`, `close` and `delete` do
//! their disk work in the caller's future: await them to completion (replica fetchers
//! and the log manager call them, not client connections).
//!
//! # Files
//!
//! See `README.md` beside this file for the on-disk format and the recovery table.

mod atomic;
mod cache;
mod checkpoint;
pub mod cleaner;
mod config;
pub mod dump;
pub mod epochs;
mod error;
pub mod file;
mod gate;
pub mod hw_checkpoint;
mod index;
mod index_cache;
mod log;
mod maintenance;
mod open;
mod probe;
mod read;
mod readahead;
pub mod reclaim;
pub use reclaim::retired_files_handed_over;
mod recovery;
mod segment;
mod shared_read;
#[doc(hidden)]
pub mod testing;
pub mod txn_index;
mod writer;

pub use atomic::{replace_unsynced, sync_dir, write_atomic, write_atomic_synced_later};
pub use cache::{
    SHARD_CACHE_BYTES_DEFAULT, node_cache_bytes_default as node_tail_cache_bytes_default,
    set_shard_cache_budget, shard_cached_bytes,
};
pub use cleaner::{CleanBounds, CleanStats, CleanerBudget, keyless_records};
pub use config::{CleanupPolicy, LogConfig, MESSAGE_TIMESTAMP_AFTER_MAX_MS_DEFAULT};
pub use error::{Result, StorageError};
pub use file::{Disk, FaultKind, FaultPoint, SimDisk};
pub use index::{OffsetIndexEntry, TimeIndexEntry};
pub use index_cache::{
    INDEX_CACHE_BYTES_DEFAULT, INDEX_CACHE_SHARD_BYTES_MIN, IndexCacheStats,
    set_shard_index_cache_bytes, shard_index_cache_stats,
};
pub use log::{AppendInfo, Log, LogCounters, NO_SPACE_RETRY_BACKOFF, ReadResult};
pub use probe::prime_dma_probe;
pub use readahead::{SHARD_READ_AHEAD_BYTES_MAX, shard_read_ahead_bytes};
pub use txn_index::{AbortedTxn, TxnIndex};

/// A byte position inside one segment file. Kafka's index stores it as 4 bytes, so a
/// segment is never larger than `i32::MAX` bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FilePosition(pub u32);

impl FilePosition {
    /// The position as a file offset for I/O calls.
    pub const fn get(self) -> u64 {
        self.0 as u64
    }
}

impl std::fmt::Display for FilePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// File name of the segment starting at `base`: Kafka's `%020d` plus an extension.
pub fn segment_file_name(base: wire::Offset, extension: &str) -> String {
    format!("{:020}.{extension}", base.get())
}

/// Where unit tests make their temporary directories: under the target dir, on the real
/// disk (never tmpfs, where O_DIRECT behaves differently).
#[cfg(test)]
pub(crate) fn test_dir_root() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
    let _ = std::fs::create_dir_all(&root);
    root
}
