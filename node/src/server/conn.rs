//! One client connection on its shard: reads frames (size checked before any buffer grows
//! for it), hands each request to its own task so requests pipeline, and writes responses
//! strictly in request order (Kafka's rule). At most [`PIPELINE_MAX`] requests per
//! connection are in flight; beyond that the reader stops reading, so a client that does
//! not read its responses is held back by TCP instead of growing our buffers.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
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

    /// Reads once. While a large frame is incomplete, reads exactly what it still misses
    /// (so it ends the buffer and can be handed over whole), at most
    /// [`LARGE_READ_MAX_BYTES`] at a time: memory grows with the bytes received, not with
    /// what a size prefix claims. Otherwise reads a chunk, which may also hold the next
    /// pipelined requests.
    async fn fill(&mut self, need: usize) -> Result<usize, ConnError> {
        let missing = need.saturating_sub(self.buf.len());
        let want = if missing >= READ_CHUNK_BYTES {
            missing.min(LARGE_READ_MAX_BYTES)
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

type Pending = JoinHandle<Option<Vec<Bytes>>>;

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
                tracing::warn!(%peer, "closing connection: {e}");
                break;
            }
        };
        let req = match proto::parse_request(frame) {
            Ok(req) => req,
            Err(e) => {
                tracing::warn!(%peer, "closing connection: {e}");
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
    let mut small = BytesMut::new();
    while let Some(pending) = rx.recv().await {
        let Some(response) = pending.await else { break };
        let Some(chunks) = response else { continue };
        if chunks.is_empty() || write_chunks(half, &chunks, &mut small).await.is_err() {
            break;
        }
    }
}

/// Chunks below this size are gathered into one buffer (one send instead of many);
/// larger chunks (record data) are sent from their own buffers, uncopied.
const COALESCE_BELOW_BYTES: usize = 16 * 1024;

/// Writes one response. glommio's TCP stream has no vectored write, so small pieces are
/// coalesced and large ones written in place.
async fn write_chunks(half: &mut Half, chunks: &[Bytes], small: &mut BytesMut) -> io::Result<()> {
    for chunk in chunks {
        if chunk.len() < COALESCE_BELOW_BYTES {
            small.extend_from_slice(chunk);
            if small.len() < COALESCE_BELOW_BYTES {
                continue;
            }
        }
        if !small.is_empty() {
            half.write_all(small).await?;
            small.clear();
        }
        if chunk.len() >= COALESCE_BELOW_BYTES {
            half.write_all(chunk).await?;
        }
    }
    if !small.is_empty() {
        half.write_all(small).await?;
        small.clear();
    }
    Ok(())
}
