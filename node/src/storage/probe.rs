//! Workaround for glommio 0.9's io_uring poll-ring probe (glommio issue #605).
//!
//! The first `DmaFile` a shard opens on a block device triggers a 1-block read to learn
//! whether that device supports polled I/O. If that file is empty, the read "succeeds"
//! without touching the device, glommio concludes polling works, and every later DMA read
//! on the device fails with EOPNOTSUPP (seen on virtio disks). The answer is cached per
//! thread and device, so each shard opens, once, a file that holds real blocks.

use std::fs;
use std::io::Write;
use std::path::Path;

use glommio::io::DmaFile;

use super::error::{Result, StorageError};

/// Name of the probe file inside the data directory.
pub const PROBE_FILE_NAME: &str = ".weir-dma-probe";
/// Bytes in the probe file: one block at the largest logical block size we expect.
const PROBE_BYTES: usize = 4096;

/// Reads of the probe before an EOPNOTSUPP is taken as the device's answer.
const PROBE_TRIES: usize = 3;

/// Whether `e` is EOPNOTSUPP (errno 95) from the kernel.
fn is_not_supported(e: &glommio::GlommioError<()>) -> bool {
    match e {
        glommio::GlommioError::IoError(io) => io.raw_os_error() == Some(libc::EOPNOTSUPP),
        _ => e.to_string().contains("os error 95"),
    }
}

/// Makes this shard's glommio reactor probe the device of `data_dir` with a real read.
/// Call it on every shard before that shard opens any log. Idempotent.
pub async fn prime_dma_probe(data_dir: &Path) -> Result<()> {
    fs::create_dir_all(data_dir).map_err(|e| StorageError::io("create dir", data_dir, e))?;
    let path = data_dir.join(PROBE_FILE_NAME);
    let needs_write = fs::metadata(&path)
        .map(|m| m.len() < PROBE_BYTES as u64)
        .unwrap_or(true);
    if needs_write {
        // Buffered std I/O on purpose: this must happen before the first DmaFile exists.
        let mut f = fs::File::create(&path).map_err(|e| StorageError::io("create", &path, e))?;
        f.write_all(&[0x5a; PROBE_BYTES])
            .and_then(|()| f.sync_all())
            .map_err(|e| StorageError::io("write", &path, e))?;
    }
    let file = DmaFile::open(&path)
        .await
        .map_err(|e| StorageError::glommio("open", &path, e))?;
    // The read proves DMA reads work on this device from this shard. Seen once in a
    // clean-clone run (scale test, at a restart): this read failed with EOPNOTSUPP on a
    // file with real blocks, and the same test passed when run again. Why is not known
    // (glommio decides per thread and device whether to poll); a read again costs
    // nothing when the first succeeds, and after a bounded few the error is the answer.
    let mut read = file.read_at_aligned(0, PROBE_BYTES).await;
    for _ in 1..PROBE_TRIES {
        match &read {
            Err(e) if is_not_supported(e) => read = file.read_at_aligned(0, PROBE_BYTES).await,
            _ => break,
        }
    }
    let _ = file.close().await;
    let read = read.map_err(|e| StorageError::glommio("read", &path, e))?;
    if read.len() != PROBE_BYTES {
        return Err(StorageError::io(
            "read",
            &path,
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "short probe read"),
        ));
    }
    Ok(())
}
