//! Arrival order for produces that reach a partition before it can be used.
//!
//! Kafka appends one connection's batches for a partition in the order it sent them, and
//! a producer with several requests in flight and no retries relies on it. On the hot
//! path that order holds by itself: the owner polls the calls in arrival order, and an
//! open partition assigns offsets in the first poll of an append. A partition that is not
//! open broke it: the first call opens it and suspends (directory work in the blocking
//! pool, DMA reads of a segment, closing idle logs first); later calls wait for that open
//! on an [`Event`](crate::event::Event). When it completed, the waiters were woken behind
//! every task already queued on the executor — and a call queued there, for the same
//! partition but sent later, found it open and appended first (this reordered batches of
//! one librdkafka producer in the `restart` test). A call that arrived while the first
//! one was still closing idle logs (before it registered its open) even opened the
//! partition itself and appended before it.
//!
//! So while a partition has calls waiting for it, every produce for it takes a ticket
//! when it arrives and appends on its turn, holding the turn until its offsets are
//! assigned; the queue goes with its last ticket, and the hot path (an open partition, no
//! queue) takes no ticket at all. A turn that ends wakes every parked ticket, in ticket
//! order: they run in that order and each finds its turn come, so a queue drains in one
//! pass of the executor, not one pass per ticket (a ticket run out of order parks again).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use super::{Shard, TopicPartition};
use crate::partition::Partition;

/// The tickets of one partition's queue: `serving` may append; the others wait.
#[derive(Debug, Default)]
pub struct ArrivalQueue {
    next: Cell<u64>,
    serving: Cell<u64>,
    /// Parked tickets' wakers, in ticket order.
    parked: RefCell<BTreeMap<u64, Waker>>,
    /// Tickets dropped before their turn: skipped when reached.
    abandoned: RefCell<BTreeSet<u64>>,
}

impl ArrivalQueue {
    /// The next ticket; its place is fixed by this call.
    fn take_ticket(&self) -> u64 {
        let ticket = self.next.get();
        self.next.set(ticket.wrapping_add(1));
        ticket
    }

    /// Ready once `ticket` is served; otherwise parks its waker until the next pass.
    fn poll_turn(&self, ticket: u64, cx: &mut Context<'_>) -> Poll<()> {
        if self.serving.get() == ticket {
            Poll::Ready(())
        } else {
            self.parked.borrow_mut().insert(ticket, cx.waker().clone());
            Poll::Pending
        }
    }

    /// `ticket`'s holder is done: passes the turn on if it had it, else gives it up.
    fn release(&self, ticket: u64) {
        if self.serving.get() == ticket {
            self.pass();
        } else {
            self.parked.borrow_mut().remove(&ticket);
            self.abandoned.borrow_mut().insert(ticket);
        }
    }

    /// The turn passes from `serving` to the next ticket still held; every parked
    /// ticket is woken (see the module doc).
    fn pass(&self) {
        let mut next = self.serving.get().wrapping_add(1);
        while self.abandoned.borrow_mut().remove(&next) {
            next = next.wrapping_add(1);
        }
        self.serving.set(next);
        let parked = std::mem::take(&mut *self.parked.borrow_mut());
        for (_, waker) in parked {
            waker.wake();
        }
    }
}

/// A produce's place among the calls that reached one partition while it was not open
/// (or while such calls were still ahead of it). Held until the produce's offsets are
/// assigned; dropping it passes the turn on (or gives the ticket up if its turn had not
/// come), and the last ticket of a queue removes it.
pub struct ArrivalTurn<'a> {
    shard: &'a Shard,
    tp: TopicPartition,
    queue: Rc<ArrivalQueue>,
    ticket: u64,
}

impl Drop for ArrivalTurn<'_> {
    fn drop(&mut self) {
        self.queue.release(self.ticket);
        let mut queues = self.shard.arrivals.borrow_mut();
        // The map's reference and this one: no other ticket of this queue is held.
        if queues
            .get(&self.tp)
            .is_some_and(|q| Rc::strong_count(q) <= 2)
        {
            queues.remove(&self.tp);
        }
    }
}

impl Shard {
    /// [`Shard::partition`] for an append: the open partition `tp` and, if the caller had
    /// to queue for it, its turn, which it must hold until its offsets are assigned
    /// (see the module doc). `None` on the hot path: `tp` open and nobody queued.
    pub async fn partition_in_turn(
        &self,
        tp: &TopicPartition,
    ) -> Result<(Rc<Partition>, Option<ArrivalTurn<'_>>), i16> {
        if self.router.owner(&tp.0, tp.1) != self.id {
            return Err(crate::errors::NOT_LEADER_OR_FOLLOWER);
        }
        let queued = {
            let queues = self.arrivals.borrow();
            !queues.is_empty() && queues.contains_key(tp)
        };
        if !queued && let Some(p) = self.opened(tp) {
            return Ok((p, None));
        }
        // The ticket is taken now, before any await: arrival order is call order.
        let queue = Rc::clone(self.arrivals.borrow_mut().entry(tp.clone()).or_default());
        let ticket = queue.take_ticket();
        // Made before waiting, so that a call dropped while it waits gives its ticket up.
        let turn = ArrivalTurn {
            shard: self,
            tp: tp.clone(),
            queue,
            ticket,
        };
        poll_fn(|cx| turn.queue.poll_turn(ticket, cx)).await;
        // An error drops the turn: the next caller tries to open the partition itself.
        let p = self.partition(tp).await?;
        Ok((p, Some(turn)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tickets are served in the order they were taken, a given-up ticket is skipped,
    /// and one ending turn wakes every parked ticket, which then run in ticket order.
    #[test]
    fn tickets_are_served_in_order_and_a_turn_wakes_every_parked_ticket() {
        let order = crate::storage::testing::run_on_shard(|| async {
            let queue = Rc::new(ArrivalQueue::default());
            let order = Rc::new(RefCell::new(Vec::new()));
            let first = queue.take_ticket();
            let mut tasks = Vec::new();
            for i in 1..=4u64 {
                let ticket = queue.take_ticket();
                let (queue, order) = (queue.clone(), order.clone());
                tasks.push(glommio::spawn_local(async move {
                    poll_fn(|cx| queue.poll_turn(ticket, cx)).await;
                    order.borrow_mut().push(i);
                    queue.release(ticket);
                }));
            }
            glommio::executor().yield_now().await;
            let parked = queue.parked.borrow().len();
            // The second waiter gives up its ticket, as a dropped call does.
            let mut tasks = tasks.into_iter();
            let (one, two) = (tasks.next(), tasks.next());
            drop(two);
            queue.release(first + 2);
            queue.release(first);
            let woken_at_once = queue.parked.borrow().is_empty();
            for t in one.into_iter().chain(tasks) {
                t.await;
            }
            (parked, woken_at_once, order.take())
        });
        assert_eq!(order, (4, true, vec![1, 3, 4]));
    }
}
