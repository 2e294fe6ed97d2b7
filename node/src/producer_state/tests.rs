//! Unit tests of the producer state: the idempotence check's decision table, the dedup
//! window, wrap-around, expiry, snapshots and rebuild-equals-live.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use wire::batch::BatchHeader;
use wire::{Offset, ProducerEpoch, ProducerId, Sequence};
use zerocopy::FromZeros;

use super::*;

const PID: ProducerId = ProducerId(7);
const NOW: i64 = 1_700_000_000_000;

/// A batch header as a client sends it: `count` records from `first_seq`.
fn header(pid: i64, epoch: i16, first_seq: i32, count: i32) -> BatchHeader {
    let mut h = BatchHeader::new_zeroed();
    h.base_offset.set(0);
    h.magic = 2;
    h.last_offset_delta.set(count - 1);
    h.base_timestamp.set(NOW);
    h.max_timestamp.set(NOW + i64::from(count));
    h.producer_id.set(pid);
    h.producer_epoch.set(epoch);
    h.base_sequence.set(first_seq);
    h.records_count.set(count);
    h
}

/// A partition log stand-in: assigns offsets the way the storage log does.
struct Partition {
    table: ProducerStateTable,
    log_end: Offset,
    log: Vec<BatchHeader>,
}

impl Partition {
    fn new(config: ProducerStateConfig) -> Partition {
        Partition {
            table: ProducerStateTable::new(config),
            log_end: Offset(0),
            log: Vec::new(),
        }
    }

    /// The produce path: check, then record and append on `Append`.
    fn produce(&mut self, h: &BatchHeader) -> Result<Verdict, Rejection> {
        let verdict = self.table.check(h)?;
        if matches!(verdict, Verdict::Append | Verdict::NotIdempotent) {
            let mut stored = *h;
            stored.base_offset.set(self.log_end.get());
            self.table.record_append(h, self.log_end, NOW);
            self.log_end = stored.next_offset();
            self.log.push(stored);
        }
        Ok(verdict)
    }
}

fn partition() -> Partition {
    Partition::new(ProducerStateConfig::default())
}

#[test]
fn the_same_batch_twice_is_answered_with_the_first_offsets() {
    let mut p = partition();
    p.produce(&header(0, 0, 0, 3)).unwrap(); // another producer's batch moves offsets
    let b = header(PID.0, 0, 0, 4);
    assert_eq!(p.produce(&b), Ok(Verdict::Append));
    let again = p.produce(&b).unwrap();
    let Verdict::Duplicate(original) = again else {
        panic!("expected a duplicate, got {again:?}")
    };
    assert_eq!(original.first_offset, Offset(3));
    assert_eq!(original.last_offset, Offset(6));
    assert_eq!(original.max_timestamp, NOW + 4);
    assert_eq!(p.log.len(), 2, "the resend appended nothing");
    assert_eq!(p.log_end, Offset(7));
    assert_eq!(p.table.counters().duplicates_dropped, 1);
}

#[test]
fn each_of_the_last_five_batches_resent_is_a_duplicate() {
    let mut p = partition();
    let batches: Vec<BatchHeader> = (0..7).map(|i| header(PID.0, 0, i * 2, 2)).collect();
    for b in &batches {
        assert_eq!(p.produce(b), Ok(Verdict::Append));
    }
    for (i, b) in batches.iter().enumerate().skip(2) {
        let first = Offset(i as i64 * 2);
        match p.produce(b) {
            Ok(Verdict::Duplicate(m)) => {
                assert_eq!((m.first_offset, m.last_offset), (first, first.add(1)));
                assert_eq!(m.first_sequence, Sequence(i as i32 * 2));
            }
            other => panic!("batch {i}: expected duplicate, got {other:?}"),
        }
    }
    // Older than the window: Kafka cannot tell, so it is out of order.
    let err = p.produce(&batches[1]).unwrap_err();
    assert_eq!(err.error_code(), OUT_OF_ORDER_SEQUENCE_NUMBER);
    assert_eq!(p.log.len(), 7);
    assert_eq!(p.table.counters().duplicates_dropped, 5);
}

#[test]
fn a_gap_is_out_of_order_and_changes_nothing() {
    let mut p = partition();
    p.produce(&header(PID.0, 0, 0, 5)).unwrap();
    let before = p.table.clone();
    let err = p.produce(&header(PID.0, 0, 6, 1)).unwrap_err();
    assert_eq!(
        err,
        Rejection::OutOfOrderSequence {
            producer_id: PID,
            epoch: ProducerEpoch(0),
            got: Sequence(6),
            expected: Sequence(5),
        }
    );
    assert_eq!(err.error_code(), 45);
    assert!(p.table.same_producers(&before));
    assert_eq!(p.produce(&header(PID.0, 0, 5, 1)), Ok(Verdict::Append));
    assert_eq!(p.table.counters().out_of_order_rejections, 1);
}

#[test]
fn a_resend_that_overlaps_but_differs_is_out_of_order() {
    let mut p = partition();
    p.produce(&header(PID.0, 0, 0, 5)).unwrap();
    let err = p.produce(&header(PID.0, 0, 0, 3)).unwrap_err();
    assert_eq!(err.error_code(), OUT_OF_ORDER_SEQUENCE_NUMBER);
}

#[test]
fn an_old_epoch_after_a_bump_is_fenced() {
    let mut p = partition();
    p.produce(&header(PID.0, 0, 0, 2)).unwrap();
    p.produce(&header(PID.0, 1, 0, 2)).unwrap();
    let err = p.produce(&header(PID.0, 0, 2, 2)).unwrap_err();
    assert_eq!(err.error_code(), INVALID_PRODUCER_EPOCH);
    // Even an exact resend of the old epoch's batch is fenced, not a duplicate.
    let err = p.produce(&header(PID.0, 0, 0, 2)).unwrap_err();
    assert_eq!(err.error_code(), 47);
    assert_eq!(p.table.counters().fenced_requests, 2);
    assert_eq!(p.log.len(), 2);
}

#[test]
fn a_new_epoch_must_start_at_zero() {
    let mut p = partition();
    p.produce(&header(PID.0, 0, 0, 10)).unwrap();
    let err = p.produce(&header(PID.0, 1, 10, 1)).unwrap_err();
    assert_eq!(
        err,
        Rejection::OutOfOrderSequence {
            producer_id: PID,
            epoch: ProducerEpoch(1),
            got: Sequence(10),
            expected: Sequence(0),
        }
    );
    assert_eq!(p.produce(&header(PID.0, 1, 0, 1)), Ok(Verdict::Append));
    assert_eq!(p.table.get(PID).unwrap().epoch(), ProducerEpoch(1));
    assert_eq!(p.produce(&header(PID.0, 1, 1, 1)), Ok(Verdict::Append));
}

#[test]
fn sequences_wrap_at_i32_max() {
    let mut p = partition();
    // An unknown producer may start anywhere (KIP-360): start just below the wrap.
    let start = i32::MAX - 4;
    assert_eq!(p.produce(&header(PID.0, 0, start, 3)), Ok(Verdict::Append));
    // MAX-1, MAX, 0, 1: a batch that wraps inside.
    let wrapping = header(PID.0, 0, i32::MAX - 1, 4);
    assert_eq!(wrapping.last_sequence(), Sequence(1));
    assert_eq!(p.produce(&wrapping), Ok(Verdict::Append));
    assert!(matches!(p.produce(&wrapping), Ok(Verdict::Duplicate(_))));
    assert_eq!(p.produce(&header(PID.0, 0, 2, 1)), Ok(Verdict::Append));
    // A batch ending exactly at MAX is followed by 0.
    let mut q = partition();
    q.produce(&header(PID.0, 0, i32::MAX - 1, 2)).unwrap();
    let err = q.produce(&header(PID.0, 0, i32::MAX, 1)).unwrap_err();
    assert_eq!(err.error_code(), OUT_OF_ORDER_SEQUENCE_NUMBER);
    assert_eq!(q.produce(&header(PID.0, 0, 0, 1)), Ok(Verdict::Append));
}

#[test]
fn unknown_producer_with_nonzero_sequence_follows_the_policy() {
    let mut accept = partition();
    assert_eq!(
        accept.produce(&header(PID.0, 3, 42, 1)),
        Ok(Verdict::Append)
    );
    assert_eq!(
        accept.produce(&header(PID.0, 3, 43, 1)),
        Ok(Verdict::Append)
    );

    let mut reject = Partition::new(ProducerStateConfig {
        unknown_producer: UnknownProducerPolicy::Reject,
        ..ProducerStateConfig::default()
    });
    let err = reject.produce(&header(PID.0, 3, 42, 1)).unwrap_err();
    assert_eq!(err.error_code(), UNKNOWN_PRODUCER_ID);
    assert_eq!(reject.produce(&header(PID.0, 3, 0, 1)), Ok(Verdict::Append));
    assert_eq!(reject.table.counters().unknown_producer_rejections, 1);
}

#[test]
fn malformed_idempotent_headers_are_rejected() {
    let mut p = partition();
    assert!(p.produce(&header(PID.0, -1, 0, 1)).is_err());
    assert!(p.produce(&header(PID.0, 0, -5, 1)).is_err());
    assert!(p.log.is_empty());
}

#[test]
fn batches_without_a_producer_id_are_not_tracked() {
    let mut p = partition();
    let b = header(-1, -1, -1, 3);
    assert_eq!(p.produce(&b), Ok(Verdict::NotIdempotent));
    assert_eq!(p.produce(&b), Ok(Verdict::NotIdempotent));
    assert!(p.table.is_empty());
    assert_eq!(p.log.len(), 2);
}

#[test]
fn a_multi_batch_request_is_answered_batch_by_batch_in_order() {
    let mut p = partition();
    let request = [
        header(PID.0, 0, 0, 2),
        header(PID.0, 0, 5, 2), // gap: refused
        header(PID.0, 0, 2, 2), // checked against the state without the refused one
        header(PID.0, 0, 0, 2), // resend of the first: duplicate
    ];
    let answers: Vec<_> = request.iter().map(|b| p.produce(b)).collect();
    assert_eq!(answers[0], Ok(Verdict::Append));
    assert_eq!(answers[1].unwrap_err().error_code(), 45);
    assert_eq!(answers[2], Ok(Verdict::Append));
    assert!(matches!(answers[3], Ok(Verdict::Duplicate(m)) if m.first_offset == Offset(0)));
    assert_eq!(p.log.len(), 2);
}

#[test]
fn idle_producers_expire_and_then_restart_under_kip_360() {
    let config = ProducerStateConfig {
        producer_id_expiration_ms: 1000,
        ..ProducerStateConfig::default()
    };
    let mut t = ProducerStateTable::new(config);
    let b = header(PID.0, 0, 0, 1);
    t.record_append(&b, Offset(0), 10_000);
    t.record_append(&header(8, 0, 0, 1), Offset(1), 10_500);
    assert_eq!(t.expire(10_999), 0);
    assert_eq!(t.expire(11_000), 1);
    assert!(t.get(PID).is_none());
    assert!(t.get(ProducerId(8)).is_some());
    assert_eq!(t.counters().producers_expired, 1);
    // Its dedup window is gone with it: the resend is now accepted as new (Kafka too).
    assert_eq!(t.check(&header(PID.0, 0, 1, 1)), Ok(Verdict::Append));
}

#[test]
fn the_table_is_bounded_and_evicts_the_least_recently_seen() {
    let config = ProducerStateConfig {
        max_producers: 16,
        ..ProducerStateConfig::default()
    };
    let mut t = ProducerStateTable::new(config);
    for pid in 0..1000 {
        t.record_append(&header(pid, 0, 0, 1), Offset(pid), pid);
        assert!(t.len() <= 16);
    }
    assert!(t.get(ProducerId(999)).is_some());
    assert!(t.get(ProducerId(0)).is_none());
    assert!(t.counters().producers_evicted >= 1000 - 16);
}

#[test]
fn snapshot_round_trip_keeps_every_field() {
    let mut p = partition();
    for pid in [1, 5, 900, 77] {
        for i in 0..(pid % 7 + 1) as i32 {
            p.produce(&header(pid, (pid % 3) as i16, i * 3, 3)).unwrap();
        }
    }
    p.produce(&header(2, 0, i32::MAX - 1, 4)).unwrap();
    let bytes = encode_snapshot(&p.table, p.log_end);
    let decoded = decode_snapshot(&bytes, p.log_end, ProducerStateConfig::default()).unwrap();
    assert!(decoded.same_producers(&p.table));
    assert_eq!(decoded.len(), 5);
    assert_eq!(
        encode_snapshot(&decoded, p.log_end),
        bytes,
        "encoding is deterministic"
    );
}

#[test]
fn every_damaged_snapshot_is_refused_without_panicking() {
    let mut p = partition();
    for pid in 0..3 {
        p.produce(&header(pid, 0, 0, 2)).unwrap();
        p.produce(&header(pid, 0, 2, 2)).unwrap();
    }
    let bytes = encode_snapshot(&p.table, p.log_end);
    let config = ProducerStateConfig::default();
    for len in 0..bytes.len() {
        assert!(
            decode_snapshot(&bytes[..len], p.log_end, config).is_err(),
            "len {len}"
        );
    }
    for i in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0x10;
        assert!(
            decode_snapshot(&damaged, p.log_end, config).is_err(),
            "byte {i}"
        );
    }
    let err = decode_snapshot(&bytes, p.log_end.add(1), config).unwrap_err();
    assert!(matches!(err, SnapshotError::OffsetMismatch { .. }));
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..2000 {
        let len = rng.random_range(0..200);
        let junk: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        assert!(decode_snapshot(&junk, Offset(0), config).is_err());
    }
}

#[test]
fn snapshot_with_valid_crc_but_bad_fields_is_refused() {
    let mut p = partition();
    p.produce(&header(3, 0, 0, 2)).unwrap();
    let good = encode_snapshot(&p.table, p.log_end);
    let recrc = |mut b: Vec<u8>| {
        let crc = crc32c::crc32c(&b[12..]);
        b[8..12].copy_from_slice(&crc.to_be_bytes());
        b
    };
    let mut count_too_big = good.clone();
    count_too_big[20..24].copy_from_slice(&1000u32.to_be_bytes());
    assert!(
        decode_snapshot(
            &recrc(count_too_big),
            p.log_end,
            ProducerStateConfig::default()
        )
        .is_err()
    );
    let mut zero_batches = good.clone();
    zero_batches[24 + 18] = 0;
    assert!(
        decode_snapshot(
            &recrc(zero_batches),
            p.log_end,
            ProducerStateConfig::default()
        )
        .is_err()
    );
}

#[test]
fn snapshot_file_names_are_kafkas() {
    assert_eq!(
        snapshot_file_name(Offset(1234)),
        "00000000000000001234.snapshot"
    );
    assert_eq!(
        parse_snapshot_file_name("00000000000000001234.snapshot"),
        Some(Offset(1234))
    );
    assert_eq!(
        parse_snapshot_file_name("00000000000000001234.snapshot.tmp"),
        None
    );
    assert_eq!(parse_snapshot_file_name("1234.snapshot"), None);
    assert_eq!(
        parse_snapshot_file_name("0000000000000000123x.snapshot"),
        None
    );
}

#[test]
fn recovery_plan_follows_the_table() {
    let o = Offset;
    // Case 1: none.
    let plan = plan_recovery(&[], o(10), o(50), 2);
    assert_eq!(
        plan,
        RecoveryPlan {
            load: None,
            replay_from: o(10),
            delete: vec![]
        }
    );
    // Case 2 + 5: newest usable loaded, older beyond `keep` deleted.
    let plan = plan_recovery(&[o(20), o(40), o(30)], o(0), o(50), 2);
    assert_eq!(
        plan,
        RecoveryPlan {
            load: Some(o(40)),
            replay_from: o(40),
            delete: vec![o(20)]
        }
    );
    // Case 3: above the log end (truncated tail) deleted, next older used.
    let plan = plan_recovery(&[o(60), o(40)], o(0), o(50), 2);
    assert_eq!(
        plan,
        RecoveryPlan {
            load: Some(o(40)),
            replay_from: o(40),
            delete: vec![o(60)]
        }
    );
    // Snapshot older than the log start: loaded, replay from the log start.
    let plan = plan_recovery(&[o(5)], o(10), o(50), 2);
    assert_eq!(
        plan,
        RecoveryPlan {
            load: Some(o(5)),
            replay_from: o(10),
            delete: vec![]
        }
    );
    // A snapshot exactly at the log end: nothing to replay.
    let plan = plan_recovery(&[o(50)], o(0), o(50), 2);
    assert_eq!(plan.replay_from, o(50));
}

/// A seeded random workload: several producers appending, resending, skipping ahead and
/// bumping epochs, with batches of other (non-idempotent) producers between.
fn random_workload(seed: u64, steps: usize) -> Partition {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut p = partition();
    let mut next_seq = [0i32; 6];
    let mut epoch = [0i16; 6];
    for _ in 0..steps {
        let who = rng.random_range(0..6usize);
        let count = rng.random_range(1..5);
        let action = rng.random_range(0..10);
        let b = if who == 5 {
            header(-1, -1, -1, count)
        } else if action == 0 {
            epoch[who] += 1;
            next_seq[who] = 0;
            header(who as i64, epoch[who], 0, count)
        } else if action == 1 && next_seq[who] > 0 {
            header(who as i64, epoch[who], next_seq[who] - 1, 1)
        } else {
            header(who as i64, epoch[who], next_seq[who], count)
        };
        if let Ok(Verdict::Append) = p.produce(&b) {
            next_seq[who] = Sequence(next_seq[who]).add_wrapping(count).0;
        }
    }
    p
}

#[test]
fn rebuild_from_the_log_equals_the_live_state() {
    for seed in 0..20 {
        let live = random_workload(seed, 300);
        let mut rebuilt = ProducerStateTable::new(ProducerStateConfig::default());
        for h in &live.log {
            rebuilt.replay(h, NOW);
        }
        assert!(rebuilt.same_producers(&live.table), "seed {seed}");
    }
}

#[test]
fn snapshot_plus_replay_equals_the_live_state() {
    for seed in 0..20 {
        let live = random_workload(seed, 300);
        let cut = live.log.len() / 2;
        // The snapshot as taken when the log ended at batch `cut`.
        let mut at_cut = ProducerStateTable::new(ProducerStateConfig::default());
        for h in &live.log[..cut] {
            at_cut.replay(h, NOW);
        }
        let snap_offset = live.log[cut].base_offset();
        let bytes = encode_snapshot(&at_cut, snap_offset);
        let mut rebuilt =
            decode_snapshot(&bytes, snap_offset, ProducerStateConfig::default()).unwrap();
        for h in live.log.iter().filter(|h| h.base_offset() >= snap_offset) {
            rebuilt.replay(h, NOW);
        }
        assert!(rebuilt.same_producers(&live.table), "seed {seed}");
    }
}

#[test]
fn a_resend_after_rebuild_is_still_a_duplicate() {
    let mut live = partition();
    for i in 0..5 {
        live.produce(&header(PID.0, 0, i * 10, 10)).unwrap();
    }
    let mut rebuilt = ProducerStateTable::new(ProducerStateConfig::default());
    for h in &live.log {
        rebuilt.replay(h, NOW);
    }
    for i in 0..5 {
        let verdict = rebuilt.check(&header(PID.0, 0, i * 10, 10));
        assert!(
            matches!(verdict, Ok(Verdict::Duplicate(m)) if m.first_offset == Offset(i64::from(i) * 10)),
            "batch {i}: {verdict:?}"
        );
    }
}

#[test]
fn a_log_cut_forgets_the_batches_past_it_so_their_resend_is_appended_again() {
    let mut p = partition();
    let first = header(PID.0, 0, 0, 3);
    let second = header(PID.0, 0, 3, 2);
    assert_eq!(p.produce(&first), Ok(Verdict::Append));
    assert_eq!(p.produce(&second), Ok(Verdict::Append));
    assert!(matches!(p.produce(&second), Ok(Verdict::Duplicate(_))));
    // The second batch (offsets 3..5) was rolled back: the log ends at 3 again.
    p.table.truncate_from(Offset(3));
    p.log.pop();
    p.log_end = Offset(3);
    assert_eq!(
        p.produce(&second),
        Ok(Verdict::Append),
        "resend appended again"
    );
    assert!(matches!(p.produce(&first), Ok(Verdict::Duplicate(_))));
    // A cut below a producer's every batch forgets the producer: its resend of sequence
    // 0 is a new producer's first batch.
    p.table.truncate_from(Offset(0));
    assert!(p.table.is_empty());
    assert_eq!(p.table.check(&first), Ok(Verdict::Append));
}

/// A transactional batch header.
fn txn_header(pid: i64, epoch: i16, first_seq: i32, count: i32) -> BatchHeader {
    let mut h = header(pid, epoch, first_seq, count);
    h.attributes.set(wire::batch::Attributes::TRANSACTIONAL_BIT);
    h
}

#[test]
fn an_open_transaction_holds_the_first_unstable_offset_until_its_marker() {
    let mut p = partition();
    p.produce(&header(9, 0, 0, 3)).unwrap();
    assert_eq!(p.table.first_unstable_offset(), None);
    p.produce(&txn_header(PID.get(), 0, 0, 2)).unwrap();
    p.produce(&txn_header(PID.get(), 0, 2, 2)).unwrap();
    assert_eq!(p.table.first_unstable_offset(), Some(Offset(3)));
    assert!(p.table.has_ongoing(PID));
    // The marker at offset 7 closes it.
    let done = p.table.complete_txn(PID, seen(0, 0), Offset(7), 0).unwrap();
    assert_eq!(
        (done.first_offset, done.last_offset),
        (Offset(3), Offset(7))
    );
    assert_eq!(p.table.first_unstable_offset(), None);
    assert_eq!(
        p.table.complete_txn(PID, seen(0, 0), Offset(8), 0),
        None,
        "nothing left to close"
    );
}

#[test]
fn snapshots_keep_open_transactions() {
    let mut p = partition();
    p.produce(&txn_header(PID.get(), 0, 0, 2)).unwrap();
    p.produce(&txn_header(8, 1, 0, 1)).unwrap();
    p.table
        .complete_txn(ProducerId(8), seen(1, 0), p.log_end, 0)
        .unwrap();
    let bytes = encode_snapshot(&p.table, p.log_end.add(1));
    let back = decode_snapshot(&bytes, p.log_end.add(1), ProducerStateConfig::default()).unwrap();
    assert_eq!(back.first_unstable_offset(), Some(Offset(0)));
    assert!(back.has_ongoing(PID));
    assert!(!back.has_ongoing(ProducerId(8)));
    assert!(back.same_producers(&p.table));
}

#[test]
fn truncation_drops_transactions_opened_past_the_cut() {
    let mut p = partition();
    p.produce(&header(9, 0, 0, 3)).unwrap();
    p.produce(&txn_header(PID.get(), 0, 0, 2)).unwrap();
    p.table.truncate_from(Offset(3));
    assert_eq!(p.table.first_unstable_offset(), None);
}

#[test]
fn a_marker_of_a_newer_epoch_fences_the_older_one() {
    let mut p = partition();
    p.produce(&txn_header(PID.get(), 3, 0, 2)).unwrap();
    // The coordinator aborted with the epoch bumped to 4.
    p.table.complete_txn(PID, seen(4, 0), p.log_end, 0).unwrap();
    p.log_end = p.log_end.add(1);
    assert_eq!(
        p.produce(&txn_header(PID.get(), 3, 2, 1)).map(|_| ()),
        Err(Rejection::InvalidProducerEpoch {
            producer_id: PID,
            epoch: ProducerEpoch(3),
            current: ProducerEpoch(4),
        })
    );
    // Survives a snapshot, and the next epoch starts at sequence 0.
    let bytes = encode_snapshot(&p.table, p.log_end);
    let mut back = decode_snapshot(&bytes, p.log_end, ProducerStateConfig::default()).unwrap();
    assert_eq!(back.get(PID).map(|e| e.epoch()), Some(ProducerEpoch(4)));
    assert_eq!(
        back.check(&txn_header(PID.get(), 5, 0, 1)),
        Ok(Verdict::Append)
    );
    assert_eq!(
        back.check(&txn_header(PID.get(), 4, 0, 1)),
        Ok(Verdict::Append)
    );
}

/// A marker of producer epoch `epoch` from coordinator epoch `coordinator`.
fn seen(epoch: i16, coordinator: i32) -> super::MarkerSeen {
    super::MarkerSeen {
        producer_epoch: ProducerEpoch(epoch),
        coordinator_epoch: coordinator,
    }
}
