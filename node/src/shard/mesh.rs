//! Typed calls between shards. Each operation is a type implementing [`ShardCall`] with
//! its own reply type; [`Shard::call`] runs it on the target shard and returns that reply,
//! or a [`CallError`] — never a reply of another operation, so callers have nothing to
//! re-match. Every call carries a deadline: the caller stops waiting at it
//! (REQUEST_TIMED_OUT), and the owner does not start a call whose deadline has passed.
//! A call that has started is never cancelled half-way (an append runs to its end); its
//! late reply is dropped.
//!
//! Transport: two bounded glommio channel meshes, requests ([`Envelope`]) to the owner and
//! replies ([`ReplyEnvelope`]) back. A full queue makes the sender wait (backpressure),
//! it never drops. Each shard runs one inbox task per peer; it handles at most
//! [`INBOX_IN_FLIGHT_MAX`] calls from that peer at once, then stops pulling, which pushes
//! back on the peer's connections. A call that goes on to wait for replication (an
//! acks=all produce, a resend, a marker, a coordinator's write) gives its slot back first
//! ([`InboxSlot::release_current`], from `Partition::await_replicated`), as Kafka parks a
//! delayed produce in a purgatory holding no handler: else enough waiting calls would
//! hold back every other call from that peer, the follower fetch they wait for included.
//! The call crosses as a boxed job and its reply as a boxed value; the only place that
//! turns one back into its type is [`Shard::call`], which created the pairing.

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Instant;

use glommio::channels::channel_mesh::Receivers;
use glommio::channels::local_channel;
use glommio::sync::{Semaphore, StaticPermit};

use super::Shard;
use crate::errors;
use crate::router::{RouteRevision, ShardId};

/// Calls from one peer shard handled concurrently before its inbox stops pulling.
pub const INBOX_IN_FLIGHT_MAX: u64 = 256;
/// Capacity of each mesh queue (per ordered pair of shards).
pub const MESH_QUEUE_CAPACITY: usize = 1024;

/// An operation that runs on a chosen shard (usually a partition's owner).
pub trait ShardCall: Send + 'static {
    /// What the caller gets back.
    type Reply: Send + 'static;

    /// Runs on the target shard. `deadline` is the caller's: work that waits (a delayed
    /// produce, a long poll) ends by it. A wait for replication gives back the call's
    /// inbox slot first ([`InboxSlot::release_current`]).
    fn run(self, shard: Rc<Shard>, deadline: Instant) -> impl Future<Output = Self::Reply>;

    /// Whether this call takes one of the peer's [`INBOX_IN_FLIGHT_MAX`] slots. A parked
    /// long-poll does not: it is cheap, and parked waits must not hold back the peer's
    /// produces and reads (their number is bounded by the peer's requests in flight).
    fn takes_inbox_slot(&self) -> bool {
        true
    }
}

/// A running call's hold on one of its peer's [`INBOX_IN_FLIGHT_MAX`] slots (holds
/// nothing for a call that takes none, or runs on its caller's shard). Given back when
/// the call ends, or earlier by [`InboxSlot::release`].
#[derive(Clone, Default)]
pub struct InboxSlot(Rc<RefCell<Option<StaticPermit>>>);

thread_local! {
    /// The slot of the call whose future this shard is polling, if any (see
    /// [`with_slot`]): what waits for replication sits deep in a call (a coordinator's
    /// write under a group or transaction call), where no handle reaches.
    static CURRENT_SLOT: RefCell<Option<InboxSlot>> = const { RefCell::new(None) };
}

impl InboxSlot {
    /// A slot holding `permit` (tests of calls that give theirs back).
    #[cfg(test)]
    pub(super) fn holding(permit: StaticPermit) -> InboxSlot {
        InboxSlot(Rc::new(RefCell::new(Some(permit))))
    }

    /// Whether the slot is still held.
    #[cfg(test)]
    pub(super) fn held(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Gives the slot back: the call goes on, but no longer counts against its peer.
    pub fn release(&self) {
        self.0.borrow_mut().take();
    }

    /// Gives back the slot of the call being run, if any (nothing outside a call, or in
    /// a call to the caller's own shard).
    pub fn release_current() {
        let current = CURRENT_SLOT.with(|c| c.borrow().clone());
        if let Some(slot) = current {
            slot.release();
        }
    }
}

/// Polls `work` with `slot` as the current call's slot ([`InboxSlot::release_current`]).
/// One shard polls one task at a time, so the slot is set exactly while this call's own
/// code runs; a nested poll puts back the outer slot when it ends.
pub(super) async fn with_slot<T>(slot: InboxSlot, work: impl Future<Output = T>) -> T {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(move |cx| {
        let outer = CURRENT_SLOT.with(|c| c.replace(Some(slot.clone())));
        let polled = work.as_mut().poll(cx);
        CURRENT_SLOT.with(|c| *c.borrow_mut() = outer);
        polled
    })
    .await
}

/// Why a call returned no reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The deadline passed before the reply came.
    TimedOut,
    /// The call could not run there: a Kafka error code (routing revision changed, the
    /// mesh is closed during shutdown).
    Refused(i16),
}

impl CallError {
    /// The Kafka error a client gets for it.
    pub fn code(self) -> i16 {
        match self {
            CallError::TimedOut => errors::REQUEST_TIMED_OUT,
            CallError::Refused(code) => code,
        }
    }
}

type Answer = Box<dyn Any + Send>;
pub(super) type Delivery = Result<Answer, CallError>;

/// A call in a box, as it crosses the mesh.
pub trait Job: Send {
    fn run(
        self: Box<Self>,
        shard: Rc<Shard>,
        deadline: Instant,
        slot: InboxSlot,
    ) -> Pin<Box<dyn Future<Output = Answer>>>;
    fn takes_inbox_slot(&self) -> bool;
}

struct Boxed<C>(C);

impl<C: ShardCall> Job for Boxed<C> {
    fn run(
        self: Box<Self>,
        shard: Rc<Shard>,
        deadline: Instant,
        slot: InboxSlot,
    ) -> Pin<Box<dyn Future<Output = Answer>>> {
        let run = with_slot(slot, self.0.run(shard, deadline));
        Box::pin(async move { Box::new(run.await) as Answer })
    }

    fn takes_inbox_slot(&self) -> bool {
        self.0.takes_inbox_slot()
    }
}

/// A call crossing the mesh.
pub struct Envelope {
    pub from: ShardId,
    pub id: u64,
    pub revision: RouteRevision,
    pub deadline: Instant,
    pub job: Box<dyn Job>,
}

/// A reply crossing back.
pub struct ReplyEnvelope {
    pub id: u64,
    pub delivery: Delivery,
}

/// Waits for `f` until `deadline`; `None` if the deadline came first (`f` is dropped).
pub async fn within<T>(deadline: Instant, f: impl Future<Output = T>) -> Option<T> {
    let timer = glommio::timer::sleep(deadline.saturating_duration_since(Instant::now()));
    futures_lite::future::or(async { Some(f.await) }, async {
        timer.await;
        None
    })
    .await
}

/// Removes a caller's pending entry when the caller stops waiting (reply or timeout).
struct PendingGuard<'a> {
    shard: &'a Shard,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shard.pending.borrow_mut().remove(&self.id);
    }
}

/// The reply of a call of type `C`, out of its box. The box was filled by `Boxed<C>` for
/// this call id, so a mismatch is a bug in this module, answered as a server error.
fn unbox<C: ShardCall>(delivery: Delivery) -> Result<C::Reply, CallError> {
    let answer = delivery?;
    match answer.downcast::<C::Reply>() {
        Ok(reply) => Ok(*reply),
        Err(_) => {
            debug_assert!(false, "a reply of another call type");
            Err(CallError::Refused(errors::UNKNOWN_SERVER_ERROR))
        }
    }
}

impl Shard {
    /// Runs `call` on shard `target` (this one included) and returns its reply, or
    /// [`CallError::TimedOut`] once `deadline` passes.
    pub async fn call<C: ShardCall>(
        self: &Rc<Self>,
        target: ShardId,
        call: C,
        deadline: Instant,
    ) -> Result<C::Reply, CallError> {
        if target == self.id {
            return self.call_here(call, deadline).await;
        }
        let (Some(requests), Some(turns)) = (&self.requests, self.send_turns.get(target.0)) else {
            return Err(CallError::Refused(errors::UNKNOWN_SERVER_ERROR));
        };
        let id = self.next_id.get();
        self.next_id.set(id.wrapping_add(1));
        let (tx, rx) = local_channel::new_bounded(1);
        self.pending.borrow_mut().insert(id, tx);
        let _pending = PendingGuard { shard: self, id };
        let env = Envelope {
            from: self.id,
            id,
            revision: self.router.revision(),
            deadline,
            job: Box::new(Boxed(call)),
        };
        // In call order even when the queue is full (see `send_turns`): one connection's
        // requests reach the owner in the order the client sent them.
        let send = async {
            let _turn = turns.wait().await;
            requests.send_to(target.0, env).await.is_ok()
        };
        match within(deadline, send).await {
            None => return Err(CallError::TimedOut),
            Some(false) => return Err(CallError::Refused(errors::UNKNOWN_SERVER_ERROR)),
            Some(true) => {}
        }
        match within(deadline, rx.recv()).await {
            None => Err(CallError::TimedOut),
            Some(None) => Err(CallError::Refused(errors::UNKNOWN_SERVER_ERROR)),
            Some(Some(delivery)) => unbox::<C>(delivery),
        }
    }

    /// A call to this shard runs as its own task, so that a caller giving up at the
    /// deadline never cancels it half-way (as for a call to another shard).
    async fn call_here<C: ShardCall>(
        self: &Rc<Self>,
        call: C,
        deadline: Instant,
    ) -> Result<C::Reply, CallError> {
        let (tx, rx) = local_channel::new_bounded(1);
        let shard = self.clone();
        glommio::spawn_local(async move {
            let reply = call.run(shard, deadline).await;
            let _ = tx.try_send(reply);
        })
        .detach();
        match within(deadline, rx.recv()).await {
            None => Err(CallError::TimedOut),
            Some(None) => Err(CallError::Refused(errors::UNKNOWN_SERVER_ERROR)),
            Some(Some(reply)) => Ok(reply),
        }
    }

    /// Runs `call` on the owner of `tp`.
    pub async fn call_owner<C: ShardCall>(
        self: &Rc<Self>,
        tp: &super::TopicPartition,
        call: C,
        deadline: Instant,
    ) -> Result<C::Reply, CallError> {
        let owner = self.router.owner(&tp.0, tp.1);
        self.call(owner, call, deadline).await
    }

    /// Serves calls from every peer until the mesh closes.
    pub async fn run_inbox(self: Rc<Self>, mut receivers: Receivers<Envelope>) {
        let streams = receivers.streams();
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|(peer, rx)| {
                let shard = self.clone();
                glommio::spawn_local(async move {
                    let takes_slot = |env: &Envelope| env.job.takes_inbox_slot();
                    let serve = |env, slot| shard.clone().serve_envelope(env, slot);
                    serve_peer(rx, takes_slot, serve).await;
                    tracing::debug!(shard = %shard.id, peer, "inbox closed");
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
    }

    async fn serve_envelope(self: Rc<Self>, env: Envelope, slot: InboxSlot) {
        let delivery = if env.revision != self.router.revision() {
            Err(CallError::Refused(errors::NOT_LEADER_OR_FOLLOWER))
        } else if Instant::now() >= env.deadline {
            // The caller has stopped waiting: do not start work nobody will see.
            Err(CallError::TimedOut)
        } else {
            Ok(env.job.run(self.clone(), env.deadline, slot).await)
        };
        if let Some(replies) = &self.replies {
            let reply = ReplyEnvelope {
                id: env.id,
                delivery,
            };
            let _ = replies.send_to(env.from.0, reply).await;
        }
    }

    /// Delivers replies from peers to the waiting callers.
    pub async fn run_replies(self: Rc<Self>, mut receivers: Receivers<ReplyEnvelope>) {
        let tasks: Vec<_> = receivers
            .streams()
            .into_iter()
            .map(|(_, rx)| {
                let shard = self.clone();
                glommio::spawn_local(async move {
                    while let Some(env) = rx.recv().await {
                        let waiter = shard.pending.borrow_mut().remove(&env.id);
                        if let Some(tx) = waiter {
                            let _ = tx.try_send(env.delivery);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
    }
}

/// One peer's inbox: serves each call of `calls` as its own task, at most
/// [`INBOX_IN_FLIGHT_MAX`] holding a slot at once (those `takes_slot` says take one),
/// then stops pulling until a slot is given back (a call ended or released it).
async fn serve_peer<E, F, Fut>(
    mut calls: impl futures_lite::Stream<Item = E> + Unpin,
    takes_slot: impl Fn(&E) -> bool,
    serve: F,
) where
    F: Fn(E, InboxSlot) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    use futures_lite::StreamExt;
    let permits = Rc::new(Semaphore::new(INBOX_IN_FLIGHT_MAX));
    while let Some(call) = calls.next().await {
        let slot = InboxSlot::default();
        if takes_slot(&call) {
            match permits.acquire_static_permit(1).await {
                Ok(p) => *slot.0.borrow_mut() = Some(p),
                Err(_) => break,
            }
        }
        let served = serve(call, slot.clone());
        glommio::spawn_local(async move {
            served.await;
            slot.release();
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::time::Duration;

    /// Calls that release their slot and then wait (acks=all produces waiting for a
    /// stalled follower) do not count against the peer: with more of them parked than
    /// [`INBOX_IN_FLIGHT_MAX`], a later call from the same peer is still served.
    #[test]
    fn calls_waiting_after_releasing_their_slot_do_not_hold_back_the_peer() {
        let served = crate::storage::testing::run_on_shard(|| async {
            let parked = usize::try_from(INBOX_IN_FLIGHT_MAX).unwrap_or(usize::MAX) + 10;
            // `Some(n)`: a produce-like call that parks; `None`: the later call.
            let calls = (0..parked).map(Some).chain(std::iter::once(None));
            let stall = Rc::new(Semaphore::new(0));
            let later_served = Rc::new(Cell::new(false));
            let serve = |call: Option<usize>, slot: InboxSlot| {
                let (stall, later_served) = (stall.clone(), later_served.clone());
                with_slot(slot, async move {
                    match call {
                        Some(_) => {
                            // As `Partition::await_replicated` does, deep in a call.
                            InboxSlot::release_current();
                            let _ = stall.acquire(1).await;
                        }
                        None => later_served.set(true),
                    }
                })
            };
            let inbox = serve_peer(futures_lite::stream::iter(calls), |_| true, serve);
            let waited = within(Instant::now() + Duration::from_secs(5), async {
                inbox.await;
                for _ in 0..100 {
                    if later_served.get() {
                        return;
                    }
                    glommio::executor().yield_now().await;
                }
            });
            let _ = waited.await;
            stall.close();
            later_served.get()
        });
        assert!(served);
    }

    /// An acks=all produce run as a call gives its slot back once appended, while it
    /// waits for a follower that does not fetch (`Partition::await_replicated`).
    #[test]
    fn an_acks_all_produce_waiting_for_its_follower_holds_no_slot() {
        use crate::partition::{Acks, Partition};
        use wire::{LeaderEpoch, NodeId, Offset};
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let (available, hw, end) = crate::storage::testing::run_on_shard(move || async move {
            let disk = crate::storage::Disk::Sim(crate::storage::SimDisk::new());
            let configs = std::collections::BTreeMap::new();
            let p = Partition::open_on(
                &data,
                NodeId(1),
                std::sync::Arc::from("t"),
                0,
                7,
                configs,
                disk,
            );
            let p = p.await.expect("open");
            let both = [NodeId(1), NodeId(2)];
            p.update_replica(|r| r.become_leader(LeaderEpoch(1), both.to_vec(), &both));
            let permits = Rc::new(Semaphore::new(1));
            let slot = InboxSlot::default();
            let permit = permits.acquire_static_permit(1).await.expect("a permit");
            *slot.0.borrow_mut() = Some(permit);
            let records = crate::storage::testing::build_batch(0, &[b"a"]);
            let deadline = Instant::now() + Duration::from_secs(30);
            let produce = p.produce(records, Acks::All, deadline, crate::shard::now_ms());
            let mut produce = std::pin::pin!(with_slot(slot, produce));
            for _ in 0..100 {
                if permits.available() == 1 {
                    break;
                }
                let polled = futures_lite::future::poll_once(&mut produce).await;
                assert!(polled.is_none(), "answered before the follower fetched");
                // The log's write runs in a task of its own.
                glommio::timer::sleep(Duration::from_millis(5)).await;
            }
            (
                permits.available(),
                p.high_watermark(),
                p.log.log_end_offset(),
            )
        });
        assert_eq!(available, 1, "the slot is given back while waiting");
        assert_eq!(
            (hw, end),
            (Offset(0), Offset(1)),
            "appended, not replicated"
        );
    }
}
