//! A replication fetcher: one per (shard, source node). It follows every partition this
//! shard replicates from that node with one Fetch (`replica_id` = this node) per round,
//! each partition at its log end with its current leader epoch and the epoch it last
//! fetched, and for each partition in the answer (the partitions' appends run together, so
//! a round waits for one DMA write rather than one per partition):
//!
//! - records: appended keeping the leader's offsets and epochs (`append_as_follower`);
//!   the response frame is one allocation, so when one partition's records are the only
//!   slice left of it, and at least a quarter of the answer's records (the log's tail
//!   cache keeps what it appends), they are appended in place, else copied once; a
//!   refused append (a
//!   full disk, a batch that does not continue the log) pauses the partition
//!   [`REFUSED_RETRY`];
//! - the leader's HW: learned (bounded by what this replica holds);
//! - a diverging epoch (KIP-320): truncate where the leader's epoch ended — never blindly
//!   to the HW —, or, for an epoch this log lacks, where its own largest epoch below that
//!   one ends, and ask again (KIP-279, `Partition::divergence_cut`); then fetch on;
//! - OFFSET_OUT_OF_RANGE: this log is past the leader's end or below its start: cut to
//!   the leader's end, or restart empty at its start (ListOffsets with this replica id);
//! - NOT_LEADER_OR_FOLLOWER, FENCED / UNKNOWN_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION:
//!   the partition waits [`REFUSED_RETRY`] and asks again: the leader may not have applied
//!   the same metadata yet, or this replica is stale and the controller's next assignment
//!   will move it (a new `follow`).
//!
//! The leader parks the fetch (`replica.fetch.wait.max.ms`) until it has data past the
//! follower's end, so an idle fetcher costs one request per wait, not a spin.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ReplicaState};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;
use wire::{BrokerEpoch, LeaderEpoch, NodeId, Offset};

use super::client::{BrokerConn, ClientError};
use crate::errors;
use crate::event::join_all;
use crate::partition::Partition;
use crate::shard::TopicPartition;

/// The Fetch version a fetcher speaks: diverging epochs and the last fetched epoch
/// (KIP-320, v12), topics by id (v13), and the follower's broker epoch in
/// `replica_state` (v15, KIP-903): the leader names it when it proposes adding this node
/// to an ISR, and the controller refuses that if this node has restarted since, so that
/// what one run of this node fetched never qualifies the run after it.
const FETCH_VERSION: i16 = 15;
const LIST_OFFSETS_VERSION: i16 = 6;
/// Slack on top of the leader's long poll before a fetch is declared lost.
const FETCH_SLACK: Duration = Duration::from_secs(10);
/// Reconnect backoff bounds after a failed connection or request.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long a partition the source refused waits before it is fetched again.
pub const REFUSED_RETRY: Duration = Duration::from_millis(200);

/// Fetcher settings, Kafka's keys.
#[derive(Clone, Copy, Debug)]
pub struct FetcherConfig {
    /// `replica.fetch.wait.max.ms`: the leader's long poll.
    pub wait_max: Duration,
    /// `replica.fetch.min.bytes`: the leader answers once it has this much (or at
    /// `wait_max`). Kafka's default 1 answers each append at once: acks=all waits for no
    /// more than the round trip, at one fetch round per append.
    pub min_bytes: i32,
    /// `replica.fetch.max.bytes`: per partition per fetch.
    pub partition_max_bytes: i32,
    /// `replica.fetch.response.max.bytes`: per fetch.
    pub response_max_bytes: i32,
}

impl Default for FetcherConfig {
    fn default() -> Self {
        FetcherConfig {
            wait_max: Duration::from_millis(500),
            min_bytes: 1,
            partition_max_bytes: 1 << 20,
            response_max_bytes: 10 << 20,
        }
    }
}

/// One followed partition.
struct Followed {
    partition: Rc<Partition>,
    /// Refused by the leader (not leader yet, fenced ...): not fetched before this.
    paused_until: Option<Instant>,
}

/// What one fetch round did, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundStats {
    pub appended_batches: u64,
    pub appended_bytes: u64,
    pub copied_bytes: u64,
    pub truncations: u64,
    pub paused: u64,
    /// The most appends in flight at once (started, not yet written) during the round.
    pub appends_together: u64,
}

impl RoundStats {
    fn add(&mut self, o: RoundStats) {
        self.appended_batches += o.appended_batches;
        self.appended_bytes += o.appended_bytes;
        self.copied_bytes += o.copied_bytes;
        self.truncations += o.truncations;
        self.paused += o.paused;
        self.appends_together = self.appends_together.max(o.appends_together);
    }
}

/// The fetcher of one shard for one source node.
pub struct ReplicaFetcher {
    local: NodeId,
    /// This process's broker epoch, sent with every fetch.
    local_epoch: BrokerEpoch,
    source: NodeId,
    /// The source's registered host (its TLS certificate must name it) and port; the host
    /// is resolved at each connect ([`crate::resolve`]), off the shard's thread.
    host: String,
    port: u16,
    config: FetcherConfig,
    followed: RefCell<BTreeMap<TopicPartition, Followed>>,
    stopped: Cell<bool>,
    totals: Cell<RoundStats>,
    /// Appends started and not yet finished, and the most at once this round.
    appending: Cell<(u64, u64)>,
    /// Notified when a partition is followed: a fetcher with nothing to fetch waits on it.
    followed_more: crate::event::Event,
}

impl ReplicaFetcher {
    /// A fetcher from `addr`, named by its IP address, for a node with no broker epoch
    /// (outside a cluster).
    pub fn new(local: NodeId, source: NodeId, addr: SocketAddr, config: FetcherConfig) -> Rc<Self> {
        let local = (local, BrokerEpoch::NONE);
        ReplicaFetcher::new_named(local, source, addr.ip().to_string(), addr.port(), config)
    }

    /// A fetcher for the node and broker epoch `local` from the source registered as
    /// `host` and `port`.
    pub fn new_named(
        (local, local_epoch): (NodeId, BrokerEpoch),
        source: NodeId,
        host: String,
        port: u16,
        config: FetcherConfig,
    ) -> Rc<Self> {
        Rc::new(ReplicaFetcher {
            local,
            local_epoch,
            source,
            host,
            port,
            config,
            followed: RefCell::new(BTreeMap::new()),
            stopped: Cell::new(false),
            totals: Cell::new(RoundStats::default()),
            appending: Cell::new((0, 0)),
            followed_more: crate::event::Event::default(),
        })
    }

    pub fn source(&self) -> NodeId {
        self.source
    }

    /// Follows `tp` (its replica already a follower of the source).
    pub fn follow(&self, tp: TopicPartition, partition: Rc<Partition>) {
        let followed = Followed {
            partition,
            paused_until: None,
        };
        self.followed.borrow_mut().insert(tp, followed);
        self.followed_more.notify_all();
    }

    /// The port it fetches from.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host name the source is registered by.
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn follows(&self, tp: &TopicPartition) -> bool {
        self.followed.borrow().contains_key(tp)
    }

    /// Stops and hands over every followed partition (to a fetcher for the source's new
    /// address).
    pub fn retire(&self) -> Vec<(TopicPartition, Rc<Partition>)> {
        self.stop();
        std::mem::take(&mut *self.followed.borrow_mut())
            .into_iter()
            .map(|(tp, f)| (tp, f.partition))
            .collect()
    }

    pub fn unfollow(&self, tp: &TopicPartition) {
        self.followed.borrow_mut().remove(tp);
    }

    pub fn is_empty(&self) -> bool {
        self.followed.borrow().is_empty()
    }

    pub fn stop(&self) {
        self.stopped.set(true);
    }

    /// Everything appended, truncated and paused so far.
    pub fn totals(&self) -> RoundStats {
        self.totals.get()
    }

    /// Fetches until stopped, reconnecting with backoff after failures.
    pub async fn run(self: Rc<Self>) {
        let mut backoff = BACKOFF_MIN;
        while !self.stopped.get() {
            let connected = match crate::resolve::resolve(&self.host, self.port).await {
                Some(addr) => BrokerConn::connect_from(&self.host, addr, self.local).await,
                None => Err(ClientError::Io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{}: host name does not resolve", self.host),
                ))),
            };
            let mut conn = match connected {
                Ok(c) => c,
                Err(e) => {
                    crate::metrics::add(|m| &m.replica_fetch_errors, 1);
                    match e {
                        // A certificate or credentials the peer refuses, or whose own
                        // certificate does not verify, is a configuration error: said
                        // loudly (at most once per backoff, ≤ BACKOFF_MAX apart).
                        ClientError::Tls { .. } | ClientError::Sasl { .. } => {
                            tracing::warn!(source = %self.source, host = %self.host, "replica fetcher: {e}")
                        }
                        _ => tracing::debug!(source = %self.source, "replica fetcher: {e}"),
                    }
                    glommio::timer::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            };
            while !self.stopped.get() {
                match self.round(&mut conn).await {
                    Ok(r) => {
                        crate::metrics::add(|m| &m.replica_fetch_bytes, r.appended_bytes);
                        backoff = BACKOFF_MIN;
                    }
                    Err(e) => {
                        crate::metrics::add(|m| &m.replica_fetch_errors, 1);
                        tracing::info!(source = %self.source, "replica fetcher reconnects: {e}");
                        break;
                    }
                }
            }
            glommio::timer::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One Fetch to the source and everything its answer asks for.
    pub async fn round(&self, conn: &mut BrokerConn) -> Result<RoundStats, ClientError> {
        let mut stats = RoundStats::default();
        let Some(req) = self.fetch_request() else {
            // Nothing to fetch now: wait until a paused partition may be fetched again or
            // a partition is followed, at most as long as a parked fetch would. (Sleeping
            // the whole wait held a partition paused for 200 ms up to
            // `replica.fetch.wait.max.ms`, and a newly followed one as long.)
            let more = self.followed_more.listen();
            let now = Instant::now();
            let wait = self
                .followed
                .borrow()
                .values()
                .filter_map(|f| f.paused_until)
                .min()
                .map_or(self.config.wait_max, |t| t.saturating_duration_since(now))
                .min(self.config.wait_max);
            futures_lite::future::or(more, glommio::timer::sleep(wait)).await;
            return Ok(stats);
        };
        let sent = Instant::now();
        let deadline = sent + self.config.wait_max + FETCH_SLACK;
        let names = self.names_by_id();
        let resp: FetchResponse = conn.call(&req, FETCH_VERSION, deadline).await?;
        crate::metrics::local(|m| m.replica_fetched(sent.elapsed()));
        // Every partition's records are appended at once, so a round waits for one DMA
        // write, not one per partition after another; the answers that need the
        // connection (realign) or a truncation follow, one at a time.
        let (plain, other): (Vec<_>, Vec<_>) = take_answers(resp, &names)
            .into_iter()
            .partition(|(_, a)| a.error == errors::NONE && a.diverging.is_none());
        let appends = plain
            .into_iter()
            .map(|(tp, answer)| Box::pin(self.append_answer(tp, answer)))
            .collect();
        self.appending.set((0, 0));
        for s in join_all(appends).await {
            stats.add(s);
        }
        stats.appends_together = self.appending.get().1;
        for (tp, answer) in other {
            self.apply(conn, &tp, answer, &mut stats).await?;
        }
        let mut totals = self.totals.get();
        totals.add(stats);
        self.totals.set(totals);
        Ok(stats)
    }

    /// The partition followed as `tp`, if it is still the topic `topic_id` names: a topic
    /// deleted and created again while a fetch was out has a new id, and the old one's
    /// answer must not reach the new one's log.
    fn followed_as(&self, tp: &TopicPartition, topic_id: u128) -> Option<Rc<Partition>> {
        self.followed
            .borrow()
            .get(tp)
            .filter(|f| f.partition.topic_id == topic_id)
            .map(|f| f.partition.clone())
    }

    /// Each followed topic's name by its id (the answers name topics by id).
    fn names_by_id(&self) -> BTreeMap<u128, Arc<str>> {
        self.followed
            .borrow()
            .iter()
            .map(|(tp, f)| (f.partition.topic_id, tp.0.clone()))
            .collect()
    }

    fn fetch_request(&self) -> Option<FetchRequest> {
        let mut topics: Vec<FetchTopic> = Vec::new();
        let now = Instant::now();
        let ready = |f: &&Followed| f.paused_until.is_none_or(|t| t <= now);
        for (tp, f) in self.followed.borrow().iter().filter(|(_, f)| ready(f)) {
            let p = &f.partition;
            let last_fetched = p
                .epoch_entries()
                .last()
                .map_or(LeaderEpoch::NONE, |(e, _)| *e);
            let part = FetchPartition::default()
                .with_partition(tp.1)
                .with_current_leader_epoch(p.leader_epoch().get())
                .with_fetch_offset(p.log.log_end_offset().get())
                .with_last_fetched_epoch(last_fetched.get())
                .with_log_start_offset(p.log.log_start_offset().get())
                .with_partition_max_bytes(self.config.partition_max_bytes);
            match topics.last_mut() {
                Some(t) if t.topic_id == Uuid::from_u128(p.topic_id) => t.partitions.push(part),
                _ => topics.push(
                    FetchTopic::default()
                        .with_topic_id(Uuid::from_u128(p.topic_id))
                        .with_partitions(vec![part]),
                ),
            }
        }
        if topics.is_empty() {
            return None;
        }
        let wait_ms = i32::try_from(self.config.wait_max.as_millis()).unwrap_or(i32::MAX);
        Some(
            FetchRequest::default()
                .with_replica_state(
                    ReplicaState::default()
                        .with_replica_id(BrokerId(self.local.get()))
                        .with_replica_epoch(self.local_epoch.get()),
                )
                .with_max_wait_ms(wait_ms)
                .with_min_bytes(self.config.min_bytes)
                .with_max_bytes(self.config.response_max_bytes)
                .with_topics(topics),
        )
    }

    /// Everything one partition's answer asks for. `round` sends plain answers (no error,
    /// no diverging epoch) to [`append_answer`](Self::append_answer) together and only
    /// the others here, one at a time; a plain one given here is appended all the same.
    async fn apply(
        &self,
        conn: &mut BrokerConn,
        tp: &TopicPartition,
        answer: Answer,
        stats: &mut RoundStats,
    ) -> Result<(), ClientError> {
        let Some(p) = self.followed_as(tp, answer.topic_id) else {
            return Ok(());
        };
        match answer.error {
            errors::NONE => {}
            errors::OFFSET_OUT_OF_RANGE => {
                self.realign(conn, tp, &p, stats).await?;
                return Ok(());
            }
            code => {
                crate::client_warn!(topic = %tp.0, partition = tp.1, source = %self.source, code, "the source refused a follower fetch; retrying");
                if let Some(f) = self.followed.borrow_mut().get_mut(tp) {
                    f.paused_until = Some(Instant::now() + REFUSED_RETRY);
                }
                stats.paused += 1;
                return Ok(());
            }
        }
        if let Some((epoch, end)) = answer.diverging {
            self.truncate_diverged(tp, &p, epoch, end, stats).await;
            return Ok(());
        }
        stats.add(self.append_answer(tp.clone(), answer).await);
        Ok(())
    }

    /// Appends one partition's records (keeping the leader's offsets), then learns the
    /// leader's HW, bounded by what this replica now holds.
    async fn append_answer(&self, tp: TopicPartition, answer: Answer) -> RoundStats {
        let mut stats = RoundStats::default();
        let Some(p) = self.followed_as(&tp, answer.topic_id) else {
            return stats;
        };
        if let Some(records) = answer.records.filter(|r| !r.is_empty()) {
            let len = records.len() as u64;
            let (buf, copied) = records_to_append(records, answer.frame_records_bytes);
            let (now, most) = self.appending.get();
            self.appending.set((now + 1, most.max(now + 1)));
            let appended = p.append_as_follower(buf, crate::shard::now_ms()).await;
            let (now, most) = self.appending.get();
            self.appending.set((now.saturating_sub(1), most));
            match appended {
                // The append's own count: splitting the answer here to count its batches
                // checked every batch's CRC a second time (1.4 % of a node's CPU at RF 3).
                Ok(info) => {
                    stats.appended_batches += u64::from(info.batches);
                    stats.appended_bytes += len;
                    stats.copied_bytes += copied;
                }
                Err(code) => {
                    // Paused like a refusal: a full disk refuses every append for its
                    // backoff, and refetching at once would spin on the leader.
                    tracing::warn!(topic = %tp.0, partition = tp.1, code, "replicated append refused; refetching");
                    if let Some(f) = self.followed.borrow_mut().get_mut(&tp) {
                        f.paused_until = Some(Instant::now() + REFUSED_RETRY);
                    }
                    stats.paused += 1;
                }
            }
        }
        p.update_replica(|r| {
            r.learn_high_watermark(answer.high_watermark);
        });
        if answer.log_start > p.log.log_start_offset() {
            p.follow_log_start(answer.log_start).await;
        }
        stats
    }

    /// KIP-320: the leader says our last epoch ended at `end` there, as `epoch`; cut
    /// where [`Partition::divergence_cut`] says.
    async fn truncate_diverged(
        &self,
        tp: &TopicPartition,
        p: &Partition,
        epoch: LeaderEpoch,
        end: Offset,
        stats: &mut RoundStats,
    ) {
        let cut = p.divergence_cut(epoch, end);
        tracing::info!(topic = %tp.0, partition = tp.1, %epoch, %end, %cut, "follower diverged from its leader; truncating");
        if p.truncate_to(cut).await.is_ok() {
            stats.truncations += 1;
        }
    }

    /// After OFFSET_OUT_OF_RANGE: asks the leader for its log start and end, then cuts
    /// this log back to the end, or restarts it empty at the start.
    async fn realign(
        &self,
        conn: &mut BrokerConn,
        tp: &TopicPartition,
        p: &Partition,
        stats: &mut RoundStats,
    ) -> Result<(), ClientError> {
        let earliest = self.list_offset(conn, tp, p.leader_epoch(), -2).await?;
        let latest = self.list_offset(conn, tp, p.leader_epoch(), -1).await?;
        let ours = p.log.log_end_offset();
        let done = match (earliest, latest) {
            (Some(start), _) if ours < start => p.restart_at(start).await,
            (_, Some(end)) if ours > end => {
                tracing::info!(topic = %tp.0, partition = tp.1, %ours, %end, "follower past its leader's log end; truncating");
                p.truncate_to(end).await.map(|_| ())
            }
            _ => return Ok(()),
        };
        if done.is_ok() {
            stats.truncations += 1;
        }
        Ok(())
    }

    async fn list_offset(
        &self,
        conn: &mut BrokerConn,
        tp: &TopicPartition,
        epoch: LeaderEpoch,
        timestamp: i64,
    ) -> Result<Option<Offset>, ClientError> {
        let p = ListOffsetsPartition::default()
            .with_partition_index(tp.1)
            .with_current_leader_epoch(epoch.get())
            .with_timestamp(timestamp);
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(self.local.get()))
            .with_topics(vec![
                ListOffsetsTopic::default()
                    .with_name(topic_name(&tp.0))
                    .with_partitions(vec![p]),
            ]);
        let deadline = Instant::now() + FETCH_SLACK;
        let resp = conn.call(&req, LIST_OFFSETS_VERSION, deadline).await?;
        let found = resp
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .filter(|p| p.error_code == errors::NONE)
            .map(|p| Offset(p.offset));
        Ok(found)
    }
}

/// One partition of a Fetch answer, out of the response.
struct Answer {
    /// The topic the answer is for, by id.
    topic_id: u128,
    error: i16,
    high_watermark: Offset,
    /// The leader's log start: this replica's follows it.
    log_start: Offset,
    records: Option<Bytes>,
    /// Records bytes of the whole response these records are a slice of (about the size
    /// of the frame they pin while the log's tail cache holds them).
    frame_records_bytes: usize,
    diverging: Option<(LeaderEpoch, Offset)>,
}

/// The buffer a follower appends for one partition's `records`, and how many bytes were
/// copied to make it. The log's tail cache keeps slices of what it appends: as for
/// produced records, a slice that is a small part of its response's records
/// (`frame_records_bytes`, about the frame it would pin) is copied out, so that cached
/// batches never pin much more memory than they hold. A unique slice's `capacity` does not
/// tell, since it counts from the slice on; a shared one is copied (something else holds
/// the frame).
fn records_to_append(records: Bytes, frame_records_bytes: usize) -> (BytesMut, u64) {
    let len = records.len();
    let pin_max = len.saturating_mul(crate::api::produce::PIN_FACTOR_MAX);
    match records.try_into_mut() {
        Ok(unique) if frame_records_bytes <= pin_max => (unique, 0),
        Ok(unique) => (BytesMut::from(&unique[..]), len as u64),
        Err(shared) => (BytesMut::from(&shared[..]), len as u64),
    }
}

/// Takes every partition's answer out of `resp`, so that the response's other fields are
/// dropped and the records slices are the last references to the frame. Topics are named
/// by `names` (id → name); one not in it (unfollowed meanwhile) is skipped.
fn take_answers(
    resp: FetchResponse,
    names: &BTreeMap<u128, Arc<str>>,
) -> Vec<(TopicPartition, Answer)> {
    let mut out = Vec::new();
    let frame_records_bytes = resp
        .responses
        .iter()
        .flat_map(|t| &t.partitions)
        .filter_map(|p| p.records.as_ref().map(Bytes::len))
        .sum();
    for t in resp.responses {
        let Some(name) = names.get(&t.topic_id.as_u128()) else {
            continue;
        };
        for p in t.partitions {
            let diverging = (p.diverging_epoch.epoch >= 0 || p.diverging_epoch.end_offset >= 0)
                .then_some((
                    LeaderEpoch(p.diverging_epoch.epoch),
                    Offset(p.diverging_epoch.end_offset),
                ));
            out.push((
                (name.clone(), p.partition_index),
                Answer {
                    topic_id: t.topic_id.as_u128(),
                    error: p.error_code,
                    high_watermark: Offset(p.high_watermark),
                    log_start: Offset(p.log_start_offset),
                    records: p.records,
                    frame_records_bytes,
                    diverging,
                },
            ));
        }
    }
    out
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slice of `len` bytes cut from a frame of `frame` bytes, the frame's only owner.
    fn unique_slice(frame: usize, len: usize) -> Bytes {
        let mut whole = Bytes::from(vec![7u8; frame]);
        let slice = whole.split_to(len);
        drop(whole);
        slice
    }

    #[test]
    fn records_pinning_more_than_four_times_their_size_are_copied_out() {
        // A quarter of the response's records: kept as they are, no copy.
        let records = unique_slice(400, 100);
        let at = records.as_ptr();
        let (buf, copied) = records_to_append(records, 400);
        assert_eq!((buf.as_ptr(), buf.len(), copied), (at, 100, 0));
        // Under a quarter: copied into a buffer of their own.
        let records = unique_slice(401, 100);
        let at = records.as_ptr();
        let (buf, copied) = records_to_append(records, 401);
        assert_ne!(buf.as_ptr(), at);
        assert_eq!((&buf[..], copied), (&[7u8; 100][..], 100));
        // Still shared with another slice of the frame: copied whatever their share.
        let mut whole = Bytes::from(vec![7u8; 200]);
        let records = whole.split_to(100);
        let (buf, copied) = records_to_append(records, 200);
        assert_eq!((buf.len(), copied), (100, 100));
        drop(whole);
    }
}
