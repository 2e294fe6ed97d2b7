//! Producer ids for InitProducerId (idempotent producers, and new ids of the transaction
//! coordinator): unique across restarts of the node, and KIP-360 epoch bumps for a
//! producer that asks with its current id+epoch.
//!
//! In a cluster (`controller.quorum.voters`) ids come from the controller: each shard
//! takes blocks of [`PRODUCER_ID_BLOCK_SIZE`] that `Command::AllocateProducerIds`
//! reserves from a counter in the replicated catalogue (Kafka's AllocateProducerIds,
//! KIP-730; [`ControllerBlocks`]), from [`CONTROLLER_FIRST_PRODUCER_ID`] up, above every
//! id of the per-shard ranges below (which a cluster used before the counter existed).
//! Nothing about them is in the data dir: a node back with a wiped one never hands out an
//! id anyone handed out before. The rest of this doc is the single node's allocator.
//!
//! On a single node each shard hands out ids from its own fixed range ([`IdRange::for_shard`]), so
//! shards never coordinate and a change in the number of shards cannot make two shards
//! overlap. Within its range an allocator persists a high-water mark in blocks of
//! [`PRODUCER_ID_BLOCK_SIZE`]: before the first id of a block is handed out, the end of
//! the block is written durably; after a restart allocation resumes at that end, so ids
//! handed out before a crash are never handed out again (at most one block is skipped).
//! Without a block file (a new node, or one back with a wiped data dir) an allocator
//! starts at a random block of the first half of its range, not at its start, so a
//! wiped node most likely does not hand out again the ids its producers still hold
//! (likely, not certainly: only the cluster's counter makes it certain).
//!
//! Block file (`producer-id-block.<shard>` in the data dir), 28 bytes, big-endian:
//!
//! | off | size | field                                            |
//! |----:|-----:|--------------------------------------------------|
//! |   0 |    4 | magic `WPID`                                     |
//! |   4 |    2 | version = 1                                      |
//! |   6 |    2 | reserved, 0                                      |
//! |   8 |    8 | range start (must match the allocator's range)   |
//! |  16 |    8 | next unreserved id: every id below it may have been handed out |
//! |  24 |    4 | CRC-32C of bytes 0..24                           |
//!
//! Epoch bumps: Kafka itself answers a non-transactional InitProducerId with a fresh id
//! every time. weir follows KIP-360's rule instead (the issue asks for it): a request with
//! an id this allocator issued and its current epoch gets the same id with epoch + 1; a
//! retry of that request (the previous epoch) gets the current epoch again; any other
//! epoch is fenced. The bump records are memory only (bounded, expiring); after a restart
//! an id's first bump request is trusted, which is safe because partitions fence every
//! epoch older than the newest they have seen. In a cluster a shard bumps only ids of the
//! blocks it took in this run ([`REMEMBERED_BLOCKS`]); any other id gets a fresh one.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use zerocopy::byteorder::big_endian::{I64, U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use wire::{ProducerEpoch, ProducerId};

use super::{INVALID_PRODUCER_EPOCH, PRODUCER_FENCED};
use crate::storage::{StorageError, write_atomic};

/// Ids reserved per durable write (Kafka's controller also hands out blocks of 1000).
pub const PRODUCER_ID_BLOCK_SIZE: i64 = 1000;
/// Most bump records kept per allocator; least recently used go first.
pub const MAX_BUMP_RECORDS: usize = 10_000;
/// Bits of a producer id given to the per-shard counter: 2^37 ≈ 1.4 × 10^11 ids per shard.
const COUNTER_BITS: u32 = 37;
/// Bits for the shard (up to 1024 shards per node); the node id takes the bits above.
const SHARD_BITS: u32 = 10;
/// Bits for the node id (`config::NODE_ID_MAX`), the top of a per-shard range's id.
const NODE_BITS: u32 = 15;
const BLOCK_FILE_MAGIC: [u8; 4] = *b"WPID";
const BLOCK_FILE_VERSION: u16 = 1;

/// A half-open range of producer ids owned by one allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRange {
    pub start: i64,
    pub end: i64,
}

impl IdRange {
    /// The range of `shard` on node `node_id`: node (15 bits) | shard (10 bits) | counter
    /// (37 bits), 62 bits in all, so every id is a positive i64. `None` if either is out of
    /// range.
    pub fn for_shard(node_id: i32, shard: u32) -> Option<IdRange> {
        if !(0..(1 << NODE_BITS)).contains(&node_id) || shard >= (1 << SHARD_BITS) {
            return None;
        }
        let start = (i64::from(node_id) << (SHARD_BITS + COUNTER_BITS))
            | (i64::from(shard) << COUNTER_BITS);
        Some(IdRange {
            start,
            end: start + (1 << COUNTER_BITS),
        })
    }

    pub fn contains(&self, id: i64) -> bool {
        (self.start..self.end).contains(&id)
    }
}

/// The block file's name for a shard.
pub fn block_file_name(shard: u32) -> String {
    format!("producer-id-block.{shard}")
}

/// Why InitProducerId could not be answered with an id.
#[derive(Debug, thiserror::Error)]
pub enum AllocatorError {
    #[error("producer id block file {path}: {reason}")]
    Corrupt { path: PathBuf, reason: &'static str },
    #[error("producer id range {start}..{end} is exhausted")]
    Exhausted { start: i64, end: i64 },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// What InitProducerId answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitProducerIdOutcome {
    Granted {
        producer_id: ProducerId,
        epoch: ProducerEpoch,
    },
    /// The request's epoch is neither the current nor the previous one of that id.
    Fenced { error_code: i16 },
}

/// The error code for a fenced InitProducerId: PRODUCER_FENCED exists from v4 (KIP-588);
/// older clients get INVALID_PRODUCER_EPOCH, as Kafka's broker does.
pub fn fenced_error_code(api_version: i16) -> i16 {
    if api_version >= 4 {
        PRODUCER_FENCED
    } else {
        INVALID_PRODUCER_EPOCH
    }
}

#[derive(Clone, Copy, Debug)]
struct BumpRecord {
    current: ProducerEpoch,
    previous: ProducerEpoch,
    last_used_ms: i64,
}

/// The KIP-360 bump records of the ids one allocator issued (bounded, expiring).
#[derive(Debug, Default)]
struct EpochBumps {
    records: HashMap<ProducerId, BumpRecord>,
}

impl EpochBumps {
    /// KIP-360 for an id the allocator issued; `None` when the epoch is exhausted (a
    /// fresh id then).
    fn bump(
        &mut self,
        pid: ProducerId,
        epoch: ProducerEpoch,
        api_version: i16,
        now_ms: i64,
    ) -> Option<InitProducerIdOutcome> {
        let granted = |e: ProducerEpoch| InitProducerIdOutcome::Granted {
            producer_id: pid,
            epoch: e,
        };
        if let Some(record) = self.records.get_mut(&pid) {
            record.last_used_ms = now_ms;
            if epoch == record.previous {
                return Some(granted(record.current));
            }
            if epoch != record.current {
                return Some(InitProducerIdOutcome::Fenced {
                    error_code: fenced_error_code(api_version),
                });
            }
        }
        // Kafka treats an epoch at i16::MAX - 1 as exhausted: the producer gets a new id.
        if epoch.0 >= i16::MAX - 1 {
            self.records.remove(&pid);
            return None;
        }
        let next = ProducerEpoch(epoch.0 + 1);
        self.remember(pid, next, epoch, now_ms);
        Some(granted(next))
    }

    fn remember(
        &mut self,
        pid: ProducerId,
        current: ProducerEpoch,
        previous: ProducerEpoch,
        now_ms: i64,
    ) {
        if !self.records.contains_key(&pid) && self.records.len() >= MAX_BUMP_RECORDS {
            let oldest = self
                .records
                .iter()
                .min_by_key(|(_, r)| r.last_used_ms)
                .map(|(p, _)| *p);
            if let Some(oldest) = oldest {
                self.records.remove(&oldest);
            }
        }
        self.records.insert(
            pid,
            BumpRecord {
                current,
                previous,
                last_used_ms: now_ms,
            },
        );
    }

    fn expire(&mut self, now_ms: i64, expiration_ms: i64) {
        self.records
            .retain(|_, r| now_ms.saturating_sub(r.last_used_ms) < expiration_ms);
    }
}

/// Pure allocation state: the ids of the reserved block and the bump records. The caller
/// persists blocks ([`ProducerIdBlockFile`] does both).
#[derive(Debug)]
pub struct ProducerIdAllocator {
    range: IdRange,
    next: i64,
    reserved_end: i64,
    bumps: EpochBumps,
}

impl ProducerIdAllocator {
    /// An allocator whose ids below `next` may already have been handed out, with no
    /// block reserved yet.
    pub fn new(range: IdRange, next: i64) -> ProducerIdAllocator {
        assert!(range.start <= next && next <= range.end);
        ProducerIdAllocator {
            range,
            next,
            reserved_end: next,
            bumps: EpochBumps::default(),
        }
    }

    /// Whether the next new id needs a block reserved first.
    pub fn needs_block(&self) -> bool {
        self.next >= self.reserved_end
    }

    /// The end of the next block to reserve (write it durably, then [`Self::install_block`]).
    pub fn next_block_end(&self) -> Result<i64, AllocatorError> {
        if self.next >= self.range.end {
            return Err(AllocatorError::Exhausted {
                start: self.range.start,
                end: self.range.end,
            });
        }
        Ok((self.next + PRODUCER_ID_BLOCK_SIZE).min(self.range.end))
    }

    /// Makes ids up to `end` (exclusive) available, once `end` is durable.
    pub fn install_block(&mut self, end: i64) {
        assert!(end > self.next && end <= self.range.end);
        self.reserved_end = end;
    }

    /// Answers InitProducerId (no transactional id). `requested` is the id and epoch the
    /// request carries (v3+; `None` or id -1 for a new producer). Returns `Ok(None)` when a
    /// block must be reserved first.
    pub fn init_producer_id(
        &mut self,
        requested: Option<(ProducerId, ProducerEpoch)>,
        api_version: i16,
        now_ms: i64,
    ) -> Option<InitProducerIdOutcome> {
        let known = requested.filter(|(p, e)| self.issued(*p) && e.0 >= 0);
        if let Some(outcome) = known.and_then(|(p, e)| self.bumps.bump(p, e, api_version, now_ms)) {
            return Some(outcome);
        }
        self.fresh_id()
    }

    fn issued(&self, pid: ProducerId) -> bool {
        self.range.contains(pid.get()) && pid.get() < self.next
    }

    fn fresh_id(&mut self) -> Option<InitProducerIdOutcome> {
        if self.needs_block() {
            return None;
        }
        let pid = ProducerId(self.next);
        self.next += 1;
        debug_assert!(self.next <= self.reserved_end);
        Some(InitProducerIdOutcome::Granted {
            producer_id: pid,
            epoch: ProducerEpoch(0),
        })
    }

    /// Forgets bump records unused for `expiration_ms` (`producer.id.expiration.ms`).
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) {
        self.bumps.expire(now_ms, expiration_ms);
    }

    pub fn range(&self) -> IdRange {
        self.range
    }
}

/// The first id the controller hands out in a cluster: above every id a per-shard range
/// ([`IdRange::for_shard`], node id in the 15 bits below it) can hold, so ids from the
/// controller never meet one a node handed out from its own range before the cluster
/// had the counter (an upgrade), and 2^62 ids remain above it.
pub const CONTROLLER_FIRST_PRODUCER_ID: i64 = 1 << (NODE_BITS + SHARD_BITS + COUNTER_BITS);
/// Blocks taken from the controller remembered for KIP-360 bumps (a million ids); an id
/// of an older block, or of a block another shard or node got, gets a fresh id.
pub const REMEMBERED_BLOCKS: usize = 1000;
/// The next block is asked for once fewer ids than this remain (Kafka's broker asks at
/// 90 % of its block), so InitProducerId rarely waits for the controller.
pub const PREFETCH_WHEN_LEFT: i64 = PRODUCER_ID_BLOCK_SIZE / 10;

/// A cluster shard's ids: blocks of [`PRODUCER_ID_BLOCK_SIZE`] the controller reserved
/// for it (`Command::AllocateProducerIds`, a counter in the replicated catalogue), so no
/// id is ever handed out twice, whatever happens to the node's data dir. Pure state; the
/// caller asks the controller.
#[derive(Debug, Default)]
pub struct ControllerBlocks {
    /// The block ids are handed out from: (next id, end).
    current: Option<(i64, i64)>,
    /// A block got ahead of need, used once `current` runs out.
    spare: Option<i64>,
    /// Starts of the blocks ids were handed out from, newest last (at most
    /// [`REMEMBERED_BLOCKS`]); the newest is `current`'s.
    used: std::collections::VecDeque<i64>,
    bumps: EpochBumps,
}

impl ControllerBlocks {
    /// Whether a block should be asked for now: none is spare and the current one is
    /// (nearly) used up.
    pub fn wants_block(&self) -> bool {
        self.spare.is_none()
            && self
                .current
                .is_none_or(|(next, end)| end - next < PREFETCH_WHEN_LEFT)
    }

    /// Whether a new id can be handed out without a block from the controller.
    pub fn has_ids(&self) -> bool {
        self.spare.is_some() || self.current.is_some_and(|(next, end)| next < end)
    }

    /// Adds the block starting at `start` the controller reserved. A block beyond the
    /// one spare slot (two asks crossed) is dropped: its ids are never handed out, which
    /// costs nothing but ids.
    pub fn add_block(&mut self, start: i64) {
        if self.spare.is_none() {
            self.spare = Some(start);
        }
    }

    /// [`ProducerIdAllocator::init_producer_id`] over the controller's blocks; `None`
    /// when no id is left until a block arrives.
    pub fn init_producer_id(
        &mut self,
        requested: Option<(ProducerId, ProducerEpoch)>,
        api_version: i16,
        now_ms: i64,
    ) -> Option<InitProducerIdOutcome> {
        let known = requested.filter(|(p, e)| self.issued(*p) && e.0 >= 0);
        if let Some(outcome) = known.and_then(|(p, e)| self.bumps.bump(p, e, api_version, now_ms)) {
            return Some(outcome);
        }
        if self.current.is_none_or(|(next, end)| next >= end) {
            let start = self.spare.take()?;
            self.current = Some((start, start.saturating_add(PRODUCER_ID_BLOCK_SIZE)));
            if self.used.len() >= REMEMBERED_BLOCKS {
                self.used.pop_front();
            }
            self.used.push_back(start);
        }
        let (next, end) = self.current?;
        self.current = Some((next + 1, end));
        Some(InitProducerIdOutcome::Granted {
            producer_id: ProducerId(next),
            epoch: ProducerEpoch(0),
        })
    }

    /// Whether `pid` was handed out from one of the remembered blocks.
    fn issued(&self, pid: ProducerId) -> bool {
        let id = pid.get();
        let newest = self.used.back().copied();
        self.used.iter().any(|&start| {
            let end = match self.current {
                Some((next, _)) if Some(start) == newest => next,
                _ => start.saturating_add(PRODUCER_ID_BLOCK_SIZE),
            };
            (start..end).contains(&id)
        })
    }
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct BlockFile {
    magic: [u8; 4],
    version: U16,
    reserved: U16,
    range_start: I64,
    next_unreserved: I64,
    crc: U32,
}

const BLOCK_FILE_SIZE: usize = size_of::<BlockFile>();
const _: () = assert!(BLOCK_FILE_SIZE == 28);

/// Where an allocator without a block file starts: a random block in the first half of
/// its range. A missing file is not only a new node: it is also a node back with a wiped
/// (or replaced) data dir, whose ids the partitions still remember with their producers'
/// sequences. Starting at the range's start handed those ids out again, and a new
/// producer given an old one was refused with OUT_OF_ORDER_SEQUENCE_NUMBER on its first
/// batch, or had a batch taken for the old producer's duplicate. The chance of landing
/// in the span a wiped node used is that span over 2^36 ids.
fn fresh_start(range: IdRange) -> i64 {
    let blocks = ((range.end - range.start) / 2 / PRODUCER_ID_BLOCK_SIZE).max(1);
    range.start + rand::random_range(0..blocks) * PRODUCER_ID_BLOCK_SIZE
}

/// An allocator backed by its block file: reserves a block durably whenever one is
/// needed (one small atomic write per [`PRODUCER_ID_BLOCK_SIZE`] producers; blocking std
/// I/O, acceptable at that rate).
#[derive(Debug)]
pub struct ProducerIdBlockFile {
    path: PathBuf,
    allocator: ProducerIdAllocator,
}

impl ProducerIdBlockFile {
    /// Opens (or creates) the block file of `range` in `dir`. A missing file means no id
    /// was ever handed out; a damaged one stops startup, since uniqueness could not be
    /// guaranteed after it.
    pub fn open(
        dir: &Path,
        shard: u32,
        range: IdRange,
    ) -> Result<ProducerIdBlockFile, AllocatorError> {
        let path = dir.join(block_file_name(shard));
        let next = match std::fs::read(&path) {
            Ok(bytes) => {
                decode_block_file(&bytes, range).map_err(|reason| AllocatorError::Corrupt {
                    path: path.clone(),
                    reason,
                })?
            }
            Err(e) if e.kind() == ErrorKind::NotFound => fresh_start(range),
            Err(e) => return Err(StorageError::io("read", &path, e).into()),
        };
        Ok(ProducerIdBlockFile {
            path,
            allocator: ProducerIdAllocator::new(range, next),
        })
    }

    /// InitProducerId: see [`ProducerIdAllocator::init_producer_id`].
    pub fn init_producer_id(
        &mut self,
        requested: Option<(ProducerId, ProducerEpoch)>,
        api_version: i16,
        now_ms: i64,
    ) -> Result<InitProducerIdOutcome, AllocatorError> {
        if let Some(outcome) = self
            .allocator
            .init_producer_id(requested, api_version, now_ms)
        {
            return Ok(outcome);
        }
        self.reserve_block()?;
        self.allocator
            .init_producer_id(requested, api_version, now_ms)
            .ok_or(AllocatorError::Corrupt {
                path: self.path.clone(),
                reason: "no id available right after reserving a block",
            })
    }

    fn reserve_block(&mut self) -> Result<(), AllocatorError> {
        let end = self.allocator.next_block_end()?;
        write_atomic(&self.path, &encode_block_file(self.allocator.range, end))?;
        self.allocator.install_block(end);
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn encode_block_file(range: IdRange, next_unreserved: i64) -> Vec<u8> {
    let mut file = BlockFile {
        magic: BLOCK_FILE_MAGIC,
        version: U16::new(BLOCK_FILE_VERSION),
        reserved: U16::new(0),
        range_start: I64::new(range.start),
        next_unreserved: I64::new(next_unreserved),
        crc: U32::new(0),
    };
    let crc = crc32c::crc32c(&file.as_bytes()[..BLOCK_FILE_SIZE - 4]);
    file.crc = U32::new(crc);
    file.as_bytes().to_vec()
}

fn decode_block_file(bytes: &[u8], range: IdRange) -> Result<i64, &'static str> {
    if bytes.len() != BLOCK_FILE_SIZE {
        return Err("wrong size");
    }
    let file = BlockFile::read_from_bytes(bytes).map_err(|_| "wrong size")?;
    if file.magic != BLOCK_FILE_MAGIC {
        return Err("bad magic");
    }
    if file.version.get() != BLOCK_FILE_VERSION {
        return Err("unsupported version");
    }
    if crc32c::crc32c(&bytes[..BLOCK_FILE_SIZE - 4]) != file.crc.get() {
        return Err("CRC mismatch");
    }
    if file.range_start.get() != range.start {
        return Err("belongs to another node id or shard");
    }
    let next = file.next_unreserved.get();
    if !(range.start..=range.end).contains(&next) {
        return Err("next id outside the shard's range");
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: i16 = 4;

    fn granted(outcome: InitProducerIdOutcome) -> (ProducerId, ProducerEpoch) {
        match outcome {
            InitProducerIdOutcome::Granted { producer_id, epoch } => (producer_id, epoch),
            other => panic!("expected an id, got {other:?}"),
        }
    }

    fn shard_range() -> IdRange {
        IdRange::for_shard(1, 2).unwrap()
    }

    #[test]
    fn shard_ranges_are_disjoint_and_bounded() {
        let a = IdRange::for_shard(0, 0).unwrap();
        let b = IdRange::for_shard(0, 1).unwrap();
        let c = IdRange::for_shard(1, 0).unwrap();
        assert_eq!(a.start, 0);
        assert_eq!(a.end, b.start);
        assert!(b.end <= c.start);
        let last = IdRange::for_shard(0x7FFF, 1023).unwrap();
        assert!(
            last.start > 0 && last.end > last.start,
            "fits in positive i64"
        );
        assert!(IdRange::for_shard(-1, 0).is_none());
        assert!(IdRange::for_shard(0x8000, 0).is_none());
        assert!(IdRange::for_shard(0, 1024).is_none());
    }

    #[test]
    fn ids_are_unique_across_restarts_and_persisted_per_block() {
        let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
        let range = shard_range();
        let mut seen = std::collections::HashSet::new();
        let mut start = None;
        for restart in 0..3 {
            let mut file = ProducerIdBlockFile::open(dir.path(), 2, range).unwrap();
            for _ in 0..1500 {
                let (pid, epoch) = granted(file.init_producer_id(None, V4, 0).unwrap());
                start.get_or_insert(pid.get());
                assert_eq!(epoch, ProducerEpoch(0));
                assert!(range.contains(pid.get()));
                assert!(
                    seen.insert(pid),
                    "restart {restart}: {pid} handed out twice"
                );
            }
        }
        // Each run used 1500 ids = two blocks; the next run starts after the second.
        let file = ProducerIdBlockFile::open(dir.path(), 2, range).unwrap();
        let start = start.expect("ids were handed out");
        assert_eq!(file.allocator.next, start + 3 * 2 * PRODUCER_ID_BLOCK_SIZE);
    }

    /// A node back with a wiped data dir must not hand out the ids it handed out before
    /// (partitions still hold those producers' sequences): a fresh block file starts at
    /// a random block, not at the range's start.
    #[test]
    fn a_wiped_allocator_does_not_hand_out_its_old_ids_again() {
        let range = shard_range();
        let mut firsts = std::collections::HashSet::new();
        for _ in 0..8 {
            let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
            let mut file = ProducerIdBlockFile::open(dir.path(), 2, range).unwrap();
            let (pid, _) = granted(file.init_producer_id(None, V4, 0).unwrap());
            assert!(range.contains(pid.get()));
            assert!(
                pid.get() < range.start + (range.end - range.start) / 2 + PRODUCER_ID_BLOCK_SIZE
            );
            firsts.insert(pid);
        }
        assert!(firsts.len() > 1, "every fresh start handed out {firsts:?}");
    }

    #[test]
    fn a_damaged_or_foreign_block_file_stops_startup() {
        let dir = tempfile::tempdir_in(crate::storage::test_dir_root()).unwrap();
        let range = shard_range();
        let mut file = ProducerIdBlockFile::open(dir.path(), 2, range).unwrap();
        granted(file.init_producer_id(None, V4, 0).unwrap());
        let path = file.path().to_path_buf();
        let good = std::fs::read(&path).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 1;
            std::fs::write(&path, &bad).unwrap();
            assert!(
                ProducerIdBlockFile::open(dir.path(), 2, range).is_err(),
                "byte {i}"
            );
        }
        std::fs::write(&path, &good[..10]).unwrap();
        assert!(ProducerIdBlockFile::open(dir.path(), 2, range).is_err());
        std::fs::write(&path, &good).unwrap();
        let other = IdRange::for_shard(1, 3).unwrap();
        assert!(ProducerIdBlockFile::open(dir.path(), 2, other).is_err());
    }

    fn allocator() -> ProducerIdAllocator {
        let mut a = ProducerIdAllocator::new(shard_range(), shard_range().start);
        a.install_block(a.next_block_end().unwrap());
        a
    }

    #[test]
    fn existing_id_and_epoch_bump_the_epoch_kip_360() {
        let mut a = allocator();
        let (pid, e0) = granted(a.init_producer_id(None, V4, 0).unwrap());
        let (pid1, e1) = granted(a.init_producer_id(Some((pid, e0)), V4, 1).unwrap());
        assert_eq!((pid1, e1), (pid, ProducerEpoch(1)));
        // A retry of the same request (its answer was lost) gets the same epoch again.
        assert_eq!(
            granted(a.init_producer_id(Some((pid, e0)), V4, 2).unwrap()),
            (pid, e1)
        );
        let (_, e2) = granted(a.init_producer_id(Some((pid, e1)), V4, 3).unwrap());
        assert_eq!(e2, ProducerEpoch(2));
        // Epoch 0 is now two bumps old: fenced, with the code each version understands.
        assert_eq!(
            a.init_producer_id(Some((pid, e0)), 4, 4),
            Some(InitProducerIdOutcome::Fenced {
                error_code: PRODUCER_FENCED
            })
        );
        assert_eq!(
            a.init_producer_id(Some((pid, e0)), 3, 4),
            Some(InitProducerIdOutcome::Fenced {
                error_code: INVALID_PRODUCER_EPOCH
            })
        );
    }

    #[test]
    fn unknown_ids_and_exhausted_epochs_get_a_fresh_id() {
        let mut a = allocator();
        let (pid, _) = granted(a.init_producer_id(None, V4, 0).unwrap());
        // Not issued by this allocator: Kafka's answer, a new id at epoch 0.
        let foreign = ProducerId(shard_range().start - 1);
        let (fresh, e) = granted(
            a.init_producer_id(Some((foreign, ProducerEpoch(3))), V4, 0)
                .unwrap(),
        );
        assert_ne!(fresh, foreign);
        assert_eq!(e, ProducerEpoch(0));
        let not_yet = ProducerId(pid.get() + 100);
        assert_ne!(
            granted(
                a.init_producer_id(Some((not_yet, ProducerEpoch(0))), V4, 0)
                    .unwrap()
            )
            .0,
            not_yet
        );
        let (again, e) = granted(
            a.init_producer_id(Some((pid, ProducerEpoch(i16::MAX - 1))), V4, 0)
                .unwrap(),
        );
        assert_ne!(again, pid);
        assert_eq!(e, ProducerEpoch(0));
    }

    #[test]
    fn an_exhausted_range_is_an_error_not_a_reuse() {
        let range = IdRange { start: 10, end: 12 };
        let mut a = ProducerIdAllocator::new(range, 10);
        a.install_block(a.next_block_end().unwrap());
        granted(a.init_producer_id(None, V4, 0).unwrap());
        granted(a.init_producer_id(None, V4, 0).unwrap());
        assert_eq!(a.init_producer_id(None, V4, 0), None);
        assert!(matches!(
            a.next_block_end(),
            Err(AllocatorError::Exhausted { .. })
        ));
    }

    #[test]
    fn bump_records_expire() {
        let mut a = allocator();
        let (pid, e0) = granted(a.init_producer_id(None, V4, 0).unwrap());
        granted(a.init_producer_id(Some((pid, e0)), V4, 0).unwrap());
        a.expire(1000, 1000);
        assert!(a.bumps.records.is_empty());
    }

    /// A cluster shard hands out ids only from the controller's blocks, asks for the next
    /// one while ids are left (no wait at the block's end), bumps epochs of ids it handed
    /// out (KIP-360 as the file allocator), and gives a fresh id for any other.
    #[test]
    fn controller_blocks_prefetch_and_bump_only_their_own_ids() {
        let mut b = ControllerBlocks::default();
        assert!(b.wants_block() && !b.has_ids());
        assert_eq!(b.init_producer_id(None, V4, 0), None);
        let first = CONTROLLER_FIRST_PRODUCER_ID;
        b.add_block(first);
        assert!(!b.wants_block() && b.has_ids());
        let mut ids = Vec::new();
        while !b.wants_block() {
            ids.push(granted(b.init_producer_id(None, V4, 0).unwrap()).0.get());
        }
        assert_eq!(
            ids.len() as i64,
            PRODUCER_ID_BLOCK_SIZE - PREFETCH_WHEN_LEFT + 1
        );
        // The next block is far above (other shards took blocks meanwhile).
        let second = first + 7 * PRODUCER_ID_BLOCK_SIZE;
        b.add_block(second);
        b.add_block(second + PRODUCER_ID_BLOCK_SIZE); // a crossed ask: dropped
        for _ in 0..PRODUCER_ID_BLOCK_SIZE {
            ids.push(granted(b.init_producer_id(None, V4, 0).unwrap()).0.get());
        }
        let expected: Vec<i64> = (first..first + PRODUCER_ID_BLOCK_SIZE)
            .chain(second..second + PRODUCER_ID_BLOCK_SIZE - PREFETCH_WHEN_LEFT + 1)
            .collect();
        assert_eq!(ids, expected);
        assert!(b.wants_block());

        let (pid, e0) = (ProducerId(first + 3), ProducerEpoch(0));
        assert_eq!(
            granted(b.init_producer_id(Some((pid, e0)), V4, 1).unwrap()),
            (pid, ProducerEpoch(1))
        );
        assert_eq!(
            b.init_producer_id(Some((pid, ProducerEpoch(5))), V4, 2),
            Some(InitProducerIdOutcome::Fenced {
                error_code: PRODUCER_FENCED
            })
        );
        // Not handed out here: in a gap between the blocks, or not handed out yet.
        let gap = first + PRODUCER_ID_BLOCK_SIZE;
        let dropped = second + PRODUCER_ID_BLOCK_SIZE;
        for foreign in [gap, second + PRODUCER_ID_BLOCK_SIZE - 1, dropped] {
            let (fresh, e) = granted(
                b.init_producer_id(Some((ProducerId(foreign), e0)), V4, 3)
                    .unwrap(),
            );
            assert_ne!(fresh.get(), foreign);
            assert_eq!(e, ProducerEpoch(0));
        }
    }

    #[test]
    fn controller_blocks_remember_a_bounded_number_of_blocks() {
        let mut b = ControllerBlocks::default();
        let first = CONTROLLER_FIRST_PRODUCER_ID;
        for i in 0..(REMEMBERED_BLOCKS as i64 + 2) {
            b.add_block(first + i * PRODUCER_ID_BLOCK_SIZE);
            for _ in 0..PRODUCER_ID_BLOCK_SIZE {
                granted(b.init_producer_id(None, V4, 0).unwrap());
            }
        }
        assert_eq!(b.used.len(), REMEMBERED_BLOCKS);
        assert!(!b.issued(ProducerId(first)));
        assert!(b.issued(ProducerId(first + 2 * PRODUCER_ID_BLOCK_SIZE)));
    }
}
