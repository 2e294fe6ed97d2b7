//! One client connection on its shard: reads frames (size checked before any buffer grows
//! for it, a large frame's size taken from the shard's request budget first, every frame
//! finished within `request.read.timeout.ms`, an idle connection closed after
//! `connections.max.idle.ms`), hands each request to its own task so requests pipeline,
//! and writes responses strictly in request order (Kafka's rule). At most [`PIPELINE_MAX`]
//! requests per connection are in flight; beyond that the reader stops reading, so a
//! client that does not read its responses is held back by TCP instead of growing our
//! buffers. Only Produce and Fetch pipeline freely (their responses are bounded by the
//! request, or by the fetch budget); any other request is handled once every earlier
//! request of the connection has been, and no frame is read while more than
//! [`RESPONSE_BACKLOG_MAX_BYTES`] of other responses wait to be written: so a client that
//! asks for large responses (Metadata of every topic) and never reads them holds one of
//! them, not [`PIPELINE_MAX`]. Kafka serves a connection's requests one at a time. On a TLS listener the handshake comes first (bounded by
//! `ssl.handshake.timeout.ms`); on a SASL listener nothing but ApiVersions, SaslHandshake
//! and SaslAuthenticate is served, one at a time, until authentication completes, and
//! again while a client re-authenticates (KIP-368); a connection whose session expired
//! is closed at its next request other than SaslHandshake.
//!
//! Bytes move once on the way in: on plain TCP `recv` writes straight into the buffer's
//! spare capacity (nothing is zeroed first), and a large frame is read into an allocation
//! of its own size, never past its end, so its request owns it alone and Produce appends
//! the records from it in place.

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use futures_lite::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::task::JoinHandle;

use super::budget::{FramePermit, RequestBudget, SMALL_FRAME_MAX_BYTES};
use super::session::Session;
use super::transport::{self, Transport};
use crate::api;
use crate::config::Config;
use crate::event::Event;
use crate::proto;
use crate::security::ListenerSetup;
use crate::shard::Shard;

/// Requests of one connection being worked on at once.
pub const PIPELINE_MAX: usize = 16;
/// Bytes of responses other than Fetch's (those have their own budget) a connection may
/// have waiting to be written before its next frame is read.
pub const RESPONSE_BACKLOG_MAX_BYTES: usize = 1 << 20;
/// Bytes asked of the socket per read call.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Fewest bytes a read into a buffer's leftover room asks for; with less room the
/// buffer is grown by a chunk instead (so reads stay large).
const READ_MIN_BYTES: usize = 4 * 1024;
/// Most bytes one read call may add to a large frame's buffer.
const LARGE_READ_MAX_BYTES: usize = 1024 * 1024;

/// Why a connection is closed by the broker.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("request size {size} is outside 1..={max} (socket.request.max.bytes)")]
    FrameSize { size: i64, max: usize },
    #[error("connection closed in the middle of a frame ({have} of {need} bytes)")]
    Truncated { have: usize, need: usize },
    #[error(
        "frame not complete after {timeout_ms} ms (request.read.timeout.ms): {have} of {need} bytes"
    )]
    FrameTimeout {
        have: usize,
        need: usize,
        timeout_ms: u128,
    },
    #[error("idle for {idle_ms} ms (connections.max.idle.ms)")]
    Idle { idle_ms: u128 },
    #[error("the shard's request budget is closed")]
    BudgetClosed,
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Read or write access to a stream shared by the reader and writer tasks. The `RefCell`
/// is borrowed only inside one `poll_*` call, never across an await, and glommio keeps
/// separate read and write sources, so the two halves never disturb each other. Under TLS
/// both halves drive one rustls session the same way: after the handshake futures-rustls
/// reads the socket only in `poll_read` and writes it only in `poll_write`/`poll_flush`,
/// so each half still waits on its own glommio source.
#[derive(Clone)]
struct Half(Rc<RefCell<Transport>>);

impl AsyncRead for Half {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Half {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_close(cx)
    }
}

/// What bounds one connection's reading: the shard's request budget and two deadlines.
pub struct ReadLimits {
    budget: Rc<RequestBudget>,
    /// `request.read.timeout.ms`: a started frame must be complete this long after its
    /// first byte (a large one: after its budget was granted).
    frame_timeout: Duration,
    /// `connections.max.idle.ms`: nothing read and nothing in flight this long closes it
    /// ([`IDLE_NEVER`] for -1).
    idle_timeout: Duration,
    /// A response the client does not read closes the connection after this long
    /// (`connections.max.idle.ms`; with -1 its default still applies: an unread response
    /// holds fetch budget other clients wait for).
    write_stall: Duration,
}

/// The idle timeout of `connections.max.idle.ms=-1`: longer than any node runs, short
/// enough that deadlines computed from it cannot overflow an `Instant`.
const IDLE_NEVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

impl ReadLimits {
    pub fn new(config: &Config, budget: Rc<RequestBudget>) -> ReadLimits {
        ReadLimits {
            budget,
            frame_timeout: Duration::from_millis(config.request_read_timeout_ms),
            idle_timeout: config.connection_idle().unwrap_or(IDLE_NEVER),
            write_stall: config.connection_idle().unwrap_or(Duration::from_millis(
                crate::config::CONNECTIONS_MAX_IDLE_MS_DEFAULT.unsigned_abs(),
            )),
        }
    }
}

/// When the connection last did something, and how many of its requests are being
/// handled: an idle connection is one with none in flight and nothing read for
/// `connections.max.idle.ms`.
struct Activity {
    last: Cell<Instant>,
    in_flight: Cell<usize>,
    /// Bytes of responses other than Fetch's handled but not yet written.
    unwritten_bytes: Cell<usize>,
    /// The writer stopped (the connection is closing): nothing will drain.
    closed: Cell<bool>,
    /// A request ended, a response was written, or the writer stopped.
    changed: Event,
}

impl Activity {
    fn touch(&self) {
        self.last.set(Instant::now());
    }

    fn begin(&self) {
        self.in_flight.set(self.in_flight.get() + 1);
    }

    fn end(&self) {
        assert!(self.in_flight.get() > 0, "a request ends after it began");
        self.in_flight.set(self.in_flight.get() - 1);
        self.touch();
        self.changed.notify_all();
    }

    fn written(&self, bytes: usize) {
        let left = self.unwritten_bytes.get();
        assert!(bytes <= left, "a response is written once");
        self.unwritten_bytes.set(left - bytes);
        self.changed.notify_all();
    }

    fn close(&self) {
        self.closed.set(true);
        self.changed.notify_all();
    }

    /// Waits until `ready` holds; false if the connection closes or the node shuts down
    /// first.
    async fn wait_until(&self, shard: &Shard, ready: impl Fn(&Activity) -> bool) -> bool {
        loop {
            let changed = self.changed.listen();
            let stop = shard.shutdown.listen();
            if self.closed.get() || shard.shutting_down.get() {
                return false;
            }
            if ready(self) {
                return true;
            }
            futures_lite::future::or(changed, stop).await;
        }
    }

    /// Room to read another frame: few enough unwritten responses.
    fn has_room(&self) -> bool {
        self.unwritten_bytes.get() <= RESPONSE_BACKLOG_MAX_BYTES
    }
}

/// Produce and Fetch pipeline: their responses are bounded by their request (Produce) or
/// by the shard's fetch budget (Fetch). Any other request waits for the earlier ones.
fn pipelines(api_key: i16) -> bool {
    matches!(api_key, wire::api::PRODUCE | wire::api::FETCH)
}

/// One request frame (without its size prefix) and the budget it holds until handled.
struct Frame {
    bytes: Bytes,
    permit: Option<FramePermit>,
}

/// Splits size-prefixed frames out of the byte stream.
struct FrameReader {
    half: Half,
    buf: BytesMut,
    max_bytes: usize,
    limits: ReadLimits,
    activity: Rc<Activity>,
    /// Budget taken for the large frame being read; it goes with the frame.
    permit: Option<FramePermit>,
    /// The client's address, whose share of the budget large frames count against.
    peer_ip: std::net::IpAddr,
    /// When the frame being read must be complete (`None` between frames).
    deadline: Option<Instant>,
    /// The socket, on a plain TCP connection: read with `recv` straight into the
    /// buffer's spare capacity, which then need not be zeroed first (`None` under TLS).
    plain_fd: Option<RawFd>,
    /// The last frame was large: the next one starts with a read of its size prefix
    /// alone, so that a large frame is read into a buffer sized for it from its first
    /// byte (no 64 KiB chunk to copy over when the buffer grows for it).
    expect_large: bool,
    /// A frame was cut off the buffer's allocation and may still be alive: frames read
    /// into the rest of it would share it (and Produce would copy them out), so the
    /// buffer moves to a fresh allocation for the next frame instead (see `read_size`).
    shares_allocation: bool,
}

impl FrameReader {
    /// The next frame; `None` at a clean end of stream.
    async fn next(&mut self) -> Result<Option<Frame>, ConnError> {
        loop {
            let mut need = 4;
            if let Some(size) = self.frame_size()? {
                need = 4 + size;
                if self.buf.len() >= need {
                    return Ok(Some(self.take_frame(size)));
                }
                if size > SMALL_FRAME_MAX_BYTES && self.permit.is_none() {
                    self.reserve_large(size).await?;
                }
            }
            let read = if self.buf.is_empty() {
                self.fill_idle().await?
            } else {
                self.fill_frame(need).await?
            };
            if read == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(ConnError::Truncated {
                    have: self.buf.len(),
                    need,
                });
            }
        }
    }

    /// The size of the frame at the front of the buffer, once its prefix is there.
    fn frame_size(&self) -> Result<Option<usize>, ConnError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let size = i32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        if size <= 0 || size as usize > self.max_bytes {
            return Err(ConnError::FrameSize {
                size: size.into(),
                max: self.max_bytes,
            });
        }
        Ok(Some(size as usize))
    }

    /// Cuts the complete frame of `size` bytes off the front of the buffer.
    fn take_frame(&mut self, size: usize) -> Frame {
        assert!(self.buf.len() >= 4 + size, "the frame is complete");
        self.deadline = None;
        self.expect_large = size > SMALL_FRAME_MAX_BYTES;
        self.buf.advance(4);
        let permit = self.permit.take();
        if self.buf.len() == size {
            // The buffer holds exactly this frame: hand over the allocation whole, so the
            // frame is its only owner (Produce then appends the record bytes in place
            // instead of copying them).
            let bytes = std::mem::take(&mut self.buf).freeze();
            self.shares_allocation = false;
            return Frame { bytes, permit };
        }
        self.shares_allocation = true;
        Frame {
            bytes: self.buf.split_to(size).freeze(),
            permit,
        }
    }

    /// Takes a large frame's size from the shard's budget (waiting, and reading nothing,
    /// while it does not fit: TCP holds the client back), then sizes the buffer for the
    /// frame once. Its read deadline starts when the budget is granted: a client waiting
    /// for others' frames is not at fault.
    async fn reserve_large(&mut self, size: usize) -> Result<(), ConnError> {
        let permit = self.limits.budget.acquire(size, self.peer_ip).await;
        self.permit = Some(permit.ok_or(ConnError::BudgetClosed)?);
        self.buf.reserve((4 + size).saturating_sub(self.buf.len()));
        self.deadline = Some(Instant::now() + self.limits.frame_timeout);
        Ok(())
    }

    /// Waits for the first bytes of the next frame; an error once the connection has been
    /// idle for `connections.max.idle.ms` (while a request is in flight it is not idle).
    async fn fill_idle(&mut self) -> Result<usize, ConnError> {
        let idle = self.limits.idle_timeout;
        let mut deadline = self.activity.last.get() + idle;
        loop {
            if let Some(read) = self.fill(4, deadline).await? {
                return Ok(read);
            }
            let now = Instant::now();
            let quiet_until = self.activity.last.get() + idle;
            if self.activity.in_flight.get() == 0 && now >= quiet_until {
                return Err(ConnError::Idle {
                    idle_ms: (now - self.activity.last.get()).as_millis(),
                });
            }
            // Busy or recently active: look again when it could first be idle.
            deadline = if quiet_until > now {
                quiet_until
            } else {
                now + idle
            };
        }
    }

    /// Reads more of a started frame; an error past the frame's deadline.
    async fn fill_frame(&mut self, need: usize) -> Result<usize, ConnError> {
        if self.permit.is_some() {
            // A large frame arriving fast is read without ever waiting for the socket:
            // give the shard's other tasks their turn between reads.
            glommio::yield_if_needed().await;
        }
        let timeout = self.limits.frame_timeout;
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + timeout);
        match self.fill(need, deadline).await? {
            Some(read) => Ok(read),
            None => Err(ConnError::FrameTimeout {
                have: self.buf.len(),
                need,
                timeout_ms: timeout.as_millis(),
            }),
        }
    }

    /// How many bytes the next read asks for. While a large frame (its budget taken) is
    /// incomplete: only bytes of that frame, at most [`LARGE_READ_MAX_BYTES`], so it ends
    /// the buffer and is handed over whole (read past its end, the frame would share its
    /// allocation with the next one: copied out by Produce, and the buffer regrown and
    /// copied to make room). Between frames after a large one: its 4-byte size prefix.
    /// Otherwise a chunk, which may also hold the next pipelined requests; or, where the
    /// rest of a small frame fits the room the buffer has left, that room (no regrowth).
    fn read_size(&self, need: usize) -> usize {
        let missing = need.saturating_sub(self.buf.len());
        if self.permit.is_some() && missing > 0 {
            let most = match self.plain_fd {
                Some(_) => LARGE_READ_MAX_BYTES,
                // Under TLS the buffer is zeroed before each read: size it to what the
                // socket holds now, so a large frame is not zeroed many times over.
                None => readable_bytes(&self.half).clamp(READ_CHUNK_BYTES, LARGE_READ_MAX_BYTES),
            };
            return missing.min(most);
        }
        if self.expect_large && self.buf.len() < 4 {
            return 4 - self.buf.len();
        }
        // Where the buffer already has room for the rest of this frame, read into that
        // room only: asking for a whole chunk would grow the buffer, and growing copies
        // every byte already read (a reallocation) only to leave the new room unused.
        // Not while the allocation is shared with a frame cut off it: there, growing
        // moves the partial frame to an allocation of its own, which Produce then takes
        // whole instead of copying it out.
        let spare = self.buf.capacity() - self.buf.len();
        if !self.shares_allocation && spare >= missing.max(READ_MIN_BYTES) {
            return spare.min(READ_CHUNK_BYTES);
        }
        READ_CHUNK_BYTES
    }

    /// Reads once, unless `deadline` passes first (`None`); see [`read_size`] for how
    /// much. On plain TCP the bytes the socket holds are taken at once into the spare
    /// capacity (no zeroing); when it holds none, one byte is read through glommio, which
    /// waits for it (the rest comes with the next call). The buffer is left as it was if
    /// the deadline wins.
    ///
    /// [`read_size`]: Self::read_size
    async fn fill(&mut self, need: usize, deadline: Instant) -> Result<Option<usize>, ConnError> {
        let mut want = self.read_size(need);
        if let Some(fd) = self.plain_fd {
            let at = self.buf.as_ptr();
            let read = recv_now(fd, &mut self.buf, want);
            if self.buf.as_ptr() != at {
                // Grown into a new allocation (or reclaimed, when no frame held the old
                // one any more): no frame shares it.
                self.shares_allocation = false;
            }
            if let Some(n) = read? {
                if n > 0 {
                    self.activity.touch();
                }
                return Ok(Some(n));
            }
            want = 1;
        }
        let start = self.buf.len();
        let at = self.buf.as_ptr();
        self.buf.resize(start + want, 0);
        if self.buf.as_ptr() != at {
            self.shares_allocation = false;
        }
        let (half, buf) = (&mut self.half, &mut self.buf);
        let timer = glommio::timer::Timer::new(deadline.saturating_duration_since(Instant::now()));
        let read =
            futures_lite::future::or(async { Some(half.read(&mut buf[start..]).await) }, async {
                timer.await;
                None
            })
            .await;
        let n = match &read {
            Some(Ok(n)) => *n,
            _ => 0,
        };
        self.buf.truncate(start + n);
        if n > 0 {
            self.activity.touch();
        }
        Ok(read.transpose()?)
    }
}

/// A response slot in request order: `None` when the request has no response (acks=0).
struct Pending {
    response: JoinHandle<Option<Vec<Bytes>>>,
    /// The request's API (its send time is counted under it).
    api_key: i16,
    /// Answered before authentication, one at a time (not counted as unwritten).
    before_auth: bool,
    /// A Fetch's turn, passed on when this slot is dropped: after its response was
    /// written, or when the connection closes with it unwritten.
    _turn: Option<TurnDone>,
}

/// The Fetches of one connection take turns: each starts reading only once the previous
/// one's response has left for the socket. Other requests still pipeline. A client that
/// pipelines Fetches and does not read the responses then holds at most one response's
/// bytes (at most `fetch.max.bytes`) of its shard's fetch response budget instead of one
/// per request in flight, so it cannot starve the other connections' fetches. Kafka goes
/// further and serves one request of a connection at a time.
#[derive(Default)]
struct FetchTurn {
    done: Cell<bool>,
    passed: Event,
}

impl FetchTurn {
    async fn wait(&self) {
        while !self.done.get() {
            let passed = self.passed.listen();
            if self.done.get() {
                break;
            }
            passed.await;
        }
    }
}

/// Passes a [`FetchTurn`] on when dropped.
struct TurnDone(Rc<FetchTurn>);

impl Drop for TurnDone {
    fn drop(&mut self) {
        self.0.done.set(true);
        self.0.passed.notify_all();
    }
}

/// Bytes the socket holds for us right now (0 if unknown).
fn readable_bytes(half: &Half) -> usize {
    let fd = half.0.borrow().raw_fd();
    let mut ready: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into `ready`, which outlives the call.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut ready) };
    if rc == 0 {
        usize::try_from(ready).unwrap_or(0)
    } else {
        0
    }
}

/// One non-blocking `recv` of at most `want` bytes straight into the spare capacity of
/// `buf` (grown for them first), which is not zeroed: the kernel's copy is the only
/// write. `Some(0)` at the end of the stream, `None` if the socket holds nothing now.
pub(crate) fn recv_now(fd: RawFd, buf: &mut BytesMut, want: usize) -> io::Result<Option<usize>> {
    assert!(want > 0, "a read asks for at least one byte");
    buf.reserve(want);
    let spare = buf.spare_capacity_mut();
    let len = want.min(spare.len());
    // SAFETY: `spare` is writable memory owned by `buf`, at least `len` bytes long; recv
    // writes at most `len` bytes there and reads none. MSG_DONTWAIT keeps the executor
    // thread from blocking.
    let n = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), len, libc::MSG_DONTWAIT) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(err),
        };
    }
    let n = n as usize;
    assert!(n <= len, "recv wrote past the length it was given");
    // SAFETY: the kernel initialised the first `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(Some(n))
}

/// Serves one connection until the client closes it, sends bad framing, stalls in a frame,
/// stays idle, or shutdown.
pub async fn serve(
    shard: Rc<Shard>,
    stream: TcpStream,
    peer: SocketAddr,
    limits: ReadLimits,
    listener: Arc<ListenerSetup>,
) {
    let _ = stream.set_nodelay(true);
    let Some((stream, tls_principal)) = open_transport(&shard, stream, peer, &listener).await
    else {
        return;
    };
    let session = Rc::new(Session::new(peer, listener, tls_principal));
    let half = Half(Rc::new(RefCell::new(stream)));
    let (tx, rx) = local_channel::new_bounded::<Pending>(PIPELINE_MAX);
    let closing = Rc::new(Event::default());
    let write_stall = limits.write_stall;
    let activity = Rc::new(Activity {
        last: Cell::new(Instant::now()),
        in_flight: Cell::new(0),
        unwritten_bytes: Cell::new(0),
        closed: Cell::new(false),
        changed: Event::default(),
    });
    let writer = glommio::spawn_local(write_responses(
        half.clone(),
        rx,
        closing.clone(),
        write_stall,
        activity.clone(),
    ));
    let request_max_bytes = shard.config().socket_request_max_bytes as usize;
    let mut reader = FrameReader {
        half,
        buf: BytesMut::new(),
        max_bytes: request_max_bytes,
        limits,
        activity: activity.clone(),
        permit: None,
        peer_ip: peer.ip(),
        deadline: None,
        plain_fd: None,
        expect_large: false,
        shares_allocation: false,
    };
    if !reader.half.0.borrow().is_tls() {
        reader.plain_fd = Some(reader.half.0.borrow().raw_fd());
    }
    let mut last_fetch: Option<Rc<FetchTurn>> = None;
    // Checked before each listen: an event fired before we listen is not heard.
    while !shard.shutting_down.get() {
        if !activity.has_room() && !activity.wait_until(&shard, Activity::has_room).await {
            break;
        }
        // Before authentication a frame is bounded by `sasl.server.max.receive.size`, as
        // in Kafka; set per frame, since the requests before it are served one at a time.
        reader.max_bytes = match &session.listener.sasl {
            Some(sasl) if !session.is_open() => sasl.max_receive_bytes.min(request_max_bytes),
            _ => request_max_bytes,
        };
        let stop = futures_lite::future::or(shard.shutdown.listen(), closing.listen());
        let next = futures_lite::future::or(reader.next(), async {
            stop.await;
            Ok(None)
        });
        let Frame { bytes, permit } = match next.await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(ConnError::Io(e)) => {
                tracing::debug!(%peer, "connection read error: {e}");
                break;
            }
            Err(e @ ConnError::Idle { .. }) => {
                tracing::debug!(%peer, "closing connection: {e}");
                break;
            }
            Err(e) => {
                crate::client_warn!(%peer, "closing connection: {e}");
                break;
            }
        };
        let read_at = Instant::now();
        let req = match proto::parse_request(bytes) {
            Ok(req) => req,
            Err(e) => {
                crate::client_warn!(%peer, "closing connection: {e}");
                break;
            }
        };
        let one_at_a_time = match sasl_gate(&shard, &session, &activity, &req, read_at).await {
            SaslGate::Close => break,
            SaslGate::OneAtATime => true,
            SaslGate::Pipeline => false,
        };
        if one_at_a_time {
            // Before SASL authentication completes: only the SASL requests, one at a time
            // (the next is read only once this one moved the state).
            let pending = match serve_before_auth(&shard, &session, req).await {
                Some(pending) => pending,
                None => break,
            };
            drop(permit);
            activity.touch();
            if tx.send(pending).await.is_err() || session.has_failed() {
                break;
            }
            continue;
        }
        if !pipelines(req.api_key)
            && !activity
                .wait_until(&shard, |a| a.in_flight.get() == 0 && a.has_room())
                .await
        {
            break;
        }
        let s = shard.clone();
        let session = session.clone();
        let active = activity.clone();
        active.begin();
        let (previous_fetch, turn) = if req.api_key == wire::api::FETCH {
            let mine = Rc::new(FetchTurn::default());
            (last_fetch.replace(mine.clone()), Some(TurnDone(mine)))
        } else {
            (None, None)
        };
        let api_key = req.api_key;
        let task = glommio::spawn_local(async move {
            let waited = previous_fetch.is_some();
            if let Some(previous) = previous_fetch {
                previous.wait().await;
            }
            s.metrics().queued(api_key, read_at.elapsed());
            // A Fetch queued behind earlier long polls may start long after the SASL
            // session ended (each waits up to 300 s): it is not served, and the
            // connection closes, as for a request read after the end (Kafka reads one
            // at a time). A request that did not wait is served: read before the end,
            // it starts at once (a client's re-authentication may come just after).
            let response = if waited && session.has_expired(Instant::now()) {
                s.metrics().session_expired();
                Some(Vec::new())
            } else {
                api::handle(&s, req, &session).await
            };
            // The frame's budget goes back once its request is handled: what the handler
            // kept (records in the log's tail cache) is bounded by the log's own limits.
            drop(permit);
            if api_key != wire::api::FETCH {
                let bytes = response_bytes(&response);
                active
                    .unwritten_bytes
                    .set(active.unwritten_bytes.get() + bytes);
            }
            active.end();
            response
        })
        .detach();
        let pending = Pending {
            response: task,
            api_key,
            before_auth: false,
            _turn: turn,
        };
        if tx.send(pending).await.is_err() {
            break;
        }
    }
    // A stalled or refused frame's bytes and budget go now, not after the last response.
    drop(reader);
    drop(tx);
    writer.await;
}

/// The connection's stream: plain, or TLS once the handshake is done (within the
/// listener's deadline; a shutdown does not wait for it, nothing was served yet). `None`
/// if the handshake failed (logged) or shutdown began.
async fn open_transport(
    shard: &Rc<Shard>,
    stream: TcpStream,
    peer: SocketAddr,
    listener: &ListenerSetup,
) -> Option<(Transport, Option<String>)> {
    let Some(tls) = &listener.tls else {
        return Some((Transport::Plain(stream), None));
    };
    let stop = shard.shutdown.listen();
    if shard.shutting_down.get() {
        return None;
    }
    let handshake = futures_lite::future::or(
        async { Some(transport::accept_tls(stream, tls).await) },
        async {
            stop.await;
            None
        },
    );
    match handshake.await? {
        Ok(accepted) => Some(accepted),
        Err(e) => {
            shard
                .metrics()
                .refused(crate::metrics::Refusal::TlsHandshake);
            crate::client_warn!(%peer, listener = %listener.config.name, "closing connection: {e}");
            None
        }
    }
}

/// How the reader treats a request, given where its connection is in SASL.
enum SaslGate {
    /// Authenticated (or no SASL): served as usual.
    Pipeline,
    /// Not authenticated yet, or re-authenticating: handled before the next frame is read.
    OneAtATime,
    /// The session expired: the connection is closed, the request unanswered.
    Close,
}

/// KIP-368's rules for `req`, read at `read_at`. A SaslHandshake on an authenticated SASL
/// connection may begin a re-authentication: it is handled once every earlier request of
/// the connection has been (their answers still go out first, in order), and before the
/// next frame is read, so no request is served while the login is redone. Any other
/// request after the session's end closes the connection, whatever the client was told
/// (Kafka's rule; KAFKA-9241: also after SaslAuthenticate v0, which carries no lifetime).
async fn sasl_gate(
    shard: &Rc<Shard>,
    session: &Session,
    activity: &Activity,
    req: &proto::Request,
    read_at: Instant,
) -> SaslGate {
    if !session.is_open() {
        return SaslGate::OneAtATime;
    }
    if session.listener.sasl.is_none() {
        return SaslGate::Pipeline;
    }
    if req.api_key == wire::api::SASL_HANDSHAKE {
        let idle = |a: &Activity| a.in_flight.get() == 0 && a.has_room();
        return match activity.wait_until(shard, idle).await {
            true => SaslGate::OneAtATime,
            false => SaslGate::Close,
        };
    }
    if session.has_expired(read_at) {
        shard.metrics().session_expired();
        let (peer, name) = (session.peer, req.api_name());
        crate::client_warn!(%peer, principal = %session.principal(), "closing connection: {name} after the SASL session expired (connections.max.reauth.ms) without re-authentication");
        return SaslGate::Close;
    }
    SaslGate::Pipeline
}

/// Answers one request of a connection that has not authenticated yet: the SASL requests
/// and ApiVersions are handled now (the response is ready when this returns); any other
/// request closes the connection unanswered (`None`, logged).
async fn serve_before_auth(
    shard: &Rc<Shard>,
    session: &Session,
    req: proto::Request,
) -> Option<Pending> {
    if !is_sasl_phase_api(req.api_key) {
        let (peer, name) = (session.peer, req.api_name());
        crate::client_warn!(%peer, "closing connection: {name} before SASL authentication completed");
        return None;
    }
    let api_key = req.api_key;
    let response = api::handle(shard, req, session).await;
    Some(Pending {
        response: glommio::spawn_local(async move { response }).detach(),
        api_key,
        before_auth: true,
        _turn: None,
    })
}

/// Writes responses in request order; stops at the first response that asks to close the
/// connection (an empty chunk list), at a write error, or at a write that makes no
/// progress for `stall` (`connections.max.idle.ms`: a client that stops reading is idle,
/// as in Kafka). The last matters beyond the one connection: a stalled response holds its
/// fetch budget, which other consumers' fetches wait for.
async fn write_responses(
    mut half: Half,
    rx: local_channel::LocalReceiver<Pending>,
    closing: Rc<Event>,
    stall: Duration,
    activity: Rc<Activity>,
) {
    write_in_order(&mut half, &rx, stall, &activity).await;
    activity.close();
    closing.notify_all();
    let _ = half.close().await;
}

/// Bytes of a handled request's response.
fn response_bytes(response: &Option<Vec<Bytes>>) -> usize {
    response
        .as_ref()
        .map_or(0, |c| c.iter().map(Bytes::len).sum())
}

async fn write_in_order(
    half: &mut Half,
    rx: &local_channel::LocalReceiver<Pending>,
    stall: Duration,
    activity: &Activity,
) {
    while let Some(mut pending) = rx.recv().await {
        let Some(response) = (&mut pending.response).await else {
            break;
        };
        // Counted as unwritten by its task (all but Fetch's): counted off once it is
        // written, or now if it is not (nothing to write, or the connection closes).
        let counted = if pending.api_key == wire::api::FETCH || pending.before_auth {
            0
        } else {
            response_bytes(&response)
        };
        let Some(chunks) = response else {
            activity.written(counted);
            continue;
        };
        if chunks.is_empty() {
            activity.written(counted);
            break;
        }
        let started = Instant::now();
        let wrote = write_chunks(half, &chunks, stall).await;
        activity.written(counted);
        if let Err(e) = wrote {
            if e.kind() == io::ErrorKind::TimedOut {
                crate::client_warn!(
                    "closing connection: a response not read for {} ms (connections.max.idle.ms)",
                    stall.as_millis()
                );
            }
            break;
        }
        crate::metrics::local(|m| m.sent(pending.api_key, started.elapsed()));
    }
}

/// Most chunks handed to one `sendmsg` (Linux's IOV_MAX is 1024).
const IOV_CHUNKS_MAX: usize = 1024;

/// Writes one response. glommio's TCP stream has no vectored write, so the chunks go out
/// with one non-blocking `sendmsg` (MSG_DONTWAIT, as glommio's own sends): header pieces
/// and record slices leave from their own buffers, uncopied, in one system call. Whatever
/// the socket does not take at once is written through glommio, which waits for the
/// socket to drain, and then the vectored send is tried again.
async fn write_chunks(half: &mut Half, chunks: &[Bytes], stall: Duration) -> io::Result<()> {
    if half.0.borrow().is_tls() {
        return write_chunks_tls(half, chunks, stall).await;
    }
    let fd = half.0.borrow().raw_fd();
    let (mut index, mut offset) = (0, 0);
    while index < chunks.len() {
        let sent = send_now(fd, &chunks[index..], offset)?;
        (index, offset) = advance(chunks, index, offset, sent);
        if index == chunks.len() {
            break;
        }
        write_progressing(half, &chunks[index][offset..], stall).await?;
        (index, offset) = (index + 1, 0);
    }
    Ok(())
}

/// Under TLS the chunks go through rustls, which copies them into its records (at most
/// 16 KiB each) and encrypts them; the flush pushes out the last record.
async fn write_chunks_tls(half: &mut Half, chunks: &[Bytes], stall: Duration) -> io::Result<()> {
    for chunk in chunks {
        write_progressing(half, chunk, stall).await?;
    }
    within(stall, half.flush()).await
}

/// Writes all of `buf`, failed with `TimedOut` once a write takes nothing for `stall`: a
/// client reading a large response slowly is not stalled, only one that stops.
async fn write_progressing(half: &mut Half, mut buf: &[u8], stall: Duration) -> io::Result<()> {
    while !buf.is_empty() {
        let n = within(stall, half.write(buf)).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n..];
    }
    Ok(())
}

/// `write`, failed with `TimedOut` if it has not completed within `stall`.
async fn within<T>(stall: Duration, write: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    futures_lite::future::or(write, async move {
        glommio::timer::sleep(stall).await;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no write progress within connections.max.idle.ms",
        ))
    })
    .await
}

/// The requests a SASL listener serves before authentication (Kafka's rule).
fn is_sasl_phase_api(api_key: i16) -> bool {
    matches!(
        api_key,
        wire::api::API_VERSIONS | wire::api::SASL_HANDSHAKE | wire::api::SASL_AUTHENTICATE
    )
}

/// Moves the position (`index`, `offset`) in `chunks` forward by `sent` bytes.
fn advance(
    chunks: &[Bytes],
    mut index: usize,
    mut offset: usize,
    mut sent: usize,
) -> (usize, usize) {
    while index < chunks.len() && sent > 0 {
        let left = chunks[index].len() - offset;
        if sent < left {
            return (index, offset + sent);
        }
        sent -= left;
        (index, offset) = (index + 1, 0);
    }
    // Skip empty chunks so the caller never writes a zero-length slice forever.
    while index < chunks.len() && chunks[index].len() == offset {
        (index, offset) = (index + 1, 0);
    }
    (index, offset)
}

/// One non-blocking vectored send of `chunks` (the first from `offset`); returns the bytes
/// the socket took, 0 if it is full.
fn send_now(fd: RawFd, chunks: &[Bytes], offset: usize) -> io::Result<usize> {
    let iov: Vec<libc::iovec> = chunks
        .iter()
        .take(IOV_CHUNKS_MAX)
        .enumerate()
        .map(|(i, c)| {
            let skip = if i == 0 { offset } else { 0 };
            libc::iovec {
                iov_base: c[skip..].as_ptr() as *mut libc::c_void,
                iov_len: c.len() - skip,
            }
        })
        .collect();
    // SAFETY: a zeroed msghdr is valid (no name, no control data); we set the iovec array.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len();
    // SAFETY: `msg` points at `iov`, whose entries point into `chunks`; all outlive the
    // call, and sendmsg only reads them. MSG_DONTWAIT keeps the executor thread from
    // blocking; MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n >= 0 {
        return Ok(n as usize);
    }
    let err = io::Error::last_os_error();
    match err.kind() {
        io::ErrorKind::WouldBlock => Ok(0),
        io::ErrorKind::Interrupted => Ok(0),
        _ => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_walks_chunks_and_skips_empty_ones() {
        let chunks = vec![
            Bytes::from_static(b"abc"),
            Bytes::new(),
            Bytes::from_static(b"de"),
        ];
        assert_eq!(advance(&chunks, 0, 0, 0), (0, 0));
        assert_eq!(advance(&chunks, 0, 0, 2), (0, 2));
        assert_eq!(
            advance(&chunks, 0, 0, 3),
            (2, 0),
            "the empty chunk is skipped"
        );
        assert_eq!(advance(&chunks, 0, 1, 3), (2, 1));
        assert_eq!(advance(&chunks, 0, 0, 5), (3, 0));
    }

    /// Three large frames written back to back (the client pipelines them) come out each
    /// in its own allocation, of its own size: a read never runs past a large frame's
    /// end, so Produce can cut the records out in place. The old reader took the last
    /// part of a frame with a 64 KiB chunk that also held the next frame's start, so the
    /// frame shared its allocation (and Produce copied it out).
    #[test]
    fn pipelined_large_frames_are_each_handed_over_whole() {
        use std::io::Write;
        const BODY: usize = 100_000;
        const FRAMES: u8 = 3;
        crate::storage::testing::run_on_shard(|| async {
            let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = std::thread::spawn(move || {
                let mut all = Vec::new();
                for i in 0..FRAMES {
                    all.extend_from_slice(&(BODY as i32).to_be_bytes());
                    all.extend(std::iter::repeat_n(i, BODY));
                }
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(&all).unwrap();
                s
            });
            let stream = listener.accept().await.unwrap();
            let mut reader = plain_reader(stream);
            for i in 0..FRAMES {
                let frame = reader.next().await.unwrap().expect("a frame");
                assert_eq!(frame.bytes.len(), BODY);
                assert!(frame.bytes.iter().all(|&b| b == i), "frame {i}'s bytes");
                let whole = frame.bytes.try_into_mut();
                let whole = whole.expect("each frame is the only owner of its allocation");
                if i > 0 {
                    // The first frame's start came in a 64 KiB chunk; after a large frame
                    // the next one is read into a buffer of exactly its size.
                    assert_eq!(whole.capacity(), BODY, "frame {i} sized exactly");
                }
            }
            drop(client.join().unwrap());
        });
    }

    /// A client thread that connects to `addr`, sends `bytes[..cut]`, and the rest once
    /// told to (through the returned sender); it returns its socket, kept open.
    fn send_in_two_parts(
        addr: SocketAddr,
        bytes: Vec<u8>,
        cut: usize,
    ) -> (
        std::sync::mpsc::Sender<()>,
        std::thread::JoinHandle<std::net::TcpStream>,
    ) {
        use std::io::Write;
        let (go_on, go) = std::sync::mpsc::channel::<()>();
        let client = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(&bytes[..cut]).unwrap();
            go.recv().unwrap();
            s.write_all(&bytes[cut..]).unwrap();
            s
        });
        (go_on, client)
    }

    /// A frame reader on an accepted plain TCP connection, with generous limits.
    fn plain_reader(stream: TcpStream) -> FrameReader {
        let half = Half(Rc::new(RefCell::new(Transport::Plain(stream))));
        let plain_fd = Some(half.0.borrow().raw_fd());
        FrameReader {
            half,
            buf: BytesMut::new(),
            max_bytes: 1 << 20,
            limits: ReadLimits {
                budget: RequestBudget::new(1 << 30, 1),
                frame_timeout: Duration::from_secs(30),
                idle_timeout: Duration::from_secs(60),
                write_stall: Duration::from_secs(60),
            },
            activity: Rc::new(Activity {
                last: Cell::new(Instant::now()),
                in_flight: Cell::new(0),
                unwritten_bytes: Cell::new(0),
                closed: Cell::new(false),
                changed: Event::default(),
            }),
            permit: None,
            peer_ip: std::net::Ipv4Addr::LOCALHOST.into(),
            deadline: None,
            plain_fd,
            expect_large: false,
            shares_allocation: false,
        }
    }

    /// Pipelined small frames: the frame after one that was cut off the buffer (and is
    /// still held, as Produce holds its records) is read into an allocation of its own,
    /// not into the room left in the shared one, so it is handed over as the only owner
    /// of its bytes (Produce then keeps them without copying).
    #[test]
    fn a_frame_after_one_still_held_gets_its_own_allocation() {
        const FIRST: usize = 10_000;
        const SECOND: usize = 20_000;
        const SECOND_START: usize = 2_000;
        crate::storage::testing::run_on_shard(|| async {
            let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let mut all = (FIRST as i32).to_be_bytes().to_vec();
            all.extend(std::iter::repeat_n(1u8, FIRST));
            all.extend_from_slice(&(SECOND as i32).to_be_bytes());
            all.extend(std::iter::repeat_n(2u8, SECOND));
            let (go_on, client) = send_in_two_parts(addr, all, 4 + FIRST + 4 + SECOND_START);
            let stream = listener.accept().await.unwrap();
            let mut reader = plain_reader(stream);
            let first = reader.next().await.unwrap().expect("the first frame");
            assert_eq!(first.bytes.len(), FIRST);
            go_on.send(()).unwrap();
            let second = reader.next().await.unwrap().expect("the second frame");
            assert_eq!(second.bytes.len(), SECOND);
            assert!(second.bytes.iter().all(|&b| b == 2));
            assert!(
                second.bytes.try_into_mut().is_ok(),
                "the second frame owns its allocation while the first is still held"
            );
            drop(first);
            drop(client.join().unwrap());
        });
    }

    /// A small frame that arrives in two parts is read into the room the first read left
    /// in the buffer: the buffer is not grown (grown, it would be reallocated and the
    /// first part copied, which a profile of a leader at RF 3 showed as 3.5 % of its CPU).
    #[test]
    fn a_small_frame_arriving_in_parts_is_read_without_regrowing_the_buffer() {
        const BODY: usize = 20_000;
        const FIRST: usize = 8_000;
        crate::storage::testing::run_on_shard(|| async {
            let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let mut frame = (BODY as i32).to_be_bytes().to_vec();
            frame.extend(std::iter::repeat_n(7u8, BODY));
            let (go_on, client) = send_in_two_parts(addr, frame, 4 + FIRST);
            let stream = listener.accept().await.unwrap();
            let mut reader = plain_reader(stream);
            let deadline = Instant::now() + Duration::from_secs(30);
            for _ in 0..10_000 {
                if reader.buf.len() >= 4 + FIRST {
                    break;
                }
                reader.fill(4 + BODY, deadline).await.unwrap();
            }
            assert_eq!(reader.buf.len(), 4 + FIRST, "the first part is read");
            let (at, capacity) = (reader.buf.as_ptr(), reader.buf.capacity());
            go_on.send(()).unwrap();
            let frame = reader.next().await.unwrap().expect("a frame");
            assert_eq!(frame.bytes.len(), BODY);
            assert!(frame.bytes.iter().all(|&b| b == 7));
            assert_eq!(
                frame.bytes.as_ptr(),
                at.wrapping_add(4),
                "the frame is where its first part was read: the buffer was not reallocated"
            );
            let whole = frame
                .bytes
                .try_into_mut()
                .expect("the frame owns its allocation");
            assert_eq!(whole.capacity(), capacity - 4, "nor grown");
            drop(client.join().unwrap());
        });
    }
}
