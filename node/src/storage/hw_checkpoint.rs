//! The node's high-watermark checkpoint: one `replication-offset-checkpoint` file per data
//! dir, Kafka's text format (version `0`, the entry count, then one
//! `<topic> <partition> <high watermark>` line per partition), replaced atomically.
//!
//! Why it exists: a replica's HW is only in memory, and a log end offset may cover records
//! the ISR never had (acks=1 appends, or the tail a leader wrote just before it died). A
//! replica that restarts opens with HW = min(checkpointed HW, LEO), so a returning
//! leader-to-be does not expose un-replicated records to consumers before its ISR vouched
//! for them again.
//!
//! Every shard of the node shares one [`HwCheckpoint`] (a mutex around the map; shards
//! touch it once per housekeeping tick, never per request). Writes are rate-bounded by
//! `replica.high.watermark.checkpoint.interval.ms`, as in Kafka: a HW moves on nearly every
//! produce, and an fsync per move would cost more than the append.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use wire::Offset;

use super::atomic::write_atomic;
use super::checkpoint;
use super::error::{Result, StorageError};

/// Kafka's file name, in the data dir.
pub const CHECKPOINT_FILE: &str = "replication-offset-checkpoint";
/// Most entries the file may hold (one per partition replica on the node).
const ENTRIES_MAX: usize = 1 << 22;
/// Kafka's `replica.high.watermark.checkpoint.interval.ms` default.
pub const INTERVAL_MS_DEFAULT: i64 = 5_000;

/// A partition key in the file: topic name and index.
type Key = (String, i32);

#[derive(Debug)]
struct State {
    hws: BTreeMap<Key, i64>,
    /// The map changed since the file was last written.
    dirty: bool,
    last_write_ms: i64,
}

/// The HWs of every partition replica on this node, as last checkpointed or reported.
#[derive(Debug)]
pub struct HwCheckpoint {
    path: PathBuf,
    state: Mutex<State>,
    /// Held while the file is written, so two shards' writes never interleave and the
    /// file never goes back to an older snapshot.
    writing: Mutex<()>,
}

impl HwCheckpoint {
    /// Loads `data_dir`'s checkpoint (empty when there is none). A damaged file is an
    /// error naming it.
    pub fn load(data_dir: &Path) -> Result<HwCheckpoint> {
        let path = data_dir.join(CHECKPOINT_FILE);
        let hws = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text).map_err(|reason| StorageError::Corrupt {
                path: path.clone(),
                position: 0,
                reason,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(StorageError::io("read", &path, e)),
        };
        Ok(HwCheckpoint::with(path, hws))
    }

    /// A checkpoint that starts empty (a damaged file is replaced at the next write).
    pub fn empty(data_dir: &Path) -> HwCheckpoint {
        HwCheckpoint::with(data_dir.join(CHECKPOINT_FILE), BTreeMap::new())
    }

    fn with(path: PathBuf, hws: BTreeMap<Key, i64>) -> HwCheckpoint {
        HwCheckpoint {
            path,
            state: Mutex::new(State {
                hws,
                dirty: false,
                // Never written: the first write is due at once.
                last_write_ms: i64::MIN,
            }),
            writing: Mutex::new(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A shard that panicked holding the lock left a consistent map (plain inserts).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The checkpointed HW of `topic`-`partition`, if the file (or a report since) has one.
    pub fn get(&self, topic: &str, partition: i32) -> Option<Offset> {
        let key = (topic.to_string(), partition);
        self.state().hws.get(&key).copied().map(Offset)
    }

    /// Records the current HWs of some partitions (one shard's, once per tick).
    pub fn report(&self, hws: impl IntoIterator<Item = (String, i32, Offset)>) {
        let mut s = self.state();
        for (topic, partition, hw) in hws {
            let old = s.hws.insert((topic, partition), hw.get());
            s.dirty |= old != Some(hw.get());
        }
    }

    /// Forgets the partitions of a deleted topic.
    pub fn remove_topic(&self, topic: &str) {
        let mut s = self.state();
        let before = s.hws.len();
        s.hws.retain(|(t, _), _| t != topic);
        s.dirty |= s.hws.len() != before;
    }

    /// Writes the file if something changed and the last write is at least `interval_ms`
    /// old (0: whenever something changed). Returns whether it wrote. Blocking I/O: a
    /// small file, at most once per interval.
    pub fn write_if_due(&self, now_ms: i64, interval_ms: i64) -> Result<bool> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let text = {
            let mut s = self.state();
            if !s.dirty || now_ms.saturating_sub(s.last_write_ms) < interval_ms {
                return Ok(false);
            }
            s.dirty = false;
            s.last_write_ms = now_ms;
            render(&s.hws)
        };
        if let Err(e) = write_atomic(&self.path, text.as_bytes()) {
            self.state().dirty = true;
            return Err(e);
        }
        Ok(true)
    }
}

fn render(hws: &BTreeMap<Key, i64>) -> String {
    let entries: Vec<String> = hws
        .iter()
        .map(|((topic, partition), hw)| format!("{topic} {partition} {hw}"))
        .collect();
    checkpoint::render(&entries)
}

/// Parses Kafka's format; any deviation is an error saying where.
fn parse(text: &str) -> std::result::Result<BTreeMap<Key, i64>, String> {
    let mut hws = BTreeMap::new();
    for (i, line) in checkpoint::entries(text, ENTRIES_MAX)? {
        let mut fields = line.split_whitespace();
        let (Some(topic), Some(partition), Some(hw), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(format!(
                "entry {i}: {line:?} is not `topic partition offset`"
            ));
        };
        let partition: i32 = partition
            .parse()
            .map_err(|_| format!("entry {i}: bad partition {partition:?}"))?;
        let hw: i64 = hw
            .parse()
            .map_err(|_| format!("entry {i}: bad offset {hw:?}"))?;
        if partition < 0 || hw < 0 {
            return Err(format!("entry {i}: negative partition or offset"));
        }
        hws.insert((topic.to_string(), partition), hw);
    }
    Ok(hws)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_kafkas_format_and_reads_it_back() {
        let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
        let c = HwCheckpoint::load(dir.path()).unwrap();
        assert_eq!(c.get("t", 0), None);
        c.report([("t".into(), 1, Offset(7)), ("a.b-c".into(), 0, Offset(0))]);
        assert!(c.write_if_due(1_000, 5_000).unwrap(), "first write is due");
        let text = std::fs::read_to_string(dir.path().join(CHECKPOINT_FILE)).unwrap();
        assert_eq!(text, "0\n2\na.b-c 0 0\nt 1 7\n");
        // Unchanged: nothing to write; changed but within the interval: not yet.
        assert!(!c.write_if_due(10_000, 5_000).unwrap());
        c.report([("t".into(), 1, Offset(9))]);
        assert!(!c.write_if_due(2_000, 5_000).unwrap());
        assert!(c.write_if_due(6_000, 5_000).unwrap());
        let back = HwCheckpoint::load(dir.path()).unwrap();
        assert_eq!(back.get("t", 1), Some(Offset(9)));
        assert_eq!(back.get("a.b-c", 0), Some(Offset(0)));
        back.remove_topic("t");
        assert!(back.write_if_due(0, 0).unwrap());
        assert_eq!(HwCheckpoint::load(dir.path()).unwrap().get("t", 1), None);
    }

    #[test]
    fn a_damaged_file_is_an_error() {
        for bad in [
            "",
            "1\n0\n",
            "0\n2\nt 0 5\n",
            "0\n1\nt x 5\n",
            "0\n1\nt 0 -5\n",
            "0\n1\nt 0 5 6\n",
            "0\n0\nt 0 5\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(parse("0\n0\n").unwrap().len(), 0);
    }
}
