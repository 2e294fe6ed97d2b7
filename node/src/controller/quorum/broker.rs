//! A broker-only node (its `node.id` is not in `controller.quorum.voters`): no Raft and no
//! controller port. Its controller thread heartbeats the active controller (found by
//! trying the voters, following their leader hints) and gets the committed image back
//! whenever its own is behind; its metadata writes are forwarded to the controller and
//! answered once the image here has them. The node serves no client until a first
//! answer has left it caught up (`Handle::image_ready`): it starts with no image.
//!
//! The image is sent whole (bounded by the frame size): fine for metadata of thousands of
//! partitions; deltas are a later step.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::net::{Peer, Refused, Rpc, RpcReply};
use super::{PROPOSE_DEADLINE_MS, Prepared, QuorumConfig, RETRY_PAUSE_MS, Request};
use crate::controller::{Command, Outcome};
use crate::errors;
use crate::shard::NodeShared;

/// What the broker-only controller thread's tasks share.
struct Broker {
    node: Arc<NodeShared>,
    handle: Arc<super::Handle>,
    config: QuorumConfig,
    /// Log index the local image includes (0: none yet).
    have: AtomicU64,
    /// The voter last known to lead (-1: unknown).
    hint: AtomicI64,
    /// Wakes the heartbeat loop early (a forwarded write waits for its image).
    poke: tokio::sync::Notify,
}

impl Broker {
    /// Voters to try, the last known leader first.
    fn candidates(&self) -> Vec<(i32, String)> {
        let hint = i32::try_from(self.hint.load(Ordering::Acquire)).unwrap_or(-1);
        let mut out: Vec<(i32, String)> = self
            .config
            .voters
            .iter()
            .map(|(id, a)| (*id, a.clone()))
            .collect();
        out.sort_by_key(|(id, _)| *id != hint);
        out
    }

    fn follow(&self, leader: Option<u64>) {
        let id = leader.and_then(|l| i64::try_from(l).ok()).unwrap_or(-1);
        self.hint.store(id, Ordering::Release);
    }
}

/// Starts the broker-only controller thread.
pub fn start(prepared: Prepared, node: Arc<NodeShared>) -> anyhow::Result<()> {
    let Prepared {
        handle,
        requests,
        config,
        ..
    } = prepared;
    let broker = Arc::new(Broker {
        node,
        handle,
        config,
        have: AtomicU64::new(0),
        hint: AtomicI64::new(-1),
        poke: tokio::sync::Notify::new(),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("weir-controller".into())
        .spawn(move || rt.block_on(run(broker, requests)))?;
    Ok(())
}

async fn run(b: Arc<Broker>, requests: flume::Receiver<Request>) {
    tokio::spawn(heartbeats(b.clone()));
    while let Ok(req) = requests.recv_async().await {
        match req {
            Request::Propose { cmd, reply } => {
                let b = b.clone();
                tokio::spawn(async move {
                    let out = propose(&b, cmd).await;
                    let _ = reply.send_async(out).await;
                });
            }
        }
    }
}

/// Heartbeats every `broker.heartbeat.interval.ms` (or at once when poked), installing
/// the image the controller sends back.
async fn heartbeats(b: Arc<Broker>) {
    let mut peers: BTreeMap<i32, Peer> = BTreeMap::new();
    let timeout = b.config.heartbeat_interval * 2;
    let mut refusals = super::RefusalLog::new(b.config.heartbeat_interval);
    while !b.handle.stopping.load(Ordering::SeqCst) {
        let mut answered = false;
        // Each voter once, plus one leader hint followed.
        let mut tries = b.candidates();
        let mut hops = 0;
        while let Some((id, addr)) = (!tries.is_empty()).then(|| tries.remove(0)) {
            let peer = peers.entry(id).or_insert_with(|| Peer::new(addr));
            let rpc = Rpc::Heartbeat {
                id: b.config.node_id,
                host: b.config.advertised.0.clone(),
                port: b.config.advertised.1,
                have: Some(b.have.load(Ordering::Acquire)),
                epoch: b.config.broker_epoch.get(),
                endpoints: b.config.endpoints.clone(),
                directory: b.config.directory_id,
                rack: b.config.rack.clone(),
            };
            let sent = Instant::now();
            match peer.call(&rpc, timeout).await {
                Ok(RpcReply::Heartbeat(Ok(answer))) => {
                    refusals.taken();
                    b.follow(u64::try_from(id).ok());
                    b.handle.leader.store(i64::from(id), Ordering::Release);
                    if let Some(u) = answer.image
                        && u.index > b.have.load(Ordering::Acquire)
                    {
                        match b.node.meta.replace(u.catalog) {
                            Ok(()) => {
                                b.have.store(u.index, Ordering::Release);
                                b.handle.notify();
                            }
                            Err(e) => tracing::warn!("cannot install the controller's image: {e}"),
                        }
                    }
                    // Only live, and with the image installed first: a node back from a
                    // cut must not lead partitions its old image names it leader of
                    // (see the voters' `renew_when_caught_up`).
                    // From the leader's last quorum ack at the latest (see
                    // `HeartbeatAnswer::quorum_ack_age_ms`).
                    let age = Duration::from_millis(answer.quorum_ack_age_ms);
                    let from = sent.checked_sub(age);
                    let caught_up = b.have.load(Ordering::Acquire) >= answer.applied;
                    if let (true, Some(from)) = (answer.live, from)
                        && caught_up
                    {
                        b.handle.renew_lease(from);
                    }
                    // The shards start serving clients only now (see
                    // `Handle::image_ready`).
                    if caught_up && !b.handle.image_ready() {
                        tracing::info!(
                            index = b.have.load(Ordering::Acquire),
                            "metadata image received from the controller"
                        );
                        b.handle.set_image_ready();
                    }
                    answered = true;
                    break;
                }
                Ok(RpcReply::Heartbeat(Err(Refused::Failed(why)))) => {
                    refusals.refused(&why);
                    break;
                }
                Ok(RpcReply::Heartbeat(Err(Refused::NotLeader(Some(l))))) if hops == 0 => {
                    hops += 1;
                    if let Some(addr) = i32::try_from(l)
                        .ok()
                        .and_then(|l| b.config.voters.get(&l).map(|a| (l, a.clone())))
                    {
                        tries.insert(0, addr);
                    }
                }
                _ => {}
            }
        }
        if !answered {
            b.handle.leader.store(-1, Ordering::Release);
        }
        let _ = tokio::time::timeout(b.config.heartbeat_interval, b.poke.notified()).await;
    }
}

/// Forwards `cmd` to the controller; answers once the local image has its log index
/// (but a block of producer ids at once: the asker uses the block it is answered, and
/// waiting for an image that holds only a new counter cost a whole image copy per block).
async fn propose(b: &Broker, cmd: Command) -> Outcome {
    let wait_for_image = !matches!(cmd, Command::AllocateProducerIds { .. });
    let deadline = Instant::now() + Duration::from_millis(PROPOSE_DEADLINE_MS);
    while Instant::now() < deadline {
        for (id, addr) in b.candidates() {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut peer = Peer::new(addr);
            match peer.call(&Rpc::Propose(cmd.clone()), left).await {
                Ok(RpcReply::Propose(Ok((out, index)))) => {
                    b.follow(u64::try_from(id).ok());
                    while wait_for_image
                        && b.have.load(Ordering::Acquire) < index
                        && Instant::now() < deadline
                    {
                        b.poke.notify_one();
                        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS / 5)).await;
                    }
                    return out;
                }
                Ok(RpcReply::Propose(Err(Refused::NotLeader(l)))) => b.follow(l),
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
    }
    Outcome::failed(
        &cmd,
        (
            errors::REQUEST_TIMED_OUT,
            "no controller quorum answered in time".into(),
        ),
    )
}
