//! `weir-loadgen verify --transactional` against a real `weir` process on 127.0.0.1:
//! transactions of --txn-records records, read back read_committed; fault-free, and with
//! the broker SIGKILLed and restarted during the produce phase. Needs the `weir` binary
//! built next to the test binaries (`cargo build --workspace --bins`).

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_loadgen::broker::{Broker, find_weir};

const LOADGEN: &str = env!("CARGO_BIN_EXE_weir-loadgen");
/// No single loadgen invocation in these tests may take longer than this.
const CMD_TIMEOUT: Duration = Duration::from_secs(180);

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn weir() -> PathBuf {
    find_weir().expect("the weir binary: run `cargo build --workspace --bins` first")
}

/// Runs weir-loadgen with `args`, bounded in time; returns (exit code, stdout).
fn loadgen(dir: &Path, args: &[&str]) -> (i32, String) {
    let out_path = dir.join("loadgen.out");
    let err_path = dir.join("loadgen.err");
    let out = std::fs::File::create(&out_path).expect("stdout file");
    let err = std::fs::File::create(&err_path).expect("stderr file");
    let mut child = Command::new(LOADGEN)
        .args(args)
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn weir-loadgen");
    let deadline = Instant::now() + CMD_TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("weir-loadgen {args:?} took longer than {CMD_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    // The last warnings, for a failure's message.
    let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    (
        status.code().unwrap_or(-1),
        format!("{stdout}\n--- stderr (tail) ---\n{}", tail.join("\n")),
    )
}

fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("json written");
    serde_json::from_str(&text).expect("valid json")
}

/// Without faults every transaction commits: everything acknowledged, read back once.
#[test]
fn verify_transactional_commits_every_record_fault_free() {
    let dir = scratch();
    let mut b = Broker::start(&weir(), &dir.path().join("data"), 1, &[]).expect("weir starts");
    let vj = dir.path().join("v.json");
    let addr = b.addr.clone();
    let args = [
        "verify",
        "--transactional",
        "--bootstrap",
        &addr,
        "--topic",
        "txn-verify",
        "--partitions",
        "3",
        "--records",
        "6000",
        "--txn-records",
        "100",
        "--batch-size",
        "8192",
        "--quiet",
        "--strict",
        "--json",
        vj.to_str().unwrap(),
    ];
    let (code, out) = loadgen(dir.path(), &args);
    let _ = b.kill();
    assert_eq!(code, 0, "{out}");
    let v = json(&vj);
    assert_eq!(v["transactional"], true, "{v}");
    assert_eq!(v["sent"], 6000, "{v}");
    assert_eq!(v["acknowledged"], 6000, "{v}");
    assert_eq!(v["read_unique"], 6000, "{v}");
    assert_eq!(v["lost"], 0, "{v}");
    assert_eq!(v["duplicated"], 0, "{v}");
    assert_eq!(v["aborted"], 0, "{v}");
    assert_eq!(v["aborted_visible"], 0, "{v}");
    // Every partition got records (transactions span partitions).
    for p in 0..3 {
        let read = v["partitions"][p.to_string()]["read"].as_u64().unwrap_or(0);
        assert!(read > 0, "partition {p} read nothing: {v}");
    }
}

/// A shell script that SIGKILLs the broker whose pid is in `pidfile` and starts it again
/// on the same port; the test's guard kills the last one.
fn restart_script(dir: &Path, port: &str) -> PathBuf {
    let script = dir.join("restart.sh");
    let body = format!(
        "#!/bin/sh\nP=$(cat {d}/pid); kill -9 \"$P\" 2>/dev/null\n\
         for i in $(seq 1 200); do [ -e /proc/$P ] && ! grep -qs zombie /proc/$P/status || break; sleep 0.05; done\n\
         sleep 0.2\n\
         {w} serve --data-dir {d}/data --listen 127.0.0.1:{port} --shards 1 >> {d}/restarts.log 2>&1 &\n\
         echo $! > {d}/pid\n",
        d = dir.display(),
        w = weir().display(),
    );
    std::fs::write(&script, body).expect("script");
    let _ = Command::new("chmod").arg("+x").arg(&script).status();
    script
}

/// Kills whatever broker the pid file names when the test ends (pass or fail).
struct PidGuard(PathBuf);

impl Drop for PidGuard {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(&self.0) {
            let _ = Command::new("kill").arg("-9").arg(pid.trim()).status();
        }
    }
}

/// Exactly once under SIGKILL + restart: every committed record read back once by a
/// read_committed consumer, no record of an aborted transaction visible.
#[test]
fn verify_transactional_exactly_once_across_sigkill() {
    let dir = scratch();
    let mut first = Broker::start(&weir(), &dir.path().join("data"), 1, &[]).expect("weir");
    let port = first.addr.rsplit(':').next().unwrap().to_string();
    let pidfile = dir.path().join("pid");
    std::fs::write(&pidfile, first.pid().to_string()).unwrap();
    let _guard = PidGuard(pidfile);
    let script = restart_script(dir.path(), &port);
    let vj = dir.path().join("v.json");
    let addr = first.addr.clone();
    let cmd = script.display().to_string();
    let args = [
        "verify",
        "--transactional",
        "--bootstrap",
        &addr,
        "--topic",
        "txn-verify",
        "--partitions",
        "2",
        "--rate",
        "3000",
        "--duration",
        "8s",
        "--txn-records",
        "100",
        "--transaction-timeout-ms",
        "20000",
        "--delivery-timeout-ms",
        "60000",
        "--fault-every",
        "2500ms",
        "--fault-cmd",
        &cmd,
        "--quiet",
        "--json",
        vj.to_str().unwrap(),
    ];
    let (code, out) = loadgen(dir.path(), &args);
    // The first broker was SIGKILLed by the script; reap it.
    let _ = first.kill();
    assert_eq!(code, 0, "{out}");
    let v = json(&vj);
    assert!(v["faults_injected"].as_u64().unwrap() >= 2, "{v}\n{out}");
    assert!(v["acknowledged"].as_u64().unwrap() > 10_000, "{v}\n{out}");
    assert_eq!(v["lost"], 0, "{v}\n{out}");
    assert_eq!(v["duplicated"], 0, "{v}\n{out}");
    assert_eq!(v["aborted_visible"], 0, "{v}\n{out}");
}
