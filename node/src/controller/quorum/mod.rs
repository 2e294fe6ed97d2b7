//! The controller quorum (`controller.quorum.voters`): openraft on a dedicated thread with
//! a tokio current-thread runtime. Shards talk to it over bounded flume channels
//! ([`super::bridge`]); voters talk to each other over TCP ([`net`]). The Raft leader is
//! the active controller: it takes node heartbeats, fences a node whose lease
//! (`broker.session.timeout.ms`) expired, and names the cluster.

pub mod broker;
pub mod net;
pub mod store;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Cursor;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Raft};

use super::{Command, Outcome};
use crate::errors;
use crate::shard::NodeShared;
use net::{HeartbeatAnswer, Peer, Refused, Rpc, RpcReply};
use wire::BrokerEpoch;

openraft::declare_raft_types!(
    /// The quorum's types: metadata commands in, outcomes out.
    pub TypeConfig:
        D = Command,
        R = Outcome,
);

/// Requests from the shards waiting at the controller thread.
pub const REQUESTS_QUEUE: usize = 1024;
/// How long a metadata write waits for a quorum before it fails with REQUEST_TIMED_OUT.
pub const PROPOSE_DEADLINE_MS: u64 = 15_000;
/// Pause between tries while no leader is known.
pub(crate) const RETRY_PAUSE_MS: u64 = 100;
/// How often the leader looks for expired leases.
const LEASE_CHECK_MS: u64 = 200;
/// The broker-level key whose `true` lets the controller elect outside the ISR.
const UNCLEAN_LEADER_ELECTION_KEY: &str = "unclean.leader.election.enable";
/// Connections the controller port serves at once.
const CONNECTIONS_MAX: usize = 16;
/// A controller connection with no request for this long is closed.
const IDLE_TIMEOUT_MS: u64 = 60_000;
/// Commands in the Raft log between two snapshots.
const SNAPSHOT_EVERY: u64 = 1_000;
/// A voter counts as reachable for the election gate this many election timeouts after
/// its last successful probe ([`gate_elections`]; one probe per election timeout).
const REACH_FRESH_ELECTIONS: u32 = 5;

/// What the quorum needs from the configuration.
#[derive(Clone, Debug)]
pub struct QuorumConfig {
    pub node_id: i32,
    /// Voter id → controller address (`HOST:PORT`).
    pub voters: BTreeMap<i32, String>,
    /// This node's inter-broker address, registered with the controller (where peers
    /// reach it).
    pub advertised: (String, u16),
    /// Every listener's advertised address, registered too: clients are answered with
    /// the address of the listener they came through.
    pub endpoints: Vec<crate::metadata::Endpoint>,
    /// This process's broker epoch, registered with the controller: a node that comes
    /// back with another one restarted. Its ISR memberships stand (its completed writes
    /// survived), but no leader may add it to an ISR on fetches its old process made
    /// (KIP-903), and a leader drops it at once if it fetches from below the HW.
    pub broker_epoch: BrokerEpoch,
    /// The `directory.id` of this node's data dir, registered with the controller: a
    /// node back with another one lost its storage, and leaves its ISRs and leaderships.
    pub directory_id: Option<u128>,
    /// This node's `broker.rack`, registered with the controller.
    pub rack: Option<String>,
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    pub election_timeout: Duration,
    /// Preferred-leader rebalance by the active controller.
    pub leader_rebalance: crate::config::LeaderRebalance,
    /// SCRAM credentials (salted) a fresh cluster's first controller commits
    /// (`scram.bootstrap.credentials`).
    pub scram_bootstrap: Vec<crate::metadata::scram::ScramChange>,
}

/// A request from a shard.
pub enum Request {
    Propose {
        cmd: Command,
        reply: flume::Sender<Outcome>,
    },
}

/// The shards' side of the quorum (in `NodeShared`).
pub struct Handle {
    pub requests: flume::Sender<Request>,
    /// The active controller's node id, -1 while none is known.
    pub(crate) leader: AtomicI64,
    /// One notice channel per shard: the image changed.
    subscribers: Mutex<Vec<flume::Sender<super::bridge::Notice>>>,
    /// Set by a controlled shutdown: no more heartbeats (they would register the node
    /// again once it is fenced).
    pub(crate) stopping: std::sync::atomic::AtomicBool,
    /// Set once this node has the quorum's image (see [`Handle::image_ready`]).
    image_ready: std::sync::atomic::AtomicBool,
    /// This node's own lease, in nanoseconds since `started` (0: none yet): see
    /// [`Handle::lease_valid`].
    lease_until_ns: AtomicU64,
    started: Instant,
    session_timeout: Duration,
    broker_epoch: BrokerEpoch,
}

impl Handle {
    /// This process's broker epoch (its follower fetches carry it).
    pub fn broker_epoch(&self) -> BrokerEpoch {
        self.broker_epoch
    }

    /// The active controller's id (-1: none known).
    pub fn controller_id(&self) -> i32 {
        i32::try_from(self.leader.load(Ordering::Acquire)).unwrap_or(-1)
    }

    /// Whether this node may still act as a partition leader: it holds a lease until
    /// `broker.session.timeout.ms` after it sent the last heartbeat the controller
    /// answered (the controller itself: after the last quorum ack). The controller fences
    /// a node that long after the last heartbeat it received, which is later, so a node
    /// cut off from the quorum stops leading before its partitions get other leaders.
    pub fn lease_valid(&self) -> bool {
        let now = self.started.elapsed().as_nanos() as u64;
        now < self.lease_until_ns.load(Ordering::Acquire)
    }

    /// A heartbeat sent at `sent` was answered (or a quorum acked this leader then).
    pub(crate) fn renew_lease(&self, sent: Instant) {
        let until = sent.saturating_duration_since(self.started) + self.session_timeout;
        self.lease_until_ns
            .fetch_max(until.as_nanos() as u64, Ordering::AcqRel);
    }

    /// Whether this node has the quorum's metadata image: a voter from its own log, once
    /// Raft is up; a broker-only node once a controller's heartbeat answer left it caught
    /// up. Until then the node serves no clients (Kafka's broker enables request
    /// processing only once caught up with the metadata log): its empty image would
    /// answer Metadata with no topics.
    pub fn image_ready(&self) -> bool {
        self.image_ready.load(Ordering::Acquire)
    }

    pub(crate) fn set_image_ready(&self) {
        self.image_ready.store(true, Ordering::Release);
    }

    /// Stops this node's heartbeats (controlled shutdown).
    pub fn stop_heartbeats(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// A shard's channel of image-change notices.
    pub fn subscribe(&self) -> flume::Receiver<super::bridge::Notice> {
        // One pending notice is enough: the shard syncs with the newest image anyway.
        let (tx, rx) = flume::bounded(1);
        match self.subscribers.lock() {
            Ok(mut s) => s.push(tx),
            Err(p) => p.into_inner().push(tx),
        }
        rx
    }

    pub(crate) fn notify(&self) {
        let subs = match self.subscribers.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        for s in subs.iter() {
            // Full: a notice is pending, which covers this change too.
            let _ = s.try_send(super::bridge::Notice {
                sent: Instant::now(),
            });
        }
    }
}

/// The handle and what the controller thread starts with.
pub struct Prepared {
    pub handle: Arc<Handle>,
    requests: flume::Receiver<Request>,
    /// The controller port; `None` on a broker-only node.
    listener: Option<std::net::TcpListener>,
    config: QuorumConfig,
}

/// Binds this voter's controller address (so a taken port fails startup now) and makes
/// the shards' handle.
pub fn prepare(config: QuorumConfig) -> anyhow::Result<Prepared> {
    // A node that is not a voter is a broker only: no Raft, no controller port.
    let listener = match config.voters.get(&config.node_id) {
        None => None,
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr.as_str())
                .map_err(|e| anyhow::anyhow!("cannot listen on controller address {addr}: {e}"))?;
            l.set_nonblocking(true)?;
            Some(l)
        }
    };
    let (tx, rx) = flume::bounded(REQUESTS_QUEUE);
    let handle = Arc::new(Handle {
        requests: tx,
        leader: AtomicI64::new(-1),
        subscribers: Mutex::new(Vec::new()),
        stopping: std::sync::atomic::AtomicBool::new(false),
        image_ready: std::sync::atomic::AtomicBool::new(false),
        lease_until_ns: AtomicU64::new(0),
        started: Instant::now(),
        session_timeout: config.session_timeout,
        broker_epoch: config.broker_epoch,
    });
    Ok(Prepared {
        handle,
        requests: rx,
        listener,
        config,
    })
}

/// What the controller thread's tasks share.
struct Ctx {
    raft: Raft<TypeConfig>,
    node: Arc<NodeShared>,
    config: QuorumConfig,
    /// Leader only: when each node last heartbeated, and the term that started counting.
    seen: Mutex<(u64, HashMap<i32, Instant>)>,
    /// Leader only: node registrations being proposed (one at a time per node).
    registering: Arc<Mutex<HashSet<i32>>>,
    /// Leader only: nodes whose fence is being proposed (their heartbeats meanwhile are
    /// answered not live). Locked only while `seen` is.
    fencing: Mutex<HashSet<i32>>,
    /// Leader only: which process may heartbeat as each node id.
    identities: Mutex<Identities>,
}

/// Which process may heartbeat as each node id (leader only, in memory: a new leader
/// starts empty). Two processes with one `node.id` would otherwise take turns
/// registering, both renewing leases and leading the same partitions. Refused:
/// - a new broker epoch while the registered one heartbeated within the live window
///   (two heartbeat intervals): that process is alive, so this is a second one (Kafka
///   refuses a duplicate registration while the registered broker's session lasts;
///   weir only while it heartbeats, so a SIGKILL restart registers within two
///   intervals);
/// - a broker epoch a later registration superseded (the last
///   [`SUPERSEDED_PER_NODE_MAX`] per node): after a restart the old process never
///   heartbeats again.
#[derive(Default)]
struct Identities {
    superseded: HashMap<i32, std::collections::VecDeque<i64>>,
    /// The registered broker epoch of each node id and when it last heartbeated.
    heard: HashMap<i32, (i64, Instant)>,
}

/// Superseded broker epochs kept per node id.
const SUPERSEDED_PER_NODE_MAX: usize = 8;

impl Identities {
    /// Whether node `id` may heartbeat under `epoch` at `now`; `registered` is the
    /// epoch the image has for the node. A heartbeat under it is always taken (also when
    /// a registration that superseded it failed), and noted as heard.
    fn check(
        &mut self,
        id: i32,
        epoch: i64,
        registered: Option<i64>,
        (now, live_window): (Instant, Duration),
    ) -> Result<(), String> {
        let none = BrokerEpoch::NONE.get();
        if registered == Some(epoch) {
            self.heard.insert(id, (epoch, now));
            return Ok(());
        }
        // An older binary sends no epoch: nothing to tell its processes apart by.
        if epoch == none {
            return Ok(());
        }
        let other = registered.unwrap_or(none);
        if self
            .superseded
            .get(&id)
            .is_some_and(|old| old.contains(&epoch))
        {
            return Err(format!(
                "node id {id} is registered by another process (broker epoch {other}) since this one's (broker epoch {epoch})"
            ));
        }
        let alive = self.heard.get(&id).is_some_and(|(e, at)| {
            Some(*e) == registered && now.saturating_duration_since(*at) < live_window
        });
        if alive && other != none {
            return Err(format!(
                "node id {id} is registered by another process (broker epoch {other}) that is still heartbeating"
            ));
        }
        Ok(())
    }

    /// Node `id` registers another broker epoch than `registered`: that one is
    /// superseded.
    fn note(&mut self, id: i32, registered: i64) {
        if registered == BrokerEpoch::NONE.get() {
            return;
        }
        let old = self.superseded.entry(id).or_default();
        if old.contains(&registered) {
            return;
        }
        if old.len() == SUPERSEDED_PER_NODE_MAX {
            old.pop_front();
        }
        old.push_back(registered);
        assert!(old.len() <= SUPERSEDED_PER_NODE_MAX);
    }
}

impl Ctx {
    fn addr_of(&self, id: u64) -> Option<String> {
        i32::try_from(id)
            .ok()
            .and_then(|id| self.config.voters.get(&id).cloned())
    }
}

/// Starts the controller thread; it runs until the process exits.
pub fn start(prepared: Prepared, node: Arc<NodeShared>) -> anyhow::Result<()> {
    if prepared.listener.is_none() {
        return broker::start(prepared, node);
    }
    let dir = node.config.data_dir.join("controller");
    std::fs::create_dir_all(&dir)?;
    let log = store::LogStore::open(&dir)?;
    let handle = prepared.handle.clone();
    let notify = {
        let h = handle.clone();
        Arc::new(move || h.notify()) as Arc<dyn Fn() + Send + Sync>
    };
    let sm = store::StateMachine::open(&dir, node.clone(), notify)?;
    let (started_tx, started_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    std::thread::Builder::new()
        .name("weir-controller".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = started_tx.send(Err(e.into()));
                    return;
                }
            };
            rt.block_on(run(prepared, node, log, sm, started_tx));
        })?;
    match started_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => r,
        Err(_) => anyhow::bail!("the controller thread did not start"),
    }
}

async fn run(
    prepared: Prepared,
    node: Arc<NodeShared>,
    log: store::LogStore,
    sm: store::StateMachine,
    started: std::sync::mpsc::Sender<anyhow::Result<()>>,
) {
    let Prepared {
        handle,
        requests,
        listener,
        config,
    } = prepared;
    let election = config.election_timeout.as_millis() as u64;
    let raft_config = openraft::Config {
        cluster_name: "weir".into(),
        election_timeout_min: election,
        election_timeout_max: election * 2,
        heartbeat_interval: (election / 5).max(10),
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY),
        ..Default::default()
    };
    let raft_config = match raft_config.validate() {
        Ok(c) => Arc::new(c),
        Err(e) => {
            let _ = started.send(Err(anyhow::anyhow!("controller raft config: {e}")));
            return;
        }
    };
    let id = config.node_id as u64;
    let factory = net::Factory {
        voters: config.voters.clone(),
    };
    let raft = match Raft::new(id, raft_config, factory, log, sm).await {
        Ok(r) => r,
        Err(e) => {
            let _ = started.send(Err(anyhow::anyhow!("controller raft: {e}")));
            return;
        }
    };
    // A voter's image is its own log's (the state machine opened from it).
    handle.set_image_ready();
    // Every voter initialises a pristine quorum with the same members; openraft accepts
    // that (the entries are identical), and a node with a log refuses, which is fine.
    if matches!(raft.is_initialized().await, Ok(false)) {
        let members: BTreeMap<u64, BasicNode> = config
            .voters
            .iter()
            .map(|(id, addr)| (*id as u64, BasicNode::new(addr)))
            .collect();
        if let Err(e) = raft.initialize(members).await {
            tracing::debug!("controller quorum initialise: {e}");
        }
    }
    let listener = match listener.map(tokio::net::TcpListener::from_std) {
        Some(Ok(l)) => l,
        None => {
            let _ = started.send(Err(anyhow::anyhow!("a voter without a controller port")));
            return;
        }
        Some(Err(e)) => {
            let _ = started.send(Err(e.into()));
            return;
        }
    };
    let ctx = Arc::new(Ctx {
        raft,
        node,
        config,
        seen: Mutex::new((0, HashMap::new())),
        registering: Arc::new(Mutex::new(HashSet::new())),
        fencing: Mutex::new(HashSet::new()),
        identities: Mutex::new(Identities::default()),
    });
    tokio::spawn(serve(listener, ctx.clone()));
    tokio::spawn(watch_leader(ctx.clone(), handle.clone()));
    tokio::spawn(heartbeats(ctx.clone(), handle.clone()));
    tokio::spawn(leases(ctx.clone()));
    gate_elections(&ctx);
    if ctx.config.leader_rebalance.enable {
        tokio::spawn(rebalance_leaders(ctx.clone()));
    }
    let _ = started.send(Ok(()));
    while let Ok(req) = requests.recv_async().await {
        match req {
            Request::Propose { cmd, reply } => {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let out = propose(&ctx, cmd).await;
                    let _ = reply.send_async(out).await;
                });
            }
        }
    }
}

/// Lets this voter start elections only while it reaches a majority of the voters
/// (itself included) with its own connections: weir's stand-in for Raft's pre-vote,
/// which openraft 0.9 lacks.
///
/// Why: a voter that cannot dial its peers but is dialled by them (a truststore with
/// another CA: its handshakes fail, theirs to it succeed) never completes an election,
/// yet bumps its term every election timeout and answers the healthy voters'
/// AppendEntries and RequestVote with that higher vote. openraft makes the leader step
/// down on it and a candidate give up, so when the bad voter's election timeout (drawn
/// once per process) is the shortest, the healthy majority never keeps a leader (seen:
/// node 3 at T1, T2, ... every 605 ms, node 1's candidacies every 907 ms each overtaken
/// by `T(n)-N3`, no controller for 120 s). Gated, it stays at its first term and follows.
fn gate_elections(ctx: &Arc<Ctx>) {
    let me = ctx.config.node_id;
    let quorum = ctx.config.voters.len() / 2 + 1;
    let every = ctx.config.election_timeout;
    let fresh = every * REACH_FRESH_ELECTIONS;
    let reached: Arc<Mutex<HashMap<i32, Instant>>> = Arc::default();
    let enabled = Arc::new(std::sync::atomic::AtomicBool::new(true));
    for (id, addr) in ctx.config.voters.iter().filter(|(id, _)| **id != me) {
        let (id, addr) = (*id, addr.clone());
        let (ctx, reached, enabled) = (ctx.clone(), reached.clone(), enabled.clone());
        // One task per voter: a peer whose dial hangs delays no other's probe.
        tokio::spawn(async move {
            loop {
                let ok = net::probe(&addr).await.is_ok();
                let enable = {
                    let mut r = match reached.lock() {
                        Ok(r) => r,
                        Err(p) => p.into_inner(),
                    };
                    let now = Instant::now();
                    if ok {
                        r.insert(id, now);
                    }
                    let live = r.values().filter(|t| now.duration_since(**t) <= fresh);
                    1 + live.count() >= quorum
                };
                if enabled.swap(enable, Ordering::AcqRel) != enable {
                    ctx.raft.runtime_config().elect(enable);
                    match enable {
                        true => tracing::info!("a majority of voters is reachable: elections on"),
                        false => tracing::warn!(
                            "fewer than a majority of voters reachable: this voter starts no elections"
                        ),
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
    }
}

/// Publishes the current leader for the shards (Metadata's controller id).
///
/// A leader that has not heard from a quorum for two election timeouts does not name
/// itself: cut off from the majority it cannot commit (openraft 0.9 keeps it leader of
/// its old term), and the majority has elected another by then.
async fn watch_leader(ctx: Arc<Ctx>, handle: Arc<Handle>) {
    let mut rx = ctx.raft.metrics();
    let me = ctx.config.node_id as u64;
    let lease_ms = (ctx.config.election_timeout * 2).as_millis() as u64;
    loop {
        let fatal = rx.borrow().running_state.clone().err();
        if let Some(fatal) = fatal {
            halt_unless_stopping(&handle, &fatal.to_string());
        }
        let leader = {
            let m = rx.borrow();
            match m.current_leader {
                Some(l) if l == me && m.millis_since_quorum_ack.is_some_and(|t| t > lease_ms) => {
                    None
                }
                other => other,
            }
        };
        let was = handle
            .leader
            .swap(leader.map_or(-1, |l| l as i64), Ordering::AcqRel);
        if was != leader.map_or(-1, |l| l as i64) {
            tracing::info!(
                controller = leader.map_or(-1, |l| l as i64),
                "controller changed"
            );
            handle.notify();
        }
        // Also on a timer: a cut-off leader's quorum ack ages with few metrics changes.
        let tick = Duration::from_millis(LEASE_CHECK_MS);
        if let Ok(Err(_)) = tokio::time::timeout(tick, rx.changed()).await {
            halt_unless_stopping(&handle, "the Raft core is gone");
            return;
        }
    }
}

/// The Raft core stopped on its own (openraft stops it on any storage error: the log,
/// vote or committed id could not be written). Its last metrics stay as they were, so a
/// leader would go on renewing leases and answering heartbeats as leader, and its image
/// would never move again: this node halts instead, as Kafka's broker does when its
/// metadata log directory fails (found by review). A controlled shutdown is left alone.
fn halt_unless_stopping(handle: &Handle, why: &str) {
    if handle.stopping.load(Ordering::SeqCst) {
        return;
    }
    tracing::error!(
        "the controller quorum's Raft core stopped ({why}); this node halts: it can no \
         longer follow the metadata, and must not act on what it last knew"
    );
    eprintln!("weir halting: the controller's Raft core stopped ({why})");
    std::process::exit(1);
}

/// Proposes on this node, or forwards to the leader; returns once committed and applied
/// here, or fails after [`PROPOSE_DEADLINE_MS`].
///
/// A forwarded command whose reply was lost is sent again: a creation then answers
/// TOPIC_ALREADY_EXISTS although it was made (the client's retry sees the same).
async fn propose(ctx: &Ctx, cmd: Command) -> Outcome {
    let deadline = Instant::now() + Duration::from_millis(PROPOSE_DEADLINE_MS);
    let mut peers: HashMap<u64, Peer> = HashMap::new();
    while Instant::now() < deadline {
        // A leader cut off from its quorum never commits: bounded by the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        let written = tokio::time::timeout(left, ctx.raft.client_write(cmd.clone())).await;
        let leader = match written {
            Err(_) => break,
            Ok(Ok(resp)) => return resp.data,
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => f.leader_id,
            Ok(Err(e)) => {
                tracing::warn!("controller write failed: {e}");
                None
            }
        };
        let Some((leader, addr)) = leader.and_then(|l| ctx.addr_of(l).map(|a| (l, a))) else {
            tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
            continue;
        };
        let peer = peers.entry(leader).or_insert_with(|| Peer::new(addr));
        let left = deadline.saturating_duration_since(Instant::now());
        match peer.call(&Rpc::Propose(cmd.clone()), left).await {
            Ok(RpcReply::Propose(Ok((out, index)))) => {
                // Answer once this node's image has it, so the client's next request
                // here sees its change.
                let left = deadline.saturating_duration_since(Instant::now());
                let waited = ctx
                    .raft
                    .wait(Some(left))
                    .applied_index_at_least(Some(index), "forwarded write")
                    .await;
                if let Err(e) = waited {
                    tracing::warn!("forwarded write {index} not applied here yet: {e}");
                }
                return out;
            }
            Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await,
        }
    }
    Outcome::failed(
        &cmd,
        (
            errors::REQUEST_TIMED_OUT,
            "no controller quorum answered in time".into(),
        ),
    )
}

/// Serves the controller port: other voters' Raft RPCs, forwarded writes, heartbeats.
async fn serve(listener: tokio::net::TcpListener, ctx: Arc<Ctx>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            match net::accept(stream).await {
                Ok(stream) => connection(stream, &ctx, peer).await,
                // A wrong certificate on either side: the peer's dial fails too, and
                // both log it (rate limited by the peers' retry pauses).
                Err(e) => tracing::warn!(%peer, "controller port: TLS refused: {e}"),
            }
            drop(permit);
        });
    }
}

async fn connection(mut stream: net::BoxStream, ctx: &Ctx, peer: std::net::SocketAddr) {
    // A SASL controller port serves nothing before the peer authenticated.
    if let Some(sasl) = crate::security::peer::controller_sasl()
        && !net::authenticate_incoming(&mut stream, sasl, peer).await
    {
        return;
    }
    loop {
        let idle = Duration::from_millis(IDLE_TIMEOUT_MS);
        let body = match tokio::time::timeout(idle, net::read_frame(&mut stream)).await {
            Ok(Ok(b)) => b,
            _ => return,
        };
        let Ok(rpc) = serde_json::from_slice::<Rpc>(&body) else {
            tracing::warn!("controller port: undecodable request; closing");
            return;
        };
        let reply = handle_rpc(ctx, rpc).await;
        let Ok(out) = serde_json::to_vec(&reply) else {
            return;
        };
        let write = net::write_frame(&mut stream, &out);
        let rpc_timeout = Duration::from_millis(net::RPC_TIMEOUT_MS);
        if !matches!(tokio::time::timeout(rpc_timeout, write).await, Ok(Ok(()))) {
            return;
        }
    }
}

async fn handle_rpc(ctx: &Ctx, rpc: Rpc) -> RpcReply {
    match rpc {
        Rpc::Append(r) => RpcReply::Append(ctx.raft.append_entries(r).await),
        Rpc::Vote(r) => RpcReply::Vote(ctx.raft.vote(r).await),
        Rpc::Snapshot(r) => RpcReply::Snapshot(ctx.raft.install_snapshot(r).await),
        // Authentication is the connection's first exchange (or none on a port without
        // SASL): here it is out of place, and refused so a misconfiguration is loud.
        Rpc::Authenticate { .. } => RpcReply::Authenticate(Err(
            "SASL is not expected here (the controller port's protocol differs)".into(),
        )),
        Rpc::Propose(cmd) => {
            let deadline = Duration::from_millis(PROPOSE_DEADLINE_MS);
            let written = tokio::time::timeout(deadline, ctx.raft.client_write(cmd)).await;
            RpcReply::Propose(match written {
                Err(_) => Err(Refused::Failed("not committed in time".into())),
                Ok(Ok(resp)) => Ok((resp.data, resp.log_id.index)),
                Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                    Err(Refused::NotLeader(f.leader_id))
                }
                Ok(Err(e)) => Err(Refused::Failed(e.to_string())),
            })
        }
        Rpc::Heartbeat {
            id,
            host,
            port,
            have,
            epoch,
            endpoints,
            directory,
            rack,
        } => RpcReply::Heartbeat(
            heartbeat(ctx, id, (host, port), (epoch, directory), endpoints, rack).map(|live| {
                // Read after `live` was decided from the image: a fence applied in between
                // is in what the node must catch up to. The answer renews a lease only from
                // a leader that a quorum acknowledged and that has applied an entry of its
                // own term (so its image holds everything its predecessors committed, fences
                // included): a leader cut off with a minority keeps calling itself leader.
                let (applied, authority) = leader_authority(ctx);
                let live = live && authority.is_some();
                // Index read before the image: the image holds at least what it says.
                let behind = have.is_some_and(|h| h < applied);
                let catalog = ctx.node.meta.snapshot();
                // A node back with another data dir gets no image before its
                // registration moved its leaderships: with the old one it would lead, with
                // an empty log, partitions whose followers then cut what it had lost.
                let replaced = catalog.nodes.get(&id).is_some_and(|n| {
                    directory.is_some_and(|d| n.directory_id.is_some_and(|k| k != d))
                });
                let image = (behind && !replaced).then(|| net::ImageUpdate {
                    index: applied,
                    catalog: (*catalog).clone(),
                });
                HeartbeatAnswer {
                    image,
                    applied,
                    live,
                    quorum_ack_age_ms: authority.unwrap_or(0),
                }
            }),
        ),
    }
}

/// This node's applied log index, and, while it may grant leases as leader, how many
/// ms ago a quorum last acknowledged it: only once it has applied an entry of its own
/// term (its image then holds everything its predecessors committed, fences included).
/// `None` otherwise.
fn leader_authority(ctx: &Ctx) -> (u64, Option<u64>) {
    let m = ctx.raft.metrics();
    let m = m.borrow();
    let caught_up = m
        .last_applied
        .is_some_and(|l| l.leader_id.term == m.current_term);
    let authority = m.millis_since_quorum_ack.filter(|_| caught_up);
    (m.last_applied.map_or(0, |l| l.index), authority)
}

fn is_leader(ctx: &Ctx) -> bool {
    let m = ctx.raft.metrics();
    let m = m.borrow();
    m.current_leader == Some(ctx.config.node_id as u64)
}

/// The leader notes a heartbeat, and registers the node if the image does not have it
/// live at this address and broker epoch (a new epoch: the node restarted). Whether the
/// node is live: registered, unfenced, and not being fenced (see
/// [`HeartbeatAnswer::live`]).
fn heartbeat(
    ctx: &Ctx,
    id: i32,
    (host, port): (String, u16),
    (epoch, directory): (i64, Option<u128>),
    endpoints: Vec<crate::metadata::Endpoint>,
    rack: Option<String>,
) -> Result<bool, Refused> {
    if !is_leader(ctx) {
        return Err(Refused::NotLeader(
            ctx.raft.metrics().borrow().current_leader,
        ));
    }
    // Before `seen`: a refused process does not keep the node's session alive.
    let registered =
        |image: &crate::metadata::Catalog| image.nodes.get(&id).map(|n| n.broker_epoch);
    let live_window = ctx.config.heartbeat_interval * 2;
    lock(&ctx.identities)
        .check(
            id,
            epoch,
            registered(&ctx.node.meta.snapshot()),
            (Instant::now(), live_window),
        )
        .map_err(Refused::Failed)?;
    let being_fenced = {
        let mut seen = lock(&ctx.seen);
        seen.1.insert(id, Instant::now());
        lock(&ctx.fencing).contains(&id)
    };
    // Read after `being_fenced`: a fence applied in between is seen here.
    let image = ctx.node.meta.snapshot();
    let known = image.nodes.get(&id).is_some_and(|n| {
        !n.fenced
            && n.host == host
            && n.port == port
            && n.broker_epoch == epoch
            && n.endpoints == endpoints
            && (directory.is_none() || n.directory_id == directory)
            && n.rack == rack
    });
    if known {
        return Ok(!being_fenced);
    }
    let fresh = match ctx.registering.lock() {
        Ok(mut r) => r.insert(id),
        Err(p) => p.into_inner().insert(id),
    };
    if fresh {
        let restarted = image
            .nodes
            .get(&id)
            .is_some_and(|n| !n.registered_as(BrokerEpoch(epoch)));
        if restarted {
            tracing::info!(
                node = id,
                epoch,
                "node restarted: it registers a new broker epoch"
            );
        }
        if let Some(r) = registered(&image).filter(|r| *r != epoch) {
            lock(&ctx.identities).note(id, r);
        }
        let raft = ctx.raft.clone();
        let registering = ctx.registering.clone();
        let replaced = image
            .nodes
            .get(&id)
            .and_then(|n| n.directory_id)
            .filter(|known| directory.is_some_and(|d| d != *known));
        if let Some(known) = replaced {
            tracing::warn!(
                node = id,
                known = format!("{known:032x}"),
                now = format!("{:032x}", directory.unwrap_or_default()),
                "node back with another directory id: its storage was replaced; it leaves its ISRs and leaderships"
            );
        }
        let cmd = Command::RegisterNode {
            id,
            host,
            port,
            epoch,
            endpoints,
            directory,
            rack,
        };
        tokio::spawn(async move {
            if let Err(e) = raft.client_write(cmd).await {
                tracing::debug!(node = id, "registering node: {e}");
            }
            match registering.lock() {
                Ok(mut r) => r.remove(&id),
                Err(p) => p.into_inner().remove(&id),
            };
        });
    }
    Ok(false)
}

/// Locks `m`, also after a panic elsewhere poisoned it (the data is a plain set/map).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// This node's heartbeat to the leader, every `broker.heartbeat.interval.ms`.
async fn heartbeats(ctx: Arc<Ctx>, handle: Arc<Handle>) {
    let mut peers: HashMap<u64, Peer> = HashMap::new();
    let (host, port) = ctx.config.advertised.clone();
    let id = ctx.config.node_id;
    let epoch = ctx.config.broker_epoch.get();
    let mut refusals = RefusalLog::new(ctx.config.heartbeat_interval);
    while !handle.stopping.load(Ordering::SeqCst) {
        let leader = ctx.raft.metrics().borrow().current_leader;
        let mut renewed = true;
        match leader {
            Some(l) if l == id as u64 => {
                let mine = heartbeat(
                    &ctx,
                    id,
                    (host.clone(), port),
                    (epoch, ctx.config.directory_id),
                    ctx.config.endpoints.clone(),
                    ctx.config.rack.clone(),
                );
                if let Err(Refused::Failed(why)) = mine {
                    refusals.refused(&why);
                    tokio::time::sleep(ctx.config.heartbeat_interval).await;
                    continue;
                }
                refusals.taken();
                // The controller's own lease lasts while a quorum acknowledges it, and
                // starts only once its image holds everything its predecessors committed:
                // a new leader may not have applied those entries yet (the partitions it
                // led may have moved while it was cut off). They are applied no later than
                // the blank entry a leader commits first in its own term.
                let (_, authority) = leader_authority(&ctx);
                let acked =
                    authority.and_then(|ms| Instant::now().checked_sub(Duration::from_millis(ms)));
                match acked {
                    Some(acked) => handle.renew_lease(acked),
                    None => renewed = false,
                }
            }
            Some(l) => {
                if let Some(addr) = ctx.addr_of(l) {
                    let peer = peers.entry(l).or_insert_with(|| Peer::new(addr));
                    let rpc = Rpc::Heartbeat {
                        id,
                        host: host.clone(),
                        port,
                        have: None,
                        epoch,
                        endpoints: ctx.config.endpoints.clone(),
                        directory: ctx.config.directory_id,
                        rack: ctx.config.rack.clone(),
                    };
                    let sent = Instant::now();
                    let reply = peer.call(&rpc, ctx.config.heartbeat_interval * 2).await;
                    match reply {
                        Ok(RpcReply::Heartbeat(Ok(answer))) => {
                            refusals.taken();
                            renewed = renew_when_caught_up(&ctx, &handle, &answer, sent).await;
                        }
                        Ok(RpcReply::Heartbeat(Err(Refused::Failed(why)))) => {
                            refusals.refused(&why);
                        }
                        _ => {}
                    }
                }
            }
            None => {}
        }
        // Not renewed (registering, or the image behind): ask again soon, not a whole
        // interval later, so a returning node leads again once it may.
        let pause = if renewed {
            ctx.config.heartbeat_interval
        } else {
            let retry = Duration::from_millis(RETRY_PAUSE_MS);
            ctx.config.heartbeat_interval.min(retry)
        };
        tokio::time::sleep(pause).await;
    }
}

/// How often a node whose heartbeats the controller refuses says so.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// Logs the controller's refusals of this node's heartbeats (another process runs with
/// its node id) as errors, at most once per [`REFUSED_LOG_EVERY`], once they have lasted
/// four heartbeat intervals: a restart is refused too until its predecessor's
/// heartbeats have stopped for two.
pub(crate) struct RefusalLog {
    grace: Duration,
    /// Refused since then, with no heartbeat taken in between.
    since: Option<Instant>,
    logged: Option<Instant>,
}

impl RefusalLog {
    pub(crate) fn new(heartbeat_interval: Duration) -> RefusalLog {
        RefusalLog {
            grace: heartbeat_interval * 4,
            since: None,
            logged: None,
        }
    }

    pub(crate) fn refused(&mut self, why: &str) {
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() < self.grace
            || self.logged.is_some_and(|t| t.elapsed() < REFUSED_LOG_EVERY)
        {
            return;
        }
        self.logged = Some(Instant::now());
        tracing::error!(
            "the controller refuses this node's heartbeats: {why}; is another process running with this node.id? This one leads nothing"
        );
    }

    pub(crate) fn taken(&mut self) {
        self.since = None;
    }
}

/// Renews this voter's lease from a heartbeat sent at `sent` once its image holds the
/// index the leader had applied when it answered, waiting for that at most one
/// heartbeat interval; never while the leader does not have it live. Returns whether it
/// renewed.
///
/// Why: the node may have been cut off long enough to be fenced and have its partitions
/// led elsewhere. Its first answered heartbeat comes before its image has those changes
/// (the leader's log reaches it separately), and a lease renewed then would let it
/// acknowledge produces, as leader of an old epoch, for partitions that moved (Kafka: a
/// broker stays fenced until it has caught up to the controller's committed offset).
async fn renew_when_caught_up(
    ctx: &Ctx,
    handle: &Handle,
    answer: &HeartbeatAnswer,
    sent: Instant,
) -> bool {
    if !answer.live {
        return false;
    }
    let Some(sent) = sent.checked_sub(Duration::from_millis(answer.quorum_ack_age_ms)) else {
        return false;
    };
    let waited = ctx
        .raft
        .wait(Some(ctx.config.heartbeat_interval))
        .applied_index_at_least(Some(answer.applied), "lease renewal")
        .await;
    if waited.is_err() {
        tracing::debug!(
            index = answer.applied,
            "lease not renewed: this node's image is behind the controller's"
        );
        return false;
    }
    handle.renew_lease(sent);
    true
}

/// The active controller gives partitions back to their preferred replicas every
/// `leader.imbalance.check.interval.seconds` when a node's share of them led elsewhere is
/// above `leader.imbalance.per.broker.percentage` (Kafka's auto leader rebalance): a node
/// that returns from a crash leads its partitions again once it is back in their ISR.
async fn rebalance_leaders(ctx: Arc<Ctx>) {
    let r = ctx.config.leader_rebalance;
    let interval = Duration::from_secs(r.check_interval_s);
    loop {
        tokio::time::sleep(interval).await;
        if !is_leader(&ctx) {
            continue;
        }
        let image = ctx.node.meta.snapshot();
        let partitions = super::apply::imbalanced(&image, r.per_broker_percentage);
        if partitions.is_empty() {
            continue;
        }
        tracing::info!(
            partitions = partitions.len(),
            "leaders imbalanced: electing preferred replicas"
        );
        // Within the command bound: a log entry too large for a quorum frame could never
        // be replicated, and nothing after it would commit.
        for cmd in super::apply::elect_preferred_commands(partitions) {
            if let Err(e) = ctx.raft.client_write(cmd).await {
                tracing::debug!("preferred-leader election: {e}");
                break;
            }
        }
    }
}

/// Commits `scram.bootstrap.credentials` (nothing to do: `true`); `true` once done.
async fn bootstrap_scram(ctx: &Ctx) -> bool {
    let changes = &ctx.config.scram_bootstrap;
    if changes.is_empty() {
        return true;
    }
    let cmd = Command::AlterScramCredentials {
        changes: changes.clone(),
    };
    match ctx.raft.client_write(cmd).await {
        Ok(resp) => match resp.data {
            Outcome::ScramAltered(Ok(outcomes)) => {
                tracing::info!(
                    credentials = outcomes.len(),
                    "bootstrap SCRAM credentials committed (scram.bootstrap.credentials)"
                );
                true
            }
            // Refused by the catalogue: the same again would be too; the cluster starts
            // without them (loudly).
            other => {
                tracing::error!("bootstrap SCRAM credentials refused: {other:?}");
                true
            }
        },
        Err(e) => {
            tracing::debug!("bootstrap SCRAM credentials: {e}");
            false
        }
    }
}

/// The leader fences nodes whose lease expired, and names the cluster once.
async fn leases(ctx: Arc<Ctx>) {
    loop {
        tokio::time::sleep(Duration::from_millis(LEASE_CHECK_MS)).await;
        if !is_leader(&ctx) {
            continue;
        }
        let term = ctx.raft.metrics().borrow().current_term;
        let image = ctx.node.meta.snapshot();
        // A fresh cluster: its bootstrap SCRAM credentials first, then its name, so the
        // credentials are committed once (a later leader sees the name) and before a
        // node depends on them; if this leader fails between the two, the next one
        // writes them again (the same passwords).
        if image.cluster_id.is_none() && bootstrap_scram(&ctx).await {
            let cmd = Command::InitCluster {
                id: ctx.node.cluster_id.clone(),
            };
            let _ = ctx.raft.client_write(cmd).await;
        }
        let expired: Vec<i32> = {
            let mut seen = lock(&ctx.seen);
            let now = Instant::now();
            if seen.0 != term {
                // A new leader gives every node a full lease from now.
                seen.0 = term;
                for id in image.nodes.keys() {
                    seen.1.insert(*id, now);
                }
            }
            let expired: Vec<i32> = image
                .nodes
                .iter()
                .filter(|(_, n)| !n.fenced)
                .filter(|(id, _)| {
                    seen.1
                        .get(id)
                        .is_none_or(|t| now.duration_since(*t) > ctx.config.session_timeout)
                })
                .map(|(id, _)| *id)
                .collect();
            // Under `seen`: a heartbeat from now on sees the fence under way.
            lock(&ctx.fencing).extend(expired.iter().copied());
            expired
        };
        for id in expired {
            tracing::warn!(node = id, "node lease expired: fencing it");
            let _ = ctx.raft.client_write(Command::FenceNode { id }).await;
            // Applied here (or failed): the image says which.
            lock(&ctx.fencing).remove(&id);
        }
        elect_unclean_by_default(&ctx).await;
    }
}

/// The broker-level `unclean.leader.election.enable` (this controller's dynamic or
/// static value, or the cluster default; see [`super::apply::unclean_default`]) for
/// topics without their own: offline partitions whose ISR is gone are led by a live
/// replica, as Kafka's controller does. The topic-level value is applied within the
/// commands themselves; this one is not in the image, so the active controller proposes
/// the elections (checked every lease round, after that round's fences).
async fn elect_unclean_by_default(ctx: &Ctx) {
    let image = ctx.node.meta.snapshot();
    let static_value = ctx.node.config.props.get(UNCLEAN_LEADER_ELECTION_KEY);
    let enabled = super::apply::unclean_default(&image, ctx.config.node_id, static_value);
    let partitions = super::apply::unclean_by_default(&image, enabled);
    if partitions.is_empty() {
        return;
    }
    tracing::warn!(
        partitions = partitions.len(),
        "offline partitions with no live ISR member: electing live replicas (broker-level unclean.leader.election.enable)"
    );
    for cmd in super::apply::elect_unclean_commands(partitions) {
        if let Err(e) = ctx.raft.client_write(cmd).await {
            tracing::debug!("unclean leader election: {e}");
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second process with a registered node id is refused while the registered one
    /// heartbeats; once that one is silent (a SIGKILL restart) the new epoch is taken,
    /// and from then on the old one is refused. At most eight old epochs are kept.
    #[test]
    fn a_heartbeat_from_a_second_process_with_a_node_id_is_refused() {
        let window = Duration::from_millis(400);
        let t0 = Instant::now();
        let at = |ms: u64| (t0 + Duration::from_millis(ms), window);
        let mut s = Identities::default();
        // Process a (epoch 10) heartbeats; b (11) starts meanwhile.
        assert_eq!(s.check(4, 10, Some(10), at(0)), Ok(()));
        let refused = s.check(4, 11, Some(10), at(100));
        assert_eq!(
            refused,
            Err("node id 4 is registered by another process (broker epoch 10) that is still heartbeating".into())
        );
        assert_eq!(s.check(4, 10, Some(10), at(200)), Ok(()));
        // a dies: its silence lets a restart (b) register, which supersedes it.
        assert_eq!(s.check(4, 11, Some(10), at(700)), Ok(()));
        s.note(4, 10);
        assert_eq!(s.check(4, 11, Some(11), at(800)), Ok(()));
        assert!(s.check(4, 10, Some(11), at(900)).is_err());
        // Registration of b failed: a is still the registered one and is taken.
        assert_eq!(s.check(4, 10, Some(10), at(1_000)), Ok(()));
        // Another node, and an older binary without epochs, are not concerned.
        assert_eq!(s.check(5, 10, Some(11), at(1_000)), Ok(()));
        assert_eq!(s.check(4, -1, Some(10), at(1_000)), Ok(()));
        for e in 20..40 {
            s.note(4, e);
        }
        assert_eq!(s.superseded[&4].len(), SUPERSEDED_PER_NODE_MAX);
        assert!(s.check(4, 39, Some(40), at(5_000)).is_err());
        assert_eq!(
            s.check(4, 10, Some(40), at(5_000)),
            Ok(()),
            "the oldest are forgotten"
        );
    }
}
