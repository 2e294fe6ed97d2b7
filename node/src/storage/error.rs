//! [`StorageError`]: every way a partition log operation fails, naming the file and where.

use std::path::PathBuf;

use wire::Offset;

/// A storage failure. I/O errors carry the operation and path so that one log line is
/// enough to find the fault; corruption carries the file and byte position.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An operating-system I/O call failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Data on disk is damaged in a way that is not a torn tail: the log refuses to open
    /// rather than drop data silently.
    #[error("corrupt log {path} at byte {position}: {reason}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// A read asked for an offset outside `[log_start_offset, log_end_offset]`.
    #[error("offset {requested} out of range [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        requested: Offset,
        log_start: Offset,
        log_end: Offset,
    },
    /// The records blob given to `append` is not a sequence of whole v2 batches.
    #[error("invalid record batch at byte {position} of the appended blob: {reason}")]
    InvalidBatch { position: usize, reason: String },
    /// The records blob is larger than one segment may hold.
    #[error("record set of {size} bytes exceeds the segment size {max}")]
    RecordSetTooLarge { size: u64, max: u64 },
    /// A leader's append whose batches declare more offsets (`lastOffsetDelta`s) than one
    /// segment can index (2^31, the index's 4-byte relative offset): no roll makes it
    /// fit. A producer's batch declaring that many records is bogus: INVALID_RECORD.
    #[error("record set spans {offsets} offsets; one segment holds at most {max}")]
    OffsetSpanTooLarge { offsets: i64, max: i64 },
    /// A configuration key holds a value that cannot be used.
    #[error("config {key}={value}: {reason}")]
    Config {
        key: String,
        value: String,
        reason: &'static str,
    },
    /// An earlier write or sync failed; the log accepts no more writes (like Kafka marking
    /// a log dir offline) until it is reopened.
    #[error("log {path} failed earlier and is read-only: {reason}")]
    Failed { path: PathBuf, reason: String },
    /// The log's filesystem ran out of space (ENOSPC/EDQUOT) on an earlier write: the
    /// appends not yet written were rolled back (their callers got the error) and the log
    /// refuses writes until `retry_in_ms` has passed, then tries again.
    #[error("log {path} is out of disk space; writes are retried in {retry_in_ms} ms")]
    NoSpace { path: PathBuf, retry_in_ms: u64 },
    /// An append under leader epoch `epoch` after an out-of-space rollback cut offsets
    /// that reads for replicas had been served (up to `served_end`; the log now ends at
    /// `log_end`): a replica may hold other batches at those offsets under that epoch, so
    /// only a newer leader epoch may append there. The broker answers
    /// NOT_LEADER_OR_FOLLOWER and asks the controller for a new epoch.
    #[error(
        "log {path}: offsets up to {served_end} were served to replicas and rolled back (log end {log_end}); no appends under leader epoch {epoch} until a newer one"
    )]
    ServedRolledBack {
        path: PathBuf,
        epoch: wire::LeaderEpoch,
        served_end: Offset,
        log_end: Offset,
    },
    /// An append while a follower's truncation holds the log: the log end it would be
    /// appended at is being cut. The broker answers NOT_LEADER_OR_FOLLOWER (the replica
    /// was a follower when the truncation began).
    #[error("log {path} is being truncated; appends are refused until it ends")]
    Truncating { path: PathBuf },
    /// The log was closed.
    #[error("log {path} is closed")]
    Closed { path: PathBuf },
}

impl StorageError {
    /// Wraps an I/O error with the operation and path it came from.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Wraps a glommio error (converted to `io::Error`) with operation and path.
    pub fn glommio<T>(
        op: &'static str,
        path: impl Into<PathBuf>,
        source: glommio::GlommioError<T>,
    ) -> Self {
        StorageError::io(op, path, source.into())
    }
}

impl StorageError {
    /// Whether this is a write that failed for lack of space (ENOSPC, EDQUOT), or the log
    /// refusing writes after one: the log recovers from it once space is back. A failed fdatasync never is: after it the
    /// kernel may have dropped the dirty data, so what is on disk is unknown.
    pub fn is_out_of_space(&self) -> bool {
        let (op, source) = match self {
            StorageError::NoSpace { .. } => return true,
            StorageError::Io { op, source, .. } => (op, source),
            _ => return false,
        };
        if *op == "fdatasync" || *op == "fsync" || *op == "fsync dir" {
            return false;
        }
        matches!(
            source.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        ) || matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
    }
}

/// Result of storage operations.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;
