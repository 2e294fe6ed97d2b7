//! The aborted-transaction index: `<segment base:020>.txnindex` files in Kafka's format,
//! one entry per transaction aborted in that segment (written when its ABORT marker is
//! appended), and the in-memory list a read_committed Fetch consults.
//!
//! Entry layout (Kafka's `AbortedTxn`, 34 bytes, big-endian):
//!
//! | off | size | field                                                   |
//! |----:|-----:|---------------------------------------------------------|
//! |   0 |    2 | version = 0                                             |
//! |   2 |    8 | producer id                                             |
//! |  10 |    8 | first offset (the transaction's first batch here)       |
//! |  18 |    8 | last offset (its ABORT marker)                          |
//! |  26 |    8 | last stable offset when the abort completed             |
//!
//! The index is derived from the log: on open, entries whose marker is past the log end
//! (a torn tail) are dropped, and replaying the log after the producer-state snapshot adds
//! any aborted transaction whose entry was lost. Blocking std I/O on the shard thread: an
//! entry is written once per aborted transaction per partition.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use wire::{Offset, ProducerId};

use super::atomic::write_atomic;
use super::error::{Result, StorageError};
use super::segment_file_name;

/// Kafka's txn index entry version.
pub const TXN_INDEX_VERSION: i16 = 0;
/// Bytes per entry.
pub const TXN_INDEX_ENTRY_BYTES: usize = 34;
/// File extension (after the segment base offset).
pub const TXN_INDEX_EXTENSION: &str = "txnindex";
/// Most entries kept in memory per partition; the oldest go first past it (a consumer
/// reading that far back then sees those aborted records, as with a truncated index).
pub const TXN_INDEX_ENTRIES_MAX: usize = 100_000;

/// One aborted transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: ProducerId,
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub last_stable_offset: Offset,
}

impl AbortedTxn {
    pub fn encode(&self) -> [u8; TXN_INDEX_ENTRY_BYTES] {
        let mut out = [0u8; TXN_INDEX_ENTRY_BYTES];
        out[0..2].copy_from_slice(&TXN_INDEX_VERSION.to_be_bytes());
        out[2..10].copy_from_slice(&self.producer_id.get().to_be_bytes());
        out[10..18].copy_from_slice(&self.first_offset.get().to_be_bytes());
        out[18..26].copy_from_slice(&self.last_offset.get().to_be_bytes());
        out[26..34].copy_from_slice(&self.last_stable_offset.get().to_be_bytes());
        out
    }

    /// Decodes one entry; `None` for a wrong version or offsets out of order.
    pub fn decode(bytes: &[u8]) -> Option<AbortedTxn> {
        let field = |at: usize| -> Option<i64> {
            Some(i64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let version = i16::from_be_bytes(bytes.get(0..2)?.try_into().ok()?);
        if version != TXN_INDEX_VERSION {
            return None;
        }
        let txn = AbortedTxn {
            producer_id: ProducerId(field(2)?),
            first_offset: Offset(field(10)?),
            last_offset: Offset(field(18)?),
            last_stable_offset: Offset(field(26)?),
        };
        let ordered = txn.first_offset.0 >= 0 && txn.first_offset < txn.last_offset;
        (ordered && txn.producer_id.is_some()).then_some(txn)
    }
}

/// A partition's aborted transactions, ordered by marker offset.
#[derive(Clone, Debug, Default)]
pub struct TxnIndex {
    /// Sorted by marker offset. A deque: markers arrive in offset order, so inserts land
    /// at the back and the cap drops from the front, neither moving the rest.
    entries: VecDeque<AbortedTxn>,
}

impl TxnIndex {
    /// Reads every `.txnindex` file in `dir`, keeping entries whose marker is below
    /// `log_end` (a damaged tail entry ends its file's reading). A file holding entries
    /// at or past `log_end` is rewritten without them: their markers were cut (a torn
    /// tail, a follower's truncation, a rollback), and once the log grows past them again
    /// they would name aborted transactions that are not there.
    pub fn load(dir: &Path, log_end: Offset) -> TxnIndex {
        let mut entries = Vec::new();
        let Ok(listing) = std::fs::read_dir(dir) else {
            return TxnIndex::default();
        };
        for file in listing.filter_map(|e| e.ok()) {
            let name = file.file_name();
            let is_index = name
                .to_str()
                .and_then(|n| n.strip_suffix(TXN_INDEX_EXTENSION))
                .is_some_and(|stem| stem.len() == 21 && stem.ends_with('.'));
            if !is_index {
                continue;
            }
            let Ok(bytes) = std::fs::read(file.path()) else {
                tracing::warn!(path = %file.path().display(), "cannot read txn index");
                continue;
            };
            let mut kept = Vec::new();
            // A torn tail (a partial entry, or one that does not decode) is cut from the
            // file too: appends land after it, and left there it would misalign every
            // entry written later (found by review).
            let mut cut = bytes.len() % TXN_INDEX_ENTRY_BYTES != 0;
            for chunk in bytes.chunks_exact(TXN_INDEX_ENTRY_BYTES) {
                match AbortedTxn::decode(chunk) {
                    Some(t) if t.last_offset < log_end => kept.push(t),
                    Some(_) => cut = true,
                    None => {
                        cut = true;
                        break;
                    }
                }
            }
            if cut {
                let bytes: Vec<u8> = kept.iter().flat_map(|t| t.encode()).collect();
                if let Err(e) = write_atomic(&file.path(), &bytes) {
                    tracing::warn!(path = %file.path().display(), "cannot cut txn index: {e}");
                }
            }
            entries.extend(kept);
        }
        entries.sort_unstable_by_key(|t| t.last_offset);
        entries.dedup();
        let mut index = TxnIndex {
            entries: entries.into(),
        };
        index.bound();
        index
    }

    /// Records an aborted transaction in memory and appends it to the txn index of the
    /// segment starting at `segment_base` (created if needed, fdatasync'ed).
    pub fn append(&mut self, dir: &Path, segment_base: Offset, txn: AbortedTxn) -> Result<()> {
        self.insert(txn);
        let path = dir.join(segment_file_name(segment_base, TXN_INDEX_EXTENSION));
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| StorageError::io("open", &path, e))?;
        file.write_all(&txn.encode())
            .map_err(|e| StorageError::io("write", &path, e))?;
        file.sync_data()
            .map_err(|e| StorageError::io("fdatasync", &path, e))
    }

    /// Records an aborted transaction in memory only (rebuilt by replay; its entry is
    /// written by [`Self::append`] when missing from the files).
    pub fn insert(&mut self, txn: AbortedTxn) -> bool {
        let same_marker = self
            .entries
            .partition_point(|t| t.last_offset < txn.last_offset);
        let known = self
            .entries
            .range(same_marker..)
            .take_while(|t| t.last_offset == txn.last_offset)
            .any(|t| *t == txn);
        if known {
            return false;
        }
        let at = self
            .entries
            .partition_point(|t| t.last_offset <= txn.last_offset);
        self.entries.insert(at, txn);
        self.bound();
        true
    }

    /// The aborted transactions overlapping `[from, upper)`: marker at or after `from`,
    /// first batch before `upper` (Kafka's `collectAbortedTxns`), as (producer id, first
    /// offset), in marker order.
    pub fn overlapping(&self, from: Offset, upper: Offset) -> Vec<(ProducerId, Offset)> {
        let start = self.entries.partition_point(|t| t.last_offset < from);
        self.entries
            .range(start..)
            .filter(|t| t.first_offset < upper)
            .map(|t| (t.producer_id, t.first_offset))
            .collect()
    }

    /// The aborted transactions whose marker is at or after `from` and whose first batch
    /// is before `upper`, whole (the log cleaner needs the marker offset too).
    pub fn entries_overlapping(&self, from: Offset, upper: Offset) -> Vec<AbortedTxn> {
        let start = self.entries.partition_point(|t| t.last_offset < from);
        self.entries
            .range(start..)
            .filter(|t| t.first_offset < upper)
            .copied()
            .collect()
    }

    /// Forgets entries whose marker is at or past `end` (the log was cut there).
    pub fn truncate_from(&mut self, end: Offset) {
        self.entries.retain(|t| t.last_offset < end);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn bound(&mut self) {
        if self.entries.len() > TXN_INDEX_ENTRIES_MAX {
            let excess = self.entries.len() - TXN_INDEX_ENTRIES_MAX;
            self.entries.drain(..excess);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(pid: i64, first: i64, last: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id: ProducerId(pid),
            first_offset: Offset(first),
            last_offset: Offset(last),
            last_stable_offset: Offset(last + 1),
        }
    }

    #[test]
    fn entry_round_trips_in_kafkas_layout() {
        let t = txn(7, 10, 20);
        let bytes = t.encode();
        assert_eq!(&bytes[0..2], &[0, 0]);
        assert_eq!(&bytes[2..10], &7i64.to_be_bytes());
        assert_eq!(AbortedTxn::decode(&bytes), Some(t));
        let mut bad = bytes;
        bad[1] = 1;
        assert_eq!(AbortedTxn::decode(&bad), None);
    }

    #[test]
    fn overlapping_follows_kafkas_rule() {
        let mut index = TxnIndex::default();
        index.insert(txn(1, 0, 5));
        index.insert(txn(2, 3, 9));
        index.insert(txn(3, 12, 15));
        assert_eq!(
            index.overlapping(Offset(6), Offset(12)),
            vec![(ProducerId(2), Offset(3))]
        );
        assert_eq!(index.overlapping(Offset(0), Offset(100)).len(), 3);
        assert!(index.overlapping(Offset(16), Offset(100)).is_empty());
        index.truncate_from(Offset(9));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn files_load_back_and_drop_entries_past_the_log_end() {
        let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
        let mut index = TxnIndex::default();
        index.append(dir.path(), Offset(0), txn(1, 0, 5)).unwrap();
        index
            .append(dir.path(), Offset(100), txn(2, 100, 120))
            .unwrap();
        let loaded = TxnIndex::load(dir.path(), Offset(200));
        assert_eq!(loaded.len(), 2);
        let torn = TxnIndex::load(dir.path(), Offset(110));
        assert_eq!(torn.len(), 1);
        assert!(dir.path().join("00000000000000000100.txnindex").exists());
    }

    /// A torn tail is cut from the file at load, so entries appended later stay aligned.
    #[test]
    fn a_torn_tail_is_cut_so_later_entries_stay_readable() {
        let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
        let mut index = TxnIndex::default();
        index.append(dir.path(), Offset(0), txn(1, 0, 5)).unwrap();
        let file = dir.path().join("00000000000000000000.txnindex");
        let mut torn = std::fs::read(&file).unwrap();
        torn.extend_from_slice(&[0xff; 10]);
        std::fs::write(&file, torn).unwrap();
        let mut loaded = TxnIndex::load(dir.path(), Offset(100));
        assert_eq!(loaded.len(), 1);
        loaded.append(dir.path(), Offset(0), txn(2, 6, 9)).unwrap();
        assert_eq!(TxnIndex::load(dir.path(), Offset(100)).len(), 2);
    }

    /// Past the cap the oldest entries go; a repeat is not inserted twice.
    #[test]
    fn the_cap_drops_the_oldest_and_repeats_are_ignored() {
        let mut index = TxnIndex::default();
        for i in 0..(TXN_INDEX_ENTRIES_MAX as i64 + 10) {
            assert!(index.insert(txn(i, 2 * i, 2 * i + 1)));
        }
        assert_eq!(index.len(), TXN_INDEX_ENTRIES_MAX);
        assert!(!index.insert(txn(20, 40, 41)), "a repeat");
        assert!(
            index.insert(txn(21, 40, 41)),
            "another producer's, same marker offset"
        );
        assert_eq!(index.overlapping(Offset(0), Offset(21)).len(), 0, "dropped");
    }
}
