//! Finding 6 of issue 10: a full disk is not permanent. A real weir with its data dir on
//! a small loop-mounted ext4 filesystem (created by the test, needs root: skipped with a
//! message otherwise) gets produces until the filesystem is full and Produce answers
//! KAFKA_STORAGE_ERROR; then space is freed (a filler file deleted) and, without a
//! restart, produces succeed again on the same partition. Every acknowledged record is
//! read back at its offset, offsets are contiguous, and nothing that was refused appears.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use kafka_protocol::records::Compression;
use weir_tests::broker::target_dir;
use weir_tests::clients;
use weir_tests::cluster::{self, Cluster};
use weir_tests::raw::{self, RawConn};
use weir_tests::{Weir, WeirConfig};

const TOPIC: &str = "full";
const KAFKA_STORAGE_ERROR: i16 = 56;
/// The test filesystem: small, so filling it is quick.
const FS_BYTES: u64 = 64 << 20;
/// Left free after the filler, for weir to fill with records.
const ROOM_BYTES: u64 = 1 << 20;
/// Bounds: produces before the disk must be full, the wait for appends to resume.
const PRODUCES_MAX: usize = 2_000;
const RESUME_TIMEOUT: Duration = Duration::from_secs(60);
/// Produces sent back to back on the full disk, and the most lines a second they may log
/// (the broker's rate limit for lines a client causes, `log_limit`).
const REFUSED_BURST: usize = 300;
const LINES_PER_SECOND_MAX: u64 = 10;

/// A loop-mounted filesystem in a directory of its own; unmounted and removed on drop,
/// whatever the test did.
struct LoopMount {
    root: PathBuf,
    mnt: PathBuf,
    mounted: bool,
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if self.mounted {
            let ok = Command::new("umount")
                .arg(&self.mnt)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                // Busy (a process still has a file open): detach it lazily.
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// Creates and mounts an ext4 filesystem of `FS_BYTES`; `None` (with the reason printed)
/// where that is impossible (not root, no loop devices, no mkfs.ext4).
fn mount_small_fs() -> Result<Option<LoopMount>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED disk_full: needs root to loop-mount a filesystem");
        return Ok(None);
    }
    let base = target_dir().join("e2e-data");
    fs::create_dir_all(&base)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let root = base.join(format!("diskfull-{}-{nanos}", std::process::id()));
    let mut guard = LoopMount {
        mnt: Path::new(&root).join("mnt"),
        root,
        mounted: false,
    };
    fs::create_dir_all(&guard.mnt)?;
    let img = guard.root.join("fs.img");
    fs::File::create(&img)?.set_len(FS_BYTES)?;
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0"])
        .arg(&img)
        .output();
    match mkfs {
        Ok(out) if out.status.success() => {}
        other => {
            eprintln!("SKIPPED disk_full: mkfs.ext4 failed: {other:?}");
            return Ok(None);
        }
    }
    let mount = Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img)
        .arg(&guard.mnt)
        .output()?;
    if !mount.status.success() {
        eprintln!(
            "SKIPPED disk_full: mount -o loop failed: {}",
            String::from_utf8_lossy(&mount.stderr)
        );
        return Ok(None);
    }
    guard.mounted = true;
    Ok(Some(guard))
}

/// Fills the filesystem with one file, then frees `ROOM_BYTES` of it.
fn fill(path: &Path) -> Result<()> {
    let mut f = fs::File::create(path)?;
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    for _ in 0..(FS_BYTES >> 20) + 8 {
        match f.write_all(&chunk) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => return Err(e).context("write filler"),
        }
    }
    f.sync_all()?;
    f.set_len(written.saturating_sub(ROOM_BYTES))?;
    f.sync_all()?;
    Ok(())
}

/// One produce of `records` values of `len` bytes; returns (error, base offset, values).
fn produce(
    conn: &mut RawConn,
    id: usize,
    records: usize,
    len: usize,
) -> Result<(i16, i64, Vec<Bytes>)> {
    let values: Vec<Vec<u8>> = (0..records)
        .map(|r| {
            let mut v = format!("p{id}r{r}:").into_bytes();
            v.resize(len, b'a' + (id % 26) as u8);
            v
        })
        .collect();
    let batch = raw::record_batch(&values, Compression::None)?;
    let (error, base) = conn.produce(TOPIC, 0, 1, batch)?;
    Ok((error, base, values.into_iter().map(Bytes::from).collect()))
}

/// Records every acknowledged value at its offset.
fn record(acked: &mut BTreeMap<i64, Bytes>, base: i64, values: Vec<Bytes>) {
    for (i, v) in values.into_iter().enumerate() {
        let previous = acked.insert(base + i as i64, v);
        assert!(
            previous.is_none(),
            "offset {} acknowledged twice",
            base + i as i64
        );
    }
}

#[test]
fn a_full_disk_refuses_produce_until_space_is_freed_then_produce_resumes() -> Result<()> {
    let Some(mount) = mount_small_fs()? else {
        return Ok(());
    };
    let weir = Weir::start_in(WeirConfig::shards(1), &mount.mnt)?;
    clients::create_topics(&weir.bootstrap(), &[TOPIC], 1, &[])?;
    let mut conn = RawConn::connect(weir.addr())?;
    let mut acked = BTreeMap::new();
    let mut id = 0;
    // The topic works before the disk fills.
    for _ in 0..5 {
        let (error, base, values) = produce(&mut conn, id, 4, 1000)?;
        ensure!(error == 0, "produce before filling: error {error}");
        record(&mut acked, base, values);
        id += 1;
    }
    let filler = mount.mnt.join("filler");
    fill(&filler)?;

    let mut refused = 0;
    for _ in 0..PRODUCES_MAX {
        let (error, base, values) = produce(&mut conn, id, 8, 8000)?;
        id += 1;
        match error {
            0 => record(&mut acked, base, values),
            KAFKA_STORAGE_ERROR => {
                refused += 1;
                break;
            }
            other => bail!("produce on a filling disk: error {other}"),
        }
    }
    ensure!(
        refused == 1,
        "the disk never filled ({} records acknowledged)",
        acked.len()
    );
    let (error, _, _) = produce(&mut conn, id, 1, 100)?;
    id += 1;
    ensure!(
        error == KAFKA_STORAGE_ERROR,
        "still full, produce answered {error}"
    );
    // Every refused produce used to write a line of its own: a full disk filled its
    // log as fast as clients retried. The per-request lines are rate limited now.
    let logged = |weir: &Weir| weir.log_text().matches("append failed").count();
    let (before, started) = (logged(&weir), Instant::now());
    let mut refused_fast = 0;
    for _ in 0..REFUSED_BURST {
        let (error, _, _) = produce(&mut conn, id, 1, 100)?;
        id += 1;
        if error == KAFKA_STORAGE_ERROR {
            refused_fast += 1;
        }
    }
    let seconds = started.elapsed().as_secs() + 2;
    // Read once: lines still on their way to the test can only make the count lower.
    let lines = logged(&weir) - before;
    ensure!(
        refused_fast > REFUSED_BURST / 2,
        "only {refused_fast} of {REFUSED_BURST} produces refused on a full disk"
    );
    ensure!(
        lines as u64 <= LINES_PER_SECOND_MAX * seconds,
        "{lines} 'append failed' lines for {refused_fast} refused produces in {seconds} s"
    );

    fs::remove_file(&filler)?;
    let deadline = Instant::now() + RESUME_TIMEOUT;
    loop {
        let (error, base, values) = produce(&mut conn, id, 4, 1000)?;
        id += 1;
        if error == 0 {
            record(&mut acked, base, values);
            break;
        }
        ensure!(
            error == KAFKA_STORAGE_ERROR,
            "after freeing space: error {error}"
        );
        ensure!(
            Instant::now() < deadline,
            "produce still refused {RESUME_TIMEOUT:?} after space was freed; log tail:\n{}",
            weir.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..20 {
        let (error, base, values) = produce(&mut conn, id, 4, 1000)?;
        id += 1;
        ensure!(error == 0, "produce after space came back: error {error}");
        record(&mut acked, base, values);
    }

    eprintln!(
        "disk_full: {} records acknowledged, refused at produce {id}; weir log:\n{}",
        acked.len(),
        weir.log_tail(12)
    );
    let got = read_partition(&mut conn)?;
    let offsets: Vec<i64> = got.keys().copied().collect();
    let expected: Vec<i64> = (0..offsets.len() as i64).collect();
    ensure!(offsets == expected, "offsets are not contiguous from 0");
    for (offset, value) in &acked {
        ensure!(
            got.get(offset) == Some(value),
            "acknowledged record at {offset} missing or different"
        );
    }
    ensure!(
        got.len() == acked.len(),
        "{} records in the log, {} acknowledged: refused produces left records",
        got.len(),
        acked.len()
    );
    drop(weir);
    drop(mount);
    Ok(())
}

/// Every record of the partition, by offset, read up to the high watermark.
fn read_partition(conn: &mut RawConn) -> Result<BTreeMap<i64, Bytes>> {
    let mut got = BTreeMap::new();
    let mut at = 0;
    for _ in 0..10_000 {
        let (error, hw, records) = conn.fetch(TOPIC, 0, at, 1 << 20)?;
        ensure!(error == 0, "fetch at {at}: error {error}");
        if at >= hw {
            return Ok(got);
        }
        ensure!(
            !records.is_empty(),
            "fetch at {at} below the high watermark {hw} returned nothing"
        );
        for r in records {
            if r.offset >= at {
                got.insert(r.offset, r.value.unwrap_or_default());
            }
        }
        at = got.keys().next_back().map_or(at, |o| o + 1);
    }
    bail!("reading the partition did not finish")
}

const REPLICATED: &str = "full-replicated";
/// What the leader's log says when a rollback cut offsets its followers had copied.
const FENCED_LOG: &str = "appends under this leader epoch are refused";
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const AGREE_TIMEOUT: Duration = Duration::from_secs(60);
/// Concurrent producers: appends in flight on the leader while followers fetch.
const PRODUCERS: usize = 4;
/// Times the leader's disk is filled, at most, waiting for a rollback of served offsets.
const FILL_ROUNDS: usize = 8;

/// (leader, replicas, ISR) of every partition of `topic` as node `via` sees it.
fn placements(c: &mut Cluster, via: i32, topic: &str) -> Vec<(i32, i32, Vec<i32>, Vec<i32>)> {
    let Ok(m) = c.metadata(via) else {
        return Vec::new();
    };
    let Some(t) = m
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
    else {
        return Vec::new();
    };
    t.partitions
        .iter()
        .map(|p| {
            let ids = |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|n| n.0).collect();
            (
                p.partition_index,
                p.leader_id.0,
                ids(&p.replica_nodes),
                ids(&p.isr_nodes),
            )
        })
        .collect()
}

/// Produces acks=all batches to `partition` at `addr` until a produce is refused (or
/// `PRODUCES_MAX`); returns what was acknowledged, by offset.
fn produce_until_refused(
    addr: std::net::SocketAddr,
    partition: i32,
    producer: usize,
) -> Result<(BTreeMap<i64, Bytes>, i16)> {
    let mut conn = RawConn::connect(addr)?;
    let mut acked = BTreeMap::new();
    for seq in 0..PRODUCES_MAX {
        let values: Vec<Vec<u8>> = (0..8)
            .map(|r| {
                let mut v = format!("w{producer}s{seq}r{r}:").into_bytes();
                v.resize(4000, b'a' + (seq % 26) as u8);
                v
            })
            .collect();
        let batch = raw::record_batch(&values, Compression::None)?;
        let (error, base) = conn.produce(REPLICATED, partition, -1, batch)?;
        if error != 0 {
            return Ok((acked, error));
        }
        for (i, v) in values.into_iter().enumerate() {
            acked.insert(base + i as i64, Bytes::from(v));
        }
    }
    Ok((acked, 0))
}

/// One acks=all produce to `partition` at `addr`: what it acknowledged (nothing if it was
/// refused) and its error.
fn produce_until_one(
    addr: std::net::SocketAddr,
    partition: i32,
    seq: usize,
) -> Result<(BTreeMap<i64, Bytes>, i16)> {
    let mut conn = RawConn::connect(addr)?;
    let values: Vec<Vec<u8>> = (0..8)
        .map(|r| format!("after-s{seq}r{r}").into_bytes())
        .collect();
    let batch = raw::record_batch(&values, Compression::None)?;
    let (error, base) = conn.produce(REPLICATED, partition, -1, batch)?;
    let mut acked = BTreeMap::new();
    if error == 0 {
        for (i, v) in values.into_iter().enumerate() {
            acked.insert(base + i as i64, Bytes::from(v));
        }
    }
    Ok((acked, error))
}

/// Issue 11 across nodes: node 4's data dir is a small filesystem (a broker-only node, so
/// no controller log lives there) and it leads a partition replicated on nodes 1 and 2.
/// Concurrent acks=all producers fill it; its followers fetch from its tail cache, past
/// its written end, while writes are in flight. When a write fails with ENOSPC and the
/// rollback cuts offsets they copied, node 4 stops appending under that epoch and
/// resigns: the controller moves leadership within the ISR. After space is freed,
/// producing resumes, the three replicas' logs are identical and every acknowledged record
/// is in them. Whether a rollback cuts served offsets depends on timing: the disk is
/// filled up to `FILL_ROUNDS` times until it does, and the test prints what happened.
///
/// Not in the default run: on a clean-clone CI run the fence came only in round 6, when
/// the partition's own log (56 MB) left node 4 too little room to catch up as a follower
/// even with the filler gone, and the replicas' logs stayed different (the check is right,
/// the setup is not: the rounds must not outgrow the filesystem). The node-level tests
/// (`storage_sim`, `partition_replica`) are the ones that reproduce the bug. Run it with
/// `cargo test --workspace --test disk_full -- --ignored --nocapture` (root).
#[test]
#[ignore = "its fill rounds can outgrow the small filesystem; see the doc comment"]
fn a_full_leader_that_served_its_followers_leaves_the_replicas_identical() -> Result<()> {
    let Some(mount) = mount_small_fs()? else {
        return Ok(());
    };
    let extra = [
        ("min.insync.replicas", "2"),
        ("auto.leader.rebalance.enable", "false"),
    ];
    let mut c = Cluster::start_with_brokers_in(3, 1, &extra, &[(4, &mount.mnt)])?;
    c.wait_agreed(4, AGREE_TIMEOUT, |_| true)?;
    // Four partitions over four nodes: one of them has node 4 as its preferred leader.
    ensure!(cluster::create_topic(c.node(1).addr(), REPLICATED, 4, 3)? == 0);
    let deadline = Instant::now() + AGREE_TIMEOUT;
    let (partition, replicas) = loop {
        let led = placements(&mut c, 4, REPLICATED)
            .into_iter()
            .find(|(_, leader, replicas, isr)| *leader == 4 && isr.len() == replicas.len());
        if let Some((p, _, replicas, _)) = led {
            break (p, replicas);
        }
        ensure!(
            Instant::now() < deadline,
            "no partition led by node 4 in sync"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let filler = mount.mnt.join("filler");
    let mut acked = BTreeMap::new();
    let (mut fenced, mut rounds, mut resumed) = (false, 0, 0);
    // Whether a follower copied the append whose write fails is a matter of timing: the
    // disk is filled again (bounded) until it happens.
    while !fenced && rounds < FILL_ROUNDS {
        rounds += 1;
        fill(&filler)?;
        let addr = c.node(4).addr();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|i| std::thread::spawn(move || produce_until_refused(addr, partition, i)))
            .collect();
        let mut refusals = Vec::new();
        for t in producers {
            let (got, error) = t
                .join()
                .map_err(|_| anyhow::anyhow!("producer panicked"))??;
            acked.extend(got);
            refusals.push(error);
        }
        fenced = c.node(4).log_text().contains(FENCED_LOG);
        eprintln!(
            "disk_full replicated: round {rounds}: {} records acknowledged; refusals {refusals:?}; rollback of served offsets: {fenced}",
            acked.len()
        );
        if fenced {
            // Resigned: another ISR member leads under a newer epoch.
            let deadline = Instant::now() + AGREE_TIMEOUT;
            while placements(&mut c, 1, REPLICATED)
                .iter()
                .any(|(p, leader, ..)| *p == partition && *leader == 4)
            {
                ensure!(
                    Instant::now() < deadline,
                    "node 4 kept leading after the fence"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            ensure!(
                refusals.contains(&NOT_LEADER_OR_FOLLOWER)
                    || refusals.contains(&KAFKA_STORAGE_ERROR)
            );
        }

        fs::remove_file(&filler)?;
        // Space is back: producing resumes at whoever leads (under a new epoch if node 4
        // resigned), and every replica must end with the same records at the same offsets.
        let deadline = Instant::now() + RESUME_TIMEOUT;
        let mut ok = 0;
        while ok < 10 {
            let leader = placements(&mut c, 1, REPLICATED)
                .into_iter()
                .find(|(p, ..)| *p == partition)
                .map(|(_, leader, ..)| leader);
            let addr = match leader {
                Some(l) if l > 0 => c.node(l).addr(),
                _ => c.node(4).addr(),
            };
            let (got, _) = produce_until_one(addr, partition, resumed)?;
            resumed += 1;
            ok += usize::from(!got.is_empty());
            acked.extend(got);
            ensure!(
                Instant::now() < deadline,
                "produce did not resume after space was freed; node 4 log:\n{}",
                c.node(4).log_tail(30)
            );
            if ok == 0 {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    eprintln!("disk_full replicated: {rounds} round(s), rollback of served offsets: {fenced}");
    let dirs: Vec<PathBuf> = replicas
        .iter()
        .map(|id| {
            c.node(*id)
                .data_dir()
                .join(format!("{REPLICATED}-{partition}"))
        })
        .collect();
    let deadline = Instant::now() + AGREE_TIMEOUT;
    let log = loop {
        let logs: Vec<Vec<u8>> = dirs.iter().map(|d| cluster::log_bytes(d)).collect();
        if !logs[0].is_empty() && logs.windows(2).all(|w| w[0] == w[1]) {
            break logs[0].clone();
        }
        ensure!(
            Instant::now() < deadline,
            "replica logs differ: lengths {:?}; node 4 log:\n{}",
            logs.iter().map(Vec::len).collect::<Vec<_>>(),
            c.node(4).log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Every acknowledged record, from whoever leads now, up to the HW.
    let leader = placements(&mut c, 1, REPLICATED)
        .into_iter()
        .find(|(p, ..)| *p == partition)
        .map(|(_, leader, ..)| leader)
        .context("no placement")?;
    let mut conn = RawConn::connect(c.node(leader).addr())?;
    let got = read_replicated(&mut conn, partition)?;
    for (offset, value) in &acked {
        ensure!(
            got.get(offset) == Some(value),
            "acknowledged record at {offset} missing or different"
        );
    }
    eprintln!(
        "disk_full replicated: replicas identical ({} log bytes), {} records readable, leader now node {leader}",
        log.len(),
        got.len()
    );
    drop(c);
    drop(mount);
    Ok(())
}

/// Every record of `partition` of the replicated topic, up to the HW.
fn read_replicated(conn: &mut RawConn, partition: i32) -> Result<BTreeMap<i64, Bytes>> {
    let mut got = BTreeMap::new();
    let mut at = 0;
    for _ in 0..10_000 {
        let (error, hw, records) = conn.fetch(REPLICATED, partition, at, 1 << 20)?;
        ensure!(error == 0, "fetch at {at}: error {error}");
        if at >= hw {
            return Ok(got);
        }
        for r in records {
            if r.offset >= at {
                got.insert(r.offset, r.value.unwrap_or_default());
            }
        }
        at = got.keys().next_back().map_or(at, |o| o + 1);
    }
    bail!("reading the partition did not finish")
}
