//! Fetch: read the requested partitions on their owning shards, in request order, each
//! within what is left of the response budget (the smallest of the client's `max_bytes`,
//! the broker's `fetch.max.bytes` and the shard's share of
//! `fetch.response.buffer.max.bytes`), so nothing is read that will not be sent; the
//! bytes stay reserved until the connection has written the response (see
//! `fetch_budget`). If fewer than `min_bytes` are available, long-poll — each owning
//! shard parks a waiter on its partitions' append events (no polling) — until data
//! arrives or `max_wait_ms` passes, then read again. A partition named twice is answered
//! once (Kafka keys a fetch by partition), at the first entry's offset. Fetch sessions
//! are answered without incremental support (session id 0), which tells clients to keep
//! sending full fetch requests.
//!
//! A Fetch with `replica_id` ≥ 0 is a follower's: it reads up to the leader's log end and
//! tells the leader the follower's progress (see `partition::read`). Every partition's
//! `current_leader_epoch` is checked on the owner (KIP-320).

use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::FetchRequest;
use wire::WireError;
use wire::fetch::{
    AbortedTransaction, FetchPartitionResponse, FetchResponseParts, FetchTopicResponse,
};

use super::Response;
use super::authz::Authz;
use super::fetch_budget::{self, Hold, ResponseBudget};
use crate::config::Config;
use crate::errors;
use crate::event::Event;
use crate::partition::{FetchOutcome, Isolation, ReadFor};
use crate::proto::{self, Request};
use crate::router::ShardId;
use crate::security::acl::Operation;
use crate::shard::{CallError, FetchCall, FetchRead, Shard, TopicPartition, WaitCall};
use wire::{LeaderEpoch, NodeId, Offset};

/// Longest long poll weir honours, whatever the client asks.
const MAX_WAIT_MS_CAP: u64 = 300_000;
/// Most partitions one Fetch may name (bounds the work one request causes).
const PARTITIONS_PER_FETCH_MAX: usize = 100_000;
/// Shortest wait for response budget, even when the long poll has no time left: under
/// load a fetch with `max_wait_ms` 0 waits a little instead of making its client spin.
const BUDGET_WAIT_MIN: Duration = Duration::from_millis(100);
/// How long an owner may take to read, beyond the long poll's own wait.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// One partition of the request.
struct Wanted {
    tp: TopicPartition,
    offset: Offset,
    max_bytes: usize,
    current_epoch: LeaderEpoch,
    last_fetched_epoch: LeaderEpoch,
}

/// Who reads: a follower (its `replica_id`) or a consumer (its isolation level).
fn reader_of(req: &FetchRequest) -> ReadFor {
    if req.replica_id.0 >= 0 {
        ReadFor::Follower(NodeId(req.replica_id.0))
    } else if req.isolation_level == 1 {
        ReadFor::Consumer(Isolation::ReadCommitted)
    } else {
        ReadFor::Consumer(Isolation::ReadUncommitted)
    }
}

/// What one pass over the partitions read, and the budget its bytes hold.
struct Read {
    outcomes: Vec<FetchOutcome>,
    hold: Hold,
    /// The budget did not come free in time: partitions were answered without reading.
    starved: bool,
}

/// Serves one Fetch request; the response is a chunk list whose record chunks are the
/// log's own buffers (no copy), ending with an empty chunk that holds the response's
/// budget until the connection has written it.
pub async fn handle(
    shard: &Rc<Shard>,
    req: &Request,
    authz: &Authz<'_>,
) -> Result<Response, WireError> {
    let mut fetch: FetchRequest = proto::decode(req)?;
    let denied = authorize(&mut fetch, authz);
    let (mut parts, hold) = respond(shard, fetch).await;
    for (topic, partitions) in denied {
        parts.topics.push(FetchTopicResponse {
            topic,
            partitions: partitions
                .into_iter()
                .map(|index| FetchPartitionResponse {
                    partition_index: index,
                    error_code: errors::TOPIC_AUTHORIZATION_FAILED,
                    high_watermark: -1,
                    last_stable_offset: -1,
                    log_start_offset: -1,
                    ..Default::default()
                })
                .collect(),
        });
    }
    let mut chunks = wire::fetch::encode_fetch_response(req.correlation_id, req.version, &parts)?;
    drop(parts);
    chunks.push(hold.into_chunk());
    Ok(Some(chunks))
}

/// Takes the topics this connection may not read out of `req`: a follower's fetch needs
/// ClusterAction on the cluster, a consumer's Read on each topic (Kafka answers both with
/// TOPIC_AUTHORIZATION_FAILED per partition). Returns them (name, partitions).
fn authorize(req: &mut FetchRequest, authz: &Authz<'_>) -> Vec<(Bytes, Vec<i32>)> {
    if !authz.enabled() {
        return Vec::new();
    }
    let follower = req.replica_id.0 >= 0;
    let cluster_ok = !follower || authz.cluster(Operation::ClusterAction);
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        let ok = cluster_ok && (follower || authz.topic(Operation::Read, t.topic.0.as_str()));
        if !ok {
            let name = Bytes::copy_from_slice(t.topic.0.as_bytes());
            denied.push((name, t.partitions.iter().map(|p| p.partition).collect()));
        }
        ok
    });
    denied
}

/// This shard's share of `fetch.response.buffer.max.bytes`.
fn shard_budget_bytes(config: &Config) -> u64 {
    (config.fetch_response_buffer_max_bytes / config.shards.max(1) as u64).max(1)
}

async fn respond(shard: &Rc<Shard>, req: FetchRequest) -> (FetchResponseParts, Hold) {
    let wanted = wanted_partitions(&req);
    let reader = reader_of(&req);
    let budget = fetch_budget::shard_budget(shard_budget_bytes(shard.config()));
    let max_bytes = (req.max_bytes.max(0) as u64)
        .min(shard.config().fetch_max_bytes)
        .min(budget.capacity_bytes());
    let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let min_bytes = req.min_bytes.max(0) as usize;
    let wait_ms = (req.max_wait_ms.max(0) as u64).min(MAX_WAIT_MS_CAP);
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    loop {
        let read = read_all(shard, &budget, &wanted, reader, max_bytes, deadline).await;
        let total: usize = read.outcomes.iter().map(FetchOutcome::bytes).sum();
        // KIP-74: only the first batch of the first partition with data may pass the limit.
        let first_batch = read
            .outcomes
            .iter()
            .find_map(|o| o.batches.first())
            .map_or(0, Bytes::len);
        assert!(
            total <= max_bytes.max(first_batch),
            "{total} record bytes for a {max_bytes} byte limit"
        );
        let any_error = read.outcomes.iter().any(|o| o.error != errors::NONE);
        let now = Instant::now();
        let enough = min_bytes == 0 || total >= min_bytes;
        if enough || any_error || read.starved || now >= deadline || shard.shutting_down.get() {
            count_out(shard, &wanted, &read.outcomes);
            return (build(&wanted, read.outcomes), read.hold);
        }
        // Nothing is kept while parked: the bytes and their budget go back now.
        let waits = wait_list(shard, &wanted, &read.outcomes);
        drop(read);
        wait_for_data(shard, waits, reader, deadline).await;
    }
}

/// The request's partitions in order, each once: a repeat of a (topic, partition) already
/// named is dropped (Kafka answers each partition once, keyed by name and index).
fn wanted_partitions(req: &FetchRequest) -> Vec<Wanted> {
    let mut seen: HashSet<TopicPartition> = HashSet::new();
    let mut wanted = Vec::new();
    for t in &req.topics {
        let name: Arc<str> = Arc::from(t.topic.0.as_str());
        for p in &t.partitions {
            if wanted.len() >= PARTITIONS_PER_FETCH_MAX {
                return wanted;
            }
            let tp: TopicPartition = (name.clone(), p.partition);
            if seen.insert(tp.clone()) {
                wanted.push(Wanted {
                    tp,
                    offset: Offset(p.fetch_offset),
                    max_bytes: p.partition_max_bytes.max(0) as usize,
                    current_epoch: LeaderEpoch(p.current_leader_epoch),
                    last_fetched_epoch: LeaderEpoch(p.last_fetched_epoch),
                });
            }
        }
    }
    wanted
}

/// The request's slots grouped by owning shard, owners in the order of their first
/// partition in the request.
fn by_owner(shard: &Shard, wanted: &[Wanted]) -> Vec<(ShardId, Vec<usize>)> {
    let mut groups: Vec<(ShardId, Vec<usize>)> = Vec::new();
    let mut index: BTreeMap<ShardId, usize> = BTreeMap::new();
    for (i, w) in wanted.iter().enumerate() {
        let owner = shard.router.owner(&w.tp.0, w.tp.1);
        let g = *index.entry(owner).or_insert_with(|| {
            groups.push((owner, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(i);
    }
    groups
}

/// Reads the partitions owner by owner, handing each owner what is left of `max_bytes`
/// after reserving it from the shard's `budget` (waiting while other responses hold it,
/// at most until the deadline). The first partition with data may exceed the limit by
/// its first batch (KIP-74), so a batch larger than the limit still makes progress.
async fn read_all(
    shard: &Rc<Shard>,
    budget: &ResponseBudget,
    wanted: &[Wanted],
    reader: ReadFor,
    max_bytes: usize,
    deadline: Instant,
) -> Read {
    let mut read = Read {
        outcomes: wanted
            .iter()
            .map(|_| FetchOutcome::refused(errors::UNKNOWN_SERVER_ERROR))
            .collect(),
        hold: Hold::empty(),
        starved: false,
    };
    let mut left = max_bytes;
    let mut exceed_once = true;
    for (owner, slots) in by_owner(shard, wanted) {
        let want = slots
            .iter()
            .fold(0usize, |sum, &i| {
                sum.saturating_add(wanted[i].max_bytes.min(left))
            })
            .min(left);
        let mut reserved = 0;
        if want > 0 && !read.starved {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .max(BUDGET_WAIT_MIN);
            match budget.reserve(want as u64, wait).await {
                Some(h) => {
                    reserved = h.bytes() as usize;
                    read.hold.merge(h);
                }
                None => read.starved = true,
            }
        }
        let reads = slots
            .iter()
            .map(|&i| FetchRead {
                tp: wanted[i].tp.clone(),
                offset: wanted[i].offset,
                max_bytes: wanted[i].max_bytes,
                current_epoch: wanted[i].current_epoch,
                last_fetched_epoch: wanted[i].last_fetched_epoch,
            })
            .collect();
        let call = FetchCall {
            reads,
            reader,
            budget_bytes: reserved,
            exceed_once: exceed_once && !read.starved,
        };
        let reply = shard.call(owner, call, deadline + READ_TIMEOUT).await;
        let got = place(&mut read.outcomes, &slots, reply);
        read.hold.settle(budget, reserved as u64, got as u64);
        exceed_once &= got == 0;
        left = left.saturating_sub(got);
    }
    read
}

/// Puts an owner's reply into the slots it answers; returns its record bytes.
fn place(
    outcomes: &mut [FetchOutcome],
    slots: &[usize],
    reply: Result<Vec<FetchOutcome>, CallError>,
) -> usize {
    match reply {
        Ok(got) if got.len() == slots.len() => {
            let mut bytes = 0;
            for (&slot, o) in slots.iter().zip(got) {
                bytes += o.bytes();
                outcomes[slot] = o;
            }
            bytes
        }
        Ok(got) => {
            debug_assert!(false, "{} outcomes for {} reads", got.len(), slots.len());
            0
        }
        Err(e) => {
            for &slot in slots {
                outcomes[slot] = FetchOutcome::refused(e.code());
            }
            0
        }
    }
}

/// The partitions a long poll waits on, by owner, each with the offset an append must
/// pass to wake it.
fn wait_list(
    shard: &Shard,
    wanted: &[Wanted],
    outcomes: &[FetchOutcome],
) -> BTreeMap<ShardId, Vec<(TopicPartition, Offset)>> {
    let mut by_owner: BTreeMap<ShardId, Vec<(TopicPartition, Offset)>> = BTreeMap::new();
    for (w, o) in wanted.iter().zip(outcomes) {
        // Only partitions read to their end can be woken by new data. A partition left
        // empty by the response budget has data already: it waits for an append past its
        // current high watermark, else its wait would end at once and the poll would spin.
        if o.batches.is_empty() {
            let owner = shard.router.owner(&w.tp.0, w.tp.1);
            by_owner
                .entry(owner)
                .or_default()
                .push((w.tp.clone(), w.offset.max(readable_end(o))));
        }
    }
    by_owner
}

/// Where a consumer's reading of this outcome stopped: the LSO for read_committed (its
/// outcome lists aborted transactions), else the HW.
fn readable_end(o: &FetchOutcome) -> Offset {
    if o.aborted.is_some() {
        o.last_stable_offset
    } else {
        o.high_watermark
    }
}

/// Parks until any partition in `waits` gets data past its offset, or the deadline.
async fn wait_for_data(
    shard: &Rc<Shard>,
    waits: BTreeMap<ShardId, Vec<(TopicPartition, Offset)>>,
    reader: ReadFor,
    deadline: Instant,
) {
    let woken = Rc::new(Event::default());
    let first = woken.listen();
    for (owner, tps) in waits {
        let (s, woken) = (shard.clone(), woken.clone());
        glommio::spawn_local(async move {
            // A wait that times out or is refused ends the same way: read again.
            let _ = s.call(owner, WaitCall { tps, reader }, deadline).await;
            woken.notify_all();
        })
        .detach();
    }
    let sleep = glommio::timer::sleep(deadline.saturating_duration_since(Instant::now()));
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

/// Adds what the response carries to each topic's bytes and records out.
fn count_out(shard: &Shard, wanted: &[Wanted], outcomes: &[FetchOutcome]) {
    for (w, o) in wanted.iter().zip(outcomes) {
        if o.batches.is_empty() {
            continue;
        }
        let records: u64 = o
            .batches
            .iter()
            .map(|b| super::produce::record_count(b))
            .sum();
        shard.metrics().fetched(&w.tp.0, o.bytes() as u64, records);
    }
}

/// Assembles the response in request order, grouping consecutive partitions by topic.
fn build(wanted: &[Wanted], outcomes: Vec<FetchOutcome>) -> FetchResponseParts {
    let mut topics: Vec<FetchTopicResponse> = Vec::new();
    for (w, o) in wanted.iter().zip(outcomes) {
        let p = FetchPartitionResponse {
            partition_index: w.tp.1,
            error_code: o.error,
            high_watermark: o.high_watermark.get(),
            last_stable_offset: o.last_stable_offset.get(),
            log_start_offset: o.log_start_offset.get(),
            aborted_transactions: o.aborted.map(|list| {
                list.into_iter()
                    .map(|(pid, first)| AbortedTransaction {
                        producer_id: pid.get(),
                        first_offset: first.get(),
                    })
                    .collect()
            }),
            diverging_epoch: o.diverging.map(|(epoch, end)| wire::fetch::DivergingEpoch {
                epoch: epoch.get(),
                end_offset: end.get(),
            }),
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
