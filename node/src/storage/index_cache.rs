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
//!   divided among its shards. Keyed by [`SegmentId`], unique per segment in memory: a
//!   cleaned or truncated segment is a new `Segment` with a new id, so no entry is ever
//!   served for index files that changed since they were read. A segment dropped from its
//!   log drops its entry ([`forget`]).
//! - Loads read and decode both files in glommio's blocking pool, off the shard's thread.
//! - Files that fail to read or decode (damaged, removed) give an empty index, which is
//!   still correct: a sparse index with no entries makes reads scan the segment from its
//!   first byte. The next open of the log rebuilds the files (`open.rs`).
//! - An index larger than the whole bound is used for the lookup that loaded it and not
//!   kept.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::index::SegmentIndex;

/// Default `log.index.cache.bytes`: sealed segments' index entries the node keeps in
/// memory (divided among its shards). 64 MiB holds the indexes of 10–40 GiB of segments
/// at the default `index.interval.bytes`.
pub const INDEX_CACHE_BYTES_DEFAULT: u64 = 64 << 20;

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
        let IndexLoad {
            id,
            offsets_path,
            times_path,
            log_size,
            relative_end,
        } = self;
        let index = glommio::executor()
            .spawn_blocking(move || {
                let read = std::fs::read(&offsets_path)
                    .and_then(|o| std::fs::read(&times_path).map(|t| (o, t)));
                let why = match read {
                    Ok((offsets, times)) => {
                        match SegmentIndex::decode(&offsets, &times, log_size.max(1), relative_end)
                        {
                            Ok(index) => return index,
                            Err(invalid) => invalid.0.to_string(),
                        }
                    }
                    Err(e) => e.to_string(),
                };
                tracing::warn!(
                    index = %offsets_path.display(), reason = %why,
                    "sealed segment's index files cannot be used; reads scan the segment from its start until the log is reopened"
                );
                SegmentIndex::default()
            })
            .await;
        let index = Rc::new(index);
        insert(id, index.clone());
        CACHE.with(|c| c.borrow_mut().loads += 1);
        LoadedIndex { id, index }
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

    fn evict_to_bound(&mut self) {
        while self.held_bytes > self.bound_bytes {
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
        debug_assert_eq!(self.entries.len(), self.by_use.len());
    }
}

/// Sets the calling shard's bound (`log.index.cache.bytes` divided among the shards);
/// evicts at once if it is now over it.
pub fn set_shard_index_cache_bytes(bytes: u64) {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        c.bound_bytes = bytes;
        c.evict_to_bound();
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
    });
}

/// Drops segment `id`'s index (the segment left its log). Quiet during thread exit.
pub fn forget(id: SegmentId) {
    let _ = CACHE.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
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
