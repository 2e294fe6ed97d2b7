//! The storage I/O seam: [`SegmentFile`], a segment's `.log` file — glommio's `DmaFile`
//! (O_DIRECT, io_uring) in the broker, or a [`SimFile`] on a [`SimDisk`] in tests — and
//! [`Disk`], which opens them and probes the named fault points.
//!
//! The simulated disk is in memory and single-threaded (one shard). It tracks, per file,
//! the bytes written and the bytes durable (as of the last fdatasync of that file), can
//! "crash" (every file goes back to its durable bytes, optionally keeping a prefix of the
//! unsynced writes, as a disk that persisted some of them), and fails with EIO or ENOSPC at
//! named points ([`FaultPoint`]) or, while [`SimDisk::set_full`] is on, on every write.
//! What it does not model: directory entries and the small files written with std I/O
//! (`write_atomic`: log start offset, clean-shutdown marker, producer-state snapshots;
//! index files) live on the real filesystem next to a placeholder of each `.log` file, so
//! the log's listing and removal code runs unchanged; a file's creation and removal are
//! durable at once (the log syncs the directory after both). Producer-state snapshots do not
//! go through this seam; [`FaultPoint::IndexWrite`] is probed for the index files.
//!
//! The seam is an enum, not a trait object: one match per call, no allocation per write.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions};

/// Where a segment's files live: the real disk, or a simulated one (tests).
#[derive(Clone, Default)]
pub enum Disk {
    #[default]
    Real,
    Sim(Rc<SimDisk>),
}

impl Disk {
    /// Opens a `.log` file for reading and writing (`create`: a new, empty file; a stale
    /// file of that name is emptied).
    pub async fn open_log(&self, path: &Path, create: bool) -> io::Result<SegmentFile> {
        match self {
            Disk::Real => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(create)
                    .truncate(create)
                    .dma_open(path)
                    .await?;
                Ok(SegmentFile::Dma(file))
            }
            Disk::Sim(disk) => disk.open(path, create).map(SegmentFile::Sim),
        }
    }

    /// Renames a file (the log cleaner's `.cleaned` → `.swap` → `.log`), replacing `to`.
    /// Not durable until the directory is synced. On the simulated disk the file's bytes
    /// move with the name; the rename is probed at [`FaultPoint::Swap`].
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match self {
            Disk::Real => std::fs::rename(from, to),
            Disk::Sim(disk) => disk.rename(from, to),
        }
    }

    /// Removes a file the log cleaner wrote or replaced (a missing one is fine); probed
    /// at [`FaultPoint::Swap`] on the simulated disk.
    pub fn remove(&self, path: &Path) -> io::Result<()> {
        if let Disk::Sim(disk) = self {
            disk.probe(FaultPoint::Swap)?;
            disk.files.borrow_mut().remove(path);
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// A named fault point outside the segment files (index files): fails if the
    /// simulated disk has a fault armed there. Always `Ok` on the real disk.
    pub fn probe(&self, point: FaultPoint) -> io::Result<()> {
        match self {
            Disk::Real => Ok(()),
            Disk::Sim(disk) => disk.probe(point),
        }
    }
}

/// One segment's `.log` file.
pub enum SegmentFile {
    Dma(DmaFile),
    Sim(SimFile),
}

/// A buffer to write, aligned for the file it was allocated for.
pub enum IoBuf {
    Dma(DmaBuffer),
    Mem(Vec<u8>),
}

/// A filled [`IoBuf`], shared with the write in flight (glommio holds it until the
/// write completes; the writer keeps it to rewrite a short write's remainder).
pub enum SharedBuf {
    Dma(Rc<DmaBuffer>),
    Mem(Rc<Vec<u8>>),
}

impl SharedBuf {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            SharedBuf::Dma(b) => b.as_bytes(),
            SharedBuf::Mem(v) => v,
        }
    }
}

impl IoBuf {
    /// The buffer, filled, ready for [`SegmentFile::write_at`].
    pub fn share(self) -> SharedBuf {
        match self {
            IoBuf::Dma(b) => SharedBuf::Dma(Rc::new(b)),
            IoBuf::Mem(v) => SharedBuf::Mem(Rc::new(v)),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            IoBuf::Dma(b) => b.as_bytes(),
            IoBuf::Mem(v) => v,
        }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self {
            IoBuf::Dma(b) => b.as_bytes_mut(),
            IoBuf::Mem(v) => v,
        }
    }
}

/// Bytes read from a file.
pub enum ReadBytes {
    Dma(glommio::io::ReadResult),
    Mem(Vec<u8>),
    /// From [`SegmentFile::read_shared`]: slices leave the shard uncopied.
    Shared(bytes::Bytes),
}

impl Deref for ReadBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            ReadBytes::Dma(r) => r,
            ReadBytes::Mem(v) => v,
            ReadBytes::Shared(b) => b,
        }
    }
}

impl SegmentFile {
    /// The block size writes must be aligned to.
    pub fn alignment(&self) -> u64 {
        match self {
            SegmentFile::Dma(f) => f.alignment(),
            SegmentFile::Sim(_) => SIM_ALIGNMENT_BYTES,
        }
    }

    /// An aligned, zeroed buffer of `size` bytes for [`write_at`](Self::write_at).
    pub fn alloc_buffer(&self, size: usize) -> IoBuf {
        match self {
            SegmentFile::Dma(f) => IoBuf::Dma(f.alloc_dma_buffer(size)),
            SegmentFile::Sim(_) => IoBuf::Mem(vec![0; size]),
        }
    }

    /// Writes the buffer at `pos` (block aligned); returns the bytes written, which may
    /// be fewer (a short write: the filesystem filled up midway).
    pub async fn write_at(&self, buf: &SharedBuf, pos: u64) -> io::Result<usize> {
        match (self, buf) {
            (SegmentFile::Dma(f), SharedBuf::Dma(b)) => Ok(f.write_rc_at(b.clone(), pos).await?),
            (SegmentFile::Sim(f), SharedBuf::Mem(b)) => {
                f.disk.writes_released().await;
                f.write_at(b, pos)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer allocated for another kind of file",
            )),
        }
    }

    /// Up to `size` bytes at `pos` (fewer at the end of the file).
    pub async fn read_at(&self, pos: u64, size: usize) -> io::Result<ReadBytes> {
        match self {
            SegmentFile::Dma(f) => Ok(ReadBytes::Dma(f.read_at(pos, size).await?)),
            SegmentFile::Sim(f) => f.read_at(pos, size).map(ReadBytes::Mem),
        }
    }

    /// Like [`read_at`](Self::read_at), into a buffer of its own that can leave the shard
    /// as `Bytes` (see `shared_read.rs`): what fetches serve, uncopied.
    pub async fn read_shared(&self, pos: u64, size: usize) -> io::Result<bytes::Bytes> {
        match self {
            SegmentFile::Dma(f) => super::shared_read::read_dma(f, pos, size).await,
            SegmentFile::Sim(f) => f.read_at(pos, size).map(bytes::Bytes::from),
        }
    }

    /// [`read_at`](Self::read_at) for an aligned position and size.
    pub async fn read_at_aligned(&self, pos: u64, size: usize) -> io::Result<ReadBytes> {
        match self {
            SegmentFile::Dma(f) => Ok(ReadBytes::Dma(f.read_at_aligned(pos, size).await?)),
            SegmentFile::Sim(f) => f.read_at(pos, size).map(ReadBytes::Mem),
        }
    }

    /// fdatasync: everything written so far is durable.
    pub async fn fdatasync(&self) -> io::Result<()> {
        match self {
            SegmentFile::Dma(f) => Ok(f.fdatasync().await?),
            SegmentFile::Sim(f) => f.fdatasync(),
        }
    }

    /// Sets the file's size (the log only shrinks files this way).
    pub async fn truncate(&self, size: u64) -> io::Result<()> {
        match self {
            SegmentFile::Dma(f) => Ok(f.truncate(size).await?),
            SegmentFile::Sim(f) => f.truncate(size),
        }
    }

    /// Reserves blocks up to `size` (fallocate); `keep_size` leaves the file size.
    pub async fn pre_allocate(&self, size: u64, keep_size: bool) -> io::Result<()> {
        match self {
            SegmentFile::Dma(f) => Ok(f.pre_allocate(size, keep_size).await?),
            SegmentFile::Sim(f) => f.check(None),
        }
    }

    pub async fn file_size(&self) -> io::Result<u64> {
        match self {
            SegmentFile::Dma(f) => Ok(f.file_size().await?),
            SegmentFile::Sim(f) => f.check(None).map(|()| f.data.borrow().data.len() as u64),
        }
    }
}

/// The simulated disk's block size.
pub const SIM_ALIGNMENT_BYTES: u64 = 512;

/// A named point where the simulated disk can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// A DMA write of appended batches to the active segment.
    Append,
    /// Creating the next segment's file when the log rolls.
    Roll,
    /// Truncating a segment file (seal trims the padding; recovery and truncation cut).
    Truncate,
    /// Writing a sealed (or closed) segment's `.index` / `.timeindex` files.
    IndexWrite,
    /// fdatasync of a segment file.
    Sync,
    /// A rename or removal by the log cleaner's segment swap.
    Swap,
}

/// How an armed fault fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// EIO: the device failed; the log must fail for good.
    Eio,
    /// ENOSPC: the filesystem is full.
    NoSpace,
}

impl FaultKind {
    fn error(self) -> io::Error {
        match self {
            FaultKind::Eio => io::Error::from_raw_os_error(libc::EIO),
            FaultKind::NoSpace => io::Error::from_raw_os_error(libc::ENOSPC),
        }
    }
}

struct Fault {
    point: FaultPoint,
    kind: FaultKind,
    /// Operations at `point` that still succeed before this one fails.
    skip: u64,
}

/// One file's bytes: as written, and as of its last fdatasync.
#[derive(Default)]
struct SimData {
    data: Vec<u8>,
    durable: Vec<u8>,
}

/// A simulated disk: see the module docs.
#[derive(Default)]
pub struct SimDisk {
    files: RefCell<HashMap<PathBuf, Rc<RefCell<SimData>>>>,
    /// Crashes so far: a file opened before a crash belongs to the dead process and fails.
    epoch: Cell<u64>,
    faults: RefCell<Vec<Fault>>,
    full: Cell<bool>,
    /// The first write after the disk filled is short (lands half, returns its length),
    /// as a real filesystem writes what still fits; the rest then fails with ENOSPC.
    short_write_due: Cell<bool>,
    /// Power loss after this many more operations (writes, syncs, truncations, file and
    /// index creations), with its torn-tail seed (see [`SimDisk::crash_after`]).
    crash_countdown: Cell<Option<(u64, Option<u64>)>>,
    /// Operations seen per point (for tests: that a point was reached).
    seen: RefCell<HashMap<FaultPoint, u64>>,
    /// With [`SimDisk::set_halt_on_crash`]: after a crash every operation fails until
    /// [`SimDisk::restart`], as the crashed process does nothing more.
    halt_on_crash: Cell<bool>,
    halted: Cell<bool>,
    /// With [`SimDisk::hold_writes`]: segment writes wait (in flight) until released;
    /// the wakers of those waiting.
    writes_held: Cell<bool>,
    held_writers: RefCell<Vec<std::task::Waker>>,
}

/// Bound on armed faults (a test arms a few).
const FAULTS_MAX: usize = 64;

impl SimDisk {
    pub fn new() -> Rc<SimDisk> {
        Rc::new(SimDisk::default())
    }

    /// Arms a fault: the operation at `point` after `skip` more successful ones fails
    /// with `kind`. A failing write lands half its bytes first (a torn write).
    pub fn inject(&self, point: FaultPoint, kind: FaultKind, skip: u64) {
        let mut faults = self.faults.borrow_mut();
        assert!(faults.len() < FAULTS_MAX, "too many armed faults");
        faults.push(Fault { point, kind, skip });
    }

    /// While on, every write, file creation and index write fails with ENOSPC, except the
    /// first write, which is short (lands half its bytes); syncs, truncations and reads
    /// still work.
    pub fn set_full(&self, full: bool) {
        self.full.set(full);
        self.short_write_due.set(full);
    }

    /// While on, every segment write waits before it touches the disk, as a DMA write
    /// still in flight (appends have their offsets and sit in the tail cache); off, they
    /// proceed (and fail if a fault is armed). For tests of what happens in that window.
    pub fn hold_writes(&self, hold: bool) {
        self.writes_held.set(hold);
        if !hold {
            for w in std::mem::take(&mut *self.held_writers.borrow_mut()) {
                w.wake();
            }
        }
    }

    /// Waits while writes are held (see [`SimDisk::hold_writes`]).
    async fn writes_released(&self) {
        std::future::poll_fn(|cx| {
            if !self.writes_held.get() {
                return std::task::Poll::Ready(());
            }
            let mut held = self.held_writers.borrow_mut();
            if held.len() < FAULTS_MAX {
                held.push(cx.waker().clone());
            } else {
                // Bounded: beyond it, a waiter re-checks on its next poll.
                cx.waker().wake_by_ref();
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// Power loss during the operation after `ops` more succeed: that operation fails,
    /// and the disk is as [`crash`](Self::crash) leaves it. For crashing at every point of
    /// a workload, between a write and its sync included.
    pub fn crash_after(&self, ops: u64, torn_seed: Option<u64>) {
        self.crash_countdown.set(Some((ops, torn_seed)));
    }

    /// After a crash, fail every operation (a dead process does no cleanup) until
    /// [`restart`](Self::restart).
    pub fn set_halt_on_crash(&self, halt: bool) {
        self.halt_on_crash.set(halt);
    }

    /// The process "restarted": operations work again (reopen the log).
    pub fn restart(&self) {
        self.halted.set(false);
    }

    /// Whether the disk crashed since `epoch` (see [`crashes`](Self::crashes)).
    pub fn crashes(&self) -> u64 {
        self.epoch.get()
    }

    /// How many operations reached `point` so far.
    pub fn seen(&self, point: FaultPoint) -> u64 {
        self.seen.borrow().get(&point).copied().unwrap_or(0)
    }

    /// Power loss: every file goes back to its durable bytes. With `torn_seed`, a file
    /// whose written bytes extend its durable ones keeps a pseudo-random prefix of the
    /// extension (some unsynced writes reached the platter). Files opened before fail
    /// from now on; reopen the log to continue.
    pub fn crash(&self, torn_seed: Option<u64>) {
        self.epoch.set(self.epoch.get() + 1);
        self.halted.set(self.halt_on_crash.get());
        self.faults.borrow_mut().clear();
        self.crash_countdown.set(None);
        let mut state = torn_seed.unwrap_or(0) | 1;
        for file in self.files.borrow().values() {
            let mut f = file.borrow_mut();
            let keep = match torn_seed {
                Some(_) if f.data.len() > f.durable.len() => {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let extra = (f.data.len() - f.durable.len()) as u64;
                    f.durable.len() + (state % (extra + 1)) as usize
                }
                _ => 0,
            };
            if keep > 0 {
                let kept = f.data[..keep].to_vec();
                f.durable = kept;
            }
            let durable = f.durable.clone();
            f.data = durable;
        }
    }

    /// The durable bytes of `path`, if the disk knows it (tests).
    pub fn durable(&self, path: &Path) -> Option<Vec<u8>> {
        let files = self.files.borrow();
        files.get(path).map(|f| f.borrow().durable.clone())
    }

    /// Counts an operation at `point` and fails it if a fault is armed there.
    pub fn probe(&self, point: FaultPoint) -> io::Result<()> {
        *self.seen.borrow_mut().entry(point).or_insert(0) += 1;
        if self.halted.get() {
            return Err(io::Error::other("simulated crash: the process is gone"));
        }
        if let Some((left, torn_seed)) = self.crash_countdown.get() {
            if left == 0 {
                self.crash_countdown.set(None);
                self.crash(torn_seed);
                return Err(io::Error::other("simulated power loss"));
            }
            self.crash_countdown.set(Some((left - 1, torn_seed)));
        }
        let mut faults = self.faults.borrow_mut();
        if let Some(i) = faults.iter().position(|f| f.point == point) {
            if faults[i].skip == 0 {
                let fault = faults.remove(i);
                return Err(fault.kind.error());
            }
            faults[i].skip -= 1;
        }
        let space_needed = matches!(
            point,
            FaultPoint::Append | FaultPoint::Roll | FaultPoint::IndexWrite
        );
        if space_needed && self.full.get() {
            return Err(FaultKind::NoSpace.error());
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.probe(FaultPoint::Swap)?;
        std::fs::rename(from, to)?;
        let mut files = self.files.borrow_mut();
        match files.remove(from) {
            Some(data) => files.insert(to.to_path_buf(), data),
            None => files.remove(to),
        };
        Ok(())
    }

    fn open(self: &Rc<Self>, path: &Path, create: bool) -> io::Result<SimFile> {
        let data = if create {
            self.probe(FaultPoint::Roll)?;
            std::fs::File::create(path)?;
            let data = Rc::new(RefCell::new(SimData::default()));
            self.files
                .borrow_mut()
                .insert(path.to_path_buf(), data.clone());
            data
        } else {
            // The real placeholder says whether the file exists (removal is real).
            let on_disk = std::fs::read(path)?;
            let mut files = self.files.borrow_mut();
            let data = files.entry(path.to_path_buf()).or_insert_with(|| {
                Rc::new(RefCell::new(SimData {
                    data: on_disk.clone(),
                    durable: on_disk,
                }))
            });
            data.clone()
        };
        Ok(SimFile {
            data,
            disk: self.clone(),
            epoch: self.epoch.get(),
        })
    }
}

/// A file on a [`SimDisk`].
pub struct SimFile {
    data: Rc<RefCell<SimData>>,
    disk: Rc<SimDisk>,
    epoch: u64,
}

impl SimFile {
    /// Fails once the disk crashed after this file was opened, then probes `point`.
    fn check(&self, point: Option<FaultPoint>) -> io::Result<()> {
        if self.epoch != self.disk.epoch.get() {
            return Err(io::Error::other("simulated disk crashed: file is gone"));
        }
        match point {
            Some(p) => self.disk.probe(p),
            None => Ok(()),
        }
    }

    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<usize> {
        debug_assert_eq!(pos % SIM_ALIGNMENT_BYTES, 0, "unaligned DMA write");
        debug_assert_eq!(
            buf.len() as u64 % SIM_ALIGNMENT_BYTES,
            0,
            "unaligned DMA size"
        );
        let half = buf.len() / 2 - (buf.len() / 2) % SIM_ALIGNMENT_BYTES as usize;
        let short = self.disk.full.get() && half > 0 && self.disk.short_write_due.replace(false);
        let result = if short {
            self.check(None)
        } else {
            self.check(Some(FaultPoint::Append))
        };
        let landed = match &result {
            Ok(()) if short => half,
            Ok(()) => buf.len(),
            // Power loss during this write: nothing reaches the disk any more.
            Err(_) if self.epoch != self.disk.epoch.get() => 0,
            // A failed write may have written part of its bytes: the log must not trust
            // (or keep) anything past what it accounts for.
            Err(_) => half,
        };
        let mut f = self.data.borrow_mut();
        let pos = usize::try_from(pos).map_err(|_| io::Error::other("position"))?;
        if f.data.len() < pos + landed {
            f.data.resize(pos + landed, 0);
        }
        f.data[pos..pos + landed].copy_from_slice(&buf[..landed]);
        result.map(|()| landed)
    }

    fn read_at(&self, pos: u64, size: usize) -> io::Result<Vec<u8>> {
        self.check(None)?;
        let f = self.data.borrow();
        let from = usize::try_from(pos).map_or(f.data.len(), |p| p.min(f.data.len()));
        let to = from.saturating_add(size).min(f.data.len());
        Ok(f.data[from..to].to_vec())
    }

    fn fdatasync(&self) -> io::Result<()> {
        self.check(Some(FaultPoint::Sync))?;
        let mut f = self.data.borrow_mut();
        let data = f.data.clone();
        f.durable = data;
        Ok(())
    }

    fn truncate(&self, size: u64) -> io::Result<()> {
        self.check(Some(FaultPoint::Truncate))?;
        let size = usize::try_from(size).map_err(|_| io::Error::other("size"))?;
        self.data.borrow_mut().data.resize(size, 0);
        Ok(())
    }
}
