//! Real client bytes (captured by `tests/fixtures/capture.sh`, see its README) decoded to
//! exact expected values: librdkafka 2.0.2 (kcat) and kafka-python 3.0.12 — ApiVersions,
//! Metadata, Produce with every codec and with idempotence, Fetch requests and responses.
//! Each file is a whole frame, size prefix included, as it crossed the socket.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use wire::api;
use wire::batch::{Compression, Record, batch_records, split_batches};
use wire::frame::{FrameStatus, RequestHeader, check_frame, parse_request_header};
use wire::messages::kafka_protocol::messages::{ApiVersionsResponse, FetchResponse, RequestKind};
use wire::messages::{self, decode_response_as};
use wire::produce::ProduceRequestView;

const MAX_FRAME_BYTES: usize = 1 << 20;
const CODECS: [(&str, Compression); 5] = [
    ("none", Compression::None),
    ("gzip", Compression::Gzip),
    ("snappy", Compression::Snappy),
    ("lz4", Compression::Lz4),
    ("zstd", Compression::Zstd),
];

fn raw_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/raw")
}

/// All fixture files whose name starts with `prefix` and contains `kind`, in capture order.
fn files(prefix: &str, kind: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(raw_dir())
        .expect("fixture dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            (prefix.is_empty() || name.starts_with(&format!("{prefix}-"))) && name.contains(kind)
        })
        .collect();
    out.sort();
    out
}

/// The payload of the first fixture matching, after checking its size prefix.
fn frame(prefix: &str, kind: &str) -> Bytes {
    let path = files(prefix, kind)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no fixture {prefix} / {kind}"));
    let bytes = std::fs::read(&path).expect("readable fixture");
    let status = check_frame(&bytes, MAX_FRAME_BYTES).expect("valid size prefix");
    assert_eq!(
        status,
        FrameStatus::Complete {
            size: bytes.len() - 4
        },
        "{path:?}"
    );
    Bytes::from(bytes).slice(4..)
}

fn request(prefix: &str, kind: &str) -> (RequestHeader, Bytes) {
    let f = frame(prefix, kind);
    let (header, body_at) = parse_request_header(&f).expect("valid header");
    (header, f.slice(body_at..))
}

/// The records of every batch in a records blob, decompressed.
fn records_of(blob: &Bytes) -> (Vec<Compression>, Vec<Record>) {
    let mut codecs = Vec::new();
    let mut records = Vec::new();
    for range in split_batches(blob) {
        let range = range.expect("valid batch");
        let (header, iter) = batch_records(&blob.slice(range), 1 << 20).expect("batch");
        codecs.push(header.attributes().compression().expect("known codec"));
        records.extend(iter.map(|r| r.expect("valid record")));
    }
    (codecs, records)
}

fn expected_value(i: usize) -> Vec<u8> {
    let mut v = format!("fixture-{i}-").into_bytes();
    v.extend(std::iter::repeat_n(b'a', 200));
    v
}

fn assert_fixture_records(records: &[Record]) {
    assert_eq!(records.len(), 3);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.offset_delta, i as i32);
        assert_eq!(r.key.as_deref(), Some(format!("k{}", i + 1).as_bytes()));
        assert_eq!(r.value.as_deref(), Some(&expected_value(i + 1)[..]));
        assert!(r.headers.is_empty());
    }
}

#[test]
fn librdkafka_api_versions_request() {
    let (h, body) = request("kcat-metadata", "req-18v3");
    assert_eq!((h.api_key, h.api_version, h.correlation_id), (18, 3, 1));
    assert_eq!(h.client_id_str(), Some("rdkafka"));
    let RequestKind::ApiVersions(req) =
        messages::decode_request(h.api_key, h.api_version, body).expect("decodes")
    else {
        panic!("not ApiVersions");
    };
    assert_eq!(req.client_software_name.as_str(), "librdkafka");
    assert_eq!(req.client_software_version.as_str(), "2.0.2");
}

#[test]
fn librdkafka_metadata_request() {
    let (h, body) = request("kcat-metadata", "req-3v4");
    assert_eq!((h.api_key, h.api_version), (3, 4));
    assert_eq!(h.client_id_str(), Some("rdkafka"));
    let RequestKind::Metadata(req) =
        messages::decode_request(h.api_key, h.api_version, body).expect("decodes")
    else {
        panic!("not Metadata");
    };
    // librdkafka's first Metadata asks for brokers only: an empty (not null) topic list.
    assert_eq!(req.topics.as_ref().map(Vec::len), Some(0));
    assert!(!req.allow_auto_topic_creation);
}

/// Recorded when weir's maximum was v3: kafka-python's v4 got the KIP-511 fallback and
/// retried with v3. v4 is served now (one round trip fewer per connection).
#[test]
fn kafka_python_api_versions_v4_is_served_and_the_old_fallback_decodes() {
    let (h, body) = request("kpy-produce-none", "req-18v4");
    assert_eq!((h.api_key, h.api_version), (18, 4));
    assert_eq!(h.client_id_str(), Some("kpy-fixture"));
    assert!(matches!(
        messages::decode_request(18, 4, body),
        Ok(RequestKind::ApiVersions(_))
    ));
    assert!(!api::api_versions_needs_fallback(4));
    // The recorded answer of the old maximum: v0 with UNSUPPORTED_VERSION and the table.
    let resp = frame("kpy-produce-none", "resp-18v4");
    let (corr, r) =
        decode_response_as::<ApiVersionsResponse>(18, 0, &resp).expect("v0 response decodes");
    assert_eq!(corr, h.correlation_id);
    assert_eq!(r.error_code, api::ERROR_UNSUPPORTED_VERSION);
    assert!(
        r.api_keys
            .iter()
            .any(|k| k.api_key == api::PRODUCE && k.max_version == 9)
    );
    // kafka-python then retried with v3.
    let (h3, _) = request("kpy-produce-none", "req-18v3");
    assert_eq!(h3.api_version, 3);
}

fn check_produce(prefix: &str, topic: &str, codec: Compression) -> ProduceRequestView {
    let (h, body) = request(prefix, "req-0v");
    assert_eq!(h.api_key, api::PRODUCE);
    let view = ProduceRequestView::parse(&body, h.api_version).expect("produce view");
    // The oracle agrees on the shape.
    let RequestKind::Produce(kp) =
        messages::decode_request(h.api_key, h.api_version, body.clone()).expect("decodes")
    else {
        panic!("not Produce");
    };
    assert_eq!(kp.acks, view.acks);
    assert_eq!(view.topics.len(), 1);
    assert_eq!(view.topics[0].name_str(), Some(topic));
    assert_eq!(view.topics[0].partitions.len(), 1);
    assert_eq!(view.topics[0].partitions[0].index, 0);
    let blob = view.topics[0].partitions[0]
        .records
        .clone()
        .expect("records");
    let (codecs, records) = records_of(&blob);
    assert_eq!(codecs, vec![codec], "{prefix}");
    assert_fixture_records(&records);
    view
}

#[test]
fn librdkafka_produce_with_every_codec() {
    for (name, codec) in CODECS {
        let view = check_produce(
            &format!("kcat-produce-{name}"),
            &format!("fx-kcat-{name}"),
            codec,
        );
        assert_eq!(view.version, 7, "librdkafka 2.0.2 uses Produce v7");
        assert_eq!(view.acks, -1);
        assert_eq!(view.timeout_ms, 30_000);
        assert_eq!(view.transactional_id, None);
    }
}

#[test]
fn kafka_python_produce_with_every_codec() {
    for (name, codec) in CODECS {
        let view = check_produce(
            &format!("kpy-produce-{name}"),
            &format!("fx-kpy-{name}"),
            codec,
        );
        assert_eq!(
            view.version, 9,
            "kafka-python 3.0.12 uses flexible Produce v9"
        );
        assert_eq!(view.transactional_id, None);
    }
}

/// Snappy framing differs by client: kafka-python writes snappy-java's xerial stream,
/// librdkafka one raw block. Both must decode (checked above); this pins which is which.
#[test]
fn snappy_framing_per_client() {
    let xerial = wire::batch::compression::XERIAL_MAGIC;
    for (prefix, want_xerial) in [("kpy-produce-snappy", true), ("kcat-produce-snappy", false)] {
        let (h, body) = request(prefix, "req-0v");
        let view = ProduceRequestView::parse(&body, h.api_version).expect("produce view");
        let blob = view.topics[0].partitions[0]
            .records
            .clone()
            .expect("records");
        let compressed = &blob[wire::batch::BATCH_HEADER_SIZE..];
        assert_eq!(compressed.starts_with(&xerial), want_xerial, "{prefix}");
    }
}

fn check_idempotent(prefix: &str, topic: &str) {
    let (h, body) = request(prefix, "req-22v");
    assert_eq!(h.api_key, api::INIT_PRODUCER_ID);
    let RequestKind::InitProducerId(init) =
        messages::decode_request(h.api_key, h.api_version, body).expect("decodes")
    else {
        panic!("not InitProducerId");
    };
    assert_eq!(init.transactional_id, None);
    let view = check_produce(prefix, topic, Compression::None);
    assert_eq!(view.acks, -1, "idempotence requires acks=all");
    let blob = view.topics[0].partitions[0]
        .records
        .clone()
        .expect("records");
    let batch = wire::batch::validate_batch(&blob).expect("valid");
    assert!(batch.header.producer_id().is_some());
    assert_eq!(batch.header.producer_epoch().get(), 0);
    assert_eq!(batch.header.base_sequence().get(), 0);
    assert!(!batch.header.attributes().is_transactional());
}

#[test]
fn librdkafka_idempotent_produce() {
    check_idempotent("kcat-produce-idempotent", "fx-kcat-idem");
}

#[test]
fn kafka_python_idempotent_produce() {
    check_idempotent("kpy-produce-idempotent", "fx-kpy-idem");
}

fn check_fetch(prefix: &str, topic: &str, version: i16) {
    let (h, body) = request(prefix, &format!("req-1v{version}"));
    let RequestKind::Fetch(req) =
        messages::decode_request(h.api_key, h.api_version, body).expect("decodes")
    else {
        panic!("not Fetch");
    };
    assert_eq!(req.topics.len(), 1);
    assert_eq!(req.topics[0].topic.as_str(), topic);
    assert_eq!(req.topics[0].partitions[0].fetch_offset, 0);
    // The broker's answer to that first fetch holds the three gzip records.
    let resp = frame(prefix, &format!("resp-1v{version}"));
    let (corr, r) = decode_response_as::<FetchResponse>(1, version, &resp).expect("decodes");
    assert_eq!(corr, h.correlation_id);
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    assert_eq!(p.high_watermark, 3);
    let blob = p.records.clone().expect("records");
    let (codecs, records) = records_of(&blob);
    assert_eq!(codecs, vec![Compression::Gzip]);
    assert_fixture_records(&records);
}

#[test]
fn librdkafka_fetch() {
    check_fetch("kcat-fetch", "fx-kcat-gzip", 11);
}

#[test]
fn kafka_python_fetch() {
    check_fetch("kpy-fetch", "fx-kpy-gzip", 12);
}

/// Every captured frame parses: framing, header, and (for advertised versions) the body.
#[test]
fn every_captured_request_decodes() {
    let mut n = 0;
    for path in files("", "-req-") {
        let bytes = Bytes::from(std::fs::read(&path).expect("readable"));
        let f = bytes.slice(4..);
        let (h, at) = parse_request_header(&f).expect("header");
        if api::is_supported(h.api_key, h.api_version) {
            messages::decode_request(h.api_key, h.api_version, f.slice(at..))
                .unwrap_or_else(|e| panic!("{path:?}: {e}"));
            n += 1;
        }
    }
    assert!(n >= 50, "only {n} requests captured");
}
