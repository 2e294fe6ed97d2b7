//! The coordinator on a one-shard node (`testing`): what it answers while a state it
//! wrote waits for replication, and when it writes the markers of a transaction it found
//! ending at load.

use std::rc::Rc;

use wire::{ProducerEpoch, ProducerId};

use super::testing::{self, NOW_MS, log_end, open, replicated, turns_until};
use super::{TXN_TOPIC, TxnCall, TxnOp, TxnReply, schema, state::TxnMetadata, state::TxnState};
use crate::errors;
use crate::event::Event;
use crate::partition::Acks;
use crate::shard::Shard;
use crate::shard::context::{MarkerWriter, ServiceContext};

const TXN_ID: &str = "tx";

/// Runs `op` on the node's transaction coordinator, as a `TxnCall` does.
async fn txn(shard: Rc<Shard>, op: TxnOp) -> TxnReply {
    let ctx = ServiceContext::new(&shard);
    let markers = MarkerWriter::new(shard.clone());
    let call = TxnCall { partition: 0, op };
    shard.txns.clone().exec(&ctx, markers, call).await
}

fn verify_op(producer: (ProducerId, ProducerEpoch)) -> TxnOp {
    TxnOp::AddPartitions {
        txn_id: TXN_ID.into(),
        producer_id: producer.0,
        producer_epoch: producer.1,
        partitions: vec![("t".to_string(), 0)],
        verify_only: true,
    }
}

/// KIP-890's check while the EndTxn that ends the transaction has written PrepareCommit
/// and waits for it to be replicated: CONCURRENT_TRANSACTIONS, as Kafka answers while the
/// transaction ends. Before, the state in memory was still Ongoing until the write was
/// replicated, and the check answered NONE: a batch could join a transaction being
/// committed.
#[test]
fn a_check_while_the_end_of_the_transaction_is_replicated_is_answered_concurrent() {
    let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
    let data = root.path().to_path_buf();
    crate::storage::testing::run_on_shard(move || async move {
        let shard = testing::node(&data);
        testing::internal_topics(&shard).await;
        testing::create_topic(&shard, "t");
        let tx = open(&shard, TXN_TOPIC, 0).await;
        testing::hold_hw(&tx);
        let init = TxnOp::InitProducerId {
            txn_id: TXN_ID.into(),
            timeout_ms: 60_000,
            producer: None,
            version: 4,
        };
        let TxnReply::Producer {
            error: errors::NONE,
            producer_id,
            producer_epoch,
        } = replicated(&tx, txn(shard.clone(), init)).await
        else {
            panic!("InitProducerId failed");
        };
        let producer = (producer_id, producer_epoch);
        let add = TxnOp::AddPartitions {
            txn_id: TXN_ID.into(),
            producer_id,
            producer_epoch,
            partitions: vec![("t".to_string(), 0)],
            verify_only: false,
        };
        let added = replicated(&tx, txn(shard.clone(), add)).await;
        assert_eq!(added, TxnReply::Code(errors::NONE));
        let before = txn(shard.clone(), verify_op(producer)).await;
        assert_eq!(before, TxnReply::Partitions(vec![errors::NONE]));

        let written = log_end(&tx);
        let end = TxnOp::EndTxn {
            txn_id: TXN_ID.into(),
            producer_id,
            producer_epoch,
            commit: true,
        };
        let ending = glommio::spawn_local(txn(shard.clone(), end));
        // PrepareCommit appended; the EndTxn waits for the HW (held).
        let appended = turns_until(|| log_end(&tx) > written && tx.appended.waiter_count() > 0);
        assert!(
            appended.await,
            "PrepareCommit written, waiting for replication"
        );
        let during = txn(shard.clone(), verify_op(producer)).await;
        assert_eq!(
            during,
            TxnReply::Partitions(vec![errors::CONCURRENT_TRANSACTIONS])
        );

        let nothing = Event::default();
        let done = testing::replicate_until(&tx, &nothing, || {
            shard
                .txns
                .txns
                .borrow()
                .get(TXN_ID)
                .is_some_and(|m| m.state == TxnState::CompleteCommit)
        });
        assert!(done.await, "the commit completes once replicated");
        assert_eq!(ending.await, TxnReply::Code(errors::NONE));
        let after = txn(shard.clone(), verify_op(producer)).await;
        assert_eq!(
            after,
            TxnReply::Partitions(vec![errors::TRANSACTION_ABORTABLE]),
            "no transaction open"
        );
        shard.close_all().await;
    });
}

/// A coordinator that loads its partition reads it to the log end, past the HW; a
/// PrepareCommit found there has its markers written only once the HW covers it. Before,
/// they were written at once: had this node lost the lead before the state was
/// replicated, the next coordinator (without it) would have timed the transaction out
/// and aborted it after its COMMIT markers were written — committed in some partitions,
/// aborted in others.
#[test]
fn markers_of_a_transaction_found_ending_past_the_hw_wait_for_the_hw() {
    let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
    let data = root.path().to_path_buf();
    crate::storage::testing::run_on_shard(move || async move {
        let shard = testing::node(&data);
        testing::internal_topics(&shard).await;
        testing::create_topic(&shard, "t");
        let t0 = open(&shard, "t", 0).await;
        let tx = open(&shard, TXN_TOPIC, 0).await;
        testing::hold_hw(&tx);
        // The previous leader's PrepareCommit, in this replica's log past its HW.
        let mut m = TxnMetadata::empty(ProducerId(42), ProducerEpoch(0), 60_000, NOW_MS);
        m.state = TxnState::PrepareCommit;
        m.start_ms = NOW_MS;
        m.partitions.insert(("t".to_string(), 0));
        let value = schema::value(&m).expect("a value");
        let records = vec![(schema::key(TXN_ID), Some(value))];
        let batches = crate::coordinator::build_batches(records, 1 << 20, NOW_MS);
        let batch = batches.expect("a batch").remove(0);
        let deadline = std::time::Instant::now() + testing::PATIENCE;
        let out = tx.produce(batch.into(), Acks::Leader, deadline, NOW_MS);
        assert_eq!(out.await.error, errors::NONE);
        assert!(tx.high_watermark() < tx.replica().log_end(), "past the HW");

        let ctx = ServiceContext::new(&shard);
        let markers = MarkerWriter::new(shard.clone());
        let loaded = shard.txns.clone().load_owned(&ctx, markers, 0).await;
        assert_eq!(loaded, Ok(()));
        // The load's resumption of the transaction waits for the HW.
        let waiting = turns_until(|| tx.appended.waiter_count() > 0).await;
        assert!(waiting, "waiting for the HW");
        assert_eq!(log_end(&t0), wire::Offset(0), "no marker yet");
        let state = |shard: &Shard| shard.txns.txns.borrow().get(TXN_ID).map(|m| m.state);
        assert_eq!(state(&shard), Some(TxnState::PrepareCommit));

        let nothing = Event::default();
        let done = testing::replicate_until(&tx, &nothing, || {
            state(&shard) == Some(TxnState::CompleteCommit)
        });
        assert!(done.await, "finished once the HW covers the load");
        assert_eq!(log_end(&t0), wire::Offset(1), "the COMMIT marker");
        shard.close_all().await;
    });
}

/// The ticker ends each due transaction in a task of its own: one whose marker waits on
/// a leader that never answers (here a listener that accepts and stays silent, as an
/// unreachable node's black-holed connection would) does not hold up the abort of
/// another, whose partition's LSO (and its read_committed consumers) waits for it.
/// Before, the ticker ended them one after another, and each marker call may take
/// `MARKER_CALL_TIMEOUT` (30 s), twenty times.
#[test]
fn a_transaction_whose_marker_hangs_does_not_hold_up_the_tickers_other_aborts() {
    let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
    let data = root.path().to_path_buf();
    crate::storage::testing::run_on_shard(move || async move {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
        let port = silent.local_addr().expect("addr").port();
        let shard = testing::node(&data);
        testing::internal_topics(&shard).await;
        testing::create_topic(&shard, "near");
        far_topic(&shard, "far", port);
        // Sorted ids: the ticker takes the stuck ones first.
        let stuck = ["a1", "a2", "a3"];
        for id in stuck {
            begin(&shard, id, ("far", 0)).await;
        }
        begin(&shard, "b", ("near", 0)).await;
        let state = |id: &str| shard.txns.txns.borrow().get(id).map(|m| m.state);

        shard.txns.tick(crate::shard::now_ms() + 3_600_000);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while state("b") != Some(TxnState::CompleteAbort) && std::time::Instant::now() < deadline {
            glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(state("b"), Some(TxnState::CompleteAbort), "b aborted");
        for id in stuck {
            assert_eq!(
                state(id),
                Some(TxnState::PrepareAbort),
                "{id}'s marker hangs"
            );
        }
        drop(silent);
        shard.close_all().await;
    });
}

/// One transaction's markers go to all its partitions at once: a partition whose leader
/// never answers does not hold up the marker (and so the LSO) of another. Before, they
/// were written one after another in the partitions' order, and `far` came first.
#[test]
fn a_marker_that_hangs_does_not_hold_up_the_same_transactions_other_markers() {
    let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
    let data = root.path().to_path_buf();
    crate::storage::testing::run_on_shard(move || async move {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
        let port = silent.local_addr().expect("addr").port();
        let shard = testing::node(&data);
        testing::internal_topics(&shard).await;
        testing::create_topic(&shard, "near");
        far_topic(&shard, "far", port);
        let near = open(&shard, "near", 0).await;
        let producer = begin(&shard, TXN_ID, ("far", 0)).await;
        let add = TxnOp::AddPartitions {
            txn_id: TXN_ID.into(),
            producer_id: producer.0,
            producer_epoch: producer.1,
            partitions: vec![("near".to_string(), 0)],
            verify_only: false,
        };
        assert_eq!(txn(shard.clone(), add).await, TxnReply::Code(errors::NONE));
        let end = TxnOp::EndTxn {
            txn_id: TXN_ID.into(),
            producer_id: producer.0,
            producer_epoch: producer.1,
            commit: false,
        };
        let ending = glommio::spawn_local(txn(shard.clone(), end)).detach();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while log_end(&near) == wire::Offset(0) && std::time::Instant::now() < deadline {
            glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(log_end(&near), wire::Offset(1), "near's ABORT marker");
        let state = shard.txns.txns.borrow().get(TXN_ID).map(|m| m.state);
        assert_eq!(state, Some(TxnState::PrepareAbort), "far's marker hangs");
        ending.cancel();
        drop(silent);
        shard.close_all().await;
    });
}

/// Topic `name` of one partition led by node 2, registered at 127.0.0.1:`port`.
fn far_topic(shard: &Shard, name: &str, port: u16) {
    use crate::metadata::{NodeInfo, PartitionAssignment, TopicMeta};
    let topic = TopicMeta {
        name: name.into(),
        id: crate::metadata::new_topic_id(),
        partitions: 1,
        configs: Default::default(),
        assignment: vec![PartitionAssignment {
            replicas: vec![2],
            leader: 2,
            leader_epoch: 0,
            isr: vec![2],
            partition_epoch: 0,
        }],
    };
    let node = NodeInfo {
        host: "127.0.0.1".into(),
        port,
        fenced: false,
        broker_epoch: 1,
        endpoints: Vec::new(),
        directory_id: None,
        rack: None,
    };
    let updated = shard.node.meta.update(|c| {
        c.topics.insert(name.into(), std::sync::Arc::new(topic));
        c.nodes.insert(2, node);
        Ok(())
    });
    updated.expect("catalogue update");
}

/// Transactional id `id` with a transaction open on `partition`, timing out after 1 s;
/// its producer.
async fn begin(shard: &Rc<Shard>, id: &str, partition: (&str, i32)) -> (ProducerId, ProducerEpoch) {
    let init = TxnOp::InitProducerId {
        txn_id: id.into(),
        timeout_ms: 1_000,
        producer: None,
        version: 4,
    };
    let TxnReply::Producer {
        error: errors::NONE,
        producer_id,
        producer_epoch,
    } = txn(shard.clone(), init).await
    else {
        panic!("InitProducerId of {id} failed");
    };
    let add = TxnOp::AddPartitions {
        txn_id: id.into(),
        producer_id,
        producer_epoch,
        partitions: vec![(partition.0.to_string(), partition.1)],
        verify_only: false,
    };
    assert_eq!(txn(shard.clone(), add).await, TxnReply::Code(errors::NONE));
    (producer_id, producer_epoch)
}
