//! The shard's budget for request bytes being read or handled (`queued.max.request.bytes`,
//! an equal share per shard), and giving freed memory back to the OS after a burst of
//! large frames.
//!
//! A frame larger than [`SMALL_FRAME_MAX_BYTES`] takes its size from the budget before a
//! byte of its body is buffered and keeps it until its request has been handled. A
//! connection whose frame does not fit waits, reading nothing, so TCP holds the client
//! back. Smaller frames are read into the connection's own read buffer and bypass the
//! budget: that buffer is bounded per connection, and a full budget must not stall the
//! small requests of well-behaved clients.
//!
//! One client address holds at most half of the shard's share (a frame alone may take
//! more): a frame's budget is taken when its size prefix arrives, so without this a few
//! connections that send only 100 MB size prefixes, and reconnect when
//! `request.read.timeout.ms` closes them, kept every other client's large frames waiting.
//! The other half stays for other addresses. (Kafka's pool, when one is configured, has no
//! such share.)
//!
//! The budget lives on its shard (no atomics or cross-thread wakes on the read path);
//! SO_REUSEPORT spreads connections over the shards, so equal shares are the node-wide
//! bound split as the load is.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use glommio::sync::{Semaphore, StaticPermit};

use crate::event::Event;

/// Frames up to this size are read into the connection's read buffer, outside the budget.
pub const SMALL_FRAME_MAX_BYTES: usize = 64 * 1024;
/// How long the budget must stay unused after large frames before freed memory is
/// trimmed: the handlers' and responses' buffers are gone by then, and a busy burst is
/// not interrupted by a trim per frame.
const TRIM_DELAY: Duration = Duration::from_millis(500);

/// One shard's share of `queued.max.request.bytes`.
pub struct RequestBudget {
    semaphore: Rc<Semaphore>,
    share_bytes: u64,
    /// Large-frame bytes taken since the last trim.
    taken_since_trim_bytes: Cell<u64>,
    /// Fired when the last outstanding large-frame permit is released.
    idle: Event,
    /// What each client address holds, and its frames waiting for their turn.
    by_address: RefCell<HashMap<IpAddr, Address>>,
    /// The next waiting frame's number.
    next_ticket: Cell<u64>,
    /// Fired when an address gives bytes back or a waiting frame leaves its queue.
    address_released: Event,
}

/// One client address: the bytes its frames hold (granted or waiting for the shard's
/// semaphore), and its frames waiting to count against its share, in arrival order. The
/// order keeps a frame larger than the address's share (which waits for the address to
/// hold nothing) from being passed for ever by that address's smaller frames.
#[derive(Default)]
struct Address {
    held: u64,
    waiting: VecDeque<u64>,
}

/// Budget held for one large frame; released (and the trimmer told) on drop.
pub struct FramePermit {
    permit: Option<StaticPermit>,
    _share: AddressShare,
    budget: Rc<RequestBudget>,
}

/// Bytes counted against one address's share, given back on drop (also when the wait for
/// the budget is abandoned: the connection closed meanwhile).
struct AddressShare {
    budget: Rc<RequestBudget>,
    address: IpAddr,
    units: u64,
}

impl Drop for AddressShare {
    fn drop(&mut self) {
        let mut by = self.budget.by_address.borrow_mut();
        if let Some(a) = by.get_mut(&self.address) {
            assert!(a.held >= self.units, "an address gives back what it took");
            a.held -= self.units;
            if a.held == 0 && a.waiting.is_empty() {
                by.remove(&self.address);
            }
        }
        drop(by);
        self.budget.address_released.notify_all();
    }
}

/// A frame's place in its address's queue, left on drop if it is still there (the
/// connection closed while waiting).
struct Ticket<'a> {
    budget: &'a RequestBudget,
    address: IpAddr,
    number: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut by = self.budget.by_address.borrow_mut();
        if let Some(a) = by.get_mut(&self.address) {
            a.waiting.retain(|t| *t != self.number);
            if a.held == 0 && a.waiting.is_empty() {
                by.remove(&self.address);
            }
        }
        drop(by);
        self.budget.address_released.notify_all();
    }
}

impl RequestBudget {
    /// The share of `node_bytes` for one of `shards` shards (at least 1 byte).
    pub fn new(node_bytes: u64, shards: usize) -> Rc<RequestBudget> {
        let share_bytes = (node_bytes / shards.max(1) as u64).max(1);
        Rc::new(RequestBudget {
            semaphore: Rc::new(Semaphore::new(share_bytes)),
            share_bytes,
            taken_since_trim_bytes: Cell::new(0),
            idle: Event::default(),
            by_address: RefCell::new(HashMap::new()),
            next_ticket: Cell::new(0),
            address_released: Event::default(),
        })
    }

    /// Most bytes one address may hold with more than one frame.
    fn address_max_bytes(&self) -> u64 {
        (self.share_bytes / 2).max(1)
    }

    /// Waits until `frame_bytes` fit in the budget and in the share of `address`, and takes
    /// them. A frame larger than the whole share takes the whole share, so it is read alone
    /// instead of never; one larger than an address's share is taken when that address
    /// holds nothing else. An address's frames take their turns in arrival order.
    pub async fn acquire(
        self: &Rc<Self>,
        frame_bytes: usize,
        address: IpAddr,
    ) -> Option<FramePermit> {
        let units = (frame_bytes as u64).min(self.share_bytes);
        assert!(units > 0, "a frame always has a size");
        let number = self.next_ticket.get();
        self.next_ticket.set(number + 1);
        self.by_address
            .borrow_mut()
            .entry(address)
            .or_default()
            .waiting
            .push_back(number);
        let ticket = Ticket {
            budget: self,
            address,
            number,
        };
        loop {
            let released = self.address_released.listen();
            let admitted = {
                let mut by = self.by_address.borrow_mut();
                let a = by.entry(address).or_default();
                let fits = a.held == 0 || a.held + units <= self.address_max_bytes();
                if a.waiting.front() == Some(&number) && fits {
                    a.waiting.pop_front();
                    a.held += units;
                    true
                } else {
                    false
                }
            };
            if admitted {
                break;
            }
            released.await;
        }
        // Out of the queue: the address's next frame may go now, if it fits.
        drop(ticket);
        let share = AddressShare {
            budget: self.clone(),
            address,
            units,
        };
        let permit = self.semaphore.acquire_static_permit(units).await.ok()?;
        let taken = self.taken_since_trim_bytes.get().saturating_add(units);
        self.taken_since_trim_bytes.set(taken);
        self.publish_held();
        Some(FramePermit {
            permit: Some(permit),
            _share: share,
            budget: self.clone(),
        })
    }

    /// Bytes of the share not taken right now.
    pub fn available_bytes(&self) -> u64 {
        self.semaphore.available()
    }

    /// Publishes the bytes held now to the shard's `weir_request_budget_bytes` gauge.
    fn publish_held(&self) {
        let held = self.share_bytes - self.available_bytes().min(self.share_bytes);
        crate::metrics::local(|m| {
            m.request_budget_bytes_held
                .store(held, std::sync::atomic::Ordering::Relaxed)
        });
    }

    fn is_idle(&self) -> bool {
        let available = self.available_bytes();
        assert!(available <= self.share_bytes, "more released than taken");
        available == self.share_bytes
    }

    /// Runs on its shard until dropped: after a burst of large frames, once the budget has
    /// been unused for [`TRIM_DELAY`], gives the freed heap pages back to the OS. glibc
    /// keeps freed frames of up to 32 MiB in its arenas (its mmap threshold rises to the
    /// largest freed chunk), so without this the RSS of a burst stays after it.
    pub async fn trim_after_bursts(self: Rc<Self>) {
        loop {
            let idle = self.idle.listen();
            if !(self.is_idle() && self.taken_since_trim_bytes.get() > 0) {
                idle.await;
                continue;
            }
            glommio::timer::sleep(TRIM_DELAY).await;
            if !self.is_idle() {
                continue;
            }
            self.taken_since_trim_bytes.set(0);
            trim_heap();
        }
    }
}

impl Drop for FramePermit {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.budget.publish_held();
        if self.budget.is_idle() {
            self.budget.idle.notify_all();
        }
    }
}

/// Returns free heap memory to the OS (glibc's `malloc_trim`; it also releases free pages
/// in the middle of every arena, not only at the top).
fn trim_heap() {
    let t0 = std::time::Instant::now();
    // SAFETY: malloc_trim takes no pointers and is thread-safe (it locks each arena).
    let released = unsafe { libc::malloc_trim(0) };
    tracing::debug!(
        released = released != 0,
        took_us = t0.elapsed().as_micros() as u64,
        "heap trimmed after large request frames"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::poll_once;

    #[test]
    fn one_addresss_frames_take_turns_and_leave_half_to_others() {
        crate::storage::testing::run_on_shard(|| async {
            let budget = RequestBudget::new(1000, 1);
            let (one, other): (IpAddr, IpAddr) = (
                "127.0.0.2".parse().expect("ip"),
                "127.0.0.3".parse().expect("ip"),
            );
            let a = budget.acquire(300, one).await.expect("first frame");
            // 300 + 600 is past the address's half: the big frame waits for `a`.
            let mut big = Box::pin(budget.acquire(600, one));
            assert!(poll_once(&mut big).await.is_none());
            // A small frame of the same address would fit, but comes after the big one.
            let mut small = Box::pin(budget.acquire(150, one));
            assert!(poll_once(&mut small).await.is_none());
            // Another address has the rest of the budget.
            let d = budget.acquire(100, other).await.expect("other address");
            drop(a);
            let b = big.await.expect("the big frame, alone for its address");
            assert!(
                poll_once(&mut small).await.is_none(),
                "600 + 150 is past the half"
            );
            drop(b);
            let c = small.await.expect("then the small one");
            drop((c, d));
            assert!(
                budget.by_address.borrow().is_empty(),
                "nothing left counted"
            );
            // A waiting frame whose connection closes leaves its place.
            let a = budget.acquire(400, one).await.expect("frame");
            let mut waiting = Box::pin(budget.acquire(400, one));
            assert!(poll_once(&mut waiting).await.is_none());
            drop(waiting);
            let next = budget
                .acquire(100, one)
                .await
                .expect("not held up by a gone frame");
            drop((a, next));
            assert!(budget.by_address.borrow().is_empty());
        });
    }
}
