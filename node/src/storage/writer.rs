//! [`SegmentWriter`]: appends bytes to a segment file through aligned DMA buffers
//! (O_DIRECT), handling the partial last block.
//!
//! O_DIRECT writes must start and end on the device's block boundary. The writer keeps
//! the bytes of the file's last, partial block in memory (`tail`); each write starts at
//! that block, carries the tail, then the new bytes, zero-padded to the next boundary.
//! So after a write the file may end with zeros past the last batch: [`finish`] trims it
//! to the exact end, and recovery treats zeros after the last batch as the end of the
//! log, not as damage. Writes of one segment are issued one at a time, in order, so a
//! crash never leaves a hole before written data.
//!
//! [`finish`]: SegmentWriter::finish

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use super::error::{Result, StorageError};
use super::file::{Disk, IoBuf, SegmentFile, SharedBuf};

/// Largest single DMA write: bounds the buffer one write allocates.
pub const WRITE_BYTES_MAX: usize = 4 << 20;
/// Short writes continued before giving up (each continuation either completes, fails
/// with the real cause such as ENOSPC, or is short again).
const SHORT_WRITES_MAX: usize = 8;

/// Writes to one segment file. Only the log's I/O leader (the holder of its I/O lock)
/// uses it, so writes are never concurrent.
pub struct SegmentWriter {
    file: Rc<SegmentFile>,
    path: PathBuf,
    /// Block-aligned file position where `tail` starts.
    block_pos: u64,
    /// Bytes of the partial last block (shorter than `align`).
    tail: Vec<u8>,
    /// The next `tail`, filled before a write and swapped in only once it succeeded (a
    /// failed write leaves the writer where it was).
    next_tail: Vec<u8>,
    align: u64,
    /// Blocks are reserved up to here (fallocate, file size unchanged).
    prealloc_to: u64,
    /// Reserve blocks ahead of the writes, never past this (the segment size); `None`
    /// disables (`log.preallocate=false`).
    prealloc_limit: Option<u64>,
}

/// Opens an existing `.log` file for reading and writing with O_DIRECT.
pub async fn open_log_file(disk: &Disk, path: &Path) -> Result<Rc<SegmentFile>> {
    let file = disk
        .open_log(path, false)
        .await
        .map_err(|e| StorageError::io("open", path, e))?;
    Ok(Rc::new(file))
}

/// Creates a new, empty `.log` file (a stale file of that name is emptied).
pub async fn create_log_file(disk: &Disk, path: &Path) -> Result<Rc<SegmentFile>> {
    let file = disk
        .open_log(path, true)
        .await
        .map_err(|e| StorageError::io("create", path, e))?;
    Ok(Rc::new(file))
}

/// Preallocation starts once a segment holds this much (small partitions cost nothing).
const PREALLOC_FROM_BYTES: u64 = 1 << 20;
/// Preallocation runs at most this far ahead of the end of the data.
const PREALLOC_AHEAD_MAX: u64 = 64 << 20;

impl SegmentWriter {
    /// A writer that continues the file at `size` (reads back the partial last block).
    pub async fn resume(file: Rc<SegmentFile>, path: &Path, size: u64) -> Result<SegmentWriter> {
        let align = file.alignment();
        let block_pos = size - size % align;
        let tail_len = (size - block_pos) as usize;
        let mut tail = Vec::with_capacity(align as usize);
        if tail_len > 0 {
            let read = file
                .read_at_aligned(block_pos, align as usize)
                .await
                .map_err(|e| StorageError::io("read", path, e))?;
            if read.len() < tail_len {
                return Err(StorageError::Corrupt {
                    path: path.to_path_buf(),
                    position: block_pos,
                    reason: "file shorter than its recovered size".into(),
                });
            }
            tail.extend_from_slice(&read[..tail_len]);
        }
        Ok(SegmentWriter {
            file,
            path: path.to_path_buf(),
            block_pos,
            tail,
            next_tail: Vec::with_capacity(align as usize),
            align,
            prealloc_to: 0,
            prealloc_limit: None,
        })
    }

    /// Reserves blocks ahead of the writes, up to `limit` bytes, so that O_DIRECT writes
    /// do not wait for block allocation (ext4 makes allocating direct writes synchronous).
    /// The reservation grows with the segment (as much as it already holds, at most
    /// 64 MiB ahead), so idle partitions reserve nothing.
    pub fn set_preallocation(&mut self, limit: Option<u64>) {
        self.prealloc_limit = limit;
    }

    async fn maybe_preallocate(&mut self) {
        let Some(limit) = self.prealloc_limit else {
            return;
        };
        let end = self.end();
        let ahead = end.min(PREALLOC_AHEAD_MAX);
        if end < PREALLOC_FROM_BYTES || end + ahead / 2 <= self.prealloc_to {
            return;
        }
        let target = (end + ahead).min(limit);
        if target <= self.prealloc_to {
            return;
        }
        match self.file.pre_allocate(target, true).await {
            Ok(()) => self.prealloc_to = target,
            Err(e) => {
                // Best effort: without it writes still work, just slower.
                tracing::debug!(segment = %self.path.display(), error = %e, "preallocation failed");
                self.prealloc_limit = None;
            }
        }
    }

    /// The logical end of the file: where the next byte goes.
    pub fn end(&self) -> u64 {
        self.block_pos + self.tail.len() as u64
    }

    pub fn file(&self) -> &Rc<SegmentFile> {
        &self.file
    }

    /// Writes `chunks` after the current end. Returns the number of DMA writes issued.
    pub async fn write(&mut self, chunks: &[Bytes]) -> Result<u64> {
        let mut source = chunks.iter().map(|c| &c[..]).filter(|c| !c.is_empty());
        let mut current: &[u8] = source.next().unwrap_or(&[]);
        let mut writes = 0;
        while !current.is_empty() {
            let remaining = current.len() + chunks_len_after(&source);
            let want = (self.tail.len() + remaining).min(WRITE_BYTES_MAX);
            let padded = align_up(want as u64, self.align) as usize;
            let mut buf = self.file.alloc_buffer(padded);
            let dst = buf.as_bytes_mut();
            let mut filled = self.tail.len();
            dst[..filled].copy_from_slice(&self.tail);
            while filled < want {
                if current.is_empty() {
                    current = source.next().unwrap_or(&[]);
                }
                let n = current.len().min(want - filled);
                dst[filled..filled + n].copy_from_slice(&current[..n]);
                filled += n;
                current = &current[n..];
            }
            dst[filled..].fill(0);
            self.write_block_run(buf, filled).await?;
            self.maybe_preallocate().await;
            writes += 1;
            if current.is_empty() {
                current = source.next().unwrap_or(&[]);
            }
        }
        Ok(writes)
    }

    /// Writes one aligned buffer at `block_pos` and advances past its full blocks,
    /// keeping the bytes of the last partial block as the new tail.
    async fn write_block_run(&mut self, buf: IoBuf, filled: usize) -> Result<()> {
        let len = buf.as_bytes().len();
        let full = filled - filled % self.align as usize;
        self.next_tail.clear();
        self.next_tail
            .extend_from_slice(&buf.as_bytes()[full..filled]);
        self.write_all_at(buf.share(), len).await?;
        std::mem::swap(&mut self.tail, &mut self.next_tail);
        self.block_pos += full as u64;
        debug_assert!(self.tail.len() < self.align as usize);
        Ok(())
    }

    /// Writes all `len` bytes of `buf` at `block_pos`. A short write (a filesystem that
    /// fills up midway writes what it could) is continued with the rest, so that the
    /// error that stops it — ENOSPC — is the one the log sees and recovers from.
    async fn write_all_at(&self, mut buf: SharedBuf, len: usize) -> Result<()> {
        let mut pos = self.block_pos;
        for _ in 0..SHORT_WRITES_MAX {
            let written = self
                .file
                .write_at(&buf, pos)
                .await
                .map_err(|e| StorageError::io("write", &self.path, e))?;
            let want = buf.as_bytes().len();
            if written >= want {
                return Ok(());
            }
            if written == 0 || !(written as u64).is_multiple_of(self.align) {
                break;
            }
            let rest = &buf.as_bytes()[written..];
            let mut next = self.file.alloc_buffer(rest.len());
            next.as_bytes_mut().copy_from_slice(rest);
            buf = next.share();
            pos += written as u64;
        }
        Err(StorageError::io(
            "write",
            &self.path,
            std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short DMA write of {len} bytes at {}", self.block_pos),
            ),
        ))
    }

    /// fdatasync: everything written so far is durable.
    pub async fn sync(&self) -> Result<()> {
        self.file
            .fdatasync()
            .await
            .map_err(|e| StorageError::io("fdatasync", &self.path, e))
    }

    /// Trims the zero padding so the file ends exactly at the last batch, then syncs.
    pub async fn finish(&self) -> Result<()> {
        self.file
            .truncate(self.end())
            .await
            .map_err(|e| StorageError::io("truncate", &self.path, e))?;
        self.sync().await
    }
}

fn chunks_len_after<'a>(rest: &(impl Iterator<Item = &'a [u8]> + Clone)) -> usize {
    rest.clone().map(<[u8]>::len).sum()
}

pub fn align_up(v: u64, align: u64) -> u64 {
    v.div_ceil(align) * align
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::testing::run_on_shard;

    #[test]
    fn partial_blocks_are_carried_padded_with_zeros_and_trimmed_on_finish() {
        let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
        let path = dir.path().join("00000000000000000000.log");
        let (on_disk, padded_len, end) = run_on_shard({
            let (root, path) = (dir.path().to_path_buf(), path.clone());
            move || async move {
                crate::storage::prime_dma_probe(&root).await.unwrap();
                let file = create_log_file(&Disk::Real, &path).await.unwrap();
                let mut w = SegmentWriter::resume(file.clone(), &path, 0).await.unwrap();
                // 3 unaligned chunks, then one more write that must keep the first bytes.
                let a = Bytes::from(vec![1u8; 1000]);
                let b = Bytes::from(vec![2u8; 5000]);
                assert_eq!(w.write(&[a, b]).await.unwrap(), 1);
                w.write(&[Bytes::from(vec![3u8; 100])]).await.unwrap();
                let padded = file.file_size().await.unwrap();
                let end = w.end();
                w.finish().await.unwrap();
                (std::fs::read(&path).unwrap(), padded, end)
            }
        });
        assert_eq!(end, 6100);
        assert_eq!(padded_len % 512, 0, "O_DIRECT writes whole blocks");
        assert!(padded_len >= 6100);
        assert_eq!(on_disk.len(), 6100, "finish trims the padding");
        assert!(on_disk[..1000].iter().all(|&x| x == 1));
        assert!(on_disk[1000..6000].iter().all(|&x| x == 2));
        assert!(on_disk[6000..].iter().all(|&x| x == 3));
    }

    #[test]
    fn resume_continues_an_unaligned_file() {
        let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
        let path = dir.path().join("00000000000000000005.log");
        std::fs::write(&path, vec![7u8; 4097]).unwrap();
        let on_disk = run_on_shard({
            let (root, path) = (dir.path().to_path_buf(), path.clone());
            move || async move {
                crate::storage::prime_dma_probe(&root).await.unwrap();
                let file = open_log_file(&Disk::Real, &path).await.unwrap();
                let mut w = SegmentWriter::resume(file, &path, 4097).await.unwrap();
                w.write(&[Bytes::from(vec![8u8; 10])]).await.unwrap();
                w.finish().await.unwrap();
                std::fs::read(&path).unwrap()
            }
        });
        assert_eq!(on_disk.len(), 4107);
        assert!(on_disk[..4097].iter().all(|&x| x == 7));
        assert!(on_disk[4097..].iter().all(|&x| x == 8));
    }

    #[test]
    fn preallocation_reserves_blocks_ahead_without_changing_the_size() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
        let path = dir.path().join("00000000000000000000.log");
        let reserved = run_on_shard({
            let (root, path) = (dir.path().to_path_buf(), path.clone());
            move || async move {
                crate::storage::prime_dma_probe(&root).await.unwrap();
                let file = create_log_file(&Disk::Real, &path).await.unwrap();
                let mut w = SegmentWriter::resume(file, &path, 0).await.unwrap();
                w.set_preallocation(Some(64 << 20));
                w.write(&[Bytes::from(vec![9u8; 3 << 20])]).await.unwrap();
                let meta = std::fs::metadata(&path).unwrap();
                w.finish().await.unwrap();
                (meta.len(), meta.blocks() * 512)
            }
        });
        assert_eq!(
            reserved.0,
            3 << 20,
            "the file size is the data, not the reservation"
        );
        assert!(reserved.1 >= 6 << 20, "blocks reserved ahead: {reserved:?}");
        // finish trims the reservation with the padding.
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 3 << 20);
        assert!(meta.blocks() * 512 >= 3 << 20);
        assert!(
            meta.blocks() * 512 < (3 << 20) + (1 << 20),
            "reservation freed by finish"
        );
    }
}
