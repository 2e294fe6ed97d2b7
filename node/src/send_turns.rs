//! First-come, first-served turns to enqueue on a cross-shard mesh queue.
//!
//! Why: when a mesh queue is full, glommio 0.9 wakes the senders waiting on it in reverse
//! order, and a sender that arrives just as room frees can take it before the woken ones
//! run. Two pipelined requests of one connection, bound for the same peer shard, could
//! then be enqueued (and so applied) out of order, while Kafka applies one connection's
//! requests in order. A sender takes a ticket when it reaches the queue and enqueues only
//! on its turn; the turn is held until the envelope is in the queue, not until the reply.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// Tickets of one queue: `serving` may enqueue; later tickets wait in ticket order.
#[derive(Debug, Default)]
pub struct SendTurns {
    next: Cell<u64>,
    serving: Cell<u64>,
    /// Waiting tickets' wakers.
    waiters: RefCell<BTreeMap<u64, Waker>>,
    /// Tickets whose waiter was dropped before its turn: skipped when reached.
    abandoned: RefCell<BTreeSet<u64>>,
}

/// A turn: held while enqueuing; dropping it passes the turn to the next ticket. Dropped
/// before its turn came, it gives its ticket up instead.
#[derive(Debug)]
pub struct Turn<'a> {
    turns: &'a SendTurns,
    ticket: u64,
}

impl SendTurns {
    /// Waits for this caller's turn; callers are served in the order they called.
    pub async fn wait(&self) -> Turn<'_> {
        let ticket = self.next.get();
        self.next.set(ticket.wrapping_add(1));
        // Made before waiting so that a caller dropped while waiting gives its ticket up.
        let turn = Turn {
            turns: self,
            ticket,
        };
        poll_fn(|cx| {
            if self.serving.get() == ticket {
                Poll::Ready(())
            } else {
                self.waiters.borrow_mut().insert(ticket, cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
        turn
    }

    /// Moves the turn past `ticket` and past given-up tickets, and wakes the new holder.
    fn pass(&self) {
        let mut next = self.serving.get().wrapping_add(1);
        while self.abandoned.borrow_mut().remove(&next) {
            next = next.wrapping_add(1);
        }
        self.serving.set(next);
        if let Some(w) = self.waiters.borrow_mut().remove(&next) {
            w.wake();
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let turns = self.turns;
        if turns.serving.get() == self.ticket {
            turns.pass();
        } else {
            turns.waiters.borrow_mut().remove(&self.ticket);
            turns.abandoned.borrow_mut().insert(self.ticket);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::time::Duration;

    use super::*;
    use crate::storage::testing::run_on_shard;

    /// Callers get their turns in calling order, whatever order they are woken in, and
    /// a caller dropped while waiting does not stall the ones behind it.
    #[test]
    fn turns_are_served_in_ticket_order_and_skip_dropped_waiters() {
        let order = run_on_shard(|| async {
            // Bounded: a lost wake-up would hang here, not pass.
            glommio::timer::timeout(Duration::from_secs(10), async {
                Ok(serve_five_callers().await)
            })
            .await
            .ok()
        });
        assert_eq!(order, Some(vec![1, 3, 4]));
    }

    /// Holds a turn, queues four callers behind it, drops the second one while it waits,
    /// releases; returns the callers in the order they got their turns.
    async fn serve_five_callers() -> Vec<u32> {
        let turns = Rc::new(SendTurns::default());
        let order = Rc::new(RefCell::new(Vec::new()));
        let first = turns.wait().await;
        let mut tasks = Vec::new();
        for i in 1..=4u32 {
            let (t, o) = (turns.clone(), order.clone());
            tasks.push(glommio::spawn_local(async move {
                let _turn = t.wait().await;
                o.borrow_mut().push(i);
                // Suspend while holding the turn: nobody may overtake meanwhile.
                glommio::timer::sleep(Duration::from_millis(1)).await;
            }));
        }
        // Let all four take their tickets, then give one up while it waits.
        glommio::timer::sleep(Duration::from_millis(5)).await;
        let mut tasks = tasks.into_iter();
        let (one, two) = (tasks.next(), tasks.next());
        drop(two);
        drop(first);
        for t in one.into_iter().chain(tasks) {
            t.await;
        }
        // A new caller after all that still gets a turn.
        drop(turns.wait().await);
        order.take()
    }
}
