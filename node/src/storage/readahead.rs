//! [`ReadAhead`]: sequential readers of the segment files find their next window read.
//!
//! When a log is read from disk where its previous disk read ended (a consumer or a
//! follower catching up from older data), the read that follows it is started at once, in
//! the background, while this answer is being sent: the next fetch then waits for no disk
//! (or for less of it). Without it a consumer's fetches alternate disk read, send, disk
//! read, send, and the disk and the socket are each idle half the time.
//!
//! The window starts at the exact byte where the previous read ended (remembered with its
//! offset until the log changes), and so does the next read of that offset: the offset
//! index would place both one batch early (it keys each batch by its last offset), and a
//! window of the answer's size read from there misses the answer's last batch.
//!
//! Bounds: one window per log, at most `log.read.ahead.bytes` (and at most the window the
//! read itself used); all logs of a shard together at most [`SHARD_READ_AHEAD_BYTES_MAX`]
//! (a window that would pass it is not read ahead, after windows left unclaimed for
//! [`UNCLAIMED_MAX`] were dropped to make room). A window is dropped when it is served,
//! replaced, left unclaimed (as above), or the log changes.
//!
//! Correctness first: a window is served only for the same segment file (`Rc` identity: a
//! cleaner swap or a truncate-and-recreate opens another file) at the same generation.
//! Every operation that may change bytes below a segment's written end or removes
//! segments (truncation, out-of-space rollback, the cleaner's swap, retention,
//! DeleteRecords, close, delete) calls [`ReadAhead::invalidate`], which drops the window
//! (cancelling its read) and bumps the generation, so a read-ahead that was being awaited
//! when the log changed is discarded when it completes. The bytes served are checked
//! (framing, offsets, CRC) like every other read from disk.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use wire::Offset;

use super::file::SegmentFile;

/// Bound on the bytes read ahead by every log of one shard together (in flight or
/// waiting to be served).
pub const SHARD_READ_AHEAD_BYTES_MAX: u64 = 64 << 20;
/// A window nobody came for within this long (its reader stopped or moved) is dropped
/// when another log needs the shard's budget.
const UNCLAIMED_MAX: Duration = Duration::from_secs(5);
/// The sweep for unclaimed windows (over every log of the shard that read ahead) runs at
/// most this often, so a full budget does not cost a sweep per read.
const SWEEP_INTERVAL: Duration = Duration::from_millis(200);

thread_local! {
    /// Bytes read ahead on this shard (thread) now.
    static SHARD_READ_AHEAD: Cell<u64> = const { Cell::new(0) };
    /// The slots of this shard's logs that have read ahead (as long as the log lives),
    /// for the sweep; and when it last ran.
    static SHARD_SLOTS: RefCell<Vec<Weak<RefCell<Slot>>>> = const { RefCell::new(Vec::new()) };
    static LAST_SWEEP: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Bytes read ahead on the calling shard now (in flight or waiting to be served).
pub fn shard_read_ahead_bytes() -> u64 {
    SHARD_READ_AHEAD.with(Cell::get)
}

/// One log's read-ahead state. Lives in the log's `State`; touched only on its shard.
#[derive(Default)]
pub struct ReadAhead {
    /// Bumped by [`invalidate`](Self::invalidate): a window read under an older
    /// generation is never served.
    generation: u64,
    /// Where the last disk read of this log ended: a read starting there is sequential.
    last_end: Option<Offset>,
    /// The file position of that end (segment base, byte after the last batch served),
    /// while the next batch is in the same segment. The offset index cannot give it: its
    /// entry for a batch's last offset points at that batch's start, so a lookup of the
    /// next offset lands one batch early, and a window read from there misses the end of
    /// the answer (a consume profile showed every window read twice).
    last_end_pos: Option<(Offset, u64)>,
    /// Shared with the shard's sweep (weakly), which may empty it.
    slot: Rc<RefCell<Slot>>,
}

#[derive(Default)]
struct Slot {
    window: Option<Window>,
    /// Listed in `SHARD_SLOTS`.
    listed: bool,
}

/// A window being read ahead (or read): which file, where, under which generation.
pub struct Window {
    file: Rc<SegmentFile>,
    /// The segment's base offset.
    base: Offset,
    /// Byte position of the window in the segment file.
    pub pos: u64,
    /// Bytes asked for (fewer if the file ends first), counted in the shard's budget.
    len: u64,
    pub generation: u64,
    started: Instant,
    read: Option<glommio::Task<io::Result<Bytes>>>,
}

impl Window {
    /// The window's bytes, once its read completes.
    pub async fn bytes(mut self) -> io::Result<Bytes> {
        match self.read.take() {
            Some(task) => task.await,
            None => Err(io::Error::other("read-ahead already taken")),
        }
    }

    fn holds(&self, file: &Rc<SegmentFile>, base: Offset, pos: u64) -> bool {
        Rc::ptr_eq(&self.file, file)
            && self.base == base
            && (self.pos..self.pos + self.len).contains(&pos)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        SHARD_READ_AHEAD.with(|c| c.set(c.get().saturating_sub(self.len)));
    }
}

impl ReadAhead {
    /// The log changed (see the module docs): forget the window and the sequence.
    pub fn invalidate(&mut self) {
        self.generation += 1;
        self.last_end = None;
        self.last_end_pos = None;
        let dropped = self.slot.borrow_mut().window.take();
        drop(dropped);
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a disk read starting at `start` continues the previous one.
    pub fn is_sequential(&self, start: Offset) -> bool {
        self.last_end == Some(start)
    }

    /// A disk read ended at `next` (the offset after its last batch), at byte `pos` of
    /// the segment based at `segment`.
    pub fn note_end(&mut self, next: Offset, segment: Offset, pos: u64) {
        self.last_end = Some(next);
        self.last_end_pos = Some((segment, pos));
    }

    /// The exact byte position in the segment based at `segment` of the batch that holds
    /// `start`, if the previous disk read ended there (see `last_end_pos`). Valid until
    /// [`invalidate`](Self::invalidate), which every change below the written end calls.
    pub fn resume_pos(&self, start: Offset, segment: Offset) -> Option<u64> {
        match self.last_end_pos {
            Some((base, pos)) if self.last_end == Some(start) && base == segment => Some(pos),
            _ => None,
        }
    }

    /// The window read ahead for a read of `file` (segment `base`) from byte `pos`, if
    /// there is one holding that position under the current generation.
    pub fn take(&mut self, file: &Rc<SegmentFile>, base: Offset, pos: u64) -> Option<Window> {
        let mut slot = self.slot.borrow_mut();
        let w = slot.window.as_ref()?;
        if w.generation != self.generation || !w.holds(file, base, pos) {
            return None;
        }
        slot.window.take()
    }

    /// Starts reading `len` bytes of `file` (segment `base`) at `pos` in the background,
    /// replacing this log's window; does nothing if the shard's budget has no room (after
    /// dropping windows left unclaimed). Returns whether it started.
    pub fn start(&mut self, file: Rc<SegmentFile>, base: Offset, pos: u64, len: u64) -> bool {
        let old = self.slot.borrow_mut().window.take();
        drop(old);
        let Ok(size) = usize::try_from(len) else {
            return false;
        };
        if len == 0 || !reserve(len) {
            return false;
        }
        let reader = file.clone();
        let read = glommio::spawn_local(async move { reader.read_shared(pos, size).await });
        let window = Window {
            file,
            base,
            pos,
            len,
            generation: self.generation,
            started: Instant::now(),
            read: Some(read),
        };
        let mut slot = self.slot.borrow_mut();
        slot.window = Some(window);
        if !slot.listed {
            slot.listed = true;
            SHARD_SLOTS.with(|s| s.borrow_mut().push(Rc::downgrade(&self.slot)));
        }
        true
    }
}

/// Takes `len` bytes of the shard's budget, sweeping unclaimed windows if it is full.
fn reserve(len: u64) -> bool {
    let fits =
        || SHARD_READ_AHEAD.with(Cell::get).saturating_add(len) <= SHARD_READ_AHEAD_BYTES_MAX;
    if !fits() {
        sweep(Instant::now());
    }
    if !fits() {
        return false;
    }
    SHARD_READ_AHEAD.with(|c| c.set(c.get() + len));
    true
}

/// Drops every window on this shard unclaimed for [`UNCLAIMED_MAX`], and forgets the
/// slots of logs that are gone; at most once per [`SWEEP_INTERVAL`].
fn sweep(now: Instant) {
    let due = LAST_SWEEP.with(|t| {
        t.get()
            .is_none_or(|t| now.duration_since(t) >= SWEEP_INTERVAL)
    });
    if !due {
        return;
    }
    LAST_SWEEP.with(|t| t.set(Some(now)));
    let mut dropped = Vec::new();
    SHARD_SLOTS.with(|slots| {
        slots.borrow_mut().retain(|weak| {
            let Some(slot) = weak.upgrade() else {
                return false;
            };
            let mut slot = slot.borrow_mut();
            if slot
                .window
                .as_ref()
                .is_some_and(|w| now.duration_since(w.started) >= UNCLAIMED_MAX)
            {
                dropped.extend(slot.window.take());
            }
            true
        });
    });
    // Dropped outside the borrows: a window's drop cancels its read.
    drop(dropped);
}
