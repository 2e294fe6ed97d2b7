//! `__consumer_offsets` compacted by the log cleaner (issue 17), against a real
//! `weir serve`: more than 10 MiB of live committed offsets, overwritten several times,
//! shrink on disk to about their live size; deleted groups' tombstones are removed after
//! `delete.retention.ms` without the groups coming back; and the coordinator's replay of
//! the compacted log — after a SIGKILL and after a clean shutdown — answers OffsetFetch
//! with exactly the last commit of every group and partition.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::requests::{
    LATEST, commit_offsets, create_topics, fetch_offsets, find_coordinator, list_offset, s,
};
use common::{Broker, Client};
use kafka_protocol::messages::*;
use wire::api;

const OFFSETS: &str = "__consumer_offsets";
/// Live state: 44 groups x 64 partitions x 4,000 bytes of metadata = 10.7 MiB (each
/// commit of one group is one batch of ~260 KB, within the 1 MiB batch limit).
const GROUPS: usize = 44;
const PARTITIONS: i32 = 64;
const METADATA_BYTES: usize = 4000;
/// Every offset is written once and overwritten this many times minus one.
const ROUNDS: i64 = 4;
/// Groups committed in the first round and then deleted (tombstones).
const GONE: usize = 4;
/// Key, value fields and record framing of one stored offset commit, at most.
const RECORD_OVERHEAD_BYTES: u64 = 100;
/// How long the test waits for the cleaner on a loaded 2-core machine.
const CLEAN_TIMEOUT: Duration = Duration::from_secs(180);

/// The metadata committed for `group`'s `partition` in `round` (unique, so a value of an
/// older round that came back would be seen).
fn meta_for(group: &str, partition: i32, round: i64) -> String {
    let head = format!("{group}/{partition}/{round}:");
    format!("{head}{}", "m".repeat(METADATA_BYTES - head.len()))
}

fn offset_for(partition: i32, round: i64) -> i64 {
    round * 1_000_000 + i64::from(partition)
}

/// A simple consumer's commit (no generation) of every partition of `data` for `round`.
fn commit_round(c: &mut Client, group: &str, round: i64) {
    let metas: Vec<String> = (0..PARTITIONS).map(|p| meta_for(group, p, round)).collect();
    let offsets: Vec<(i32, i64, &str)> = (0..PARTITIONS)
        .map(|p| (p, offset_for(p, round), metas[p as usize].as_str()))
        .collect();
    let codes = commit_offsets(c, group, "data", &offsets);
    assert!(
        codes.len() == PARTITIONS as usize && codes.iter().all(|c| *c == 0),
        "commit {group} round {round}: {codes:?}"
    );
}

fn delete_group(c: &mut Client, group: &str) {
    let req = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(group))]);
    let resp: DeleteGroupsResponse = c.call(api::DELETE_GROUPS, 2, &req);
    assert_eq!(resp.results[0].error_code, 0, "DeleteGroups {group}");
}

/// Every committed (offset, metadata) of `group` for `data`'s partitions.
fn fetch(c: &mut Client, group: &str) -> Vec<(i64, String)> {
    let partitions: Vec<i32> = (0..PARTITIONS).collect();
    fetch_offsets(c, group, "data", &partitions)
}

/// Every live group answers its last round, every deleted group nothing.
fn check_offsets(c: &mut Client, when: &str) {
    for g in 0..GROUPS {
        let group = format!("g{g}");
        for (p, (offset, meta)) in fetch(c, &group).into_iter().enumerate() {
            let p = p as i32;
            assert_eq!(offset, offset_for(p, ROUNDS - 1), "{when}: {group}/{p}");
            assert!(
                meta == meta_for(&group, p, ROUNDS - 1),
                "{when}: {group}/{p} metadata"
            );
        }
    }
    for g in 0..GONE {
        let group = format!("gone{g}");
        let got = fetch(c, &group);
        assert!(
            got.iter().all(|(o, _)| *o == -1),
            "{when}: deleted group {group} came back"
        );
    }
}

/// Total bytes of the `.log` files of a partition directory.
fn log_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("partition dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// Tombstones the cleaner removed from `__consumer_offsets`, from its log lines.
fn tombstones_removed(broker: &Broker) -> u64 {
    let log = broker.log.lock().expect("log");
    log.iter()
        .filter(|l| l.contains("log cleaner compacted") && l.contains(OFFSETS))
        .filter_map(|l| l.split("tombstones_removed=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// More than 10 MiB of live offsets in one `__consumer_offsets` partition, written 4
/// times: the shard's log cleaner compacts it to about the live size (before, the
/// coordinator's own rewrite did, moving the log start), every last commit survives a
/// SIGKILL and a clean restart, and deleted groups' tombstones go after
/// `delete.retention.ms` without the groups coming back.
#[test]
fn the_log_cleaner_compacts_consumer_offsets_and_replay_restores_every_commit() {
    let sets = [
        ("offsets.topic.num.partitions", "1"),
        ("offsets.topic.segment.bytes", "1048576"),
        ("log.cleaner.backoff.ms", "500"),
        ("log.cleaner.min.cleanable.ratio", "0.1"),
        ("log.cleaner.delete.retention.ms", "2000"),
    ];
    let mut broker = Broker::start(1, &sets);
    let mut c = broker.client();
    assert_eq!(
        create_topics(&mut c, &[("data", PARTITIONS)]),
        [0],
        "CreateTopics"
    );
    find_coordinator(&mut c, "g0");
    for g in 0..GONE {
        commit_round(&mut c, &format!("gone{g}"), 0);
    }
    for g in 0..GONE {
        delete_group(&mut c, &format!("gone{g}"));
    }
    for round in 0..ROUNDS {
        for g in 0..GROUPS {
            commit_round(&mut c, &format!("g{g}"), round);
        }
    }
    let records = (GROUPS as u64) * (PARTITIONS as u64);
    let live_metadata = records * METADATA_BYTES as u64;
    assert!(live_metadata > 10 << 20, "more than 10 MiB live");
    let written =
        (ROUNDS as u64 * records + (GONE as u64 * PARTITIONS as u64)) * METADATA_BYTES as u64;
    // The live records, what a clean below the dirty ratio may leave, and the active
    // segment plus one partly dead segment (1 MiB each).
    let bound = (records * (METADATA_BYTES as u64 + RECORD_OVERHEAD_BYTES)) * 115 / 100 + (2 << 20);
    let dir = broker.data_dir.path().join(format!("{OFFSETS}-0"));
    let started = Instant::now();
    let deadline = started + CLEAN_TIMEOUT;
    loop {
        let size = log_bytes(&dir);
        let tombstones = tombstones_removed(&broker);
        if size <= bound && tombstones > 0 {
            println!(
                "MEASURE offsets cleaner: {size} log bytes after {written} bytes of commits \
                 ({live_metadata} live metadata bytes, bound {bound}); {tombstones} tombstones \
                 removed; {:?} after the last commit",
                started.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not compacted: {size} log bytes (bound {bound}, written {written}), \
             {tombstones} tombstones removed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        log_bytes(&dir) >= live_metadata,
        "live records are all on disk"
    );
    assert!(!broker.log_contains("log cleaner: "), "a clean failed");
    check_offsets(&mut c, "compacted, before a restart");
    drop(c);
    broker.kill_and_restart();
    let mut c = broker.client();
    check_offsets(&mut c, "after SIGKILL");
    drop(c);
    broker.restart();
    let mut c = broker.client();
    check_offsets(&mut c, "after a clean restart");
}

/// The committed offset of `group` for `data` partition 0.
fn fetch_one(c: &mut Client, group: &str) -> i64 {
    fetch_offsets(c, group, "data", &[0])[0].0
}

/// A simple consumer's commit of `offset` for `data` partition 0, no metadata.
fn commit_one(c: &mut Client, group: &str, offset: i64) {
    let codes = commit_offsets(c, group, "data", &[(0, offset, "")]);
    assert_eq!(codes[0], 0, "commit {group}");
}

/// A transactional producer's id and epoch.
struct Txn {
    id: &'static str,
    pid: i64,
    epoch: i16,
}

fn txn_id(id: &str) -> TransactionalId {
    TransactionalId(s(id))
}

/// InitProducerId, AddOffsetsToTxn for `group`, then TxnOffsetCommit of `offset` for
/// `data` partition 0: a transaction left open.
fn txn_offset_commit(c: &mut Client, id: &'static str, group: &str, offset: i64) -> Txn {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(txn_id(id)))
        .with_transaction_timeout_ms(600_000)
        .with_producer_id((-1).into())
        .with_producer_epoch(-1);
    let resp: InitProducerIdResponse = c.call(api::INIT_PRODUCER_ID, 4, &req);
    assert_eq!(resp.error_code, 0, "InitProducerId {id}");
    let txn = Txn {
        id,
        pid: resp.producer_id.0,
        epoch: resp.producer_epoch,
    };
    let req = AddOffsetsToTxnRequest::default()
        .with_transactional_id(txn_id(id))
        .with_producer_id(txn.pid.into())
        .with_producer_epoch(txn.epoch)
        .with_group_id(GroupId(s(group)));
    let resp: AddOffsetsToTxnResponse = c.call(api::ADD_OFFSETS_TO_TXN, 3, &req);
    assert_eq!(resp.error_code, 0, "AddOffsetsToTxn {id}");
    let req = TxnOffsetCommitRequest::default()
        .with_transactional_id(txn_id(id))
        .with_group_id(GroupId(s(group)))
        .with_producer_id(txn.pid.into())
        .with_producer_epoch(txn.epoch)
        .with_generation_id(-1)
        .with_topics(vec![
            txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(s("data")))
                .with_partitions(vec![
                    txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(offset),
                ]),
        ]);
    let resp: TxnOffsetCommitResponse = c.call(api::TXN_OFFSET_COMMIT, 3, &req);
    assert_eq!(
        resp.topics[0].partitions[0].error_code, 0,
        "TxnOffsetCommit {id}"
    );
    txn
}

fn abort(c: &mut Client, txn: &Txn) {
    let req = EndTxnRequest::default()
        .with_transactional_id(txn_id(txn.id))
        .with_producer_id(txn.pid.into())
        .with_producer_epoch(txn.epoch)
        .with_committed(false);
    let resp: EndTxnResponse = c.call(api::END_TXN, 3, &req);
    assert_eq!(resp.error_code, 0, "EndTxn {}", txn.id);
}

/// The log end offset of `__consumer_offsets` partition 0.
fn offsets_log_end(c: &mut Client) -> i64 {
    list_offset(c, OFFSETS, 0, LATEST)
}

/// Waits (bounded) until the log end of `__consumer_offsets`-0 reaches `end` (an
/// EndTxn's marker is written by the transaction coordinator).
fn wait_log_end(c: &mut Client, end: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while offsets_log_end(c) < end {
        assert!(Instant::now() < deadline, "log end below {end}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The offset in `cleaner-offset-checkpoint` of a partition directory (0: none yet).
fn cleaner_checkpoint(dir: &Path) -> i64 {
    std::fs::read_to_string(dir.join("cleaner-offset-checkpoint"))
        .ok()
        .and_then(|t| t.lines().nth(2)?.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// The base offset of the segment of `dir` holding `offset`.
fn segment_base_of(dir: &Path, offset: i64) -> i64 {
    std::fs::read_dir(dir)
        .expect("partition dir")
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".log")?.parse::<i64>().ok()
        })
        .filter(|base| *base <= offset)
        .max()
        .expect("a segment")
}

/// Commits of one key that fill about two 16 KiB segments.
fn fill(c: &mut Client) {
    for i in 0..300 {
        commit_one(c, "filler", i);
    }
}

/// Transactional offset commits and the cleaner: an aborted TxnOffsetCommit must not
/// obsolete the group's earlier commit of that partition (the old cleaner mapped it as
/// the key's latest record and removed the commit: after a restart the group had no
/// offset), and an open one must not either — the cleaner stays below the last stable
/// offset until the transaction is decided.
#[test]
fn transactional_offset_commits_never_make_the_cleaner_drop_a_committed_offset() {
    let sets = [
        ("offsets.topic.num.partitions", "1"),
        ("offsets.topic.segment.bytes", "16384"),
        ("transaction.state.log.num.partitions", "1"),
        ("log.cleaner.backoff.ms", "200"),
    ];
    let mut broker = Broker::start(1, &sets);
    let mut c = broker.client();
    assert_eq!(create_topics(&mut c, &[("data", 1)]), [0], "CreateTopics");
    find_coordinator(&mut c, "g1");
    commit_one(&mut c, "g1", 5);
    commit_one(&mut c, "g2", 6);
    // An aborted transaction, then two segments of other commits.
    let before = offsets_log_end(&mut c);
    let a = txn_offset_commit(&mut c, "ta", "g1", 77);
    abort(&mut c, &a);
    wait_log_end(&mut c, before + 2);
    let aborted_end = offsets_log_end(&mut c);
    fill(&mut c);
    // A transaction left open, then two more segments.
    let open_first = offsets_log_end(&mut c);
    let b = txn_offset_commit(&mut c, "tb", "g2", 88);
    fill(&mut c);
    let dir = broker.data_dir.path().join(format!("{OFFSETS}-0"));
    let open_segment = segment_base_of(&dir, open_first);
    assert!(
        open_segment > aborted_end,
        "the fill rolled past the aborted transaction"
    );
    // The cleaner gets as far as the open transaction's segment (the old one: past it).
    let deadline = Instant::now() + CLEAN_TIMEOUT;
    while cleaner_checkpoint(&dir) < open_segment {
        assert!(
            Instant::now() < deadline,
            "not cleaned up to {open_segment}: checkpoint {}",
            cleaner_checkpoint(&dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        fetch_one(&mut c, "g1"),
        5,
        "the aborted commit obsoleted nothing"
    );
    assert_eq!(
        fetch_one(&mut c, "g2"),
        6,
        "the open commit is not applied yet"
    );
    abort(&mut c, &b);
    drop(c);
    broker.kill_and_restart();
    let mut c = broker.client();
    assert_eq!(
        fetch_one(&mut c, "g1"),
        5,
        "after SIGKILL: g1 kept its commit"
    );
    assert_eq!(
        fetch_one(&mut c, "g2"),
        6,
        "after SIGKILL: g2 kept its commit"
    );
    assert!(!broker.log_contains("log cleaner: "), "a clean failed");
}
