//! [`TailCache`]: the most recently appended batches, in memory, so that fetches of the
//! tail (consumers and followers that keep up) never touch the disk, and so that batches
//! whose DMA write is still pending are readable.

use std::cell::Cell;
use std::collections::VecDeque;

use bytes::Bytes;
use wire::Offset;

/// Default bound on the bytes all tail caches of one shard hold together.
pub const SHARD_CACHE_BYTES_DEFAULT: u64 = 256 << 20;

thread_local! {
    /// Bytes held by every tail cache on this shard (thread), and their bound. Per shard,
    /// not per partition, so thousands of partitions do not each keep their own megabytes.
    static SHARD_CACHED: Cell<u64> = const { Cell::new(0) };
    static SHARD_BUDGET: Cell<u64> = const { Cell::new(SHARD_CACHE_BYTES_DEFAULT) };
}

/// Sets the bound on the bytes all tail caches of the calling shard hold together.
pub fn set_shard_cache_budget(bytes: u64) {
    SHARD_BUDGET.with(|b| b.set(bytes));
}

/// Bytes all tail caches of the calling shard hold now.
pub fn shard_cached_bytes() -> u64 {
    SHARD_CACHED.with(Cell::get)
}

fn shard_add(bytes: u64) {
    SHARD_CACHED.with(|c| c.set(c.get() + bytes));
}

fn shard_sub(bytes: u64) {
    SHARD_CACHED.with(|c| c.set(c.get().saturating_sub(bytes)));
}

fn shard_over_budget() -> bool {
    SHARD_CACHED.with(Cell::get) > SHARD_BUDGET.with(Cell::get)
}

struct Entry {
    base: Offset,
    last: Offset,
    bytes: Bytes,
}

/// Batches in offset order. Invariant: every batch not yet written to disk is here, so a
/// read below the first cached offset only needs bytes already on disk.
pub struct TailCache {
    entries: VecDeque<Entry>,
    bytes: u64,
    capacity_bytes: u64,
}

impl TailCache {
    pub fn new(capacity_bytes: u64) -> TailCache {
        TailCache {
            entries: VecDeque::new(),
            bytes: 0,
            capacity_bytes,
        }
    }

    pub fn push(&mut self, base: Offset, last: Offset, bytes: Bytes) {
        debug_assert!(self.entries.back().is_none_or(|e| e.last < base));
        self.bytes += bytes.len() as u64;
        shard_add(bytes.len() as u64);
        self.entries.push_back(Entry { base, last, bytes });
    }

    /// Drops the oldest batches while this cache is over its capacity or the shard over
    /// its budget, but only batches already written (offsets below `written_next`).
    pub fn evict(&mut self, written_next: Offset) {
        while self.bytes > self.capacity_bytes || (self.bytes > 0 && shard_over_budget()) {
            match self.entries.front() {
                Some(e) if e.last < written_next => {
                    let _ = self.pop_front();
                }
                _ => break,
            }
        }
    }

    fn pop_front(&mut self) -> Option<Entry> {
        let e = self.entries.pop_front()?;
        self.bytes -= e.bytes.len() as u64;
        shard_sub(e.bytes.len() as u64);
        Some(e)
    }

    /// Drops batches holding offsets `>= next` (log truncation).
    pub fn truncate(&mut self, next: Offset) {
        while let Some(e) = self.entries.back() {
            if e.last < next {
                break;
            }
            let len = e.bytes.len() as u64;
            self.bytes -= len;
            shard_sub(len);
            self.entries.pop_back();
        }
    }

    /// Drops batches holding only offsets below `next` (the log cleaner rewrote them on
    /// disk; reads there must see the cleaned segment). They are written, being sealed.
    pub fn drop_below(&mut self, next: Offset) {
        while self.entries.front().is_some_and(|e| e.last < next) {
            let _ = self.pop_front();
        }
    }

    pub fn clear(&mut self) {
        shard_sub(self.bytes);
        self.entries.clear();
        self.bytes = 0;
    }

    /// Whether a read at `start` can be served entirely from memory.
    pub fn covers(&self, start: Offset) -> bool {
        self.entries.front().is_some_and(|e| e.base <= start)
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
        let first = self.entries.partition_point(|e| e.last < start);
        let mut out = Vec::new();
        let mut total = 0usize;
        for e in self.entries.range(first..) {
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
        self.entries.iter().find_map(|e| {
            let h = wire::batch::read_header(&e.bytes).ok()?;
            (h.max_timestamp() >= timestamp && e.last >= log_start)
                .then(|| (e.base, h.max_timestamp()))
        })
    }
}

impl Drop for TailCache {
    fn drop(&mut self) {
        shard_sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(base: i64, len: usize) -> (Offset, Offset, Bytes) {
        (Offset(base), Offset(base), Bytes::from(vec![0u8; len]))
    }

    #[test]
    fn never_evicts_unwritten_batches_and_counts_per_shard() {
        let before = shard_cached_bytes();
        let mut c = TailCache::new(100);
        for i in 0..5 {
            let (b, l, bytes) = entry(i, 60);
            c.push(b, l, bytes);
        }
        assert_eq!(shard_cached_bytes(), before + 300);
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
        assert_eq!(shard_cached_bytes(), before);
    }

    #[test]
    fn reads_stop_at_the_soft_limit_after_the_first_batch_and_never_pass_the_hard_one() {
        let mut c = TailCache::new(1 << 20);
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
    }
}
