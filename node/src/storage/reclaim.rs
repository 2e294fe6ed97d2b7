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
//! A retired segment is left whole for `file.delete.delay.ms` first (Kafka's delay, 60 s by
//! default): a read planned on it before it was retired reads through the fd it holds,
//! and the cut would pull the bytes out from under it (KAFKA_STORAGE_ERROR). The thread
//! keeps the files waiting for their delay in a heap by due time.
//!
//! A crash or a shutdown leaves the `.log.deleted` file, whole or cut; the next open of its
//! partition removes it, and the thread sweeps every partition directory once at start
//! for files an earlier process retired ([`retire_leftovers`]).
//!
//! A deleted partition's whole directory goes the same way ([`retire_dir`]): renamed
//! aside at once (`<dir>.<nanos>-delete`, Kafka's shape), then its segments cut in steps
//! and the rest removed on the reclaim thread. Unlinked on a shard's thread, a large
//! partition's segments stalled every partition of that shard for seconds. A crash leaves
//! the renamed directory; [`retire_leftovers`] at the next start hands it over again.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// Bytes freed per committed step: ~0.7 ms of discard per MiB on this VM's disk bounds a
/// step's stall to a few ms.
const STEP_BYTES: u64 = 4 << 20;
/// Pause between steps while nothing else waits, so appends get the journal between them.
/// With a backlog the steps run back to back (the space must come back at the rate
/// retention frees it).
const STEP_PAUSE: Duration = Duration::from_millis(5);

/// Files waiting beyond which the steps run back to back.
const BACKLOG_NO_PAUSE: usize = 16;

/// What the reclaim thread removes.
enum Job {
    /// A retired segment file, removed once `Instant` passed.
    File(PathBuf, Instant),
    /// A retired partition directory: its files cut in steps, then the directory.
    Dir(PathBuf),
    /// The data dir at start: the retired segment files an earlier process left in its
    /// partition directories, removed now (their delay died with that process).
    Leftovers(PathBuf),
}

/// When this process started retiring (nanoseconds since the epoch): a retired file named
/// earlier is an earlier process's leftover.
static STARTED_NANOS: OnceLock<u128> = OnceLock::new();
/// Tells apart files retired in the same nanosecond.
static RETIRED_SEQ: AtomicUsize = AtomicUsize::new(0);

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// `<stem>.<nanos>-<n><suffix>`: a retired file's name, unique in this process and
/// stamped with when it was retired.
pub(super) fn retired_name(stem: &str, suffix: &str) -> String {
    STARTED_NANOS.get_or_init(now_nanos);
    let n = RETIRED_SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{stem}.{}-{n}{suffix}", now_nanos())
}

/// Whether the retired segment file `name` is an earlier process's leftover (this
/// process's own wait for their delay on the reclaim thread).
pub(super) fn is_leftover(name: &str) -> bool {
    retired_before_start(name, *STARTED_NANOS.get_or_init(now_nanos))
}

/// Whether the retired file `name` is a leftover of an earlier process: retired before
/// this one started (or named without a stamp, by an older weir).
fn retired_before_start(name: &str, started: u128) -> bool {
    let stamp = name
        .strip_suffix(super::open::RETIRED_LOG_SUFFIX)
        .and_then(|rest| rest.rsplit_once('.'))
        .and_then(|(_, stamp)| stamp.split_once('-'))
        .and_then(|(nanos, _)| nanos.parse::<u128>().ok());
    stamp.is_none_or(|nanos| nanos < started)
}

/// Retired files the reclaim thread holds until their delay passed, at most: beyond it the
/// earliest is removed early (a bound on the thread's memory; at one retired segment per
/// partition per minute it takes 100,000 partitions retiring at once).
const DELAYED_MAX: usize = 100_000;

struct Reclaimer {
    queue: Sender<Job>,
}

/// The suffix of a retired partition directory's name.
const RETIRED_DIR_SUFFIX: &str = "-delete";

static RECLAIMER: OnceLock<Option<Reclaimer>> = OnceLock::new();
/// Directories sent to the reclaim thread and files due, not yet removed (the backlog).
static WAITING: AtomicUsize = AtomicUsize::new(0);
static HANDED_OVER: AtomicUsize = AtomicUsize::new(0);

/// How many retired segment files this process has handed to [`reclaim`] so far.
pub fn retired_files_handed_over() -> usize {
    HANDED_OVER.load(Ordering::Relaxed)
}

/// Removes `path` (a retired segment file) off the caller's thread, a step at a time, once
/// `delay` (`file.delete.delay.ms`) passed. If the reclaim thread cannot be started,
/// removes it at once.
pub fn reclaim(path: PathBuf, delay: Duration) {
    HANDED_OVER.fetch_add(1, Ordering::Relaxed);
    hand_over(Job::File(path, Instant::now() + delay));
}

/// Retires a deleted partition's directory: renamed aside now (a rename, cheap on the
/// caller's thread; the partition's name is free again at once), removed in steps on
/// the reclaim thread.
pub fn retire_dir(dir: &Path) -> std::io::Result<()> {
    let nanos = now_nanos();
    let mut name = dir.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{nanos}{RETIRED_DIR_SUFFIX}"));
    let retired = dir.with_file_name(name);
    fs::rename(dir, &retired)?;
    hand_over(Job::Dir(retired));
    Ok(())
}

/// Hands the retired directories a crash left in `data_dir` to the reclaim thread, and
/// has it sweep the partition directories for retired segment files an earlier process
/// left (a shutdown within `file.delete.delay.ms` of a retention; a partition that is not
/// opened again would keep them for ever).
pub fn retire_leftovers(data_dir: &Path) {
    STARTED_NANOS.get_or_init(now_nanos);
    hand_over(Job::Leftovers(data_dir.to_path_buf()));
    let Ok(entries) = fs::read_dir(data_dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let retired = e
            .file_name()
            .to_string_lossy()
            .ends_with(RETIRED_DIR_SUFFIX);
        if retired && e.file_type().is_ok_and(|t| t.is_dir()) {
            hand_over(Job::Dir(e.path()));
        }
    }
}

fn hand_over(job: Job) {
    let reclaimer = RECLAIMER.get_or_init(start);
    // A file waiting for its delay is no backlog yet: it counts once due (`serve`).
    let counted = usize::from(matches!(job, Job::Dir(_) | Job::Leftovers(_)));
    let job = match reclaimer {
        Some(r) => {
            WAITING.fetch_add(counted, Ordering::Relaxed);
            match r.queue.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => {
                    WAITING.fetch_sub(counted, Ordering::Relaxed);
                    job
                }
            }
        }
        None => job,
    };
    run(&job, &AtomicUsize::new(0));
}

fn run(job: &Job, waiting: &AtomicUsize) {
    match job {
        Job::File(path, _) => remove_logged(path, shrink_then_remove(path, waiting)),
        Job::Dir(dir) => remove_logged(dir, remove_dir_in_steps(dir, waiting)),
        Job::Leftovers(data_dir) => {
            for path in leftover_files(data_dir) {
                remove_logged(&path, shrink_then_remove(&path, waiting));
            }
        }
    }
}

/// The retired segment files of `data_dir`'s partition directories that an earlier process
/// retired (see [`retired_before_start`]).
fn leftover_files(data_dir: &Path) -> Vec<PathBuf> {
    let started = *STARTED_NANOS.get_or_init(now_nanos);
    let Ok(dirs) = fs::read_dir(data_dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for d in dirs.filter_map(Result::ok) {
        if !d.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = fs::read_dir(d.path()) else {
            continue;
        };
        for f in files.filter_map(Result::ok) {
            let name = f.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(super::open::RETIRED_LOG_SUFFIX)
                && retired_before_start(&name, started)
            {
                found.push(f.path());
            }
        }
    }
    found
}

/// The reclaim thread: directories at once, files once their delay passed (earliest
/// first), until every sender is gone.
fn serve(jobs: mpsc::Receiver<Job>) {
    let mut delayed: BinaryHeap<Reverse<(Instant, PathBuf)>> = BinaryHeap::new();
    loop {
        let next = match delayed.peek() {
            Some(Reverse((due, _))) => {
                jobs.recv_timeout(due.saturating_duration_since(Instant::now()))
            }
            None => jobs.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(Job::File(path, due)) => delayed.push(Reverse((due, path))),
            Ok(job) => {
                run(&job, &WAITING);
                WAITING.fetch_sub(1, Ordering::Relaxed);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        let mut due_now = Vec::new();
        while let Some(Reverse((due, _))) = delayed.peek() {
            if *due > now && delayed.len() <= DELAYED_MAX {
                break;
            }
            due_now.extend(
                delayed
                    .pop()
                    .map(|Reverse((due, path))| Job::File(path, due)),
            );
        }
        // Only files that are due count as a backlog (the steps then run back to back).
        WAITING.fetch_add(due_now.len(), Ordering::Relaxed);
        for job in due_now {
            run(&job, &WAITING);
            WAITING.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn start() -> Option<Reclaimer> {
    let (queue, jobs) = mpsc::channel::<Job>();
    let spawned = std::thread::Builder::new()
        .name("weir-reclaim".into())
        .spawn(move || serve(jobs));
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

/// Cuts every file of `dir` in steps (see [`shrink_then_remove`]), then removes `dir`.
fn remove_dir_in_steps(dir: &Path, waiting: &AtomicUsize) -> std::io::Result<()> {
    for e in fs::read_dir(dir)?.filter_map(Result::ok) {
        if e.file_type().is_ok_and(|t| t.is_file()) {
            remove_logged(&e.path(), shrink_then_remove(&e.path(), waiting));
        }
    }
    fs::remove_dir_all(dir)
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

    /// A retired file is named with when it was retired, uniquely: the same base retired
    /// twice within the delay keeps two files. At start, only an earlier process's files
    /// (stamped before this one started, or unstamped by an older weir) are swept from the
    /// partition directories; files this process retired wait for their delay (found by
    /// review: a shutdown within the delay left them for ever on partitions not opened
    /// again).
    #[test]
    fn leftovers_of_an_earlier_process_are_swept_and_this_ones_wait() {
        let a = retired_name("00000000000000000007", ".log.deleted");
        let b = retired_name("00000000000000000007", ".log.deleted");
        assert_ne!(a, b, "the same base retired twice keeps two names");
        assert!(!is_leftover(&a), "this process's own: {a}");
        assert!(is_leftover("00000000000000000007.log.deleted"), "unstamped");
        assert!(
            is_leftover("00000000000000000007.5-0.log.deleted"),
            "stamped long ago"
        );
        let data = tempfile::tempdir().expect("tempdir");
        let part = data.path().join("t-0");
        fs::create_dir(&part).expect("partition dir");
        let old = part.join("00000000000000000000.log.deleted");
        let stamped_old = part.join("00000000000000000003.1000-0.log.deleted");
        let own = part.join(&a);
        let segment = part.join("00000000000000000009.log");
        for p in [&old, &stamped_old, &own, &segment] {
            fs::write(p, b"x").expect("write");
        }
        run(
            &Job::Leftovers(data.path().to_path_buf()),
            &AtomicUsize::new(0),
        );
        assert!(!old.exists() && !stamped_old.exists(), "leftovers swept");
        assert!(
            own.exists(),
            "this process's retired file waits for its delay"
        );
        assert!(segment.exists(), "segments are not the sweep's");
    }

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
        reclaim(path.clone(), Duration::ZERO);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while path.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!path.exists(), "the reclaim thread removed the file");
    }

    #[test]
    fn a_retired_directory_is_renamed_at_once_and_removed_later_also_after_a_crash() {
        let data = tempfile::tempdir().expect("tempdir");
        let dir = data.path().join("orders-0");
        fs::create_dir(&dir).expect("dir");
        fs::File::create(dir.join("00000000000000000000.log"))
            .and_then(|f| f.set_len(2 * STEP_BYTES + 1))
            .expect("segment");
        fs::write(dir.join("00000000000000000000.index"), b"x").expect("index");
        retire_dir(&dir).expect("retire");
        assert!(!dir.exists(), "the partition's name is free at once");
        // A directory a crash left behind.
        let left = data.path().join("orders-1.123-delete");
        fs::create_dir(&left).expect("leftover");
        fs::write(left.join("00000000000000000000.log"), b"x").expect("segment");
        retire_leftovers(data.path());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let empty = || fs::read_dir(data.path()).is_ok_and(|mut e| e.next().is_none());
        while !empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(empty(), "everything removed by the reclaim thread");
    }
}
