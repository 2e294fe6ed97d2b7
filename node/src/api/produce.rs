//! Produce: validate every batch, route each partition's records to its owning shard with
//! the request's acks and timeout, append there, answer per partition. acks=0 gets no
//! response (the connection is closed if any partition failed, as in Kafka); acks=1 is
//! answered after the leader's append; acks=all waits on the owner
//! until the HW covers the batch (`timeout_ms`, then REQUEST_TIMED_OUT), and is refused
//! there with NOT_ENOUGH_REPLICAS while the ISR is smaller than `min.insync.replicas`.
//! Internal topics (`__consumer_offsets`) are refused with INVALID_TOPIC_EXCEPTION, a
//! partition named twice with INVALID_REQUEST (each entry); a request naming more than
//! `PARTITIONS_PER_PRODUCE_MAX` partition entries is undecodable (connection closed).
//!
//! Record bytes are not copied: the request frame is usually its own allocation (see
//! `server::conn`), so once the request view is dropped the frame is taken back as a
//! `BytesMut` and cut into one piece per partition, which the log patches in place.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use wire::WireError;
use wire::produce::{
    ProducePartitionResponse, ProduceRequestView, ProduceResponseParts, ProduceTopicResponse,
};

use super::Response;
use super::authz::Authz;
use crate::errors;
use crate::metadata::Catalog;
use crate::partition::{Acks, ProduceOutcome};
use crate::proto::Request;
use crate::security::acl::Operation;
use crate::shard::{ProduceCall, Shard};

/// The first Produce version that carries record batches v2 (the only format stored).
const FIRST_V2_FORMAT_VERSION: i16 = 3;

/// How long the owner may take to append, beyond the request's `timeout_ms` (which
/// Kafka applies to waiting for replicas only): an append is never answered
/// REQUEST_TIMED_OUT only because a client sent a short timeout.
const APPEND_TIMEOUT: Duration = Duration::from_secs(30);

/// One partition of the request: where its records sit in the body, or why it is refused
/// before any append.
struct Part {
    topic: Arc<str>,
    index: i32,
    records: Result<Range<usize>, i16>,
}

/// Handles a Produce request; `Ok(None)` for acks=0 (a close if a partition failed).
pub async fn handle(
    shard: &Rc<Shard>,
    req: Request,
    authz: &Authz<'_>,
) -> Result<Response, WireError> {
    let (acks, timeout_ms, mut parts, txn_id) = {
        let view = ProduceRequestView::parse(&req.body, req.version)?;
        let txn_id: Option<Arc<str>> = view
            .transactional_id
            .as_ref()
            .map(|t| Arc::from(String::from_utf8_lossy(t).as_ref()));
        let plan = plan(shard, &view, &req.body, authz);
        (view.acks, view.timeout_ms, plan, txn_id)
    };
    // Kafka: a transactional producer needs Write on its transactional id, else every
    // partition is refused; transactional batches without a transactional id are refused
    // the same way (else any principal with topic Write could append to another
    // producer's open transaction).
    let txn_denied = match &txn_id {
        Some(id) => !authz.txn(Operation::Write, id),
        None => parts.iter().any(|p| {
            p.records
                .as_ref()
                .is_ok_and(|range| has_transactional_batch(&req.body[range.clone()]))
        }),
    };
    if txn_denied {
        for p in &mut parts {
            p.records = Err(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
        }
    }
    if req.version < FIRST_V2_FORMAT_VERSION {
        // v0–v2 carry message format v0/v1, which weir does not store (they are
        // advertised only for old librdkafka's feature detection): refused per partition.
        for p in &mut parts {
            p.records = Err(errors::UNSUPPORTED_FOR_MESSAGE_FORMAT);
        }
    }
    let (correlation_id, version) = (req.correlation_id, req.version);
    let records = split_records(into_body(req), &parts);
    // Refused in `plan` when not a valid value.
    let acks_kind = Acks::from_wire(acks).unwrap_or(Acks::Leader);
    let timeout = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
    let resp = respond(shard, parts, records, (acks_kind, txn_id), timeout).await;
    if acks == 0 {
        // No answer, but an error must not go unnoticed: Kafka closes the connection, so
        // the producer refreshes its metadata (a moved leader, a deleted topic).
        let failed = resp.topics.iter().flat_map(|t| &t.partitions);
        if failed.into_iter().any(|p| p.error_code != errors::NONE) {
            return Ok(super::close());
        }
        return Ok(None);
    }
    let frame = wire::produce::encode_produce_response(correlation_id, version, &resp)?;
    Ok(Some(vec![frame]))
}

/// Whether any batch in `records` has the transactional bit (headers only are read; a
/// malformed blob is the partition's own refusal later).
fn has_transactional_batch(records: &[u8]) -> bool {
    let mut pos = 0usize;
    while let Some(rest) = records.get(pos..).filter(|r| !r.is_empty()) {
        let Ok(h) = wire::batch::read_header(rest) else {
            return false;
        };
        if h.attributes().is_transactional() {
            return true;
        }
        pos = pos.saturating_add(h.total_size().max(1));
    }
    false
}

/// The request's body, with every other handle on the frame dropped: the header's client
/// id is a slice of the same buffer, and while it lives the body is not the only owner of
/// its frame, so `split_records` copied every produced byte out (issue 14).
fn into_body(req: Request) -> Bytes {
    let Request {
        body, client_id, ..
    } = req;
    drop(client_id);
    body
}

/// Checks what can be checked without the partition (acks, topic, partition range) and
/// locates each partition's records in `body`. Replica checks (leadership, ISR size) are
/// the owner's: only it knows the partition's replica state.
fn plan(shard: &Shard, view: &ProduceRequestView, body: &Bytes, authz: &Authz<'_>) -> Vec<Part> {
    let catalog = shard.catalog();
    let mut parts = Vec::with_capacity(view.partition_count());
    for topic in &view.topics {
        // A name that is not UTF-8 cannot exist in the catalogue.
        let name: Arc<str> = Arc::from(String::from_utf8_lossy(&topic.name).as_ref());
        // Once per topic, before existence: an unauthorized topic does not say whether
        // it exists.
        let denied = !authz.topic(Operation::Write, &name);
        for part in &topic.partitions {
            let refused = match denied {
                true => Some(errors::TOPIC_AUTHORIZATION_FAILED),
                false => refusal(&catalog, view.acks, &name, part.index),
            };
            let records = match (refused, &part.records) {
                (Some(code), _) => Err(code),
                (None, None) => Err(errors::CORRUPT_MESSAGE),
                (None, Some(r)) => range_in(body, r).ok_or(errors::CORRUPT_MESSAGE),
            };
            parts.push(Part {
                topic: name.clone(),
                index: part.index,
                records,
            });
        }
    }
    refuse_repeated(&mut parts);
    parts
}

/// A partition named more than once gets INVALID_REQUEST for each of its entries, and
/// nothing of them is appended (as ListOffsets; appending each would store the records
/// twice, and one request could repeat a partition for every few bytes it carries).
fn refuse_repeated(parts: &mut [Part]) {
    // Most requests name one partition: no table to build.
    if parts.len() < 2 {
        return;
    }
    let mut named: HashMap<(Arc<str>, i32), u32> = HashMap::with_capacity(parts.len());
    for p in parts.iter() {
        *named.entry((p.topic.clone(), p.index)).or_default() += 1;
    }
    let repeated: HashSet<(Arc<str>, i32)> = named
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(tp, _)| tp)
        .collect();
    if repeated.is_empty() {
        return;
    }
    for p in parts.iter_mut() {
        if repeated.contains(&(p.topic.clone(), p.index)) {
            p.records = Err(errors::INVALID_REQUEST);
        }
    }
}

fn refusal(catalog: &Catalog, acks: i16, topic: &str, index: i32) -> Option<i16> {
    if Acks::from_wire(acks).is_none() {
        return Some(errors::INVALID_REQUIRED_ACKS);
    }
    // Only the coordinators write internal topics (Kafka: "Cannot append to internal
    // topic"): a forged commit record would be loaded as a group's offset.
    if crate::metadata::is_internal(topic) {
        return Some(errors::INVALID_TOPIC_EXCEPTION);
    }
    let known = catalog
        .topics
        .get(topic)
        .is_some_and(|m| (0..m.partitions).contains(&index));
    (!known).then_some(errors::UNKNOWN_TOPIC_OR_PARTITION)
}

/// Where `slice` (a slice of `body`) lies within `body`.
fn range_in(body: &Bytes, slice: &Bytes) -> Option<Range<usize>> {
    let start = (slice.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(slice.len())?;
    (end <= body.len()).then_some(start..end)
}

/// Most memory a partition's records may pin (their frame) per byte they hold. 4, not 2:
/// a request carrying one batch for each of 2–3 partitions (what a client with a few
/// partitions per broker sends) has pieces just under 1/2 or 1/3 of the frame, and each
/// of them copied out cost one extra copy of every produced byte (issue 14).
pub(crate) const PIN_FACTOR_MAX: usize = 4;

/// One buffer per partition with records. Zero-copy when this request is the only owner
/// of its frame (the usual case for large produce requests) and the piece is at least
/// 1/[`PIN_FACTOR_MAX`] of the frame's allocation; otherwise the piece is copied out
/// (small frames share, or sit in, the connection's larger read buffer; a small piece
/// of a big frame would keep all of it alive).
fn split_records(body: Bytes, parts: &[Part]) -> Vec<Option<BytesMut>> {
    let ranges: Vec<Option<&Range<usize>>> =
        parts.iter().map(|p| p.records.as_ref().ok()).collect();
    let ascending = ranges
        .iter()
        .flatten()
        .try_fold(0usize, |end, r| (r.start >= end).then_some(r.end))
        .is_some();
    let mut whole = match (ascending, body.try_into_mut()) {
        (true, Ok(whole)) => whole,
        (_, Ok(whole)) => return copy_out(&whole, &ranges),
        (_, Err(shared)) => return copy_out(&shared, &ranges),
    };
    // The allocation, not just the frame's bytes: a small frame handed over whole by the
    // connection sits in a read buffer of 64 KiB or more, all of which a piece would pin.
    let total = whole.capacity();
    let mut consumed = 0;
    ranges
        .iter()
        .map(|r| {
            r.map(|r| {
                whole.advance(r.start - consumed);
                consumed = r.end;
                let piece = whole.split_to(r.len());
                // A piece keeps its whole frame alive while the log's tail cache holds
                // it; a small piece of a big frame is copied out so that an idle
                // partition never pins much more memory than it caches.
                if r.len() * PIN_FACTOR_MAX >= total {
                    piece
                } else {
                    BytesMut::from(&piece[..])
                }
            })
        })
        .collect()
}

/// Records in the whole batches of `blob`, from their headers' counts, for metrics. The
/// batches were validated (CRC included) where it matters, by the owner before appending
/// or when read back, so this walks headers only: it used to CRC every produced and
/// fetched byte a second time just to count records. Stops at the first header that does
/// not fit in what is left (what follows counts 0).
pub fn record_count(blob: &[u8]) -> u64 {
    let min_batch = wire::batch::BATCH_HEADER_SIZE;
    let mut pos = 0;
    let mut records = 0u64;
    // Each step moves at least one batch header forward: at most len / 61 steps.
    while let Ok(header) = wire::batch::read_header(&blob[pos..]) {
        let size = header.total_size();
        if size < min_batch || size > blob.len() - pos {
            break;
        }
        records += u64::try_from(header.records_count()).unwrap_or(0);
        pos += size;
    }
    records
}

fn copy_out(body: &[u8], ranges: &[Option<&Range<usize>>]) -> Vec<Option<BytesMut>> {
    ranges
        .iter()
        .map(|r| r.map(|r| BytesMut::from(&body[r.clone()])))
        .collect()
}

async fn respond(
    shard: &Rc<Shard>,
    parts: Vec<Part>,
    records: Vec<Option<BytesMut>>,
    (acks, transactional_id): (Acks, Option<Arc<str>>),
    timeout: Duration,
) -> ProduceResponseParts {
    let now = Instant::now();
    let replicated_by = now + timeout;
    let deadline = replicated_by.max(now + APPEND_TIMEOUT);
    let mut pending = Vec::with_capacity(parts.len());
    for (part, records) in parts.into_iter().zip(records) {
        let task = match (part.records, records) {
            (Err(code), _) => Err(code),
            (Ok(_), None) => Err(errors::CORRUPT_MESSAGE),
            (Ok(_), Some(records)) => {
                let size = (records.len() as u64, record_count(&records));
                shard.metrics().produce_batch(size.0);
                let (s, tp) = (shard.clone(), (part.topic.clone(), part.index));
                let call = ProduceCall {
                    tp: tp.clone(),
                    records,
                    acks,
                    replicated_by,
                    transactional_id: transactional_id.clone(),
                };
                Ok((
                    size,
                    glommio::spawn_local(async move { s.call_owner(&tp, call, deadline).await }),
                ))
            }
        };
        pending.push((part.topic, part.index, task));
    }
    let mut topics: Vec<ProduceTopicResponse> = Vec::new();
    for (name, index, task) in pending {
        let outcome = match task {
            Err(code) => ProduceOutcome::failed(code),
            Ok(((bytes, records), t)) => {
                let outcome = t.await.unwrap_or_else(|e| ProduceOutcome::failed(e.code()));
                if outcome.error == errors::NONE {
                    shard.metrics().produced(&name, bytes, records);
                }
                outcome
            }
        };
        let p = ProducePartitionResponse {
            index,
            error_code: outcome.error,
            base_offset: outcome.base_offset.get(),
            log_append_time_ms: outcome.log_append_time_ms,
            log_start_offset: outcome.log_start_offset.get(),
            record_errors: outcome.record_errors.iter().map(|i| (*i, None)).collect(),
            error_message: outcome
                .error_message
                .map(|m| Bytes::from_static(m.as_bytes())),
        };
        match topics.last_mut() {
            Some(t) if t.name.as_ref() == name.as_bytes() => t.partitions.push(p),
            _ => topics.push(ProduceTopicResponse {
                name: Bytes::copy_from_slice(name.as_bytes()),
                partitions: vec![p],
            }),
        }
    }
    ProduceResponseParts {
        topics,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(records: Result<Range<usize>, i16>) -> Part {
        Part {
            topic: Arc::from("t"),
            index: 0,
            records,
        }
    }

    #[test]
    fn unique_frames_are_cut_in_place_and_shared_ones_copied() {
        let body = Bytes::from((0u8..100).collect::<Vec<u8>>());
        let base = body.as_ptr() as usize;
        let parts = vec![part(Ok(10..60)), part(Err(3)), part(Ok(70..80))];
        let pieces = split_records(body, &parts);
        let first = pieces[0].as_ref().unwrap();
        assert_eq!(&first[..], &(10u8..60).collect::<Vec<u8>>()[..]);
        assert_eq!(
            first.as_ptr() as usize,
            base + 10,
            "no copy: same allocation"
        );
        assert!(pieces[1].is_none());
        let small = pieces[2].as_ref().unwrap();
        assert_eq!(&small[..], &(70u8..80).collect::<Vec<u8>>()[..]);
        assert_ne!(
            small.as_ptr() as usize,
            base + 70,
            "a small piece is copied, not pinned"
        );

        let shared = Bytes::from((0u8..100).collect::<Vec<u8>>());
        let keep = shared.clone();
        let pieces = split_records(shared, &parts);
        let first = pieces[0].as_ref().unwrap();
        assert_eq!(&first[..], &keep[10..60], "same bytes");
        assert_ne!(
            first.as_ptr(),
            keep[10..].as_ptr(),
            "a shared frame is copied"
        );
        assert_eq!(range_in(&keep, &keep.slice(5..9)), Some(5..9));
        assert_eq!(range_in(&keep.slice(50..), &keep.slice(5..9)), None);
    }

    #[test]
    fn a_small_frame_in_a_large_buffer_is_copied_not_pinned() {
        // As `server::conn` hands over a 200-byte frame that exactly filled its 64 KiB read
        // buffer: the piece must not keep 64 KiB alive for 180 bytes.
        let mut buf = BytesMut::with_capacity(64 * 1024);
        buf.extend_from_slice(&[7u8; 200]);
        let body = buf.freeze();
        let base = body.as_ptr() as usize;
        let pieces = split_records(body, &[part(Ok(20..200))]);
        let piece = pieces[0].as_ref().expect("records");
        assert_eq!(&piece[..], &[7u8; 180][..]);
        assert_ne!(piece.as_ptr() as usize, base + 20, "copied out");
        assert!(piece.capacity() < 64 * 1024, "does not pin the read buffer");
    }

    #[test]
    fn one_batch_for_each_of_two_partitions_is_cut_in_place() {
        // What weir-loadgen and librdkafka send with 2 partitions on one broker: a request
        // header, then two equal batches, each just under half of the frame. Both used to
        // be copied out (each < 1/2 of the allocation): one extra copy of every byte.
        let mut frame = vec![0u8; 100];
        frame.extend_from_slice(&[1u8; 65_000]);
        frame.extend_from_slice(&[0u8; 30]);
        frame.extend_from_slice(&[2u8; 65_000]);
        let body = Bytes::from(frame);
        let base = body.as_ptr() as usize;
        let parts = vec![part(Ok(100..65_100)), part(Ok(65_130..130_130))];
        let pieces = split_records(body, &parts);
        let (a, b) = (pieces[0].as_ref().unwrap(), pieces[1].as_ref().unwrap());
        assert_eq!(a.as_ptr() as usize, base + 100, "first piece in place");
        assert_eq!(b.as_ptr() as usize, base + 65_130, "second piece in place");
        assert!(a.iter().all(|&x| x == 1) && a.len() == 65_000);
        assert!(b.iter().all(|&x| x == 2) && b.len() == 65_000);
    }

    #[test]
    fn a_request_body_is_the_only_owner_of_its_frame_once_the_header_is_dropped() {
        let mut frame = BytesMut::new();
        let header = wire::frame::RequestHeader {
            api_key: wire::api::PRODUCE,
            api_version: 7,
            correlation_id: 9,
            client_id: Some(Bytes::from_static(b"weir-loadgen")),
        };
        wire::frame::encode_request_header(&header, &mut frame).unwrap();
        frame.extend_from_slice(&[5u8; 1000]);
        let req = crate::proto::parse_request(frame.freeze()).unwrap();
        assert!(
            req.client_id.is_some(),
            "the header's client id shares the frame"
        );
        let body = into_body(req);
        assert_eq!(body.len(), 1000);
        let whole = body.try_into_mut();
        assert!(whole.is_ok(), "the body can be cut up in place");
    }

    #[test]
    fn record_count_reads_headers_without_checking_crcs() {
        let one = crate::storage::testing::build_batch(0, &[b"a", b"b", b"c"]);
        let two = crate::storage::testing::build_batch(0, &[b"d", b"e"]);
        let mut blob = BytesMut::new();
        blob.extend_from_slice(&one);
        blob.extend_from_slice(&two);
        assert_eq!(record_count(&blob), 5);
        // A flipped record byte (CRC no longer matches) still counts: metrics only.
        let last = blob.len() - 1;
        blob[last] ^= 0xff;
        assert_eq!(record_count(&blob), 5);
        // A truncated last batch counts 0; garbage and the empty blob count 0.
        assert_eq!(record_count(&blob[..blob.len() - 1]), 3);
        assert_eq!(record_count(&[0xffu8; 80]), 0);
        assert_eq!(record_count(&[]), 0);
    }
}
