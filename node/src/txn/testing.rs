//! Test fixtures of the transaction paths: a one-shard node whose coordinator topics have
//! one partition each, replicas whose HW only the test moves (a follower that fetches
//! when told), and bounded waits on what the code under test makes observable.

use std::cell::RefCell;
use std::future::Future;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use wire::batch::{BatchBuilder, NewRecord};
use wire::{BrokerEpoch, LeaderEpoch, NodeId, Offset, ProducerEpoch, ProducerId, Sequence};

use crate::config::{CliOverrides, Config, Properties};
use crate::event::Event;
use crate::metadata::{MetaStore, TopicMeta};
use crate::partition::replica::Assignment;
use crate::partition::{Partition, ReadFor};
use crate::router::ShardId;
use crate::shard::{NodeShared, Shard, TopicPartition};

/// A follower that exists only in the ISR: the HW of a replica holding it moves when the
/// test calls [`replicate`].
pub const PHANTOM: NodeId = NodeId(9);
/// Longest any wait here lasts (a loaded machine included); passing tests never reach it.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// Most executor turns [`turns_until`] gives other tasks.
const TURNS_MAX: usize = 1_000;
/// Records' timestamps.
pub const NOW_MS: i64 = 1_700_000_000_000;

/// A one-shard node on `data`: `__consumer_offsets` and `__transaction_state` of one
/// partition each (created by [`internal_topics`]).
pub fn node(data: &Path) -> Rc<Shard> {
    let mut props = Properties::default();
    props.set("log.dirs", &data.display().to_string());
    props.set("weir.shards", "1");
    props.set("offsets.topic.num.partitions", "1");
    props.set("transaction.state.log.num.partitions", "1");
    let config = Config::resolve(props, &CliOverrides::default()).expect("config");
    let node = Arc::new(NodeShared {
        hw_checkpoint: crate::storage::hw_checkpoint::HwCheckpoint::empty(data),
        meta: MetaStore::in_memory(data),
        config,
        connections: Default::default(),
        drained: Default::default(),
        metrics: Arc::new(crate::metrics::NodeMetrics::new(1)),
        cluster_id: "test".into(),
        controller: crate::controller::Controller::local(),
    });
    let advertised = ("127.0.0.1".into(), 9092);
    Rc::new(Shard::new(ShardId(0), node, None, None, advertised))
}

/// Creates both coordinator topics, as their first use does.
pub async fn internal_topics(shard: &Rc<Shard>) {
    let offsets = crate::api::groups::offsets_partitions(shard).await;
    assert_eq!(offsets, Ok(1), "__consumer_offsets");
    let txns = crate::api::txn::txn_partitions(shard).await;
    assert_eq!(txns, Ok(1), "__transaction_state");
}

/// Creates topic `name` of one partition.
pub fn create_topic(shard: &Shard, name: &str) {
    let topic = TopicMeta {
        name: name.into(),
        id: crate::metadata::new_topic_id(),
        partitions: 1,
        configs: [("preallocate", "false")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        assignment: Vec::new(),
    };
    let created = shard.node.meta.update(|c| {
        c.topics.insert(name.into(), Arc::new(topic));
        Ok(())
    });
    created.expect("catalogue update");
}

pub fn tp(topic: &str, index: i32) -> TopicPartition {
    (Arc::from(topic), index)
}

/// The open replica of `topic`/`index` (opened now if need be).
pub async fn open(shard: &Rc<Shard>, topic: &str, index: i32) -> Rc<Partition> {
    shard.partition(&tp(topic, index)).await.expect("open")
}

/// Makes `p` a leader (under the next epoch) whose ISR also holds [`PHANTOM`]: its HW
/// stays where it is until [`replicate`]. Before a coordinator loads it (it serves a
/// partition under the epoch it loaded at).
pub fn hold_hw(p: &Partition) {
    let local = p.replica().local();
    let epoch = LeaderEpoch(p.leader_epoch().get() + 1);
    let both = vec![local, PHANTOM];
    let assignment = Assignment {
        replicas: both.clone(),
        leader: Some(local),
        leader_epoch: epoch,
        isr: both,
        partition_epoch: epoch.get(),
    };
    p.apply_assignment(&assignment, NOW_MS);
    assert!(p.replica().is_leader(), "still the leader");
}

/// [`PHANTOM`] fetches at the leader's written log end: the HW moves there.
pub async fn replicate(p: &Partition) {
    let at = p.replica().log_end();
    let reader = ReadFor::Follower(PHANTOM, BrokerEpoch(1));
    let out = p
        .fetch_within(at, reader, p.leader_epoch(), 1 << 20, usize::MAX, NOW_MS)
        .await;
    assert_eq!(out.error, crate::errors::NONE, "the phantom's fetch");
}

/// Lets other tasks run until `ready` holds (no I/O needed: a spawned task's first
/// polls), at most [`TURNS_MAX`] turns; whether it held.
pub async fn turns_until(ready: impl Fn() -> bool) -> bool {
    for _ in 0..TURNS_MAX {
        if ready() {
            return true;
        }
        glommio::executor().yield_now().await;
    }
    ready()
}

/// Moves the HW of `p` along as it grows until `ready` holds (each time its log grows or
/// `also` fires, the phantom fetches again), at most [`PATIENCE`]; whether it held.
pub async fn replicate_until(p: &Partition, also: &Event, ready: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (grown, other) = (p.appended.listen(), also.listen());
        // Turns too: what the last fetch woke (a write waiting for the HW) runs on.
        if turns_until(&ready).await {
            return true;
        }
        replicate(p).await;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return ready();
        }
        let woken = futures_lite::future::or(grown, other);
        let bound = async {
            glommio::timer::sleep(left).await;
        };
        futures_lite::future::or(woken, bound).await;
    }
}

/// Runs `work` in a task of its own, moving the HW of `p` along until it is done.
pub async fn replicated<T: 'static>(p: &Partition, work: impl Future<Output = T> + 'static) -> T {
    let done: Rc<RefCell<Option<T>>> = Rc::default();
    let ended = Rc::new(Event::default());
    glommio::spawn_local({
        let (done, ended) = (done.clone(), ended.clone());
        async move {
            let out = work.await;
            *done.borrow_mut() = Some(out);
            ended.notify_all();
        }
    })
    .detach();
    let finished = replicate_until(p, &ended, || done.borrow().is_some()).await;
    assert!(finished, "not done within {PATIENCE:?}");
    let out = done.borrow_mut().take();
    out.expect("finished")
}

/// One transactional batch of `count` records of `producer`, from sequence `seq`.
pub fn txn_batch(producer: (ProducerId, ProducerEpoch), seq: i32, count: usize) -> BytesMut {
    let records = (0..count)
        .map(|i| NewRecord::value(NOW_MS, format!("r{i}")))
        .collect();
    let batch = BatchBuilder {
        producer_id: producer.0,
        producer_epoch: producer.1,
        base_sequence: Sequence(seq),
        transactional: true,
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("a batch from test data");
    BytesMut::from(&batch[..])
}

/// The log end of `p` (what its appends took, written or not).
pub fn log_end(p: &Partition) -> Offset {
    p.log.log_end_offset()
}
