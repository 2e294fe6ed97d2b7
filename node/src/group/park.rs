//! Parked JoinGroup / SyncGroup answers, waited for in slices.
//!
//! A JoinGroup waits until the rebalance completes (up to the rebalance timeout, minutes),
//! a follower's SyncGroup until the leader's. When the connection is on another shard, that
//! wait would hold one of the coordinator shard's inbox slots for the connection's shard
//! (`INBOX_IN_FLIGHT_MAX`) the whole time, and enough parked members would stall that
//! shard's produce and fetch traffic here. So the coordinator waits at most
//! [`PARK_SLICE_MS`] per call: if the answer is not there yet it keeps the receiver under a
//! ticket and answers [`GroupReply::Parked`]; the connection's shard asks again with
//! [`GroupOp::Await`](super::GroupOp::Await). Tickets nobody asks for again (the client went
//! away) are dropped after [`PARKED_IDLE_MAX_MS`].

use std::time::Duration;

use glommio::channels::local_channel::LocalReceiver;

use super::codes;
use super::state::{JoinResult, SyncResult};
use super::{Coordinators, GroupReply};
use crate::shard::context::ServiceContext;
use crate::shard::mono_ms;

/// Longest one coordinator call waits for a parked answer.
pub const PARK_SLICE_MS: u64 = 1000;
/// A parked answer not asked for again within this long is dropped.
pub const PARKED_IDLE_MAX_MS: i64 = 10_000;

/// An answer still to come.
pub enum Pending {
    /// The receiver, and the member id for an error answer.
    Join(LocalReceiver<JoinResult>, String),
    Sync(LocalReceiver<SyncResult>),
}

enum Slice<T> {
    Answer(Option<T>),
    Timeout,
    Shutdown,
}

/// Waits one slice for `rx`, or until the shard shuts down.
async fn slice<T>(ctx: &ServiceContext<'_>, rx: &LocalReceiver<T>) -> Slice<T> {
    if ctx.shutting_down() {
        return Slice::Shutdown;
    }
    let timer = glommio::timer::sleep(Duration::from_millis(PARK_SLICE_MS));
    let answer = async { Slice::Answer(rx.recv().await) };
    let timeout = async {
        timer.await;
        Slice::Timeout
    };
    let shutdown = async {
        ctx.until_shutdown().await;
        Slice::Shutdown
    };
    futures_lite::future::or(answer, futures_lite::future::or(timeout, shutdown)).await
}

impl Coordinators {
    /// Waits one slice for a pending answer; parks it again if it is still not there.
    pub(super) async fn wait_pending(
        &self,
        ctx: &ServiceContext<'_>,
        pending: Pending,
    ) -> GroupReply {
        let unavailable = codes::COORDINATOR_NOT_AVAILABLE;
        match pending {
            Pending::Join(rx, member) => match slice(ctx, &rx).await {
                Slice::Answer(Some(r)) => GroupReply::Join(r),
                Slice::Answer(None) | Slice::Shutdown => {
                    GroupReply::Join(JoinResult::error(unavailable, &member))
                }
                Slice::Timeout => GroupReply::Parked(self.park(Pending::Join(rx, member))),
            },
            Pending::Sync(rx) => match slice(ctx, &rx).await {
                Slice::Answer(Some(r)) => GroupReply::Sync(r),
                Slice::Answer(None) | Slice::Shutdown => {
                    GroupReply::Sync(SyncResult::error(unavailable))
                }
                Slice::Timeout => GroupReply::Parked(self.park(Pending::Sync(rx))),
            },
        }
    }

    fn park(&self, pending: Pending) -> u64 {
        let ticket = self.next_ticket.get();
        self.next_ticket.set(ticket.wrapping_add(1));
        self.parked
            .borrow_mut()
            .insert(ticket, (pending, mono_ms()));
        ticket
    }

    /// The answer parked under `ticket`, waited for one more slice.
    pub(super) async fn await_ticket(&self, ctx: &ServiceContext<'_>, ticket: u64) -> GroupReply {
        let pending = self.parked.borrow_mut().remove(&ticket);
        match pending {
            Some((pending, _)) => self.wait_pending(ctx, pending).await,
            None => GroupReply::Code(codes::COORDINATOR_NOT_AVAILABLE),
        }
    }

    /// Drops parked answers whose client stopped asking.
    pub(super) fn drop_idle_parked(&self, now: i64) {
        self.parked
            .borrow_mut()
            .retain(|_, (_, parked_at)| now - *parked_at < PARKED_IDLE_MAX_MS);
    }
}
