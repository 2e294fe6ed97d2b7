//! Segment reads into buffers that leave the shard as `Bytes` without a copy: an aligned
//! heap buffer filled by `pread` on the segment's O_DIRECT descriptor, in glommio's
//! blocking thread pool.
//!
//! Why not glommio's own DMA read: its buffer belongs to the reactor that read it (an
//! `Rc`, `!Send`), and a fetch answer crosses shards over the mesh as `Bytes`, which must
//! be `Send`. Serving from it meant copying every fetched byte into a new buffer once
//! more (a memcpy of the whole fetch, plus a second allocation). A buffer of our own is
//! handed to the socket as it was read. The cost is a hand-off to the blocking thread
//! (two futex wake-ups and a `dup`) per read, small beside the windows read this way
//! (64 KiB .. 8 MiB). Freed buffers go to a process-wide pool ([`POOLED_BYTES_MAX`]) and
//! are reused, so a read does not fault in (and the kernel zero) fresh pages.
//!
//! Buffers of [`HUGE_PAGE_BYTES`] or more are aligned to it, sized in whole huge pages
//! and advised `MADV_HUGEPAGE` before their first touch (transparent huge pages are
//! `madvise` on most distributions). An O_DIRECT read pins every page of its buffer
//! (`get_user_pages`): with 4 KiB pages that was 12.7 % of the broker's CPU in a consume
//! profile (2,048 pages per 8 MiB window); a huge page is pinned at once. The CRC check
//! and the socket's copy, which walk the whole buffer, also take a TLB miss per 2 MiB
//! instead of per 4 KiB (a nested page walk on a VM). Where the kernel gives no huge
//! pages the advice is ignored and the buffer works as before.

use std::alloc::{Layout, alloc, dealloc};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use glommio::io::DmaFile;

/// Alignment of the buffer, the file position and the length read (O_DIRECT wants the
/// device's logical block size; 4 KiB covers the usual 512 and 4096).
const ALIGN_BYTES_MIN: u64 = 4096;
/// Most `pread` calls for one read: one normally does it all; the rest are EINTR or a
/// short read in the middle of the file. What is still missing after them is left to the
/// caller's next read (a shorter buffer is never an error).
const PREAD_CALLS_MAX: usize = 16;
/// Largest read: the windows read for fetches are at most 8 MiB.
pub const SHARED_READ_BYTES_MAX: usize = 64 << 20;

/// Bytes of freed read buffers kept for reuse, whole process. A fresh buffer of a
/// few MiB costs more than the read itself: the kernel zeroes every page as the DMA read
/// faults it in, and unmaps it again on free (a profile of a consume run: about half of
/// the broker's CPU).
const POOLED_BYTES_MAX: usize = 64 << 20;

/// Size (and alignment) of a transparent huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Freed buffers (any thread frees them: the last `Bytes` of a fetch answer is dropped on
/// the connection's shard), and their total size.
static POOL: Mutex<(Vec<RawBuf>, usize)> = Mutex::new((Vec::new(), 0));

/// An aligned heap allocation.
struct RawBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain heap memory owned by this value alone.
unsafe impl Send for RawBuf {}

impl RawBuf {
    /// A pooled buffer aligned to at least `align` and of at least `len` bytes (at most
    /// twice that, so a small read does not pin a large buffer), else a new one (in huge
    /// pages from [`HUGE_PAGE_BYTES`] on).
    fn take(len: usize, align: usize) -> io::Result<RawBuf> {
        let (size, align) = if len >= HUGE_PAGE_BYTES {
            let size = len
                .checked_next_multiple_of(HUGE_PAGE_BYTES)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "read length"))?;
            (size, align.max(HUGE_PAGE_BYTES))
        } else {
            (len.max(align), align)
        };
        if let Ok(mut pool) = POOL.lock() {
            let fits = |b: &RawBuf| {
                b.layout.align() >= align
                    && b.layout.size() >= size
                    && b.layout.size() <= size.saturating_mul(2)
            };
            if let Some(i) = pool.0.iter().position(fits) {
                let buf = pool.0.swap_remove(i);
                pool.1 -= buf.layout.size();
                return Ok(buf);
            }
        }
        let layout = Layout::from_size_align(size, align)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if align >= HUGE_PAGE_BYTES {
            return RawBuf::map_huge(layout);
        }
        // SAFETY: the layout's size is at least `align`, never zero.
        let ptr = unsafe { alloc(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "read buffer"))?;
        Ok(RawBuf { ptr, layout })
    }

    /// A fresh anonymous mapping of `layout` (aligned to a huge page), advised
    /// `MADV_HUGEPAGE` before anything touches it. Mapped here rather than taken from
    /// malloc, whose recycled heap memory may already be backed by small pages.
    fn map_huge(layout: Layout) -> io::Result<RawBuf> {
        let (size, align) = (layout.size(), layout.align());
        let span = size
            .checked_add(align)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "read length"))?;
        // SAFETY: a new private anonymous mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let head = (base as usize).next_multiple_of(align) - base as usize;
        let tail = span - head - size;
        // SAFETY: the unmapped ranges are the unaligned head and the tail of the mapping
        // just made, outside `[base + head, base + head + size)`, which is kept.
        unsafe {
            if head > 0 {
                libc::munmap(base, head);
            }
            if tail > 0 {
                libc::munmap(base.cast::<u8>().add(head + size).cast(), tail);
            }
        }
        // SAFETY: inside the mapping (head < span).
        let ptr = unsafe { base.cast::<u8>().add(head) };
        // Advice only: without huge pages (THP off, or none free) the buffer is backed by
        // small pages, so the result is not checked.
        // SAFETY: the range is the kept mapping, untouched; madvise changes no contents.
        let _ = unsafe { libc::madvise(ptr.cast(), size, libc::MADV_HUGEPAGE) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "read buffer"))?;
        Ok(RawBuf { ptr, layout })
    }

    /// Back to the pool if it has room, else freed.
    fn give_back(self) {
        if let Ok(mut pool) = POOL.lock()
            && pool.1 + self.layout.size() <= POOLED_BYTES_MAX
        {
            pool.1 += self.layout.size();
            pool.0.push(self);
        }
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        if self.layout.align() >= HUGE_PAGE_BYTES {
            // SAFETY: mapped in `map_huge` as exactly this range, unmapped once.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.layout.size()) };
            return;
        }
        // SAFETY: allocated in `take` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// An aligned heap buffer, its first `filled` bytes read from a file.
struct AlignedBuf {
    raw: Option<RawBuf>,
    ptr: NonNull<u8>,
    /// Bytes the read may fill (the buffer may be larger: a pooled one).
    len: usize,
    filled: usize,
}

// SAFETY: plain heap memory owned by this value alone: written only while one thread
// holds it by value (the pread), read-only once it is shared as `Bytes`.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn new(len: usize, align: usize) -> io::Result<AlignedBuf> {
        let raw = RawBuf::take(len, align)?;
        assert!(raw.layout.size() >= len, "read buffer smaller than asked");
        Ok(AlignedBuf {
            ptr: raw.ptr,
            raw: Some(raw),
            len,
            filled: 0,
        })
    }

    /// Reads from `fd` at `pos` until the buffer is full, the file ends, or
    /// [`PREAD_CALLS_MAX`] calls were made. Runs on the blocking thread.
    fn fill(&mut self, fd: &OwnedFd, pos: u64, align: usize) -> io::Result<()> {
        let len = self.len;
        for _ in 0..PREAD_CALLS_MAX {
            if self.filled == len {
                break;
            }
            let at = libc::off_t::try_from(pos + self.filled as u64)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "read position"))?;
            // SAFETY: the range written, `[filled, len)`, lies inside this buffer's
            // allocation, which no one else can see while `&mut self` is held.
            let n = unsafe {
                libc::pread(
                    fd.as_raw_fd(),
                    self.ptr.as_ptr().add(self.filled).cast(),
                    len - self.filled,
                    at,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let n = n as usize;
            assert!(n <= len - self.filled, "pread returned more than asked");
            self.filled += n;
            // End of file: nothing more, or a partial block (O_DIRECT reads whole blocks
            // except at the end of the file).
            if n == 0 || !self.filled.is_multiple_of(align) {
                break;
            }
        }
        Ok(())
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes were written by pread; the allocation lives
        // as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.filled) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            raw.give_back();
        }
    }
}

/// Up to `size` bytes of `file` at `pos` (fewer at the end of the file), in a buffer of
/// their own: slices of the result go to the socket uncopied, from any shard.
pub async fn read_dma(file: &DmaFile, pos: u64, size: usize) -> io::Result<Bytes> {
    let size = size.min(SHARED_READ_BYTES_MAX);
    let align = ALIGN_BYTES_MIN.max(file.alignment());
    let start = pos - pos % align;
    let end = pos
        .checked_add(size as u64)
        .and_then(|e| e.checked_next_multiple_of(align))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "read past 2^64"))?;
    let len = usize::try_from(end - start)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "read length"))?;
    let align = align as usize;
    let mut buf = AlignedBuf::new(len, align)?;
    // A descriptor of its own: if this future is dropped the blocking thread may still be
    // reading after the segment's file is closed, and must not read a reused number.
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor (or -1), owned by no one else.
    let fd = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor (checked above) that nothing else closes.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The buffer comes back through a slot of our own, not as the blocking call's return
    // value: glommio keeps that in a `MaybeUninit` that is never dropped if this future
    // is (a cancelled read-ahead, a fetch whose client went away), which would leak it.
    let slot: Arc<Mutex<Option<io::Result<AlignedBuf>>>> = Arc::new(Mutex::new(None));
    let filled = slot.clone();
    glommio::executor()
        .spawn_blocking(move || {
            let read = buf.fill(&fd, start, align).map(|()| buf);
            if let Ok(mut s) = filled.lock() {
                *s = Some(read);
            }
        })
        .await;
    let read = slot.lock().ok().and_then(|mut s| s.take());
    let buf = read.ok_or_else(|| io::Error::other("blocking read lost its buffer"))??;
    let have = buf.filled;
    let skip = (pos - start) as usize;
    let (from, to) = (skip.min(have), skip.saturating_add(size).min(have));
    Ok(Bytes::from_owner(buf).slice(from..to))
}
