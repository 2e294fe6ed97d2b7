//! State machine tests: the classic protocol's answers, driven with explicit time.

use glommio::channels::local_channel::{self, LocalReceiver};

use super::*;

const LIMITS: Limits = Limits {
    initial_delay_ms: 0,
    max_size: 10,
};

fn args(member: &str, meta: &'static [u8]) -> JoinArgs {
    JoinArgs {
        group: "g".into(),
        member_id: member.into(),
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), Bytes::from_static(meta))],
        session_timeout_ms: 6000,
        rebalance_timeout_ms: 10_000,
        client_id: "c".into(),
        require_known_member_id: true,
        ..JoinArgs::default()
    }
}

fn take<T>(rx: &LocalReceiver<T>) -> Option<T> {
    futures_lite::future::block_on(futures_lite::future::poll_once(rx.recv())).flatten()
}

fn join(g: &mut Group, a: JoinArgs, now: i64) -> LocalReceiver<JoinResult> {
    let (tx, rx) = local_channel::new_bounded(1);
    if let Some(r) = g.join(a, Now::at(now), &LIMITS, tx) {
        g.replacement_written(r, Ok(()), Now::at(now));
    }
    g.try_complete_join(Now::at(now));
    rx
}

/// A SyncGroup whose assignment (the leader's) is stored at once.
fn sync(
    g: &mut Group,
    member: &str,
    generation: i32,
    asg: Vec<(String, Bytes)>,
) -> LocalReceiver<SyncResult> {
    let (rx, staged) = sync_staged(g, member, generation, asg);
    if let Some(staged) = staged {
        g.assignment_written(staged, Ok(()), Now::at(0), &LIMITS);
    }
    rx
}

/// A SyncGroup; the generation whose assignment the coordinator must store, if any.
fn sync_staged(
    g: &mut Group,
    member: &str,
    generation: i32,
    asg: Vec<(String, Bytes)>,
) -> (LocalReceiver<SyncResult>, Option<i32>) {
    let (tx, rx) = local_channel::new_bounded(1);
    let a = SyncArgs {
        group: "g".into(),
        generation,
        member_id: member.into(),
        assignments: asg,
        ..SyncArgs::default()
    };
    let staged = g.sync(a, Now::at(0), tx);
    (rx, staged)
}

/// A SyncGroup at `now`; the generation whose assignment the coordinator must store.
fn sync_at(
    g: &mut Group,
    member: &str,
    generation: i32,
    asg: Vec<(String, Bytes)>,
    now: i64,
) -> (LocalReceiver<SyncResult>, Option<i32>) {
    let (tx, rx) = local_channel::new_bounded(1);
    let a = SyncArgs {
        group: "g".into(),
        generation,
        member_id: member.into(),
        assignments: asg,
        ..SyncArgs::default()
    };
    let staged = g.sync(a, Now::at(now), tx);
    (rx, staged)
}

/// KIP-394 two-step join: the first answer only hands out a member id.
fn first_member(g: &mut Group, now: i64) -> String {
    let r = take(&join(g, args("", b"m"), now)).expect("answered at once");
    assert_eq!(r.error, codes::MEMBER_ID_REQUIRED);
    assert!(r.member_id.starts_with("c-"));
    r.member_id
}

#[test]
fn two_members_join_sync_and_leave() {
    let mut g = Group::new("g", Now::at(0));
    let a = first_member(&mut g, 0);
    let ra = take(&join(&mut g, args(&a, b"m"), 0)).expect("sole member completes the join");
    assert_eq!(
        (ra.error, ra.generation, ra.leader.as_str()),
        (codes::NONE, 1, a.as_str())
    );
    assert_eq!(ra.protocol_name.as_deref(), Some("range"));
    assert_eq!(ra.members.len(), 1, "the leader gets the member list");
    let (rx_sa, staged) = sync_staged(&mut g, &a, 1, vec![(a.clone(), Bytes::from_static(b"p0"))]);
    assert_eq!(staged, Some(1), "a completed generation is stored");
    assert!(take(&rx_sa).is_none(), "answered once stored");
    assert_eq!(g.state, State::CompletingRebalance);
    // A plain commit waits for the rebalance to complete; a transactional one does not
    // (Kafka's transactional validateOffsetCommit; the Java producer cannot handle
    // REBALANCE_IN_PROGRESS there).
    assert_eq!(
        g.check_commit(&a, None, 1),
        Err(codes::REBALANCE_IN_PROGRESS)
    );
    assert_eq!(g.check_txn_commit(&a, None, 1), Ok(()));
    assert_eq!(
        g.check_txn_commit(&a, None, 0),
        Err(codes::ILLEGAL_GENERATION)
    );
    g.assignment_written(1, Ok(()), Now::at(0), &LIMITS);
    let sa = take(&rx_sa).expect("leader sync");
    assert_eq!(sa.assignment, Bytes::from_static(b"p0"));
    assert_eq!(g.state, State::Stable);

    // A second member triggers a rebalance; the first learns of it by heartbeat.
    let b = first_member(&mut g, 10);
    let rx_b = join(&mut g, args(&b, b"m"), 10);
    assert!(take(&rx_b).is_none(), "waits for the others to rejoin");
    assert_eq!(
        g.heartbeat(&a, None, 1, Now::at(20)),
        codes::REBALANCE_IN_PROGRESS
    );
    let rx_a = join(&mut g, args(&a, b"m"), 30);
    let (ra, rb) = (take(&rx_a).expect("joined"), take(&rx_b).expect("joined"));
    assert_eq!((ra.generation, rb.generation), (2, 2));
    assert_eq!(ra.members.len(), 2);
    assert!(rb.members.is_empty(), "followers get no member list");
    let rx_fb = sync(&mut g, &b, 2, vec![]);
    assert!(take(&rx_fb).is_none(), "follower waits for the leader");
    assert_eq!(
        take(&sync(&mut g, &b, 1, vec![])).map(|r| r.error),
        Some(codes::ILLEGAL_GENERATION)
    );
    let asg = vec![
        (a.clone(), Bytes::from_static(b"A")),
        (b.clone(), Bytes::from_static(b"B")),
    ];
    assert_eq!(
        take(&sync(&mut g, &a, 2, asg)).map(|r| r.assignment),
        Some(Bytes::from_static(b"A"))
    );
    assert_eq!(
        take(&rx_fb).map(|r| r.assignment),
        Some(Bytes::from_static(b"B"))
    );
    assert_eq!(g.heartbeat(&b, None, 2, Now::at(40)), codes::NONE);
    assert_eq!(
        g.heartbeat("nobody", None, 2, Now::at(40)),
        codes::UNKNOWN_MEMBER_ID
    );
    assert_eq!(g.check_commit(&a, None, 1), Err(codes::ILLEGAL_GENERATION));
    assert_eq!(g.check_commit(&a, None, 2), Ok(()));
    // An admin commit (AlterConsumerGroupOffsets: generation -1, no member) into a group
    // with members: Kafka's UNKNOWN_MEMBER_ID.
    assert_eq!(g.check_commit("", None, -1), Err(codes::UNKNOWN_MEMBER_ID));

    // b leaves: a must rejoin, and alone it completes generation 3.
    assert_eq!(g.leave(&b, None, Now::at(50), &LIMITS), codes::NONE);
    assert_eq!(g.state, State::PreparingRebalance);
    let ra = take(&join(&mut g, args(&a, b"m"), 60)).expect("alone");
    assert_eq!((ra.generation, ra.members.len()), (3, 1));
    take(&sync(&mut g, &a, 3, vec![])).expect("synced");
    assert_eq!(g.leave(&a, None, Now::at(70), &LIMITS), codes::NONE);
    assert_eq!(
        g.state,
        State::Empty,
        "the last member leaving empties the group at once"
    );
    assert_eq!(g.generation, 4);
}

#[test]
fn session_expiry_rebalances_then_empties() {
    let mut g = Group::new("g", Now::at(0));
    let a = first_member(&mut g, 0);
    let ra = take(&join(&mut g, args(&a, b"m"), 0)).expect("joined");
    take(&sync(&mut g, &a, ra.generation, vec![])).expect("synced");
    g.tick(Now::at(5_999), &LIMITS);
    assert_eq!(g.state, State::Stable, "still within the session");
    g.tick(Now::at(6_000), &LIMITS);
    assert_eq!(
        g.state,
        State::Empty,
        "expired, and nobody left to rebalance"
    );
    assert_eq!(g.generation, 2);
    assert!(g.take_dirty(), "the empty generation is stored");
    assert_eq!(
        g.check_commit("", None, -1),
        Ok(()),
        "simple commits once empty"
    );
}

#[test]
fn pending_member_ids_expire() {
    let mut g = Group::new("g", Now::at(0));
    let _ = first_member(&mut g, 0);
    g.tick(Now::at(6_000), &LIMITS);
    assert!(g.pending.is_empty());
}

#[test]
fn rebalance_timeout_drops_members_that_do_not_rejoin() {
    let mut g = Group::new("g", Now::at(0));
    let a = first_member(&mut g, 0);
    let ra = take(&join(&mut g, args(&a, b"m"), 0)).expect("joined");
    take(&sync(&mut g, &a, ra.generation, vec![])).expect("synced");
    let b = first_member(&mut g, 100);
    let rx_b = join(&mut g, args(&b, b"m"), 100);
    // a keeps heartbeating but never rejoins.
    for t in (1000..=11_000).step_by(1000) {
        g.heartbeat(&a, None, 1, Now::at(t));
        g.tick(Now::at(t), &LIMITS);
    }
    let rb = take(&rx_b).expect("completed at the rebalance timeout");
    assert_eq!((rb.generation, rb.leader.as_str()), (2, b.as_str()));
    assert!(g.member(&a).is_none());
}

#[test]
fn static_member_rejoin_fences_the_old_id() {
    let mut g = Group::new("g", Now::at(0));
    let mut a = args("", b"m");
    a.instance_id = Some("i1".into());
    let r1 = take(&join(&mut g, a.clone(), 0)).expect("static members skip MEMBER_ID_REQUIRED");
    assert_eq!(r1.error, codes::NONE);
    let old = r1.member_id.clone();
    assert!(old.starts_with("i1-"));
    take(&sync(
        &mut g,
        &old,
        1,
        vec![(old.clone(), Bytes::from_static(b"X"))],
    ))
    .expect("synced");
    // Restarted with the same instance id: new member id, same generation (no rebalance
    // while the selected protocol stays) — here it is the (sole) leader.
    let rx = join(&mut g, a.clone(), 100);
    let r2 = take(&rx).expect("sole member");
    assert_ne!(r2.member_id, old);
    assert_eq!(
        g.heartbeat(&old, Some("i1"), r2.generation, Now::at(200)),
        codes::FENCED_INSTANCE_ID
    );
    assert_eq!(
        g.leave(&old, Some("i1"), Now::at(200), &LIMITS),
        codes::FENCED_INSTANCE_ID
    );
    assert_eq!(g.leave("", Some("i1"), Now::at(200), &LIMITS), codes::NONE);
}

/// The static leader restarts (0102_static_group_rebalance): no rebalance, the follower
/// keeps its generation, the leader gets its old assignment back through SyncGroup.
#[test]
fn static_leader_restart_keeps_the_generation() {
    let mut g = Group::new("g", Now::at(0));
    let statik = |instance: &str| {
        let mut a = args("", b"m");
        a.instance_id = Some(instance.into());
        a
    };
    let ra = take(&join(&mut g, statik("i1"), 0)).expect("joined");
    let leader = ra.member_id.clone();
    let asg = vec![(leader.clone(), Bytes::from_static(b"A"))];
    take(&sync(&mut g, &leader, 1, asg)).expect("synced");
    // The follower joins: generation 2 with both.
    let rx_b = join(&mut g, statik("i2"), 10);
    let rx_a = join(&mut g, args(&leader, b"m"), 10);
    let (ra, rb) = (take(&rx_a).expect("a"), take(&rx_b).expect("b"));
    assert_eq!((ra.generation, ra.leader.as_str()), (2, leader.as_str()));
    let follower = rb.member_id.clone();
    let asg = vec![
        (leader.clone(), Bytes::from_static(b"A")),
        (follower.clone(), Bytes::from_static(b"B")),
    ];
    let rx_fb = sync(&mut g, &follower, 2, vec![]);
    take(&sync(&mut g, &leader, 2, asg)).expect("leader synced");
    assert_eq!(
        take(&rx_fb).map(|r| r.assignment),
        Some(Bytes::from_static(b"B"))
    );

    // The leader restarts with an empty member id and the same instance id.
    let r = take(&join(&mut g, statik("i1"), 100)).expect("answered at once, no rebalance");
    assert_eq!(r.error, codes::NONE);
    assert_eq!(r.generation, 2);
    assert_ne!(r.member_id, leader);
    assert_eq!(
        r.leader, leader,
        "the old leader id: the new member syncs as a follower"
    );
    assert!(r.members.is_empty());
    assert_eq!(g.state, State::Stable);
    assert_eq!(g.heartbeat(&follower, None, 2, Now::at(110)), codes::NONE);
    let back = take(&sync(&mut g, &r.member_id, 2, vec![])).expect("stable sync");
    assert_eq!(back.assignment, Bytes::from_static(b"A"));
    assert_eq!(g.leader.as_deref(), Some(r.member_id.as_str()));
}

/// A second MEMBER_ID_REQUIRED asked for on the same connection supersedes the first id:
/// the join phase does not wait for an id its client gave up.
#[test]
fn a_new_member_id_on_a_connection_supersedes_the_pending_one() {
    let mut g = Group::new("g", Now::at(0));
    let a = first_member(&mut g, 0);
    let ra = take(&join(&mut g, args(&a, b"m"), 0)).expect("joined");
    take(&sync(&mut g, &a, ra.generation, vec![])).expect("synced");
    let on_b = |member: &str| {
        let mut x = args(member, b"m");
        x.connection = "127.0.0.1:40000".into();
        x
    };
    let given_up = take(&join(&mut g, on_b(""), 10)).expect("id");
    let kept = take(&join(&mut g, on_b(""), 10)).expect("id");
    assert_eq!(kept.error, codes::MEMBER_ID_REQUIRED);
    assert_ne!(given_up.member_id, kept.member_id);
    let rx_b = join(&mut g, on_b(&kept.member_id), 20);
    let rx_a = join(&mut g, args(&a, b"m"), 30);
    let rb = take(&rx_b).expect("completed without waiting for the given-up id");
    assert_eq!(rb.generation, 2);
    assert!(take(&rx_a).is_some());
    // The given-up id is unknown now.
    let late = take(&join(&mut g, on_b(&given_up.member_id), 40)).expect("refused");
    assert_eq!(late.error, codes::UNKNOWN_MEMBER_ID);
}

/// The pending ids' connection index follows them: one id per connection, the entry
/// gone when its id joins or expires (it would otherwise grow with every connection).
#[test]
fn pending_member_ids_are_indexed_by_connection_and_the_index_follows_them() {
    let mut g = Group::new("g", Now::at(0));
    let on = |conn: usize, member: &str| {
        let mut x = args(member, b"m");
        x.connection = format!("127.0.0.1:{}", 40_000 + conn);
        x
    };
    let mut ids = Vec::new();
    for conn in 0..3 {
        take(&join(&mut g, on(conn, ""), 0)).expect("superseded below");
        ids.push(take(&join(&mut g, on(conn, ""), 0)).expect("id").member_id);
    }
    assert_eq!((g.pending.len(), g.pending.by_connection.len()), (3, 3));
    // The first connection's id joins: it is no longer pending, nor indexed.
    let _joined = join(&mut g, on(0, &ids[0]), 1);
    assert_eq!((g.pending.len(), g.pending.by_connection.len()), (2, 2));
    // A new id asked for on that connection does not touch the member.
    take(&join(&mut g, on(0, ""), 2)).expect("id");
    assert!(g.member(&ids[0]).is_some());
    assert_eq!((g.pending.len(), g.pending.by_connection.len()), (3, 3));
    // Session timeouts pass: every pending id and its index entry go.
    g.tick(Now::at(10_000_000), &LIMITS);
    assert_eq!((g.pending.len(), g.pending.by_connection.len()), (0, 0));
}

#[test]
fn protocols_must_match_and_the_vote_picks_a_common_one() {
    let mut g = Group::new("g", Now::at(0));
    let mut a = args("", b"m");
    a.require_known_member_id = false;
    a.protocols = vec![
        ("cooperative-sticky".into(), Bytes::new()),
        ("range".into(), Bytes::new()),
    ];
    let ra = take(&join(&mut g, a.clone(), 0)).expect("joined");
    take(&sync(&mut g, &ra.member_id, 1, vec![])).expect("synced");
    let mut bad = a.clone();
    bad.protocols = vec![("roundrobin".into(), Bytes::new())];
    let r = take(&join(&mut g, bad, 0)).expect("refused at once");
    assert_eq!(r.error, codes::INCONSISTENT_GROUP_PROTOCOL);
    let mut b = a.clone();
    b.protocols = vec![("range".into(), Bytes::new())];
    let rx_b = join(&mut g, b, 10);
    let mut again = a.clone();
    again.member_id = ra.member_id.clone();
    let ra2 = take(&join(&mut g, again, 20)).expect("joined");
    take(&rx_b).expect("joined");
    assert_eq!(
        ra2.protocol_name.as_deref(),
        Some("range"),
        "the only common protocol"
    );
}

#[test]
fn stored_value_round_trips_membership() {
    let mut g = Group::new("g", Now::at(0));
    let a = first_member(&mut g, 0);
    take(&join(&mut g, args(&a, b"sub"), 0)).expect("joined");
    take(&sync(
        &mut g,
        &a,
        1,
        vec![(a.clone(), Bytes::from_static(b"asg"))],
    ))
    .expect("synced");
    let mut back = Group::new("g", Now::at(0));
    back.restore(g.to_value(), Now::at(1000));
    assert_eq!(back.state, State::Stable);
    assert_eq!(back.generation, 1);
    assert_eq!(back.heartbeat(&a, None, 1, Now::at(1000)), codes::NONE);
    assert_eq!(
        back.member(&a).map(|m| m.assignment.clone()),
        Some(Bytes::from_static(b"asg"))
    );
}

/// A JoinGroup can list tens of thousands of protocols: matching them against the group
/// must stay linear (nested scans took minutes here and stalled the whole shard).
#[test]
fn many_protocols_are_matched_in_linear_time() {
    const N: usize = 50_000;
    let many = |prefix: &str| -> Vec<(String, Bytes)> {
        let mut v: Vec<(String, Bytes)> = (0..N)
            .map(|i| (format!("{prefix}{i}"), Bytes::new()))
            .collect();
        v.push(("range".into(), Bytes::new()));
        v
    };
    let started = std::time::Instant::now();
    let mut g = Group::new("g", Now::at(0));
    let mut a = args("", b"m");
    a.require_known_member_id = false;
    a.protocols = many("a");
    let ra = take(&join(&mut g, a.clone(), 0)).expect("joined");
    take(&sync(&mut g, &ra.member_id, 1, vec![])).expect("synced");
    let mut b = a.clone();
    b.protocols = many("b");
    let rx_b = join(&mut g, b, 10);
    a.member_id = ra.member_id.clone();
    let ra2 = take(&join(&mut g, a, 20)).expect("joined");
    assert_eq!(take(&rx_b).expect("joined").error, codes::NONE);
    assert_eq!(ra2.protocol_name.as_deref(), Some("range"));
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
}

/// Kafka's `doSyncGroup`: a leader's assignment that cannot be stored reaches no member;
/// every waiting member gets the write's error, the group rebalances, and the members
/// rejoin into a new generation.
#[test]
fn an_assignment_that_cannot_be_stored_answers_the_error_and_rebalances() {
    let mut g = Group::new("g", Now::at(0));
    let a = first_member(&mut g, 0);
    take(&join(&mut g, args(&a, b"m"), 0)).expect("alone: generation 1");
    let b = first_member(&mut g, 0);
    let rx_b = join(&mut g, args(&b, b"m"), 0);
    let rx_a = join(&mut g, args(&a, b"m"), 1);
    let (ra, rb) = (take(&rx_a).expect("joined"), take(&rx_b).expect("joined"));
    let generation = ra.generation;
    assert_eq!(
        (generation, rb.generation, ra.leader.as_str()),
        (2, 2, a.as_str())
    );
    assert_eq!(g.state, State::CompletingRebalance);
    let (rx_fb, none) = sync_staged(&mut g, &b, generation, vec![]);
    assert_eq!(none, None, "a follower's sync stores nothing");
    let asg = vec![
        (a.clone(), Bytes::from_static(b"A")),
        (b.clone(), Bytes::from_static(b"B")),
    ];
    let (rx_la, staged) = sync_staged(&mut g, &a, generation, asg);
    assert_eq!(staged, Some(generation));
    assert!(
        take(&rx_la).is_none() && take(&rx_fb).is_none(),
        "nobody before the write"
    );
    assert_eq!(g.heartbeat(&b, None, generation, Now::at(2)), codes::NONE);

    g.assignment_written(
        generation,
        Err(codes::COORDINATOR_NOT_AVAILABLE),
        Now::at(3),
        &LIMITS,
    );
    for rx in [&rx_la, &rx_fb] {
        let r = take(rx).expect("answered with the write's error");
        assert_eq!(r.error, codes::COORDINATOR_NOT_AVAILABLE);
        assert!(
            r.assignment.is_empty(),
            "no assignment of an unstored generation"
        );
    }
    assert_eq!(g.state, State::PreparingRebalance);
    assert!(g.members.iter().all(|m| m.assignment.is_empty()));
    assert_eq!(
        g.heartbeat(&a, None, generation, Now::at(4)),
        codes::REBALANCE_IN_PROGRESS,
        "the members are told to rejoin"
    );
    // A late report of the same write changes nothing.
    g.assignment_written(generation, Ok(()), Now::at(5), &LIMITS);
    assert_eq!(g.state, State::PreparingRebalance);

    // Both rejoin: a new generation, and this time its assignment is stored.
    let rx_a = join(&mut g, args(&a, b"m"), 6);
    let rx_b = join(&mut g, args(&b, b"m"), 6);
    let (ra, rb) = (take(&rx_a).expect("joined"), take(&rx_b).expect("joined"));
    assert_eq!(
        (ra.generation, rb.generation),
        (generation + 1, generation + 1)
    );
    let rx_fb = sync(&mut g, &b, generation + 1, vec![]);
    let asg = vec![(b.clone(), Bytes::from_static(b"B2"))];
    take(&sync(&mut g, &a, generation + 1, asg)).expect("leader synced");
    assert_eq!(
        take(&rx_fb).map(|r| r.assignment),
        Some(Bytes::from_static(b"B2"))
    );
    assert_eq!(g.state, State::Stable);
}

/// An emptied group takes the protocol type of the next first member (Kafka's rule), so
/// its id can be reused by another kind of client.
#[test]
fn an_emptied_group_takes_the_next_first_members_protocol_type() {
    let mut g = Group::new("g", Now::at(0));
    let a = first_member(&mut g, 0);
    let ra = take(&join(&mut g, args(&a, b"m"), 0)).expect("joined");
    take(&sync(&mut g, &a, ra.generation, vec![])).expect("synced");
    assert_eq!(g.leave(&a, None, Now::at(10), &LIMITS), codes::NONE);
    assert_eq!(g.state, State::Empty);
    let connect = |member: &str| JoinArgs {
        protocol_type: "connect".into(),
        ..args(member, b"m")
    };
    let c = take(&join(&mut g, connect(""), 20))
        .expect("answered")
        .member_id;
    let rc = take(&join(&mut g, connect(&c), 20)).expect("joined");
    assert_eq!(rc.error, codes::NONE);
    assert_eq!(rc.protocol_type.as_deref(), Some("connect"));
    let d = take(&join(&mut g, connect(""), 30))
        .expect("answered")
        .member_id;
    let rx_d = join(&mut g, connect(&d), 30);
    assert!(
        take(&rx_d).is_none(),
        "a second connect member waits for the rebalance"
    );
}

/// Two members of generation 1 with a 10 s session and a 60 s rebalance timeout, the
/// join completed at 0: (leader, follower).
fn two_members_slow_rebalance(g: &mut Group) -> (String, String) {
    let slow = |member: &str| JoinArgs {
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 60_000,
        require_known_member_id: false,
        ..args(member, b"m")
    };
    let rx_a = join(g, slow(""), 0);
    let a = take(&rx_a).expect("alone: joined").member_id;
    take(&sync(g, &a, 1, vec![])).expect("synced");
    let rx_b = join(g, slow(""), 0);
    let rx_a = join(g, slow(&a), 0);
    let (ra, rb) = (take(&rx_a).expect("a"), take(&rx_b).expect("b"));
    assert_eq!((ra.generation, ra.leader.as_str()), (2, a.as_str()));
    (a, rb.member_id)
}

/// Kafka's `propagateAssignment` restarts the session of every member it answers: a
/// follower whose SyncGroup waited longer than its session for the leader's (librdkafka
/// sends no heartbeat meanwhile) is not expired right after getting its assignment.
#[test]
fn a_follower_answered_after_a_long_sync_keeps_its_session() {
    let mut g = Group::new("g", Now::at(0));
    let (a, b) = two_members_slow_rebalance(&mut g);
    let (rx_b, none) = sync_at(&mut g, &b, 2, vec![], 0);
    assert_eq!(none, None);
    assert_eq!(g.heartbeat(&a, None, 2, Now::at(9_000)), codes::NONE);
    g.tick(Now::at(12_000), &LIMITS);
    assert!(g.member(&b).is_some(), "a waiting sync is alive");
    let (rx_a, staged) = sync_at(&mut g, &a, 2, vec![], 15_000);
    assert_eq!(staged, Some(2));
    g.assignment_written(2, Ok(()), Now::at(15_000), &LIMITS);
    assert_eq!(take(&rx_b).map(|r| r.error), Some(codes::NONE));
    assert_eq!(take(&rx_a).map(|r| r.error), Some(codes::NONE));
    g.tick(Now::at(15_100), &LIMITS);
    assert!(
        g.member(&b).is_some(),
        "the session restarted at the answer"
    );
    assert_eq!(g.state, State::Stable);
    g.tick(Now::at(25_000), &LIMITS);
    assert!(
        g.member(&b).is_none(),
        "and it still expires a session later"
    );
}

/// The leader never syncs: the follower's waiting SyncGroup is answered
/// REBALANCE_IN_PROGRESS at the rebalance deadline, and it has a whole session to rejoin.
#[test]
fn a_follower_told_to_rejoin_has_a_session_to_do_it() {
    let mut g = Group::new("g", Now::at(0));
    let (a, b) = two_members_slow_rebalance(&mut g);
    let (rx_b, _) = sync_at(&mut g, &b, 2, vec![], 0);
    g.tick(Now::at(60_000), &LIMITS);
    assert_eq!(
        take(&rx_b).map(|r| r.error),
        Some(codes::REBALANCE_IN_PROGRESS)
    );
    assert!(g.member(&a).is_none(), "the leader did not sync: dropped");
    g.tick(Now::at(60_200), &LIMITS);
    assert!(g.member(&b).is_some(), "not expired before it can rejoin");
    let rb = take(&join(&mut g, args(&b, b"m"), 61_000)).expect("rejoined");
    assert_eq!((rb.error, rb.generation), (codes::NONE, 3));
}

/// A static member's replacement whose write fails is undone: the old id (the one the
/// log holds) is a member and the leader again, and the new id was never handed out.
#[test]
fn a_static_replacement_not_stored_is_undone() {
    let mut g = Group::new("g", Now::at(0));
    let mut a = args("", b"m");
    a.instance_id = Some("i1".into());
    let old = take(&join(&mut g, a.clone(), 0)).expect("joined").member_id;
    take(&sync(&mut g, &old, 1, vec![])).expect("synced");
    let (tx, rx) = local_channel::new_bounded(1);
    let r = g
        .join(a, Now::at(100), &LIMITS, tx)
        .expect("a replacement to store");
    assert!(take(&rx).is_none(), "answered once stored");
    g.replacement_written(r, Err(codes::COORDINATOR_NOT_AVAILABLE), Now::at(200));
    let answer = take(&rx).expect("answered with the write's error");
    assert_eq!(
        (answer.error, answer.member_id.as_str()),
        (codes::COORDINATOR_NOT_AVAILABLE, "")
    );
    assert_eq!(g.heartbeat(&old, Some("i1"), 1, Now::at(300)), codes::NONE);
    assert_eq!(g.leader.as_deref(), Some(old.as_str()));
    assert_eq!(g.members.len(), 1);
    assert_eq!(g.state, State::Stable);
}

/// One client may park thousands of members (JoinGroup v0-v3 needs no KIP-394 step, and
/// `group.max.size` is unbounded by default): joining, completing the join, the sync and
/// a heartbeat from each stay linear in the members, not quadratic.
#[test]
fn many_members_rebalance_in_linear_time() {
    const MEMBERS: usize = 10_000;
    let limits = Limits {
        initial_delay_ms: 1000,
        max_size: usize::MAX,
    };
    let started = std::time::Instant::now();
    let mut g = Group::new("g", Now::at(0));
    let mut waiting = Vec::with_capacity(MEMBERS);
    for _ in 0..MEMBERS {
        let (tx, rx) = local_channel::new_bounded(1);
        let a = JoinArgs {
            require_known_member_id: false,
            ..args("", b"m")
        };
        assert!(g.join(a, Now::at(0), &limits, tx).is_none());
        g.try_complete_join(Now::at(0));
        waiting.push(rx);
    }
    g.tick(Now::at(1000), &limits);
    let answers: Vec<JoinResult> = waiting.iter().map(|rx| take(rx).expect("joined")).collect();
    let leader = answers[0].leader.clone();
    assert_eq!(g.members.len(), MEMBERS);
    let asg = answers
        .iter()
        .map(|r| (r.member_id.clone(), Bytes::from_static(b"p")))
        .collect();
    let followers: Vec<_> = answers
        .iter()
        .filter(|r| r.member_id != leader)
        .map(|r| sync_at(&mut g, &r.member_id, 1, vec![], 1000).0)
        .collect();
    let (rx, staged) = sync_at(&mut g, &leader, 1, asg, 1000);
    g.assignment_written(staged.expect("leader"), Ok(()), Now::at(1000), &limits);
    assert_eq!(take(&rx).map(|r| r.error), Some(codes::NONE));
    assert!(
        followers
            .iter()
            .all(|rx| take(rx).is_some_and(|r| r.assignment == "p"))
    );
    for r in &answers {
        assert_eq!(
            g.heartbeat(&r.member_id, None, 1, Now::at(2000)),
            codes::NONE
        );
    }
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
}

/// Sessions and rebalance deadlines run on the monotonic clock: a step of the system
/// clock (an hour or two forward, or back) expires no member and ends no rebalance early
/// or late; only the monotonic time does. The state timestamp, which is stored and which
/// offsets retention compares with commit timestamps, is the system clock's.
#[test]
fn a_system_clock_step_expires_no_session_and_moves_no_deadline() {
    let wall = 1_700_000_000_000;
    let at = |mono_ms: i64, wall_ms: i64| Now { mono_ms, wall_ms };
    let mut g = Group::new("g", at(0, wall));
    let a = first_member(&mut g, 0);
    let ra = take(&join(&mut g, args(&a, b"m"), 0)).expect("joined");
    take(&sync(&mut g, &a, ra.generation, vec![])).expect("synced");
    assert_eq!(g.state, State::Stable);
    // A second member joins; `a` heartbeats but never rejoins: the join phase waits up
    // to the rebalance timeout (10 s), then goes on without it.
    let b = first_member(&mut g, 100);
    let rx_b = join(&mut g, args(&b, b"m"), 100);
    for (mono, step) in [(1_000, 3_600_000), (5_000, -3_600_000), (10_000, 7_200_000)] {
        g.heartbeat(&a, None, 1, at(mono, wall + step));
        g.tick(at(mono, wall + step), &LIMITS);
        assert_eq!(
            g.state,
            State::PreparingRebalance,
            "at {mono} ms, step {step}"
        );
        assert!(g.member(&a).is_some(), "at {mono} ms, step {step}");
    }
    g.tick(at(10_100, wall), &LIMITS);
    let rb = take(&rx_b).expect("completed at the rebalance timeout, monotonic");
    assert_eq!(rb.leader, b);
    assert!(g.member(&a).is_none());
    let (rx, staged) = sync_at(&mut g, &b, rb.generation, vec![], 10_100);
    g.assignment_written(staged.expect("b leads"), Ok(()), at(10_100, wall), &LIMITS);
    take(&rx).expect("synced");
    // b's session (6 s) restarted at its answer: an hour's step forward expires nothing.
    g.tick(at(10_200, wall + 3_600_000), &LIMITS);
    assert_eq!(
        g.state,
        State::Stable,
        "an hour's step forward expires nobody"
    );
    g.tick(at(16_100, wall + 10), &LIMITS);
    assert_eq!(g.state, State::Empty, "expired on the monotonic clock");
    assert_eq!(
        g.state_since_ms,
        wall + 10,
        "the stored state timestamp is the system clock's"
    );
}
