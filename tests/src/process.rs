//! Running a short-lived child process (a client script, a `weir` command) with a time
//! limit, reading its stdout and stderr as it runs so a chatty child never blocks on a
//! full pipe.

use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How often the exit status is polled.
const POLL: Duration = Duration::from_millis(20);

/// What a bounded child process did: its exit status and everything it printed.
#[derive(Debug)]
pub struct Bounded {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Bounded {
    /// Whether it exited with status 0.
    pub fn ok(&self) -> bool {
        self.status.success()
    }

    /// Stdout then stderr, for a failure's message.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `cmd` with stdin closed; kills it and fails (with what it printed) if it has not
/// exited within `timeout`.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<Bounded> {
    run_bounded_input(cmd, None, timeout)
}

/// [`run_bounded`] with `input` written to the child's stdin (then closed).
pub fn run_bounded_input(
    cmd: &mut Command,
    input: Option<&str>,
    timeout: Duration,
) -> Result<Bounded> {
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let program = cmd.get_program().to_string_lossy().into_owned();
    // Its own process group: on the deadline the whole group is killed, so a descendant
    // holding the pipes (a shell's child) cannot keep the readers below waiting.
    std::os::unix::process::CommandExt::process_group(cmd, 0);
    let mut child = cmd.spawn().with_context(|| format!("spawn {program}"))?;
    // In a thread too: a child that prints before it reads cannot block the writer.
    let writer = match (input, child.stdin.take()) {
        (Some(text), Some(mut stdin)) => {
            let text = text.to_owned();
            Some(thread::spawn(move || {
                let _ = stdin.write_all(text.as_bytes());
            }))
        }
        _ => None,
    };
    let out_t = drain(child.stdout.take());
    let err_t = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill(2) on the child's process group, which it leads.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(POLL);
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    if let Some(w) = writer {
        let _ = w.join();
    }
    let Some(status) = status else {
        bail!("{program} did not finish within {timeout:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    };
    Ok(Bounded {
        status,
        stdout,
        stderr,
    })
}

/// Reads `stream` to its end in a thread (lossy UTF-8).
fn drain(stream: Option<impl Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut s) = stream {
            let _ = s.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_past_its_limit_is_killed_and_reported() {
        let t0 = Instant::now();
        let err = run_bounded(
            Command::new("sh").args(["-c", "echo started; exec sleep 30"]),
            Duration::from_millis(500),
        )
        .expect_err("timed out");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert!(err.to_string().contains("started"), "{err}");
    }

    /// A descendant that holds the pipes (no `exec`) is killed with the child: the
    /// readers end and the call fails at its limit instead of waiting for the descendant.
    #[test]
    fn a_descendant_holding_the_pipes_is_killed_too() {
        let t0 = Instant::now();
        let err = run_bounded(
            Command::new("sh").args(["-c", "echo started; sleep 30; echo never"]),
            Duration::from_millis(500),
        )
        .expect_err("timed out");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert!(err.to_string().contains("started"), "{err}");
    }

    #[test]
    fn output_past_a_pipe_buffer_does_not_block_the_child() {
        // 1 MiB on each stream, far past the 64 KiB a pipe holds.
        let out = run_bounded(
            Command::new("sh").args([
                "-c",
                "head -c 1048576 /dev/zero | tr '\\0' a; head -c 1048576 /dev/zero | tr '\\0' b >&2",
            ]),
            Duration::from_secs(30),
        )
        .expect("finishes");
        assert!(out.ok());
        assert_eq!((out.stdout.len(), out.stderr.len()), (1 << 20, 1 << 20));
    }

    #[test]
    fn input_reaches_the_child() {
        let out = run_bounded_input(
            &mut Command::new("cat"),
            Some("hello"),
            Duration::from_secs(30),
        )
        .expect("finishes");
        assert_eq!(out.stdout, "hello");
    }
}
