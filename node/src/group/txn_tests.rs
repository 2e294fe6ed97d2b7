//! Transactional offset commits on a one-shard node (`crate::txn::testing`): held from
//! the step their batch takes its offsets, so the marker after them finds them whichever
//! finishes first, and one value per group and partition however often a transaction
//! commits it.

use std::rc::Rc;

use wire::{LeaderEpoch, Offset, ProducerEpoch, ProducerId};

use super::{CommitArgs, GroupCall, GroupOp, GroupReply, OFFSETS_TOPIC, OffsetCommit, codes};
use crate::producer_state::partition::{Marker, VerificationGuard};
use crate::shard::Shard;
use crate::shard::context::ServiceContext;
use crate::shard::mesh::ShardCall;
use crate::txn::testing::{self, NOW_MS, log_end, open, turns_until};

const PRODUCER: (ProducerId, ProducerEpoch) = (ProducerId(42), ProducerEpoch(0));

fn commit_of(offset: i64) -> CommitArgs {
    CommitArgs {
        group: "g".into(),
        generation: -1,
        member_id: String::new(),
        instance_id: None,
        offsets: vec![OffsetCommit {
            topic: "t".into(),
            partition: 0,
            offset: Offset(offset),
            leader_epoch: LeaderEpoch::NONE,
            metadata: None,
        }],
    }
}

/// A TxnOffsetCommit as the coordinator runs it, under the verification `verified`.
async fn txn_commit(shard: Rc<Shard>, offset: i64, verified: VerificationGuard) -> GroupReply {
    let ctx = ServiceContext::new(&shard);
    let op = GroupOp::TxnCommit {
        commit: commit_of(offset),
        producer_id: PRODUCER.0,
        producer_epoch: PRODUCER.1,
        verified,
    };
    let call = GroupCall { partition: 0, op };
    shard.groups.clone().exec(&ctx, call).await
}

/// OffsetFetch of `g`'s t-0 with `require_stable`: (offset, error).
async fn fetch_stable(shard: &Rc<Shard>) -> (Offset, i16) {
    let ctx = ServiceContext::new(shard);
    let op = GroupOp::FetchOffsets {
        group: "g".into(),
        topics: Some(vec![("t".into(), vec![0])]),
        require_stable: true,
    };
    let call = GroupCall { partition: 0, op };
    match shard.groups.clone().exec(&ctx, call).await {
        GroupReply::Offsets(codes::NONE, found) if found.len() == 1 => {
            (found[0].offset, found[0].error)
        }
        other => panic!("OffsetFetch answered {other:?}"),
    }
}

fn marker(commit: bool) -> Marker {
    Marker {
        producer_id: PRODUCER.0,
        producer_epoch: PRODUCER.1,
        commit,
        coordinator_epoch: 0,
    }
}

/// The COMMIT marker that follows a transactional offset commit completes it, even when
/// its own completion runs before the commit's task gets back from waiting for
/// replication. Before, the commit's offsets were held only after that wait: the marker
/// had found nothing to apply, and the offsets stayed held for ever (every
/// `require_stable` fetch answered UNSTABLE_OFFSET_COMMIT; the committed offset was never
/// applied).
#[test]
fn a_marker_completed_before_the_commit_is_replicated_applies_it() {
    let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
    let data = root.path().to_path_buf();
    crate::storage::testing::run_on_shard(move || async move {
        let shard = testing::node(&data);
        testing::internal_topics(&shard).await;
        let offsets = open(&shard, OFFSETS_TOPIC, 0).await;
        testing::hold_hw(&offsets);
        let ctx = ServiceContext::new(&shard);
        let part = shard
            .groups
            .led(&ctx, 0)
            .await
            .expect("the coordinator's partition");
        let verifying = part.producers.begin_verification(PRODUCER.0, PRODUCER.1);
        let committing = glommio::spawn_local(txn_commit(shard.clone(), 5, verifying.guard()));
        // The batch took its offsets; its task waits for the write, then the HW.
        let appended = turns_until(|| log_end(&offsets) > Offset(0)).await;
        assert!(appended, "the commit's batch appended");

        // The marker path, done before the commit's task runs again: appended, (its
        // replication here not awaited) then the transaction completed.
        let marker_at = log_end(&offsets);
        assert_eq!(
            offsets.write_marker(marker(true), NOW_MS).await,
            codes::NONE
        );
        let completed = shard.groups.complete_txn(&ctx, 0, marker(true), marker_at);
        assert_eq!(completed.await, codes::NONE);

        let reply = testing::replicated(&offsets, committing).await;
        assert!(
            matches!(&reply, GroupReply::Codes(codes::NONE, per) if per == &[codes::NONE]),
            "the commit is answered: {reply:?}"
        );
        assert_eq!(fetch_stable(&shard).await, (Offset(5), codes::NONE));
        assert_eq!(shard.groups.pending_txn_offsets(0), 0, "nothing left held");
        drop(verifying);
        shard.close_all().await;
    });
}

/// A transaction that commits the same partition's offset again and again holds one
/// value for it, the latest, which its COMMIT applies. Before, every commit added one
/// more held value until the marker: memory grew without bound while a transaction
/// stayed open.
#[test]
fn repeated_commits_in_one_transaction_hold_one_value_the_latest() {
    let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
    let data = root.path().to_path_buf();
    crate::storage::testing::run_on_shard(move || async move {
        let shard = testing::node(&data);
        testing::internal_topics(&shard).await;
        let offsets = open(&shard, OFFSETS_TOPIC, 0).await;
        let ctx = ServiceContext::new(&shard);
        let part = shard
            .groups
            .led(&ctx, 0)
            .await
            .expect("the coordinator's partition");
        let verifying = part.producers.begin_verification(PRODUCER.0, PRODUCER.1);
        for offset in [10, 20, 30] {
            let reply = txn_commit(shard.clone(), offset, verifying.guard()).await;
            assert!(
                matches!(&reply, GroupReply::Codes(codes::NONE, per) if per == &[codes::NONE]),
                "commit of {offset}: {reply:?}"
            );
        }
        drop(verifying);
        assert_eq!(shard.groups.pending_txn_offsets(0), 1, "one value held");
        let (_, error) = fetch_stable(&shard).await;
        assert_eq!(
            error,
            codes::UNSTABLE_OFFSET_COMMIT,
            "the transaction is open"
        );

        let deadline = std::time::Instant::now() + testing::PATIENCE;
        let call = crate::shard::WriteMarkerCall {
            tp: testing::tp(OFFSETS_TOPIC, 0),
            marker: marker(true),
        };
        assert_eq!(call.run(shard.clone(), deadline).await, codes::NONE);
        assert_eq!(fetch_stable(&shard).await, (Offset(30), codes::NONE));
        assert_eq!(shard.groups.pending_txn_offsets(0), 0);
        assert_eq!(offsets.producers.first_unstable_offset(), None);
        shard.close_all().await;
    });
}
