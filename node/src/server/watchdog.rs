//! The shard watchdog: says, in the log, when a shard thread stops running its reactor.
//!
//! Every shard runs a tiny task that stamps the time into its [`ShardBeat`] twice a second.
//! A plain thread (not a shard: a stuck shard cannot report on itself) looks at the stamps
//! once a second. A shard whose stamp is older than `weir.shard.stall.warn.ms` is stuck —
//! blocked in a system call, spinning in one task, or parked with nobody to wake it — and
//! the watchdog logs what the kernel says that thread is doing (`/proc/self/task/TID/`:
//! state, wchan, the system call and, for root, its kernel stack), once per episode, and
//! again when the shard runs again. Without it such a shard is a silent hang: requests
//! routed to it time out and SIGTERM is not answered, with nothing in the log.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, Ordering};
use std::time::Duration;

use crate::shard::now_ms;

/// The default of `weir.shard.stall.warn.ms`: far above any pause a healthy shard takes (a
/// housekeeping pass, a segment roll), so a warning always means something is wrong.
pub const STALL_WARN_MS_DEFAULT: i64 = 5_000;
/// How often a shard stamps its beat.
const BEAT_EVERY: Duration = Duration::from_millis(500);
/// How often the watchdog looks.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// One shard's liveness stamp.
#[derive(Debug, Default)]
pub struct ShardBeat {
    /// The shard thread's kernel thread id (0 until the shard started).
    tid: AtomicI32,
    /// When the shard last ran its beat task (ms since the epoch).
    at_ms: AtomicI64,
}

/// The beats of all shards and the flag that ends the watchdog.
#[derive(Debug)]
pub struct Watchdog {
    beats: Vec<Arc<ShardBeat>>,
    stopping: AtomicBool,
}

impl Watchdog {
    pub fn new(shards: usize) -> Arc<Self> {
        Arc::new(Self {
            beats: (0..shards).map(|_| Arc::default()).collect(),
            stopping: AtomicBool::new(false),
        })
    }

    pub fn beat_of(&self, shard: usize) -> Arc<ShardBeat> {
        self.beats[shard].clone()
    }

    /// Ends the watchdog thread at its next look: shutdown is not a stall.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Starts the watchdog thread (`warn_ms` ≤ 0: no thread).
    pub fn spawn(self: &Arc<Self>, warn_ms: i64) -> std::io::Result<()> {
        if warn_ms <= 0 {
            return Ok(());
        }
        let dog = self.clone();
        std::thread::Builder::new()
            .name("weir-watchdog".into())
            .spawn(move || dog.run(warn_ms))
            .map(|_| ())
    }

    fn run(&self, warn_ms: i64) {
        // Per shard: since when it has been reported stuck (None: it is running).
        let mut stuck_since: Vec<Option<i64>> = vec![None; self.beats.len()];
        while !self.stopping.load(Ordering::Relaxed) {
            std::thread::sleep(LOOK_EVERY);
            for notice in self.look(now_ms(), warn_ms, &mut stuck_since) {
                match notice {
                    Notice::Stuck {
                        shard,
                        tid,
                        quiet_ms,
                        report,
                    } => tracing::warn!(
                        shard,
                        tid,
                        "shard has not run its reactor for {quiet_ms} ms: {report}"
                    ),
                    Notice::Ran {
                        shard,
                        tid,
                        after_ms,
                    } => tracing::warn!(shard, tid, "shard ran again after {after_ms} ms"),
                }
            }
        }
    }

    /// One look at every beat: a shard quiet for more than `warn_ms` is reported once,
    /// and again when it stamps after that.
    fn look(&self, now: i64, warn_ms: i64, stuck_since: &mut [Option<i64>]) -> Vec<Notice> {
        let mut notices = Vec::new();
        for (shard, beat) in self.beats.iter().enumerate() {
            let (tid, at) = (
                beat.tid.load(Ordering::Acquire),
                beat.at_ms.load(Ordering::Relaxed),
            );
            if tid == 0 || self.stopping.load(Ordering::Relaxed) {
                stuck_since[shard] = None;
                continue;
            }
            let quiet_ms = now - at;
            match stuck_since[shard] {
                None if quiet_ms > warn_ms => {
                    stuck_since[shard] = Some(at);
                    notices.push(Notice::Stuck {
                        shard,
                        tid,
                        quiet_ms,
                        report: thread_report(tid),
                    });
                }
                Some(since) if at > since => {
                    stuck_since[shard] = None;
                    notices.push(Notice::Ran {
                        shard,
                        tid,
                        after_ms: at - since,
                    });
                }
                _ => {}
            }
        }
        notices
    }
}

/// What one look found.
#[derive(Debug)]
enum Notice {
    Stuck {
        shard: usize,
        tid: i32,
        quiet_ms: i64,
        report: String,
    },
    Ran {
        shard: usize,
        tid: i32,
        after_ms: i64,
    },
}

impl ShardBeat {
    /// The shard ended (its executor returns): a beat that stops now is not a stall.
    pub fn finished(&self) {
        self.tid.store(0, Ordering::Relaxed);
    }
}

/// Run on the shard's executor for its lifetime: records the thread id, then stamps.
pub async fn beat(beat: Arc<ShardBeat>) {
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    // The stamp before the thread id (Release, read with Acquire): the watchdog never
    // sees a started shard with the empty stamp 0, which would read as a 56-year stall.
    beat.at_ms.store(now_ms(), Ordering::Relaxed);
    beat.tid.store(tid, Ordering::Release);
    loop {
        beat.at_ms.store(now_ms(), Ordering::Relaxed);
        glommio::timer::sleep(BEAT_EVERY).await;
    }
}

/// What the kernel says thread `tid` of this process is doing, on one line.
fn thread_report(tid: i32) -> String {
    let dir = format!("/proc/self/task/{tid}");
    let read = |name: &str| {
        std::fs::read_to_string(format!("{dir}/{name}"))
            .map(|s| s.trim().replace('\n', " | "))
            .unwrap_or_else(|e| format!("({e})"))
    };
    // The state is the field after the parenthesised command name.
    let stat = read("stat");
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("?")
        .to_string();
    format!(
        "state {state}, wchan {}, syscall [{}], kernel stack [{}]",
        read("wchan"),
        read("syscall"),
        read("stack")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_on_this_thread_names_its_state() {
        // SAFETY: as in `beat`.
        let tid = unsafe { libc::gettid() };
        let report = thread_report(tid);
        // The reporting thread itself is running.
        assert!(report.starts_with("state R"), "{report}");
        assert!(report.contains("syscall ["), "{report}");
    }

    /// A "shard" thread stamps once and then blocks in a system call: the look after
    /// `warn_ms` reports it once, with the kernel's view of the blocked thread, and reports
    /// it running again after its next stamp.
    #[test]
    fn a_blocked_shard_thread_is_reported_once_and_again_when_it_runs() {
        let dog = Watchdog::new(2);
        let beat = dog.beat_of(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let blocked = std::thread::spawn({
            let beat = beat.clone();
            move || {
                // SAFETY: as in `beat`.
                beat.tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
                beat.at_ms.store(1_000, Ordering::Relaxed);
                started_tx.send(()).unwrap();
                // Blocked in a futex wait until the test lets go.
                let _ = rx.recv();
            }
        });
        started_rx.recv().unwrap();
        let mut stuck = vec![None; 2];
        assert!(
            dog.look(5_000, 5_000, &mut stuck).is_empty(),
            "4 s quiet is not a stall"
        );
        // The blocked thread may not have entered its wait yet: look until it has.
        let report = (0..200)
            .find_map(|_| {
                let mut fresh = vec![None; 2];
                let notices = dog.look(7_000, 5_000, &mut fresh);
                match notices.as_slice() {
                    [
                        Notice::Stuck {
                            shard: 1,
                            quiet_ms: 6_000,
                            report,
                            ..
                        },
                    ] if report.starts_with("state S") => Some(report.clone()),
                    _ => {
                        std::thread::sleep(Duration::from_millis(10));
                        None
                    }
                }
            })
            .expect("the blocked thread is reported as sleeping");
        assert!(report.contains("wchan "), "{report}");
        let first = dog.look(7_000, 5_000, &mut stuck);
        assert!(
            matches!(first.as_slice(), [Notice::Stuck { shard: 1, .. }]),
            "{first:?}"
        );
        assert!(
            dog.look(9_000, 5_000, &mut stuck).is_empty(),
            "reported once per episode"
        );
        beat.at_ms.store(9_500, Ordering::Relaxed);
        let again = dog.look(10_000, 5_000, &mut stuck);
        assert!(
            matches!(
                again.as_slice(),
                [Notice::Ran {
                    shard: 1,
                    after_ms: 8_500,
                    ..
                }]
            ),
            "{again:?}"
        );
        // A shard that ended is never reported.
        beat.finished();
        assert!(dog.look(60_000, 5_000, &mut stuck).is_empty());
        tx.send(()).unwrap();
        blocked.join().unwrap();
    }

    #[test]
    fn a_missing_thread_is_reported_without_panicking() {
        let report = thread_report(i32::MAX);
        assert!(report.starts_with("state ?"), "{report}");
    }
}
