//! Command-line flags, shared by the subcommands where they mean the same thing.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, Parser, Subcommand};
use wire::batch::Compression;

use crate::client::consumer::StartAt;
use crate::run::{LoadSpec, RUN_MAX};
use crate::schedule::Rate;

/// Most TCP connections per broker per producer (`--connections`).
pub const MAX_CONNECTIONS: usize = 64;

#[derive(Parser, Debug)]
#[command(
    name = "weir-loadgen",
    version,
    about = "Load generator for weir and any Kafka-compatible broker"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Produce at a fixed rate (open loop) or as fast as possible (--rate max).
    Produce(Load),
    /// Consume from earliest or latest.
    Consume(Load),
    /// Produce and consume together; end-to-end latency from the stamp in each record.
    E2e(Load),
    /// Run e2e across --acks 0,1,all and --record-sizes; print one comparison table.
    Sweep(Sweep),
    /// Raise the offered rate until the p99 SLO or bounded lag fails; capacity table.
    Plan(Plan),
    /// Delivery-semantics check: lost, duplicated, reordered records per partition.
    Verify(Verify),
    /// Start a temporary single-node weir (or use --bootstrap), run a short sweep.
    Quickstart(Quickstart),
}

/// Flags common to every load.
#[derive(Args, Debug, Clone)]
pub struct Load {
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    #[arg(long, default_value = "weir-loadgen")]
    pub topic: String,
    /// Partitions to create the topic with, if it is missing.
    #[arg(long, default_value_t = 1)]
    pub partitions: i32,
    /// Record value size in bytes (at least 28: the stamp).
    #[arg(long, default_value_t = 1024)]
    pub record_size: usize,
    #[arg(long, default_value_t = 1)]
    pub producers: usize,
    /// Consumer threads; partitions are assigned manually, round-robin (no group protocol).
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Records per second (open loop, all producers together), or `max` (closed loop).
    #[arg(long, default_value = "max")]
    pub rate: Rate,
    /// Stop after this many records (all producers together).
    #[arg(long)]
    pub records: Option<u64>,
    /// Measured duration after the warm-up, e.g. 30s, 2m, 500ms.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Leading time whose records are excluded from all totals.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub warmup: Duration,
    /// 0, 1 or all (sweep: a comma-separated list).
    #[arg(long, default_value = "all")]
    pub acks: String,
    /// Kafka's batch.size, bytes.
    #[arg(long, default_value_t = 16_384)]
    pub batch_size: usize,
    /// Kafka's linger.ms.
    #[arg(long, default_value_t = 5)]
    pub linger_ms: u64,
    /// Requests in flight per broker connection.
    #[arg(long, default_value_t = 5)]
    pub max_in_flight: usize,
    #[arg(long, default_value_t = 10)]
    pub retries: u32,
    #[arg(long, default_value_t = 100)]
    pub retry_backoff_ms: u64,
    /// Kafka's retry.backoff.max.ms: retries and metadata refreshes back off exponentially
    /// from --retry-backoff-ms up to this.
    #[arg(long, default_value_t = 1000)]
    pub retry_backoff_max_ms: u64,
    /// TCP connections per broker per producer; a partition always uses the same one, so
    /// its batches stay in order.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Throttle the consumers to this many records/s (all together); default: as fast as
    /// they can. For showing lag grow. The consumed rate reported is over the consumers'
    /// own window (which runs on while they catch up), not over the produce window.
    #[arg(long)]
    pub consume_rate: Option<f64>,
    /// Kafka's delivery.timeout.ms: a batch not acknowledged this long after it was
    /// created is given up on. At least --linger-ms + --request-timeout-ms (as in Kafka).
    #[arg(long, default_value_t = 120_000)]
    pub delivery_timeout_ms: u64,
    /// Kafka's request.timeout.ms: a produce request unanswered this long has its
    /// connection dropped and its batches retried (within --delivery-timeout-ms).
    #[arg(long, default_value_t = 30_000)]
    pub request_timeout_ms: u32,
    /// InitProducerId + per-partition sequences.
    #[arg(long)]
    pub idempotent: bool,
    /// Kafka's transactional.id, as a prefix (producer i uses PREFIX-i): write in
    /// transactions of --txn-records records, each committed with EndTxn. Implies
    /// --idempotent; needs --acks all.
    #[arg(long)]
    pub transactional_id: Option<String>,
    /// Records per transaction (with --transactional-id).
    #[arg(long, default_value_t = 100)]
    pub txn_records: usize,
    /// Kafka's transaction.timeout.ms (with --transactional-id).
    #[arg(long, default_value_t = 60_000)]
    pub transaction_timeout_ms: i32,
    /// Consumers read with isolation_level=1 (read_committed).
    #[arg(long)]
    pub read_committed: bool,
    /// none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none", value_parser = parse_compression)]
    pub compression: Compression,
    /// Keyed partitioning over this many distinct keys (default: round-robin per batch).
    #[arg(long)]
    pub keys: Option<u64>,
    /// Consume as this consumer group (JoinGroup/SyncGroup, commits); without it,
    /// partitions are assigned to the --consumers threads manually.
    #[arg(long)]
    pub group: Option<String>,
    /// Where consumers start: earliest or latest (consume defaults to earliest).
    #[arg(long)]
    pub from: Option<String>,
    /// Write the summary as JSON (keys documented in the README).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a self-contained HTML report with plots.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// No per-second progress lines.
    #[arg(long)]
    pub quiet: bool,
    /// A broker's Prometheus endpoint (weir's `metrics.listener`), e.g.
    /// http://127.0.0.1:9404/metrics; repeat once per node. Scraped once a second for
    /// follower lag of --topic (records and ms), shown in --json and the --report.
    #[arg(long = "metrics-url")]
    pub metrics_urls: Vec<String>,
    #[command(flatten)]
    pub security: Security,
}

/// How connections are secured: librdkafka's properties, as flags.
#[derive(Args, Debug, Clone)]
pub struct Security {
    /// Kafka's security.protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    #[arg(long, default_value = "PLAINTEXT")]
    pub security_protocol: String,
    /// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with SASL_PLAINTEXT or SASL_SSL).
    #[arg(long, default_value = "PLAIN")]
    pub sasl_mechanism: String,
    #[arg(long)]
    pub sasl_username: Option<String>,
    /// The password (visible to other users in the process list: use a test account).
    #[arg(long)]
    pub sasl_password: Option<String>,
    /// PEM file of the CA(s) the broker's certificate must chain to; default: the public
    /// web roots (webpki-roots).
    #[arg(long)]
    pub ssl_ca_location: Option<PathBuf>,
    /// PEM client certificate (chain), for a listener with ssl.client.auth=required.
    #[arg(long)]
    pub ssl_certificate_location: Option<PathBuf>,
    /// PEM private key of --ssl-certificate-location.
    #[arg(long)]
    pub ssl_key_location: Option<PathBuf>,
    /// https: the broker's certificate must name the host dialled; none: any name.
    #[arg(long, default_value = "https")]
    pub ssl_endpoint_identification_algorithm: String,
}

impl Security {
    /// Installs these flags as the process's connection security (once, before any
    /// connection is made).
    pub fn install(&self) -> Result<()> {
        let flags = crate::client::security::SecurityFlags {
            protocol: self.security_protocol.clone(),
            sasl_mechanism: self.sasl_mechanism.clone(),
            sasl_username: self.sasl_username.clone(),
            sasl_password: self.sasl_password.clone(),
            ssl_ca_location: self.ssl_ca_location.clone(),
            ssl_certificate_location: self.ssl_certificate_location.clone(),
            ssl_key_location: self.ssl_key_location.clone(),
            ssl_endpoint_identification_algorithm: self
                .ssl_endpoint_identification_algorithm
                .clone(),
        };
        crate::client::security::install(flags.build()?)
    }
}

impl Cmd {
    /// The connection security flags of the subcommand (every one takes them).
    pub fn security(&self) -> &Security {
        match self {
            Cmd::Produce(l) | Cmd::Consume(l) | Cmd::E2e(l) => &l.security,
            Cmd::Sweep(s) => &s.load.security,
            Cmd::Plan(p) => &p.load.security,
            Cmd::Verify(v) => &v.load.security,
            Cmd::Quickstart(q) => &q.security,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct Sweep {
    #[command(flatten)]
    pub load: Load,
    /// Record sizes to compare, bytes, comma-separated.
    #[arg(long, default_value = "1024")]
    pub record_sizes: String,
    /// Measure produce only (no consumer, no e2e latency).
    #[arg(long)]
    pub produce_only: bool,
    /// With --metrics-url: before each step after the first, wait up to this long for every
    /// follower of --topic to catch up (lag 0 records), so a step that left followers behind
    /// (acks=0 at max outruns them) does not charge its backlog to the next one.
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub settle_timeout: Duration,
}

#[derive(Args, Debug, Clone)]
pub struct Plan {
    #[command(flatten)]
    pub load: Load,
    /// The publish p99 latency the rate must keep, ms.
    #[arg(long, default_value_t = 5.0)]
    pub slo_p99_ms: f64,
    /// Consumer lag must stay under this many records (bounded lag).
    #[arg(long, default_value_t = 100_000)]
    pub max_lag_records: i64,
    /// First offered rate, records/s.
    #[arg(long, default_value_t = 1000.0)]
    pub start_rate: f64,
    /// Each step multiplies the rate by this.
    #[arg(long, default_value_t = 1.5)]
    pub step_factor: f64,
    #[arg(long, default_value_t = 20)]
    pub max_steps: u32,
    /// Size the deployment for this many MB/s.
    #[arg(long)]
    pub target_mbps: Option<f64>,
    /// Record sizes to plan for, comma-separated (one capacity row each).
    #[arg(long, default_value = "1024")]
    pub record_sizes: String,
}

#[derive(Args, Debug, Clone)]
pub struct Verify {
    #[command(flatten)]
    pub load: Load,
    /// A shell command run every --fault-every during the produce phase.
    #[arg(long)]
    pub fault_cmd: Option<String>,
    #[arg(long, value_parser = parse_duration)]
    pub fault_every: Option<Duration>,
    /// Exit with status 2 if any acknowledged record is lost or any record duplicated
    /// (or, with --transactional, any aborted record is read back).
    #[arg(long)]
    pub strict: bool,
    /// Transactional producers (transactional id `weir-loadgen-verify-RUN` unless
    /// --transactional-id is given) and a read_committed read-back.
    #[arg(long)]
    pub transactional: bool,
}

#[derive(Args, Debug, Clone)]
pub struct Quickstart {
    /// Use this broker instead of starting a temporary weir.
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Measured seconds per configuration.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub duration: Duration,
    #[arg(long, default_value = "weir-quickstart.html")]
    pub report: PathBuf,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// How to reach a secured --bootstrap (the temporary weir is plaintext).
    #[command(flatten)]
    pub security: Security,
}

/// `30s`, `500ms`, `2m`, `1h`, or a plain number of seconds; at most [`RUN_MAX`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        (s, 1000.0)
    };
    let secs = match num.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => v * mult_ms / 1000.0,
        _ => return Err(format!("not a duration: {s:?} (try 30s, 500ms, 2m)")),
    };
    // Checked before the conversion, which panics on a value past Duration's range.
    if secs > RUN_MAX.as_secs_f64() {
        return Err(format!(
            "{s:?} is longer than a run may last ({} h)",
            RUN_MAX.as_secs() / 3600
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `none|gzip|snappy|lz4|zstd`.
pub fn parse_compression(s: &str) -> Result<Compression, String> {
    Ok(match s {
        "none" => Compression::None,
        "gzip" => Compression::Gzip,
        "snappy" => Compression::Snappy,
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        _ => return Err(format!("unknown compression {s:?}")),
    })
}

/// `0`, `1`, `all` or `-1` → Kafka's acks value.
pub fn parse_acks(s: &str) -> Result<i16> {
    Ok(match s.trim() {
        "0" => 0,
        "1" => 1,
        "all" | "-1" => -1,
        other => bail!("acks must be 0, 1 or all, not {other:?}"),
    })
}

/// A comma-separated list.
pub fn parse_list<T>(s: &str, f: impl Fn(&str) -> Result<T>) -> Result<Vec<T>> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| f(x.trim()))
        .collect()
}

/// acks as people write it.
pub fn acks_label(acks: i16) -> &'static str {
    match acks {
        0 => "0",
        1 => "1",
        _ => "all",
    }
}

/// Kafka's producer refuses a delivery timeout shorter than linger.ms plus
/// request.timeout.ms: a batch could then be given up on while its request may still be
/// answered. So do we, with the same rule; the request timeout must be positive.
fn check_timeouts(delivery_ms: u64, linger_ms: u64, request_ms: u32) -> Result<()> {
    if request_ms == 0 {
        bail!("--request-timeout-ms must be positive");
    }
    let least = linger_ms.saturating_add(u64::from(request_ms));
    if delivery_ms < least {
        bail!(
            "--delivery-timeout-ms ({delivery_ms}) must be at least --linger-ms + \
             --request-timeout-ms ({least}), as in Kafka"
        );
    }
    Ok(())
}

impl Load {
    /// The run spec for these flags; `default_start` applies when --from is absent.
    pub fn spec(&self, default_start: StartAt) -> Result<LoadSpec> {
        let acks = parse_acks(&self.acks)?;
        if self.record_size < crate::client::payload::HEADER_BYTES {
            bail!(
                "--record-size must be at least {}",
                crate::client::payload::HEADER_BYTES
            );
        }
        if self.max_in_flight == 0 || self.batch_size == 0 {
            bail!("--max-in-flight and --batch-size must be positive");
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.connections) {
            bail!("--connections must be in 1..={MAX_CONNECTIONS}");
        }
        if self
            .consume_rate
            .is_some_and(|r| !(r > 0.0 && r.is_finite()))
        {
            bail!("--consume-rate must be a positive number of records/s");
        }
        let start = match self.from.as_deref() {
            None => default_start,
            Some("earliest") => StartAt::Earliest,
            Some("latest") => StartAt::Latest,
            Some(x) => bail!("--from must be earliest or latest, not {x:?}"),
        };
        let mut spec = LoadSpec::new(&self.bootstrap, &self.topic);
        spec.partitions = self.partitions;
        spec.producers = self.producers;
        spec.consumers = self.consumers;
        spec.rate = self.rate;
        spec.records = self.records;
        // A producer with no bound runs 10 s; a consumer with none reads until idle.
        spec.duration = match (self.records, self.duration) {
            (_, Some(d)) => Some(d),
            (Some(_), None) => None,
            (None, None) if default_start == StartAt::Earliest => None,
            (None, None) => Some(Duration::from_secs(10)),
        };
        spec.warmup = self.warmup;
        spec.start = start;
        spec.quiet = self.quiet;
        spec.group = self.group.clone();
        let p = &mut spec.producer;
        p.acks = acks;
        p.batch_size_bytes = self.batch_size;
        p.linger_ms = self.linger_ms;
        p.max_in_flight = self.max_in_flight;
        p.retries = self.retries;
        p.retry_backoff_ms = self.retry_backoff_ms;
        p.retry_backoff_max_ms = self.retry_backoff_max_ms.max(self.retry_backoff_ms);
        p.connections = self.connections;
        spec.consume_rate = self.consume_rate;
        for u in &self.metrics_urls {
            crate::scrape::split_url(u)?;
        }
        spec.metrics_urls = self.metrics_urls.clone();
        check_timeouts(
            self.delivery_timeout_ms,
            self.linger_ms,
            self.request_timeout_ms,
        )?;
        p.delivery_timeout_ms = self.delivery_timeout_ms;
        p.request_timeout_ms = i32::try_from(self.request_timeout_ms)
            .map_err(|_| anyhow::anyhow!("--request-timeout-ms must fit an i32"))?;
        p.idempotent = self.idempotent;
        p.compression = self.compression;
        p.record_size_bytes = self.record_size;
        p.keys = self.keys;
        if self.idempotent && (acks != -1 || self.max_in_flight > 5) {
            bail!("--idempotent needs --acks all and --max-in-flight ≤ 5 (as in Kafka)");
        }
        spec.read_committed = self.read_committed;
        if let Some(t) = &self.transactional_id {
            if acks != -1 || self.max_in_flight > 5 {
                bail!("--transactional-id needs --acks all and --max-in-flight ≤ 5 (as in Kafka)");
            }
            if self.txn_records == 0 || self.transaction_timeout_ms <= 0 {
                bail!("--txn-records and --transaction-timeout-ms must be positive");
            }
            let p = &mut spec.producer;
            p.transactional_id = Some(t.clone());
            p.idempotent = true;
            p.txn_records = self.txn_records;
            p.transaction_timeout_ms = self.transaction_timeout_ms;
        }
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_lists_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_duration("24h"), Ok(RUN_MAX));
    }

    #[test]
    fn durations_past_the_run_maximum_are_refused_not_a_panic() {
        for huge in ["1e20", "1e20s", "1e300ms", "25h"] {
            let e = parse_duration(huge).expect_err(huge);
            assert!(e.contains("longer than a run may last"), "{huge}: {e}");
        }
        assert_eq!(parse_list("0,1,all", parse_acks).ok(), Some(vec![0, 1, -1]));
        assert!(parse_acks("2").is_err());
    }

    #[test]
    fn the_delivery_timeout_covers_linger_and_the_request_timeout() {
        assert!(check_timeouts(120_000, 5, 30_000).is_ok());
        assert!(check_timeouts(30_005, 5, 30_000).is_ok());
        let e = check_timeouts(4_000, 5, 30_000).expect_err("shorter than a request");
        assert!(e.to_string().contains("30005"), "{e}");
        assert!(check_timeouts(4_000, 5, 0).is_err());
        let cli = Cli::parse_from(["weir-loadgen", "produce", "--request-timeout-ms", "250"]);
        let Cmd::Produce(l) = cli.cmd else {
            unreachable!("parsed the produce subcommand")
        };
        let spec = l.spec(StartAt::Latest).expect("a valid spec");
        assert_eq!(spec.producer.request_timeout_ms, 250);
    }
}
