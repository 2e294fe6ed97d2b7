//! [`LogConfig`]: a partition log's settings, under Kafka's own key names.

use wire::batch::TimestampType;

use super::error::{Result, StorageError};

/// Settings of one partition log. Defaults are Kafka's. Build from broker- or topic-level
/// key/value strings with [`LogConfig::set`] / [`LogConfig::from_pairs`]; both the broker
/// key (`log.segment.bytes`) and the topic key (`segment.bytes`) are accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct LogConfig {
    /// `log.segment.bytes` / `segment.bytes`: roll the active segment before it would
    /// exceed this size.
    pub segment_bytes: u64,
    /// `log.roll.ms` / `segment.ms`: roll the active segment once it is this old.
    pub segment_ms: i64,
    /// `log.index.interval.bytes` / `index.interval.bytes`: bytes of batches between two
    /// sparse index entries.
    pub index_interval_bytes: u32,
    /// `log.index.size.max.bytes` / `segment.index.bytes`: the active segment rolls
    /// before its offset index (8 bytes an entry) or time index (12) would grow past this
    /// many bytes.
    pub segment_index_bytes: u64,
    /// `log.retention.ms` / `retention.ms`: delete sealed segments whose newest timestamp
    /// (else, none carrying one, the file's last modification) is older than this; -1
    /// keeps forever.
    pub retention_ms: i64,
    /// `log.retention.bytes` / `retention.bytes`: delete the oldest sealed segments while
    /// the log is larger than this; -1 means no limit.
    pub retention_bytes: i64,
    /// `log.flush.interval.messages` / `flush.messages`: fdatasync after this many
    /// appended records.
    pub flush_interval_messages: u64,
    /// `log.flush.interval.ms` / `flush.ms`: fdatasync when the last one is this old.
    pub flush_interval_ms: i64,
    /// `log.flush.on.ack` (weir's own key): an append returns only after fdatasync;
    /// appends waiting together share one fdatasync (group commit).
    pub flush_on_ack: bool,
    /// `log.message.timestamp.type` / `message.timestamp.type`: `CreateTime` keeps the
    /// producer's timestamps, `LogAppendTime` stamps each batch with the append time.
    pub message_timestamp_type: TimestampType,
    /// `log.message.timestamp.before.max.ms` / `message.timestamp.before.max.ms`: with
    /// CreateTime, a batch with a timestamp this far before the broker's clock is refused
    /// (INVALID_TIMESTAMP). Kafka's default: no limit.
    pub message_timestamp_before_max_ms: i64,
    /// `log.message.timestamp.after.max.ms` / `message.timestamp.after.max.ms`: with
    /// CreateTime, a batch with a timestamp this far after the broker's clock is refused.
    /// Kafka 4's default, one hour: a timestamp in the far future would otherwise keep
    /// its segment, and every later one, from time-based retention.
    pub message_timestamp_after_max_ms: i64,
    /// `log.preallocate` / `preallocate`: reserve blocks ahead of the writes (fallocate,
    /// keeping the file size), growing with the segment, at most 64 MiB ahead. Kafka's
    /// default is false; weir's is true, because with O_DIRECT a write that has to
    /// allocate blocks waits for the allocation (see docs/PERFORMANCE.md "storage").
    pub preallocate: bool,
    /// `log.tail.cache.bytes` (weir's own key): recently appended batches this log keeps
    /// in memory so that fetches of recent data never touch the disk. No bound of its own
    /// by default: the shard's share of the node's `log.tail.cache.max.bytes` bounds every
    /// log's together (`cache.rs`).
    pub tail_cache_bytes: u64,
    /// `log.read.ahead.bytes` (weir's own key): a disk read that continues the previous
    /// one starts reading the next window (at most this many bytes, and at most the
    /// window it read) while its answer is sent; 0 turns read-ahead off. All logs of a
    /// shard together hold at most `SHARD_READ_AHEAD_BYTES_MAX` read ahead.
    pub read_ahead_bytes: u64,
    /// `log.cleanup.policy` / `cleanup.policy`: `delete` (retention deletes old segments),
    /// `compact` (the log cleaner keeps the latest record per key, no retention) or both.
    pub cleanup_policy: CleanupPolicy,
    /// `log.cleaner.min.cleanable.ratio` / `min.cleanable.dirty.ratio`: clean once the
    /// bytes written after the cleaner's checkpoint are this share of the sealed bytes.
    pub min_cleanable_dirty_ratio: f64,
    /// `log.cleaner.delete.retention.ms` / `delete.retention.ms`: a tombstone (null value)
    /// is kept at least this long after the cleaner first passed it.
    pub delete_retention_ms: i64,
    /// `log.cleaner.min.compaction.lag.ms` / `min.compaction.lag.ms`: a segment whose
    /// newest record is younger than this is not cleaned.
    pub min_compaction_lag_ms: i64,
    /// `log.cleaner.max.compaction.lag.ms` / `max.compaction.lag.ms`: a dirty segment whose
    /// oldest record is older than this is cleaned whatever the dirty ratio.
    pub max_compaction_lag_ms: i64,
    /// `log.segment.delete.delay.ms` / `file.delete.delay.ms`: a retired segment's file
    /// (retention, DeleteRecords, a full truncation) stays whole this long after it left
    /// the log, so reads planned on it finish, before it is cut and removed.
    pub file_delete_delay_ms: i64,
}

/// `cleanup.policy`: which of retention and compaction apply to a log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}

impl CleanupPolicy {
    /// Parses Kafka's list form: `delete`, `compact`, `compact,delete` (any order).
    pub fn parse(value: &str) -> Option<CleanupPolicy> {
        let mut policy = CleanupPolicy {
            delete: false,
            compact: false,
        };
        for part in value.split(',') {
            match part.trim() {
                "delete" => policy.delete = true,
                "compact" => policy.compact = true,
                _ => return None,
            }
        }
        Some(policy)
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            index_interval_bytes: 4096,
            segment_index_bytes: SEGMENT_INDEX_BYTES_DEFAULT,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            flush_interval_messages: i64::MAX as u64,
            flush_interval_ms: i64::MAX,
            flush_on_ack: false,
            message_timestamp_type: TimestampType::CreateTime,
            message_timestamp_before_max_ms: i64::MAX,
            message_timestamp_after_max_ms: MESSAGE_TIMESTAMP_AFTER_MAX_MS_DEFAULT,
            preallocate: true,
            tail_cache_bytes: i64::MAX as u64,
            read_ahead_bytes: 8 << 20,
            cleanup_policy: CleanupPolicy {
                delete: true,
                compact: false,
            },
            min_cleanable_dirty_ratio: 0.5,
            delete_retention_ms: 24 * 3600 * 1000,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            file_delete_delay_ms: 60_000,
        }
    }
}

/// Kafka 4's default `log.message.timestamp.after.max.ms`: one hour.
pub const MESSAGE_TIMESTAMP_AFTER_MAX_MS_DEFAULT: i64 = 3_600_000;

/// Kafka's default `segment.index.bytes`: 10 MiB.
pub const SEGMENT_INDEX_BYTES_DEFAULT: u64 = 10 << 20;
/// Kafka's lower bound for `segment.index.bytes` (an index too small for one entry rolls
/// at every append).
const SEGMENT_INDEX_BYTES_MIN: u64 = 4;

/// Smallest accepted segment size: Kafka's own lower bound for `segment.bytes`.
const SEGMENT_BYTES_MIN: u64 = 14;
/// A segment's positions are 4-byte fields in the offset index.
const SEGMENT_BYTES_MAX: u64 = i32::MAX as u64;

impl LogConfig {
    /// Defaults overlaid with `pairs`; unknown keys are ignored (they belong to other
    /// parts of the broker), bad values are an error.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self> {
        let mut config = LogConfig::default();
        for (key, value) in pairs {
            config.set(key, value)?;
        }
        Ok(config)
    }

    /// Applies one key. Returns `Ok(false)` if the key is not a log setting.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool> {
        let key_short = key.strip_prefix("log.").unwrap_or(key);
        match key_short {
            "segment.bytes" => {
                let v: u64 = parse(key, value)?;
                if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&v) {
                    return Err(bad(key, value, "must be between 14 and 2147483647"));
                }
                self.segment_bytes = v;
            }
            "roll.ms" | "segment.ms" => self.segment_ms = positive(key, value)?,
            "roll.hours" => self.segment_ms = positive::<i64>(key, value)? * 3_600_000,
            "index.interval.bytes" => {
                self.index_interval_bytes = parse(key, value)?;
            }
            "index.size.max.bytes" | "segment.index.bytes" => {
                let v: u64 = parse(key, value)?;
                if !(SEGMENT_INDEX_BYTES_MIN..=i32::MAX as u64).contains(&v) {
                    return Err(bad(key, value, "must be between 4 and 2147483647"));
                }
                self.segment_index_bytes = v;
            }
            "retention.ms" => self.retention_ms = at_least_minus_one(key, value)?,
            "retention.minutes" => {
                self.retention_ms = at_least_minus_one(key, value)?.saturating_mul(60_000)
            }
            "retention.hours" => {
                self.retention_ms = at_least_minus_one(key, value)?.saturating_mul(3_600_000)
            }
            "retention.bytes" => self.retention_bytes = at_least_minus_one(key, value)?,
            "flush.interval.messages" | "flush.messages" => {
                self.flush_interval_messages = positive::<i64>(key, value)? as u64
            }
            "flush.interval.ms" | "flush.ms" => self.flush_interval_ms = non_negative(key, value)?,
            "flush.on.ack" => self.flush_on_ack = boolean(key, value)?,
            "message.timestamp.type" => {
                self.message_timestamp_type = match value {
                    "CreateTime" => TimestampType::CreateTime,
                    "LogAppendTime" => TimestampType::LogAppendTime,
                    _ => return Err(bad(key, value, "must be CreateTime or LogAppendTime")),
                }
            }
            "message.timestamp.before.max.ms" => {
                self.message_timestamp_before_max_ms = non_negative(key, value)?
            }
            "message.timestamp.after.max.ms" => {
                self.message_timestamp_after_max_ms = non_negative(key, value)?
            }
            "preallocate" => self.preallocate = boolean(key, value)?,
            "tail.cache.bytes" => self.tail_cache_bytes = parse(key, value)?,
            "read.ahead.bytes" => self.read_ahead_bytes = parse(key, value)?,
            "cleanup.policy" => {
                self.cleanup_policy = CleanupPolicy::parse(value)
                    .ok_or_else(|| bad(key, value, "must be delete, compact or compact,delete"))?
            }
            "min.cleanable.dirty.ratio" | "cleaner.min.cleanable.ratio" => {
                let v: f64 = parse(key, value)?;
                if !(0.0..=1.0).contains(&v) {
                    return Err(bad(key, value, "must be between 0 and 1"));
                }
                self.min_cleanable_dirty_ratio = v;
            }
            "delete.retention.ms" | "cleaner.delete.retention.ms" => {
                self.delete_retention_ms = non_negative(key, value)?
            }
            "min.compaction.lag.ms" | "cleaner.min.compaction.lag.ms" => {
                self.min_compaction_lag_ms = non_negative(key, value)?
            }
            "max.compaction.lag.ms" | "cleaner.max.compaction.lag.ms" => {
                self.max_compaction_lag_ms = positive(key, value)?
            }
            "file.delete.delay.ms" | "segment.delete.delay.ms" => {
                self.file_delete_delay_ms = non_negative(key, value)?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl LogConfig {
    /// The age at which the active segment rolls on append: `segment.ms`, or
    /// `max.compaction.lag.ms` when lower on a compacted log (Kafka's
    /// `LogConfig.maxSegmentMs`). The cleaner never touches the active segment, so a
    /// record there could not be compacted within the lag it promises.
    pub fn roll_ms(&self) -> i64 {
        if self.cleanup_policy.compact && self.max_compaction_lag_ms > 0 {
            self.segment_ms.min(self.max_compaction_lag_ms)
        } else {
            self.segment_ms
        }
    }
}

fn bad(key: &str, value: &str, reason: &'static str) -> StorageError {
    StorageError::Config {
        key: key.to_owned(),
        value: value.to_owned(),
        reason,
    }
}

fn parse<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
    value
        .trim()
        .parse()
        .map_err(|_| bad(key, value, "not a valid value for this key"))
}

fn positive<T: std::str::FromStr + PartialOrd + Default>(key: &str, value: &str) -> Result<T> {
    let v: T = parse(key, value)?;
    if v <= T::default() {
        return Err(bad(key, value, "must be positive"));
    }
    Ok(v)
}

/// `true` or `false` in any case, as Kafka's boolean configs.
fn boolean(key: &str, value: &str) -> Result<bool> {
    match value.trim() {
        v if v.eq_ignore_ascii_case("true") => Ok(true),
        v if v.eq_ignore_ascii_case("false") => Ok(false),
        _ => Err(bad(key, value, "must be true or false")),
    }
}

fn non_negative(key: &str, value: &str) -> Result<i64> {
    let v: i64 = parse(key, value)?;
    if v < 0 {
        return Err(bad(key, value, "must be 0 or more"));
    }
    Ok(v)
}

fn at_least_minus_one(key: &str, value: &str) -> Result<i64> {
    let v: i64 = parse(key, value)?;
    if v < -1 {
        return Err(bad(key, value, "must be -1 or more"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_and_topic_keys_map_to_the_same_field() {
        let c = LogConfig::from_pairs([("log.segment.bytes", "1048576"), ("retention.ms", "-1")])
            .unwrap();
        assert_eq!(c.segment_bytes, 1 << 20);
        assert_eq!(c.retention_ms, -1);
        let c = LogConfig::from_pairs([("segment.bytes", "4096"), ("log.flush.on.ack", "true")])
            .unwrap();
        assert_eq!(c.segment_bytes, 4096);
        assert!(c.flush_on_ack);
        assert_eq!(
            c.index_interval_bytes,
            LogConfig::default().index_interval_bytes
        );
    }

    #[test]
    fn bad_values_are_errors_and_unknown_keys_are_not_mine() {
        let mut c = LogConfig::default();
        assert!(c.set("segment.bytes", "12").is_err());
        assert!(c.set("segment.bytes", "x").is_err());
        assert!(c.set("retention.bytes", "-2").is_err());
        // Kafka: flush.ms is at least 0 (a negative value fsynced on every append).
        assert!(c.set("flush.ms", "-1").is_err());
        assert!(c.set("preallocate", "yes").is_err());
        assert!(!c.set("min.insync.replicas", "2").unwrap());
        assert_eq!(c, LogConfig::default());
        // Booleans in any case, as Kafka's.
        assert!(c.set("preallocate", "FALSE").unwrap());
        assert!(!c.preallocate);
        assert!(c.set("log.flush.on.ack", "True").unwrap());
        assert!(c.flush_on_ack);
    }

    /// `segment.index.bytes` (topic) and `log.index.size.max.bytes` (broker) bound the
    /// active segment's index; Kafka's default and lower bound.
    #[test]
    fn segment_index_bytes_parses_under_both_names() {
        assert_eq!(LogConfig::default().segment_index_bytes, 10 << 20);
        let c = LogConfig::from_pairs([("log.index.size.max.bytes", "4096")]).unwrap();
        assert_eq!(c.segment_index_bytes, 4096);
        let c = LogConfig::from_pairs([("segment.index.bytes", "4")]).unwrap();
        assert_eq!(c.segment_index_bytes, 4);
        let mut c = LogConfig::default();
        assert!(c.set("segment.index.bytes", "3").is_err());
        assert!(c.set("segment.index.bytes", "2147483648").is_err());
        assert!(c.set("log.index.size.max.bytes", "x").is_err());
    }

    #[test]
    fn compaction_keys_parse_under_broker_and_topic_names() {
        let c = LogConfig::from_pairs([
            ("cleanup.policy", "compact,delete"),
            ("log.cleaner.min.cleanable.ratio", "0.1"),
            ("delete.retention.ms", "100"),
            ("log.cleaner.min.compaction.lag.ms", "5"),
            ("max.compaction.lag.ms", "1000"),
        ])
        .unwrap();
        assert!(c.cleanup_policy.compact && c.cleanup_policy.delete);
        assert_eq!(c.min_cleanable_dirty_ratio, 0.1);
        assert_eq!(c.delete_retention_ms, 100);
        assert_eq!(c.min_compaction_lag_ms, 5);
        assert_eq!(c.max_compaction_lag_ms, 1000);
        let mut c = LogConfig::default();
        assert!(c.set("cleanup.policy", "compact,nope").is_err());
        assert!(c.set("min.cleanable.dirty.ratio", "1.5").is_err());
        assert!(c.set("delete.retention.ms", "-1").is_err());
        assert!(c.set("log.cleanup.policy", "compact").unwrap());
        assert!(c.cleanup_policy.compact && !c.cleanup_policy.delete);
    }
}
