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
