//! librdkafka clients (the `rdkafka` crate) set up for a weir under test: a producer that
//! records every delivery report, a consumer that reads whole partitions by manual
//! assignment (no consumer group: groups are a later issue), and admin calls. Every wait
//! is bounded; a test that cannot finish fails with what it saw.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

/// The longest a test waits for a flush, a drain or an admin call.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// A record as the test sent it; `id` is unique within a test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    pub id: u64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_ms: i64,
}

/// A record as a consumer read it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Got {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_ms: Option<i64>,
}

/// Where the broker said a record went (from the producer's delivery report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acked {
    pub id: u64,
    pub partition: i32,
    pub offset: i64,
}

/// Collects delivery reports; shared with the producer's background thread.
#[derive(Default)]
pub struct DeliveryLog {
    acked: Mutex<Vec<Acked>>,
    failed: Mutex<Vec<(u64, String)>>,
}

impl DeliveryLog {
    /// Acknowledged records, in delivery-report order.
    pub fn acked(&self) -> Vec<Acked> {
        lock(&self.acked).clone()
    }

    /// Failed deliveries with the error.
    pub fn failed(&self) -> Vec<(u64, String)> {
        lock(&self.failed).clone()
    }

    /// How many reports (ok or failed) have arrived.
    pub fn reports(&self) -> usize {
        lock(&self.acked).len() + lock(&self.failed).len()
    }
}

/// The producer context: routes each delivery report into a [`DeliveryLog`].
#[derive(Clone, Default)]
pub struct Deliveries(pub Arc<DeliveryLog>);

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<u64>;

    fn delivery(&self, result: &DeliveryResult<'_>, id: Box<u64>) {
        match result {
            Ok(m) => lock(&self.0.acked).push(Acked {
                id: *id,
                partition: m.partition(),
                offset: m.offset(),
            }),
            Err((e, _)) => lock(&self.0.failed).push((*id, e.to_string())),
        }
    }
}

/// A producer with a background poll thread and a delivery log.
pub type TestProducer = ThreadedProducer<Deliveries>;

/// Base client config for a broker at `bootstrap`.
pub fn base_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", "weir-tests")
        .set("socket.timeout.ms", "20000")
        .set("message.timeout.ms", "60000");
    c
}

/// A producer at `acks` with `codec` (none, gzip, snappy, lz4, zstd) and extra settings.
pub fn producer(
    bootstrap: &str,
    acks: &str,
    codec: &str,
    extra: &[(&str, &str)],
) -> Result<(TestProducer, Arc<DeliveryLog>)> {
    let mut c = base_config(bootstrap);
    c.set("acks", acks)
        .set("compression.codec", codec)
        .set("enable.idempotence", "false")
        .set("linger.ms", "5")
        .set("batch.num.messages", "2000")
        .set("queue.buffering.max.messages", "200000");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    let ctx = Deliveries::default();
    let log = Arc::clone(&ctx.0);
    let p: TestProducer = c.create_with_context(ctx).context("create producer")?;
    Ok((p, log))
}

/// Sends every record (to `partition` if given, else by key), retrying bounded on a full
/// local queue, then flushes.
pub fn produce_all(
    p: &TestProducer,
    topic: &str,
    records: &[Sent],
    partition: Option<i32>,
) -> Result<()> {
    for r in records {
        send_one(p, topic, r, partition)?;
    }
    p.flush(CLIENT_TIMEOUT).context("flush")?;
    Ok(())
}

/// Sends one record; waits (bounded) while librdkafka's queue is full.
pub fn send_one(p: &TestProducer, topic: &str, r: &Sent, partition: Option<i32>) -> Result<()> {
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        let mut headers = OwnedHeaders::new();
        for (k, v) in &r.headers {
            headers = headers.insert(rdkafka::message::Header {
                key: k,
                value: Some(v),
            });
        }
        let mut rec = BaseRecord::with_opaque_to(topic, Box::new(r.id))
            .key(&r.key)
            .payload(&r.value)
            .headers(headers)
            .timestamp(r.timestamp_ms);
        if let Some(part) = partition {
            rec = rec.partition(part);
        }
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                if Instant::now() > deadline {
                    bail!("producer queue stayed full for {CLIENT_TIMEOUT:?}");
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err((e, _)) => bail!("send record {}: {e}", r.id),
        }
    }
}

/// `n` records with ids from `first_id`: distinct keys, values of varying size, two
/// headers, increasing explicit timestamps from `base_ts_ms`.
pub fn make_records(first_id: u64, n: u64, tag: &str, base_ts_ms: i64) -> Vec<Sent> {
    (first_id..first_id + n)
        .map(|id| {
            let len = 16 + (id.wrapping_mul(2_654_435_761) % 240) as usize;
            let value: Vec<u8> = (0..len).map(|i| (id as usize + i * 7) as u8).collect();
            Sent {
                id,
                key: format!("key-{id}").into_bytes(),
                value,
                headers: vec![
                    ("id".to_string(), id.to_be_bytes().to_vec()),
                    ("tag".to_string(), tag.as_bytes().to_vec()),
                ],
                timestamp_ms: base_ts_ms + (id - first_id) as i64,
            }
        })
        .collect()
}

/// A consumer with no group, reading `topic`'s partitions by assignment.
pub fn consumer(bootstrap: &str, extra: &[(&str, &str)]) -> Result<BaseConsumer> {
    let mut c = base_config(bootstrap);
    // librdkafka's assign() needs a group.id, though no group is joined and nothing is
    // committed: positions come from the explicit assignment.
    c.set("group.id", "weir-tests-assign")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("check.crcs", "true")
        .set("fetch.wait.max.ms", "100");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c.create().context("create consumer")
}

/// Reads every partition in `partitions` of `topic` from offset 0 until `expected`
/// records arrived (or the timeout passed), and returns them in arrival order.
pub fn consume_exact(
    bootstrap: &str,
    topic: &str,
    partitions: &[i32],
    expected: usize,
) -> Result<Vec<Got>> {
    let c = consumer(bootstrap, &[])?;
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut got = Vec::with_capacity(expected);
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while got.len() < expected && Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => got.push(to_got(&m)),
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => bail!("consume {topic}: {e} (after {} records)", got.len()),
        }
    }
    // A little longer, to catch records beyond the expected count (duplicates).
    let extra_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < extra_until {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            got.push(to_got(&m));
        }
    }
    if got.len() < expected {
        bail!(
            "consumed {} of {expected} records from {topic} within {CLIENT_TIMEOUT:?}",
            got.len()
        );
    }
    Ok(got)
}

/// High watermark of each partition of `topic` (bounded wait per call).
pub fn high_watermarks(
    bootstrap: &str,
    topic: &str,
    partitions: &[i32],
) -> Result<BTreeMap<i32, i64>> {
    let c = consumer(bootstrap, &[])?;
    let mut out = BTreeMap::new();
    for &p in partitions {
        let (_low, high) = c
            .fetch_watermarks(topic, p, Duration::from_secs(20))
            .with_context(|| format!("watermarks of {topic}/{p}"))?;
        out.insert(p, high);
    }
    Ok(out)
}

/// Reads every listed partition from offset 0 up to its current high watermark and
/// returns all records, in arrival order.
pub fn consume_to_end(bootstrap: &str, topic: &str, partitions: &[i32]) -> Result<Vec<Got>> {
    let highs = high_watermarks(bootstrap, topic, partitions)?;
    let total: i64 = highs.values().sum();
    let c = consumer(bootstrap, &[])?;
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut next: BTreeMap<i32, i64> = partitions.iter().map(|&p| (p, 0)).collect();
    let done = |next: &BTreeMap<i32, i64>| {
        highs
            .iter()
            .all(|(p, h)| next.get(p).is_some_and(|n| n >= h))
    };
    let mut got = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    // librdkafka reports what it retries itself (a broker connection that failed, a
    // leader that moved) as consumer errors too: they are remembered, not fatal; the
    // deadline decides, and its message says the last one.
    let mut last_error: Option<KafkaError> = None;
    while !done(&next) {
        if Instant::now() > deadline {
            bail!(
                "read {} of {total} records of {topic} within {CLIENT_TIMEOUT:?}; at {next:?}, highs {highs:?}; last client error: {last_error:?}",
                got.len()
            );
        }
        match c.poll(Duration::from_millis(200)) {
            None | Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Ok(m)) => {
                next.insert(m.partition(), m.offset() + 1);
                got.push(to_got(&m));
            }
            Some(Err(e)) => last_error = Some(e),
        }
    }
    Ok(got)
}

/// A consumed message as a [`Got`].
pub fn to_got<M: Message>(m: &M) -> Got {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|x| {
                    (
                        x.key.to_string(),
                        x.value.map(<[u8]>::to_vec).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Got {
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
        timestamp_ms: m.timestamp().to_millis(),
    }
}

/// The admin client for a broker.
pub fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>> {
    base_config(bootstrap)
        .create()
        .context("create admin client")
}

fn admin_opts() -> AdminOptions {
    AdminOptions::new()
        .request_timeout(Some(Duration::from_secs(30)))
        .operation_timeout(Some(Duration::from_secs(30)))
}

/// Creates topics with `partitions` each and topic configs; fails on any per-topic error.
pub fn create_topics(
    bootstrap: &str,
    names: &[&str],
    partitions: i32,
    configs: &[(&str, &str)],
) -> Result<()> {
    let admin = admin(bootstrap)?;
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| {
            configs.iter().fold(
                NewTopic::new(n, partitions, TopicReplication::Fixed(1)),
                |t, (k, v)| t.set(k, v),
            )
        })
        .collect();
    let results = futures_lite::future::block_on(admin.create_topics(topics.iter(), &admin_opts()))
        .context("CreateTopics")?;
    for r in results {
        if let Err((name, code)) = r {
            bail!("create topic {name}: {code:?}");
        }
    }
    Ok(())
}

/// A topic config value as DescribeConfigs reports it.
pub fn topic_config(bootstrap: &str, topic: &str, key: &str) -> Result<Option<String>> {
    let admin = admin(bootstrap)?;
    let resource = ResourceSpecifier::Topic(topic);
    let results =
        futures_lite::future::block_on(admin.describe_configs([&resource], &admin_opts()))
            .context("DescribeConfigs")?;
    let Some(first) = results.into_iter().next() else {
        bail!("DescribeConfigs: no result for {topic}")
    };
    let config = first.map_err(|e| anyhow!("DescribeConfigs {topic}: {e}"))?;
    Ok(config.get(key).and_then(|e| e.value.clone()))
}

/// Partition count of `topic` per broker metadata, waiting (bounded) until it appears.
pub fn partition_count(bootstrap: &str, topic: &str) -> Result<usize> {
    let c = consumer(bootstrap, &[])?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        if let Some(t) = md.topics().iter().find(|t| t.name() == topic)
            && t.error().is_none()
            && !t.partitions().is_empty()
        {
            return Ok(t.partitions().len());
        }
        if Instant::now() > deadline {
            return Err(anyhow!("topic {topic} not in metadata within 20 s"));
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Checks that every acknowledged record was read back exactly once (no id twice in the log), at the offset its
/// delivery report gave, with the bytes, headers and timestamp it was sent with; that
/// each partition's offsets are dense (no gap); and that within a partition,
/// records are in the order they were produced (ids increase with offsets, per tag).
/// Returns the number of records checked.
pub fn verify(sent: &[Sent], acked: &[Acked], got: &[Got]) -> Result<usize> {
    let by_id: BTreeMap<u64, &Sent> = sent.iter().map(|s| (s.id, s)).collect();
    let mut seen: BTreeMap<(i32, i64), &Got> = BTreeMap::new();
    for g in got {
        if seen.insert((g.partition, g.offset), g).is_some() {
            bail!(
                "offset {} of partition {} was delivered twice",
                g.offset,
                g.partition
            );
        }
    }
    for a in acked {
        let s = by_id
            .get(&a.id)
            .ok_or_else(|| anyhow!("ack for unknown id {}", a.id))?;
        let g = seen.get(&(a.partition, a.offset)).ok_or_else(|| {
            anyhow!(
                "acked record {} at {}/{} was not read back",
                a.id,
                a.partition,
                a.offset
            )
        })?;
        compare(s, g)?;
    }
    check_dense(&seen)?;
    let acked_ids: BTreeSet<u64> = acked.iter().map(|a| a.id).collect();
    check_order(&seen, &acked_ids)?;
    Ok(acked.len())
}

fn compare(s: &Sent, g: &Got) -> Result<()> {
    let at = format!("record {} at {}/{}", s.id, g.partition, g.offset);
    if g.key.as_deref() != Some(&s.key[..]) {
        bail!("{at}: key differs");
    }
    if g.value.as_deref() != Some(&s.value[..]) {
        bail!(
            "{at}: value differs ({:?} bytes vs {})",
            g.value.as_ref().map(Vec::len),
            s.value.len()
        );
    }
    if g.headers != s.headers {
        bail!("{at}: headers differ: {:?}", g.headers);
    }
    if g.timestamp_ms != Some(s.timestamp_ms) {
        bail!(
            "{at}: timestamp {:?}, sent {}",
            g.timestamp_ms,
            s.timestamp_ms
        );
    }
    Ok(())
}

/// Offsets read from each partition form one run from 0 with no gap.
fn check_dense(seen: &BTreeMap<(i32, i64), &Got>) -> Result<()> {
    let mut prev: Option<(i32, i64)> = None;
    for &(p, o) in seen.keys() {
        match prev {
            Some((pp, po)) if pp == p && o != po + 1 => {
                bail!("partition {p}: offsets jump from {po} to {o}")
            }
            Some((pp, _)) if pp != p && o != 0 => {
                bail!("partition {p} starts at offset {o}, not 0")
            }
            None if o != 0 => bail!("partition {p} starts at offset {o}, not 0"),
            _ => {}
        }
        prev = Some((p, o));
    }
    Ok(())
}

/// Within a partition and a tag (one producer), ids increase with offsets.
fn check_order(seen: &BTreeMap<(i32, i64), &Got>, acked: &BTreeSet<u64>) -> Result<()> {
    let mut last: BTreeMap<(i32, Vec<u8>), u64> = BTreeMap::new();
    for (&(p, o), g) in seen {
        let id = header_id(g).ok_or_else(|| anyhow!("record {p}/{o} has no id header"))?;
        let tag = g
            .headers
            .iter()
            .find(|(k, _)| k == "tag")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        if let Some(prev) = last.insert((p, tag), id)
            && prev >= id
        {
            let was = |id| match acked.contains(&id) {
                true => "acknowledged",
                false => "not acknowledged",
            };
            bail!(
                "partition {p}: id {id} ({}) at offset {o} follows id {prev} ({}): out of order",
                was(id),
                was(prev)
            );
        }
    }
    Ok(())
}

/// The `id` header of a record written by [`make_records`].
pub fn header_id(g: &Got) -> Option<u64> {
    let (_, v) = g.headers.iter().find(|(k, _)| k == "id")?;
    Some(u64::from_be_bytes(v.as_slice().try_into().ok()?))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
