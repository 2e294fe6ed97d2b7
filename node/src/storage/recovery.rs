//! Reading segment files back: a windowed DMA reader, and the recovery scan that decides,
//! batch by batch, where a segment's valid data ends and what follows it.
//!
//! Decision table for the bytes after the last valid batch of a segment (see README):
//!
//! | what follows the last valid batch      | active segment, unclean | sealed / clean |
//! |----------------------------------------|-------------------------|----------------|
//! | end of file                            | ok                      | ok             |
//! | only zero bytes                        | `Padding`: trim         | corrupt        |
//! | damage, and no valid batch after it    | `Torn`: trim, fsync, log| corrupt        |
//! | damage, then a valid batch             | corrupt: refuse to open | corrupt        |

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use wire::Offset;
use wire::batch::{BATCH_HEADER_SIZE, validate_batch};

use super::error::{Result, StorageError};
use super::file::{ReadBytes, SegmentFile};
use super::segment::{BatchMeta, check_stored_header};

/// Bytes read per window when scanning.
const WINDOW_BYTES: usize = 1 << 20;

/// A read window over a DMA file: serves byte ranges, re-reading when a range falls
/// outside the bytes it holds.
pub struct FileWindow {
    file: Rc<SegmentFile>,
    path: PathBuf,
    /// Readable size: nothing at or past it is read.
    end: u64,
    start: u64,
    buf: Option<ReadBytes>,
    window_bytes: usize,
    /// Reads go through [`SegmentFile::read_shared`], so [`get_bytes`](Self::get_bytes)
    /// slices instead of copying (fetches).
    shared: bool,
    /// Windows this reader read from the file (a seed is not counted).
    reads: u64,
}

impl FileWindow {
    pub fn new(file: Rc<SegmentFile>, path: &Path, end: u64) -> FileWindow {
        FileWindow::with_window(file, path, end, WINDOW_BYTES)
    }

    /// A window that reads at least `window_bytes` at a time.
    pub fn with_window(
        file: Rc<SegmentFile>,
        path: &Path,
        end: u64,
        window_bytes: usize,
    ) -> FileWindow {
        FileWindow {
            file,
            path: path.to_path_buf(),
            end,
            start: 0,
            buf: None,
            window_bytes,
            shared: false,
            reads: 0,
        }
    }

    /// A window whose reads can leave the shard uncopied ([`get_bytes`](Self::get_bytes)),
    /// optionally starting with bytes already read at `seed.0` (a read-ahead).
    pub fn shared(
        file: Rc<SegmentFile>,
        path: &Path,
        end: u64,
        window_bytes: usize,
        seed: Option<(u64, Bytes)>,
    ) -> FileWindow {
        let mut window = FileWindow::with_window(file, path, end, window_bytes);
        window.shared = true;
        if let Some((start, bytes)) = seed {
            // Never past the readable end: bytes beyond it may change.
            let keep = end.saturating_sub(start).min(bytes.len() as u64) as usize;
            window.start = start;
            window.buf = Some(ReadBytes::Shared(bytes.slice(..keep)));
        }
        window
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// Windows read from the file so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Bytes `[pos, pos + len)`, or fewer if the file ends first.
    pub async fn get(&mut self, pos: u64, len: usize) -> Result<&[u8]> {
        let len = len.min(self.end.saturating_sub(pos) as usize);
        if !self.holds(pos, len) {
            let size = len.max(self.window_bytes).min((self.end - pos) as usize);
            let read = if self.shared {
                self.file
                    .read_shared(pos, size)
                    .await
                    .map(ReadBytes::Shared)
            } else {
                self.file.read_at(pos, size).await
            };
            let read = read.map_err(|e| StorageError::io("read", &self.path, e))?;
            self.reads += 1;
            self.start = pos;
            self.buf = Some(read);
        }
        let Some(buf) = &self.buf else {
            return Ok(&[]);
        };
        let from = (pos - self.start) as usize;
        let to = (from + len).min(buf.len());
        Ok(&buf[from.min(to)..to])
    }

    /// [`get`](Self::get) as `Bytes`: a slice of the window's buffer when it was read
    /// shared (no copy), else a copy.
    pub async fn get_bytes(&mut self, pos: u64, len: usize) -> Result<Bytes> {
        let got = self.get(pos, len).await?.len();
        match &self.buf {
            Some(ReadBytes::Shared(b)) if got > 0 => {
                let from = (pos - self.start) as usize;
                Ok(b.slice(from..from + got))
            }
            _ => Ok(Bytes::copy_from_slice(self.get(pos, len).await?)),
        }
    }

    fn holds(&self, pos: u64, len: usize) -> bool {
        self.buf
            .as_ref()
            .is_some_and(|b| pos >= self.start && pos + len as u64 <= self.start + b.len() as u64)
    }
}

/// How a scanned segment ends.
#[derive(Debug, PartialEq, Eq)]
pub enum Tail {
    /// The last batch ends at end of file.
    Clean,
    /// Only zero bytes follow (unaligned DMA write padding): `bytes` of them.
    Padding { bytes: u64 },
    /// Damage with no valid batch after it: a torn write of `bytes` bytes.
    Torn { bytes: u64, reason: String },
}

/// The valid batches found from the scan's start position, and how the segment ends.
pub struct Scan {
    pub batches: Vec<(u64, BatchMeta)>,
    /// Position after the last valid batch.
    pub end: u64,
    pub tail: Tail,
}

/// Scans batches from `pos` to the end of the window's file, checking length, magic, CRC
/// and that offsets increase (starting at or above `next_offset`). Damage followed by a
/// valid batch is [`StorageError::Corrupt`]; anything else is described by the
/// returned [`Tail`].
pub async fn scan(window: &mut FileWindow, mut pos: u64, mut next_offset: Offset) -> Result<Scan> {
    let mut batches = Vec::new();
    let end = window.end();
    loop {
        if pos == end {
            return Ok(Scan {
                batches,
                end: pos,
                tail: Tail::Clean,
            });
        }
        match next_batch(window, pos, next_offset).await? {
            Ok(meta) => {
                batches.push((pos, meta));
                next_offset = meta.last_offset.add(1);
                pos += u64::from(meta.size);
            }
            Err(reason) => {
                let tail = classify_damage(window, pos, reason).await?;
                return Ok(Scan {
                    batches,
                    end: pos,
                    tail,
                });
            }
        }
    }
}

/// A sealed segment scanned end to end, stepping over damage: the valid batches and each
/// damaged byte range (position, length, why).
#[derive(Default)]
pub struct DamagedScan {
    pub batches: Vec<(u64, BatchMeta)>,
    pub damage: Vec<(u64, u64, String)>,
}

/// Scans a whole sealed segment, checking every batch as [`scan`] does; damage does not
/// end the scan: it resumes at the next valid batch (or the end of the file), so the
/// batches around a damaged one stay readable. Sealed segments are never appended to,
/// so damage there is not a torn write and nothing is truncated.
pub async fn scan_past_damage(window: &mut FileWindow, base: Offset) -> Result<DamagedScan> {
    let end = window.end();
    let mut out = DamagedScan::default();
    let mut pos = 0u64;
    let mut next_offset = base;
    // Bounded: every turn moves `pos` forward by at least one byte.
    while pos < end {
        match next_batch(window, pos, next_offset).await? {
            Ok(meta) => {
                out.batches.push((pos, meta));
                next_offset = meta.last_offset.add(1);
                pos += u64::from(meta.size);
            }
            Err(reason) => {
                let resume = find_valid_batch(window, pos + 1, next_offset).await?;
                let to = resume.map_or(end, |(q, _)| q);
                debug_assert!(to > pos);
                out.damage.push((pos, to - pos, reason));
                pos = to;
            }
        }
    }
    Ok(out)
}

/// Validates the batch at `pos`. The outer error is I/O; the inner is why the bytes are
/// not a valid next batch.
async fn next_batch(
    window: &mut FileWindow,
    pos: u64,
    next_offset: Offset,
) -> Result<Result<BatchMeta, String>> {
    let room = window.end() - pos;
    let head = window.get(pos, BATCH_HEADER_SIZE).await?;
    let total = match check_stored_header(head, room) {
        Ok((_, total)) => total,
        Err(reason) => return Ok(Err(reason.to_owned())),
    };
    let bytes = window.get(pos, total).await?;
    let view = match validate_batch(bytes) {
        Ok(view) => view,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let meta = BatchMeta::of(view.header);
    if meta.base_offset < next_offset {
        return Ok(Err(format!(
            "batch base offset {} below the expected {}",
            meta.base_offset, next_offset
        )));
    }
    Ok(Ok(meta))
}

/// Decides what the damaged bytes at `pos` are: zero padding, a torn tail, or corruption
/// (a valid batch somewhere after them).
async fn classify_damage(window: &mut FileWindow, pos: u64, reason: String) -> Result<Tail> {
    let end = window.end();
    let mut all_zero = true;
    let mut at = pos;
    while at < end {
        let chunk = window.get(at, WINDOW_BYTES).await?;
        all_zero &= chunk.iter().all(|&b| b == 0);
        at += chunk.len() as u64;
        if chunk.is_empty() {
            break;
        }
    }
    if all_zero {
        return Ok(Tail::Padding { bytes: end - pos });
    }
    if let Some((found, _)) = find_valid_batch(window, pos + 1, Offset(0)).await? {
        return Err(StorageError::Corrupt {
            path: window.path.clone(),
            position: pos,
            reason: format!(
                "{reason}; a valid batch follows at byte {found}, so this is not a torn write"
            ),
        });
    }
    Ok(Tail::Torn {
        bytes: end - pos,
        reason,
    })
}

/// The first position at or after `from` where a whole, CRC-valid batch with a base offset
/// at or above `min_base` starts, and that batch. Bounded by the file's end; used only
/// where damage was found, never on the healthy path.
pub async fn find_valid_batch(
    window: &mut FileWindow,
    from: u64,
    min_base: Offset,
) -> Result<Option<(u64, BatchMeta)>> {
    let end = window.end();
    let mut q = from;
    while q + BATCH_HEADER_SIZE as u64 <= end {
        // Cheap filters first: magic byte and a length that fits.
        let head = window.get(q, BATCH_HEADER_SIZE).await?;
        let plausible = check_stored_header(head, end - q)
            .ok()
            .filter(|(h, _)| h.base_offset() >= min_base)
            .map(|(_, total)| total);
        if let Some(total) = plausible {
            let bytes = window.get(q, total).await?;
            if let Ok(view) = validate_batch(bytes) {
                return Ok(Some((q, BatchMeta::of(view.header))));
            }
        }
        q += 1;
    }
    Ok(None)
}
