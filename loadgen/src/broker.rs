//! Starting a local `weir` process (for `quickstart` and the tests), and finding its binary.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

/// How long a broker may take to print `weir ready`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The `weir` binary next to this executable (cargo puts both in the same target dir;
/// test binaries live one level down, in `deps/`).
pub fn find_weir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf);
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join("weir");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent().map(Path::to_path_buf);
    }
    bail!(
        "no `weir` binary next to {} (build it with `cargo build -p weir`)",
        exe.display()
    )
}

/// A running single-node broker. It gets SIGTERM if the thread that started it dies
/// (PR_SET_PDEATHSIG): keep it on a thread that outlives it.
pub struct Broker {
    pub addr: String,
    child: Child,
}

impl Broker {
    /// Starts `weir serve` on an ephemeral 127.0.0.1 port and waits for `weir ready`.
    pub fn start(weir: &Path, data_dir: &Path, shards: usize, extra: &[String]) -> Result<Self> {
        Self::start_on(weir, data_dir, "127.0.0.1:0", shards, extra)
    }

    /// Starts `weir serve` listening on `listen` (`host:port`) and waits for `weir ready`.
    pub fn start_on(
        weir: &Path,
        data_dir: &Path,
        listen: &str,
        shards: usize,
        extra: &[String],
    ) -> Result<Self> {
        let mut cmd = Command::new(weir);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg(listen)
            .arg("--shards")
            .arg(shards.to_string())
            // Unpinned: it shares the host with the load generator (and, in tests, with
            // other brokers), and pinned shard s would sit on CPU s beside them. First, so
            // a `--set` in `extra` wins.
            .arg("--set")
            .arg("weir.shard.cpus=none");
        for kv in extra {
            cmd.arg("--set").arg(kv);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        exit_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", weir.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        match wait_ready(stdout) {
            Ok(addr) => Ok(Self { addr, child }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// SIGKILLs the broker (a crash, not a shutdown) and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        let _ = self.child.kill();
        self.child.wait()?;
        Ok(())
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes the child get SIGTERM when the thread that starts it (ours) dies, so a broker
/// never outlives a loadgen that was killed before it could stop it.
fn exit_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls only prctl,
    // getppid and raise, which are async-signal-safe.
    let parent = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::raise(libc::SIGTERM);
            }
            Ok(())
        });
    }
}

/// Reads the broker's stdout until the ready line; returns `host:port` from
/// `listening on 127.0.0.1:PORT`. Keeps draining stdout afterwards so the broker never
/// blocks on a full pipe.
fn wait_ready(stdout: std::process::ChildStdout) -> Result<String> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !sent && line.contains("weir ready") {
                sent = true;
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(READY_TIMEOUT)
        .map_err(|_| anyhow!("broker did not print `weir ready` within {READY_TIMEOUT:?}"))?;
    parse_listen(&line).ok_or_else(|| anyhow!("no `listening on ADDR` in {line:?}"))
}

fn parse_listen(line: &str) -> Option<String> {
    let rest = line.split("listening on ").nth(1)?;
    let addr: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ',' && *c != ')')
        .collect();
    (!addr.is_empty()).then_some(addr)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_ready_line() {
        let l = "2026 INFO weir ready, listening on 127.0.0.1:40123 (2 shards)";
        assert_eq!(super::parse_listen(l).as_deref(), Some("127.0.0.1:40123"));
        assert_eq!(super::parse_listen("weir ready"), None);
    }
}
