//! Gives a retired segment's disk space back a step at a time, on one thread per process.
//!
//! On ext4 mounted with `discard` (this VM's root, and a common setting on SSDs), the
//! blocks a file frees are discarded when the journal commits the free, and the commit
//! waits for the discard. Unlinking a whole 128 MiB segment at once made one commit
//! discard all of it, and every O_DIRECT append on the filesystem that needed the journal
//! (each one that extends its segment) waited behind it: with retention deleting segments,
//! acks=all publish p99 went from 1.7 ms to 80–90 ms (docs/PERFORMANCE.md, "Retention and
//! the discard stall"). So a retired file is cut [`STEP_BYTES`] from its end at a time,
//! each cut committed at once (fsync) so its discard stays small, and unlinked when empty.
//! One thread serves every shard, so two deletions never share a commit.
//!
//! A crash leaves the `.log.deleted` file, whole or cut; the next open removes it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::time::Duration;

/// Bytes freed per committed step: ~0.7 ms of discard per MiB on this VM's disk bounds a
/// step's stall to a few ms.
const STEP_BYTES: u64 = 4 << 20;
/// Pause between steps while nothing else waits, so appends get the journal between them.
/// With a backlog the steps run back to back (the space must come back at the rate
/// retention frees it).
const STEP_PAUSE: Duration = Duration::from_millis(5);

/// Files waiting beyond which the steps run back to back.
const BACKLOG_NO_PAUSE: usize = 16;

struct Reclaimer {
    queue: Sender<PathBuf>,
}

static RECLAIMER: OnceLock<Option<Reclaimer>> = OnceLock::new();
/// Files sent to the reclaim thread and not yet removed.
static WAITING: AtomicUsize = AtomicUsize::new(0);
static HANDED_OVER: AtomicUsize = AtomicUsize::new(0);

/// How many retired segment files this process has handed to [`reclaim`] so far.
pub fn retired_files_handed_over() -> usize {
    HANDED_OVER.load(Ordering::Relaxed)
}

/// Removes `path` (a retired segment file) off the caller's thread, a step at a time. If
/// the reclaim thread cannot be started, removes it at once.
pub fn reclaim(path: PathBuf) {
    HANDED_OVER.fetch_add(1, Ordering::Relaxed);
    let reclaimer = RECLAIMER.get_or_init(start);
    let path = match reclaimer {
        Some(r) => {
            WAITING.fetch_add(1, Ordering::Relaxed);
            match r.queue.send(path) {
                Ok(()) => return,
                Err(mpsc::SendError(path)) => {
                    WAITING.fetch_sub(1, Ordering::Relaxed);
                    path
                }
            }
        }
        None => path,
    };
    remove_logged(&path, fs::remove_file(&path));
}

fn start() -> Option<Reclaimer> {
    let (queue, files) = mpsc::channel::<PathBuf>();
    let spawned = std::thread::Builder::new()
        .name("weir-reclaim".into())
        .spawn(move || {
            for path in files {
                let result = shrink_then_remove(&path, &WAITING);
                WAITING.fetch_sub(1, Ordering::Relaxed);
                remove_logged(&path, result);
            }
        });
    match spawned {
        Ok(_) => Some(Reclaimer { queue }),
        Err(e) => {
            tracing::warn!(error = %e, "no reclaim thread: retired segments are unlinked at once");
            None
        }
    }
}

/// Cuts `path` from its end `STEP_BYTES` at a time, each cut synced, then unlinks it.
fn shrink_then_remove(path: &Path, waiting: &AtomicUsize) -> std::io::Result<()> {
    let file = fs::OpenOptions::new().write(true).open(path)?;
    let mut len = file.metadata()?.len();
    while len > STEP_BYTES {
        len -= STEP_BYTES;
        file.set_len(len)?;
        file.sync_all()?;
        if waiting.load(Ordering::Relaxed) <= BACKLOG_NO_PAUSE {
            std::thread::sleep(STEP_PAUSE);
        }
    }
    drop(file);
    fs::remove_file(path)
}

fn remove_logged(path: &Path, result: std::io::Result<()>) {
    if let Err(e) = result
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(file = %path.display(), error = %e, "could not delete a retired segment");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retired_file_is_cut_in_steps_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("00000000000000000000.log.deleted");
        let file = fs::File::create(&path).expect("create");
        file.set_len(3 * STEP_BYTES + 5).expect("size");
        drop(file);
        let waiting = AtomicUsize::new(1);
        shrink_then_remove(&path, &waiting).expect("reclaim");
        assert!(!path.exists());
        // Through the thread: the file goes without the caller waiting for it.
        let path = dir.path().join("00000000000000000001.log.deleted");
        fs::File::create(&path)
            .and_then(|f| f.set_len(STEP_BYTES + 1))
            .expect("create");
        reclaim(path.clone());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while path.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!path.exists(), "the reclaim thread removed the file");
    }
}
