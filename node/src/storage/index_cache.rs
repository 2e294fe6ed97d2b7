//! The shard's cache of sealed segments' index entries, bounded in bytes
//! (`log.index.cache.bytes`): a sealed segment keeps only its summary in memory, and its
//! `.index` / `.timeindex` entries are read from its files when a read needs them.
//!
//! Why: kept for as long as the log was open, the entries of every sealed segment cost
//! 1.5–6 MB of memory per GiB stored (at the default `index.interval.bytes`), without
//! bound. Kafka memory-maps them and lets the page cache decide; weir reads them into
//! this cache, least recently used first out.
//!
//! - Per shard (thread-local), as every log lives on one shard; the node's bound is
//!   divided among its shards, each share at least [`INDEX_CACHE_SHARD_BYTES_MIN`].
//!   Keyed by [`SegmentId`]: a segment gets a new id whenever its index files are
//!   written anew (a cleaned segment is a new `Segment`; a truncated one takes a new id
//!   when its index comes back into memory), and only ids whose index is in its files
//!   now are cached ([`live`]), so a load that finishes after its segment changed or
//!   left is dropped, never served. A segment dropped from its log drops its entry
//!   ([`forget`]).
//! - Loads read and decode both files in glommio's blocking pool, off the shard's thread.
//!   Concurrent loads of one index are one load: the others wait for it.
//! - Files that fail to decode (damaged) give an empty index, which is still correct: a
//!   sparse index with no entries makes reads scan the segment from its first byte; the
//!   next open of the log rebuilds the files (`open.rs`). A read that fails (a missing
//!   file, EMFILE, EIO) gives an empty index for that lookup only, not cached: the next
//!   lookup tries again.
//! - An index larger than the whole bound is used for the lookup that loaded it and not
//!   kept.
//! - Loads count against the bound while they run: each first reserves the bytes its
//!   index will be charged (from its files' sizes), evicting cached indexes to make room,
//!   and reads only once held plus reserved bytes fit the bound. Without it, many loads
//!   of distinct segments at once each held a read index beyond the bound until it was
//!   inserted (found by review). Loads that do not fit wait in arrival order (the first
//!   waiter is served first, so none is passed over forever); a running load needs no
//!   other to finish, so waiting cannot deadlock. A load larger than the whole bound
//!   (never cached) neither waits nor reserves, so it holds back no other. A waiting load dropped halfway leaves the queue and wakes the next.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::index::SegmentIndex;

/// Default `log.index.cache.bytes`: sealed segments' index entries the node keeps in
/// memory (divided among its shards). 256 MiB holds the indexes of 50–170 GiB of
/// segments at the default `index.interval.bytes` (a 1 GiB segment of 1 KiB batches
/// costs ~5 MiB, of 16 KiB batches ~1.5 MiB).
pub const INDEX_CACHE_BYTES_DEFAULT: u64 = 256 << 20;

/// The least a shard's share is: a share that cannot hold a few full segments' indexes
/// would read them again for every fetch (many shards dividing a small node bound).
pub const INDEX_CACHE_SHARD_BYTES_MIN: u64 = 16 << 20;

/// What one cached index costs beyond its entries (map slots, `Rc`, the two `Vec`s), so
/// that many small indexes also count against the bound.
const ENTRY_OVERHEAD_BYTES: u64 = 128;

/// Identifies one `Segment` in memory, for the index cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentId(u64);

impl SegmentId {
    /// A fresh id, never handed out before in this process.
    pub fn next() -> SegmentId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SegmentId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A sealed segment's index, loaded for one segment (its id).
#[derive(Clone, Debug)]
pub struct LoadedIndex {
    pub id: SegmentId,
    pub index: Rc<SegmentIndex>,
}

/// What loading a sealed segment's index needs: its id and files, and the bounds its
/// entries must stay within.
#[derive(Clone, Debug)]
pub struct IndexLoad {
    pub id: SegmentId,
    pub offsets_path: PathBuf,
    pub times_path: PathBuf,
    /// The `.log` file's size: every position indexed is below it.
    pub log_size: u64,
    /// Next offset − base: every relative offset indexed is below it.
    pub relative_end: u64,
}

impl IndexLoad {
    /// Reads and decodes the index files in glommio's blocking pool and caches the
    /// result. Files that cannot be read or decoded give an empty index (reads then scan
    /// the segment from its start), logged.
    pub async fn load(self) -> LoadedIndex {
        let id = self.id;
        // One load per index at a time: a load under way is waited for, then the cache
        // asked again (it may have been dropped as too large, or its segment changed).
        while let Some(busy) = CACHE.with(|c| c.borrow().loading.get(&id).cloned()) {
            busy.listen().await;
            if let Some(index) = get(id) {
                return LoadedIndex { id, index };
            }
        }
        let loading = Loading::start(id);
        let reservation = Reservation::take(self.files_charge().await).await;
        let (index, keep) = self.read_files().await;
        let index = Rc::new(index);
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            c.loads += 1;
            // The read index is in memory beside the held ones and the other loads'.
            let others = c.reserved_bytes - reservation.bytes;
            let now = c.held_bytes + others + charge(&index);
            c.peak_bytes = c.peak_bytes.max(now);
        });
        // Its reservation gives way to its entry with no await between: no other load
        // can take the bytes meanwhile.
        drop(reservation);
        if keep && is_live(id) {
            insert(id, index.clone());
        }
        drop(loading);
        LoadedIndex { id, index }
    }

    /// The bytes the index in this load's files will be charged, from their sizes (in
    /// the blocking pool, as the read). A file that cannot be stat'ed counts as empty:
    /// its read then fails too, and gives an empty index.
    async fn files_charge(&self) -> u64 {
        let (offsets, times) = (self.offsets_path.clone(), self.times_path.clone());
        glommio::executor()
            .spawn_blocking(move || {
                let len = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
                let entries = SegmentIndex::memory_bytes_of_files(len(&offsets), len(&times));
                entries.saturating_add(ENTRY_OVERHEAD_BYTES)
            })
            .await
    }

    /// The index the files hold, and whether to cache it: decoded, or empty for files
    /// that do not decode (cached: they stay damaged until the next open rebuilds them),
    /// or empty for a read that failed (not cached: it may succeed next time).
    async fn read_files(self) -> (SegmentIndex, bool) {
        let IndexLoad {
            offsets_path,
            times_path,
            log_size,
            relative_end,
            ..
        } = self;
        glommio::executor()
            .spawn_blocking(move || {
                let read = std::fs::read(&offsets_path)
                    .and_then(|o| std::fs::read(&times_path).map(|t| (o, t)));
                let (why, keep) = match read {
                    Ok((offsets, times)) => {
                        match SegmentIndex::decode(&offsets, &times, log_size.max(1), relative_end)
                        {
                            Ok(index) => return (index, true),
                            Err(invalid) => (invalid.0.to_string(), true),
                        }
                    }
                    Err(e) => (e.to_string(), false),
                };
                tracing::warn!(
                    index = %offsets_path.display(), reason = %why,
                    "sealed segment's index files cannot be used; this read scans the segment from its start"
                );
                (SegmentIndex::default(), keep)
            })
            .await
    }
}

/// A load under way: registered while it runs, and on its end (or its future dropped
/// halfway) unregistered and its waiters woken, so none waits for a load that is gone.
struct Loading {
    id: SegmentId,
    done: Rc<crate::event::Event>,
}

impl Loading {
    fn start(id: SegmentId) -> Loading {
        let done = Rc::new(crate::event::Event::default());
        CACHE.with(|c| c.borrow_mut().loading.insert(id, done.clone()));
        Loading { id, done }
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        let _ = CACHE.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                c.loading.remove(&self.id);
            }
        });
        self.done.notify_all();
    }
}

/// Bytes a load counts against the bound while it runs, from [`Reservation::take`] until
/// dropped (its index cached or let go, or its future dropped halfway).
struct Reservation {
    bytes: u64,
}

impl Reservation {
    /// Waits for its turn (loads are served in arrival order) and for `bytes` to fit
    /// beside the other loads' reservations, then reserves them, evicting cached indexes
    /// until held plus reserved bytes are within the bound. An index larger than the
    /// whole bound is never cached (see [`insert`]): its load neither waits nor reserves,
    /// so it does not hold back the loads queued behind it (with `log.index.cache.bytes`
    /// 0, every load).
    async fn take(bytes: u64) -> Reservation {
        if CACHE.with(|c| bytes > c.borrow().bound_bytes) {
            return Reservation { bytes: 0 };
        }
        let queued = Queued::join();
        loop {
            let changed = CACHE.with(|c| c.borrow().reservations_changed.clone());
            let next = changed.listen();
            if CACHE.with(|c| c.borrow_mut().try_reserve(queued.ticket, bytes)) {
                queued.served();
                return Reservation { bytes };
            }
            next.await;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let _ = CACHE.try_with(|c| {
            let borrowed = c.try_borrow_mut();
            debug_assert!(
                borrowed.is_ok(),
                "a reservation dropped inside a cache borrow"
            );
            if let Ok(mut c) = borrowed {
                c.reserved_bytes -= self.bytes;
                c.reservations_changed.notify_all();
            }
        });
    }
}

/// A load's place in the queue for reservations, left on drop (a load dropped while
/// waiting must not hold back the ones behind it).
struct Queued {
    ticket: u64,
    waiting: bool,
}

impl Queued {
    fn join() -> Queued {
        let ticket = CACHE.with(|c| {
            let mut c = c.borrow_mut();
            c.next_ticket += 1;
            let ticket = c.next_ticket;
            c.waiting.push_back(ticket);
            ticket
        });
        Queued {
            ticket,
            waiting: true,
        }
    }

    /// `try_reserve` took it off the queue.
    fn served(mut self) {
        self.waiting = false;
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if !self.waiting {
            return;
        }
        let _ = CACHE.try_with(|c| {
            let borrowed = c.try_borrow_mut();
            debug_assert!(
                borrowed.is_ok(),
                "a queued load dropped inside a cache borrow"
            );
            if let Ok(mut c) = borrowed {
                c.waiting.retain(|t| *t != self.ticket);
                c.reservations_changed.notify_all();
            }
        });
    }
}

/// How the calling shard's index cache is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexCacheStats {
    /// Bytes charged for the indexes held now (entries plus a fixed overhead each).
    pub held_bytes: u64,
    /// The bound on `held_bytes`.
    pub bound_bytes: u64,
    /// Indexes held now.
    pub indexes: u64,
    /// Indexes read from their files since the shard started.
    pub loads: u64,
    /// Indexes dropped to stay within the bound.
    pub evictions: u64,
    /// Bytes reserved by the loads running now (see [`IndexLoad::load`]).
    pub reserved_bytes: u64,
    /// The most bytes of index entries this shard had in memory at once since it
    /// started, as of each load's read: the held ones, the one just read, and the other
    /// running loads' reservations. Within the bound unless one index exceeds it alone.
    pub peak_bytes: u64,
}

struct Cached {
    index: Rc<SegmentIndex>,
    bytes: u64,
    used: u64,
}

/// Least recently used first out: `by_use` orders the ids by their last use.
struct IndexCache {
    bound_bytes: u64,
    held_bytes: u64,
    entries: HashMap<SegmentId, Cached>,
    by_use: BTreeMap<u64, SegmentId>,
    clock: u64,
    loads: u64,
    evictions: u64,
    /// Segments whose index is in their files now: the only ids a load may cache.
    live: std::collections::HashSet<SegmentId>,
    /// Loads under way, each with the event its waiters listen on.
    loading: HashMap<SegmentId, Rc<crate::event::Event>>,
    /// Bytes the running loads reserved: `held_bytes + reserved_bytes` stays within the
    /// bound (but for one load larger than it, running alone).
    reserved_bytes: u64,
    /// Loads waiting to reserve, by ticket, first come first served.
    waiting: std::collections::VecDeque<u64>,
    next_ticket: u64,
    /// Notified when a reservation ends, a waiter leaves or the bound changes.
    reservations_changed: Rc<crate::event::Event>,
    peak_bytes: u64,
}

thread_local! {
    static CACHE: RefCell<IndexCache> = RefCell::new(IndexCache {
        bound_bytes: INDEX_CACHE_BYTES_DEFAULT,
        held_bytes: 0,
        entries: HashMap::new(),
        by_use: BTreeMap::new(),
        clock: 0,
        loads: 0,
        evictions: 0,
        live: std::collections::HashSet::new(),
        loading: HashMap::new(),
        reserved_bytes: 0,
        waiting: std::collections::VecDeque::new(),
        next_ticket: 0,
        reservations_changed: Rc::new(crate::event::Event::default()),
        peak_bytes: 0,
    });
}

/// The bytes one index is charged.
fn charge(index: &SegmentIndex) -> u64 {
    index.memory_bytes() + ENTRY_OVERHEAD_BYTES
}

impl IndexCache {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn remove(&mut self, id: SegmentId) -> Option<Cached> {
        let cached = self.entries.remove(&id)?;
        self.by_use.remove(&cached.used);
        self.held_bytes -= cached.bytes;
        Some(cached)
    }

    /// Evicts the least recently used indexes until they and the running loads'
    /// reservations fit the bound, or none is left.
    fn evict_to_bound(&mut self) {
        let room = self.bound_bytes.saturating_sub(self.reserved_bytes);
        while self.held_bytes > room {
            let Some((_, id)) = self.by_use.pop_first() else {
                break;
            };
            if let Some(cached) = self.entries.remove(&id) {
                self.held_bytes -= cached.bytes;
                self.evictions += 1;
            }
        }
        assert!(
            self.held_bytes <= self.bound_bytes,
            "index cache over its bound"
        );
        debug_assert!(self.held_bytes <= room || self.entries.is_empty());
        debug_assert_eq!(self.entries.len(), self.by_use.len());
    }

    /// Reserves `bytes` for the load holding `ticket` if it is first in line and they
    /// fit beside the other reservations (or none runs); evicts to make room. Wakes the
    /// next in line, which may fit too.
    fn try_reserve(&mut self, ticket: u64, bytes: u64) -> bool {
        let first = self.waiting.front() == Some(&ticket);
        let fits = self.reserved_bytes.saturating_add(bytes) <= self.bound_bytes;
        if !first || !(fits || self.reserved_bytes == 0) {
            return false;
        }
        self.waiting.pop_front();
        self.reserved_bytes += bytes;
        self.evict_to_bound();
        self.reservations_changed.notify_all();
        true
    }
}

/// Sets the calling shard's bound (its share of `log.index.cache.bytes`); evicts at once
/// if it is now over it.
pub fn set_shard_index_cache_bytes(bytes: u64) {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        c.bound_bytes = bytes;
        c.evict_to_bound();
        c.reservations_changed.notify_all();
    });
}

/// The calling shard's cache: bytes held, bound, counts.
pub fn shard_index_cache_stats() -> IndexCacheStats {
    CACHE.with(|c| {
        let c = c.borrow();
        IndexCacheStats {
            held_bytes: c.held_bytes,
            bound_bytes: c.bound_bytes,
            indexes: c.entries.len() as u64,
            loads: c.loads,
            evictions: c.evictions,
            reserved_bytes: c.reserved_bytes,
            peak_bytes: c.peak_bytes,
        }
    })
}

/// The cached index of segment `id`, marked as just used.
pub fn get(id: SegmentId) -> Option<Rc<SegmentIndex>> {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let now = c.tick();
        let used = {
            let cached = c.entries.get_mut(&id)?;
            std::mem::replace(&mut cached.used, now)
        };
        c.by_use.remove(&used);
        c.by_use.insert(now, id);
        c.entries.get(&id).map(|cached| cached.index.clone())
    })
}

/// Caches `index` as segment `id`'s (replacing what was there), evicting the least
/// recently used ones past the bound. One larger than the whole bound is not kept.
pub fn insert(id: SegmentId, index: Rc<SegmentIndex>) {
    let bytes = charge(&index);
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        c.remove(id);
        if bytes > c.bound_bytes {
            return;
        }
        let used = c.tick();
        c.held_bytes += bytes;
        c.entries.insert(id, Cached { index, bytes, used });
        c.by_use.insert(used, id);
        c.evict_to_bound();
        c.peak_bytes = c.peak_bytes.max(c.held_bytes + c.reserved_bytes);
    });
}

/// Segment `id`'s index is in its files from now on: loads of it may be cached.
pub fn live(id: SegmentId) {
    CACHE.with(|c| c.borrow_mut().live.insert(id));
}

fn is_live(id: SegmentId) -> bool {
    CACHE.with(|c| c.borrow().live.contains(&id))
}

/// Drops segment `id`'s index (the segment left its log, or its index went back into
/// memory): a load of it still under way is not cached when it finishes. Quiet during
/// thread exit.
pub fn forget(id: SegmentId) {
    let _ = CACHE.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            c.live.remove(&id);
            c.remove(id);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::FilePosition;

    fn index_of(entries: u32) -> Rc<SegmentIndex> {
        let mut ix = SegmentIndex::default();
        for i in 0..entries {
            ix.push_offset(i, FilePosition(i * 100));
        }
        Rc::new(ix)
    }

    /// Index files for `entries` entries in `dir` under `name`, and the load of them.
    fn files(dir: &std::path::Path, name: &str, entries: u32) -> IndexLoad {
        let ix = index_of(entries);
        let (offsets, times) = (
            dir.join(format!("{name}.index")),
            dir.join(format!("{name}.timeindex")),
        );
        std::fs::write(&offsets, ix.encode_offsets()).unwrap();
        std::fs::write(&times, ix.encode_times()).unwrap();
        IndexLoad {
            id: SegmentId::next(),
            offsets_path: offsets,
            times_path: times,
            log_size: u64::from(entries) * 100 + 100,
            relative_end: u64::from(entries) + 1,
        }
    }

    /// Only indexes whose segment has them in its files now are cached: a load that ends
    /// after its segment's index went back into memory (a truncation) or left (retention)
    /// is used by no one, and a failed read is not cached (the next lookup reads again),
    /// while files that do not decode are (they stay damaged until the log reopens).
    #[test]
    fn a_load_is_cached_only_for_a_live_segment_and_only_when_read() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().to_path_buf();
        crate::storage::testing::run_on_shard(move || async move {
            set_shard_index_cache_bytes(1 << 20);
            let live_load = files(&dir, "a", 10);
            let id = live_load.id;
            live(id);
            let loaded = live_load.load().await;
            assert_eq!(loaded.index.offset_entry_count(), 10);
            assert!(get(id).is_some(), "a live segment's index is cached");

            let gone = files(&dir, "b", 10);
            let gone_id = gone.id;
            live(gone_id);
            let pending = gone.load();
            forget(gone_id); // the segment changed before the load ended
            assert_eq!(
                pending.await.index.offset_entry_count(),
                10,
                "the caller still gets it"
            );
            assert!(
                get(gone_id).is_none(),
                "a load for a forgotten segment is not cached"
            );

            let missing = files(&dir, "c", 10);
            std::fs::remove_file(&missing.offsets_path).unwrap();
            let missing_id = missing.id;
            live(missing_id);
            assert_eq!(missing.load().await.index.offset_entry_count(), 0, "scans");
            assert!(get(missing_id).is_none(), "a failed read is not cached");

            let damaged = files(&dir, "d", 10);
            std::fs::write(&damaged.offsets_path, b"garbage").unwrap();
            let damaged_id = damaged.id;
            live(damaged_id);
            assert_eq!(damaged.load().await.index.offset_entry_count(), 0);
            assert!(
                get(damaged_id).is_some(),
                "files that do not decode are cached empty"
            );
        });
    }

    /// Loads of one index at the same time read its files once.
    #[test]
    fn concurrent_loads_of_one_index_read_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().to_path_buf();
        crate::storage::testing::run_on_shard(move || async move {
            set_shard_index_cache_bytes(1 << 20);
            let load = files(&dir, "e", 50);
            live(load.id);
            let before = shard_index_cache_stats().loads;
            let all = (0..8).map(|_| Box::pin(load.clone().load()));
            let got = crate::event::join_all(all.collect()).await;
            assert!(got.iter().all(|l| l.index.offset_entry_count() == 50));
            assert_eq!(
                shard_index_cache_stats().loads - before,
                1,
                "one read of the files"
            );
        });
    }

    /// Loads of distinct indexes at once, more than the bound holds, one of them larger
    /// than the whole bound: each waits its turn for room (the large one, never cached,
    /// neither waits nor reserves), none waits forever, and held plus reserved bytes stay
    /// within the bound but for the large one while it is read.
    #[test]
    fn concurrent_loads_wait_for_room_in_turn_and_all_finish() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().to_path_buf();
        crate::storage::testing::run_on_shard(move || async move {
            let one = charge(&index_of(10));
            set_shard_index_cache_bytes(2 * one);
            let mut loads: Vec<IndexLoad> =
                (0..8).map(|i| files(&dir, &format!("s{i}"), 10)).collect();
            loads.insert(3, files(&dir, "big", 200));
            for l in &loads {
                live(l.id);
            }
            let all = loads.into_iter().map(|l| Box::pin(l.load()));
            let got = crate::event::join_all(all.collect()).await;
            let counts: Vec<usize> = got.iter().map(|l| l.index.offset_entry_count()).collect();
            assert_eq!(counts, [10, 10, 10, 200, 10, 10, 10, 10, 10]);
            let stats = shard_index_cache_stats();
            assert_eq!(stats.reserved_bytes, 0, "every reservation ended");
            assert!(stats.held_bytes <= 2 * one, "{stats:?}");
            // The large one, read beside the others, is counted while read.
            let big = charge(&index_of(200));
            assert!(stats.peak_bytes <= 2 * one + big, "{stats:?}");
            assert!(stats.indexes >= 1, "the last loads are cached: {stats:?}");
        });
    }

    #[test]
    fn least_recently_used_goes_first_and_the_bound_holds() {
        std::thread::spawn(|| {
            let one = charge(&index_of(10));
            set_shard_index_cache_bytes(2 * one);
            let (a, b, c) = (SegmentId::next(), SegmentId::next(), SegmentId::next());
            insert(a, index_of(10));
            insert(b, index_of(10));
            assert!(get(a).is_some(), "a used after b");
            insert(c, index_of(10));
            assert!(get(b).is_none(), "b was the least recently used");
            assert!(get(a).is_some() && get(c).is_some());
            let stats = shard_index_cache_stats();
            assert_eq!(stats.held_bytes, 2 * one);
            assert_eq!((stats.indexes, stats.evictions), (2, 1));
            // Larger than the whole bound: not kept, nothing else evicted for it.
            insert(SegmentId::next(), index_of(1000));
            assert_eq!(shard_index_cache_stats().indexes, 2);
            forget(a);
            assert_eq!(shard_index_cache_stats().held_bytes, one);
            set_shard_index_cache_bytes(0);
            assert_eq!(shard_index_cache_stats().held_bytes, 0);
        })
        .join()
        .unwrap();
    }
}
