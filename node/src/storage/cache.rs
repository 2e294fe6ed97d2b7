//! [`TailCache`]: the most recently appended batches, in memory, so that fetches of recent
//! data (consumers and followers that keep up, or are a little behind) never touch the
//! disk, and so that batches whose DMA write is still pending are readable.
//!
//! weir writes with O_DIRECT, so the kernel's page cache does not hold what was just
//! written, as it does for Kafka. These caches stand in for it: every log's cache is
//! bounded by its own `log.tail.cache.bytes`, and all caches of one shard together by the
//! shard's share of the node's `log.tail.cache.max.bytes`. When the shard is over its share,
//! the batches appended longest ago leave first, whichever log holds them (one queue of
//! every push on the shard, in order), so an idle partition's old batches do not keep a
//! busy one from caching. A batch not yet written never leaves.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::{Rc, Weak};

use bytes::Bytes;
use wire::Offset;

/// Default bound on the bytes all tail caches of one shard hold together, before the
/// node's `log.tail.cache.max.bytes` sets the shard's share.
pub const SHARD_CACHE_BYTES_DEFAULT: u64 = 256 << 20;

/// The node's default `log.tail.cache.max.bytes`.
pub const NODE_CACHE_BYTES_DEFAULT: u64 = 512 << 20;

/// The node's default `log.tail.cache.max.bytes`: [`NODE_CACHE_BYTES_DEFAULT`], or an
/// eighth of the memory the process may use (the machine's, or the smallest cgroup limit
/// above it) when that is less.
///
/// Not more by default, although Kafka reads recent data from the page cache (all free
/// memory): the memory a cache grows into is new to the process, and on the VMs measured
/// faulting it in (the kernel zeroing every page) cost produce more than half again its
/// CPU per byte until the cache was full (docs/PERFORMANCE.md). A node that serves
/// consumers further behind sets more, and pays that once per start.
pub fn node_cache_bytes_default() -> u64 {
    let physical = physical_memory_bytes().unwrap_or(8 << 30);
    let limit = cgroup_memory_limit().map_or(physical, |l| l.min(physical));
    NODE_CACHE_BYTES_DEFAULT.min(limit / 8)
}

fn physical_memory_bytes() -> Option<u64> {
    // SAFETY: sysconf reads a system constant; it has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page > 0).then(|| pages as u64 * page as u64)
}

/// The smallest memory limit of this process's cgroup and its ancestors: cgroup v2's
/// `memory.max`, or v1's `memory.limit_in_bytes` ("max", v1's huge "unlimited" value and
/// missing files mean none, the last by being above the machine's memory).
fn cgroup_memory_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_memory_limit_in(&own, std::path::Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_memory_limit`] for a `/proc/<pid>/cgroup` text and the cgroup file systems
/// mounted at `sys_root` (v2 at its root, v1's memory controller at `memory/`).
fn cgroup_memory_limit_in(proc_cgroup: &str, sys_root: &std::path::Path) -> Option<u64> {
    let mut limits = Vec::new();
    for line in proc_cgroup.lines() {
        let (root, file, group) = if let Some(g) = line.strip_prefix("0::") {
            (sys_root.to_path_buf(), "memory.max", g)
        } else if let Some((_, g)) = line.split_once(":memory:") {
            (sys_root.join("memory"), "memory.limit_in_bytes", g)
        } else {
            continue;
        };
        let path = root.join(group.trim_start_matches('/'));
        limits.extend(
            path.ancestors()
                .take_while(|p| p.starts_with(&root))
                .filter_map(|p| std::fs::read_to_string(p.join(file)).ok())
                .filter_map(|v| v.trim().parse::<u64>().ok()),
        );
    }
    limits.into_iter().min()
}

/// One batch (or a follower's run of batches) and its place in the shard's queue.
struct Entry {
    base: Offset,
    last: Offset,
    bytes: Bytes,
    /// Push order on this shard: increasing within a log and across logs.
    seq: u64,
}

/// A log's batches; shared (weakly) with the shard's queue so that the shard can evict
/// the oldest batch of whichever log holds it.
struct Core {
    entries: VecDeque<Entry>,
    bytes: u64,
    capacity_bytes: u64,
    /// Offsets below this are on disk: only their batches may leave.
    written_next: Offset,
    /// Push numbers of this log's batches the shard took off its queue while the log's
    /// oldest batch was not written yet (none of them could leave): put back at the
    /// queue's front by this log's next [`TailCache::evict`]. Kept here, not on the
    /// shard, so a write costs only its own log's parked batches, and a log whose write
    /// never comes (a failed log) keeps only its own batches, never the whole shard's.
    parked: Vec<u64>,
}

impl Core {
    /// Pops batches from the front while `pop(self, front)` holds; the bytes and batches
    /// they held, for the shard's count.
    fn pop_front_while(&mut self, pop: impl Fn(&Core, &Entry) -> bool) -> (u64, usize) {
        let (mut bytes, mut batches) = (0, 0);
        while self.entries.front().is_some_and(|e| pop(self, e)) {
            if let Some(e) = self.entries.pop_front() {
                self.bytes -= e.bytes.len() as u64;
                bytes += e.bytes.len() as u64;
                batches += 1;
            }
        }
        (bytes, batches)
    }

    /// [`pop_front_while`](Self::pop_front_while) from the back.
    fn pop_back_while(&mut self, pop: impl Fn(&Entry) -> bool) -> (u64, usize) {
        let (mut bytes, mut batches) = (0, 0);
        while self.entries.back().is_some_and(&pop) {
            if let Some(e) = self.entries.pop_back() {
                self.bytes -= e.bytes.len() as u64;
                bytes += e.bytes.len() as u64;
                batches += 1;
            }
        }
        (bytes, batches)
    }

    fn holds(&self, seq: u64) -> bool {
        self.entries.binary_search_by_key(&seq, |e| e.seq).is_ok()
    }
}

/// Every cache of one shard: the bytes they hold, their bound, and every push in order.
struct Shard {
    cached: u64,
    budget: u64,
    /// Pushes, oldest first. An entry whose batch already left (evicted by its own log's
    /// bound, cut, or its log closed) stays until it reaches the front or a compaction.
    order: VecDeque<(u64, Weak<RefCell<Core>>)>,
    /// Batches held by every cache of the shard: those in `order` (when compacted) and
    /// those their logs parked.
    live: usize,
    /// The next push's number.
    next_seq: u64,
}

/// `order` is compacted once it holds this many more entries than there are batches
/// (and twice as many), so stale entries cost memory in proportion to live ones.
const ORDER_SLACK_MIN: usize = 1024;

thread_local! {
    static SHARD: RefCell<Shard> = const {
        RefCell::new(Shard {
            cached: 0,
            budget: SHARD_CACHE_BYTES_DEFAULT,
            order: VecDeque::new(),
            live: 0,
            next_seq: 0,
        })
    };
}

/// Sets the bound on the bytes all tail caches of the calling shard hold together.
pub fn set_shard_cache_budget(bytes: u64) {
    SHARD.with(|s| s.borrow_mut().budget = bytes);
}

/// Bytes all tail caches of the calling shard hold now.
pub fn shard_cached_bytes() -> u64 {
    SHARD.with(|s| s.borrow().cached)
}

/// Batches leave a log other than by the shard's queue (its own bound, a cut, a close).
fn shard_forget(bytes: u64, batches: usize) {
    // `try_with`: a log dropped while the thread's locals are torn down has no shard left
    // to tell.
    let _ = SHARD.try_with(|s| {
        let mut s = s.borrow_mut();
        debug_assert!(
            s.cached >= bytes && s.live >= batches,
            "shard cache accounting"
        );
        s.cached = s.cached.saturating_sub(bytes);
        s.live = s.live.saturating_sub(batches);
    });
}

/// Evicts the shard's oldest written batches, whichever log holds them, until the shard
/// is within its budget. A log whose oldest batch is not written yet has nothing that may
/// leave: its entries are parked until it writes. Call with no log's cache borrowed.
fn shard_evict() {
    SHARD.with(|s| {
        let mut s = s.borrow_mut();
        while s.cached > s.budget {
            let Some((seq, weak)) = s.order.pop_front() else {
                break;
            };
            let Some(core) = weak.upgrade() else {
                continue;
            };
            let Ok(mut c) = core.try_borrow_mut() else {
                s.order.push_front((seq, weak));
                break;
            };
            if !c.holds(seq) {
                // Gone already (the log's own bound, a cut): a stale entry.
                continue;
            }
            let front = c.entries.front().map(|e| (e.seq, e.last));
            match front {
                Some((front_seq, last)) if front_seq == seq && last < c.written_next => {
                    let (len, one) = c.pop_front_while(|_, e| e.seq == seq);
                    debug_assert!(s.cached >= len && s.live >= one, "shard cache accounting");
                    s.cached = s.cached.saturating_sub(len);
                    s.live = s.live.saturating_sub(one);
                }
                // The log's oldest batch is pending its write, so every batch it holds is:
                // none may leave before it writes.
                _ => c.parked.push(seq),
            }
        }
    });
}

/// Puts `core`'s parked batches back at the front of the shard's queue (they are older
/// than most of what is there), oldest first: the log wrote, so its oldest may leave now.
fn shard_unpark(core: &Rc<RefCell<Core>>) {
    let parked = {
        let Ok(mut c) = core.try_borrow_mut() else {
            return;
        };
        if c.parked.is_empty() {
            return;
        }
        let mut parked = std::mem::take(&mut c.parked);
        // Cut since (truncation, the log start): those are gone.
        parked.retain(|seq| c.holds(*seq));
        parked
    };
    SHARD.with(|s| {
        let mut s = s.borrow_mut();
        for seq in parked.into_iter().rev() {
            s.order.push_front((seq, Rc::downgrade(core)));
        }
    });
}

/// Drops stale entries from the shard's queue once they outnumber live ones.
fn shard_compact_if_stale() {
    SHARD.with(|s| {
        let mut s = s.borrow_mut();
        if s.order.len() <= (2 * s.live).max(s.live + ORDER_SLACK_MIN) {
            return;
        }
        s.order.retain(|(seq, w)| {
            w.upgrade()
                .is_some_and(|c| c.try_borrow().map_or(true, |c| c.holds(*seq)))
        });
    });
}

/// Batches in offset order. Invariant: every batch not yet written to disk is here, so a
/// read below the first cached offset only needs bytes already on disk.
pub struct TailCache {
    core: Rc<RefCell<Core>>,
}

impl TailCache {
    pub fn new(capacity_bytes: u64, written_next: Offset) -> TailCache {
        TailCache {
            core: Rc::new(RefCell::new(Core {
                entries: VecDeque::new(),
                bytes: 0,
                capacity_bytes,
                written_next,
                parked: Vec::new(),
            })),
        }
    }

    pub fn push(&mut self, base: Offset, last: Offset, bytes: Bytes) {
        let len = bytes.len() as u64;
        let seq = SHARD.with(|s| {
            let mut s = s.borrow_mut();
            let seq = s.next_seq;
            s.next_seq += 1;
            s.cached += len;
            s.live += 1;
            s.order.push_back((seq, Rc::downgrade(&self.core)));
            seq
        });
        let mut c = self.core.borrow_mut();
        debug_assert!(c.entries.back().is_none_or(|e| e.last < base));
        c.bytes += len;
        c.entries.push_back(Entry {
            base,
            last,
            bytes,
            seq,
        });
        drop(c);
        shard_compact_if_stale();
    }

    /// Notes that offsets below `written_next` are on disk, then drops the oldest written
    /// batches while this cache is over its own capacity, and the shard's oldest written
    /// batches (of any log) while the shard is over its budget.
    pub fn evict(&mut self, written_next: Offset) {
        let (bytes, batches) = {
            let mut c = self.core.borrow_mut();
            c.written_next = c.written_next.max(written_next);
            c.pop_front_while(|c, e| c.bytes > c.capacity_bytes && e.last < c.written_next)
        };
        shard_forget(bytes, batches);
        shard_unpark(&self.core);
        shard_evict();
    }

    /// Changes this log's own bound (AlterConfigs of `tail.cache.bytes`): a smaller one
    /// lets its oldest written batches go at once.
    pub fn set_capacity(&mut self, capacity_bytes: u64) {
        let written_next = {
            let mut c = self.core.borrow_mut();
            c.capacity_bytes = capacity_bytes;
            c.written_next
        };
        self.evict(written_next);
    }

    /// Drops batches holding offsets `>= next` (log truncation). What stays is below
    /// `next`; offsets from `next` on are not written until appended again.
    pub fn truncate(&mut self, next: Offset) {
        let mut c = self.core.borrow_mut();
        let (bytes, batches) = c.pop_back_while(|e| e.last >= next);
        c.written_next = c.written_next.min(next);
        drop(c);
        shard_forget(bytes, batches);
    }

    /// Drops batches holding only offsets below `next`: the log cleaner rewrote them on
    /// disk (reads there must see the cleaned segment), or the log start passed them
    /// (nothing reads them again, written or not).
    pub fn drop_below(&mut self, next: Offset) {
        let (bytes, batches) = self.core.borrow_mut().pop_front_while(|_, e| e.last < next);
        shard_forget(bytes, batches);
    }

    /// Drops every batch; the log's offsets below `written_next` are on disk.
    pub fn clear(&mut self, written_next: Offset) {
        let mut c = self.core.borrow_mut();
        let (bytes, batches) = c.pop_back_while(|_| true);
        c.written_next = written_next;
        c.parked.clear();
        drop(c);
        shard_forget(bytes, batches);
    }

    /// Whether a read at `start` can be served entirely from memory.
    pub fn covers(&self, start: Offset) -> bool {
        self.core
            .borrow()
            .entries
            .front()
            .is_some_and(|e| e.base <= start)
    }

    /// Bytes this log's cache holds.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.core.borrow().bytes
    }

    /// Whole batches from the one holding `start`, as a fetch wants them (see
    /// `Log::read`). Call only when [`covers`](Self::covers) is true.
    pub fn read(
        &self,
        start: Offset,
        max_bytes: usize,
        hard_max_bytes: usize,
        upper_bound: Offset,
    ) -> Vec<Bytes> {
        let c = self.core.borrow();
        let first = c.entries.partition_point(|e| e.last < start);
        let mut out = Vec::new();
        let mut total = 0usize;
        for e in c.entries.range(first..) {
            if e.last >= upper_bound {
                break;
            }
            let size = e.bytes.len();
            if !super::read::batch_fits(out.is_empty(), total, size, max_bytes, hard_max_bytes) {
                break;
            }
            total += e.bytes.len();
            out.push(e.bytes.clone());
        }
        out
    }

    /// The first cached batch ending at or after `log_start` whose max timestamp is
    /// `>= timestamp`, by reading headers.
    pub fn find_time(&self, timestamp: i64, log_start: Offset) -> Option<(Offset, i64)> {
        self.core.borrow().entries.iter().find_map(|e| {
            let h = wire::batch::read_header(&e.bytes).ok()?;
            (h.max_timestamp() >= timestamp && e.last >= log_start)
                .then(|| (e.base, h.max_timestamp()))
        })
    }
}

impl Drop for TailCache {
    fn drop(&mut self) {
        let c = self.core.borrow();
        shard_forget(c.bytes, c.entries.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(base: i64, len: usize) -> (Offset, Offset, Bytes) {
        (Offset(base), Offset(base), Bytes::from(vec![0u8; len]))
    }

    /// Runs `f` on a thread of its own, so the shard's thread-local state is fresh.
    fn on_fresh_shard<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().expect("test thread")
    }

    #[test]
    fn the_smallest_cgroup_limit_up_the_tree_counts_v2_and_v1() {
        let root = tempfile::tempdir().expect("tempdir");
        let write = |dir: &str, file: &str, value: &str| {
            let d = root.path().join(dir);
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join(file), value).expect("write");
        };
        // v2: the service's own group says "max", its parent slice has the limit.
        write("", "memory.max", "max\n");
        write("limited.slice", "memory.max", "2147483648\n");
        write("limited.slice/weir.service", "memory.max", "max\n");
        let v2 = "0::/limited.slice/weir.service\n";
        assert_eq!(cgroup_memory_limit_in(v2, root.path()), Some(2 << 30));
        // v1: the memory controller's line, "unlimited" as its huge number.
        write("memory", "memory.limit_in_bytes", "9223372036854771712\n");
        write("memory/box", "memory.limit_in_bytes", "1073741824\n");
        let v1 = "12:cpu,cpuacct:/box\n4:memory:/box\n";
        assert_eq!(cgroup_memory_limit_in(v1, root.path()), Some(1 << 30));
        // No limit anywhere: none.
        assert_eq!(cgroup_memory_limit_in("0::/\n", root.path()), None);
        assert_eq!(cgroup_memory_limit_in("0::/elsewhere\n", root.path()), None);
    }

    #[test]
    fn a_smaller_bound_set_at_runtime_lets_written_batches_go_at_once() {
        on_fresh_shard(|| {
            let mut c = TailCache::new(u64::MAX, Offset(0));
            for i in 0..4 {
                let (b, l, bytes) = entry(i, 100);
                c.push(b, l, bytes);
            }
            c.evict(Offset(3)); // the last batch is not written yet
            assert_eq!(c.bytes(), 400);
            c.set_capacity(150);
            assert_eq!(c.bytes(), 100, "only the unwritten batch stays");
            assert!(c.covers(Offset(3)) && !c.covers(Offset(2)));
            assert_eq!(shard_cached_bytes(), 100);
        });
    }

    #[test]
    fn never_evicts_unwritten_batches_and_counts_per_shard() {
        on_fresh_shard(|| {
            let mut c = TailCache::new(100, Offset(0));
            for i in 0..5 {
                let (b, l, bytes) = entry(i, 60);
                c.push(b, l, bytes);
            }
            assert_eq!(shard_cached_bytes(), 300);
            c.evict(Offset(2)); // offsets 0 and 1 written
            assert!(!c.covers(Offset(1)));
            assert!(
                c.covers(Offset(2)),
                "unwritten batches stay even over capacity"
            );
            c.evict(Offset(5));
            assert_eq!(
                c.read(Offset(0), usize::MAX, usize::MAX, Offset(10)).len(),
                1
            );
            c.truncate(Offset(4));
            assert!(!c.covers(Offset(4)));
            drop(c);
            assert_eq!(shard_cached_bytes(), 0);
        });
    }

    #[test]
    fn reads_stop_at_the_soft_limit_after_the_first_batch_and_never_pass_the_hard_one() {
        on_fresh_shard(|| {
            let mut c = TailCache::new(1 << 20, Offset(0));
            for i in 0..3 {
                let (b, l, bytes) = entry(i, 100);
                c.push(b, l, bytes);
            }
            let upper = Offset(3);
            assert_eq!(
                c.read(Offset(0), 10, usize::MAX, upper).len(),
                1,
                "first batch whole"
            );
            assert_eq!(c.read(Offset(0), 250, usize::MAX, upper).len(), 2);
            assert!(
                c.read(Offset(0), 10, 99, upper).is_empty(),
                "hard limit binds the first"
            );
            assert_eq!(
                c.read(Offset(0), 300, 250, upper).len(),
                2,
                "hard limit binds later ones"
            );
        });
    }

    #[test]
    fn over_the_shard_budget_the_oldest_batches_of_any_log_leave_first() {
        on_fresh_shard(|| {
            set_shard_cache_budget(1_000);
            let mut idle = TailCache::new(u64::MAX, Offset(0));
            let mut busy = TailCache::new(u64::MAX, Offset(0));
            for i in 0..5 {
                let (b, l, bytes) = entry(i, 100);
                idle.push(b, l, bytes);
            }
            idle.evict(Offset(5));
            assert_eq!(idle.bytes(), 500, "within the budget: all kept");
            for i in 0..8 {
                let (b, l, bytes) = entry(i, 100);
                busy.push(b, l, bytes);
                busy.evict(Offset(i + 1));
            }
            // 1,300 bytes pushed, 1,000 allowed: the idle log's three oldest went, not
            // the busy log's own.
            assert_eq!(shard_cached_bytes(), 1_000);
            assert_eq!(idle.bytes(), 200);
            assert!(!idle.covers(Offset(2)) && idle.covers(Offset(3)));
            assert_eq!(busy.bytes(), 800);
            assert!(busy.covers(Offset(0)));
            for i in 8..12 {
                let (b, l, bytes) = entry(i, 100);
                busy.push(b, l, bytes);
                busy.evict(Offset(i + 1));
            }
            assert_eq!(idle.bytes(), 0, "the idle log's last batches went next");
            assert!(busy.covers(Offset(2)) && !busy.covers(Offset(1)));
            assert_eq!(shard_cached_bytes(), 1_000);
        });
    }

    #[test]
    fn the_shard_keeps_unwritten_batches_over_its_budget() {
        on_fresh_shard(|| {
            set_shard_cache_budget(50);
            let mut a = TailCache::new(u64::MAX, Offset(0));
            let mut b = TailCache::new(u64::MAX, Offset(0));
            let (x, y, bytes) = entry(0, 100);
            a.push(x, y, bytes);
            let (x, y, bytes) = entry(0, 100);
            b.push(x, y, bytes);
            b.evict(Offset(1));
            // a's batch is the shard's oldest but not written: it stays, over the budget;
            // b's, written, leaves.
            assert_eq!(shard_cached_bytes(), 100);
            assert!(a.covers(Offset(0)) && !b.covers(Offset(0)));
            a.evict(Offset(1));
            assert!(!a.covers(Offset(0)), "written now, so it left");
            assert_eq!(shard_cached_bytes(), 0);
        });
    }

    #[test]
    fn a_log_whose_write_never_comes_does_not_stop_the_others_from_evicting() {
        on_fresh_shard(|| {
            set_shard_cache_budget(1_000);
            // `stuck` appends but never writes (a failed log): its batches are the shard's
            // oldest and may never leave.
            let mut stuck = TailCache::new(u64::MAX, Offset(0));
            for i in 0..3 {
                let (b, l, bytes) = entry(i, 100);
                stuck.push(b, l, bytes);
            }
            let mut busy = TailCache::new(u64::MAX, Offset(0));
            for i in 0..50 {
                let (b, l, bytes) = entry(i, 100);
                busy.push(b, l, bytes);
                busy.evict(Offset(i + 1));
            }
            assert_eq!(shard_cached_bytes(), 1_000, "the busy log evicted its own");
            assert!(stuck.covers(Offset(0)), "unwritten batches stay");
            assert_eq!(
                stuck.core.borrow().parked.len(),
                3,
                "parked with their log, off the shard's queue: the busy log's writes never walk them"
            );
            assert_eq!(
                SHARD.with(|s| s.borrow().order.len()),
                7,
                "the busy log's 7"
            );
            assert!(busy.covers(Offset(43)) && !busy.covers(Offset(42)));
            // Written at last: the stuck log's batches are the oldest and leave first.
            stuck.evict(Offset(3));
            let (b, l, bytes) = entry(50, 100);
            busy.push(b, l, bytes);
            busy.evict(Offset(51));
            assert!(!stuck.covers(Offset(0)));
            assert!(busy.covers(Offset(43)), "{}", busy.bytes());
            assert_eq!(shard_cached_bytes(), 1_000);
        });
    }

    #[test]
    fn stale_queue_entries_are_compacted_and_closed_logs_forgotten() {
        on_fresh_shard(|| {
            set_shard_cache_budget(u64::MAX);
            // An idle log's batch at the queue's front, then a log whose own bound evicts
            // every push: the queue would grow without bound without compaction.
            let mut idle = TailCache::new(u64::MAX, Offset(0));
            let (x, y, bytes) = entry(0, 10);
            idle.push(x, y, bytes);
            idle.evict(Offset(1));
            let mut small = TailCache::new(10, Offset(0));
            for i in 0..10_000 {
                let (x, y, bytes) = entry(i, 10);
                small.push(x, y, bytes);
                small.evict(Offset(i + 1));
            }
            let queued = SHARD.with(|s| s.borrow().order.len());
            assert!(queued <= 2 + ORDER_SLACK_MIN + 1, "queue holds {queued}");
            assert_eq!(shard_cached_bytes(), 20);
            drop(small);
            drop(idle);
            assert_eq!(shard_cached_bytes(), 0);
            assert_eq!(SHARD.with(|s| s.borrow().live), 0);
        });
    }
}
