//! Fetch: read every requested partition on its owning shard; if fewer than `min_bytes`
//! are available, long-poll — each owning shard parks a waiter on its partitions'
//! append events (no polling) — until data arrives or `max_wait_ms` passes, then read
//! again. Fetch sessions are answered without incremental support (session id 0), which
//! tells clients to keep sending full fetch requests.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::FetchRequest;
use wire::WireError;
use wire::fetch::{FetchPartitionResponse, FetchResponseParts, FetchTopicResponse};

use super::Response;
use crate::errors;
use crate::event::Event;
use crate::partition::FetchOutcome;
use crate::proto::{self, Request};
use crate::router::ShardId;
use crate::shard::{FetchRead, Op, Reply, Shard, TopicPartition};

/// Longest long poll weir honours, whatever the client asks.
const MAX_WAIT_MS_CAP: u64 = 300_000;
/// Most partitions one Fetch may name (bounds the work one request causes).
const PARTITIONS_PER_FETCH_MAX: usize = 100_000;

/// One partition of the request.
struct Wanted {
    tp: TopicPartition,
    offset: i64,
    max_bytes: usize,
}

/// Serves one Fetch request; the response is a chunk list whose record chunks are the
/// log's own buffers (no copy).
pub async fn handle(shard: &Rc<Shard>, req: &Request) -> Result<Response, WireError> {
    let fetch: FetchRequest = proto::decode(req)?;
    let parts = respond(shard, fetch).await;
    let chunks = wire::fetch::encode_fetch_response(req.correlation_id, req.version, &parts)?;
    Ok(Some(chunks))
}

async fn respond(shard: &Rc<Shard>, req: FetchRequest) -> FetchResponseParts {
    let wanted: Vec<Wanted> = req
        .topics
        .iter()
        .flat_map(|t| {
            let name: Arc<str> = Arc::from(t.topic.0.as_str());
            t.partitions.iter().map(move |p| Wanted {
                tp: (name.clone(), p.partition),
                offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes.max(0) as usize,
            })
        })
        .take(PARTITIONS_PER_FETCH_MAX)
        .collect();
    let max_bytes = req.max_bytes.max(0) as usize;
    let min_bytes = req.min_bytes.max(0) as usize;
    let wait_ms = (req.max_wait_ms.max(0) as u64).min(MAX_WAIT_MS_CAP);
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    loop {
        let outcomes = read_all(shard, &wanted, max_bytes).await;
        let total: usize = outcomes.iter().map(FetchOutcome::bytes).sum();
        let any_error = outcomes.iter().any(|o| o.error != errors::NONE);
        let now = Instant::now();
        let enough = min_bytes == 0 || total >= min_bytes;
        if enough || any_error || now >= deadline || shard.shutting_down.get() {
            return build(&wanted, outcomes);
        }
        wait_for_data(shard, &wanted, &outcomes, deadline - now).await;
    }
}

/// Reads all partitions concurrently; the response budget `max_bytes` is then applied in
/// request order (the first non-empty partition is always kept whole, as Kafka does).
async fn read_all(shard: &Rc<Shard>, wanted: &[Wanted], max_bytes: usize) -> Vec<FetchOutcome> {
    // One message per owning shard, carrying all its partitions.
    let mut by_owner: BTreeMap<ShardId, Vec<(usize, FetchRead)>> = BTreeMap::new();
    for (i, w) in wanted.iter().enumerate() {
        let read = FetchRead {
            tp: w.tp.clone(),
            offset: w.offset,
            max_bytes: w.max_bytes.min(max_bytes.max(1)),
        };
        let owner = shard.router.owner(&w.tp.0, w.tp.1);
        by_owner.entry(owner).or_default().push((i, read));
    }
    let tasks: Vec<_> = by_owner
        .into_values()
        .map(|group| {
            let s = shard.clone();
            let (slots, reads): (Vec<usize>, Vec<FetchRead>) = group.into_iter().unzip();
            let owner = s.router.owner(&reads[0].tp.0, reads[0].tp.1);
            let task =
                glommio::spawn_local(async move { s.call(owner, Op::Fetch { reads }).await });
            (slots, task)
        })
        .collect();
    let mut outcomes: Vec<FetchOutcome> = wanted
        .iter()
        .map(|_| FetchOutcome::refused(errors::UNKNOWN_SERVER_ERROR))
        .collect();
    for (slots, task) in tasks {
        match task.await {
            Reply::Fetch(got) if got.len() == slots.len() => {
                for (slot, o) in slots.into_iter().zip(got) {
                    outcomes[slot] = o;
                }
            }
            Reply::Refused(code) => slots
                .into_iter()
                .for_each(|slot| outcomes[slot] = FetchOutcome::refused(code)),
            _ => {}
        }
    }
    apply_budget(&mut outcomes, max_bytes);
    outcomes
}

/// The response budget `max_bytes`, in request order: a partition whose data would exceed
/// it is answered empty, except that the first non-empty partition is always kept whole
/// (as Kafka does, so a batch larger than the budget still makes progress).
fn apply_budget(outcomes: &mut [FetchOutcome], max_bytes: usize) {
    let mut budget = max_bytes;
    let mut first = true;
    for o in outcomes.iter_mut() {
        let size = o.bytes();
        if size > budget && !(first && size > 0) {
            o.batches.clear();
        } else {
            budget = budget.saturating_sub(size);
            first &= size == 0;
        }
    }
}

/// Parks until any partition in the request gets data past its fetch offset, or timeout.
async fn wait_for_data(
    shard: &Rc<Shard>,
    wanted: &[Wanted],
    outcomes: &[FetchOutcome],
    timeout: Duration,
) {
    let mut by_owner: BTreeMap<ShardId, Vec<(TopicPartition, i64)>> = BTreeMap::new();
    for (w, o) in wanted.iter().zip(outcomes) {
        // Only partitions read to their end can be woken by new data. A partition left
        // empty by the response budget has data already: it waits for an append past its
        // current high watermark, else its wait would end at once and the poll would spin.
        if o.batches.is_empty() {
            let owner = shard.router.owner(&w.tp.0, w.tp.1);
            by_owner
                .entry(owner)
                .or_default()
                .push((w.tp.clone(), w.offset.max(o.high_watermark)));
        }
    }
    let woken = Rc::new(Event::default());
    let first = woken.listen();
    let timeout_ms = timeout.as_millis().min(u128::from(MAX_WAIT_MS_CAP)) as u64;
    for (owner, tps) in by_owner {
        let (s, woken) = (shard.clone(), woken.clone());
        glommio::spawn_local(async move {
            s.call(owner, Op::Wait { tps, timeout_ms }).await;
            woken.notify_all();
        })
        .detach();
    }
    let sleep = glommio::timer::sleep(timeout);
    let stop = shard.shutdown.listen();
    if shard.shutting_down.get() {
        return;
    }
    let woken_or_stopped = futures_lite::future::or(first, stop);
    futures_lite::future::or(woken_or_stopped, async {
        sleep.await;
    })
    .await;
}

/// Assembles the response in request order, grouping consecutive partitions by topic.
fn build(wanted: &[Wanted], outcomes: Vec<FetchOutcome>) -> FetchResponseParts {
    let mut topics: Vec<FetchTopicResponse> = Vec::new();
    for (w, o) in wanted.iter().zip(outcomes) {
        let p = FetchPartitionResponse {
            partition_index: w.tp.1,
            error_code: o.error,
            high_watermark: o.high_watermark,
            last_stable_offset: o.last_stable_offset,
            log_start_offset: o.log_start_offset,
            records: Some(o.batches),
            ..Default::default()
        };
        match topics.last_mut() {
            Some(t) if t.topic.as_ref() == w.tp.0.as_bytes() => t.partitions.push(p),
            _ => topics.push(FetchTopicResponse {
                topic: Bytes::copy_from_slice(w.tp.0.as_bytes()),
                partitions: vec![p],
            }),
        }
    }
    // Session id 0: no incremental fetch session was created; clients keep sending full
    // fetch requests.
    FetchResponseParts {
        session_id: 0,
        topics,
        ..Default::default()
    }
}
