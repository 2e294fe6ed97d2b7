//! The group APIs over raw connections, at every version weir advertises: FindCoordinator
//! (v4 batched keys), JoinGroup (KIP-394 two-step join from v4), SyncGroup, Heartbeat,
//! LeaveGroup (batched members from v3), OffsetCommit, OffsetFetch (v8 multi-group),
//! ListGroups, DescribeGroups, DeleteGroups, OffsetDelete; and the error codes of the
//! classic protocol where Kafka returns them.

mod groups_support;

use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use weir_tests::Weir;
use weir_tests::clients;
use weir_tests::raw::RawConn;

const NONE: i16 = 0;
const ILLEGAL_GENERATION: i16 = 22;
const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
const UNKNOWN_MEMBER_ID: i16 = 25;
const INVALID_SESSION_TIMEOUT: i16 = 26;
const REBALANCE_IN_PROGRESS: i16 = 27;
const NON_EMPTY_GROUP: i16 = 68;
const GROUP_ID_NOT_FOUND: i16 = 69;
const MEMBER_ID_REQUIRED: i16 = 79;
const FENCED_INSTANCE_ID: i16 = 82;
const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const TOPIC: &str = "proto-topic";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn gid(v: &str) -> GroupId {
    GroupId(s(v))
}

/// Consumer-protocol subscription metadata (v0) for `topics`, as Java and librdkafka send.
fn subscription(topics: &[&str]) -> Result<Bytes> {
    let sub =
        ConsumerProtocolSubscription::default().with_topics(topics.iter().map(|t| s(t)).collect());
    let mut out = BytesMut::new();
    out.put_i16(0);
    sub.encode(&mut out, 0)?;
    Ok(out.freeze())
}

fn join_req(
    group: &str,
    member: &str,
    instance: Option<&str>,
    session_ms: i32,
) -> Result<JoinGroupRequest> {
    Ok(JoinGroupRequest::default()
        .with_group_id(gid(group))
        .with_session_timeout_ms(session_ms)
        // Long: a member that is slow to rejoin on a loaded machine is not dropped.
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(s(member))
        .with_group_instance_id(instance.map(s))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(subscription(&[TOPIC])?),
        ]))
}

/// Joins as a new member (two steps from v4); returns the response of the real join.
fn join(c: &mut RawConn, v: i16, group: &str, instance: Option<&str>) -> Result<JoinGroupResponse> {
    let first: JoinGroupResponse =
        c.call(ApiKey::JoinGroup, v, &join_req(group, "", instance, 6000)?)?;
    if v < 4 || instance.is_some() {
        ensure!(first.error_code == NONE, "v{v}: join {}", first.error_code);
        return Ok(first);
    }
    ensure!(
        first.error_code == MEMBER_ID_REQUIRED,
        "v{v}: KIP-394 first answer {}",
        first.error_code
    );
    ensure!(
        !first.member_id.is_empty(),
        "v{v}: a member id comes with MEMBER_ID_REQUIRED"
    );
    let req = join_req(group, &first.member_id, instance, 6000)?;
    let second: JoinGroupResponse = c.call(ApiKey::JoinGroup, v, &req)?;
    ensure!(
        second.error_code == NONE,
        "v{v}: second join {}",
        second.error_code
    );
    ensure!(
        second.member_id == first.member_id,
        "v{v}: the id handed out is kept"
    );
    Ok(second)
}

fn sync(
    c: &mut RawConn,
    v: i16,
    group: &str,
    gen_id: i32,
    member: &str,
    asg: &[(&str, &[u8])],
) -> Result<SyncGroupResponse> {
    let mut req = SyncGroupRequest::default()
        .with_group_id(gid(group))
        .with_generation_id(gen_id)
        .with_member_id(s(member))
        .with_assignments(
            asg.iter()
                .map(|(m, a)| {
                    SyncGroupRequestAssignment::default()
                        .with_member_id(s(m))
                        .with_assignment(Bytes::copy_from_slice(a))
                })
                .collect(),
        );
    if v >= 5 {
        req = req
            .with_protocol_type(Some(s("consumer")))
            .with_protocol_name(Some(s("range")));
    }
    c.call(ApiKey::SyncGroup, v, &req)
}

fn heartbeat(
    c: &mut RawConn,
    v: i16,
    group: &str,
    gen_id: i32,
    member: &str,
    instance: Option<&str>,
) -> Result<i16> {
    let req = HeartbeatRequest::default()
        .with_group_id(gid(group))
        .with_generation_id(gen_id)
        .with_member_id(s(member))
        .with_group_instance_id(if v >= 3 { instance.map(s) } else { None });
    let resp: HeartbeatResponse = c.call(ApiKey::Heartbeat, v, &req)?;
    Ok(resp.error_code)
}

/// Heartbeats (v4, no instance id) every `every` until the answer is not NONE or `limit`
/// has passed; the last answer.
fn heartbeat_until_told(
    c: &mut RawConn,
    group: &str,
    gen_id: i32,
    member: &str,
    every: Duration,
    limit: Duration,
) -> Result<i16> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let code = heartbeat(c, 4, group, gen_id, member, None)?;
        if code != NONE || std::time::Instant::now() >= deadline {
            return Ok(code);
        }
        thread::sleep(every);
    }
}

fn commit(
    c: &mut RawConn,
    v: i16,
    group: &str,
    gen_id: i32,
    member: &str,
    offset: i64,
) -> Result<i16> {
    let part = OffsetCommitRequestPartition::default()
        .with_partition_index(0)
        .with_committed_offset(offset)
        .with_committed_metadata(Some(s("meta")));
    let req = OffsetCommitRequest::default()
        .with_group_id(gid(group))
        .with_generation_id_or_member_epoch(gen_id)
        .with_member_id(s(member))
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partitions(vec![part]),
        ]);
    let resp: OffsetCommitResponse = c.call(ApiKey::OffsetCommit, v, &req)?;
    let code = resp
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .map(|p| p.error_code);
    code.context("one partition in the answer")
}

/// The committed offset of TOPIC/0 in `group` (v8: asked together with another group).
fn fetch(c: &mut RawConn, v: i16, group: &str) -> Result<i64> {
    let topic = || {
        OffsetFetchRequestTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partition_indexes(vec![0])
    };
    if v < 8 {
        let req = OffsetFetchRequest::default()
            .with_group_id(gid(group))
            .with_topics(Some(vec![topic()]));
        let resp: OffsetFetchResponse = c.call(ApiKey::OffsetFetch, v, &req)?;
        let p = resp
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .context("partition")?;
        return Ok(p.committed_offset);
    }
    let group_req = |g: &str| {
        let t = offset_fetch_request::OffsetFetchRequestTopics::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partition_indexes(vec![0]);
        OffsetFetchRequestGroup::default()
            .with_group_id(gid(g))
            .with_topics(Some(vec![t]))
    };
    let req =
        OffsetFetchRequest::default().with_groups(vec![group_req(group), group_req("never-used")]);
    let resp: OffsetFetchResponse = c.call(ApiKey::OffsetFetch, v, &req)?;
    ensure!(resp.groups.len() == 2, "v8: one answer per group");
    let other = resp.groups[1]
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .context("other")?;
    ensure!(
        other.committed_offset == -1,
        "nothing committed in the other group"
    );
    let p = resp.groups[0]
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .context("partition")?;
    Ok(p.committed_offset)
}

fn describe(
    c: &mut RawConn,
    v: i16,
    group: &str,
) -> Result<describe_groups_response::DescribedGroup> {
    let req = DescribeGroupsRequest::default().with_groups(vec![gid(group)]);
    let resp: DescribeGroupsResponse = c.call(ApiKey::DescribeGroups, v, &req)?;
    resp.groups.into_iter().next().context("one group")
}

fn delete(c: &mut RawConn, v: i16, group: &str) -> Result<i16> {
    let resp: DeleteGroupsResponse = c.call(
        ApiKey::DeleteGroups,
        v,
        &DeleteGroupsRequest::default().with_groups_names(vec![gid(group)]),
    )?;
    resp.results
        .first()
        .map(|r| r.error_code)
        .context("one result")
}

fn leave(c: &mut RawConn, v: i16, group: &str, member: &str) -> Result<i16> {
    let mut req = LeaveGroupRequest::default().with_group_id(gid(group));
    if v >= 3 {
        req = req.with_members(vec![MemberIdentity::default().with_member_id(s(member))]);
    } else {
        req = req.with_member_id(s(member));
    }
    let resp: LeaveGroupResponse = c.call(ApiKey::LeaveGroup, v, &req)?;
    if v >= 3 {
        let m = resp.members.first().context("one member answer")?;
        ensure!(m.member_id.as_str() == member, "v{v}: member echoed");
        return Ok(m.error_code);
    }
    Ok(resp.error_code)
}

fn start() -> Result<(Weir, RawConn)> {
    let weir = groups_support::start_weir()?;
    clients::create_topics(&weir.bootstrap(), &[TOPIC], 1, &[])?;
    let conn = RawConn::connect(weir.addr())?;
    Ok((weir, conn))
}

/// One group's whole life at each version: find, join, sync, heartbeat, commit, fetch,
/// describe, list, refuse to delete while live, leave, delete.
#[test]
fn every_advertised_version_walks_a_group_through_its_life() -> Result<()> {
    let (weir, mut c) = start()?;
    for v in 0..=3 {
        let req = FindCoordinatorRequest::default().with_key(s("any"));
        let r: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, v, &req)?;
        ensure!(
            r.error_code == NONE && i32::from(weir.addr().port()) == r.port,
            "FindCoordinator v{v}: {r:?}"
        );
    }
    let req = FindCoordinatorRequest::default().with_coordinator_keys(vec![s("a"), s("b")]);
    let r: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 4, &req)?;
    ensure!(
        r.coordinators.len() == 2
            && r.coordinators
                .iter()
                .all(|k| k.error_code == NONE && k.port == i32::from(weir.addr().port())),
        "v4 batched: {r:?}"
    );
    // The group requests created `__consumer_offsets`; Metadata must mark it internal so
    // that clients' regex subscriptions skip it.
    let md: MetadataResponse = c.call(
        ApiKey::Metadata,
        1,
        &MetadataRequest::default().with_topics(None),
    )?;
    let internal = |name: &str| {
        md.topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == name))
            .map(|t| t.is_internal)
    };
    ensure!(
        internal("__consumer_offsets") == Some(true) && internal(TOPIC) == Some(false),
        "internal flags: {md:?}"
    );

    for v in 0..=8i16 {
        let group = format!("life-v{v}");
        let j = join(&mut c, v.min(7), &group, None)?;
        let m = j.member_id.to_string();
        ensure!(
            j.generation_id == 1 && j.leader.as_str() == m && j.members.len() == 1,
            "v{v}: {j:?}"
        );
        let sr = sync(&mut c, v.min(5), &group, 1, &m, &[(&m, b"asg")])?;
        ensure!(
            sr.error_code == NONE && &sr.assignment[..] == b"asg",
            "v{v}: sync {sr:?}"
        );
        let hv = v.min(4);
        ensure!(
            heartbeat(&mut c, hv, &group, 1, &m, None)? == NONE,
            "v{v}: heartbeat"
        );
        ensure!(
            heartbeat(&mut c, hv, &group, 2, &m, None)? == ILLEGAL_GENERATION,
            "v{v}: stale generation"
        );
        ensure!(
            heartbeat(&mut c, hv, &group, 1, "who", None)? == UNKNOWN_MEMBER_ID,
            "v{v}: unknown member"
        );
        let cv = v.clamp(2, 8);
        ensure!(
            commit(&mut c, cv, &group, 1, &m, 100 + i64::from(v))? == NONE,
            "v{v}: commit"
        );
        ensure!(
            commit(&mut c, cv, &group, 9, &m, 1)? == ILLEGAL_GENERATION,
            "v{v}: commit, wrong generation"
        );
        ensure!(
            fetch(&mut c, v.max(1), &group)? == 100 + i64::from(v),
            "v{v}: fetch"
        );
        let d = describe(&mut c, v.min(5), &group)?;
        ensure!(
            d.group_state.as_str() == "Stable"
                && d.members.len() == 1
                && &d.members[0].member_assignment[..] == b"asg",
            "v{v}: {d:?}"
        );
        let lv = v.min(4);
        let mut lreq = ListGroupsRequest::default();
        if lv >= 4 {
            lreq = lreq.with_states_filter(vec![s("Stable")]);
        }
        let l: ListGroupsResponse = c.call(ApiKey::ListGroups, lv, &lreq)?;
        ensure!(
            l.groups.iter().any(|g| g.group_id.as_str() == group),
            "v{v}: listed"
        );
        ensure!(
            delete(&mut c, v.min(2), &group)? == NON_EMPTY_GROUP,
            "v{v}: delete live group"
        );
        ensure!(leave(&mut c, v.min(4), &group, &m)? == NONE, "v{v}: leave");
        ensure!(
            describe(&mut c, v.min(5), &group)?.group_state.as_str() == "Empty",
            "v{v}: empty after leave"
        );
        ensure!(
            fetch(&mut c, v.max(1), &group)? == 100 + i64::from(v),
            "v{v}: offsets outlive members"
        );
        ensure!(
            delete(&mut c, v.min(2), &group)? == NONE,
            "v{v}: delete empty group"
        );
        ensure!(
            fetch(&mut c, v.max(1), &group)? == -1,
            "v{v}: offsets deleted with the group"
        );
        ensure!(
            delete(&mut c, v.min(2), &group)? == GROUP_ID_NOT_FOUND,
            "v{v}: delete twice"
        );
    }
    Ok(())
}

/// Standalone commits (no membership), refused commits to unknown partitions, and
/// OffsetDelete refused while members subscribe to the topic.
#[test]
fn standalone_commits_and_offset_delete() -> Result<()> {
    let (_weir, mut c) = start()?;
    ensure!(
        commit(&mut c, 8, "standalone", -1, "", 42)? == NONE,
        "simple consumer commit"
    );
    ensure!(fetch(&mut c, 8, "standalone")? == 42, "fetched");
    let req = |part: i32| {
        OffsetDeleteRequest::default()
            .with_group_id(gid("standalone"))
            .with_topics(vec![
                OffsetDeleteRequestTopic::default()
                    .with_name(TopicName(s(TOPIC)))
                    .with_partitions(vec![
                        OffsetDeleteRequestPartition::default().with_partition_index(part),
                    ]),
            ])
    };
    let r: OffsetDeleteResponse = c.call(ApiKey::OffsetDelete, 0, &req(0))?;
    ensure!(
        r.error_code == NONE && r.topics[0].partitions[0].error_code == NONE,
        "{r:?}"
    );
    ensure!(fetch(&mut c, 8, "standalone")? == -1, "offset deleted");

    let j = join(&mut c, 7, "live", None)?;
    let m = j.member_id.to_string();
    sync(&mut c, 5, "live", 1, &m, &[])?;
    ensure!(
        commit(&mut c, 8, "live", 1, &m, 5)? == NONE,
        "member commit"
    );
    let mut del = req(0);
    del.group_id = gid("live");
    let r: OffsetDeleteResponse = c.call(ApiKey::OffsetDelete, 0, &del)?;
    ensure!(
        r.topics[0].partitions[0].error_code == GROUP_SUBSCRIBED_TO_TOPIC,
        "{r:?}"
    );
    ensure!(
        commit(&mut c, 8, "live", -1, "", 5)? == UNKNOWN_MEMBER_ID,
        "no simple (or admin) commits into a live group: Kafka's UNKNOWN_MEMBER_ID"
    );

    let part = OffsetCommitRequestPartition::default()
        .with_partition_index(7)
        .with_committed_offset(1);
    let bad = OffsetCommitRequest::default()
        .with_group_id(gid("standalone"))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partitions(vec![part]),
        ]);
    let r: OffsetCommitResponse = c.call(ApiKey::OffsetCommit, 8, &bad)?;
    ensure!(
        r.topics[0].partitions[0].error_code == UNKNOWN_TOPIC_OR_PARTITION,
        "{r:?}"
    );
    // A group id a Kafka string cannot hold (flexible versions can carry it) is refused.
    let long = "g".repeat(40_000);
    let r: JoinGroupResponse = c.call(ApiKey::JoinGroup, 6, &join_req(&long, "", None, 6000)?)?;
    ensure!(
        r.error_code == 24,
        "INVALID_GROUP_ID for a 40 000-byte id: {}",
        r.error_code
    );
    ensure!(
        commit(&mut c, 8, &long, -1, "", 1)? == 24,
        "and for commits"
    );
    Ok(())
}

/// Two members over two connections: the second's join parks until the first rejoins;
/// meanwhile heartbeats and syncs of the old generation get REBALANCE_IN_PROGRESS; the
/// follower's SyncGroup waits for the leader's assignment; static members fence their
/// predecessors; a silent member is dropped after its session timeout.
#[test]
fn rebalance_errors_static_fencing_and_session_expiry() -> Result<()> {
    let (weir, mut a) = start()?;
    let g = "dance";
    let bad = join_req(g, "", None, 10)?;
    let r: JoinGroupResponse = a.call(ApiKey::JoinGroup, 5, &bad)?;
    ensure!(r.error_code == INVALID_SESSION_TIMEOUT, "{r:?}");
    let mut other = join_req(g, "", None, 6000)?;
    let ja = join(&mut a, 5, g, None)?;
    let ma = ja.member_id.to_string();
    sync(&mut a, 5, g, 1, &ma, &[(&ma, b"all")])?;
    other.protocol_type = s("connect");
    let r: JoinGroupResponse = a.call(ApiKey::JoinGroup, 5, &other)?;
    ensure!(r.error_code == INCONSISTENT_GROUP_PROTOCOL, "{r:?}");

    let addr = weir.addr();
    let b_join = thread::spawn(move || -> Result<(RawConn, JoinGroupResponse)> {
        let mut b = RawConn::connect(addr)?;
        let r = join(&mut b, 5, g, None)?;
        Ok((b, r))
    });
    // a learns of the rebalance by heartbeat (bounded: 30 s)...
    let parked = std::time::Instant::now();
    let every = Duration::from_millis(200);
    let code = heartbeat_until_told(&mut a, g, 1, &ma, every, Duration::from_secs(30))?;
    ensure!(code == REBALANCE_IN_PROGRESS, "told to rejoin: {code}");
    // ...and waits 2.5 s before rejoining, so b's JoinGroup stays parked across several
    // one-second coordinator slices.
    let rest = Duration::from_millis(2500).saturating_sub(parked.elapsed());
    thread::sleep(rest);
    ensure!(
        heartbeat(&mut a, 4, g, 1, &ma, None)? == REBALANCE_IN_PROGRESS,
        "still told to rejoin"
    );
    let r = sync(&mut a, 5, g, 1, &ma, &[])?;
    ensure!(
        r.error_code == REBALANCE_IN_PROGRESS,
        "old generation sync: {r:?}"
    );
    let req = join_req(g, &ma, None, 6000)?;
    let ja2: JoinGroupResponse = a.call(ApiKey::JoinGroup, 5, &req)?;
    let (mut b, jb) = b_join
        .join()
        .map_err(|_| anyhow::anyhow!("join thread"))??;
    ensure!(
        ja2.generation_id == 2 && jb.generation_id == 2,
        "{ja2:?} {jb:?}"
    );
    ensure!(
        ja2.members.len() == 2 && jb.members.is_empty(),
        "only the leader sees members"
    );
    let mb = jb.member_id.to_string();
    let b_sync = thread::spawn(move || -> Result<(RawConn, SyncGroupResponse)> {
        let r = sync(&mut b, 5, g, 2, &mb, &[])?;
        Ok((b, r))
    });
    thread::sleep(Duration::from_millis(1500));
    sync(&mut a, 5, g, 2, &ma, &[(&ma, b"A"), (&jb.member_id, b"B")])?;
    let (mut b, sb) = b_sync
        .join()
        .map_err(|_| anyhow::anyhow!("sync thread"))??;
    ensure!(
        &sb.assignment[..] == b"B",
        "the leader's assignment relayed: {sb:?}"
    );

    // a goes silent: after its session (6 s) b's heartbeat says rebalance; b rejoins alone.
    let mb = jb.member_id.to_string();
    let every = Duration::from_millis(200);
    let code = heartbeat_until_told(&mut b, g, 2, &mb, every, Duration::from_secs(20))?;
    ensure!(code == REBALANCE_IN_PROGRESS, "expiry of a noticed: {code}");
    let jb3: JoinGroupResponse = b.call(ApiKey::JoinGroup, 5, &join_req(g, &mb, None, 6000)?)?;
    ensure!(jb3.generation_id == 3 && jb3.members.len() == 1, "{jb3:?}");

    // Static membership: a restarted instance gets a new id; the old one is fenced.
    let s1 = join(&mut a, 5, "statics", Some("pod-1"))?;
    sync(&mut a, 5, "statics", s1.generation_id, &s1.member_id, &[])?;
    let s2 = join(&mut a, 5, "statics", Some("pod-1"))?;
    ensure!(
        s2.member_id != s1.member_id,
        "new member id for the same instance"
    );
    let fenced = heartbeat(
        &mut a,
        4,
        "statics",
        s2.generation_id,
        &s1.member_id,
        Some("pod-1"),
    )?;
    ensure!(fenced == FENCED_INSTANCE_ID, "old id fenced: {fenced}");
    Ok(())
}

/// librdkafka asks for a new KIP-394 member id when `subscribe()` is called again before
/// its first JoinGroup is answered (0113 u_multiple_subscription_changes: three
/// subscribes in a row). The id it gave up never joins; it must not hold the rebalance
/// until its session timeout (there 45 s, per subscription change).
#[test]
fn a_superseded_member_id_does_not_hold_the_rebalance() -> Result<()> {
    let (weir, mut a) = start()?;
    let g = "resubscribe";
    // Long sessions and rebalance timeouts: only the fix lets the join phase end early.
    let req = |member: &str| -> Result<JoinGroupRequest> {
        Ok(join_req(g, member, None, 30_000)?.with_rebalance_timeout_ms(60_000))
    };
    let first: JoinGroupResponse = a.call(ApiKey::JoinGroup, 7, &req("")?)?;
    let ma = first.member_id.to_string();
    let ja: JoinGroupResponse = a.call(ApiKey::JoinGroup, 7, &req(&ma)?)?;
    ensure!(ja.error_code == NONE, "{ja:?}");
    sync(&mut a, 5, g, ja.generation_id, &ma, &[(&ma, b"all")])?;

    let addr = weir.addr();
    let b_join = thread::spawn(move || -> Result<JoinGroupResponse> {
        let mut b = RawConn::connect(addr)?;
        let given_up: JoinGroupResponse = b.call(ApiKey::JoinGroup, 7, &req("")?)?;
        let kept: JoinGroupResponse = b.call(ApiKey::JoinGroup, 7, &req("")?)?;
        ensure!(
            given_up.error_code == MEMBER_ID_REQUIRED && kept.error_code == MEMBER_ID_REQUIRED,
            "{given_up:?} {kept:?}"
        );
        ensure!(given_up.member_id != kept.member_id, "two ids handed out");
        b.call(ApiKey::JoinGroup, 7, &req(&kept.member_id)?)
    });
    // a learns of the rebalance by heartbeat (bounded: 20 s), then rejoins.
    let every = Duration::from_millis(100);
    let gen_id = ja.generation_id;
    let code = heartbeat_until_told(&mut a, g, gen_id, &ma, every, Duration::from_secs(20))?;
    ensure!(code == REBALANCE_IN_PROGRESS, "told to rejoin: {code}");
    let started = std::time::Instant::now();
    let ja2: JoinGroupResponse = a.call(ApiKey::JoinGroup, 7, &req(&ma)?)?;
    let waited = started.elapsed();
    let jb = b_join
        .join()
        .map_err(|_| anyhow::anyhow!("join thread"))??;
    ensure!(
        ja2.error_code == NONE && ja2.members.len() == 2,
        "both joined: {ja2:?}"
    );
    ensure!(jb.error_code == NONE && jb.generation_id == ja2.generation_id);
    // Without the fix the phase waits for the given-up id's 30 s session.
    ensure!(
        waited < Duration::from_secs(15),
        "the join phase took {waited:?}: held by the given-up member id"
    );
    Ok(())
}

/// Log start offset of each `__consumer_offsets` partition (ListOffsets earliest).
fn offsets_topic_starts(c: &mut RawConn) -> Result<Vec<i64>> {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    let parts = (0..4)
        .map(|p| {
            ListOffsetsPartition::default()
                .with_partition_index(p)
                .with_timestamp(-2)
        })
        .collect();
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(TopicName(s("__consumer_offsets")))
                .with_partitions(parts),
        ]);
    let resp: ListOffsetsResponse = c.call(ApiKey::ListOffsets, 1, &req)?;
    Ok(resp
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.offset))
        .collect())
}

/// Bytes of the `.log` files of every `__consumer_offsets` partition under `data_dir`.
fn offsets_log_bytes(data_dir: &std::path::Path) -> Result<u64> {
    let mut total = 0;
    for dir in std::fs::read_dir(data_dir)? {
        let dir = dir?;
        if !dir
            .file_name()
            .to_string_lossy()
            .starts_with("__consumer_offsets-")
        {
            continue;
        }
        for file in std::fs::read_dir(dir.path())? {
            let file = file?;
            if file.path().extension().is_some_and(|x| x == "log") {
                total += file.metadata()?.len();
            }
        }
    }
    Ok(total)
}

/// Many commits to one key in 16 KiB segments: the log cleaner compacts the group's
/// `__consumer_offsets` partition (its sealed segments lose every overwritten commit, the
/// log start stays), and replay after a SIGKILL still finds the last commit.
#[test]
fn offsets_partitions_are_compacted_and_replay_after_sigkill() -> Result<()> {
    let config = weir_tests::WeirConfig::shards(2)
        .set("offsets.topic.num.partitions", 4)
        .set("offsets.topic.segment.bytes", 16384)
        .set("log.cleaner.backoff.ms", 300);
    let mut weir = Weir::start(config)?;
    clients::create_topics(&weir.bootstrap(), &[TOPIC], 1, &[])?;
    let mut c = RawConn::connect(weir.addr())?;
    for i in 0..1000 {
        ensure!(commit(&mut c, 8, "busy", -1, "", i)? == NONE, "commit {i}");
    }
    // ~110 bytes per commit (one batch each): ~110 KB written, in about 7 segments; once
    // cleaned, the sealed ones hold nothing and the active one at most 16 KiB.
    let bound = 48 << 10;
    // (The cleaner may have run during the commits already.)
    let before = offsets_log_bytes(weir.data_dir())?;
    let mut size = before;
    // The cleaner runs every 300 ms; a loaded machine gets a minute.
    for _ in 0..300 {
        size = offsets_log_bytes(weir.data_dir())?;
        if size <= bound {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    ensure!(
        size <= bound,
        "not compacted: {size} bytes (bound {bound}, before {before})"
    );
    ensure!(
        offsets_topic_starts(&mut c)?.iter().all(|s| *s == 0),
        "the cleaner keeps offsets: the log start stays"
    );
    weir.kill()?;
    weir.restart()?;
    let mut c = RawConn::connect(weir.addr())?;
    ensure!(
        fetch(&mut c, 8, "busy")? == 999,
        "last commit replayed after compaction"
    );
    Ok(())
}

/// Measurement, not a check: synchronous OffsetCommit round trips on one connection
/// (each waits for its `__consumer_offsets` append). Prints `MEASURE` lines.
/// `cargo test --release -p weir-tests --test groups_protocol measure -- --ignored --nocapture`
#[test]
#[ignore = "measurement"]
fn measure_commit_latency() -> Result<()> {
    let (_weir, mut c) = start()?;
    let n = 5000;
    let mut lat = Vec::with_capacity(n);
    let started = std::time::Instant::now();
    for i in 0..n {
        let t = std::time::Instant::now();
        ensure!(
            commit(&mut c, 8, "measured", -1, "", i as i64)? == NONE,
            "commit"
        );
        lat.push(t.elapsed());
    }
    let total = started.elapsed();
    lat.sort();
    let pct = |q: f64| lat[((n as f64 * q) as usize).min(n - 1)];
    println!(
        "MEASURE offset_commit_sync n={n} per_s={:.0} p50_us={} p99_us={} max_us={}",
        n as f64 / total.as_secs_f64(),
        pct(0.5).as_micros(),
        pct(0.99).as_micros(),
        lat[n - 1].as_micros()
    );
    Ok(())
}
