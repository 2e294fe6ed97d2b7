//! Reads a partition's log segments straight from weir's data dir (Kafka's layout:
//! `<topic>-<partition>/<base_offset:020>.log` holding v2 record batches) to check what
//! reached the disk — e.g. which compression codecs the batches carry, which a client
//! may silently skip when it thinks the broker does not support them.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

/// Batch header: baseOffset(8) batchLength(4) partitionLeaderEpoch(4) magic(1) crc(4)
/// attributes(2) ...; batchLength counts the bytes after the length field.
const BATCH_LENGTH_AT: usize = 8;
const MAGIC_AT: usize = 16;
const ATTRIBUTES_AT: usize = 21;
const LOG_OVERHEAD: usize = 12;
/// Codec bits of the attributes: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
const CODEC_MASK: i16 = 0x07;

/// Number of batches per compression codec across all segments of all partitions of
/// `topic` under `data_dir`. Stops at the first zero or impossible length in a segment
/// (the unwritten tail of an active segment).
pub fn batches_by_codec(data_dir: &Path, topic: &str) -> Result<BTreeMap<i16, usize>> {
    let mut out = BTreeMap::new();
    let prefix = format!("{topic}-");
    for entry in
        std::fs::read_dir(data_dir).with_context(|| format!("read {}", data_dir.display()))?
    {
        let dir = entry?.path();
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let is_partition = name
            .strip_prefix(&prefix)
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !is_partition {
            continue;
        }
        for seg in std::fs::read_dir(&dir)? {
            let seg = seg?.path();
            if seg.extension().is_some_and(|e| e == "log") {
                count_codecs(&std::fs::read(&seg)?, &mut out);
            }
        }
    }
    Ok(out)
}

fn count_codecs(bytes: &[u8], out: &mut BTreeMap<i16, usize>) {
    let mut pos = 0usize;
    while let Some(header) = bytes.get(pos..pos + ATTRIBUTES_AT + 2) {
        let len = i32::from_be_bytes([
            header[BATCH_LENGTH_AT],
            header[BATCH_LENGTH_AT + 1],
            header[BATCH_LENGTH_AT + 2],
            header[BATCH_LENGTH_AT + 3],
        ]);
        let Ok(len) = usize::try_from(len) else { break };
        if len < ATTRIBUTES_AT || header[MAGIC_AT] != 2 || pos + LOG_OVERHEAD + len > bytes.len() {
            break;
        }
        let attributes = i16::from_be_bytes([header[ATTRIBUTES_AT], header[ATTRIBUTES_AT + 1]]);
        *out.entry(attributes & CODEC_MASK).or_insert(0) += 1;
        pos += LOG_OVERHEAD + len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_batches_and_stops_at_the_zero_tail() {
        let mut seg = Vec::new();
        for codec in [1i16, 4, 4] {
            let mut b = vec![0u8; 70];
            b[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&58i32.to_be_bytes());
            b[MAGIC_AT] = 2;
            b[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&(codec | 0x10).to_be_bytes());
            seg.extend(b);
        }
        seg.extend([0u8; 512]);
        let mut out = BTreeMap::new();
        count_codecs(&seg, &mut out);
        assert_eq!(out, BTreeMap::from([(1, 1), (4, 2)]));
    }
}
