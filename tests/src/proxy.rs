//! A TCP fault proxy for tests: listens on an ephemeral 127.0.0.1 port and forwards every
//! connection to one target, or cuts it. Modes: [`Mode::Pass`] forwards; [`Mode::Blackhole`]
//! keeps connections open but moves no byte either way (a cut cable: what the peers send
//! is held, bounded, so their requests time out; back to `Pass`, what is still held flows
//! on, as TCP delivers after a short cut, but a peer that closed its end during the cut
//! gave up and its bytes are dropped); [`Mode::Refuse`] closes existing and new
//! connections (what was held is dropped); [`Mode::HoldResponses`] cuts only the way back
//! (requests pass, answers are held), and [`Mode::HoldAfterResponse`] becomes it once one
//! large answer has passed — one follower fetch answer through, the next ones held.
//!
//! A Kafka-aware proxy ([`FaultProxy::kafka`]) reads the request header of the first frame
//! of each connection (size i32, api_key i16, api_version i16, correlation id i32,
//! client_id nullable string16) before forwarding it, and [rules](FaultProxy::set_rule)
//! apply a mode to the connections whose client id matches a predicate only — so one
//! follower's fetches (`weir-replica-fetcher-<node id>`) can be cut while clients and other
//! followers pass. Modes and rules apply to open connections too, within [`POLL`].
//!
//! Bounded: at most [`CONNECTIONS_MAX`] connections (two threads each), per direction a
//! [`CHUNK_BYTES`] buffer and at most [`HELD_MAX`] held; counters ([`ProxyStats`], [`ClientStats`]) let a
//! test wait on what crossed. Dropping the proxy closes everything and joins its threads.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Connections one proxy carries at once; more are closed on accept (and counted).
pub const CONNECTIONS_MAX: usize = 64;
/// Bytes one direction of one connection reads at a time.
pub const CHUNK_BYTES: usize = 64 << 10;
/// Bytes one direction of one connection holds while it is cut (then it stops reading).
pub const HELD_MAX: usize = 1 << 20;
/// How often blocked threads look at the mode, the rules and the stop flag.
pub const POLL: Duration = Duration::from_millis(20);
/// Largest first-frame header read to find the client id (4 + 10 + a 32,767-byte id).
const HEADER_MAX: usize = 4 + 10 + i16::MAX as usize;
/// A Kafka client must send its first request within this long, else it is forwarded
/// with no client id.
const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Distinct client ids counted per proxy (later ones are counted under `"?"`).
const CLIENT_IDS_MAX: usize = 64;

/// What the proxy does with a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    Pass,
    /// Keep the connection open, forward nothing either way.
    Blackhole,
    /// Close it (new ones are closed on accept, or after their first frame is read).
    Refuse,
    /// Forward requests, hold every response (a cut in the target → client direction
    /// only): what the target answers is held as in [`Mode::Blackhole`].
    HoldResponses,
    /// Forward both ways until one response frame of at least `min_bytes` (size prefix
    /// included) has been forwarded whole, then, for every connection the same rule
    /// matches, [`Mode::HoldResponses`]: the peer gets that response and no later one
    /// (e.g. a follower gets the fetch answer carrying a batch, not the next one carrying
    /// the HW that batch moved). Responses are told apart by their size prefixes, so a
    /// connection must carry Kafka frames.
    HoldAfterResponse { min_bytes: usize },
}

impl Mode {
    /// Whether bytes move in this direction (`up`: client → target) in this mode.
    fn passes(self, up: bool) -> bool {
        match self {
            Mode::Pass | Mode::HoldAfterResponse { .. } => true,
            Mode::HoldResponses => up,
            Mode::Blackhole | Mode::Refuse => false,
        }
    }
}

/// A predicate on a connection's client id (`None`: no id, or not a Kafka proxy).
pub type ClientMatch = Arc<dyn Fn(Option<&str>) -> bool + Send + Sync>;

/// Totals of one proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted (including ones closed at once).
    pub accepted: u64,
    /// Connections closed by the proxy: `Refuse`, the connection limit, no target.
    pub refused: u64,
    /// Connections open now.
    pub open: u64,
    /// Bytes forwarded to the target / back to the clients.
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// Totals of the connections of one client id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub connections: u64,
    pub open: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Bytes the target sent that the proxy holds now (a hold mode, or not yet written).
    pub held_down: u64,
}

struct Rule {
    name: String,
    matches: ClientMatch,
    mode: Mode,
}

struct Shared {
    target: Mutex<Option<SocketAddr>>,
    kafka: bool,
    default_mode: Mutex<Mode>,
    rules: Mutex<Vec<Rule>>,
    stop: AtomicBool,
    accepted: AtomicU64,
    refused: AtomicU64,
    open: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    clients: Mutex<BTreeMap<String, ClientStats>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Shared {
    /// The mode for a connection with `client_id`: the first matching rule's, else the
    /// proxy's.
    fn mode_for(&self, client_id: Option<&str>) -> Mode {
        if self.stop.load(Ordering::Acquire) {
            return Mode::Refuse;
        }
        let rules = lock(&self.rules);
        if let Some(r) = rules.iter().find(|r| (r.matches)(client_id)) {
            return r.mode;
        }
        *lock(&self.default_mode)
    }

    /// A [`Mode::HoldAfterResponse`] rule (or default) that matched `client_id` has let
    /// its response through: from now on it holds responses.
    fn trip(&self, client_id: Option<&str>) {
        let mut rules = lock(&self.rules);
        let mode = match rules.iter_mut().find(|r| (r.matches)(client_id)) {
            Some(r) => &mut r.mode,
            None => {
                drop(rules);
                let mut mode = lock(&self.default_mode);
                if matches!(*mode, Mode::HoldAfterResponse { .. }) {
                    *mode = Mode::HoldResponses;
                }
                return;
            }
        };
        if matches!(*mode, Mode::HoldAfterResponse { .. }) {
            *mode = Mode::HoldResponses;
        }
    }

    fn client(&self, client_id: Option<&str>, f: impl FnOnce(&mut ClientStats)) {
        let key = client_id.unwrap_or("").to_string();
        let mut clients = lock(&self.clients);
        let key = if clients.contains_key(&key) || clients.len() < CLIENT_IDS_MAX {
            key
        } else {
            "?".to_string()
        };
        f(clients.entry(key).or_default());
    }
}

/// A fault proxy in front of one target; see the module doc.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy for any TCP protocol (rules see no client id).
    pub fn tcp(target: Option<SocketAddr>) -> Result<FaultProxy> {
        FaultProxy::start(target, false)
    }

    /// A proxy that reads each connection's Kafka client id before forwarding it.
    pub fn kafka(target: Option<SocketAddr>) -> Result<FaultProxy> {
        FaultProxy::start(target, true)
    }

    fn start(target: Option<SocketAddr>, kafka: bool) -> Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").context("bind the fault proxy")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            kafka,
            default_mode: Mutex::new(Mode::Pass),
            rules: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            open: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            clients: Mutex::new(BTreeMap::new()),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || accept_loop(listener, s))?;
        Ok(FaultProxy {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Forwards new connections to `target` from now on (a restarted node's new port).
    pub fn set_target(&self, target: SocketAddr) {
        *lock(&self.shared.target) = Some(target);
    }

    /// The mode of every connection no rule matches.
    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.shared.default_mode) = mode;
    }

    /// Applies `mode` to the connections whose client id `matches` (a rule of the same
    /// name is replaced). Rules are tried in the order they were first set.
    pub fn set_rule(&self, name: &str, matches: ClientMatch, mode: Mode) {
        let mut rules = lock(&self.shared.rules);
        match rules.iter_mut().find(|r| r.name == name) {
            Some(r) => {
                r.matches = matches;
                r.mode = mode;
            }
            None => rules.push(Rule {
                name: name.to_string(),
                matches,
                mode,
            }),
        }
    }

    /// A rule for the connections whose client id is exactly `client_id`.
    pub fn set_client_mode(&self, client_id: &str, mode: Mode) {
        let want = client_id.to_string();
        let matches: ClientMatch = Arc::new(move |id| id == Some(want.as_str()));
        self.set_rule(client_id, matches, mode);
    }

    /// Removes every rule and passes everything again.
    pub fn heal(&self) {
        lock(&self.shared.rules).clear();
        self.set_mode(Mode::Pass);
    }

    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            accepted: s.accepted.load(Ordering::Acquire),
            refused: s.refused.load(Ordering::Acquire),
            open: s.open.load(Ordering::Acquire),
            bytes_up: s.bytes_up.load(Ordering::Acquire),
            bytes_down: s.bytes_down.load(Ordering::Acquire),
        }
    }

    /// Totals of the connections with this client id ("" for none).
    pub fn client_stats(&self, client_id: &str) -> ClientStats {
        lock(&self.shared.clients)
            .get(client_id)
            .copied()
            .unwrap_or_default()
    }

    /// Waits (bounded) until `done` holds for this proxy's counters.
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&FaultProxy) -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "proxy {} condition not met within {timeout:?}: {:?}",
                    self.addr,
                    self.stats()
                );
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
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
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(POLL);
                continue;
            }
            Err(_) => {
                std::thread::sleep(POLL);
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::AcqRel);
        let target = *lock(&shared.target);
        let (Some(target), true) = (target, conns.len() < CONNECTIONS_MAX) else {
            shared.refused.fetch_add(1, Ordering::AcqRel);
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        };
        let s = shared.clone();
        match std::thread::Builder::new()
            .name("fault-proxy-conn".into())
            .spawn(move || connection(stream, target, &s))
        {
            Ok(t) => conns.push(t),
            Err(_) => {
                shared.refused.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
    for c in conns {
        let _ = c.join();
    }
}

/// Reads the first frame's header up to the client id; returns the bytes read (to be
/// forwarded first) and the id. `None` as id: not a Kafka header, or none within bounds.
fn read_client_id(
    client: &mut TcpStream,
    shared: &Shared,
) -> std::io::Result<(Vec<u8>, Option<String>)> {
    let mut got: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + FIRST_FRAME_TIMEOUT;
    loop {
        if let Some(id) = parse_client_id(&got) {
            return Ok((got, id));
        }
        if got.len() >= HEADER_MAX || Instant::now() >= deadline {
            return Ok((got, None));
        }
        if shared.stop.load(Ordering::Acquire) {
            return Err(std::io::Error::other("proxy stopping"));
        }
        let want = (HEADER_MAX - got.len()).min(buf.len());
        match client.read(&mut buf[..want]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
}

/// `Some(client id)` once `bytes` hold the request header through the client id
/// (`Some(None)`: a null id, or a frame too short to hold one); `None`: need more bytes.
fn parse_client_id(bytes: &[u8]) -> Option<Option<String>> {
    const FIXED: usize = 4 + 2 + 2 + 4;
    if bytes.len() < 4 {
        return None;
    }
    let size = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if size < 10 {
        return Some(None);
    }
    if bytes.len() < FIXED + 2 {
        return None;
    }
    let len = i16::from_be_bytes([bytes[FIXED], bytes[FIXED + 1]]);
    let Ok(len) = usize::try_from(len) else {
        return Some(None);
    };
    let end = FIXED + 2 + len;
    if bytes.len() < end {
        return None;
    }
    Some(Some(
        String::from_utf8_lossy(&bytes[FIXED + 2..end]).into_owned(),
    ))
}

fn connection(mut client: TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::AcqRel);
    serve(&mut client, target, shared);
    let _ = client.shutdown(Shutdown::Both);
    shared.open.fetch_sub(1, Ordering::AcqRel);
}

fn serve(client: &mut TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    if client.set_read_timeout(Some(POLL)).is_err() || client.set_write_timeout(Some(POLL)).is_err()
    {
        return;
    }
    let _ = client.set_nodelay(true);
    let (first, client_id) = if shared.kafka {
        match read_client_id(client, shared) {
            Ok(r) => r,
            Err(_) => return,
        }
    } else {
        (Vec::new(), None)
    };
    let cid = client_id.as_deref();
    shared.client(cid, |c| {
        c.connections += 1;
        c.open += 1;
    });
    let _open = ClientOpen {
        shared,
        client_id: client_id.clone(),
    };
    // A blackholed connection does not reach the target until it passes; what the
    // client sends meanwhile is held (bounded), and a client that gives up is let go.
    let mut first = first;
    let mut chunk = vec![0u8; CHUNK_BYTES];
    loop {
        match shared.mode_for(cid) {
            Mode::Pass | Mode::HoldResponses | Mode::HoldAfterResponse { .. } => break,
            Mode::Refuse => {
                shared.refused.fetch_add(1, Ordering::AcqRel);
                return;
            }
            Mode::Blackhole if first.len() >= HELD_MAX => std::thread::sleep(POLL),
            Mode::Blackhole => {
                let room = (HELD_MAX - first.len()).min(chunk.len());
                match client.read(&mut chunk[..room]) {
                    Ok(0) => return,
                    Ok(n) => first.extend_from_slice(&chunk[..n]),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => return,
                }
            }
        }
    }
    let Ok(server) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else {
        return;
    };
    let _ = server.set_nodelay(true);
    if server.set_read_timeout(Some(POLL)).is_err() || server.set_write_timeout(Some(POLL)).is_err()
    {
        return;
    }
    let (Ok(client_r), Ok(server_w)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let closed = Arc::new(AtomicBool::new(false));
    let down = {
        let (shared, closed, client_id) = (shared.clone(), closed.clone(), client_id.clone());
        let mut client_w = match client.try_clone() {
            Ok(c) => c,
            Err(_) => return,
        };
        let mut server_r = match server.try_clone() {
            Ok(s) => s,
            Err(_) => return,
        };
        std::thread::Builder::new()
            .name("fault-proxy-down".into())
            .spawn(move || {
                pump(
                    &mut server_r,
                    &mut client_w,
                    Vec::new(),
                    &shared,
                    client_id.as_deref(),
                    false,
                    &closed,
                )
            })
    };
    let Ok(down) = down else { return };
    let (mut client_r, mut server_w) = (client_r, server_w);
    pump(
        &mut client_r,
        &mut server_w,
        first,
        shared,
        cid,
        true,
        &closed,
    );
    closed.store(true, Ordering::Release);
    let _ = server.shutdown(Shutdown::Both);
    let _ = down.join();
}

/// Decrements the client id's open count when the connection ends.
struct ClientOpen<'a> {
    shared: &'a Shared,
    client_id: Option<String>,
}

impl Drop for ClientOpen<'_> {
    fn drop(&mut self) {
        self.shared.client(self.client_id.as_deref(), |c| {
            c.open = c.open.saturating_sub(1)
        });
    }
}

/// Moves bytes `from` → `to` while the connection's mode passes. While it is blackholed
/// they are read and held (at most [`HELD_MAX`], then nothing more is read: the peer's
/// window closes) and written on once it passes again; a peer that closes while cut gave
/// up, and what it sent then is dropped. Returns when the connection is refused, a side
/// closes or fails, or the other direction ended. `pending` is written first.
fn pump(
    from: &mut TcpStream,
    to: &mut TcpStream,
    pending: Vec<u8>,
    shared: &Shared,
    client_id: Option<&str>,
    up: bool,
    closed: &AtomicBool,
) {
    let mut held = pending;
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut eof = false;
    let mut frames = Frames::default();
    // What this direction reported to the client's `held_down` gauge.
    let mut reported = 0u64;
    let report = |reported: &mut u64, now: usize| {
        let now = now as u64;
        if !up && now != *reported {
            let was = *reported;
            shared.client(client_id, |c| {
                c.held_down = (c.held_down + now).saturating_sub(was)
            });
            *reported = now;
        }
    };
    while !closed.load(Ordering::Acquire) {
        let mode = shared.mode_for(client_id);
        if mode == Mode::Refuse {
            if up {
                shared.refused.fetch_add(1, Ordering::AcqRel);
            }
            break;
        }
        if mode.passes(up) && !held.is_empty() {
            // Responses under `HoldAfterResponse` pass up to the end of the first large
            // frame, and the rule trips there.
            let min_bytes = match mode {
                Mode::HoldAfterResponse { min_bytes } if !up => Some(min_bytes),
                _ => None,
            };
            let allowed = min_bytes.map_or(held.len(), |min| {
                frames.clone().advance(&held, min).unwrap_or(held.len())
            });
            match to.write(&held[..allowed]) {
                Ok(0) => break,
                Ok(n) => {
                    let min = min_bytes.unwrap_or(usize::MAX);
                    let tripped = !up && frames.advance(&held[..n], min).is_some();
                    held.drain(..n);
                    count(shared, client_id, up, n as u64);
                    if tripped {
                        shared.trip(client_id);
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        // After the write: passing bytes count as held only between a read and the write.
        report(&mut reported, held.len());
        if eof {
            // Flushed what the peer sent before it closed, or it closed during a cut.
            if held.is_empty() || !mode.passes(up) {
                break;
            }
            continue;
        }
        if held.len() >= HELD_MAX {
            std::thread::sleep(POLL);
            continue;
        }
        let room = (HELD_MAX - held.len()).min(chunk.len());
        match from.read(&mut chunk[..room]) {
            Ok(0) => eof = true,
            Ok(n) => held.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    report(&mut reported, 0);
    closed.store(true, Ordering::Release);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Where a byte stream of size-prefixed Kafka frames is (the responses forwarded down
/// one connection), to cut it after a whole frame.
#[derive(Clone, Copy, Debug, Default)]
struct Frames {
    /// The current frame's size prefix, as far as read.
    size: [u8; 4],
    /// Bytes of `size` read (4: in the frame's body).
    have: usize,
    /// Body bytes of the current frame still to come.
    left: usize,
    /// The current frame's size, prefix included.
    total: usize,
}

impl Frames {
    /// Moves over `bytes`; returns how many of them end the first frame of at least
    /// `min` bytes (prefix included) completed in them, if one is.
    fn advance(&mut self, bytes: &[u8], min: usize) -> Option<usize> {
        let mut at = 0;
        while at < bytes.len() {
            if self.have < 4 {
                self.size[self.have] = bytes[at];
                self.have += 1;
                at += 1;
                if self.have == 4 {
                    // A negative size is no Kafka frame: treated as empty.
                    self.left = usize::try_from(i32::from_be_bytes(self.size)).unwrap_or(0);
                    self.total = self.left.saturating_add(4);
                }
            } else {
                let take = self.left.min(bytes.len() - at);
                self.left -= take;
                at += take;
            }
            if self.have == 4 && self.left == 0 {
                self.have = 0;
                if self.total >= min {
                    return Some(at);
                }
            }
        }
        None
    }
}

fn count(shared: &Shared, client_id: Option<&str>, up: bool, n: u64) {
    if up {
        shared.bytes_up.fetch_add(n, Ordering::AcqRel);
        shared.client(client_id, |c| c.bytes_up += n);
    } else {
        shared.bytes_down.fetch_add(n, Ordering::AcqRel);
        shared.client(client_id, |c| c.bytes_down += n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_id_is_read_from_a_request_header() {
        let mut frame = Vec::new();
        frame.extend_from_slice(&30i32.to_be_bytes());
        frame.extend_from_slice(&1i16.to_be_bytes());
        frame.extend_from_slice(&12i16.to_be_bytes());
        frame.extend_from_slice(&7i32.to_be_bytes());
        frame.extend_from_slice(&6i16.to_be_bytes());
        frame.extend_from_slice(b"abcdef");
        assert_eq!(parse_client_id(&frame[..15]), None, "needs more");
        assert_eq!(parse_client_id(&frame), Some(Some("abcdef".into())));
        let mut null = frame[..12].to_vec();
        null.extend_from_slice(&(-1i16).to_be_bytes());
        assert_eq!(parse_client_id(&null), Some(None));
    }

    fn echo_server() -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        (addr, t)
    }

    #[test]
    fn pass_blackhole_and_refuse() {
        let (addr, server) = echo_server();
        let proxy = FaultProxy::tcp(Some(addr)).expect("proxy");
        let mut c = TcpStream::connect(proxy.addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut buf = [0u8; 5];
        c.write_all(b"hello").expect("write");
        c.read_exact(&mut buf).expect("echo");
        assert_eq!(&buf, b"hello");

        proxy.set_mode(Mode::Blackhole);
        c.write_all(b"again").expect("write");
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        assert!(c.read(&mut buf).is_err(), "nothing comes back while cut");
        proxy.set_mode(Mode::Pass);
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        c.read_exact(&mut buf)
            .expect("held bytes flow after the cut");
        assert_eq!(&buf, b"again");

        proxy.set_mode(Mode::Refuse);
        proxy
            .wait_for(Duration::from_secs(5), |p| p.stats().open == 0)
            .expect("closed");
        assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)), "closed");
        drop(proxy);
        let _ = server.join();
    }

    fn frame(body_len: usize, fill: u8) -> Vec<u8> {
        let mut f = (body_len as i32).to_be_bytes().to_vec();
        f.extend(std::iter::repeat_n(fill, body_len));
        f
    }

    #[test]
    fn frames_are_cut_after_the_first_large_one() {
        let mut f = Frames::default();
        let mut stream = frame(3, 1);
        stream.extend(frame(10, 2));
        stream.extend(frame(3, 3));
        // Byte by byte or at once, the cut is after the 14-byte frame.
        assert_eq!(f.clone().advance(&stream, 14), Some(7 + 14));
        assert_eq!(f.advance(&stream[..5], 14), None);
        assert_eq!(f.advance(&stream[5..], 14), Some(7 + 14 - 5));
        assert_eq!(Frames::default().advance(&stream, 15), None);
    }

    #[test]
    fn hold_after_response_passes_one_large_answer_then_holds_answers() {
        let (addr, server) = echo_server();
        let proxy = FaultProxy::tcp(Some(addr)).expect("proxy");
        proxy.set_mode(Mode::HoldAfterResponse { min_bytes: 100 });
        let mut c = TcpStream::connect(proxy.addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let small = frame(10, 1);
        let mut buf = vec![0u8; small.len()];
        c.write_all(&small).expect("write");
        c.read_exact(&mut buf).expect("a small answer passes");
        assert_eq!(buf, small);

        // One write, echoed as one read: cut after the large frame.
        let (large, after) = (frame(200, 2), frame(10, 3));
        c.write_all(&[large.clone(), after.clone()].concat())
            .expect("write");
        let mut buf = vec![0u8; large.len()];
        c.read_exact(&mut buf).expect("the large answer passes");
        assert_eq!(buf, large);
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        let mut one = [0u8; 1];
        assert!(c.read(&mut one).is_err(), "the answer after it is held");
        assert_eq!(*lock(&proxy.shared.default_mode), Mode::HoldResponses);
        proxy
            .wait_for(Duration::from_secs(5), |p| {
                p.client_stats("").held_down == after.len() as u64
            })
            .expect("the held answer is counted");

        proxy.set_mode(Mode::Pass);
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut buf = vec![0u8; after.len()];
        c.read_exact(&mut buf)
            .expect("held answers flow once passed");
        assert_eq!(buf, after);
        proxy
            .wait_for(Duration::from_secs(5), |p| {
                p.client_stats("").held_down == 0
            })
            .expect("nothing held");
        drop(c);
        drop(proxy);
        let _ = server.join();
    }
}
