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
