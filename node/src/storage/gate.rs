//! [`IoGate`]: who does a log's disk I/O right now, and a wake-up when that changes.
//!
//! Appends wait for a condition ("my bytes are written", "my bytes are synced"). At most
//! one task — the I/O leader — writes or syncs at a time, for everybody pending. When it
//! finishes, every waiter wakes and re-checks its condition, and one of those still
//! unsatisfied becomes the next leader. A plain FIFO lock would not do: waiters queued
//! on it cannot notice that the leader already covered them, and a task that releases
//! and immediately re-acquires it starves the group (each append syncing alone).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// Bound on remembered wakers; beyond it, waiters are woken early and simply re-check.
const WAITERS_MAX: usize = 4096;

#[derive(Default)]
pub struct IoGate {
    busy: Cell<bool>,
    generation: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
}

/// Proof of being the I/O leader; leaving wakes all waiters.
pub struct IoGuard<'a> {
    gate: &'a IoGate,
}

impl IoGate {
    /// Becomes the leader if nobody is.
    pub fn try_enter(&self) -> Option<IoGuard<'_>> {
        if self.busy.replace(true) {
            return None;
        }
        Some(IoGuard { gate: self })
    }

    /// Becomes the leader if nobody is, for a task that will call [`leave`](Self::leave)
    /// (through [`GateLeave`]) itself.
    pub fn try_enter_detached(&self) -> bool {
        !self.busy.replace(true)
    }

    /// Ends the current leadership and wakes every waiter.
    pub fn leave(&self) {
        self.busy.set(false);
        self.generation.set(self.generation.get() + 1);
        self.wake_all();
    }

    /// Waits to become the leader.
    pub async fn enter(&self) -> IoGuard<'_> {
        loop {
            if let Some(g) = self.try_enter() {
                return g;
            }
            self.changed().await;
        }
    }

    /// Waits until the current leader (if any) finishes.
    pub async fn changed(&self) {
        let seen = self.generation.get();
        poll_fn(|cx| {
            if self.generation.get() != seen || !self.busy.get() {
                return Poll::Ready(());
            }
            let mut waiters = self.waiters.borrow_mut();
            if waiters.len() >= WAITERS_MAX {
                drop(waiters);
                self.wake_all();
                return Poll::Ready(());
            }
            waiters.push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    fn wake_all(&self) {
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }
}

impl Drop for IoGuard<'_> {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

/// Leaves the gate when dropped: held by the detached I/O task.
pub struct GateLeave<'a>(pub &'a IoGate);

impl Drop for GateLeave<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}
