//! Shared helpers for the broker tests: a real `weir serve` process on an ephemeral port
//! with its data dir on the real disk, and a blocking raw Kafka client that speaks through
//! `wire` + kafka-protocol so tests can send exact requests and read exact answers.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::RequestHeader;
use kafka_protocol::protocol::{Decodable, Encodable};
use wire::batch::{BatchBuilder, NewRecord};

pub mod requests;

/// How long a test waits for the broker to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Socket read timeout for the raw client.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A `weir serve` child process.
pub struct Broker {
    pub data_dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
    pub log: Arc<Mutex<Vec<String>>>,
    args: Vec<String>,
    /// RLIMIT_NOFILE (soft and hard) the process starts with, if set.
    nofile: Option<u64>,
}

/// Where test data dirs live: under the target dir (the real disk, never tmpfs).
pub fn test_root() -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("broker-tests");
    std::fs::create_dir_all(&root).expect("create test root");
    root
}

impl Broker {
    /// Starts a broker with `--shards shards` and `--set` pairs.
    pub fn start(shards: usize, sets: &[(&str, &str)]) -> Broker {
        Broker::start_limited(None, shards, sets)
    }

    fn start_limited(nofile: Option<u64>, shards: usize, sets: &[(&str, &str)]) -> Broker {
        let data_dir = tempfile::tempdir_in(test_root()).expect("tempdir");
        // Unpinned: by default shard s is pinned to CPU s, so every single-shard broker of
        // tests running in parallel would share CPU 0. First, so a test's own `--set` wins.
        let mut args = vec![
            "--shards".to_string(),
            shards.to_string(),
            "--set".into(),
            "weir.shard.cpus=none".into(),
        ];
        for (k, v) in sets {
            args.push("--set".into());
            args.push(format!("{k}={v}"));
        }
        let mut b = Broker {
            data_dir,
            port: 0,
            child: None,
            log: Arc::default(),
            args,
            nofile,
        };
        b.spawn();
        b
    }

    fn spawn(&mut self) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
        if let Some(limit) = self.nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: only setrlimit (async-signal-safe) runs between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command
            .arg("serve")
            .arg("--data-dir")
            .arg(self.data_dir.path())
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(&self.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn weir");
        let (tx, rx) = std::sync::mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let (log, tx) = (self.log.clone(), tx.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Some(rest) = line
                        .split("listening on ")
                        .nth(1)
                        .filter(|_| line.contains("weir ready"))
                    {
                        let _ = tx.send(rest.trim().to_string());
                    }
                    log.lock().expect("log").push(line);
                }
            });
        }
        let port = rx
            .recv_timeout(READY_TIMEOUT)
            .ok()
            .and_then(|addr| addr.rsplit(':').next().and_then(|p| p.parse().ok()));
        let Some(port) = port else {
            // The child is a local here: without this it would outlive the test.
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "weir not ready within {READY_TIMEOUT:?}: {:?}",
                self.log.lock().map(|l| l.clone())
            );
        };
        self.port = port;
        self.child = Some(child);
    }

    /// Starts a broker whose RLIMIT_NOFILE (soft and hard, so it cannot raise it) is
    /// `nofile`; restarts keep it.
    pub fn start_with_nofile(nofile: u64, shards: usize, sets: &[(&str, &str)]) -> Broker {
        Broker::start_limited(Some(nofile), shards, sets)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The broker's process id (for `/proc/PID/status`).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// CPU seconds (user + system) this broker has used so far, from `/proc/PID/stat`
    /// (its own, not another test's broker running beside it).
    pub fn cpu_secs(&self) -> f64 {
        let path = format!("/proc/{}/stat", self.pid());
        let stat = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        // Fields after the ")" that closes the command name: utime is the 12th, stime the
        // 13th.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = [11, 12]
            .iter()
            .map(|&i| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("no CPU time (field {i}) in {path}: {stat}"))
            })
            .sum();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        ticks as f64 / hz
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.addr())
    }

    /// Sends SIGTERM and waits (bounded) for a clean exit; returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: signalling our own unreaped child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() >= deadline {
                // Taken out of self above, so Drop cannot kill it: a hung broker would
                // outlive the test.
                let threads = thread_states(child.id());
                let _ = child.kill();
                let _ = child.wait();
                panic!("weir did not stop within 30 s of SIGTERM; its threads:\n{threads}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then start again on the same data dir.
    pub fn restart(&mut self) {
        assert!(self.terminate().success());
        self.spawn();
    }

    /// SIGKILL (no clean shutdown), then start again on the same data dir.
    pub fn kill_and_restart(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL weir");
        child.wait().expect("reap weir");
        self.spawn();
    }

    /// SIGTERM, then start again on the same data dir with more `--set` pairs (a later
    /// `--set` of a key wins over an earlier one).
    pub fn restart_with(&mut self, sets: &[(&str, &str)]) {
        for (k, v) in sets {
            self.args.push("--set".into());
            self.args.push(format!("{k}={v}"));
        }
        self.restart();
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log
            .lock()
            .expect("log")
            .iter()
            .any(|l| l.contains(needle))
    }

    /// The last `lines` lines the broker printed, and what the kernel says each of its
    /// threads is doing (state and wait channel): for a failure message about a stuck
    /// broker.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log.lock().map(|l| l.clone()).unwrap_or_default();
        let tail = log[log.len().saturating_sub(lines)..].join("\n");
        format!("{tail}\n--- threads:\n{}", thread_states(self.pid()))
    }

    /// Waits up to `timeout` for a log line containing `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log_contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

/// What the kernel says each thread of `pid` is doing (state and wait channel), one a line.
fn thread_states(pid: u32) -> String {
    let tasks = format!("/proc/{pid}/task");
    let threads: Vec<String> = std::fs::read_dir(&tasks)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| {
            let dir = e.path();
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let state = read("status")
                .lines()
                .filter(|l| l.starts_with("Name:") || l.starts_with("State:"))
                .collect::<Vec<_>>()
                .join(" ");
            format!(
                "{state} wchan={} syscall={}",
                read("wchan"),
                read("syscall").trim()
            )
        })
        .collect();
    threads.join("\n")
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A blocking raw Kafka client on one connection.
pub struct Client {
    pub stream: TcpStream,
    next_correlation: i32,
}

impl Client {
    pub fn connect(addr: &str) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        Client::from_stream(stream)
    }

    /// A client on a stream connected some other way (e.g. from a chosen source address).
    pub fn from_stream(stream: TcpStream) -> Client {
        Client {
            stream,
            next_correlation: 1,
        }
    }

    /// Sends a request without reading the answer; returns its correlation id.
    pub fn send<R: Encodable>(&mut self, api_key: i16, version: i16, req: &R) -> i32 {
        let correlation = self.next_correlation;
        self.next_correlation += 1;
        let header = wire::frame::RequestHeader {
            api_key,
            api_version: version,
            correlation_id: correlation,
            client_id: Some(Bytes::from_static(b"broker-test")),
        };
        let frame = wire::messages::encode_request(&header, req).expect("encode");
        self.stream.write_all(&frame).expect("write");
        correlation
    }

    /// Reads one response frame (without its size prefix); `None` if the broker closed.
    pub fn read_frame(&mut self) -> Option<Bytes> {
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).ok()?;
        let mut buf = vec![0u8; i32::from_be_bytes(size) as usize];
        self.stream.read_exact(&mut buf).ok()?;
        Some(Bytes::from(buf))
    }

    /// Reads and decodes one response; returns (correlation id, response).
    pub fn recv<P: Decodable>(&mut self, api_key: i16, version: i16) -> (i32, P) {
        let frame = self.read_frame().expect("broker closed the connection");
        wire::messages::decode_response_as(api_key, version, &frame).expect("decode response")
    }

    /// Request, then its response (checks the correlation id).
    pub fn call<R: Encodable, P: Decodable>(&mut self, api_key: i16, version: i16, req: &R) -> P {
        let sent = self.send(api_key, version, req);
        let (got, resp) = self.recv(api_key, version);
        assert_eq!(got, sent, "responses must come in request order");
        resp
    }

    /// True if the broker has closed this connection (read returns EOF or reset) within
    /// the read timeout. A timeout is not a close: a broker that ignores the connection
    /// must not pass for one that closed it.
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        // Bounded: only EINTR repeats, and a signal storm is not expected in a test.
        for _ in 0..100 {
            return match self.stream.read(&mut b) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    false
                }
                Err(_) => true,
            };
        }
        false
    }
}

/// An uncompressed batch of `values` with create-time timestamps `ts`.
pub fn batch(values: &[&[u8]], ts: i64) -> Bytes {
    let b = BatchBuilder {
        records: values
            .iter()
            .map(|v| NewRecord::value(ts, Bytes::copy_from_slice(v)))
            .collect(),
        ..Default::default()
    };
    b.build().expect("build batch")
}

/// Raw frame bytes: a size prefix and `body` (for hand-made bad input).
pub fn raw_frame(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// BytesMut helper for request bodies written by hand.
pub fn body_of<R: Encodable>(req: &R, version: i16) -> BytesMut {
    let mut b = BytesMut::new();
    req.encode(&mut b, version).expect("encode body");
    b
}

/// Unused-import guard for kafka-protocol's header type (kept for tests that need it).
pub type KafkaRequestHeader = RequestHeader;

/// A GET of `path` on the Prometheus endpoint at `addr`: the whole HTTP answer.
pub fn scrape_metrics(addr: &str, path: &str) -> String {
    let mut c = TcpStream::connect(addr).expect("connect to the metrics port");
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let mut out = String::new();
    c.read_to_string(&mut out).expect("read the answer");
    out
}

/// The value of the series named exactly `series` (name and labels).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}
