//! The bridge between the glommio shards and the controller thread (tokio): bounded flume
//! channels, which either runtime can wait on. A glommio task woken from another thread is
//! woken late unless its task queue is latency-sensitive, so every wait on the controller
//! (a proposal's reply, the image-change notices) runs in a `Latency::Matters` queue;
//! `wake_latency` measures both kinds (see docs/PERFORMANCE.md).

use std::cell::OnceCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use glommio::{Latency, Shares, TaskQueueHandle};

use super::quorum::{Handle, Request};
use super::{Command, Outcome};
use crate::errors;
use crate::shard::Shard;

/// The latency a woken controller wait asks glommio for.
const WAKE_LATENCY_MS: u64 = 1;

/// The image changed (a committed command was applied); `sent` measures the wake.
pub struct Notice {
    pub sent: Instant,
}

thread_local! {
    static QUEUE: OnceCell<TaskQueueHandle> = const { OnceCell::new() };
}

/// This shard's latency-sensitive task queue for controller waits.
fn queue() -> TaskQueueHandle {
    QUEUE.with(|q| {
        *q.get_or_init(|| {
            glommio::executor().create_task_queue(
                Shares::default(),
                Latency::Matters(Duration::from_millis(WAKE_LATENCY_MS)),
                "controller",
            )
        })
    })
}

/// Largest metadata command, as the log stores it (JSON), that is proposed: a log entry
/// must fit a quorum frame (`net::FRAME_MAX_BYTES`, 64 MiB) with room to spare; an entry
/// that did not could never be replicated, and nothing after it would commit. (KRaft
/// bounds its record batches at 8 MiB too.)
pub const COMMAND_BYTES_MAX: usize = 8 << 20;

/// What one part of a change split over several commands may take (a quarter of
/// [`COMMAND_BYTES_MAX`]: room for the command around it, and each apply stays short).
pub const SPLIT_COMMAND_BYTES: usize = COMMAND_BYTES_MAX / 4;

/// `items` in order, cut into runs of at most `limit` bytes as JSON (an item larger
/// than `limit` alone in its run; the command bound refuses it if it is too large).
pub fn by_size<T: serde::Serialize>(items: Vec<T>, limit: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut bytes: usize = 0;
    for item in items {
        let size = encoded_len(&item);
        match out.last_mut() {
            Some(run) if bytes.saturating_add(size) <= limit => run.push(item),
            _ => {
                out.push(vec![item]);
                bytes = 0;
            }
        }
        bytes = bytes.saturating_add(size);
    }
    out
}

/// Bytes `cmd` (a command or a part of one) takes as JSON, counted without building it
/// (`usize::MAX` if it cannot be encoded).
pub fn encoded_len(cmd: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    match serde_json::to_writer(&mut n, cmd) {
        Ok(()) => n.0,
        Err(_) => usize::MAX,
    }
}

/// INVALID_REQUEST for a command larger than [`COMMAND_BYTES_MAX`].
fn check_size(cmd: &Command) -> Result<(), super::TopicError> {
    let size = encoded_len(cmd);
    if size > COMMAND_BYTES_MAX {
        let why = format!(
            "a metadata change of {size} bytes is larger than {COMMAND_BYTES_MAX}: split the \
             request"
        );
        return Err((errors::INVALID_REQUEST, why));
    }
    Ok(())
}

/// Sends `cmd` to the controller thread and waits for its outcome.
pub async fn propose(q: &Arc<Handle>, cmd: Command) -> Outcome {
    if let Err(e) = check_size(&cmd) {
        return Outcome::failed(&cmd, e);
    }
    let (tx, rx) = flume::bounded(1);
    let failed = |cmd: &Command, why: &str| {
        Outcome::failed(cmd, (errors::REQUEST_TIMED_OUT, why.to_string()))
    };
    let request = Request::Propose {
        cmd: cmd.clone(),
        reply: tx,
    };
    if q.requests.send_async(request).await.is_err() {
        return failed(&cmd, "the controller thread stopped");
    }
    let wait = glommio::spawn_local_into(async move { rx.recv_async().await }, queue());
    match wait {
        Ok(task) => match task.await {
            Ok(out) => out,
            Err(_) => failed(&cmd, "the controller dropped the request"),
        },
        Err(_) => failed(&cmd, "cannot wait for the controller"),
    }
}

/// Cross-runtime wakes seen by this process's shards (for the log line and the docs).
pub static WAKES: AtomicU64 = AtomicU64::new(0);
pub static WAKE_MICROS_TOTAL: AtomicU64 = AtomicU64::new(0);
pub static WAKE_MICROS_MAX: AtomicU64 = AtomicU64::new(0);

/// Runs on each shard of a cluster node: on every image change, syncs the shard's open
/// partitions with it (deleted topics closed and removed).
pub fn spawn_notices(shard: Rc<Shard>, q: &Arc<Handle>) {
    let rx = q.subscribe();
    let task = glommio::spawn_local_into(
        async move {
            while let Ok(n) = rx.recv_async().await {
                let us = u64::try_from(n.sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                WAKES.fetch_add(1, Ordering::Relaxed);
                WAKE_MICROS_TOTAL.fetch_add(us, Ordering::Relaxed);
                WAKE_MICROS_MAX.fetch_max(us, Ordering::Relaxed);
                tracing::debug!(shard = %shard.id, wake_us = us, "controller notice");
                shard.sync_partitions().await;
            }
        },
        queue(),
    );
    match task {
        Ok(t) => {
            t.detach();
        }
        Err(e) => tracing::error!("cannot start the controller notices: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean and max wake latency of a glommio task in a queue of `latency`, woken by a
    /// foreign thread's flume send, over `rounds` sends `gap` apart.
    fn measure(latency: Latency, rounds: u32, gap: Duration) -> (Duration, Duration) {
        let (tx, rx) = flume::bounded::<Instant>(1);
        let sender = std::thread::spawn(move || {
            for _ in 0..rounds {
                std::thread::sleep(gap);
                if tx.send(Instant::now()).is_err() {
                    return;
                }
            }
        });
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(move || async move {
                // A shard always has timers pending (its signal watcher polls every 50 ms,
                // housekeeping, idle connections): the same here.
                let ticking = glommio::spawn_local(async {
                    loop {
                        glommio::timer::sleep(Duration::from_millis(50)).await;
                    }
                });
                let tq = glommio::executor().create_task_queue(Shares::default(), latency, "t");
                let task = glommio::spawn_local_into(
                    async move {
                        let mut total = Duration::ZERO;
                        let mut max = Duration::ZERO;
                        let mut n = 0u32;
                        while let Ok(sent) = rx.recv_async().await {
                            let d = sent.elapsed();
                            total += d;
                            max = max.max(d);
                            n += 1;
                        }
                        (total / n.max(1), max)
                    },
                    tq,
                )
                .expect("task queue");
                let out = task.await;
                drop(ticking);
                out
            })
            .expect("executor");
        let out = ex.join().expect("join");
        sender.join().expect("sender");
        out
    }

    /// Measures the cross-runtime wake latency (numbers in docs/PERFORMANCE.md):
    /// `cargo test -p weir --lib controller::bridge -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn wake_latency() {
        let gap = Duration::from_millis(20);
        let (mean, max) = measure(Latency::Matters(Duration::from_millis(1)), 200, gap);
        println!("Latency::Matters(1ms): mean {mean:?}, max {max:?}");
        let (mean_ni, max_ni) = measure(Latency::NotImportant, 200, gap);
        println!("Latency::NotImportant: mean {mean_ni:?}, max {max_ni:?}");
        assert!(mean < Duration::from_millis(50), "Matters mean {mean:?}");
    }

    fn create(topics: usize) -> Command {
        let topics = (0..topics)
            .map(|i| crate::controller::NewTopic {
                meta: crate::metadata::TopicMeta {
                    name: format!("{i:0>249}"),
                    id: 1,
                    partitions: 1,
                    configs: Default::default(),
                    assignment: Vec::new(),
                },
                internal: false,
                replication_factor: 3,
                assignments: Vec::new(),
            })
            .collect();
        Command::CreateTopics {
            topics,
            max_partitions: u64::MAX,
        }
    }

    /// A command that would not fit a quorum frame is refused before it is proposed;
    /// the size is that of the JSON the log stores.
    #[test]
    fn a_command_over_the_bound_is_refused_before_it_is_proposed() {
        let small = create(10);
        assert!(check_size(&small).is_ok());
        let stored = serde_json::to_vec(&small).map(|v| v.len()).unwrap_or(0);
        assert_eq!(encoded_len(&small), stored);
        let big = create(40_000);
        assert!(encoded_len(&big) > COMMAND_BYTES_MAX);
        assert_eq!(
            check_size(&big).map_err(|e| e.0),
            Err(errors::INVALID_REQUEST)
        );
    }
}
