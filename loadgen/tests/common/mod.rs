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
/// on the same port and data dir; the test's guard kills the last one. Once the guard has
/// made `dir/stop` it starts no broker, or kills the one it just started (a script still
/// running when the test ends: see [`PidGuard`]).
fn restart_script(dir: &Path, port: u16) -> PathBuf {
    let script = dir.join("restart.sh");
    let body = format!(
        "#!/bin/sh\nP=$(cat {d}/pid); kill -9 \"$P\" 2>/dev/null\n\
         for i in $(seq 1 200); do [ -e /proc/$P ] && ! grep -qs zombie /proc/$P/status || break; sleep 0.05; done\n\
         sleep 0.2\n\
         [ -e {d}/stop ] && exit 0\n\
         {w} serve --data-dir {d}/data --listen 127.0.0.1:{port} --shards 1 --set weir.shard.cpus=none >> {d}/restarts.log 2>&1 &\n\
         echo $! > {d}/pid.new && mv {d}/pid.new {d}/pid\n\
         [ -e {d}/stop ] && kill -9 $!\n\
         exit 0\n",
        d = dir.display(),
        w = weir().display(),
    );
    std::fs::write(&script, body).expect("script");
    let mut perms = std::fs::metadata(&script).expect("script").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).expect("chmod script");
    script
}

/// A port for a broker that must come back on the same one after a restart: below the
/// ephemeral range, so no connection of a parallel test takes it between the SIGKILL and
/// the rebind; starts at a per-process offset so two test processes differ.
fn free_port() -> u16 {
    use std::sync::Mutex;
    static CURSOR: Mutex<Option<u16>> = Mutex::new(None);
    const LOWEST: u16 = 10_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768u16);
    let ceiling = ephemeral.max(LOWEST + 1_000);
    let span = ceiling - LOWEST;
    let mut cursor = CURSOR.lock().unwrap_or_else(|e| e.into_inner());
    let mut next = cursor.unwrap_or_else(|| {
        LOWEST + (std::process::id().wrapping_mul(7_919) % u32::from(span)) as u16
    });
    for _ in 0..span {
        let port = next;
        next = if next + 1 >= ceiling {
            LOWEST
        } else {
            next + 1
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            *cursor = Some(next);
            return port;
        }
    }
    panic!("no free port below {ceiling}");
}

/// How long the guard waits for a SIGKILLed broker to be gone.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Kills whatever broker the pid file names when the test ends (pass or fail). It makes
/// the stop file first, so a restart script still running starts no broker after it, or
/// kills its own (the script writes the pid file, then checks the stop file).
struct PidGuard {
    pidfile: PathBuf,
    stopfile: PathBuf,
}

impl Drop for PidGuard {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(&self.stopfile, b"") {
            eprintln!("could not make {}: {e}", self.stopfile.display());
        }
        let Some(pid) = std::fs::read_to_string(&self.pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<libc::pid_t>().ok())
        else {
            return;
        };
        // SAFETY: kill(2) has no memory preconditions; the pid is the broker the script
        // started (not our child, so not reaped by us: its pid stays taken until it is gone).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + KILL_WAIT;
        while Instant::now() < deadline && alive(pid) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(pid) && !std::thread::panicking() {
            panic!("broker {pid} still running {KILL_WAIT:?} after SIGKILL");
        }
    }
}

/// Whether `pid` is a process that has not exited (a zombie has).
fn alive(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
        .unwrap_or(false)
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
    let port = free_port();
    let first = Broker::start_on(
        &weir(),
        &dir.join("data"),
        &format!("127.0.0.1:{port}"),
        1,
        &[],
    )
    .expect("weir starts");
    let pidfile = dir.join("pid");
    std::fs::write(&pidfile, first.pid().to_string()).expect("pid file");
    let guard = PidGuard {
        pidfile,
        stopfile: dir.join("stop"),
    };
    let script = restart_script(dir, port);
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
