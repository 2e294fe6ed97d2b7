//! One blocking TCP connection to a broker: framing, headers, version negotiation.
//!
//! Framing, headers and message bodies go through `wire` (`wire::frame`, `wire::messages`,
//! which carries `kafka-protocol`'s message types).
//! Every read is bounded by `MAX_RESPONSE_BYTES` and a socket timeout.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::Request;
use wire::{frame, messages};

use super::security::{self, Stream};

/// Largest response we accept (a fetch of many partitions can be large).
pub const MAX_RESPONSE_BYTES: usize = 256 << 20;
/// How long a blocking read or write may take before the connection is declared dead.
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const CLIENT_ID: &str = "weir-loadgen";

/// The version range of each API the broker advertised.
#[derive(Clone, Debug, Default)]
pub struct Versions(HashMap<i16, (i16, i16)>);

impl Versions {
    /// The highest version both sides speak: ours is `lo..=hi`.
    pub fn pick(&self, api_key: i16, lo: i16, hi: i16) -> Result<i16> {
        let &(bmin, bmax) = self
            .0
            .get(&api_key)
            .ok_or_else(|| anyhow!("broker does not support API key {api_key}"))?;
        let v = hi.min(bmax);
        if v < lo.max(bmin) {
            bail!(
                "no common version for API key {api_key}: broker {bmin}..={bmax}, ours {lo}..={hi}"
            );
        }
        Ok(v)
    }

    /// Whether the broker supports the API at all.
    pub fn has(&self, api_key: i16) -> bool {
        self.0.contains_key(&api_key)
    }
}

/// Encodes a whole request frame (size prefix, header, body) with `wire::messages`.
pub fn encode_request<R: Request>(req: &R, version: i16, correlation_id: i32) -> Result<Bytes> {
    let header = frame::RequestHeader {
        api_key: R::KEY,
        api_version: version,
        correlation_id,
        client_id: Some(Bytes::from_static(CLIENT_ID.as_bytes())),
    };
    messages::encode_request(&header, req).map_err(|e| anyhow!("{e}"))
}

/// Decodes a response frame (without size prefix) for request type `R` at `version`,
/// checking the correlation id.
pub fn decode_response<R: Request>(
    frame_bytes: Bytes,
    version: i16,
    correlation_id: i32,
) -> Result<R::Response> {
    let (corr, resp) = messages::decode_response_as::<R::Response>(R::KEY, version, &frame_bytes)
        .map_err(|e| anyhow!("{e}"))?;
    if corr != correlation_id {
        bail!("correlation id {corr} in response, expected {correlation_id}");
    }
    Ok(resp)
}

/// Reads one frame; returns its bytes without the size prefix.
pub fn read_frame(stream: &mut Stream) -> Result<Bytes> {
    let mut prefix = [0u8; frame::SIZE_PREFIX_BYTES];
    stream
        .read_exact(&mut prefix)
        .context("reading frame size")?;
    let size = match frame::check_frame(&prefix, MAX_RESPONSE_BYTES) {
        Ok(frame::FrameStatus::Incomplete { need }) => need - frame::SIZE_PREFIX_BYTES,
        Ok(frame::FrameStatus::Complete { size }) => size,
        Err(e) => bail!("bad frame from broker: {e}"),
    };
    // Into spare capacity, not zeroed first on a plain socket (a fetch can be 64 MiB).
    let mut buf = Vec::with_capacity(size);
    stream
        .read_body(size, &mut buf)
        .context("reading frame body")?;
    if buf.len() != size {
        bail!(
            "connection closed inside a frame ({} of {size} bytes)",
            buf.len()
        );
    }
    Ok(Bytes::from(buf))
}

/// Whether `e` is a socket read or write that ran out of time (the socket's timeout), as
/// opposed to a connection that broke.
pub fn is_timeout(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        })
}

/// Connects to the first of `addrs` that accepts, in order (as Kafka's client tries each
/// address a name resolves to: `localhost` may give ::1 first and the broker listen on
/// 127.0.0.1 only).
fn connect_any(addrs: &[SocketAddr]) -> Result<(SocketAddr, TcpStream)> {
    let mut failures = Vec::new();
    for &sa in addrs {
        match TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT) {
            Ok(s) => return Ok((sa, s)),
            Err(e) => failures.push(format!("{sa}: {e}")),
        }
    }
    if failures.is_empty() {
        bail!("the address resolves to nothing");
    }
    bail!("{}", failures.join("; "))
}

/// A connected broker with negotiated versions.
pub struct Conn {
    pub addr: SocketAddr,
    pub stream: Stream,
    pub versions: Versions,
    next_correlation_id: i32,
}

impl Conn {
    /// Connects to `addr`, secures the connection as the process's
    /// [`security`](super::security) says (TLS handshake; SASL after ApiVersions) and asks
    /// for the broker's API versions.
    pub fn connect(addr: &str) -> Result<Self> {
        Self::connect_timed(addr, SOCKET_TIMEOUT)
    }

    /// [`Conn::connect`], with reads bounded by `read_timeout` instead of
    /// [`SOCKET_TIMEOUT`] (Kafka's request.timeout.ms, for a client that has one): a read
    /// that waits longer fails with an error [`is_timeout`] recognises.
    pub fn connect_timed(addr: &str, read_timeout: Duration) -> Result<Self> {
        anyhow::ensure!(!read_timeout.is_zero(), "a read timeout of 0 is no timeout");
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .with_context(|| format!("resolving {addr}"))?
            .collect();
        let (sa, stream) = connect_any(&addrs).with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(read_timeout))?;
        stream.set_write_timeout(Some(SOCKET_TIMEOUT))?;
        // The name a broker's certificate must carry: the host part as dialled.
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let stream = Stream::secure(stream, host).with_context(|| format!("securing {addr}"))?;
        let mut conn = Self {
            addr: sa,
            stream,
            versions: Versions::default(),
            next_correlation_id: 1,
        };
        // v0 is answered by every broker, and carries the whole table.
        let resp: ApiVersionsResponse = conn.call(&ApiVersionsRequest::default(), 0)?;
        if resp.error_code != 0 {
            bail!("ApiVersions failed with error code {}", resp.error_code);
        }
        for k in resp.api_keys {
            conn.versions
                .0
                .insert(k.api_key, (k.min_version, k.max_version));
        }
        security::authenticate(&mut conn).with_context(|| format!("authenticating to {addr}"))?;
        Ok(conn)
    }

    /// A fresh correlation id.
    pub fn next_id(&mut self) -> i32 {
        let id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1).max(1);
        id
    }

    /// Sends one request and waits for its response (no pipelining).
    pub fn call<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response> {
        let id = self.send(req, version)?;
        self.recv::<R>(version, id)
    }

    /// Sends one request without waiting; returns its correlation id for [`Conn::recv`].
    /// Responses come back in request order.
    pub fn send<R: Request>(&mut self, req: &R, version: i16) -> Result<i32> {
        let id = self.next_id();
        let bytes = encode_request(req, version, id)?;
        self.stream.write_all(&bytes).context("sending request")?;
        Ok(id)
    }

    /// Reads the response to the request sent as `correlation_id`.
    pub fn recv<R: Request>(&mut self, version: i16, correlation_id: i32) -> Result<R::Response> {
        let frame_bytes = read_frame(&mut self.stream)?;
        decode_response::<R>(frame_bytes, version, correlation_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_tries_every_resolved_address() {
        let refused = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr")
        };
        let open = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let good = open.local_addr().expect("addr");
        let (sa, _stream) = connect_any(&[refused, good]).expect("the second address");
        assert_eq!(sa, good);
        let e = connect_any(&[refused]).expect_err("nothing listens");
        assert!(e.to_string().contains(&refused.to_string()), "{e}");
        assert!(connect_any(&[]).is_err());
    }

    /// A read past the connection's read timeout is told apart from a broken connection.
    #[test]
    fn a_read_that_times_out_is_a_timeout() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let sock = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (server, _) = l.accept().expect("accept");
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("timeout");
        let mut stream = Stream::Plain(sock);
        let e = read_frame(&mut stream).expect_err("nothing is sent");
        assert!(is_timeout(&e), "{e:#}");
        drop(server);
        let e = read_frame(&mut stream).expect_err("closed");
        assert!(!is_timeout(&e), "{e:#}");
    }
}
