//! Fetch: read the requested partitions on their owning shards, in request order, each
//! within what is left of the response budget (the smallest of the client's `max_bytes`,
//! the broker's `fetch.max.bytes` and the shard's share of
//! `fetch.response.buffer.max.bytes`), so nothing is read that will not be sent; the
//! bytes stay reserved until the connection has written the response (see
//! `fetch_budget`). If fewer than `min_bytes` are available, long-poll — each owning
//! shard parks a waiter on its partitions' append events (no polling) — until data
//! arrives or `max_wait_ms` passes, then read again. A partition named twice is answered
//! once (Kafka keys a fetch by partition), at the first entry's offset. KIP-227 fetch
//! sessions (see `fetch_session`): a full fetch may open one, an incremental fetch reads
//! every partition of its session and answers only those that changed.
//!
//! v13+ names topics by id (KIP-516): ids are resolved through a per-shard id → name map
//! rebuilt when the catalogue changes; an unknown id is answered UNKNOWN_TOPIC_ID under
//! that id. A Fetch with a replica id ≥ 0 (`replica_state` from v15) is a follower's: it
//! reads up to the leader's log end and tells the leader the follower's progress (see
//! `partition::read`). Every partition's `current_leader_epoch` is checked on the owner
//! (KIP-320); NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH carry the current leader from
//! the catalogue (KIP-951, v12+), with its endpoint at v16+.
//!
//! KIP-392 (fetch from the closest replica): a consumer's Fetch v11+ may be answered by a
//! follower, up to the HW that follower learned from its leader (see
//! `Partition::fetch_as_follower`); with `replica.selector.class` the rack-aware selector,
//! a leader answers a consumer in another rack with `preferred_read_replica` (an in-sync
//! follower in the client's `rack_id`) and no records, at once, and the client moves.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::FetchRequest;
use wire::WireError;
use wire::fetch::{
    AbortedTransaction, CurrentLeader, FetchPartitionResponse, FetchResponseParts,
    FetchTopicResponse, NodeEndpoint,
};

use super::Response;
use super::authz::Authz;
use super::fetch_budget::{self, Hold, ResponseBudget};
use super::fetch_session::{self, Answer, Context, FetchParams, PartKey, SessionFields, TopicKey};
use crate::config::Config;
use crate::errors;
use crate::event::Event;
use crate::metadata::Catalog;
use crate::partition::{FetchOutcome, Isolation, ReadFor};
use crate::proto::{self, Request};
use crate::router::ShardId;
use crate::security::acl::Operation;
use crate::shard::{CallError, ClientSite, FetchCall, FetchRead, Shard, TopicPartition, WaitCall};
use wire::{BrokerEpoch, LeaderEpoch, NodeId, Offset};

/// Longest long poll weir honours, whatever the client asks.
const MAX_WAIT_MS_CAP: u64 = 300_000;
/// Most partitions one Fetch may name (bounds the work one request causes).
pub(crate) const PARTITIONS_PER_FETCH_MAX: usize = 100_000;
/// Shortest wait for response budget, even when the long poll has no time left: under
/// load a fetch with `max_wait_ms` 0 waits a little instead of making its client spin.
const BUDGET_WAIT_MIN: Duration = Duration::from_millis(100);
/// How long an owner may take to read, beyond the long poll's own wait.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// One partition to read.
struct Wanted {
    /// The topic name; empty for an unknown topic id (never read).
    tp: TopicPartition,
    topic_id: u128,
    /// False for a topic id the catalogue does not know: answered UNKNOWN_TOPIC_ID.
    known: bool,
    /// This connection may not read it (now): answered TOPIC_AUTHORIZATION_FAILED. The
    /// request's own topics are checked before the session sees them; this covers the
    /// partitions an incremental session reads without the request naming them, so an
    /// ACL removed after the session began takes effect, as in Kafka.
    denied: bool,
    offset: Offset,
    max_bytes: usize,
    current_epoch: LeaderEpoch,
    last_fetched_epoch: LeaderEpoch,
    /// A follower's log start (for DeleteRecords' low watermark).
    log_start: Offset,
}

impl Wanted {
    /// Whether the partition is read (known and allowed).
    fn readable(&self) -> bool {
        self.known && !self.denied
    }
}

/// The replica id of a follower's fetch (v15 moved it into `replica_state`), -1 for a
/// consumer's.
fn replica_id(req: &FetchRequest, version: i16) -> i32 {
    if version >= 15 {
        req.replica_state.replica_id.0
    } else {
        req.replica_id.0
    }
}

/// Who reads: a follower (its replica id) or a consumer (its isolation level).
fn reader_of(req: &FetchRequest, version: i16) -> ReadFor {
    let replica = replica_id(req, version);
    if replica >= 0 {
        let epoch = if version >= 15 {
            BrokerEpoch(req.replica_state.replica_epoch)
        } else {
            BrokerEpoch::NONE
        };
        ReadFor::Follower(NodeId(replica), epoch)
    } else if req.isolation_level == 1 {
        ReadFor::Consumer(Isolation::ReadCommitted)
    } else {
        ReadFor::Consumer(Isolation::ReadUncommitted)
    }
}

/// The first Fetch version that names the client's rack and lets a follower answer a
/// consumer (KIP-392).
const FOLLOWER_FETCH_VERSION_MIN: i16 = 11;

/// KIP-392: whether a follower may answer this Fetch (a consumer's, v11+), and the
/// client's rack.
fn client_site(req: &FetchRequest, version: i16, listener: &str) -> ClientSite {
    let consumer = replica_id(req, version) < 0;
    ClientSite {
        followers_may_serve: consumer && version >= FOLLOWER_FETCH_VERSION_MIN,
        rack: Arc::from(req.rack_id.as_str().trim()),
        listener: Arc::from(listener),
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
    let denied = authorize(shard, &mut fetch, req.version, authz);
    let (mut parts, hold) = respond(shard, req.version, fetch, authz).await;
    // Each partition is answered once (one the session answered already, refused there
    // too, is not repeated; nor one named twice), and a request answers at most
    // PARTITIONS_PER_FETCH_MAX partitions, refused ones included. Looked up in a set: the
    // refused entries are the client's to multiply.
    let mut answered: HashSet<(Bytes, u128, i32)> = parts
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.topic.clone(), t.topic_id, p.partition_index))
        })
        .collect();
    let mut room = PARTITIONS_PER_FETCH_MAX.saturating_sub(answered.len());
    for (topic, topic_id, partitions) in denied {
        let partitions: Vec<i32> = partitions
            .into_iter()
            .filter(|i| answered.insert((topic.clone(), topic_id, *i)))
            .take(room)
            .collect();
        room -= partitions.len();
        if partitions.is_empty() {
            continue;
        }
        parts.topics.push(FetchTopicResponse {
            topic,
            topic_id,
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
fn authorize(
    shard: &Rc<Shard>,
    req: &mut FetchRequest,
    version: i16,
    authz: &Authz<'_>,
) -> Vec<(Bytes, u128, Vec<i32>)> {
    if !authz.enabled() {
        return Vec::new();
    }
    let follower = replica_id(req, version) >= 0;
    let cluster_ok = !follower || authz.cluster(Operation::ClusterAction);
    // v13+ names topics by id: the check is by name, so resolve it first (an unknown id
    // is left for `respond`, which answers UNKNOWN_TOPIC_ID).
    let ids = (version >= 13).then(|| topic_ids(&shard.catalog()));
    let mut denied = Vec::new();
    // Refused partitions kept for the answer: no more than one request may answer.
    let mut denied_partitions = 0usize;
    req.topics.retain(|t| {
        let id = t.topic_id.as_u128();
        let name: &str = match &ids {
            Some(ids) => match ids.get(&id) {
                Some(name) => name,
                None => return true,
            },
            None => t.topic.0.as_str(),
        };
        let ok = cluster_ok && (follower || authz.topic(Operation::Read, name));
        if !ok && denied_partitions < PARTITIONS_PER_FETCH_MAX {
            let name = Bytes::copy_from_slice(name.as_bytes());
            let id = if version >= 13 { id } else { 0 };
            let room = PARTITIONS_PER_FETCH_MAX - denied_partitions;
            let partitions: Vec<i32> = t
                .partitions
                .iter()
                .take(room)
                .map(|p| p.partition)
                .collect();
            denied_partitions += partitions.len();
            denied.push((name, id, partitions));
        }
        ok
    });
    denied
}

/// This shard's share of `fetch.response.buffer.max.bytes`.
fn shard_budget_bytes(config: &Config) -> u64 {
    (config.fetch_response_buffer_max_bytes / config.shards.max(1) as u64).max(1)
}

async fn respond(
    shard: &Rc<Shard>,
    version: i16,
    req: FetchRequest,
    authz: &Authz<'_>,
) -> (FetchResponseParts, Hold) {
    let reader = reader_of(&req, version);
    let catalog = shard.catalog();
    let ids = topic_ids(&catalog);
    let requested = requested_partitions(&req, version);
    let forgotten = forgotten_partitions(&req, version);
    let fields = SessionFields {
        version,
        session_id: req.session_id,
        epoch: req.session_epoch,
        follower: matches!(reader, ReadFor::Follower(..)),
    };
    let config = shard.config();
    let (slots, shards) = (
        config.fetch_session_cache_slots,
        config.shards.max(1) as u32,
    );
    let shard_index = shard.id.0 as u32;
    let (ctx, to_read) = fetch_session::with_cache(slots, shard_index, shards, |c| {
        let out = c.new_context(fields, requested, &forgotten, Instant::now());
        c.publish(shard.metrics());
        out
    });
    if let Context::Error(code) = ctx {
        tracing::debug!(
            session = req.session_id,
            epoch = req.session_epoch,
            code,
            "fetch session refused"
        );
        let parts = FetchResponseParts {
            error_code: code,
            session_id: fetch_session::INVALID_SESSION_ID,
            ..Default::default()
        };
        return (parts, Hold::empty());
    }
    let follower = matches!(reader, ReadFor::Follower(..));
    let allowed = |name: &str| match follower {
        true => authz.cluster(Operation::ClusterAction),
        false => authz.topic(Operation::Read, name),
    };
    let wanted: Vec<Wanted> = to_read
        .iter()
        .map(|(key, params)| {
            let mut w = wanted_of(key, params, &ids);
            w.denied = authz.enabled() && w.known && !allowed(&w.tp.0);
            w
        })
        .collect();
    let client = client_site(&req, version, authz.listener_name());
    let (outcomes, hold) = poll(shard, &req, &wanted, (reader, &client)).await;
    let answers: Vec<Answer> = outcomes.iter().map(answer_of).collect();
    let (session_id, include) = fetch_session::with_cache(slots, shard_index, shards, |c| {
        let out = c.finish(&ctx, &to_read, &answers, Instant::now());
        c.publish(shard.metrics());
        out
    });
    if matches!(ctx, Context::Full { .. }) && session_id != fetch_session::INVALID_SESSION_ID {
        tracing::debug!(
            session = session_id,
            partitions = wanted.len(),
            "fetch session created"
        );
    }
    count_out(shard, &wanted, &outcomes);
    let listener = authz.listener_name();
    let mut parts = build(&catalog, version, &wanted, outcomes, (&include, listener));
    parts.session_id = session_id;
    (parts, hold)
}

/// Reads `wanted`, long-polling until `min_bytes` are there, an error, or the deadline.
async fn poll(
    shard: &Rc<Shard>,
    req: &FetchRequest,
    wanted: &[Wanted],
    (reader, client): (ReadFor, &ClientSite),
) -> (Vec<FetchOutcome>, Hold) {
    let budget = fetch_budget::shard_budget(shard_budget_bytes(shard.config()));
    let max_bytes = (req.max_bytes.max(0) as u64)
        .min(shard.config().fetch_max_bytes)
        .min(budget.capacity_bytes());
    let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let min_bytes = req.min_bytes.max(0) as usize;
    let wait_ms = (req.max_wait_ms.max(0) as u64).min(MAX_WAIT_MS_CAP);
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut waited = Duration::ZERO;
    loop {
        let read = read_all(
            shard,
            &budget,
            wanted,
            (reader, client),
            max_bytes,
            deadline,
        )
        .await;
        // A follower whose answer would carry a newer log start than its last (the leader's
        // moved by DeleteRecords, whether this fetch was parked then or in transit) is
        // answered at once: DeleteRecords waits for every follower to report the new
        // start in its next fetch, and parking would hold it up to the follower's wait.
        let start_moved = read.outcomes.iter().any(|o| o.log_start_news);
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
        // A diverging epoch is answered at once (Kafka's hasDivergingEpoch): the follower
        // must truncate before anything else, and has nothing to wait for here. So is a
        // preferred read replica (Kafka's hasPreferredReadReplica): the client moves.
        let any_error = read.outcomes.iter().any(|o| {
            o.error != errors::NONE || o.diverging.is_some() || o.preferred_read_replica.is_some()
        });
        let now = Instant::now();
        let enough = min_bytes == 0 || total >= min_bytes;
        let answer_now = enough || any_error || start_moved || read.starved;
        if answer_now || now >= deadline || shard.shutting_down.get() {
            shard.metrics().fetch_waited(waited);
            return (read.outcomes, read.hold);
        }
        // Nothing is kept while parked: the bytes and their budget go back now.
        let waits = wait_list(shard, wanted, &read.outcomes, reader);
        drop(read);
        let parked = Instant::now();
        wait_for_data(shard, waits, reader, deadline).await;
        waited += parked.elapsed();
    }
}

/// What a session remembers of an outcome.
fn answer_of(o: &FetchOutcome) -> Answer {
    Answer {
        has_records: o.batches.iter().any(|b| !b.is_empty()),
        error: o.error,
        high_watermark: o.high_watermark.get(),
        last_stable_offset: o.last_stable_offset.get(),
        log_start_offset: o.log_start_offset.get(),
        diverging: o.diverging.is_some(),
        redirected: o.preferred_read_replica.is_some(),
    }
}

/// Topic names by topic id, of one catalogue snapshot.
type TopicIds = Rc<HashMap<u128, Arc<str>>>;

thread_local! {
    /// This shard's topic id → name map and the catalogue snapshot it was built from.
    static TOPIC_IDS: RefCell<Option<(Arc<Catalog>, TopicIds)>> = const { RefCell::new(None) };
}

/// The id → name map of `catalog`, rebuilt only when the catalogue changed.
pub(super) fn topic_ids(catalog: &Arc<Catalog>) -> TopicIds {
    TOPIC_IDS.with(|slot| {
        let mut slot = slot.borrow_mut();
        if let Some((c, map)) = slot.as_ref()
            && Arc::ptr_eq(c, catalog)
        {
            return map.clone();
        }
        let map: TopicIds = Rc::new(
            catalog
                .topics
                .values()
                .map(|t| (t.id, Arc::from(t.name.as_str())))
                .collect(),
        );
        *slot = Some((catalog.clone(), map.clone()));
        map
    })
}

/// A partition to read, from its session key.
fn wanted_of(key: &PartKey, p: &FetchParams, ids: &HashMap<u128, Arc<str>>) -> Wanted {
    let (name, topic_id, known) = match &key.0 {
        TopicKey::Name(name) => (name.clone(), 0, true),
        TopicKey::Id(id) => match ids.get(id) {
            Some(name) => (name.clone(), *id, true),
            None => (Arc::from(""), *id, false),
        },
    };
    Wanted {
        tp: (name, key.1),
        topic_id,
        known,
        denied: false,
        offset: p.offset,
        max_bytes: p.max_bytes,
        current_epoch: p.current_epoch,
        last_fetched_epoch: p.last_fetched_epoch,
        log_start: p.log_start,
    }
}

/// The request's forgotten partitions (incremental sessions), named as the request names
/// topics.
fn forgotten_partitions(req: &FetchRequest, version: i16) -> Vec<PartKey> {
    let mut out = Vec::new();
    for t in &req.forgotten_topics_data {
        let topic = topic_key(&t.topic.0, t.topic_id.as_u128(), version);
        for &p in &t.partitions {
            if out.len() >= PARTITIONS_PER_FETCH_MAX {
                return out;
            }
            out.push((topic.clone(), p));
        }
    }
    out
}

fn topic_key(name: &str, id: u128, version: i16) -> TopicKey {
    if version >= 13 {
        TopicKey::Id(id)
    } else {
        TopicKey::Name(Arc::from(name))
    }
}

/// The request's partitions in order, each once: a repeat of a partition already named
/// is dropped (Kafka answers each partition once, keyed by topic and index).
fn requested_partitions(req: &FetchRequest, version: i16) -> Vec<(PartKey, FetchParams)> {
    let mut seen: HashSet<PartKey> = HashSet::new();
    let mut wanted = Vec::new();
    for t in &req.topics {
        let topic = topic_key(&t.topic.0, t.topic_id.as_u128(), version);
        for p in &t.partitions {
            if wanted.len() >= PARTITIONS_PER_FETCH_MAX {
                return wanted;
            }
            let key: PartKey = (topic.clone(), p.partition);
            if seen.insert(key.clone()) {
                wanted.push((
                    key,
                    FetchParams {
                        offset: Offset(p.fetch_offset),
                        max_bytes: p.partition_max_bytes.max(0) as usize,
                        current_epoch: LeaderEpoch(p.current_leader_epoch),
                        last_fetched_epoch: LeaderEpoch(p.last_fetched_epoch),
                        log_start: Offset(p.log_start_offset),
                    },
                ));
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
    for (i, w) in wanted.iter().enumerate().filter(|(_, w)| w.readable()) {
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
    (reader, client): (ReadFor, &ClientSite),
    max_bytes: usize,
    deadline: Instant,
) -> Read {
    let mut read = Read {
        outcomes: wanted
            .iter()
            .map(|w| match (w.known, w.denied) {
                (false, _) => FetchOutcome::refused(errors::UNKNOWN_TOPIC_ID),
                (true, true) => FetchOutcome::refused(errors::TOPIC_AUTHORIZATION_FAILED),
                (true, false) => FetchOutcome::refused(errors::UNKNOWN_SERVER_ERROR),
            })
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
                topic_id: wanted[i].topic_id,
                offset: wanted[i].offset,
                max_bytes: wanted[i].max_bytes,
                current_epoch: wanted[i].current_epoch,
                last_fetched_epoch: wanted[i].last_fetched_epoch,
                log_start: wanted[i].log_start,
            })
            .collect();
        let call = FetchCall {
            reads,
            reader,
            budget_bytes: reserved,
            exceed_once: exceed_once && !read.starved,
            client: client.clone(),
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
    reader: ReadFor,
) -> BTreeMap<ShardId, Vec<(TopicPartition, Offset)>> {
    let mut by_owner: BTreeMap<ShardId, Vec<(TopicPartition, Offset)>> = BTreeMap::new();
    for (w, o) in wanted.iter().zip(outcomes) {
        // Only partitions read to their end can be woken by new data: those that returned
        // nothing, and those whose bytes reached their readable end (Kafka's DelayedFetch
        // counts every partition's bytes toward min_bytes, so an append to one that
        // already gave some must wake the poll too). A partition left empty by the
        // response budget has data already: it waits for an append past its current
        // high watermark, else its wait would end at once and the poll would spin.
        // Only a consumer's: a follower reads to the log end, which its outcome does not
        // carry, and waiting at the HW would wake at once and spin.
        let consumer = matches!(reader, ReadFor::Consumer(_));
        let read_to_end = o.batches.last().is_none_or(|last| {
            consumer
                && wire::batch::read_header(last).is_ok_and(|h| h.next_offset() >= readable_end(o))
        });
        if read_to_end && w.readable() {
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

/// The first Fetch version whose clients read zstd batches (KIP-110).
const ZSTD_FETCH_VERSION_MIN: i16 = 10;

/// Whether a stored batch is compressed with zstd.
fn is_zstd(batch: &[u8]) -> bool {
    wire::batch::read_header(batch)
        .is_ok_and(|h| h.attributes().compression() == Some(wire::batch::Compression::Zstd))
}

/// Adds what the response carries to each topic's bytes and records out.
/// KIP-392's counts too: redirects sent and reads a follower answered, once per answer
/// (a long poll reads several times).
fn count_out(shard: &Shard, wanted: &[Wanted], outcomes: &[FetchOutcome]) {
    for (w, o) in wanted.iter().zip(outcomes) {
        if o.preferred_read_replica.is_some() && o.error == crate::errors::NONE {
            crate::metrics::add(|m| &m.fetch_preferred_read_replica, 1);
        }
        if o.batches.is_empty() {
            continue;
        }
        let records: u64 = o
            .batches
            .iter()
            .map(|b| super::produce::record_count(b))
            .sum();
        shard.metrics().fetched(&w.tp.0, o.bytes() as u64, records);
        if o.from_follower {
            crate::metrics::add(|m| &m.fetch_follower_reads, 1);
            crate::metrics::add(|m| &m.fetch_follower_records, records);
        }
    }
}

/// Assembles the response in request order, grouping consecutive partitions by topic;
/// `include` leaves out the partitions an incremental session does not answer; leaders
/// named (KIP-951) are given at their address on the client's `listener`.
fn build(
    catalog: &Catalog,
    version: i16,
    wanted: &[Wanted],
    outcomes: Vec<FetchOutcome>,
    (include, listener): (&[bool], &str),
) -> FetchResponseParts {
    let mut topics: Vec<FetchTopicResponse> = Vec::new();
    let mut leaders: Vec<i32> = Vec::new();
    for ((w, o), _) in wanted
        .iter()
        .zip(outcomes)
        .zip(include)
        .filter(|(_, keep)| **keep)
    {
        let current_leader = match o.error {
            errors::NOT_LEADER_OR_FOLLOWER | errors::FENCED_LEADER_EPOCH => {
                current_leader(catalog, &w.tp)
            }
            _ => None,
        };
        if let Some(l) = current_leader
            && !leaders.contains(&l.leader_id)
        {
            leaders.push(l.leader_id);
        }
        // Kafka's rule (KIP-110): a client that fetches below v10 predates zstd and cannot
        // read it, so a partition whose answer holds a zstd batch is refused, not served.
        let refuse_zstd = version < ZSTD_FETCH_VERSION_MIN && o.batches.iter().any(|b| is_zstd(b));
        let o = match refuse_zstd {
            true => FetchOutcome {
                error: errors::UNSUPPORTED_COMPRESSION_TYPE,
                batches: Vec::new(),
                ..o
            },
            false => o,
        };
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
            current_leader,
            preferred_read_replica: o.preferred_read_replica.map_or(-1, |n| n.0),
            records: Some(o.batches),
        };
        match topics.last_mut() {
            Some(t) if t.topic.as_ref() == w.tp.0.as_bytes() && t.topic_id == w.topic_id => {
                t.partitions.push(p)
            }
            _ => topics.push(FetchTopicResponse {
                topic: Bytes::copy_from_slice(w.tp.0.as_bytes()),
                topic_id: w.topic_id,
                partitions: vec![p],
            }),
        }
    }
    let node_endpoints = if version >= 16 {
        leaders
            .iter()
            .filter_map(|id| {
                let (host, port) = catalog.nodes.get(id)?.address_for(listener)?;
                Some(NodeEndpoint {
                    node_id: *id,
                    host: Bytes::copy_from_slice(host.as_bytes()),
                    port: i32::from(port),
                    rack: None,
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    FetchResponseParts {
        topics,
        node_endpoints,
        ..Default::default()
    }
}

/// KIP-951: the partition's leader and epoch as the catalogue has them (a cluster only).
fn current_leader(catalog: &Catalog, tp: &TopicPartition) -> Option<CurrentLeader> {
    let t = catalog.topics.get(&*tp.0)?;
    let a = t.assignment.get(usize::try_from(tp.1).ok()?)?;
    (a.leader >= 0).then_some(CurrentLeader {
        leader_id: a.leader,
        leader_epoch: a.leader_epoch,
    })
}
