//! A broker's own client connection to another broker, on the shard's glommio executor:
//! one request at a time (a replication fetcher sends one Fetch, waits for it, sends the
//! next), every step bounded by a deadline, every response bounded in size. Framing and
//! messages go through `wire`, as the load generator's client does.
//!
//! The connection speaks the inter-broker listener's protocol ([`crate::security::peer`]):
//! TLS by rustls with the node's truststore, then SASL (PLAIN or SCRAM) with the node's
//! inter-broker credentials, before the first request. A peer whose certificate does not
//! verify, or that refuses the credentials, fails the connect with a logged reason.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_lite::io::{AsyncRead, AsyncWrite};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::protocol::Request;
use wire::NodeId;
use wire::frame::{self, FrameStatus, RequestHeader};

use crate::shard::mesh::within;

/// Largest response a broker connection accepts (a fetch carries at most
/// `replica.fetch.response.max.bytes`; this bounds a broken peer).
pub const RESPONSE_MAX_BYTES: usize = 256 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The client id of a broker's connections; a replica fetcher's adds its node id
/// (`weir-replica-fetcher-<node id>`), so the leader's logs and a fault proxy in a test
/// can tell one follower's fetches from another's.
pub const CLIENT_ID: &str = "weir-replica-fetcher";

/// Why a call to another broker failed; the fetcher reconnects after any of them.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0} timed out")]
    TimedOut(&'static str),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Wire(#[from] wire::WireError),
    #[error("correlation id {got}, expected {want}")]
    Correlation { got: i32, want: i32 },
    #[error("TLS to {addr}: {source}")]
    Tls {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("SASL to {addr}: {why}")]
    Sasl { addr: SocketAddr, why: String },
}

/// The byte stream of a broker connection: TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Stream for T {}

/// One connection to a broker.
pub struct BrokerConn {
    stream: Box<dyn Stream>,
    /// The socket, on plain TCP: a response is read with `recv` straight into its
    /// buffer's spare capacity, which need not be zeroed first (`None` under TLS).
    plain_fd: Option<RawFd>,
    next_correlation_id: i32,
    client_id: Bytes,
    /// KIP-368: the peer's address and the credentials to log in again with, and when
    /// to (a share of the session lifetime the peer announced), so that a peer started
    /// with `connections.max.reauth.ms` does not close this connection at its end.
    reauth: Option<(SocketAddr, crate::security::peer::PeerSasl)>,
    reauth_at: Option<Instant>,
}

/// Share of the announced session lifetime after which a connection re-authenticates
/// before its next request (the Java client picks 85–95%).
const REAUTH_AT_PERCENT: u32 = 85;

impl BrokerConn {
    /// A connection to `host` (resolved to `addr`) whose requests name
    /// `weir-replica-fetcher-<local>` as client id.
    pub async fn connect_from(
        host: &str,
        addr: SocketAddr,
        local: NodeId,
    ) -> Result<BrokerConn, ClientError> {
        let mut conn = BrokerConn::connect_to(host, addr).await?;
        conn.client_id = Bytes::from(format!("{CLIENT_ID}-{local}"));
        Ok(conn)
    }

    /// A connection to `addr`, its TLS certificate checked against the IP address.
    pub async fn connect(addr: SocketAddr) -> Result<BrokerConn, ClientError> {
        BrokerConn::connect_to(&addr.ip().to_string(), addr).await
    }

    /// A connection to the peer registered as `host` (resolved to `addr`): under TLS its
    /// certificate must name `host` (`ssl.endpoint.identification.algorithm`).
    pub async fn connect_to(host: &str, addr: SocketAddr) -> Result<BrokerConn, ClientError> {
        let connect = TcpStream::connect_timeout(addr, CONNECT_TIMEOUT);
        let stream = connect.await.map_err(|e| ClientError::Connect {
            addr,
            source: std::io::Error::other(e.to_string()),
        })?;
        stream
            .set_nodelay(true)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let peer = crate::security::peer::get();
        let mut plain_fd = None;
        let stream: Box<dyn Stream> = match peer.and_then(|p| p.tls.clone()) {
            None => {
                plain_fd = Some(stream.as_raw_fd());
                Box::new(stream)
            }
            Some(config) => {
                let name = crate::security::tls::server_name(host, addr);
                let connect = futures_rustls::TlsConnector::from(config).connect(name, stream);
                let deadline = Instant::now() + CONNECT_TIMEOUT;
                let tls = within(deadline, connect)
                    .await
                    .ok_or(ClientError::TimedOut("TLS handshake"))?
                    .map_err(|source| ClientError::Tls { addr, source })?;
                Box::new(tls)
            }
        };
        let mut conn = BrokerConn {
            stream,
            plain_fd,
            next_correlation_id: 1,
            client_id: Bytes::from_static(CLIENT_ID.as_bytes()),
            reauth: None,
            reauth_at: None,
        };
        if let Some(sasl) = peer.and_then(|p| p.sasl.as_ref()) {
            conn.authenticate(addr, sasl).await?;
            conn.reauth = Some((addr, sasl.clone()));
        }
        Ok(conn)
    }

    /// SaslHandshake v1 and SaslAuthenticate v1 with the inter-broker credentials; the
    /// answer's session lifetime (KIP-368) sets when to log in again.
    async fn authenticate(
        &mut self,
        addr: SocketAddr,
        sasl: &crate::security::peer::PeerSasl,
    ) -> Result<(), ClientError> {
        use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let refused = |why: String| ClientError::Sasl { addr, why };
        let mechanism = sasl.mechanism.name();
        let req = SaslHandshakeRequest::default().with_mechanism(
            kafka_protocol::protocol::StrBytes::from_static_str(mechanism),
        );
        let resp = self.exchange(&req, 1, deadline).await?;
        if resp.error_code != 0 {
            return Err(refused(format!(
                "SaslHandshake {mechanism}: error {}",
                resp.error_code
            )));
        }
        let (mut login, mut token) =
            wire::sasl::Login::start(sasl.mechanism, &sasl.user, &sasl.password);
        loop {
            let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
            let resp = self.exchange(&req, 1, deadline).await?;
            if resp.error_code != 0 {
                return Err(refused(format!(
                    "SaslAuthenticate: error {} {}",
                    resp.error_code,
                    resp.error_message.as_deref().unwrap_or_default()
                )));
            }
            match login.answer(&resp.auth_bytes) {
                Ok(Some(next)) => token = next,
                Ok(None) => {
                    self.reauth_at = reauth_at(Instant::now(), resp.session_lifetime_ms);
                    return Ok(());
                }
                Err(e) => return Err(refused(e.to_string())),
            }
        }
    }

    /// Sends `req` at `version` and returns its response, all by `deadline`; first logs
    /// in again on this connection if the session is near its end (KIP-368).
    pub async fn call<R: Request>(
        &mut self,
        req: &R,
        version: i16,
        deadline: Instant,
    ) -> Result<R::Response, ClientError> {
        if self.reauth_at.is_some_and(|at| Instant::now() >= at)
            && let Some((addr, sasl)) = self.reauth.clone()
        {
            tracing::debug!(%addr, "re-authenticating to the peer (KIP-368)");
            self.authenticate(addr, &sasl).await?;
        }
        self.exchange(req, version, deadline).await
    }

    /// One request and its response, by `deadline`.
    async fn exchange<R: Request>(
        &mut self,
        req: &R,
        version: i16,
        deadline: Instant,
    ) -> Result<R::Response, ClientError> {
        let id = self.next_correlation_id;
        self.next_correlation_id = id.wrapping_add(1).max(1);
        let header = RequestHeader {
            api_key: R::KEY,
            api_version: version,
            correlation_id: id,
            client_id: Some(self.client_id.clone()),
        };
        let frame = wire::messages::encode_request(&header, req)?;
        within(deadline, async {
            self.stream.write_all(&frame).await?;
            // TLS holds written bytes in its record buffer until flushed.
            self.stream.flush().await
        })
        .await
        .ok_or(ClientError::TimedOut("request write"))??;
        let body = within(deadline, read_frame(&mut self.stream, self.plain_fd))
            .await
            .ok_or(ClientError::TimedOut("response read"))??;
        let (got, resp) =
            wire::messages::decode_response_as::<R::Response>(R::KEY, version, &body)?;
        if got != id {
            return Err(ClientError::Correlation { got, want: id });
        }
        Ok(resp)
    }
}

/// When a session that began at `now` with `lifetime_ms` (0: none) should be renewed.
fn reauth_at(now: Instant, lifetime_ms: i64) -> Option<Instant> {
    let lifetime = Duration::from_millis(u64::try_from(lifetime_ms).ok().filter(|ms| *ms > 0)?);
    Some(now + lifetime * REAUTH_AT_PERCENT / 100)
}

/// Reads one response frame (without its size prefix), at most [`RESPONSE_MAX_BYTES`].
/// On plain TCP (`plain_fd`) the body is received into the spare capacity of a buffer of
/// its size, never zeroed (a fetch response is up to `replica.fetch.response.max.bytes`,
/// and zeroing it cost as much as a copy); under TLS it is read into a zeroed buffer.
async fn read_frame(
    stream: &mut Box<dyn Stream>,
    plain_fd: Option<RawFd>,
) -> Result<Bytes, ClientError> {
    let mut prefix = [0u8; frame::SIZE_PREFIX_BYTES];
    stream.read_exact(&mut prefix).await?;
    let size = match frame::check_frame(&prefix, RESPONSE_MAX_BYTES)? {
        FrameStatus::Incomplete { need } => need - frame::SIZE_PREFIX_BYTES,
        FrameStatus::Complete { .. } => 0,
    };
    let Some(fd) = plain_fd else {
        let mut body = BytesMut::zeroed(size);
        stream.read_exact(&mut body).await?;
        return Ok(body.freeze());
    };
    let mut body = BytesMut::with_capacity(size);
    while body.len() < size {
        let want = size - body.len();
        match crate::server::conn::recv_now(fd, &mut body, want)? {
            Some(0) => return Err(ClientError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Some(_) => {}
            // Nothing to take now: one byte through glommio waits for the socket (the
            // rest comes with the next `recv`).
            None => {
                let mut one = [0u8; 1];
                stream.read_exact(&mut one).await?;
                body.extend_from_slice(&one);
            }
        }
    }
    assert_eq!(
        body.len(),
        size,
        "a frame body is read to its size, not past it"
    );
    Ok(body.freeze())
}
