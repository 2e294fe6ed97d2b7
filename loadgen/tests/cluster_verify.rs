//! `weir-loadgen verify` against a 3-node weir cluster (RF 3, `min.insync.replicas=2`)
//! while the leader of partition 0 is SIGKILLed and restarted every 8 s, through
//! `scripts/cluster_verify.sh`: an idempotent acks=all producer loses nothing
//! acknowledged and duplicates nothing. About a minute, so `#[ignore]`:
//! `cargo build -p weir --bins && cargo test -p weir-loadgen --test cluster_verify -- --ignored`.
//! Needs kcat and python3 (the script finds the leader with `kcat -L -J`).

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use weir_loadgen::broker::find_weir;

#[test]
#[ignore = "a 3-node cluster for ~1 minute with leader SIGKILLs"]
fn verify_on_a_cluster_with_leader_sigkills_loses_and_duplicates_nothing() {
    let weir = find_weir().expect("the weir binary: cargo build -p weir --bins");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cluster-verify");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster_verify.sh");
    let status = Command::new("timeout")
        .arg("900")
        .arg("bash")
        .arg(&script)
        .env("WEIR_BIN", &weir)
        .env("LOADGEN_BIN", env!("CARGO_BIN_EXE_weir-loadgen"))
        .env("OUT", &out)
        .env("DURATION", "40s")
        .env("RATE", "2000")
        .env("FAULT_EVERY", "8s")
        .status()
        .expect("run the script");
    let json = std::fs::read_to_string(out.join("v.json")).expect("the verdict");
    let v: Value = serde_json::from_str(&json).unwrap();
    eprintln!("{json}");
    assert_eq!(v["lost"], 0, "lost: {json}");
    assert_eq!(v["duplicated"], 0, "duplicated: {json}");
    assert_eq!(v["reordered"], 0, "reordered: {json}");
    assert!(v["faults_injected"].as_u64().unwrap() >= 3, "{json}");
    assert!(v["acknowledged"].as_u64().unwrap() > 0, "{json}");
    assert!(status.success(), "the script failed: {status}");
}
