//! [`TailCache`]: the most recently appended batches, in memory, so that fetches of the
//! tail (consumers and followers that keep up) never touch the disk, and so that batches
//! whose DMA write is still pending are readable.

use std::collections::VecDeque;

use bytes::Bytes;
use wire::Offset;

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
        self.entries.push_back(Entry { base, last, bytes });
    }

    /// Drops the oldest batches beyond the capacity, but only those already written
    /// (all offsets below `written_next`).
    pub fn evict(&mut self, written_next: Offset) {
        while self.bytes > self.capacity_bytes {
            match self.entries.front() {
                Some(e) if e.last < written_next => {
                    self.bytes -= e.bytes.len() as u64;
                    self.entries.pop_front();
                }
                _ => break,
            }
        }
    }

    /// Drops batches holding offsets `>= next` (log truncation).
    pub fn truncate(&mut self, next: Offset) {
        while let Some(e) = self.entries.back() {
            if e.last < next {
                break;
            }
            self.bytes -= e.bytes.len() as u64;
            self.entries.pop_back();
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Whether a read at `start` can be served entirely from memory.
    pub fn covers(&self, start: Offset) -> bool {
        self.entries.front().is_some_and(|e| e.base <= start)
    }

    /// Whole batches from the one holding `start`, as a fetch wants them (see
    /// `Log::read`). Call only when [`covers`](Self::covers) is true.
    pub fn read(&self, start: Offset, max_bytes: usize, upper_bound: Offset) -> Vec<Bytes> {
        let first = self.entries.partition_point(|e| e.last < start);
        let mut out = Vec::new();
        let mut total = 0usize;
        for e in self.entries.range(first..) {
            if e.last >= upper_bound {
                break;
            }
            if !out.is_empty() && total + e.bytes.len() > max_bytes {
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
