//! The shard's budget for Fetch response bytes read but not yet written to a socket
//! (weir's `fetch.response.buffer.max.bytes`, split evenly across shards): a fetch
//! reserves what it may read before reading, waiting while the budget is spent
//! (backpressure instead of memory), keeps what it read until its connection has written
//! the response, and returns the rest at once. After a large burst is written, the freed
//! heap is handed back to the OS (`malloc_trim`).
//!
//! Per shard rather than one node-wide counter: a response's bytes are held on the shard
//! that owns its connection (until the write), and a glommio `Semaphore` is shard-local
//! (no atomics or locks on the data path) and lets a fetch wait without polling. Each
//! shard's share is `total / shards`, so the node total holds.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use bytes::Bytes;
use glommio::sync::Semaphore;

/// Bytes held at the peak of a burst above which the heap is trimmed once the burst has
/// been written: big cold reads leave freed memory in malloc's arenas, not in the OS.
const TRIM_AFTER_PEAK_BYTES: u64 = 32 << 20;
/// Least time between two trims by one shard: a consumer catching up empties the budget
/// after every response, and each trim makes the next response fault its pages in again.
/// A trim skipped for this reason is done by the shard's housekeeping tick instead.
const TRIM_INTERVAL_MIN: Duration = Duration::from_secs(1);

/// One shard's budget. Lives on that shard's thread only.
pub struct ResponseBudget {
    /// One unit per byte.
    sem: Semaphore,
    capacity_bytes: u64,
    /// Bytes reserved or held right now.
    held_bytes: Cell<u64>,
    /// Most bytes held at once since the heap was last trimmed.
    held_peak_bytes: Cell<u64>,
    last_trim: Cell<Option<Instant>>,
}

thread_local! {
    /// The budget of the shard running on this thread (one executor per thread).
    static SHARD_BUDGET: RefCell<Option<Rc<ResponseBudget>>> = const { RefCell::new(None) };
}

/// This shard's budget; the first call on a thread creates it with `capacity_bytes`.
pub fn shard_budget(capacity_bytes: u64) -> Rc<ResponseBudget> {
    SHARD_BUDGET.with(|slot| {
        slot.borrow_mut()
            .get_or_insert_with(|| Rc::new(ResponseBudget::new(capacity_bytes)))
            .clone()
    })
}

/// Bytes held by this shard's unwritten responses (0 before its first fetch).
pub fn shard_held_bytes() -> u64 {
    SHARD_BUDGET.with(|slot| slot.borrow().as_ref().map_or(0, |b| b.held_bytes()))
}

/// Returns `bytes` to this thread's budget (see [`Hold`]'s drop).
fn release_on_this_thread(bytes: u64) {
    SHARD_BUDGET.with(|slot| {
        if let Some(budget) = slot.borrow().as_ref() {
            budget.release(bytes);
        }
    });
}

impl ResponseBudget {
    fn new(capacity_bytes: u64) -> ResponseBudget {
        assert!(capacity_bytes > 0, "a zero budget would block every fetch");
        ResponseBudget {
            sem: Semaphore::new(capacity_bytes),
            capacity_bytes,
            held_bytes: Cell::new(0),
            held_peak_bytes: Cell::new(0),
            last_trim: Cell::new(None),
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Bytes reserved or held right now.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.get()
    }

    /// Reserves `want` bytes (at most the capacity), waiting up to `timeout` while they are
    /// held by other responses. `None` if they did not come free in time.
    pub async fn reserve(&self, want: u64, timeout: Duration) -> Option<Hold> {
        let want = want.min(self.capacity_bytes);
        if want == 0 {
            return Some(Hold::new(0));
        }
        let acquire = async { self.sem.acquire(want).await.is_ok() };
        let expire = async {
            glommio::timer::sleep(timeout).await;
            false
        };
        // A waiter dropped on timeout leaves the semaphore's queue (glommio's Waiter drop).
        if !futures_lite::future::or(acquire, expire).await {
            return None;
        }
        self.note_taken(want);
        Some(Hold::new(want))
    }

    /// Takes up to `more` bytes without waiting (they are already read, so waiting would
    /// not save memory, and two fetches waiting for each other's bytes would deadlock).
    /// Returns the bytes taken.
    fn take_now(&self, more: u64) -> u64 {
        let take = more.min(self.sem.available());
        if take > 0 && self.sem.try_acquire(take).unwrap_or(false) {
            self.note_taken(take);
            return take;
        }
        0
    }

    fn note_taken(&self, bytes: u64) {
        let held = self.held_bytes.get() + bytes;
        assert!(
            held <= self.capacity_bytes,
            "held {held} > {}",
            self.capacity_bytes
        );
        self.held_bytes.set(held);
        self.held_peak_bytes
            .set(self.held_peak_bytes.get().max(held));
    }

    fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let held = self.held_bytes.get();
        assert!(bytes <= held, "releasing {bytes} of {held} held bytes");
        self.held_bytes.set(held - bytes);
        self.sem.signal(bytes);
        let recent = self
            .last_trim
            .get()
            .is_some_and(|t| t.elapsed() < TRIM_INTERVAL_MIN);
        if !recent {
            self.trim_if_idle();
        }
    }

    /// Trims the heap if nothing is held now and a large burst was held since the last
    /// trim. Called when the budget empties and by the shard's housekeeping tick.
    pub fn trim_if_idle(&self) {
        if self.held_bytes.get() == 0 && self.held_peak_bytes.get() >= TRIM_AFTER_PEAK_BYTES {
            self.held_peak_bytes.set(0);
            self.last_trim.set(Some(Instant::now()));
            trim_heap();
        }
    }
}

/// This shard's deferred trim (see [`ResponseBudget::trim_if_idle`]); nothing if no fetch
/// has run on this shard yet.
pub fn trim_shard_heap_if_idle() {
    SHARD_BUDGET.with(|slot| {
        if let Some(budget) = slot.borrow().as_ref() {
            budget.trim_if_idle();
        }
    });
}

/// Gives freed heap memory back to the OS (glibc keeps it in its arenas otherwise, and
/// the RSS stays at the burst's peak).
#[cfg(target_env = "gnu")]
fn trim_heap() {
    // SAFETY: malloc_trim takes no pointers; it only shrinks the allocator's free lists.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(target_env = "gnu"))]
fn trim_heap() {}

/// Bytes of one response held against the shard's budget; returned when dropped.
///
/// It holds no reference to the budget (only a count and the thread it belongs to), so
/// it can own a `Bytes` chunk ([`into_chunk`](Hold::into_chunk)) and travel with the
/// response to the connection's writer, which drops it after the write. Responses never
/// leave their connection's shard; a hold dropped on another thread would leak its bytes
/// from the budget, which the drop reports loudly instead.
#[derive(Debug)]
pub struct Hold {
    bytes: u64,
    thread: ThreadId,
}

impl Hold {
    fn new(bytes: u64) -> Hold {
        Hold {
            bytes,
            thread: std::thread::current().id(),
        }
    }

    /// A hold of nothing, to merge reservations into.
    pub fn empty() -> Hold {
        Hold::new(0)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Settles a reservation of `reserved` bytes (part of this hold) that was used for
    /// `used` bytes: the unused rest goes back to the budget at once; bytes used past the
    /// reservation (a first batch larger than the response limit, KIP-74) are taken if
    /// free, else held unaccounted (at most one batch per response).
    pub fn settle(&mut self, budget: &ResponseBudget, reserved: u64, used: u64) {
        assert!(
            reserved <= self.bytes,
            "settling {reserved} of {} bytes",
            self.bytes
        );
        if used < reserved {
            let unused = reserved - used;
            budget.release(unused);
            self.bytes -= unused;
        } else {
            self.bytes += budget.take_now(used - reserved);
        }
    }

    /// Adds `other`'s bytes to this hold.
    pub fn merge(&mut self, mut other: Hold) {
        assert_eq!(self.thread, other.thread, "holds of two shards merged");
        self.bytes += std::mem::take(&mut other.bytes);
    }

    /// A zero-length chunk owning this hold: the last chunk of a response, it is dropped
    /// (returning the bytes) when the connection has written the response or given up.
    pub fn into_chunk(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for Hold {
    fn as_ref(&self) -> &[u8] {
        &[]
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        if std::thread::current().id() == self.thread {
            release_on_this_thread(self.bytes);
        } else {
            tracing::error!(
                bytes = self.bytes,
                "fetch response budget dropped on another shard: bytes lost from the budget"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_settle_and_release_on_drop() {
        glommio::LocalExecutor::default().run(async {
            let budget = shard_budget(1000);
            let mut hold = budget.reserve(600, Duration::ZERO).await.expect("free");
            assert_eq!(budget.held_bytes(), 600);
            hold.settle(&budget, 600, 100);
            assert_eq!((hold.bytes(), budget.held_bytes()), (100, 100));
            let waiting = budget.reserve(1000, Duration::from_millis(10)).await;
            assert!(waiting.is_none(), "900 free of 1000 wanted: times out");
            let mut other = budget.reserve(900, Duration::ZERO).await.expect("free");
            other.settle(&budget, 900, 950);
            assert_eq!(other.bytes(), 900, "nothing left to take for the excess");
            drop(other);
            hold.merge(budget.reserve(50, Duration::ZERO).await.expect("free"));
            let chunk = hold.into_chunk();
            assert!(chunk.is_empty());
            assert_eq!(budget.held_bytes(), 150);
            drop(chunk);
            assert_eq!(budget.held_bytes(), 0);
        });
    }
}
