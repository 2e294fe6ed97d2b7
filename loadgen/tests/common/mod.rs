//! What the tests of weir-loadgen against a real `weir` share: scratch dirs on the real
//! disk, the `weir` binary, bounded runs of `weir-loadgen`, its JSON reports, and a broker
//! that a `--fault-cmd` script SIGKILLs and restarts.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_loadgen::broker::{Broker, find_weir};

pub const LOADGEN: &str = env!("CARGO_BIN_EXE_weir-loadgen");
/// No single loadgen invocation in these tests may take longer than this.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(180);
/// Lines of a run's stderr kept for a failure's message (its last warnings).
const STDERR_TAIL_LINES: usize = 30;

pub fn scratch() -> tempfile::TempDir {
    // Real disk under the target dir, not /tmp (which may be tmpfs).
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

pub fn weir() -> PathBuf {
    find_weir().expect("the weir binary: run `cargo build --workspace --bins` first")
}

/// A one-shard weir with its data in `dir/data`.
pub fn start(dir: &Path) -> Broker {
    Broker::start(&weir(), &dir.join("data"), 1, &[]).expect("weir starts")
}

/// What one weir-loadgen run left: its exit code, its stdout and the tail of its stderr.
/// Displayed (in a failure's message) as both.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr_tail: String,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}\n--- stderr (tail) ---\n{}",
            self.stdout, self.stderr_tail
        )
    }
}

/// Runs weir-loadgen with `args`, bounded in time (its output in files of a scratch dir
/// of its own, removed after).
pub fn loadgen(args: &[&str]) -> Run {
    let dir = scratch();
    let out_path = dir.path().join("loadgen.out");
    let err_path = dir.path().join("loadgen.err");
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
    let tail: Vec<&str> = stderr.lines().rev().take(STDERR_TAIL_LINES).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Run {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr_tail: tail.join("\n"),
    }
}

pub fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("json written");
    serde_json::from_str(&text).expect("valid json")
}

/// A shell script that SIGKILLs the broker whose pid is in `dir/pid` and starts it again
/// on the same port and data dir; the test's guard kills the last one.
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

/// A broker on `dir` that `fault_cmd` (weir-loadgen's `--fault-cmd`) SIGKILLs and
/// restarts; whichever one runs last is killed on drop.
struct Restartable {
    /// The first broker (SIGKILLed by the first fault: reap it with `kill`).
    first: Broker,
    fault_cmd: String,
    _guard: PidGuard,
}

fn start_restartable(dir: &Path) -> Restartable {
    let first = start(dir);
    let port = first.addr.rsplit(':').next().unwrap().to_string();
    let pidfile = dir.join("pid");
    std::fs::write(&pidfile, first.pid().to_string()).unwrap();
    let guard = PidGuard(pidfile);
    let script = restart_script(dir, &port);
    Restartable {
        first,
        fault_cmd: script.display().to_string(),
        _guard: guard,
    }
}

/// `weir-loadgen verify` of 8 s at 3,000 records/s to 2 partitions of `topic`, with
/// `extra` arguments, while the broker is SIGKILLed and restarted every 2.5 s (delivery
/// timeout 60 s): the run, which must succeed, and its JSON report.
pub fn verify_across_sigkill(topic: &str, extra: &[&str]) -> (Run, Value) {
    let dir = scratch();
    let mut broker = start_restartable(dir.path());
    let vj = dir.path().join("v.json");
    let addr = broker.first.addr.clone();
    let mut args = vec![
        "verify",
        "--bootstrap",
        &addr,
        "--topic",
        topic,
        "--partitions",
        "2",
        "--rate",
        "3000",
        "--duration",
        "8s",
        "--delivery-timeout-ms",
        "60000",
        "--fault-every",
        "2500ms",
        "--quiet",
    ];
    let cmd = broker.fault_cmd.clone();
    args.extend(["--fault-cmd", &cmd, "--json", vj.to_str().unwrap()]);
    args.extend(extra);
    let out = loadgen(&args);
    // The first broker was SIGKILLed by the script; reap it.
    let _ = broker.first.kill();
    assert_eq!(out.code, 0, "{out}");
    let v = json(&vj);
    (out, v)
}
