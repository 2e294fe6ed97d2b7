//! A real `weir serve` process under test: started on 127.0.0.1:0 in a temporary data dir
//! on the real disk, ready when it prints its ready line, stopped by SIGTERM or SIGKILL,
//! restartable on the same data dir. Dropping a [`Weir`] kills the process and removes
//! the data dir, so a failing test never leaves a broker behind.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

/// How long a broker may take from spawn to its ready line (recovery of a big data dir
/// included).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a SIGTERM'd broker may take to flush and exit.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How many log lines are kept per process for failure messages.
const LOG_LINES_MAX: usize = 5_000;

/// How to start a broker: shard count and Kafka-named config overrides (`--set k=v`).
#[derive(Clone, Debug, Default)]
pub struct WeirConfig {
    /// `--shards N`; `None` lets weir choose (one per core).
    pub shards: Option<usize>,
    /// `--set KEY=VALUE`, in order.
    pub sets: Vec<(String, String)>,
    /// Lines written to a `server.properties` passed with `--config`.
    pub properties: Vec<String>,
}

impl WeirConfig {
    /// A config with `--shards n`.
    pub fn shards(n: usize) -> WeirConfig {
        WeirConfig {
            shards: Some(n),
            ..WeirConfig::default()
        }
    }

    /// Adds `--set key=value`.
    pub fn set(mut self, key: &str, value: impl ToString) -> WeirConfig {
        self.sets.push((key.to_string(), value.to_string()));
        self
    }
}

/// One running (or stopped) weir process and its data dir.
pub struct Weir {
    config: WeirConfig,
    data_dir: tempfile::TempDir,
    running: Option<Running>,
    /// Log lines of earlier runs of this data dir (for failure messages).
    past_log: Vec<String>,
}

struct Running {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Weir {
    /// Starts a broker on a fresh data dir and waits (bounded) until it is ready.
    pub fn start(config: WeirConfig) -> Result<Weir> {
        let root = target_dir().join("e2e-data");
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        Weir::start_in(config, &root)
    }

    /// Starts a broker whose data dir is a fresh directory inside `parent` (a test's own
    /// filesystem, e.g. a small loop mount).
    pub fn start_in(config: WeirConfig, parent: &Path) -> Result<Weir> {
        let data_dir = tempfile::Builder::new()
            .prefix("weir-")
            .tempdir_in(parent)
            .with_context(|| format!("create data dir in {}", parent.display()))?;
        let mut weir = Weir {
            config,
            data_dir,
            running: None,
            past_log: Vec::new(),
        };
        weir.spawn()?;
        Ok(weir)
    }

    /// Starts a broker on a fresh data dir that is not expected to become ready (e.g. the
    /// controller refuses it): returns once a line of its output contains `needle`
    /// (bounded by [`READY_TIMEOUT`]). Its [`addr`](Self::addr) is the one it printed, or
    /// `0.0.0.0:0`.
    pub fn start_until(config: WeirConfig, needle: &str) -> Result<Weir> {
        let root = target_dir().join("e2e-data");
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        let data_dir = tempfile::Builder::new()
            .prefix("weir-")
            .tempdir_in(&root)
            .with_context(|| format!("create data dir in {}", root.display()))?;
        let mut weir = Weir {
            config,
            data_dir,
            running: None,
            past_log: Vec::new(),
        };
        weir.spawn_until(Some(needle))?;
        Ok(weir)
    }

    /// Starts with default config.
    pub fn start_default() -> Result<Weir> {
        Weir::start(WeirConfig::default())
    }

    /// The config used by the next [`restart`](Self::restart) (e.g. another shard count).
    pub fn config_mut(&mut self) -> &mut WeirConfig {
        &mut self.config
    }

    /// The data dir (it outlives restarts).
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// The address the running broker listens on.
    ///
    /// # Panics
    /// If the broker is not running (a test bug, not input).
    pub fn addr(&self) -> SocketAddr {
        match &self.running {
            Some(r) => r.addr,
            None => panic!("weir is not running"),
        }
    }

    /// `host:port` for a client's `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.addr().to_string()
    }

    /// The process id of the running broker.
    pub fn pid(&self) -> Option<u32> {
        self.running.as_ref().map(|r| r.child.id())
    }

    /// Whether the process is still alive (has not exited).
    pub fn is_alive(&mut self) -> bool {
        match &mut self.running {
            Some(r) => matches!(r.child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Resident set size of the broker, from /proc/PID/status `VmRSS`, in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        let pid = self.pid().ok_or_else(|| anyhow!("weir is not running"))?;
        rss_kib_of(pid)
    }

    /// Anonymous resident memory (`RssAnon`: heap, stacks, buffers — not the binary's own
    /// pages, which differ between builds), in KiB.
    pub fn rss_anon_kib(&self) -> Result<u64> {
        let pid = self.pid().ok_or_else(|| anyhow!("weir is not running"))?;
        proc_status_kib(pid, "RssAnon")
    }

    /// Peak virtual size of the broker so far (`VmPeak`), in KiB.
    pub fn vm_peak_kib(&self) -> Result<u64> {
        let pid = self.pid().ok_or_else(|| anyhow!("weir is not running"))?;
        proc_status_kib(pid, "VmPeak")
    }

    /// Everything the broker printed so far (this run and earlier runs on this data dir).
    pub fn log_text(&self) -> String {
        let mut lines = self.past_log.clone();
        if let Some(r) = &self.running {
            lines.extend(lock_log(&r.log).iter().cloned());
        }
        lines.join("\n")
    }

    /// The last `n` log lines, for assertion messages.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGTERM, then wait (bounded) for a clean exit; returns the exit status.
    pub fn terminate(&mut self) -> Result<ExitStatus> {
        self.signal_and_wait(libc::SIGTERM, STOP_TIMEOUT)
    }

    /// SIGKILL: a crash, no chance to flush. Returns once the process is gone.
    pub fn kill(&mut self) -> Result<ExitStatus> {
        self.signal_and_wait(libc::SIGKILL, STOP_TIMEOUT)
    }

    /// Starts the broker again on the same data dir (after [`terminate`](Self::terminate)
    /// or [`kill`](Self::kill)); it gets a new ephemeral port.
    pub fn restart(&mut self) -> Result<()> {
        if self.running.is_some() {
            bail!("restart while weir is still running: stop it first");
        }
        self.spawn()
    }

    fn signal_and_wait(&mut self, signal: libc::c_int, timeout: Duration) -> Result<ExitStatus> {
        let mut running = self
            .running
            .take()
            .ok_or_else(|| anyhow!("weir is not running"))?;
        let pid = libc::pid_t::try_from(running.child.id()).context("pid out of range")?;
        // SAFETY: kill(2) on our own child's pid; it has not been reaped yet (we hold the
        // Child and have not waited on it), so the pid cannot have been reused.
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
        }
        let status = wait_bounded(&mut running.child, timeout);
        self.past_log.extend(lock_log(&running.log).iter().cloned());
        match status {
            Some(s) => Ok(s),
            None => {
                let threads = thread_states(running.child.id());
                let _ = running.child.kill();
                let _ = running.child.wait();
                bail!(
                    "weir did not exit within {timeout:?} of signal {signal}; its threads: {threads}\nlog tail:\n{}",
                    self.log_tail(40)
                )
            }
        }
    }

    fn spawn(&mut self) -> Result<()> {
        self.spawn_until(None)
    }

    fn spawn_until(&mut self, needle: Option<&str>) -> Result<()> {
        let bin = weir_binary()?;
        let mut cmd = Command::new(&bin);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(self.data_dir.path())
            .arg("--listen")
            .arg("127.0.0.1:0");
        if let Some(n) = self.config.shards {
            cmd.arg("--shards").arg(n.to_string());
        }
        // Unpinned: by default shard s is pinned to CPU s, so the brokers of tests running
        // in parallel would all share CPU 0. First, so a test's own `--set` wins.
        cmd.arg("--set").arg("weir.shard.cpus=none");
        for (k, v) in &self.config.sets {
            cmd.arg("--set").arg(format!("{k}={v}"));
        }
        if !self.config.properties.is_empty() {
            let path = self.data_dir.path().join("server.properties");
            std::fs::write(&path, self.config.properties.join("\n") + "\n")?;
            cmd.arg("--config").arg(path);
        }
        cmd.env("NO_COLOR", "1")
            .env(
                "WEIR_LOG",
                std::env::var("WEIR_TEST_LOG").unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            pump_lines(out, Arc::clone(&log), tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            pump_lines(err, Arc::clone(&log), tx);
        }
        match wait_ready(&mut child, &rx, needle) {
            Ok(addr) => {
                self.running = Some(Running { child, addr, log });
                Ok(())
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let tail: Vec<String> = lock_log(&log).iter().rev().take(40).cloned().collect();
                let tail: Vec<String> = tail.into_iter().rev().collect();
                bail!(
                    "weir did not become ready: {e:#}\nlog tail:\n{}",
                    tail.join("\n")
                )
            }
        }
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        if let Some(mut r) = self.running.take() {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}

/// Waits for the ready line and parses the listening address from it; with `needle`,
/// for a line containing it instead.
fn wait_ready(
    child: &mut Child,
    rx: &Receiver<String>,
    needle: Option<&str>,
) -> Result<SocketAddr> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut addr: Option<SocketAddr> = None;
    let mut ready = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "no ready line within {READY_TIMEOUT:?}; threads: {}",
                thread_states(child.id())
            );
        }
        match rx.recv_timeout(left.min(Duration::from_millis(200))) {
            Ok(line) => {
                if let Some(a) = parse_listening(&line) {
                    addr = Some(a);
                }
                ready |= line.contains("weir ready");
                if let (true, Some(a)) = (ready, addr) {
                    return Ok(a);
                }
                if needle.is_some_and(|n| line.contains(n)) {
                    return Ok(addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))));
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => bail!("weir closed its output before ready"),
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!("weir exited before ready: {status}");
        }
    }
}

/// The address after "listening on " in a log line (ANSI colour codes removed).
pub fn parse_listening(line: &str) -> Option<SocketAddr> {
    let clean = strip_ansi(line);
    let rest = clean.split("listening on ").nth(1)?;
    let token: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']'))
        .collect();
    token.trim_end_matches([':', '.']).parse().ok()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip "ESC [ ... letter".
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Copies a child's output into the shared log and the ready channel, line by line.
fn pump_lines(
    stream: impl Read + Send + 'static,
    log: Arc<Mutex<Vec<String>>>,
    tx: mpsc::Sender<String>,
) {
    thread::spawn(move || {
        let echo = std::env::var_os("WEIR_TEST_ECHO").is_some();
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if echo {
                eprintln!("[weir] {line}");
            }
            {
                let mut l = lock_log(&log);
                if l.len() >= LOG_LINES_MAX {
                    l.remove(0);
                }
                l.push(line.clone());
            }
            // The receiver is gone once the broker is ready; keep draining the pipe anyway
            // so the broker never blocks on a full pipe.
            let _ = tx.send(line);
        }
    });
}

fn lock_log(log: &Mutex<Vec<String>>) -> std::sync::MutexGuard<'_, Vec<String>> {
    match log.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Err(_) => return None,
        }
    }
    None
}

/// "name:state" of each thread of a process (from /proc), for a hang's error message.
fn thread_states(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return "(process gone)".into();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let wchan = std::fs::read_to_string(t.path().join("wchan")).unwrap_or_default();
        // "tid (comm) S ...": the state follows the last ')'.
        let comm = stat
            .split('(')
            .nth(1)
            .and_then(|r| r.rsplit_once(')'))
            .map(|(c, _)| c);
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next());
        out.push(format!(
            "{}:{}:{}",
            comm.unwrap_or("?"),
            state.unwrap_or("?"),
            wchan.trim()
        ));
    }
    out.join(" ")
}

/// `VmRSS` of a process, in KiB.
pub fn rss_kib_of(pid: u32) -> Result<u64> {
    proc_status_kib(pid, "VmRSS")
}

/// A `/proc/PID/status` field in KiB: `VmRSS` (resident), `VmPeak` (largest virtual
/// size so far: catches a big allocation even if its pages were never touched).
pub fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
        .ok_or_else(|| anyhow!("no {field} in /proc/{pid}/status"))?;
    let kib = line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow!("bad {field} line {line:?}"))?;
    Ok(kib.parse()?)
}

/// The Python that has the interop clients (confluent-kafka, kafka-python): the venv
/// `scripts/install-test-deps.sh` makes at `target/interop-venv`, or `WEIR_TEST_PYTHON`.
pub fn python() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("WEIR_TEST_PYTHON") {
        return Ok(PathBuf::from(p));
    }
    let p = target_dir().join("interop-venv/bin/python");
    if !p.exists() {
        bail!(
            "{} is missing: run scripts/install-test-deps.sh (or set WEIR_TEST_PYTHON)",
            p.display()
        );
    }
    Ok(p)
}

/// The cargo target dir: `CARGO_TARGET_DIR`, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        let dir = PathBuf::from(dir);
        if dir.is_absolute() {
            return dir;
        }
        return workspace_dir().join(dir);
    }
    workspace_dir().join("target")
}

fn workspace_dir() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// The `weir` binary: `WEIR_BIN` if set; else the one in the test binary's own profile dir
/// (`target/<profile>/weir`), built with cargo if it is missing.
pub fn weir_binary() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| find_or_build_weir().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

/// The `weir-loadgen` binary beside the test binary's profile dir (`target/<profile>/`):
/// `cargo build --workspace --bins` puts it there, as it does `weir`.
pub fn loadgen_binary() -> Result<PathBuf> {
    let bin = profile_dir()?.join("weir-loadgen");
    if !bin.is_file() {
        bail!(
            "the weir-loadgen binary is missing at {}; run `cargo build --workspace --bins` first",
            bin.display()
        );
    }
    Ok(bin)
}

fn find_or_build_weir() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("WEIR_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let profile_dir = profile_dir()?;
    let bin = profile_dir.join("weir");
    if bin.is_file() {
        return Ok(bin);
    }
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
    cmd.current_dir(workspace_dir())
        .args(["build", "-p", "weir", "--bin", "weir"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().context("run cargo to build the weir binary")?;
    if !status.success() || !bin.is_file() {
        bail!(
            "the weir binary is missing at {} and `cargo build -p weir --bin weir` failed ({status}); \
             run `cargo build --workspace --bins` first or set WEIR_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

/// `target/<profile>`: the test executable lives in `target/<profile>/deps/`.
fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let deps = exe
        .parent()
        .ok_or_else(|| anyhow!("test exe has no parent dir"))?;
    if deps.file_name().is_some_and(|n| n == "deps")
        && let Some(p) = deps.parent()
    {
        return Ok(p.to_path_buf());
    }
    Ok(target_dir().join("debug"))
}

/// Bytes each shard thread and each io_uring worker of a shard has written to storage so
/// far, keyed by thread id, with the shard it belongs to: `/proc/PID/task/TID/io`
/// `write_bytes` of the shard's threads (named `weir-shard-N...`) and of the io_uring
/// workers they own (named `iou-wrk-TID`, TID a shard thread). Keyed by thread because
/// workers come and go: a worker that exited takes its count with it, so compare two
/// snapshots thread by thread (see [`shard_write_deltas`]), not as sums.
pub fn shard_write_bytes(pid: u32) -> Result<std::collections::BTreeMap<String, (usize, u64)>> {
    let mut shard_of_tid = std::collections::BTreeMap::new();
    let mut tasks = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = entry?.path();
        let Some(tid) = dir.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            continue;
        };
        // A thread may exit between listing and reading: skip it.
        let (Ok(comm), Ok(io)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("io")),
        ) else {
            continue;
        };
        let comm = comm.trim().to_string();
        if let Some(shard) = comm.strip_prefix("weir-shard-").and_then(shard_number) {
            shard_of_tid.insert(tid.clone(), shard);
        }
        let written = io
            .lines()
            .find_map(|l| l.strip_prefix("write_bytes:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        tasks.push((tid, comm, written));
    }
    let mut out = std::collections::BTreeMap::new();
    for (tid, comm, written) in tasks {
        let owner_tid = comm.strip_prefix("iou-wrk-").unwrap_or(&tid);
        if let Some(&shard) = shard_of_tid.get(owner_tid) {
            out.insert(tid, (shard, written));
        }
    }
    Ok(out)
}

/// Per shard, what its threads wrote between two [`shard_write_bytes`] snapshots: each
/// thread alive in `after` counts from its `before` figure (0 if it started since), so
/// a worker that exited in between does not make a shard's count go backwards.
pub fn shard_write_deltas(
    before: &std::collections::BTreeMap<String, (usize, u64)>,
    after: &std::collections::BTreeMap<String, (usize, u64)>,
) -> std::collections::BTreeMap<usize, u64> {
    let mut out = std::collections::BTreeMap::new();
    for (tid, (shard, written)) in after {
        let was = before.get(tid).map_or(0, |(_, w)| *w);
        *out.entry(*shard).or_insert(0) += written.saturating_sub(was);
    }
    out
}

/// "3-4" or "3" -> 3: glommio appends its own id to the thread name.
fn shard_number(rest: &str) -> Option<usize> {
    rest.split('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ready_lines() {
        let a = parse_listening("2026 INFO weir ready, listening on 127.0.0.1:41234 shards=2");
        assert_eq!(
            a,
            Some("127.0.0.1:41234".parse().unwrap_or_else(|_| unreachable!()))
        );
        let colored = "\u{1b}[32mINFO\u{1b}[0m weir ready: listening on 127.0.0.1:9092.";
        assert_eq!(parse_listening(colored).map(|a| a.port()), Some(9092));
        assert_eq!(parse_listening("weir ready"), None);
    }
}
