//! The quorum's durable state under `<data dir>/controller/`: the Raft log (`log`, an
//! append-only file of checksummed records; a torn tail is cut off on open), the vote and
//! committed id (`vote`, `committed`) and the last snapshot (`snapshot`), each written
//! atomically (temp file, fsync, rename, fsync dir) behind a CRC-32C. The state machine is
//! the node's catalogue ([`MetaStore`]): rebuilt from the snapshot and the log on start.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Cursor, Read, Seek, SeekFrom, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};

use super::TypeConfig;
use crate::controller::apply;
use crate::controller::{Command, Outcome};
use crate::metadata::{Catalog, MetaStore, write_atomic};

/// Largest log record or state file read back (a record is one metadata command).
pub const RECORD_MAX_BYTES: usize = 64 << 20;
/// Record header: payload length (u32 LE) and its CRC-32C (u32 LE).
const HEADER: usize = 8;

type SErr = StorageError<u64>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Writes `bytes` behind a CRC-32C, atomically.
fn write_checked(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(bytes.len() + 4);
    out.extend_from_slice(&crc32c::crc32c(bytes).to_le_bytes());
    out.extend_from_slice(bytes);
    write_atomic(path, &out)
}

/// Reads what [`write_checked`] wrote; `None` if absent, an error if damaged.
fn read_checked(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let (crc, body) = bytes.split_at_checked(4).ok_or_else(|| {
        std::io::Error::other(format!("{}: shorter than its checksum", path.display()))
    })?;
    let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32c::crc32c(body) != want {
        return Err(std::io::Error::other(format!(
            "{}: checksum mismatch",
            path.display()
        )));
    }
    Ok(Some(body.to_vec()))
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> std::io::Result<Option<T>> {
    match read_checked(path)? {
        None => Ok(None),
        Some(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display()))),
    }
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    write_checked(path, &bytes)
}

/// The log as loaded: entries by index and where each record starts in the file.
struct LogInner {
    dir: PathBuf,
    file: File,
    /// Bytes of valid records in the file (appends go here).
    len: u64,
    entries: BTreeMap<u64, (Entry<TypeConfig>, u64)>,
    purged: Option<LogId<u64>>,
}

/// The Raft log, vote and committed id (openraft's `RaftLogStorage`).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, cutting off a torn or damaged tail.
    pub fn open(dir: &Path) -> anyhow::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("log");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let purged: Option<LogId<u64>> = read_json(&dir.join("purged"))?;
        let mut entries = BTreeMap::new();
        let mut pos = 0usize;
        while let Some(header) = bytes.get(pos..pos + HEADER) {
            let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
            let Some(body) = bytes.get(pos + HEADER..pos + HEADER + len) else {
                break;
            };
            // An empty record is a zero-filled tail (a crash can leave one), not an entry.
            if len <= 1 || len > RECORD_MAX_BYTES || crc32c::crc32c(body) != crc {
                break;
            }
            // Whole and checked, yet not an entry this binary knows: written by a newer
            // weir (a rollback), not torn. Cutting it would destroy committed entries.
            let entry = serde_json::from_slice::<Entry<TypeConfig>>(body).map_err(|e| {
                anyhow::anyhow!(
                    "controller log {}: the entry at byte {pos} is whole but cannot be read \
                     ({e}); was it written by a newer weir? Nothing was changed",
                    path.display()
                )
            })?;
            let index = entry.log_id.index;
            // A record after a truncation point never survives (truncate cuts the file),
            // so indexes only grow; keep the newest on a repeat all the same.
            entries.split_off(&index);
            entries.insert(index, (entry, pos as u64));
            pos += HEADER + len;
        }
        // Only a tail is cut: damage with a whole record after it is not a torn write, and
        // cutting there would destroy committed entries (found by review).
        if let Some(at) = whole_record_after(&bytes, pos) {
            anyhow::bail!(
                "controller log {}: damaged at byte {pos}, with a whole record at byte {at} \
                 after it; not a torn tail, so nothing was cut. Restore the file, or remove \
                 this voter's controller directory to have it copy the log from the others",
                path.display()
            );
        }
        if pos < bytes.len() {
            tracing::warn!(
                "controller log {}: cutting {} bytes of torn or damaged tail",
                path.display(),
                bytes.len() - pos
            );
            file.set_len(pos as u64)?;
            file.sync_all()?;
        }
        if let Some(p) = purged {
            entries = entries.split_off(&(p.index + 1));
        }
        file.seek(SeekFrom::Start(pos as u64))?;
        Ok(LogStore {
            inner: Arc::new(Mutex::new(LogInner {
                dir: dir.to_path_buf(),
                file,
                len: pos as u64,
                entries,
                purged,
            })),
        })
    }
}

/// The first position after `from` where a whole, checksummed record starts, if any (a
/// zero-filled tail, as a crash can leave, is no record: an entry is never empty).
fn whole_record_after(bytes: &[u8], from: usize) -> Option<usize> {
    (from + 1..bytes.len().saturating_sub(HEADER)).find(|&p| {
        let header = &bytes[p..p + HEADER];
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        len > 1
            && len <= RECORD_MAX_BYTES
            && bytes
                .get(p + HEADER..p + HEADER + len)
                .is_some_and(|body| crc32c::crc32c(body) == crc)
    })
}

fn io_err(e: impl std::error::Error + 'static) -> SErr {
    StorageIOError::write_logs(&e).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let inner = lock(&self.inner);
        Ok(inner
            .entries
            .range(range)
            .map(|(_, (e, _))| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let inner = lock(&self.inner);
        let last = inner.entries.values().next_back().map(|(e, _)| e.log_id);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: last.or(inner.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), SErr> {
        let dir = lock(&self.inner).dir.clone();
        write_json(&dir.join("vote"), vote).map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, SErr> {
        let dir = lock(&self.inner).dir.clone();
        read_json(&dir.join("vote")).map_err(|e| StorageIOError::read_vote(&e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), SErr> {
        let dir = lock(&self.inner).dir.clone();
        write_json(&dir.join("committed"), &committed).map_err(io_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, SErr> {
        let dir = lock(&self.inner).dir.clone();
        let c: Option<Option<LogId<u64>>> = read_json(&dir.join("committed")).map_err(io_err)?;
        Ok(c.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = lock(&self.inner);
        let mut buf = Vec::new();
        let mut added = Vec::new();
        for entry in entries {
            let body = serde_json::to_vec(&entry).map_err(io_err)?;
            let at = inner.len + buf.len() as u64;
            buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
            buf.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
            buf.extend_from_slice(&body);
            added.push((entry, at));
        }
        let written = inner
            .file
            .write_all(&buf)
            .and_then(|()| inner.file.sync_data());
        if let Err(e) = written {
            callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
            return Err(io_err(e));
        }
        inner.len += buf.len() as u64;
        for (entry, at) in added {
            inner.entries.insert(entry.log_id.index, (entry, at));
        }
        drop(inner);
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), SErr> {
        let mut inner = lock(&self.inner);
        let removed = inner.entries.split_off(&log_id.index);
        if let Some((_, at)) = removed.values().next() {
            let at = *at;
            inner.file.set_len(at).map_err(io_err)?;
            inner.file.sync_all().map_err(io_err)?;
            inner.file.seek(SeekFrom::Start(at)).map_err(io_err)?;
            inner.len = at;
        }
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), SErr> {
        let mut inner = lock(&self.inner);
        write_json(&inner.dir.join("purged"), &Some(log_id)).map_err(io_err)?;
        inner.purged = Some(log_id);
        let kept = inner.entries.split_off(&(log_id.index + 1));
        inner.entries = kept;
        // Rewrite the file with what is kept, so it does not grow without bound.
        let mut buf = Vec::new();
        let mut at = BTreeMap::new();
        for (index, (entry, _)) in &inner.entries {
            let body = serde_json::to_vec(entry).map_err(io_err)?;
            at.insert(*index, buf.len() as u64);
            buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
            buf.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
            buf.extend_from_slice(&body);
        }
        let path = inner.dir.join("log");
        write_atomic(&path, &buf).map_err(io_err)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err)?;
        file.seek(SeekFrom::End(0)).map_err(io_err)?;
        inner.file = file;
        inner.len = buf.len() as u64;
        for (index, (_, pos)) in inner.entries.iter_mut() {
            *pos = at.get(index).copied().unwrap_or(0);
        }
        Ok(())
    }
}

/// A snapshot as stored: its meta and the catalogue it holds.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<u64, openraft::BasicNode>,
    catalog: Catalog,
}

struct SmInner {
    dir: PathBuf,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, openraft::BasicNode>,
    snapshot: Option<(SnapshotMeta<u64, openraft::BasicNode>, Vec<u8>)>,
}

/// The state machine: applies commands to the node's catalogue.
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<SmInner>>,
    node: Arc<crate::shard::NodeShared>,
    /// Called after each applied batch (wakes the shards).
    on_apply: Arc<dyn Fn() + Send + Sync>,
}

impl StateMachine {
    /// Loads the last snapshot from `dir` into the catalogue (empty without one).
    pub fn open(
        dir: &Path,
        node: Arc<crate::shard::NodeShared>,
        on_apply: Arc<dyn Fn() + Send + Sync>,
    ) -> anyhow::Result<StateMachine> {
        let stored: Option<SnapshotFile> = read_json(&dir.join("snapshot"))?;
        let mut inner = SmInner {
            dir: dir.to_path_buf(),
            last_applied: None,
            membership: StoredMembership::default(),
            snapshot: None,
        };
        if let Some(s) = stored {
            let data = serde_json::to_vec(&s.catalog)?;
            node.meta
                .replace(s.catalog)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            inner.last_applied = s.meta.last_log_id;
            inner.membership = s.meta.last_membership.clone();
            inner.snapshot = Some((s.meta, data));
        }
        Ok(StateMachine {
            inner: Arc::new(Mutex::new(inner)),
            node,
            on_apply,
        })
    }

    fn meta(&self) -> &MetaStore {
        &self.node.meta
    }
}

fn sm_err(e: impl std::error::Error + 'static) -> SErr {
    StorageIOError::write_state_machine(&e).into()
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        // The catalogue and the applied id are read under the state machine's lock, which
        // `apply` holds while it changes both.
        let mut inner = lock(&self.inner);
        let catalog = (*self.meta().snapshot()).clone();
        let last = inner.last_applied;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: inner.membership.clone(),
            snapshot_id: format!(
                "{}-{}",
                last.map_or(0, |l| l.leader_id.term),
                last.map_or(0, |l| l.index)
            ),
        };
        let data = serde_json::to_vec(&catalog).map_err(sm_err)?;
        let file = SnapshotFile {
            meta: meta.clone(),
            catalog,
        };
        write_json(&inner.dir.join("snapshot"), &file).map_err(sm_err)?;
        inner.snapshot = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<u64>>,
            StoredMembership<u64, openraft::BasicNode>,
        ),
        SErr,
    > {
        let inner = lock(&self.inner);
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let before = self.meta().version();
        let mut inner = lock(&self.inner);
        let mut out = Vec::new();
        for entry in entries {
            inner.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => Outcome::Noted,
                EntryPayload::Normal(cmd) => apply_one(self.meta(), &cmd),
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m);
                    Outcome::Noted
                }
            };
            out.push(outcome);
        }
        drop(inner);
        // Only a changed image is announced: every shard re-syncs all its partitions on a
        // notice, and a refused or no-op command (a create that failed its checks, a
        // node registering as it already is) changes nothing to sync.
        if self.meta().version() != before {
            (self.on_apply)();
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let data = snapshot.into_inner();
        let catalog: Catalog = serde_json::from_slice(&data).map_err(sm_err)?;
        let mut inner = lock(&self.inner);
        let file = SnapshotFile {
            meta: meta.clone(),
            catalog: catalog.clone(),
        };
        write_json(&inner.dir.join("snapshot"), &file).map_err(sm_err)?;
        self.meta()
            .replace(catalog)
            .map_err(|e| sm_err(std::io::Error::other(e.to_string())))?;
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.snapshot = Some((meta.clone(), data));
        drop(inner);
        (self.on_apply)();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        let inner = lock(&self.inner);
        Ok(inner.snapshot.as_ref().map(|(meta, data)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(data.clone())),
        }))
    }
}

/// Applies one committed command to the catalogue (placing partitions on nodes).
fn apply_one(meta: &MetaStore, cmd: &Command) -> Outcome {
    match meta.update_batch(|c| apply::apply(c, cmd, true)) {
        Ok(out) => out,
        Err(e) => apply::write_failed(cmd, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn record(index: u64) -> Vec<u8> {
        let entry: Entry<TypeConfig> = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Command::DeleteTopic {
                name: format!("t{index}"),
                id: None,
            }),
        };
        let body = serde_json::to_vec(&entry).expect("encode");
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn temp_dir() -> tempfile::TempDir {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
        std::fs::create_dir_all(&root).expect("root");
        tempfile::tempdir_in(root).expect("tempdir")
    }

    #[test]
    fn a_torn_or_damaged_log_tail_is_cut_on_open() {
        let dir = temp_dir();
        let good: Vec<u8> = (1..=3).flat_map(record).collect();
        for tail in [
            record(4)[..7].to_vec(),  // torn header
            record(4)[..20].to_vec(), // torn body
            {
                let mut r = record(4);
                let last = r.len() - 1;
                r[last] ^= 0xff; // damaged body: checksum mismatch
                r
            },
        ] {
            let mut bytes = good.clone();
            bytes.extend_from_slice(&tail);
            std::fs::write(dir.path().join("log"), &bytes).expect("write");
            let store = LogStore::open(dir.path()).expect("open");
            let inner = lock(&store.inner);
            assert_eq!(inner.entries.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
            assert_eq!(inner.len, good.len() as u64);
            drop(inner);
            let on_disk = std::fs::metadata(dir.path().join("log"))
                .expect("stat")
                .len();
            assert_eq!(on_disk, good.len() as u64, "the tail is cut from the file");
        }
    }

    /// Damage with whole records after it, or a whole record this binary cannot read,
    /// is an error that leaves the file as it was: never a cut of committed entries.
    #[test]
    fn damage_before_whole_records_or_an_unknown_entry_is_refused_not_cut() {
        let dir = temp_dir();
        let mut damaged = record(2);
        let last = damaged.len() - 1;
        damaged[last] ^= 0xff;
        let mut unknown = br#"{"not":"an entry"}"#.to_vec();
        let crc = crc32c::crc32c(&unknown);
        let mut framed = (unknown.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(&crc.to_le_bytes());
        framed.append(&mut unknown);
        for bytes in [
            [record(1), damaged, record(3), record(4)].concat(),
            [record(1), framed, record(3)].concat(),
        ] {
            std::fs::write(dir.path().join("log"), &bytes).expect("write");
            assert!(LogStore::open(dir.path()).is_err());
            let on_disk = std::fs::read(dir.path().join("log")).expect("read");
            assert_eq!(on_disk, bytes, "nothing cut");
        }
        // A zero-filled tail is still a torn tail.
        let bytes = [record(1), vec![0; 64]].concat();
        std::fs::write(dir.path().join("log"), &bytes).expect("write");
        let store = LogStore::open(dir.path()).expect("open");
        assert_eq!(lock(&store.inner).entries.len(), 1);
    }

    #[test]
    fn a_damaged_state_file_is_an_error_not_a_default() {
        let dir = temp_dir();
        let path = dir.path().join("vote");
        write_json(&path, &Some(7u64)).expect("write");
        assert_eq!(
            read_json::<Option<u64>>(&path).expect("read"),
            Some(Some(7))
        );
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        std::fs::write(&path, &bytes).expect("write");
        assert!(read_json::<Option<u64>>(&path).is_err());
        assert!(
            read_json::<u64>(&dir.path().join("absent"))
                .expect("absent")
                .is_none()
        );
    }
}
