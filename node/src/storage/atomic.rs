//! Atomic file replacement (write temp, fsync, rename, fsync dir) for small metadata files:
//! producer-state snapshots, the leader-epoch checkpoint, `partition.metadata`; and the
//! same without fsyncs for a file every open checks and rewrites (a new partition's
//! `partition.metadata`).

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use super::error::{Result, StorageError};

/// Replaces `path` with `contents` so that after a crash the file holds either the old or
/// the new contents, never a mix: write `path.tmp`, fsync it, rename over `path`, fsync
/// the directory (the rename is only durable once the directory is).
///
/// Blocking std I/O: these files are small and written rarely (checkpoints, snapshots).
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let (file, tmp) = write_temp(path, contents)?;
    file.sync_all()
        .map_err(|e| StorageError::io("fsync", &tmp, e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| StorageError::io("rename", path, e))?;
    sync_dir(dir)
}

/// Writes `contents` to `path.tmp` (created or emptied) and returns it still open.
fn write_temp(path: &Path, contents: &[u8]) -> Result<(File, std::path::PathBuf)> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut file = File::create(&tmp).map_err(|e| StorageError::io("create", &tmp, e))?;
    file.write_all(contents)
        .map_err(|e| StorageError::io("write", &tmp, e))?;
    Ok((file, tmp))
}

/// [`write_atomic`] for a file whose loss costs only time (a producer-state snapshot, whose
/// checksum rejects a torn one at the next open): written and renamed now, with no fsync
/// on the caller's thread; the file and the directory are fsynced in glommio's blocking
/// pool, in the background. On a shard an fsync stops every request of the shard for its
/// whole length (milliseconds, tens of them while the disk is busy).
pub fn write_atomic_synced_later(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let (file, tmp) = write_temp(path, contents)?;
    fs::rename(&tmp, path).map_err(|e| StorageError::io("rename", path, e))?;
    let shown = path.to_path_buf();
    let synced = glommio::executor().spawn_blocking(move || {
        file.sync_all()?;
        File::open(&dir).and_then(|d| d.sync_all())
    });
    glommio::spawn_local(async move {
        if let Err(e) = synced.await {
            tracing::warn!(path = %shown.display(), "background fsync failed: {e}");
        }
    })
    .detach();
    Ok(())
}

/// Replaces `path` with `contents` (write `path.tmp`, rename over `path`) without any
/// fsync: a reader never sees a mix of old and new, but after a crash the file may be
/// missing or empty. Only for a file that is checked and rewritten whenever it does not
/// hold what it should (`partition.metadata`).
pub fn replace_unsynced(path: &Path, contents: &[u8]) -> Result<()> {
    let (file, tmp) = write_temp(path, contents)?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| StorageError::io("rename", path, e))
}

/// fsyncs a directory so that creations, renames and removals in it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io("fsync dir", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_contents_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
        let path = dir.path().join("leader-epoch-checkpoint");
        write_atomic(&path, b"0\n1\n0 0\n").unwrap();
        write_atomic(&path, b"0\n1\n3 100\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"0\n1\n3 100\n");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
