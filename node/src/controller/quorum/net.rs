//! The voters' network: TCP on each voter's controller address, one request and one
//! response per exchange, each a frame of a u32 big-endian length and a JSON body
//! (bounded by [`FRAME_MAX_BYTES`]), every read and write under a timeout. With
//! `controller.listener.names` mapped to SSL the connections are TLS (rustls through
//! futures-rustls over [`Compat`], tokio's socket seen as a futures-io stream); mapped to
//! SASL_PLAINTEXT or SASL_SSL, a connection's first exchange is SASL PLAIN
//! ([`Rpc::Authenticate`]) and the server serves nothing else until it succeeded.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

use super::TypeConfig;
use crate::controller::{Command, Outcome};

/// Largest frame sent or accepted (a snapshot chunk, a batch of log entries).
pub const FRAME_MAX_BYTES: usize = 64 << 20;
/// Connecting to a voter gives up after this long.
pub const CONNECT_TIMEOUT_MS: u64 = 1_000;
/// An RPC that carries no deadline of its own (propose, heartbeat) gives up after this.
pub const RPC_TIMEOUT_MS: u64 = 5_000;
/// Largest frame read before a connection authenticated (a PLAIN message is at most
/// 4 KiB): an unauthenticated peer makes this node allocate no more.
pub const AUTH_FRAME_MAX_BYTES: usize = 16 << 10;
/// The only SASL mechanism of the controller port. SCRAM credentials live in the
/// metadata the quorum replicates, so a voter with an empty log could never check them
/// (Kafka's controllers take PLAIN for the same reason).
pub const CONTROLLER_MECHANISM: &str = "PLAIN";

/// What one voter asks another.
#[derive(Serialize, Deserialize)]
pub enum Rpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// A metadata write forwarded to the leader.
    Propose(Command),
    /// A node's liveness heartbeat (with its advertised address) sent to the leader.
    /// `have`: the log index a broker-only node's image is at (voters: `None`, they
    /// replicate the log themselves). `epoch`: the node process's broker epoch.
    Heartbeat {
        id: i32,
        host: String,
        port: u16,
        have: Option<u64>,
        /// -1 from a node older than broker epochs (a rolling upgrade).
        #[serde(default = "no_broker_epoch")]
        epoch: i64,
        /// Every listener's advertised address (empty from an older node).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        endpoints: Vec<crate::metadata::Endpoint>,
        /// The `directory.id` of the node's data dir (`None` from an older node).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        directory: Option<u128>,
        /// The node's `broker.rack` (`None` unset, or from an older node).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rack: Option<String>,
    },
    /// SASL: the first request on a connection to a SASL controller port, and the only
    /// one served before it succeeded. `token`: the mechanism's client message.
    Authenticate {
        mechanism: String,
        token: Vec<u8>,
    },
}

fn no_broker_epoch() -> i64 {
    wire::BrokerEpoch::NONE.get()
}

/// Why a forwarded request was not done by the node asked.
#[derive(Debug, Serialize, Deserialize)]
pub enum Refused {
    /// It is not the leader; the leader it knows, if any.
    NotLeader(Option<u64>),
    Failed(String),
}

#[derive(Serialize, Deserialize)]
pub enum RpcReply {
    Append(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    Snapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    /// The outcome and the index of the log entry that made it.
    Propose(Result<(Outcome, u64), Refused>),
    /// The leader's answer to a heartbeat.
    Heartbeat(Result<HeartbeatAnswer, Refused>),
    /// Authenticated, or refused (the reason stays in the server's log).
    Authenticate(Result<(), String>),
}

/// What the leader answers a node's heartbeat (Kafka's broker heartbeat response with
/// `isFenced` and the controller's committed offset to catch up to).
#[derive(Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    /// For a broker-only node behind the leader: the leader's image and its log index.
    pub image: Option<ImageUpdate>,
    /// The leader's applied log index when it answered. The node renews its lease (may
    /// act as a partition leader) only once its own image holds this index: a node back
    /// from a cut must first see the leader changes made while it was away.
    pub applied: u64,
    /// Whether the leader's image has the node registered and unfenced, with no fence
    /// of it under way. A node that is not renews no lease: it registers first, and its
    /// image may still name it leader of partitions that were moved.
    pub live: bool,
    /// How long before answering the leader last heard from a quorum. The node's lease
    /// runs from its heartbeat's send time less this: it can be no fresher than the
    /// leader's own authority, so a leader cut off with a minority (which openraft does
    /// not step down) renews no lease past the one its successor's fence expects.
    #[serde(default)]
    pub quorum_ack_age_ms: u64,
}

/// The committed image sent to a broker-only node (it runs no Raft).
#[derive(Serialize, Deserialize)]
pub struct ImageUpdate {
    /// Log index the image includes at least.
    pub index: u64,
    pub catalog: crate::metadata::Catalog,
}

/// tokio's TCP stream as a futures-io stream (what futures-rustls drives).
pub struct Compat(pub TcpStream);

impl futures_lite::io::AsyncRead for Compat {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut rb = tokio::io::ReadBuf::new(buf);
        match tokio::io::AsyncRead::poll_read(Pin::new(&mut self.0), cx, &mut rb) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(rb.filled().len())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl futures_lite::io::AsyncWrite for Compat {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        tokio::io::AsyncWrite::poll_write(Pin::new(&mut self.0), cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        tokio::io::AsyncWrite::poll_flush(Pin::new(&mut self.0), cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        tokio::io::AsyncWrite::poll_shutdown(Pin::new(&mut self.0), cx)
    }
}

/// A controller connection's stream: TCP, or TLS over it.
pub trait Stream:
    futures_lite::io::AsyncRead + futures_lite::io::AsyncWrite + Unpin + Send + Sync
{
}
impl<T: futures_lite::io::AsyncRead + futures_lite::io::AsyncWrite + Unpin + Send + Sync> Stream
    for T
{
}
pub type BoxStream = Box<dyn Stream>;

/// The server side of an accepted controller connection: TLS when configured, bounded
/// by the connect timeout (a peer that stalls its handshake holds no slot for long).
pub async fn accept(s: TcpStream) -> std::io::Result<BoxStream> {
    let Some(tls) = crate::security::peer::controller_tls() else {
        return Ok(Box::new(Compat(s)));
    };
    let accept = futures_rustls::TlsAcceptor::from(tls.server.clone()).accept(Compat(s));
    let stream = timed(Duration::from_millis(RPC_TIMEOUT_MS), accept).await?;
    Ok(Box::new(stream))
}

/// The server side of SASL on the controller port: the first frame must be
/// [`Rpc::Authenticate`] with PLAIN credentials of the controller listener's users, sent
/// within [`RPC_TIMEOUT_MS`] and at most [`AUTH_FRAME_MAX_BYTES`]. A failure is logged
/// (rate limited), answered after `connection.failed.authentication.delay.ms`, and the
/// connection closes; `true` once authenticated.
pub async fn authenticate_incoming(
    s: &mut BoxStream,
    sasl: &crate::security::peer::ControllerSasl,
    peer: std::net::SocketAddr,
) -> bool {
    use crate::security::sasl::{Mechanism, SaslState, Step, step as sasl_step};
    let rpc_timeout = Duration::from_millis(RPC_TIMEOUT_MS);
    let body = match timed(rpc_timeout, read_frame_max(s, AUTH_FRAME_MAX_BYTES)).await {
        Ok(b) => b,
        Err(e) => {
            crate::client_warn!(%peer, "controller port: no SASL authentication: {e}");
            return false;
        }
    };
    let (mechanism, token) = match serde_json::from_slice::<Rpc>(&body) {
        Ok(Rpc::Authenticate { mechanism, token }) => (mechanism, token),
        _ => {
            crate::client_warn!(%peer, "controller port: a request before SASL authentication; closing");
            return false;
        }
    };
    let step = match Mechanism::parse(&mechanism) {
        Some(Mechanism::Plain) => {
            let mut state = SaslState::Token(Mechanism::Plain);
            let nothing = crate::metadata::Catalog::default();
            sasl_step(&mut state, &sasl.server, &nothing, &token)
        }
        _ => Step::Failure(format!(
            "mechanism {mechanism:?} is not offered on the controller port ({CONTROLLER_MECHANISM})"
        )),
    };
    let reply = match step {
        Step::Success { user, .. } => {
            tracing::debug!(%peer, %user, "controller port: authenticated");
            Ok(())
        }
        Step::Failure(why) => {
            crate::client_warn!(%peer, "controller port: SASL authentication failed: {why}");
            // Slows down guessing, as on the client listeners.
            tokio::time::sleep(Duration::from_millis(sasl.server.failed_auth_delay_ms)).await;
            Err("authentication failed".to_string())
        }
        Step::Challenge(_) => Err("unexpected SASL challenge".to_string()),
    };
    let ok = reply.is_ok();
    let Ok(out) = serde_json::to_vec(&RpcReply::Authenticate(reply)) else {
        return false;
    };
    let written = timed(rpc_timeout, write_frame(s, &out)).await;
    ok && written.is_ok()
}

/// The client side: authenticates with this node's controller credentials.
async fn authenticate_outgoing(
    s: &mut BoxStream,
    sasl: &crate::security::peer::PeerSasl,
    addr: &str,
) -> std::io::Result<()> {
    let token = format!("\0{}\0{}", sasl.user, sasl.password).into_bytes();
    let rpc = Rpc::Authenticate {
        mechanism: CONTROLLER_MECHANISM.to_string(),
        token,
    };
    let body = serde_json::to_vec(&rpc).map_err(std::io::Error::other)?;
    let reply = timed(Duration::from_millis(RPC_TIMEOUT_MS), async {
        write_frame(s, &body).await?;
        read_frame_max(s, AUTH_FRAME_MAX_BYTES).await
    })
    .await?;
    match serde_json::from_slice::<RpcReply>(&reply) {
        Ok(RpcReply::Authenticate(Ok(()))) => Ok(()),
        Ok(RpcReply::Authenticate(Err(why))) => {
            crate::client_warn!(
                "SASL to controller {addr} refused: {why} (user {:?})",
                sasl.user
            );
            Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("SASL to controller {addr}: {why}"),
            ))
        }
        _ => Err(std::io::Error::other(format!(
            "SASL to controller {addr}: unexpected reply"
        ))),
    }
}

/// Connects to a voter's controller address (`HOST:PORT`), with TLS and SASL when
/// configured. Under TLS the voter's certificate must name HOST (unless
/// `ssl.endpoint.identification.algorithm` is empty).
async fn connect(addr: &str) -> std::io::Result<BoxStream> {
    let connect = TcpStream::connect(addr);
    let s = timed(Duration::from_millis(CONNECT_TIMEOUT_MS), connect).await?;
    s.set_nodelay(true)?;
    let mut stream: BoxStream = match crate::security::peer::controller_tls() {
        None => Box::new(Compat(s)),
        Some(tls) => {
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            let name = crate::security::tls::server_name(host, s.peer_addr()?);
            let connector = futures_rustls::TlsConnector::from(tls.client.clone());
            let handshake = connector.connect(name, Compat(s));
            let stream = timed(Duration::from_millis(RPC_TIMEOUT_MS), handshake)
                .await
                .map_err(|e| {
                    std::io::Error::new(e.kind(), format!("TLS to controller {addr}: {e}"))
                })?;
            Box::new(stream)
        }
    };
    if let Some(sasl) = crate::security::peer::controller_sasl() {
        authenticate_outgoing(&mut stream, &sasl.client, addr).await?;
    }
    Ok(stream)
}

/// Dials a voter (TCP, then the TLS handshake and SASL when configured) and closes
/// again: whether this node can reach it with its own connections (the election gate in
/// the quorum's `gate_elections`); refused credentials count as unreachable. Under TLS
/// 1.3 a peer that refuses only this node's client certificate does so after the
/// handshake, so that case still counts as reachable (unless SASL follows).
pub async fn probe(addr: &str) -> std::io::Result<()> {
    let mut s = connect(addr).await?;
    // close_notify, so the peer's read ends cleanly rather than with an error.
    let _ = timed(Duration::from_millis(CONNECT_TIMEOUT_MS), s.close()).await;
    Ok(())
}

/// Writes one frame (and flushes it: TLS holds written bytes until then).
pub async fn write_frame(s: &mut BoxStream, body: &[u8]) -> std::io::Result<()> {
    if body.len() > FRAME_MAX_BYTES {
        return Err(std::io::Error::other("frame larger than FRAME_MAX_BYTES"));
    }
    let mut buf = Vec::with_capacity(body.len() + 4);
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(body);
    s.write_all(&buf).await?;
    s.flush().await
}

/// Reads one frame (refusing one larger than [`FRAME_MAX_BYTES`]).
pub async fn read_frame(s: &mut BoxStream) -> std::io::Result<Vec<u8>> {
    read_frame_max(s, FRAME_MAX_BYTES).await
}

/// Reads one frame of at most `max` bytes.
async fn read_frame_max(s: &mut BoxStream, max: usize) -> std::io::Result<Vec<u8>> {
    assert!(max <= FRAME_MAX_BYTES);
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(std::io::Error::other(format!(
            "frame of {len} bytes is larger than {max}"
        )));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await?;
    Ok(body)
}

async fn timed<T>(
    ms: Duration,
    f: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    match tokio::time::timeout(ms, f).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "controller RPC timed out",
        )),
    }
}

/// A connection to one voter, made on first use and again after any failure.
pub struct Peer {
    addr: String,
    conn: Option<BoxStream>,
    /// The last call failed before it had a connection (the voter refused or did not
    /// answer the dial): the voter is unreachable, not merely slow.
    unreachable: bool,
    /// Whether the last call's frame exceeded [`FRAME_MAX_BYTES`] (not sent).
    too_large: bool,
}

impl Peer {
    pub fn new(addr: String) -> Peer {
        Peer {
            addr,
            conn: None,
            unreachable: false,
            too_large: false,
        }
    }

    /// Whether the last call failed dialling the voter (see [`Peer::call`]).
    pub fn unreachable(&self) -> bool {
        self.unreachable
    }

    /// Whether the last call was not sent because its frame was too large.
    pub fn too_large(&self) -> bool {
        self.too_large
    }

    /// Sends `rpc` and waits (at most `timeout`) for its reply.
    pub async fn call(&mut self, rpc: &Rpc, timeout: Duration) -> std::io::Result<RpcReply> {
        let body = serde_json::to_vec(rpc).map_err(std::io::Error::other)?;
        self.too_large = body.len() > FRAME_MAX_BYTES;
        if self.too_large {
            // Not sent (the peer would refuse it); the connection stays usable.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a {} byte frame exceeds FRAME_MAX_BYTES", body.len()),
            ));
        }
        let out = self.exchange(&body, timeout).await;
        if out.is_err() {
            self.conn = None;
        }
        let reply = out?;
        serde_json::from_slice(&reply).map_err(std::io::Error::other)
    }

    async fn exchange(&mut self, body: &[u8], timeout: Duration) -> std::io::Result<Vec<u8>> {
        // The connection is taken for the exchange and given back only after a whole
        // reply was read: a call dropped half way (openraft cancels RPCs) closes it, so a
        // late reply is never read as the answer to the next request.
        self.unreachable = false;
        let mut s = match self.conn.take() {
            Some(s) => s,
            None => connect(self.addr.as_str()).await.inspect_err(|_| {
                self.unreachable = true;
            })?,
        };
        let reply = timed(timeout, async {
            write_frame(&mut s, body).await?;
            read_frame(&mut s).await
        })
        .await?;
        self.conn = Some(s);
        Ok(reply)
    }
}

/// Makes a [`Network`] per target voter.
pub struct Factory {
    /// This node's `controller.quorum.voters`: a voter is dialled where this node's own
    /// configuration says (the membership's address was written by whichever voter
    /// initialised or snapshotted it, which may reach that voter another way).
    pub voters: std::collections::BTreeMap<i32, String>,
}

impl RaftNetworkFactory<TypeConfig> for Factory {
    type Network = Network;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Network {
        let configured = i32::try_from(target)
            .ok()
            .and_then(|id| self.voters.get(&id).cloned());
        Network {
            target,
            peer: Peer::new(configured.unwrap_or_else(|| node.addr.clone())),
        }
    }
}

/// openraft's client side to one voter.
pub struct Network {
    target: u64,
    peer: Peer,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<u64, BasicNode, RaftError<u64, E>>;

impl Network {
    async fn send<E: std::error::Error>(
        &mut self,
        rpc: Rpc,
        option: &RPCOption,
    ) -> Result<RpcReply, RPCError<u64, BasicNode, E>> {
        self.peer.call(&rpc, option.hard_ttl()).await.map_err(|e| {
            // A voter that cannot be dialled (killed, cut off) is Unreachable: openraft
            // then backs its replication stream off (`backoff`) instead of retrying at
            // once — measured: ~240 AppendEntries a second to a dead voter, each logged.
            if self.peer.unreachable() {
                RPCError::Unreachable(Unreachable::new(&e))
            } else {
                RPCError::Network(NetworkError::new(&e))
            }
        })
    }

    fn unexpected<E: std::error::Error>() -> RPCError<u64, BasicNode, E> {
        let e = std::io::Error::other("unexpected reply kind");
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for Network {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcErr> {
        let entries = u64::try_from(rpc.entries.len()).unwrap_or(u64::MAX);
        let sent = self.send(Rpc::Append(rpc), &option).await;
        if sent.is_err() && entries > 1 && self.peer.too_large() {
            // Several entries together outgrow a frame (each alone is bounded by
            // COMMAND_BYTES_MAX): openraft sends fewer next time.
            let hint = openraft::error::PayloadTooLarge::new_entries_hint(entries / 2);
            return Err(RPCError::PayloadTooLarge(hint));
        }
        match sent? {
            RpcReply::Append(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(Self::unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcErr<InstallSnapshotError>> {
        match self.send(Rpc::Snapshot(rpc), &option).await? {
            RpcReply::Snapshot(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(Self::unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RpcErr> {
        match self.send(Rpc::Vote(rpc), &option).await? {
            RpcReply::Vote(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(Self::unexpected()),
        }
    }
}
