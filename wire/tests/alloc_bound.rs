//! Decoding never allocates beyond a bound derived from the frame size.
//!
//! A counting global allocator records the peak bytes live while one decode runs. Frames
//! claiming huge arrays (i32::MAX classic counts, u32::MAX compact counts, huge string and
//! record lengths) are fed to every advertised (api key, version), the Produce view, the
//! record iterator and the decompressors. The bound is `BASE + PER_BYTE * frame_len`: a
//! decode builds at most `wire::messages::decoded_bytes_max` (24 bytes per body byte and a
//! base), twice that while its vectors grow by doubling, and frames whose elements are one
//! byte each (32 bytes in memory) are refused once they reach it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use proptest::prelude::*;
use wire::api::API_TABLE;
use wire::batch::{
    BatchBuilder, Compression, NewRecord, batch_records, decompress, walk_produced_batch,
};
use wire::messages;
use wire::produce::ProduceRequestView;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Allocations made by this thread (a `Cell` needs no destructor, so the allocator may
    /// touch it).
    static THREAD_ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn count_thread_alloc() {
    let _ = THREAD_ALLOCS.try_with(|n| n.set(n.get() + 1));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_thread_alloc();
        let now = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_thread_alloc();
        if new_size > layout.size() {
            let now = LIVE.fetch_add(new_size - layout.size(), Ordering::SeqCst) + new_size
                - layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Tests in this file share the counters: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const BASE: usize = 64 * 1024;
const PER_BYTE: usize = 64;

/// Peak bytes allocated (above what was live before) while `f` runs.
fn peak_during(f: impl FnOnce()) -> usize {
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    f();
    PEAK.load(Ordering::SeqCst).saturating_sub(before)
}

fn assert_bounded(what: &str, frame_len: usize, peak: usize) {
    let bound = BASE + PER_BYTE * frame_len;
    assert!(
        peak <= bound,
        "{what}: peak {peak} bytes for a {frame_len}-byte frame (bound {bound})"
    );
}

/// Hostile bodies: runs of maximal counts in both encodings, with short valid-looking
/// prefixes so the counts land in array positions of many messages.
fn hostile_bodies() -> Vec<Bytes> {
    let classic: Vec<u8> = [0x7f, 0xff, 0xff, 0xff].repeat(8);
    let compact: Vec<u8> = [0xff, 0xff, 0xff, 0xff, 0x0f].repeat(8);
    let mut out = Vec::new();
    for prefix_len in 0..12 {
        for run in [&classic, &compact] {
            let mut b = vec![0u8; prefix_len];
            b.extend_from_slice(run);
            out.push(Bytes::from(b));
            let mut b = vec![0x01u8; prefix_len];
            b.extend_from_slice(run);
            out.push(Bytes::from(b));
        }
    }
    out
}

fn all_versions() -> impl Iterator<Item = (i16, i16)> {
    API_TABLE
        .iter()
        .flat_map(|e| (e.min_version..=e.max_version).map(move |v| (e.key, v)))
}

#[test]
fn request_decoding_is_bounded_for_every_advertised_version() {
    let _g = SERIAL.lock();
    for body in hostile_bodies() {
        for (key, version) in all_versions() {
            let len = body.len();
            let b = body.clone();
            let peak = peak_during(|| {
                let _ = messages::decode_request(key, version, b);
            });
            assert_bounded(&format!("api {key} v{version}"), len, peak);
        }
    }
}

#[test]
fn produce_view_is_bounded() {
    let _g = SERIAL.lock();
    for body in hostile_bodies() {
        for version in 0..=9 {
            let peak = peak_during(|| {
                let _ = ProduceRequestView::parse(&body, version);
            });
            assert_bounded(&format!("produce v{version}"), body.len(), peak);
        }
    }
}

#[test]
fn record_iteration_is_bounded() {
    let _g = SERIAL.lock();
    // A valid batch whose record claims 2^30 headers.
    let batch = BatchBuilder {
        records: vec![NewRecord::value(1, Bytes::from_static(b"v"))],
        ..BatchBuilder::default()
    }
    .build()
    .expect("builds");
    let mut bytes = batch.to_vec();
    let last = bytes.len() - 1;
    bytes[last] = 0xfe; // headersCount: start of a long varint
    bytes.extend_from_slice(&[0xff, 0xff, 0x07]);
    let len = bytes.len() - 12;
    bytes[8..12].copy_from_slice(&(len as i32).to_be_bytes());
    let crc = crc32c::crc32c(&bytes[21..]);
    bytes[17..21].copy_from_slice(&crc.to_be_bytes());
    let batch = Bytes::from(bytes);
    let peak = peak_during(|| {
        if let Ok((_, iter)) = batch_records(&batch, 1 << 20) {
            for r in iter {
                assert!(r.is_err(), "a lying header count must not decode");
            }
        }
    });
    assert_bounded("record iterator", batch.len(), peak);
}

/// The produce path walks every record of every batch: uncompressed, that walk must not
/// allocate (its cost is on the hot path, see docs/PERFORMANCE.md "Produced batch walk").
#[test]
fn walking_an_uncompressed_produced_batch_allocates_nothing() {
    let _g = SERIAL.lock();
    let records = (0..1000)
        .map(|i| NewRecord {
            key: (i % 3 != 0).then(|| Bytes::from(format!("key-{i}"))),
            headers: vec![
                (
                    Bytes::from_static(b"h"),
                    Some(Bytes::from_static(b"header")),
                ),
                (Bytes::from_static(b"null"), None),
            ],
            ..NewRecord::value(1_700_000_000_000 + i, vec![b'v'; 1024])
        })
        .collect();
    let batch = BatchBuilder {
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("builds");
    let before = THREAD_ALLOCS.with(Cell::get);
    let mut walked = 0usize;
    let result = walk_produced_batch(&batch, 1 << 20, |_, record| {
        walked += record.value.map_or(0, <[u8]>::len) + record.headers_count;
        Ok(())
    });
    let allocs = THREAD_ALLOCS.with(Cell::get) - before;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(walked, 1000 * (1024 + 2));
    assert_eq!(allocs, 0, "allocations while walking");
}

#[test]
fn decompression_is_bounded_by_the_callers_limit() {
    let _g = SERIAL.lock();
    let big = vec![0u8; 8 << 20];
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let packed = wire::batch::compress(codec, &big, Default::default()).expect("compresses");
        let limit = 64 * 1024;
        let peak = peak_during(|| {
            assert!(decompress(codec, &packed, limit).is_err());
        });
        // Besides the bounded output, zstd keeps its window (≤ 16 MiB, see
        // ZSTD_WINDOW_LOG_MAX) and lz4 two buffers of the frame's declared block size
        // (≤ 4 MiB each): constants, whatever the input claims.
        let bound = match codec {
            Compression::Zstd => (1 << 24) + 4 * limit + BASE,
            Compression::Lz4 => (2 << 22) + 4 * limit + BASE,
            _ => 4 * limit + BASE + 256 * 1024,
        };
        assert!(peak <= bound, "{codec:?}: peak {peak} > {bound}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_frames_are_bounded(body in prop::collection::vec(any::<u8>(), 0..200)) {
        let _g = SERIAL.lock();
        let body = Bytes::from(body);
        for (key, version) in all_versions() {
            let b = body.clone();
            let peak = peak_during(|| {
                let _ = messages::decode_request(key, version, b);
            });
            prop_assert!(peak <= BASE + PER_BYTE * body.len(), "api {} v{} peak {}", key, version, peak);
        }
    }
}

/// Empty compact strings are one byte on the wire and 32 in memory: decoded, a frame of
/// them stays within the bound (refused once it reaches `decoded_bytes_max`).
#[test]
fn one_byte_elements_stay_within_the_bound() {
    let _g = SERIAL.lock();
    for count in [1_000usize, 100_000, 3_000_000] {
        // ListTransactions v0: state_filters (compact count, then empty strings), producer
        // id filters (empty), no tagged fields.
        let mut body = Vec::new();
        let mut n = count as u32 + 1;
        while n >= 0x80 {
            body.push((n as u8) | 0x80);
            n >>= 7;
        }
        body.push(n as u8);
        body.extend(std::iter::repeat_n(1u8, count));
        body.extend([1, 0]);
        let len = body.len();
        let body = Bytes::from(body);
        let mut refused = false;
        let peak = peak_during(|| {
            refused = messages::decode_request(wire::api::LIST_TRANSACTIONS, 0, body).is_err();
        });
        assert_bounded("ListTransactions of empty filters", len, peak);
        assert_eq!(refused, count > 1_000, "{count} filters");
    }
}

/// An array whose count fits the bytes left but whose first element fails to decode
/// reserves room for a few elements, not for the count: a 100 KB request claiming 100,000
/// topics must not reserve 100,000 topics' worth of memory up front.
#[test]
fn an_array_count_reserves_little_before_its_elements_decode() {
    let _g = SERIAL.lock();
    let count = 100_000usize;
    let mut body = (count as i32).to_be_bytes().to_vec();
    // Each topic name claims 0x7f7f bytes: three names use the body up and the fourth
    // runs past its end.
    body.extend(std::iter::repeat_n(0x7fu8, count));
    let len = body.len();
    let body = Bytes::from(body);
    let peak = peak_during(|| {
        let _ = messages::decode_request(wire::api::METADATA, 4, body);
    });
    assert!(
        peak <= BASE + 4 * len,
        "peak {peak} bytes for a {len}-byte Metadata request"
    );
}
