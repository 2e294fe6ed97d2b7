//! The replica-shaped partition on a real log on the real disk: a leader whose ISR has
//! another member keeps its HW at the smallest log end in the ISR, so an acks=all produce
//! waits on the owner until the follower's fetch covers it (or times out); too small an
//! ISR refuses acks=all before appending; stale and future leader epochs are fenced; and a
//! follower appends its leader's batches keeping their offsets and epochs, byte for byte,
//! rebuilding producer state so that after taking over it still recognises a resend. A
//! follower serves consumers (KIP-392) only up to the HW and LSO it learned.
//!
//! The followers here are driven by hand (the replication fetchers are the next step);
//! the partition code under test is the one a running broker uses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weir::errors;
use weir::partition::replica::{Assignment, RoleChange};
use weir::partition::{Acks, Isolation, Lister, Partition, ReadFor};
use weir::producer_state::OUT_OF_ORDER_SEQUENCE_NUMBER;
use weir::producer_state::partition::Marker;
use weir::storage::testing::run_on_shard;
use weir::storage::{Disk, FaultKind, FaultPoint, SimDisk, prime_dma_probe};
use wire::batch::{BatchBuilder, NewRecord, read_header};
use wire::{BrokerEpoch, LeaderEpoch, NodeId, Offset, ProducerEpoch, ProducerId, Sequence};

const NOW_MS: i64 = 1_700_000_000_000;
const LEADER: NodeId = NodeId(1);
const FOLLOWER: NodeId = NodeId(2);
const THIRD: NodeId = NodeId(3);
const CONSUMER: ReadFor = ReadFor::Consumer(Isolation::ReadUncommitted);
/// Long enough for any append on a loaded machine; the tests never wait this long when
/// they pass.
const PATIENCE: Duration = Duration::from_secs(30);

fn test_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
    std::fs::create_dir_all(&root).expect("create target/tmp");
    root
}

fn configs(min_insync: u32) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("min.insync.replicas".to_string(), min_insync.to_string()),
        ("segment.bytes".to_string(), "65536".to_string()),
    ])
}

async fn open(dir: &Path, local: NodeId, min_insync: u32) -> Rc<Partition> {
    let topic: Arc<str> = Arc::from("orders");
    let p = Partition::open(dir, local, topic, 0, 7, configs(min_insync))
        .await
        .expect("open partition");
    Rc::new(p)
}

fn batch(producer: Option<(i64, i32)>, count: i32, tag: &str) -> BytesMut {
    let records = (0..count)
        .map(|i| NewRecord::value(NOW_MS, format!("{tag}-{i}")))
        .collect();
    let (pid, seq) = producer.unwrap_or((-1, -1));
    let bytes = BatchBuilder {
        producer_id: ProducerId(pid),
        producer_epoch: ProducerEpoch(if pid >= 0 { 0 } else { -1 }),
        base_sequence: Sequence(seq),
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("a batch from test data");
    BytesMut::from(&bytes[..])
}

fn soon() -> Instant {
    Instant::now() + PATIENCE
}

/// A follower's fetch at `offset`, as the leader serves it.
async fn follower_fetch(p: &Partition, offset: Offset, epoch: LeaderEpoch) -> (i16, Vec<Bytes>) {
    let out = p
        .fetch_within(
            offset,
            ReadFor::Follower(FOLLOWER, wire::BrokerEpoch(1)),
            epoch,
            1 << 20,
            usize::MAX,
            NOW_MS,
        )
        .await;
    (out.error, out.batches)
}

#[test]
fn acks_all_waits_on_the_leader_until_the_isr_has_the_batch() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let p = open(&root.path().join("orders-0"), LEADER, 2).await;
        let epoch = LeaderEpoch(1);
        p.update_replica(|r| r.become_leader(epoch, vec![LEADER, FOLLOWER], &[LEADER, FOLLOWER]));

        // acks=1 is answered after the local append; the HW waits for the follower.
        let one = p
            .produce(batch(None, 3, "a"), Acks::Leader, soon(), NOW_MS)
            .await;
        assert_eq!((one.error, one.base_offset), (errors::NONE, Offset(0)));
        assert_eq!(
            p.high_watermark(),
            Offset(0),
            "the follower holds nothing yet"
        );
        let consumer = p
            .fetch_within(Offset(0), CONSUMER, epoch, 1 << 20, usize::MAX, NOW_MS)
            .await;
        assert!(
            consumer.batches.is_empty(),
            "consumers read up to the HW only"
        );

        // acks=all with a follower that never fetches: appended, then REQUEST_TIMED_OUT.
        let started = Instant::now();
        let deadline = started + Duration::from_millis(300);
        let lost = p
            .produce(batch(None, 2, "b"), Acks::All, deadline, NOW_MS)
            .await;
        assert_eq!(lost.error, errors::REQUEST_TIMED_OUT);
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "waited for the deadline"
        );
        assert_eq!(
            p.log.log_end_offset(),
            Offset(5),
            "the batch is in the leader's log"
        );

        // acks=all answered once the follower's fetch says it has everything.
        let waiting = glommio::spawn_local({
            let p = p.clone();
            async move {
                p.produce(batch(None, 4, "c"), Acks::All, soon(), NOW_MS)
                    .await
            }
        });
        let (error, batches) = follower_fetch(&p, Offset(0), epoch).await;
        assert_eq!(error, errors::NONE);
        let got: i64 = batches
            .iter()
            .map(|b| i64::from(read_header(b).expect("header").last_offset_delta.get()) + 1)
            .sum();
        assert_eq!(
            got, 9,
            "a follower reads up to the leader's log end, past the HW"
        );
        assert_eq!(p.high_watermark(), Offset(0), "fetched is not yet held");
        let (error, _) = follower_fetch(&p, Offset(9), epoch).await;
        assert_eq!(error, errors::NONE);
        // Answered once the leader's own write is done too: HW = smallest LEO in the ISR.
        let answered = waiting.await;
        assert_eq!(p.high_watermark(), Offset(9));
        assert_eq!(
            (answered.error, answered.base_offset),
            (errors::NONE, Offset(5))
        );

        // KIP-320: a fetch under an older epoch is fenced, a newer one is not known yet.
        let (error, _) = follower_fetch(&p, Offset(9), LeaderEpoch(0)).await;
        assert_eq!(error, errors::FENCED_LEADER_EPOCH);
        let (error, _) = follower_fetch(&p, Offset(9), LeaderEpoch(2)).await;
        assert_eq!(error, errors::UNKNOWN_LEADER_EPOCH);

        // The ISR shrinks to the leader alone: acks=all is refused before appending,
        // acks=1 still appends.
        p.update_replica(|r| r.become_leader(LeaderEpoch(2), vec![LEADER], &[LEADER, FOLLOWER]));
        let refused = p
            .produce(batch(None, 1, "d"), Acks::All, soon(), NOW_MS)
            .await;
        assert_eq!(refused.error, errors::NOT_ENOUGH_REPLICAS);
        assert_eq!(p.log.log_end_offset(), Offset(9), "nothing appended");
        let one = p
            .produce(batch(None, 1, "e"), Acks::Leader, soon(), NOW_MS)
            .await;
        assert_eq!(one.error, errors::NONE);
        assert_eq!(
            p.high_watermark(),
            Offset(10),
            "ISR = {{leader}}: HW follows its log"
        );
    });
}

#[test]
fn a_follower_keeps_its_leaders_offsets_and_recognises_resends_after_taking_over() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let leader = open(&root.path().join("leader/orders-0"), LEADER, 1).await;
        let follower = open(&root.path().join("follower/orders-0"), FOLLOWER, 1).await;
        follower.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(0)));

        let pid = 7;
        let mut sent = Vec::new();
        for (i, seq) in [0, 3, 6].into_iter().enumerate() {
            let b = batch(Some((pid, seq)), 3, &format!("idem{i}"));
            sent.push(b.clone());
            let out = leader.produce(b, Acks::All, soon(), NOW_MS).await;
            assert_eq!(out.error, errors::NONE);
            let plain = leader.produce(batch(None, 2, "plain"), Acks::Leader, soon(), NOW_MS);
            assert_eq!(plain.await.error, errors::NONE);
        }
        assert_eq!(leader.log.log_end_offset(), Offset(15));

        // Clients are refused on a follower.
        let refused = follower.produce(batch(None, 1, "x"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(refused.await.error, errors::NOT_LEADER_OR_FOLLOWER);

        // Copy the way a replication fetcher does: fetch from the follower's log end.
        for _ in 0..100 {
            let from = follower.log.log_end_offset();
            if from >= leader.log.log_end_offset() {
                break;
            }
            let (error, batches) = follower_fetch(&leader, from, LeaderEpoch::NONE).await;
            assert_eq!(error, errors::NONE);
            for b in batches {
                let appended = follower.append_as_follower(BytesMut::from(&b[..]), NOW_MS);
                appended.await.expect("replicated append");
            }
        }
        let end = leader.log.log_end_offset();
        assert_eq!(
            whole_log(&follower).await,
            whole_log(&leader).await,
            "the follower's log is the leader's, byte for byte"
        );

        // A batch that does not start at the follower's log end is refused, nothing kept.
        let first = leader.log.read(Offset(0), 1, end).await.expect("read");
        let again = BytesMut::from(&first.batches[0][..]);
        assert!(follower.append_as_follower(again, NOW_MS).await.is_err());
        assert_eq!(follower.log.log_end_offset(), end);

        // The follower takes over: a resend of the producer's last batch is a duplicate
        // answered with its original offsets, the next one is appended under epoch 1.
        follower.update_replica(|r| r.become_leader(LeaderEpoch(1), vec![FOLLOWER], &[FOLLOWER]));
        assert_eq!(follower.high_watermark(), end, "ISR = {{new leader}}");
        let resend = follower
            .produce(sent[2].clone(), Acks::All, soon(), NOW_MS)
            .await;
        assert_eq!(
            (resend.error, resend.base_offset),
            (errors::NONE, Offset(10))
        );
        assert_eq!(
            follower.log.log_end_offset(),
            end,
            "a duplicate appends nothing"
        );
        let next = follower.produce(batch(Some((pid, 9)), 1, "next"), Acks::All, soon(), NOW_MS);
        let next = next.await;
        assert_eq!((next.error, next.base_offset), (errors::NONE, end));
        let read = follower
            .log
            .read(end, 1 << 20, end.add(1))
            .await
            .expect("read");
        let header = read_header(&read.batches[0]).expect("header");
        assert_eq!(header.partition_leader_epoch(), LeaderEpoch(1));
        let gap = follower.produce(batch(Some((pid, 20)), 1, "gap"), Acks::All, soon(), NOW_MS);
        assert_eq!(gap.await.error, OUT_OF_ORDER_SEQUENCE_NUMBER);
    });
}

/// Copies `from`'s log onto `to` (a follower) the way a replication fetcher does.
async fn catch_up(from: &Partition, to: &Partition) {
    for _ in 0..100 {
        let at = to.log.log_end_offset();
        if at >= from.log.log_end_offset() {
            return;
        }
        let (error, batches) = follower_fetch(from, at, LeaderEpoch::NONE).await;
        assert_eq!(error, errors::NONE);
        for b in batches {
            let appended = to.append_as_follower(BytesMut::from(&b[..]), NOW_MS);
            appended.await.expect("replicated append");
        }
    }
    panic!("no catch-up in 100 fetches");
}

/// Every byte of `p`'s log from its start (a read returns what one source holds, disk or
/// tail cache: read on to the end).
async fn whole_log(p: &Partition) -> Vec<u8> {
    let end = p.log.log_end_offset();
    let (mut log, mut at) = (Vec::new(), p.log.log_start_offset());
    for _ in 0..1000 {
        if at >= end {
            break;
        }
        let read = p.log.read(at, 1 << 24, end).await.expect("read log");
        log.extend(read.batches.concat());
        at = read.next_offset;
    }
    log
}

/// The seeds' divergence: a leader appends past what its follower copied and dies; the
/// follower becomes leader under a new epoch and appends its own records at the same
/// offsets; the old leader returns as follower, asks the new one where its last epoch
/// ended (OffsetForLeaderEpoch), truncates there — not to its HW — and copies the rest:
/// both logs end identical, and the epoch checkpoints say which epoch wrote what.
#[test]
fn a_returning_leader_truncates_by_epoch_and_ends_identical_to_the_new_one() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let a = open(&root.path().join("a/orders-0"), LEADER, 1).await;
        let b = open(&root.path().join("b/orders-0"), FOLLOWER, 1).await;
        a.update_replica(|r| r.become_leader(LeaderEpoch(1), vec![LEADER], &[LEADER, FOLLOWER]));
        b.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(1)));

        for i in 0..5 {
            let out = a.produce(
                batch(None, 2, &format!("a{i}")),
                Acks::Leader,
                soon(),
                NOW_MS,
            );
            assert_eq!(out.await.error, errors::NONE);
        }
        catch_up(&a, &b).await;
        assert_eq!(b.log.log_end_offset(), Offset(10));
        // Past what the follower copied: these die with the old leader.
        for i in 0..2 {
            let out = a.produce(
                batch(None, 3, &format!("lost{i}")),
                Acks::Leader,
                soon(),
                NOW_MS,
            );
            assert_eq!(out.await.error, errors::NONE);
        }
        assert_eq!(a.log.log_end_offset(), Offset(16));

        // The follower takes over under epoch 2 and writes offsets 10.. itself.
        b.update_replica(|r| r.become_leader(LeaderEpoch(2), vec![FOLLOWER], &[LEADER, FOLLOWER]));
        for i in 0..2 {
            let out = b.produce(
                batch(None, 1, &format!("b{i}")),
                Acks::Leader,
                soon(),
                NOW_MS,
            );
            assert_eq!(out.await.error, errors::NONE);
        }
        assert_eq!(
            b.epoch_entries(),
            vec![(LeaderEpoch(1), Offset(0)), (LeaderEpoch(2), Offset(10))]
        );

        // The old leader returns as follower under epoch 2.
        a.update_replica(|r| r.become_follower(FOLLOWER, LeaderEpoch(2)));
        let (latest, _) = *a.epoch_entries().last().expect("an epoch");
        let (epoch, end) = b.epoch_end_offset(latest, LeaderEpoch(2)).expect("answer");
        assert_eq!(
            (epoch, end),
            (LeaderEpoch(1), Offset(10)),
            "epoch 1 ended at 10 on b"
        );
        assert_eq!(a.truncate_to(end).await, Ok(Offset(10)));
        catch_up(&b, &a).await;
        assert_eq!(a.log.log_end_offset(), Offset(12));
        assert_eq!(
            whole_log(&a).await,
            whole_log(&b).await,
            "no divergence left"
        );
        assert_eq!(a.epoch_entries(), b.epoch_entries());
        // A stale OffsetForLeaderEpoch (current epoch 1) is fenced by the new leader.
        assert_eq!(
            b.epoch_end_offset(LeaderEpoch(1), LeaderEpoch(1)),
            Err(errors::FENCED_LEADER_EPOCH)
        );
    });
}

/// Leader `a` (its disk returned, to hold and fail writes) and follower `b` of epoch 1,
/// each on a simulated disk of its own.
async fn sim_pair(root: &Path) -> (Rc<SimDisk>, Rc<Partition>, Rc<Partition>) {
    let (disk_a, disk_b) = (SimDisk::new(), SimDisk::new());
    let a = open_sim(&root.join("a/orders-0"), LEADER, &disk_a).await;
    let b = open_sim(&root.join("b/orders-0"), FOLLOWER, &disk_b).await;
    let both = [LEADER, FOLLOWER];
    a.update_replica(|r| r.become_leader(LeaderEpoch(1), both.to_vec(), &both));
    b.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(1)));
    (disk_a, a, b)
}

/// A partition on a simulated disk (writes can be held in flight and fail with ENOSPC).
async fn open_sim(dir: &Path, local: NodeId, disk: &Rc<SimDisk>) -> Rc<Partition> {
    let topic: Arc<str> = Arc::from("orders");
    let p = Partition::open_on(dir, local, topic, 0, 7, configs(1), Disk::Sim(disk.clone()))
        .await
        .expect("open partition");
    Rc::new(p)
}

/// The follower's side of a fetch round the way the replication fetcher runs it: the
/// leader's KIP-320 answer first (truncate where our last epoch ended there), else copy.
async fn fetch_round(leader: &Partition, follower: &Partition, epoch: LeaderEpoch) {
    let at = follower.log.log_end_offset();
    let last = follower
        .epoch_entries()
        .last()
        .map_or(LeaderEpoch::NONE, |e| e.0);
    if let Some((diverged, end)) = leader.diverging(at, last) {
        let cut = follower.divergence_cut(diverged, end);
        follower.truncate_to(cut).await.expect("truncate");
        return;
    }
    let (error, batches) = follower_fetch(leader, at, epoch).await;
    assert_eq!(error, errors::NONE);
    for b in batches {
        let appended = follower.append_as_follower(BytesMut::from(&b[..]), NOW_MS);
        appended.await.expect("replicated append");
    }
}

/// Waits (bounded) until the leader's out-of-space backoff has passed.
async fn wait_writable(p: &Partition) {
    let deadline = Instant::now() + PATIENCE;
    while p.log.is_out_of_space() {
        assert!(
            Instant::now() < deadline,
            "the out-of-space backoff did not end"
        );
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 11: a follower copies a batch from the leader's tail cache while the leader's
/// write is in flight; the write runs out of space and the leader rolls it back. Under the
/// same epoch the leader would then append other records at those offsets and count the
/// follower (fetching past them) in sync while it holds different bytes. Instead the
/// leader refuses appends under that epoch (NOT_LEADER_OR_FOLLOWER, `needs_new_epoch`);
/// under the next one the follower learns where the old epoch ended, truncates, and both
/// logs are identical up to the HW.
#[test]
fn a_leader_that_rolled_back_served_offsets_appends_only_under_a_new_epoch() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        let (disk_a, a, b) = sim_pair(root.path()).await;
        let both = [LEADER, FOLLOWER];
        for i in 0..5 {
            let out = a.produce(
                batch(None, 2, &format!("a{i}")),
                Acks::Leader,
                soon(),
                NOW_MS,
            );
            assert_eq!(out.await.error, errors::NONE);
        }
        for _ in 0..3 {
            fetch_round(&a, &b, LeaderEpoch(1)).await;
        }
        assert_eq!(b.log.log_end_offset(), Offset(10));

        // The leader's next write is in flight, and fails for lack of space.
        disk_a.inject(FaultPoint::Append, FaultKind::NoSpace, 0);
        disk_a.hold_writes(true);
        let mut lost = Box::pin(a.produce(batch(None, 3, "x"), Acks::Leader, soon(), NOW_MS));
        for _ in 0..100 {
            if a.log.log_end_offset() > Offset(10) {
                break;
            }
            let polled = futures_lite::future::poll_once(&mut lost).await;
            assert!(polled.is_none(), "the produce waits for its write");
        }
        assert_eq!(a.log.log_end_offset(), Offset(13), "offsets assigned");
        // The follower copies it from the tail cache meanwhile.
        fetch_round(&a, &b, LeaderEpoch(1)).await;
        assert_eq!(b.log.log_end_offset(), Offset(13));
        disk_a.hold_writes(false);
        assert_eq!(lost.await.error, errors::KAFKA_STORAGE_ERROR);
        assert_eq!(a.log.log_end_offset(), Offset(10), "rolled back");
        wait_writable(&a).await;

        // Same epoch: refused, nothing appended (before, "y" went to offset 10).
        let refused = a.produce(batch(None, 5, "y"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(refused.await.error, errors::NOT_LEADER_OR_FOLLOWER);
        assert_eq!(a.log.log_end_offset(), Offset(10));
        assert!(a.needs_new_epoch(), "asks the controller for a new epoch");
        // Nor does the follower count as holding what the leader lacks: its fetch past
        // the leader's end is told where epoch 1 ends, and it truncates.
        fetch_round(&a, &b, LeaderEpoch(1)).await;
        assert_eq!(b.log.log_end_offset(), Offset(10));

        // The controller's answer (here: the same leader, epoch 2) lifts the fence.
        a.update_replica(|r| r.become_leader(LeaderEpoch(2), both.to_vec(), &both));
        b.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(2)));
        assert!(!a.needs_new_epoch());
        let out = a
            .produce(batch(None, 5, "y"), Acks::Leader, soon(), NOW_MS)
            .await;
        assert_eq!((out.error, out.base_offset), (errors::NONE, Offset(10)));
        for _ in 0..4 {
            fetch_round(&a, &b, LeaderEpoch(2)).await;
        }
        assert_eq!(a.high_watermark(), Offset(15));
        assert_eq!(whole_log(&a).await, whole_log(&b).await, "identical logs");
        assert_eq!(a.epoch_entries(), b.epoch_entries());
    });
}

/// The same rollback, but the follower that copied the rolled-back batch became leader
/// (the controller moved leadership): the old leader follows under the new epoch, keeps
/// fetching from the written end it rolled back to, and copies the batch from the new
/// leader: identical logs again.
#[test]
fn a_follower_that_copied_rolled_back_offsets_can_take_over() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        let (disk_a, a, b) = sim_pair(root.path()).await;
        let both = [LEADER, FOLLOWER];
        let out = a.produce(batch(None, 4, "a"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        fetch_round(&a, &b, LeaderEpoch(1)).await;
        disk_a.inject(FaultPoint::Append, FaultKind::NoSpace, 0);
        disk_a.hold_writes(true);
        let mut lost = Box::pin(a.produce(batch(None, 3, "x"), Acks::Leader, soon(), NOW_MS));
        for _ in 0..100 {
            if a.log.log_end_offset() > Offset(4) {
                break;
            }
            assert!(futures_lite::future::poll_once(&mut lost).await.is_none());
        }
        fetch_round(&a, &b, LeaderEpoch(1)).await;
        assert_eq!(b.log.log_end_offset(), Offset(7));
        disk_a.hold_writes(false);
        assert_eq!(lost.await.error, errors::KAFKA_STORAGE_ERROR);
        assert!(a.needs_new_epoch());

        // ResignLeader with a successor: b leads epoch 2 (a left the ISR), a follows.
        b.update_replica(|r| r.become_leader(LeaderEpoch(2), vec![FOLLOWER], &both));
        a.update_replica(|r| r.become_follower(FOLLOWER, LeaderEpoch(2)));
        let out = b.produce(batch(None, 2, "b"), Acks::Leader, soon(), NOW_MS);
        assert_eq!((out.await.base_offset), Offset(7));
        wait_writable(&a).await;
        for _ in 0..4 {
            fetch_round(&b, &a, LeaderEpoch(2)).await;
        }
        assert_eq!(a.log.log_end_offset(), Offset(9));
        assert_eq!(whole_log(&a).await, whole_log(&b).await, "identical logs");
    });
}

/// A node that leads again under a new epoch and whose first append there is a
/// coordinator's transaction marker (no produce): the follower copies the marker, so its
/// last fetched epoch is the new one. The leader must know that epoch (it starts at its
/// log end when it becomes leader), or the KIP-320 check answers "unknown epoch" (-1, -1),
/// which reads on the wire as no divergence: the follower's fetch was neither served nor
/// counted, and it fell out of the ISR while acks=all writes waited for it.
#[test]
fn a_follower_that_fetched_a_new_leaders_marker_first_fetches_on() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let a = open(&root.path().join("a/orders-0"), LEADER, 1).await;
        let b = open(&root.path().join("b/orders-0"), FOLLOWER, 1).await;
        let assigned = |epoch: i32| Assignment {
            replicas: vec![LEADER, FOLLOWER],
            leader: Some(LEADER),
            leader_epoch: LeaderEpoch(epoch),
            isr: vec![LEADER, FOLLOWER],
            partition_epoch: epoch,
        };
        assert_eq!(a.apply_assignment(&assigned(1), NOW_MS), RoleChange::Lead);
        b.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(1)));
        let pid = (4000, 0);
        let txn = BatchBuilder {
            producer_id: ProducerId(pid.0),
            producer_epoch: ProducerEpoch(0),
            base_sequence: Sequence(pid.1),
            transactional: true,
            records: vec![
                NewRecord::value(NOW_MS, "t0"),
                NewRecord::value(NOW_MS, "t1"),
            ],
            ..BatchBuilder::default()
        }
        .build()
        .expect("a transactional batch");
        let txn = BytesMut::from(&txn[..]);
        let out = a.produce(txn, Acks::Leader, soon(), NOW_MS).await;
        assert_eq!(out.error, errors::NONE);
        catch_up(&a, &b).await;

        // Leader again under epoch 2 (a re-election); its first append is the marker.
        assert_eq!(a.apply_assignment(&assigned(2), NOW_MS), RoleChange::Lead);
        b.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(2)));
        let marker = Marker {
            producer_id: ProducerId(pid.0),
            producer_epoch: ProducerEpoch(0),
            commit: true,
            coordinator_epoch: 2,
        };
        assert_eq!(a.write_marker(marker, NOW_MS).await, errors::NONE);
        let end = a.log.log_end_offset();
        assert_eq!(end, Offset(3));
        catch_up(&a, &b).await;
        let last_fetched = b.epoch_entries().last().map(|(e, _)| *e);
        assert_eq!(
            last_fetched,
            Some(LeaderEpoch(2)),
            "the marker came under epoch 2"
        );

        // The follower's next fetch is in line with the leader and counts: the HW
        // reaches the marker.
        assert_eq!(a.diverging(end, LeaderEpoch(2)), None);
        let (error, batches) = follower_fetch(&a, end, LeaderEpoch(2)).await;
        assert_eq!((error, batches.len()), (errors::NONE, 0));
        assert_eq!(a.high_watermark(), end, "the follower's fetch counted");
        assert_eq!(
            a.epoch_entries(),
            vec![(LeaderEpoch(1), Offset(0)), (LeaderEpoch(2), Offset(2))]
        );
    });
}

/// A leader whose log reopened below its checkpointed HW (a power failure took records it
/// had acknowledged) must not lead on while another ISR member may hold them: a follower
/// fetching past its end would be told where the epoch ends and cut the records it holds.
/// So under every epoch it leads with another ISR member (the one at open, and a newer
/// one a catalogue catching up may name) it answers no fetch, takes no append and gives
/// no epoch end, and asks for a new epoch (`needs_new_epoch`, which makes the shard
/// resign it); the checkpoint keeps the HW that shows the loss. Leading alone, it leads.
#[test]
fn a_leader_reopened_below_its_checkpointed_hw_serves_nothing_while_another_isr_member_may() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let dir = root.path().join("orders-0");
        let p = open(&dir, LEADER, 1).await;
        let wrote = p
            .produce(batch(None, 10, "a"), Acks::Leader, soon(), NOW_MS)
            .await;
        assert_eq!(wrote.error, errors::NONE);
        p.log.close().await.expect("close");
        drop(p);

        // Reopened: the checkpoint says the ISR had 20 records, the log holds 10.
        let p = open(&dir, LEADER, 1).await;
        p.restore_high_watermark(Some(Offset(20)));
        let both = [LEADER, FOLLOWER];
        for epoch in [LeaderEpoch(1), LeaderEpoch(2)] {
            p.update_replica(|r| r.become_leader(epoch, both.to_vec(), &both));
            p.fence_if_lost();
            assert!(p.needs_new_epoch(), "asks the controller for a new epoch");
            assert!(p.leads_without_acknowledged());
            let (error, batches) = follower_fetch(&p, Offset(20), epoch).await;
            assert_eq!(
                error,
                errors::NOT_LEADER_OR_FOLLOWER,
                "no fetch is answered"
            );
            assert!(batches.is_empty());
            assert_eq!(
                p.epoch_end_offset(epoch, epoch),
                Err(errors::NOT_LEADER_OR_FOLLOWER),
                "no epoch end a follower could truncate to"
            );
            let refused = p
                .produce(batch(None, 5, "b"), Acks::Leader, soon(), NOW_MS)
                .await;
            assert_eq!(refused.error, errors::NOT_LEADER_OR_FOLLOWER);
            assert_eq!(p.log.log_end_offset(), Offset(10), "nothing appended");
            assert_eq!(
                p.checkpoint_hw(),
                Offset(20),
                "the checkpoint keeps the loss"
            );
        }

        // Alone in the ISR (no other member had them): it leads under the newer epoch.
        p.update_replica(|r| r.become_leader(LeaderEpoch(3), vec![LEADER], &both));
        p.fence_if_lost();
        assert!(!p.needs_new_epoch());
        assert!(!p.leads_without_acknowledged());
        let taken = p
            .produce(batch(None, 5, "c"), Acks::Leader, soon(), NOW_MS)
            .await;
        assert_eq!((taken.error, taken.base_offset), (errors::NONE, Offset(10)));
        assert_eq!(p.checkpoint_hw(), p.high_watermark());
    });
}

/// A partition directory left by a deleted topic of the same name (its `partition.metadata`
/// names another topic id) is set aside, not opened: the new topic's replica starts
/// empty instead of serving the old records at the new offsets.
#[test]
fn a_directory_of_another_topic_id_is_set_aside_not_opened() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let topic: Arc<str> = Arc::from("orders");
        let old = Partition::open(root.path(), LEADER, topic.clone(), 0, 7, configs(1))
            .await
            .expect("open");
        let wrote = old
            .produce(batch(None, 10, "old"), Acks::Leader, soon(), NOW_MS)
            .await;
        assert_eq!(wrote.error, errors::NONE);
        old.log.close().await.expect("close");
        drop(old);

        let new = Partition::open(root.path(), LEADER, topic.clone(), 0, 8, configs(1))
            .await
            .expect("open the new topic's partition");
        assert_eq!(new.log.log_end_offset(), Offset(0), "starts empty");
        let names: Vec<String> = std::fs::read_dir(root.path())
            .expect("list")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        let stray = weir::partition::partition_metadata_text(7);
        let old_id = stray.trim_end().rsplit(' ').next().expect("an id");
        let aside =
            |n: &String| n.starts_with(&format!("orders-0.{old_id}.")) && n.ends_with("-stray");
        assert!(
            names.iter().any(aside),
            "the old directory is kept aside: {names:?}"
        );
        // The same id again: opened as it is.
        let wrote = new
            .produce(batch(None, 3, "new"), Acks::Leader, soon(), NOW_MS)
            .await;
        assert_eq!(wrote.error, errors::NONE);
        new.log.close().await.expect("close");
        drop(new);
        let again = Partition::open(root.path(), LEADER, topic, 0, 8, configs(1))
            .await
            .expect("reopen");
        assert_eq!(again.log.log_end_offset(), Offset(3));
    });
}

/// One fetch round of `follower` from `leader`, as the replication fetcher runs it under
/// the follower's leader epoch: the leader's KIP-320 answer first (cut where
/// `divergence_cut` says), else copy what it serves and learn its HW. Returns whether the
/// round diverged.
async fn replicate_round(leader: &Partition, follower: &Partition) -> bool {
    let at = follower.log.log_end_offset();
    let last = follower
        .epoch_entries()
        .last()
        .map_or(LeaderEpoch::NONE, |e| e.0);
    if let Some((epoch, end)) = leader.diverging(at, last) {
        let cut = follower.divergence_cut(epoch, end);
        follower.truncate_to(cut).await.expect("truncate");
        return true;
    }
    let node = follower.replica().local();
    let out = leader
        .fetch_within(
            at,
            ReadFor::Follower(node, BrokerEpoch(1)),
            follower.leader_epoch(),
            1 << 20,
            usize::MAX,
            NOW_MS,
        )
        .await;
    assert_eq!(out.error, errors::NONE);
    for b in out.batches {
        let appended = follower.append_as_follower(BytesMut::from(&b[..]), NOW_MS);
        appended.await.expect("replicated append");
    }
    let hw = out.high_watermark;
    follower.update_replica(|r| {
        r.learn_high_watermark(hw);
    });
    false
}

/// Leader `leader` under `epoch` with `isr`, every replica of `replicas` assigned.
fn assigned(leader: NodeId, epoch: i32, isr: &[NodeId], replicas: &[NodeId]) -> Assignment {
    Assignment {
        replicas: replicas.to_vec(),
        leader: Some(leader),
        leader_epoch: LeaderEpoch(epoch),
        isr: isr.to_vec(),
        partition_epoch: epoch,
    }
}

/// The header of the batch holding `offset` in `p`'s log.
async fn header_at(p: &Partition, offset: Offset) -> wire::batch::BatchHeader {
    let read = p.log.read(offset, 1 << 20, p.log.log_end_offset()).await;
    let read = read.expect("read");
    *read_header(&read.batches[0]).expect("a batch header")
}

/// Lets spawned tasks run until they wait on something.
async fn let_spawned_run() {
    for _ in 0..3 {
        futures_lite::future::yield_now().await;
    }
}

/// Leader `a` of epoch 1 with ISR {a, b}: ten records of five batches, all copied by `b`.
async fn pair_with_ten_copied(root: &Path, min_insync: u32) -> (Rc<Partition>, Rc<Partition>) {
    let a = open(&root.join("a/orders-0"), LEADER, min_insync).await;
    let b = open(&root.join("b/orders-0"), FOLLOWER, min_insync).await;
    let both = [LEADER, FOLLOWER];
    assert_eq!(
        a.apply_assignment(&assigned(LEADER, 1, &both, &both), NOW_MS),
        RoleChange::Lead
    );
    b.apply_assignment(&assigned(LEADER, 1, &both, &both), NOW_MS);
    for i in 0..5 {
        let out = a.produce(
            batch(None, 2, &format!("p{i}")),
            Acks::Leader,
            soon(),
            NOW_MS,
        );
        assert_eq!(out.await.error, errors::NONE);
    }
    for _ in 0..10 {
        if b.high_watermark() >= Offset(10) {
            break;
        }
        replicate_round(&a, &b).await;
    }
    assert_eq!(
        (a.high_watermark(), b.high_watermark()),
        (Offset(10), Offset(10))
    );
    (a, b)
}

/// An idempotent resend waits for its original's HW. If leadership moves meanwhile, the
/// new leader may write other records at the original's offsets, and this replica,
/// following, cuts the original and learns a HW past it: the resend must not then be
/// told its offsets. It is answered NOT_LEADER_OR_FOLLOWER as leadership moves.
#[test]
fn a_resend_waiting_for_its_original_is_refused_when_leadership_moves() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let (a, b) = pair_with_ten_copied(root.path(), 2).await;
        let both = [LEADER, FOLLOWER];
        // b does not fetch it: the acks=all original times out at offset 10.
        let original = batch(Some((7, 0)), 1, "original");
        let soon_over = Instant::now() + Duration::from_millis(50);
        let first = a
            .produce(original.clone(), Acks::All, soon_over, NOW_MS)
            .await;
        assert_eq!(
            (first.error, first.base_offset),
            (errors::REQUEST_TIMED_OUT, Offset(10))
        );
        let resend = glommio::spawn_local({
            let a = a.clone();
            async move { a.produce(original, Acks::All, soon(), NOW_MS).await }
        });
        let_spawned_run().await;

        // Leadership moves to b, which writes other records from offset 10.
        b.apply_assignment(&assigned(FOLLOWER, 2, &both, &both), NOW_MS);
        let other = b.produce(batch(None, 3, "other"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(other.await.base_offset, Offset(10));
        a.apply_assignment(&assigned(FOLLOWER, 2, &both, &both), NOW_MS);
        let mut diverged = false;
        for _ in 0..6 {
            diverged |= replicate_round(&b, &a).await;
        }
        assert!(diverged, "a cut the original");
        assert!(a.high_watermark() > Offset(10), "a learned a HW past it");
        assert_ne!(header_at(&a, Offset(10)).await.producer_id(), ProducerId(7));

        let out = resend.await;
        assert_eq!(
            (out.error, out.base_offset),
            (errors::NOT_LEADER_OR_FOLLOWER, Offset::NONE),
            "the resend is not told offset 10, which holds another record"
        );
    });
}

/// An acks=all produce waiting for its HW is answered NOT_LEADER_OR_FOLLOWER when its
/// leader becomes a follower, even if the same node leads again later: by then its log
/// may hold the other leader's records at the produce's offsets.
#[test]
fn an_acks_all_produce_is_refused_when_leadership_moves_even_if_it_comes_back() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let (a, b) = pair_with_ten_copied(root.path(), 1).await;
        let both = [LEADER, FOLLOWER];
        let waiting = glommio::spawn_local({
            let a = a.clone();
            async move {
                let out = a.produce(batch(None, 1, "waits"), Acks::All, soon(), NOW_MS);
                out.await
            }
        });
        for _ in 0..1000 {
            if a.log.log_end_offset() == Offset(11) {
                break;
            }
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(a.log.log_end_offset(), Offset(11), "the produce appended");

        b.apply_assignment(&assigned(FOLLOWER, 2, &both, &both), NOW_MS);
        let other = b.produce(batch(None, 3, "other"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(other.await.error, errors::NONE);
        a.apply_assignment(&assigned(FOLLOWER, 2, &both, &both), NOW_MS);
        assert!(replicate_round(&b, &a).await, "a cuts the produce's record");
        assert!(!replicate_round(&b, &a).await);
        assert_eq!(a.log.log_end_offset(), Offset(13));
        // b dies; the controller makes a the sole leader under epoch 3.
        a.apply_assignment(&assigned(LEADER, 3, &[LEADER], &both), NOW_MS);

        let out = waiting.await;
        assert_eq!(out.error, errors::NOT_LEADER_OR_FOLLOWER);
        assert_eq!(
            header_at(&a, Offset(10)).await.partition_leader_epoch(),
            LeaderEpoch(2)
        );
    });
}

/// KIP-279: a follower told where an epoch it does not have ends cuts where its own
/// largest epoch below that one ends, and asks again; the answers step down until both
/// logs agree. Here leadership went c → b → c → b before they synced: b has epochs
/// {1: 0, 2: 40, 4: 60}, c {1: 0, 3: 50} and 100 records.
#[test]
fn a_follower_steps_down_through_epochs_it_lacks_until_both_logs_agree() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let all = [LEADER, FOLLOWER, THIRD];
        let b = open(&root.path().join("b/orders-0"), FOLLOWER, 1).await;
        let c = open(&root.path().join("c/orders-0"), THIRD, 1).await;
        let write = |p: Rc<Partition>, tag: &'static str, n: usize| async move {
            for i in 0..n {
                let out = p.produce(
                    batch(None, 10, &format!("{tag}{i}")),
                    Acks::Leader,
                    soon(),
                    NOW_MS,
                );
                assert_eq!(out.await.error, errors::NONE);
            }
        };
        // Epoch 1: c leads and writes 0..50; b copies 0..40.
        c.apply_assignment(&assigned(THIRD, 1, &all, &all), NOW_MS);
        b.apply_assignment(&assigned(THIRD, 1, &all, &all), NOW_MS);
        write(c.clone(), "e1-", 5).await;
        for _ in 0..10 {
            if b.log.log_end_offset() >= Offset(50) {
                break;
            }
            replicate_round(&c, &b).await;
        }
        assert_eq!(b.truncate_to(Offset(40)).await, Ok(Offset(40)));
        // Epoch 2: b leads and writes 40..60. Epoch 3: c leads and writes 50..100.
        b.apply_assignment(&assigned(FOLLOWER, 2, &all, &all), NOW_MS);
        write(b.clone(), "e2-", 2).await;
        c.apply_assignment(&assigned(THIRD, 3, &all, &all), NOW_MS);
        write(c.clone(), "e3-", 5).await;
        // Epoch 4: b leads, c follows.
        b.apply_assignment(&assigned(FOLLOWER, 4, &all, &all), NOW_MS);
        c.apply_assignment(&assigned(FOLLOWER, 4, &all, &all), NOW_MS);
        let epochs = |e: &[(i32, i64)]| -> Vec<(LeaderEpoch, Offset)> {
            e.iter()
                .map(|(e, o)| (LeaderEpoch(*e), Offset(*o)))
                .collect()
        };
        assert_eq!(b.epoch_entries(), epochs(&[(1, 0), (2, 40), (4, 60)]));
        assert_eq!(c.epoch_entries(), epochs(&[(1, 0), (3, 50)]));

        let mut rounds = 0;
        while whole_log(&c).await != whole_log(&b).await {
            rounds += 1;
            assert!(rounds <= 6, "c and b agree within 6 rounds");
            replicate_round(&b, &c).await;
        }
        assert_eq!(c.log.log_end_offset(), Offset(60));
        // b's epoch 4 has no records yet, so c has no entry for it.
        assert_eq!(c.epoch_entries(), epochs(&[(1, 0), (2, 40)]));
        assert_eq!(
            header_at(&c, Offset(40)).await.partition_leader_epoch(),
            LeaderEpoch(2)
        );
    });
}

/// A new leader keeps the HW it learned as a follower, which can lag the old leader's by a
/// fetch round. A consumer already at the old leader's HW reads nothing there until the
/// HW catches up; OFFSET_OUT_OF_RANGE (which would send it to its reset policy) is only
/// for offsets past the log end.
#[test]
fn a_consumer_past_a_new_leaders_lagging_hw_reads_nothing_rather_than_out_of_range() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let (a, b) = pair_with_ten_copied(root.path(), 1).await;
        let both = [LEADER, FOLLOWER];
        let out = a.produce(batch(None, 2, "more"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        assert!(
            !replicate_round(&a, &b).await,
            "b copies 10..12, learns HW 10"
        );
        let (error, _) = follower_fetch(&a, Offset(12), LeaderEpoch(1)).await;
        assert_eq!(error, errors::NONE, "b's next fetch moves a's HW to 12");
        assert_eq!(
            (a.high_watermark(), b.high_watermark()),
            (Offset(12), Offset(10))
        );
        let consume = |p: Rc<Partition>, at: Offset| async move {
            p.fetch_within(at, CONSUMER, LeaderEpoch::NONE, 1 << 20, usize::MAX, NOW_MS)
                .await
        };
        assert_eq!(consume(a.clone(), Offset(12)).await.error, errors::NONE);

        // a dies; b leads epoch 2 with its learned HW 10 and its log end 12.
        b.apply_assignment(&assigned(FOLLOWER, 2, &both, &both), NOW_MS);
        assert_eq!(
            b.high_watermark(),
            Offset(10),
            "a has not fetched from b yet"
        );
        let at_12 = consume(b.clone(), Offset(12)).await;
        assert_eq!(
            at_12.error,
            errors::NONE,
            "not out of range below the log end"
        );
        assert!(at_12.batches.is_empty(), "nothing above the HW");
        let past = consume(b.clone(), Offset(13)).await;
        assert_eq!(past.error, errors::OFFSET_OUT_OF_RANGE, "past the log end");
    });
}

/// A transactional batch of `producer` (epoch 0, sequence 0) with `count` records.
fn txn_batch(producer: i64, count: i32) -> BytesMut {
    let records = (0..count)
        .map(|i| NewRecord::value(NOW_MS, format!("t{i}")))
        .collect();
    let bytes = BatchBuilder {
        producer_id: ProducerId(producer),
        producer_epoch: ProducerEpoch(0),
        base_sequence: Sequence(0),
        transactional: true,
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("a batch from test data");
    BytesMut::from(&bytes[..])
}

fn abort_of(producer: i64) -> Marker {
    Marker {
        producer_id: ProducerId(producer),
        producer_epoch: ProducerEpoch(0),
        commit: false,
        coordinator_epoch: 1,
    }
}

/// An idempotent batch rolled back (out of space) is not in the log. If a producer
/// without idempotence appends at its offsets before the resend, the resend must still be
/// appended: answered as a duplicate, it would be told the other producer's offsets, and
/// its record, acknowledged, would be in no log.
#[test]
fn a_resend_of_a_rolled_back_batch_is_appended_even_after_a_plain_append_took_its_offsets() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        let disk = SimDisk::new();
        let a = open_sim(&root.path().join("a/orders-0"), LEADER, &disk).await;
        let out = a.produce(batch(Some((5, 0)), 2, "p0"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.base_offset, Offset(0));
        disk.inject(FaultPoint::Append, FaultKind::NoSpace, 0);
        let out = a.produce(batch(Some((5, 2)), 3, "p1"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::KAFKA_STORAGE_ERROR, "rolled back");
        assert_eq!(a.log.log_end_offset(), Offset(2));
        wait_writable(&a).await;
        let out = a.produce(batch(None, 4, "plain"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.base_offset, Offset(2));
        let out = a
            .produce(batch(Some((5, 2)), 3, "p1"), Acks::Leader, soon(), NOW_MS)
            .await;
        assert_eq!((out.error, out.base_offset), (errors::NONE, Offset(6)));
        assert_eq!(
            a.log.log_end_offset(),
            Offset(9),
            "appended, not a duplicate"
        );
    });
}

/// A follower that cuts an ABORT marker (its leader died before the marker was
/// replicated) has the transaction open again: its LSO stops there, and the marker the
/// coordinator writes again, copied from the new leader, records the aborted transaction.
/// Closed instead, the transaction's records would read as committed where this replica
/// leads next. Its `.txnindex` file loses the cut entry, so a reopen after the log grew
/// past it again finds no aborted transaction that is not in the log.
#[test]
fn a_cut_abort_marker_reopens_its_transaction_and_leaves_no_entry_behind() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        let a = open(&a.join("orders-0"), LEADER, 1).await;
        let b_dir = b.join("orders-0");
        let b = open(&b_dir, FOLLOWER, 1).await;
        let both = [LEADER, FOLLOWER];
        a.apply_assignment(&assigned(LEADER, 1, &both, &both), NOW_MS);
        b.apply_assignment(&assigned(LEADER, 1, &both, &both), NOW_MS);
        let out = a
            .produce(txn_batch(9, 2), Acks::Leader, soon(), NOW_MS)
            .await;
        assert_eq!((out.error, out.base_offset), (errors::NONE, Offset(0)));
        assert_eq!(a.write_marker(abort_of(9), NOW_MS).await, errors::NONE);
        for _ in 0..3 {
            replicate_round(&a, &b).await;
        }
        assert_eq!(b.log.log_end_offset(), Offset(3));
        assert_eq!(b.producers.aborted_txns(Offset(0), Offset(100)).len(), 1);
        assert!(!b.producers.has_open_txn(ProducerId(9)));

        // The marker at 2 is cut: the transaction is open again, at once.
        assert_eq!(b.truncate_to(Offset(2)).await, Ok(Offset(2)));
        assert!(b.producers.has_open_txn(ProducerId(9)), "open again");
        assert_eq!(b.producers.first_unstable_offset(), Some(Offset(0)));
        assert!(b.producers.aborted_txns(Offset(0), Offset(100)).is_empty());

        // b leads; the coordinator writes its ABORT again, then b takes other records.
        b.apply_assignment(&assigned(FOLLOWER, 2, &[FOLLOWER], &both), NOW_MS);
        assert_eq!(b.write_marker(abort_of(9), NOW_MS).await, errors::NONE);
        let aborted = b.producers.aborted_txns(Offset(0), Offset(100));
        assert_eq!(aborted.len(), 1, "recorded again: {aborted:?}");
        assert_eq!(aborted[0].last_offset, Offset(2));
        let out = b.produce(batch(None, 5, "other"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.base_offset, Offset(3));
        b.log.close().await.expect("close");
        drop(b);
        let b = open(&b_dir, FOLLOWER, 1).await;
        let aborted = b.producers.aborted_txns(Offset(0), Offset(100));
        assert_eq!(aborted.len(), 1, "one marker, one entry: {aborted:?}");
        assert_eq!(aborted[0].last_offset, Offset(2));
    });
}

/// Retention renames a new log start file in before its data is synced, so a power loss
/// can leave it empty: the log opens, starting at its first segment.
#[test]
fn a_log_whose_start_file_is_empty_still_opens() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let a = open(root.path(), LEADER, 1).await;
        let out = a.produce(batch(None, 3, "x"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        a.log.close().await.expect("close");
        drop(a);
        let start_file = root.path().join("orders-0/weir-log-start-offset");
        std::fs::write(start_file, b"").expect("empty start file");
        let a = open(root.path(), LEADER, 1).await;
        assert_eq!(
            (a.log.log_start_offset(), a.log.log_end_offset()),
            (Offset(0), Offset(3))
        );
    });
}

/// A fenced producer's late transactional offset commit (its epoch older than the one the
/// partition's last marker carried) is refused: appended, it would open a transaction
/// that no coordinator ends, holding the LSO of `__consumer_offsets` forever.
#[test]
fn a_transactional_append_from_a_fenced_producer_epoch_is_refused() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let p = open(root.path(), LEADER, 1).await;
        let first = p.append_coordinator(txn_batch(9, 1), NOW_MS).await;
        assert_eq!(first, Ok(Offset(0)));
        let fencing_abort = Marker {
            producer_epoch: ProducerEpoch(1),
            ..abort_of(9)
        };
        assert_eq!(p.write_marker(fencing_abort, NOW_MS).await, errors::NONE);
        let late = p.append_coordinator(txn_batch(9, 1), NOW_MS).await;
        assert_eq!(late, Err(errors::INVALID_PRODUCER_EPOCH));
        assert!(!p.producers.has_open_txn(ProducerId(9)));
        assert_eq!(p.last_stable_offset(), p.high_watermark());
        assert_eq!(p.log.log_end_offset(), Offset(2), "nothing appended");
    });
}

/// A compacted leader's log has gaps where its cleaner removed whole batches, and a
/// follower fetching at its log end gets the next batch that is left, past it. The
/// follower takes it with its offsets (Kafka requires only that offsets grow), reads
/// across the gap, and keeps it through a reopen; a batch below its log end is still
/// refused.
#[test]
fn a_follower_appends_across_a_gap_its_leaders_cleaner_left() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let dir = root.path().join("follower/orders-0");
        let follower = open(&dir, FOLLOWER, 1).await;
        follower.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(0)));
        let mut first = batch(None, 3, "a");
        wire::batch::assign_offsets(&mut first, Offset(0), LeaderEpoch(0)).expect("offsets");
        follower
            .append_as_follower(first, NOW_MS)
            .await
            .expect("contiguous");
        let mut after_gap = batch(None, 2, "b");
        wire::batch::assign_offsets(&mut after_gap, Offset(8), LeaderEpoch(0)).expect("offsets");
        let info = follower
            .append_as_follower(after_gap, NOW_MS)
            .await
            .expect("a batch past the log end");
        assert_eq!(
            (info.first_offset, info.last_offset),
            (Offset(8), Offset(9))
        );
        assert_eq!(follower.log.log_end_offset(), Offset(10));
        let mut stale = batch(None, 1, "c");
        wire::batch::assign_offsets(&mut stale, Offset(9), LeaderEpoch(0)).expect("offsets");
        assert!(follower.append_as_follower(stale, NOW_MS).await.is_err());

        let read = follower.log.read(Offset(3), 1 << 20, Offset(10)).await;
        let read = read.expect("read in the gap");
        assert_eq!(
            header_at(&follower, Offset(5)).await.base_offset(),
            Offset(8)
        );
        assert_eq!(read.next_offset, Offset(10));
        follower.log.close().await.expect("close");
        drop(follower);
        let reopened = open(&dir, FOLLOWER, 1).await;
        assert_eq!(reopened.log.log_end_offset(), Offset(10));
        assert_eq!(
            header_at(&reopened, Offset(3)).await.base_offset(),
            Offset(8)
        );
    });
}

/// A replica id the leader does not follow (a client posing as a replica) reads as a
/// consumer does, up to the HW: records not yet on the ISR are not handed out, and its
/// fetch offset does not count as any follower's progress.
#[test]
fn an_unknown_replica_id_reads_only_up_to_the_hw() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let (a, _b) = pair_with_ten_copied(root.path(), 1).await;
        let out = a.produce(batch(None, 2, "unreplicated"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        assert_eq!(
            (a.high_watermark(), a.log.log_end_offset()),
            (Offset(10), Offset(12))
        );
        let posing = a
            .fetch_within(
                Offset(10),
                ReadFor::Follower(NodeId(99), wire::BrokerEpoch(1)),
                LeaderEpoch::NONE,
                1 << 20,
                usize::MAX,
                NOW_MS,
            )
            .await;
        assert_eq!(posing.error, errors::NONE);
        assert!(posing.batches.is_empty(), "nothing past the HW");
        // A long poll waits for the same bounds (else its wait would end at once and spin).
        let posing = ReadFor::Follower(NodeId(99), wire::BrokerEpoch(1));
        assert_eq!(a.read_upper(posing), Offset(10));
        let real = ReadFor::Follower(FOLLOWER, wire::BrokerEpoch(1));
        assert_eq!(a.read_upper(real), Offset(12));
        let (error, batches) = follower_fetch(&a, Offset(10), LeaderEpoch::NONE).await;
        assert_eq!(error, errors::NONE);
        assert_eq!(batches.len(), 1, "the real follower reads to the log end");
    });
}

/// A resend waits for its original to be committed. If the original is rolled back
/// (out of space) while it waits and other records then take its offsets, the resend must
/// not be answered with those offsets: its records would be acknowledged and in no log.
/// It is answered KAFKA_STORAGE_ERROR (retriable): sent again, it is appended.
#[test]
fn a_resend_waiting_on_a_batch_that_is_rolled_back_is_not_acknowledged_with_other_offsets() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        let disk = SimDisk::new();
        let a = open_sim(&root.path().join("a/orders-0"), LEADER, &disk).await;
        let out = a.produce(batch(Some((5, 0)), 2, "p0"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.base_offset, Offset(0));
        disk.hold_writes(true);
        let mut original =
            Box::pin(a.produce(batch(Some((5, 2)), 3, "p1"), Acks::Leader, soon(), NOW_MS));
        assert!(
            futures_lite::future::poll_once(&mut original)
                .await
                .is_none()
        );
        assert_eq!(
            a.log.log_end_offset(),
            Offset(5),
            "offsets taken, unwritten"
        );
        let resent = batch(Some((5, 2)), 3, "p1");
        let mut resend = Box::pin(a.produce(resent.clone(), Acks::Leader, soon(), NOW_MS));
        assert!(futures_lite::future::poll_once(&mut resend).await.is_none());
        disk.inject(FaultPoint::Append, FaultKind::NoSpace, 0);
        disk.hold_writes(false);
        assert_eq!(original.await.error, errors::KAFKA_STORAGE_ERROR);
        assert_eq!(a.log.log_end_offset(), Offset(2), "rolled back");
        wait_writable(&a).await;
        let out = a.produce(batch(None, 4, "plain"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.base_offset, Offset(2));
        let answer = weir::shard::mesh::within(soon(), resend).await;
        let answer = answer.expect("the resend is answered");
        assert_eq!(
            (answer.error, answer.base_offset),
            (errors::KAFKA_STORAGE_ERROR, Offset::NONE),
            "not the plain append's offsets"
        );
        let out = a.produce(resent, Acks::Leader, soon(), NOW_MS).await;
        assert_eq!((out.error, out.base_offset), (errors::NONE, Offset(6)));
    });
}

/// On a LogAppendTime topic a resend is answered with its original's append time (as
/// Kafka answers), not -1: the client's record metadata carries the time either way.
#[test]
fn a_resend_on_a_log_append_time_topic_gets_its_originals_append_time() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        let mut configs = configs(1);
        let kind = ("message.timestamp.type", "LogAppendTime");
        configs.insert(kind.0.to_string(), kind.1.to_string());
        let disk = SimDisk::new();
        let dir = root.path().join("orders-0");
        let topic: Arc<str> = Arc::from("orders");
        let a = Partition::open_on(&dir, LEADER, topic, 0, 7, configs, Disk::Sim(disk))
            .await
            .expect("open partition");
        // Records stamped NOW_MS by the client, appended a second later.
        let (sent, appended_at) = (batch(Some((5, 0)), 2, "p0"), NOW_MS + 1_000);
        let out = a.produce(sent.clone(), Acks::Leader, soon(), appended_at);
        let out = out.await;
        assert_eq!(
            (out.error, out.log_append_time_ms),
            (errors::NONE, appended_at)
        );
        let later = NOW_MS + 5_000;
        let resend = a.produce(sent, Acks::Leader, soon(), later).await;
        assert_eq!(
            (resend.error, resend.base_offset, resend.log_append_time_ms),
            (errors::NONE, Offset(0), appended_at)
        );
    });
}

/// A follower's truncation waits for the disk to find its cut; an assignment may make
/// the replica leader meanwhile. A produce then is refused (the log is being cut, not
/// left with the produce's bytes pending past the cut), the truncation completes on the
/// new leader (a release assertion took the shard down), and the new epoch starts at the
/// new log end, where the next produce lands.
#[test]
fn a_replica_that_becomes_leader_during_its_truncation_leads_from_the_cut() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let (_a, b) = pair_with_ten_copied(root.path(), 1).await;
        let both = [LEADER, FOLLOWER];
        let mut cut = Box::pin(b.truncate_to(Offset(5)));
        assert!(
            futures_lite::future::poll_once(&mut cut).await.is_none(),
            "the truncation waits on the disk"
        );
        assert_eq!(
            b.apply_assignment(&assigned(FOLLOWER, 2, &both, &both), NOW_MS),
            RoleChange::Lead
        );
        let during = b.produce(batch(None, 2, "during"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(during.await.error, errors::NOT_LEADER_OR_FOLLOWER);
        // Nor are reads served: a follower of the new leader must not copy (and move the
        // HW over) records about to be cut.
        let read = b
            .fetch_within(
                Offset(0),
                ReadFor::Follower(LEADER, wire::BrokerEpoch(1)),
                LeaderEpoch(2),
                1 << 20,
                usize::MAX,
                NOW_MS,
            )
            .await;
        assert_eq!(
            read.error,
            errors::NOT_LEADER_OR_FOLLOWER,
            "a read during the cut"
        );
        assert!(read.batches.is_empty());
        assert_eq!(cut.await, Ok(Offset(4)), "cut at the batch holding 5");
        assert_eq!(b.log.log_end_offset(), Offset(4));
        assert_eq!(b.replica().epoch_start(), Some(Offset(4)));
        let after = b.produce(batch(None, 2, "after"), Acks::Leader, soon(), NOW_MS);
        let after = after.await;
        assert_eq!((after.error, after.base_offset), (errors::NONE, Offset(4)));
        assert_eq!(b.epoch_entries().last(), Some(&(LeaderEpoch(2), Offset(4))));
        assert_eq!(
            header_at(&b, Offset(4)).await.partition_leader_epoch(),
            LeaderEpoch(2)
        );
    });
}

/// KIP-207 on a new leader with a transaction open from before the failover: earliest is
/// answered at once; latest waits only for the HW to reach the epoch's start, then is the
/// LSO (the open transaction's first offset), as Kafka. The LSO never enters the check: it
/// held every read_committed ListOffsets until the transaction ended (found by review).
#[test]
fn a_new_leaders_list_offsets_waits_for_its_hw_not_for_a_transaction_open_across_the_failover() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let (a, b) = pair_with_ten_copied(root.path(), 1).await;
        let both = [LEADER, FOLLOWER];
        let out = a.produce(txn_batch(9, 2), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE, "open transaction at 10..12");
        assert!(!replicate_round(&a, &b).await, "b copies 10..12");
        let (error, _) = follower_fetch(&a, Offset(12), LeaderEpoch(1)).await;
        assert_eq!(error, errors::NONE);

        // a dies; b leads epoch 2 from 12 with its learned HW 10.
        b.apply_assignment(&assigned(FOLLOWER, 2, &both, &both), NOW_MS);
        assert_eq!(b.high_watermark(), Offset(10));
        let committed = Lister {
            read_committed: true,
            consumer: true,
            lagging_hw_error: Some(errors::OFFSET_NOT_AVAILABLE),
        };
        let list = |ts: i64| b.list_offset_for(ts, LeaderEpoch::NONE, committed);
        let earliest = list(-2).await;
        assert_eq!((earliest.error, earliest.offset), (errors::NONE, Offset(0)));
        assert_eq!(
            list(-1).await.error,
            errors::OFFSET_NOT_AVAILABLE,
            "HW lags"
        );

        // a comes back as b's follower and fetches to b's end: b's HW reaches 12.
        let caught_up = b
            .fetch_within(
                Offset(12),
                ReadFor::Follower(LEADER, BrokerEpoch(1)),
                LeaderEpoch(2),
                1 << 20,
                usize::MAX,
                NOW_MS,
            )
            .await;
        assert_eq!(caught_up.error, errors::NONE);
        assert_eq!(b.high_watermark(), Offset(12));
        let latest = list(-1).await;
        assert_eq!(
            (latest.error, latest.offset),
            (errors::NONE, Offset(10)),
            "the LSO, while the transaction stays open"
        );
    });
}

/// DeleteRecords past an open transaction's first offset: the LSO is the log start, not
/// below it, so read_committed latest is an offset a consumer can fetch (Kafka's rule; it
/// looped on OFFSET_OUT_OF_RANGE before, found by review).
#[test]
fn the_last_stable_offset_is_never_below_the_log_start() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let p = open(&root.path().join("orders-0"), LEADER, 1).await;
        let out = p.produce(txn_batch(9, 2), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE, "open transaction at 0..2");
        let out = p.produce(batch(None, 2, "plain"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        assert_eq!(p.last_stable_offset(), Offset(0), "held by the transaction");
        let start = p.delete_records(Offset::NONE, PATIENCE, |_| true);
        let start = start.await.expect("deleted");
        assert!(start > Offset(0));
        assert_eq!(p.last_stable_offset(), start);
        let committed = Lister {
            read_committed: true,
            consumer: true,
            lagging_hw_error: Some(errors::OFFSET_NOT_AVAILABLE),
        };
        let latest = p.list_offset_for(-1, LeaderEpoch::NONE, committed).await;
        assert_eq!((latest.error, latest.offset), (errors::NONE, start));
        let read = p
            .fetch_within(
                latest.offset,
                ReadFor::Consumer(Isolation::ReadCommitted),
                LeaderEpoch::NONE,
                1 << 20,
                usize::MAX,
                NOW_MS,
            )
            .await;
        assert_eq!(read.error, errors::NONE, "fetchable, not out of range");
    });
}

/// An ABORT marker rolled back (out of space) closed its transaction in the producer
/// table before the cut; with no append since, nothing rebuilt the table. A close then
/// must not snapshot that table at the log end: reopened, the transaction is open again,
/// so the marker the coordinator writes again records the abort (found by review).
#[test]
fn a_close_after_a_rolled_back_marker_keeps_its_transaction_open() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        let disk = SimDisk::new();
        let dir = root.path().join("a/orders-0");
        let a = open_sim(&dir, LEADER, &disk).await;
        let out = a.produce(txn_batch(9, 2), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        disk.inject(FaultPoint::Append, FaultKind::NoSpace, 0);
        assert_ne!(a.write_marker(abort_of(9), NOW_MS).await, errors::NONE);
        assert_eq!(a.log.log_end_offset(), Offset(2), "the marker rolled back");
        wait_writable(&a).await;
        a.log.close().await.expect("closed");
        a.producers.close(&a.log);
        drop(a);
        let again = open_sim(&dir, LEADER, &disk).await;
        assert!(
            again.producers.has_open_txn(ProducerId(9)),
            "open: its ABORT marker was rolled back"
        );
    });
}

/// Waits (bounded) until `done` holds, yielding to spawned tasks in between.
async fn until(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "gave up waiting: {what}");
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
}

/// DeleteRecords is answered once every live replica's log start, as its fetches report
/// it, reached the target (Kafka's low watermark): answered when only the leader had
/// moved, a failover in the next fetch rounds elected a follower still serving the
/// deleted records (found by review). A follower on a node no longer live does not hold
/// it back; one that does not follow in time makes it REQUEST_TIMED_OUT; a leader that
/// stops leading meanwhile answers NOT_LEADER_OR_FOLLOWER.
#[test]
fn delete_records_waits_until_every_live_replica_moved_its_log_start() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let p = open(&root.path().join("orders-0"), LEADER, 1).await;
        let all = [LEADER, FOLLOWER, THIRD];
        let epoch = LeaderEpoch(1);
        p.update_replica(|r| r.become_leader(epoch, all.to_vec(), &all));
        let out = p.produce(batch(None, 10, "a"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        for f in [FOLLOWER, THIRD] {
            let read = p.fetch_within(
                Offset(10),
                ReadFor::Follower(f, BrokerEpoch(1)),
                epoch,
                1 << 20,
                usize::MAX,
                NOW_MS,
            );
            assert_eq!(read.await.error, errors::NONE);
        }
        assert_eq!(p.high_watermark(), Offset(10));

        // Followers not heard from about their log start: the answer waits.
        let answer = Rc::new(std::cell::Cell::new(None));
        glommio::spawn_local({
            let (p, answer) = (p.clone(), answer.clone());
            async move {
                let deleted = p.delete_records(Offset(6), PATIENCE, |_| true).await;
                answer.set(Some(deleted));
            }
        })
        .detach();
        until("the leader's log start", || {
            p.log.log_start_offset() == Offset(6)
        })
        .await;
        let_spawned_run().await;
        assert_eq!(answer.get(), None, "no follower has moved yet");
        assert_eq!(p.low_watermark(|_| true), Some(Offset::NONE));
        p.follower_log_start(FOLLOWER, Offset(6));
        let_spawned_run().await;
        assert_eq!(answer.get(), None, "the third replica still holds 0..6");
        p.follower_log_start(THIRD, Offset(7));
        until("the answer", || answer.get().is_some()).await;
        assert_eq!(answer.get(), Some(Ok(Offset(6))), "the low watermark");

        // A follower that does not follow within the request's timeout.
        let started = Instant::now();
        let late = p.delete_records(Offset(8), Duration::from_millis(200), |_| true);
        assert_eq!(late.await, Err(errors::REQUEST_TIMED_OUT));
        assert!(started.elapsed() >= Duration::from_millis(200));
        // A replica on a node that is not live does not count.
        p.follower_log_start(FOLLOWER, Offset(9));
        let live = |n: NodeId| n != THIRD;
        let deleted = p.delete_records(Offset(9), PATIENCE, live).await;
        assert_eq!(deleted, Ok(Offset(9)));

        // Demoted while waiting.
        answer.set(None);
        glommio::spawn_local({
            let (p, answer) = (p.clone(), answer.clone());
            async move {
                let deleted = p.delete_records(Offset(10), PATIENCE, |_| true).await;
                answer.set(Some(deleted));
            }
        })
        .detach();
        until("the leader's log start", || {
            p.log.log_start_offset() == Offset(10)
        })
        .await;
        p.update_replica(|r| r.become_follower(FOLLOWER, LeaderEpoch(2)));
        until("the answer", || answer.get().is_some()).await;
        assert_eq!(answer.get(), Some(Err(errors::NOT_LEADER_OR_FOLLOWER)));
    });
}

/// A follower fetch parks after its read; the log start may move (DeleteRecords) between
/// that read and the park, when no wake reaches it. The park's readiness check counts a
/// log start the follower has not been sent, so such a fetch is answered at once instead
/// of after `replica.fetch.wait.max.ms` (found by review). A consumer's is not, and the
/// answer that carries the new start makes it unready again.
#[test]
fn a_parked_follower_fetch_is_ready_for_a_log_start_it_was_not_sent() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let p = open(&root.path().join("orders-0"), LEADER, 1).await;
        let all = [LEADER, FOLLOWER];
        let epoch = LeaderEpoch(1);
        p.update_replica(|r| r.become_leader(epoch, all.to_vec(), &all));
        let out = p.produce(batch(None, 10, "a"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        let follower = ReadFor::Follower(FOLLOWER, BrokerEpoch(1));
        let read = |p: Rc<Partition>| async move {
            p.fetch_within(Offset(10), follower, epoch, 1 << 20, usize::MAX, NOW_MS)
                .await
        };
        assert_eq!(read(p.clone()).await.error, errors::NONE);
        assert!(
            !p.fetch_ready(follower, Offset(10)),
            "nothing new: it parks"
        );

        glommio::spawn_local({
            let p = p.clone();
            async move {
                let _ = p.delete_records(Offset(4), PATIENCE, |_| true).await;
            }
        })
        .detach();
        until("the leader's log start", || {
            p.log.log_start_offset() == Offset(4)
        })
        .await;
        assert!(
            p.fetch_ready(follower, Offset(10)),
            "a log start it was not sent is news"
        );
        assert!(!p.fetch_ready(CONSUMER, Offset(10)), "not to a consumer");
        let answered = read(p.clone()).await;
        assert_eq!(answered.log_start_offset, Offset(4));
        assert!(!p.fetch_ready(follower, Offset(10)), "sent now");
    });
}

/// A leader change writes the leader epoch checkpoint (two fsyncs) in the blocking pool,
/// not on the shard's thread: a failover made the node leader of thousands of partitions
/// and the shard answered nothing while it fsynced each one (found by review). The entry
/// is still on disk before the first append under the epoch: an append right after the
/// change finds it there, and a reopened log has it.
#[test]
fn a_leader_change_writes_its_epoch_checkpoint_off_the_shard_thread_before_any_append() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let dir = root.path().join("orders-0");
        let p = open(&dir, LEADER, 1).await;
        let both = [LEADER, FOLLOWER];
        let change = p.apply_assignment(&assigned(LEADER, 1, &both, &both), NOW_MS);
        assert_eq!(change, RoleChange::Lead);
        until("the checkpoint on disk", || p.epochs_durable()).await;
        assert_ne!(
            p.epochs_written_by(),
            Some(std::thread::current().id()),
            "written by the shard's thread"
        );
        let out = p.produce(batch(None, 3, "a"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);

        // Leader again under epoch 2 and an append at once: the entry is on disk first.
        let change = p.apply_assignment(&assigned(LEADER, 2, &both, &both), NOW_MS);
        assert_eq!(change, RoleChange::Lead);
        let out = p.produce(batch(None, 2, "b"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        assert!(p.epochs_durable());
        let files = dir.join("orders-0");
        let on_disk = weir::storage::epochs::LeaderEpochCache::load(&files).expect("load");
        let epochs = vec![(LeaderEpoch(1), Offset(0)), (LeaderEpoch(2), Offset(3))];
        assert_eq!(on_disk.entries(), epochs);
        p.log.close().await.expect("closed");
        drop(p);
        let again = open(&dir, LEADER, 1).await;
        assert_eq!(again.epoch_entries(), epochs);
    });
}

/// A batch of `records` records of about `bytes` bytes in all, from idempotent producer
/// `pid` at sequence `seq`, with the leader's offsets and epoch already in it.
fn copied_batch(pid: i64, seq: i32, bytes: usize, at: Offset, epoch: LeaderEpoch) -> BytesMut {
    let records = 4;
    let value = "v".repeat(bytes / records);
    let records = (0..records)
        .map(|i| NewRecord::value(NOW_MS + i as i64, value.clone()))
        .collect();
    let built = BatchBuilder {
        producer_id: ProducerId(pid),
        producer_epoch: ProducerEpoch(0),
        base_sequence: Sequence(seq),
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("a batch from test data");
    let mut b = BytesMut::from(&built[..]);
    wire::batch::assign_offsets(&mut b, at, epoch).expect("offsets");
    b
}

/// A fetched chunk larger than the follower's `segment.bytes` (64 KiB here; a fetch
/// answer holds up to `replica.fetch.max.bytes`, 1 MiB) is appended in parts that roll
/// the log between them, keeping the leader's offsets, epochs and bytes; a single batch
/// larger than a segment gets a segment of its own. Before, the whole chunk was refused
/// with RECORD_LIST_TOO_LARGE and the follower stalled on it for good. The producer
/// state recorded every part: after taking over, the follower answers a resend of the
/// chunk's last batch as a duplicate.
#[test]
fn a_follower_appends_a_chunk_larger_than_a_segment_in_parts_that_each_fit_one() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let dir = root.path().join("follower/orders-0");
        let follower = open(&dir, FOLLOWER, 1).await;
        follower.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(2)));
        let segment_bytes = 65_536;
        let pid = 7;
        // Epoch 1, then 2 mid-chunk; the fifth batch is larger than a segment.
        let sizes = [20_000, 20_000, 20_000, 20_000, 100_000, 20_000, 20_000];
        let (mut chunk, mut batches, mut at) = (BytesMut::new(), Vec::new(), Offset(0));
        for (i, size) in sizes.iter().enumerate() {
            let epoch = LeaderEpoch(if i < 3 { 1 } else { 2 });
            let b = copied_batch(pid, 4 * i as i32, *size, at, epoch);
            at = at.add(4);
            chunk.extend_from_slice(&b);
            batches.push(b);
        }
        assert!(chunk.len() > 3 * segment_bytes);
        let expected = chunk.to_vec();

        let info = follower
            .append_as_follower(chunk, NOW_MS)
            .await
            .expect("a chunk larger than a segment");
        assert_eq!(
            (info.first_offset, info.last_offset),
            (Offset(0), at.add(-1))
        );
        assert_eq!(info.batches, sizes.len() as u32);
        assert_eq!(follower.log.log_end_offset(), at);
        assert_eq!(whole_log(&follower).await, expected, "the leader's bytes");
        let epochs = vec![(LeaderEpoch(1), Offset(0)), (LeaderEpoch(2), Offset(12))];
        assert_eq!(follower.epoch_entries(), epochs);

        // Each segment fits `segment.bytes`, or holds one batch alone (the big one).
        let bases = follower.log.segment_bases();
        assert_eq!(
            bases,
            vec![Offset(0), Offset(12), Offset(16), Offset(20)],
            "rolled where a leader appending these batches would"
        );
        for (i, base) in bases.iter().enumerate() {
            let end = bases.get(i + 1).copied().unwrap_or(at);
            let read = follower.log.read(*base, 1 << 24, end).await.expect("read");
            let bytes = read.bytes();
            assert!(
                bytes <= segment_bytes || read.batches.len() == 1,
                "segment {base}: {bytes} bytes in {} batches",
                read.batches.len()
            );
        }
        assert_eq!(
            follower
                .log
                .read(Offset(16), 1 << 24, Offset(20))
                .await
                .expect("read")
                .batches,
            vec![batches[4].clone().freeze()],
            "the big batch alone"
        );

        // Reopened, the log is the same.
        follower.log.close().await.expect("close");
        drop(follower);
        let follower = open(&dir, FOLLOWER, 1).await;
        assert_eq!(follower.log.segment_bases(), bases);
        assert_eq!(whole_log(&follower).await, expected);
        assert_eq!(follower.epoch_entries(), epochs);

        // Leader now: the producer state knows the chunk's last batch.
        follower.update_replica(|r| r.become_leader(LeaderEpoch(3), vec![FOLLOWER], &[FOLLOWER]));
        let resend = batch(Some((pid, 24)), 4, "resend");
        let resend = follower.produce(resend, Acks::All, soon(), NOW_MS).await;
        assert_eq!(
            (resend.error, resend.base_offset),
            (errors::NONE, Offset(24))
        );
        assert_eq!(
            follower.log.log_end_offset(),
            at,
            "a duplicate appends nothing"
        );
    });
}

/// The leader epoch checkpoint of `p` (in data dir `dir`) as the file on disk holds it.
fn epochs_on_disk(dir: &Path) -> Vec<(LeaderEpoch, Offset)> {
    let files = dir.join("orders-0");
    let on_disk = weir::storage::epochs::LeaderEpochCache::load(&files).expect("load");
    on_disk.entries()
}

/// A follower's first batch of a new leader epoch, and its truncations, write the leader
/// epoch checkpoint (an atomic write, two fsyncs) in the blocking pool, not on the
/// shard's thread, where it stalled every partition of the shard (found by review, after
/// a leader's change had moved there). The entry is still on disk before the append
/// under its epoch returns, and a cut's removal before the truncation does.
#[test]
fn a_follower_writes_its_epoch_checkpoint_off_the_shard_thread_before_it_goes_on() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let dir = root.path().join("follower");
        let follower = open(&dir, FOLLOWER, 1).await;
        follower.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(2)));
        let shard = std::thread::current().id();
        let copy = |at: i64, epoch: i32, seq: i32| {
            copied_batch(9, seq, 100, Offset(at), LeaderEpoch(epoch))
        };

        let appended = follower.append_as_follower(copy(0, 1, 0), NOW_MS).await;
        appended.expect("epoch 1");
        assert!(
            follower.epochs_durable(),
            "on disk before the append returned"
        );
        assert_ne!(
            follower.epochs_written_by(),
            Some(shard),
            "written on the shard"
        );
        assert_eq!(epochs_on_disk(&dir), vec![(LeaderEpoch(1), Offset(0))]);

        let appended = follower.append_as_follower(copy(4, 2, 4), NOW_MS).await;
        appended.expect("epoch 2");
        assert!(follower.epochs_durable());
        assert_ne!(
            follower.epochs_written_by(),
            Some(shard),
            "written on the shard"
        );
        let both = vec![(LeaderEpoch(1), Offset(0)), (LeaderEpoch(2), Offset(4))];
        assert_eq!(epochs_on_disk(&dir), both);

        // A truncation into epoch 1 takes epoch 2's entry off the disk before it returns.
        assert_eq!(follower.truncate_to(Offset(4)).await, Ok(Offset(4)));
        assert!(follower.epochs_durable());
        assert_ne!(
            follower.epochs_written_by(),
            Some(shard),
            "written on the shard"
        );
        assert_eq!(epochs_on_disk(&dir), vec![(LeaderEpoch(1), Offset(0))]);

        // A restart at the leader's log start takes them all.
        assert_eq!(follower.restart_at(Offset(20)).await, Ok(()));
        assert!(follower.epochs_durable());
        assert_ne!(
            follower.epochs_written_by(),
            Some(shard),
            "written on the shard"
        );
        assert_eq!(epochs_on_disk(&dir), Vec::new());
        assert_eq!(follower.epoch_entries(), Vec::new());
    });
}

/// A follower's append that brings a new epoch awaits the epoch checkpoint's write; if
/// meanwhile the replica follows another leader (a failover moved it to a new fetcher),
/// the batches are the old leader's and are refused, not appended after whatever the new
/// leader's fetcher does (found by review: they could land where the new leader has other
/// records, under an epoch entry that no longer says so).
#[test]
fn a_follower_append_that_outlives_its_leader_is_refused() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let follower = open(&root.path().join("follower"), FOLLOWER, 1).await;
        follower.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(5)));
        let copy = |at: i64, epoch: i32, seq: i32| {
            copied_batch(9, seq, 100, Offset(at), LeaderEpoch(epoch))
        };
        let appended = follower.append_as_follower(copy(0, 4, 0), NOW_MS).await;
        appended.expect("epoch 4");
        let end = follower.log.log_end_offset();
        // A chunk with a new epoch: its append parks on the checkpoint's write.
        let mut stale = Box::pin(follower.append_as_follower(copy(end.get(), 5, 4), NOW_MS));
        assert!(
            futures_lite::future::poll_once(&mut stale).await.is_none(),
            "the append waits for the epoch checkpoint"
        );
        // A failover meanwhile: another leader, a newer epoch.
        follower.update_replica(|r| r.become_follower(NodeId(7), LeaderEpoch(6)));
        assert_eq!(
            stale.await.map(|_| ()),
            Err(errors::NOT_LEADER_OR_FOLLOWER),
            "the old leader's batches are not appended"
        );
        assert_eq!(follower.log.log_end_offset(), end, "nothing appended");
    });
}

/// KIP-392: a consumer's read from a follower is bounded by the HW the follower learned,
/// not by its log end nor by the leader's HW: it never serves records above its own HW;
/// between its HW and its log end it answers empty, past its log end
/// OFFSET_OUT_OF_RANGE; a stale leader epoch is fenced as on a leader (KIP-320). The
/// leader-only read (Fetch below v11) still refuses it.
#[test]
fn a_follower_serves_consumers_only_up_to_the_hw_it_learned() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let (a, b) = pair_with_ten_copied(root.path(), 1).await;
        let out = a.produce(batch(None, 2, "more"), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        assert!(!replicate_round(&a, &b).await, "b copies 10..12");
        let (error, _) = follower_fetch(&a, Offset(12), LeaderEpoch(1)).await;
        assert_eq!(error, errors::NONE);
        assert_eq!(
            (
                a.high_watermark(),
                b.high_watermark(),
                b.log.log_end_offset()
            ),
            (Offset(12), Offset(10), Offset(12)),
            "b holds 12 but has learned HW 10 only"
        );
        let on_b = |at: Offset, epoch: LeaderEpoch, isolation: Isolation| {
            let b = b.clone();
            async move {
                let sizes = (1 << 20, usize::MAX);
                b.fetch_as_follower(at, isolation, epoch, sizes, NOW_MS)
                    .await
            }
        };
        let plain = Isolation::ReadUncommitted;
        let from_0 = on_b(Offset(0), LeaderEpoch(1), plain).await;
        assert_eq!(from_0.error, errors::NONE);
        assert_eq!(from_0.high_watermark, Offset(10));
        let last = from_0.batches.last().expect("records below the HW");
        let end = read_header(last).expect("header").next_offset();
        assert_eq!(end, Offset(10), "up to b's HW, not its log end 12");
        let committed = on_b(Offset(0), LeaderEpoch::NONE, Isolation::ReadCommitted).await;
        assert_eq!(committed.error, errors::NONE);
        assert_eq!(committed.last_stable_offset, Offset(10));
        assert_eq!(
            committed.aborted,
            Some(Vec::new()),
            "no aborted transactions"
        );
        let at_hw = on_b(Offset(10), LeaderEpoch(1), plain).await;
        assert_eq!(at_hw.error, errors::NONE, "below b's log end: in range");
        assert!(at_hw.batches.is_empty(), "nothing above b's HW");
        let past = on_b(Offset(13), LeaderEpoch(1), plain).await;
        assert_eq!(past.error, errors::OFFSET_OUT_OF_RANGE, "past b's log end");
        let stale = on_b(Offset(0), LeaderEpoch(0), plain).await;
        assert_eq!(stale.error, errors::FENCED_LEADER_EPOCH);
        let newer = on_b(Offset(0), LeaderEpoch(2), plain).await;
        assert_eq!(newer.error, errors::UNKNOWN_LEADER_EPOCH);
        let leader_only = b
            .fetch_within(
                Offset(0),
                CONSUMER,
                LeaderEpoch(1),
                1 << 20,
                usize::MAX,
                NOW_MS,
            )
            .await;
        assert_eq!(leader_only.error, errors::NOT_LEADER_OR_FOLLOWER);

        // b learns HW 12 from its next round: it now serves 10..12.
        replicate_round(&a, &b).await;
        assert_eq!(b.high_watermark(), Offset(12));
        let moved = on_b(Offset(10), LeaderEpoch(1), plain).await;
        assert_eq!(moved.error, errors::NONE);
        assert!(!moved.batches.is_empty(), "10..12 once b's HW covers them");
    });
}

/// KIP-392 with transactions: a follower's read_committed read stops at the LSO it
/// knows (an open transaction copied from its leader holds it back) and lists the aborted
/// transactions it rebuilt from the copied markers, as its leader would.
#[test]
fn a_follower_serves_read_committed_up_to_its_own_lso_with_its_aborted_transactions() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let a = open(&root.path().join("a/orders-0"), LEADER, 1).await;
        let b = open(&root.path().join("b/orders-0"), FOLLOWER, 1).await;
        let both = [LEADER, FOLLOWER];
        a.apply_assignment(&assigned(LEADER, 1, &both, &both), NOW_MS);
        b.apply_assignment(&assigned(LEADER, 1, &both, &both), NOW_MS);
        let out = a.produce(txn_batch(9, 2), Acks::Leader, soon(), NOW_MS);
        assert_eq!(out.await.base_offset, Offset(0));
        for _ in 0..3 {
            replicate_round(&a, &b).await;
        }
        assert_eq!(b.high_watermark(), Offset(2));
        let committed = |b: Rc<Partition>| async move {
            let sizes = (1 << 20, usize::MAX);
            let isolation = Isolation::ReadCommitted;
            b.fetch_as_follower(Offset(0), isolation, LeaderEpoch(1), sizes, NOW_MS)
                .await
        };
        let open_txn = committed(b.clone()).await;
        assert_eq!(open_txn.error, errors::NONE);
        assert_eq!(
            open_txn.last_stable_offset,
            Offset(0),
            "the open transaction"
        );
        assert!(open_txn.batches.is_empty(), "nothing past the LSO");

        assert_eq!(a.write_marker(abort_of(9), NOW_MS).await, errors::NONE);
        for _ in 0..3 {
            replicate_round(&a, &b).await;
        }
        assert_eq!(b.high_watermark(), Offset(3));
        let aborted = committed(b.clone()).await;
        assert_eq!(aborted.error, errors::NONE);
        assert_eq!(aborted.last_stable_offset, Offset(3));
        assert!(!aborted.batches.is_empty());
        assert_eq!(aborted.aborted, Some(vec![(ProducerId(9), Offset(0))]));
    });
}

/// A fetched chunk larger than the follower's segment is appended in parts; when a later
/// part fails (here out of space creating the next segment's file, so it is rolled back)
/// the earlier parts stay in the log. The append answers the failure — before, it
/// answered the earlier parts as a success, and the fetcher neither paused nor warned —
/// and the follower stays consistent: its log end is where the parts it holds end, its
/// epoch cache has no epoch the log does not hold (the failed part's newer epoch goes),
/// its producer state has no transaction the failed part opened, and the next fetch from
/// its log end copies the rest until both logs are identical.
#[test]
fn a_chunk_whose_later_part_fails_leaves_the_follower_consistent_at_its_log_end() {
    run_on_shard(|| async {
        let root = tempfile::tempdir_in(test_root()).expect("tempdir");
        prime_dma_probe(root.path()).await.expect("prime DMA probe");
        let disk = SimDisk::new();
        let leader = open(&root.path().join("a/orders-0"), LEADER, 1).await;
        let follower = open_sim(&root.path().join("b/orders-0"), FOLLOWER, &disk).await;
        let both = [LEADER, FOLLOWER];
        leader.update_replica(|r| r.become_leader(LeaderEpoch(1), both.to_vec(), &both));
        follower.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(1)));
        let produce = |b: BytesMut| leader.produce(b, Acks::Leader, soon(), NOW_MS);
        assert_eq!(produce(batch(None, 1, "first")).await.error, errors::NONE);
        // The follower's first segment file exists: the next roll is the chunk's.
        fetch_round(&leader, &follower, LeaderEpoch(1)).await;
        assert_eq!(follower.log.log_end_offset(), Offset(1));

        // Offsets 1..=8: eight ~9 KB batches, more than the 64 KiB segment takes after
        // the first; offset 9, under epoch 2, opens a transaction.
        for _ in 0..8 {
            let big = weir::storage::testing::batch_of_size(NOW_MS, 1, 9_000);
            assert_eq!(produce(big).await.error, errors::NONE);
        }
        leader.update_replica(|r| r.become_leader(LeaderEpoch(2), both.to_vec(), &both));
        follower.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(2)));
        assert_eq!(produce(txn_batch(42, 1)).await.error, errors::NONE);
        let (error, batches) = follower_fetch(&leader, Offset(1), LeaderEpoch(2)).await;
        assert_eq!((error, batches.len()), (errors::NONE, 9));
        let mut chunk = BytesMut::new();
        for b in &batches {
            chunk.extend_from_slice(b);
        }
        let parts = follower.log.replica_parts(&chunk).expect("parts");
        assert_eq!(parts.len(), 2, "{parts:?}");

        disk.inject(FaultPoint::Roll, FaultKind::NoSpace, 0);
        let appended = follower.append_as_follower(chunk, NOW_MS).await;
        assert!(appended.is_err(), "the failure is answered: {appended:?}");
        let end = follower.log.log_end_offset();
        assert!(end > Offset(1), "the first part stays appended");
        assert!(end < Offset(10), "the failed part is not in the log");
        assert_eq!(follower.replica().log_end(), end, "the replica's log end");
        let entries = follower.epoch_entries();
        assert!(
            entries.iter().all(|(_, start)| *start < end),
            "no epoch past the log end {end}: {entries:?}"
        );
        assert!(
            !follower.producers.has_open_txn(ProducerId(42)),
            "the failed part's transaction is not open"
        );

        // The fetcher pauses, then fetches from the log end: the rest is copied.
        wait_writable(&follower).await;
        fetch_round(&leader, &follower, LeaderEpoch(2)).await;
        assert_eq!(follower.log.log_end_offset(), Offset(10));
        assert_eq!(whole_log(&follower).await, whole_log(&leader).await);
        assert!(follower.producers.has_open_txn(ProducerId(42)));
        let last = follower.epoch_entries().last().copied();
        assert_eq!(last, Some((LeaderEpoch(2), Offset(9))));
    });
}
