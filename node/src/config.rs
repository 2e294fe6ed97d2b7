//! Broker configuration: Kafka's `server.properties` format and key names, overridden by
//! `--set KEY=VALUE` and the dedicated CLI flags, resolved once at startup into [`Config`].

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

pub mod dynamic;
pub mod keys;

/// Kafka's default `message.max.bytes` (1 MiB + record batch overhead).
pub const MESSAGE_MAX_BYTES_DEFAULT: u64 = 1_048_588;
/// Kafka's default `socket.request.max.bytes` (100 MiB).
pub const SOCKET_REQUEST_MAX_BYTES_DEFAULT: u64 = 104_857_600;
/// Default cap on open client connections across all shards.
pub const MAX_CONNECTIONS_DEFAULT: u64 = 10_000;
/// Kafka's default `fetch.max.bytes` (55 MiB): the most record bytes in one Fetch response.
pub const FETCH_MAX_BYTES_DEFAULT: u64 = 57_671_680;
/// Kafka's default `max.incremental.fetch.session.cache.slots`.
pub const FETCH_SESSION_CACHE_SLOTS_DEFAULT: u64 = 1000;
/// Most fetch session slots weir accepts (each session's partitions are bounded too, see
/// `api::fetch_session`).
pub const FETCH_SESSION_CACHE_SLOTS_MAX: u64 = 100_000;
/// Default of weir's `fetch.response.buffer.max.bytes`: Fetch response bytes the node
/// holds at once (read, not yet written to their sockets), split evenly across shards.
pub const FETCH_RESPONSE_BUFFER_MAX_BYTES_DEFAULT: u64 = 256 << 20;
/// Kafka's default `log.segment.bytes` (1 GiB).
pub const SEGMENT_BYTES_DEFAULT: u64 = 1 << 30;
/// Kafka's default retention: 7 days.
pub const RETENTION_MS_DEFAULT: i64 = 7 * 24 * 3600 * 1000;
/// Kafka's default `log.retention.check.interval.ms` (5 minutes).
pub const RETENTION_CHECK_INTERVAL_MS_DEFAULT: u64 = 300_000;
/// Default `max.partitions` (weir; KIP-578's name): partitions of all topics, whole node.
/// Unopened partitions cost only their catalogue entry, so this bounds catalogue and
/// Metadata sizes rather than memory.
pub const MAX_PARTITIONS_DEFAULT: u64 = 200_000;
/// Default `max.partitions.per.request` (weir): partitions one CreateTopics,
/// CreatePartitions or auto-creating Metadata request may add.
pub const MAX_PARTITIONS_PER_REQUEST_DEFAULT: u64 = 100_000;
/// Default `max.open.partitions` (weir): partition logs open at once, whole node; idle
/// ones beyond it are closed (each open log holds a file per segment).
pub const MAX_OPEN_PARTITIONS_DEFAULT: u64 = 10_000;
/// Default `queued.max.request.bytes`: request bytes being read or handled, whole node
/// (each shard gets an equal share). Kafka's default is -1 (unbounded); 512 MiB holds five
/// maximum-size (100 MiB) frames at once and far more than the in-flight bytes of any
/// legitimate load (1 GB/s of produce handled in 10 ms is 10 MB), while bounding what
/// clients that declare big frames and stall can pin.
pub const QUEUED_MAX_REQUEST_BYTES_DEFAULT: u64 = 512 << 20;
/// Default `request.read.timeout.ms` (weir's own key): a frame must be complete this long
/// after its first byte (or after its share of the request budget was granted). Clients
/// give up on a request after `request.timeout.ms`, 30 s by default, so a frame that takes
/// longer to arrive is one nobody waits for any more.
pub const REQUEST_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Kafka's default `connections.max.idle.ms` (10 minutes).
pub const CONNECTIONS_MAX_IDLE_MS_DEFAULT: i64 = 600_000;
/// Default `max.connections.per.ip`. Kafka's is unbounded (i32::MAX), which lets one client
/// take every `max.connections` slot; a tenth of the default `max.connections` still
/// leaves room for many clients behind one NAT address.
pub const MAX_CONNECTIONS_PER_IP_DEFAULT: u64 = 1_000;

/// Kafka's default `broker.heartbeat.interval.ms`: how often a node heartbeats the
/// active controller.
pub const BROKER_HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 2_000;
/// Kafka's default `broker.session.timeout.ms`: a node not heard from this long is fenced.
pub const BROKER_SESSION_TIMEOUT_MS_DEFAULT: u64 = 9_000;
/// Kafka's default `controller.quorum.election.timeout.ms`.
pub const CONTROLLER_ELECTION_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Kafka's default `leader.imbalance.check.interval.seconds`.
pub const LEADER_IMBALANCE_CHECK_INTERVAL_S_DEFAULT: u64 = 300;
/// Kafka's default `leader.imbalance.per.broker.percentage`.
pub const LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT: u32 = 10;

/// The active controller's preferred-leader rebalance (Kafka's auto leader rebalance).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderRebalance {
    pub enable: bool,
    /// How often the controller looks for imbalance.
    pub check_interval_s: u64,
    /// A node whose preferred partitions are led elsewhere in more than this percentage
    /// gets them back.
    pub per_broker_percentage: u32,
}

/// Most voters `controller.quorum.voters` may name.
pub const QUORUM_VOTERS_MAX: usize = 64;

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: line {line}: expected KEY=VALUE, got {text:?}")]
    Syntax {
        origin: String,
        line: usize,
        text: String,
    },
    #[error("config key {key}: invalid value {value:?}: {reason}")]
    Value {
        key: String,
        value: String,
        reason: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
}

/// Raw `key=value` pairs in the order of precedence they were applied (later wins).
#[derive(Debug, Clone, Default)]
pub struct Properties {
    values: BTreeMap<String, String>,
}

impl Properties {
    /// Parses Java-properties style text: `#`/`!` comments, `key=value` or `key: value`,
    /// and a line ending in an odd number of `\` continued on the next (its leading
    /// blanks dropped), as Kafka's documented multi-line `sasl.jaas.config` values are
    /// written. Other escapes (`\uXXXX`, `\=`) are not supported.
    pub fn parse(text: &str, origin: &str) -> Result<Properties, ConfigError> {
        let mut props = Properties::default();
        for (i, raw) in logical_lines(text) {
            let raw = raw.as_str();
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let Some(split) = line.find(['=', ':']) else {
                return Err(ConfigError::Syntax {
                    origin: origin.to_string(),
                    line: i + 1,
                    text: raw.to_string(),
                });
            };
            let key = line[..split].trim();
            let value = line[split + 1..].trim();
            props.set(key, value);
        }
        Ok(props)
    }

    /// Reads and parses a `server.properties` file.
    pub fn load(path: &Path) -> Result<Properties, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Properties::parse(&text, &path.display().to_string())
    }

    /// Parses one `--set KEY=VALUE` argument.
    pub fn set_arg(&mut self, arg: &str) -> Result<(), ConfigError> {
        match arg.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                self.set(k.trim(), v.trim());
                Ok(())
            }
            _ => Err(ConfigError::Syntax {
                origin: "--set".to_string(),
                line: 1,
                text: arg.to_string(),
            }),
        }
    }

    pub fn set(&mut self, key: &str, value: &str) {
        self.values.insert(key.to_string(), value.to_string());
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// These properties without `keys`.
    pub fn without(&self, keys: &[&str]) -> Properties {
        let mut values = self.values.clone();
        for key in keys {
            values.remove(*key);
        }
        Properties { values }
    }

    /// Every key set, in key order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    /// The first of `keys` that is set.
    fn first(&self, keys: &[&'static str]) -> Option<(&'static str, &str)> {
        keys.iter().find_map(|k| self.get(k).map(|v| (*k, v)))
    }

    fn parse_num<T: std::str::FromStr>(
        &self,
        keys: &[&'static str],
        default: T,
    ) -> Result<T, ConfigError> {
        match self.first(keys) {
            None => Ok(default),
            Some((key, value)) => value.parse().map_err(|_| ConfigError::Value {
                key: key.to_string(),
                value: value.to_string(),
                reason: "not a number in range",
            }),
        }
    }

    pub(crate) fn parse_bool(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
            Some(v) => Err(ConfigError::Value {
                key: key.to_string(),
                value: v.to_string(),
                reason: "expected true or false",
            }),
        }
    }
}

/// Where the shard threads run (`weir.shard.cpus`, weir's own key).
///
/// Thread-per-core wants each shard alone on its core, so by default shard `s` is pinned
/// to CPU `s mod cpus`. That default assumes one weir per host: several nodes on one
/// machine (a test cluster, a benchmark) would all put their shard 0 on CPU 0 and leave
/// the other cores to everything else. Such nodes set `none`, or give each its own list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ShardCpus {
    /// Shard `s` on CPU `s mod cpus` (unset, or `spread`).
    #[default]
    Spread,
    /// Not pinned: the kernel places and moves the threads (`none`).
    Unpinned,
    /// Shard `s` on the `s mod len`-th CPU of the list (`2,3` or `0-3`).
    List(Vec<usize>),
}

/// The highest CPU number `weir.shard.cpus` may name.
const SHARD_CPU_MAX: usize = 4095;

impl ShardCpus {
    /// Parses `spread`, `none` or a comma-separated list of CPUs and ranges (`0-3,6`).
    pub fn parse(value: Option<&str>) -> Result<ShardCpus, ConfigError> {
        let text = value.map(str::trim).unwrap_or("");
        let bad = |reason| value_err("weir.shard.cpus", text, reason);
        match text {
            "" | "spread" => return Ok(ShardCpus::Spread),
            "none" => return Ok(ShardCpus::Unpinned),
            _ => {}
        }
        let mut cpus = Vec::new();
        for part in text.split(',').map(str::trim) {
            let (first, last) = part.split_once('-').unwrap_or((part, part));
            let (Ok(first), Ok(last)) =
                (first.trim().parse::<usize>(), last.trim().parse::<usize>())
            else {
                return Err(bad("expected spread, none, or CPUs such as 0-3,6"));
            };
            if first > last || last > SHARD_CPU_MAX {
                return Err(bad("a CPU range must be ascending and below 4096"));
            }
            cpus.extend(first..=last);
        }
        Ok(ShardCpus::List(cpus))
    }

    /// The CPU shard `shard` is pinned to on a machine with `cpus` CPUs; `None`: unpinned.
    pub fn cpu_of(&self, shard: usize, cpus: usize) -> Option<usize> {
        match self {
            ShardCpus::Spread => Some(shard % cpus.max(1)),
            ShardCpus::Unpinned => None,
            // `parse` never yields an empty list.
            ShardCpus::List(list) => list.get(shard % list.len().max(1)).copied(),
        }
    }
}

/// `replica.selector.class` (KIP-392): whether a leader sends a consumer to a replica
/// closer to it. weir cannot load Java classes: it knows Kafka's two selectors by name
/// and refuses any other at startup, rather than run a different policy than the one
/// named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplicaSelector {
    /// Unset, or Kafka's `LeaderSelector`: consumers read from the leader.
    #[default]
    Leader,
    /// Kafka's `RackAwareReplicaSelector`: a consumer whose `rack_id` is another rack
    /// than the leader's is sent to an in-sync replica in its own rack.
    RackAware,
}

impl ReplicaSelector {
    pub const RACK_AWARE_CLASS: &'static str =
        "org.apache.kafka.common.replica.RackAwareReplicaSelector";
    pub const LEADER_CLASS: &'static str = "org.apache.kafka.common.replica.LeaderSelector";

    /// Parses the class name (blank: unset).
    pub fn parse(value: Option<&str>) -> Result<ReplicaSelector, ConfigError> {
        match value.map(str::trim).unwrap_or("") {
            "" | Self::LEADER_CLASS => Ok(ReplicaSelector::Leader),
            Self::RACK_AWARE_CLASS => Ok(ReplicaSelector::RackAware),
            other => Err(value_err(
                "replica.selector.class",
                other,
                "weir cannot load Java classes; it knows org.apache.kafka.common.replica.\
                 RackAwareReplicaSelector and org.apache.kafka.common.replica.LeaderSelector",
            )),
        }
    }
}

/// Everything the broker needs to know, resolved and checked.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_id: i32,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// `host:port` given to clients in Metadata; `None` means the bound address.
    pub advertised: Option<(String, u16)>,
    /// Every listener (`listeners`, ...); the first is `listen`/`advertised` above.
    pub listeners: Vec<crate::security::listener::ListenerConfig>,
    pub shards: usize,
    /// `weir.shard.cpus`: which CPU each shard thread is pinned to.
    pub shard_cpus: ShardCpus,
    pub num_partitions: i32,
    pub auto_create_topics: bool,
    /// Kafka's `delete.topic.enable`: false refuses every DeleteTopics.
    pub delete_topic_enable: bool,
    pub default_replication_factor: i16,
    pub min_insync_replicas: i32,
    pub message_max_bytes: u64,
    /// Kafka's `fetch.max.bytes`: caps every Fetch response, whatever the client asks.
    pub fetch_max_bytes: u64,
    /// weir's `fetch.response.buffer.max.bytes`: node-wide bound on unwritten responses.
    pub fetch_response_buffer_max_bytes: u64,
    /// Kafka's `max.incremental.fetch.session.cache.slots`: KIP-227 fetch sessions the node
    /// caches (split evenly per shard, at least one each unless 0, which disables them).
    pub fetch_session_cache_slots: u64,
    pub socket_request_max_bytes: u64,
    pub max_connections: u64,
    pub segment_bytes: u64,
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub retention_check_interval_ms: u64,
    /// weir's own key `log.flush.on.ack`: an ack also waits for fdatasync.
    pub flush_on_ack: bool,
    /// weir's `log.index.cache.bytes`: sealed segments' index entries the node keeps in
    /// memory (split evenly per shard); the rest are read from their files when needed.
    pub log_index_cache_bytes: u64,
    /// weir's `log.tail.cache.max.bytes`: recently appended batches all the node's logs
    /// keep in memory together (split evenly per shard), oldest out first; weir's stand-in
    /// for the page cache that O_DIRECT bypasses. Default 512 MiB (less on a small machine).
    pub log_tail_cache_max_bytes: u64,
    /// All raw properties, for keys passed through to topic defaults.
    pub props: Properties,
    /// `max.partitions`, `max.partitions.per.request`, `max.open.partitions` (weir's own).
    pub partition_limits: PartitionLimits,
    /// `queued.max.request.bytes`: budget for request frames being read or handled.
    pub queued_max_request_bytes: u64,
    /// `request.read.timeout.ms` (weir): deadline to finish a frame once it started.
    pub request_read_timeout_ms: u64,
    /// `connections.max.idle.ms`: a connection with nothing read or in flight this long is
    /// closed; negative (Kafka's -1): never ([`Config::connection_idle`]).
    pub connections_max_idle_ms: i64,
    /// `max.connections.per.ip` and its `max.connections.per.ip.overrides`.
    pub max_connections_per_ip: u64,
    pub max_connections_per_ip_overrides: BTreeMap<IpAddr, u64>,
    /// `controller.quorum.voters`: voter id → controller `HOST:PORT`. Empty: a single
    /// node (no controller thread, no controller port).
    pub quorum_voters: BTreeMap<i32, String>,
    /// `broker.heartbeat.interval.ms`, `broker.session.timeout.ms`,
    /// `controller.quorum.election.timeout.ms` (used only with voters).
    pub broker_heartbeat_interval_ms: u64,
    pub broker_session_timeout_ms: u64,
    pub controller_election_timeout_ms: u64,
    /// `auto.leader.rebalance.enable`, `leader.imbalance.check.interval.seconds`,
    /// `leader.imbalance.per.broker.percentage`: the active controller moves leadership
    /// back to preferred replicas (used only with voters).
    pub leader_rebalance: LeaderRebalance,
    /// `log.cleaner.enable`, `log.cleaner.dedupe.buffer.size` (for the node, divided among
    /// the shards), `log.cleaner.io.max.bytes.per.second` (per shard).
    pub log_cleaner: LogCleanerSettings,
    /// Broker configs set at runtime through the admin API (persisted in the data dir).
    pub dynamic: std::sync::Arc<dynamic::DynamicConfigs>,
    /// `authorizer.class.name`, `super.users`, `allow.everyone.if.no.acl.found`.
    pub authorizer: crate::security::authorizer::AuthorizerSettings,
    /// `replica.selector.class`: where a leader sends consumers (KIP-392).
    pub replica_selector: ReplicaSelector,
}

/// The log cleaner's node-level settings (Kafka's keys; see storage/cleaner.rs).
#[derive(Debug, Clone, Copy)]
pub struct LogCleanerSettings {
    pub enable: bool,
    /// `log.cleaner.backoff.ms`: how often a shard checks its logs for cleaning.
    pub backoff_ms: u64,
    pub dedupe_buffer_size: u64,
    /// `u64::MAX`: no limit (Kafka's default, `Double.MaxValue`).
    pub io_max_bytes_per_second: u64,
}

impl LogCleanerSettings {
    fn resolve(props: &Properties) -> Result<LogCleanerSettings, ConfigError> {
        let io: f64 = props.parse_num(&["log.cleaner.io.max.bytes.per.second"], f64::MAX)?;
        if io.is_nan() || io < 1.0 {
            return Err(value_err(
                "log.cleaner.io.max.bytes.per.second",
                &io.to_string(),
                "must be at least 1",
            ));
        }
        Ok(LogCleanerSettings {
            enable: props.parse_bool("log.cleaner.enable", true)?,
            backoff_ms: props.parse_num(&["log.cleaner.backoff.ms"], 15_000)?,
            dedupe_buffer_size: props.parse_num(
                &["log.cleaner.dedupe.buffer.size"],
                crate::storage::cleaner::DEDUPE_BUFFER_BYTES_DEFAULT,
            )?,
            // Saturating: f64::MAX and anything past u64::MAX mean no limit.
            io_max_bytes_per_second: io as u64,
        })
    }

    /// The budget of one shard of `shards`.
    pub fn shard_budget(&self, shards: usize) -> crate::storage::CleanerBudget {
        let share = self.dedupe_buffer_size / shards.max(1) as u64;
        crate::storage::CleanerBudget::new(share, self.io_max_bytes_per_second)
    }
}

/// Bounds on partition counts (see the `*_DEFAULT` constants for each key's meaning).
#[derive(Debug, Clone, Copy)]
pub struct PartitionLimits {
    pub max_partitions: u64,
    pub max_partitions_per_request: u64,
    pub max_open_partitions: u64,
}

impl PartitionLimits {
    fn resolve(props: &Properties) -> Result<PartitionLimits, ConfigError> {
        let limits = PartitionLimits {
            max_partitions: props.parse_num(&["max.partitions"], MAX_PARTITIONS_DEFAULT)?,
            max_partitions_per_request: props.parse_num(
                &["max.partitions.per.request"],
                MAX_PARTITIONS_PER_REQUEST_DEFAULT,
            )?,
            max_open_partitions: props
                .parse_num(&["max.open.partitions"], MAX_OPEN_PARTITIONS_DEFAULT)?,
        };
        for (key, v) in [
            ("max.partitions", limits.max_partitions),
            (
                "max.partitions.per.request",
                limits.max_partitions_per_request,
            ),
            ("max.open.partitions", limits.max_open_partitions),
        ] {
            if v == 0 || v > i32::MAX as u64 {
                return Err(value_err(key, &v.to_string(), "must be 1..=2147483647"));
            }
        }
        Ok(limits)
    }
}

/// Values given on the command line; they win over `--config` and `--set`.
#[derive(Debug, Default, Clone)]
pub struct CliOverrides {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<String>,
    pub advertised_listener: Option<String>,
    pub node_id: Option<i32>,
    pub shards: Option<usize>,
}

impl Config {
    /// `connections.max.idle.ms` as a duration; `None` when negative: idle connections
    /// are never closed (Kafka's Selector skips its idle expiry then).
    pub fn connection_idle(&self) -> Option<std::time::Duration> {
        u64::try_from(self.connections_max_idle_ms)
            .ok()
            .map(std::time::Duration::from_millis)
    }

    /// Resolves the final configuration: file, then `--set`, then dedicated flags.
    pub fn resolve(props: Properties, cli: &CliOverrides) -> Result<Config, ConfigError> {
        let data_dir = match (&cli.data_dir, props.first(&["log.dirs", "log.dir"])) {
            (Some(d), _) => d.clone(),
            // Kafka allows a comma-separated list; weir uses one directory per node.
            (None, Some((_, v))) => PathBuf::from(v.split(',').next().unwrap_or(v).trim()),
            (None, None) => PathBuf::from("./weir-data"),
        };
        let listeners = crate::security::listener::resolve(
            &props,
            cli.listen.as_deref(),
            cli.advertised_listener.as_deref(),
        )?;
        let listen = listeners[0].bind;
        let advertised = listeners[0].advertised.clone();
        let default_shards = std::thread::available_parallelism().map_or(1, |n| n.get());
        let shards = cli
            .shards
            .unwrap_or(props.parse_num(&["weir.shards"], default_shards)?);
        if shards == 0 || shards > 1024 {
            return Err(value_err(
                "--shards",
                &shards.to_string(),
                "must be 1..=1024",
            ));
        }
        let retention_ms = retention_ms(&props)?;
        let dynamic = std::sync::Arc::new(dynamic::DynamicConfigs::load(&data_dir)?);
        let config = Config {
            node_id: match cli.node_id {
                Some(n) => n,
                None => props.parse_num(&["node.id", "broker.id"], 0)?,
            },
            data_dir,
            listen,
            advertised,
            listeners,
            shards,
            shard_cpus: ShardCpus::parse(props.get("weir.shard.cpus"))?,
            num_partitions: props.parse_num(&["num.partitions"], 1)?,
            auto_create_topics: props.parse_bool("auto.create.topics.enable", true)?,
            delete_topic_enable: props.parse_bool("delete.topic.enable", true)?,
            default_replication_factor: props.parse_num(&["default.replication.factor"], 1)?,
            min_insync_replicas: props.parse_num(&["min.insync.replicas"], 1)?,
            message_max_bytes: props
                .parse_num(&["message.max.bytes"], MESSAGE_MAX_BYTES_DEFAULT)?,
            fetch_max_bytes: props.parse_num(&["fetch.max.bytes"], FETCH_MAX_BYTES_DEFAULT)?,
            fetch_response_buffer_max_bytes: props.parse_num(
                &["fetch.response.buffer.max.bytes"],
                FETCH_RESPONSE_BUFFER_MAX_BYTES_DEFAULT,
            )?,
            fetch_session_cache_slots: props.parse_num(
                &["max.incremental.fetch.session.cache.slots"],
                FETCH_SESSION_CACHE_SLOTS_DEFAULT,
            )?,
            socket_request_max_bytes: props.parse_num(
                &["socket.request.max.bytes"],
                SOCKET_REQUEST_MAX_BYTES_DEFAULT,
            )?,
            max_connections: props.parse_num(&["max.connections"], MAX_CONNECTIONS_DEFAULT)?,
            segment_bytes: props.parse_num(
                &["log.segment.bytes", "segment.bytes"],
                SEGMENT_BYTES_DEFAULT,
            )?,
            retention_ms,
            retention_bytes: props.parse_num(&["log.retention.bytes", "retention.bytes"], -1)?,
            retention_check_interval_ms: props.parse_num(
                &["log.retention.check.interval.ms"],
                RETENTION_CHECK_INTERVAL_MS_DEFAULT,
            )?,
            flush_on_ack: props.parse_bool("log.flush.on.ack", false)?,
            log_index_cache_bytes: props.parse_num(
                &["log.index.cache.bytes"],
                crate::storage::INDEX_CACHE_BYTES_DEFAULT,
            )?,
            log_tail_cache_max_bytes: props.parse_num(
                &["log.tail.cache.max.bytes"],
                crate::storage::node_tail_cache_bytes_default(),
            )?,
            partition_limits: PartitionLimits::resolve(&props)?,
            queued_max_request_bytes: props.parse_num(
                &["queued.max.request.bytes"],
                QUEUED_MAX_REQUEST_BYTES_DEFAULT,
            )?,
            request_read_timeout_ms: props.parse_num(
                &["request.read.timeout.ms"],
                REQUEST_READ_TIMEOUT_MS_DEFAULT,
            )?,
            connections_max_idle_ms: props.parse_num(
                &["connections.max.idle.ms"],
                CONNECTIONS_MAX_IDLE_MS_DEFAULT,
            )?,
            max_connections_per_ip: props
                .parse_num(&["max.connections.per.ip"], MAX_CONNECTIONS_PER_IP_DEFAULT)?,
            max_connections_per_ip_overrides: per_ip_overrides(&props)?,
            quorum_voters: quorum_voters(&props)?,
            broker_heartbeat_interval_ms: props.parse_num(
                &["broker.heartbeat.interval.ms"],
                BROKER_HEARTBEAT_INTERVAL_MS_DEFAULT,
            )?,
            broker_session_timeout_ms: props.parse_num(
                &["broker.session.timeout.ms"],
                BROKER_SESSION_TIMEOUT_MS_DEFAULT,
            )?,
            controller_election_timeout_ms: props.parse_num(
                &["controller.quorum.election.timeout.ms"],
                CONTROLLER_ELECTION_TIMEOUT_MS_DEFAULT,
            )?,
            leader_rebalance: LeaderRebalance {
                enable: props.parse_bool("auto.leader.rebalance.enable", true)?,
                check_interval_s: props.parse_num(
                    &["leader.imbalance.check.interval.seconds"],
                    LEADER_IMBALANCE_CHECK_INTERVAL_S_DEFAULT,
                )?,
                per_broker_percentage: props.parse_num(
                    &["leader.imbalance.per.broker.percentage"],
                    LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT,
                )?,
            },
            log_cleaner: LogCleanerSettings::resolve(&props)?,
            authorizer: crate::security::authorizer::AuthorizerSettings::resolve(&props)?,
            replica_selector: ReplicaSelector::parse(props.get("replica.selector.class"))?,
            props,
            dynamic,
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.num_partitions < 1 {
            return Err(value_err(
                "num.partitions",
                &self.num_partitions.to_string(),
                "must be >= 1",
            ));
        }
        self.check_quorum()?;
        if self.min_insync_replicas < 1 {
            let v = self.min_insync_replicas.to_string();
            return Err(value_err("min.insync.replicas", &v, "must be >= 1"));
        }
        if self.message_max_bytes > i32::MAX as u64 || self.message_max_bytes == 0 {
            let v = self.message_max_bytes.to_string();
            return Err(value_err("message.max.bytes", &v, "must be 1..=2147483647"));
        }
        if self.fetch_max_bytes > i32::MAX as u64 || self.fetch_max_bytes < 1024 {
            let v = self.fetch_max_bytes.to_string();
            return Err(value_err(
                "fetch.max.bytes",
                &v,
                "must be 1024..=2147483647",
            ));
        }
        if self.fetch_response_buffer_max_bytes < 1 << 20 {
            let v = self.fetch_response_buffer_max_bytes.to_string();
            return Err(value_err(
                "fetch.response.buffer.max.bytes",
                &v,
                "must be at least 1048576",
            ));
        }
        if self.fetch_session_cache_slots > FETCH_SESSION_CACHE_SLOTS_MAX {
            let v = self.fetch_session_cache_slots.to_string();
            return Err(value_err(
                "max.incremental.fetch.session.cache.slots",
                &v,
                "must be 0..=100000",
            ));
        }
        if self.socket_request_max_bytes > i32::MAX as u64 || self.socket_request_max_bytes < 64 {
            let v = self.socket_request_max_bytes.to_string();
            return Err(value_err(
                "socket.request.max.bytes",
                &v,
                "must be 64..=2147483647",
            ));
        }
        if !(0..=NODE_ID_MAX).contains(&self.node_id) {
            let v = self.node_id.to_string();
            return Err(value_err("node.id", &v, "must be 0..=32767"));
        }
        self.check_integer_keys()?;
        self.check_topic_defaults()?;
        self.check_not_supported()?;
        self.check_connection_limits()
    }

    /// Kafka settings weir cannot honour and must not run without: a topic policy is
    /// an operator's guard (a Java class weir cannot load), and bootstrap servers without
    /// `controller.quorum.voters` would start each node as its own one-node cluster.
    fn check_not_supported(&self) -> Result<(), ConfigError> {
        for key in [
            "create.topic.policy.class.name",
            "alter.config.policy.class.name",
        ] {
            if let Some(v) = self.props.get(key).filter(|v| !v.trim().is_empty()) {
                return Err(value_err(
                    key,
                    v,
                    "weir cannot run Kafka's Java policy classes; remove it (see docs/LIMITS.md)",
                ));
            }
        }
        // KIP-368's session lifetime, broker-wide or per listener (and mechanism):
        // checked here so that a bad value stops the start with its key named.
        let sasl = crate::security::sasl::REAUTH_KEY;
        for key in self.props.keys().filter(|k| k.ends_with(sasl)) {
            let Some(v) = self.props.get(key) else {
                continue;
            };
            if crate::security::sasl::parse_reauth_ms(v).is_none() {
                return Err(value_err(key, v, crate::security::sasl::REAUTH_RANGE));
            }
        }
        // Checked with the rest, so a bad value stops the start before anything is
        // written (a single node stores the credentials once, with a new data dir).
        let scram = crate::security::scram_bootstrap::KEY;
        if let Some(v) = self.props.get(scram) {
            crate::security::scram_bootstrap::parse(v)
                .map_err(|e| ConfigError::Invalid(format!("{e:#}")))?;
        }
        let key = "controller.quorum.bootstrap.servers";
        if let Some(v) = self.props.get(key).filter(|v| !v.trim().is_empty())
            && self.quorum_voters.is_empty()
        {
            return Err(value_err(
                key,
                v,
                "weir forms its quorum from controller.quorum.voters (a static quorum, no \
                 KIP-853 bootstrap); set controller.quorum.voters instead",
            ));
        }
        Ok(())
    }

    /// Keys read where they are used (the group and transaction coordinators, the
    /// replica manager) are checked here, so a bad value stops the start with a message
    /// instead of being clamped, wrapped or replaced by the default at first use.
    fn check_integer_keys(&self) -> Result<(), ConfigError> {
        for &(key, min, max) in INTEGER_KEYS {
            let Some(v) = self.props.get(key) else {
                continue;
            };
            match v.trim().parse::<i64>() {
                Ok(n) if (min..=max).contains(&n) => {}
                Ok(_) => return Err(value_err(key, v, "out of range (see docs/LIMITS.md)")),
                Err(_) => return Err(value_err(key, v, "not an integer")),
            }
        }
        let min = self.props.get("group.min.session.timeout.ms");
        let max = self.props.get("group.max.session.timeout.ms");
        let parse = |v: Option<&str>, d: i64| v.and_then(|v| v.trim().parse().ok()).unwrap_or(d);
        if parse(min, 6_000) > parse(max, 1_800_000) {
            let v = max.unwrap_or("1800000");
            return Err(value_err(
                "group.max.session.timeout.ms",
                v,
                "must be >= group.min.session.timeout.ms",
            ));
        }
        Ok(())
    }

    /// The broker's topic defaults (`log.retention.*`, `log.segment.bytes`,
    /// `log.cleanup.policy`, ...) are checked as a partition's log would read them: a log
    /// opens at first use, so a bad default would otherwise fail every partition then.
    fn check_topic_defaults(&self) -> Result<(), ConfigError> {
        let defaults = self.log_defaults();
        if let Some(v) = defaults.get("compression.type")
            && crate::partition::TopicCompression::parse(v).is_none()
        {
            return Err(value_err(
                "compression.type",
                v,
                "must be one of uncompressed, zstd, lz4, snappy, gzip, producer",
            ));
        }
        for (key, _) in crate::partition::COMPRESSION_LEVEL_DEFAULTS {
            if let Some(v) = defaults.get(key)
                && crate::partition::compression_level_valid(key, v) == Some(false)
            {
                return Err(value_err(key, v, "is outside Kafka's range for the codec"));
            }
        }
        let pairs = defaults.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        crate::storage::LogConfig::from_pairs(pairs)
            .map(drop)
            .map_err(|e| ConfigError::Invalid(format!("broker topic defaults: {e}")))
    }

    /// The connection and request-read limits are bounded: weir refuses Kafka's -1
    /// (unbounded) for `queued.max.request.bytes`, and a zero timeout would close every
    /// connection at once.
    fn check_connection_limits(&self) -> Result<(), ConfigError> {
        if self.queued_max_request_bytes == 0 {
            return Err(value_err(
                "queued.max.request.bytes",
                "0",
                "must be >= 1 (weir always bounds request memory)",
            ));
        }
        if self.request_read_timeout_ms == 0 {
            return Err(value_err("request.read.timeout.ms", "0", "must be > 0"));
        }
        if self.connections_max_idle_ms == 0 {
            return Err(value_err(
                "connections.max.idle.ms",
                "0",
                "must be > 0, or -1 for never",
            ));
        }
        Ok(())
    }

    /// The quorum's timings must leave a heartbeat room inside a session, and a node id
    /// must be a valid Kafka broker id.
    fn check_quorum(&self) -> Result<(), ConfigError> {
        if self.quorum_voters.is_empty() {
            return Ok(());
        }
        // A single node advertises 127.0.0.1 for a wildcard bind; a cluster node would
        // send its peers and remote clients to their own host.
        if let Some(l) = self
            .listeners
            .iter()
            .find(|l| l.advertised.is_none() && l.bind.ip().is_unspecified())
        {
            return Err(value_err(
                "advertised.listeners",
                &l.name,
                "a cluster node's listener bound to a wildcard address needs an \
                 advertised.listeners entry (peers and clients cannot reach it at 127.0.0.1)",
            ));
        }
        if self.node_id < 0 {
            let v = self.node_id.to_string();
            return Err(value_err("node.id", &v, "must be >= 0"));
        }
        if self.broker_heartbeat_interval_ms == 0
            || self.broker_session_timeout_ms < 2 * self.broker_heartbeat_interval_ms
        {
            let v = self.broker_session_timeout_ms.to_string();
            return Err(value_err(
                "broker.session.timeout.ms",
                &v,
                "must be at least twice broker.heartbeat.interval.ms (> 0)",
            ));
        }
        if !(50..=60_000).contains(&self.controller_election_timeout_ms) {
            let v = self.controller_election_timeout_ms.to_string();
            return Err(value_err(
                "controller.quorum.election.timeout.ms",
                &v,
                "must be 50..=60000",
            ));
        }
        let r = self.leader_rebalance;
        if !(1..=86_400).contains(&r.check_interval_s) {
            let v = r.check_interval_s.to_string();
            return Err(value_err(
                "leader.imbalance.check.interval.seconds",
                &v,
                "must be 1..=86400",
            ));
        }
        if r.per_broker_percentage > 100 {
            let v = r.per_broker_percentage.to_string();
            return Err(value_err(
                "leader.imbalance.per.broker.percentage",
                &v,
                "must be 0..=100",
            ));
        }
        Ok(())
    }

    /// The `max.connections.per.ip` limit for one address (its override if it has one).
    pub fn max_connections_for(&self, ip: IpAddr) -> u64 {
        self.max_connections_per_ip_overrides
            .get(&ip)
            .copied()
            .unwrap_or(self.max_connections_per_ip)
    }

    /// `broker.rack`: the rack (or zone) this node is in, `None` unless set and not
    /// blank. Registered with the controller, answered in Metadata and DescribeCluster,
    /// and used to spread a new partition's replicas over racks.
    pub fn rack(&self) -> Option<&str> {
        self.props
            .get("broker.rack")
            .map(str::trim)
            .filter(|r| !r.is_empty())
    }

    /// What a partition's log and producer state are opened with before the topic's own
    /// overrides: the broker-only storage keys (no topic-level name), `log.flush.on.ack`,
    /// then [`Config::topic_defaults`].
    pub fn log_defaults(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        for key in [
            "log.tail.cache.bytes",
            "log.read.ahead.bytes",
            "producer.id.expiration.ms",
        ] {
            if let Some(v) = self.props.get(key) {
                m.insert(key.to_string(), v.to_string());
            }
        }
        if self.flush_on_ack {
            m.insert("log.flush.on.ack".into(), "true".into());
        }
        m.extend(self.topic_defaults());
        m
    }

    /// Broker-level defaults for topic configs, under the topic-level key names.
    pub fn topic_defaults(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("retention.ms".into(), self.retention_ms.to_string());
        m.insert("retention.bytes".into(), self.retention_bytes.to_string());
        m.insert("segment.bytes".into(), self.segment_bytes.to_string());
        m.insert(
            "cleanup.policy".into(),
            self.props
                .get("log.cleanup.policy")
                .unwrap_or("delete")
                .into(),
        );
        m.insert(
            "max.message.bytes".into(),
            self.message_max_bytes.to_string(),
        );
        m.insert(
            "min.insync.replicas".into(),
            self.min_insync_replicas.to_string(),
        );
        // Kafka's broker key has the topic key's name; `producer` stores batches as sent.
        m.insert(
            "compression.type".into(),
            self.props
                .get("compression.type")
                .unwrap_or("producer")
                .into(),
        );
        // The cleaner's broker defaults, under their topic-level names.
        for (broker_key, topic_key) in [
            (
                "log.cleaner.min.cleanable.ratio",
                "min.cleanable.dirty.ratio",
            ),
            ("log.cleaner.delete.retention.ms", "delete.retention.ms"),
            ("log.cleaner.min.compaction.lag.ms", "min.compaction.lag.ms"),
            ("log.cleaner.max.compaction.lag.ms", "max.compaction.lag.ms"),
            ("log.roll.ms", "segment.ms"),
            // Under their topic names, so that a topic's own value replaces them (the raw
            // broker keys beside a topic's override were applied in key order, and
            // `log.flush.interval.messages` sorts after `flush.messages`: the broker won).
            ("log.flush.interval.messages", "flush.messages"),
            ("log.flush.interval.ms", "flush.ms"),
            ("log.index.interval.bytes", "index.interval.bytes"),
            ("log.index.size.max.bytes", "segment.index.bytes"),
            ("log.preallocate", "preallocate"),
            ("log.segment.delete.delay.ms", "file.delete.delay.ms"),
            (
                "log.message.timestamp.before.max.ms",
                "message.timestamp.before.max.ms",
            ),
            (
                "log.message.timestamp.after.max.ms",
                "message.timestamp.after.max.ms",
            ),
        ] {
            if let Some(v) = self.props.get(broker_key) {
                m.insert(topic_key.into(), v.into());
            }
        }
        // Kafka's `log.roll.hours`, when `log.roll.ms` is not set.
        if !m.contains_key("segment.ms")
            && let Some(hours) = self.props.get("log.roll.hours")
        {
            let ms = match hours.trim().parse::<i64>() {
                Ok(h) => h.saturating_mul(3_600_000).to_string(),
                // Left for the log's own check to refuse, naming the value.
                Err(_) => hours.to_string(),
            };
            m.insert("segment.ms".into(), ms);
        }
        let ts_type = self
            .props
            .get("log.message.timestamp.type")
            .unwrap_or("CreateTime");
        m.insert("message.timestamp.type".into(), ts_type.into());
        // KIP-390's levels: the broker's keys have the topic keys' names.
        for (key, default) in crate::partition::COMPRESSION_LEVEL_DEFAULTS {
            m.insert(key.into(), self.props.get(key).unwrap_or(default).into());
        }
        // Kafka's defaults, described even when not set.
        m.entry("message.timestamp.before.max.ms".into())
            .or_insert_with(|| i64::MAX.to_string());
        m.entry("message.timestamp.after.max.ms".into())
            .or_insert_with(|| crate::storage::MESSAGE_TIMESTAMP_AFTER_MAX_MS_DEFAULT.to_string());
        // Dynamic broker configs (AlterConfigs on the BROKER resource) win over static ones.
        for (broker_key, topic_key) in keys::DYNAMIC_APPLIED {
            if let Some(v) = self.dynamic.get(broker_key) {
                m.insert((*topic_key).to_string(), v);
            }
        }
        m
    }
}

/// Kafka's retention precedence: `log.retention.ms` > `.minutes` > `.hours`; weir also
/// accepts the topic-level name `retention.ms` as a broker default.
/// The logical lines of a properties text, each with its first physical line's index:
/// a line ending in an odd number of backslashes goes on with the next one.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        let piece = if open { line.trim_start() } else { line };
        let trailing = piece.len() - piece.trim_end_matches('\\').len();
        let continues = trailing % 2 == 1;
        let piece = if continues {
            &piece[..piece.len() - 1]
        } else {
            piece
        };
        match (open, out.last_mut()) {
            (true, Some((_, text))) => text.push_str(piece),
            _ => out.push((i, piece.to_string())),
        }
        // A comment line does not continue (Java's rule).
        let comment = !open && matches!(piece.trim_start().chars().next(), Some('#' | '!'));
        open = continues && !comment;
    }
    out
}

/// Any negative value means no time limit (-1), as in Kafka: `log.retention.hours=-1`
/// is a common way to say "keep forever".
fn retention_ms(props: &Properties) -> Result<i64, ConfigError> {
    let ms = if props.first(&["log.retention.ms", "retention.ms"]).is_some() {
        props.parse_num(&["log.retention.ms", "retention.ms"], RETENTION_MS_DEFAULT)?
    } else if props.get("log.retention.minutes").is_some() {
        let m: i64 = props.parse_num(&["log.retention.minutes"], 0)?;
        m.saturating_mul(60_000)
    } else {
        let h: i64 = props.parse_num(&["log.retention.hours"], 168)?;
        h.saturating_mul(3_600_000)
    };
    Ok(if ms < 0 { -1 } else { ms })
}

/// `max.connections.per.ip.overrides`: `IP:COUNT` pairs separated by commas (Kafka's
/// syntax; weir takes IP literals only, since a host name resolved once at startup would
/// silently go stale). An IPv6 address is written bare or in brackets: `[::1]:5`.
fn per_ip_overrides(props: &Properties) -> Result<BTreeMap<IpAddr, u64>, ConfigError> {
    const KEY: &str = "max.connections.per.ip.overrides";
    let mut out = BTreeMap::new();
    let Some(text) = props.get(KEY) else {
        return Ok(out);
    };
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = || value_err(KEY, text, "expected IP:COUNT[,IP:COUNT...]");
        let (ip, count) = item.rsplit_once(':').ok_or_else(bad)?;
        let ip = ip.trim().trim_start_matches('[').trim_end_matches(']');
        let ip: IpAddr = ip.parse().map_err(|_| bad())?;
        let count: u64 = count.trim().parse().map_err(|_| bad())?;
        out.insert(ip, count);
    }
    Ok(out)
}

/// `controller.quorum.voters`: `ID@HOST:PORT,...` (Kafka's syntax), each voter's
/// controller address.
fn quorum_voters(props: &Properties) -> Result<BTreeMap<i32, String>, ConfigError> {
    const KEY: &str = "controller.quorum.voters";
    let mut out = BTreeMap::new();
    let Some(text) = props.get(KEY) else {
        return Ok(out);
    };
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = || value_err(KEY, text, "expected ID@HOST:PORT[,ID@HOST:PORT...]");
        let (id, addr) = item.split_once('@').ok_or_else(bad)?;
        let id: i32 = id.trim().parse().map_err(|_| bad())?;
        if id < 0 {
            return Err(bad());
        }
        let addr = addr.trim();
        crate::security::listener::parse_addr(KEY, addr)?;
        if out.insert(id, addr.to_string()).is_some() {
            return Err(value_err(KEY, text, "a voter id is named twice"));
        }
    }
    if out.len() > QUORUM_VOTERS_MAX {
        return Err(value_err(KEY, text, "more than 64 voters"));
    }
    Ok(out)
}

/// The largest node id: producer ids carry it in 15 bits (`producer_state::allocator`).
pub const NODE_ID_MAX: i32 = 0x7FFF;

/// Integer keys read outside `Config` and their ranges (Kafka's, where it has one; a
/// time in minutes must not overflow once in milliseconds).
const INTEGER_KEYS: &[(&str, i64, i64)] = &[
    ("offsets.topic.num.partitions", 1, 1_000),
    ("offsets.topic.segment.bytes", 1, i32::MAX as i64),
    ("offsets.topic.replication.factor", 1, i16::MAX as i64),
    ("offsets.retention.minutes", 1, i32::MAX as i64),
    ("offsets.retention.check.interval.ms", 1, i64::MAX),
    ("offset.metadata.max.bytes", 0, i32::MAX as i64),
    ("group.min.session.timeout.ms", 0, i32::MAX as i64),
    ("group.max.session.timeout.ms", 0, i32::MAX as i64),
    ("group.initial.rebalance.delay.ms", 0, i32::MAX as i64),
    ("group.max.size", 1, i32::MAX as i64),
    ("transaction.state.log.segment.bytes", 1, i32::MAX as i64),
    ("replica.lag.time.max.ms", 1, i64::MAX),
    // Kafka's ranges; a bad value used to become the default (or be clamped) silently.
    ("transaction.state.log.num.partitions", 1, 1_000),
    (
        "transaction.state.log.replication.factor",
        1,
        i16::MAX as i64,
    ),
    ("transaction.state.log.min.isr", 1, i32::MAX as i64),
    ("transaction.max.timeout.ms", 1, i32::MAX as i64),
    ("transactional.id.expiration.ms", 1, i32::MAX as i64),
    (
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        1,
        i32::MAX as i64,
    ),
    (
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        1,
        i32::MAX as i64,
    ),
    ("producer.id.expiration.ms", 1, i32::MAX as i64),
    ("replica.fetch.max.bytes", 0, i32::MAX as i64),
    // Kafka types these as int without a range (weir clamps where it reads them).
    ("replica.fetch.min.bytes", i32::MIN as i64, i32::MAX as i64),
    (
        "replica.fetch.wait.max.ms",
        i32::MIN as i64,
        i32::MAX as i64,
    ),
    ("replica.fetch.response.max.bytes", 0, i32::MAX as i64),
    ("replica.high.watermark.checkpoint.interval.ms", 0, i64::MAX),
    ("log.retention.check.interval.ms", 1, i64::MAX),
    ("weir.shard.stall.warn.ms", 0, i64::MAX),
];

fn value_err(key: &str, value: &str, reason: &'static str) -> ConfigError {
    ConfigError::Value {
        key: key.to_string(),
        value: value.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `weir.shard.cpus`: the default spreads shards over the CPUs, `none` unpins them, a
    /// list (with ranges) places shard `s` on its `s mod len`-th CPU; anything else is an
    /// error naming the key.
    #[test]
    fn shard_cpus_spread_unpinned_or_listed() {
        let parse = |v: Option<&str>| ShardCpus::parse(v);
        let ok = |v: Option<&str>| ShardCpus::parse(v).ok();
        assert_eq!(ok(None), Some(ShardCpus::Spread));
        assert_eq!(ok(Some("spread")), Some(ShardCpus::Spread));
        assert_eq!(ok(Some(" none ")), Some(ShardCpus::Unpinned));
        assert_eq!(ok(Some("1")), Some(ShardCpus::List(vec![1])));
        let listed = parse(Some("2-4, 7")).expect("a list");
        assert_eq!(listed, ShardCpus::List(vec![2, 3, 4, 7]));
        let placed: Vec<_> = (0..5).map(|s| listed.cpu_of(s, 8)).collect();
        assert_eq!(placed, [Some(2), Some(3), Some(4), Some(7), Some(2)]);
        assert_eq!(ShardCpus::Spread.cpu_of(3, 2), Some(1));
        assert_eq!(ShardCpus::Unpinned.cpu_of(0, 2), None);
        for bad in ["3-1", "a", "1,", "-2", "1-99999"] {
            let e = parse(Some(bad)).expect_err(bad);
            assert!(e.to_string().contains("weir.shard.cpus"), "{bad}: {e}");
        }
    }

    #[test]
    fn file_then_set_then_flags() {
        let mut p = Properties::parse(
            "# comment\nlog.dirs=/a,/b\nnum.partitions = 3\nlisteners=PLAINTEXT://127.0.0.1:9999\n",
            "test",
        )
        .unwrap();
        p.set_arg("num.partitions=5").unwrap();
        let cli = CliOverrides {
            shards: Some(2),
            ..Default::default()
        };
        let c = Config::resolve(p, &cli).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/a"));
        assert_eq!(c.num_partitions, 5);
        assert_eq!(c.listen.port(), 9999);
        assert_eq!(c.shards, 2);
        assert_eq!(c.message_max_bytes, MESSAGE_MAX_BYTES_DEFAULT);
    }

    #[test]
    fn a_line_ending_in_a_backslash_goes_on_with_the_next() {
        let text = "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n    user_admin=\"s\";\n# a comment \\\nnum.partitions=3\npath=C:\\\\\nlast=1\n";
        let p = Properties::parse(text, "t").unwrap();
        assert_eq!(
            p.get("sasl.jaas.config"),
            Some(
                "org.apache.kafka.common.security.plain.PlainLoginModule required user_admin=\"s\";"
            )
        );
        assert_eq!(p.get("num.partitions"), Some("3"));
        // An even number of backslashes ends the line (an escaped backslash).
        assert_eq!(p.get("path"), Some("C:\\\\"));
        assert_eq!(p.get("last"), Some("1"));
    }

    #[test]
    fn retention_precedence_and_bad_values() {
        let mut p = Properties::default();
        p.set("log.retention.hours", "1");
        let c = Config::resolve(p.clone(), &CliOverrides::default()).unwrap();
        assert_eq!(c.retention_ms, 3_600_000);
        p.set("log.retention.ms", "5");
        assert_eq!(
            Config::resolve(p.clone(), &CliOverrides::default())
                .unwrap()
                .retention_ms,
            5
        );
        p.set("num.partitions", "zero");
        assert!(Config::resolve(p, &CliOverrides::default()).is_err());
        assert!(Properties::parse("novalue\n", "t").is_err());
        assert!(Properties::default().set_arg("=x").is_err());
    }

    /// Kafka's "keep forever" is any negative retention; bad topic defaults, out-of-range
    /// coordinator keys and node ids stop the start instead of failing every partition,
    /// clamping or wrapping later.
    /// A wildcard bind is advertised as 127.0.0.1 on a single node only: a cluster node
    /// needs an advertised address, and no advertised address may be empty or 0.0.0.0.
    #[test]
    fn cluster_nodes_need_a_reachable_advertised_address() {
        let resolve = |pairs: &[(&str, &str)]| {
            let mut p = Properties::default();
            for (k, v) in pairs {
                p.set(k, v);
            }
            Config::resolve(p, &CliOverrides::default())
        };
        let cluster = [
            ("node.id", "1"),
            ("controller.quorum.voters", "1@127.0.0.1:9093"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut all = cluster.to_vec();
            all.extend_from_slice(extra);
            resolve(&all)
        };
        assert!(resolve(&[("listeners", "PLAINTEXT://0.0.0.0:9092")]).is_ok());
        assert!(with(&[("listeners", "PLAINTEXT://0.0.0.0:9092")]).is_err());
        assert!(with(&[("listeners", "PLAINTEXT://:9092")]).is_err());
        assert!(
            with(&[
                ("listeners", "PLAINTEXT://0.0.0.0:9092"),
                ("advertised.listeners", "PLAINTEXT://b1.example:9092"),
            ])
            .is_ok()
        );
        for bad in [
            "PLAINTEXT://0.0.0.0:9092",
            "PLAINTEXT://:9092",
            "PLAINTEXT://[::]:9092",
        ] {
            let r = resolve(&[
                ("listeners", "PLAINTEXT://127.0.0.1:9092"),
                ("advertised.listeners", bad),
            ]);
            assert!(r.is_err(), "{bad} advertised");
        }
    }

    #[test]
    fn negative_retention_is_unlimited_and_bad_defaults_stop_the_start() {
        let resolve = |pairs: &[(&str, &str)]| {
            let mut p = Properties::default();
            for (k, v) in pairs {
                p.set(k, v);
            }
            Config::resolve(p, &CliOverrides::default())
        };
        for key in [
            "log.retention.hours",
            "log.retention.minutes",
            "log.retention.ms",
        ] {
            let c = resolve(&[(key, "-1")]).unwrap();
            assert_eq!(c.retention_ms, -1, "{key}");
            let defaults = c.topic_defaults();
            let pairs = defaults.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            assert!(
                crate::storage::LogConfig::from_pairs(pairs).is_ok(),
                "{key}"
            );
        }
        assert_eq!(
            resolve(&[("log.retention.ms", "-5")]).unwrap().retention_ms,
            -1
        );
        for bad in [
            ("log.segment.bytes", "4294967296"),
            ("log.cleanup.policy", "Compact"),
            ("offsets.retention.minutes", "-1"),
            ("offsets.retention.minutes", "9223372036854775807"),
            ("offsets.topic.segment.bytes", "4294967296"),
            ("transaction.state.log.segment.bytes", "4294967296"),
            ("group.max.session.timeout.ms", "3000000000"),
            ("group.max.session.timeout.ms", "1000"),
            ("replica.lag.time.max.ms", "soon"),
            ("node.id", "40000"),
            ("node.id", "-1"),
            // Storage keys that used to pass the start and fail every partition's open.
            ("log.flush.interval.messages", "0"),
            ("log.index.interval.bytes", "lots"),
            ("log.index.size.max.bytes", "3"),
            ("log.index.cache.bytes", "64MB"),
            ("log.index.cache.bytes", "-1"),
            ("log.tail.cache.bytes", "64MB"),
            ("log.tail.cache.max.bytes", "-1"),
            ("log.read.ahead.bytes", "-1"),
            ("log.roll.hours", "0"),
            ("log.preallocate", "yes"),
            ("delete.topic.enable", "no"),
            ("create.topic.policy.class.name", "com.example.Policy"),
            ("alter.config.policy.class.name", "com.example.Policy"),
            ("controller.quorum.bootstrap.servers", "127.0.0.1:9093"),
            ("connections.max.reauth.ms", "soon"),
            (
                "listener.name.sasl_ssl.scram-sha-256.connections.max.reauth.ms",
                "1h",
            ),
            ("scram.bootstrap.credentials", "SCRAM-SHA-512=[name=alice]"),
            ("transaction.state.log.min.isr", "two"),
            ("transaction.max.timeout.ms", "0"),
            ("producer.id.expiration.ms", "-5"),
            ("replica.fetch.wait.max.ms", "soon"),
            ("compression.type", "brotli"),
            ("compression.type", "none"),
            ("compression.gzip.level", "0"),
            ("compression.lz4.level", "18"),
            ("compression.zstd.level", "23"),
        ] {
            assert!(resolve(&[bad]).is_err(), "{bad:?} accepted");
        }
        assert!(resolve(&[("node.id", "32767"), ("offsets.retention.minutes", "1")]).is_ok());
        assert!(resolve(&[("connections.max.reauth.ms", "0")]).is_ok());
        assert!(
            resolve(&[("connections.max.reauth.ms", "-1")]).is_ok(),
            "off, as Kafka"
        );
        assert!(resolve(&[("connections.max.reauth.ms", "3600000")]).is_ok());
        let by_mechanism = "listener.name.sasl_ssl.scram-sha-256.connections.max.reauth.ms";
        assert!(resolve(&[(by_mechanism, "60000")]).is_ok());
    }

    /// `replica.selector.class`: Kafka's two selectors by name, unset = leader only, any
    /// other class refused at startup with a message naming the key.
    #[test]
    fn the_replica_selector_is_one_of_kafkas_two_or_the_start_is_refused() {
        let resolve = |v: Option<&str>| {
            let mut p = Properties::default();
            if let Some(v) = v {
                p.set("replica.selector.class", v);
            }
            Config::resolve(p, &CliOverrides::default())
        };
        let selector = |v| resolve(v).unwrap().replica_selector;
        assert_eq!(selector(None), ReplicaSelector::Leader);
        assert_eq!(selector(Some(" ")), ReplicaSelector::Leader);
        assert_eq!(
            selector(Some(ReplicaSelector::LEADER_CLASS)),
            ReplicaSelector::Leader
        );
        assert_eq!(
            selector(Some(ReplicaSelector::RACK_AWARE_CLASS)),
            ReplicaSelector::RackAware
        );
        let err = resolve(Some("com.example.NearestSelector")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("replica.selector.class"), "{text}");
        assert!(text.contains("cannot load Java classes"), "{text}");
        assert_eq!(keys::kind("replica.selector.class"), keys::KeyKind::Used);
        assert_eq!(
            keys::dynamic_kind("replica.selector.class"),
            keys::Dynamic::ReadOnly
        );
    }

    /// The broker's `compression.type` is the default of the topic key of the same name,
    /// `producer` unless set, as Kafka's.
    #[test]
    fn the_brokers_compression_type_is_every_topics_default() {
        let resolve = |p: Properties| Config::resolve(p, &CliOverrides::default()).unwrap();
        let c = resolve(Properties::default());
        assert_eq!(c.topic_defaults()["compression.type"], "producer");
        let mut p = Properties::default();
        p.set("compression.type", "zstd");
        assert_eq!(resolve(p).topic_defaults()["compression.type"], "zstd");
        assert_eq!(keys::kind("compression.type"), keys::KeyKind::Used);
        assert_eq!(
            keys::dynamic_kind("compression.type"),
            keys::Dynamic::Applied("compression.type")
        );
    }

    #[test]
    fn connection_limits_and_per_ip_overrides() {
        let c = Config::resolve(Properties::default(), &CliOverrides::default()).unwrap();
        assert_eq!(c.queued_max_request_bytes, QUEUED_MAX_REQUEST_BYTES_DEFAULT);
        assert_eq!(c.connections_max_idle_ms, CONNECTIONS_MAX_IDLE_MS_DEFAULT);
        assert_eq!(
            c.connection_idle(),
            Some(std::time::Duration::from_secs(600))
        );
        let idle = |v: &str| {
            let mut p = Properties::default();
            p.set("connections.max.idle.ms", v);
            Config::resolve(p, &CliOverrides::default())
        };
        let never = idle("-1").unwrap();
        assert_eq!(
            never.connection_idle(),
            None,
            "-1: never closed for idleness"
        );
        assert!(idle("0").is_err());
        assert_eq!(c.request_read_timeout_ms, REQUEST_READ_TIMEOUT_MS_DEFAULT);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(c.max_connections_for(ip), MAX_CONNECTIONS_PER_IP_DEFAULT);
        let mut p = Properties::default();
        p.set("max.connections.per.ip", "7");
        p.set(
            "max.connections.per.ip.overrides",
            "10.0.0.1:2, [::1]:0,::2:9",
        );
        let c = Config::resolve(p.clone(), &CliOverrides::default()).unwrap();
        assert_eq!(c.max_connections_for(ip), 2);
        assert_eq!(c.max_connections_for("::1".parse().unwrap()), 0);
        assert_eq!(c.max_connections_for("::2".parse().unwrap()), 9);
        assert_eq!(c.max_connections_for("10.0.0.2".parse().unwrap()), 7);
        for bad in ["host.example:3", "10.0.0.1", "10.0.0.1:x"] {
            p.set("max.connections.per.ip.overrides", bad);
            assert!(
                Config::resolve(p.clone(), &CliOverrides::default()).is_err(),
                "{bad}"
            );
        }
        let mut p = Properties::default();
        p.set("queued.max.request.bytes", "-1");
        assert!(Config::resolve(p.clone(), &CliOverrides::default()).is_err());
        p.set("queued.max.request.bytes", "0");
        assert!(Config::resolve(p, &CliOverrides::default()).is_err());
    }

    /// A topic's own `flush.messages`, `flush.ms`, `index.interval.bytes` and `preallocate`
    /// replace the broker's `log.*` defaults (they used to lose to them: both names were
    /// passed and the broker's sorted last); `log.roll.hours` sets `segment.ms` when
    /// `log.roll.ms` does not.
    #[test]
    fn a_topics_own_storage_settings_beat_the_brokers_and_roll_hours_is_read() {
        let mut p = Properties::default();
        p.set("log.flush.interval.messages", "100000");
        p.set("log.flush.interval.ms", "60000");
        p.set("log.index.interval.bytes", "8192");
        p.set("log.index.size.max.bytes", "4096");
        p.set("log.preallocate", "false");
        p.set("log.roll.hours", "2");
        let c = Config::resolve(p, &CliOverrides::default()).unwrap();
        let open = |overrides: &[(&str, &str)]| {
            let mut m = c.log_defaults();
            m.extend(
                overrides
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
            let pairs = m.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            crate::storage::LogConfig::from_pairs(pairs).unwrap()
        };
        let broker = open(&[]);
        assert_eq!(broker.flush_interval_messages, 100_000);
        assert_eq!(broker.index_interval_bytes, 8192);
        assert_eq!(broker.segment_index_bytes, 4096);
        assert!(!broker.preallocate);
        assert_eq!(broker.segment_ms, 2 * 3_600_000);
        let topic = open(&[
            ("flush.messages", "1"),
            ("flush.ms", "10"),
            ("index.interval.bytes", "4096"),
            ("segment.index.bytes", "1024"),
            ("preallocate", "true"),
            ("segment.ms", "1000"),
        ]);
        assert_eq!(topic.segment_index_bytes, 1024);
        assert_eq!(topic.flush_interval_messages, 1);
        assert_eq!(topic.flush_interval_ms, 10);
        assert_eq!(topic.index_interval_bytes, 4096);
        assert!(topic.preallocate);
        assert_eq!(topic.segment_ms, 1000);
        // log.roll.ms wins over log.roll.hours, as in Kafka.
        let mut p = Properties::default();
        p.set("log.roll.hours", "2");
        p.set("log.roll.ms", "5000");
        let c = Config::resolve(p, &CliOverrides::default()).unwrap();
        assert_eq!(c.topic_defaults()["segment.ms"], "5000");
    }

    #[test]
    fn quorum_voters_parse_and_bad_ones_are_refused() {
        let c = Config::resolve(Properties::default(), &CliOverrides::default()).unwrap();
        assert!(c.quorum_voters.is_empty(), "no voters: a single node");
        let mut p = Properties::default();
        p.set(
            "controller.quorum.voters",
            "1@127.0.0.1:9093, 2@127.0.0.1:9094,3@localhost:9095",
        );
        let c = Config::resolve(p.clone(), &CliOverrides::default()).unwrap();
        assert_eq!(c.quorum_voters.len(), 3);
        assert_eq!(c.quorum_voters[&2], "127.0.0.1:9094");
        for bad in [
            "1@",
            "x@127.0.0.1:1",
            "127.0.0.1:1",
            "1@a:1,1@a:2",
            "-1@127.0.0.1:1",
        ] {
            p.set("controller.quorum.voters", bad);
            assert!(
                Config::resolve(p.clone(), &CliOverrides::default()).is_err(),
                "{bad}"
            );
        }
        p.set("controller.quorum.voters", "1@127.0.0.1:9093");
        p.set("broker.heartbeat.interval.ms", "1000");
        p.set("broker.session.timeout.ms", "1500");
        assert!(Config::resolve(p, &CliOverrides::default()).is_err());
    }
}
