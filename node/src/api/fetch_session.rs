//! KIP-227 incremental fetch sessions, as Kafka's `FetchSession` / `FetchSessionCache`:
//! a client that sends `session_epoch` 0 gets a session id (if a slot is free or can be
//! evicted); its next fetches name only the partitions whose fetch position changed, plus
//! `forgotten_topics_data`, at epoch 1, 2, ...; the broker fetches every partition of the
//! session and answers only those that changed (records, an error, a new high watermark,
//! last stable offset or log start offset, a diverging epoch). Epoch -1 closes the session
//! (and fetches sessionless); a full fetch (epoch 0 or -1) naming a session closes it.
//! Unknown id → FETCH_SESSION_ID_NOT_FOUND (70), wrong epoch → INVALID_FETCH_SESSION_EPOCH
//! (71), a session made with topic ids continued without them (or the reverse) →
//! FETCH_SESSION_TOPIC_ID_ERROR (106), each a top-level error with no partitions and
//! session id 0, as Kafka answers.
//!
//! Per shard, not node-wide: a connection lives on the shard that accepted it, so the
//! shard that receives a connection's next Fetch is the one that answered the last one,
//! and it finds the session in its own cache without a lock or a cross-shard call
//! (thread-per-core: the cache is `RefCell` state of that thread). A client that
//! reconnects and lands on another shard names an id that shard does not hold: it gets
//! FETCH_SESSION_ID_NOT_FOUND and starts a new session with a full fetch, exactly what it
//! does after an eviction (Java, librdkafka and kafka-python all handle 70 that way).
//! Session ids are unique node-wide (`id % shards == shard`), so a stale id is never
//! mistaken for another shard's session. `max.incremental.fetch.session.cache.slots` is
//! split evenly over the shards (at least one slot each unless it is 0, which disables
//! sessions).
//!
//! Eviction (Kafka's rule, simplified): when no slot is free, a session unused for
//! [`EVICTION_AFTER`] is evicted first (the oldest); otherwise the least valuable one —
//! ordered by (follower's, partition count) — is evicted if the new session is worth
//! strictly more (a follower's session always beats a consumer's). Kafka also breaks ties
//! by session id and only counts sessions older than the eviction time as stale; weir keeps
//! the (privileged, size) order and the staleness rule only. A new session that cannot get
//! a slot is answered with session id 0 (sessionless), and the client keeps sending full
//! fetches.
//!
//! Bounded memory: at most the shard's slots, at most [`SESSION_PARTITIONS_MAX`]
//! partitions a session (what one Fetch answers), and at most
//! [`SESSION_PARTITIONS_PER_SHARD_MAX`] cached partitions per shard. A full fetch that
//! would pass the shard's bound evicts sessions unused for [`EVICTION_AFTER`], then the
//! largest sessions bigger than itself (never a follower's for a consumer's), and gets no
//! session (sessionless answer) if that does not make room: so one client that fills the
//! bound with a few huge sessions of made-up partitions, and keeps them in use, cannot
//! keep every other client sessionless. An incremental fetch that would pass either bound
//! closes its session and is answered FETCH_SESSION_ID_NOT_FOUND, so the client falls back
//! to a full fetch.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wire::{LeaderEpoch, Offset};

use crate::errors;
use crate::metrics::ShardMetrics;

/// A request's `session_epoch` asking for a new (full) session.
pub const INITIAL_EPOCH: i32 = 0;
/// A request's `session_epoch` closing its session / asking for none.
pub const FINAL_EPOCH: i32 = -1;
/// The session id of "no session".
pub const INVALID_SESSION_ID: i32 = 0;
/// Kafka's `min.incremental.fetch.session.eviction.ms` (a constant in Kafka too): a session
/// unused this long may be evicted for any new one.
pub const EVICTION_AFTER: Duration = Duration::from_millis(120_000);
/// Most partitions all sessions of one shard cache together (~150 bytes each).
pub const SESSION_PARTITIONS_PER_SHARD_MAX: usize = 1_000_000;
/// Most partitions one session holds: what one Fetch may name (`fetch.rs`), so an
/// incremental fetch never makes the shard read more than a full one.
pub const SESSION_PARTITIONS_MAX: usize = super::fetch::PARTITIONS_PER_FETCH_MAX;
/// Tries to draw an unused session id before giving up (sessionless answer).
const ID_DRAWS_MAX: usize = 32;

/// How a session names a topic: by id (Fetch v13+) or by name (before).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TopicKey {
    Id(u128),
    Name(Arc<str>),
}

/// One partition of a session.
pub type PartKey = (TopicKey, i32);

/// What the client asked of one partition (the session remembers it between requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchParams {
    pub offset: Offset,
    pub max_bytes: usize,
    pub current_epoch: LeaderEpoch,
    pub last_fetched_epoch: LeaderEpoch,
    /// A follower's log start (-1 from consumers and before Fetch v5).
    pub log_start: Offset,
}

/// What the last response told the client about one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub has_records: bool,
    pub error: i16,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    pub diverging: bool,
    /// KIP-392: the partition was answered with a preferred read replica.
    pub redirected: bool,
}

#[derive(Clone, Debug)]
struct Cached {
    params: FetchParams,
    /// -1 until answered (and after an error): the next response includes the partition.
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
}

impl Cached {
    fn new(params: FetchParams) -> Cached {
        Cached {
            params,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
        }
    }

    /// Kafka's `CachedPartition.maybeUpdateResponseData`: whether the client must be told
    /// about this partition; remembers what it is told.
    fn must_respond(&mut self, a: &Answer) -> bool {
        let mut must = a.has_records || a.diverging || a.redirected;
        if self.high_watermark != a.high_watermark
            || self.last_stable_offset != a.last_stable_offset
            || self.log_start_offset != a.log_start_offset
        {
            must = true;
            self.high_watermark = a.high_watermark;
            self.last_stable_offset = a.last_stable_offset;
            self.log_start_offset = a.log_start_offset;
        }
        if a.error != errors::NONE {
            // Sent again once the error is gone.
            self.high_watermark = -1;
            must = true;
        }
        must
    }
}

struct Session {
    /// The epoch the client's next request must carry.
    epoch: i32,
    uses_topic_ids: bool,
    /// A follower's session (Kafka's "privileged").
    privileged: bool,
    last_used: Instant,
    /// In fetch order; a partition answered moves to the end (Kafka's fairness rule: the
    /// ones left out by `max_bytes` come first next time).
    partitions: Vec<(PartKey, Cached)>,
    index: HashMap<PartKey, usize>,
}

impl Session {
    fn reindex(&mut self) {
        self.index = self
            .partitions
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
    }

    fn requests(&self) -> Vec<(PartKey, FetchParams)> {
        self.partitions
            .iter()
            .map(|(k, c)| (k.clone(), c.params))
            .collect()
    }
}

/// Kafka's next epoch: wraps to 1 (0 and -1 mean "full").
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX { 1 } else { epoch + 1 }
}

/// What a Fetch request is, once its session fields are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Context {
    /// Answer every partition; no session (epoch -1, or sessions disabled).
    Sessionless,
    /// Answer every partition and try to make a session of them.
    Full {
        privileged: bool,
        uses_topic_ids: bool,
    },
    /// Answer the partitions of session `id` that changed.
    Incremental { id: i32 },
    /// A top-level error, no partitions, session id 0.
    Error(i16),
}

/// One shard's sessions.
pub struct SessionCache {
    slots: usize,
    shard: u32,
    shards: u32,
    sessions: HashMap<i32, Session>,
    /// Partitions cached by all sessions here.
    partitions: usize,
    evictions: u64,
    /// [`SESSION_PARTITIONS_MAX`] and [`SESSION_PARTITIONS_PER_SHARD_MAX`] (smaller in
    /// tests).
    session_partitions_max: usize,
    shard_partitions_max: usize,
}

/// A fetch's session fields.
#[derive(Clone, Copy, Debug)]
pub struct SessionFields {
    pub version: i16,
    pub session_id: i32,
    pub epoch: i32,
    pub follower: bool,
}

impl SessionCache {
    pub fn new(slots: usize, shard: u32, shards: u32) -> SessionCache {
        SessionCache {
            slots,
            shard,
            shards: shards.max(1),
            sessions: HashMap::new(),
            partitions: 0,
            evictions: 0,
            session_partitions_max: SESSION_PARTITIONS_MAX,
            shard_partitions_max: SESSION_PARTITIONS_PER_SHARD_MAX,
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Kafka's `FetchManager.newContext`: decides what kind of fetch this is and returns
    /// the partitions to read (for an incremental fetch: the whole session after the
    /// request's changes). `requested` and `forgotten` are the request's, in order.
    pub fn new_context(
        &mut self,
        f: SessionFields,
        requested: Vec<(PartKey, FetchParams)>,
        forgotten: &[PartKey],
        now: Instant,
    ) -> (Context, Vec<(PartKey, FetchParams)>) {
        let uses_topic_ids = f.version >= 13;
        if f.version < 7 || f.epoch == INITIAL_EPOCH || f.epoch == FINAL_EPOCH {
            // A full fetch closes the session it names.
            if f.session_id != INVALID_SESSION_ID {
                self.remove(f.session_id);
            }
            let ctx = if f.version < 7 || f.epoch == FINAL_EPOCH || self.slots == 0 {
                Context::Sessionless
            } else {
                Context::Full {
                    privileged: f.follower,
                    uses_topic_ids,
                }
            };
            return (ctx, requested);
        }
        let Some(session) = self.sessions.get_mut(&f.session_id) else {
            return (
                Context::Error(errors::FETCH_SESSION_ID_NOT_FOUND),
                Vec::new(),
            );
        };
        if session.epoch != f.epoch {
            return (
                Context::Error(errors::INVALID_FETCH_SESSION_EPOCH),
                Vec::new(),
            );
        }
        if session.uses_topic_ids != uses_topic_ids {
            return (
                Context::Error(errors::FETCH_SESSION_TOPIC_ID_ERROR),
                Vec::new(),
            );
        }
        let before = session.partitions.len();
        for (key, params) in requested {
            match session.index.get(&key) {
                Some(&i) => session.partitions[i].1.params = params,
                None => {
                    session.index.insert(key.clone(), session.partitions.len());
                    session.partitions.push((key, Cached::new(params)));
                }
            }
        }
        if !forgotten.is_empty() {
            let gone: std::collections::HashSet<&PartKey> = forgotten.iter().collect();
            session.partitions.retain(|(k, _)| !gone.contains(k));
            session.reindex();
        }
        let after = session.partitions.len();
        let total = self.partitions - before + after;
        // Counted as they are now, so removing the session below takes off what it holds.
        self.partitions = total;
        if after == 0 {
            // Kafka: an emptied session is removed and the fetch answered sessionless.
            self.remove(f.session_id);
            return (Context::Sessionless, Vec::new());
        }
        if total > self.shard_partitions_max || after > self.session_partitions_max {
            self.remove(f.session_id);
            return (
                Context::Error(errors::FETCH_SESSION_ID_NOT_FOUND),
                Vec::new(),
            );
        }
        session.epoch = next_epoch(session.epoch);
        session.last_used = now;
        let wanted = session.requests();
        (Context::Incremental { id: f.session_id }, wanted)
    }

    /// After the partitions were read: for a full fetch, tries to make a session of them
    /// (returns its id, or 0 if none could be had); for an incremental one, returns which
    /// partitions to answer (unchanged ones are left out) and remembers what they were
    /// told. `answers` are in the order `new_context` returned the partitions.
    pub fn finish(
        &mut self,
        ctx: &Context,
        partitions: &[(PartKey, FetchParams)],
        answers: &[Answer],
        now: Instant,
    ) -> (i32, Vec<bool>) {
        assert_eq!(partitions.len(), answers.len(), "one answer per partition");
        let all = vec![true; answers.len()];
        match ctx {
            Context::Sessionless | Context::Error(_) => (INVALID_SESSION_ID, all),
            Context::Full {
                privileged,
                uses_topic_ids,
            } => {
                let id = self.create(*privileged, *uses_topic_ids, partitions, answers, now);
                (id, all)
            }
            Context::Incremental { id } => {
                let Some(session) = self.sessions.get_mut(id) else {
                    // Evicted while this fetch read: answer everything; the client's next
                    // request gets FETCH_SESSION_ID_NOT_FOUND.
                    return (*id, all);
                };
                // The usual case: the session is as `new_context` left it, so partitions
                // and answers line up; idle partitions then cost one comparison each and
                // the index is rebuilt only if some partition moves to the end.
                let aligned = session.partitions.len() == partitions.len()
                    && session
                        .partitions
                        .iter()
                        .zip(partitions)
                        .all(|((a, _), (b, _))| a == b);
                if aligned {
                    let include: Vec<bool> = session
                        .partitions
                        .iter_mut()
                        .zip(answers)
                        .map(|((_, c), a)| c.must_respond(a))
                        .collect();
                    if include.iter().any(|i| *i) {
                        let old = std::mem::take(&mut session.partitions);
                        let (answered, mut kept): (Vec<_>, Vec<_>) =
                            old.into_iter().zip(&include).partition(|(_, i)| **i);
                        kept.extend(answered);
                        session.partitions = kept.into_iter().map(|(p, _)| p).collect();
                        session.reindex();
                    }
                    return (*id, include);
                }
                let mut include = Vec::with_capacity(answers.len());
                let mut answered = Vec::new();
                let mut kept = Vec::with_capacity(session.partitions.len());
                let mut by_key: HashMap<&PartKey, &Answer> = HashMap::with_capacity(answers.len());
                for ((k, _), a) in partitions.iter().zip(answers) {
                    by_key.insert(k, a);
                }
                for (k, mut c) in std::mem::take(&mut session.partitions) {
                    let must = by_key.get(&k).is_some_and(|a| c.must_respond(a));
                    if must {
                        answered.push((k, c));
                    } else {
                        kept.push((k, c));
                    }
                }
                let told: std::collections::HashSet<&PartKey> =
                    answered.iter().map(|(k, _)| k).collect();
                for (k, _) in partitions {
                    include.push(told.contains(k));
                }
                drop(told);
                kept.extend(answered);
                session.partitions = kept;
                session.reindex();
                (*id, include)
            }
        }
    }

    fn create(
        &mut self,
        privileged: bool,
        uses_topic_ids: bool,
        partitions: &[(PartKey, FetchParams)],
        answers: &[Answer],
        now: Instant,
    ) -> i32 {
        let size = partitions.len();
        if size == 0 || self.slots == 0 {
            return INVALID_SESSION_ID;
        }
        if self.sessions.len() >= self.slots && !self.evict_one(privileged, size, now) {
            return INVALID_SESSION_ID;
        }
        if size > self.session_partitions_max {
            return INVALID_SESSION_ID;
        }
        while self.partitions + size > self.shard_partitions_max {
            if !self.evict_for_room(privileged, size, now) {
                return INVALID_SESSION_ID;
            }
        }
        let Some(id) = self.draw_id() else {
            return INVALID_SESSION_ID;
        };
        let mut cached: Vec<(PartKey, Cached)> = Vec::with_capacity(size);
        for ((k, params), a) in partitions.iter().zip(answers) {
            let mut c = Cached::new(*params);
            c.must_respond(a);
            cached.push((k.clone(), c));
        }
        let mut session = Session {
            epoch: next_epoch(INITIAL_EPOCH),
            uses_topic_ids,
            privileged,
            last_used: now,
            partitions: cached,
            index: HashMap::new(),
        };
        session.reindex();
        // A partition named twice is read once (the caller dedups): sizes agree.
        self.partitions += session.partitions.len();
        self.sessions.insert(id, session);
        assert!(
            self.sessions.len() <= self.slots,
            "sessions within the slots"
        );
        id
    }

    /// Frees a slot for a new session of `size` partitions, by Kafka's rule (see the module
    /// doc). Returns whether one was freed.
    fn evict_one(&mut self, privileged: bool, size: usize, now: Instant) -> bool {
        let victim = self.stalest(now).or_else(|| {
            self.sessions
                .iter()
                .filter(|(_, s)| privileged || !s.privileged)
                .min_by_key(|(id, s)| (s.privileged, s.partitions.len(), **id))
                .filter(|(_, s)| (privileged, size) > (s.privileged, s.partitions.len()))
                .map(|(id, _)| *id)
        });
        self.evict(victim)
    }

    /// Frees partitions of the shard's bound for a new session of `size`: a stale session
    /// (the oldest), else the largest one bigger than the new one that it may displace
    /// (a consumer's never displaces a follower's). Returns whether one was evicted.
    fn evict_for_room(&mut self, privileged: bool, size: usize, now: Instant) -> bool {
        let victim = self.stalest(now).or_else(|| {
            self.sessions
                .iter()
                .filter(|(_, s)| (privileged || !s.privileged) && s.partitions.len() > size)
                .max_by_key(|(id, s)| (s.partitions.len(), **id))
                .map(|(id, _)| *id)
        });
        self.evict(victim)
    }

    /// The session unused longest, if unused for [`EVICTION_AFTER`].
    fn stalest(&self, now: Instant) -> Option<i32> {
        self.sessions
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.last_used) > EVICTION_AFTER)
            .min_by_key(|(_, s)| s.last_used)
            .map(|(id, _)| *id)
    }

    /// Evicts `victim`, if any; whether it did.
    fn evict(&mut self, victim: Option<i32>) -> bool {
        match victim {
            Some(id) => {
                self.remove(id);
                self.evictions += 1;
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, id: i32) -> bool {
        match self.sessions.remove(&id) {
            Some(s) => {
                assert!(s.partitions.len() <= self.partitions, "partition count");
                self.partitions -= s.partitions.len();
                true
            }
            None => false,
        }
    }

    /// A random positive id not in use, with `id % shards == shard` (unique node-wide).
    fn draw_id(&self) -> Option<i32> {
        let span = (i32::MAX as u32) / self.shards;
        for _ in 0..ID_DRAWS_MAX {
            let k = rand::random::<u32>() % span.max(1);
            let id = i32::try_from(k * self.shards + self.shard).ok()?;
            if id != INVALID_SESSION_ID && !self.sessions.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// Publishes the cache's size to the shard's metrics.
    pub fn publish(&self, m: &ShardMetrics) {
        m.fetch_sessions
            .store(self.sessions.len() as u64, Ordering::Relaxed);
        m.fetch_session_partitions
            .store(self.partitions as u64, Ordering::Relaxed);
        m.fetch_session_evictions
            .store(self.evictions, Ordering::Relaxed);
    }
}

thread_local! {
    /// The sessions of the shard running on this thread (one executor per thread).
    static SHARD_SESSIONS: RefCell<Option<SessionCache>> = const { RefCell::new(None) };
}

/// Runs `f` on this shard's session cache, creating it on first use. `f` must not await.
pub fn with_cache<T>(
    slots_total: u64,
    shard: u32,
    shards: u32,
    f: impl FnOnce(&mut SessionCache) -> T,
) -> T {
    SHARD_SESSIONS.with(|slot| {
        let mut slot = slot.borrow_mut();
        let cache = slot.get_or_insert_with(|| {
            let per_shard = if slots_total == 0 {
                0
            } else {
                (slots_total / u64::from(shards.max(1))).max(1)
            };
            SessionCache::new(usize::try_from(per_shard).unwrap_or(0), shard, shards)
        });
        f(cache)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: i32) -> PartKey {
        (TopicKey::Name(Arc::from("t")), p)
    }

    fn params(offset: i64) -> FetchParams {
        FetchParams {
            offset: Offset(offset),
            max_bytes: 1024,
            current_epoch: LeaderEpoch(-1),
            last_fetched_epoch: LeaderEpoch(-1),
            log_start: Offset(-1),
        }
    }

    fn answer(hw: i64, records: bool) -> Answer {
        Answer {
            has_records: records,
            error: errors::NONE,
            high_watermark: hw,
            last_stable_offset: hw,
            log_start_offset: 0,
            diverging: false,
            redirected: false,
        }
    }

    fn fields(id: i32, epoch: i32) -> SessionFields {
        SessionFields {
            version: 12,
            session_id: id,
            epoch,
            follower: false,
        }
    }

    #[test]
    fn full_then_incremental_skips_unchanged_and_checks_epochs() {
        let now = Instant::now();
        let mut c = SessionCache::new(1, 0, 1);
        let req = vec![(key(0), params(0)), (key(1), params(0))];
        let (ctx, parts) = c.new_context(fields(0, 0), req, &[], now);
        let (id, include) = c.finish(&ctx, &parts, &[answer(5, true), answer(0, false)], now);
        assert_ne!(id, 0);
        assert_eq!(include, vec![true, true]);
        // Incremental, partition 0 moved on; partition 1 unchanged.
        let (ctx, parts) = c.new_context(fields(id, 1), vec![(key(0), params(5))], &[], now);
        assert_eq!(ctx, Context::Incremental { id });
        assert_eq!(parts.len(), 2);
        let answers: Vec<Answer> = parts.iter().map(|_| answer(5, false)).collect();
        let (_, include) = c.finish(&ctx, &parts, &answers, now);
        let answered: Vec<i32> = parts
            .iter()
            .zip(&include)
            .filter(|(_, i)| **i)
            .map(|((k, _), _)| k.1)
            .collect();
        assert_eq!(
            answered,
            vec![1],
            "only partition 1's high watermark moved (0 → 5)"
        );
        // Replay of epoch 1 → 71; unknown id → 70.
        let (ctx, _) = c.new_context(fields(id, 1), Vec::new(), &[], now);
        assert_eq!(ctx, Context::Error(errors::INVALID_FETCH_SESSION_EPOCH));
        let (ctx, _) = c.new_context(fields(id ^ 0x10, 2), Vec::new(), &[], now);
        assert_eq!(ctx, Context::Error(errors::FETCH_SESSION_ID_NOT_FOUND));
        // Cache full: a new session of equal size is not created.
        let req = vec![(key(0), params(0)), (key(1), params(0))];
        let (ctx, parts) = c.new_context(fields(0, 0), req, &[], now);
        let (other, _) = c.finish(&ctx, &parts, &[answer(5, false), answer(5, false)], now);
        assert_eq!(other, 0);
        // Forgetting every partition ends the session.
        let (ctx, _) = c.new_context(fields(id, 2), Vec::new(), &[key(0), key(1)], now);
        assert_eq!(ctx, Context::Sessionless);
        assert!(c.is_empty());
        assert_eq!(c.partitions, 0);
    }

    fn requests(range: std::ops::Range<i32>) -> Vec<(PartKey, FetchParams)> {
        range.map(|p| (key(p), params(0))).collect()
    }

    /// A full fetch of `req` on `c`: the session id it got (0: none).
    fn full(c: &mut SessionCache, req: Vec<(PartKey, FetchParams)>, now: Instant) -> i32 {
        let (ctx, parts) = c.new_context(fields(0, 0), req, &[], now);
        let answers: Vec<Answer> = parts.iter().map(|_| answer(0, false)).collect();
        c.finish(&ctx, &parts, &answers, now).0
    }

    #[test]
    fn a_client_holding_the_shards_partitions_cannot_keep_others_sessionless() {
        let now = Instant::now();
        let mut c = SessionCache::new(10, 0, 1);
        c.session_partitions_max = 100;
        c.shard_partitions_max = 250;
        // A session grown past its own bound by incremental fetches is closed.
        let hog = full(&mut c, requests(0..60), now);
        assert_ne!(hog, 0);
        let (ctx, _) = c.new_context(fields(hog, 1), requests(60..101), &[], now);
        assert_eq!(ctx, Context::Error(errors::FETCH_SESSION_ID_NOT_FOUND));
        assert_eq!(c.partitions, 0);
        // Two sessions of 100 and one of 50 fill the shard's bound.
        let big1 = full(&mut c, requests(0..100), now);
        let big2 = full(&mut c, requests(100..200), now);
        let mid = full(&mut c, requests(200..250), now);
        assert!(big1 != 0 && big2 != 0 && mid != 0);
        assert_eq!(c.partitions, 250);
        // A small newcomer displaces the largest session, not a smaller one.
        let small = full(&mut c, requests(0..10), now);
        assert_ne!(small, 0);
        assert_eq!(c.len(), 3);
        assert_eq!(c.partitions, 160);
        assert!(c.sessions.contains_key(&mid) && c.sessions.contains_key(&small));
        // A consumer never displaces a follower's session.
        let mut c = SessionCache::new(10, 0, 1);
        c.shard_partitions_max = 100;
        let (ctx, parts) = c.new_context(
            SessionFields {
                follower: true,
                ..fields(0, 0)
            },
            requests(0..100),
            &[],
            now,
        );
        let answers: Vec<Answer> = parts.iter().map(|_| answer(0, false)).collect();
        let follower = c.finish(&ctx, &parts, &answers, now).0;
        assert_ne!(follower, 0);
        assert_eq!(full(&mut c, requests(0..10), now), 0, "no room, none made");
        assert!(c.sessions.contains_key(&follower));
    }

    #[test]
    fn stale_and_smaller_sessions_are_evicted() {
        let now = Instant::now();
        let mut c = SessionCache::new(1, 0, 1);
        let one = vec![(key(0), params(0))];
        let (ctx, parts) = c.new_context(fields(0, 0), one.clone(), &[], now);
        let (small, _) = c.finish(&ctx, &parts, &[answer(0, false)], now);
        assert_ne!(small, 0);
        let two = vec![(key(0), params(0)), (key(1), params(0))];
        let (ctx, parts) = c.new_context(fields(0, 0), two, &[], now);
        let (big, _) = c.finish(&ctx, &parts, &[answer(0, false), answer(0, false)], now);
        assert_ne!(big, 0, "a bigger session evicts a smaller one");
        assert_eq!(c.len(), 1);
        let later = now + EVICTION_AFTER + Duration::from_secs(1);
        let (ctx, parts) = c.new_context(fields(0, 0), one, &[], later);
        let (fresh, _) = c.finish(&ctx, &parts, &[answer(0, false)], later);
        assert_ne!(fresh, 0, "a stale session is evicted for any new one");
        assert_eq!(c.evictions, 2);
    }
}
