//! One client connection on its shard: reads frames (size checked before any buffer grows
//! for it), hands each request to its own task so requests pipeline, and writes responses
//! strictly in request order (Kafka's rule). At most [`PIPELINE_MAX`] requests per
//! connection are in flight; beyond that the reader stops reading, so a client that does
//! not read its responses is held back by TCP instead of growing our buffers.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures_lite::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::task::JoinHandle;

use crate::api;
use crate::event::Event;
use crate::proto;
use crate::shard::Shard;

/// Requests of one connection being worked on at once.
pub const PIPELINE_MAX: usize = 16;
/// Bytes asked of the socket per read call.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Most bytes one read call may add to a large frame's buffer.
const LARGE_READ_MAX_BYTES: usize = 1024 * 1024;

/// Why a connection is closed by the broker.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("request size {size} is outside 1..={max} (socket.request.max.bytes)")]
    FrameSize { size: i64, max: usize },
    #[error("connection closed in the middle of a frame ({have} of {need} bytes)")]
    Truncated { have: usize, need: usize },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Read or write access to a stream shared by the reader and writer tasks. The `RefCell`
/// is borrowed only inside one `poll_*` call, never across an await, and glommio keeps
/// separate read and write sources, so the two halves never disturb each other.
#[derive(Clone)]
struct Half(Rc<RefCell<TcpStream>>);

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

/// Splits size-prefixed frames out of the byte stream.
struct FrameReader {
    half: Half,
    buf: BytesMut,
    max_bytes: usize,
}

impl FrameReader {
    /// The next frame (without its size prefix); `None` at a clean end of stream.
    async fn next(&mut self) -> Result<Option<Bytes>, ConnError> {
        loop {
            let mut need = 4;
            if self.buf.len() >= 4 {
                let size = i32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
                if size <= 0 || size as usize > self.max_bytes {
                    return Err(ConnError::FrameSize {
                        size: size.into(),
                        max: self.max_bytes,
                    });
                }
                need = 4 + size as usize;
                if self.buf.len() >= need {
                    self.buf.advance(4);
                    if self.buf.len() == size as usize {
                        // The buffer holds exactly this frame: hand over the allocation
                        // whole, so the frame is its only owner (Produce then appends
                        // the record bytes in place instead of copying them).
                        return Ok(Some(std::mem::take(&mut self.buf).freeze()));
                    }
                    return Ok(Some(self.buf.split_to(size as usize).freeze()));
                }
            }
            if self.fill(need).await? == 0 {
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

    /// Reads once. While a large frame is incomplete, reads only bytes of that frame (so it
    /// ends the buffer and can be handed over whole), at most what the socket holds now
    /// and [`LARGE_READ_MAX_BYTES`]: memory grows with the bytes received, not with
    /// what a size prefix claims. Otherwise reads a chunk, which may also hold the next
    /// pipelined requests.
    async fn fill(&mut self, need: usize) -> Result<usize, ConnError> {
        let missing = need.saturating_sub(self.buf.len());
        let want = if missing >= READ_CHUNK_BYTES {
            // The buffer is zeroed before each read: size it to what the socket holds
            // now, so a large frame is not zeroed many times over.
            let ready = readable_bytes(&self.half).clamp(READ_CHUNK_BYTES, LARGE_READ_MAX_BYTES);
            missing.min(ready)
        } else {
            READ_CHUNK_BYTES
        };
        let start = self.buf.len();
        self.buf.resize(start + want, 0);
        let read = self.half.read(&mut self.buf[start..]).await;
        let n = *read.as_ref().unwrap_or(&0);
        self.buf.truncate(start + n);
        Ok(read?)
    }
}

/// A response slot in request order: `None` when the request has no response (acks=0).
type Pending = JoinHandle<Option<Vec<Bytes>>>;

/// Bytes the socket holds for us right now (0 if unknown).
fn readable_bytes(half: &Half) -> usize {
    let fd = half.0.borrow().as_raw_fd();
    let mut ready: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into `ready`, which outlives the call.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut ready) };
    if rc == 0 {
        usize::try_from(ready).unwrap_or(0)
    } else {
        0
    }
}

/// Serves one connection until the client closes it, sends bad framing, or shutdown.
pub async fn serve(shard: Rc<Shard>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let half = Half(Rc::new(RefCell::new(stream)));
    let (tx, rx) = local_channel::new_bounded::<Pending>(PIPELINE_MAX);
    let closing = Rc::new(Event::default());
    let writer = glommio::spawn_local(write_responses(half.clone(), rx, closing.clone()));
    let mut reader = FrameReader {
        half,
        buf: BytesMut::new(),
        max_bytes: shard.config().socket_request_max_bytes as usize,
    };
    // Checked before each listen: an event fired before we listen is not heard.
    while !shard.shutting_down.get() {
        let stop = futures_lite::future::or(shard.shutdown.listen(), closing.listen());
        let next = futures_lite::future::or(reader.next(), async {
            stop.await;
            Ok(None)
        });
        let frame = match next.await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(ConnError::Io(e)) => {
                tracing::debug!(%peer, "connection read error: {e}");
                break;
            }
            Err(e) => {
                crate::client_warn!(%peer, "closing connection: {e}");
                break;
            }
        };
        let req = match proto::parse_request(frame) {
            Ok(req) => req,
            Err(e) => {
                crate::client_warn!(%peer, "closing connection: {e}");
                break;
            }
        };
        let s = shard.clone();
        let task = glommio::spawn_local(async move { api::handle(&s, req, peer).await }).detach();
        if tx.send(task).await.is_err() {
            break;
        }
    }
    drop(tx);
    writer.await;
}

/// Writes responses in request order; stops at the first response that asks to close the
/// connection (an empty chunk list) or at a write error.
async fn write_responses(
    mut half: Half,
    rx: local_channel::LocalReceiver<Pending>,
    closing: Rc<Event>,
) {
    write_in_order(&mut half, &rx).await;
    closing.notify_all();
    let _ = half.close().await;
}

async fn write_in_order(half: &mut Half, rx: &local_channel::LocalReceiver<Pending>) {
    while let Some(pending) = rx.recv().await {
        let Some(response) = pending.await else { break };
        let Some(chunks) = response else { continue };
        if chunks.is_empty() || write_chunks(half, &chunks).await.is_err() {
            break;
        }
    }
}

/// Most chunks handed to one `sendmsg` (Linux's IOV_MAX is 1024).
const IOV_CHUNKS_MAX: usize = 1024;

/// Writes one response. glommio's TCP stream has no vectored write, so the chunks go out
/// with one non-blocking `sendmsg` (MSG_DONTWAIT, as glommio's own sends): header pieces
/// and record slices leave from their own buffers, uncopied, in one system call. Whatever
/// the socket does not take at once is written through glommio, which waits for the
/// socket to drain, and then the vectored send is tried again.
async fn write_chunks(half: &mut Half, chunks: &[Bytes]) -> io::Result<()> {
    let fd = half.0.borrow().as_raw_fd();
    let (mut index, mut offset) = (0, 0);
    while index < chunks.len() {
        let sent = send_now(fd, &chunks[index..], offset)?;
        (index, offset) = advance(chunks, index, offset, sent);
        if index == chunks.len() {
            break;
        }
        half.write_all(&chunks[index][offset..]).await?;
        (index, offset) = (index + 1, 0);
    }
    Ok(())
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
}
