//! The leader epoch cache of one partition replica (KIP-101/279): for each leader epoch
//! seen in the log, the first offset written under it, persisted as Kafka's
//! `leader-epoch-checkpoint` (text: version `0`, the entry count, then one
//! `<epoch> <start offset>` line per entry) with an atomic write.
//!
//! It answers OffsetForLeaderEpoch — where did epoch E end in this log? — which is how a
//! replica that becomes follower finds the point where its log diverges from the new
//! leader's, instead of truncating blindly to its HW.
//!
//! A new leader's entry may be written in glommio's blocking pool
//! ([`LeaderEpochCache::assign_in_background`]): a failover must not stop the shard for
//! an fsync pair per partition it now leads. A follower's new epochs and its truncations
//! are written there too, and awaited ([`LeaderEpochCache::written_in_pool`]). Writes of
//! one file never interleave and the newest contents always win (a generation per change;
//! see `Checkpoint`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use wire::{LeaderEpoch, Offset};

use super::atomic::write_atomic;
use super::checkpoint;
use super::error::{Result, StorageError};

/// Kafka's file name, inside the partition directory.
pub const CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";
/// Most entries a checkpoint may hold (an epoch per leader change; a real log has few).
const ENTRIES_MAX: usize = 1 << 20;

/// Epoch → first offset written under it, ascending in both.
#[derive(Debug)]
pub struct LeaderEpochCache {
    checkpoint: Arc<Checkpoint>,
    entries: BTreeMap<LeaderEpoch, Offset>,
}

/// The checkpoint file, shared with the blocking pool's writes: `latest` is what it must
/// come to hold, `written` the generation on disk (synced). A writer holds `writing`
/// while it writes and writes the newest contents there are then, so a slow write of old
/// contents never lands after a newer one.
#[derive(Debug)]
struct Checkpoint {
    path: PathBuf,
    /// (generation, contents); the generation grows with every change.
    latest: Mutex<(u64, Vec<u8>)>,
    writing: Mutex<()>,
    written: AtomicU64,
    /// The thread of the last write (which thread pays for the fsyncs).
    written_by: Mutex<Option<std::thread::ThreadId>>,
}

/// A lock whose holder panicked still guards consistent data here (plain values).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Checkpoint {
    fn new(path: PathBuf) -> Checkpoint {
        Checkpoint {
            path,
            latest: Mutex::new((0, Vec::new())),
            writing: Mutex::new(()),
            written: AtomicU64::new(0),
            written_by: Mutex::new(None),
        }
    }

    /// The contents the file must come to hold.
    fn set(&self, contents: Vec<u8>) {
        let mut latest = lock(&self.latest);
        latest.0 += 1;
        latest.1 = contents;
    }

    /// Whether the file lacks the latest change.
    fn unwritten(&self) -> bool {
        lock(&self.latest).0 > self.written.load(Ordering::Acquire)
    }

    /// Writes and syncs the latest contents unless they are on disk already (on the
    /// caller's thread; it waits for a write under way).
    fn write_latest(&self) -> Result<()> {
        let _writing = lock(&self.writing);
        let (generation, contents) = {
            let latest = lock(&self.latest);
            (latest.0, latest.1.clone())
        };
        if generation <= self.written.load(Ordering::Acquire) {
            return Ok(());
        }
        write_atomic(&self.path, &contents)?;
        self.written.store(generation, Ordering::Release);
        *lock(&self.written_by) = Some(std::thread::current().id());
        Ok(())
    }
}

impl LeaderEpochCache {
    /// Loads `dir`'s checkpoint (empty if there is none). A damaged file is an error
    /// naming it: the answers it gives decide what a follower truncates.
    pub fn load(dir: &Path) -> Result<LeaderEpochCache> {
        let path = dir.join(CHECKPOINT_FILE);
        let entries = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text).map_err(|reason| StorageError::Corrupt {
                path: path.clone(),
                position: 0,
                reason,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(StorageError::io("read", &path, e)),
        };
        let checkpoint = Arc::new(Checkpoint::new(path));
        Ok(LeaderEpochCache {
            checkpoint,
            entries,
        })
    }

    /// The newest epoch and where it started.
    pub fn latest(&self) -> Option<(LeaderEpoch, Offset)> {
        self.entries.iter().next_back().map(|(e, o)| (*e, *o))
    }

    pub fn entries(&self) -> Vec<(LeaderEpoch, Offset)> {
        self.entries.iter().map(|(e, o)| (*e, *o)).collect()
    }

    /// Records that `epoch` starts at `start` if it is newer than every epoch here (an
    /// append under an older or the same epoch changes nothing). Persists the change.
    /// Returns whether an entry was added.
    pub fn assign(&mut self, epoch: LeaderEpoch, start: Offset) -> Result<bool> {
        // In memory only once on disk: a failed write (out of space) leaves the epoch
        // unassigned, so the next append tries again rather than finding it recorded and
        // going on without it (a checkpoint missing an epoch answers OffsetForLeaderEpoch
        // wrongly after a restart; found by review).
        if !self.insert_newer(epoch, start) {
            return Ok(false);
        }
        if let Err(e) = self.persist() {
            self.entries.remove(&epoch);
            // What the file must hold is again the cache without it (a later flush).
            self.checkpoint.set(self.rendered());
            return Err(e);
        }
        Ok(true)
    }

    /// [`assign`](Self::assign) for a replica that just became leader, with the write and
    /// its fsyncs in glommio's blocking pool instead of the caller's thread: a failover
    /// makes a node leader of many partitions at once, and one fsync pair each on the
    /// shard's thread stopped every request of the shard for the whole batch. The entry
    /// is in memory at once (OffsetForLeaderEpoch answers with it; that is safe, as it
    /// holds whether or not a crash takes it: nothing is in the log under the new epoch
    /// yet). What must hold is that no record under the epoch reaches the log before the
    /// entry is on disk: a log holding epoch-E records with a checkpoint that lost E
    /// answers where E-1 ended with its log end, and a follower then keeps a divergent
    /// E-1 tail at offsets where this log has E records. The caller therefore calls
    /// [`flush`](Self::flush) before its first append under the epoch (a leader append
    /// notes its epoch first), which writes it on its own thread if the pool has not
    /// yet. A failed background write is logged and left to that flush. Must run on a
    /// glommio executor. Returns whether an entry was added.
    pub fn assign_in_background(&mut self, epoch: LeaderEpoch, start: Offset) -> bool {
        if !self.assign_unwritten(epoch, start) {
            return false;
        }
        let path = self.checkpoint.path.clone();
        let written = self.written_in_pool();
        glommio::spawn_local(async move {
            if let Err(e) = written.await {
                tracing::warn!(path = %path.display(), "leader epoch checkpoint, written in the background: {e}; the next append writes it");
            }
        })
        .detach();
        true
    }

    /// [`assign`](Self::assign) in memory only: the file is written by
    /// [`written_in_pool`](Self::written_in_pool) (or [`flush`](Self::flush)), which the
    /// caller awaits before any record of the epoch is appended — a follower copying its
    /// leader's batches, whose appends may wait for the blocking pool. Returns whether an
    /// entry was added.
    pub fn assign_unwritten(&mut self, epoch: LeaderEpoch, start: Offset) -> bool {
        let added = self.insert_newer(epoch, start);
        if added {
            self.checkpoint.set(self.rendered());
        }
        added
    }

    /// Adds `epoch` at `start` in memory if it is newer than every epoch here; an epoch
    /// never starts before the one it follows. Returns whether it was added.
    fn insert_newer(&mut self, epoch: LeaderEpoch, start: Offset) -> bool {
        if epoch.get() < 0 || self.latest().is_some_and(|(e, _)| e >= epoch) {
            return false;
        }
        if let Some((_, last_start)) = self.latest() {
            assert!(
                start >= last_start,
                "epoch {epoch} starts at {start}, before the previous epoch's {last_start}"
            );
        }
        self.entries.insert(epoch, start);
        true
    }

    /// [`truncate_from_end`](Self::truncate_from_end) in memory only; the caller awaits
    /// [`written_in_pool`](Self::written_in_pool) before the log grows past `end` again.
    /// Returns whether entries were removed.
    pub fn truncate_from_end_unwritten(&mut self, end: Offset) -> bool {
        let before = self.entries.len();
        self.entries.retain(|_, start| *start < end);
        let removed = self.entries.len() != before;
        if removed {
            self.checkpoint.set(self.rendered());
        }
        removed
    }

    /// Done once every change made so far is on disk: at once if it is, else after the
    /// newest contents are written and synced in glommio's blocking pool, not on the
    /// caller's thread (two fsyncs, which on a shard's thread stall every partition of
    /// the shard). Holds no borrow of the cache, so it may be awaited outside one. A
    /// failed write is returned and left to the next call (or a flush) to try again.
    /// Must run on a glommio executor.
    pub fn written_in_pool(&self) -> impl std::future::Future<Output = Result<()>> + 'static {
        let unwritten = self.checkpoint.unwritten().then(|| self.checkpoint.clone());
        async move {
            let Some(checkpoint) = unwritten else {
                return Ok(());
            };
            glommio::executor()
                .spawn_blocking(move || checkpoint.write_latest())
                .await
        }
    }

    /// Writes the checkpoint now, on this thread, if a change is not on disk yet (a
    /// background write not done, or failed). Before an append under a new epoch.
    pub fn flush(&self) -> Result<()> {
        if !self.checkpoint.unwritten() {
            return Ok(());
        }
        self.checkpoint.write_latest()
    }

    /// Whether every change is on disk.
    pub fn durable(&self) -> bool {
        !self.checkpoint.unwritten()
    }

    /// The thread that last wrote the file (for tests: which thread paid the fsyncs).
    pub fn written_by(&self) -> Option<std::thread::ThreadId> {
        *lock(&self.checkpoint.written_by)
    }

    /// Where `requested` ended in this log, as (epoch, end offset), Kafka's rule: the
    /// latest epoch ends at the log end; an older one at the start of the next epoch
    /// above it, answered with the largest epoch at or below the requested one; an epoch
    /// newer than every entry (or an empty cache) is unknown: (-1, -1).
    pub fn end_offset_for(&self, requested: LeaderEpoch, log_end: Offset) -> (LeaderEpoch, Offset) {
        let undefined = (LeaderEpoch::NONE, Offset::NONE);
        if requested == LeaderEpoch::NONE {
            return undefined;
        }
        match self.latest() {
            Some((latest, _)) if latest == requested => return (requested, log_end),
            None => return undefined,
            Some(_) => {}
        }
        let higher = self
            .entries
            .range((
                std::ops::Bound::Excluded(requested),
                std::ops::Bound::Unbounded,
            ))
            .next();
        let Some((_, higher_start)) = higher else {
            return undefined;
        };
        match self.entries.range(..=requested).next_back() {
            Some((floor, _)) => (*floor, *higher_start),
            None => (requested, *higher_start),
        }
    }

    /// The log was truncated to end at `end`: epochs that start at or after it are gone.
    pub fn truncate_from_end(&mut self, end: Offset) -> Result<()> {
        if self.truncate_from_end_unwritten(end) {
            self.checkpoint.write_latest()?;
        }
        Ok(())
    }

    fn persist(&self) -> Result<()> {
        self.checkpoint.set(self.rendered());
        self.checkpoint.write_latest()
    }

    fn rendered(&self) -> Vec<u8> {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|(epoch, start)| format!("{epoch} {start}"))
            .collect();
        checkpoint::render(&entries).into_bytes()
    }
}

fn parse(text: &str) -> std::result::Result<BTreeMap<LeaderEpoch, Offset>, String> {
    let mut entries = BTreeMap::new();
    let mut previous: Option<(LeaderEpoch, Offset)> = None;
    for (_, line) in checkpoint::entries(text, ENTRIES_MAX)? {
        let mut fields = line.split_whitespace();
        let epoch = fields.next().and_then(|f| f.parse::<i32>().ok());
        let start = fields.next().and_then(|f| f.parse::<i64>().ok());
        let (Some(epoch), Some(start)) = (epoch, start) else {
            return Err(format!("bad entry {line:?}"));
        };
        let (epoch, start) = (LeaderEpoch(epoch), Offset(start));
        if previous.is_some_and(|(e, o)| epoch <= e || start < o) {
            return Err(format!("entry {line:?} out of order"));
        }
        previous = Some((epoch, start));
        entries.insert(epoch, start);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that fails leaves the epoch unassigned: the next try writes it again.
    #[test]
    fn an_epoch_whose_checkpoint_write_failed_is_not_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gone = dir.path().join("removed");
        let mut c = LeaderEpochCache::load(&gone).expect("no file: empty");
        assert!(
            c.assign(LeaderEpoch(3), Offset(10)).is_err(),
            "no directory"
        );
        assert_eq!(c.latest(), None);
        assert!(c.assign(LeaderEpoch(3), Offset(10)).is_err(), "tried again");
        std::fs::create_dir(&gone).expect("mkdir");
        assert_eq!(c.assign(LeaderEpoch(3), Offset(10)).ok(), Some(true));
        let reloaded = LeaderEpochCache::load(&gone).expect("reload");
        assert_eq!(reloaded.latest(), Some((LeaderEpoch(3), Offset(10))));
    }

    #[test]
    fn epochs_end_where_the_next_begins_and_survive_a_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = LeaderEpochCache::load(dir.path()).expect("empty");
        assert_eq!(
            c.end_offset_for(LeaderEpoch(0), Offset(0)),
            (LeaderEpoch::NONE, Offset::NONE)
        );
        assert!(c.assign(LeaderEpoch(0), Offset(0)).expect("assign"));
        assert!(!c.assign(LeaderEpoch(0), Offset(5)).expect("same epoch"));
        assert!(c.assign(LeaderEpoch(2), Offset(10)).expect("assign"));
        assert!(c.assign(LeaderEpoch(5), Offset(30)).expect("assign"));
        let end = Offset(42);
        assert_eq!(c.end_offset_for(LeaderEpoch(5), end), (LeaderEpoch(5), end));
        assert_eq!(
            c.end_offset_for(LeaderEpoch(2), end),
            (LeaderEpoch(2), Offset(30))
        );
        // Epoch 3 never led here: it ends where 5 began, answered as epoch 2.
        assert_eq!(
            c.end_offset_for(LeaderEpoch(3), end),
            (LeaderEpoch(2), Offset(30))
        );
        assert_eq!(
            c.end_offset_for(LeaderEpoch(9), end),
            (LeaderEpoch::NONE, Offset::NONE)
        );

        let text = std::fs::read_to_string(dir.path().join(CHECKPOINT_FILE)).expect("file");
        assert_eq!(text, "0\n3\n0 0\n2 10\n5 30\n", "Kafka's checkpoint format");
        let again = LeaderEpochCache::load(dir.path()).expect("reload");
        assert_eq!(again.entries(), c.entries());

        c.truncate_from_end(Offset(30)).expect("truncate");
        assert_eq!(c.latest(), Some((LeaderEpoch(2), Offset(10))));
        assert_eq!(
            LeaderEpochCache::load(dir.path())
                .expect("reload")
                .entries()
                .len(),
            2
        );
    }

    /// A new leader's entry is written in the blocking pool, not on the caller's
    /// thread; a synced change made meanwhile is never overwritten by the older
    /// background write (the newest contents win); and an entry whose background write
    /// failed is written by the next flush (found by review: a failover fsynced every
    /// partition's checkpoint on the shard's thread).
    #[test]
    fn a_background_write_leaves_the_caller_thread_and_never_undoes_a_newer_one() {
        crate::storage::testing::run_on_shard(|| async {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut c = LeaderEpochCache::load(dir.path()).expect("empty");
            assert!(c.assign_in_background(LeaderEpoch(1), Offset(0)));
            assert!(!c.assign_in_background(LeaderEpoch(1), Offset(4)), "known");
            let started = std::time::Instant::now();
            while !c.durable() {
                assert!(started.elapsed() < std::time::Duration::from_secs(30));
                glommio::timer::sleep(std::time::Duration::from_millis(2)).await;
            }
            assert_ne!(c.written_by(), Some(std::thread::current().id()));
            let reloaded = LeaderEpochCache::load(dir.path()).expect("reload");
            assert_eq!(reloaded.entries(), vec![(LeaderEpoch(1), Offset(0))]);

            // A background write and a synced one right after: the file ends newest.
            assert!(c.assign_in_background(LeaderEpoch(2), Offset(5)));
            assert!(c.assign(LeaderEpoch(3), Offset(9)).expect("synced"));
            assert!(c.durable());
            glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
            let reloaded = LeaderEpochCache::load(dir.path()).expect("reload");
            assert_eq!(reloaded.entries(), c.entries());
            assert_eq!(c.entries().len(), 3);

            // The directory is gone: the background write fails, the flush tells.
            let gone = dir.path().join("gone");
            let mut c = LeaderEpochCache::load(&gone).expect("empty");
            assert!(c.assign_in_background(LeaderEpoch(4), Offset(0)));
            assert!(c.flush().is_err());
            std::fs::create_dir(&gone).expect("mkdir");
            c.flush().expect("written");
            assert!(c.durable());
            let reloaded = LeaderEpochCache::load(&gone).expect("reload");
            assert_eq!(reloaded.latest(), Some((LeaderEpoch(4), Offset(0))));
        });
    }

    /// Changes made in memory only are written by `written_in_pool`, in the blocking
    /// pool; one whose write failed is written by the next call; with nothing to write
    /// it is done at once.
    #[test]
    fn unwritten_changes_are_written_in_the_pool_when_awaited() {
        crate::storage::testing::run_on_shard(|| async {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut c = LeaderEpochCache::load(dir.path()).expect("empty");
            assert!(c.assign_unwritten(LeaderEpoch(1), Offset(0)));
            assert!(c.assign_unwritten(LeaderEpoch(2), Offset(7)));
            assert!(!c.assign_unwritten(LeaderEpoch(2), Offset(9)), "known");
            assert!(!c.durable());
            c.written_in_pool().await.expect("written");
            assert!(c.durable());
            assert_ne!(c.written_by(), Some(std::thread::current().id()));
            let reloaded = LeaderEpochCache::load(dir.path()).expect("reload");
            assert_eq!(reloaded.entries(), c.entries());

            assert!(c.truncate_from_end_unwritten(Offset(7)));
            assert!(
                !c.truncate_from_end_unwritten(Offset(7)),
                "nothing left to cut"
            );
            c.written_in_pool().await.expect("written");
            let reloaded = LeaderEpochCache::load(dir.path()).expect("reload");
            assert_eq!(reloaded.entries(), vec![(LeaderEpoch(1), Offset(0))]);
            c.written_in_pool().await.expect("nothing to write");

            let gone = dir.path().join("gone");
            let mut c = LeaderEpochCache::load(&gone).expect("empty");
            assert!(c.assign_unwritten(LeaderEpoch(4), Offset(0)));
            assert!(c.written_in_pool().await.is_err(), "no directory");
            assert!(!c.durable());
            std::fs::create_dir(&gone).expect("mkdir");
            c.written_in_pool().await.expect("written by the next call");
            let reloaded = LeaderEpochCache::load(&gone).expect("reload");
            assert_eq!(reloaded.latest(), Some((LeaderEpoch(4), Offset(0))));
        });
    }

    #[test]
    fn a_damaged_checkpoint_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        for bad in [
            "",
            "1\n0\n",
            "0\n2\n0 0\n",
            "0\n2\n3 10\n1 20\n",
            "0\n1\nx y\n",
        ] {
            std::fs::write(dir.path().join(CHECKPOINT_FILE), bad).expect("write");
            let err = LeaderEpochCache::load(dir.path()).expect_err(bad);
            assert!(err.to_string().contains(CHECKPOINT_FILE), "{err}");
        }
    }
}
