//! Per-shard housekeeping: interval flushes and retention, for open partition logs and
//! for the unopened ones that hold sealed segments.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use glommio::{Latency, Shares};

use super::{Shard, TopicPartition, mono_ms, now_ms};
use crate::metadata::is_internal;
use crate::metrics::snapshot::{self, FollowerLag, GroupSnapshot, ShardSnapshot};
use crate::partition::{Partition, partition_dir};
use std::sync::Arc;

/// The log cleaner's CPU share beside the shard's request handling (glommio's default task
/// queue has 1,000): a shard saturated by producers gives the cleaner about 1/11 of its
/// time, an idle shard all of it. Kafka runs the cleaner on its own threads; weir's runs on
/// the shard that owns the logs, so without this a clean took the producers' time 1:1.
pub const CLEANER_SHARES: usize = 100;

impl Shard {
    /// Periodic per-shard housekeeping: retention and interval flushes.
    pub async fn run_housekeeping(self: Rc<Self>) {
        let interval_ms = self
            .config()
            .retention_check_interval_ms
            .clamp(100, 3_600_000);
        // The intervals run on the monotonic clock: a step of the system clock neither
        // runs every gate at once nor holds them back. `now` (the system clock) is what
        // records' timestamps are compared with.
        let mut last_retention = mono_ms();
        let cleaner = self.config().log_cleaner;
        let cleaner_budget = Rc::new(cleaner.shard_budget(self.config().shards));
        let mut last_clean: Option<i64> = None;
        // Cleaning runs as its own task in a low-share queue, one pass at a time; flushes,
        // retention and checkpoints do not wait for it.
        let cleaner_queue = glommio::executor().create_task_queue(
            Shares::Static(CLEANER_SHARES),
            Latency::NotImportant,
            "log-cleaner",
        );
        let cleaning = Rc::new(Cell::new(false));
        let mut clean_pass: Option<glommio::Task<()>> = None;
        while !self.shutting_down.get() {
            let tick = glommio::timer::sleep(Duration::from_millis(1000.min(interval_ms)));
            futures_lite::future::or(
                async {
                    tick.await;
                },
                self.shutdown.listen(),
            )
            .await;
            if self.shutting_down.get() {
                break;
            }
            let now = now_ms();
            let mono = mono_ms();
            let retention_due = mono - last_retention >= interval_ms as i64;
            let clean_due =
                cleaner.enable && last_clean.is_none_or(|t| mono - t >= cleaner.backoff_ms as i64);
            self.flush_and_retain(now, retention_due).await;
            if clean_due && !cleaning.get() {
                last_clean = Some(mono);
                let (shard, budget, done) =
                    (self.clone(), cleaner_budget.clone(), cleaning.clone());
                let pass = async move {
                    for tp in shard.open_keys() {
                        if shard.shutting_down.get() {
                            break;
                        }
                        // Held for its own clean only: a pass takes minutes, and a log
                        // held is one idle eviction cannot close.
                        let p = shard.partitions.borrow().get(&tp).cloned();
                        if let Some(p) = p {
                            clean_log(&p, now_ms(), &budget).await;
                        }
                    }
                    done.set(false);
                };
                match glommio::spawn_local_into(pass, cleaner_queue) {
                    Ok(task) => {
                        cleaning.set(true);
                        clean_pass = Some(task);
                    }
                    Err(e) => tracing::warn!("log cleaner: cannot start a pass: {e}"),
                }
            }
            if retention_due {
                self.retain_unopened(now).await;
                last_retention = mono;
            }
            crate::api::fetch_budget::trim_shard_heap_if_idle();
            self.publish_gauges();
            self.propose_isr_changes();
            self.propose_resignations();
            self.checkpoint_high_watermarks(self.partitions.borrow().values());
            self.write_hw_checkpoint(false).await;
        }
        // The logs close after housekeeping ends: a pass still cleaning finishes first.
        if let Some(pass) = clean_pass.take() {
            pass.await;
        }
    }

    /// Interval flushes, and retention if `retention_due`, of the open logs. Each log is
    /// held only while its own work runs: one held is one idle eviction cannot close.
    pub(super) async fn flush_and_retain(&self, now: i64, retention_due: bool) {
        for tp in self.open_keys() {
            let Some(p) = self.partitions.borrow().get(&tp).cloned() else {
                continue;
            };
            if let Err(e) = p.log.flush_if_due(now).await {
                tracing::warn!(topic = %p.topic, partition = p.index, "flush: {e}");
            }
            if retention_due {
                apply_retention(&p, now).await;
            }
        }
    }

    /// The partitions open now.
    fn open_keys(&self) -> Vec<TopicPartition> {
        self.partitions.borrow().keys().cloned().collect()
    }

    /// Retention for the partitions this shard owns that are not open (logs open on first
    /// use, and idle ones close past `max.open.partitions`): those holding a sealed segment
    /// on disk, or only an active segment with records last written longer ago than the
    /// topic's `retention.ms` (a partition that stopped receiving records: retention
    /// deletes its active segment too), are opened (the open budget closes idle ones
    /// again) and retained. Most idle partitions cost one directory listing and a stat,
    /// done off the shard's thread.
    async fn retain_unopened(&self, now: i64) {
        let candidates = self.unopened_partitions();
        if candidates.is_empty() {
            return;
        }
        let data_dir = self.config().data_dir.clone();
        let sealed = glommio::executor()
            .spawn_blocking(move || {
                candidates
                    .into_iter()
                    .filter(|(tp, retention_ms)| {
                        let dir = partition_dir(&data_dir, &tp.0, tp.1);
                        may_hold_expired(&dir, *retention_ms, now)
                    })
                    .map(|(tp, _)| tp)
                    .collect::<Vec<_>>()
            })
            .await;
        for tp in sealed {
            if self.shutting_down.get() {
                return;
            }
            if let Ok(p) = self.partition(&tp).await {
                apply_retention(&p, now).await;
            }
        }
    }

    /// Publishes this shard's gauges to its metrics registry (once per housekeeping tick).
    fn publish_gauges(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let m = self.metrics();
        m.partitions_open
            .store(self.partitions.borrow().len() as u64, Relaxed);
        let held = crate::api::fetch_budget::shard_held_bytes();
        m.fetch_response_bytes_held.store(held, Relaxed);
        m.connections_open
            .store(self.open_connections.get() as u64, Relaxed);
        let snapshot = self.compute_snapshot();
        // Never wait on a scrape reading the old one: the next tick publishes instead.
        if let Ok(mut s) = m.snapshot.try_lock() {
            *s = snapshot;
        }
    }

    /// The gauges computed from the shard's own state (see `metrics::snapshot`), bounded
    /// in series per shard.
    fn compute_snapshot(&self) -> ShardSnapshot {
        let mut snap = ShardSnapshot {
            tail_cache_bytes: crate::storage::shard_cached_bytes(),
            ..ShardSnapshot::default()
        };
        let now = now_ms();
        for (tp, p) in self.partitions.borrow().iter() {
            snap.open_files += p.log.open_files() as u64;
            let r = p.replica();
            if snap.high_watermarks.len() < snapshot::HIGH_WATERMARKS_MAX {
                snap.high_watermarks
                    .insert(tp.clone(), r.high_watermark().get());
            }
            if !r.is_leader() {
                continue;
            }
            let mut replicas = 1;
            for (node, f) in r.followers() {
                replicas += 1;
                snap.followers.push(FollowerLag {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    follower: node.0,
                    lag_records: (r.log_end().get() - f.log_end.get()).max(0) as u64,
                    since_caught_up_ms: now - f.caught_up_ms,
                });
            }
            if r.isr_len() < replicas {
                snap.under_replicated += 1;
            }
        }
        if snap.followers.len() > snapshot::FOLLOWERS_MAX {
            // Keep the laggiest: those are the ones an operator looks for.
            snap.followers
                .sort_by_key(|f| std::cmp::Reverse(f.lag_records));
            snap.omitted += (snap.followers.len() - snapshot::FOLLOWERS_MAX) as u64;
            snap.followers.truncate(snapshot::FOLLOWERS_MAX);
        }
        self.snapshot_groups(&mut snap);
        snap
    }

    /// Groups, their members and committed offsets, within the per-shard bounds.
    fn snapshot_groups(&self, snap: &mut ShardSnapshot) {
        let mut offsets_left = snapshot::GROUP_OFFSETS_MAX;
        self.groups.for_each_group(|g| {
            if snap.groups.len() >= snapshot::GROUPS_MAX {
                snap.omitted += 1;
                return;
            }
            let take = g.offsets.len().min(offsets_left);
            offsets_left -= take;
            snap.omitted += (g.offsets.len() - take) as u64;
            snap.groups.push(GroupSnapshot {
                id: g.id.clone(),
                state: g.state.name(),
                members: g.members.len(),
                offsets: g
                    .offsets
                    .iter()
                    .take(take)
                    .map(|((t, i), v)| (Arc::from(t.as_str()), *i, v.offset.get()))
                    .collect(),
            });
        });
    }

    /// Partitions of user topics this shard owns whose logs are not open now, each with
    /// its topic's `retention.ms` (-1 where time retention does not apply).
    fn unopened_partitions(&self) -> Vec<(TopicPartition, i64)> {
        let catalog = self.catalog();
        let open = self.partitions.borrow();
        let mut out = Vec::new();
        for (name, meta) in catalog.topics.iter().filter(|(n, _)| !is_internal(n)) {
            let topic: Arc<str> = Arc::from(name.as_str());
            let configs = self.topic_configs(&meta.configs);
            let retention_ms =
                crate::storage::LogConfig::from_pairs(configs.iter().map(|(k, v)| (&**k, &**v)))
                    .ok()
                    .filter(|c| c.cleanup_policy.delete)
                    .map_or(-1, |c| c.retention_ms);
            for index in 0..meta.partitions {
                let tp = (topic.clone(), index);
                if self.router.owner(name, index) == self.id && !open.contains_key(&tp) {
                    out.push((tp, retention_ms));
                }
            }
        }
        out
    }
}

/// Applies retention to one open log, logging what it did.
async fn apply_retention(p: &Partition, now: i64) {
    match p.log.apply_retention(now, p.high_watermark()).await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(topic = %p.topic, partition = p.index, "retention deleted {n} segments")
        }
        Err(e) => tracing::warn!(topic = %p.topic, partition = p.index, "retention: {e}"),
    }
}

/// Compacts a `cleanup.policy=compact` log if it is due (storage/cleaner.rs) — user
/// topics and the coordinators' `__consumer_offsets` and `__transaction_state` alike —
/// below the partition's last stable offset (never past the HW or into an undecided
/// transaction), with its aborted transactions obsoleting nothing.
async fn clean_log(p: &Partition, now: i64, budget: &crate::storage::CleanerBudget) {
    let clean_below = p.last_stable_offset();
    let aborted = p
        .producers
        .aborted_txns(p.log.log_start_offset(), clean_below);
    let bounds = crate::storage::CleanBounds::new(clean_below, &aborted);
    match p.log.clean_if_due_within(now, budget, &bounds).await {
        Ok(s) if s.rounds == 0 => {}
        Ok(s) => tracing::info!(
            topic = %p.topic, partition = p.index, segments = s.segments_swapped,
            bytes_before = s.bytes_before, bytes_after = s.bytes_after,
            records_removed = s.records_removed, tombstones_removed = s.tombstones_removed,
            ms = s.elapsed.as_millis() as u64,
            "log cleaner compacted"
        ),
        Err(e) => tracing::warn!(topic = %p.topic, partition = p.index, "log cleaner: {e}"),
    }
}

/// Whether an unopened partition directory may hold segments retention deletes: more
/// than its active segment (two `.log` files or more), or a non-empty one last written
/// more than `retention_ms` before `now_ms` (its records' timestamps decide once the log
/// is open; -1: no time retention). A missing directory holds none.
fn may_hold_expired(dir: &std::path::Path, retention_ms: i64, now_ms: i64) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let mut logs = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"));
    let Some(first) = logs.next() else {
        return false;
    };
    if logs.next().is_some() {
        return true;
    }
    let Ok(meta) = first.metadata() else {
        return false;
    };
    let written_ms = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok());
    retention_ms >= 0
        && meta.len() > 0
        && written_ms.is_some_and(|w| now_ms.saturating_sub(w) > retention_ms)
}

#[cfg(test)]
mod tests {
    use super::may_hold_expired;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn ms(t: SystemTime) -> i64 {
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }

    /// An unopened partition whose only segment has records written long ago is opened
    /// for retention (it deletes an expired active segment); an empty one, a recent one,
    /// or one of a topic without time retention is not.
    #[test]
    fn an_unopened_idle_partition_with_an_expired_active_segment_is_retained() -> std::io::Result<()>
    {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("00000000000000000000.log");
        let hour_ago = SystemTime::now() - Duration::from_secs(3600);
        let now = ms(SystemTime::now());
        assert!(!may_hold_expired(&dir.path().join("missing"), 0, now));
        std::fs::write(&log, b"")?;
        std::fs::File::options()
            .write(true)
            .open(&log)?
            .set_modified(hour_ago)?;
        assert!(!may_hold_expired(dir.path(), 60_000, now), "empty");
        std::fs::write(&log, b"records")?;
        assert!(!may_hold_expired(dir.path(), 60_000, now), "written now");
        std::fs::File::options()
            .write(true)
            .open(&log)?
            .set_modified(hour_ago)?;
        assert!(may_hold_expired(dir.path(), 60_000, now), "expired");
        assert!(
            !may_hold_expired(dir.path(), 7_200_000, now),
            "within retention"
        );
        assert!(!may_hold_expired(dir.path(), -1, now), "no time retention");
        std::fs::write(dir.path().join("00000000000000000009.log"), b"")?;
        assert!(may_hold_expired(dir.path(), -1, now), "a sealed segment");
        Ok(())
    }
}
