//! Shard-local async helpers.
//!
//! - [`Event`]: a "something changed" signal. Waiters register a waker and are woken by
//!   [`Event::notify_all`]; a dropped waiter removes its waker, so a partition that sees
//!   many timed-out long polls and no appends does not accumulate wakers.
//! - [`join_all`]: several futures awaited together on one task (no spawn, no `Send`).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A single-threaded broadcast notification (shard-local; never crosses threads).
#[derive(Default)]
pub struct Event {
    generation: Cell<u64>,
    next_id: Cell<u64>,
    waiters: RefCell<Vec<(u64, Waker)>>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("generation", &self.generation.get())
            .field("waiters", &self.waiters.borrow().len())
            .finish()
    }
}

impl Event {
    /// Wakes everyone currently listening.
    pub fn notify_all(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for (_, waker) in waiters {
            waker.wake();
        }
    }

    /// A future that completes at the next [`Event::notify_all`] after this call.
    pub fn listen(&self) -> Listen<'_> {
        let id = self.next_id.get();
        self.next_id.set(id.wrapping_add(1));
        Listen {
            event: self,
            generation: self.generation.get(),
            id,
        }
    }

    /// How many wakers are registered (for tests and memory checks).
    pub fn waiter_count(&self) -> usize {
        self.waiters.borrow().len()
    }
}

/// Waits for one notification; see [`Event::listen`].
pub struct Listen<'a> {
    event: &'a Event,
    generation: u64,
    id: u64,
}

impl Future for Listen<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.event.generation.get() != self.generation {
            return Poll::Ready(());
        }
        let mut waiters = self.event.waiters.borrow_mut();
        match waiters.iter_mut().find(|(id, _)| *id == self.id) {
            Some((_, w)) => w.clone_from(cx.waker()),
            None => waiters.push((self.id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Listen<'_> {
    fn drop(&mut self) {
        if let Ok(mut waiters) = self.event.waiters.try_borrow_mut() {
            waiters.retain(|(id, _)| *id != self.id);
        }
    }
}

/// Runs all `futures` concurrently on this task; returns when every one has finished.
pub async fn join_all<F: Future<Output = O> + Unpin, O>(mut futures: Vec<F>) -> Vec<O> {
    let mut done: Vec<Option<O>> = futures.iter().map(|_| None).collect();
    futures_lite::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futures.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match std::pin::Pin::new(&mut *f).poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_wakes_and_drop_cleans_up() {
        let ex = glommio::LocalExecutor::default();
        ex.run(async {
            let ev = std::rc::Rc::new(Event::default());
            let ev2 = ev.clone();
            let t = glommio::spawn_local(async move { ev2.listen().await });
            glommio::yield_if_needed().await;
            glommio::executor().yield_now().await;
            assert_eq!(ev.waiter_count(), 1);
            ev.notify_all();
            t.await;
            assert_eq!(ev.waiter_count(), 0);
            let timed_out = futures_lite::future::or(
                async {
                    ev.listen().await;
                    false
                },
                async {
                    glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
                    true
                },
            )
            .await;
            assert!(timed_out);
            assert_eq!(
                ev.waiter_count(),
                0,
                "a dropped listener leaves no waker behind"
            );
        });
    }
}
