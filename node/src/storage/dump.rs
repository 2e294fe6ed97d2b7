//! `weir log dump`: prints segment files for operators, like Kafka's DumpLogSegments —
//! every batch of a `.log` (offsets, position, timestamps, producer id/epoch/sequence,
//! flags, CRC validity) and every entry of a `.index` / `.timeindex`.
//!
//! Offline and read-only, so it uses plain buffered std I/O, not glommio.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use wire::batch::{BATCH_HEADER_SIZE, TimestampType, validate_batch};

use super::error::{Result, StorageError};
use super::index::{decode_offsets, decode_times};
use super::segment::check_stored_header;

/// What a dump found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DumpSummary {
    pub files: u64,
    pub batches: u64,
    /// Batches with a bad CRC, and files whose bytes stop being batches before the end.
    pub problems: u64,
}

/// Dumps each path: a `.log`, `.index` or `.timeindex` file, or a partition directory
/// (all of its segment files, in order).
pub fn dump_paths(paths: &[PathBuf], out: &mut dyn Write) -> Result<DumpSummary> {
    let mut summary = DumpSummary::default();
    for path in paths {
        if path.is_dir() {
            for file in segment_files(path)? {
                dump_file(&file, out, &mut summary)?;
            }
        } else {
            dump_file(path, out, &mut summary)?;
        }
    }
    Ok(summary)
}

fn segment_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = fs::read_dir(dir).map_err(|e| StorageError::io("read dir", dir, e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("log" | "index" | "timeindex")
            )
        })
        .collect();
    files.sort();
    Ok(files)
}

fn dump_file(path: &Path, out: &mut dyn Write, summary: &mut DumpSummary) -> Result<()> {
    summary.files += 1;
    let w = |e| StorageError::io("write", "stdout", e);
    writeln!(out, "Dumping {}", path.display()).map_err(w)?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("log") => dump_log(path, out, summary),
        Some("index") => dump_index(path, out, summary),
        Some("timeindex") => dump_time_index(path, out, summary),
        _ => {
            writeln!(out, "  not a segment file (.log, .index, .timeindex)").map_err(w)?;
            summary.problems += 1;
            Ok(())
        }
    }
}

fn dump_log(path: &Path, out: &mut dyn Write, summary: &mut DumpSummary) -> Result<()> {
    let io = |e| StorageError::io("read", path, e);
    let mut file = File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let mut pos = 0u64;
    let mut head = [0u8; BATCH_HEADER_SIZE];
    while pos < size {
        file.seek(SeekFrom::Start(pos)).map_err(io)?;
        let have = read_up_to(&mut file, &mut head).map_err(io)?;
        let total = match check_stored_header(&head[..have], size - pos) {
            Ok((_, total)) => total,
            Err(reason) => {
                return stop(out, summary, pos, size, reason);
            }
        };
        // `total` fits in the file (checked above), so this allocation is bounded by it.
        let mut batch = vec![0u8; total];
        file.seek(SeekFrom::Start(pos)).map_err(io)?;
        file.read_exact(&mut batch).map_err(io)?;
        print_batch(out, &batch, pos, summary)?;
        pos += total as u64;
    }
    Ok(())
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn stop(
    out: &mut dyn Write,
    summary: &mut DumpSummary,
    pos: u64,
    size: u64,
    reason: &str,
) -> Result<()> {
    summary.problems += 1;
    writeln!(
        out,
        "  position: {pos} not a valid batch ({reason}); {} bytes to end of file",
        size - pos
    )
    .map_err(|e| StorageError::io("write", "stdout", e))
}

fn print_batch(
    out: &mut dyn Write,
    batch: &[u8],
    pos: u64,
    summary: &mut DumpSummary,
) -> Result<()> {
    summary.batches += 1;
    let crc_valid = validate_batch(batch).is_ok();
    if !crc_valid {
        summary.problems += 1;
    }
    let Ok(h) = wire::batch::read_header(batch) else {
        return Ok(());
    };
    let attrs = h.attributes();
    let ts_kind = match attrs.timestamp_type() {
        TimestampType::CreateTime => "CreateTime",
        TimestampType::LogAppendTime => "LogAppendTime",
    };
    let codec = match attrs.compression() {
        Some(c) => format!("{c:?}").to_lowercase(),
        None => "unknown".into(),
    };
    writeln!(
        out,
        "baseOffset: {} lastOffset: {} count: {} baseSequence: {} lastSequence: {} \
         producerId: {} producerEpoch: {} partitionLeaderEpoch: {} isTransactional: {} \
         isControl: {} position: {pos} {ts_kind}: {} baseTimestamp: {} size: {} magic: {} \
         compresscodec: {codec} crcValid: {crc_valid}",
        h.base_offset(),
        h.last_offset(),
        h.records_count(),
        h.base_sequence(),
        h.last_sequence(),
        h.producer_id(),
        h.producer_epoch(),
        h.partition_leader_epoch(),
        attrs.is_transactional(),
        attrs.is_control(),
        h.max_timestamp(),
        h.base_timestamp(),
        batch.len(),
        h.magic,
    )
    .map_err(|e| StorageError::io("write", "stdout", e))
}

/// The segment's base offset, from its `%020d` file name.
fn base_of(path: &Path) -> i64 {
    path.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn dump_index(path: &Path, out: &mut dyn Write, summary: &mut DumpSummary) -> Result<()> {
    let bytes = fs::read(path).map_err(|e| StorageError::io("read", path, e))?;
    let log_size = fs::metadata(path.with_extension("log")).map_or(u64::MAX, |m| m.len());
    let base = base_of(path);
    let w = |e| StorageError::io("write", "stdout", e);
    match decode_offsets(&bytes, log_size.max(1), i32::MAX as u64) {
        Ok(entries) => {
            for (rel, pos) in entries {
                writeln!(out, "offset: {} position: {pos}", base + i64::from(rel)).map_err(w)?;
            }
        }
        Err(e) => {
            summary.problems += 1;
            writeln!(out, "  invalid index: {}", e.0).map_err(w)?;
        }
    }
    Ok(())
}

fn dump_time_index(path: &Path, out: &mut dyn Write, summary: &mut DumpSummary) -> Result<()> {
    let bytes = fs::read(path).map_err(|e| StorageError::io("read", path, e))?;
    let base = base_of(path);
    let w = |e| StorageError::io("write", "stdout", e);
    match decode_times(&bytes, i32::MAX as u64) {
        Ok(entries) => {
            for (ts, rel) in entries {
                writeln!(out, "timestamp: {ts} offset: {}", base + i64::from(rel)).map_err(w)?;
            }
        }
        Err(e) => {
            summary.problems += 1;
            writeln!(out, "  invalid time index: {}", e.0).map_err(w)?;
        }
    }
    Ok(())
}

/// What `weir log verify` found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifySummary {
    pub files: u64,
    pub batches: u64,
    /// Damaged byte ranges (each listed with its file and position).
    pub damaged: u64,
}

/// Bytes read from a `.log` file at a time by `verify`.
const VERIFY_WINDOW_BYTES: usize = 1 << 20;
/// How deep `verify` descends below a path looking for `.log` files: a data dir holds
/// partition directories, which hold the segments.
const VERIFY_DEPTH_MAX: usize = 2;

/// `weir log verify`: checks every batch of every `.log` file under `paths` (files,
/// partition directories or a data directory): framing, magic, CRC-32C and offsets that
/// grow. Lists each damaged range with file, byte position, the offsets it hides and the
/// next valid batch (the offset to DeleteRecords up to, to get past it).
pub fn verify_paths(paths: &[PathBuf], out: &mut dyn Write) -> Result<VerifySummary> {
    let mut summary = VerifySummary::default();
    let mut files = Vec::new();
    for path in paths {
        collect_logs(path, VERIFY_DEPTH_MAX, &mut files)?;
    }
    for file in &files {
        verify_log(file, out, &mut summary)?;
    }
    writeln!(
        out,
        "verified {} file(s), {} batch(es): {} damaged range(s)",
        summary.files, summary.batches, summary.damaged
    )
    .map_err(|e| StorageError::io("write", "stdout", e))?;
    Ok(summary)
}

fn collect_logs(path: &Path, depth: usize, files: &mut Vec<PathBuf>) -> Result<()> {
    if !path.is_dir() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let entries = fs::read_dir(path).map_err(|e| StorageError::io("read dir", path, e))?;
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    for child in children {
        if child.is_dir() && depth > 0 {
            collect_logs(&child, depth - 1, files)?;
        } else if child.extension().and_then(|e| e.to_str()) == Some("log") {
            files.push(child);
        }
    }
    Ok(())
}

/// A read window over a file with plain std I/O (verify is offline).
struct StdWindow {
    file: File,
    size: u64,
    start: u64,
    buf: Vec<u8>,
}

impl StdWindow {
    /// Bytes `[pos, pos + len)`, or fewer if the file ends first.
    fn get(&mut self, pos: u64, len: usize) -> std::io::Result<&[u8]> {
        let len = len.min(self.size.saturating_sub(pos) as usize);
        let held = pos >= self.start && pos + len as u64 <= self.start + self.buf.len() as u64;
        if !held {
            // `len` fits in the file, so the buffer is bounded by the file size.
            let want = len.max(VERIFY_WINDOW_BYTES).min((self.size - pos) as usize);
            self.buf.resize(want, 0);
            self.file.seek(SeekFrom::Start(pos))?;
            let n = read_up_to(&mut self.file, &mut self.buf)?;
            self.buf.truncate(n);
            self.start = pos;
        }
        let from = (pos - self.start) as usize;
        let to = (from + len).min(self.buf.len());
        Ok(&self.buf[from.min(to)..to])
    }

    /// The batch at `pos` if it is whole, CRC-valid and based at or above `min_base`;
    /// else why not.
    fn batch_at(&mut self, pos: u64, min_base: i64) -> std::io::Result<Result<BatchInfo, String>> {
        let room = self.size - pos;
        let head = self.get(pos, BATCH_HEADER_SIZE)?;
        let total = match check_stored_header(head, room) {
            Ok((h, _)) if h.base_offset().get() < min_base => {
                return Ok(Err(format!(
                    "batch base offset {} below the expected {min_base}",
                    h.base_offset()
                )));
            }
            Ok((_, total)) => total,
            Err(reason) => return Ok(Err(reason.to_owned())),
        };
        let bytes = self.get(pos, total)?;
        Ok(match validate_batch(bytes) {
            Ok(view) => Ok(BatchInfo {
                base: view.header.base_offset().get(),
                last: view.header.last_offset().get(),
                size: total as u64,
            }),
            Err(e) => Err(e.to_string()),
        })
    }
}

#[derive(Clone, Copy)]
struct BatchInfo {
    base: i64,
    last: i64,
    size: u64,
}

fn verify_log(path: &Path, out: &mut dyn Write, summary: &mut VerifySummary) -> Result<()> {
    let io = |e| StorageError::io("read", path, e);
    let w = |e| StorageError::io("write", "stdout", e);
    summary.files += 1;
    let file = File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let mut window = StdWindow {
        file,
        size,
        start: 0,
        buf: Vec::new(),
    };
    let mut pos = 0u64;
    let mut next_min = base_of(path);
    while pos < size {
        match window.batch_at(pos, next_min).map_err(io)? {
            Ok(b) => {
                summary.batches += 1;
                next_min = b.last + 1;
                pos += b.size;
            }
            Err(_) if zeros_to_end(&mut window, pos).map_err(io)? => {
                // The active segment of a running node ends in its zero-padded last
                // block (O_DIRECT writes whole blocks): the end of the log, not damage.
                writeln!(
                    out,
                    "{}: {} zero bytes after the last batch (padding)",
                    path.display(),
                    size - pos
                )
                .map_err(w)?;
                return Ok(());
            }
            Err(reason) => {
                summary.damaged += 1;
                let Some((at, b)) = next_valid(&mut window, pos + 1, next_min).map_err(io)? else {
                    writeln!(
                        out,
                        "damaged: {} at byte {pos}: {reason}; no valid batch after it \
                         ({} bytes to end of file, offsets from {next_min} unreadable)",
                        path.display(),
                        size - pos
                    )
                    .map_err(w)?;
                    return Ok(());
                };
                writeln!(
                    out,
                    "damaged: {} at byte {pos}: {reason}; {} bytes up to the next valid \
                     batch at byte {at} (offset {}); offsets {next_min}..{} unreadable; \
                     DeleteRecords to offset {} gets past it",
                    path.display(),
                    at - pos,
                    b.base,
                    b.base - 1,
                    b.base
                )
                .map_err(w)?;
                pos = at;
            }
        }
    }
    Ok(())
}

/// The first valid batch at or after `from` (a byte-by-byte search: damage only).
fn next_valid(
    window: &mut StdWindow,
    from: u64,
    min_base: i64,
) -> std::io::Result<Option<(u64, BatchInfo)>> {
    let mut q = from;
    while q + BATCH_HEADER_SIZE as u64 <= window.size {
        if let Ok(b) = window.batch_at(q, min_base)? {
            return Ok(Some((q, b)));
        }
        q += 1;
    }
    Ok(None)
}

/// True if every byte from `from` to the end of the file is zero.
fn zeros_to_end(window: &mut StdWindow, from: u64) -> std::io::Result<bool> {
    let mut at = from;
    while at < window.size {
        let chunk = window.get(at, VERIFY_WINDOW_BYTES)?;
        if chunk.is_empty() {
            break;
        }
        if chunk.iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += chunk.len() as u64;
    }
    Ok(true)
}
