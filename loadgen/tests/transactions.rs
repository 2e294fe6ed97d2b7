//! `weir-loadgen verify --transactional` against a real `weir` process on 127.0.0.1:
//! transactions of --txn-records records, read back read_committed; fault-free, and with
//! the broker SIGKILLed and restarted during the produce phase. Needs the `weir` binary
//! built next to the test binaries (`cargo build --workspace --bins`).

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

mod common;

use common::{json, loadgen, scratch, start, verify_across_sigkill};

/// Without faults every transaction commits: everything acknowledged, read back once.
#[test]
fn verify_transactional_commits_every_record_fault_free() {
    let dir = scratch();
    let mut b = start(dir.path());
    let vj = dir.path().join("v.json");
    let args = [
        "verify",
        "--transactional",
        "--bootstrap",
        &b.addr,
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
    let out = loadgen(&args);
    let _ = b.kill();
    assert_eq!(out.code, 0, "{out}");
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

/// Exactly once under SIGKILL + restart: every committed record read back once by a
/// read_committed consumer, no record of an aborted transaction visible.
#[test]
fn verify_transactional_exactly_once_across_sigkill() {
    let (out, v) = verify_across_sigkill(
        "txn-verify",
        &[
            "--transactional",
            "--txn-records",
            "100",
            "--transaction-timeout-ms",
            "20000",
        ],
    );
    assert!(v["faults_injected"].as_u64().unwrap() >= 2, "{v}\n{out}");
    assert!(v["acknowledged"].as_u64().unwrap() > 10_000, "{v}\n{out}");
    assert_eq!(v["lost"], 0, "{v}\n{out}");
    assert_eq!(v["duplicated"], 0, "{v}\n{out}");
    assert_eq!(v["aborted_visible"], 0, "{v}\n{out}");
}
