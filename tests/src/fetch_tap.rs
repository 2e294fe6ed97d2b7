//! A recording Kafka proxy for tests: forwards every byte between clients and one broker
//! unchanged, and decodes each Fetch request and its response on the way — the client id,
//! version, KIP-227 `session_id` / `session_epoch`, how many partitions the request lists
//! and forgets, and the response's top-level error, session id and how many partitions it
//! answers (and with records). A test puts it in the broker's `advertised.listeners` so a
//! real client's fetches all cross it, then asserts on [`FetchTap::exchanges`] — what the
//! client really sent, not what it logged. Plaintext Kafka framing only (no TLS, and no
//! SASL v0 raw tokens, which are not framed as requests).
//!
//! Bounded: at most [`CONNECTIONS_MAX`] connections (two threads each), at most
//! [`EXCHANGES_MAX`] exchanges kept (later ones counted in [`FetchTap::dropped`]), and a
//! frame over [`DECODE_FRAME_MAX`] bytes is forwarded but not decoded. Decoding is by the
//! `kafka-protocol` crate; the peers are trusted clients and a weir under test, and a frame
//! that does not decode is recorded as such, never a panic. Dropping the tap closes every
//! connection and joins its threads.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::Decodable;

/// Connections the tap carries at once; more are closed on accept.
pub const CONNECTIONS_MAX: usize = 64;
/// Fetch exchanges kept; later ones are only counted.
pub const EXCHANGES_MAX: usize = 200_000;
/// Frames larger than this are forwarded without being decoded (a fetch response can be
/// as large as the client's `fetch.max.bytes`).
pub const DECODE_FRAME_MAX: usize = 64 << 20;
/// Bytes read from a socket at a time.
const CHUNK_BYTES: usize = 64 << 10;
/// How often blocked threads look at the stop flag.
const POLL: Duration = Duration::from_millis(20);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Fetch requests of one connection awaiting their response (Kafka clients pipeline a
/// few at most); beyond it the oldest is forgotten unanswered.
const IN_FLIGHT_MAX: usize = 1_024;

/// The session fields and sizes of one Fetch request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchSent {
    pub version: i16,
    pub session_id: i32,
    pub session_epoch: i32,
    /// Partitions listed in `topics` (all of them: a full fetch; the changed ones: an
    /// incremental fetch).
    pub partitions: usize,
    /// Partitions listed in `forgotten_topics_data`.
    pub forgotten: usize,
    /// The request frame's size, its 4-byte length included.
    pub bytes: usize,
}

/// What the broker answered to one Fetch request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchAnswered {
    pub error_code: i16,
    pub session_id: i32,
    /// Partitions in the response.
    pub partitions: usize,
    /// Of them, partitions whose `records` are non-empty.
    pub with_records: usize,
    /// The response frame's size, its 4-byte length included.
    pub bytes: usize,
}

/// One Fetch request and (once it came) its response, in the order requests were sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchExchange {
    /// Which tap connection (numbered from 0 in accept order).
    pub connection: u64,
    pub client_id: Option<String>,
    /// `None`: the request did not decode (or was too large to).
    pub sent: Option<FetchSent>,
    pub answered: Option<FetchAnswered>,
}

impl FetchExchange {
    /// Whether the request was a KIP-227 full fetch (epoch 0 opens a session, -1 none).
    pub fn is_full(&self) -> bool {
        self.sent.as_ref().is_some_and(|s| s.session_epoch <= 0)
    }
}

struct Shared {
    target: Mutex<Option<SocketAddr>>,
    stop: AtomicBool,
    next_connection: AtomicU64,
    exchanges: Mutex<Vec<FetchExchange>>,
    dropped: AtomicU64,
    /// Clones of each open connection's two sockets, shut down when the tap is dropped.
    sockets: Mutex<HashMap<u64, [TcpStream; 2]>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The recording proxy; see the module doc.
pub struct FetchTap {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl FetchTap {
    /// Listens on an ephemeral 127.0.0.1 port; connections are closed until
    /// [`set_target`](Self::set_target) names the broker (so the tap's address can go into
    /// the broker's own `advertised.listeners` before it starts).
    pub fn start() -> Result<FetchTap> {
        let listener = TcpListener::bind("127.0.0.1:0").context("bind the fetch tap")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(None),
            stop: AtomicBool::new(false),
            next_connection: AtomicU64::new(0),
            exchanges: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
            sockets: Mutex::new(HashMap::new()),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name(format!("fetch-tap-{}", addr.port()))
            .spawn(move || accept_loop(listener, s))?;
        Ok(FetchTap {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// Where clients connect (and what the broker advertises).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Forwards new connections to `target`.
    pub fn set_target(&self, target: SocketAddr) {
        *lock(&self.shared.target) = Some(target);
    }

    /// Every Fetch exchange so far, in the order the requests crossed the tap.
    pub fn exchanges(&self) -> Vec<FetchExchange> {
        lock(&self.shared.exchanges).clone()
    }

    /// The exchanges of connections whose client id is `client_id`.
    pub fn exchanges_of(&self, client_id: &str) -> Vec<FetchExchange> {
        lock(&self.shared.exchanges)
            .iter()
            .filter(|e| e.client_id.as_deref() == Some(client_id))
            .cloned()
            .collect()
    }

    /// Exchanges not kept because [`EXCHANGES_MAX`] were.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Acquire)
    }

    /// Waits (bounded) until `done` holds for the exchanges of `client_id`.
    pub fn wait_for(
        &self,
        client_id: &str,
        timeout: Duration,
        what: &str,
        done: impl Fn(&[FetchExchange]) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.exchanges_of(client_id);
            if done(&seen) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let tail: Vec<_> = seen.iter().rev().take(5).collect();
                bail!(
                    "{client_id}: {what} not seen within {timeout:?} ({} fetches; last: {tail:?})",
                    seen.len()
                );
            }
            std::thread::sleep(POLL * 5);
        }
    }
}

impl Drop for FetchTap {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for pair in lock(&self.shared.sockets).values() {
            for s in pair {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        conns.retain(|c| !c.is_finished());
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) => {
                std::thread::sleep(POLL);
                continue;
            }
        };
        let target = *lock(&shared.target);
        let (Some(target), true) = (target, conns.len() < CONNECTIONS_MAX) else {
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        };
        let id = shared.next_connection.fetch_add(1, Ordering::AcqRel);
        let s = shared.clone();
        if let Ok(t) = std::thread::Builder::new()
            .name("fetch-tap-up".into())
            .spawn(move || connection(id, stream, target, &s))
        {
            conns.push(t);
        }
    }
    for c in conns {
        let _ = c.join();
    }
}

/// Fetch requests of one connection awaiting a response: correlation id → (version,
/// index in the exchange log).
type InFlight = Arc<Mutex<HashMap<i32, (i16, Option<usize>)>>>;

fn connection(id: u64, client: TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    let Ok(server) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(POLL));
    }
    let clones = (
        client.try_clone(),
        server.try_clone(),
        client.try_clone(),
        server.try_clone(),
    );
    let (Ok(client_w), Ok(server_w), Ok(client_keep), Ok(server_keep)) = clones else {
        return;
    };
    lock(&shared.sockets).insert(id, [client_keep, server_keep]);
    let in_flight: InFlight = Arc::new(Mutex::new(HashMap::new()));
    let down = {
        let (shared, in_flight) = (shared.clone(), in_flight.clone());
        std::thread::Builder::new()
            .name("fetch-tap-down".into())
            .spawn(move || {
                pump(server, client_w, &shared, |frame| {
                    answered(frame, &in_flight, &shared)
                })
            })
    };
    let mut up = Upstream {
        id,
        client_id: None,
        in_flight,
    };
    pump(client, server_w, shared, |frame| up.sent(frame, shared));
    if let Ok(d) = down {
        let _ = d.join();
    }
    lock(&shared.sockets).remove(&id);
}

/// A byte stream cut into Kafka frames (size i32, then that many bytes).
#[derive(Default)]
struct Frames {
    buf: Vec<u8>,
    /// Bytes of an oversized frame still to pass undecoded.
    skip: usize,
}

impl Frames {
    /// Adds bytes; calls `each` with every complete frame body (without its size).
    fn push(&mut self, mut bytes: &[u8], each: &mut impl FnMut(Option<Bytes>)) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            self.buf.extend_from_slice(bytes);
            bytes = &[];
            while self.buf.len() >= 4 {
                let size = i32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
                let size = usize::try_from(size).unwrap_or(0);
                if size > DECODE_FRAME_MAX {
                    let have = self.buf.len() - 4;
                    each(None);
                    if have >= size {
                        self.buf.drain(..4 + size);
                    } else {
                        self.skip = size - have;
                        self.buf.clear();
                    }
                    continue;
                }
                if self.buf.len() < 4 + size {
                    break;
                }
                let body = Bytes::copy_from_slice(&self.buf[4..4 + size]);
                self.buf.drain(..4 + size);
                each(Some(body));
            }
        }
    }
}

/// Copies `from` → `to` until either side closes or the tap stops, handing each frame to
/// `on_frame` before it is forwarded (so a request is in flight before its answer can
/// come back).
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    shared: &Shared,
    mut on_frame: impl FnMut(Option<Bytes>),
) {
    let mut frames = Frames::default();
    let mut chunk = vec![0u8; CHUNK_BYTES];
    while !shared.stop.load(Ordering::Acquire) {
        match from.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                frames.push(&chunk[..n], &mut on_frame);
                if to.write_all(&chunk[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// The client → broker side of one connection.
struct Upstream {
    id: u64,
    client_id: Option<String>,
    in_flight: InFlight,
}

impl Upstream {
    fn sent(&mut self, frame: Option<Bytes>, shared: &Shared) {
        let Some(frame) = frame else { return };
        if frame.len() < 8 {
            return;
        }
        let api_key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        if api_key != ApiKey::Fetch as i16 {
            if self.client_id.is_none() {
                self.client_id = header_client_id(&frame);
            }
            return;
        }
        let bytes = frame.len() + 4;
        let mut body = frame;
        let header_version = ApiKey::Fetch.request_header_version(version);
        let sent = RequestHeader::decode(&mut body, header_version)
            .ok()
            .and_then(|h| {
                if self.client_id.is_none() {
                    self.client_id = h.client_id.map(|c| c.to_string());
                }
                FetchRequest::decode(&mut body, version).ok()
            })
            .map(|r| FetchSent {
                version,
                session_id: r.session_id,
                session_epoch: r.session_epoch,
                partitions: r.topics.iter().map(|t| t.partitions.len()).sum(),
                forgotten: r
                    .forgotten_topics_data
                    .iter()
                    .map(|t| t.partitions.len())
                    .sum(),
                bytes,
            });
        let exchange = FetchExchange {
            connection: self.id,
            client_id: self.client_id.clone(),
            sent,
            answered: None,
        };
        let index = {
            let mut log = lock(&shared.exchanges);
            if log.len() < EXCHANGES_MAX {
                log.push(exchange);
                Some(log.len() - 1)
            } else {
                shared.dropped.fetch_add(1, Ordering::AcqRel);
                None
            }
        };
        let mut in_flight = lock(&self.in_flight);
        if in_flight.len() >= IN_FLIGHT_MAX {
            in_flight.clear();
        }
        in_flight.insert(correlation_id, (version, index));
    }
}

/// The client id of a request header of any API (v1+ headers: after api key, version and
/// correlation id, a nullable string16).
fn header_client_id(frame: &[u8]) -> Option<String> {
    let len = i16::from_be_bytes([*frame.get(8)?, *frame.get(9)?]);
    let len = usize::try_from(len).ok()?;
    let id = frame.get(10..10 + len)?;
    Some(String::from_utf8_lossy(id).into_owned())
}

/// A broker → client frame: if it answers a Fetch this connection sent, records it.
fn answered(frame: Option<Bytes>, in_flight: &InFlight, shared: &Shared) {
    let Some(frame) = frame else { return };
    if frame.len() < 4 {
        return;
    }
    let correlation_id = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
    let Some((version, index)) = lock(in_flight).remove(&correlation_id) else {
        return;
    };
    let Some(index) = index else { return };
    let bytes = frame.len() + 4;
    let mut body = frame;
    let header_version = ApiKey::Fetch.response_header_version(version);
    let Some(resp) = ResponseHeader::decode(&mut body, header_version)
        .ok()
        .and_then(|_| FetchResponse::decode(&mut body, version).ok())
    else {
        return;
    };
    let parts = resp.responses.iter().flat_map(|t| &t.partitions);
    let answer = FetchAnswered {
        error_code: resp.error_code,
        session_id: resp.session_id,
        partitions: parts.clone().count(),
        with_records: parts
            .filter(|p| p.records.as_ref().is_some_and(|r| !r.is_empty()))
            .count(),
        bytes,
    };
    if let Some(e) = lock(&shared.exchanges).get_mut(index) {
        e.answered = Some(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_cut_across_reads_and_oversized_ones_skipped() {
        let mut f = Frames::default();
        let mut got: Vec<Option<Vec<u8>>> = Vec::new();
        let mut each = |b: Option<Bytes>| got.push(b.map(|b| b.to_vec()));
        let mut stream = Vec::new();
        stream.extend_from_slice(&3i32.to_be_bytes());
        stream.extend_from_slice(b"abc");
        stream.extend_from_slice(&2i32.to_be_bytes());
        stream.extend_from_slice(b"de");
        for byte in &stream {
            f.push(std::slice::from_ref(byte), &mut each);
        }
        let big = (DECODE_FRAME_MAX + 1) as i32;
        f.push(&big.to_be_bytes(), &mut each);
        f.push(&vec![0u8; DECODE_FRAME_MAX + 1], &mut each);
        f.push(&1i32.to_be_bytes(), &mut each);
        f.push(b"z", &mut each);
        assert_eq!(
            got,
            vec![
                Some(b"abc".to_vec()),
                Some(b"de".to_vec()),
                None,
                Some(b"z".to_vec())
            ]
        );
    }
}
