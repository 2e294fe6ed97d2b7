//! Compression codecs of record batches, with Kafka's exact framing for each, and an output
//! size bound on decompression (a small compressed batch must not become gigabytes).
//!
//! - gzip: a gzip member (RFC 1952), as Java's `GZIPOutputStream` and librdkafka write it;
//!   read as Java's `GZIPInputStream` does, so concatenated members are one stream.
//! - snappy: two framings exist in the wild. Java clients and kafka-python write xerial
//!   "snappy-java" framing: a 16-byte header (`\x82SNAPPY\0`, version, compatible version,
//!   both big-endian i32) followed by blocks of `[length: i32 BE][raw snappy block]`.
//!   librdkafka writes one raw snappy block. Kafka's Java reader accepts both (xerial's
//!   stream falls back to raw when the magic is absent), so weir's does too.
//! - lz4: the LZ4 frame format (magic `0x184D2204`), as Kafka ≥ 0.10 writes for magic ≥ 1.
//!   The decoder holds two buffers of the frame's declared block size (at most 4 MiB each)
//!   besides the bounded output.
//! - zstd: a zstd frame; librdkafka may omit the content size, so decoding is streamed.
//!
//! The broker decompresses to check every produced record, and compresses when a topic's
//! `compression.type` names another codec than the producer's (see
//! [`crate::batch::recompress`]); compaction, the load generator and tests use both.

use std::io::{Read, Write};

use bytes::Bytes;

use crate::WireError;
use crate::batch::Compression;

/// The xerial snappy-java stream header magic.
pub const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
/// The xerial header size: magic, version, compatible version.
const XERIAL_HEADER_BYTES: usize = 16;
/// Uncompressed bytes per xerial block, as snappy-java's default.
const XERIAL_BLOCK_BYTES: usize = 32 * 1024;
/// Largest zstd window (log2 bytes) weir agrees to allocate when decompressing.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 24;

fn codec_name(codec: Compression) -> &'static str {
    match codec {
        Compression::None => "none",
        Compression::Gzip => "gzip",
        Compression::Snappy => "snappy",
        Compression::Lz4 => "lz4",
        Compression::Zstd => "zstd",
    }
}

fn fail(codec: Compression, reason: impl ToString) -> WireError {
    WireError::Decompression {
        codec: codec_name(codec),
        reason: reason.to_string(),
    }
}

/// Reads all of `reader` into a Vec, refusing more than `max_bytes` of output.
fn read_bounded(
    codec: Compression,
    reader: impl Read,
    max_bytes: usize,
) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    let limit = max_bytes as u64 + 1;
    reader
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| fail(codec, e))?;
    if out.len() > max_bytes {
        return Err(too_large(codec, max_bytes));
    }
    Ok(out)
}

fn too_large(codec: Compression, max_bytes: usize) -> WireError {
    fail(
        codec,
        format!("output exceeds the bound of {max_bytes} bytes"),
    )
}

/// Decompresses the records section of a batch. The output never exceeds `max_bytes`
/// (an error says so instead), whatever the input claims.
pub fn decompress(codec: Compression, input: &[u8], max_bytes: usize) -> Result<Bytes, WireError> {
    decompress_to_vec(codec, input, max_bytes).map(Bytes::from)
}

/// [`decompress`] into a `Vec`.
pub fn decompress_to_vec(
    codec: Compression,
    input: &[u8],
    max_bytes: usize,
) -> Result<Vec<u8>, WireError> {
    let out = match codec {
        Compression::None => {
            if input.len() > max_bytes {
                return Err(too_large(codec, max_bytes));
            }
            return Ok(input.to_vec());
        }
        // Every member, as Java's GZIPInputStream (Kafka's reader) reads concatenated
        // members as one stream; GzDecoder would stop after the first.
        Compression::Gzip => {
            read_bounded(codec, flate2::read::MultiGzDecoder::new(input), max_bytes)?
        }
        Compression::Snappy => snappy_decompress(input, max_bytes)?,
        Compression::Lz4 => {
            read_bounded(codec, lz4_flex::frame::FrameDecoder::new(input), max_bytes)?
        }
        Compression::Zstd => {
            let mut decoder =
                zstd::stream::read::Decoder::new(input).map_err(|e| fail(codec, e))?;
            // A frame may declare a window up to 2 GiB; the decoder would allocate it before
            // producing a byte. 16 MiB covers every level Kafka clients use by default.
            decoder
                .window_log_max(ZSTD_WINDOW_LOG_MAX)
                .map_err(|e| fail(codec, e))?;
            read_bounded(codec, decoder, max_bytes)?
        }
    };
    Ok(out)
}

fn snappy_decompress(input: &[u8], max_bytes: usize) -> Result<Vec<u8>, WireError> {
    if input.starts_with(&XERIAL_MAGIC) {
        xerial_decompress(input, max_bytes)
    } else {
        let mut out = Vec::new();
        snappy_block(input, max_bytes, &mut out)?;
        Ok(out)
    }
}

/// Appends one raw snappy block to `out`, checking its claimed length against the bound
/// before allocating.
fn snappy_block(block: &[u8], max_bytes: usize, out: &mut Vec<u8>) -> Result<(), WireError> {
    let codec = Compression::Snappy;
    let len = snap::raw::decompress_len(block).map_err(|e| fail(codec, e))?;
    if out.len() + len > max_bytes {
        return Err(too_large(codec, max_bytes));
    }
    let start = out.len();
    out.resize(start + len, 0);
    let written = snap::raw::Decoder::new()
        .decompress(block, &mut out[start..])
        .map_err(|e| fail(codec, e))?;
    out.truncate(start + written);
    Ok(())
}

fn xerial_decompress(input: &[u8], max_bytes: usize) -> Result<Vec<u8>, WireError> {
    let codec = Compression::Snappy;
    if input.len() < XERIAL_HEADER_BYTES {
        return Err(fail(codec, "truncated xerial header"));
    }
    let mut rest = &input[XERIAL_HEADER_BYTES..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let Some(len) = rest.first_chunk::<4>() else {
            return Err(fail(codec, "truncated xerial block length"));
        };
        let len = i32::from_be_bytes(*len);
        let len = usize::try_from(len).map_err(|_| fail(codec, "negative xerial block length"))?;
        rest = &rest[4..];
        if len > rest.len() {
            return Err(fail(codec, "xerial block longer than the input"));
        }
        snappy_block(&rest[..len], max_bytes, &mut out)?;
        rest = &rest[len..];
    }
    Ok(out)
}

/// How a snappy batch is framed when weir writes one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SnappyFraming {
    /// snappy-java's stream framing, as Java clients and kafka-python write.
    #[default]
    Xerial,
    /// One raw block, as librdkafka writes.
    Raw,
}

/// Compresses a records section (for the batch builder).
pub fn compress(
    codec: Compression,
    input: &[u8],
    snappy_framing: SnappyFraming,
) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    compress_into(
        codec,
        input,
        snappy_framing,
        Levels::default(),
        &mut out,
        usize::MAX,
    )?;
    Ok(out)
}

/// A writer onto the end of a Vec that refuses to take it past `limit` bytes: an encoder
/// writing into it stops at the first output past the bound instead of building all of it.
struct Bounded<'a> {
    out: &'a mut Vec<u8>,
    limit: usize,
}

/// The error a [`Bounded`] writer gives. A bare kind, with no error inside: lz4_flex
/// 0.11 panics on an I/O error that carries one of another type.
const OVER_LIMIT: std::io::ErrorKind = std::io::ErrorKind::FileTooLarge;

impl std::io::Write for Bounded<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len().saturating_add(buf.len()) > self.limit {
            return Err(std::io::Error::from(OVER_LIMIT));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The error for output past `limit` bytes (`out` counts what the buffer held before).
fn over_limit(out: &[u8], limit: usize) -> WireError {
    WireError::TooLarge {
        field: "compressed records",
        offset: 0,
        size: out.len() as u64,
        max: limit as u64,
    }
}

/// The levels weir compresses with, for the codecs that have them (KIP-390's
/// `compression.gzip.level` and `compression.zstd.level`). snappy has none, and lz4_flex
/// writes lz4's one fast level (Kafka's `compression.lz4.level` picks among lz4-java's
/// high-compression levels, which lz4_flex does not have).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    /// 1 (fastest) to 9 (smallest).
    pub gzip: u32,
    /// zstd's levels: negative (faster) to 22 (smallest).
    pub zstd: i32,
}

impl Levels {
    /// gzip's level when none is named: zlib's default, which Kafka's -1 means.
    pub const GZIP_DEFAULT: u32 = 6;
    /// zstd's level when none is named: Kafka's default.
    pub const ZSTD_DEFAULT: i32 = 3;
}

impl Default for Levels {
    fn default() -> Self {
        Levels {
            gzip: Levels::GZIP_DEFAULT,
            zstd: Levels::ZSTD_DEFAULT,
        }
    }
}

/// Compresses `input` with `codec` (at its level in `levels`) onto the end of `out`,
/// which keeps what it held (a batch header, say): one buffer for the whole batch, never
/// longer than `limit` bytes (`TooLarge` as soon as the output would pass it: a broker
/// bounds a rewritten batch by `max.message.bytes` without building all of an oversized
/// one). On error `out` may hold part of the output.
pub fn compress_into(
    codec: Compression,
    input: &[u8],
    snappy_framing: SnappyFraming,
    levels: Levels,
    out: &mut Vec<u8>,
    limit: usize,
) -> Result<(), WireError> {
    let mut sink = Bounded { out, limit };
    let written = match codec {
        Compression::None => std::io::Write::write_all(&mut sink, input),
        Compression::Gzip => {
            let mut enc =
                flate2::write::GzEncoder::new(&mut sink, flate2::Compression::new(levels.gzip));
            enc.write_all(input).and_then(|()| enc.finish().map(drop))
        }
        Compression::Snappy => return snappy_compress(input, snappy_framing, sink.out, limit),
        Compression::Lz4 => {
            let mut enc = lz4_flex::frame::FrameEncoder::new(&mut sink);
            enc.write_all(input).and_then(|()| {
                enc.finish().map(drop).map_err(|e| match e {
                    lz4_flex::frame::Error::IoError(e) => e,
                    e => std::io::Error::other(e),
                })
            })
        }
        Compression::Zstd => (|| {
            let mut enc = zstd::stream::write::Encoder::new(&mut sink, levels.zstd)?;
            // The frame says its content size, as a one-shot compression writes it:
            // readers can size their output at once.
            enc.set_pledged_src_size(Some(input.len() as u64))?;
            enc.include_contentsize(true)?;
            enc.write_all(input)?;
            enc.finish().map(drop)
        })(),
    };
    written.map_err(|e| {
        if e.kind() == OVER_LIMIT || sink.out.len() > limit {
            over_limit(sink.out, limit)
        } else {
            fail(codec, e)
        }
    })
}

fn snappy_compress(
    input: &[u8],
    framing: SnappyFraming,
    out: &mut Vec<u8>,
    limit: usize,
) -> Result<(), WireError> {
    let codec = Compression::Snappy;
    let mut encoder = snap::raw::Encoder::new();
    let mut block = |chunk: &[u8], out: &mut Vec<u8>| {
        let start = out.len();
        out.resize(start + snap::raw::max_compress_len(chunk.len()), 0);
        let written = encoder
            .compress(chunk, &mut out[start..])
            .map_err(|e| fail(codec, e))?;
        out.truncate(start + written);
        if out.len() > limit {
            return Err(over_limit(out, limit));
        }
        Ok::<usize, WireError>(written)
    };
    if framing == SnappyFraming::Raw {
        block(input, out)?;
        return Ok(());
    }
    out.extend_from_slice(&XERIAL_MAGIC);
    out.extend_from_slice(&1i32.to_be_bytes());
    out.extend_from_slice(&1i32.to_be_bytes());
    for chunk in input.chunks(XERIAL_BLOCK_BYTES) {
        // The block's length goes before it: written once the block is.
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        let written = block(chunk, out)?;
        let written = i32::try_from(written).map_err(|_| fail(codec, "block too large"))?;
        out[at..at + 4].copy_from_slice(&written.to_be_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Compression; 5] = Compression::ALL;

    #[test]
    fn every_codec_roundtrips() {
        let input: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for codec in ALL {
            for framing in [SnappyFraming::Xerial, SnappyFraming::Raw] {
                let packed = compress(codec, &input, framing).expect("compresses");
                let back = decompress(codec, &packed, input.len()).expect("decompresses");
                assert_eq!(&back[..], &input[..], "{codec:?} {framing:?}");
            }
        }
    }

    /// The broker compresses a batch's records after its header, in one buffer: what was
    /// there stays, and what follows decompresses to the input with every codec.
    #[test]
    fn compress_into_appends_after_what_the_buffer_holds() {
        let input: Vec<u8> = (0..200_000u32).map(|i| (i % 13) as u8).collect();
        for codec in ALL {
            for framing in [SnappyFraming::Xerial, SnappyFraming::Raw] {
                let mut out = b"header".to_vec();
                compress_into(
                    codec,
                    &input,
                    framing,
                    Levels::default(),
                    &mut out,
                    usize::MAX,
                )
                .expect("compresses");
                assert_eq!(&out[..6], b"header");
                let back = decompress(codec, &out[6..], input.len()).expect("decompresses");
                assert_eq!(&back[..], &input[..], "{codec:?} {framing:?}");
            }
        }
        // A zstd frame says its content size, as a one-shot compression writes it.
        let mut out = Vec::new();
        compress_into(
            Compression::Zstd,
            &input,
            SnappyFraming::Raw,
            Levels::default(),
            &mut out,
            usize::MAX,
        )
        .expect("zstd");
        let size = zstd::zstd_safe::get_frame_content_size(&out).expect("a frame");
        assert_eq!(size, Some(input.len() as u64));
    }

    /// KIP-390: the level reaches the encoder. Text-like records compress smaller at
    /// gzip 9 than at 1 and at zstd 19 than at 1 (and faster levels give larger output),
    /// and every level decompresses to the input.
    #[test]
    fn the_level_reaches_gzip_and_zstd() {
        let words = [
            "offset", "epoch", "batch", "leader", "replica", "segment", "fetch",
        ];
        let input: Vec<u8> = (0..40_000u32)
            .flat_map(|i| {
                let w = words[(i.wrapping_mul(2_654_435_761) >> 29) as usize % words.len()];
                format!("{w}-{} ", i % 977).into_bytes()
            })
            .collect();
        let packed = |codec, levels| {
            let mut out = Vec::new();
            compress_into(
                codec,
                &input,
                SnappyFraming::Raw,
                levels,
                &mut out,
                usize::MAX,
            )
            .expect("compresses");
            let back = decompress(codec, &out, input.len()).expect("decompresses");
            assert_eq!(back.len(), input.len());
            assert!(back[..] == input[..], "{codec:?} {levels:?}");
            out.len()
        };
        let gzip = |gzip| Levels {
            gzip,
            ..Levels::default()
        };
        let zstd = |zstd| Levels {
            zstd,
            ..Levels::default()
        };
        let (g1, g9) = (
            packed(Compression::Gzip, gzip(1)),
            packed(Compression::Gzip, gzip(9)),
        );
        assert!(g9 < g1, "gzip 9 {g9} bytes, gzip 1 {g1}");
        let (z1, z19) = (
            packed(Compression::Zstd, zstd(1)),
            packed(Compression::Zstd, zstd(19)),
        );
        assert!(z19 < z1, "zstd 19 {z19} bytes, zstd 1 {z1}");
        let z_fast = packed(Compression::Zstd, zstd(-50));
        assert!(z_fast > z1, "zstd -50 {z_fast} bytes, zstd 1 {z1}");
    }

    #[test]
    fn output_bound_is_enforced() {
        let input = vec![0u8; 1 << 20];
        for codec in ALL {
            let packed = compress(codec, &input, SnappyFraming::Xerial).expect("compresses");
            let r = decompress(codec, &packed, 4096);
            assert!(
                matches!(r, Err(WireError::Decompression { .. })),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let junk = [
            0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1, 0x7f,
        ];
        for codec in ALL {
            let _ = decompress(codec, &junk, 1024);
            let _ = decompress(codec, &junk[..3], 1024);
        }
        assert!(decompress(Compression::Snappy, &junk, 1024).is_err());
    }
}
